//! What a decision comes to, in busyguard's own words: the answer, the audit line and the side
//! effects. The admission layer turns the answer into an AdmissionResponse; the cluster layer
//! carries out the effects; the audit sink writes the line.

mod audit;
mod effect;
mod trial;

pub use audit::{AuditRecord, Decision, Reason, ScalePlan, Subject};
pub use effect::{Action, Call, Effect, LossCause, PodWrite};

use super::config::Mode;
use super::hold::Hold;

#[derive(Debug)]
pub struct Outcome {
    pub answer: Answer,
    pub decision: Decision,
    /// Boxed (320 bytes): an outcome is moved from step to step, and most allowed answers carry none.
    pub audit: Option<Box<AuditRecord>>,
    /// To leave through the outbox once the answer is decided.
    pub effects: Vec<Effect>,
    /// The answer waits (within its deadline) for the effects: a scale-down's cost updates
    /// must land before the controller picks pods.
    pub await_effects: bool,
    /// A pod let go within its workload's budget: the answer stands once the arbiter records it
    /// (`policy::budget`), else the claim's refusal is the answer. Boxed: rare, and an outcome
    /// is moved from step to step.
    pub budget: Option<Box<BudgetClaim>>,
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

    /// A refusal, or in `--mode audit` the warning that stands in for it; `audit` names the
    /// request for the audit line.
    pub fn refused(
        denial: Denial,
        reason: Reason,
        message: String,
        mode: Mode,
        audit: impl FnOnce(Decision, Reason, String) -> AuditRecord,
    ) -> Self {
        if mode == Mode::Audit {
            let warnings = vec![would_deny(&message)];
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

    /// The same refusal in other words: the answer's message (or its audit-mode warning) and the
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

    pub fn audited(self, record: impl Into<Box<AuditRecord>>) -> Self {
        Outcome { audit: Some(record.into()), ..self }
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
    /// An eviction by busyguard's own token of a pod whose eviction it did not defer (403).
    NotDeferred,
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
pub const NOT_DEFERRED_CAUSE: &str = "BusyguardNotDeferred";

impl Denial {
    /// How a flip to busy refused for `hold` is answered (409) and audited.
    pub fn of_hold(hold: &Hold) -> (Denial, Reason) {
        match hold {
            Hold::NodeGoing { .. } => (Denial::NodeGoing, Reason::NodeGoing),
            Hold::DeleteRequested(_) | Hold::EvictionRefused { .. } => {
                (Denial::DisruptionWanted, Reason::DisruptionWanted)
            }
        }
    }

    pub fn code(self) -> u16 {
        match self {
            Denial::PodBusy => 429,
            Denial::PodTerminating | Denial::DisruptionWanted | Denial::NodeGoing => 409,
            Denial::Budget => 429,
            Denial::NotOwnFlag | Denial::NotBusyguardsMark | Denial::NotBusyguardsKeys | Denial::NotDeferred => 403,
            Denial::MaxBusyBelowFloor => 400,
        }
    }

    pub fn reason(self) -> &'static str {
        match self {
            Denial::PodBusy => "TooManyRequests",
            Denial::PodTerminating | Denial::DisruptionWanted | Denial::NodeGoing => "Conflict",
            Denial::Budget => "TooManyRequests",
            Denial::NotOwnFlag | Denial::NotBusyguardsMark | Denial::NotBusyguardsKeys | Denial::NotDeferred => {
                "Forbidden"
            }
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
            Denial::NotDeferred => NOT_DEFERRED_CAUSE,
        }
    }
}

/// The warning of `--mode audit` in place of a refusal.
pub fn would_deny(message: &str) -> String {
    format!("busyguard audit mode, would deny: {message}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::pod::PodRef;

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
