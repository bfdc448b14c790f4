//! `busyguard status`: what the opted-in pods of a cluster are doing, read with the user's own
//! credentials: per workload how many are busy, idle or past their protection; which pods are
//! busy since when and until when; which deletes wait for which pod; and which nodes a drain
//! would wait on.

use std::collections::HashMap;
use std::fmt::Write;

use anyhow::Context;
use clap::Args;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use k8s_openapi::api::apps::v1::Deployment;

use super::cluster_settings::{container_settings, with_cluster_settings};
use crate::cluster::nodes::going;
use crate::cluster::view::{ApiPod, PodRecord};
use crate::cluster::{ClusterSource, client_config};
use crate::config::{HoldArgs, MaxBusyArgs, UsersCluster};
use crate::duration::whole_second;
use crate::policy::BUSYGUARD_NAMESPACE;
use crate::policy::busy::{BusyState, busy_state};
use crate::policy::hazards::{Opted, Pdb, hazards};
use crate::policy::hold::{NodeGoing, held, held_refusal};
use crate::policy::keys::BUSY_LABEL;
use crate::policy::pod::PodFacts;
use crate::policy::selector::Selector;
use crate::policy::workloads::{count, of_pod};

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub cluster: UsersCluster,
    /// To tell protected pods from lapsed ones: busyguard's own, read from its Deployment, where
    /// none is given.
    #[command(flatten)]
    pub max_busy: MaxBusyArgs,
    /// To tell the pods that take no new task: busyguard's own where none is given.
    #[command(flatten)]
    pub holds: HoldArgs,
    /// Instead: what a trial in audit mode saw, from busyguard's audit lines in this file (`-`:
    /// standard input), e.g. `kubectl logs -n busyguard deploy/busyguard --since=168h`.
    #[arg(long, value_name = "FILE")]
    pub trial: Option<std::path::PathBuf>,
}

/// One opted-in pod as listed.
pub struct Listed {
    pub namespace: String,
    pub name: String,
    pub pod: PodRecord,
    pub tolerates_every_taint: bool,
}

pub use super::cluster_settings::Settings;

/// What a user may not read (they are told, not refused), and so what `status` cannot check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unread(pub String);

/// What the report reads from the cluster.
pub struct Cluster {
    pub pods: Vec<Listed>,
    pub pdbs: Result<Vec<Pdb>, Unread>,
    /// The nodes that are going, or why they could not be read.
    pub nodes_going: Result<HashMap<String, NodeGoing>, Unread>,
}

/// Lists the opted-in pods (all namespaces, or those given) and renders the report, judged with
/// busyguard's own settings as its Deployment has them, but for those the user gave (`given`:
/// their flags).
pub async fn run(
    source: &ClusterSource,
    namespaces: &[String],
    settings: Settings,
    given: &[&str],
) -> anyhow::Result<String> {
    let config = client_config(source).await?.context(crate::cluster::NO_CLUSTER)?;
    let server = config.cluster_url.to_string();
    let client = kube::Client::try_from(config).context("building the Kubernetes client")?;
    let (settings, said) = cluster_settings(&client, settings, given).await?;
    let apis: Vec<Api<ApiPod>> = if namespaces.is_empty() {
        vec![Api::all(client.clone())]
    } else {
        namespaces.iter().map(|ns| Api::namespaced(client.clone(), ns)).collect()
    };
    let mut listed = Vec::new();
    for api in apis {
        let listed_pods = api.list(&ListParams::default().labels(BUSY_LABEL)).await;
        let pods = listed_pods.with_context(|| format!("listing opted-in pods from the API server at {server}"))?;
        for pod in pods.items.into_iter().filter(|p| p.malformed.is_none()) {
            let (namespace, name) = (pod.namespace().into(), pod.name().into());
            listed.push(Listed {
                namespace,
                name,
                pod: pod.record(&[]),
                tolerates_every_taint: pod.tolerates_every_taint,
            });
        }
    }
    // Read where there are opted-in pods; a user who may not list them is told, not refused.
    let pdbs = (pdbs(&client, &listed).await)
        .map_err(|e| Unread(format!("cannot list PodDisruptionBudgets, so cannot check them: {e}")));
    let nodes_going = (Api::<Node>::all(client.clone()).list(&ListParams::default()).await)
        .map(|nodes| {
            (nodes.items.iter()).filter_map(|node| Some((node.name_any(), going(node, settings.holds)?))).collect()
        })
        .map_err(|e| Unread(format!("cannot list nodes, so cannot tell which are going: {e}")));
    let cluster = Cluster { pods: listed, pdbs, nodes_going };
    Ok(format!("{said}\n\n{}", render(&cluster, settings, whole_second(Timestamp::now()))))
}

/// `settings` with busyguard's own where the user gave none, and a line that says whose they are.
async fn cluster_settings(
    client: &kube::Client,
    settings: Settings,
    given: &[&str],
) -> anyhow::Result<(Settings, String)> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), BUSYGUARD_NAMESPACE);
    let found = match deployments.get_opt("busyguard").await {
        Ok(Some(deployment)) => deployment.spec.template.spec.map(|s| s.containers),
        Ok(None) => return Ok((settings, "Settings: this command's (no busyguard Deployment found)".into())),
        Err(e) => return Ok((settings, format!("Settings: this command's (cannot read busyguard's Deployment: {e})"))),
    };
    let found = found.unwrap_or_default().first().map(container_settings).unwrap_or_default();
    let (settings, taken) = with_cluster_settings(settings, given, &found)?;
    let said = match taken.is_empty() {
        true => "Settings: this command's (busyguard's Deployment sets none of them otherwise)".to_string(),
        false => format!("Settings: busyguard's Deployment's, {}; this command's otherwise", taken.join(", ")),
    };
    Ok((settings, said))
}

/// The PodDisruptionBudgets of the namespaces with opted-in pods.
async fn pdbs(client: &kube::Client, pods: &[Listed]) -> Result<Vec<Pdb>, kube::Error> {
    let namespaces: std::collections::BTreeSet<&str> = pods.iter().map(|p| p.namespace.as_str()).collect();
    let mut pdbs = Vec::new();
    for namespace in namespaces {
        let api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), namespace);
        for pdb in api.list(&ListParams::default()).await?.items {
            let spec = pdb.spec.unwrap_or_default();
            pdbs.push(Pdb {
                namespace: namespace.to_string(),
                name: pdb.metadata.name.unwrap_or_default(),
                selector: spec.selector.as_ref().and_then(|s| Selector::from_label_selector(s).ok()),
                always_allow: spec.unhealthy_pod_eviction_policy.as_deref() == Some("AlwaysAllow"),
            });
        }
    }
    Ok(pdbs)
}

/// The report, as a person reads it in a terminal.
pub fn render(cluster: &Cluster, settings: Settings, now: Timestamp) -> String {
    let (pods, pdbs, max_busy) = (&cluster.pods, &cluster.pdbs, settings.max_busy);
    let mut out = String::new();
    let counted = pods
        .iter()
        .filter_map(|p| Some((p.namespace.clone(), p.pod.workload(&p.name), of_pod(&p.pod, max_busy, now)?)));
    let workloads = count(counted, usize::MAX);
    let busy: Vec<(&Listed, Option<Timestamp>, Option<Timestamp>)> = pods
        .iter()
        .filter_map(|p| match busy_state(&p.pod, max_busy, now) {
            BusyState::Busy { since, until } => Some((p, since, until)),
            _ => None,
        })
        .collect();
    let counted = |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let (opted_in, in_workloads) =
        (counted(pods.len(), "opted-in pod", "opted-in pods"), counted(workloads.len(), "workload", "workloads"));
    let _ = writeln!(out, "{opted_in} in {in_workloads}, {} busy, at {now}", busy.len());

    let _ = writeln!(out, "\n{:<48} {:>5} {:>5} {:>7} {:>16}", "WORKLOAD", "BUSY", "IDLE", "LAPSED", "DELETES WAITING");
    for ((namespace, workload), c) in &workloads {
        let name = format!("{namespace}/{workload}");
        let _ = writeln!(out, "{name:<48} {:>5} {:>5} {:>7} {:>16}", c.busy, c.idle, c.lapsed, c.delete_requested);
    }

    let _ = writeln!(out, "\nBUSY PODS");
    if busy.is_empty() {
        let _ = writeln!(out, "none");
    }
    for (listed, since, until) in &busy {
        let since = since.map_or("an unknown time".to_string(), |t| format!("{t} ({})", ago(now, t)));
        let until = until.map_or("no known end".to_string(), |t| t.to_string());
        let node = listed.pod.node.as_deref().unwrap_or("(not scheduled)");
        let _ =
            write!(out, "{}/{} on {node}: busy since {since}, protected until {until}", listed.namespace, listed.name);
        if let Some(request) = listed.pod.delete_request() {
            let _ = write!(out, "; {} asked to delete it at {}: done once it is idle", request.by, request.at);
        }
        let _ = writeln!(out);
    }

    let _ = writeln!(out, "\nNODES A DRAIN WOULD WAIT FOR (their busy pods refuse eviction)");
    let mut nodes: std::collections::BTreeMap<&str, Vec<String>> = std::collections::BTreeMap::new();
    for (listed, _, until) in &busy {
        let until = until.map_or(String::new(), |t| format!(" until {t}"));
        let node = listed.pod.node.as_deref().unwrap_or("(not scheduled)");
        nodes.entry(node).or_default().push(format!("{}/{}{until}", listed.namespace, listed.name));
    }
    if nodes.is_empty() {
        let _ = writeln!(out, "none");
    }
    for (node, pods) in nodes {
        let _ = writeln!(out, "{node}: {}", pods.join(", "));
    }

    let _ = writeln!(out, "\nPODS TAKING NO NEW TASK (their disruption is wanted: they go at their next idle moment)");
    let no_nodes = HashMap::new();
    let nodes_going = cluster.nodes_going.as_ref().unwrap_or(&no_nodes);
    let held: Vec<String> = (pods.iter())
        .filter_map(|p| {
            let node = p.pod.node.as_deref().unwrap_or_default();
            let hold = held(&p.pod, node, nodes_going.get(node).copied(), settings.holds, now)?;
            let line = held_refusal(&p.namespace, &p.name, &hold);
            // A runner's or game server's work comes from its owner, which no hold stops.
            Some(match p.pod.owners_set().is_some() || p.pod.busy_label_by_busyguard() {
                true => format!("{line} (its owner may still give it work: busyguard guards it then too)"),
                false => line,
            })
        })
        .collect();
    if held.is_empty() {
        let _ = writeln!(out, "none");
    }
    for line in held {
        let _ = writeln!(out, "{line}");
    }

    let _ = writeln!(out, "\nWARNINGS (what would defeat protection)");
    let opted: Vec<Opted<'_, PodRecord>> = pods
        .iter()
        .map(|p| Opted {
            namespace: &p.namespace,
            name: &p.name,
            workload: p.pod.workload(&p.name),
            pod: &p.pod,
            tolerates_every_taint: p.tolerates_every_taint,
        })
        .collect();
    let mut warnings = hazards(&opted, pdbs.as_deref().unwrap_or_default(), max_busy);
    warnings.extend(pdbs.as_ref().err().map(|e| e.0.clone()));
    warnings.extend(cluster.nodes_going.as_ref().err().map(|e| e.0.clone()));
    if warnings.is_empty() {
        let _ = writeln!(out, "none");
    }
    for warning in warnings {
        let _ = writeln!(out, "{warning}");
    }
    out
}

/// `2h5m`, to the minute.
fn ago(now: Timestamp, then: Timestamp) -> String {
    let minutes = (now.as_second() - then.as_second()).max(0) / 60;
    match (minutes / 60, minutes % 60) {
        (0, m) => format!("{m}m ago"),
        (h, m) => format!("{h}h{m}m ago"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::busy::MaxBusy;
    use crate::policy::hold::Holds;
    use serde_json::json;

    fn listed(name: &str, node: &str, label: &str, annotations: serde_json::Value) -> Listed {
        let pod: ApiPod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "capture", "uid": format!("uid-{name}"),
                "creationTimestamp": "2026-11-23T08:00:00Z",
                // busyguard wrote the mark, as the API server records it.
                "managedFields": [{"manager": "busyguard", "operation": "Update", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:annotations": {"f:busyguard.io/delete-requested": {}}}}}],
                "labels": {BUSY_LABEL: label, "pod-template-hash": "6b8958b477", "busyguard.io/delete-requested": "true"},
                "annotations": annotations,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "worker-6b8958b477",
                    "uid": "rs", "controller": true}]},
            "spec": {"nodeName": node},
            "status": {"phase": "Running"}}))
        .unwrap();
        Listed { namespace: "capture".into(), name: name.into(), pod: pod.record(&[]), tolerates_every_taint: false }
    }

    #[test]
    fn the_report_says_who_is_busy_since_when_what_waits_and_which_drains_would_wait() {
        let pods = [
            listed(
                "worker-a",
                "node-1",
                "true",
                json!({"busyguard.io/busy-since": "2026-11-23T09:00:00Z",
                "busyguard.io/delete-requested": r#"{"by":"alice","at":"2026-11-23T09:30:00Z"}"#}),
            ),
            listed("worker-b", "node-1", "false", json!({})),
            listed("worker-c", "node-2", "false", json!({})),
        ];
        let settings =
            Settings { max_busy: MaxBusy::new(jiff::SignedDuration::from_hours(24)), holds: Holds::default() };
        let nodes_going = Ok(HashMap::from([("node-2".to_string(), NodeGoing::Karpenter)]));
        let cluster = Cluster { pods: pods.into(), pdbs: Ok(Vec::new()), nodes_going };
        let report = render(&cluster, settings, "2026-11-23T10:05:00Z".parse().unwrap());
        assert_eq!(
            report,
            "3 opted-in pods in 1 workload, 1 busy, at 2026-11-23T10:05:00Z\n\
             \n\
             WORKLOAD                                          BUSY  IDLE  LAPSED  DELETES WAITING\n\
             capture/Deployment/worker                            1     2       0                1\n\
             \n\
             BUSY PODS\n\
             capture/worker-a on node-1: busy since 2026-11-23T09:00:00Z (1h5m ago), protected until \
             2026-11-24T09:00:00Z; alice asked to delete it at 2026-11-23T09:30:00Z: done once it is idle\n\
             \n\
             NODES A DRAIN WOULD WAIT FOR (their busy pods refuse eviction)\n\
             node-1: capture/worker-a until 2026-11-24T09:00:00Z\n\
             \n\
             PODS TAKING NO NEW TASK (their disruption is wanted: they go at their next idle moment)\n\
             pod capture/worker-a takes no new task: its delete by alice was deferred at 2026-11-23T09:30:00Z and is \
             carried out once it is idle (to call it off: kubectl label pod worker-a -n capture \
             busyguard.io/delete-requested-). Do not start the task: the pod goes at its next idle moment\n\
             pod capture/worker-c takes no new task: its node node-2 is going: Karpenter is taking it away (taint \
             karpenter.sh/disrupted). Do not start the task: the pod goes at its next idle moment\n\
             \n\
             WARNINGS (what would defeat protection)\n\
             none\n"
        );
    }

    #[test]
    fn a_runner_on_a_going_node_is_told_apart_its_owner_may_still_give_it_work() {
        let mut runner = listed("ci-runner-x", "node-2", "false", json!({}));
        let labels = [("actions.github.com/scale-set-name", "ci"), (BUSY_LABEL, "false")];
        runner.pod.labels = labels.iter().map(|(k, v)| (Box::from(*k), Box::from(*v))).collect();
        let settings =
            Settings { max_busy: MaxBusy::new(jiff::SignedDuration::from_hours(24)), holds: Holds::default() };
        let nodes_going = Ok(HashMap::from([("node-2".to_string(), NodeGoing::Karpenter)]));
        let cluster = Cluster { pods: vec![runner], pdbs: Ok(Vec::new()), nodes_going };
        let report = render(&cluster, settings, "2026-11-23T10:05:00Z".parse().unwrap());
        assert!(
            report.contains(
                "the pod goes at its next idle moment (its owner may still give it work: busyguard guards it then too)"
            ),
            "{report}"
        );
    }
}
