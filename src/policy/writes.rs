//! Who may write opted-in pods (the validating webhooks `pod-flags` and `idle-pod-flags`):
//! busyguard's own writes always; its delete-requested mark, busy-since and the protected label
//! busyguard alone; a worker only its own pod's busy flag; anyone else everything else, as
//! before busyguard existed.

use jiff::Timestamp;

use super::ask::{Ask, Requester};
use super::busy::{busy_since, busy_state};
use super::config::PolicyConfig;
use super::keys::{BUSY_LABEL, BUSY_SINCE, DELETE_REQUESTED, PROTECTED_LABEL};
use super::marks::{JUST_STAMPED, On, flip_keys, guarded_keys, mark_labels, plan, written_on_a_flip};
use super::outcome::{Answer, Decision, Denial, Outcome, Reason};
use super::pod::{Pod, PodFacts};

/// Who writes a pod, as far as these rules go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer<'a> {
    /// busyguard's own user, once known.
    Busyguard,
    /// The token bound to pod `namespace/own_pod` (a bound token's pod lives in its service
    /// account's namespace) of a pod busyguard guards, or of the written pod's own service
    /// account: the worker's Role grants `patch` on pods, which RBAC cannot narrow to the
    /// worker's own pod.
    Worker { namespace: &'a str, own_pod: &'a str },
    /// Anyone else: people, controllers (a pod-bound token of their own included), the kubelet.
    Other,
}

/// Who `requester` is to the pod it writes in `namespace`. `guarded(namespace, name)`: whether
/// busyguard guards that pod (an opted-in pod in its view).
pub fn writer<'a>(
    requester: &Requester<'a>,
    own: Option<&str>,
    namespace: &str,
    pod: &Pod,
    guarded: impl FnOnce(&str, &str) -> bool,
) -> Writer<'a> {
    if own == Some(requester.username) {
        return Writer::Busyguard;
    }
    let Some(own_pod) = requester.pod else { return Writer::Other };
    let account = requester.username.strip_prefix("system:serviceaccount:").and_then(|a| a.split_once(':'));
    let pods_own_account = account == Some((namespace, pod.spec.service_account_name.as_str()));
    match account {
        Some((own_namespace, _)) if pods_own_account || guarded(own_namespace, own_pod) => {
            Writer::Worker { namespace: own_namespace, own_pod }
        }
        _ => Writer::Other,
    }
}

/// A pod's create or update (or its status's), as the validating webhooks read it.
#[derive(Clone, Copy)]
pub struct Write<'a> {
    pub ask: &'a Ask<'a>,
    /// The pod as it is about to be stored.
    pub pod: &'a Pod,
    /// The version it replaces (an update).
    pub before: Option<&'a Pod>,
    pub writer: Writer<'a>,
    /// Through `pods/status`, where no mutating webhook of the pod's sees the write.
    pub through_status: bool,
}

/// The validating webhooks' rule for writes of opted-in pods (`through_status`: a write of
/// `pods/status`, which no mutating webhook sees). busyguard's own writes always pass. Only
/// busyguard writes the `busyguard.io/delete-requested` mark, since busyguard later deletes the
/// pod on its word (the field manager a client names proves nothing), and busy-since and the
/// protected label, since they bound and hold the protection. A worker may change opted-in pods
/// only so far as to flip its own pod's busy label: not another pod, not a pod of another
/// namespace, and no other label or annotation of its own (busyguard's annotations aside: the
/// mutating webhook wrote them in this very write). Everyone else writes the rest as before
/// busyguard existed.
pub fn judge_write(write: &Write<'_>, config: &PolicyConfig, now: Timestamp) -> Outcome {
    let Write { ask, pod, before, writer, through_status } = *write;
    if writer == Writer::Busyguard {
        return Outcome::allow(Decision::Unhandled);
    }
    let forged_key = before.and_then(|old| forged_key(pod, old, through_status, config, now));
    let refusal = if marks_anew(pod, before) {
        Some((Denial::NotBusyguardsMark, Reason::ForgedMark, not_busyguards_mark(ask.namespace, ask.name)))
    } else if let Some(key) = forged_key {
        Some((Denial::NotBusyguardsKeys, Reason::ForgedKeys, not_busyguards_keys(ask.namespace, ask.name, key)))
    } else if let (Writer::Worker { namespace, own_pod }, false) = (writer, through_status) {
        own_flag_only(ask, (namespace, own_pod), (pod, before), config, now)
            .map(|message| (Denial::NotOwnFlag, Reason::NotOwnFlag, message))
    } else {
        None
    };
    let Some((denial, reason, message)) = refusal else { return Outcome::allow(Decision::Allowed) };
    let audit = ask.audit(Decision::Denied, reason, message.clone(), config.mode, now);
    Outcome::answer(Answer::Deny { denial, message }, Decision::Denied).audited(audit)
}

/// Whether the write gives the pod a whole delete-requested mark (its label and its annotation,
/// see [`PodFacts::delete_request`]) that it did not carry before (a create, a new or changed
/// mark), or opts the pod in with one it carried unguarded. Half a mark is never carried out. A
/// write that leaves a mark as it was passes, whatever else it does: a marked pod that lost its
/// busy label still takes its kubelet's status writes and its controllers' finalizer removals.
pub fn marks_anew(pod: &Pod, before: Option<&Pod>) -> bool {
    let Some(new) = whole_mark(pod) else { return false };
    before.is_none_or(|old| {
        whole_mark(old) != Some(new) || (old.label(BUSY_LABEL).is_none() && pod.label(BUSY_LABEL).is_some())
    })
}

/// The annotation of a delete-requested mark whose label is there too.
fn whole_mark(pod: &Pod) -> Option<&str> {
    pod.label(DELETE_REQUESTED).and(pod.annotation(DELETE_REQUESTED))
}

/// The first of busyguard's own keys, busy-since and the protected label, that this write sets
/// otherwise than busyguard leaves it, if any: they hold and bound the pod's protection. Through
/// `pods/status` nothing of busyguard's runs, so there they must stay as they were. (The saved
/// idle values stand for the pod's own cost and autoscaler annotations, which anyone but a worker
/// may write anyway: they are held for workers, below.)
fn forged_key(
    pod: &Pod,
    before: &Pod,
    through_status: bool,
    config: &PolicyConfig,
    now: Timestamp,
) -> Option<&'static str> {
    let protected = |p: &Pod| p.label(PROTECTED_LABEL) == Some("true");
    let since_kept = pod.annotation(BUSY_SINCE) == before.annotation(BUSY_SINCE)
        || (!through_status && as_busyguard_leaves_it((On::Annotation, BUSY_SINCE), pod, before, config, now));
    let protected_kept = protected(pod) == protected(before)
        || (!through_status && protected(pod) == busy_state(pod, config.max_busy, now).is_protected());
    match (since_kept, protected_kept) {
        (false, _) => Some(BUSY_SINCE),
        (_, false) => Some(PROTECTED_LABEL),
        _ => None,
    }
}

/// Whether annotation `key` (busy-since, or one busyguard writes or saves on a flip) is as
/// busyguard leaves it: without a flip, as it was or as busyguard's own refresh of it in this
/// write makes it; on a flip, busy-since stamped just now (or gone, turning idle), and no value
/// but the user's own from before it, saved or restored, so that nobody slips one in to be kept
/// as the user's. The busy values themselves are the mutating webhook's, which wrote them in
/// this very write.
fn as_busyguard_leaves_it(
    (on, key): (On, &str),
    pod: &Pod,
    before: &Pod,
    config: &PolicyConfig,
    now: Timestamp,
) -> bool {
    let read = |p| on.read(p, key);
    let turning_idle = match (before.label(BUSY_LABEL) == Some("true"), pod.label(BUSY_LABEL) == Some("true")) {
        (false, false) | (true, true) => {
            let refresh = plan(before, Some(before), config.mutation, config.max_busy, now);
            let refresh = if on == On::Label { refresh.labels } else { refresh.annotations };
            let refreshed = refresh.get(key).map_or(read(before), Option::as_deref);
            return read(pod) == read(before) || read(pod) == refreshed;
        }
        (was_busy, _) => was_busy,
    };
    if key == BUSY_SINCE {
        let kept_or_gone = [None, before.annotation(BUSY_SINCE)].contains(&pod.annotation(BUSY_SINCE));
        return match busy_since(pod) {
            _ if turning_idle => kept_or_gone,
            None => pod.annotation(BUSY_SINCE).is_none(),
            Some(since) => now.duration_since(since).abs() <= JUST_STAMPED,
        };
    }
    let mut guarded_keys = guarded_keys(config.mutation);
    let Some((guarded_on, guarded, saved_as)) =
        guarded_keys.find(|(kept_on, guarded, saved_as)| (*kept_on == on && key == *guarded) || key == *saved_as)
    else {
        return read(pod) == read(before);
    };
    let users_own = [before.annotation(saved_as), guarded_on.read(before, guarded), None];
    (key != saved_as && !turning_idle) || users_own.contains(&read(pod))
}

/// The own-flag rule's refusal, if any, of a write of `pod` (replacing `before`) by the token
/// bound to pod `own` (namespace, name).
fn own_flag_only(
    ask: &Ask<'_>,
    (own_namespace, own_pod): (&str, &str),
    (pod, before): (&Pod, Option<&Pod>),
    config: &PolicyConfig,
    now: Timestamp,
) -> Option<String> {
    let before = before?;
    let marks = || mark_labels(config.mutation);
    let others = |labels: &super::pod::Labels| {
        (labels.iter())
            .filter(|(k, _)| {
                k.as_str() != BUSY_LABEL && k.as_str() != PROTECTED_LABEL && !marks().any(|m| m == k.as_str())
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<Vec<_>>()
    };
    let theirs = |pod: &Pod| -> Vec<(String, String)> {
        let annotations = pod.metadata.annotations.iter().flatten();
        annotations
            .filter(|(k, _)| !written_on_a_flip(k, config.mutation))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    if own_pod != ask.name || own_namespace != ask.namespace {
        Some(not_own_pod(ask.namespace, ask.name, &format!("{own_namespace}/{own_pod}")))
    } else if others(&pod.metadata.labels) != others(&before.metadata.labels)
        || theirs(pod) != theirs(before)
        || !flip_keys(config.mutation)
            .all(|key| as_busyguard_leaves_it((On::Annotation, key), pod, before, config, now))
        || !marks().all(|key| as_busyguard_leaves_it((On::Label, key), pod, before, config, now))
    {
        Some(more_than_the_flag(ask.namespace, ask.name))
    } else {
        None
    }
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

/// busyguard's own keys written by someone else.
pub fn not_busyguards_keys(namespace: &str, name: &str, key: &str) -> String {
    format!(
        "pod {namespace}/{name}: only busyguard writes {key} (it holds or bounds the pod's protection); flip \
         {BUSY_LABEL} and busyguard writes it"
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

    const BUSYGUARD: &str = "system:serviceaccount:busyguard:busyguard";
    const WORKER: Writer<'static> = Writer::Worker { namespace: "ns", own_pod: "w" };

    #[test]
    fn a_worker_cannot_pin_its_own_pod_with_busyguards_annotations_only_flip_it() {
        let now = "2026-11-21T20:00:00Z";
        let judged = |old: &Value, new: &Value| {
            write_judged(&from_pod("w"), &pod(new.clone()), Some(&pod(old.clone())), WORKER, ts(now))
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
        let outcome = write_judged(&from_pod("w"), &pod(refreshed), Some(&pod(busy)), WORKER, ts(lapsed_at));
        assert!(outcome.is_allowed(), "{:?}", outcome.answer);
    }

    /// `--busy-annotation` and `--busy-label` marks ride on a worker's flip as busyguard's own
    /// annotations do: written with it, undone with it, and not the worker's to write otherwise.
    #[test]
    fn a_workers_flip_carries_the_vendor_marks_and_a_mark_of_its_own_on_an_idle_pod_is_refused() {
        use crate::policy::marks::{Mark, On};
        use crate::policy::mutate::{Mutation, mutate_pod};
        let cast = Mark::parse(On::Annotation, "autoscaling.cast.ai/removal-disabled=true").unwrap();
        let ocean = Mark::parse(On::Label, "spotinst.io/restrict-scale-down=true").unwrap();
        let mut config = config();
        config.mutation.marks = Box::leak(Box::new([cast, ocean]));
        let now = ts("2026-11-21T20:00:00Z");
        let ask = from_pod("w");
        let mutated = |old: &Value, new: &Value| {
            let (old_pod, new_pod) = (pod(old.clone()), pod(new.clone()));
            let outcome = mutate_pod(&Mutation::of(&ask, &new_pod, Some(&old_pod)), &config, now);
            let mut stored = new.clone();
            if let Answer::Patch { patch, .. } = &outcome.answer {
                json_patch::patch(&mut stored, patch).unwrap();
            }
            stored
        };
        let judged = |old: &Value, new: &Value| {
            let (old_pod, new_pod) = (pod(old.clone()), pod(new.clone()));
            let write =
                Write { ask: &ask, pod: &new_pod, before: Some(&old_pod), writer: WORKER, through_status: false };
            judge_write(&write, &config, now)
        };
        let idle = worker(json!({cast.key: "false"}));
        let mut flip = idle.clone();
        set_label(&mut flip, "true");
        let busy = mutated(&idle, &flip);
        assert_eq!(busy["metadata"]["annotations"][cast.key], "true");
        assert_eq!(busy["metadata"]["annotations"][cast.saved_as], "false", "the pod's own, kept");
        assert_eq!(busy["metadata"]["labels"][ocean.key], "true");
        assert!(judged(&idle, &busy).is_allowed(), "the flip to busy");
        let mut back = busy.clone();
        set_label(&mut back, "false");
        let idle_again = mutated(&busy, &back);
        assert_eq!(idle_again["metadata"]["annotations"], json!({cast.key: "false"}), "as the pod had it");
        assert_eq!(idle_again["metadata"]["labels"].get(ocean.key), None);
        assert!(judged(&busy, &idle_again).is_allowed(), "the flip back to idle");
        let mut pinned = idle.clone();
        pinned["metadata"]["labels"][ocean.key] = json!("true");
        assert!(!judged(&idle, &pinned).is_allowed(), "Ocean's label on its idle pod");
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
        // A pod busyguard guards there: a worker, of namespace other.
        let writer = writer(&elsewhere.requester, Some(BUSYGUARD), "ns", &pod(flip.clone()), |_, _| true);
        assert_eq!(writer, Writer::Worker { namespace: "other", own_pod: "w" });
        let outcome = write_judged(&elsewhere, &pod(flip), Some(&pod(idle)), writer, ts("2026-11-21T20:00:00Z"));
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
        busyguard.requester.username = BUSYGUARD;
        let writer = writer(&busyguard.requester, Some(BUSYGUARD), "ns", &pod(marked.clone()), |_, _| false);
        assert_eq!(writer, Writer::Busyguard);
        let outcome = write_judged(&busyguard, &pod(marked), Some(&pod(idle)), writer, ts("2026-11-21T20:00:00Z"));
        assert!(outcome.is_allowed());
        assert!(outcome.audit.is_none());
    }

    #[test]
    fn only_busyguard_writes_the_delete_requested_mark() {
        let (idle, marked) = idle_and_marked();
        let now = ts("2026-11-21T20:00:00Z");
        for (what, before, through_status) in [
            ("a new mark", Some(pod(idle.clone())), false),
            ("a pod created with one", None, false),
            ("through the pod's status", Some(pod(idle.clone())), true),
        ] {
            let outcome = {
                let marked = pod(marked.clone());
                let write = Write {
                    ask: &worker_write(),
                    pod: &marked,
                    before: before.as_ref(),
                    writer: Writer::Other,
                    through_status,
                };
                judge_write(&write, &config(), now)
            };
            let Answer::Deny { denial, .. } = &outcome.answer else { panic!("{what}: {:?}", outcome.answer) };
            assert_eq!((denial.code(), denial.cause()), (403, "BusyguardNotBusyguardsMark"), "{what}");
            assert_eq!(outcome.audit.unwrap().reason, Reason::ForgedMark, "{what}");
        }
        let mut relabelled = marked.clone();
        relabelled["metadata"]["labels"]["team"] = json!("b");
        let kept = write_judged(&worker_write(), &pod(relabelled), Some(&pod(marked.clone())), Writer::Other, now);
        assert!(kept.is_allowed(), "a write that leaves busyguard's mark as it was");
        let mut unlabelled = marked.clone();
        unlabelled["metadata"]["labels"].as_object_mut().unwrap().remove(BUSY_LABEL);
        let opting_in = write_judged(&worker_write(), &pod(marked.clone()), Some(&pod(unlabelled)), Writer::Other, now);
        assert!(!opting_in.is_allowed(), "a pod opting in with a mark already on");
        // Half a mark is never carried out (`PodFacts::delete_request`), so it is anyone's to write.
        let mut half = idle.clone();
        half["metadata"]["annotations"][DELETE_REQUESTED] = marked["metadata"]["annotations"][DELETE_REQUESTED].clone();
        assert!(pod(half.clone()).delete_request().is_none());
        assert!(write_judged(&worker_write(), &pod(half), Some(&pod(idle)), Writer::Other, now).is_allowed());
    }

    #[test]
    fn requesters_that_are_not_workers_change_a_busy_pods_labels_annotations_and_finalizers_as_before() {
        let now = "2026-11-21T20:00:00Z";
        let idle = worker(json!({"team": "a"}));
        let mut flip = idle.clone();
        set_label(&mut flip, "true");
        let (_, busy) = mutated(&idle, &flip, now);
        let mut changed = busy.clone();
        changed["metadata"]["labels"]["rollouts-pod-template-hash"] = json!("abc");
        changed["metadata"]["annotations"]["team"] = json!("b");
        changed["metadata"]["annotations"][DELETION_COST] = json!("-3");
        changed["metadata"]["finalizers"] = json!([]);
        // A controller in a pod of its own (Argo Rollouts, Kyverno, Kueue): its token is bound
        // to its pod, of its own service account.
        let mut controller = from_pod("rollouts-7c9");
        controller.requester.username = "system:serviceaccount:argo-rollouts:argo-rollouts";
        for (who, ask) in [("a controller's pod", controller), ("a person", worker_write())] {
            let writer = writer(&ask.requester, Some(BUSYGUARD), "ns", &pod(changed.clone()), |_, _| false);
            assert_eq!(writer, Writer::Other, "{who}");
            let outcome = write_judged(&ask, &pod(changed.clone()), Some(&pod(busy.clone())), writer, ts(now));
            assert_eq!(outcome.decision, Decision::Allowed, "{who}: {:?}", outcome.answer);
            assert!(outcome.audit.is_none(), "{who}");
        }
    }

    #[test]
    fn a_worker_is_a_token_of_the_pods_own_service_account_or_of_a_pod_busyguard_guards() {
        let target = pod(worker(json!({})));
        let mut own_account = target;
        own_account.spec.service_account_name = "worker".into();
        let token = |username: &'static str| Requester { username, groups: &[], pod: Some("w-2") };
        let not_guarded = |_: &str, _: &str| false;
        let cases = [
            (
                "the pod's own service account",
                token("system:serviceaccount:ns:worker"),
                not_guarded as fn(&str, &str) -> bool,
                true,
            ),
            (
                "another account, of a guarded pod",
                token("system:serviceaccount:ns:other"),
                |ns: &str, pod: &str| (ns, pod) == ("ns", "w-2"),
                true,
            ),
            ("another account of an unguarded pod", token("system:serviceaccount:ns:other"), not_guarded, false),
            ("the same name in another namespace", token("system:serviceaccount:elsewhere:worker"), not_guarded, false),
        ];
        for (what, requester, guarded, is_worker) in cases {
            let expected = if is_worker { Writer::Worker { namespace: "ns", own_pod: "w-2" } } else { Writer::Other };
            assert_eq!(writer(&requester, Some(BUSYGUARD), "ns", &own_account, guarded), expected, "{what}");
        }
        let person = Requester { username: "alice", groups: &[], pod: None };
        assert_eq!(writer(&person, Some(BUSYGUARD), "ns", &own_account, |_, _| true), Writer::Other);
    }

    #[test]
    fn busy_since_and_the_protected_label_are_busyguards_whoever_writes_and_however() {
        let now = "2026-11-21T21:00:00Z";
        let idle = worker(json!({}));
        let mut flip = idle.clone();
        set_label(&mut flip, "true");
        let (_, busy) = mutated(&idle, &flip, "2026-11-21T20:00:00Z");
        let judged = |new: &Value, through_status: bool| {
            let (new, before) = (pod(new.clone()), pod(busy.clone()));
            let write =
                Write { ask: &worker_write(), pod: &new, before: Some(&before), writer: Writer::Other, through_status };
            judge_write(&write, &config(), ts(now))
        };
        let mut renewed = busy.clone();
        renewed["metadata"]["annotations"][BUSY_SINCE] = json!("2026-11-21T20:59:59Z");
        let mut gone = busy.clone();
        gone["metadata"]["annotations"].as_object_mut().unwrap().remove(BUSY_SINCE);
        let mut unprotected = busy.clone();
        unprotected["metadata"]["labels"].as_object_mut().unwrap().remove(PROTECTED_LABEL);
        for (what, forged, through_status) in [
            ("busy-since moved, through the status", &renewed, true),
            ("busy-since removed", &gone, false),
            ("busy-since removed, through the status", &gone, true),
            ("the protected label removed, through the status", &unprotected, true),
        ] {
            let outcome = judged(forged, through_status);
            let Answer::Deny { denial, message } = &outcome.answer else { panic!("{what}: {:?}", outcome.answer) };
            assert_eq!((denial.code(), denial.cause()), (403, "BusyguardNotBusyguardsKeys"), "{what}");
            assert!(message.starts_with("pod ns/w: only busyguard writes busyguard.io/"), "{what}: {message}");
            assert_eq!(outcome.audit.unwrap().reason, Reason::ForgedKeys, "{what}");
        }
        let mut status_only = busy.clone();
        status_only["status"]["phase"] = json!("Running");
        status_only["metadata"]["labels"]["team"] = json!("b");
        assert!(judged(&status_only, true).is_allowed(), "a status write that leaves busyguard's keys as they were");
        // The flip to idle as the mutating webhook leaves it: busy-since and the label go.
        let mut back = busy.clone();
        set_label(&mut back, "false");
        let (_, idle_again) = mutated(&busy, &back, now);
        assert!(judged(&idle_again, false).is_allowed());
    }

    /// A write of `new` over `old` by the token bound to pod `own_pod`, busyguard's own name known.
    fn written_by_pod(own_pod: &'static str, new: Value, old: Value) -> Outcome {
        let writer = Writer::Worker { namespace: "ns", own_pod };
        write_judged(&from_pod(own_pod), &pod(new), Some(&pod(old)), writer, ts("2026-11-21T20:00:00Z"))
    }

    fn from_pod(pod: &'static str) -> Ask<'static> {
        let mut ask = worker_write();
        ask.requester.pod = Some(pod);
        ask
    }
}
