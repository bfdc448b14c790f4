//! Busy rules that read the pod and reach the owner's owner, on the projects' own CRDs
//! (../shared/peers): Spark executors under the Spark operator's SparkApplication (through the
//! driver pod, each by its own entry) beside the driver's own rule on the same kind, and Ray
//! workers under a RayJob (through its RayCluster), those added while the job runs too.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use super::owners::NODE;
use crate::rig::{ROOT, Rig, eventually, throughout};
use crate::workers::{self, label};

const SPARK_CRD: &str =
    "spark-operator-v2.5.2/charts/spark-operator-chart/crds/sparkoperator.k8s.io_sparkapplications.yaml";
const RAY_CRDS: [&str; 2] = [
    "kuberay-v1.7.0/helm-chart/kuberay-operator/crds/ray.io_rayjobs.yaml",
    "kuberay-v1.7.0/helm-chart/kuberay-operator/crds/ray.io_rayclusters.yaml",
];

/// The rules docs/spark.md and docs/kuberay.md give, installed with the read access they name:
/// a Spark executor (owned by its driver pod, owned by its SparkApplication) is busy while the
/// application's `status.executorState[<its name>]` is `RUNNING`, refused an eviction then, and
/// idle once it is not; its driver's own token removes it. The driver's rule on the same kind
/// keeps the driver busy while the application runs, and the two rules never flip each other's
/// pods, however often the operator rewrites the status. A Ray worker (owned by a RayCluster,
/// owned by a RayJob) is busy while the job runs, one created after the job began too. Needs
/// ../shared (skipped, and said, without it).
pub fn a_rule_reads_the_pod_and_the_owner_one_further_up(rig: &Rig) -> Result<()> {
    let peers = Path::new(ROOT).join("../shared/peers");
    let crds: Vec<PathBuf> = std::iter::once(SPARK_CRD).chain(RAY_CRDS).map(|crd| peers.join(crd)).collect();
    if !crds.iter().all(|crd| crd.is_file()) {
        println!(
            "e2e: skipped: the Spark operator's and KubeRay's CRDs are not in ../shared/peers (a clone without ../shared)"
        );
        return Ok(());
    }
    for crd in &crds {
        rig.install_crd(crd)?;
    }
    let read = json!(["get", "list", "watch"]);
    rig.grant_cluster(
        "busyguard-owner-chains",
        json!([{"apiGroups": ["sparkoperator.k8s.io"], "resources": ["sparkapplications"], "verbs": read},
            {"apiGroups": ["ray.io"], "resources": ["rayjobs", "rayclusters"], "verbs": read}]),
        "busyguard",
        "busyguard",
    )?;
    let rules = [recipe("spark.md", "# ")?, recipe("spark.md", "## The driver too")?, recipe("kuberay.md", "# ")?]
        .map(|rule| format!("--busy-when-owner={rule}"));
    rig.install_with_args(&[], &rules)?;
    let outcome = spark_and_ray_guarded(rig);
    rig.install_release(Path::new(ROOT), None)?;
    outcome
}

fn spark_and_ray_guarded(rig: &Rig) -> Result<()> {
    eventually("busyguard follows the owners and the kinds between", Duration::from_secs(90), || {
        let statuses = rig.statuses();
        Ok(statuses.len() == 2 && !statuses.iter().any(|s| s.contains("not followed")))
    })
    .with_context(|| format!("/status: {:?}", rig.statuses()))?;
    rig.node(NODE, "4")?;
    rig.kubectl(&["uncordon", NODE])?;
    spark_executors(rig)?;
    ray_workers(rig)
}

fn spark_executors(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("spark")?;
    rig.kubectl(&["-n", &ns, "create", "serviceaccount", "spark"])?;
    rig.grant(&ns, "spark-driver", "get,list,delete", "pods", &format!("{}:spark", &*ns))?;
    rig.apply(&json!({"apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication",
        "metadata": {"name": "etl", "namespace": &*ns},
        "spec": {"type": "Scala", "mode": "cluster", "sparkVersion": "4.0.0",
            "mainApplicationFile": "local:///opt/spark/examples/jars/spark-examples.jar",
            "driver": {"serviceAccount": "spark", "labels": {"busyguard.io/busy": "false"}},
            "executor": {"instances": 2, "labels": {"busyguard.io/busy": "false"}}}}))?;
    // The operator's submission creates the driver, owned by the application; Spark's driver
    // creates its executors, owned by the driver pod.
    let app = rig.get(&["-n", &ns, "sparkapplication", "etl"])?;
    owned_pod(rig, "etl-driver", &app, json!({"spark-role": "driver", "busyguard.io/busy": "false"}), "spark")?;
    let driver = rig.pod(&ns, "etl-driver")?.context("the driver")?;
    for executor in ["etl-exec-1", "etl-exec-2"] {
        let labels = json!({"spark-role": "executor", "busyguard.io/busy": "false"});
        owned_pod(rig, executor, &driver, labels, "default")?;
    }
    // The operator's status update: each executor's state by its pod's name, from its phase.
    executor_state(rig, &ns, json!({"etl-exec-1": "RUNNING", "etl-exec-2": "PENDING"}))?;
    busy(rig, &ns, "etl-exec-1", true)?;
    busy(rig, &ns, "etl-driver", true)?;
    ensure!(busy_label(rig, &ns, "etl-exec-2")? == "false", "an executor whose entry is not RUNNING turned busy");
    two_rules_keep_their_own_pods(rig, &ns)?;
    let (evicted, said) = rig.evict(&ns, "etl-exec-1")?;
    ensure!(!evicted && said.contains("TooManyRequests"), "the running executor's eviction was not refused: {said}");
    // Its driver removes it (dynamic allocation, the application's end): that pod's own end.
    let token = rig.pod_token(&ns, "spark", "etl-driver")?;
    let as_driver = rig.kubeconfig_for(&format!("{}-driver", &*ns), &token)?;
    let (deleted, _, err) =
        crate::rig::kubectl(&as_driver, &["-n", &ns, "delete", "pod", "etl-exec-1", "--wait=false"])?;
    ensure!(deleted, "the driver's own delete of its executor was refused: {err}");
    // The other one runs, then finishes: busy, then idle, and its eviction goes through.
    executor_state(rig, &ns, json!({"etl-exec-2": "RUNNING"}))?;
    busy(rig, &ns, "etl-exec-2", true)?;
    executor_state(rig, &ns, json!({"etl-exec-2": "COMPLETED"}))?;
    busy(rig, &ns, "etl-exec-2", false)?;
    let (evicted, said) = rig.evict(&ns, "etl-exec-2")?;
    ensure!(evicted, "the finished executor's eviction was refused: {said}");
    Ok(())
}

fn ray_workers(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("ray")?;
    let template = json!({"spec": {"containers": [{"name": "ray-worker", "image": "rayproject/ray"}]}});
    rig.apply(&json!({"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "train", "namespace": &*ns},
        "spec": {"entrypoint": "python train.py", "rayClusterSpec": {"headGroupSpec": {"template": template}}}}))?;
    let job = rig.get(&["-n", &ns, "rayjob", "train"])?;
    // KubeRay's RayJob controller creates the cluster, owned by the job; its RayCluster
    // controller the worker pods, owned by the cluster.
    rig.apply(&json!({"apiVersion": "ray.io/v1", "kind": "RayCluster",
        "metadata": {"name": "train-raycluster-k8x2p", "namespace": &*ns, "ownerReferences": [controller(&job)]},
        "spec": {"headGroupSpec": {"template": template}}}))?;
    let cluster = rig.get(&["-n", &ns, "raycluster", "train-raycluster-k8x2p"])?;
    let labels = json!({"ray.io/node-type": "worker", "busyguard.io/busy": "false"});
    owned_pod(rig, "train-raycluster-k8x2p-worker-0", &cluster, labels.clone(), "default")?;
    let worker = "train-raycluster-k8x2p-worker-0";
    job_status(rig, &ns, "RUNNING")?;
    busy(rig, &ns, worker, true)?;
    let (evicted, said) = rig.evict(&ns, worker)?;
    ensure!(
        !evicted && said.contains("TooManyRequests"),
        "the running job's worker's eviction was not refused: {said}"
    );
    // Ray's autoscaler adds a worker while the job runs (or KubeRay replaces a failed one): it
    // works for the job as the others do.
    std::thread::sleep(Duration::from_secs(6));
    let added = "train-raycluster-k8x2p-worker-1";
    owned_pod(rig, added, &cluster, labels, "default")?;
    busy(rig, &ns, added, true)?;
    let (evicted, said) = rig.evict(&ns, added)?;
    ensure!(!evicted && said.contains("TooManyRequests"), "the worker added mid-job was evicted: {said}");
    // busyguard restarted (a rollout) after a later write of the job: the same answer.
    job_status(rig, &ns, "RUNNING")?;
    rig.kubectl(&["-n", "busyguard", "rollout", "restart", "deployment/busyguard"])?;
    rig.rolled_out()?;
    throughout("the added worker stays busy across busyguard's restart", Duration::from_secs(5), || {
        Ok(busy_label(rig, &ns, added)? == "true")
    })?;
    let (evicted, said) = rig.evict(&ns, added)?;
    ensure!(!evicted && said.contains("TooManyRequests"), "after the restart, the added worker was evicted: {said}");
    job_status(rig, &ns, "SUCCEEDED")?;
    busy(rig, &ns, worker, false)?;
    busy(rig, &ns, added, false)?;
    let (evicted, said) = rig.evict(&ns, worker)?;
    ensure!(evicted, "the finished job's worker's eviction was refused: {said}");
    Ok(())
}

/// The operator rewrites the application's status as its executors change (every few seconds on
/// a busy application): for a minute, each write judged by both rules, with pod events between
/// (and the sweeps that fall in it), changes no label: the driver stays busy by its rule, each
/// executor as its own entry says.
fn two_rules_keep_their_own_pods(rig: &Rig, ns: &str) -> Result<()> {
    let flips_before = follow_owner_writes(rig);
    let wanted = [("etl-driver", "true"), ("etl-exec-1", "true"), ("etl-exec-2", "false")];
    for round in 0..20 {
        executor_state(rig, ns, json!({"etl-exec-1": "RUNNING", "etl-exec-2": "PENDING"}))?;
        let touch = format!("e2e/round={round}");
        rig.kubectl(&["-n", ns, "annotate", "--overwrite", "pod", "etl-exec-2", &touch])?;
        std::thread::sleep(Duration::from_secs(3));
        for (pod, value) in wanted {
            let seen = busy_label(rig, ns, pod)?;
            ensure!(seen == value, "round {round}: {pod} busy={seen}, not {value}: the two rules fought");
        }
    }
    let flips = follow_owner_writes(rig) - flips_before;
    ensure!(flips == 0.0, "busyguard wrote {flips} owner flips while nothing changed");
    Ok(())
}

/// busyguard's writes of an owner's pod's busy label so far, on every replica.
fn follow_owner_writes(rig: &Rig) -> f64 {
    let series = rig.metrics().into_iter().flat_map(|page| {
        let lines: Vec<String> = page
            .lines()
            .filter(|l| l.starts_with("busyguard_side_effects_total{") && l.contains("kind=\"follow-owner\""))
            .map(String::from)
            .collect();
        lines
    });
    series.filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

/// The rule a section of a page of docs/ gives (the one headed `section`; "# " for the first):
/// the last `--busy-when-owner=` argument in it.
fn recipe(page: &str, section: &str) -> Result<String> {
    let text = std::fs::read_to_string(Path::new(ROOT).join("docs").join(page))?;
    let mut lines = text.lines().skip_while(|line| !line.starts_with(section)).skip(1);
    let in_section = lines.by_ref().take_while(|line| !line.starts_with("## "));
    let args = in_section.filter_map(|line| line.trim().strip_prefix("value: \"--busy-when-owner="));
    let rule = args.last().with_context(|| format!("docs/{page} gives no rule in {section:?}"))?;
    Ok(rule.trim_end_matches('"').to_string())
}

/// A pod as the controller of `owner` (as the API server returns it) creates it, in its
/// namespace, running as `service_account` on the rig's node.
fn owned_pod(rig: &Rig, name: &str, owner: &Value, labels: Value, service_account: &str) -> Result<()> {
    let ns = owner["metadata"]["namespace"].as_str().context("the owner's namespace")?;
    let mut labels = labels;
    labels["app"] = json!(name);
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels, "ownerReferences": [controller(owner)]},
        "spec": {"nodeName": NODE, "serviceAccountName": service_account, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "example.com/owned"}]}});
    crate::rig::kubectl_stdin(&rig.admin, &["create", "-f", "-"], &pod.to_string())?;
    eventually(&format!("{name} runs"), Duration::from_secs(60), || Ok(workers::ready_pods(rig, ns, name)?.len() == 1))
}

/// The ownerReference a controller puts on what it creates for `owner`.
pub(super) fn controller(owner: &Value) -> Value {
    json!({"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true})
}

/// The Spark operator's status update of the application (`updateExecutorState`, then the
/// status subresource's update of the whole object): the executors' states by pod name, of the
/// executor pods there are now.
fn executor_state(rig: &Rig, ns: &str, states: Value) -> Result<()> {
    let mut app = rig.get(&["-n", ns, "sparkapplication", "etl"])?;
    app["status"] = json!({"applicationState": {"state": "RUNNING"}, "driverInfo": {"podName": "etl-driver"},
        "executorState": states});
    crate::rig::kubectl_stdin(&rig.admin, &["replace", "--subresource=status", "-f", "-"], &app.to_string()).map(drop)
}

/// KubeRay's status update of the RayJob: the Ray job's state, through the status subresource.
fn job_status(rig: &Rig, ns: &str, status: &str) -> Result<()> {
    let patch = json!({"status": {"jobStatus": status, "jobDeploymentStatus": "Running"}});
    let args = ["-n", ns, "patch", "rayjob", "train", "--subresource=status", "--type=merge", "-p"];
    rig.kubectl(&[&args[..], &[&patch.to_string()]].concat()).map(drop)
}

fn busy_label(rig: &Rig, ns: &str, pod: &str) -> Result<String> {
    Ok(rig.pod(ns, pod)?.and_then(|pod| label(&pod, "busyguard.io/busy")).unwrap_or_default())
}

fn busy(rig: &Rig, ns: &str, pod: &str, busy: bool) -> Result<()> {
    let value = if busy { "true" } else { "false" };
    eventually(&format!("{pod} busy={value}"), Duration::from_secs(10), || Ok(busy_label(rig, ns, pod)? == value))
}
