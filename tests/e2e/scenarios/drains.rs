//! Drains: evictions of busy pods answered 429 until they are idle; namespaces that opt out.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

use crate::rig::{Rig, eventually};
use crate::workers::{self, flip, label};

/// `kubectl drain` evicts the idle pod at once, retries the busy one on 429 (one Event raised
/// per minute of the clock, whichever replica refuses), and completes once it is idle.
pub fn a_drain_waits_for_the_busy_pod_and_completes_once_it_is_idle(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("drain")?;
    let node = "e2e-drain";
    rig.node(node, "4")?;
    for name in ["busy", "idle"] {
        workers::start(rig, &workers::pod(&ns, name, Some(node)), name, 1)?;
    }
    flip(rig, &ns, "busy", true)?;
    // Events are named by the minute (--event-interval, 60s): the two refusals counted below
    // (kubectl retries every 5 s) fall within one when the drain starts in its first half.
    let into_minute = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs() % 60;
    if into_minute > 30 {
        std::thread::sleep(Duration::from_secs(61 - into_minute));
    }
    let drain = rig.kubectl_aside(&["drain", node, "--force", "--ignore-daemonsets", "--timeout=90s"])?;
    eventually("the idle pod is evicted", Duration::from_secs(20), || Ok(rig.live_pods(&ns, "idle")?.is_empty()))?;
    // kubectl retries every 5 s: two refusals, often one from each replica.
    eventually("two refused evictions", Duration::from_secs(20), || Ok(rig.audited(&ns, "busy", "denied").len() >= 2))?;
    ensure!(rig.live_pods(&ns, "busy")? == ["busy"], "the busy pod was evicted");
    let events = rig.get(&["-n", &ns, "events", "--field-selector", "reason=DisruptionBlocked"])?;
    ensure!(events["items"].as_array().is_some_and(|e| e.len() == 1), "not one DisruptionBlocked Event: {events}");
    flip(rig, &ns, "busy", false)?;
    let output = drain.wait_with_output()?;
    ensure!(output.status.success(), "the drain did not complete: {}", String::from_utf8_lossy(&output.stderr));
    ensure!(rig.live_pods(&ns, "busy")?.is_empty(), "the drain completed with the pod still there");
    Ok(())
}

/// A namespace's first opted-in pod brings busyguard's busy-pod PDB at once, not at the next
/// sweep. Three namespaces get their first pod 10 s apart, and each PDB must come within 8 s:
/// the sweeps of two replicas, every 30 s, could bring at most two of the three that soon.
pub fn a_namespaces_first_pod_brings_its_busy_pod_pdb_at_once(rig: &Rig) -> Result<()> {
    const APART: Duration = Duration::from_secs(10);
    const AT_ONCE: Duration = Duration::from_secs(8);
    let namespaces = ["first-pod-a", "first-pod-b", "first-pod-c"].map(|name| rig.namespace(name));
    let first = Instant::now();
    for (ns, nth) in namespaces.into_iter().zip(0..) {
        let ns = ns?;
        std::thread::sleep((first + APART * nth).saturating_duration_since(Instant::now()));
        rig.apply(&workers::pod(&ns, "worker", None))?;
        eventually(&format!("the busy-pod PDB of {}'s first pod, at once", &*ns), AT_ONCE, || rig.has_busy_pdb(&ns))?;
    }
    Ok(())
}

/// A namespace labelled busyguard.io/enabled=false is left alone: busyguard removes its
/// busy-pod PDB and protected labels there, and a drain takes its busy pod.
pub fn an_opted_out_namespace_is_left_alone(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("opt-out")?;
    let node = "e2e-opt-out";
    rig.node(node, "4")?;
    workers::start(rig, &workers::pod(&ns, "busy", Some(node)), "busy", 1)?;
    flip(rig, &ns, "busy", true)?;
    rig.busy_pdb_made(&ns)?;
    let pdb = rig.get(&["-n", &ns, "pdb", "busyguard-busy"])?;
    ensure!(
        pdb["spec"]["unhealthyPodEvictionPolicy"] == "IfHealthyBudget",
        "a busy pod that is not Ready must stay protected: {}",
        pdb["spec"]
    );
    rig.kubectl(&["label", "namespace", &ns, "busyguard.io/enabled=false"])?;
    // Removed on the next sweep.
    eventually("the PDB is gone", Duration::from_secs(45), || Ok(!rig.has_busy_pdb(&ns)?))?;
    eventually("the protected label is off", Duration::from_secs(20), || {
        Ok(rig.pod(&ns, "busy")?.is_some_and(|p| label(&p, "busyguard.io/protected").is_none()))
    })?;
    let (ok, _, err) = rig.try_kubectl(&["drain", node, "--force", "--ignore-daemonsets", "--timeout=30s"])?;
    ensure!(ok, "the drain of an opted-out namespace's busy pod did not go through: {err}");
    Ok(())
}

/// A staged install (`manifests/opt-in`): with its webhooks and `--opt-in`, busyguard guards
/// only the namespaces labelled `busyguard.io/enabled=true`. A busy pod elsewhere is deleted as
/// if busyguard were not installed, and not protected; once its namespace opts in, it is. There,
/// where no webhook of busyguard's is called, its fence refuses busyguard's own token any eviction.
pub fn a_staged_install_guards_only_the_namespaces_opted_in(rig: &Rig) -> Result<()> {
    let (opted_in, not_yet) = (rig.namespace("opted-in")?, rig.namespace("not-yet")?);
    rig.kubectl(&["label", "namespace", &opted_in, "busyguard.io/enabled=true"])?;
    rig.switch_to("examples/opt-in", &[("BUSYGUARD_OPT_IN", Some("true"))])?;
    let staged = (|| {
        for ns in [&*opted_in, &*not_yet] {
            workers::start(rig, &workers::pod(ns, "busy", None), "busy", 1)?;
            flip(rig, ns, "busy", true)?;
        }
        let delete = |ns: &str| rig.try_kubectl(&["-n", ns, "delete", "pod", "busy", "--dry-run=server"]);
        ensure!(!rig.evict(&opted_in, "busy")?.0 && !delete(&opted_in)?.0, "an opted-in namespace's busy pod went");
        ensure!(delete(&not_yet)?.0, "a busy pod of a namespace not opted in could not be deleted");
        let busyguard = Some("system:serviceaccount:busyguard:busyguard");
        let (evicted, said) = rig.evict_as(busyguard, &not_yet, "busy")?;
        ensure!(
            !evicted && said.contains("busyguard-fence-evictions"),
            "busyguard's token evicted a pod of a namespace not opted in: {said}"
        );
        ensure!(
            rig.pod(&not_yet, "busy")?.is_some_and(|p| label(&p, "busyguard.io/protected").is_none()),
            "a busy pod of a namespace not opted in was protected"
        );
        rig.kubectl(&["label", "namespace", &not_yet, "busyguard.io/enabled=true"])?;
        eventually("once its namespace opts in, the busy pod is protected", Duration::from_secs(20), || {
            Ok(rig
                .pod(&not_yet, "busy")?
                .is_some_and(|p| label(&p, "busyguard.io/protected").as_deref() == Some("true")))
        })?;
        ensure!(!rig.evict(&not_yet, "busy")?.0, "an opted-in busy pod was evicted");
        Ok(())
    })();
    rig.switch_to("base", &[("BUSYGUARD_OPT_IN", None)])?;
    staged
}

/// Audit mode (`BUSYGUARD_MODE=audit`, the chart's `mode: audit`) is a trial that changes
/// nothing: the busy-pod PDB that enforce mode made is removed, a flip to busy gets none of
/// busyguard's marks (no deletion cost, no `karpenter.sh/do-not-disrupt`, no protected label;
/// only busyguard's own busy-since),
/// and a drain takes the busy pod at once, with no DisruptionBlocked Event; the audit names what
/// enforce mode would have done (`would-patch`, `would-deny`) and the metric counts it.
pub fn audit_mode_lets_a_drain_take_a_busy_pod_and_says_what_it_would_have_done(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("audit-mode")?;
    let node = "e2e-audit-mode";
    rig.node(node, "4")?;
    workers::start(rig, &workers::pod(&ns, "earlier", Some(node)), "earlier", 1)?;
    flip(rig, &ns, "earlier", true)?;
    rig.busy_pdb_made(&ns)?;
    flip(rig, &ns, "earlier", false)?;
    rig.switch_to("base", &[("BUSYGUARD_MODE", Some("audit"))])?;
    let trial = (|| {
        eventually("the PDB enforce mode made is removed", Duration::from_secs(45), || Ok(!rig.has_busy_pdb(&ns)?))?;
        workers::start(rig, &workers::pod(&ns, "busy", Some(node)), "busy", 1)?;
        flip(rig, &ns, "busy", true)?;
        let pod = rig.pod(&ns, "busy")?.context("the busy pod")?;
        let annotations = &pod["metadata"]["annotations"];
        ensure!(
            label(&pod, "busyguard.io/protected").is_none()
                && annotations["karpenter.sh/do-not-disrupt"].is_null()
                && annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"].is_null()
                && annotations["controller.kubernetes.io/pod-deletion-cost"].is_null(),
            "audit mode wrote busyguard's marks on the busy pod: {}",
            pod["metadata"]
        );
        // busy-since, busyguard's own, is kept: the trial's summary tells how far into its task it was.
        ensure!(annotations["busyguard.io/busy-since"].is_string(), "no busy-since: {}", pod["metadata"]);
        ensure!(!rig.audited(&ns, "busy", "would-patch").is_empty(), "the withheld marks were not audited");
        let (ok, _, err) = rig.try_kubectl(&["drain", node, "--force", "--ignore-daemonsets", "--timeout=30s"])?;
        ensure!(ok, "the drain did not take the busy pod at once in audit mode: {err}");
        ensure!(rig.live_pods(&ns, "busy")?.is_empty(), "the busy pod is still there");
        eventually("the eviction audited would-deny", Duration::from_secs(10), || {
            Ok(rig.audited(&ns, "busy", "would-deny").iter().any(|l| l["subresource"] == "eviction"))
        })?;
        let events = rig.get(&["-n", &ns, "events", "--field-selector", "reason=DisruptionBlocked"])?;
        ensure!(events["items"].as_array().is_some_and(Vec::is_empty), "an Event told the drain to wait: {events}");
        ensure!(!rig.has_busy_pdb(&ns)?, "a busy-pod PDB was made in audit mode");
        let counted = rig.metrics().iter().any(|text| {
            text.lines().any(|l| {
                l.starts_with("busyguard_would_deny_total{")
                    && l.contains(r#"route="pods/eviction""#)
                    && !l.ends_with(" 0")
            })
        });
        ensure!(counted, "busyguard_would_deny_total did not count the eviction");
        Ok(())
    })();
    rig.switch_to("base", &[("BUSYGUARD_MODE", None)])?;
    trial
}
