//! Pure decisions: no I/O, and no clock but the `now` passed in.
//!
//! Each path is decided whole in one file, returning an [`outcome::Outcome`]:
//! - [`mutate::mutate_pod`]: pod CREATE/UPDATE, the mutating webhook (annotations on the busy
//!   flips), and [`writes::judge_write`], who may write opted-in pods;
//! - [`disruption::judge_disruption`]: pod DELETE and pods/eviction CREATE (deny, exempt, lapse,
//!   defer);
//! - [`scale::prepare_scale_down`]: ReplicaSet and Deployment scale-downs (plan, pods to refresh);
//! - [`node::judge_node_delete`]: Node DELETE (refused while busy pods run there);
//! - [`observed::on_change`]: a change the watch saw (deferred deletes due, stale annotations,
//!   losses), and [`observed::due`], asked of every pod by the sweep.
//!
//! The rest are the atoms they share: [`keys`] (the names on pods), [`pod`] (what a decision
//! reads of a pod), [`busy`] (is a pod protected), [`cost`], [`selector`], [`marks`] (what
//! busyguard keeps on a pod, and its patches). Each path's sentences
//! (refusals, warnings, the `detail` of audit lines) are written beside its rule.
//!
//! Words: a `Verdict` is the busy rule's answer for one pod; a `Decision` is what busyguard did,
//! as metrics and audit lines name it; an `Outcome` is all of it: the answer, the audit line and
//! the side effects.

pub mod budget;
pub mod busy;
pub mod contract;
pub mod cost;
pub mod disruption;
pub mod hazards;
pub mod hold;
pub mod keys;
pub mod marks;
pub mod mutate;
pub mod node;
pub mod observed;
pub mod outcome;
pub mod pdb;
pub mod pod;
pub mod scale;
pub mod selector;
pub mod selectors;
#[cfg(test)]
pub mod testing;
pub mod workloads;
pub mod writes;

use busy::MaxBusy;
use hold::Holds;
use jiff::Timestamp;
use marks::MutationSettings;
use outcome::{AuditRecord, Decision, Reason, Subject};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, strum::IntoStaticStr)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum Mode {
    /// Deny disruptions of busy pods.
    Enforce,
    /// Allow everything, warn the requester and audit what would have been denied.
    DryRun,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Everything the decisions depend on besides the request and the clock. Its defaults are the
/// command line's (`busyguard serve`).
#[derive(Debug, Clone)]
pub struct PolicyConfig {
    pub mode: Mode,
    pub max_busy: MaxBusy,
    pub exemptions: Exemptions,
    pub mutation: MutationSettings,
    pub holds: Holds,
}

/// Who may take busy pods away, as configured (`--exempt-user`, `--exempt-group`,
/// `--karpenter-user`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exemptions {
    pub users: Vec<String>,
    pub groups: Vec<String>,
    /// Karpenter's users: their *deletes* of busy pods go through, and their node deletes
    /// (Karpenter deletes a pod, or its node, only when the node's deadline is running out).
    pub karpenter: Vec<String>,
    /// The run-to-completion owners' controllers: their deletes of a pod carrying their owner's
    /// label (a Job's, a Workflow's, a TaskRun's) go through.
    pub owner_controllers: Vec<String>,
}

impl Exemptions {
    /// The exemption `requester` holds as a configured user or group, if any.
    pub fn of(&self, requester: Requester<'_>) -> Option<Exempt> {
        if self.users.iter().any(|u| u == requester.username) {
            return Some(Exempt::User(requester.username.to_string()));
        }
        requester.groups.iter().find(|g| self.groups.contains(g)).map(|g| Exempt::Group(g.clone()))
    }

    pub fn is_karpenter(&self, username: &str) -> bool {
        self.karpenter.iter().any(|user| user == username)
    }

    pub fn is_owner_controller(&self, username: &str) -> bool {
        self.owner_controllers.iter().any(|user| user == username)
    }
}

/// A configured exemption, by the user or the group that holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exempt {
    User(String),
    Group(String),
}

impl Exempt {
    pub fn reason(&self) -> Reason {
        match self {
            Exempt::User(_) => Reason::ExemptUser,
            Exempt::Group(_) => Reason::ExemptGroup,
        }
    }
}

/// Who asks, as the API server authenticated them.
#[derive(Debug, Clone, Copy)]
pub struct Requester<'a> {
    pub username: &'a str,
    pub groups: &'a [String],
    /// The pod whose bound service-account token made the request, if one did
    /// (`authentication.kubernetes.io/pod-name` in the user's extra info).
    pub pod: Option<&'a str>,
}

/// A request's operation, as the AdmissionReview names it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize, strum::IntoStaticStr, strum::EnumString,
)]
#[serde(rename_all = "UPPERCASE")]
#[strum(serialize_all = "UPPERCASE")]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// The request being decided, as the decisions see it: no wire format.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    pub uid: &'a str,
    pub operation: Operation,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub requester: Requester<'a>,
    /// The request changes nothing (`dryRun`, or an eviction's `deleteOptions.dryRun`).
    pub dry_run: bool,
}

impl Ask<'_> {
    /// An audit line naming this request.
    pub fn audit(&self, decision: Decision, reason: Reason, detail: String, mode: Mode, now: Timestamp) -> AuditRecord {
        AuditRecord::new(Subject::Request(self), decision, reason, detail, mode, now)
    }
}

/// The namespace the manifests install busyguard in: its service account's, and where it keeps
/// the workload budgets' Leases.
pub const BUSYGUARD_NAMESPACE: &str = "busyguard";
/// Namespaces busyguard never guards, as its webhooks' namespaceSelector says: the system's and
/// its own. Any other opts out with the label `busyguard.io/enabled=false` (see `Enrolment`).
pub const NEVER_GUARDED_NAMESPACES: [&str; 2] = ["kube-system", BUSYGUARD_NAMESPACE];
/// The user every controller of a controller-manager run without
/// `--use-service-account-credentials` speaks as.
pub const SHARED_CONTROLLER_MANAGER_USER: &str = "system:kube-controller-manager";

/// Which namespaces busyguard guards, by their `busyguard.io/enabled` label. Its webhooks'
/// namespaceSelectors say the same: the base's every one not labelled `"false"`, the
/// `manifests/opt-in` component's only those labelled `"true"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Enrolment {
    #[default]
    OptOut,
    OptIn,
}

impl Enrolment {
    /// The label value that sets a namespace apart from the rest: watched for.
    pub fn exception(self) -> &'static str {
        match self {
            Enrolment::OptOut => "false",
            Enrolment::OptIn => "true",
        }
    }

    /// Whether busyguard leaves alone a namespace that carries the exception (or not).
    pub fn leaves_alone(self, exception: bool) -> bool {
        exception == (self == Enrolment::OptOut)
    }
}

/// Where the API server names the pod a bound service-account token belongs to.
pub const POD_NAME_CLAIM: &str = "authentication.kubernetes.io/pod-name";

// Who sends what, as a real API server names the requesters (kube-controller-manager with
// `--use-service-account-credentials`).

/// The pod garbage collector deletes pods whose node is gone: nothing is left to protect.
pub const POD_GC_USER: &str = "system:serviceaccount:kube-system:pod-garbage-collector";
/// The garbage collector deletes pods whose owner is gone; it asks once.
pub const GARBAGE_COLLECTOR_USER: &str = "system:serviceaccount:kube-system:generic-garbage-collector";
/// The administrator of clusters set up by hand or by local tools: a person despite the prefix.
pub const LOCAL_ADMIN_USER: &str = "system:admin";
/// The taint managers: the one that deletes the pods of a node that is NotReady or unreachable
/// (or tainted NoExecute), as `node-controller` before Kubernetes 1.29 and
/// `taint-eviction-controller` since; and the one that deletes the pods using a device tainted
/// NoExecute (DRA device taints, KEP-5055, stable in 1.37; PDBs do not hold it either). Broken
/// hardware: what runs there is lost anyway.
pub const TAINT_MANAGER_USERS: [&str; 3] = [
    "system:serviceaccount:kube-system:node-controller",
    "system:serviceaccount:kube-system:taint-eviction-controller",
    "system:serviceaccount:kube-system:device-taint-eviction-controller",
];
/// Deletes the pods a ReplicaSet scales down; it chooses again, and retries, by itself.
pub const REPLICASET_CONTROLLER_USER: &str = "system:serviceaccount:kube-system:replicaset-controller";
/// The namespace controller deletes every pod of a namespace being deleted.
pub const NAMESPACE_CONTROLLER_USER: &str = "system:serviceaccount:kube-system:namespace-controller";
/// The cloud node lifecycle controller deletes a node whose machine is gone; refusing would leave
/// a Node object for nothing. Upstream cloud-provider runs it with the client name
/// `node-controller` (k8s.io/cloud-provider, `ClientName: "node-controller"`); some providers'
/// managers use their own service account by the controller's name.
pub const CLOUD_NODE_LIFECYCLE_USERS: [&str; 2] = [
    "system:serviceaccount:kube-system:node-controller",
    "system:serviceaccount:kube-system:cloud-node-lifecycle-controller",
];
/// The controllers that run pods to completion, as upstream installs them: the Job controller,
/// Argo Workflows' workflow-controller (its quick start's `argo` service account in `argo`) and
/// Tekton Pipelines' controller. `--owner-controller-user`'s default (comma-separated): their
/// deletes of their own pods (a deadline, a suspend, a backoff limit, a success policy, a lowered
/// parallelism; a stop, cancel or timeout) are the workload's own end, not a disruption.
pub const OWNER_CONTROLLER_USERS: &str = "system:serviceaccount:kube-system:job-controller,\
     system:serviceaccount:argo:argo,system:serviceaccount:tekton-pipelines:tekton-pipelines-controller";
/// Karpenter's service account as its chart installs it, in kube-system or in a namespace of
/// its own: `--karpenter-user`'s default (comma-separated).
pub const KARPENTER_USERS: &str =
    "system:serviceaccount:kube-system:karpenter,system:serviceaccount:karpenter:karpenter";
