//! busyguard's routes in-process (no TLS, no sockets), over a view of the fixtures' pods.

use std::sync::Arc;

use axum::body::Body;
use busyguard::audit::AuditLog;
use busyguard::cluster::Cluster;
use busyguard::metrics::Metrics;
use busyguard::policy::{Mode, PolicyConfig};
use busyguard::server::{App, webhook};
use http_body_util::BodyExt;
use serde_json::Value;

use super::invariants::{policy, view_of};
use super::{fixture, test_config};

/// The app over a listed view holding the pods the delete fixtures carry, so an eviction of
/// one of them is judged.
pub fn app() -> Arc<App> {
    app_in(Mode::Enforce)
}

/// As [`app`], in `mode`.
pub fn app_in(mode: Mode) -> Arc<App> {
    let deleted: Vec<Value> = ["pod-delete-by-replicaset-controller.json", "pod-delete-by-user.json"]
        .map(|name| fixture(name)["request"]["oldObject"].clone())
        .into();
    let mut evicted = deleted[0].clone();
    evicted["metadata"]["name"] = fixture("pod-eviction-by-user.json")["request"]["name"].clone();
    let view = view_of(&[&deleted[0], &deleted[1], &evicted]);
    let metrics = Arc::new(Metrics::default());
    let audit = Arc::new(AuditLog::to(Box::new(std::io::sink()), metrics.audit.clone()));
    let limits = test_config(std::path::Path::new("/nonexistent")).limits;
    let cluster = Cluster { view: Arc::new(view), outbox: None, budgets: None };
    let app = App::new(PolicyConfig { mode, ..policy() }, audit, metrics, limits, cluster);
    app.start_serving();
    Arc::new(app)
}

/// `review` posted to `path`: the status and the answer.
pub async fn post(app: &App, path: &str, review: &Value) -> (u16, Value) {
    let request = http::Request::post(format!("{path}?timeout=5s"))
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(review).unwrap()))
        .unwrap();
    let response = webhook::route(app, request, None).await;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap())
}
