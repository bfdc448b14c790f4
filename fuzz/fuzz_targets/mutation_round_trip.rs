//! Any pod (JSON), idle and updated: the flip to busy patches it cleanly, a second look changes
//! nothing, and the flip back to idle restores its annotations.
#![no_main]

#[path = "../../tests/common/invariants.rs"]
mod invariants;

use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(mut pod) = serde_json::from_slice::<Value>(data) else { return };
    // The checks write the busy label into metadata.labels: a pod without that shape is no pod.
    let metadata = pod.get("metadata").and_then(Value::as_object);
    if !metadata.is_some_and(|m| m.get("labels").is_none_or(Value::is_object)) {
        return;
    }
    // An idle pod carries none of what busyguard keeps while a pod is busy.
    if let Some(annotations) = pod.pointer_mut("/metadata/annotations").and_then(Value::as_object_mut) {
        annotations.retain(|key, _| key != "busyguard.io/busy-since" && !key.starts_with("busyguard.io/idle-"));
    }
    let mut update: Value =
        serde_json::from_str(include_str!("../../tests/fixtures/pod-update-label-busy-by-user.json")).unwrap();
    update["request"]["object"] = pod;
    let _ = invariants::busy_and_back_restores_the_annotations(&update);
});
