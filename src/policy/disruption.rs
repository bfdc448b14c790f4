//! Pod DELETE and pods/eviction CREATE, decided whole: may this pod be taken away now? Busy
//! pods are spared unless their protection lapsed or the requester is exempt; a person's (or the
//! garbage collector's) refused delete is carried out later, once the pod is idle.

use jiff::Timestamp;

use super::ask::{Ask, Requester};
use super::budget::{self, Budget, Siblings, budget_used_up};
use super::busy::{BusyState, busy_state};
use super::config::{Mode, PolicyConfig};
use super::hold;
use super::keys::{
    BUSY_LABEL, DELETE_REQUESTED, DISRUPTION_REQUESTED, DeleteRequest, EVACUATION_TRIGGERED, EVICTION_IN_PROGRESS,
    EvictAs, RELEASED_FROM, REQUEST_EVICT_ONLY,
};
use super::outcome::{Action, Answer, AuditRecord, BudgetClaim, Decision, Denial, Effect, Outcome, Reason};
use super::owners;
use super::pod::{OwnerKey, PodFacts, PodRef};
use super::refusals::{Busy, busy_denial, restart_while_busy};
use super::requesters::{GARBAGE_COLLECTOR_USER, LOCAL_ADMIN_USER, REPLICASET_CONTROLLER_USER};
use super::verdict::{Override, Taken, Verdict, budget_holds, judge};
use super::workloads::workload_of;
use crate::duration::whole_second;

/// A refused delete is carried out later only for people and the garbage collector: they ask
/// once. Controllers (ReplicaSet, scheduler preemption, ...) retry and choose again by
/// themselves; deleting later what they chose before would remove a second pod.
pub fn defers_delete(requester: Requester<'_>) -> bool {
    let username = requester.username;
    username == GARBAGE_COLLECTOR_USER || username == LOCAL_ADMIN_USER || !username.starts_with("system:")
}

/// Whether the cluster itself confirms a release the ReplicaSet controller's delete asked for,
/// as read from the API server at that moment (a review can be forged; these cannot): the
/// ReplicaSet is scaling down (it wants fewer pods than it has), and its Deployment is not
/// `Recreate`, which promises that old and new pods never run together (a released pod would
/// run on beside the new ones). Otherwise why not.
pub fn release_confirmed(wanted: Option<i32>, has: Option<i32>, strategy: Option<&str>) -> Result<(), NotReleased> {
    if strategy == Some("Recreate") {
        return Err(NotReleased("its Deployment is Recreate: old and new pods never run together".into()));
    }
    match (wanted, has) {
        (Some(wanted), Some(has)) if wanted < has => Ok(()),
        _ => Err(NotReleased(format!("its ReplicaSet is not scaling down ({wanted:?} wanted, {has:?} there)"))),
    }
}

/// Why a busy pod is not released from its ReplicaSet after all (the release is then moot).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotReleased(pub String);

/// A delete or an eviction of one pod, as [`judge_disruption`] reads it.
pub struct Disruption<'a, P: PodFacts + ?Sized> {
    pub ask: &'a Ask<'a>,
    pub taking: Taking<'a>,
    /// The pod the request carries (a delete) or the view holds (an eviction): the answer,
    /// which goes to whoever asked, stands on it alone.
    pub pod: &'a P,
    /// The same pod as busyguard's own view holds it, if it does: side effects (the Event, the
    /// delete-requested mark, a release) follow only when the view confirms it busy, so a
    /// forged review cannot make busyguard act on a pod.
    pub seen: Option<&'a dyn PodFacts>,
    /// The workload's other unavailable pods, for its `busyguard.io/max-unavailable` (`None`:
    /// unknown, no budget).
    pub siblings: Option<Siblings>,
    /// Whether Kueue preempted the Workload of the pod's Job, in a namespace that holds such
    /// preemptions (`--hold-kueue-preemption`): the Job controller's delete is then the cluster
    /// taking the pod, not the Job's own end.
    pub preempted: bool,
}

/// What a request would do to the pod, with what that kind of request alone carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taking<'a> {
    Delete,
    /// An eviction, with the grace period its `deleteOptions` asked for, kept for an eviction
    /// carried out later.
    Evict {
        grace_period: Option<i64>,
    },
    /// An update that would restart the pod's task container, `container`.
    Restart {
        container: &'a str,
    },
}

impl Taking<'_> {
    /// The kind of disruption, as an Event and the verdict name it.
    pub fn action(self) -> Action {
        match self {
            Taking::Delete => Action::Delete,
            Taking::Evict { .. } => Action::Evict,
            Taking::Restart { .. } => Action::Restart,
        }
    }
}

/// What refusing a busy pod sets in motion besides the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Consequence<'p> {
    /// Nothing: the view does not confirm the pod busy, or the request is a dry run.
    Nothing,
    /// An Event on the pod: the requester retries, and chooses again, by itself.
    Told,
    /// An Event, and an eviction refused: the pod is held from new tasks (`policy::hold`), so the
    /// evictor's retry finds it idle. Not for a pod busy by readiness: it takes its tasks without
    /// a flip busyguard could refuse.
    Held,
    /// The delete carried out once the pod is idle (a person's or the garbage collector's, who
    /// ask once; `in_background`: an eviction the descheduler asked to start an evacuation).
    Deferred { in_background: bool },
    /// Busy by readiness and picked by the ReplicaSet controller, which ranks NotReady pods
    /// first and so would never end its scale-down: the pod is taken out of its ReplicaSet by
    /// the label `label` (value `hash`), and deleted once Ready.
    Released { label: &'static str, hash: &'p str },
}

impl<'p> Consequence<'p> {
    fn of(
        d: &Disruption<'p, impl PodFacts + ?Sized>,
        by_readiness: bool,
        config: &PolicyConfig,
        now: Timestamp,
    ) -> Self {
        let (pod, action, requester) = (d.pod, d.taking.action(), d.ask.requester);
        // A restart refused is retried by its sender (a person reads why): nothing to set going.
        if action == Action::Restart {
            return Consequence::Nothing;
        }
        // Called for a pod refused, so found protected: an eviction's pod is the view's own record,
        // and needs no second look.
        let confirmed = d.seen.is_some_and(|seen| {
            std::ptr::addr_eq(seen, pod)
                || (seen.uid() == pod.uid() && busy_state(seen, config.max_busy, now).is_protected())
        });
        if !confirmed || d.ask.dry_run {
            return Consequence::Nothing;
        }
        let in_background = action == Action::Evict && pod.annotation(REQUEST_EVICT_ONLY).is_some();
        if in_background || (action == Action::Delete && defers_delete(requester)) {
            return Consequence::Deferred { in_background };
        }
        if action == Action::Evict && !by_readiness {
            return Consequence::Held;
        }
        let picked_by_replicaset = action == Action::Delete && requester.username == REPLICASET_CONTROLLER_USER;
        match pod.template_hash() {
            Some((label, hash)) if by_readiness && picked_by_replicaset => Consequence::Released { label, hash },
            _ => Consequence::Told,
        }
    }
}

/// The answer to a delete or an eviction, with its audit line, side effects and budget claim.
pub fn judge_disruption(d: &Disruption<'_, impl PodFacts + ?Sized>, config: &PolicyConfig, now: Timestamp) -> Outcome {
    let state = busy_state(d.pod, config.max_busy, now);
    let busy_since = match state {
        BusyState::Busy { since, .. } => since,
        BusyState::Lapsed { since, .. } => Some(since),
        _ => None,
    };
    let audit = |decision, reason, detail| AuditRecord {
        busy_since,
        // Named only where the trial's summary reads it: other lines need not pay for it.
        workload: (config.mode == Mode::Audit).then(|| workload_of(d.pod, d.ask.name)),
        ..d.ask.audit(decision, reason, detail, config.mode, now)
    };
    // A leader's token counts for its own namespace's pods only: a pod of that name elsewhere is
    // another pod.
    let requester = Requester { pod: d.ask.requester.pod_in(d.ask.namespace), ..d.ask.requester };
    let taken = Taken { action: d.taking.action(), preempted: d.preempted };
    match judge(state, d.pod, taken, requester, config) {
        Verdict::Allow => within_budget(d, config, audit),
        Verdict::AllowBusy(over) => let_busy_go(d, over, audit),
        Verdict::Deny { since, until } => refuse_busy(d, (since, until), config, now, audit),
    }
}

/// An eviction by busyguard's own token: refused unless busyguard deferred the pod's eviction,
/// as its mark (written by busyguard) says, so a stolen token evicts no other pod busyguard's
/// webhooks see (the fence keeps it out of kube-system and busyguard's namespace). A deferred
/// one is judged then as any eviction (`None`): a pod busy again is refused before its PDB
/// counts it. `pod`: the view's record, `None` for a pod not opted in.
pub fn refuse_own_eviction(
    ask: &Ask<'_>,
    pod: Option<&(impl PodFacts + ?Sized)>,
    config: &PolicyConfig,
    now: Timestamp,
) -> Option<Outcome> {
    let deferred = pod.and_then(|pod| pod.delete_request()).is_some_and(|request| request.evict.is_some());
    if deferred {
        return None;
    }
    let message = format!(
        "busyguard's own service account evicts only the pods whose eviction it deferred (marked {DELETE_REQUESTED} \
         with an eviction, by busyguard); pod {}/{} is not one",
        ask.namespace, ask.name
    );
    let audit = |decision, reason, detail| ask.audit(decision, reason, detail, config.mode, now);
    Some(Outcome::refused(Denial::NotDeferred, Reason::NotDeferred, message, config.mode, audit))
}

/// A pod nothing busy holds: its workload's budget, if any, has the last word.
fn within_budget(
    d: &Disruption<'_, impl PodFacts + ?Sized>,
    config: &PolicyConfig,
    audit: impl FnOnce(Decision, Reason, String) -> AuditRecord,
) -> Outcome {
    let (namespace, name) = (d.ask.namespace, d.ask.name);
    // Not a restart, not recovery or an exempt requester, nor a delete that must not wait.
    let held = budget_holds(d.taking.action(), d.ask.requester, config);
    match budget::budget(d.pod, d.siblings.as_ref(), held, namespace, name) {
        Budget::NotHeld => Outcome::allow(Decision::Allowed),
        Budget::UsedUp(message) => Outcome::refused(Denial::Budget, Reason::Budget, message, config.mode, audit),
        // A dry run lets nothing go: nothing to claim.
        Budget::Within { .. } if d.ask.dry_run => Outcome::allow(Decision::Allowed),
        Budget::Within { allowed, siblings } => {
            // If another replica took the last place meanwhile: as many unavailable as allowed.
            let message = budget_used_up(namespace, name, allowed, allowed);
            let refusal = Outcome::refused(Denial::Budget, Reason::Budget, message, config.mode, audit);
            let Siblings { workload, unavailable } = siblings.clone();
            let claim = BudgetClaim {
                namespace: namespace.to_string(),
                pod: name.to_string(),
                workload,
                unavailable,
                allowed,
                refusal: Box::new(refusal),
            };
            Outcome { budget: Some(Box::new(claim)), ..Outcome::allow(Decision::Allowed) }
        }
    }
}

/// A busy pod that goes all the same, audited with why.
fn let_busy_go(
    d: &Disruption<'_, impl PodFacts + ?Sized>,
    over: Override,
    audit: impl FnOnce(Decision, Reason, String) -> AuditRecord,
) -> Outcome {
    let decision = over.decision();
    Outcome::allow(decision).audited(audit(decision, over.reason(), over.detail(d.ask.namespace, d.ask.name)))
}

/// A busy pod kept, busy `since` and protected `until` (as far as known): the refusal, and what
/// it sets in motion.
fn refuse_busy(
    d: &Disruption<'_, impl PodFacts + ?Sized>,
    (since, until): (Option<Timestamp>, Option<Timestamp>),
    config: &PolicyConfig,
    now: Timestamp,
    audit: impl FnOnce(Decision, Reason, String) -> AuditRecord,
) -> Outcome {
    use std::fmt::Write;
    let (ask, pod) = (d.ask, d.pod);
    let by_readiness = pod.label(BUSY_LABEL) != Some("true");
    let enforced = config.mode != Mode::Audit;
    // The owner is read only where a busy rule could follow it: this is every refusal's path.
    let owner = (!config.owner_rules.is_empty()).then(|| pod.owner_key()).flatten();
    let owner = owner.filter(|owner| owners::rule_of(&config.owner_rules, *owner).is_some());
    let leader = config.leader_of(pod).map(|leader| OwnerKey::of("v1", "Pod", leader));
    let followed = owner.or(leader);
    let busy = Busy { since, until, by_readiness, followed };
    if let Taking::Restart { container } = d.taking {
        let message = restart_while_busy(ask.namespace, ask.name, container, &busy);
        return Outcome::refused(Denial::PodBusy, Reason::RestartWhileBusy, message, config.mode, audit);
    }
    let mut message = busy_denial(ask.namespace, ask.name, &busy, enforced);
    if !enforced {
        return Outcome::refused(Denial::PodBusy, Reason::Busy, message, config.mode, audit);
    }
    let consequence = Consequence::of(d, by_readiness, config, now);
    let target =
        PodRef { namespace: ask.namespace.to_string(), name: ask.name.to_string(), uid: pod.uid().to_string() };
    let request = || DeleteRequest::new(ask.requester.username, whole_second(now));
    let (then, reason) = match consequence {
        Consequence::Nothing | Consequence::Told => (None, Reason::Busy),
        Consequence::Held => {
            let mark = hold::mark_due(pod, config.holds, now)
                .then(|| Effect::MarkDisruptionWanted { pod: target.clone(), request: request() });
            (mark, Reason::Busy)
        }
        Consequence::Deferred { in_background } => {
            // An eviction deferred is carried out as an eviction, so PodDisruptionBudgets hold.
            let grace_period_seconds = match d.taking {
                Taking::Evict { grace_period } => grace_period,
                _ => None,
            };
            let evict = in_background.then_some(EvictAs { grace_period_seconds });
            let unmarked =
                pod.delete_request().is_none() || (in_background && pod.annotation(EVICTION_IN_PROGRESS).is_none());
            let mark = unmarked.then(|| Effect::MarkDeleteRequested {
                pod: target.clone(),
                request: DeleteRequest { evict, ..request() },
                in_background,
            });
            (mark, Reason::BusyDeleteDeferred)
        }
        Consequence::Released { label, hash } => {
            let release = Effect::Release { pod: target.clone(), label, hash: hash.to_string(), request: request() };
            (Some(release), Reason::BusyReleased)
        }
    };
    let _ = write!(message, "{consequence}");
    let told = (consequence != Consequence::Nothing).then(|| Effect::Event {
        pod: target,
        action: d.taking.action(),
        note: message.clone(),
    });
    Outcome {
        answer: Answer::Deny { denial: Denial::PodBusy, message: message.clone() },
        decision: Decision::Denied,
        audit: Some(Box::new(audit(Decision::Denied, reason, message))),
        effects: told.into_iter().chain(then).collect(),
        // The answer speaks of the mark: give it its chance to land first.
        await_effects: !matches!(consequence, Consequence::Nothing | Consequence::Told),
        budget: None,
    }
}

/// What a refusal adds of what busyguard does next, written into its message where it is used
/// (no String of its own: every refusal of a busy pod says it).
impl std::fmt::Display for Consequence<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Consequence::Nothing | Consequence::Told => Ok(()),
            Consequence::Held => write!(
                f,
                "; busyguard holds it from new tasks ({DISRUPTION_REQUESTED}), so it is idle at a retry after its \
                 task ends"
            ),
            Consequence::Deferred { in_background: false } => write!(
                f,
                "; busyguard records the delete on the pod ({DELETE_REQUESTED}) and carries it out once the pod is \
                 idle (if the annotation does not appear, delete again later)"
            ),
            // The descheduler's words for an evacuation under way.
            Consequence::Deferred { in_background: true } => write!(
                f,
                "; busyguard records the eviction on the pod ({DELETE_REQUESTED}) and carries it out once the pod \
                 is idle, as an eviction, so your PodDisruptionBudgets hold; {EVACUATION_TRIGGERED}: the pod is \
                 marked {EVICTION_IN_PROGRESS} and goes once idle"
            ),
            // `label`: the one its ReplicaSet selects it by.
            Consequence::Released { label, .. } => write!(
                f,
                "; busyguard takes it out of its ReplicaSet (label {label} kept in {RELEASED_FROM}), so the \
                 scale-down completes without it, and deletes it once it is Ready again"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::POD_GC_USER;
    use crate::policy::busy::MaxBusy;
    use crate::policy::config::{Exempt, Exemptions};
    use crate::policy::keys::BUSY_SINCE;
    use crate::policy::keys::{DELETE_REQUESTED, MAX_UNAVAILABLE};
    use crate::policy::marks::MutationSettings;
    use crate::policy::outcome::BUSY_CAUSE;
    use crate::policy::pod::Pod;
    use crate::policy::requesters::{NAMESPACE_CONTROLLER_USER, TAINT_MANAGER_USERS};
    use crate::policy::testing::*;
    use jiff::SignedDuration;

    /// `action` as a request takes it; a restart's task container is `worker`.
    fn taking(action: Action) -> Taking<'static> {
        match action {
            Action::Delete => Taking::Delete,
            Action::Evict => Taking::Evict { grace_period: None },
            Action::Restart => Taking::Restart { container: "worker" },
        }
    }
    use serde_json::json;

    const NO_GROUPS: &[String] = &[];

    fn admin() -> Requester<'static> {
        Requester { username: "admin", groups: NO_GROUPS, pod: None }
    }

    fn busy() -> BusyState {
        BusyState::Busy { since: Some(ts("2026-11-21T20:00:00Z")), until: Some(ts("2026-11-22T20:00:00Z")) }
    }

    fn config(mode: Mode) -> PolicyConfig {
        PolicyConfig {
            mode,
            max_busy: MaxBusy::new(SignedDuration::from_hours(24)),
            exemptions: Exemptions {
                users: vec!["ops".into()],
                groups: vec!["ops:breakglass".into()],
                karpenter: vec!["system:serviceaccount:kube-system:karpenter".into()],
                owner_controllers: vec![JOB_CONTROLLER.into()],
            },
            mutation: MutationSettings::ALL,
            holds: Default::default(),
            owner_rules: Vec::new(),
            busy_with_pod: None,
        }
    }

    fn worker(label: &str, annotations: serde_json::Value, status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "w", "namespace": "capture", "uid": "u-w",
            "labels": {BUSY_LABEL: label}, "annotations": annotations}, "status": status}))
        .unwrap()
    }

    fn busy_worker() -> Pod {
        worker("true", json!({BUSY_SINCE: "2026-11-21T20:00:00Z"}), json!({"phase": "Running"}))
    }

    fn ask(username: &'static str, dry_run: bool) -> Ask<'static> {
        Ask { uid: "review-1", dry_run, ..crate::policy::testing::ask("DELETE", username) }
    }

    /// `user`'s `action` on `pod` in enforce mode, the view holding the same pod.
    fn judged(user: &'static str, action: Action, pod: &Pod, unavailable_siblings: Option<u32>) -> Outcome {
        let siblings = unavailable_siblings.map(crate::policy::testing::unavailable_siblings);
        judge_disruption(
            &Disruption {
                ask: &ask(user, false),
                taking: taking(action),
                pod,
                seen: Some(pod),
                siblings,
                preempted: false,
            },
            &config(Mode::Enforce),
            now(),
        )
    }

    /// `ask` of the busy worker, as the view holds it too.
    fn busy_decided(ask: Ask<'_>, action: Action, mode: Mode, now: Timestamp) -> Outcome {
        let pod = busy_worker();
        judge_disruption(
            &Disruption {
                ask: &ask,
                taking: taking(action),
                pod: &pod,
                seen: Some(&pod),
                siblings: None,
                preempted: false,
            },
            &config(mode),
            now,
        )
    }

    fn reason_of(outcome: &Outcome) -> Option<Reason> {
        outcome.audit.as_ref().map(|a| a.reason)
    }

    /// The pod (named, and as stored), who asks, what, the refusal (code, cause), the audit line
    /// (decision, reason), and whether the pod is marked.
    type Row<'a> =
        (&'static str, &'a Pod, &'static str, Action, Option<(u16, &'static str)>, Option<(Decision, Reason)>, bool);

    /// The busy contract (docs/contract.md) for deletes, evictions and restarts, one row a case:
    /// the pod, who asks what, and busyguard's answer (`None`: allowed), its audit line and
    /// whether it marks the pod to delete (or evict) it once idle.
    #[test]
    fn the_busy_contract_for_deletes_evictions_and_restarts_reads_as_docs_contract_states_it() {
        use Action::{Delete, Evict, Restart};
        let (person, rs, gc) = ("alice", REPLICASET_CONTROLLER_USER, GARBAGE_COLLECTOR_USER);
        let (karpenter, scheduler) = ("system:serviceaccount:kube-system:karpenter", "system:kube-scheduler");
        let lapsed = worker("true", json!({BUSY_SINCE: "2026-11-19T20:00:00Z"}), json!({"phase": "Running"}));
        let idle = worker("false", json!({}), json!({"phase": "Running"}));
        let done = worker("true", json!({BUSY_SINCE: "2026-11-21T20:00:00Z"}), json!({"phase": "Succeeded"}));
        let mut going = busy_worker();
        going.metadata.deletion_timestamp = Some(now());
        let busy = busy_worker();
        let in_background = worker(
            "true",
            json!({BUSY_SINCE: "2026-11-21T20:00:00Z", REQUEST_EVICT_ONLY: ""}),
            json!({"phase": "Running"}),
        );
        let descheduler = "system:serviceaccount:kube-system:descheduler";
        #[rustfmt::skip]
        let rows: [Row<'_>; 22] = [
            ("busy", &busy, person, Delete, Some((429, BUSY_CAUSE)), Some((Decision::Denied, Reason::BusyDeleteDeferred)), true),
            ("busy", &busy, gc, Delete, Some((429, BUSY_CAUSE)), Some((Decision::Denied, Reason::BusyDeleteDeferred)), true),
            ("busy", &busy, rs, Delete, Some((429, BUSY_CAUSE)), Some((Decision::Denied, Reason::Busy)), false),
            ("busy", &busy, scheduler, Delete, Some((429, BUSY_CAUSE)), Some((Decision::Denied, Reason::Busy)), false),
            ("busy", &busy, person, Evict, Some((429, BUSY_CAUSE)), Some((Decision::Denied, Reason::Busy)), false),
            ("busy", &busy, karpenter, Evict, Some((429, BUSY_CAUSE)), Some((Decision::Denied, Reason::Busy)), false),
            ("busy", &busy, karpenter, Delete, None, Some((Decision::Exempted, Reason::KarpenterDeadline)), false),
            ("busy", &busy, POD_GC_USER, Delete, None, Some((Decision::Exempted, Reason::ExemptUser)), false),
            ("busy", &busy, "ops", Evict, None, Some((Decision::Exempted, Reason::ExemptUser)), false),
            ("busy", &busy, TAINT_MANAGER_USERS[0], Delete, None, Some((Decision::Exempted, Reason::NodeTaintEviction)), false),
            ("busy", &busy, NAMESPACE_CONTROLLER_USER, Delete, None, Some((Decision::Exempted, Reason::NamespaceDeleted)), false),
            ("past max-busy", &lapsed, person, Delete, None, Some((Decision::Lapsed, Reason::MaxBusyExceeded)), false),
            ("past max-busy", &lapsed, person, Evict, None, Some((Decision::Lapsed, Reason::MaxBusyExceeded)), false),
            ("idle", &idle, person, Delete, None, None, false),
            ("idle", &idle, person, Evict, None, None, false),
            ("terminating", &going, person, Delete, None, None, false),
            ("terminal", &done, person, Evict, None, None, false),
            ("busy, evict-only", &in_background, descheduler, Evict, Some((429, BUSY_CAUSE)), Some((Decision::Denied, Reason::BusyDeleteDeferred)), true),
            ("busy", &busy, person, Restart, Some((429, BUSY_CAUSE)), Some((Decision::Denied, Reason::RestartWhileBusy)), false),
            ("busy", &busy, "ops", Restart, None, Some((Decision::Exempted, Reason::ExemptUser)), false),
            ("past max-busy", &lapsed, person, Restart, None, Some((Decision::Lapsed, Reason::MaxBusyExceeded)), false),
            ("idle", &idle, person, Restart, None, None, false),
        ];
        for (state, pod, user, action, refused, audited, marked) in rows {
            let row = format!("{state} pod, {action:?} by {user}");
            let mut config = config(Mode::Enforce);
            config.exemptions.users.push(POD_GC_USER.into());
            let disruption = Disruption {
                ask: &ask(user, false),
                taking: taking(action),
                pod,
                seen: Some(pod),
                siblings: None,
                preempted: false,
            };
            let outcome = judge_disruption(&disruption, &config, now());
            let answer = match &outcome.answer {
                Answer::Deny { denial, .. } => Some((denial.code(), denial.cause())),
                _ => None,
            };
            assert_eq!(answer, refused, "{row}");
            assert_eq!(outcome.audit.as_ref().map(|a| (a.decision, a.reason)), audited, "{row}");
            let marks = outcome.effects.iter().any(|e| matches!(e, Effect::MarkDeleteRequested { .. }));
            assert_eq!(marks, marked, "{row}");
        }
    }

    #[test]
    fn a_refusal_of_a_pod_busy_by_its_owner_names_the_owner_and_what_really_forces_it() {
        let rule = "actions.github.com/v1alpha1/EphemeralRunner=has(object.status.jobRequestId)";
        let with_rule = PolicyConfig { owner_rules: vec![rule.parse().unwrap()], ..config(Mode::Enforce) };
        let mut runner = busy_worker();
        runner.metadata.owner_references = serde_json::from_value(json!([{"apiVersion": "actions.github.com/v1alpha1",
            "kind": "EphemeralRunner", "name": "ci-4tb9k", "uid": "o", "controller": true}]))
        .unwrap();
        let refusal_of = |taking: Taking<'_>, pod: &Pod, config: &PolicyConfig| {
            let disruption = Disruption {
                ask: &ask("alice", false),
                taking,
                pod,
                seen: Some(pod),
                siblings: None,
                preempted: false,
            };
            let Answer::Deny { message, .. } = judge_disruption(&disruption, config, now()).answer else { panic!() };
            message
        };
        let refusal = |pod: &Pod, config: &PolicyConfig| refusal_of(Taking::Evict { grace_period: None }, pod, config);
        let restart = refusal_of(Taking::Restart { container: "runner" }, &runner, &with_rule);
        assert!(restart.contains("to force: end EphemeralRunner/ci-4tb9k's task"), "{restart}");
        assert!(!restart.contains("kubectl label"), "a restart's refusal offers no relabelling either: {restart}");
        let message = refusal(&runner, &with_rule);
        assert!(message.contains("follows EphemeralRunner/ci-4tb9k, and busyguard writes it"), "{message}");
        assert!(!message.contains("kubectl label"), "relabelling is undone at the next flip: {message}");
        let message = refusal(&runner, &config(Mode::Enforce));
        assert!(message.contains("kubectl label pod w"), "no rule for its owner: the label is the user's: {message}");
    }

    #[test]
    fn busyguards_own_token_evicts_only_a_pod_whose_eviction_it_deferred() {
        let marked = |mark: &str, by_busyguard: bool| -> Pod {
            let managed = if by_busyguard { marked_by_busyguard() } else { json!([]) };
            serde_json::from_value(json!({"metadata": {"name": "w", "namespace": "capture", "uid": "u-w",
                "labels": {BUSY_LABEL: "false", DELETE_REQUESTED: "true"}, "annotations": {DELETE_REQUESTED: mark},
                "managedFields": managed}, "status": {"phase": "Running"}}))
            .unwrap()
        };
        let eviction = r#"{"by":"descheduler","at":"2026-11-21T20:30:00Z","evict":{}}"#;
        let delete = r#"{"by":"alice","at":"2026-11-21T20:30:00Z"}"#;
        let busyguard = ask("system:serviceaccount:busyguard:busyguard", false);
        let config = config(Mode::Enforce);
        let own = |pod: Option<&Pod>| refuse_own_eviction(&busyguard, pod, &config, now());
        assert!(own(Some(&marked(eviction, true))).is_none(), "its deferred eviction, judged as any");
        for (what, pod) in [
            ("an idle pod, unmarked", Some(worker("false", json!({}), json!({"phase": "Running"})))),
            ("a deferred delete, not an eviction", Some(marked(delete, true))),
            ("a mark someone else wrote", Some(marked(eviction, false))),
            ("a pod not opted in", None),
        ] {
            let refused = own(pod.as_ref()).unwrap_or_else(|| panic!("{what}: let through"));
            let Answer::Deny { denial, message } = &refused.answer else { panic!("{what}: {:?}", refused.answer) };
            assert_eq!((denial.code(), denial.cause()), (403, "BusyguardNotDeferred"), "{what}");
            assert!(message.contains("pod capture/"), "{what}: {message}");
            assert_eq!(refused.audit.map(|a| a.reason), Some(Reason::NotDeferred), "{what}");
        }
    }

    #[test]
    fn a_pod_busy_with_its_runner_goes_by_the_runners_own_token_and_no_one_elses() {
        let config = PolicyConfig { busy_with_pod: Some("runner-pod".into()), ..config(Mode::Enforce) };
        let mut workflow = busy_worker();
        workflow.metadata.labels.insert("runner-pod".into(), "ci-runner-4tb9k".into());
        let delete = |username: &'static str, pod: Option<&'static str>, action: Action| {
            let ask = Ask { requester: Requester { username, groups: NO_GROUPS, pod }, ..ask(username, false) };
            let disruption = Disruption {
                ask: &ask,
                taking: taking(action),
                pod: &workflow,
                seen: Some(&workflow),
                siblings: None,
                preempted: false,
            };
            judge_disruption(&disruption, &config, now())
        };
        let hooks = "system:serviceaccount:capture:ci-gha-rs-kube-mode";
        let cleaned = delete(hooks, Some("ci-runner-4tb9k"), Action::Delete);
        assert_eq!(reason_of(&cleaned), Some(Reason::Leader), "the runner's hooks clean up its job's pod");
        assert!(cleaned.is_allowed());
        let elsewhere = "system:serviceaccount:other:ci-gha-rs-kube-mode";
        assert!(
            !delete(elsewhere, Some("ci-runner-4tb9k"), Action::Delete).is_allowed(),
            "a pod of the runner's name in another namespace"
        );
        assert!(!delete(hooks, Some("ci-runner-other"), Action::Delete).is_allowed(), "another runner's token");
        assert!(!delete("alice", None, Action::Delete).is_allowed(), "a person");
        assert!(!delete(hooks, Some("ci-runner-4tb9k"), Action::Evict).is_allowed(), "an eviction, even its runner's");
        let Answer::Deny { message, .. } = delete("alice", None, Action::Evict).answer else { panic!() };
        assert!(message.contains("follows Pod/ci-runner-4tb9k"), "{message}");
    }

    /// `judge` for a plain worker's eviction, with `exemptions`.
    fn judge(state: BusyState, requester: Requester<'_>, exemptions: &Exemptions) -> Verdict {
        let config = PolicyConfig { exemptions: exemptions.clone(), ..crate::policy::testing::config() };
        let worker = crate::policy::testing::pod(serde_json::json!({"metadata": {"name": "w"}}));
        super::judge(state, &worker, Taken { action: Action::Evict, preempted: false }, requester, &config)
    }

    #[test]
    fn busy_pod_is_denied() {
        assert_eq!(
            judge(busy(), admin(), &Exemptions::default()),
            Verdict::Deny { since: Some(ts("2026-11-21T20:00:00Z")), until: Some(ts("2026-11-22T20:00:00Z")) }
        );
    }

    #[test]
    fn idle_terminating_terminal_and_unlabelled_pods_are_allowed() {
        for state in [BusyState::Idle, BusyState::Terminating, BusyState::Terminal, BusyState::NotOptedIn] {
            assert_eq!(judge(state, admin(), &Exemptions::default()), Verdict::Allow, "{state:?}");
        }
    }

    #[test]
    fn exempt_user_and_exempt_group_may_delete_busy_pods() {
        let exemptions =
            Exemptions { users: vec!["gc".into()], groups: vec!["ops:breakglass".into()], ..Exemptions::default() };
        let gc = Requester { username: "gc", groups: NO_GROUPS, pod: None };
        assert_eq!(judge(busy(), gc, &exemptions), Verdict::AllowBusy(Override::Exempt(Exempt::User("gc".into()))));
        let groups = vec!["system:authenticated".to_string(), "ops:breakglass".to_string()];
        let person = Requester { username: "alice", groups: &groups, pod: None };
        assert_eq!(
            judge(busy(), person, &exemptions),
            Verdict::AllowBusy(Override::Exempt(Exempt::Group("ops:breakglass".into())))
        );
        assert!(matches!(judge(busy(), admin(), &exemptions), Verdict::Deny { .. }));
    }

    #[test]
    fn the_taint_manager_and_the_namespace_controller_are_never_blocked_and_audited() {
        for (username, reason) in [
            ("system:serviceaccount:kube-system:node-controller", Reason::NodeTaintEviction),
            ("system:serviceaccount:kube-system:taint-eviction-controller", Reason::NodeTaintEviction),
            ("system:serviceaccount:kube-system:namespace-controller", Reason::NamespaceDeleted),
        ] {
            let outcome = busy_decided(ask(username, false), Action::Delete, Mode::Enforce, now());
            assert!(outcome.is_allowed(), "{username}");
            assert_eq!((outcome.decision, reason_of(&outcome)), (Decision::Exempted, Some(reason)), "{username}");
        }
    }

    #[test]
    fn karpenters_delete_at_its_node_deadline_goes_through_but_its_evictions_are_refused() {
        let karpenter = "system:serviceaccount:kube-system:karpenter";
        let deleted = busy_decided(ask(karpenter, false), Action::Delete, Mode::Enforce, now());
        assert!(deleted.is_allowed());
        let audit = deleted.audit.unwrap();
        assert_eq!((audit.decision, audit.reason), (Decision::Exempted, Reason::KarpenterDeadline));
        assert!(audit.detail.contains("terminationGracePeriod"), "{}", audit.detail);
        let evicted = busy_decided(ask(karpenter, false), Action::Evict, Mode::Enforce, now());
        assert!(!evicted.is_allowed(), "a drain or consolidation waits, as for anyone");
    }

    fn with_budget(budget: &str) -> Pod {
        let mut pod = worker(
            "false",
            json!({}),
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}),
        );
        pod.metadata.labels.insert(MAX_UNAVAILABLE.into(), budget.into());
        pod.metadata.uid = "u-w".into();
        pod
    }

    #[test]
    fn a_workload_budget_refuses_taking_one_more_pod_away_than_it_allows() {
        let pod = with_budget("1");
        let decide_with = |siblings, user: &'static str| judged(user, Action::Evict, &pod, siblings);
        let refused = decide_with(Some(1), "alice");
        let Answer::Deny { denial, message } = &refused.answer else { panic!("{:?}", refused.answer) };
        assert_eq!((denial.code(), denial.cause()), (429, "BusyguardDisruptionBudget"));
        assert_eq!(
            message,
            "pod capture/w may not go now: its workload allows 1 unavailable pod(s) at once \
             (busyguard.io/max-unavailable) and 1 already are; retry once they are back"
        );
        assert_eq!(refused.audit.unwrap().reason, Reason::Budget);
        assert!(decide_with(Some(0), "alice").is_allowed(), "within the budget");
        assert!(decide_with(None, "alice").is_allowed(), "the view cannot tell: no budget");
        assert!(decide_with(Some(1), "ops").is_allowed(), "exempt");
        assert!(decide_with(Some(1), "system:serviceaccount:kube-system:namespace-controller").is_allowed());
    }

    #[test]
    fn the_garbage_collector_and_karpenter_delete_past_a_budget_but_karpenter_evicts_within_it() {
        let pod = with_budget("1");
        let karpenter = "system:serviceaccount:kube-system:karpenter";
        let config = config(Mode::Enforce);
        let decide_with = |action, user: &'static str| {
            let siblings = Some(crate::policy::testing::unavailable_siblings(1));
            let disruption = Disruption {
                ask: &ask(user, false),
                taking: taking(action),
                pod: &pod,
                seen: Some(&pod),
                siblings,
                preempted: false,
            };
            judge_disruption(&disruption, &config, now()).is_allowed()
        };
        assert!(decide_with(Action::Delete, GARBAGE_COLLECTOR_USER), "the owner is gone: every pod goes");
        assert!(decide_with(Action::Delete, karpenter), "its node's deadline");
        assert!(!decide_with(Action::Evict, karpenter), "a drain waits, as for anyone");
        assert!(!decide_with(Action::Delete, "alice"));
    }

    #[test]
    fn a_pod_already_unavailable_may_always_go() {
        let mut pod = with_budget("1");
        pod.status.conditions[0].status = "False".into();
        let outcome = judged("alice", Action::Delete, &pod, Some(3));
        assert!(outcome.is_allowed());
    }

    #[test]
    fn a_busy_unready_pod_the_replicaset_picks_is_released_from_it_and_deleted_once_ready() {
        let compat = |hash: Option<&str>| -> Pod {
            let mut labels = json!({BUSY_LABEL: "when-unready"});
            if let Some(hash) = hash {
                labels["pod-template-hash"] = json!(hash);
            }
            serde_json::from_value(json!({"metadata": {"name": "w", "namespace": "capture", "uid": "u-w",
                "labels": labels},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False",
                    "lastTransitionTime": "2026-11-21T20:30:00Z"}]}}))
            .unwrap()
        };
        let replicaset = "system:serviceaccount:kube-system:replicaset-controller";
        let pod = compat(Some("6b8958b477"));
        let outcome = judged(replicaset, Action::Delete, &pod, None);
        assert!(!outcome.is_allowed(), "not deleted while busy");
        assert_eq!(outcome.audit.as_ref().unwrap().reason, Reason::BusyReleased);
        assert!(outcome.await_effects);
        let release = outcome.effects.iter().find(|e| matches!(e, Effect::Release { .. })).expect("released");
        let Effect::Release { hash, request, .. } = release else { unreachable!() };
        assert_eq!((hash.as_str(), request.by.as_str()), ("6b8958b477", replicaset));
        // A person's delete, or a pod no Deployment's ReplicaSet selects by hash: not released.
        let person = judged("alice", Action::Delete, &pod, None);
        assert!(!person.effects.iter().any(|e| matches!(e, Effect::Release { .. })));
        let bare = compat(None);
        let bare = judged(replicaset, Action::Delete, &bare, None);
        assert!(!bare.effects.iter().any(|e| matches!(e, Effect::Release { .. })));
        // An Argo Rollout's ReplicaSet selects its pods by rollouts-pod-template-hash: that goes.
        let mut argo = compat(None);
        argo.metadata.labels.insert("rollouts-pod-template-hash".into(), "7d9c4f".into());
        let outcome = judged(replicaset, Action::Delete, &argo, None);
        let release = outcome.effects.iter().find(|e| matches!(e, Effect::Release { .. })).expect("released");
        let patch = release.pod_write().unwrap().patch;
        assert_eq!(patch["metadata"]["labels"].get("rollouts-pod-template-hash"), Some(&serde_json::Value::Null));
        assert_eq!(patch["metadata"]["annotations"][RELEASED_FROM], "7d9c4f");
    }

    #[test]
    fn a_descheduler_eviction_in_the_background_of_a_busy_pod_is_refused_as_under_way_and_marked() {
        let descheduler = "system:serviceaccount:kube-system:descheduler";
        let mut asking = busy_worker();
        asking.metadata.annotations.get_or_insert_default().insert(REQUEST_EVICT_ONLY.into(), "".into());
        let outcome = judged(descheduler, Action::Evict, &asking, None);
        let Answer::Deny { denial, message } = &outcome.answer else { panic!("{:?}", outcome.answer) };
        assert_eq!(denial.code(), 429);
        assert!(message.contains("; Eviction triggered evacuation: the pod is marked"), "{message}");
        let mark = outcome.effects.iter().find_map(|e| match e {
            Effect::MarkDeleteRequested { request, in_background, .. } => Some((request.by.as_str(), *in_background)),
            _ => None,
        });
        assert_eq!(mark, Some((descheduler, true)));
        assert!(outcome.await_effects, "marked under way before the descheduler reads the answer");
        assert_eq!(
            outcome.effects[1].pod_write().unwrap().patch["metadata"]["annotations"][EVICTION_IN_PROGRESS],
            "true"
        );
        // Without the request, the descheduler's eviction is refused as any other: no mark.
        let plain = judged(descheduler, Action::Evict, &busy_worker(), None);
        assert!(!plain.effects.iter().any(|e| matches!(e, Effect::MarkDeleteRequested { .. })));
        let Answer::Deny { message, .. } = &plain.answer else { panic!() };
        assert!(!message.contains(EVACUATION_TRIGGERED));
    }

    #[test]
    fn a_release_goes_ahead_only_on_a_replicaset_scaling_down_and_never_under_recreate() {
        assert_eq!(release_confirmed(Some(1), Some(2), Some("RollingUpdate")), Ok(()));
        assert_eq!(release_confirmed(Some(1), Some(2), None), Ok(()), "a ReplicaSet of its own");
        assert!(release_confirmed(Some(2), Some(2), None).is_err(), "a forged review: nothing scales down");
        assert!(release_confirmed(None, Some(2), None).is_err());
        assert!(release_confirmed(Some(0), Some(2), Some("Recreate")).is_err());
    }

    #[test]
    fn people_and_the_garbage_collector_get_deferred_deletes_controllers_do_not() {
        let who = |username| defers_delete(Requester { username, groups: &[], pod: None });
        assert!(who("alice"));
        assert!(who("kubernetes-admin"));
        assert!(who("system:admin"));
        assert!(who(GARBAGE_COLLECTOR_USER));
        assert!(!who("system:serviceaccount:kube-system:replicaset-controller"));
        assert!(!who("system:kube-scheduler"));
        assert!(!who("system:node:node-1"));
    }

    // The busy contract's table, one row a test: what a delete or an eviction of the pod gets.

    #[test]
    fn a_persons_delete_of_a_busy_pod_is_refused_429_marked_and_an_event_raised() {
        let outcome = busy_decided(ask("alice", false), Action::Delete, Mode::Enforce, now());
        let Answer::Deny { denial, message } = &outcome.answer else { panic!("{:?}", outcome.answer) };
        assert_eq!((denial.code(), denial.cause()), (429, "BusyguardPodBusy"));
        assert!(message.contains("busyguard records the delete on the pod"), "{message}");
        assert!(outcome.await_effects, "the answer waits for the mark, within its budget");
        assert_eq!(reason_of(&outcome), Some(Reason::BusyDeleteDeferred));
        let pod = PodRef { namespace: "capture".into(), name: "w".into(), uid: "u-w".into() };
        assert_eq!(
            outcome.effects,
            [
                Effect::Event { pod: pod.clone(), action: Action::Delete, note: message.clone() },
                Effect::MarkDeleteRequested {
                    pod,
                    request: DeleteRequest::new("alice", ts("2026-11-21T21:00:00Z")),
                    in_background: false,
                },
            ]
        );
    }

    const JOB_CONTROLLER: &str = "system:serviceaccount:kube-system:job-controller";

    #[test]
    fn a_run_to_completion_pods_own_controller_ends_it_and_no_one_else_does() {
        let mut job_pod = busy_worker();
        job_pod.metadata.labels.insert("batch.kubernetes.io/job-name".into(), "import".into());
        let outcome = judged(JOB_CONTROLLER, Action::Delete, &job_pod, None);
        assert!(outcome.is_allowed(), "the Job's own end: a deadline, a suspend, a backoff limit");
        let audit = outcome.audit.unwrap();
        assert_eq!((audit.decision, audit.reason), (Decision::Exempted, Reason::OwnerController));
        // Its eviction, a person's delete, and the Job controller's delete of a pod not its own.
        assert!(!judged(JOB_CONTROLLER, Action::Evict, &job_pod, None).is_allowed());
        assert!(!judged("alice", Action::Delete, &job_pod, None).is_allowed());
        assert!(!judged(JOB_CONTROLLER, Action::Delete, &busy_worker(), None).is_allowed());
    }

    #[test]
    fn kueues_preemption_of_a_jobs_busy_pod_waits_where_its_namespace_holds_it() {
        let mut job_pod = busy_worker();
        job_pod.metadata.labels.insert("batch.kubernetes.io/job-name".into(), "train".into());
        let ask = ask(JOB_CONTROLLER, false);
        let delete = |preempted| {
            let d = Disruption {
                ask: &ask,
                taking: Taking::Delete,
                pod: &job_pod,
                seen: Some(&job_pod),
                siblings: None,
                preempted,
            };
            judge_disruption(&d, &config(Mode::Enforce), now())
        };
        let held = delete(true);
        let Answer::Deny { denial, .. } = &held.answer else { panic!("let through: {:?}", held.audit) };
        assert_eq!(denial.code(), 429, "a cluster disruption: the Job controller tries again");
        assert_eq!(reason_of(&delete(false)), Some(Reason::OwnerController), "elsewhere, the Job's own end");
    }

    #[test]
    fn a_run_to_completion_pod_goes_with_its_deleted_owner_and_a_workers_waits() {
        let mut job_pod = busy_worker();
        job_pod.metadata.labels.insert("batch.kubernetes.io/job-name".into(), "nightly-29000000".into());
        // CronJob Replace deletes the running Job in background: the garbage collector deletes its pod.
        let outcome = judged(GARBAGE_COLLECTOR_USER, Action::Delete, &job_pod, None);
        assert!(outcome.is_allowed(), "the owner's deletion is the workload's end");
        let audit = outcome.audit.unwrap();
        assert_eq!((audit.decision, audit.reason), (Decision::Exempted, Reason::OwnerDeleted));
        assert!(audit.detail.contains("--cascade=orphan"), "{}", audit.detail);
        // A worker of a ReplicaSet deleted in background still waits for its task.
        let worker = judged(GARBAGE_COLLECTOR_USER, Action::Delete, &busy_worker(), None);
        assert_eq!(reason_of(&worker), Some(Reason::BusyDeleteDeferred));
        assert!(!judged(GARBAGE_COLLECTOR_USER, Action::Evict, &job_pod, None).is_allowed(), "nor an eviction");
    }

    #[test]
    fn a_controllers_delete_of_a_busy_pod_is_refused_without_a_mark() {
        let replicaset = "system:serviceaccount:kube-system:replicaset-controller";
        let outcome = busy_decided(ask(replicaset, false), Action::Delete, Mode::Enforce, now());
        assert!(!outcome.is_allowed());
        assert_eq!(reason_of(&outcome), Some(Reason::Busy));
        assert!(matches!(outcome.effects.as_slice(), [Effect::Event { action: Action::Delete, .. }]));
    }

    #[test]
    fn an_eviction_of_a_busy_pod_is_refused_never_deferred_and_holds_the_pod_from_new_tasks() {
        let outcome = busy_decided(ask("alice", false), Action::Evict, Mode::Enforce, now());
        assert!(!outcome.is_allowed());
        assert_eq!(reason_of(&outcome), Some(Reason::Busy));
        let [Effect::Event { action: Action::Evict, .. }, Effect::MarkDisruptionWanted { pod, request }] =
            outcome.effects.as_slice()
        else {
            panic!("{:?}", outcome.effects)
        };
        assert_eq!((pod.name.as_str(), request), ("w", &DeleteRequest::new("alice", now())));
        assert!(outcome.await_effects, "the mark lands before the evictor reads the answer");
        let Answer::Deny { message, .. } = &outcome.answer else { panic!() };
        assert!(message.ends_with("; busyguard holds it from new tasks (busyguard.io/disruption-requested), so it is idle at a retry after its task ends"), "{message}");
    }

    #[test]
    fn a_refused_eviction_renews_the_hold_at_most_every_third_of_it() {
        let marked_at = |at: &str| {
            let mark = DeleteRequest::new("drain", ts(at)).to_annotation();
            worker(
                "true",
                json!({BUSY_SINCE: "2026-11-21T20:00:00Z", DISRUPTION_REQUESTED: mark}),
                json!({"phase": "Running"}),
            )
        };
        let marks = |pod: &Pod| {
            judged("alice", Action::Evict, pod, None)
                .effects
                .iter()
                .filter(|e| matches!(e, Effect::MarkDisruptionWanted { .. }))
                .count()
        };
        assert_eq!(marks(&marked_at("2026-11-21T20:59:55Z")), 0, "5 s old: still held, not written again");
        assert_eq!(marks(&marked_at("2026-11-21T20:59:50Z")), 1, "10 s old: renewed");
    }

    #[test]
    fn a_review_the_view_does_not_confirm_is_answered_but_acted_on_never() {
        // A forged review (or one ahead of the watch): the pod busyguard sees is idle, or another.
        let idle = worker("false", json!({}), json!({"phase": "Running"}));
        let mut other = busy_worker();
        other.metadata.uid = "u-other".into();
        let busy = busy_worker();
        for seen in [None, Some(&idle as &dyn PodFacts), Some(&other)] {
            let disruption = Disruption {
                ask: &ask("alice", false),
                taking: Taking::Delete,
                pod: &busy,
                seen,
                siblings: None,
                preempted: false,
            };
            let outcome = judge_disruption(&disruption, &config(Mode::Enforce), now());
            assert!(!outcome.is_allowed(), "the request claims a busy pod: refused");
            assert!(outcome.effects.is_empty(), "no Event, no mark: {:?}", outcome.effects);
            let Answer::Deny { message, .. } = &outcome.answer else { panic!() };
            assert!(!message.contains("recorded"), "no deferred delete promised: {message}");
        }
    }

    #[test]
    fn a_dry_run_request_is_judged_the_same_and_changes_nothing() {
        let outcome = busy_decided(ask("alice", true), Action::Delete, Mode::Enforce, now());
        assert!(!outcome.is_allowed());
        assert!(outcome.effects.is_empty());
        assert!(outcome.audit.unwrap().dry_run);
    }

    #[test]
    fn an_already_marked_pod_is_not_marked_again() {
        let mut marked = worker(
            "true",
            json!({BUSY_SINCE: "2026-11-21T20:00:00Z", DELETE_REQUESTED: r#"{"by":"bob","at":"2026-11-21T20:30:00Z"}"#}),
            json!({"phase": "Running"}),
        );
        marked.metadata.labels.insert(DELETE_REQUESTED.into(), "true".into());
        marked.metadata.by_busyguard.mark = true;
        let outcome = judged("alice", Action::Delete, &marked, None);
        assert!(matches!(outcome.effects.as_slice(), [Effect::Event { .. }]));
    }

    #[test]
    fn audit_mode_allows_with_a_warning_and_promises_nothing() {
        let outcome = busy_decided(ask("alice", false), Action::Delete, Mode::Audit, now());
        let Answer::Allow { warnings } = &outcome.answer else { panic!("{:?}", outcome.answer) };
        assert!(warnings[0].starts_with("busyguard audit mode, would deny: pod capture/w is busy"), "{warnings:?}");
        assert!(!warnings[0].contains("delete is recorded"), "nothing is recorded in audit mode");
        assert!(!warnings[0].contains("to force"), "nothing to force: the pod goes: {warnings:?}");
        assert_eq!(outcome.decision, Decision::WouldDeny);
        assert!(outcome.effects.is_empty());
    }

    #[test]
    fn idle_terminating_and_terminal_pods_go_without_an_audit_line() {
        let idle = worker("false", json!({}), json!({"phase": "Running"}));
        let done = worker("true", json!({BUSY_SINCE: "2026-11-21T20:00:00Z"}), json!({"phase": "Succeeded"}));
        let mut going = busy_worker();
        going.metadata.deletion_timestamp = Some(now());
        for pod in [idle, done, going] {
            let outcome = judged("alice", Action::Delete, &pod, None);
            assert_eq!(outcome.decision, Decision::Allowed);
            assert!(outcome.audit.is_none() && outcome.effects.is_empty());
        }
    }

    #[test]
    fn an_exempt_requester_takes_a_busy_pod_and_the_exemption_is_audited() {
        let outcome = busy_decided(ask("ops", false), Action::Evict, Mode::Enforce, now());
        assert_eq!(outcome.decision, Decision::Exempted);
        let audit = outcome.audit.unwrap();
        assert_eq!(
            (audit.reason, audit.detail.as_str()),
            (Reason::ExemptUser, "pod capture/w is busy; user ops is exempt")
        );
        assert_eq!(audit.busy_since, Some(ts("2026-11-21T20:00:00Z")));
    }

    #[test]
    fn a_busy_pod_past_max_busy_goes_and_the_lapse_is_audited() {
        let late = ts("2026-11-22T20:00:01Z");
        let outcome = busy_decided(ask("alice", false), Action::Delete, Mode::Enforce, late);
        assert_eq!(outcome.decision, Decision::Lapsed);
        assert_eq!(reason_of(&outcome), Some(Reason::MaxBusyExceeded));
    }

    #[test]
    fn every_refusal_says_what_busyguard_does_next_in_words_of_its_own() {
        let said = |consequence: Consequence<'_>| consequence.to_string();
        assert_eq!(said(Consequence::Nothing), "");
        assert_eq!(said(Consequence::Told), "");
        assert_eq!(
            said(Consequence::Held),
            "; busyguard holds it from new tasks (busyguard.io/disruption-requested), so it is idle at a retry after \
             its task ends"
        );
        assert_eq!(
            said(Consequence::Deferred { in_background: false }),
            "; busyguard records the delete on the pod (busyguard.io/delete-requested) and carries it out once the \
             pod is idle (if the annotation does not appear, delete again later)"
        );
        assert_eq!(
            said(Consequence::Deferred { in_background: true }),
            format!(
                "; busyguard records the eviction on the pod (busyguard.io/delete-requested) and carries it out once \
                 the pod is idle, as an eviction, so your PodDisruptionBudgets hold; {EVACUATION_TRIGGERED}: the pod \
                 is marked {EVICTION_IN_PROGRESS} and goes once idle"
            )
        );
        assert_eq!(
            said(Consequence::Released { label: "pod-template-hash", hash: "6b8958b477" }),
            "; busyguard takes it out of its ReplicaSet (label pod-template-hash kept in \
             busyguard.io/released-from), so the scale-down completes without it, and deletes it once it is Ready \
             again"
        );
    }

    #[test]
    fn busy_denial_names_the_pod_the_time_and_the_override() {
        let (since, until) =
            (Some("2026-11-21T20:00:00Z".parse().unwrap()), Some("2026-11-22T20:00:00Z".parse().unwrap()));
        let busy = |since, until, by_readiness| Busy { since, until, by_readiness, followed: None };
        let message = busy_denial("capture", "worker-1", &busy(since, until, false), true);
        assert_eq!(
            message,
            "pod capture/worker-1 is busy since 2026-11-21T20:00:00Z (protection lapses at \
             2026-11-22T20:00:00Z at the latest); it will be spared until it is idle; to force: \
             kubectl label pod worker-1 -n capture busyguard.io/busy=false --overwrite"
        );
        assert_eq!(
            busy_denial("ns", "p", &busy(None, until, false), true),
            "pod ns/p is busy, since when busyguard cannot tell (protection lapses at 2026-11-22T20:00:00Z at the \
             latest, counted from the pod's creation); it will be spared until it is idle; to force: kubectl label \
             pod p -n ns busyguard.io/busy=false --overwrite"
        );
        assert_eq!(
            busy_denial("ns", "p", &busy(since, None, true), true),
            "pod ns/p is busy (not Ready) since 2026-11-21T20:00:00Z; it will be spared until it is idle; to force: \
             kubectl label pod p -n ns busyguard.io/busy=false --overwrite"
        );
        let would = busy_denial("ns", "p", &busy(since, None, false), false);
        assert!(!would.contains("spared"), "in dry-run mode the pod goes: {would}");
        let owner = OwnerKey::of("actions.github.com/v1alpha1", "EphemeralRunner", "r");
        let runner = Busy { followed: Some(owner), ..busy(since, None, false) };
        assert_eq!(
            busy_denial("ci", "r", &runner, true),
            "pod ci/r is busy since 2026-11-21T20:00:00Z; it will be spared until it is idle; its busy label follows \
             EphemeralRunner/r, and busyguard writes it: to force, end EphemeralRunner/r's task, or delete the pod as \
             a user busyguard exempts (--exempt-user)"
        );
    }
}
