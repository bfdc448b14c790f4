//! Property tests over generated inputs (the invariants are in `common/invariants.rs`, shared
//! with the fuzz targets): any body is answered or refused, never a panic; a busy pod goes only
//! with an audited exemption; mutation patches apply and the flip back to idle restores the
//! pod's annotations; every answer echoes the uid.

mod common;

use common::fixture;
use common::invariants::{self, Disruption, EXEMPT_GROUP, EXEMPT_USER, KARPENTER_USER};
use jiff::SignedDuration;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

const FIXTURES: &[&str] = &[
    "deployment-scale-subresource-down-by-kubectl.json",
    "deployment-update-replicas-down-by-user.json",
    "pod-create-by-replicaset-controller.json",
    "pod-create-by-user.json",
    "pod-delete-by-replicaset-controller.json",
    "pod-delete-by-user.json",
    "pod-delete-final-by-kubelet.json",
    "pod-eviction-by-user.json",
    "pod-eviction-server-dry-run-by-user.json",
    "pod-update-annotation-by-user.json",
    "pod-update-label-busy-by-user.json",
    "replicaset-scale-subresource-down-by-kubectl.json",
    "replicaset-update-scale-down-by-deployment-controller.json",
];

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::String),
        Just(json!("true")),
        Just(json!("2026-11-21T19:00:00Z")),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{1,6}", inner, 0..4).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Every place in `value`, as a JSON pointer.
fn pointers(value: &Value, at: String, into: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            map.iter().for_each(|(k, v)| pointers(v, format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")), into))
        }
        Value::Array(items) => items.iter().enumerate().for_each(|(i, v)| pointers(v, format!("{at}/{i}"), into)),
        _ => {}
    }
    into.push(at);
}

/// A real review with some of its values replaced, removed or the whole body cut short.
fn mutated_fixture() -> impl Strategy<Value = Vec<u8>> {
    let edits = prop::collection::vec((any::<prop::sample::Index>(), prop::option::of(any_json())), 0..6);
    (prop::sample::select(FIXTURES), edits, prop::option::of(any::<prop::sample::Index>())).prop_map(
        |(name, edits, cut)| {
            let mut review = fixture(name);
            for (place, replacement) in edits {
                let mut all = Vec::new();
                pointers(&review, String::new(), &mut all);
                let pointer = place.get(&all).clone();
                let (parent, key) = pointer.rsplit_once('/').unwrap_or(("", ""));
                match (replacement, review.pointer_mut(parent)) {
                    (Some(value), _) if pointer.is_empty() => review = value,
                    (Some(value), _) => *review.pointer_mut(&pointer).unwrap() = value,
                    (None, Some(Value::Object(map))) => {
                        map.remove(&key.replace("~1", "/").replace("~0", "~"));
                    }
                    (None, _) => {}
                }
            }
            let mut body = serde_json::to_vec(&review).unwrap();
            if let Some(cut) = cut {
                body.truncate(cut.index(body.len() + 1));
            }
            body
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_bytes_are_answered_or_refused_never_a_panic(body in prop::collection::vec(any::<u8>(), 0..512)) {
        invariants::any_body_is_answered_or_refused(&body, &invariants::view_of(&[]));
    }

    #[test]
    fn altered_real_reviews_are_answered_or_refused_never_a_panic(body in mutated_fixture()) {
        let busy = busy_worker();
        invariants::any_body_is_answered_or_refused(&body, &invariants::view_of(&[&busy]));
    }
}

/// The pod the eviction fixture names, marked busy an hour ago.
fn busy_worker() -> Value {
    let mut pod = fixture("pod-delete-by-user.json")["request"]["oldObject"].take();
    pod["metadata"]["name"] = json!("worker-6b8958b477-qvmc9");
    pod["metadata"]["labels"]["busyguard.io/busy"] = json!("true");
    pod["metadata"]["annotations"]["busyguard.io/busy-since"] = json!("2026-11-21T19:00:00Z");
    pod
}

fn ago(minutes: i64) -> String {
    (invariants::now() - SignedDuration::from_mins(minutes)).to_string()
}

/// Minutes ago, often right at a max-busy boundary (10m, 1h, 3h, 24h, the 36h ceiling, 48h).
fn minutes_ago() -> impl Strategy<Value = i64> {
    let boundaries = prop::sample::select(&[10i64, 60, 180, 1440, 2160, 2880][..]);
    prop_oneof![(boundaries, -2i64..=2).prop_map(|(limit, off)| limit + off), -60i64..6000,]
}

/// A pod in any state the busy contract knows, mostly marked busy, and a delete or eviction of
/// it by anyone.
fn disruption() -> impl Strategy<Value = (Value, Value, bool)> {
    let label =
        prop_oneof![4 => Just(Some("true")), 1 => prop::option::of(prop::sample::select(&["false", "", "TRUE"][..]))];
    let since =
        prop::option::weighted(0.9, prop_oneof![9 => minutes_ago().prop_map(ago), 1 => Just("yesterday".to_string())]);
    let max_busy =
        prop::option::of(prop::sample::select(&["10m", "1h", "3h", "48h", "72h", "0s", "-1h", "forever"][..]));
    let restarted = prop::option::weighted(0.2, minutes_ago().prop_map(ago));
    let phase = prop_oneof![6 => Just("Running"), 1 => Just("Pending"), 1 => Just("Succeeded"), 1 => Just("Failed")];
    let unready = prop::option::weighted(0.15, minutes_ago().prop_map(ago));
    let terminating = prop::bool::weighted(0.1);
    let user = prop::sample::select(
        &[
            "admin",
            EXEMPT_USER,
            KARPENTER_USER,
            "system:serviceaccount:kube-system:taint-eviction-controller",
            "system:serviceaccount:kube-system:namespace-controller",
            "system:serviceaccount:kube-system:generic-garbage-collector",
            "system:node:node-a",
            "system:serviceaccount:kube-system:replicaset-controller",
            "system:kube-scheduler",
        ][..],
    );
    let groups = prop::sample::subsequence(&["system:authenticated", "system:masters", EXEMPT_GROUP][..], 0..3);
    let how = (any::<bool>(), any::<bool>());
    (label, since, max_busy, restarted, phase, unready, terminating, user, groups, how).prop_map(
        |(label, since, max_busy, restarted, phase, unready, terminating, user, groups, (evict, dry_run))| {
            let mut pod = busy_worker();
            let metadata = &mut pod["metadata"];
            metadata["annotations"] = json!({});
            match label {
                Some(label) => metadata["labels"]["busyguard.io/busy"] = json!(label),
                None => drop(metadata["labels"].as_object_mut().unwrap().remove("busyguard.io/busy")),
            }
            let annotations = metadata["annotations"].as_object_mut().unwrap();
            if let Some(since) = since {
                annotations.insert("busyguard.io/busy-since".into(), json!(since));
            }
            if let Some(max_busy) = max_busy {
                annotations.insert("busyguard.io/max-busy".into(), json!(max_busy));
            }
            if let Some(unready) = &unready {
                metadata["labels"]["busyguard.io/busy"] = json!("when-unready");
                pod["status"]["conditions"] =
                    json!([{"type": "Ready", "status": "False", "lastTransitionTime": unready}]);
            }
            if terminating {
                pod["metadata"]["deletionTimestamp"] = json!(ago(0));
            }
            if let Some(restarted) = restarted {
                pod["status"]["containerStatuses"][0]["restartCount"] = json!(1);
                pod["status"]["containerStatuses"][0]["state"] = json!({"running": {"startedAt": restarted}});
            }
            pod["status"]["phase"] = json!(phase);
            let mut review =
                if evict { fixture("pod-eviction-by-user.json") } else { fixture("pod-delete-by-user.json") };
            let request = &mut review["request"];
            if !evict {
                request["oldObject"] = pod.clone();
                request["name"] = pod["metadata"]["name"].clone();
            }
            request["userInfo"] = json!({"username": user, "groups": groups});
            request["dryRun"] = json!(dry_run);
            (pod, review, evict)
        },
    )
}

/// A pod that is idle, with annotations of its own (perhaps its own deletion cost, Karpenter and
/// autoscaler settings, perhaps none at all), about to be updated.
fn idle_pod_update() -> impl Strategy<Value = Value> {
    let own = prop::collection::btree_map(
        prop::sample::select(
            &[
                "controller.kubernetes.io/pod-deletion-cost",
                "karpenter.sh/do-not-disrupt",
                "cluster-autoscaler.kubernetes.io/safe-to-evict",
                "example.com/team",
                "busyguard.io/max-busy",
            ][..],
        ),
        prop_oneof![
            Just("true".to_string()),
            Just("false".to_string()),
            (-5i32..5).prop_map(|n| n.to_string()),
            "\\PC{0,8}"
        ],
        0..5,
    );
    (prop::option::of(own), any::<bool>()).prop_map(|(own, labelled)| {
        let mut review = fixture("pod-update-label-busy-by-user.json");
        let pod = &mut review["request"]["object"];
        match own {
            Some(own) => {
                pod["metadata"]["annotations"] =
                    Value::Object(own.into_iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<Map<_, _>>())
            }
            None => drop(pod["metadata"].as_object_mut().unwrap().remove("annotations")),
        }
        let labels = pod["metadata"]["labels"].as_object_mut().unwrap();
        if labelled {
            labels.insert("busyguard.io/busy".into(), json!("false"));
        } else {
            labels.remove("busyguard.io/busy");
        }
        review
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn busy_pods_are_let_go_only_with_an_audited_exemption_that_applies((pod, review, evict) in disruption()) {
        let view = if evict { invariants::view_of(&[&pod]) } else { invariants::view_of(&[]) };
        invariants::busy_pods_go_only_with_an_audited_exemption(Disruption { pod: &pod, review: &review }, &view)
            .expect("a well-formed disruption is judged");
    }

    #[test]
    fn the_flip_to_busy_patches_cleanly_and_the_flip_back_restores_the_annotations(update in idle_pod_update()) {
        invariants::busy_and_back_restores_the_annotations(&update).expect("a well-formed update is judged");
    }
}
