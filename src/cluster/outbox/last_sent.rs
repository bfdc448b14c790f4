//! When each pod was last sent a write that is limited per pod (its Events, its marks), and the
//! Events' limit across all pods.

use std::time::{Duration, Instant};

use crate::cluster::fast_map::FastMap;

/// When each pod (by uid) was last sent a write that is limited per pod: looked up on every
/// refusal.
#[derive(Default)]
pub(super) struct LastSent(FastMap<String, Instant>);

impl LastSent {
    /// Whether the pod's last write was within `interval` of `now`. Those older are forgotten
    /// once many pods are remembered.
    pub(super) fn within(&mut self, uid: &str, interval: Duration, now: Instant) -> bool {
        if self.0.len() > 10_000 {
            self.0.retain(|_, at| now.duration_since(*at) < interval);
        }
        self.0.get(uid).is_some_and(|at| now.duration_since(*at) < interval)
    }

    pub(super) fn sent(&mut self, uid: &str, now: Instant) {
        self.0.insert(uid.to_string(), now);
    }

    /// Not sent after all, or the pod is gone: its next write goes out.
    pub(super) fn forget(&mut self, uid: &str) {
        self.0.remove(uid);
    }
}

/// Events across all pods, at most, in any second.
const EVENTS_PER_SECOND: u32 = 20;

/// The Events sent: when each pod last had one, and how many went out in the current second.
pub(super) struct EventLimits {
    pub(super) last: LastSent,
    window: Instant,
    in_window: u32,
}

impl EventLimits {
    pub(super) fn new(now: Instant) -> EventLimits {
        EventLimits { last: LastSent::default(), window: now, in_window: 0 }
    }

    /// Whether an Event for the pod may go out at `now` (none within `interval` for it, fewer
    /// than `EVENTS_PER_SECOND` this second); if so, it is counted as sent.
    pub(super) fn admit(&mut self, uid: &str, interval: Duration, now: Instant) -> bool {
        if self.last.within(uid, interval, now) {
            return false;
        }
        if now.duration_since(self.window) >= Duration::from_secs(1) {
            (self.window, self.in_window) = (now, 0);
        }
        if self.in_window >= EVENTS_PER_SECOND {
            return false;
        }
        self.in_window += 1;
        self.last.sent(uid, now);
        true
    }
}
