//! `controller.kubernetes.io/pod-deletion-cost` for busy pods.
//!
//! The ReplicaSet controller deletes lower costs first. Busy pods get a cost in the band
//! `[BUSY_COST_FLOOR, i32::MAX]`, above any idle cost people set in practice; within the band a
//! pod that turned busy later gets a lower cost, so if a busy pod ever has to go, it is the one
//! with the least work done.

use jiff::Timestamp;

/// Width of the busy band in seconds of busy-since: 2^30 s is about 34 years.
const BAND: i64 = 1 << 30;
pub const BUSY_COST_FLOOR: i32 = i32::MAX - BAND as i32;
/// Karpenter's eviction cost adds `cost / 2^27` to 1 per pod and clamps at 0 from below: a pod
/// whose cost is at or below `-2^27` counts as nothing, and a node of such pods as empty
/// (`EvictionCost`, `pkg/utils/disruption`). busyguard never writes a cost that low (its costs
/// are in the busy band, or the user's own restored); it warns about a user's.
pub const KARPENTER_NOTHING_COST: i64 = 1 << 27;
/// Busy-since times are counted from here (2024-01-01T00:00:00Z).
const EPOCH_SECONDS: i64 = 1_704_067_200;

pub fn busy_cost(busy_since: Timestamp) -> i32 {
    let seconds_after_epoch = (busy_since.as_second() - EPOCH_SECONDS).clamp(0, BAND);
    // In range by the clamp: i32::MAX - [0, 2^30] never leaves i32.
    (i64::from(i32::MAX) - seconds_after_epoch) as i32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::*;

    #[test]
    fn later_busy_pods_cost_less_by_one_per_second() {
        let a = busy_cost(ts("2026-11-21T20:00:00Z"));
        let b = busy_cost(ts("2026-11-21T20:00:01Z"));
        assert_eq!(a - b, 1);
    }

    #[test]
    fn busy_cost_stays_inside_int32_and_the_busy_band() {
        assert_eq!(busy_cost(ts("1970-01-01T00:00:00Z")), i32::MAX);
        assert_eq!(busy_cost(ts("2024-01-01T00:00:00Z")), i32::MAX);
        assert_eq!(busy_cost(Timestamp::MAX), BUSY_COST_FLOOR);
        assert_eq!(BUSY_COST_FLOOR, 1_073_741_823);
    }

    #[test]
    fn busy_cost_is_above_usual_idle_costs() {
        let cost = busy_cost(ts("2026-11-21T20:00:00Z"));
        assert!(cost > 1_000_000_000);
        assert!(cost >= BUSY_COST_FLOOR);
    }
}
