//! The commands the rig and the scenarios run: kubectl as the admin or as another identity
//! (a token bound to a pod, a kubeconfig of its own), and the processes the rig starts.

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

/// A token bound to `pod` of service account `sa` in `ns`.
pub fn bound_token(admin: &Path, ns: &str, sa: &str, pod: &str) -> Result<String> {
    let (ok, uid, err) = kubectl(admin, &["-n", ns, "get", "pod", pod, "-o", "jsonpath={.metadata.uid}"])?;
    ensure!(ok, "{err}");
    let name = format!("--bound-object-name={pod}");
    let uid = format!("--bound-object-uid={uid}");
    let args = ["-n", ns, "create", "token", sa, "--bound-object-kind=Pod", &name, &uid, "--duration=2h"];
    let (ok, token, err) = kubectl(admin, &args)?;
    ensure!(ok, "{err}");
    Ok(token.trim().to_string())
}

/// Writes to `path` a kubeconfig for `token` on the admin's control plane.
pub fn kubeconfig_for(admin: &Path, path: &Path, name: &str, token: &str) -> Result<PathBuf> {
    let (ok, raw, err) = kubectl(admin, &["config", "view", "--raw", "--minify", "-o", "json"])?;
    ensure!(ok, "{err}");
    let raw: Value = serde_json::from_str(&raw)?;
    let config = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "local", "cluster": raw["clusters"][0]["cluster"]}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": name}}],
        "current-context": "local",
    });
    std::fs::write(path, config.to_string())?;
    Ok(path.to_path_buf())
}

/// `N` free ports, each a different one: all are held until the last is picked.
pub fn free_ports<const N: usize>() -> Result<[SocketAddr; N]> {
    let listeners: Vec<TcpListener> = (0..N).map(|_| TcpListener::bind("127.0.0.1:0")).collect::<Result<_, _>>()?;
    let ports: Vec<SocketAddr> = listeners.iter().map(TcpListener::local_addr).collect::<Result<_, _>>()?;
    ports.try_into().map_err(|_| anyhow::anyhow!("{N} free ports"))
}

/// The child gets SIGKILL if the rig dies, so no busyguard outlives a run.
pub fn die_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes plain integers; nothing is allocated after fork.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

pub fn kubectl(kubeconfig: &Path, args: &[&str]) -> Result<(bool, String, String)> {
    let output = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--request-timeout=20s")
        .args(args)
        .output()
        .context("kubectl is needed")?;
    Ok((
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

pub fn kubectl_stdin(kubeconfig: &Path, args: &[&str], input: &str) -> Result<String> {
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child.stdin.take().context("stdin")?.write_all(input.as_bytes())?;
    let output = child.wait_with_output()?;
    ensure!(output.status.success(), "kubectl {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr));
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

pub fn run(command: &mut Command) -> Result<String> {
    let output = command.output().with_context(|| format!("{command:?}"))?;
    ensure!(
        output.status.success(),
        "{command:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
