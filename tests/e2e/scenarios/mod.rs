//! Every scenario, by topic; `ALL` is the order they run in.

mod deletes;
mod flags;
mod scale;

use anyhow::Result;

use crate::rig::Rig;

pub type Scenario = fn(&Rig) -> Result<()>;

pub const ALL: &[(&str, Scenario)] = &[
    ("a_scale_down_takes_the_idle_pods_and_waits_for_the_busy_ones", scale::idle_first_then_waits),
    ("a_persons_delete_of_a_busy_pod_is_refused_and_carried_out_once_when_it_is_idle", deletes::deferred_once),
    ("a_workers_own_token_flips_its_own_label_and_nothing_else", flags::own_flag_only),
    ("a_delete_requested_mark_only_busyguard_may_write", flags::forged_mark),
];
