//! Pure decisions: no I/O, and no clock but the `now` passed in.

pub mod busy;
pub mod cost;
pub mod disruption;
pub mod lifecycle;
pub mod mutate;
pub mod pod;
pub mod scale;
pub mod selector;

use busy::MaxBusy;

use disruption::Exemptions;
use mutate::MutationSettings;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Deny disruptions of busy pods.
    Enforce,
    /// Allow everything, warn the requester and audit what would have been denied.
    DryRun,
}

/// Everything the decisions depend on besides the request and the clock. Its defaults are the
/// command line's (`busyguard serve`).
#[derive(Debug, Clone)]
pub struct PolicyConfig {
    pub mode: Mode,
    pub max_busy: MaxBusy,
    pub exemptions: Exemptions,
    pub mutation: MutationSettings,
}

/// The pod garbage collector deletes pods whose node is gone: nothing is left to protect.
pub const POD_GC_USER: &str = "system:serviceaccount:kube-system:pod-garbage-collector";
