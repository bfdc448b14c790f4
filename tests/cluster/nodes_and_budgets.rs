//! Node deletes refused while busy pods run there, and the workload budget (busyguard.io/max-unavailable).

use super::*;

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
        put_budgeted(&api, name);
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

/// A place under the budget that cannot be recorded with the API server is refused (429, the
/// requester retries), not answered 503: the budget's webhook fails open, so a 503 would let the
/// pod go past the budget.
#[tokio::test]
async fn a_workload_budget_whose_claim_cannot_be_recorded_refuses_and_the_retry_goes() {
    let api = ApiServer::start().await;
    put_budgeted(&api, "ds-a");
    let server = TestServer::with_cluster(&api).await;
    let lease = format!("{LEASES}/busyguard-budget-capture.deployment-worker");
    for (method, path) in [("GET", &lease), ("PUT", &lease), ("POST", &LEASES.to_string())] {
        api.fault(method, path, [Fault::Status(500), Fault::Status(500), Fault::Status(500)]);
    }
    let refused = server.review("/validate", &eviction_of("ds-a")).await;
    assert_eq!(refused["allowed"], false, "{refused:#}");
    assert_eq!(refused["status"]["code"], 429);
    assert_eq!(refused["status"]["details"]["causes"][0]["reason"], "BusyguardDisruptionBudget");
    let message = refused["status"]["message"].as_str().unwrap();
    assert!(message.contains("could not record"), "{message}");
    wait_until_eviction_allowed_is(&server, "ds-a", true).await;
}

/// A Lease deleted as spent between the claim's read and its write (404 on the replace) is
/// read again, and the claim written: the pod goes at once, as it would have without the race.
#[tokio::test]
async fn a_budget_lease_deleted_as_spent_while_a_claim_writes_it_is_read_again() {
    let api = ApiServer::start().await;
    put_budgeted(&api, "ds-a");
    let name = "busyguard-budget-capture.deployment-worker";
    api.put_lease(
        "busyguard",
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "busyguard"},
            "annotations": {"busyguard.io/granted": json!({"gone": Timestamp::now()}).to_string()}}}),
    );
    let server = TestServer::with_cluster(&api).await;
    let lease = format!("{LEASES}/{name}");
    api.fault("PUT", &lease, [Fault::Status(404)]);
    let allowed = server.review("/validate", &eviction_of("ds-a")).await;
    assert_eq!(allowed["allowed"], true, "{allowed:#}");
    let puts = api.calls().into_iter().filter(|c| c.method == "PUT" && c.path == lease).count();
    assert_eq!(puts, 2, "written again after the 404");
}

#[tokio::test]
async fn a_workload_budget_lets_one_of_several_evictions_at_once_go() {
    let api = ApiServer::start().await;
    let names = ["ds-a", "ds-b", "ds-c", "ds-d"];
    for name in names {
        put_budgeted(&api, name);
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

#[tokio::test]
async fn two_replicas_let_one_of_several_evictions_at_once_go_under_a_budget_of_one() {
    let api = ApiServer::start().await;
    let names = ["ds-a", "ds-b", "ds-c", "ds-d", "ds-e", "ds-f"];
    for name in names {
        put_budgeted(&api, name);
    }
    let replicas = [TestServer::with_cluster(&api).await, TestServer::with_cluster(&api).await];
    // Each replica's view knows nothing of the other's answers: the API server arbitrates, on
    // the workload's Lease.
    let reviews = names.map(eviction_of);
    let asked = reviews.iter().enumerate().map(|(i, review)| replicas[i % 2].review("/validate", review));
    let answers = futures::future::join_all(asked).await;
    let allowed: Vec<&str> =
        (answers.iter().zip(names)).filter(|(a, _)| a["allowed"] == true).map(|(_, n)| n).collect();
    assert_eq!(allowed.len(), 1, "{answers:#?}");
    let lease = api.lease("busyguard", "busyguard-budget-capture.deployment-worker").expect("the workload's Lease");
    let granted: Value =
        serde_json::from_str(lease["metadata"]["annotations"]["busyguard.io/granted"].as_str().unwrap()).unwrap();
    assert_eq!(granted.as_object().unwrap().keys().collect::<Vec<_>>(), allowed, "the pod let go, on record");
    assert_eq!(lease["metadata"]["labels"]["app.kubernetes.io/managed-by"], "busyguard");
}

/// Where busyguard keeps the budgets' Leases: its own namespace.
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/busyguard/leases";

/// An idle worker of Deployment/worker in `capture`, under a workload budget of one.
fn put_budgeted(api: &ApiServer, name: &str) {
    let mut pod = worker_pod(name, false);
    pod["metadata"]["labels"]["busyguard.io/max-unavailable"] = json!("1");
    api.put_pod(pod);
}
