//! The busy contract: is this pod protected right now, and why (not)?

use jiff::{SignedDuration, Timestamp};

use super::keys::{BUSY_LABEL, BUSY_SINCE, INTERRUPTED, MAX_BUSY, WHEN_UNREADY};
use super::pod::{Phase, PodFacts, Readiness};
use crate::duration::{parse_positive_duration, parse_time};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusyState {
    /// No busy label: busyguard leaves the pod alone.
    NotOptedIn,
    Idle,
    /// Protected. `since` is unknown only when busyguard missed the flip to busy (it was down)
    /// or the recorded time is in the future; max-busy then counts from the pod's creation.
    Busy {
        since: Option<Timestamp>,
        until: Option<Timestamp>,
    },
    /// Marked busy, but the protection no longer holds.
    Lapsed {
        since: Timestamp,
        lapse: Lapse,
    },
    /// Already being deleted: the remaining deletes only finish the job.
    Terminating,
    /// Succeeded or Failed: nothing left to protect.
    Terminal,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lapse {
    /// Busy for longer than max-busy allows.
    MaxBusy { limit: SignedDuration },
    /// A container restarted after the pod turned busy: the task that set the flag is gone.
    Restarted { at: Timestamp },
    /// Its node's spot instance is being reclaimed ([`INTERRUPTED`]): the task ends with it, and
    /// is better given its SIGTERM now than none when the instance goes.
    Interrupted,
}

impl BusyState {
    pub fn is_protected(&self) -> bool {
        matches!(self, BusyState::Busy { .. })
    }
}

/// How long protection lasts: the pod's own `busyguard.io/max-busy` (never below the floor) or
/// else the default, never past the ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxBusy {
    pub default: SignedDuration,
    /// `--max-busy-ceiling`: no pod is protected longer, whatever its annotation says.
    pub ceiling: Option<SignedDuration>,
    /// `--min-max-busy`: no pod's own annotation protects it for less. Whoever may annotate a
    /// pod could otherwise end its next task's protection within a second.
    pub floor: SignedDuration,
}

/// The floor under a pod's own max-busy unless configured otherwise.
pub const DEFAULT_MAX_BUSY_FLOOR: SignedDuration = SignedDuration::from_mins(1);

impl MaxBusy {
    pub const fn new(default: SignedDuration) -> Self {
        MaxBusy { default, ceiling: None, floor: DEFAULT_MAX_BUSY_FLOOR }
    }

    pub fn of(&self, pod: &(impl PodFacts + ?Sized)) -> SignedDuration {
        let limit = max_busy(pod).map_or(self.default, |own| own.max(self.floor));
        self.ceiling.map_or(limit, |ceiling| limit.min(ceiling))
    }

    /// The pod's own max-busy, when it is below the floor.
    pub fn below_floor(&self, pod: &(impl PodFacts + ?Sized)) -> Option<SignedDuration> {
        max_busy(pod).filter(|own| *own < self.floor)
    }
}

pub fn busy_state(pod: &(impl PodFacts + ?Sized), max_busy: MaxBusy, now: Timestamp) -> BusyState {
    let Some(label) = pod.label(BUSY_LABEL) else {
        return BusyState::NotOptedIn;
    };
    if pod.is_terminating() {
        return BusyState::Terminating;
    }
    if pod.is_terminal() {
        return BusyState::Terminal;
    }
    // Not started (unschedulable, pulling its image, in its init containers): no task runs yet,
    // and the API server itself lets a Pending pod's eviction past every PodDisruptionBudget.
    // Or a run-to-completion pod's task has ended, its sidecars running on.
    if pod.not_started() || pod.task_ended() {
        return BusyState::Idle;
    }
    let since = if label == "true" {
        busy_since(pod)
    } else {
        match unready_since(pod) {
            Some(since) => since,
            None => return BusyState::Idle,
        }
    };
    // A time to come is no time at all: it would hold the pod past any max-busy.
    busy_from(pod, since.filter(|since| *since <= now), max_busy, now)
}

/// A pod busy since `since` (`None`: unknown), protected or lapsed.
pub fn busy_from(
    pod: &(impl PodFacts + ?Sized),
    since: Option<Timestamp>,
    max_busy: MaxBusy,
    now: Timestamp,
) -> BusyState {
    // A run-to-completion pod busy from its creation (busyguard makes it so where its namespace
    // says) is its task: a restart is the task's retry (restartPolicy OnFailure), still
    // protected within max-busy. A flag busyguard writes for the pod's owner or leader is theirs,
    // not the pod's (an Agones SDK sidecar's restart ends no match). Any other flag from before a
    // restart is stale, a Job's work-queue worker's own flag too: its task died with it.
    if pod.annotation(INTERRUPTED).is_some() {
        let since = since.or_else(|| pod.created()).unwrap_or(now);
        return BusyState::Lapsed { since, lapse: Lapse::Interrupted };
    }
    if let Some(since) = since
        && !busy_from_creation(pod, since)
        && !pod.busy_label_by_busyguard()
        && let Some(at) = pod.last_restart().filter(|at| *at > since)
    {
        return BusyState::Lapsed { since, lapse: Lapse::Restarted { at } };
    }
    protection(since, pod.created(), max_busy.of(pod), now)
}

/// Whether `pod` runs to completion and has been busy since its creation (`since` within a
/// moment of it: busyguard's admission clock against the API server's, to the second), so its
/// whole run is its task, rather than a worker that flipped its own flag for one task later.
fn busy_from_creation(pod: &(impl PodFacts + ?Sized), since: Timestamp) -> bool {
    const CREATION_SLACK: SignedDuration = SignedDuration::from_secs(2);
    let within = |created: Timestamp| created.checked_add(CREATION_SLACK).is_ok_and(|latest| since <= latest);
    pod.runs_to_completion().is_some() && pod.created().is_some_and(within)
}

/// Busy since `since`: protected until max-busy runs out. Without a known `since`, max-busy
/// counts from the pod's creation, the earliest it can have turned busy.
fn protection(
    since: Option<Timestamp>,
    created: Option<Timestamp>,
    limit: SignedDuration,
    now: Timestamp,
) -> BusyState {
    let Some(start) = since.or(created) else {
        return BusyState::Busy { since: None, until: None };
    };
    let until = start.checked_add(limit).ok();
    if until.is_some_and(|until| now >= until) {
        return BusyState::Lapsed { since: start, lapse: Lapse::MaxBusy { limit } };
    }
    BusyState::Busy { since, until }
}

/// In compatibility mode, a Running pod that is not Ready is busy since it stopped being Ready;
/// one that has not been Ready since it started has taken no task (still starting, or a probe
/// that never passes, as in a rollout being rolled back) and is not busy, nor is one held back
/// by its readiness gates alone (its probe passes: OpenKruise's in-place update gates it).
fn unready_since(pod: &(impl PodFacts + ?Sized)) -> Option<Option<Timestamp>> {
    if pod.label(BUSY_LABEL) != Some(WHEN_UNREADY) || pod.phase() != Phase::Running {
        return None;
    }
    match pod.readiness() {
        Some(Readiness { ready: false, since, gated: false }) if !never_ready(since, pod.started()) => Some(since),
        _ => None,
    }
}

/// Whether a pod NotReady since `since` has never been Ready since it started: the kubelet sets
/// the condition NotReady in the status that starts the pod (the same second), and turning Ready
/// then NotReady again takes two probe results at least a second apart (`periodSeconds` is 1 or
/// more), so a later second. Where the two fall either side of a second, the pod counts as busy.
fn never_ready(since: Option<Timestamp>, started: Option<Timestamp>) -> bool {
    match (since, started) {
        (Some(since), Some(started)) => since <= started,
        _ => false,
    }
}

pub fn busy_since(pod: &(impl PodFacts + ?Sized)) -> Option<Timestamp> {
    parse_time(pod.annotation(BUSY_SINCE)?).ok()
}

/// The pod's own max-busy, when it is a positive duration such as `2h` or `90m`.
pub fn max_busy(pod: &(impl PodFacts + ?Sized)) -> Option<SignedDuration> {
    parse_positive_duration(pod.annotation(MAX_BUSY)?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::pod::Pod;
    use crate::policy::testing::*;
    use serde_json::{Value, json};

    const HOUR: MaxBusy = MaxBusy::new(SignedDuration::from_hours(1));

    fn busy_pod(since: &str) -> Pod {
        pod(json!({"metadata": {"labels": {BUSY_LABEL: "true"}, "annotations": {BUSY_SINCE: since}},
                   "status": {"phase": "Running"}}))
    }

    #[test]
    fn pod_without_the_label_is_not_opted_in() {
        let p = pod(json!({"metadata": {"labels": {"app": "worker"}}}));
        assert_eq!(busy_state(&p, HOUR, ts("2026-01-01T00:00:00Z")), BusyState::NotOptedIn);
    }

    #[test]
    fn label_false_is_idle() {
        let p = pod(json!({"metadata": {"labels": {BUSY_LABEL: "false"}}}));
        assert_eq!(busy_state(&p, HOUR, ts("2026-01-01T00:00:00Z")), BusyState::Idle);
    }

    #[test]
    fn label_values_other_than_true_are_idle() {
        let p = pod(json!({"metadata": {"labels": {BUSY_LABEL: "yes"}}}));
        assert_eq!(busy_state(&p, HOUR, ts("2026-01-01T00:00:00Z")), BusyState::Idle);
    }

    #[test]
    fn busy_pod_is_protected_until_max_busy_runs_out() {
        let p = busy_pod("2026-01-01T00:00:00Z");
        let state = busy_state(&p, HOUR, ts("2026-01-01T00:59:59Z"));
        assert_eq!(
            state,
            BusyState::Busy { since: Some(ts("2026-01-01T00:00:00Z")), until: Some(ts("2026-01-01T01:00:00Z")) }
        );
        assert!(state.is_protected());
    }

    #[test]
    fn busy_pod_lapses_at_the_default_max_busy() {
        let p = busy_pod("2026-01-01T00:00:00Z");
        assert_eq!(
            busy_state(&p, HOUR, ts("2026-01-01T01:00:00Z")),
            BusyState::Lapsed { since: ts("2026-01-01T00:00:00Z"), lapse: Lapse::MaxBusy { limit: HOUR.default } }
        );
    }

    #[test]
    fn per_pod_max_busy_overrides_the_default_both_ways() {
        let mut p = busy_pod("2026-01-01T00:00:00Z");
        p.metadata.annotations.as_mut().unwrap().insert(MAX_BUSY.into(), "3h".into());
        assert!(busy_state(&p, HOUR, ts("2026-01-01T02:00:00Z")).is_protected());
        p.metadata.annotations.as_mut().unwrap().insert(MAX_BUSY.into(), "10m".into());
        assert_eq!(
            busy_state(&p, HOUR, ts("2026-01-01T00:10:00Z")),
            BusyState::Lapsed {
                since: ts("2026-01-01T00:00:00Z"),
                lapse: Lapse::MaxBusy { limit: SignedDuration::from_mins(10) }
            }
        );
    }

    #[test]
    fn the_ceiling_cuts_a_pods_own_longer_max_busy() {
        let ceiling = MaxBusy { ceiling: Some(SignedDuration::from_hours(2)), ..HOUR };
        let mut p = busy_pod("2026-01-01T00:00:00Z");
        p.metadata.annotations.as_mut().unwrap().insert(MAX_BUSY.into(), "72h".into());
        assert!(busy_state(&p, ceiling, ts("2026-01-01T01:59:59Z")).is_protected());
        assert_eq!(
            busy_state(&p, ceiling, ts("2026-01-01T02:00:00Z")),
            BusyState::Lapsed {
                since: ts("2026-01-01T00:00:00Z"),
                lapse: Lapse::MaxBusy { limit: SignedDuration::from_hours(2) }
            }
        );
        // Shorter than the ceiling: the pod's own value stands.
        p.metadata.annotations.as_mut().unwrap().insert(MAX_BUSY.into(), "90m".into());
        assert!(!busy_state(&p, ceiling, ts("2026-01-01T01:30:00Z")).is_protected());
    }

    #[test]
    fn invalid_max_busy_falls_back_to_the_default() {
        for bad in ["forever", "-5m", "0s"] {
            let mut p = busy_pod("2026-01-01T00:00:00Z");
            p.metadata.annotations.as_mut().unwrap().insert(MAX_BUSY.into(), bad.into());
            assert!(!busy_state(&p, HOUR, ts("2026-01-01T01:00:00Z")).is_protected(), "{bad}");
        }
    }

    #[test]
    fn busy_flag_older_than_a_container_restart_is_stale() {
        let p = pod(json!({
            "metadata": {"labels": {BUSY_LABEL: "true"}, "annotations": {BUSY_SINCE: "2026-01-01T00:00:00Z"}},
            "status": {"phase": "Running", "containerStatuses": [{"restartCount": 1,
                "state": {"running": {"startedAt": "2026-01-01T00:05:00Z"}}}]}}));
        assert_eq!(
            busy_state(&p, HOUR, ts("2026-01-01T00:06:00Z")),
            BusyState::Lapsed {
                since: ts("2026-01-01T00:00:00Z"),
                lapse: Lapse::Restarted { at: ts("2026-01-01T00:05:00Z") }
            }
        );
    }

    #[test]
    fn a_flag_busyguard_writes_for_the_owner_outlives_a_restart_of_a_container() {
        // An Allocated game server whose SDK sidecar restarted: its flag is its GameServer's.
        let p = pod(json!({
            "metadata": {"labels": {BUSY_LABEL: "true"}, "annotations": {BUSY_SINCE: "2026-01-01T00:00:00Z"},
                "managedFields": [{"manager": "busyguard", "operation": "Update", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {"f:busyguard.io/busy": {}}}}}]},
            "status": {"phase": "Running", "containerStatuses": [{"name": "agones-gameserver-sidecar",
                "restartCount": 1, "state": {"running": {"startedAt": "2026-01-01T00:05:00Z"}}}]}}));
        assert!(p.busy_label_by_busyguard());
        assert_eq!(
            busy_state(&p, HOUR, ts("2026-01-01T00:06:00Z")),
            BusyState::Busy { since: Some(ts("2026-01-01T00:00:00Z")), until: Some(ts("2026-01-01T01:00:00Z")) }
        );
    }

    #[test]
    fn a_run_to_completion_pods_retry_after_a_restart_stays_protected_within_max_busy() {
        // Busy from its creation, as busyguard makes a Job's pod where its namespace says.
        let p = pod(json!({
            "metadata": {"labels": {BUSY_LABEL: "true", "batch.kubernetes.io/job-name": "import"},
                "creationTimestamp": "2026-01-01T00:00:01Z", "annotations": {BUSY_SINCE: "2026-01-01T00:00:00Z"}},
            "status": {"phase": "Running", "containerStatuses": [{"restartCount": 1,
                "state": {"running": {"startedAt": "2026-01-01T00:05:00Z"}}}]}}));
        assert!(busy_state(&p, HOUR, ts("2026-01-01T00:06:00Z")).is_protected());
        assert!(!busy_state(&p, HOUR, ts("2026-01-01T01:00:00Z")).is_protected(), "max-busy still bounds it");
    }

    #[test]
    fn a_job_work_queue_workers_own_flag_is_stale_after_it_crashed_mid_task() {
        // Opted in idle by its template, busy from its own flip minutes later; then it crashed
        // and restarted (restartPolicy OnFailure): the task that set the flag is gone.
        let p = pod(json!({
            "metadata": {"labels": {BUSY_LABEL: "true", "batch.kubernetes.io/job-name": "queue"},
                "creationTimestamp": "2026-01-01T00:00:00Z", "annotations": {BUSY_SINCE: "2026-01-01T00:03:00Z"}},
            "status": {"phase": "Running", "containerStatuses": [{"restartCount": 1,
                "state": {"running": {"startedAt": "2026-01-01T00:05:00Z"}}}]}}));
        let restarted = ts("2026-01-01T00:05:00Z");
        assert_eq!(
            busy_state(&p, HOUR, ts("2026-01-01T00:06:00Z")),
            BusyState::Lapsed { since: ts("2026-01-01T00:03:00Z"), lapse: Lapse::Restarted { at: restarted } }
        );
    }

    #[test]
    fn a_pod_not_started_yet_is_not_protected() {
        let mut unscheduled = busy_pod("2026-01-01T00:00:00Z");
        unscheduled.status.phase = Some("Pending".into());
        assert_eq!(busy_state(&unscheduled, HOUR, ts("2026-01-01T00:01:00Z")), BusyState::Idle);
        let pulling = pod(json!({
            "metadata": {"labels": {BUSY_LABEL: "true"}, "annotations": {BUSY_SINCE: "2026-01-01T00:00:00Z"}},
            "spec": {"nodeName": "n1"},
            "status": {"phase": "Pending", "containerStatuses": [{"name": "worker", "restartCount": 0,
                "state": {"waiting": {"reason": "ContainerCreating"}}}]}}));
        assert_eq!(busy_state(&pulling, HOUR, ts("2026-01-01T00:01:00Z")), BusyState::Idle);
    }

    fn run_to_completion(owner: (&str, &str), restart_policy: &str, containers: Value) -> Pod {
        pod(json!({
            "metadata": {"labels": {BUSY_LABEL: "true", owner.0: owner.1}, "annotations": {BUSY_SINCE: "2026-01-01T00:00:00Z"}},
            "spec": {"nodeName": "n1", "restartPolicy": restart_policy},
            "status": {"phase": "Running", "containerStatuses": containers}}))
    }

    fn ran(name: &str) -> Value {
        json!({"name": name, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}})
    }

    fn exited(name: &str, code: i32) -> Value {
        json!({"name": name, "state": {"terminated": {"exitCode": code, "finishedAt": "2026-01-01T00:10:00Z"}}})
    }

    #[test]
    fn a_readiness_mode_pod_not_ready_for_its_readiness_gates_alone_is_not_busy() {
        let gated = |reason: &str| {
            pod(json!({"metadata": {"labels": {BUSY_LABEL: WHEN_UNREADY}},
                "status": {"phase": "Running", "startTime": "2026-01-01T00:00:00Z", "conditions": [{"type": "Ready",
                    "status": "False", "reason": reason, "lastTransitionTime": "2026-01-01T00:05:00Z"}]}}))
        };
        let at = ts("2026-01-01T00:06:00Z");
        assert_eq!(busy_state(&gated("ReadinessGatesNotReady"), HOUR, at), BusyState::Idle, "OpenKruise updating it");
        assert!(busy_state(&gated("ContainersNotReady"), HOUR, at).is_protected(), "its own probe says busy");
    }

    #[test]
    fn a_run_to_completion_pod_is_free_once_its_task_has_ended_though_its_sidecars_run_on() {
        let at = ts("2026-01-01T00:11:00Z");
        let tekton = ("tekton.dev/taskRun", "build");
        let steps_done = run_to_completion(tekton, "Never", json!([exited("step-build", 0), ran("sidecar-db")]));
        assert_eq!(busy_state(&steps_done, HOUR, at), BusyState::Idle);
        let step_failed = run_to_completion(tekton, "Never", json!([exited("step-build", 1), ran("sidecar-db")]));
        assert_eq!(busy_state(&step_failed, HOUR, at), BusyState::Idle, "a failed step ends the task too");
        let a_step_left =
            run_to_completion(tekton, "Never", json!([exited("step-a", 0), ran("step-b"), ran("sidecar-db")]));
        assert!(busy_state(&a_step_left, HOUR, at).is_protected());
        let argo = ("workflows.argoproj.io/workflow", "wf");
        let saving = run_to_completion(argo, "Never", json!([exited("main", 0), ran("wait")]));
        assert!(busy_state(&saving, HOUR, at).is_protected(), "Argo's wait still saves the outputs of main");
        let saved = run_to_completion(argo, "Never", json!([exited("main", 0), exited("wait", 0)]));
        assert_eq!(busy_state(&saved, HOUR, at), BusyState::Idle);
    }

    #[test]
    fn a_task_to_be_retried_or_a_service_that_exited_stays_protected() {
        let at = ts("2026-01-01T00:11:00Z");
        let retried =
            run_to_completion(("batch.kubernetes.io/job-name", "import"), "OnFailure", json!([exited("main", 1)]));
        assert!(busy_state(&retried, HOUR, at).is_protected(), "OnFailure restarts it");
        let service = pod(json!({
            "metadata": {"labels": {BUSY_LABEL: "true"}, "annotations": {BUSY_SINCE: "2026-01-01T00:00:00Z"}},
            "spec": {"nodeName": "n1", "restartPolicy": "Never"},
            "status": {"phase": "Running", "containerStatuses": [exited("worker", 0), ran("proxy")]}}));
        assert!(busy_state(&service, HOUR, at).is_protected(), "only a run-to-completion pod's task ends so");
    }

    /// The scheduler of Kubernetes 1.28.4 to 1.31.0 writes its preemptor's status over its
    /// victim's (kubernetes#126644) before the delete busyguard is asked about.
    #[test]
    fn a_running_pod_whose_status_a_preemption_overwrote_stays_protected() {
        let victim = pod(json!({
            "metadata": {"labels": {BUSY_LABEL: "true"}, "annotations": {BUSY_SINCE: "2026-01-01T00:00:00Z"}},
            "spec": {"nodeName": "n1"},
            "status": {"phase": "Pending", "qosClass": "Burstable", "conditions": [{"type": "DisruptionTarget",
                "status": "True", "reason": "PreemptionByScheduler"}]}}));
        assert!(busy_state(&victim, HOUR, ts("2026-01-01T00:01:00Z")).is_protected());
        let restarting = pod(json!({
            "metadata": {"labels": {BUSY_LABEL: "true"}, "annotations": {BUSY_SINCE: "2026-01-01T00:00:00Z"}},
            "spec": {"nodeName": "n1"},
            "status": {"phase": "Pending", "containerStatuses": [{"name": "worker", "restartCount": 1,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}}));
        assert!(busy_state(&restarting, HOUR, ts("2026-01-01T00:01:00Z")).is_protected(), "it ran before");
    }

    #[test]
    fn busy_flag_set_after_the_last_restart_holds() {
        let p = pod(json!({
            "metadata": {"labels": {BUSY_LABEL: "true"}, "annotations": {BUSY_SINCE: "2026-01-01T00:05:00Z"}},
            "status": {"phase": "Running", "containerStatuses": [{"restartCount": 1,
                "state": {"running": {"startedAt": "2026-01-01T00:05:00Z"}}}]}}));
        assert!(busy_state(&p, HOUR, ts("2026-01-01T00:06:00Z")).is_protected());
    }

    #[test]
    fn terminal_and_terminating_pods_are_never_protected() {
        let mut done = busy_pod("2026-01-01T00:00:00Z");
        done.status.phase = Some("Succeeded".into());
        assert_eq!(busy_state(&done, HOUR, ts("2026-01-01T00:01:00Z")), BusyState::Terminal);

        let mut going = busy_pod("2026-01-01T00:00:00Z");
        going.metadata.deletion_timestamp = Some(ts("2026-01-01T00:00:30Z"));
        assert_eq!(busy_state(&going, HOUR, ts("2026-01-01T00:01:00Z")), BusyState::Terminating);
    }

    #[test]
    fn busy_without_busy_since_is_protected_for_max_busy_from_the_pods_creation() {
        let p = pod(json!({"metadata": {"labels": {BUSY_LABEL: "true"}, "creationTimestamp": "2026-01-01T00:00:00Z"}}));
        assert_eq!(
            busy_state(&p, HOUR, ts("2026-01-01T00:30:00Z")),
            BusyState::Busy { since: None, until: Some(ts("2026-01-01T01:00:00Z")) }
        );
        assert_eq!(
            busy_state(&p, HOUR, ts("2026-01-01T01:00:00Z")),
            BusyState::Lapsed { since: ts("2026-01-01T00:00:00Z"), lapse: Lapse::MaxBusy { limit: HOUR.default } }
        );
    }

    #[test]
    fn a_busy_since_in_the_future_does_not_stretch_protection() {
        for future in ["2099-01-01T00:00:00Z", "9999-12-31T00:00:00Z"] {
            let p =
                pod(json!({"metadata": {"labels": {BUSY_LABEL: "true"}, "creationTimestamp": "2026-01-01T00:00:00Z",
                "annotations": {BUSY_SINCE: future}}}));
            assert!(busy_state(&p, HOUR, ts("2026-01-01T00:30:00Z")).is_protected(), "{future}");
            assert!(
                matches!(busy_state(&p, HOUR, ts("2026-01-01T01:00:00Z")), BusyState::Lapsed { .. }),
                "{future}: max-busy counts from the pod's creation"
            );
        }
    }

    fn compat_pod(ready: &str, phase: &str) -> Pod {
        pod(json!({
            "metadata": {"labels": {BUSY_LABEL: WHEN_UNREADY}},
            "status": {"phase": phase, "conditions": [
                {"type": "Ready", "status": ready, "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}))
    }

    #[test]
    fn busy_when_unready_makes_a_running_unready_pod_busy_since_it_turned_unready() {
        assert_eq!(
            busy_state(&compat_pod("False", "Running"), HOUR, ts("2026-01-01T00:30:00Z")),
            BusyState::Busy { since: Some(ts("2026-01-01T00:00:00Z")), until: Some(ts("2026-01-01T01:00:00Z")) }
        );
        assert_eq!(
            busy_state(&compat_pod("False", "Running"), HOUR, ts("2026-01-01T01:00:00Z")),
            BusyState::Lapsed { since: ts("2026-01-01T00:00:00Z"), lapse: Lapse::MaxBusy { limit: HOUR.default } }
        );
    }

    #[test]
    fn busy_when_unready_lapses_when_a_container_restarts_after_it_turned_unready() {
        // CrashLoopBackOff: unready since the first crash, restarted since. Not a task at work.
        let mut crashing = compat_pod("False", "Running");
        crashing.status.container_statuses = serde_json::from_value(json!([{"name": "app", "restartCount": 4,
            "state": {"running": {"startedAt": "2026-01-01T00:05:00Z"}}}]))
        .unwrap();
        assert_eq!(
            busy_state(&crashing, HOUR, ts("2026-01-01T00:06:00Z")),
            BusyState::Lapsed {
                since: ts("2026-01-01T00:00:00Z"),
                lapse: Lapse::Restarted { at: ts("2026-01-01T00:05:00Z") }
            }
        );
    }

    #[test]
    fn busy_when_unready_leaves_a_pod_never_ready_since_it_started_idle() {
        let now = ts("2026-01-01T00:30:00Z");
        let started = |at: &str| {
            let mut pod = compat_pod("False", "Running");
            pod.status.start_time = Some(ts(at));
            pod
        };
        // NotReady since 00:00:00, as the kubelet set it when it started the pod.
        assert_eq!(busy_state(&started("2026-01-01T00:00:00Z"), HOUR, now), BusyState::Idle, "never Ready");
        assert!(busy_state(&started("2025-12-31T23:59:59Z"), HOUR, now).is_protected(), "Ready, then not");
    }

    #[test]
    fn busy_when_unready_leaves_ready_and_pending_pods_idle() {
        let now = ts("2026-01-01T00:30:00Z");
        assert_eq!(busy_state(&compat_pod("True", "Running"), HOUR, now), BusyState::Idle);
        assert_eq!(busy_state(&compat_pod("False", "Pending"), HOUR, now), BusyState::Idle);
        let mut labelled_idle = compat_pod("False", "Running");
        labelled_idle.metadata.labels.insert(BUSY_LABEL.into(), "false".into());
        assert_eq!(busy_state(&labelled_idle, HOUR, now), BusyState::Idle);
    }
}
