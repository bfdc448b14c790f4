//! Node deletes: refused from under busy pods; the cloud node lifecycle controller and
//! Karpenter go through.

use anyhow::{Result, ensure};
use serde_json::json;

use crate::rig::Rig;
use crate::workers::{self, flip};

/// A person's `kubectl delete node` is refused (429) while a busy pod runs there; the cloud node
/// lifecycle controller (as upstream names it: `node-controller`) and Karpenter (whose DELETE
/// starts its termination) delete it.
pub fn busy_nodes_stay_but_for_the_cloud_controller_and_karpenter(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("nodes")?;
    rig.apply(&json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "e2e-karpenter"},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "delete"]}]}))?;
    rig.apply(&json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "e2e-karpenter"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "e2e-karpenter"},
        "subjects": [{"kind": "ServiceAccount", "name": "karpenter", "namespace": "karpenter"}]}))?;
    for (user, why) in [
        ("system:serviceaccount:kube-system:node-controller", "the cloud node lifecycle controller"),
        ("system:serviceaccount:karpenter:karpenter", "Karpenter"),
    ] {
        let node = "e2e-node-gone";
        rig.node(node, "4")?;
        let task = format!("task-{}", if why == "Karpenter" { "k" } else { "c" });
        workers::start(rig, &workers::pod(&ns, &task, Some(node)), &task, 1)?;
        flip(rig, &ns, &task, true)?;
        let (ok, _, err) = rig.try_kubectl(&["delete", "node", node, "--wait=false"])?;
        ensure!(!ok, "a person deleted a node running a busy pod");
        ensure!(err.contains("busy") && err.contains(&task), "the refusal does not name the busy pod: {err}");
        let (ok, _, err) = rig.try_kubectl_as(user, &["delete", "node", node, "--wait=false"])?;
        ensure!(ok, "{why} could not delete the node: {err}");
    }
    Ok(())
}
