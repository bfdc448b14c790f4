//! The TLS face of the webhook port: protocols, ALPN, and certificates that change under a
//! running server without a single failed handshake.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{TestServer, ca_of, connect, fixture, fresh_certs, post_request, review_allowed, send, test_config};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

const RELOADS_OK: &str = r#"busyguard_tls_reloads_total{result="ok"}"#;
const RELOADS_ERROR: &str = r#"busyguard_tls_reloads_total{result="error"}"#;

async fn served_leaf(addr: std::net::SocketAddr, cas: &[CertificateDer<'static>]) -> CertificateDer<'static> {
    let stream = connect(addr, cas, &[b"http/1.1"]).await.unwrap();
    stream.get_ref().1.peer_certificates().unwrap()[0].clone().into_owned()
}

fn leaf_in(dir: &Path) -> CertificateDer<'static> {
    use rustls_pki_types::pem::PemObject;
    CertificateDer::from_pem_file(dir.join("tls.crt")).unwrap()
}

/// Load until stopped, as the API server sends it across a rotation: one client opening a new
/// connection (full handshake) for each review, one sending reviews on a keep-alive connection
/// opened before. Returns (answered, failed).
fn keep_reviewing(
    addr: std::net::SocketAddr,
    cas: Vec<CertificateDer<'static>>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(usize, usize)> {
    let body = Bytes::from(serde_json::to_vec(&fixture("pod-delete-by-user.json")).unwrap());
    tokio::spawn(async move {
        let mut kept = common::http1(connect(addr, &cas, &[b"http/1.1"]).await.unwrap()).await;
        let (mut ok, mut failed) = (0, 0);
        while !stop.load(Ordering::Relaxed) {
            let fresh = async {
                let stream = connect(addr, &cas, &[b"http/1.1"]).await.map_err(|e| e.to_string())?;
                review_allowed(&mut common::http1(stream).await, body.clone()).await
            };
            for result in [fresh.await, review_allowed(&mut kept, body.clone()).await] {
                match result {
                    Ok(_) => ok += 1,
                    Err(e) => {
                        eprintln!("review failed: {e}");
                        failed += 1;
                    }
                }
            }
        }
        (ok, failed)
    })
}

/// Staged beside and renamed over, as `busyguard certs` writes: a reader sees old or new, never half.
fn replace_file(path: &Path, contents: &[u8]) {
    let staged = path.with_extension("new");
    std::fs::write(&staged, contents).unwrap();
    std::fs::rename(&staged, path).unwrap();
}

/// Polls until the server presents `expected`, for at most 5 s.
async fn wait_until_serving(
    addr: std::net::SocketAddr,
    cas: &[CertificateDer<'static>],
    expected: &CertificateDer<'_>,
) {
    for _ in 0..100 {
        if served_leaf(addr, cas).await == *expected {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the new certificate was not served within 5 s");
}

#[tokio::test]
async fn answers_over_h2_and_http1_as_alpn_negotiates() {
    let server = TestServer::start().await;
    let body = serde_json::to_vec(&fixture("pod-delete-by-user.json")).unwrap();

    let h2 = connect(server.webhook, &[server.ca()], &[b"h2"]).await.unwrap();
    assert_eq!(h2.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), hyper_util::rt::TokioIo::new(h2))
            .await
            .unwrap();
    tokio::spawn(connection);
    let request = hyper::Request::post("https://localhost/validate")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.clone())))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let answer: serde_json::Value =
        serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(answer["response"]["allowed"], true);

    let http1 = connect(server.webhook, &[server.ca()], &[b"http/1.1"]).await.unwrap();
    assert_eq!(http1.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let mut sender = common::http1(http1).await;
    // Keep-alive: several reviews on one connection, as the API server sends them.
    for _ in 0..3 {
        assert_eq!(send(&mut sender, post_request("/validate", body.clone())).await.status, 200);
    }
}

#[tokio::test]
async fn tls_1_2_is_accepted_and_older_versions_are_refused() {
    let server = TestServer::start().await;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(server.ca()).unwrap();
    let tls12_only = rustls::ClientConfig::builder_with_provider(busyguard::crypto::provider())
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = TcpStream::connect(server.webhook).await.unwrap();
    let stream = TlsConnector::from(Arc::new(tls12_only))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    assert_eq!(stream.get_ref().1.protocol_version(), Some(rustls::ProtocolVersion::TLSv1_2));

    // The same ClientHello at version 1.2 is answered with a ServerHello, at 1.1 with a
    // protocol_version alert: only the version differs.
    assert_eq!(first_reply(server.webhook, [0x03, 0x03]).await[0], 0x16, "TLS 1.2 hello gets a handshake record");
    let refused = first_reply(server.webhook, [0x03, 0x02]).await;
    assert_eq!((refused[0], refused[6]), (0x15, 70), "TLS 1.1 hello gets a protocol_version alert: {refused:?}");
    let refused = first_reply(server.webhook, [0x03, 0x01]).await;
    assert_eq!((refused[0], refused[6]), (0x15, 70), "TLS 1.0 hello gets a protocol_version alert: {refused:?}");
}

/// Sends a minimal ClientHello of the given legacy version (no supported_versions extension)
/// and returns the first 7 bytes of the answer.
async fn first_reply(addr: std::net::SocketAddr, version: [u8; 2]) -> [u8; 7] {
    let mut hello = version.to_vec();
    hello.extend([7u8; 32]); // random
    hello.push(0); // no session id
    hello.extend([0x00, 0x02, 0xc0, 0x2b]); // TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
    hello.extend([0x01, 0x00]); // null compression
    let extensions: &[u8] = &[
        0x00, 0x0a, 0x00, 0x04, 0x00, 0x02, 0x00, 0x17, // supported_groups: secp256r1
        0x00, 0x0b, 0x00, 0x02, 0x01, 0x00, // ec_point_formats: uncompressed
        0x00, 0x0d, 0x00, 0x04, 0x00, 0x02, 0x04, 0x03, // signature_algorithms: ecdsa_secp256r1_sha256
    ];
    hello.extend([0x00, extensions.len() as u8]);
    hello.extend(extensions);
    let mut handshake = vec![0x01, 0x00, (hello.len() >> 8) as u8, hello.len() as u8];
    handshake.extend(&hello);
    let mut record = vec![0x16, 0x03, 0x01, (handshake.len() >> 8) as u8, handshake.len() as u8];
    record.extend(&handshake);
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(&record).await.unwrap();
    let mut reply = [0u8; 7];
    tokio::time::timeout(Duration::from_secs(5), tcp.read_exact(&mut reply)).await.unwrap().unwrap();
    reply
}

#[tokio::test]
async fn plaintext_http_to_the_tls_port_gets_no_answer_and_the_server_keeps_serving() {
    let server = TestServer::start().await;
    let mut tcp = TcpStream::connect(server.webhook).await.unwrap();
    tcp.write_all(b"POST /validate HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}").await.unwrap();
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut reply)).await.unwrap().ok();
    assert!(!reply.starts_with(b"HTTP/"), "no HTTP answer in plaintext: {:?}", String::from_utf8_lossy(&reply));
    assert_eq!(server.review("/validate", &fixture("pod-delete-by-user.json")).await["allowed"], true);
}

#[tokio::test]
async fn rewritten_certificate_files_are_served_under_load_without_a_failed_request() {
    let server = TestServer::start().await;
    let next = tempfile::tempdir().unwrap();
    fresh_certs(next.path());
    let cas = vec![server.ca(), ca_of(next.path())];
    let stop = Arc::new(AtomicBool::new(false));
    let hammer = keep_reviewing(server.webhook, cas.clone(), stop.clone());
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Replaced the way `busyguard certs --force` does: key, then certificate, each renamed over.
    for name in ["tls.key", "tls.crt"] {
        replace_file(&server.dir.path().join(name), &std::fs::read(next.path().join(name)).unwrap());
    }
    wait_until_serving(server.webhook, &cas, &leaf_in(next.path())).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let (ok, failed) = hammer.await.unwrap();
    assert_eq!(failed, 0, "no review failed across the reload ({ok} answered)");
    assert!(ok > 10, "the clients kept sending throughout ({ok})");
    assert_eq!(server.metric(RELOADS_OK).await, Some(1.0), "exactly one reload took effect");
}

/// The layout the kubelet gives a Secret volume: files are links through `..data`, which is
/// swapped atomically to a new timestamped folder on update.
fn secret_volume(dir: &Path, generation: &str, source: &Path) {
    let target = dir.join(generation);
    std::fs::create_dir(&target).unwrap();
    for name in ["tls.crt", "tls.key", "ca.crt"] {
        std::fs::copy(source.join(name), target.join(name)).unwrap();
    }
    let staged = dir.join("..data_tmp");
    std::os::unix::fs::symlink(generation, &staged).unwrap();
    std::fs::rename(&staged, dir.join("..data")).unwrap();
    for name in ["tls.crt", "tls.key", "ca.crt"] {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{name}"), &link).unwrap();
        }
    }
}

#[tokio::test]
async fn a_secret_volume_symlink_swap_is_followed_under_load_without_a_failed_request() {
    let first = tempfile::tempdir().unwrap();
    let second = tempfile::tempdir().unwrap();
    fresh_certs(first.path());
    fresh_certs(second.path());
    let volume = tempfile::tempdir().unwrap();
    secret_volume(volume.path(), "..2026_11_21_20_00_00.1", first.path());
    let volume_path = volume.path().to_path_buf();
    let server = TestServer::start_with(|config| {
        let mounted = test_config(&volume_path);
        config.cert = mounted.cert;
    })
    .await;
    let cas = vec![ca_of(first.path()), ca_of(second.path())];
    assert_eq!(served_leaf(server.webhook, &cas).await, leaf_in(first.path()));

    let stop = Arc::new(AtomicBool::new(false));
    let hammer = keep_reviewing(server.webhook, cas.clone(), stop.clone());
    tokio::time::sleep(Duration::from_millis(200)).await;
    secret_volume(volume.path(), "..2026_11_21_21_00_00.2", second.path());
    wait_until_serving(server.webhook, &cas, &leaf_in(second.path())).await;
    stop.store(true, Ordering::Relaxed);
    let (ok, failed) = hammer.await.unwrap();
    assert_eq!(failed, 0, "no review failed across the swap ({ok} answered)");
    assert!(ok > 10, "the clients kept sending throughout ({ok})");
}

#[tokio::test]
async fn a_bad_new_pair_keeps_the_last_good_one_in_service() {
    let server = TestServer::start().await;
    let good = served_leaf(server.webhook, &[server.ca()]).await;
    // At 0 from the start, so that the alert's `increase()` sees the first rejection.
    assert_eq!(server.metric(RELOADS_ERROR).await, Some(0.0));
    replace_file(&server.dir.path().join("tls.crt"), b"-----BEGIN CERTIFICATE-----\nnot base64\n");
    // Two reload intervals and more: the bad file has been looked at and rejected.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(served_leaf(server.webhook, &[server.ca()]).await, good);
    assert_eq!(server.metric(RELOADS_ERROR).await, Some(1.0));
    assert_eq!(server.metric(RELOADS_OK).await, Some(0.0), "nothing was reloaded");

    // A certificate whose key is not the key file's is refused too.
    let other = tempfile::tempdir().unwrap();
    fresh_certs(other.path());
    replace_file(&server.dir.path().join("tls.crt"), &std::fs::read(other.path().join("tls.crt")).unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(served_leaf(server.webhook, &[server.ca()]).await, good);
    assert_eq!(server.metric(RELOADS_ERROR).await, Some(2.0));
    assert_eq!(server.metric(RELOADS_OK).await, Some(0.0), "nothing was reloaded");
}
