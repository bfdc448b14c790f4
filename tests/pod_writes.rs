//! Writes to opted-in pods, through busyguard's own routes in-process: a flip to busy on a pod
//! being deleted, who may flip a pod's busy flag, a controller's label on a busy pod, and a
//! resize that would restart a busy pod's task container, another writer's overwrite of a busy
//! pod's marks.

mod common;

use busyguard::policy::Mode;
use common::fixture;
use common::in_process::{app, app_in, post};

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

#[tokio::test]
async fn another_writer_clearing_a_busy_pods_cost_is_answered_counted_and_named_on_status() {
    let since = (jiff::Timestamp::now() - jiff::SignedDuration::from_mins(5)).round(jiff::Unit::Second).unwrap();
    let cost = "controller.kubernetes.io/pod-deletion-cost";
    let karpenter = "system:serviceaccount:kube-system:karpenter";
    // A busy pod as busyguard left it; Karpenter's pod deletion cost management clears its cost.
    let mut review = fixture("pod-update-label-busy-by-user.json");
    for field in ["oldObject", "object"] {
        let metadata = &mut review["request"][field]["metadata"];
        metadata["labels"]["busyguard.io/busy"] = serde_json::json!("true");
        metadata["annotations"]["busyguard.io/busy-since"] = serde_json::json!(since.to_string());
        metadata["annotations"][cost] = serde_json::json!(busyguard::policy::cost::busy_cost(since).to_string());
    }
    review["request"]["object"]["metadata"]["annotations"].as_object_mut().unwrap().remove(cost);
    review["request"]["userInfo"] = serde_json::json!({"username": karpenter});
    // Audit mode (a pod marked under enforce mode) puts nothing back, and tells the fight all the same.
    for (mode, put_back) in [(Mode::Enforce, true), (Mode::Audit, false)] {
        let app = app_in(mode);
        let (status, answer) = post(&app, "/mutate", &review).await;
        assert_eq!(status, 200);
        assert_eq!(answer["response"]["patch"].is_string(), put_back, "{mode:?}: {answer}");
        let problems = app.health().unwrap_err().join("\n");
        assert!(problems.contains(&format!("{karpenter} took {cost} off busy pod capture/")), "{problems}");
        let metrics = app.metrics.encode();
        assert!(metrics.contains("busyguard_busy_marks_overwritten_total 1"), "{mode:?}: {metrics}");
    }
}
