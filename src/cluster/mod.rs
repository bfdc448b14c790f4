//! busyguard's side of the cluster: the view the decisions read where a request does not carry
//! what they need, the watches that feed it (one index per kind, one driver for them all), and
//! the outbox through which side effects leave.

pub mod arbiter;
mod client;
mod driver;
mod fast_map;
mod kinds;
mod kueue;
mod namespaces;
pub mod nodes;
pub mod outbox;
pub mod owners;
pub mod pdb;
pub mod pods;
pub mod view;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::Api;
use kube::api::PostParams;
use tracing::{info, warn};

use crate::audit::AuditLog;
use crate::metrics::Metrics;
use crate::policy::{Enrolment, PolicyConfig};
use arbiter::Budgets;
use client::client;
pub use client::{ClusterSource, NO_CLUSTER, client_config};
use outbox::{Outbox, OutboxSettings};
use pods::Watch;
use view::View;

#[derive(Debug, Clone)]
pub struct ClusterSettings {
    pub source: ClusterSource,
    /// Watched namespaces; empty watches all of them.
    pub namespaces: Vec<String>,
    /// Which of them are guarded, by their `busyguard.io/enabled` label.
    pub enrolment: Enrolment,
    /// How long the watch may fail before the view is no longer trusted.
    pub stale_after: Duration,
    /// How often every watched pod is looked at again (lapsed protection, effects that failed).
    pub sweep_interval: Duration,
    /// Keep a busy-pod PodDisruptionBudget in each namespace with opted-in pods.
    pub busy_pdb: bool,
    /// Hold Kueue's preemptions where a namespace asks (`busyguard.io/hold-preemption=true`).
    pub hold_kueue_preemption: bool,
    /// busyguard's own namespace: the workload budgets' Leases are kept there.
    pub own_namespace: String,
    pub outbox: OutboxSettings,
}

pub struct Cluster {
    pub view: Arc<View>,
    pub outbox: Option<Outbox>,
    /// The arbiter of workload budgets across replicas.
    pub budgets: Option<Budgets>,
}

impl Cluster {
    /// Connects (without waiting for the API server) and starts the watch and the outbox.
    pub async fn start(
        settings: ClusterSettings,
        policy: &PolicyConfig,
        audit: Arc<AuditLog>,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Cluster> {
        let Some(config) = client_config(&settings.source).await? else {
            return Ok(Cluster::without_cluster(policy));
        };
        info!(server = %config.cluster_url, "watching opted-in pods");
        let scopes: Vec<view::Scope> = if settings.namespaces.is_empty() {
            vec![None]
        } else {
            settings.namespaces.iter().cloned().map(Some).collect()
        };
        let view = Arc::new(View::watching(&scopes, settings.stale_after, settings.enrolment));
        let watch_timeout = watch_timeout(settings.stale_after);
        let client = client(config, watch_timeout, &view)?;
        tokio::spawn(learn_own_user(client.clone(), view.clone()));
        let outbox = Outbox::start(client.clone(), audit, metrics.clone(), settings.outbox, policy.clone());
        let watch_timeout_secs = timeout_secs(watch_timeout);
        let watches =
            Watches { client: client.clone(), view: view.clone(), outbox: outbox.clone(), watch_timeout_secs };
        watches.start(&settings, policy, metrics, scopes);
        let budgets = Budgets { client, view: view.clone(), namespace: settings.own_namespace };
        tokio::spawn(budgets.clone().forget_spent(settings.sweep_interval));
        Ok(Cluster { view, outbox: Some(outbox), budgets: Some(budgets) })
    }

    /// No cluster configured: the decisions that need none are served, and it is said which not.
    fn without_cluster(policy: &PolicyConfig) -> Cluster {
        warn!("no cluster configured: evictions are answered 503, scale-downs are not prepared");
        if !policy.owner_rules.is_empty() {
            warn!("no cluster configured: the busy rules (--busy-when-owner) follow no owner");
        }
        Cluster { view: Arc::new(View::without_cluster()), outbox: None, budgets: None }
    }
}

/// What every watch of the cluster is started with.
struct Watches {
    client: kube::Client,
    view: Arc<View>,
    outbox: Outbox,
    watch_timeout_secs: u32,
}

impl Watches {
    /// The watches that feed the view, each on a task of its own: the opted-in pods (with the
    /// namespaces and the sweep), the nodes, and where asked the busy rules' owners and Kueue's
    /// Workloads.
    fn start(self, settings: &ClusterSettings, policy: &PolicyConfig, metrics: Arc<Metrics>, scopes: Vec<view::Scope>) {
        let Watches { client, view, outbox, watch_timeout_secs } = self;
        if !policy.owner_rules.is_empty() {
            let (client, view, outbox, metrics) = (client.clone(), view.clone(), outbox.clone(), metrics.clone());
            owners::OwnerWatch { client, view, outbox, metrics, watch_timeout_secs }
                .start(&policy.owner_rules, &scopes);
        }
        if settings.hold_kueue_preemption {
            kueue::start(client.clone(), view.clone(), &scopes, watch_timeout_secs);
        }
        // In audit mode the round runs to remove the busy-pod PDBs enforce mode made.
        let audit_mode = policy.mode == crate::policy::Mode::Audit;
        let pdbs = (settings.busy_pdb || audit_mode)
            .then(|| pdb::BusyPdbs::new(client.clone(), outbox.clone(), &scopes, &metrics, audit_mode));
        tokio::spawn(nodes::watch_nodes(client.clone(), view.clone(), policy.holds, watch_timeout_secs));
        let watch = Watch {
            client,
            view,
            outbox,
            metrics,
            policy: policy.clone(),
            sweep_interval: settings.sweep_interval,
            watch_timeout_secs,
            pdbs,
        };
        tokio::spawn(watch.run(scopes));
    }
}

/// Asks the API server who busyguard is (a SelfSubjectReview, granted to every authenticated
/// user), until it answers: busyguard's own writes to opted-in pods, and only they, pass its
/// pod-write rules (`policy::writes::judge_write`).
async fn learn_own_user(client: kube::Client, view: Arc<View>) {
    let api: Api<SelfSubjectReview> = Api::all(client);
    loop {
        match api.create(&PostParams::default(), &SelfSubjectReview::default()).await {
            Ok(review) => {
                if let Some(user) = review.status.and_then(|s| s.user_info).and_then(|u| u.username) {
                    info!(%user, "busyguard's own requests are made as");
                    view.set_own_user(user);
                    return;
                }
                warn!("the API server did not say who busyguard is; asking again");
            }
            Err(e) => warn!(error = %e, "cannot learn busyguard's own user yet (its marks are refused until then)"),
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

/// How long the API server keeps each watch open (`timeoutSeconds`): half the time the view may
/// go without a sign of life, so a quiet but healthy watch renews well within it.
fn watch_timeout(stale_after: Duration) -> Duration {
    (stale_after / 2).max(Duration::from_secs(1))
}

/// `watch_timeout` as a watch request's `timeoutSeconds`.
fn timeout_secs(watch_timeout: Duration) -> u32 {
    u32::try_from(watch_timeout.as_secs()).unwrap_or(u32::MAX).max(1)
}
