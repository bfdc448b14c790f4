//! Installing busyguard on the control plane: the kustomize base or the chart, with components,
//! arguments or a patch; a previous release's build; the rollout awaited, the fence applied.

use std::path::Path;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use super::*;

impl Rig {
    /// `manifests/base` as shipped, the webhooks by URL; returns once two replicas answer.
    pub(super) fn install(&self) -> Result<()> {
        let certs = self.work.join("certs");
        let _ = std::fs::remove_dir_all(&certs);
        run(Command::new(BUSYGUARD).args(["certs", "--dir"]).arg(&certs))?;
        Kubelet::run(self.kubelet.clone());
        self.install_release(Path::new(ROOT), None)
    }

    /// The base of the checkout at `root` applied whole, as `kubectl apply -k` does (the
    /// webhooks by URL), its Deployment's image set to `image` if given (this kubelet runs the
    /// build an image names: see `binary`); returns once two replicas of it answer. Over
    /// an install, this is an upgrade (or a downgrade): the webhooks change at once, while the
    /// Deployment rolls.
    pub fn install_release(&self, root: &Path, image: Option<&str>) -> Result<()> {
        if root == Path::new(ROOT) && image.is_none() && self.through_chart.load(Ordering::Relaxed) {
            return self.install_chart(&[], &[]);
        }
        self.install_rendered(rendered(&root.join("manifests/base"))?, image)
    }

    /// Runs `scenario` with this checkout installed from its Helm chart (`charts/busyguard`)
    /// wherever it would be from its manifests, then installs the manifests again.
    pub fn through_chart(&self, scenario: impl FnOnce() -> Result<()>) -> Result<()> {
        self.through_chart.store(true, Ordering::Relaxed);
        let outcome = scenario();
        self.through_chart.store(false, Ordering::Relaxed);
        self.install_release(Path::new(ROOT), None)?;
        outcome
    }

    /// The chart rendered as `helm install` renders it, with the value of each component, and
    /// applied as `install_release` applies a base: the rig's certificates are self-managed
    /// (the Secret is the rig's, the webhooks trust its CA).
    fn install_chart(&self, components: &[&str], args: &[String]) -> Result<()> {
        let known = ["actions-runner-controller", "agones", "agent-sandbox"];
        ensure!(components.iter().all(|c| known.contains(c)), "no value of the chart for {components:?}");
        let ca = std::fs::read_to_string(self.certs().join("ca.crt"))?;
        let values = json!({
            "certificates": {"source": "self-managed", "selfManaged": {"createSecret": false, "caCrt": ca}},
            "actionsRunnerController": {"enabled": components.contains(&"actions-runner-controller")},
            "agones": {"enabled": components.contains(&"agones")},
            "agentSandbox": {"enabled": components.contains(&"agent-sandbox")},
            "extraArgs": args,
        });
        let file = self.work.join("chart-values.json");
        std::fs::write(&file, values.to_string())?;
        let python_path = run(Command::new("sh").arg(Path::new(ROOT).join("scripts/helm-python.sh")))?;
        let output = Command::new("python3")
            .arg(Path::new(ROOT).join("scripts/chart.py"))
            .arg("render")
            .arg(&file)
            .env("PYTHONPATH", python_path.trim())
            .output()?;
        ensure!(output.status.success(), "the chart did not render: {}", String::from_utf8_lossy(&output.stderr));
        let list: Value = serde_json::from_slice(&output.stdout)?;
        self.install_rendered(list["items"].as_array().context("the chart's objects")?.clone(), None)
    }

    /// `helm test` of the release installed from the chart: its test hook's objects (`chart.py
    /// tests`, with the install's values) applied, and its Pod played as the kubelet runs it (the
    /// build its image names, its args) with a token of its own service account. What the check
    /// printed; an error with its output if it failed.
    pub fn helm_test(&self) -> Result<String> {
        let python_path = run(Command::new("sh").arg(Path::new(ROOT).join("scripts/helm-python.sh")))?;
        let output = Command::new("python3")
            .arg(Path::new(ROOT).join("scripts/chart.py"))
            .arg("tests")
            .arg(self.work.join("chart-values.json"))
            .env("PYTHONPATH", python_path.trim())
            .output()?;
        ensure!(
            output.status.success(),
            "the chart's tests did not render: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let list: Value = serde_json::from_slice(&output.stdout)?;
        let (pods, rest): (Vec<Value>, Vec<Value>) = list["items"]
            .as_array()
            .context("the test hook's objects")?
            .iter()
            .cloned()
            .partition(|o| o["kind"] == "Pod");
        let [pod] = pods.as_slice() else { anyhow::bail!("not one test Pod: {pods:?}") };
        self.apply(&json!({"apiVersion": "v1", "kind": "List", "items": rest}))?;
        let account = pod["spec"]["serviceAccountName"].as_str().context("the test Pod's service account")?;
        let token = self.kubectl(&["-n", "busyguard", "create", "token", account])?;
        let kubeconfig = self.kubeconfig_for(account, token.trim())?;
        let container = &pod["spec"]["containers"][0];
        let args: Vec<&str> =
            container["args"].as_array().context("its args")?.iter().filter_map(Value::as_str).collect();
        let checked = Command::new(binary(container["image"].as_str().unwrap_or_default()))
            .args(&args)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .env_remove("KUBECONFIG")
            .output()?;
        let said = format!("{}{}", String::from_utf8_lossy(&checked.stdout), String::from_utf8_lossy(&checked.stderr));
        ensure!(checked.status.success(), "helm test: busyguard {} failed: {said}", args.join(" "));
        Ok(said)
    }

    /// This checkout's base with `components` (under manifests/), applied as `install_release`
    /// applies a base: back to the base alone, `install_release(ROOT)` takes them away.
    pub fn install_with(&self, components: &[&str]) -> Result<()> {
        self.install_with_args(components, &[])
    }

    /// As `install_with`, with further arguments of busyguard's (a busy rule of the user's own,
    /// an integration switched on), added as an overlay adds them, or as the chart's `extraArgs`.
    pub fn install_with_args(&self, components: &[&str], args: &[String]) -> Result<()> {
        if self.through_chart.load(Ordering::Relaxed) {
            return self.install_chart(components, args);
        }
        let patches = if args.is_empty() { json!([]) } else { json!([args_patch(args)?]) };
        self.install_overlay(components, &format!("patches: {patches}"))
    }

    /// This checkout's base with `components`, and an overlay's `patches:` as a user writes them
    /// (YAML), applied as `install_release` applies a base.
    pub fn install_overlay(&self, components: &[&str], patches: &str) -> Result<()> {
        let overlay = self.work.join("overlay");
        std::fs::create_dir_all(&overlay)?;
        let overlay = overlay.canonicalize()?;
        // kustomize takes relative paths only.
        let up = "../".repeat(overlay.components().count() - 1);
        let manifests = format!("{up}{}/manifests", ROOT.trim_start_matches('/'));
        let components: Vec<String> = components.iter().map(|c| format!("  - {manifests}/{c}\n")).collect();
        let kustomization = format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {manifests}/base\n\
             components:\n{}{patches}\n",
            components.concat(),
        );
        std::fs::write(overlay.join("kustomization.yaml"), kustomization)?;
        self.install_rendered(rendered(&overlay)?, None)
    }

    fn install_rendered(&self, mut objects: Vec<Value>, image: Option<&str>) -> Result<()> {
        for object in &mut objects {
            if object["kind"] == "Deployment" && object["metadata"]["name"] == "busyguard" {
                // The rig's readinessProbe: the fake kubelet reads this annotation for Ready.
                object["spec"]["template"]["metadata"]["annotations"] = json!({"k8s-local/ready": "false"});
                if let Some(image) = image {
                    object["spec"]["template"]["spec"]["containers"][0]["image"] = json!(image);
                }
            }
        }
        let (webhooks, rest): (Vec<Value>, Vec<Value>) = objects.into_iter().partition(is_webhook_configuration);
        let (fence, rest): (Vec<Value>, Vec<Value>) = rest
            .into_iter()
            .partition(|o| o["kind"].as_str().is_some_and(|k| k.starts_with("ValidatingAdmissionPolicy")));
        self.apply(&json!({"apiVersion": "v1", "kind": "List", "items": rest}))?;
        if !self.exists("busyguard", "secret", "busyguard-tls")? {
            let certs = self.certs();
            self.kubectl(&[
                "-n",
                "busyguard",
                "create",
                "secret",
                "tls",
                "busyguard-tls",
                &format!("--cert={}", certs.join("tls.crt").display()),
                &format!("--key={}", certs.join("tls.key").display()),
            ])?;
        }
        if !fence.is_empty() {
            self.fence(fence)?;
        }
        let upgrade = !std::mem::replace(&mut *self.webhooks.lock().unwrap(), webhooks).is_empty();
        if upgrade {
            self.register_live()?;
        }
        self.rolled_out()?;
        if !upgrade {
            self.register_live()?;
        }
        Ok(())
    }

    /// Waits for busyguard's Deployment to roll out, two replicas of it answering.
    pub fn rolled_out(&self) -> Result<()> {
        let rollout = ["-n", "busyguard", "rollout", "status", "deployment/busyguard", "--timeout=120s"];
        self.kubectl(&rollout).with_context(|| self.busyguard_state())?;
        self.wait_for_replicas(2)
    }

    /// The checkout of `commit` (a release before this one), with busyguard built from it, kept
    /// under target/previous/COMMIT: its root, for `install_release`.
    pub fn previous_release(commit: &str) -> Result<PathBuf> {
        let dir = previous_build(commit);
        let src = dir.join("src");
        if dir.join("debug/busyguard").exists() {
            return Ok(src);
        }
        let known =
            Command::new("git").args(["-C", ROOT, "cat-file", "-e", &format!("{commit}^{{commit}}")]).status()?;
        ensure!(
            known.success(),
            "the previous release's commit {commit} is not in this clone (a shallow one?): `git fetch --unshallow`"
        );
        let _ = std::fs::remove_dir_all(&src);
        std::fs::create_dir_all(&src)?;
        let archive = format!("git -C '{ROOT}' archive {commit} | tar -x -C '{}'", src.display());
        ensure!(Command::new("sh").args(["-c", &archive]).status()?.success(), "{archive} failed");
        eprintln!("e2e: building busyguard {commit}, the previous release (once, into {})", dir.display());
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let built = Command::new(cargo)
            .args(["build", "--locked", "--bin", "busyguard", "--manifest-path"])
            .arg(src.join("Cargo.toml"))
            .arg("--target-dir")
            .arg(&dir)
            .status()?;
        ensure!(built.success(), "building busyguard {commit} failed");
        Ok(src)
    }

    /// The base's fence as shipped (v1, Kubernetes 1.30 and later), or as v1beta1 where only
    /// that is served (1.28 with the feature turned on): the same fields.
    fn fence(&self, objects: Vec<Value>) -> Result<()> {
        let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
        if self.apply(&list).is_err() {
            let beta =
                list.to_string().replace("admissionregistration.k8s.io/v1\"", "admissionregistration.k8s.io/v1beta1\"");
            kubectl_stdin(&self.admin, &["apply", "-f", "-"], &beta).context("the fence, as v1beta1")?;
        }
        Ok(())
    }

    /// Registers the webhook configurations of `overlay` (under manifests/) instead, by URL,
    /// trusting the live CA, applies its fence, and sets busyguard's Deployment's `env` as given
    /// (None: removed), waiting for its rollout: an install switched to another overlay's choices.
    pub fn switch_to(&self, overlay: &str, env: &[(&str, Option<&str>)]) -> Result<()> {
        let objects = rendered(&Path::new(ROOT).join("manifests").join(overlay))?;
        let is_fence = |o: &Value| o["kind"].as_str().is_some_and(|k| k.starts_with("ValidatingAdmissionPolicy"));
        self.fence(objects.iter().filter(|o| is_fence(o)).cloned().collect())?;
        *self.webhooks.lock().unwrap() = objects.into_iter().filter(is_webhook_configuration).collect();
        self.register_live()?;
        let mut args =
            vec!["-n".to_string(), "busyguard".into(), "set".into(), "env".into(), "deployment/busyguard".into()];
        args.extend(env.iter().map(|(name, value)| value.map_or(format!("{name}-"), |v| format!("{name}={v}"))));
        self.kubectl(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
        self.rolled_out()
    }
}

/// An overlay's patch (one item of its `patches:`, as JSON, which YAML reads) adding `args` to
/// busyguard's own: for an overlay of the user's own that needs further flags.
pub fn args_patch(args: &[String]) -> Result<Value> {
    let added: Vec<Value> = args
        .iter()
        .map(|arg| json!({"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": arg}))
        .collect();
    Ok(json!({"target": {"kind": "Deployment", "name": "busyguard"}, "patch": serde_json::to_string(&added)?}))
}
