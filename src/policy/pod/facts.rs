//! What the busy decisions read of a pod, whether it came in a request ([`super::Pod`]) or from
//! the cluster view (its record): [`PodFacts`], and the words it answers in.

use jiff::Timestamp;

use crate::policy::keys::{
    ARGO_WORKFLOW, DELETE_REQUESTED, DeleteRequest, JOB_NAME, POD_TEMPLATE_HASH, ROLLOUTS_POD_TEMPLATE_HASH,
    SET_LABELS, TASK_CONTAINER_NAMED_BY, TEKTON_TASK_RUN,
};

/// Who runs a pod to its end (a Job, an Argo Workflow, a Tekton TaskRun), by the label it puts
/// on the pod: that owner's controller decides when the pod ends, and which containers run its
/// task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunsToCompletion {
    Job,
    ArgoWorkflow,
    TektonTaskRun,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

impl Phase {
    pub fn parse(phase: Option<&str>) -> Phase {
        match phase {
            Some("Pending") => Phase::Pending,
            Some("Running") => Phase::Running,
            Some("Succeeded") => Phase::Succeeded,
            Some("Failed") => Phase::Failed,
            _ => Phase::Unknown,
        }
    }
}

/// Readiness as the pod's `Ready` condition reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Readiness {
    pub ready: bool,
    pub since: Option<Timestamp>,
    /// Not Ready only for its readiness gates (`ReadinessGatesNotReady`): its containers are,
    /// as while OpenKruise updates it in place.
    pub gated: bool,
}

/// What the busy decisions read of a pod, whether it came in a request or from the cluster view.
pub trait PodFacts {
    fn uid(&self) -> &str;
    fn resource_version(&self) -> &str;
    fn label(&self, key: &str) -> Option<&str>;
    fn annotation(&self, key: &str) -> Option<&str>;
    /// The container that runs the pod's task where an annotation names it
    /// ([`TASK_CONTAINER_NAMED_BY`]).
    fn task_container(&self) -> Option<&str> {
        TASK_CONTAINER_NAMED_BY.into_iter().find_map(|key| self.annotation(key))
    }
    fn phase(&self) -> Phase;
    /// Whether no task can have begun yet: see [`not_started`].
    fn not_started(&self) -> bool;
    /// Whether a run-to-completion pod's task has ended: see [`task_ended`].
    fn task_ended(&self) -> bool;
    fn is_terminating(&self) -> bool;
    /// When the pod was created: the earliest it can have turned busy.
    fn created(&self) -> Option<Timestamp>;
    /// When the kubelet started the pod (`status.startTime`).
    fn started(&self) -> Option<Timestamp>;
    /// When the pod's task container (`busyguard.io/task-container`; without it, any
    /// container) last came back from a restart, if it ever did.
    fn last_restart(&self) -> Option<Timestamp>;
    /// `None` when the pod has no `Ready` condition yet.
    fn readiness(&self) -> Option<Readiness>;
    /// Why the pod is in its phase, e.g. `Evicted` for a Failed pod.
    fn status_reason(&self) -> Option<&str>;
    /// The reason of the pod's `DisruptionTarget` condition, when it is true: who set out to
    /// take it away (`EvictionByEvictionAPI`, `PreemptionByScheduler`, ...).
    fn disruption(&self) -> Option<&str>;
    /// Whether busyguard wrote the delete-requested mark's annotation, as the API server's
    /// managedFields record the writer.
    fn mark_by_busyguard(&self) -> bool;
    /// Whether busyguard wrote the busy label itself: the pod follows its owner's status or its
    /// leader (`policy::owners`), so its flag is not the pod's own.
    fn busy_label_by_busyguard(&self) -> bool;
    /// The controlling owner's group, kind and name ([`OwnerKey`]).
    fn owner_key(&self) -> Option<OwnerKey<'_>>;

    /// Succeeded or Failed: the pod's containers will not run again.
    fn is_terminal(&self) -> bool {
        matches!(self.phase(), Phase::Succeeded | Phase::Failed)
    }

    /// The label by which its ReplicaSet selects it, and its value: an Argo Rollout's
    /// (`rollouts-pod-template-hash`), else a Deployment's (`pod-template-hash`).
    /// The run-to-completion owner whose label the pod carries, if any.
    fn runs_to_completion(&self) -> Option<RunsToCompletion> {
        [
            (JOB_NAME, RunsToCompletion::Job),
            (ARGO_WORKFLOW, RunsToCompletion::ArgoWorkflow),
            (TEKTON_TASK_RUN, RunsToCompletion::TektonTaskRun),
        ]
        .into_iter()
        .find_map(|(label, owner)| self.label(label).map(|_| owner))
    }

    /// Whether container `name` runs the pod's task: the one an annotation names
    /// ([`Self::task_container`]), else a Tekton TaskRun's steps
    /// (`step-*`, not its sidecars, which Tekton stops by swapping their image once the steps
    /// end) and an Argo Workflow's `main`, else any container.
    fn is_task_container(&self, name: &str) -> bool {
        if let Some(task) = self.task_container() {
            return name == task;
        }
        match self.runs_to_completion() {
            Some(RunsToCompletion::TektonTaskRun) => name.starts_with("step-"),
            Some(RunsToCompletion::ArgoWorkflow) => name == "main",
            Some(RunsToCompletion::Job) | None => true,
        }
    }

    /// Whether the task's end waits for container `name`: a task container, and an Argo
    /// Workflow's `wait`, which saves the outputs of `main` once it has exited.
    fn task_ends_with(&self, name: &str) -> bool {
        self.is_task_container(name)
            || (self.runs_to_completion() == Some(RunsToCompletion::ArgoWorkflow) && name == "wait")
    }

    /// The set the pod belongs to, as `(kind, name)`, where each of its pods has an owner of its
    /// own (a runner's scale set, a game server's fleet): see [`SET_LABELS`].
    fn owners_set(&self) -> Option<(&'static str, &str)> {
        SET_LABELS.into_iter().find_map(|(key, kind)| Some((kind, self.label(key)?)))
    }

    fn template_hash(&self) -> Option<(&'static str, &str)> {
        [ROLLOUTS_POD_TEMPLATE_HASH, POD_TEMPLATE_HASH].into_iter().find_map(|key| Some((key, self.label(key)?)))
    }

    /// The delete busyguard deferred on this pod, if any: marked by the label (which the API
    /// server can select, so that no one but busyguard writes it) and told by the annotation.
    /// busyguard carries it out with its own rights, so only a mark it wrote itself counts, not
    /// one any pod patcher (or a copied pod template) put there.
    fn delete_request(&self) -> Option<DeleteRequest> {
        self.label(DELETE_REQUESTED)?;
        if !self.mark_by_busyguard() {
            return None;
        }
        serde_json::from_str(self.annotation(DELETE_REQUESTED)?).ok()
    }
}

/// An owner as busyguard keys it, read (kube's `ObjectRef` shape): its API group (`""` for the
/// core group), kind and name. It is kept as its string, `group/Kind/name`, once per owner the
/// view's pods share, so two groups' kinds of the same name are never taken for each other;
/// this is the one place that writes and reads that string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnerKey<'a> {
    pub group: &'a str,
    pub kind: &'a str,
    pub name: &'a str,
}

impl<'a> OwnerKey<'a> {
    /// The key an owner reference names (its `apiVersion`'s group, its kind and name).
    pub fn of(api_version: &'a str, kind: &'a str, name: &'a str) -> OwnerKey<'a> {
        OwnerKey { group: group_of(api_version), kind, name }
    }

    /// A key as [`OwnerKey`]'s `Display` writes it; `None` for anything else.
    pub fn parse(key: &'a str) -> Option<OwnerKey<'a>> {
        let (group, rest) = key.split_once('/')?;
        let (kind, name) = rest.split_once('/')?;
        Some(OwnerKey { group, kind, name })
    }

    /// A pod (a Spark driver's executors are controlled by it).
    pub fn is_pod(&self) -> bool {
        self.group.is_empty() && self.kind == "Pod"
    }
}

impl std::fmt::Display for OwnerKey<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.group, self.kind, self.name)
    }
}

/// The group of an ownerReference's `apiVersion` (`""` for the core group's `v1`).
pub fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

/// The version of an `apiVersion` (`v1` of `apps/v1`, and of the core group's `v1`).
pub fn version_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or(api_version, |(_, version)| version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_key_reads_back_as_written_and_tells_two_groups_kinds_apart() {
        let runner = OwnerKey::of("actions.github.com/v1alpha1", "EphemeralRunner", "r-4tb9k");
        assert_eq!(runner.to_string(), "actions.github.com/EphemeralRunner/r-4tb9k");
        assert_eq!(OwnerKey::parse("actions.github.com/EphemeralRunner/r-4tb9k"), Some(runner));
        let driver = OwnerKey::of("v1", "Pod", "etl-driver");
        assert_eq!(driver.to_string(), "/Pod/etl-driver");
        assert!(OwnerKey::parse("/Pod/etl-driver").is_some_and(|key| key.is_pod() && key.name == "etl-driver"));
        assert!(!OwnerKey::of("example.com/v1", "Pod", "p").is_pod(), "another group's Pod");
        assert_eq!(OwnerKey::parse("no-slashes"), None);
    }
}
