//! The two ports: HTTPS for the API server's AdmissionReviews, plain HTTP for probes and
//! metrics. Starting binds both and loads the certificate; shutting down stops taking
//! connections, lets in-flight requests finish, then closes the admin port last.

pub mod admin;
mod slots;
pub mod tls;
pub mod webhook;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::response::Response;
use hyper::body::Incoming;
use hyper::service::Service;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

use crate::audit::AuditLog;
use crate::cluster::view::Unavailable;
use crate::cluster::{Cluster, ClusterSettings};
use crate::metrics::Metrics;
use crate::policy::PolicyConfig;
use slots::Slots;
use tls::CertFiles;

#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub cert: CertFiles,
    /// CAs whose client certificates are required, if set (mTLS).
    pub client_ca: Option<PathBuf>,
    pub cert_reload_interval: Duration,
    pub limits: Limits,
    /// After SIGTERM, unready but still serving for this long before the port closes.
    pub shutdown_delay: Duration,
    pub shutdown_timeout: Duration,
    pub policy: PolicyConfig,
    /// Audit lines go to this file, or to stdout without one.
    pub audit_log: Option<PathBuf>,
    pub cluster: ClusterSettings,
}

/// Workloads with gauges of their own at most; the rest are summed as `(other)`.
const MAX_WORKLOADS: usize = 500;

/// How long a shutdown waits for the audit lines to be written, after the side effects.
const AUDIT_FLUSH: Duration = Duration::from_secs(2);
/// How long a shutdown waits for queued side effects after the last answer.
const OUTBOX_DRAIN: Duration = Duration::from_secs(4);

/// Open connections to the admin port at most: probes and scrapers need a few.
const ADMIN_MAX_CONNECTIONS: usize = 64;

/// How long a client may take at each step before the connection is dropped.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub handshake_timeout: Duration,
    /// Also bounds how long a connection may wait for its first request, and stay open idle
    /// (HTTP/1.1 and HTTP/2 alike).
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
    pub max_connections: usize,
    /// Of `max_connections`, how many one client address may hold.
    pub max_connections_per_peer: usize,
    pub max_in_flight: usize,
    /// Bytes of request bodies held in memory at once, at most.
    pub max_body_memory: usize,
}

/// What the request handlers share.
pub struct App {
    pub policy: PolicyConfig,
    pub audit: Arc<AuditLog>,
    pub metrics: Arc<Metrics>,
    pub limits: Limits,
    pub cluster: Cluster,
    /// One permit per review being handled (`Limits::max_in_flight`).
    pub in_flight: Semaphore,
    /// One permit per byte of request bodies in memory (`Limits::max_body_memory`).
    pub body_memory: Semaphore,
    serving: AtomicBool,
}

impl App {
    /// Not serving until `start_serving` is called.
    pub fn new(
        policy: PolicyConfig,
        audit: Arc<AuditLog>,
        metrics: Arc<Metrics>,
        limits: Limits,
        cluster: Cluster,
    ) -> App {
        let in_flight = Semaphore::new(limits.max_in_flight);
        let body_memory = Semaphore::new(limits.max_body_memory);
        App { policy, audit, metrics, limits, cluster, in_flight, body_memory, serving: AtomicBool::new(false) }
    }

    /// Takes reviews from now on (and reports ready, when the rest is).
    pub fn start_serving(&self) {
        self.serving.store(true, Ordering::Relaxed);
    }

    /// False from the start of a shutdown.
    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::Relaxed)
    }

    /// Ready means able to answer reviews: serving and not draining. A stale view or a failing
    /// audit sink does not take a replica out of the Service: the delete path needs neither, and
    /// with every replica unready each delete of an opted-in pod would fail cluster-wide (the
    /// webhook fails closed). They are reported by `health` (`/status`) and the metrics instead.
    pub fn readiness(&self) -> Result<(), String> {
        if !self.is_serving() {
            return Err("shutting down".into());
        }
        Ok(())
    }

    /// Sets the per-workload gauges from the view, as of now.
    pub fn count_workloads(&self) {
        use crate::metrics::{WorkloadLabels, WorkloadOnlyLabels};
        use crate::policy::workloads::{count, of_pod};
        let now = jiff::Timestamp::now();
        let pods = self.cluster.view.flat_map(|namespace, name, pod| {
            let counts = of_pod(pod, self.policy.max_busy, now)?;
            Some((namespace.to_string(), pod.workload(name), counts))
        });
        let counts = count(pods, MAX_WORKLOADS);
        let metrics = &self.metrics;
        let (pods, deletes, retired) =
            (&metrics.workload_pods, &metrics.workload_deferred_deletes, &metrics.workload_retired_keys);
        pods.clear();
        deletes.clear();
        retired.clear();
        for ((namespace, workload), counts) in counts {
            for (state, n) in [("busy", counts.busy), ("idle", counts.idle), ("lapsed", counts.lapsed)] {
                let labels = WorkloadLabels { namespace: namespace.clone(), workload: workload.clone(), state };
                pods.get_or_create(&labels).set(n as i64);
            }
            let labels = WorkloadOnlyLabels { namespace, workload };
            deletes.get_or_create(&labels).set(counts.delete_requested as i64);
            if counts.retired_keys > 0 {
                retired.get_or_create(&labels).set(counts.retired_keys as i64);
            }
        }
    }

    /// Everything busyguard depends on besides serving: the audit log written, and the cluster
    /// view (if any) listed and fresh. Sets the matching gauges.
    pub fn health(&self) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();
        let audit = self.audit.health();
        self.metrics.audit_failing.set(i64::from(audit.is_err()));
        problems.extend(audit.err());
        let view = self.cluster.view.check(Instant::now()).map_err(|why| match why {
            // Evictions get 503 here too, as while the view is stale: not "ok".
            Unavailable::NoCluster => {
                format!("{why}: evictions and node deletes are answered 503, scale-downs go unprepared")
            }
            why => why.to_string(),
        });
        self.metrics.view_unavailable.set(i64::from(view.is_err()));
        problems.extend(view.err());
        if !self.is_serving() {
            problems.push("shutting down".into());
        }
        if problems.is_empty() { Ok(()) } else { Err(problems) }
    }
}

pub struct Server {
    pub webhook_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    app: Arc<App>,
    stop_webhook: watch::Sender<bool>,
    stop_admin: watch::Sender<bool>,
    webhook_task: JoinHandle<()>,
    admin_task: JoinHandle<()>,
    cert_watcher: JoinHandle<()>,
    shutdown_delay: Duration,
    shutdown_timeout: Duration,
}

pub async fn start(config: ServeConfig) -> anyhow::Result<Server> {
    let metrics = Arc::new(Metrics::default());
    let audit = Arc::new(match &config.audit_log {
        Some(path) => AuditLog::file(path, metrics.audit.clone())
            .with_context(|| format!("opening audit log {}", path.display()))?,
        None => AuditLog::stdout(metrics.audit.clone()),
    });
    let (cert, cert_watcher) = tls::load_and_watch(config.cert.clone(), config.cert_reload_interval, metrics.clone())?;
    let acceptor = TlsAcceptor::from(Arc::new(tls::server_config(cert, config.client_ca.as_deref())?));
    let listener = TcpListener::bind(config.listen).await.with_context(|| format!("listening on {}", config.listen))?;
    let admin_listener = TcpListener::bind(config.admin_listen)
        .await
        .with_context(|| format!("listening on {} (admin)", config.admin_listen))?;
    let webhook_addr = listener.local_addr()?;
    let admin_addr = admin_listener.local_addr()?;

    let cluster = Cluster::start(config.cluster, &config.policy, audit.clone(), metrics.clone()).await?;
    let app = Arc::new(App::new(config.policy, audit, metrics, config.limits, cluster));
    let (stop_webhook, webhook_stopped) = watch::channel(false);
    let (stop_admin, admin_stopped) = watch::channel(false);
    let webhook_task = tokio::spawn(serve(
        listener,
        Handshake::Tls(acceptor),
        {
            let app = app.clone();
            move |peer| webhook::service(app.clone(), peer)
        },
        config.limits,
        app.metrics.connections_refused.clone(),
        webhook_stopped,
    ));
    // Probes and scrapers: a few connections, the same timeouts.
    let admin_limits = Limits {
        max_connections: ADMIN_MAX_CONNECTIONS,
        max_connections_per_peer: ADMIN_MAX_CONNECTIONS,
        ..config.limits
    };
    let admin_task = tokio::spawn(serve(
        admin_listener,
        Handshake::Plain,
        {
            let admin = TowerToHyperService::new(admin::router(app.clone()));
            move |_| admin.clone()
        },
        admin_limits,
        app.metrics.admin_connections_refused.clone(),
        admin_stopped,
    ));
    app.start_serving();
    info!(
        version = crate::VERSION,
        commit = crate::COMMIT,
        webhook = %webhook_addr,
        admin = %admin_addr,
        mode = ?app.policy.mode,
        "busyguard serving"
    );
    Ok(Server {
        webhook_addr,
        admin_addr,
        app,
        stop_webhook,
        stop_admin,
        webhook_task,
        admin_task,
        cert_watcher,
        shutdown_delay: config.shutdown_delay,
        shutdown_timeout: config.shutdown_timeout,
    })
}

impl Server {
    /// Waits until every audit line recorded so far is written, at most `within`: whether it was.
    pub fn flush_audit(&self, within: Duration) -> bool {
        self.app.audit.flush(within)
    }

    /// Not ready any more; for the shutdown delay still serving, each HTTP/1.1 answer closing
    /// its connection; then no new connections, in-flight requests answered (up to the shutdown
    /// timeout), and the admin port closes.
    pub async fn shutdown(mut self) {
        self.app.serving.store(false, Ordering::Relaxed);
        if !self.shutdown_delay.is_zero() {
            info!(delay = ?self.shutdown_delay, "unready; still serving until the shutdown delay is over");
            tokio::time::sleep(self.shutdown_delay).await;
        }
        let _ = self.stop_webhook.send(true);
        match tokio::time::timeout(self.shutdown_timeout, &mut self.webhook_task).await {
            Ok(_) => info!("in-flight requests drained"),
            Err(_) => {
                warn!(timeout = ?self.shutdown_timeout, "requests still in flight at the shutdown timeout; closing them");
                self.webhook_task.abort();
            }
        }
        if let Some(outbox) = &self.app.cluster.outbox
            && !outbox.drained(OUTBOX_DRAIN).await
        {
            warn!(within = ?OUTBOX_DRAIN, "side effects still queued at shutdown; they are dropped");
        }
        let audit = self.app.audit.clone();
        if !tokio::task::spawn_blocking(move || audit.flush(AUDIT_FLUSH)).await.unwrap_or(false) {
            warn!(within = ?AUDIT_FLUSH, "audit lines still unwritten at shutdown");
        }
        let _ = self.stop_admin.send(true);
        let _ = self.admin_task.await;
        self.cert_watcher.abort();
    }
}

/// How a port turns an accepted TCP connection into the stream HTTP is spoken on.
#[derive(Clone)]
enum Handshake {
    Tls(TlsAcceptor),
    /// The admin port: plain HTTP/1.1.
    Plain,
}

/// What a port serves each request with: a hyper service, made for each connection, that
/// answers every request (errors are answers too) with a future that can move between threads.
pub(crate) trait HttpService:
    Service<http::Request<Incoming>, Response = Response, Error = Infallible, Future: Send + 'static>
    + Clone
    + Send
    + 'static
{
}

impl<S> HttpService for S where
    S: Service<http::Request<Incoming>, Response = Response, Error = Infallible, Future: Send + 'static>
        + Clone
        + Send
        + 'static
{
}

/// Accepts connections until stopped, each served with the service `service_for` makes for its
/// client, within `limits`: at most `max_connections` open, `max_connections_per_peer` of them
/// from one address (one beyond is closed at once), the handshake within its timeout, a first
/// request within the header timeout, and no connection left open idle longer than that,
/// whatever the HTTP version. Then waits for the open connections to finish.
async fn serve<S: HttpService>(
    listener: TcpListener,
    handshake: Handshake,
    service_for: impl Fn(SocketAddr) -> S + Send + 'static,
    limits: Limits,
    refused: prometheus_client::metrics::counter::Counter,
    mut stopped: watch::Receiver<bool>,
) {
    let graceful = GracefulShutdown::new();
    let slots = Slots::new(limits.max_connections, limits.max_connections_per_peer);
    let mut http = auto::Builder::new(TokioExecutor::new());
    // Headers trickled are cut off by `Activity::bound` (no request in flight for the header
    // timeout): hyper's own deadline would arm a timer for every request on a keep-alive connection.
    http.http1().header_read_timeout(None);
    // The API server opens few streams per connection; a client opening many only holds memory.
    http.http2().timer(TokioTimer::new()).max_concurrent_streams(MAX_STREAMS_PER_CONNECTION);
    if matches!(handshake, Handshake::Plain) {
        http = http.http1_only();
    }
    loop {
        let (tcp, peer) = tokio::select! {
            () = until_stopped(&mut stopped) => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, most likely: back off instead of spinning.
                    warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let open = match slots.take(peer.ip()) {
            Ok(slot) => slot,
            // Closed at once: cheaper than a handshake, and the client learns now, not at its timeout.
            Err(full) => {
                refused.inc();
                debug!(%peer, ?full, "connection limit reached: closed");
                continue;
            }
        };
        let (handshake, http, service, watcher) =
            (handshake.clone(), http.clone(), service_for(peer), graceful.watcher());
        // Answers are small and go out whole: do not hold them back waiting for an ACK.
        if let Err(e) = tcp.set_nodelay(true) {
            debug!(%peer, error = %e, "cannot set TCP_NODELAY");
        }
        tokio::spawn(async move {
            let activity = Arc::new(Activity::new());
            let service = activity.clone().around(service);
            let result = match handshake {
                Handshake::Plain => {
                    let connection = http.serve_connection(TokioIo::new(tcp), service);
                    activity.bound(watcher.watch(connection), limits.header_read_timeout).await
                }
                Handshake::Tls(acceptor) => {
                    match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            activity.touch();
                            let connection = http.serve_connection(TokioIo::new(stream), service);
                            activity.bound(watcher.watch(connection), limits.header_read_timeout).await
                        }
                        Ok(Err(e)) => {
                            debug!(%peer, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            debug!(%peer, "TLS handshake timed out");
                            return;
                        }
                    }
                }
            };
            match result {
                Some(Err(e)) => debug!(%peer, error = %e, "connection closed with an error"),
                None => debug!(%peer, "connection idle too long, or no request in time: closed"),
                Some(Ok(())) => {}
            }
            // The connection's slot: moved in here so it is held until the connection ends.
            drop(open);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Streams one HTTP/2 connection may carry at once.
const MAX_STREAMS_PER_CONNECTION: u32 = 32;

/// What a connection is doing: requests being answered, and when it last did anything.
struct Activity {
    in_flight: std::sync::atomic::AtomicUsize,
    since: parking_lot::Mutex<Instant>,
}

impl Activity {
    fn new() -> Self {
        Activity { in_flight: 0.into(), since: parking_lot::Mutex::new(Instant::now()) }
    }

    fn touch(&self) {
        *self.since.lock() = Instant::now();
    }

    /// `service`, counting the requests it answers on this connection.
    fn around(self: Arc<Self>, service: impl HttpService) -> impl HttpService {
        hyper::service::service_fn(move |request: http::Request<Incoming>| {
            let (activity, service) = (self.clone(), service.clone());
            async move {
                activity.in_flight.fetch_add(1, Ordering::Relaxed);
                let response = service.call(request).await;
                activity.touch();
                activity.in_flight.fetch_sub(1, Ordering::Relaxed);
                response
            }
        })
    }

    /// Runs the connection until it ends (`Some`), or until it has had nothing in flight for
    /// `idle` (`None`: dropped, which closes it). Covers the wait for a first request too.
    async fn bound<F: Future>(&self, connection: F, idle: Duration) -> Option<F::Output> {
        tokio::pin!(connection);
        loop {
            let last = *self.since.lock();
            tokio::select! {
                result = &mut connection => return Some(result),
                () = tokio::time::sleep_until((last + idle).into()) => {
                    let quiet = self.since.lock().elapsed() >= idle;
                    if quiet && self.in_flight.load(Ordering::Relaxed) == 0 {
                        return None;
                    }
                    if self.in_flight.load(Ordering::Relaxed) > 0 {
                        // Busy: a request is bounded by its own deadlines; look again later.
                        self.touch();
                    }
                }
            }
        }
    }
}

/// Returns once `true` was sent, or the sender is gone.
async fn until_stopped(stopped: &mut watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stopped| *stopped).await;
}
