//! busyguard installed by its Helm chart (`charts/busyguard`, rendered as `helm install` renders
//! it) instead of its kustomize manifests: the same scenarios, through the chart.

use anyhow::Result;

use super::{deletes, drains, owners, upgrade};
use crate::rig::Rig;

/// The chart's install guards as the manifests' does, and its `helm test` passes: a drain waits for the busy pod, a person's
/// delete of a busy pod is deferred, and runners and game servers are busy from their owners'
/// status (the chart's `actionsRunnerController` and `agones` values).
pub fn the_chart_installs_a_busyguard_that_guards_as_the_manifests_do(rig: &Rig) -> Result<()> {
    rig.through_chart(|| {
        rig.install_release(std::path::Path::new(crate::rig::ROOT), None)?;
        // `helm test`: busyguard check, from the release's own image and service account.
        let said = rig.helm_test()?;
        anyhow::ensure!(said.contains("busyguard answers"), "helm test said: {said}");
        drains::a_drain_waits_for_the_busy_pod_and_completes_once_it_is_idle(rig)?;
        deletes::a_persons_delete_of_a_busy_pod_is_refused_and_carried_out_once_when_it_is_idle(rig)?;
        owners::runners_and_game_servers_are_busy_from_their_owners_status(rig)
    })
}

/// The upgrade from the previous release's manifests to this release's chart, under a scale-down
/// and a drain that keep asking: no busy pod goes.
pub fn an_upgrade_from_the_previous_releases_manifests_to_the_chart_loses_no_busy_pod(rig: &Rig) -> Result<()> {
    rig.through_chart(|| upgrade::an_upgrade_from_the_previous_release_loses_no_busy_pod(rig))
}
