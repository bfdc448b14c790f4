//! Pod CREATE and UPDATE, decided whole (the mutating webhook): the annotations busyguard
//! writes on a pod's flip to busy, and takes back on its flip to idle.
//!
//! The plan depends only on the pod as it is about to be stored, so a reinvocation (the API
//! server calling us again after another webhook changed the pod) finds nothing left to do.

use jiff::{SignedDuration, Timestamp};

use super::PolicyConfig;
use super::busy::MaxBusy;
use super::cost::KARPENTER_NOTHING_COST;
use super::keys::{BUSY_LABEL, DELETE_REQUESTED, DELETION_COST, IDLE_COST, MAX_BUSY, PROTECTED_LABEL, WHEN_UNREADY};
use super::marks::{GUARDED, flip_keys, json_patch, plan, written_on_a_flip};
use super::outcome::{Answer, Ask, Decision, Denial, Outcome, Reason};
use super::pod::{Pod, PodFacts};
use crate::duration::parse_positive_duration;

/// The answer to a pod's create or update (`before`: the version it replaces): the annotation
/// changes as a JSONPatch, and what the writer should know about how the pod uses the contract.
/// A flip to busy on a pod already being deleted is refused: the task would be killed with it.
pub fn mutate_pod(ask: &Ask<'_>, pod: &Pod, before: Option<&Pod>, config: &PolicyConfig, now: Timestamp) -> Outcome {
    let turning_busy =
        pod.label(BUSY_LABEL) == Some("true") && before.is_none_or(|old| old.label(BUSY_LABEL) != Some("true"));
    if let (true, Some(deleting)) = (turning_busy, pod.metadata.deletion_timestamp) {
        let message = busy_while_terminating(ask.namespace, ask.name, deleting);
        let audit = ask.audit(Decision::Denied, Reason::Terminating, message.clone(), config.mode, now);
        return Outcome::answer(Answer::Deny { denial: Denial::PodTerminating, message }, Decision::Denied)
            .audited(audit);
    }
    let warnings = contract_warnings(pod, config.max_busy);
    let before = before.map(|old| old as &dyn PodFacts);
    let patch = json_patch(pod, &plan(pod, before, config.mutation, config.max_busy, now));
    if patch.0.is_empty() {
        return Outcome::answer(Answer::Allow { warnings }, Decision::Allowed);
    }
    Outcome::answer(Answer::Patch { patch, warnings }, Decision::Patched)
}

/// The validating webhook's rule for writes of opted-in pods (`own`: busyguard's own user,
/// once known). busyguard's own writes always pass. Only busyguard writes the
/// `busyguard.io/delete-requested` mark, since busyguard later deletes the pod on its word (the
/// field manager a client names proves nothing). A pod's own service account (a token bound to
/// a pod) may change opted-in pods only so far as to flip its own pod's busy label: not another
/// pod, not a pod of another namespace, and no other label or annotation of its own
/// (busyguard's annotations aside: the mutating webhook wrote them in this very write). With it,
/// the worker's Role can grant `patch` on pods and still not let one worker hold or release its
/// neighbours.
pub fn judge_write(
    ask: &Ask<'_>,
    pod: &Pod,
    before: Option<&Pod>,
    own: Option<&str>,
    config: &PolicyConfig,
    now: Timestamp,
) -> Outcome {
    if own == Some(ask.requester.username) {
        return Outcome::allow(Decision::Unhandled);
    }
    let refusal = if marks_anew(pod, before) {
        Some((Denial::NotBusyguardsMark, Reason::ForgedMark, not_busyguards_mark(ask.namespace, ask.name)))
    } else if let Some(own_pod) = ask.requester.pod {
        own_flag_only(ask, own_pod, pod, before, config, now)
            .map(|message| (Denial::NotOwnFlag, Reason::NotOwnFlag, message))
    } else {
        None
    };
    let Some((denial, reason, message)) = refusal else { return Outcome::allow(Decision::Allowed) };
    let audit = ask.audit(Decision::Denied, reason, message.clone(), config.mode, now);
    Outcome::answer(Answer::Deny { denial, message }, Decision::Denied).audited(audit)
}

/// Whether the write gives the pod a whole delete-requested mark (its label and its annotation,
/// see [`PodFacts::delete_request`]) that it did not carry as an opted-in pod before (a create,
/// a new or changed mark, or a pod opting in with one). Half a mark is never carried out.
pub fn marks_anew(pod: &Pod, before: Option<&Pod>) -> bool {
    let Some(new) = whole_mark(pod) else { return false };
    before.is_none_or(|old| old.label(BUSY_LABEL).is_none() || whole_mark(old) != Some(new))
}

/// The annotation of a delete-requested mark whose label is there too.
fn whole_mark(pod: &Pod) -> Option<&str> {
    pod.label(DELETE_REQUESTED).and(pod.annotation(DELETE_REQUESTED))
}

/// The own-flag rule's refusal, if any, of a write by the token bound to pod `own_pod`.
fn own_flag_only(
    ask: &Ask<'_>,
    own_pod: &str,
    pod: &Pod,
    before: Option<&Pod>,
    config: &PolicyConfig,
    now: Timestamp,
) -> Option<String> {
    let before = before?;
    let others = |labels: &super::pod::Labels| {
        (labels.iter())
            .filter(|(k, _)| k.as_str() != BUSY_LABEL && k.as_str() != PROTECTED_LABEL)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<Vec<_>>()
    };
    let theirs = |pod: &Pod| -> Vec<(String, String)> {
        let annotations = pod.metadata.annotations.iter().flatten();
        annotations.filter(|(k, _)| !written_on_a_flip(k)).map(|(k, v)| (k.clone(), v.clone())).collect()
    };
    // A bound token's pod lives in its service account's namespace.
    let own_namespace = service_account_namespace(ask.requester.username);
    if own_pod != ask.name || own_namespace != Some(ask.namespace) {
        let own = format!("{}/{own_pod}", own_namespace.unwrap_or("?"));
        Some(not_own_pod(ask.namespace, ask.name, &own))
    } else if others(&pod.metadata.labels) != others(&before.metadata.labels)
        || theirs(pod) != theirs(before)
        || !busyguards_own_as_it_leaves_them(pod, before, config, now)
    {
        Some(more_than_the_flag(ask.namespace, ask.name))
    } else {
        None
    }
}

/// Whether the annotations busyguard writes on a flip are as busyguard leaves them: without a
/// flip, as they were or as busyguard's own refresh of them in this write makes them (a worker
/// may not pin its idle pod with do-not-disrupt or a cost of its own); on a flip, with no value
/// but the user's own from before it, saved or restored, so that no worker slips one in to be
/// kept as the user's. The busy values themselves are the mutating webhook's, which wrote them
/// in this very write.
fn busyguards_own_as_it_leaves_them(pod: &Pod, before: &Pod, config: &PolicyConfig, now: Timestamp) -> bool {
    let turning_idle = match (before.label(BUSY_LABEL) == Some("true"), pod.label(BUSY_LABEL) == Some("true")) {
        (false, false) | (true, true) => {
            let refresh = plan(before, Some(before), config.mutation, config.max_busy, now).annotations;
            return flip_keys().all(|key| {
                let refreshed = refresh.get(key).map_or(before.annotation(key), Option::as_deref);
                pod.annotation(key) == before.annotation(key) || pod.annotation(key) == refreshed
            });
        }
        (was_busy, _) => was_busy,
    };
    GUARDED.iter().all(|(key, saved_as)| {
        let users_own = [before.annotation(saved_as), before.annotation(key), None];
        users_own.contains(&pod.annotation(saved_as)) && (!turning_idle || users_own.contains(&pod.annotation(key)))
    })
}

/// `NS` of `system:serviceaccount:NS:NAME`.
fn service_account_namespace(username: &str) -> Option<&str> {
    username.strip_prefix("system:serviceaccount:")?.split(':').next()
}

/// What is wrong with how a pod uses the contract, said back to whoever wrote it.
pub fn contract_warnings(pod: &impl PodFacts, max_busy: MaxBusy) -> Vec<String> {
    let mut warnings = Vec::new();
    if let Some(value) = pod.label(BUSY_LABEL).filter(|v| !matches!(*v, "true" | "false" | WHEN_UNREADY)) {
        warnings.push(label_unknown(value));
    }
    // The user's own cost: on the pod while idle, kept aside while busy.
    let mut own_costs =
        [DELETION_COST, IDLE_COST].into_iter().filter_map(|key| pod.annotation(key)?.parse::<i64>().ok());
    if let Some(cost) = own_costs.find(|cost| *cost <= -KARPENTER_NOTHING_COST) {
        warnings.push(cost_counts_as_nothing(cost));
    }
    match (pod.annotation(MAX_BUSY).map(parse_positive_duration), max_busy.ceiling) {
        (Some(Err(e)), _) => warnings.push(max_busy_ignored(&e)),
        (Some(Ok(own)), Some(ceiling)) if own > ceiling => {
            warnings.push(max_busy_above_ceiling(own, ceiling));
        }
        _ => {}
    }
    warnings
}

/// A flip to busy refused on a pod being deleted: the app must not start the task.
pub fn busy_while_terminating(namespace: &str, name: &str, deleting: Timestamp) -> String {
    format!(
        "pod {namespace}/{name} is being deleted (since {deleting}) and cannot turn busy: do not start the task; \
         it would be killed with the pod"
    )
}

/// A pod's service account writing another pod.
pub fn not_own_pod(namespace: &str, name: &str, own: &str) -> String {
    format!(
        "pod {namespace}/{name} is not the requester's own pod ({own}): a pod's service account may flip only its \
         own busy label"
    )
}

/// A delete-requested mark written by someone other than busyguard.
pub fn not_busyguards_mark(namespace: &str, name: &str) -> String {
    format!(
        "pod {namespace}/{name}: only busyguard writes {DELETE_REQUESTED} (it deletes the pod on its word); to have \
         a busy pod deleted once idle, delete it and busyguard marks it"
    )
}

/// A pod's service account changing more of its own pod than the flag.
pub fn more_than_the_flag(namespace: &str, name: &str) -> String {
    format!("pod {namespace}/{name}: its own service account may change only its {BUSY_LABEL} label")
}

pub fn max_busy_ignored(error: &str) -> String {
    format!("busyguard: annotation {MAX_BUSY} ignored, the default applies: {error}")
}

pub fn max_busy_above_ceiling(own: SignedDuration, ceiling: SignedDuration) -> String {
    format!(
        "busyguard: annotation {MAX_BUSY}={own:#} is above the cluster's ceiling; protection ends after {ceiling:#}"
    )
}

pub fn label_unknown(value: &str) -> String {
    format!(
        "busyguard: label {BUSY_LABEL}={value:?} is neither \"true\", \"false\" nor \"{WHEN_UNREADY}\"; the pod \
         counts as idle"
    )
}

pub fn cost_counts_as_nothing(cost: i64) -> String {
    format!(
        "busyguard: {DELETION_COST}={cost} is at or below -{KARPENTER_NOTHING_COST}: Karpenter (1.14 and later) \
         counts such a pod as nothing, so its node as empty, and deletes the node without waiting for it; keep \
         idle costs above that"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::cost::busy_cost;
    use crate::policy::keys::*;
    use crate::policy::marks::*;
    use crate::policy::testing::*;
    use serde_json::{Value, json};

    const ALL: MutationSettings = MutationSettings {
        karpenter: true,
        karpenter_bounded: true,
        cluster_autoscaler: true,
        cluster_autoscaler_on_completion: false,
    };
    const DAY: MaxBusy = MaxBusy::new(jiff::SignedDuration::from_hours(24));

    /// Plans, applies the JSONPatch to the pod's JSON (the pod as stored) and returns the plan.
    fn admit(doc: &mut Value, settings: MutationSettings, now: &str) -> Plan {
        let pod: Pod = serde_json::from_value(doc.clone()).unwrap();
        let plan = plan(&pod, None, settings, DAY, ts(now));
        json_patch::patch(doc, &json_patch(&pod, &plan)).expect("patch applies to its pod");
        plan
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
        let annotations = plan(&pod, None, ALL, DAY, ts("2026-01-01T00:00:00Z")).annotations;
        let patch = json_patch(&pod, &Plan { annotations, protected: None });
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
            let idle = worker(original.clone());
            let mut flip = idle.clone();
            set_label(&mut flip, "true");
            let (_, busy) = update(&idle, &flip, "2026-11-21T20:48:44Z");
            assert_ne!(busy["metadata"]["annotations"], original);
            let mut done = busy.clone();
            set_label(&mut done, "false");
            let (_, stored) = update(&busy, &done, "2026-11-21T21:00:00Z");
            assert_eq!(stored["metadata"]["annotations"], original);
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
    fn disabled_autoscaler_annotations_are_left_alone() {
        let off = MutationSettings {
            karpenter: false,
            karpenter_bounded: true,
            cluster_autoscaler: false,
            cluster_autoscaler_on_completion: false,
        };
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
    fn safe_to_evict_on_completion_is_written_for_cluster_autoscaler_1_36_and_the_users_value_restored() {
        let on_completion = MutationSettings { cluster_autoscaler_on_completion: true, ..ALL };
        let mut doc = worker(json!({AUTOSCALER_SAFE_TO_EVICT: "true"}));
        set_label(&mut doc, "true");
        admit(&mut doc, on_completion, "2026-11-21T20:48:44Z");
        assert_eq!(doc["metadata"]["annotations"][AUTOSCALER_SAFE_TO_EVICT], "on-completion");
        assert_eq!(doc["metadata"]["annotations"][IDLE_SAFE_TO_EVICT], "true");
        set_label(&mut doc, "false");
        admit(&mut doc, on_completion, "2026-11-21T21:00:00Z");
        assert_eq!(doc["metadata"]["annotations"], json!({AUTOSCALER_SAFE_TO_EVICT: "true"}));
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

    fn ask() -> Ask<'static> {
        Ask { namespace: "ns", ..crate::policy::testing::ask("UPDATE", "system:serviceaccount:ns:worker") }
    }

    /// The update of `old` to `new` as the mutating webhook answers it; `new` as stored after.
    fn update(old: &Value, new: &Value, now: &str) -> (Outcome, Value) {
        let outcome = mutate_pod(&ask(), &pod(new.clone()), Some(&pod(old.clone())), &config(), ts(now));
        let mut stored = new.clone();
        if let Answer::Patch { patch, .. } = &outcome.answer {
            json_patch::patch(&mut stored, patch).expect("the patch applies to its pod");
        }
        (outcome, stored)
    }

    fn from_pod(pod: &'static str) -> Ask<'static> {
        let mut ask = ask();
        ask.requester.pod = Some(pod);
        ask
    }

    #[test]
    fn a_worker_cannot_pin_its_own_pod_with_busyguards_annotations_only_flip_it() {
        let now = "2026-11-21T20:00:00Z";
        let judged = |old: &Value, new: &Value| {
            judge_write(&from_pod("w"), &pod(new.clone()), Some(&pod(old.clone())), BUSYGUARD, &config(), ts(now))
        };
        let idle = worker(json!({DELETION_COST: "-5"}));
        for (key, value) in [(KARPENTER_DO_NOT_DISRUPT, "true"), (DELETION_COST, "2147483647"), (IDLE_COST, "9")] {
            let mut pinned = idle.clone();
            pinned["metadata"]["annotations"][key] = json!(value);
            assert!(!judged(&idle, &pinned).is_allowed(), "{key} on its idle pod");
        }
        // As the validating webhook sees the flips: after the mutating webhook's patch.
        let mut flip = idle.clone();
        set_label(&mut flip, "true");
        let (_, busy) = update(&idle, &flip, now);
        assert!(judged(&idle, &busy).is_allowed(), "the flip to busy");
        let mut back = busy.clone();
        set_label(&mut back, "false");
        let (_, idle_again) = update(&busy, &back, now);
        assert!(judged(&busy, &idle_again).is_allowed(), "the flip back to idle");
        assert_eq!(idle_again["metadata"]["annotations"][DELETION_COST], "-5");
        let mut smuggled = flip.clone();
        smuggled["metadata"]["annotations"][DELETION_COST] = json!("2147483647");
        let (_, kept_as_its_own) = update(&idle, &smuggled, now);
        assert_eq!(kept_as_its_own["metadata"]["annotations"][IDLE_COST], "2147483647");
        assert!(!judged(&idle, &kept_as_its_own).is_allowed(), "a cost slipped in with the flip, to be kept");
        // Saying busy again on a busy pod whose protection ran out: busyguard's refresh passes.
        let (lapsed_at, resent) = ("2026-11-23T20:00:00Z", busy.clone());
        let (_, refreshed) = update(&busy, &resent, lapsed_at);
        assert_ne!(refreshed["metadata"]["annotations"], busy["metadata"]["annotations"], "refreshed");
        let outcome =
            judge_write(&from_pod("w"), &pod(refreshed), Some(&pod(busy)), BUSYGUARD, &config(), ts(lapsed_at));
        assert!(outcome.is_allowed(), "{:?}", outcome.answer);
    }

    #[test]
    fn a_pods_own_service_account_may_flip_its_own_busy_label_and_nothing_else() {
        let idle = worker(json!({"team": "a"}));
        let mut flip = idle.clone();
        set_label(&mut flip, "true");
        // As the validating webhook sees it: busyguard's annotations are already on.
        flip["metadata"]["annotations"][BUSY_SINCE] = json!("2026-11-21T20:00:00Z");
        let own = judge_write(
            &from_pod("w"),
            &pod(flip.clone()),
            Some(&pod(idle.clone())),
            BUSYGUARD,
            &config(),
            ts("2026-11-21T20:00:00Z"),
        );
        assert!(own.is_allowed());

        let neighbour = judge_write(
            &from_pod("w-2"),
            &pod(flip.clone()),
            Some(&pod(idle.clone())),
            BUSYGUARD,
            &config(),
            ts("2026-11-21T20:00:00Z"),
        );
        let Answer::Deny { denial, message } = &neighbour.answer else { panic!("{:?}", neighbour.answer) };
        assert_eq!((denial.code(), denial.cause()), (403, "BusyguardNotOwnFlag"));
        assert_eq!(
            message,
            "pod ns/w is not the requester's own pod (ns/w-2): a pod's service account may flip only its own busy label"
        );

        let mut more = flip.clone();
        more["metadata"]["labels"]["app"] = json!("other");
        let relabel = judge_write(
            &from_pod("w"),
            &pod(more),
            Some(&pod(idle.clone())),
            BUSYGUARD,
            &config(),
            ts("2026-11-21T20:00:00Z"),
        );
        assert!(!relabel.is_allowed());
        let mut annotated = flip.clone();
        annotated["metadata"]["annotations"]["team"] = json!("b");
        let reannotate = judge_write(
            &from_pod("w"),
            &pod(annotated),
            Some(&pod(idle)),
            BUSYGUARD,
            &config(),
            ts("2026-11-21T20:00:00Z"),
        );
        assert!(!reannotate.is_allowed());
        assert_eq!(reannotate.audit.unwrap().reason, Reason::NotOwnFlag);
    }

    const BUSYGUARD: Option<&str> = Some("system:serviceaccount:busyguard:busyguard");

    #[test]
    fn a_token_bound_to_a_pod_of_another_namespace_is_not_that_pods_own() {
        let idle = worker(json!({}));
        let mut flip = idle.clone();
        set_label(&mut flip, "true");
        let mut elsewhere = from_pod("w");
        elsewhere.requester.username = "system:serviceaccount:other:worker";
        let outcome =
            judge_write(&elsewhere, &pod(flip), Some(&pod(idle)), BUSYGUARD, &config(), ts("2026-11-21T20:00:00Z"));
        let Answer::Deny { message, .. } = &outcome.answer else { panic!("{:?}", outcome.answer) };
        assert!(message.contains("is not the requester's own pod (other/w)"), "{message}");
    }

    #[test]
    fn busyguards_own_writes_pass_whatever_pod_its_token_is_bound_to() {
        let idle = worker(json!({}));
        let mut marked = idle.clone();
        marked["metadata"]["annotations"][DELETE_REQUESTED] = json!(r#"{"by":"alice"}"#);
        marked["metadata"]["labels"][DELETE_REQUESTED] = json!("true");
        let mut busyguard = from_pod("busyguard-7d9-abc");
        busyguard.requester.username = BUSYGUARD.unwrap();
        let outcome =
            judge_write(&busyguard, &pod(marked), Some(&pod(idle)), BUSYGUARD, &config(), ts("2026-11-21T20:00:00Z"));
        assert!(outcome.is_allowed());
        assert!(outcome.audit.is_none());
    }

    #[test]
    fn only_busyguard_writes_the_delete_requested_mark() {
        let idle = worker(json!({}));
        let mut marked = idle.clone();
        marked["metadata"]["annotations"][DELETE_REQUESTED] = json!(r#"{"by":"alice"}"#);
        marked["metadata"]["labels"][DELETE_REQUESTED] = json!("true");
        let now = ts("2026-11-21T20:00:00Z");
        for (what, before, known) in [
            ("a new mark", Some(pod(idle.clone())), BUSYGUARD),
            ("a pod created with one", None, BUSYGUARD),
            ("while busyguard does not know its own name yet", Some(pod(idle.clone())), None),
        ] {
            let outcome = judge_write(&ask(), &pod(marked.clone()), before.as_ref(), known, &config(), now);
            let Answer::Deny { denial, .. } = &outcome.answer else { panic!("{what}: {:?}", outcome.answer) };
            assert_eq!((denial.code(), denial.cause()), (403, "BusyguardNotBusyguardsMark"), "{what}");
            assert_eq!(outcome.audit.unwrap().reason, Reason::ForgedMark, "{what}");
        }
        let mut relabelled = marked.clone();
        relabelled["metadata"]["labels"]["team"] = json!("b");
        let kept = judge_write(&ask(), &pod(relabelled), Some(&pod(marked.clone())), BUSYGUARD, &config(), now);
        assert!(kept.is_allowed(), "a write that leaves busyguard's mark as it was");
        let mut unlabelled = marked.clone();
        unlabelled["metadata"]["labels"].as_object_mut().unwrap().remove(BUSY_LABEL);
        let opting_in = judge_write(&ask(), &pod(marked.clone()), Some(&pod(unlabelled)), BUSYGUARD, &config(), now);
        assert!(!opting_in.is_allowed(), "a pod opting in with a mark already on");
        // Half a mark is never carried out (`PodFacts::delete_request`), so it is anyone's to write.
        let mut half = idle.clone();
        half["metadata"]["annotations"][DELETE_REQUESTED] = marked["metadata"]["annotations"][DELETE_REQUESTED].clone();
        assert!(pod(half.clone()).delete_request().is_none());
        assert!(judge_write(&ask(), &pod(half), Some(&pod(idle)), BUSYGUARD, &config(), now).is_allowed());
    }

    #[test]
    fn requesters_that_are_not_a_pods_service_account_are_not_this_rules_business() {
        let idle = worker(json!({}));
        let outcome =
            judge_write(&ask(), &pod(idle.clone()), Some(&pod(idle)), BUSYGUARD, &config(), ts("2026-11-21T20:00:00Z"));
        assert_eq!(outcome.decision, Decision::Allowed);
        assert!(outcome.audit.is_none());
    }

    #[test]
    fn a_flip_to_busy_on_a_pod_being_deleted_is_refused_409_but_other_updates_go_through() {
        let mut old = worker(json!({}));
        old["metadata"]["deletionTimestamp"] = json!("2026-11-21T20:48:00Z");
        let mut flip = old.clone();
        set_label(&mut flip, "true");
        let (outcome, _) = update(&old, &flip, "2026-11-21T20:48:44Z");
        let Answer::Deny { denial, message } = &outcome.answer else { panic!("{:?}", outcome.answer) };
        assert_eq!((denial.code(), denial.reason(), denial.cause()), (409, "Conflict", "BusyguardPodTerminating"));
        assert_eq!(
            message,
            "pod ns/w is being deleted (since 2026-11-21T20:48:00Z) and cannot turn busy: do not start the task; \
             it would be killed with the pod"
        );
        assert_eq!(outcome.audit.unwrap().reason, Reason::Terminating);
        // A controller removing a finalizer from a terminating pod that was already busy.
        let mut busy_going = flip.clone();
        busy_going["metadata"]["finalizers"] = json!(["example.com/x"]);
        let (outcome, _) = update(&busy_going, &flip, "2026-11-21T20:48:44Z");
        assert_eq!(outcome.decision, Decision::Allowed);
    }

    #[test]
    fn busy_since_cannot_be_moved_or_removed_while_busy() {
        let idle = worker(json!({DELETION_COST: "1"}));
        let mut flip = idle.clone();
        set_label(&mut flip, "true");
        let (_, busy) = update(&idle, &flip, "2026-11-21T20:00:00Z");
        for tampered in [json!(null), json!("2026-11-21T23:00:00Z"), json!("2099-01-01T00:00:00Z")] {
            let mut write = busy.clone();
            write["metadata"]["annotations"][BUSY_SINCE] = tampered.clone();
            if tampered.is_null() {
                write["metadata"]["annotations"].as_object_mut().unwrap().remove(BUSY_SINCE);
            }
            let (_, stored) = update(&busy, &write, "2026-11-21T22:00:00Z");
            assert_eq!(stored["metadata"]["annotations"], busy["metadata"]["annotations"], "{tampered}");
        }
    }

    #[test]
    fn a_flip_to_busy_with_a_busy_since_to_come_is_stamped_now() {
        let idle = worker(json!({}));
        let mut flip = idle.clone();
        set_label(&mut flip, "true");
        flip["metadata"]["annotations"][BUSY_SINCE] = json!("2099-01-01T00:00:00Z");
        let (_, stored) = update(&idle, &flip, "2026-11-21T20:00:00Z");
        assert_eq!(stored["metadata"]["annotations"][BUSY_SINCE], "2026-11-21T20:00:00Z");
    }

    #[test]
    fn karpenters_do_not_disrupt_runs_out_with_the_protection_counted_from_the_pods_start() {
        let mut idle = worker(json!({}));
        idle["status"]["startTime"] = json!("2026-11-21T18:00:00Z");
        let mut flip = idle.clone();
        set_label(&mut flip, "true");
        let (_, busy) = update(&idle, &flip, "2026-11-21T20:00:00Z");
        // Busy from 20:00 with a day of max-busy: until 20:00 the next day, 26h after the start.
        assert_eq!(busy["metadata"]["annotations"][KARPENTER_DO_NOT_DISRUPT], "93600s");
        let (outcome, again) = update(&busy, &busy, "2026-11-21T20:30:00Z");
        assert_eq!((outcome.decision, &again), (Decision::Allowed, &busy), "stable while busy");
        let mut done = busy.clone();
        set_label(&mut done, "false");
        let (_, stored) = update(&busy, &done, "2026-11-21T21:00:00Z");
        assert_eq!(stored["metadata"]["annotations"].get(KARPENTER_DO_NOT_DISRUPT), None, "the user had none");
    }

    #[test]
    fn a_reinvocation_of_the_flip_changes_nothing() {
        let idle = worker(json!({DELETION_COST: "1", KARPENTER_DO_NOT_DISRUPT: "true"}));
        let mut flip = idle.clone();
        set_label(&mut flip, "true");
        let (_, patched) = update(&idle, &flip, "2026-11-21T20:00:00Z");
        // The API server calls again with the patched object and the same old one.
        let (outcome, again) = update(&idle, &patched, "2026-11-21T20:00:01Z");
        assert_eq!(outcome.decision, Decision::Allowed, "{:?}", outcome.answer);
        assert_eq!(again, patched);
    }

    #[test]
    fn removing_the_label_while_busy_restores_the_pod_like_a_flip_to_idle() {
        let original = json!({DELETION_COST: "1", KARPENTER_DO_NOT_DISRUPT: "false"});
        let idle = worker(original.clone());
        let mut flip = idle.clone();
        set_label(&mut flip, "true");
        let (_, busy) = update(&idle, &flip, "2026-11-21T20:00:00Z");
        let mut opted_out = busy.clone();
        opted_out["metadata"]["labels"].as_object_mut().unwrap().remove(BUSY_LABEL);
        let (_, stored) = update(&busy, &opted_out, "2026-11-21T20:30:00Z");
        assert_eq!(stored["metadata"]["annotations"], original);
    }

    #[test]
    fn a_lost_busy_since_never_saves_busyguards_busy_values_as_the_users() {
        // Seen without the old version (the watch, a scale-down): busy-since gone, ours still on.
        let mut doc = worker(json!({DELETION_COST: "1"}));
        set_label(&mut doc, "true");
        admit(&mut doc, ALL, "2026-11-21T20:00:00Z");
        doc["metadata"]["annotations"].as_object_mut().unwrap().remove(BUSY_SINCE);
        admit(&mut doc, ALL, "2026-11-21T20:30:00Z");
        assert_eq!(doc["metadata"]["annotations"][IDLE_COST], "1", "the user's cost is still the one to restore");
        assert_eq!(doc["metadata"]["annotations"][IDLE_DO_NOT_DISRUPT], Value::Null);
        set_label(&mut doc, "false");
        admit(&mut doc, ALL, "2026-11-21T21:00:00Z");
        assert_eq!(doc["metadata"]["annotations"], json!({DELETION_COST: "1"}));
    }

    #[test]
    fn a_users_edit_while_protection_has_lapsed_is_kept_and_restored_on_idle() {
        let idle = worker(json!({}));
        let mut flip = idle.clone();
        set_label(&mut flip, "true");
        let (_, busy) = update(&idle, &flip, "2026-11-20T00:00:00Z");
        let (_, lapsed) = update(&busy, &busy, "2026-11-21T00:00:01Z");
        assert_eq!(lapsed["metadata"]["annotations"].get(KARPENTER_DO_NOT_DISRUPT), None, "lapsed: the user's (none)");
        let mut pinned = lapsed.clone();
        pinned["metadata"]["annotations"][KARPENTER_DO_NOT_DISRUPT] = json!("true");
        let (_, stored) = update(&lapsed, &pinned, "2026-11-21T00:05:00Z");
        assert_eq!(stored["metadata"]["annotations"][KARPENTER_DO_NOT_DISRUPT], "true", "the operator's pin stays");
        let mut done = stored.clone();
        set_label(&mut done, "false");
        let (_, stored) = update(&stored, &done, "2026-11-21T00:10:00Z");
        assert_eq!(stored["metadata"]["annotations"], json!({KARPENTER_DO_NOT_DISRUPT: "true"}));
    }

    #[test]
    fn a_write_with_nothing_to_change_is_allowed_with_its_warnings() {
        let p = pod(json!({"metadata": {"labels": {BUSY_LABEL: "maybe"}}}));
        let outcome = mutate_pod(&ask(), &p, None, &config(), ts("2026-11-21T20:48:44Z"));
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
        assert_eq!(mutate_pod(&ask(), &p, None, &config(), ts("2026-11-21T20:48:44Z")).decision, Decision::Allowed);
        let outcome = mutate_pod(&ask(), &pod(busy), None, &config(), ts("2026-11-21T20:48:44Z"));
        assert_eq!(outcome.decision, Decision::Patched);
        let Answer::Patch { patch, .. } = outcome.answer else { panic!() };
        assert_eq!(
            patch.0.len(),
            5,
            "busy-since, cost, the two autoscaler annotations, the protected label: {patch:?}"
        );
    }

    #[test]
    fn a_busy_label_busyguard_does_not_know_is_warned_about() {
        let p = pod(json!({"metadata": {"labels": {BUSY_LABEL: "yes"}}}));
        assert_eq!(
            contract_warnings(&p, DAY),
            ["busyguard: label busyguard.io/busy=\"yes\" is neither \"true\", \"false\" nor \"when-unready\"; the \
                 pod counts as idle"]
        );
        let readiness = pod(json!({"metadata": {"labels": {BUSY_LABEL: WHEN_UNREADY}}}));
        assert_eq!(contract_warnings(&readiness, DAY), Vec::<String>::new());
    }

    #[test]
    fn an_own_cost_karpenter_counts_as_nothing_is_warned_about_idle_or_busy() {
        let with = |label: &str, key: &str, cost: &str| {
            pod(json!({"metadata": {"labels": {BUSY_LABEL: label}, "annotations": {key: cost}}}))
        };
        let warned = contract_warnings(&with("false", DELETION_COST, "-134217728"), DAY);
        assert_eq!(warned.len(), 1);
        assert!(warned[0].contains("=-134217728 is at or below -134217728: Karpenter"), "{warned:?}");
        assert_eq!(contract_warnings(&with("true", IDLE_COST, "-200000000"), DAY).len(), 1, "kept aside while busy");
        assert!(contract_warnings(&with("false", DELETION_COST, "-134217727"), DAY).is_empty());
        assert!(contract_warnings(&with("false", DELETION_COST, "-5"), DAY).is_empty());
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
        let patch = serde_json::to_value(json_patch(&pod, &Plan { annotations: changes, protected: None })).unwrap();
        assert_eq!(
            patch,
            json!([{"op": "add", "path": "/metadata/annotations/controller.kubernetes.io~1pod-deletion-cost", "value": "1"}])
        );
    }
}
