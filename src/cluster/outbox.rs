//! The one way side effects leave busyguard: annotation patches, deferred deletes and Events,
//! queued after a decision and carried out with retries. A failed or dropped side effect is
//! logged and counted; none blocks an answer past its deadline.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tracing::{debug, error, info, warn};

use super::view::WatchedPod;
use crate::audit::{AuditLog, AuditRecord};
use crate::metrics::{Metrics, SideEffectLabels};
use crate::policy::PolicyConfig;
use crate::policy::lifecycle::{DELETE_REQUESTED, DeleteRequest};
use crate::policy::mutate::{Changes, merge_patch, plan_annotations};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum SideEffect {
    /// Bring busyguard's annotations up to date; `changes` were planned on `resource_version`.
    Refresh { pod: PodRef, resource_version: String, changes: Changes },
    /// Note a refused delete on the pod, so it is carried out once the pod is idle.
    MarkDeleteRequested { pod: PodRef, request: DeleteRequest },
    /// Carry out a deferred delete: the pod, as of `resource_version`, is idle.
    DeleteIdle { pod: PodRef, resource_version: String, request: DeleteRequest },
    /// A Warning Event on the pod for a refused disruption.
    Event { pod: PodRef, action: &'static str, note: String },
}

impl SideEffect {
    pub fn kind(&self) -> &'static str {
        match self {
            SideEffect::Refresh { .. } => "refresh",
            SideEffect::MarkDeleteRequested { .. } => "mark-delete",
            SideEffect::DeleteIdle { .. } => "delete-idle",
            SideEffect::Event { .. } => "event",
        }
    }

    fn pod(&self) -> &PodRef {
        match self {
            SideEffect::Refresh { pod, .. }
            | SideEffect::MarkDeleteRequested { pod, .. }
            | SideEffect::DeleteIdle { pod, .. }
            | SideEffect::Event { pod, .. } => pod,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct OutboxSettings {
    pub queue: usize,
    pub concurrency: usize,
    pub attempts: u32,
    pub call_timeout: Duration,
    /// At most one Event per pod in this interval.
    pub event_interval: Duration,
}

impl Default for OutboxSettings {
    fn default() -> Self {
        OutboxSettings {
            queue: 1024,
            concurrency: 8,
            attempts: 5,
            call_timeout: Duration::from_secs(5),
            event_interval: Duration::from_secs(60),
        }
    }
}

/// What happened to a side effect, as the metric's `result` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Done {
    Ok,
    /// Nothing left to do: the pod is gone, changed or already up to date.
    Moot,
    Failed,
    Dropped,
    RateLimited,
}

impl Done {
    fn as_str(self) -> &'static str {
        match self {
            Done::Ok => "ok",
            Done::Moot => "moot",
            Done::Failed => "failed",
            Done::Dropped => "dropped",
            Done::RateLimited => "rate-limited",
        }
    }
}

struct Job {
    effect: SideEffect,
    done: Option<oneshot::Sender<Done>>,
}

#[derive(Clone)]
pub struct Outbox {
    jobs: mpsc::Sender<Job>,
    metrics: Arc<Metrics>,
    /// Pods with a deferred delete in flight or carried out: never deleted twice.
    deletes: Arc<Mutex<HashSet<String>>>,
    last_event: Arc<Mutex<HashMap<String, Instant>>>,
    event_interval: Duration,
}

impl Outbox {
    pub fn start(
        client: Client,
        policy: PolicyConfig,
        audit: Arc<AuditLog>,
        metrics: Arc<Metrics>,
        settings: OutboxSettings,
    ) -> Outbox {
        let (jobs, queue) = mpsc::channel(settings.queue);
        let outbox = Outbox {
            jobs,
            metrics: metrics.clone(),
            deletes: Arc::default(),
            last_event: Arc::default(),
            event_interval: settings.event_interval,
        };
        let reporter = Reporter {
            controller: "busyguard".into(),
            instance: std::env::var("POD_NAME").ok().or_else(|| std::env::var("HOSTNAME").ok()),
        };
        let worker = Arc::new(Worker {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            policy,
            audit,
            metrics,
            settings,
            deletes: outbox.deletes.clone(),
        });
        tokio::spawn(worker.run(queue));
        outbox
    }

    /// Queues a side effect; the receiver tells when it is done. A deferred delete already in
    /// flight and an Event within the rate limit are not queued again.
    pub fn send(&self, effect: SideEffect) -> oneshot::Receiver<Done> {
        let (done, receiver) = oneshot::channel();
        let kind = effect.kind();
        let skipped = match &effect {
            SideEffect::DeleteIdle { pod, .. } => {
                let in_flight = !self.deletes.lock().unwrap_or_else(|p| p.into_inner()).insert(pod.uid.clone());
                in_flight.then_some(Done::Moot)
            }
            SideEffect::Event { pod, .. } => self.event_rate_limited(&pod.uid).then_some(Done::RateLimited),
            _ => None,
        };
        if let Some(result) = skipped {
            count(&self.metrics, kind, result);
            let _ = done.send(result);
            return receiver;
        }
        if let Err(e) = self.jobs.try_send(Job { effect, done: Some(done) }) {
            let job = match e {
                mpsc::error::TrySendError::Full(job) | mpsc::error::TrySendError::Closed(job) => job,
            };
            error!(kind, pod = %pod_name(job.effect.pod()), "side-effect queue is full: dropped");
            if let SideEffect::DeleteIdle { pod, .. } = &job.effect {
                self.deletes.lock().unwrap_or_else(|p| p.into_inner()).remove(&pod.uid);
            }
            count(&self.metrics, kind, Done::Dropped);
            if let Some(done) = job.done {
                let _ = done.send(Done::Dropped);
            }
        }
        receiver
    }

    /// The pod is gone from the cluster: nothing about it needs remembering.
    pub fn forget(&self, uid: &str) {
        self.deletes.lock().unwrap_or_else(|p| p.into_inner()).remove(uid);
        self.last_event.lock().unwrap_or_else(|p| p.into_inner()).remove(uid);
    }

    fn event_rate_limited(&self, uid: &str) -> bool {
        let now = Instant::now();
        let mut last = self.last_event.lock().unwrap_or_else(|p| p.into_inner());
        if last.len() > 10_000 {
            last.retain(|_, at| now.duration_since(*at) < self.event_interval);
        }
        match last.get(uid) {
            Some(at) if now.duration_since(*at) < self.event_interval => true,
            _ => {
                last.insert(uid.to_string(), now);
                false
            }
        }
    }
}

fn count(metrics: &Metrics, kind: &'static str, result: Done) {
    metrics.side_effects.get_or_create(&SideEffectLabels { kind, result: result.as_str() }).inc();
}

fn pod_name(pod: &PodRef) -> String {
    format!("{}/{}", pod.namespace, pod.name)
}

struct Worker {
    client: Client,
    recorder: Recorder,
    policy: PolicyConfig,
    audit: Arc<AuditLog>,
    metrics: Arc<Metrics>,
    settings: OutboxSettings,
    deletes: Arc<Mutex<HashSet<String>>>,
}

/// One attempt's verdict.
enum Attempt {
    Done(Done),
    /// Worth another try after a pause (conflict, throttling, server error, timeout).
    Retry(String),
    Fail(String),
}

impl Worker {
    async fn run(self: Arc<Self>, mut queue: mpsc::Receiver<Job>) {
        let slots = Arc::new(Semaphore::new(self.settings.concurrency));
        while let Some(job) = queue.recv().await {
            let Ok(slot) = slots.clone().acquire_owned().await else { return };
            let worker = self.clone();
            tokio::spawn(async move {
                let kind = job.effect.kind();
                let result = worker.carry_out(&job.effect).await;
                if let SideEffect::DeleteIdle { pod, .. } = &job.effect
                    && result != Done::Ok
                {
                    // Not carried out: the next change of the pod may try again.
                    worker.deletes.lock().unwrap_or_else(|p| p.into_inner()).remove(&pod.uid);
                }
                count(&worker.metrics, kind, result);
                if let Some(done) = job.done {
                    let _ = done.send(result);
                }
                drop(slot);
            });
        }
    }

    async fn carry_out(&self, effect: &SideEffect) -> Done {
        let pod = pod_name(effect.pod());
        let mut effect = effect.clone();
        let mut pause = Duration::from_millis(200);
        for attempt in 1..=self.settings.attempts {
            let outcome = match tokio::time::timeout(self.settings.call_timeout, self.attempt(&mut effect)).await {
                Ok(outcome) => outcome,
                Err(_) => Attempt::Retry(format!("no answer within {:?}", self.settings.call_timeout)),
            };
            match outcome {
                Attempt::Done(done) => {
                    debug!(kind = effect.kind(), %pod, result = done.as_str(), "side effect done");
                    return done;
                }
                Attempt::Fail(why) => {
                    error!(kind = effect.kind(), %pod, error = %why, "side effect failed");
                    return Done::Failed;
                }
                Attempt::Retry(why) if attempt < self.settings.attempts => {
                    warn!(kind = effect.kind(), %pod, attempt, error = %why, "side effect will be retried");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(5));
                }
                Attempt::Retry(why) => {
                    error!(kind = effect.kind(), %pod, attempts = attempt, error = %why, "side effect failed: giving up");
                }
            }
        }
        Done::Failed
    }

    async fn attempt(&self, effect: &mut SideEffect) -> Attempt {
        let api: Api<WatchedPod> = Api::namespaced(self.client.clone(), &effect.pod().namespace);
        match effect {
            SideEffect::Refresh { pod, resource_version, changes } => {
                let mut patch = merge_patch(changes);
                patch["metadata"]["resourceVersion"] = resource_version.clone().into();
                patch["metadata"]["uid"] = pod.uid.clone().into();
                match api.patch(&pod.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    Ok(_) => Attempt::Done(Done::Ok),
                    // The pod changed since the view saw it: plan again on what it is now.
                    Err(kube::Error::Api(status)) if status.code == 409 => match api.get_opt(&pod.name).await {
                        Ok(Some(fresh)) if fresh.metadata.uid.as_deref() == Some(&pod.uid) => {
                            let record = fresh.record();
                            let now = Timestamp::now();
                            *changes = plan_annotations(&record, self.policy.mutation, self.policy.max_busy, now);
                            *resource_version = record.resource_version.to_string();
                            if changes.is_empty() {
                                Attempt::Done(Done::Moot)
                            } else {
                                Attempt::Retry("the pod changed; planned again".into())
                            }
                        }
                        Ok(_) => Attempt::Done(Done::Moot),
                        Err(e) => classify(e),
                    },
                    Err(e) => classify(e),
                }
            }
            SideEffect::MarkDeleteRequested { pod, request } => {
                let patch = serde_json::json!({"metadata": {"uid": pod.uid,
                    "annotations": {DELETE_REQUESTED: request.to_annotation()}}});
                match api.patch(&pod.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    Ok(_) => Attempt::Done(Done::Ok),
                    Err(e) => classify(e),
                }
            }
            SideEffect::DeleteIdle { pod, resource_version, request } => {
                // Exactly once: only the pod as it was seen idle, by whichever replica is first.
                let preconditions =
                    Preconditions { uid: Some(pod.uid.clone()), resource_version: Some(resource_version.clone()) };
                let params = DeleteParams { preconditions: Some(preconditions), ..DeleteParams::default() };
                match api.delete(&pod.name, &params).await {
                    Ok(_) => {
                        info!(pod = %pod_name(pod), requested_by = %request.by, "deferred delete carried out");
                        self.audit_deleted(pod, request);
                        Attempt::Done(Done::Ok)
                    }
                    // Changed since (busy again, already deleted by another replica): the next
                    // change of the pod decides again.
                    Err(kube::Error::Api(status)) if status.code == 409 => Attempt::Done(Done::Moot),
                    // Refused by busyguard itself: the pod turned busy again.
                    Err(kube::Error::Api(status)) if status.code == 429 && status.message.contains("is busy") => {
                        Attempt::Done(Done::Moot)
                    }
                    Err(e) => classify(e),
                }
            }
            SideEffect::Event { pod, action, note } => {
                let event = Event {
                    type_: EventType::Warning,
                    reason: "DisruptionBlocked".into(),
                    note: Some(note.chars().take(1024).collect()),
                    action: action.to_string(),
                    secondary: None,
                };
                let reference = ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(pod.name.clone()),
                    namespace: Some(pod.namespace.clone()),
                    uid: Some(pod.uid.clone()),
                    ..ObjectReference::default()
                };
                match self.recorder.publish(&event, &reference).await {
                    Ok(()) => Attempt::Done(Done::Ok),
                    Err(e) => classify(e),
                }
            }
        }
    }

    fn audit_deleted(&self, pod: &PodRef, request: &DeleteRequest) {
        let record = AuditRecord {
            decision: "deleted-when-idle",
            reason: "delete-requested",
            detail: format!(
                "pod {} is idle: deleted as {} asked at {} while it was busy",
                pod_name(pod),
                request.by,
                request.at
            ),
            operation: "DELETE",
            resource: "pods".into(),
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            user: request.by.clone(),
            ..AuditRecord::new(Timestamp::now(), self.policy.mode)
        };
        self.audit.record(&record);
    }
}

/// 404: the pod is gone, nothing to do. 409, 429, 5xx and transport errors: try again.
fn classify(error: kube::Error) -> Attempt {
    match error {
        kube::Error::Api(status) => match status.code {
            404 => Attempt::Done(Done::Moot),
            409 | 429 | 500..=599 => Attempt::Retry(format!("{} {}", status.code, status.message)),
            code => Attempt::Fail(format!("{code} {}", status.message)),
        },
        other => Attempt::Retry(other.to_string()),
    }
}
