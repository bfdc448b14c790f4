//! Node deletes: refused from under busy pods; the cloud node lifecycle controller and
//! Karpenter go through. Karpenter's NodeClaim deletes: its consolidation waits for busy pods,
//! its other ends go through.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::rig::{ROOT, Rig, eventually};
use crate::workers::{self, flip, label};

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
/// such condition) goes at once, audited. While a consolidation is in flight (the condition
/// kept), its expiry and a person's delete still go. Karpenter's delete of a spot NodeClaim for
/// no reason of its own (its interruption handler's, on the cloud's reclaim notice) lets the busy
/// pod go: its `do-not-disrupt` and protected label come off, and Karpenter's drain evicts it,
/// audited `interrupted`.
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
        json!([{"apiGroups": ["karpenter.sh"], "resources": ["nodeclaims"], "verbs": ["get", "delete"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]},
            {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}]),
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
    })?;
    other_ends_while_a_consolidation_is_in_flight(rig, &ns, node)?;
    karpenters_pod_deletion_cost_is_answered(rig, &ns)?;
    a_spot_interruption_gives_the_busy_task_its_sigterm(rig, &ns)
}

/// Karpenter's `PodDeletionCostManagement` clears the deletion cost of the pods on a node with a
/// `do-not-disrupt` pod: busyguard puts the busy cost back in the same write, audits it, counts
/// it, and `/status` names Karpenter.
fn karpenters_pod_deletion_cost_is_answered(rig: &Rig, ns: &str) -> Result<()> {
    const COST: &str = "controller.kubernetes.io/pod-deletion-cost";
    let cost = |rig: &Rig| -> Result<Value> {
        Ok(rig.pod(ns, "next")?.context("the busy pod")?["metadata"]["annotations"][COST].clone())
    };
    let busy_cost = cost(rig)?;
    ensure!(busy_cost.is_string(), "the busy pod has no deletion cost: {busy_cost}");
    let clear = json!({"metadata": {"annotations": {COST: null}}}).to_string();
    rig.try_kubectl_as(KARPENTER, &["-n", ns, "patch", "pod", "next", "--type=merge", "-p", &clear])?;
    ensure!(cost(rig)? == busy_cost, "Karpenter's clear of the busy pod's cost stuck: {}", cost(rig)?);
    eventually("the overwrite audited, counted and named on /status", Duration::from_secs(10), || {
        let audited = rig.audit().into_iter().any(|l| {
            l["name"] == "next" && l["decision"] == "restored" && l["reason"] == "overwritten" && l["user"] == KARPENTER
        });
        let counted = rig.metrics().iter().flat_map(|m| m.lines().map(String::from).collect::<Vec<_>>()).any(|l| {
            l.strip_prefix("busyguard_busy_marks_overwritten_total ").and_then(|n| n.parse::<f64>().ok()) >= Some(1.0)
        });
        let named = rig.statuses().iter().any(|s| s.contains(&format!("{KARPENTER} took {COST} off busy pod")));
        Ok(audited && counted && named)
    })
}

/// A consolidation decided, its condition kept on the NodeClaim: the NodeClaim's expiry
/// (`expireAfter` passed) and a person's delete are not Karpenter's choice, and go.
fn other_ends_while_a_consolidation_is_in_flight(rig: &Rig, ns: &str, node: &str) -> Result<()> {
    ensure!(rig.pod(ns, "next")?.is_some_and(|p| label(&p, "busyguard.io/busy").as_deref() == Some("true")));
    node_claim_with(rig, "default-aged", node, Some("Underutilized"), json!({"spec": {"expireAfter": "2s"}}))?;
    std::thread::sleep(Duration::from_secs(3));
    let (ok, _, err) = rig.try_kubectl_as(KARPENTER, &["delete", NODE_CLAIMS, "default-aged", "--wait=false"])?;
    ensure!(ok, "Karpenter's expiry of a NodeClaim mid-consolidation was refused: {err}");
    node_claim(rig, "default-by-hand", node, Some("Underutilized"))?;
    let (ok, _, err) = rig.try_kubectl(&["delete", NODE_CLAIMS, "default-by-hand", "--wait=false"])?;
    ensure!(ok, "a person's delete of a NodeClaim mid-consolidation was refused: {err}");
    Ok(())
}

fn a_spot_interruption_gives_the_busy_task_its_sigterm(rig: &Rig, ns: &str) -> Result<()> {
    let node = "e2e-node-spot";
    rig.node(node, "4")?;
    workers::start(rig, &workers::pod(ns, "on-spot", Some(node)), "on-spot", 1)?;
    flip(rig, ns, "on-spot", true)?;
    let spot = json!({"metadata": {"labels": {"karpenter.sh/capacity-type": "spot"}}});
    node_claim_with(rig, "spot-reclaimed", node, None, spot)?;
    std::thread::sleep(Duration::from_secs(1));
    let (ok, _, err) = rig.try_kubectl_as(KARPENTER, &["delete", NODE_CLAIMS, "spot-reclaimed", "--wait=false"])?;
    ensure!(ok, "Karpenter's delete of an interrupted spot NodeClaim was refused: {err}");
    let mut seen = None;
    eventually("the busy pod on the reclaimed node is let go", Duration::from_secs(15), || {
        seen = rig.pod(ns, "on-spot")?.map(|p| p["metadata"].clone());
        Ok(seen.as_ref().is_some_and(|m| {
            m["annotations"]["busyguard.io/interrupted"] == "spot-reclaimed"
                && m["annotations"].get("karpenter.sh/do-not-disrupt").is_none()
                && m["labels"].get("busyguard.io/protected").is_none()
        }))
    })
    .with_context(|| format!("the pod: {seen:?}"))?;
    let (evicted, said) = rig.evict_as(Some(KARPENTER), ns, "on-spot")?;
    ensure!(evicted, "Karpenter's drain of the reclaimed node could not evict the busy pod: {said}");
    eventually("the NodeClaim and the eviction audited interrupted", Duration::from_secs(5), || {
        let audit = rig.audit();
        let said = |name: &str| audit.iter().any(|l| l["name"] == name && l["reason"] == "interrupted");
        Ok(said("spot-reclaimed") && said("on-spot"))
    })
}

/// A NodeClaim as Karpenter keeps it once its node registered, disrupted for `reason` if given
/// (the condition its disruption queue sets before the delete).
fn node_claim(rig: &Rig, name: &str, node: &str, reason: Option<&str>) -> Result<()> {
    node_claim_with(rig, name, node, reason, json!({}))
}

/// As [`node_claim`], with `more` of its spec (`expireAfter`) and metadata (its capacity type's
/// label): `{"spec": {…}, "metadata": {…}}`.
fn node_claim_with(rig: &Rig, name: &str, node: &str, reason: Option<&str>, more: Value) -> Result<()> {
    let mut claim = json!({"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "metadata": {"name": name},
        "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
            "requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}});
    for part in ["spec", "metadata"] {
        let fields = more[part].as_object().cloned().unwrap_or_default();
        claim[part].as_object_mut().context("the NodeClaim")?.extend(fields);
    }
    rig.apply(&claim)?;
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
