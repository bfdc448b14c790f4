//! The two metrics every review updates, found by its labels' enums. `Family` finds a series by
//! hashing each label's text with std's SipHash: about 600 instructions a lookup, two a review
//! (1.7% of an eviction's instructions). Here a series' handle is kept at an index the enums give,
//! taken from the family the first time, so `/metrics` shows exactly the series `Family` would.

use std::sync::OnceLock;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use strum::EnumCount;

use crate::admission::{Resource, Webhook};
use crate::metrics::{Metrics, ReviewLabels, WebhookLabels};
use crate::policy::ask::Operation;
use crate::policy::outcome::Decision;

/// A review's labels, as the enums they are spelled from.
#[derive(Debug, Clone, Copy)]
pub struct ReviewKey {
    pub webhook: Webhook,
    pub resource: Resource,
    pub operation: Operation,
    pub decision: Decision,
}

const ROUTES: usize = Webhook::COUNT * Resource::COUNT;
const ANSWERS: usize = ROUTES * Operation::COUNT * Decision::COUNT;

impl ReviewKey {
    /// The slot of `admission_review_duration_seconds`' series: by webhook and resource.
    fn route(self) -> usize {
        self.webhook as usize * Resource::COUNT + self.resource as usize
    }

    /// The slot of `admission_reviews`' series: by all four.
    fn answer(self) -> usize {
        (self.route() * Operation::COUNT + self.operation as usize) * Decision::COUNT + self.decision as usize
    }

    fn labels(self) -> ReviewLabels {
        ReviewLabels {
            webhook: self.webhook.as_str(),
            resource: self.resource.label(),
            operation: self.operation.as_str(),
            result: self.decision.as_str(),
        }
    }
}

/// The series' handles, one slot a key; the families themselves stay in `Metrics`.
pub struct ReviewMetrics {
    answered: Box<[OnceLock<Counter>]>,
    timed: Box<[OnceLock<Histogram>]>,
}

impl Default for ReviewMetrics {
    fn default() -> ReviewMetrics {
        let answered = (0..ANSWERS).map(|_| OnceLock::new()).collect();
        let timed = (0..ROUTES).map(|_| OnceLock::new()).collect();
        ReviewMetrics { answered, timed }
    }
}

impl ReviewMetrics {
    /// `admission_reviews`: one more review answered.
    pub fn answered(&self, metrics: &Metrics, key: ReviewKey) {
        let family = || metrics.reviews.get_or_create(&key.labels()).clone();
        in_slot(&self.answered, key.answer(), family, |series| {
            series.inc();
        });
    }

    /// `admission_review_duration_seconds`: how long a review took.
    pub fn timed(&self, metrics: &Metrics, key: ReviewKey, seconds: f64) {
        let family = || {
            let labels = WebhookLabels { webhook: key.webhook.as_str(), resource: key.resource.label() };
            metrics.review_seconds.get_or_create(&labels).clone()
        };
        in_slot(&self.timed, key.route(), family, |series| series.observe(seconds));
    }
}

/// Updates the series kept at `index`, taken from its family the first time. Every key has a slot
/// (the test below); were one missing, the family's own lookup answers, never a panic.
fn in_slot<M>(slots: &[OnceLock<M>], index: usize, family: impl FnOnce() -> M, update: impl FnOnce(&M)) {
    match slots.get(index) {
        Some(slot) => update(slot.get_or_init(family)),
        None => update(&family()),
    }
}

#[cfg(test)]
mod tests {
    use strum::IntoEnumIterator;

    use super::*;

    fn key(webhook: Webhook, resource: Resource, operation: Operation, decision: Decision) -> ReviewKey {
        ReviewKey { webhook, resource, operation, decision }
    }

    #[test]
    fn every_review_key_has_a_slot_of_its_own() {
        let mut answers = Vec::new();
        let mut routes = Vec::new();
        for webhook in Webhook::iter() {
            for resource in Resource::iter() {
                for operation in Operation::iter() {
                    for decision in Decision::iter() {
                        let key = key(webhook, resource, operation, decision);
                        answers.push(key.answer());
                        routes.push(key.route());
                    }
                }
            }
        }
        answers.sort_unstable();
        routes.sort_unstable();
        routes.dedup();
        assert_eq!(answers, (0..ANSWERS).collect::<Vec<_>>(), "each key its own slot, none left over");
        assert_eq!(routes, (0..ROUTES).collect::<Vec<_>>(), "each webhook and resource its own slot");
    }

    #[test]
    fn reviews_are_counted_and_timed_in_the_series_their_labels_name() {
        let metrics = Metrics::default();
        let reviews = ReviewMetrics::default();
        let denied = key(Webhook::Validating, Resource::PodEviction, Operation::Create, Decision::Denied);
        let allowed = ReviewKey { decision: Decision::Allowed, ..denied };
        reviews.answered(&metrics, denied);
        reviews.answered(&metrics, denied);
        reviews.answered(&metrics, allowed);
        reviews.timed(&metrics, denied, 0.001);
        reviews.timed(&metrics, allowed, 0.002);
        let count = |result| {
            let labels = ReviewLabels { webhook: "validating", resource: "pods/eviction", operation: "CREATE", result };
            metrics.reviews.get_or_create(&labels).get()
        };
        assert_eq!((count("denied"), count("allowed")), (2, 1));
        let text = metrics.encode();
        let timed =
            "busyguard_admission_review_duration_seconds_count{webhook=\"validating\",resource=\"pods/eviction\"} 2";
        assert!(text.contains(timed), "{text}");
        assert_eq!(text.matches("busyguard_admission_reviews_total{").count(), 2, "{text}");
    }
}
