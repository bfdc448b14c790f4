//! The view's store of the busy rules' owners: each rule's verdict on each owner, the objects
//! linked to an owner through a kind between, and how following each kind goes. The indexes of
//! `cluster/owners.rs` are its only writers.

use std::collections::BTreeMap;

use jiff::Timestamp;
use parking_lot::RwLock;

use crate::cluster::fast_map::FastMap;
use crate::policy::owners::{OwnerRule, OwnerState};

/// Values by namespace, then key.
type ByNamespace<V> = FastMap<Box<str>, FastMap<Box<str>, V>>;

/// How following one busy rule's kind goes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnerKind {
    /// Why its owners are not followed now (not served, the watch failing); `None`: followed.
    pub unfollowed: Option<String>,
    /// Owners of the kind that ended, one after the other, without the rule ever holding for
    /// them: a rule reading a field the release does not write holds for none.
    pub ended_idle: u64,
}

#[derive(Default)]
pub struct Owners {
    state: RwLock<State>,
}

#[derive(Default)]
struct State {
    /// Each rule's verdict on an owner, by namespace and the rule's key for it
    /// ([`OwnerRule::state_key`]): whether it says its pods are busy, and since when.
    owners: ByNamespace<OwnerState>,
    /// The objects between a pod and the owner a busy rule reads (`--busy-when-owner
    /// VIA>KIND=…`), by namespace and their own `group/Kind/name`: the rule's key for their
    /// controlling owner.
    links: ByNamespace<Box<str>>,
    /// Each busy rule's kind (`agones.dev/v1/GameServer`) and how following it goes.
    kinds: BTreeMap<String, OwnerKind>,
}

impl Owners {
    /// How following each busy rule's kind goes, by the kind as the flag names it.
    pub fn kinds(&self) -> BTreeMap<String, OwnerKind> {
        self.state.read().kinds.clone()
    }

    /// Changes what is recorded of following the busy rule's `kind`.
    pub fn update_kind(&self, kind: &str, update: impl FnOnce(&mut OwnerKind)) {
        update(self.state.write().kinds.entry(kind.to_string()).or_default());
    }

    /// Whether the owner (the rule's key for it) says its pods are busy; `None` if it is under
    /// no rule, or not seen yet.
    pub fn busy(&self, namespace: &str, owner: &str) -> Option<OwnerState> {
        self.state.read().owners.get(namespace)?.get(owner).cloned()
    }

    /// The owner under a busy rule of the pods whose controlling owner is `controller`
    /// (`group/Kind/name`): `controller` itself, or the owner it is linked to; `None` if neither
    /// is known.
    pub fn of_pods(&self, namespace: &str, controller: &str) -> Option<OwnerState> {
        let state = self.state.read();
        let owners = state.owners.get(namespace)?;
        owners.get(controller).or_else(|| owners.get(state.links.get(namespace)?.get(controller)?)).cloned()
    }

    /// Records the owner's busy state, as last written at `written` (`None`: gone); what is
    /// recorded now.
    pub fn set_busy(
        &self,
        rule: &OwnerRule,
        namespace: &str,
        owner: &str,
        busy: Option<bool>,
        written: Timestamp,
    ) -> Option<OwnerState> {
        let mut state = self.state.write();
        let seen = busy.map(|busy| {
            let before = state.owners.get(namespace).and_then(|owners| owners.get(owner));
            OwnerState::seen(rule, before, busy, written)
        });
        set(&mut state.owners, namespace, owner, seen.clone());
        seen
    }

    /// Records the owner as last seen (`None`: gone).
    pub fn set(&self, namespace: &str, owner: &str, state: Option<OwnerState>) {
        set(&mut self.state.write().owners, namespace, owner, state);
    }

    /// Records that the object `linked` (`group/Kind/name`) is owned by `owner`, an owner under a
    /// busy rule (`None`: not, or gone); whether that changed what was recorded.
    pub fn set_link(&self, namespace: &str, linked: &str, owner: Option<&str>) -> bool {
        let links = &mut self.state.write().links;
        let before = links.get(namespace).and_then(|in_namespace| in_namespace.get(linked));
        if before.map(|before| &**before) == owner {
            return false;
        }
        set(links, namespace, linked, owner.map(Box::from));
        true
    }

    /// The objects of `namespace` linked to `owner`.
    pub fn linked_to(&self, namespace: &str, owner: &str) -> Vec<String> {
        let state = self.state.read();
        let Some(in_namespace) = state.links.get(namespace) else { return Vec::new() };
        in_namespace.iter().filter(|(_, to)| &***to == owner).map(|(linked, _)| linked.to_string()).collect()
    }
}

/// Sets (`Some`) or removes (`None`) the value of `key` in `namespace`, and the namespace with
/// its last key.
fn set<V>(by_namespace: &mut ByNamespace<V>, namespace: &str, key: &str, value: Option<V>) {
    match value {
        Some(value) => {
            by_namespace.entry(namespace.into()).or_default().insert(key.into(), value);
        }
        None => {
            if let Some(in_namespace) = by_namespace.get_mut(namespace) {
                in_namespace.remove(key);
                if in_namespace.is_empty() {
                    by_namespace.remove(namespace);
                }
            }
        }
    }
}
