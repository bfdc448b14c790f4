//! A person's delete of a busy pod: refused, recorded as a mark, and carried out once when the pod is idle; marks and reviews busyguard did not make are ignored.

use super::*;

#[tokio::test]
async fn busy_delete_by_a_person_is_deferred_and_carried_out_once_when_the_pod_is_idle() {
    let api = ApiServer::start().await;
    let since = since_minutes_ago(10);
    api.put_pod(busy_pod("worker-a", since));
    let server = TestServer::with_cluster(&api).await;

    let response = server
        .review("/validate", &delete_of(&api.pod("capture", "worker-a").unwrap(), "pod-delete-by-user.json"))
        .await;
    assert_eq!(response["status"]["code"], 429);
    assert!(response["status"]["message"].as_str().unwrap().ends_with(
        "busyguard records the delete on the pod (busyguard.io/delete-requested) and carries it out once the pod \
         is idle (if the annotation does not appear, delete again later)"
    ));
    // The answer waited for the mark.
    let marks: Vec<Call> = api.writes().into_iter().filter(pod_call("PATCH", "worker-a")).collect();
    assert_eq!(marks.len(), 1);
    assert_eq!(marks[0].body["metadata"]["labels"]["busyguard.io/delete-requested"], "true", "the selectable half");
    let requested: Value = serde_json::from_str(
        marks[0].body["metadata"]["annotations"]["busyguard.io/delete-requested"].as_str().unwrap(),
    )
    .unwrap();
    assert_eq!(requested["by"], "admin");

    // Still busy: other changes of the pod do not delete it.
    api.update_pod("capture", "worker-a", |pod| pod["metadata"]["labels"]["team"] = json!("a"));
    settle().await;
    assert!(api.writes().iter().all(|c| c.method != "DELETE"));

    let idle =
        api.update_pod("capture", "worker-a", |pod| pod["metadata"]["labels"]["busyguard.io/busy"] = json!("false"));
    let deletes = api.wait_for(1, pod_call("DELETE", "worker-a")).await;
    assert_eq!(
        deletes[0].body["preconditions"],
        json!({"uid": "uid-worker-a", "resourceVersion": idle["metadata"]["resourceVersion"]}),
        "deletes exactly the pod seen idle"
    );
    // The pod goes on changing while it terminates: no second delete.
    api.update_pod("capture", "worker-a", |pod| pod["status"]["phase"] = json!("Running"));
    settle().await;
    assert_eq!(api.writes().iter().filter(|c| c.method == "DELETE").count(), 1);
    let audit = server.audit_lines();
    let carried_out: Vec<&Value> = audit.iter().filter(|l| l["decision"] == "deleted-when-idle").collect();
    assert_eq!(carried_out.len(), 1);
    assert_eq!((carried_out[0]["name"].as_str(), carried_out[0]["user"].as_str()), (Some("worker-a"), Some("admin")));
}

/// Busy worker-a, a person's delete of it refused (429) and recorded on it.
async fn a_persons_delete_deferred() -> (ApiServer, TestServer) {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("worker-a", since_minutes_ago(10)));
    let server = TestServer::with_cluster(&api).await;
    let review = delete_of(&api.pod("capture", "worker-a").unwrap(), "pod-delete-by-user.json");
    assert_eq!(server.review("/validate", &review).await["status"]["code"], 429);
    api.wait_for(1, pod_call("PATCH", "worker-a")).await;
    (api, server)
}

#[tokio::test]
async fn a_deferred_delete_the_api_server_first_answers_429_is_carried_out_exactly_once() {
    let (api, server) = a_persons_delete_deferred().await;

    api.fault("DELETE", &format!("{POD_PATH}/worker-a"), [Fault::Status(429), Fault::Status(503)]);
    api.update_pod("capture", "worker-a", |pod| pod["metadata"]["labels"]["busyguard.io/busy"] = json!("false"));
    api.wait_for(3, pod_call("DELETE", "worker-a")).await;
    settle().await;
    assert_eq!(api.calls().iter().filter(|c| pod_call("DELETE", "worker-a")(c)).count(), 3, "429, 503, then done");
    assert!(api.pod("capture", "worker-a").unwrap()["metadata"]["deletionTimestamp"].is_string(), "terminating");
    let carried_out = server.audit_lines().into_iter().filter(|l| l["decision"] == "deleted-when-idle").count();
    assert_eq!(carried_out, 1);
}

#[tokio::test]
async fn a_deferred_delete_refused_429_again_and_again_is_tried_five_times_and_no_more() {
    let (api, server) = a_persons_delete_deferred().await;

    // Say a workload budget keeps refusing it: each of busyguard's attempts is one call.
    api.fault("DELETE", &format!("{POD_PATH}/worker-a"), std::iter::repeat_with(|| Fault::Status(429)).take(10));
    api.update_pod("capture", "worker-a", |pod| pod["metadata"]["labels"]["busyguard.io/busy"] = json!("false"));
    let failed = r#"busyguard_side_effects_total{kind="delete-idle",result="failed"}"#;
    eventually(failed, async || server.metric(failed).await.filter(|n| *n > 0.0)).await;
    assert_eq!(api.calls().iter().filter(|c| pod_call("DELETE", "worker-a")(c)).count(), 5);
}

#[tokio::test]
async fn busy_delete_by_the_replicaset_controller_is_refused_but_not_deferred() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("worker-a", since_minutes_ago(10)));
    let server = TestServer::with_cluster(&api).await;
    let review = delete_of(&api.pod("capture", "worker-a").unwrap(), "pod-delete-by-replicaset-controller.json");
    assert_eq!(server.review("/validate", &review).await["status"]["code"], 429);
    api.wait_for(1, is_event).await;
    settle().await;
    assert_eq!(api.writes().len(), 1, "an Event, and no delete-requested mark: {:#?}", api.writes());
    assert_eq!(server.audit_lines()[0]["reason"], "busy");
}

#[tokio::test]
async fn a_forged_delete_review_of_an_idle_pod_is_answered_but_busyguard_neither_marks_nor_deletes_it() {
    let api = ApiServer::start().await;
    api.put_pod(worker_pod("idle", false));
    let server = TestServer::with_cluster(&api).await;
    // Any client that reaches the port can claim the pod is busy, with its real uid.
    let mut claimed = api.pod("capture", "idle").unwrap();
    claimed["metadata"]["labels"]["busyguard.io/busy"] = json!("true");
    claimed["metadata"]["annotations"]["busyguard.io/busy-since"] = json!(since_minutes_ago(5).to_string());
    let forged = delete_of(&claimed, "pod-delete-by-user.json");
    assert_eq!(server.review("/validate", &forged).await["status"]["code"], 429, "the forger gets its answer");
    settle().await;
    assert_eq!(api.writes(), vec![], "no mark, no Event, no delete: the view holds the pod idle");
}

#[tokio::test]
async fn a_delete_requested_mark_busyguard_did_not_write_is_ignored() {
    let api = ApiServer::start().await;
    // Written by a pod patcher (or copied from a template): no busyguard entry in managedFields.
    let mut pod = worker_pod("neighbour", false);
    pod["metadata"]["annotations"]["busyguard.io/delete-requested"] =
        json!(r#"{"by":"alice","at":"2026-11-21T20:30:00Z"}"#);
    pod["metadata"]["labels"]["busyguard.io/delete-requested"] = json!("true");
    api.put_pod(pod);
    let _server = sweeping(&api).await;
    api.update_pod("capture", "neighbour", |pod| pod["metadata"]["labels"]["team"] = json!("a"));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(api.writes().iter().all(|c| c.method != "DELETE"), "{:#?}", api.writes());
}

#[tokio::test]
async fn a_deferred_delete_answered_409_with_no_change_after_is_carried_out_by_the_sweep() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("worker-a", since_minutes_ago(10)));
    let server = sweeping(&api).await;
    let review = delete_of(&api.pod("capture", "worker-a").unwrap(), "pod-delete-by-user.json");
    assert_eq!(server.review("/validate", &review).await["status"]["code"], 429);
    api.wait_for(1, pod_call("PATCH", "worker-a")).await;
    api.fault("DELETE", &format!("{POD_PATH}/worker-a"), [Fault::Status(409)]);
    api.update_pod("capture", "worker-a", |pod| pod["metadata"]["labels"]["busyguard.io/busy"] = json!("false"));
    api.wait_for(2, pod_call("DELETE", "worker-a")).await;
    settle().await;
    assert!(api.pod("capture", "worker-a").unwrap()["metadata"]["deletionTimestamp"].is_string(), "terminating");
    let carried_out = server.audit_lines().into_iter().filter(|l| l["decision"] == "deleted-when-idle").count();
    assert_eq!(carried_out, 1, "exactly once");
}

#[tokio::test]
async fn a_marked_pod_whose_protection_runs_out_is_deleted_without_any_change() {
    let api = ApiServer::start().await;
    // Busy for 11 minutes less 2 seconds, with 11 minutes of max-busy.
    let since = Timestamp::from_second(Timestamp::now().as_second() - 11 * 60 + 2).unwrap();
    let mut pod = busy_pod("hung", since);
    pod["metadata"]["annotations"]["busyguard.io/max-busy"] = json!("11m");
    api.put_pod(pod);
    let server = sweeping(&api).await;
    let review = delete_of(&api.pod("capture", "hung").unwrap(), "pod-delete-by-user.json");
    assert_eq!(server.review("/validate", &review).await["status"]["code"], 429);
    api.wait_for(1, pod_call("PATCH", "hung")).await;
    // Nothing changes on the pod; two seconds later its max-busy is over and the sweep acts.
    let deletes = api.wait_for(1, pod_call("DELETE", "hung")).await;
    assert_eq!(deletes.len(), 1);
}

#[tokio::test]
async fn a_deferred_eviction_is_sent_on_the_pod_as_the_api_server_has_it_and_spends_no_budget_slot_on_a_stale_view() {
    let (api, server) = an_eviction_in_background_deferred().await;
    // The pod ends its task, and the kubelet writes its status at once; the watch brings the
    // first change only, so busyguard decides on a resourceVersion already gone.
    api.lag_watches();
    api.update_pod("capture", "worker-a", |pod| pod["metadata"]["labels"]["busyguard.io/busy"] = json!("false"));
    let now = api.update_pod("capture", "worker-a", |pod| pod["status"]["podIP"] = json!("10.0.0.7"));
    api.catch_up(1);

    let evictions = api.wait_for(1, pod_call("POST", "worker-a/eviction")).await;
    assert_eq!(
        evictions[0].body["deleteOptions"]["preconditions"],
        json!({"uid": "uid-worker-a", "resourceVersion": now["metadata"]["resourceVersion"]}),
        "evicted as the API server has it"
    );
    assert!(api.pod("capture", "worker-a").unwrap()["metadata"]["deletionTimestamp"].is_string(), "evicted");
    assert_eq!(api.slots_spent_on_refused_evictions(), 0, "no PodDisruptionBudget slot spent for nothing");
    // The audit line follows the API server's answer: it may come a moment after the call.
    eventually("the eviction audited as carried out", async || {
        let audit = server.audit_lines();
        audit.iter().any(|l| l["decision"] == "deleted-when-idle").then_some(())
    })
    .await;
    settle().await;
    let carried_out = server.audit_lines().into_iter().filter(|l| l["decision"] == "deleted-when-idle").count();
    assert_eq!(carried_out, 1, "carried out once");
}

#[tokio::test]
async fn a_deferred_eviction_of_a_pod_busy_again_by_the_time_it_is_sent_is_not_sent() {
    let (api, _server) = an_eviction_in_background_deferred().await;
    // Idle for a moment, then busy again before the watch brings either change.
    api.lag_watches();
    api.update_pod("capture", "worker-a", |pod| pod["metadata"]["labels"]["busyguard.io/busy"] = json!("false"));
    api.update_pod("capture", "worker-a", |pod| pod["metadata"]["labels"]["busyguard.io/busy"] = json!("true"));
    api.catch_up(1);

    // The eviction due on the view's word is weighed again on the pod as it is now.
    api.wait_for(1, pod_call("GET", "worker-a")).await;
    settle().await;
    assert!(api.calls().iter().all(|c| c.method != "POST" || !c.path.ends_with("/eviction")), "{:#?}", api.calls());
    assert_eq!(api.slots_spent_on_refused_evictions(), 0);
    assert!(api.pod("capture", "worker-a").unwrap()["metadata"]["deletionTimestamp"].is_null(), "still running");
}

/// Busy worker-a, an eviction in background (the descheduler's) of it refused and recorded.
async fn an_eviction_in_background_deferred() -> (ApiServer, TestServer) {
    let api = ApiServer::start().await;
    let mut pod = busy_pod("worker-a", since_minutes_ago(10));
    pod["metadata"]["annotations"]["descheduler.alpha.kubernetes.io/request-evict-only"] = json!("");
    api.put_pod(pod);
    let server = TestServer::with_cluster(&api).await;
    eventually("the view holds it", async || {
        let answer = server.review("/validate", &eviction_of("worker-a")).await;
        (answer["status"]["code"] == 429).then_some(())
    })
    .await;
    api.wait_for(1, pod_call("PATCH", "worker-a")).await;
    settle().await;
    (api, server)
}
