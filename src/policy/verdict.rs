//! The busy rule's answer for one pod and one requester: whether a pod marked busy may be taken
//! away by whoever asks, and why (recovery, an exempt user or group, a lapsed protection). Every
//! path that takes a busy pod away asks it (`disruption::judge_disruption`).

use jiff::Timestamp;

use super::ask::Requester;
use super::busy::{BusyState, Lapse};
use super::config::{Exempt, Exemptions};
use super::outcome::{Decision, Reason};
use super::requesters::{NAMESPACE_CONTROLLER_USER, TAINT_MANAGER_USERS};

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
    /// A pod busy with its leader (`--busy-with-pod`) deleted with its leader's own token: the
    /// runner's hooks cleaning up the workflow pod of the job they ran.
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

pub fn judge(state: BusyState, requester: Requester<'_>, exemptions: &Exemptions) -> Verdict {
    match state {
        BusyState::NotOptedIn | BusyState::Idle | BusyState::Terminating | BusyState::Terminal => Verdict::Allow,
        BusyState::Lapsed { since, lapse } => Verdict::AllowBusy(Override::Lapsed { since, lapse }),
        BusyState::Busy { since, until } => match let_through(requester, exemptions) {
            Some(over) => Verdict::AllowBusy(over),
            None => Verdict::Deny { since, until },
        },
    }
}

/// Who takes a pod away whatever protects it: recovery (the taint manager, the namespace
/// controller), then exempt users and groups.
pub fn let_through(requester: Requester<'_>, exemptions: &Exemptions) -> Option<Override> {
    if TAINT_MANAGER_USERS.contains(&requester.username) {
        return Some(Override::NodeTaintEviction);
    }
    if requester.username == NAMESPACE_CONTROLLER_USER {
        return Some(Override::NamespaceDeleted);
    }
    exemptions.of(requester).map(Override::Exempt)
}

/// Why a busy pod was let go.
pub fn override_detail(over: &Override, namespace: &str, name: &str) -> String {
    let pod = format!("pod {namespace}/{name}");
    match over {
        Override::Lapsed { since, lapse: Lapse::MaxBusy { limit } } => {
            format!("{pod} busy since {since} for longer than max-busy {limit:#}: no longer protected")
        }
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
