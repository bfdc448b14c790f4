//! `admission.k8s.io/v1` AdmissionReview on the wire: what busyguard reads and what it answers.
//! Unknown fields are ignored, so newer API servers keep working.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

pub const API_VERSION: &str = "admission.k8s.io/v1";
pub const KIND: &str = "AdmissionReview";

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewIn {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    request: Option<AdmissionRequest>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    pub uid: String,
    pub kind: GroupVersionKind,
    pub resource: GroupVersionResource,
    #[serde(default)]
    pub sub_resource: Option<String>,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    pub operation: Operation,
    #[serde(default)]
    pub user_info: UserInfo,
    /// Decoded later, and only into the fields the route needs.
    #[serde(default)]
    pub object: Option<Box<RawValue>>,
    #[serde(default)]
    pub old_object: Option<Box<RawValue>>,
    #[serde(default)]
    pub dry_run: Option<bool>,
}

/// Of the request's kind only the name is read (for logs).
#[derive(Debug, Default, Deserialize)]
pub struct GroupVersionKind {
    pub kind: String,
}

#[derive(Debug, Default, Deserialize)]
pub struct GroupVersionResource {
    #[serde(default)]
    pub group: String,
    pub resource: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct UserInfo {
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub groups: Vec<String>,
}

impl AdmissionRequest {
    pub fn sub_resource(&self) -> &str {
        self.sub_resource.as_deref().unwrap_or_default()
    }

    pub fn is_dry_run(&self) -> bool {
        self.dry_run.unwrap_or(false)
    }
}

/// Why a body is not a request busyguard can judge. Always the client's fault (HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidReview(pub String);

impl std::fmt::Display for InvalidReview {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

pub fn decode(body: &[u8]) -> Result<AdmissionRequest, InvalidReview> {
    let review: ReviewIn = serde_json::from_slice(body).map_err(|e| {
        InvalidReview(if e.is_data() {
            format!("body is not a valid {API_VERSION} {KIND}: {e}")
        } else {
            format!("body is not valid JSON: {e}")
        })
    })?;
    if review.api_version != API_VERSION || review.kind != KIND {
        return Err(InvalidReview(format!(
            "expected apiVersion {API_VERSION:?} and kind {KIND:?}, got {:?} and {:?}; \
             list only v1 in the webhook's admissionReviewVersions",
            review.api_version, review.kind
        )));
    }
    let request = review.request.ok_or_else(|| InvalidReview(format!("{KIND} has no request")))?;
    if request.uid.is_empty() {
        return Err(InvalidReview("request.uid is empty".into()));
    }
    Ok(request)
}

/// A decoded object the route needs, named after its field for error messages.
pub fn decode_object<'a, T: Deserialize<'a>>(raw: &'a Option<Box<RawValue>>, field: &str) -> Result<T, InvalidReview> {
    let raw = raw.as_deref().ok_or_else(|| InvalidReview(format!("request.{field} is missing")))?;
    serde_json::from_str(raw.get()).map_err(|e| InvalidReview(format!("request.{field} is not a valid object: {e}")))
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ReviewOut<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: &'a AdmissionResponse,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    pub uid: String,
    pub allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<&'static str>,
    /// Base64 of the JSONPatch; present only when there are operations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// `metav1.Status` as the API server relays it to the requester.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Status {
    pub status: &'static str,
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

impl AdmissionResponse {
    pub fn allow(uid: &str) -> Self {
        AdmissionResponse {
            uid: uid.to_string(),
            allowed: true,
            status: None,
            patch_type: None,
            patch: None,
            warnings: Vec::new(),
        }
    }

    /// A refusal the requester should retry later, as a PodDisruptionBudget answers (429).
    pub fn deny_retry_later(uid: &str, message: String) -> Self {
        AdmissionResponse {
            allowed: false,
            status: Some(Status { status: "Failure", code: 429, reason: "TooManyRequests", message }),
            ..Self::allow(uid)
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let review = ReviewOut { api_version: API_VERSION, kind: KIND, response: self };
        serde_json::to_vec(&review).expect("a response of strings and numbers always serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(value: serde_json::Value) -> Vec<u8> {
        serde_json::to_vec(&value).unwrap()
    }

    fn minimal_request() -> serde_json::Value {
        json!({"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
               "resource": {"group": "", "version": "v1", "resource": "pods"},
               "operation": "DELETE", "userInfo": {"username": "admin"}})
    }

    #[test]
    fn decodes_a_minimal_review_and_ignores_unknown_fields() {
        let request = decode(&body(json!({"apiVersion": API_VERSION, "kind": KIND,
            "request": minimal_request(), "somethingNew": {"x": 1}})))
        .unwrap();
        assert_eq!(request.uid, "u-1");
        assert_eq!(request.operation, Operation::Delete);
        assert_eq!(request.sub_resource(), "");
        assert!(!request.is_dry_run());
    }

    #[test]
    fn rejects_what_is_not_a_v1_review_with_a_reason() {
        let cases = [
            (b"{not json".to_vec(), "not valid JSON"),
            (
                body(json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": KIND, "request": minimal_request()})),
                "expected apiVersion",
            ),
            (
                body(json!({"apiVersion": API_VERSION, "kind": "Pod", "request": minimal_request()})),
                "expected apiVersion",
            ),
            (body(json!({"apiVersion": API_VERSION, "kind": KIND})), "has no request"),
            (body(json!({"apiVersion": API_VERSION, "kind": KIND, "request": {"uid": 5}})), "not a valid"),
            (body(json!({"apiVersion": API_VERSION, "kind": KIND, "request": {"uid": ""}})), "not a valid"),
            (body(json!([1, 2])), "not a valid"),
        ];
        for (input, expected) in cases {
            let err = decode(&input).unwrap_err();
            assert!(err.0.contains(expected), "{err} should contain {expected:?}");
        }
        let mut empty_uid = minimal_request();
        empty_uid["uid"] = json!("");
        let err = decode(&body(json!({"apiVersion": API_VERSION, "kind": KIND, "request": empty_uid}))).unwrap_err();
        assert_eq!(err.0, "request.uid is empty");
    }

    #[test]
    fn denial_carries_429_and_echoes_the_uid() {
        let encoded = AdmissionResponse::deny_retry_later("u-9", "busy".into()).encode();
        let value: serde_json::Value = serde_json::from_slice(&encoded).unwrap();
        assert_eq!(
            value,
            json!({"apiVersion": API_VERSION, "kind": KIND, "response": {"uid": "u-9", "allowed": false,
                "status": {"status": "Failure", "code": 429, "reason": "TooManyRequests", "message": "busy"}}})
        );
    }

    #[test]
    fn plain_allow_has_no_patch_and_no_status() {
        let value: serde_json::Value = serde_json::from_slice(&AdmissionResponse::allow("u").encode()).unwrap();
        assert_eq!(value["response"], json!({"uid": "u", "allowed": true}));
    }
}
