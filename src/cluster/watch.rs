//! Feeds the view from watches of opted-in pods, and acts on what the changes mean: deferred
//! deletes that may go ahead, busy pods lost outside admission.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use jiff::Timestamp;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tracing::{info, warn};

use super::outbox::{Outbox, PodRef, SideEffect};
use super::view::{PodRecord, Scope, View, WatchedPod};
use crate::audit::{AuditLog, AuditRecord};
use crate::metrics::{CauseLabels, Metrics};
use crate::policy::PolicyConfig;
use crate::policy::busy::BUSY_LABEL;
use crate::policy::lifecycle::{LossCause, Observation, observe};

pub struct Watch {
    pub view: Arc<View>,
    pub outbox: Outbox,
    pub audit: Arc<AuditLog>,
    pub metrics: Arc<Metrics>,
    pub policy: PolicyConfig,
}

impl Watch {
    /// Runs until the process stops; the watches reconnect with backoff on their own.
    pub async fn run(self, client: Client, scopes: Vec<Scope>) {
        let streams = scopes.into_iter().map(|scope| {
            let api: Api<WatchedPod> = match &scope {
                Some(namespace) => Api::namespaced(client.clone(), namespace),
                None => Api::all(client.clone()),
            };
            let config = watcher::Config::default().labels(BUSY_LABEL);
            watcher(api, config).default_backoff().map(move |event| (scope.clone(), event)).boxed()
        });
        let mut events = futures::stream::select_all(streams);
        // Per scope being listed: the pods the list had so far.
        let mut listing: HashMap<Scope, HashSet<(String, String)>> = HashMap::new();
        let mut malformed_seen: HashSet<String> = HashSet::new();
        while let Some((scope, event)) = events.next().await {
            match event {
                Ok(watcher::Event::Init) => {
                    listing.insert(scope, HashSet::new());
                }
                Ok(watcher::Event::InitApply(pod)) => {
                    if let Some(listed) = listing.get_mut(&scope) {
                        listed.insert((pod.namespace().to_string(), pod.name().to_string()));
                    }
                    self.apply(pod, &mut malformed_seen);
                }
                Ok(watcher::Event::InitDone) => {
                    let listed = listing.remove(&scope).unwrap_or_default();
                    for (namespace, name, gone) in self.view.keep_only(&scope, &listed) {
                        self.observe(&namespace, &name, Some(gone), None);
                    }
                    self.view.listed(&scope);
                    info!(scope = scope.as_deref().unwrap_or("all namespaces"), pods = self.view.len(), "pods listed");
                }
                Ok(watcher::Event::Apply(pod)) => self.apply(pod, &mut malformed_seen),
                Ok(watcher::Event::Delete(pod)) => {
                    let (namespace, name) = (pod.namespace(), pod.name());
                    let gone = self.view.remove(namespace, name);
                    self.observe(namespace, name, gone, None);
                }
                Err(e) => {
                    self.view.failing(Instant::now());
                    self.metrics.watch_errors.inc();
                    warn!(error = %e, "watch of opted-in pods failed; retrying with backoff");
                }
            }
        }
    }

    fn apply(&self, pod: WatchedPod, malformed_seen: &mut HashSet<String>) {
        let (namespace, name) = (pod.namespace(), pod.name());
        if let Some(error) = &pod.malformed {
            // Skipped, and said once: the same object comes back on every relist.
            if malformed_seen.insert(format!("{namespace}/{name}")) {
                warn!(pod = %format!("{namespace}/{name}"), %error, "pod does not decode; skipped");
            }
            return;
        }
        let after = pod.record();
        let before = self.view.insert(namespace, name, after.clone());
        self.observe(namespace, name, before, Some(after));
    }

    fn observe(&self, namespace: &str, name: &str, before: Option<PodRecord>, after: Option<PodRecord>) {
        if let (Some(gone), None) = (&before, &after) {
            self.outbox.forget(&gone.uid);
        }
        let now = Timestamp::now();
        let Some(observation) = observe(before.as_ref(), after.as_ref(), self.policy.max_busy, now) else {
            return;
        };
        match observation {
            Observation::DeleteNow(request) => {
                let Some(after) = after else { return };
                let pod = PodRef { namespace: namespace.into(), name: name.into(), uid: after.uid.to_string() };
                let resource_version = after.resource_version.to_string();
                drop(self.outbox.send(SideEffect::DeleteIdle { pod, resource_version, request }));
            }
            Observation::Lost { busy_since, cause } => {
                self.metrics.busy_pods_lost.get_or_create(&CauseLabels { cause: cause.label() }).inc();
                let detail = match &cause {
                    LossCause::Failed { reason } => format!(
                        "busy pod {namespace}/{name} failed ({}) without a request busyguard could refuse: \
                         node-pressure eviction or preemption by the kubelet",
                        reason.as_deref().unwrap_or("no reason given")
                    ),
                    LossCause::Vanished => format!(
                        "busy pod {namespace}/{name} disappeared without a graceful delete: node lost or \
                         deleted with --force"
                    ),
                };
                warn!(pod = %format!("{namespace}/{name}"), cause = cause.label(), "{detail}");
                let record = AuditRecord {
                    decision: "lost",
                    reason: cause.label(),
                    detail,
                    resource: "pods".into(),
                    namespace: namespace.into(),
                    name: name.into(),
                    busy_since,
                    ..AuditRecord::new(now, self.policy.mode)
                };
                self.audit.record(&record);
            }
        }
    }
}
