//! The workloads the scenarios run: opted-in workers, and what a worker does (flip its label).

use std::time::Duration;

use anyhow::Result;
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
