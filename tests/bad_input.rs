//! Requests that are not judgeable AdmissionReviews: each gets a clear HTTP 4xx with a JSON
//! error (or a closed connection), is counted, and is never answered "allowed".

mod common;

use std::time::Duration;

use common::{Answer, TestServer, fixture, http1, post_request, send};
use http_body_util::Full;
use hyper::body::Bytes;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MAX_BODY: usize = 7 * 1024 * 1024;

/// A refusal: the status, a JSON `error` saying why, and no AdmissionReview that could allow.
fn assert_refused(answer: &Answer, status: u16, error_contains: &str) {
    assert_eq!(answer.status, status, "{}", answer.text());
    let body = answer.json();
    assert!(body.get("response").is_none(), "a refusal is never an AdmissionReview: {body}");
    assert_eq!(body["code"], status);
    let error = body["error"].as_str().unwrap();
    assert!(error.contains(error_contains), "{error:?} should contain {error_contains:?}");
}

fn review_with_request(request: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}))
        .unwrap()
}

#[tokio::test]
async fn malformed_or_mistyped_reviews_are_400_and_counted() {
    let server = TestServer::start().await;
    let mut delete_without_pod = fixture("pod-delete-by-user.json");
    delete_without_pod["request"]["oldObject"] = Value::Null;
    let mut pod_as_string = fixture("pod-delete-by-user.json");
    pod_as_string["request"]["oldObject"] = json!("a pod");
    let mut labels_as_list = fixture("pod-update-label-busy-by-user.json");
    labels_as_list["request"]["object"]["metadata"]["labels"] = json!(["busyguard.io/busy"]);
    let mut uid_as_number = fixture("pod-delete-by-user.json");
    uid_as_number["request"]["uid"] = json!(42);
    let mut unknown_operation = fixture("pod-delete-by-user.json");
    unknown_operation["request"]["operation"] = json!("PURGE");
    let mut v1beta1 = fixture("pod-delete-by-user.json");
    v1beta1["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let mut eviction_of_kind_pod = fixture("pod-eviction-by-user.json");
    eviction_of_kind_pod["request"]["kind"]["kind"] = json!("Pod");
    let mut no_uid = fixture("pod-delete-by-user.json");
    no_uid["request"].as_object_mut().unwrap().remove("uid");

    // (what, path, body, the error names)
    let cases: Vec<(&str, &str, Vec<u8>, &str)> = vec![
        (
            "truncated JSON",
            "/validate",
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"Admiss"#.to_vec(),
            "not valid JSON",
        ),
        ("empty body", "/validate", vec![], "not valid JSON"),
        (
            "a pod, not a review",
            "/validate",
            serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "Pod"})).unwrap(),
            "expected apiVersion",
        ),
        ("v1beta1", "/validate", serde_json::to_vec(&v1beta1).unwrap(), "expected apiVersion \"admission.k8s.io/v1\""),
        ("no request", "/validate", review_with_request(Value::Null), "has no request"),
        ("no uid", "/validate", serde_json::to_vec(&no_uid).unwrap(), "missing field `uid`"),
        ("uid as number", "/validate", serde_json::to_vec(&uid_as_number).unwrap(), "invalid type"),
        ("unknown operation", "/validate", serde_json::to_vec(&unknown_operation).unwrap(), "unknown variant `PURGE`"),
        (
            "delete without oldObject",
            "/validate",
            serde_json::to_vec(&delete_without_pod).unwrap(),
            "request.oldObject is missing",
        ),
        (
            "pod as a string",
            "/validate",
            serde_json::to_vec(&pod_as_string).unwrap(),
            "request.oldObject is not a valid Pod",
        ),
        (
            "eviction whose kind says Pod",
            "/validate",
            serde_json::to_vec(&eviction_of_kind_pod).unwrap(),
            "request.object is a Pod, not an Eviction",
        ),
        (
            "labels as a list",
            "/mutate",
            serde_json::to_vec(&labels_as_list).unwrap(),
            "request.object is not a valid Pod",
        ),
    ];
    let count = cases.len();
    for (what, path, body, expected) in cases {
        let answer = server.post(path, body).await;
        assert_eq!(answer.status, 400, "{what}: {}", answer.text());
        assert_refused(&answer, 400, expected);
    }
    assert_eq!(server.metric(r#"busyguard_http_errors_total{status="400"}"#).await, Some(count as f64));
}

#[tokio::test]
async fn deeply_nested_json_neither_crashes_nor_changes_the_answer() {
    let server = TestServer::start().await;
    let mut review = fixture("pod-delete-by-user.json");
    common::set_busy_label(&mut review, "true");
    let body = serde_json::to_string(&review).unwrap();
    // A million levels in a field busyguard skips, in a body just under the limit.
    let depth = 1_000_000;
    let nested = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let body = body.replacen(r#""spec":{"#, &format!(r#""spec":{{"deep":{nested},"#), 1);
    assert!(body.len() > 2 * depth && body.len() < MAX_BODY);
    let answer = server.post("/validate", body).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.json()["response"]["status"]["code"], 429, "still the busy pod it was");
}

#[tokio::test]
async fn unknown_extra_fields_in_a_valid_review_are_accepted() {
    let server = TestServer::start().await;
    let mut review = fixture("pod-delete-by-user.json");
    review["request"]["somethingFromTheFuture"] = json!({"x": [1, 2]});
    review["alsoNew"] = json!(true);
    assert_eq!(server.review("/validate", &review).await["allowed"], true);
}

#[tokio::test]
async fn a_body_over_7_mib_is_413_whether_announced_or_streamed() {
    let server = TestServer::start().await;
    let answer = server.post("/validate", vec![b' '; MAX_BODY + 1]).await;
    assert_refused(&answer, 413, "larger than 7 MiB (7340032 bytes)");

    // Chunked, with no Content-Length to judge it by up front.
    let mut stream = server.connect().await;
    stream
        .write_all(b"POST /validate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    let chunk = vec![b' '; 1024 * 1024];
    for _ in 0..8 {
        let header = format!("{:x}\r\n", chunk.len());
        if stream.write_all(header.as_bytes()).await.is_err() || stream.write_all(&chunk).await.is_err() {
            break; // the server may close as soon as it has answered
        }
        let _ = stream.write_all(b"\r\n").await;
    }
    let mut head = vec![0; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut head)).await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 413"), "{}", String::from_utf8_lossy(&head[..n]));
}

#[tokio::test]
async fn a_body_over_7_mib_sent_over_http2_gets_its_413_too() {
    let server = TestServer::start().await;
    let h2 = common::connect(server.webhook, &[server.ca()], &[b"h2"]).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), hyper_util::rt::TokioIo::new(h2))
            .await
            .unwrap();
    tokio::spawn(connection);
    // Announced, as curl does.
    let mut request = common::post_request("/validate", Bytes::from(vec![b' '; MAX_BODY + 1]));
    request.headers_mut().insert("content-length", (MAX_BODY + 1).into());
    let answer = sender.send_request(request).await;
    let answer = answer.expect("the answer arrives whole, not a reset stream");
    assert_eq!(answer.status(), 413);
    let body = http_body_util::BodyExt::collect(answer.into_body()).await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("larger than 7 MiB"), "{body:?}");
}

#[tokio::test]
async fn wrong_method_path_content_type_and_encoding_are_refused() {
    let server = TestServer::start().await;
    let body = serde_json::to_vec(&fixture("pod-delete-by-user.json")).unwrap();
    let mut sender = http1(server.connect().await).await;
    let get = hyper::Request::get("/validate").header("host", "localhost").body(Full::new(Bytes::new())).unwrap();
    assert_refused(&send(&mut sender, get).await, 405, "POST");

    assert_refused(&server.post("/admit", body.clone()).await, 404, "/mutate and /validate");

    let mut sender = http1(server.connect().await).await;
    let mut yaml = post_request("/validate", body.clone());
    yaml.headers_mut().insert("content-type", "application/yaml".parse().unwrap());
    assert_refused(&send(&mut sender, yaml).await, 415, "application/yaml");

    let mut sender = http1(server.connect().await).await;
    let mut gzip = post_request("/validate", body.clone());
    gzip.headers_mut().insert("content-encoding", "gzip".parse().unwrap());
    assert_refused(&send(&mut sender, gzip).await, 415, "compressed");

    // A content type with parameters is still JSON.
    let mut sender = http1(server.connect().await).await;
    let mut with_charset = post_request("/validate", body);
    with_charset.headers_mut().insert("content-type", "application/json; charset=utf-8".parse().unwrap());
    assert_eq!(send(&mut sender, with_charset).await.status, 200);
}

#[tokio::test]
async fn a_client_that_stalls_mid_body_gets_408_and_the_server_keeps_answering() {
    let server = TestServer::start().await;
    let mut stream = server.connect().await;
    stream
        .write_all(b"POST /validate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 5000\r\n\r\n{\"apiVersion\":")
        .await
        .unwrap();
    let mut answer = Vec::new();
    // The test server allows 2 s for a body; the answer must come soon after, not never.
    tokio::time::timeout(Duration::from_secs(6), stream.read_to_end(&mut answer)).await.unwrap().ok();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains(r#""error":"the request body did not arrive within 2s""#), "{text}");

    assert_eq!(server.review("/validate", &fixture("pod-delete-by-user.json")).await["allowed"], true);
}

#[tokio::test]
async fn a_client_that_stalls_mid_headers_is_disconnected() {
    let server = TestServer::start().await;
    let mut stream = server.connect().await;
    stream.write_all(b"POST /validate HTTP/1.1\r\nhost: local").await.unwrap();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(6), stream.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "the connection is closed after the header-read timeout");
    assert!(!String::from_utf8_lossy(&rest).contains("allowed"));
}

#[tokio::test]
async fn the_admin_port_says_what_it_serves_on_an_unknown_path_or_method() {
    let server = TestServer::start().await;
    let mut sender = http1(tokio::net::TcpStream::connect(server.admin).await.unwrap()).await;
    let post = hyper::Request::post("/healthz").header("host", "localhost").body(Full::new(Bytes::new())).unwrap();
    let answer = sender.send_request(post).await.unwrap();
    assert_eq!(answer.status(), 405);
    let body = http_body_util::BodyExt::collect(answer.into_body()).await.unwrap().to_bytes();
    assert_eq!(&body[..], b"the admin port answers GET only\n");
    let answer = server.admin_get("/health").await;
    assert_eq!(
        (answer.status, answer.text()),
        (404, "no such path: the admin port serves /healthz, /readyz, /status and /metrics (GET)\n".to_string())
    );
}

/// An operator reading the log of a refusal sees which client sent it.
#[tokio::test]
async fn a_refusals_log_line_names_the_clients_address() {
    let dir = tempfile::tempdir().unwrap();
    common::process::certs(dir.path());
    let process = common::process::Process::serve(dir.path(), &[]);
    let ca = common::ca_of(&dir.path().join("certs"));
    let stream = common::connect(process.webhook, &[ca], &[b"http/1.1"]).await.unwrap();
    let client = stream.get_ref().0.local_addr().unwrap();
    let mut sender = http1(stream).await;
    assert_refused(&send(&mut sender, post_request("/validate", "not a review")).await, 400, "not valid JSON");
    let line = process.wait_for_log("request refused");
    assert_eq!(line["peer"], client.to_string(), "{line}");
}
