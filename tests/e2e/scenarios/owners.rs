//! Busy from the owner's status, as the recipes ship it (manifests/actions-runner-controller,
//! manifests/agones): a runner pod owned by an `EphemeralRunner`, busy while it has a job, and a
//! game server's pod owned by a `GameServer`, busy while Allocated. The custom resource
//! definitions are written here, of those projects' shape (only the fields the rules read), and
//! their controllers' writes are played as their sources make them.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::rig::{ROOT, Rig, eventually};
use crate::workers::{self, label};

pub(super) const NODE: &str = "e2e-owners";

/// Owner-to-pod flips measured (each way) per owner kind.
const FLIPS: usize = 10;

pub fn runners_and_game_servers_are_busy_from_their_owners_status(rig: &Rig) -> Result<()> {
    rig.apply(&json!({"apiVersion": "v1", "kind": "List", "items": [ephemeral_runner_crd(), game_server_crd()]}))?;
    for crd in ["ephemeralrunners.actions.github.com", "gameservers.agones.dev"] {
        rig.established(crd)?;
    }
    rig.install_with(&["actions-runner-controller", "agones"])?;
    let outcome = guarded_as_their_owners_say(rig);
    // Whatever happened, the next scenarios find the base installed.
    rig.install_release(std::path::Path::new(ROOT), None)?;
    outcome
}

fn guarded_as_their_owners_say(rig: &Rig) -> Result<()> {
    rig.node(NODE, "4")?;
    let (runners, games) = (rig.namespace("runners")?, rig.namespace("games")?);
    let runner = Owned {
        namespace: runners.to_string(),
        resource: "ephemeralrunners.actions.github.com",
        name: "scale-set-runner-x7k2p".into(),
    };
    let game_server =
        Owned { namespace: games.to_string(), resource: "gameservers.agones.dev", name: "fleet-gs-q4m".into() };
    start_runner(rig, &runner)?;
    start_game_server(rig, &game_server)?;
    for owned in [&runner, &game_server] {
        let pod = rig.pod(&owned.namespace, &owned.name)?.context("the owner's pod")?;
        ensure!(
            label(&pod, "busyguard.io/busy").as_deref() == Some("false"),
            "{}: not opted in at creation",
            owned.name
        );
    }

    let mut lags = Vec::new();
    for i in 0..FLIPS {
        lags.push(runner.lag(rig, || assign_job(rig, &runner, i), "true")?);
        lags.push(runner.lag(rig, || clear_job(rig, &runner), "false")?);
        lags.push(game_server.lag(rig, || set_state(rig, &game_server, "Allocated"), "true")?);
        lags.push(game_server.lag(rig, || set_state(rig, &game_server, "Ready"), "false")?);
    }
    lags.sort();
    let percentile = |p: usize| lags[(lags.len() * p / 100).min(lags.len() - 1)];
    let (p50, p99) = (percentile(50), percentile(99));
    eprintln!("e2e: owner-to-pod lag over {} flips: p50 {p50:?}, p99 {p99:?}", lags.len());
    ensure!(p99 < Duration::from_secs(1), "a pod followed its owner's status only after {p99:?} (p99)");

    // Both busy: the deletion cost and the autoscalers' annotations follow, as for any busy pod.
    assign_job(rig, &runner, FLIPS)?;
    set_state(rig, &game_server, "Allocated")?;
    for owned in [&runner, &game_server] {
        eventually(&format!("{} busy and annotated", owned.name), Duration::from_secs(5), || {
            let pod = rig.pod(&owned.namespace, &owned.name)?.unwrap_or_default();
            Ok(label(&pod, "busyguard.io/protected").as_deref() == Some("true")
                && workers::annotation(&pod, "karpenter.sh/do-not-disrupt").is_some())
        })?;
        // The busy-pod PDB (integer minAvailable: no scale subresource needed) is kept on the sweep.
        rig.busy_pdb_made(&owned.namespace)?;
    }

    // busyguard down: the busy-pod PDBs still hold both.
    rig.scale_busyguard(0)?;
    let while_down = rig.try_kubectl(&["drain", NODE, "--force", "--ignore-daemonsets", "--timeout=10s"]);
    rig.scale_busyguard(2)?;
    let (drained, _, err) = while_down?;
    ensure!(!drained, "the drain took a busy runner or game server while busyguard was down");
    ensure!(err.contains("disruption budget"), "not refused by the busy-pod PDB: {err}");

    // busyguard up: the drain waits for each, and completes once their owners say idle.
    let drain = rig.kubectl_aside(&["drain", NODE, "--force", "--ignore-daemonsets", "--timeout=120s"])?;
    for owned in [&runner, &game_server] {
        eventually(&format!("{}: evictions refused", owned.name), Duration::from_secs(20), || {
            Ok(!rig.audited(&owned.namespace, &owned.name, "denied").is_empty())
        })?;
    }
    clear_job(rig, &runner)?;
    eventually("the runner goes once its job is done", Duration::from_secs(30), || {
        Ok(rig.pod(&runner.namespace, &runner.name)?.is_none())
    })?;
    ensure!(rig.pod(&games, &game_server.name)?.is_some(), "the Allocated game server's pod went with the runner");
    set_state(rig, &game_server, "Ready")?;
    let output = drain.wait_with_output()?;
    ensure!(output.status.success(), "the drain did not complete: {}", String::from_utf8_lossy(&output.stderr));
    ensure!(rig.pod(&games, &game_server.name)?.is_none(), "the drain completed with the game server still there");
    Ok(())
}

/// An owner and its pod, of the same name (as Actions Runner Controller and Agones name them).
pub(super) struct Owned {
    pub namespace: String,
    pub resource: &'static str,
    pub name: String,
}

impl Owned {
    /// How long after the owner's `change` is seen the pod's busy label turns `value`, both
    /// seen through watches, as busyguard sees them.
    fn lag(&self, rig: &Rig, change: impl FnOnce() -> Result<()>, value: &str) -> Result<Duration> {
        let (mut owner_watch, owner_seen) = self.watch(rig, self.resource, "{.metadata.resourceVersion}")?;
        let (mut pod_watch, pod_seen) = self.watch(rig, "pod", "{.metadata.labels.busyguard\\.io/busy}")?;
        // The watches' first lines are the objects as they are now.
        let (_, version) = owner_seen.recv_timeout(Duration::from_secs(10)).context("the owner's watch")?;
        pod_seen.recv_timeout(Duration::from_secs(10)).context("the pod's watch")?;
        change()?;
        let changed = loop {
            let (at, seen) = owner_seen.recv_timeout(Duration::from_secs(10)).context("the owner's change")?;
            if seen != version {
                break at;
            }
        };
        let flipped = loop {
            let (at, seen) = pod_seen.recv_timeout(Duration::from_secs(10)).context("the pod's flip")?;
            if seen == value {
                break at;
            }
        };
        let _ = (owner_watch.kill(), pod_watch.kill());
        Ok(flipped.saturating_duration_since(changed))
    }

    /// `kubectl get -w` of the object of the owner's name, a line per event, each with the time
    /// it came.
    fn watch(&self, rig: &Rig, resource: &str, field: &str) -> Result<(Child, Receiver<(Instant, String)>)> {
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&rig.admin)
            .args(["-n", &self.namespace, "get", resource, &self.name, "-w", "-o"])
            .arg(format!("jsonpath={field}{{\"\\n\"}}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let stdout = child.stdout.take().context("the watch's output")?;
        let (lines, seen) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if lines.send((Instant::now(), line)).is_err() {
                    return;
                }
            }
        });
        Ok((child, seen))
    }
}

/// Actions Runner Controller creates the `EphemeralRunner`, then its pod of the same name, owned
/// by it, labelled `actions-ephemeral-runner` (`newEphemeralRunnerPod`).
fn start_runner(rig: &Rig, runner: &Owned) -> Result<()> {
    rig.apply(&json!({"apiVersion": "actions.github.com/v1alpha1", "kind": "EphemeralRunner",
        "metadata": {"name": runner.name, "namespace": runner.namespace,
            "labels": {"actions.github.com/scale-set-name": "scale-set", "app.kubernetes.io/component": "runner"}},
        "spec": {"githubConfigUrl": "https://github.com/example"}}))?;
    let labels = json!({"actions.github.com/scale-set-name": "scale-set", "app.kubernetes.io/component": "runner",
        "actions-ephemeral-runner": "True", "app": runner.name});
    start_pod(rig, runner, ("actions.github.com/v1alpha1", "EphemeralRunner"), labels, NODE)
}

/// Agones creates the `GameServer`, then its pod of the same name, owned by it, labelled
/// `agones.dev/gameserver`; the game server's SDK then marks it Ready.
pub(super) fn start_game_server(rig: &Rig, game_server: &Owned) -> Result<()> {
    rig.apply(&json!({"apiVersion": "agones.dev/v1", "kind": "GameServer",
        "metadata": {"name": game_server.name, "namespace": game_server.namespace},
        "spec": {"ports": [{"name": "default", "containerPort": 7654}]},
        "status": {"state": "Scheduled"}}))?;
    let labels = json!({"agones.dev/gameserver": game_server.name, "agones.dev/role": "gameserver",
        "app": game_server.name});
    start_pod(rig, game_server, ("agones.dev/v1", "GameServer"), labels, NODE)?;
    set_state(rig, game_server, "Ready")
}

/// The owner's pod, as its controller creates it, on `node`.
pub(super) fn start_pod(
    rig: &Rig,
    owned: &Owned,
    (api_version, kind): (&str, &str),
    labels: Value,
    node: &str,
) -> Result<()> {
    let owner = rig.get(&["-n", &owned.namespace, owned.resource, &owned.name])?;
    let reference = json!({"apiVersion": api_version, "kind": kind, "name": owned.name,
        "uid": owner["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true});
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": owned.name, "namespace": owned.namespace, "labels": labels, "ownerReferences": [reference]},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "example.com/owned"}]}});
    // Created as is (kubectl create, not apply: no last-applied annotation, as a controller's).
    crate::rig::kubectl_stdin(&rig.admin, &["create", "-f", "-"], &pod.to_string())?;
    eventually(&format!("{} runs", owned.name), Duration::from_secs(60), || {
        Ok(workers::ready_pods(rig, &owned.namespace, &owned.name)?.len() == 1)
    })
}

/// The listener's `HandleJobStarted`: a merge patch of the runner's status subresource with the
/// job's fields and the Running phase, guarded by the resourceVersion it read.
fn assign_job(rig: &Rig, runner: &Owned, i: usize) -> Result<()> {
    let current = rig.get(&["-n", &runner.namespace, runner.resource, &runner.name])?;
    let patch = json!({"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
        "status": {"jobRequestId": 1000 + i, "jobRepositoryName": "example/app", "jobId": format!("job-{i}"),
            "workflowRunId": 2000 + i, "jobWorkflowRef": "example/app/.github/workflows/ci.yaml@refs/heads/main",
            "jobDisplayName": "build", "phase": "Running"}});
    let args =
        ["-n", &runner.namespace, "patch", runner.resource, &runner.name, "--subresource=status", "--type=merge"];
    rig.kubectl(&[&args[..], &["-p", &patch.to_string()]].concat()).map(drop)
}

/// The job's end as the runner's status says it: no job id. (Actions Runner Controller itself
/// ends the pod with the job, which frees it as well: a finished pod is not protected.)
fn clear_job(rig: &Rig, runner: &Owned) -> Result<()> {
    let args =
        ["-n", &runner.namespace, "patch", runner.resource, &runner.name, "--subresource=status", "--type=merge"];
    rig.kubectl(&[&args[..], &["-p", r#"{"status":{"jobId":null}}"#]].concat()).map(drop)
}

/// The allocator's (and the SDK server's) write: the whole `GameServer` updated with its new
/// state (Agones' GameServer has no status subresource).
pub(super) fn set_state(rig: &Rig, game_server: &Owned, state: &str) -> Result<()> {
    let mut current = rig.get(&["-n", &game_server.namespace, game_server.resource, &game_server.name])?;
    current["status"]["state"] = json!(state);
    crate::rig::kubectl_stdin(&rig.admin, &["replace", "-f", "-"], &current.to_string()).map(drop)
}

fn ephemeral_runner_crd() -> Value {
    crd(
        "actions.github.com",
        "v1alpha1",
        "EphemeralRunner",
        "ephemeralrunners",
        true,
        json!({"jobId": {"type": "string"}, "phase": {"type": "string"}}),
    )
}

pub(super) fn game_server_crd() -> Value {
    crd("agones.dev", "v1", "GameServer", "gameservers", false, json!({"state": {"type": "string"}}))
}

/// A namespaced kind whose spec is free and whose status has only `status` fields.
fn crd(group: &str, version: &str, kind: &str, plural: &str, status_subresource: bool, status: Value) -> Value {
    let mut served = json!({"name": version, "served": true, "storage": true,
        "schema": {"openAPIV3Schema": {"type": "object", "properties": {
            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "status": {"type": "object", "properties": status}}}}});
    if status_subresource {
        served["subresources"] = json!({"status": {}});
    }
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {"group": group, "scope": "Namespaced", "versions": [served],
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")}}})
}
