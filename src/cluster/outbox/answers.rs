//! What became of a side effect, and how the API server's answer to one attempt reads.

use crate::policy::outcome::{BUSY_CAUSE, Effect};

/// What happened to a side effect, as the metric's `result` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantNames)]
#[strum(serialize_all = "kebab-case")]
pub enum EffectResult {
    Ok,
    /// Nothing left to do: the pod is gone, changed (its next watch event decides again) or
    /// already up to date.
    Moot,
    Failed,
    Dropped,
    RateLimited,
    /// Audit mode (`--mode audit`): not carried out.
    Withheld,
}

impl EffectResult {
    pub(super) fn as_str(self) -> &'static str {
        self.into()
    }
}

/// One attempt's verdict.
pub(super) enum Attempt {
    Done(EffectResult),
    /// Worth another try after a pause (conflict, throttling, server error, timeout).
    Retry(String),
    Fail(String),
}

/// Whether the API server's refusal means there is nothing left to do.
pub(super) fn moot(effect: &Effect, status: &kube::core::Status) -> bool {
    match (effect, status.code) {
        // The pod changed since the view saw it (a refresh: its watch event decides again; a
        // deferred delete: busy again, or deleted by another replica), or another replica got
        // there first (this interval's Event, the loss report, the PDB).
        (Effect::Refresh { .. } | Effect::DeleteIdle { .. } | Effect::FollowOwner { .. }, 409)
        | (Effect::Event { .. } | Effect::ReportLoss { .. } | Effect::CreateBusyPdb { .. }, 409) => true,
        // Refused by busyguard itself: the pod turned busy again.
        (Effect::DeleteIdle { .. }, 429) => names_cause(status, BUSY_CAUSE),
        // Taken away first by the other replica.
        (Effect::DeleteBusyPdb { .. }, 404) => true,
        _ => false,
    }
}

/// Whether the API server's refusal names this cause (busyguard names its own).
fn names_cause(status: &kube::core::Status, cause: &str) -> bool {
    status.details.as_ref().is_some_and(|details| details.causes.iter().any(|c| c.reason == cause))
}

/// 404: the pod is gone, nothing to do. 409, 429, 5xx and transport errors: try again.
pub(super) fn classify(error: kube::Error) -> Attempt {
    match error {
        kube::Error::Api(status) => match status.code {
            404 => Attempt::Done(EffectResult::Moot),
            409 | 429 | 500..=599 => Attempt::Retry(format!("{} {}", status.code, status.message)),
            code => Attempt::Fail(format!("{code} {}", status.message)),
        },
        other => Attempt::Retry(other.to_string()),
    }
}
