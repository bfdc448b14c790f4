//! What a change seen on the watch means, decided whole: a deferred delete that may now go
//! ahead, busyguard's annotations gone stale (a flip busyguard missed, a lapse of protection),
//! or a busy pod lost without any request busyguard could refuse.

use jiff::Timestamp;

use super::ask::Operation;
use super::busy::{BusyState, busy_state};
use super::config::PolicyConfig;
use super::hold;
use super::keys::{BUSY_LABEL, DELETE_REQUESTED, DISRUPTION_REQUESTED, DeleteRequest, EVICTION_IN_PROGRESS};
use super::marks::plan;
use super::outcome::{AuditRecord, Decision, Effect, LossCause, Reason, Subject};
use super::pod::PodRef;
use super::pod::{Phase, PodFacts};

/// A busy pod lost, to be reported once: its cause, and the audit line to write.
#[derive(Debug, Clone, PartialEq)]
pub struct Loss {
    pub cause: LossCause,
    pub audit: AuditRecord,
}

impl Loss {
    fn of(
        pod: &PodRef,
        cause: LossCause,
        busy_since: Option<Timestamp>,
        config: &PolicyConfig,
        now: Timestamp,
    ) -> Loss {
        let detail = lost(pod, &cause);
        let audit = AuditRecord {
            busy_since,
            ..AuditRecord::new(Subject::Pod(pod), (cause.decision(), cause.reason()), detail, config.mode, now)
        };
        Loss { cause, audit }
    }

    /// Reported through the API server, so that of several replicas only one reports it.
    pub fn report(self, pod: &PodRef) -> Effect {
        Effect::ReportLoss { pod: pod.clone(), cause: self.cause, audit: Box::new(self.audit) }
    }
}

/// What to do about a change.
#[derive(Debug, Default, PartialEq)]
pub struct Observed {
    pub effects: Vec<Effect>,
    /// A busy pod lost. A vanishing is only a loss if the pod is really gone: a pod whose busy
    /// label was removed leaves the watch the same way, so the caller checks first.
    pub loss: Option<Loss>,
}

/// `before` and `after` are the same pod as last seen and as seen now (`None`: deleted).
pub fn on_change<P: PodFacts>(
    pod: &PodRef,
    before: Option<&P>,
    after: Option<&P>,
    config: &PolicyConfig,
    now: Timestamp,
) -> Observed {
    let was_busy = before.map(|p| busy_state(p, config.max_busy, now)).and_then(|s| match s {
        BusyState::Busy { since, .. } => Some(since),
        _ => None,
    });
    let was_terminating = before.is_some_and(|p| p.is_terminating());
    let cause = match (was_busy, after) {
        (Some(_), None) => Some(LossCause::Vanished),
        (Some(_), Some(now_))
            if now_.phase() == Phase::Failed && !now_.is_terminating() && failed_by_disruption(now_) =>
        {
            // The kubelet's reason on the pod, else its DisruptionTarget condition's.
            let reason = now_.status_reason().or(now_.disruption());
            Some(LossCause::Failed { reason: reason.map(str::to_string) })
        }
        (Some(_), Some(now_)) if now_.is_terminating() && !was_terminating => {
            now_.disruption().map(|reason| LossCause::Disrupted { reason: reason.to_string() })
        }
        _ => None,
    };
    if let Some(cause) = cause {
        return Observed { effects: Vec::new(), loss: Some(Loss::of(pod, cause, was_busy.flatten(), config, now)) };
    }
    let effects = after.map(|p| due(pod, p, config, now)).unwrap_or_default();
    Observed { effects, loss: None }
}

/// The reasons with which the kubelet fails a pod that was taken, not one that ended by itself:
/// node-pressure eviction, preemption at admission, a node shutdown.
const KUBELET_DISRUPTIONS: [&str; 4] = ["Evicted", "Preempting", "Terminated", "Shutdown"];

/// Whether a pod turned Failed because something took it (a kubelet disruption reason, or a
/// `DisruptionTarget` condition), rather than by its own end: a task that exited non-zero under
/// `restartPolicy: Never`, or its own `activeDeadlineSeconds` (`DeadlineExceeded`), is the
/// workload's end, not a loss.
fn failed_by_disruption(pod: &impl PodFacts) -> bool {
    pod.disruption().is_some() || pod.status_reason().is_some_and(|reason| KUBELET_DISRUPTIONS.contains(&reason))
}

/// A pod missing from a relist, last seen as `before`: what `on_change` says of a pod deleted,
/// except that a busy one is unaccounted for rather than lost, since busyguard did not see it go.
pub fn gone_unwatched<P: PodFacts>(pod: &PodRef, before: &P, config: &PolicyConfig, now: Timestamp) -> Observed {
    let loss = match busy_state(before, config.max_busy, now) {
        BusyState::Busy { since, .. } => Some(Loss::of(pod, LossCause::Unwatched, since, config, now)),
        _ => None,
    };
    Observed { effects: Vec::new(), loss }
}

/// What is due for the pod as it is now, whatever changed: its deferred delete once it is no
/// longer protected, else busyguard's annotations brought up to date. Also asked on a timer, so
/// that a protection running out is acted on without waiting for a change.
pub fn due(pod: &PodRef, now_seen: &impl PodFacts, config: &PolicyConfig, now: Timestamp) -> Vec<Effect> {
    // Opted out (the label removed) counts as idle: nothing protects the pod any more. Nor
    // does anything protect a pod that finished (a bare or Job pod with `restartPolicy: Never`):
    // the delete asked for is carried out, not left with a Completed pod.
    if let Some(request) = now_seen.delete_request()
        && matches!(
            busy_state(now_seen, config.max_busy, now),
            BusyState::Idle | BusyState::Lapsed { .. } | BusyState::NotOptedIn | BusyState::Terminal
        )
    {
        let detail = deleted_when_idle(pod, &request);
        let audit = AuditRecord {
            operation: Some(Operation::Delete),
            user: request.by.clone(),
            ..AuditRecord::new(
                Subject::Pod(pod),
                (Decision::DeletedWhenIdle, Reason::DeleteRequested),
                detail,
                config.mode,
                now,
            )
        };
        let resource_version = now_seen.resource_version().to_string();
        return vec![Effect::DeleteIdle { pod: pod.clone(), resource_version, request, audit: Box::new(audit) }];
    }
    let mut plan = plan(now_seen, None, config.mutation, config.max_busy, now);
    for mark in marks_over(now_seen, config, now) {
        plan.annotations.insert(mark, None);
    }
    if plan.is_empty() {
        return Vec::new();
    }
    let resource_version = now_seen.resource_version().to_string();
    vec![Effect::Refresh { pod: pod.clone(), resource_version, plan }]
}

/// Marks of busyguard's whose time is over: a refused eviction's after its hold, and the
/// descheduler's eviction-in-progress once the deferred eviction was called off (its
/// delete-requested label removed), so the descheduler no longer counts the pod as going. Only
/// on a pod still opted in: the annotation is not busyguard's own key, and a pod that carries
/// none of busyguard's keys is out of its token's reach (the base's fence) and of its care;
/// `busyguard cleanup` takes it off there.
fn marks_over(pod: &impl PodFacts, config: &PolicyConfig, now: Timestamp) -> Vec<&'static str> {
    let mut over = Vec::new();
    // Over, or unreadable: either way it holds nothing.
    if pod.annotation(DISRUPTION_REQUESTED).is_some() && hold::eviction_hold(pod, config.holds, now).is_none() {
        over.push(DISRUPTION_REQUESTED);
    }
    let opted_in = pod.label(BUSY_LABEL).is_some();
    if opted_in && pod.annotation(EVICTION_IN_PROGRESS).is_some() && pod.label(DELETE_REQUESTED).is_none() {
        over.push(EVICTION_IN_PROGRESS);
    }
    over
}

/// A busy pod gone without a request busyguard could refuse.
pub fn lost(pod: &PodRef, cause: &LossCause) -> String {
    match cause {
        LossCause::Failed { reason } => {
            let taken_by = match reason.as_deref() {
                Some("Shutdown" | "Terminated") => {
                    "a shutdown of its node (a spot interruption, a node stopped or replaced)"
                }
                Some("Evicted") => "its kubelet's node-pressure eviction",
                Some("Preempting") => "its kubelet's preemption at admission, for a critical pod",
                _ => {
                    "its kubelet: a node-pressure eviction, a shutdown of its node (a spot interruption among them) \
                      or a preemption at admission"
                }
            };
            format!(
                "busy pod {pod} failed ({}) without a request busyguard could refuse: taken by {taken_by}",
                reason.as_deref().unwrap_or("no reason given")
            )
        }
        LossCause::Vanished => {
            format!("busy pod {pod} disappeared without a graceful delete: node lost or deleted with --force")
        }
        LossCause::Disrupted { reason } => format!(
            "busy pod {pod} is being taken away ({reason}) by a disruption busyguard did not refuse: it was down, \
             overloaded or its view stale, or the requester was exempt"
        ),
        LossCause::Unwatched => format!(
            "busy pod {pod} went while busyguard's watch was down: deleted by a request busyguard allowed (an \
             audit line of the replica that judged it says so), or lost; the API server's audit log tells which"
        ),
    }
}

/// A deferred delete carried out.
pub fn deleted_when_idle(pod: &PodRef, request: &DeleteRequest) -> String {
    format!("pod {pod} is idle: deleted as {} asked at {} while it was busy", request.by, request.at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::cost::busy_cost;
    use crate::policy::keys::DELETION_COST;
    use crate::policy::keys::{AUTOSCALER_SAFE_TO_EVICT, IDLE_COST, KARPENTER_DO_NOT_DISRUPT};
    use crate::policy::keys::{BUSY_LABEL, BUSY_SINCE};
    use crate::policy::keys::{DELETE_REQUESTED, DeleteRequest};
    use crate::policy::marks::{Changes, Plan};
    use crate::policy::patches::json_patch;
    use crate::policy::pod::Pod;
    use crate::policy::testing::*;
    use serde_json::json;

    fn since() -> Timestamp {
        "2026-11-21T20:00:00Z".parse().unwrap()
    }

    fn target() -> PodRef {
        PodRef { namespace: "capture".into(), name: "w".into(), uid: "u-w".into() }
    }

    /// A pod with busyguard's annotations as the mutating webhook leaves them for `label`.
    fn pod(label: &str, extra_annotations: serde_json::Value, status: serde_json::Value) -> Pod {
        serde_json::from_value(pod_json(label, extra_annotations, status)).unwrap()
    }

    /// `pod`'s JSON, for a test that patches it as the API server would.
    fn pod_json(label: &str, extra_annotations: serde_json::Value, status: serde_json::Value) -> serde_json::Value {
        let mut annotations = if label == "true" {
            json!({BUSY_SINCE: since().to_string(), DELETION_COST: busy_cost(since()).to_string(),
                   KARPENTER_DO_NOT_DISRUPT: "true", AUTOSCALER_SAFE_TO_EVICT: "false"})
        } else {
            json!({})
        };
        annotations.as_object_mut().unwrap().extend(extra_annotations.as_object().unwrap().clone());
        let mut labels = json!({BUSY_LABEL: label});
        if label == "true" {
            labels["busyguard.io/protected"] = json!("true");
        }
        if annotations.get(DELETE_REQUESTED).is_some() {
            labels[DELETE_REQUESTED] = json!("true");
        }
        json!({"metadata": {"uid": "u-w", "resourceVersion": "7",
            "labels": labels, "annotations": annotations, "managedFields": marked_by_busyguard()},
            "status": status})
    }

    fn requested() -> serde_json::Value {
        json!({DELETE_REQUESTED: r#"{"by":"alice","at":"2026-11-21T20:30:00Z"}"#})
    }

    fn running() -> serde_json::Value {
        json!({"phase": "Running"})
    }

    #[test]
    fn marked_pod_turning_idle_is_deleted_now_and_the_delete_audited_for_its_requester() {
        let busy = pod("true", requested(), running());
        let idle = pod("false", requested(), running());
        let observed = on_change(&target(), Some(&busy), Some(&idle), &config(), now());
        let [Effect::DeleteIdle { pod, resource_version, request, audit }] = observed.effects.as_slice() else {
            panic!("{observed:?}")
        };
        assert_eq!((pod, resource_version.as_str()), (&target(), "7"));
        assert_eq!(request, &DeleteRequest::new("alice", "2026-11-21T20:30:00Z".parse().unwrap()));
        assert_eq!(
            (audit.decision, audit.reason, audit.user.as_str()),
            (Decision::DeletedWhenIdle, Reason::DeleteRequested, "alice")
        );
        assert_eq!(
            on_change(&target(), Some(&busy), Some(&busy), &config(), now()),
            Observed::default(),
            "still busy: wait"
        );
    }

    #[test]
    fn marked_pod_already_terminating_is_not_deleted_again() {
        let mut idle = pod("false", requested(), running());
        idle.metadata.deletion_timestamp = Some(now());
        assert_eq!(on_change(&target(), None, Some(&idle), &config(), now()), Observed::default());
    }

    #[test]
    fn marked_pod_that_finishes_busy_is_deleted_as_asked() {
        let busy = pod("true", requested(), running());
        let finished = pod("true", requested(), json!({"phase": "Succeeded"}));
        let observed = on_change(&target(), Some(&busy), Some(&finished), &config(), now());
        assert!(matches!(observed.effects.as_slice(), [Effect::DeleteIdle { .. }]), "{observed:?}");
        let failed = pod("true", requested(), json!({"phase": "Failed"}));
        assert!(matches!(due(&target(), &failed, &config(), now()).as_slice(), [Effect::DeleteIdle { .. }]));
    }

    #[test]
    fn marked_pod_past_max_busy_is_deleted_on_the_timer_without_any_change() {
        let busy = pod("true", requested(), running());
        let later: Timestamp = "2026-11-22T20:00:00Z".parse().unwrap();
        assert_eq!(due(&target(), &busy, &config(), now()), Vec::new(), "still protected");
        assert!(matches!(due(&target(), &busy, &config(), later).as_slice(), [Effect::DeleteIdle { .. }]));
    }

    #[test]
    fn a_flip_to_idle_busyguard_missed_is_restored_by_a_refresh() {
        let mut missed = pod("true", json!({IDLE_COST: "3"}), running());
        missed.metadata.labels.insert(BUSY_LABEL.into(), "false".into());
        let effects = due(&target(), &missed, &config(), now());
        let [Effect::Refresh { plan, resource_version, .. }] = effects.as_slice() else { panic!("{effects:?}") };
        assert_eq!(resource_version, "7");
        assert_eq!(plan.annotations.get(DELETION_COST), Some(&Some("3".to_string())));
        assert_eq!(plan.annotations.get(KARPENTER_DO_NOT_DISRUPT), Some(&None));
    }

    #[test]
    fn a_protection_that_runs_out_takes_the_protected_label_off_so_the_busy_pdb_lets_the_pod_go() {
        let busy = pod("true", json!({}), running());
        let later: Timestamp = "2026-11-22T20:00:00Z".parse().unwrap();
        let effects = due(&target(), &busy, &config(), later);
        let [Effect::Refresh { plan, .. }] = effects.as_slice() else { panic!("{effects:?}") };
        assert_eq!(plan.protected, Some(false));
    }

    #[test]
    fn a_tekton_pod_whose_steps_ended_loses_its_protected_label_and_busy_values_while_its_sidecar_runs() {
        let status = json!({"phase": "Running", "containerStatuses": [
            {"name": "step-build", "state": {"terminated": {"exitCode": 0, "finishedAt": "2026-11-21T20:50:00Z"}}},
            {"name": "sidecar-db", "state": {"running": {"startedAt": "2026-11-21T20:00:00Z"}}}]});
        let mut doc = pod_json("true", json!({IDLE_COST: "3"}), status);
        doc["metadata"]["labels"]["tekton.dev/taskRun"] = json!("build");
        let ended: Pod = serde_json::from_value(doc.clone()).unwrap();
        let effects = due(&target(), &ended, &config(), now());
        let [Effect::Refresh { plan, .. }] = effects.as_slice() else { panic!("{effects:?}") };
        // Unprotected, so the busy-pod PDB lets a drain take it; Karpenter's and cluster-autoscaler's
        // marks gone, so they may take its node; the user's own cost back.
        let idle = Changes::from([
            (BUSY_SINCE, None),
            (DELETION_COST, Some("3".to_string())),
            (IDLE_COST, None),
            (KARPENTER_DO_NOT_DISRUPT, None),
            (AUTOSCALER_SAFE_TO_EVICT, None),
        ]);
        assert_eq!(plan, &Plan { annotations: idle, protected: Some(false), ..Plan::default() });
        json_patch::patch(&mut doc, &json_patch(&ended, plan)).expect("the plan applies to its pod");
        let refreshed: Pod = serde_json::from_value(doc).unwrap();
        assert_eq!(refreshed.label(BUSY_LABEL), Some("true"), "the flag is the pod's own");
        assert_eq!(due(&target(), &refreshed, &config(), now()), Vec::new(), "once written, nothing more is due");
    }

    #[test]
    fn a_refused_evictions_mark_goes_after_its_hold_and_the_deschedulers_with_a_called_off_eviction() {
        let removed = |effects: Vec<Effect>| match effects.as_slice() {
            [Effect::Refresh { plan, .. }] => {
                plan.annotations.iter().filter(|(_, v)| v.is_none()).map(|(k, _)| *k).collect()
            }
            _ => Vec::new(),
        };
        let marked = json!({DISRUPTION_REQUESTED: r#"{"by":"drain","at":"2026-11-21T20:59:45Z"}"#});
        let held = pod("false", marked.clone(), running());
        assert_eq!(removed(due(&target(), &held, &config(), now())), Vec::<&str>::new(), "15 s old: held");
        let later = "2026-11-21T21:00:15Z".parse().unwrap();
        assert_eq!(removed(due(&target(), &held, &config(), later)), [DISRUPTION_REQUESTED], "30 s old: over");
        let called_off = pod("false", json!({EVICTION_IN_PROGRESS: "true"}), running());
        assert_eq!(removed(due(&target(), &called_off, &config(), now())), [EVICTION_IN_PROGRESS]);
        let mut left_the_contract = called_off.clone();
        left_the_contract.metadata.labels.remove(BUSY_LABEL);
        assert_eq!(
            removed(due(&target(), &left_the_contract, &config(), now())),
            Vec::<&str>::new(),
            "not busyguard's"
        );
        let mut under_way = pod("true", json!({EVICTION_IN_PROGRESS: "true"}), running());
        under_way.metadata.labels.insert(DELETE_REQUESTED.into(), "true".into());
        assert_eq!(removed(due(&target(), &under_way, &config(), now())), Vec::<&str>::new(), "still under way");
    }

    #[test]
    fn a_pod_up_to_date_needs_nothing() {
        assert_eq!(due(&target(), &pod("true", json!({}), running()), &config(), now()), Vec::new());
        assert_eq!(due(&target(), &pod("false", json!({}), running()), &config(), now()), Vec::new());
    }

    #[test]
    fn busy_pod_failed_by_the_kubelet_is_a_loss_with_its_reason() {
        let busy = pod("true", json!({}), running());
        let evicted = pod("true", json!({}), json!({"phase": "Failed", "reason": "Evicted"}));
        let observed = on_change(&target(), Some(&busy), Some(&evicted), &config(), now());
        let Loss { cause, audit } = observed.loss.unwrap();
        assert_eq!(cause, LossCause::Failed { reason: Some("Evicted".into()) });
        assert_eq!((audit.decision, audit.reason, audit.busy_since), (Decision::Lost, Reason::Failed, Some(since())));
    }

    #[test]
    fn a_busy_pod_its_node_shutdown_took_is_said_to_be_lost_to_the_shutdown_by_the_kubelets_reason() {
        let busy = pod("true", json!({}), running());
        let shut_down = pod(
            "true",
            json!({}),
            json!({"phase": "Failed", "conditions": [{"type": "DisruptionTarget", "status": "True",
                "reason": "TerminationByKubelet", "message": "Pod was terminated in response to imminent node shutdown."}]}),
        );
        let Loss { cause, .. } = on_change(&target(), Some(&busy), Some(&shut_down), &config(), now()).loss.unwrap();
        assert_eq!(cause, LossCause::Failed { reason: Some("TerminationByKubelet".into()) });
        assert!(lost(&target(), &cause).contains("(TerminationByKubelet)"), "{}", lost(&target(), &cause));
        let said_by_kubelet = pod("true", json!({}), json!({"phase": "Failed", "reason": "Terminated"}));
        let Loss { cause, .. } =
            on_change(&target(), Some(&busy), Some(&said_by_kubelet), &config(), now()).loss.unwrap();
        assert!(
            lost(&target(), &cause)
                .ends_with("taken by a shutdown of its node (a spot interruption, a node stopped or replaced)"),
            "{}",
            lost(&target(), &cause)
        );
    }

    #[test]
    fn a_task_that_fails_by_itself_or_by_its_own_deadline_is_no_loss() {
        let busy = pod("true", json!({}), running());
        for status in [
            json!({"phase": "Failed"}),
            json!({"phase": "Failed", "reason": "DeadlineExceeded"}),
            json!({"phase": "Failed", "reason": "Error"}),
        ] {
            let failed = pod("true", json!({}), status.clone());
            assert_eq!(on_change(&target(), Some(&busy), Some(&failed), &config(), now()).loss, None, "{status}");
        }
        let shut_down = pod("true", json!({}), json!({"phase": "Failed", "reason": "Terminated"}));
        assert!(on_change(&target(), Some(&busy), Some(&shut_down), &config(), now()).loss.is_some(), "node shutdown");
        let disrupted = pod(
            "true",
            json!({}),
            json!({"phase": "Failed", "conditions": [
            {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}]}),
        );
        assert!(
            on_change(&target(), Some(&busy), Some(&disrupted), &config(), now()).loss.is_some(),
            "DisruptionTarget"
        );
    }

    #[test]
    fn a_busy_pod_taken_into_termination_by_an_eviction_busyguard_did_not_refuse_is_a_loss() {
        let busy = pod("true", json!({}), running());
        let mut evicted = pod(
            "true",
            json!({}),
            json!({"phase": "Running", "conditions": [
            {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]}),
        );
        evicted.metadata.deletion_timestamp = Some(now());
        let observed = on_change(&target(), Some(&busy), Some(&evicted), &config(), now());
        let Loss { cause, audit } = observed.loss.unwrap();
        assert_eq!(cause, LossCause::Disrupted { reason: "EvictionByEvictionAPI".into() });
        assert_eq!((audit.decision, audit.reason), (Decision::Lost, Reason::Disrupted));
        // Terminating for another reason (a delete busyguard allowed, the kubelet's): not this.
        let mut deleted = pod("true", json!({}), running());
        deleted.metadata.deletion_timestamp = Some(now());
        assert_eq!(on_change(&target(), Some(&busy), Some(&deleted), &config(), now()).loss, None);
    }

    #[test]
    fn a_marked_pod_whose_label_was_removed_is_deleted_as_asked() {
        let mut opted_out = pod("false", requested(), running());
        opted_out.metadata.labels.remove(BUSY_LABEL);
        assert!(matches!(due(&target(), &opted_out, &config(), now()).as_slice(), [Effect::DeleteIdle { .. }]));
    }

    #[test]
    fn busy_pod_vanishing_is_a_loss_but_an_idle_one_is_not() {
        let busy = pod("true", json!({}), running());
        let observed = on_change(&target(), Some(&busy), None, &config(), now());
        assert!(matches!(observed.loss, Some(Loss { cause: LossCause::Vanished, .. })));
        let idle = pod("false", json!({}), running());
        assert_eq!(on_change(&target(), Some(&idle), None, &config(), now()), Observed::default());
    }

    #[test]
    fn a_busy_pod_missing_from_a_relist_is_unaccounted_for_not_lost_and_an_idle_one_is_nothing() {
        let busy = pod("true", json!({}), running());
        let Loss { cause, audit } = gone_unwatched(&target(), &busy, &config(), now()).loss.unwrap();
        assert_eq!(cause, LossCause::Unwatched);
        assert_eq!(
            (audit.decision, audit.reason, audit.busy_since),
            (Decision::Unaccounted, Reason::Unwatched, Some(since()))
        );
        assert!(audit.detail.contains("deleted by a request busyguard allowed"), "{}", audit.detail);
        let idle = pod("false", json!({}), running());
        assert_eq!(gone_unwatched(&target(), &idle, &config(), now()), Observed::default());
    }
}
