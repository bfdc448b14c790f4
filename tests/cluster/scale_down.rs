//! Scale-downs prepared before they are allowed: stale annotations brought up to date, and how the API server's errors are met.

use super::*;

/// A server watching `five_workers`, once the watch tried (and failed) to refresh the two stale
/// ones; the calls so far are forgotten.
async fn serving_five_workers(api: &ApiServer) -> TestServer {
    let server = TestServer::with_cluster(api).await;
    api.wait_for(2, |c| c.method == "PATCH").await;
    api.forget_calls();
    server
}

#[tokio::test]
async fn scale_down_5_to_2_with_2_busy_patches_only_stale_annotations_before_allowing() {
    let api = ApiServer::start().await;
    let since = since_minutes_ago(30);
    five_workers(&api, since);
    let server = serving_five_workers(&api).await;

    let response = server.review("/validate", &scale_down_5_to_2()).await;
    assert_eq!(response, json!({"uid": "fe29bcc8-64c6-498a-8f6b-7eb66bc8e0c3", "allowed": true}));
    // The answer waited for the patches: they are already there.
    let writes = api.writes();
    assert_eq!(writes.len(), 2, "{writes:#?}");
    let busy_stale = writes.iter().find(|c| c.path == format!("{POD_PATH}/busy-stale")).expect("busy-stale patched");
    let stamped: Timestamp =
        busy_stale.body["metadata"]["annotations"]["busyguard.io/busy-since"].as_str().unwrap().parse().unwrap();
    // A flip busyguard missed counts from the pod's creation: never a protection renewed.
    assert_eq!(stamped, missed_created(since));
    assert_eq!(busy_stale.method, "PATCH");
    assert_eq!(
        busy_stale.body,
        json!({"metadata": {"uid": "uid-busy-stale", "resourceVersion": "2", "annotations": {
            "busyguard.io/busy-since": stamped.to_string(),
            "controller.kubernetes.io/pod-deletion-cost": busy_cost(stamped).to_string(),
            "busyguard.io/idle-cost": "1",
            "karpenter.sh/do-not-disrupt": "true",
            "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"},
            "labels": {"busyguard.io/protected": "true"}}})
    );
    let idle_stale = writes.iter().find(|c| c.path == format!("{POD_PATH}/idle-stale")).expect("idle-stale patched");
    assert_eq!(
        idle_stale.body,
        json!({"metadata": {"uid": "uid-idle-stale", "resourceVersion": "5", "annotations": {
            "busyguard.io/busy-since": null,
            "controller.kubernetes.io/pod-deletion-cost": "1",
            "busyguard.io/idle-cost": null,
            "karpenter.sh/do-not-disrupt": null,
            "cluster-autoscaler.kubernetes.io/safe-to-evict": null},
            "labels": {"busyguard.io/protected": null}}})
    );
    let audit = server.audit_lines();
    assert_eq!((audit[0]["decision"].as_str(), audit[0]["reason"].as_str()), (Some("scale-down"), Some("plan")));
    assert_eq!(
        audit[0]["plan"],
        json!({"replicas_from": 5, "replicas_to": 2, "pods": 5, "idle_taken": 3, "busy_waited": 0,
               "busy_spared": 2, "refreshed": 2})
    );
}

#[tokio::test]
async fn dry_run_scale_down_plans_without_patching() {
    let api = ApiServer::start().await;
    five_workers(&api, since_minutes_ago(30));
    let server = serving_five_workers(&api).await;
    let mut review = scale_down_5_to_2();
    review["request"]["dryRun"] = json!(true);
    assert_eq!(server.review("/validate", &review).await["allowed"], true);
    settle().await;
    assert_eq!(api.writes(), vec![]);
    assert_eq!(server.audit_lines()[0]["dry_run"], true);
}

#[tokio::test]
async fn replicaset_scale_down_by_the_deployment_controller_uses_its_structured_selector() {
    let api = ApiServer::start().await;
    five_workers(&api, since_minutes_ago(30));
    let server = serving_five_workers(&api).await;
    let mut review = fixture("replicaset-update-scale-down-by-deployment-controller.json");
    review["request"]["oldObject"]["spec"]["replicas"] = json!(5);
    assert_eq!(server.review("/validate", &review).await["allowed"], true);
    assert_eq!(api.writes().len(), 2);
    assert_eq!(server.audit_lines()[0]["plan"]["pods"], 5);
}

#[tokio::test]
async fn a_conflicting_patch_is_decided_again_on_the_pods_next_change() {
    let api = ApiServer::start().await;
    five_workers(&api, since_minutes_ago(30));
    let server = serving_five_workers(&api).await;
    let path = format!("{POD_PATH}/idle-stale");
    api.fault("PATCH", &path, [Fault::Status(409)]);
    server.review("/validate", &scale_down_5_to_2()).await;
    // A conflict means the pod changed: its watch event comes, and busyguard plans on it.
    api.update_pod("capture", "idle-stale", |pod| pod["metadata"]["annotations"]["team"] = json!("a"));
    api.wait_for(2, pod_call("PATCH", "idle-stale")).await;
    settle().await;
    let calls: Vec<(String, String)> =
        api.writes().into_iter().filter(|c| c.path == path).map(|c| (c.method, c.path)).collect();
    let expected = [("PATCH", &path), ("PATCH", &path)];
    assert_eq!(calls, expected.map(|(m, p)| (m.to_string(), p.clone())), "no GET: the watch brought the pod");
    assert_eq!(
        api.pod("capture", "idle-stale").unwrap()["metadata"]["annotations"],
        json!({"controller.kubernetes.io/pod-deletion-cost": "1", "team": "a"})
    );
}

#[tokio::test]
async fn a_server_error_on_a_patch_is_retried() {
    let api = ApiServer::start().await;
    five_workers(&api, since_minutes_ago(30));
    let server = serving_five_workers(&api).await;
    let path = format!("{POD_PATH}/idle-stale");
    api.fault("PATCH", &path, [Fault::Status(500)]);
    server.review("/validate", &scale_down_5_to_2()).await;
    api.wait_for(2, pod_call("PATCH", "idle-stale")).await;
    assert_eq!(
        server.metric(r#"busyguard_side_effects_total{kind="refresh",result="ok"}"#).await,
        Some(2.0),
        "both stale pods updated in the end"
    );
}

#[tokio::test]
async fn a_hanging_api_server_does_not_hold_the_answer_past_its_budget() {
    let api = ApiServer::start().await;
    five_workers(&api, since_minutes_ago(30));
    let server = serving_five_workers(&api).await;
    api.fault("PATCH", &format!("{POD_PATH}/idle-stale"), [Fault::Delay(Duration::from_secs(8))]);
    let started = Instant::now();
    let answer = server.post("/validate?timeout=2s", serde_json::to_vec(&scale_down_5_to_2()).unwrap()).await;
    let took = started.elapsed();
    assert_eq!(answer.json()["response"]["allowed"], true);
    assert!(took < Duration::from_secs(2), "answered after {took:?}, past the API server's timeout");
}

#[tokio::test]
async fn scale_objects_without_a_usable_selector_are_allowed_and_audited() {
    let api = ApiServer::start().await;
    five_workers(&api, since_minutes_ago(30));
    let server = serving_five_workers(&api).await;
    let mut none = scale_down_5_to_2();
    none["request"]["object"]["status"].as_object_mut().unwrap().remove("selector");
    none["request"]["oldObject"]["status"].as_object_mut().unwrap().remove("selector");
    let mut garbled = scale_down_5_to_2();
    garbled["request"]["object"]["status"]["selector"] = json!("app in (worker");
    for review in [none, garbled] {
        assert_eq!(server.review("/validate", &review).await["allowed"], true);
    }
    settle().await;
    assert_eq!(api.writes(), vec![]);
    let reasons: Vec<Value> = server.audit_lines().iter().map(|l| l["reason"].clone()).collect();
    assert_eq!(reasons, vec![json!("no-selector"), json!("invalid-selector")]);
}
