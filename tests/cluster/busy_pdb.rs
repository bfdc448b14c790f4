//! The busy-pod PodDisruptionBudget kept per namespace (--busy-pdb).

use super::*;

/// A server keeping the busy-pod PDBs, sweeping every 200 ms.
async fn keeping_busy_pdbs(api: &ApiServer) -> TestServer {
    keeping_busy_pdbs_sweeping_every(api, Duration::from_millis(200)).await
}

async fn keeping_busy_pdbs_sweeping_every(api: &ApiServer, sweep_interval: Duration) -> TestServer {
    let server = TestServer::start_with(|config| {
        config.cluster.source = api.source();
        config.cluster.sweep_interval = sweep_interval;
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
async fn a_namespaces_first_opted_in_pod_gets_its_pdb_at_once_not_at_the_next_sweep() {
    let api = ApiServer::start().await;
    let server = keeping_busy_pdbs_sweeping_every(&api, Duration::from_secs(3600)).await;
    api.put_pod(busy_pod("worker-a", since_minutes_ago(10)));
    let created = api.wait_for(1, pdb_call("POST")).await;
    assert_eq!(created[0].path, "/apis/policy/v1/namespaces/capture/poddisruptionbudgets");

    // The namespace's next pod needs no round of its own: the PDB is there.
    let rounds = || api.calls().into_iter().filter(pdb_call("GET")).count();
    let before = rounds();
    api.put_pod(busy_pod("worker-b", since_minutes_ago(1)));
    wait_until_eviction_allowed_is(&server, "worker-b", false).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(rounds(), before, "one round for the namespace's first pod only");
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
