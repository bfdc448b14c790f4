//! The Helm chart (`charts/busyguard`), held to the kustomize install: for each choice, the
//! chart rendered with the value that makes it and the overlay that makes it with kustomize are
//! the same objects, field by field. Rendered with Helm's own library (helm-python-sdk,
//! installed under target/ by scripts/helm-python.sh), as `helm install` renders it.

use std::collections::BTreeMap;

use super::*;

/// `scripts/chart.py ARGS`, with helm-python-sdk installed first.
fn chart(args: &[&str]) -> Output {
    let installed = run(Command::new("sh").arg(format!("{ROOT}/scripts/helm-python.sh")));
    let python_path = String::from_utf8(installed.stdout).unwrap();
    let mut command = Command::new("python3");
    command.arg(format!("{ROOT}/scripts/chart.py")).args(args).env("PYTHONPATH", python_path.trim());
    command.output().unwrap()
}

/// The objects `helm install busyguard charts/busyguard -n busyguard` applies with these values.
fn render_chart(values: Value) -> Vec<Value> {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), values.to_string()).unwrap();
    let output = chart(&["render", file.path().to_str().unwrap()]);
    assert!(output.status.success(), "the chart did not render: {}", String::from_utf8_lossy(&output.stderr));
    let list: Value = serde_json::from_slice(&output.stdout).unwrap();
    list["items"].as_array().unwrap().clone()
}

/// Objects by kind, namespace and name. The Namespace is the kustomize install's alone: Helm
/// installs into a namespace that exists (`--create-namespace`), and cannot own it.
/// Base64 is compared without its line breaks: kustomize folds it, Helm does not, and the API
/// server reads both alike.
fn by_identity(objects: Vec<Value>) -> BTreeMap<String, Value> {
    let identity = |o: &Value| format!("{} {}/{}", o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]);
    let unfolded = |value: &mut Value| *value = json!(without_whitespace(value));
    let mut kept = BTreeMap::new();
    for mut object in objects.into_iter().filter(|o| o["kind"] != "Namespace") {
        let secret = object["kind"] == "Secret";
        if let Some(data) = object["data"].as_object_mut().filter(|_| secret) {
            data.values_mut().for_each(unfolded);
        }
        for webhook in object["webhooks"].as_array_mut().into_iter().flatten() {
            if let Some(bundle) = webhook["clientConfig"].get_mut("caBundle") {
                unfolded(bundle);
            }
        }
        kept.insert(identity(&object), object);
    }
    kept
}

fn assert_same_install(overlay: &str, kustomized: Vec<Value>, values: Value) {
    let chart = by_identity(render_chart(values));
    let kustomized = by_identity(kustomized);
    assert_eq!(chart.keys().collect::<Vec<_>>(), kustomized.keys().collect::<Vec<_>>(), "the objects of {overlay}");
    for (identity, object) in &kustomized {
        if let Some(difference) = first_difference(&chart[identity], object, "") {
            panic!("{identity} of {overlay}: {difference}");
        }
    }
}

/// Where two objects first differ, and how: the chart's value, then kustomize's.
fn first_difference(chart: &Value, kustomized: &Value, path: &str) -> Option<String> {
    match (chart, kustomized) {
        (Value::Object(c), Value::Object(k)) => c.keys().chain(k.keys()).find_map(|key| {
            first_difference(
                c.get(key).unwrap_or(&Value::Null),
                k.get(key).unwrap_or(&Value::Null),
                &format!("{path}.{key}"),
            )
        }),
        (Value::Array(c), Value::Array(k)) if c.len() == k.len() => {
            c.iter().zip(k).enumerate().find_map(|(i, (c, k))| first_difference(c, k, &format!("{path}[{i}]")))
        }
        _ => (chart != kustomized).then(|| format!("{path}: the chart has {chart}, kustomize {kustomized}")),
    }
}

#[test]
fn the_chart_installs_what_each_example_overlay_installs() {
    let cases = [
        ("cert-manager", json!({})),
        ("examples/actions-runner-controller", json!({"actionsRunnerController": {"enabled": true}})),
        ("examples/agones", json!({"agones": {"enabled": true}})),
        ("examples/agent-sandbox", json!({"agentSandbox": {"enabled": true}})),
        (
            "examples/actions-runner-controller-and-agones",
            json!({"actionsRunnerController": {"enabled": true}, "agones": {"enabled": true}}),
        ),
        ("examples/before-1.30", json!({"fence": false})),
        ("examples/opt-in", json!({"optIn": true})),
        ("examples/namespaced", json!({"watchNamespaces": ["workers"]})),
        ("examples/with-monitoring", json!({"monitoring": {"enabled": true}})),
        ("examples/with-network-policy", json!({"networkPolicy": {"enabled": true, "apiServerCIDR": "10.0.0.0/24"}})),
        ("examples/your-image", json!({"image": {"repository": "registry.example.com/busyguard"}})),
    ];
    for (overlay, values) in cases {
        assert_same_install(overlay, render(&manifests(overlay)), values);
    }
}

#[test]
fn the_chart_with_self_managed_certificates_every_component_and_runbook_links_installs_what_kustomize_does() {
    let (dir, certs) = self_managed_copy();
    let root = dir.path().join("manifests");
    let overlay = root.join("examples/under-test");
    std::fs::create_dir_all(&overlay).unwrap();
    let kustomization = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
        resources: [../../self-managed]\n\
        components: [../../opt-in, ../../actions-runner-controller, ../../agones, ../../agent-sandbox, ../../monitoring, \
        ../../runbook-links]\n\
        configMapGenerator:\n  - name: busyguard-runbooks\n    literals: [base=https://example.com/busyguard/blob/v0.3.0/]\n    \
        options:\n      disableNameSuffixHash: true\n      annotations: {config.kubernetes.io/local-config: \"true\"}\n";
    std::fs::write(overlay.join("kustomization.yaml"), kustomization).unwrap();
    let pem = |file: &str| std::fs::read_to_string(certs.join(file)).unwrap();
    let values = json!({
        "certificates": {"source": "self-managed",
            "selfManaged": {"tlsCrt": pem("tls.crt"), "tlsKey": pem("tls.key"), "caCrt": pem("ca.crt")}},
        "optIn": true,
        "actionsRunnerController": {"enabled": true},
        "agones": {"enabled": true},
        "agentSandbox": {"enabled": true},
        "monitoring": {"enabled": true, "runbookBase": "https://example.com/busyguard/blob/v0.3.0/"},
    });
    assert_same_install("self-managed with every component", render(&overlay), values);
}

#[test]
fn the_chart_lints_clean() {
    let output = chart(&["lint"]);
    assert!(output.status.success(), "helm lint --strict: {}", String::from_utf8_lossy(&output.stderr));
}

#[test]
fn a_misspelt_or_unknown_value_is_refused_with_a_clear_error_and_nothing_rendered() {
    let refused = |values: Value, namespace: &str| {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), values.to_string()).unwrap();
        let output = chart(&["render", file.path().to_str().unwrap(), namespace]);
        assert!(!output.status.success(), "{values} rendered");
        assert!(output.stdout.is_empty(), "{values} rendered something");
        String::from_utf8(output.stderr).unwrap()
    };
    let misspelt = refused(json!({"agonez": {"enabled": true}}), "busyguard");
    assert!(misspelt.contains("additional properties 'agonez' not allowed"), "{misspelt}");
    let unknown = refused(json!({"certificates": {"source": "self-manged"}}), "busyguard");
    assert!(
        unknown.contains("/certificates/source") && unknown.contains("'cert-manager', 'self-managed'"),
        "{unknown}"
    );
    let no_cidr = refused(json!({"networkPolicy": {"enabled": true}}), "busyguard");
    assert!(no_cidr.contains("networkPolicy.apiServerCIDR"), "{no_cidr}");
    let not_pem =
        json!({"certificates": {"source": "self-managed", "selfManaged": {"createSecret": false, "caCrt": "ca"}}});
    let not_pem = refused(not_pem, "busyguard");
    assert!(not_pem.contains("certificates.selfManaged.caCrt is not a PEM certificate"), "{not_pem}");
    let ignored = refused(json!({"certificates": {"selfManaged": {"tlsCrt": "x"}}}), "busyguard");
    assert!(ignored.contains("but certificates.source is cert-manager, which ignores it"), "{ignored}");
    // Values that would loosen what the chart holds: a stop the grace period cuts short, a watch
    // of the namespaces busyguard never guards.
    let too_long = refused(json!({"shutdownTimeout": "1m"}), "busyguard");
    assert!(too_long.contains("/shutdownTimeout"), "{too_long}");
    let kube_system = refused(json!({"watchNamespaces": ["jobs", "kube-system"]}), "busyguard");
    assert!(kube_system.contains("/watchNamespaces/1"), "{kube_system}");
    let elsewhere = refused(json!({}), "platform");
    assert!(elsewhere.contains("busyguard installs in the namespace busyguard, not \"platform\""), "{elsewhere}");
}

#[test]
fn the_charts_readme_is_written_from_its_values() {
    let output = chart(&["readme", "--check"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

/// The image the manifests and the chart install is the build's own version, as the CHANGELOG
/// names it: nobody works out which tag goes with which manifests.
#[test]
fn the_chart_the_manifests_the_changelog_and_busyguard_name_one_version() {
    let version = env!("CARGO_PKG_VERSION");
    let read = |path: &str| std::fs::read_to_string(Path::new(ROOT).join(path)).unwrap();
    let chart: Value = serde_saphyr::from_str(&read("charts/busyguard/Chart.yaml")).unwrap();
    assert_eq!((chart["version"].as_str(), chart["appVersion"].as_str()), (Some(version), Some(version)));
    let base: Value = serde_saphyr::from_str(&read("manifests/base/kustomization.yaml")).unwrap();
    assert_eq!(base["images"][0]["newTag"], version, "the base's image tag");
    let release = read("CHANGELOG.md").lines().find(|l| l.starts_with("## ")).unwrap().to_string();
    let named = release == format!("## Unreleased ({version})") || release.starts_with(&format!("## {version} ("));
    assert!(named, "the CHANGELOG's newest heading, {release:?}, is not {version}");
    let said = run(Command::new(BUSYGUARD).arg("--version"));
    let said = String::from_utf8(said.stdout).unwrap();
    assert!(said.starts_with(&format!("busyguard {version} (commit ")), "{said}");
}

/// The values file at `charts/busyguard/examples/NAME`, as `-f` reads it.
fn values_file(name: &str) -> Value {
    let text = std::fs::read_to_string(format!("{ROOT}/charts/busyguard/examples/{name}")).unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

fn one<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    let found = objects.iter().find(|o| o["kind"] == kind && o["metadata"]["name"] == name);
    found.unwrap_or_else(|| panic!("no {kind}/{name}"))
}

/// The webhooks of both configurations, flattened.
fn webhooks(objects: &[Value]) -> Vec<&Value> {
    let configurations =
        objects.iter().filter(|o| o["kind"].as_str().is_some_and(|k| k.ends_with("WebhookConfiguration")));
    configurations.flat_map(|c| c["webhooks"].as_array().unwrap()).collect()
}

/// A production cluster's values (ARC, Agones, Kueue, Karpenter with its own service account,
/// kube-prometheus-stack, cert-manager, a system node pool with its taint, a pull secret, audit
/// mode first): each lands where that cluster needs it.
#[test]
fn the_production_values_file_fits_a_production_cluster() {
    let objects = render_chart(values_file("production.yaml"));
    let deployment = one(&objects, "Deployment", "busyguard");
    let pod = &deployment["spec"]["template"];
    assert_eq!(pod["spec"]["nodeSelector"], json!({"karpenter.sh/nodepool": "system"}));
    assert_eq!(pod["spec"]["tolerations"][0]["key"], "CriticalAddonsOnly");
    assert_eq!(pod["spec"]["imagePullSecrets"], json!([{"name": "ghcr-pull"}]));
    assert_eq!(pod["metadata"]["labels"]["team"], "platform", "commonLabels on the pods");
    assert_eq!(pod["metadata"]["labels"]["app.kubernetes.io/name"], "busyguard", "the selector's label kept");
    let container = &pod["spec"]["containers"][0];
    assert!(container["env"].as_array().unwrap().contains(&json!({"name": "BUSYGUARD_MODE", "value": "audit"})));
    let args: Vec<&str> = container["args"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(args.contains(&"--hold-kueue-preemption=true"), "{args:?}");
    assert!(args.contains(&"--karpenter-user=system:serviceaccount:karpenter:karpenter"), "{args:?}");
    for kind in ["PodMonitor", "PrometheusRule"] {
        assert_eq!(one(&objects, kind, "busyguard")["metadata"]["labels"]["release"], "kps", "{kind}: kps selects it");
    }
    assert_eq!(one(&objects, "ConfigMap", "busyguard-dashboard")["metadata"]["labels"]["release"], "kps");
    let kueue = one(&objects, "ClusterRole", "busyguard-kueue");
    assert_eq!(kueue["rules"][0]["resources"], json!(["workloads"]));
    for object in &objects {
        assert_eq!(
            object["metadata"]["labels"]["team"], "platform",
            "commonLabels on {} {}",
            object["kind"], object["metadata"]["name"]
        );
    }
    let karpenter_conditions: Vec<&str> = webhooks(&objects)
        .into_iter()
        .flat_map(|w| w["matchConditions"].as_array().into_iter().flatten())
        .filter_map(|c| c["expression"].as_str())
        .filter(|e| e.contains("userInfo.username") && e.contains(":karpenter"))
        .collect();
    assert!(karpenter_conditions.len() >= 5, "every condition that names Karpenter: {karpenter_conditions:?}");
    for condition in karpenter_conditions {
        assert!(
            condition.contains("'system:serviceaccount:karpenter:karpenter'")
                && !condition.contains("kube-system:karpenter"),
            "karpenter.users not in {condition}"
        );
    }
    let output = chart(&["lint"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

/// `watchNamespaces` guards those namespaces only: every webhook of a namespaced kind selects
/// them, and no other (those of nodes and NodeClaims have no namespace to select).
#[test]
fn watch_namespaces_narrows_every_webhook_to_its_namespaces() {
    let values = json!({"watchNamespaces": ["arc-runners", "games"], "actionsRunnerController": {"enabled": true},
        "agones": {"enabled": true}});
    let objects = render_chart(values);
    let hooks = webhooks(&objects);
    assert!(hooks.len() > 15, "{} webhooks", hooks.len());
    for webhook in hooks.into_iter().filter(|w| !w["namespaceSelector"].is_null()) {
        let terms = webhook["namespaceSelector"]["matchExpressions"].as_array().unwrap();
        let narrowed =
            json!({"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["arc-runners", "games"]});
        assert!(terms.contains(&narrowed), "{} selects namespaces outside watchNamespaces: {terms:?}", webhook["name"]);
    }
}

/// The values a platform team sets that change what is installed, each where it belongs; and a
/// value that would fight the chart's own is refused at render, naming the value to set instead.
#[test]
fn the_eviction_failure_policy_the_agones_rule_and_env_are_values_that_do_not_fight_the_charts_own() {
    let rule = "!has(object.metadata.deletionTimestamp) && has(object.status) && has(object.status.state) && object.status.state == 'Allocated'";
    let objects = render_chart(json!({"webhooks": {"evictions": {"failurePolicy": "Fail"}},
        "agones": {"enabled": true, "rule": rule}}));
    let evictions = webhooks(&objects).into_iter().find(|w| w["name"] == "pod-evictions.busyguard.io").unwrap();
    assert_eq!(evictions["failurePolicy"], "Fail");
    let args = &one(&objects, "Deployment", "busyguard")["spec"]["template"]["spec"]["containers"][0]["args"];
    assert!(args.as_array().unwrap().contains(&json!(format!("--busy-when-owner=agones.dev/v1/GameServer={rule}"))));

    let refused = |values: Value| {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), values.to_string()).unwrap();
        let output = chart(&["render", file.path().to_str().unwrap()]);
        assert!(!output.status.success() && output.stdout.is_empty(), "{values} rendered");
        String::from_utf8(output.stderr).unwrap()
    };
    let twice = refused(json!({"env": {"BUSYGUARD_LOG_FORMAT": "text"}}));
    assert!(
        twice.contains(
            "env.BUSYGUARD_LOG_FORMAT: the chart sets BUSYGUARD_LOG_FORMAT itself: set the value logFormat instead"
        ),
        "{twice}"
    );
    let second_rule =
        refused(json!({"agones": {"enabled": true}, "busyWhenOwner": [format!("agones.dev/v1/GameServer={rule}")]}));
    assert!(second_rule.contains("set agones.rule instead"), "{second_rule}");
    let mode = refused(json!({"mode": "dry-run"}));
    assert!(mode.contains("/mode") && mode.contains("'enforce', 'audit'"), "{mode}");
}

/// `helm test` runs `busyguard check` from the release's image in a namespace busyguard guards
/// (the first of `watchNamespaces`), under a service account that may only create pods there
/// and read busyguard's Deployment; `helm install` does not apply it.
#[test]
fn helm_test_runs_busyguard_check_with_rights_for_that_alone() {
    let values = json!({"watchNamespaces": ["arc-runners", "games"], "image": {"repository": "ghcr.io/o/busyguard", "tag": "1.2.3"}});
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), values.to_string()).unwrap();
    let output = chart(&["tests", file.path().to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let list: Value = serde_json::from_slice(&output.stdout).unwrap();
    let hooks = list["items"].as_array().unwrap();
    let pod = one(hooks, "Pod", "busyguard-test");
    let container = &pod["spec"]["containers"][0];
    assert_eq!(container["image"], "ghcr.io/o/busyguard:1.2.3");
    assert_eq!(container["args"], json!(["check", "--namespace", "arc-runners", "--timeout", "2m"]));
    assert_eq!(pod["spec"]["restartPolicy"], "Never");
    let probe = one(hooks, "Role", "busyguard-test");
    assert_eq!(
        (probe["metadata"]["namespace"].as_str(), &probe["rules"]),
        (Some("arc-runners"), &json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}]))
    );
    let rules = one(hooks, "Role", "busyguard-test-rules");
    assert_eq!(rules["rules"][0]["resourceNames"], json!(["busyguard"]));
    assert!(hooks.iter().all(|o| o["metadata"]["annotations"]["helm.sh/hook"] == "test"), "every object is the hook's");
    let installed = render_chart(values);
    assert!(
        installed.iter().all(|o| o["metadata"]["annotations"]["helm.sh/hook"].is_null()),
        "helm install applied a test hook"
    );
}

/// The busy rules the docs give as chart values (`busyWhenOwner`) pass the chart's schema: a
/// rule through a kind between (Spark, KubeRay) and a core-group kind as well as a group's; and
/// the one value that reaches CEL, `agones.namespace`, is a namespace's name or refused.
#[test]
fn the_busy_rules_the_docs_give_are_chart_values_and_agones_namespace_cannot_reach_into_cel() {
    let from_docs = |page: &str| -> Vec<String> {
        let text = std::fs::read_to_string(format!("{ROOT}/docs/{page}")).unwrap();
        let rules = text
            .lines()
            .filter_map(|l| l.split("--busy-when-owner=").nth(1))
            .map(|r| r.trim_end_matches('"').to_string());
        rules.collect()
    };
    let mut rules: Vec<String> = ["spark.md", "kuberay.md", "agones.md"].into_iter().flat_map(from_docs).collect();
    assert!(rules.len() >= 3, "the recipes' rules: {rules:?}");
    rules.push("v1/ConfigMap=true".into());
    let objects = render_chart(json!({"busyWhenOwner": rules}));
    let args = &one(&objects, "Deployment", "busyguard")["spec"]["template"]["spec"]["containers"][0]["args"];
    for rule in &rules {
        assert!(args.as_array().unwrap().contains(&json!(format!("--busy-when-owner={rule}"))), "{rule}");
    }
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), json!({"agones": {"enabled": true, "namespace": "x' || true || '"}}).to_string())
        .unwrap();
    let output = chart(&["render", file.path().to_str().unwrap()]);
    assert!(!output.status.success(), "a namespace that breaks out of its CEL string rendered");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("/agones/namespace"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The vendor keys docs/autoscalers.md gives as chart values reach busyguard as the flags it
/// parses; a label value no label may carry is refused by the chart.
#[test]
fn the_vendor_keys_the_docs_give_are_chart_values_busyguard_takes() {
    let values = json!({"busyAnnotations": {"autoscaling.cast.ai/removal-disabled": "true"},
        "busyLabels": {"spotinst.io/restrict-scale-down": "true"}});
    let objects = render_chart(values);
    let args = &one(&objects, "Deployment", "busyguard")["spec"]["template"]["spec"]["containers"][0]["args"];
    let args: Vec<&str> = args.as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    for flag in [
        "--busy-annotation=autoscaling.cast.ai/removal-disabled=true",
        "--busy-label=spotinst.io/restrict-scale-down=true",
    ] {
        assert!(args.contains(&flag), "{flag} not in {args:?}");
    }
    let cli = busyguard::cli::Cli::try_parse_from(std::iter::once("busyguard").chain(args.iter().copied())).unwrap();
    let busyguard::cli::Command::Serve(serve) = cli.command else { unreachable!() };
    let marks = serve.into_config().policy.mutation.marks;
    let keys: Vec<&str> = marks.iter().map(|m| m.key).collect();
    assert_eq!(keys, ["autoscaling.cast.ai/removal-disabled", "spotinst.io/restrict-scale-down"]);
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), json!({"busyLabels": {"spotinst.io/restrict-scale-down": "not ok"}}).to_string())
        .unwrap();
    let output = chart(&["render", file.path().to_str().unwrap()]);
    assert!(!output.status.success() && output.stdout.is_empty(), "a label value with a space rendered");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("/busyLabels/spotinst.io~1restrict-scale-down"), "{said}");
}

/// A release's chart, as the release workflow stamps it (`chart.py stamp`): its image the
/// published one at its appVersion, its home and sources the repository, and Artifact Hub's
/// annotations with the changes of its version from the CHANGELOG; a `-dev` chart is refused.
#[test]
fn a_released_chart_pulls_the_published_image_and_says_what_changed() {
    let copy = tempfile::tempdir().unwrap();
    let chart = copy.path().join("busyguard");
    let copied = Command::new("cp").arg("-r").arg(format!("{ROOT}/charts/busyguard")).arg(&chart).status().unwrap();
    assert!(copied.success());
    let stamp = |chart_yaml: &str| {
        std::fs::write(chart.join("Chart.yaml"), chart_yaml).unwrap();
        let installed = run(Command::new("sh").arg(format!("{ROOT}/scripts/helm-python.sh")));
        let mut command = Command::new("python3");
        command.arg(format!("{ROOT}/scripts/chart.py")).args([
            "stamp",
            "https://github.com/o/busyguard",
            "ghcr.io/o/busyguard",
        ]);
        command.env("PYTHONPATH", String::from_utf8(installed.stdout).unwrap().trim()).env("BUSYGUARD_CHART", &chart);
        command.output().unwrap()
    };
    let original = std::fs::read_to_string(chart.join("Chart.yaml")).unwrap();
    let released = original.lines().filter(|l| !l.contains("ersion: ")).collect::<Vec<_>>().join("\n");
    let dev = stamp(&format!("{released}\nversion: 0.4.0-dev\nappVersion: 0.4.0-dev\n"));
    assert!(!dev.status.success(), "a -dev chart was stamped");
    assert!(String::from_utf8_lossy(&dev.stderr).contains("0.4.0-dev is not a release"));
    let stamped = stamp(&format!("{released}\nversion: 0.2.0\nappVersion: 0.2.0\n"));
    assert!(stamped.status.success(), "{}", String::from_utf8_lossy(&stamped.stderr));
    let meta: Value = serde_saphyr::from_str(&std::fs::read_to_string(chart.join("Chart.yaml")).unwrap()).unwrap();
    assert_eq!(meta["home"], "https://github.com/o/busyguard");
    let annotations = &meta["annotations"];
    let images: Value = serde_saphyr::from_str(annotations["artifacthub.io/images"].as_str().unwrap()).unwrap();
    assert_eq!(images, json!([{"name": "busyguard", "image": "ghcr.io/o/busyguard:0.2.0"}]));
    let changes: Value = serde_saphyr::from_str(annotations["artifacthub.io/changes"].as_str().unwrap()).unwrap();
    assert!(changes.as_array().is_some_and(|c| c.len() > 3), "0.2.0's changes: {changes}");
    let values = std::fs::read_to_string(chart.join("values.yaml")).unwrap();
    assert!(values.contains("\n  repository: ghcr.io/o/busyguard\n"), "the published image is the default");
    assert!(values.contains("# -- Where the image is pulled from."), "values.yaml's comments are kept");
}

/// The NetworkPolicy takes the API server's addresses as one CIDR or a list (EKS: its control
/// plane's subnets), each checked; one replica keeps a PDB that lets its node be drained.
#[test]
fn the_network_policy_takes_a_list_of_checked_cidrs_and_one_replica_can_be_drained() {
    let objects =
        render_chart(json!({"networkPolicy": {"enabled": true, "apiServerCIDR": ["10.0.0.0/24", "10.0.1.0/24"]},
        "replicas": 1}));
    let policy = one(&objects, "NetworkPolicy", "busyguard");
    assert_eq!(
        policy["spec"]["ingress"][0]["from"],
        json!([{"ipBlock": {"cidr": "10.0.0.0/24"}}, {"ipBlock": {"cidr": "10.0.1.0/24"}}])
    );
    let pdb = one(&objects, "PodDisruptionBudget", "busyguard");
    assert_eq!((&pdb["spec"]["maxUnavailable"], &pdb["spec"]["minAvailable"]), (&json!(1), &Value::Null));
    let file = tempfile::NamedTempFile::new().unwrap();
    for bad in [json!("10.0.0.0"), json!("10.0.0.0/24,10.0.1.0/24"), json!(["10.0.0.0"])] {
        std::fs::write(file.path(), json!({"networkPolicy": {"enabled": true, "apiServerCIDR": bad}}).to_string())
            .unwrap();
        let output = chart(&["render", file.path().to_str().unwrap()]);
        assert!(!output.status.success(), "{bad} rendered");
    }
}

/// Each webhook is written once: the chart reads the kustomize base's webhook file and each
/// component's own operations through links (which `helm package` copies in), and sets the
/// chart's choices on them; Agones' namespace reaches the condition that names its controller.
#[test]
fn the_charts_webhooks_are_the_bases_and_the_components_own_files() {
    for (link, source) in [
        ("webhooks.yaml", "manifests/base/webhooks.yaml"),
        (
            "actions-runner-controller/mutating-webhooks.yaml",
            "manifests/actions-runner-controller/mutating-webhooks.yaml",
        ),
        ("agones/mutating-webhooks.yaml", "manifests/agones/mutating-webhooks.yaml"),
        ("agones/validating-webhooks.yaml", "manifests/agones/validating-webhooks.yaml"),
        ("agent-sandbox/mutating-webhooks.yaml", "manifests/agent-sandbox/mutating-webhooks.yaml"),
        ("prometheusrule.yaml", "manifests/monitoring/prometheusrule.yaml"),
        ("dashboard.json", "manifests/monitoring/dashboard.json"),
    ] {
        let path = Path::new(ROOT).join("charts/busyguard/files").join(link);
        let linked = std::fs::canonicalize(&path).unwrap();
        assert!(std::fs::symlink_metadata(&path).unwrap().is_symlink(), "{link} is a copy, not a link");
        assert_eq!(linked, std::fs::canonicalize(Path::new(ROOT).join(source)).unwrap(), "{link}");
    }
    let objects = render_chart(json!({"agones": {"enabled": true, "namespace": "games-system"}}));
    let deletes = webhooks(&objects).into_iter().find(|w| w["name"] == "pod-deletes.busyguard.io").unwrap();
    let conditions = deletes["matchConditions"].to_string();
    assert!(conditions.contains("system:serviceaccount:games-system:agones-controller"), "{conditions}");
    assert!(!conditions.contains("agones-system"), "{conditions}");
}
