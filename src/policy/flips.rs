//! The flips of a pod's busy label that busyguard makes for another: for its owner
//! (`--busy-when-owner`) or for its leader (`--busy-with-pod`: Actions Runner Controller's
//! workflow pods carry `runner-pod: <their runner's pod>`), and the deferred deletes that wait
//! for a pod's flip to busy.

use super::keys::{BUSY_LABEL, MAX_BUSY};
use super::outcome::Effect;
use super::owners::{self, Terms};
use super::pod::{PodFacts, PodRef};

/// The flip a pod is due to be `busy` under a rule with `terms`: turning busy, with the rule's
/// max-busy where the pod has none of its own.
pub fn flip(pod: PodRef, facts: &impl PodFacts, busy: bool, terms: &Terms) -> Option<Effect> {
    let ending = facts.is_terminating() || facts.is_terminal();
    let value = owners::follow(facts.label(BUSY_LABEL), busy, ending)?;
    let max_busy = terms.max_busy.clone().filter(|_| busy && facts.annotation(MAX_BUSY).is_none());
    Some(Effect::FollowOwner { pod, value, max_busy })
}

/// The flip a pod busy with its leader is due: busy while its leader is, idle once its leader is
/// not (or is gone: `None`).
pub fn follow_leader(pod: &PodRef, facts: &impl PodFacts, leader: Option<&impl PodFacts>) -> Option<Effect> {
    flip(pod.clone(), facts, leader.is_some_and(leads), &Terms::default())
}

/// Whether the pods busy with a leader are busy with it now, where that changed from `before`
/// to `now` (`None`: not there); `None` if it did not (the sweep mends the rest), so a pod's
/// change scans its namespace only when it flips.
pub fn leads_anew(before: Option<&impl PodFacts>, now: Option<&impl PodFacts>) -> Option<bool> {
    let busy = now.is_some_and(leads);
    (before.is_some_and(leads) != busy).then_some(busy)
}

/// Whether a leader's pods are busy with it: it is busy, and not going away.
fn leads(leader: &impl PodFacts) -> bool {
    leader.label(BUSY_LABEL) == Some("true") && !leader.is_terminating() && !leader.is_terminal()
}

/// A pod's effects, but a deferred delete of a pod being flipped busy for its owner or leader:
/// its owner's next task has begun (a game server allocated again, a runner given a job), and
/// the delete would end it at its start. It waits for the pod's next idle moment.
pub fn no_delete_before_a_busy_flip(mut effects: Vec<Effect>) -> Vec<Effect> {
    let turning_busy: Vec<String> = (effects.iter())
        .filter_map(|e| match e {
            Effect::FollowOwner { pod, value: "true", .. } => Some(pod.uid.clone()),
            _ => None,
        })
        .collect();
    effects.retain(|e| !matches!(e, Effect::DeleteIdle { pod, .. } if turning_busy.contains(&pod.uid)));
    effects
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::pod::Pod;
    use crate::policy::testing;
    use jiff::Timestamp;

    /// A pod of namespace `ci`.
    fn ci_pod(name: &str, labels: serde_json::Value) -> Pod {
        testing::pod(serde_json::json!({"metadata": {"name": name, "namespace": "ci", "uid": format!("u-{name}"),
            "labels": labels}}))
    }

    fn value(effect: Option<Effect>) -> Option<&'static str> {
        match effect {
            Some(Effect::FollowOwner { value, .. }) => Some(value),
            _ => None,
        }
    }

    #[test]
    fn a_workflow_pod_is_busy_while_its_runner_is_and_idle_once_it_is_not_or_gone() {
        let runner = ci_pod("r", serde_json::json!({BUSY_LABEL: "true"}));
        let idle_runner = ci_pod("r", serde_json::json!({BUSY_LABEL: "false"}));
        let workflow = ci_pod("r-workflow", serde_json::json!({BUSY_LABEL: "false", "runner-pod": "r"}));
        let busy_workflow = ci_pod("r-workflow", serde_json::json!({BUSY_LABEL: "true", "runner-pod": "r"}));
        let pod = PodRef { namespace: "ci".into(), name: "r-workflow".into(), uid: "u-r-workflow".into() };
        assert_eq!(value(follow_leader(&pod, &workflow, Some(&runner))), Some("true"), "created while it works");
        assert_eq!(value(follow_leader(&pod, &busy_workflow, Some(&idle_runner))), Some("false"), "job done");
        assert_eq!(value(follow_leader(&pod, &busy_workflow, None::<&Pod>)), Some("false"), "runner gone");
        assert_eq!(value(follow_leader(&pod, &busy_workflow, Some(&runner))), None, "as it should be");
        assert_eq!(leads_anew(Some(&idle_runner), Some(&runner)), Some(true));
        assert_eq!(leads_anew(Some(&runner), Some(&runner)), None, "no flip, no scan");
        assert_eq!(leads_anew(Some(&runner), Some(&idle_runner)), Some(false));
        assert_eq!(leads_anew(Some(&runner), None::<&Pod>), Some(false), "runner gone");
    }

    #[test]
    fn a_deferred_delete_waits_when_its_pods_owner_has_just_given_it_its_next_task() {
        let pod = |name: &str| PodRef { namespace: "games".into(), name: name.into(), uid: format!("u-{name}") };
        let delete = |name: &str| Effect::DeleteIdle {
            pod: pod(name),
            resource_version: "7".into(),
            request: crate::policy::keys::DeleteRequest::new("alice", Timestamp::UNIX_EPOCH),
            audit: Box::new(testing::ask("DELETE", "alice").audit(
                crate::policy::outcome::Decision::DeletedWhenIdle,
                crate::policy::outcome::Reason::DeleteRequested,
                String::new(),
                crate::policy::Mode::Enforce,
                Timestamp::UNIX_EPOCH,
            )),
        };
        let allocated = Effect::FollowOwner { pod: pod("gs-1"), value: "true", max_busy: None };
        let kept = no_delete_before_a_busy_flip(vec![delete("gs-1"), allocated.clone(), delete("gs-2")]);
        assert_eq!(kept, [allocated, delete("gs-2")], "only the pod turning busy keeps its delete for later");
        let ended = Effect::FollowOwner { pod: pod("gs-1"), value: "false", max_busy: None };
        assert_eq!(no_delete_before_a_busy_flip(vec![delete("gs-1"), ended.clone()]), [delete("gs-1"), ended]);
    }
}
