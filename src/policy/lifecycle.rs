//! What a change seen in the cluster means for a busy pod: a deferred delete that may now go
//! ahead, or a busy pod lost without any request busyguard could refuse.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::busy::{BusyState, MaxBusy, busy_state};
use super::disruption::Requester;
use super::pod::PodFacts;

/// Set on a busy pod whose delete was refused and deferred: busyguard deletes it once idle.
/// The value is JSON: `{"by":"alice","at":"2026-11-21T20:00:00Z"}`.
pub const DELETE_REQUESTED: &str = "busyguard.io/delete-requested";

pub const GARBAGE_COLLECTOR_USER: &str = "system:serviceaccount:kube-system:generic-garbage-collector";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteRequest {
    pub by: String,
    pub at: Timestamp,
}

impl DeleteRequest {
    pub fn of(pod: &impl PodFacts) -> Option<DeleteRequest> {
        serde_json::from_str(pod.annotation(DELETE_REQUESTED)?).ok()
    }

    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).expect("two strings always serialize")
    }
}

/// The administrator of clusters set up by hand or by local tools: a person despite the prefix.
const LOCAL_ADMIN_USER: &str = "system:admin";

/// A refused delete is carried out later only for people and the garbage collector: they ask
/// once. Controllers (ReplicaSet, scheduler preemption, ...) retry and choose again by
/// themselves; deleting later what they chose before would remove a second pod.
pub fn defers_delete(requester: Requester<'_>) -> bool {
    let username = requester.username;
    username == GARBAGE_COLLECTOR_USER || username == LOCAL_ADMIN_USER || !username.starts_with("system:")
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observation {
    /// The pod was marked for deletion while busy, and is no longer protected.
    DeleteNow(DeleteRequest),
    /// A protected pod failed or vanished: nothing busyguard could refuse took it.
    Lost { busy_since: Option<Timestamp>, cause: LossCause },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LossCause {
    /// The kubelet failed the pod (node-pressure eviction, preemption at admission, ...).
    Failed { reason: Option<String> },
    /// Gone from the API without a graceful delete (node loss, forced delete).
    Vanished,
}

impl LossCause {
    pub fn label(&self) -> &'static str {
        match self {
            LossCause::Failed { .. } => "failed",
            LossCause::Vanished => "vanished",
        }
    }
}

/// `before` and `after` are the same pod as last seen and as seen now (`None`: deleted).
pub fn observe<P: PodFacts>(
    before: Option<&P>,
    after: Option<&P>,
    max_busy: MaxBusy,
    now: Timestamp,
) -> Option<Observation> {
    let state = |pod: &P| busy_state(pod, max_busy, now);
    let was_busy = before.map(state).and_then(|s| match s {
        BusyState::Busy { since, .. } => Some(since),
        _ => None,
    });
    match (was_busy, after) {
        (Some(busy_since), None) => Some(Observation::Lost { busy_since, cause: LossCause::Vanished }),
        (Some(busy_since), Some(pod)) if pod.phase() == Some("Failed") && !pod.is_terminating() => {
            let reason = pod.status_reason().map(str::to_string);
            Some(Observation::Lost { busy_since, cause: LossCause::Failed { reason } })
        }
        (_, Some(pod)) => {
            let request = DeleteRequest::of(pod)?;
            matches!(state(pod), BusyState::Idle | BusyState::Lapsed { .. }).then_some(Observation::DeleteNow(request))
        }
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::busy::{BUSY_LABEL, BUSY_SINCE};
    use crate::policy::pod::Pod;
    use serde_json::json;

    const DAY: MaxBusy = MaxBusy::new(jiff::SignedDuration::from_hours(24));

    fn now() -> Timestamp {
        "2026-11-21T21:00:00Z".parse().unwrap()
    }

    fn pod(label: &str, extra_annotations: serde_json::Value, status: serde_json::Value) -> Pod {
        let mut annotations = json!({BUSY_SINCE: "2026-11-21T20:00:00Z"});
        annotations.as_object_mut().unwrap().extend(extra_annotations.as_object().unwrap().clone());
        serde_json::from_value(json!({"metadata": {"labels": {BUSY_LABEL: label}, "annotations": annotations},
                                      "status": status}))
        .unwrap()
    }

    fn requested() -> serde_json::Value {
        json!({DELETE_REQUESTED: r#"{"by":"alice","at":"2026-11-21T20:30:00Z"}"#})
    }

    #[test]
    fn marked_pod_turning_idle_is_deleted_now() {
        let busy = pod("true", requested(), json!({"phase": "Running"}));
        let idle = pod("false", requested(), json!({"phase": "Running"}));
        assert_eq!(
            observe(Some(&busy), Some(&idle), DAY, now()),
            Some(Observation::DeleteNow(DeleteRequest {
                by: "alice".into(),
                at: "2026-11-21T20:30:00Z".parse().unwrap()
            }))
        );
        assert_eq!(observe(Some(&busy), Some(&busy), DAY, now()), None, "still busy: wait");
    }

    #[test]
    fn marked_pod_already_terminating_is_not_deleted_again() {
        let mut idle = pod("false", requested(), json!({"phase": "Running"}));
        idle.metadata.deletion_timestamp = Some(now());
        assert_eq!(observe(None, Some(&idle), DAY, now()), None);
    }

    #[test]
    fn busy_pod_failed_by_the_kubelet_is_a_loss_with_its_reason() {
        let busy = pod("true", json!({}), json!({"phase": "Running"}));
        let evicted = pod("true", json!({}), json!({"phase": "Failed", "reason": "Evicted"}));
        assert_eq!(
            observe(Some(&busy), Some(&evicted), DAY, now()),
            Some(Observation::Lost {
                busy_since: Some("2026-11-21T20:00:00Z".parse().unwrap()),
                cause: LossCause::Failed { reason: Some("Evicted".into()) }
            })
        );
    }

    #[test]
    fn busy_pod_vanishing_is_a_loss_but_an_idle_one_is_not() {
        let busy = pod("true", json!({}), json!({"phase": "Running"}));
        assert!(matches!(
            observe(Some(&busy), None, DAY, now()),
            Some(Observation::Lost { cause: LossCause::Vanished, .. })
        ));
        let idle = pod("false", json!({}), json!({"phase": "Running"}));
        assert_eq!(observe(Some(&idle), None, DAY, now()), None);
    }

    #[test]
    fn people_and_the_garbage_collector_get_deferred_deletes_controllers_do_not() {
        let who = |username| defers_delete(Requester { username, groups: &[] });
        assert!(who("alice"));
        assert!(who("kubernetes-admin"));
        assert!(who("system:admin"));
        assert!(who(GARBAGE_COLLECTOR_USER));
        assert!(!who("system:serviceaccount:kube-system:replicaset-controller"));
        assert!(!who("system:kube-scheduler"));
        assert!(!who("system:node:node-1"));
    }
}
