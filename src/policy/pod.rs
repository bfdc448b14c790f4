//! The few fields of a Pod that busyguard's decisions read, decoded straight from the JSON the
//! API server sent. Everything else in the pod (spec, managedFields, ...) is skipped unparsed.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::{Deserialize, Deserializer};

pub type Labels = BTreeMap<String, String>;

#[derive(Debug, Default, Deserialize)]
pub struct Pod {
    #[serde(default, deserialize_with = "null_as_default")]
    pub metadata: Metadata,
    #[serde(default, deserialize_with = "null_as_default")]
    pub status: Status,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Metadata {
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub namespace: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub uid: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub labels: Labels,
    /// `None` when the pod has no annotations map at all: a patch must then create the map.
    #[serde(default)]
    pub annotations: Option<Labels>,
    #[serde(default)]
    pub deletion_timestamp: Option<Timestamp>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    #[serde(default)]
    pub phase: Option<String>,
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
    pub last_transition_time: Option<Timestamp>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatus {
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
    pub running: Option<Running>,
    #[serde(default)]
    pub terminated: Option<Terminated>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Running {
    #[serde(default)]
    pub started_at: Option<Timestamp>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Terminated {
    #[serde(default)]
    pub finished_at: Option<Timestamp>,
}

/// Readiness as the pod's `Ready` condition reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Readiness {
    pub ready: bool,
    pub since: Option<Timestamp>,
}

/// What the busy decisions read of a pod, whether it came in a request or from the cluster view.
pub trait PodFacts {
    fn label(&self, key: &str) -> Option<&str>;
    fn annotation(&self, key: &str) -> Option<&str>;
    fn phase(&self) -> Option<&str>;
    fn is_terminating(&self) -> bool;
    /// When a container of this pod last came back from a restart, if one ever did.
    fn last_restart(&self) -> Option<Timestamp>;
    /// `None` when the pod has no `Ready` condition yet.
    fn readiness(&self) -> Option<Readiness>;
    /// Why the pod is in its phase, e.g. `Evicted` for a Failed pod.
    fn status_reason(&self) -> Option<&str>;

    /// Succeeded or Failed: the pod's containers will not run again.
    fn is_terminal(&self) -> bool {
        matches!(self.phase(), Some("Succeeded" | "Failed"))
    }
}

impl PodFacts for Pod {
    fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata.annotations.as_ref()?.get(key).map(String::as_str)
    }

    fn label(&self, key: &str) -> Option<&str> {
        self.metadata.labels.get(key).map(String::as_str)
    }

    fn phase(&self) -> Option<&str> {
        self.status.phase.as_deref()
    }

    fn is_terminating(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    fn last_restart(&self) -> Option<Timestamp> {
        self.status.last_restart()
    }

    fn readiness(&self) -> Option<Readiness> {
        self.status.readiness()
    }

    fn status_reason(&self) -> Option<&str> {
        self.status.reason.as_deref()
    }
}

impl Status {
    pub fn last_restart(&self) -> Option<Timestamp> {
        self.container_statuses
            .iter()
            .filter(|c| c.restart_count > 0)
            .flat_map(|c| {
                let started = c.state.running.as_ref().and_then(|r| r.started_at);
                let last_exit = c.last_state.terminated.as_ref().and_then(|t| t.finished_at);
                [started, last_exit]
            })
            .flatten()
            .max()
    }

    pub fn readiness(&self) -> Option<Readiness> {
        let ready = self.conditions.iter().find(|c| c.type_ == "Ready")?;
        Some(Readiness { ready: ready.status == "True", since: ready.last_transition_time })
    }
}

/// Kubernetes sends `null` for empty maps and lists now and then; treat it as empty.
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
