//! The audit line: who asked what of which object, what busyguard decided and why.

use jiff::Timestamp;
use serde::Serialize;

use crate::policy::ask::{Ask, Operation};
use crate::policy::config::{Exempt, Mode};
use crate::policy::pod::PodRef;

/// What busyguard did: the `result` of the review metric and the `decision` of audit lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, strum::IntoStaticStr, strum::EnumCount, strum::EnumIter)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum Decision {
    Allowed,
    Patched,
    Denied,
    /// Audit mode: allowed with a warning, audited as a denial that did not happen.
    WouldDeny,
    /// Audit mode: allowed without the patch enforce mode writes, audited with what it was.
    WouldPatch,
    /// A busy pod's protection set aside for an exempt requester.
    Exempted,
    /// A pod marked busy whose protection ran out (max-busy, restart).
    Lapsed,
    /// A scale-down, prepared (or not, and why) and allowed.
    ScaleDown,
    /// Not a request busyguard judges: allowed as is.
    Unhandled,
    /// busyguard carried out a delete it had deferred.
    DeletedWhenIdle,
    /// A busy pod went without a request busyguard could refuse.
    Lost,
    /// A busy pod went while busyguard was not watching: by a delete it allowed, or lost.
    Unaccounted,
    /// Another writer took busyguard's marks off a busy pod: put back in the same write, the
    /// writer's values kept as the ones to restore.
    Restored,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Why, in one word (docs/operations.md, "Audit lines").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, strum::IntoStaticStr)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum Reason {
    Busy,
    /// A flip to busy refused: the pod is being deleted.
    Terminating,
    /// A flip to busy refused: a disruption of the pod is wanted (a deferred delete, a refused
    /// eviction).
    DisruptionWanted,
    /// A flip to busy refused: the pod's node is going.
    NodeGoing,
    /// Refused: the workload's `busyguard.io/max-unavailable` is used up.
    Budget,
    /// Refused: a pod's service account changing more than its own busy flag.
    NotOwnFlag,
    /// Refused: a delete-requested mark written by anyone but busyguard.
    ForgedMark,
    /// Refused: busyguard's own keys written by anyone else.
    ForgedKeys,
    /// Refused: a pod's own max-busy below the floor.
    MaxBusyBelowFloor,
    /// Refused: an eviction by busyguard's own token of a pod whose eviction it did not defer.
    NotDeferred,
    /// Refused: an update that would restart a busy pod's task container.
    RestartWhileBusy,
    BusyDeleteDeferred,
    /// A busy (not Ready) pod the ReplicaSet controller picked, released from it instead.
    BusyReleased,
    ExemptUser,
    ExemptGroup,
    NodeTaintEviction,
    NamespaceDeleted,
    KarpenterDeadline,
    /// A run-to-completion pod deleted by its own owner's controller.
    OwnerController,
    /// A run-to-completion pod deleted by the garbage collector: its owner was deleted.
    OwnerDeleted,
    /// A pod busy with its leader (`--busy-with-pod`), deleted with its leader's own token.
    Leader,
    /// A node deleted by the cloud node lifecycle controller: its machine is gone.
    NodeGone,
    /// Karpenter's DELETE of a node: it starts a termination, which waits for busy pods.
    KarpenterTermination,
    /// A NodeClaim deleted for another reason than Karpenter's consolidation or drift (expiry,
    /// repair, interruption, garbage collection, a person's delete).
    NodeClaimEnding,
    MaxBusyExceeded,
    StaleAfterRestart,
    /// A busy pod's marks written over by another writer.
    Overwritten,
    /// A busy pod let go, or a NodeClaim deleted, because Karpenter's cloud reclaims the node's
    /// spot instance.
    Interrupted,
    /// What a flip writes for other controllers (deletion cost, the autoscalers' annotations,
    /// the protected label), withheld in audit mode.
    BusyMarks,
    Plan,
    NoSelector,
    InvalidSelector,
    ViewUnavailable,
    DeleteRequested,
    Failed,
    Vanished,
    Disrupted,
    Unwatched,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// One audit line: who asked what of which object, what busyguard decided and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditRecord {
    pub time: Timestamp,
    /// The AdmissionReview's uid; empty for what busyguard saw on the watch.
    pub uid: String,
    pub decision: Decision,
    pub reason: Reason,
    /// The same in words, with the names and times involved.
    pub detail: String,
    /// `None` (written `""`) for a pod no request named.
    #[serde(serialize_with = "operation_or_empty")]
    pub operation: Option<Operation>,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    /// The pod's name, or the ReplicaSet's or Deployment's for a scale-down.
    pub name: String,
    pub user: String,
    pub groups: Vec<String>,
    pub busy_since: Option<Timestamp>,
    pub mode: Mode,
    /// The request was a dry run: the answer was given, nothing was changed.
    pub dry_run: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<ScalePlan>,
    /// In audit mode, the workload of a pod whose delete or eviction would have been refused
    /// (`Deployment/worker`), for the trial's summary (`busyguard status --trial`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload: Option<String>,
}

fn operation_or_empty<S: serde::Serializer>(operation: &Option<Operation>, to: S) -> Result<S::Ok, S::Error> {
    to.serialize_str(operation.map_or("", Operation::as_str))
}

/// What an audit line is about: a request, or a pod no request named (the watch saw it).
#[derive(Debug, Clone, Copy)]
pub enum Subject<'a> {
    Request(&'a Ask<'a>),
    Pod(&'a PodRef),
}

impl AuditRecord {
    /// A line about `subject`: what was decided and why, in words, under `mode`, at `now`.
    pub fn new(
        subject: Subject<'_>,
        (decision, reason): (Decision, Reason),
        detail: String,
        mode: Mode,
        now: Timestamp,
    ) -> Self {
        let (request, namespace, name) = match subject {
            Subject::Request(ask) => (Some(ask), ask.namespace, ask.name),
            Subject::Pod(pod) => (None, pod.namespace.as_str(), pod.name.as_str()),
        };
        AuditRecord {
            time: now,
            uid: request.map_or("", |ask| ask.uid).to_string(),
            decision,
            reason,
            detail,
            operation: request.map(|ask| ask.operation),
            resource: request.map_or("pods", |ask| ask.resource).to_string(),
            subresource: request.map_or("", |ask| ask.subresource).to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
            user: request.map_or("", |ask| ask.requester.username).to_string(),
            groups: request.map(|ask| ask.requester.groups.to_vec()).unwrap_or_default(),
            busy_since: None,
            mode,
            dry_run: request.is_some_and(|ask| ask.dry_run),
            plan: None,
            workload: None,
        }
    }
}

/// What a scale-down does to the pods it selects, as its audit line carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ScalePlan {
    pub replicas_from: i32,
    pub replicas_to: i32,
    /// Pods the selector matches that are not already going away.
    pub pods: usize,
    /// Idle pods the controller can remove right away (it picks them first by cost).
    pub idle_taken: usize,
    /// Busy pods it has to wait for: their deletes are refused until they are idle.
    pub busy_waited: usize,
    /// Busy pods the scale-down leaves running.
    pub busy_spared: usize,
    /// Pods whose busyguard annotations were stale and are being brought up to date.
    pub refreshed: usize,
}

// `Ask::audit` and `Exempt::reason` live here, beside the audit line they build: `ask` and
// `config` sit below `outcome`, which names them, and cannot name it back.
impl Ask<'_> {
    /// An audit line naming this request.
    pub fn audit(&self, decision: Decision, reason: Reason, detail: String, mode: Mode, now: Timestamp) -> AuditRecord {
        AuditRecord::new(Subject::Request(self), (decision, reason), detail, mode, now)
    }
}

impl Exempt {
    /// The audit reason of a request let through by this exemption.
    pub fn reason(&self) -> Reason {
        match self {
            Exempt::User(_) => Reason::ExemptUser,
            Exempt::Group(_) => Reason::ExemptGroup,
        }
    }
}
