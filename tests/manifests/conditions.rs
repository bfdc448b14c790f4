//! The CEL of `manifests/base/webhooks.yaml` is `src/policy/registrations.rs`'s own: the
//! table there says, webhook by webhook, each matchCondition the file ships. `make manifests`
//! writes them into the file (`BUSYGUARD_WRITE_MANIFESTS=1`); otherwise this test fails while
//! the two differ. The chart renders the same file, so a change to a condition is one edit.

use std::path::Path;

use serde_json::Value;

use busyguard::cli::{Cli, Command as BusyguardCommand};
use busyguard::policy::registrations;
use clap::Parser;

use crate::ROOT;

const FILE: &str = "manifests/base/webhooks.yaml";

/// Each webhook's matchConditions in `text`, as (webhook, condition, expression), in order.
fn conditions_in(text: &str) -> Vec<(String, String, String)> {
    let configurations: Vec<Value> = serde_saphyr::from_multiple(text).expect(FILE);
    let webhooks = configurations.iter().flat_map(|c| c["webhooks"].as_array().unwrap());
    let each = |webhook: &Value| {
        let name = webhook["name"].as_str().unwrap().to_string();
        let conditions = webhook["matchConditions"].as_array().cloned().unwrap_or_default();
        conditions.into_iter().map(move |c| {
            (name.clone(), c["name"].as_str().unwrap().to_string(), c["expression"].as_str().unwrap().to_string())
        })
    };
    webhooks.flat_map(each).collect()
}

/// `text` with the expression of `webhook`'s condition `condition` written as `expression`,
/// one double-quoted line; `None` if the file has no such condition to write into.
fn written(text: &str, webhook: &str, condition: &str, expression: &str) -> Option<String> {
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    let start = lines.iter().position(|l| l.trim() == format!("- name: {webhook}"))?;
    let webhook_ends = |l: &String| l.starts_with("  - name:") || l.starts_with("---");
    let end = lines[start + 1..].iter().position(webhook_ends).map_or(lines.len(), |i| start + 1 + i);
    let at = (start..end).find(|&i| lines[i].trim() == format!("- name: {condition}"))?;
    let line = lines.get_mut(at + 1).filter(|l| l.trim_start().starts_with("expression:"))?;
    let indent = &line[..line.len() - line.trim_start().len()];
    *line = format!("{indent}expression: {}", serde_json::to_string(expression).unwrap());
    Some(lines.join("\n") + "\n")
}

#[test]
fn the_base_webhooks_ship_the_match_conditions_of_registrations_rs() {
    let serve = Cli::parse_from(["busyguard", "serve"]);
    let BusyguardCommand::Serve(serve) = serve.command else { unreachable!() };
    let registered = registrations::match_conditions(&serve.into_config().policy.exemptions.karpenter);
    let path = Path::new(ROOT).join(FILE);
    let mut text = std::fs::read_to_string(&path).expect(FILE);
    if std::env::var_os("BUSYGUARD_WRITE_MANIFESTS").is_some() {
        for (webhook, condition, expression) in &registered {
            text = written(&text, webhook, condition, expression).unwrap_or_else(|| {
                panic!("{FILE}: {webhook} has no condition {condition} to write; add it by hand, then `make manifests`")
            });
        }
        std::fs::write(&path, &text).expect(FILE);
    }
    let shipped = conditions_in(&text);
    let registered: Vec<(String, String, String)> =
        registered.into_iter().map(|(w, c, e)| (w.to_string(), c.to_string(), e)).collect();
    for (shipped, registered) in shipped.iter().zip(&registered) {
        assert_eq!(shipped, registered, "{FILE} differs from src/policy/registrations.rs: run `make manifests`");
    }
    assert_eq!(shipped.len(), registered.len(), "{FILE}: as many conditions as registrations.rs has");
}

#[test]
fn make_manifests_writes_a_condition_in_place_and_nothing_else() {
    let text = std::fs::read_to_string(Path::new(ROOT).join(FILE)).expect(FILE);
    let changed = written(&text, "scale-downs.busyguard.io", "lowers-replicas", "object.spec.replicas == 0").unwrap();
    let (before, after) = (conditions_in(&text), conditions_in(&changed));
    let differ: Vec<_> = before.iter().zip(&after).filter(|(b, a)| b != a).map(|(_, a)| a).collect();
    let expected = ("scale-downs.busyguard.io".into(), "lowers-replicas".into(), "object.spec.replicas == 0".into());
    assert_eq!(differ, [&expected]);
    assert_eq!(changed.lines().count(), text.lines().count(), "the comments stay");
    assert!(written(&text, "scale-downs.busyguard.io", "not-a-condition", "true").is_none());
    assert!(written(&text, "no-such.busyguard.io", "lowers-replicas", "true").is_none());
}
