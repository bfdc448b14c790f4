//! The promises every answer keeps, whatever the input: checked on generated inputs by
//! `tests/properties.rs` (in `make test`) and on fuzzed ones by `fuzz/` (`make fuzz`). Each
//! check panics with what broke.

use std::time::{Duration, Instant};

use busyguard::admission::review::{AdmissionResponse, decode};
use busyguard::admission::{DecisionInputs, Unanswerable, Webhook, admit};
use busyguard::cluster::view::{ApiPod, View};
use busyguard::duration::parse_positive_duration;
use busyguard::policy::Exemptions;
use busyguard::policy::busy::MaxBusy;
use busyguard::policy::marks::{Mark, MutationSettings, On};
use busyguard::policy::outcome::{Answer, AuditRecord};
use busyguard::policy::{Enrolment, Mode, POD_GC_USER, PolicyConfig};
use jiff::{SignedDuration, Timestamp};
use serde_json::Value;

pub const EXEMPT_USER: &str = "ops-oncall";
pub const EXEMPT_GROUP: &str = "ops-team";
pub const KARPENTER_USER: &str = "system:serviceaccount:kube-system:karpenter";

pub fn now() -> Timestamp {
    "2026-11-21T20:00:00Z".parse().unwrap()
}

/// No pod is protected longer than this here, whatever its own max-busy says.
pub const CEILING: SignedDuration = SignedDuration::from_hours(36);

/// Enforce mode, a day of max-busy up to a ceiling, the pod garbage collector and one user and
/// group exempt, and another autoscaler's annotation and label written on busy pods.
pub fn policy() -> PolicyConfig {
    static MARKS: std::sync::OnceLock<[Mark; 2]> = std::sync::OnceLock::new();
    let marks = MARKS.get_or_init(|| {
        [
            Mark::parse(On::Annotation, "autoscaling.cast.ai/removal-disabled=true").unwrap(),
            Mark::parse(On::Label, "spotinst.io/restrict-scale-down=true").unwrap(),
        ]
    });
    PolicyConfig {
        mode: Mode::Enforce,
        max_busy: MaxBusy { ceiling: Some(CEILING), ..MaxBusy::new(SignedDuration::from_hours(24)) },
        exemptions: Exemptions {
            users: vec![POD_GC_USER.into(), EXEMPT_USER.into()],
            groups: vec![EXEMPT_GROUP.into()],
            karpenter: vec![KARPENTER_USER.into()],
            owner_controllers: Vec::new(),
        },
        mutation: MutationSettings {
            karpenter: true,
            karpenter_bounded: true,
            cluster_autoscaler: true,
            cluster_autoscaler_on_completion: false,
            marks,
        },
        holds: Default::default(),
        owner_rules: Vec::new(),
        busy_with_pod: None,
    }
}

/// The pod as busyguard's watch reads it, unless it does not decode (the watch skips those).
fn watched(pod: &Value) -> Option<ApiPod> {
    serde_json::from_value::<ApiPod>(pod.clone()).ok().filter(|watched| watched.malformed.is_none())
}

/// A listed, fresh view holding these pods (as the API would list them).
pub fn view_of(pods: &[&Value]) -> View {
    let view = View::watching(&[None], Duration::from_secs(60), Enrolment::OptOut);
    view.listed(&None);
    for watched in pods.iter().filter_map(|pod| watched(pod)) {
        view.insert(watched.namespace(), watched.name(), watched.record(&[]));
    }
    view
}

/// An answer and the audit line written with it.
pub struct Judged {
    pub uid: String,
    pub answer: Answer,
    pub audit: Option<Box<AuditRecord>>,
}

impl Judged {
    /// The answer as it goes on the wire.
    pub fn response(&self) -> AdmissionResponse<'_> {
        AdmissionResponse::of(&self.uid, &self.answer)
    }
}

/// Decodes and judges `body` as `webhook`; a refusal is the 4xx/503 busyguard would send.
pub fn judge(body: &[u8], webhook: Webhook, view: &View) -> Result<Judged, Unanswerable> {
    let request = decode(body)?;
    let inputs = DecisionInputs { policy: &policy(), view, arrived: Instant::now() };
    let decided = admit(&request, webhook, &inputs, now())?;
    let outcome = Judged { uid: request.uid.to_string(), answer: decided.answer, audit: decided.audit };
    // Every answer is an admission.k8s.io/v1 AdmissionReview that echoes the request's uid.
    let response = outcome.response();
    let answer: Value = serde_json::from_slice(&response.encode()).expect("the answer is JSON");
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(answer["kind"], "AdmissionReview");
    assert_eq!(answer["response"]["uid"].as_str(), Some(&*request.uid), "the answer echoes the uid");
    if webhook == Webhook::Validating {
        assert!(response.patch.is_none(), "only the mutating webhook patches");
    }
    if !response.allowed {
        // 429 for a busy pod; 409 only for a flip to busy on a pod being deleted.
        let code = response.status.as_ref().map(|s| s.code);
        // ...and 403 for a pod's own service account writing more than its own busy flag.
        let expected = code == Some(429)
            || (code == Some(409) && webhook == Webhook::Mutating)
            || (code == Some(403) && webhook == Webhook::Validating);
        assert!(expected, "a refusal is a 429: {code:?}");
        assert!(outcome.audit.is_some(), "every refusal is audited");
    }
    Ok(outcome)
}

/// Any body gets a well-formed answer from both webhooks, or a refusal; never a panic.
pub fn any_body_is_answered_or_refused(body: &[u8], view: &View) {
    for webhook in [Webhook::Mutating, Webhook::Validating] {
        let _ = judge(body, webhook, view);
    }
}

/// A pod as a delete or an eviction sees it, and who asks.
pub struct Disruption<'a> {
    pub pod: &'a Value,
    pub review: &'a Value,
}

/// A pod marked busy, started and not already going, is only let go with an audit line naming an exemption
/// that really applies; a pod not marked busy is never refused. Checked when the review is
/// judged at all; the refusal otherwise.
pub fn busy_pods_go_only_with_an_audited_exemption(
    disruption: Disruption<'_>,
    view: &View,
) -> Result<(), Unanswerable> {
    let body = serde_json::to_vec(disruption.review).unwrap();
    let outcome = judge(&body, Webhook::Validating, view)?;
    let pod = disruption.pod;
    let labels = &pod["metadata"]["labels"];
    let marked_busy = labels["busyguard.io/busy"] == "true";
    // Going, gone, or not started yet (Pending: no task runs): nothing busy to protect.
    let going = pod["metadata"]["deletionTimestamp"].is_string()
        || matches!(pod["status"]["phase"].as_str(), Some("Succeeded" | "Failed" | "Pending"));
    let unready_counts = labels["busyguard.io/busy"] == "when-unready";
    let has_budget = labels["busyguard.io/max-unavailable"].is_string();
    if !marked_busy && !unready_counts && !has_budget {
        assert!(outcome.response().allowed, "a pod not marked busy (and with no budget) is never refused");
    }
    if !outcome.response().allowed {
        // Without a busy-since, max-busy counts from the pod's creation (the API server always
        // sends one; a generated pod may lack it).
        let since = outcome.audit.as_ref().and_then(|audit| audit.busy_since);
        let created = pod["metadata"]["creationTimestamp"].as_str().and_then(|t| t.parse::<Timestamp>().ok());
        let start = since.or(created);
        assert!(start.is_none_or(|start| start.checked_add(CEILING).unwrap() > now()), "held past the ceiling");
        assert!(since.is_none_or(|since| since <= now()), "a busy-since to come counts as none");
    }
    // An eviction is judged from the view, which skips a pod the watch cannot read; a delete
    // carries its pod and is judged whatever the watch makes of it.
    let evicted = disruption.review["request"]["subResource"] == "eviction";
    if !marked_busy || going || !outcome.response().allowed || (evicted && watched(pod).is_none()) {
        return Ok(());
    }
    let audit = outcome.audit.expect("a busy pod let go is audited");
    let request = &disruption.review["request"];
    let since = audit.busy_since;
    match (audit.decision.as_str(), audit.reason.as_str()) {
        ("exempted", "exempt-user") => {
            assert!(policy().exemptions.users.iter().any(|u| *u == request["userInfo"]["username"]));
        }
        ("exempted", "exempt-group") => {
            let groups = request["userInfo"]["groups"].as_array().cloned().unwrap_or_default();
            assert!(groups.iter().any(|g| g == EXEMPT_GROUP), "{groups:?}");
        }
        ("lapsed", "max-busy-exceeded") => {
            let limit = audit.detail.split("max-busy ").nth(1).and_then(|rest| rest.split(':').next()).unwrap();
            let limit = parse_positive_duration(limit).unwrap();
            assert!(since.unwrap().checked_add(limit).unwrap() <= now(), "lapsed early: {}", audit.detail);
        }
        ("lapsed", "stale-after-restart") => {
            let at = audit.detail.split("restarted at ").nth(1).and_then(|rest| rest.split(": the flag").next());
            let at: Timestamp = at.unwrap().parse().unwrap();
            assert!(at > since.unwrap(), "{}", audit.detail);
        }
        ("lapsed", "interrupted") => {
            let marked = &pod["metadata"]["annotations"]["busyguard.io/interrupted"];
            assert!(marked.is_string(), "let go as interrupted without busyguard's mark: {}", audit.detail);
        }
        // Recovery and Karpenter's node deadline: only their own users, and Karpenter's deletes only.
        ("exempted", "node-taint-eviction" | "namespace-deleted") => {
            let user = request["userInfo"]["username"].as_str().unwrap_or_default();
            assert!(
                busyguard::policy::TAINT_MANAGER_USERS.contains(&user)
                    || user == busyguard::policy::NAMESPACE_CONTROLLER_USER,
                "{user}"
            );
        }
        ("exempted", "karpenter-deadline") => {
            assert!(policy().exemptions.karpenter.iter().any(|u| *u == request["userInfo"]["username"]));
            assert_ne!(request["subResource"], "eviction", "Karpenter's evictions are judged like anyone's");
        }
        other => panic!("a busy pod let go without an exemption: {other:?} {}", audit.detail),
    }
    Ok(())
}

/// The patch of a flip to busy applies to the pod it came from; a second look finds nothing
/// to do; the flip back to idle restores the annotations the pod had. Checked when the update
/// of the idle pod `update` carries is judged at all; the refusal otherwise.
pub fn busy_and_back_restores_the_annotations(update: &Value) -> Result<(), Unanswerable> {
    let idle_pod = update["request"]["object"].clone();
    let flip = |review: &Value, to: &str| -> Result<Value, Unanswerable> {
        let mut review = review.clone();
        let pod = &mut review["request"]["object"];
        pod["metadata"]["labels"]["busyguard.io/busy"] = Value::String(to.into());
        let body = serde_json::to_vec(&review).unwrap();
        let outcome = judge(&body, Webhook::Mutating, &View::without_cluster())?;
        assert!(outcome.response().allowed);
        let mut patched = review["request"]["object"].clone();
        if let Some(patch) = &outcome.response().patch {
            use base64::Engine;
            let patch: json_patch::Patch =
                serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(patch).unwrap()).unwrap();
            json_patch::patch(&mut patched, &patch).expect("the patch applies to the object it came from");
        }
        review["request"]["object"] = patched;
        Ok(review)
    };
    let busy = flip(update, "true")?;
    let again = flip(&busy, "true").expect("the patched pod is judged");
    assert_eq!(again["request"]["object"], busy["request"]["object"], "a second look changes nothing");
    let idle = flip(&busy, "false").expect("the patched pod is judged");
    let annotations = |pod: &Value| pod["metadata"]["annotations"].as_object().cloned().unwrap_or_default();
    assert_eq!(annotations(&idle["request"]["object"]), annotations(&idle_pod), "idle again: annotations restored");
    Ok(())
}
