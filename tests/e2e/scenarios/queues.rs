//! Workers on a steady queue (each takes its next task the moment one ends, and a refused flip
//! means "do not start"), under every disruption that evicts: each finishes within two tasks,
//! cuts no task, and one abandoned halfway leaves the workers free again within the hold.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use serde_json::{Value, json};

use crate::rig::{Namespace, Rig, eventually};
use crate::workers::{self, Queue, Tally, grant_workers, label};

/// Karpenter's annotation on a pod it must not disrupt (busyguard writes it on busy pods).
const DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";

/// How long each task takes.
const TASK: Duration = Duration::from_secs(6);
/// The hold after a refused eviction, as shipped (--hold-after-eviction).
const HOLD: Duration = Duration::from_secs(30);

/// Three workers' pods on a node of their own, each on a steady queue, every one busy at least
/// once before this returns.
fn fleet<'r>(rig: &'r Rig, name: &str) -> Result<(Namespace<'r>, String, Queue)> {
    let ns = rig.namespace(name)?;
    let node = format!("e2e-{name}");
    rig.node(&node, "4")?;
    grant_workers(rig, &ns, "worker")?;
    let pods: Vec<String> = (1..=3).map(|i| format!("worker-{i}")).collect();
    for pod in &pods {
        let mut worker = workers::pod(&ns, pod, Some(&node));
        worker["metadata"]["labels"]["app"] = json!("queue");
        worker["spec"]["serviceAccountName"] = json!("worker");
        rig.apply(&worker)?;
    }
    eventually("three workers ready", Duration::from_secs(60), || {
        Ok(workers::ready_pods(rig, &ns, "queue")?.len() == 3)
    })?;
    let queue = Queue::start(rig, &ns, "worker", &pods, TASK)?;
    let mut seen_busy: Vec<String> = Vec::new();
    eventually("every worker on a task", Duration::from_secs(30), || {
        for pod in &pods {
            if rig.pod(&ns, pod)?.is_some_and(|p| label(&p, "busyguard.io/busy").as_deref() == Some("true"))
                && !seen_busy.contains(pod)
            {
                seen_busy.push(pod.clone());
            }
        }
        Ok(seen_busy.len() == pods.len())
    })?;
    Ok((ns, node, queue))
}

/// The pods still on `node` in `ns`.
fn pods_on(rig: &Rig, ns: &str, node: &str) -> Result<Vec<String>> {
    let list = rig.get(&["-n", ns, "pods", "--field-selector", &format!("spec.nodeName={node}")])?;
    Ok((list["items"].as_array().into_iter().flatten())
        .filter_map(|p| p["metadata"]["name"].as_str().map(String::from))
        .collect())
}

/// What the workers did from `since` on: the tasks started and the flips refused; and the
/// checks every scenario makes: no task cut, at most one task started per worker (one that was
/// under way to start when the disruption began), and `took` within two tasks.
fn converged(what: &str, since: Instant, took: Duration, tallies: &[Tally]) -> Result<()> {
    let started: usize = tallies.iter().map(|t| t.started.iter().filter(|at| **at > since).count()).sum();
    let refused: usize = tallies.iter().map(|t| t.refused.iter().filter(|(at, _)| *at > since).count()).sum();
    let cut: usize = tallies.iter().map(|t| t.cut).sum();
    println!(
        "e2e:   {what}: the node emptied in {took:.1?}; {started} task(s) started meanwhile, {refused} flip(s) refused"
    );
    ensure!(cut == 0, "{cut} task(s) cut: {tallies:?}");
    ensure!(started <= tallies.len(), "{started} tasks started after the disruption began: {tallies:?}");
    ensure!(took <= 2 * TASK + Duration::from_secs(10), "{what} took {took:?}, more than two tasks of {TASK:?}");
    Ok(())
}

/// `kubectl drain` of the node of three workers on a steady queue: every refused eviction holds
/// its pod from new tasks, so each pod goes at its next idle moment and the drain completes.
pub fn a_drain_of_queue_workers_completes_within_a_task(rig: &Rig) -> Result<()> {
    let (_ns, node, queue) = fleet(rig, "queue-drain")?;
    let since = Instant::now();
    let (ok, _, err) = rig.try_kubectl(&["drain", &node, "--force", "--ignore-daemonsets", "--timeout=90s"])?;
    let took = since.elapsed();
    let tallies = queue.finish();
    ensure!(ok, "the drain did not complete: {err}");
    converged("kubectl drain", since, took, &tallies)
}

/// Karpenter's way: the node tainted karpenter.sh/disrupted:NoSchedule, then each pod evicted
/// by Karpenter's terminator, retried per pod with a backoff from 100 ms to 10 s (its eviction
/// queue); a pod carrying `karpenter.sh/do-not-disrupt` (a busy one: busyguard writes it) is not
/// evicted at all, only waited for, as Karpenter's terminator does. The taint alone refuses
/// every flip to busy.
pub fn a_karpenter_disruption_of_queue_workers_completes_within_a_task(rig: &Rig) -> Result<()> {
    let backoff = |delay: Duration| (delay * 2).min(Duration::from_secs(10));
    let disruption = Autoscaler {
        name: "karpenter",
        user: ("karpenter", "karpenter"),
        first_retry: Duration::from_millis(100),
        waits_on_do_not_disrupt: true,
        drains_after: Duration::ZERO,
        refused_for: None,
    };
    let taint = |node: &str| rig.kubectl(&["taint", "node", node, "karpenter.sh/disrupted:NoSchedule"]).map(drop);
    disruption.run(rig, taint, backoff)
}

/// cluster-autoscaler's way: the node tainted ToBeDeletedByClusterAutoscaler, then each pod
/// evicted, retried every 10 s (DefaultEvictionRetryTime).
pub fn a_cluster_autoscaler_scale_down_of_queue_workers_completes_within_a_task(rig: &Rig) -> Result<()> {
    let taint = format!("ToBeDeletedByClusterAutoscaler={}:NoSchedule", jiff::Timestamp::now().as_second());
    let disruption = Autoscaler {
        name: "autoscaler",
        user: ("kube-system", "cluster-autoscaler"),
        first_retry: Duration::from_secs(10),
        waits_on_do_not_disrupt: false,
        drains_after: Duration::ZERO,
        refused_for: None,
    };
    disruption.run(rig, |node| rig.kubectl(&["taint", "node", node, &taint]).map(drop), |every| every)
}

/// An EKS managed node group's update: the node to replace (of a managed node group) cordoned
/// and labelled `node.kubernetes.io/exclude-from-external-load-balancers=true`, as its scale-up
/// phase does; a task later, as its upgrade phase begins, each pod evicted, retried every 5 s
/// until the update's 15 minutes. Before any eviction, the marks alone refuse every flip to busy,
/// as Karpenter's taint does: no worker starts a new task meanwhile.
pub fn an_eks_node_group_update_of_queue_workers_completes_within_a_task(rig: &Rig) -> Result<()> {
    let update = Autoscaler {
        name: "eks-update",
        user: ("kube-system", "eks-node-manager"),
        first_retry: Duration::from_secs(5),
        waits_on_do_not_disrupt: false,
        drains_after: TASK + Duration::from_secs(2),
        refused_for: Some("its EKS managed node group's update cordoned it"),
    };
    let mark = |node: &str| {
        rig.kubectl(&["label", "node", node, "eks.amazonaws.com/nodegroup=workers"])?;
        rig.kubectl(&["cordon", node])?;
        rig.kubectl(&["label", "node", node, "node.kubernetes.io/exclude-from-external-load-balancers=true"]).map(drop)
    };
    update.run(rig, mark, |every| every)
}

/// An autoscaler (or an upgrader) that marks a node going, then evicts each pod there as its service account `user`,
/// retrying each after `first_retry`, and each retry after the next of the last wait; one that
/// `waits_on_do_not_disrupt` evicts no pod while it carries `karpenter.sh/do-not-disrupt`.
struct Autoscaler {
    name: &'static str,
    user: (&'static str, &'static str),
    first_retry: Duration,
    waits_on_do_not_disrupt: bool,
    /// How long after marking the node it begins to evict.
    drains_after: Duration,
    /// What the flips refused before the first eviction say, if the marks alone must refuse them.
    refused_for: Option<&'static str>,
}

impl Autoscaler {
    /// `mark` marks the node going (a taint, a cordon and labels), then the pods are evicted.
    fn run(&self, rig: &Rig, mark: impl FnOnce(&str) -> Result<()>, next: impl Fn(Duration) -> Duration) -> Result<()> {
        evictor(rig, self.user.0, self.user.1)?;
        let (ns, node, queue) = fleet(rig, &format!("queue-{}", self.name))?;
        let since = Instant::now();
        mark(&node)?;
        std::thread::sleep(self.drains_after);
        let user = format!("system:serviceaccount:{}:{}", self.user.0, self.user.1);
        let mut retries: HashMap<String, (Instant, Duration)> = HashMap::new();
        let emptied = evict_until_empty(rig, &ns, &node, &user, |pod, now| {
            if self.waits_on_do_not_disrupt && workers::annotation(pod, DO_NOT_DISRUPT).as_deref() == Some("true") {
                return false;
            }
            let name = pod["metadata"]["name"].as_str().unwrap_or_default();
            let (at, wait) = retries.entry(name.to_string()).or_insert((now, self.first_retry));
            if now < *at {
                return false;
            }
            *at = now + *wait;
            *wait = next(*wait);
            true
        });
        let took = since.elapsed();
        let tallies = queue.finish();
        emptied?;
        if let Some(why) = self.refused_for {
            let before_evictions = |at: &Instant| *at < since + self.drains_after;
            let held =
                tallies.iter().flat_map(|t| &t.refused).any(|(at, said)| before_evictions(at) && said.contains(why));
            ensure!(held, "no flip was refused for the node's marks alone ({why:?}): {tallies:?}");
        }
        converged(&format!("{}'s disruption", self.name), since, took, &tallies)
    }
}

/// The service account `namespace:name` (an autoscaler's) may evict pods, as its Helm chart lets it.
fn evictor(rig: &Rig, namespace: &str, name: &str) -> Result<()> {
    let role = format!("e2e-evictor-{name}");
    rig.grant_cluster(
        &role,
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
                  {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}]),
        namespace,
        name,
    )?;
    Ok(())
}

/// Evicts, as `user`, each pod on `node` that `due(pod, now)` says is due, until none is left.
fn evict_until_empty(
    rig: &Rig,
    ns: &str,
    node: &str,
    user: &str,
    mut due: impl FnMut(&Value, Instant) -> bool,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let list = rig.get(&["-n", ns, "pods", "--field-selector", &format!("spec.nodeName={node}")])?;
        let left = list["items"].as_array().cloned().unwrap_or_default();
        if left.is_empty() {
            return Ok(());
        }
        let names: Vec<&str> = left.iter().filter_map(|p| p["metadata"]["name"].as_str()).collect();
        ensure!(Instant::now() < deadline, "pods still on {node} after 90 s: {names:?}");
        for pod in &left {
            if due(pod, Instant::now()) {
                let pod = pod["metadata"]["name"].as_str().unwrap_or_default();
                let (ok, err) = rig.evict_as(Some(user), ns, pod)?;
                ensure!(ok || err.contains("TooManyRequests") || err.contains("NotFound"), "eviction of {pod}: {err}");
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A drain abandoned halfway (it times out, and the node is uncordoned): no worker is left idle
/// for good; each takes tasks again once the hold of its last refused eviction runs out.
pub fn an_abandoned_drain_leaves_queue_workers_free_within_the_hold(rig: &Rig) -> Result<()> {
    let (ns, node, queue) = fleet(rig, "queue-abandoned")?;
    let (ok, _, _) = rig.try_kubectl(&["drain", &node, "--force", "--ignore-daemonsets", "--timeout=3s"])?;
    ensure!(!ok, "the drain completed within 3 s: the workers were not busy");
    rig.kubectl(&["uncordon", &node])?;
    let abandoned = Instant::now();
    let staying = pods_on(rig, &ns, &node)?;
    ensure!(!staying.is_empty(), "the drain took every pod in 3 s");
    // Each of the pods that stayed takes a task again within the hold and a task.
    std::thread::sleep(HOLD + TASK + Duration::from_secs(5));
    let tallies = queue.finish();
    let again: Vec<(&str, Option<Duration>)> = (tallies.iter())
        .filter(|t| staying.contains(&t.pod))
        .map(|t| (t.pod.as_str(), t.started.iter().find(|at| **at > abandoned).map(|at| *at - abandoned)))
        .collect();
    let held = (tallies.iter()).flat_map(|t| &t.refused).filter(|(at, _)| *at > abandoned).count();
    println!("e2e:   abandoned drain: {held} flip(s) refused after it; next tasks after {again:?}");
    ensure!(
        again.iter().all(|(_, at)| at.is_some()),
        "a worker took no task after the drain was abandoned: {tallies:?}"
    );
    ensure!(tallies.iter().all(|t| t.cut == 0), "a task was cut: {tallies:?}");
    Ok(())
}

/// A scale-down of a Deployment of six workers on a steady queue to two: as fast as before,
/// no task cut.
pub fn a_scale_down_of_queue_workers_completes_within_a_task(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("queue-scale")?;
    grant_workers(rig, &ns, "worker")?;
    let mut deployment = workers::deployment(&ns, "queue", 6);
    deployment["spec"]["template"]["spec"]["serviceAccountName"] = json!("worker");
    let pods = workers::start(rig, &deployment, "queue", 6)?;
    let queue = Queue::start(rig, &ns, "worker", &pods, TASK)?;
    std::thread::sleep(TASK);
    let since = Instant::now();
    rig.kubectl(&["-n", &ns, "scale", "deployment", "queue", "--replicas=2"])?;
    let left =
        eventually("two pods left", 2 * TASK + Duration::from_secs(10), || Ok(rig.live_pods(&ns, "queue")?.len() == 2));
    let took = since.elapsed();
    let tallies = queue.finish();
    left?;
    let cut: usize = tallies.iter().map(|t| t.cut).sum();
    println!("e2e:   scale-down 6 to 2: converged in {took:.1?}");
    ensure!(cut == 0, "{cut} task(s) cut: {tallies:?}");
    Ok(())
}

/// A worker on a steady queue whose app does not call busyguard: `busyguard agent` runs beside
/// it, reports its app's busy endpoint, and the app asks the agent before each task (`POST
/// /start`). Under `kubectl drain` the app is told not to start once the pod is held, the drain
/// completes within two tasks, and no task is cut.
pub fn a_drain_of_a_queue_worker_behind_the_agent_completes_and_cuts_no_task(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("queue-agent")?;
    let node = "e2e-queue-agent".to_string();
    rig.node(&node, "4")?;
    grant_workers(rig, &ns, "worker")?;
    let mut worker = workers::pod(&ns, "worker", Some(&node));
    worker["spec"]["serviceAccountName"] = json!("worker");
    rig.apply(&worker)?;
    eventually(
        "the worker ready",
        Duration::from_secs(60),
        || Ok(workers::ready_pods(rig, &ns, "worker")?.len() == 1),
    )?;
    let kubeconfig = rig.kubeconfig_for("queue-agent", &rig.pod_token(&ns, "worker", "worker")?)?;
    let app = App::start()?;
    let [listen] = crate::rig::free_ports()?;
    let mut agent = Command::new(crate::rig::BUSYGUARD);
    agent.args(["agent", "--busy-status", "503", "--interval", "200ms", "--pod", "worker", "--namespace", &ns]);
    agent.args(["--url", &format!("http://{}/busy", app.addr), "--listen", &listen.to_string(), "--kubeconfig"]);
    agent.arg(&kubeconfig).stdout(Stdio::null()).stderr(Stdio::null());
    crate::rig::die_with_parent(&mut agent);
    let mut agent = agent.spawn()?;
    let worked = app.work(listen, TASK);
    // Busy at least once before the drain.
    let busy = eventually("the worker on a task", Duration::from_secs(30), || {
        Ok(rig.pod(&ns, "worker")?.is_some_and(|p| label(&p, "busyguard.io/busy").as_deref() == Some("true")))
    });
    let since = Instant::now();
    // The moment the pod goes (its deletionTimestamp, as the drain's eviction sets it): a task
    // under way then is cut.
    let (drain, gone_at) = std::thread::scope(|scope| {
        let watching = scope.spawn(|| {
            let deadline = Instant::now() + Duration::from_secs(120);
            while Instant::now() < deadline {
                match rig.pod(&ns, "worker") {
                    Ok(Some(pod)) if pod["metadata"]["deletionTimestamp"].is_null() => {}
                    Ok(_) => return Some(Instant::now()),
                    Err(_) => {}
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            None
        });
        let drain =
            busy.and_then(|()| rig.try_kubectl(&["drain", &node, "--force", "--ignore-daemonsets", "--timeout=90s"]));
        (drain, watching.join().unwrap_or_default())
    });
    let took = since.elapsed();
    let tally = worked.finish(gone_at.unwrap_or_else(Instant::now));
    let _ = agent.kill();
    let _ = agent.wait();
    let (ok, _, err) = drain?;
    ensure!(ok, "the drain did not complete: {err}");
    converged("kubectl drain, behind the agent", since, took, &[tally])
}

/// An app on a steady queue that does not call busyguard: its endpoint `/busy` answers 503 while
/// it works; before each task it asks the agent (`POST /start`), and on anything but 200 waits a
/// second and asks again.
struct App {
    addr: std::net::SocketAddr,
    working: Arc<AtomicBool>,
}

/// The app's worker thread, and how to stop it.
struct Working {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Vec<(Instant, Instant)>>,
    refused: Arc<Mutex<Vec<Instant>>>,
}

impl App {
    fn start() -> Result<App> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let (addr, working) = (listener.local_addr()?, Arc::new(AtomicBool::new(false)));
        let answering = working.clone();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                let mut request = [0u8; 1024];
                let _ = std::io::Read::read(&mut stream, &mut request);
                let status = if answering.load(Ordering::SeqCst) { "503 Busy" } else { "200 OK" };
                let answer = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                let _ = std::io::Write::write_all(&mut stream, answer.as_bytes());
            }
        });
        Ok(App { addr, working })
    }

    /// Works tasks of `task` one after another until stopped, each started only when the agent
    /// at `agent` says so; returns each task's start and end.
    fn work(&self, agent: std::net::SocketAddr, task: Duration) -> Working {
        let (stop, refused) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(Vec::new())));
        let (stopping, working, refusals) = (stop.clone(), self.working.clone(), refused.clone());
        let handle = std::thread::spawn(move || {
            let mut tasks = Vec::new();
            while !stopping.load(Ordering::SeqCst) {
                if ask_to_start(agent).is_some_and(|status| status == 200) {
                    working.store(true, Ordering::SeqCst);
                    let started = Instant::now();
                    std::thread::sleep(task);
                    working.store(false, Ordering::SeqCst);
                    tasks.push((started, Instant::now()));
                } else {
                    refusals.lock().unwrap().push(Instant::now());
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
            tasks
        });
        Working { stop, handle, refused }
    }
}

impl Working {
    /// Stops the app; a task under way when its pod went (`gone_at`) was cut.
    fn finish(self, gone_at: Instant) -> Tally {
        self.stop.store(true, Ordering::SeqCst);
        let tasks = self.handle.join().unwrap_or_default();
        let refused = self.refused.lock().unwrap().iter().map(|at| (*at, "do not start".to_string())).collect();
        let cut = tasks.iter().filter(|(started, ended)| *started < gone_at && gone_at < *ended).count();
        let started = tasks.iter().map(|(at, _)| *at).filter(|at| *at < gone_at).collect();
        Tally { pod: "worker".into(), started, cut, refused }
    }
}

/// `POST /start` to the agent: its status code, or None if it did not answer.
fn ask_to_start(agent: std::net::SocketAddr) -> Option<u16> {
    let mut stream = std::net::TcpStream::connect_timeout(&agent, Duration::from_secs(2)).ok()?;
    let request = format!("POST /start HTTP/1.1\r\nHost: {agent}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    std::io::Write::write_all(&mut stream, request.as_bytes()).ok()?;
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut stream, &mut answer).ok()?;
    answer.split_whitespace().nth(1)?.parse().ok()
}
