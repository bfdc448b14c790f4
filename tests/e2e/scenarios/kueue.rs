//! Kueue's preemption held where the namespace asks (`--hold-kueue-preemption`,
//! `busyguard.io/hold-preemption=true`), on Kueue's own Workload CRD (../shared/peers), with
//! Kueue's requests as its source makes them: the job reconciler's Workload for the Job, the
//! scheduler's admission, the preemptor's `Evicted` condition (reason `Preempted`), and the job
//! reconciler's suspend of the Job. The Job controller is the control plane's own.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use super::jobs::{job, job_pods};
use super::owner_chains::controller;
use crate::rig::{ROOT, Rig, eventually, throughout};
use crate::workers::{flip, label};

const WORKLOAD_CRD: &str = "kueue-v0.19.2/config/components/crd/bases/kueue.x-k8s.io_workloads.yaml";

/// A busy pod of a Job whose Workload Kueue preempted, in a namespace that holds preemptions:
/// the Job controller's delete (after Kueue suspends the Job) is refused while the pod is busy,
/// and goes at its next idle moment. In a namespace that does not ask, the same preemption
/// takes the busy pod at once, as the Job's own end. Before its RBAC is granted, `/status` and
/// `busyguard_kueue_hold_followed` say the hold is off, and why. Needs ../shared (skipped, and
/// said, without it).
pub fn kueues_preemption_waits_for_a_busy_pod_where_the_namespace_asks(rig: &Rig) -> Result<()> {
    let crd = Path::new(ROOT).join("../shared/peers").join(WORKLOAD_CRD);
    let Some(crd) = crd.is_file().then_some(crd) else {
        println!("e2e: skipped: Kueue's CRDs are not in ../shared/peers (a clone without ../shared)");
        return Ok(());
    };
    rig.install_crd(&crd)?;
    // The hold on before its RBAC: said on /status and in the metric, not only in a log line.
    rig.kubectl(&["delete", "clusterrolebinding,clusterrole", "busyguard-kueue", "--ignore-not-found"])?;
    rig.install_with_args(&[], &["--hold-kueue-preemption=true".to_string()])?;
    let unfollowed = "--hold-kueue-preemption: Kueue's preemptions are not held (Kueue's Workloads: its list: 403";
    eventually("/status says the hold has no RBAC", Duration::from_secs(30), || {
        Ok(rig.statuses().iter().all(|s| s.contains(unfollowed) && s.contains("forbidden")))
    })
    .with_context(|| format!("/status: {:?}", rig.statuses()))?;
    ensure!(
        rig.metrics().iter().all(|m| m.lines().any(|l| l == "busyguard_kueue_hold_followed 0")),
        "busyguard_kueue_hold_followed is not 0 without RBAC"
    );
    let checked = std::process::Command::new(crate::rig::BUSYGUARD)
        .args(["check", "-n", "default", "--timeout", "60s", "--kubeconfig"])
        .arg(&rig.admin)
        .output()?;
    let said = String::from_utf8_lossy(&checked.stdout);
    ensure!(
        checked.status.success() && said.contains("may not watch Kueue's Workloads"),
        "busyguard check did not warn of the hold's missing RBAC: {said}"
    );
    let read = json!(["get", "list", "watch"]);
    rig.grant_cluster(
        "busyguard-kueue",
        json!([{"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": read}]),
        "busyguard",
        "busyguard",
    )?;
    eventually("the hold followed once granted", Duration::from_secs(90), || {
        Ok(rig.statuses().iter().all(|s| !s.contains("--hold-kueue-preemption")))
    })?;
    let outcome = held_where_asked(rig);
    rig.install_release(Path::new(ROOT), None)?;
    outcome
}

fn held_where_asked(rig: &Rig) -> Result<()> {
    let held = rig.namespace("kueue-held")?;
    rig.kubectl(&["label", "namespace", &held, "busyguard.io/hold-preemption=true"])?;
    let pod = admitted_and_busy(rig, &held)?;
    preempt(rig, &held)?;
    // The Job controller deletes the suspended Job's pod, is refused, and tries again.
    eventually("the Job controller's delete refused", Duration::from_secs(30), || {
        Ok(rig.audited(&held, &pod, "denied").iter().any(|a| a["user"] == JOB_CONTROLLER))
    })
    .with_context(|| format!("audit: {:?}", rig.audit().iter().rev().take(5).collect::<Vec<_>>()))?;
    throughout("the preempted Job's busy pod stays", Duration::from_secs(5), || {
        Ok(rig.pod(&held, &pod)?.is_some_and(|p| p["metadata"]["deletionTimestamp"].is_null()))
    })?;
    // Its next idle moment (a checkpoint): the Job controller's next try takes it.
    flip(rig, &held, &pod, false)?;
    eventually("the preempted Job's pod goes once idle", Duration::from_secs(90), || {
        Ok(rig.pod(&held, &pod)?.is_none())
    })?;

    // Where the namespace does not ask, Kueue's preemption is the Job's own end: at once.
    let free = rig.namespace("kueue-free")?;
    let pod = admitted_and_busy(rig, &free)?;
    preempt(rig, &free)?;
    eventually("the Job's own end, at once", Duration::from_secs(30), || Ok(rig.pod(&free, &pod)?.is_none()))?;
    ensure!(
        rig.audited(&free, &pod, "exempted").iter().any(|a| a["reason"] == "owner-controller"),
        "the delete was not audited as the Job's own end"
    );
    Ok(())
}

const JOB_CONTROLLER: &str = "system:serviceaccount:kube-system:job-controller";

/// Kueue's way in: the Job created suspended (its webhook), the job reconciler's Workload owned
/// by it, the scheduler's admission (quota reserved, admitted), the Job resumed; its pod runs,
/// opted in, and its worker turns busy. Returns the pod's name.
fn admitted_and_busy(rig: &Rig, ns: &str) -> Result<String> {
    let template = json!({"metadata": {"labels": {"busyguard.io/busy": "false", "kueue.x-k8s.io/queue-name": "team"}}});
    let mut train = job(ns, "train", json!({"suspend": true, "template": template}));
    train["metadata"]["labels"] = json!({"kueue.x-k8s.io/queue-name": "team"});
    rig.apply(&train)?;
    let job = rig.get(&["-n", ns, "job", "train"])?;
    // The Job's pod template, as Kueue's podSet carries it (its labels and spec).
    let template = &job["spec"]["template"];
    let template = json!({"metadata": {"labels": template["metadata"]["labels"]}, "spec": template["spec"]});
    let pod_set = json!({"name": "main", "count": 1, "template": template});
    rig.apply(&json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": "job-train-7c2d1", "namespace": ns, "ownerReferences": [controller(&job)],
            "labels": {"kueue.x-k8s.io/job-uid": job["metadata"]["uid"]}},
        "spec": {"queueName": "team", "podSets": [pod_set]}}))?;
    let admission = json!({"clusterQueue": "cluster-queue",
        "podSetAssignments": [{"name": "main", "count": 1, "flavors": {"cpu": "default-flavor"}}]});
    workload_status(
        rig,
        ns,
        json!({"admission": admission, "conditions": [
        condition("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue cluster-queue"),
        condition("Admitted", "True", "Admitted", "The workload is admitted")]}),
    )?;
    rig.kubectl(&["-n", ns, "patch", "job", "train", "--type=merge", "-p", r#"{"spec":{"suspend":false}}"#])?;
    let mut pod = Value::Null;
    eventually("the admitted Job's pod runs", Duration::from_secs(60), || {
        pod = job_pods(rig, ns, "train")?.into_iter().find(|p| p["status"]["phase"] == "Running").unwrap_or_default();
        Ok(!pod.is_null())
    })?;
    let name = pod["metadata"]["name"].as_str().unwrap_or_default().to_string();
    ensure!(label(&pod, "busyguard.io/busy").as_deref() == Some("false"), "not opted in: {}", pod["metadata"]);
    flip(rig, ns, &name, true)?;
    Ok(name)
}

/// The preemptor's eviction of the Workload (its `Evicted` condition, reason `Preempted`, and
/// `Preempted`), then the job reconciler's `stopJob`: the Job suspended.
fn preempt(rig: &Rig, ns: &str) -> Result<()> {
    let current = rig.get(&["-n", ns, "workload", "job-train-7c2d1"])?;
    let mut conditions = current["status"]["conditions"].as_array().cloned().unwrap_or_default();
    conditions.push(condition(
        "Evicted",
        "True",
        "Preempted",
        "Preempted to accommodate a workload (UID: 9d1c) due to prioritization in the ClusterQueue",
    ));
    conditions.push(condition(
        "Preempted",
        "True",
        "InClusterQueue",
        "Preempted to accommodate a workload (UID: 9d1c) due to prioritization in the ClusterQueue",
    ));
    workload_status(rig, ns, json!({"admission": current["status"]["admission"], "conditions": conditions}))?;
    rig.kubectl(&["-n", ns, "patch", "job", "train", "--type=merge", "-p", r#"{"spec":{"suspend":true}}"#])?;
    Ok(())
}

/// A status write of the Workload through its status subresource: the status Kueue's
/// server-side apply of it leaves.
fn workload_status(rig: &Rig, ns: &str, status: Value) -> Result<()> {
    let mut workload = rig.get(&["-n", ns, "workload", "job-train-7c2d1"])?;
    workload["status"] = status;
    crate::rig::kubectl_stdin(&rig.admin, &["replace", "--subresource=status", "-f", "-"], &workload.to_string())
        .map(drop)
}

fn condition(kind: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({"type": kind, "status": status, "reason": reason, "message": message,
        "lastTransitionTime": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()})
}
