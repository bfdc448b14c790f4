//! Prometheus metrics, served as text on the admin port's `/metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::audit::AuditMetrics;

/// Every label value is a fixed string, so no client can make the label space grow.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReviewLabels {
    pub webhook: &'static str,
    pub resource: &'static str,
    pub operation: &'static str,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    commit: &'static str,
}

/// A review's time is told by webhook and resource: a scale-down's answer waits for its pods'
/// refresh by design (up to 2.5 s), an eviction's does not.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabels {
    pub webhook: &'static str,
    pub resource: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabels {
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SideEffectLabels {
    pub kind: &'static str,
    pub result: &'static str,
}

/// What audit mode let through that enforce mode would have refused: the route (the review's
/// resource label) and the audit line's reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WouldDenyLabels {
    pub route: &'static str,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabels {
    pub cause: &'static str,
}

/// One workload's pods in one state; workloads are bounded (see `policy::workloads`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkloadLabels {
    pub namespace: String,
    pub workload: String,
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkloadOnlyLabels {
    pub namespace: String,
    pub workload: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OwnerRuleLabels {
    /// The kind a `--busy-when-owner` rule follows: `agones.dev/v1/GameServer`.
    pub rule: String,
}

/// The `result` of a certificate reload.
pub const RELOADED: &str = "ok";
pub const RELOAD_REJECTED: &str = "error";

/// The HTTP errors busyguard answers (see `http_errors`' help).
const ERROR_STATUSES: [u16; 8] = [400, 404, 405, 408, 413, 415, 500, 503];

pub struct Metrics {
    registry: Registry,
    pub reviews: Family<ReviewLabels, Counter>,
    pub would_deny: Family<WouldDenyLabels, Counter>,
    pub review_seconds: Family<WebhookLabels, Histogram, fn() -> Histogram>,
    pub http_errors: Family<StatusLabels, Counter>,
    pub reviews_shed: Counter,
    pub connections_refused: Counter,
    pub admin_connections_refused: Counter,
    pub audit: AuditMetrics,
    pub tls_reloads: Family<ResultLabels, Counter>,
    pub side_effects: Family<SideEffectLabels, Counter>,
    pub busy_pods_lost: Family<CauseLabels, Counter>,
    pub busy_pods_unaccounted: Counter,
    pub busy_marks_overwritten: Counter,
    pub view_pods: Gauge,
    pub view_unavailable: Gauge,
    pub audit_failing: Gauge,
    pub watch_errors: Counter,
    pub busy_pdb_conflicts: Gauge,
    pub controller_manager_shared_identity: Gauge,
    pub workload_pods: Family<WorkloadLabels, Gauge>,
    pub workload_deferred_deletes: Family<WorkloadOnlyLabels, Gauge>,
    pub workload_retired_keys: Family<WorkloadOnlyLabels, Gauge>,
    pub tls_certificate_expiry: Gauge,
    pub owner_rule_followed: Family<OwnerRuleLabels, Gauge>,
    pub kueue_hold_followed: Gauge,
    pub owner_rule_ended_idle: Family<OwnerRuleLabels, Gauge>,
    pub owner_rule_undecided: Family<OwnerRuleLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("busyguard");
        // `busyguard_build_info{version,commit} 1`: which replica runs what, during a rollout. A
        // gauge, not OpenMetrics' info type, which scrapers of the older text format refuse.
        let build = Family::<BuildLabels, Gauge>::default();
        build.get_or_create(&BuildLabels { version: crate::VERSION, commit: crate::COMMIT }).set(1);
        registry.register("build_info", "The version busyguard is and the commit it was built from", build);
        let reviews = Family::<ReviewLabels, Counter>::default();
        registry.register(
            "admission_reviews",
            "AdmissionReviews answered, by webhook, resource, operation and result",
            reviews.clone(),
        );
        let would_deny = Family::<WouldDenyLabels, Counter>::default();
        registry.register(
            "would_deny",
            "Audit mode (--mode audit): requests allowed that enforce mode would have refused, by route and reason",
            would_deny.clone(),
        );
        // 50 µs to ~0.8 s: the answers are usually well under a millisecond.
        let review_seconds: Family<WebhookLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.00005, 2.0, 15)));
        registry.register(
            "admission_review_duration_seconds",
            "Time from a complete request body to the encoded answer",
            review_seconds.clone(),
        );
        let http_errors = Family::<StatusLabels, Counter>::default();
        registry.register(
            "http_errors",
            "Requests answered with an HTTP error instead of a review (4xx: malformed, oversized, too slow, wrong \
             method or type; 503: no decision possible), by HTTP status",
            http_errors.clone(),
        );
        // Every label set an alert counts exists from the start, at 0: `increase()` sees no first
        // event in a series that is born at 1.
        for status in ERROR_STATUSES {
            drop(http_errors.get_or_create(&StatusLabels { status }));
        }
        let reviews_shed = Counter::default();
        registry.register(
            "admission_reviews_shed",
            "Requests answered 503 at once because max-in-flight reviews were already being handled",
            reviews_shed.clone(),
        );
        let connections_refused = Counter::default();
        registry.register(
            "connections_refused",
            "Webhook connections closed on accept because max-connections were open",
            connections_refused.clone(),
        );
        let admin_connections_refused = Counter::default();
        registry.register(
            "admin_connections_refused",
            "Admin port connections closed on accept because 64 were open",
            admin_connections_refused.clone(),
        );
        let audit = AuditMetrics::default();
        registry.register(
            "audit_write_errors",
            "Failed attempts to write audit lines (disk full, file unwritable); the lines are held and retried",
            audit.write_errors.clone(),
        );
        registry.register("audit_lines_held", "Audit lines waiting in memory to be written", audit.held.clone());
        registry.register(
            "audit_lines_dropped",
            "Audit lines given up because too many were already waiting to be written",
            audit.dropped.clone(),
        );
        let tls_reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "tls_reloads",
            "Serving certificate reloads after the files changed, by result (ok, error)",
            tls_reloads.clone(),
        );
        for result in [RELOADED, RELOAD_REJECTED] {
            drop(tls_reloads.get_or_create(&ResultLabels { result }));
        }
        let side_effects = Family::<SideEffectLabels, Counter>::default();
        registry.register(
            "side_effects",
            "Patches, deferred deletes and Events, by kind and result (ok, moot, failed, dropped, rate-limited)",
            side_effects.clone(),
        );
        let busy_pods_lost = Family::<CauseLabels, Counter>::default();
        registry.register(
            "busy_pods_lost",
            "Busy pods that failed or vanished without a request busyguard could refuse, by cause",
            busy_pods_lost.clone(),
        );
        let busy_marks_overwritten = Counter::default();
        registry.register(
            "busy_marks_overwritten",
            "Writes by another writer that took busyguard's marks off a busy pod (the deletion cost, do-not-disrupt, \
             safe-to-evict), each put back in the same write; /status names the last writer",
            busy_marks_overwritten.clone(),
        );
        let busy_pods_unaccounted = Counter::default();
        registry.register(
            "busy_pods_unaccounted",
            "Busy pods that went while busyguard's watch was down, found gone on a relist: deleted by a request \
             busyguard allowed, or lost",
            busy_pods_unaccounted.clone(),
        );
        let view_pods = Gauge::default();
        registry.register("view_pods", "Opted-in pods in the cluster view", view_pods.clone());
        let view_unavailable = Gauge::default();
        registry.register(
            "view_unavailable",
            "1 while the cluster view cannot be trusted (not listed yet, or no sign of life from the API server for \
             longer than --view-stale-after): evictions get 503 and scale-downs go unprepared",
            view_unavailable.clone(),
        );
        let audit_failing = Gauge::default();
        registry.register(
            "audit_failing",
            "1 while audit lines cannot be written (they are held in memory)",
            audit_failing.clone(),
        );
        let watch_errors = Counter::default();
        registry.register(
            "watch_errors",
            "Failed attempts to list or watch opted-in pods, or the namespaces their list waits for",
            watch_errors.clone(),
        );
        let busy_pdb_conflicts = Gauge::default();
        registry.register(
            "busy_pdb_conflicts",
            "Namespaces kept without the busy-pod PDB because a PDB of the user's selects opted-in pods too",
            busy_pdb_conflicts.clone(),
        );
        let controller_manager_shared_identity = Gauge::default();
        registry.register(
            "controller_manager_shared_identity",
            "1 once a pod delete or eviction came as system:kube-controller-manager: the controller-manager runs \
             without --use-service-account-credentials, so busyguard cannot tell its controllers apart",
            controller_manager_shared_identity.clone(),
        );
        let workload_pods = Family::<WorkloadLabels, Gauge>::default();
        registry.register(
            "workload_pods",
            "Opted-in pods per workload (a Deployment, or a pod's controlling owner) by state: busy, idle, or lapsed \
             (marked busy, no longer protected); at most 500 workloads, the rest summed as (other)",
            workload_pods.clone(),
        );
        let workload_deferred_deletes = Family::<WorkloadOnlyLabels, Gauge>::default();
        registry.register(
            "workload_deferred_deletes",
            "Pods per workload with a delete waiting for them to turn idle",
            workload_deferred_deletes.clone(),
        );
        let workload_retired_keys = Family::<WorkloadOnlyLabels, Gauge>::default();
        registry.register(
            "workload_pods_with_retired_keys",
            "Pods per workload still carrying a key of an older busyguard that is no longer read (the annotations \
             busyguard.io/busy-when-unready or busyguard.io/max-unavailable, a delete-requested mark without its \
             label): the protection it stood for is gone until it is moved (see busyguard status)",
            workload_retired_keys.clone(),
        );
        let tls_certificate_expiry = Gauge::default();
        registry.register(
            "tls_certificate_expiry_timestamp_seconds",
            "When the serving certificate in use expires (Unix seconds): the API server's calls fail after it",
            tls_certificate_expiry.clone(),
        );
        let kueue_hold_followed = Gauge::default();
        kueue_hold_followed.set(1);
        registry.register(
            "kueue_hold_followed",
            "0 while --hold-kueue-preemption is on and Kueue's Workloads are not followed (Kueue not served, the API \
             server not reachable, their watch failing: RBAC), so Kueue's preemptions are not held; 1 otherwise",
            kueue_hold_followed.clone(),
        );
        let owner_rule_followed = Family::<OwnerRuleLabels, Gauge>::default();
        registry.register(
            "owner_rule_followed",
            "1 while the owners of a --busy-when-owner rule's kind are followed; 0 while the API server does not serve \
             the kind or its watch fails (the owners' pods keep the busy label they have; everything else is served)",
            owner_rule_followed.clone(),
        );
        let owner_rule_ended_idle = Family::<OwnerRuleLabels, Gauge>::default();
        registry.register(
            "owner_rule_ended_idle",
            "Owners of a --busy-when-owner rule's kind that ended one after the other without the rule ever holding for \
             them (back to 0 when it holds): a rule reading a field the owner's release does not write holds for none",
            owner_rule_ended_idle.clone(),
        );
        let owner_rule_undecided = Family::<OwnerRuleLabels, Counter>::default();
        registry.register(
            "owner_rule_undecided",
            "Owner changes a --busy-when-owner rule could not judge (it did not evaluate to a boolean): their pods were \
             left as they were",
            owner_rule_undecided.clone(),
        );
        Metrics {
            registry,
            reviews,
            would_deny,
            review_seconds,
            http_errors,
            reviews_shed,
            connections_refused,
            admin_connections_refused,
            audit,
            tls_reloads,
            side_effects,
            busy_pods_lost,
            busy_pods_unaccounted,
            busy_marks_overwritten,
            view_pods,
            view_unavailable,
            audit_failing,
            watch_errors,
            busy_pdb_conflicts,
            controller_manager_shared_identity,
            workload_pods,
            workload_deferred_deletes,
            workload_retired_keys,
            tls_certificate_expiry,
            owner_rule_followed,
            kueue_hold_followed,
            owner_rule_ended_idle,
            owner_rule_undecided,
        }
    }
}

impl Metrics {
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).expect("writing to a String cannot fail");
        text
    }
}
