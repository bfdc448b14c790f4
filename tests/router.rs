//! Every fixture a real kube-apiserver sent, through busyguard's own routes in-process (no TLS,
//! no sockets): the answer each request needs, on the wire as the API server reads it.
//! tests/admission_fixtures.rs has the same bodies over real TLS.

mod common;

use base64::Engine;
use common::in_process::{app, post};
use common::{fixture, set_busy_label};

#[tokio::test]
async fn every_fixture_gets_the_answer_its_request_needs() {
    let app = app();
    // (fixture, path, allowed, patched). The delete by the ReplicaSet controller and the eviction
    // name pods already labelled busy; the rest are idle or not busyguard's to judge.
    let cases = [
        ("deployment-scale-subresource-down-by-kubectl.json", "/validate", true, false),
        ("deployment-update-replicas-down-by-user.json", "/validate", true, false),
        ("pod-create-by-replicaset-controller.json", "/mutate", true, false),
        ("pod-create-by-user.json", "/mutate", true, false),
        ("pod-delete-by-replicaset-controller.json", "/validate", false, false),
        ("pod-delete-by-user.json", "/validate", true, false),
        ("pod-delete-final-by-kubelet.json", "/validate", true, false),
        ("pod-eviction-by-user.json", "/validate", false, false),
        ("pod-eviction-server-dry-run-by-user.json", "/validate", false, false),
        ("pod-update-annotation-by-user.json", "/mutate", true, true),
        ("pod-update-label-busy-by-user.json", "/mutate", true, true),
        ("replicaset-scale-subresource-down-by-kubectl.json", "/validate", true, false),
        ("replicaset-update-scale-down-by-deployment-controller.json", "/validate", true, false),
    ];
    assert_eq!(cases.len(), std::fs::read_dir("tests/fixtures").unwrap().count(), "every fixture has a case");
    for (name, path, allowed, patched) in cases {
        let review = fixture(name);
        let (status, answer) = post(&app, path, &review).await;
        assert_eq!(status, 200, "{name}: {answer}");
        assert_eq!(
            (answer["apiVersion"].as_str(), answer["kind"].as_str()),
            (Some("admission.k8s.io/v1"), Some("AdmissionReview"))
        );
        let response = &answer["response"];
        assert_eq!(response["uid"], review["request"]["uid"], "{name}");
        assert_eq!(response["allowed"], allowed, "{name}: {response}");
        assert_eq!(response["patch"].is_string(), patched, "{name}: {response}");
        if patched {
            let patch = base64::engine::general_purpose::STANDARD.decode(response["patch"].as_str().unwrap()).unwrap();
            let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
            let mut pod = review["request"]["object"].clone();
            json_patch::patch(&mut pod, &patch).unwrap_or_else(|e| panic!("{name}: the patch does not apply: {e}"));
        }
        if !allowed {
            assert_eq!(response["status"]["code"], 429, "{name}");
            assert_eq!(response["status"]["details"]["causes"][0]["reason"], "BusyguardPodBusy", "{name}");
        }
    }
}

#[tokio::test]
async fn deletes_never_carry_a_patch_and_the_validating_path_never_patches_pod_writes() {
    let app = app();
    let mut busy_delete = fixture("pod-delete-by-user.json");
    set_busy_label(&mut busy_delete, "true");
    let cases = [
        (fixture("pod-update-label-busy-by-user.json"), "/validate", true),
        (fixture("pod-delete-by-user.json"), "/mutate", true),
        // Judged on whichever registration it reaches, and still without a patch.
        (busy_delete, "/mutate", false),
    ];
    for (review, path, allowed) in cases {
        let (status, answer) = post(&app, path, &review).await;
        assert_eq!(status, 200);
        assert_eq!(answer["response"]["allowed"], allowed, "{path}: {answer}");
        assert!(answer["response"]["patch"].is_null(), "{path}: {answer}");
    }
}
