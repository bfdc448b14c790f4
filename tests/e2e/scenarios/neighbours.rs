//! A shared cluster: other controllers and other tenants beside the workers, writes through
//! pods/status, and pods carrying keys of an older busyguard.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, ensure};
use serde_json::json;

use crate::rig::{Rig, eventually, kubectl, throughout};
use crate::workers::{self, annotation, flip, label};

/// A kubeconfig speaking with a token bound to `pod` of service account `sa`.
fn as_pod(rig: &Rig, ns: &str, sa: &str, pod: &str) -> Result<PathBuf> {
    let token = rig.pod_token(ns, sa, pod)?;
    rig.kubeconfig_for(&format!("{ns}-{pod}"), &token)
}

/// A controller running in a pod of its own (its own service account, a token bound to its
/// pod, as Argo Rollouts, Kyverno or Kueue run) labels a busy pod and removes its own finalizer
/// from it, as it could before busyguard: the pod then goes once idle, not stuck Terminating.
/// busy-since stays busyguard's all the same.
pub fn a_controller_removes_its_finalizer_from_a_busy_pod(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("controller")?;
    workers::grant_workers(rig, &ns, "controller")?;
    let mut controller = workers::pod(&ns, "controller", None);
    controller["metadata"]["labels"] = json!({"app": "controller"});
    controller["spec"]["serviceAccountName"] = json!("controller");
    workers::start(rig, &controller, "controller", 1)?;
    let mut task = workers::pod(&ns, "task", None);
    task["metadata"]["finalizers"] = json!(["example.com/results-saved"]);
    workers::start(rig, &task, "task", 1)?;
    flip(rig, &ns, "task", true)?;
    let since = annotation(&rig.pod(&ns, "task")?.unwrap(), "busyguard.io/busy-since");
    let me = as_pod(rig, &ns, "controller", "controller")?;
    let as_controller = |args: &[&str]| {
        let mut all = vec!["-n", &*ns];
        all.extend_from_slice(args);
        kubectl(&me, &all)
    };
    let (ok, _, err) = as_controller(&["label", "pod", "task", "rollouts-pod-template-hash=abc"])?;
    ensure!(ok, "the controller could not label the busy pod: {err}");
    let remove = r#"[{"op": "remove", "path": "/metadata/finalizers"}]"#;
    let (ok, _, err) = as_controller(&["patch", "pod", "task", "--type=json", "-p", remove])?;
    ensure!(ok, "the controller could not remove its finalizer from the busy pod: {err}");
    as_controller(&["annotate", "pod", "task", "busyguard.io/busy-since=2020-01-01T00:00:00Z", "--overwrite"])?;
    let busy = rig.pod(&ns, "task")?.unwrap();
    ensure!(annotation(&busy, "busyguard.io/busy-since") == since, "busy-since moved: {}", busy["metadata"]);
    let (ok, _, _) = rig.try_kubectl(&["-n", &ns, "delete", "pod", "task", "--dry-run=server"])?;
    ensure!(!ok, "the busy pod is no longer protected");
    flip(rig, &ns, "task", false)?;
    rig.kubectl(&["-n", &ns, "delete", "pod", "task", "--wait=false"])?;
    eventually("the pod, its finalizer gone, goes", Duration::from_secs(20), || Ok(rig.pod(&ns, "task")?.is_none()))
}

/// In a namespace without any busyguard label, with the contract's Role for workers, a worker's
/// token cannot shorten its idle neighbour's max-busy, pin it with do-not-disrupt, or give it a
/// deadline; and a max-busy below the floor, however it got there, is refused at the flip to busy
/// with a message that says the floor.
pub fn a_worker_cannot_shorten_its_neighbours_max_busy_in_a_namespace_without_any_busyguard_label(
    rig: &Rig,
) -> Result<()> {
    let ns = rig.namespace("neighbours")?;
    workers::grant_workers(rig, &ns, "worker")?;
    for name in ["me", "neighbour"] {
        let mut pod = workers::pod(&ns, name, None);
        pod["spec"]["serviceAccountName"] = json!("worker");
        workers::start(rig, &pod, name, 1)?;
    }
    let me = as_pod(rig, &ns, "worker", "me")?;
    let as_me = |args: &[&str]| {
        let mut all = vec!["-n", &*ns];
        all.extend_from_slice(args);
        kubectl(&me, &all)
    };
    let deadline = r#"{"spec": {"activeDeadlineSeconds": 5}}"#;
    for (what, args) in [
        ("shorten its max-busy", vec!["annotate", "pod", "neighbour", "busyguard.io/max-busy=1s"]),
        ("pin it with do-not-disrupt", vec!["annotate", "pod", "neighbour", "karpenter.sh/do-not-disrupt=true"]),
        ("give it a deadline", vec!["patch", "pod", "neighbour", "-p", deadline]),
        ("flip it busy", vec!["label", "pod", "neighbour", "busyguard.io/busy=true", "--overwrite"]),
    ] {
        let (ok, _, err) = as_me(&args)?;
        ensure!(!ok, "a worker could {what} of its neighbour");
        ensure!(err.contains("BusyguardNotOwnFlag") || err.contains("is not the requester's own pod"), "{what}: {err}");
    }
    let (ok, _, err) = as_me(&["label", "pod", "me", "busyguard.io/busy=true", "--overwrite"])?;
    ensure!(ok, "the worker could not flip its own label: {err}");
    // Someone allowed to (the admin here) sets a max-busy below the floor: the flip says so.
    rig.kubectl(&["-n", &ns, "annotate", "pod", "neighbour", "busyguard.io/max-busy=1s"])?;
    let (ok, _, err) =
        rig.try_kubectl(&["-n", &ns, "label", "pod", "neighbour", "busyguard.io/busy=true", "--overwrite"])?;
    ensure!(!ok, "a flip to busy with max-busy 1s went through");
    ensure!(err.contains("is below the cluster's floor of 1m"), "{err}");
    let neighbour = rig.pod(&ns, "neighbour")?.unwrap();
    ensure!(label(&neighbour, "busyguard.io/busy").as_deref() == Some("false"), "{}", neighbour["metadata"]);
    Ok(())
}

/// Through pods/status (which no mutating webhook sees) a delete-requested mark, even under
/// busyguard's field manager, and busy-since moved or the protected label taken off a busy pod
/// are refused, so never honoured: the idle pod is not deleted, the busy one stays protected. A
/// status write of the kubelet's kind goes through.
pub fn a_mark_or_busy_since_written_through_pods_status_is_refused(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("status")?;
    workers::start(rig, &workers::pod(&ns, "task", None), "task", 1)?;
    workers::start(rig, &workers::pod(&ns, "idle", None), "idle", 1)?;
    flip(rig, &ns, "task", true)?;
    let status_patch = |pod: &str, patch: serde_json::Value, manager: &str| {
        let manager = format!("--field-manager={manager}");
        let args = ["-n", &ns, "patch", "pod", pod, "--subresource=status", "--type=merge", &manager, "-p"];
        let mut args = args.to_vec();
        let patch = patch.to_string();
        args.push(&patch);
        rig.try_kubectl(&args)
    };
    let mark = json!({"metadata": {"labels": {"busyguard.io/delete-requested": "true"},
        "annotations": {"busyguard.io/delete-requested": r#"{"by":"alice","at":"2026-01-01T00:00:00Z"}"#}}});
    let moved = json!({"metadata": {"annotations": {"busyguard.io/busy-since": "2020-01-01T00:00:00Z"}}});
    let unprotected = json!({"metadata": {"labels": {"busyguard.io/protected": null}}});
    for (what, pod, patch) in
        [("a mark", "idle", mark), ("busy-since moved", "task", moved), ("protection off", "task", unprotected)]
    {
        let (ok, _, err) = status_patch(pod, patch, "busyguard")?;
        ensure!(!ok, "{what} through pods/status went through");
        ensure!(err.contains("only busyguard writes"), "{what}: not refused by busyguard: {err}");
    }
    let condition = json!({"status": {"conditions": [{"type": "example.com/Checked", "status": "True"}]}});
    let (ok, _, err) = status_patch("task", condition, "kubelet")?;
    ensure!(ok, "a status write of the kubelet's kind was refused: {err}");
    let (ok, _, _) = rig.try_kubectl(&["-n", &ns, "delete", "pod", "task", "--dry-run=server"])?;
    ensure!(!ok, "the busy pod is no longer protected");
    throughout("the idle pod is not deleted", Duration::from_secs(3), || Ok(rig.pod(&ns, "idle")?.is_some()))
}

/// A pod still carrying a key busyguard no longer reads (readiness mode as the annotation of
/// versions before 0.2.0) is warned about: in `busyguard status`, in
/// `busyguard_workload_pods_with_retired_keys`, and in the answer to a write that reaches
/// busyguard.
pub fn a_pod_with_a_key_of_an_older_version_is_warned_about(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("upgrade")?;
    let mut old = workers::pod(&ns, "old", None);
    old["metadata"]["annotations"] = json!({"busyguard.io/busy-when-unready": "true"});
    workers::start(rig, &old, "old", 1)?;
    let output = std::process::Command::new(crate::rig::BUSYGUARD)
        .args(["status", "-n", &ns, "--kubeconfig"])
        .arg(&rig.admin)
        .output()?;
    let said = String::from_utf8_lossy(&output.stdout);
    ensure!(said.contains("busyguard.io/busy-when-unready is no longer read"), "busyguard status: {said}");
    let series = format!("busyguard_workload_pods_with_retired_keys{{namespace=\"{}\",workload=\"Pod/old\"}} 1", &*ns);
    eventually("the gauge of pods with retired keys", Duration::from_secs(20), || {
        Ok(rig.metrics().iter().any(|m| m.contains(&series)))
    })?;
    let (ok, _, err) = rig.try_kubectl(&["-n", &ns, "label", "pod", "old", "busyguard.io/busy=true", "--overwrite"])?;
    ensure!(ok && err.contains("Warning: busyguard: annotation busyguard.io/busy-when-unready"), "{err}");
    Ok(())
}
