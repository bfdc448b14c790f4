//! Any pod (JSON), deleted and evicted by a person, an exempt user and a member of an exempt
//! group: a pod marked busy goes only with an audited exemption that applies.
#![no_main]

#[path = "../../tests/common/invariants.rs"]
mod invariants;

use invariants::{Disruption, EXEMPT_GROUP, EXEMPT_USER};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

fuzz_target!(|data: &[u8]| {
    let Ok(pod) = serde_json::from_slice::<Value>(data) else { return };
    for (user, groups) in [("admin", json!([])), (EXEMPT_USER, json!([])), ("someone", json!([EXEMPT_GROUP]))] {
        let mut delete: Value =
            serde_json::from_str(include_str!("../../tests/fixtures/pod-delete-by-user.json")).unwrap();
        delete["request"]["oldObject"] = pod.clone();
        delete["request"]["name"] = pod["metadata"]["name"].clone();
        delete["request"]["userInfo"] = json!({"username": user, "groups": groups});
        let _ = invariants::busy_pods_go_only_with_an_audited_exemption(
            Disruption { pod: &pod, review: &delete },
            &invariants::view_of(&[]),
        );

        let mut evict: Value =
            serde_json::from_str(include_str!("../../tests/fixtures/pod-eviction-by-user.json")).unwrap();
        evict["request"]["namespace"] = pod["metadata"]["namespace"].clone();
        evict["request"]["name"] = pod["metadata"]["name"].clone();
        evict["request"]["userInfo"] = json!({"username": user, "groups": groups});
        let _ = invariants::busy_pods_go_only_with_an_audited_exemption(
            Disruption { pod: &pod, review: &evict },
            &invariants::view_of(&[&pod]),
        );
    }
});
