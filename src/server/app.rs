//! What the request handlers share: the policy, the audit log, the metrics, the cluster view,
//! the limits, and whether this replica serves; its health as `/status` reports it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use super::review_metrics::ReviewMetrics;
use crate::audit::AuditLog;
use crate::cluster::Cluster;
use crate::cluster::view::{OwnerKind, Unavailable};
use crate::metrics::{Metrics, OwnerRuleLabels};
use crate::policy::PolicyConfig;

/// Workloads with gauges of their own at most; the rest are summed as `(other)`.
const MAX_WORKLOADS: usize = 500;

/// How long a client may take at each step before the connection is dropped.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub handshake_timeout: Duration,
    /// Also bounds how long a connection may wait for its first request (HTTP/1.1 and HTTP/2).
    pub header_read_timeout: Duration,
    /// How long a connection that has been answered may stay idle.
    pub keep_alive_timeout: Duration,
    pub body_read_timeout: Duration,
    pub max_connections: usize,
    /// Of `max_connections`, how many one client address may hold.
    pub max_connections_per_peer: usize,
    pub max_in_flight: usize,
    /// Bytes of request bodies held in memory at once, at most.
    pub max_body_memory: usize,
}

/// Why a replica is not ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    /// It drains its connections before it stops.
    #[error("shutting down")]
    ShuttingDown,
    /// Its view has not had its first list: it could judge no eviction yet.
    #[error("{}", Unavailable::NotListed)]
    NotListed,
}

/// What the request handlers share.
pub struct App {
    pub policy: PolicyConfig,
    pub audit: Arc<AuditLog>,
    pub metrics: Arc<Metrics>,
    /// `metrics`' two series every review updates, found by index.
    pub(super) review_metrics: ReviewMetrics,
    pub limits: Limits,
    pub cluster: Cluster,
    /// One permit per review being handled (`Limits::max_in_flight`).
    pub in_flight: Semaphore,
    /// One permit per byte of request bodies in memory (`Limits::max_body_memory`).
    pub body_memory: Semaphore,
    serving: AtomicBool,
    /// The last write by another writer that took busyguard's marks off a busy pod: when, and
    /// the audit line's detail.
    last_overwrite: parking_lot::Mutex<Option<(Instant, String)>>,
}

/// How long `/status` names the last writer that took busyguard's marks off a busy pod.
const OVERWRITE_TOLD_FOR: std::time::Duration = std::time::Duration::from_secs(600);

impl App {
    /// Not serving until `start_serving` is called.
    pub fn new(
        policy: PolicyConfig,
        audit: Arc<AuditLog>,
        metrics: Arc<Metrics>,
        limits: Limits,
        cluster: Cluster,
    ) -> App {
        let in_flight = Semaphore::new(limits.max_in_flight);
        let body_memory = Semaphore::new(limits.max_body_memory);
        let (serving, last_overwrite) = (AtomicBool::new(false), parking_lot::Mutex::new(None));
        let review_metrics = ReviewMetrics::default();
        App { policy, audit, metrics, review_metrics, limits, cluster, in_flight, body_memory, serving, last_overwrite }
    }

    /// Another writer took busyguard's marks off a busy pod (`detail`, the audit line's: who, which).
    pub fn note_overwrite(&self, detail: &str) {
        *self.last_overwrite.lock() = Some((Instant::now(), detail.to_string()));
    }

    /// Takes reviews from now on (and reports ready, when the rest is).
    pub fn start_serving(&self) {
        self.serving.store(true, Ordering::Relaxed);
    }

    /// Not ready from now on: a shutdown has begun.
    pub fn stop_serving(&self) {
        self.serving.store(false, Ordering::Relaxed);
    }

    /// False from the start of a shutdown.
    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::Relaxed)
    }

    /// Ready means able to answer every review: serving, not draining, and the view listed once
    /// (where there is a cluster). Until that first list a new replica would answer each eviction
    /// 503, which its webhook lets through, while the replica a rollout replaces could still
    /// judge it. Once listed, a stale view or a failing audit sink does not take a replica out of
    /// the Service: the delete path needs neither, and with every replica unready each delete of
    /// an opted-in pod would fail cluster-wide (the webhook fails closed). They are reported by
    /// `health` (`/status`) and the metrics instead.
    pub fn readiness(&self) -> Result<(), NotReady> {
        if !self.is_serving() {
            return Err(NotReady::ShuttingDown);
        }
        if self.cluster.view.check(Instant::now()) == Err(Unavailable::NotListed) {
            return Err(NotReady::NotListed);
        }
        Ok(())
    }

    /// Sets the per-workload gauges from the view, as of now.
    pub fn count_workloads(&self) {
        use crate::metrics::{WorkloadLabels, WorkloadOnlyLabels};
        use crate::policy::workloads::{count, of_pod};
        let now = jiff::Timestamp::now();
        let pods = self.cluster.view.flat_map(|namespace, name, pod| {
            let counts = of_pod(pod, self.policy.max_busy, now)?;
            Some((namespace.to_string(), pod.workload(name), counts))
        });
        let counts = count(pods, MAX_WORKLOADS);
        let metrics = &self.metrics;
        let (pods, deletes, retired) =
            (&metrics.workload_pods, &metrics.workload_deferred_deletes, &metrics.workload_retired_keys);
        pods.clear();
        deletes.clear();
        retired.clear();
        for ((namespace, workload), counts) in counts {
            for (state, n) in [("busy", counts.busy), ("idle", counts.idle), ("lapsed", counts.lapsed)] {
                let labels = WorkloadLabels { namespace: namespace.clone(), workload: workload.clone(), state };
                pods.get_or_create(&labels).set(n as i64);
            }
            let labels = WorkloadOnlyLabels { namespace, workload };
            deletes.get_or_create(&labels).set(counts.delete_requested as i64);
            if counts.retired_keys > 0 {
                retired.get_or_create(&labels).set(counts.retired_keys as i64);
            }
        }
    }

    /// Everything busyguard depends on besides serving: the audit log written, and the cluster
    /// view (if any) listed and fresh.
    pub fn health(&self) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();
        problems.extend(self.audit.health().err().map(|e| e.0));
        let view = self.cluster.view.check(Instant::now()).map_err(|why| match why {
            // Evictions get 503 here too, as while the view is stale: not "ok".
            Unavailable::NoCluster => {
                format!("{why}: evictions and node deletes are answered 503, scale-downs go unprepared")
            }
            Unavailable::NotListed => match self.cluster.view.last_failure() {
                Some(failure) => format!("{}: {failure}", Unavailable::NotListed),
                None => Unavailable::NotListed.to_string(),
            },
            why => why.to_string(),
        });
        problems.extend(view.err());
        problems.extend(owner_rule_problems(&self.cluster.view.owners.kinds()));
        if let Some(Some(why)) = self.cluster.view.preemptions.unfollowed() {
            problems.push(format!(
                "--hold-kueue-preemption: Kueue's preemptions are not held ({why}); everything else is served, and \
                 busyguard tries again"
            ));
        }
        if let Some((at, detail)) = &*self.last_overwrite.lock()
            && at.elapsed() < OVERWRITE_TOLD_FOR
        {
            problems.push(format!(
                "another writer takes busyguard's marks off busy pods ({}s ago: {detail})",
                at.elapsed().as_secs()
            ));
        }
        if !self.is_serving() {
            problems.push(NotReady::ShuttingDown.to_string());
        }
        if problems.is_empty() { Ok(()) } else { Err(problems) }
    }

    /// Sets the gauges of what `health` checks, and the per-workload ones, as of now.
    pub fn update_gauges(&self) {
        self.metrics.view_pods.set(self.cluster.view.len() as i64);
        self.metrics.audit_failing.set(i64::from(self.audit.health().is_err()));
        self.metrics.view_unavailable.set(i64::from(self.cluster.view.check(Instant::now()).is_err()));
        self.count_workloads();
        let kueue_followed = !matches!(self.cluster.view.preemptions.unfollowed(), Some(Some(_)));
        self.metrics.kueue_hold_followed.set(i64::from(kueue_followed));
        for (kind, state) in self.cluster.view.owners.kinds() {
            let labels = OwnerRuleLabels { rule: kind };
            self.metrics.owner_rule_followed.get_or_create(&labels).set(i64::from(state.unfollowed.is_none()));
            self.metrics.owner_rule_ended_idle.get_or_create(&labels).set(state.ended_idle as i64);
        }
    }
}

/// Owners of a kind that end one after the other with the rule holding for none of them before
/// `/status` says so (the metric counts from the first).
const ENDED_IDLE_TOLD: u64 = 20;

/// What `/status` says of the busy rules' kinds: one not followed, or one whose rule held for
/// none of the last owners of its kind to end.
fn owner_rule_problems(kinds: &BTreeMap<String, OwnerKind>) -> Vec<String> {
    let mut problems = Vec::new();
    for (kind, state) in kinds {
        if let Some(why) = &state.unfollowed {
            problems.push(format!(
                "--busy-when-owner {kind}: its owners are not followed ({why}); their pods keep the busy label they \
                 have, everything else is served, and busyguard tries again"
            ));
        }
        if state.ended_idle >= ENDED_IDLE_TOLD {
            problems.push(format!(
                "--busy-when-owner {kind}: the rule held for none of the last {} owners of its kind to end: does it \
                 read a field this release of the owner's project writes?",
                state.ended_idle
            ));
        }
    }
    problems
}
