//! The `busyguard` binary: reads the command line, sets up logging, and runs one command
//! (`serve`, or a one-shot command of `busyguard::commands`) until it ends.

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Context;
use busyguard::cli::{Cli, Command, LogFormat};
use busyguard::commands::certs::{self, CertsOutcome, CertsRequest};
use busyguard::commands::dev_webhooks::DevWebhooksArgs;
use busyguard::commands::status::StatusArgs;
use busyguard::commands::{check, cleanup, cluster_settings, dev_webhooks, status, trial};
use busyguard::config::ServeArgs;
use busyguard::server;
use clap::{CommandFactory, FromArgMatches};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tracing::{error, info, warn};
use tracing_subscriber::EnvFilter;

/// Keeps the webhook's workers off each other's allocator locks (see Cargo.toml).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    small_pages_only();
    let (cli, matches) = command_line();
    init_logging(cli.log_format, &cli.log_level);
    let json_logs = matches!(cli.log_format, LogFormat::Json);
    let result = match cli.command {
        Command::Serve(args) => block_on(serve(*args)),
        Command::Certs(args) => write_certs(args.into()),
        Command::DevWebhooks(args) => print_dev_webhooks(&args),
        Command::Sleep(args) => {
            std::thread::sleep(args.duration);
            Ok(())
        }
        Command::Agent(args) => block_on(async {
            let (agent, source) = args.into_agent();
            let config = busyguard::cluster::client_config(&source).await?.context(busyguard::cluster::NO_CLUSTER)?;
            agent.run(config).await
        }),
        Command::Status(StatusArgs { trial: Some(file), .. }) => {
            read_input(&file).map(|text| print!("{}", trial::summarise(&text)))
        }
        Command::Status(args) => {
            let (source, settings) = (
                args.cluster.source(),
                status::Settings { max_busy: (&args.max_busy).into(), holds: (&args.holds).into() },
            );
            let given = given_to_status(&matches);
            block_on(status::run(&source, &args.cluster.namespaces, settings, &given)).map(|report| print!("{report}"))
        }
        Command::Check(args) => {
            let source = busyguard::config::users_source(args.kubeconfig, args.context);
            block_on(check::run(&source, args.namespace.as_deref(), args.timeout)).map(|report| print!("{report}"))
        }
        Command::Cleanup(args) => {
            let source = args.cluster.source();
            let marks = busyguard::config::marks(args.busy_annotations, args.busy_labels);
            block_on(cleanup::run(&source, &args.cluster.namespaces, marks, args.dry_run))
                .map(|report| print!("{report}"))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // Where logs are read as JSON, as a log line; otherwise one plain line, for a person.
        Err(e) if json_logs => {
            error!("{}", one_line(&e));
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes in one line, each said once: kube's errors repeat their causes in
/// their own text ("client error (Connect): client error (Connect)").
fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain().map(ToString::to_string) {
        if line.contains(&cause) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&cause);
    }
    line
}

/// The command line; run as kubectl's plugin (`kubectl busyguard`, through a `kubectl-busyguard`
/// link), its usage says so and lists only the commands a person runs against a cluster.
fn command_line() -> (Cli, clap::ArgMatches) {
    let name = std::env::args_os().next().map(std::path::PathBuf::from);
    let as_plugin =
        name.as_deref().and_then(std::path::Path::file_name).is_some_and(|name| name == "kubectl-busyguard");
    let mut command = Cli::command();
    if as_plugin {
        command = command.name("kubectl busyguard").bin_name("kubectl busyguard");
        for in_the_cluster in ["serve", "sleep", "agent", "dev-webhooks"] {
            command = command.mut_subcommand(in_the_cluster, |sub| sub.hide(true));
        }
    }
    let matches = command.get_matches();
    (Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit()), matches)
}

/// The shared settings the user gave `status` (on its command line or in the environment): the
/// cluster's own are read for the others.
fn given_to_status(matches: &clap::ArgMatches) -> Vec<&'static str> {
    use clap::parser::ValueSource;
    let Some(status) = matches.subcommand_matches("status") else { return Vec::new() };
    let given = |id: &str| matches!(status.value_source(id), Some(ValueSource::CommandLine | ValueSource::EnvVariable));
    cluster_settings::SHARED_SETTINGS.iter().filter(|(id, _, _)| given(id)).map(|(_, flag, _)| *flag).collect()
}

/// Runs a command's work on a runtime of its own.
fn block_on<T>(work: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Runtime::new()?.block_on(work)
}

/// Where transparent huge pages are "always" on, mimalloc's arenas fill 2 MiB pages: an idle
/// busyguard held 22 MiB instead of 13, and 66 instead of 45 with 1024 connections open.
fn small_pages_only() {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl(PR_SET_THP_DISABLE) takes plain integers and only sets a flag on this process.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

fn init_logging(format: LogFormat, level: &str) {
    // hyper, h2 and rustls report every client's misstep at debug/info: keep them quiet.
    // kube's client logs each failed call as an error too: busyguard says what it means itself.
    let quiet = "hyper=warn,h2=warn,rustls=warn,tokio_rustls=warn,kube_client::client::builder=off";
    let filter = EnvFilter::try_new(format!("{level},{quiet}")).unwrap_or_else(|_| EnvFilter::new("info"));
    let colour = std::io::stderr().is_terminal();
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(colour);
    match format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().flatten_event(true).with_current_span(true).with_span_list(false).init(),
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut signals = Signals::new()?;
    let running = server::start(args.into_config()).await?;
    let name = signals.next().await;
    info!(signal = name, "shutting down: draining in-flight requests; a second signal aborts");
    tokio::select! {
        () = running.shutdown() => Ok(()),
        name = signals.next() => {
            warn!(signal = name, "second signal: aborting in-flight requests");
            std::process::exit(130);
        }
    }
}

struct Signals {
    terminate: Signal,
    interrupt: Signal,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        Ok(Signals { terminate: signal(SignalKind::terminate())?, interrupt: signal(SignalKind::interrupt())? })
    }

    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.terminate.recv() => "SIGTERM",
            _ = self.interrupt.recv() => "SIGINT",
        }
    }
}

fn write_certs(request: CertsRequest) -> anyhow::Result<()> {
    let dir = request.dir.display();
    match certs::ensure(&request)? {
        CertsOutcome::Kept => {
            println!(
                "{dir}: the certificates there are valid for every name, and for at least another day: kept (--force replaces them, CA and all; `openssl x509 -enddate -noout -in {dir}/tls.crt` says until when)"
            )
        }
        CertsOutcome::NewServingPair { why } => println!(
            "{dir}: wrote a new serving pair (tls.crt, tls.key) under the CA there, which is kept, so a caBundle made from its ca.crt stays good ({why})"
        ),
        CertsOutcome::NewCa { why: None } => {
            println!("{dir}: wrote a new CA (ca.crt, ca.key) and serving pair (tls.crt, tls.key)")
        }
        CertsOutcome::NewCa { why: Some(why) } => println!(
            "{dir}: wrote a new CA (ca.crt, ca.key) and serving pair (tls.crt, tls.key): the CA there could not issue ({why}); webhooks registered with the old ca.crt need the new one"
        ),
    }
    Ok(())
}

/// A file's text, or standard input's for `-`.
fn read_input(path: &std::path::Path) -> anyhow::Result<String> {
    if path == std::path::Path::new("-") {
        return std::io::read_to_string(std::io::stdin()).context("reading standard input");
    }
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn print_dev_webhooks(args: &DevWebhooksArgs) -> anyhow::Result<()> {
    let ca = std::fs::read(&args.ca_file).with_context(|| format!("reading {}", args.ca_file.display()))?;
    print!("{}", dev_webhooks::dev_webhooks(&args.url, &ca)?);
    Ok(())
}
