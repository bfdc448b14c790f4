//! Readiness mode: a busy pod released from its ReplicaSet and reaped once Ready; the agent that turns an app's endpoint into the busy label.

use super::*;

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
    let app_addr = serve_app("/ready", status.clone()).await;
    let agent = busyguard::commands::agent::Agent {
        url: format!("http://{app_addr}/ready").parse().unwrap(),
        busy_when: busyguard::commands::agent::BusyWhen::Status(503),
        interval: Duration::from_millis(100),
        namespace: "capture".into(),
        pod: "worker-a".into(),
        listen: None,
    };
    let running = tokio::spawn(agent.run(api.kube_config()));
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

#[tokio::test]
async fn the_app_asks_busyguard_agent_before_each_task_and_is_told_not_to_start_where_the_pod_is_held() {
    use std::sync::atomic::{AtomicU16, Ordering};
    let api = ApiServer::start().await;
    api.put_pod(worker_pod("worker-a", false));
    // The app: its endpoint says busy (503) while it works.
    let working = std::sync::Arc::new(AtomicU16::new(200));
    let app_addr = serve_app("/busy", working.clone()).await;
    let listen = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let agent = busyguard::commands::agent::Agent {
        url: format!("http://{app_addr}/busy").parse().unwrap(),
        busy_when: busyguard::commands::agent::BusyWhen::Status(503),
        interval: Duration::from_millis(100),
        namespace: "capture".into(),
        pod: "worker-a".into(),
        listen: Some(listen),
    };
    let running = tokio::spawn(agent.run(api.kube_config()));
    let label =
        |api: &ApiServer| api.pod("capture", "worker-a").unwrap()["metadata"]["labels"]["busyguard.io/busy"].clone();
    let ask_to_start = async || {
        let mut stream = loop {
            match tokio::net::TcpStream::connect(listen).await {
                Ok(stream) => break stream,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        let request =
            format!("POST /start HTTP/1.1\r\nHost: {listen}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        tokio::io::AsyncWriteExt::write_all(&mut stream, request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut stream, &mut answer).await.unwrap();
        answer
    };
    // The agent's first report: the app is idle.
    api.wait_for(1, pod_call("PATCH", "worker-a")).await;
    // Free to start: the pod is busy before the task begins.
    let answer = ask_to_start().await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(label(&api), "true");
    working.store(503, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(label(&api), "true", "the task runs: still busy");
    // The task ends; the pod is held (busyguard refuses the next flip): do not start.
    working.store(200, Ordering::SeqCst);
    eventually("flagged idle", async || (label(&api) == "false").then_some(())).await;
    api.fault("PATCH", "/api/v1/namespaces/capture/pods/worker-a", [Fault::Refused("BusyguardDisruptionWanted")]);
    let answer = ask_to_start().await;
    assert!(answer.starts_with("HTTP/1.1 409"), "{answer}");
    assert!(answer.contains("do not start (BusyguardDisruptionWanted)"), "{answer}");
    assert_eq!(label(&api), "false", "idle, so the disruption takes it now");
    // The asks are judged as any flip; the agent's own reports say a task has begun.
    let managers: Vec<String> = (api.writes().into_iter())
        .filter(pod_call("PATCH", "worker-a"))
        .map(|c| c.query.split('&').find_map(|p| p.strip_prefix("fieldManager=")).unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        managers,
        ["busyguard-agent", "busyguard-agent-start", "busyguard-agent", "busyguard-agent-start"],
        "the first report (idle), a start, the report of its end, the start refused"
    );
    running.abort();
}

/// An app's endpoint at `path` answering the status `status` holds (0: not answering at all).
async fn serve_app(path: &str, status: std::sync::Arc<std::sync::atomic::AtomicU16>) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route(
        path,
        axum::routing::get(move || {
            let status = status.load(std::sync::atomic::Ordering::SeqCst);
            async move {
                if status == 0 {
                    std::future::pending::<()>().await;
                }
                axum::http::StatusCode::from_u16(status).unwrap()
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}
