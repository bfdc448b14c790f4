//! When each pod was last sent a write that is limited per pod (its Events, its marks).

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
