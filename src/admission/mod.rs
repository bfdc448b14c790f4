//! From a decoded AdmissionRequest to the answer: routing by resource, subresource and
//! operation, and the policy's verdict put into wire form. No I/O: the caller brings `now` and
//! the view, writes the audit line and sends the side effects.

pub mod objects;
pub mod review;

use std::time::Instant;

use base64::Engine;
use jiff::Timestamp;

use crate::audit::AuditRecord;
use crate::cluster::outbox::{PodRef, SideEffect};
use crate::cluster::view::View;
use crate::policy::busy::{BusyState, Lapse, busy_state, contract_warnings};
use crate::policy::disruption::{Override, Requester, Verdict, denial_message, judge};
use crate::policy::lifecycle::{DELETE_REQUESTED, DeleteRequest, defers_delete};
use crate::policy::mutate::{json_patch, plan_annotations, whole_second};
use crate::policy::pod::{Pod, PodFacts};
use crate::policy::scale::{is_scale_down, plan_scale_down};
use crate::policy::selector::Selector;
use crate::policy::{Mode, PolicyConfig};
use objects::Object;
use review::{AdmissionRequest, AdmissionResponse, InvalidReview, Operation};

/// Which registration called: only the mutating one may answer with a patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Webhook {
    Mutating,
    Validating,
}

impl Webhook {
    pub fn as_str(self) -> &'static str {
        match self {
            Webhook::Mutating => "mutating",
            Webhook::Validating => "validating",
        }
    }
}

/// What happened, for metrics and the request's log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allowed,
    Patched,
    Denied,
    /// Dry-run mode: allowed with a warning, audited as a denial that did not happen.
    WouldDeny,
    /// A busy pod's protection set aside for an exempt requester.
    Exempted,
    /// A pod marked busy whose protection ran out (max-busy, restart).
    Lapsed,
    /// A scale-down, prepared (or not, and why) and allowed.
    ScaleDown,
    /// Not a request busyguard judges: allowed as is.
    Unhandled,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allowed => "allowed",
            Decision::Patched => "patched",
            Decision::Denied => "denied",
            Decision::WouldDeny => "would-deny",
            Decision::Exempted => "exempted",
            Decision::Lapsed => "lapsed",
            Decision::ScaleDown => "scale-down",
            Decision::Unhandled => "unhandled",
        }
    }
}

#[derive(Debug)]
pub struct Outcome {
    pub response: AdmissionResponse,
    pub decision: Decision,
    pub audit: Option<AuditRecord>,
    /// To leave through the outbox once the answer is decided.
    pub effects: Vec<SideEffect>,
    /// The answer waits (within its deadline) for the effects: a scale-down's cost updates
    /// must land before the controller picks pods.
    pub await_effects: bool,
}

impl Outcome {
    fn plain(response: AdmissionResponse, decision: Decision) -> Self {
        Outcome { response, decision, audit: None, effects: Vec::new(), await_effects: false }
    }
}

/// Why no answer could be given: the request is at fault (400), or busyguard cannot decide
/// now (503, so the API server applies the webhook's failurePolicy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Invalid(InvalidReview),
    Unavailable(String),
}

impl From<InvalidReview> for Refusal {
    fn from(e: InvalidReview) -> Self {
        Refusal::Invalid(e)
    }
}

/// What decisions read besides the request.
pub struct Context<'a> {
    pub policy: &'a PolicyConfig,
    pub view: &'a View,
    /// When the request arrived, to judge the view's freshness by.
    pub arrived: Instant,
}

/// The resource as a metric label, from a fixed set so clients cannot grow the label space.
pub fn resource_label(request: &AdmissionRequest) -> &'static str {
    match (request.resource.group.as_str(), request.resource.resource.as_str(), request.sub_resource()) {
        ("", "pods", "") => "pods",
        ("", "pods", "eviction") => "pods/eviction",
        ("apps", "replicasets", "") => "replicasets",
        ("apps", "replicasets", "scale") => "replicasets/scale",
        ("apps", "deployments", "") => "deployments",
        ("apps", "deployments", "scale") => "deployments/scale",
        _ => "other",
    }
}

pub fn admit(
    request: &AdmissionRequest,
    webhook: Webhook,
    context: &Context<'_>,
    now: Timestamp,
) -> Result<Outcome, Refusal> {
    match (resource_label(request), request.operation, webhook) {
        ("pods", Operation::Create | Operation::Update, Webhook::Mutating) => mutate_pod(request, context.policy, now),
        // Only the mutating registration may patch; the judging paths answer on either.
        ("pods", Operation::Delete, _) => delete_pod(request, context.policy, now),
        ("pods/eviction", Operation::Create, _) => evict_pod(request, context, now),
        ("replicasets" | "deployments" | "replicasets/scale" | "deployments/scale", Operation::Update, _) => {
            scale_down(request, context, now)
        }
        _ => Ok(Outcome::plain(AdmissionResponse::allow(&request.uid), Decision::Unhandled)),
    }
}

fn mutate_pod(request: &AdmissionRequest, policy: &PolicyConfig, now: Timestamp) -> Result<Outcome, Refusal> {
    let pod = expect_pod(request.object()?, "object")?;
    let mut response = AdmissionResponse::allow(&request.uid);
    response.warnings = contract_warnings(pod, policy.max_busy);
    let patch = json_patch(pod, &plan_annotations(pod, policy.mutation, policy.max_busy, now));
    if patch.0.is_empty() {
        return Ok(Outcome::plain(response, Decision::Allowed));
    }
    let patch = serde_json::to_vec(&patch).expect("a JSONPatch always serializes");
    response.patch_type = Some("JSONPatch");
    response.patch = Some(base64::engine::general_purpose::STANDARD.encode(patch));
    Ok(Outcome::plain(response, Decision::Patched))
}

fn delete_pod(request: &AdmissionRequest, policy: &PolicyConfig, now: Timestamp) -> Result<Outcome, Refusal> {
    let pod = expect_pod(request.old_object()?, "oldObject")?;
    let target = Target { pod, uid: &pod.metadata.uid, dry_run: request.is_dry_run(), is_delete: true };
    Ok(judge_disruption(request, policy, target, now))
}

/// The object a pod route reads, or why the request does not fit the route.
fn expect_pod<'a>(object: &'a Object, field: &str) -> Result<&'a Pod, InvalidReview> {
    match object {
        Object::Pod(pod) => Ok(pod),
        other => Err(other.mismatch(field, "a Pod")),
    }
}

fn evict_pod(request: &AdmissionRequest, context: &Context<'_>, now: Timestamp) -> Result<Outcome, Refusal> {
    let eviction = match request.object()? {
        Object::Eviction(eviction) => eviction,
        other => return Err(other.mismatch("object", "an Eviction").into()),
    };
    let dry_run = request.is_dry_run() || eviction.is_dry_run();
    (context.view.check(context.arrived))
        .map_err(|why| Refusal::Unavailable(format!("cannot judge the eviction: {why}")))?;
    let judged = context.view.with_pod(&request.namespace, &request.name, |pod| {
        let target = Target { pod, uid: &pod.uid, dry_run, is_delete: false };
        judge_disruption(request, context.policy, target, now)
    });
    // None: not opted in (or no such pod: the API server answers 404 itself).
    Ok(judged.unwrap_or_else(|| Outcome::plain(AdmissionResponse::allow(&request.uid), Decision::Allowed)))
}

/// The pod a delete or an eviction would take away.
struct Target<'a, P> {
    pod: &'a P,
    uid: &'a str,
    dry_run: bool,
    is_delete: bool,
}

fn judge_disruption<P: PodFacts>(
    request: &AdmissionRequest,
    policy: &PolicyConfig,
    target: Target<'_, P>,
    now: Timestamp,
) -> Outcome {
    let state = busy_state(target.pod, policy.max_busy, now);
    let requester = Requester { username: &request.user_info.username, groups: &request.user_info.groups };
    let verdict = judge(state, requester, &policy.exemptions);
    let (namespace, name) = (&request.namespace, &request.name);
    let busy_since = match state {
        BusyState::Busy { since, .. } => since,
        BusyState::Lapsed { since, .. } => Some(since),
        _ => None,
    };
    let audit = |decision: Decision, reason, detail| AuditRecord {
        decision: decision.as_str(),
        reason,
        detail,
        busy_since,
        dry_run: target.dry_run,
        ..audit_of(request, policy, now)
    };
    let allow = AdmissionResponse::allow(&request.uid);
    match verdict {
        Verdict::Allow => Outcome::plain(allow, Decision::Allowed),
        Verdict::AllowBusy(over) => {
            let decision = match over {
                Override::Lapsed { .. } => Decision::Lapsed,
                Override::ExemptUser(_) | Override::ExemptGroup(_) => Decision::Exempted,
            };
            let detail = override_detail(&over, namespace, name);
            Outcome { audit: Some(audit(decision, over.reason(), detail)), ..Outcome::plain(allow, decision) }
        }
        Verdict::Deny { since, until } => {
            let pod = PodRef { namespace: namespace.clone(), name: name.clone(), uid: target.uid.to_string() };
            let deferred = target.is_delete && !target.dry_run && defers_delete(requester);
            let mut message = denial_message(namespace, name, since, until);
            if deferred {
                message.push_str(&format!(
                    "; the delete is recorded ({DELETE_REQUESTED}) and busyguard carries it out once the pod is idle"
                ));
            }
            if policy.mode == Mode::DryRun {
                return Outcome {
                    audit: Some(audit(Decision::WouldDeny, "busy", message.clone())),
                    ..Outcome::plain(
                        AdmissionResponse {
                            warnings: vec![format!("busyguard dry-run, would deny: {message}")],
                            ..allow
                        },
                        Decision::WouldDeny,
                    )
                };
            }
            let mut effects = Vec::new();
            if !target.dry_run {
                let action = if target.is_delete { "Delete" } else { "Evict" };
                effects.push(SideEffect::Event { pod: pod.clone(), action, note: message.clone() });
            }
            if deferred && DeleteRequest::of(target.pod).is_none() {
                let request = DeleteRequest { by: request.user_info.username.clone(), at: whole_second(now) };
                effects.push(SideEffect::MarkDeleteRequested { pod, request });
            }
            Outcome {
                response: AdmissionResponse::deny_retry_later(&request.uid, message.clone()),
                decision: Decision::Denied,
                audit: Some(audit(Decision::Denied, if deferred { "busy-delete-deferred" } else { "busy" }, message)),
                effects,
                await_effects: false,
            }
        }
    }
}

/// An audit line naming the request: who asked what of which object.
fn audit_of(request: &AdmissionRequest, policy: &PolicyConfig, now: Timestamp) -> AuditRecord {
    AuditRecord {
        uid: request.uid.clone(),
        operation: request.operation.as_str(),
        resource: request.resource.resource.clone(),
        subresource: request.sub_resource().to_string(),
        namespace: request.namespace.clone(),
        name: request.name.clone(),
        user: request.user_info.username.clone(),
        groups: request.user_info.groups.clone(),
        dry_run: request.is_dry_run(),
        ..AuditRecord::new(now, policy.mode)
    }
}

fn override_detail(over: &Override, namespace: &str, name: &str) -> String {
    let pod = format!("pod {namespace}/{name}");
    match over {
        Override::Lapsed { since, lapse: Lapse::MaxBusy { limit } } => {
            format!("{pod} busy since {since} for longer than max-busy {limit:#}: no longer protected")
        }
        Override::Lapsed { since, lapse: Lapse::Restarted { at } } => {
            format!("{pod} marked busy since {since}, but a container restarted at {at}: the flag is stale")
        }
        Override::ExemptUser(user) => format!("{pod} is busy; user {user} is exempt"),
        Override::ExemptGroup(group) => format!("{pod} is busy; group {group} is exempt"),
    }
}

/// Replicas before and after, and the pods' selector (`None`: the object has none).
struct ScaleRequest {
    from: Option<i32>,
    to: Option<i32>,
    selector: Option<Result<Selector, String>>,
}

fn scale_request(request: &AdmissionRequest) -> Result<ScaleRequest, Refusal> {
    match (request.old_object()?, request.object()?) {
        (Object::Scale(old), Object::Scale(new)) => {
            let selector =
                new.status.selector.as_ref().or(old.status.selector.as_ref()).filter(|s| !s.trim().is_empty());
            Ok(ScaleRequest { from: old.spec.replicas, to: new.spec.replicas, selector: selector.map(|s| s.parse()) })
        }
        (Object::Workload(old), Object::Workload(new)) => {
            let selector = new.spec.selector.as_ref().or(old.spec.selector.as_ref());
            let selector = selector.map(Selector::from_label_selector);
            Ok(ScaleRequest { from: old.spec.replicas, to: new.spec.replicas, selector })
        }
        (old, new) => Err(InvalidReview(format!(
            "request.oldObject and request.object are a {} and a {}, not two Scales, Deployments or ReplicaSets",
            old.kind(),
            new.kind()
        ))
        .into()),
    }
}

/// Never denies. Before the controller picks pods to remove, the costs it ranks them by are
/// brought up to date, and the plan is audited.
fn scale_down(request: &AdmissionRequest, context: &Context<'_>, now: Timestamp) -> Result<Outcome, Refusal> {
    let ScaleRequest { from, to, selector } = scale_request(request)?;
    let allow = || AdmissionResponse::allow(&request.uid);
    let Some((from, to)) = is_scale_down(from, to) else {
        return Ok(Outcome::plain(allow(), Decision::Allowed));
    };
    let policy = context.policy;
    let kind = resource_label(request);
    let object = format!("{kind} {}/{}", request.namespace, request.name);
    let audit = |reason, detail: String, plan| AuditRecord {
        decision: Decision::ScaleDown.as_str(),
        reason,
        detail,
        plan,
        ..audit_of(request, policy, now)
    };
    let unprepared = |reason, why: String| {
        let detail = format!("{object} {from}→{to}: pods not prepared, {why}");
        Ok(Outcome { audit: Some(audit(reason, detail, None)), ..Outcome::plain(allow(), Decision::ScaleDown) })
    };
    let selector = match selector {
        None => return unprepared("no-selector", "the object has no selector".into()),
        Some(Err(e)) => return unprepared("invalid-selector", format!("its selector does not parse: {e}")),
        Some(Ok(selector)) if selector.is_empty() => return unprepared("no-selector", "its selector is empty".into()),
        Some(Ok(selector)) => selector,
    };
    if let Err(why) = context.view.check(context.arrived) {
        return unprepared("view-unavailable", why.to_string());
    }
    let pods = context.view.select(&request.namespace, |pod| selector.matches(|key| pod.label(key)));
    if pods.is_empty() {
        return Ok(Outcome::plain(allow(), Decision::Allowed));
    }
    let states: Vec<BusyState> = pods.iter().map(|(_, pod)| busy_state(pod, policy.max_busy, now)).collect();
    let effects: Vec<SideEffect> = if request.is_dry_run() {
        Vec::new()
    } else {
        pods.iter()
            .filter_map(|(name, pod)| {
                let changes = plan_annotations(pod, policy.mutation, policy.max_busy, now);
                (!changes.is_empty()).then(|| SideEffect::Refresh {
                    pod: PodRef { namespace: request.namespace.clone(), name: name.clone(), uid: pod.uid.to_string() },
                    resource_version: pod.resource_version.to_string(),
                    changes,
                })
            })
            .collect()
    };
    let plan = plan_scale_down(from, to, &states, effects.len());
    let detail = format!(
        "{object} {from}→{to}: takes {} idle pod(s) now, waits for {} busy pod(s), spares {} busy pod(s); \
         {} pod(s) had stale busyguard annotations",
        plan.idle_taken, plan.busy_waited, plan.busy_spared, plan.refreshed
    );
    Ok(Outcome {
        response: allow(),
        decision: Decision::ScaleDown,
        audit: Some(audit("plan", detail, Some(plan))),
        effects,
        await_effects: true,
    })
}
