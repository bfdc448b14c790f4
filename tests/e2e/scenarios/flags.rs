//! The busy flag and busyguard's marks: who may write what on an opted-in pod.

use std::time::Duration;

use anyhow::{Result, ensure};
use serde_json::json;

use crate::rig::{Rig, kubectl, throughout};
use crate::workers::{self, annotation, label};

/// A worker's token (bound to its pod) may flip its own busy label; not another pod's, not
/// another label of its own, not busy-since, not do-not-disrupt on an idle pod (except in a
/// namespace labelled own-flags=false, whose workers are said to have no pod write). And
/// busyguard's own writes to that pod go through.
pub fn a_workers_own_token_flips_its_own_label_and_nothing_else(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("own-flag")?;
    rig.kubectl(&["-n", &ns, "create", "serviceaccount", "worker"])?;
    rig.grant(&ns, "flags", "get,patch", "pods", &format!("{}:worker", &*ns))?;
    for name in ["me", "neighbour"] {
        let mut pod = workers::pod(&ns, name, None);
        pod["spec"]["serviceAccountName"] = json!("worker");
        workers::start(rig, &pod, name, 1)?;
    }
    let token = rig.pod_token(&ns, "worker", "me")?;
    let me = rig.kubeconfig_for(&format!("{}-me", &*ns), &token)?;
    let as_me = |args: &[&str]| {
        let mut all = vec!["-n", &*ns];
        all.extend_from_slice(args);
        kubectl(&me, &all)
    };
    let (ok, _, err) = as_me(&["label", "pod", "me", "busyguard.io/busy=true", "--overwrite"])?;
    ensure!(ok, "the worker could not flip its own label: {err}");
    let since = annotation(&rig.pod(&ns, "me")?.unwrap(), "busyguard.io/busy-since");
    ensure!(since.is_some(), "its flip was not annotated");
    for (what, args) in [
        ("another pod's label", vec!["label", "pod", "neighbour", "busyguard.io/busy=true", "--overwrite"]),
        ("another label of its own", vec!["label", "pod", "me", "tier=gold"]),
        ("do-not-disrupt on an idle pod", vec!["annotate", "pod", "neighbour", "karpenter.sh/do-not-disrupt=true"]),
    ] {
        let (ok, _, err) = as_me(&args)?;
        ensure!(!ok, "the worker could change {what}");
        ensure!(
            err.contains("Forbidden") && err.contains("pod-flags.busyguard.io"),
            "{what}: not refused by busyguard: {err}"
        );
    }
    // Where workers are said to have no pod write, writes to idle pods are not judged.
    rig.kubectl(&["label", "namespace", &ns, "busyguard.io/own-flags=false"])?;
    crate::rig::eventually("idle pods' writes no longer judged", Duration::from_secs(10), || {
        Ok(as_me(&["annotate", "pod", "neighbour", "team=b", "--overwrite"])?.0)
    })?;
    // busy-since is busyguard's: a write that moves it keeps the flip's time.
    as_me(&["annotate", "pod", "me", "busyguard.io/busy-since=2020-01-01T00:00:00Z", "--overwrite"])?;
    let after = annotation(&rig.pod(&ns, "me")?.unwrap(), "busyguard.io/busy-since");
    ensure!(after == since, "the worker moved its busy-since from {since:?} to {after:?}");
    // busyguard's own write to the worker's pod: the mark of a person's deferred delete.
    let (ok, _, _) = rig.try_kubectl(&["-n", &ns, "delete", "pod", "me", "--wait=false"])?;
    ensure!(!ok, "the delete of the busy pod went through");
    crate::rig::eventually("busyguard's mark on the worker's pod", Duration::from_secs(10), || {
        Ok(rig.pod(&ns, "me")?.is_some_and(|p| annotation(&p, "busyguard.io/delete-requested").is_some()))
    })?;
    ensure!(label(&rig.pod(&ns, "neighbour")?.unwrap(), "busyguard.io/busy").as_deref() == Some("false"));
    Ok(())
}

/// A mark (its label and annotation) written by anyone else, even under busyguard's
/// field-manager name, is refused, on a busy pod and on an idle one; half a mark (the annotation
/// alone) is let through and never carried out: neither pod is deleted when idle.
pub fn a_delete_requested_mark_only_busyguard_may_write(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("forged-mark")?;
    workers::start(rig, &workers::pod(&ns, "task", None), "task", 1)?;
    workers::start(rig, &workers::pod(&ns, "idle", None), "idle", 1)?;
    workers::flip(rig, &ns, "task", true)?;
    let mark = r#"{"by":"alice","at":"2026-01-01T00:00:00Z"}"#;
    let whole = serde_json::json!({"metadata": {"labels": {"busyguard.io/delete-requested": "true"},
        "annotations": {"busyguard.io/delete-requested": mark}}});
    for pod in ["task", "idle"] {
        let patch =
            ["-n", &ns, "patch", "pod", pod, "--type=merge", "--field-manager=busyguard", "-p", &whole.to_string()];
        let (ok, _, err) = rig.try_kubectl(&patch)?;
        ensure!(!ok, "a forged delete-requested mark was accepted on {pod}");
        ensure!(err.contains("busyguard"), "the refusal does not say why: {err}");
    }
    let half = format!("busyguard.io/delete-requested={mark}");
    rig.kubectl(&["-n", &ns, "annotate", "pod", "idle", &half, "--field-manager=busyguard"])?;
    workers::flip(rig, &ns, "task", false)?;
    throughout("neither pod is deleted", Duration::from_secs(4), || {
        Ok(rig.pod(&ns, "task")?.is_some() && rig.pod(&ns, "idle")?.is_some())
    })?;
    Ok(())
}

/// Writes busyguard would allow unchanged never reach it (matchConditions): an unrelated
/// annotation on an idle pod, the create and the delete of an idle pod; a flip to busy does.
pub fn writes_that_cannot_matter_are_not_sent_to_busyguard(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("not-sent")?;
    workers::start(rig, &workers::pod(&ns, "idle", None), "idle", 1)?;
    std::thread::sleep(Duration::from_secs(1));
    let before = rig.reviews_answered();
    for n in 0..5 {
        rig.kubectl(&["-n", &ns, "annotate", "pod", "idle", &format!("team/build={n}"), "--overwrite"])?;
    }
    rig.apply(&workers::pod(&ns, "brief", None))?;
    rig.kubectl(&["-n", &ns, "delete", "pod", "brief", "--grace-period=0"])?;
    rig.kubectl(&["-n", &ns, "delete", "pod", "idle", "--grace-period=0"])?;
    std::thread::sleep(Duration::from_secs(1));
    let after = rig.reviews_answered();
    ensure!(after == before, "{} reviews reached busyguard for writes that cannot matter", after - before);
    workers::start(rig, &workers::pod(&ns, "task", None), "task", 1)?;
    workers::flip(rig, &ns, "task", true)?;
    ensure!(rig.reviews_answered() > after, "the flip to busy did not reach busyguard");
    Ok(())
}

/// A flip made with server-side apply (a field manager of the worker's own) is protected like a
/// merge patch, and the flip back gives the pod its own deletion cost again: busyguard's values
/// are not pruned from under it.
pub fn a_flip_by_server_side_apply_is_protected_and_restored(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("ssa")?;
    // Made by its ReplicaSet, as a worker's pod is.
    let mut workload = workers::deployment(&ns, "task", 1);
    workload["spec"]["template"]["metadata"]["annotations"] =
        json!({"controller.kubernetes.io/pod-deletion-cost": "-5"});
    let task = workers::start(rig, &workload, "task", 1)?.remove(0);
    let apply = |busy: &str| {
        let intent = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": &task, "namespace": &*ns, "labels": {"busyguard.io/busy": busy}}});
        let path = rig.work.join(format!("{}-ssa-{busy}.json", &*ns));
        std::fs::write(&path, intent.to_string())?;
        let file = path.to_string_lossy().to_string();
        rig.kubectl(&["apply", "--server-side", "--field-manager=worker", "--force-conflicts", "-f", &file])
    };
    apply("true")?;
    let busy = rig.pod(&ns, &task)?.unwrap();
    ensure!(annotation(&busy, "busyguard.io/busy-since").is_some(), "not annotated: {}", busy["metadata"]);
    let (ok, _, _) = rig.try_kubectl(&["-n", &ns, "delete", "pod", &task, "--wait=false", "--dry-run=server"])?;
    ensure!(!ok, "a busy pod flipped by apply was not protected");
    apply("false")?;
    let idle = rig.pod(&ns, &task)?.unwrap();
    let cost = annotation(&idle, "controller.kubernetes.io/pod-deletion-cost");
    ensure!(cost.as_deref() == Some("-5"), "the pod's own cost is not back: {}", idle["metadata"]["annotations"]);
    ensure!(annotation(&idle, "busyguard.io/busy-since").is_none(), "{}", idle["metadata"]["annotations"]);
    Ok(())
}

/// With the base's fence, the API server itself refuses busyguard's own service account any
/// write or delete of a pod that is not busyguard's (none of its labels or annotations), or in
/// kube-system, any eviction there, any change of a pod's spec (an idle pod's image), and any
/// PodDisruptionBudget or Lease but its own; busyguard refuses its evictions of pods it did
/// not defer; its RBAC refuses it Leases outside its own namespace (kube-system's,
/// the nodes' heartbeats). busyguard's own writes go through (every scenario runs with the fence).
pub fn the_fence_keeps_busyguards_own_token_to_the_pods_it_guards(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("fence")?;
    let mut plain = workers::pod(&ns, "plain", None);
    plain["metadata"]["labels"] = serde_json::json!({"app": "plain"});
    workers::start(rig, &plain, "plain", 1)?;
    workers::start(rig, &workers::pod(&ns, "worker", None), "worker", 1)?;
    let busyguard = "system:serviceaccount:busyguard:busyguard";
    for (verb, pod) in [("annotate", "plain"), ("delete", "plain")] {
        let mut args = vec!["-n", &ns, verb, "pod", pod, "--dry-run=server"];
        if verb == "annotate" {
            args.push("x=y");
        }
        let (ok, _, err) = rig.try_kubectl_as(busyguard, &args)?;
        ensure!(!ok, "busyguard's token could {verb} a pod that is not busyguard's");
        ensure!(err.contains("busyguard-fence"), "not refused by the fence: {err}");
    }
    let (ok, _, err) = rig.try_kubectl_as(busyguard, &["-n", &ns, "delete", "pod", "worker", "--dry-run=server"])?;
    ensure!(ok, "busyguard's token could not delete an idle pod it guards: {err}");
    let mut system = workers::pod("kube-system", "e2e-fence", None);
    system["metadata"]["labels"]["busyguard.io/busy"] = serde_json::json!("true");
    rig.apply(&system)?;
    let args = ["-n", "kube-system", "delete", "pod", "e2e-fence", "--dry-run=server"];
    let (ok, _, err) = rig.try_kubectl_as(busyguard, &args)?;
    // Evictions: the fence keeps its token out of kube-system, and busyguard's own webhook lets it
    // evict only the pods whose eviction it deferred (the descheduler's scenario has one go).
    let (evicted_there, there) = rig.evict_as(Some(busyguard), "kube-system", "e2e-fence")?;
    rig.kubectl(&["-n", "kube-system", "delete", "pod", "e2e-fence", "--wait=false"])?;
    ensure!(!ok && err.contains("busyguard-fence"), "busyguard's token could delete a pod in kube-system: {err}");
    ensure!(
        !evicted_there && there.contains("busyguard-fence-evictions"),
        "busyguard's token could evict a pod in kube-system: {there}"
    );
    let (evicted, why) = rig.evict_as(Some(busyguard), &ns, "worker")?;
    ensure!(
        !evicted && why.contains("evicts only the pods whose eviction it deferred"),
        "busyguard's token could evict a pod whose eviction it did not defer: {why}"
    );
    let everything =
        ["-n", &ns, "create", "pdb", "payments", "--selector=app=plain", "--min-available=1", "--dry-run=server"];
    let (ok, _, err) = rig.try_kubectl_as(busyguard, &everything)?;
    ensure!(
        !ok && err.contains("busyguard-fence-objects"),
        "busyguard's token could create a PDB of its own choosing: {err}"
    );
    // Leases: its RBAC grants them in its own namespace only, and there the fence only its own.
    let lease = |namespace: &str, name: &str| -> Result<(bool, String)> {
        let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name, "namespace": namespace}});
        let path = rig.work.join(format!("{namespace}-{name}-lease.json"));
        std::fs::write(&path, lease.to_string())?;
        let file = path.to_string_lossy().to_string();
        let (ok, _, err) = rig.try_kubectl_as(busyguard, &["create", "-f", &file, "--dry-run=server"])?;
        Ok((ok, err))
    };
    for namespace in ["kube-system", "kube-node-lease", &*ns] {
        let (ok, err) = lease(namespace, "kube-scheduler")?;
        ensure!(!ok && err.contains("forbidden"), "busyguard's token could create a Lease in {namespace}: {err}");
    }
    let (ok, err) = lease("busyguard", "busyguard-leader")?;
    ensure!(!ok && err.contains("busyguard-fence-objects"), "busyguard's token could create another Lease: {err}");
    let (ok, err) = lease("busyguard", &format!("busyguard-budget-{}.deployment-w", &*ns))?;
    ensure!(ok, "busyguard's token could not create a budget's Lease: {err}");
    // Pods: busyguard writes their metadata, never their spec.
    let image = ["-n", &ns, "set", "image", "pod/worker", "worker=example.com/other", "--dry-run=server"];
    let (ok, _, err) = rig.try_kubectl_as(busyguard, &image)?;
    ensure!(!ok && err.contains("busyguard-fence"), "busyguard's token could change a pod's image: {err}");
    Ok(())
}
