//! The audit trail under stress: concurrent denials and a shutdown lose or split no line; a
//! disk that refuses lines is reported (readiness, metric) while the denials still stand.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use common::{TestServer, eventually, fixture, http1, post_request, set_busy_label};
use http_body_util::BodyExt;
use serde_json::Value;

fn busy_delete(uid: &str) -> Vec<u8> {
    let mut review = fixture("pod-delete-by-user.json");
    set_busy_label(&mut review, "true");
    review["request"]["uid"] = Value::String(uid.into());
    serde_json::to_vec(&review).unwrap()
}

#[tokio::test]
async fn an_audit_log_on_a_full_disk_is_reported_while_the_replica_stays_ready_and_denials_stand() {
    let server = TestServer::start_with(|config| config.audit_log = Some(PathBuf::from("/dev/full"))).await;
    let answer = server.post("/validate", busy_delete("full-1")).await;
    assert_eq!(answer.json()["response"]["allowed"], false, "the busy pod stays protected");

    let status = eventually("the audit log reported failing", async || {
        let status = server.admin_get("/status").await;
        (status.status == 503 && status.text().starts_with("the audit log cannot be written")).then_some(status)
    })
    .await;
    let first = status.text().lines().next().map(String::from);
    assert_eq!(
        first.as_deref(),
        Some("the audit log cannot be written (No space left on device (os error 28)); 1 lines wait in memory")
    );
    // Each try of the writer's is counted.
    assert!(server.metric("busyguard_audit_write_errors_total").await >= Some(1.0));
    assert_eq!(server.metric("busyguard_audit_lines_held").await, Some(1.0));
    assert_eq!(server.metric("busyguard_audit_failing").await, Some(1.0));
    // Unready on every replica would fail every delete of an opted-in pod in the cluster.
    assert_eq!(server.admin_get("/readyz").await.status, 200, "still answering reviews: still ready");
}

/// Sends busy deletes on one keep-alive connection until the server stops answering; returns
/// the uids of the denials it got.
async fn deny_until_closed(server: &TestServer, worker: usize) -> Vec<String> {
    let mut sender = http1(server.connect().await).await;
    let mut denied = Vec::new();
    for i in 0.. {
        let uid = format!("w{worker}-{i}");
        let Ok(response) = sender.send_request(post_request("/validate", busy_delete(&uid))).await else { break };
        let Ok(body) = response.into_body().collect().await else { break };
        let answer: Value = serde_json::from_slice(&body.to_bytes()).unwrap();
        assert_eq!(answer["response"]["allowed"], false);
        denied.push(uid);
    }
    denied
}

#[tokio::test]
async fn every_denial_answered_under_concurrent_load_and_shutdown_has_one_whole_line() {
    let mut server = TestServer::start().await;
    let running = server.running.take().unwrap();
    let load = futures::future::join_all((0..8).map(|worker| deny_until_closed(&server, worker)));
    let stop = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        running.shutdown().await;
    };
    let (denied, ()) = tokio::join!(load, stop);

    let answered: Vec<String> = denied.into_iter().flatten().collect();
    let lines: Vec<String> =
        server.audit_lines().iter().map(|line| line["uid"].as_str().unwrap().to_string()).collect();
    assert!(answered.len() > 50, "only {} denials before the shutdown", answered.len());
    let unique: BTreeSet<&String> = lines.iter().collect();
    assert_eq!(unique.len(), lines.len(), "no line written twice");
    assert_eq!(unique, answered.iter().collect(), "one line for each denial answered, and none for any other");
}
