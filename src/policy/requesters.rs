//! Who sends what, as a real API server names the requesters: the controllers and the tools
//! whose requests busyguard tells apart, and where a bound token names its pod.

/// The user every controller of a controller-manager run without
/// `--use-service-account-credentials` speaks as.
pub const SHARED_CONTROLLER_MANAGER_USER: &str = "system:kube-controller-manager";

/// Where the API server names the pod a bound service-account token belongs to.
pub const POD_NAME_CLAIM: &str = "authentication.kubernetes.io/pod-name";

// Who sends what, as a real API server names the requesters (kube-controller-manager with
// `--use-service-account-credentials`).

/// The pod garbage collector deletes pods whose node is gone: nothing is left to protect.
pub const POD_GC_USER: &str = "system:serviceaccount:kube-system:pod-garbage-collector";
/// The garbage collector deletes pods whose owner is gone; it asks once.
pub const GARBAGE_COLLECTOR_USER: &str = "system:serviceaccount:kube-system:generic-garbage-collector";
/// The administrator of clusters set up by hand or by local tools: a person despite the prefix.
pub const LOCAL_ADMIN_USER: &str = "system:admin";
/// The taint managers: the one that deletes the pods of a node that is NotReady or unreachable
/// (or tainted NoExecute), as `node-controller` before Kubernetes 1.29 and
/// `taint-eviction-controller` since; and the one that deletes the pods using a device tainted
/// NoExecute (DRA device taints, KEP-5055, stable in 1.37; PDBs do not hold it either). Broken
/// hardware: what runs there is lost anyway.
pub const TAINT_MANAGER_USERS: [&str; 3] = [
    "system:serviceaccount:kube-system:node-controller",
    "system:serviceaccount:kube-system:taint-eviction-controller",
    "system:serviceaccount:kube-system:device-taint-eviction-controller",
];
/// Deletes the pods a ReplicaSet scales down; it chooses again, and retries, by itself.
pub const REPLICASET_CONTROLLER_USER: &str = "system:serviceaccount:kube-system:replicaset-controller";
/// The namespace controller deletes every pod of a namespace being deleted.
pub const NAMESPACE_CONTROLLER_USER: &str = "system:serviceaccount:kube-system:namespace-controller";
/// The cloud node lifecycle controller deletes a node whose machine is gone; refusing would leave
/// a Node object for nothing. Upstream cloud-provider runs it with the client name
/// `node-controller` (k8s.io/cloud-provider, `ClientName: "node-controller"`); some providers'
/// managers use their own service account by the controller's name.
pub const CLOUD_NODE_LIFECYCLE_USERS: [&str; 2] = [
    "system:serviceaccount:kube-system:node-controller",
    "system:serviceaccount:kube-system:cloud-node-lifecycle-controller",
];
/// The controllers that run pods to completion, as upstream installs them: the Job controller,
/// Argo Workflows' workflow-controller (its quick start's `argo` service account in `argo`) and
/// Tekton Pipelines' controller. `--owner-controller-user`'s default (comma-separated): their
/// deletes of their own pods (a deadline, a suspend, a backoff limit, a success policy, a lowered
/// parallelism; a stop, cancel or timeout) are the workload's own end, not a disruption.
pub const OWNER_CONTROLLER_USERS: &str = "system:serviceaccount:kube-system:job-controller,\
     system:serviceaccount:argo:argo,system:serviceaccount:tekton-pipelines:tekton-pipelines-controller";
/// Karpenter's service account as its chart installs it, in kube-system or in a namespace of
/// its own: `--karpenter-user`'s default (comma-separated).
pub const KARPENTER_USERS: &str =
    "system:serviceaccount:kube-system:karpenter,system:serviceaccount:karpenter:karpenter";

/// The scheduler, whose preemptions place the cluster's critical pods (busyguard's among them).
pub const SCHEDULER_USER: &str = "system:kube-scheduler";
