//! Pod CREATE and UPDATE, decided whole (the mutating webhook): the annotations busyguard
//! writes on a pod's flip to busy, and takes back on its flip to idle.
//!
//! The plan depends only on the pod as it is about to be stored, so a reinvocation (the API
//! server calling us again after another webhook changed the pod) finds nothing left to do.

use std::collections::BTreeMap;

use jiff::Timestamp;
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation};
use serde_json::Value;

use super::PolicyConfig;
use super::busy::{BUSY_LABEL, BUSY_SINCE, BusyState, MAX_BUSY, MaxBusy, busy_state};
use super::cost::{DELETION_COST, busy_cost};
use super::messages;
use super::outcome::{Answer, Decision, Outcome};
use super::pod::{Pod, PodFacts};
use crate::duration::{parse_positive_duration, whole_second};

/// Where the user's own value of each guarded annotation waits while the pod is busy.
/// Absent while busy means the user had none.
pub const IDLE_COST: &str = "busyguard.io/idle-cost";
pub const IDLE_DO_NOT_DISRUPT: &str = "busyguard.io/idle-do-not-disrupt";
pub const IDLE_SAFE_TO_EVICT: &str = "busyguard.io/idle-safe-to-evict";
pub const KARPENTER_DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
pub const AUTOSCALER_SAFE_TO_EVICT: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MutationSettings {
    /// Write `karpenter.sh/do-not-disrupt: "true"` on busy pods.
    pub karpenter: bool,
    /// Write `cluster-autoscaler.kubernetes.io/safe-to-evict: "false"` on busy pods.
    pub cluster_autoscaler: bool,
}

/// Annotation changes by key: `Some(value)` sets, `None` removes.
pub type Changes = BTreeMap<&'static str, Option<String>>;

/// An annotation busyguard overrides while a pod is busy.
struct Guarded {
    key: &'static str,
    saved_as: &'static str,
    enabled: bool,
    busy_value: String,
}

fn guarded(settings: MutationSettings, since: Timestamp) -> [Guarded; 3] {
    [
        Guarded { key: DELETION_COST, saved_as: IDLE_COST, enabled: true, busy_value: busy_cost(since).to_string() },
        Guarded {
            key: KARPENTER_DO_NOT_DISRUPT,
            saved_as: IDLE_DO_NOT_DISRUPT,
            enabled: settings.karpenter,
            busy_value: "true".into(),
        },
        Guarded {
            key: AUTOSCALER_SAFE_TO_EVICT,
            saved_as: IDLE_SAFE_TO_EVICT,
            enabled: settings.cluster_autoscaler,
            busy_value: "false".into(),
        },
    ]
}

/// The answer to a pod's create or update: the annotation changes as a JSONPatch, and what the
/// writer should know about how the pod uses the contract.
pub fn decide(pod: &Pod, config: &PolicyConfig, now: Timestamp) -> Outcome {
    let warnings = contract_warnings(pod, config.max_busy);
    let patch = json_patch(pod, &plan_annotations(pod, config.mutation, config.max_busy, now));
    if patch.0.is_empty() {
        return Outcome::answer(Answer::Allow { warnings }, Decision::Allowed);
    }
    Outcome::answer(Answer::Patch { patch, warnings }, Decision::Patched)
}

/// What is wrong with how a pod uses the contract, said back to whoever wrote it.
pub fn contract_warnings(pod: &impl PodFacts, max_busy: MaxBusy) -> Vec<String> {
    let mut warnings = Vec::new();
    if let Some(value) = pod.label(BUSY_LABEL).filter(|v| !matches!(*v, "true" | "false")) {
        warnings.push(messages::label_not_boolean(value));
    }
    match (pod.annotation(MAX_BUSY).map(parse_positive_duration), max_busy.ceiling) {
        (Some(Err(e)), _) => warnings.push(messages::max_busy_ignored(&e)),
        (Some(Ok(own)), Some(ceiling)) if own > ceiling => {
            warnings.push(messages::max_busy_above_ceiling(own, ceiling));
        }
        _ => {}
    }
    warnings
}

pub fn plan_annotations(pod: &impl PodFacts, settings: MutationSettings, max_busy: MaxBusy, now: Timestamp) -> Changes {
    let mut changes = Changes::new();
    let Some(label) = pod.label(BUSY_LABEL) else {
        return changes;
    };
    if pod.is_terminal() || pod.is_terminating() {
        return changes;
    }
    let get = |key: &str| pod.annotation(key).map(str::to_string);
    let wants_busy = label == "true";
    let recorded_since = pod.annotation(BUSY_SINCE).map(|text| text.parse::<Timestamp>());

    match (wants_busy, recorded_since) {
        (true, None) => {
            let since = whole_second(now);
            changes.insert(BUSY_SINCE, Some(since.to_string()));
            for g in guarded(settings, since).into_iter().filter(|g| g.enabled) {
                changes.insert(g.saved_as, get(g.key));
                changes.insert(g.key, Some(g.busy_value));
            }
        }
        (true, Some(_)) if matches!(busy_state(pod, max_busy, now), BusyState::Lapsed { .. }) => {
            // Protection ran out while the flag stayed up: the user's values rank the pod again,
            // and stay saved (with busy-since) so the flip to idle restores the same values.
            for g in guarded(settings, now) {
                let saved = get(g.saved_as);
                if g.enabled || saved.is_some() {
                    changes.insert(g.key, saved);
                }
            }
        }
        (true, Some(recorded)) => {
            // Already busy. Someone may have changed a guarded annotation since: keep theirs as
            // the value to restore, and put ours back.
            let since = recorded.unwrap_or_else(|_| {
                let since = whole_second(now);
                changes.insert(BUSY_SINCE, Some(since.to_string()));
                since
            });
            for g in guarded(settings, since).into_iter().filter(|g| g.enabled) {
                if pod.annotation(g.key) != Some(g.busy_value.as_str()) {
                    changes.insert(g.saved_as, get(g.key));
                    changes.insert(g.key, Some(g.busy_value));
                }
            }
        }
        (false, Some(_)) => {
            changes.insert(BUSY_SINCE, None);
            for g in guarded(settings, now) {
                match get(g.saved_as) {
                    Some(saved) => {
                        changes.insert(g.key, Some(saved));
                        changes.insert(g.saved_as, None);
                    }
                    // Only what busyguard set may be taken away; a disabled one it never set.
                    None if g.enabled => {
                        changes.insert(g.key, None);
                    }
                    None => {}
                }
            }
        }
        (false, None) => {}
    }
    changes.retain(|key, value| pod.annotation(key) != value.as_deref());
    changes
}

/// The changes as a JSONPatch against the pod they were planned for.
pub fn json_patch(pod: &Pod, changes: &Changes) -> Patch {
    let path = |key: &str| PointerBuf::from_tokens(["metadata", "annotations", key]);
    let operations = match &pod.metadata.annotations {
        _ if changes.is_empty() => vec![],
        // No annotations map yet: create it whole (there is nothing to remove).
        None => {
            let map = changes
                .iter()
                .filter_map(|(key, value)| Some((key.to_string(), Value::String(value.clone()?))))
                .collect();
            vec![PatchOperation::Add(AddOperation {
                path: PointerBuf::from_tokens(["metadata", "annotations"]),
                value: Value::Object(map),
            })]
        }
        Some(_) => changes
            .iter()
            .map(|(key, value)| match value {
                Some(value) => {
                    PatchOperation::Add(AddOperation { path: path(key), value: Value::String(value.clone()) })
                }
                None => PatchOperation::Remove(RemoveOperation { path: path(key) }),
            })
            .collect(),
    };
    Patch(operations)
}

/// The changes as a JSON merge patch, for pods busyguard patches through the API.
pub fn merge_patch(changes: &Changes) -> Value {
    let annotations: serde_json::Map<String, Value> = changes
        .iter()
        .map(|(key, value)| (key.to_string(), value.clone().map_or(Value::Null, Value::String)))
        .collect();
    serde_json::json!({"metadata": {"annotations": annotations}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ALL: MutationSettings = MutationSettings { karpenter: true, cluster_autoscaler: true };
    const DAY: MaxBusy = MaxBusy::new(jiff::SignedDuration::from_hours(24));

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    /// Plans, applies the JSONPatch to the pod's JSON and returns the pod as stored.
    fn admit(doc: &mut Value, settings: MutationSettings, now: &str) -> Changes {
        let pod: Pod = serde_json::from_value(doc.clone()).unwrap();
        let changes = plan_annotations(&pod, settings, DAY, ts(now));
        json_patch::patch(doc, &json_patch(&pod, &changes)).expect("patch applies to its pod");
        changes
    }

    fn set_label(doc: &mut Value, value: &str) {
        doc["metadata"]["labels"][BUSY_LABEL] = json!(value);
    }

    fn worker(annotations: Value) -> Value {
        json!({"metadata": {"name": "w", "labels": {BUSY_LABEL: "false"}, "annotations": annotations},
               "status": {"phase": "Running"}})
    }

    #[test]
    fn flip_to_busy_raises_cost_and_keeps_the_users_cost() {
        let mut doc = worker(json!({DELETION_COST: "1", "team": "a"}));
        set_label(&mut doc, "true");
        admit(&mut doc, ALL, "2026-11-21T20:48:44.731Z");
        let since = ts("2026-11-21T20:48:44Z");
        assert_eq!(
            doc["metadata"]["annotations"],
            json!({
                "team": "a",
                BUSY_SINCE: "2026-11-21T20:48:44Z",
                DELETION_COST: busy_cost(since).to_string(),
                IDLE_COST: "1",
                KARPENTER_DO_NOT_DISRUPT: "true",
                AUTOSCALER_SAFE_TO_EVICT: "false",
            })
        );
    }

    #[test]
    fn flip_to_busy_creates_the_annotations_map_when_there_is_none() {
        let mut doc = json!({"metadata": {"labels": {BUSY_LABEL: "true"}}});
        let pod: Pod = serde_json::from_value(doc.clone()).unwrap();
        let changes = plan_annotations(&pod, ALL, DAY, ts("2026-01-01T00:00:00Z"));
        let patch = json_patch(&pod, &changes);
        assert_eq!(patch.0.len(), 1, "one add of the whole map: {patch:?}");
        json_patch::patch(&mut doc, &patch).unwrap();
        assert_eq!(doc["metadata"]["annotations"][KARPENTER_DO_NOT_DISRUPT], "true");
        assert!(doc["metadata"]["annotations"].get(IDLE_COST).is_none(), "no user cost to keep");
    }

    #[test]
    fn reinvocation_on_the_patched_pod_changes_nothing() {
        let mut doc = worker(json!({DELETION_COST: "1"}));
        set_label(&mut doc, "true");
        admit(&mut doc, ALL, "2026-11-21T20:48:44Z");
        assert!(admit(&mut doc, ALL, "2026-11-21T20:50:00Z").is_empty());
    }

    #[test]
    fn idle_pod_without_busy_annotations_gets_no_patch() {
        let mut doc = worker(json!({DELETION_COST: "1"}));
        assert!(admit(&mut doc, ALL, "2026-11-21T20:48:44Z").is_empty());
    }

    #[test]
    fn busy_then_idle_restores_exactly_what_the_user_had() {
        for original in [
            json!({DELETION_COST: "-5", KARPENTER_DO_NOT_DISRUPT: "true", AUTOSCALER_SAFE_TO_EVICT: "true"}),
            json!({DELETION_COST: "2147483647"}),
            json!({}),
            json!({"unrelated": "x", AUTOSCALER_SAFE_TO_EVICT: "false"}),
        ] {
            let mut doc = worker(original.clone());
            set_label(&mut doc, "true");
            admit(&mut doc, ALL, "2026-11-21T20:48:44Z");
            assert_ne!(doc["metadata"]["annotations"], original);
            set_label(&mut doc, "false");
            admit(&mut doc, ALL, "2026-11-21T21:00:00Z");
            assert_eq!(doc["metadata"]["annotations"], original);
        }
    }

    #[test]
    fn restore_when_the_pod_had_no_annotations_map_leaves_an_empty_one() {
        let mut doc = json!({"metadata": {"labels": {BUSY_LABEL: "true"}}});
        admit(&mut doc, ALL, "2026-11-21T20:48:44Z");
        set_label(&mut doc, "false");
        admit(&mut doc, ALL, "2026-11-21T21:00:00Z");
        assert_eq!(doc["metadata"]["annotations"], json!({}));
    }

    #[test]
    fn cost_changed_while_busy_becomes_the_cost_to_restore() {
        let mut doc = worker(json!({DELETION_COST: "1"}));
        set_label(&mut doc, "true");
        admit(&mut doc, ALL, "2026-11-21T20:48:44Z");
        let busy = doc["metadata"]["annotations"][DELETION_COST].clone();
        doc["metadata"]["annotations"][DELETION_COST] = json!("7");
        admit(&mut doc, ALL, "2026-11-21T20:49:00Z");
        assert_eq!(doc["metadata"]["annotations"][DELETION_COST], busy, "busy cost raised again");
        assert_eq!(doc["metadata"]["annotations"][IDLE_COST], "7");
        set_label(&mut doc, "false");
        admit(&mut doc, ALL, "2026-11-21T21:00:00Z");
        assert_eq!(doc["metadata"]["annotations"], json!({DELETION_COST: "7"}));
    }

    #[test]
    fn lapsed_protection_gives_the_users_values_back_and_idle_restores_the_same() {
        let original = json!({DELETION_COST: "3"});
        let mut doc = worker(original.clone());
        set_label(&mut doc, "true");
        admit(&mut doc, ALL, "2026-11-21T00:00:00Z");
        admit(&mut doc, ALL, "2026-11-22T00:00:01Z");
        assert_eq!(
            doc["metadata"]["annotations"],
            json!({BUSY_SINCE: "2026-11-21T00:00:00Z", DELETION_COST: "3", IDLE_COST: "3"}),
            "past max-busy the pod ranks with its own cost; busy-since stays so protection does not restart"
        );
        assert!(admit(&mut doc, ALL, "2026-11-22T00:05:00Z").is_empty(), "lapsed is stable");
        set_label(&mut doc, "false");
        admit(&mut doc, ALL, "2026-11-22T00:10:00Z");
        assert_eq!(doc["metadata"]["annotations"], original);
    }

    #[test]
    fn merge_patch_sets_and_removes_annotations() {
        let changes = Changes::from([(DELETION_COST, Some("5".to_string())), (IDLE_COST, None)]);
        assert_eq!(merge_patch(&changes), json!({"metadata": {"annotations": {DELETION_COST: "5", IDLE_COST: null}}}));
    }

    #[test]
    fn disabled_autoscaler_annotations_are_left_alone() {
        let off = MutationSettings { karpenter: false, cluster_autoscaler: false };
        let original = json!({KARPENTER_DO_NOT_DISRUPT: "false"});
        let mut doc = worker(original.clone());
        set_label(&mut doc, "true");
        admit(&mut doc, off, "2026-11-21T20:48:44Z");
        let annotations = &doc["metadata"]["annotations"];
        assert_eq!(annotations[KARPENTER_DO_NOT_DISRUPT], "false");
        assert!(annotations.get(AUTOSCALER_SAFE_TO_EVICT).is_none());
        assert!(annotations.get(DELETION_COST).is_some());
        set_label(&mut doc, "false");
        admit(&mut doc, off, "2026-11-21T21:00:00Z");
        assert_eq!(doc["metadata"]["annotations"], original);
    }

    #[test]
    fn terminal_and_terminating_pods_are_not_patched() {
        let mut done = worker(json!({}));
        set_label(&mut done, "true");
        done["status"]["phase"] = json!("Failed");
        assert!(admit(&mut done, ALL, "2026-11-21T20:48:44Z").is_empty());

        let mut going = worker(json!({}));
        set_label(&mut going, "true");
        going["metadata"]["deletionTimestamp"] = json!("2026-11-21T20:48:00Z");
        assert!(admit(&mut going, ALL, "2026-11-21T20:48:44Z").is_empty());
    }

    #[test]
    fn pods_without_the_label_are_not_patched() {
        let mut doc = json!({"metadata": {"labels": {"app": "worker"}}});
        assert!(admit(&mut doc, ALL, "2026-11-21T20:48:44Z").is_empty());
    }

    #[test]
    fn unreadable_busy_since_is_stamped_again() {
        let mut doc = worker(json!({BUSY_SINCE: "yesterday"}));
        set_label(&mut doc, "true");
        admit(&mut doc, ALL, "2026-11-21T20:48:44Z");
        let annotations = &doc["metadata"]["annotations"];
        assert_eq!(annotations[BUSY_SINCE], "2026-11-21T20:48:44Z");
        assert_eq!(annotations[DELETION_COST], busy_cost(ts("2026-11-21T20:48:44Z")).to_string());
    }

    fn pod(value: Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    fn config() -> PolicyConfig {
        PolicyConfig {
            mode: crate::policy::Mode::Enforce,
            max_busy: DAY,
            exemptions: Default::default(),
            mutation: ALL,
        }
    }

    #[test]
    fn a_write_with_nothing_to_change_is_allowed_with_its_warnings() {
        let p = pod(json!({"metadata": {"labels": {BUSY_LABEL: "maybe"}}}));
        let outcome = decide(&p, &config(), ts("2026-11-21T20:48:44Z"));
        assert_eq!(outcome.decision, Decision::Allowed);
        let Answer::Allow { warnings } = outcome.answer else { panic!() };
        assert_eq!(warnings.len(), 1);
        assert!(outcome.audit.is_none() && outcome.effects.is_empty(), "pod writes are neither audited nor acted on");
    }

    #[test]
    fn a_flip_to_busy_is_answered_with_its_patch() {
        let p = pod(worker(json!({})));
        let mut busy = worker(json!({}));
        set_label(&mut busy, "true");
        assert_eq!(decide(&p, &config(), ts("2026-11-21T20:48:44Z")).decision, Decision::Allowed, "idle: nothing");
        let outcome = decide(&pod(busy), &config(), ts("2026-11-21T20:48:44Z"));
        assert_eq!(outcome.decision, Decision::Patched);
        let Answer::Patch { patch, .. } = outcome.answer else { panic!() };
        assert_eq!(patch.0.len(), 4, "busy-since, cost, and the two autoscaler annotations: {patch:?}");
    }

    #[test]
    fn a_busy_label_neither_true_nor_false_is_warned_about() {
        let p = pod(json!({"metadata": {"labels": {BUSY_LABEL: "yes"}}}));
        assert_eq!(
            contract_warnings(&p, DAY),
            ["busyguard: label busyguard.io/busy=\"yes\" is neither \"true\" nor \"false\"; the pod counts as idle"]
        );
    }

    #[test]
    fn a_max_busy_above_the_ceiling_or_unreadable_is_warned_about() {
        let ceiling = MaxBusy { ceiling: Some(jiff::SignedDuration::from_hours(2)), ..DAY };
        let with =
            |value: &str| pod(json!({"metadata": {"labels": {BUSY_LABEL: "true"}, "annotations": {MAX_BUSY: value}}}));
        assert_eq!(
            contract_warnings(&with("72h"), ceiling),
            [
                "busyguard: annotation busyguard.io/max-busy=72h is above the cluster's ceiling; protection ends after 2h"
            ]
        );
        assert_eq!(contract_warnings(&with("90m"), ceiling), Vec::<String>::new(), "below the ceiling: fine");
        for bad in ["forever", "-5m", "0s"] {
            let warnings = contract_warnings(&with(bad), DAY);
            assert_eq!(warnings.len(), 1, "{bad}");
            assert!(warnings[0].starts_with("busyguard: annotation busyguard.io/max-busy ignored"), "{warnings:?}");
        }
    }

    #[test]
    fn annotation_keys_with_slashes_are_escaped_in_patch_paths() {
        let pod: Pod = serde_json::from_value(worker(json!({}))).unwrap();
        let changes = Changes::from([(DELETION_COST, Some("1".to_string()))]);
        let patch = serde_json::to_value(json_patch(&pod, &changes)).unwrap();
        assert_eq!(
            patch,
            json!([{"op": "add", "path": "/metadata/annotations/controller.kubernetes.io~1pod-deletion-cost", "value": "1"}])
        );
    }
}
