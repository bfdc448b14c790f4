//! Stopping without dropping a request: in-flight reviews are answered, readiness goes down
//! first, new connections are refused; a second signal does not wait.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::process::Process;
use common::{TestServer, ca_of, connect, fixture};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A review sent in two halves, so that it is in flight while the server is told to stop.
struct HalfSent {
    stream: tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    rest: Vec<u8>,
}

async fn send_half(addr: SocketAddr, ca: &rustls_pki_types::CertificateDer<'static>) -> HalfSent {
    let body = serde_json::to_vec(&fixture("pod-delete-by-user.json")).unwrap();
    let head = format!(
        "POST /validate?timeout=10s HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let mut stream = connect(addr, std::slice::from_ref(ca), &[b"http/1.1"]).await.unwrap();
    let (first, rest) = body.split_at(body.len() / 2);
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(first).await.unwrap();
    stream.flush().await.unwrap();
    HalfSent { stream, rest: rest.to_vec() }
}

impl HalfSent {
    /// Sends the rest and returns the whole answer (the server closes the connection after it).
    async fn finish(mut self) -> String {
        self.stream.write_all(&self.rest).await.unwrap();
        self.stream.flush().await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), self.stream.read_to_end(&mut answer)).await.unwrap().ok();
        String::from_utf8_lossy(&answer).into_owned()
    }
}

#[tokio::test]
async fn shutdown_answers_the_request_in_flight_and_refuses_new_connections() {
    let mut server = TestServer::start().await;
    let in_flight = send_half(server.webhook, &server.ca()).await;
    tokio::time::sleep(Duration::from_millis(100)).await;

    let running = server.running.take().unwrap();
    let stopping = tokio::spawn(running.shutdown());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(server.admin_get("/readyz").await.status, 503, "not ready while draining");
    assert!(
        connect(server.webhook, &[server.ca()], &[b"http/1.1"]).await.is_err(),
        "no new connections while draining"
    );
    assert!(!stopping.is_finished(), "waits for the request in flight");

    let answer = in_flight.finish().await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains(r#""allowed":true"#), "{answer}");
    tokio::time::timeout(Duration::from_secs(5), stopping).await.expect("drained promptly").unwrap();
}

/// `busyguard certs`, then `busyguard serve` with a review in flight: the process, and the
/// review waiting for the rest of its body.
async fn serving_with_a_request_in_flight(dir: &std::path::Path) -> (Process, HalfSent) {
    common::process::certs(dir);
    let process = Process::serve(dir, &[]);
    let addr = process.webhook;
    let in_flight = send_half(addr, &ca_of(&dir.join("certs"))).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    (process, in_flight)
}

#[tokio::test]
async fn sigterm_drains_the_request_in_flight_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let (mut process, in_flight) = serving_with_a_request_in_flight(dir.path()).await;
    process.signal("TERM");
    process.wait_for_log("shutting down: draining in-flight requests; a second signal aborts");
    let answer = in_flight.finish().await;
    assert!(answer.starts_with("HTTP/1.1 200") && answer.contains(r#""allowed":true"#), "{answer}");
    assert_eq!(process.wait_exit().code(), Some(0));
}

#[tokio::test]
async fn a_second_signal_aborts_without_waiting_for_the_drain() {
    let dir = tempfile::tempdir().unwrap();
    let (mut process, _stalled) = serving_with_a_request_in_flight(dir.path()).await;
    process.signal("TERM");
    process.wait_for_log("shutting down: draining in-flight requests; a second signal aborts");
    process.signal("INT");
    assert_eq!(process.wait_exit().code(), Some(130));
}
