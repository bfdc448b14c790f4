//! From a decoded AdmissionRequest to the answer: routing by resource, subresource and
//! operation, and the policy's verdict put into wire form. Pure: the caller brings `now` and
//! carries out the audit line.

pub mod review;

use base64::Engine;
use jiff::Timestamp;

use crate::audit::AuditRecord;
use crate::policy::busy::{BusyState, Lapse, busy_state, contract_warnings};
use crate::policy::disruption::{Override, Requester, Verdict, denial_message, judge};
use crate::policy::mutate::{json_patch, plan_annotations};
use crate::policy::pod::Pod;
use crate::policy::{Mode, PolicyConfig};
use review::{AdmissionRequest, AdmissionResponse, InvalidReview, Operation, decode_object};

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
            Decision::Unhandled => "unhandled",
        }
    }
}

#[derive(Debug)]
pub struct Outcome {
    pub response: AdmissionResponse,
    pub decision: Decision,
    pub audit: Option<AuditRecord>,
}

impl Outcome {
    fn plain(response: AdmissionResponse, decision: Decision) -> Self {
        Outcome { response, decision, audit: None }
    }
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
    policy: &PolicyConfig,
    now: Timestamp,
) -> Result<Outcome, InvalidReview> {
    let unhandled = || Ok(Outcome::plain(AdmissionResponse::allow(&request.uid), Decision::Unhandled));
    if resource_label(request) != "pods" {
        return unhandled();
    }
    match (request.operation, webhook) {
        (Operation::Create | Operation::Update, Webhook::Mutating) => mutate_pod(request, policy, now),
        // Deletes carry no patch whichever registration sends them.
        (Operation::Delete, _) => delete_pod(request, policy, now),
        _ => unhandled(),
    }
}

fn mutate_pod(request: &AdmissionRequest, policy: &PolicyConfig, now: Timestamp) -> Result<Outcome, InvalidReview> {
    let pod: Pod = decode_object(&request.object, "object")?;
    let mut response = AdmissionResponse::allow(&request.uid);
    response.warnings = contract_warnings(&pod);
    let patch = json_patch(&pod, &plan_annotations(&pod, policy.mutation, now));
    if patch.0.is_empty() {
        return Ok(Outcome::plain(response, Decision::Allowed));
    }
    let patch = serde_json::to_vec(&patch).expect("a JSONPatch always serializes");
    response.patch_type = Some("JSONPatch");
    response.patch = Some(base64::engine::general_purpose::STANDARD.encode(patch));
    Ok(Outcome::plain(response, Decision::Patched))
}

fn delete_pod(request: &AdmissionRequest, policy: &PolicyConfig, now: Timestamp) -> Result<Outcome, InvalidReview> {
    let pod: Pod = decode_object(&request.old_object, "oldObject")?;
    let state = busy_state(&pod, policy.default_max_busy, now);
    let requester = Requester { username: &request.user_info.username, groups: &request.user_info.groups };
    let verdict = judge(state, requester, &policy.exemptions);
    let (namespace, name) = (&request.namespace, &request.name);
    let busy_since = match state {
        BusyState::Busy { since, .. } => since,
        BusyState::Lapsed { since, .. } => Some(since),
        _ => None,
    };
    let audit = |decision: Decision, reason, detail| AuditRecord {
        time: now,
        uid: request.uid.clone(),
        decision: decision.as_str(),
        reason,
        detail,
        operation: request.operation.as_str(),
        resource: request.resource.resource.clone(),
        subresource: request.sub_resource().to_string(),
        namespace: namespace.clone(),
        pod: name.clone(),
        user: request.user_info.username.clone(),
        groups: request.user_info.groups.clone(),
        busy_since,
        mode: policy.mode,
        dry_run: request.is_dry_run(),
    };
    let allow = AdmissionResponse::allow(&request.uid);
    Ok(match verdict {
        Verdict::Allow => Outcome::plain(allow, Decision::Allowed),
        Verdict::AllowBusy(over) => {
            let decision = match over {
                Override::Lapsed { .. } => Decision::Lapsed,
                Override::ExemptUser(_) | Override::ExemptGroup(_) => Decision::Exempted,
            };
            let detail = override_detail(&over, namespace, name);
            Outcome { response: allow, decision, audit: Some(audit(decision, over.reason(), detail)) }
        }
        Verdict::Deny { since, until } => {
            let message = denial_message(namespace, name, since, until);
            match policy.mode {
                Mode::Enforce => Outcome {
                    response: AdmissionResponse::deny_retry_later(&request.uid, message.clone()),
                    decision: Decision::Denied,
                    audit: Some(audit(Decision::Denied, "busy", message)),
                },
                Mode::DryRun => Outcome {
                    response: AdmissionResponse {
                        warnings: vec![format!("busyguard dry-run, would deny: {message}")],
                        ..allow
                    },
                    decision: Decision::WouldDeny,
                    audit: Some(audit(Decision::WouldDeny, "busy", message)),
                },
            }
        }
    })
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
