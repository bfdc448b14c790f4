//! The one-shot commands beside `busyguard serve`, one file each: they speak to the cluster with
//! the user's own credentials (or none), print what they did, and exit. None of them runs in the
//! server.

pub mod agent;
pub mod certs;
pub mod check;
pub mod cleanup;
pub mod cluster_settings;
pub mod dev_webhooks;
pub mod status;
pub mod trial;
