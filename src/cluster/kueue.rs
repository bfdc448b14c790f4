//! Kueue's preemptions, held where a namespace asks (`--hold-kueue-preemption`): a watch of the
//! namespaces labelled `busyguard.io/hold-preemption=true` and one of Kueue's Workloads, so
//! that the Job controller's delete of a busy pod of a Job whose Workload Kueue preempted is
//! judged as a cluster disruption (refused while busy), not as the Job's own end. Kueue keeps
//! the preempted Workload's quota until its Job has no active pod left, so the preemptor waits
//! as a scheduler preemptor does. Kueue not installed, or its Workloads not readable, leaves
//! everything else as it is, and says which on `/status` and in `busyguard_kueue_hold_followed`,
//! asking again.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::DynamicObject;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tracing::{info, warn};

use super::driver::{self, Index, Key};
use super::kinds;
use super::view::{Scope, View};
use crate::policy::keys::HOLD_PREEMPTION_NAMESPACE_LABEL;

/// Kueue's API group, and the reason of a Workload's `Evicted` condition when Kueue preempted
/// it (`WorkloadEvictedByPreemption`).
const KUEUE_GROUP: &str = "kueue.x-k8s.io";
const PREEMPTED: &str = "Preempted";

/// Why the hold has nothing to follow: Kueue is not installed (its API group is not served).
fn not_served() -> String {
    "the API server does not serve Kueue's Workloads (Kueue not installed?)".into()
}

/// Follows the namespaces that hold preemptions, and Kueue's Workloads in `scopes`, until the
/// process stops.
pub fn start(client: Client, view: Arc<View>, scopes: &[Scope], watch_timeout_secs: u32) {
    let label = format!("{HOLD_PREEMPTION_NAMESPACE_LABEL}=true");
    let config = watcher::Config::default().labels(&label).timeout(watch_timeout_secs);
    let namespaces = driver::watch(vec![(None, Api::<Namespace>::all(client.clone()))], config);
    let index_view = view.clone();
    tokio::spawn(async move {
        let mut index = Holding { view: &index_view };
        driver::drive(&mut index, namespaces, |never| match never {}).await;
    });
    view.preemptions.set_unfollowed(Some("not asked of the API server yet".into()));
    tokio::spawn(workloads(client, view, scopes.to_vec(), watch_timeout_secs));
}

async fn workloads(client: Client, view: Arc<View>, scopes: Vec<Scope>, watch_timeout_secs: u32) {
    let find = || async {
        match kube::discovery::group(&client, KUEUE_GROUP).await.map(|group| group.recommended_kind("Workload")) {
            Ok(Some((resource, _))) => Ok(resource),
            // The group not among the API server's (MissingApiGroup), or without Workloads.
            Ok(None) | Err(kube::Error::Discovery(_)) => Err(not_served()),
            Err(kube::Error::Api(status)) if status.code == 404 => Err(not_served()),
            Err(e) => Err(format!("cannot ask the API server whether it serves Kueue's Workloads: {e}")),
        }
    };
    let failed = |why: String, pause: Duration| {
        warn!(retry_in = ?pause, "--hold-kueue-preemption: {why}: Kueue's preemptions are not held; everything else is served");
        view.preemptions.set_unfollowed(Some(why));
    };
    let resource = kinds::served(find, failed).await;
    let events = kinds::watch_scopes::<DynamicObject>(&client, &resource, scopes, watch_timeout_secs);
    let mut index = Workloads { view: &view };
    driver::drive(&mut index, events, |never| match never {}).await;
}

/// The Job a Workload stands for: its controlling owner of kind `Job`.
fn job_of(workload: &DynamicObject) -> Option<&str> {
    let owners = workload.metadata.owner_references.iter().flatten();
    let job = owners
        .into_iter()
        .find(|o| o.kind == "Job" && o.api_version.starts_with("batch/") && o.controller == Some(true))?;
    Some(&job.name)
}

/// Whether Kueue preempted the Workload: its `Evicted` condition true with reason `Preempted`,
/// until it is admitted again (the condition then false) or gone.
fn preempted(workload: &DynamicObject) -> bool {
    let conditions = workload.data["status"]["conditions"].as_array().into_iter().flatten();
    conditions.into_iter().any(|c| c["type"] == "Evicted" && c["status"] == "True" && c["reason"] == PREEMPTED)
}

/// The index of Workloads: the Jobs Kueue preempted, by namespace and Job name.
struct Workloads<'a> {
    view: &'a View,
}

impl Index<DynamicObject> for Workloads<'_> {
    /// Only the view changes: the Job controller's deletes are judged against it.
    type Change = Infallible;

    fn what(&self) -> String {
        "Kueue's Workloads".into()
    }

    /// A Workload by the Job it stands for (a Workload of no Job: by its own name).
    fn key(&self, workload: &DynamicObject) -> Key {
        let job = job_of(workload).map_or_else(|| format!("Workload/{}", workload.name_any()), str::to_string);
        Key::new(workload.namespace().unwrap_or_default(), job)
    }

    fn apply(&mut self, workload: DynamicObject) -> Vec<Infallible> {
        let Some(job) = job_of(&workload) else { return Vec::new() };
        let (namespace, preempted) = (workload.namespace().unwrap_or_default(), preempted(&workload));
        if self.view.preemptions.set_preempted(&namespace, job, preempted) && preempted {
            info!(job = %format!("{namespace}/{job}"), "Kueue preempted the Job's Workload");
        }
        Vec::new()
    }

    fn delete(&mut self, job: Key) -> Vec<Infallible> {
        self.view.preemptions.set_preempted(&job.namespace, &job.name, false);
        Vec::new()
    }

    /// The API server answered: the Workloads are followed (again).
    fn alive(&mut self) {
        self.view.preemptions.set_unfollowed(None);
    }

    /// RBAC missing (403) shows here: the hold is off until the watch works, and `/status` says so.
    fn failed(&mut self, error: &watcher::Error) {
        self.view.preemptions.set_unfollowed(Some(format!("Kueue's Workloads: {}", driver::failure(error))));
    }
}

/// The index of the namespaces that hold Kueue's preemptions.
struct Holding<'a> {
    view: &'a View,
}

impl Index<Namespace> for Holding<'_> {
    type Change = Infallible;

    fn what(&self) -> String {
        format!("the namespaces' {HOLD_PREEMPTION_NAMESPACE_LABEL} label")
    }

    fn key(&self, namespace: &Namespace) -> Key {
        Key::cluster(namespace.name_any())
    }

    fn apply(&mut self, namespace: Namespace) -> Vec<Infallible> {
        self.view.preemptions.set_holding(&namespace.name_any(), true);
        Vec::new()
    }

    /// Deleted, or its label changed: the watch selects by the label.
    fn delete(&mut self, namespace: Key) -> Vec<Infallible> {
        self.view.preemptions.set_holding(&namespace.name, false);
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A Workload as Kueue's job reconciler creates it for a Job, with `conditions`.
    fn workload(conditions: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": "job-train-3f2a1", "namespace": "ml", "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "j", "controller": true,
                    "blockOwnerDeletion": true}]},
            "status": {"conditions": conditions}}))
        .unwrap()
    }

    #[test]
    fn a_workload_kueue_preempted_names_its_job_until_it_is_admitted_again() {
        let condition =
            |kind: &str, status: &str, reason: &str| json!({"type": kind, "status": status, "reason": reason});
        let admitted = [condition("QuotaReserved", "True", "QuotaReserved"), condition("Admitted", "True", "Admitted")];
        let running = workload(json!(admitted));
        assert_eq!((job_of(&running), preempted(&running)), (Some("train"), false));
        assert!(preempted(&workload(json!([admitted[0], admitted[1], condition("Evicted", "True", "Preempted")]))));
        for other in
            ["PodsReadyTimeout", "InactiveWorkload", "AdmissionCheck", "DeactivatedDueToRequeuingLimitExceeded"]
        {
            assert!(!preempted(&workload(json!([condition("Evicted", "True", other)]))), "{other}: Kueue's own end");
        }
        assert!(!preempted(&workload(json!([condition("Evicted", "False", "Preempted")]))), "admitted again");
        let mut of_a_pod = workload(json!([]));
        of_a_pod.metadata.owner_references.as_mut().unwrap()[0].kind = "Pod".into();
        assert_eq!(job_of(&of_a_pod), None, "not a Job's");
        let mut not_controlling = workload(json!([]));
        not_controlling.metadata.owner_references.as_mut().unwrap()[0].controller = None;
        assert_eq!(job_of(&not_controlling), None, "a Job it does not belong to");
    }

    /// As kubert tests an index across a watch's restart: a Workload or a namespace the relist
    /// no longer has no longer holds the Job's delete.
    #[test]
    fn a_preemption_a_relist_no_longer_has_is_held_no_longer() {
        let view = View::without_cluster();
        let preempted = workload(json!([{"type": "Evicted", "status": "True", "reason": "Preempted"}]));
        let ml: Namespace = serde_json::from_value(json!({"metadata": {"name": "ml"}})).unwrap();
        let (mut workloads, mut holding) = (Workloads { view: &view }, Holding { view: &view });
        let (mut workload_driver, mut namespace_driver) = (driver::Driver::default(), driver::Driver::default());
        for (scope, event) in driver::listed(None, vec![preempted.clone()]) {
            workload_driver.step(&mut workloads, scope, event);
        }
        for (scope, event) in driver::listed(None, vec![ml.clone()]) {
            namespace_driver.step(&mut holding, scope, event);
        }
        assert!(view.preemptions.held("ml", "train"));
        for (scope, event) in driver::listed(None, Vec::new()) {
            workload_driver.step(&mut workloads, scope, event);
        }
        assert!(!view.preemptions.held("ml", "train"), "the Workload gone while the watch was down");
        for (scope, event) in driver::listed(None, vec![preempted]) {
            workload_driver.step(&mut workloads, scope, event);
        }
        assert!(view.preemptions.held("ml", "train"));
        for (scope, event) in driver::listed(None, Vec::<Namespace>::new()) {
            namespace_driver.step(&mut holding, scope, event);
        }
        assert!(!view.preemptions.held("ml", "train"), "the namespace's label gone while the watch was down");
    }
}
