//! Which namespaces busyguard guards: never the system's nor its own, and of the others those its
//! `busyguard.io/enabled` label lets in.

/// The namespace the manifests install busyguard in: its service account's, and where it keeps
/// the workload budgets' Leases.
pub const BUSYGUARD_NAMESPACE: &str = "busyguard";

/// The user busyguard's own token authenticates as: its service account's, in its namespace.
pub fn busyguards_user() -> String {
    format!("system:serviceaccount:{BUSYGUARD_NAMESPACE}:busyguard")
}
/// Namespaces busyguard never guards, as its webhooks' namespaceSelector says: the system's and
/// its own. Any other opts out with the label `busyguard.io/enabled=false` (see `Enrolment`).
pub const NEVER_GUARDED_NAMESPACES: [&str; 2] = ["kube-system", BUSYGUARD_NAMESPACE];

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
