//! More work than busyguard takes on at once: reviews beyond max-in-flight are shed with a fast
//! 503, connections beyond max-connections are closed on accept, and a body slower than the
//! API server's own timeout is not waited for. Each is counted, and busyguard answers again as
//! soon as the load is gone.

mod common;

use std::time::{Duration, Instant};

use common::{TestServer, fixture};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Headers and the start of a body, then nothing: a review that holds its slot.
const STALLED_REVIEW: &[u8] = b"POST /validate?timeout=10s HTTP/1.1\r\nhost: localhost\r\n\
    content-type: application/json\r\ncontent-length: 5000\r\n\r\n{\"apiVersion\":";

#[tokio::test]
async fn a_review_beyond_the_body_memory_budget_is_shed_at_once_and_the_next_one_answered() {
    // Room for one announced 5000-byte body, not for a second body of the fixture's size.
    let server = TestServer::start_with(|config| config.limits.max_body_memory = 9_000).await;
    let mut holding = server.connect().await;
    holding.write_all(STALLED_REVIEW).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;

    let review = serde_json::to_vec(&fixture("pod-delete-by-user.json")).unwrap();
    let started = Instant::now();
    let shed = server.post("/validate", review.clone()).await;
    assert!(started.elapsed() < Duration::from_secs(1), "shed at once, took {:?}", started.elapsed());
    assert_eq!(shed.status, 503, "{}", shed.text());
    assert_eq!(shed.headers["retry-after"], "1");
    assert!(shed.text().contains("shed"), "{}", shed.text());
    assert!(!shed.text().contains("allowed"));
    assert_eq!(server.metric("busyguard_admission_reviews_shed_total").await, Some(1.0));

    drop(holding);
    common::eventually("answered again once the memory is free", async || {
        (server.post("/validate", review.clone()).await.status == 200).then_some(())
    })
    .await;
}

#[tokio::test]
async fn bodies_still_arriving_do_not_hold_the_review_slots() {
    // One review slot, held by nobody: a client trickling its body has not been given one.
    let server = TestServer::start_with(|config| config.limits.max_in_flight = 1).await;
    let mut trickling = Vec::new();
    for _ in 0..3 {
        let mut holding = server.connect().await;
        holding.write_all(STALLED_REVIEW).await.unwrap();
        trickling.push(holding);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let review = serde_json::to_vec(&fixture("pod-delete-by-user.json")).unwrap();
    assert_eq!(server.post("/validate", review).await.status, 200);
    assert_eq!(server.metric("busyguard_admission_reviews_shed_total").await, Some(0.0));
}

#[tokio::test]
async fn a_connection_beyond_max_connections_is_closed_at_once_and_a_later_one_served() {
    let server = TestServer::start_with(|config| config.limits.max_connections = 2).await;
    let first = server.connect().await;
    let _second = server.connect().await;
    tokio::time::sleep(Duration::from_millis(100)).await;

    let started = Instant::now();
    let refused = common::connect(server.webhook, &[server.ca()], &[b"http/1.1"]).await;
    assert!(refused.is_err(), "the third connection gets no TLS session");
    assert!(started.elapsed() < Duration::from_secs(1), "closed at once, took {:?}", started.elapsed());
    assert_eq!(server.metric("busyguard_connections_refused_total").await, Some(1.0));

    drop(first);
    let answered = common::eventually("a new connection once one is closed", async || {
        let stream = common::connect(server.webhook, &[server.ca()], &[b"http/1.1"]).await.ok()?;
        let mut sender = common::http1(stream).await;
        let review = serde_json::to_vec(&fixture("pod-delete-by-user.json")).unwrap();
        Some(common::send(&mut sender, common::post_request("/validate", review)).await)
    })
    .await;
    assert_eq!(answered.status, 200, "{}", answered.text());
}

#[tokio::test]
async fn a_body_slower_than_the_api_servers_timeout_is_refused_at_that_timeout() {
    // The test server waits 2s for a body; this API server gives up after 1s.
    let server = TestServer::start().await;
    let mut stream = server.connect().await;
    let request = String::from_utf8_lossy(STALLED_REVIEW).replace("timeout=10s", "timeout=1s");
    stream.write_all(request.as_bytes()).await.unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(6), stream.read_to_end(&mut answer)).await.unwrap().ok();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("did not arrive within 1s"), "{text}");
    assert!(started.elapsed() < Duration::from_millis(1900), "at the API server's 1s, took {:?}", started.elapsed());
}
