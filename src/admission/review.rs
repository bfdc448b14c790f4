//! `admission.k8s.io/v1` AdmissionReview on the wire: what busyguard reads and what it answers.
//! Unknown fields are ignored, so newer API servers keep working.

use std::borrow::Cow;
use std::fmt;

use base64::Engine;

use serde::de::{Error, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

pub use super::objects::InvalidReview;
use super::objects::{Object, ObjectSeed, Pending};
use crate::json;
use crate::policy::outcome::Answer;

pub const API_VERSION: &str = "admission.k8s.io/v1";
pub const KIND: &str = "AdmissionReview";

/// `apiVersion` and `kind` are only compared: borrowed from the body where it holds them
/// unescaped, as the API server writes them.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewIn<'a> {
    #[serde(default, borrow)]
    api_version: Cow<'a, str>,
    #[serde(default, borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    request: Option<AdmissionRequest<'a>>,
}

/// The request's strings are borrowed from the body where it holds them unescaped, as the API
/// server writes them: no copy of each per review.
#[derive(Debug)]
pub struct AdmissionRequest<'a> {
    pub uid: Cow<'a, str>,
    pub kind: GroupVersionKind<'a>,
    pub resource: GroupVersionResource<'a>,
    pub sub_resource: Option<Cow<'a, str>>,
    pub name: Cow<'a, str>,
    pub namespace: Cow<'a, str>,
    pub operation: Operation,
    pub user_info: UserInfo<'a>,
    /// Decoded by `kind` into the fields decisions read (see `objects`); `None` when absent.
    pub object: Option<Object>,
    pub old_object: Option<Object>,
    pub dry_run: Option<bool>,
    /// The field manager the writer named (a create's, update's or patch's options), if any.
    pub field_manager: Option<Cow<'a, str>>,
}

/// Of the request's kind only the name is read: it says how to decode the objects.
#[derive(Debug, Default, Deserialize)]
pub struct GroupVersionKind<'a> {
    #[serde(borrow)]
    pub kind: Cow<'a, str>,
}

#[derive(Debug, Default, Deserialize)]
pub struct GroupVersionResource<'a> {
    #[serde(default, borrow)]
    pub group: Cow<'a, str>,
    #[serde(borrow)]
    pub resource: Cow<'a, str>,
}

pub use crate::policy::Operation;

#[derive(Debug, Default, Deserialize)]
pub struct UserInfo<'a> {
    #[serde(default, borrow)]
    pub username: Cow<'a, str>,
    #[serde(default)]
    pub groups: Vec<String>,
    /// E.g. the pod a service-account token is bound to.
    #[serde(default)]
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

impl AdmissionRequest<'_> {
    pub fn sub_resource(&self) -> &str {
        self.sub_resource.as_deref().unwrap_or_default()
    }

    pub fn is_dry_run(&self) -> bool {
        self.dry_run.unwrap_or(false)
    }

    pub fn object(&self) -> Result<&Object, InvalidReview> {
        self.object.as_ref().ok_or_else(|| InvalidReview("request.object is missing".into()))
    }

    pub fn old_object(&self) -> Result<&Object, InvalidReview> {
        self.old_object.as_ref().ok_or_else(|| InvalidReview("request.oldObject is missing".into()))
    }
}

/// The fields busyguard reads; any other is skipped unparsed.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "camelCase")]
enum Field {
    Uid,
    Kind,
    Resource,
    SubResource,
    Name,
    Namespace,
    Operation,
    UserInfo,
    Object,
    OldObject,
    DryRun,
    Options,
    #[serde(other)]
    Other,
}

impl<'de: 'a, 'a> Deserialize<'de> for AdmissionRequest<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(RequestVisitor)
    }
}

/// Written out rather than derived so that `object` and `oldObject` are decoded by `kind`,
/// which comes before them, in the one pass over the body.
struct RequestVisitor;

impl<'de> Visitor<'de> for RequestVisitor {
    type Value = AdmissionRequest<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an AdmissionRequest object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<AdmissionRequest<'de>, A::Error> {
        let (mut uid, mut kind, mut resource, mut operation) = (None, None::<GroupVersionKind>, None, None);
        let (mut sub_resource, mut name, mut namespace, mut user_info, mut dry_run) = (None, None, None, None, None);
        let (mut object, mut old_object, mut options) = (None, None, None::<Option<WriteOptions<'de>>>);
        while let Some(field) = map.next_key::<Field>()? {
            match field {
                Field::Uid => set(&mut uid, map.next_value::<Text>()?.0, "uid")?,
                Field::Kind => set(&mut kind, map.next_value()?, "kind")?,
                Field::Resource => set(&mut resource, map.next_value()?, "resource")?,
                Field::SubResource => set(&mut sub_resource, map.next_value::<Option<Text>>()?, "subResource")?,
                Field::Name => set(&mut name, map.next_value::<Option<Text>>()?, "name")?,
                Field::Namespace => set(&mut namespace, map.next_value::<Option<Text>>()?, "namespace")?,
                Field::Operation => set(&mut operation, map.next_value()?, "operation")?,
                Field::UserInfo => set(&mut user_info, map.next_value()?, "userInfo")?,
                Field::DryRun => set(&mut dry_run, map.next_value()?, "dryRun")?,
                Field::Options => set(&mut options, map.next_value()?, "options")?,
                Field::Object => set(&mut object, next_object(&mut map, kind.as_ref(), "object")?, "object")?,
                Field::OldObject => {
                    let old = next_object(&mut map, kind.as_ref(), "oldObject")?;
                    set(&mut old_object, old, "oldObject")?
                }
                Field::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let kind = kind.ok_or_else(|| A::Error::missing_field("kind"))?;
        let resolve = |pending: Option<Pending>, field| {
            let seed = object_seed(&kind, field);
            pending.map_or(Ok(None), |p| p.resolve(seed)).map_err(A::Error::custom)
        };
        Ok(AdmissionRequest {
            object: resolve(object, "object")?,
            old_object: resolve(old_object, "oldObject")?,
            uid: uid.ok_or_else(|| A::Error::missing_field("uid"))?,
            resource: resource.ok_or_else(|| A::Error::missing_field("resource"))?,
            operation: operation.ok_or_else(|| A::Error::missing_field("operation"))?,
            kind,
            sub_resource: sub_resource.flatten().map(|text| text.0),
            name: name.flatten().map(|text| text.0).unwrap_or_default(),
            namespace: namespace.flatten().map(|text| text.0).unwrap_or_default(),
            user_info: user_info.flatten().unwrap_or_default(),
            dry_run: dry_run.flatten(),
            field_manager: options.flatten().and_then(|o| o.field_manager).map(|text| text.0),
        })
    }
}

/// What is read of a request's options (CreateOptions, UpdateOptions, PatchOptions, or a
/// delete's DeleteOptions, which name no field manager).
#[derive(Deserialize)]
struct WriteOptions<'a> {
    #[serde(default, borrow, rename = "fieldManager")]
    field_manager: Option<Text<'a>>,
}

/// A string borrowed from the body where it holds it unescaped: serde's own `Cow` always
/// copies, its derive borrows only a field marked so.
#[derive(Deserialize)]
#[serde(transparent)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

/// A field seen twice is refused: two readers of the same body must not see different values.
fn set<T, E: Error>(slot: &mut Option<T>, value: T, field: &'static str) -> Result<(), E> {
    if slot.replace(value).is_some() {
        return Err(E::duplicate_field(field));
    }
    Ok(())
}

fn next_object<'de, A: MapAccess<'de>>(
    map: &mut A,
    kind: Option<&GroupVersionKind>,
    field: &'static str,
) -> Result<Pending, A::Error> {
    match kind {
        Some(kind) => Ok(Pending::Decoded(map.next_value_seed(object_seed(kind, field))?)),
        None => Ok(Pending::Raw(map.next_value()?)),
    }
}

fn object_seed<'a>(kind: &'a GroupVersionKind, field: &'static str) -> ObjectSeed<'a> {
    ObjectSeed { kind: &kind.kind, field }
}

pub fn decode(body: &[u8]) -> Result<AdmissionRequest<'_>, InvalidReview> {
    // JSON is UTF-8. Checked here for the whole body at once: serde_json checks only the strings
    // it reads, one by one, and none of those it skips. The SIMD check first; the standard
    // library's says where a body fails.
    let text = (simdutf8::basic::from_utf8(body).or_else(|_| std::str::from_utf8(body)))
        .map_err(|e| InvalidReview(format!("body is not valid JSON: it is not UTF-8 ({e})")))?;
    let review: ReviewIn = serde_json::from_str(text).map_err(|e| {
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

/// The answer as serde_json writes it: what [`AdmissionResponse::encode`] must write.
#[cfg(test)]
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ReviewOut<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: &'a AdmissionResponse<'a>,
}

/// Borrows the request's uid and the decision's words: it is written once and dropped.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse<'a> {
    pub uid: &'a str,
    pub allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<MetaStatus<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<&'static str>,
    /// Base64 of the JSONPatch; present only when there are operations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    pub warnings: &'a [String],
}

/// `metav1.Status` as the API server relays it to the requester.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetaStatus<'a> {
    pub status: &'static str,
    pub code: u16,
    pub reason: &'static str,
    pub message: &'a str,
    pub details: StatusDetails,
}

/// `metav1.StatusDetails`: the causes, which clients can match on rather than on the message.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatusDetails {
    pub causes: [StatusCause; 1],
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatusCause {
    pub reason: &'static str,
}

impl<'a> AdmissionResponse<'a> {
    pub fn allow(uid: &'a str) -> Self {
        AdmissionResponse { uid, allowed: true, status: None, patch_type: None, patch: None, warnings: &[] }
    }

    /// The policy's answer on the wire: a patch as base64 JSONPatch, a refusal with its code,
    /// reason and cause.
    pub fn of(uid: &'a str, answer: &'a Answer) -> Self {
        match answer {
            Answer::Allow { warnings } => AdmissionResponse { warnings, ..Self::allow(uid) },
            Answer::Patch { patch, warnings } => {
                let mut patch_json = Vec::with_capacity(1024);
                json::patch(&mut patch_json, patch);
                AdmissionResponse {
                    patch_type: Some("JSONPatch"),
                    patch: Some(base64::engine::general_purpose::STANDARD.encode(patch_json)),
                    warnings,
                    ..Self::allow(uid)
                }
            }
            Answer::Deny { denial, message } => AdmissionResponse {
                allowed: false,
                status: Some(MetaStatus {
                    status: "Failure",
                    code: denial.code(),
                    reason: denial.reason(),
                    message,
                    details: StatusDetails { causes: [StatusCause { reason: denial.cause() }] },
                }),
                ..Self::allow(uid)
            },
        }
    }

    /// The AdmissionReview answer, byte for byte what serde_json writes of it (a test holds the
    /// two together), written straight into one buffer (see [`crate::json`]).
    pub fn encode(&self) -> Vec<u8> {
        use std::io::Write as _;
        let strings = self.uid.len()
            + self.status.as_ref().map_or(0, |status| status.message.len())
            + self.patch.as_ref().map_or(0, String::len)
            + self.warnings.iter().map(|warning| warning.len() + 3).sum::<usize>();
        let mut out = Vec::with_capacity(256 + strings);
        out.extend_from_slice(br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"#);
        json::string(&mut out, self.uid);
        out.extend_from_slice(if self.allowed { br#","allowed":true"# } else { br#","allowed":false"# });
        if let Some(status) = &self.status {
            out.extend_from_slice(br#","status":{"status":"#);
            json::string(&mut out, status.status);
            let _ = write!(out, r#","code":{},"reason":"#, status.code);
            json::string(&mut out, status.reason);
            out.extend_from_slice(br#","message":"#);
            json::string(&mut out, status.message);
            let [cause] = &status.details.causes;
            out.extend_from_slice(br#","details":{"causes":[{"reason":"#);
            json::string(&mut out, cause.reason);
            out.extend_from_slice(b"}]}}");
        }
        if let Some(patch_type) = self.patch_type {
            out.extend_from_slice(br#","patchType":"#);
            json::string(&mut out, patch_type);
        }
        if let Some(patch) = &self.patch {
            out.extend_from_slice(br#","patch":"#);
            json::string(&mut out, patch);
        }
        if !self.warnings.is_empty() {
            out.extend_from_slice(br#","warnings":"#);
            json::strings(&mut out, self.warnings);
        }
        out.extend_from_slice(b"}}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::outcome::Denial;
    use crate::policy::pod::PodFacts;
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
        let review = body(json!({"apiVersion": API_VERSION, "kind": KIND,
            "request": minimal_request(), "somethingNew": {"x": 1}}));
        let request = decode(&review).unwrap();
        assert_eq!(request.uid, "u-1");
        assert_eq!(request.operation, Operation::Delete);
        assert_eq!(request.sub_resource(), "");
        assert!(!request.is_dry_run());
    }

    #[test]
    fn the_requests_strings_are_read_whether_or_not_the_body_escapes_them() {
        let plain = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1",
            "kind":{"kind":"Pod"},"resource":{"resource":"pods"},"subResource":"eviction","name":"w",
            "namespace":"capture","operation":"CREATE","userInfo":{"username":"admin"}}}"#;
        let request = decode(plain.as_bytes()).unwrap();
        // Borrowed from the body: nothing is copied for a review the API server wrote.
        let texts = [&request.uid, &request.kind.kind, &request.resource.resource, &request.name, &request.namespace];
        for text in texts.into_iter().chain([&request.user_info.username]).chain(&request.sub_resource) {
            assert!(matches!(text, Cow::Borrowed(_)), "{text:?} is copied");
        }
        let escaped = plain.replace(r#""u-1""#, r#""u\u002d1""#).replace(r#""w""#, r#""w\"x""#);
        let request = decode(escaped.as_bytes()).unwrap();
        assert_eq!((&*request.uid, &*request.name, request.sub_resource()), ("u-1", "w\"x", "eviction"));
        assert_eq!((&*request.namespace, &*request.user_info.username), ("capture", "admin"));
    }

    #[test]
    fn the_writers_field_manager_is_read_from_its_options() {
        let mut patch = minimal_request();
        patch["operation"] = json!("UPDATE");
        patch["options"] =
            json!({"kind": "PatchOptions", "apiVersion": "meta.k8s.io/v1", "fieldManager": "busyguard-agent"});
        let review = body(json!({"apiVersion": API_VERSION, "kind": KIND, "request": patch}));
        let request = decode(&review).unwrap();
        assert_eq!(request.field_manager.as_deref(), Some("busyguard-agent"));
        // A delete's options name none; a request may carry no options at all.
        let mut delete = minimal_request();
        delete["options"] = json!({"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1", "gracePeriodSeconds": 0});
        let review = body(json!({"apiVersion": API_VERSION, "kind": KIND, "request": delete}));
        let request = decode(&review).unwrap();
        assert_eq!(request.field_manager, None);
        let mut none = minimal_request();
        none["options"] = json!(null);
        let review = body(json!({"apiVersion": API_VERSION, "kind": KIND, "request": none}));
        let request = decode(&review).unwrap();
        assert_eq!(request.field_manager, None);
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
    fn objects_are_decoded_by_kind_whatever_order_the_fields_come_in() {
        let pod = json!({"metadata": {"name": "w", "annotations": {"busyguard.io/busy-since": "2026-11-21T20:00:00Z"}},
                         "spec": {"containers": [{"name": "c"}]}});
        let in_order = format!(
            r#"{{"apiVersion":"{API_VERSION}","kind":"{KIND}","request":{{"uid":"u","kind":{{"kind":"Pod"}},
               "resource":{{"resource":"pods"}},"operation":"DELETE","object":null,"oldObject":{pod}}}}}"#
        );
        let kind_last = format!(
            r#"{{"apiVersion":"{API_VERSION}","kind":"{KIND}","request":{{"uid":"u","oldObject":{pod},"object":null,
               "resource":{{"resource":"pods"}},"operation":"DELETE","kind":{{"kind":"Pod"}}}}}}"#
        );
        for body in [in_order, kind_last] {
            let request = decode(body.as_bytes()).unwrap();
            assert!(request.object.is_none(), "null is no object");
            let Some(Object::Pod(old)) = &request.old_object else { panic!("{:?}", request.old_object) };
            assert_eq!(old.metadata.name, "w");
            assert_eq!(old.annotation("busyguard.io/busy-since"), Some("2026-11-21T20:00:00Z"));
        }
    }

    #[test]
    fn the_old_pod_of_an_update_and_of_a_delete_is_read() {
        // An update's old version says whether this write turns the pod busy.
        for (operation, read) in [("UPDATE", true), ("DELETE", true)] {
            let body = format!(
                r#"{{"apiVersion":"{API_VERSION}","kind":"{KIND}","request":{{"uid":"u","kind":{{"kind":"Pod"}},
                   "resource":{{"resource":"pods"}},"operation":"{operation}","oldObject":{{"metadata":{{"name":"w"}}}}}}}}"#
            );
            let request = decode(body.as_bytes()).unwrap();
            assert_eq!(matches!(request.old_object, Some(Object::Pod(_))), read, "{operation}");
        }
    }

    #[test]
    fn a_body_that_is_not_utf8_is_refused_even_where_nothing_reads_it() {
        // A pod's spec is skipped unread; its bytes are still part of the JSON, which is UTF-8.
        let mut body = format!(
            r#"{{"apiVersion":"{API_VERSION}","kind":"{KIND}","request":{{"uid":"u","kind":{{"kind":"Pod"}},
               "resource":{{"resource":"pods"}},"operation":"DELETE","oldObject":{{"spec":{{"x":"??"}}}}}}}}"#
        )
        .into_bytes();
        let at = body.windows(2).position(|pair| pair == b"??").unwrap();
        body[at..at + 2].copy_from_slice(&[0xC3, 0x28]);
        let err = decode(&body).unwrap_err();
        assert!(err.0.starts_with("body is not valid JSON: it is not UTF-8"), "{err}");
    }

    #[test]
    fn a_field_sent_twice_is_refused() {
        let body = format!(
            r#"{{"apiVersion":"{API_VERSION}","kind":"{KIND}","request":{{"uid":"u","uid":"v","kind":{{"kind":"Pod"}},
               "resource":{{"resource":"pods"}},"operation":"DELETE"}}}}"#
        );
        let err = decode(body.as_bytes()).unwrap_err();
        assert!(err.0.contains("duplicate field `uid`"), "{err}");
    }

    #[test]
    fn an_object_of_another_kind_is_skipped_unread() {
        let mut request = minimal_request();
        request["kind"]["kind"] = json!("ConfigMap");
        request["object"] = json!({"data": {"x": [1, {"y": null}]}});
        let review = body(json!({"apiVersion": API_VERSION, "kind": KIND, "request": request}));
        let request = decode(&review).unwrap();
        assert!(matches!(request.object, Some(Object::Unread)));
    }

    #[test]
    fn denial_carries_429_its_cause_and_echoes_the_uid() {
        let answer = Answer::Deny { denial: Denial::PodBusy, message: "busy".into() };
        let encoded = AdmissionResponse::of("u-9", &answer).encode();
        let value: serde_json::Value = serde_json::from_slice(&encoded).unwrap();
        assert_eq!(
            value,
            json!({"apiVersion": API_VERSION, "kind": KIND, "response": {"uid": "u-9", "allowed": false,
                "status": {"status": "Failure", "code": 429, "reason": "TooManyRequests", "message": "busy",
                    "details": {"causes": [{"reason": "BusyguardPodBusy"}]}}}})
        );
    }

    #[test]
    fn a_patch_goes_out_as_base64_jsonpatch_with_its_warnings() {
        let patch: json_patch::Patch =
            serde_json::from_value(json!([{"op": "add", "path": "/metadata/annotations/a", "value": "1"}])).unwrap();
        let answer = Answer::Patch { patch, warnings: vec!["w".into()] };
        let value = serde_json::to_value(AdmissionResponse::of("u", &answer)).unwrap();
        assert_eq!(value["patchType"], "JSONPatch");
        let bytes = base64::engine::general_purpose::STANDARD.decode(value["patch"].as_str().unwrap()).unwrap();
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&bytes).unwrap(),
            json!([{"op": "add", "path": "/metadata/annotations/a", "value": "1"}])
        );
        assert_eq!(value["warnings"], json!(["w"]));
    }

    #[test]
    fn plain_allow_has_no_patch_and_no_status() {
        let value: serde_json::Value = serde_json::from_slice(&AdmissionResponse::allow("u").encode()).unwrap();
        assert_eq!(value["response"], json!({"uid": "u", "allowed": true}));
    }

    #[test]
    fn the_answer_is_written_byte_for_byte_as_serde_json_writes_it() {
        use crate::policy::outcome::Denial;
        let patch = json_patch::Patch(vec![]);
        let answers = [
            Answer::Allow { warnings: vec![] },
            Answer::Allow { warnings: vec!["one".into(), "two \"quoted\"\n".into()] },
            Answer::Patch { patch, warnings: vec!["w".into()] },
            Answer::Deny { denial: Denial::PodBusy, message: "pod ns/p is busy since 2026-11-21T20:00:00Z".into() },
            Answer::Deny {
                denial: Denial::PodBusy, message: "tab\t, quote \", backslash \\, é, \u{7f}, \u{1}".into()
            },
        ];
        for answer in &answers {
            for uid in ["u-1", "odd \"uid\""] {
                let response = AdmissionResponse::of(uid, answer);
                let serde =
                    serde_json::to_vec(&ReviewOut { api_version: API_VERSION, kind: KIND, response: &response });
                assert_eq!(
                    String::from_utf8(response.encode()).unwrap(),
                    String::from_utf8(serde.unwrap()).unwrap(),
                    "{answer:?}"
                );
            }
        }
    }
}
