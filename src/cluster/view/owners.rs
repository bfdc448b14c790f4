//! The view's record of the busy rules' owners: each rule's verdict on each owner, the objects
//! linked to an owner through a kind between, and how following each kind goes.

use std::collections::BTreeMap;

use jiff::Timestamp;

use super::{OwnerKind, View, known, set};
use crate::policy::owners::{OwnerRule, OwnerState};

impl View {
    /// How following each busy rule's kind goes, by the kind as the flag names it.
    pub fn owner_kinds(&self) -> BTreeMap<String, OwnerKind> {
        self.owner_kinds.read().clone()
    }

    /// Changes what is recorded of following the busy rule's `kind`.
    pub fn update_owner_kind(&self, kind: &str, update: impl FnOnce(&mut OwnerKind)) {
        update(self.owner_kinds.write().entry(kind.to_string()).or_default());
    }

    /// Whether the owner (`group/Kind/name`) says its pods are busy; `None` if it is under no rule,
    /// or not seen yet.
    pub fn owner_busy(&self, namespace: &str, owner: &str) -> Option<OwnerState> {
        self.owners.read().get(namespace)?.get(owner).cloned()
    }

    /// The owner under a busy rule of the pods whose controlling owner is `controller`
    /// (`group/Kind/name`): `controller` itself, or the owner it is linked to; `None` if neither
    /// is known.
    pub fn pods_owner(&self, namespace: &str, controller: &str) -> Option<OwnerState> {
        self.owner_busy(namespace, controller).or_else(|| {
            let owner = self.links.read().get(namespace)?.get(controller)?.clone();
            self.owner_busy(namespace, &owner)
        })
    }

    /// Every owner under a busy rule the view knows of, by namespace and `group/Kind/name`.
    pub fn owners_known(&self) -> Vec<(String, String)> {
        known(&self.owners.read())
    }

    /// Records the owner's busy state, as last written at `written` (`None`: gone); what is
    /// recorded now.
    pub fn set_owner_busy(
        &self,
        rule: &OwnerRule,
        namespace: &str,
        owner: &str,
        busy: Option<bool>,
        written: Timestamp,
    ) -> Option<OwnerState> {
        let seen = busy.map(|busy| {
            let before = self.owner_busy(namespace, owner);
            OwnerState::seen(rule, before.as_ref(), busy, written)
        });
        self.set_owner(namespace, owner, seen.clone());
        seen
    }

    /// Records the owner as last seen (`None`: gone).
    pub fn set_owner(&self, namespace: &str, owner: &str, state: Option<OwnerState>) {
        set(&mut self.owners.write(), namespace, owner, state);
    }

    /// Records that the object `linked` (`group/Kind/name`) is owned by `owner`, an owner under a
    /// busy rule (`None`: not, or gone); whether that changed what was recorded.
    pub fn set_link(&self, namespace: &str, linked: &str, owner: Option<&str>) -> bool {
        let mut links = self.links.write();
        let before = links.get(namespace).and_then(|in_namespace| in_namespace.get(linked));
        if before.map(|before| &**before) == owner {
            return false;
        }
        set(&mut links, namespace, linked, owner.map(Box::from));
        true
    }

    /// The objects of `namespace` linked to `owner`.
    pub fn linked_to(&self, namespace: &str, owner: &str) -> Vec<String> {
        let links = self.links.read();
        let Some(in_namespace) = links.get(namespace) else { return Vec::new() };
        in_namespace.iter().filter(|(_, to)| &***to == owner).map(|(linked, _)| linked.to_string()).collect()
    }

    /// Every object linked to an owner, by namespace and `group/Kind/name`.
    pub fn links_known(&self) -> Vec<(String, String)> {
        known(&self.links.read())
    }
}
