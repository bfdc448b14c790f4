//! An owner under a busy rule taking a new task (Agones' allocator moving a GameServer to
//! Allocated) while its pod is held: refused, so the task goes to another owner.

use jiff::Timestamp;

use super::ask::Ask;
use super::config::PolicyConfig;
use super::hold::{Hold, held_refusal};
use super::outcome::{Decision, Denial, Outcome};
use super::owners::OwnerRule;

/// An owner's update that gives it a new task: the request, the owner's busy rule, and its pod
/// and why it is held, if it is.
#[derive(Clone, Copy)]
pub struct NewTask<'a> {
    pub ask: &'a Ask<'a>,
    pub rule: &'a OwnerRule,
    pub held: Option<(&'a str, &'a Hold)>,
}

/// An owner's update that gives it a new task (its registration sends only those: Agones'
/// allocator moving a GameServer to Allocated): refused with a conflict (409) while its pod is
/// held, its disruption wanted or its node going, so that whoever hands out the work picks
/// another owner (Agones' allocator does on a conflict, and leaves this one out of its cache
/// until it changes).
pub fn judge_new_task(task: &NewTask<'_>, config: &PolicyConfig, now: Timestamp) -> Outcome {
    let NewTask { ask, rule, held } = *task;
    let Some((pod, hold)) = held else { return Outcome::allow(Decision::Allowed) };
    let (denial, reason) = Denial::of_hold(hold);
    let message = format!(
        "{} {}/{} takes no new task now, its pod being held ({}); give the task to another",
        rule.kind,
        ask.namespace,
        ask.name,
        held_refusal(ask.namespace, pod, hold)
    );
    let audit = |decision, reason, detail| ask.audit(decision, reason, detail, config.mode, now);
    Outcome::refused(denial, reason, message, config.mode, audit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allocation_of_a_game_server_whose_pod_is_held_is_refused_with_a_conflict() {
        let game_server: OwnerRule = "agones.dev/v1/GameServer=object.status.state == 'Allocated'".parse().unwrap();
        let config = crate::policy::testing::config();
        let ask = Ask { namespace: "games", name: "gs-1", ..crate::policy::testing::ask("UPDATE", "allocator") };
        let now = Timestamp::UNIX_EPOCH;
        let free = judge_new_task(&NewTask { ask: &ask, rule: &game_server, held: None }, &config, now);
        assert_eq!(free.decision, Decision::Allowed);
        let going = Hold::NodeGoing { node: "n-1".into(), why: crate::policy::hold::NodeGoing::Karpenter };
        let refused =
            judge_new_task(&NewTask { ask: &ask, rule: &game_server, held: Some(("gs-1", &going)) }, &config, now);
        let crate::policy::outcome::Answer::Deny { denial, message } = &refused.answer else { panic!() };
        assert_eq!(denial.code(), 409, "a conflict: Agones' allocator picks another server");
        assert!(message.starts_with("GameServer games/gs-1 takes no new task now"), "{message}");
        assert!(message.contains("its node n-1 is going"), "{message}");
    }
}
