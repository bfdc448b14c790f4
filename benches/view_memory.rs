//! Memory of the cluster view: fills it with synthetic opted-in pods (decoded from API JSON the
//! way the watch does) and reports heap bytes per pod and the process's resident memory; then
//! what the view's pods cost the sweep (every pod asked what is due) and a scale-down of a
//! 2,000-replica Deployment by 1,000 (its pods selected from the view, its plan made).
//! `make bench`, or `cargo bench --bench view_memory`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use busyguard::cluster::view::{ApiPod, View};
use busyguard::policy::busy::MaxBusy;
use busyguard::policy::marks::MutationSettings;
use busyguard::policy::pod::PodRef;
use busyguard::policy::scale::{ScaleRequest, prepare_scale_down};
use busyguard::policy::selector::Selector;
use busyguard::policy::{Ask, Enrolment, Mode, PolicyConfig, Requester, observed};
use serde_json::json;

/// Counts the bytes live on the heap.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// A pod as a Deployment makes it, with the annotations tools add; every other one busy.
fn pod(i: usize) -> serde_json::Value {
    let busy = i.is_multiple_of(2);
    let mut annotations = json!({
        "kubectl.kubernetes.io/restartedAt": "2026-11-21T20:00:00Z",
        "prometheus.io/scrape": "true",
        "controller.kubernetes.io/pod-deletion-cost": "1",
    });
    if busy {
        let extra = json!({
            "busyguard.io/busy-since": "2026-11-21T20:48:44Z",
            "controller.kubernetes.io/pod-deletion-cost": "1168187571",
            "busyguard.io/idle-cost": "1",
            "karpenter.sh/do-not-disrupt": "true",
            "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
        });
        annotations.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    }
    json!({
        "metadata": {
            "name": format!("worker-6b8958b477-{i:06}"), "namespace": format!("team-{}", i % 50),
            "uid": format!("57b6ee13-2f1a-4102-bc99-{i:012}"), "resourceVersion": format!("{}", 1000 + i),
            "labels": {"app": "worker", "app.kubernetes.io/part-of": "capture", "pod-template-hash": "6b8958b477",
                       "busyguard.io/busy": if busy { "true" } else { "false" }},
            "annotations": annotations,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "worker-6b8958b477",
                                 "uid": "4fbe5cfa-31bc-4946-a37d-e74e052ddc59", "controller": true}],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1"}]
        },
        "spec": {"nodeName": format!("node-{}", i % 300), "containers": [{"name": "app", "image": "example.com/worker:1.0.0"}]},
        "status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-21T20:49:11Z"}],
            "containerStatuses": [{"name": "app", "restartCount": 0, "ready": true,
                                   "state": {"running": {"startedAt": "2026-11-21T20:49:11Z"}}}]}
    })
}

fn resident_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn fill(count: usize) -> (View, isize, Duration) {
    let view = View::watching(&[None], Duration::from_secs(60), Enrolment::OptOut);
    let before = LIVE.load(Ordering::Relaxed);
    let started = Instant::now();
    for i in 0..count {
        let text = pod(i).to_string();
        let watched: ApiPod = serde_json::from_str(&text).expect("pod decodes");
        view.insert(watched.namespace(), watched.name(), watched.record(&[]));
    }
    (view, LIVE.load(Ordering::Relaxed) - before, started.elapsed())
}

fn main() {
    let mut sweeps = Vec::new();
    println!("| pods | heap bytes/pod | resident MiB | build+decode+insert µs/pod | lookup ns |");
    println!("|---:|---:|---:|---:|---:|");
    for count in [10_000, 100_000] {
        let (view, heap, took) = fill(count);
        assert_eq!(view.len(), count);
        let lookups = 100_000;
        let started = Instant::now();
        for i in 0..lookups {
            let i = (i * 7919) % count;
            let (namespace, name) = (format!("team-{}", i % 50), format!("worker-6b8958b477-{i:06}"));
            std::hint::black_box(
                view.with_pod_under_budget(&namespace, &name, |pod, _| (std::hint::black_box(pod).uid.len(), false)),
            );
        }
        let lookup_ns = started.elapsed().as_nanos() / lookups as u128;
        let resident = resident_kib().map_or("n/a".to_string(), |k| format!("{:.1}", k as f64 / 1024.0));
        println!(
            "| {count} | {} | {resident} | {:.2} | {lookup_ns} |",
            heap / count as isize,
            took.as_secs_f64() * 1e6 / count as f64
        );
        sweeps.push((count, sweep_ns_per_pod(&view)));
        drop(view);
    }
    println!("\n| pods | sweep ns/pod (what is due, every pod) |");
    println!("|---:|---:|");
    for (count, ns) in sweeps {
        println!("| {count} | {ns} |");
    }
    scale_down_of_2000_by_1000();
}

fn config() -> PolicyConfig {
    PolicyConfig {
        mode: Mode::Enforce,
        max_busy: MaxBusy::new(jiff::SignedDuration::from_hours(24)),
        exemptions: Default::default(),
        mutation: MutationSettings {
            karpenter: true,
            karpenter_bounded: false,
            cluster_autoscaler: true,
            cluster_autoscaler_on_completion: false,
            marks: &[],
        },
        holds: Default::default(),
        owner_rules: Vec::new(),
        busy_with_pod: None,
    }
}

/// The sweep's work for each pod, as `Watch::sweep` does it: what is due, under the read lock.
fn sweep_ns_per_pod(view: &View) -> u128 {
    let (config, now) = (config(), "2026-11-21T21:00:00Z".parse().unwrap());
    let started = Instant::now();
    let due = view.flat_map(|namespace, name, record| {
        let pod = PodRef { namespace: namespace.into(), name: name.into(), uid: record.uid.to_string() };
        observed::due(&pod, record, &config, now)
    });
    std::hint::black_box(due);
    started.elapsed().as_nanos() / view.len() as u128
}

/// A Deployment of 2,000 replicas in one namespace (every other pod busy; the busy ones carry no
/// busyguard annotations yet, as after a flip busyguard missed) scaled to 1,000: its pods
/// selected from the view, and the plan with the refreshes it sends.
fn scale_down_of_2000_by_1000() {
    let view = View::watching(&[None], Duration::from_secs(60), Enrolment::OptOut);
    for i in 0..2000 {
        let mut pod = pod(i);
        pod["metadata"]["namespace"] = json!("jobs");
        if i % 2 == 0 {
            let annotations = pod["metadata"]["annotations"].as_object_mut().unwrap();
            annotations.retain(|key, _| {
                !key.starts_with("busyguard.io/")
                    && !key.starts_with("karpenter")
                    && !key.starts_with("cluster-autoscaler")
            });
        }
        let watched: ApiPod = serde_json::from_value(pod).unwrap();
        view.insert(watched.namespace(), watched.name(), watched.record(&[]));
    }
    let selector = serde_json::from_value(json!({"matchLabels": {"app": "worker"}})).unwrap();
    let ask = Ask {
        uid: "u",
        operation: busyguard::policy::Operation::Update,
        resource: "deployments",
        subresource: "scale",
        namespace: "jobs",
        name: "worker",
        requester: Requester { username: "alice", groups: &[], pod: None },
        dry_run: false,
    };
    let (config, now) = (config(), "2026-11-21T21:00:00Z".parse().unwrap());
    let started = Instant::now();
    let request = ScaleRequest {
        ask: &ask,
        object: "deployments/scale jobs/worker",
        from: Some(2000),
        to: Some(1000),
        selector: Some(Selector::from_label_selector(&selector)),
    };
    let select = |selector: &Selector| {
        Ok(view.select("jobs", |pod| selector.matches(|key| busyguard::policy::pod::PodFacts::label(pod, key))))
    };
    let outcome = prepare_scale_down(&request, select, &config, now);
    let took = started.elapsed();
    println!(
        "\nscale-down of a 2000-replica Deployment to 1000: prepared in {:.1} ms, {} pod patches to send (one per pod whose annotations are stale, here the 1000 busy ones)",
        took.as_secs_f64() * 1e3,
        outcome.effects.len()
    );
}
