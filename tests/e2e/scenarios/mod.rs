//! Every scenario, by topic; `ALL` is the order they run in.

mod agones;
mod autoscalers;
mod chart;
mod deletes;
mod drains;
mod flags;
mod jobs;
mod kueue;
mod lifecycle;
mod neighbours;
mod nodes;
mod outages;
mod owner_chains;
mod owner_kinds;
mod owners;
mod queues;
mod readiness;
mod sandboxes;
mod scale;
mod upgrade;

use anyhow::Result;

use crate::rig::Rig;

pub type Scenario = fn(&Rig) -> Result<()>;

/// Each scenario named once: by its function, whose name is the scenario's.
macro_rules! scenarios {
    ($($module:ident::$name:ident),* $(,)?) => {
        &[$((stringify!($name), $module::$name as Scenario)),*]
    };
}

/// Every scenario, by the name of its function, in the order they run.
pub const ALL: &[(&str, Scenario)] = scenarios![
    flags::writes_that_cannot_matter_are_not_sent_to_busyguard,
    scale::a_scale_down_takes_the_idle_pods_and_waits_for_the_busy_ones,
    scale::a_frameworks_own_cost_decides_among_idle_pods,
    lifecycle::a_scheduler_preemption_of_a_busy_pod_is_refused_and_the_preemptor_waits,
    deletes::a_persons_delete_of_a_busy_pod_is_refused_and_carried_out_once_when_it_is_idle,
    deletes::a_workload_budget_refuses_a_delete_one_too_many,
    deletes::a_marked_pod_that_loses_its_busy_label_takes_the_kubelets_status_write,
    deletes::the_deschedulers_eviction_in_background_of_a_busy_pod_goes_once_idle,
    deletes::three_background_evictions_under_min_available_2_leave_two_pods_once_idle,
    deletes::two_replicas_never_let_a_budget_of_one_lose_two_pods,
    drains::a_drain_waits_for_the_busy_pod_and_completes_once_it_is_idle,
    owners::runners_and_game_servers_are_busy_from_their_owners_status,
    owner_kinds::an_owner_rule_whose_kind_is_not_served_takes_nothing_else_down,
    owner_kinds::agones_own_end_of_a_game_server_passes_while_busyguard_is_down,
    owner_kinds::runners_are_busy_on_every_release_of_actions_runner_controller,
    sandboxes::agent_sandboxes_are_busy_while_claimed_and_idle_in_the_warm_pool,
    agones::agones_drains_a_reusing_fleet_under_steady_allocations,
    agones::agones_servers_with_sessions_on_a_counter_are_busy_by_the_recipe,
    owner_chains::a_rule_reads_the_pod_and_the_owner_one_further_up,
    kueue::kueues_preemption_waits_for_a_busy_pod_where_the_namespace_asks,
    queues::a_drain_of_queue_workers_completes_within_a_task,
    queues::a_karpenter_disruption_of_queue_workers_completes_within_a_task,
    queues::a_cluster_autoscaler_scale_down_of_queue_workers_completes_within_a_task,
    queues::an_eks_node_group_update_of_queue_workers_completes_within_a_task,
    queues::a_drain_of_a_queue_worker_behind_the_agent_completes_and_cuts_no_task,
    queues::an_abandoned_drain_leaves_queue_workers_free_within_the_hold,
    queues::a_scale_down_of_queue_workers_completes_within_a_task,
    lifecycle::a_flip_to_busy_on_a_terminating_pod_is_refused,
    lifecycle::removing_the_busy_label_of_a_busy_pod_restores_it,
    autoscalers::other_autoscalers_keys_are_on_a_busy_pod_and_its_own_values_come_back,
    lifecycle::a_jobs_pod_is_busy_while_it_runs_where_the_namespace_says_so,
    jobs::a_job_past_its_deadline_ends_its_busy_pod,
    jobs::a_suspended_jobs_pod_goes,
    jobs::a_cronjob_replace_never_runs_two_generations,
    jobs::a_job_pod_that_exits_1_is_not_reported_lost,
    jobs::a_pending_job_pod_can_be_deleted,
    jobs::a_tekton_pods_sidecar_stop_and_eviction_go_through_once_its_steps_end,
    jobs::argo_and_tekton_controllers_end_their_own_busy_pods,
    lifecycle::an_update_that_would_restart_a_busy_pods_container_is_refused,
    lifecycle::protection_lapses_after_max_busy_and_the_pod_goes,
    lifecycle::a_busy_pod_lost_without_a_request_is_reported_once,
    flags::a_workers_own_token_flips_its_own_label_and_nothing_else,
    flags::a_delete_requested_mark_only_busyguard_may_write,
    neighbours::a_controller_removes_its_finalizer_from_a_busy_pod,
    neighbours::a_worker_cannot_shorten_its_neighbours_max_busy_in_a_namespace_without_any_busyguard_label,
    neighbours::a_mark_or_busy_since_written_through_pods_status_is_refused,
    neighbours::a_pod_with_a_key_of_an_older_version_is_warned_about,
    flags::the_fence_keeps_busyguards_own_token_to_the_pods_it_guards,
    flags::a_flip_by_server_side_apply_is_protected_and_restored,
    nodes::a_busy_node_stays_but_the_cloud_node_lifecycle_controller_deletes_it,
    nodes::a_busy_node_stays_but_karpenter_deletes_it,
    nodes::karpenters_consolidation_of_a_node_claim_waits_for_its_busy_pod,
    readiness::a_busy_unready_pod_is_released_from_its_replicaset_then_reaped_once,
    readiness::an_argo_rollouts_replicaset_releases_and_reaps_like_a_deployments,
    drains::a_namespaces_first_pod_brings_its_busy_pod_pdb_at_once,
    drains::an_opted_out_namespace_is_left_alone,
    drains::a_staged_install_guards_only_the_namespaces_opted_in,
    drains::audit_mode_lets_a_drain_take_a_busy_pod_and_says_what_it_would_have_done,
    outages::while_busyguard_is_down_only_busy_pods_wait_and_a_readiness_mode_deployment_of_ready_pods_scales_down,
    outages::a_rolling_restart_of_busyguard_fails_no_admission,
    outages::a_new_replica_takes_reviews_only_once_it_has_listed_the_pods,
    outages::certificate_rotation_under_traffic_fails_no_admission,
    upgrade::an_upgrade_from_the_previous_release_loses_no_busy_pod,
    chart::the_chart_installs_a_busyguard_that_guards_as_the_manifests_do,
    chart::an_upgrade_from_the_previous_releases_manifests_to_the_chart_loses_no_busy_pod,
    outages::busyguard_check_tells_an_install_that_works_from_one_that_does_not,
    outages::the_documented_uninstall_refuses_nothing_more_and_cleanup_leaves_nothing_behind,
];
