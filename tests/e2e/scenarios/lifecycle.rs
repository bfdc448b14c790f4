//! A busy pod's life: protection that runs out, the label removed, a flip while terminating,
//! a loss busyguard could not refuse, and the scheduler's preemption.

use std::time::Duration;

use anyhow::{Result, ensure};
use serde_json::json;

use crate::rig::{Rig, eventually, throughout};
use crate::workers::{self, annotation, flip, label};

/// With `busyguard.io/max-busy: 1m`, protection lapses: the sweep takes the protected label and
/// busyguard's annotations off, and a delete goes through.
pub fn protection_lapses_after_max_busy_and_the_pod_goes(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("lapse")?;
    let mut pod = workers::pod(&ns, "task", None);
    // The shortest a pod's own max-busy may be (busyguard's --min-max-busy, as shipped).
    pod["metadata"]["annotations"] = json!({"busyguard.io/max-busy": "1m"});
    workers::start(rig, &pod, "task", 1)?;
    flip(rig, &ns, "task", true)?;
    eventually("the sweep takes the protected label off", Duration::from_secs(110), || {
        Ok(rig.pod(&ns, "task")?.is_some_and(|p| {
            label(&p, "busyguard.io/protected").is_none() && annotation(&p, "karpenter.sh/do-not-disrupt").is_none()
        }))
    })?;
    rig.kubectl(&["-n", &ns, "delete", "pod", "task", "--wait=false"])?;
    // Audit lines reach the file a few ms after the sweep acted.
    eventually("the lapse is audited", Duration::from_secs(5), || Ok(!rig.audited(&ns, "task", "lapsed").is_empty()))?;
    Ok(())
}

/// Removing the busy label of a busy pod gives it back as an idle one: busyguard's annotations
/// and protected label go, and nothing is reported lost.
pub fn removing_the_busy_label_of_a_busy_pod_restores_it(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("unlabel")?;
    workers::start(rig, &workers::pod(&ns, "task", None), "task", 1)?;
    flip(rig, &ns, "task", true)?;
    rig.kubectl(&["-n", &ns, "label", "pod", "task", "busyguard.io/busy-"])?;
    eventually("busyguard's marks are off", Duration::from_secs(20), || {
        Ok(rig.pod(&ns, "task")?.is_some_and(|p| {
            label(&p, "busyguard.io/protected").is_none()
                && annotation(&p, "busyguard.io/busy-since").is_none()
                && annotation(&p, "controller.kubernetes.io/pod-deletion-cost").is_none()
        }))
    })?;
    rig.kubectl(&["-n", &ns, "delete", "pod", "task", "--wait=false"])?;
    std::thread::sleep(Duration::from_secs(2));
    ensure!(rig.audited(&ns, "task", "lost").is_empty(), "a relabelled pod was reported lost");
    Ok(())
}

/// A flip to busy on a pod being deleted is refused (409): the worker must not start the task.
pub fn a_flip_to_busy_on_a_terminating_pod_is_refused(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("terminating")?;
    let mut pod = workers::pod(&ns, "task", None);
    pod["metadata"]["finalizers"] = json!(["e2e.busyguard.io/hold"]);
    workers::start(rig, &pod, "task", 1)?;
    rig.kubectl(&["-n", &ns, "delete", "pod", "task", "--wait=false"])?;
    let (ok, _, err) =
        rig.try_kubectl(&["-n", &ns, "label", "pod", "task", "busyguard.io/busy=true", "--overwrite"])?;
    let release = r#"{"metadata":{"finalizers":null}}"#;
    rig.kubectl(&["-n", &ns, "patch", "pod", "task", "--type=merge", "-p", release])?;
    ensure!(!ok, "a terminating pod turned busy");
    ensure!(err.contains("Conflict") || err.contains("409"), "not a 409: {err}");
    Ok(())
}

/// A busy pod that fails without any request (the kubelet's node-pressure eviction) is reported
/// lost exactly once, though two replicas see it.
pub fn a_busy_pod_lost_without_a_request_is_reported_once(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("loss")?;
    workers::start(rig, &workers::pod(&ns, "task", None), "task", 1)?;
    flip(rig, &ns, "task", true)?;
    let evicted = json!({"status": {"phase": "Failed", "reason": "Evicted",
        "message": "The node was low on resource: memory."}});
    rig.kubectl(&[
        "-n",
        &ns,
        "patch",
        "pod",
        "task",
        "--subresource=status",
        "--type=merge",
        "-p",
        &evicted.to_string(),
    ])?;
    eventually("the loss is audited", Duration::from_secs(20), || Ok(!rig.audited(&ns, "task", "lost").is_empty()))?;
    std::thread::sleep(Duration::from_secs(3));
    let lost = rig.audited(&ns, "task", "lost");
    ensure!(lost.len() == 1, "the loss was audited {} times across the replicas, not once", lost.len());
    let events = rig.get(&["-n", &ns, "events", "--field-selector", "reason=BusyPodLost"])?;
    ensure!(events["items"].as_array().is_some_and(|e| e.len() == 1), "not one BusyPodLost Event: {events}");
    Ok(())
}

/// The scheduler picks a busy pod as its victim: the preemption is refused and the preemptor
/// stays Pending. (The scheduler tries again on its own schedule: on a change in the cluster
/// that may make room, at the latest after 5 minutes; a victim's flip to idle is not such a
/// change, so this waits no further.)
pub fn a_scheduler_preemption_of_a_busy_pod_is_refused_and_the_preemptor_waits(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("preemption")?;
    let node = "e2e-small";
    rig.node(node, "1")?;
    rig.apply(&json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": "e2e-urgent"}, "value": 100000}))?;
    let pinned = |name: &str, priority: Option<&str>| {
        let mut pod = workers::pod(&ns, name, None);
        pod["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": node});
        pod["spec"]["tolerations"] = json!([{"key": "e2e", "operator": "Exists", "effect": "NoSchedule"}]);
        pod["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "600m"}});
        if let Some(priority) = priority {
            pod["spec"]["priorityClassName"] = json!(priority);
            pod["metadata"]["labels"] = json!({"app": name});
        }
        pod
    };
    workers::start(rig, &pinned("victim", None), "victim", 1)?;
    // A victim that has run a while, as the scheduler's cache knows it: this scheduler (1.28.4)
    // then writes its preemptor's status over the victim's, Pending with no containers
    // (kubernetes#126644), just before the delete busyguard is asked about.
    std::thread::sleep(Duration::from_secs(2));
    flip(rig, &ns, "victim", true)?;
    rig.apply(&pinned("urgent", Some("e2e-urgent")))?;
    eventually("the scheduler's preemption is refused", Duration::from_secs(30), || {
        Ok(rig.audited(&ns, "victim", "denied").iter().any(|l| l["user"] == "system:kube-scheduler"))
    })?;
    throughout("the busy victim stays and the preemptor waits", Duration::from_secs(5), || {
        let urgent = rig.pod(&ns, "urgent")?.unwrap_or_default();
        Ok(rig.live_pods(&ns, "victim")? == ["victim"] && urgent["status"]["phase"] == "Pending")
    })?;
    Ok(())
}

/// An update that would restart a busy pod's task container is refused until the pod is idle:
/// a new image (`kubectl set image`), and a resize its resize policy restarts the container for
/// (InPlacePodVerticalScaling, on in this control plane); a resize in place and any other change
/// go through, and an idle pod changes freely.
pub fn an_update_that_would_restart_a_busy_pods_container_is_refused(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("restart")?;
    let mut pod = workers::pod(&ns, "task", None);
    pod["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "100m", "memory": "64Mi"}});
    pod["spec"]["containers"][0]["resizePolicy"] = json!([
        {"resourceName": "cpu", "restartPolicy": "NotRequired"},
        {"resourceName": "memory", "restartPolicy": "RestartContainer"}]);
    workers::start(rig, &pod, "task", 1)?;
    flip(rig, &ns, "task", true)?;
    let resize = |resource: &str, value: &str| {
        let patch = json!({"spec": {"containers": [{"name": "worker", "resources": {"requests": {resource: value}}}]}});
        rig.try_kubectl(&["-n", &ns, "patch", "pod", "task", "-p", &patch.to_string()])
    };
    let (ok, _, err) = rig.try_kubectl(&["-n", &ns, "set", "image", "pod/task", "worker=example.com/worker:2"])?;
    ensure!(!ok && err.contains("would restart its container"), "a busy pod's image changed: {err}");
    let (ok, _, err) = resize("memory", "128Mi")?;
    ensure!(
        !ok && err.contains("would restart its container"),
        "a restarting resize of a busy pod went through: {err}"
    );
    let (ok, _, err) = resize("cpu", "200m")?;
    ensure!(ok, "a resize in place of a busy pod was refused: {err}");
    rig.kubectl(&["-n", &ns, "label", "pod", "task", "team=b"])?;
    flip(rig, &ns, "task", false)?;
    let (ok, _, err) = rig.try_kubectl(&["-n", &ns, "set", "image", "pod/task", "worker=example.com/worker:2"])?;
    ensure!(ok, "an idle pod's image could not change: {err}");
    Ok(())
}

/// In a namespace labelled `busyguard.io/run-to-completion=true`, a Job's pod is busy for its
/// whole run with nothing in the Job's template: busyguard labels it busy at its creation and
/// writes Karpenter's and cluster-autoscaler's annotations, so its eviction is refused; once it
/// has finished it goes at once. A Job's pod in a namespace without the label is left alone.
pub fn a_jobs_pod_is_busy_while_it_runs_where_the_namespace_says_so(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("jobs")?;
    let plain = rig.namespace("jobs-plain")?;
    rig.kubectl(&["label", "namespace", &ns, "busyguard.io/run-to-completion=true"])?;
    let job = |namespace: &str| {
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "import", "namespace": namespace},
            "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": "example.com/worker"}]}}}})
    };
    let running = |namespace: &str| -> Result<Option<serde_json::Value>> {
        let pods = rig.get(&["-n", namespace, "pods", "-l", "batch.kubernetes.io/job-name=import"])?;
        let pod = pods["items"].as_array().and_then(|p| p.first()).cloned();
        Ok(pod.filter(|p| p["status"]["phase"] == "Running"))
    };
    for namespace in [&*ns, &*plain] {
        rig.apply(&job(namespace))?;
    }
    let mut pod = serde_json::Value::Null;
    eventually("the Job's pod runs", Duration::from_secs(60), || {
        pod = running(&ns)?.unwrap_or_default();
        Ok(!pod.is_null())
    })?;
    let name = pod["metadata"]["name"].as_str().unwrap_or_default().to_string();
    ensure!(label(&pod, "busyguard.io/busy").as_deref() == Some("true"), "not busy: {}", pod["metadata"]);
    ensure!(annotation(&pod, "karpenter.sh/do-not-disrupt").is_some(), "{}", pod["metadata"]);
    ensure!(annotation(&pod, "cluster-autoscaler.kubernetes.io/safe-to-evict").as_deref() == Some("false"));
    let (ok, err) = rig.evict(&ns, &name)?;
    ensure!(!ok && err.contains("is busy since"), "a running Job's pod was evicted: {err}");
    let mut other = serde_json::Value::Null;
    eventually("the other namespace's Job pod runs", Duration::from_secs(60), || {
        other = running(&plain)?.unwrap_or_default();
        Ok(!other.is_null())
    })?;
    ensure!(label(&other, "busyguard.io/busy").is_none(), "a Job's pod was made busy where no one said so");
    // The task finishes (as its kubelet would say): the pod is free at once.
    let done = json!({"status": {"phase": "Succeeded"}});
    rig.kubectl(&["-n", &ns, "patch", "pod", &name, "--subresource=status", "--type=merge", "-p", &done.to_string()])?;
    eventually("the finished pod is deletable", Duration::from_secs(20), || {
        Ok(rig.try_kubectl(&["-n", &ns, "delete", "pod", &name, "--dry-run=server"])?.0)
    })
}
