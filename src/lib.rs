//! busyguard: a Kubernetes admission webhook that keeps busy pods alive through voluntary
//! disruption. See docs/contract.md for the busy contract.

pub mod admission;
pub mod agent;
pub mod audit;
pub mod certs;
pub mod check;
pub mod cleanup;
pub mod cluster;
pub mod config;
pub mod crypto;
pub mod duration;
pub mod json;
pub mod metrics;
pub mod policy;
pub mod registration;
pub mod server;
pub mod status;
