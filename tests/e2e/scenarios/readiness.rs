//! Compatibility mode: readiness as the busy signal (`busyguard.io/busy: when-unready`).

use std::time::Duration;

use anyhow::{Result, ensure};
use serde_json::json;

use crate::rig::{Rig, eventually};
use crate::workers::{self, annotation, label};

/// Turns a Ready pod NotReady, and so busy in readiness mode. This kubelet turns a pod Ready as
/// it starts it; a real one only after a probe, and NotReady again a probe period (at least a
/// second) later. Busy is NotReady after having been Ready.
pub fn turn_not_ready(rig: &Rig, ns: &str, pod: &str) -> Result<()> {
    std::thread::sleep(Duration::from_millis(1100));
    rig.kubectl(&["-n", ns, "annotate", "pod", pod, "k8s-local/ready=false", "--overwrite"])?;
    eventually("the pod turns NotReady", Duration::from_secs(20), || {
        Ok(rig.pod(ns, pod)?.is_some_and(|p| !workers::is_ready(&p)))
    })
}

/// The released `pod` turns Ready: busyguard deletes it, and audits it once across the two
/// replicas.
fn once_ready_reaped_exactly_once(rig: &Rig, ns: &str, pod: &str) -> Result<()> {
    rig.kubectl(&["-n", ns, "annotate", "pod", pod, "k8s-local/ready=true", "--overwrite"])?;
    eventually("the released pod goes once Ready", Duration::from_secs(30), || Ok(rig.pod(ns, pod)?.is_none()))?;
    std::thread::sleep(Duration::from_secs(2));
    let reaped = rig.audited(ns, pod, "deleted-when-idle");
    ensure!(reaped.len() == 1, "the released pod was deleted {} times, not once", reaped.len());
    Ok(())
}

/// A scale-down that picks a busy (NotReady) pod completes: busyguard releases the pod from its
/// ReplicaSet, and deletes it once it is Ready again, exactly once.
pub fn a_busy_unready_pod_is_released_from_its_replicaset_then_reaped_once(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("readiness")?;
    let mut workload = workers::deployment(&ns, "worker", 2);
    workload["spec"]["template"]["metadata"]["labels"]["busyguard.io/busy"] = json!("when-unready");
    let pods = workers::start(rig, &workload, "worker", 2)?;
    let busy = &pods[0];
    turn_not_ready(rig, &ns, busy)?;
    rig.kubectl(&["-n", &ns, "scale", "deployment/worker", "--replicas=1"])?;
    eventually("busyguard releases the busy pod from its ReplicaSet", Duration::from_secs(30), || {
        Ok(rig.pod(&ns, busy)?.is_some_and(|p| {
            label(&p, "pod-template-hash").is_none()
                && annotation(&p, "busyguard.io/released-from").is_some()
                && p["metadata"]["ownerReferences"].as_array().is_none_or(|o| o.is_empty())
        }))
    })?;
    eventually("the scale-down completes", Duration::from_secs(30), || {
        let deployment = rig.get(&["-n", &ns, "deployment", "worker"])?;
        Ok(deployment["status"]["replicas"] == 1 && deployment["status"]["readyReplicas"] == 1)
    })?;
    ensure!(rig.pod(&ns, busy)?.is_some(), "the busy pod was deleted");
    once_ready_reaped_exactly_once(rig, &ns, busy)
}

/// An Argo Rollout's ReplicaSet (its pods selected by `rollouts-pod-template-hash`, the
/// ReplicaSet owned by a Rollout, as Argo makes them) scaled down as Argo does it: busyguard
/// prepares the scale-down (audited), and the busy (NotReady) pod the ReplicaSet controller picks
/// is released from the ReplicaSet and deleted once Ready, exactly once.
pub fn an_argo_rollouts_replicaset_releases_and_reaps_like_a_deployments(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("argo")?;
    let crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "rollouts.argoproj.io"},
        "spec": {"group": "argoproj.io", "scope": "Namespaced",
            "names": {"plural": "rollouts", "singular": "rollout", "kind": "Rollout"},
            "versions": [{"name": "v1alpha1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}});
    rig.apply(&crd)?;
    eventually("the Rollout kind is served", Duration::from_secs(30), || {
        Ok(rig.try_kubectl(&["get", "rollouts", "-A"])?.0)
    })?;
    rig.apply(&json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
        "metadata": {"name": "worker", "namespace": &*ns}, "spec": {}}))?;
    let uid = rig.get(&["-n", &ns, "rollout", "worker"])?["metadata"]["uid"].clone();
    let labels = json!({"app": "worker", "rollouts-pod-template-hash": "7d9c4f", "busyguard.io/busy": "when-unready"});
    let replica_set = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "worker-7d9c4f", "namespace": &*ns, "labels": labels,
            "ownerReferences": [{"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "name": "worker",
                "uid": uid, "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "worker", "rollouts-pod-template-hash": "7d9c4f"}},
            "template": {"metadata": {"labels": labels},
                "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "worker", "image": "example.com/worker"}]}}}});
    let pods = workers::start(rig, &replica_set, "worker", 2)?;
    let busy = &pods[0];
    turn_not_ready(rig, &ns, busy)?;
    // Argo scales its ReplicaSets itself, with an update of the ReplicaSet.
    rig.kubectl(&["-n", &ns, "scale", "replicaset/worker-7d9c4f", "--replicas=1"])?;
    eventually("busyguard releases the busy pod from the Rollout's ReplicaSet", Duration::from_secs(30), || {
        Ok(rig.pod(&ns, busy)?.is_some_and(|p| {
            label(&p, "rollouts-pod-template-hash").is_none()
                && annotation(&p, "busyguard.io/released-from").as_deref() == Some("7d9c4f")
        }))
    })?;
    eventually("the scale-down completes", Duration::from_secs(30), || {
        let replica_set = rig.get(&["-n", &ns, "replicaset", "worker-7d9c4f"])?;
        Ok(replica_set["status"]["replicas"] == 1)
    })?;
    ensure!(!rig.audited(&ns, "worker-7d9c4f", "scale-down").is_empty(), "the scale-down was not prepared");
    once_ready_reaped_exactly_once(rig, &ns, busy)
}
