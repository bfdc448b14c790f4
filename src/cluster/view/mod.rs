//! The cluster view, what decisions read of the cluster: every opted-in pod, kept as a
//! [`PodRecord`], whether the view can be trusted right now, and busyguard's own user; beside
//! them a store of each other kind watched (nodes, namespaces, owners, Kueue's preemptions),
//! each with one lock and one index writing it.

mod api_pod;
mod namespaces;
mod nodes;
mod owners;
mod preemptions;
mod record;

use std::collections::HashSet;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub use api_pod::ApiPod;
pub use namespaces::Namespaces;
pub use nodes::Nodes;
pub use owners::{OwnerKind, Owners};
pub use preemptions::Preemptions;
pub use record::{PodRecord, Second};
use record::{Shared, boxed};

use super::fast_map::FastMap;
use crate::policy::Enrolment;
use crate::policy::budget::{Siblings, unavailable_siblings};

/// Pods by namespace, then name.
type Pods = FastMap<Box<str>, FastMap<Box<str>, PodRecord>>;

/// Which pods a watch covers: one namespace, or all of them.
pub type Scope = Option<String>;

/// The view is trusted once every watch delivered its first full list, and as long as the API
/// server gave a sign of life (an event, or a successful list or watch request) within
/// `stale_after`. Errors alone would not tell: a connection that died silently reports none.
pub struct View {
    pods: RwLock<Pods>,
    health: Mutex<Health>,
    stale_after: Duration,
    /// The user busyguard's own requests are made as, once the API server said.
    own_user: OnceLock<String>,
    /// The label sets, owners and nodes the view's pods share.
    shared: Mutex<Shared>,
    /// Which namespaces are guarded.
    pub namespaces: Namespaces,
    /// The nodes going or ending, and why: their pods take no new task.
    pub nodes: Nodes,
    /// The owners under a busy rule (`--busy-when-owner`), as watched.
    pub owners: Owners,
    /// Kueue's preemptions (`--hold-kueue-preemption`).
    pub preemptions: Preemptions,
}

struct Health {
    /// `None`: no cluster configured; the view is never trusted but never blocks readiness.
    unlisted: Option<HashSet<Scope>>,
    last_sign_of_life: Instant,
    /// The last failure of a watch the pods' list waits on (namespaces, pods), until the next
    /// sign of life: why the view is not listed, for `/status`.
    last_failure: Option<String>,
}

/// Why the view cannot answer right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unavailable {
    NoCluster,
    NotListed,
    Stale { for_secs: u64 },
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unavailable::NoCluster => {
                f.write_str("busyguard runs without a cluster connection (--no-cluster, or no kubeconfig found)")
            }
            Unavailable::NotListed => f.write_str("busyguard has not finished listing the opted-in pods yet"),
            Unavailable::Stale { for_secs } => {
                write!(f, "busyguard's watch of the opted-in pods has shown no sign of life for {for_secs}s")
            }
        }
    }
}

impl View {
    /// A view fed by watches over `scopes`, guarding the namespaces `enrolment` says.
    pub fn watching(scopes: &[Scope], stale_after: Duration, enrolment: Enrolment) -> View {
        let unlisted = Some(scopes.iter().cloned().collect());
        let health = Health { unlisted, last_sign_of_life: Instant::now(), last_failure: None };
        let namespaces = Namespaces::new(enrolment);
        View { pods: RwLock::default(), health: Mutex::new(health), stale_after, namespaces, ..View::without_cluster() }
    }

    /// A view with no cluster behind it: evictions cannot be judged, everything else works.
    pub fn without_cluster() -> View {
        View {
            pods: RwLock::default(),
            health: Mutex::new(Health { unlisted: None, last_sign_of_life: Instant::now(), last_failure: None }),
            stale_after: Duration::ZERO,
            own_user: OnceLock::new(),
            shared: Mutex::default(),
            namespaces: Namespaces::default(),
            nodes: Nodes::default(),
            owners: Owners::default(),
            preemptions: Preemptions::default(),
        }
    }

    /// The user busyguard's own requests are made as, once known.
    pub fn own_user(&self) -> Option<&str> {
        self.own_user.get().map(String::as_str)
    }

    pub fn set_own_user(&self, user: String) {
        let _ = self.own_user.set(user);
    }

    /// Whether decisions may rely on the view now.
    pub fn check(&self, now: Instant) -> Result<(), Unavailable> {
        let health = self.health.lock();
        match &health.unlisted {
            None => Err(Unavailable::NoCluster),
            Some(unlisted) if !unlisted.is_empty() => Err(Unavailable::NotListed),
            Some(_) => match now.duration_since(health.last_sign_of_life) {
                quiet if quiet > self.stale_after => Err(Unavailable::Stale { for_secs: quiet.as_secs() }),
                _ => Ok(()),
            },
        }
    }

    /// The API server answered a read of pods, or a watch brought an event.
    pub fn alive(&self, now: Instant) {
        let mut health = self.health.lock();
        health.last_sign_of_life = health.last_sign_of_life.max(now);
        health.last_failure = None;
    }

    /// A watch the view depends on failed (`why`); it retries with backoff.
    pub fn watch_failed(&self, why: String) {
        self.health.lock().last_failure = Some(why);
    }

    /// The last failure of a watch since the last sign of life.
    pub fn last_failure(&self) -> Option<String> {
        self.health.lock().last_failure.clone()
    }

    pub fn listed(&self, scope: &Scope) {
        let mut health = self.health.lock();
        health.last_failure = None;
        if let Some(unlisted) = &mut health.unlisted {
            unlisted.remove(scope);
        }
    }

    /// The record of a pod, if the view holds it.
    pub fn record(&self, namespace: &str, name: &str) -> Option<PodRecord> {
        self.read().get(namespace)?.get(name).cloned()
    }

    /// `read` applied to the pod's record and, for a workload under a budget, its unavailable
    /// siblings, under the view's read lock (a delete or an eviction judges the record where it
    /// lies instead of copying its maps out).
    pub fn with_pod_under_budget<T>(
        &self,
        namespace: &str,
        name: &str,
        read: impl FnOnce(&PodRecord, Option<Siblings>) -> T,
    ) -> Option<T> {
        let pods = self.read();
        let in_namespace = pods.get(namespace)?;
        let record = in_namespace.get(name)?;
        let namespace_pods = in_namespace.iter().map(|(name, pod)| (&**name, pod));
        Some(read(record, unavailable_siblings(name, record, namespace_pods)))
    }

    /// Whether the view holds that pod: an opted-in pod busyguard guards.
    pub fn holds(&self, namespace: &str, name: &str) -> bool {
        self.read().get(namespace).is_some_and(|pods| pods.contains_key(name))
    }

    /// The pods of a namespace whose labels pass `keep`, with their names.
    pub fn select(&self, namespace: &str, keep: impl Fn(&PodRecord) -> bool) -> Vec<(String, PodRecord)> {
        let pods = self.read();
        let Some(in_namespace) = pods.get(namespace) else { return Vec::new() };
        in_namespace.iter().filter(|(_, pod)| keep(pod)).map(|(name, pod)| (name.to_string(), pod.clone())).collect()
    }

    /// `each` applied to every pod under the read lock, its results gathered.
    pub fn flat_map<I: IntoIterator>(&self, each: impl Fn(&str, &str, &PodRecord) -> I) -> Vec<I::Item> {
        let pods = self.read();
        let records = pods
            .iter()
            .flat_map(|(namespace, in_namespace)| in_namespace.iter().map(move |(name, pod)| (namespace, name, pod)));
        records.flat_map(|(namespace, name, pod)| each(namespace, name, pod)).collect()
    }

    /// `read` applied to the pods on `node` (as `namespace/name`), under the read lock.
    pub fn on_node<T>(&self, node: &str, read: impl FnOnce(Vec<(String, &PodRecord)>) -> T) -> T {
        let pods = self.read();
        let on_node = pods
            .iter()
            .flat_map(|(namespace, in_namespace)| {
                in_namespace.iter().map(move |(name, pod)| (format!("{namespace}/{name}"), pod))
            })
            .filter(|(_, pod)| pod.node.as_deref() == Some(node))
            .collect();
        read(on_node)
    }

    /// Stores the pod, returning what was stored before.
    pub fn insert(&self, namespace: &str, name: &str, mut pod: PodRecord) -> Option<PodRecord> {
        {
            let mut shared = self.shared.lock();
            pod.labels = shared.labels.intern(pod.labels);
            pod.owner = pod.owner.map(|owner| shared.names.intern(owner));
            pod.node = pod.node.map(|node| shared.names.intern(node));
        }
        self.write().entry(boxed(namespace)).or_default().insert(boxed(name), pod)
    }

    pub fn remove(&self, namespace: &str, name: &str) -> Option<PodRecord> {
        let mut pods = self.write();
        let in_namespace = pods.get_mut(namespace)?;
        let removed = in_namespace.remove(name);
        if in_namespace.is_empty() {
            pods.remove(namespace);
        }
        removed
    }

    pub fn len(&self) -> usize {
        self.read().values().map(FastMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn read(&self) -> RwLockReadGuard<'_, Pods> {
        self.pods.read()
    }

    fn write(&self) -> RwLockWriteGuard<'_, Pods> {
        self.pods.write()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::keys::BUSY_LABEL;
    use crate::policy::pod::PodFacts;
    use serde_json::json;
    use std::sync::Arc;

    fn api_pod(value: serde_json::Value) -> ApiPod {
        serde_json::from_value(value).unwrap()
    }

    /// A pod of workload `app` on `node`.
    fn workload_pod(name: &str, app: &str, node: &str) -> PodRecord {
        api_pod(json!({"metadata": {"name": name, "namespace": "ns", "labels": {"app": app, BUSY_LABEL: "true"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": app, "uid": "u", "controller": true}]},
            "spec": {"nodeName": node}}))
        .record(&[])
    }

    #[test]
    fn pods_of_a_workload_share_one_copy_of_their_labels_owner_and_node() {
        let view = View::without_cluster();
        for name in ["a", "b"] {
            view.insert("ns", name, workload_pod(name, "worker", "node-1"));
        }
        view.insert("ns", "c", workload_pod("c", "other", "node-1"));
        let pods = view.select("ns", |_| true);
        let pod = |name: &str| &pods.iter().find(|(n, _)| n == name).unwrap().1;
        assert!(Arc::ptr_eq(&pod("a").labels, &pod("b").labels));
        assert!(Arc::ptr_eq(pod("a").owner.as_ref().unwrap(), pod("b").owner.as_ref().unwrap()));
        assert!(Arc::ptr_eq(pod("a").node.as_ref().unwrap(), pod("c").node.as_ref().unwrap()));
        assert!(!Arc::ptr_eq(&pod("a").labels, &pod("c").labels), "another workload, other labels");
        assert_eq!(pod("c").label("app"), Some("other"));
    }

    #[test]
    fn copies_no_pod_holds_any_more_are_let_go() {
        let view = View::without_cluster();
        // One pod relabelled again and again: the view keeps a bounded number of label sets.
        for i in 0..10_000 {
            view.insert("ns", "a", workload_pod("a", &format!("app-{i}"), "node-1"));
        }
        let shared = view.shared.lock();
        assert!(shared.labels.values.len() <= 2048, "{} label sets kept", shared.labels.values.len());
        assert!(shared.names.values.len() <= 2048, "{} names kept", shared.names.values.len());
        let held = view.select("ns", |_| true).remove(0).1.labels;
        assert!(shared.labels.values.contains(&held), "the pod's own set is kept");
    }

    #[test]
    fn view_is_trusted_after_every_list_and_until_silent_too_long() {
        let scopes = [Some("a".to_string()), Some("b".to_string())];
        let view = View::watching(&scopes, Duration::from_secs(30), Enrolment::OptOut);
        let t0 = Instant::now();
        assert_eq!(view.check(t0), Err(Unavailable::NotListed));
        view.listed(&scopes[0]);
        assert_eq!(view.check(t0), Err(Unavailable::NotListed));
        view.listed(&scopes[1]);
        assert_eq!(view.check(t0), Ok(()));
        view.alive(t0);
        assert_eq!(view.check(t0 + Duration::from_secs(30)), Ok(()), "a short silence is tolerated");
        assert_eq!(view.check(t0 + Duration::from_secs(31)), Err(Unavailable::Stale { for_secs: 31 }));
        view.alive(t0 + Duration::from_secs(31));
        assert_eq!(view.check(t0 + Duration::from_secs(31)), Ok(()));
    }

    #[test]
    fn view_without_cluster_cannot_answer() {
        let view = View::without_cluster();
        assert_eq!(view.check(Instant::now()), Err(Unavailable::NoCluster));
    }
}
