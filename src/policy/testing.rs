//! What the policy tests share: a clock, a configuration, a pod from JSON and a request.

use jiff::{SignedDuration, Timestamp};
use serde_json::Value;

use super::busy::MaxBusy;
use super::disruption::Exemptions;
use super::keys::{DELETE_REQUESTED, FIELD_MANAGER};
use super::marks::MutationSettings;
use super::outcome::Ask;
use super::pod::Pod;
use super::{Mode, PolicyConfig, Requester};

pub fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

/// The tests' "now": an hour after the busy pods they describe turned busy.
pub fn now() -> Timestamp {
    ts("2026-11-21T21:00:00Z")
}

/// Enforce mode, every autoscaler annotation, no exemptions, max-busy 24 h.
pub fn config() -> PolicyConfig {
    config_with(SignedDuration::from_hours(24))
}

/// As [`config`], with `max_busy` for every pod.
pub fn config_with(max_busy: SignedDuration) -> PolicyConfig {
    PolicyConfig {
        mode: Mode::Enforce,
        max_busy: MaxBusy::new(max_busy),
        exemptions: Exemptions::default(),
        mutation: MutationSettings {
            karpenter: true,
            karpenter_bounded: true,
            cluster_autoscaler: true,
            cluster_autoscaler_on_completion: false,
        },
    }
}

pub fn pod(value: Value) -> Pod {
    serde_json::from_value(value).unwrap()
}

/// `username`'s `operation` of pod capture/w; other requests change the fields they need.
pub fn ask(operation: &'static str, username: &'static str) -> Ask<'static> {
    Ask {
        uid: "u",
        operation,
        resource: "pods",
        subresource: "",
        namespace: "capture",
        name: "w",
        requester: Requester { username, groups: &[], pod: None },
        dry_run: false,
    }
}

/// A pod's `managedFields` as the API server records a delete-requested mark busyguard wrote.
pub fn marked_by_busyguard() -> Value {
    serde_json::json!([{"manager": FIELD_MANAGER, "operation": "Update",
        "fieldsV1": {"f:metadata": {"f:annotations": {format!("f:{DELETE_REQUESTED}"): {}}}}}])
}
