//! The audit sink (the lines themselves are `policy::outcome::AuditRecord`): one JSON line per denial, would-be denial, exemption used on a busy pod,
//! lapse of protection, scale-down plan, deferred delete carried out and busy pod lost.
//!
//! Off the request path: an answer only appends its line to a buffer (a short lock, no I/O,
//! no system call); a writer thread of its own wakes once per batch, lets lines gather for
//! [`GATHER`], takes the buffer whole and writes it, so lines never interleave, a busy webhook
//! makes a few writes a second instead of one a line, and a slow or full disk never slows an
//! answer. A batch the sink refuses (full, read-only) stays held, in order, and is tried again
//! every [`RETRY_AFTER`]; meanwhile `health` says why and the metrics count it. At most
//! [`MAX_HELD_LINES`] wait: beyond, a line is dropped and counted. Shutdown flushes what waits
//! (`flush`), and so does dropping the log.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tracing::{error, info};

use crate::json;
use crate::policy::Operation;
use crate::policy::outcome::{AuditRecord, ScalePlan};

/// Lines waiting (queued, or held while the sink refuses them): about 5 MiB of typical lines.
const MAX_HELD_LINES: usize = 10_000;
/// How long the writer waits before it tries a refusing sink again.
const RETRY_AFTER: Duration = Duration::from_millis(250);
/// How long the writer lets lines gather once the first of a batch is queued: waking a thread
/// for each line cost a busy webhook a context switch per denial (BENCHMARKS.md).
const GATHER: Duration = Duration::from_millis(10);

/// Why the audit log cannot be written: `/status` and the `busyguard_audit_failing` gauge say it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AuditFailing(pub String);

pub struct AuditLog {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
}

/// What the audit log reports: failed writes, lines waiting in memory, lines given up.
#[derive(Clone, Default)]
pub struct AuditMetrics {
    pub write_errors: Counter,
    pub held: Gauge,
    pub dropped: Counter,
}

struct Shared {
    queue: Mutex<Queue>,
    /// The writer waits on it for the first line of a batch (or for a flush, or the stop).
    queued: Condvar,
    /// `flush` waits on it for every line to be written.
    written: Condvar,
    metrics: AuditMetrics,
}

#[derive(Default)]
struct Queue {
    /// Whole lines, each ending in a newline, not yet taken by the writer.
    lines: Lines,
    /// Lines the writer took and has not written yet.
    taken: usize,
    /// Why the last write failed, while lines are held.
    failing: Option<String>,
    /// Callers of `flush` waiting: the writer does not let lines gather for them.
    flushing: usize,
    stopping: bool,
}

impl Queue {
    fn waiting(&self) -> usize {
        self.lines.count + self.taken
    }
}

/// Lines back to back in one buffer, and how many.
#[derive(Default)]
struct Lines {
    bytes: Vec<u8>,
    count: usize,
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
        let shared =
            Arc::new(Shared { queue: Mutex::default(), queued: Condvar::new(), written: Condvar::new(), metrics });
        let writer = std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn({
                let shared = shared.clone();
                move || shared.write_until_stopped(sink)
            })
            .expect("spawning the audit writer thread");
        AuditLog { shared, writer: Some(writer) }
    }

    /// Queues the line for the writer; never waits for the sink.
    pub fn record(&self, record: &AuditRecord) {
        let line = encode(record);
        let mut queue = self.shared.lock();
        if queue.waiting() >= MAX_HELD_LINES {
            drop(queue);
            self.shared.metrics.dropped.inc();
            error!(decision = record.decision.as_str(), uid = %record.uid, "audit line dropped: {MAX_HELD_LINES} lines already wait to be written");
            return;
        }
        let first = queue.lines.count == 0;
        queue.lines.bytes.extend_from_slice(&line);
        queue.lines.count += 1;
        drop(queue);
        // The writer needs waking for the first line only: it takes the later ones with it.
        if first {
            self.shared.queued.notify_one();
        }
    }

    /// Ok while the sink takes every line; otherwise why not.
    pub fn health(&self) -> Result<(), AuditFailing> {
        let queue = self.shared.lock();
        match &queue.failing {
            None => Ok(()),
            Some(why) => Err(AuditFailing(format!(
                "the audit log cannot be written ({why}); {} lines wait in memory",
                queue.waiting()
            ))),
        }
    }

    /// Waits until every line queued so far is written, at most `within`: whether it was.
    pub fn flush(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let mut queue = self.shared.lock();
        queue.flushing += 1;
        self.shared.queued.notify_one();
        let mut written = true;
        while queue.waiting() > 0 {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                written = false;
                break;
            };
            self.shared.written.wait_for(&mut queue, left);
        }
        queue.flushing -= 1;
        written
    }
}

impl Drop for AuditLog {
    /// Writes what waits (the writer gives up on a sink that still refuses), then stops.
    fn drop(&mut self) {
        self.shared.lock().stopping = true;
        self.shared.queued.notify_one();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock()
    }

    fn write_until_stopped(&self, mut sink: Box<dyn Write + Send>) {
        let mut batch = Batch::default();
        loop {
            let mut queue = self.lock();
            while queue.lines.count == 0 && batch.lines.count == 0 && !queue.stopping {
                self.queued.wait(&mut queue);
            }
            if queue.flushing == 0 && !queue.stopping && batch.lines.count == 0 {
                self.queued.wait_for(&mut queue, GATHER);
            }
            let stopping = queue.stopping;
            batch.take(&mut queue.lines);
            queue.taken = batch.lines.count;
            drop(queue);

            let result = batch.write_to(&mut *sink);
            let mut queue = self.lock();
            queue.taken = batch.lines.count;
            self.metrics.held.set(queue.waiting() as i64);
            match result {
                Ok(()) => {
                    if queue.failing.take().is_some() {
                        info!("audit log writable again; every held line written");
                    }
                    self.written.notify_all();
                    if stopping && queue.lines.count == 0 {
                        return;
                    }
                }
                Err(e) => {
                    self.metrics.write_errors.inc();
                    if queue.failing.is_none() {
                        error!(error = %e, "audit log cannot be written: lines are held in memory until it can");
                    }
                    queue.failing = Some(e.to_string());
                    if stopping {
                        self.metrics.dropped.inc_by(queue.waiting() as u64);
                        error!(lines = queue.waiting(), "audit lines dropped at shutdown: the sink still refuses them");
                        return;
                    }
                    self.queued.wait_for(&mut queue, RETRY_AFTER);
                }
            }
        }
    }
}

/// The audit line of `record`, newline included: byte for byte what serde_json writes of it (a
/// test holds the two together), written straight into one buffer (see [`crate::json`]).
fn encode(record: &AuditRecord) -> Vec<u8> {
    use std::io::Write as _;
    let strings = [&record.uid, &record.detail, &record.resource, &record.namespace, &record.name, &record.user];
    let room =
        320 + strings.iter().map(|s| s.len()).sum::<usize>() + record.groups.iter().map(|g| g.len() + 3).sum::<usize>();
    let mut out = Vec::with_capacity(room);
    let _ = write!(out, r#"{{"time":"{}","uid":"#, record.time);
    json::string(&mut out, &record.uid);
    // Words copied as they are: core::fmt would cost more than the line's strings.
    let (decision, reason) = (record.decision.as_str().as_bytes(), record.reason.as_str().as_bytes());
    for part in [br#","decision":""#, decision, br#"","reason":""#, reason, br#"","detail":"#] {
        out.extend_from_slice(part);
    }
    json::string(&mut out, &record.detail);
    out.extend_from_slice(br#","operation":"#);
    json::string(&mut out, record.operation.map_or("", Operation::as_str));
    for (key, value) in [
        (&br#","resource":"#[..], &record.resource),
        (br#","subresource":"#, &record.subresource),
        (br#","namespace":"#, &record.namespace),
        (br#","name":"#, &record.name),
        (br#","user":"#, &record.user),
    ] {
        out.extend_from_slice(key);
        json::string(&mut out, value);
    }
    out.extend_from_slice(br#","groups":"#);
    json::strings(&mut out, &record.groups);
    match record.busy_since {
        Some(since) => {
            let _ = write!(out, r#","busy_since":"{since}""#);
        }
        None => out.extend_from_slice(br#","busy_since":null"#),
    }
    for part in [br#","mode":""#, record.mode.as_str().as_bytes(), br#"","dry_run":"#] {
        out.extend_from_slice(part);
    }
    out.extend_from_slice(if record.dry_run { b"true" } else { b"false" });
    if let Some(plan) = record.plan {
        let ScalePlan { replicas_from, replicas_to, pods, idle_taken, busy_waited, busy_spared, refreshed } = plan;
        let mut number = itoa::Buffer::new();
        for (key, value) in [
            (&br#","plan":{"replicas_from":"#[..], i64::from(replicas_from)),
            (br#","replicas_to":"#, i64::from(replicas_to)),
            (br#","pods":"#, pods as i64),
            (br#","idle_taken":"#, idle_taken as i64),
            (br#","busy_waited":"#, busy_waited as i64),
            (br#","busy_spared":"#, busy_spared as i64),
            (br#","refreshed":"#, refreshed as i64),
        ] {
            out.extend_from_slice(key);
            out.extend_from_slice(number.format(value).as_bytes());
        }
        out.push(b'}');
    }
    if let Some(workload) = &record.workload {
        out.extend_from_slice(br#","workload":"#);
        json::string(&mut out, workload);
    }
    out.extend_from_slice(b"}\n");
    out
}

/// The lines the writer took, oldest first; the first `written` bytes of them are out.
#[derive(Default)]
struct Batch {
    lines: Lines,
    written: usize,
}

impl Batch {
    /// Takes the queued lines after those still held; the queue keeps a buffer to fill again.
    fn take(&mut self, queued: &mut Lines) {
        if self.lines.count == 0 {
            self.lines.bytes.clear();
            self.written = 0;
            std::mem::swap(&mut self.lines, queued);
        } else {
            self.lines.bytes.extend_from_slice(&queued.bytes);
            self.lines.count += queued.count;
            queued.bytes.clear();
            queued.count = 0;
        }
    }

    /// Writes the lines in order; after an error the rest of a partly written line comes first
    /// next time, so a line is never split by another or written twice.
    fn write_to(&mut self, sink: &mut dyn Write) -> io::Result<()> {
        while self.written < self.lines.bytes.len() {
            match sink.write(&self.lines.bytes[self.written..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    let out = &self.lines.bytes[self.written..self.written + n];
                    self.written += n;
                    // Counted line by line only when the sink took part of the batch.
                    self.lines.count = if self.written == self.lines.bytes.len() {
                        0
                    } else {
                        self.lines.count - out.iter().filter(|&&byte| byte == b'\n').count()
                    };
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        sink.flush()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

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
            operation: Some(Operation::Delete),
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
            workload: None,
        }
    }

    #[test]
    fn concurrent_writers_append_whole_lines_to_the_file_all_written_when_the_log_is_dropped() {
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
        drop(log);
        let text = std::fs::read_to_string(&path).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("earlier line"), "appends, never truncates");
        let uids: std::collections::BTreeSet<String> = lines
            .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap()["uid"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(uids.len(), 400);
    }

    /// A sink that takes nothing until `open` is set (a stalled pipe, a hung network disk), and
    /// counts the writes it takes.
    struct Gated {
        written: Arc<Mutex<Vec<u8>>>,
        open: Arc<(Mutex<bool>, Condvar)>,
        writes: Arc<AtomicUsize>,
    }

    impl Write for Gated {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            let (open, opened) = &*self.open;
            let mut is_open = open.lock();
            while !*is_open {
                opened.wait(&mut is_open);
            }
            self.writes.fetch_add(1, Ordering::SeqCst);
            self.written.lock().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stalled_sink_never_holds_an_answer_and_gets_every_line_once_it_moves() {
        let written = Arc::new(Mutex::new(Vec::new()));
        let open = Arc::new((Mutex::new(false), Condvar::new()));
        let log = Arc::new(AuditLog::to(
            Box::new(Gated { written: written.clone(), open: open.clone(), writes: Arc::default() }),
            AuditMetrics::default(),
        ));
        // Answers record their lines and readiness asks for health while the sink is stuck.
        let (done, answered) = std::sync::mpsc::channel();
        std::thread::spawn({
            let log = log.clone();
            move || {
                for i in 0..100 {
                    log.record(&record(&format!("u-{i}")));
                }
                done.send(log.health()).unwrap();
            }
        });
        let health = answered.recv_timeout(Duration::from_secs(10)).expect("recording waited on the sink");
        assert_eq!(health, Ok(()), "slow is not failing");
        assert!(!log.flush(Duration::from_millis(50)), "nothing could be written yet");

        *open.0.lock() = true;
        open.1.notify_all();
        assert!(log.flush(Duration::from_secs(10)));
        let text = String::from_utf8(written.lock().clone()).unwrap();
        let uids: Vec<String> = text
            .lines()
            .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap()["uid"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(uids, (0..100).map(|i| format!("u-{i}")).collect::<Vec<_>>(), "in order, once each");
    }

    #[test]
    fn a_burst_of_lines_reaches_the_sink_in_a_few_writes_not_one_a_line() {
        let (written, writes) = (Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicUsize::new(0)));
        let open = Arc::new((Mutex::new(true), Condvar::new()));
        let sink = Gated { written: written.clone(), open, writes: writes.clone() };
        let log = AuditLog::to(Box::new(sink), AuditMetrics::default());
        for i in 0..500 {
            log.record(&record(&format!("u-{i}")));
        }
        assert!(log.flush(Duration::from_secs(10)));
        assert_eq!(String::from_utf8(written.lock().clone()).unwrap().lines().count(), 500);
        let writes = writes.load(Ordering::SeqCst);
        assert!(writes <= 10, "500 lines recorded at once took {writes} writes");
    }

    #[test]
    fn a_line_is_written_byte_for_byte_as_serde_json_writes_it() {
        let mut odd = record("odd \"uid\"");
        odd.detail = "tab\t, newline\n, quote \", é".into();
        odd.groups = vec![];
        odd.busy_since = None;
        odd.mode = Mode::Audit;
        odd.dry_run = true;
        odd.workload = Some("Deployment/\"w\"".into());
        odd.time = "2026-11-21T20:00:00.123456789Z".parse().unwrap();
        let mut planned = record("u-2");
        planned.plan = Some(ScalePlan {
            replicas_from: 5,
            replicas_to: 2,
            pods: 5,
            idle_taken: 2,
            busy_waited: 1,
            busy_spared: 2,
            refreshed: 0,
        });
        for line in [record("u-1"), odd, planned] {
            let mut serde = serde_json::to_vec(&line).unwrap();
            serde.push(b'\n');
            assert_eq!(String::from_utf8(encode(&line)).unwrap(), String::from_utf8(serde).unwrap());
        }
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
            let mut written = self.written.lock();
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

    /// `check` true within a few seconds.
    fn eventually(what: &str, check: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !check() {
            assert!(Instant::now() < deadline, "never: {what}");
            std::thread::sleep(Duration::from_millis(10));
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
        eventually("the refusal reported", || log.health().is_err() && metrics.held.get() == 3);
        let why = log.health().unwrap_err();
        assert!(why.0.starts_with("the audit log cannot be written (No space left on device"), "{why}");
        assert!(why.0.ends_with("; 3 lines wait in memory"), "{why}");
        assert!(metrics.write_errors.get() >= 1, "each refused attempt counted");

        free.store(true, Ordering::SeqCst);
        assert!(log.flush(Duration::from_secs(10)));
        assert_eq!(log.health(), Ok(()));
        assert_eq!(metrics.held.get(), 0);
        let text = String::from_utf8(written.lock().clone()).unwrap();
        let uids: Vec<String> = text
            .lines()
            .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap()["uid"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(uids, ["u-0", "u-1", "u-2", "u-3"], "in order, whole, once each");
        assert_eq!(metrics.dropped.get(), 0);
    }
}
