//! Evictions judged on the view: refused busy pods, their Events, dry runs, readiness mode, shedding.

use super::*;

/// The refusal of an eviction of busy pod `name`: it takes no new task meanwhile.
fn eviction_refused(name: &str, since: Timestamp) -> String {
    denial(name, since)
        + "; busyguard holds it from new tasks (busyguard.io/disruption-requested), so it is idle at a retry after \
           its task ends"
}

fn marks_disruption(call: &Call) -> bool {
    call.method == "PATCH" && call.body["metadata"]["annotations"]["busyguard.io/disruption-requested"].is_string()
}

#[tokio::test]
async fn eviction_of_a_busy_pod_is_429_with_a_warning_event_and_a_hold_on_new_tasks() {
    let api = ApiServer::start().await;
    let since = since_minutes_ago(10);
    api.put_pod(busy_pod("worker-a", since));
    let server = TestServer::with_cluster(&api).await;

    let response = server.review("/validate", &eviction_of("worker-a")).await;
    assert_eq!(
        response,
        json!({"uid": "2b3bba80-3643-4d69-88fc-9d4f057f65a5", "allowed": false, "status": {"status": "Failure",
               "code": 429, "reason": "TooManyRequests", "message": eviction_refused("worker-a", since),
               "details": {"causes": [{"reason": "BusyguardPodBusy"}]}}})
    );
    let events = api.wait_for(1, is_event).await;
    settle().await;
    let writes = api.writes();
    let marks: Vec<&Call> = writes.iter().filter(|c| marks_disruption(c)).collect();
    assert_eq!(writes.len(), 2, "one Event, one mark, no delete: {writes:?}");
    assert_eq!((marks.len(), marks[0].path.as_str()), (1, "/api/v1/namespaces/capture/pods/worker-a"));
    let mark: serde_json::Value = serde_json::from_str(
        marks[0].body["metadata"]["annotations"]["busyguard.io/disruption-requested"].as_str().unwrap(),
    )
    .unwrap();
    assert!(
        mark["by"].as_str().is_some_and(|by| !by.is_empty()) && mark["at"].is_string(),
        "who asked, and when: {mark}"
    );
    let event = &events[0].body;
    assert_eq!((event["type"].as_str(), event["reason"].as_str()), (Some("Warning"), Some("DisruptionBlocked")));
    let note = eviction_refused("worker-a", since);
    assert_eq!((event["action"].as_str(), event["note"].as_str()), (Some("Evict"), Some(&*note)));
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
    assert_eq!(server.review("/validate", &eviction_of("worker-a")).await["allowed"], false);
    // The mark lands, and busyguard's watch sees it, before the drain retries.
    api.wait_for(1, marks_disruption).await;
    settle().await;
    for _ in 0..4 {
        assert_eq!(server.review("/validate", &eviction_of("worker-a")).await["allowed"], false);
    }
    api.wait_for(1, is_event).await;
    settle().await;
    assert_eq!(api.writes().len(), 2, "a retrying drain does not flood the API server: one Event, one mark");
    assert_eq!(server.metric(r#"busyguard_side_effects_total{kind="event",result="rate-limited"}"#).await, Some(4.0));
    assert_eq!(server.audit_lines().len(), 5, "every denial is audited");
}

#[tokio::test]
async fn a_burst_of_evictions_faster_than_the_watch_writes_the_pods_mark_once() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("worker-a", since_minutes_ago(10)));
    let server = TestServer::with_cluster(&api).await;
    // A dry run shows the view holds it, and writes nothing.
    let mut dry_run = eviction_of("worker-a");
    dry_run["request"]["dryRun"] = json!(true);
    eventually("the view holds it", async || {
        (server.review("/validate", &dry_run).await["allowed"] == false).then_some(())
    })
    .await;
    // The view does not see the mark while the evictions come.
    api.lag_watches();
    for _ in 0..5 {
        assert_eq!(server.review("/validate", &eviction_of("worker-a")).await["allowed"], false);
    }
    api.wait_for(1, marks_disruption).await;
    settle().await;
    assert_eq!(api.calls().into_iter().filter(marks_disruption).count(), 1, "one mark for the burst");
    let limited = r#"busyguard_side_effects_total{kind="mark-disruption",result="rate-limited"}"#;
    assert_eq!(server.metric(limited).await, Some(4.0));
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

#[tokio::test]
async fn a_review_beyond_max_in_flight_is_shed_at_once_and_the_next_one_answered() {
    let api = ApiServer::start().await;
    five_workers(&api, since_minutes_ago(30));
    let server = TestServer::start_with(|config| {
        config.cluster.source = api.source();
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
