//! busyguard: a Kubernetes admission webhook that keeps busy pods alive through voluntary
//! disruption. See docs/contract.md for the busy contract.

/// The version busyguard is, and the commit it was built from (`build.rs`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
pub const COMMIT: &str = env!("BUSYGUARD_COMMIT");

pub mod admission;
pub mod audit;
pub mod cli;
pub mod cluster;
pub mod commands;
pub mod config;
pub mod crypto;
pub mod duration;
pub mod json;
pub mod metrics;
pub mod policy;
pub mod server;
