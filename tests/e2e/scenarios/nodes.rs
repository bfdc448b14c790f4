//! Node deletes: refused from under busy pods; the cloud node lifecycle controller and
//! Karpenter go through.

use anyhow::{Result, ensure};
use serde_json::json;

use crate::rig::Rig;
use crate::workers::{self, flip};

/// A person's `kubectl delete node` is refused (429) while a busy pod runs there; the cloud node
/// lifecycle controller (as upstream cloud-provider names it: `node-controller`) deletes it.
pub fn a_busy_node_stays_but_the_cloud_node_lifecycle_controller_deletes_it(rig: &Rig) -> Result<()> {
    refused_to_a_person_but_not_to(rig, "cloud", "system:serviceaccount:kube-system:node-controller")
}

/// The same for Karpenter, whose DELETE of a node starts its termination (finalizer, taint,
/// then evictions, which busyguard refuses one by one).
pub fn a_busy_node_stays_but_karpenter_deletes_it(rig: &Rig) -> Result<()> {
    rig.apply(&json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "e2e-karpenter"},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "delete"]}]}))?;
    rig.apply(&json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "e2e-karpenter"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "e2e-karpenter"},
        "subjects": [{"kind": "ServiceAccount", "name": "karpenter", "namespace": "karpenter"}]}))?;
    refused_to_a_person_but_not_to(rig, "karpenter", "system:serviceaccount:karpenter:karpenter")
}

fn refused_to_a_person_but_not_to(rig: &Rig, name: &str, user: &str) -> Result<()> {
    let ns = rig.namespace(&format!("node-{name}"))?;
    let node = format!("e2e-node-{name}");
    rig.node(&node, "4")?;
    workers::start(rig, &workers::pod(&ns, "task", Some(&node)), "task", 1)?;
    flip(rig, &ns, "task", true)?;
    let (ok, _, err) = rig.try_kubectl(&["delete", "node", &node, "--wait=false"])?;
    ensure!(!ok, "a person deleted a node running a busy pod");
    ensure!(err.contains("busy") && err.contains("task"), "the refusal does not name the busy pod: {err}");
    let (ok, _, err) = rig.try_kubectl_as(user, &["delete", "node", &node, "--wait=false"])?;
    ensure!(ok, "{user} could not delete the node: {err}");
    Ok(())
}
