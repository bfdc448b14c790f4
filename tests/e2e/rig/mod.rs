//! The rig: a real control plane (`tests/e2e/k8s`, or the cluster of `BUSYGUARD_E2E_KUBECONFIG`),
//! busyguard installed on it as shipped, and the helpers the scenarios speak through.
//!
//! As shipped: `manifests/base` rendered by `kubectl kustomize` and applied whole, with only the
//! webhooks' `clientConfig` switched to a URL (and its `caBundle`). The Deployment's pods are
//! scheduled by the real scheduler; the rig is their kubelet: for each busyguard pod it runs
//! `busyguard` on this machine with the container's args and env, the TLS Secret's files where
//! the volume is mounted, and a token bound to that pod (what the projected token is in a real
//! pod), so busyguard speaks to the API server with the identity it has in a cluster. It probes
//! `/readyz` as the readinessProbe does, runs the preStop hook and sends SIGTERM when the pod is
//! deleted. The webhook URL points at a TCP forwarder that plays the Service: it sends each
//! connection to a ready, not terminating replica.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};

use crate::kubelet::{Forwarder, Kubelet, get, get_body};

mod commands;
mod install;
mod wait;
use base64::Engine;
pub use commands::{bound_token, die_with_parent, free_ports, kubeconfig_for, kubectl, kubectl_stdin, run};
pub use install::args_patch;
use serde_json::{Value, json};
pub use wait::{eventually, throughout};

pub const ROOT: &str = env!("CARGO_MANIFEST_DIR");
pub const BUSYGUARD: &str = env!("CARGO_BIN_EXE_busyguard");
/// The image that runs the build of a previous release: `busyguard-previous:COMMIT`.
pub const PREVIOUS_IMAGE: &str = "busyguard-previous:";

/// A kustomization directory, rendered by `kubectl kustomize`.
fn rendered(dir: &Path) -> Result<Vec<Value>> {
    crate::kustomize::kustomize(dir).map_err(anyhow::Error::msg)
}

fn is_webhook_configuration(object: &Value) -> bool {
    object["kind"].as_str().is_some_and(|k| k.ends_with("WebhookConfiguration"))
}

/// Where `Rig::previous_release` builds `commit`.
fn previous_build(commit: &str) -> PathBuf {
    Path::new(ROOT).join("target/previous").join(commit)
}

/// The build a busyguard pod's image names: a previous release's, else this checkout's.
pub fn binary(image: &str) -> PathBuf {
    match image.strip_prefix(PREVIOUS_IMAGE) {
        Some(commit) => previous_build(commit).join("debug/busyguard"),
        None => PathBuf::from(BUSYGUARD),
    }
}

/// How the name of every namespace a scenario makes begins.
const SCENARIO_NAMESPACES: &str = "e2e-";

pub struct Rig {
    /// The admin's kubeconfig: the person at the keyboard.
    pub admin: PathBuf,
    pub work: PathBuf,
    control_plane: Option<ControlPlane>,
    kubelet: Arc<Kubelet>,
    /// Where the webhooks point: the forwarder that plays busyguard's Service.
    pub webhook_url: String,
    /// The webhook configurations as rendered (their `clientConfig` is set by `register`).
    webhooks: Mutex<Vec<Value>>,
    /// This checkout is installed from its Helm chart, not its kustomize manifests.
    through_chart: AtomicBool,
    /// Which run of the scenario this is (`E2E_REPEAT`), from 1.
    run: AtomicUsize,
}

struct ControlPlane {
    harness: PathBuf,
    dir: PathBuf,
}

impl Rig {
    /// Starts (or reaches) the control plane and installs busyguard on it, two replicas ready.
    pub fn up() -> Result<Rig> {
        let work = PathBuf::from(std::env::var("BUSYGUARD_E2E_WORK").unwrap_or_else(|_| "/tmp/busyguard-e2e".into()));
        let (admin, control_plane) = match std::env::var("BUSYGUARD_E2E_KUBECONFIG") {
            Ok(kubeconfig) => (PathBuf::from(kubeconfig), None),
            Err(_) => {
                let plane = ControlPlane::start()?;
                (plane.dir.join("admin.kubeconfig"), Some(plane))
            }
        };
        std::fs::create_dir_all(&work)?;
        let kubelet = Arc::new(Kubelet::new(admin.clone(), work.clone())?);
        let forwarder = Forwarder::start(kubelet.clone())?;
        let rig = Rig {
            admin,
            work,
            control_plane,
            kubelet,
            webhook_url: format!("https://127.0.0.1:{}", forwarder.port),
            webhooks: Mutex::new(Vec::new()),
            through_chart: AtomicBool::new(false),
            run: AtomicUsize::new(1),
        };
        rig.clean_leftovers()?;
        rig.install()?;
        Ok(rig)
    }

    /// What an earlier run may have left on a control plane that was kept.
    fn clean_leftovers(&self) -> Result<()> {
        let _ = self.try_kubectl(&[
            "delete",
            "mutatingwebhookconfiguration,validatingwebhookconfiguration",
            "busyguard",
            "--ignore-not-found",
        ]);
        let _ = self.try_kubectl(&["delete", "nodes", "-l", "e2e=true", "--wait=false"]);
        let ours: Vec<String> = self
            .namespace_names()?
            .into_iter()
            .filter(|n| n.starts_with(SCENARIO_NAMESPACES) || n == "busyguard")
            .collect();
        if !ours.is_empty() {
            let mut args = vec!["delete", "ns", "--wait=true", "--timeout=60s"];
            args.extend(ours.iter().map(String::as_str));
            self.kubectl(&args)?;
        }
        Ok(())
    }

    /// Every namespace's name, terminating ones too.
    pub fn namespace_names(&self) -> Result<Vec<String>> {
        let names = self.kubectl(&["get", "ns", "-o", "jsonpath={.items[*].metadata.name}"])?;
        Ok(names.split_whitespace().map(str::to_string).collect())
    }

    /// Registers the webhook configurations held, trusting the CA busyguard serves under now.
    pub fn register_live(&self) -> Result<()> {
        self.register(&std::fs::read(self.certs().join("ca.crt"))?)
    }

    /// Applies the webhook configurations as rendered, by URL, trusting `ca_bundle` (PEM).
    pub fn register(&self, ca_bundle: &[u8]) -> Result<()> {
        let ca = base64::engine::general_purpose::STANDARD.encode(ca_bundle);
        let mut webhooks = self.webhooks.lock().unwrap().clone();
        for object in &mut webhooks {
            for webhook in object["webhooks"].as_array_mut().context("webhooks")? {
                let path = webhook["clientConfig"]["service"]["path"].as_str().context("a service path")?;
                webhook["clientConfig"] = json!({"url": format!("{}{path}", self.webhook_url), "caBundle": ca});
            }
        }
        self.apply(&json!({"apiVersion": "v1", "kind": "List", "items": webhooks}))?;
        // The API server reads webhook configurations from its informer: let it catch up.
        std::thread::sleep(Duration::from_secs(2));
        Ok(())
    }

    /// AdmissionReviews busyguard's replicas answered so far (`busyguard_admission_reviews_total`).
    pub fn reviews_answered(&self) -> f64 {
        let mut total = 0.0;
        for metrics in self.metrics() {
            let samples = metrics.lines().filter(|l| l.starts_with("busyguard_admission_reviews_total{"));
            total += samples.filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum::<f64>();
        }
        total
    }

    /// The `/metrics` page of every replica.
    pub fn metrics(&self) -> Vec<String> {
        let admins: Vec<SocketAddr> = self.kubelet.admins();
        admins.into_iter().filter_map(|admin| get_body(admin, "/metrics")).collect()
    }

    /// A project's CustomResourceDefinition from its file, as `helm install` or `helm upgrade`
    /// leaves CRDs: created, or replaced over another release's, the fields this API server
    /// does not know dropped with a warning (`selectableFields`, `x-kubernetes-patch-*`); then
    /// Established.
    pub fn install_crd(&self, path: &Path) -> Result<()> {
        let path = path.to_str().context("the CRD's path")?;
        let (replaced, name, _) = self.try_kubectl(&["replace", "--validate=false", "-o", "name", "-f", path])?;
        let name =
            if replaced { name } else { self.kubectl(&["create", "--validate=false", "-o", "name", "-f", path])? };
        let name = name.trim().rsplit('/').next().unwrap_or_default().to_string();
        self.established(&name)
    }

    /// Waits until the CustomResourceDefinition `name` is Established (kubectl wait errs on one
    /// whose status has no conditions yet, just after its create).
    pub fn established(&self, name: &str) -> Result<()> {
        eventually(&format!("crd/{name} Established"), Duration::from_secs(30), || {
            let crd = self.get(&["crd", name])?;
            let conditions = crd["status"]["conditions"].as_array().cloned().unwrap_or_default();
            Ok(conditions.iter().any(|c| c["type"] == "Established" && c["status"] == "True"))
        })
    }

    /// The `/status` page of every replica, whatever it answers (200: ok; 503: what is wrong).
    pub fn statuses(&self) -> Vec<String> {
        self.admin_pages("/status")
    }

    /// The `/readyz` page of every replica running, terminating ones too ("ready", or why not).
    pub fn readiness(&self) -> Vec<String> {
        self.admin_pages("/readyz")
    }

    fn admin_pages(&self, path: &str) -> Vec<String> {
        let admins: Vec<SocketAddr> = self.kubelet.admins();
        let bodies = admins.into_iter().filter_map(|admin| get(admin, path));
        bodies.filter_map(|r| r.split_once("\r\n\r\n").map(|(_, body)| body.to_string())).collect()
    }

    /// Takes busyguard's webhook configurations away: the API server calls it no more.
    #[allow(dead_code)] // benches/apiserver.rs
    pub fn unregister(&self) -> Result<()> {
        let kinds = "mutatingwebhookconfiguration,validatingwebhookconfiguration";
        self.kubectl(&["delete", kinds, "busyguard", "--ignore-not-found"])?;
        std::thread::sleep(Duration::from_secs(2));
        Ok(())
    }

    /// Where busyguard's TLS Secret is "mounted": the files every replica serves and reloads.
    pub fn certs(&self) -> PathBuf {
        self.work.join("certs")
    }

    /// The busyguard processes that exited while their pods ran, since this was last asked.
    pub fn crashes(&self) -> Vec<String> {
        self.kubelet.crashes()
    }

    /// Waits until exactly `n` replicas answer behind the Service.
    pub fn wait_for_replicas(&self, n: usize) -> Result<()> {
        eventually(&format!("{n} busyguard replica(s) ready"), Duration::from_secs(90), || {
            Ok(self.kubelet.endpoints().len() == n && self.kubelet.running() == n)
        })
        .with_context(|| self.busyguard_state())
    }

    /// What busyguard's Deployment, ReplicaSets and pods are doing as the API server has them,
    /// the namespace's latest events, and each replica as the rig's kubelet runs it: said where
    /// busyguard does not come up, so that a CI log shows why.
    fn busyguard_state(&self) -> String {
        let get = |args: &[&str]| match self.try_kubectl(args) {
            Ok((_, out, err)) => format!("{out}{err}"),
            Err(e) => format!("{e:#}"),
        };
        let pods = "custom-columns=POD:.metadata.name,PHASE:.status.phase,NODE:.spec.nodeName,\
                    DELETING:.metadata.deletionTimestamp,READY:.metadata.annotations.k8s-local/ready";
        // The Service's events say only that the rig's endpoints are on loopback.
        let not_service = "involvedObject.kind!=Endpoints,involvedObject.kind!=Service";
        let events =
            get(&["-n", "busyguard", "get", "events", "--sort-by=.lastTimestamp", "--field-selector", not_service]);
        let latest: Vec<&str> = events.lines().rev().take(8).collect();
        format!(
            "busyguard's state:\n{}{}{}\n{}\n{}",
            get(&["-n", "busyguard", "get", "deployment,replicaset", "-o", "wide"]),
            get(&["-n", "busyguard", "get", "pods", "-o", pods]),
            get(&["-n", "busyguard", "get", "deployment", "busyguard", "-o", "jsonpath={.status.conditions}"]),
            latest.into_iter().rev().collect::<Vec<_>>().join("\n"),
            self.kubelet.describe()
        )
    }

    /// Scales busyguard's Deployment and waits for that many replicas (0: every process gone).
    pub fn scale_busyguard(&self, replicas: usize) -> Result<()> {
        self.kubectl(&["-n", "busyguard", "scale", "deployment/busyguard", &format!("--replicas={replicas}")])?;
        self.wait_for_replicas(replicas)
    }

    /// Every line busyguard's replicas wrote to stdout (the audit log), in any order.
    pub fn audit(&self) -> Vec<Value> {
        let mut lines = Vec::new();
        for entry in std::fs::read_dir(self.work.join("replicas")).into_iter().flatten().flatten() {
            if entry.path().extension().is_some_and(|e| e == "stdout") {
                let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
                lines.extend(text.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()));
            }
        }
        lines
    }

    /// The audit lines of one decision about `namespace/name`.
    pub fn audited(&self, namespace: &str, name: &str, decision: &str) -> Vec<Value> {
        let mut lines = self.audit();
        lines.retain(|l| l["namespace"] == namespace && l["name"] == name && l["decision"] == decision);
        lines
    }

    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        let (ok, stdout, stderr) = self.try_kubectl(args)?;
        ensure!(ok, "kubectl {}: {stderr}", args.join(" "));
        Ok(stdout)
    }

    /// `kubectl ARGS`: whether it succeeded, its stdout and its stderr.
    pub fn try_kubectl(&self, args: &[&str]) -> Result<(bool, String, String)> {
        kubectl(&self.admin, args)
    }

    /// `kubectl --as=USER ARGS` (the admin impersonates: controllers, people, Karpenter).
    pub fn try_kubectl_as(&self, user: &str, args: &[&str]) -> Result<(bool, String, String)> {
        let mut all = vec!["--as", user];
        all.extend_from_slice(args);
        self.try_kubectl(&all)
    }

    /// `kubectl ARGS` running aside (a drain that waits), its output kept for `finish`.
    pub fn kubectl_aside(&self, args: &[&str]) -> Result<Child> {
        let mut command = Command::new("kubectl");
        command.arg("--kubeconfig").arg(&self.admin).args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        die_with_parent(&mut command);
        Ok(command.spawn()?)
    }

    /// A Role `role` in `ns` with `verbs` on `resources` (as `kubectl create role` takes them),
    /// bound to the service account `account` (`namespace:name`).
    pub fn grant(&self, ns: &str, role: &str, verbs: &str, resources: &str, account: &str) -> Result<()> {
        self.kubectl(&[
            "-n",
            ns,
            "create",
            "role",
            role,
            &format!("--verb={verbs}"),
            &format!("--resource={resources}"),
        ])?;
        let (role_ref, subject) = (format!("--role={role}"), format!("--serviceaccount={account}"));
        self.kubectl(&["-n", ns, "create", "rolebinding", role, &role_ref, &subject])?;
        Ok(())
    }

    /// A ClusterRole `name` with `rules`, bound to the service account `account` of `namespace`:
    /// another controller's identity, cluster-wide.
    pub fn grant_cluster(&self, name: &str, rules: Value, namespace: &str, account: &str) -> Result<()> {
        let rbac = "rbac.authorization.k8s.io";
        self.apply(&json!({"apiVersion": format!("{rbac}/v1"), "kind": "ClusterRole",
            "metadata": {"name": name}, "rules": rules}))?;
        self.apply(&json!({"apiVersion": format!("{rbac}/v1"), "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]}))?;
        Ok(())
    }

    pub fn apply(&self, object: &Value) -> Result<String> {
        kubectl_stdin(&self.admin, &["apply", "-f", "-"], &object.to_string())
    }

    pub fn get(&self, args: &[&str]) -> Result<Value> {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend(["-o", "json"]);
        Ok(serde_json::from_str(&self.kubectl(&all)?)?)
    }

    /// An eviction of `namespace/pod` through the Eviction API, as a drain or an autoscaler
    /// sends it: whether it went through, and what the API server said.
    pub fn evict(&self, namespace: &str, pod: &str) -> Result<(bool, String)> {
        self.evict_as(None, namespace, pod)
    }

    /// As [`Rig::evict`], as `user` (Karpenter, cluster-autoscaler) where one is given.
    pub fn evict_as(&self, user: Option<&str>, namespace: &str, pod: &str) -> Result<(bool, String)> {
        self.send_eviction(user, namespace, pod, false)
    }

    /// As [`Rig::evict`], a dry run (`kubectl drain --dry-run=server`): judged, never carried out.
    pub fn evict_dry_run(&self, namespace: &str, pod: &str) -> Result<(bool, String)> {
        self.send_eviction(None, namespace, pod, true)
    }

    fn send_eviction(&self, user: Option<&str>, namespace: &str, pod: &str, dry_run: bool) -> Result<(bool, String)> {
        let mut eviction =
            json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}});
        if dry_run {
            eviction["deleteOptions"] = json!({"dryRun": ["All"]});
        }
        let path = self.work.join(format!("{namespace}-{pod}-eviction{}.json", if dry_run { "-dry-run" } else { "" }));
        std::fs::write(&path, eviction.to_string())?;
        let raw = format!("/api/v1/namespaces/{namespace}/pods/{pod}/eviction");
        let path = path.to_string_lossy();
        let args = ["create", "--raw", &raw, "-f", &path];
        let (ok, _, err) = match user {
            Some(user) => self.try_kubectl_as(user, &args)?,
            None => self.try_kubectl(&args)?,
        };
        Ok((ok, err))
    }

    /// A pod, or None once it is gone.
    pub fn pod(&self, ns: &str, name: &str) -> Result<Option<Value>> {
        self.object(ns, "pod", name)
    }

    /// An object of `kind` in `ns`, or None when there is none; any other failure is an error.
    fn object(&self, ns: &str, kind: &str, name: &str) -> Result<Option<Value>> {
        let (ok, out, err) = self.try_kubectl(&["-n", ns, "get", kind, name, "-o", "json"])?;
        if !ok {
            ensure!(err.contains("NotFound"), "get {kind} {ns}/{name}: {err}");
            return Ok(None);
        }
        Ok(Some(serde_json::from_str(&out)?))
    }

    /// Whether `kind`/`name` is in `ns`; a failure to ask is an error, not "absent".
    pub fn exists(&self, ns: &str, kind: &str, name: &str) -> Result<bool> {
        Ok(self.object(ns, kind, name)?.is_some())
    }

    /// The names of the pods of `app` in `ns` that are not being deleted, sorted.
    pub fn live_pods(&self, ns: &str, app: &str) -> Result<Vec<String>> {
        let list = self.get(&["-n", ns, "pods", "-l", &format!("app={app}")])?;
        let mut names: Vec<String> = (list["items"].as_array().into_iter().flatten())
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .filter_map(|p| p["metadata"]["name"].as_str().map(String::from))
            .collect();
        names.sort();
        Ok(names)
    }

    /// The scenarios that follow are the `run`th of their `E2E_REPEAT` runs (from 1).
    pub fn set_run(&self, run: usize) {
        self.run.store(run, Ordering::Relaxed);
    }

    /// A fresh namespace for one scenario, deleted when the guard drops.
    pub fn namespace(&self, name: &str) -> Result<Namespace<'_>> {
        // A scenario run again, through the chart or by `E2E_REPEAT`, has namespaces of its own:
        // its audit lines, which outlive the namespace, are told apart from an earlier run's.
        let through = if self.through_chart.load(Ordering::Relaxed) { "chart-" } else { "" };
        let again = match self.run.load(Ordering::Relaxed) {
            1 => String::new(),
            run => format!("run{run}-"),
        };
        let name = format!("{SCENARIO_NAMESPACES}{through}{again}{name}");
        self.kubectl(&["create", "namespace", &name])?;
        eventually("the namespace's default service account", Duration::from_secs(30), || {
            Ok(self.try_kubectl(&["-n", &name, "get", "sa", "default"])?.0)
        })?;
        Ok(Namespace { rig: self, name })
    }

    /// Waits until every scenario's namespace is deleted, with all it held: a
    /// scenario run again (`E2E_REPEAT`) starts with nothing of its last run still going.
    pub fn namespaces_gone(&self) -> Result<()> {
        eventually("every scenario's namespace is gone", Duration::from_secs(120), || {
            Ok(!self.namespace_names()?.iter().any(|n| n.starts_with(SCENARIO_NAMESPACES)))
        })
    }

    /// Whether busyguard's busy-pod PDB is in `ns`; a failure to ask is an error, not "no".
    pub fn has_busy_pdb(&self, ns: &str) -> Result<bool> {
        self.exists(ns, "pdb", "busyguard-busy")
    }

    /// Waits for busyguard's busy-pod PDB in `ns`: made with the namespace's first opted-in pod,
    /// and on the sweep, every 30 s (0.2.0: on the sweep only).
    pub fn busy_pdb_made(&self, ns: &str) -> Result<()> {
        eventually(&format!("busyguard's busy-pod PDB in {ns}"), Duration::from_secs(45), || self.has_busy_pdb(ns))
    }

    /// A token bound to `pod` of service account `sa`: what a container of that pod holds.
    pub fn pod_token(&self, ns: &str, sa: &str, pod: &str) -> Result<String> {
        bound_token(&self.admin, ns, sa, pod)
    }

    /// A kubeconfig for `token` on this control plane, in the rig's work folder.
    pub fn kubeconfig_for(&self, name: &str, token: &str) -> Result<PathBuf> {
        kubeconfig_for(&self.admin, &self.work.join(format!("{name}.kubeconfig")), name, token)
    }

    /// A node of the scenario's own (`cpu` cores), for pods pinned to it: a scenario that drains
    /// or deletes a node makes its own.
    pub fn node(&self, name: &str, cpu: &str) -> Result<()> {
        self.apply(&json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "e2e": "true"}}}))?;
        let now = jiff::Timestamp::now().to_string();
        let status = json!({"status": {
            "capacity": {"cpu": cpu, "memory": "8Gi", "pods": "20"},
            "allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "20"},
            // As a kubelet reports them: Agones gives a game server its node's address.
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e",
                "lastHeartbeatTime": now, "lastTransitionTime": now}]}});
        self.kubectl(&["patch", "node", name, "--subresource=status", "--type=merge", "-p", &status.to_string()])?;
        // Schedulable, and none of the taints a scenario run before left (a drain's cordon, an
        // autoscaler's mark that the node is going, not-ready): only the scenario's own pods
        // land there (pinned, or tolerating this one).
        let spec = json!({"spec": {"unschedulable": null, "taints": [{"key": "e2e", "value": "only", "effect": "NoSchedule"}]}});
        self.kubectl(&["patch", "node", name, "--type=merge", "-p", &spec.to_string()]).map(drop)
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.kubelet.stop_all();
        if let Some(plane) = &self.control_plane
            && std::env::var_os("BUSYGUARD_E2E_KEEP").is_none()
        {
            let _ = Command::new(plane.harness.join("down.sh")).arg("--wipe").env("K8S_DIR", &plane.dir).status();
        }
    }
}

impl ControlPlane {
    /// `up.sh` of `K8S_HARNESS` (default the project's own, `tests/e2e/k8s`), with `K8S_BIN`
    /// passed through: the binaries of `../shared/k8s` where there are, else the upstream
    /// release's, downloaded once into `target/k8s`.
    fn start() -> Result<ControlPlane> {
        let harness = std::env::var("K8S_HARNESS")
            .map(PathBuf::from)
            .unwrap_or_else(|_| Path::new(ROOT).join("tests").join("e2e").join("k8s"));
        ensure!(
            harness.join("up.sh").exists(),
            "no control plane: {} has no up.sh; set K8S_HARNESS to a folder that has, or \
             BUSYGUARD_E2E_KUBECONFIG to a cluster that reaches this machine's loopback",
            harness.display()
        );
        let dir = PathBuf::from(std::env::var("K8S_DIR").unwrap_or_else(|_| "/tmp/busyguard-e2e-k8s".into()));
        if TcpStream::connect("127.0.0.1:6443").is_ok() && !dir.join("apiserver.pid").exists() {
            bail!("port 6443 is taken by another control plane: stop it (its down.sh) and run again");
        }
        let mut up = Command::new(harness.join("up.sh"));
        // A terminating busyguard pod stays until its process exits (the rig finishes it then),
        // as with a real kubelet; worker pods here have a grace period of 1 s.
        up.env("K8S_DIR", &dir).env("RIG_MAX_GRACE", "60");
        // ValidatingAdmissionPolicy (beta in 1.28), for the fence around busyguard's own token;
        // InPlacePodVerticalScaling (alpha in 1.28), for resizes of a busy pod's containers.
        up.env(
            "APISERVER_EXTRA",
            "--feature-gates=ValidatingAdmissionPolicy=true,InPlacePodVerticalScaling=true \
             --runtime-config=admissionregistration.k8s.io/v1beta1=true",
        );
        run(&mut up).context("starting the control plane")?;
        Ok(ControlPlane { harness, dir })
    }
}

/// A namespace of one scenario; deleted (without waiting) when dropped.
pub struct Namespace<'a> {
    rig: &'a Rig,
    pub name: String,
}

impl std::ops::Deref for Namespace<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.name
    }
}

impl Drop for Namespace<'_> {
    fn drop(&mut self) {
        let _ = self.rig.try_kubectl(&["delete", "namespace", &self.name, "--wait=false"]);
    }
}
