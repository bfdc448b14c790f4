//! What the policy tests share: a clock, a configuration, a pod from JSON and a request.

use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

use super::ask::{Ask, Requester};
use super::busy::MaxBusy;
use super::config::Exemptions;
use super::config::{Mode, PolicyConfig};
use super::hold::Holds;
use super::keys::{BUSY_LABEL, DELETE_REQUESTED, FIELD_MANAGER};
use super::marks::MutationSettings;
use super::mutate::{Mutation, mutate_pod};
use super::outcome::{Answer, Outcome};
use super::pod::Pod;

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
        mutation: MutationSettings::ALL,
        holds: Holds::default(),
        owner_rules: Vec::new(),
        busy_with_pod: None,
    }
}

pub fn pod(value: Value) -> Pod {
    serde_json::from_value(value).unwrap()
}

/// `username`'s `operation` of pod capture/w; other requests change the fields they need.
pub fn ask(operation: &'static str, username: &'static str) -> Ask<'static> {
    Ask {
        uid: "u",
        operation: operation.parse().unwrap(),
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

/// A write of pod ns/w by its own worker's service account (not bound to a pod).
pub fn worker_write() -> Ask<'static> {
    Ask { namespace: "ns", ..ask("UPDATE", "system:serviceaccount:ns:worker") }
}

/// The update of `old` to `new` as the mutating webhook answers it; `new` as stored after.
pub fn mutated(old: &Value, new: &Value, now: &str) -> (Outcome, Value) {
    let (ask, new_pod, old_pod) = (worker_write(), pod(new.clone()), pod(old.clone()));
    let outcome = mutate_pod(&Mutation::of(&ask, &new_pod, Some(&old_pod)), &config(), ts(now));
    let mut stored = new.clone();
    if let Answer::Patch { patch, .. } = &outcome.answer {
        json_patch::patch(&mut stored, patch).expect("the patch applies to its pod");
    }
    (outcome, stored)
}

/// Sets the pod's busy label.
pub fn set_label(doc: &mut Value, value: &str) {
    doc["metadata"]["labels"][BUSY_LABEL] = json!(value);
}

/// An idle worker pod w (its label `false`) with these annotations.
pub fn worker(annotations: Value) -> Value {
    json!({"metadata": {"name": "w", "labels": {BUSY_LABEL: "false"}, "annotations": annotations},
           "status": {"phase": "Running"}})
}

/// A workload's `n` other pods unavailable, as the view counts them for a budget.
pub fn unavailable_siblings(n: u32) -> super::budget::Siblings {
    super::budget::Siblings {
        workload: "DaemonSet/agent".into(),
        unavailable: (0..n).map(|i| format!("agent-{i}")).collect(),
    }
}

/// `writes::judge_write` of a write given by its parts (not through `pods/status`), under the
/// default configuration.
pub fn write_judged(
    ask: &Ask<'_>,
    pod: &Pod,
    before: Option<&Pod>,
    writer: crate::policy::writes::Writer<'_>,
    now: Timestamp,
) -> Outcome {
    let write = crate::policy::writes::Write { ask, pod, before, writer, through_status: false };
    crate::policy::writes::judge_write(&write, &config(), now)
}
