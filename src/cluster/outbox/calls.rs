//! The API calls that carry out each side effect, one attempt each: the retries, the counting
//! and what a refusal means are the outbox's.

use std::borrow::Cow;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};

use crate::cluster::view::ApiPod;
use crate::policy::PolicyConfig;
use crate::policy::disruption::{self, NotReleased};
use crate::policy::keys::FIELD_MANAGER;
use crate::policy::observed;
use crate::policy::outcome::{Call, Effect, PodWrite};
use crate::policy::pdb::busy_pdb;
use crate::policy::pod::PodRef;

/// What the outbox's calls are made with.
/// An effect read again just before its call ([`Calls::confirm`]).
pub enum Confirmed<'e> {
    /// Still due, as it is to be carried out (the pod as the API server has it now, where that
    /// matters).
    Due(Cow<'e, Effect>),
    /// No longer due, and why.
    NoLongerDue(String),
}

pub struct Calls {
    pub client: Client,
    /// Names this replica in the Events it creates.
    pub instance: String,
    /// At most one `DisruptionBlocked` Event per pod in this interval, whichever replica raises it.
    pub event_interval: Duration,
    /// What a deferred eviction is judged by again, on the pod as the API server has it.
    pub policy: PolicyConfig,
}

impl Calls {
    /// The effect's API call, alone.
    pub async fn call(&self, effect: &Effect) -> kube::Result<()> {
        let pdbs = |namespace: &str| Api::<PodDisruptionBudget>::namespaced(self.client.clone(), namespace);
        match effect.call() {
            Call::PatchPod(PodWrite { pod, patch }) => {
                let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..PatchParams::default() };
                self.pods(pod).patch(&pod.name, &params, &Patch::Merge(&patch)).await.map(drop)
            }
            Call::DeletePod { pod, resource_version, evict } => match evict {
                // An eviction deferred stays an eviction: the pod's PodDisruptionBudgets hold
                // (429 until they allow it: tried again, then on the next sweep).
                Some(evict) => self.evict(pod, resource_version, evict.grace_period_seconds).await,
                None => {
                    // Exactly once: only the pod as it was seen idle, by whichever replica is first.
                    let preconditions = Preconditions {
                        uid: Some(pod.uid.clone()),
                        resource_version: Some(resource_version.to_string()),
                    };
                    let params = DeleteParams { preconditions: Some(preconditions), ..DeleteParams::default() };
                    self.pods(pod).delete(&pod.name, &params).await.map(drop)
                }
            },
            Call::CreateBusyPdb { namespace } => {
                let params = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() };
                pdbs(namespace).create(&params, &busy_pdb(namespace)).await.map(drop)
            }
            Call::DeleteBusyPdb { namespace, name } => {
                pdbs(namespace).delete(name, &DeleteParams::default()).await.map(drop)
            }
            Call::BlockedEvent { pod, action, note } => {
                let name = blocked_event_name(&pod.uid, Timestamp::now(), self.event_interval);
                self.create_event(pod, name, "DisruptionBlocked", action.as_str(), note).await
            }
            Call::LossEvent { pod, cause, note } => {
                let name = format!("busyguard-lost-{}", pod.uid);
                self.create_event(pod, name, cause.event_reason(), "Observe", note).await
            }
        }
    }

    /// An Eviction of the pod as it was seen idle (uid and resourceVersion as preconditions),
    /// with the evictor's grace period. Written out here: kube's `Api::evict` sends its delete
    /// options as `delete_options`, which the API server ignores, preconditions and all.
    async fn evict(&self, pod: &PodRef, resource_version: &str, grace_period: Option<i64>) -> kube::Result<()> {
        let mut delete_options =
            serde_json::json!({"preconditions": {"uid": pod.uid, "resourceVersion": resource_version}});
        if let Some(seconds) = grace_period {
            delete_options["gracePeriodSeconds"] = seconds.into();
        }
        let eviction = serde_json::json!({"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": pod.name, "namespace": pod.namespace}, "deleteOptions": delete_options});
        let path = format!("/api/v1/namespaces/{}/pods/{}/eviction", pod.namespace, pod.name);
        let request = http::Request::post(path)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(eviction.to_string().into_bytes())
            .map_err(kube::Error::HttpError)?;
        self.client.request::<kube::core::Status>(request).await.map(drop)
    }

    /// The effect as it is to be carried out, read again just before its call where what it
    /// rests on may have changed since it was decided; or why it is no longer due.
    pub async fn confirm<'e>(&self, effect: &'e Effect) -> kube::Result<Confirmed<'e>> {
        Ok(match effect {
            Effect::DeleteIdle { pod, request, .. } if request.evict.is_some() => match self.still_due(pod).await? {
                Some(due) => Confirmed::Due(Cow::Owned(due)),
                None => Confirmed::NoLongerDue("the pod changed since: its deferred eviction waits".into()),
            },
            Effect::Release { pod, .. } => match self.confirm_release(pod).await? {
                Ok(()) => Confirmed::Due(Cow::Borrowed(effect)),
                Err(NotReleased(why)) => Confirmed::NoLongerDue(why),
            },
            _ => Confirmed::Due(Cow::Borrowed(effect)),
        })
    }

    /// The deferred delete of the pod as the API server has it now, if one is still due: its
    /// resourceVersion then is the precondition. An eviction takes a slot of the pod's
    /// PodDisruptionBudget before the API server checks the preconditions, and a slot taken for
    /// a delete refused on them stays taken for two minutes: so an eviction is never sent on the
    /// view's resourceVersion, which a write the watch has not yet brought makes stale.
    async fn still_due(&self, pod: &PodRef) -> kube::Result<Option<Effect>> {
        let now_seen = self.pods(pod).get(&pod.name).await?;
        if now_seen.metadata.uid.as_deref() != Some(&pod.uid) {
            return Ok(None);
        }
        let due = observed::due(pod, &now_seen.record(self.policy.mutation.marks), &self.policy, Timestamp::now());
        Ok(due.into_iter().find(|effect| matches!(effect, Effect::DeleteIdle { .. })))
    }

    /// What the API server says now of the pod's ReplicaSet and Deployment, judged by
    /// `disruption::release_confirmed`.
    async fn confirm_release(&self, pod: &PodRef) -> Result<Result<(), NotReleased>, kube::Error> {
        let current = self.pods(pod).get(&pod.name).await?;
        let controller = |owners: Option<&Vec<OwnerReference>>, kind: &str| {
            owners.into_iter().flatten().find(|o| o.controller == Some(true) && o.kind == kind).map(|o| o.name.clone())
        };
        let Some(replica_set) = controller(current.metadata.owner_references.as_ref(), "ReplicaSet") else {
            return Ok(Err(NotReleased("no ReplicaSet controls it".into())));
        };
        let replica_set = Api::<ReplicaSet>::namespaced(self.client.clone(), &pod.namespace).get(&replica_set).await?;
        let strategy = match controller(replica_set.metadata.owner_references.as_ref(), "Deployment") {
            Some(name) => {
                let deployment = Api::<Deployment>::namespaced(self.client.clone(), &pod.namespace).get(&name).await?;
                deployment.spec.strategy.and_then(|s| s.type_)
            }
            None => None,
        };
        let wanted = replica_set.spec.replicas;
        let has = replica_set.status.map(|s| s.replicas);
        Ok(disruption::release_confirmed(wanted, has, strategy.as_deref()))
    }

    fn pods(&self, pod: &PodRef) -> Api<ApiPod> {
        Api::namespaced(self.client.clone(), &pod.namespace)
    }

    /// Creates a Warning Event about `pod`, named so that every replica creating it names it alike.
    async fn create_event(
        &self,
        pod: &PodRef,
        name: String,
        reason: &str,
        action: &str,
        note: &str,
    ) -> kube::Result<()> {
        let event = Event {
            metadata: ObjectMeta { name: Some(name), namespace: Some(pod.namespace.clone()), ..ObjectMeta::default() },
            event_time: Some(MicroTime(Timestamp::now())),
            action: Some(action.into()),
            reason: Some(reason.into()),
            type_: Some("Warning".into()),
            note: Some(note.chars().take(1024).collect()),
            reporting_controller: Some(FIELD_MANAGER.into()),
            reporting_instance: Some(self.instance.clone()),
            regarding: Some(reference_to(pod)),
            ..Default::default()
        };
        let events: Api<Event> = Api::namespaced(self.client.clone(), &pod.namespace);
        events.create(&Default::default(), &event).await.map(drop)
    }
}

/// The name of a pod's `DisruptionBlocked` Event for the interval `now` falls in: the same on
/// every replica, so with two replicas the second one's create is refused and one Event is raised.
fn blocked_event_name(uid: &str, now: Timestamp, interval: Duration) -> String {
    let interval = interval.as_millis().max(1);
    format!("busyguard-blocked-{uid}-{}", now.as_millisecond().max(0) as u128 / interval)
}

/// What an Event is about: the pod.
fn reference_to(pod: &PodRef) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(pod.name.clone()),
        namespace: Some(pod.namespace.clone()),
        uid: Some(pod.uid.clone()),
        ..ObjectReference::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_blocked_event_is_named_alike_within_an_interval_and_anew_after_it() {
        let at = |second: i64| Timestamp::from_second(second).unwrap();
        let minute = Duration::from_secs(60);
        assert_eq!(blocked_event_name("u", at(600), minute), blocked_event_name("u", at(659), minute));
        assert_ne!(blocked_event_name("u", at(659), minute), blocked_event_name("u", at(660), minute));
        assert_ne!(blocked_event_name("u", at(600), minute), blocked_event_name("v", at(600), minute));
    }
}
