//! Keeps the busy-pod PodDisruptionBudgets (see `policy::pdb`): on each sweep, and when a
//! namespace's first opted-in pod comes, lists the PDBs, plans against the view's opted-in pods,
//! and has the outbox create or delete busyguard's own.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::PoisonError;

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Client;
use kube::api::{Api, ListParams};
use tracing::{debug, info, warn};

use super::driver::api_in;
use super::outbox::{EffectResult, Outbox};
use super::view::{PodRecord, Scope, View};
use crate::metrics::Metrics;
use crate::policy::keys::{BUSY_LABEL, MANAGED_BY};
use crate::policy::outcome::Effect;
use crate::policy::pdb::{ExistingPdb, Step, allows_no_disruption, as_busyguard_writes_it, steps};
use crate::policy::pod::PodFacts;
use crate::policy::selector::Selector;

#[derive(Clone)]
pub struct BusyPdbs {
    pub client: Client,
    /// Creates and deletes go out as side effects, like every write.
    pub outbox: Outbox,
    pub scopes: Vec<Scope>,
    pub metrics: Arc<Metrics>,
    /// Held by the round under way: a sweep that comes while a slow one runs skips its own.
    pub round: Arc<tokio::sync::Mutex<()>>,
    /// The conflicts last warned of, by namespace: each is said when it changes, not every round.
    pub told: Arc<std::sync::Mutex<BTreeMap<String, Vec<String>>>>,
    /// The namespaces the last round planned for: those that had opted-in pods then.
    pub planned: Arc<std::sync::Mutex<BTreeSet<String>>>,
    /// Audit mode (`--mode audit`): no namespace wants a busy-pod PDB, so every one that enforce
    /// mode made is removed and none is made.
    pub none_wanted: bool,
}

/// The namespaces whose conflicts are not those `told` last: new, or changed.
fn news<'c>(
    told: &BTreeMap<String, Vec<String>>,
    conflicts: &'c BTreeMap<String, Vec<String>>,
) -> Vec<(&'c String, &'c Vec<String>)> {
    conflicts.iter().filter(|(namespace, conflicting)| told.get(*namespace) != Some(*conflicting)).collect()
}

/// Whether a pod of the view counts for the busy-pod PDBs: pods of namespaces left alone are kept
/// without the busy label.
fn opted_in(pod: &PodRecord) -> bool {
    pod.label(BUSY_LABEL).is_some()
}

/// The labels of the opted-in pods of the view, by namespace.
fn opted_in_by_namespace(view: &View) -> BTreeMap<String, Vec<BTreeMap<String, String>>> {
    let pods = view.flat_map(|namespace, _, pod| opted_in(pod).then(|| (namespace.to_string(), pod.labels_map())));
    let mut by_namespace: BTreeMap<String, Vec<BTreeMap<String, String>>> = BTreeMap::new();
    for (namespace, labels) in pods {
        by_namespace.entry(namespace).or_default().push(labels);
    }
    by_namespace
}

impl BusyPdbs {
    pub fn new(
        client: Client,
        outbox: Outbox,
        scopes: &[Scope],
        metrics: &Arc<Metrics>,
        none_wanted: bool,
    ) -> BusyPdbs {
        let (round, told, planned) = (Arc::default(), Arc::default(), Arc::default());
        let scopes = scopes.to_vec();
        BusyPdbs { client, outbox, scopes, metrics: metrics.clone(), round, told, planned, none_wanted }
    }

    /// Whether `pod`, new to the view, is opted in where the last round found no opted-in pod:
    /// the namespace's first gets its PDB from a round of its own, not up to a sweep interval later.
    pub fn is_namespaces_first(&self, namespace: &str, pod: &PodRecord) -> bool {
        !self.none_wanted
            && opted_in(pod)
            && !self.planned.lock().unwrap_or_else(PoisonError::into_inner).contains(namespace)
    }

    /// One round: what the plan says, carried out; failures are logged and tried next round.
    /// None while another round of this replica's is still under way.
    pub async fn keep(&self, view: &View) {
        let Ok(_round) = self.round.try_lock() else {
            debug!("the last busy-pod PDB round is still under way; this one is skipped");
            return;
        };
        let existing = match self.list().await {
            Ok(existing) => existing,
            Err(e) => {
                warn!(error = %e, "cannot list PodDisruptionBudgets; the busy-pod PDBs wait");
                return;
            }
        };
        let by_namespace = if self.none_wanted { BTreeMap::new() } else { opted_in_by_namespace(view) };
        *self.planned.lock().unwrap_or_else(PoisonError::into_inner) = by_namespace.keys().cloned().collect();
        let mut skipped = 0;
        let mut changes = Vec::new();
        let mut conflicts = BTreeMap::new();
        for step in steps(&by_namespace, &existing) {
            match step {
                Step::Create { namespace } => changes.push(Effect::CreateBusyPdb { namespace }),
                Step::Delete { namespace, name } => changes.push(Effect::DeleteBusyPdb { namespace, name }),
                Step::Covered { namespace, by } => {
                    debug!(%namespace, ?by, "no busy-pod PDB here: PDBs that allow no disruption select its pods already");
                }
                Step::Skip { namespace, conflicting } => {
                    skipped += 1;
                    conflicts.insert(namespace, conflicting);
                }
            }
        }
        self.tell(conflicts);
        self.carry_out(changes).await;
        self.metrics.busy_pdb_conflicts.set(skipped);
    }

    /// Through the outbox, awaited: the round ends when its changes are done or given up.
    async fn carry_out(&self, changes: Vec<Effect>) {
        let described: Vec<String> = changes.iter().map(ToString::to_string).collect();
        let results = futures::future::join_all(changes.into_iter().map(|change| self.outbox.send(change))).await;
        for (change, result) in described.iter().zip(results) {
            match result {
                Ok(EffectResult::Ok) => info!(%change, "busy-pod PDB changed"),
                // The other replica keeps the same PDBs: done there first.
                Ok(EffectResult::Moot) => debug!(%change, "busy-pod PDB: done by the other replica"),
                _ => warn!(%change, "busy-pod PDB not changed; tried again next round"),
            }
        }
    }

    /// Warns of each namespace's conflicting PDBs when they change, not every round.
    fn tell(&self, conflicts: BTreeMap<String, Vec<String>>) {
        let mut told = self.told.lock().unwrap_or_else(PoisonError::into_inner);
        for (namespace, conflicting) in news(&told, &conflicts) {
            warn!(%namespace, ?conflicting, "no busy-pod PDB here: a PDB of yours selects opted-in pods too, \
                and a pod in two PDBs cannot be evicted at all (500); busyguard's eviction webhook guards here \
                (said again only if it changes; busyguard_busy_pdb_conflicts counts it meanwhile)");
        }
        *told = conflicts;
    }

    async fn list(&self) -> Result<Vec<ExistingPdb>, kube::Error> {
        let mut existing = Vec::new();
        for scope in &self.scopes {
            let api: Api<PodDisruptionBudget> = api_in(&self.client, scope);
            for pdb in api.list(&ListParams::default()).await?.items {
                let meta = &pdb.metadata;
                let ours = meta.labels.as_ref().and_then(|l| l.get(MANAGED_BY.0)).is_some_and(|v| v == MANAGED_BY.1);
                let selector = pdb.spec.as_ref().and_then(|s| s.selector.as_ref());
                let selector = selector
                    .and_then(|s| Selector::from_label_selector(s).ok())
                    // An empty selector selects every pod of the namespace: as good as unknown.
                    .filter(|s| !s.is_empty());
                let namespace = meta.namespace.clone().unwrap_or_default();
                let as_kept = ours && as_busyguard_writes_it(pdb.spec.as_ref(), &namespace);
                existing.push(ExistingPdb {
                    namespace,
                    name: meta.name.clone().unwrap_or_default(),
                    ours,
                    selector,
                    as_kept,
                    allows_none: allows_no_disruption(pdb.spec.as_ref()),
                });
            }
        }
        Ok(existing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conflicting_pdb_is_warned_of_once_and_again_only_when_it_changes() {
        let conflicts = |pdbs: &[&str]| {
            BTreeMap::from([("games".to_string(), pdbs.iter().map(|p| p.to_string()).collect::<Vec<_>>())])
        };
        let first = conflicts(&["agones-gameserver-safe-to-evict-false"]);
        assert_eq!(news(&BTreeMap::new(), &first).len(), 1, "said the first time");
        assert!(news(&first, &first).is_empty(), "not every sweep after");
        let changed = conflicts(&["agones-gameserver-safe-to-evict-false", "games"]);
        assert_eq!(news(&first, &changed).len(), 1, "said again once it changes");
    }
}
