//! Pods busy with a leader (`--busy-with-pod`: Actions Runner Controller's workflow pods carry
//! `runner-pod: <their runner's pod>`), and the deferred deletes that wait for a pod's flip to
//! busy for its owner or leader.

use super::owners::flip_with;
use super::view::{PodRecord, View};
use crate::policy::keys::BUSY_LABEL;
use crate::policy::outcome::Effect;
use crate::policy::owners::Terms;
use crate::policy::pod::{PodFacts, PodRef};

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

/// The flip a pod busy with its leader (`--busy-with-pod`: it carries `label`, naming a pod of
/// its namespace) is due: busy while its leader is, idle once its leader is not (or is gone).
pub fn follow_leader(view: &View, label: &str, pod: &PodRef, record: &PodRecord) -> Option<Effect> {
    let leader = view.record(&pod.namespace, record.label(label)?);
    flip_with(pod.clone(), record, leader.is_some_and(|leader| leads(&leader)), &Terms::default())
}

/// The flips due to the pods busy with the pod `name` (`--busy-with-pod`), as it changed from
/// `before` to `now` (`None`: not there): none unless whether it leads them changed (the sweep
/// mends the rest), so a pod's change scans its namespace only when it flips.
pub fn lead(
    view: &View,
    label: &str,
    (namespace, name): (&str, &str),
    before: Option<&PodRecord>,
    now: Option<&PodRecord>,
) -> Vec<Effect> {
    let busy = now.is_some_and(leads);
    if before.is_some_and(leads) == busy {
        return Vec::new();
    }
    let with_it = view.select(namespace, |pod| pod.label(label) == Some(name));
    let flips = with_it.into_iter().filter_map(|(companion, record)| {
        let pod = PodRef { namespace: namespace.to_string(), name: companion, uid: record.uid.to_string() };
        flip_with(pod, &record, busy, &Terms::default())
    });
    flips.collect()
}

/// Whether a leader's pods are busy with it: it is busy, and not going away.
fn leads(leader: &PodRecord) -> bool {
    leader.label(BUSY_LABEL) == Some("true") && !leader.terminating && !leader.is_terminal()
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::Timestamp;

    /// A pod of namespace `ci` as the view records it.
    fn ci_pod(name: &str, labels: serde_json::Value) -> PodRecord {
        let pod: super::super::view::ApiPod = serde_json::from_value(serde_json::json!({"metadata": {
            "name": name, "namespace": "ci", "uid": format!("u-{name}"), "labels": labels}}))
        .unwrap();
        pod.record()
    }

    #[test]
    fn a_workflow_pod_is_busy_while_its_runner_is_and_idle_once_it_is_not_or_gone() {
        let view = View::without_cluster();
        let runner = ci_pod("r", serde_json::json!({BUSY_LABEL: "true"}));
        let workflow = ci_pod("r-workflow", serde_json::json!({BUSY_LABEL: "false", "runner-pod": "r"}));
        view.insert("ci", "r", runner.clone());
        view.insert("ci", "r-workflow", workflow.clone());
        let pod = PodRef { namespace: "ci".into(), name: "r-workflow".into(), uid: "u-r-workflow".into() };
        let value = |effect: Option<Effect>| match effect {
            Some(Effect::FollowOwner { value, .. }) => Some(value),
            _ => None,
        };
        assert_eq!(value(follow_leader(&view, "runner-pod", &pod, &workflow)), Some("true"), "created while it works");
        let idle_runner = ci_pod("r", serde_json::json!({BUSY_LABEL: "false"}));
        let at = ("ci", "r");
        assert_eq!(value(lead(&view, "runner-pod", at, Some(&idle_runner), Some(&runner)).pop()), Some("true"));
        assert!(lead(&view, "runner-pod", at, Some(&runner), Some(&runner)).is_empty(), "no flip, no scan");
        view.insert(
            "ci",
            "r-workflow",
            ci_pod("r-workflow", serde_json::json!({BUSY_LABEL: "true", "runner-pod": "r"})),
        );
        assert_eq!(
            value(lead(&view, "runner-pod", at, Some(&runner), Some(&idle_runner)).pop()),
            Some("false"),
            "job done"
        );
        assert_eq!(value(lead(&view, "runner-pod", at, Some(&runner), None).pop()), Some("false"), "runner gone");
        let other = ("ci", "other");
        assert!(lead(&view, "runner-pod", other, Some(&idle_runner), Some(&runner)).is_empty(), "another runner's");
    }

    #[test]
    fn a_deferred_delete_waits_when_its_pods_owner_has_just_given_it_its_next_task() {
        let pod = |name: &str| PodRef { namespace: "games".into(), name: name.into(), uid: format!("u-{name}") };
        let delete = |name: &str| Effect::DeleteIdle {
            pod: pod(name),
            resource_version: "7".into(),
            request: crate::policy::keys::DeleteRequest::new("alice", Timestamp::UNIX_EPOCH),
            audit: Box::new(crate::policy::testing::ask("DELETE", "alice").audit(
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
