//! What the opted-in pods say about their workloads: per workload, how many pods are busy, idle
//! or past their protection, and how many deletes wait for a pod to turn idle. For scaling on
//! the busy fraction, alerting when every pod is busy, and `busyguard status`.

use std::collections::BTreeMap;

use jiff::Timestamp;

use super::busy::{BusyState, MaxBusy, busy_state};
use super::contract::retired_keys;
use super::keys::ROLLOUTS_POD_TEMPLATE_HASH;
use super::pod::PodFacts;

/// The workload of `pod`, named `name`, as people name it (see [`workload`]).
pub fn workload_of(pod: &(impl PodFacts + ?Sized), name: &str) -> String {
    let owner = pod.owner_key().map(|owner| (owner.kind, owner.name));
    workload(owner, pod.template_hash(), pod.owners_set(), name)
}

/// A workload as people name it: `Deployment/worker` (or `Rollout/worker`, Argo's) for the pods
/// of any of its ReplicaSets, by the label its ReplicaSets select with (`template_hash`: the
/// label and its value); a set whose pods each have an owner of their own by its label
/// (`owners_set`: `AutoscalingRunnerSet/ci`, `Fleet/arena`); else the pod's controlling owner
/// (`owner`, its kind and name: `StatefulSet/db`, `Job/import`), else `Pod/<name>`.
pub fn workload(
    owner: Option<(&str, &str)>,
    template_hash: Option<(&str, &str)>,
    owners_set: Option<(&str, &str)>,
    pod_name: &str,
) -> String {
    if let Some((kind, name)) = owners_set {
        return format!("{kind}/{name}");
    }
    let Some((kind, owner)) = owner else { return format!("Pod/{pod_name}") };
    if let (Some((label, hash)), "ReplicaSet") = (template_hash, kind)
        && let Some(name) = owner.strip_suffix(hash).and_then(|name| name.strip_suffix('-'))
    {
        let kind = if label == ROLLOUTS_POD_TEMPLATE_HASH { "Rollout" } else { "Deployment" };
        return format!("{kind}/{name}");
    }
    format!("{kind}/{owner}")
}

/// The pods of one workload, by what busyguard makes of them now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub busy: u64,
    pub idle: u64,
    /// Marked busy, but no longer protected (max-busy, restart).
    pub lapsed: u64,
    /// Pods with a delete waiting for them to turn idle.
    pub delete_requested: u64,
    /// Pods still carrying keys of an older version, which no longer protect them.
    pub retired_keys: u64,
}

impl Counts {
    fn add(&mut self, other: Counts) {
        self.busy += other.busy;
        self.idle += other.idle;
        self.lapsed += other.lapsed;
        self.delete_requested += other.delete_requested;
        self.retired_keys += other.retired_keys;
    }
}

/// The label that stands for the workloads beyond `max_workloads`, so metrics stay bounded.
pub const OTHER_WORKLOADS: &str = "(other)";

/// One pod's part in its workload's counts; `None` for a pod already going away.
pub fn of_pod(pod: &impl PodFacts, max_busy: MaxBusy, now: Timestamp) -> Option<Counts> {
    let mut counts = Counts {
        delete_requested: u64::from(pod.delete_request().is_some()),
        retired_keys: u64::from(retired_keys(pod).next().is_some()),
        ..Counts::default()
    };
    match busy_state(pod, max_busy, now) {
        BusyState::Busy { .. } => counts.busy = 1,
        BusyState::Idle => counts.idle = 1,
        BusyState::Lapsed { .. } => counts.lapsed = 1,
        BusyState::NotOptedIn | BusyState::Terminating | BusyState::Terminal => return None,
    }
    Some(counts)
}

/// Counts by (namespace, workload), at most `max_workloads` of them (the largest); the rest are
/// summed under [`OTHER_WORKLOADS`].
pub fn count(
    pods: impl IntoIterator<Item = (String, String, Counts)>,
    max_workloads: usize,
) -> BTreeMap<(String, String), Counts> {
    let mut all: BTreeMap<(String, String), Counts> = BTreeMap::new();
    for (namespace, workload, counts) in pods {
        all.entry((namespace, workload)).or_default().add(counts);
    }
    if all.len() <= max_workloads {
        return all;
    }
    let mut by_size: Vec<_> = all.into_iter().collect();
    by_size.sort_by_key(|(_, c)| std::cmp::Reverse(c.busy + c.idle + c.lapsed));
    let rest = by_size.split_off(max_workloads.saturating_sub(1));
    let mut kept: BTreeMap<_, _> = by_size.into_iter().collect();
    let other = kept.entry((OTHER_WORKLOADS.to_string(), OTHER_WORKLOADS.to_string())).or_default();
    for (_, counts) in rest {
        other.add(counts);
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::keys::{BUSY_LABEL, BUSY_SINCE};
    use crate::policy::keys::{DELETE_REQUESTED, POD_TEMPLATE_HASH, RETIRED_WHEN_UNREADY};
    use crate::policy::pod::Pod;
    use crate::policy::testing::*;
    use serde_json::json;

    const DAY: MaxBusy = MaxBusy::new(jiff::SignedDuration::from_hours(24));

    fn pod(label: &str, since: Option<&str>, marked: bool) -> Pod {
        let mut annotations = serde_json::Map::new();
        if let Some(since) = since {
            annotations.insert(BUSY_SINCE.into(), json!(since));
        }
        let mut labels = json!({BUSY_LABEL: label});
        if marked {
            annotations.insert(DELETE_REQUESTED.into(), json!(r#"{"by":"alice","at":"2026-11-21T20:30:00Z"}"#));
            labels[DELETE_REQUESTED] = json!("true");
        }
        serde_json::from_value(json!({"metadata": {"labels": labels, "annotations": annotations,
            "managedFields": marked_by_busyguard()}, "status": {"phase": "Running"}}))
        .unwrap()
    }

    #[test]
    fn a_deployments_pods_count_under_the_deployment_whatever_their_replica_set() {
        let hash = Some((POD_TEMPLATE_HASH, "6b8958b477"));
        assert_eq!(workload(Some(("ReplicaSet", "worker-6b8958b477")), hash, None, "p"), "Deployment/worker");
        let argo = Some((ROLLOUTS_POD_TEMPLATE_HASH, "7d9c4f"));
        assert_eq!(workload(Some(("ReplicaSet", "worker-7d9c4f")), argo, None, "p"), "Rollout/worker");
        assert_eq!(workload(Some(("ReplicaSet", "plain")), None, None, "p"), "ReplicaSet/plain");
        assert_eq!(workload(Some(("StatefulSet", "db")), None, None, "db-0"), "StatefulSet/db");
        assert_eq!(workload(None, None, None, "lonely"), "Pod/lonely");
    }

    #[test]
    fn runners_count_under_their_scale_set_and_game_servers_under_their_fleet() {
        let runner: Pod = serde_json::from_value(json!({"metadata": {"name": "ci-runner-4tb9k", "labels": {
            "actions.github.com/scale-set-name": "ci", "actions-ephemeral-runner": "True", BUSY_LABEL: "true"},
            "ownerReferences": [{"apiVersion": "actions.github.com/v1alpha1", "kind": "EphemeralRunner",
                "name": "ci-runner-4tb9k", "uid": "u", "controller": true}]}}))
        .unwrap();
        let set = runner.owners_set();
        assert_eq!(
            workload(Some(("EphemeralRunner", "ci-runner-4tb9k")), None, set, "ci-runner-4tb9k"),
            "AutoscalingRunnerSet/ci"
        );
        let game_server: Pod =
            serde_json::from_value(json!({"metadata": {"labels": {"agones.dev/fleet": "arena"}}})).unwrap();
        assert_eq!(workload(Some(("GameServer", "arena-x")), None, game_server.owners_set(), "arena-x"), "Fleet/arena");
        let alone: Pod =
            serde_json::from_value(json!({"metadata": {"labels": {"agones.dev/gameserver": "gs"}}})).unwrap();
        assert_eq!(
            workload(Some(("GameServer", "gs")), None, alone.owners_set(), "gs"),
            "GameServer/gs",
            "no fleet: its own"
        );
    }

    #[test]
    fn pods_are_counted_busy_idle_or_lapsed_with_the_deletes_that_wait_for_them() {
        let pods = [
            pod("true", Some("2026-11-21T20:00:00Z"), true),
            pod("true", Some("2026-11-21T20:30:00Z"), false),
            pod("true", Some("2026-11-20T00:00:00Z"), false),
            pod("false", None, false),
        ];
        let counted = pods.iter().filter_map(|p| of_pod(p, DAY, now()));
        let counts = count(counted.map(|c| ("capture".to_string(), "Deployment/worker".to_string(), c)), 100);
        assert_eq!(
            counts[&("capture".into(), "Deployment/worker".into())],
            Counts { busy: 2, idle: 1, lapsed: 1, delete_requested: 1, retired_keys: 0 }
        );
    }

    #[test]
    fn pods_with_keys_of_an_older_version_are_counted() {
        let mut old = pod("false", None, false);
        old.metadata.annotations.get_or_insert_default().insert(RETIRED_WHEN_UNREADY.into(), "true".into());
        assert_eq!(of_pod(&old, DAY, now()).unwrap().retired_keys, 1);
        assert_eq!(of_pod(&pod("false", None, true), DAY, now()).unwrap().retired_keys, 0, "a whole mark");
    }

    #[test]
    fn pods_going_away_are_not_counted() {
        let mut going = pod("true", Some("2026-11-21T20:00:00Z"), false);
        going.metadata.deletion_timestamp = Some(now());
        assert_eq!(of_pod(&going, DAY, now()), None);
    }

    #[test]
    fn beyond_the_bound_the_smallest_workloads_are_summed_as_other() {
        let idle = of_pod(&pod("false", None, false), DAY, now()).unwrap();
        let pods = (0..5).flat_map(|w| (0..=w).map(move |_| ("ns".to_string(), format!("Deployment/w{w}"), idle)));
        let counts = count(pods, 3);
        assert_eq!(counts.len(), 3);
        assert_eq!(counts[&("ns".into(), "Deployment/w4".into())].idle, 5);
        assert_eq!(counts[&("ns".into(), "Deployment/w3".into())].idle, 4);
        assert_eq!(counts[&(OTHER_WORKLOADS.into(), OTHER_WORKLOADS.into())].idle, 3 + 2 + 1);
    }
}
