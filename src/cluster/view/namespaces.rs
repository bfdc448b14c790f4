//! The view's store of namespaces: which are guarded, every one but those labelled out or only
//! those labelled in, as busyguard's webhooks select them. The namespace index
//! (`cluster/namespaces.rs`) is its only writer.

use std::collections::HashSet;

use parking_lot::RwLock;

use crate::policy::{Enrolment, NEVER_GUARDED_NAMESPACES};

#[derive(Default)]
pub struct Namespaces {
    enrolment: Enrolment,
    /// The namespaces labelled the other way than the rest (`Enrolment::exception`), as watched.
    excepted: RwLock<HashSet<String>>,
}

impl Namespaces {
    pub fn new(enrolment: Enrolment) -> Namespaces {
        Namespaces { enrolment, excepted: RwLock::default() }
    }

    pub fn enrolment(&self) -> Enrolment {
        self.enrolment
    }

    /// Whether busyguard leaves the pods of `namespace` alone, as its webhooks do.
    pub fn is_opted_out(&self, namespace: &str) -> bool {
        NEVER_GUARDED_NAMESPACES.contains(&namespace)
            || self.enrolment.leaves_alone(self.excepted.read().contains(namespace))
    }

    /// Records whether `namespace` carries the exception's label value; true when that changed.
    pub fn set_excepted(&self, namespace: &str, excepted: bool) -> bool {
        let mut all = self.excepted.write();
        if excepted { all.insert(namespace.to_string()) } else { all.remove(namespace) }
    }
}
