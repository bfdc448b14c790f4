//! An upgrade from the previous release, as the CHANGELOG and docs/operations.md say to make it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Result, ensure};
use serde_json::json;

use super::readiness::turn_not_ready;
use crate::rig::{PREVIOUS_IMAGE, ROOT, Rig, eventually};
use crate::workers::{self, flip, label};

/// The previous release: 0.3.0 (CHANGELOG.md; its commit, as releases are not tagged).
const PREVIOUS_RELEASE: &str = "4f98fe3";

/// The previous release installed from its own commit's build and manifests, pods busy by its
/// keys (the label, and readiness mode) under a scale-down that keeps asking and a drain's
/// evictions every half second; then this release applied over it, as the upgrade steps say
/// (the whole overlay at once: the webhooks change at once, the Deployment rolls). No busy pod
/// goes at any moment, each is protected by this release after, and once idle they go.
pub fn an_upgrade_from_the_previous_release_loses_no_busy_pod(rig: &Rig) -> Result<()> {
    let previous = Rig::previous_release(PREVIOUS_RELEASE)?;
    rig.install_release(&previous, Some(&format!("{PREVIOUS_IMAGE}{PREVIOUS_RELEASE}")))?;
    let upgraded = upgrade_under_load(rig);
    // Whatever happened, the next scenarios find this release installed.
    rig.install_release(std::path::Path::new(ROOT), None)?;
    upgraded
}

fn upgrade_under_load(rig: &Rig) -> Result<()> {
    let ns = rig.namespace("upgrade")?;
    let labelled = workers::start(rig, &workers::deployment(&ns, "worker", 3), "worker", 3)?;
    let busy = [labelled[0].clone(), labelled[1].clone()];
    for pod in &busy {
        flip(rig, &ns, pod, true)?;
    }
    let mut readiness = workers::deployment(&ns, "reader", 1);
    readiness["spec"]["template"]["metadata"]["labels"]["busyguard.io/busy"] = json!("when-unready");
    let reader = workers::start(rig, &readiness, "reader", 1)?.remove(0);
    turn_not_ready(rig, &ns, &reader)?;
    let guarded: Vec<&str> = busy.iter().map(String::as_str).chain([reader.as_str()]).collect();
    eventually("the previous release protects the busy pods", Duration::from_secs(30), || {
        Ok(guarded.iter().all(|pod| {
            rig.pod(&ns, pod)
                .ok()
                .flatten()
                .is_some_and(|p| label(&p, "busyguard.io/protected").as_deref() == Some("true"))
        }))
    })?;
    // As a cluster running the previous release has it: its busy-pod PDB, made on its sweep. That
    // release closes its keep-alive connections at SIGTERM at once (no shutdown delay before
    // 0.3.0), so an eviction sent on one in that instant fails, and its webhook lets it through
    // to the PDB.
    rig.busy_pdb_made(&ns)?;
    // The ReplicaSet takes the idle pod and keeps asking for the busy ones.
    rig.kubectl(&["-n", &ns, "scale", "deployment/worker", "--replicas=0"])?;
    eventually("the idle worker goes", Duration::from_secs(30), || Ok(rig.live_pods(&ns, "worker")? == busy))?;

    let upgrading = AtomicBool::new(true);
    let evictions = std::thread::scope(|scope| {
        let drain = scope.spawn(|| -> Result<usize> {
            let mut refused = 0;
            while upgrading.load(Ordering::Relaxed) {
                for pod in &guarded {
                    let (evicted, _) = rig.evict(&ns, pod)?;
                    ensure!(!evicted, "{pod} was evicted busy during the upgrade");
                    refused += 1;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            Ok(refused)
        });
        let upgraded = rig.install_release(std::path::Path::new(ROOT), None);
        upgrading.store(false, Ordering::Relaxed);
        let refused = drain.join().map_err(|_| anyhow::anyhow!("the drain panicked"))?;
        upgraded.and(refused)
    })?;
    ensure!(evictions >= 10, "only {evictions} evictions were tried during the upgrade");

    for pod in &guarded {
        let live = rig.pod(&ns, pod)?.is_some_and(|p| p["metadata"]["deletionTimestamp"].is_null());
        ensure!(live, "{pod}: busy, and gone or terminating after the upgrade");
    }
    let (ok, _, _) = rig.try_kubectl(&["-n", &ns, "delete", "pod", &busy[0], "--dry-run=server"])?;
    ensure!(!ok, "this release let a person delete a busy pod");
    ensure!(!rig.evict(&ns, &reader)?.0, "this release let a busy readiness-mode pod be evicted");
    for pod in &busy {
        flip(rig, &ns, pod, false)?;
    }
    eventually("once idle, the scale-down completes", Duration::from_secs(45), || {
        Ok(rig.live_pods(&ns, "worker")?.is_empty())
    })
}
