//! The few fields of a Pod that busyguard's decisions read, decoded straight from the JSON the
//! API server sent. Everything else in the pod (spec, managedFields, ...) is skipped unparsed.
//!
//! Two shapes carry a pod to the decisions: [`Pod`], decoded from a request, and the cluster
//! view's compact record; [`PodFacts`] is what both answer, and [`DECIDING_ANNOTATIONS`] the
//! annotations the view must keep for the decisions to read the same on both.

mod decode;
mod facts;

use std::collections::BTreeMap;
use std::fmt;

use jiff::Timestamp;
use serde::Deserialize;

use crate::duration::api_time;
use decode::{ByBusyguard, by_busyguard, null_as_default};
pub use facts::{OwnerKey, Phase, PodFacts, Readiness, RunsToCompletion, group_of, version_of};

/// A pod by its name and uid: whom an effect or an audit line is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

pub type Labels = BTreeMap<String, String>;

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Pod {
    #[serde(default, deserialize_with = "null_as_default")]
    pub metadata: Metadata,
    #[serde(default, deserialize_with = "null_as_default")]
    pub spec: PodSpec,
    #[serde(default, deserialize_with = "null_as_default")]
    pub status: PodStatus,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    /// Whose tokens are the pod's own workers' (the API server sets it, `default` at least).
    #[serde(default, deserialize_with = "null_as_default")]
    pub service_account_name: String,
    /// Where it runs (empty until scheduled): a node that is going holds it from new tasks.
    #[serde(default, deserialize_with = "null_as_default")]
    pub node_name: String,
    /// `Always` (the API server's default), `OnFailure` or `Never`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub restart_policy: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub containers: Vec<ContainerSpec>,
}

/// What of a container says whether an update restarts it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerSpec {
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub image: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub resources: ContainerResources,
    /// Per resource, whether a resize restarts the container (`RestartContainer`) or not.
    #[serde(default, deserialize_with = "null_as_default")]
    pub resize_policy: Vec<ResizePolicy>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ContainerResources {
    #[serde(default, deserialize_with = "null_as_default")]
    pub requests: BTreeMap<String, serde_json::Value>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub limits: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResizePolicy {
    #[serde(default, deserialize_with = "null_as_default")]
    pub resource_name: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub restart_policy: String,
}

impl Pod {
    /// The pod's controlling owner, if it has one.
    pub fn controller(&self) -> Option<&OwnerReference> {
        self.metadata.owner_references.iter().find(|o| o.controller == Some(true))
    }

    /// The container whose task this update would end by restarting it, if any: its image
    /// changed, or a resource whose resize policy is `RestartContainer`. Only the task's
    /// containers count, as the pod stood before the write ([`PodFacts::is_task_container`]).
    pub fn restarted_container(&self, before: &Pod) -> Option<&str> {
        (self.spec.containers.iter())
            .filter(|new| before.is_task_container(&new.name))
            .filter(|new| {
                let Some(old) = before.spec.containers.iter().find(|old| old.name == new.name) else { return false };
                old.image != new.image || restarting_resize(old, new)
            })
            .map(|c| c.name.as_str())
            .next()
    }
}

/// Whether a resource of the container changed whose resize policy restarts it.
fn restarting_resize(old: &ContainerSpec, new: &ContainerSpec) -> bool {
    let restarts = |resource: &str| {
        new.resize_policy.iter().any(|p| p.resource_name == resource && p.restart_policy == "RestartContainer")
    };
    let changed = |resource: &str| {
        old.resources.requests.get(resource) != new.resources.requests.get(resource)
            || old.resources.limits.get(resource) != new.resources.limits.get(resource)
    };
    ["cpu", "memory"].into_iter().any(|resource| changed(resource) && restarts(resource))
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Metadata {
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub namespace: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub uid: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub resource_version: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub labels: Labels,
    /// `None` when the pod has no annotations map at all: a patch must then create the map.
    #[serde(default)]
    pub annotations: Option<Labels>,
    /// Only the controlling one is read (`Pod::controller`).
    #[serde(default, deserialize_with = "null_as_default")]
    pub owner_references: Vec<OwnerReference>,
    #[serde(default, deserialize_with = "api_time")]
    pub creation_timestamp: Option<Timestamp>,
    #[serde(default, deserialize_with = "api_time")]
    pub deletion_timestamp: Option<Timestamp>,
    /// Which of its keys busyguard wrote itself, as the API server's managedFields record it;
    /// the rest of managedFields is skipped.
    #[serde(default, rename = "managedFields", deserialize_with = "by_busyguard")]
    pub by_busyguard: ByBusyguard,
}

/// A pod's owner, as its ownerReferences name it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnerReference {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub controller: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    #[serde(default)]
    pub phase: Option<String>,
    #[serde(default, deserialize_with = "api_time")]
    pub start_time: Option<Timestamp>,
    /// Why the kubelet failed the pod (`Evicted`, `Preempting`, ...).
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub conditions: Vec<Condition>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub container_statuses: Vec<ContainerStatus>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(default, rename = "type")]
    pub type_: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default, deserialize_with = "api_time")]
    pub last_transition_time: Option<Timestamp>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatus {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub restart_count: i32,
    #[serde(default, deserialize_with = "null_as_default")]
    pub state: ContainerState,
    #[serde(default, deserialize_with = "null_as_default")]
    pub last_state: ContainerState,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ContainerState {
    #[serde(default)]
    pub running: Option<StateRunning>,
    #[serde(default)]
    pub terminated: Option<StateTerminated>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StateRunning {
    #[serde(default, deserialize_with = "api_time")]
    pub started_at: Option<Timestamp>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StateTerminated {
    #[serde(default, deserialize_with = "api_time")]
    pub finished_at: Option<Timestamp>,
    #[serde(default)]
    pub exit_code: i32,
}

impl PodFacts for Pod {
    fn uid(&self) -> &str {
        &self.metadata.uid
    }

    fn owner_key(&self) -> Option<OwnerKey<'_>> {
        let owner = self.controller()?;
        Some(OwnerKey::of(&owner.api_version, &owner.kind, &owner.name))
    }

    fn resource_version(&self) -> &str {
        &self.metadata.resource_version
    }

    fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata.annotations.as_ref()?.get(key).map(String::as_str)
    }

    fn label(&self, key: &str) -> Option<&str> {
        self.metadata.labels.get(key).map(String::as_str)
    }

    fn phase(&self) -> Phase {
        Phase::parse(self.status.phase.as_deref())
    }

    fn not_started(&self) -> bool {
        not_started(self.phase(), &self.spec.node_name, &self.status)
    }

    fn task_ended(&self) -> bool {
        task_ended(self, &self.spec.restart_policy, &self.status)
    }

    fn is_terminating(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    fn created(&self) -> Option<Timestamp> {
        self.metadata.creation_timestamp
    }

    fn started(&self) -> Option<Timestamp> {
        self.status.start_time
    }

    fn last_restart(&self) -> Option<Timestamp> {
        self.status.last_restart(self.task_container())
    }

    fn readiness(&self) -> Option<Readiness> {
        self.status.readiness()
    }

    fn status_reason(&self) -> Option<&str> {
        self.status.reason.as_deref()
    }

    fn disruption(&self) -> Option<&str> {
        self.status.disruption()
    }

    fn mark_by_busyguard(&self) -> bool {
        self.metadata.by_busyguard.mark
    }

    fn busy_label_by_busyguard(&self) -> bool {
        self.metadata.by_busyguard.busy_label
    }
}

/// Whether no task can have begun in the pod: Pending, and either not yet on a node or on one
/// whose kubelet reports every container and none that ever ran (pulling its image, behind its
/// init containers). Pending alone is not enough: the scheduler of Kubernetes 1.28.4 to 1.31.0
/// overwrites the status of a preemption's victim with its preemptor's, Pending with no
/// container statuses, before it deletes it (kubernetes#126644), and a running pod's task would
/// then read as not begun.
pub fn not_started(phase: Phase, node_name: &str, status: &PodStatus) -> bool {
    let none_ran = |c: &ContainerStatus| {
        c.restart_count == 0
            && c.state.running.is_none()
            && c.state.terminated.is_none()
            && c.last_state.terminated.is_none()
    };
    phase == Phase::Pending
        && (node_name.is_empty()
            || (!status.container_statuses.is_empty() && status.container_statuses.iter().all(none_ran)))
}

/// Whether a run-to-completion pod's task has ended for good while the pod runs on: every
/// container its end waits for ([`PodFacts::task_ends_with`]) has terminated and will not be
/// restarted (it exited 0, or the pod never restarts a container). Sidecars may still run: Tekton
/// stops them only after the steps.
pub fn task_ended(pod: &(impl PodFacts + ?Sized), restart_policy: &str, status: &PodStatus) -> bool {
    if pod.runs_to_completion().is_none() {
        return false;
    }
    let mut task = status.container_statuses.iter().filter(|c| pod.task_ends_with(&c.name)).peekable();
    task.peek().is_some()
        && task.all(|c| c.state.terminated.as_ref().is_some_and(|t| t.exit_code == 0 || restart_policy == "Never"))
}

impl PodStatus {
    /// When `task_container` (any container, without one) last came back from a restart. A
    /// sidecar's restart says nothing about the task.
    pub fn last_restart(&self, task_container: Option<&str>) -> Option<Timestamp> {
        self.container_statuses
            .iter()
            .filter(|c| c.restart_count > 0 && task_container.is_none_or(|name| c.name == name))
            .flat_map(|c| {
                let started = c.state.running.as_ref().and_then(|r| r.started_at);
                let last_exit = c.last_state.terminated.as_ref().and_then(|t| t.finished_at);
                [started, last_exit]
            })
            .flatten()
            .max()
    }

    pub fn disruption(&self) -> Option<&str> {
        let condition = self.conditions.iter().find(|c| c.type_ == "DisruptionTarget" && c.status == "True")?;
        Some(condition.reason.as_deref().unwrap_or("unknown"))
    }

    pub fn readiness(&self) -> Option<Readiness> {
        let ready = self.conditions.iter().find(|c| c.type_ == "Ready")?;
        Some(Readiness {
            ready: ready.status == "True",
            since: ready.last_transition_time,
            gated: ready.status != "True" && ready.reason.as_deref() == Some("ReadinessGatesNotReady"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::keys::*;
    use crate::policy::keys::{DELETE_REQUESTED, FIELD_MANAGER};
    use crate::policy::testing::{marked_by_busyguard, pod};
    use serde_json::{Value, json};

    #[test]
    fn a_mark_counts_only_when_managed_fields_show_busyguard_wrote_it() {
        let mark = json!({DELETE_REQUESTED: r#"{"by":"alice","at":"2026-11-21T20:30:00Z"}"#});
        let with = |managed: Value| {
            pod(
                json!({"metadata": {"labels": {DELETE_REQUESTED: "true"}, "annotations": mark, "managedFields": managed}}),
            )
        };
        assert!(with(marked_by_busyguard()).delete_request().is_some());
        let by_another = json!([{"manager": "kubectl", "fieldsV1": {"f:metadata": {"f:annotations":
            {format!("f:{DELETE_REQUESTED}"): {}}}}}]);
        assert!(with(by_another).delete_request().is_none(), "written by someone else");
        let busyguard_wrote_other_fields = json!([{"manager": FIELD_MANAGER, "fieldsV1": {"f:metadata":
            {"f:annotations": {"f:controller.kubernetes.io/pod-deletion-cost": {}}}}}]);
        assert!(with(busyguard_wrote_other_fields).delete_request().is_none());
        assert!(with(Value::Null).delete_request().is_none(), "no managedFields");
        // Through pods/status, which no webhook of the pod's sees, under busyguard's name.
        let mut through_status = marked_by_busyguard();
        through_status[0]["subresource"] = json!("status");
        assert!(with(through_status).delete_request().is_none(), "written through the status");
        // The API server writes `manager` first; any order is read alike.
        let manager_last = json!([{"fieldsV1": {"f:metadata": {"f:annotations": {format!("f:{DELETE_REQUESTED}"): {}}}},
            "subresource": "", "manager": FIELD_MANAGER}]);
        assert!(with(manager_last).delete_request().is_some(), "manager after the fields");
        let manager_null = json!([{"manager": null, "fieldsV1": {"f:metadata": {"f:annotations":
            {format!("f:{DELETE_REQUESTED}"): {}}}}}]);
        assert!(with(manager_null).delete_request().is_none(), "no manager named");
    }

    #[test]
    fn a_malformed_managed_fields_entry_is_an_error() {
        for entry in [json!({"manager": 7}), json!("kubectl"), json!({"manager": FIELD_MANAGER, "fieldsV1": 5})] {
            let pod = json!({"metadata": {"managedFields": [entry]}});
            assert!(serde_json::from_value::<Pod>(pod).is_err(), "{entry}");
        }
    }

    #[test]
    fn decodes_the_fields_decisions_need_and_tolerates_nulls() {
        let pod: Pod = serde_json::from_str(
            r#"{"metadata":{"name":"w","namespace":"ns","labels":null,"annotations":{"a":"1"},
                "deletionTimestamp":"2026-11-21T20:49:25Z","managedFields":[{"x":1}]},
                "spec":{"containers":[]},
                "status":{"phase":"Running","containerStatuses":[{"restartCount":2,
                  "state":{"running":{"startedAt":"2026-11-21T10:00:00Z"}},
                  "lastState":{"terminated":{"finishedAt":"2026-11-21T09:59:58Z"}}}]}}"#,
        )
        .unwrap();
        assert_eq!(pod.metadata.name, "w");
        assert!(pod.metadata.labels.is_empty());
        assert_eq!(pod.annotation("a"), Some("1"));
        assert!(pod.is_terminating());
        assert!(!pod.is_terminal());
        assert_eq!(pod.last_restart(), Some("2026-11-21T10:00:00Z".parse().unwrap()));
    }

    #[test]
    fn only_the_task_containers_restarts_count_when_the_pod_names_it() {
        let pod: Pod = serde_json::from_str(
            r#"{"metadata":{"annotations":{"busyguard.io/task-container":"worker"}},
                "status":{"containerStatuses":[
                  {"name":"worker","restartCount":0,"state":{"running":{"startedAt":"2026-11-21T09:00:00Z"}}},
                  {"name":"log-shipper","restartCount":3,"state":{"running":{"startedAt":"2026-11-21T10:00:00Z"}}}]}}"#,
        )
        .unwrap();
        assert_eq!(pod.last_restart(), None, "the sidecar's restart does not count");
        assert_eq!(
            pod.status.last_restart(None),
            Some("2026-11-21T10:00:00Z".parse().unwrap()),
            "without the annotation, any"
        );
        let mut by_kubectls_default: Pod = serde_json::from_str(
            r#"{"metadata":{"annotations":{"kubectl.kubernetes.io/default-container":"worker"}},
                "status":{"containerStatuses":[
                  {"name":"worker","restartCount":0,"state":{"running":{"startedAt":"2026-11-21T09:00:00Z"}}},
                  {"name":"busy-flag","restartCount":1,"state":{"running":{"startedAt":"2026-11-21T10:00:00Z"}}}]}}"#,
        )
        .unwrap();
        assert_eq!(by_kubectls_default.last_restart(), None, "kubectl's default container is the task's");
        let annotations = by_kubectls_default.metadata.annotations.as_mut().unwrap();
        annotations.insert(TASK_CONTAINER.into(), "busy-flag".into());
        assert!(by_kubectls_default.last_restart().is_some(), "busyguard's annotation comes first");
    }

    #[test]
    fn an_agones_game_server_pods_task_container_is_the_game_agones_names() {
        // As Agones 1.60 creates the pod: the SDK server as a sidecar, the game named in
        // `agones.dev/container`; `restarted` came back from a restart at 10:00.
        let restarted = |restarted: &str| -> Pod {
            let status = |name: &str| {
                let (count, at) = if name == restarted { (1, "10:00") } else { (0, "09:00") };
                json!({"name": name, "restartCount": count, "state": {"running": {"startedAt": format!("2026-11-21T{at}:00Z")}}})
            };
            serde_json::from_value(json!({"metadata": {"annotations": {"agones.dev/container": "simple-game-server"}},
                "status": {"containerStatuses": [status("agones-gameserver-sidecar"), status("simple-game-server")]}}))
            .unwrap()
        };
        let sidecar_restarted = restarted("agones-gameserver-sidecar");
        assert_eq!(sidecar_restarted.task_container(), Some("simple-game-server"));
        assert_eq!(sidecar_restarted.last_restart(), None, "the SDK sidecar's restart ends no match");
        let game_restarted = restarted("simple-game-server");
        assert_eq!(game_restarted.last_restart(), Some("2026-11-21T10:00:00Z".parse().unwrap()));
    }

    #[test]
    fn a_container_that_never_restarted_has_no_last_restart() {
        let pod: Pod = serde_json::from_str(
            r#"{"status":{"containerStatuses":[{"restartCount":0,
                "state":{"running":{"startedAt":"2026-11-21T10:00:00Z"}}}]}}"#,
        )
        .unwrap();
        assert_eq!(pod.last_restart(), None);
    }

    #[test]
    fn terminal_phases_are_succeeded_and_failed() {
        for (phase, terminal) in [("Succeeded", true), ("Failed", true), ("Running", false), ("Pending", false)] {
            let pod: Pod = serde_json::from_value(serde_json::json!({"status": {"phase": phase}})).unwrap();
            assert_eq!(pod.is_terminal(), terminal, "{phase}");
        }
    }

    /// A pod that notes every annotation a decision asks it for.
    #[derive(Clone, Copy)]
    struct Recording<'a> {
        pod: &'a Pod,
        asked: &'a std::cell::RefCell<std::collections::BTreeSet<String>>,
    }

    impl PodFacts for Recording<'_> {
        fn uid(&self) -> &str {
            self.pod.uid()
        }
        fn owner_key(&self) -> Option<OwnerKey<'_>> {
            self.pod.owner_key()
        }
        fn resource_version(&self) -> &str {
            self.pod.resource_version()
        }
        fn label(&self, key: &str) -> Option<&str> {
            self.pod.label(key)
        }
        fn annotation(&self, key: &str) -> Option<&str> {
            self.asked.borrow_mut().insert(key.to_string());
            self.pod.annotation(key)
        }
        fn phase(&self) -> Phase {
            self.pod.phase()
        }
        fn is_terminating(&self) -> bool {
            self.pod.is_terminating()
        }
        fn created(&self) -> Option<Timestamp> {
            self.pod.created()
        }
        fn started(&self) -> Option<Timestamp> {
            self.pod.started()
        }
        fn last_restart(&self) -> Option<Timestamp> {
            self.pod.last_restart()
        }
        fn readiness(&self) -> Option<Readiness> {
            self.pod.readiness()
        }
        fn status_reason(&self) -> Option<&str> {
            self.pod.status_reason()
        }
        fn disruption(&self) -> Option<&str> {
            self.pod.disruption()
        }
        fn not_started(&self) -> bool {
            self.pod.not_started()
        }
        fn task_ended(&self) -> bool {
            self.pod.task_ended()
        }
        fn mark_by_busyguard(&self) -> bool {
            self.pod.mark_by_busyguard()
        }
        fn busy_label_by_busyguard(&self) -> bool {
            self.pod.busy_label_by_busyguard()
        }
    }

    /// The view keeps only DECIDING_ANNOTATIONS: a decision reading any other would see it
    /// missing on evictions, scale-downs and the watch, and present on pod writes.
    #[test]
    fn every_annotation_a_decision_reads_is_kept() {
        use crate::policy::Ask;
        use crate::policy::disruption;
        use crate::policy::keys::BUSY_LABEL;
        use crate::policy::marks::plan;
        use crate::policy::pod::PodRef;
        use crate::policy::{Requester, observed, scale};
        use serde_json::json;

        let config = crate::policy::testing::config_with(jiff::SignedDuration::from_hours(1));
        let now: Timestamp = "2026-11-21T21:00:00Z".parse().unwrap();
        let every_kept: serde_json::Map<String, serde_json::Value> =
            DECIDING_ANNOTATIONS.iter().map(|key| (key.to_string(), json!("x"))).collect();
        let pods: Vec<Pod> = [
            json!({"metadata": {"labels": {BUSY_LABEL: "true"}}}),
            json!({"metadata": {"labels": {BUSY_LABEL: "true"}, "annotations": {BUSY_SINCE: "2026-11-21T20:30:00Z"}}}),
            json!({"metadata": {"labels": {BUSY_LABEL: "true"}, "annotations": {BUSY_SINCE: "2026-11-21T10:00:00Z"}}}),
            json!({"metadata": {"labels": {BUSY_LABEL: "false"}, "annotations": {BUSY_SINCE: "2026-11-21T10:00:00Z"}}}),
            json!({"metadata": {"labels": {BUSY_LABEL: crate::policy::keys::WHEN_UNREADY}},
                   "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}}),
            json!({"metadata": {"labels": {BUSY_LABEL: "true"}, "annotations": every_kept}}),
            json!({"metadata": {"labels": {BUSY_LABEL: "false"}, "annotations": every_kept},
                   "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}),
        ]
        .into_iter()
        .map(|value| serde_json::from_value(value).unwrap())
        .collect();
        let requester = Requester { username: "alice", groups: &[], pod: None };
        let ask = Ask {
            uid: "u",
            operation: crate::policy::Operation::Delete,
            resource: "pods",
            subresource: "",
            namespace: "ns",
            name: "w",
            requester,
            dry_run: false,
        };
        let target = PodRef { namespace: "ns".into(), name: "w".into(), uid: "u".into() };
        let one = || Some(crate::policy::testing::unavailable_siblings(1));
        for pod in &pods {
            let asked = Default::default();
            let recording = Recording { pod, asked: &asked };
            let (seen, siblings) = (Some(&recording as &dyn PodFacts), one());
            let evict = disruption::Disruption {
                ask: &ask,
                taking: disruption::Taking::Evict { grace_period: None },
                pod: &recording,
                seen,
                siblings,
                preempted: false,
            };
            disruption::judge_disruption(&evict, &config, now);
            let delete = disruption::Disruption {
                ask: &ask,
                taking: disruption::Taking::Delete,
                pod,
                seen,
                siblings: one(),
                preempted: false,
            };
            disruption::judge_disruption(&delete, &config, now);
            plan(&recording, None, config.mutation, config.max_busy, now);
            observed::due(&target, &recording, &config, now);
            observed::on_change(&target, Some(&recording), None, &config, now);
            let select = |_: &_| Ok(vec![("w".to_string(), recording)]);
            let (object, selector) = ("deployments ns/w", Some("app=w".parse()));
            let request = scale::ScaleRequest { ask: &ask, object, from: Some(2), to: Some(1), selector };
            scale::prepare_scale_down(&request, select, &config, now);
            let asked = asked.into_inner();
            let unkept: Vec<&String> =
                asked.iter().filter(|key| !DECIDING_ANNOTATIONS.contains(&key.as_str())).collect();
            assert!(unkept.is_empty(), "read by a decision but dropped by the view: {unkept:?}");
        }
    }
}
