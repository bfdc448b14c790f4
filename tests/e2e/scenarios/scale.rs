//! Scale-downs: the ReplicaSet controller's own choice, steered by the deletion cost.

use std::time::Duration;

use anyhow::{Result, ensure};
use serde_json::json;

use crate::rig::{Rig, eventually, kubectl, throughout};
use crate::workers::{self, annotation, flip, label};

/// `kubectl scale` 4 → 1 with 2 busy pods: exactly the 2 idle ones go; the busy ones stay while
/// busy (the ReplicaSet records FailedDelete and retries), and one goes as soon as it is idle.
pub fn a_scale_down_takes_the_idle_pods_and_waits_for_the_busy_ones(rig: &Rig) -> Result<()> {
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

/// A framework that steers its own scale-down by the deletion cost, as Spark 4.2's
/// DeploymentPodsAllocator does: the template stamps cost 0, the driver (a pod of its own
/// service account, not opted in) lowers the cost of the idle executors it chose with a
/// strategic-merge patch, then scales the Deployment. Those pods go, the busy one and the other
/// idle one stay: busyguard's refresh before the scale-down keeps an idle pod's own cost.
pub fn a_frameworks_own_cost_decides_among_idle_pods(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("framework-cost")?;
    rig.kubectl(&["-n", &ns, "create", "serviceaccount", "spark-driver"])?;
    let driver_rights =
        [("executors", "get,list,patch", "pods"), ("allocator", "get,patch,update", "deployments,deployments/scale")];
    for (role, verbs, resources) in driver_rights {
        rig.grant(&ns, role, verbs, resources, &format!("{}:spark-driver", &*ns))?;
    }
    let mut driver = workers::pod(&ns, "driver", None);
    driver["metadata"]["labels"] = json!({"app": "driver"});
    driver["spec"]["serviceAccountName"] = json!("spark-driver");
    workers::start(rig, &driver, "driver", 1)?;
    let mut executors = workers::deployment(&ns, "executor", 4);
    executors["spec"]["template"]["metadata"]["annotations"] =
        json!({"controller.kubernetes.io/pod-deletion-cost": "0"});
    let pods = workers::start(rig, &executors, "executor", 4)?;
    let (busy, chosen, kept) = (&pods[0], &pods[1..3], &pods[3]);
    flip(rig, &ns, busy, true)?;

    let token = rig.pod_token(&ns, "spark-driver", "driver")?;
    let as_driver = rig.kubeconfig_for(&format!("{}-driver", &*ns), &token)?;
    let lowered = r#"{"metadata":{"annotations":{"controller.kubernetes.io/pod-deletion-cost":"-1"}}}"#;
    for pod in chosen {
        let args = ["-n", &*ns, "patch", "pod", pod, "--type=strategic", "-p", lowered];
        let (ok, _, err) = kubectl(&as_driver, &args)?;
        ensure!(ok, "the driver could not lower {pod}'s cost: {err}");
    }
    let (ok, _, err) = kubectl(&as_driver, &["-n", &ns, "scale", "deployment/executor", "--replicas=2"])?;
    ensure!(ok, "the driver could not scale its executors: {err}");
    let mut left = vec![busy.clone(), kept.clone()];
    left.sort();
    eventually("the executors the driver chose go", Duration::from_secs(30), || {
        Ok(rig.live_pods(&ns, "executor")? == left)
    })?;
    throughout("the busy and the other idle executor stay", Duration::from_secs(3), || {
        Ok(rig.live_pods(&ns, "executor")? == left)
    })
}
