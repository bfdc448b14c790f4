//! The rig's kubelet for busyguard's own pods (one `busyguard` process per running pod, with the
//! pod's args, env, mounted TLS files and bound token; its readiness probed, its preStop hook run,
//! SIGTERM sent on delete, started again if it exits) and the forwarder that plays busyguard's
//! Service.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::rig::{BUSYGUARD, binary, bound_token, die_with_parent, free_ports, kubeconfig_for, kubectl};

/// The rig's kubelet for busyguard's own pods: one `busyguard` process per running pod.
pub struct Kubelet {
    admin: PathBuf,
    work: PathBuf,
    replicas: Mutex<HashMap<String, Replica>>,
    /// How each busyguard that exited while its pod ran ended, with its last lines: a crash,
    /// which fails the scenario it happened in.
    crashes: Mutex<Vec<String>>,
    stopped: AtomicBool,
}

struct Replica {
    pod: String,
    child: Arc<Mutex<Child>>,
    webhook: SocketAddr,
    admin: SocketAddr,
    ready: bool,
    terminating: bool,
}

impl Kubelet {
    pub fn new(admin: PathBuf, work: PathBuf) -> Result<Kubelet> {
        let _ = std::fs::remove_dir_all(work.join("replicas"));
        std::fs::create_dir_all(work.join("replicas"))?;
        let (replicas, crashes) = (Mutex::new(HashMap::new()), Mutex::new(Vec::new()));
        Ok(Kubelet { admin, work, replicas, crashes, stopped: AtomicBool::new(false) })
    }

    pub fn run(kubelet: Arc<Kubelet>) {
        std::thread::spawn(move || {
            while !kubelet.stopped.load(Ordering::Relaxed) {
                if let Err(e) = kubelet.sync() {
                    eprintln!("e2e kubelet: {e:#}");
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        });
    }

    /// The replicas the Service sends connections to.
    /// The admin ports of the replicas running.
    pub fn admins(&self) -> Vec<SocketAddr> {
        self.replicas.lock().unwrap().values().map(|r| r.admin).collect()
    }

    pub fn endpoints(&self) -> Vec<SocketAddr> {
        let replicas = self.replicas.lock().unwrap();
        replicas.values().filter(|r| r.ready && !r.terminating).map(|r| r.webhook).collect()
    }

    /// Processes still running.
    pub fn running(&self) -> usize {
        let replicas = self.replicas.lock().unwrap();
        replicas.values().filter(|r| r.child.lock().unwrap().try_wait().ok().flatten().is_none()).count()
    }

    /// Each replica as this kubelet runs it: its pod, whether it answers `/readyz`, whether it
    /// is terminating, and its process's exit if it has one; with the last lines it logged.
    pub fn describe(&self) -> String {
        let replicas = self.replicas.lock().unwrap();
        let mut lines = Vec::new();
        for replica in replicas.values() {
            let exited = replica.child.lock().unwrap().try_wait().ok().flatten();
            lines.push(format!(
                "replica {}: ready {}, terminating {}, process {}",
                replica.pod,
                replica.ready,
                replica.terminating,
                exited.map_or("running".to_string(), |status| status.to_string())
            ));
            lines.push(self.last_lines(&replica.pod));
        }
        lines.join("\n")
    }

    /// The busyguard processes that exited while their pods ran, since this was last asked.
    pub fn crashes(&self) -> Vec<String> {
        std::mem::take(&mut *self.crashes.lock().unwrap())
    }

    /// The last lines a pod's busyguard wrote to stderr, indented.
    fn last_lines(&self, pod: &str) -> String {
        let log = std::fs::read_to_string(self.work.join("replicas").join(format!("{pod}.stderr")));
        let log = log.unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(5).collect();
        tail.into_iter().rev().map(|l| format!("  {l}")).collect::<Vec<_>>().join("\n")
    }

    /// A kubelet starts a container that exits again (restartPolicy Always). A listening port
    /// another process took between the rig's pick and busyguard's bind is the rig's doing (a
    /// pod has a network of its own): busyguard starts again on other ports. Any other exit is
    /// busyguard's own, and is kept as a crash.
    fn restart_if_exited(&self, replica: &mut Replica, pod: &Value) -> Result<()> {
        let Some(status) = replica.child.lock().unwrap().try_wait()? else { return Ok(()) };
        if self.stopped.load(Ordering::Relaxed) {
            return Ok(());
        }
        let last_lines = self.last_lines(&replica.pod);
        let port_taken = last_lines.contains("listening on") && last_lines.contains("in use");
        let said = format!("busyguard in pod {} exited ({status}) while its pod ran:\n{last_lines}", replica.pod);
        eprintln!("e2e kubelet: {said}");
        if !port_taken {
            self.crashes.lock().unwrap().push(said);
        }
        *replica = self.start(pod)?;
        Ok(())
    }

    fn sync(self: &Arc<Self>) -> Result<()> {
        let (ok, out, err) = kubectl(&self.admin, &["-n", "busyguard", "get", "pods", "-o", "json"])?;
        ensure!(ok, "{err}");
        let pods: Value = serde_json::from_str(&out)?;
        let pods = pods["items"].as_array().cloned().unwrap_or_default();
        let mut seen = Vec::new();
        for pod in &pods {
            let uid = pod["metadata"]["uid"].as_str().unwrap_or_default().to_string();
            let name = pod["metadata"]["name"].as_str().unwrap_or_default().to_string();
            seen.push(uid.clone());
            let terminating = !pod["metadata"]["deletionTimestamp"].is_null();
            let known = self.replicas.lock().unwrap().contains_key(&uid);
            if !known && !terminating && pod["status"]["phase"] == "Running" {
                let replica = self.start(pod)?;
                self.replicas.lock().unwrap().insert(uid.clone(), replica);
            }
            let mut replicas = self.replicas.lock().unwrap();
            let Some(replica) = replicas.get_mut(&uid) else { continue };
            if terminating && !replica.terminating {
                replica.terminating = true;
                self.terminate(replica, pod);
            }
            if !replica.terminating {
                self.restart_if_exited(replica, pod)?;
            }
            let ready = !terminating && get_ok(replica.admin, "/readyz");
            let marked = pod["metadata"]["annotations"]["k8s-local/ready"] == "true";
            replica.ready = ready;
            if ready != marked && !terminating {
                let patch = json!({"metadata": {"annotations": {"k8s-local/ready": ready.to_string()}}});
                let _ = kubectl(&self.admin, &["-n", "busyguard", "patch", "pod", &name, "-p", &patch.to_string()]);
            }
        }
        // A pod gone without a termination (force-deleted): its process goes too.
        let mut replicas = self.replicas.lock().unwrap();
        for (uid, replica) in replicas.iter_mut() {
            if !seen.contains(uid) && !replica.terminating {
                replica.terminating = true;
                let _ = replica.child.lock().unwrap().kill();
            }
        }
        replicas.retain(|_, r| !(r.terminating && r.child.lock().unwrap().try_wait().ok().flatten().is_some()));
        Ok(())
    }

    /// The pod's container, on this machine: its args and env as the pod says them, the TLS
    /// volume where it is mounted, its own addresses, and a token bound to the pod.
    fn start(&self, pod: &Value) -> Result<Replica> {
        let container = &pod["spec"]["containers"][0];
        let pod = pod["metadata"]["name"].as_str().context("a pod's name")?;
        let token = bound_token(&self.admin, "busyguard", "busyguard", pod)?;
        let path = self.work.join("replicas").join(format!("{pod}.kubeconfig"));
        let kubeconfig = kubeconfig_for(&self.admin, &path, pod, &token)?;
        let [webhook, admin] = free_ports()?;
        let mounts: Vec<(String, PathBuf)> = (container["volumeMounts"].as_array().into_iter().flatten())
            .filter_map(|m| m["mountPath"].as_str().map(|p| (p.to_string(), self.work.join("certs"))))
            .collect();
        let mut command = Command::new(binary(container["image"].as_str().unwrap_or_default()));
        for arg in container["args"].as_array().into_iter().flatten() {
            command.arg(arg.as_str().unwrap_or_default());
        }
        for var in container["env"].as_array().into_iter().flatten() {
            // The downward API, as the kubelet fills it in.
            let value = match var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("metadata.namespace") => "busyguard",
                Some("metadata.name") => pod,
                _ => var["value"].as_str().unwrap_or_default(),
            };
            let value = mounts.iter().fold(value.to_string(), |v, (from, to)| v.replace(from, &to.to_string_lossy()));
            command.env(var["name"].as_str().unwrap_or_default(), value);
        }
        let logs = self.work.join("replicas");
        command
            .env_remove("KUBECONFIG")
            .env("HOSTNAME", pod)
            .env("BUSYGUARD_KUBECONFIG", &kubeconfig)
            .env("BUSYGUARD_LISTEN", webhook.to_string())
            .env("BUSYGUARD_ADMIN_LISTEN", admin.to_string())
            .stdin(Stdio::null())
            .stdout(appended(&logs.join(format!("{pod}.stdout")))?)
            .stderr(appended(&logs.join(format!("{pod}.stderr")))?);
        die_with_parent(&mut command);
        let child = command.spawn().context("starting busyguard")?;
        Ok(Replica {
            pod: pod.to_string(),
            child: Arc::new(Mutex::new(child)),
            webhook,
            admin,
            ready: false,
            terminating: false,
        })
    }

    /// What a kubelet does for a deleted pod: the preStop hook, SIGTERM, SIGKILL at the end of
    /// the grace period, then the final delete.
    fn terminate(&self, replica: &Replica, pod: &Value) {
        let pre_stop: Vec<String> = (pod["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
            .as_array())
        .into_iter()
        .flatten()
        .skip(1)
        .filter_map(|a| a.as_str().map(String::from))
        .collect();
        let grace = pod["metadata"]["deletionGracePeriodSeconds"].as_u64().unwrap_or(30);
        let (child, name, admin) = (replica.child.clone(), replica.pod.clone(), self.admin.clone());
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(grace);
            if !pre_stop.is_empty() {
                let _ = Command::new(BUSYGUARD).args(&pre_stop).status();
            }
            let pid = child.lock().unwrap().id();
            let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
            while Instant::now() < deadline {
                if child.lock().unwrap().try_wait().ok().flatten().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.lock().unwrap().kill();
            let _ = child.lock().unwrap().wait();
            let _ = kubectl(&admin, &["-n", "busyguard", "delete", "pod", &name, "--grace-period=0", "--wait=false"]);
        });
    }

    pub fn stop_all(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        for replica in self.replicas.lock().unwrap().values() {
            let _ = replica.child.lock().unwrap().kill();
        }
    }
}

/// A log file a process started again writes on after its earlier lines.
fn appended(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new().create(true).append(true).open(path)
}

/// busyguard's Service: each connection goes to a ready replica, round robin; with none, the
/// connection is closed (the API server then applies the webhook's failurePolicy).
pub struct Forwarder {
    pub port: u16,
}

impl Forwarder {
    pub fn start(kubelet: Arc<Kubelet>) -> Result<Forwarder> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        std::thread::spawn(move || {
            let mut next = 0usize;
            for inbound in listener.incoming().flatten() {
                let endpoints = kubelet.endpoints();
                if endpoints.is_empty() {
                    continue;
                }
                next = next.wrapping_add(1);
                let backend = endpoints[next % endpoints.len()];
                std::thread::spawn(move || {
                    let Ok(outbound) = TcpStream::connect(backend) else { return };
                    splice(inbound, outbound);
                });
            }
        });
        Ok(Forwarder { port })
    }
}

/// Copies both ways until either side closes.
fn splice(a: TcpStream, b: TcpStream) {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else { return };
    let one = std::thread::spawn(move || copy(a, b2));
    copy(b, a2);
    let _ = one.join();
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

/// A plain HTTP GET on the admin port: 200 or not.
pub fn get_ok(addr: SocketAddr, path: &str) -> bool {
    get(addr, path).is_some_and(|response| response.starts_with("HTTP/1.1 200"))
}

/// The body of a 200 answer to a plain HTTP GET on the admin port.
pub fn get_body(addr: SocketAddr, path: &str) -> Option<String> {
    let response = get(addr, path).filter(|r| r.starts_with("HTTP/1.1 200"))?;
    response.split_once("\r\n\r\n").map(|(_, body)| body.to_string())
}

pub fn get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    Some(response)
}
