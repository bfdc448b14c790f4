//! Scale-downs of ReplicaSets and Deployments (`replicas` or `*/scale`), decided whole: never
//! refused; before the controller picks pods, the costs it ranks them by are brought up to date,
//! and what the scale-down will do to the pods it selects is audited: how many idle pods it can
//! take at once, and how many busy ones it has to wait for.

use jiff::Timestamp;

use super::ask::Ask;
use super::busy::{BusyState, busy_state};
use super::config::PolicyConfig;
use super::marks::plan;
use super::outcome::{AuditRecord, Decision, Effect, Outcome, Reason, ScalePlan};
use super::pod::{PodFacts, PodRef};
use super::selector::{Selector, SelectorError};

/// Replicas before and after, and the pods' selector (`None`: the object has none; `Err`: it
/// does not parse).
#[derive(Debug)]
pub struct ScaleRequest<'a> {
    pub ask: &'a Ask<'a>,
    /// What is scaled, for the audit line: e.g. `deployments/scale capture/worker`.
    pub object: &'a str,
    pub from: Option<i32>,
    pub to: Option<i32>,
    pub selector: Option<Result<Selector, SelectorError>>,
}

/// Why the view cannot say which pods a scale-down selects (not listed yet, stale): the
/// scale-down is let through unprepared, and says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ViewUnavailable(pub String);

/// The answer to a change of `object` (e.g. `deployments/scale capture/worker`). `select` reads
/// the cluster view: the pods of the request's namespace the selector matches, or why the view
/// cannot say.
pub fn prepare_scale_down<P: PodFacts>(
    scale: &ScaleRequest<'_>,
    select: impl FnOnce(&Selector) -> Result<Vec<(String, P)>, ViewUnavailable>,
    config: &PolicyConfig,
    now: Timestamp,
) -> Outcome {
    let (ask, object) = (scale.ask, scale.object);
    let Some((from, to)) = is_scale_down(scale.from, scale.to) else {
        return Outcome::allow(Decision::Allowed);
    };
    let audit =
        |reason, detail, plan| AuditRecord { plan, ..ask.audit(Decision::ScaleDown, reason, detail, config.mode, now) };
    let unprepared = |reason, why: &str| {
        let detail = scale_unprepared(object, from, to, why);
        Outcome::allow(Decision::ScaleDown).audited(audit(reason, detail, None))
    };
    let selector = match &scale.selector {
        None => return unprepared(Reason::NoSelector, NO_SELECTOR),
        Some(Err(e)) => return unprepared(Reason::InvalidSelector, &selector_unparsed(&e.0)),
        Some(Ok(selector)) if selector.is_empty() => return unprepared(Reason::NoSelector, EMPTY_SELECTOR),
        Some(Ok(selector)) => selector,
    };
    let pods = match select(selector) {
        Ok(pods) => pods,
        Err(ViewUnavailable(why)) => return unprepared(Reason::ViewUnavailable, &why),
    };
    if pods.is_empty() {
        return Outcome::allow(Decision::Allowed);
    }
    let states: Vec<BusyState> = pods.iter().map(|(_, pod)| busy_state(pod, config.max_busy, now)).collect();
    let effects: Vec<Effect> = if ask.dry_run {
        Vec::new()
    } else {
        pods.iter()
            .filter_map(|(name, pod)| {
                let plan = plan(pod, None, config.mutation, config.max_busy, now);
                (!plan.is_empty()).then(|| Effect::Refresh {
                    pod: PodRef {
                        namespace: ask.namespace.to_string(),
                        name: name.clone(),
                        uid: pod.uid().to_string(),
                    },
                    resource_version: pod.resource_version().to_string(),
                    plan,
                })
            })
            .collect()
    };
    let plan = plan_scale_down(from, to, &states, effects.len());
    let detail = scale_plan(object, &plan);
    Outcome {
        effects,
        await_effects: true,
        ..Outcome::allow(Decision::ScaleDown).audited(audit(Reason::Plan, detail, Some(plan)))
    }
}

/// Only a lowered replica count is a scale-down.
pub fn is_scale_down(from: Option<i32>, to: Option<i32>) -> Option<(i32, i32)> {
    match (from, to) {
        (Some(from), Some(to)) if to < from => Some((from, to.max(0))),
        _ => None,
    }
}

pub fn plan_scale_down(from: i32, to: i32, states: &[BusyState], refreshed: usize) -> ScalePlan {
    let active: Vec<&BusyState> =
        states.iter().filter(|s| !matches!(s, BusyState::Terminating | BusyState::Terminal)).collect();
    let busy = active.iter().filter(|s| s.is_protected()).count();
    let idle = active.len() - busy;
    let removing = active.len().saturating_sub(usize::try_from(to).unwrap_or(0));
    let idle_taken = removing.min(idle);
    let busy_waited = removing - idle_taken;
    ScalePlan {
        replicas_from: from,
        replicas_to: to,
        pods: active.len(),
        idle_taken,
        busy_waited,
        busy_spared: busy - busy_waited,
        refreshed,
    }
}

/// A scale-down allowed without preparing its pods, and why.
pub fn scale_unprepared(object: &str, from: i32, to: i32, why: &str) -> String {
    format!("{object} {from}→{to}: pods not prepared, {why}")
}

pub fn selector_unparsed(error: &str) -> String {
    format!("its selector does not parse: {error}")
}

/// What a scale-down will do to the pods it selects.
pub fn scale_plan(object: &str, plan: &ScalePlan) -> String {
    format!(
        "{object} {}→{}: takes {} idle pod(s) now, waits for {} busy pod(s), spares {} busy pod(s); \
         {} pod(s) had stale busyguard annotations",
        plan.replicas_from, plan.replicas_to, plan.idle_taken, plan.busy_waited, plan.busy_spared, plan.refreshed
    )
}

pub const NO_SELECTOR: &str = "the object has no selector";

pub const EMPTY_SELECTOR: &str = "its selector is empty";

#[cfg(test)]
mod tests {
    use super::*;

    use crate::policy::keys::{BUSY_LABEL, BUSY_SINCE};
    use crate::policy::pod::Pod;
    use crate::policy::testing::*;
    use serde_json::json;

    fn ask(dry_run: bool) -> Ask<'static> {
        let scale = crate::policy::testing::ask("UPDATE", "alice");
        Ask { resource: "deployments", subresource: "scale", name: "worker", dry_run, ..scale }
    }

    /// `busy` up to date, `missed` labelled busy without busyguard's annotations, `idle`.
    fn pods() -> Vec<(String, Pod)> {
        let pod = |label: &str, annotations: serde_json::Value| -> Pod {
            let mut labels = json!({"app": "worker", BUSY_LABEL: label});
            if annotations.get(BUSY_SINCE).is_some() {
                labels["busyguard.io/protected"] = json!("true");
            }
            serde_json::from_value(json!({"metadata": {"uid": "u", "resourceVersion": "3",
                "labels": labels, "annotations": annotations}}))
            .unwrap()
        };
        let busy = json!({BUSY_SINCE: "2026-11-21T20:00:00Z",
            "controller.kubernetes.io/pod-deletion-cost": crate::policy::cost::busy_cost("2026-11-21T20:00:00Z".parse().unwrap()).to_string(),
            "karpenter.sh/do-not-disrupt": "true", "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"});
        vec![
            ("busy".into(), pod("true", busy)),
            ("missed".into(), pod("true", json!({}))),
            ("idle".into(), pod("false", json!({}))),
        ]
    }

    /// A change of replicas, and the selector the object says.
    struct Change {
        from: Option<i32>,
        to: Option<i32>,
        selector: Option<Result<Selector, SelectorError>>,
    }

    fn request(from: i32, to: i32, selector: &str) -> Change {
        Change { from: Some(from), to: Some(to), selector: Some(selector.parse()) }
    }

    /// `prepare_scale_down` of `change` of `object`, as `ask` asks it.
    fn prepared<P: PodFacts>(
        ask: &Ask<'_>,
        object: &str,
        change: Change,
        select: impl FnOnce(&Selector) -> Result<Vec<(String, P)>, ViewUnavailable>,
        config: &PolicyConfig,
        now: Timestamp,
    ) -> Outcome {
        let Change { from, to, selector } = change;
        prepare_scale_down(&ScaleRequest { ask, object, from, to, selector }, select, config, now)
    }

    fn reason(outcome: &Outcome) -> Option<Reason> {
        outcome.audit.as_ref().map(|a| a.reason)
    }

    #[test]
    fn a_scale_down_refreshes_stale_pods_waits_for_them_and_audits_the_plan() {
        let outcome = prepared(
            &ask(false),
            "deployments/scale capture/worker",
            request(3, 1, "app=worker"),
            |_| Ok(pods()),
            &config(),
            now(),
        );
        assert!(outcome.is_allowed() && outcome.await_effects);
        let refreshed: Vec<&str> = outcome.effects.iter().filter_map(|e| Some(e.pod()?.name.as_str())).collect();
        assert_eq!(refreshed, ["missed"], "only the pod whose annotations are stale");
        let audit = outcome.audit.unwrap();
        assert_eq!((audit.decision, audit.reason), (Decision::ScaleDown, Reason::Plan));
        let plan = audit.plan.unwrap();
        assert_eq!((plan.idle_taken, plan.busy_waited, plan.busy_spared, plan.refreshed), (1, 1, 1, 1));
        assert_eq!(
            audit.detail,
            "deployments/scale capture/worker 3→1: takes 1 idle pod(s) now, waits for 1 busy pod(s), spares 1 busy \
             pod(s); 1 pod(s) had stale busyguard annotations"
        );
    }

    #[test]
    fn a_dry_run_scale_down_plans_without_refreshing() {
        let outcome = prepared(&ask(true), "d", request(3, 1, "app=worker"), |_| Ok(pods()), &config(), now());
        assert!(outcome.effects.is_empty());
        assert_eq!(reason(&outcome), Some(Reason::Plan));
    }

    #[test]
    fn a_scale_up_or_a_scale_down_selecting_nothing_is_allowed_quietly() {
        let up = prepared(&ask(false), "d", request(1, 3, "app=worker"), |_| Ok(pods()), &config(), now());
        let empty = prepared(
            &ask(false),
            "d",
            request(3, 1, "app=other"),
            |_| Ok(Vec::<(String, Pod)>::new()),
            &config(),
            now(),
        );
        for outcome in [up, empty] {
            assert_eq!(outcome.decision, Decision::Allowed);
            assert!(outcome.audit.is_none() && outcome.effects.is_empty());
        }
    }

    #[test]
    fn a_scale_down_that_cannot_be_prepared_is_allowed_and_audited_with_why() {
        let cases = [
            (Change { from: Some(3), to: Some(1), selector: None }, Ok(pods()), Reason::NoSelector),
            (request(3, 1, ""), Ok(pods()), Reason::NoSelector),
            (request(3, 1, "app in (x"), Ok(pods()), Reason::InvalidSelector),
            (
                request(3, 1, "app=worker"),
                Err(ViewUnavailable("the view is stale".to_string())),
                Reason::ViewUnavailable,
            ),
        ];
        for (scale, view, expected) in cases {
            let outcome = prepared(&ask(false), "d", scale, |_| view, &config(), now());
            assert!(outcome.is_allowed());
            assert_eq!((outcome.decision, reason(&outcome)), (Decision::ScaleDown, Some(expected)));
            assert!(outcome.effects.is_empty());
        }
    }

    const BUSY: BusyState = BusyState::Busy { since: None, until: None };

    #[test]
    fn five_to_two_with_two_busy_takes_the_three_idle_and_spares_both_busy() {
        let states = [BUSY, BUSY, BusyState::Idle, BusyState::Idle, BusyState::Idle];
        let plan = plan_scale_down(5, 2, &states, 1);
        assert_eq!(
            plan,
            ScalePlan {
                replicas_from: 5,
                replicas_to: 2,
                pods: 5,
                idle_taken: 3,
                busy_waited: 0,
                busy_spared: 2,
                refreshed: 1
            }
        );
    }

    #[test]
    fn two_to_one_with_both_busy_waits_for_one() {
        let plan = plan_scale_down(2, 1, &[BUSY, BUSY], 0);
        assert_eq!((plan.idle_taken, plan.busy_waited, plan.busy_spared), (0, 1, 1));
    }

    #[test]
    fn pods_already_going_away_do_not_count() {
        let states = [BUSY, BusyState::Terminating, BusyState::Terminal, BusyState::Idle];
        let plan = plan_scale_down(3, 1, &states, 0);
        assert_eq!((plan.pods, plan.idle_taken, plan.busy_waited), (2, 1, 0));
    }

    #[test]
    fn only_lower_replica_counts_are_scale_downs() {
        assert_eq!(is_scale_down(Some(5), Some(2)), Some((5, 2)));
        assert_eq!(is_scale_down(Some(2), Some(5)), None);
        assert_eq!(is_scale_down(Some(2), Some(2)), None);
        assert_eq!(is_scale_down(None, Some(2)), None);
    }
}
