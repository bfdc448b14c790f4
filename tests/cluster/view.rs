//! The view of opted-in pods: riding out watch restarts and API server restarts, staleness reported, pods that do not decode.

use super::*;

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
async fn until_the_first_list_the_replica_is_unready_its_evictions_get_503_and_status_says_why() {
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
    // And why: the list the API server failed.
    let said = "busyguard has not finished listing the opted-in pods yet: pods: its list: 500 etcd is unavailable\n";
    let status = eventually("/status says why", async || {
        let status = server.admin_get("/status").await;
        (status.text() == said).then_some(status)
    })
    .await;
    assert_eq!(status.status, 503);
    assert_eq!(server.metric("busyguard_view_unavailable").await, Some(1.0));
    // Out of the Service meanwhile: the replica a rollout replaces could still judge evictions.
    let readyz = server.admin_get("/readyz").await;
    assert_eq!(
        (readyz.status, readyz.text()),
        (503, "not ready: busyguard has not finished listing the opted-in pods yet\n".into())
    );

    recovers_and_refuses_the_busy_eviction_again(&api, &server).await;
    assert_eq!(server.admin_get("/readyz").await.status, 200, "ready once listed");
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
    // busyguard's own token is refused all the same (a 503 would pass the webhook's Ignore).
    let mut own = eviction_of("worker-a");
    own["request"]["userInfo"] = json!({"username": "system:serviceaccount:busyguard:busyguard"});
    let refused = server.review("/validate", &own).await;
    assert_eq!((refused["allowed"].as_bool(), refused["status"]["code"].as_u64()), (Some(false), Some(403)));
    recovers_and_refuses_the_busy_eviction_again(&api, &server).await;
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

/// A quiet watch (the opted-out namespaces, the nodes) is ended by the API server within the
/// client's read timeout, as the pods' is: cut by that timeout instead, it would be reopened from
/// a resourceVersion too old to resume and relist with a growing backoff, an opt-out seen a
/// minute late.
#[tokio::test]
async fn every_watch_asks_the_api_server_to_end_it_within_the_clients_read_timeout() {
    let api = ApiServer::start().await;
    let _server = TestServer::with_cluster(&api).await;
    let is_watch = |c: &Call| c.method == "GET" && c.query.split('&').any(|p| p == "watch=true");
    let watches = eventually("the pods', the namespaces' and the nodes' watches", async || {
        let watches: Vec<Call> = api.calls().into_iter().filter(is_watch).collect();
        let paths: std::collections::BTreeSet<&str> = watches.iter().map(|c| c.path.as_str()).collect();
        (paths.len() == 3).then_some(watches)
    })
    .await;
    for watch in watches {
        assert!(watch.query.split('&').any(|p| p.starts_with("timeoutSeconds=")), "{} {}", watch.path, watch.query);
    }
}

/// With `--opt-in` (the `manifests/opt-in` component), only namespaces labelled
/// `busyguard.io/enabled=true` are guarded: busyguard lists those, and a busy pod elsewhere is
/// left alone, its eviction allowed, as in a namespace labelled out.
#[tokio::test]
async fn opted_in_by_label_only_a_labelled_namespaces_busy_pod_is_guarded() {
    for labelled in [false, true] {
        let api = ApiServer::start().await;
        api.put_namespace("other", &[("busyguard.io/enabled", "true")]);
        if labelled {
            api.put_namespace("capture", &[("busyguard.io/enabled", "true")]);
        }
        api.put_pod(busy_pod("worker-a", since_minutes_ago(10)));
        let server = TestServer::start_with(|config| {
            config.cluster.source = api.source();
            config.cluster.enrolment = busyguard::policy::Enrolment::OptIn;
        })
        .await;
        server.wait_ready().await;
        let answer = server.review("/validate", &eviction_of("worker-a")).await;
        assert_eq!(answer["allowed"], !labelled, "labelled in: {labelled}");
        let lists = api.calls().into_iter().filter(|c| c.path == "/api/v1/namespaces").collect::<Vec<_>>();
        assert!(
            !lists.is_empty() && lists.iter().all(|c| c.query.contains("labelSelector=busyguard.io%2Fenabled%3Dtrue"))
        );
        // At start its pods come with everyone's, in the first list: not listed once more.
        let again = api.calls().into_iter().filter(|c| c.path == "/api/v1/namespaces/capture/pods").count();
        assert_eq!(again, 0, "labelled in: {labelled}");
    }
}

/// A namespace labelled out has its pods taken up again once its label comes off: busyguard lists
/// them aside. While that list hangs, the pod watch goes on: a pod turning idle elsewhere is seen,
/// and its eviction allowed.
#[tokio::test]
async fn a_namespace_guarded_again_is_listed_aside_and_the_pod_watch_goes_on_meanwhile() {
    let api = ApiServer::start().await;
    api.put_namespace("other", &[("busyguard.io/enabled", "false")]);
    api.put_pod(busy_pod("worker-a", since_minutes_ago(10)));
    let server = TestServer::with_cluster(&api).await;
    assert_eq!(server.review("/validate", &eviction_of("worker-a")).await["allowed"], false);

    api.fault("GET", "/api/v1/namespaces/other/pods", [Fault::Delay(Duration::from_secs(60))]);
    api.namespace_event("DELETED", "other", &[]);
    api.wait_for(1, |call| call.path == "/api/v1/namespaces/other/pods").await;
    api.update_pod("capture", "worker-a", |pod| pod["metadata"]["labels"]["busyguard.io/busy"] = json!("false"));
    wait_until_eviction_allowed_is(&server, "worker-a", true).await;
}
