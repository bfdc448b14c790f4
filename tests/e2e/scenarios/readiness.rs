//! Compatibility mode: readiness as the busy signal (`busyguard.io/busy: when-unready`).

use std::time::Duration;

use anyhow::{Result, ensure};
use serde_json::json;

use crate::rig::{Rig, eventually};
use crate::workers::{self, annotation, label};

/// A scale-down that picks a busy (NotReady) pod completes: busyguard releases the pod from its
/// ReplicaSet, and deletes it once it is Ready again, exactly once.
pub fn a_busy_unready_pod_is_released_then_reaped(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("readiness")?;
    let mut workload = workers::deployment(&ns, "worker", 2);
    workload["spec"]["template"]["metadata"]["labels"]["busyguard.io/busy"] = json!("when-unready");
    let pods = workers::start(rig, &workload, "worker", 2)?;
    // This kubelet turns a pod Ready as it starts it; a real one only after a probe, and NotReady
    // again a probe period (at least a second) later. Busy is NotReady after having been Ready.
    std::thread::sleep(Duration::from_millis(1100));
    let busy = &pods[0];
    rig.kubectl(&["-n", &ns, "annotate", "pod", busy, "k8s-local/ready=false", "--overwrite"])?;
    eventually("the pod turns NotReady", Duration::from_secs(20), || {
        Ok(rig.pod(&ns, busy)?.is_some_and(|p| !workers::is_ready(&p)))
    })?;
    rig.kubectl(&["-n", &ns, "scale", "deployment/worker", "--replicas=1"])?;
    eventually("busyguard releases the busy pod from its ReplicaSet", Duration::from_secs(30), || {
        Ok(rig.pod(&ns, busy)?.is_some_and(|p| {
            label(&p, "pod-template-hash").is_none()
                && annotation(&p, "busyguard.io/released-from").is_some()
                && p["metadata"]["ownerReferences"].as_array().is_none_or(|o| o.is_empty())
        }))
    })?;
    eventually("the scale-down completes", Duration::from_secs(30), || {
        let deployment = rig.get(&["-n", &ns, "deployment", "worker"])?;
        Ok(deployment["status"]["replicas"] == 1 && deployment["status"]["readyReplicas"] == 1)
    })?;
    ensure!(rig.pod(&ns, busy)?.is_some(), "the busy pod was deleted");
    rig.kubectl(&["-n", &ns, "annotate", "pod", busy, "k8s-local/ready=true", "--overwrite"])?;
    eventually("the released pod goes once Ready", Duration::from_secs(30), || Ok(rig.pod(&ns, busy)?.is_none()))?;
    std::thread::sleep(Duration::from_secs(2));
    let reaped = rig.audited(&ns, busy, "deleted-when-idle");
    ensure!(reaped.len() == 1, "the released pod was deleted {} times, not once", reaped.len());
    Ok(())
}
