//! The side effects a decision asks for, which the outbox carries out.

use std::fmt;

use super::audit::{AuditRecord, Decision, Reason};
use crate::policy::keys::{DeleteRequest, EvictAs, INTERRUPTED};
use crate::policy::marks::Plan;
use crate::policy::owners;
use crate::policy::patches;
use crate::policy::pdb::BUSY_PDB_NAME;
use crate::policy::pod::PodRef;

/// What a disruption was: the Event's action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
pub enum Action {
    Delete,
    Evict,
    /// An update of the pod that would restart its task container (a new image, a resize its
    /// resize policy restarts it for).
    Restart,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// A change to the cluster a decision asks for; the outbox carries it out.
#[derive(Debug, Clone, PartialEq, strum::IntoStaticStr, strum::VariantNames)]
#[strum(serialize_all = "kebab-case")]
pub enum Effect {
    /// Bring busyguard's annotations and protected label up to date; `plan` was made on
    /// `resource_version`.
    Refresh { pod: PodRef, resource_version: String, plan: Plan },
    /// Note a refused delete on the pod, so it is carried out once the pod is idle.
    /// `in_background`: an eviction the descheduler asked to run in the background, which the
    /// pod is marked as under way too.
    #[strum(serialize = "mark-delete")]
    MarkDeleteRequested { pod: PodRef, request: DeleteRequest, in_background: bool },
    /// Note a refused eviction (or node delete) on the pod, so it takes no new task for a while
    /// (`policy::hold`).
    #[strum(serialize = "mark-disruption")]
    MarkDisruptionWanted { pod: PodRef, request: DeleteRequest },
    /// Take the pod out of its ReplicaSet (its `pod-template-hash` label, kept in
    /// `busyguard.io/released-from`) and mark it for deletion once idle, in one patch.
    Release { pod: PodRef, label: &'static str, hash: String, request: DeleteRequest },
    /// Carry out a deferred delete: the pod, as of `resource_version`, is no longer protected.
    /// `audit` is written once it is done.
    DeleteIdle { pod: PodRef, resource_version: String, request: DeleteRequest, audit: Box<AuditRecord> },
    /// A Warning Event on the pod for a refused disruption.
    Event { pod: PodRef, action: Action, note: String },
    /// A busy pod lost: a Warning Event named for the pod's uid (so of several replicas the
    /// first reports it, the others find it there), then `audit` and the metric for `cause`.
    ReportLoss { pod: PodRef, cause: LossCause, audit: Box<AuditRecord> },
    /// Set the busy label of a pod whose busy state follows its owner's status (`policy::owners`)
    /// to `value`, and turning busy, its `busyguard.io/max-busy` to the rule's (`max_busy`);
    /// busyguard's mutating webhook then writes the rest of the flip.
    #[strum(serialize = "follow-owner")]
    FollowOwner { pod: PodRef, value: &'static str, max_busy: Option<String> },
    /// Mark a busy pod whose node's spot instance is being reclaimed (`keys::INTERRUPTED`, the
    /// NodeClaim's name): its protection ends, so Karpenter's drain gives its task a SIGTERM.
    #[strum(serialize = "mark-interrupted")]
    MarkInterrupted { pod: PodRef, node_claim: String },
    /// Create busyguard's busy-pod PodDisruptionBudget in the namespace (`policy::pdb`).
    CreateBusyPdb { namespace: String },
    /// Delete busyguard's PodDisruptionBudget `name` in the namespace.
    DeleteBusyPdb { namespace: String, name: String },
}

/// A pod an effect writes, and the merge patch it writes.
#[derive(Debug, Clone, PartialEq)]
pub struct PodWrite<'a> {
    pub pod: &'a PodRef,
    pub patch: serde_json::Value,
}

/// The one API call that carries an effect out.
#[derive(Debug, Clone, PartialEq)]
pub enum Call<'a> {
    /// A merge patch of the pod, with its uid (and, for a refresh, the resourceVersion its plan
    /// was made on) as preconditions.
    PatchPod(PodWrite<'a>),
    /// A delete of the pod as it was seen idle (its uid and `resource_version` as
    /// preconditions), sent as an eviction where the delete deferred was one.
    DeletePod {
        pod: &'a PodRef,
        resource_version: &'a str,
        evict: Option<EvictAs>,
    },
    CreateBusyPdb {
        namespace: &'a str,
    },
    DeleteBusyPdb {
        namespace: &'a str,
        name: &'a str,
    },
    /// A `DisruptionBlocked` Event on the pod, at most one per pod per interval.
    BlockedEvent {
        pod: &'a PodRef,
        action: Action,
        note: &'a str,
    },
    /// The Event of a busy pod lost, named for the pod's uid so that one replica reports it.
    LossEvent {
        pod: &'a PodRef,
        cause: &'a LossCause,
        note: &'a str,
    },
}

impl Effect {
    /// Whether audit mode (`--mode audit`) carries it out: a loss reported, busyguard's own busy
    /// label following an owner (no controller but busyguard reads it), and the removal of a
    /// busy-pod PDB that enforce mode made. Nothing that refuses, holds or defers.
    pub fn is_kept_in_audit_mode(&self) -> bool {
        matches!(self, Effect::ReportLoss { .. } | Effect::FollowOwner { .. } | Effect::DeleteBusyPdb { .. })
    }

    /// The API call that carries the effect out.
    pub fn call(&self) -> Call<'_> {
        let (pod, mut patch, resource_version) = match self {
            Effect::Refresh { pod, resource_version, plan } => {
                (pod, plan.changes().merge_patch(), Some(resource_version))
            }
            Effect::MarkDeleteRequested { pod, request, in_background } => {
                (pod, patches::mark(request, *in_background).merge_patch(), None)
            }
            Effect::Release { pod, label, hash, request } => {
                (pod, patches::release(label, hash, request).merge_patch(), None)
            }
            Effect::MarkDisruptionWanted { pod, request } => {
                (pod, patches::disruption_mark(request).merge_patch(), None)
            }
            Effect::FollowOwner { pod, value, max_busy } => (pod, owners::flip_patch(value, max_busy.as_deref()), None),
            Effect::MarkInterrupted { pod, node_claim } => {
                (pod, serde_json::json!({"metadata": {"annotations": {INTERRUPTED: node_claim}}}), None)
            }
            Effect::DeleteIdle { pod, resource_version, request, .. } => {
                return Call::DeletePod { pod, resource_version, evict: request.evict };
            }
            Effect::CreateBusyPdb { namespace } => return Call::CreateBusyPdb { namespace },
            Effect::DeleteBusyPdb { namespace, name } => return Call::DeleteBusyPdb { namespace, name },
            Effect::Event { pod, action, note } => return Call::BlockedEvent { pod, action: *action, note },
            Effect::ReportLoss { pod, cause, audit } => return Call::LossEvent { pod, cause, note: &audit.detail },
        };
        patch["metadata"]["uid"] = pod.uid.clone().into();
        if let Some(resource_version) = resource_version {
            patch["metadata"]["resourceVersion"] = resource_version.clone().into();
        }
        Call::PatchPod(PodWrite { pod, patch })
    }

    /// The pod the effect writes and its merge patch, if it writes one (see [`Effect::call`]).
    #[cfg(test)]
    pub fn pod_write(&self) -> Option<PodWrite<'_>> {
        match self.call() {
            Call::PatchPod(write) => Some(write),
            _ => None,
        }
    }

    /// The metric's `kind` label.
    pub fn kind(&self) -> &'static str {
        self.into()
    }

    /// The pod the effect is about; `None` for the busy-pod PDBs.
    pub fn pod(&self) -> Option<&PodRef> {
        match self.object() {
            Object::Pod(pod) => Some(pod),
            Object::Pdb { .. } => None,
        }
    }

    /// What the effect changes.
    fn object(&self) -> Object<'_> {
        match self {
            Effect::Refresh { pod, .. }
            | Effect::MarkDeleteRequested { pod, .. }
            | Effect::MarkDisruptionWanted { pod, .. }
            | Effect::Release { pod, .. }
            | Effect::FollowOwner { pod, .. }
            | Effect::MarkInterrupted { pod, .. }
            | Effect::DeleteIdle { pod, .. }
            | Effect::Event { pod, .. }
            | Effect::ReportLoss { pod, .. } => Object::Pod(pod),
            Effect::CreateBusyPdb { namespace } => Object::Pdb { namespace, name: BUSY_PDB_NAME },
            Effect::DeleteBusyPdb { namespace, name } => Object::Pdb { namespace, name },
        }
    }
}

/// A pod, or one of busyguard's PodDisruptionBudgets.
enum Object<'a> {
    Pod(&'a PodRef),
    Pdb { namespace: &'a str, name: &'a str },
}

/// What an effect changes, for logs: `pod NS/NAME` or `PodDisruptionBudget NS/NAME`.
impl fmt::Display for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.object() {
            Object::Pod(pod) => write!(f, "pod {pod}"),
            Object::Pdb { namespace, name } => write!(f, "PodDisruptionBudget {namespace}/{name}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, strum::IntoStaticStr, strum::VariantNames)]
#[strum(serialize_all = "kebab-case")]
pub enum LossCause {
    /// The kubelet failed the pod (node-pressure eviction, preemption at admission, ...).
    Failed { reason: Option<String> },
    /// Gone from the API without a graceful delete (node loss, forced delete).
    Vanished,
    /// Taken into termination by a disruption busyguard did not refuse (the pod's
    /// `DisruptionTarget` condition says which): an eviction or a preemption while busyguard was
    /// down, overloaded or its view stale, or an exempt requester.
    Disrupted { reason: String },
    /// Missing from a relist: gone while busyguard was not watching, so a delete it allowed
    /// (an exempt requester's, the namespace controller's) cannot be told from a loss.
    Unwatched,
}

impl LossCause {
    pub fn label(&self) -> &'static str {
        self.into()
    }

    /// Gone from the watch: the pod may still be there with its busy label removed.
    pub fn left_the_watch(&self) -> bool {
        matches!(self, LossCause::Vanished | LossCause::Unwatched)
    }

    pub fn reason(&self) -> Reason {
        match self {
            LossCause::Failed { .. } => Reason::Failed,
            LossCause::Vanished => Reason::Vanished,
            LossCause::Disrupted { .. } => Reason::Disrupted,
            LossCause::Unwatched => Reason::Unwatched,
        }
    }

    /// A loss known as one; a pod gone unwatched is only unaccounted for.
    pub fn is_loss(&self) -> bool {
        !matches!(self, LossCause::Unwatched)
    }

    pub fn decision(&self) -> Decision {
        if self.is_loss() { Decision::Lost } else { Decision::Unaccounted }
    }

    /// The reason of the Warning Event that reports it.
    pub fn event_reason(&self) -> &'static str {
        if self.is_loss() { "BusyPodLost" } else { "BusyPodUnaccounted" }
    }
}

// The request's and the exemption's words in the audit vocabulary, here so that `ask` and
// `config` need nothing of it.
