//! The admin port: `/healthz` (the process answers), `/readyz` (it takes AdmissionReviews; off
//! while draining), `/status` (what it depends on: the cluster view and the audit log; for
//! people and alerts, not for probes), `/metrics` (Prometheus text).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use super::app::App;

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }).fallback(get_only))
        .route("/readyz", get(readyz).fallback(get_only))
        .route("/status", get(status).fallback(get_only))
        .route("/metrics", get(metrics).fallback(get_only))
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                "no such path: the admin port serves /healthz, /readyz, /status and /metrics (GET)\n",
            )
        })
        .with_state(app)
}

async fn get_only() -> impl IntoResponse {
    (StatusCode::METHOD_NOT_ALLOWED, "the admin port answers GET only\n")
}

async fn readyz(State(app): State<Arc<App>>) -> impl IntoResponse {
    match app.readiness() {
        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")),
    }
}

async fn status(State(app): State<Arc<App>>) -> impl IntoResponse {
    match app.health() {
        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
        Err(problems) => (StatusCode::SERVICE_UNAVAILABLE, problems.iter().map(|p| format!("{p}\n")).collect()),
    }
}

async fn metrics(State(app): State<Arc<App>>) -> impl IntoResponse {
    app.update_gauges();
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], app.metrics.encode())
}
