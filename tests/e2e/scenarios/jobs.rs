//! Run-to-completion pods (a namespace labelled busyguard.io/run-to-completion=true): protected
//! from the cluster, never from their own controller; finished and never-started pods never wait.

use std::time::Duration;

use anyhow::{Result, ensure};
use serde_json::{Value, json};

use crate::rig::{Namespace, Rig, eventually, throughout};
use crate::workers::{annotation, label};

/// A namespace whose Jobs' (and TaskRuns', Workflows') pods are busy while they run.
pub(super) fn run_to_completion<'r>(rig: &'r Rig, name: &str) -> Result<Namespace<'r>> {
    let ns = rig.namespace(name)?;
    rig.kubectl(&["label", "namespace", &ns, "busyguard.io/run-to-completion=true"])?;
    Ok(ns)
}

/// A Job `name` of one pod, with `spec` merged into the Job's spec.
pub(super) fn job(ns: &str, name: &str, spec: Value) -> Value {
    let mut job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": ns},
        "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "example.com/worker"}]}}}});
    json_patch::merge(&mut job["spec"], &spec);
    job
}

/// The Job's pods, not being deleted.
pub(super) fn job_pods(rig: &Rig, ns: &str, job: &str) -> Result<Vec<Value>> {
    let pods = rig.get(&["-n", ns, "pods", "-l", &format!("batch.kubernetes.io/job-name={job}")])?;
    Ok((pods["items"].as_array().cloned().unwrap_or_default().into_iter())
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .collect())
}

/// Starts the Job and returns its pod's name once it runs busy.
pub(super) fn running_busy(rig: &Rig, ns: &str, job: &Value) -> Result<String> {
    rig.apply(job)?;
    let name = job["metadata"]["name"].as_str().unwrap_or_default();
    let mut pod = Value::Null;
    eventually("the Job's pod runs", Duration::from_secs(60), || {
        pod = job_pods(rig, ns, name)?.into_iter().find(|p| p["status"]["phase"] == "Running").unwrap_or_default();
        Ok(!pod.is_null())
    })?;
    ensure!(label(&pod, "busyguard.io/busy").as_deref() == Some("true"), "not busy: {}", pod["metadata"]);
    Ok(pod["metadata"]["name"].as_str().unwrap_or_default().to_string())
}

/// The Job's pod is deleted by the Job controller and gone, its delete audited as its owner's.
pub(super) fn ended_by_its_job(rig: &Rig, ns: &str, pod: &str) -> Result<()> {
    eventually("the Job controller's delete goes through", Duration::from_secs(45), || {
        Ok(rig.pod(ns, pod)?.is_none())
    })?;
    audited_as_its_owners_end(rig, ns, pod)
}

/// An exempted delete's audit line is written just after busyguard answers, so it is awaited.
fn audited_as_its_owners_end(rig: &Rig, ns: &str, pod: &str) -> Result<()> {
    eventually(&format!("{pod}: the delete is audited as its owner's end"), Duration::from_secs(5), || {
        Ok(rig.audited(ns, pod, "exempted").iter().any(|a| a["reason"] == "owner-controller"))
    })
}

/// A Job past its activeDeadlineSeconds: the Job controller deletes its busy pod, and it goes.
pub fn a_job_past_its_deadline_ends_its_busy_pod(rig: &Rig) -> Result<()> {
    let ns = run_to_completion(rig, "job-deadline")?;
    let pod = running_busy(rig, &ns, &job(&ns, "deadline", json!({"activeDeadlineSeconds": 10})))?;
    ensure!(!rig.evict(&ns, &pod)?.0, "the running Job's pod was evicted");
    ended_by_its_job(rig, &ns, &pod)
}

/// A Job suspended (as Kueue preempts): the Job controller deletes its busy pod, and it goes.
pub fn a_suspended_jobs_pod_goes(rig: &Rig) -> Result<()> {
    let ns = run_to_completion(rig, "job-suspend")?;
    let pod = running_busy(rig, &ns, &job(&ns, "suspended", json!({})))?;
    rig.kubectl(&["-n", &ns, "patch", "job", "suspended", "--type=merge", "-p", r#"{"spec":{"suspend":true}}"#])?;
    ended_by_its_job(rig, &ns, &pod)
}

/// A CronJob with `concurrencyPolicy: Replace` whose run outlasts its schedule: the controller
/// deletes the running Job (background propagation) and starts the next; the garbage
/// collector's delete of the replaced run's busy pod goes through (audited as its owner's
/// deletion), so two generations never run side by side for long.
pub fn a_cronjob_replace_never_runs_two_generations(rig: &Rig) -> Result<()> {
    let ns = run_to_completion(rig, "cron-replace")?;
    let template = job(&ns, "unused", json!({}));
    rig.apply(
        &json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "nightly", "namespace": &*ns},
        "spec": {"schedule": "* * * * *", "concurrencyPolicy": "Replace", "jobTemplate": {"spec": template["spec"]}}}),
    )?;
    let running = || -> Result<Vec<Value>> {
        let pods = rig.get(&["-n", &ns, "pods", "-l", "batch.kubernetes.io/controller-uid"])?;
        Ok((pods["items"].as_array().cloned().unwrap_or_default().into_iter())
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null() && p["status"]["phase"] == "Running")
            .collect())
    };
    let mut first = Value::Null;
    eventually("the first run's pod runs busy", Duration::from_secs(90), || {
        first = running()?.into_iter().next().unwrap_or_default();
        Ok(!first.is_null())
    })?;
    ensure!(label(&first, "busyguard.io/busy").as_deref() == Some("true"), "not busy: {}", first["metadata"]);
    let first = first["metadata"]["name"].as_str().unwrap_or_default().to_string();
    eventually("the next run replaces it", Duration::from_secs(90), || {
        Ok(running()?.iter().any(|p| p["metadata"]["name"] != first.as_str()))
    })?;
    eventually("the replaced run's pod goes", Duration::from_secs(30), || Ok(rig.pod(&ns, &first)?.is_none()))?;
    rig.kubectl(&["-n", &ns, "delete", "cronjob", "nightly"])?;
    eventually(&format!("{first}: the delete is audited as its owner's deletion"), Duration::from_secs(5), || {
        Ok(rig.audited(&ns, &first, "exempted").iter().any(|a| a["reason"] == "owner-deleted"))
    })
}

/// A Job's pod whose task fails (exit 1, restartPolicy Never) ended by itself: no loss reported.
pub fn a_job_pod_that_exits_1_is_not_reported_lost(rig: &Rig) -> Result<()> {
    let ns = run_to_completion(rig, "job-failed")?;
    let pod = running_busy(rig, &ns, &job(&ns, "failing", json!({})))?;
    let failed = json!({"status": {"phase": "Failed", "containerStatuses": [{"name": "main", "image": "example.com/worker",
        "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": jiff::Timestamp::now().to_string()}}}]}});
    rig.kubectl(&["-n", &ns, "patch", "pod", &pod, "--subresource=status", "--type=merge", "-p", &failed.to_string()])?;
    throughout("no BusyPodLost Event, no lost audit line", Duration::from_secs(8), || {
        let events = rig.get(&["-n", &ns, "events", "--field-selector", "reason=BusyPodLost"])?;
        Ok(events["items"].as_array().is_none_or(Vec::is_empty) && rig.audited(&ns, &pod, "lost").is_empty())
    })
}

/// A Job's pod that cannot start (no node fits it) is Pending: no task runs, and a person's
/// delete goes through at once.
pub fn a_pending_job_pod_can_be_deleted(rig: &Rig) -> Result<()> {
    let ns = run_to_completion(rig, "job-pending")?;
    let unschedulable = json!({"template": {"spec": {"nodeSelector": {"e2e/no-such-node": "true"}}}});
    rig.apply(&job(&ns, "pending", unschedulable))?;
    let mut pod = Value::Null;
    eventually("the Job's pod is there, Pending", Duration::from_secs(30), || {
        pod = job_pods(rig, &ns, "pending")?.into_iter().next().unwrap_or_default();
        Ok(!pod.is_null())
    })?;
    ensure!(label(&pod, "busyguard.io/busy").as_deref() == Some("true"), "made busy at creation: {}", pod["metadata"]);
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let (ok, _, err) = rig.try_kubectl(&["-n", &ns, "delete", "pod", name, "--wait=false"])?;
    ensure!(ok, "a Pending pod's delete was refused: {err}");
    Ok(())
}

/// A Tekton TaskRun's pod (steps `step-*`, a sidecar), under the namespace's busy-pod PDB: a
/// step's image change of the busy pod and its eviction are refused; once its steps end, the pod
/// loses its protected label and Karpenter's do-not-disrupt though its sidecar runs on, Tekton's
/// sidecar stop (its image swapped for a no-op) goes through, and so does a drain's eviction.
pub fn a_tekton_pods_sidecar_stop_and_eviction_go_through_once_its_steps_end(rig: &Rig) -> Result<()> {
    let ns = run_to_completion(rig, "taskrun")?;
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "build-pod", "namespace": &*ns, "labels": {"tekton.dev/taskRun": "build", "app": "build"}},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "containers": [
            {"name": "step-build", "image": "example.com/build:1"},
            {"name": "sidecar-db", "image": "example.com/redis:7"}]}});
    rig.apply(&pod)?;
    eventually("the TaskRun's pod runs busy, protected and kept from Karpenter", Duration::from_secs(60), || {
        Ok(rig.pod(&ns, "build-pod")?.is_some_and(|p| {
            p["status"]["phase"] == "Running"
                && label(&p, "busyguard.io/busy").as_deref() == Some("true")
                && label(&p, "busyguard.io/protected").as_deref() == Some("true")
                && annotation(&p, "karpenter.sh/do-not-disrupt").as_deref() == Some("true")
        }))
    })?;
    let image = |container: usize, image: &str| {
        let patch = json!([{"op": "replace", "path": format!("/spec/containers/{container}/image"), "value": image}]);
        rig.try_kubectl(&["-n", &ns, "patch", "pod", "build-pod", "--type=json", "-p", &patch.to_string()])
    };
    // From then on the PDB refuses what the label still protects, whatever the webhook decides.
    rig.busy_pdb_made(&ns)?;
    let (ok, _, err) = image(0, "example.com/build:2")?;
    ensure!(!ok && err.contains("step-build"), "a busy step's restart went through: {err}");
    ensure!(!rig.evict(&ns, "build-pod")?.0, "a drain's eviction went through while the step ran");
    // The step ends, as the kubelet reports it; the sidecar runs on until Tekton stops it.
    let now = jiff::Timestamp::now().to_string();
    let ended = json!({"status": {"containerStatuses": [
        {"name": "step-build", "image": "example.com/build:1", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": now}}},
        {"name": "sidecar-db", "image": "example.com/redis:7", "imageID": "", "ready": true, "restartCount": 0,
            "started": true, "state": {"running": {"startedAt": now}}}]}});
    rig.kubectl(&[
        "-n",
        &ns,
        "patch",
        "pod",
        "build-pod",
        "--subresource=status",
        "--type=merge",
        "-p",
        &ended.to_string(),
    ])?;
    eventually(
        "with its steps ended, the pod is neither protected nor kept from Karpenter",
        Duration::from_secs(10),
        || {
            Ok(rig.pod(&ns, "build-pod")?.is_some_and(|p| {
                label(&p, "busyguard.io/protected").is_none() && annotation(&p, "karpenter.sh/do-not-disrupt").is_none()
            }))
        },
    )?;
    let (ok, _, err) = image(1, "gcr.io/tekton-releases/github.com/tektoncd/pipeline/cmd/nop")?;
    ensure!(ok, "Tekton's sidecar stop was refused: {err}");
    eventually("with its steps ended, a drain's eviction goes through", Duration::from_secs(20), || {
        Ok(rig.evict(&ns, "build-pod")?.0)
    })
}

/// An Argo Workflow's and a Tekton TaskRun's busy pods: a drain's eviction and a person's delete
/// are refused, and their own controllers' deletes (a stop, cancel or timeout: Tekton's
/// failTaskRun deletes the pod) go through, audited as the owner's, with the identities their
/// installs run as.
pub fn argo_and_tekton_controllers_end_their_own_busy_pods(rig: &Rig) -> Result<()> {
    let ns = run_to_completion(rig, "owners")?;
    for (pod, owner_label, controller) in [
        ("wf-step", "workflows.argoproj.io/workflow", ("argo", "argo")),
        ("run-pod", "tekton.dev/taskRun", ("tekton-pipelines", "tekton-pipelines-controller")),
    ] {
        let role = format!("e2e-owner-{}", controller.1);
        rig.grant_cluster(
            &role,
            json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "delete"]}]),
            controller.0,
            controller.1,
        )?;
        rig.apply(&json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": &*ns, "labels": {owner_label: "run-1"}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": "example.com/worker"}]}}))?;
        eventually("the pod runs busy", Duration::from_secs(60), || {
            Ok(rig.pod(&ns, pod)?.is_some_and(|p| {
                p["status"]["phase"] == "Running" && label(&p, "busyguard.io/busy").as_deref() == Some("true")
            }))
        })?;
        ensure!(!rig.evict(&ns, pod)?.0, "{pod}: a drain's eviction went through");
        let (ok, _, _) = rig.try_kubectl(&["-n", &ns, "delete", "pod", pod, "--dry-run=server"])?;
        ensure!(!ok, "{pod}: a person's delete went through");
        let user = format!("system:serviceaccount:{}:{}", controller.0, controller.1);
        let (ok, _, err) = rig.try_kubectl_as(&user, &["-n", &ns, "delete", "pod", pod, "--wait=false"])?;
        ensure!(ok, "{pod}: its own controller's delete was refused: {err}");
        audited_as_its_owners_end(rig, &ns, pod)?;
    }
    Ok(())
}
