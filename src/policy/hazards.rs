//! What defeats protection, for `busyguard status` to warn about: set-ups in which a busy pod
//! goes although busyguard refuses, or cannot be moved at all.

use std::collections::BTreeSet;

use super::busy::MaxBusy;
use super::contract::contract_warnings;
use super::pod::PodFacts;
use super::selector::Selector;

/// One PodDisruptionBudget, as far as these rules read it.
pub struct Pdb {
    pub namespace: String,
    pub name: String,
    /// `None`: its selector does not parse.
    pub selector: Option<Selector>,
    /// `unhealthyPodEvictionPolicy: AlwaysAllow`.
    pub always_allow: bool,
}

/// One opted-in pod: where, of which workload, and whether it tolerates every taint.
pub struct Opted<'a, P> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub workload: String,
    pub pod: &'a P,
    pub tolerates_every_taint: bool,
}

/// Each hazard once, in order.
pub fn hazards<P: PodFacts>(pods: &[Opted<'_, P>], pdbs: &[Pdb], max_busy: MaxBusy) -> Vec<String> {
    let mut found = BTreeSet::new();
    for opted in pods {
        let workload = format!("{}/{}", opted.namespace, opted.workload);
        if opted.tolerates_every_taint {
            found.insert(tolerates_every_taint(&workload));
        }
        for warning in contract_warnings(opted.pod, max_busy) {
            found.insert(format!("{workload}: {}", warning.trim_start_matches("busyguard: ")));
        }
        let selecting: Vec<&Pdb> = pdbs
            .iter()
            .filter(|b| b.namespace == opted.namespace)
            .filter(|b| b.selector.as_ref().is_some_and(|s| s.matches(|key| opted.pod.label(key))))
            .collect();
        if let [first, second, ..] = selecting.as_slice() {
            found.insert(in_two_budgets(opted.namespace, opted.name, &first.name, &second.name));
        }
        for budget in selecting.iter().filter(|b| b.always_allow) {
            found.insert(always_allow(&budget.namespace, &budget.name));
        }
    }
    found.into_iter().collect()
}

fn tolerates_every_taint(workload: &str) -> String {
    format!(
        "{workload}: its pods tolerate every taint, so Karpenter never evicts them: a busy one goes down with its \
         node when the node's terminationGracePeriod runs out; tolerate the taints they need, not all"
    )
}

fn in_two_budgets(namespace: &str, pod: &str, first: &str, second: &str) -> String {
    format!(
        "{namespace}/{pod} is selected by the PodDisruptionBudgets {first} and {second}: the API server answers \
         every eviction of it with 500, busy or idle, and drains of its node never finish"
    )
}

fn always_allow(namespace: &str, name: &str) -> String {
    format!(
        "PodDisruptionBudget {namespace}/{name} selects opted-in pods with unhealthyPodEvictionPolicy AlwaysAllow: \
         a busy pod that is not Ready is evicted past it (busyguard's eviction webhook still refuses while it \
         answers); use IfHealthyBudget"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::keys::{BUSY_LABEL, DELETION_COST};
    use crate::policy::pod::Pod;
    use crate::policy::testing::pod;
    use serde_json::json;

    fn pdb(name: &str, app: &str, always_allow: bool) -> Pdb {
        let selector = serde_json::from_value(json!({"matchLabels": {"app": app}})).unwrap();
        Pdb {
            namespace: "jobs".into(),
            name: name.into(),
            selector: Some(Selector::from_label_selector(&selector).unwrap()),
            always_allow,
        }
    }

    fn opted<'a>(name: &'a str, pod: &'a Pod, tolerates_every_taint: bool) -> Opted<'a, Pod> {
        Opted { namespace: "jobs", name, workload: "Deployment/worker".into(), pod, tolerates_every_taint }
    }

    #[test]
    fn what_defeats_protection_is_said_once_each() {
        let worker = pod(json!({"metadata": {"labels": {BUSY_LABEL: "true", "app": "worker"}}}));
        let cheap = pod(json!({"metadata": {"labels": {BUSY_LABEL: "false", "app": "worker"},
            "annotations": {DELETION_COST: "-200000000"}}}));
        let pods = [opted("w-1", &worker, true), opted("w-2", &worker, true), opted("w-3", &cheap, false)];
        let pdbs = [pdb("mine", "worker", true), pdb("other", "worker", false), pdb("db", "db", true)];
        let said = hazards(&pods, &pdbs, MaxBusy::new(jiff::SignedDuration::from_hours(24)));
        assert_eq!(said.len(), 6, "{said:#?}");
        assert!(said.iter().any(|s| s.starts_with("jobs/Deployment/worker: its pods tolerate every taint")));
        assert!(said.iter().any(|s| s.starts_with("jobs/Deployment/worker: controller.kubernetes.io/pod-deletion-cost=-200000000")));
        assert!(said.iter().any(|s| s.starts_with("jobs/w-1 is selected by the PodDisruptionBudgets mine and other")));
        assert!(said.iter().any(|s| s.starts_with("PodDisruptionBudget jobs/mine selects opted-in pods with")));
        assert!(!said.iter().any(|s| s.contains("jobs/db")), "a budget over other pods is not busyguard's business");
    }

    #[test]
    fn a_set_up_that_keeps_its_promises_gets_no_warning() {
        let worker = pod(json!({"metadata": {"labels": {BUSY_LABEL: "true", "app": "worker"}}}));
        let said = hazards(
            &[opted("w-1", &worker, false)],
            &[pdb("mine", "worker", false)],
            MaxBusy::new(jiff::SignedDuration::from_hours(24)),
        );
        assert_eq!(said, Vec::<String>::new());
    }
}
