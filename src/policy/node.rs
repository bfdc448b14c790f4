//! Node DELETE, decided whole: a node is not deleted from under busy pods (after a
//! `kubectl drain --ignore-daemonsets`, or by a person), with the same exemptions as pod
//! deletes; nor is a NodeClaim Karpenter consolidates or replaces for drift. Two requesters go through: the cloud node lifecycle controller deletes a node whose
//! machine is already gone (nothing is left to protect), and Karpenter's DELETE of a node only
//! starts its termination (a finalizer holds the node while Karpenter drains it: it does not
//! evict a pod with `karpenter.sh/do-not-disrupt`, busyguard's mark on a busy pod, but waits for
//! it until its NodePool's `terminationGracePeriod`, then deletes it).

use jiff::Timestamp;

use super::ask::{Ask, Requester};
use super::busy::{BusyState, busy_state};
use super::config::{Exemptions, Mode, PolicyConfig};
use super::hold;
use super::keys::BUSY_LABEL;
use super::keys::DeleteRequest;
use super::outcome::{Decision, Denial, Effect, Outcome, Reason};
use super::pod::{PodFacts, PodRef};
use super::requesters::CLOUD_NODE_LIFECYCLE_USERS;
use crate::duration::parse_positive_duration;
use crate::duration::whole_second;

/// A busy pod on the node, by name, and when its protection ends at the latest.
pub struct BusyOnNode {
    pub pod: String,
    pub until: Option<Timestamp>,
    /// Its uid, and whether a refusal should (re)write its disruption-requested mark.
    uid: String,
    mark_due: bool,
}

/// The answer to `ask`, a delete of a node on which `pods` (namespace/name, pod) run.
pub fn judge_node_delete<'a, P: PodFacts + 'a>(
    ask: &Ask<'_>,
    pods: impl IntoIterator<Item = (String, &'a P)>,
    config: &PolicyConfig,
    now: Timestamp,
) -> Outcome {
    let busy = busy_on_node(pods, config, now);
    let exempt = node_delete_let_through(ask.requester, &config.exemptions);
    let anyway = |busy: &[BusyOnNode]| node_deleted_anyway(ask.name, busy, ask.requester.username);
    judged_on_node(ask, busy, exempt, anyway, |busy| node_busy(ask.name, busy), config, now)
}

/// A NodeClaim's delete: the request, its node, and what its end is judged by.
pub struct NodeClaim<'a> {
    pub ask: &'a Ask<'a>,
    pub node: &'a str,
    pub end: NodeClaimEnd<'a>,
}

/// Whether a NodeClaim created at `created` is past its `spec.expireAfter` (`Never`, or none:
/// it never expires).
pub fn expired(created: Option<Timestamp>, expire_after: Option<&str>, now: Timestamp) -> bool {
    let after = expire_after.filter(|a| *a != "Never").and_then(|a| parse_positive_duration(a).ok());
    match (created, after) {
        (Some(created), Some(after)) => created.checked_add(after).is_ok_and(|at| at <= now),
        _ => false,
    }
}

/// The answer to a NodeClaim's delete by Karpenter, whose node runs `pods`. Its voluntary
/// disruptions (consolidation, drift) wait for the busy pods: the delete is irrevocable once made
/// (Karpenter's termination may then remove the instance with them on it, karpenter#3185), and
/// Karpenter gives the node back when its command times out. Its other ends go through.
pub fn judge_node_claim_delete<'a, P: PodFacts + 'a>(
    claim: &NodeClaim<'_>,
    pods: impl IntoIterator<Item = (String, &'a P)>,
    config: &PolicyConfig,
    now: Timestamp,
) -> Outcome {
    let ask = claim.ask;
    let busy = busy_on_node(pods, config, now);
    let exempt = node_claim_delete_let_through(claim.end, ask.requester, &config.exemptions);
    let disruption = claim.end.disruption.unwrap_or("no DisruptionReason");
    // Interrupted: each busy pod is marked, so its protection ends and Karpenter's drain evicts it.
    let marked = if exempt == Some(Reason::Interrupted) && !ask.dry_run { &busy[..] } else { &[] };
    let interrupted: Vec<Effect> = marked
        .iter()
        .filter_map(|b| {
            let (namespace, name) = b.pod.split_once('/')?;
            let pod = PodRef { namespace: namespace.into(), name: name.into(), uid: b.uid.clone() };
            Some(Effect::MarkInterrupted { pod, node_claim: ask.name.to_string() })
        })
        .collect();
    let anyway = |busy: &[BusyOnNode]| {
        let deleted = node_deleted_anyway(claim.node, busy, ask.requester.username);
        let why = match exempt {
            Some(Reason::Interrupted) => {
                ": its spot instance is being reclaimed, so they are let go and Karpenter's drain gives each task its \
                 SIGTERM"
            }
            _ => "",
        };
        format!("NodeClaim {} ({disruption}) of {deleted}{why}", ask.name)
    };
    let refusal = |busy: &[BusyOnNode]| {
        format!(
            "NodeClaim {} is being disrupted ({disruption}) but its node {} runs {} busy pod(s): {}; they take no new \
             task now, so Karpenter's next try once they are idle goes through (or it gives the node back when its \
             command times out); to force: label them {BUSY_LABEL}=false, or delete as an exempt user",
            ask.name,
            claim.node,
            busy.len(),
            busy_list(busy)
        )
    };
    let judged = judged_on_node(ask, busy, exempt, anyway, refusal, config, now);
    Outcome { effects: [judged.effects, interrupted].concat(), ..judged }
}

/// The busy pods among `pods`.
fn busy_on_node<'a, P: PodFacts + 'a>(
    pods: impl IntoIterator<Item = (String, &'a P)>,
    config: &PolicyConfig,
    now: Timestamp,
) -> Vec<BusyOnNode> {
    let busy_one = |(pod, facts): (String, &P)| match busy_state(facts, config.max_busy, now) {
        BusyState::Busy { until, .. } => Some(BusyOnNode {
            pod,
            until,
            uid: facts.uid().to_string(),
            mark_due: hold::mark_due(facts, config.holds, now),
        }),
        _ => None,
    };
    pods.into_iter().filter_map(busy_one).collect()
}

/// The answer to a delete that would take the node of `busy`: nothing busy goes through; an
/// `exempt` requester too, audited in `anyway`'s words; anyone else is refused (429) in
/// `refusal`'s, each busy pod held from new tasks, so the node empties within a task.
fn judged_on_node(
    ask: &Ask<'_>,
    busy: Vec<BusyOnNode>,
    exempt: Option<Reason>,
    anyway: impl FnOnce(&[BusyOnNode]) -> String,
    refusal: impl FnOnce(&[BusyOnNode]) -> String,
    config: &PolicyConfig,
    now: Timestamp,
) -> Outcome {
    if busy.is_empty() {
        return Outcome::allow(Decision::Allowed);
    }
    let audit = |decision, reason, detail| ask.audit(decision, reason, detail, config.mode, now);
    if let Some(reason) = exempt {
        return Outcome::allow(Decision::Exempted).audited(audit(Decision::Exempted, reason, anyway(&busy)));
    }
    let message = refusal(&busy);
    let refused = Outcome::refused(Denial::PodBusy, Reason::Busy, message, config.mode, audit);
    if config.mode == Mode::Audit || ask.dry_run {
        return refused;
    }
    let request = DeleteRequest::new(ask.requester.username, whole_second(now));
    let marks = busy.into_iter().filter(|b| b.mark_due).filter_map(|b| {
        let (namespace, name) = b.pod.split_once('/')?;
        let pod = PodRef { namespace: namespace.into(), name: name.into(), uid: b.uid };
        Some(Effect::MarkDisruptionWanted { pod, request: request.clone() })
    });
    Outcome { effects: marks.collect(), ..refused }
}

/// A node delete refused: which busy pods run there, and until when at the latest.
pub fn node_busy(node: &str, busy: &[BusyOnNode]) -> String {
    format!(
        "node {node} runs {} busy pod(s): {}; they take no new task now, so delete it again once they are idle \
         (drain it to wait for them); to force: label them {BUSY_LABEL}=false, or delete as an exempt user",
        busy.len(),
        busy_list(busy)
    )
}

/// A node deleted with busy pods on it, and by whom.
pub fn node_deleted_anyway(node: &str, busy: &[BusyOnNode], by: &str) -> String {
    format!("node {node} deleted by {by} with {} busy pod(s) on it: {}", busy.len(), busy_list(busy))
}

/// At most 5 named, the rest counted.
fn busy_list(busy: &[BusyOnNode]) -> String {
    let mut named: Vec<String> = busy
        .iter()
        .take(5)
        .map(|b| match b.until {
            Some(until) => format!("{} (protected until {until})", b.pod),
            None => b.pod.clone(),
        })
        .collect();
    if busy.len() > 5 {
        named.push(format!("and {} more", busy.len() - 5));
    }
    named.join(", ")
}

/// Who deletes a node with busy pods on it whatever they do: the cloud node lifecycle controller
/// (the machine is already gone, nothing is left to protect), Karpenter (its DELETE only starts a
/// termination, which waits for a busy pod's `do-not-disrupt` until its NodePool's deadline),
/// exempt users and groups.
fn node_delete_let_through(requester: Requester<'_>, exemptions: &Exemptions) -> Option<Reason> {
    if CLOUD_NODE_LIFECYCLE_USERS.contains(&requester.username) {
        return Some(Reason::NodeGone);
    }
    if exemptions.is_karpenter(requester.username) {
        return Some(Reason::KarpenterTermination);
    }
    exemptions.of(requester).map(|exempt| exempt.reason())
}

/// Karpenter's voluntary disruptions of a NodeClaim: the reasons its disruption queue sets on
/// the `DisruptionReason` condition before it deletes the NodeClaim.
pub const VOLUNTARY_NODE_CLAIM_DISRUPTIONS: [&str; 3] = ["Underutilized", "Empty", "Drifted"];

/// What a NodeClaim delete is judged by: why Karpenter disrupts it, if it does, and what ends
/// it whatever its pods do.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeClaimEnd<'a> {
    /// The reason of its `DisruptionReason` condition.
    pub disruption: Option<&'a str>,
    /// Past its `spec.expireAfter`: Karpenter's expiry, forceful by design.
    pub expired: bool,
    /// Its node is being deleted, or is not Ready: Karpenter's node termination, or its repair.
    pub node_ending: bool,
    /// Of spot capacity (`karpenter.sh/capacity-type: spot`).
    pub spot: bool,
}

/// Who deletes a NodeClaim with busy pods on its node whatever they do, and why: all but
/// Karpenter's voluntary disruptions (consolidation, drift) go. While such a command is in flight
/// the NodeClaim keeps its `DisruptionReason`, so its other ends are told apart by what else
/// holds: someone else asks (a person's delete), it has expired, or its node is being deleted or
/// is not Ready. Karpenter's delete of a spot NodeClaim for no reason of its own, before its
/// expiry and with its node Ready, is its cloud's interruption (the instance is reclaimed within
/// minutes): `Interrupted`, and its busy pods are let go so that their tasks get a SIGTERM.
fn node_claim_delete_let_through(
    claim: NodeClaimEnd<'_>,
    requester: Requester<'_>,
    exemptions: &Exemptions,
) -> Option<Reason> {
    let voluntary = claim.disruption.is_some_and(|reason| VOLUNTARY_NODE_CLAIM_DISRUPTIONS.contains(&reason));
    if !exemptions.is_karpenter(requester.username) || claim.expired || claim.node_ending {
        return Some(Reason::NodeClaimEnding);
    }
    if !voluntary {
        return Some(if claim.spot { Reason::Interrupted } else { Reason::NodeClaimEnding });
    }
    exemptions.of(requester).map(|exempt| exempt.reason())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A NodeClaim delete's node and end, as the tests give them.
    #[derive(Clone, Copy)]
    struct Claim<'a> {
        node: &'a str,
        end: NodeClaimEnd<'a>,
    }

    /// `judge_node_claim_delete` of `ask`, a delete of `claim` whose node runs `pods`.
    fn judged<'a, P: PodFacts + 'a>(
        ask: &Ask<'_>,
        claim: &Claim<'_>,
        pods: impl IntoIterator<Item = (String, &'a P)>,
    ) -> Outcome {
        let claim = NodeClaim { ask, node: claim.node, end: claim.end };
        judge_node_claim_delete(&claim, pods, &config(), now())
    }
    use crate::policy::Requester;
    use crate::policy::keys::{BUSY_LABEL, BUSY_SINCE};
    use crate::policy::outcome::Answer;
    use crate::policy::pod::Pod;
    use crate::policy::requesters::CLOUD_NODE_LIFECYCLE_USERS;
    use crate::policy::testing::*;
    use serde_json::json;

    /// Who deletes a node with busy pods whatever they do: the cloud's lifecycle controller,
    /// Karpenter (its termination waits on the pods), exempt users; nobody else.
    #[test]
    fn who_deletes_a_node_with_busy_pods_on_it_anyway() {
        const KARPENTER: &str = "system:serviceaccount:karpenter:karpenter";
        let mut config = config();
        config.exemptions.karpenter = vec![KARPENTER.into()];
        config.exemptions.users = vec!["breakglass".into()];
        let node =
            |username| node_delete_let_through(Requester { username, groups: &[], pod: None }, &config.exemptions);
        assert_eq!(node(CLOUD_NODE_LIFECYCLE_USERS[0]), Some(Reason::NodeGone));
        assert_eq!(node(KARPENTER), Some(Reason::KarpenterTermination));
        assert_eq!(node("breakglass"), Some(Reason::ExemptUser));
        assert_eq!(node("alice"), None);
    }

    fn pod(label: &str) -> Pod {
        serde_json::from_value(json!({"metadata": {"labels": {BUSY_LABEL: label},
            "annotations": {BUSY_SINCE: "2026-11-21T20:00:00Z"}}, "status": {"phase": "Running"}}))
        .unwrap()
    }

    fn ask(username: &'static str) -> Ask<'static> {
        Ask { resource: "nodes", namespace: "", name: "node-1", ..crate::policy::testing::ask("DELETE", username) }
    }

    fn config() -> PolicyConfig {
        let mut config = crate::policy::testing::config();
        config.exemptions.users = vec!["ops".into()];
        config.exemptions.karpenter = vec!["system:serviceaccount:kube-system:karpenter".into()];
        config
    }

    #[test]
    fn a_node_with_busy_pods_is_not_deleted_and_the_message_names_them() {
        let (busy, idle) = (pod("true"), pod("false"));
        let pods = [("jobs/worker-a".to_string(), &busy), ("jobs/worker-b".to_string(), &idle)];
        let outcome = judge_node_delete(&ask("kubernetes-admin"), pods, &config(), now());
        let Answer::Deny { denial, message } = &outcome.answer else { panic!("{:?}", outcome.answer) };
        assert_eq!(denial.code(), 429);
        assert_eq!(
            message,
            "node node-1 runs 1 busy pod(s): jobs/worker-a (protected until 2026-11-22T20:00:00Z); they take no new \
             task now, so delete it again once they are idle (drain it to wait for them); to force: label them \
             busyguard.io/busy=false, or delete as an exempt user"
        );
        assert_eq!(outcome.audit.unwrap().reason, Reason::Busy);
        // The busy pod takes no new task, so the node empties within a task.
        let [Effect::MarkDisruptionWanted { pod, request }] = outcome.effects.as_slice() else {
            panic!("{:?}", outcome.effects)
        };
        assert_eq!((pod.to_string(), request.by.as_str()), ("jobs/worker-a".to_string(), "kubernetes-admin"));
        let dry_run = Ask { dry_run: true, ..ask("kubernetes-admin") };
        let pods = [("jobs/worker-a".to_string(), &busy)];
        assert!(judge_node_delete(&dry_run, pods, &config(), now()).effects.is_empty(), "a dry run marks nothing");
    }

    #[test]
    fn karpenters_consolidation_or_drift_of_a_node_claim_waits_for_its_busy_pods_and_its_other_ends_go() {
        let (busy, idle) = (pod("true"), pod("false"));
        let karpenter = "system:serviceaccount:kube-system:karpenter";
        let claim_delete = |user| Ask { resource: "nodeclaims", name: "default-x7k2p", ..ask(user) };
        let by_karpenter = claim_delete(karpenter);
        let on_node = |pod| [("jobs/worker-a".to_string(), pod)];
        for reason in ["Underutilized", "Empty", "Drifted"] {
            let claim = Claim { node: "node-1", end: NodeClaimEnd { disruption: Some(reason), ..Default::default() } };
            let outcome = judged(&by_karpenter, &claim, on_node(&busy));
            let Answer::Deny { denial, message } = &outcome.answer else { panic!("{reason}: {:?}", outcome.answer) };
            assert_eq!(denial.code(), 429, "{reason}");
            assert!(
                message.starts_with(&format!("NodeClaim default-x7k2p is being disrupted ({reason})")),
                "{message}"
            );
            assert!(message.contains("but its node node-1 runs 1 busy pod(s): jobs/worker-a"), "{message}");
            assert!(message.contains("Karpenter's next try once they are idle goes through"), "{message}");
            assert!(matches!(outcome.effects.as_slice(), [Effect::MarkDisruptionWanted { .. }]), "held from new tasks");
            let idle_node = judged(&by_karpenter, &claim, on_node(&idle));
            assert_eq!(idle_node.decision, Decision::Allowed, "{reason}: nothing busy, Karpenter goes on");
        }
        // Its forceful or involuntary ends: a NodeClaim without the condition, an exempt user,
        // and, while a consolidation is in flight (the condition stays), its expiry, its node's
        // termination or repair, and a person's delete.
        let drifted = NodeClaimEnd { disruption: Some("Drifted"), ..Default::default() };
        for (end, user) in [
            (NodeClaimEnd { disruption: Some("SpotInterruption"), ..Default::default() }, karpenter),
            (NodeClaimEnd::default(), karpenter),
            (drifted, "ops"),
            (drifted, "alice"),
            (NodeClaimEnd { expired: true, ..drifted }, karpenter),
            (NodeClaimEnd { node_ending: true, ..drifted }, karpenter),
        ] {
            let claim = Claim { node: "node-1", end };
            let outcome = judged(&Ask { resource: "nodeclaims", ..ask(user) }, &claim, on_node(&busy));
            assert_eq!(outcome.decision, Decision::Exempted, "{end:?} by {user}");
            let audit = outcome.audit.unwrap();
            assert!(audit.detail.contains("with 1 busy pod(s) on it: jobs/worker-a"), "{}", audit.detail);
            assert!(outcome.effects.is_empty(), "{end:?}: nothing marked");
        }
    }

    #[test]
    fn karpenters_delete_of_a_spot_node_claim_it_did_not_choose_lets_its_busy_pods_go_with_a_sigterm() {
        let busy = pod("true");
        let karpenter = "system:serviceaccount:kube-system:karpenter";
        let claim_delete = Ask { resource: "nodeclaims", name: "spot-x7k2p", ..ask(karpenter) };
        let claim = Claim { node: "node-1", end: NodeClaimEnd { spot: true, ..Default::default() } };
        let outcome = judged(&claim_delete, &claim, [("jobs/worker-a".to_string(), &busy)]);
        assert_eq!(outcome.decision, Decision::Exempted);
        let audit = outcome.audit.unwrap();
        assert_eq!(audit.reason, Reason::Interrupted);
        assert!(audit.detail.contains("its spot instance is being reclaimed"), "{}", audit.detail);
        let [Effect::MarkInterrupted { pod, node_claim }] = outcome.effects.as_slice() else {
            panic!("{:?}", outcome.effects)
        };
        assert_eq!((pod.to_string(), node_claim.as_str()), ("jobs/worker-a".to_string(), "spot-x7k2p"));
        // Karpenter's own consolidation of a spot node still waits; a dry run marks nothing.
        let consolidated = Claim { end: NodeClaimEnd { disruption: Some("Underutilized"), ..claim.end }, ..claim };
        let pods = [("jobs/worker-a".to_string(), &busy)];
        assert!(!judged(&claim_delete, &consolidated, pods).is_allowed());
        let dry_run = Ask { dry_run: true, ..claim_delete };
        let claim = Claim { node: "node-1", end: NodeClaimEnd { spot: true, ..Default::default() } };
        let pods = [("jobs/worker-a".to_string(), &busy)];
        assert!(judged(&dry_run, &claim, pods).effects.is_empty());
    }

    #[test]
    fn a_node_claim_expires_at_its_creation_plus_expire_after_unless_never() {
        let created: Timestamp = "2026-11-01T00:00:00Z".parse().unwrap();
        let at = |s: &str| s.parse::<Timestamp>().unwrap();
        assert!(expired(Some(created), Some("720h"), at("2026-12-01T00:00:00Z")));
        assert!(!expired(Some(created), Some("720h"), at("2026-11-30T23:59:59Z")));
        assert!(!expired(Some(created), Some("Never"), at("2027-11-01T00:00:00Z")));
        assert!(!expired(Some(created), None, at("2027-11-01T00:00:00Z")));
        assert!(!expired(None, Some("1h"), at("2027-11-01T00:00:00Z")));
    }

    #[test]
    fn a_node_without_busy_pods_goes_quietly() {
        let idle = pod("false");
        let outcome = judge_node_delete(&ask("kubernetes-admin"), [("jobs/w".to_string(), &idle)], &config(), now());
        assert_eq!(outcome.decision, Decision::Allowed);
        assert!(outcome.audit.is_none());
    }

    #[test]
    fn an_exempt_user_the_cloud_node_lifecycle_controller_or_karpenter_deletes_it_audited() {
        let busy = pod("true");
        let mut config = config();
        config.exemptions.karpenter = vec!["system:serviceaccount:karpenter:karpenter".into()];
        for (user, reason) in [
            ("ops", Reason::ExemptUser),
            // As upstream cloud-provider names the cloud node lifecycle controller.
            ("system:serviceaccount:kube-system:node-controller", Reason::NodeGone),
            ("system:serviceaccount:karpenter:karpenter", Reason::KarpenterTermination),
        ] {
            let outcome = judge_node_delete(&ask(user), [("jobs/worker-a".to_string(), &busy)], &config, now());
            assert!(outcome.is_allowed(), "{user}");
            assert_eq!(outcome.audit.unwrap().reason, reason);
        }
    }

    #[test]
    fn every_name_of_the_cloud_node_lifecycle_controller_goes_through() {
        let busy = pod("true");
        for user in CLOUD_NODE_LIFECYCLE_USERS {
            let outcome = judge_node_delete(&ask(user), [("jobs/worker-a".to_string(), &busy)], &config(), now());
            assert!(outcome.is_allowed(), "{user}");
            assert_eq!(outcome.audit.unwrap().reason, Reason::NodeGone);
        }
    }

    #[test]
    fn a_member_of_an_exempt_group_deletes_it_audited_and_others_are_refused() {
        let busy = pod("true");
        let mut config = config();
        config.exemptions.groups = vec!["ops:breakglass".into()];
        let groups = ["system:authenticated".to_string(), "ops:breakglass".to_string()];
        let member = Ask { requester: Requester { username: "alice", groups: &groups, pod: None }, ..ask("alice") };
        let outcome = judge_node_delete(&member, [("jobs/worker-a".to_string(), &busy)], &config, now());
        assert!(outcome.is_allowed());
        assert_eq!(outcome.audit.unwrap().reason, Reason::ExemptGroup);
        let outsider = judge_node_delete(&ask("bob"), [("jobs/worker-a".to_string(), &busy)], &config, now());
        assert!(!outsider.is_allowed());
    }
}
