//! The install: `manifests/` rendered offline by `kubectl kustomize`, its two certificate
//! overlays, the make targets that feed them (`cluster-certs`, `dev-register`), and `make e2e-cluster`
//! without a cluster. The API server cannot check these objects here, so the tests check what
//! it and the controllers would act on.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use base64::Engine;
use serde_json::{Value, json};

use busyguard::cli::{Cli, Command as BusyguardCommand};
use busyguard::policy::selector::Selector;
use busyguard::policy::selectors;
use busyguard::policy::{Enrolment, NEVER_GUARDED_NAMESPACES, POD_GC_USER};
use clap::Parser;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

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
    let output = run(Command::new("kubectl").arg("kustomize").arg(dir));
    serde_saphyr::from_multiple(&String::from_utf8(output.stdout).unwrap()).unwrap()
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
    assert_eq!(all.len(), 14);
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
            selectors::run_to_completion_namespaces(enrolment)
        } else {
            selectors::guarded_namespaces(name == "idle-pod-flags.busyguard.io", enrolment)
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
    assert_eq!(pods["objectSelector"], selectors::not_idle());
    let objects_of = selector(&pods["objectSelector"]);
    let busy = json!({"busyguard.io/busy": "true"});
    assert!(selects(&objects_of, &busy) && !selects(&objects_of, &opted_in) && !selects(&objects_of, &not_opted_in));

    // Pods of run-to-completion owners, made busy at their creation, picked by labels alone.
    for (name, owner_label) in selectors::RUN_TO_COMPLETION {
        let hook = webhook(&objects, name);
        assert_eq!(rule(hook), (json!([""]), json!(["CREATE"]), json!(["pods"])), "{name}");
        assert_eq!(hook["objectSelector"], selectors::run_to_completion(owner_label), "{name}");
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
    assert_eq!(deletes["objectSelector"], selectors::not_idle());
    // While busyguard is down, recovery goes on: the scheduler preempts (Ignore), and the
    // kubelet's final delete of a terminating pod is never sent.
    let preemptions = webhook(&objects, "pod-preemptions.busyguard.io");
    assert_eq!(rule(preemptions), rule(deletes));
    assert_eq!(preemptions["failurePolicy"], "Ignore");
    assert_eq!(preemptions["objectSelector"], selectors::not_idle());
    // Their twins for the other pods under a workload budget: the same but for the selector and
    // the last condition, and failing open, so that while busyguard is down they go unbudgeted.
    for (twin, of) in [("budget-deletes.busyguard.io", deletes), ("budget-preemptions.busyguard.io", preemptions)] {
        let mut twin = webhook(&objects, twin).clone();
        assert_eq!(twin["objectSelector"], selectors::under_a_budget());
        assert_eq!(twin["failurePolicy"], "Ignore", "{}", twin["name"]);
        let last = twin["matchConditions"].as_array_mut().unwrap().last_mut().unwrap();
        assert_eq!(last["expression"], selectors::pod_delete_counted_by_a_budget());
        last["expression"] = json!(selectors::pod_delete_may_be_refused());
        last["name"] = json!("may-be-refused");
        for key in ["objectSelector", "name", "failurePolicy"] {
            twin[key] = of[key].clone();
        }
        assert_eq!(twin, *of);
    }
    let conditions = |webhook: &Value| -> Vec<String> {
        let list = webhook["matchConditions"].as_array().unwrap();
        list.iter().map(|c| c["expression"].as_str().unwrap().to_string()).collect()
    };
    let serve = Cli::parse_from(["busyguard", "serve"]);
    let BusyguardCommand::Serve(serve) = serve.command else { unreachable!() };
    let karpenter = serve.into_config().policy.exemptions.karpenter;
    // Nor, while busyguard is down, the requesters it always lets through, nor deletes it would
    // allow unchanged: the conditions of src/policy/selectors.rs, to the letter.
    assert_eq!(
        conditions(deletes),
        [
            "!has(oldObject.metadata.deletionTimestamp)".to_string(),
            selectors::not_from_a_delete_that_must_not_wait(&karpenter),
            selectors::pod_deletes_let_through(),
            selectors::pod_delete_may_be_refused(),
        ]
    );
    let granted_by_default = Cli::parse_from(["busyguard", "serve"]);
    let BusyguardCommand::Serve(serve) = granted_by_default.command else { unreachable!() };
    assert!(serve.into_config().policy.exemptions.users.contains(&POD_GC_USER.to_string()));
    assert_eq!(
        conditions(preemptions),
        [
            "!has(oldObject.metadata.deletionTimestamp)".to_string(),
            selectors::from_a_delete_that_must_not_wait(&karpenter),
            selectors::pod_delete_may_be_refused(),
        ]
    );
    assert_eq!(conditions(pods), [selectors::pod_write_may_be_patched()], "the mutating webhook");

    let evictions = webhook(&objects, "pod-evictions.busyguard.io");
    assert_eq!(rule(evictions), (json!([""]), json!(["CREATE"]), json!(["pods/eviction"])));
    assert!(evictions.get("objectSelector").is_none(), "the Eviction carries no pod labels");
    assert_eq!(evictions["failurePolicy"], "Ignore");

    let scale_downs = webhook(&objects, "scale-downs.busyguard.io");
    let resources = json!(["deployments", "replicasets", "deployments/scale", "replicasets/scale"]);
    assert_eq!(rule(scale_downs), (json!(["apps"]), json!(["UPDATE"]), resources));
    assert!(scale_downs.get("objectSelector").is_none());
    assert_eq!(scale_downs["failurePolicy"], "Ignore");
    assert_eq!(conditions(scale_downs), [selectors::LOWERS_REPLICAS]);
    let flags = webhook(&objects, "pod-flags.busyguard.io");
    // Writes through pods/status too: no mutating webhook sees them, so busyguard's keys are held
    // there by refusal.
    assert_eq!(rule(flags), (json!([""]), json!(["UPDATE"]), json!(["pods", "pods/status"])));
    assert_eq!(flags["objectSelector"], selectors::not_idle(), "flips, and busy pods");
    let idle_flags = webhook(&objects, "idle-pod-flags.busyguard.io");
    assert_eq!(idle_flags["objectSelector"], selectors::idle());
    assert_eq!(
        rule(idle_flags),
        (json!([""]), json!(["UPDATE"]), json!(["pods"])),
        "idle pods' status is the kubelet's"
    );
    let mut same_rule = idle_flags.clone();
    let kept = same_rule["matchConditions"].as_array_mut().unwrap().pop().unwrap();
    assert_eq!(kept["expression"], selectors::not_for_pod_flags(), "flips are pod-flags' alone");
    for key in ["matchConditions", "failurePolicy", "clientConfig", "sideEffects", "timeoutSeconds"] {
        assert_eq!(same_rule[key], flags[key], "{key}");
    }
    assert_eq!(flags["sideEffects"], "None", "it only answers");
    assert_eq!(quoted(&conditions(flags)[0]), ["system:serviceaccount:busyguard:busyguard"], "busyguard's own writes");
    assert_eq!(conditions(flags)[1], selectors::from_a_pod_or_on_busyguards_keys());
    let marks = webhook(&objects, "pod-marks.busyguard.io");
    assert_eq!(rule(marks), (json!([""]), json!(["CREATE", "UPDATE"]), json!(["pods", "pods/status"])));
    assert_eq!(marks["objectSelector"], selectors::marked());
    assert_eq!(marks["failurePolicy"], "Fail", "no mark written while busyguard cannot judge it");
    assert_eq!(quoted(&conditions(marks)[0]), ["system:serviceaccount:busyguard:busyguard"]);
    assert_eq!(conditions(marks)[1], selectors::pod_write_marks_anew());
    let nodes = webhook(&objects, "node-deletes.busyguard.io");
    assert_eq!(rule(nodes), (json!([""]), json!(["DELETE"]), json!(["nodes"])));
    assert_eq!(nodes["rules"][0]["scope"], "Cluster");
    assert_eq!(nodes["failurePolicy"], "Ignore", "an outage must not stop node lifecycle");
    assert_eq!(conditions(nodes), [selectors::node_deletes_let_through(&karpenter)], "let through, not sent");
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

#[test]
fn the_cert_manager_overlay_issues_the_serving_secret_and_injects_its_ca() {
    let objects = render(&manifests("cert-manager"));
    let certificate = find(&objects, "Certificate", "busyguard");
    assert_eq!(certificate["spec"]["secretName"], "busyguard-tls", "the Deployment's volume");
    let names = certificate["spec"]["dnsNames"].as_array().unwrap();
    assert!(names.contains(&json!("busyguard.busyguard.svc")), "the name the API server dials");
    let issuer = find(&objects, "Issuer", certificate["spec"]["issuerRef"]["name"].as_str().unwrap());
    let ca = find(&objects, "Certificate", "busyguard-ca");
    assert_eq!(issuer["spec"]["ca"]["secretName"], ca["spec"]["secretName"]);
    assert_eq!(ca["spec"]["isCA"], true);
    for kind in ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"] {
        let annotations = &find(&objects, kind, "busyguard")["metadata"]["annotations"];
        assert_eq!(annotations["cert-manager.io/inject-ca-from"], "busyguard/busyguard", "{kind}");
    }
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

fn certificates_in(pem: &[u8]) -> usize {
    String::from_utf8_lossy(pem).matches("-----BEGIN CERTIFICATE-----").count()
}

#[test]
fn the_self_managed_overlay_turns_make_cluster_certs_into_the_secret_and_every_ca_bundle() {
    let (dir, certs) = self_managed_copy();
    let objects = render(&dir.path().join("manifests/self-managed"));
    let secret = find(&objects, "Secret", "busyguard-tls");
    assert_eq!(secret["metadata"]["namespace"], "busyguard");
    assert_eq!(secret["type"], "kubernetes.io/tls");
    for file in ["tls.crt", "tls.key", "ca.crt"] {
        let written = std::fs::read(certs.join(file)).unwrap();
        assert_eq!(without_whitespace(&secret["data"][file]), base64(&written), "{file}");
    }
    let ca = std::fs::read(certs.join("ca.crt")).unwrap();
    for webhook in webhooks(&objects) {
        assert_eq!(without_whitespace(&webhook["clientConfig"]["caBundle"]), base64(&ca), "{}", webhook["name"]);
    }
    assert_serves_the_service_under_the_first_ca(&certs);
}

/// `busyguard certs` keeps (does not rewrite) a serving pair only when it is valid for the
/// Service's name and chains to the first CA in `ca.crt`.
fn assert_serves_the_service_under_the_first_ca(certs: &Path) {
    let serving = std::fs::read(certs.join("tls.crt")).unwrap();
    let check =
        run(Command::new(BUSYGUARD).args(["certs", "--dns", "busyguard.busyguard.svc", "--no-ip", "--dir"]).arg(certs));
    assert!(String::from_utf8_lossy(&check.stdout).contains("kept"), "{check:?}");
    assert_eq!(std::fs::read(certs.join("tls.crt")).unwrap(), serving, "kept as it was");
}

#[test]
fn a_rotation_trusts_the_old_and_the_new_ca_until_it_is_finished() {
    let (_dir, certs) = self_managed_copy();
    let old_ca = std::fs::read(certs.join("ca.crt")).unwrap();
    let old_serving = std::fs::read(certs.join("tls.crt")).unwrap();

    make(&["cluster-certs-rotate"], &[("CLUSTER_CERTS", &certs)]);
    let during = std::fs::read(certs.join("ca.crt")).unwrap();
    assert_eq!(certificates_in(&during), 2);
    assert!(during.ends_with(&old_ca), "the old CA is still trusted");
    assert_ne!(std::fs::read(certs.join("tls.crt")).unwrap(), old_serving, "a new serving pair");
    assert_serves_the_service_under_the_first_ca(&certs);

    make(&["cluster-certs-rotated"], &[("CLUSTER_CERTS", &certs)]);
    let after = std::fs::read(certs.join("ca.crt")).unwrap();
    assert_eq!(certificates_in(&after), 1);
    assert!(during.starts_with(&after), "only the new CA is left");
}

/// A kubectl that records its arguments and the files it is given instead of calling a cluster.
fn fake_kubectl(dir: &Path) -> PathBuf {
    let path = dir.join("kubectl");
    let script = format!("#!/bin/sh\necho \"$@\" >> {log}\n", log = dir.join("kubectl.log").display());
    std::fs::write(&path, script).unwrap();
    run(Command::new("chmod").arg("+x").arg(&path));
    path
}

#[test]
fn make_image_builds_one_image_for_amd64_and_arm64_and_pushes_it() {
    let dir = tempfile::tempdir().unwrap();
    let docker = dir.path().join("docker");
    let script = format!("#!/bin/sh\necho \"$@\" >> {log}\n", log = dir.path().join("docker.log").display());
    std::fs::write(&docker, script).unwrap();
    run(Command::new("chmod").arg("+x").arg(&docker));
    make(&["image", "IMAGE=registry.example.com/busyguard:0.2.0"], &[("CONTAINER", &docker)]);
    let log = std::fs::read_to_string(dir.path().join("docker.log")).unwrap();
    let commit =
        String::from_utf8(run(Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).current_dir(ROOT)).stdout)
            .unwrap();
    assert_eq!(
        log.trim(),
        format!(
            "buildx build --platform linux/amd64,linux/arm64 --build-arg BUSYGUARD_COMMIT={} -t \
             registry.example.com/busyguard:0.2.0 --push .",
            commit.trim()
        )
    );
}

#[test]
fn make_dev_register_applies_url_webhooks_trusting_the_local_ca_and_dev_unregister_removes_them() {
    let dir = tempfile::tempdir().unwrap();
    let kubectl = fake_kubectl(dir.path());
    let certs = dir.path().join("certs");
    make(&["dev-register"], &[("KUBECTL", &kubectl), ("CERTS_DIR", &certs)]);
    let applied = certs.join("dev-webhooks.yaml");
    let log = std::fs::read_to_string(dir.path().join("kubectl.log")).unwrap();
    assert_eq!(log, format!("apply -f {}\n", applied.display()));

    let objects: Vec<Value> = serde_saphyr::from_multiple(&std::fs::read_to_string(&applied).unwrap()).unwrap();
    let base = render(&manifests(""));
    let ca = std::fs::read(certs.join("ca.crt")).unwrap();
    assert_eq!(objects.len(), 2);
    for object in &objects {
        assert_eq!(object["apiVersion"], "admissionregistration.k8s.io/v1");
        assert_eq!(object["metadata"]["name"], "busyguard-dev");
        let deployed = find(&base, object["kind"].as_str().unwrap(), "busyguard");
        let dev = object["webhooks"].as_array().unwrap();
        assert_eq!(dev.len(), deployed["webhooks"].as_array().unwrap().len());
        for (dev, deployed) in dev.iter().zip(deployed["webhooks"].as_array().unwrap()) {
            let client = dev["clientConfig"].as_object().unwrap();
            let path = deployed["clientConfig"]["service"]["path"].as_str().unwrap();
            assert_eq!(client["url"], format!("https://127.0.0.1:8443{path}"), "exactly one of url and service");
            assert!(!client.contains_key("service"));
            assert_eq!(client["caBundle"], base64(&ca));
            for field in ["name", "rules", "failurePolicy", "sideEffects", "admissionReviewVersions", "timeoutSeconds"]
            {
                assert_eq!(dev[field], deployed[field], "{field}");
            }
        }
    }

    make(&["dev-unregister"], &[("KUBECTL", &kubectl)]);
    let log = std::fs::read_to_string(dir.path().join("kubectl.log")).unwrap();
    let deleted = log.lines().last().unwrap();
    assert_eq!(
        deleted,
        "delete mutatingwebhookconfiguration/busyguard-dev validatingwebhookconfiguration/busyguard-dev --ignore-not-found"
    );
}

#[test]
fn make_e2e_cluster_without_a_reachable_cluster_says_so_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n\
         users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n\
         current-context: c\n",
    )
    .unwrap();
    let output =
        Command::new("make").args(["-s", "-C", ROOT, "e2e-cluster"]).env("KUBECONFIG", &kubeconfig).output().unwrap();
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("no cluster reachable"), "{said}");
    assert!(said.contains("nothing was tested"), "{said}");
}

#[test]
fn the_network_policy_lets_only_the_api_server_send_reviews_and_scrapers_reach_the_admin_port() {
    let objects = render(&manifests("examples/with-network-policy"));
    let policy = find(&objects, "NetworkPolicy", "busyguard");
    let deployment = find(&objects, "Deployment", "busyguard");
    assert!(selects(&selector(&policy["spec"]["podSelector"]), &deployment["spec"]["template"]["metadata"]["labels"]));
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));
    let rules = policy["spec"]["ingress"].as_array().unwrap();
    assert_eq!(rules.len(), 2);
    let port = |rule: &Value| rule["ports"][0]["port"].as_u64().unwrap();
    let ports = &deployment["spec"]["template"]["spec"]["containers"][0]["ports"];
    let named =
        |name: &str| ports.as_array().unwrap().iter().find(|p| p["name"] == name).unwrap()["containerPort"].clone();
    assert_eq!(json!(port(&rules[0])), named("https"));
    assert_eq!(rules[0]["from"], json!([{"ipBlock": {"cidr": "10.0.0.0/24"}}]), "the overlay's API server address");
    assert_eq!(json!(port(&rules[1])), named("admin"));
    assert!(rules.iter().all(|r| r["from"].as_array().is_some_and(|f| !f.is_empty())), "no rule open to all");
    // Without the overlay's address, the component lets no real API server in.
    let placeholder = std::fs::read_to_string(manifests("network-policy/networkpolicy.yaml")).unwrap();
    assert!(placeholder.contains("cidr: 192.0.2.0/24"));
}

#[test]
fn the_namespaced_example_grants_the_same_rules_in_its_namespace_only_and_watches_only_there() {
    let base = render(&manifests(""));
    let objects = render(&manifests("examples/namespaced"));
    let base_rules = find(&base, "ClusterRole", "busyguard")["rules"].as_array().unwrap().clone();
    let (cluster_wide, namespaced): (Vec<Value>, Vec<Value>) =
        base_rules.into_iter().partition(|rule| rule["resources"] == json!(["namespaces", "nodes"]));
    let cluster_roles: Vec<&Value> = objects.iter().filter(|o| o["kind"] == "ClusterRole").collect();
    assert_eq!(cluster_roles.len(), 1, "one cluster-wide role");
    assert_eq!(
        cluster_roles[0]["rules"],
        json!(cluster_wide),
        "cluster-wide: which namespaces opted out and which nodes are going, nothing more"
    );
    let role = find(&objects, "Role", "busyguard");
    assert_eq!(role["rules"], json!(namespaced), "the same calls, in one namespace");
    let binding = find(&objects, "RoleBinding", "busyguard");
    assert_eq!(binding["metadata"]["namespace"], role["metadata"]["namespace"]);
    assert_eq!(binding["subjects"][0]["name"], find(&objects, "ServiceAccount", "busyguard")["metadata"]["name"]);
    let env = &find(&objects, "Deployment", "busyguard")["spec"]["template"]["spec"]["containers"][0]["env"];
    let namespaces = env.as_array().unwrap().iter().find(|e| e["name"] == "BUSYGUARD_NAMESPACES").unwrap();
    assert_eq!(namespaces["value"], role["metadata"]["namespace"], "busyguard watches where it may");
}

#[test]
fn the_fence_refuses_busyguards_own_token_any_pod_that_is_not_busyguards() {
    let objects = render(&manifests(""));
    let policy = &find(&objects, "ValidatingAdmissionPolicy", "busyguard-fence")["spec"];
    let account = &find(&objects, "ServiceAccount", "busyguard")["metadata"];
    let username = format!(
        "system:serviceaccount:{}:{}",
        account["namespace"].as_str().unwrap(),
        account["name"].as_str().unwrap()
    );
    assert_eq!(policy["matchConditions"][0]["expression"], format!("request.userInfo.username == '{username}'"));
    assert_eq!(policy["failurePolicy"], "Fail");
    let rules = &policy["matchConstraints"]["resourceRules"];
    assert_eq!(
        rules,
        &json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE", "DELETE"], "resources": ["pods"]}])
    );
    let validations = policy["validations"].as_array().unwrap();
    assert_eq!(validations.len(), 2);
    assert_eq!(validations[0]["expression"], selectors::busyguards_own_pods());
    assert_eq!(validations[1]["expression"], selectors::BUSYGUARDS_POD_WRITES, "metadata only");
    assert!(
        quoted(&selectors::busyguards_own_pods()).contains(&account["namespace"].as_str().unwrap().to_string()),
        "nor in busyguard's own namespace"
    );
    let binding = &find(&objects, "ValidatingAdmissionPolicyBinding", "busyguard-fence")["spec"];
    assert_eq!((&binding["policyName"], &binding["validationActions"]), (&json!("busyguard-fence"), &json!(["Deny"])));
    // Its busy-pod PDB and the budgets' Leases, the other objects it writes.
    let objects_policy = &find(&objects, "ValidatingAdmissionPolicy", "busyguard-fence-objects")["spec"];
    assert_eq!(objects_policy["matchConditions"], policy["matchConditions"]);
    assert_eq!(objects_policy["failurePolicy"], "Fail");
    let resources: Vec<&Value> = objects_policy["matchConstraints"]["resourceRules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["resources"])
        .collect();
    assert_eq!(resources, [&json!(["poddisruptionbudgets"]), &json!(["leases"])]);
    assert_eq!(objects_policy["validations"][0]["expression"], selectors::busyguards_own_objects());
    let binding = &find(&objects, "ValidatingAdmissionPolicyBinding", "busyguard-fence-objects")["spec"];
    assert_eq!(binding["policyName"], "busyguard-fence-objects");
    // Its evictions, which a rule on pods does not match.
    let evictions = &find(&objects, "ValidatingAdmissionPolicy", "busyguard-fence-evictions")["spec"];
    assert_eq!(evictions["matchConditions"], policy["matchConditions"]);
    assert_eq!(evictions["failurePolicy"], "Fail");
    assert_eq!(
        evictions["matchConstraints"]["resourceRules"],
        json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods/eviction"]}])
    );
    assert_eq!(evictions["validations"][0]["expression"], selectors::busyguards_own_evictions());
    let binding = &find(&objects, "ValidatingAdmissionPolicyBinding", "busyguard-fence-evictions")["spec"];
    assert_eq!(
        (&binding["policyName"], &binding["validationActions"]),
        (&json!("busyguard-fence-evictions"), &json!(["Deny"]))
    );
}

#[test]
fn before_1_30_the_component_leaves_out_the_fence_and_nothing_else() {
    let is_fence = |o: &Value| o["kind"].as_str().unwrap().starts_with("ValidatingAdmissionPolicy");
    let mut shipped = render(&manifests("cert-manager"));
    let fences = shipped.iter().filter(|o| is_fence(o)).count();
    assert_eq!(fences, 6, "three policies and their bindings");
    shipped.retain(|o| !is_fence(o));
    assert_eq!(render(&manifests("examples/before-1.30")), shipped);
}

#[test]
fn opted_in_every_webhook_that_selects_namespaces_asks_for_the_enabled_label_and_busyguard_is_told() {
    let opted_in = render(&manifests("examples/opt-in"));
    assert_eq!(namespace_selectors_as_built(&opted_in, Enrolment::OptIn), 13, "every webhook but node-deletes");
    for webhook in webhooks(&opted_in).into_iter().filter(|w| w.get("namespaceSelector").is_some()) {
        let namespaces = selector(&webhook["namespaceSelector"]);
        let name = &webhook["name"];
        let mut opted = json!({"kubernetes.io/metadata.name": "batch", "busyguard.io/enabled": "true",
            "busyguard.io/run-to-completion": "true"});
        assert!(selects(&namespaces, &opted), "{name}: a namespace labelled in");
        opted.as_object_mut().unwrap().remove("busyguard.io/enabled");
        assert!(!selects(&namespaces, &opted), "{name}: a namespace not labelled");
    }
    let env = &find(&opted_in, "Deployment", "busyguard")["spec"]["template"]["spec"]["containers"][0]["env"];
    assert!(
        env.as_array().unwrap().contains(&json!({"name": "BUSYGUARD_OPT_IN", "value": "true"})),
        "busyguard is told"
    );
    // Nothing else changes.
    let without_the_choice = |mut objects: Vec<Value>| {
        for object in &mut objects {
            for webhook in object.get_mut("webhooks").and_then(Value::as_array_mut).into_iter().flatten() {
                webhook.as_object_mut().unwrap().remove("namespaceSelector");
            }
            if object["kind"] == "Deployment" {
                let env = object["spec"]["template"]["spec"]["containers"][0]["env"].as_array_mut().unwrap();
                env.retain(|var| var["name"] != "BUSYGUARD_OPT_IN");
            }
        }
        objects
    };
    assert_eq!(without_the_choice(opted_in), without_the_choice(render(&manifests("cert-manager"))));
}

/// An overlay of one's own in a copy of `manifests/` (under examples/, so `../../X` names a
/// directory of manifests/), rendered.
fn overlay_in(root: &Path, resource: &str, components: &[&str]) -> Vec<Value> {
    let dir = root.join("examples/under-test");
    std::fs::create_dir_all(&dir).unwrap();
    let components: String = components.iter().map(|c| format!("  - ../../{c}\n")).collect();
    let kustomization = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../../{resource}\n\
         components:\n{components}"
    );
    std::fs::write(dir.join("kustomization.yaml"), kustomization).unwrap();
    render(&dir)
}

#[test]
fn each_owner_component_follows_opt_in_and_self_managed_by_name_whatever_the_order() {
    let (dir, certs) = self_managed_copy();
    let root = dir.path().join("manifests");
    let ca = base64(&std::fs::read(certs.join("ca.crt")).unwrap());
    let owners = ["actions-runner-controller", "agones"];
    let together = render(&manifests("examples/actions-runner-controller-and-agones"));
    for name in ["actions-runner-controller.busyguard.io", "agones.busyguard.io"] {
        assert_eq!(webhook(&together, name)["clientConfig"], webhook(&together, "pods.busyguard.io")["clientConfig"]);
    }
    // containerMode: kubernetes: the hooks' workflow pod (labelled with its runner's pod, no owner).
    let workflows = webhook(&together, "actions-runner-controller-workflows.busyguard.io");
    assert_eq!(workflows["clientConfig"], webhook(&together, "pods.busyguard.io")["clientConfig"]);
    let pod = |labels: Value| json!({"metadata": {"name": "r-workflow", "labels": labels}});
    assert!(sends_create(workflows, &pod(json!({"runner-pod": "r"}))));
    assert!(!sends_create(workflows, &pod(json!({"app": "w"}))), "only the hooks' pods");
    let args = &find(&together, "Deployment", "busyguard")["spec"]["template"]["spec"]["containers"][0]["args"];
    assert_eq!(
        args.as_array().unwrap().iter().filter(|a| a.as_str().unwrap().starts_with("--busy-when-owner")).count(),
        2
    );
    for order in [owners, [owners[1], owners[0]]] {
        let opt_in_first = [&["opt-in"][..], &order[..]].concat();
        let opt_in_last = [&order[..], &["opt-in"][..]].concat();
        for components in [opt_in_first, opt_in_last] {
            let objects = overlay_in(&root, "cert-manager", &components);
            assert_eq!(
                namespace_selectors_as_built(&objects, Enrolment::OptIn),
                17,
                "{components:?}: every webhook but node-deletes"
            );
        }
        let objects = overlay_in(&root, "cert-manager", &order);
        assert_eq!(namespace_selectors_as_built(&objects, Enrolment::OptOut), 17, "{order:?}");
        let objects = overlay_in(&root, "self-managed", &order);
        for webhook in webhooks(&objects) {
            assert_eq!(without_whitespace(&webhook["clientConfig"]["caBundle"]), ca, "{order:?}: {}", webhook["name"]);
        }
    }
}

#[test]
fn agones_own_deletes_of_its_game_servers_pods_skip_the_fail_closed_delete_webhooks() {
    let objects = render(&manifests("examples/agones"));
    let game_server = json!({"metadata": {"labels": {"agones.dev/gameserver": "gs", "busyguard.io/busy": "true"}}});
    let worker = json!({"metadata": {"labels": {"app": "w", "busyguard.io/busy": "true"}}});
    for name in ["pod-deletes.busyguard.io", "budget-deletes.busyguard.io"] {
        let conditions = webhook(&objects, name)["matchConditions"].as_array().unwrap().clone();
        let condition = conditions.iter().find(|c| c["name"] == "not-agones-ending-its-game-server").unwrap();
        let sent = |user: &str, pod: &Value| {
            let program = cel::Program::compile(condition["expression"].as_str().unwrap()).unwrap();
            let mut context = cel::Context::default();
            context.add_variable_from_value("request", cel::to_value(json!({"userInfo": {"username": user}})).unwrap());
            context.add_variable_from_value("oldObject", cel::to_value(pod).unwrap());
            program.execute(&context).unwrap() == cel::Value::Bool(true)
        };
        let agones = "system:serviceaccount:agones-system:agones-controller";
        assert!(!sent(agones, &game_server), "{name}: Agones' end of its own game server");
        assert!(sent(agones, &worker), "{name}: Agones' controller deleting another pod");
        assert!(sent("alice", &game_server), "{name}: a person's delete");
        assert!(conditions.len() > 1, "{name}: the base's conditions are kept");
    }
    // Only an allocation (a GameServer turning Allocated) is sent to busyguard.
    let allocations = webhook(&objects, "agones-allocations.busyguard.io");
    assert_eq!(allocations["clientConfig"], webhook(&objects, "pod-deletes.busyguard.io")["clientConfig"]);
    let condition = allocations["matchConditions"][0]["expression"].as_str().unwrap();
    let sent = |old: &str, new: &str| {
        let program = cel::Program::compile(condition).unwrap();
        let mut context = cel::Context::default();
        let state = |s: &str| json!({"status": {"state": s}});
        context.add_variable_from_value("object", cel::to_value(state(new)).unwrap());
        context.add_variable_from_value("oldObject", cel::to_value(state(old)).unwrap());
        program.execute(&context).unwrap() == cel::Value::Bool(true)
    };
    assert!(sent("Ready", "Allocated"));
    assert!(!sent("Allocated", "Allocated"), "an Allocated server's other updates");
    assert!(!sent("Allocated", "Ready"));
}

#[test]
fn an_overlay_of_your_own_sets_your_image_with_kubectl_alone() {
    let objects = render(&manifests("examples/your-image"));
    let deployment = find(&objects, "Deployment", "busyguard");
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        "registry.example.com/busyguard:0.2.0"
    );
}

/// Whether the API server would send a pod's CREATE to `webhook`: its object selector, then its
/// match conditions, evaluated as CEL.
fn sends_create(webhook: &Value, pod: &Value) -> bool {
    let labels = &pod["metadata"]["labels"];
    selects(&selector(&webhook["objectSelector"]), labels)
        && webhook["matchConditions"].as_array().into_iter().flatten().all(|condition| {
            let program = cel::Program::compile(condition["expression"].as_str().unwrap()).unwrap();
            let mut context = cel::Context::default();
            context.add_variable_from_value("object", cel::to_value(pod).unwrap());
            program.execute(&context).unwrap() == cel::Value::Bool(true)
        })
}

#[test]
fn each_owner_recipe_opts_in_its_owners_pods_and_no_other_reads_its_owners_and_names_their_busy_rule() {
    let cert_manager = render(&manifests("cert-manager"));
    let recipes = [
        (
            "actions-runner-controller",
            "actions-ephemeral-runner",
            "actions.github.com/v1alpha1",
            "EphemeralRunner",
            "ephemeralrunners",
        ),
        ("agones", "agones.dev/gameserver", "agones.dev/v1", "GameServer", "gameservers"),
    ];
    for (recipe, label, api_version, kind, plural) in recipes {
        let objects = render(&manifests(&format!("examples/{recipe}")));
        let opt_in = webhook(&objects, &format!("{recipe}.busyguard.io"));
        assert_eq!(opt_in["clientConfig"]["service"]["path"], "/mutate", "{recipe}");
        assert_eq!(opt_in["rules"][0]["operations"], json!(["CREATE"]), "{recipe}");
        let owned_by = |api_version: &str, kind: &str, labels: Value| {
            json!({"metadata": {"name": "p", "labels": labels,
                "ownerReferences": [{"apiVersion": api_version, "kind": kind, "name": "o", "uid": "u", "controller": true}]}})
        };
        let theirs = owned_by(api_version, kind, json!({label: "x"}));
        assert!(sends_create(opt_in, &theirs), "{recipe}: its owner's pod is opted in");
        // busyguard check dry-runs such a pod, labelled as the webhook selects it.
        let (_, _, checked, value) = busyguard::commands::check::OPT_IN_LABELS
            .into_iter()
            .find(|(group, of, ..)| api_version.starts_with(&format!("{group}/")) && *of == kind)
            .unwrap_or_else(|| panic!("{recipe}: busyguard check does not know its label"));
        assert!(sends_create(opt_in, &owned_by(api_version, kind, json!({checked: value}))), "{recipe}");
        let version_later = owned_by(&api_version.replace("/v1", "/v2"), kind, json!({label: "x"}));
        assert!(sends_create(opt_in, &version_later), "{recipe}: of another version of the group too");
        assert!(
            !sends_create(opt_in, &owned_by("apps/v1", "ReplicaSet", json!({label: "x"}))),
            "{recipe}: not another's"
        );
        assert!(
            !sends_create(opt_in, &owned_by("example.com/v1", kind, json!({label: "x"}))),
            "{recipe}: nor a namesake's"
        );
        assert!(!sends_create(opt_in, &owned_by(api_version, kind, json!({label: "x", "busyguard.io/busy": "false"}))));
        assert!(
            !sends_create(opt_in, &owned_by(api_version, kind, json!({"app": "x"}))),
            "{recipe}: by its label alone"
        );

        // busyguard is told the rule, which it parses as it starts; only the owners are read.
        let args =
            find(&objects, "Deployment", "busyguard")["spec"]["template"]["spec"]["containers"][0]["args"].clone();
        let args: Vec<String> = serde_json::from_value(args).unwrap();
        let cli = Cli::try_parse_from(std::iter::once("busyguard".to_string()).chain(args)).unwrap();
        let BusyguardCommand::Serve(serve) = cli.command else { unreachable!() };
        let rules = serve.into_config().policy.owner_rules;
        assert_eq!(rules.len(), 1, "{recipe}");
        assert!(rules[0].covers(api_version, kind), "{recipe}: {}", rules[0]);
        let role = find(&objects, "ClusterRole", &format!("busyguard-{recipe}"));
        let group = api_version.split('/').next().unwrap();
        assert_eq!(
            role["rules"],
            json!([{"apiGroups": [group], "resources": [plural], "verbs": ["get", "list", "watch"]}])
        );
        let binding = find(&objects, "ClusterRoleBinding", &format!("busyguard-{recipe}"));
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": "busyguard", "namespace": "busyguard"}])
        );

        // Nothing else changes.
        let without_the_recipe = |objects: &[Value]| -> Vec<Value> {
            let mut objects: Vec<Value> = objects
                .iter()
                .filter(|o| !o["metadata"]["name"].as_str().unwrap().ends_with(recipe))
                .cloned()
                .collect();
            for object in &mut objects {
                if let Some(webhooks) = object.get_mut("webhooks").and_then(Value::as_array_mut) {
                    webhooks.retain(|w| !w["name"].as_str().unwrap().starts_with(recipe));
                    for conditions in webhooks.iter_mut().filter_map(|w| w["matchConditions"].as_array_mut()) {
                        conditions.retain(|c| !c["name"].as_str().unwrap().contains(recipe));
                    }
                }
                if object["kind"] == "Deployment" {
                    object["spec"]["template"]["spec"]["containers"][0]["args"] = json!(["serve"]);
                }
            }
            objects
        };
        assert_eq!(without_the_recipe(&objects), without_the_recipe(&cert_manager), "{recipe}");
    }
}
