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
        components: [../../opt-in, ../../actions-runner-controller, ../../agones, ../../monitoring, ../../runbook-links]\n\
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
