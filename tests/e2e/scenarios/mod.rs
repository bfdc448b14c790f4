//! Every scenario, by topic; `ALL` is the order they run in.

mod agones;
mod deletes;
mod drains;
mod flags;
mod jobs;
mod lifecycle;
mod neighbours;
mod nodes;
mod outages;
mod owner_kinds;
mod owners;
mod queues;
mod readiness;
mod scale;
mod upgrade;

use anyhow::Result;

use crate::rig::Rig;

pub type Scenario = fn(&Rig) -> Result<()>;

pub const ALL: &[(&str, Scenario)] = &[
    ("writes_that_cannot_matter_are_not_sent_to_busyguard", flags::writes_that_cannot_matter_are_not_sent),
    ("a_scale_down_takes_the_idle_pods_and_waits_for_the_busy_ones", scale::idle_first_then_waits),
    ("a_frameworks_own_cost_decides_among_idle_pods", scale::a_frameworks_own_cost_decides_among_idle_pods),
    (
        "a_scheduler_preemption_of_a_busy_pod_is_refused_and_the_preemptor_waits",
        lifecycle::preemption_of_a_busy_pod_waits,
    ),
    ("a_persons_delete_of_a_busy_pod_is_refused_and_carried_out_once_when_it_is_idle", deletes::deferred_once),
    ("a_workload_budget_refuses_a_delete_one_too_many", deletes::the_workload_budget_refuses_one_too_many),
    (
        "a_marked_pod_that_loses_its_busy_label_takes_the_kubelets_status_write",
        deletes::a_marked_pod_that_loses_its_label_takes_the_kubelets_status_write,
    ),
    (
        "the_deschedulers_eviction_in_background_of_a_busy_pod_goes_once_idle",
        deletes::the_deschedulers_eviction_in_background_goes_once_idle,
    ),
    (
        "three_background_evictions_under_min_available_2_leave_two_pods_once_idle",
        deletes::background_evictions_keep_the_users_pod_disruption_budget,
    ),
    (
        "two_replicas_never_let_a_budget_of_one_lose_two_pods",
        deletes::two_replicas_never_let_a_budget_of_one_lose_two_pods,
    ),
    ("a_drain_waits_for_the_busy_pod_and_completes_once_it_is_idle", drains::drain_waits_for_the_busy_pod),
    (
        "runners_and_game_servers_are_busy_from_their_owners_status",
        owners::runners_and_game_servers_are_busy_from_their_owners_status,
    ),
    (
        "an_owner_rule_whose_kind_is_not_served_takes_nothing_else_down",
        owner_kinds::an_owner_rule_whose_kind_is_not_served_takes_nothing_else_down,
    ),
    (
        "agones_own_end_of_a_game_server_passes_while_busyguard_is_down",
        owner_kinds::agones_own_end_of_a_game_server_passes_while_busyguard_is_down,
    ),
    (
        "runners_are_busy_on_every_release_of_actions_runner_controller",
        owner_kinds::runners_are_busy_on_every_release_of_actions_runner_controller,
    ),
    (
        "agones_drains_a_reusing_fleet_under_steady_allocations",
        agones::agones_drains_a_reusing_fleet_under_steady_allocations,
    ),
    ("a_drain_of_queue_workers_completes_within_a_task", queues::a_drain_of_queue_workers_completes_within_a_task),
    (
        "a_karpenter_disruption_of_queue_workers_completes_within_a_task",
        queues::a_karpenter_disruption_of_queue_workers_completes_within_a_task,
    ),
    (
        "a_cluster_autoscaler_scale_down_of_queue_workers_completes_within_a_task",
        queues::a_cluster_autoscaler_scale_down_of_queue_workers_completes_within_a_task,
    ),
    (
        "a_drain_of_a_queue_worker_behind_the_agent_completes_and_cuts_no_task",
        queues::a_drain_of_a_queue_worker_behind_the_agent_completes_and_cuts_no_task,
    ),
    (
        "an_abandoned_drain_leaves_queue_workers_free_within_the_hold",
        queues::an_abandoned_drain_leaves_queue_workers_free_within_the_hold,
    ),
    (
        "a_scale_down_of_queue_workers_completes_within_a_task",
        queues::a_scale_down_of_queue_workers_completes_within_a_task,
    ),
    ("a_flip_to_busy_on_a_terminating_pod_is_refused", lifecycle::a_flip_on_a_terminating_pod_is_refused),
    ("removing_the_busy_label_of_a_busy_pod_restores_it", lifecycle::removing_the_label_restores_the_pod),
    (
        "a_jobs_pod_is_busy_while_it_runs_where_the_namespace_says_so",
        lifecycle::a_jobs_pod_is_busy_while_it_runs_by_the_namespaces_say,
    ),
    ("a_job_past_its_deadline_ends_its_busy_pod", jobs::a_job_past_its_deadline_ends_its_busy_pod),
    ("a_suspended_jobs_pod_goes", jobs::a_suspended_jobs_pod_goes),
    ("a_cronjob_replace_never_runs_two_generations", jobs::a_cronjob_replace_never_runs_two_generations),
    ("a_job_pod_that_exits_1_is_not_reported_lost", jobs::a_job_pod_that_exits_1_is_not_reported_lost),
    ("a_pending_job_pod_can_be_deleted", jobs::a_pending_job_pod_can_be_deleted),
    (
        "a_tekton_pods_sidecar_stop_and_eviction_go_through_once_its_steps_end",
        jobs::a_tekton_pods_sidecar_stop_goes_through,
    ),
    ("argo_and_tekton_controllers_end_their_own_busy_pods", jobs::argo_and_tekton_controllers_end_their_own_busy_pods),
    (
        "an_update_that_would_restart_a_busy_pods_container_is_refused",
        lifecycle::a_container_restarting_update_of_a_busy_pod_is_refused,
    ),
    ("protection_lapses_after_max_busy_and_the_pod_goes", lifecycle::protection_lapses_after_max_busy),
    ("a_busy_pod_lost_without_a_request_is_reported_once", lifecycle::a_loss_is_reported_once),
    ("a_workers_own_token_flips_its_own_label_and_nothing_else", flags::own_flag_only),
    ("a_delete_requested_mark_only_busyguard_may_write", flags::forged_mark),
    (
        "a_controller_removes_its_finalizer_from_a_busy_pod",
        neighbours::a_controller_removes_its_finalizer_from_a_busy_pod,
    ),
    (
        "a_worker_cannot_shorten_its_neighbours_max_busy_in_a_namespace_without_any_busyguard_label",
        neighbours::a_worker_cannot_shorten_its_neighbours_max_busy,
    ),
    (
        "a_mark_or_busy_since_written_through_pods_status_is_refused",
        neighbours::a_mark_or_busy_since_written_through_pods_status_is_refused,
    ),
    (
        "a_pod_with_a_key_of_an_older_version_is_warned_about",
        neighbours::a_pod_with_a_key_of_an_older_version_is_warned_about,
    ),
    ("the_fence_keeps_busyguards_own_token_to_the_pods_it_guards", flags::the_fence_keeps_busyguards_token_to_its_pods),
    (
        "a_flip_by_server_side_apply_is_protected_and_restored",
        flags::a_flip_by_server_side_apply_is_protected_and_restored,
    ),
    (
        "a_busy_node_stays_but_the_cloud_node_lifecycle_controller_deletes_it",
        nodes::the_cloud_node_controller_deletes_a_busy_node,
    ),
    ("a_busy_node_stays_but_karpenter_deletes_it", nodes::karpenter_deletes_a_busy_node),
    (
        "a_busy_unready_pod_is_released_from_its_replicaset_then_reaped_once",
        readiness::a_busy_unready_pod_is_released_then_reaped,
    ),
    (
        "an_argo_rollouts_replicaset_releases_and_reaps_like_a_deployments",
        readiness::an_argo_rollouts_replicaset_releases_and_reaps_like_a_deployments,
    ),
    ("an_opted_out_namespace_is_left_alone", drains::an_opted_out_namespace_is_left_alone),
    (
        "a_staged_install_guards_only_the_namespaces_opted_in",
        drains::a_staged_install_guards_only_the_namespaces_opted_in,
    ),
    (
        "while_busyguard_is_down_only_busy_pods_wait_and_a_readiness_mode_deployment_of_ready_pods_scales_down",
        outages::while_busyguard_is_down_only_busy_pods_wait,
    ),
    ("a_rolling_restart_of_busyguard_fails_no_admission", outages::a_rolling_restart_fails_no_admission),
    ("certificate_rotation_under_traffic_fails_no_admission", outages::certificate_rotation_fails_no_admission),
    (
        "an_upgrade_from_the_previous_release_loses_no_busy_pod",
        upgrade::an_upgrade_from_the_previous_release_loses_no_busy_pod,
    ),
    (
        "busyguard_check_tells_an_install_that_works_from_one_that_does_not",
        outages::busyguard_check_tells_an_install_that_works_from_one_that_does_not,
    ),
    (
        "the_documented_uninstall_refuses_nothing_more_and_cleanup_leaves_nothing_behind",
        outages::cleanup_after_an_uninstall_leaves_nothing_behind,
    ),
];
