//! What a request is, read once: which registration called, about which resource, and so which
//! route decides it.

use super::review::{AdmissionRequest, Operation};

/// Which registration called: only the mutating one may answer with a patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::EnumCount, strum::EnumIter)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumCount, strum::EnumIter)]
pub enum Resource {
    Pods,
    /// `pods/status`: labels and annotations can be written there too, out of every mutating
    /// webhook's sight.
    PodStatus,
    /// `pods/resize` (Kubernetes 1.33 and later): a container's resources changed in place.
    PodResize,
    Nodes,
    /// Karpenter's NodeClaims (`karpenter.sh`).
    NodeClaims,
    PodEviction,
    ReplicaSets,
    Deployments,
    ReplicaSetScale,
    DeploymentScale,
    Other,
}

impl Resource {
    pub fn of(request: &AdmissionRequest) -> Resource {
        match (&*request.resource.group, &*request.resource.resource, request.sub_resource()) {
            ("", "pods", "") => Resource::Pods,
            ("", "pods", "status") => Resource::PodStatus,
            ("", "pods", "resize") => Resource::PodResize,
            ("", "nodes", "") => Resource::Nodes,
            ("karpenter.sh", "nodeclaims", "") => Resource::NodeClaims,
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
            Resource::NodeClaims => "nodeclaims",
            Resource::PodEviction => "pods/eviction",
            Resource::ReplicaSets => "replicasets",
            Resource::Deployments => "deployments",
            Resource::ReplicaSetScale => "replicasets/scale",
            Resource::DeploymentScale => "deployments/scale",
            Resource::Other => "other",
        }
    }
}

/// Which path decides a request: one function each in `routes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// A pod created or updated, on the mutating registration: its annotations planned.
    PodMutate,
    /// A `pods/resize`, on the mutating registration: judged for the restart it may cause.
    PodResize,
    /// A pod, its status or its resize written, on a validating registration: who may write what.
    PodWriteCheck,
    PodDelete,
    PodEviction,
    /// A ReplicaSet, a Deployment or the scale of either, updated: maybe a scale-down.
    ScaleDown,
    NodeDelete,
    /// Karpenter's delete of a NodeClaim: irrevocable once made, so judged before its node drains.
    NodeClaimDelete,
    /// Another resource updated, on the validating registration: an owner under a busy rule
    /// taking a new task, where its registration sends those (Agones' allocations).
    OwnerUpdate,
    /// Not a request busyguard judges (`pods/status` on the mutating registration among them).
    Unhandled,
}

impl Route {
    pub fn of(webhook: Webhook, resource: Resource, operation: Operation) -> Route {
        use Resource::*;
        match (webhook, resource, operation) {
            (Webhook::Mutating, Pods, Operation::Create | Operation::Update) => Route::PodMutate,
            (Webhook::Mutating, PodResize, Operation::Update) => Route::PodResize,
            (Webhook::Validating, Pods, Operation::Create | Operation::Update)
            | (Webhook::Validating, PodStatus | PodResize, Operation::Update) => Route::PodWriteCheck,
            (_, Pods, Operation::Delete) => Route::PodDelete,
            (_, PodEviction, Operation::Create) => Route::PodEviction,
            (_, ReplicaSets | Deployments | ReplicaSetScale | DeploymentScale, Operation::Update) => Route::ScaleDown,
            (_, Nodes, Operation::Delete) => Route::NodeDelete,
            (Webhook::Validating, NodeClaims, Operation::Delete) => Route::NodeClaimDelete,
            (Webhook::Validating, Other, Operation::Update) => Route::OwnerUpdate,
            _ => Route::Unhandled,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Operation::{Connect, Create, Delete, Update};
    use Resource::*;
    use Webhook::{Mutating, Validating};

    /// Every registration, resource and operation, and the route it takes: a change of route is
    /// a change of this table.
    #[test]
    fn each_request_takes_its_route() {
        let table: [(Webhook, Resource, Operation, Route); 24] = [
            (Mutating, Pods, Create, Route::PodMutate),
            (Mutating, Pods, Update, Route::PodMutate),
            (Mutating, PodResize, Update, Route::PodResize),
            (Mutating, PodStatus, Update, Route::Unhandled),
            (Validating, Pods, Create, Route::PodWriteCheck),
            (Validating, Pods, Update, Route::PodWriteCheck),
            (Validating, PodStatus, Update, Route::PodWriteCheck),
            (Validating, PodResize, Update, Route::PodWriteCheck),
            (Validating, Pods, Delete, Route::PodDelete),
            (Mutating, Pods, Delete, Route::PodDelete),
            (Validating, PodEviction, Create, Route::PodEviction),
            (Validating, ReplicaSets, Update, Route::ScaleDown),
            (Validating, Deployments, Update, Route::ScaleDown),
            (Validating, ReplicaSetScale, Update, Route::ScaleDown),
            (Validating, DeploymentScale, Update, Route::ScaleDown),
            (Validating, ReplicaSets, Delete, Route::Unhandled),
            (Validating, Nodes, Delete, Route::NodeDelete),
            (Validating, Nodes, Update, Route::Unhandled),
            (Validating, NodeClaims, Delete, Route::NodeClaimDelete),
            (Validating, NodeClaims, Update, Route::Unhandled),
            (Validating, Other, Update, Route::OwnerUpdate),
            (Mutating, Other, Update, Route::Unhandled),
            (Validating, Other, Delete, Route::Unhandled),
            (Validating, Pods, Connect, Route::Unhandled),
        ];
        for (webhook, resource, operation, route) in table {
            assert_eq!(Route::of(webhook, resource, operation), route, "{webhook:?} {resource:?} {operation:?}");
        }
    }
}
