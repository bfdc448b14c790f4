//! Who may write opted-in pods (the validating webhook `pod-flags`): busyguard's own writes
//! always; its delete-requested mark busyguard alone; a pod's own service account only its own
//! pod's busy flag.

use jiff::Timestamp;

use super::PolicyConfig;
use super::keys::{BUSY_LABEL, DELETE_REQUESTED, PROTECTED_LABEL};
use super::marks::{GUARDED, flip_keys, plan, written_on_a_flip};
use super::outcome::{Answer, Ask, Decision, Denial, Outcome, Reason};
use super::pod::{Pod, PodFacts};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::keys::*;
    use crate::policy::testing::*;
    use serde_json::{Value, json};

    const BUSYGUARD: Option<&str> = Some("system:serviceaccount:busyguard:busyguard");

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
        let (_, busy) = mutated(&idle, &flip, now);
        assert!(judged(&idle, &busy).is_allowed(), "the flip to busy");
        let mut back = busy.clone();
        set_label(&mut back, "false");
        let (_, idle_again) = mutated(&busy, &back, now);
        assert!(judged(&busy, &idle_again).is_allowed(), "the flip back to idle");
        assert_eq!(idle_again["metadata"]["annotations"][DELETION_COST], "-5");
        let mut smuggled = flip.clone();
        smuggled["metadata"]["annotations"][DELETION_COST] = json!("2147483647");
        let (_, kept_as_its_own) = mutated(&idle, &smuggled, now);
        assert_eq!(kept_as_its_own["metadata"]["annotations"][IDLE_COST], "2147483647");
        assert!(!judged(&idle, &kept_as_its_own).is_allowed(), "a cost slipped in with the flip, to be kept");
        // Saying busy again on a busy pod whose protection ran out: busyguard's refresh passes.
        let (lapsed_at, resent) = ("2026-11-23T20:00:00Z", busy.clone());
        let (_, refreshed) = mutated(&busy, &resent, lapsed_at);
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
        let own = written_by_pod("w", flip.clone(), idle.clone());
        assert!(own.is_allowed());

        let neighbour = written_by_pod("w-2", flip.clone(), idle.clone());
        let Answer::Deny { denial, message } = &neighbour.answer else { panic!("{:?}", neighbour.answer) };
        assert_eq!((denial.code(), denial.cause()), (403, "BusyguardNotOwnFlag"));
        assert_eq!(
            message,
            "pod ns/w is not the requester's own pod (ns/w-2): a pod's service account may flip only its own busy label"
        );

        let mut more = flip.clone();
        more["metadata"]["labels"]["app"] = json!("other");
        let relabel = written_by_pod("w", more, idle.clone());
        assert!(!relabel.is_allowed());
        let mut annotated = flip.clone();
        annotated["metadata"]["annotations"]["team"] = json!("b");
        let reannotate = written_by_pod("w", annotated, idle);
        assert!(!reannotate.is_allowed());
        assert_eq!(reannotate.audit.unwrap().reason, Reason::NotOwnFlag);
    }

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

    /// An idle worker, and the same with a delete-requested mark.
    fn idle_and_marked() -> (Value, Value) {
        let idle = worker(json!({}));
        let mut marked = idle.clone();
        marked["metadata"]["annotations"][DELETE_REQUESTED] = json!(r#"{"by":"alice"}"#);
        marked["metadata"]["labels"][DELETE_REQUESTED] = json!("true");
        (idle, marked)
    }

    #[test]
    fn busyguards_own_writes_pass_whatever_pod_its_token_is_bound_to() {
        let (idle, marked) = idle_and_marked();
        let mut busyguard = from_pod("busyguard-7d9-abc");
        busyguard.requester.username = BUSYGUARD.unwrap();
        let outcome =
            judge_write(&busyguard, &pod(marked), Some(&pod(idle)), BUSYGUARD, &config(), ts("2026-11-21T20:00:00Z"));
        assert!(outcome.is_allowed());
        assert!(outcome.audit.is_none());
    }

    #[test]
    fn only_busyguard_writes_the_delete_requested_mark() {
        let (idle, marked) = idle_and_marked();
        let now = ts("2026-11-21T20:00:00Z");
        for (what, before, known) in [
            ("a new mark", Some(pod(idle.clone())), BUSYGUARD),
            ("a pod created with one", None, BUSYGUARD),
            ("while busyguard does not know its own name yet", Some(pod(idle.clone())), None),
        ] {
            let outcome = judge_write(&worker_write(), &pod(marked.clone()), before.as_ref(), known, &config(), now);
            let Answer::Deny { denial, .. } = &outcome.answer else { panic!("{what}: {:?}", outcome.answer) };
            assert_eq!((denial.code(), denial.cause()), (403, "BusyguardNotBusyguardsMark"), "{what}");
            assert_eq!(outcome.audit.unwrap().reason, Reason::ForgedMark, "{what}");
        }
        let mut relabelled = marked.clone();
        relabelled["metadata"]["labels"]["team"] = json!("b");
        let kept =
            judge_write(&worker_write(), &pod(relabelled), Some(&pod(marked.clone())), BUSYGUARD, &config(), now);
        assert!(kept.is_allowed(), "a write that leaves busyguard's mark as it was");
        let mut unlabelled = marked.clone();
        unlabelled["metadata"]["labels"].as_object_mut().unwrap().remove(BUSY_LABEL);
        let opting_in =
            judge_write(&worker_write(), &pod(marked.clone()), Some(&pod(unlabelled)), BUSYGUARD, &config(), now);
        assert!(!opting_in.is_allowed(), "a pod opting in with a mark already on");
        // Half a mark is never carried out (`PodFacts::delete_request`), so it is anyone's to write.
        let mut half = idle.clone();
        half["metadata"]["annotations"][DELETE_REQUESTED] = marked["metadata"]["annotations"][DELETE_REQUESTED].clone();
        assert!(pod(half.clone()).delete_request().is_none());
        assert!(judge_write(&worker_write(), &pod(half), Some(&pod(idle)), BUSYGUARD, &config(), now).is_allowed());
    }

    #[test]
    fn requesters_that_are_not_a_pods_service_account_are_not_this_rules_business() {
        let idle = worker(json!({}));
        let outcome = judge_write(
            &worker_write(),
            &pod(idle.clone()),
            Some(&pod(idle)),
            BUSYGUARD,
            &config(),
            ts("2026-11-21T20:00:00Z"),
        );
        assert_eq!(outcome.decision, Decision::Allowed);
        assert!(outcome.audit.is_none());
    }

    /// A write of `new` over `old` by the token bound to pod `own_pod`, busyguard's own name known.
    fn written_by_pod(own_pod: &'static str, new: Value, old: Value) -> Outcome {
        judge_write(&from_pod(own_pod), &pod(new), Some(&pod(old)), BUSYGUARD, &config(), ts("2026-11-21T20:00:00Z"))
    }

    fn from_pod(pod: &'static str) -> Ask<'static> {
        let mut ask = worker_write();
        ask.requester.pod = Some(pod);
        ask
    }
}
