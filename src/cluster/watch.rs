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
use k8s_openapi::api::core::v1::Namespace;
use kube::api::ListParams;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tracing::{info, warn};

use super::driver::{self, Driver, Index, Key, Scoped};
use super::outbox::{EffectResult, Outbox};
use super::pdb::BusyPdbs;
use super::view::{ApiPod, PodRecord, Scope, View};
use super::{leaders, owners};
use crate::metrics::Metrics;
use crate::policy::PolicyConfig;
use crate::policy::keys::{BUSY_LABEL, NAMESPACE_ENABLED_LABEL};
use crate::policy::observed::{self, Observed};
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
    /// Runs until the process stops; the watches reconnect with backoff on their own.
    pub async fn run(self, scopes: Vec<Scope>) {
        let mut pod_events = self.pod_events(scopes);
        let mut namespace_events = self.namespace_events();
        let (mut namespace_driver, mut pod_driver) = (Driver::default(), Driver::default());
        // The namespaces left alone are listed before any pod is looked at: until then, a pod of
        // one would be taken for a guarded one (refreshed, or given a busy-pod PDB). No pod is
        // in the view yet: the pods' first list finds each namespace as recorded.
        let mut namespaces = Namespaces { watch: &self, pods_seen: false };
        driver::drive_until_listed(&mut namespace_driver, &mut namespaces, &mut namespace_events).await;
        namespaces.pods_seen = true;
        let mut pods = Pods { watch: &self, malformed_seen: HashSet::new() };
        let mut sweep = tokio::time::interval(self.sweep_interval);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                next = pod_events.next() => match next {
                    Some((scope, event)) => {
                        pod_driver.step(&mut pods, scope, event).await;
                    }
                    None => return,
                },
                _ = sweep.tick() => self.sweep(),
                Some((scope, event)) = namespace_events.next() => {
                    namespace_driver.step(&mut namespaces, scope, event).await;
                }
            }
        }
    }

    /// The watches of opted-in pods, one per scope. Every watch renews within the client's read
    /// timeout (see `watch_timeout`): a quiet one would be cut, and reopened from a
    /// resourceVersion too old to resume, relisting with a growing backoff.
    fn pod_events(&self, scopes: Vec<Scope>) -> BoxStream<'static, Scoped<ApiPod>> {
        let streams = scopes.into_iter().map(|scope| {
            let api: Api<ApiPod> = match &scope {
                Some(namespace) => Api::namespaced(self.client.clone(), namespace),
                None => Api::all(self.client.clone()),
            };
            let config = watcher::Config::default().labels(BUSY_LABEL).timeout(self.watch_timeout_secs);
            watcher(api, config).default_backoff().map(move |event| (scope.clone(), event)).boxed()
        });
        futures::stream::select_all(streams).boxed()
    }

    /// The watch of the namespaces labelled out (or, opted in by label, in): which pods are
    /// left alone, as the webhooks do.
    fn namespace_events(&self) -> BoxStream<'static, Scoped<Namespace>> {
        let label = format!("{NAMESPACE_ENABLED_LABEL}={}", self.view.enrolment().exception());
        let excepted = watcher::Config::default().labels(&label).timeout(self.watch_timeout_secs);
        let namespaces = watcher(Api::<Namespace>::all(self.client.clone()), excepted).default_backoff();
        namespaces.map(|event| (None, event)).boxed()
    }

    async fn apply(&self, pod: ApiPod, malformed_seen: &mut HashSet<String>) {
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
            return;
        }
        let after = pod.record();
        let after = if self.view.is_opted_out(namespace) { after.left_alone() } else { after };
        let before = self.view.insert(namespace, name, after.clone());
        self.changed(namespace, name, before, Some(after)).await;
    }

    /// Records whether `namespace` carries the exception's label value, and when that opts it
    /// out or in, acts on its pods if `pods_seen`.
    async fn except(&self, namespace: &str, excepted: bool, pods_seen: bool) {
        if self.view.set_excepted(namespace, excepted) && pods_seen {
            self.opt_out(namespace, self.view.enrolment().leaves_alone(excepted)).await;
        }
    }

    /// Leaves the pods of `namespace` alone from now on (busyguard's annotations, protected
    /// label and PDB are taken off as for pods no longer opted in), or takes them up again.
    async fn opt_out(&self, namespace: &str, out: bool) {
        info!(namespace, opted_out = out, "namespace opt-out changed");
        if out {
            for (name, before) in self.view.select(namespace, |_| true) {
                let after = before.clone().left_alone();
                self.view.insert(namespace, &name, after.clone());
                self.changed(namespace, &name, Some(before), Some(after)).await;
            }
            return;
        }
        let api: Api<ApiPod> = Api::namespaced(self.client.clone(), namespace);
        match api.list(&ListParams::default().labels(BUSY_LABEL)).await {
            Ok(pods) => {
                let mut malformed_seen = HashSet::new();
                for pod in pods {
                    self.apply(pod, &mut malformed_seen).await;
                }
            }
            Err(e) => warn!(namespace, error = %e, "cannot list the pods of a namespace that opted in again"),
        }
    }

    async fn changed(&self, namespace: &str, name: &str, before: Option<PodRecord>, after: Option<PodRecord>) {
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
            let follow = after.as_ref().and_then(|record| leaders::follow_leader(&self.view, label, &pod, record));
            observed.effects.extend(follow);
            let leads = leaders::lead(&self.view, label, (namespace, name), before.as_ref(), after.as_ref());
            observed.effects.extend(leads);
        }
        observed.effects = leaders::no_delete_before_a_busy_flip(observed.effects);
        // A namespace's first opted-in pod: its busy-pod PDB now, not at the next sweep.
        if before.is_none()
            && let (Some(pdbs), Some(record)) = (&self.pdbs, &after)
            && pdbs.is_namespaces_first(namespace, record)
        {
            self.keep_pdbs();
        }
        self.act(pod, before, after, observed).await;
    }

    /// Carries out what a change means: its effects, and its loss report if the pod is gone.
    async fn act(&self, pod: PodRef, before: Option<PodRecord>, after: Option<PodRecord>, observed: Observed) {
        if observed.loss.as_ref().is_some_and(|loss| loss.cause.left_the_watch()) {
            // Gone, or only its busy label removed? Asked aside, so the watch goes on meanwhile.
            let (client, outbox, policy) = (self.client.clone(), self.outbox.clone(), self.policy.clone());
            tokio::spawn(async move {
                for attempt in 0..LEFT_POD_ATTEMPTS {
                    let Some(still_there) = left_the_watch(client.clone(), &pod).await else {
                        // Gone: lost, if it was gone at the first look.
                        if attempt == 0 {
                            send(&outbox, &pod, observed);
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
            return;
        }
        if after.is_none() && observed.effects.is_empty() {
            self.outbox.forget(&pod.uid);
        }
        send(&self.outbox, &pod, observed);
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
    fn sweep(&self) {
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
            let flips =
                with_leaders.iter().filter_map(|(pod, record)| leaders::follow_leader(&self.view, label, pod, record));
            effects.extend(flips.collect::<Vec<_>>());
        }
        for effect in leaders::no_delete_before_a_busy_flip(effects) {
            drop(self.outbox.send(effect));
        }
    }
}

/// The index of opted-in pods: the view's records, and what each change sets off.
struct Pods<'a> {
    watch: &'a Watch,
    /// The pods that did not decode, each said once.
    malformed_seen: HashSet<String>,
}

impl Index<ApiPod> for Pods<'_> {
    fn what(&self) -> String {
        "opted-in pods".into()
    }

    fn key(&self, pod: &ApiPod) -> Key {
        (pod.namespace().to_string(), pod.name().to_string())
    }

    async fn apply(&mut self, pod: ApiPod) {
        self.watch.apply(pod, &mut self.malformed_seen).await;
    }

    async fn delete(&mut self, pod: ApiPod) {
        let (namespace, name) = (pod.namespace(), pod.name());
        let gone = self.watch.view.remove(namespace, name);
        self.watch.changed(namespace, name, gone, None).await;
    }

    /// Pods gone while the watch was down (no delete event came): each is acted on as gone.
    async fn reset(&mut self, scope: &Scope, listed: HashSet<Key>) {
        let watch = self.watch;
        for (namespace, name, gone) in watch.view.keep_only(scope, &listed) {
            let pod = PodRef { namespace, name, uid: gone.uid.to_string() };
            let observed = observed::gone_unwatched(&pod, &gone, &watch.policy, Timestamp::now());
            watch.act(pod, Some(gone), None, observed).await;
        }
        watch.view.listed(scope);
        info!(scope = scope.as_deref().unwrap_or("all namespaces"), pods = watch.view.len(), "pods listed");
    }

    fn alive(&mut self) {
        self.watch.view.alive(Instant::now());
    }

    fn failed(&mut self, error: &watcher::Error) {
        self.watch.metrics.watch_errors.inc();
        self.watch.view.watch_failed(format!("pods: {}", driver::failure(error)));
    }
}

/// The index of namespaces labelled out (or in): once the pods are seen (`pods_seen`), a
/// namespace that changes side has its pods acted on.
struct Namespaces<'a> {
    watch: &'a Watch,
    pods_seen: bool,
}

impl Index<Namespace> for Namespaces<'_> {
    fn what(&self) -> String {
        format!("the namespaces' {NAMESPACE_ENABLED_LABEL} label")
    }

    fn key(&self, namespace: &Namespace) -> Key {
        (String::new(), namespace.name_any())
    }

    async fn apply(&mut self, namespace: Namespace) {
        self.watch.except(&namespace.name_any(), true, self.pods_seen).await;
    }

    /// Deleted, or its label changed: the watch selects by the label.
    async fn delete(&mut self, namespace: Namespace) {
        self.watch.except(&namespace.name_any(), false, self.pods_seen).await;
    }

    /// The pods' list waits for the namespaces': a failure here is why it does not come.
    fn failed(&mut self, error: &watcher::Error) {
        self.watch.metrics.watch_errors.inc();
        self.watch.view.watch_failed(format!("namespaces: {}", driver::failure(error)));
    }

    async fn reset(&mut self, _: &Scope, listed: HashSet<Key>) {
        for namespace in self.watch.view.excepted() {
            if !listed.contains(&(String::new(), namespace.clone())) {
                self.watch.except(&namespace, false, self.pods_seen).await;
            }
        }
    }
}

/// The effects, and the loss report if any, to the outbox.
fn send(outbox: &Outbox, pod: &PodRef, observed: observed::Observed) {
    let loss = observed.loss.map(|loss| loss.report(pod));
    for effect in observed.effects.into_iter().chain(loss) {
        drop(outbox.send(effect));
    }
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
            Some(found.record())
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
