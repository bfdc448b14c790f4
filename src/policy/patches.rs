//! How busyguard's plans and marks go on the wire: a JSONPatch for the mutating webhook's answer,
//! a merge patch for each of busyguard's own writes of a pod.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation};
use serde_json::Value;

use super::keys::{
    DELETE_REQUESTED, DISRUPTION_REQUESTED, DeleteRequest, EVICTION_IN_PROGRESS, PROTECTED_LABEL, RELEASED_FROM,
};
use super::marks::{Changes, Plan};
use super::pod::Pod;

/// The plan as a JSONPatch against the pod it was made for.
pub fn json_patch(pod: &Pod, plan: &Plan) -> Patch {
    let mut patch = annotations_patch(pod, &plan.annotations);
    // Opted-in pods carry labels: the map is there.
    let labels = plan.label_changes().map(|(key, value)| {
        let path = metadata_pointer("labels", key);
        match value {
            Some(value) => PatchOperation::Add(AddOperation { path, value: Value::String(value.to_string()) }),
            None => PatchOperation::Remove(RemoveOperation { path }),
        }
    });
    patch.0.extend(labels);
    patch
}

fn annotations_patch(pod: &Pod, changes: &Changes) -> Patch {
    let path = |key: &str| metadata_pointer("annotations", key);
    let operations = match &pod.metadata.annotations {
        _ if changes.is_empty() => vec![],
        // No annotations map yet: create it whole (there is nothing to remove).
        None => {
            let map = changes
                .iter()
                .filter_map(|(key, value)| Some((key.to_string(), Value::String(value.clone()?))))
                .collect();
            vec![PatchOperation::Add(AddOperation {
                path: PointerBuf::from_tokens(["metadata", "annotations"]),
                value: Value::Object(map),
            })]
        }
        Some(_) => changes
            .iter()
            .map(|(key, value)| match value {
                Some(value) => {
                    PatchOperation::Add(AddOperation { path: path(key), value: Value::String(value.clone()) })
                }
                None => PatchOperation::Remove(RemoveOperation { path: path(key) }),
            })
            .collect(),
    };
    Patch(operations)
}

/// The JSON pointer to `key` in the pod's `map` (labels or annotations), written into one buffer
/// with the key encoded (`~` as `~0`, `/` as `~1`): every flip to busy makes several, and the
/// general builder allocates for each token of each. Copied a run at a time between the
/// characters to encode, found byte by byte: both are ASCII, and a search for either of two
/// characters decodes each character first (a flip's pointers cost it 1.6% of its CPU so).
pub fn metadata_pointer(map: &str, key: &str) -> PointerBuf {
    let mut path = String::with_capacity("/metadata//".len() + map.len() + key.len() + 4);
    path.push_str("/metadata/");
    path.push_str(map);
    path.push('/');
    let mut rest = key;
    while let Some(at) = rest.bytes().position(|b| b == b'~' || b == b'/') {
        path.push_str(&rest[..at]);
        path.push_str(if rest.as_bytes()[at] == b'~' { "~0" } else { "~1" });
        rest = &rest[at + 1..];
    }
    path.push_str(rest);
    PointerBuf::parse(path).expect("a pointer with its key encoded")
}

/// Changes to a pod's labels and annotations by key (`None` removes): what each of busyguard's
/// pod writes through the API says, encoded in one place ([`PodChanges::merge_patch`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodChanges {
    pub labels: Changes,
    pub annotations: Changes,
}

impl PodChanges {
    /// A JSON merge patch of the changes (a map with none left out).
    pub fn merge_patch(&self) -> Value {
        let map = |changes: &Changes| -> serde_json::Map<String, Value> {
            changes
                .iter()
                .map(|(key, value)| (key.to_string(), value.clone().map_or(Value::Null, Value::String)))
                .collect()
        };
        let mut metadata = serde_json::Map::new();
        if !self.labels.is_empty() {
            metadata.insert("labels".into(), Value::Object(map(&self.labels)));
        }
        if !self.annotations.is_empty() {
            metadata.insert("annotations".into(), Value::Object(map(&self.annotations)));
        }
        serde_json::json!({"metadata": metadata})
    }
}

impl Plan {
    /// The plan as changes of the pod written through the API: its annotations, its label
    /// marks and the protected label.
    pub fn changes(&self) -> PodChanges {
        let labels = self.label_changes().map(|(key, value)| (key, value.map(str::to_string))).collect();
        PodChanges { labels, annotations: self.annotations.clone() }
    }

    /// Its label changes, borrowed (the flip's JSONPatch copies each value once, into its
    /// operation): the marks' and then the protected label's.
    fn label_changes(&self) -> impl Iterator<Item = (&'static str, Option<&str>)> {
        let marks = self.labels.iter().map(|(key, value)| (*key, value.as_deref()));
        marks.chain(self.protected.map(|on| (PROTECTED_LABEL, on.then_some("true"))))
    }
}

/// A deferred delete recorded on the pod: the mark's label and its annotation.
pub fn mark(request: &DeleteRequest, in_background: bool) -> PodChanges {
    let mut annotations = Changes::from([(DELETE_REQUESTED, Some(request.to_annotation()))]);
    if in_background {
        annotations.insert(EVICTION_IN_PROGRESS, Some("true".into()));
    }
    PodChanges { labels: Changes::from([(DELETE_REQUESTED, Some("true".into()))]), annotations }
}

/// A refused eviction (or node delete) recorded on the pod: it takes no new task for a while.
pub fn disruption_mark(request: &DeleteRequest) -> PodChanges {
    PodChanges {
        labels: Changes::new(),
        annotations: Changes::from([(DISRUPTION_REQUESTED, Some(request.to_annotation()))]),
    }
}

/// A busy pod taken out of its ReplicaSet (the `label` it selects by taken off, its value kept in
/// [`RELEASED_FROM`]), with the mark that has it deleted once idle.
pub fn release(label: &'static str, hash: &str, request: &DeleteRequest) -> PodChanges {
    let mut changes = mark(request, false);
    changes.labels.insert(label, None);
    changes.annotations.insert(RELEASED_FROM, Some(hash.into()));
    changes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::keys::{DELETION_COST, IDLE_COST, POD_TEMPLATE_HASH};
    use crate::policy::outcome::Effect;
    use crate::policy::pod::PodRef;
    use crate::policy::testing::ts;
    use serde_json::json;

    #[test]
    fn every_pod_write_is_one_merge_patch_with_the_pods_uid_and_a_refresh_with_its_resource_version() {
        let pod = PodRef { namespace: "capture".into(), name: "w".into(), uid: "u-w".into() };
        let request = DeleteRequest::new("alice", ts("2026-11-21T20:30:00Z"));
        let asked = request.to_annotation();
        let annotations = Changes::from([(DELETION_COST, Some("5".to_string())), (IDLE_COST, None)]);
        let refresh = Effect::Refresh {
            pod: pod.clone(),
            resource_version: "7".into(),
            plan: Plan { annotations, protected: Some(false), ..Plan::default() },
        };
        assert_eq!(
            refresh.pod_write().map(|write| write.patch),
            Some(json!({"metadata": {"uid": "u-w", "resourceVersion": "7",
                "annotations": {DELETION_COST: "5", IDLE_COST: null}, "labels": {PROTECTED_LABEL: null}}}))
        );
        let only_the_label = Effect::Refresh {
            pod: pod.clone(),
            resource_version: "8".into(),
            plan: Plan { protected: Some(true), ..Plan::default() },
        };
        assert_eq!(
            only_the_label.pod_write().map(|write| write.patch),
            Some(json!({"metadata": {"uid": "u-w", "resourceVersion": "8", "labels": {PROTECTED_LABEL: "true"}}}))
        );
        let marked = Effect::MarkDeleteRequested { pod: pod.clone(), request: request.clone(), in_background: false };
        assert_eq!(
            marked.pod_write().map(|write| write.patch),
            Some(json!({"metadata": {"uid": "u-w", "labels": {DELETE_REQUESTED: "true"},
                "annotations": {DELETE_REQUESTED: asked}}}))
        );
        let released = Effect::Release { pod: pod.clone(), label: POD_TEMPLATE_HASH, hash: "5d8f".into(), request };
        assert_eq!(
            released.pod_write().map(|write| write.patch),
            Some(json!({"metadata": {"uid": "u-w", "labels": {POD_TEMPLATE_HASH: null, DELETE_REQUESTED: "true"},
                "annotations": {RELEASED_FROM: "5d8f", DELETE_REQUESTED: asked}}}))
        );
    }

    #[test]
    fn a_pointer_to_a_label_or_annotation_has_its_key_encoded() {
        for key in ["busyguard.io/busy-since", "a~b/c", "plain", "", "~", "//~~", "é/ü~x/"] {
            assert_eq!(
                metadata_pointer("annotations", key),
                PointerBuf::from_tokens(["metadata", "annotations", key]),
                "{key}"
            );
        }
        assert_eq!(metadata_pointer("labels", "x/y").as_str(), "/metadata/labels/x~1y");
    }
}
