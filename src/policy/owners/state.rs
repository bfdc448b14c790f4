//! An owner under a busy rule as its watch last saw it, and what its pods are due.

use jiff::{SignedDuration, Timestamp};

use super::rule::{OwnerRule, PerPod, Terms, Undecided};
use crate::policy::keys::{BUSY_LABEL, MAX_BUSY};
use crate::policy::pod::PodRef;

/// An owner under a busy rule as its watch last saw it: since when its rule holds, at the
/// latest (`None`: it does not), or, under a rule that reads the pod, the owner to judge each of
/// its pods by; and the rule's terms.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnerState {
    pub busy_since: Option<Timestamp>,
    pub per_pod: Option<PerPod>,
    pub terms: Terms,
}

impl OwnerState {
    /// The owner seen `busy` by `rule` after it was seen as `before` (`None`: never), last
    /// written at `written` (its managedFields' latest time, as the API server keeps it): a task
    /// the owner took while watched began with the write that showed it; one it already had
    /// when first seen began at that write at the latest.
    pub fn seen(rule: &OwnerRule, before: Option<&OwnerState>, busy: bool, written: Timestamp) -> OwnerState {
        let kept = before.and_then(|before| before.busy_since);
        OwnerState { busy_since: busy.then(|| kept.unwrap_or(written)), per_pod: None, terms: rule.terms.clone() }
    }

    /// The owner seen under a rule that reads the pod: each pod is busy as the rule says of it.
    pub fn judged_per_pod(per_pod: PerPod) -> OwnerState {
        let terms = per_pod.terms().clone();
        OwnerState { busy_since: None, per_pod: Some(per_pod), terms }
    }

    /// Whether the owner is busy as a whole (never, under a rule that reads the pod).
    pub fn busy(&self) -> bool {
        self.busy_since.is_some()
    }

    /// Whether the owner's pod created at `created` does the owner's task: the owner is busy,
    /// and, under a rule whose new pods stay idle ([`Terms::new_pods_idle`]), the pod was there
    /// when its task began.
    pub fn busy_for(&self, created: Option<Timestamp>) -> bool {
        match (self.busy_since, created) {
            (Some(_), _) if !self.terms.new_pods_idle => true,
            // Times to the second (and now, for an owner with no managedFields): a margin.
            (Some(since), Some(created)) => created <= since + SignedDuration::from_secs(5),
            (since, None) => since.is_some(),
            (None, Some(_)) => false,
        }
    }

    /// Whether the owner's pod is busy: as the rule says of it, under a rule that reads the pod;
    /// else as [`OwnerState::busy_for`] says.
    pub fn pod_busy(
        &self,
        pod: &PodRef,
        labels: &[(Box<str>, Box<str>)],
        created: Option<Timestamp>,
    ) -> Result<bool, Undecided> {
        match &self.per_pod {
            Some(per_pod) => per_pod.busy(pod, labels),
            None => Ok(self.busy_for(created)),
        }
    }
}

/// The busy label's value an owner's pod should carry, if it carries another: `"true"` while its
/// owner is busy, `"false"` when it is not. A pod being deleted, or finished, is left as it is:
/// its end is under way, and a flip to busy would be refused. A pod without the label is not
/// busyguard's to write: not opted in, or in a namespace busyguard leaves alone.
pub fn follow(label: Option<&str>, busy: bool, ending: bool) -> Option<&'static str> {
    let wanted = if busy { "true" } else { "false" };
    (!ending && label? != wanted).then_some(wanted)
}

/// The merge patch that flips an owner's pod; turning busy, with the rule's max-busy where the
/// pod has none of its own.
pub fn flip_patch(value: &str, max_busy: Option<&str>) -> serde_json::Value {
    let mut patch = serde_json::json!({"metadata": {"labels": {BUSY_LABEL: value}}});
    if let Some(max_busy) = max_busy {
        patch["metadata"]["annotations"] = serde_json::json!({MAX_BUSY: max_busy});
    }
    patch
}
