//! How a pod uses the contract, said back to whoever writes it (warnings in the admission
//! answer, `busyguard status`): busy label values busyguard does not know, an own cost that
//! Karpenter counts as nothing, an own max-busy it cannot read or will not honour whole, and keys
//! of older versions it no longer reads.

use jiff::SignedDuration;

use super::busy::MaxBusy;
use super::cost::KARPENTER_NOTHING_COST;
use super::keys::{
    BUSY_LABEL, DELETE_REQUESTED, DELETION_COST, IDLE_COST, MAX_BUSY, MAX_UNAVAILABLE, RETIRED_WHEN_UNREADY,
    WHEN_UNREADY,
};
use super::pod::PodFacts;
use crate::duration::parse_positive_duration;

/// What is wrong with how a pod uses the contract, said back to whoever wrote it.
pub fn contract_warnings(pod: &impl PodFacts, max_busy: MaxBusy) -> Vec<String> {
    let mut warnings = Vec::new();
    if let Some(value) = pod.label(BUSY_LABEL).filter(|v| !matches!(*v, "true" | "false" | WHEN_UNREADY)) {
        warnings.push(label_unknown(value));
    }
    // The user's own cost: on the pod while idle, kept aside while busy.
    let mut own_costs =
        [DELETION_COST, IDLE_COST].into_iter().filter_map(|key| pod.annotation(key)?.parse::<i64>().ok());
    if let Some(cost) = own_costs.find(|cost| *cost <= -KARPENTER_NOTHING_COST) {
        warnings.push(cost_counts_as_nothing(cost));
    }
    match (pod.annotation(MAX_BUSY).map(parse_positive_duration), max_busy.ceiling) {
        (Some(Err(e)), _) => warnings.push(max_busy_ignored(&e)),
        (Some(Ok(own)), Some(ceiling)) if own > ceiling => {
            warnings.push(max_busy_above_ceiling(own, ceiling));
        }
        (Some(Ok(own)), _) if own < max_busy.floor => warnings.push(max_busy_under_floor(own, max_busy.floor)),
        _ => {}
    }
    warnings.extend(retired_keys(pod).map(retired_key));
    warnings
}

/// The keys of older versions a pod still carries, which busyguard no longer reads: the
/// protection they stood for is gone until they are moved.
pub fn retired_keys(pod: &impl PodFacts) -> impl Iterator<Item = RetiredKey> {
    [
        (pod.annotation(RETIRED_WHEN_UNREADY) == Some("true")).then_some(RetiredKey::WhenUnreadyAnnotation),
        pod.annotation(MAX_UNAVAILABLE).map(|_| RetiredKey::BudgetAnnotation),
        (pod.annotation(DELETE_REQUESTED).is_some() && pod.label(DELETE_REQUESTED).is_none())
            .then_some(RetiredKey::MarkWithoutLabel),
    ]
    .into_iter()
    .flatten()
}

/// A key of an older version, by what it meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetiredKey {
    WhenUnreadyAnnotation,
    BudgetAnnotation,
    MarkWithoutLabel,
}

fn retired_key(key: RetiredKey) -> String {
    match key {
        RetiredKey::WhenUnreadyAnnotation => format!(
            "busyguard: annotation {RETIRED_WHEN_UNREADY} is no longer read, so this pod is not protected when not \
             Ready: set the label {BUSY_LABEL}={WHEN_UNREADY} instead, on the running pods first (kubectl label pod \
             --overwrite), then in the pod template (changing only the template rolls the workload, whose old \
             NotReady pods go first)"
        ),
        RetiredKey::BudgetAnnotation => format!(
            "busyguard: annotation {MAX_UNAVAILABLE} is no longer read, so this pod's workload has no budget: make \
             it a label, on the running pods first (kubectl label pod), then in the pod template"
        ),
        RetiredKey::MarkWithoutLabel => format!(
            "busyguard: annotation {DELETE_REQUESTED} without its label is not carried out (a deferred delete of an \
             older version, or half a mark): delete the pod again once it is idle"
        ),
    }
}

pub fn max_busy_ignored(error: &str) -> String {
    format!("busyguard: annotation {MAX_BUSY} ignored, the default applies: {error}")
}

pub fn max_busy_above_ceiling(own: SignedDuration, ceiling: SignedDuration) -> String {
    format!(
        "busyguard: annotation {MAX_BUSY}={own:#} is above the cluster's ceiling; protection ends after {ceiling:#}"
    )
}

pub fn max_busy_under_floor(own: SignedDuration, floor: SignedDuration) -> String {
    format!(
        "busyguard: annotation {MAX_BUSY}={own:#} is below the cluster's floor; protection lasts {floor:#} at \
         least, and a flip to busy is refused until it is raised"
    )
}

pub fn label_unknown(value: &str) -> String {
    format!(
        "busyguard: label {BUSY_LABEL}={value:?} is neither \"true\", \"false\" nor \"{WHEN_UNREADY}\"; the pod \
         counts as idle"
    )
}

pub fn cost_counts_as_nothing(cost: i64) -> String {
    format!(
        "busyguard: {DELETION_COST}={cost} is at or below -{KARPENTER_NOTHING_COST}: Karpenter (1.14 and later) \
         counts such a pod as nothing, so its node as empty, and deletes the node without waiting for it; keep \
         idle costs above that"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::*;
    use serde_json::json;

    const DAY: MaxBusy = MaxBusy::new(SignedDuration::from_hours(24));

    #[test]
    fn a_busy_label_busyguard_does_not_know_is_warned_about() {
        let p = pod(json!({"metadata": {"labels": {BUSY_LABEL: "yes"}}}));
        assert_eq!(
            contract_warnings(&p, DAY),
            ["busyguard: label busyguard.io/busy=\"yes\" is neither \"true\", \"false\" nor \"when-unready\"; the \
                 pod counts as idle"]
        );
        let readiness = pod(json!({"metadata": {"labels": {BUSY_LABEL: WHEN_UNREADY}}}));
        assert_eq!(contract_warnings(&readiness, DAY), Vec::<String>::new());
    }

    #[test]
    fn an_own_cost_karpenter_counts_as_nothing_is_warned_about_idle_or_busy() {
        let with = |label: &str, key: &str, cost: &str| {
            pod(json!({"metadata": {"labels": {BUSY_LABEL: label}, "annotations": {key: cost}}}))
        };
        let warned = contract_warnings(&with("false", DELETION_COST, "-134217728"), DAY);
        assert_eq!(warned.len(), 1);
        assert!(warned[0].contains("=-134217728 is at or below -134217728: Karpenter"), "{warned:?}");
        assert_eq!(contract_warnings(&with("true", IDLE_COST, "-200000000"), DAY).len(), 1, "kept aside while busy");
        assert!(contract_warnings(&with("false", DELETION_COST, "-134217727"), DAY).is_empty());
        assert!(contract_warnings(&with("false", DELETION_COST, "-5"), DAY).is_empty());
    }

    #[test]
    fn a_max_busy_above_the_ceiling_or_unreadable_is_warned_about() {
        let ceiling = MaxBusy { ceiling: Some(jiff::SignedDuration::from_hours(2)), ..DAY };
        let with =
            |value: &str| pod(json!({"metadata": {"labels": {BUSY_LABEL: "true"}, "annotations": {MAX_BUSY: value}}}));
        assert_eq!(
            contract_warnings(&with("72h"), ceiling),
            [
                "busyguard: annotation busyguard.io/max-busy=72h is above the cluster's ceiling; protection ends after 2h"
            ]
        );
        assert_eq!(contract_warnings(&with("90m"), ceiling), Vec::<String>::new(), "below the ceiling: fine");
        for bad in ["forever", "-5m", "0s"] {
            let warnings = contract_warnings(&with(bad), DAY);
            assert_eq!(warnings.len(), 1, "{bad}");
            assert!(warnings[0].starts_with("busyguard: annotation busyguard.io/max-busy ignored"), "{warnings:?}");
        }
    }

    #[test]
    fn keys_of_older_versions_are_warned_about_for_the_protection_they_no_longer_give() {
        let mut doc = worker(json!({
            RETIRED_WHEN_UNREADY: "true",
            MAX_UNAVAILABLE: "1",
            DELETE_REQUESTED: r#"{"by":"alice","at":"2026-01-01T00:00:00Z"}"#,
        }));
        set_label(&mut doc, "true");
        let warnings = contract_warnings(&pod(doc.clone()), DAY);
        assert_eq!(warnings.len(), 3, "{warnings:#?}");
        assert!(
            warnings[0].contains("set the label busyguard.io/busy=when-unready instead, on the running pods first"),
            "{}",
            warnings[0]
        );
        assert!(warnings[1].contains("make it a label, on the running pods first"), "{}", warnings[1]);
        assert!(warnings[2].contains("delete the pod again once it is idle"), "{}", warnings[2]);
        doc["metadata"]["labels"][DELETE_REQUESTED] = json!("true");
        doc["metadata"]["annotations"].as_object_mut().unwrap().remove(RETIRED_WHEN_UNREADY);
        doc["metadata"]["annotations"].as_object_mut().unwrap().remove(MAX_UNAVAILABLE);
        assert!(contract_warnings(&pod(doc), DAY).is_empty(), "a whole mark, and none of the old keys");
    }
}
