//! The two ports: HTTPS for the API server's AdmissionReviews, plain HTTP for probes and
//! metrics. Starting binds both and loads the certificate; shutting down stops taking
//! connections, lets in-flight requests finish, then closes the admin port last.

pub mod admin;
mod app;
mod listen;
mod review_metrics;
mod slots;
pub mod tls;
pub mod webhook;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tracing::{info, warn};

use crate::audit::AuditLog;
use crate::cluster::{Cluster, ClusterSettings};
use crate::metrics::Metrics;
use crate::policy::PolicyConfig;
pub use app::{App, Limits};
use hyper_util::service::TowerToHyperService;
use listen::{Handshake, serve};
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

/// How long a shutdown waits for the audit lines to be written, after the side effects.
const AUDIT_FLUSH: Duration = Duration::from_secs(2);
/// How long a shutdown waits for queued side effects after the last answer.
const OUTBOX_DRAIN: Duration = Duration::from_secs(4);

/// Open connections to the admin port at most: probes and scrapers need a few.
const ADMIN_MAX_CONNECTIONS: usize = 64;

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
    if let Some(twice) = crate::policy::owners::same_kind_twice(&config.policy.owner_rules) {
        anyhow::bail!(twice);
    }
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
        self.app.stop_serving();
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
