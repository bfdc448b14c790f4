//! Held from new tasks: a pod whose disruption is wanted is refused its next flip to busy, so it
//! goes at its next idle moment instead of starting task after task while a drain, Karpenter or
//! cluster-autoscaler retries its eviction. Three things say a disruption is wanted:
//! - a delete busyguard deferred (the delete-requested mark): until it is carried out or called off;
//! - an eviction busyguard refused (the disruption-requested mark, renewed by every refused
//!   eviction): for `--hold-after-eviction` after the last one, so an evictor that gave up
//!   leaves no worker idle for longer;
//! - the pod's node is going: Karpenter's or cluster-autoscaler's taint, a node lifecycle
//!   condition, a managed upgrade's mark (AKS, EKS), or (with `--hold-on-cordon`) a cordon: for
//!   as long as the node says so.

use jiff::{SignedDuration, Timestamp};

use super::keys::{DELETE_REQUESTED, DISRUPTION_REQUESTED, DeleteRequest};
use super::pod::PodFacts;

/// How long holds last, as configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holds {
    /// How long after the last refused eviction the pod takes no new task.
    pub after_eviction: SignedDuration,
    /// A cordoned node (unschedulable, without any other sign) holds its pods too.
    pub on_cordon: bool,
}

impl Default for Holds {
    fn default() -> Self {
        Holds { after_eviction: SignedDuration::from_secs(30), on_cordon: false }
    }
}

impl Holds {
    /// A refused eviction writes the mark again once it is this old: a drain retrying every 5 s
    /// costs one pod write per pod every 10 s, not one per retry.
    pub fn renew_after(self) -> SignedDuration {
        self.after_eviction / 3
    }
}

/// Karpenter's taint on a node it is about to disrupt (consolidation, drift, expiry).
pub const KARPENTER_DISRUPTED_TAINT: &str = "karpenter.sh/disrupted";
/// cluster-autoscaler's taint on a node it is scaling down.
pub const AUTOSCALER_TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";
/// The node lifecycle conditions (KEP-5683, Kubernetes 1.37 alpha) that say a node is going.
pub const GOING_CONDITIONS: [&str; 5] =
    ["DrainInProgress", "Drained", "MaintenancePlanned", "MaintenanceInProgress", "GracefulNodeShutdownInProgress"];
/// The label AKS puts on a node its upgrade could not drain in time, with
/// `undrainableNodeBehavior: Cordon`: cordoned, kept beside a surge node, drained again by the
/// upgrade's next run.
pub const AKS_UPGRADE_STATUS_LABEL: (&str, &str) = ("kubernetes.azure.com/upgrade-status", "Quarantined");
/// The label an EKS managed node group's update puts on each node it is about to replace, as it
/// cordons it, and the label every node of a managed node group carries.
pub const EKS_LEAVING_LABEL: (&str, &str) = ("node.kubernetes.io/exclude-from-external-load-balancers", "true");
pub const EKS_NODE_GROUP_LABEL: &str = "eks.amazonaws.com/nodegroup";

/// What busyguard keeps of a node: whether it is going (its pods take no new task), and
/// whether it is ending whatever its pods do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeState {
    pub going: Option<NodeGoing>,
    pub ending: Option<NodeEnding>,
}

/// Why a node ends whatever its pods do: a Karpenter NodeClaim's delete then is not one that
/// can wait for them (its node termination, its repair).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeEnding {
    /// The Node has a deletionTimestamp: someone deleted it, and its finalizer drains it.
    Deleted,
    /// Its `Ready` condition is not True.
    NotReady,
}

impl NodeEnding {
    /// What a Node says: its deletionTimestamp, its `Ready` condition's status (`None`: none).
    pub fn of(deleted: bool, ready: Option<&str>) -> Option<NodeEnding> {
        if deleted {
            return Some(NodeEnding::Deleted);
        }
        (ready.is_some_and(|ready| ready != "True")).then_some(NodeEnding::NotReady)
    }
}

/// Why a node is going.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeGoing {
    Karpenter,
    ClusterAutoscaler,
    /// One of [`GOING_CONDITIONS`] is True.
    Condition(&'static str),
    /// A managed upgrade is replacing it: AKS quarantined it, or an EKS managed node group's
    /// update cordoned it.
    Upgrade(ManagedUpgrade),
    /// Unschedulable, and `--hold-on-cordon` says a cordon holds.
    Cordoned,
}

/// Whose managed upgrade is replacing a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManagedUpgrade {
    AksQuarantined,
    EksNodeGroup,
}

impl NodeGoing {
    fn says(self) -> String {
        match self {
            NodeGoing::Karpenter => format!("Karpenter is taking it away (taint {KARPENTER_DISRUPTED_TAINT})"),
            NodeGoing::ClusterAutoscaler => {
                format!("cluster-autoscaler is scaling it down (taint {AUTOSCALER_TO_BE_DELETED_TAINT})")
            }
            NodeGoing::Condition(condition) => format!("its condition {condition} is True"),
            NodeGoing::Upgrade(ManagedUpgrade::AksQuarantined) => {
                let (key, value) = AKS_UPGRADE_STATUS_LABEL;
                format!("AKS's upgrade could not drain it and quarantined it ({key}={value}): its next run drains it")
            }
            NodeGoing::Upgrade(ManagedUpgrade::EksNodeGroup) => {
                "its EKS managed node group's update cordoned it to replace it".into()
            }
            NodeGoing::Cordoned => "it is cordoned (unschedulable), and busyguard runs with --hold-on-cordon".into(),
        }
    }
}

/// Whether a node is going, and why (`None`: it stays), from what the Node says of itself: its
/// taints' keys, each condition's `(type, status)` and its labels.
pub fn node_going(
    unschedulable: bool,
    taints: &[&str],
    conditions: &[(&str, &str)],
    labels: &[(&str, &str)],
    holds: Holds,
) -> Option<NodeGoing> {
    if taints.contains(&KARPENTER_DISRUPTED_TAINT) {
        return Some(NodeGoing::Karpenter);
    }
    if taints.contains(&AUTOSCALER_TO_BE_DELETED_TAINT) {
        return Some(NodeGoing::ClusterAutoscaler);
    }
    let condition = GOING_CONDITIONS.into_iter().find(|going| conditions.contains(&(*going, "True")));
    if let Some(condition) = condition {
        return Some(NodeGoing::Condition(condition));
    }
    if labels.contains(&AKS_UPGRADE_STATUS_LABEL) {
        return Some(NodeGoing::Upgrade(ManagedUpgrade::AksQuarantined));
    }
    let node_group = labels.iter().any(|(key, _)| *key == EKS_NODE_GROUP_LABEL);
    if unschedulable && node_group && labels.contains(&EKS_LEAVING_LABEL) {
        return Some(NodeGoing::Upgrade(ManagedUpgrade::EksNodeGroup));
    }
    (holds.on_cordon && unschedulable).then_some(NodeGoing::Cordoned)
}

/// Why a pod takes no new task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// busyguard deferred a delete of it and carries it out once the pod is idle.
    DeleteRequested(DeleteRequest),
    /// An eviction of it was refused at `request.at`; the hold ends at `until` unless it is
    /// asked again.
    EvictionRefused { request: DeleteRequest, until: Timestamp },
    /// Its node is going.
    NodeGoing { node: String, why: NodeGoing },
}

/// How long a deferred eviction asked in background (the descheduler's evacuation) holds its
/// pod from new tasks: the descheduler keeps its record of an eviction in background for 10
/// minutes, and a pod whose eviction a PodDisruptionBudget never allows would otherwise idle for
/// good. The eviction itself is still carried out at the pod's next idle moment.
pub const BACKGROUND_EVICTION_HOLD: SignedDuration = SignedDuration::from_mins(10);

/// The hold on `pod`, on node `node` (`going`: what the view knows of that node), if any.
pub fn held(
    pod: &(impl PodFacts + ?Sized),
    node: &str,
    going: Option<NodeGoing>,
    holds: Holds,
    now: Timestamp,
) -> Option<Hold> {
    if let Some(request) = pod.delete_request()
        && (request.evict.is_none() || request.at.checked_add(BACKGROUND_EVICTION_HOLD).is_ok_and(|until| now < until))
    {
        return Some(Hold::DeleteRequested(request));
    }
    if let Some(hold) = eviction_hold(pod, holds, now) {
        return Some(hold);
    }
    going.map(|why| Hold::NodeGoing { node: node.to_string(), why })
}

/// The hold of a refused eviction, while it lasts: the pod's disruption-requested mark, read,
/// and younger than `--hold-after-eviction`.
pub fn eviction_hold(pod: &(impl PodFacts + ?Sized), holds: Holds, now: Timestamp) -> Option<Hold> {
    let request = disruption_request(pod)?;
    let until = request.at.checked_add(holds.after_eviction).ok().filter(|until| now < *until)?;
    Some(Hold::EvictionRefused { request, until })
}

/// The disruption-requested mark, if the pod carries one that reads.
pub fn disruption_request(pod: &(impl PodFacts + ?Sized)) -> Option<DeleteRequest> {
    serde_json::from_str(pod.annotation(DISRUPTION_REQUESTED)?).ok()
}

/// Whether a refused eviction should write the mark: none yet, or the one there is old enough to
/// renew (or does not read).
pub fn mark_due(pod: &(impl PodFacts + ?Sized), holds: Holds, now: Timestamp) -> bool {
    match disruption_request(pod) {
        Some(request) => now.duration_since(request.at) >= holds.renew_after(),
        None => true,
    }
}

/// The refusal of a flip to busy on a held pod: what the worker reads.
pub fn held_refusal(namespace: &str, name: &str, hold: &Hold) -> String {
    let why = match hold {
        Hold::DeleteRequested(request) => format!(
            "its delete by {} was deferred at {} and is carried out once it is idle (to call it off: kubectl label \
             pod {name} -n {namespace} {DELETE_REQUESTED}-)",
            request.by, request.at
        ),
        Hold::EvictionRefused { request, until } => format!(
            "{} asked to evict it at {} (refused while it was busy); it takes no new task until {until}, longer if \
             the eviction is asked again",
            request.by, request.at
        ),
        Hold::NodeGoing { node, why } => format!("its node {node} is going: {}", why.says()),
    };
    format!(
        "pod {namespace}/{name} takes no new task: {why}. Do not start the task: the pod goes at its next idle moment"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::pod::Pod;
    use crate::policy::testing::{marked_by_busyguard, ts};
    use serde_json::json;

    fn pod(annotations: serde_json::Value, labels: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "w", "annotations": annotations, "labels": labels}}))
            .unwrap()
    }

    #[test]
    fn a_node_is_going_by_karpenters_or_the_autoscalers_taint_or_a_lifecycle_condition() {
        let holds = Holds::default();
        assert_eq!(node_going(false, &["karpenter.sh/disrupted"], &[], &[], holds), Some(NodeGoing::Karpenter));
        assert_eq!(
            node_going(true, &["ToBeDeletedByClusterAutoscaler"], &[], &[], holds),
            Some(NodeGoing::ClusterAutoscaler)
        );
        assert_eq!(
            node_going(false, &[], &[("Ready", "True"), ("DrainInProgress", "True")], &[], holds),
            Some(NodeGoing::Condition("DrainInProgress"))
        );
        assert_eq!(node_going(false, &[], &[("MaintenancePlanned", "False")], &[], holds), None);
        assert_eq!(node_going(false, &["node.kubernetes.io/unschedulable", "e2e"], &[], &[], holds), None);
    }

    #[test]
    fn a_node_a_managed_upgrade_is_replacing_is_going_but_not_one_merely_cordoned_or_labelled() {
        let holds = Holds::default();
        let aks = [("kubernetes.azure.com/upgrade-status", "Quarantined"), ("kubernetes.azure.com/agentpool", "gpu")];
        let quarantined = Some(NodeGoing::Upgrade(ManagedUpgrade::AksQuarantined));
        assert_eq!(node_going(true, &[], &[], &aks, holds), quarantined);
        assert_eq!(node_going(true, &[], &[], &[("kubernetes.azure.com/upgrade-status", "Upgraded")], holds), None);
        let eks = [
            ("eks.amazonaws.com/nodegroup", "workers"),
            ("node.kubernetes.io/exclude-from-external-load-balancers", "true"),
        ];
        let replaced = Some(NodeGoing::Upgrade(ManagedUpgrade::EksNodeGroup));
        assert_eq!(node_going(true, &["node.kubernetes.io/unschedulable"], &[], &eks, holds), replaced);
        assert_eq!(node_going(false, &[], &[], &eks, holds), None, "labelled so, but not cordoned: not an update");
        let own = [("node.kubernetes.io/exclude-from-external-load-balancers", "true")];
        assert_eq!(node_going(true, &[], &[], &own, holds), None, "not of a managed node group");
    }

    #[test]
    fn a_cordon_alone_holds_only_with_hold_on_cordon() {
        assert_eq!(node_going(true, &["node.kubernetes.io/unschedulable"], &[], &[], Holds::default()), None);
        let on_cordon = Holds { on_cordon: true, ..Holds::default() };
        assert_eq!(node_going(true, &[], &[], &[], on_cordon), Some(NodeGoing::Cordoned));
        assert_eq!(node_going(false, &[], &[], &[], on_cordon), None);
    }

    #[test]
    fn a_refused_eviction_holds_for_its_time_then_lets_the_pod_take_tasks_again() {
        let holds = Holds::default();
        let marked = pod(json!({DISRUPTION_REQUESTED: r#"{"by":"drain","at":"2026-11-21T20:00:00Z"}"#}), json!({}));
        let request = DeleteRequest::new("drain", ts("2026-11-21T20:00:00Z"));
        assert_eq!(
            held(&marked, "n1", None, holds, ts("2026-11-21T20:00:29Z")),
            Some(Hold::EvictionRefused { request, until: ts("2026-11-21T20:00:30Z") })
        );
        assert_eq!(held(&marked, "n1", None, holds, ts("2026-11-21T20:00:30Z")), None, "the evictor stopped asking");
        assert!(!mark_due(&marked, holds, ts("2026-11-21T20:00:09Z")), "renewed at most every 10 s");
        assert!(mark_due(&marked, holds, ts("2026-11-21T20:00:10Z")));
        assert!(mark_due(&pod(json!({}), json!({})), holds, ts("2026-11-21T20:00:10Z")));
    }

    #[test]
    fn a_deferred_delete_holds_until_done_one_in_background_ten_minutes_and_a_going_node_as_long_as_it_goes() {
        let holds = Holds::default();
        let mark = r#"{"by":"alice","at":"2026-11-21T20:00:00Z"}"#;
        let mut deferred = pod(json!({DELETE_REQUESTED: mark}), json!({DELETE_REQUESTED: "true"}));
        assert_eq!(
            held(&deferred, "n1", None, holds, ts("2026-11-22T20:00:00Z")),
            None,
            "a mark busyguard did not write"
        );
        deferred = serde_json::from_value(json!({"metadata": {"name": "w", "annotations": {DELETE_REQUESTED: mark},
            "labels": {DELETE_REQUESTED: "true"}, "managedFields": marked_by_busyguard()}}))
        .unwrap();
        assert!(matches!(
            held(&deferred, "n1", None, holds, ts("2026-11-22T20:00:00Z")),
            Some(Hold::DeleteRequested(_))
        ));
        // An eviction in background (the descheduler's), deferred: held 10 minutes at most.
        let background = r#"{"by":"descheduler","at":"2026-11-21T20:00:00Z","evict":{}}"#;
        let background: Pod = serde_json::from_value(json!({"metadata": {"name": "w",
            "annotations": {DELETE_REQUESTED: background}, "labels": {DELETE_REQUESTED: "true"},
            "managedFields": marked_by_busyguard()}}))
        .unwrap();
        assert!(matches!(
            held(&background, "n1", None, holds, ts("2026-11-21T20:09:59Z")),
            Some(Hold::DeleteRequested(_))
        ));
        assert_eq!(held(&background, "n1", None, holds, ts("2026-11-21T20:10:00Z")), None, "the descheduler forgot it");
        let plain = pod(json!({}), json!({}));
        assert_eq!(
            held(&plain, "n1", Some(NodeGoing::Karpenter), holds, ts("2026-11-22T20:00:00Z")),
            Some(Hold::NodeGoing { node: "n1".into(), why: NodeGoing::Karpenter })
        );
        assert_eq!(held(&plain, "n1", None, holds, ts("2026-11-22T20:00:00Z")), None);
    }

    #[test]
    fn the_refusal_says_why_and_that_the_task_must_not_start() {
        let hold = Hold::NodeGoing { node: "n1".into(), why: NodeGoing::ClusterAutoscaler };
        let message = held_refusal("jobs", "w", &hold);
        assert!(message.contains("node n1 is going: cluster-autoscaler"), "{message}");
        assert!(message.contains("Do not start the task"), "{message}");
    }
}
