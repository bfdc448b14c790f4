//! What the watch sees happen to busy pods without a request: losses reported once, and busyguard's annotations repaired.

use super::*;

#[tokio::test]
async fn a_busy_pod_gone_while_the_watch_was_down_is_unaccounted_for_not_reported_lost() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("deleted-in-the-gap", since_minutes_ago(10)));
    let server = TestServer::with_cluster(&api).await;
    // The watch drops, the history is forgotten, and the pod is deleted before busyguard lists again.
    api.fail_lists(true);
    api.compact();
    api.drop_watches();
    api.remove_pod("capture", "deleted-in-the-gap");
    api.fail_lists(false);
    let events = api.wait_for(1, is_event).await;
    assert_eq!(events[0].body["reason"], "BusyPodUnaccounted");
    settle().await;
    let decisions: Vec<Value> = server.audit_lines().into_iter().map(|l| l["decision"].clone()).collect();
    assert_eq!(decisions, [json!("unaccounted")]);
    assert_eq!(server.metric("busyguard_busy_pods_unaccounted_total").await, Some(1.0));
    assert_eq!(server.metric(r#"busyguard_busy_pods_lost_total{cause="vanished"}"#).await, Some(0.0), "no false page");
}

#[tokio::test]
async fn busy_pods_lost_outside_admission_are_audited_and_counted() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("evicted-by-kubelet", since_minutes_ago(10)));
    api.put_pod(busy_pod("node-lost", since_minutes_ago(10)));
    api.put_pod(worker_pod("idle", false));
    let server = TestServer::with_cluster(&api).await;
    api.update_pod("capture", "evicted-by-kubelet", |pod| {
        pod["status"]["phase"] = json!("Failed");
        pod["status"]["reason"] = json!("Evicted");
    });
    api.remove_pod("capture", "node-lost");
    api.remove_pod("capture", "idle");
    eventually("two audit lines", async || (server.audit_lines().len() >= 2).then_some(())).await;
    settle().await;
    let mut lost: Vec<(Value, Value, Value)> = server
        .audit_lines()
        .into_iter()
        .map(|l| (l["decision"].clone(), l["reason"].clone(), l["name"].clone()))
        .collect();
    lost.sort_by_key(|(_, _, name)| name.to_string());
    assert_eq!(
        lost,
        vec![
            (json!("lost"), json!("failed"), json!("evicted-by-kubelet")),
            (json!("lost"), json!("vanished"), json!("node-lost"))
        ]
    );
    let failed = server.audit_lines().into_iter().find(|l| l["reason"] == "failed").unwrap();
    assert!(failed["detail"].as_str().unwrap().contains("(Evicted)"));
    // Reported as a Warning Event too, named for the pod so that one replica reports it.
    let events: Vec<Value> = api.writes().into_iter().filter(is_event).map(|c| c.body).collect();
    assert_eq!(events.len(), 2, "{events:#?}");
    assert!(events.iter().all(|e| e["reason"] == "BusyPodLost"));
    assert!(events.iter().any(|e| e["metadata"]["name"] == "busyguard-lost-uid-node-lost"));
    assert_eq!(server.metric(r#"busyguard_busy_pods_lost_total{cause="failed"}"#).await, Some(1.0));
    assert_eq!(server.metric(r#"busyguard_busy_pods_lost_total{cause="vanished"}"#).await, Some(1.0));
}

#[tokio::test]
async fn a_flip_to_idle_made_while_busyguard_was_down_is_restored_from_the_watch() {
    let api = ApiServer::start().await;
    // Idle, with busyguard's busy annotations still on: Karpenter and cluster-autoscaler would
    // leave its node alone for ever.
    let mut missed = busy_pod("missed", since_minutes_ago(30));
    missed["metadata"]["labels"]["busyguard.io/busy"] = json!("false");
    api.put_pod(missed);
    let _server = TestServer::with_cluster(&api).await;
    let patches = api.wait_for(1, pod_call("PATCH", "missed")).await;
    assert_eq!(
        patches[0].body["metadata"]["annotations"],
        json!({"busyguard.io/busy-since": null, "controller.kubernetes.io/pod-deletion-cost": "1",
               "busyguard.io/idle-cost": null, "karpenter.sh/do-not-disrupt": null,
               "cluster-autoscaler.kubernetes.io/safe-to-evict": null})
    );
    assert_eq!(
        api.pod("capture", "missed").unwrap()["metadata"]["annotations"]["controller.kubernetes.io/pod-deletion-cost"],
        "1"
    );
}

#[tokio::test]
async fn two_replicas_report_a_lost_busy_pod_once() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("node-lost", since_minutes_ago(10)));
    let (one, two) = (TestServer::with_cluster(&api).await, TestServer::with_cluster(&api).await);
    api.remove_pod("capture", "node-lost");
    api.wait_for(2, is_event).await;
    settle().await;
    let lines = |server: &TestServer| server.audit_lines().into_iter().filter(|l| l["decision"] == "lost").count();
    assert_eq!(lines(&one) + lines(&two), 1, "one audit line in all");
    let series = r#"busyguard_busy_pods_lost_total{cause="vanished"}"#;
    let counted = one.metric(series).await.zip(two.metric(series).await).map(|(one, two)| one + two);
    assert_eq!(counted, Some(1.0), "counted once, and at 0 on the other replica");
}

#[tokio::test]
async fn removing_the_busy_label_of_a_busy_pod_is_no_loss_restores_it_and_carries_out_its_deferred_delete() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("opting-out", since_minutes_ago(10)));
    let server = TestServer::with_cluster(&api).await;
    let review = delete_of(&api.pod("capture", "opting-out").unwrap(), "pod-delete-by-user.json");
    assert_eq!(server.review("/validate", &review).await["status"]["code"], 429);
    api.wait_for(1, pod_call("PATCH", "opting-out")).await;
    // The owner takes the pod out of busyguard's hands while it is busy (the mutating webhook
    // would restore its annotations; none runs here, so busyguard must).
    api.update_pod("capture", "opting-out", |pod| {
        pod["metadata"]["labels"].as_object_mut().unwrap().remove("busyguard.io/busy");
    });
    api.wait_for(1, pod_call("GET", "opting-out")).await;
    api.wait_for(1, pod_call("DELETE", "opting-out")).await;
    settle().await;
    let decisions: Vec<Value> = server.audit_lines().into_iter().map(|l| l["decision"].clone()).collect();
    assert_eq!(decisions, [json!("denied"), json!("deleted-when-idle")], "no false loss");
    assert_eq!(server.metric(r#"busyguard_busy_pods_lost_total{cause="vanished"}"#).await, Some(0.0));
}

#[tokio::test]
async fn a_pod_whose_busy_label_was_removed_is_restored_even_when_it_changes_in_between() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("opting-out", since_minutes_ago(10)));
    let _server = TestServer::with_cluster(&api).await;
    // Someone else writes the pod between busyguard's read and its write: 409.
    api.fault("PATCH", &format!("{POD_PATH}/opting-out"), [Fault::Status(409)]);
    api.update_pod("capture", "opting-out", |pod| {
        pod["metadata"]["labels"].as_object_mut().unwrap().remove("busyguard.io/busy");
    });
    // Out of the watch now, so no event brings it back: busyguard reads it again itself.
    api.wait_for(2, pod_call("PATCH", "opting-out")).await;
    let restored = api.pod("capture", "opting-out").unwrap();
    assert!(restored["metadata"]["annotations"].get("busyguard.io/busy-since").is_none(), "{restored}");
}

#[tokio::test]
async fn a_busy_pod_evicted_while_busyguard_was_not_guarding_is_reported_lost() {
    let api = ApiServer::start().await;
    api.put_pod(busy_pod("drained", since_minutes_ago(10)));
    let server = TestServer::with_cluster(&api).await;
    // The eviction went through without busyguard (down, or the view stale): the API server set
    // the pod's DisruptionTarget condition and started its deletion.
    api.update_pod("capture", "drained", |pod| {
        pod["metadata"]["deletionTimestamp"] = json!(Timestamp::now().to_string());
        pod["status"]["conditions"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}));
    });
    api.wait_for(1, is_event).await;
    eventually("a lost line", async || server.audit_lines().into_iter().find(|l| l["decision"] == "lost")).await;
    let line = server.audit_lines().into_iter().find(|l| l["decision"] == "lost").unwrap();
    assert_eq!(line["reason"], "disrupted");
    assert!(line["detail"].as_str().unwrap().contains("(EvictionByEvictionAPI)"), "{}", line["detail"]);
}
