//! Every fixture a real kube-apiserver sent, through busyguard's own routes in-process (no TLS,
//! no sockets): the answer each request needs, on the wire as the API server reads it.
//! tests/admission_fixtures.rs has the same bodies over real TLS.

mod common;

use std::sync::Arc;

use axum::body::Body;
use base64::Engine;
use busyguard::audit::AuditLog;
use busyguard::cluster::Cluster;
use busyguard::metrics::Metrics;
use busyguard::server::{App, webhook};
use common::invariants::{policy, view_of};
use common::{fixture, set_busy_label, test_config};
use http_body_util::BodyExt;
use serde_json::Value;

/// The app over a listed view holding the pods the delete fixtures carry, so an eviction of
/// one of them is judged.
fn app() -> Arc<App> {
    let deleted: Vec<Value> = ["pod-delete-by-replicaset-controller.json", "pod-delete-by-user.json"]
        .map(|name| fixture(name)["request"]["oldObject"].clone())
        .into();
    let mut evicted = deleted[0].clone();
    evicted["metadata"]["name"] = fixture("pod-eviction-by-user.json")["request"]["name"].clone();
    let view = view_of(&[&deleted[0], &deleted[1], &evicted]);
    let metrics = Arc::new(Metrics::default());
    let audit = Arc::new(AuditLog::to(Box::new(std::io::sink()), metrics.audit.clone()));
    let limits = test_config(std::path::Path::new("/nonexistent")).limits;
    let cluster = Cluster { view: Arc::new(view), outbox: None, budgets: None };
    let app = App::new(policy(), audit, metrics, limits, cluster);
    app.start_serving();
    Arc::new(app)
}

async fn post(app: &App, path: &str, review: &Value) -> (u16, Value) {
    let request = http::Request::post(format!("{path}?timeout=5s"))
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(review).unwrap()))
        .unwrap();
    let response = webhook::route(app, request, None).await;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap())
}

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

#[tokio::test]
async fn a_flip_to_busy_on_a_pod_being_deleted_is_refused_409_so_the_worker_does_not_start() {
    let app = app();
    let mut review = fixture("pod-update-label-busy-by-user.json");
    for field in ["object", "oldObject"] {
        review["request"][field]["metadata"]["deletionTimestamp"] = serde_json::json!("2026-11-21T20:49:00Z");
    }
    let (status, answer) = post(&app, "/mutate", &review).await;
    assert_eq!(status, 200);
    let response = &answer["response"];
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 409);
    assert_eq!(response["status"]["reason"], "Conflict");
    assert_eq!(response["status"]["details"]["causes"][0]["reason"], "BusyguardPodTerminating");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("is being deleted (since 2026-11-21T20:49:00Z) and cannot turn busy: do not start the task")
    );
}

#[tokio::test]
async fn a_pods_own_service_account_may_flip_its_own_flag_but_not_a_neighbours() {
    let app = app();
    // The fixture's pod runs as the namespace's `default` service account.
    let review = |pod_name: &str| {
        let mut review = fixture("pod-update-label-busy-by-user.json");
        review["request"]["userInfo"] = serde_json::json!({"username": "system:serviceaccount:capture:default",
            "extra": {"authentication.kubernetes.io/pod-name": [pod_name]}});
        review
    };
    let (status, answer) = post(&app, "/validate", &review("worker-6b8958b477-6pv87")).await;
    assert_eq!((status, &answer["response"]["allowed"]), (200, &serde_json::json!(true)), "{answer}");
    let (_, answer) = post(&app, "/validate", &review("worker-6b8958b477-other")).await;
    assert_eq!(answer["response"]["allowed"], false);
    assert_eq!(answer["response"]["status"]["code"], 403);
    assert_eq!(answer["response"]["status"]["details"]["causes"][0]["reason"], "BusyguardNotOwnFlag");
}

#[tokio::test]
async fn a_controller_in_a_pod_of_its_own_labels_a_busy_pod_as_before_busyguard() {
    let app = app();
    let since = (jiff::Timestamp::now() - jiff::SignedDuration::from_mins(5)).round(jiff::Unit::Second).unwrap();
    // A busy pod, as busyguard left it, given a label and nothing else.
    let relabel_by = |username: &str, pod_name: &str| {
        let mut review = fixture("pod-update-label-busy-by-user.json");
        for field in ["oldObject", "object"] {
            let metadata = &mut review["request"][field]["metadata"];
            metadata["labels"]["busyguard.io/busy"] = serde_json::json!("true");
            metadata["labels"]["busyguard.io/protected"] = serde_json::json!("true");
            metadata["annotations"]["busyguard.io/busy-since"] = serde_json::json!(since.to_string());
        }
        review["request"]["object"]["metadata"]["labels"]["rollouts-pod-template-hash"] = serde_json::json!("abc");
        review["request"]["userInfo"] = serde_json::json!({"username": username,
            "extra": {"authentication.kubernetes.io/pod-name": [pod_name]}});
        review
    };
    let controller = relabel_by("system:serviceaccount:argo-rollouts:argo-rollouts", "argo-rollouts-7c9-x2");
    let (status, answer) = post(&app, "/validate", &controller).await;
    assert_eq!((status, &answer["response"]["allowed"]), (200, &serde_json::json!(true)), "{answer}");
    // The same write from a neighbour's token (the pod's own service account) is a worker's.
    let (_, answer) = post(&app, "/validate", &relabel_by("system:serviceaccount:capture:default", "other")).await;
    assert_eq!(answer["response"]["status"]["details"]["causes"][0]["reason"], "BusyguardNotOwnFlag", "{answer}");
}

#[tokio::test]
async fn a_resize_that_restarts_a_busy_pods_container_is_refused_429_and_one_in_place_is_allowed_unpatched() {
    let app = app();
    let since = (jiff::Timestamp::now() - jiff::SignedDuration::from_mins(5)).round(jiff::Unit::Second).unwrap();
    let review = |memory_policy: &str| {
        let mut review = fixture("pod-update-label-busy-by-user.json");
        let request = &mut review["request"];
        request["subResource"] = serde_json::json!("resize");
        request["requestSubResource"] = serde_json::json!("resize");
        for (field, memory) in [("oldObject", "1Gi"), ("object", "2Gi")] {
            let pod = &mut request[field];
            pod["metadata"]["labels"]["busyguard.io/busy"] = serde_json::json!("true");
            pod["metadata"]["annotations"]["busyguard.io/busy-since"] = serde_json::json!(since.to_string());
            let container = &mut pod["spec"]["containers"][0];
            container["resources"] = serde_json::json!({"requests": {"memory": memory}});
            container["resizePolicy"] = serde_json::json!([{"resourceName": "memory", "restartPolicy": memory_policy}]);
        }
        review
    };
    let (status, answer) = post(&app, "/mutate", &review("RestartContainer")).await;
    assert_eq!((status, &answer["response"]["allowed"]), (200, &serde_json::json!(false)), "{answer}");
    assert_eq!(answer["response"]["status"]["code"], 429);
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(message.contains("this update would restart its container \"app\""), "{message}");
    let (_, answer) = post(&app, "/mutate", &review("NotRequired")).await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert!(answer["response"]["patch"].is_null(), "a resize is never patched: {answer}");
}
