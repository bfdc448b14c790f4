//! The handler alone, per fixture: decode the AdmissionReview, decide, encode the answer (the
//! median of 5 rounds); no TLS, no HTTP. Beside it, the decoding alone, and the JSON floor's
//! decoding of the same body (the uid alone, every byte checked): what reading the fields the
//! decisions read costs over checking the JSON. `make bench`, or `cargo bench --bench handler`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use busyguard::admission::review::{AdmissionResponse, decode};
use busyguard::admission::{DecisionInputs, Webhook, admit};
use busyguard::cli::{Cli, Command};
use busyguard::cluster::view::{ApiPod, View};
use busyguard::policy::Enrolment;
use busyguard::policy::hold::{NodeGoing, NodeState};
use clap::Parser;
use jiff::Timestamp;
use serde_json::{Value, json};

#[path = "common/floor_json.rs"]
mod floor_json;

/// The allocator the busyguard binary runs with.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// A view holding the busy pod the eviction fixture names.
fn view_with_busy_pod() -> View {
    let eviction: Value = serde_json::from_slice(&fixture("pod-eviction-by-user.json")).unwrap();
    let delete: Value = serde_json::from_slice(&fixture("pod-delete-by-replicaset-controller.json")).unwrap();
    let mut pod = delete["request"]["oldObject"].clone();
    pod["metadata"]["name"] = eviction["request"]["name"].clone();
    pod["metadata"]["annotations"] = json!({"busyguard.io/busy-since": Timestamp::now().to_string()});
    let watched: ApiPod = serde_json::from_value(pod).unwrap();
    let scope = None;
    let view = View::watching(std::slice::from_ref(&scope), Duration::from_secs(60), Enrolment::OptOut);
    view.insert(watched.namespace(), watched.name(), watched.record(&[]));
    view.alive(Instant::now());
    view.listed(&scope);
    view
}

/// A deleted pod marked busy turned busy now (busyguard stamped it), so it is protected; the
/// body keeps the fixtures' one-space indentation, so its size stays the recorded review's.
fn with_busy_pods_stamped_now(recorded: Vec<u8>) -> Vec<u8> {
    let mut review: Value = serde_json::from_slice(&recorded).unwrap();
    let old = &mut review["request"]["oldObject"]["metadata"];
    if old["labels"]["busyguard.io/busy"] != "true" {
        return recorded;
    }
    old["annotations"]["busyguard.io/busy-since"] = json!(Timestamp::now().to_string());
    let mut body = Vec::new();
    let indent = serde_json::ser::PrettyFormatter::with_indent(b" ");
    serde::Serialize::serialize(&review, &mut serde_json::Serializer::with_formatter(&mut body, indent)).unwrap();
    body
}

fn main() {
    let Command::Serve(args) = Cli::parse_from(["busyguard", "serve"]).command else { unreachable!() };
    let policy = args.into_config().policy;
    let view = view_with_busy_pod();
    let cases = [
        ("pod-eviction-by-user.json", Webhook::Validating),
        ("pod-delete-by-replicaset-controller.json", Webhook::Validating),
        ("pod-delete-by-user.json", Webhook::Validating),
        ("pod-update-label-busy-by-user.json", Webhook::Mutating),
        ("pod-create-by-replicaset-controller.json", Webhook::Mutating),
        ("deployment-scale-subresource-down-by-kubectl.json", Webhook::Validating),
    ];
    println!("| review (body size) | decode + decide + encode µs | decode µs | the JSON floor's decode µs |");
    println!("|---|---:|---:|---:|");
    for (name, webhook) in cases {
        let body = with_busy_pods_stamped_now(fixture(name));
        let inputs = DecisionInputs { policy: &policy, view: &view, arrived: Instant::now() };
        let handler = median_us(|| {
            let request = decode(black_box(&body)).unwrap();
            let outcome = admit(&request, webhook, &inputs, Timestamp::now()).unwrap();
            black_box(AdmissionResponse::of(&request.uid, &outcome.answer).encode());
        });
        let decoding = median_us(|| drop(black_box(decode(black_box(&body)).unwrap())));
        let floor = median_us(|| drop(black_box(floor_json::decode_uid(black_box(&body)).unwrap())));
        println!("| {name} ({:.1} KB) | {handler:.1} | {decoding:.1} | {floor:.1} |", body.len() as f64 / 1024.0);
    }
    // The same flip on a node that is going (Karpenter's taint): refused, 409. The row above is
    // the flip on a node that stays: one look-up in the (empty) map of going nodes.
    let flip = fixture("pod-update-label-busy-by-user.json");
    let node: Value = serde_json::from_slice(&flip).unwrap();
    let node = node["request"]["object"]["spec"]["nodeName"].as_str().unwrap_or_default().to_string();
    view.nodes.set(&node, NodeState { going: Some(NodeGoing::Karpenter), ending: None });
    let inputs = DecisionInputs { policy: &policy, view: &view, arrived: Instant::now() };
    let refused = median_us(|| {
        let request = decode(black_box(&flip)).unwrap();
        let outcome = admit(&request, Webhook::Mutating, &inputs, Timestamp::now()).unwrap();
        black_box(AdmissionResponse::of(&request.uid, &outcome.answer).encode());
    });
    println!("| the same flip, its node going (refused) | {refused:.1} | | |");
}

/// µs a call: the median of 5 rounds of 5,000 (a shared machine's hiccups fall into one round,
/// not into all).
fn median_us(mut call: impl FnMut()) -> f64 {
    let iterations = 5_000;
    let mut rounds: Vec<f64> = (0..5)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..iterations {
                call();
            }
            started.elapsed().as_secs_f64() * 1e6 / f64::from(iterations)
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[2]
}
