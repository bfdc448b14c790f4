//! The limits a replica serves within: deadlines, connections, requests and memory at once,
//! and how it stops; and the durations flags are written in.

use std::time::Duration;

use clap::Args;

use crate::duration::parse_positive_duration;
use crate::server::Limits;

#[derive(Debug, Args)]
#[command(next_help_heading = "Limits")]
pub struct LimitArgs {
    /// Time allowed for a TLS handshake.
    #[arg(long, env = "BUSYGUARD_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = std_duration)]
    pub handshake_timeout: Duration,
    /// Time allowed for a request's headers; also how long a connection may wait for its first
    /// request.
    #[arg(long, env = "BUSYGUARD_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = std_duration)]
    pub header_read_timeout: Duration,
    /// How long a connection that has been answered may stay idle: longer than the API server
    /// keeps an idle connection to a webhook (90 s), so that it is the client that closes it.
    /// A close from busyguard's end races a review sent on it at that moment, which the API
    /// server does not send again.
    #[arg(long, env = "BUSYGUARD_KEEP_ALIVE_TIMEOUT", default_value = "120s", value_parser = std_duration)]
    pub keep_alive_timeout: Duration,
    /// Time allowed for a request's body once the headers are in.
    #[arg(long, env = "BUSYGUARD_BODY_READ_TIMEOUT", default_value = "10s", value_parser = std_duration)]
    pub body_read_timeout: Duration,
    /// Open webhook connections at most; a connection beyond is closed as soon as it is
    /// accepted, so the API server fails over (or applies failurePolicy) at once.
    #[arg(long, env = "BUSYGUARD_MAX_CONNECTIONS", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Of --max-connections, how many one client address may hold, so that one client cannot
    /// take every connection the API server needs (keep it above what the API server opens: a
    /// few tens per API server under load).
    #[arg(long, env = "BUSYGUARD_MAX_CONNECTIONS_PER_PEER", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections_per_peer: u32,
    /// Reviews handled at once at most; one beyond is answered 503 at once (shed) instead of
    /// waiting, so the API server applies failurePolicy well before its timeout.
    #[arg(long, env = "BUSYGUARD_MAX_IN_FLIGHT", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_in_flight: u32,
    /// MiB of request bodies held in memory at once; a request beyond is answered 503 at once.
    /// Keep it well under the container's memory limit (a body is at most 7 MiB).
    #[arg(long, env = "BUSYGUARD_MAX_BODY_MEMORY_MIB", default_value_t = 64, value_parser = clap::value_parser!(u32).range(8..=4095))]
    pub max_body_memory_mib: u32,
    /// On SIGTERM, how long to go on serving while unready before refusing new connections: time
    /// for a load balancer that follows /readyz to stop sending new ones.
    #[arg(long, env = "BUSYGUARD_SHUTDOWN_DELAY", default_value = "0s", value_parser = zero_or_std_duration)]
    pub shutdown_delay: Duration,
    /// On SIGTERM, how long in-flight requests may take to finish.
    #[arg(long, env = "BUSYGUARD_SHUTDOWN_TIMEOUT", default_value = "25s", value_parser = std_duration)]
    pub shutdown_timeout: Duration,
}

impl From<&LimitArgs> for Limits {
    fn from(args: &LimitArgs) -> Self {
        Limits {
            handshake_timeout: args.handshake_timeout,
            header_read_timeout: args.header_read_timeout,
            keep_alive_timeout: args.keep_alive_timeout,
            body_read_timeout: args.body_read_timeout,
            max_connections: args.max_connections as usize,
            max_connections_per_peer: args.max_connections_per_peer as usize,
            max_in_flight: args.max_in_flight as usize,
            max_body_memory: args.max_body_memory_mib as usize * 1024 * 1024,
        }
    }
}

/// `0` (in any unit) turns the delay off; anything else is a positive duration.
fn zero_or_std_duration(text: &str) -> Result<Duration, String> {
    if text.trim_end_matches(|c: char| c.is_ascii_alphabetic()) == "0" {
        Ok(Duration::ZERO)
    } else {
        std_duration(text)
    }
}

pub fn std_duration(text: &str) -> Result<Duration, String> {
    let duration = parse_positive_duration(text)?;
    Duration::try_from(duration).map_err(|e| e.to_string())
}
