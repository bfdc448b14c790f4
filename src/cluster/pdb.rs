//! Keeps the busy-pod PodDisruptionBudgets (see `policy::pdb`): on each sweep, lists the PDBs,
//! plans against the view's opted-in pods, and creates or deletes busyguard's own.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use tracing::{debug, info, warn};

use super::view::{PodRecord, Scope, View};
use crate::metrics::Metrics;
use crate::policy::keys::{BUSY_LABEL, FIELD_MANAGER, PROTECTED_LABEL};
use crate::policy::pdb::{BUSY_PDB_MIN_AVAILABLE, BUSY_PDB_NAME, ExistingPdb, MANAGED_BY, Step, plan};
use crate::policy::pod::PodFacts;
use crate::policy::selector::Selector;

#[derive(Clone)]
pub struct BusyPdbs {
    pub client: Client,
    pub scopes: Vec<Scope>,
    pub metrics: Arc<Metrics>,
    /// Held by the round under way: a sweep that comes while a slow one runs skips its own.
    pub round: Arc<tokio::sync::Mutex<()>>,
}

impl BusyPdbs {
    /// One round: what the plan says, carried out; failures are logged and tried next round.
    /// None while another round of this replica's is still under way.
    pub async fn keep(&self, view: &View) {
        let Ok(_round) = self.round.try_lock() else {
            return debug!("the last busy-pod PDB round is still under way; this one is skipped");
        };
        let existing = match self.list().await {
            Ok(existing) => existing,
            Err(e) => return warn!(error = %e, "cannot list PodDisruptionBudgets; the busy-pod PDBs wait"),
        };
        // Opted in: pods of namespaces that opted out are kept without the busy label.
        let opted_in = |pod: &PodRecord| pod.label(BUSY_LABEL).is_some();
        let pods = view.flat_map(|namespace, _, pod| opted_in(pod).then(|| (namespace.to_string(), pod.labels_map())));
        let mut by_namespace: BTreeMap<String, Vec<BTreeMap<String, String>>> = BTreeMap::new();
        for (namespace, labels) in pods {
            by_namespace.entry(namespace).or_default().push(labels);
        }
        let mut skipped = 0;
        for step in plan(&by_namespace, &existing) {
            let done = match &step {
                Step::Create { namespace } => {
                    let api: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), namespace);
                    let params = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() };
                    api.create(&params, &busy_pdb(namespace)).await.map(|_| ())
                }
                Step::Delete { namespace, name } => {
                    let api: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), namespace);
                    api.delete(name, &DeleteParams::default()).await.map(|_| ())
                }
                Step::Skip { namespace, conflicting } => {
                    skipped += 1;
                    warn!(%namespace, ?conflicting, "no busy-pod PDB here: a PDB of yours selects opted-in pods too, \
                        and a pod in two PDBs cannot be evicted at all (500); busyguard's eviction webhook guards here");
                    Ok(())
                }
            };
            // The other replica keeps the same PDBs: one it made or took away first is done.
            let by_the_other = match (&done, &step) {
                (Err(kube::Error::Api(s)), Step::Create { .. }) => s.code == 409,
                (Err(kube::Error::Api(s)), Step::Delete { .. }) => s.code == 404,
                _ => false,
            };
            match done {
                _ if by_the_other => debug!(?step, "busy-pod PDB: done by the other replica"),
                Ok(()) if !matches!(step, Step::Skip { .. }) => info!(?step, "busy-pod PDB"),
                Ok(()) => {}
                Err(e) => warn!(?step, error = %e, "busy-pod PDB not changed; tried again next round"),
            }
        }
        self.metrics.busy_pdb_conflicts.set(skipped);
    }

    async fn list(&self) -> Result<Vec<ExistingPdb>, kube::Error> {
        let mut existing = Vec::new();
        for scope in &self.scopes {
            let api: Api<PodDisruptionBudget> = match scope {
                Some(namespace) => Api::namespaced(self.client.clone(), namespace),
                None => Api::all(self.client.clone()),
            };
            for pdb in api.list(&ListParams::default()).await?.items {
                let meta = &pdb.metadata;
                let ours = meta.labels.as_ref().and_then(|l| l.get(MANAGED_BY.0)).is_some_and(|v| v == MANAGED_BY.1);
                let selector = (pdb.spec.as_ref().and_then(|s| s.selector.as_ref()))
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
                });
            }
        }
        Ok(existing)
    }
}

/// Whether a PDB's spec says what busyguard's says, however the API server spells it (a list
/// left out or empty).
fn as_busyguard_writes_it(spec: Option<&PodDisruptionBudgetSpec>, namespace: &str) -> bool {
    let ours = busy_pdb(namespace).spec;
    let said = |spec: Option<&PodDisruptionBudgetSpec>| {
        let spec = spec.cloned().unwrap_or_default();
        let selector = spec.selector.unwrap_or_default();
        let expressions: Vec<(String, String, Vec<String>)> = (selector.match_expressions.unwrap_or_default())
            .into_iter()
            .map(|e| (e.key, e.operator, e.values.unwrap_or_default()))
            .collect();
        let labels = selector.match_labels.unwrap_or_default();
        (spec.min_available, spec.max_unavailable, spec.unhealthy_pod_eviction_policy, labels, expressions)
    };
    said(spec) == said(ours.as_ref())
}

/// busyguard's PDB for a namespace: every protected pod, no disruption allowed.
fn busy_pdb(namespace: &str) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(BUSY_PDB_NAME.into()),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([(MANAGED_BY.0.into(), MANAGED_BY.1.into())])),
            ..ObjectMeta::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(BUSY_PDB_MIN_AVAILABLE)),
            // Opted-in pods only: on those busyguard keeps the protected label true to the facts
            // (anyone may label any pod, but busyguard takes it off an opted-in pod it does not
            // protect).
            selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(PROTECTED_LABEL.into(), "true".into())])),
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: BUSY_LABEL.into(),
                    operator: "Exists".into(),
                    values: None,
                }]),
            }),
            // Said outright: a busy pod that is not Ready (readiness as the busy signal, or a
            // probe failing mid-task) stays protected. Platforms that force AlwaysAllow by policy
            // would let such a pod be evicted.
            unhealthy_pod_eviction_policy: Some("IfHealthyBudget".into()),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    }
}
