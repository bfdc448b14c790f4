//! The audit trail: one JSON line per denial, would-be denial, exemption used on a busy pod,
//! lapse of protection, scale-down plan, deferred delete carried out and busy pod lost. Each
//! line is written whole and flushed before the answer leaves, so lines never interleave and
//! none is lost when the process stops.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::sync::Mutex;

use jiff::Timestamp;
use prometheus_client::metrics::counter::Counter;
use serde::Serialize;
use tracing::warn;

use crate::policy::Mode;
use crate::policy::scale::ScalePlan;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditRecord {
    pub time: Timestamp,
    /// The AdmissionReview's uid; empty for what busyguard saw on the watch.
    pub uid: String,
    /// `denied`, `would-deny` (dry-run mode), `exempted`, `lapsed`, `scale-down`,
    /// `deleted-when-idle` or `lost`.
    pub decision: &'static str,
    /// Why, in one word: see README, "Audit lines".
    pub reason: &'static str,
    /// The same in words, with the names and times involved.
    pub detail: String,
    pub operation: &'static str,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    /// The pod's name, or the ReplicaSet's or Deployment's for a scale-down.
    pub name: String,
    pub user: String,
    pub groups: Vec<String>,
    pub busy_since: Option<Timestamp>,
    pub mode: Mode,
    /// The request was a dry run: the answer was given, nothing was changed.
    pub dry_run: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<ScalePlan>,
}

impl AuditRecord {
    /// A line with only the time and mode set, for the caller to fill in.
    pub fn new(time: Timestamp, mode: Mode) -> Self {
        AuditRecord {
            time,
            uid: String::new(),
            decision: "",
            reason: "",
            detail: String::new(),
            operation: "",
            resource: String::new(),
            subresource: String::new(),
            namespace: String::new(),
            name: String::new(),
            user: String::new(),
            groups: Vec::new(),
            busy_since: None,
            mode,
            dry_run: false,
            plan: None,
        }
    }
}

pub struct AuditLog {
    out: Mutex<Sink>,
    /// Counts lines that could not be written.
    write_errors: Counter,
}

enum Sink {
    Stdout,
    File(File),
}

impl AuditLog {
    pub fn stdout(write_errors: Counter) -> Self {
        AuditLog { out: Mutex::new(Sink::Stdout), write_errors }
    }

    /// Appends to `path`, creating it if needed.
    pub fn file(path: &Path, write_errors: Counter) -> io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(AuditLog { out: Mutex::new(Sink::File(file)), write_errors })
    }

    /// Writes the line; a line that cannot be written is logged and counted.
    pub fn record(&self, record: &AuditRecord) {
        if let Err(e) = self.write(record) {
            self.write_errors.inc();
            warn!(error = %e, decision = record.decision, "audit line could not be written");
        }
    }

    pub fn write(&self, record: &AuditRecord) -> io::Result<()> {
        let mut line = serde_json::to_vec(record)?;
        line.push(b'\n');
        // A poisoned lock only means another writer panicked mid-line; the sink is still usable.
        let mut sink = self.out.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match &mut *sink {
            Sink::Stdout => {
                let mut stdout = io::stdout().lock();
                stdout.write_all(&line)?;
                stdout.flush()
            }
            // One write of the whole line on an O_APPEND file: other writers cannot split it.
            Sink::File(file) => file.write_all(&line),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(uid: &str) -> AuditRecord {
        AuditRecord {
            time: "2026-11-21T20:00:00Z".parse().unwrap(),
            uid: uid.into(),
            decision: "denied",
            reason: "busy",
            detail: "pod capture/w is busy".into(),
            operation: "DELETE",
            resource: "pods".into(),
            subresource: String::new(),
            namespace: "capture".into(),
            name: "w".into(),
            user: "admin".into(),
            groups: vec!["system:masters".into()],
            busy_since: Some("2026-11-21T19:00:00Z".parse().unwrap()),
            mode: Mode::Enforce,
            dry_run: false,
            plan: None,
        }
    }

    #[test]
    fn concurrent_writers_append_whole_lines_to_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        std::fs::write(&path, "earlier line\n").unwrap();
        let log = AuditLog::file(&path, Counter::default()).unwrap();
        std::thread::scope(|scope| {
            for t in 0..8 {
                let log = &log;
                scope.spawn(move || {
                    for i in 0..50 {
                        log.write(&record(&format!("{t}-{i}"))).unwrap();
                    }
                });
            }
        });
        let text = std::fs::read_to_string(&path).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("earlier line"), "appends, never truncates");
        let uids: std::collections::BTreeSet<String> = lines
            .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap()["uid"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(uids.len(), 400);
    }

    #[test]
    fn a_line_has_every_field_an_auditor_needs() {
        let line = serde_json::to_value(record("u-1")).unwrap();
        assert_eq!(
            line,
            serde_json::json!({"time": "2026-11-21T20:00:00Z", "uid": "u-1", "decision": "denied",
                "reason": "busy", "detail": "pod capture/w is busy", "operation": "DELETE",
                "resource": "pods", "subresource": "", "namespace": "capture", "name": "w",
                "user": "admin", "groups": ["system:masters"], "busy_since": "2026-11-21T19:00:00Z",
                "mode": "enforce", "dry_run": false})
        );
    }
}
