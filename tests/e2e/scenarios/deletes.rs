//! Deletes: a person's, refused and carried out later, exactly once across replicas.

use std::time::Duration;

use anyhow::{Result, ensure};

use crate::rig::{Rig, eventually};
use crate::workers::{self, annotation, flip};

/// Two replicas run; a person deletes a busy pod: 429 with a message naming it, busyguard marks
/// it (delete-requested), and deletes it once idle, audited once across both replicas.
pub fn a_persons_delete_of_a_busy_pod_is_refused_and_carried_out_once_when_it_is_idle(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("deferred")?;
    workers::start(rig, &workers::pod(&ns, "task", None), "task", 1)?;
    flip(rig, &ns, "task", true)?;
    let (ok, _, err) = rig.try_kubectl(&["-n", &ns, "delete", "pod", "task", "--wait=false"])?;
    ensure!(!ok, "the delete of a busy pod went through");
    ensure!(err.contains("429") || err.contains("TooManyRequests"), "not a 429: {err}");
    ensure!(err.contains("task") && err.contains("busy"), "the refusal does not say why: {err}");
    eventually("busyguard marks the deferred delete", Duration::from_secs(10), || {
        Ok(rig.pod(&ns, "task")?.is_some_and(|p| annotation(&p, "busyguard.io/delete-requested").is_some()))
    })?;
    std::thread::sleep(Duration::from_secs(1));
    ensure!(rig.pod(&ns, "task")?.is_some_and(|p| p["metadata"]["deletionTimestamp"].is_null()), "deleted while busy");
    once_idle_deleted_exactly_once(rig, &ns, "task")
}

/// `busyguard.io/max-unavailable: "1"`: with one pod of the workload NotReady, a person's delete
/// of another is refused (429) by the workload's budget.
pub fn a_workload_budget_refuses_a_delete_one_too_many(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("budget")?;
    let mut workload = workers::deployment(&ns, "worker", 3);
    workload["spec"]["template"]["metadata"]["labels"]["busyguard.io/max-unavailable"] = "1".into();
    let pods = workers::start(rig, &workload, "worker", 3)?;
    rig.kubectl(&["-n", &ns, "annotate", "pod", &pods[0], "k8s-local/ready=false", "--overwrite"])?;
    eventually("one pod is unavailable", Duration::from_secs(20), || {
        Ok(workers::ready_pods(rig, &ns, "worker")?.len() == 2)
    })?;
    let (ok, _, err) = rig.try_kubectl(&["-n", &ns, "delete", "pod", &pods[1], "--wait=false"])?;
    ensure!(!ok, "a second pod went while one was unavailable");
    ensure!(err.contains("busyguard.io/max-unavailable"), "not the budget's refusal: {err}");
    Ok(())
}

/// Two replicas answer a workload's deletes at once (the API server spreads concurrent webhook
/// calls over its connections, and the Service over the replicas), and a budget of one never
/// loses two pods: of four deletes sent together, one goes and the rest are refused, round after
/// round. The replicas agree through the workload's Lease, which the API server arbitrates.
pub fn two_replicas_never_let_a_budget_of_one_lose_two_pods(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("budget-race")?;
    let mut workload = workers::deployment(&ns, "agent", 4);
    workload["spec"]["template"]["metadata"]["labels"]["busyguard.io/max-unavailable"] = "1".into();
    workers::start(rig, &workload, "agent", 4)?;
    // A round where the views of both replicas still lag behind the replaced pod refuses all
    // four (the safe side): it is sent again, up to three such rounds in all.
    let (mut rounds, mut cautious) = (0, 0);
    while rounds < 3 {
        let round = rounds + cautious;
        // The pod let go last round gone for good too: while it terminates it is unavailable,
        // and every delete is rightly refused.
        eventually("every pod back and Ready, none terminating", Duration::from_secs(45), || {
            let listed = rig.get(&["-n", &ns, "pods", "-l", "app=agent"])?["items"].as_array().map_or(0, Vec::len);
            Ok(workers::ready_pods(rig, &ns, "agent")?.len() == 4
                && rig.live_pods(&ns, "agent")?.len() == 4
                && listed == 4)
        })?;
        let pods = workers::ready_pods(rig, &ns, "agent")?;
        let deletes: Vec<_> = (pods.iter())
            .map(|pod| rig.kubectl_aside(&["-n", &ns, "delete", "pod", pod, "--wait=false"]))
            .collect::<Result<_>>()?;
        let mut gone = 0;
        for delete in deletes {
            let output = delete.wait_with_output()?;
            let err = String::from_utf8_lossy(&output.stderr);
            if output.status.success() {
                gone += 1;
            } else {
                ensure!(err.contains("busyguard.io/max-unavailable"), "round {round}: not the budget's refusal: {err}");
            }
        }
        ensure!(gone <= 1, "round {round}: {gone} of 4 pods went under a budget of one");
        if gone == 1 {
            rounds += 1;
        } else {
            cautious += 1;
            ensure!(cautious <= 3, "round {round}: {cautious} rounds where no pod went under a budget of one");
        }
    }
    // In busyguard's own namespace, the only one its token may write Leases in.
    let lease = rig.get(&["-n", "busyguard", "lease", &format!("busyguard-budget-{}.deployment-agent", &*ns)])?;
    ensure!(lease["metadata"]["annotations"]["busyguard.io/granted"].is_string(), "no grants on record: {lease}");
    Ok(())
}

/// The descheduler's evictions in background (its KEP-1397), the descheduler's side played here:
/// the eviction of a busy pod that carries `descheduler.alpha.kubernetes.io/request-evict-only`
/// is answered 429 with "Eviction triggered evacuation", the pod is marked
/// `descheduler.alpha.kubernetes.io/eviction-in-progress` (so the descheduler counts it as going
/// and evicts no other in its place), a second eviction is refused the same, and the pod is
/// deleted once idle, exactly once across the two replicas.
pub fn the_deschedulers_eviction_in_background_of_a_busy_pod_goes_once_idle(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("descheduler")?;
    let mut pod = workers::pod(&ns, "task", None);
    pod["metadata"]["annotations"] = serde_json::json!({"descheduler.alpha.kubernetes.io/request-evict-only": ""});
    workers::start(rig, &pod, "task", 1)?;
    flip(rig, &ns, "task", true)?;
    for attempt in 0..2 {
        let (ok, err) = rig.evict(&ns, "task")?;
        ensure!(!ok, "eviction {attempt} of the busy pod went through");
        ensure!(
            err.contains("Eviction triggered evacuation"),
            "eviction {attempt}: not the descheduler's words: {err}"
        );
        eventually("the pod marked as under way", Duration::from_secs(10), || {
            Ok(rig.pod(&ns, "task")?.is_some_and(|p| {
                annotation(&p, "descheduler.alpha.kubernetes.io/eviction-in-progress").is_some()
                    && annotation(&p, "busyguard.io/delete-requested").is_some()
            }))
        })?;
    }
    ensure!(rig.pod(&ns, "task")?.is_some_and(|p| p["metadata"]["deletionTimestamp"].is_null()), "evicted while busy");
    once_idle_deleted_exactly_once(rig, &ns, "task")
}

/// The busy `pod` turns idle: the delete busyguard deferred is carried out, and audited once
/// across the two replicas.
fn once_idle_deleted_exactly_once(rig: &Rig, ns: &str, pod: &str) -> Result<()> {
    flip(rig, ns, pod, false)?;
    eventually("the idle pod is deleted", Duration::from_secs(20), || Ok(rig.pod(ns, pod)?.is_none()))?;
    std::thread::sleep(Duration::from_secs(2));
    let carried_out = rig.audited(ns, pod, "deleted-when-idle");
    ensure!(carried_out.len() == 1, "the deferred delete was carried out {} times, not once", carried_out.len());
    Ok(())
}

/// A busy pod's delete is deferred (marked), then its busy label is removed: busyguard carries the
/// delete out, and the kubelet's status write before its final delete (as the node) goes through,
/// so the pod does not stay Terminating.
pub fn a_marked_pod_that_loses_its_busy_label_takes_the_kubelets_status_write(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("marked-unlabelled")?;
    workers::start(rig, &workers::pod(&ns, "task", None), "task", 1)?;
    flip(rig, &ns, "task", true)?;
    let (ok, _, _) = rig.try_kubectl(&["-n", &ns, "delete", "pod", "task", "--wait=false"])?;
    ensure!(!ok, "the delete of a busy pod went through");
    eventually("busyguard marks the deferred delete", Duration::from_secs(10), || {
        Ok(rig.pod(&ns, "task")?.is_some_and(|p| annotation(&p, "busyguard.io/delete-requested").is_some()))
    })?;
    rig.kubectl(&["-n", &ns, "label", "pod", "task", "busyguard.io/busy-"])?;
    eventually("the pod is deleted and gone, not left Terminating", Duration::from_secs(30), || {
        Ok(rig.pod(&ns, "task")?.is_none())
    })
}

/// Three busy pods carrying `request-evict-only` under a PodDisruptionBudget `minAvailable: 2`:
/// each eviction is refused and deferred; once all three are idle at once, busyguard carries the
/// evictions out as evictions, so the budget holds: one pod goes, two stay.
pub fn three_background_evictions_under_min_available_2_leave_two_pods_once_idle(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("background-pdb")?;
    let names = ["bg-1", "bg-2", "bg-3"];
    for name in names {
        let mut pod = workers::pod(&ns, name, None);
        pod["metadata"]["labels"]["app"] = serde_json::json!("bg");
        pod["metadata"]["annotations"] = serde_json::json!({"descheduler.alpha.kubernetes.io/request-evict-only": ""});
        rig.apply(&pod)?;
    }
    eventually("three pods ready", Duration::from_secs(60), || Ok(workers::ready_pods(rig, &ns, "bg")?.len() == 3))?;
    rig.apply(&serde_json::json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "bg", "namespace": &*ns},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "bg"}}}}))?;
    eventually("the budget allows one disruption", Duration::from_secs(30), || {
        Ok(rig.get(&["-n", &ns, "pdb", "bg"])?["status"]["disruptionsAllowed"] == 1)
    })?;
    for name in names {
        flip(rig, &ns, name, true)?;
    }
    for name in names {
        let (ok, err) = rig.evict(&ns, name)?;
        ensure!(!ok && err.contains("Eviction triggered evacuation"), "{name}: {err}");
        eventually("marked", Duration::from_secs(10), || {
            Ok(rig.pod(&ns, name)?.is_some_and(|p| annotation(&p, "busyguard.io/delete-requested").is_some()))
        })?;
    }
    for name in names {
        flip(rig, &ns, name, false)?;
    }
    eventually("one pod evicted", Duration::from_secs(30), || Ok(rig.live_pods(&ns, "bg")?.len() == 2))?;
    crate::rig::throughout("two pods stay, as the budget says", Duration::from_secs(10), || {
        Ok(rig.live_pods(&ns, "bg")?.len() == 2)
    })
}
