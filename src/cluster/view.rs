//! The cluster view: every opted-in pod, kept as the few hundred bytes busyguard's decisions
//! read, and whether the view can be trusted right now.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::{Arc, OnceLock};

use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};
use serde::{Deserialize, Deserializer};

use crate::policy::NEVER_GUARDED_NAMESPACES;
use crate::policy::budget::Siblings;
use crate::policy::disruption::is_available;
use crate::policy::keys::{
    BUSY_LABEL, DECIDING_ANNOTATIONS, DEFAULT_CONTAINER, DELETE_REQUESTED, FIELD_MANAGER, MAX_UNAVAILABLE,
    TASK_CONTAINER,
};
use crate::policy::pod::{Phase, PodFacts, PodStatus, Readiness};
use crate::policy::signals::workload;

/// A pod's labels in one slice, shared by every pod of the view with the same ones (the pods of
/// a workload carry the same few labels, but for the busy one).
type Labels = Arc<[(Box<str>, Box<str>)]>;

/// The annotations the decisions read, keyed by their names in [`DECIDING_ANNOTATIONS`].
type Annotations = Box<[(&'static str, Box<str>)]>;

fn get<'a, K: AsRef<str>>(pairs: &'a [(K, Box<str>)], key: &str) -> Option<&'a str> {
    pairs.iter().find(|(k, _)| k.as_ref() == key).map(|(_, v)| &**v)
}

/// A time to the second, as the API server writes the pod's times, in 8 bytes (`None` as
/// `i64::MIN`): four of them in every record of a view of 100k pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Second(i64);

impl Second {
    pub fn of(time: Option<Timestamp>) -> Second {
        Second(time.map_or(i64::MIN, |t| t.as_second()))
    }

    pub fn get(self) -> Option<Timestamp> {
        (self.0 != i64::MIN).then(|| Timestamp::from_second(self.0).ok()).flatten()
    }
}

/// One opted-in pod as the view keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct PodRecord {
    pub uid: Box<str>,
    pub resource_version: Box<str>,
    /// `Kind/name` of the controlling owner (shared, as the labels are).
    pub owner: Option<Arc<str>>,
    pub node: Option<Arc<str>>,
    pub phase: Phase,
    pub status_reason: Option<Box<str>>,
    /// The reason of a true `DisruptionTarget` condition.
    pub disruption: Option<Box<str>>,
    /// Whether the pod is Ready (`None`: no `Ready` condition yet), and since when.
    pub ready: Option<bool>,
    pub ready_since: Second,
    pub terminating: bool,
    pub created: Second,
    pub started: Second,
    /// Of the task container (see `PodFacts::last_restart`).
    pub last_restart: Second,
    pub labels: Labels,
    pub annotations: Annotations,
    /// Whether managedFields show busyguard as the writer of the delete-requested mark.
    pub mark_by_busyguard: bool,
}

impl PodRecord {
    pub fn labels_map(&self) -> std::collections::BTreeMap<String, String> {
        self.labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// The pod as busyguard treats it in a namespace that opted out: not opted in, and with no
    /// deferred delete of busyguard's to carry out.
    pub fn left_alone(mut self) -> PodRecord {
        let keep = |key: &str| key != BUSY_LABEL && key != DELETE_REQUESTED;
        self.labels = self.labels.iter().filter(|(k, _)| keep(k)).cloned().collect();
        self.annotations = self.annotations.into_iter().filter(|(k, _)| keep(k)).collect();
        self
    }

    /// The workload of the pod named `name`, as people name it (see [`workload`]).
    pub fn workload(&self, name: &str) -> String {
        workload(self.owner.as_deref(), self.template_hash(), name)
    }
}

impl PodFacts for PodRecord {
    fn uid(&self) -> &str {
        &self.uid
    }

    fn resource_version(&self) -> &str {
        &self.resource_version
    }

    fn label(&self, key: &str) -> Option<&str> {
        get(&self.labels, key)
    }

    fn annotation(&self, key: &str) -> Option<&str> {
        get(&self.annotations, key)
    }

    fn phase(&self) -> Phase {
        self.phase
    }

    fn is_terminating(&self) -> bool {
        self.terminating
    }

    fn created(&self) -> Option<Timestamp> {
        self.created.get()
    }

    fn started(&self) -> Option<Timestamp> {
        self.started.get()
    }

    fn last_restart(&self) -> Option<Timestamp> {
        self.last_restart.get()
    }

    fn readiness(&self) -> Option<Readiness> {
        self.ready.map(|ready| Readiness { ready, since: self.ready_since.get() })
    }

    fn status_reason(&self) -> Option<&str> {
        self.status_reason.as_deref()
    }

    fn disruption(&self) -> Option<&str> {
        self.disruption.as_deref()
    }

    fn mark_by_busyguard(&self) -> bool {
        self.mark_by_busyguard
    }
}

/// A pod as the API sends it in lists and watch events, decoded into the fields the view
/// keeps. A pod that does not decode is kept as `malformed` with its identity, so one bad
/// object cannot stop the whole list.
#[derive(Debug, Clone)]
pub struct WatchedPod {
    pub metadata: ObjectMeta,
    pub node_name: Option<String>,
    /// A toleration with no key and operator `Exists` (every taint, or every taint of an effect
    /// that evicts): Karpenter then never evicts the pod.
    pub tolerates_every_taint: bool,
    pub status: PodStatus,
    pub malformed: Option<String>,
}

impl<'de> Deserialize<'de> for WatchedPod {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Full {
            #[serde(default)]
            metadata: ObjectMeta,
            #[serde(default)]
            spec: Option<Spec>,
            #[serde(default)]
            status: Option<PodStatus>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Spec {
            #[serde(default)]
            node_name: Option<String>,
            #[serde(default)]
            tolerations: Option<Vec<Toleration>>,
        }
        #[derive(Deserialize)]
        struct Toleration {
            #[serde(default)]
            key: Option<String>,
            #[serde(default)]
            operator: Option<String>,
            #[serde(default)]
            effect: Option<String>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Identity {
            #[serde(default)]
            name: Option<String>,
            #[serde(default)]
            namespace: Option<String>,
            #[serde(default)]
            uid: Option<String>,
            #[serde(default)]
            resource_version: Option<String>,
        }
        #[derive(Deserialize)]
        struct IdentityOnly {
            metadata: Identity,
        }

        // Through a generic value first: watch events arrive inside a tagged enum, where only
        // self-describing values can be taken apart a second time.
        let value = serde_json::Value::deserialize(deserializer)?;
        match Full::deserialize(&value) {
            Ok(full) => Ok(WatchedPod {
                metadata: full.metadata,
                tolerates_every_taint: (full.spec.as_ref().and_then(|s| s.tolerations.as_ref()).into_iter().flatten())
                    .any(|t| {
                        t.key.as_deref().unwrap_or_default().is_empty()
                            && t.operator.as_deref() == Some("Exists")
                            && matches!(t.effect.as_deref().unwrap_or_default(), "" | "NoExecute")
                    }),
                node_name: full.spec.and_then(|s| s.node_name),
                status: full.status.unwrap_or_default(),
                malformed: None,
            }),
            Err(error) => {
                let identity = IdentityOnly::deserialize(&value).map_err(serde::de::Error::custom)?;
                let Identity { name, namespace, uid, resource_version } = identity.metadata;
                Ok(WatchedPod {
                    metadata: ObjectMeta { name, namespace, uid, resource_version, ..ObjectMeta::default() },
                    node_name: None,
                    tolerates_every_taint: false,
                    status: PodStatus::default(),
                    malformed: Some(error.to_string()),
                })
            }
        }
    }
}

impl k8s_openapi::Resource for WatchedPod {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "Pod";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "pods";
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for WatchedPod {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

fn boxed(s: &str) -> Box<str> {
    s.into()
}

impl WatchedPod {
    pub fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or_default()
    }

    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    pub fn record(&self) -> PodRecord {
        let meta = &self.metadata;
        let labels = meta.labels.iter().flatten().map(|(k, v)| (boxed(k), boxed(v))).collect();
        let annotations: Annotations = (meta.annotations.iter().flatten())
            .filter_map(|(k, v)| Some((*DECIDING_ANNOTATIONS.iter().find(|key| **key == k.as_str())?, boxed(v))))
            .collect();
        let owner = (meta.owner_references.iter().flatten())
            .find(|o| o.controller == Some(true))
            .map(|o| Arc::from(format!("{}/{}", o.kind, o.name)));
        let readiness = self.status.readiness();
        PodRecord {
            uid: boxed(meta.uid.as_deref().unwrap_or_default()),
            resource_version: boxed(meta.resource_version.as_deref().unwrap_or_default()),
            owner,
            node: self.node_name.as_deref().map(Arc::from),
            phase: Phase::parse(self.status.phase.as_deref()),
            status_reason: self.status.reason.as_deref().map(boxed),
            disruption: self.status.disruption().map(boxed),
            ready: readiness.map(|r| r.ready),
            ready_since: Second::of(readiness.and_then(|r| r.since)),
            terminating: meta.deletion_timestamp.is_some(),
            created: Second::of(meta.creation_timestamp.as_ref().map(|t| t.0)),
            started: Second::of(self.status.start_time),
            last_restart: Second::of(
                self.status.last_restart(get(&annotations, TASK_CONTAINER).or(get(&annotations, DEFAULT_CONTAINER))),
            ),
            labels,
            annotations,
            mark_by_busyguard: written_by(meta, FIELD_MANAGER, DELETE_REQUESTED),
        }
    }
}

/// Whether `manager` owns the annotation `key` through the pod itself (not its status), as the
/// API server's managedFields record it.
fn written_by(meta: &ObjectMeta, manager: &str, key: &str) -> bool {
    let field = format!("f:{key}");
    let through_the_pod = |entry: &&ManagedFieldsEntry| {
        entry.manager.as_deref() == Some(manager) && entry.subresource.as_deref().unwrap_or_default().is_empty()
    };
    (meta.managed_fields.iter().flatten()).filter(through_the_pod).any(|entry| {
        let fields = entry.fields_v1.as_ref().map(|f| &f.0);
        fields.and_then(|f| f.get("f:metadata")?.get("f:annotations")?.get(&field)).is_some()
    })
}

/// Pods by namespace, then name.
type Pods = HashMap<Box<str>, HashMap<Box<str>, PodRecord>>;

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
    /// Namespaces whose pods busyguard leaves alone (besides `NEVER_GUARDED_NAMESPACES`).
    opted_out: RwLock<HashSet<String>>,
    /// The label sets, owners and nodes the view's pods share.
    shared: Mutex<Shared>,
}

/// One copy of each label set, owner and node name the view's pods carry, however many pods
/// carry it: at 100k pods the view takes about 40% less memory for it (BENCHMARKS.md).
#[derive(Default)]
struct Shared {
    labels: Interned<[(Box<str>, Box<str>)]>,
    names: Interned<str>,
}

/// Values kept once each; those no pod holds any more are let go as the set grows.
struct Interned<T: ?Sized> {
    values: HashSet<Arc<T>>,
    /// Size after the last letting go: the next one comes when it has doubled.
    after_purge: usize,
}

impl<T: ?Sized> Default for Interned<T> {
    fn default() -> Self {
        Interned { values: HashSet::new(), after_purge: 0 }
    }
}

impl<T: ?Sized + Hash + Eq> Interned<T> {
    /// The copy kept of `value` (which becomes it, if there is none yet).
    fn intern(&mut self, value: Arc<T>) -> Arc<T> {
        if let Some(kept) = self.values.get(&value) {
            return kept.clone();
        }
        if self.values.len() >= 2 * self.after_purge.max(1024) {
            // Held by the set alone: no pod carries it any more.
            self.values.retain(|kept| Arc::strong_count(kept) > 1);
            self.after_purge = self.values.len();
        }
        self.values.insert(value.clone());
        value
    }
}

struct Health {
    /// `None`: no cluster configured; the view is never trusted but never blocks readiness.
    unlisted: Option<HashSet<Scope>>,
    last_sign_of_life: Instant,
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
    /// A view fed by watches over `scopes`.
    pub fn watching(scopes: &[Scope], stale_after: Duration) -> View {
        let unlisted = Some(scopes.iter().cloned().collect());
        let health = Health { unlisted, last_sign_of_life: Instant::now() };
        View { pods: RwLock::default(), health: Mutex::new(health), stale_after, ..View::without_cluster() }
    }

    /// A view with no cluster behind it: evictions cannot be judged, everything else works.
    pub fn without_cluster() -> View {
        View {
            pods: RwLock::default(),
            health: Mutex::new(Health { unlisted: None, last_sign_of_life: Instant::now() }),
            stale_after: Duration::ZERO,
            own_user: OnceLock::new(),
            opted_out: RwLock::default(),
            shared: Mutex::default(),
        }
    }

    /// The user busyguard's own requests are made as, once known.
    pub fn own_user(&self) -> Option<&str> {
        self.own_user.get().map(String::as_str)
    }

    pub fn set_own_user(&self, user: String) {
        let _ = self.own_user.set(user);
    }

    /// Whether busyguard leaves the pods of `namespace` alone, as its webhooks do.
    pub fn is_opted_out(&self, namespace: &str) -> bool {
        NEVER_GUARDED_NAMESPACES.contains(&namespace) || self.opted_out.read().contains(namespace)
    }

    /// Records whether `namespace` opted out; true when that changed.
    pub fn set_opted_out(&self, namespace: &str, out: bool) -> bool {
        let mut opted_out = self.opted_out.write();
        if out { opted_out.insert(namespace.to_string()) } else { opted_out.remove(namespace) }
    }

    /// The namespaces opted out by label, as recorded.
    pub fn opted_out(&self) -> HashSet<String> {
        self.opted_out.read().clone()
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
    }

    pub fn listed(&self, scope: &Scope) {
        let mut health = self.health.lock();
        if let Some(unlisted) = &mut health.unlisted {
            unlisted.remove(scope);
        }
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
        Some(read(record, Self::unavailable_siblings(in_namespace, name, record)))
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

    /// The other pods of this pod's workload (a Deployment across its ReplicaSets, else the
    /// controlling owner) that are unavailable: not Running and Ready, or going away. `None`
    /// when the pod has no owner, or no budget (`busyguard.io/max-unavailable`) to count for:
    /// the namespace is scanned only then.
    fn unavailable_siblings(
        in_namespace: &HashMap<Box<str>, PodRecord>,
        name: &str,
        record: &PodRecord,
    ) -> Option<Siblings> {
        record.label(MAX_UNAVAILABLE)?;
        let owner = record.owner.as_deref()?;
        let workload = record.workload(name);
        // The same owner is the same workload; only another owner needs its workload worked out
        // (a Deployment's other ReplicaSet).
        let same_workload = |other: &str, pod: &PodRecord| match pod.owner.as_deref() {
            Some(theirs) => theirs == owner || pod.workload(other) == workload,
            None => false,
        };
        let unavailable = (in_namespace.iter())
            .filter(|(other, pod)| &***other != name && same_workload(other, pod))
            .filter(|(_, pod)| pod.terminating || !is_available(*pod))
            .map(|(other, _)| other.to_string())
            .collect();
        Some(Siblings { workload, unavailable })
    }

    /// `read` applied to the pods on `node` (as `namespace/name`), under the read lock.
    pub fn on_node<T>(&self, node: &str, read: impl FnOnce(Vec<(String, &PodRecord)>) -> T) -> T {
        let pods = self.read();
        let on_node = (pods.iter())
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

    /// After a full list of `scope`: drops the pods the list no longer had, and returns them.
    pub fn keep_only(&self, scope: &Scope, listed: &HashSet<(String, String)>) -> Vec<(String, String, PodRecord)> {
        let mut pods = self.write();
        let mut gone = Vec::new();
        for (namespace, in_namespace) in pods.iter_mut() {
            if scope.as_deref().is_some_and(|s| s != &**namespace) {
                continue;
            }
            in_namespace.retain(|name, pod| {
                let keep = listed.contains(&(namespace.to_string(), name.to_string()));
                if !keep {
                    gone.push((namespace.to_string(), name.to_string(), pod.clone()));
                }
                keep
            });
        }
        pods.retain(|_, in_namespace| !in_namespace.is_empty());
        gone
    }

    pub fn len(&self) -> usize {
        self.read().values().map(HashMap::len).sum()
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
    use crate::policy::keys::{BUSY_LABEL, BUSY_SINCE};
    use serde_json::json;

    fn watched(value: serde_json::Value) -> WatchedPod {
        serde_json::from_value(value).unwrap()
    }

    /// A pod of workload `app` on `node`.
    fn workload_pod(name: &str, app: &str, node: &str) -> PodRecord {
        watched(json!({"metadata": {"name": name, "namespace": "ns", "labels": {"app": app, BUSY_LABEL: "true"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": app, "uid": "u", "controller": true}]},
            "spec": {"nodeName": node}}))
        .record()
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
    fn record_keeps_what_decisions_read_and_drops_the_rest() {
        let pod = watched(json!({
            "metadata": {"name": "w-1", "namespace": "capture", "uid": "u-1", "resourceVersion": "7",
                "labels": {"app": "worker", BUSY_LABEL: "true"},
                "annotations": {BUSY_SINCE: "2026-11-21T20:00:00Z",
                    "kubectl.kubernetes.io/last-applied-configuration": "x".repeat(5000)},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "w", "uid": "r",
                    "controller": true}],
                "managedFields": [{"manager": "kubectl"}]},
            "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}));
        let record = pod.record();
        assert_eq!(record.label("app"), Some("worker"));
        assert_eq!(record.annotation(BUSY_SINCE), Some("2026-11-21T20:00:00Z"));
        assert_eq!(record.annotations.len(), 1, "unrelated annotations are not kept");
        assert_eq!(record.owner.as_deref(), Some("ReplicaSet/w"));
        assert_eq!(record.node.as_deref(), Some("node-1"));
        assert_eq!(record.phase, Phase::Running);
        assert_eq!(record.readiness(), Some(Readiness { ready: true, since: None }));
        assert_eq!(&*record.resource_version, "7");
    }

    #[test]
    fn a_mark_counts_only_as_busyguard_wrote_it_through_the_pod_not_its_status() {
        let marked = |subresource: Option<&str>| {
            let mut entry = json!({"manager": "busyguard", "operation": "Update", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:annotations": {"f:busyguard.io/delete-requested": {}}}}});
            if let Some(subresource) = subresource {
                entry["subresource"] = json!(subresource);
            }
            watched(json!({"metadata": {"name": "w", "namespace": "ns",
                "labels": {BUSY_LABEL: "false", DELETE_REQUESTED: "true"},
                "annotations": {DELETE_REQUESTED: r#"{"by":"alice","at":"2026-11-21T20:00:00Z"}"#},
                "managedFields": [entry]}}))
            .record()
        };
        assert!(marked(None).delete_request().is_some());
        assert!(marked(Some("status")).delete_request().is_none(), "written through pods/status");
    }

    #[test]
    fn malformed_pod_keeps_its_identity_and_says_what_is_wrong() {
        let pod = watched(json!({"metadata": {"name": "w", "namespace": "ns", "resourceVersion": "9"},
                                 "status": {"phase": 42}}));
        assert_eq!(pod.name(), "w");
        assert_eq!(pod.metadata.resource_version.as_deref(), Some("9"));
        assert!(pod.malformed.as_deref().unwrap().contains("invalid type"));
    }

    #[test]
    fn view_is_trusted_after_every_list_and_until_silent_too_long() {
        let scopes = [Some("a".to_string()), Some("b".to_string())];
        let view = View::watching(&scopes, Duration::from_secs(30));
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

    #[test]
    fn a_new_list_drops_pods_deleted_while_the_watch_was_down() {
        let view = View::watching(&[None], Duration::from_secs(30));
        let record = watched(json!({"metadata": {"name": "x", "namespace": "a"}})).record();
        view.insert("a", "kept", record.clone());
        view.insert("b", "gone", record.clone());
        let listed = HashSet::from([("a".to_string(), "kept".to_string())]);
        let gone = view.keep_only(&None, &listed);
        assert_eq!(gone.len(), 1);
        assert_eq!((gone[0].0.as_str(), gone[0].1.as_str()), ("b", "gone"));
        assert_eq!(view.len(), 1);
    }
}
