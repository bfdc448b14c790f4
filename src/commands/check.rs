//! `busyguard check`: waits until the API server reaches busyguard and busyguard answers as it
//! should, for install scripts and CI (as cert-manager's `cmctl check api` does). Two server-side
//! dry runs in a guarded namespace, so nothing is stored: a pod created busy must come back with
//! busyguard's annotations (the mutating webhook), and a pod created with a delete-requested mark
//! busyguard did not write must be refused (a validating webhook, failurePolicy Fail).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, PostParams};
use serde_json::json;

use super::cluster_settings::container_flag;
use crate::cluster::{ClusterSource, NO_CLUSTER, client_config, owners};
use crate::config::std_duration;
use crate::policy::BUSYGUARD_NAMESPACE;
use crate::policy::keys::{BUSY_LABEL, BUSY_SINCE, DELETE_REQUESTED, DeleteRequest};
use crate::policy::outcome::NOT_BUSYGUARDS_MARK_CAUSE;
use crate::policy::owners::OwnerRule;

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Kubeconfig to reach the cluster with; without it, `KUBECONFIG` or `~/.kube/config`.
    #[arg(long, env = "BUSYGUARD_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use, as `kubectl --context`; its current one without it.
    #[arg(long)]
    pub context: Option<String>,
    /// A namespace busyguard guards, to try the dry runs in; the context's without it, as kubectl.
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// How long to keep trying before giving up (exit 1).
    #[arg(long, default_value = "2m", value_parser = std_duration)]
    pub timeout: Duration,
}

/// Tries every `every` until both answers are right or `timeout` passes; what it saw.
pub async fn run(source: &ClusterSource, namespace: Option<&str>, timeout: Duration) -> anyhow::Result<String> {
    let config = client_config(source).await?.context(NO_CLUSTER)?;
    // As kubectl: the context's namespace, unless one is given.
    let namespace = namespace.map_or_else(|| config.default_namespace.clone(), str::to_string);
    let server = config.cluster_url.to_string();
    let client = kube::Client::try_from(config).context("building the Kubernetes client")?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let deadline = Instant::now() + timeout;
    let mut rules = None;
    loop {
        if rules.is_none() {
            rules = busy_rules(&client).await?;
        }
        let (owner_rules, warnings) = rules.clone().unwrap_or_default();
        match attempt(&pods).await.and(owners_pods_opted_in(&pods, &owner_rules).await) {
            Ok(()) => {
                let warned = warnings.iter().map(|w| format!("{w}\n"));
                return Ok(format!(
                    "busyguard answers the API server in namespace {namespace}: a pod turning busy gets its \
                     annotations, and a delete-requested mark busyguard did not write is refused\n{}",
                    warned.collect::<String>()
                ));
            }
            Err(Failure::Unreachable(why)) if Instant::now() + EVERY >= deadline => {
                anyhow::bail!("cannot reach the API server at {server} (for {timeout:?}): {why}")
            }
            Err(Failure::Busyguard(why)) if Instant::now() + EVERY >= deadline => {
                anyhow::bail!("busyguard is not answering as it should after {timeout:?}: {why}")
            }
            Err(_) => tokio::time::sleep(EVERY).await,
        }
    }
}

const EVERY: Duration = Duration::from_secs(2);

/// Why an attempt failed: the API server could not be reached (busyguard is not to blame), or it
/// answered, and busyguard's part is missing.
enum Failure {
    Unreachable(String),
    Busyguard(String),
}

async fn attempt(pods: &Api<Pod>) -> Result<(), Failure> {
    let dry_run = PostParams { dry_run: true, ..PostParams::default() };
    let busy = pod(json!({BUSY_LABEL: "true"}), json!({}));
    let created = pods.create(&dry_run, &busy).await.map_err(|e| match e {
        kube::Error::Api(status) => match refused_by(&status.message) {
            Some(who) => Failure::Busyguard(format!(
                "the dry-run create of a busy pod was refused by {who}, not busyguard: let such a pod be created \
                 in this namespace, or check another (--namespace): {}",
                status.message
            )),
            None => Failure::Busyguard(format!("a dry-run create of a busy pod failed: {status}")),
        },
        other => Failure::Unreachable(other.to_string()),
    })?;
    let annotated = created.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(BUSY_SINCE));
    if !annotated {
        return Err(Failure::Busyguard(
            "a busy pod came back without busyguard's annotations: the API server does not call its mutating \
             webhook (not registered, or the namespace is not guarded: labelled busyguard.io/enabled=false, or \
             not labelled busyguard.io/enabled=true where busyguard is installed opted in)"
                .into(),
        ));
    }
    let request = DeleteRequest::new("busyguard check", Timestamp::now());
    let forged =
        pod(json!({BUSY_LABEL: "false", DELETE_REQUESTED: "true"}), json!({DELETE_REQUESTED: request.to_annotation()}));
    match pods.create(&dry_run, &forged).await {
        Err(kube::Error::Api(status))
            if status
                .details
                .as_ref()
                .is_some_and(|d| d.causes.iter().any(|c| c.reason == NOT_BUSYGUARDS_MARK_CAUSE)) =>
        {
            Ok(())
        }
        Err(e) => {
            Err(Failure::Busyguard(format!("a forged delete-requested mark was refused, but not by busyguard: {e}")))
        }
        Ok(_) => Err(Failure::Busyguard(
            "a forged delete-requested mark was let through: the API server does not call busyguard's pod-marks \
             webhook"
                .into(),
        )),
    }
}

/// What busyguard's Deployment says of its busy rules (`--busy-when-owner`, as arguments or in
/// `BUSYGUARD_BUSY_WHEN_OWNER`): an error for a rule that does not compile (busyguard would not
/// start), a warning for a kind the API server does not serve (busyguard serves without
/// following it). Nothing to check when busyguard is not installed under its own name and
/// namespace, or the user may not read it; `None` while the API server cannot be reached (the
/// probe says so).
pub async fn owner_rule_warnings(client: &kube::Client) -> anyhow::Result<Option<Vec<String>>> {
    Ok(busy_rules(client).await?.map(|(_, warnings)| warnings))
}

/// busyguard's busy rules as its Deployment gives them, and what to warn of (see
/// [`owner_rule_warnings`]).
async fn busy_rules(client: &kube::Client) -> anyhow::Result<Option<(Vec<OwnerRule>, Vec<String>)>> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), BUSYGUARD_NAMESPACE);
    let deployment = match deployments.get_opt("busyguard").await {
        Ok(Some(deployment)) => deployment,
        Ok(None) => return Ok(Some(Default::default())),
        Err(kube::Error::Api(status)) if status.code == 403 => return Ok(Some(Default::default())),
        Err(kube::Error::Api(status)) => anyhow::bail!("cannot read busyguard's Deployment: {status}"),
        Err(_) => return Ok(None),
    };
    let containers = deployment.spec.template.spec.map(|s| s.containers).unwrap_or_default();
    let holds_kueue = containers.iter().any(holds_kueue_preemption);
    let mut values = Vec::new();
    for container in containers {
        let args = container.args.unwrap_or_default();
        values.extend(args.iter().enumerate().filter_map(|(i, arg)| match arg.strip_prefix("--busy-when-owner") {
            Some(value) if value.starts_with('=') => Some(value[1..].to_string()),
            Some("") => args.get(i + 1).cloned(),
            _ => None,
        }));
        let from_env = container.env.into_iter().flatten().filter(|e| e.name == "BUSYGUARD_BUSY_WHEN_OWNER");
        values.extend(from_env.flat_map(|e| {
            let lines = e.value.unwrap_or_default();
            lines.lines().filter(|l| !l.trim().is_empty()).map(str::to_string).collect::<Vec<_>>()
        }));
    }
    let rules: Vec<OwnerRule> = values
        .into_iter()
        .map(|value| value.parse())
        .collect::<Result<_, _>>()
        .map_err(|why| anyhow::anyhow!("busyguard cannot start with its busy rules: --busy-when-owner {why}"))?;
    if let Some(twice) = crate::policy::owners::same_kind_twice(&rules) {
        anyhow::bail!("busyguard cannot start with its busy rules: {twice}");
    }
    let mut warnings = Vec::new();
    for rule in &rules {
        match owners::resolve(client, rule).await {
            Err(why) => warnings.push(format!(
                "warning: {why:#}: busyguard serves without following it, and its owners' pods are not guarded \
                 until it is served"
            )),
            Ok(resource) => {
                for field in pruned_by_the_schema(client, rule, &resource.plural).await {
                    warnings.push(format!(
                        "warning: --busy-when-owner {}: the rule reads {field}, which the API server's schema of {} \
                         {} does not keep (it prunes it): that part of the rule never holds on this release",
                        rule.kind_path(),
                        rule.kind,
                        rule.version()
                    ));
                }
            }
        }
    }
    if holds_kueue {
        warnings.extend(kueue_hold_warning(client).await);
    }
    Ok(Some((rules, warnings)))
}

/// Whether busyguard's container runs with `--hold-kueue-preemption` on (flag or variable).
fn holds_kueue_preemption(container: &k8s_openapi::api::core::v1::Container) -> bool {
    let value = container_flag(container, "--hold-kueue-preemption", "BUSYGUARD_HOLD_KUEUE_PREEMPTION");
    value.as_deref() == Some("true")
}

/// What keeps `--hold-kueue-preemption` from holding anything, as far as the user may tell:
/// Kueue's Workloads not served, or busyguard's service account not allowed to watch them (a
/// SubjectAccessReview; not asked where the user may not ask it).
async fn kueue_hold_warning(client: &kube::Client) -> Option<String> {
    use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
    let off = "Kueue's preemptions are not held, everything else is served";
    match kube::discovery::group(client, "kueue.x-k8s.io").await {
        Ok(group) if group.recommended_kind("Workload").is_some() => {}
        Ok(_) | Err(kube::Error::Discovery(_)) => {
            return Some(format!(
                "warning: --hold-kueue-preemption: the API server does not serve Kueue's Workloads (Kueue not \
                 installed?): {off}"
            ));
        }
        Err(_) => return None,
    }
    let account = crate::policy::namespaces::busyguards_user();
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(account.clone()),
            resource_attributes: Some(ResourceAttributes {
                group: Some("kueue.x-k8s.io".into()),
                resource: Some("workloads".into()),
                verb: Some("watch".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    let allowed = reviews.create(&Default::default(), &review).await.ok()?.status.is_some_and(|s| s.allowed);
    (!allowed).then(|| {
        format!(
            "warning: --hold-kueue-preemption: {account} may not watch Kueue's Workloads (grant get, list, watch on \
             workloads.kueue.x-k8s.io; the chart's kueue.enabled does): {off}"
        )
    })
}

/// The fields the rule reads that its kind's CustomResourceDefinition (if it is one the user may
/// read) prunes at the rule's version; none when that cannot be told.
async fn pruned_by_the_schema(client: &kube::Client, rule: &OwnerRule, plural: &str) -> Vec<String> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let Ok(Some(crd)) = crds.get_opt(&format!("{plural}.{}", rule.group())).await else { return Vec::new() };
    let version = crd.spec.versions.into_iter().find(|v| v.name == rule.version());
    let Some(schema) = version.and_then(|v| v.schema).and_then(|s| s.open_api_v3_schema) else { return Vec::new() };
    let Ok(schema) = serde_json::to_value(schema) else { return Vec::new() };
    crate::policy::owners::pruned_fields(&rule.expression, &schema)
}

/// The label each component's webhook (manifests/actions-runner-controller, manifests/agones,
/// manifests/agent-sandbox) selects its owner kind's pods by, with a value.
pub const OPT_IN_LABELS: [(&str, &str, &str, &str); 3] = [
    ("actions.github.com", "EphemeralRunner", "actions-ephemeral-runner", "True"),
    ("agones.dev", "GameServer", "agones.dev/gameserver", "busyguard-check"),
    ("agents.x-k8s.io", "Sandbox", "agents.x-k8s.io/sandbox-name-hash", "busyguard-check"),
];

/// For each busy rule of a component's kind, a dry-run create of a pod that kind owns comes back
/// opted in (`busyguard.io/busy: "false"`): the component's webhook is registered and called.
async fn owners_pods_opted_in(pods: &Api<Pod>, rules: &[OwnerRule]) -> Result<(), Failure> {
    let dry_run = PostParams { dry_run: true, ..PostParams::default() };
    for rule in rules {
        let labelled = OPT_IN_LABELS
            .iter()
            .find(|(group, kind, ..)| rule.via.is_none() && *group == rule.group() && *kind == rule.kind);
        let Some((_, _, label, value)) = labelled else { continue };
        let mut owned = pod(json!({*label: value}), json!({}));
        owned.metadata.owner_references = Some(vec![OwnerReference {
            api_version: rule.api_version.clone(),
            kind: rule.kind.clone(),
            name: "busyguard-check".into(),
            uid: "busyguard-check".into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        let created = pods.create(&dry_run, &owned).await.map_err(|e| match e {
            kube::Error::Api(status) => {
                Failure::Busyguard(format!("a dry-run create of a {}'s pod failed: {status}", rule.kind))
            }
            other => Failure::Unreachable(other.to_string()),
        })?;
        if created.metadata.labels.as_ref().and_then(|l| l.get(BUSY_LABEL)).map(String::as_str) != Some("false") {
            return Err(Failure::Busyguard(format!(
                "a pod owned by a {} came back not opted in: the API server does not call the component's webhook \
                 (not registered, no caBundle, or the namespace is not guarded)",
                rule.kind
            )));
        }
    }
    Ok(())
}

/// Who other than busyguard refused a pod's create, by the API server's message: another
/// admission webhook, a ValidatingAdmissionPolicy, PodSecurity, a ResourceQuota or LimitRange.
fn refused_by(message: &str) -> Option<String> {
    // The name the API server quotes after `opening`, up to the quote `closing`.
    let named = |opening: &str, closing: char| {
        let rest = &message[message.find(opening)? + opening.len()..];
        Some(rest.split(closing).next()?.to_string())
    };
    if let Some(webhook) = named("admission webhook \"", '"') {
        return (!webhook.ends_with(".busyguard.io")).then(|| format!("the admission webhook {webhook}"));
    }
    if let Some(policy) = named("ValidatingAdmissionPolicy '", '\'') {
        return Some(format!("the ValidatingAdmissionPolicy {policy}"));
    }
    let known = [
        ("violates PodSecurity", "PodSecurity admission (the namespace's pod-security.kubernetes.io/enforce level)"),
        ("exceeded quota", "a ResourceQuota"),
        ("status unknown for quota", "a ResourceQuota"),
        ("must specify", "a ResourceQuota (it asks for requests or limits)"),
        ("LimitRange", "a LimitRange"),
    ];
    known.iter().find(|(text, _)| message.contains(text)).map(|(_, who)| (*who).to_string())
}

/// The probe: nothing is stored (dry runs), but it passes what a namespace may ask of a pod:
/// PodSecurity `restricted`, a quota that wants requests and limits, a pinned image.
fn pod(labels: serde_json::Value, annotations: serde_json::Value) -> Pod {
    let resources = json!({"cpu": "10m", "memory": "16Mi"});
    serde_json::from_value(json!({
        "metadata": {"generateName": "busyguard-check-", "labels": labels, "annotations": annotations},
        "spec": {
            "automountServiceAccountToken": false,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "check",
                "image": "registry.k8s.io/pause:3.9",
                "resources": {"requests": resources, "limits": resources},
                "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                    "capabilities": {"drop": ["ALL"]}}
            }]
        }
    }))
    .expect("a pod")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_who_refused_when_it_is_not_busyguard() {
        let cases = [
            (
                r#"admission webhook "validate.kyverno.svc-fail" denied the request: image must be signed"#,
                Some("the admission webhook validate.kyverno.svc-fail"),
            ),
            (
                r#"pods "busyguard-check-x" is forbidden: ValidatingAdmissionPolicy 'no-pause' with binding 'b' denied request: nope"#,
                Some("the ValidatingAdmissionPolicy no-pause"),
            ),
            (
                r#"pods "busyguard-check-x" is forbidden: violates PodSecurity "restricted:latest": runAsNonRoot != true"#,
                Some("PodSecurity admission (the namespace's pod-security.kubernetes.io/enforce level)"),
            ),
            (
                r#"pods "busyguard-check-x" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=10, limited: pods=10"#,
                Some("a ResourceQuota"),
            ),
            (r#"admission webhook "pods.busyguard.io" denied the request: x"#, None),
            ("Internal error occurred: something", None),
        ];
        for (message, who) in cases {
            assert_eq!(refused_by(message).as_deref(), who, "{message}");
        }
    }
}
