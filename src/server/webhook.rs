//! The webhook port: `POST /mutate` and `POST /validate` ([`route`]). Each review is read within its
//! limits, decoded, judged, audited and answered ([`answer`]). Anything that is not a judgeable
//! request gets an HTTP 4xx with a JSON error, never an AdmissionReview, so it can never read as
//! "allowed".

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Version, header};
use axum::response::{IntoResponse, Response};
use futures::future::Either;
use http_body_util::BodyExt;
use jiff::Timestamp;
use tracing::{Instrument, Span, debug, debug_span, field, warn};

use super::app::App;
use super::listen::HttpService;
use super::review_metrics::ReviewKey;
use crate::admission::review::{self, AdmissionRequest, AdmissionResponse, InvalidReview};
use crate::admission::{DecisionInputs, Resource, Unanswerable, Webhook, admit};
use crate::cluster::arbiter::Budgets;
use crate::cluster::outbox::Queued;
use crate::duration::parse_positive_duration;
use crate::metrics::{StatusLabels, WouldDenyLabels};
use crate::policy::SHARED_CONTROLLER_MANAGER_USER;
use crate::policy::budget;
use crate::policy::outcome::{BudgetClaim, Decision, Effect, Outcome, Reason};

/// The API server's own limit on a request body is 3 MiB plus overhead; 7 MiB leaves room for
/// an object and its old version.
pub const MAX_BODY_BYTES: usize = 7 * 1024 * 1024;

/// The webhook port's service for the connection from `peer`: every request to [`route`], over
/// hyper directly (a router's layers cost more than two paths need).
pub(crate) fn service(app: Arc<App>, peer: SocketAddr) -> impl HttpService {
    hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
        let app = app.clone();
        async move { Ok::<_, Infallible>(route(&app, request.map(Body::new), Some(peer)).await) }
    })
}

/// `POST /mutate` and `POST /validate`; 405 for another method, 404 for another path. `peer`:
/// the client's address, for the log line of a refusal.
pub async fn route(app: &App, request: Request, peer: Option<SocketAddr>) -> Response {
    let refused = |error: HttpError| error.into_counted_response(app, peer);
    let webhook = match request.uri().path() {
        "/mutate" => Webhook::Mutating,
        "/validate" => Webhook::Validating,
        _ => {
            return refused(HttpError::new(
                StatusCode::NOT_FOUND,
                "no such path: webhooks are served on /mutate and /validate",
            ));
        }
    };
    if request.method() != Method::POST {
        return refused(HttpError::new(StatusCode::METHOD_NOT_ALLOWED, "AdmissionReviews are sent with POST"));
    }
    answer(app, webhook, request).await.unwrap_or_else(refused)
}

/// One review, in named steps: read it within the limits, admit it, have the arbiter record a
/// pod let go under its workload's budget, write its audit line, hand its side effects to the
/// outbox (awaited where the decision says), and respond.
async fn answer(app: &App, webhook: Webhook, request: Request) -> Result<Response, HttpError> {
    let review = read(app, request).await?;
    let started = Instant::now();
    let request = review::decode(&review.body)?;
    // Debug level: at info, a review costs no tracing work; its audit line is the record.
    let span = debug_span!(
        "review",
        uid = %request.uid,
        kind = %request.kind.kind,
        namespace = %request.namespace,
        name = %request.name,
        operation = request.operation.as_str(),
        decision = field::Empty,
    );
    let mut outcome = span.in_scope(|| judge(app, webhook, &request, review.arrived))?;
    // What is left of the API server's timeout for the arbiter and the side effects.
    let time_left = || effects_budget(review.timeout).saturating_sub(review.arrived.elapsed());
    if let (Some(claim), Some(budgets)) = (outcome.budget.take(), &app.cluster.budgets)
        && let Some(refusal) = arbitrate(budgets, *claim, time_left()).instrument(span.clone()).await
    {
        outcome = refusal;
    }
    if let Some(record) = &outcome.audit {
        app.audit.record(record);
    }
    // Encoded before the side effects go out: they cannot change it.
    let encoded = AdmissionResponse::of(&request.uid, &outcome.answer).encode();
    let waiting = send_effects(app, outcome.effects);
    if outcome.await_effects && !waiting.is_empty() {
        await_effects(waiting, time_left(), &request.uid).instrument(span).await;
    }
    let resource = Resource::of(&request);
    match (outcome.decision, &outcome.audit) {
        (Decision::WouldDeny, Some(record)) => {
            let labels = WouldDenyLabels { route: resource.label(), reason: record.reason.as_str() };
            app.metrics.would_deny.get_or_create(&labels).inc();
        }
        // Told in audit mode too: the writer would fight busyguard once it enforces.
        (_, Some(record)) if record.reason == Reason::Overwritten => {
            app.metrics.busy_marks_overwritten.inc();
            app.note_overwrite(&record.detail);
        }
        _ => {}
    }
    let key = ReviewKey { webhook, resource, operation: request.operation, decision: outcome.decision };
    let response = respond(app, key, encoded, review.http1);
    app.review_metrics.timed(&app.metrics, key, started.elapsed().as_secs_f64());
    Ok(response)
}

/// A pod let go within its workload's budget is recorded with the arbiter (`policy::budget`)
/// before the answer: if another replica took the budget's last place meanwhile, the decision's
/// own refusal is the answer. Without an answer from the arbiter in time, refused too
/// ([`budget::unrecorded`]). `None`: the pod goes as decided. The outcome itself is not passed
/// through: the arbiter needs only the claim.
async fn arbitrate(budgets: &Budgets, claim: BudgetClaim, deadline: Duration) -> Option<Outcome> {
    match tokio::time::timeout(deadline, budgets.claim(&claim)).await {
        Ok(Ok(true)) => None,
        Ok(Ok(false)) => Some(*claim.refusal),
        Ok(Err(why)) => Some(budget::unrecorded(claim, &why.0)),
        Err(_) => Some(budget::unrecorded(claim, &format!("no answer within {deadline:?}"))),
    }
}

/// A review's body, read within the limits, and the permits it holds until it is answered.
struct Received<'a> {
    body: Bytes,
    arrived: Instant,
    /// The API server's `?timeout=` (or the default), from `arrived`.
    timeout: Duration,
    http1: bool,
    _body_memory: tokio::sync::SemaphorePermit<'a>,
    _in_flight: tokio::sync::SemaphorePermit<'a>,
}

/// Reads the body within its limits: memory for it reserved first, a review slot taken once it
/// is in. None left of either means shed now (503) rather than answer late.
async fn read(app: &App, request: Request) -> Result<Received<'_>, HttpError> {
    let arrived = Instant::now();
    let http1 = request.version() < Version::HTTP_2;
    let declared = check_headers(request.headers(), http1)?;
    let timeout = api_server_timeout(request.uri().query());
    // Memory for the body, reserved before reading it: its announced length, or the most a body
    // may have, so many large bodies at once cannot exhaust memory.
    let reserve = declared.map_or(MAX_BODY_BYTES as u64, |length| length.clamp(1, MAX_BODY_BYTES as u64));
    let reserve = u32::try_from(reserve).unwrap_or(u32::MAX);
    let Ok(body_memory) = app.body_memory.try_acquire_many(reserve) else {
        app.metrics.reviews_shed.inc();
        return Err(HttpError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "busyguard is reading as many request bodies as its memory allows: shed, retry",
        ));
    };
    // The API server gives up at its timeout: a body still arriving then is not worth waiting for.
    let body = read_body(request.into_body(), app.limits.body_read_timeout.min(timeout), !http1).await?;
    // Taken once the body is in, so clients trickling bodies cannot hold every slot.
    let Ok(in_flight) = app.in_flight.try_acquire() else {
        app.metrics.reviews_shed.inc();
        return Err(HttpError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("busyguard is handling {} reviews already: shed, retry", app.limits.max_in_flight),
        ));
    };
    Ok(Received { body, arrived, timeout, http1, _body_memory: body_memory, _in_flight: in_flight })
}

/// The decision on a decoded review, made on the view as of its arrival.
fn judge(app: &App, webhook: Webhook, request: &AdmissionRequest, arrived: Instant) -> Result<Outcome, HttpError> {
    warn_of_a_shared_controller_identity(app, request);
    let inputs = DecisionInputs { policy: &app.policy, view: &app.cluster.view, arrived };
    let outcome = admit(request, webhook, &inputs, Timestamp::now())?;
    Span::current().record("decision", outcome.decision.as_str());
    match &outcome.audit {
        Some(record) => {
            debug!(reason = record.reason.as_str(), user = %record.user, detail = %record.detail, "audited")
        }
        None => debug!("answered"),
    }
    Ok(outcome)
}

/// Waits for the side effects the answer depends on, within what is left of the API server's
/// timeout.
async fn await_effects(waiting: Vec<Queued>, budget: Duration, uid: &str) {
    if tokio::time::timeout(budget, futures::future::join_all(waiting)).await.is_err() {
        warn!(uid, ?budget, "answering before every pod was updated; the updates go on");
    }
}

/// The encoded answer as an HTTP response, counted under the review's labels.
fn respond(app: &App, key: ReviewKey, encoded: Vec<u8>, http1: bool) -> Response {
    app.review_metrics.answered(&app.metrics, key);
    let mut response = ([(header::CONTENT_TYPE, "application/json")], encoded).into_response();
    if http1 && !app.is_serving() {
        // Draining: the keep-alive client opens its next connection to a replica still ready
        // instead of finding this one gone. HTTP/2 clients get GOAWAY when the port closes.
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// Every controller of a controller-manager run without `--use-service-account-credentials`
/// speaks as `system:kube-controller-manager`: the ReplicaSet controller (release), the namespace
/// controller and the taint manager (let through) are then not told apart. Said once, and kept
/// in a gauge.
fn warn_of_a_shared_controller_identity(app: &App, request: &AdmissionRequest) {
    let gauge = &app.metrics.controller_manager_shared_identity;
    if request.user_info.username == SHARED_CONTROLLER_MANAGER_USER && gauge.get() == 0 {
        gauge.set(1);
        warn!(
            user = SHARED_CONTROLLER_MANAGER_USER,
            "the controller-manager speaks as one user (no --use-service-account-credentials): busyguard cannot tell \
             the ReplicaSet controller, the namespace controller and the taint manager apart, so it refuses them \
             all on busy pods, releases nothing and lets no recovery through"
        );
    }
}

/// Hands the side effects to the outbox; what it returns says when each it queued is done. One
/// it settled at once (a refusal's Event within its interval, a mark that stands: most repeated
/// refusals) is not waited for.
fn send_effects(app: &App, effects: Vec<Effect>) -> Vec<Queued> {
    let Some(outbox) = &app.cluster.outbox else {
        for effect in &effects {
            debug!(kind = effect.kind(), "no cluster: side effect not carried out");
        }
        return Vec::new();
    };
    let queued = effects.into_iter().filter_map(|effect| match outbox.send(effect) {
        Either::Left(_settled) => None,
        Either::Right(queued) => Some(queued),
    });
    queued.collect()
}

/// The API server's `?timeout=` for this call; 10s (its default) when it sent none.
fn api_server_timeout(query: Option<&str>) -> Duration {
    let mut pairs = query.unwrap_or_default().split('&');
    pairs
        .find_map(|pair| pair.strip_prefix("timeout="))
        .and_then(|value| parse_positive_duration(value).ok())
        .and_then(|timeout| Duration::try_from(timeout).ok())
        .unwrap_or(Duration::from_secs(10))
}

/// How long an answer may wait for its side effects: half the API server's timeout, at most
/// 5s, so the answer always arrives in time.
fn effects_budget(timeout: Duration) -> Duration {
    (timeout / 2).min(Duration::from_secs(5))
}

/// The body's announced length, if any, once the headers say it is a review's. `http1`: a body
/// announced too large is refused before it is read (the connection is closed after the
/// answer); an HTTP/2 client gets its answer once it has sent it (see [`read_body`]).
fn check_headers(headers: &HeaderMap, http1: bool) -> Result<Option<u64>, HttpError> {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let media_type = content_type.split(';').next().unwrap_or_default().trim();
    if !media_type.eq_ignore_ascii_case("application/json") {
        return Err(HttpError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("Content-Type must be application/json, got {content_type:?}"),
        ));
    }
    let encoding = headers.get(header::CONTENT_ENCODING).map(|v| v.as_bytes());
    if encoding.is_some_and(|encoding| !encoding.eq_ignore_ascii_case(b"identity")) {
        return Err(HttpError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "compressed request bodies are not accepted"));
    }
    let declared_length = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let refused_unread = if http1 { MAX_BODY_BYTES } else { MAX_DRAINED_BYTES };
    if declared_length.is_some_and(|length| length > refused_unread as u64) {
        return Err(too_large());
    }
    Ok(declared_length)
}

/// The body, whole, within `timeout`. One over [`MAX_BODY_BYTES`] is refused 413: at once over
/// HTTP/1.1 (the connection is closed after the answer), and over HTTP/2 (`drain`) once it has
/// arrived, read on and dropped up to [`MAX_DRAINED_BYTES`], since a client whose stream is cut
/// before it finished sending never reads the answer.
async fn read_body(mut body: Body, timeout: Duration, drain: bool) -> Result<Bytes, HttpError> {
    let reading = async {
        let mut chunks: Vec<Bytes> = Vec::new();
        let mut received = 0usize;
        while let Some(frame) = body.frame().await {
            let frame =
                frame.map_err(|e| HttpError::new(StatusCode::BAD_REQUEST, format!("reading the request body: {e}")))?;
            let Ok(data) = frame.into_data() else { continue };
            received = received.saturating_add(data.len());
            if received <= MAX_BODY_BYTES {
                chunks.push(data);
            } else if !drain || received > MAX_DRAINED_BYTES {
                break;
            } else {
                chunks.clear();
            }
        }
        match chunks.len() {
            _ if received > MAX_BODY_BYTES => Err(too_large()),
            1 => Ok(chunks.remove(0)),
            _ => Ok(Bytes::from(chunks.concat())),
        }
    };
    match tokio::time::timeout(timeout, reading).await {
        Ok(read) => read,
        Err(_) => Err(HttpError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!("the request body did not arrive within {timeout:?}"),
        )),
    }
}

/// How much of a body too large is read and dropped before the stream is cut.
const MAX_DRAINED_BYTES: usize = 2 * MAX_BODY_BYTES;

fn too_large() -> HttpError {
    HttpError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("request body is larger than 7 MiB ({MAX_BODY_BYTES} bytes): an AdmissionReview never is"),
    )
}

/// A request refused before any decision: logged once, counted, answered as JSON.
#[derive(Debug)]
pub struct HttpError {
    status: StatusCode,
    message: String,
}

impl HttpError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        HttpError { status, message: message.into() }
    }

    /// The answer, with its log line (naming `peer`, the client's address, when known) and count.
    fn into_counted_response(self, app: &App, peer: Option<SocketAddr>) -> Response {
        // Debug-escaped: the message may quote the client's own bytes (a log line is one line).
        let peer = peer.map(field::display);
        warn!(status = self.status.as_u16(), error = ?self.message, peer, "request refused");
        app.metrics.http_errors.get_or_create(&StatusLabels { status: self.status.as_u16() }).inc();
        let body = serde_json::json!({"error": self.message, "code": self.status.as_u16()}).to_string();
        let mut response = (self.status, [(header::CONTENT_TYPE, "application/json")], body).into_response();
        // The body may be unread: do not let the client reuse the connection.
        response.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        response
    }
}

impl From<InvalidReview> for HttpError {
    fn from(e: InvalidReview) -> Self {
        HttpError::new(StatusCode::BAD_REQUEST, e.0)
    }
}

impl From<Unanswerable> for HttpError {
    fn from(unanswerable: Unanswerable) -> Self {
        match unanswerable {
            Unanswerable::Invalid(e) => e.into(),
            Unanswerable::Unavailable(why) => HttpError::new(StatusCode::SERVICE_UNAVAILABLE, why),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effects_wait_half_the_api_servers_timeout_at_most_five_seconds() {
        let budget = |query| effects_budget(api_server_timeout(query));
        assert_eq!(budget(Some("timeout=4s")), Duration::from_secs(2));
        assert_eq!(budget(Some("x=1&timeout=30s")), Duration::from_secs(5));
        assert_eq!(budget(None), Duration::from_secs(5));
        assert_eq!(budget(Some("timeout=nonsense")), Duration::from_secs(5));
    }
}
