//! The workloads the scenarios run: opted-in workers, and what a worker does (flip its label).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{Value, json};

use crate::rig::{Rig, eventually};

/// A Deployment of opted-in workers `app=NAME` (idle in the template; grace period 1 s).
pub fn deployment(ns: &str, name: &str, replicas: u32) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, "busyguard.io/busy": "false"}},
                "spec": {"terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "worker", "image": "example.com/worker"}]}
            }
        }
    })
}

/// A bare opted-in pod `NAME` (app=NAME), optionally pinned to a node.
pub fn pod(ns: &str, name: &str, node: Option<&str>) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name, "busyguard.io/busy": "false"}},
        "spec": {"terminationGracePeriodSeconds": 1,
            "containers": [{"name": "worker", "image": "example.com/worker"}]}
    });
    if let Some(node) = node {
        pod["spec"]["nodeName"] = json!(node);
    }
    pod
}

/// Applies `workload` and waits until `n` pods of `app` run Ready; returns their names.
pub fn start(rig: &Rig, workload: &Value, app: &str, n: usize) -> Result<Vec<String>> {
    rig.apply(workload)?;
    let ns = workload["metadata"]["namespace"].as_str().unwrap_or_default();
    eventually(&format!("{n} pods of {app} ready"), Duration::from_secs(60), || {
        Ok(ready_pods(rig, ns, app)?.len() == n)
    })?;
    ready_pods(rig, ns, app)
}

/// Pods of `app` that run Ready and are not being deleted, by name.
pub fn ready_pods(rig: &Rig, ns: &str, app: &str) -> Result<Vec<String>> {
    let list = rig.get(&["-n", ns, "pods", "-l", &format!("app={app}")])?;
    let mut names: Vec<String> = (list["items"].as_array().into_iter().flatten())
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null() && is_ready(p))
        .filter_map(|p| p["metadata"]["name"].as_str().map(String::from))
        .collect();
    names.sort();
    Ok(names)
}

pub fn is_ready(pod: &Value) -> bool {
    (pod["status"]["conditions"].as_array().into_iter().flatten())
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// The worker's own move, here made by the admin: its busy label.
pub fn flip(rig: &Rig, ns: &str, pod: &str, busy: bool) -> Result<()> {
    rig.kubectl(&["-n", ns, "label", "pod", pod, &format!("busyguard.io/busy={busy}"), "--overwrite"])?;
    Ok(())
}

pub fn annotation(pod: &Value, key: &str) -> Option<String> {
    pod["metadata"]["annotations"][key].as_str().map(String::from)
}

pub fn label(pod: &Value, key: &str) -> Option<String> {
    pod["metadata"]["labels"][key].as_str().map(String::from)
}

/// Workers on a steady queue, one per pod: each takes its next task the moment one ends (flips
/// its pod busy, works `task`, flips it idle), speaking with a token bound to its own pod, and
/// treats a refused flip as "do not start" (it asks again a second later). Each stops once its
/// pod is gone or going.
pub struct Queue {
    stop: Arc<AtomicBool>,
    workers: Vec<std::thread::JoinHandle<Tally>>,
}

/// What one worker did.
#[derive(Debug, Default)]
pub struct Tally {
    pub pod: String,
    /// When each task started.
    pub started: Vec<Instant>,
    /// Tasks whose pod went (a deletionTimestamp, or gone) while they ran.
    pub cut: usize,
    /// Flips to busy refused: when, and what the API server said.
    pub refused: Vec<(Instant, String)>,
}

impl Queue {
    /// Starts a worker for each pod of `pods` in `ns`, all of service account `sa` (which
    /// [`grant_workers`] gave the contract's worker Role).
    pub fn start(rig: &Rig, ns: &str, sa: &str, pods: &[String], task: Duration) -> Result<Queue> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut workers = Vec::new();
        for pod in pods {
            let token = rig.pod_token(ns, sa, pod)?;
            let kubeconfig = rig.kubeconfig_for(&format!("{ns}-{pod}"), &token)?;
            let (ns, pod, stop) = (ns.to_string(), pod.clone(), stop.clone());
            workers.push(std::thread::spawn(move || work(&kubeconfig, &ns, &pod, task, &stop)));
        }
        Ok(Queue { stop, workers })
    }

    /// Stops every worker (a task under way ends first) and returns what each did.
    pub fn finish(self) -> Vec<Tally> {
        self.stop.store(true, Ordering::SeqCst);
        self.workers.into_iter().map(|w| w.join().unwrap_or_default()).collect()
    }
}

/// A service account `sa` in `ns` with the contract's worker Role: get and patch pods.
pub fn grant_workers(rig: &Rig, ns: &str, sa: &str) -> Result<()> {
    rig.kubectl(&["-n", ns, "create", "serviceaccount", sa])?;
    rig.grant(ns, sa, "get,patch", "pods", &format!("{ns}:{sa}"))
}

/// A worker: it flips its pod busy through the API server as its app would (no process spawned
/// between tasks), so it takes its next task the moment one ends.
fn work(kubeconfig: &Path, ns: &str, pod: &str, task: Duration, stop: &AtomicBool) -> Tally {
    let mut tally = Tally { pod: pod.to_string(), ..Tally::default() };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let Ok(pods) = runtime.block_on(pods_as(kubeconfig, ns)) else { return tally };
    let label = |value: &str| {
        let patch = json!({"metadata": {"labels": {"busyguard.io/busy": value}}});
        runtime.block_on(pods.patch(pod, &PatchParams::default(), &Patch::Merge(&patch))).map(drop)
    };
    // Gone, or going: the worker's process is about to be stopped.
    let going = || match runtime.block_on(pods.get_opt(pod)) {
        Ok(Some(found)) => found.metadata.deletion_timestamp.is_some(),
        Ok(None) => true,
        Err(_) => false,
    };
    while !stop.load(Ordering::SeqCst) {
        match label("true") {
            Ok(()) => {
                tally.started.push(Instant::now());
                let end = Instant::now() + task;
                while Instant::now() < end {
                    std::thread::sleep(Duration::from_millis(500).min(end.saturating_duration_since(Instant::now())));
                    if going() {
                        tally.cut += 1;
                        return tally;
                    }
                }
                if label("false").is_err() && going() {
                    return tally;
                }
            }
            Err(kube::Error::Api(refused)) => {
                if going() {
                    return tally;
                }
                tally.refused.push((Instant::now(), refused.message));
                std::thread::sleep(Duration::from_secs(1));
            }
            Err(_) => std::thread::sleep(Duration::from_secs(1)),
        }
    }
    tally
}

/// The pods of `ns`, as the holder of `kubeconfig`.
async fn pods_as(kubeconfig: &Path, ns: &str) -> Result<Api<Pod>> {
    let kubeconfig = Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Api::namespaced(kube::Client::try_from(config)?, ns))
}
