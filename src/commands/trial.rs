//! `busyguard status --trial FILE`: what a trial in audit mode (`--mode audit`) saw, read from
//! busyguard's audit lines (`kubectl logs`, or the `--audit-log` file): per workload, how many
//! disruptions enforce mode would have refused, which busy pods they took, and how far into its
//! task each was, which is what enforce mode would have waited for at most.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use jiff::{SignedDuration, Timestamp};
use serde::Deserialize;

/// The fields of an audit line the summary reads.
#[derive(Deserialize)]
struct Line {
    time: Timestamp,
    decision: String,
    reason: String,
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: String,
    #[serde(default)]
    operation: String,
    namespace: String,
    name: String,
    #[serde(default)]
    user: String,
    #[serde(default)]
    busy_since: Option<Timestamp>,
    #[serde(default)]
    workload: Option<String>,
    #[serde(default)]
    dry_run: bool,
}

impl Line {
    /// A pod taken away (a delete or an eviction, not a dry run) that enforce mode would have kept.
    fn took_a_busy_pod(&self) -> bool {
        let taking = (self.resource == "pods" && self.subresource.is_empty() && self.operation == "DELETE")
            || self.subresource == "eviction";
        self.decision == "would-deny" && taking && !self.dry_run
    }
}

/// One workload's trial.
#[derive(Default)]
struct Workload {
    would_wait: usize,
    lost: BTreeSet<String>,
    /// How far into its task each lost pod was: what enforce mode would have waited for at most.
    into_task: Vec<SignedDuration>,
    requesters: BTreeSet<String>,
}

/// The summary of the audit lines in `text`; lines that are not audit lines (other log lines)
/// are skipped, and so counted.
pub fn summarise(text: &str) -> String {
    let (mut workloads, mut other) = (BTreeMap::<String, Workload>::new(), BTreeMap::<String, usize>::new());
    let (mut read, mut skipped, mut first, mut last) = (0, 0, None::<Timestamp>, None::<Timestamp>);
    for raw in text.lines().filter(|line| !line.trim().is_empty()) {
        let Ok(line) = serde_json::from_str::<Line>(raw) else {
            skipped += 1;
            continue;
        };
        read += 1;
        first = Some(first.map_or(line.time, |t| t.min(line.time)));
        last = Some(last.map_or(line.time, |t| t.max(line.time)));
        if line.decision != "would-deny" {
            continue;
        }
        if !line.took_a_busy_pod() {
            *other.entry(format!("{} ({})", resource(&line), line.reason)).or_default() += 1;
            continue;
        }
        let name = line.workload.clone().unwrap_or_else(|| format!("Pod/{}", line.name));
        let workload = workloads.entry(format!("{}/{name}", line.namespace)).or_default();
        workload.would_wait += 1;
        workload.requesters.insert(line.user.clone());
        if workload.lost.insert(line.name.clone())
            && let Some(since) = line.busy_since
        {
            workload.into_task.push(line.time.duration_since(since));
        }
    }
    let mut out = String::new();
    let (Some(first), Some(last)) = (first, last) else {
        let _ =
            writeln!(out, "No audit lines read ({skipped} other lines): pass busyguard's logs or --audit-log file.");
        return out;
    };
    let _ = writeln!(out, "The trial: {read} audit lines from {first} to {last} ({skipped} other lines skipped)");
    if workloads.is_empty() {
        let _ = writeln!(out, "\nNo busy pod was taken: enforce mode would have refused no delete or eviction.");
    } else {
        let _ = writeln!(out, "\nBusy pods taken that enforce mode would have kept until idle, per workload:");
        for (name, workload) in &workloads {
            let longest = workload.into_task.iter().max().map(|d| SignedDuration::from_secs(d.as_secs()));
            let longest = longest.map_or_else(|| "unknown".into(), |d| format!("{d:#}"));
            let _ = writeln!(
                out,
                "  {name}: {} busy pods lost, {} disruptions would have waited; the longest task taken had run {longest}; \
                 asked by {}",
                workload.lost.len(),
                workload.would_wait,
                workload.requesters.iter().cloned().collect::<Vec<_>>().join(", "),
            );
        }
    }
    if !other.is_empty() {
        let _ = writeln!(out, "\nOther requests enforce mode would have refused:");
        for (what, count) in &other {
            let _ = writeln!(out, "  {what}: {count}");
        }
    }
    out
}

fn resource(line: &Line) -> String {
    match line.subresource.as_str() {
        "" => format!("{} {}", line.operation, line.resource),
        sub => format!("{} {}/{sub}", line.operation, line.resource),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(time: &str, decision: &str, subresource: &str, operation: &str, name: &str) -> String {
        serde_json::json!({
            "time": time, "decision": decision, "reason": "busy", "resource": "pods", "subresource": subresource,
            "operation": operation, "namespace": "ci", "name": name, "user": "system:serviceaccount:karpenter:karpenter",
            "busy_since": "2026-12-01T10:00:00Z", "workload": "AutoscalingRunnerSet/linux", "mode": "audit",
            "dry_run": false,
        })
        .to_string()
    }

    #[test]
    fn a_trial_names_each_workloads_busy_pods_lost_and_how_far_into_their_tasks() {
        let log = [
            line("2026-12-01T10:30:00Z", "would-deny", "eviction", "CREATE", "runner-a"),
            line("2026-12-01T11:00:00Z", "would-deny", "", "DELETE", "runner-b"),
            line("2026-12-01T11:05:00Z", "would-patch", "", "UPDATE", "runner-c"),
            r#"{"level":"INFO","message":"not an audit line"}"#.into(),
            line("2026-12-01T11:10:00Z", "would-deny", "", "UPDATE", "runner-c"),
        ]
        .join("\n");
        let summary = summarise(&log);
        assert!(
            summary.starts_with("The trial: 4 audit lines from 2026-12-01T10:30:00Z to 2026-12-01T11:10:00Z"),
            "{summary}"
        );
        assert!(
            summary.contains(
                "ci/AutoscalingRunnerSet/linux: 2 busy pods lost, 2 disruptions would have waited; the longest task \
                 taken had run 1h; asked by system:serviceaccount:karpenter:karpenter"
            ),
            "{summary}"
        );
        assert!(
            summary.contains("Other requests enforce mode would have refused:\n  UPDATE pods (busy): 1"),
            "{summary}"
        );
    }

    #[test]
    fn a_log_without_audit_lines_says_so() {
        assert_eq!(
            summarise("plain text\n"),
            "No audit lines read (1 other lines): pass busyguard's logs or --audit-log file.\n"
        );
        assert!(
            summarise(&line("2026-12-01T10:30:00Z", "allowed", "", "DELETE", "w")).contains("No busy pod was taken")
        );
    }
}
