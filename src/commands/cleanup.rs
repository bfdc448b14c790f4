//! `busyguard cleanup`: what an uninstall leaves on the cluster, taken off with the user's own
//! credentials once busyguard's webhooks are gone: on every opted-in pod, the user's own deletion
//! cost and autoscaler annotations back in place of the busy ones, and busyguard's marks
//! (busy-since, the saved values, the protected label, deferred deletes, refused evictions, the
//! descheduler's eviction-in-progress it wrote) removed; every
//! busy-pod PodDisruptionBudget busyguard kept, and the Leases where it recorded the pods let go
//! under workload budgets. The busy label itself is the user's and stays.

use std::fmt::Debug;

use anyhow::{Context, bail};
use clap::Args;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::cluster::view::ApiPod;
use crate::cluster::{ClusterSource, client_config};
use crate::config::UsersCluster;
use crate::policy::BUSYGUARD_NAMESPACE;
use crate::policy::budget::LEASE_PREFIX;
use crate::policy::busy::MaxBusy;
use crate::policy::keys::{
    BUSY_LABEL, DELETE_REQUESTED, DISRUPTION_REQUESTED, EVICTION_IN_PROGRESS, FIELD_MANAGER, RELEASED_FROM,
    managed_by_busyguard,
};
use crate::policy::marks::{Mark, MutationSettings, On, plan};
use crate::policy::pdb::BUSY_PDB_NAME;

#[derive(Debug, Args)]
pub struct CleanupArgs {
    #[command(flatten)]
    pub cluster: UsersCluster,
    /// Say what would change, and change nothing (the API server's dry run).
    #[arg(long)]
    pub dry_run: bool,
    /// The `--busy-annotation`s busyguard was serving with: restored or removed too.
    #[arg(long = "busy-annotation", value_name = "KEY=VALUE", value_parser = |text: &str| Mark::parse(On::Annotation, text))]
    pub busy_annotations: Vec<Mark>,
    /// The `--busy-label`s busyguard was serving with: restored or removed too.
    #[arg(long = "busy-label", value_name = "KEY=VALUE", value_parser = |text: &str| Mark::parse(On::Label, text))]
    pub busy_labels: Vec<Mark>,
}

/// The merge patch that leaves `pod` as if busyguard had never seen it (its busy label aside),
/// or `None` when nothing of busyguard's is on it. Every annotation busyguard may have written is
/// restored or removed, whatever it was set to write, and so are `marks`.
pub fn restore_patch(pod: &ApiPod, marks: &'static [Mark], now: Timestamp) -> Option<Value> {
    let everything = MutationSettings { marks, ..MutationSettings::ALL };
    let request_marks = [DELETE_REQUESTED, RELEASED_FROM, DISRUPTION_REQUESTED, EVICTION_IN_PROGRESS];
    let meta = &pod.metadata;
    let marked = meta.labels.as_ref().is_some_and(|l| l.contains_key(DELETE_REQUESTED))
        || meta.annotations.as_ref().is_some_and(|a| request_marks.iter().any(|k| a.contains_key(*k)));
    // As a pod that is not opted in: the idle plan, which restores the user's values.
    let idle = plan(&pod.record(marks).left_alone(), None, everything, MaxBusy::new(SignedDuration::MAX), now);
    if idle.is_empty() && !marked {
        return None;
    }
    let mut changes = idle.changes();
    for key in request_marks {
        changes.annotations.insert(key, None);
    }
    changes.labels.insert(DELETE_REQUESTED, None);
    Some(changes.merge_patch())
}

/// What cleanup says of a pod it restored. A pod busyguard released from its ReplicaSet is an
/// orphan, and the record of that (`released-from`) goes with the rest: say it, since nothing
/// but a person deletes it once its task is done.
fn restored(pod: &ApiPod, verb: &str) -> String {
    let (namespace, name) = (pod.namespace(), pod.name());
    match pod.metadata.annotations.as_ref().and_then(|a| a.get(RELEASED_FROM)) {
        Some(hash) => format!(
            "pod {namespace}/{name}: {verb}; released from its ReplicaSet (pod-template-hash {hash}), no controller \
             owns it: delete it once its task is done\n"
        ),
        None => format!("pod {namespace}/{name}: {verb}\n"),
    }
}

/// Deletes the objects of kind `K` in `scope` that carry busyguard's label and a name `named` says
/// is one busyguard gives, and says so, one line each.
async fn delete_ours<K>(
    client: &kube::Client,
    scope: Option<&str>,
    named: impl Fn(&str) -> bool,
    dry_run: bool,
) -> anyhow::Result<String>
where
    K: kube::Resource<Scope = NamespaceResourceScope, DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let kind = K::kind(&());
    let objects: Api<K> = scope.map_or_else(|| Api::all(client.clone()), |n| Api::namespaced(client.clone(), n));
    let labelled = ListParams::default().labels(&managed_by_busyguard());
    let listed = objects.list(&labelled).await.with_context(|| format!("listing busyguard's {kind}s"))?;
    let (mut out, verb) = (String::new(), if dry_run { "would delete" } else { "deleted" });
    for object in listed.items.iter().filter(|object| named(&object.name_any())) {
        let (namespace, name) = (object.namespace().unwrap_or_default(), object.name_any());
        Api::<K>::namespaced(client.clone(), &namespace)
            .delete(&name, &DeleteParams { dry_run, ..DeleteParams::default() })
            .await
            .with_context(|| format!("deleting {kind} {namespace}/{name}"))?;
        out.push_str(&format!("{} {namespace}/{name}: {verb}\n", kind.to_lowercase()));
    }
    Ok(out)
}

/// Cleans the namespaces given (all without) and says what it did, one line each.
pub async fn run(
    source: &ClusterSource,
    namespaces: &[String],
    marks: &'static [Mark],
    dry_run: bool,
) -> anyhow::Result<String> {
    let config = client_config(source).await?.context(crate::cluster::NO_CLUSTER)?;
    let reading = format!("reading the webhook configurations from the API server at {}", config.cluster_url);
    let client = kube::Client::try_from(config).context("building the Kubernetes client")?;
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let registered = mutating.get_opt("busyguard").await.context(reading.clone())?.is_some()
        || validating.get_opt("busyguard").await.context(reading)?.is_some();
    let remove_first = "remove them first (kubectl delete mutatingwebhookconfiguration,validatingwebhookconfiguration \
                        busyguard)";
    if registered && !dry_run {
        bail!(
            "busyguard's webhooks are still registered, and would put back what this takes off: {remove_first}, \
             then run busyguard cleanup again (--dry-run previews it now)"
        );
    }
    let scopes: Vec<Option<&str>> =
        if namespaces.is_empty() { vec![None] } else { namespaces.iter().map(|n| Some(n.as_str())).collect() };
    let (mut out, now) = (String::new(), Timestamp::now());
    if registered {
        // A preview before an uninstall: nothing is changed, so busyguard puts nothing back.
        out.push_str(&format!("busyguard's webhooks are still registered: a preview; {remove_first} to clean up\n"));
    }
    let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), dry_run, ..PatchParams::default() };
    let verb = if dry_run { "would restore" } else { "restored" };
    for scope in scopes {
        let pods: Api<ApiPod> = scope.map_or_else(|| Api::all(client.clone()), |n| Api::namespaced(client.clone(), n));
        let listed = pods.list(&ListParams::default().labels(BUSY_LABEL)).await.context("listing opted-in pods")?;
        for pod in listed.items.iter().filter(|p| p.malformed.is_none()) {
            let Some(mut patch) = restore_patch(pod, marks, now) else { continue };
            patch["metadata"]["uid"] = json!(pod.metadata.uid);
            let (namespace, name) = (pod.namespace(), pod.name());
            Api::<ApiPod>::namespaced(client.clone(), namespace)
                .patch(name, &params, &Patch::Merge(&patch))
                .await
                .with_context(|| format!("restoring pod {namespace}/{name}"))?;
            out.push_str(&restored(pod, verb));
        }
        let busy_pdb = |name: &str| name == BUSY_PDB_NAME;
        out.push_str(&delete_ours::<PodDisruptionBudget>(&client, scope, busy_pdb, dry_run).await?);
        // The budgets' Leases: in busyguard's namespace, those of the namespace cleaned (all
        // Leases of busyguard's, cleaning every namespace); and any an earlier build kept in the
        // workloads' own namespaces.
        let budget_lease = |name: &str| name.starts_with(LEASE_PREFIX);
        out.push_str(&delete_ours::<Lease>(&client, scope, budget_lease, dry_run).await?);
        if let Some(namespace) = scope.filter(|n| *n != BUSYGUARD_NAMESPACE) {
            let of_namespace = format!("{LEASE_PREFIX}{namespace}.");
            let of_it = |name: &str| name.starts_with(&of_namespace);
            out.push_str(&delete_ours::<Lease>(&client, Some(BUSYGUARD_NAMESPACE), of_it, dry_run).await?);
        }
    }
    if out.is_empty() {
        out.push_str("nothing of busyguard's left\n");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::keys::BUSY_SINCE;
    use crate::policy::keys::DELETION_COST;
    use crate::policy::keys::{IDLE_COST, IDLE_SAFE_TO_EVICT};

    fn record(labels: Value, annotations: Value) -> ApiPod {
        serde_json::from_value(json!({"metadata": {"name": "w", "namespace": "jobs",
            "uid": "u", "labels": labels, "annotations": annotations}, "status": {"phase": "Running"}}))
        .unwrap()
    }

    fn now() -> Timestamp {
        "2026-11-21T21:00:00Z".parse().unwrap()
    }

    #[test]
    fn a_busy_pod_gets_the_users_own_values_back_and_loses_every_mark_of_busyguards() {
        let mut pod = json!({"metadata": {
            "labels": {BUSY_LABEL: "true", "busyguard.io/protected": "true", DELETE_REQUESTED: "true"},
            "annotations": {BUSY_SINCE: "2026-11-21T20:00:00Z", DELETION_COST: "2085000000", IDLE_COST: "-5",
                "karpenter.sh/do-not-disrupt": "true",
                "cluster-autoscaler.kubernetes.io/safe-to-evict": "false", IDLE_SAFE_TO_EVICT: "true",
                DELETE_REQUESTED: r#"{"by":"alice","at":"2026-11-21T20:30:00Z"}"#, "team": "a",
                DISRUPTION_REQUESTED: r#"{"by":"drain","at":"2026-11-21T20:40:00Z"}"#, EVICTION_IN_PROGRESS: "true"}}});
        let busy = record(pod["metadata"]["labels"].clone(), pod["metadata"]["annotations"].clone());
        let patch = restore_patch(&busy, &[], now()).expect("something to restore");
        json_patch::merge(&mut pod, &patch);
        assert_eq!(
            pod,
            json!({"metadata": {"labels": {BUSY_LABEL: "true"}, "annotations": {DELETION_COST: "-5", "team": "a",
                "cluster-autoscaler.kubernetes.io/safe-to-evict": "true"}}})
        );
    }

    /// The vendor keys busyguard was serving with, given to cleanup as they were to serve.
    #[test]
    fn a_busy_pods_vendor_keys_go_back_to_its_own_values_when_cleanup_is_told_them() {
        let cast = Mark::parse(On::Annotation, "autoscaling.cast.ai/removal-disabled=true").unwrap();
        let ocean = Mark::parse(On::Label, "spotinst.io/restrict-scale-down=true").unwrap();
        let marks: &'static [Mark] = Box::leak(Box::new([cast, ocean]));
        let labels = json!({BUSY_LABEL: "true", ocean.key: "true"});
        let annotations = json!({BUSY_SINCE: "2026-11-21T20:00:00Z", cast.key: "true", cast.saved_as: "false"});
        let mut pod = json!({"metadata": {"labels": labels, "annotations": annotations}});
        let busy = record(labels, annotations);
        let patch = restore_patch(&busy, marks, now()).expect("something to restore");
        json_patch::merge(&mut pod, &patch);
        assert_eq!(
            pod,
            json!({"metadata": {"labels": {BUSY_LABEL: "true"}, "annotations": {cast.key: "false"}}}),
            "as the pod had them"
        );
        assert!(restore_patch(&busy, &[], now()).unwrap()["metadata"]["labels"].get(ocean.key).is_none(), "not told");
    }

    #[test]
    fn a_pod_busyguard_left_nothing_on_is_not_written_and_a_released_one_loses_its_marks_and_is_called_an_orphan() {
        let idle = record(json!({BUSY_LABEL: "false"}), json!({DELETION_COST: "-5", "team": "a"}));
        assert_eq!(restore_patch(&idle, &[], now()), None);
        let released = record(json!({BUSY_LABEL: "when-unready"}), json!({RELEASED_FROM: "6b8958b477"}));
        assert!(
            restored(&released, "restored").contains("released from its ReplicaSet (pod-template-hash 6b8958b477)")
        );
        assert_eq!(restored(&record(json!({BUSY_LABEL: "true"}), json!({})), "restored"), "pod jobs/w: restored\n");
        let patch = restore_patch(&released, &[], now()).expect("the release's record goes");
        assert_eq!(patch["metadata"]["annotations"][RELEASED_FROM], Value::Null);
        assert!(patch["metadata"]["annotations"].as_object().unwrap().contains_key(RELEASED_FROM));
    }
}
