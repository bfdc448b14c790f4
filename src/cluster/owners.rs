//! Busy from the owner's status (`policy::owners`): a watch of each kind a rule names, that
//! flips the owners' pods busy or idle as their status changes. The pod watch asks the same of
//! each pod that changes (`follow`), so a pod seen after its owner follows it too.

use std::collections::{HashMap, HashSet};
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
use crate::policy::owners::{self, OwnerRule};
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
                let (rule, scope) = (rule.clone(), scope.clone());
                let events = watcher(api, config).default_backoff();
                streams.push(events.map(move |event| (rule.clone(), scope.clone(), event)).boxed());
            }
        }
        let mut events = futures::stream::select_all(streams);
        // Per kind and scope being listed: the owners the list had so far.
        let mut listing: HashMap<(String, Scope), HashSet<(String, String)>> = HashMap::new();
        while let Some((rule, scope, event)) = events.next().await {
            let listed = (rule.kind.clone(), scope);
            match event {
                Ok(watcher::Event::Init) => {
                    listing.insert(listed, HashSet::new());
                }
                Ok(watcher::Event::InitApply(owner)) => {
                    if let Some(seen) = listing.get_mut(&listed) {
                        seen.insert((owner.namespace().unwrap_or_default(), owner_key(&rule, &owner)));
                    }
                    self.changed(&rule, &owner);
                }
                Ok(watcher::Event::InitDone) => {
                    // Owners gone while the watch was down (no delete event came): their pods
                    // are idle, as on a delete.
                    let seen = listing.remove(&listed).unwrap_or_default();
                    for (namespace, key) in unlisted(self.view.owners_known(), &rule.kind, &listed.1, &seen) {
                        self.follow_owner(&namespace, &key, None);
                    }
                    info!(kind = %rule.kind, "owners listed");
                }
                Ok(watcher::Event::Apply(owner)) => self.changed(&rule, &owner),
                Ok(watcher::Event::Delete(owner)) => self.gone(&rule, &owner),
                Err(e) => warn!(kind = %rule.kind, error = %e, "watch of owners failed; retrying with backoff"),
            }
        }
    }

    /// The owner's status read by its rule, and its pods flipped to match. An owner being
    /// deleted has ended its pods' task: they go with it, so they are not held busy.
    fn changed(&self, rule: &OwnerRule, owner: &DynamicObject) {
        let busy = match owner.metadata.deletion_timestamp {
            Some(_) => false,
            // Converted once, straight from the object as decoded.
            None => match rule.busy(owner) {
                Ok(busy) => busy,
                Err(why) => {
                    warn!(owner = %owner_name(rule, owner), error = %why, "cannot tell whether the owner is busy; its pods are left as they are");
                    return;
                }
            },
        };
        self.follow_owner(&owner.namespace().unwrap_or_default(), &owner_key(rule, owner), Some(busy));
    }

    /// Gone: its pods are idle (the garbage collector deletes them, and must not wait on them).
    fn gone(&self, rule: &OwnerRule, owner: &DynamicObject) {
        self.follow_owner(&owner.namespace().unwrap_or_default(), &owner_key(rule, owner), None);
    }

    /// Records the owner `key` (`Kind/name`) as busy or not (`None`: gone, so idle), and flips
    /// its pods in the view to match.
    fn follow_owner(&self, namespace: &str, key: &str, busy: Option<bool>) {
        self.view.set_owner_busy(namespace, key, busy);
        let pods = self.view.select(namespace, |pod| pod.owner.as_deref() == Some(key));
        for (name, record) in pods {
            let pod = PodRef { namespace: namespace.to_string(), name, uid: record.uid.to_string() };
            if let Some(effect) = flip(pod, &record, busy.unwrap_or(false)) {
                drop(self.outbox.send(effect));
            }
        }
    }
}

/// Of the owners the view knows, those of `kind` in `scope` that a fresh list of them no longer
/// has (`seen`): gone while the watch was down.
fn unlisted(
    known: Vec<(String, String)>,
    kind: &str,
    scope: &Scope,
    seen: &HashSet<(String, String)>,
) -> Vec<(String, String)> {
    let of_kind = |key: &str| key.strip_prefix(kind).is_some_and(|rest| rest.starts_with('/'));
    let in_scope = |namespace: &str| scope.as_deref().is_none_or(|scope| scope == namespace);
    known
        .into_iter()
        .filter(|(namespace, key)| {
            of_kind(key) && in_scope(namespace) && !seen.contains(&(namespace.clone(), key.clone()))
        })
        .collect()
}

/// An owner as its pods' records name it: `Kind/name`.
fn owner_key(rule: &OwnerRule, owner: &DynamicObject) -> String {
    format!("{}/{}", rule.kind, owner.name_any())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(namespace: &str, key: &str) -> (String, String) {
        (namespace.to_string(), key.to_string())
    }

    #[test]
    fn an_owner_a_relist_no_longer_has_is_gone_but_only_of_that_kind_and_scope() {
        let known = vec![
            pair("ci", "EphemeralRunner/a"),
            pair("ci", "EphemeralRunner/b"),
            pair("games", "GameServer/g"),
            pair("other", "EphemeralRunner/c"),
            pair("ci", "EphemeralRunnerSet/s"),
        ];
        let seen = HashSet::from([pair("ci", "EphemeralRunner/a")]);
        let everywhere = unlisted(known.clone(), "EphemeralRunner", &None, &seen);
        assert_eq!(everywhere, [pair("ci", "EphemeralRunner/b"), pair("other", "EphemeralRunner/c")]);
        let in_ci = unlisted(known, "EphemeralRunner", &Some("ci".into()), &seen);
        assert_eq!(in_ci, [pair("ci", "EphemeralRunner/b")], "another namespace's watch lists its own");
    }
}
