//! `busyguard agent`: a sidecar that turns the app's own HTTP endpoint into the busy label, so
//! an app marks itself busy without code changes. It asks the endpoint every `--interval`, reads
//! busy or idle from the status code or the body, and PATCHes its own pod only when that
//! changes. If the app does not answer, the flag stays as it is (a busy pod is not handed over
//! to a scale-down because its app is slow to answer) and the agent says so; max-busy still
//! bounds it. A flip it reports this way is of a task already begun, so busyguard does not hold
//! it. With `--listen`, the app may ask before each task (`POST /start`): the agent flips the
//! pod busy then, and answers 409 "do not start" where busyguard holds the pod (its node going,
//! its eviction wanted), so no task is started that a disruption waits to cut.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::extract::State;
use axum::http::StatusCode;
use clap::Args;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use kube::Api;
use kube::api::{Patch, PatchParams};
use tracing::{info, warn};

use crate::cluster::ClusterSource;
use crate::cluster::view::ApiPod;
use crate::config::std_duration;
use crate::policy::keys::{AGENT_FIELD_MANAGER, AGENT_START_FIELD_MANAGER, BUSY_LABEL};
use crate::policy::outcome::{DISRUPTION_WANTED_CAUSE, NODE_GOING_CAUSE, TERMINATING_CAUSE};

/// The app's endpoint: plain HTTP, as a pod's own containers talk to each other.
fn app_url(value: &str) -> Result<http::Uri, String> {
    let url: http::Uri = value.parse().map_err(|e| format!("{value:?} is not a URL: {e}"))?;
    match (url.scheme_str(), url.host()) {
        (Some("http"), Some(_)) => Ok(url),
        _ => Err(format!(
            "{value:?}: give the app's endpoint as http://HOST:PORT/PATH (plain HTTP, on the pod's own network)"
        )),
    }
}

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// The app's endpoint, plain HTTP on the pod's own network, e.g. `http://127.0.0.1:8080/busy`.
    #[arg(long, env = "BUSYGUARD_AGENT_URL", value_parser = app_url)]
    pub url: http::Uri,
    #[command(flatten)]
    pub busy_when: BusyWhenArgs,
    /// How often the endpoint is asked.
    #[arg(long, env = "BUSYGUARD_AGENT_INTERVAL", default_value = "2s", value_parser = std_duration)]
    pub interval: Duration,
    /// This pod's name (the downward API's `metadata.name`): the pod whose busy label the agent sets.
    #[arg(long, env = "POD_NAME")]
    pub pod: String,
    /// This pod's namespace (the downward API's `metadata.namespace`).
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: String,
    /// Kubeconfig; without it, the pod's service account.
    #[arg(long, env = "BUSYGUARD_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Where the app asks before each task, `POST /start` (e.g. `127.0.0.1:8089`, the pod's own
    /// network): 200 start (the pod is busy now), 409 do not start (busyguard holds the pod),
    /// 503 busyguard could not be asked.
    #[arg(long, env = "BUSYGUARD_AGENT_LISTEN")]
    pub listen: Option<SocketAddr>,
}

/// What in the app's answer means busy: one of the two.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct BusyWhenArgs {
    /// The status code that means busy (e.g. 503 from a readiness endpoint that fails while
    /// busy); any other means idle.
    #[arg(long, env = "BUSYGUARD_AGENT_BUSY_STATUS", value_parser = clap::value_parser!(u16).range(100..=599))]
    pub busy_status: Option<u16>,
    /// Text whose presence in the body means busy; its absence means idle.
    #[arg(long, env = "BUSYGUARD_AGENT_BUSY_BODY")]
    pub busy_body: Option<String>,
}

impl AgentArgs {
    pub fn into_agent(self) -> (Agent, ClusterSource) {
        // clap requires one of the two.
        let busy_when = match self.busy_when.busy_status {
            Some(code) => BusyWhen::Status(code),
            None => BusyWhen::BodyContains(self.busy_when.busy_body.unwrap_or_default()),
        };
        let source = self.kubeconfig.map_or(ClusterSource::Infer, ClusterSource::Kubeconfig);
        let (url, interval, namespace, pod, listen) = (self.url, self.interval, self.namespace, self.pod, self.listen);
        (Agent { url, busy_when, interval, namespace, pod, listen }, source)
    }
}

/// How the app's answer says busy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BusyWhen {
    /// This status code means busy; any other means idle.
    Status(u16),
    /// A body containing this text means busy; any other answer means idle.
    BodyContains(String),
}

impl BusyWhen {
    /// Busy or idle, from one answer.
    pub fn busy(&self, status: u16, body: &[u8]) -> bool {
        match self {
            BusyWhen::Status(code) => status == *code,
            BusyWhen::BodyContains(text) => String::from_utf8_lossy(body).contains(text.as_str()),
        }
    }
}

pub struct Agent {
    /// `http://127.0.0.1:8080/busy`: plain HTTP, as a pod's own containers talk.
    pub url: http::Uri,
    pub busy_when: BusyWhen,
    pub interval: Duration,
    pub namespace: String,
    pub pod: String,
    /// Where the app asks before each task (`POST /start`), if it does.
    pub listen: Option<SocketAddr>,
}

/// The pod's flag as the agent last set it, and when the app last asked to start a task. Held
/// across each write, so the app's asks and the agent's reports are written one at a time.
#[derive(Default)]
struct Flag {
    set: Option<bool>,
    started: Option<Instant>,
}

/// What the agent's two sides share: the pod, and its flag.
struct Pod {
    api: Api<ApiPod>,
    name: String,
    flag: tokio::sync::Mutex<Flag>,
}

impl Agent {
    /// Runs until the process stops, setting the label through the API server of `config`.
    pub async fn run(self, config: kube::Config) -> anyhow::Result<()> {
        let api_server = config.cluster_url.to_string();
        let api: Api<ApiPod> = Api::namespaced(kube::Client::try_from(config)?, &self.namespace);
        let pod = Arc::new(Pod { api, name: self.pod.clone(), flag: Default::default() });
        if let Some(listen) = self.listen {
            let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("--listen {listen}"))?;
            let app = axum::Router::new().route("/start", axum::routing::post(start)).with_state(pod.clone());
            info!(%listen, "the app may ask before each task: POST /start");
            tokio::spawn(async move {
                if let Err(e) = axum::serve(listener, app).await {
                    warn!(%listen, error = %e, "the app can no longer ask before a task (POST /start)");
                }
            });
        }
        let mut failures = 0u32;
        loop {
            match self.ask_app().await {
                Ok(busy) => {
                    failures = 0;
                    self.report(&pod, busy, &api_server).await;
                }
                Err(e) => {
                    failures += 1;
                    // Said once, then every minute or so: the flag stays as it is meanwhile.
                    if failures == 1 || failures.is_multiple_of(60) {
                        warn!(url = %self.url, error = %e, failures, "the app does not answer; the busy flag stays as it is");
                    }
                }
            }
            tokio::time::sleep(self.interval).await;
        }
    }

    /// The app's state, as it said: written when it changed. A task the app asked to start is
    /// not reported idle within an interval of its start: the app may not say busy yet.
    async fn report(&self, pod: &Pod, busy: bool, api_server: &str) {
        let mut flag = pod.flag.lock().await;
        let just_started = flag.started.is_some_and(|at| at.elapsed() < self.interval);
        if flag.set == Some(busy) || (!busy && just_started) {
            return;
        }
        match set_flag(&pod.api, &pod.name, busy, AGENT_FIELD_MANAGER).await {
            Ok(()) => {
                info!(pod = %pod.name, busy, "busy flag set");
                flag.set = Some(busy);
            }
            Err(e) => warn!(pod = %pod.name, busy, %api_server, error = %e, "busy flag not set; trying again"),
        }
    }

    async fn ask_app(&self) -> anyhow::Result<bool> {
        let host = self.url.host().context("the URL has no host")?;
        let port = self.url.port_u16().unwrap_or(80);
        let tcp = tokio::time::timeout(self.interval, tokio::net::TcpStream::connect((host, port)))
            .await
            .context("no connection in time")??;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
        tokio::spawn(connection);
        let request =
            http::Request::get(self.url.clone()).header(http::header::HOST, host).body(Empty::<Bytes>::new())?;
        let answer = tokio::time::timeout(self.interval, async {
            let response = sender.send_request(request).await?;
            let status = response.status().as_u16();
            let body = response.into_body().collect().await?.to_bytes();
            anyhow::Ok((status, body))
        })
        .await
        .context("no answer in time")??;
        Ok(self.busy_when.busy(answer.0, &answer.1))
    }
}

/// busyguard's cause, where it refused a flip to busy because the pod is going.
fn going_cause(error: &kube::Error) -> Option<&str> {
    let kube::Error::Api(status) = error else { return None };
    let causes = status.details.as_ref().map(|details| details.causes.as_slice()).unwrap_or_default();
    (causes.iter().map(|c| c.reason.as_str()))
        .find(|cause| [TERMINATING_CAUSE, DISRUPTION_WANTED_CAUSE, NODE_GOING_CAUSE].contains(cause))
}

/// The app asks to start a task: the pod is flipped busy for it (from idle first, if the last
/// task left it busy, so the flip is judged as a new task's). 200: start; 409: busyguard holds the
/// pod, do not start; 503: busyguard could not be asked.
async fn start(State(pod): State<Arc<Pod>>) -> (StatusCode, String) {
    let mut flag = pod.flag.lock().await;
    let flipped = async {
        if flag.set == Some(true) {
            set_flag(&pod.api, &pod.name, false, AGENT_START_FIELD_MANAGER).await?;
            flag.set = Some(false);
        }
        set_flag(&pod.api, &pod.name, true, AGENT_START_FIELD_MANAGER).await
    };
    match flipped.await {
        Ok(()) => {
            (flag.set, flag.started) = (Some(true), Some(Instant::now()));
            (StatusCode::OK, "start: the pod is busy\n".into())
        }
        Err(e) => match (going_cause(&e).map(str::to_string), &e) {
            (Some(cause), kube::Error::Api(refused)) => {
                info!(pod = %pod.name, cause, "the app asked to start a task; busyguard holds the pod: do not start");
                (StatusCode::CONFLICT, format!("do not start ({cause}): {}\n", refused.message))
            }
            _ => {
                warn!(pod = %pod.name, error = %e, "the app asked to start a task; busyguard could not be asked");
                (StatusCode::SERVICE_UNAVAILABLE, format!("busyguard could not be asked: {e}\n"))
            }
        },
    }
}

async fn set_flag(pods: &Api<ApiPod>, pod: &str, busy: bool, manager: &str) -> Result<(), kube::Error> {
    let value = if busy { "true" } else { "false" };
    let patch = serde_json::json!({"metadata": {"labels": {BUSY_LABEL: value}}});
    let params = PatchParams { field_manager: Some(manager.to_string()), ..PatchParams::default() };
    pods.patch(pod, &params, &Patch::Merge(&patch)).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_is_read_from_the_status_code_or_the_body() {
        assert!(BusyWhen::Status(503).busy(503, b""));
        assert!(!BusyWhen::Status(503).busy(200, b"busy"));
        let body = BusyWhen::BodyContains("\"busy\":true".into());
        assert!(body.busy(200, br#"{"busy":true,"task":"t-1"}"#));
        assert!(!body.busy(200, br#"{"busy":false}"#));
    }

    #[test]
    fn a_flip_refused_because_the_pod_is_going_is_told_by_its_cause() {
        let refused: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": 409, "reason": "Conflict", "message": "pod jobs/w takes no new task",
            "details": {"causes": [{"reason": "BusyguardNodeGoing", "message": "..."}]}}))
        .unwrap();
        assert_eq!(going_cause(&kube::Error::Api(Box::new(refused.clone()))), Some("BusyguardNodeGoing"));
        let forbidden = kube::core::Status { details: None, code: 403, ..refused };
        assert_eq!(going_cause(&kube::Error::Api(Box::new(forbidden))), None);
    }
}
