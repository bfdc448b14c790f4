//! `busyguard serve` as a real process: its addresses, its JSON log lines, signals.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// `busyguard certs` in `dir`: the dev certificates `serve` uses by default.
pub fn certs(dir: &Path) {
    let status = Command::new(env!("CARGO_BIN_EXE_busyguard")).arg("certs").current_dir(dir).status().unwrap();
    assert!(status.success());
}

pub struct Process {
    pub webhook: SocketAddr,
    pub admin: SocketAddr,
    child: Child,
    logs: mpsc::Receiver<serde_json::Value>,
}

impl Process {
    /// `busyguard serve` in `dir` on its default certificate paths, with JSON logs and `args`,
    /// once it serves.
    pub fn serve(dir: &Path, args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_busyguard"))
            .args(["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--log-format", "json"])
            .args(args)
            .current_dir(dir)
            // As on a fresh machine: no cluster to find, so busyguard serves without one.
            .env("KUBECONFIG", dir.join("no-such-kubeconfig"))
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (sender, logs) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("log lines are JSON: {line}"));
                let _ = sender.send(value);
            }
        });
        let serving = wait_for(&logs, "busyguard serving");
        let addr = |name: &str| serving[name].as_str().unwrap().parse().unwrap();
        Process { webhook: addr("webhook"), admin: addr("admin"), child, logs }
    }

    pub fn wait_for_log(&self, message: &str) -> serde_json::Value {
        wait_for(&self.logs, message)
    }

    pub fn signal(&self, name: &str) {
        let status = Command::new("kill").args(["-s", name, &self.child.id().to_string()]).status().unwrap();
        assert!(status.success());
    }

    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        for _ in 0..100 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.child.kill().unwrap();
        panic!("busyguard did not exit within 5 s");
    }
}

impl Drop for Process {
    /// A test that fails half-way leaves no server behind.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The next log line with this message, skipping the others; panics after 10 s without one.
fn wait_for(logs: &mpsc::Receiver<serde_json::Value>, message: &str) -> serde_json::Value {
    loop {
        let line = logs.recv_timeout(Duration::from_secs(10)).expect("log line in time");
        if line["message"] == message {
            return line;
        }
    }
}
