//! One opted-in pod as the view keeps it: the few hundred bytes busyguard's decisions read,
//! with the label sets, owners and node names its pods share kept once.

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::Arc;

use jiff::Timestamp;

use crate::policy::keys::{BUSY_LABEL, DELETE_REQUESTED};
use crate::policy::pod::{OwnerKey, Phase, PodFacts, Readiness};
use crate::policy::workloads::workload_of;

/// A pod's labels in one slice, shared by every pod of the view with the same ones (the pods of
/// a workload carry the same few labels, but for the busy one).
pub(super) type Labels = Arc<[(Box<str>, Box<str>)]>;

/// The annotations the decisions read, keyed by their names in [`DECIDING_ANNOTATIONS`].
pub(super) type Annotations = Box<[(&'static str, Box<str>)]>;

pub(super) fn get<'a, K: AsRef<str>>(pairs: &'a [(K, Box<str>)], key: &str) -> Option<&'a str> {
    pairs.iter().find(|(k, _)| k.as_ref() == key).map(|(_, v)| &**v)
}

pub(super) fn boxed(s: &str) -> Box<str> {
    s.into()
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
    /// The controlling owner as `group/Kind/name` ([`OwnerKey`]; shared, as the
    /// labels are).
    pub owner: Option<Arc<str>>,
    pub node: Option<Arc<str>>,
    pub phase: Phase,
    /// See [`crate::policy::pod::not_started`].
    pub not_started: bool,
    /// See [`crate::policy::pod::task_ended`].
    pub task_ended: bool,
    pub status_reason: Option<Box<str>>,
    /// The reason of a true `DisruptionTarget` condition.
    pub disruption: Option<Box<str>>,
    /// Whether the pod is Ready (`None`: no `Ready` condition yet), and since when.
    pub ready: Option<bool>,
    pub ready_since: Second,
    pub ready_gated: bool,
    pub terminating: bool,
    pub created: Second,
    pub started: Second,
    /// Of the task container (see `PodFacts::last_restart`).
    pub last_restart: Second,
    pub labels: Labels,
    pub annotations: Annotations,
    /// Whether managedFields show busyguard as the writer of the delete-requested mark.
    pub mark_by_busyguard: bool,
    /// Whether managedFields show busyguard as the writer of the busy label.
    pub busy_label_by_busyguard: bool,
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

    /// The workload of the pod named `name`, as people name it (see [`workload_of`]).
    pub fn workload(&self, name: &str) -> String {
        workload_of(self, name)
    }
}

impl PodFacts for PodRecord {
    fn uid(&self) -> &str {
        &self.uid
    }

    fn owner_key(&self) -> Option<OwnerKey<'_>> {
        self.owner.as_deref().and_then(OwnerKey::parse)
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

    fn not_started(&self) -> bool {
        self.not_started
    }

    fn task_ended(&self) -> bool {
        self.task_ended
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
        self.ready.map(|ready| Readiness { ready, since: self.ready_since.get(), gated: self.ready_gated })
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

    fn busy_label_by_busyguard(&self) -> bool {
        self.busy_label_by_busyguard
    }
}

/// One copy of each label set, owner and node name the view's pods carry, however many pods
/// carry it: at 100k pods the view takes about 40% less memory for it (BENCHMARKS.md).
#[derive(Default)]
pub(super) struct Shared {
    pub labels: Interned<[(Box<str>, Box<str>)]>,
    pub names: Interned<str>,
}

/// Values kept once each; those no pod holds any more are let go as the set grows.
pub(super) struct Interned<T: ?Sized> {
    pub values: HashSet<Arc<T>>,
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
    pub fn intern(&mut self, value: Arc<T>) -> Arc<T> {
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
