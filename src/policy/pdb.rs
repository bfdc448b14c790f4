//! The busy-pod PodDisruptionBudget: in each namespace with opted-in pods, one PDB selecting
//! `busyguard.io/protected=true` (the label busyguard keeps on a pod exactly while it protects
//! it, so the PDB lets it go at max-busy too) that allows no disruption, so the API server itself answers 429 to
//! evictions of busy pods even while busyguard is down, and cluster-autoscaler, Karpenter and
//! scheduler preemption plan around them. It covers DaemonSet and bare pods too: an integer
//! `minAvailable` needs no scale lookup.
//!
//! A pod matched by two PDBs cannot be evicted at all (the API server answers 500), so where a
//! PDB of the user's own would select a busy pod, busyguard keeps none in that namespace and
//! says so; its eviction webhook still guards there.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::keys::{BUSY_LABEL, MANAGED_BY, PROTECTED_LABEL};
use super::selector::Selector;

pub const BUSY_PDB_NAME: &str = "busyguard-busy";
/// More than a namespace ever holds: no disruption is ever allowed, however many busy pods the
/// PDB controller counts, and nothing needs updating as pods turn busy and idle.
pub const BUSY_PDB_MIN_AVAILABLE: i32 = 1_000_000;

/// A PDB as it stands: whose, and what it selects.
pub struct ExistingPdb {
    pub namespace: String,
    pub name: String,
    pub ours: bool,
    /// `None`: its selector does not parse, or selects everything.
    pub selector: Option<Selector>,
    /// Ours, and its spec is the one busyguard writes (not an older one, nor edited since).
    pub as_kept: bool,
    /// It allows no disruption of the pods it selects (`maxUnavailable: 0` or `0%`,
    /// `minAvailable: 100%`), as Agones' chart installs over its game servers.
    pub allows_none: bool,
}

/// Whether a PDB's spec allows no disruption of the pods it selects, whatever their number.
pub fn allows_no_disruption(spec: Option<&PodDisruptionBudgetSpec>) -> bool {
    let Some(spec) = spec else { return false };
    let zero = |v: &IntOrString| {
        matches!(v, IntOrString::Int(0)) || matches!(v, IntOrString::String(s) if s == "0" || s == "0%")
    };
    spec.max_unavailable.as_ref().is_some_and(zero)
        || matches!(&spec.min_available, Some(IntOrString::String(s)) if s == "100%")
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Create {
        namespace: String,
    },
    Delete {
        namespace: String,
        name: String,
    },
    /// Would conflict with the user's own PDBs there (named): none kept in that namespace.
    Skip {
        namespace: String,
        conflicting: Vec<String>,
    },
    /// The PDBs there that select its pods (named) already allow no disruption of them: none
    /// kept, and nothing to warn of (busy pods are held while busyguard is down all the same).
    Covered {
        namespace: String,
        by: Vec<String>,
    },
}

/// What to change so that each namespace in `pods` (namespace → the labels of its opted-in
/// pods) has the busy PDB as busyguard writes it (one that drifted is made again), unless a
/// user's PDB would select one of its pods once busy or already has its name, and no other
/// namespace keeps one.
pub fn steps(pods: &BTreeMap<String, Vec<BTreeMap<String, String>>>, existing: &[ExistingPdb]) -> Vec<Step> {
    let mut steps = Vec::new();
    let ours: BTreeSet<(&str, &str)> =
        existing.iter().filter(|p| p.ours).map(|p| (p.namespace.as_str(), p.name.as_str())).collect();
    for (namespace, labels) in pods {
        // A pod as it is while busy; a selector busyguard cannot read may select it: assume it does.
        let selects_busy = |pdb: &ExistingPdb, pod: &BTreeMap<String, String>| {
            let busy = |key: &str| match key {
                BUSY_LABEL | PROTECTED_LABEL => Some("true"),
                _ => pod.get(key).map(String::as_str),
            };
            pdb.selector.as_ref().is_none_or(|s| s.matches(busy))
        };
        let selecting: Vec<&ExistingPdb> = (existing.iter())
            .filter(|pdb| !pdb.ours && &pdb.namespace == namespace)
            .filter(|pdb| pdb.name == BUSY_PDB_NAME || labels.iter().any(|pod| selects_busy(pdb, pod)))
            .collect();
        // Covered only where every opted-in pod is under one that allows nothing: a second
        // fleet beside an Agones `eviction.safe: Never` one still needs the busy PDB, and its
        // conflict is told.
        let covered = !selecting.is_empty()
            && selecting.iter().all(|pdb| pdb.allows_none && pdb.name != BUSY_PDB_NAME)
            && labels.iter().all(|pod| selecting.iter().any(|pdb| selects_busy(pdb, pod)));
        let conflicting: Vec<String> = selecting.iter().map(|pdb| pdb.name.clone()).collect();
        let have = ours.contains(&(namespace.as_str(), BUSY_PDB_NAME));
        let drifted = (existing.iter())
            .any(|pdb| pdb.ours && &pdb.namespace == namespace && pdb.name == BUSY_PDB_NAME && !pdb.as_kept);
        match (conflicting.is_empty(), have) {
            (true, false) => steps.push(Step::Create { namespace: namespace.clone() }),
            (true, true) if drifted => {
                steps.push(Step::Delete { namespace: namespace.clone(), name: BUSY_PDB_NAME.into() });
                steps.push(Step::Create { namespace: namespace.clone() });
            }
            (true, true) => {}
            (false, have) => {
                if have {
                    steps.push(Step::Delete { namespace: namespace.clone(), name: BUSY_PDB_NAME.into() });
                }
                let namespace = namespace.clone();
                steps.push(match covered {
                    true => Step::Covered { namespace, by: conflicting },
                    false => Step::Skip { namespace, conflicting },
                });
            }
        }
    }
    for (namespace, name) in ours {
        if !pods.contains_key(namespace) {
            steps.push(Step::Delete { namespace: namespace.into(), name: name.into() });
        }
    }
    steps
}

/// Whether a PDB's spec says what busyguard's says, however the API server spells it (a list
/// left out or empty).
pub fn as_busyguard_writes_it(spec: Option<&PodDisruptionBudgetSpec>, namespace: &str) -> bool {
    let ours = busy_pdb(namespace).spec;
    let said = |spec: Option<&PodDisruptionBudgetSpec>| {
        let spec = spec.cloned().unwrap_or_default();
        let selector = spec.selector.unwrap_or_default();
        let expressions: Vec<(String, String, Vec<String>)> = (selector.match_expressions.unwrap_or_default())
            .into_iter()
            .map(|e| (e.key, e.operator, e.values.unwrap_or_default()))
            .collect();
        let labels = selector.match_labels.unwrap_or_default();
        (spec.min_available, spec.max_unavailable, spec.unhealthy_pod_eviction_policy, labels, expressions)
    };
    said(spec) == said(ours.as_ref())
}

/// busyguard's PDB for a namespace: every protected pod, no disruption allowed.
pub fn busy_pdb(namespace: &str) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(BUSY_PDB_NAME.into()),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([(MANAGED_BY.0.into(), MANAGED_BY.1.into())])),
            ..ObjectMeta::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(BUSY_PDB_MIN_AVAILABLE)),
            // Opted-in pods only: on those busyguard keeps the protected label true to the facts
            // (anyone may label any pod, but busyguard takes it off an opted-in pod it does not
            // protect).
            selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(PROTECTED_LABEL.into(), "true".into())])),
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: BUSY_LABEL.into(),
                    operator: "Exists".into(),
                    values: None,
                }]),
            }),
            // Said outright: a busy pod that is not Ready (readiness as the busy signal, or a
            // probe failing mid-task) stays protected. Platforms that force AlwaysAllow by policy
            // would let such a pod be evicted.
            unhealthy_pod_eviction_policy: Some("IfHealthyBudget".into()),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods(namespace: &str, labels: &[(&str, &str)]) -> BTreeMap<String, Vec<BTreeMap<String, String>>> {
        let labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        BTreeMap::from([(namespace.to_string(), vec![labels])])
    }

    fn pdb(namespace: &str, name: &str, ours: bool, selector: &str) -> ExistingPdb {
        ExistingPdb {
            namespace: namespace.into(),
            name: name.into(),
            ours,
            selector: selector.parse().ok(),
            as_kept: ours,
            allows_none: false,
        }
    }

    #[test]
    fn each_namespace_with_opted_in_pods_gets_the_busy_pdb_once() {
        let jobs = pods("jobs", &[("app", "worker"), (BUSY_LABEL, "false")]);
        assert_eq!(steps(&jobs, &[]), [Step::Create { namespace: "jobs".into() }]);
        assert_eq!(steps(&jobs, &[pdb("jobs", BUSY_PDB_NAME, true, "busyguard.io/protected=true")]), []);
    }

    #[test]
    fn a_users_pdb_that_would_select_a_busy_pod_means_none_of_ours_there() {
        let jobs = pods("jobs", &[("app", "worker"), (BUSY_LABEL, "false")]);
        let theirs = pdb("jobs", "worker", false, "app=worker");
        assert_eq!(
            steps(&jobs, &[theirs, pdb("jobs", BUSY_PDB_NAME, true, "busyguard.io/protected=true")]),
            [
                Step::Delete { namespace: "jobs".into(), name: BUSY_PDB_NAME.into() },
                Step::Skip { namespace: "jobs".into(), conflicting: vec!["worker".into()] }
            ]
        );
        let elsewhere = pdb("jobs", "web", false, "app=web");
        assert_eq!(steps(&jobs, &[elsewhere]), [Step::Create { namespace: "jobs".into() }], "selects other pods");
    }

    #[test]
    fn agones_own_pdb_that_allows_no_disruption_covers_its_game_servers_and_is_no_conflict() {
        // eviction.safe: Never (Agones' default): its chart's PDB in each game-server namespace.
        let games = pods("games", &[("agones.dev/gameserver", "gs-1"), ("agones.dev/safe-to-evict", "false")]);
        let spec = |max_unavailable: &str| PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::String(max_unavailable.into())),
            ..PodDisruptionBudgetSpec::default()
        };
        assert!(allows_no_disruption(Some(&spec("0%"))));
        assert!(!allows_no_disruption(Some(&spec("10%"))));
        let agones = || ExistingPdb {
            allows_none: true,
            ..pdb("games", "agones-gameserver-safe-to-evict-false", false, "agones.dev/safe-to-evict=false")
        };
        assert_eq!(
            steps(&games, &[agones()]),
            [Step::Covered { namespace: "games".into(), by: vec!["agones-gameserver-safe-to-evict-false".into()] }]
        );
        // Beside a PDB of the user's that allows disruptions, it is a conflict as before.
        let users = pdb("games", "arena", false, "agones.dev/gameserver");
        assert!(matches!(&steps(&games, &[agones(), users])[..], [Step::Skip { .. }]));
        // Beside a second fleet (eviction.safe: Always) it covers only its own: the other's
        // busy servers would go while busyguard is down, so the conflict is told.
        let mut two_fleets = games.clone();
        let always = [("agones.dev/gameserver", "gs-9"), ("agones.dev/safe-to-evict", "true")];
        two_fleets.get_mut("games").unwrap().push(always.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        assert_eq!(
            steps(&two_fleets, &[agones()]),
            [Step::Skip {
                namespace: "games".into(),
                conflicting: vec!["agones-gameserver-safe-to-evict-false".into()]
            }]
        );
    }

    #[test]
    fn a_busy_pdb_that_drifted_is_made_again_and_a_users_of_its_name_is_left_alone() {
        let jobs = pods("jobs", &[("app", "worker"), (BUSY_LABEL, "false")]);
        let older = ExistingPdb { as_kept: false, ..pdb("jobs", BUSY_PDB_NAME, true, "busyguard.io/busy=true") };
        assert_eq!(
            steps(&jobs, &[older]),
            [
                Step::Delete { namespace: "jobs".into(), name: BUSY_PDB_NAME.into() },
                Step::Create { namespace: "jobs".into() }
            ]
        );
        let theirs = pdb("jobs", BUSY_PDB_NAME, false, "app=web");
        assert_eq!(
            steps(&jobs, &[theirs]),
            [Step::Skip { namespace: "jobs".into(), conflicting: vec![BUSY_PDB_NAME.into()] }],
            "not created again and again (409)"
        );
    }

    #[test]
    fn a_namespace_left_without_opted_in_pods_loses_the_busy_pdb() {
        let existing = [pdb("gone", BUSY_PDB_NAME, true, "busyguard.io/busy=true")];
        assert_eq!(
            steps(&BTreeMap::new(), &existing),
            [Step::Delete { namespace: "gone".into(), name: BUSY_PDB_NAME.into() }]
        );
    }
}
