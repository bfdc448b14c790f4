//! The install: `manifests/` rendered offline by `kubectl kustomize`, its two certificate
//! overlays, the make targets that feed them (`cluster-certs`, `dev-register`), and `make e2e-cluster`
//! without a cluster. The API server cannot check these objects here, so the tests check what
//! it and the controllers would act on.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use base64::Engine;
use serde_json::{Value, json};

use busyguard::cli::{Cli, Command as BusyguardCommand};
use busyguard::policy::registrations;
use busyguard::policy::selector::Selector;
use busyguard::policy::{Enrolment, NEVER_GUARDED_NAMESPACES, POD_GC_USER};
use clap::Parser;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

mod certs;
mod chart;
mod conditions;
#[path = "../common/kustomize.rs"]
mod kustomize;
mod overlays;
mod targets;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const BUSYGUARD: &str = env!("CARGO_BIN_EXE_busyguard");

fn run(command: &mut Command) -> Output {
    let output = command.output().unwrap_or_else(|e| panic!("{command:?}: {e} (kubectl and make are needed)"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// `kubectl kustomize DIR`, offline, as objects.
fn render(dir: &Path) -> Vec<Value> {
    kustomize::kustomize(dir).unwrap()
}

/// The quoted strings of a CEL expression, in order.
fn quoted(expression: &str) -> Vec<String> {
    expression.split('\'').skip(1).step_by(2).map(String::from).collect()
}

fn manifests(dir: &str) -> PathBuf {
    Path::new(ROOT).join("manifests").join(dir)
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the rendered manifests"))
}

fn selector(value: &Value) -> Selector {
    let selector: LabelSelector = serde_json::from_value(value.clone()).unwrap();
    Selector::from_label_selector(&selector).unwrap()
}

fn selects(selector: &Selector, labels: &Value) -> bool {
    selector.matches(|key| labels.get(key).and_then(Value::as_str))
}

fn webhooks(objects: &[Value]) -> Vec<&Value> {
    let configurations = ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"];
    let configurations = configurations.map(|kind| find(objects, kind, "busyguard"));
    configurations.iter().flat_map(|c| c["webhooks"].as_array().unwrap()).collect()
}

fn webhook<'a>(objects: &'a [Value], name: &str) -> &'a Value {
    webhooks(objects).into_iter().find(|w| w["name"] == name).unwrap()
}

fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn without_whitespace(value: &Value) -> String {
    value.as_str().unwrap().split_whitespace().collect()
}

#[test]
fn the_base_renders_offline_with_everything_an_install_needs_but_the_certificate() {
    let objects = render(&manifests(""));
    let mut kinds: Vec<&str> = objects.iter().map(|o| o["kind"].as_str().unwrap()).collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "Deployment",
            "MutatingWebhookConfiguration",
            "Namespace",
            "PodDisruptionBudget",
            "ResourceQuota",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicyBinding",
            "ValidatingWebhookConfiguration"
        ]
    );
    assert_eq!(objects, render(&manifests("base")), "manifests/ is the base");
}

#[test]
fn every_webhook_is_v1_dry_run_safe_equivalent_quick_and_calls_the_service() {
    let objects = render(&manifests(""));
    let service = find(&objects, "Service", "busyguard");
    let all = webhooks(&objects);
    assert_eq!(all.len(), 15);
    for webhook in all {
        let name = &webhook["name"];
        assert_eq!(webhook["admissionReviewVersions"], json!(["v1"]), "{name}");
        assert!(["NoneOnDryRun", "None"].contains(&webhook["sideEffects"].as_str().unwrap()), "{name}");
        assert_eq!(webhook["matchPolicy"], "Equivalent", "{name}");
        let timeout = webhook["timeoutSeconds"].as_u64().unwrap();
        assert!((1..=5).contains(&timeout), "{name}: timeoutSeconds {timeout}");
        let target = &webhook["clientConfig"]["service"];
        assert_eq!(target["name"], service["metadata"]["name"], "{name}");
        assert_eq!(target["namespace"], service["metadata"]["namespace"], "{name}");
        assert_eq!(target["port"], service["spec"]["ports"][0]["port"], "{name}");
        assert!(webhook["clientConfig"].get("url").is_none(), "{name}");
    }
}

/// Every webhook that selects namespaces selects them as `selectors` builds it for `enrolment`
/// (the run-to-completion ones among the namespaces that say so, `idle-pod-flags` among those
/// whose workers may patch pods); how many do.
fn namespace_selectors_as_built(objects: &[Value], enrolment: Enrolment) -> usize {
    let selecting = webhooks(objects).into_iter().filter(|w| w.get("namespaceSelector").is_some());
    let mut count = 0;
    for webhook in selecting {
        let name = webhook["name"].as_str().unwrap();
        let built = if name.starts_with("run-to-completion-") {
            registrations::run_to_completion_namespaces(enrolment)
        } else {
            registrations::guarded_namespaces(name == "idle-pod-flags.busyguard.io", enrolment)
        };
        assert_eq!(webhook["namespaceSelector"], built, "{name}");
        count += 1;
    }
    count
}

#[test]
fn webhooks_never_see_kube_system_nor_busyguards_namespace_and_a_namespace_can_opt_out() {
    let objects = render(&manifests(""));
    assert_eq!(namespace_selectors_as_built(&objects, Enrolment::OptOut), 13, "every webhook but node-deletes");
    let own = find(&objects, "Namespace", "busyguard");
    let mut own_labels = own["metadata"]["labels"].clone();
    own_labels["kubernetes.io/metadata.name"] = json!("busyguard"); // set by the API server
    // Nodes have no namespace: a namespaceSelector would have no effect on their webhook.
    let namespaced = webhooks(&objects).into_iter().filter(|w| w["rules"][0]["scope"] != "Cluster");
    for webhook in namespaced {
        let namespaces = selector(&webhook["namespaceSelector"]);
        let name = &webhook["name"];
        // Run-to-completion pods only where the namespace says so.
        if name.as_str().is_some_and(|n| n.starts_with("run-to-completion-")) {
            let said = json!({"kubernetes.io/metadata.name": "batch", "busyguard.io/run-to-completion": "true"});
            assert!(selects(&namespaces, &said), "{name}");
            assert!(!selects(&namespaces, &json!({"kubernetes.io/metadata.name": "batch"})), "{name}");
            continue;
        }
        // The own-flag rule for idle pods: everywhere but where no worker may patch pods.
        let own_flags = *name == "idle-pod-flags.busyguard.io";
        let plain = json!({"kubernetes.io/metadata.name": "workers"});
        assert!(selects(&namespaces, &plain), "{name}: a namespace with no busyguard label");
        let no_pod_writes = json!({"kubernetes.io/metadata.name": "workers", "busyguard.io/own-flags": "false"});
        assert_eq!(selects(&namespaces, &no_pod_writes), !own_flags, "{name}");
        assert!(!selects(&namespaces, &json!({"kubernetes.io/metadata.name": "kube-system"})), "{name}");
        assert!(!selects(&namespaces, &own_labels), "{name}");
        let mut own_unlabelled = own_labels.clone();
        own_unlabelled.as_object_mut().unwrap().remove("busyguard.io/enabled");
        assert!(!selects(&namespaces, &own_unlabelled), "{name}: by name too");
        let opted_out = json!({"kubernetes.io/metadata.name": "batch", "busyguard.io/enabled": "false"});
        assert!(!selects(&namespaces, &opted_out), "{name}");
    }
}

#[test]
fn each_path_is_registered_with_its_operations_selector_and_failure_policy() {
    let objects = render(&manifests(""));
    let rule = |webhook: &Value| {
        let rules = webhook["rules"].as_array().unwrap();
        assert_eq!(rules.len(), 1);
        (rules[0]["apiGroups"].clone(), rules[0]["operations"].clone(), rules[0]["resources"].clone())
    };
    let opted_in = json!({"busyguard.io/busy": "false"});
    let not_opted_in = json!({"app": "web"});

    let pods = webhook(&objects, "pods.busyguard.io");
    assert_eq!(find(&objects, "MutatingWebhookConfiguration", "busyguard")["webhooks"][0], *pods);
    assert_eq!(rule(pods), (json!([""]), json!(["CREATE", "UPDATE"]), json!(["pods", "pods/resize"])));
    assert_eq!(
        (&pods["failurePolicy"], &pods["clientConfig"]["service"]["path"]),
        (&json!("Ignore"), &json!("/mutate"))
    );
    // Pods are picked by label before any condition: idle ones are not even matched.
    assert_eq!(pods["objectSelector"], registrations::not_idle());
    let objects_of = selector(&pods["objectSelector"]);
    let busy = json!({"busyguard.io/busy": "true"});
    assert!(selects(&objects_of, &busy) && !selects(&objects_of, &opted_in) && !selects(&objects_of, &not_opted_in));

    // Pods of run-to-completion owners, made busy at their creation, picked by labels alone.
    for (name, owner_label) in registrations::RUN_TO_COMPLETION {
        let hook = webhook(&objects, name);
        assert_eq!(rule(hook), (json!([""]), json!(["CREATE"]), json!(["pods"])), "{name}");
        assert_eq!(hook["objectSelector"], registrations::run_to_completion(owner_label), "{name}");
        assert!(hook.get("matchConditions").is_none(), "{name}: no condition to evaluate");
        assert_eq!(
            (&hook["failurePolicy"], &hook["clientConfig"]["service"]["path"]),
            (&json!("Ignore"), &json!("/mutate"))
        );
        let selected = selector(&hook["objectSelector"]);
        assert!(selects(&selected, &json!({owner_label: "import"})), "{name}");
        assert!(
            !selects(&selected, &json!({owner_label: "import", "busyguard.io/busy": "false"})),
            "its own opt-in wins"
        );
    }

    let deletes = webhook(&objects, "pod-deletes.busyguard.io");
    assert_eq!(rule(deletes), (json!([""]), json!(["DELETE"]), json!(["pods"])));
    assert_eq!(deletes["failurePolicy"], "Fail");
    assert_eq!(deletes["objectSelector"], registrations::not_idle());
    // While busyguard is down, recovery goes on: the scheduler preempts (Ignore), and the
    // kubelet's final delete of a terminating pod is never sent.
    let preemptions = webhook(&objects, "pod-preemptions.busyguard.io");
    assert_eq!(rule(preemptions), rule(deletes));
    assert_eq!(preemptions["failurePolicy"], "Ignore");
    assert_eq!(preemptions["objectSelector"], registrations::not_idle());
    // Their twins for the other pods under a workload budget: the same but for the selector and
    // the last condition, and failing open, so that while busyguard is down they go unbudgeted.
    for (twin, of) in [("budget-deletes.busyguard.io", deletes), ("budget-preemptions.busyguard.io", preemptions)] {
        let mut twin = webhook(&objects, twin).clone();
        assert_eq!(twin["objectSelector"], registrations::under_a_budget());
        assert_eq!(twin["failurePolicy"], "Ignore", "{}", twin["name"]);
        let last = twin["matchConditions"].as_array_mut().unwrap().last_mut().unwrap();
        assert_eq!(last["expression"], registrations::pod_delete_counted_by_a_budget());
        last["expression"] = json!(registrations::pod_delete_may_be_refused());
        last["name"] = json!("may-be-refused");
        for key in ["objectSelector", "name", "failurePolicy"] {
            twin[key] = of[key].clone();
        }
        assert_eq!(twin, *of);
    }
    // Nor, while busyguard is down, the requesters it always lets through, nor deletes it would
    // allow unchanged: each condition is src/policy/registrations.rs's to the letter (conditions.rs).
    let granted_by_default = Cli::parse_from(["busyguard", "serve"]);
    let BusyguardCommand::Serve(serve) = granted_by_default.command else { unreachable!() };
    assert!(serve.into_config().policy.exemptions.users.contains(&POD_GC_USER.to_string()));

    let evictions = webhook(&objects, "pod-evictions.busyguard.io");
    assert_eq!(rule(evictions), (json!([""]), json!(["CREATE"]), json!(["pods/eviction"])));
    assert!(evictions.get("objectSelector").is_none(), "the Eviction carries no pod labels");
    assert_eq!(evictions["failurePolicy"], "Ignore");

    let scale_downs = webhook(&objects, "scale-downs.busyguard.io");
    let resources = json!(["deployments", "replicasets", "deployments/scale", "replicasets/scale"]);
    assert_eq!(rule(scale_downs), (json!(["apps"]), json!(["UPDATE"]), resources));
    assert!(scale_downs.get("objectSelector").is_none());
    assert_eq!(scale_downs["failurePolicy"], "Ignore");
    let flags = webhook(&objects, "pod-flags.busyguard.io");
    // Writes through pods/status too: no mutating webhook sees them, so busyguard's keys are held
    // there by refusal.
    assert_eq!(rule(flags), (json!([""]), json!(["UPDATE"]), json!(["pods", "pods/status"])));
    assert_eq!(flags["objectSelector"], registrations::not_idle(), "flips, and busy pods");
    let idle_flags = webhook(&objects, "idle-pod-flags.busyguard.io");
    assert_eq!(idle_flags["objectSelector"], registrations::idle());
    assert_eq!(
        rule(idle_flags),
        (json!([""]), json!(["UPDATE"]), json!(["pods"])),
        "idle pods' status is the kubelet's"
    );
    let mut same_rule = idle_flags.clone();
    let kept = same_rule["matchConditions"].as_array_mut().unwrap().pop().unwrap();
    assert_eq!(kept["expression"], registrations::not_for_pod_flags(), "flips are pod-flags' alone");
    for key in ["matchConditions", "failurePolicy", "clientConfig", "sideEffects", "timeoutSeconds"] {
        assert_eq!(same_rule[key], flags[key], "{key}");
    }
    assert_eq!(flags["sideEffects"], "None", "it only answers");
    let marks = webhook(&objects, "pod-marks.busyguard.io");
    assert_eq!(rule(marks), (json!([""]), json!(["CREATE", "UPDATE"]), json!(["pods", "pods/status"])));
    assert_eq!(marks["objectSelector"], registrations::marked());
    assert_eq!(marks["failurePolicy"], "Fail", "no mark written while busyguard cannot judge it");
    let nodes = webhook(&objects, "node-deletes.busyguard.io");
    assert_eq!(rule(nodes), (json!([""]), json!(["DELETE"]), json!(["nodes"])));
    assert_eq!(nodes["rules"][0]["scope"], "Cluster");
    assert_eq!(nodes["failurePolicy"], "Ignore", "an outage must not stop node lifecycle");
    let claims = webhook(&objects, "node-claim-deletes.busyguard.io");
    assert_eq!(rule(claims), (json!(["karpenter.sh"]), json!(["DELETE"]), json!(["nodeclaims"])));
    assert_eq!(claims["rules"][0]["scope"], "Cluster");
    assert_eq!(claims["failurePolicy"], "Ignore", "an outage must not stop Karpenter");
    for webhook in webhooks(&objects).into_iter().filter(|w| w.get("namespaceSelector").is_some()) {
        let values = &webhook["namespaceSelector"]["matchExpressions"][0]["values"];
        assert_eq!(
            *values,
            json!(NEVER_GUARDED_NAMESPACES),
            "{}: the namespaces busyguard leaves alone",
            webhook["name"]
        );
    }
    for validating in [deletes, preemptions, flags, marks, evictions, scale_downs, nodes] {
        assert_eq!(validating["clientConfig"]["service"]["path"], "/validate");
    }
}

#[test]
fn the_deployment_runs_two_spread_non_root_replicas_that_finish_admissions_before_stopping() {
    let objects = render(&manifests(""));
    let deployment = find(&objects, "Deployment", "busyguard");
    let spec = &deployment["spec"];
    let pod = &spec["template"]["spec"];
    let labels = &spec["template"]["metadata"]["labels"];
    assert_eq!(spec["replicas"], 2);
    assert!(selects(&selector(&spec["selector"]), labels));
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    let quota = &find(&objects, "ResourceQuota", "busyguard-critical-pods")["spec"];
    assert_eq!(quota["scopeSelector"]["matchExpressions"][0]["values"], json!([pod["priorityClassName"]]));
    let quota_pods: u64 = quota["hard"]["pods"].as_str().unwrap().parse().unwrap();
    assert!(quota_pods > spec["replicas"].as_u64().unwrap() + 1, "room for a rollout's surge");
    assert_eq!(pod["serviceAccountName"], find(&objects, "ServiceAccount", "busyguard")["metadata"]["name"]);

    // One replica per node (required), across zones where it can be.
    let spread = pod["topologySpreadConstraints"].as_array().unwrap();
    let by =
        |key: &str| spread.iter().find(|c| c["topologyKey"] == key).unwrap_or_else(|| panic!("no spread by {key}"));
    assert_eq!(by("kubernetes.io/hostname")["whenUnsatisfiable"], "DoNotSchedule");
    assert_eq!(by("topology.kubernetes.io/zone")["whenUnsatisfiable"], "ScheduleAnyway");
    for constraint in spread {
        assert_eq!(constraint["maxSkew"], 1);
        assert_eq!(constraint["nodeTaintsPolicy"], "Honor", "nodes it cannot run on do not count");
        assert_eq!(constraint["matchLabelKeys"], json!(["pod-template-hash"]), "a rollout's replicas spread too");
        assert!(selects(&selector(&constraint["labelSelector"]), labels));
    }
    let budget = find(&objects, "PodDisruptionBudget", "busyguard");
    assert!(selects(&selector(&budget["spec"]["selector"]), labels));
    assert_eq!(budget["spec"]["minAvailable"], 1, "one replica at a time may go");
    let service = find(&objects, "Service", "busyguard");
    let service_selects = service["spec"]["selector"].as_object().unwrap();
    assert!(service_selects.iter().all(|(k, v)| labels[k] == *v));

    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let container = &containers[0];
    let port = |name: &str| {
        let ports = container["ports"].as_array().unwrap();
        ports.iter().find(|p| p["name"] == name).unwrap()["containerPort"].as_u64().unwrap()
    };
    assert_eq!(port("https"), 8443, "the default --listen");
    assert_eq!(port("admin"), 8080, "the default --admin-listen");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "https");
    assert_eq!(container["readinessProbe"]["httpGet"], json!({"path": "/readyz", "port": "admin"}));
    assert_eq!(container["livenessProbe"]["httpGet"], json!({"path": "/healthz", "port": "admin"}));

    let pre_stop = &container["lifecycle"]["preStop"]["exec"]["command"];
    assert_eq!(pre_stop[0], "/busyguard", "the image's binary (no shell there)");
    let pre_stop: Vec<&str> = pre_stop.as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    let Ok(Cli { command: BusyguardCommand::Sleep(pause), .. }) = Cli::try_parse_from(&pre_stop) else {
        panic!("preStop {pre_stop:?} is not `busyguard sleep DURATION`");
    };
    let env = |name: &str| {
        let env = container["env"].as_array().unwrap();
        env.iter().find(|e| e["name"] == name).map(|e| e["value"].as_str().unwrap().to_string())
    };
    let seconds = |text: &str| text.trim_end_matches('s').parse::<u64>().unwrap();
    let drain = seconds(&env("BUSYGUARD_SHUTDOWN_TIMEOUT").unwrap());
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert!(pause.duration.as_secs() + drain < grace, "preStop {pre_stop:?} and the drain fit in {grace}s");

    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_ne!(pod["securityContext"]["runAsUser"], 0);
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
    let resources = &container["resources"];
    assert!(resources["requests"]["cpu"].is_string() && resources["requests"]["memory"].is_string());
    assert!(resources["limits"].get("cpu").is_none(), "no CPU limit");

    let mount = &container["volumeMounts"][0];
    let volume = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == mount["name"]).unwrap();
    assert_eq!(volume["secret"]["secretName"], "busyguard-tls");
    let mounted = mount["mountPath"].as_str().unwrap();
    assert_eq!(env("BUSYGUARD_TLS_CERT").unwrap(), format!("{mounted}/tls.crt"));
    assert_eq!(env("BUSYGUARD_TLS_KEY").unwrap(), format!("{mounted}/tls.key"));
}

/// A copy of `manifests/` whose self-managed overlay has had `make cluster-certs`.
fn self_managed_copy() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    run(Command::new("cp").args(["-r", &format!("{ROOT}/manifests")]).arg(dir.path()));
    let certs = dir.path().join("manifests/self-managed/certs");
    std::fs::remove_dir_all(&certs).ok();
    make(&["cluster-certs"], &[("CLUSTER_CERTS", &certs)]);
    (dir, certs)
}

fn make(targets: &[&str], variables: &[(&str, &Path)]) -> Output {
    let mut command = Command::new("make");
    command.args(["-s", "-C", ROOT]).args(targets).arg(format!("BUSYGUARD={BUSYGUARD}"));
    command.args(variables.iter().map(|(name, value)| format!("{name}={}", value.display())));
    run(&mut command)
}

/// A kubectl that records its arguments and the files it is given instead of calling a cluster.
fn fake_kubectl(dir: &Path) -> PathBuf {
    let path = dir.join("kubectl");
    let script = format!("#!/bin/sh\necho \"$@\" >> {log}\n", log = dir.join("kubectl.log").display());
    std::fs::write(&path, script).unwrap();
    run(Command::new("chmod").arg("+x").arg(&path));
    path
}
