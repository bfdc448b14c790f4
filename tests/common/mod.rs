//! A real busyguard on loopback with fresh certificates, and a client that talks to it the way
//! the kube-apiserver does: TLS, HTTP/1.1 keep-alive, `Content-Type: application/json`.
#![allow(dead_code)] // each test binary uses its own part of this

pub mod apiserver;
pub mod in_process;
pub mod invariants;
pub mod process;
pub mod rbac;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use busyguard::cli::{Cli, Command};
use busyguard::commands::certs::{self, CertsRequest};
use busyguard::server::tls::CertFiles;
use busyguard::server::{self, Limits, ServeConfig, Server};
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use rustls::ClientConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

pub struct TestServer {
    pub running: Option<Server>,
    pub webhook: SocketAddr,
    pub admin: SocketAddr,
    pub dir: tempfile::TempDir,
}

/// Polls `check` every 20 ms until it gives a value; panics after 10 s, naming `what`.
pub async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    for _ in 0..500 {
        if let Some(value) = check().await {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("not within 10s: {what}")
}

/// The CA and serving pair for localhost this test binary's servers share, written once.
static SHARED_CERTS: std::sync::LazyLock<tempfile::TempDir> = std::sync::LazyLock::new(|| {
    let dir = tempfile::tempdir().unwrap();
    fresh_certs(dir.path());
    dir
});

/// This test binary's CA and serving pair, copied into `dir` (a test may rewrite its copy).
pub fn shared_certs(dir: &Path) {
    for file in ["ca.crt", "tls.crt", "tls.key"] {
        std::fs::copy(SHARED_CERTS.path().join(file), dir.join(file)).unwrap();
    }
}

/// A new CA and serving pair for localhost in `dir`: for a test that tells two CAs apart.
pub fn fresh_certs(dir: &Path) {
    certs::ensure(&CertsRequest {
        dir: dir.to_path_buf(),
        dns_names: vec!["localhost".into()],
        ips: vec!["127.0.0.1".parse().unwrap()],
        valid_days: 30,
        force: true,
    })
    .unwrap();
}

/// `busyguard serve` with its default policy, on loopback ports of its own, certificates and
/// the audit log in `dir`, and timeouts short enough for tests.
pub fn test_config(dir: &Path) -> ServeConfig {
    let Command::Serve(defaults) = Cli::parse_from(["busyguard", "serve", "--no-cluster"]).command else {
        unreachable!()
    };
    let defaults = defaults.into_config();
    let default_limits = defaults.limits;
    ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        cert: CertFiles { cert: dir.join("tls.crt"), key: dir.join("tls.key") },
        cert_reload_interval: Duration::from_millis(50),
        limits: Limits {
            handshake_timeout: Duration::from_secs(2),
            header_read_timeout: Duration::from_secs(2),
            body_read_timeout: Duration::from_secs(2),
            ..default_limits
        },
        shutdown_timeout: Duration::from_secs(5),
        audit_log: Some(dir.join("audit.log")),
        ..defaults
    }
}

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// A server watching the pods of this API server, ready (its first list done).
    pub async fn with_cluster(api: &apiserver::ApiServer) -> Self {
        let server = Self::with_cluster_unready(api).await;
        server.wait_ready().await;
        server
    }

    /// As `with_cluster`, without waiting for the first list; the watch counts as stale after 2s.
    pub async fn with_cluster_unready(api: &apiserver::ApiServer) -> Self {
        Self::start_with(|config| {
            config.cluster.source = api.source();
            config.cluster.stale_after = Duration::from_secs(2);
        })
        .await
    }

    /// Until the view is listed and every audit line written (`/status` 200).
    pub async fn wait_ready(&self) {
        eventually("/status 200", async || (self.admin_get("/status").await.status == 200).then_some(())).await
    }

    pub async fn start_with(adjust: impl FnOnce(&mut ServeConfig)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        shared_certs(dir.path());
        let mut config = test_config(dir.path());
        adjust(&mut config);
        let running = server::start(config).await.unwrap();
        TestServer { webhook: running.webhook_addr, admin: running.admin_addr, running: Some(running), dir }
    }

    pub fn ca(&self) -> CertificateDer<'static> {
        ca_of(self.dir.path())
    }

    /// The audit lines written so far, once every line recorded before is.
    pub fn audit_lines(&self) -> Vec<Value> {
        if let Some(running) = &self.running {
            running.flush_audit(Duration::from_secs(10));
        }
        let text = std::fs::read_to_string(self.dir.path().join("audit.log")).unwrap_or_default();
        text.lines().map(|line| serde_json::from_str(line).expect("audit lines are JSON")).collect()
    }

    pub async fn connect(&self) -> TlsStream<TcpStream> {
        connect(self.webhook, &[self.ca()], &[b"http/1.1"]).await.expect("TLS handshake")
    }

    /// POSTs a body as the API server does, on a new connection.
    pub async fn post(&self, path: &str, body: impl Into<Bytes>) -> Answer {
        let mut sender = http1(self.connect().await).await;
        send(&mut sender, post_request(path, body)).await
    }

    /// POSTs an AdmissionReview and returns its `response`, insisting on a 200.
    pub async fn review(&self, path: &str, review: &Value) -> Value {
        let answer = self.post(path, serde_json::to_vec(review).unwrap()).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        let mut body = answer.json();
        assert_eq!(body["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(body["kind"], "AdmissionReview");
        assert_eq!(body["response"]["uid"], review["request"]["uid"], "the answer echoes the uid");
        body["response"].take()
    }

    pub async fn admin_get(&self, path: &str) -> Answer {
        admin_get(self.admin, path).await.expect("the admin port answers")
    }

    pub async fn metrics(&self) -> String {
        self.admin_get("/metrics").await.text()
    }

    /// The value of one exact series on `/metrics` (`name{labels}`), if it is there.
    pub async fn metric(&self, series: &str) -> Option<f64> {
        let text = self.metrics().await;
        text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }
}

/// GET on a plain-HTTP admin port; the error says why there was no answer (e.g. port closed).
pub async fn admin_get(admin: SocketAddr, path: &str) -> Result<Answer, String> {
    let mut sender = http1(TcpStream::connect(admin).await.map_err(|e| e.to_string())?).await;
    let request = hyper::Request::get(path).header("host", "admin").body(Full::new(Bytes::new())).unwrap();
    try_send(&mut sender, request).await
}

pub fn ca_of(dir: &Path) -> CertificateDer<'static> {
    CertificateDer::from_pem_file(dir.join("ca.crt")).unwrap()
}

/// A client trusting these CAs, offering these ALPN protocols.
pub fn client_config(cas: &[CertificateDer<'static>], alpn: &[&[u8]]) -> Arc<ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in cas {
        roots.add(ca.clone()).unwrap();
    }
    let mut config = ClientConfig::builder_with_provider(busyguard::crypto::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// A TLS connection to `localhost` at `addr`, trusting `cas`, offering `alpn`.
pub async fn connect(
    addr: SocketAddr,
    cas: &[CertificateDer<'static>],
    alpn: &[&[u8]],
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    TlsConnector::from(client_config(cas, alpn)).connect(ServerName::try_from("localhost").unwrap(), tcp).await
}

pub type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// An HTTP/1.1 client over `stream` (TLS to the webhook port, plain TCP to the admin port).
pub async fn http1<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(stream: S) -> Sender {
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.unwrap();
    tokio::spawn(connection);
    sender
}

/// A POST as the API server sends it; `?timeout=10s` unless the path has a query already.
pub fn post_request(path: &str, body: impl Into<Bytes>) -> hyper::Request<Full<Bytes>> {
    let uri = if path.contains('?') { path.to_string() } else { format!("{path}?timeout=10s") };
    hyper::Request::post(uri)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .header("accept", "application/json, */*")
        .header("user-agent", "kube-apiserver-admission")
        .body(Full::new(body.into()))
        .unwrap()
}

pub struct Answer {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

pub async fn send(sender: &mut Sender, request: hyper::Request<Full<Bytes>>) -> Answer {
    try_send(sender, request).await.expect("an HTTP answer")
}

/// As `send`, for callers that count failures instead of stopping at one. The error is
/// hyper's with its cause (a TLS alert, a reset).
pub async fn try_send(sender: &mut Sender, request: hyper::Request<Full<Bytes>>) -> Result<Answer, String> {
    let response = sender.send_request(request).await.map_err(|e| format!("{e:?}"))?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok(Answer { status, headers, body })
}

/// POSTs a review to `/validate` and insists on a 200 answer that allows it.
pub async fn review_allowed(sender: &mut Sender, body: Bytes) -> Result<Answer, String> {
    let answer = try_send(sender, post_request("/validate", body)).await?;
    let allowed = serde_json::from_slice::<Value>(&answer.body).is_ok_and(|a| a["response"]["allowed"] == true);
    if answer.status == 200 && allowed { Ok(answer) } else { Err(format!("{}: {}", answer.status, answer.text())) }
}

/// A fixture from `tests/fixtures/` (AdmissionReview bodies a real kube-apiserver sent).
/// A recorded review, its objects created an hour ago rather than when it was recorded: a pod
/// marked busy without a busy-since is protected for max-busy from its creation.
pub fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    let mut review: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let an_hour_ago = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second() - 3600).unwrap();
    for field in ["object", "oldObject"] {
        let created = &mut review["request"][field]["metadata"]["creationTimestamp"];
        if created.is_string() {
            *created = Value::String(an_hour_ago.to_string());
        }
    }
    review
}

/// The pod a review carries: `object`, or `oldObject` for a DELETE.
pub fn pod_mut(review: &mut Value) -> &mut Value {
    let request = &mut review["request"];
    if request["operation"] == "DELETE" { &mut request["oldObject"] } else { &mut request["object"] }
}

pub fn set_busy_label(review: &mut Value, value: &str) {
    pod_mut(review)["metadata"]["labels"]["busyguard.io/busy"] = Value::String(value.into());
}

/// The decoded JSONPatch operations of an admission response, or none.
pub fn patch_of(response: &Value) -> Vec<Value> {
    use base64::Engine;
    let Some(encoded) = response["patch"].as_str() else { return vec![] };
    assert_eq!(response["patchType"], "JSONPatch");
    let bytes = base64::engine::general_purpose::STANDARD.decode(encoded).unwrap();
    serde_json::from_slice(&bytes).unwrap()
}
