//! The real server, over real TLS, answering AdmissionReviews a real kube-apiserver sent
//! (`tests/fixtures/`) and busy variants of them: one test per route and answer; the decisions
//! themselves are unit-tested in `src/policy/`, and every fixture goes through the router in
//! `tests/router.rs`.

mod common;

use common::{TestServer, fixture, patch_of, pod_mut, set_busy_label};
use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

const EPOCH_2024: i64 = 1_704_067_200;

fn whole_seconds_ago(seconds: i64) -> Timestamp {
    Timestamp::from_second(Timestamp::now().as_second() - seconds).unwrap()
}

fn set_busy_since(review: &mut Value, since: Timestamp) {
    pod_mut(review)["metadata"]["annotations"]["busyguard.io/busy-since"] = json!(since.to_string());
}

#[tokio::test]
async fn eviction_without_a_cluster_is_503_with_the_reason_and_status_says_so() {
    let server = TestServer::start().await;
    let answer = server.post("/validate", serde_json::to_vec(&fixture("pod-eviction-by-user.json")).unwrap()).await;
    assert_eq!(answer.status, 503);
    assert_eq!(
        answer.json(),
        json!({"code": 503, "error": "cannot judge the eviction: busyguard runs without a cluster connection (--no-cluster, or no kubeconfig found)"})
    );
    assert_eq!(server.metric(r#"busyguard_http_errors_total{status="503"}"#).await, Some(1.0));
    assert_eq!(server.admin_get("/readyz").await.status, 200, "the pod paths still work without a cluster");
    // /status and the gauge say what the answer says.
    let status = server.admin_get("/status").await;
    assert_eq!(
        (status.status, status.text()),
        (
            503,
            "busyguard runs without a cluster connection (--no-cluster, or no kubeconfig found): evictions and node deletes are answered \
             503, scale-downs go unprepared\n"
                .to_string()
        )
    );
    assert_eq!(server.metric("busyguard_view_unavailable").await, Some(1.0));
}

#[tokio::test]
async fn scale_down_without_a_cluster_is_allowed_and_audited_as_unprepared() {
    let server = TestServer::start().await;
    let response = server.review("/validate", &fixture("deployment-scale-subresource-down-by-kubectl.json")).await;
    assert_eq!(response, json!({"uid": "fe29bcc8-64c6-498a-8f6b-7eb66bc8e0c3", "allowed": true}));
    let audit = server.audit_lines();
    assert_eq!(
        (audit[0]["decision"].as_str(), audit[0]["reason"].as_str()),
        (Some("scale-down"), Some("view-unavailable"))
    );
    assert_eq!(
        audit[0]["detail"],
        "deployments/scale capture/worker 4→2: pods not prepared, busyguard runs without a cluster connection (--no-cluster, or no kubeconfig found)"
    );
}

#[tokio::test]
async fn flip_to_busy_raises_the_cost_keeps_the_users_cost_and_blocks_autoscalers() {
    let server = TestServer::start().await;
    let before = Timestamp::now().as_second();
    let response = server.review("/mutate", &fixture("pod-update-label-busy-by-user.json")).await;
    let after = Timestamp::now().as_second();
    assert_eq!(response["allowed"], true);
    let ops = patch_of(&response);
    let since: Timestamp = ops[0]["value"].as_str().unwrap().parse().unwrap();
    assert!((before..=after).contains(&since.as_second()), "busy-since is the time of the flip");
    let cost = i64::from(i32::MAX) - (since.as_second() - EPOCH_2024);
    // "true", which every Karpenter honours (the duration form is --karpenter-bounded=true).
    let do_not_disrupt = "true";
    let annotation = |key: &str| format!("/metadata/annotations/{}", key.replace('/', "~1"));
    assert_eq!(
        ops,
        vec![
            json!({"op": "add", "path": annotation("busyguard.io/busy-since"), "value": since.to_string()}),
            json!({"op": "add", "path": annotation("busyguard.io/idle-cost"), "value": "1"}),
            json!({"op": "add", "path": annotation("cluster-autoscaler.kubernetes.io/safe-to-evict"), "value": "false"}),
            json!({"op": "add", "path": annotation("controller.kubernetes.io/pod-deletion-cost"), "value": cost.to_string()}),
            json!({"op": "add", "path": annotation("karpenter.sh/do-not-disrupt"), "value": do_not_disrupt}),
            json!({"op": "add", "path": "/metadata/labels/busyguard.io~1protected", "value": "true"}),
        ]
    );
}

/// Applies an admission response's patch to the pod of the review it answered.
fn apply(review: &mut Value, response: &Value) {
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(patch_of(response))).unwrap();
    json_patch::patch(pod_mut(review), &patch).expect("the patch applies to the pod it came from");
}

#[tokio::test]
async fn busy_pod_created_busy_gets_the_busy_annotations() {
    let server = TestServer::start().await;
    let mut review = fixture("pod-create-by-replicaset-controller.json");
    set_busy_label(&mut review, "true");
    let response = server.review("/mutate", &review).await;
    apply(&mut review, &response);
    let annotations = &pod_mut(&mut review)["metadata"]["annotations"];
    assert_eq!(annotations["busyguard.io/idle-cost"], "1");
    assert_eq!(annotations["karpenter.sh/do-not-disrupt"], "true");
}

#[tokio::test]
async fn a_deletecollections_review_names_no_pod_and_is_judged_and_audited_for_the_pod_it_carries() {
    let server = TestServer::start().await;
    let mut review = fixture("pod-delete-by-user.json");
    set_busy_label(&mut review, "true");
    set_busy_since(&mut review, whole_seconds_ago(600));
    // As the API server sends each pod of `kubectl delete pods --all`: no name in the request.
    review["request"]["name"] = json!("");
    let response = server.review("/validate", &review).await;
    assert_eq!(response["allowed"], false);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(message.starts_with("pod capture/worker-6b8958b477-df84j is busy since"), "{message}");
    assert_eq!(server.audit_lines()[0]["name"], "worker-6b8958b477-df84j");
}

#[tokio::test]
async fn busy_pod_delete_by_a_person_is_refused_with_429_an_actionable_message_and_an_audit_line() {
    // No cluster here: nothing confirms the pod busy, so the delete is refused but not deferred
    // (tests/cluster/ has the deferred delete).
    let server = TestServer::start().await;
    let mut review = fixture("pod-delete-by-user.json");
    set_busy_label(&mut review, "true");
    let since = whole_seconds_ago(600);
    set_busy_since(&mut review, since);
    let response = server.review("/validate", &review).await;
    let until = since.checked_add(SignedDuration::from_hours(24)).unwrap();
    let message = format!(
        "pod capture/worker-6b8958b477-df84j is busy since {since} (protection lapses at {until} at the latest); \
         it will be spared until it is idle; to force: \
         kubectl label pod worker-6b8958b477-df84j -n capture busyguard.io/busy=false --overwrite"
    );
    assert_eq!(
        response,
        json!({"uid": "72c74df2-1c4e-45f7-b24d-4717cf675c16", "allowed": false,
               "status": {"status": "Failure", "code": 429, "reason": "TooManyRequests", "message": message,
                          "details": {"causes": [{"reason": "BusyguardPodBusy"}]}}})
    );
    let audit = server.audit_lines();
    assert_eq!(audit.len(), 1);
    let line = &audit[0];
    assert_eq!(line["decision"], "denied");
    assert_eq!(line["reason"], "busy");
    assert_eq!(line["uid"], "72c74df2-1c4e-45f7-b24d-4717cf675c16");
    assert_eq!(line["operation"], "DELETE");
    assert_eq!(line["resource"], "pods");
    assert_eq!(line["namespace"], "capture");
    assert_eq!(line["name"], "worker-6b8958b477-df84j");
    assert_eq!(line["user"], "admin");
    assert_eq!(line["groups"], json!(["system:masters", "system:authenticated"]));
    assert_eq!(line["busy_since"], since.to_string());
    assert_eq!(line["mode"], "enforce");
    assert_eq!(line["dry_run"], false);
}

#[tokio::test]
async fn busy_pod_delete_by_the_replicaset_controller_is_refused() {
    let server = TestServer::start().await;
    let review = fixture("pod-delete-by-replicaset-controller.json");
    let response = server.review("/validate", &review).await;
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 429);
    assert_eq!(server.audit_lines()[0]["user"], "system:serviceaccount:kube-system:replicaset-controller");
}

#[tokio::test]
async fn kubelet_final_delete_of_a_terminating_busy_pod_is_allowed_silently() {
    let server = TestServer::start().await;
    let mut review = fixture("pod-delete-final-by-kubelet.json");
    set_busy_label(&mut review, "true");
    let response = server.review("/validate", &review).await;
    assert_eq!(response, json!({"uid": review["request"]["uid"], "allowed": true}));
    assert!(server.audit_lines().is_empty());
}

#[tokio::test]
async fn terminal_busy_pod_may_be_deleted() {
    let server = TestServer::start().await;
    let mut review = fixture("pod-delete-by-user.json");
    set_busy_label(&mut review, "true");
    pod_mut(&mut review)["status"]["phase"] = json!("Succeeded");
    assert_eq!(server.review("/validate", &review).await["allowed"], true);
}

#[tokio::test]
async fn a_controller_manager_speaking_as_one_user_is_reported() {
    let server = TestServer::start().await;
    let gauge = "busyguard_controller_manager_shared_identity";
    let mut review = fixture("pod-delete-by-user.json");
    set_busy_label(&mut review, "true");
    server.review("/validate", &review).await;
    assert_eq!(server.metric(gauge).await, Some(0.0), "a person's delete");
    review["request"]["userInfo"] = json!({"username": "system:kube-controller-manager", "groups": []});
    assert_eq!(server.review("/validate", &review).await["allowed"], false, "refused like any controller");
    assert_eq!(server.metric(gauge).await, Some(1.0));
}

#[tokio::test]
async fn pod_garbage_collector_may_delete_a_busy_pod_and_the_exemption_is_audited() {
    let server = TestServer::start().await;
    let mut review = fixture("pod-delete-by-user.json");
    set_busy_label(&mut review, "true");
    review["request"]["userInfo"] =
        json!({"username": "system:serviceaccount:kube-system:pod-garbage-collector", "groups": []});
    assert_eq!(server.review("/validate", &review).await["allowed"], true);
    let audit = server.audit_lines();
    assert_eq!((audit[0]["decision"].as_str(), audit[0]["reason"].as_str()), (Some("exempted"), Some("exempt-user")));
}

#[tokio::test]
async fn dry_run_request_is_judged_the_same_and_audited_as_dry_run() {
    let server = TestServer::start().await;
    let mut review = fixture("pod-delete-by-user.json");
    set_busy_label(&mut review, "true");
    review["request"]["dryRun"] = json!(true);
    let response = server.review("/validate", &review).await;
    assert_eq!(response["status"]["code"], 429);
    assert_eq!(server.audit_lines()[0]["dry_run"], true);
}

#[tokio::test]
async fn requests_busyguard_does_not_judge_are_allowed_and_counted() {
    let server = TestServer::start().await;
    let mut scale_up = fixture("replicaset-scale-subresource-down-by-kubectl.json");
    scale_up["request"]["object"]["spec"]["replicas"] = json!(10);
    assert_eq!(server.review("/validate", &scale_up).await["allowed"], true);
    let mut connect = fixture("pod-update-annotation-by-user.json");
    connect["request"]["operation"] = json!("CONNECT");
    assert_eq!(server.review("/validate", &connect).await["allowed"], true);
    for series in [
        r#"busyguard_admission_reviews_total{webhook="validating",resource="replicasets/scale",operation="UPDATE",result="allowed"}"#,
        r#"busyguard_admission_reviews_total{webhook="validating",resource="pods",operation="CONNECT",result="unhandled"}"#,
    ] {
        assert_eq!(server.metric(series).await, Some(1.0), "{series}");
    }
    assert!(server.audit_lines().is_empty(), "a scale-up is not a scale-down");
}
