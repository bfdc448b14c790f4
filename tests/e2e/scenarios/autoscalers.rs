//! Other autoscalers' own keys, as docs/autoscalers.md gives them (`--busy-annotation`,
//! `--busy-label`): on a busy pod beside Karpenter's and cluster-autoscaler's, and the pod's
//! own values back when it is idle.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::json;

use crate::rig::{ROOT, Rig, eventually, kubectl};
use crate::workers::{self, annotation, label};

pub const CAST_AI: &str = "autoscaling.cast.ai/removal-disabled";
pub const OCEAN: &str = "spotinst.io/restrict-scale-down";

/// CAST AI's annotation and Spot Ocean's label, installed as the docs say: a worker's own flip
/// to busy writes both (its own CAST AI value kept aside), a drain is still refused, a writer
/// that takes Ocean's label off a busy pod sees it put back, and the flip to idle brings back
/// exactly what the pod had.
pub fn other_autoscalers_keys_are_on_a_busy_pod_and_its_own_values_come_back(rig: &Rig) -> Result<()> {
    let args = [format!("--busy-annotation={CAST_AI}=true"), format!("--busy-label={OCEAN}=true")];
    rig.install_with_args(&[], &args)?;
    let outcome = keys_follow_the_flips(rig);
    rig.install_release(Path::new(ROOT), None)?;
    outcome
}

fn keys_follow_the_flips(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("vendor-keys")?;
    rig.kubectl(&["-n", &ns, "create", "serviceaccount", "worker"])?;
    rig.grant(&ns, "flags", "get,patch", "pods", &format!("{}:worker", &*ns))?;
    let mut pod = workers::pod(&ns, "task", None);
    pod["spec"]["serviceAccountName"] = json!("worker");
    pod["metadata"]["annotations"] = json!({CAST_AI: "false"});
    workers::start(rig, &pod, "task", 1)?;
    let token = rig.pod_token(&ns, "worker", "task")?;
    let worker = rig.kubeconfig_for(&format!("{}-task", &*ns), &token)?;
    let flip = |busy: bool| {
        let label = format!("busyguard.io/busy={busy}");
        let (ok, _, err) = kubectl(&worker, &["-n", &ns, "label", "pod", "task", &label, "--overwrite"])?;
        ensure!(ok, "the worker's own flip to {label}: {err}");
        rig.pod(&ns, "task")?.context("the pod is gone")
    };
    let busy = flip(true)?;
    ensure!(
        annotation(&busy, CAST_AI).as_deref() == Some("true") && label(&busy, OCEAN).as_deref() == Some("true"),
        "the busy pod lacks a vendor key: {}",
        busy["metadata"]
    );
    ensure!(annotation(&busy, "karpenter.sh/do-not-disrupt").is_some(), "Karpenter's is gone: {}", busy["metadata"]);
    let (evicted, err) = rig.evict(&ns, "task")?;
    ensure!(!evicted && err.contains("is busy since"), "a drain took the busy pod: {err}");
    rig.kubectl(&["-n", &ns, "label", "pod", "task", &format!("{OCEAN}-")])?;
    eventually("Ocean's label is put back on the busy pod", Duration::from_secs(20), || {
        Ok(rig.pod(&ns, "task")?.is_some_and(|p| label(&p, OCEAN).as_deref() == Some("true")))
    })?;
    let idle = flip(false)?;
    ensure!(
        annotation(&idle, CAST_AI).as_deref() == Some("false") && label(&idle, OCEAN).is_none(),
        "the idle pod's own values did not come back: {}",
        idle["metadata"]
    );
    let left: Vec<&String> = idle["metadata"]["annotations"]
        .as_object()
        .map(|a| a.keys().filter(|k| k.starts_with("busyguard.io/idle-") || *k == "busyguard.io/busy-since").collect())
        .unwrap_or_default();
    ensure!(left.is_empty(), "busyguard's saved values left on the idle pod: {left:?}");
    Ok(())
}
