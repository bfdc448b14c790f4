//! Any body, as the webhook port receives it: decoded and judged by both webhooks against a
//! view holding a busy pod; a well-formed answer echoing the uid, or a refusal, never a panic.
#![no_main]

#[path = "../../tests/common/invariants.rs"]
mod invariants;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    let mut busy: serde_json::Value =
        serde_json::from_str(include_str!("../../tests/fixtures/pod-delete-by-user.json")).unwrap();
    let pod = &mut busy["request"]["oldObject"];
    pod["metadata"]["name"] = "worker-6b8958b477-qvmc9".into();
    pod["metadata"]["labels"]["busyguard.io/busy"] = "true".into();
    invariants::any_body_is_answered_or_refused(body, &invariants::view_of(&[&*pod]));
});
