//! `busyguard agent`: a sidecar that turns the app's own HTTP endpoint into the busy label, so
//! an app marks itself busy without code changes. It asks the endpoint every `--interval`, reads
//! busy or idle from the status code or the body, and PATCHes its own pod only when that
//! changes. If the app does not answer, the flag stays as it is (a busy pod is not handed over
//! to a scale-down because its app is slow to answer) and the agent says so; max-busy still
//! bounds it.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use kube::Api;
use kube::api::{Patch, PatchParams};
use tracing::{info, warn};

use crate::cluster::ClusterSource;
use crate::cluster::view::ApiPod;
use crate::config::std_duration;
use crate::policy::keys::{BUSY_LABEL, FIELD_MANAGER};
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
        let agent =
            Agent { url: self.url, busy_when, interval: self.interval, namespace: self.namespace, pod: self.pod };
        (agent, source)
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
}

impl Agent {
    /// Runs until the process stops, setting the label through the API server of `config`.
    pub async fn run(self, config: kube::Config) -> anyhow::Result<()> {
        let api_server = config.cluster_url.to_string();
        let pods: Api<ApiPod> = Api::namespaced(kube::Client::try_from(config)?, &self.namespace);
        let mut flagged: Option<bool> = None;
        let mut failures = 0u32;
        loop {
            match self.ask_app().await {
                Ok(busy) => {
                    failures = 0;
                    if flagged != Some(busy) {
                        match flag(&pods, &self.pod, busy).await {
                            Ok(()) => {
                                info!(pod = %self.pod, busy, "busy flag set");
                                flagged = Some(busy);
                            }
                            Err(e) => match going_cause(&e) {
                                // The app has already started: the agent can only say so.
                                Some(cause) => warn!(pod = %self.pod, cause, error = %e,
                                    "busyguard refused the flip to busy: the pod is going and should not start a task; trying again"),
                                None => {
                                    warn!(pod = %self.pod, busy, %api_server, error = %e, "busy flag not set; trying again")
                                }
                            },
                        }
                    }
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

async fn flag(pods: &Api<ApiPod>, pod: &str, busy: bool) -> Result<(), kube::Error> {
    let value = if busy { "true" } else { "false" };
    let patch = serde_json::json!({"metadata": {"labels": {BUSY_LABEL: value}}});
    let params = PatchParams { field_manager: Some(format!("{FIELD_MANAGER}-agent")), ..PatchParams::default() };
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
