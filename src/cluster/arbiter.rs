//! The arbiter of workload budgets (`policy::budget`): the pods let go under a workload's budget
//! recorded on its Lease, written with the Lease's resourceVersion as the precondition, so that
//! the API server decides which of two replicas' claims comes first. The Leases live in
//! busyguard's own namespace, the only one its RBAC lets it write Leases in, and go once spent.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams, Preconditions};
use tracing::{debug, warn};

use super::view::View;
use crate::policy::budget::{Grants, LEASE_PREFIX, lease_name, spent};
use crate::policy::keys::{FIELD_MANAGER, GRANTS_ANNOTATION, MANAGED_BY, managed_by_busyguard};
use crate::policy::outcome::BudgetClaim;

/// How many times a claim reads and writes again after another claim's write came first.
const ATTEMPTS: usize = 8;

#[derive(Clone)]
pub struct Budgets {
    pub client: kube::Client,
    pub view: Arc<View>,
    /// busyguard's own namespace, where the Leases are.
    pub namespace: String,
}

/// Why a claim could not be recorded (the API server slow or refusing): the pod is refused, and
/// the requester retries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ClaimError(pub String);

impl Budgets {
    /// Records `claim`'s pod as let go if its workload's budget still has a place for it:
    /// `Ok(true)` once recorded, `Ok(false)` when the budget is used up (or other claims kept
    /// coming first: the requester retries), `Err` when the API server could not be asked.
    pub async fn claim(&self, claim: &BudgetClaim) -> Result<bool, ClaimError> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        let name = lease_name(&claim.namespace, &claim.workload);
        let params = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() };
        for _ in 0..ATTEMPTS {
            let lease = leases.get_opt(&name).await.map_err(|e| ClaimError(format!("reading Lease {name}: {e}")))?;
            let recorded = lease.as_ref().map(recorded_grants).unwrap_or_default();
            let still_there = |pod: &str| self.view.holds(&claim.namespace, pod);
            let Some(grants) = crate::policy::budget::claim(claim, &recorded, still_there, Timestamp::now()) else {
                return Ok(false);
            };
            let replacing = lease.is_some();
            let written = match lease {
                None => leases.create(&params, &new_lease(&name, &grants)).await,
                // The resourceVersion read above is the precondition: a write in between is a 409.
                Some(mut lease) => {
                    lease
                        .metadata
                        .annotations
                        .get_or_insert_default()
                        .insert(GRANTS_ANNOTATION.into(), encode(&grants));
                    leases.replace(&name, &params, &lease).await
                }
            };
            match written {
                Ok(_) => return Ok(true),
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                // Deleted as spent (by any replica) since it was read: read again, and create it.
                Err(kube::Error::Api(status)) if status.code == 404 && replacing => continue,
                Err(e) => return Err(ClaimError(format!("writing Lease {name}: {e}"))),
            }
        }
        Ok(false)
    }

    /// Every `interval`, deletes the Leases whose grants have all run out, each only as it was
    /// read (its resourceVersion the precondition: a claim written meanwhile keeps it), so the
    /// Leases go with the workloads and the disruptions they were for.
    pub async fn forget_spent(self, interval: Duration) {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        let ours = ListParams::default().labels(&managed_by_busyguard());
        let mut ticks = tokio::time::interval(interval);
        loop {
            ticks.tick().await;
            let listed = match leases.list(&ours).await {
                Ok(listed) => listed,
                Err(e) => {
                    warn!(error = %e, namespace = self.namespace, "cannot list the budgets' Leases; trying next round");
                    continue;
                }
            };
            let now = Timestamp::now();
            let budget_leases =
                listed.items.iter().filter(|l| l.metadata.name.as_deref().is_some_and(|n| n.starts_with(LEASE_PREFIX)));
            for lease in budget_leases.filter(|lease| spent(&recorded_grants(lease), now)) {
                let name = lease.metadata.name.as_deref().unwrap_or_default();
                let precondition =
                    Preconditions { resource_version: lease.metadata.resource_version.clone(), uid: None };
                let params = DeleteParams { preconditions: Some(precondition), ..DeleteParams::default() };
                match leases.delete(name, &params).await {
                    Ok(_) => debug!(lease = name, "spent budget Lease deleted"),
                    Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409) => {}
                    Err(e) => warn!(error = %e, lease = name, "cannot delete a spent budget Lease; trying next round"),
                }
            }
        }
    }
}

/// The grants a Lease records; unreadable ones count as none (they expire anyway).
fn recorded_grants(lease: &Lease) -> Grants {
    let recorded = lease.metadata.annotations.as_ref().and_then(|a| a.get(GRANTS_ANNOTATION));
    recorded.and_then(|json| serde_json::from_str(json).ok()).unwrap_or_default()
}

fn encode(grants: &Grants) -> String {
    serde_json::to_string(grants).expect("names and times always serialize")
}

fn new_lease(name: &str, grants: &Grants) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([(MANAGED_BY.0.into(), MANAGED_BY.1.into())])),
            annotations: Some(BTreeMap::from([(GRANTS_ANNOTATION.into(), encode(grants))])),
            ..ObjectMeta::default()
        },
        spec: None,
    }
}
