//! The audit sink (the lines themselves are `policy::outcome::AuditRecord`): one JSON line per denial, would-be denial, exemption used on a busy pod,
//! lapse of protection, scale-down plan, deferred delete carried out and busy pod lost. Each
//! line is written whole before the answer leaves, so lines never interleave and none is lost
//! when the process stops. A line the disk refuses (full, read-only) is held in memory and
//! written later, in order; until then busyguard is unready, says why and counts it.

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::Path;
use std::sync::Mutex;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tracing::{error, info};

use crate::policy::outcome::AuditRecord;

/// Lines kept in memory while the sink refuses them: about 5 MiB of typical lines.
const MAX_HELD_LINES: usize = 10_000;

pub struct AuditLog {
    state: Mutex<State>,
    metrics: AuditMetrics,
}

/// What the audit log reports: failed writes, lines waiting in memory, lines given up.
#[derive(Clone, Default)]
pub struct AuditMetrics {
    pub write_errors: Counter,
    pub held: Gauge,
    pub dropped: Counter,
}

struct State {
    sink: Box<dyn Write + Send>,
    /// Lines not yet (wholly) written, oldest first; `written` bytes of the first are out.
    held: VecDeque<Vec<u8>>,
    written: usize,
    /// Why the last write failed, while lines are held.
    failing: Option<String>,
}

impl AuditLog {
    pub fn stdout(metrics: AuditMetrics) -> Self {
        Self::to(Box::new(io::stdout()), metrics)
    }

    /// Appends to `path`, creating it if needed.
    pub fn file(path: &Path, metrics: AuditMetrics) -> io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Self::to(Box::new(file), metrics))
    }

    pub fn to(sink: Box<dyn Write + Send>, metrics: AuditMetrics) -> Self {
        let state = State { sink, held: VecDeque::new(), written: 0, failing: None };
        AuditLog { state: Mutex::new(state), metrics }
    }

    /// Writes the line after any held ones. A line the sink refuses is held and written with the
    /// next line or readiness check that gets through; `health` reports the failure meanwhile.
    pub fn record(&self, record: &AuditRecord) {
        // Room for a typical line at once, rather than growing it three times on the way.
        let mut line = Vec::with_capacity(1024);
        if let Err(e) = serde_json::to_writer(&mut line, record) {
            // Plain strings and timestamps: cannot happen, but an audit line is never skipped quietly.
            self.metrics.dropped.inc();
            return error!(error = %e, uid = %record.uid, "audit line could not be encoded");
        }
        line.push(b'\n');
        // A poisoned lock only means another writer panicked mid-line; the state is still whole.
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if state.held.len() < MAX_HELD_LINES {
            state.held.push_back(line);
        } else {
            self.metrics.dropped.inc();
            error!(decision = record.decision.as_str(), uid = %record.uid, "audit line dropped: {MAX_HELD_LINES} lines already wait to be written");
        }
        self.write_held(&mut state);
    }

    /// Ok while every line is written; otherwise why not, after one more try.
    pub fn health(&self) -> Result<(), String> {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        self.write_held(&mut state);
        match &state.failing {
            None => Ok(()),
            Some(why) => {
                Err(format!("the audit log cannot be written ({why}); {} lines wait in memory", state.held.len()))
            }
        }
    }

    fn write_held(&self, state: &mut State) {
        let result = state.drain();
        self.metrics.held.set(state.held.len() as i64);
        match (result, state.failing.is_some()) {
            (Ok(()), true) => {
                state.failing = None;
                info!("audit log writable again; every held line written");
            }
            (Ok(()), false) => {}
            (Err(e), was_failing) => {
                self.metrics.write_errors.inc();
                if !was_failing {
                    error!(error = %e, "audit log cannot be written: lines are held in memory and busyguard reports unready until they are written");
                }
                state.failing = Some(e.to_string());
            }
        }
    }
}

impl State {
    /// Writes the held lines in order; after an error the rest of a partly written line comes
    /// first next time, so a line is never split by another or written twice.
    fn drain(&mut self) -> io::Result<()> {
        while let Some(line) = self.held.front() {
            match self.sink.write(&line[self.written..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.written += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
            if self.written == line.len() {
                self.held.pop_front();
                self.written = 0;
            }
        }
        self.sink.flush()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::policy::Mode;
    use crate::policy::outcome::{Decision, Reason};

    fn record(uid: &str) -> AuditRecord {
        AuditRecord {
            time: "2026-11-21T20:00:00Z".parse().unwrap(),
            uid: uid.into(),
            decision: Decision::Denied,
            reason: Reason::Busy,
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
        let log = AuditLog::file(&path, AuditMetrics::default()).unwrap();
        std::thread::scope(|scope| {
            for t in 0..8 {
                let log = &log;
                scope.spawn(move || {
                    for i in 0..50 {
                        log.record(&record(&format!("{t}-{i}")));
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

    /// A disk that fills up after `room` bytes, taking part of the line that does not fit, until
    /// `free` is set.
    struct FillingDisk {
        written: Arc<Mutex<Vec<u8>>>,
        room: usize,
        free: Arc<AtomicBool>,
    }

    impl Write for FillingDisk {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            let mut written = self.written.lock().unwrap();
            let room = if self.free.load(Ordering::SeqCst) { bytes.len() } else { self.room - written.len() };
            if room == 0 {
                return Err(io::Error::from_raw_os_error(28)); // ENOSPC
            }
            let n = room.min(bytes.len());
            written.extend_from_slice(&bytes[..n]);
            Ok(n)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_refused_by_a_full_disk_are_held_reported_and_written_whole_once_it_has_room() {
        let written = Arc::new(Mutex::new(Vec::new()));
        let free = Arc::new(AtomicBool::new(false));
        let one_line = serde_json::to_vec(&record("u-0")).unwrap().len() + 1;
        let disk = FillingDisk { written: written.clone(), room: one_line + 10, free: free.clone() };
        let metrics = AuditMetrics::default();
        let log = AuditLog::to(Box::new(disk), metrics.clone());

        for i in 0..4 {
            log.record(&record(&format!("u-{i}")));
        }
        let why = log.health().unwrap_err();
        assert!(why.starts_with("the audit log cannot be written (No space left on device"), "{why}");
        assert!(why.ends_with("; 3 lines wait in memory"), "{why}");
        assert_eq!(metrics.held.get(), 3);
        // The second line half written then refused, the third, the fourth, the health check.
        assert_eq!(metrics.write_errors.get(), 4, "each refused attempt counted");

        free.store(true, Ordering::SeqCst);
        assert_eq!(log.health(), Ok(()));
        assert_eq!(metrics.held.get(), 0);
        let text = String::from_utf8(written.lock().unwrap().clone()).unwrap();
        let uids: Vec<String> = text
            .lines()
            .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap()["uid"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(uids, ["u-0", "u-1", "u-2", "u-3"], "in order, whole, once each");
        assert_eq!(metrics.dropped.get(), 0);
    }
}
