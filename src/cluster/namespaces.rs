//! The index of the namespaces labelled out (or, opted in by label, in): which pods busyguard
//! leaves alone, as its webhooks do. It records each namespace's side in the view and hands
//! back the namespaces that changed side, for the pod index to act on.

use std::sync::Arc;

use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};

use super::driver::{self, Index, Key, Scoped};
use super::view::View;
use crate::metrics::Metrics;
use crate::policy::keys::NAMESPACE_ENABLED_LABEL;

/// A namespace that changed side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Guarding {
    /// Its pods are left alone from now on.
    LeftAlone(String),
    /// Its pods are guarded again.
    Guarded(String),
}

/// The watch of the namespaces labelled the other way than the rest (`Enrolment::exception`).
pub fn events(client: &Client, view: &View, timeout_secs: u32) -> BoxStream<'static, Scoped<Namespace>> {
    let label = format!("{NAMESPACE_ENABLED_LABEL}={}", view.namespaces.enrolment().exception());
    let config = watcher::Config::default().labels(&label).timeout(timeout_secs);
    driver::watch(vec![(None, Api::<Namespace>::all(client.clone()))], config)
}

pub struct Guarded<'a> {
    pub view: &'a View,
    pub metrics: &'a Arc<Metrics>,
}

impl Guarded<'_> {
    /// Records whether `namespace` carries the exception's label value; the side it is on now,
    /// if that changed.
    fn except(&self, namespace: String, excepted: bool) -> Vec<Guarding> {
        let namespaces = &self.view.namespaces;
        if !namespaces.set_excepted(&namespace, excepted) {
            return Vec::new();
        }
        match namespaces.enrolment().leaves_alone(excepted) {
            true => vec![Guarding::LeftAlone(namespace)],
            false => vec![Guarding::Guarded(namespace)],
        }
    }
}

impl Index<Namespace> for Guarded<'_> {
    type Change = Guarding;

    fn what(&self) -> String {
        format!("the namespaces' {NAMESPACE_ENABLED_LABEL} label")
    }

    fn key(&self, namespace: &Namespace) -> Key {
        Key::cluster(namespace.name_any())
    }

    fn apply(&mut self, namespace: Namespace) -> Vec<Guarding> {
        self.except(namespace.name_any(), true)
    }

    /// Deleted, or its label changed: the watch selects by the label.
    fn delete(&mut self, namespace: Key) -> Vec<Guarding> {
        self.except(namespace.name, false)
    }

    /// The pods' list waits for the namespaces': a failure here is why it does not come.
    fn failed(&mut self, error: &watcher::Error) {
        self.metrics.watch_errors.inc();
        self.view.watch_failed(format!("namespaces: {}", driver::failure(error)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Enrolment;
    use std::time::Duration;

    fn namespace(name: &str) -> Namespace {
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap()
    }

    /// As kubert tests an index across a watch's restart: a namespace the relist no longer has
    /// (its label taken off while the watch was down) is guarded again, once.
    #[test]
    fn a_namespace_a_relist_no_longer_has_changes_side_once() {
        let view = View::watching(&[None], Duration::from_secs(30), Enrolment::OptOut);
        let metrics = Arc::new(Metrics::default());
        let mut index = Guarded { view: &view, metrics: &metrics };
        let mut driver = driver::Driver::default();
        let mut drive = |events: Vec<Scoped<Namespace>>| {
            let steps = events.into_iter().map(|(scope, event)| driver.step(&mut index, scope, event).changes);
            steps.flatten().collect::<Vec<_>>()
        };
        assert_eq!(
            drive(driver::listed(None, vec![namespace("batch"), namespace("ci")])),
            [Guarding::LeftAlone("batch".into()), Guarding::LeftAlone("ci".into())]
        );
        assert!(view.namespaces.is_opted_out("batch"));
        assert_eq!(drive(driver::listed(None, vec![namespace("ci")])), [Guarding::Guarded("batch".into())]);
        assert!(!view.namespaces.is_opted_out("batch") && view.namespaces.is_opted_out("ci"));
        assert!(drive(driver::listed(None, vec![namespace("ci")])).is_empty(), "nothing changed side");
    }
}
