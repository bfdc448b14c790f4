//! The two metrics every review updates, found by its labels' enums. `Family` finds a series by
//! hashing each label's text with std's SipHash: about 600 instructions a lookup, two a review
//! (1.7% of an eviction's instructions). Here a series' handle is kept at an index the enums give,
//! taken from the family the first time, so `/metrics` shows exactly the series `Family` would.

use std::sync::{Arc, OnceLock};

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

pub struct ReviewMetrics {
    metrics: Arc<Metrics>,
    answered: Box<[OnceLock<Counter>]>,
    timed: Box<[OnceLock<Histogram>]>,
}

impl ReviewMetrics {
    pub fn new(metrics: Arc<Metrics>) -> ReviewMetrics {
        let answered = (0..ANSWERS).map(|_| OnceLock::new()).collect();
        let timed = (0..ROUTES).map(|_| OnceLock::new()).collect();
        ReviewMetrics { metrics, answered, timed }
    }

    /// `admission_reviews`: one more review answered.
    pub fn answered(&self, key: ReviewKey) {
        let series = || self.metrics.reviews.get_or_create(&key.labels()).clone();
        // Every key has a slot (the test below); the family's own lookup is the fallback, not a panic.
        match self.answered.get(key.answer()) {
            Some(slot) => slot.get_or_init(series).inc(),
            None => series().inc(),
        };
    }

    /// `admission_review_duration_seconds`: how long a review took.
    pub fn timed(&self, key: ReviewKey, seconds: f64) {
        let labels = WebhookLabels { webhook: key.webhook.as_str(), resource: key.resource.label() };
        let series = || self.metrics.review_seconds.get_or_create(&labels).clone();
        match self.timed.get(key.route()) {
            Some(slot) => slot.get_or_init(series).observe(seconds),
            None => series().observe(seconds),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(webhook: Webhook, resource: Resource, operation: Operation, decision: Decision) -> ReviewKey {
        ReviewKey { webhook, resource, operation, decision }
    }

    #[test]
    fn every_review_key_has_a_slot_of_its_own() {
        let first = key(Webhook::Mutating, Resource::Pods, Operation::Create, Decision::Allowed);
        let last = key(Webhook::Validating, Resource::Other, Operation::Connect, Decision::Restored);
        assert_eq!((first.answer(), first.route()), (0, 0));
        assert_eq!((last.answer(), last.route()), (ANSWERS - 1, ROUTES - 1));
        let denied = key(Webhook::Validating, Resource::PodEviction, Operation::Create, Decision::Denied);
        let allowed = ReviewKey { decision: Decision::Allowed, ..denied };
        let deleted = ReviewKey { operation: Operation::Delete, ..denied };
        let pods = ReviewKey { resource: Resource::Pods, ..denied };
        let answers = [denied, allowed, deleted, pods, first, last].map(ReviewKey::answer);
        assert_eq!(answers.iter().collect::<std::collections::BTreeSet<_>>().len(), answers.len());
    }

    #[test]
    fn reviews_are_counted_and_timed_in_the_series_their_labels_name() {
        let metrics = Arc::new(Metrics::default());
        let reviews = ReviewMetrics::new(metrics.clone());
        let denied = key(Webhook::Validating, Resource::PodEviction, Operation::Create, Decision::Denied);
        let allowed = ReviewKey { decision: Decision::Allowed, ..denied };
        reviews.answered(denied);
        reviews.answered(denied);
        reviews.answered(allowed);
        reviews.timed(denied, 0.001);
        reviews.timed(allowed, 0.002);
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
