//! The workload budget (`busyguard.io/max-unavailable`) across replicas. Each replica sees the
//! workload's unavailable pods in its own view, but two replicas answering at the same moment
//! would each let a pod go. So the pods let go are also recorded on one object per workload that
//! the API server arbitrates: a Lease written with its resourceVersion as the precondition, as
//! OpenKruise's PodUnavailableBudget keeps its status. Of two replicas claiming the budget's last
//! place at once, the second write fails (409), reads the first one's grant and refuses.

use std::collections::{BTreeMap, BTreeSet};

use jiff::{SignedDuration, Timestamp};

use super::keys::MAX_UNAVAILABLE;
use super::outcome::{BudgetClaim, Outcome};
use super::pod::{Phase, PodFacts};
use super::workloads::workload_of;

/// The other pods of a pod's workload that are unavailable now, by name (not Running and
/// Ready, or going away), as the view holds them, and the workload they count for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Siblings {
    /// `Kind/name`: a Deployment across its ReplicaSets, else the pod's controlling owner.
    pub workload: String,
    pub unavailable: Vec<String>,
}

/// The other pods of the workload of `pod` (named `name`) that are unavailable: not Running
/// and Ready, or going away, among `namespace_pods` (its namespace's, by name, itself among
/// them). A Deployment's pods count across its ReplicaSets, else the controlling owner's. `None`
/// when the pod has no owner, or no budget (`busyguard.io/max-unavailable`) to count for: the
/// namespace is scanned only then.
pub fn unavailable_siblings<'p, P: PodFacts + 'p>(
    name: &str,
    pod: &P,
    namespace_pods: impl Iterator<Item = (&'p str, &'p P)>,
) -> Option<Siblings> {
    pod.label(MAX_UNAVAILABLE)?;
    let owner = pod.owner_key()?;
    let workload = workload_of(pod, name);
    // The same owner is the same workload; only another owner needs its workload worked out
    // (a Deployment's other ReplicaSet).
    let same_workload = |other: &str, pod: &P| match pod.owner_key() {
        Some(theirs) => theirs == owner || workload_of(pod, other) == workload,
        None => false,
    };
    let unavailable = namespace_pods
        .filter(|(other, pod)| *other != name && same_workload(other, pod))
        .filter(|(_, pod)| pod.is_terminating() || !is_available(*pod))
        .map(|(other, _)| other.to_string())
        .collect();
    Some(Siblings { workload, unavailable })
}

/// Running and Ready: what counts as available for a budget.
pub fn is_available(pod: &(impl PodFacts + ?Sized)) -> bool {
    pod.phase() == Phase::Running && pod.readiness().is_some_and(|r| r.ready)
}

/// What a workload's budget says of taking a pod away.
pub enum Budget<'s> {
    /// No budget holds it.
    NotHeld,
    /// There is a place for it among the workload's `siblings`, to be claimed with the arbiter.
    Within { allowed: u32, siblings: &'s Siblings },
    /// The refusal.
    UsedUp(String),
}

/// Whether taking the pod `namespace/name` away stays within its workload's
/// `busyguard.io/max-unavailable`: a budget for workloads a PodDisruptionBudget cannot cover
/// (DaemonSets, direct deletes), counted in the view's unavailable `siblings` (`None`: unknown,
/// no budget). `held`: the requester is held by budgets at all (its caller says). A pod itself
/// unavailable may always go.
pub fn budget<'s>(
    pod: &(impl PodFacts + ?Sized),
    siblings: Option<&'s Siblings>,
    held: bool,
    namespace: &str,
    name: &str,
) -> Budget<'s> {
    let Some(allowed) = pod.label(MAX_UNAVAILABLE).and_then(|n| n.trim().parse::<u32>().ok()).filter(|n| *n > 0) else {
        return Budget::NotHeld;
    };
    let Some(siblings) = siblings else { return Budget::NotHeld };
    let unavailable = u32::try_from(siblings.unavailable.len()).unwrap_or(u32::MAX);
    let itself_unavailable = pod.is_terminating() || !is_available(pod);
    if itself_unavailable || !held {
        Budget::NotHeld
    } else if unavailable < allowed {
        Budget::Within { allowed, siblings }
    } else {
        Budget::UsedUp(budget_used_up(namespace, name, allowed, unavailable))
    }
}

/// A disruption refused by the workload's own budget.
pub fn budget_used_up(namespace: &str, name: &str, allowed: u32, unavailable: u32) -> String {
    format!(
        "pod {namespace}/{name} may not go now: its workload allows {allowed} unavailable pod(s) at once \
         ({MAX_UNAVAILABLE}) and {unavailable} already are; retry once they are back"
    )
}

/// Pods let go under a workload's budget, by name, with when.
pub type Grants = BTreeMap<String, Timestamp>;

/// How long a pod let go counts as unavailable by its grant alone: until the watch shows it
/// going (then the view counts it), or the delete did not happen after all (refused further down
/// the admission chain, or never sent).
pub const GRANT_HELD_FOR: SignedDuration = SignedDuration::from_secs(30);

/// What the name of every Lease of grants starts with.
pub const LEASE_PREFIX: &str = "busyguard-budget-";

/// The Lease of the grants of `workload` in `namespace`, kept in busyguard's own namespace
/// (`jobs`, `DaemonSet/agent` → `busyguard-budget-jobs.daemonset-agent`): a namespace has no
/// dot and a kind no dash, so no two workloads share a name. A name past the 253 characters a
/// Lease may have is cut, and told apart by a hash of the whole.
pub fn lease_name(namespace: &str, workload: &str) -> String {
    const MAX: usize = 253;
    let name = format!("{LEASE_PREFIX}{namespace}.{}", workload.to_ascii_lowercase().replace('/', "-"));
    if name.len() <= MAX {
        return name;
    }
    // FNV-1a: the same on every replica and every version, unlike std's hasher.
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    let kept = name.char_indices().map(|(i, _)| i).take_while(|i| *i <= MAX - 17).last().unwrap_or(0);
    format!("{}-{hash:016x}", name[..kept].trim_end_matches(['-', '.']))
}

/// Whether a Lease's grants have all run out: it holds nothing a claim would read, and goes
/// (a new claim makes it again).
pub fn spent(recorded: &Grants, now: Timestamp) -> bool {
    !recorded.values().any(|at| held(*at, now))
}

/// Whether a grant made `at` still counts its pod unavailable.
fn held(at: Timestamp, now: Timestamp) -> bool {
    now.duration_since(at) < GRANT_HELD_FOR
}

/// The arbiter's rule for `claim` against the grants on record: the grants to record instead
/// (this pod's added, the expired ones and those of pods gone from the view dropped), or `None`
/// when the workload's unavailable pods (the view's and those let go) leave no place for it.
pub fn claim(
    claim: &BudgetClaim,
    recorded: &Grants,
    still_there: impl Fn(&str) -> bool,
    now: Timestamp,
) -> Option<Grants> {
    let mut grants: Grants = (recorded.iter())
        .filter(|(pod, at)| **pod != claim.pod && held(**at, now) && still_there(pod))
        .map(|(pod, at)| (pod.clone(), *at))
        .collect();
    let unavailable: BTreeSet<&str> = claim.unavailable.iter().chain(grants.keys()).map(String::as_str).collect();
    if u32::try_from(unavailable.len()).unwrap_or(u32::MAX) >= claim.allowed {
        return None;
    }
    grants.insert(claim.pod.clone(), now);
    Some(grants)
}

/// The answer when `claim` cannot be recorded (the API server refused the write, or did not
/// answer in time): refused as a budget used up is (429), since whether another replica took the
/// last place is unknown. The requester retries, as it does a PodDisruptionBudget's refusal; a
/// 503 would let the pod go past the budget through the webhook's `failurePolicy: Ignore`.
pub fn unrecorded(claim: BudgetClaim, why: &str) -> Outcome {
    let message = format!(
        "pod {}/{}: its workload {}'s budget ({MAX_UNAVAILABLE}: {}) cannot be kept: busyguard could not record \
         the pod's place with the API server ({why}); retry",
        claim.namespace, claim.pod, claim.workload, claim.allowed
    );
    claim.refusal.reworded(message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::outcome::{Decision, Outcome};
    use crate::policy::pod::Pod;
    use crate::policy::testing::{pod, ts};
    use serde_json::json;

    /// A pod of `owner` (`Kind/name`, apps/v1) with its template hash, Running and `ready`;
    /// under a budget of one, or none.
    fn member(owner: Option<&str>, hash: &str, ready: bool, budget: bool, terminating: bool) -> Pod {
        let owners = owner.map(|owner| {
            let (kind, name) = owner.split_once('/').unwrap();
            json!([{"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": "o", "controller": true}])
        });
        let mut labels = json!({"pod-template-hash": hash});
        if budget {
            labels[MAX_UNAVAILABLE] = json!("1");
        }
        pod(json!({
            "metadata": {"name": "p", "uid": "u", "labels": labels, "ownerReferences": owners,
                "deletionTimestamp": terminating.then_some("2026-11-21T20:49:00Z")},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]},
        }))
    }

    #[test]
    fn a_workloads_unavailable_pods_are_counted_across_its_replica_sets_and_no_other_workloads() {
        let old = Some("ReplicaSet/web-7d4b9");
        let pods = [
            ("a", member(old, "7d4b9", true, true, false)),
            ("b", member(old, "7d4b9", false, true, false)),
            ("c", member(Some("ReplicaSet/web-5f6c8"), "5f6c8", false, true, false)),
            ("d", member(old, "7d4b9", true, true, true)),
            ("e", member(Some("ReplicaSet/api-1a2b3"), "1a2b3", false, true, false)),
            ("f", member(None, "", false, true, false)),
        ];
        let namespace = || pods.iter().map(|(name, pod)| (*name, pod));
        let siblings = unavailable_siblings("a", &pods[0].1, namespace()).unwrap();
        assert_eq!(siblings.workload, "Deployment/web");
        let mut unavailable = siblings.unavailable;
        unavailable.sort();
        assert_eq!(unavailable, ["b", "c", "d"], "not ready, in the other ReplicaSet, going away; not itself");
        let unbudgeted = member(old, "7d4b9", true, false, false);
        assert_eq!(unavailable_siblings("a", &unbudgeted, namespace()), None, "no budget: nothing counted");
        assert_eq!(unavailable_siblings("f", &pods[5].1, namespace()), None, "no owner: no workload to count");
    }

    fn claiming(pod: &str, allowed: u32, unavailable: &[&str]) -> BudgetClaim {
        BudgetClaim {
            namespace: "ns".into(),
            pod: pod.into(),
            allowed,
            workload: "DaemonSet/agent".into(),
            unavailable: unavailable.iter().map(|s| s.to_string()).collect(),
            refusal: Box::new(Outcome::allow(Decision::Denied)),
        }
    }

    #[test]
    fn of_two_claims_on_a_budget_of_one_the_second_finds_the_firsts_grant_and_is_refused() {
        let now = ts("2026-11-21T20:00:00Z");
        let first = claim(&claiming("a", 1, &[]), &Grants::new(), |_| true, now).expect("the first fits");
        assert_eq!(first, Grants::from([("a".to_string(), now)]));
        assert_eq!(claim(&claiming("b", 1, &[]), &first, |_| true, now), None, "the second does not");
        let two = claim(&claiming("b", 2, &[]), &first, |_| true, now).expect("a budget of two");
        assert_eq!(two.len(), 2);
    }

    #[test]
    fn a_pod_counted_unavailable_by_the_view_and_by_its_grant_counts_once() {
        let now = ts("2026-11-21T20:00:00Z");
        let recorded = Grants::from([("a".to_string(), now)]);
        assert!(claim(&claiming("b", 2, &["a"]), &recorded, |_| true, now).is_some());
        assert!(claim(&claiming("b", 2, &["a", "c"]), &recorded, |_| true, now).is_none());
    }

    #[test]
    fn grants_expire_and_those_of_pods_gone_are_dropped() {
        let then = ts("2026-11-21T20:00:00Z");
        let recorded =
            Grants::from([("old".to_string(), then), ("gone".to_string(), then + SignedDuration::from_secs(25))]);
        let now = then + SignedDuration::from_secs(31);
        let kept = claim(&claiming("b", 1, &[]), &recorded, |pod| pod != "gone", now).expect("nothing counts any more");
        assert_eq!(kept.keys().collect::<Vec<_>>(), ["b"]);
        // The same pod claimed again (a retried delete) replaces its own grant.
        let again = claim(&claiming("b", 1, &[]), &kept, |_| true, now).expect("its own grant is no sibling");
        assert_eq!(again.len(), 1);
    }

    #[test]
    fn a_workloads_lease_is_named_for_it_and_its_namespace() {
        assert_eq!(lease_name("jobs", "DaemonSet/node-agent"), "busyguard-budget-jobs.daemonset-node-agent");
        assert_eq!(lease_name("jobs", "Deployment/worker"), "busyguard-budget-jobs.deployment-worker");
        // Dashes in a namespace cannot make two workloads' names meet.
        assert_ne!(lease_name("team-deployment-w", "Job/z"), lease_name("team", "Deployment/w-job-z"));
    }

    #[test]
    fn a_name_too_long_for_a_lease_is_cut_and_told_apart_by_a_hash() {
        let long = |tail: &str| lease_name(&"n".repeat(63), &format!("Deployment/{}{tail}", "w".repeat(250)));
        let (a, b) = (long("a"), long("b"));
        assert!(a.len() <= 253 && b.len() <= 253, "{} {}", a.len(), b.len());
        assert_ne!(a, b);
        assert_eq!(a, long("a"), "the same on every call");
        assert!(a.starts_with(LEASE_PREFIX));
    }

    #[test]
    fn a_lease_whose_grants_all_ran_out_is_spent() {
        let at = ts("2026-01-01T00:00:00Z");
        let grants = Grants::from([("w-a".to_string(), at)]);
        assert!(!spent(&grants, at + SignedDuration::from_secs(29)));
        assert!(spent(&grants, at + GRANT_HELD_FOR));
        assert!(spent(&Grants::new(), at));
    }
}
