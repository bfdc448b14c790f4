//! busyguard with a cluster behind it: the real server over TLS, watching a stand-in API server
//! on loopback (real paths, real JSON), asserting the exact calls busyguard makes.

mod common;

use std::time::{Duration, Instant};

use common::apiserver::{ApiServer, Call, Fault, worker_pod};
use common::{TestServer, eventually, fixture};
use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

use busyguard::policy::cost::busy_cost;

const POD_PATH: &str = "/api/v1/namespaces/capture/pods";

fn since_minutes_ago(minutes: i64) -> Timestamp {
    Timestamp::from_second(Timestamp::now().as_second() - minutes * 60).unwrap()
}

/// A busy pod as busyguard's mutating webhook leaves it: busy-since, raised cost, the user's
/// cost kept, autoscalers told to wait.
fn busy_pod(name: &str, since: Timestamp) -> Value {
    let mut pod = worker_pod(name, true);
    pod["metadata"]["labels"]["busyguard.io/protected"] = json!("true");
    pod["metadata"]["annotations"] = json!({
        "busyguard.io/busy-since": since.to_string(),
        "controller.kubernetes.io/pod-deletion-cost": busy_cost(since).to_string(),
        "busyguard.io/idle-cost": "1",
        "karpenter.sh/do-not-disrupt": "true",
        "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
    });
    pod
}

/// Karpenter's do-not-disrupt as busyguard writes it: the seconds from the pod's start to the
/// end of its protection (a day of max-busy).
fn eviction_of(name: &str) -> Value {
    let mut review = fixture("pod-eviction-by-user.json");
    review["request"]["name"] = json!(name);
    review["request"]["object"]["metadata"]["name"] = json!(name);
    review
}

fn delete_of(pod: &Value, fixture_name: &str) -> Value {
    let mut review = fixture(fixture_name);
    review["request"]["name"] = pod["metadata"]["name"].clone();
    review["request"]["oldObject"] = pod.clone();
    review
}

fn is_event(call: &Call) -> bool {
    call.method == "POST" && call.path == "/apis/events.k8s.io/v1/namespaces/capture/events"
}

fn pod_call(method: &'static str, name: &'static str) -> impl Fn(&Call) -> bool {
    move |call: &Call| call.method == method && call.path == format!("{POD_PATH}/{name}")
}

/// Lets stray calls arrive before asserting that none came.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(300)).await;
}

fn denial(name: &str, since: Timestamp) -> String {
    let until = since.checked_add(SignedDuration::from_hours(24)).unwrap();
    format!(
        "pod capture/{name} is busy since {since} (protection lapses at {until} at the latest); it will be \
         spared until it is idle; to force: kubectl label pod {name} -n capture busyguard.io/busy=false --overwrite"
    )
}

#[tokio::test]
async fn eviction_of_a_busy_pod_is_429_with_a_warning_event_and_nothing_patched() {
    let api = ApiServer::start().await;
    let since = since_minutes_ago(10);
    api.put_pod(busy_pod("worker-a", since));
    let server = TestServer::with_cluster(&api).await;

    let response = server.review("/validate", &eviction_of("worker-a")).await;
    assert_eq!(
        response,
        json!({"uid": "2b3bba80-3643-4d69-88fc-9d4f057f65a5", "allowed": false, "status": {"status": "Failure",
               "code": 429, "reason": "TooManyRequests", "message": denial("worker-a", since),
               "details": {"causes": [{"reason": "BusyguardPodBusy"}]}}})
    );
    let events = api.wait_for(1, is_event).await;
    settle().await;
    assert_eq!(api.writes(), events, "one Event, no patch, no delete");
    let event = &events[0].body;
    assert_eq!((event["type"].as_str(), event["reason"].as_str()), (Some("Warning"), Some("DisruptionBlocked")));
    assert_eq!((event["action"].as_str(), event["note"].as_str()), (Some("Evict"), Some(&*denial("worker-a", since))));
    assert_eq!(
        event["regarding"],
        json!({"apiVersion": "v1", "kind": "Pod", "name": "worker-a", "namespace": "capture", "uid": "uid-worker-a"})
    );
    let audit = server.audit_lines();
    assert_eq!(audit.len(), 1);
    assert_eq!(
        (audit[0]["decision"].as_str(), audit[0]["subresource"].as_str(), audit[0]["name"].as_str()),
        (Some("denied"), Some("eviction"), Some("worker-a"))
    );
}

#[tokio::test]
async fn eviction_of_an_idle_pod_or_a_pod_busyguard_does_not_know_is_allowed_without_calls() {
    let api = ApiServer::start().await;
    api.put_pod(worker_pod("worker-idle", false));
    let server = TestServer::with_cluster(&api).await;
    for name in ["worker-idle", "no-such-pod"] {
        let response = server.review("/validate", &eviction_of(name)).await;
        assert_eq!(response, json!({"uid": "2b3bba80-3643-4d69-88fc-9d4f057f65a5", "allowed": true}), "{name}");
    }
    settle().await;
    assert_eq!(api.writes(), vec![]);
    assert!(server.audit_lines().is_empty());
}

#[tokio::test]
async fn dry_run_eviction_of_a_busy_pod_is_judged_and_audited_but_leaves_no_event() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("worker-6b8958b477-qvmc9", since_minutes_ago(5)));
    let server = TestServer::with_cluster(&api).await;
    let response = server.review("/validate", &fixture("pod-eviction-server-dry-run-by-user.json")).await;
    assert_eq!(response["status"]["code"], 429);
    assert_eq!(server.audit_lines()[0]["dry_run"], true, "dryRun from the eviction's deleteOptions");
    settle().await;
    assert_eq!(api.writes(), vec![]);
}

#[tokio::test]
async fn repeated_evictions_of_one_pod_raise_one_event_per_interval() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("worker-a", since_minutes_ago(10)));
    let server = TestServer::with_cluster(&api).await;
    for _ in 0..5 {
        assert_eq!(server.review("/validate", &eviction_of("worker-a")).await["allowed"], false);
    }
    api.wait_for(1, is_event).await;
    settle().await;
    assert_eq!(api.writes().len(), 1, "a retrying drain does not flood the API server");
    assert_eq!(server.metric(r#"busyguard_side_effects_total{kind="event",result="rate-limited"}"#).await, Some(4.0));
    assert_eq!(server.audit_lines().len(), 5, "every denial is audited");
}

#[tokio::test]
async fn busy_when_unready_pod_is_protected_while_not_ready() {
    let api = ApiServer::start().await;
    let mut pod = worker_pod("worker-compat", false);
    pod["metadata"]["labels"]["busyguard.io/busy"] = json!("when-unready");
    let unready_since = since_minutes_ago(3);
    pod["status"]["conditions"][1] =
        json!({"type": "Ready", "status": "False", "lastTransitionTime": unready_since.to_string()});
    api.put_pod(pod);
    let server = TestServer::with_cluster(&api).await;
    let response = server.review("/validate", &eviction_of("worker-compat")).await;
    let until = unready_since.checked_add(SignedDuration::from_hours(24)).unwrap();
    let message = format!(
        "pod capture/worker-compat is busy (not Ready) since {unready_since} (protection lapses at {until} at the \
         latest); it will be spared until it is idle; to force: kubectl label pod worker-compat -n capture \
         busyguard.io/busy=false --overwrite"
    );
    assert_eq!(response["status"]["message"], message);
    api.update_pod("capture", "worker-compat", |pod| pod["status"]["conditions"][1]["status"] = json!("True"));
    wait_until_eviction_allowed_is(&server, "worker-compat", true).await;
}

async fn wait_until_eviction_allowed_is(server: &TestServer, name: &str, allowed: bool) {
    let what = format!("eviction of {name} answered allowed={allowed}");
    eventually(&what, async || {
        (server.review("/validate", &eviction_of(name)).await["allowed"] == allowed).then_some(())
    })
    .await
}

/// Five workers: `busy` fresh and busy, `busy-stale` labelled busy while busyguard missed the
/// flip, two idle, and `idle-stale` idle with its busy annotations left behind. The watch's own
/// refresh of the two stale ones is refused (403, not retried), so they are still stale when a
/// test scales down: start the server with `serving_five_workers`.
fn five_workers(api: &ApiServer, since: Timestamp) {
    for stale in ["busy-stale", "idle-stale"] {
        api.fault("PATCH", &format!("{POD_PATH}/{stale}"), [Fault::Status(403)]);
    }
    api.put_pod(busy_pod("busy", since));
    let mut missed = worker_pod("busy-stale", true);
    missed["metadata"]["annotations"] = json!({"controller.kubernetes.io/pod-deletion-cost": "1"});
    api.put_pod(missed);
    api.put_pod(worker_pod("idle-1", false));
    api.put_pod(worker_pod("idle-2", false));
    let mut left_behind = busy_pod("idle-stale", since);
    left_behind["metadata"]["labels"]["busyguard.io/busy"] = json!("false");
    api.put_pod(left_behind);
}

/// A server watching `five_workers`, once the watch tried (and failed) to refresh the two stale
/// ones; the calls so far are forgotten.
async fn serving_five_workers(api: &ApiServer) -> TestServer {
    let server = TestServer::with_cluster(api).await;
    api.wait_for(2, |c| c.method == "PATCH").await;
    api.forget_calls();
    server
}

fn scale_down_5_to_2() -> Value {
    let mut review = fixture("deployment-scale-subresource-down-by-kubectl.json");
    review["request"]["oldObject"]["spec"]["replicas"] = json!(5);
    review
}

#[tokio::test]
async fn scale_down_5_to_2_with_2_busy_patches_only_stale_annotations_before_allowing() {
    let api = ApiServer::start().await;
    let since = since_minutes_ago(30);
    five_workers(&api, since);
    let server = serving_five_workers(&api).await;
    let before = Timestamp::now().as_second();

    let response = server.review("/validate", &scale_down_5_to_2()).await;
    assert_eq!(response, json!({"uid": "fe29bcc8-64c6-498a-8f6b-7eb66bc8e0c3", "allowed": true}));
    // The answer waited for the patches: they are already there.
    let writes = api.writes();
    assert_eq!(writes.len(), 2, "{writes:#?}");
    let busy_stale = writes.iter().find(|c| c.path == format!("{POD_PATH}/busy-stale")).expect("busy-stale patched");
    let stamped: Timestamp =
        busy_stale.body["metadata"]["annotations"]["busyguard.io/busy-since"].as_str().unwrap().parse().unwrap();
    assert!(stamped.as_second() >= before);
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
    eventually(failed, async || server.metric(failed).await).await;
    assert_eq!(api.calls().iter().filter(|c| pod_call("DELETE", "worker-a")(c)).count(), 5);
}

#[tokio::test]
async fn an_api_server_restart_is_ridden_out_and_status_follows_a_long_one_while_readyz_stays_up() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("worker-a", since_minutes_ago(10)));
    let server = TestServer::with_cluster(&api).await;

    // Down for less than the view may be stale (2s here): busyguard stays ready and judges on.
    let restart = tokio::spawn({
        let api = api.clone();
        async move { api.restart(Duration::from_millis(800)).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(server.admin_get("/status").await.status, 200);
    let started = Instant::now();
    assert_eq!(server.review("/validate", &eviction_of("worker-a")).await["allowed"], false);
    assert!(started.elapsed() < Duration::from_secs(1), "answered from the view, not waiting for the API server");
    restart.await.unwrap();
    // Back: the watch is open again and sees the pod turn idle.
    api.update_pod("capture", "worker-a", |pod| pod["metadata"]["labels"]["busyguard.io/busy"] = json!("false"));
    wait_until_eviction_allowed_is(&server, "worker-a", true).await;

    // Down for longer: the view is stale (evictions get 503) until it is back, then fresh by
    // itself; the replica stays ready all along, for the deletes it can still judge.
    let restart = tokio::spawn({
        let api = api.clone();
        async move { api.restart(Duration::from_secs(4)).await }
    });
    let stale = view_stale(&server).await;
    assert!(stale.starts_with("busyguard's watch of the opted-in pods has shown no sign of life for"), "{stale}");
    assert_eq!(server.admin_get("/readyz").await.status, 200);
    restart.await.unwrap();
    api.update_pod("capture", "worker-a", |pod| pod["metadata"]["labels"]["busyguard.io/busy"] = json!("true"));
    server.wait_ready().await;
    wait_until_eviction_allowed_is(&server, "worker-a", false).await;
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
async fn watch_restart_and_relist_keep_answers_correct() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("worker-a", since_minutes_ago(10)));
    let server = TestServer::with_cluster(&api).await;
    assert_eq!(server.review("/validate", &eviction_of("worker-a")).await["allowed"], false);

    // The watch drops; the pod turns idle meanwhile; the watch resumes where it was.
    api.drop_watches();
    api.update_pod("capture", "worker-a", |pod| pod["metadata"]["labels"]["busyguard.io/busy"] = json!("false"));
    wait_until_eviction_allowed_is(&server, "worker-a", true).await;

    // The API server forgot the history (restart, compaction): 410 Gone, and a new list.
    api.compact();
    api.drop_watches();
    api.update_pod("capture", "worker-a", |pod| pod["metadata"]["labels"]["busyguard.io/busy"] = json!("true"));
    wait_until_eviction_allowed_is(&server, "worker-a", false).await;
    let reads = api.calls().into_iter().filter(Call::reads_pod_list).collect::<Vec<_>>();
    assert_eq!(reads.iter().filter(|c| !c.is_watch()).count(), 2, "listed again after 410 Gone");
    assert!(reads.iter().all(|c| c.query.contains("labelSelector=busyguard.io%2Fbusy")), "opted-in pods only");
}

#[tokio::test]
async fn a_busy_pod_gone_while_the_watch_was_down_is_unaccounted_for_not_reported_lost() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("deleted-in-the-gap", since_minutes_ago(10)));
    let server = TestServer::with_cluster(&api).await;
    // The watch drops, the history is forgotten, and the pod is deleted before busyguard lists again.
    api.fail_lists(true);
    api.compact();
    api.drop_watches();
    api.remove_pod("capture", "deleted-in-the-gap");
    api.fail_lists(false);
    let events = api.wait_for(1, is_event).await;
    assert_eq!(events[0].body["reason"], "BusyPodUnaccounted");
    settle().await;
    let decisions: Vec<Value> = server.audit_lines().into_iter().map(|l| l["decision"].clone()).collect();
    assert_eq!(decisions, [json!("unaccounted")]);
    assert_eq!(server.metric("busyguard_busy_pods_unaccounted_total").await, Some(1.0));
    assert_eq!(server.metric(r#"busyguard_busy_pods_lost_total{cause="vanished"}"#).await, None, "no false page");
}

#[tokio::test]
async fn until_the_first_list_evictions_get_503_and_status_says_why() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("worker-a", since_minutes_ago(10)));
    api.fail_lists(true);
    let server = TestServer::with_cluster_unready(&api).await;
    api.wait_for(1, Call::reads_pod_list).await;

    let answer = server.post("/validate", serde_json::to_vec(&eviction_of("worker-a")).unwrap()).await;
    assert_eq!(answer.status, 503);
    assert_eq!(
        answer.json()["error"],
        "cannot judge the eviction: busyguard has not finished listing the opted-in pods yet"
    );
    let status = server.admin_get("/status").await;
    assert_eq!(
        (status.status, status.text()),
        (503, "busyguard has not finished listing the opted-in pods yet\n".into())
    );
    assert_eq!(server.metric("busyguard_view_unavailable").await, Some(1.0));
    assert_eq!(server.admin_get("/readyz").await.status, 200, "deletes are judged without the view");

    recovers_and_refuses_the_busy_eviction_again(&api, &server).await;
}

/// The first line of `/status` once it reports a problem.
async fn view_stale(server: &TestServer) -> String {
    eventually("/status 503", async || {
        let status = server.admin_get("/status").await;
        (status.status == 503).then(|| status.text())
    })
    .await
}

/// Lists succeed again: the view is fresh and judges the busy worker-a again.
async fn recovers_and_refuses_the_busy_eviction_again(api: &ApiServer, server: &TestServer) {
    api.fail_lists(false);
    server.wait_ready().await;
    assert_eq!(server.review("/validate", &eviction_of("worker-a")).await["allowed"], false);
}

#[tokio::test]
async fn a_watch_failing_longer_than_allowed_makes_the_view_stale_until_it_recovers() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("worker-a", since_minutes_ago(10)));
    let server = TestServer::with_cluster(&api).await;
    api.fail_lists(true);
    api.compact();
    api.drop_watches();
    let stale = view_stale(&server).await;
    assert!(stale.starts_with("busyguard's watch of the opted-in pods has shown no sign of life for"), "{stale}");
    let answer = server.post("/validate", serde_json::to_vec(&eviction_of("worker-a")).unwrap()).await;
    assert_eq!(answer.status, 503);
    recovers_and_refuses_the_busy_eviction_again(&api, &server).await;
}

#[tokio::test]
async fn busy_pods_lost_outside_admission_are_audited_and_counted() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("evicted-by-kubelet", since_minutes_ago(10)));
    api.put_pod(busy_pod("node-lost", since_minutes_ago(10)));
    api.put_pod(worker_pod("idle", false));
    let server = TestServer::with_cluster(&api).await;
    api.update_pod("capture", "evicted-by-kubelet", |pod| {
        pod["status"]["phase"] = json!("Failed");
        pod["status"]["reason"] = json!("Evicted");
    });
    api.remove_pod("capture", "node-lost");
    api.remove_pod("capture", "idle");
    eventually("two audit lines", async || (server.audit_lines().len() >= 2).then_some(())).await;
    settle().await;
    let mut lost: Vec<(Value, Value, Value)> = server
        .audit_lines()
        .into_iter()
        .map(|l| (l["decision"].clone(), l["reason"].clone(), l["name"].clone()))
        .collect();
    lost.sort_by_key(|(_, _, name)| name.to_string());
    assert_eq!(
        lost,
        vec![
            (json!("lost"), json!("failed"), json!("evicted-by-kubelet")),
            (json!("lost"), json!("vanished"), json!("node-lost"))
        ]
    );
    let failed = server.audit_lines().into_iter().find(|l| l["reason"] == "failed").unwrap();
    assert!(failed["detail"].as_str().unwrap().contains("(Evicted)"));
    // Reported as a Warning Event too, named for the pod so that one replica reports it.
    let events: Vec<Value> = api.writes().into_iter().filter(is_event).map(|c| c.body).collect();
    assert_eq!(events.len(), 2, "{events:#?}");
    assert!(events.iter().all(|e| e["reason"] == "BusyPodLost"));
    assert!(events.iter().any(|e| e["metadata"]["name"] == "busyguard-lost-uid-node-lost"));
    assert_eq!(server.metric(r#"busyguard_busy_pods_lost_total{cause="failed"}"#).await, Some(1.0));
    assert_eq!(server.metric(r#"busyguard_busy_pods_lost_total{cause="vanished"}"#).await, Some(1.0));
}

#[tokio::test]
async fn a_pod_that_does_not_decode_is_skipped_and_the_others_are_served() {
    let api = ApiServer::start().await;
    let mut broken = worker_pod("broken", true);
    broken["status"]["containerStatuses"] = json!("not a list");
    api.put_pod(broken);
    api.put_pod(busy_pod("worker-a", since_minutes_ago(10)));
    let server = TestServer::with_cluster(&api).await;
    assert_eq!(server.review("/validate", &eviction_of("worker-a")).await["allowed"], false);
    assert_eq!(server.review("/validate", &eviction_of("broken")).await["allowed"], true);
    assert_eq!(server.metric("busyguard_view_pods").await, Some(1.0));
}

#[tokio::test]
async fn a_side_effect_the_api_server_refuses_is_counted_as_failed_and_the_answer_stands() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("worker-a", since_minutes_ago(10)));
    let server = TestServer::with_cluster(&api).await;
    api.fault("PATCH", &format!("{POD_PATH}/worker-a"), [Fault::Status(403)]);
    let review = delete_of(&api.pod("capture", "worker-a").unwrap(), "pod-delete-by-user.json");
    assert_eq!(server.review("/validate", &review).await["status"]["code"], 429);
    let failed = r#"busyguard_side_effects_total{kind="mark-delete",result="failed"}"#;
    eventually(failed, async || server.metric(failed).await).await;
    assert_eq!(server.metric(failed).await, Some(1.0));
    assert_eq!(api.wait_for(1, pod_call("PATCH", "worker-a")).await.len(), 1, "403 is not retried");
}

/// Every call busyguard can make, in one run: list and watch, refreshes, the mark and the
/// delete of a deferred delete, an Event and its series, and the read of a pod that left the
/// watch.
#[tokio::test]
async fn rbac_of_the_manifests_grants_exactly_the_calls_busyguard_makes() {
    let api = ApiServer::start().await;
    five_workers(&api, since_minutes_ago(30));
    api.put_pod(busy_pod("worker-a", since_minutes_ago(10)));
    unready_worker(&api);
    put_workload(&api, 1, 2, "RollingUpdate");
    let server = TestServer::start_with(|config| {
        config.cluster.source = busyguard::cluster::ClusterSource::Config(Box::new(api.kube_config()));
        config.cluster.outbox.event_interval = Duration::from_millis(1);
        config.cluster.sweep_interval = Duration::from_millis(200);
        config.cluster.busy_pdb = true;
    })
    .await;
    server.wait_ready().await;
    api.wait_for(1, |c| c.method == "POST" && c.path.contains("/poddisruptionbudgets")).await;

    server.review("/validate", &scale_down_5_to_2()).await;
    // A release from a ReplicaSet, confirmed with the ReplicaSet and its Deployment.
    let compat = delete_of(&api.pod("capture", "worker-compat").unwrap(), "pod-delete-by-replicaset-controller.json");
    server.review("/validate", &compat).await;
    api.wait_for(1, |c| c.method == "GET" && c.path.contains("/deployments/")).await;
    server.review("/validate", &eviction_of("worker-a")).await;
    api.wait_for(1, is_event).await;
    server.review("/validate", &delete_of(&api.pod("capture", "worker-a").unwrap(), "pod-delete-by-user.json")).await;
    api.wait_for(1, pod_call("PATCH", "worker-a")).await;
    api.update_pod("capture", "worker-a", |pod| pod["metadata"]["labels"]["busyguard.io/busy"] = json!("false"));
    api.wait_for(1, pod_call("DELETE", "worker-a")).await;
    // A busy pod leaving the watch: gone, or only its label removed?
    api.update_pod("capture", "busy", |pod| {
        pod["metadata"]["labels"].as_object_mut().unwrap().remove("busyguard.io/busy");
    });
    api.wait_for(1, pod_call("GET", "busy")).await;
    // Every opted-in pod gone: busyguard's PDB goes too.
    for name in ["busy-stale", "idle-1", "idle-2", "idle-stale", "worker-a", "worker-compat"] {
        api.remove_pod("capture", name);
    }
    api.wait_for(1, |c| c.method == "DELETE" && c.path.contains("/poddisruptionbudgets")).await;

    assert_eq!(api.forbidden_calls(), Vec::<String>::new(), "every call is granted");
    let granted = common::apiserver::GRANTED.clone();
    assert_eq!(api.permissions_used(), granted, "and every grant is used");
}

/// A server watching `api` whose sweep comes every 200 ms.
async fn sweeping(api: &ApiServer) -> TestServer {
    let server = TestServer::start_with(|config| {
        config.cluster.source = busyguard::cluster::ClusterSource::Config(Box::new(api.kube_config()));
        config.cluster.sweep_interval = Duration::from_millis(200);
    })
    .await;
    server.wait_ready().await;
    server
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
async fn a_flip_to_idle_made_while_busyguard_was_down_is_restored_from_the_watch() {
    let api = ApiServer::start().await;
    // Idle, with busyguard's busy annotations still on: Karpenter and cluster-autoscaler would
    // leave its node alone for ever.
    let mut missed = busy_pod("missed", since_minutes_ago(30));
    missed["metadata"]["labels"]["busyguard.io/busy"] = json!("false");
    api.put_pod(missed);
    let _server = TestServer::with_cluster(&api).await;
    let patches = api.wait_for(1, pod_call("PATCH", "missed")).await;
    assert_eq!(
        patches[0].body["metadata"]["annotations"],
        json!({"busyguard.io/busy-since": null, "controller.kubernetes.io/pod-deletion-cost": "1",
               "busyguard.io/idle-cost": null, "karpenter.sh/do-not-disrupt": null,
               "cluster-autoscaler.kubernetes.io/safe-to-evict": null})
    );
    assert_eq!(
        api.pod("capture", "missed").unwrap()["metadata"]["annotations"]["controller.kubernetes.io/pod-deletion-cost"],
        "1"
    );
}

#[tokio::test]
async fn a_review_beyond_max_in_flight_is_shed_at_once_and_the_next_one_answered() {
    let api = ApiServer::start().await;
    five_workers(&api, since_minutes_ago(30));
    let server = TestServer::start_with(|config| {
        config.cluster.source = busyguard::cluster::ClusterSource::Config(Box::new(api.kube_config()));
        config.limits.max_in_flight = 1;
    })
    .await;
    server.wait_ready().await;
    api.wait_for(2, |c| c.method == "PATCH").await;
    // A scale-down holds its slot while it waits for a slow API server to take its patches.
    api.fault("PATCH", &format!("{POD_PATH}/idle-stale"), [Fault::Delay(Duration::from_secs(2))]);
    let holding = tokio::spawn({
        let body = serde_json::to_vec(&scale_down_5_to_2()).unwrap();
        let server_post = server.connect().await;
        async move {
            let mut sender = common::http1(server_post).await;
            common::send(&mut sender, common::post_request("/validate?timeout=4s", body)).await
        }
    });
    api.wait_for(1, pod_call("PATCH", "idle-stale")).await;

    let review = serde_json::to_vec(&eviction_of("busy")).unwrap();
    let started = Instant::now();
    let shed = server.post("/validate", review.clone()).await;
    assert!(started.elapsed() < Duration::from_secs(1), "shed at once, took {:?}", started.elapsed());
    assert_eq!(shed.status, 503, "{}", shed.text());
    assert_eq!(shed.headers["retry-after"], "1");
    assert!(shed.text().contains("reviews already: shed, retry"), "{}", shed.text());
    assert_eq!(server.metric("busyguard_admission_reviews_shed_total").await, Some(1.0));

    assert_eq!(holding.await.unwrap().status, 200);
    assert_eq!(server.post("/validate", review).await.status, 200, "answered again once the slot is free");
}

#[tokio::test]
async fn a_watch_that_goes_silent_without_any_error_makes_the_view_stale_instead_of_wrong() {
    let api = ApiServer::start().await;
    api.put_pod(worker_pod("worker-a", false));
    let server = TestServer::with_cluster(&api).await;
    assert_eq!(server.review("/validate", &eviction_of("worker-a")).await["allowed"], true, "idle");
    // The connection dies silently; the worker turns busy meanwhile, and busyguard cannot know.
    api.go_silent();
    api.update_pod("capture", "worker-a", |pod| pod["metadata"]["labels"]["busyguard.io/busy"] = json!("true"));
    let stale = view_stale(&server).await;
    assert!(stale.starts_with("busyguard's watch of the opted-in pods has shown no sign of life for"), "{stale}");
    let answer = server.post("/validate", serde_json::to_vec(&eviction_of("worker-a")).unwrap()).await;
    assert_eq!(answer.status, 503, "not judged on a view that may have missed the flip: {}", answer.text());
}

#[tokio::test]
async fn two_replicas_report_a_lost_busy_pod_once() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("node-lost", since_minutes_ago(10)));
    let (one, two) = (TestServer::with_cluster(&api).await, TestServer::with_cluster(&api).await);
    api.remove_pod("capture", "node-lost");
    api.wait_for(2, is_event).await;
    settle().await;
    let lines = |server: &TestServer| server.audit_lines().into_iter().filter(|l| l["decision"] == "lost").count();
    assert_eq!(lines(&one) + lines(&two), 1, "one audit line in all");
    let counted = |value: Option<f64>| value.unwrap_or(0.0);
    let series = r#"busyguard_busy_pods_lost_total{cause="vanished"}"#;
    assert_eq!(counted(one.metric(series).await) + counted(two.metric(series).await), 1.0, "counted once");
}

#[tokio::test]
async fn two_replicas_refusing_the_same_eviction_raise_one_event() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("worker-a", since_minutes_ago(10)));
    let (one, two) = (TestServer::with_cluster(&api).await, TestServer::with_cluster(&api).await);
    for server in [&one, &two] {
        assert_eq!(server.review("/validate", &eviction_of("worker-a")).await["status"]["code"], 429);
    }
    api.wait_for(2, is_event).await;
    settle().await;
    let names: Vec<Value> =
        api.calls().into_iter().filter(is_event).map(|c| c.body["metadata"]["name"].clone()).collect();
    assert_eq!(names[0], names[1], "both replicas name the interval's Event alike: {names:?}");
    let refused = r#"busyguard_side_effects_total{kind="event",result="moot"}"#;
    let moot = one.metric(refused).await.unwrap_or(0.0) + two.metric(refused).await.unwrap_or(0.0);
    assert_eq!(moot, 1.0, "the second create is refused as already done");
}

#[tokio::test]
async fn removing_the_busy_label_of_a_busy_pod_is_no_loss_restores_it_and_carries_out_its_deferred_delete() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("opting-out", since_minutes_ago(10)));
    let server = TestServer::with_cluster(&api).await;
    let review = delete_of(&api.pod("capture", "opting-out").unwrap(), "pod-delete-by-user.json");
    assert_eq!(server.review("/validate", &review).await["status"]["code"], 429);
    api.wait_for(1, pod_call("PATCH", "opting-out")).await;
    // The owner takes the pod out of busyguard's hands while it is busy (the mutating webhook
    // would restore its annotations; none runs here, so busyguard must).
    api.update_pod("capture", "opting-out", |pod| {
        pod["metadata"]["labels"].as_object_mut().unwrap().remove("busyguard.io/busy");
    });
    api.wait_for(1, pod_call("GET", "opting-out")).await;
    api.wait_for(1, pod_call("DELETE", "opting-out")).await;
    settle().await;
    let decisions: Vec<Value> = server.audit_lines().into_iter().map(|l| l["decision"].clone()).collect();
    assert_eq!(decisions, [json!("denied"), json!("deleted-when-idle")], "no false loss");
    assert_eq!(server.metric(r#"busyguard_busy_pods_lost_total{cause="vanished"}"#).await, None);
}

#[tokio::test]
async fn a_pod_whose_busy_label_was_removed_is_restored_even_when_it_changes_in_between() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("opting-out", since_minutes_ago(10)));
    let _server = TestServer::with_cluster(&api).await;
    // Someone else writes the pod between busyguard's read and its write: 409.
    api.fault("PATCH", &format!("{POD_PATH}/opting-out"), [Fault::Status(409)]);
    api.update_pod("capture", "opting-out", |pod| {
        pod["metadata"]["labels"].as_object_mut().unwrap().remove("busyguard.io/busy");
    });
    // Out of the watch now, so no event brings it back: busyguard reads it again itself.
    api.wait_for(2, pod_call("PATCH", "opting-out")).await;
    let restored = api.pod("capture", "opting-out").unwrap();
    assert!(restored["metadata"]["annotations"].get("busyguard.io/busy-since").is_none(), "{restored}");
}

#[tokio::test]
async fn a_busy_pod_evicted_while_busyguard_was_not_guarding_is_reported_lost() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("drained", since_minutes_ago(10)));
    let server = TestServer::with_cluster(&api).await;
    // The eviction went through without busyguard (down, or the view stale): the API server set
    // the pod's DisruptionTarget condition and started its deletion.
    api.update_pod("capture", "drained", |pod| {
        pod["metadata"]["deletionTimestamp"] = json!(Timestamp::now().to_string());
        pod["status"]["conditions"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}));
    });
    api.wait_for(1, is_event).await;
    eventually("a lost line", async || server.audit_lines().into_iter().find(|l| l["decision"] == "lost")).await;
    let line = server.audit_lines().into_iter().find(|l| l["decision"] == "lost").unwrap();
    assert_eq!(line["reason"], "disrupted");
    assert!(line["detail"].as_str().unwrap().contains("(EvictionByEvictionAPI)"), "{}", line["detail"]);
}

#[tokio::test]
async fn a_pod_that_stops_decoding_is_no_longer_judged_on_its_last_readable_version() {
    let api = ApiServer::start().await;
    api.put_pod(worker_pod("worker-a", false));
    let server = TestServer::with_cluster(&api).await;
    api.update_pod("capture", "worker-a", |pod| {
        pod["metadata"]["labels"]["busyguard.io/busy"] = json!("true");
        pod["status"]["containerStatuses"] = json!("not a list");
    });
    // The idle version it had is gone from the view: the pod is not judged, as at list time.
    eventually("the record dropped", async || (server.metric("busyguard_view_pods").await == Some(0.0)).then_some(()))
        .await;
}

#[tokio::test]
async fn busyguard_status_reads_the_cluster_and_says_who_is_busy_where() {
    let api = ApiServer::start().await;
    let since = since_minutes_ago(30);
    let mut busy = busy_pod("worker-a", since);
    busy["spec"]["nodeName"] = json!("node-1");
    api.put_pod(busy);
    api.put_pod(worker_pod("worker-b", false));
    let source = busyguard::cluster::ClusterSource::Config(Box::new(api.kube_config()));
    let max_busy = busyguard::policy::busy::MaxBusy::new(SignedDuration::from_hours(24));
    let report = busyguard::status::run(&source, &[], max_busy).await.unwrap();
    assert!(report.starts_with("2 opted-in pods in 1 workloads, 1 busy"), "{report}");
    assert!(report.contains("capture/Deployment/worker                            1     1       0"), "{report}");
    let until = since.checked_add(SignedDuration::from_hours(24)).unwrap();
    assert!(
        report.contains(&format!("capture/worker-a on node-1: busy since {since} (30m ago), protected until {until}")),
        "{report}"
    );
    assert!(report.contains(&format!("node-1: capture/worker-a until {until}")), "{report}");
    let lists: Vec<Call> = api.calls().into_iter().filter(Call::reads_pod_list).collect();
    assert_eq!(lists.len(), 1, "one list of the opted-in pods, nothing written");
    assert!(lists[0].query.contains("labelSelector=busyguard.io%2Fbusy"));
    assert_eq!(api.writes(), vec![]);
}

#[tokio::test]
async fn per_workload_gauges_count_busy_idle_and_lapsed_pods_and_waiting_deletes() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("busy", since_minutes_ago(10)));
    api.put_pod(busy_pod("hung", since_minutes_ago(25 * 60)));
    api.put_pod(worker_pod("idle-1", false));
    api.put_pod(worker_pod("idle-2", false));
    let server = TestServer::with_cluster(&api).await;
    let series = |state: &str| {
        format!(r#"busyguard_workload_pods{{namespace="capture",workload="Deployment/worker",state="{state}"}}"#)
    };
    assert_eq!(server.metric(&series("busy")).await, Some(1.0));
    assert_eq!(server.metric(&series("idle")).await, Some(2.0));
    assert_eq!(server.metric(&series("lapsed")).await, Some(1.0), "busy for longer than max-busy");
    let review = delete_of(&api.pod("capture", "busy").unwrap(), "pod-delete-by-user.json");
    server.review("/validate", &review).await;
    let waiting = r#"busyguard_workload_deferred_deletes{namespace="capture",workload="Deployment/worker"}"#;
    eventually("the mark counted", async || (server.metric(waiting).await == Some(1.0)).then_some(())).await;
}

/// A Node DELETE by the fixture's user, as the API server sends it for `kubectl delete node`.
fn node_delete(node: &str) -> Value {
    let mut review = fixture("pod-delete-by-user.json");
    let request = &mut review["request"];
    request["kind"] = json!({"group": "", "version": "v1", "kind": "Node"});
    request["resource"] = json!({"group": "", "version": "v1", "resource": "nodes"});
    request["requestKind"] = request["kind"].clone();
    request["requestResource"] = request["resource"].clone();
    request["name"] = json!(node);
    request.as_object_mut().unwrap().remove("namespace");
    request["oldObject"] = json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": node}});
    review
}

#[tokio::test]
async fn a_node_running_busy_pods_is_not_deleted_and_one_without_is() {
    let api = ApiServer::start().await;
    let mut busy = busy_pod("worker-a", since_minutes_ago(10));
    busy["spec"]["nodeName"] = json!("node-1");
    api.put_pod(busy);
    let mut idle = worker_pod("worker-b", false);
    idle["spec"]["nodeName"] = json!("node-2");
    api.put_pod(idle);
    let server = TestServer::with_cluster(&api).await;

    let refused = server.review("/validate", &node_delete("node-1")).await;
    assert_eq!(refused["allowed"], false);
    assert_eq!(refused["status"]["code"], 429);
    let message = refused["status"]["message"].as_str().unwrap();
    assert!(message.starts_with("node node-1 runs 1 busy pod(s): capture/worker-a (protected until"), "{message}");
    assert_eq!(server.review("/validate", &node_delete("node-2")).await["allowed"], true, "only idle pods there");
    let audit = server.audit_lines();
    assert_eq!((audit[0]["decision"].as_str(), audit[0]["resource"].as_str()), (Some("denied"), Some("nodes")));
    // Once the pod is idle, the node goes.
    api.update_pod("capture", "worker-a", |pod| pod["metadata"]["labels"]["busyguard.io/busy"] = json!("false"));
    eventually("node-1 deletable", async || {
        (server.review("/validate", &node_delete("node-1")).await["allowed"] == true).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_workload_budget_lets_its_pods_go_one_at_a_time() {
    let api = ApiServer::start().await;
    for name in ["ds-a", "ds-b", "ds-c"] {
        let mut pod = worker_pod(name, false);
        pod["metadata"]["labels"]["busyguard.io/max-unavailable"] = json!("1");
        api.put_pod(pod);
    }
    let server = TestServer::with_cluster(&api).await;
    let delete = |name: &str| delete_of(&api.pod("capture", name).unwrap(), "pod-delete-by-user.json");
    assert_eq!(server.review("/validate", &delete("ds-a")).await["allowed"], true, "none unavailable yet");
    // ds-a is on its way out: the budget of one is used up until it is back (or replaced).
    api.update_pod("capture", "ds-a", |pod| pod["metadata"]["deletionTimestamp"] = json!(Timestamp::now().to_string()));
    let refused = eventually("the budget used up", async || {
        let answer = server.review("/validate", &eviction_of("ds-b")).await;
        (answer["allowed"] == false).then_some(answer)
    })
    .await;
    assert_eq!(refused["status"]["details"]["causes"][0]["reason"], "BusyguardDisruptionBudget");
    assert_eq!(server.review("/validate", &delete("ds-c")).await["status"]["code"], 429);
    api.remove_pod("capture", "ds-a");
    wait_until_eviction_allowed_is(&server, "ds-b", true).await;
}

#[tokio::test]
async fn a_workload_budget_lets_one_of_several_evictions_at_once_go() {
    let api = ApiServer::start().await;
    let names = ["ds-a", "ds-b", "ds-c", "ds-d"];
    for name in names {
        let mut pod = worker_pod(name, false);
        pod["metadata"]["labels"]["busyguard.io/max-unavailable"] = json!("1");
        api.put_pod(pod);
    }
    let server = TestServer::with_cluster(&api).await;
    // A drain evicts a node's pods together: nothing is unavailable yet when they arrive.
    let reviews = names.map(eviction_of);
    let answers = futures::future::join_all(reviews.iter().map(|review| server.review("/validate", review))).await;
    let allowed = answers.iter().filter(|a| a["allowed"] == true).count();
    assert_eq!(allowed, 1, "{answers:#?}");
}

#[tokio::test]
async fn a_workload_budget_counts_a_deployment_across_its_replicasets() {
    let api = ApiServer::start().await;
    for (name, hash) in [("worker-old", "6b8958b477"), ("worker-new", "7c9a6d5f88")] {
        let mut pod = worker_pod(name, false);
        pod["metadata"]["labels"]["busyguard.io/max-unavailable"] = json!("1");
        pod["metadata"]["labels"]["pod-template-hash"] = json!(hash);
        pod["metadata"]["ownerReferences"][0]["name"] = json!(format!("worker-{hash}"));
        api.put_pod(pod);
    }
    // A rollout under way: the new ReplicaSet's pod is not Ready yet.
    api.update_pod("capture", "worker-new", |pod| pod["status"]["conditions"][1]["status"] = json!("False"));
    let server = TestServer::with_cluster(&api).await;
    wait_until_eviction_allowed_is(&server, "worker-old", false).await;
}

/// A server keeping the busy-pod PDBs, sweeping every 200 ms.
async fn keeping_busy_pdbs(api: &ApiServer) -> TestServer {
    let server = TestServer::start_with(|config| {
        config.cluster.source = busyguard::cluster::ClusterSource::Config(Box::new(api.kube_config()));
        config.cluster.sweep_interval = Duration::from_millis(200);
        config.cluster.busy_pdb = true;
    })
    .await;
    server.wait_ready().await;
    server
}

fn pdb_call(method: &'static str) -> impl Fn(&Call) -> bool {
    move |call: &Call| call.method == method && call.path.contains("/poddisruptionbudgets")
}

#[tokio::test]
async fn a_slow_busy_pod_pdb_round_is_not_overlapped_by_the_next_sweeps() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("worker-a", since_minutes_ago(10)));
    let list = |c: &Call| c.method == "GET" && c.path == "/apis/policy/v1/poddisruptionbudgets";
    // The first round's list takes 1.5 s; sweeps come every 200 ms meanwhile.
    api.fault("GET", "/apis/policy/v1/poddisruptionbudgets", [Fault::Delay(Duration::from_millis(1500))]);
    let _server = keeping_busy_pdbs(&api).await;
    api.wait_for(1, list).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(api.calls().into_iter().filter(list).count(), 1, "one round at a time");
}

#[tokio::test]
async fn a_namespace_with_opted_in_pods_gets_one_busy_pod_pdb_that_allows_no_eviction() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("worker-a", since_minutes_ago(10)));
    let _server = keeping_busy_pdbs(&api).await;
    let created = api.wait_for(1, pdb_call("POST")).await;
    assert_eq!(created[0].path, "/apis/policy/v1/namespaces/capture/poddisruptionbudgets");
    assert_eq!(
        created[0].body,
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
               "metadata": {"name": "busyguard-busy", "namespace": "capture",
                            "labels": {"app.kubernetes.io/managed-by": "busyguard"}},
               "spec": {"minAvailable": 1_000_000, "selector": {"matchLabels": {"busyguard.io/protected": "true"},
                   "matchExpressions": [{"key": "busyguard.io/busy", "operator": "Exists"}]},
                   "unhealthyPodEvictionPolicy": "IfHealthyBudget"}})
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(api.calls().into_iter().filter(pdb_call("POST")).count(), 1, "created once, kept");
    // The last opted-in pod gone: the PDB goes too.
    api.remove_pod("capture", "worker-a");
    api.wait_for(1, pdb_call("DELETE")).await;
    assert_eq!(api.pdbs(), Vec::<Value>::new());
}

#[tokio::test]
async fn where_a_users_own_pdb_selects_opted_in_pods_busyguard_keeps_none_and_says_so() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("worker-a", since_minutes_ago(10)));
    api.put_pdb(json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "worker", "namespace": "capture"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "worker"}}}}));
    let server = keeping_busy_pdbs(&api).await;
    let conflicts = "busyguard_busy_pdb_conflicts";
    eventually("the conflict counted", async || (server.metric(conflicts).await == Some(1.0)).then_some(())).await;
    assert_eq!(api.calls().into_iter().filter(pdb_call("POST")).count(), 0, "a pod in two PDBs could not be evicted");
    // The eviction webhook still guards the busy pod there.
    assert_eq!(server.review("/validate", &eviction_of("worker-a")).await["status"]["code"], 429);
}

/// The pod's ReplicaSet (wanting `wanted` of the `has` pods it has) and its Deployment.
fn put_workload(api: &ApiServer, wanted: i32, has: i32, strategy: &str) {
    api.put_app(
        "replicasets",
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "worker-6b8958b477", "namespace": "capture",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "worker", "uid": "d",
                "controller": true}]},
        "spec": {"replicas": wanted, "selector": {"matchLabels": {"app": "worker"}}},
        "status": {"replicas": has}}),
    );
    api.put_app(
        "deployments",
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "worker", "namespace": "capture"},
        "spec": {"replicas": wanted, "selector": {"matchLabels": {"app": "worker"}}, "strategy": {"type": strategy},
            "template": {"metadata": {"labels": {"app": "worker"}}, "spec": {"containers": []}}}}),
    );
}

/// A pod of an app busy by readiness: readiness fails while it works.
fn unready_worker(api: &ApiServer) {
    let mut pod = worker_pod("worker-compat", false);
    pod["metadata"]["labels"]["busyguard.io/busy"] = json!("when-unready");
    pod["status"]["conditions"][1] =
        json!({"type": "Ready", "status": "False", "lastTransitionTime": since_minutes_ago(3).to_string()});
    api.put_pod(pod);
}

#[tokio::test]
async fn a_busy_pod_is_released_only_when_its_replicaset_scales_down_and_never_under_recreate() {
    let api = ApiServer::start().await;
    unready_worker(&api);
    let server = TestServer::with_cluster(&api).await;
    let review = delete_of(&api.pod("capture", "worker-compat").unwrap(), "pod-delete-by-replicaset-controller.json");
    let released =
        |api: &ApiServer| api.writes().iter().any(|c| c.body["metadata"]["labels"].get("pod-template-hash").is_some());
    // A forged review in the ReplicaSet controller's name: nothing scales down.
    put_workload(&api, 2, 2, "RollingUpdate");
    assert_eq!(server.review("/validate", &review).await["status"]["code"], 429);
    settle().await;
    assert!(!released(&api), "released on a forged review: {:#?}", api.writes());
    // A Recreate rollout scaling the old ReplicaSet to 0: the new pods wait for this one.
    put_workload(&api, 0, 1, "Recreate");
    assert_eq!(server.review("/validate", &review).await["status"]["code"], 429);
    settle().await;
    assert!(!released(&api), "released under Recreate: {:#?}", api.writes());
}

#[tokio::test]
async fn a_scale_down_of_an_app_busy_by_readiness_converges_the_busy_pod_released_and_deleted_once_ready() {
    let api = ApiServer::start().await;
    unready_worker(&api);
    put_workload(&api, 1, 2, "RollingUpdate");
    let server = TestServer::with_cluster(&api).await;
    let review = delete_of(&api.pod("capture", "worker-compat").unwrap(), "pod-delete-by-replicaset-controller.json");
    let refused = server.review("/validate", &review).await;
    assert_eq!(refused["status"]["code"], 429);
    assert!(refused["status"]["message"].as_str().unwrap().contains("so the scale-down completes without it"));
    // Answered once the release landed: the pod no longer matches its ReplicaSet's selector.
    let released = |c: &Call| {
        pod_call("PATCH", "worker-compat")(c) && c.body["metadata"]["labels"].get("pod-template-hash").is_some()
    };
    let patch = api.writes().into_iter().find(released).expect("released");
    assert_eq!(
        patch.body["metadata"]["labels"],
        json!({"pod-template-hash": null, "busyguard.io/delete-requested": "true"}),
        "released, and marked to go once Ready"
    );
    assert_eq!(patch.body["metadata"]["annotations"]["busyguard.io/released-from"], "6b8958b477");
    let stored = api.pod("capture", "worker-compat").unwrap();
    assert!(stored["metadata"]["labels"].get("pod-template-hash").is_none());
    // Ready again (the task is done): deleted, once.
    api.update_pod("capture", "worker-compat", |pod| pod["status"]["conditions"][1]["status"] = json!("True"));
    api.wait_for(1, pod_call("DELETE", "worker-compat")).await;
    settle().await;
    let decisions: Vec<Value> = server.audit_lines().into_iter().map(|l| l["reason"].clone()).collect();
    assert_eq!(decisions, [json!("busy-released"), json!("delete-requested")]);
}

#[tokio::test]
async fn busyguard_agent_turns_the_apps_endpoint_into_the_busy_label_and_holds_it_when_the_app_is_silent() {
    use std::sync::atomic::{AtomicU16, Ordering};
    let api = ApiServer::start().await;
    api.put_pod(worker_pod("worker-a", false));
    // The app: 503 from its readiness endpoint while it works, 200 otherwise; 0 = not answering.
    let status = std::sync::Arc::new(AtomicU16::new(200));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let app_addr = listener.local_addr().unwrap();
    let answering = status.clone();
    let app = axum::Router::new().route(
        "/ready",
        axum::routing::get(move || {
            let status = answering.load(Ordering::SeqCst);
            async move {
                if status == 0 {
                    std::future::pending::<()>().await;
                }
                axum::http::StatusCode::from_u16(status).unwrap()
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let agent = busyguard::agent::Agent {
        url: format!("http://{app_addr}/ready").parse().unwrap(),
        busy_when: busyguard::agent::BusyWhen::Status(503),
        interval: Duration::from_millis(100),
        namespace: "capture".into(),
        pod: "worker-a".into(),
    };
    let client = kube::Client::try_from(api.kube_config()).unwrap();
    let running = tokio::spawn(agent.run(client));
    let label =
        |api: &ApiServer| api.pod("capture", "worker-a").unwrap()["metadata"]["labels"]["busyguard.io/busy"].clone();
    api.wait_for(1, pod_call("PATCH", "worker-a")).await;
    status.store(503, Ordering::SeqCst);
    eventually("flagged busy", async || (label(&api) == "true").then_some(())).await;
    // The app stops answering mid-task: the flag stays busy.
    status.store(0, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(label(&api), "true");
    status.store(200, Ordering::SeqCst);
    eventually("flagged idle", async || (label(&api) == "false").then_some(())).await;
    let flips: Vec<Value> = api
        .writes()
        .into_iter()
        .filter(pod_call("PATCH", "worker-a"))
        .map(|c| c.body["metadata"]["labels"]["busyguard.io/busy"].clone())
        .collect();
    assert_eq!(flips, [json!("false"), json!("true"), json!("false")], "a PATCH only when it changes");
    running.abort();
}
