//! Busy from the owner's status (`policy::owners`): a watch of each kind a rule names, that
//! flips the owners' pods busy or idle as their status changes. The pod watch asks the same of
//! each pod that changes (`follow`), so a pod seen after its owner follows it too. Each kind is
//! followed on its own: one the API server does not serve takes nothing else down.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject};
use kube::core::GroupVersionKind;
use kube::core::PartialObjectMeta;
use kube::discovery::{self, Scope as ResourceScope};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tracing::{info, warn};

use super::driver::{self, Index, Key};
use super::kinds;
use super::outbox::Outbox;
use super::view::{PodRecord, Scope, View};
use crate::metrics::{Metrics, OwnerRuleLabels};
use crate::policy::flips;
use crate::policy::outcome::Effect;
use crate::policy::owners::{self, OwnerRule, OwnerState, Terms, Via};
use crate::policy::pod::{OwnerKey, PodFacts, PodRef};

/// The kind of `rule` as the API server serves it, or why its owners cannot be followed: a
/// kind it does not serve, or one that cannot own pods (not namespaced); the kind between, too.
pub async fn resolve(client: &Client, rule: &OwnerRule) -> anyhow::Result<ApiResource> {
    if let Some(via) = &rule.via {
        resolve_kind(client, &gvk(&via.api_version, &via.kind), &rule.kind_path()).await?;
    }
    resolve_kind(client, &gvk(&rule.api_version, &rule.kind), &rule.kind_path()).await
}

fn gvk(api_version: &str, kind: &str) -> GroupVersionKind {
    GroupVersionKind::gvk(owners::group_of(api_version), owners::version_of(api_version), kind)
}

/// A kind a rule names (`gvk`), as the API server serves it; `rule` names the rule in errors.
async fn resolve_kind(client: &Client, gvk: &GroupVersionKind, rule: &str) -> anyhow::Result<ApiResource> {
    let (resource, capabilities) = discovery::pinned_kind(client, gvk).await.map_err(|error| {
        let why = match error {
            kube::Error::Api(status) if status.code != 404 => {
                format!("the API server could not say whether it serves this kind: {} {}", status.code, status.message)
            }
            kube::Error::Api(_) | kube::Error::Discovery(_) => "the API server does not serve this kind: install its \
                project's CRDs (in this version) first, or drop the rule or the component that names it"
                .to_string(),
            other => format!("the API server could not say whether it serves this kind: {other}"),
        };
        let kind = format!("{}/{}", gvk.api_version(), gvk.kind);
        let which = if rule == kind { kind } else { format!("{rule} ({kind})") };
        anyhow::anyhow!("--busy-when-owner {which}: {why}")
    })?;
    anyhow::ensure!(
        capabilities.scope == ResourceScope::Namespaced,
        "--busy-when-owner {rule}: {} is not a namespaced kind, so it owns no pods",
        gvk.kind
    );
    Ok(resource)
}

pub struct OwnerWatch {
    pub client: Client,
    pub view: Arc<View>,
    pub outbox: Outbox,
    pub metrics: Arc<Metrics>,
    /// How long the API server keeps each watch request open, in seconds.
    pub watch_timeout_secs: u32,
}

impl OwnerWatch {
    /// Follows each rule's kind on a task of its own, until the process stops, and each kind a
    /// rule names between its pods and its owners (one watch of each, of their metadata only). A
    /// kind that is not served, at start or later (its CRD removed), leaves everything else
    /// serving: it is reported (`/status`, the metrics) and followed again once it is served.
    pub fn start(self, rules: &[OwnerRule], scopes: &[Scope]) {
        let watch = Arc::new(self);
        for rule in rules {
            watch.view.owners.update_kind(&rule.kind_path(), |kind| {
                kind.unfollowed = Some("not asked of the API server yet".into());
            });
            tokio::spawn(watch.clone().follow(Arc::new(rule.clone()), scopes.to_vec()));
        }
        let vias: BTreeMap<String, &Via> =
            rules.iter().filter_map(|rule| rule.via.as_ref()).map(|v| (v.kind_path(), v)).collect();
        for via in vias.into_values() {
            let through: Vec<OwnerRule> = rules.iter().filter(|rule| rule.via.as_ref() == Some(via)).cloned().collect();
            tokio::spawn(watch.clone().link(via.clone(), through, scopes.to_vec()));
        }
    }

    async fn follow(self: Arc<Self>, rule: Arc<OwnerRule>, scopes: Vec<Scope>) {
        let kind = rule.kind_path();
        let resource = self.served(&gvk(&rule.api_version, &rule.kind), &kind).await;
        let events = kinds::watch_scopes::<DynamicObject>(&self.client, &resource, scopes, self.watch_timeout_secs);
        let follow = Follow { view: &self.view, metrics: &self.metrics };
        let mut owners = Owners { follow, rule: &rule, kind, held: HashSet::new() };
        driver::drive(&mut owners, events, |effect| drop(self.outbox.send(effect))).await;
    }

    /// Follows the objects of the kind `via` whose controlling owner is of a kind `rules` read
    /// (a Spark driver pod of its SparkApplication): their pods are that owner's.
    async fn link(self: Arc<Self>, via: Via, rules: Vec<OwnerRule>, scopes: Vec<Scope>) {
        let named = rules.iter().map(OwnerRule::kind_path).collect::<Vec<_>>().join(", ");
        // How /status and the metrics name this watch.
        let kinds = format!("{} between pods and {named}", via.kind_path());
        self.view.owners.update_kind(&kinds, |kind| kind.unfollowed = Some("not asked of the API server yet".into()));
        let resource = self.served(&gvk(&via.api_version, &via.kind), &kinds).await;
        // Of their metadata only: an object's controlling owner is all a link needs.
        let events = kinds::watch_scopes::<PartialObjectMeta<DynamicObject>>(
            &self.client,
            &resource,
            scopes,
            self.watch_timeout_secs,
        );
        let follow = Follow { view: &self.view, metrics: &self.metrics };
        let mut links = Links { follow, via: &via, rules: &rules, kinds };
        driver::drive(&mut links, events, |effect| drop(self.outbox.send(effect))).await;
    }

    /// A kind a rule names once the API server serves it (`kinds::served`); `kind` is the rule
    /// as `/status` names it.
    async fn served(&self, gvk: &GroupVersionKind, kind: &str) -> ApiResource {
        let find = || async { resolve_kind(&self.client, gvk, kind).await.map_err(|why| format!("{why:#}")) };
        let failed = |why: String, pause| {
            warn!(%kind, error = %why, retry_in = ?pause, "not following a busy rule's kind yet; everything else is served");
            self.view.owners.update_kind(kind, |state| state.unfollowed = Some(why));
        };
        kinds::served(find, failed).await
    }
}

/// What the owner and link indexes share: the view they write, and the metrics of the rules
/// that cannot tell.
#[derive(Clone, Copy)]
struct Follow<'a> {
    view: &'a View,
    metrics: &'a Metrics,
}

impl Follow<'_> {
    /// The owner's status read by its rule, and the flips of its pods to match.
    fn changed(&self, rule: &Arc<OwnerRule>, owner: &DynamicObject, held: &mut HashSet<Key>) -> Vec<Effect> {
        // The rule reads the whole owner, its deletionTimestamp too: whether an owner being
        // deleted still works is the rule's to say (Actions Runner Controller keeps a runner
        // until its job ends; Agones ends a game server's match with it).
        let key = Key::new(owner.namespace().unwrap_or_default(), rule.state_key(&owner.name_any()));
        let owners = &self.view.owners;
        let judged = if rule.reads_pod {
            rule.per_pod(owner).map(|per_pod| {
                let state = OwnerState::judged_per_pod(per_pod);
                owners.set(&key.namespace, &key.name, Some(state.clone()));
                Some(state)
            })
        } else {
            let written = last_written(owner);
            rule.busy(owner).map(|busy| owners.set_busy(rule, &key.namespace, &key.name, Some(busy), written))
        };
        let state = match judged {
            Ok(state) => state,
            Err(why) => {
                self.undecided(rule, &owner_name(rule, owner), &why);
                return Vec::new();
            }
        };
        let (flips, busy_pods) = self.follow_owner(rule, &key, state.clone());
        if state.is_some_and(|state| state.busy()) || busy_pods {
            owners.update_kind(&rule.kind_path(), |kind| kind.ended_idle = 0);
            held.insert(key);
        }
        flips
    }

    fn undecided(&self, rule: &OwnerRule, what: &str, why: &owners::Undecided) {
        let labels = OwnerRuleLabels { rule: rule.kind_path() };
        self.metrics.owner_rule_undecided.get_or_create(&labels).inc();
        warn!(owner = %what, error = %why, "cannot tell whether the owner's pod is busy; left as it is");
    }

    /// Gone: its pods are idle (the garbage collector deletes them, and must not wait on them).
    /// An owner the rule never held for is counted: a rule that holds for none is told.
    fn ended(&self, rule: &OwnerRule, owner: Key, held: &mut HashSet<Key>) -> Vec<Effect> {
        if !held.remove(&owner) {
            self.view.owners.update_kind(&rule.kind_path(), |kind| kind.ended_idle += 1);
        }
        self.view.owners.set(&owner.namespace, &owner.name, None);
        self.follow_owner(rule, &owner, None).0
    }

    /// The flips of the pods of the owner `key` (the rule's [`OwnerRule::state_key`]) to match it
    /// as recorded (`None`: gone, so idle): the pods it controls under a direct rule, those of the
    /// objects linked to it under a rule through a kind between; and whether any of them is busy.
    fn follow_owner(&self, rule: &OwnerRule, key: &Key, owner: Option<OwnerState>) -> (Vec<Effect>, bool) {
        let namespace = key.namespace.as_str();
        // A direct rule's key is its pods' controller; a rule through a kind links objects to it.
        let controllers = match rule.via {
            Some(_) => self.view.owners.linked_to(namespace, &key.name),
            None => vec![key.name.clone()],
        };
        let pods =
            self.view.select(namespace, |pod| pod.owner.as_deref().is_some_and(|o| controllers.iter().any(|c| c == o)));
        let (mut flips, mut any_busy) = (Vec::new(), false);
        for (name, record) in pods {
            let pod = PodRef { namespace: namespace.to_string(), name, uid: record.uid.to_string() };
            let busy = match &owner {
                Some(owner) => owner.pod_busy(&pod, &record.labels, record.created()),
                None => Ok(false),
            };
            match busy {
                Ok(busy) => {
                    any_busy |= busy;
                    flips.extend(flips::flip(pod, &record, busy, &rule.terms));
                }
                Err(why) => self.undecided(rule, &pod.to_string(), &why),
            }
        }
        (flips, any_busy)
    }

    /// The object `linked` (`group/Kind/name`) owned by `owner` under a busy rule (`None`: not,
    /// or gone): its pods follow that owner. Nothing to do unless that changed (a watch of pods
    /// sees every pod of the cluster, most of them owned by no such owner).
    fn relinked(&self, linked: &Key, owner: Option<&str>) -> Vec<Effect> {
        let (namespace, linked) = (linked.namespace.as_str(), linked.name.as_str());
        if !self.view.owners.set_link(namespace, linked, owner) {
            return Vec::new();
        }
        let pods = self.view.select(namespace, |pod| pod.owner.as_deref() == Some(linked));
        let flips = pods.into_iter().filter_map(|(name, record)| {
            let pod = PodRef { namespace: namespace.to_string(), name, uid: record.uid.to_string() };
            match owner {
                Some(_) => follow(self.view, &pod, &record),
                None => flips::flip(pod, &record, false, &Terms::default()),
            }
        });
        flips.collect()
    }
}

/// The index of one rule's owners: the view's record of each, busy or not, and its pods
/// flipped to match.
struct Owners<'a> {
    follow: Follow<'a>,
    rule: &'a Arc<OwnerRule>,
    /// The rule's kind, as the flag names it.
    kind: String,
    /// The owners the rule held for at least once (a runner that had a job).
    held: HashSet<Key>,
}

impl Index<DynamicObject> for Owners<'_> {
    type Change = Effect;

    fn what(&self) -> String {
        format!("{} owners", self.kind)
    }

    fn key(&self, owner: &DynamicObject) -> Key {
        Key::new(owner.namespace().unwrap_or_default(), self.rule.state_key(&owner.name_any()))
    }

    fn apply(&mut self, owner: DynamicObject) -> Vec<Effect> {
        self.follow.changed(self.rule, &owner, &mut self.held)
    }

    fn delete(&mut self, owner: Key) -> Vec<Effect> {
        self.follow.ended(self.rule, owner, &mut self.held)
    }

    /// Owners gone while the watch was down (no delete event came): their pods are idle, as on
    /// a delete.
    fn reset(&mut self, _: &Scope, removed: Vec<Key>) -> Vec<Effect> {
        let flips = removed.into_iter().flat_map(|owner| self.follow.ended(self.rule, owner, &mut self.held));
        let flips = flips.collect();
        info!(kind = %self.kind, "owners listed");
        flips
    }

    /// The API server answered: the kind is followed (again).
    fn alive(&mut self) {
        self.follow.view.owners.update_kind(&self.kind, |state| state.unfollowed = None);
    }

    fn failed(&mut self, error: &watcher::Error) {
        let why = super::driver::failure(error);
        self.follow.view.owners.update_kind(&self.kind, |state| state.unfollowed = Some(why));
    }
}

/// The index of one kind between pods and the owners busy rules read: each object's link to
/// its controlling owner, where that owner's kind is one the rules read.
struct Links<'a> {
    follow: Follow<'a>,
    via: &'a Via,
    rules: &'a [OwnerRule],
    /// This watch as `/status` names it: the kind, and the rules through it.
    kinds: String,
}

impl Links<'_> {
    /// The key of the rule's verdict on the object's controlling owner, if a rule through this
    /// kind reads it.
    fn owner(&self, object: &PartialObjectMeta<DynamicObject>) -> Option<String> {
        let controller = object.owner_references().iter().find(|o| o.controller == Some(true))?;
        let rule = self
            .rules
            .iter()
            .find(|rule| rule.kind == controller.kind && owners::group_of(&controller.api_version) == rule.group())?;
        Some(rule.state_key(&controller.name))
    }
}

impl Index<PartialObjectMeta<DynamicObject>> for Links<'_> {
    type Change = Effect;

    fn what(&self) -> String {
        self.kinds.clone()
    }

    fn key(&self, object: &PartialObjectMeta<DynamicObject>) -> Key {
        let name = object.name_any();
        let linked = OwnerKey { group: self.via.group(), kind: &self.via.kind, name: &name }.to_string();
        Key::new(object.namespace().unwrap_or_default(), linked)
    }

    fn apply(&mut self, object: PartialObjectMeta<DynamicObject>) -> Vec<Effect> {
        let owner = self.owner(&object);
        self.follow.relinked(&self.key(&object), owner.as_deref())
    }

    fn delete(&mut self, linked: Key) -> Vec<Effect> {
        self.follow.relinked(&linked, None)
    }

    fn alive(&mut self) {
        self.follow.view.owners.update_kind(&self.kinds, |state| state.unfollowed = None);
    }

    fn failed(&mut self, error: &watcher::Error) {
        let why = super::driver::failure(error);
        self.follow.view.owners.update_kind(&self.kinds, |state| state.unfollowed = Some(why));
    }
}

/// When the owner was last written, as its managedFields record it (the API server's clock, to
/// the second), else now.
fn last_written(owner: &DynamicObject) -> Timestamp {
    let times = owner.metadata.managed_fields.iter().flatten().filter_map(|entry| entry.time.as_ref());
    let latest = times.filter_map(|time| Timestamp::from_second(time.0.as_second()).ok()).max();
    latest.unwrap_or_else(Timestamp::now)
}

fn owner_name(rule: &OwnerRule, owner: &DynamicObject) -> String {
    format!("{} {}/{}", rule.kind_path(), owner.namespace().unwrap_or_default(), owner.name_any())
}

/// The flip a pod of the view is due, if its owner is under a rule and says otherwise.
pub fn follow(view: &View, pod: &PodRef, record: &PodRecord) -> Option<Effect> {
    let owner = view.owners.of_pods(&pod.namespace, record.owner.as_deref()?)?;
    // An owner its rule cannot judge the pod by leaves it as it is (the owner's watch said why).
    let busy = owner.pod_busy(pod, &record.labels, record.created()).ok()?;
    flips::flip(pod.clone(), record, busy, &owner.terms)
}

/// Whether the pod was made after its owner's busy task began under a rule whose new pods stay
/// idle, so is not the one doing it: said once, as the pod is first seen.
pub fn made_after_its_owners_task(view: &View, pod: &PodRef, record: &PodRecord) -> bool {
    let owner = record.owner.as_deref().and_then(|owner| view.owners.of_pods(&pod.namespace, owner));
    owner.is_some_and(|owner| owner.busy() && !owner.busy_for(record.created()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::keys::BUSY_LABEL;

    /// A game server's pod, opted in idle, as the view records it.
    fn game_server_pod() -> PodRecord {
        let pod: super::super::view::ApiPod = serde_json::from_value(serde_json::json!({"metadata": {
            "name": "gs", "namespace": "games", "uid": "u1", "labels": {BUSY_LABEL: "false"},
            "ownerReferences": [{"apiVersion": "agones.dev/v1", "kind": "GameServer", "name": "gs", "uid": "o1",
                "controller": true}]}}))
        .unwrap();
        pod.record(&[])
    }

    #[test]
    fn an_owner_followed_pod_is_flipped_but_never_in_a_namespace_left_alone() {
        let view = View::without_cluster();
        let pod = PodRef { namespace: "games".into(), name: "gs".into(), uid: "u1".into() };
        let record = game_server_pod();
        assert_eq!(record.owner.as_deref(), Some("agones.dev/GameServer/gs"));
        let rule: OwnerRule = "agones.dev/v1/GameServer=true".parse().unwrap();
        view.owners.set_busy(&rule, "games", "agones.dev/GameServer/gs", Some(true), Timestamp::now());
        let flipped = follow(&view, &pod, &record);
        assert!(
            matches!(flipped, Some(Effect::FollowOwner { value: "true", .. })),
            "followed where guarded: {flipped:?}"
        );
        // On a change, a relist or a sweep, the pod watch and the owner watch ask the same.
        assert_eq!(follow(&view, &pod, &record.clone().left_alone()), None, "left alone: never written");
        // Another group's kind of the same name is another owner.
        view.owners.set_busy(&rule, "games", "example.com/GameServer/gs", Some(false), Timestamp::now());
        assert!(view.owners.busy("games", "agones.dev/GameServer/gs").is_some_and(|owner| owner.busy()));
    }

    #[test]
    fn an_executor_follows_the_application_over_its_driver_pod_by_its_own_entry() {
        let view = View::without_cluster();
        let rule: Arc<OwnerRule> = Arc::new(
            "v1/Pod>sparkoperator.k8s.io/v1beta2/SparkApplication=has(object.status.executorState) && \
             pod.metadata.name in object.status.executorState && object.status.executorState[pod.metadata.name] == 'RUNNING'"
                .parse()
                .unwrap(),
        );
        let executor = |name: &str| {
            let pod: super::super::view::ApiPod = serde_json::from_value(serde_json::json!({"metadata": {
                "name": name, "namespace": "spark", "uid": format!("u-{name}"), "labels": {BUSY_LABEL: "false"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "etl-driver", "uid": "d",
                    "controller": true}]}}))
            .unwrap();
            (PodRef { namespace: "spark".into(), name: name.into(), uid: format!("u-{name}") }, pod.record(&[]))
        };
        let app = serde_json::json!({"metadata": {"name": "etl"},
            "status": {"executorState": {"etl-exec-1": "RUNNING", "etl-exec-2": "COMPLETED"}}});
        let state = OwnerState::judged_per_pod(rule.per_pod(&app).unwrap());
        let key = rule.state_key("etl");
        assert_eq!(key, "/Pod>sparkoperator.k8s.io/SparkApplication/etl");
        view.owners.set("spark", &key, Some(state));
        let (running, record) = executor("etl-exec-1");
        assert_eq!(follow(&view, &running, &record), None, "the driver pod not yet linked to its application");
        assert!(view.owners.set_link("spark", "/Pod/etl-driver", Some(&key)));
        assert!(!view.owners.set_link("spark", "/Pod/etl-driver", Some(&key)), "no change");
        assert!(!view.owners.set_link("spark", "/Pod/other-pod", None), "a pod of no such owner: nothing recorded");
        assert!(matches!(follow(&view, &running, &record), Some(Effect::FollowOwner { value: "true", .. })));
        let (done, record) = executor("etl-exec-2");
        assert_eq!(follow(&view, &done, &record), None, "idle already, as its entry says");
        assert_eq!(view.owners.linked_to("spark", &key), ["/Pod/etl-driver"]);
        assert!(view.owners.set_link("spark", "/Pod/etl-driver", None));
        assert!(view.owners.linked_to("spark", &key).is_empty());
    }

    #[test]
    fn a_driver_rule_and_an_executor_rule_on_one_application_each_judge_their_own_pods() {
        let view = View::without_cluster();
        let driver_rule: OwnerRule =
            "sparkoperator.k8s.io/v1beta2/SparkApplication=object.status.applicationState.state == 'RUNNING'"
                .parse()
                .unwrap();
        let executor_rule: Arc<OwnerRule> = Arc::new(
            "v1/Pod>sparkoperator.k8s.io/v1beta2/SparkApplication=pod.metadata.name in object.status.executorState"
                .parse()
                .unwrap(),
        );
        let spark_pod = |name: &str, owner: serde_json::Value| {
            let pod: super::super::view::ApiPod = serde_json::from_value(serde_json::json!({"metadata": {
                "name": name, "namespace": "spark", "uid": format!("u-{name}"), "labels": {BUSY_LABEL: "false"},
                "ownerReferences": [owner]}}))
            .unwrap();
            (PodRef { namespace: "spark".into(), name: name.into(), uid: format!("u-{name}") }, pod.record(&[]))
        };
        let (driver, driver_record) = spark_pod(
            "etl-driver",
            serde_json::json!({"apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication",
                "name": "etl", "uid": "a", "controller": true}),
        );
        let (executor, executor_record) = spark_pod(
            "etl-exec-1",
            serde_json::json!({"apiVersion": "v1", "kind": "Pod", "name": "etl-driver", "uid": "d", "controller": true}),
        );
        view.insert("spark", "etl-driver", driver_record.clone());
        view.insert("spark", "etl-exec-1", executor_record.clone());
        assert!(view.owners.set_link("spark", "/Pod/etl-driver", Some(&executor_rule.state_key("etl"))));
        // The operator's status write, as each rule's watch sees it, in either order.
        let app = serde_json::json!({"metadata": {"name": "etl"}, "status": {
            "applicationState": {"state": "RUNNING"}, "executorState": {"etl-exec-1": "RUNNING"}}});
        for _ in 0..3 {
            let written = Timestamp::now();
            view.owners.set_busy(&driver_rule, "spark", &driver_rule.state_key("etl"), Some(true), written);
            let per_pod = OwnerState::judged_per_pod(executor_rule.per_pod(&app).unwrap());
            view.owners.set("spark", &executor_rule.state_key("etl"), Some(per_pod));
            let flip = |pod: &PodRef, record: &PodRecord| match follow(&view, pod, record) {
                Some(Effect::FollowOwner { value, .. }) => value,
                _ => "none",
            };
            assert_eq!(flip(&driver, &driver_record), "true", "the driver, by the driver rule");
            assert_eq!(flip(&executor, &executor_record), "true", "the executor, by its own entry");
        }
        let app_ended = serde_json::json!({"metadata": {"name": "etl"}, "status": {"executorState": {}}});
        let per_pod = OwnerState::judged_per_pod(executor_rule.per_pod(&app_ended).unwrap());
        view.owners.set("spark", &executor_rule.state_key("etl"), Some(per_pod));
        assert!(follow(&view, &executor, &executor_record).is_none(), "the executor idle, as its entry is gone");
        assert!(
            matches!(follow(&view, &driver, &driver_record), Some(Effect::FollowOwner { value: "true", .. })),
            "the executors' rule does not touch the driver"
        );
    }

    /// A runner as Actions Runner Controller writes it, with a job or without.
    fn runner(name: &str, busy: bool) -> DynamicObject {
        let status = if busy { serde_json::json!({"jobRequestId": 7}) } else { serde_json::json!({}) };
        serde_json::from_value(
            serde_json::json!({"apiVersion": "actions.github.com/v1alpha1", "kind": "EphemeralRunner",
            "metadata": {"name": name, "namespace": "ci"}, "status": status}),
        )
        .unwrap()
    }

    /// As kubert tests an index across a watch's restart: an owner the relist no longer has
    /// (deleted while the watch was down) lets its busy pod go idle, and one it has stays.
    #[test]
    fn an_owner_a_relist_no_longer_has_lets_its_pods_go_idle() {
        let view = View::without_cluster();
        let metrics = Metrics::default();
        let rule =
            Arc::new("actions.github.com/v1alpha1/EphemeralRunner=has(object.status.jobRequestId)".parse().unwrap());
        let mut owners = Owners {
            follow: Follow { view: &view, metrics: &metrics },
            rule: &rule,
            kind: "runners".into(),
            held: HashSet::new(),
        };
        for name in ["a", "b"] {
            let pod: super::super::view::ApiPod = serde_json::from_value(serde_json::json!({"metadata": {
                "name": name, "namespace": "ci", "uid": format!("u-{name}"), "labels": {BUSY_LABEL: "true"},
                "ownerReferences": [{"apiVersion": "actions.github.com/v1alpha1", "kind": "EphemeralRunner",
                    "name": name, "uid": "r", "controller": true}]}}))
            .unwrap();
            view.insert("ci", name, pod.record(&[]));
        }
        let mut driver = driver::Driver::default();
        let mut drive = |events: Vec<driver::Scoped<DynamicObject>>| {
            let steps = events.into_iter().map(|(scope, event)| driver.step(&mut owners, scope, event).changes);
            let flips = steps.flatten().map(|effect| match effect {
                Effect::FollowOwner { pod, value, .. } => format!("{} {value}", pod.name),
                other => format!("{other}"),
            });
            flips.collect::<Vec<_>>()
        };
        assert!(drive(driver::listed(None, vec![runner("a", true), runner("b", true)])).is_empty(), "busy already");
        assert_eq!(drive(driver::listed(None, vec![runner("b", true)])), ["a false"], "a's runner gone");
        assert!(view.owners.busy("ci", &rule.state_key("a")).is_none());
        assert!(view.owners.busy("ci", &rule.state_key("b")).is_some_and(|owner| owner.busy()));
    }
}
