//! A pod as the API sends it, decoded in one pass into what busyguard reads: the view's
//! records (lists and watch events), and the pods the outbox, the agent and the cleanup write.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};
use serde::{Deserialize, Deserializer};

use super::record::{Annotations, PodRecord, Second, boxed, get};
use crate::policy::keys::{BUSY_LABEL, DECIDING_ANNOTATIONS, DELETE_REQUESTED, FIELD_MANAGER, TASK_CONTAINER_NAMED_BY};
use crate::policy::marks::{Mark, On};
use crate::policy::pod::OwnerKey;
use crate::policy::pod::{Phase, PodStatus, not_started, task_ended};

/// A pod as the API sends it (lists, watch events, the answers to writes), decoded into the
/// fields busyguard reads. A pod that does not decode is kept as `malformed` with its identity, so one bad
/// object cannot stop the whole list.
#[derive(Debug, Clone)]
pub struct ApiPod {
    pub metadata: ObjectMeta,
    pub node_name: Option<String>,
    pub restart_policy: Option<String>,
    /// A toleration with no key and operator `Exists` (every taint, or every taint of an effect
    /// that evicts): Karpenter then never evicts the pod.
    pub tolerates_every_taint: bool,
    pub status: PodStatus,
    pub malformed: Option<String>,
}

/// What is read of a pod as the API sends it.
#[derive(Deserialize)]
struct Wire {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<WireSpec>,
    #[serde(default)]
    status: Option<PodStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireSpec {
    #[serde(default)]
    node_name: Option<String>,
    #[serde(default)]
    restart_policy: Option<String>,
    #[serde(default)]
    tolerations: Option<Vec<WireToleration>>,
}

#[derive(Deserialize)]
struct WireToleration {
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    operator: Option<String>,
    #[serde(default)]
    effect: Option<String>,
}

impl WireToleration {
    /// Tolerates every taint that evicts (no key, `Exists`, no effect or `NoExecute`).
    fn of_every_taint(&self) -> bool {
        self.key.as_deref().unwrap_or_default().is_empty()
            && self.operator.as_deref() == Some("Exists")
            && matches!(self.effect.as_deref().unwrap_or_default(), "" | "NoExecute")
    }
}

/// A pod's identity, all that is kept of one that does not decode.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireIdentity {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    resource_version: Option<String>,
}

#[derive(Deserialize)]
struct WireIdentityOnly {
    metadata: WireIdentity,
}

impl<'de> Deserialize<'de> for ApiPod {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Through a generic value first: watch events arrive inside a tagged enum, where only
        // self-describing values can be taken apart a second time.
        let value = serde_json::Value::deserialize(deserializer)?;
        match Wire::deserialize(&value) {
            Ok(full) => Ok(ApiPod {
                metadata: full.metadata,
                tolerates_every_taint: (full.spec.as_ref().and_then(|s| s.tolerations.as_ref()).into_iter().flatten())
                    .any(WireToleration::of_every_taint),
                restart_policy: full.spec.as_ref().and_then(|s| s.restart_policy.clone()),
                node_name: full.spec.and_then(|s| s.node_name),
                status: full.status.unwrap_or_default(),
                malformed: None,
            }),
            Err(error) => {
                let identity = WireIdentityOnly::deserialize(&value).map_err(serde::de::Error::custom)?;
                let WireIdentity { name, namespace, uid, resource_version } = identity.metadata;
                Ok(ApiPod {
                    metadata: ObjectMeta { name, namespace, uid, resource_version, ..ObjectMeta::default() },
                    node_name: None,
                    restart_policy: None,
                    tolerates_every_taint: false,
                    status: PodStatus::default(),
                    malformed: Some(error.to_string()),
                })
            }
        }
    }
}

impl k8s_openapi::Resource for ApiPod {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "Pod";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "pods";
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for ApiPod {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl ApiPod {
    pub fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or_default()
    }

    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// The pod as the view keeps it: the annotations a decision reads, and those of `marks`
    /// (`--busy-annotation`'s, and where each mark keeps the pod's own value).
    pub fn record(&self, marks: &[Mark]) -> PodRecord {
        let meta = &self.metadata;
        let labels = meta.labels.iter().flatten().map(|(k, v)| (boxed(k), boxed(v))).collect();
        let all_annotations = meta.annotations.iter().flatten();
        let marked = marks.iter().flat_map(|m| [(m.on == On::Annotation).then_some(m.key), Some(m.saved_as)]);
        let kept = DECIDING_ANNOTATIONS.iter().copied().chain(marked.flatten());
        let annotations: Annotations = all_annotations
            .filter_map(|(k, v)| Some((kept.clone().find(|key| *key == k.as_str())?, boxed(v))))
            .collect();
        let mut owners = meta.owner_references.iter().flatten();
        let owner = owners
            .find(|o| o.controller == Some(true))
            .map(|o| Arc::from(OwnerKey::of(&o.api_version, &o.kind, &o.name).to_string()));
        let readiness = self.status.readiness();
        let phase = Phase::parse(self.status.phase.as_deref());
        let mut record = PodRecord {
            uid: boxed(meta.uid.as_deref().unwrap_or_default()),
            resource_version: boxed(meta.resource_version.as_deref().unwrap_or_default()),
            owner,
            node: self.node_name.as_deref().map(Arc::from),
            phase,
            not_started: not_started(phase, self.node_name.as_deref().unwrap_or_default(), &self.status),
            task_ended: false,
            status_reason: self.status.reason.as_deref().map(boxed),
            disruption: self.status.disruption().map(boxed),
            ready: readiness.map(|r| r.ready),
            ready_since: Second::of(readiness.and_then(|r| r.since)),
            ready_gated: readiness.is_some_and(|r| r.gated),
            terminating: meta.deletion_timestamp.is_some(),
            created: Second::of(meta.creation_timestamp.as_ref().map(|t| t.0)),
            started: Second::of(self.status.start_time),
            last_restart: Second::of(
                self.status.last_restart(TASK_CONTAINER_NAMED_BY.into_iter().find_map(|key| get(&annotations, key))),
            ),
            labels,
            annotations,
            mark_by_busyguard: written_by(meta, "f:annotations", DELETE_REQUESTED),
            busy_label_by_busyguard: written_by(meta, "f:labels", BUSY_LABEL),
        };
        // Read through the record: which containers are the task's depends on its labels and annotations.
        record.task_ended = task_ended(&record, self.restart_policy.as_deref().unwrap_or_default(), &self.status);
        record
    }
}

/// Whether busyguard (its field manager) owns `key` of the metadata map `map` (`f:labels`,
/// `f:annotations`) through the pod itself (not its status), as the API server's managedFields
/// record it.
fn written_by(meta: &ObjectMeta, map: &str, key: &str) -> bool {
    let field = format!("f:{key}");
    let through_the_pod = |entry: &&ManagedFieldsEntry| {
        entry.manager.as_deref() == Some(FIELD_MANAGER) && entry.subresource.as_deref().unwrap_or_default().is_empty()
    };
    let entries = meta.managed_fields.iter().flatten();
    entries.filter(through_the_pod).any(|entry| {
        let fields = entry.fields_v1.as_ref().map(|f| &f.0);
        fields.and_then(|f| f.get("f:metadata")?.get(map)?.get(&field)).is_some()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::keys::{BUSY_LABEL, BUSY_SINCE};
    use crate::policy::pod::{PodFacts, Readiness};
    use serde_json::json;

    fn api_pod(value: serde_json::Value) -> ApiPod {
        serde_json::from_value(value).unwrap()
    }

    /// A refusal reads the owner from the view's record (an eviction) or from the request's pod
    /// (a delete): both name the same controlling owner.
    #[test]
    fn the_record_and_the_requests_pod_name_the_same_controlling_owner() {
        use crate::policy::pod::{OwnerKey, Pod};
        fn reference(api_version: &str, kind: &str, name: &str, controller: bool) -> serde_json::Value {
            json!({"apiVersion": api_version, "kind": kind, "name": name, "uid": "u", "controller": controller})
        }
        let owners = [
            (
                vec![reference("apps/v1", "ReplicaSet", "w-6b8958b477", true)],
                Some(("apps", "ReplicaSet", "w-6b8958b477")),
            ),
            (
                vec![
                    reference("v1", "ConfigMap", "not-controlling", false),
                    reference("actions.github.com/v1alpha1", "EphemeralRunner", "r-4tb9k", true),
                ],
                Some(("actions.github.com", "EphemeralRunner", "r-4tb9k")),
            ),
            (vec![reference("v1", "Pod", "etl-driver", true)], Some(("", "Pod", "etl-driver"))),
            (vec![reference("apps/v1", "ReplicaSet", "w", false)], None),
            (vec![], None),
        ];
        for (references, expected) in owners {
            let pod = json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u", "ownerReferences": references}});
            let record = api_pod(pod.clone()).record(&[]);
            let request_pod: Pod = serde_json::from_value(pod).unwrap();
            let expected = expected.map(|(group, kind, name)| OwnerKey { group, kind, name });
            assert_eq!(record.owner_key(), expected, "{references:?}");
            assert_eq!(request_pod.owner_key(), expected, "{references:?}");
        }
    }

    /// The view keeps as derived facts what the request's pod reads from its spec and container
    /// statuses: both must say the same of every pod.
    #[test]
    fn the_record_and_the_requests_pod_read_start_end_and_readiness_alike() {
        use crate::policy::pod::Pod;
        let ran = |name: &str| json!({"name": name, "restartCount": 0, "state": {"running": {"startedAt": "2026-11-21T20:00:00Z"}}});
        let exited = |name: &str, code: i32| json!({"name": name, "restartCount": 0, "state": {"terminated": {"exitCode": code, "finishedAt": "2026-11-21T20:10:00Z"}}});
        let waiting = json!({"name": "w", "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}});
        let tekton = json!({BUSY_LABEL: "true", "tekton.dev/taskRun": "build"});
        let argo = json!({BUSY_LABEL: "true", "workflows.argoproj.io/workflow": "wf"});
        let job = json!({BUSY_LABEL: "true", "batch.kubernetes.io/job-name": "import"});
        let pods = [
            // labels, spec, status
            (json!({BUSY_LABEL: "true"}), json!({}), json!({"phase": "Pending"})),
            (
                json!({BUSY_LABEL: "true"}),
                json!({"nodeName": "n"}),
                json!({"phase": "Pending", "containerStatuses": [waiting]}),
            ),
            (
                json!({BUSY_LABEL: "true"}),
                json!({"nodeName": "n"}),
                json!({"phase": "Pending",
                "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]}),
            ),
            (
                tekton.clone(),
                json!({"nodeName": "n", "restartPolicy": "Never"}),
                json!({"phase": "Running", "containerStatuses": [exited("step-a", 1), ran("sidecar-db")]}),
            ),
            (
                tekton,
                json!({"nodeName": "n", "restartPolicy": "Never"}),
                json!({"phase": "Running", "containerStatuses": [exited("step-a", 0), ran("step-b")]}),
            ),
            (
                argo.clone(),
                json!({"nodeName": "n", "restartPolicy": "Never"}),
                json!({"phase": "Running", "containerStatuses": [exited("main", 0), ran("wait")]}),
            ),
            (
                argo,
                json!({"nodeName": "n", "restartPolicy": "Never"}),
                json!({"phase": "Running", "containerStatuses": [exited("main", 0), exited("wait", 0)]}),
            ),
            (
                job,
                json!({"nodeName": "n", "restartPolicy": "OnFailure"}),
                json!({"phase": "Running", "containerStatuses": [exited("main", 1)]}),
            ),
            (
                json!({BUSY_LABEL: "when-unready"}),
                json!({"nodeName": "n"}),
                json!({"phase": "Running",
                "conditions": [{"type": "Ready", "status": "False", "reason": "ReadinessGatesNotReady"}]}),
            ),
        ];
        let mut seen = std::collections::BTreeSet::new();
        for (labels, spec, status) in pods {
            let value = json!({"metadata": {"name": "w", "namespace": "ns", "uid": "u", "labels": labels},
                "spec": spec, "status": status});
            let (record, pod): (PodRecord, Pod) =
                (api_pod(value.clone()).record(&[]), serde_json::from_value(value.clone()).unwrap());
            assert_eq!(record.not_started(), pod.not_started(), "not started: {value}");
            assert_eq!(record.task_ended(), pod.task_ended(), "task ended: {value}");
            assert_eq!(record.readiness(), pod.readiness(), "readiness: {value}");
            seen.insert((pod.not_started(), pod.task_ended(), pod.readiness().is_some_and(|r| r.gated)));
        }
        assert!(seen.len() >= 4, "the cases tell every fact both ways: {seen:?}");
    }

    #[test]
    fn record_keeps_what_decisions_read_and_drops_the_rest() {
        let pod = api_pod(json!({
            "metadata": {"name": "w-1", "namespace": "capture", "uid": "u-1", "resourceVersion": "7",
                "labels": {"app": "worker", BUSY_LABEL: "true"},
                "annotations": {BUSY_SINCE: "2026-11-21T20:00:00Z",
                    "kubectl.kubernetes.io/last-applied-configuration": "x".repeat(5000)},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "w", "uid": "r",
                    "controller": true}],
                "managedFields": [{"manager": "kubectl"}]},
            "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}));
        let record = pod.record(&[]);
        assert_eq!(record.label("app"), Some("worker"));
        assert_eq!(record.annotation(BUSY_SINCE), Some("2026-11-21T20:00:00Z"));
        assert_eq!(record.annotations.len(), 1, "unrelated annotations are not kept");
        // A `--busy-annotation` mark and the pod's own value it keeps are read as busyguard's own.
        let cast = Mark::parse(On::Annotation, "autoscaling.cast.ai/removal-disabled=true").unwrap();
        let mut marked = pod.clone();
        let annotations = marked.metadata.annotations.get_or_insert_default();
        annotations.extend([(cast.key.to_string(), "true".into()), (cast.saved_as.to_string(), "false".into())]);
        assert_eq!(marked.record(&[]).annotations.len(), 1, "not kept when not asked for");
        let record = marked.record(&[cast]);
        assert_eq!((record.annotation(cast.key), record.annotation(cast.saved_as)), (Some("true"), Some("false")));
        assert_eq!(record.owner.as_deref(), Some("apps/ReplicaSet/w"));
        assert_eq!(record.node.as_deref(), Some("node-1"));
        assert_eq!(record.phase, Phase::Running);
        assert_eq!(record.readiness(), Some(Readiness { ready: true, since: None, gated: false }));
        assert_eq!(&*record.resource_version, "7");
    }

    #[test]
    fn a_mark_counts_only_as_busyguard_wrote_it_through_the_pod_not_its_status() {
        let marked = |subresource: Option<&str>| {
            let mut entry = json!({"manager": "busyguard", "operation": "Update", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:annotations": {"f:busyguard.io/delete-requested": {}}}}});
            if let Some(subresource) = subresource {
                entry["subresource"] = json!(subresource);
            }
            api_pod(json!({"metadata": {"name": "w", "namespace": "ns",
                "labels": {BUSY_LABEL: "false", DELETE_REQUESTED: "true"},
                "annotations": {DELETE_REQUESTED: r#"{"by":"alice","at":"2026-11-21T20:00:00Z"}"#},
                "managedFields": [entry]}}))
            .record(&[])
        };
        assert!(marked(None).delete_request().is_some());
        assert!(marked(Some("status")).delete_request().is_none(), "written through pods/status");
    }

    #[test]
    fn a_busy_label_busyguard_wrote_for_an_owner_is_recorded_as_its_and_no_one_elses_is() {
        let written_by = |manager: &str| {
            let entry = json!({"manager": manager, "operation": "Update", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {"f:busyguard.io/busy": {}}}}});
            api_pod(json!({"metadata": {"name": "gs", "namespace": "ns", "labels": {BUSY_LABEL: "true"},
                "managedFields": [entry]}}))
            .record(&[])
        };
        assert!(written_by("busyguard").busy_label_by_busyguard());
        assert!(!written_by("worker").busy_label_by_busyguard(), "the app's own flag");
        assert!(!written_by("busyguard").mark_by_busyguard(), "a label is not the mark");
    }

    #[test]
    fn malformed_pod_keeps_its_identity_and_says_what_is_wrong() {
        let pod = api_pod(json!({"metadata": {"name": "w", "namespace": "ns", "resourceVersion": "9"},
                                 "status": {"phase": 42}}));
        assert_eq!(pod.name(), "w");
        assert_eq!(pod.metadata.resource_version.as_deref(), Some("9"));
        assert!(pod.malformed.as_deref().unwrap().contains("invalid type"));
    }
}
