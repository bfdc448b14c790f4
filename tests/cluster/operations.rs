//! What an operator relies on: RBAC that grants exactly the calls made, busyguard status, the per-workload gauges, failed side effects counted, side effects in flight carried out at shutdown.

use super::*;

#[tokio::test]
async fn a_side_effect_the_api_server_refuses_is_counted_as_failed_and_the_answer_stands() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("worker-a", since_minutes_ago(10)));
    let server = TestServer::with_cluster(&api).await;
    api.fault("PATCH", &format!("{POD_PATH}/worker-a"), [Fault::Status(403)]);
    let failed = r#"busyguard_side_effects_total{kind="mark-delete",result="failed"}"#;
    // At 0 from the start, under the name the outbox counts it by: the alert sees the first.
    assert_eq!(server.metric(failed).await, Some(0.0));
    let review = delete_of(&api.pod("capture", "worker-a").unwrap(), "pod-delete-by-user.json");
    assert_eq!(server.review("/validate", &review).await["status"]["code"], 429);
    eventually(failed, async || server.metric(failed).await.filter(|n| *n > 0.0)).await;
    assert_eq!(server.metric(failed).await, Some(1.0));
    assert_eq!(api.wait_for(1, pod_call("PATCH", "worker-a")).await.len(), 1, "403 is not retried");
}

/// Every call busyguard can make, in one run: list and watch, refreshes, the mark and the
/// delete of a deferred delete, an Event and its series, the read of a pod that left the watch,
/// and a workload budget's Lease (created, read, replaced; and one spent, listed and deleted).
#[tokio::test]
async fn rbac_of_the_manifests_grants_exactly_the_calls_busyguard_makes() {
    let api = ApiServer::start().await;
    five_workers(&api, since_minutes_ago(30));
    api.put_pod(busy_pod("worker-a", since_minutes_ago(10)));
    unready_worker(&api);
    put_workload(&api, 1, 2, "RollingUpdate");
    api.put_lease(
        "busyguard",
        json!({"metadata": {"name": "busyguard-budget-gone.daemonset-agent",
        "labels": {"app.kubernetes.io/managed-by": "busyguard"},
        "annotations": {"busyguard.io/granted": r#"{"agent-x":"2026-01-01T00:00:00Z"}"#}}}),
    );
    let server = TestServer::start_with(|config| {
        config.cluster.source = api.source();
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
    // An eviction in background (the descheduler's), deferred, then carried out as an eviction.
    let mut evicted = busy_pod("evicted", since_minutes_ago(10));
    evicted["metadata"]["annotations"]["descheduler.alpha.kubernetes.io/request-evict-only"] = json!("");
    api.put_pod(evicted);
    eventually("the view holds it", async || {
        let answer = server.review("/validate", &eviction_of("evicted")).await;
        (answer["status"]["code"] == 429).then_some(())
    })
    .await;
    api.wait_for(1, pod_call("PATCH", "evicted")).await;
    settle().await;
    api.update_pod("capture", "evicted", |pod| pod["metadata"]["labels"]["busyguard.io/busy"] = json!("false"));
    let evictions = api.wait_for(1, |c| c.method == "POST" && c.path == format!("{POD_PATH}/evicted/eviction")).await;
    assert_eq!(evictions[0].body["deleteOptions"]["preconditions"]["uid"], "uid-evicted", "{}", evictions[0].body);
    // A busy pod leaving the watch: gone, or only its label removed?
    api.update_pod("capture", "busy", |pod| {
        pod["metadata"]["labels"].as_object_mut().unwrap().remove("busyguard.io/busy");
    });
    api.wait_for(1, pod_call("GET", "busy")).await;
    // Two evictions under a workload budget of two: the first creates its Lease, the second
    // reads and replaces it.
    for name in ["ds-a", "ds-b"] {
        let mut pod = worker_pod(name, false);
        pod["metadata"]["labels"]["busyguard.io/max-unavailable"] = json!("2");
        pod["metadata"]["ownerReferences"][0]["kind"] = json!("DaemonSet");
        pod["metadata"]["ownerReferences"][0]["name"] = json!("agent");
        api.put_pod(pod);
        wait_until_eviction_allowed_is(&server, name, true).await;
    }
    // Every opted-in pod gone: busyguard's PDB goes too.
    for name in ["busy-stale", "idle-1", "idle-2", "idle-stale", "worker-a", "worker-compat", "ds-a", "ds-b", "evicted"]
    {
        api.remove_pod("capture", name);
    }
    api.wait_for(1, |c| c.method == "DELETE" && c.path.contains("/poddisruptionbudgets")).await;
    // A Lease whose grants all ran out goes (its workload is long gone).
    api.wait_for(1, |c| c.method == "DELETE" && c.path.ends_with("/leases/busyguard-budget-gone.daemonset-agent"))
        .await;

    assert_eq!(api.forbidden_calls(), Vec::<String>::new(), "every call is granted");
    let granted = common::rbac::GRANTED.clone();
    assert_eq!(api.permissions_used(), granted, "and every grant is used");
}

#[tokio::test]
async fn busyguard_status_reads_the_cluster_and_says_who_is_busy_where() {
    let api = ApiServer::start().await;
    let since = since_minutes_ago(30);
    let mut busy = busy_pod("worker-a", since);
    busy["spec"]["nodeName"] = json!("node-1");
    api.put_pod(busy);
    let mut idle = worker_pod("worker-b", false);
    idle["spec"]["tolerations"] = json!([{"operator": "Exists"}]);
    api.put_pod(idle);
    api.put_pdb(json!({"metadata": {"name": "workers", "namespace": "capture"},
        "spec": {"selector": {"matchLabels": {"app": "worker"}}, "unhealthyPodEvictionPolicy": "AlwaysAllow"}}));
    // busyguard runs with a max-busy of its own: the report judges as it does, unless told otherwise.
    api.put_app(
        "deployments",
        json!({"metadata": {"name": "busyguard", "namespace": "busyguard"},
        "spec": {"selector": {}, "template": {"spec": {"containers": [{"name": "busyguard", "args": ["serve"],
            "env": [{"name": "BUSYGUARD_MAX_BUSY", "value": "2h"}]}]}}}}),
    );
    let source = api.source();
    let max_busy = busyguard::policy::busy::MaxBusy::new(SignedDuration::from_hours(24));
    let settings = busyguard::commands::status::Settings { max_busy, holds: Default::default() };
    let report = busyguard::commands::status::run(&source, &[], settings, &[]).await.unwrap();
    let (said, report) = report.split_once('\n').unwrap();
    assert_eq!(said, "Settings: busyguard's Deployment's, --max-busy 2h; this command's otherwise");
    assert!(report.starts_with("\n2 opted-in pods in 1 workload, 1 busy"), "{report}");
    assert!(report.contains("capture/Deployment/worker                            1     1       0"), "{report}");
    let until = since.checked_add(SignedDuration::from_hours(2)).unwrap();
    assert!(
        report.contains(&format!("capture/worker-a on node-1: busy since {since} (30m ago), protected until {until}")),
        "{report}"
    );
    assert!(report.contains(&format!("node-1: capture/worker-a until {until}")), "{report}");
    assert!(
        report.contains("capture/Deployment/worker: its pods tolerate every taint, so Karpenter never evicts them"),
        "{report}"
    );
    assert!(
        report.contains(
            "PodDisruptionBudget capture/workers selects opted-in pods with unhealthyPodEvictionPolicy AlwaysAllow"
        ),
        "{report}"
    );
    let lists: Vec<Call> = api.calls().into_iter().filter(Call::reads_pod_list).collect();
    assert_eq!(lists.len(), 1, "one list of the opted-in pods");
    assert!(lists[0].query.contains("labelSelector=busyguard.io%2Fbusy"));
    let others: Vec<(String, String)> = api.writes().into_iter().map(|c| (c.method.to_string(), c.path)).collect();
    assert_eq!(
        others,
        [
            ("GET".to_string(), "/apis/apps/v1/namespaces/busyguard/deployments/busyguard".to_string()),
            ("GET".to_string(), "/apis/policy/v1/namespaces/capture/poddisruptionbudgets".to_string())
        ],
        "busyguard's Deployment, and the budgets of its namespaces; nothing written"
    ); // Given on the command line, the user's own is used: a "what if".
    let asked = busyguard::commands::status::Settings { max_busy, holds: Default::default() };
    let what_if = busyguard::commands::status::run(&source, &[], asked, &["--max-busy"]).await.unwrap();
    assert!(what_if.starts_with("Settings: this command's (busyguard's Deployment sets none"), "{what_if}");
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

#[tokio::test]
async fn a_side_effect_still_in_flight_at_shutdown_is_carried_out_before_busyguard_stops() {
    let api = ApiServer::start().await;
    // Busy by its label, without busyguard's annotations: the watch refreshes it.
    api.put_pod(worker_pod("missed", true));
    api.fault("PATCH", &format!("{POD_PATH}/missed"), [Fault::Delay(Duration::from_secs(1))]);
    let mut server = TestServer::with_cluster(&api).await;
    api.wait_for(1, pod_call("PATCH", "missed")).await;

    server.running.take().unwrap().shutdown().await;
    let annotations = &api.pod("capture", "missed").unwrap()["metadata"]["annotations"];
    assert!(annotations.get("busyguard.io/busy-since").is_some(), "the refresh landed before the stop: {annotations}");
}

#[tokio::test]
async fn a_busy_rule_naming_a_kind_the_api_server_does_not_serve_leaves_everything_else_serving_and_says_so() {
    let api = ApiServer::start().await;
    api.put_pod(worker_pod("busy", true));
    let server = TestServer::start_with(|config| {
        config.cluster.source = api.source();
        config.policy.owner_rules =
            vec!["agones.dev/v1/GameServer=object.status.state == 'Allocated'".parse().unwrap()];
    })
    .await;
    // The other paths are served: a person's delete of a busy pod is refused (429).
    let review = delete_of(&api.pod("capture", "busy").unwrap(), "pod-delete-by-user.json");
    let answer = server.review("/validate", &review).await;
    assert_eq!(answer["status"]["code"], 429, "{answer}");
    // Said where people and alerts look, and asked again.
    let status = server.admin_get("/status").await.text();
    assert!(
        status.contains(
            "--busy-when-owner agones.dev/v1/GameServer: its owners are not followed (--busy-when-owner \
             agones.dev/v1/GameServer: the API server does not serve this kind"
        ),
        "{status}"
    );
    assert!(status.contains("install its project's CRDs (in this version) first, or drop the rule"), "{status}");
    assert!(!status.contains("Status {") && !status.contains("ErrorResponse"), "no debug dump: {status}");
    assert_eq!(server.metric(r#"busyguard_owner_rule_followed{rule="agones.dev/v1/GameServer"}"#).await, Some(0.0));
    api.wait_for(2, |c| c.method == "GET" && c.path == "/apis/agones.dev/v1").await;
}

#[tokio::test]
async fn busyguard_check_names_a_busy_rule_busyguard_would_not_start_with_and_warns_of_one_it_would_not_follow() {
    let api = ApiServer::start().await;
    let source = api.source();
    let with_rule = |rule: &str| {
        let container =
            json!({"name": "busyguard", "image": "busyguard", "args": ["serve", "--busy-when-owner", rule]});
        api.put_app(
            "deployments",
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "busyguard", "namespace": "busyguard"},
                "spec": {"selector": {}, "template": {"spec": {"containers": [container]}}}}),
        );
    };
    let check = async || {
        let outcome = busyguard::commands::check::run(&source, Some("capture"), Duration::from_secs(1)).await;
        format!("{:#}", outcome.expect_err("check passed"))
    };
    with_rule("agones.dev/v1/GameServer=object.status.state ==");
    let error = check().await;
    assert!(
        error.starts_with(
            "busyguard cannot start with its busy rules: --busy-when-owner agones.dev/v1/GameServer: the expression"
        ),
        "{error}"
    );
    assert!(error.contains("does not compile"), "{error}");
    with_rule("agones.dev/v1/GameServer=object.status.state == 'Allocated'");
    // busyguard starts with a kind not served: check warns of it, and goes on to its dry runs.
    let warnings = busyguard::commands::check::owner_rule_warnings(&kube::Client::try_from(api.kube_config()).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with(
            "warning: --busy-when-owner agones.dev/v1/GameServer: the API server does not serve this kind"
        ),
        "{warnings:?}"
    );
    // Rules given in the environment, one per line, are read too.
    let env = json!([{"name": "BUSYGUARD_BUSY_WHEN_OWNER",
        "value": "agones.dev/v1/GameServer=object.status.state == 'Allocated'\nexample.com/v1/Task=true"}]);
    api.put_app(
        "deployments",
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "busyguard", "namespace": "busyguard"},
            "spec": {"selector": {}, "template": {"spec": {"containers": [
                {"name": "busyguard", "image": "busyguard", "args": ["serve"], "env": env}]}}}}),
    );
    let warnings = busyguard::commands::check::owner_rule_warnings(&kube::Client::try_from(api.kube_config()).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(warnings.len(), 2, "both rules of BUSYGUARD_BUSY_WHEN_OWNER: {warnings:?}");
    for kind in ["agones.dev/v1/GameServer", "example.com/v1/Task"] {
        assert!(warnings.iter().any(|w| w.contains(&format!("--busy-when-owner {kind}:"))), "{kind}: {warnings:?}");
    }
}

#[tokio::test]
async fn a_kueue_hold_with_nothing_to_follow_says_why_and_tells_not_installed_from_cannot_ask() {
    let api = ApiServer::start().await;
    api.put_pod(worker_pod("busy", true));
    let server = TestServer::start_with(|config| {
        config.cluster.source = api.source();
        config.cluster.hold_kueue_preemption = true;
    })
    .await;
    let not_installed = "--hold-kueue-preemption: Kueue's preemptions are not held (the API server does not serve \
                         Kueue's Workloads (Kueue not installed?)); everything else is served, and busyguard tries again";
    eventually("/status says Kueue is not installed", async || {
        server.admin_get("/status").await.text().contains(not_installed).then_some(())
    })
    .await;
    assert_eq!(server.metric("busyguard_kueue_hold_followed").await, Some(0.0));
    let review = delete_of(&api.pod("capture", "busy").unwrap(), "pod-delete-by-user.json");
    assert_eq!(server.review("/validate", &review).await["status"]["code"], 429, "everything else is served");

    // Asked again (within a minute): an API server that cannot be asked is not "not installed".
    api.fault("GET", "/apis", std::iter::repeat_with(|| Fault::Status(403)).take(100));
    eventually("/status says it cannot ask", async || {
        let status = server.admin_get("/status").await.text();
        status.contains("Kueue's preemptions are not held (cannot ask the API server whether it serves").then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_replica_that_cannot_list_namespaces_says_why_its_pods_are_not_listed() {
    let api = ApiServer::start().await;
    api.put_pod(worker_pod("w", false));
    api.fault("GET", "/api/v1/namespaces", std::iter::repeat_with(|| Fault::Status(403)).take(3));
    let server = TestServer::with_cluster_unready(&api).await;
    let status = eventually("/status names the namespaces' watch", async || {
        let status = server.admin_get("/status").await.text();
        status.contains("namespaces: its list: 403").then_some(status)
    })
    .await;
    assert!(
        status.starts_with(
            "busyguard has not finished listing the opted-in pods yet: namespaces: its list: 403 injected by the test\n"
        ),
        "{status}"
    );
    assert!(status.contains("403"), "the API server's answer is named: {status}");
    assert!(!status.contains("ErrorResponse {") && !status.contains("Status {"), "no debug dump: {status}");
    assert!(server.metric("busyguard_watch_errors_total").await.is_some_and(|n| n >= 1.0), "counted");
    // Once the namespaces can be listed, the pods are, and the failure is no longer said.
    server.wait_ready().await;
}
