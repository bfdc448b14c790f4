//! API server throughput with and without busyguard (`make bench-apiserver`): on the control
//! plane of the end-to-end suite (`K8S_HARNESS`, default `tests/e2e/k8s`), with busyguard
//! installed as shipped (two replicas, its own identity), 16 keep-alive clients as the cluster
//! admin run each write for `BENCH_SECONDS` (15), alternating with and without busyguard's
//! webhook configurations registered (its replicas run throughout, watching, as they would on
//! their own nodes; here they share the machine): `BENCH_SERIES` (2) series of `BENCH_PAIRS`
//! (3) pairs, each pair in the order opposite to the last (ABBA). Prints one row a write: requests per second
//! (lowest to highest run), the loss from the median runs, and p99 latency. `BENCH_WRITES` picks
//! the writes (`annotation,churn,flip`); `BENCH_NAMESPACE_LABELS` (`key=value,…`) labels the
//! bench's namespace, e.g. `busyguard.io/own-flags=false` to measure without `idle-pod-flags`.

#[allow(dead_code)]
#[path = "../tests/e2e/kubelet.rs"]
mod kubelet;
#[allow(dead_code)]
#[path = "../tests/common/kustomize.rs"]
mod kustomize;
#[allow(dead_code, unused_imports)]
#[path = "../tests/e2e/rig/mod.rs"]
mod rig;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;

const NAMESPACE: &str = "e2e-bench";
const CLIENTS: usize = 16;
const IDLE_PODS: usize = 30;

#[derive(Clone, Copy, Debug)]
enum Write {
    UnrelatedAnnotation,
    CreateDelete,
    FlipBusyAndBack,
    BusyDeleteDryRun,
}

impl Write {
    fn label(self) -> &'static str {
        match self {
            Write::UnrelatedAnnotation => "PATCH of an unrelated annotation on 30 idle opted-in pods",
            Write::CreateDelete => "create, then grace-0 delete, of idle opted-in pods",
            Write::FlipBusyAndBack => "flip to busy and back (one pod per client)",
            Write::BusyDeleteDryRun => "dry-run delete of a busy pod (refused with busyguard, allowed without)",
        }
    }

    /// The name `BENCH_WRITES` picks it by.
    fn name(self) -> &'static str {
        match self {
            Write::UnrelatedAnnotation => "annotation",
            Write::CreateDelete => "churn",
            Write::FlipBusyAndBack => "flip",
            Write::BusyDeleteDryRun => "busy-delete",
        }
    }
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() -> Result<()> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    let seconds = env_number("BENCH_SECONDS", 15);
    let (series, pairs) = (env_number("BENCH_SERIES", 2), env_number("BENCH_PAIRS", 3));
    let rig = rig::Rig::up()?;
    prepare(&rig)?;
    let runtime = tokio::runtime::Runtime::new()?;
    let client = runtime.block_on(client(&rig))?;
    let ca = std::fs::read(rig.certs().join("ca.crt"))?;
    println!("machine: {} cores; {seconds} s runs, {series} x {pairs} pairs, {CLIENTS} clients", cores());
    println!(
        "| write | without busyguard (req/s) | with busyguard (req/s) | loss (medians) | p99 without -> with (ms) \
         | reviews busyguard answered per request |"
    );
    println!("|---|---|---|---|---|---|");
    let picked = std::env::var("BENCH_WRITES").unwrap_or_else(|_| "annotation,churn,flip,busy-delete".into());
    let writes = [Write::UnrelatedAnnotation, Write::CreateDelete, Write::FlipBusyAndBack, Write::BusyDeleteDryRun];
    for write in writes.into_iter().filter(|w| picked.split(',').any(|p| p == w.name())) {
        let (mut without, mut with, mut sent) = (Vec::new(), Vec::new(), Vec::new());
        for pair in 0..series * pairs {
            let order = if pair % 2 == 0 { [false, true] } else { [true, false] };
            for registered in order {
                if registered {
                    rig.register(&ca)?;
                } else {
                    rig.unregister()?;
                }
                let reviews = rig.reviews_answered();
                let run = runtime.block_on(load(&client, write, Duration::from_secs(seconds)))?;
                if registered {
                    sent.push((rig.reviews_answered() - reviews) / run.latencies.len() as f64);
                    with.push(run);
                } else {
                    without.push(run);
                }
            }
        }
        let sent = sent.iter().sum::<f64>() / sent.len() as f64;
        println!("{} {sent:.2} |", row(write, &mut without, &mut with));
    }
    rig.register(&ca)?;
    Ok(())
}

fn cores() -> usize {
    std::thread::available_parallelism().map(usize::from).unwrap_or(1)
}

/// The pods the writes use: 30 idle ones, one per client to flip, and one busy per client.
fn prepare(rig: &rig::Rig) -> Result<()> {
    let _ = rig.try_kubectl(&["delete", "namespace", NAMESPACE, "--wait=true"]);
    rig.kubectl(&["create", "namespace", NAMESPACE])?;
    let labels = std::env::var("BENCH_NAMESPACE_LABELS").unwrap_or_default();
    for label in labels.split(',').filter(|l| !l.is_empty()) {
        rig.kubectl(&["label", "namespace", NAMESPACE, label])?;
    }
    let mut pods = Vec::new();
    let names = (0..IDLE_PODS).map(|i| (format!("idle-{i}"), "false"));
    let names = names.chain((0..CLIENTS).map(|i| (format!("flip-{i}"), "false")));
    for (name, busy) in names.chain((0..CLIENTS).map(|i| (format!("busy-{i}"), "true"))) {
        pods.push(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "bench", "busyguard.io/busy": busy}},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "w", "image": "example.com/w"}]}}));
    }
    rig.apply(&json!({"apiVersion": "v1", "kind": "List", "items": pods}))?;
    rig::eventually("the bench's pods run", Duration::from_secs(120), || {
        let list = rig.get(&["-n", NAMESPACE, "pods"])?;
        let running = list["items"].as_array().into_iter().flatten().filter(|p| p["status"]["phase"] == "Running");
        Ok(running.count() == IDLE_PODS + 2 * CLIENTS)
    })?;
    Ok(())
}

async fn client(rig: &rig::Rig) -> Result<kube::Client> {
    let kubeconfig = Kubeconfig::read_from(&rig.admin)?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    // Each request counted as it is answered: kube's own retry would wait out the 429s.
    config.default_retry = false;
    Ok(kube::Client::try_from(config)?)
}

struct Run {
    per_second: f64,
    latencies: Vec<Duration>,
}

/// `CLIENTS` clients making `write` for `period`: completed requests per second, and each one's
/// latency. A request that fails otherwise than as expected fails the bench.
async fn load(client: &kube::Client, write: Write, period: Duration) -> Result<Run> {
    let stop = Arc::new(AtomicBool::new(false));
    let serial = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for id in 0..CLIENTS {
        let (pods, stop, serial): (Api<Pod>, _, _) =
            (Api::namespaced(client.clone(), NAMESPACE), stop.clone(), serial.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let started = Instant::now();
                match write {
                    Write::UnrelatedAnnotation => {
                        let name = format!("idle-{}", (id * 7 + n) % IDLE_PODS);
                        let patch = json!({"metadata": {"annotations": {"bench/n": n.to_string()}}});
                        pods.patch(&name, &PatchParams::default(), &Patch::Merge(patch)).await?;
                    }
                    Write::CreateDelete => {
                        let name = format!("churn-{}", serial.fetch_add(1, Ordering::Relaxed));
                        let pod = serde_json::from_value(json!({"metadata": {"name": name,
                            "labels": {"app": "churn", "busyguard.io/busy": "false"}},
                            "spec": {"containers": [{"name": "w", "image": "example.com/w"}]}}))?;
                        pods.create(&PostParams::default(), &pod).await?;
                        latencies.push(started.elapsed());
                        let started = Instant::now();
                        let grace = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
                        pods.delete(&name, &grace).await?;
                        latencies.push(started.elapsed());
                        continue;
                    }
                    Write::FlipBusyAndBack => {
                        let busy = if n % 2 == 1 { "true" } else { "false" };
                        let patch = json!({"metadata": {"labels": {"busyguard.io/busy": busy}}});
                        pods.patch(&format!("flip-{id}"), &PatchParams::default(), &Patch::Merge(patch)).await?;
                    }
                    Write::BusyDeleteDryRun => {
                        let dry_run = DeleteParams { dry_run: true, ..DeleteParams::default() };
                        match pods.delete(&format!("busy-{id}"), &dry_run).await {
                            Ok(_) => {}
                            Err(kube::Error::Api(refused)) if refused.code == 429 => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                }
                latencies.push(started.elapsed());
            }
            anyhow::Ok(latencies)
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(period).await;
    stop.store(true, Ordering::Relaxed);
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.context("a client panicked")??);
    }
    let per_second = latencies.len() as f64 / started.elapsed().as_secs_f64();
    Ok(Run { per_second, latencies })
}

fn row(write: Write, without: &mut [Run], with: &mut [Run]) -> String {
    let rates = |runs: &mut [Run]| {
        runs.sort_by(|a, b| a.per_second.total_cmp(&b.per_second));
        (runs[0].per_second, runs[runs.len() / 2].per_second, runs[runs.len() - 1].per_second)
    };
    let p99s = |runs: &mut [Run]| {
        let mut p99: Vec<f64> = runs
            .iter_mut()
            .map(|run| {
                run.latencies.sort();
                run.latencies[(run.latencies.len() * 99 / 100).min(run.latencies.len() - 1)].as_secs_f64() * 1000.0
            })
            .collect();
        p99.sort_by(f64::total_cmp);
        (p99[0], p99[p99.len() - 1])
    };
    let ((lo, mid, hi), (lo2, mid2, hi2)) = (rates(without), rates(with));
    let ((p_lo, p_hi), (p_lo2, p_hi2)) = (p99s(without), p99s(with));
    format!(
        "| {} | {lo:.0}-{hi:.0} | {lo2:.0}-{hi2:.0} | {:.1} % | {p_lo:.0}-{p_hi:.0} -> {p_lo2:.0}-{p_hi2:.0} |",
        write.label(),
        (1.0 - mid2 / mid) * 100.0
    )
}
