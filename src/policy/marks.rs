//! What busyguard keeps on a pod, whatever path it comes by: the annotations it writes while the
//! pod is busy (deletion cost, Karpenter's and cluster-autoscaler's), where the user's own values
//! wait meanwhile, busy-since, and the protected label (`patches` writes them). The mutating
//! webhook, the watch, the sweep and scale-downs all plan with it.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};

use super::busy::{BusyState, MaxBusy, busy_from, busy_since, busy_state};
use super::cost::{BUSY_COST_FLOOR, busy_cost};
use super::keys::GUARDED;
use super::keys::{BUSY_LABEL, BUSY_SINCE, DELETION_COST, INTERRUPTED, KARPENTER_DO_NOT_DISRUPT, PROTECTED_LABEL};
use super::pod::PodFacts;
pub use super::vendor_marks::{Mark, On};
use crate::duration::whole_second;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MutationSettings {
    /// Write `karpenter.sh/do-not-disrupt` on busy pods.
    pub karpenter: bool,
    /// Write it as the time left of the protection, counted from the pod's start (Karpenter
    /// reads a duration so), rather than `"true"`: if busyguard is gone, Karpenter still lets the
    /// pod go when max-busy would have.
    pub karpenter_bounded: bool,
    /// Write `cluster-autoscaler.kubernetes.io/safe-to-evict: "false"` on busy pods.
    pub cluster_autoscaler: bool,
    /// Write it as `"on-completion"` instead: cluster-autoscaler 1.36 and later then neither
    /// evicts the pod nor counts its node as empty, but may still drain the node's other pods.
    /// Older ones match the value exactly and read it as no annotation at all.
    pub cluster_autoscaler_on_completion: bool,
    /// Other autoscalers' and upgraders' own keys (`--busy-annotation`, `--busy-label`).
    pub marks: &'static [Mark],
}

impl MutationSettings {
    /// Every annotation written, Karpenter's bounded, cluster-autoscaler's as `"false"`: what
    /// `busyguard cleanup` undoes whatever was set, and what the tests decide with.
    pub const ALL: MutationSettings = MutationSettings {
        karpenter: true,
        karpenter_bounded: true,
        cluster_autoscaler: true,
        cluster_autoscaler_on_completion: false,
        marks: &[],
    };
}

/// Annotation changes by key: `Some(value)` sets, `None` removes.
pub type Changes = BTreeMap<&'static str, Option<String>>;

/// An annotation (or a [`Mark`]'s label) busyguard overrides while a pod is busy.
struct Guarded {
    on: On,
    key: &'static str,
    saved_as: &'static str,
    enabled: bool,
    busy_value: String,
}

impl Guarded {
    /// A value busyguard writes while busy: for the cost, any in the busy band.
    fn is_ours(&self, value: &str) -> bool {
        match self.key {
            DELETION_COST => value.parse::<i32>().is_ok_and(|cost| cost >= BUSY_COST_FLOOR),
            KARPENTER_DO_NOT_DISRUPT => is_our_do_not_disrupt(value),
            _ => value == self.busy_value,
        }
    }

    /// Its value on `pod`.
    fn read<'p>(&self, pod: &'p (impl PodFacts + ?Sized)) -> Option<&'p str> {
        self.on.read(pod, self.key)
    }
}

/// Each of [`GUARDED`] and of the settings' marks with its busy value; `until` is when
/// protection ends (`None`: unknown), `started` when the pod started.
fn guarded(
    settings: MutationSettings,
    since: Timestamp,
    until: Option<Timestamp>,
    started: Option<Timestamp>,
) -> impl Iterator<Item = Guarded> {
    let do_not_disrupt = match (settings.karpenter_bounded, until, started) {
        (true, Some(until), Some(started)) => bounded_do_not_disrupt(until, started),
        _ => "true".into(),
    };
    let built_in = GUARDED.map(|(key, saved_as)| {
        let (enabled, busy_value) = match key {
            DELETION_COST => (true, busy_cost(since).to_string()),
            KARPENTER_DO_NOT_DISRUPT => (settings.karpenter, do_not_disrupt.clone()),
            // AUTOSCALER_SAFE_TO_EVICT
            _ => {
                let value = if settings.cluster_autoscaler_on_completion { "on-completion" } else { "false" };
                (settings.cluster_autoscaler, value.into())
            }
        };
        Guarded { on: On::Annotation, key, saved_as, enabled, busy_value }
    });
    let marks = settings.marks.iter().map(|m| Guarded {
        on: m.on,
        key: m.key,
        saved_as: m.saved_as,
        enabled: true,
        busy_value: m.value.to_string(),
    });
    built_in.into_iter().chain(marks)
}

/// Karpenter's duration form, in whole seconds from the pod's start to `until` (at least 1s).
fn bounded_do_not_disrupt(until: Timestamp, started: Timestamp) -> String {
    format!("{}s", (until.as_second() - started.as_second()).max(1))
}

/// A do-not-disrupt value busyguard wrote: `"true"`, or a number of seconds as above.
fn is_our_do_not_disrupt(value: &str) -> bool {
    value == "true" || value.strip_suffix('s').is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// What the mutating webhook writes on a busy flip: busy-since, each guarded annotation and
/// where the user's own value of it is kept.
pub fn written_on_a_flip(key: &str, settings: MutationSettings) -> bool {
    flip_keys(settings).any(|written| written == key)
}

/// The annotations of a flip: busy-since, and each guarded annotation (of [`GUARDED`] and the
/// settings' marks) with where the user's value waits; a label mark's saved value too.
pub fn flip_keys(settings: MutationSettings) -> impl Iterator<Item = &'static str> {
    std::iter::once(BUSY_SINCE).chain(guarded_keys(settings).flat_map(|(on, guarded, saved_as)| {
        [(on == On::Annotation).then_some(guarded), Some(saved_as)].into_iter().flatten()
    }))
}

/// Each key busyguard overrides while busy, where it is, and where the user's value waits.
pub fn guarded_keys(settings: MutationSettings) -> impl Iterator<Item = (On, &'static str, &'static str)> {
    let built_in = GUARDED.iter().map(|(guarded, saved_as)| (On::Annotation, *guarded, *saved_as));
    built_in.chain(settings.marks.iter().map(|m| (m.on, m.key, m.saved_as)))
}

/// The label keys busyguard writes while a pod is busy: the settings' label marks.
pub fn mark_labels(settings: MutationSettings) -> impl Iterator<Item = &'static str> {
    settings.marks.iter().filter(|m| m.on == On::Label).map(|m| m.key)
}

/// What busyguard keeps on a pod: its annotation changes, its label marks', and the protected
/// label's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub annotations: Changes,
    /// The labels of `--busy-label` marks.
    pub labels: Changes,
    /// `Some(true)` to set [`PROTECTED_LABEL`], `Some(false)` to take it off; `None`: as it is.
    pub protected: Option<bool>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.annotations.is_empty() && self.labels.is_empty() && self.protected.is_none()
    }

    /// Writes `value` (`None`: takes it off) where `g` is kept.
    fn write(&mut self, g: &Guarded, value: Option<String>) {
        let changes = if g.on == On::Label { &mut self.labels } else { &mut self.annotations };
        changes.insert(g.key, value);
    }
}

/// The plan for `pod` as it is about to be stored. `before` is the version it replaces, when
/// the request carries it (an update); without it (a create, the watch, a scale-down) the pod's
/// own busy-since stands if it is a time already past.
pub fn plan(
    pod: &impl PodFacts,
    before: Option<&dyn PodFacts>,
    settings: MutationSettings,
    max_busy: MaxBusy,
    now: Timestamp,
) -> Plan {
    let (mut planned, protected) = if pod.is_terminal() || pod.is_terminating() {
        (Plan::default(), false)
    } else if pod.label(BUSY_LABEL) == Some("true") && !pod.task_ended() {
        plan_busy(pod, before, settings, max_busy, now)
    } else {
        // A run-to-completion pod whose task has ended is idle for good, though its flag stays
        // up and its sidecars run on: unprotected, a drain may take it past the busy-pod PDB,
        // and Karpenter or cluster-autoscaler its node.
        // Busy by readiness (compatibility mode) is protected too.
        (plan_idle(pod, settings, now), busy_state(pod, max_busy, now).is_protected())
    };
    planned.annotations.retain(|key, value| pod.annotation(key) != value.as_deref());
    planned.labels.retain(|key, value| pod.label(key) != value.as_deref());
    let has = pod.label(PROTECTED_LABEL) == Some("true");
    Plan { protected: (protected != has).then_some(protected), ..planned }
}

/// Not marked busy: back to the user's own values, and busyguard's markers go. Opted out (the
/// label removed, also while busy) counts the same as a flip to idle.
fn plan_idle(pod: &impl PodFacts, settings: MutationSettings, now: Timestamp) -> Plan {
    let mut changes = Plan::default();
    let ours_left = pod.annotation(BUSY_SINCE).is_some()
        || pod.annotation(INTERRUPTED).is_some()
        || guarded_keys(settings).any(|(_, _, saved_as)| pod.annotation(saved_as).is_some());
    if !ours_left {
        return changes;
    }
    changes.annotations.insert(BUSY_SINCE, None);
    if pod.annotation(INTERRUPTED).is_some() {
        changes.annotations.insert(INTERRUPTED, None);
    }
    for g in guarded(settings, now, None, None) {
        match pod.annotation(g.saved_as) {
            Some(saved) => {
                changes.write(&g, Some(saved.to_string()));
                changes.annotations.insert(g.saved_as, None);
            }
            // Only what busyguard set may be taken away; a disabled one it never set.
            None if g.enabled => changes.write(&g, None),
            None => {}
        }
    }
    changes
}

/// The marks of [`GUARDED`] a write took off busyguard's busy value while the pod stays busy
/// and protected: another writer fighting busyguard (Karpenter's `PodDeletionCostManagement`
/// clears the deletion cost of pods on nodes with a `do-not-disrupt` pod). [`plan`] puts the busy
/// values back and keeps the writer's as the ones to restore; this says which it were.
pub fn busy_marks_overwritten(
    pod: &impl PodFacts,
    before: &dyn PodFacts,
    settings: MutationSettings,
    max_busy: MaxBusy,
    now: Timestamp,
) -> Vec<&'static str> {
    let busy = |pod: &dyn PodFacts| pod.label(BUSY_LABEL) == Some("true");
    if !busy(pod) || !busy(before) || !busy_state(pod, max_busy, now).is_protected() {
        return Vec::new();
    }
    let ours = |g: &Guarded, value: Option<&str>| value.is_some_and(|value| g.is_ours(value));
    let marks = guarded(settings, now, None, None).filter(|g| g.enabled);
    let taken_off = marks.filter(|g| ours(g, g.read(before)) && !ours(g, g.read(pod)));
    taken_off.map(|g| g.key).collect()
}

/// Marked busy: the changes, and whether the pod is protected.
fn plan_busy(
    pod: &impl PodFacts,
    before: Option<&dyn PodFacts>,
    settings: MutationSettings,
    max_busy: MaxBusy,
    now: Timestamp,
) -> (Plan, bool) {
    let mut changes = Plan::default();
    let (since, turning_busy) = match busy_since_to_keep(pod, before, now) {
        Some(kept) => (kept, false),
        None => (stamp(pod, before, now), true),
    };
    changes.annotations.insert(BUSY_SINCE, Some(since.to_string()));
    // Edited by this very write (only known when the request carries the old version).
    let edited = |g: &Guarded| before.is_some_and(|old| g.read(old) != g.read(pod));
    let state = busy_from(pod, Some(since), max_busy, now);
    let lapsed = matches!(state, BusyState::Lapsed { .. });
    let until = match state {
        BusyState::Busy { until, .. } => until,
        _ => None,
    };
    for g in guarded(settings, since, until, pod.started()) {
        let current = g.read(pod).map(str::to_string);
        let saved = pod.annotation(g.saved_as).map(str::to_string);
        let ours = current.as_deref().is_some_and(|value| g.is_ours(value));
        if lapsed {
            // Protection ran out while the flag stayed up: the user's values rank the pod again,
            // and stay saved (with busy-since) so the flip to idle restores the same values. A
            // value the user writes meanwhile becomes the one to restore.
            if !(g.enabled || saved.is_some()) {
                continue;
            }
            if ours && !edited(&g) {
                changes.write(&g, saved);
            } else if current != saved {
                changes.annotations.insert(g.saved_as, current);
            }
        } else if g.enabled && (turning_busy || current.as_deref() != Some(g.busy_value.as_str())) {
            // Turning busy, or someone changed a guarded annotation while busy: theirs is the
            // value to restore, and ours goes back. A busy value of ours left over (busy-since
            // lost, a flip to idle missed) is never saved as the user's: only a write seen
            // whole (with its old version) tells a user's "true" from ours.
            let left_over = ours && !edited(&g) && (saved.is_some() || before.is_none() || !turning_busy);
            if !left_over {
                changes.annotations.insert(g.saved_as, current);
            }
            let busy_value = Some(g.busy_value.clone());
            changes.write(&g, busy_value);
        }
    }
    (changes, state.is_protected())
}

/// While busy, the busy-since stamped on the flip stays, whatever the write says (moving or
/// removing it would renew protection for ever). Turning busy, the write's own is kept only if
/// it was stamped a moment ago (a reinvocation, or another replica's answer): a leftover of an
/// earlier task on the idle pod is not this task's. Without the old version (a create, the
/// watch, a scale-down), the pod's own stands if it is a time already past. `None`: to be
/// stamped.
fn busy_since_to_keep(pod: &impl PodFacts, before: Option<&dyn PodFacts>, now: Timestamp) -> Option<Timestamp> {
    let past = |pod: &dyn PodFacts| busy_since(pod).filter(|since| *since <= now);
    match before {
        Some(old) if old.label(BUSY_LABEL) == Some("true") => past(old),
        Some(_) => past(pod).filter(|since| now.duration_since(*since) <= JUST_STAMPED),
        None => past(pod),
    }
}

/// How long ago a flip's own busy-since may have been stamped to be kept.
pub const JUST_STAMPED: SignedDuration = SignedDuration::from_secs(30);

/// A new busy-since: now for a flip to busy (or a pod created busy); for a pod found busy
/// without one (removed, or a flip made while busyguard was down), its creation, from which
/// max-busy counts for such a pod anyway, so that losing the stamp never renews protection.
fn stamp(pod: &impl PodFacts, before: Option<&dyn PodFacts>, now: Timestamp) -> Timestamp {
    let busy_already = before.is_none_or(|old| old.label(BUSY_LABEL) == Some("true"));
    let created = pod.created().filter(|created| busy_already && *created <= now);
    whole_second(created.unwrap_or(now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::ts;
    use serde_json::json;

    #[test]
    fn a_busy_pod_on_an_interrupted_spot_node_loses_its_protection_and_the_mark_goes_when_it_idles() {
        use crate::policy::busy::MaxBusy;
        let now = ts("2026-11-21T20:30:00Z");
        let busy = crate::policy::testing::pod(json!({"metadata": {
            "labels": {BUSY_LABEL: "true", PROTECTED_LABEL: "true"},
            "annotations": {BUSY_SINCE: "2026-11-21T20:00:00Z", KARPENTER_DO_NOT_DISRUPT: "true",
                INTERRUPTED: "spot-x7k2p"}}, "status": {"phase": "Running"}}));
        let max_busy = MaxBusy::new(jiff::SignedDuration::from_hours(24));
        let planned = plan(&busy, None, MutationSettings::ALL, max_busy, now);
        assert_eq!(planned.protected, Some(false), "out of the busy-pod PDB");
        assert_eq!(planned.annotations.get(KARPENTER_DO_NOT_DISRUPT), Some(&None), "Karpenter's drain evicts it");
        let idle = crate::policy::testing::pod(json!({"metadata": {"labels": {BUSY_LABEL: "false"},
            "annotations": {BUSY_SINCE: "2026-11-21T20:00:00Z", INTERRUPTED: "spot-x7k2p"}}}));
        let planned = plan(&idle, None, MutationSettings::ALL, max_busy, now);
        assert_eq!(planned.annotations.get(INTERRUPTED), Some(&None), "a next task is protected again");
    }
}
