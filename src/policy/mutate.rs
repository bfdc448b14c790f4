//! Pod CREATE and UPDATE, decided whole (the mutating webhook): the annotations busyguard
//! writes on a pod's flip to busy, and takes back on its flip to idle.
//!
//! The plan depends only on the pod as it is about to be stored, so a reinvocation (the API
//! server calling us again after another webhook changed the pod) finds nothing left to do.

use jiff::{SignedDuration, Timestamp};

use super::ask::Ask;
use super::config::{Mode, PolicyConfig};
use super::contract::contract_warnings;
use super::disruption::{Disruption, Taking, judge_disruption};
use super::hold::{NodeGoing, held, held_refusal};
use super::keys::{BUSY_LABEL, MAX_BUSY};
use super::marks::{busy_marks_overwritten, plan};
use super::outcome::{Answer, Decision, Denial, Outcome, Reason};
use super::owners::OwnerRule;
use super::patches::{json_patch, metadata_pointer};
use super::pod::{Pod, PodFacts};
use json_patch::{AddOperation, PatchOperation};

/// A pod's create or update, as the mutating webhook reads it.
pub struct Mutation<'a> {
    pub ask: &'a Ask<'a>,
    /// The pod as it is about to be stored.
    pub pod: &'a Pod,
    /// The version it replaces (an update).
    pub before: Option<&'a Pod>,
    /// Whether the pod's node is going, as the view knows it.
    pub node_going: Option<NodeGoing>,
    /// Whether busyguard itself writes the pod, following its owner's status (`policy::owners`).
    pub by_busyguard: bool,
    /// Whether the write reports a task its app has begun: `busyguard agent`'s flip from its
    /// app's own state ([`AGENT_FIELD_MANAGER`], with the pod's own token).
    pub reports_begun_task: bool,
}

impl<'a> Mutation<'a> {
    /// A write of a pod on a node that stays (or none yet).
    pub fn of(ask: &'a Ask<'a>, pod: &'a Pod, before: Option<&'a Pod>) -> Self {
        Mutation { ask, pod, before, node_going: None, by_busyguard: false, reports_begun_task: false }
    }
}

/// The answer to a pod's create or update: the annotation changes as a JSONPatch, and what the
/// writer should know about how the pod uses the contract. A flip to busy is refused on a pod
/// already being deleted (the task would be killed with it), on a pod held from new tasks
/// (`policy::hold`: its disruption is wanted, it goes at this idle moment), and where it leaves
/// the pod's own max-busy below the floor (whoever set it could end the task's protection within
/// a second); so is a change of max-busy that does.
pub fn mutate_pod(m: &Mutation<'_>, config: &PolicyConfig, now: Timestamp) -> Outcome {
    let (ask, pod, before) = (m.ask, m.pod, m.before);
    let turning_busy =
        pod.label(BUSY_LABEL) == Some("true") && before.is_none_or(|old| old.label(BUSY_LABEL) != Some("true"));
    // Its busy label is busyguard's to write: it follows its owner's status, or its leader.
    let follows_owner = followed_owner(pod, config).is_some() || config.leader_of(pod).is_some();
    if before.is_none() && pod.label(BUSY_LABEL).is_none() {
        return match (follows_owner, pod.runs_to_completion()) {
            (true, _) => opted_in_idle(pod),
            (false, Some(_)) => busy_from_creation(pod, config, now),
            // A webhook of an owner rule not (or no longer) configured here: left alone.
            (false, None) => Outcome::allow(Decision::Unhandled),
        };
    }
    let max_busy_written = before.is_none_or(|old| old.annotation(MAX_BUSY) != pod.annotation(MAX_BUSY));
    // An update that restarts the task container is judged as the disruption it is.
    let restart = before.and_then(|old| restart_judged(ask, pod, old, config, now));
    let restart_audit = match restart {
        Some(refused) if matches!(refused.decision, Decision::Denied | Decision::WouldDeny) => return refused,
        Some(let_through) => let_through.audit,
        None => None,
    };
    // A create is never held: refusing it would only fail the pod's creation. Nor is a flip that
    // reports a task already begun, busyguard's of a pod whose owner took a task (a runner's job,
    // a game server's players) or the agent's from its app's state: refusing it would leave the
    // task unguarded, not untaken.
    let task_begun = (m.by_busyguard && follows_owner) || m.reports_begun_task;
    let hold = (turning_busy && before.is_some() && !task_begun)
        .then(|| held(pod, &pod.spec.node_name, m.node_going, config.holds, now))
        .flatten();
    let refusal = match (turning_busy, pod.metadata.deletion_timestamp, hold, config.max_busy.below_floor(pod)) {
        (true, Some(deleting), _, _) => Some((
            Denial::PodTerminating,
            Reason::Terminating,
            busy_while_terminating(ask.namespace, ask.name, deleting),
        )),
        (true, None, Some(hold), _) => {
            let (denial, reason) = Denial::of_hold(&hold);
            Some((denial, reason, held_refusal(ask.namespace, ask.name, &hold)))
        }
        (_, _, _, Some(own)) if pod.label(BUSY_LABEL) == Some("true") && (turning_busy || max_busy_written) => Some((
            Denial::MaxBusyBelowFloor,
            Reason::MaxBusyBelowFloor,
            max_busy_below_floor(ask.namespace, ask.name, own, config.max_busy.floor),
        )),
        _ => None,
    };
    if let Some((denial, reason, message)) = refusal {
        let audit = ask.audit(Decision::Denied, reason, message.clone(), config.mode, now);
        return Outcome::answer(Answer::Deny { denial, message }, Decision::Denied).audited(audit);
    }
    let warnings = contract_warnings(pod, config.max_busy);
    let before = before.map(|old| old as &dyn PodFacts);
    let patch = json_patch(pod, &plan(pod, before, config.mutation, config.max_busy, now));
    let outcome = if patch.0.is_empty() {
        Outcome::answer(Answer::Allow { warnings }, Decision::Allowed)
    } else {
        Outcome::answer(Answer::Patch { patch, warnings }, Decision::Patched)
    };
    // A restart let through (an exempt requester, a protection that lapsed) is audited as such;
    // another writer's overwrite of the busy marks, put back by this very patch, too (audit
    // mode writes no marks: there a would-patch, since a pod marked under enforce mode keeps them).
    let overwritten = match before {
        Some(old) if !m.by_busyguard => busy_marks_overwritten(pod, old, config.mutation, config.max_busy, now),
        _ => Vec::new(),
    };
    match restart_audit {
        Some(audit) => outcome.audited(audit),
        None if !overwritten.is_empty() => {
            let (decision, answered) = match config.mode {
                Mode::Enforce => (
                    Decision::Restored,
                    "busyguard's values put back, theirs kept as the ones to restore when it is idle",
                ),
                Mode::Audit => (
                    Decision::WouldPatch,
                    "enforce mode would put busyguard's values back and keep theirs to restore when it is idle",
                ),
            };
            let detail = marks_overwritten(ask, &overwritten, answered);
            outcome.audited(ask.audit(decision, Reason::Overwritten, detail, config.mode, now))
        }
        None => outcome,
    }
}

/// Another writer took busyguard's marks off a busy pod; `answered`: what busyguard does about it.
fn marks_overwritten(ask: &Ask<'_>, keys: &[&str], answered: &str) -> String {
    format!(
        "{} took {} off busy pod {}/{}: {answered}; a controller that writes these (Karpenter's \
         PodDeletionCostManagement) fights busyguard: docs/karpenter.md",
        ask.requester.username,
        keys.join(", "),
        ask.namespace,
        ask.name
    )
}

/// A pod created without the busy label reaches busyguard only through a run-to-completion
/// webhook (`registrations::run_to_completion`: its namespace labelled
/// `busyguard.io/run-to-completion=true`, and its owner's label on it, a Job's, an Argo
/// Workflow's, a Tekton TaskRun's): it is busy from its creation to its end, where it is free at
/// once (a finished pod is not protected), with max-busy as the bound. Nothing in its template
/// needs to change.
fn busy_from_creation(pod: &Pod, config: &PolicyConfig, now: Timestamp) -> Outcome {
    let mut busy = pod.clone();
    busy.metadata.labels.insert(BUSY_LABEL.into(), "true".into());
    let mut patch = json_patch(pod, &plan(&busy, None, config.mutation, config.max_busy, now));
    // Such pods carry their owner's label, so the labels map is there.
    let label = AddOperation { path: metadata_pointer("labels", BUSY_LABEL), value: "true".into() };
    patch.0.insert(0, PatchOperation::Add(label));
    Outcome::answer(Answer::Patch { patch, warnings: Vec::new() }, Decision::Patched)
}

/// The rule of the pod's controlling owner's kind, if its busy state follows its owner.
fn followed_owner<'c>(pod: &Pod, config: &'c PolicyConfig) -> Option<&'c OwnerRule> {
    let owner = pod.controller()?;
    config.owner_rules.iter().find(|rule| rule.covers(&owner.api_version, &owner.kind))
}

/// A pod created without the busy label whose owner's kind has a busy rule (it reaches
/// busyguard through that kind's webhook, e.g. manifests/agones): opted in, idle; busyguard's
/// watch of its owner flips it busy when the owner's status says so.
fn opted_in_idle(pod: &Pod) -> Outcome {
    let label = if pod.metadata.labels.is_empty() {
        AddOperation {
            path: json_patch::jsonptr::PointerBuf::from_tokens(["metadata", "labels"]),
            value: serde_json::json!({BUSY_LABEL: "false"}),
        }
    } else {
        AddOperation { path: metadata_pointer("labels", BUSY_LABEL), value: "false".into() }
    };
    let patch = json_patch::Patch(vec![PatchOperation::Add(label)]);
    Outcome::answer(Answer::Patch { patch, warnings: Vec::new() }, Decision::Patched)
}

/// A `pods/resize` of a busy pod: refused if its resize policy restarts the task container.
pub fn judge_resize(m: &Mutation<'_>, config: &PolicyConfig, now: Timestamp) -> Outcome {
    let restart = m.before.and_then(|before| restart_judged(m.ask, m.pod, before, config, now));
    restart.unwrap_or_else(|| Outcome::allow(Decision::Allowed))
}

/// An update that would restart a pod's task container (a new image, or a resize its resize
/// policy restarts it for), judged as the disruption it is (`disruption::judge_disruption`): a
/// busy pod's is refused 429 until it is idle, but for who may take it away (an exempt user or
/// group, audited) or once its protection lapsed. Anything else about a busy pod may change.
fn restart_judged(ask: &Ask<'_>, pod: &Pod, before: &Pod, config: &PolicyConfig, now: Timestamp) -> Option<Outcome> {
    let container = pod.restarted_container(before)?;
    let restart = Disruption {
        ask,
        taking: Taking::Restart { container },
        pod: before,
        seen: None,
        siblings: None,
        preempted: false,
    };
    Some(judge_disruption(&restart, config, now))
}

/// A pod's own max-busy below the cluster's floor.
pub fn max_busy_below_floor(namespace: &str, name: &str, own: SignedDuration, floor: SignedDuration) -> String {
    format!(
        "pod {namespace}/{name}: annotation {MAX_BUSY}={own:#} is below the cluster's floor of {floor:#}; set at least \
         {floor:#} (or remove it for the default)"
    )
}

/// A flip to busy refused on a pod being deleted: the app must not start the task.
pub fn busy_while_terminating(namespace: &str, name: &str, deleting: Timestamp) -> String {
    format!(
        "pod {namespace}/{name} is being deleted (since {deleting}) and cannot turn busy: do not start the task; \
         it would be killed with the pod"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::busy::{self, MaxBusy};
    use crate::policy::cost::busy_cost;
    use crate::policy::keys::*;
    use crate::policy::marks::*;
    use crate::policy::testing::*;
    use serde_json::{Value, json};

    const ALL: MutationSettings = MutationSettings::ALL;
    const DAY: MaxBusy = MaxBusy::new(jiff::SignedDuration::from_hours(24));

    /// Plans, applies the JSONPatch to the pod's JSON (the pod as stored) and returns the plan.
    fn admit(doc: &mut Value, settings: MutationSettings, now: &str) -> Plan {
        let pod: Pod = serde_json::from_value(doc.clone()).unwrap();
        let plan = plan(&pod, None, settings, DAY, ts(now));
        json_patch::patch(doc, &json_patch(&pod, &plan)).expect("patch applies to its pod");
        plan
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
        let patch = json_patch(&pod, &Plan { annotations, ..Plan::default() });
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

    /// A pod busyguard marked busy, and the same with its deletion cost taken off by another
    /// writer (Karpenter's pod deletion cost management: the pod's node has a do-not-disrupt pod).
    fn busy_then_cost_cleared() -> (Value, Value) {
        let idle = worker(json!({DELETION_COST: "3"}));
        let mut flip = idle.clone();
        set_label(&mut flip, "true");
        let (_, busy) = mutated(&idle, &flip, "2026-11-21T20:48:44Z");
        let mut cleared = busy.clone();
        cleared["metadata"]["annotations"].as_object_mut().unwrap().remove(DELETION_COST);
        (busy, cleared)
    }

    #[test]
    fn another_writer_that_clears_a_busy_pods_cost_is_answered_in_the_same_write_and_audited() {
        let (busy, cleared) = busy_then_cost_cleared();
        let busy_value = busy["metadata"]["annotations"][DELETION_COST].clone();
        let (outcome, stored) = mutated(&busy, &cleared, "2026-11-21T20:50:00Z");
        assert_eq!(stored["metadata"]["annotations"][DELETION_COST], busy_value, "the busy cost put back");
        assert!(stored["metadata"]["annotations"].get(IDLE_COST).is_none(), "theirs (none) kept to restore");
        let audit = outcome.audit.expect("audited");
        assert_eq!((audit.decision, audit.reason), (Decision::Restored, Reason::Overwritten));
        assert!(audit.detail.contains(&format!("took {DELETION_COST} off busy pod")), "{}", audit.detail);
        assert!(audit.detail.contains(": busyguard's values put back, theirs kept"), "{}", audit.detail);
        // Ranked by the writer: its value is the one the idle pod gets back.
        let mut ranked = busy.clone();
        ranked["metadata"]["annotations"][DELETION_COST] = json!("-100");
        let (outcome, stored) = mutated(&busy, &ranked, "2026-11-21T20:50:00Z");
        assert_eq!(stored["metadata"]["annotations"][IDLE_COST], "-100");
        assert!(outcome.audit.is_some_and(|a| a.decision == Decision::Restored));
        // A write that leaves the marks as they are is no overwrite; busyguard's own neither.
        let mut labelled = busy.clone();
        labelled["metadata"]["labels"]["team"] = json!("a");
        assert!(mutated(&busy, &labelled, "2026-11-21T20:50:00Z").0.audit.is_none());
        let (ask, new_pod, old_pod) = (worker_write(), pod(ranked.clone()), pod(busy.clone()));
        let own = Mutation { by_busyguard: true, ..Mutation::of(&ask, &new_pod, Some(&old_pod)) };
        assert!(mutate_pod(&own, &config(), ts("2026-11-21T20:50:00Z")).audit.is_none());
    }

    #[test]
    fn in_audit_mode_another_writers_overwrite_is_a_would_patch_and_nothing_is_put_back() {
        // Marked under enforce mode; audit mode since.
        let (busy, cleared) = busy_then_cost_cleared();
        let (ask, new_pod, old_pod) = (worker_write(), pod(cleared), pod(busy));
        let audit_mode = PolicyConfig { mode: Mode::Audit, ..config() };
        let at = ts("2026-11-21T20:50:00Z");
        let outcome =
            mutate_pod(&Mutation::of(&ask, &new_pod, Some(&old_pod)), &audit_mode, at).in_audit_mode(&ask, at);
        assert_eq!(outcome.answer, Answer::Allow { warnings: vec![] }, "nothing put back");
        let audit = outcome.audit.expect("audited");
        assert_eq!((audit.decision, audit.reason), (Decision::WouldPatch, Reason::Overwritten));
        assert!(audit.detail.contains("enforce mode would put busyguard's values back"), "{}", audit.detail);
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
            let (_, busy) = mutated(&idle, &flip, "2026-11-21T20:48:44Z");
            assert_ne!(busy["metadata"]["annotations"], original);
            let mut done = busy.clone();
            set_label(&mut done, "false");
            let (_, stored) = mutated(&busy, &done, "2026-11-21T21:00:00Z");
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
            marks: &[],
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

    #[test]
    fn a_flip_to_busy_on_a_pod_being_deleted_is_refused_409_but_other_updates_go_through() {
        let mut old = worker(json!({}));
        old["metadata"]["deletionTimestamp"] = json!("2026-11-21T20:48:00Z");
        let mut flip = old.clone();
        set_label(&mut flip, "true");
        let (outcome, _) = mutated(&old, &flip, "2026-11-21T20:48:44Z");
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
        let (outcome, _) = mutated(&busy_going, &flip, "2026-11-21T20:48:44Z");
        assert_eq!(outcome.decision, Decision::Allowed);
    }

    /// The flip to busy of `old` (with `annotations`) on node `n1`, going or not.
    fn flip_on(annotations: Value, node_going: Option<NodeGoing>, now: &str) -> Outcome {
        let mut old = worker(json!({}));
        old["metadata"]["annotations"] = annotations;
        old["spec"]["nodeName"] = json!("n1");
        let mut flip = old.clone();
        set_label(&mut flip, "true");
        let (ask, old, flip) = (worker_write(), pod(old), pod(flip));
        mutate_pod(
            &Mutation {
                ask: &ask,
                pod: &flip,
                before: Some(&old),
                node_going,
                by_busyguard: false,
                reports_begun_task: false,
            },
            &config(),
            ts(now),
        )
    }

    fn refusal(outcome: &Outcome) -> (u16, &'static str, &str) {
        let Answer::Deny { denial, message } = &outcome.answer else { panic!("{:?}", outcome.answer) };
        (denial.code(), denial.cause(), message)
    }

    #[test]
    fn a_flip_to_busy_after_a_refused_eviction_is_refused_409_until_the_hold_runs_out() {
        let mark = json!({DISRUPTION_REQUESTED: r#"{"by":"system:serviceaccount:kube-system:drain","at":"2026-11-21T20:48:30Z"}"#});
        let outcome = flip_on(mark.clone(), None, "2026-11-21T20:48:44Z");
        assert_eq!(
            refusal(&outcome),
            (
                409,
                "BusyguardDisruptionWanted",
                "pod ns/w takes no new task: system:serviceaccount:kube-system:drain asked to evict it at \
                 2026-11-21T20:48:30Z (refused while it was busy); it takes no new task until 2026-11-21T20:49:00Z, \
                 longer if the eviction is asked again. Do not start the task: the pod goes at its next idle moment"
            )
        );
        assert_eq!(outcome.audit.unwrap().reason, Reason::DisruptionWanted);
        // The evictor gave up: the pod takes tasks again (the old mark stays, read as over).
        assert_eq!(flip_on(mark, None, "2026-11-21T20:49:00Z").decision, Decision::Patched);
    }

    #[test]
    fn the_agents_report_of_a_task_its_app_began_is_not_held_and_its_apps_ask_to_start_is() {
        let mark = json!({DISRUPTION_REQUESTED: r#"{"by":"system:serviceaccount:kube-system:drain","at":"2026-11-21T20:48:30Z"}"#});
        let mut old = worker(mark);
        old["spec"]["nodeName"] = json!("n1");
        let mut flip = old.clone();
        set_label(&mut flip, "true");
        let (ask, old, flip) = (worker_write(), pod(old), pod(flip));
        let reported = Mutation { reports_begun_task: true, ..Mutation::of(&ask, &flip, Some(&old)) };
        let at = ts("2026-11-21T20:48:44Z");
        assert_eq!(mutate_pod(&reported, &config(), at).decision, Decision::Patched, "begun: guard it");
        let asked = Mutation::of(&ask, &flip, Some(&old));
        assert_eq!(mutate_pod(&asked, &config(), at).decision, Decision::Denied, "not begun: do not start");
    }

    #[test]
    fn a_flip_to_busy_on_a_going_node_is_refused_409_and_on_a_staying_one_patched() {
        let outcome = flip_on(json!({}), Some(NodeGoing::Karpenter), "2026-11-21T20:48:44Z");
        let (code, cause, message) = refusal(&outcome);
        assert_eq!((code, cause), (409, "BusyguardNodeGoing"));
        assert!(message.contains("its node n1 is going: Karpenter is taking it away"), "{message}");
        assert_eq!(outcome.audit.unwrap().reason, Reason::NodeGoing);
        assert_eq!(flip_on(json!({}), None, "2026-11-21T20:48:44Z").decision, Decision::Patched);
    }

    #[test]
    fn a_held_pod_may_still_flip_to_idle_and_be_created_busy() {
        let mut busy = worker(json!({}));
        set_label(&mut busy, "true");
        busy["spec"]["nodeName"] = json!("n1");
        let mut idle = busy.clone();
        set_label(&mut idle, "false");
        let (ask, busy, idle) = (worker_write(), pod(busy), pod(idle));
        let going = Some(NodeGoing::ClusterAutoscaler);
        let to_idle = mutate_pod(
            &Mutation {
                ask: &ask,
                pod: &idle,
                before: Some(&busy),
                node_going: going,
                by_busyguard: false,
                reports_begun_task: false,
            },
            &config(),
            now(),
        );
        assert!(to_idle.is_allowed());
        let created = mutate_pod(
            &Mutation {
                ask: &ask,
                pod: &busy,
                before: None,
                node_going: going,
                by_busyguard: false,
                reports_begun_task: false,
            },
            &config(),
            now(),
        );
        assert!(created.is_allowed(), "refusing a create would only fail the pod's creation");
    }

    #[test]
    fn busy_since_cannot_be_moved_or_removed_while_busy() {
        let idle = worker(json!({DELETION_COST: "1"}));
        let mut flip = idle.clone();
        set_label(&mut flip, "true");
        let (_, busy) = mutated(&idle, &flip, "2026-11-21T20:00:00Z");
        for tampered in [json!(null), json!("2026-11-21T23:00:00Z"), json!("2099-01-01T00:00:00Z")] {
            let mut write = busy.clone();
            write["metadata"]["annotations"][BUSY_SINCE] = tampered.clone();
            if tampered.is_null() {
                write["metadata"]["annotations"].as_object_mut().unwrap().remove(BUSY_SINCE);
            }
            let (_, stored) = mutated(&busy, &write, "2026-11-21T22:00:00Z");
            assert_eq!(stored["metadata"]["annotations"], busy["metadata"]["annotations"], "{tampered}");
        }
    }

    #[test]
    fn a_flip_to_busy_with_a_busy_since_to_come_is_stamped_now() {
        let idle = worker(json!({}));
        let mut flip = idle.clone();
        set_label(&mut flip, "true");
        flip["metadata"]["annotations"][BUSY_SINCE] = json!("2099-01-01T00:00:00Z");
        let (_, stored) = mutated(&idle, &flip, "2026-11-21T20:00:00Z");
        assert_eq!(stored["metadata"]["annotations"][BUSY_SINCE], "2026-11-21T20:00:00Z");
    }

    #[test]
    fn karpenters_do_not_disrupt_runs_out_with_the_protection_counted_from_the_pods_start() {
        let mut idle = worker(json!({}));
        idle["status"]["startTime"] = json!("2026-11-21T18:00:00Z");
        let mut flip = idle.clone();
        set_label(&mut flip, "true");
        let (_, busy) = mutated(&idle, &flip, "2026-11-21T20:00:00Z");
        // Busy from 20:00 with a day of max-busy: until 20:00 the next day, 26h after the start.
        assert_eq!(busy["metadata"]["annotations"][KARPENTER_DO_NOT_DISRUPT], "93600s");
        let (outcome, again) = mutated(&busy, &busy, "2026-11-21T20:30:00Z");
        assert_eq!((outcome.decision, &again), (Decision::Allowed, &busy), "stable while busy");
        let mut done = busy.clone();
        set_label(&mut done, "false");
        let (_, stored) = mutated(&busy, &done, "2026-11-21T21:00:00Z");
        assert_eq!(stored["metadata"]["annotations"].get(KARPENTER_DO_NOT_DISRUPT), None, "the user had none");
    }

    #[test]
    fn a_reinvocation_of_the_flip_changes_nothing() {
        let idle = worker(json!({DELETION_COST: "1", KARPENTER_DO_NOT_DISRUPT: "true"}));
        let mut flip = idle.clone();
        set_label(&mut flip, "true");
        let (_, patched) = mutated(&idle, &flip, "2026-11-21T20:00:00Z");
        // The API server calls again with the patched object and the same old one.
        let (outcome, again) = mutated(&idle, &patched, "2026-11-21T20:00:01Z");
        assert_eq!(outcome.decision, Decision::Allowed, "{:?}", outcome.answer);
        assert_eq!(again, patched);
    }

    #[test]
    fn removing_the_label_while_busy_restores_the_pod_like_a_flip_to_idle() {
        let original = json!({DELETION_COST: "1", KARPENTER_DO_NOT_DISRUPT: "false"});
        let idle = worker(original.clone());
        let mut flip = idle.clone();
        set_label(&mut flip, "true");
        let (_, busy) = mutated(&idle, &flip, "2026-11-21T20:00:00Z");
        let mut opted_out = busy.clone();
        opted_out["metadata"]["labels"].as_object_mut().unwrap().remove(BUSY_LABEL);
        let (_, stored) = mutated(&busy, &opted_out, "2026-11-21T20:30:00Z");
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
        let (_, busy) = mutated(&idle, &flip, "2026-11-20T00:00:00Z");
        let (_, lapsed) = mutated(&busy, &busy, "2026-11-21T00:00:01Z");
        assert_eq!(lapsed["metadata"]["annotations"].get(KARPENTER_DO_NOT_DISRUPT), None, "lapsed: the user's (none)");
        let mut pinned = lapsed.clone();
        pinned["metadata"]["annotations"][KARPENTER_DO_NOT_DISRUPT] = json!("true");
        let (_, stored) = mutated(&lapsed, &pinned, "2026-11-21T00:05:00Z");
        assert_eq!(stored["metadata"]["annotations"][KARPENTER_DO_NOT_DISRUPT], "true", "the operator's pin stays");
        let mut done = stored.clone();
        set_label(&mut done, "false");
        let (_, stored) = mutated(&stored, &done, "2026-11-21T00:10:00Z");
        assert_eq!(stored["metadata"]["annotations"], json!({KARPENTER_DO_NOT_DISRUPT: "true"}));
    }

    #[test]
    fn a_write_with_nothing_to_change_is_allowed_with_its_warnings() {
        let p = pod(json!({"metadata": {"labels": {BUSY_LABEL: "maybe"}}}));
        let outcome = mutate_pod(&Mutation::of(&worker_write(), &p, None), &config(), ts("2026-11-21T20:48:44Z"));
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
        assert_eq!(
            mutate_pod(&Mutation::of(&worker_write(), &p, None), &config(), ts("2026-11-21T20:48:44Z")).decision,
            Decision::Allowed
        );
        let outcome =
            mutate_pod(&Mutation::of(&worker_write(), &pod(busy), None), &config(), ts("2026-11-21T20:48:44Z"));
        assert_eq!(outcome.decision, Decision::Patched);
        let Answer::Patch { patch, .. } = outcome.answer else { panic!() };
        assert_eq!(
            patch.0.len(),
            5,
            "busy-since, cost, the two autoscaler annotations, the protected label: {patch:?}"
        );
    }

    #[test]
    fn a_flip_to_busy_with_a_max_busy_below_the_floor_is_refused_400_and_an_idle_pods_write_is_not() {
        let idle = worker(json!({MAX_BUSY: "1s"}));
        let mut flip = idle.clone();
        set_label(&mut flip, "true");
        let (outcome, _) = mutated(&idle, &flip, "2026-11-21T20:00:00Z");
        let Answer::Deny { denial, message } = &outcome.answer else { panic!("{:?}", outcome.answer) };
        assert_eq!((denial.code(), denial.reason(), denial.cause()), (400, "BadRequest", "BusyguardMaxBusyBelowFloor"));
        assert_eq!(
            message,
            "pod ns/w: annotation busyguard.io/max-busy=1s is below the cluster's floor of 1m; set at least 1m (or \
             remove it for the default)"
        );
        assert_eq!(outcome.audit.unwrap().reason, Reason::MaxBusyBelowFloor);
        let (_, busy) = mutated(
            &worker(json!({})),
            &{
                let mut flip = worker(json!({}));
                set_label(&mut flip, "true");
                flip
            },
            "2026-11-21T20:00:00Z",
        );
        let mut shortened = busy.clone();
        shortened["metadata"]["annotations"][MAX_BUSY] = json!("10s");
        assert!(!mutated(&busy, &shortened, "2026-11-21T20:01:00Z").0.is_allowed(), "a busy pod's max-busy shortened");
        let mut annotated = idle.clone();
        annotated["metadata"]["annotations"]["team"] = json!("a");
        assert!(mutated(&idle, &annotated, "2026-11-21T20:00:00Z").0.is_allowed(), "an idle pod's own business");
        let mut at_the_floor = flip.clone();
        at_the_floor["metadata"]["annotations"][MAX_BUSY] = json!("1m");
        assert!(mutated(&idle, &at_the_floor, "2026-11-21T20:00:00Z").0.is_allowed());
    }

    #[test]
    fn a_max_busy_that_got_below_the_floor_meanwhile_protects_for_the_floor() {
        let mut doc = worker(json!({MAX_BUSY: "1s", BUSY_SINCE: "2026-11-21T20:00:00Z"}));
        set_label(&mut doc, "true");
        let pod = pod(doc);
        for (at, protected) in [("2026-11-21T20:00:59Z", true), ("2026-11-21T20:01:00Z", false)] {
            assert_eq!(busy::busy_state(&pod, DAY, ts(at)).is_protected(), protected, "{at}");
        }
    }

    #[test]
    fn a_flip_to_busy_is_stamped_now_even_over_a_busy_since_left_from_an_earlier_task() {
        let idle = worker(json!({BUSY_SINCE: "2026-11-21T18:00:00Z"}));
        let mut flip = idle.clone();
        set_label(&mut flip, "true");
        let (_, busy) = mutated(&idle, &flip, "2026-11-21T20:00:00Z");
        assert_eq!(busy["metadata"]["annotations"][BUSY_SINCE], "2026-11-21T20:00:00Z");
        // A reinvocation, or another replica's answer a moment later, keeps the stamp.
        let (again, _) = mutated(&idle, &busy, "2026-11-21T20:00:03Z");
        assert!(matches!(again.answer, Answer::Allow { .. }), "{:?}", again.answer);
    }

    /// A busy worker with a task container and a sidecar, as stored after its flip.
    fn busy_with_containers() -> Value {
        let mut idle = worker(json!({}));
        idle["spec"] = json!({"containers": [
            {"name": "worker", "image": "example.com/worker:1",
             "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
             "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"},
                              {"resourceName": "memory", "restartPolicy": "RestartContainer"}]},
            {"name": "proxy", "image": "example.com/proxy:1"}]});
        let mut flip = idle.clone();
        set_label(&mut flip, "true");
        mutated(&idle, &flip, "2026-11-21T20:00:00Z").1
    }

    #[test]
    fn an_update_that_would_restart_a_busy_pods_container_is_refused_429_until_idle() {
        let busy = busy_with_containers();
        let now = "2026-11-21T20:30:00Z";
        let change = |edit: &dyn Fn(&mut Value)| {
            let mut new = busy.clone();
            edit(&mut new);
            mutated(&busy, &new, now).0
        };
        let image = change(&|p| p["spec"]["containers"][0]["image"] = json!("example.com/worker:2"));
        let Answer::Deny { denial, message } = &image.answer else { panic!("{:?}", image.answer) };
        assert_eq!((denial.code(), denial.cause()), (429, "BusyguardPodBusy"));
        assert_eq!(
            message,
            "pod ns/w is busy since 2026-11-21T20:00:00Z (protection lapses at 2026-11-22T20:00:00Z at the latest): \
             this update would restart its container \"worker\" and end the task; retry once the pod is idle (to \
             force: kubectl label pod w -n ns busyguard.io/busy=false --overwrite)"
        );
        assert_eq!(image.audit.unwrap().reason, Reason::RestartWhileBusy);
        let memory = change(&|p| p["spec"]["containers"][0]["resources"]["requests"]["memory"] = json!("2Gi"));
        assert!(!memory.is_allowed(), "a resize its policy restarts the container for");
        let cpu = change(&|p| p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = json!("2"));
        assert!(cpu.is_allowed(), "a resize in place");
        let label = change(&|p| p["metadata"]["labels"]["team"] = json!("b"));
        assert!(label.is_allowed(), "anything else about a busy pod");
    }

    #[test]
    fn an_exempt_users_restart_of_a_busy_pod_goes_through_audited_as_their_delete_would() {
        let busy = busy_with_containers();
        let mut new = busy.clone();
        new["spec"]["containers"][0]["image"] = json!("example.com/worker:2");
        let (old, new) = (pod(busy), pod(new));
        let mut config = config();
        config.exemptions.groups = vec!["ops:breakglass".into()];
        let groups = ["ops:breakglass".to_string()];
        let ops = Ask {
            requester: crate::policy::Requester { username: "oncall", groups: &groups, pod: None },
            ..worker_write()
        };
        let outcome = mutate_pod(&Mutation::of(&ops, &new, Some(&old)), &config, ts("2026-11-21T20:30:00Z"));
        assert!(outcome.is_allowed(), "{:?}", outcome.answer);
        let audit = outcome.audit.expect("the exemption is audited");
        assert_eq!((audit.decision, audit.reason), (Decision::Exempted, Reason::ExemptGroup));
        let person = mutate_pod(&Mutation::of(&worker_write(), &new, Some(&old)), &config, ts("2026-11-21T20:30:00Z"));
        assert!(!person.is_allowed(), "anyone else's is refused");
    }

    #[test]
    fn only_the_task_containers_restart_counts_and_an_idle_pod_changes_freely() {
        let mut busy = busy_with_containers();
        busy["metadata"]["annotations"][TASK_CONTAINER] = json!("worker");
        let mut sidecar = busy.clone();
        sidecar["spec"]["containers"][1]["image"] = json!("example.com/proxy:2");
        assert!(mutated(&busy, &sidecar, "2026-11-21T20:30:00Z").0.is_allowed(), "a sidecar's restart");
        let mut idle = busy.clone();
        set_label(&mut idle, "false");
        let (_, idle) = mutated(&busy, &idle, "2026-11-21T20:30:00Z");
        let mut new_image = idle.clone();
        new_image["spec"]["containers"][0]["image"] = json!("example.com/worker:2");
        assert!(mutated(&idle, &new_image, "2026-11-21T20:31:00Z").0.is_allowed(), "an idle pod's");
    }

    #[test]
    fn the_task_container_is_read_from_the_pod_as_it_stood_so_one_write_cannot_repoint_and_restart_it() {
        let mut busy = busy_with_containers();
        busy["metadata"]["annotations"][TASK_CONTAINER] = json!("worker");
        let mut repointed = busy.clone();
        repointed["metadata"]["annotations"][TASK_CONTAINER] = json!("proxy");
        repointed["spec"]["containers"][0]["image"] = json!("example.com/worker:2");
        assert!(!mutated(&busy, &repointed, "2026-11-21T20:30:00Z").0.is_allowed());
    }

    #[test]
    fn tekton_stops_a_busy_taskruns_sidecar_by_its_image_and_its_steps_stay_protected() {
        let mut busy = busy_with_containers();
        busy["metadata"]["labels"]["tekton.dev/taskRun"] = json!("build-x");
        busy["spec"]["containers"][0]["name"] = json!("step-build");
        busy["spec"]["containers"][1]["name"] = json!("sidecar-db");
        let mut sidecar_stopped = busy.clone();
        sidecar_stopped["spec"]["containers"][1]["image"] = json!("gcr.io/tekton-releases/nop");
        assert!(mutated(&busy, &sidecar_stopped, "2026-11-21T20:30:00Z").0.is_allowed(), "Tekton's sidecar stop");
        let mut step_changed = busy.clone();
        step_changed["spec"]["containers"][0]["image"] = json!("example.com/worker:2");
        assert!(!mutated(&busy, &step_changed, "2026-11-21T20:30:00Z").0.is_allowed(), "a step's restart");
    }

    #[test]
    fn a_run_to_completion_pod_created_without_the_label_is_busy_from_its_creation_to_its_end() {
        let job_pod = json!({"metadata": {"name": "import-x2", "labels": {"batch.kubernetes.io/job-name": "import"}},
                             "spec": {"containers": [{"name": "main", "image": "example.com/import:1"}]}});
        let job_controller = ask("CREATE", "system:serviceaccount:kube-system:job-controller");
        let outcome = mutate_pod(
            &Mutation::of(&job_controller, &pod(job_pod.clone()), None),
            &config(),
            ts("2026-11-21T20:00:00Z"),
        );
        let Answer::Patch { patch, .. } = &outcome.answer else { panic!("{:?}", outcome.answer) };
        let mut created = job_pod.clone();
        json_patch::patch(&mut created, patch).unwrap();
        assert_eq!(created["metadata"]["labels"][BUSY_LABEL], "true");
        assert_eq!(created["metadata"]["labels"][PROTECTED_LABEL], "true");
        assert_eq!(created["metadata"]["annotations"][BUSY_SINCE], "2026-11-21T20:00:00Z");
        assert_eq!(created["metadata"]["annotations"][KARPENTER_DO_NOT_DISRUPT], "true");
        assert_eq!(created["metadata"]["annotations"][AUTOSCALER_SAFE_TO_EVICT], "false");
        let mut running = created.clone();
        running["status"] = json!({"phase": "Running"});
        assert!(busy::busy_state(&pod(running.clone()), DAY, ts("2026-11-21T21:00:00Z")).is_protected());
        running["status"]["phase"] = json!("Succeeded");
        assert!(!busy::busy_state(&pod(running), DAY, ts("2026-11-21T21:00:00Z")).is_protected(), "free once done");
    }

    /// Busy while its `GameServer` is Allocated.
    fn following_game_servers() -> PolicyConfig {
        let rule = "agones.dev/v1/GameServer=has(object.status.state) && object.status.state == 'Allocated'";
        PolicyConfig { owner_rules: vec![rule.parse().unwrap()], ..config() }
    }

    fn game_server_pod(labels: Value) -> Value {
        json!({"metadata": {"name": "gs-1", "labels": labels, "ownerReferences": [
                {"apiVersion": "agones.dev/v1", "kind": "GameServer", "name": "gs-1", "uid": "u", "controller": true}]},
               "spec": {"nodeName": "n1", "containers": [{"name": "gs", "image": "example.com/game:1"}]}})
    }

    #[test]
    fn a_pod_whose_owners_kind_has_a_busy_rule_is_created_opted_in_and_idle() {
        let agones = ask("CREATE", "system:serviceaccount:agones-system:agones-controller");
        for labels in [json!({"agones.dev/gameserver": "gs-1"}), json!({})] {
            let created = game_server_pod(labels);
            let outcome =
                mutate_pod(&Mutation::of(&agones, &pod(created.clone()), None), &following_game_servers(), now());
            let Answer::Patch { patch, .. } = &outcome.answer else { panic!("{:?}", outcome.answer) };
            let mut stored = created.clone();
            json_patch::patch(&mut stored, patch).unwrap();
            assert_eq!(stored["metadata"]["labels"][BUSY_LABEL], "false", "{stored}");
            assert!(stored["metadata"]["annotations"].is_null(), "idle: nothing else is written");
        }
        // Without the rule (a replica of an older configuration, during a rollout), it is left
        // alone: only a run-to-completion pod is made busy at its creation.
        let outcome = mutate_pod(&Mutation::of(&agones, &pod(game_server_pod(json!({}))), None), &config(), now());
        assert_eq!((outcome.decision, outcome.audit.is_none()), (Decision::Unhandled, true));
    }

    #[test]
    fn busyguards_own_flip_of_a_pod_whose_owner_took_a_task_is_not_held_and_anyone_elses_is() {
        let mut idle = game_server_pod(json!({BUSY_LABEL: "false"}));
        idle["metadata"]["annotations"] = json!({DISRUPTION_REQUESTED: r#"{"by":"system:serviceaccount:kube-system:drain","at":"2026-11-21T20:48:30Z"}"#});
        let mut busy = idle.clone();
        set_label(&mut busy, "true");
        let (idle, busy) = (pod(idle), pod(busy));
        let busyguard = ask("UPDATE", "system:serviceaccount:busyguard:busyguard");
        let flip = |by_busyguard, config: &PolicyConfig| {
            let m = Mutation {
                ask: &busyguard,
                pod: &busy,
                before: Some(&idle),
                node_going: None,
                by_busyguard,
                reports_begun_task: false,
            };
            mutate_pod(&m, config, ts("2026-11-21T20:48:44Z"))
        };
        assert_eq!(flip(true, &following_game_servers()).decision, Decision::Patched, "the game has begun: guard it");
        assert_eq!(flip(false, &following_game_servers()).decision, Decision::Denied, "another writer is held");
        assert_eq!(flip(true, &config()).decision, Decision::Denied, "a pod with no owner rule is held");
        let going = Mutation { node_going: Some(NodeGoing::Karpenter), ..Mutation::of(&busyguard, &busy, Some(&idle)) };
        let going = Mutation { by_busyguard: true, ..going };
        assert_eq!(mutate_pod(&going, &following_game_servers(), now()).decision, Decision::Patched);
    }

    #[test]
    fn annotation_keys_with_slashes_are_escaped_in_patch_paths() {
        let pod: Pod = serde_json::from_value(worker(json!({}))).unwrap();
        let changes = Changes::from([(DELETION_COST, Some("1".to_string()))]);
        let patch = serde_json::to_value(json_patch(&pod, &Plan { annotations: changes, ..Plan::default() })).unwrap();
        assert_eq!(
            patch,
            json!([{"op": "add", "path": "/metadata/annotations/controller.kubernetes.io~1pod-deletion-cost", "value": "1"}])
        );
    }
}
