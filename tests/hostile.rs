//! Hostile clients: thousands of idle connections, half-open TLS handshakes, headers and bodies
//! trickled a byte at a time. Each is bounded (connection count, time), and while each goes
//! on, a keep-alive connection opened before it, like the API server's, keeps getting answers.

mod common;

use std::time::{Duration, Instant};

use common::{TestServer, fixture, http1, review_allowed};
use hyper::body::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

const TIMEOUT: Duration = Duration::from_secs(1);
/// How long an answered connection may stay idle, here (the API server's clients keep theirs 90 s).
const KEPT_ALIVE: Duration = Duration::from_secs(3);

async fn server() -> TestServer {
    TestServer::start_with(|config| {
        config.limits.handshake_timeout = TIMEOUT;
        config.limits.header_read_timeout = TIMEOUT;
        config.limits.keep_alive_timeout = KEPT_ALIVE;
        config.limits.body_read_timeout = TIMEOUT;
        config.limits.max_connections = 256;
    })
    .await
}

/// Reviews every 20 ms on one keep-alive connection; the times they were answered at.
struct Heartbeat(JoinHandle<Vec<Instant>>, tokio::sync::watch::Sender<bool>);

impl Heartbeat {
    async fn start(server: &TestServer) -> Self {
        let mut sender = http1(server.connect().await).await;
        let body = Bytes::from(serde_json::to_vec(&fixture("pod-delete-by-user.json")).unwrap());
        let (stop, stopped) = tokio::sync::watch::channel(false);
        Heartbeat(
            tokio::spawn(async move {
                let mut answered = vec![Instant::now()];
                while !*stopped.borrow() {
                    review_allowed(&mut sender, body.clone()).await.expect("the heartbeat is answered, allowed");
                    answered.push(Instant::now());
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                answered
            }),
            stop,
        )
    }

    /// Stops and checks that no answer took longer than 500 ms to follow the one before.
    async fn assert_steady(self) {
        let _ = self.1.send(true);
        let answered = self.0.await.expect("every heartbeat answered, allowed");
        let longest = answered.windows(2).map(|w| w[1] - w[0]).max().unwrap();
        assert!(answered.len() > 20, "only {} answers", answered.len());
        assert!(longest < Duration::from_millis(500), "answers stopped for {longest:?}");
    }
}

/// Whether the server closes this connection within `within` (EOF or reset), not answering it.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buffer = [0u8; 256];
    loop {
        match tokio::time::timeout(within, stream.read(&mut buffer)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {} // a TLS alert or an HTTP error: wait for the close that follows
        }
    }
}

#[tokio::test]
async fn thousands_of_idle_connections_are_capped_and_closed_while_answers_keep_coming() {
    let server = server().await;
    let heartbeat = Heartbeat::start(&server).await;
    let started = Instant::now();
    let mut idle = Vec::new();
    for _ in 0..2000 {
        idle.push(TcpStream::connect(server.webhook).await.unwrap());
    }
    let closed = futures::future::join_all(idle.iter_mut().map(|s| closed_within(s, TIMEOUT + Duration::from_secs(3))));
    let closed = closed.await;
    assert!(closed.iter().all(|c| *c), "every idle connection closed by the server");
    assert!(started.elapsed() < TIMEOUT + Duration::from_secs(3));
    let refused = server.metric("busyguard_connections_refused_total").await.unwrap();
    assert!(refused >= 2000.0 - 256.0, "{refused} closed on accept");
    heartbeat.assert_steady().await;
    assert_eq!(
        server.review("/validate", &fixture("pod-delete-by-user.json")).await["allowed"],
        true,
        "new connections taken again"
    );
}

/// A TCP connection to `to` from the loopback address `from` (all of 127.0.0.0/8 is local).
async fn connect_from(from: [u8; 4], to: std::net::SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind((std::net::Ipv4Addr::from(from), 0).into()).unwrap();
    socket.connect(to).await.unwrap()
}

#[tokio::test]
async fn one_client_reconnecting_without_end_holds_its_share_of_connections_and_the_api_server_the_rest() {
    let server = TestServer::start_with(|config| {
        config.limits.header_read_timeout = Duration::from_secs(10);
        config.limits.max_connections = 100;
        config.limits.max_connections_per_peer = 40;
    })
    .await;
    let mut hog = Vec::new();
    for _ in 0..150 {
        hog.push(connect_from([127, 0, 0, 2], server.webhook).await);
    }
    let closed = futures::future::join_all(hog.iter_mut().map(|s| closed_within(s, Duration::from_millis(500)))).await;
    assert_eq!(closed.iter().filter(|c| **c).count(), 110, "all but its 40 closed on accept");
    assert_eq!(server.metric("busyguard_connections_refused_total").await, Some(110.0));
    // The API server, from another address, still gets its connections.
    assert_eq!(server.review("/validate", &fixture("pod-delete-by-user.json")).await["allowed"], true);
}

#[tokio::test]
async fn half_open_tls_handshakes_are_dropped_at_the_handshake_timeout_while_answers_keep_coming() {
    let server = server().await;
    let heartbeat = Heartbeat::start(&server).await;
    // A handshake record announcing 512 bytes, of which only the first few arrive.
    let partial_hello: &[u8] = &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03];
    let mut stalled = Vec::new();
    for _ in 0..200 {
        let mut tcp = TcpStream::connect(server.webhook).await.unwrap();
        tcp.write_all(partial_hello).await.unwrap();
        stalled.push(tcp);
    }
    let started = Instant::now();
    let closed =
        futures::future::join_all(stalled.iter_mut().map(|s| closed_within(s, TIMEOUT + Duration::from_secs(2)))).await;
    assert!(closed.iter().all(|c| *c), "every stalled handshake dropped");
    assert!(started.elapsed() > TIMEOUT / 2, "not before the handshake timeout: {:?}", started.elapsed());
    heartbeat.assert_steady().await;
}

/// Writes `bytes` one at a time, 100 ms apart, until they run out or the server closes.
async fn trickle(stream: &mut tokio_rustls::client::TlsStream<TcpStream>, bytes: &[u8]) {
    for byte in bytes {
        if stream.write_all(&[*byte]).await.is_err() || stream.flush().await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn trickled_headers_and_bodies_are_cut_off_at_their_deadlines_while_answers_keep_coming() {
    let server = server().await;
    let heartbeat = Heartbeat::start(&server).await;
    let head =
        b"POST /validate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 400\r\n\r\n";
    let clients = (0..50).map(|i| {
        let server = &server;
        let trickles_headers = i % 2 == 0;
        async move {
            let mut stream = server.connect().await;
            let started = Instant::now();
            if trickles_headers {
                trickle(&mut stream, head).await;
            } else {
                stream.write_all(head).await.unwrap();
                trickle(&mut stream, &[b' '; 400]).await;
            }
            let mut rest = Vec::new();
            let _ = stream.read_to_end(&mut rest).await;
            (trickles_headers, started.elapsed(), String::from_utf8_lossy(&rest).into_owned())
        }
    });
    // Sent whole, the headers would take 10 s and the body 40 s: each is cut off at its 1 s deadline.
    for (trickles_headers, took, answer) in futures::future::join_all(clients).await {
        assert!(took > TIMEOUT / 2 && took < TIMEOUT + Duration::from_secs(2), "cut off after {took:?}");
        if trickles_headers {
            assert_eq!(answer, "", "headers never finished: no answer, the connection closed");
        } else {
            assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        }
    }
    heartbeat.assert_steady().await;
}

/// Reads until the server closes the TLS connection (EOF or error) or `within` passes.
async fn tls_closed_within(stream: &mut tokio_rustls::client::TlsStream<TcpStream>, within: Duration) -> bool {
    let mut buffer = [0u8; 256];
    loop {
        match tokio::time::timeout(within, stream.read(&mut buffer)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn connections_that_send_nothing_or_half_a_preface_after_the_handshake_are_closed_whatever_the_protocol() {
    let server = server().await;
    let heartbeat = Heartbeat::start(&server).await;
    let mut silent = Vec::new();
    for i in 0..60 {
        let alpn: &[u8] = if i % 2 == 0 { b"h2" } else { b"http/1.1" };
        let mut stream = common::connect(server.webhook, &[server.ca()], &[alpn]).await.unwrap();
        if i % 3 == 0 {
            // The first bytes of the HTTP/2 preface, and then nothing: the version is never known.
            stream.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
            stream.flush().await.unwrap();
        }
        silent.push(stream);
    }
    let started = Instant::now();
    let closed =
        futures::future::join_all(silent.iter_mut().map(|s| tls_closed_within(s, TIMEOUT + Duration::from_secs(2))))
            .await;
    assert!(closed.iter().all(|c| *c), "every silent connection closed");
    assert!(started.elapsed() > TIMEOUT / 2, "not before the header timeout: {:?}", started.elapsed());
    heartbeat.assert_steady().await;
}

#[tokio::test]
async fn an_answered_connection_stays_open_idle_past_the_first_request_timeout_until_the_keep_alive_one() {
    let server = server().await;
    let body = Bytes::from(serde_json::to_vec(&fixture("pod-delete-by-user.json")).unwrap());
    let executor = hyper_util::rt::TokioExecutor::new();
    // HTTP/1.1, as the API server calls a Service's webhook, and HTTP/2.
    for alpn in [&b"http/1.1"[..], b"h2"] {
        let stream = common::connect(server.webhook, &[server.ca()], &[alpn]).await.unwrap();
        let io = hyper_util::rt::TokioIo::new(stream);
        let request = common::post_request("/validate", body.clone());
        // The senders are kept (`_kept`): a client that drops its sender closes the connection.
        let (status, ended, _kept): (_, _, Box<dyn std::any::Any>) = if alpn == b"h2" {
            let (mut sender, connection) = hyper::client::conn::http2::handshake(executor.clone(), io).await.unwrap();
            let ended = tokio::spawn(async move { connection.await.is_ok() });
            (sender.send_request(request).await.unwrap().status(), ended, Box::new(sender))
        } else {
            let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await.unwrap();
            let ended = tokio::spawn(async move { connection.await.is_ok() });
            (sender.send_request(request).await.unwrap().status(), ended, Box::new(sender))
        };
        assert_eq!(status, 200);
        let started = Instant::now();
        // The client keeps the connection; the server ends it once it has been idle for the
        // keep-alive timeout, not the first request's.
        tokio::time::timeout(KEPT_ALIVE + Duration::from_secs(2), ended).await.expect("closed by the server").unwrap();
        let idle = started.elapsed();
        let alpn = String::from_utf8_lossy(alpn);
        assert!(idle > KEPT_ALIVE - Duration::from_millis(500), "{alpn}: closed after {idle:?}, before its keep-alive");
    }
}

#[tokio::test]
async fn the_admin_port_caps_its_connections_and_closes_idle_ones_while_probes_get_answers() {
    let server = server().await;
    let mut idle = Vec::new();
    for _ in 0..100 {
        idle.push(TcpStream::connect(server.admin).await.unwrap());
    }
    let closed = futures::future::join_all(idle.iter_mut().map(|s| closed_within(s, TIMEOUT + Duration::from_secs(2))));
    assert!(closed.await.iter().all(|c| *c), "every idle admin connection closed");
    let refused = server.metric("busyguard_admin_connections_refused_total").await.unwrap();
    assert!(refused >= 100.0 - 64.0, "{refused} closed on accept");
    assert_eq!(server.admin_get("/readyz").await.status, 200);
}
