//! The one way side effects leave busyguard: pod patches, deferred deletes, Events and the
//! busy-pod PDBs, queued after a decision and carried out with retries. A failed or dropped side effect is
//! logged and counted; none blocks an answer past its deadline.

mod answers;
mod calls;
mod last_sent;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::future::{Either, Ready, ready};
use jiff::Timestamp;
use kube::Client;
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use strum::VariantNames;
use tokio::sync::{Notify, Semaphore, mpsc, oneshot};
use tracing::{debug, error, info, warn};

use crate::audit::AuditLog;
use crate::metrics::{CauseLabels, Metrics, SideEffectLabels};
use crate::policy::keys::FIELD_MANAGER;
use crate::policy::outcome::{AuditRecord, Effect, LossCause};
use crate::policy::{Mode, PolicyConfig};
pub use answers::EffectResult;
use answers::{Attempt, classify, moot};
use calls::{Calls, Confirmed};
use last_sent::{EventLimits, LastSent};

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

/// A side effect handed to the outbox, as a future of what became of it: settled at once where
/// it was not queued (the common case of a refusal repeated within its Event's and mark's
/// intervals, which then costs no channel), else when the worker is done with it.
pub type Sent = Either<Ready<Result<EffectResult, oneshot::error::RecvError>>, Queued>;

/// A side effect queued: what became of it once the worker is done with it.
pub type Queued = oneshot::Receiver<EffectResult>;

struct Job {
    effect: Effect,
    done: Option<oneshot::Sender<EffectResult>>,
}

/// What the outbox and its worker both hold.
struct Shared {
    settings: OutboxSettings,
    audit: Arc<AuditLog>,
    metrics: Arc<Metrics>,
    /// Jobs queued or being carried out, and the wake-up once there are none.
    pending: AtomicUsize,
    idle: Notify,
    /// Pods with a deferred delete in flight or carried out: never deleted twice.
    deletes: Mutex<HashSet<String>>,
    events: Mutex<EventLimits>,
    /// When each pod was last sent its refused eviction's mark, and how long that write stands:
    /// the policy renews it no sooner, and a view that has not yet brought it back asks again on
    /// every refusal.
    marks: Mutex<LastSent>,
    mark_stands: Duration,
    /// The counters of the effects skipped before the queue, looked up once: a refusal of a
    /// busy pod skips one on nearly every request.
    skipped: Skipped,
    /// `--mode audit`: only what [`Effect::is_kept_in_audit_mode`] says goes out.
    audit_mode: bool,
}

/// The counter of each effect the outbox skips before its queue.
#[derive(Default)]
struct Skipped {
    delete_in_flight: OnceLock<Counter>,
    event_rate_limited: OnceLock<Counter>,
    mark_standing: OnceLock<Counter>,
}

impl Shared {
    /// A job the queue had no room for: a loss is reported here all the same, and the
    /// bookkeeping that would have waited for it is let go.
    fn dropped(&self, kind: &'static str, job: Job) {
        error!(kind, subject = %job.effect, "side-effect queue is full: dropped");
        if let Effect::ReportLoss { cause, audit, .. } = &job.effect {
            // A loss is never left unreported: here, at worst, by more than one replica.
            self.report_loss(cause, audit);
        }
        match &job.effect {
            Effect::DeleteIdle { pod, .. } => drop(self.deletes.lock().remove(&pod.uid)),
            Effect::MarkDisruptionWanted { pod, .. } => self.marks.lock().forget(&pod.uid),
            _ => {}
        }
        self.count(kind, EffectResult::Dropped);
        if let Some(done) = job.done {
            let _ = done.send(EffectResult::Dropped);
        }
        self.finished_one();
    }

    /// One job fewer pending; the last one wakes whoever waits in `drained`.
    fn finished_one(&self) {
        if self.pending.fetch_sub(1, SeqCst) == 1 {
            self.idle.notify_waiters();
        }
    }

    fn count(&self, kind: &'static str, result: EffectResult) {
        self.metrics.side_effects.get_or_create(&SideEffectLabels { kind, result: result.as_str() }).inc();
    }

    /// `count` of a skipped effect, through the counter `slot` (one of `skipped`'s) holds for it.
    fn count_skipped(&self, slot: &OnceLock<Counter>, kind: &'static str, result: EffectResult) {
        let labels = SideEffectLabels { kind, result: result.as_str() };
        slot.get_or_init(|| self.metrics.side_effects.get_or_create(&labels).clone()).inc();
    }

    /// A busy pod's loss, written to the audit log and the metric once it is reported.
    fn report_loss(&self, cause: &LossCause, audit: &AuditRecord) {
        if cause.is_loss() {
            self.metrics.busy_pods_lost.get_or_create(&CauseLabels { cause: cause.label() }).inc();
        } else {
            self.metrics.busy_pods_unaccounted.inc();
        }
        warn!(pod = %format!("{}/{}", audit.namespace, audit.name), cause = cause.label(), "{}", audit.detail);
        self.audit.record(audit);
    }
}

#[derive(Clone)]
pub struct Outbox {
    jobs: mpsc::Sender<Job>,
    shared: Arc<Shared>,
}

impl Outbox {
    pub fn start(
        client: Client,
        audit: Arc<AuditLog>,
        metrics: Arc<Metrics>,
        settings: OutboxSettings,
        policy: PolicyConfig,
    ) -> Outbox {
        // Every series an alert counts, at 0 from the start: `increase()` misses a first event.
        for kind in Effect::VARIANTS {
            for result in EffectResult::VARIANTS {
                drop(metrics.side_effects.get_or_create(&SideEffectLabels { kind, result }));
            }
        }
        for cause in LossCause::VARIANTS.iter().filter(|cause| **cause != LossCause::Unwatched.label()) {
            drop(metrics.busy_pods_lost.get_or_create(&CauseLabels { cause }));
        }
        let (jobs, queue) = mpsc::channel(settings.queue);
        let shared = Arc::new(Shared {
            settings,
            audit,
            metrics,
            pending: AtomicUsize::new(0),
            idle: Notify::new(),
            deletes: Mutex::default(),
            events: Mutex::new(EventLimits::new(Instant::now())),
            marks: Mutex::default(),
            mark_stands: policy.holds.renew_after().unsigned_abs(),
            skipped: Default::default(),
            audit_mode: policy.mode == Mode::Audit,
        });
        let instance = std::env::var("POD_NAME").ok().or_else(|| std::env::var("HOSTNAME").ok());
        let calls = Calls {
            client,
            instance: instance.unwrap_or_else(|| FIELD_MANAGER.into()),
            event_interval: settings.event_interval,
            policy,
        };
        let worker = Arc::new(Worker { calls, shared: shared.clone() });
        tokio::spawn(worker.run(queue));
        Outbox { jobs, shared }
    }

    /// Queues a side effect; what it returns tells when it is done. A deferred delete already in
    /// flight, an Event within the rate limit and a mark that stands are not queued again.
    pub fn send(&self, effect: Effect) -> Sent {
        let shared = &self.shared;
        let kind = effect.kind();
        if shared.audit_mode && !effect.is_kept_in_audit_mode() {
            debug!(kind, subject = %effect, "audit mode: side effect withheld");
            shared.count(kind, EffectResult::Withheld);
            return Either::Left(ready(Ok(EffectResult::Withheld)));
        }
        let skipped = match &effect {
            Effect::DeleteIdle { pod, .. } => {
                let in_flight = !shared.deletes.lock().insert(pod.uid.clone());
                in_flight.then_some((&shared.skipped.delete_in_flight, EffectResult::Moot))
            }
            Effect::Event { pod, .. } => self
                .event_rate_limited(&pod.uid)
                .then_some((&shared.skipped.event_rate_limited, EffectResult::RateLimited)),
            Effect::MarkDisruptionWanted { pod, .. } => {
                self.mark_standing(&pod.uid).then_some((&shared.skipped.mark_standing, EffectResult::RateLimited))
            }
            _ => None,
        };
        if let Some((slot, result)) = skipped {
            shared.count_skipped(slot, kind, result);
            return Either::Left(ready(Ok(result)));
        }
        let (done, receiver) = oneshot::channel();
        shared.pending.fetch_add(1, SeqCst);
        if let Err(e) = self.jobs.try_send(Job { effect, done: Some(done) }) {
            let (mpsc::error::TrySendError::Full(job) | mpsc::error::TrySendError::Closed(job)) = e;
            shared.dropped(kind, job);
        }
        Either::Right(receiver)
    }

    /// Waits (at most `within`) until every queued side effect is carried out or given up:
    /// on shutdown, a mark promised to a person, or a loss to report, is not dropped.
    pub async fn drained(&self, within: Duration) -> bool {
        let none_pending = async {
            loop {
                // Registered before the count is read: a last job finishing in between wakes it.
                let idle = self.shared.idle.notified();
                if self.shared.pending.load(SeqCst) == 0 {
                    return;
                }
                idle.await;
            }
        };
        tokio::time::timeout(within, none_pending).await.is_ok()
    }

    /// The pod is gone from the cluster: nothing about it needs remembering.
    pub fn forget(&self, uid: &str) {
        self.shared.deletes.lock().remove(uid);
        self.shared.events.lock().last.forget(uid);
        self.shared.marks.lock().forget(uid);
    }

    /// Whether the pod's refused-eviction mark was sent within the time it stands: a burst of
    /// refusals (a drain, Karpenter and the descheduler at once, or one retrying faster than the
    /// watch brings the mark back) writes it once.
    fn mark_standing(&self, uid: &str) -> bool {
        let now = Instant::now();
        let mut marks = self.shared.marks.lock();
        if marks.within(uid, self.shared.mark_stands, now) {
            return true;
        }
        marks.sent(uid, now);
        false
    }

    /// One Event per pod per interval, and a few a second in all: Events go to etcd, and no
    /// burst of refusals should flood it.
    fn event_rate_limited(&self, uid: &str) -> bool {
        let interval = self.shared.settings.event_interval;
        !self.shared.events.lock().admit(uid, interval, Instant::now())
    }
}

struct Worker {
    calls: Calls,
    shared: Arc<Shared>,
}

impl Worker {
    async fn run(self: Arc<Self>, mut queue: mpsc::Receiver<Job>) {
        let slots = Arc::new(Semaphore::new(self.shared.settings.concurrency));
        while let Some(job) = queue.recv().await {
            let Ok(slot) = slots.clone().acquire_owned().await else { return };
            let worker = self.clone();
            tokio::spawn(async move {
                let shared = &worker.shared;
                let kind = job.effect.kind();
                let result = worker.carry_out(&job.effect).await;
                match &job.effect {
                    Effect::DeleteIdle { pod, .. } if result != EffectResult::Ok => {
                        // Not carried out: the next change of the pod may try again.
                        shared.deletes.lock().remove(&pod.uid);
                    }
                    // Not written: the next refusal writes it.
                    Effect::MarkDisruptionWanted { pod, .. } if result != EffectResult::Ok => {
                        shared.marks.lock().forget(&pod.uid);
                    }
                    // The API server could not take the Event: report the loss here all the same.
                    Effect::ReportLoss { cause, audit, .. } if result == EffectResult::Failed => {
                        shared.report_loss(cause, audit);
                    }
                    _ => {}
                }
                shared.count(kind, result);
                if let Some(done) = job.done {
                    let _ = done.send(result);
                }
                shared.finished_one();
                drop(slot);
            });
        }
    }

    async fn carry_out(&self, effect: &Effect) -> EffectResult {
        let OutboxSettings { attempts, call_timeout, .. } = self.shared.settings;
        let mut pause = Duration::from_millis(200);
        for attempt in 1..=attempts {
            let outcome = match tokio::time::timeout(call_timeout, self.attempt(effect)).await {
                Ok(outcome) => outcome,
                Err(_) => Attempt::Retry(format!("no answer within {call_timeout:?}")),
            };
            match outcome {
                Attempt::Done(done) => {
                    debug!(kind = effect.kind(), subject = %effect, result = done.as_str(), "side effect done");
                    return done;
                }
                Attempt::Fail(why) => {
                    error!(kind = effect.kind(), subject = %effect, error = %why, "side effect failed");
                    return EffectResult::Failed;
                }
                Attempt::Retry(why) if attempt < attempts => {
                    warn!(kind = effect.kind(), subject = %effect, attempt, error = %why, "side effect will be retried");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(5));
                }
                Attempt::Retry(why) => {
                    error!(kind = effect.kind(), subject = %effect, attempts = attempt, error = %why, "side effect failed: giving up");
                }
            }
        }
        EffectResult::Failed
    }

    async fn attempt(&self, effect: &Effect) -> Attempt {
        let effect = match self.calls.confirm(effect).await {
            Ok(Confirmed::Due(effect)) => effect,
            Ok(Confirmed::NoLongerDue(why)) => {
                info!(subject = %effect, %why, "side effect no longer due");
                return Attempt::Done(EffectResult::Moot);
            }
            Err(e) => return classify(e),
        };
        let effect = effect.as_ref();
        match self.calls.call(effect).await {
            Ok(()) => {
                self.after(effect);
                Attempt::Done(EffectResult::Ok)
            }
            Err(kube::Error::Api(status)) if moot(effect, &status) => Attempt::Done(EffectResult::Moot),
            Err(e) => classify(e),
        }
    }

    /// What follows an effect carried out: the deferred delete's audit line, the loss reported.
    fn after(&self, effect: &Effect) {
        match effect {
            Effect::DeleteIdle { pod, request, audit, .. } => {
                info!(%pod, requested_by = %request.by, "deferred delete carried out");
                self.shared.audit.record(&AuditRecord { time: Timestamp::now(), ..(**audit).clone() });
            }
            Effect::ReportLoss { cause, audit, .. } => self.shared.report_loss(cause, audit),
            _ => {}
        }
    }
}
