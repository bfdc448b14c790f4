//! The names busyguard reads and writes on pods: every label and annotation of the contract,
//! the other projects' annotations it manages, and the delete-requested mark's value; and the
//! namespaces' labels and the names on the objects it keeps. A leaf:
//! it imports nothing of policy, so every other file may import it.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// The label a pod opts in with; `"true"` while it works on a task, `"false"` when idle, or
/// [`WHEN_UNREADY`] when readiness says it.
pub const BUSY_LABEL: &str = "busyguard.io/busy";

/// Compatibility mode, as the busy label's value: a Running pod that is not Ready counts as busy.
/// A label, not an annotation, so that the API server can tell these pods from idle ones and
/// call busyguard for their deletes only.
pub const WHEN_UNREADY: &str = "when-unready";

/// Written by busyguard when the pod turns busy (RFC 3339, seconds).
pub const BUSY_SINCE: &str = "busyguard.io/busy-since";

/// Written by busyguard on a busy pod whose node's NodeClaim Karpenter deleted for its cloud's
/// interruption of a spot instance: the NodeClaim's name. The pod is no longer protected
/// (`Lapse::Interrupted`): its `karpenter.sh/do-not-disrupt` comes off and Karpenter's drain
/// evicts it, so its task gets its SIGTERM within the notice instead of none when the instance
/// goes. Taken off when the pod turns idle.
pub const INTERRUPTED: &str = "busyguard.io/interrupted";

/// Per-pod bound on protection, e.g. `"2h"`; the `--max-busy` default applies without it.
pub const MAX_BUSY: &str = "busyguard.io/max-busy";

/// Per workload (a label of the pod template): at most this many of its pods unavailable (not
/// Ready, or going) at once; a delete or eviction beyond is refused. For workloads a
/// PodDisruptionBudget cannot cover: DaemonSets, and direct deletes. A label, so that the API
/// server sends busyguard the deletes of idle pods that carry one and no others.
pub const MAX_UNAVAILABLE: &str = "busyguard.io/max-unavailable";

/// The container that runs the task: only its restarts make a busy flag stale (a sidecar's do
/// not). Without it, the container of the first other annotation of [`TASK_CONTAINER_NAMED_BY`],
/// else any container's restart does.
pub const TASK_CONTAINER: &str = "busyguard.io/task-container";

/// The annotations that name a pod's task container, the first one set wins: busyguard's own,
/// kubectl's default container, Agones' game container.
pub const TASK_CONTAINER_NAMED_BY: [&str; 3] = [TASK_CONTAINER, DEFAULT_CONTAINER, AGONES_CONTAINER];

/// Agones' annotation on a game server's pod naming the container that runs the game
/// (`GameServerContainerAnnotation`, from the GameServer's `spec.container`).
pub const AGONES_CONTAINER: &str = "agones.dev/container";

/// kubectl's annotation for a pod's main container (`kubectl logs` and `exec` pick it): the task
/// container when `busyguard.io/task-container` is not set.
pub const DEFAULT_CONTAINER: &str = "kubectl.kubernetes.io/default-container";

/// Karpenter's label on a NodeClaim (and its node) naming its capacity type: `spot`,
/// `on-demand`, `reserved`.
pub const KARPENTER_CAPACITY_TYPE: &str = "karpenter.sh/capacity-type";

/// The ReplicaSet controller deletes pods of lower cost first.
pub const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// Where the user's own value of each guarded annotation waits while the pod is busy.
/// Absent while busy means the user had none.
pub const IDLE_COST: &str = "busyguard.io/idle-cost";

/// The user's own `karpenter.sh/do-not-disrupt`, kept while busy.
pub const IDLE_DO_NOT_DISRUPT: &str = "busyguard.io/idle-do-not-disrupt";

/// The user's own `cluster-autoscaler.kubernetes.io/safe-to-evict`, kept while busy.
pub const IDLE_SAFE_TO_EVICT: &str = "busyguard.io/idle-safe-to-evict";

/// Karpenter neither evicts the pod nor consolidates its node.
pub const KARPENTER_DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";

/// `"false"`: cluster-autoscaler does not take the pod's node away.
pub const AUTOSCALER_SAFE_TO_EVICT: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";

/// Set on a pod while busyguard protects it (`"true"`), taken off when it is idle or its
/// protection lapsed: what the busy-pod PodDisruptionBudget selects, so that it too lets a pod go
/// at max-busy.
pub const PROTECTED_LABEL: &str = "busyguard.io/protected";

/// Where a released pod's `pod-template-hash` is kept.
pub const RELEASED_FROM: &str = "busyguard.io/released-from";

/// The label by which a Deployment's ReplicaSet selects its pods.
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";

/// The label by which an Argo Rollout's ReplicaSet selects its pods.
pub const ROLLOUTS_POD_TEMPLATE_HASH: &str = "rollouts-pod-template-hash";

/// Sets whose pods each have an owner of their own, by the label their project puts on every
/// pod of the set, and the set's kind: Actions Runner Controller's scale set (a runner pod's
/// owner is its `EphemeralRunner`), Agones' Fleet (a game server pod's, its `GameServer`).
pub const SET_LABELS: [(&str, &str); 2] =
    [("actions.github.com/scale-set-name", "AutoscalingRunnerSet"), ("agones.dev/fleet", "Fleet")];

/// The labels by which run-to-completion owners mark their pods: a Job's (the Job controller,
/// Kubernetes 1.27 and later), an Argo Workflow's, a Tekton TaskRun's.
pub const JOB_NAME: &str = "batch.kubernetes.io/job-name";
pub const ARGO_WORKFLOW: &str = "workflows.argoproj.io/workflow";
pub const TEKTON_TASK_RUN: &str = "tekton.dev/taskRun";

/// The field manager busyguard writes as: the API server records it in `managedFields`.
pub const FIELD_MANAGER: &str = "busyguard";

/// The field manager of `busyguard agent`'s flips that report its app's own state (its poll):
/// the app has begun its task, so such a flip to busy is not held (refusing it would leave the
/// task unguarded, not untaken).
pub const AGENT_FIELD_MANAGER: &str = "busyguard-agent";

/// The field manager of `busyguard agent`'s flips its app asks for before a task (`POST
/// /start`): judged as any flip, so a held pod's app learns not to start.
pub const AGENT_START_FIELD_MANAGER: &str = "busyguard-agent-start";

/// Set on a busy pod whose delete was refused and deferred: busyguard deletes it once idle.
/// Both a label (`"true"`: what the API server selects the pod-marks webhook by) and an
/// annotation, whose value is JSON: `{"by":"alice","at":"2026-11-21T20:00:00Z"}`.
pub const DELETE_REQUESTED: &str = "busyguard.io/delete-requested";

/// The value of a delete-requested mark's annotation: who asked, and when; and, for an eviction
/// deferred, that it is carried out as an eviction (so PodDisruptionBudgets hold) with the grace
/// period the evictor asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteRequest {
    pub by: String,
    pub at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evict: Option<EvictAs>,
}

/// How a deferred eviction is carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EvictAs {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_period_seconds: Option<i64>,
}

impl DeleteRequest {
    /// A delete `by` asked for `at`, carried out as a delete.
    pub fn new(by: impl Into<String>, at: Timestamp) -> Self {
        DeleteRequest { by: by.into(), at, evict: None }
    }

    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).expect("two strings always serialize")
    }
}

/// Set on a busy pod whose eviction busyguard refused (value as [`DELETE_REQUESTED`]'s
/// annotation: who asked, and when), and renewed by each refused eviction: until
/// `--hold-after-eviction` after the last one, the pod is refused its next flip to busy, so it
/// goes at its next idle moment (`policy::hold`).
pub const DISRUPTION_REQUESTED: &str = "busyguard.io/disruption-requested";

/// The descheduler's "evictions in background" (its KEP-1397): a pod carrying this annotation
/// asks that an eviction of it start an evacuation rather than end it at once. busyguard answers
/// such an eviction of a busy pod with [`EVACUATION_TRIGGERED`] in its 429, marks the pod
/// [`EVICTION_IN_PROGRESS`], and deletes it once idle.
pub const REQUEST_EVICT_ONLY: &str = "descheduler.alpha.kubernetes.io/request-evict-only";

/// Set on a pod whose evacuation is under way: the descheduler counts it as going.
pub const EVICTION_IN_PROGRESS: &str = "descheduler.alpha.kubernetes.io/eviction-in-progress";

/// The words by which the descheduler tells a refusal that started an evacuation.
pub const EVACUATION_TRIGGERED: &str = "Eviction triggered evacuation";

/// Readiness mode as it was written before 0.2.0: an annotation (`"true"`), with the busy label
/// `"false"`. No longer read: such pods are idle pods whose deletes busyguard never sees, so each
/// carrier is warned about (`busyguard status`, the admission answer, a gauge).
pub const RETIRED_WHEN_UNREADY: &str = "busyguard.io/busy-when-unready";

/// Each annotation busyguard overrides while a pod is busy, and where the user's value waits.
pub const GUARDED: [(&str, &str); 3] = [
    (DELETION_COST, IDLE_COST),
    (KARPENTER_DO_NOT_DISRUPT, IDLE_DO_NOT_DISRUPT),
    (AUTOSCALER_SAFE_TO_EVICT, IDLE_SAFE_TO_EVICT),
];

/// Every annotation a decision reads; the cluster view drops all others before it stores a pod.
/// A test (`every_annotation_a_decision_reads_is_kept`) holds the decisions to this list. The
/// retired keys are read to warn about them: the workload budget as an annotation
/// ([`MAX_UNAVAILABLE`], now a label) and [`RETIRED_WHEN_UNREADY`].
pub const DECIDING_ANNOTATIONS: [&str; 17] = [
    BUSY_SINCE,
    INTERRUPTED,
    MAX_BUSY,
    TASK_CONTAINER,
    DEFAULT_CONTAINER,
    DELETE_REQUESTED,
    DELETION_COST,
    IDLE_COST,
    KARPENTER_DO_NOT_DISRUPT,
    IDLE_DO_NOT_DISRUPT,
    AUTOSCALER_SAFE_TO_EVICT,
    IDLE_SAFE_TO_EVICT,
    RETIRED_WHEN_UNREADY,
    MAX_UNAVAILABLE,
    REQUEST_EVICT_ONLY,
    DISRUPTION_REQUESTED,
    EVICTION_IN_PROGRESS,
];

// On namespaces, Leases and PodDisruptionBudgets.

/// The namespace label that opts a namespace out (`"false"`), or in (`"true"`) where only
/// labelled namespaces are guarded (`Enrolment::OptIn`).
pub const NAMESPACE_ENABLED_LABEL: &str = "busyguard.io/enabled";

/// The namespace label that says no worker there writes pods (`"false"`): the own-flag rule
/// then skips writes to its idle pods, sparing the API server the condition it evaluates on each
/// of them (see `registrations`).
pub const OWN_FLAGS_NAMESPACE_LABEL: &str = "busyguard.io/own-flags";

/// The namespace label (`"true"`) under which the pods of run-to-completion owners (Jobs, Argo
/// Workflows, Tekton TaskRuns) are busy while they run, with no label in their templates.
pub const RUN_TO_COMPLETION_NAMESPACE_LABEL: &str = "busyguard.io/run-to-completion";

/// The namespace label (`"true"`) under which Kueue's preemption of a Job's Workload waits for
/// the Job's busy pods (`--hold-kueue-preemption`): the Job controller's deletes of them are
/// refused while they are busy, as any cluster disruption.
pub const HOLD_PREEMPTION_NAMESPACE_LABEL: &str = "busyguard.io/hold-preemption";

/// The Lease annotation that holds a workload's grants (`budget::Grants`, JSON).
pub const GRANTS_ANNOTATION: &str = "busyguard.io/granted";

/// Marks the objects busyguard keeps (busy-pod PDBs, budget Leases), to tell them from the
/// user's.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "busyguard");

/// The label selector of the objects busyguard keeps ([`MANAGED_BY`]).
pub fn managed_by_busyguard() -> String {
    format!("{}={}", MANAGED_BY.0, MANAGED_BY.1)
}
