//! Busy from the owner's status (`policy::owners`): a watch of each kind a rule names, that
//! flips the owners' pods busy or idle as their status changes. The pod watch asks the same of
//! each pod that changes (`follow`), so a pod seen after its owner follows it too.

use std::sync::Arc;

use anyhow::Context as _;
use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject};
use kube::core::GroupVersionKind;
use kube::discovery::{self, Scope as ResourceScope};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tracing::{info, warn};

use super::outbox::Outbox;
use super::view::{PodRecord, Scope, View};
use crate::policy::keys::BUSY_LABEL;
use crate::policy::outcome::{Effect, PodRef};
use crate::policy::owners::{self, OwnerRule, Undecided};
use crate::policy::pod::PodFacts;

/// Each rule with its kind as the API server serves it: a kind it does not serve, or one that
/// cannot own pods (not namespaced), is an error, so a rule never guards nothing in silence.
pub async fn resolve(client: &Client, rules: &[OwnerRule]) -> anyhow::Result<Vec<(OwnerRule, ApiResource)>> {
    let mut resolved = Vec::with_capacity(rules.len());
    for rule in rules {
        let gvk = GroupVersionKind::gvk(rule.group(), rule.version(), &rule.kind);
        let (resource, capabilities) = discovery::pinned_kind(client, &gvk).await.with_context(|| {
            format!(
                "--busy-when-owner {}/{}: the API server does not serve this kind (is its project installed, in \
                 this version?)",
                rule.api_version, rule.kind
            )
        })?;
        anyhow::ensure!(
            capabilities.scope == ResourceScope::Namespaced,
            "--busy-when-owner {}/{}: not a namespaced kind, so it owns no pods",
            rule.api_version,
            rule.kind
        );
        resolved.push((rule.clone(), resource));
    }
    Ok(resolved)
}

pub struct OwnerWatch {
    pub client: Client,
    pub view: Arc<View>,
    pub outbox: Outbox,
    /// How long the API server keeps each watch request open, in seconds.
    pub watch_timeout_secs: u32,
}

impl OwnerWatch {
    /// Runs until the process stops; the watches reconnect with backoff on their own.
    pub async fn run(self, rules: Vec<(OwnerRule, ApiResource)>, scopes: Vec<Scope>) {
        let mut streams = Vec::new();
        for (rule, resource) in rules {
            let rule = Arc::new(rule);
            for scope in &scopes {
                let api: Api<DynamicObject> = match scope {
                    Some(namespace) => Api::namespaced_with(self.client.clone(), namespace, &resource),
                    None => Api::all_with(self.client.clone(), &resource),
                };
                let config = watcher::Config::default().timeout(self.watch_timeout_secs);
                let rule = rule.clone();
                streams.push(watcher(api, config).default_backoff().map(move |event| (rule.clone(), event)).boxed());
            }
        }
        let mut events = futures::stream::select_all(streams);
        while let Some((rule, event)) = events.next().await {
            match event {
                Ok(watcher::Event::Apply(owner) | watcher::Event::InitApply(owner)) => self.changed(&rule, &owner),
                Ok(watcher::Event::Delete(owner)) => self.gone(&rule, &owner),
                Ok(watcher::Event::Init) => {}
                Ok(watcher::Event::InitDone) => info!(kind = %rule.kind, "owners listed"),
                Err(e) => warn!(kind = %rule.kind, error = %e, "watch of owners failed; retrying with backoff"),
            }
        }
    }

    /// The owner's status read by its rule, and its pods flipped to match. An owner being
    /// deleted has ended its pods' task: they go with it, so they are not held busy.
    fn changed(&self, rule: &OwnerRule, owner: &DynamicObject) {
        let busy = match owner.metadata.deletion_timestamp {
            Some(_) => false,
            None => match serde_json::to_value(owner).map_err(|e| Undecided(e.to_string())).and_then(|o| rule.busy(&o))
            {
                Ok(busy) => busy,
                Err(why) => {
                    warn!(owner = %owner_name(rule, owner), error = %why, "cannot tell whether the owner is busy; its pods are left as they are");
                    return;
                }
            },
        };
        self.follow_owner(rule, owner, Some(busy));
    }

    /// Gone: its pods are idle (the garbage collector deletes them, and must not wait on them).
    fn gone(&self, rule: &OwnerRule, owner: &DynamicObject) {
        self.follow_owner(rule, owner, None);
    }

    fn follow_owner(&self, rule: &OwnerRule, owner: &DynamicObject, busy: Option<bool>) {
        let namespace = owner.namespace().unwrap_or_default();
        let key = format!("{}/{}", rule.kind, owner.name_any());
        self.view.set_owner_busy(&namespace, &key, busy);
        let pods = self.view.select(&namespace, |pod| pod.owner.as_deref() == Some(key.as_str()));
        for (name, record) in pods {
            let pod = PodRef { namespace: namespace.clone(), name, uid: record.uid.to_string() };
            if let Some(effect) = flip(pod, &record, busy.unwrap_or(false)) {
                drop(self.outbox.send(effect));
            }
        }
    }
}

fn owner_name(rule: &OwnerRule, owner: &DynamicObject) -> String {
    format!("{} {}/{}", rule.kind, owner.namespace().unwrap_or_default(), owner.name_any())
}

/// The flip a pod of the view is due, if its owner is under a rule and says otherwise.
pub fn follow(view: &View, pod: &PodRef, record: &PodRecord) -> Option<Effect> {
    let busy = view.owner_busy(&pod.namespace, record.owner.as_deref()?)?;
    flip(pod.clone(), record, busy)
}

fn flip(pod: PodRef, record: &PodRecord, owner_busy: bool) -> Option<Effect> {
    let ending = record.terminating || record.is_terminal();
    let value = owners::follow(record.label(BUSY_LABEL), owner_busy, ending)?;
    Some(Effect::FollowOwner { pod, value })
}
