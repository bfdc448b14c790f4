//! The command line: `busyguard <command>`, each command's arguments beside its code (serve's
//! in `config`, the others' in `commands/`).

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::commands::agent::AgentArgs;
use crate::commands::certs::CertsArgs;
use crate::commands::check::CheckArgs;
use crate::commands::cleanup::CleanupArgs;
use crate::commands::dev_webhooks::DevWebhooksArgs;
use crate::commands::status::StatusArgs;
use crate::config::{ServeArgs, std_duration};

#[derive(Debug, Parser)]
#[command(
    name = "busyguard",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("BUSYGUARD_COMMIT"), ")"),
    about = "Admission webhook that keeps busy pods alive through voluntary disruption"
)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, env = "BUSYGUARD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true, help_heading = "Logging")]
    pub log_format: LogFormat,
    /// Log filter: a level (`info`, `debug`) or tracing directives (`busyguard=debug`).
    #[arg(
        long,
        env = "BUSYGUARD_LOG_LEVEL",
        default_value = "info",
        global = true,
        value_parser = log_filter,
        help_heading = "Logging"
    )]
    pub log_level: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the admission webhook (HTTPS) and the admin port (HTTP).
    Serve(Box<ServeArgs>),
    /// Write a CA and a serving certificate, keeping valid ones unless --force.
    Certs(CertsArgs),
    /// Print webhook configurations that send the cluster's requests to a busyguard at --url
    /// (`make dev-register`).
    DevWebhooks(DevWebhooksArgs),
    /// Wait, then exit: the Deployment's preStop hook, in an image without a shell.
    Sleep(SleepArgs),
    /// What the opted-in pods of the cluster are doing: per workload, busy pods since when, the
    /// deletes that wait for them, and the nodes a drain would wait on. Uses your kubeconfig.
    Status(StatusArgs),
    /// A sidecar that turns the app's own HTTP endpoint into its pod's busy label: busy when the
    /// endpoint answers --busy-status (or a body containing --busy-body), idle otherwise.
    Agent(AgentArgs),
    /// After an uninstall (its webhooks removed first): give every opted-in pod its own deletion
    /// cost and autoscaler annotations back, take busyguard's labels, annotations and deferred
    /// deletes off, and delete its busy-pod PodDisruptionBudgets. Uses your kubeconfig.
    Cleanup(CleanupArgs),
    /// Wait until the API server reaches busyguard and busyguard answers as it should (two
    /// server-side dry runs in --namespace, nothing stored), for install scripts and CI.
    Check(CheckArgs),
}

#[derive(Debug, Args)]
pub struct SleepArgs {
    /// How long, e.g. `5s`.
    #[arg(value_parser = std_duration)]
    pub duration: Duration,
}

/// A filter tracing understands, said back when it is not one (rather than falling back to info).
fn log_filter(text: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::builder()
        .parse(text)
        .map(|_| text.to_string())
        .map_err(|e| format!("{e}: a level (error, warn, info, debug, trace) or directives such as busyguard=debug"))
}
