//! busyguard down, restarted and re-keyed: what waits and what goes on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use super::jobs;
use crate::rig::{Rig, eventually};
use crate::workers::{self, annotation, flip, label};

/// With busyguard scaled to 0, only busy pods wait: a scale-down deletes the idle pods and not
/// the busy one, a readiness-mode Deployment whose pods are all Ready scales down, an idle pod
/// under a workload budget is deleted, and so are a run-to-completion Job's finished pod and its
/// Pending one (no node fits it); a person's delete of the busy pod is refused, the
/// busy-pod PDB still refuses the busy pod's eviction while the drain takes the idle one; a
/// namespace being deleted empties (the namespace controller is never sent to the fail-closed
/// webhook), and so do the pods of a vanished node (pod GC).
pub fn while_busyguard_is_down_only_busy_pods_wait_and_a_readiness_mode_deployment_of_ready_pods_scales_down(
    rig: &Rig,
) -> Result<()> {
    let ns = rig.namespace("down")?;
    let doomed = rig.namespace("down-doomed")?;
    let (drained, vanishing) = ("e2e-down-drain", "e2e-down-gone");
    rig.node(drained, "4")?;
    rig.node(vanishing, "4")?;
    for name in ["busy", "idle"] {
        workers::start(rig, &workers::pod(&ns, name, Some(drained)), name, 1)?;
        workers::start(rig, &workers::pod(&doomed, name, None), name, 1)?;
    }
    let orphan = "orphan";
    workers::start(rig, &workers::pod(&ns, orphan, Some(vanishing)), orphan, 1)?;
    for (namespace, pod) in [(&*ns, "busy"), (&*doomed, "busy"), (&*ns, orphan)] {
        flip(rig, namespace, pod, true)?;
    }
    let workers = workers::start(rig, &workers::deployment(&ns, "worker", 4), "worker", 4)?;
    flip(rig, &ns, &workers[0], true)?;
    let mut readiness = workers::deployment(&ns, "ready", 3);
    readiness["spec"]["template"]["metadata"]["labels"]["busyguard.io/busy"] = json!("when-unready");
    workers::start(rig, &readiness, "ready", 3)?;
    let mut budgeted = workers::pod(&ns, "budgeted", None);
    budgeted["metadata"]["labels"]["busyguard.io/max-unavailable"] = json!("1");
    workers::start(rig, &budgeted, "budgeted", 1)?;
    let jobs = jobs::run_to_completion(rig, "down-jobs")?;
    let done = jobs::running_busy(rig, &jobs, &jobs::job(&jobs, "done", json!({})))?;
    let succeeded = json!({"status": {"phase": "Succeeded", "containerStatuses": [{"name": "main", "image": "example.com/worker",
        "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": jiff::Timestamp::now().to_string()}}}]}});
    rig.kubectl(&[
        "-n",
        &jobs,
        "patch",
        "pod",
        &done,
        "--subresource=status",
        "--type=merge",
        "-p",
        &succeeded.to_string(),
    ])?;
    let unschedulable = json!({"template": {"spec": {"nodeSelector": {"e2e/no-such-node": "true"}}}});
    rig.apply(&jobs::job(&jobs, "pending", unschedulable))?;
    let mut pending = Vec::new();
    eventually("the Pending Job's pod, made busy", Duration::from_secs(30), || {
        pending = jobs::job_pods(rig, &jobs, "pending")?;
        Ok(pending.first().is_some_and(|p| label(p, "busyguard.io/busy").as_deref() == Some("true")))
    })?;
    let pending = pending[0]["metadata"]["name"].as_str().unwrap_or_default().to_string();
    rig.busy_pdb_made(&ns)?;

    rig.scale_busyguard(0)?;
    let outcome = (|| -> Result<()> {
        rig.kubectl(&["-n", &ns, "scale", "deployment/worker", "--replicas=1"])?;
        eventually("the scale-down takes the idle pods", Duration::from_secs(30), || {
            Ok(rig.live_pods(&ns, "worker")? == workers[..1])
        })?;
        rig.kubectl(&["-n", &ns, "scale", "deployment/ready", "--replicas=1"])?;
        eventually("the readiness-mode Deployment of Ready pods scales down", Duration::from_secs(30), || {
            Ok(rig.live_pods(&ns, "ready")?.len() == 1)
        })?;
        let (ok, _, err) = rig.try_kubectl(&["-n", &ns, "delete", "pod", "budgeted", "--wait=false"])?;
        ensure!(ok, "an idle pod under a budget was held while busyguard was down: {err}");
        for (pod, what) in [(&done, "finished"), (&pending, "Pending")] {
            let (ok, _, err) = rig.try_kubectl(&["-n", &jobs, "delete", "pod", pod, "--wait=false"])?;
            ensure!(ok, "a {what} Job pod was held while busyguard was down: {err}");
        }
        let (ok, _, err) = rig.try_kubectl(&["-n", &ns, "delete", "pod", &workers[0], "--wait=false"])?;
        ensure!(!ok, "a person deleted a busy pod while busyguard was down");
        ensure!(err.contains("pod-deletes.busyguard.io"), "not held by the delete webhook: {err}");
        rig.kubectl(&["delete", "namespace", &doomed, "--wait=false"])?;
        rig.kubectl(&["delete", "node", vanishing, "--wait=false"])?;
        let (ok, _, err) = rig.try_kubectl(&["drain", drained, "--force", "--ignore-daemonsets", "--timeout=10s"])?;
        ensure!(!ok, "the drain took a busy pod while busyguard was down");
        ensure!(err.contains("disruption budget"), "not refused by the PDB: {err}");
        ensure!(rig.live_pods(&ns, "idle")?.is_empty(), "the idle pod was not evicted");
        ensure!(rig.live_pods(&ns, "busy")? == ["busy"], "the busy pod went");
        eventually("the namespace being deleted empties", Duration::from_secs(60), || {
            Ok(!rig.namespace_names()?.iter().any(|n| *n == *doomed))
        })?;
        // The pod garbage collector waits 40 s before it deletes pods bound to a missing node.
        eventually("pod GC takes the pods of the vanished node", Duration::from_secs(120), || {
            Ok(rig.pod(&ns, orphan)?.is_none())
        })
    })();
    rig.scale_busyguard(2)?;
    outcome
}

/// The command of docs/operations.md's "Uninstall" block that holds `word`.
fn uninstall_command(word: &str) -> Result<String> {
    let doc = std::fs::read_to_string(format!("{}/docs/operations.md", crate::rig::ROOT))?;
    let section = doc.split("## Uninstall").nth(1).context("no Uninstall section")?;
    let block = section.split("```sh").nth(1).and_then(|b| b.split("```").next()).context("no sh block")?;
    let line = block.lines().find(|l| l.contains(word)).context("no such command")?;
    Ok(line.split(" #").next().unwrap_or(line).trim().to_string())
}

/// Requests that need busyguard's answer keep getting it while `change` runs: a dry-run delete
/// of a busy pod (fail-closed webhook) and a dry-run eviction of it (its webhook fails open) are
/// refused 429 by busyguard every time: never "failed calling webhook", never let through to the
/// PDB by a replica that could not judge them yet.
fn answered_throughout(rig: &Rig, name: &str, change: impl FnOnce() -> Result<()>) -> Result<()> {
    let ns = rig.namespace(name)?;
    workers::start(rig, &workers::pod(&ns, "busy", None), "busy", 1)?;
    flip(rig, &ns, "busy", true)?;
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        // A delete and an eviction in turn, each a dry run: each must be busyguard's own refusal,
        // not a failure let through nor the busy-pod PDB's answer in its place.
        let traffic = scope.spawn(|| -> Result<usize> {
            let mut answered = 0;
            while !stop.load(Ordering::Relaxed) {
                let (ok, _, err) =
                    rig.try_kubectl(&["-n", &ns, "delete", "pod", "busy", "--dry-run=server", "--wait=false"])?;
                let eviction = rig.evict_dry_run(&ns, "busy")?;
                for (what, (ok, err)) in [("a delete", (ok, err)), ("an eviction", eviction)] {
                    let refused = !ok && err.contains("is busy since");
                    ensure!(refused, "request {answered}, {what}: not busyguard's refusal: {err}");
                    answered += 1;
                }
            }
            Ok(answered)
        });
        let changed = change();
        stop.store(true, Ordering::Relaxed);
        let answered = traffic.join().map_err(|_| anyhow::anyhow!("the traffic panicked"))??;
        changed?;
        ensure!(answered >= 10, "only {answered} requests were made");
        Ok(())
    })
}

/// `kubectl rollout restart` of busyguard (maxUnavailable 0, a new replica ready once it has
/// listed the opted-in pods, preStop, graceful drain): no admission fails.
pub fn a_rolling_restart_of_busyguard_fails_no_admission(rig: &Rig) -> Result<()> {
    answered_throughout(rig, "restart", || {
        rig.kubectl(&["-n", "busyguard", "rollout", "restart", "deployment/busyguard"])?;
        rig.rolled_out()
    })
}

/// A rollout whose new replica cannot list the opted-in pods (its ClusterRole lost `list` on
/// pods, as an edit gone wrong does): the new replica stays out of the Service and says why,
/// the old ones judge every delete and eviction meanwhile, and once it can list, it is taken in
/// and the rollout completes.
pub fn a_new_replica_takes_reviews_only_once_it_has_listed_the_pods(rig: &Rig) -> Result<()> {
    let role = rig.get(&["clusterrole", "busyguard"])?;
    let rules = role["rules"].as_array().context("the ClusterRole's rules")?;
    let pods = (rules.iter())
        .position(|r| r["apiGroups"] == json!([""]) && r["resources"] == json!(["pods"]))
        .context("the ClusterRole's rule on pods")?;
    let verbs = rules[pods]["verbs"].clone();
    let without_list: Vec<&Value> = verbs.as_array().into_iter().flatten().filter(|v| *v != "list").collect();
    let set_verbs = |verbs: &Value| {
        let patch = json!([{"op": "replace", "path": format!("/rules/{pods}/verbs"), "value": verbs}]);
        rig.kubectl(&["patch", "clusterrole", "busyguard", "--type=json", "-p", &patch.to_string()])
    };
    let outcome = answered_throughout(rig, "first-list", || {
        set_verbs(&json!(without_list))?;
        rig.kubectl(&["-n", "busyguard", "rollout", "restart", "deployment/busyguard"])?;
        let not_listed = "not ready: busyguard has not finished listing the opted-in pods yet\n";
        let one_unlisted = || rig.readiness().iter().any(|page| page == not_listed);
        eventually("a new replica, unready until it has listed", Duration::from_secs(30), || Ok(one_unlisted()))?;
        // Reviews keep coming meanwhile (answered_throughout checks each).
        std::thread::sleep(Duration::from_secs(3));
        ensure!(one_unlisted(), "the new replica went ready unlisted");
        set_verbs(&verbs)?;
        rig.rolled_out()
    });
    set_verbs(&verbs)?;
    outcome
}

/// Certificate rotation as the README's steps do it (the caBundle trusts old and new, then the
/// Secret changes, then the bundle trusts the new CA only), under traffic: no admission fails.
pub fn certificate_rotation_under_traffic_fails_no_admission(rig: &Rig) -> Result<()> {
    answered_throughout(rig, "rotation", || {
        let live = rig.certs();
        let next = rig.work.join("certs-next");
        let _ = std::fs::remove_dir_all(&next);
        let made = std::process::Command::new(crate::rig::BUSYGUARD).args(["certs", "--dir"]).arg(&next).status()?;
        ensure!(made.success(), "busyguard certs failed");
        let (old_ca, new_ca) = (std::fs::read(live.join("ca.crt"))?, std::fs::read(next.join("ca.crt"))?);
        rig.register(&[new_ca.clone(), old_ca].concat())?;
        // The Secret's new files, swapped in whole as the kubelet does.
        for file in ["tls.key", "tls.crt"] {
            std::fs::copy(next.join(file), live.join(format!("{file}.new")))?;
        }
        std::fs::rename(live.join("tls.key.new"), live.join("tls.key"))?;
        std::fs::rename(live.join("tls.crt.new"), live.join("tls.crt")).context("the new certificate")?;
        std::thread::sleep(Duration::from_secs(3));
        rig.register(&new_ca)?;
        std::fs::copy(next.join("ca.crt"), live.join("ca.crt"))?;
        std::thread::sleep(Duration::from_secs(3));
        Ok(())
    })
}

/// The uninstall of docs/operations.md, as written: its command removes both webhook
/// configurations and no delete is refused afterwards, a busy pod's neither; then `busyguard
/// cleanup` leaves nothing of busyguard's: a busy pod someone asked to delete gets its user's own
/// deletion cost back and loses busy-since, the saved values, the protected label and the
/// deferred delete; the busy-pod PDB and the budgets' Leases go. While the webhooks are still
/// registered it refuses, since busyguard would put it all back.
pub fn the_documented_uninstall_refuses_nothing_more_and_cleanup_leaves_nothing_behind(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("cleanup")?;
    let mut task = workers::pod(&ns, "task", None);
    task["metadata"]["annotations"] = serde_json::json!({"controller.kubernetes.io/pod-deletion-cost": "-5"});
    workers::start(rig, &task, "task", 1)?;
    flip(rig, &ns, "task", true)?;
    let (ok, _, _) = rig.try_kubectl(&["-n", &ns, "delete", "pod", "task", "--wait=false"])?;
    ensure!(!ok, "the busy pod was deleted");
    // A pod let go under a workload budget: its workload's Lease records it.
    let mut budgeted = workers::deployment(&ns, "agent", 2);
    budgeted["spec"]["template"]["metadata"]["labels"]["busyguard.io/max-unavailable"] = "1".into();
    let agents = workers::start(rig, &budgeted, "agent", 2)?;
    rig.kubectl(&["-n", &ns, "delete", "pod", &agents[0], "--wait=false"])?;
    eventually("the deferred delete and the busy-pod PDB", Duration::from_secs(45), || {
        let marked = rig.pod(&ns, "task")?.is_some_and(|p| label(&p, "busyguard.io/delete-requested").is_some());
        Ok(marked && rig.has_busy_pdb(&ns)?)
    })?;
    let cleanup = |dry_run: &[&str]| {
        let output = std::process::Command::new(crate::rig::BUSYGUARD)
            .args(["cleanup", "-n", &ns, "--kubeconfig"])
            .arg(&rig.admin)
            .args(dry_run)
            .output()?;
        let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        anyhow::Ok((output.status.success(), said))
    };
    let (ok, said) = cleanup(&[])?;
    ensure!(!ok && said.contains("still registered"), "cleanup ran with the webhooks registered: {said}");
    // A preview before the uninstall, which changes nothing.
    let before = rig.pod(&ns, "task")?.context("the pod")?;
    let (ok, said) = cleanup(&["--dry-run"])?;
    ensure!(ok && said.starts_with("busyguard's webhooks are still registered: a preview"), "{said}");
    ensure!(said.contains(&format!("pod {}/task: would restore", &*ns)), "{said}");
    let after = rig.pod(&ns, "task")?.context("the pod")?;
    ensure!(before["metadata"]["labels"] == after["metadata"]["labels"], "the preview changed the pod");

    // docs/operations.md's uninstall, its own first command, as written.
    let remove_webhooks = uninstall_command("mutatingwebhookconfiguration")?;
    let removed =
        std::process::Command::new("bash").arg("-c").arg(&remove_webhooks).env("KUBECONFIG", &rig.admin).output()?;
    ensure!(removed.status.success(), "{remove_webhooks}: {}", String::from_utf8_lossy(&removed.stderr));
    let left = rig.kubectl(&["get", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "-o", "name"])?;
    ensure!(!left.contains("/busyguard\n") && !left.ends_with("/busyguard"), "left after the uninstall: {left}");
    rig.scale_busyguard(0)?;
    let outcome = (|| -> Result<()> {
        // Nothing refuses a delete once it is uninstalled, of a busy pod neither.
        let (ok, _, err) = rig.try_kubectl(&["-n", &ns, "delete", "pod", "task", "--dry-run=server"])?;
        ensure!(ok, "a delete was refused after the uninstall: {err}");
        let (ok, said) = cleanup(&[])?;
        ensure!(ok, "cleanup failed: {said}");
        ensure!(said.contains(&format!("pod {}/task: restored", &*ns)), "{said}");
        ensure!(said.contains(&format!("poddisruptionbudget {}/busyguard-busy: deleted", &*ns)), "{said}");
        ensure!(
            said.contains(&format!("lease busyguard/busyguard-budget-{}.deployment-agent: deleted", &*ns)),
            "{said}"
        );
        let pod = rig.pod(&ns, "task")?.context("the pod is gone")?;
        let ours = |map: &serde_json::Value| -> Vec<String> {
            let keys = map.as_object().into_iter().flatten().map(|(k, _)| k.clone());
            keys.filter(|k| k.starts_with("busyguard.io/") && k != "busyguard.io/busy").collect()
        };
        ensure!(ours(&pod["metadata"]["labels"]).is_empty(), "labels left: {}", pod["metadata"]["labels"]);
        ensure!(ours(&pod["metadata"]["annotations"]).is_empty(), "left: {}", pod["metadata"]["annotations"]);
        ensure!(annotation(&pod, "controller.kubernetes.io/pod-deletion-cost").as_deref() == Some("-5"));
        ensure!(annotation(&pod, "karpenter.sh/do-not-disrupt").is_none(), "{}", pod["metadata"]["annotations"]);
        ensure!(!rig.has_busy_pdb(&ns)?, "the PDB stayed");
        Ok(())
    })();
    rig.scale_busyguard(2)?;
    rig.register_live()?;
    outcome
}

/// `busyguard check` passes once busyguard is installed (the API server reaches it and it
/// answers), in a namespace that enforces PodSecurity `restricted` and a quota on requests and
/// limits too; names a quota that refuses its probe rather than blame busyguard; and says what
/// is wrong, within its timeout, when the webhooks are not registered.
pub fn busyguard_check_tells_an_install_that_works_from_one_that_does_not(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("check")?;
    let check = |timeout: &str| {
        let output = std::process::Command::new(crate::rig::BUSYGUARD)
            .args(["check", "-n", &ns, "--timeout", timeout, "--kubeconfig"])
            .arg(&rig.admin)
            .output()?;
        let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        anyhow::Ok((output.status.success(), said))
    };
    // Its probe passes PodSecurity `restricted` and a quota that wants requests and limits.
    rig.kubectl(&["label", "namespace", &ns, "pod-security.kubernetes.io/enforce=restricted"])?;
    rig.apply(
        &serde_json::json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q", "namespace": &*ns},
        "spec": {"hard": {"requests.cpu": "1", "limits.cpu": "1", "requests.memory": "1Gi", "limits.memory": "1Gi"}}}),
    )?;
    let (ok, said) = check("60s")?;
    ensure!(ok && said.contains("busyguard answers the API server"), "check failed on a working install: {said}");
    let stored = rig.get(&["-n", &ns, "pods"])?;
    ensure!(stored["items"].as_array().is_some_and(|p| p.is_empty()), "a dry run stored a pod: {stored}");
    // A quota that admits no more pods refuses the probe: check names it, not busyguard.
    rig.apply(&serde_json::json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "none", "namespace": &*ns},
        "spec": {"hard": {"pods": "0"}}}))?;
    let (ok, said) = check("4s")?;
    ensure!(!ok && said.contains("refused by a ResourceQuota, not busyguard"), "{said}");
    rig.kubectl(&["-n", &ns, "delete", "resourcequota", "none"])?;
    rig.unregister()?;
    let outcome = check("4s");
    rig.register_live()?;
    let (ok, said) = outcome?;
    ensure!(!ok, "check passed with the webhooks unregistered: {said}");
    ensure!(said.contains("does not call its mutating webhook"), "{said}");
    Ok(())
}
