//! The alerts and the dashboard of `manifests/monitoring` ask only for what busyguard exports:
//! every metric an expression names exists, with every label it selects or groups by.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use busyguard::metrics::{
    CauseLabels, Metrics, OwnerRuleLabels, ResultLabels, ReviewLabels, SideEffectLabels, StatusLabels, WebhookLabels,
    WorkloadLabels, WorkloadOnlyLabels,
};
use serde_json::Value;

use crate::kustomize::kustomize;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Every series busyguard exports, by name, with its label names: each labelled family given
/// one series, so that its labels show.
fn exported() -> BTreeMap<String, BTreeSet<String>> {
    let metrics = Metrics::default();
    let review = ReviewLabels { webhook: "validating", resource: "pods", operation: "DELETE", result: "denied" };
    metrics.reviews.get_or_create(&review).inc();
    metrics
        .review_seconds
        .get_or_create(&WebhookLabels { webhook: "validating", resource: "pods/eviction" })
        .observe(0.001);
    metrics.http_errors.get_or_create(&StatusLabels { status: 413 }).inc();
    metrics.tls_reloads.get_or_create(&ResultLabels { result: "ok" }).inc();
    metrics.side_effects.get_or_create(&SideEffectLabels { kind: "event", result: "ok" }).inc();
    metrics.busy_pods_lost.get_or_create(&CauseLabels { cause: "vanished" }).inc();
    let workload = |state| WorkloadLabels { namespace: "jobs".into(), workload: "Deployment/w".into(), state };
    metrics.workload_pods.get_or_create(&workload("busy")).set(1);
    let only = WorkloadOnlyLabels { namespace: "jobs".into(), workload: "Deployment/w".into() };
    metrics.workload_deferred_deletes.get_or_create(&only).set(1);
    metrics.workload_retired_keys.get_or_create(&only).set(1);
    let rule = OwnerRuleLabels { rule: "agones.dev/v1/GameServer".into() };
    metrics.owner_rule_followed.get_or_create(&rule).set(1);
    metrics.owner_rule_ended_idle.get_or_create(&rule).set(0);
    metrics.owner_rule_undecided.get_or_create(&rule).inc();
    let mut series: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in metrics.encode().lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let name = line.split(['{', ' ']).next().unwrap().to_string();
        let labels = line.split_once('{').map(|(_, rest)| rest.split('}').next().unwrap()).unwrap_or_default();
        let names = labels.split(',').filter_map(|pair| pair.split_once('=')).map(|(k, _)| k.to_string());
        series.entry(name).or_default().extend(names);
    }
    series
}

/// The monitoring component's objects, as rendered for an install.
fn rendered() -> Vec<Value> {
    kustomize(&Path::new(ROOT).join("manifests/examples/with-monitoring")).unwrap()
}

/// Every PromQL expression of the rules and the dashboard, as rendered from the component.
fn expressions() -> Vec<String> {
    let objects = rendered();
    let find = |kind: &str| objects.iter().find(|o| o["kind"] == kind).unwrap_or_else(|| panic!("no {kind}"));
    let mut exprs = Vec::new();
    for group in find("PrometheusRule")["spec"]["groups"].as_array().unwrap() {
        exprs.extend(group["rules"].as_array().unwrap().iter().map(|r| r["expr"].as_str().unwrap().to_string()));
    }
    let dashboard: Value = serde_json::from_str(find("ConfigMap")["data"]["busyguard.json"].as_str().unwrap()).unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        exprs.extend(panel["targets"].as_array().unwrap().iter().map(|t| t["expr"].as_str().unwrap().to_string()));
    }
    exprs
}

/// The metric names an expression reads (`busyguard_…`), each with the labels its selector
/// names (`{state="busy"}`).
fn selectors(expr: &str) -> Vec<(String, Vec<String>)> {
    let mut found = Vec::new();
    for (at, _) in expr.match_indices("busyguard_") {
        let rest = &expr[at..];
        let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        let matchers = rest[name.len()..].strip_prefix('{').map(|m| m.split('}').next().unwrap()).unwrap_or_default();
        let labels = matchers.split(',').filter_map(|m| m.split(['=', '!', '~']).next()).map(|l| l.trim().to_string());
        found.push((name, labels.filter(|l| !l.is_empty()).collect()));
    }
    found
}

/// The labels Prometheus puts on every scraped series (its job), and a global view's (Thanos,
/// federation) the cluster it came from: the dashboard and `absent()` select by them.
const SCRAPE_LABELS: [&str; 2] = ["job", "cluster"];

/// The labels an expression groups by (`by (namespace, workload)`).
fn grouped_by(expr: &str) -> Vec<String> {
    expr.match_indices("by (")
        .flat_map(|(at, _)| expr[at + 4..].split(')').next().unwrap().split(','))
        .map(|l| l.trim().to_string())
        .collect()
}

#[test]
fn every_alert_and_panel_reads_a_metric_busyguard_exports_by_labels_it_has() {
    let exported = exported();
    let exprs = expressions();
    assert!(exprs.len() >= 10, "the rules and the dashboard have expressions: {}", exprs.len());
    for expr in &exprs {
        let read = selectors(expr);
        // Only the API server can tell that it cannot reach busyguard.
        let of_the_api_server = expr.contains("apiserver_admission_webhook_");
        assert!(!read.is_empty() || of_the_api_server, "{expr} reads no busyguard metric");
        let mut available: BTreeSet<String> = BTreeSet::new();
        for (name, labels) in read {
            let has = exported.get(&name).unwrap_or_else(|| panic!("{expr}: busyguard exports no {name}"));
            for label in labels.into_iter().filter(|l| !SCRAPE_LABELS.contains(&l.as_str())) {
                assert!(has.contains(&label), "{expr}: {name} has no label {label} (it has {has:?})");
            }
            available.extend(has.iter().cloned());
        }
        for label in grouped_by(expr).into_iter().filter(|_| !of_the_api_server) {
            assert!(available.contains(&label), "{expr}: grouped by {label}, which no metric it reads has");
        }
    }
}

#[test]
fn a_metric_or_label_busyguard_does_not_export_is_caught() {
    let exported = exported();
    assert!(exported["busyguard_admission_review_duration_seconds_bucket"].contains("le"));
    assert!(!exported.contains_key("busyguard_busy_pods_lost"), "counters are exported with _total");
    assert_eq!(selectors(r#"max(busyguard_workload_pods{state="busy",node="a"})"#)[0].1, ["state", "node"]);
    assert!(!exported["busyguard_workload_pods"].contains("node"));
    assert_eq!(grouped_by("sum by (namespace, workload) (x)"), ["namespace", "workload"]);
}

#[test]
fn every_replica_says_its_version_and_commit() {
    let encoded = Metrics::default().encode();
    let expected =
        format!("busyguard_build_info{{version=\"{}\",commit=\"{}\"}} 1", busyguard::VERSION, busyguard::COMMIT);
    assert!(encoded.lines().any(|l| l == expected), "{expected} not in:\n{encoded}");
}

/// The alerts an operator needs first, by what they watch: every one with a runbook in
/// docs/troubleshooting.md, under the heading its link names.
#[test]
fn the_first_alerts_are_there_each_with_its_runbook() {
    let rules = std::fs::read_to_string(Path::new(ROOT).join("manifests/monitoring/prometheusrule.yaml")).unwrap();
    let rules: Value = serde_saphyr::from_str(&rules).unwrap();
    let rules = rules["spec"]["groups"][0]["rules"].as_array().unwrap();
    let runbooks = std::fs::read_to_string(Path::new(ROOT).join("docs/troubleshooting.md")).unwrap();
    let expr_of = |alert: &str| {
        let rule = rules.iter().find(|r| r["alert"] == alert).unwrap_or_else(|| panic!("no alert {alert}"));
        rule["expr"].as_str().unwrap().to_string()
    };
    // prometheus-operator names a PodMonitor's job NAMESPACE/NAME.
    let monitor = std::fs::read_to_string(Path::new(ROOT).join("manifests/monitoring/podmonitor.yaml")).unwrap();
    let monitor: Value = serde_saphyr::from_str(&monitor).unwrap();
    let job = format!(
        "{}/{}",
        monitor["metadata"]["namespace"].as_str().unwrap(),
        monitor["metadata"]["name"].as_str().unwrap()
    );
    assert_eq!(
        expr_of("BusyguardDown"),
        format!("absent(busyguard_build_info{{job=\"{job}\"}})"),
        "fires when every replica its PodMonitor scrapes is gone"
    );
    for (alert, reads) in [
        ("BusyguardCertificateExpiresSoon", "busyguard_tls_certificate_expiry_timestamp_seconds"),
        ("BusyguardAuditLinesDropped", "busyguard_audit_lines_dropped_total"),
        ("BusyguardSideEffectsFailing", "busyguard_side_effects_total"),
        ("BusyguardTlsReloadFailed", "busyguard_tls_reloads_total"),
        ("BusyguardBusyPdbConflicts", "busyguard_busy_pdb_conflicts"),
    ] {
        assert!(expr_of(alert).contains(reads), "{alert} reads {reads}");
    }
    for rule in rules {
        let alert = rule["alert"].as_str().unwrap();
        let url = rule["annotations"]["runbook_url"].as_str().unwrap_or_else(|| panic!("{alert} has no runbook"));
        let anchor = url.strip_prefix("docs/troubleshooting.md#").unwrap_or_else(|| panic!("{alert}: {url}"));
        assert_eq!(anchor, alert.to_lowercase(), "{alert}");
        assert!(runbooks.lines().any(|l| l == format!("### {alert}")), "no runbook heading for {alert}");
    }
}

/// Every alert played by promtool (tests/monitoring/alerts.test.yaml) on series as busyguard
/// exports them, born at 0: each fires on its first event, and stays silent without one.
#[test]
fn every_alert_fires_on_its_first_event_and_stays_silent_without_one() {
    let objects = rendered();
    let rule = objects.iter().find(|o| o["kind"] == "PrometheusRule").expect("the PrometheusRule");
    let mut groups = rule["spec"]["groups"].clone();
    let rules = groups[0]["rules"].as_array_mut().unwrap();
    // promtool compares annotations too: the cases say when each alert fires, with which labels.
    for rule in rules.iter_mut() {
        rule.as_object_mut().unwrap().remove("annotations");
    }
    let alerts: BTreeSet<String> = rules.iter().map(|r| r["alert"].as_str().unwrap().to_string()).collect();

    let cases_path = Path::new(ROOT).join("tests/monitoring/alerts.test.yaml");
    let cases: Value = serde_saphyr::from_str(&std::fs::read_to_string(&cases_path).unwrap()).unwrap();
    let (mut firing, mut silent) = (BTreeSet::new(), BTreeSet::new());
    for test in cases["tests"].as_array().unwrap() {
        for case in test["alert_rule_test"].as_array().unwrap() {
            let fires = case["exp_alerts"].as_array().is_some_and(|a| !a.is_empty());
            if fires { &mut firing } else { &mut silent }.insert(case["alertname"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(firing, alerts, "an alert without a case where it fires, or a case of no alert");
    assert_eq!(silent, alerts, "an alert without a case where it stays silent");

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rules.yaml"), serde_json::json!({"groups": groups}).to_string()).unwrap();
    std::fs::copy(&cases_path, dir.path().join("alerts.test.yaml")).unwrap();
    let (code, said) = promtool(&["test", "rules", "alerts.test.yaml"], dir.path(), None);
    assert_eq!(code, Some(0), "promtool test rules:\n{said}");
}

/// `promtool ARGS` in `dir`, `stdin` fed to it: its exit code, and what it said.
fn promtool(args: &[&str], dir: &Path, stdin: Option<&str>) -> (Option<i32>, String) {
    use std::io::Write;
    let fetched = Path::new(ROOT).join("target/tools/promtool");
    let promtool = std::env::var("PROMTOOL").ok().or_else(|| fetched.exists().then(|| fetched.display().to_string()));
    let promtool = promtool.unwrap_or_else(|| "promtool".into());
    let child = Command::new(&promtool)
        .args(args)
        .current_dir(dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child =
        child.unwrap_or_else(|e| panic!("{promtool}: {e} (`make unit` fetches it: tests/monitoring/promtool.sh)"));
    child.stdin.take().unwrap().write_all(stdin.unwrap_or_default().as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.code(), said)
}

/// Scrapers that read only Prometheus' older text format (0.0.4) parse the page too: promtool's
/// parser, which is that format's, reads it whole. It exits 1 when it cannot parse, 3 when it
/// only has lint to say (the counters' help stands under their OpenMetrics names), 0 when clean.
#[test]
fn metrics_parse_in_the_older_text_format_too() {
    let encoded = Metrics::default().encode();
    let (code, said) = promtool(&["check", "metrics"], Path::new(ROOT), Some(&encoded));
    assert!(matches!(code, Some(0 | 3)), "promtool check metrics ({code:?}):\n{said}");
}

/// `kubectl kustomize` of an overlay of this repository's `resources` and `components` (under
/// manifests/) and `extra` lines, written in a directory of its own under target/.
fn render_overlay(resources: &[&str], components: &[&str], extra: &str) -> Vec<Value> {
    let target = Path::new(ROOT).join("target");
    std::fs::create_dir_all(&target).unwrap();
    let dir = tempfile::tempdir_in(&target).unwrap();
    let listed = |paths: &[&str]| paths.iter().map(|p| format!("  - ../../manifests/{p}\n")).collect::<String>();
    let kustomization = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n{}components:\n{}{extra}",
        listed(resources),
        listed(components)
    );
    std::fs::write(dir.path().join("kustomization.yaml"), kustomization).unwrap();
    kustomize(dir.path()).unwrap()
}

#[test]
fn runbook_links_open_where_the_overlay_says_the_docs_are_served() {
    let base = "https://git.example.com/platform/busyguard/-/blob/v0.3.0/";
    let runbooks = format!(
        "configMapGenerator:\n  - name: busyguard-runbooks\n    literals: [base={base}]\n    options:\n      \
         disableNameSuffixHash: true\n      annotations: {{config.kubernetes.io/local-config: \"true\"}}\n"
    );
    let objects = render_overlay(&["cert-manager"], &["monitoring", "runbook-links"], &runbooks);
    assert!(!objects.iter().any(|o| o["metadata"]["name"] == "busyguard-runbooks"), "the ConfigMap is not applied");
    let rule = objects.iter().find(|o| o["kind"] == "PrometheusRule").unwrap();
    let rules = rule["spec"]["groups"][0]["rules"].as_array().unwrap();
    for rule in rules {
        let alert = rule["alert"].as_str().unwrap();
        let url = rule["annotations"]["runbook_url"].as_str().unwrap();
        assert_eq!(url, format!("{base}docs/troubleshooting.md#{}", alert.to_lowercase()), "{alert}");
    }
}
