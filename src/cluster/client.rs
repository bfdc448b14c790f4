//! The connection to the API server: where its configuration comes from (`--kubeconfig`,
//! `--context`, `KUBECONFIG`, in-cluster, as kubectl finds them), and the client busyguard
//! builds on it (no retries of its own; every answer to a read of pods a sign of the watch's life).

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use http::{Method, Request, Response};
use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tower::{Layer, Service};
use tracing::debug;

use super::view::View;

/// Where the connection to the API server comes from.
#[derive(Debug, Clone)]
pub enum ClusterSource {
    /// No cluster: pods' CREATE/UPDATE/DELETE are judged, evictions cannot be.
    None,
    /// In-cluster service account, or `KUBECONFIG` / `~/.kube/config`; none found means `None`.
    Infer,
    Kubeconfig(PathBuf),
    /// A context of a kubeconfig (the given one, else `KUBECONFIG` or `~/.kube/config`), as
    /// `kubectl --context`.
    Context {
        kubeconfig: Option<PathBuf>,
        context: String,
    },
    /// A configuration the caller built (the tests' stand-in API server's). busyguard builds
    /// its client on it as on any other, its watch-health layer and timeouts with it.
    Config(Box<kube::Config>),
}

/// The client for `config`: no retries of its own (busyguard retries its calls; the client's
/// default would also retry the 429 busyguard itself answers for a pod that turned busy again),
/// and a watch that stops bringing bytes (a connection dead without a word) given up and opened
/// again, healthy watches ending well before, every `watch_timeout`. Every response is a sign
/// of life of the view's watch.
pub(super) fn client(
    mut config: kube::Config,
    watch_timeout: Duration,
    view: &Arc<View>,
) -> anyhow::Result<kube::Client> {
    config.default_retry = false;
    config.read_timeout = Some(2 * watch_timeout);
    let client = ClientBuilder::try_from(config).context("building the Kubernetes client")?;
    Ok(client.with_layer(&WatchHealthLayer(view.clone())).build())
}

pub async fn client_config(source: &ClusterSource) -> anyhow::Result<Option<kube::Config>> {
    // busyguard retries its calls itself (the outbox's attempts, the watches' backoff) and must
    // see a 429 or a 503 as it comes: kube's own retry would wait them out, its own webhook's
    // refusals among them, for up to 15 tries of growing pauses.
    let mut config = found_config(source).await?;
    if let Some(config) = &mut config {
        config.default_retry = false;
    }
    Ok(config)
}

async fn found_config(source: &ClusterSource) -> anyhow::Result<Option<kube::Config>> {
    match source {
        ClusterSource::None => Ok(None),
        ClusterSource::Config(config) => Ok(Some(*config.clone())),
        ClusterSource::Kubeconfig(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| anyhow::anyhow!("cannot read kubeconfig {}: {}", path.display(), innermost(&e)))?;
            let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| anyhow::anyhow!("cannot use kubeconfig {}: {}", path.display(), innermost(&e)))?;
            Ok(Some(config))
        }
        ClusterSource::Context { kubeconfig, context } => {
            let read = match kubeconfig {
                Some(path) => Kubeconfig::read_from(path),
                None => kubeconfig_from_env().transpose().unwrap_or_else(Kubeconfig::read),
            };
            let kubeconfig = read.map_err(|e| anyhow::anyhow!("cannot read the kubeconfig: {}", innermost(&e)))?;
            if !kubeconfig.contexts.iter().any(|c| c.name == *context) {
                let known: Vec<&str> = kubeconfig.contexts.iter().map(|c| c.name.as_str()).collect();
                anyhow::bail!(
                    "cannot use context {context}: the kubeconfig has no such context (it has: {})",
                    known.join(", ")
                );
            }
            let options = KubeConfigOptions { context: Some(context.clone()), ..KubeConfigOptions::default() };
            let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| anyhow::anyhow!("cannot use context {context}: {}", innermost(&e)))?;
            Ok(Some(config))
        }
        ClusterSource::Infer => match kubeconfig_from_env() {
            Ok(Some(kubeconfig)) => kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map(Some)
                .map_err(|e| anyhow::anyhow!("cannot use the kubeconfig of KUBECONFIG: {}", innermost(&e))),
            Err(e) => Err(anyhow::anyhow!("cannot read the kubeconfig of KUBECONFIG: {}", innermost(&e))),
            Ok(None) => infer().await,
        },
    }
}

/// The files of `KUBECONFIG` that exist, merged, as kubectl reads them (it skips the missing
/// ones; kube's own reading fails on the first): `None` when it names no file that exists.
fn kubeconfig_from_env() -> Result<Option<Kubeconfig>, kube::config::KubeconfigError> {
    let Some(value) = std::env::var_os("KUBECONFIG") else { return Ok(None) };
    let paths = std::env::split_paths(&value).filter(|p| !p.as_os_str().is_empty() && p.exists());
    let mut merged = None;
    for path in paths {
        let next = Kubeconfig::read_from(path)?;
        merged = Some(match merged {
            None => next,
            Some(merged) => Kubeconfig::merge(merged, next)?,
        });
    }
    Ok(merged)
}

/// The in-cluster configuration, or `~/.kube/config`, as kube finds them.
async fn infer() -> anyhow::Result<Option<kube::Config>> {
    match kube::Config::infer().await {
        Ok(config) => Ok(Some(config)),
        Err(e) => {
            debug!(error = %e, "no in-cluster config and no kubeconfig");
            Ok(None)
        }
    }
}

/// What a command that needs a cluster says when it finds none.
pub const NO_CLUSTER: &str =
    "no cluster to reach: give --kubeconfig, set KUBECONFIG, have ~/.kube/config, or run in a pod";

/// The first cause of an error, without the layers that repeat it.
fn innermost(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}

/// Tells the view the API server answered a read of pods (a list, or a watch reconnecting),
/// which is the only sign of a healthy watch in a quiet cluster.
struct WatchHealthLayer(Arc<View>);

impl<S> Layer<S> for WatchHealthLayer {
    type Service = WatchHealth<S>;

    fn layer(&self, inner: S) -> WatchHealth<S> {
        WatchHealth { inner, view: self.0.clone() }
    }
}

struct WatchHealth<S> {
    inner: S,
    view: Arc<View>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> Service<Request<B>> for WatchHealth<S>
where
    S: Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    R: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<R>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let reads_pods = request.method() == Method::GET && request.uri().path().ends_with("/pods");
        let view = self.view.clone();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            if reads_pods && response.status().is_success() {
                view.alive(std::time::Instant::now());
            }
            Ok(response)
        })
    }
}
