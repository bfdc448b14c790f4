//! The busy rule's answer for one pod and one requester: whether a pod marked busy may be taken
//! away by whoever asks, and why (recovery, an exempt user or group, a lapsed protection, the end
//! its workload or its node chose). Pod deletes and evictions (`disruption`) and the workload
//! budget ask it; a node's or NodeClaim's delete, which takes every pod on it, `node` answers.

use jiff::Timestamp;

use super::ask::Requester;
use super::busy::{BusyState, Lapse};
use super::config::{Exempt, Exemptions, PolicyConfig};
use super::outcome::{Action, Decision, Reason};
use super::pod::{OwnerKey, PodFacts};
use super::requesters::{GARBAGE_COLLECTOR_USER, NAMESPACE_CONTROLLER_USER, TAINT_MANAGER_USERS};

/// The busy rule's answer for one pod and one requester.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing busy is at stake.
    Allow,
    /// A pod marked busy goes anyway, for the reason given (audited).
    AllowBusy(Override),
    /// The pod is busy and protected.
    Deny { since: Option<Timestamp>, until: Option<Timestamp> },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Override {
    Lapsed {
        since: Timestamp,
        lapse: Lapse,
    },
    /// A configured user or group.
    Exempt(Exempt),
    /// Recovery is never blocked: the taint manager clears a dead node (the work there is lost
    /// either way; refusing only keeps the ReplicaSet from replacing the pod), and the namespace
    /// controller empties a namespace being deleted (as a PodDisruptionBudget lets both through).
    NodeTaintEviction,
    NamespaceDeleted,
    /// Karpenter deletes a pod (rather than evicting it) only when its node's
    /// terminationGracePeriod is running out: the instance goes at the deadline anyway, and a
    /// refusal would only turn the pod's graceful shutdown into a hard kill.
    KarpenterDeadline,
    /// A run-to-completion pod deleted by its own owner's controller (`--owner-controller-user`):
    /// the workload decides its own end; busyguard protects it from the cluster only.
    OwnerController,
    /// A run-to-completion pod deleted by the garbage collector: its owner was deleted (a
    /// person's `kubectl delete job`, CronJob `Replace` ending the run it replaces), which is
    /// the workload's end too. `--cascade=orphan` is how one keeps the pods.
    OwnerDeleted,
    /// A pod deleted with its leader's own token: the pod it is busy with (`--busy-with-pod`:
    /// the runner's hooks cleaning up the workflow pod of the job they ran), or the pod that
    /// controls it (a Spark driver removing its executor).
    Leader,
}

impl Override {
    pub fn decision(&self) -> Decision {
        match self {
            Override::Lapsed { .. } => Decision::Lapsed,
            Override::Exempt(_)
            | Override::NodeTaintEviction
            | Override::NamespaceDeleted
            | Override::KarpenterDeadline
            | Override::OwnerController
            | Override::OwnerDeleted
            | Override::Leader => Decision::Exempted,
        }
    }

    pub fn reason(&self) -> Reason {
        match self {
            Override::Lapsed { lapse: Lapse::MaxBusy { .. }, .. } => Reason::MaxBusyExceeded,
            Override::Lapsed { lapse: Lapse::Restarted { .. }, .. } => Reason::StaleAfterRestart,
            Override::Lapsed { lapse: Lapse::Interrupted, .. } => Reason::Interrupted,
            Override::Exempt(exempt) => exempt.reason(),
            Override::NodeTaintEviction => Reason::NodeTaintEviction,
            Override::NamespaceDeleted => Reason::NamespaceDeleted,
            Override::KarpenterDeadline => Reason::KarpenterDeadline,
            Override::OwnerController => Reason::OwnerController,
            Override::OwnerDeleted => Reason::OwnerDeleted,
            Override::Leader => Reason::Leader,
        }
    }
}

/// What a pod is taken away by, beside who asks: the action, and whether Kueue preempted its
/// Job where its namespace holds that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    pub action: Action,
    pub preempted: bool,
}

/// The busy rule's answer, whole: a `Deny` is final, no other question overrules it.
pub fn judge(
    state: BusyState,
    pod: &(impl PodFacts + ?Sized),
    taken: Taken,
    requester: Requester<'_>,
    config: &PolicyConfig,
) -> Verdict {
    match state {
        BusyState::NotOptedIn | BusyState::Idle | BusyState::Terminating | BusyState::Terminal => Verdict::Allow,
        BusyState::Lapsed { since, lapse } => Verdict::AllowBusy(Override::Lapsed { since, lapse }),
        BusyState::Busy { since, until } => {
            let over = let_through(requester, &config.exemptions)
                .or_else(|| deleted_as_its_end(taken, pod, requester, config));
            match over {
                Some(over) => Verdict::AllowBusy(over),
                None => Verdict::Deny { since, until },
            }
        }
    }
}

/// Whether a workload's budget holds this disruption: not a restart (the pod stays), not for
/// recovery and exempt requesters, nor for deletes that must not wait.
pub fn budget_holds(action: Action, requester: Requester<'_>, config: &PolicyConfig) -> bool {
    action != Action::Restart
        && !must_not_wait(action, requester, config)
        && let_through(requester, &config.exemptions).is_none()
}

/// Who takes a pod away whatever protects it: recovery (the taint manager, the namespace
/// controller), then exempt users and groups.
fn let_through(requester: Requester<'_>, exemptions: &Exemptions) -> Option<Override> {
    if TAINT_MANAGER_USERS.contains(&requester.username) {
        return Some(Override::NodeTaintEviction);
    }
    if requester.username == NAMESPACE_CONTROLLER_USER {
        return Some(Override::NamespaceDeleted);
    }
    exemptions.of(requester).map(Override::Exempt)
}

/// A busy pod's delete that is no disruption but the end its workload chose, or its node's: by
/// Karpenter at its node's deadline; of a run-to-completion pod, by its owner's controller
/// (unless Kueue `preempted` its Job, where its namespace holds that: the cluster takes it then)
/// or by the garbage collector (which deletes a pod only once its owner is gone or going); of a
/// pod busy with its leader, or controlled by a pod, with that pod's own token.
fn deleted_as_its_end(
    taken: Taken,
    pod: &(impl PodFacts + ?Sized),
    requester: Requester<'_>,
    config: &PolicyConfig,
) -> Option<Override> {
    let Taken { action, preempted } = taken;
    if action != Action::Delete {
        return None;
    }
    let user = requester.username;
    if config.exemptions.is_karpenter(user) {
        return Some(Override::KarpenterDeadline);
    }
    if pod.runs_to_completion().is_some() {
        if config.exemptions.is_owner_controller(user) && !preempted {
            return Some(Override::OwnerController);
        }
        if user == GARBAGE_COLLECTOR_USER {
            return Some(Override::OwnerDeleted);
        }
    }
    let by_its_leader = config.leader_of(pod).is_some_and(|leader| requester.pod == Some(leader));
    let owning_pod = pod.owner_key().filter(OwnerKey::is_pod);
    let by_its_owning_pod = owning_pod.is_some_and(|owner| requester.pod == Some(owner.name));
    (by_its_leader || by_its_owning_pod).then_some(Override::Leader)
}

/// Deletes that must not wait on a workload's budget either: the garbage collector's (the owner
/// is gone, every pod goes) and Karpenter's (its node's deadline: the instance goes anyway).
fn must_not_wait(action: Action, requester: Requester<'_>, config: &PolicyConfig) -> bool {
    let user = requester.username;
    action == Action::Delete && (user == GARBAGE_COLLECTOR_USER || config.exemptions.is_karpenter(user))
}

impl Override {
    /// Why the busy pod `namespace/name` was let go.
    pub fn detail(&self, namespace: &str, name: &str) -> String {
        let pod = format!("pod {namespace}/{name}");
        match self {
            Override::Lapsed { since, lapse: Lapse::MaxBusy { limit } } => {
                format!("{pod} busy since {since} for longer than max-busy {limit:#}: no longer protected")
            }
            Override::Lapsed { since, lapse: Lapse::Interrupted } => format!(
                "{pod} busy since {since}, but its node's spot instance is being reclaimed: its task gets its SIGTERM now \
             rather than none when the instance goes"
            ),
            Override::Lapsed { since, lapse: Lapse::Restarted { at } } => {
                format!("{pod} marked busy since {since}, but a container restarted at {at}: the flag is stale")
            }
            Override::Exempt(Exempt::User(user)) => format!("{pod} is busy; user {user} is exempt"),
            Override::Exempt(Exempt::Group(group)) => format!("{pod} is busy; group {group} is exempt"),
            Override::NodeTaintEviction => format!(
                "{pod} is busy; deleted by the taint manager (its node is NotReady, unreachable or tainted NoExecute): \
             the work on a lost node is gone either way, and a refusal would only keep the pod from being replaced"
            ),
            Override::NamespaceDeleted => format!("{pod} is busy; its namespace is being deleted"),
            Override::KarpenterDeadline => format!(
                "{pod} is busy; Karpenter deletes it as its node's terminationGracePeriod runs out: the instance goes at \
             the deadline anyway, so the pod gets its graceful shutdown now (the task is lost)"
            ),
            Override::OwnerController => format!(
                "{pod} is busy; its own controller ends it (a deadline, a suspend, a backoff limit, a success policy, a \
             lowered parallelism; a stop, cancel or timeout): the workload decides its own end"
            ),
            Override::OwnerDeleted => format!(
                "{pod} is busy; the garbage collector deletes it because its owner was deleted (a delete of its Job, \
             CronJob Replace): the workload's end (--cascade=orphan keeps the pods)"
            ),
            Override::Leader => {
                format!("{pod} is busy with the pod it works for, whose own token deletes it: that pod's task ends it")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::{config, pod};
    use serde_json::json;

    const KARPENTER: &str = "system:serviceaccount:karpenter:karpenter";
    const JOB_CONTROLLER: &str = "system:serviceaccount:kube-system:job-controller";

    fn requester(username: &str) -> Requester<'_> {
        Requester { username, groups: &[], pod: None }
    }

    /// Who takes a busy, protected pod away, by action and requester, for a worker and for a
    /// Job's pod: the whole of it, as every path reads it (`judge`), with the budget's own reading
    /// beside it.
    #[test]
    fn who_takes_a_busy_pod_away_and_why() {
        let mut config = config();
        config.exemptions.karpenter = vec![KARPENTER.into()];
        config.exemptions.owner_controllers = vec![JOB_CONTROLLER.into()];
        config.exemptions.users = vec!["breakglass".into()];
        let worker = pod(json!({"metadata": {"name": "w", "labels": {"busyguard.io/busy": "true"}}}));
        let job_pod = pod(json!({"metadata": {"name": "j",
            "labels": {"busyguard.io/busy": "true", "batch.kubernetes.io/job-name": "import"}}}));
        let (delete, evict, restart) = (Action::Delete, Action::Evict, Action::Restart);
        let taint_manager = TAINT_MANAGER_USERS[0];
        let table: [(Action, &str, &crate::policy::pod::Pod, Option<Override>); 13] = [
            (delete, taint_manager, &worker, Some(Override::NodeTaintEviction)),
            (evict, NAMESPACE_CONTROLLER_USER, &worker, Some(Override::NamespaceDeleted)),
            (evict, "breakglass", &worker, Some(Override::Exempt(Exempt::User("breakglass".into())))),
            (delete, KARPENTER, &worker, Some(Override::KarpenterDeadline)),
            (evict, KARPENTER, &worker, None),
            (restart, KARPENTER, &worker, None),
            (delete, JOB_CONTROLLER, &job_pod, Some(Override::OwnerController)),
            (delete, JOB_CONTROLLER, &worker, None),
            (delete, GARBAGE_COLLECTOR_USER, &job_pod, Some(Override::OwnerDeleted)),
            (delete, GARBAGE_COLLECTOR_USER, &worker, None),
            (evict, GARBAGE_COLLECTOR_USER, &job_pod, None),
            (delete, "alice", &worker, None),
            (delete, "alice", &job_pod, None),
        ];
        for (action, user, pod, expected) in table {
            let busy = BusyState::Busy { since: None, until: None };
            let verdict = judge(busy, pod, Taken { action, preempted: false }, requester(user), &config);
            let taken = match verdict {
                Verdict::AllowBusy(over) => Some(over),
                _ => None,
            };
            assert_eq!(taken, expected, "{action:?} by {user} of {}", pod.metadata.name);
        }
        // Kueue preempted the Job's Workload where its namespace holds that: the cluster takes it.
        assert_eq!(
            deleted_as_its_end(Taken { action: delete, preempted: true }, &job_pod, requester(JOB_CONTROLLER), &config),
            None
        );
        assert_eq!(
            deleted_as_its_end(
                Taken { action: delete, preempted: true },
                &job_pod,
                requester(GARBAGE_COLLECTOR_USER),
                &config
            ),
            Some(Override::OwnerDeleted),
            "the Job deleted is still its end"
        );
        let waits = |action, user| !must_not_wait(action, requester(user), &config);
        assert!(!waits(delete, GARBAGE_COLLECTOR_USER) && !waits(delete, KARPENTER), "their deletes go at once");
        assert!(waits(evict, KARPENTER) && waits(delete, "alice"), "the workload's budget holds the rest");
        // A Spark executor, controlled by its driver pod: the driver's own token removes it.
        let executor = pod(json!({"metadata": {"name": "etl-exec-1", "labels": {"busyguard.io/busy": "true"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "etl-driver", "uid": "d", "controller": true}]}}));
        let token = |pod| Requester { username: "system:serviceaccount:spark:spark", groups: &[], pod };
        assert_eq!(
            deleted_as_its_end(
                Taken { action: delete, preempted: false },
                &executor,
                token(Some("etl-driver")),
                &config
            ),
            Some(Override::Leader)
        );
        assert_eq!(
            deleted_as_its_end(
                Taken { action: delete, preempted: false },
                &executor,
                token(Some("other-driver")),
                &config
            ),
            None
        );
        assert_eq!(
            deleted_as_its_end(Taken { action: delete, preempted: false }, &executor, token(None), &config),
            None,
            "its service account alone"
        );
        assert_eq!(
            deleted_as_its_end(
                Taken { action: evict, preempted: false },
                &executor,
                token(Some("etl-driver")),
                &config
            ),
            None
        );
    }
}
