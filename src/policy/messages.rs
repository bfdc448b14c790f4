//! Every sentence a person reads: refusals, warnings, and the `detail` of audit lines. Kept in
//! one place so the wording stays consistent; no code matches on any of it.

use jiff::{SignedDuration, Timestamp};

use super::busy::Lapse;
use super::cost::KARPENTER_NOTHING_COST;
use super::disruption::Override;
use super::keys::DELETION_COST;
use super::keys::{BUSY_LABEL, MAX_BUSY, MAX_UNAVAILABLE, WHEN_UNREADY};
use super::keys::{DELETE_REQUESTED, DeleteRequest, POD_TEMPLATE_HASH, RELEASED_FROM};
use super::node::BusyOnNode;
use super::observed::LossCause;
use super::outcome::PodRef;
use super::scale::ScalePlan;

/// What a person reads when busyguard refuses: who is busy, since when, and how to override.
/// `by_readiness`: busy because it is not Ready (compatibility mode), where the label says idle.
/// `enforced`: the refusal stands (not `--mode dry-run`, where the pod goes all the same).
pub fn busy_denial(
    namespace: &str,
    name: &str,
    since: Option<Timestamp>,
    until: Option<Timestamp>,
    by_readiness: bool,
    enforced: bool,
) -> String {
    // Without a busy-since (busyguard missed the flip), max-busy counts from the pod's creation.
    let (since, counted) = match since {
        Some(t) => (format!(" since {t}"), ""),
        None => (", since when busyguard cannot tell".to_string(), ", counted from the pod's creation"),
    };
    let until = until.map_or_else(String::new, |t| format!(" (protection lapses at {t} at the latest{counted})"));
    let force = format!("kubectl label pod {name} -n {namespace} {BUSY_LABEL}=false --overwrite");
    let busy = if by_readiness { "busy (not Ready)" } else { "busy" };
    let spared = if enforced { "; it will be spared until it is idle" } else { "" };
    format!("pod {namespace}/{name} is {busy}{since}{until}{spared}; to force: {force}")
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

/// A disruption refused by the workload's own budget.
pub fn over_budget(namespace: &str, name: &str, allowed: u32, unavailable: u32) -> String {
    format!(
        "pod {namespace}/{name} may not go now: its workload allows {allowed} unavailable pod(s) at once \
         ({MAX_UNAVAILABLE}) and {unavailable} already are; retry once they are back"
    )
}

/// Added to a refusal of a delete busyguard will carry out itself.
pub fn delete_deferred() -> String {
    format!(
        "; busyguard records the delete on the pod ({DELETE_REQUESTED}) and carries it out once the pod is idle \
         (if the annotation does not appear, delete again later)"
    )
}

/// Added to a refusal of a busy (not Ready) pod the ReplicaSet controller picked.
pub fn released() -> String {
    format!(
        "; busyguard takes it out of its ReplicaSet (label {POD_TEMPLATE_HASH} kept in {RELEASED_FROM}), so the \
         scale-down completes without it, and deletes it once it is Ready again"
    )
}

/// The warning of `--mode dry-run` in place of a refusal.
pub fn would_deny(message: &str) -> String {
    format!("busyguard dry-run, would deny: {message}")
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
        Override::ExemptUser(user) => format!("{pod} is busy; user {user} is exempt"),
        Override::ExemptGroup(group) => format!("{pod} is busy; group {group} is exempt"),
        Override::NodeTaintEviction => format!(
            "{pod} is busy; deleted by the taint manager (its node is NotReady, unreachable or tainted NoExecute): \
             the work on a lost node is gone either way, and a refusal would only keep the pod from being replaced"
        ),
        Override::NamespaceDeleted => format!("{pod} is busy; its namespace is being deleted"),
        Override::KarpenterDeadline => format!(
            "{pod} is busy; Karpenter deletes it as its node's terminationGracePeriod runs out: the instance goes at \
             the deadline anyway, so the pod gets its graceful shutdown now (the task is lost)"
        ),
    }
}

/// A node delete refused: which busy pods run there, and until when at the latest.
pub fn node_busy(node: &str, busy: &[BusyOnNode]) -> String {
    format!(
        "node {node} runs {} busy pod(s): {}; delete it again once they are idle (drain it to wait for them); \
         to force: label them {BUSY_LABEL}=false, or delete as an exempt user",
        busy.len(),
        busy_list(busy)
    )
}

/// A node deleted with busy pods on it, and by whom.
pub fn node_deleted_anyway(node: &str, busy: &[BusyOnNode], by: &str) -> String {
    format!("node {node} deleted by {by} with {} busy pod(s) on it: {}", busy.len(), busy_list(busy))
}

/// At most 5 named, the rest counted.
fn busy_list(busy: &[BusyOnNode]) -> String {
    let mut named: Vec<String> = busy
        .iter()
        .take(5)
        .map(|b| match b.until {
            Some(until) => format!("{} (protected until {until})", b.pod),
            None => b.pod.clone(),
        })
        .collect();
    if busy.len() > 5 {
        named.push(format!("and {} more", busy.len() - 5));
    }
    named.join(", ")
}

/// A scale-down allowed without preparing its pods, and why.
pub fn scale_unprepared(object: &str, from: i32, to: i32, why: &str) -> String {
    format!("{object} {from}→{to}: pods not prepared, {why}")
}

pub const NO_SELECTOR: &str = "the object has no selector";
pub const EMPTY_SELECTOR: &str = "its selector is empty";

pub fn selector_unparsed(error: &str) -> String {
    format!("its selector does not parse: {error}")
}

/// What a scale-down will do to the pods it selects.
pub fn scale_plan(object: &str, plan: &ScalePlan) -> String {
    format!(
        "{object} {}→{}: takes {} idle pod(s) now, waits for {} busy pod(s), spares {} busy pod(s); \
         {} pod(s) had stale busyguard annotations",
        plan.replicas_from, plan.replicas_to, plan.idle_taken, plan.busy_waited, plan.busy_spared, plan.refreshed
    )
}

/// A busy pod gone without a request busyguard could refuse.
pub fn lost(pod: &PodRef, cause: &LossCause) -> String {
    match cause {
        LossCause::Failed { reason } => format!(
            "busy pod {pod} failed ({}) without a request busyguard could refuse: \
             node-pressure eviction or preemption by the kubelet",
            reason.as_deref().unwrap_or("no reason given")
        ),
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

pub fn max_busy_ignored(error: &str) -> String {
    format!("busyguard: annotation {MAX_BUSY} ignored, the default applies: {error}")
}

pub fn max_busy_above_ceiling(own: SignedDuration, ceiling: SignedDuration) -> String {
    format!(
        "busyguard: annotation {MAX_BUSY}={own:#} is above the cluster's ceiling; protection ends after {ceiling:#}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn busy_denial_names_the_pod_the_time_and_the_override() {
        let (since, until) = (Some(ts("2026-11-21T20:00:00Z")), Some(ts("2026-11-22T20:00:00Z")));
        let message = busy_denial("capture", "worker-1", since, until, false, true);
        assert_eq!(
            message,
            "pod capture/worker-1 is busy since 2026-11-21T20:00:00Z (protection lapses at \
             2026-11-22T20:00:00Z at the latest); it will be spared until it is idle; to force: \
             kubectl label pod worker-1 -n capture busyguard.io/busy=false --overwrite"
        );
        assert_eq!(
            busy_denial("ns", "p", None, until, false, true),
            "pod ns/p is busy, since when busyguard cannot tell (protection lapses at 2026-11-22T20:00:00Z at the \
             latest, counted from the pod's creation); it will be spared until it is idle; to force: kubectl label \
             pod p -n ns busyguard.io/busy=false --overwrite"
        );
        assert_eq!(
            busy_denial("ns", "p", since, None, true, true),
            "pod ns/p is busy (not Ready) since 2026-11-21T20:00:00Z; it will be spared until it is idle; to force: \
             kubectl label pod p -n ns busyguard.io/busy=false --overwrite"
        );
        let would = busy_denial("ns", "p", since, None, false, false);
        assert!(!would.contains("spared"), "in dry-run mode the pod goes: {would}");
    }
}
