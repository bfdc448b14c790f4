//! Agones itself: its CRDs, RBAC, webhooks and game-server PDB from its 1.60.0 chart (rendered
//! as `helm install` renders it), its controller and extensions (webhooks, allocator) built from
//! its source in ../shared/peers, and each game server's SDK server, all run beside the control
//! plane with their own service accounts' tokens. Fleets, GameServerSets, GameServers and pods
//! all come from Agones' code; the allocations are Agones' allocator's, asked of the extensions as
//! the API server's aggregation layer passes them on.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};

use super::autoscalers::{CAST_AI, OCEAN};
use crate::rig::{ROOT, Rig, args_patch, die_with_parent, eventually, free_ports, throughout};
use crate::workers::{annotation, label};

const CRDS: &[&str] = &[
    "fleets.agones.dev",
    "gameservers.agones.dev",
    "gameserversets.agones.dev",
    "fleetautoscalers.autoscaling.agones.dev",
    "gameserverallocationpolicies.multicluster.agones.dev",
];
const WEBHOOKS: &[&str] = &[
    "validatingwebhookconfiguration/agones-validation-webhook",
    "mutatingwebhookconfiguration/agones-mutation-webhook",
    "mutatingwebhookconfiguration/zzz-agones-mutation-webhook",
];
/// Where the extensions serve their webhooks and the allocation API (Agones' default port).
const EXTENSIONS: &str = "https://127.0.0.1:8081";
/// Agones' extensions read their serving pair from here, whatever their flags say.
const CERTS: &str = "/certs";
const FLEET: &str = "arena";
const NODE_A: &str = "agones-a";
const NODE_B: &str = "agones-b";

/// A fleet that reuses its game servers (`SDK.Ready()` after a match) on a node being drained,
/// under a steady stream of allocations that prefer the server the drain waits for, as Packed
/// allocation does (agones#4508): the Allocated server's eviction is refused; a Reserved one is
/// guarded until its `reservedUntil`, then Ready and idle; once the match ends, the allocator's
/// next update of that server to Allocated is refused with a conflict and Agones allocates
/// another, so the drain finishes. Then Agones' own ends: a rolling update and a Fleet
/// scale-down that keep its Allocated server, and with busyguard down, that server's `SDK.Shutdown()`, whose pod Agones'
/// controller deletes.
pub fn agones_drains_a_reusing_fleet_under_steady_allocations(rig: &Rig) -> Result<()> {
    with_agones(rig, "agones", || rig.install_with(&["agones"]), |agones, games| drains_and_ends(rig, agones, games))
}

/// Runs `scenario` in a namespace of its own with Agones installed and busyguard as `install`
/// installs it; then Agones is uninstalled and busyguard's base installed again, two replicas
/// answering, whatever the scenario did. Skipped, and said, where Agones is not at hand.
fn with_agones(
    rig: &Rig,
    namespace: &str,
    install: impl FnOnce() -> Result<()>,
    scenario: impl FnOnce(&Agones, &str) -> Result<()>,
) -> Result<()> {
    let Some(bin) = agones_at_hand()? else { return Ok(()) };
    let games = rig.namespace(namespace)?;
    let agones = Agones::install(rig, &bin, &games);
    let outcome = agones.and_then(|agones| {
        install()?;
        let outcome = scenario(&agones, &games);
        let cleanup = agones.uninstall(rig, &games);
        outcome.and(cleanup)
    });
    let _ = rig.scale_busyguard(2);
    for webhook in WEBHOOKS {
        let _ = rig.try_kubectl(&["delete", webhook, "--ignore-not-found"]);
    }
    rig.install_release(Path::new(ROOT), None)?;
    outcome
}

fn drains_and_ends(rig: &Rig, agones: &Agones, games: &str) -> Result<()> {
    // The fleet starts on agones-a alone: the node its servers move to comes with the drain,
    // though a run before this one (`E2E_REPEAT`) left it there.
    rig.kubectl(&["delete", "node", NODE_B, "--ignore-not-found"])?;
    rig.node(NODE_A, "8")?;
    rig.apply(&fleet(games, 3))?;
    let ready = agones.ready_game_servers(rig, games, NODE_A, 3, Duration::from_secs(90))?;

    // A match, and a reservation for one to come.
    let playing = agones.allocate(games)?;
    ensure!(playing.1 == NODE_A, "allocated on {}", playing.1);
    let playing = playing.0;
    busy_label(rig, games, &playing, "true", Duration::from_secs(10))?;
    agones.sdk(&playing)?.call("/metadata/label", json!({"key": "favourite", "value": "yes"}))?;
    let reserved = ready.iter().find(|gs| **gs != playing).context("a second game server")?.clone();
    agones.sdk(&reserved)?.call("/reserve", json!({"seconds": "6"}))?;
    state(rig, games, &reserved, "Reserved", Duration::from_secs(10))?;
    busy_label(rig, games, &reserved, "true", Duration::from_secs(10))?;
    let (evicted, why) = rig.evict(games, &reserved)?;
    ensure!(!evicted && why.contains("TooManyRequests"), "a Reserved game server was evicted: {why}");
    // Agones moves it back to Ready at its reservedUntil; its pod is idle again.
    state(rig, games, &reserved, "Ready", Duration::from_secs(20))?;
    busy_label(rig, games, &reserved, "false", Duration::from_secs(10))?;

    // The drain begins, as `kubectl drain` does: cordon, then evict each pod. Only the match in
    // play stays; the fleet replaces the others on the other node.
    rig.node(NODE_B, "8")?;
    rig.kubectl(&["cordon", NODE_A])?;
    for gs in &ready {
        let (evicted, why) = rig.evict(games, gs)?;
        ensure!(evicted == (*gs != playing), "eviction of {gs} (playing: {playing}): {evicted} {why}");
    }
    agones.ready_game_servers(rig, games, NODE_B, 2, Duration::from_secs(90))?;

    // Players keep coming: an allocation a second, each match a second long, the server reused.
    let stream = Allocations::start(&agones.allocator, games);
    std::thread::sleep(Duration::from_secs(3));
    // The drain retries (kubectl drain: every 5 s), refused while the match lasts.
    let (evicted, why) = rig.evict(games, &playing)?;
    ensure!(!evicted, "the match in play was evicted: {why}");
    // The match ends and its server goes back to Ready, on the node being drained: the
    // allocator, which prefers it, is refused and gives the next match to another server.
    agones.sdk(&playing)?.call("/ready", json!({}))?;
    state(rig, games, &playing, "Ready", Duration::from_secs(10))?;
    let next = agones.allocate(games)?;
    ensure!(next.0 != playing && next.1 == NODE_B, "a match went to {next:?} on the node being drained");
    // Its audit line is written a moment after the refusal, and the stream's allocations try the
    // server again when this one went elsewhere.
    let mut refused = Vec::new();
    eventually(&format!("an allocation of {playing} refused"), Duration::from_secs(15), || {
        refused = rig.audited(games, &playing, "denied");
        Ok(refused.iter().any(|l| l["detail"].as_str().is_some_and(|m| m.contains("takes no new task now"))))
    })
    .with_context(|| format!("its refusals audited then: {refused:?}"))?;
    agones.sdk(&next.0)?.call("/ready", json!({}))?;

    let started = Instant::now();
    let drain =
        rig.try_kubectl(&["drain", NODE_A, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=120s"])?;
    let allocations = stream.stop();
    ensure!(drain.0, "the drain did not finish under a stream of allocations: {}", drain.2);
    // The evicted pod's grace period (Agones' 30 s) is most of it.
    println!("e2e: the drain took {:?}, {} allocations meanwhile", started.elapsed(), allocations.len());
    ensure!(allocations.len() >= 3, "the stream of allocations stalled: {allocations:?}");
    let on_a: Vec<_> = allocations.iter().filter(|(_, node)| node == NODE_A).collect();
    ensure!(on_a.is_empty(), "matches went to the node being drained: {on_a:?}");

    agones_own_ends(rig, agones, games)
}

/// docs/agones.md's recipe for servers that host many sessions at once, its overlay's patches
/// applied as the page gives them, beside Agones' own controller and SDK server: a Ready game
/// server whose game counts a session in (`SDK.Beta().IncrementCounter`) is busy, its eviction
/// refused; once its last session ends it is idle, and its eviction goes through. Installed with
/// docs/autoscalers.md's CAST AI annotation and Ocean label too: busyguard writes them as it
/// flips the pod after its owner, and gives the pod back its own values as Agones' server goes
/// idle.
pub fn agones_servers_with_sessions_on_a_counter_are_busy_by_the_recipe(rig: &Rig) -> Result<()> {
    let vendor_keys = args_patch(&[format!("--busy-annotation={CAST_AI}=true"), format!("--busy-label={OCEAN}=true")])?;
    let install = || rig.install_overlay(&["agones"], &format!("{}\n  - {vendor_keys}", counter_recipe()?.trim_end()));
    with_agones(rig, "agones-sessions", install, |agones, games| busy_while_sessions_last(rig, agones, games))
}

fn busy_while_sessions_last(rig: &Rig, agones: &Agones, games: &str) -> Result<()> {
    rig.node(NODE_A, "8")?;
    let mut lobby = json!({"apiVersion": "agones.dev/v1", "kind": "GameServer",
        "metadata": {"name": "lobby", "namespace": games}, "spec": game_server_spec()});
    lobby["spec"]["counters"] = json!({"sessions": {"count": 0, "capacity": 10}});
    lobby["spec"]["template"]["metadata"] = json!({"annotations": {CAST_AI: "false"}});
    rig.apply(&lobby)?;
    state(rig, games, "lobby", "Ready", Duration::from_secs(60))?;
    busy_label(rig, games, "lobby", "false", Duration::from_secs(10))?;
    let vendor_keys = |pod: &serde_json::Value| (annotation(pod, CAST_AI), label(pod, OCEAN));

    // Two players join, as the game tells its SDK server, which patches the GameServer's count.
    let sessions = |diff: i64| agones.sdk("lobby")?.call("/v1beta1/counters/sessions", json!({"countDiff": diff}));
    sessions(1)?;
    sessions(1)?;
    busy_label(rig, games, "lobby", "true", Duration::from_secs(10))?;
    let busy = rig.pod(games, "lobby")?.context("lobby's pod")?;
    let written = (Some("true".to_string()), Some("true".to_string()));
    ensure!(vendor_keys(&busy) == written, "the vendor keys on the busy server: {}", busy["metadata"]);
    let (evicted, why) = rig.evict(games, "lobby")?;
    ensure!(!evicted && why.contains("TooManyRequests"), "a server hosting sessions was evicted: {why}");
    state(rig, games, "lobby", "Ready", Duration::from_secs(1)).context("Agones' state is Ready throughout")?;

    // One leaves: a session still runs. The last one leaves: the server is idle, and goes.
    sessions(-1)?;
    throughout("lobby busy while one session is left", Duration::from_secs(3), || {
        Ok(rig.pod(games, "lobby")?.is_some_and(|p| label(&p, "busyguard.io/busy").as_deref() == Some("true")))
    })?;
    sessions(-1)?;
    busy_label(rig, games, "lobby", "false", Duration::from_secs(10))?;
    let idle = rig.pod(games, "lobby")?.context("lobby's pod")?;
    let its_own = (Some("false".to_string()), None);
    ensure!(vendor_keys(&idle) == its_own, "the idle server's own values: {}", idle["metadata"]);
    let (evicted, why) = rig.evict(games, "lobby")?;
    ensure!(evicted, "the server was not evicted once its last session ended: {why}");
    Ok(())
}

/// The overlay's `patches:` docs/agones.md gives under "Sessions on a counter", as a user
/// copies them.
fn counter_recipe() -> Result<String> {
    let page = std::fs::read_to_string(Path::new(ROOT).join("docs/agones.md"))?;
    let section = page.split("\n## Sessions on a counter\n").nth(1).context("docs/agones.md: no sessions section")?;
    let block = (section.split("```yaml\n").nth(1)).and_then(|rest| rest.split("```").next());
    let block = block.context("docs/agones.md: the sessions section has no YAML block")?;
    ensure!(block.starts_with("patches:"), "docs/agones.md: the sessions recipe is not an overlay's patches");
    Ok(block.to_string())
}

/// A rolling update and a Fleet scaled to zero keep its Allocated server (Agones never scales
/// one down) and replace or delete the others; with busyguard down, the match ends by
/// `SDK.Shutdown()` and Agones' controller deletes the pod.
fn agones_own_ends(rig: &Rig, agones: &Agones, games: &str) -> Result<()> {
    agones.ready_game_servers(rig, games, NODE_B, 3, Duration::from_secs(60))?;
    let (last, _) = agones.allocate(games)?;
    busy_label(rig, games, &last, "true", Duration::from_secs(10))?;
    // A rolling update (a new template): Agones replaces the Ready servers, never the Allocated.
    let before: Vec<String> = game_servers(rig, games)?.into_keys().collect();
    let template = r#"{"spec": {"template": {"metadata": {"labels": {"version": "2"}}}}}"#;
    rig.kubectl(&["-n", games, "patch", "fleet", FLEET, "--type=merge", "-p", template])?;
    eventually("the fleet's Ready servers replaced, its Allocated one kept", Duration::from_secs(90), || {
        let servers = game_servers(rig, games)?;
        let old_ready = servers.keys().filter(|name| before.contains(name) && **name != last).count();
        let new_ready =
            (servers.iter()).filter(|(name, (state, _))| !before.contains(name) && state == "Ready").count();
        Ok(old_ready == 0 && new_ready >= 2 && servers.get(&last).is_some_and(|(state, _)| state == "Allocated"))
    })?;
    ensure!(rig.pod(games, &last)?.is_some(), "the Allocated server's pod went with the rolling update");
    rig.kubectl(&["-n", games, "scale", "fleet", FLEET, "--replicas=0"])?;
    eventually("the fleet's Ready game servers gone, its Allocated one kept", Duration::from_secs(60), || {
        let servers = game_servers(rig, games)?;
        Ok(servers.len() == 1 && servers.contains_key(&last))
    })?;
    ensure!(rig.pod(games, &last)?.is_some(), "the Allocated server's pod went with the scale-down");
    rig.scale_busyguard(0)?;
    agones.sdk(&last)?.call("/shutdown", json!({}))?;
    eventually("the match's pod deleted by Agones with busyguard down", Duration::from_secs(60), || {
        Ok(rig.pod(games, &last)?.is_none())
    })?;
    rig.scale_busyguard(2)
}

/// The folder of Agones' binaries, or None (and the scenario skipped, said) without ../shared or
/// where Agones' extensions cannot have their certificate.
fn agones_at_hand() -> Result<Option<PathBuf>> {
    let Some(bin) = agones_binaries()? else {
        println!("e2e: skipped: Agones' source is not in ../shared/peers (a clone without ../shared)");
        return Ok(None);
    };
    if let Err(e) = std::fs::create_dir_all(CERTS).and_then(|_| std::fs::metadata(CERTS)) {
        println!("e2e: skipped: Agones' extensions read their certificate from {CERTS}, not writable here: {e}");
        return Ok(None);
    }
    Ok(Some(bin))
}

/// The folder of Agones' binaries (built once per clone by tests/e2e/agones/build.sh), or None
/// without ../shared.
fn agones_binaries() -> Result<Option<PathBuf>> {
    let output = Command::new(Path::new(ROOT).join("tests/e2e/agones/build.sh")).stderr(Stdio::inherit()).output()?;
    ensure!(output.status.success(), "building Agones failed (tests/e2e/agones/build.sh)");
    let bin = String::from_utf8(output.stdout)?.trim().to_string();
    Ok((!bin.is_empty()).then(|| PathBuf::from(bin)))
}

fn fleet(ns: &str, replicas: u32) -> Value {
    json!({"apiVersion": "agones.dev/v1", "kind": "Fleet", "metadata": {"name": FLEET, "namespace": ns},
        "spec": {"replicas": replicas, "template": {"spec": game_server_spec()}}})
}

/// A game server's spec, on the scenario's nodes.
fn game_server_spec() -> Value {
    json!({
        "eviction": {"safe": "Always"},
        "health": {"disabled": true},
        "ports": [{"name": "default", "containerPort": 7654}],
        "template": {"spec": {
            "containers": [{"name": "game", "image": "game:1"}],
            "tolerations": [{"key": "e2e", "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE_A, NODE_B]}]}]}}}}}})
}

/// Agones as installed: its controller and extensions running, an SDK server per game server.
struct Agones {
    bin: PathBuf,
    sdk_kubeconfig: PathBuf,
    allocator: Allocator,
    stop: Arc<AtomicBool>,
    _processes: Vec<Process>,
}

/// What a game and a matchmaker reach: the allocator, and each game server's SDK server.
#[derive(Clone)]
struct Allocator {
    ca: PathBuf,
    sidecars: Arc<Mutex<BTreeMap<String, Sidecar>>>,
}

impl Agones {
    fn install(rig: &Rig, bin: &Path, games: &str) -> Result<Agones> {
        for crd in CRDS {
            rig.kubectl(&["delete", "crd", crd, "--ignore-not-found", "--wait=true"])?;
        }
        let certs = rig.work.join("agones-certs");
        let _ = std::fs::remove_dir_all(&certs);
        crate::rig::run(Command::new(crate::rig::BUSYGUARD).args(["certs", "--dir"]).arg(&certs))?;
        std::fs::copy(certs.join("tls.crt"), Path::new(CERTS).join("server.crt"))?;
        std::fs::copy(certs.join("tls.key"), Path::new(CERTS).join("server.key"))?;
        let chart = bin.parent().context("the source's folder")?.join("install/helm/agones");
        let python = Path::new(ROOT).join("target/bench-tools/helm-python");
        let rendered = crate::rig::run(
            Command::new("python3")
                .env("PYTHONPATH", &python)
                .arg(Path::new(ROOT).join("tests/e2e/agones/render.py"))
                .arg(&chart)
                .args(["--namespace", games, "--url", EXTENSIONS, "--ca"])
                .arg(certs.join("ca.crt")),
        )?;
        let path = rig.work.join("agones-chart.json");
        std::fs::write(&path, rendered)?;
        let _ = rig.try_kubectl(&["create", "namespace", "agones-system"]);
        // Its CRDs carry fields 1.28 does not know (`x-kubernetes-patch-*`, `selectableFields`):
        // created without client-side validation, the API server drops them.
        let (ok, _, err) =
            rig.try_kubectl(&["create", "--validate=false", "-f", &path.to_string_lossy(), "--save-config=false"])?;
        ensure!(ok || err.lines().all(|l| l.contains("AlreadyExists")), "Agones' chart: {err}");
        for crd in CRDS {
            rig.established(crd)?;
        }
        let controller = rig.kubeconfig_for("agones-controller", &token(rig, "agones-system", "agones-controller")?)?;
        let sdk_kubeconfig = rig.kubeconfig_for("agones-sdk", &token(rig, games, "agones-sdk")?)?;
        let logs = rig.work.join("agones");
        std::fs::create_dir_all(&logs)?;
        let extensions = Process::start(
            Command::new(bin.join("extensions"))
                .arg("--kubeconfig")
                .arg(&controller)
                .args(["--http-port", "8082", "--prometheus-exporter=false"])
                .args(["--cert-file", "/certs/server.crt", "--key-file", "/certs/server.key"]),
            &logs.join("extensions.log"),
        )?;
        // The SDK server as a container of the pod (1.28 has native sidecars only as an alpha).
        let controller = Process::start(
            Command::new(bin.join("controller"))
                .arg("--kubeconfig")
                .arg(&controller)
                .args(["--feature-gates", "SidecarContainers=false", "--min-port", "7000", "--max-port", "7999"])
                .args(["--sidecar-image", "us-docker.pkg.dev/agones-images/release/agones-sdk:1.60.0"])
                .args(["--leader-election=false", "--pod-namespace", "agones-system", "--prometheus-exporter=false"]),
            &logs.join("controller.log"),
        )?;
        eventually("Agones' extensions serving", Duration::from_secs(60), || {
            Ok(curl(&[
                "--cacert",
                &certs.join("ca.crt").to_string_lossy(),
                &format!("{EXTENSIONS}/apis/allocation.agones.dev/v1"),
            ])
            .is_ok_and(|body| body.contains("gameserverallocations")))
        })?;
        let agones = Agones {
            bin: bin.to_path_buf(),
            sdk_kubeconfig,
            allocator: Allocator { ca: certs.join("ca.crt"), sidecars: Arc::default() },
            stop: Arc::default(),
            _processes: vec![extensions, controller],
        };
        agones.run_sidecars(rig, games, &logs)?;
        Ok(agones)
    }

    /// Plays the kubelet's part for each game server's pod: its SDK server runs while the pod
    /// does, and the game, once started, tells it it is ready.
    fn run_sidecars(&self, rig: &Rig, games: &str, logs: &Path) -> Result<()> {
        let (sidecars, stop) = (self.allocator.sidecars.clone(), self.stop.clone());
        let (bin, kubeconfig, games, logs) =
            (self.bin.clone(), self.sdk_kubeconfig.clone(), games.to_string(), logs.to_path_buf());
        let admin = rig.admin.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let args = ["-n", &games, "get", "pods", "-l", "agones.dev/gameserver", "-o", "json"];
                if let Ok((true, out, _)) = crate::rig::kubectl(&admin, &args)
                    && let Ok(pods) = serde_json::from_str::<Value>(&out)
                {
                    let running: Vec<&str> = (pods["items"].as_array().into_iter().flatten())
                        .filter(|p| p["status"]["phase"] == "Running" && p["metadata"]["deletionTimestamp"].is_null())
                        .filter_map(|p| p["metadata"]["name"].as_str())
                        .collect();
                    let new: Vec<&str> = {
                        let mut sidecars = sidecars.lock().unwrap();
                        sidecars.retain(|name, _| running.contains(&name.as_str()));
                        running.into_iter().filter(|name| !sidecars.contains_key(*name)).collect()
                    };
                    for name in new {
                        if let Ok(sidecar) = Sidecar::start(&bin, &kubeconfig, &games, name, &logs) {
                            sidecars.lock().unwrap().insert(name.to_string(), sidecar);
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        });
        Ok(())
    }

    /// Waits for `n` Ready game servers on `node`; returns their names.
    fn ready_game_servers(
        &self,
        rig: &Rig,
        games: &str,
        node: &str,
        n: usize,
        within: Duration,
    ) -> Result<Vec<String>> {
        let ready_here = |(state, on): &(String, String)| state == "Ready" && on == node;
        let mut seen = BTreeMap::new();
        eventually(&format!("{n} Ready game servers on {node}"), within, || {
            seen = game_servers(rig, games)?;
            Ok(seen.values().filter(|s| ready_here(s)).count() == n)
        })
        .with_context(|| format!("the game servers then, with their states and nodes: {seen:?}"))?;
        Ok(seen.into_iter().filter(|(_, s)| ready_here(s)).map(|(name, _)| name).collect())
    }

    fn allocate(&self, games: &str) -> Result<(String, String)> {
        self.allocator.allocate(games)
    }

    fn sdk(&self, game_server: &str) -> Result<Sdk> {
        self.allocator.sdk(game_server)
    }

    /// Agones' objects gone while its controller still runs (it removes their finalizers),
    /// then its processes, webhooks and CRDs.
    fn uninstall(self, rig: &Rig, games: &str) -> Result<()> {
        let deleted = rig.try_kubectl(&["-n", games, "delete", "fleets,gameservers", "--all", "--timeout=60s"]);
        self.stop.store(true, Ordering::Relaxed);
        self.allocator.sidecars.lock().unwrap().clear();
        drop(self);
        for webhook in WEBHOOKS {
            rig.kubectl(&["delete", webhook, "--ignore-not-found"])?;
        }
        for crd in CRDS {
            rig.kubectl(&["delete", "crd", crd, "--ignore-not-found", "--wait=false"])?;
        }
        let (ok, _, err) = deleted?;
        ensure!(ok, "Agones' objects were not deleted by its controller: {err}");
        Ok(())
    }
}

impl Drop for Agones {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Allocator {
    /// An allocation, as the aggregation layer passes it to Agones' allocator: the preferred
    /// server first (as Packed prefers the fullest node), else any Ready one of the fleet; asked
    /// again for a few seconds while none is Ready (UnAllocated), as a matchmaker does. Returns
    /// the game server and its node.
    fn allocate(&self, games: &str) -> Result<(String, String)> {
        let body = json!({"apiVersion": "allocation.agones.dev/v1", "kind": "GameServerAllocation", "spec": {
            "selectors": [{"matchLabels": {"agones.dev/fleet": FLEET, "agones.dev/sdk-favourite": "yes"}},
                          {"matchLabels": {"agones.dev/fleet": FLEET}}]}});
        let url = format!("{EXTENSIONS}/apis/allocation.agones.dev/v1/namespaces/{games}/gameserverallocations");
        let ca = self.ca.to_string_lossy();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let answer =
                curl(&["--cacert", &ca, "-H", "Content-Type: application/json", "-d", &body.to_string(), &url])?;
            let answer: Value =
                serde_json::from_str(&answer).with_context(|| format!("the allocator's answer: {answer}"))?;
            let status = &answer["status"];
            match (status["state"].as_str(), status["gameServerName"].as_str(), status["nodeName"].as_str()) {
                (Some("Allocated"), Some(name), Some(node)) => return Ok((name.to_string(), node.to_string())),
                (Some("UnAllocated"), ..) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(200))
                }
                _ => bail!("no game server allocated: {answer}"),
            }
        }
    }

    fn sdk(&self, game_server: &str) -> Result<Sdk> {
        let sidecars = self.sidecars.lock().unwrap();
        let sidecar = sidecars.get(game_server).with_context(|| format!("no SDK server runs for {game_server}"))?;
        Ok(Sdk { port: sidecar.http_port })
    }
}

/// Allocations every second until stopped, each match a second long on a reused server.
struct Allocations {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Vec<(String, String)>>,
}

impl Allocations {
    fn start(allocator: &Allocator, games: &str) -> Allocations {
        let stop = Arc::new(AtomicBool::new(false));
        let (allocator, games, stopping) = (allocator.clone(), games.to_string(), stop.clone());
        let handle = std::thread::spawn(move || {
            let mut made = Vec::new();
            while !stopping.load(Ordering::Relaxed) {
                if let Ok((gs, node)) = allocator.allocate(&games) {
                    made.push((gs.clone(), node));
                    std::thread::sleep(Duration::from_secs(1));
                    let _ = allocator.sdk(&gs).and_then(|sdk| sdk.call("/ready", json!({})));
                } else {
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
            made
        });
        Allocations { stop, handle }
    }

    /// The allocations made, each with its node.
    fn stop(self) -> Vec<(String, String)> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

/// A game server's SDK server, as Agones runs it beside the game.
struct Sidecar {
    http_port: u16,
    _process: Process,
}

impl Sidecar {
    fn start(bin: &Path, kubeconfig: &Path, ns: &str, name: &str, logs: &Path) -> Result<Sidecar> {
        let [grpc, http, health] = free_ports()?.map(|address| address.port());
        let process = Process::start(
            Command::new(bin.join("sdk-server"))
                .arg("--kubeconfig")
                .arg(kubeconfig)
                .args(["--gameserver-name", name, "--pod-namespace", ns, "--graceful-termination=false"])
                .args(["--grpc-port", &grpc.to_string(), "--http-port", &http.to_string()])
                .args(["--health-port", &health.to_string()]),
            &logs.join(format!("sdk-{name}.log")),
        )?;
        let sdk = Sdk { port: http };
        let deadline = Instant::now() + Duration::from_secs(20);
        while sdk.call("/ready", json!({})).is_err() {
            ensure!(Instant::now() < deadline, "the SDK server of {name} did not answer");
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(Sidecar { http_port: http, _process: process })
    }
}

/// The game's calls to its SDK server (its REST gateway).
struct Sdk {
    port: u16,
}

impl Sdk {
    fn call(&self, path: &str, body: Value) -> Result<String> {
        let url = format!("http://127.0.0.1:{}{path}", self.port);
        let method = match path {
            _ if path.starts_with("/metadata/") => "PUT",
            _ if path.starts_with("/v1beta1/counters/") => "PATCH",
            _ => "POST",
        };
        curl(&["-X", method, "-H", "Content-Type: application/json", "-d", &body.to_string(), &url])
    }
}

/// A process that ends with its guard (and with the test run).
struct Process(Child);

impl Process {
    fn start(command: &mut Command, log: &Path) -> Result<Process> {
        let log = std::fs::File::create(log)?;
        die_with_parent(command);
        let child = command.stdout(log.try_clone()?).stderr(log).stdin(Stdio::null()).spawn()?;
        Ok(Process(child))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn curl(args: &[&str]) -> Result<String> {
    let output = Command::new("curl").args(["-sS", "--fail-with-body", "--max-time", "10"]).args(args).output()?;
    let body = String::from_utf8_lossy(&output.stdout).into_owned();
    ensure!(output.status.success(), "curl {}: {body}{}", args.join(" "), String::from_utf8_lossy(&output.stderr));
    Ok(body)
}

fn token(rig: &Rig, ns: &str, sa: &str) -> Result<String> {
    Ok(rig.kubectl(&["-n", ns, "create", "token", sa, "--duration=2h"])?.trim().to_string())
}

/// Each game server with its state and node.
fn game_servers(rig: &Rig, games: &str) -> Result<BTreeMap<String, (String, String)>> {
    let list = rig.get(&["-n", games, "gameservers"])?;
    Ok((list["items"].as_array().into_iter().flatten())
        .filter(|gs| gs["metadata"]["deletionTimestamp"].is_null())
        .filter_map(|gs| {
            let name = gs["metadata"]["name"].as_str()?.to_string();
            let state = gs["status"]["state"].as_str().unwrap_or_default().to_string();
            let node = gs["status"]["nodeName"].as_str().unwrap_or_default().to_string();
            Some((name, (state, node)))
        })
        .collect())
}

fn state(rig: &Rig, games: &str, name: &str, want: &str, within: Duration) -> Result<()> {
    eventually(&format!("{name} {want}"), within, || {
        Ok(game_servers(rig, games)?.get(name).is_some_and(|(state, _)| state == want))
    })
}

fn busy_label(rig: &Rig, games: &str, pod: &str, want: &str, within: Duration) -> Result<()> {
    eventually(&format!("{pod}'s busy label {want}"), within, || {
        Ok(rig.pod(games, pod)?.is_some_and(|p| label(&p, "busyguard.io/busy").as_deref() == Some(want)))
    })
}
