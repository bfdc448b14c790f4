//! What a decision comes to, in busyguard's own words: the answer, the audit line and the side
//! effects. The admission layer turns the answer into an AdmissionResponse; the cluster layer
//! carries out the effects; the audit sink writes the line.

use std::fmt;

use jiff::Timestamp;
use serde::Serialize;

use super::ask::{Ask, Operation};
use super::config::{Exempt, Mode};
use super::keys::DeleteRequest;
use super::marks::{self, Plan};
use super::owners;
use super::pdb::BUSY_PDB_NAME;

#[derive(Debug)]
pub struct Outcome {
    pub answer: Answer,
    pub decision: Decision,
    pub audit: Option<AuditRecord>,
    /// To leave through the outbox once the answer is decided.
    pub effects: Vec<Effect>,
    /// The answer waits (within its deadline) for the effects: a scale-down's cost updates
    /// must land before the controller picks pods.
    pub await_effects: bool,
    /// A pod let go within its workload's budget: the answer stands once the arbiter records it
    /// (`policy::budget`), else the claim's refusal is the answer.
    pub budget: Option<BudgetClaim>,
}

/// A delete or eviction let go within the workload's budget, to be recorded with the arbiter
/// before it is answered; if the arbiter finds the budget used up after all (another replica's
/// grant), `refusal` is the answer instead.
#[derive(Debug)]
pub struct BudgetClaim {
    pub namespace: String,
    pub pod: String,
    /// Its workload (`Kind/name`) and that workload's other pods unavailable in the view.
    pub workload: String,
    pub unavailable: Vec<String>,
    pub allowed: u32,
    pub refusal: Box<Outcome>,
}

impl Outcome {
    pub fn answer(answer: Answer, decision: Decision) -> Self {
        Outcome { answer, decision, audit: None, effects: Vec::new(), await_effects: false, budget: None }
    }

    /// Allowed as it is, with nothing to say.
    pub fn allow(decision: Decision) -> Self {
        Self::answer(Answer::Allow { warnings: Vec::new() }, decision)
    }

    /// A refusal, or in `--mode dry-run` the warning that stands in for it; `audit` names the
    /// request for the audit line.
    pub fn refused(
        denial: Denial,
        reason: Reason,
        message: String,
        mode: Mode,
        audit: impl FnOnce(Decision, Reason, String) -> AuditRecord,
    ) -> Self {
        if mode == Mode::DryRun {
            let warnings = vec![super::outcome::would_deny(&message)];
            return Self::answer(Answer::Allow { warnings }, Decision::WouldDeny).audited(audit(
                Decision::WouldDeny,
                reason,
                message,
            ));
        }
        Self::answer(Answer::Deny { denial, message: message.clone() }, Decision::Denied).audited(audit(
            Decision::Denied,
            reason,
            message,
        ))
    }

    /// The same refusal in other words: the answer's message (or its dry-run warning) and the
    /// audit line's detail.
    pub fn reworded(mut self, message: String) -> Self {
        match &mut self.answer {
            Answer::Deny { message: said, .. } => said.clone_from(&message),
            Answer::Allow { warnings } => *warnings = vec![would_deny(&message)],
            Answer::Patch { .. } => {}
        }
        if let Some(audit) = &mut self.audit {
            audit.detail = message;
        }
        self
    }

    pub fn audited(self, record: AuditRecord) -> Self {
        Outcome { audit: Some(record), ..self }
    }

    pub fn is_allowed(&self) -> bool {
        !matches!(self.answer, Answer::Deny { .. })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Allow {
        warnings: Vec<String>,
    },
    /// Allowed with these changes (only the mutating webhook answers so).
    Patch {
        patch: json_patch::Patch,
        warnings: Vec<String>,
    },
    Deny {
        denial: Denial,
        message: String,
    },
}

/// Why a request is refused, as the requester's client reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denial {
    /// The pod is busy: retry later, as a PodDisruptionBudget answers (429).
    PodBusy,
    /// The pod is being deleted: it cannot turn busy (409).
    PodTerminating,
    /// A disruption of the pod is wanted (a deferred delete, a refused eviction): it cannot turn
    /// busy (409).
    DisruptionWanted,
    /// The pod's node is going: it cannot turn busy (409).
    NodeGoing,
    /// Its workload's `busyguard.io/max-unavailable` is used up: retry later (429).
    Budget,
    /// A pod's service account changing more than its own pod's busy label (403).
    NotOwnFlag,
    /// A delete-requested mark written by anyone but busyguard (403).
    NotBusyguardsMark,
    /// busy-since or the protected label written by anyone but busyguard (403).
    NotBusyguardsKeys,
    /// A pod's own max-busy below the cluster's floor (400: kubectl shows the message of a
    /// 400 whole, and of a 422 only its causes' fields).
    MaxBusyBelowFloor,
}

/// The cause busyguard names in a refusal of a busy pod (`status.details.causes[].reason`), as a
/// PodDisruptionBudget names `DisruptionBudget`: how busyguard knows its own answer.
pub const BUSY_CAUSE: &str = "BusyguardPodBusy";
pub const TERMINATING_CAUSE: &str = "BusyguardPodTerminating";
pub const DISRUPTION_WANTED_CAUSE: &str = "BusyguardDisruptionWanted";
pub const NODE_GOING_CAUSE: &str = "BusyguardNodeGoing";
pub const BUDGET_CAUSE: &str = "BusyguardDisruptionBudget";
pub const NOT_OWN_FLAG_CAUSE: &str = "BusyguardNotOwnFlag";
pub const NOT_BUSYGUARDS_MARK_CAUSE: &str = "BusyguardNotBusyguardsMark";
pub const NOT_BUSYGUARDS_KEYS_CAUSE: &str = "BusyguardNotBusyguardsKeys";
pub const MAX_BUSY_BELOW_FLOOR_CAUSE: &str = "BusyguardMaxBusyBelowFloor";

impl Denial {
    pub fn code(self) -> u16 {
        match self {
            Denial::PodBusy => 429,
            Denial::PodTerminating | Denial::DisruptionWanted | Denial::NodeGoing => 409,
            Denial::Budget => 429,
            Denial::NotOwnFlag | Denial::NotBusyguardsMark | Denial::NotBusyguardsKeys => 403,
            Denial::MaxBusyBelowFloor => 400,
        }
    }

    pub fn reason(self) -> &'static str {
        match self {
            Denial::PodBusy => "TooManyRequests",
            Denial::PodTerminating | Denial::DisruptionWanted | Denial::NodeGoing => "Conflict",
            Denial::Budget => "TooManyRequests",
            Denial::NotOwnFlag | Denial::NotBusyguardsMark | Denial::NotBusyguardsKeys => "Forbidden",
            Denial::MaxBusyBelowFloor => "BadRequest",
        }
    }

    pub fn cause(self) -> &'static str {
        match self {
            Denial::PodBusy => BUSY_CAUSE,
            Denial::PodTerminating => TERMINATING_CAUSE,
            Denial::DisruptionWanted => DISRUPTION_WANTED_CAUSE,
            Denial::NodeGoing => NODE_GOING_CAUSE,
            Denial::Budget => BUDGET_CAUSE,
            Denial::NotOwnFlag => NOT_OWN_FLAG_CAUSE,
            Denial::NotBusyguardsMark => NOT_BUSYGUARDS_MARK_CAUSE,
            Denial::NotBusyguardsKeys => NOT_BUSYGUARDS_KEYS_CAUSE,
            Denial::MaxBusyBelowFloor => MAX_BUSY_BELOW_FLOOR_CAUSE,
        }
    }
}

/// What busyguard did: the `result` of the review metric and the `decision` of audit lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, strum::IntoStaticStr)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum Decision {
    Allowed,
    Patched,
    Denied,
    /// Dry-run mode: allowed with a warning, audited as a denial that did not happen.
    WouldDeny,
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
    /// A node deleted by the cloud node lifecycle controller: its machine is gone.
    NodeGone,
    /// Karpenter's DELETE of a node: it starts a termination that drains through evictions.
    KarpenterTermination,
    MaxBusyExceeded,
    StaleAfterRestart,
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
    pub fn new(
        subject: Subject<'_>,
        decision: Decision,
        reason: Reason,
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
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

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
    #[strum(serialize = "mark-delete")]
    /// `in_background`: an eviction the descheduler asked to run in the background, which the
    /// pod is marked as under way too.
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
    /// to `value`; busyguard's mutating webhook then writes the rest of the flip.
    #[strum(serialize = "follow-owner")]
    FollowOwner { pod: PodRef, value: &'static str },
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

impl Effect {
    /// The pod an effect writes, if it writes one, and its merge patch, with the pod's uid (and,
    /// for a refresh, the resourceVersion its plan was made on) as preconditions.
    pub fn pod_write(&self) -> Option<PodWrite<'_>> {
        let (pod, mut patch, resource_version) = match self {
            Effect::Refresh { pod, resource_version, plan } => {
                (pod, plan.changes().merge_patch(), Some(resource_version))
            }
            Effect::MarkDeleteRequested { pod, request, in_background } => {
                (pod, marks::mark(request, *in_background).merge_patch(), None)
            }
            Effect::Release { pod, label, hash, request } => {
                (pod, marks::release(label, hash, request).merge_patch(), None)
            }
            Effect::MarkDisruptionWanted { pod, request } => (pod, marks::disruption_mark(request).merge_patch(), None),
            Effect::FollowOwner { pod, value } => (pod, owners::flip_patch(value), None),
            _ => return None,
        };
        patch["metadata"]["uid"] = pod.uid.clone().into();
        if let Some(resource_version) = resource_version {
            patch["metadata"]["resourceVersion"] = resource_version.clone().into();
        }
        Some(PodWrite { pod, patch })
    }

    /// The metric's `kind` label.
    pub fn kind(&self) -> &'static str {
        self.into()
    }

    /// The pod the effect is about; `None` for the busy-pod PDBs.
    pub fn pod(&self) -> Option<&PodRef> {
        match self {
            Effect::Refresh { pod, .. }
            | Effect::MarkDeleteRequested { pod, .. }
            | Effect::MarkDisruptionWanted { pod, .. }
            | Effect::Release { pod, .. }
            | Effect::FollowOwner { pod, .. }
            | Effect::DeleteIdle { pod, .. }
            | Effect::Event { pod, .. }
            | Effect::ReportLoss { pod, .. } => Some(pod),
            Effect::CreateBusyPdb { .. } | Effect::DeleteBusyPdb { .. } => None,
        }
    }
}

/// What an effect changes, for logs: `pod NS/NAME` or `PodDisruptionBudget NS/NAME`.
impl fmt::Display for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Effect::CreateBusyPdb { namespace } => write!(f, "PodDisruptionBudget {namespace}/{BUSY_PDB_NAME}"),
            Effect::DeleteBusyPdb { namespace, name } => write!(f, "PodDisruptionBudget {namespace}/{name}"),
            pod_effect => write!(f, "pod {}", pod_effect.pod().expect("every other effect is about a pod")),
        }
    }
}

/// The warning of `--mode dry-run` in place of a refusal.
pub fn would_deny(message: &str) -> String {
    format!("busyguard dry-run, would deny: {message}")
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

impl Ask<'_> {
    /// An audit line naming this request.
    pub fn audit(&self, decision: Decision, reason: Reason, detail: String, mode: Mode, now: Timestamp) -> AuditRecord {
        AuditRecord::new(Subject::Request(self), decision, reason, detail, mode, now)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_as_the_audit_lines_and_metrics_spell_them() {
        for (decision, name) in [(Decision::WouldDeny, "would-deny"), (Decision::DeletedWhenIdle, "deleted-when-idle")]
        {
            assert_eq!(decision.as_str(), name);
            assert_eq!(serde_json::to_value(decision).unwrap(), name, "the audit line says the same");
        }
        for (reason, name) in [(Reason::NotOwnFlag, "not-own-flag"), (Reason::MaxBusyExceeded, "max-busy-exceeded")] {
            assert_eq!(reason.as_str(), name);
            assert_eq!(serde_json::to_value(reason).unwrap(), name, "the audit line says the same");
        }
        let pod = PodRef { namespace: "ns".into(), name: "w".into(), uid: "u".into() };
        let request = crate::policy::keys::DeleteRequest::new("alice", jiff::Timestamp::UNIX_EPOCH);
        assert_eq!(Effect::MarkDeleteRequested { pod, request, in_background: false }.kind(), "mark-delete");
        assert_eq!(Effect::CreateBusyPdb { namespace: "ns".into() }.kind(), "create-busy-pdb");
        assert_eq!((Action::Delete.as_str(), Action::Evict.as_str()), ("Delete", "Evict"));
    }
}
