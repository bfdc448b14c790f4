//! A busy rule's kind as its project really serves it: a CRD missing when busyguard starts, or
//! removed while it runs, takes nothing else down; and Actions Runner Controller's own CRDs,
//! release by release (../shared/peers), with the listener's write as each release makes it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::json;

use super::jobs::{ended_by_its_job, job, run_to_completion, running_busy};
use super::owners::{NODE, Owned, game_server_crd, set_state, start_game_server, start_pod};
use crate::rig::{ROOT, Rig, eventually, throughout};
use crate::workers::{self, flip, label};

const GAME_SERVERS: &str = "gameservers.agones.dev";
const NOT_FOLLOWED: &str = "--busy-when-owner agones.dev/v1/GameServer: its owners are not followed";

/// The Agones component installed on a cluster without Agones' CRD (uninstalled, or never there):
/// busyguard starts and serves every other path; `/status` says the kind is not followed. The
/// CRD applied, its game servers are followed; removed while busyguard runs, it says so again;
/// applied once more, they are followed again.
pub fn an_owner_rule_whose_kind_is_not_served_takes_nothing_else_down(rig: &Rig) -> Result<()> {
    rig.kubectl(&["delete", "crd", GAME_SERVERS, "--ignore-not-found", "--wait=true"])?;
    // The rollout completes: two replicas answer though the rule's kind is not served.
    rig.install_with(&["agones"])?;
    let outcome = serves_without_the_kind(rig);
    let _ = rig.kubectl(&["delete", "crd", GAME_SERVERS, "--ignore-not-found", "--wait=true"]);
    rig.install_release(Path::new(ROOT), None)?;
    outcome
}

fn serves_without_the_kind(rig: &Rig) -> Result<()> {
    told_on_every_replica(rig, true)?;
    // A person's delete of a busy pod is still refused and deferred.
    let ns = rig.namespace("owner-kind-gone")?;
    workers::start(rig, &workers::pod(&ns, "task", None), "task", 1)?;
    flip(rig, &ns, "task", true)?;
    let (deleted, _, err) = rig.try_kubectl(&["-n", &ns, "delete", "pod", "task", "--wait=false"])?;
    ensure!(!deleted && err.contains("busy"), "a person's delete of a busy pod was not refused: {err}");
    // A Job's own end still passes.
    let jobs = run_to_completion(rig, "owner-kind-gone-jobs")?;
    let pod = running_busy(rig, &jobs, &job(&jobs, "suspended", json!({})))?;
    rig.kubectl(&["-n", &jobs, "patch", "job", "suspended", "--type=merge", "-p", r#"{"spec":{"suspend":true}}"#])?;
    ended_by_its_job(rig, &jobs, &pod)?;

    // Agones installed: its game servers are followed (busyguard asks again every minute at most).
    rig.node(NODE, "4")?;
    rig.kubectl(&["uncordon", NODE])?;
    let games = rig.namespace("owner-kind-games")?;
    apply_game_server_crd(rig)?;
    allocated_and_followed(rig, &games, "gs-first", Duration::from_secs(90))?;
    told_on_every_replica(rig, false)?;

    // Agones uninstalled while busyguard runs (its chart deletes its CRDs): said again.
    let first = Owned { namespace: games.to_string(), resource: GAME_SERVERS, name: "gs-first".into() };
    set_state(rig, &first, "Ready")?;
    rig.kubectl(&["delete", "crd", GAME_SERVERS, "--wait=true"])?;
    told_on_every_replica(rig, true)?;

    // And installed again: followed again, with no restart.
    apply_game_server_crd(rig)?;
    allocated_and_followed(rig, &games, "gs-second", Duration::from_secs(90))
}

/// Whether every replica's `/status` says the GameServer rule is not followed (`told`), or none.
fn told_on_every_replica(rig: &Rig, told: bool) -> Result<()> {
    let what = if told { "every replica says the kind is not followed" } else { "no replica says so any more" };
    eventually(what, Duration::from_secs(60), || {
        let statuses = rig.statuses();
        Ok(statuses.len() == 2 && statuses.iter().all(|s| s.contains(NOT_FOLLOWED) == told))
    })
    .with_context(|| format!("/status: {:?}", rig.statuses()))
}

fn apply_game_server_crd(rig: &Rig) -> Result<()> {
    rig.apply(&game_server_crd())?;
    rig.established(GAME_SERVERS)?;
    Ok(())
}

/// A game server started and allocated; its pod turns busy within `within`.
fn allocated_and_followed(rig: &Rig, ns: &str, name: &str, within: Duration) -> Result<()> {
    let game_server = Owned { namespace: ns.to_string(), resource: GAME_SERVERS, name: name.into() };
    start_game_server(rig, &game_server)?;
    set_state(rig, &game_server, "Allocated")?;
    eventually(&format!("{name}'s pod follows its Allocated GameServer"), within, || {
        Ok(rig.pod(ns, name)?.is_some_and(|pod| label(&pod, "busyguard.io/busy").as_deref() == Some("true")))
    })
}

/// Agones as it runs: an allocation of a game server whose pod is held is refused with a
/// conflict; and Agones' controller deletes the pod of a game server whose match ended (its
/// GameServer shut down or deleted): with busyguard down, that delete is not sent to the
/// fail-closed delete webhook, so Agones' own end passes, while a person's delete of a busy game
/// server's pod is still refused.
pub fn agones_own_end_of_a_game_server_passes_while_busyguard_is_down(rig: &Rig) -> Result<()> {
    rig.apply(&game_server_crd())?;
    rig.established(GAME_SERVERS)?;
    rig.install_with(&["agones"])?;
    let outcome = agones_ends_its_own(rig);
    rig.scale_busyguard(2)?;
    rig.install_release(Path::new(ROOT), None)?;
    outcome
}

fn agones_ends_its_own(rig: &Rig) -> Result<()> {
    rig.node(NODE, "4")?;
    rig.kubectl(&["uncordon", NODE])?;
    let games = rig.namespace("agones-down")?;
    allocation_of_a_held_server_is_refused(rig, &games)?;
    allocated_and_followed(rig, &games, "gs-ending", Duration::from_secs(30))?;
    rig.scale_busyguard(0)?;
    let person = rig.try_kubectl(&["-n", &games, "delete", "pod", "gs-ending", "--wait=false"])?;
    ensure!(
        !person.0 && person.2.contains("busyguard"),
        "a person's delete went through with busyguard down: {}",
        person.2
    );
    // The match over, Agones shuts the GameServer down and its controller deletes the pod.
    let game_server = Owned { namespace: games.to_string(), resource: GAME_SERVERS, name: "gs-ending".into() };
    set_state(rig, &game_server, "Shutdown")?;
    let agones = "system:serviceaccount:agones-system:agones-controller";
    let grant = ["-n", &games, "create", "rolebinding", "agones", "--clusterrole=edit"];
    rig.kubectl(&[&grant[..], &["--serviceaccount=agones-system:agones-controller"]].concat())?;
    let (ok, _, err) = rig.try_kubectl_as(agones, &["-n", &games, "delete", "pod", "gs-ending", "--wait=false"])?;
    ensure!(ok, "Agones' own delete of its game server's pod was refused with busyguard down: {err}");
    Ok(())
}

/// A game server whose eviction was refused (its drain is under way) and whose match then
/// ended takes no new match: the allocator's update to Allocated is refused with a conflict,
/// which Agones' allocator answers by picking another server.
fn allocation_of_a_held_server_is_refused(rig: &Rig, games: &str) -> Result<()> {
    allocated_and_followed(rig, games, "gs-held", Duration::from_secs(30))?;
    let (evicted, _) = rig.evict(games, "gs-held")?;
    ensure!(!evicted, "an Allocated game server was evicted");
    let game_server = Owned { namespace: games.to_string(), resource: GAME_SERVERS, name: "gs-held".into() };
    set_state(rig, &game_server, "Ready")?;
    eventually("gs-held idle once its match ended", Duration::from_secs(10), || {
        Ok(rig.pod(games, "gs-held")?.is_some_and(|p| label(&p, "busyguard.io/busy").as_deref() == Some("false")))
    })?;
    let refused = set_state(rig, &game_server, "Allocated").err().map(|e| format!("{e:#}")).unwrap_or_default();
    ensure!(
        refused.contains("takes no new task now") && refused.contains("Conflict"),
        "the allocation of a held game server was not refused with a conflict: {refused:?}"
    );
    Ok(())
}

/// Where `../shared` keeps Actions Runner Controller's charts at a release, if it is there.
fn arc_release(release: &str) -> Option<PathBuf> {
    let dir = Path::new(ROOT).join(format!("../shared/peers/actions-runner-controller-{release}"));
    dir.is_dir().then_some(dir)
}

/// Actions Runner Controller's own `EphemeralRunner` CRD, release by release (0.12.1 writes
/// `jobRequestId` only, 0.14.2 `jobId` beside it; the schemas prune anything else), with the
/// listener's `HandleJobStarted` as each release's source makes it: a merge patch of the
/// status subresource, no resourceVersion. The runner's pod turns busy on both; deleting the
/// `EphemeralRunner` mid-job keeps it guarded (ARC's finalizer waits for the job), and a drain
/// waits for it. Needs ../shared (skipped, and said, without it).
pub fn runners_are_busy_on_every_release_of_actions_runner_controller(rig: &Rig) -> Result<()> {
    let releases: Vec<(&str, PathBuf)> =
        ["0.12.1", "0.14.2"].into_iter().filter_map(|r| Some((r, arc_release(r)?))).collect();
    if releases.is_empty() {
        println!(
            "e2e: skipped: Actions Runner Controller's charts are not in ../shared/peers (a clone without ../shared)"
        );
        return Ok(());
    }
    rig.install_with(&["actions-runner-controller"])?;
    let mut outcome = Ok(());
    for (release, dir) in releases {
        outcome = runner_guarded_on(rig, release, &dir).with_context(|| format!("gha-runner-scale-set {release}"));
        if outcome.is_err() {
            break;
        }
    }
    // Whatever happened, ARC's finalizers are lifted first: the CRD's delete waits for its objects.
    for runner in rig
        .get(&["ephemeralrunners", "-A"])
        .map(|l| l["items"].clone())
        .unwrap_or_default()
        .as_array()
        .into_iter()
        .flatten()
    {
        let (ns, name) = (runner["metadata"]["namespace"].as_str(), runner["metadata"]["name"].as_str());
        if let (Some(ns), Some(name)) = (ns, name) {
            let finalizers = r#"{"metadata":{"finalizers":null}}"#;
            let _ = rig.kubectl(&["-n", ns, "patch", "ephemeralrunner", name, "--type=merge", "-p", finalizers]);
        }
    }
    let _ = rig.kubectl(&["delete", "crd", "ephemeralrunners.actions.github.com", "--ignore-not-found"]);
    rig.install_release(Path::new(ROOT), None)?;
    outcome
}

fn runner_guarded_on(rig: &Rig, release: &str, dir: &Path) -> Result<()> {
    let crd = dir.join("charts/gha-runner-scale-set-controller/crds/actions.github.com_ephemeralrunners.yaml");
    // Replaced whole (create, or replace over another release's), as `helm upgrade` leaves CRDs.
    rig.install_crd(&crd)?;
    // busyguard asks for a kind it does not serve yet again within a minute: its runners are
    // followed from then on (and it sees them turn busy, so it knows when their jobs began).
    let not_followed = "--busy-when-owner actions.github.com/v1alpha1/EphemeralRunner: its owners are not followed";
    eventually("busyguard follows the runners", Duration::from_secs(90), || {
        let statuses = rig.statuses();
        Ok(statuses.len() == 2 && !statuses.iter().any(|s| s.contains(not_followed)))
    })?;
    let node = format!("e2e-arc-{}", release.replace('.', "-"));
    rig.node(&node, "4")?;
    let ns = rig.namespace(&format!("arc-{}", release.replace('.', "-")))?;
    // busyguard check reads the release's schema: on 0.12 the rule's jobId part never holds.
    let output = std::process::Command::new(crate::rig::BUSYGUARD)
        .args(["check", "-n", &ns, "--timeout", "60s", "--kubeconfig"])
        .arg(&rig.admin)
        .output()?;
    let said = String::from_utf8_lossy(&output.stdout);
    ensure!(output.status.success(), "check failed: {said}{}", String::from_utf8_lossy(&output.stderr));
    let warned = said.contains("the rule reads status.jobId, which the API server's schema of EphemeralRunner");
    ensure!(warned == (release == "0.12.1"), "check's warnings on {release}: {said}");
    let runner = Owned {
        namespace: ns.to_string(),
        resource: "ephemeralrunners.actions.github.com",
        name: "arc-runner-set-hx7qz-runner-4tb9k".into(),
    };
    rig.apply(&json!({"apiVersion": "actions.github.com/v1alpha1", "kind": "EphemeralRunner",
        "metadata": {"name": runner.name, "namespace": runner.namespace,
            "finalizers": ["ephemeralrunner.actions.github.com/finalizer"],
            "labels": {"actions.github.com/scale-set-name": "arc-runner-set", "app.kubernetes.io/component": "runner"}},
        "spec": {"githubConfigUrl": "https://github.com/example", "githubConfigSecret": "github-config",
            "runnerScaleSetId": 1, "spec": {"containers": [{"name": "runner", "image": "ghcr.io/actions/actions-runner"}]}}}))?;
    let labels = json!({"actions.github.com/scale-set-name": "arc-runner-set", "app.kubernetes.io/component": "runner",
        "actions-ephemeral-runner": "True", "app": runner.name});
    start_pod(rig, &runner, ("actions.github.com/v1alpha1", "EphemeralRunner"), labels.clone(), &node)?;

    // The listener's write on JobStarted, as this release makes it.
    let mut status = json!({"jobRequestId": 8274, "jobRepositoryName": "example/app", "workflowRunId": 3001,
        "jobWorkflowRef": "example/app/.github/workflows/ci.yaml@refs/heads/main", "jobDisplayName": "build"});
    if release != "0.12.1" {
        status["jobId"] = json!("6b7c1e0e-35c4-5f4d-8a4e-1e2f3a4b5c6d");
    }
    let args = ["-n", &ns, "patch", runner.resource, &runner.name, "--subresource=status", "--type=merge"];
    rig.kubectl(&[&args[..], &["-p", &json!({"status": status}).to_string()]].concat())?;
    let written = rig.get(&["-n", &ns, runner.resource, &runner.name])?;
    ensure!(
        written["status"]["jobRequestId"] == 8274 && (release != "0.12.1" || written["status"]["jobId"].is_null()),
        "the release's schema did not keep what its listener writes: {}",
        written["status"]
    );
    busy(rig, &runner, true)?;
    // Bounded by a GitHub job's ceiling, not the day of --max-busy: ARC never clears the job of
    // a runner whose process hangs.
    let pod = rig.pod(&ns, &runner.name)?.context("the runner's pod")?;
    let bound = &pod["metadata"]["annotations"]["busyguard.io/max-busy"];
    ensure!(bound == "6h15m", "the runner's pod turned busy with max-busy {bound}, not the component's 6h15m");
    workflow_pod_guarded_with_its_runner(rig, &runner, &node)?;

    // Deleted mid-job (a person's `kubectl delete ephemeralrunner`): ARC's finalizer waits for
    // the job, and so does busyguard.
    rig.kubectl(&["-n", &ns, "delete", runner.resource, &runner.name, "--wait=false"])?;
    std::thread::sleep(Duration::from_secs(2));
    busy(rig, &runner, true)?;
    let (drained, _, _) = rig.try_kubectl(&["drain", &node, "--force", "--ignore-daemonsets", "--timeout=10s"])?;
    ensure!(!drained, "a drain took the runner of a job still running");
    ensure!(rig.pod(&ns, &runner.name)?.is_some(), "the runner's pod went mid-job");

    // The job done, the runner exits (the kubelet writes the pod's end), ARC deletes the pod
    // and its finalizer lets the EphemeralRunner go.
    let finished = json!({"status": {"phase": "Succeeded", "containerStatuses": [{"name": "main",
        "image": "example.com/owned", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": jiff::Timestamp::now().to_string()}}}]}});
    let status = ["-n", &ns, "patch", "pod", &runner.name, "--subresource=status", "--type=merge"];
    rig.kubectl(&[&status[..], &["-p", &finished.to_string()]].concat())?;
    rig.kubectl(&["-n", &ns, "delete", "pod", &runner.name, "--wait=false"])?;
    eventually("the finished runner's pod goes", Duration::from_secs(30), || {
        Ok(rig.pod(&ns, &runner.name)?.is_none())
    })?;

    // A pod made for the runner after its job began (as ARC re-creates a vanished runner's pod,
    // its JIT config spent) takes no job: opted in, and left idle.
    start_pod(rig, &runner, ("actions.github.com/v1alpha1", "EphemeralRunner"), labels, &node)?;
    let mut seen = None;
    throughout("the re-created pod stays idle", Duration::from_secs(5), || {
        seen = rig.pod(&ns, &runner.name)?.map(|p| p["metadata"].clone());
        Ok(seen.as_ref().is_some_and(|p| p["labels"]["busyguard.io/busy"] == "false"))
    })
    .with_context(|| format!("the re-created pod: {seen:?}"))?;
    rig.kubectl(&["-n", &ns, "delete", "pod", &runner.name, "--wait=false"])?;
    let finalizer = r#"[{"op":"remove","path":"/metadata/finalizers"}]"#;
    rig.kubectl(&["-n", &ns, "patch", runner.resource, &runner.name, "--type=json", "-p", finalizer])?;
    rig.kubectl(&["uncordon", &node]).map(drop)
}

/// `containerMode: kubernetes`: the runner's container hooks run the job's steps in a pod of
/// their own, `<runner pod>-workflow`, labelled `runner-pod: <runner pod>`, no owner, on the
/// runner's node (`createPod`). It is opted in and busy while its runner is, a drain's eviction
/// is refused, and the hooks' cleanup (`prunePods`: a delete with grace 0, with the runner's own
/// token) goes through.
fn workflow_pod_guarded_with_its_runner(rig: &Rig, runner: &Owned, node: &str) -> Result<()> {
    let ns = &runner.namespace;
    let name = format!("{}-workflow", runner.name);
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"runner-pod": runner.name}},
        "spec": {"nodeName": node, "restartPolicy": "Never",
            "containers": [{"name": "job", "image": "example.com/ci-job"}]}});
    crate::rig::kubectl_stdin(&rig.admin, &["create", "-f", "-"], &pod.to_string())?;
    eventually(&format!("{name} busy with its runner"), Duration::from_secs(20), || {
        Ok(rig.pod(ns, &name)?.is_some_and(|p| label(&p, "busyguard.io/busy").as_deref() == Some("true")))
    })?;
    let (evicted, why) = rig.evict(ns, &name)?;
    ensure!(!evicted, "the workflow pod of a running job was evicted: {why}");
    // The hooks speak with the runner pod's token (its service account may delete pods).
    rig.grant(ns, "hooks", "get,list,create,delete", "pods", &format!("{ns}:default"))?;
    let token = rig.pod_token(ns, "default", &runner.name)?;
    let hooks = rig.kubeconfig_for(&format!("{}-hooks", runner.name), &token)?;
    let (ok, _, err) =
        crate::rig::kubectl(&hooks, &["-n", ns, "delete", "pod", &name, "--grace-period=0", "--wait=false"])?;
    ensure!(ok, "the runner's hooks could not clean up its workflow pod: {err}");
    eventually(&format!("{name}: let through as its runner's"), Duration::from_secs(10), || {
        Ok(rig.audited(ns, &name, "exempted").iter().any(|a| a["reason"] == "leader"))
    })
}

/// Whether the runner's pod carries `busyguard.io/busy: "true"` (`busy`), within 10 s.
fn busy(rig: &Rig, runner: &Owned, busy: bool) -> Result<()> {
    let want = if busy { "true" } else { "false" };
    eventually(&format!("{}'s pod busy={want}", runner.name), Duration::from_secs(10), || {
        let pod = rig.pod(&runner.namespace, &runner.name)?;
        Ok(pod.is_some_and(|p| label(&p, "busyguard.io/busy").as_deref() == Some(want)))
    })
}
