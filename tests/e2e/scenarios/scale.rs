//! Scale-downs: the ReplicaSet controller's own choice, steered by the deletion cost.

use std::time::Duration;

use anyhow::{Result, ensure};

use crate::rig::{Rig, eventually, throughout};
use crate::workers::{self, annotation, flip, label};

/// `kubectl scale` 4 → 1 with 2 busy pods: exactly the 2 idle ones go; the busy ones stay while
/// busy (the ReplicaSet records FailedDelete and retries), and one goes as soon as it is idle.
pub fn idle_first_then_waits(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("scale-down")?;
    let pods = workers::start(rig, &workers::deployment(&ns, "worker", 4), "worker", 4)?;
    let (busy, idle) = (&pods[..2], &pods[2..]);
    for pod in busy {
        flip(rig, &ns, pod, true)?;
        let seen = rig.pod(&ns, pod)?.unwrap();
        ensure!(annotation(&seen, "busyguard.io/busy-since").is_some(), "{pod}: no busy-since after the flip");
        ensure!(
            annotation(&seen, "controller.kubernetes.io/pod-deletion-cost").is_some(),
            "{pod}: no deletion cost after the flip"
        );
        ensure!(label(&seen, "busyguard.io/protected").as_deref() == Some("true"), "{pod}: not labelled protected");
    }
    rig.kubectl(&["-n", &ns, "scale", "deployment/worker", "--replicas=1"])?;
    eventually("only the busy pods left", Duration::from_secs(30), || Ok(rig.live_pods(&ns, "worker")? == busy))?;
    for pod in idle {
        ensure!(rig.pod(&ns, pod)?.is_none_or(|p| !p["metadata"]["deletionTimestamp"].is_null()), "{pod} stayed");
    }
    eventually("the ReplicaSet records that it could not delete", Duration::from_secs(20), || {
        let events = rig.get(&["-n", &ns, "events", "--field-selector", "reason=FailedDelete"])?;
        Ok(events["items"].as_array().is_some_and(|e| !e.is_empty()))
    })?;
    throughout("both busy pods stay", Duration::from_secs(3), || Ok(rig.live_pods(&ns, "worker")? == busy))?;
    flip(rig, &ns, &busy[0], false)?;
    eventually("the pod that went idle goes", Duration::from_secs(30), || {
        Ok(rig.live_pods(&ns, "worker")? == [busy[1].clone()])
    })?;
    let refused = busy.iter().flat_map(|pod| rig.audited(&ns, pod, "denied")).collect::<Vec<_>>();
    ensure!(
        refused.iter().any(|l| l["user"] == "system:serviceaccount:kube-system:replicaset-controller"),
        "no audit line for the ReplicaSet controller's refused delete"
    );
    Ok(())
}
