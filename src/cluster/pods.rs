//! Feeds the view from watches of opted-in pods, and carries out what each change means (see
//! `policy::observed`): deferred deletes that may go ahead, stale annotations to bring up to
//! date, busy pods lost outside admission. A sweep on a timer asks the same of every pod, so a
//! protection that runs out, or a side effect that did not land, is acted on without a change.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::BoxStream;
use jiff::Timestamp;
use kube::api::ListParams;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::driver::{self, Driver, Index, Key, Scoped};
use super::namespaces::{self, Guarding};
use super::outbox::{EffectResult, Outbox};
use super::owners;
use super::pdb::BusyPdbs;
use super::view::{ApiPod, PodRecord, Scope, View};
use crate::metrics::Metrics;
use crate::policy::PolicyConfig;
use crate::policy::flips;
use crate::policy::keys::BUSY_LABEL;
use crate::policy::observed::{self, Observed};
use crate::policy::outcome::Effect;
use crate::policy::owners::Terms;
use crate::policy::pod::{PodFacts, PodRef};

pub struct Watch {
    pub client: Client,
    pub view: Arc<View>,
    pub outbox: Outbox,
    pub metrics: Arc<Metrics>,
    pub policy: PolicyConfig,
    /// How often every pod in the view is looked at again.
    pub sweep_interval: Duration,
    /// How long the API server keeps each watch request open.
    pub watch_timeout_secs: u32,
    /// The busy-pod PDBs to keep on each sweep, if asked to.
    pub pdbs: Option<BusyPdbs>,
}

impl Watch {
    /// Runs until the process stops; the watches reconnect with backoff on their own. Nothing
    /// here waits on the API server but the watches: a namespace's pods are listed aside.
    pub async fn run(self, scopes: Vec<Scope>) {
        let mut pod_events = self.pod_events(scopes);
        let mut namespace_events = namespaces::events(&self.client, &self.view, self.watch_timeout_secs);
        let (mut namespace_driver, mut pod_driver) = (Driver::default(), Driver::default());
        let mut namespaces = namespaces::Guarded { view: &self.view, metrics: &self.metrics };
        // The namespaces left alone are listed before any pod is looked at: until then, a pod of
        // one would be taken for a guarded one (refreshed, or given a busy-pod PDB). What that
        // list sets off is moot: no pod is in the view yet, and the pods' first list finds each
        // namespace as recorded.
        driver::drive_until_listed(&mut namespace_driver, &mut namespaces, &mut namespace_events).await;
        let mut pods = Pods { watch: &self, malformed_seen: HashSet::new() };
        let (relisted, mut relists) = mpsc::unbounded_channel();
        let mut sweep = tokio::time::interval(self.sweep_interval);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let effects = tokio::select! {
                next = pod_events.next() => match next {
                    Some((scope, event)) => pod_driver.step(&mut pods, scope, event).changes,
                    None => return,
                },
                _ = sweep.tick() => self.sweep(),
                Some((scope, event)) = namespace_events.next() => {
                    let turned = namespace_driver.step(&mut namespaces, scope, event).changes;
                    turned.into_iter().flat_map(|turn| match turn {
                        Guarding::LeftAlone(namespace) => pods.leave_alone(&namespace),
                        Guarding::Guarded(namespace) => {
                            self.list_pods(namespace, relisted.clone());
                            Vec::new()
                        }
                    }).collect()
                }
                Some(listed) = relists.recv() => pods.relisted(listed),
            };
            for effect in effects {
                drop(self.outbox.send(effect));
            }
        }
    }

    /// The watches of opted-in pods, one per scope. Every watch renews within the client's read
    /// timeout (see `watch_timeout`): a quiet one would be cut, and reopened from a
    /// resourceVersion too old to resume, relisting with a growing backoff.
    fn pod_events(&self, scopes: Vec<Scope>) -> BoxStream<'static, Scoped<ApiPod>> {
        let apis = scopes.into_iter().map(|scope| {
            let api: Api<ApiPod> = driver::api_in(&self.client, &scope);
            (scope, api)
        });
        let config = watcher::Config::default().labels(BUSY_LABEL).timeout(self.watch_timeout_secs);
        driver::watch(apis.collect(), config)
    }

    /// Lists the opted-in pods of `namespace`, guarded again, aside: what the view kept of them
    /// while they were left alone lacks their busy label and annotations.
    fn list_pods(&self, namespace: String, relisted: mpsc::UnboundedSender<Vec<ApiPod>>) {
        info!(%namespace, "namespace guarded again: listing its pods");
        let api: Api<ApiPod> = Api::namespaced(self.client.clone(), &namespace);
        tokio::spawn(async move {
            match api.list(&ListParams::default().labels(BUSY_LABEL)).await {
                Ok(pods) => drop(relisted.send(pods.items)),
                Err(e) => warn!(namespace, error = %e, "cannot list the pods of a namespace that opted in again"),
            }
        });
    }

    fn apply(&self, pod: ApiPod, malformed_seen: &mut HashSet<String>) -> Vec<Effect> {
        let (namespace, name) = (pod.namespace(), pod.name());
        if let Some(error) = &pod.malformed {
            // An older version that did decode no longer says anything about this pod.
            self.view.remove(namespace, name);
            // Skipped, and said once: the same object comes back on every relist.
            if malformed_seen.len() > 10_000 {
                malformed_seen.clear();
            }
            if malformed_seen.insert(format!("{namespace}/{name}")) {
                warn!(pod = %format!("{namespace}/{name}"), %error, "pod does not decode; skipped");
            }
            return Vec::new();
        }
        let after = pod.record(self.policy.mutation.marks);
        let after = if self.view.namespaces.is_opted_out(namespace) { after.left_alone() } else { after };
        let before = self.view.insert(namespace, name, after.clone());
        self.changed(namespace, name, before, Some(after))
    }

    fn changed(&self, namespace: &str, name: &str, before: Option<PodRecord>, after: Option<PodRecord>) -> Vec<Effect> {
        let uid = after.as_ref().or(before.as_ref()).map(|p| p.uid.to_string()).unwrap_or_default();
        let pod = PodRef { namespace: namespace.into(), name: name.into(), uid };
        let mut observed = observed::on_change(&pod, before.as_ref(), after.as_ref(), &self.policy, Timestamp::now());
        // A pod seen after its owner under a busy rule changed follows it now.
        if self.follows_owners()
            && let Some(record) = &after
        {
            if before.is_none() && owners::made_after_its_owners_task(&self.view, &pod, record) {
                info!(%pod, "made after its owner's task began: not the pod doing it, so not made busy");
            }
            observed.effects.extend(owners::follow(&self.view, &pod, record));
        }
        // A pod busy with another follows it; a pod others are busy with leads them.
        if let Some(label) = &self.policy.busy_with_pod {
            let follow = after.as_ref().and_then(|record| self.follow_leader(label, &pod, record));
            observed.effects.extend(follow);
            if let Some(busy) = flips::leads_anew(before.as_ref(), after.as_ref()) {
                let with_it = self.view.select(namespace, |record| record.label(label) == Some(name));
                let flip = |(companion, record): (String, PodRecord)| {
                    let pod = PodRef { namespace: namespace.into(), name: companion, uid: record.uid.to_string() };
                    flips::flip(pod, &record, busy, &Terms::default())
                };
                observed.effects.extend(with_it.into_iter().filter_map(flip));
            }
        }
        observed.effects = flips::no_delete_before_a_busy_flip(observed.effects);
        // A namespace's first opted-in pod: its busy-pod PDB now, not at the next sweep.
        if before.is_none()
            && let (Some(pdbs), Some(record)) = (&self.pdbs, &after)
            && pdbs.is_namespaces_first(namespace, record)
        {
            self.keep_pdbs();
        }
        self.act(pod, before, after, observed)
    }

    /// What a change means: its effects, and its loss report if the pod is gone; a pod that only
    /// left the watch is read aside first.
    fn act(&self, pod: PodRef, before: Option<PodRecord>, after: Option<PodRecord>, observed: Observed) -> Vec<Effect> {
        if observed.loss.as_ref().is_some_and(|loss| loss.cause.left_the_watch()) {
            // Gone, or only its busy label removed? Asked aside, so the watch goes on meanwhile.
            let (client, outbox, policy) = (self.client.clone(), self.outbox.clone(), self.policy.clone());
            tokio::spawn(async move {
                for attempt in 0..LEFT_POD_ATTEMPTS {
                    let Some(still_there) = left_the_watch(client.clone(), &pod).await else {
                        // Gone: lost, if it was gone at the first look.
                        if attempt == 0 {
                            for effect in with_loss(&pod, observed) {
                                drop(outbox.send(effect));
                            }
                        }
                        return;
                    };
                    // Not gone: whatever is due for it now, and no loss.
                    let due = observed::on_change(&pod, before.as_ref(), Some(&still_there), &policy, Timestamp::now());
                    let results = futures::future::join_all(due.effects.into_iter().map(|e| outbox.send(e))).await;
                    // Changed between the read and the write: no watch event comes for a pod out
                    // of the watch, so read it again.
                    if !results.iter().any(|r| matches!(r, Ok(EffectResult::Moot))) {
                        return;
                    }
                }
            });
            return Vec::new();
        }
        if after.is_none() && observed.effects.is_empty() {
            self.outbox.forget(&pod.uid);
        }
        with_loss(&pod, observed)
    }

    /// Whether any pod's busy state follows its owner's status (`--busy-when-owner`).
    fn follows_owners(&self) -> bool {
        !self.policy.owner_rules.is_empty()
    }

    /// A round of the busy-pod PDBs, aside, where they are kept and the view can be trusted.
    fn keep_pdbs(&self) {
        if let Some(pdbs) = self.pdbs.clone()
            && self.view.check(Instant::now()).is_ok()
        {
            let view = self.view.clone();
            tokio::spawn(async move { pdbs.keep(&view).await });
        }
    }

    /// What is due for every pod, whether it changed or not.
    fn sweep(&self) -> Vec<Effect> {
        self.keep_pdbs();
        let now = Timestamp::now();
        let mut effects = self.view.flat_map(|namespace, name, record| {
            let pod = PodRef { namespace: namespace.into(), name: name.into(), uid: record.uid.to_string() };
            let flip = self.follows_owners().then(|| owners::follow(&self.view, &pod, record)).flatten();
            observed::due(&pod, record, &self.policy, now).into_iter().chain(flip)
        });
        // Pods busy with another: their leaders are read once the view's lock is let go.
        if let Some(label) = &self.policy.busy_with_pod {
            let with_leaders = self.view.flat_map(|namespace, name, record| {
                let pod = PodRef { namespace: namespace.into(), name: name.into(), uid: record.uid.to_string() };
                record.label(label).is_some().then(|| (pod, record.clone()))
            });
            let flips = with_leaders.iter().filter_map(|(pod, record)| self.follow_leader(label, pod, record));
            effects.extend(flips.collect::<Vec<_>>());
        }
        flips::no_delete_before_a_busy_flip(effects)
    }

    /// The flip a pod busy with its leader (`--busy-with-pod`: it carries `label`, naming a pod
    /// of its namespace) is due, as the view holds its leader.
    fn follow_leader(&self, label: &str, pod: &PodRef, record: &PodRecord) -> Option<Effect> {
        let leader = self.view.record(&pod.namespace, record.label(label)?);
        flips::follow_leader(pod, record, leader.as_ref())
    }
}

/// The index of opted-in pods: the view's records, and what each change sets off.
struct Pods<'a> {
    watch: &'a Watch,
    /// The pods that did not decode, each said once.
    malformed_seen: HashSet<String>,
}

impl Pods<'_> {
    /// Leaves the pods of `namespace` alone from now on: busyguard's annotations, protected
    /// label and PDB are taken off as for pods no longer opted in.
    fn leave_alone(&mut self, namespace: &str) -> Vec<Effect> {
        info!(namespace, "namespace no longer guarded: its pods are left alone");
        let view = &self.watch.view;
        let left = view.select(namespace, |_| true).into_iter().flat_map(|(name, before)| {
            let after = before.clone().left_alone();
            view.insert(namespace, &name, after.clone());
            self.watch.changed(namespace, &name, Some(before), Some(after))
        });
        left.collect()
    }

    /// A guarded-again namespace's pods as listed: each is taken up where the view still holds
    /// that very version of it (a later one came, or comes, through the watch, and a pod deleted
    /// meanwhile stays gone).
    fn relisted(&mut self, listed: Vec<ApiPod>) -> Vec<Effect> {
        let view = &self.watch.view;
        let as_held = |pod: &ApiPod| {
            let held = view.record(pod.namespace(), pod.name());
            held.is_some_and(|held| pod.metadata.resource_version.as_deref() == Some(&*held.resource_version))
        };
        let current: Vec<ApiPod> = listed.into_iter().filter(as_held).collect();
        current.into_iter().flat_map(|pod| self.watch.apply(pod, &mut self.malformed_seen)).collect()
    }
}

impl Index<ApiPod> for Pods<'_> {
    type Change = Effect;

    fn what(&self) -> String {
        "opted-in pods".into()
    }

    fn key(&self, pod: &ApiPod) -> Key {
        Key::new(pod.namespace(), pod.name())
    }

    fn apply(&mut self, pod: ApiPod) -> Vec<Effect> {
        self.watch.apply(pod, &mut self.malformed_seen)
    }

    fn delete(&mut self, pod: Key) -> Vec<Effect> {
        let gone = self.watch.view.remove(&pod.namespace, &pod.name);
        self.watch.changed(&pod.namespace, &pod.name, gone, None)
    }

    /// Pods gone while the watch was down (no delete event came): each is acted on as gone.
    fn reset(&mut self, scope: &Scope, removed: Vec<Key>) -> Vec<Effect> {
        let watch = self.watch;
        let mut effects = Vec::new();
        for Key { namespace, name } in removed {
            let Some(gone) = watch.view.remove(&namespace, &name) else { continue };
            let pod = PodRef { namespace, name, uid: gone.uid.to_string() };
            let observed = observed::gone_unwatched(&pod, &gone, &watch.policy, Timestamp::now());
            effects.extend(watch.act(pod, Some(gone), None, observed));
        }
        watch.view.listed(scope);
        info!(scope = scope.as_deref().unwrap_or("all namespaces"), pods = watch.view.len(), "pods listed");
        effects
    }

    fn alive(&mut self) {
        self.watch.view.alive(Instant::now());
    }

    fn failed(&mut self, error: &watcher::Error) {
        self.watch.metrics.watch_errors.inc();
        self.watch.view.watch_failed(format!("pods: {}", driver::failure(error)));
    }
}

/// The effects, and the loss report if any.
fn with_loss(pod: &PodRef, observed: Observed) -> Vec<Effect> {
    let loss = observed.loss.map(|loss| loss.report(pod));
    observed.effects.into_iter().chain(loss).collect()
}

/// How often a pod that left the watch (its busy label removed) is read and brought up to date
/// again when it changed in between.
const LEFT_POD_ATTEMPTS: usize = 3;

/// The pod, if it still exists (same uid) though the watch of opted-in pods let it go: the
/// watch says "deleted" as well when a pod merely stops matching the label selector.
async fn left_the_watch(client: Client, pod: &PodRef) -> Option<PodRecord> {
    let api: Api<ApiPod> = Api::namespaced(client, &pod.namespace);
    match tokio::time::timeout(Duration::from_secs(5), api.get_opt(&pod.name)).await {
        Ok(Ok(Some(found))) if found.metadata.uid.as_deref() == Some(&pod.uid) && found.malformed.is_none() => {
            Some(found.record(&[]))
        }
        Ok(Ok(_)) => None,
        // Cannot tell: report it; a loss wrongly reported beats one never reported.
        Ok(Err(e)) => {
            warn!(%pod, error = %e, "cannot check whether a busy pod is gone; reporting it lost");
            None
        }
        Err(_) => None,
    }
}
