//! Pure decisions: no I/O, and no clock but the `now` passed in.
//!
//! Each path is decided whole in one file, returning an [`outcome::Outcome`]:
//! - [`mutate::mutate_pod`]: pod CREATE/UPDATE, the mutating webhook (annotations on the busy
//!   flips), and [`writes::judge_write`], who may write opted-in pods;
//! - [`disruption::judge_disruption`]: pod DELETE, pods/eviction CREATE and an update that would
//!   restart a busy pod's task container (deny, exempt, lapse, defer);
//! - [`scale::prepare_scale_down`]: ReplicaSet and Deployment scale-downs (plan, pods to refresh);
//! - [`node::judge_node_delete`]: Node DELETE (refused while busy pods run there);
//! - [`owner_task::judge_new_task`]: an owner under a busy rule taking a new task (refused while
//!   its pod is held);
//! - [`observed::on_change`]: a change the watch saw (deferred deletes due, stale annotations,
//!   losses), and [`observed::due`], asked of every pod by the sweep.
//!
//! The rest are the atoms they share: [`keys`] (the names on pods), [`pod`] (what a decision
//! reads of a pod), [`busy`] (is a pod protected), [`verdict`] (may the requester take it all
//! the same), [`budget`] (the workload budget), [`owners`] (busy from the owner's status),
//! [`cost`], [`selector`], [`marks`] (what busyguard keeps on a pod, and its patches). Each path's sentences
//! (refusals, warnings, the `detail` of audit lines) are written beside its rule.
//!
//! Words: a `Verdict` is the busy rule's answer for one pod; a `Decision` is what busyguard did,
//! as metrics and audit lines name it; an `Outcome` is all of it: the answer, the audit line and
//! the side effects.

pub mod ask;
pub mod budget;
pub mod busy;
pub mod config;
pub mod contract;
pub mod cost;
pub mod disruption;
pub mod flips;
pub mod hazards;
pub mod hold;
pub mod keys;
pub mod marks;
pub mod mutate;
pub mod namespaces;
pub mod node;
pub mod observed;
pub mod outcome;
pub mod owner_task;
pub mod owners;
pub mod patches;
pub mod pdb;
pub mod pod;
pub mod refusals;
pub mod registrations;
pub mod requesters;
pub mod scale;
pub mod selector;
#[cfg(test)]
pub mod testing;
pub mod vendor_marks;
pub mod verdict;
pub mod workloads;
pub mod writes;

pub use ask::{Ask, Operation, Requester};
pub use config::{Exempt, Exemptions, Mode, PolicyConfig};
pub use namespaces::{BUSYGUARD_NAMESPACE, Enrolment, NEVER_GUARDED_NAMESPACES};
pub use requesters::*;
