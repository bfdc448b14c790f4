//! busyguard with a cluster behind it: the real server over TLS, watching a stand-in API server
//! on loopback (real paths, real JSON), asserting the exact calls busyguard makes.

#[path = "../common/mod.rs"]
mod common;

mod busy_pdb;
mod deferred_deletes;
mod evictions;
mod losses_and_repairs;
mod nodes_and_budgets;
mod operations;
mod readiness;
mod scale_down;
mod view;

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

/// A person's eviction of the pod `name`.
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

async fn wait_until_eviction_allowed_is(server: &TestServer, name: &str, allowed: bool) {
    let what = format!("eviction of {name} answered allowed={allowed}");
    eventually(&what, async || {
        (server.review("/validate", &eviction_of(name)).await["allowed"] == allowed).then_some(())
    })
    .await
}

/// Five workers: `busy` fresh and busy, `busy-stale` labelled busy while busyguard missed the
/// flip (created at `missed_created`), two idle, and `idle-stale` idle with its busy annotations left behind. The watch's own
/// refresh of the two stale ones is refused (403, not retried), so they are still stale when a
/// test scales down: start the server with `serving_five_workers`.
fn five_workers(api: &ApiServer, since: Timestamp) {
    for stale in ["busy-stale", "idle-stale"] {
        api.fault("PATCH", &format!("{POD_PATH}/{stale}"), [Fault::Status(403)]);
    }
    api.put_pod(busy_pod("busy", since));
    let mut missed = worker_pod("busy-stale", true);
    missed["metadata"]["annotations"] = json!({"controller.kubernetes.io/pod-deletion-cost": "1"});
    missed["metadata"]["creationTimestamp"] = json!(missed_created(since).to_string());
    api.put_pod(missed);
    api.put_pod(worker_pod("idle-1", false));
    api.put_pod(worker_pod("idle-2", false));
    let mut left_behind = busy_pod("idle-stale", since);
    left_behind["metadata"]["labels"]["busyguard.io/busy"] = json!("false");
    api.put_pod(left_behind);
}

/// When `busy-stale` was created, ten minutes after `since`: the busy-since busyguard gives it,
/// since max-busy counts from there for a flip it missed.
fn missed_created(since: Timestamp) -> Timestamp {
    since + jiff::SignedDuration::from_mins(10)
}

fn scale_down_5_to_2() -> Value {
    let mut review = fixture("deployment-scale-subresource-down-by-kubectl.json");
    review["request"]["oldObject"]["spec"]["replicas"] = json!(5);
    review
}

/// A server watching `api` whose sweep comes every 200 ms.
async fn sweeping(api: &ApiServer) -> TestServer {
    let server = TestServer::start_with(|config| {
        config.cluster.source = api.source();
        config.cluster.sweep_interval = Duration::from_millis(200);
    })
    .await;
    server.wait_ready().await;
    server
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
