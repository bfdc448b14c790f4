//! What the decisions depend on besides the request and the clock: the mode, max-busy, who is
//! exempt, what busyguard writes on a flip, and what holds a pod from new tasks.

use super::ask::Requester;
use super::busy::MaxBusy;
use super::hold::Holds;
use super::marks::MutationSettings;
use super::owners::OwnerRule;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, strum::IntoStaticStr)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum Mode {
    /// Deny disruptions of busy pods.
    Enforce,
    /// A trial that changes nothing: every request allowed as it came (no patch but busyguard's
    /// own busy-since and busy label), nothing else written, no busy-pod PDB; what enforce would have refused or patched is audited
    /// (`would-deny`, `would-patch`) and counted. `dry-run` is its former name.
    #[value(alias = "dry-run")]
    Audit,
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
    /// Busy from the owner's status (`--busy-when-owner`): the pods of these owners are opted in
    /// at creation, and flipped by busyguard as their owner's status changes.
    pub owner_rules: Vec<OwnerRule>,
    /// Busy with another pod (`--busy-with-pod`): a pod carrying this label, whose value names a
    /// pod of its namespace (its leader), is opted in at creation and busy while its leader is;
    /// its leader's own token may delete it (Actions Runner Controller's `runner-pod`: the
    /// workflow pod of `containerMode: kubernetes`, deleted by the runner's hooks).
    pub busy_with_pod: Option<String>,
}

impl PolicyConfig {
    /// The leader a pod is busy with (`--busy-with-pod`), if it names one.
    pub fn leader_of<'p>(&self, pod: &'p (impl super::pod::PodFacts + ?Sized)) -> Option<&'p str> {
        pod.label(self.busy_with_pod.as_deref()?)
    }
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
