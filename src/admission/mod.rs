//! From a decoded AdmissionRequest to the policy's Outcome: routing by resource, subresource
//! and operation, the view looked up where the request does not carry the pod, and the request
//! handed to the one policy file that decides its path. No decision is made here.

pub mod objects;
pub mod review;

use std::time::Instant;

use jiff::Timestamp;
use objects::Object;
use review::{AdmissionRequest, InvalidReview, Operation};

use crate::cluster::view::View;
use crate::policy::budget::Siblings;
use crate::policy::disruption::Disruption;
use crate::policy::outcome::{Action, Decision, Outcome};
use crate::policy::pod::{Pod, PodFacts};
use crate::policy::scale::ScaleRequest;
use crate::policy::selector::Selector;
use crate::policy::{Ask, POD_NAME_CLAIM, PolicyConfig, Requester, disruption, mutate, node, scale, writes};

/// Which registration called: only the mutating one may answer with a patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "lowercase")]
pub enum Webhook {
    Mutating,
    Validating,
}

impl Webhook {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// What a request is about, parsed once from its group, resource and subresource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    Pods,
    /// `pods/status`: labels and annotations can be written there too, out of every mutating
    /// webhook's sight.
    PodStatus,
    /// `pods/resize` (Kubernetes 1.33 and later): a container's resources changed in place.
    PodResize,
    Nodes,
    PodEviction,
    ReplicaSets,
    Deployments,
    ReplicaSetScale,
    DeploymentScale,
    Other,
}

impl Resource {
    pub fn of(request: &AdmissionRequest) -> Resource {
        match (request.resource.group.as_str(), request.resource.resource.as_str(), request.sub_resource()) {
            ("", "pods", "") => Resource::Pods,
            ("", "pods", "status") => Resource::PodStatus,
            ("", "pods", "resize") => Resource::PodResize,
            ("", "nodes", "") => Resource::Nodes,
            ("", "pods", "eviction") => Resource::PodEviction,
            ("apps", "replicasets", "") => Resource::ReplicaSets,
            ("apps", "deployments", "") => Resource::Deployments,
            ("apps", "replicasets", "scale") => Resource::ReplicaSetScale,
            ("apps", "deployments", "scale") => Resource::DeploymentScale,
            _ => Resource::Other,
        }
    }

    /// As a metric label, from a fixed set so clients cannot grow the label space.
    pub fn label(self) -> &'static str {
        match self {
            Resource::Pods => "pods",
            Resource::PodStatus => "pods/status",
            Resource::PodResize => "pods/resize",
            Resource::Nodes => "nodes",
            Resource::PodEviction => "pods/eviction",
            Resource::ReplicaSets => "replicasets",
            Resource::Deployments => "deployments",
            Resource::ReplicaSetScale => "replicasets/scale",
            Resource::DeploymentScale => "deployments/scale",
            Resource::Other => "other",
        }
    }
}

/// Which path decides a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// A pod created or updated: the mutating webhook plans annotations.
    PodWrite,
    PodDelete,
    PodEviction,
    /// A ReplicaSet, a Deployment or the scale of either, updated: maybe a scale-down.
    ScaleDown,
    NodeDelete,
    /// Not a request busyguard judges.
    Other,
}

impl Route {
    pub fn of(resource: Resource, operation: Operation) -> Route {
        use Resource::*;
        match (resource, operation) {
            (Pods, Operation::Create | Operation::Update) | (PodStatus | PodResize, Operation::Update) => {
                Route::PodWrite
            }
            (Pods, Operation::Delete) => Route::PodDelete,
            (PodEviction, Operation::Create) => Route::PodEviction,
            (ReplicaSets | Deployments | ReplicaSetScale | DeploymentScale, Operation::Update) => Route::ScaleDown,
            (Nodes, Operation::Delete) => Route::NodeDelete,
            _ => Route::Other,
        }
    }
}

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
}

pub fn admit(
    request: &AdmissionRequest,
    webhook: Webhook,
    inputs: &DecisionInputs<'_>,
    now: Timestamp,
) -> Result<Outcome, Unanswerable> {
    let policy = inputs.policy;
    let resource = Resource::of(request);
    match Route::of(resource, request.operation) {
        // Only the mutating registration may patch; the judging paths answer on either.
        Route::PodWrite => {
            let pod = expect_pod(request.object()?, "object")?;
            let before = match request.old_object.as_ref() {
                Some(old) => Some(expect_pod(old, "oldObject")?),
                None => None,
            };
            let ask = ask(request, request.is_dry_run());
            let through_status = resource == Resource::PodStatus;
            Ok(match (webhook, resource) {
                (Webhook::Mutating, Resource::PodStatus) => Outcome::allow(Decision::Unhandled),
                // A resize changes resources alone: judged for the restart it may cause, not patched.
                (Webhook::Mutating, Resource::PodResize) => match before {
                    Some(before) => mutate::judge_resize(&ask, pod, before, policy, now),
                    None => Outcome::allow(Decision::Unhandled),
                },
                (Webhook::Mutating, _) => {
                    let node_going = inputs.view.node_going(&pod.spec.node_name);
                    let by_busyguard = inputs.view.own_user() == Some(ask.requester.username);
                    let mutation = mutate::Mutation { ask: &ask, pod, before, node_going, by_busyguard };
                    mutate::mutate_pod(&mutation, policy, now)
                }
                // The validating registrations see the writes of workers, of busyguard's own
                // keys and of busyguard's mark.
                (Webhook::Validating, _) => {
                    let guarded = |namespace: &str, name: &str| inputs.view.holds(namespace, name);
                    let writer = writes::writer(&ask.requester, inputs.view.own_user(), ask.namespace, pod, guarded);
                    writes::judge_write(&ask, pod, before, writer, through_status, policy, now)
                }
            })
        }
        Route::PodDelete => {
            let pod = expect_pod(request.old_object()?, "oldObject")?;
            let mut ask = ask(request, request.is_dry_run());
            // A deletecollection's reviews, one per pod, carry no name: the pod has it.
            if ask.name.is_empty() {
                ask.name = &pod.metadata.name;
            }
            let name = ask.name;
            // Judged on the pod the request carries; the view confirms it for side effects, and
            // counts its workload's unavailable pods for a budget (when it can be trusted).
            let trusted = inputs.view.check(inputs.arrived).is_ok();
            let delete = |seen: Option<&dyn PodFacts>, siblings: Option<Siblings>| {
                let siblings = siblings.filter(|_| trusted);
                let delete = Disruption {
                    ask: &ask,
                    action: Action::Delete,
                    pod,
                    seen,
                    siblings,
                    grace_period: None,
                    container: None,
                };
                disruption::judge_disruption(&delete, policy, now)
            };
            let view = inputs.view;
            let decided =
                view.with_pod_under_budget(&request.namespace, name, |seen, siblings| delete(Some(seen), siblings));
            Ok(decided.unwrap_or_else(|| delete(None, None)))
        }
        Route::PodEviction => {
            let eviction = match request.object()? {
                Object::Eviction(eviction) => eviction,
                other => return Err(other.mismatch("object", "an Eviction").into()),
            };
            let ask = ask(request, request.is_dry_run() || eviction.is_dry_run());
            let view = inputs.trusted_view("the eviction")?;
            let decided = view.with_pod_under_budget(&request.namespace, &request.name, |pod, siblings| {
                let grace_period = eviction.grace_period();
                let evict = Disruption {
                    ask: &ask,
                    action: Action::Evict,
                    pod,
                    seen: Some(pod),
                    siblings,
                    grace_period,
                    container: None,
                };
                disruption::judge_disruption(&evict, policy, now)
            });
            // None: not opted in (or no such pod: the API server answers 404 itself).
            Ok(decided.unwrap_or_else(|| Outcome::allow(Decision::Allowed)))
        }
        Route::ScaleDown => {
            let object = format!("{} {}/{}", resource.label(), request.namespace, request.name);
            let select = |selector: &Selector| {
                inputs.view.check(inputs.arrived).map_err(|why| why.to_string())?;
                Ok(inputs.view.select(&request.namespace, |pod| selector.matches(|key| pod.label(key))))
            };
            let scale = scale_request(request)?;
            Ok(scale::prepare_scale_down(&ask(request, request.is_dry_run()), &object, scale, select, policy, now))
        }
        Route::NodeDelete => {
            let view = inputs.trusted_view("the node delete")?;
            let ask = ask(request, request.is_dry_run());
            Ok(view.on_node(&request.name, |pods| node::judge_node_delete(&ask, pods, policy, now)))
        }
        Route::Other => Ok(Outcome::allow(Decision::Unhandled)),
    }
}

/// The request as the policy sees it.
fn ask(request: &AdmissionRequest, dry_run: bool) -> Ask<'_> {
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
        dry_run,
    }
}

/// The object a pod route reads, or why the request does not fit the route.
fn expect_pod<'a>(object: &'a Object, field: &str) -> Result<&'a Pod, InvalidReview> {
    match object {
        Object::Pod(pod) => Ok(pod),
        other => Err(other.mismatch(field, "a Pod")),
    }
}

fn scale_request(request: &AdmissionRequest) -> Result<ScaleRequest, InvalidReview> {
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
        ))),
    }
}
