//! Node deletes: refused from under busy pods; the cloud node lifecycle controller and
//! Karpenter go through. Karpenter's NodeClaim deletes: its consolidation waits for busy pods,
//! its other ends go through.

use std::path::Path;
use std::time::Duration;

use anyhow::{Result, ensure};
use serde_json::json;

use crate::rig::{ROOT, Rig, eventually};
use crate::workers::{self, flip};

/// A person's `kubectl delete node` is refused (429) while a busy pod runs there; the cloud node
/// lifecycle controller (as upstream cloud-provider names it: `node-controller`) deletes it.
pub fn a_busy_node_stays_but_the_cloud_node_lifecycle_controller_deletes_it(rig: &Rig) -> Result<()> {
    refused_to_a_person_but_not_to(rig, "cloud", "system:serviceaccount:kube-system:node-controller")
}

/// The same for Karpenter, whose DELETE of a node starts its termination (finalizer, taint,
/// then evictions, which busyguard refuses one by one).
pub fn a_busy_node_stays_but_karpenter_deletes_it(rig: &Rig) -> Result<()> {
    rig.grant_cluster(
        "e2e-karpenter",
        json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "delete"]}]),
        "karpenter",
        "karpenter",
    )?;
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

const NODE_CLAIMS: &str = "nodeclaims.karpenter.sh";
const KARPENTER: &str = "system:serviceaccount:kube-system:karpenter";

/// Karpenter's NodeClaim CRD as v1.14.1 ships it (../shared/peers): the disruption queue's delete
/// of a NodeClaim it consolidates (its `DisruptionReason` condition set, `Underutilized`, as the
/// queue sets it before the delete), decided while the node was idle, is refused once a pod there
/// has turned busy, and goes once the pod is idle again; the delete of an expired NodeClaim (no
/// such condition) goes at once, audited.
pub fn karpenters_consolidation_of_a_node_claim_waits_for_its_busy_pod(rig: &Rig) -> Result<()> {
    let crd = Path::new(ROOT).join("../shared/peers/karpenter-v1.14.1/pkg/apis/crds/karpenter.sh_nodeclaims.yaml");
    if !crd.exists() {
        println!("e2e: skipped: Karpenter's CRDs are not in ../shared/peers (a clone without ../shared)");
        return Ok(());
    }
    rig.kubectl(&["delete", "crd", NODE_CLAIMS, "--ignore-not-found", "--wait=true"])?;
    // Its schema carries fields 1.28 does not know (`x-kubernetes-validations` it does; others
    // not): created without client-side validation, the API server drops them.
    rig.kubectl(&["create", "--validate=false", "-f", &crd.to_string_lossy()])?;
    rig.established(NODE_CLAIMS)?;
    let outcome = consolidation_waits(rig);
    let _ = rig.kubectl(&["delete", "crd", NODE_CLAIMS, "--ignore-not-found", "--wait=false"]);
    outcome
}

fn consolidation_waits(rig: &Rig) -> Result<()> {
    rig.grant_cluster(
        "e2e-karpenter-node-claims",
        json!([{"apiGroups": ["karpenter.sh"], "resources": ["nodeclaims"], "verbs": ["get", "delete"]}]),
        "kube-system",
        "karpenter",
    )?;
    let ns = rig.namespace("node-claims")?;
    let node = "e2e-node-claimed";
    rig.node(node, "4")?;
    workers::start(rig, &workers::pod(&ns, "task", Some(node)), "task", 1)?;
    workers::start(rig, &workers::pod(&ns, "next", Some(node)), "next", 1)?;
    // Karpenter decides on an idle node; its pod takes a task before the delete comes.
    node_claim(rig, "default-consolidated", node, Some("Underutilized"))?;
    flip(rig, &ns, "task", true)?;
    std::thread::sleep(Duration::from_secs(1));
    let delete = ["delete", NODE_CLAIMS, "default-consolidated", "--wait=false"];
    let (ok, _, err) = rig.try_kubectl_as(KARPENTER, &delete)?;
    ensure!(!ok, "Karpenter's consolidation deleted a NodeClaim whose node runs a busy pod");
    ensure!(
        err.contains("TooManyRequests") && err.contains("is being disrupted (Underutilized)") && err.contains("task"),
        "the refusal does not say why: {err}"
    );
    flip(rig, &ns, "task", false)?;
    eventually("the NodeClaim deleted once its node's pod is idle", Duration::from_secs(15), || {
        Ok(rig.try_kubectl_as(KARPENTER, &delete)?.0)
    })?;

    // The refusal held `task` from new tasks for a while; another pod there takes one.
    flip(rig, &ns, "next", true)?;
    node_claim(rig, "default-expired", node, None)?;
    // busyguard's view has seen the flip (a watch event, milliseconds; asserted by the refusal
    // above in the other case).
    std::thread::sleep(Duration::from_secs(1));
    let (ok, _, err) = rig.try_kubectl_as(KARPENTER, &["delete", NODE_CLAIMS, "default-expired", "--wait=false"])?;
    ensure!(ok, "an expired NodeClaim's delete was refused: {err}");
    eventually("the NodeClaim ended with a busy pod on its node in the audit log", Duration::from_secs(5), || {
        Ok(rig.audit().into_iter().any(|l| l["name"] == "default-expired" && l["reason"] == "node-claim-ending"))
    })
}

/// A NodeClaim as Karpenter keeps it once its node registered, disrupted for `reason` if given
/// (the condition its disruption queue sets before the delete).
fn node_claim(rig: &Rig, name: &str, node: &str, reason: Option<&str>) -> Result<()> {
    rig.apply(&json!({"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "metadata": {"name": name},
        "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
            "requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}}))?;
    let now = jiff::Timestamp::now().to_string();
    let conditions: Vec<_> = reason
        .into_iter()
        .map(|reason| {
            json!({"type": "DisruptionReason", "status": "True",
        "reason": reason, "message": "consolidation", "lastTransitionTime": now})
        })
        .collect();
    let status = json!({"status": {"nodeName": node, "providerID": format!("aws:///us-east-1a/i-{name}"),
        "conditions": conditions}});
    rig.kubectl(&["patch", NODE_CLAIMS, name, "--subresource=status", "--type=merge", "-p", &status.to_string()])?;
    Ok(())
}
