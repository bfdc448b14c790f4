//! One function per route (`paths::Route`): each reads its objects and builds the one typed
//! input its policy entry takes. The view is read one of three ways: `trusted_view` where a
//! decision without it would be a guess (503); `view_if_trusted` where the request's pod
//! suffices and the view only confirms it or counts its workload; and as it stands for what it
//! learns apart from the pods' watch (busyguard's own user, the nodes going, whether a pod is
//! guarded), which a decision reads whatever the pods' watch's freshness.

use std::time::Instant;

use jiff::Timestamp;

use super::objects::Object;
use super::paths::Resource;
use super::review::{AdmissionRequest, InvalidReview};
use crate::cluster::view::View;
use crate::policy::budget::Siblings;
use crate::policy::disruption::{Disruption, Taking};
use crate::policy::keys::{AGENT_FIELD_MANAGER, JOB_NAME, KARPENTER_CAPACITY_TYPE};
use crate::policy::outcome::{Decision, Outcome};
use crate::policy::pod::{Pod, PodFacts};
use crate::policy::scale::ScaleRequest;
use crate::policy::selector::Selector;
use crate::policy::{
    Ask, POD_NAME_CLAIM, PolicyConfig, Requester, disruption, hold, mutate, node, owner_task, owners, scale, writes,
};

/// Why no answer could be given: the request is at fault (400), or busyguard cannot decide
/// now (503, so the API server applies the webhook's failurePolicy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unanswerable {
    Invalid(InvalidReview),
    Unavailable(String),
}

impl From<InvalidReview> for Unanswerable {
    fn from(e: InvalidReview) -> Self {
        Unanswerable::Invalid(e)
    }
}

/// What decisions read besides the request.
pub struct DecisionInputs<'a> {
    pub policy: &'a PolicyConfig,
    pub view: &'a View,
    /// When the request arrived, to judge the view's freshness by.
    pub arrived: Instant,
}

impl DecisionInputs<'_> {
    /// The view, when decisions may rely on it now; otherwise why `what` cannot be judged (503).
    fn trusted_view(&self, what: &str) -> Result<&View, Unanswerable> {
        let why = |why| Unanswerable::Unavailable(format!("cannot judge {what}: {why}"));
        self.view.check(self.arrived).map_err(why)?;
        Ok(self.view)
    }

    /// The view, when decisions may rely on it now: where the request's own pod is enough to
    /// answer, and the view only confirms it (for side effects) or adds what it knows.
    fn view_if_trusted(&self) -> Option<&View> {
        self.view.check(self.arrived).is_ok().then_some(self.view)
    }
}

/// A pod created or updated, on the mutating registration.
pub fn pod_mutate(
    request: &AdmissionRequest,
    ask: &Ask<'_>,
    inputs: &DecisionInputs<'_>,
    now: Timestamp,
) -> Result<Outcome, Unanswerable> {
    let (pod, before) = pods(request)?;
    let view = inputs.view;
    let node_going = view.nodes.going(&pod.spec.node_name);
    let by_busyguard = view.own_user() == Some(ask.requester.username);
    let reports_begun_task =
        request.field_manager.as_deref() == Some(AGENT_FIELD_MANAGER) && ask.requester.pod == Some(ask.name);
    let mutation = mutate::Mutation { ask, pod, before, node_going, by_busyguard, reports_begun_task };
    Ok(mutate::mutate_pod(&mutation, inputs.policy, now))
}

/// A `pods/resize`, on the mutating registration: judged for the restart it may cause, not
/// patched (it changes resources alone).
pub fn pod_resize(
    request: &AdmissionRequest,
    ask: &Ask<'_>,
    inputs: &DecisionInputs<'_>,
    now: Timestamp,
) -> Result<Outcome, Unanswerable> {
    let (pod, before) = pods(request)?;
    Ok(mutate::judge_resize(&mutate::Mutation::of(ask, pod, before), inputs.policy, now))
}

/// A pod, its status or its resize written, on a validating registration: the writes of
/// workers, of busyguard's own keys and of busyguard's mark.
pub fn pod_write_check(
    request: &AdmissionRequest,
    ask: &Ask<'_>,
    inputs: &DecisionInputs<'_>,
    now: Timestamp,
) -> Result<Outcome, Unanswerable> {
    let (pod, before) = pods(request)?;
    let view = inputs.view;
    let guarded = |namespace: &str, name: &str| view.holds(namespace, name);
    let writer = writes::writer(&ask.requester, view.own_user(), ask.namespace, pod, guarded);
    let through_status = Resource::of(request) == Resource::PodStatus;
    let write = writes::Write { ask, pod, before, writer, through_status };
    Ok(writes::judge_write(&write, inputs.policy, now))
}

/// A pod deleted: judged on the pod the request carries; the view confirms it for side effects,
/// and counts its workload's unavailable pods for a budget, when it can be trusted.
pub fn pod_delete(
    request: &AdmissionRequest,
    ask: &Ask<'_>,
    inputs: &DecisionInputs<'_>,
    now: Timestamp,
) -> Result<Outcome, Unanswerable> {
    let pod = expect_pod(request.old_object()?, "oldObject")?;
    let mut ask = *ask;
    // A deletecollection's reviews, one per pod, carry no name: the pod has it.
    if ask.name.is_empty() {
        ask.name = &pod.metadata.name;
    }
    // Kueue's preemption of the pod's Job, where its namespace holds it (read only for a Job's pod).
    let job = pod.label(JOB_NAME);
    let preempted = job.is_some_and(|job| inputs.view.preemptions.held(&request.namespace, job));
    let delete = |seen: Option<&dyn PodFacts>, siblings: Option<Siblings>| {
        let delete = Disruption { ask: &ask, taking: Taking::Delete, pod, seen, siblings, preempted };
        disruption::judge_disruption(&delete, inputs.policy, now)
    };
    // The view's record confirms the pod whatever its freshness; its siblings count only when
    // it can be trusted.
    let trusted = inputs.view_if_trusted().is_some();
    let decided = inputs.view.with_pod_under_budget(&request.namespace, ask.name, |seen, siblings| {
        delete(Some(seen), siblings.filter(|_| trusted))
    });
    Ok(decided.unwrap_or_else(|| delete(None, None)))
}

/// An eviction: the request carries no pod, so the view must hold it.
pub fn pod_eviction(
    request: &AdmissionRequest,
    ask: &Ask<'_>,
    inputs: &DecisionInputs<'_>,
    now: Timestamp,
) -> Result<Outcome, Unanswerable> {
    let eviction = match request.object()? {
        Object::Eviction(eviction) => eviction,
        other => return Err(other.mismatch("object", "an Eviction").into()),
    };
    let ask = Ask { dry_run: ask.dry_run || eviction.is_dry_run(), ..*ask };
    // busyguard's own token evicts only what it deferred (and then as anyone would): judged on
    // the view's record whatever its freshness, so a stale view (a 503, which the webhook's
    // Ignore lets through) never hands a stolen token an eviction.
    if inputs.view.own_user() == Some(ask.requester.username) {
        let record = inputs.view.record(&request.namespace, &request.name);
        if let Some(refused) = disruption::refuse_own_eviction(&ask, record.as_ref(), inputs.policy, now) {
            return Ok(refused);
        }
    }
    let view = inputs.trusted_view("the eviction")?;
    let grace_period = eviction.grace_period();
    let decided = view.with_pod_under_budget(&request.namespace, &request.name, |pod, siblings| {
        let taking = Taking::Evict { grace_period };
        let evict = Disruption { ask: &ask, taking, pod, seen: Some(pod), siblings, preempted: false };
        disruption::judge_disruption(&evict, inputs.policy, now)
    });
    // None: not opted in (or no such pod: the API server answers 404 itself).
    Ok(decided.unwrap_or_else(|| Outcome::allow(Decision::Allowed)))
}

/// An owner under a busy rule updated (sent only as it turns busy: the registration's
/// conditions): its pods as the view holds them, one held among them refusing the new task.
pub fn owner_update(
    request: &AdmissionRequest,
    ask: &Ask<'_>,
    inputs: &DecisionInputs<'_>,
    now: Timestamp,
) -> Result<Outcome, Unanswerable> {
    let Some(rule) = owners::rule_for(&inputs.policy.owner_rules, &request.resource.group, &request.kind.kind) else {
        return Ok(Outcome::allow(Decision::Unhandled));
    };
    let view = inputs.trusted_view("an owner's new task")?;
    let key = rule.owner_key(&request.name);
    let pods = view.select(&request.namespace, |pod| pod.owner.as_deref() == Some(key.as_str()));
    let held = pods.iter().find_map(|(name, pod)| {
        let node = pod.node.as_deref().unwrap_or_default();
        Some((name.as_str(), hold::held(pod, node, view.nodes.going(node), inputs.policy.holds, now)?))
    });
    let task = owner_task::NewTask { ask, rule, held: held.as_ref().map(|(pod, hold)| (*pod, hold)) };
    Ok(owner_task::judge_new_task(&task, inputs.policy, now))
}

/// A ReplicaSet's, a Deployment's or their scale's update: a scale-down is prepared with the
/// view's pods; without a trusted view it is let through unprepared, and says why.
pub fn scale_down(
    request: &AdmissionRequest,
    ask: &Ask<'_>,
    inputs: &DecisionInputs<'_>,
    now: Timestamp,
) -> Result<Outcome, Unanswerable> {
    let object = format!("{} {}/{}", Resource::of(request).label(), request.namespace, request.name);
    let scale = scale_request(request, ask, &object)?;
    let select = |selector: &Selector| {
        inputs.view.check(inputs.arrived).map_err(|why| scale::ViewUnavailable(why.to_string()))?;
        Ok(inputs.view.select(&request.namespace, |pod| selector.matches(|key| pod.label(key))))
    };
    Ok(scale::prepare_scale_down(&scale, select, inputs.policy, now))
}

/// A Node deleted: the view says which busy pods run there.
pub fn node_delete(
    request: &AdmissionRequest,
    ask: &Ask<'_>,
    inputs: &DecisionInputs<'_>,
    now: Timestamp,
) -> Result<Outcome, Unanswerable> {
    let view = inputs.trusted_view("the node delete")?;
    Ok(view.on_node(&request.name, |pods| node::judge_node_delete(ask, pods, inputs.policy, now)))
}

/// Karpenter's delete of a NodeClaim: judged by the busy pods of its node, and why Karpenter
/// disrupts it (`node::judge_node_claim_delete`). A NodeClaim with no node yet has none to
/// protect.
pub fn node_claim_delete(
    request: &AdmissionRequest,
    ask: &Ask<'_>,
    inputs: &DecisionInputs<'_>,
    now: Timestamp,
) -> Result<Outcome, Unanswerable> {
    let claim = match request.old_object()? {
        Object::NodeClaim(claim) => claim,
        other => return Err(other.mismatch("oldObject", "a NodeClaim").into()),
    };
    let Some(node_name) = claim.status.node_name.as_deref().filter(|n| !n.is_empty()) else {
        return Ok(Outcome::allow(Decision::Allowed));
    };
    let view = inputs.trusted_view("the NodeClaim delete")?;
    let created = claim.metadata.creation_timestamp.as_deref().and_then(|t| crate::duration::parse_time(t).ok());
    let end = node::NodeClaimEnd {
        disruption: claim.disruption_reason(),
        expired: node::expired(created, claim.spec.expire_after.as_deref(), now),
        node_ending: view.nodes.ending(node_name).is_some(),
        spot: claim.metadata.labels.get(KARPENTER_CAPACITY_TYPE).is_some_and(|t| t == "spot"),
    };
    let claim = node::NodeClaim { ask, node: node_name, end };
    Ok(view.on_node(node_name, |pods| node::judge_node_claim_delete(&claim, pods, inputs.policy, now)))
}

/// The pod a write stores, and the one it replaces (an update).
fn pods<'a>(request: &'a AdmissionRequest<'_>) -> Result<(&'a Pod, Option<&'a Pod>), Unanswerable> {
    let pod = expect_pod(request.object()?, "object")?;
    let before = match request.old_object.as_ref() {
        Some(old) => Some(expect_pod(old, "oldObject")?),
        None => None,
    };
    Ok((pod, before))
}

/// The request as the policy sees it.
pub fn ask<'a>(request: &'a AdmissionRequest<'_>) -> Ask<'a> {
    Ask {
        uid: &request.uid,
        operation: request.operation,
        resource: &request.resource.resource,
        subresource: request.sub_resource(),
        namespace: &request.namespace,
        name: &request.name,
        requester: Requester {
            username: &request.user_info.username,
            groups: &request.user_info.groups,
            pod: request.user_info.extra.get(POD_NAME_CLAIM).and_then(|names| names.first()).map(String::as_str),
        },
        dry_run: request.is_dry_run(),
    }
}

/// The object a pod route reads, or why the request does not fit the route.
fn expect_pod<'a>(object: &'a Object, field: &str) -> Result<&'a Pod, InvalidReview> {
    match object {
        Object::Pod(pod) => Ok(pod),
        other => Err(other.mismatch(field, "a Pod")),
    }
}

fn scale_request<'a>(
    request: &AdmissionRequest,
    ask: &'a Ask<'a>,
    object: &'a str,
) -> Result<ScaleRequest<'a>, InvalidReview> {
    match (request.old_object()?, request.object()?) {
        (Object::Scale(old), Object::Scale(new)) => {
            let selector =
                new.status.selector.as_ref().or(old.status.selector.as_ref()).filter(|s| !s.trim().is_empty());
            Ok(ScaleRequest {
                ask,
                object,
                from: old.spec.replicas,
                to: new.spec.replicas,
                selector: selector.map(|s| s.parse()),
            })
        }
        (Object::Workload(old), Object::Workload(new)) => {
            let selector = new.spec.selector.as_ref().or(old.spec.selector.as_ref());
            let selector = selector.map(Selector::from_label_selector);
            Ok(ScaleRequest { ask, object, from: old.spec.replicas, to: new.spec.replicas, selector })
        }
        (old, new) => Err(InvalidReview(format!(
            "request.oldObject and request.object are a {} and a {}, not two Scales, Deployments or ReplicaSets",
            old.kind(),
            new.kind()
        ))),
    }
}
