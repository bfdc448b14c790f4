//! busyguard under load, against the floor: the same TLS and HTTP stack answering a constant
//! "allowed" without reading the review. `make bench`, or `cargo bench --bench load`.
//!
//! The generator keeps CONNECTIONS keep-alive HTTP/1.1 TLS connections, as the kube-apiserver
//! does, and replays real AdmissionReview bodies (`tests/fixtures/`) as fast as answers come.
//! busyguard, the floor and the floor that also checks the JSON (the least a correct webhook
//! does: refuse a malformed review, echo its uid) run as processes of their own (the floors are
//! this binary again) and take turns, so all see the same machine. Then each scenario open
//! loop at half busyguard's sustained rate and at LIGHT_RATE (busyguard and the floor), and the
//! first scenario at 4x that rate and right after. Also measured: cold start without a
//! cluster, full TLS handshakes per second of server CPU, resident memory. With
//! `BUSYGUARD_BENCH_PREVIOUS` naming the previous release's build, it takes its turn too, against
//! the same stand-in API server.
//!
//! With `BUSYGUARD_BENCH_PEER` naming the Go webhook of `../shared/peers` (`make bench` builds
//! it when that folder is there), the peer takes its turn too on the scenarios it decides alike.
//! Every server runs on a core of its own and the generator on the others (on a machine of two
//! cores or more), so that a server spending less per request does not also lend its CPU to
//! the generator; `BUSYGUARD_BENCH_SHARED=1` lets them all share every core.

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use busyguard::admission::review::AdmissionResponse;
use busyguard::cli::{Cli, Command as BusyguardCommand};
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};

#[path = "common/floor_json.rs"]
mod floor_json;

const BUSYGUARD: &str = env!("CARGO_BIN_EXE_busyguard");
const FLOOR_ENV: &str = "BUSYGUARD_BENCH_FLOOR";
/// Set for the floor that checks every byte of the review's JSON and echoes its uid.
const FLOOR_JSON_ENV: &str = "BUSYGUARD_BENCH_FLOOR_JSON";
const CONNECTIONS: usize = 16;
const RUN: Duration = Duration::from_secs(4);
const ROUNDS: usize = 2;
/// A busy cluster's rate of reviews to one replica, for latency away from saturation.
const LIGHT_RATE: f64 = 1000.0;
/// The Go webhook of `../shared/peers/go-webhook`, built (`make bench` does it when it is there).
const PEER_ENV: &str = "BUSYGUARD_BENCH_PEER";
/// Set to let servers and generator share every core.
const SHARED_ENV: &str = "BUSYGUARD_BENCH_SHARED";
/// The previous release's build (`benches/previous.sh`; `make bench` builds it where the clone
/// has its commit): measured beside this one, so that a regression shows as a ratio below 1.
const PREVIOUS_ENV: &str = "BUSYGUARD_BENCH_PREVIOUS";

fn main() {
    if let Ok(dir) = std::env::var(FLOOR_ENV) {
        return floor_server(Path::new(&dir), std::env::var_os(FLOOR_JSON_ENV).is_some());
    }
    let cores = Cores::chosen();
    if let Cores::Pinned { server } = cores {
        // Before the runtime starts: its workers, one per core it may use, inherit this.
        pin_to(|cpu| cpu != server).unwrap();
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(run_all(cores));
}

/// Where the servers and the generator run.
#[derive(Clone, Copy)]
enum Cores {
    /// All on every core.
    Shared,
    /// Each server on core `server` (the last), the generator on the others.
    Pinned { server: usize },
}

impl Cores {
    fn chosen() -> Cores {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        if cores < 2 || std::env::var_os(SHARED_ENV).is_some() {
            Cores::Shared
        } else {
            Cores::Pinned { server: cores - 1 }
        }
    }

    fn describe(self) -> String {
        match self {
            Cores::Shared => "servers and generator share every core".into(),
            Cores::Pinned { server } => format!("each server on core {server}, the generator on the others"),
        }
    }

    /// `command`, to run where servers run.
    fn server(self, command: &mut Command) -> &mut Command {
        if let Cores::Pinned { server } = self {
            // SAFETY: sched_setaffinity is a plain system call, safe between fork and exec.
            unsafe { command.pre_exec(move || pin_to(|cpu| cpu == server)) };
        }
        command
    }
}

/// Keeps the calling thread (and what it starts) to the CPUs `keep` picks.
fn pin_to(keep: impl Fn(usize) -> bool) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET stays within it for any CPU below CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for cpu in (0..libc::CPU_SETSIZE as usize).filter(|&cpu| keep(cpu)) {
            libc::CPU_SET(cpu, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[derive(Clone)]
struct Scenario {
    name: &'static str,
    path: &'static str,
    body: Bytes,
    /// Whether the Go peer decides it as busyguard does (it has no scale-down rule).
    peer_decides: bool,
}

fn scenarios() -> Vec<Scenario> {
    [
        ("eviction, busy pod (429)", "/validate", "pod-eviction-by-user.json", true),
        ("delete, busy pod (429)", "/validate", "pod-delete-by-replicaset-controller.json", true),
        ("pod update to busy (patch)", "/mutate", "pod-update-label-busy-by-user.json", true),
        ("scale subresource down", "/validate", "deployment-scale-subresource-down-by-kubectl.json", false),
    ]
    .into_iter()
    .map(|(name, path, file, peer_decides)| {
        let mut review = fixture(file);
        // The deleted pod turned busy now (busyguard stamped it): protected, so refused.
        let old = &mut review["request"]["oldObject"]["metadata"];
        if old["labels"]["busyguard.io/busy"] == "true" {
            old["annotations"]["busyguard.io/busy-since"] = json!(whole_second_now().to_string());
        }
        Scenario { name, path, body: Bytes::from(serde_json::to_vec(&review).unwrap()), peer_decides }
    })
    .collect()
}

fn whole_second_now() -> jiff::Timestamp {
    busyguard::duration::whole_second(jiff::Timestamp::now())
}

/// The recorded pod, named as the eviction names it, busy or idle, as busyguard's watch lists it
/// after the mutating webhook annotated it (nothing stale, so a scale-down that selects it has
/// nothing to patch): the annotations and label busyguard's own plan gives it, on the defaults
/// of `busyguard serve`.
fn planned_pod(busy: bool) -> Value {
    use busyguard::policy::keys::{BUSY_LABEL, PROTECTED_LABEL};
    use busyguard::policy::marks::plan;
    use busyguard::policy::pod::Pod;
    let eviction = fixture("pod-eviction-by-user.json");
    let mut pod = fixture("pod-delete-by-replicaset-controller.json")["request"]["oldObject"].clone();
    pod["metadata"]["name"] = eviction["request"]["name"].clone();
    pod["metadata"]["namespace"] = eviction["request"]["namespace"].clone();
    pod["metadata"]["annotations"] = json!({});
    pod["metadata"]["labels"][BUSY_LABEL] = json!(busy.to_string());
    let BusyguardCommand::Serve(args) = Cli::parse_from(["busyguard", "serve"]).command else { unreachable!() };
    let policy = args.into_config().policy;
    let now = whole_second_now();
    if busy {
        // Busy from now on, and planned so: a plan on the recorded pod's start, days ago, would
        // be past max-busy, and one made before this stamp would leave its cost stale, so
        // that every scale-down would refresh it.
        pod["metadata"]["annotations"][busyguard::policy::keys::BUSY_SINCE] = json!(now.to_string());
    }
    let decoded: Pod = serde_json::from_value(pod.clone()).unwrap();
    let plan = plan(&decoded, None, policy.mutation, policy.max_busy, now);
    for (key, value) in plan.annotations {
        pod["metadata"]["annotations"][key] = json!(value);
    }
    if plan.protected == Some(true) {
        pod["metadata"]["labels"][PROTECTED_LABEL] = json!("true");
    }
    let planned: Pod = serde_json::from_value(pod.clone()).unwrap();
    let again = busyguard::policy::marks::plan(&planned, None, policy.mutation, policy.max_busy, now);
    assert!(again.is_empty(), "the recorded pod is up to date: {again:?}");
    pod
}

/// A stand-in API server: one list of `pods` (each rendered as JSON once, the busy pod the
/// eviction names last), in pages of the `limit` asked for, as the API server pages; no
/// namespace labelled by busyguard's label, and no node; watches that bring nothing and end at their `timeoutSeconds`
/// (busyguard then watches again: a sign of life), 201 to Events.
async fn api_server(pods: Arc<Vec<String>>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = axum::Router::new().fallback(move |request: axum::extract::Request| {
        let pods = pods.clone();
        async move {
            let query = request.uri().query().unwrap_or_default();
            let param = |name: &str| query.split('&').find_map(|p| p.strip_prefix(name)?.strip_prefix('='));
            let watch = param("watch") == Some("true");
            let ends: u64 = param("timeoutSeconds").and_then(|s| s.parse().ok()).unwrap_or(290);
            match (request.uri().path(), watch) {
                // Pods, and the namespaces and nodes busyguard also watches (none here).
                (_, true) => {
                    let nothing = futures::stream::pending::<Result<Bytes, std::io::Error>>();
                    let ends = tokio::time::sleep(std::time::Duration::from_secs(ends));
                    Body::from_stream(futures::StreamExt::take_until(nothing, ends))
                }
                ("/api/v1/pods", false) => {
                    let from: usize = param("continue").and_then(|s| s.parse().ok()).unwrap_or(0);
                    // Served from the watch cache, a list at resourceVersion 0 comes whole, whatever its limit.
                    let whole = param("resourceVersion") == Some("0") && param("continue").is_none();
                    let limit = param("limit").and_then(|s| s.parse().ok()).filter(|_| !whole).unwrap_or(pods.len());
                    let to = (from + limit).min(pods.len());
                    let next = if to < pods.len() { to.to_string() } else { String::new() };
                    let items = pods[from..to].join(",");
                    Body::from(format!(
                        r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{"resourceVersion":"1","continue":"{next}"}},"items":[{items}]}}"#
                    ))
                }
                // No namespace carries busyguard's label: none is left alone.
                ("/api/v1/namespaces", false) => {
                    Body::from(r#"{"kind":"NamespaceList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}"#)
                }
                ("/api/v1/nodes", false) => {
                    Body::from(r#"{"kind":"NodeList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}"#)
                }
                _ => Body::from("{}"),
            }
        }
    });
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

/// `count` opted-in pods as the API server lists them (the recorded pod's fields, managedFields
/// and spec included), in 50 namespaces, every other one busy; the last is the busy pod the
/// eviction names.
fn listed_pods(count: usize) -> Vec<String> {
    let (busy, idle) = (planned_pod(true), planned_pod(false));
    let mut pods: Vec<String> = (0..count.saturating_sub(1))
        .map(|i| {
            let mut pod = if i % 2 == 0 { busy.clone() } else { idle.clone() };
            let metadata = &mut pod["metadata"];
            metadata["name"] = json!(format!("worker-{i}"));
            metadata["namespace"] = json!(format!("team-{}", i % 50));
            metadata["uid"] = json!(format!("00000000-0000-0000-0000-{i:012}"));
            pod.to_string()
        })
        .collect();
    pods.push(busy.to_string());
    pods
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

fn spawn_floor(cores: Cores, dir: &Path, listen: SocketAddr, reads_json: bool) -> Child {
    let mut floor = Command::new(std::env::current_exe().unwrap());
    floor.env(FLOOR_ENV, dir).env("FLOOR_LISTEN", listen.to_string());
    if reads_json {
        floor.env(FLOOR_JSON_ENV, "1");
    }
    cores.server(&mut floor).spawn().unwrap()
}

/// The Go peer, with the pod the eviction names on its list of busy pods.
fn spawn_peer(cores: Cores, peer: &Path, dir: &Path, listen: SocketAddr) -> Child {
    let eviction = fixture("pod-eviction-by-user.json");
    let busy = format!(
        "{}/{}",
        eviction["request"]["namespace"].as_str().unwrap(),
        eviction["request"]["name"].as_str().unwrap()
    );
    let mut command = Command::new(peer);
    command.arg("-listen").arg(listen.to_string()).arg("-cert").arg(dir.join("tls.crt"));
    command.arg("-key").arg(dir.join("tls.key")).args(["-busy", &busy]).stdout(Stdio::null()).stderr(Stdio::null());
    cores.server(&mut command).spawn().unwrap()
}

fn spawn_busyguard(cores: Cores, dir: &Path, listen: SocketAddr, admin: SocketAddr, cluster: &[&str]) -> Child {
    spawn_build(Path::new(BUSYGUARD), cores, dir, listen, admin, cluster)
}

/// A build of busyguard, this one or another release's, serving as deployed.
fn spawn_build(
    binary: &Path,
    cores: Cores,
    dir: &Path,
    listen: SocketAddr,
    admin: SocketAddr,
    cluster: &[&str],
) -> Child {
    cores
        .server(&mut Command::new(binary))
        .args(["serve", "--listen", &listen.to_string(), "--admin-listen", &admin.to_string()])
        .arg("--tls-cert")
        .arg(dir.join("tls.crt"))
        .arg("--tls-key")
        .arg(dir.join("tls.key"))
        .arg("--audit-log")
        .arg(dir.join("audit.log"))
        .args(cluster)
        // Logging as deployed (manifests/base): info level, JSON lines.
        .env("BUSYGUARD_LOG_FORMAT", "json")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

async fn run_all(cores: Cores) {
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new(BUSYGUARD).args(["certs", "--dir"]).arg(dir.path()).stdout(Stdio::null()).status();
    assert!(status.unwrap().success());
    let client = client_config(dir.path());
    let all = scenarios();
    let probe = &all[1];

    let cold_start = cold_start(cores, dir.path(), &client, probe).await;
    let ready_with_many = start_to_ready(cores, dir.path(), &client, &all[0], MANY_PODS).await;

    let api = api_server(Arc::new(listed_pods(1))).await;
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, kubeconfig_for(api)).unwrap();
    let (listen, admin) = (free_addr(), free_addr());
    let mut busyguard =
        spawn_busyguard(cores, dir.path(), listen, admin, &["--kubeconfig", kubeconfig.to_str().unwrap()]);
    wait_ready(admin).await;
    let idle_rss = memory_kib(busyguard.id(), "VmRSS");

    let (floor_addr, json_floor_addr) = (free_addr(), free_addr());
    let mut floor = spawn_floor(cores, dir.path(), floor_addr, false);
    let mut json_floor = spawn_floor(cores, dir.path(), json_floor_addr, true);
    connect(floor_addr, &client).await;
    connect(json_floor_addr, &client).await;
    let peer_addr = free_addr();
    let mut peer = std::env::var_os(PEER_ENV)
        .filter(|peer| !peer.is_empty())
        .map(|peer| spawn_peer(cores, Path::new(&peer), dir.path(), peer_addr));
    if peer.is_some() {
        connect(peer_addr, &client).await;
    }
    let (previous_addr, previous_admin) = (free_addr(), free_addr());
    let mut previous = std::env::var_os(PREVIOUS_ENV).filter(|build| !build.is_empty()).map(|build| {
        let cluster = ["--kubeconfig", kubeconfig.to_str().unwrap()];
        spawn_build(Path::new(&build), cores, dir.path(), previous_addr, previous_admin, &cluster)
    });
    if previous.is_some() {
        wait_ready(previous_admin).await;
    }

    // `cargo bench --bench load -- delete` runs only the scenarios whose name holds "delete".
    let only = std::env::args().skip(1).find(|arg| !arg.starts_with("--")).unwrap_or_default();
    let chosen: Vec<&Scenario> = all.iter().filter(|s| s.name.contains(&only)).collect();
    let mut rows = Vec::new();
    let mut open_loop = Vec::new();
    for &scenario in &chosen {
        let answer = answer_of(listen, &client, scenario).await;
        assert_eq!(
            answer_of(json_floor_addr, &client, scenario).await,
            "allowed",
            "the JSON floor reads {}",
            scenario.name
        );
        let peer = peer.as_ref().filter(|_| scenario.peer_decides);
        if peer.is_some() {
            assert_eq!(answer_of(peer_addr, &client, scenario).await, answer, "the Go peer decides {}", scenario.name);
        }
        if previous.is_some() {
            let said = answer_of(previous_addr, &client, scenario).await;
            assert_eq!(said, answer, "the previous release decides {}", scenario.name);
        }
        let mut row = Row { name: scenario.name, answer, ..Row::default() };
        for _ in 0..ROUNDS {
            if let Some(previous) = &previous {
                let totals = load(previous_addr, previous.id(), &client, scenario).await;
                row.previous.get_or_insert_default().add(totals);
            }
            row.floor.add(load(floor_addr, floor.id(), &client, scenario).await);
            row.json_floor.add(load(json_floor_addr, json_floor.id(), &client, scenario).await);
            if let Some(peer) = peer {
                row.peer.get_or_insert_default().add(load(peer_addr, peer.id(), &client, scenario).await);
            }
            row.ours.add(load(listen, busyguard.id(), &client, scenario).await);
        }
        let ten = Duration::from_secs(10);
        for rate in [row.ours.per_second() / 2.0, LIGHT_RATE] {
            let floor_paced = paced(floor_addr, &client, scenario, rate, RUN, ten, CONNECTIONS).await;
            let ours_paced = paced(listen, &client, scenario, rate, RUN, ten, CONNECTIONS).await;
            open_loop.push((scenario.name, rate, ours_paced, floor_paced));
        }
        rows.push(row);
    }
    let overload = match (rows.first(), chosen.first()) {
        (Some(Row { ours, .. }), Some(scenario)) => Some(overload(listen, &client, scenario, ours.per_second()).await),
        _ => None,
    };
    let handshakes = handshakes(listen, busyguard.id(), &client).await;
    let peak_rss = memory_kib(busyguard.id(), "VmHWM");
    let servers = [Some(&mut busyguard), Some(&mut floor), Some(&mut json_floor), peer.as_mut(), previous.as_mut()];
    for server in servers.into_iter().flatten() {
        server.kill().ok();
        server.wait().ok();
    }

    println!("\n{}", cores.describe());
    report(&mut rows, cold_start, handshakes, idle_rss, peak_rss);
    let (ready_after, ready_rss) = ready_with_many;
    println!(
        "start to ready with {MANY_PODS} opted-in pods listed (first eviction refused from the view): {:.2} s, {:.1} MiB resident then",
        ready_after.as_secs_f64(),
        ready_rss as f64 / 1024.0
    );
    report_peer(&mut rows);
    report_previous(&mut rows);
    report_paced(&open_loop, overload.as_ref());
}

/// The first scenario at 4x what busyguard sustained, each request with `?timeout=2s`, then at
/// once half the sustainable rate again.
async fn overload(
    addr: SocketAddr,
    client: &Arc<rustls::ClientConfig>,
    scenario: &Scenario,
    sustained: f64,
) -> (&'static str, f64, Paced, Paced) {
    let timeout = Duration::from_secs(2);
    // As the API server does under load: more connections as long as answers are slow to come.
    let over = paced(addr, client, scenario, 4.0 * sustained, RUN, timeout, 2048).await;
    let after = paced(addr, client, scenario, sustained / 2.0, Duration::from_secs(2), timeout, CONNECTIONS).await;
    (scenario.name, 4.0 * sustained, over, after)
}

fn kubeconfig_for(api: SocketAddr) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: 'http://{api}'}}}}]\n\
         users: [{{name: u, user: {{}}}}]\ncontexts: [{{name: c, context: {{cluster: c, user: u}}}}]\ncurrent-context: c\n"
    )
}

async fn wait_ready(admin: SocketAddr) {
    for _ in 0..500 {
        if let Ok(mut stream) = TcpStream::connect(admin).await {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            stream.write_all(b"GET /readyz HTTP/1.0\r\n\r\n").await.ok();
            let mut answer = String::new();
            stream.read_to_string(&mut answer).await.ok();
            if answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200") {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("busyguard did not turn ready");
}

/// Opted-in pods the stand-in lists for the start-to-ready measurement.
const MANY_PODS: usize = 100_000;

/// Process start to the first eviction refused from the view (until the view holds the whole
/// list, evictions are answered 503), with `pods` opted-in pods listed by the stand-in; and
/// busyguard's resident memory then.
async fn start_to_ready(
    cores: Cores,
    dir: &Path,
    client: &Arc<rustls::ClientConfig>,
    eviction: &Scenario,
    pods: usize,
) -> (Duration, u64) {
    let api = api_server(Arc::new(listed_pods(pods))).await;
    let kubeconfig = dir.join("kubeconfig-many");
    std::fs::write(&kubeconfig, kubeconfig_for(api)).unwrap();
    let (listen, admin) = (free_addr(), free_addr());
    let started = Instant::now();
    let mut child = spawn_busyguard(cores, dir, listen, admin, &["--kubeconfig", kubeconfig.to_str().unwrap()]);
    let mut sender = connect(listen, client).await;
    loop {
        if sender.is_closed() {
            // A 503 (the view not listed yet) closes its connection.
            sender = connect(listen, client).await;
        }
        if let Ok((200, body)) = send_within(&mut sender, eviction, Duration::from_secs(10)).await
            && serde_json::from_slice::<Value>(&body).is_ok_and(|review| review["response"]["allowed"] == false)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let ready = started.elapsed();
    let resident = memory_kib(child.id(), "VmRSS");
    child.kill().ok();
    child.wait().ok();
    (ready, resident)
}

/// Process start to the first answered review, without a cluster; the median of 5.
async fn cold_start(cores: Cores, dir: &Path, client: &Arc<rustls::ClientConfig>, probe: &Scenario) -> Duration {
    let mut times = Vec::new();
    for _ in 0..5 {
        let (listen, admin) = (free_addr(), free_addr());
        let started = Instant::now();
        let mut child = spawn_busyguard(cores, dir, listen, admin, &["--no-cluster"]);
        loop {
            if let Ok(mut sender) = try_connect(listen, client).await
                && send(&mut sender, probe).await.is_ok()
            {
                break;
            }
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        times.push(started.elapsed());
        child.kill().ok();
        child.wait().ok();
    }
    times.sort();
    times[2]
}

fn client_config(dir: &Path) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(dir.join("ca.crt")).unwrap()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    // Every connection a full handshake, as after an API server restart.
    config.resumption = rustls::client::Resumption::disabled();
    Arc::new(config)
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn try_connect(addr: SocketAddr, client: &Arc<rustls::ClientConfig>) -> std::io::Result<Sender> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let tls = tokio_rustls::TlsConnector::from(client.clone()).connect(name, tcp).await?;
    let (sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.map_err(std::io::Error::other)?;
    tokio::spawn(connection);
    Ok(sender)
}

async fn connect(addr: SocketAddr, client: &Arc<rustls::ClientConfig>) -> Sender {
    for _ in 0..500 {
        if let Ok(sender) = try_connect(addr, client).await {
            return sender;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("nothing answers on {addr}");
}

/// One review as the kube-apiserver posts it; the answer's body when answered 200.
async fn send(sender: &mut Sender, scenario: &Scenario) -> Result<Bytes, String> {
    send_within(sender, scenario, Duration::from_secs(10)).await.and_then(|(status, body)| {
        (status == 200 && !body.is_empty()).then_some(body).ok_or_else(|| format!("HTTP {status}"))
    })
}

/// One review with the API server's `?timeout=`; the HTTP status and body.
async fn send_within(sender: &mut Sender, scenario: &Scenario, timeout: Duration) -> Result<(u16, Bytes), String> {
    let request = hyper::Request::post(format!("{}?timeout={}s", scenario.path, timeout.as_secs()))
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .header("accept", "application/json, */*")
        .header("user-agent", "kube-apiserver-admission")
        .body(Full::new(scenario.body.clone()))
        .unwrap();
    let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok((status, body))
}

/// What busyguard answers a scenario, in a word, to show the table measures the real path.
async fn answer_of(addr: SocketAddr, client: &Arc<rustls::ClientConfig>, scenario: &Scenario) -> String {
    let body = send(&mut connect(addr, client).await, scenario).await.unwrap_or_default();
    let review: Value = serde_json::from_slice(&body).unwrap_or_default();
    let response = &review["response"];
    match (&response["allowed"], &response["status"]["code"], &response["patch"]) {
        (Value::Bool(false), code, _) => format!("denied {code}"),
        (Value::Bool(true), _, Value::String(_)) => "patched".into(),
        (Value::Bool(true), _, _) => "allowed".into(),
        _ => format!("no review: {}", String::from_utf8_lossy(&body)),
    }
}

#[derive(Default)]
struct Totals {
    answered: usize,
    errors: usize,
    latencies_us: Vec<u32>,
    elapsed: Duration,
    server_cpu: Duration,
}

impl Totals {
    fn add(&mut self, other: Totals) {
        self.answered += other.answered;
        self.errors += other.errors;
        self.latencies_us.extend(other.latencies_us);
        self.elapsed += other.elapsed;
        self.server_cpu += other.server_cpu;
    }

    fn per_second(&self) -> f64 {
        self.answered as f64 / self.elapsed.as_secs_f64()
    }

    fn cpu_per_request_us(&self) -> f64 {
        self.server_cpu.as_secs_f64() * 1e6 / self.answered.max(1) as f64
    }

    fn percentile_ms(&mut self, p: f64) -> f64 {
        self.latencies_us.sort_unstable();
        percentile_ms(&self.latencies_us, p)
    }
}

/// CONNECTIONS clients posting back to back for RUN.
async fn load(addr: SocketAddr, server: u32, client: &Arc<rustls::ClientConfig>, scenario: &Scenario) -> Totals {
    let cpu_before = cpu_time(server);
    let started = Instant::now();
    let deadline = started + RUN;
    let mut tasks = Vec::new();
    for _ in 0..CONNECTIONS {
        let (client, scenario) = (client.clone(), scenario.clone());
        tasks.push(tokio::spawn(async move {
            let mut totals = Totals::default();
            let mut sender = connect(addr, &client).await;
            while Instant::now() < deadline {
                let sent = Instant::now();
                match send(&mut sender, &scenario).await {
                    Ok(_) => {
                        totals.answered += 1;
                        totals.latencies_us.push(sent.elapsed().as_micros() as u32);
                    }
                    Err(_) => {
                        totals.errors += 1;
                        sender = connect(addr, &client).await;
                    }
                }
            }
            totals
        }));
    }
    let mut totals = Totals::default();
    for task in tasks {
        totals.add(task.await.unwrap());
    }
    totals.elapsed = started.elapsed();
    totals.server_cpu = cpu_time(server) - cpu_before;
    totals
}

/// What became of the requests of an open-loop run.
#[derive(Default)]
struct Paced {
    offered: usize,
    answered: usize,
    /// 503 from busyguard: shed at once.
    shed: usize,
    /// No TLS session or the connection closed: busyguard's connection limit, or an error.
    refused: usize,
    /// Answered after, or not answered by, the `?timeout=` sent.
    late: usize,
    /// Not sent: no connection of the pool was free for a whole timeout after it was due.
    unsent: usize,
    /// From the time each request was due (waits for a free connection included), in µs.
    latencies_us: Vec<u32>,
    /// How late the pacer thread woke, each time it woke to send, in µs: how long the machine
    /// itself keeps a thread that is ready to run waiting (sorted).
    pacer_late_us: Vec<u32>,
}

impl Paced {
    fn add(&mut self, other: Paced) {
        self.answered += other.answered;
        self.shed += other.shed;
        self.refused += other.refused;
        self.late += other.late;
        self.unsent += other.unsent;
        self.latencies_us.extend(other.latencies_us);
    }

    fn percentile_ms(&self, p: f64) -> f64 {
        percentile_ms(&self.latencies_us, p)
    }
}

/// The schedule of an open-loop run, shared by its pacer and its connections.
struct Schedule {
    started: Instant,
    rate: f64,
    total: usize,
    /// One permit per request due; `total` is reached, then one more per connection to stop it.
    tickets: tokio::sync::Semaphore,
    /// Requests handed to a connection so far.
    taken: AtomicUsize,
    /// Connections waiting for a ticket.
    idle: AtomicUsize,
}

impl Schedule {
    fn due(&self, request: usize) -> Instant {
        self.started + Duration::from_secs_f64(request as f64 / self.rate)
    }
}

/// Requests at a fixed `rate` for `run`, whether or not answers keep up (open loop), each with
/// `?timeout=`. A thread of its own keeps the schedule to the tens of µs (tokio's timer ticks in
/// whole ms, which would send in bursts); connections take the due requests in turn and, like
/// the API server, a new one is opened when a request finds none idle, up to `max_open`.
async fn paced(
    addr: SocketAddr,
    client: &Arc<rustls::ClientConfig>,
    scenario: &Scenario,
    rate: f64,
    run: Duration,
    timeout: Duration,
    max_open: usize,
) -> Paced {
    let warm = CONNECTIONS.min(max_open);
    let mut senders = Vec::new();
    for _ in 0..warm {
        senders.push(connect(addr, client).await);
    }
    let schedule = Arc::new(Schedule {
        started: Instant::now(),
        rate,
        total: (rate * run.as_secs_f64()) as usize,
        tickets: tokio::sync::Semaphore::new(0),
        taken: AtomicUsize::new(0),
        idle: AtomicUsize::new(0),
    });
    let open = |sender: Option<Sender>| {
        let request = PacedRequest { addr, client: client.clone(), scenario: scenario.clone(), timeout };
        tokio::spawn(keep_schedule(schedule.clone(), request, sender))
    };
    let mut connections: Vec<_> = senders.into_iter().map(|sender| open(Some(sender))).collect();
    let (schedule_kept, (open_more, mut opening)) = (schedule.clone(), tokio::sync::mpsc::unbounded_channel());
    let pacer = std::thread::spawn(move || {
        let schedule = schedule_kept;
        let mut issued = 0;
        let mut opened = warm;
        let mut woke_late_us = Vec::new();
        while issued < schedule.total {
            let now = Instant::now();
            let due = (issued..schedule.total).take_while(|&request| schedule.due(request) <= now).count();
            if due > 0 {
                // How late this thread woke for the first request due: the machine's own delay.
                woke_late_us.push((now - schedule.due(issued)).as_micros() as u32);
            }
            schedule.tickets.add_permits(due);
            issued += due;
            let waiting = schedule.tickets.available_permits();
            if waiting > schedule.idle.load(Ordering::Relaxed) && opened < max_open {
                opened += 1;
                let _ = open_more.send(());
            }
            if let Some(wait) = schedule.due(issued).checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        schedule.tickets.add_permits(opened);
        woke_late_us
    });
    // New connections are spawned here, on the runtime, as the pacer asks for them.
    while opening.recv().await.is_some() {
        connections.push(open(None));
    }
    let mut pacer_late_us = pacer.join().unwrap();
    pacer_late_us.sort_unstable();
    let mut paced = Paced { offered: schedule.total, pacer_late_us, ..Paced::default() };
    for connection in connections {
        paced.add(connection.await.unwrap());
    }
    paced.latencies_us.sort_unstable();
    paced
}

struct PacedRequest {
    addr: SocketAddr,
    client: Arc<rustls::ClientConfig>,
    scenario: Scenario,
    timeout: Duration,
}

/// One connection of an open-loop run: takes due requests until the schedule is done; after an
/// error or a refused connection, connects again for the next one.
async fn keep_schedule(schedule: Arc<Schedule>, request: PacedRequest, mut sender: Option<Sender>) -> Paced {
    let mut paced = Paced::default();
    loop {
        schedule.idle.fetch_add(1, Ordering::Relaxed);
        let ticket = schedule.tickets.acquire().await;
        schedule.idle.fetch_sub(1, Ordering::Relaxed);
        ticket.unwrap().forget();
        let taken = schedule.taken.fetch_add(1, Ordering::Relaxed);
        if taken >= schedule.total {
            return paced;
        }
        let due = schedule.due(taken);
        if due.elapsed() > request.timeout {
            paced.unsent += 1;
            continue;
        }
        if sender.as_ref().is_none_or(|sender| sender.is_closed()) {
            let deadline = tokio::time::Instant::from_std(due + request.timeout);
            sender = tokio::time::timeout_at(deadline, try_connect(request.addr, &request.client))
                .await
                .ok()
                .and_then(Result::ok);
        }
        let Some(connection) = &mut sender else {
            paced.refused += 1;
            continue;
        };
        // Late: not answered within the timeout from the moment it was sent.
        let answer =
            tokio::time::timeout(request.timeout, send_within(connection, &request.scenario, request.timeout)).await;
        match answer {
            Ok(Ok((200, _))) => {
                paced.answered += 1;
                paced.latencies_us.push(due.elapsed().as_micros() as u32);
                continue;
            }
            Err(_) => paced.late += 1,
            Ok(Ok((503, _))) => paced.shed += 1,
            Ok(Ok(_) | Err(_)) => paced.refused += 1,
        }
        sender = None;
    }
}

/// The `p` quantile of sorted latencies in µs, in ms.
fn percentile_ms(sorted_us: &[u32], p: f64) -> f64 {
    let index = ((sorted_us.len() as f64 * p) as usize).min(sorted_us.len().saturating_sub(1));
    sorted_us.get(index).copied().unwrap_or_default() as f64 / 1000.0
}

/// Full handshakes (no resumption) per second of server CPU, from CONNECTIONS clients.
async fn handshakes(addr: SocketAddr, server: u32, client: &Arc<rustls::ClientConfig>) -> f64 {
    let cpu_before = cpu_time(server);
    let deadline = Instant::now() + RUN;
    let mut tasks = Vec::new();
    for _ in 0..CONNECTIONS {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut done = 0u64;
            while Instant::now() < deadline {
                let tcp = TcpStream::connect(addr).await.unwrap();
                let name = ServerName::try_from("127.0.0.1").unwrap();
                if tokio_rustls::TlsConnector::from(client.clone()).connect(name, tcp).await.is_ok() {
                    done += 1;
                }
            }
            done
        }));
    }
    let mut done = 0;
    for task in tasks {
        done += task.await.unwrap();
    }
    done as f64 / (cpu_time(server) - cpu_before).as_secs_f64()
}

/// User + system CPU time of a process, from /proc (clock ticks of 10 ms).
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

fn memory_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A markdown table's header row and the separator under it.
fn table_header(out: &mut impl Write, columns: &[&str]) {
    writeln!(out, "| {} |\n|{}", columns.join(" | "), "---|".repeat(columns.len())).unwrap();
}

/// One scenario's closed-loop runs, each server's rounds added up.
#[derive(Default)]
struct Row {
    name: &'static str,
    answer: String,
    ours: Totals,
    floor: Totals,
    json_floor: Totals,
    /// The Go peer, where it ran.
    peer: Option<Totals>,
    /// The previous release's build, where it ran.
    previous: Option<Totals>,
}

fn report(rows: &mut [Row], cold_start: Duration, handshakes: f64, idle_rss: u64, peak_rss: u64) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "\n{CONNECTIONS} keep-alive TLS connections, {ROUNDS} x {}s per server, alternating", RUN.as_secs())
        .unwrap();
    table_header(
        &mut out,
        &[
            "scenario",
            "answer",
            "busyguard req/s",
            "floor req/s",
            "ratio",
            "floor + JSON req/s",
            "floor + JSON / floor",
            "busyguard / floor + JSON",
            "p50 ms",
            "p99 ms",
            "p99.9 ms",
            "errors",
            "CPU µs/req busyguard",
            "CPU µs/req floor",
            "CPU µs/req floor + JSON",
        ],
    );
    for Row { name, answer, ours, floor, json_floor, .. } in rows {
        writeln!(
            out,
            "| {name} | {answer} | {:.0} | {:.0} | {:.2} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {:.1} | {:.1} | {:.1} |",
            ours.per_second(),
            floor.per_second(),
            ours.per_second() / floor.per_second(),
            json_floor.per_second(),
            json_floor.per_second() / floor.per_second(),
            ours.per_second() / json_floor.per_second(),
            ours.percentile_ms(0.5),
            ours.percentile_ms(0.99),
            ours.percentile_ms(0.999),
            ours.errors + floor.errors + json_floor.errors,
            ours.cpu_per_request_us(),
            floor.cpu_per_request_us(),
            json_floor.cpu_per_request_us()
        )
        .unwrap();
    }
    writeln!(
        out,
        "\ncold start (process start to first answered review, no cluster): {:.1} ms",
        cold_start.as_secs_f64() * 1e3
    )
    .unwrap();
    writeln!(out, "full TLS handshakes (ECDSA P-256) per second of server CPU: {handshakes:.0}").unwrap();
    writeln!(
        out,
        "busyguard resident memory: {:.1} MiB idle, {:.1} MiB peak",
        idle_rss as f64 / 1024.0,
        peak_rss as f64 / 1024.0
    )
    .unwrap();
}

/// busyguard against the Go peer, on the scenarios the peer ran.
fn report_peer(rows: &mut [Row]) {
    if rows.iter().all(|row| row.peer.is_none()) {
        return;
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "\nagainst the Go peer (the same runs)").unwrap();
    table_header(
        &mut out,
        &[
            "scenario",
            "busyguard req/s",
            "Go peer req/s",
            "busyguard / Go",
            "busyguard p99 ms",
            "Go p99 ms",
            "Go p99 / busyguard p99",
            "CPU µs/req busyguard",
            "CPU µs/req Go",
            "Go CPU / busyguard CPU",
        ],
    );
    for Row { name, ours, peer, .. } in rows {
        let Some(peer) = peer else { continue };
        let (ours_p99, peer_p99) = (ours.percentile_ms(0.99), peer.percentile_ms(0.99));
        writeln!(
            out,
            "| {name} | {:.0} | {:.0} | {:.2} | {ours_p99:.2} | {peer_p99:.2} | {:.2} | {:.1} | {:.1} | {:.2} |",
            ours.per_second(),
            peer.per_second(),
            ours.per_second() / peer.per_second(),
            peer_p99 / ours_p99,
            ours.cpu_per_request_us(),
            peer.cpu_per_request_us(),
            peer.cpu_per_request_us() / ours.cpu_per_request_us()
        )
        .unwrap();
    }
}

fn report_previous(rows: &mut [Row]) {
    if rows.iter().all(|row| row.previous.is_none()) {
        return;
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "\nagainst the previous release (the same runs; below 1: slower than it)").unwrap();
    // Server CPU per request too: where the generator, not the server, sets the pace (the
    // smallest reviews), requests per second hide a server's cost and CPU per request does not.
    let columns = [
        "scenario",
        "this build req/s",
        "previous req/s",
        "this / previous",
        "CPU µs/req this",
        "CPU µs/req previous",
        "previous CPU / this CPU",
        "this p99 ms",
        "previous p99 ms",
    ];
    table_header(&mut out, &columns);
    for Row { name, ours, previous, .. } in rows {
        let Some(previous) = previous else { continue };
        let (ours_p99, previous_p99) = (ours.percentile_ms(0.99), previous.percentile_ms(0.99));
        let (ours_cpu, previous_cpu) = (ours.cpu_per_request_us(), previous.cpu_per_request_us());
        writeln!(
            out,
            "| {name} | {:.0} | {:.0} | {:.2} | {ours_cpu:.1} | {previous_cpu:.1} | {:.2} | {ours_p99:.2} | {previous_p99:.2} |",
            ours.per_second(),
            previous.per_second(),
            ours.per_second() / previous.per_second(),
            previous_cpu / ours_cpu,
        )
        .unwrap();
    }
}

fn report_paced(open_loop: &[(&str, f64, Paced, Paced)], overload: Option<&(&str, f64, Paced, Paced)>) {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "\nopen loop over {CONNECTIONS} connections, each scenario at half busyguard's sustained rate and at \
         {LIGHT_RATE} req/s (latency from when each request was due), busyguard and then the floor at the same rate"
    )
    .unwrap();
    table_header(
        &mut out,
        &[
            "scenario",
            "req/s",
            "p50 ms",
            "p99 ms",
            "p99.9 ms",
            "floor p50 ms",
            "floor p99 ms",
            "floor p99.9 ms",
            "not answered",
            "pacer woke late p99.9 / max ms",
        ],
    );
    for (name, rate, ours, floor) in open_loop {
        let missed = ours.offered - ours.answered;
        let [p50, p99, p999] = [0.5, 0.99, 0.999].map(|p| ours.percentile_ms(p));
        let [f50, f99, f999] = [0.5, 0.99, 0.999].map(|p| floor.percentile_ms(p));
        let late = &ours.pacer_late_us;
        let (late_p999, late_max) = (percentile_ms(late, 0.999), percentile_ms(late, 1.0));
        writeln!(
            out,
            "| {name} | {rate:.0} | {p50:.2} | {p99:.2} | {p999:.2} | {f50:.2} | {f99:.2} | {f999:.2} | {missed} | {late_p999:.2} / {late_max:.2} |"
        )
        .unwrap();
    }
    let Some((name, rate, over, after)) = overload else { return };
    writeln!(out, "\noverload: {name} offered at {rate:.0} req/s (4x sustained) for {}s, ?timeout=2s", RUN.as_secs())
        .unwrap();
    table_header(
        &mut out,
        &[
            "phase",
            "offered",
            "answered",
            "shed 503",
            "connection refused",
            "past deadline",
            "not sent (no connection free in time)",
            "p99 ms of answered",
        ],
    );
    for (phase, paced) in [("4x overload", over), ("right after, half rate", after)] {
        writeln!(
            out,
            "| {phase} | {} | {} | {} | {} | {} | {} | {:.2} |",
            paced.offered,
            paced.answered,
            paced.shed,
            paced.refused,
            paced.late,
            paced.unsent,
            paced.percentile_ms(0.99)
        )
        .unwrap();
    }
}

/// The floor: the same TLS settings and certificate, HTTP/1.1 keep-alive, reads the body and
/// answers a constant allowed review. With `reads_json` it first decodes the review, checking
/// every byte as busyguard must, and answers with its uid (or 400 to malformed JSON).
fn floor_server(dir: &Path, reads_json: bool) {
    let addr: SocketAddr = std::env::var("FLOOR_LISTEN").unwrap().parse().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        let chain = CertificateDer::pem_file_iter(dir.join("tls.crt")).unwrap().collect::<Result<Vec<_>, _>>().unwrap();
        let key = PrivateKeyDer::from_pem_file(PathBuf::from(dir).join("tls.key")).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind(addr).await.unwrap();
        let answer = Bytes::from_static(
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"","allowed":true}}"#,
        );
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (acceptor, answer) = (acceptor.clone(), answer.clone());
            tokio::spawn(async move {
                tcp.set_nodelay(true).ok();
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                    let answer = answer.clone();
                    async move {
                        let body = request.into_body().collect().await?.to_bytes();
                        let (status, answer) = if reads_json { allow_uid(&body) } else { (200, answer) };
                        let response = hyper::Response::builder()
                            .status(status)
                            .header("content-type", "application/json")
                            .body(Full::new(answer))
                            .unwrap();
                        Ok::<_, hyper::Error>(response)
                    }
                });
                hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), service).await.ok();
            });
        }
    });
}

/// The JSON floor's answer: the review's uid allowed, once the body is checked (`floor_json`).
fn allow_uid(body: &[u8]) -> (u16, Bytes) {
    match floor_json::decode_uid(body) {
        Ok(uid) => (200, Bytes::from(AdmissionResponse::allow(&uid).encode())),
        Err(e) => (400, Bytes::from(json!({"error": e.to_string(), "code": 400}).to_string())),
    }
}
