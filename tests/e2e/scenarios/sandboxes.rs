//! AI agent sandboxes (kubernetes-sigs/agent-sandbox v0.5.6, its own CRDs from ../shared/peers):
//! the pod of a Sandbox a SandboxClaim holds is busy, a warm one idle, as the component makes
//! them; the writes are played as that release's controllers make them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::rig::{ROOT, Rig, eventually};
use crate::workers::{self, label};

const RELEASE: &str = "agent-sandbox-v0.5.6";
const SANDBOXES: &str = "sandboxes.agents.x-k8s.io";
const CLAIMS: &str = "sandboxclaims.extensions.agents.x-k8s.io";
const POOLS: &str = "sandboxwarmpools.extensions.agents.x-k8s.io";
const KARPENTER: &str = "system:serviceaccount:kube-system:karpenter";
const NOT_FOLLOWED: &str = "--busy-when-owner agents.x-k8s.io/v1beta1/Sandbox: its owners are not followed";

/// Where `../shared` keeps agent-sandbox's CRDs, if it is there.
fn crds() -> Option<PathBuf> {
    let dir = Path::new(ROOT).join(format!("../shared/peers/{RELEASE}/k8s/crds"));
    dir.is_dir().then_some(dir)
}

/// A warm pool of two sandboxes, one claimed by an agent's SandboxClaim: the claimed one's pod
/// turns busy (Karpenter's and cluster-autoscaler's annotations on, whatever the warm pool
/// stamped), a drain and Karpenter's eviction are refused it while the warm one goes; with
/// busyguard down the busy-pod PDB still holds it; the claim deleted, its Sandbox and pod go.
/// Needs ../shared (skipped, and said, without it).
pub fn agent_sandboxes_are_busy_while_claimed_and_idle_in_the_warm_pool(rig: &Rig) -> Result<()> {
    let Some(crds) = crds() else {
        println!("e2e: skipped: agent-sandbox's CRDs are not in ../shared/peers (a clone without ../shared)");
        return Ok(());
    };
    rig.install_with(&["agent-sandbox"])?;
    let outcome = (|| {
        for crd in [SANDBOXES, CLAIMS, POOLS] {
            let (group, plural) = crd.split_once('.').map(|(plural, group)| (group, plural)).context("a CRD name")?;
            rig.install_crd(&crds.join(format!("{group}_{plural}.yaml")))?;
        }
        eventually("busyguard follows the Sandboxes", Duration::from_secs(90), || {
            let statuses = rig.statuses();
            Ok(statuses.len() == 2 && !statuses.iter().any(|s| s.contains(NOT_FOLLOWED)))
        })?;
        claimed_sandbox_guarded(rig)
    })();
    for crd in [CLAIMS, POOLS, SANDBOXES] {
        let _ = rig.kubectl(&["delete", "crd", crd, "--ignore-not-found"]);
    }
    rig.install_release(Path::new(ROOT), None)?;
    outcome
}

fn claimed_sandbox_guarded(rig: &Rig) -> Result<()> {
    let node = "e2e-sandboxes";
    rig.node(node, "4")?;
    let ns = rig.namespace("sandboxes")?;
    // The SandboxWarmPool controller's own objects: the pool, its Sandboxes (controlled by it,
    // labelled and stamped safe-to-evict), and the Sandbox controller's pod of each.
    let pool = rig
        .apply(&json!({"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
        "metadata": {"name": "python", "namespace": &*ns},
        "spec": {"replicas": 2, "sandboxTemplateRef": {"name": "python"}}}))
        .and_then(|_| rig.get(&["-n", &ns, POOLS, "python"]))?;
    for name in ["python-warm-a", "python-warm-b"] {
        warm_sandbox(rig, &ns, name, &pool, node)?;
    }
    for name in ["python-warm-a", "python-warm-b"] {
        busy(rig, &ns, name, false)?;
    }
    // An agent claims a sandbox: the claim controller adopts python-warm-a (completeAdoption),
    // then the Sandbox controller patches its pod to match.
    rig.apply(&json!({"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
        "metadata": {"name": "session-7", "namespace": &*ns}, "spec": {"warmPoolRef": {"name": "python"}}}))?;
    let claim = rig.get(&["-n", &ns, CLAIMS, "session-7"])?;
    adopt(rig, &ns, "python-warm-a", &claim)?;
    busy(rig, &ns, "python-warm-a", true)?;
    let pod = rig.pod(&ns, "python-warm-a")?.context("the claimed sandbox's pod")?;
    let annotation = |key: &str| workers::annotation(&pod, key);
    ensure!(
        annotation("karpenter.sh/do-not-disrupt").as_deref() == Some("true")
            && annotation("cluster-autoscaler.kubernetes.io/safe-to-evict").as_deref() == Some("false"),
        "the claimed sandbox's pod is not kept from the autoscalers: {}",
        pod["metadata"]["annotations"]
    );
    ensure!(
        annotation("busyguard.io/max-busy").as_deref() == Some("8h"),
        "the claimed sandbox's pod turned busy without the component's max-busy: {}",
        pod["metadata"]["annotations"]
    );
    // Karpenter's terminator evicts with its own service account, as its chart lets it.
    let evicts = json!([{"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}]);
    rig.grant_cluster("e2e-sandboxes-karpenter", evicts, "kube-system", "karpenter")?;
    let (evicted, said) = rig.evict_as(Some(KARPENTER), &ns, "python-warm-a")?;
    ensure!(!evicted && said.contains("TooManyRequests"), "Karpenter evicted a claimed sandbox: {said}");
    let (drained, _, _) = rig.try_kubectl(&["drain", node, "--force", "--ignore-daemonsets", "--timeout=10s"])?;
    ensure!(!drained, "a drain took a claimed sandbox");
    ensure!(rig.pod(&ns, "python-warm-b")?.is_none(), "the drain did not take the warm sandbox");
    ensure!(rig.pod(&ns, "python-warm-a")?.is_some(), "the drain took the claimed sandbox");

    // busyguard down: the busy-pod PDB holds the claimed sandbox.
    rig.busy_pdb_made(&ns)?;
    rig.scale_busyguard(0)?;
    let down = (|| {
        let (evicted, said) = rig.evict(&ns, "python-warm-a")?;
        ensure!(!evicted && said.contains("disruption budget"), "evicted while busyguard was down: {said}");
        Ok(())
    })();
    rig.scale_busyguard(2)?;
    down?;

    // The agent is done: its claim deleted, the garbage collector deletes the Sandbox, the pod
    // turns idle and goes with it.
    rig.kubectl(&["-n", &ns, "delete", CLAIMS, "session-7", "--wait=false"])?;
    eventually("the claim's sandbox and its pod go", Duration::from_secs(60), || {
        Ok(rig.pod(&ns, "python-warm-a")?.is_none())
    })?;
    rig.kubectl(&["uncordon", node]).map(drop)
}

/// A Sandbox of the warm pool `pool` and its pod on `node`, as agent-sandbox's controllers make
/// them: the Sandbox controlled by the pool, labelled as its own and its pod template stamped
/// `safe-to-evict: "true"`; the pod controlled by the Sandbox, with its name-hash label.
fn warm_sandbox(rig: &Rig, ns: &str, name: &str, pool: &Value, node: &str) -> Result<()> {
    let pool_ref = json!({"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
        "name": pool["metadata"]["name"], "uid": pool["metadata"]["uid"], "controller": true,
        "blockOwnerDeletion": true});
    let template = json!({"metadata": {"labels": {"app": "python-sandbox"},
            "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"}},
        "spec": {"containers": [{"name": "sandbox", "image": "example.com/python-sandbox"}]}});
    let sandbox = json!({"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
        "metadata": {"name": name, "namespace": ns, "ownerReferences": [pool_ref],
            "labels": {"agents.x-k8s.io/warm-pool-sandbox": "python", "agents.x-k8s.io/sandbox-template-hash": "5f9c"}},
        "spec": {"podTemplate": template}});
    crate::rig::kubectl_stdin(&rig.admin, &["create", "-f", "-"], &sandbox.to_string())?;
    let sandbox = rig.get(&["-n", ns, SANDBOXES, name])?;
    let sandbox_ref = json!({"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox", "name": name,
        "uid": sandbox["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true});
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "ownerReferences": [sandbox_ref],
            "labels": {"app": "python-sandbox", "agents.x-k8s.io/sandbox-name-hash": format!("{:x}", name.len() * 7919),
                "agents.x-k8s.io/warm-pool-sandbox": "python"},
            "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true",
                "agents.x-k8s.io/propagated-labels": "app,agents.x-k8s.io/warm-pool-sandbox",
                "agents.x-k8s.io/propagated-annotations": "cluster-autoscaler.kubernetes.io/safe-to-evict"}},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "sandbox", "image": "example.com/python-sandbox"}]}});
    crate::rig::kubectl_stdin(&rig.admin, &["create", "-f", "-"], &pod.to_string())?;
    eventually(&format!("{name} runs"), Duration::from_secs(60), || {
        Ok(workers::ready_pods(rig, ns, "python-sandbox")?.iter().any(|ready| ready == name))
    })
}

/// The claim controller's `completeAdoption` (a merge patch with its resourceVersion: the warm
/// pool's labels off, the launch type and the claim's uid on, controlled by the claim, the
/// pool's `safe-to-evict` stamp off the pod template), then the Sandbox controller's patch of
/// the pod's metadata to match (`updatePodMetadata`).
fn adopt(rig: &Rig, ns: &str, name: &str, claim: &Value) -> Result<()> {
    let sandbox = rig.get(&["-n", ns, SANDBOXES, name])?;
    let claim_uid = &claim["metadata"]["uid"];
    let claim_ref = json!({"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
        "name": claim["metadata"]["name"], "uid": claim_uid, "controller": true, "blockOwnerDeletion": true});
    let adoption = json!({"metadata": {"resourceVersion": sandbox["metadata"]["resourceVersion"],
            "labels": {"agents.x-k8s.io/warm-pool-sandbox": null, "agents.x-k8s.io/sandbox-template-hash": null,
                "agents.x-k8s.io/launch-type": "warm", "agents.x-k8s.io/claim-uid": claim_uid},
            "annotations": {"agents.x-k8s.io/pod-name": name},
            "ownerReferences": [claim_ref]},
        "spec": {"podTemplate": {"metadata": {"labels": {"agents.x-k8s.io/claim-uid": claim_uid},
            "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": null}}}}});
    rig.kubectl(&["-n", ns, "patch", SANDBOXES, name, "--type=merge", "-p", &adoption.to_string()])?;
    let pod_patch = json!({"metadata": {
        "labels": {"agents.x-k8s.io/warm-pool-sandbox": null, "agents.x-k8s.io/claim-uid": claim_uid},
        "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": null,
            "agents.x-k8s.io/propagated-labels": "app,agents.x-k8s.io/claim-uid",
            "agents.x-k8s.io/propagated-annotations": null}}});
    rig.kubectl(&["-n", ns, "patch", "pod", name, "--type=merge", "-p", &pod_patch.to_string()]).map(drop)
}

/// Whether the sandbox's pod carries `busyguard.io/busy: "true"` (`busy`), within 10 s.
fn busy(rig: &Rig, ns: &str, name: &str, busy: bool) -> Result<()> {
    let want = if busy { "true" } else { "false" };
    eventually(&format!("{name}'s pod busy={want}"), Duration::from_secs(10), || {
        Ok(rig.pod(ns, name)?.is_some_and(|p| label(&p, "busyguard.io/busy").as_deref() == Some(want)))
    })
}
