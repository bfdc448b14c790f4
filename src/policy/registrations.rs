//! When the API server needs to call busyguard at all: the `objectSelector`s and CEL
//! `matchConditions` the webhooks of `manifests/base` ship, built here beside the policy they
//! stand for. A request they skip is one busyguard would answer "allowed, unchanged" anyway (or,
//! for an idle pod's write, one whose leftovers busyguard's watch repairs as well), so skipping
//! it saves the API server a round trip and, for the fail-closed pod deletes, keeps busyguard's
//! availability out of the way of writes that cannot matter. `make manifests` writes the
//! conditions into the manifests ([`match_conditions`]) and `tests/manifests/` holds them there;
//! the tests below evaluate them against the decisions they stand for.
//!
//! The selectors come first, because they are what makes skipping cheap: the API server matches
//! labels before anything else, while a matchCondition first converts the pod (old and new) to
//! evaluate CEL on it, which costs it as much as 7 % of its throughput per webhook on pod writes
//! (BENCHMARKS.md). So whatever makes an idle pod's write or delete matter is a label.

use serde_json::{Value, json};

use super::budget::LEASE_PREFIX;
use super::keys::{
    ARGO_WORKFLOW, BUSY_LABEL, BUSY_SINCE, DECIDING_ANNOTATIONS, DELETE_REQUESTED, IDLE_COST, IDLE_DO_NOT_DISRUPT,
    IDLE_SAFE_TO_EVICT, JOB_NAME, MAX_UNAVAILABLE, NAMESPACE_ENABLED_LABEL, OWN_FLAGS_NAMESPACE_LABEL, PROTECTED_LABEL,
    RUN_TO_COMPLETION_NAMESPACE_LABEL, TEKTON_TASK_RUN, WHEN_UNREADY,
};
use super::namespaces::{BUSYGUARD_NAMESPACE, Enrolment, NEVER_GUARDED_NAMESPACES, busyguards_user};
use super::pdb::BUSY_PDB_NAME;
use super::requesters::{
    CLOUD_NODE_LIFECYCLE_USERS, NAMESPACE_CONTROLLER_USER, POD_GC_USER, POD_NAME_CLAIM, SCHEDULER_USER,
    TAINT_MANAGER_USERS,
};

/// Opted-in pods not labelled idle: busy, busy by readiness (and any value busyguard does not
/// know). An UPDATE is sent when the old pod or the new one matches, so a flip either way is.
/// The mutating webhook and the deletes select these.
pub fn not_idle() -> Value {
    json!({"matchExpressions": [
        {"key": BUSY_LABEL, "operator": "Exists"},
        {"key": BUSY_LABEL, "operator": "NotIn", "values": ["false"]},
    ]})
}

/// Opted-in pods under a workload budget: the deletes busyguard counts although the pod is not
/// busy ([`pod_delete_counted_by_a_budget`]).
pub fn under_a_budget() -> Value {
    json!({"matchExpressions": [
        {"key": BUSY_LABEL, "operator": "Exists"},
        {"key": MAX_UNAVAILABLE, "operator": "Exists"},
    ]})
}

/// The labels by which run-to-completion owners mark their pods, each with its webhook: a Job's
/// (the Job controller, Kubernetes 1.27 and later), an Argo Workflow's, a Tekton TaskRun's. A
/// webhook of the same shape with another owner's label protects that owner's pods too.
pub const RUN_TO_COMPLETION: [(&str, &str); 3] = [
    ("run-to-completion-jobs.busyguard.io", JOB_NAME),
    ("run-to-completion-workflows.busyguard.io", ARGO_WORKFLOW),
    ("run-to-completion-taskruns.busyguard.io", TEKTON_TASK_RUN),
];

/// Pods created by a run-to-completion owner (`owner_label`) that did not opt in themselves:
/// busyguard makes them busy for their whole run (`mutate::mutate_pod`). Selected by labels
/// alone, so the API server pays nothing for any other pod.
pub fn run_to_completion(owner_label: &str) -> Value {
    json!({"matchExpressions": [
        {"key": BUSY_LABEL, "operator": "DoesNotExist"},
        {"key": owner_label, "operator": "Exists"},
    ]})
}

/// The namespaces whose run-to-completion pods are busy while they run: those labelled
/// [`RUN_TO_COMPLETION_NAMESPACE_LABEL`] `"true"`, among those busyguard guards.
pub fn run_to_completion_namespaces(enrolment: Enrolment) -> Value {
    let mut selector = guarded_namespaces(false, enrolment);
    let expressions = selector["matchExpressions"].as_array_mut().expect("an array");
    expressions.push(json!({"key": RUN_TO_COMPLETION_NAMESPACE_LABEL, "operator": "In", "values": ["true"]}));
    selector
}

/// Opted-in pods labelled idle: for the own-flag rule on idle pods.
pub fn idle() -> Value {
    json!({"matchExpressions": [{"key": BUSY_LABEL, "operator": "In", "values": ["false"]}]})
}

/// The namespaces busyguard guards ([`NEVER_GUARDED_NAMESPACES`] never, and of the others those
/// `enrolment` lets in by [`NAMESPACE_ENABLED_LABEL`]: every one not labelled out, or only those
/// labelled in, the value busyguard's watch selects by), and with `own_flags`, of those the ones
/// not labelled [`OWN_FLAGS_NAMESPACE_LABEL`] `"false"`: namespaces that grant their workers no
/// pod write may spare the API server the own-flag rule's condition on every write to an idle
/// pod.
pub fn guarded_namespaces(own_flags: bool, enrolment: Enrolment) -> Value {
    let operator = match enrolment {
        Enrolment::OptOut => "NotIn",
        Enrolment::OptIn => "In",
    };
    let mut expressions = vec![
        json!({"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": NEVER_GUARDED_NAMESPACES}),
        json!({"key": NAMESPACE_ENABLED_LABEL, "operator": operator, "values": [enrolment.exception()]}),
    ];
    if own_flags {
        expressions.push(json!({"key": OWN_FLAGS_NAMESPACE_LABEL, "operator": "NotIn", "values": ["false"]}));
    }
    json!({"matchExpressions": expressions})
}

/// The own-flag webhooks (`pod-flags`, `idle-pod-flags`): a write by a token bound to a pod (a
/// worker, or a controller running in a pod: busyguard tells them apart by the view and the
/// pod's service account), or one that changes busyguard's own keys (busy-since, the protected
/// label), whoever makes it. Everything else was allowed unchanged before busyguard existed.
pub fn from_a_pod_or_on_busyguards_keys() -> String {
    format!(
        "(has(request.userInfo.extra) && '{POD_NAME_CLAIM}' in request.userInfo.extra) || {} || {}",
        changed("annotations", &[BUSY_SINCE]),
        changed("labels", &[PROTECTED_LABEL])
    )
}

/// The own-flag rule's webhook for idle pods: a write the one for [`not_idle`] pods does not see,
/// since neither the old pod nor the new one is labelled anything but idle (a flip to busy, or
/// of a busy pod, goes there; an idle pod's label removed or set comes here).
pub fn not_for_pod_flags() -> String {
    let not_idle =
        |o: &str| format!("({} && {o}.metadata.labels['{BUSY_LABEL}'] != 'false')", has_key(o, "labels", BUSY_LABEL));
    format!("!{} && !{}", not_idle("oldObject"), not_idle("object"))
}

/// Pods that carry (or are given) a delete-requested mark, by its label.
pub fn marked() -> Value {
    json!({"matchExpressions": [{"key": DELETE_REQUESTED, "operator": "Exists"}]})
}

/// Annotations that say busyguard has something to do on a pod whatever changed: its own
/// leftovers to restore.
const ACTING_ANNOTATIONS: [&str; 4] = [BUSY_SINCE, IDLE_COST, IDLE_DO_NOT_DISRUPT, IDLE_SAFE_TO_EVICT];

/// The mutating webhook (pod CREATE and UPDATE of [`not_idle`] pods): a write busyguard could
/// patch. Sent: a pod busy by its label or by readiness (not Ready), or carrying busyguard's
/// leftovers; and on UPDATE, any change of the busy or protected label or of an annotation a
/// decision reads.
pub fn pod_write_may_be_patched() -> String {
    let acting = |o: &str| {
        format!(
            "{} || {} || {} || {}",
            is_busy(o),
            busy_by_readiness(o),
            has_key(o, "labels", PROTECTED_LABEL),
            any_key(o, "annotations", &ACTING_ANNOTATIONS)
        )
    };
    format!(
        "request.operation == 'CREATE' ? ({acting}) : ({changed} || {changed_annotations} || {acting})",
        acting = acting("object"),
        changed = changed("labels", &[BUSY_LABEL, PROTECTED_LABEL]),
        changed_annotations = changed("annotations", &DECIDING_ANNOTATIONS),
    )
}

/// The fail-closed pod deletes (of [`not_idle`] pods): a delete busyguard could refuse. Sent: a
/// pod busy by its label, or by readiness (not Ready), that has started and not finished. Every
/// other delete of an opted-in pod goes on while busyguard is down: a finished or never-started
/// pod's, and a Ready pod's in readiness mode.
pub fn pod_delete_may_be_refused() -> String {
    let o = "oldObject";
    format!("({} || {}) && !{} && !{}", is_busy(o), busy_by_readiness(o), finished(o), not_started(o))
}

/// Whether `o` has finished (Succeeded or Failed): its containers will not run again.
fn finished(o: &str) -> String {
    format!("(has({o}.status) && has({o}.status.phase) && {o}.status.phase in ['Succeeded', 'Failed'])")
}

/// [`crate::policy::pod::not_started`]: Pending, and not on a node yet or with every container
/// reported and none that ever ran.
fn not_started(o: &str) -> String {
    let none_ran = "c.restartCount == 0 && (!has(c.state) || (!has(c.state.running) && !has(c.state.terminated))) \
                    && !(has(c.lastState) && has(c.lastState.terminated))";
    format!(
        "(has({o}.status) && has({o}.status.phase) && {o}.status.phase == 'Pending' && (!has({o}.spec.nodeName) || \
         (has({o}.status.containerStatuses) && size({o}.status.containerStatuses) > 0 && \
         {o}.status.containerStatuses.all(c, {none_ran}))))"
    )
}

/// The budget's deletes (of pods [`under_a_budget`], failing open): the rest of them, which
/// busyguard counts against the workload's budget.
pub fn pod_delete_counted_by_a_budget() -> String {
    format!("!({})", pod_delete_may_be_refused())
}

/// The mark webhook (of [`marked`] pods, busyguard's own writes aside): a write that gives a pod
/// a whole delete-requested mark (label and annotation) it did not carry before, or opts a pod in
/// with one. As `writes::marks_anew`.
pub fn pod_write_marks_anew() -> String {
    let mark = |o: &str| {
        format!("{} && {}", has_key(o, "labels", DELETE_REQUESTED), has_key(o, "annotations", DELETE_REQUESTED))
    };
    format!(
        "{new} && (request.operation == 'CREATE' || !({old} && \
         oldObject.metadata.annotations['{DELETE_REQUESTED}'] == object.metadata.annotations['{DELETE_REQUESTED}']) \
         || (!{old_opted_in} && {new_opted_in}))",
        new = mark("object"),
        old = mark("oldObject"),
        old_opted_in = has_key("oldObject", "labels", BUSY_LABEL),
        new_opted_in = has_key("object", "labels", BUSY_LABEL),
    )
}

/// Scale-downs: an update that lowers the replica count (anything else is allowed unprepared).
pub const LOWERS_REPLICAS: &str =
    "has(object.spec.replicas) && has(oldObject.spec.replicas) && object.spec.replicas < oldObject.spec.replicas";

/// Pod deletes sent to the fail-open hooks (`pod-preemptions`, `budget-preemptions`) rather than
/// the fail-closed ones: the scheduler's preemptions, and Karpenter's deletes (`karpenter`), which
/// busyguard lets through anyway (at its node's deadline the instance goes: better a graceful
/// delete than a hard kill), so that busyguard being down never holds them.
pub fn from_a_delete_that_must_not_wait(karpenter: &[String]) -> String {
    let mut users = vec![SCHEDULER_USER];
    users.extend(karpenter.iter().map(String::as_str));
    format!("request.userInfo.username in {}", list(&users))
}

/// The fail-closed hooks' side of [`from_a_delete_that_must_not_wait`].
pub fn not_from_a_delete_that_must_not_wait(karpenter: &[String]) -> String {
    format!("!({})", from_a_delete_that_must_not_wait(karpenter))
}

/// Pod deletes never sent: the requesters busyguard always lets through (recovery), so that
/// busyguard being down never holds them. The pod garbage collector is the default exempt user.
pub fn pod_deletes_let_through() -> String {
    let mut users = vec![NAMESPACE_CONTROLLER_USER, POD_GC_USER];
    users.extend(TAINT_MANAGER_USERS);
    not_from(&users)
}

/// Node deletes never sent: the cloud node lifecycle controller's and Karpenter's (by default).
pub fn node_deletes_let_through(karpenter: &[String]) -> String {
    let mut users: Vec<&str> = CLOUD_NODE_LIFECYCLE_USERS.to_vec();
    users.extend(karpenter.iter().map(String::as_str));
    not_from(&users)
}

/// NodeClaim deletes sent: of those that have a node, where busy pods may run.
pub fn node_claim_has_a_node() -> String {
    "has(oldObject.status) && has(oldObject.status.nodeName) && oldObject.status.nodeName != ''".to_string()
}

/// Every matchCondition of `manifests/base/webhooks.yaml`: webhook, condition, expression, in
/// the file's order. `make manifests` writes each expression there from this table, and the
/// manifests tests fail while the file says anything else. `karpenter`: Karpenter's users as
/// `busyguard serve` takes them by default.
pub fn match_conditions(karpenter: &[String]) -> Vec<(&'static str, &'static str, String)> {
    let not_terminating = ("not-already-terminating", "!has(oldObject.metadata.deletionTimestamp)".to_string());
    let not_busyguard = ("not-busyguard-itself", format!("request.userInfo.username != '{}'", busyguards_user()));
    let must_not_wait = ("a-delete-that-must-not-wait", from_a_delete_that_must_not_wait(karpenter));
    let may_wait = ("not-a-delete-that-must-not-wait", not_from_a_delete_that_must_not_wait(karpenter));
    let let_through = ("not-always-let-through", pod_deletes_let_through());
    let refused = ("may-be-refused", pod_delete_may_be_refused());
    let counted = ("counted-by-the-budget", pod_delete_counted_by_a_budget());
    let flags = ("from-a-pod-or-on-busyguards-keys", from_a_pod_or_on_busyguards_keys());
    let webhooks = [
        ("pods.busyguard.io", vec![("may-be-patched", pod_write_may_be_patched())]),
        (
            "pod-deletes.busyguard.io",
            vec![not_terminating.clone(), may_wait.clone(), let_through.clone(), refused.clone()],
        ),
        ("budget-deletes.busyguard.io", vec![not_terminating.clone(), may_wait, let_through, counted.clone()]),
        ("pod-preemptions.busyguard.io", vec![not_terminating.clone(), must_not_wait.clone(), refused]),
        ("budget-preemptions.busyguard.io", vec![not_terminating, must_not_wait, counted]),
        ("pod-flags.busyguard.io", vec![not_busyguard.clone(), flags.clone()]),
        ("idle-pod-flags.busyguard.io", vec![not_busyguard.clone(), flags, ("not-for-pod-flags", not_for_pod_flags())]),
        ("pod-marks.busyguard.io", vec![not_busyguard, ("sets-a-delete-requested-mark", pod_write_marks_anew())]),
        ("scale-downs.busyguard.io", vec![("lowers-replicas", LOWERS_REPLICAS.to_string())]),
        ("node-deletes.busyguard.io", vec![("not-always-let-through", node_deletes_let_through(karpenter))]),
        ("node-claim-deletes.busyguard.io", vec![("has-a-node", node_claim_has_a_node())]),
    ];
    let each = |(webhook, conditions): (&'static str, Vec<(&'static str, String)>)| {
        conditions.into_iter().map(move |(name, expression)| (webhook, name, expression))
    };
    webhooks.into_iter().flat_map(each).collect()
}

fn not_from(users: &[&str]) -> String {
    format!("!(request.userInfo.username in {})", list(users))
}

fn is_busy(o: &str) -> String {
    labelled(o, "true")
}

/// Whether `o` is in readiness mode and not Ready, but for its readiness gates alone: busy by
/// readiness, unless it never was Ready since it started (which busyguard tells; the condition
/// only narrows).
fn busy_by_readiness(o: &str) -> String {
    format!(
        "({} && has({o}.status) && has({o}.status.conditions) && {o}.status.conditions.exists(c, c.type == 'Ready' \
         && c.status != 'True' && !(has(c.reason) && c.reason == 'ReadinessGatesNotReady')))",
        labelled(o, WHEN_UNREADY)
    )
}

/// Whether `o`'s busy label says `value`.
fn labelled(o: &str, value: &str) -> String {
    format!("({} && {o}.metadata.labels['{BUSY_LABEL}'] == '{value}')", has_key(o, "labels", BUSY_LABEL))
}

/// Where busyguard's own token may write or delete pods (the `busyguard-fence` policy of
/// `manifests/base/fence.yaml`): pods that carry one of its labels or annotations, outside the
/// namespaces it never guards.
pub fn busyguards_own_pods() -> String {
    let carries = |field: &str| {
        format!(
            "(has(oldObject.metadata.{field}) && oldObject.metadata.{field}.exists(k, k.startsWith('{KEY_PREFIX}')))"
        )
    };
    format!(
        "!(request.namespace in {}) && ({} || {})",
        list(&NEVER_GUARDED_NAMESPACES),
        carries("labels"),
        carries("annotations")
    )
}

/// Where busyguard's own token may evict pods (the `busyguard-fence-evictions` policy of
/// `manifests/base/fence.yaml`): outside the namespaces it never guards and those labelled out.
/// Which pods there is its eviction webhook's to say: only those whose eviction busyguard
/// deferred (`policy::disruption::judge_own_eviction`); the webhook sees no other namespace.
pub fn busyguards_own_evictions() -> String {
    format!(
        "!(request.namespace in {}) && !(has(namespaceObject.metadata.labels) && \
         namespaceObject.metadata.labels.exists(k, k == '{NAMESPACE_ENABLED_LABEL}' && \
         namespaceObject.metadata.labels[k] == 'false'))",
        list(&NEVER_GUARDED_NAMESPACES)
    )
}

/// Where busyguard's own token may evict pods under `--opt-in` besides (the second rule of
/// `busyguard-fence-evictions`, from `manifests/opt-in` and the chart's `optIn`): only in the
/// namespaces labelled in. No webhook of busyguard's sees another namespace, so there nothing
/// else would refuse a stolen token's eviction.
pub fn busyguards_own_evictions_opted_in() -> String {
    format!(
        "has(namespaceObject.metadata.labels) && namespaceObject.metadata.labels.exists(k, k == \
         '{NAMESPACE_ENABLED_LABEL}' && namespaceObject.metadata.labels[k] == 'true')"
    )
}

/// What busyguard's own token may do to a pod besides its metadata (the `busyguard-fence`
/// policy's second rule): nothing. It writes labels and annotations, and deletes; a changed spec
/// (an image, a resource) would be a stolen token's.
pub const BUSYGUARDS_POD_WRITES: &str = "request.operation != 'UPDATE' || object.spec == oldObject.spec";

/// What busyguard's own token may create or update besides pods (the `busyguard-fence-objects`
/// policy): the Leases of workload budgets, by their prefix, in its own namespace; its
/// busy-pod PodDisruptionBudget, by its one name and selecting protected opted-in pods only,
/// outside the namespaces it never guards.
pub fn busyguards_own_objects() -> String {
    format!(
        "request.resource.resource == 'leases' ? (request.namespace == '{BUSYGUARD_NAMESPACE}' && \
         object.metadata.name.startsWith('{LEASE_PREFIX}')) : (!(request.namespace in {}) && \
         object.metadata.name == '{BUSY_PDB_NAME}' && has(object.spec.selector) && \
         has(object.spec.selector.matchLabels) && object.spec.selector.matchLabels == {{'{PROTECTED_LABEL}': 'true'}} && \
         has(object.spec.selector.matchExpressions) && object.spec.selector.matchExpressions.all(e, e.key == \
         '{BUSY_LABEL}' && e.operator == 'Exists'))",
        list(&NEVER_GUARDED_NAMESPACES)
    )
}

/// What every label and annotation of busyguard's contract starts with.
const KEY_PREFIX: &str = "busyguard.io/";

fn has_key(o: &str, field: &str, key: &str) -> String {
    format!("(has({o}.metadata.{field}) && '{key}' in {o}.metadata.{field})")
}

fn any_key(o: &str, field: &str, keys: &[&str]) -> String {
    format!("(has({o}.metadata.{field}) && {}.exists(k, k in {o}.metadata.{field}))", list(keys))
}

/// Whether any of `keys` of `metadata.FIELD` differs between `oldObject` and `object`.
fn changed(field: &str, keys: &[&str]) -> String {
    let present = |o: &str| format!("(has({o}.metadata.{field}) && k in {o}.metadata.{field})");
    format!(
        "{}.exists(k, {new} != {old} || ({new} && {old} && object.metadata.{field}[k] != oldObject.metadata.{field}[k]))",
        list(keys),
        new = present("object"),
        old = present("oldObject"),
    )
}

fn list(items: &[&str]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("'{i}'")).collect();
    format!("[{}]", quoted.join(", "))
}

#[cfg(test)]
mod tests {
    use crate::policy::testing::{config, now};

    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;

    use crate::policy::Ask;
    use crate::policy::disruption;
    use crate::policy::keys::DELETE_REQUESTED;
    use crate::policy::mutate;
    use crate::policy::outcome::{Answer, Outcome};
    use crate::policy::pod::{Pod, PodFacts};

    /// Whether a label selector of `matchExpressions` matches the labels of `object`.
    fn selects(selector: &Value, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        selector["matchExpressions"].as_array().unwrap().iter().all(|e| {
            let value = labels[e["key"].as_str().unwrap()].as_str();
            let among = || e["values"].as_array().unwrap().iter().any(|v| Some(v.as_str().unwrap()) == value);
            match e["operator"].as_str().unwrap() {
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                "In" => among(),
                "NotIn" => !among(),
                other => panic!("{other}"),
            }
        })
    }

    /// Whether the API server sends the request to a webhook of these object selectors and this
    /// condition: a selector matches the new or the old object, then the condition holds.
    fn reaches(selectors: &[Value], expression: &str, operation: &str, object: &Value, old: &Value) -> bool {
        selectors.iter().any(|s| selects(s, object) || selects(s, old))
            && sent(expression, operation, "alice", object, old)
    }

    /// `expression` as the API server evaluates a matchCondition.
    fn sent(expression: &str, operation: &str, user: &str, object: &Value, old: &Value) -> bool {
        let request = json!({"operation": operation, "namespace": "jobs", "userInfo": {"username": user}});
        holds(expression, &request, object, old)
    }

    /// Whether `expression` holds of this request, as the API server evaluates it.
    fn holds(expression: &str, request: &Value, object: &Value, old: &Value) -> bool {
        let program = cel::Program::compile(expression).unwrap_or_else(|e| panic!("{expression}: {e:?}"));
        let mut context = cel::Context::default();
        for (name, value) in [("request", request), ("object", object), ("oldObject", old)] {
            context.add_variable_from_value(name, cel::to_value(value).unwrap());
        }
        match program.execute(&context) {
            Ok(cel::Value::Bool(sent)) => sent,
            other => panic!("{expression} on {object} / {old}: {other:?}"),
        }
    }

    fn ask(operation: &'static str, user: &'static str) -> Ask<'static> {
        Ask { namespace: "jobs", ..crate::policy::testing::ask(operation, user) }
    }

    fn pod(value: &Value) -> Pod {
        serde_json::from_value(value.clone()).unwrap()
    }

    /// Allowed, with no patch, no audit line and no side effect.
    fn unchanged(outcome: &Outcome) -> bool {
        matches!(outcome.answer, Answer::Allow { .. }) && outcome.audit.is_none() && outcome.effects.is_empty()
    }

    /// A value for each key a decision reads, valid or not, or none.
    fn annotation_value(key: &'static str) -> impl Strategy<Value = Option<String>> {
        let values: Vec<&str> = match key {
            k if k == BUSY_SINCE => vec!["2026-11-21T20:00:00Z", "2026-11-20T00:00:00Z", "2027-01-01T00:00:00Z", "x"],
            k if k == DELETE_REQUESTED || k == crate::policy::keys::DISRUPTION_REQUESTED => {
                vec![r#"{"by":"alice","at":"2026-11-21T20:00:00Z"}"#, "{"]
            }
            k if k == crate::policy::keys::MAX_BUSY => vec!["2h", "30s", "bad"],
            k if k == crate::policy::keys::TASK_CONTAINER => vec!["worker", "other"],
            _ => vec!["true", "false", "100", "-5", "2147483647", "93600s", ""],
        };
        proptest::option::of(proptest::sample::select(values).prop_map(String::from))
    }

    fn annotations() -> impl Strategy<Value = Vec<Option<String>>> {
        DECIDING_ANNOTATIONS.map(annotation_value).into_iter().collect::<Vec<_>>()
    }

    prop_compose! {
        fn a_pod()(
            busy in proptest::option::of(proptest::sample::select(vec!["true", "false", WHEN_UNREADY, "yes", ""])),
            protected in any::<bool>(),
            budget in proptest::option::of(proptest::sample::select(vec!["1", "0", "x"])),
            marked in any::<bool>(),
            annotations in annotations(),
            ready in any::<bool>(),
            phase in proptest::sample::select(vec!["Running", "Running", "Succeeded", "Failed", "Pending", "Pending"]),
            bound in any::<bool>(),
            ran in any::<bool>(),
            team in proptest::sample::select(vec!["a", "b"]),
        ) -> Value {
            let mut labels = json!({"app": "worker"});
            if let Some(busy) = busy { labels[BUSY_LABEL] = json!(busy); }
            if protected { labels[PROTECTED_LABEL] = json!("true"); }
            if let Some(budget) = budget { labels[MAX_UNAVAILABLE] = json!(budget); }
            if marked { labels[DELETE_REQUESTED] = json!("true"); }
            let mut kept = json!({"team": team});
            for (key, value) in DECIDING_ANNOTATIONS.iter().zip(annotations) {
                if let Some(value) = value { kept[*key] = json!(value); }
            }
            json!({
                "metadata": {"name": "w", "namespace": "jobs", "uid": "u-w", "labels": labels,
                    "annotations": kept, "creationTimestamp": "2026-11-21T19:00:00Z",
                    "managedFields": [{"manager": "busyguard", "operation": "Update",
                        "fieldsV1": {"f:metadata": {"f:annotations": {format!("f:{DELETE_REQUESTED}"): {}}}}}]},
                "spec": if bound { json!({"containers": [{"name": "worker"}], "nodeName": "n1"}) }
                    else { json!({"containers": [{"name": "worker"}]}) },
                "status": {"phase": phase, "startTime": "2026-11-21T19:00:05Z",
                    "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
                    "containerStatuses": [{"name": "worker", "restartCount": 0, "ready": ready,
                        "state": if ran { json!({"running": {"startedAt": "2026-11-21T19:00:05Z"}}) }
                            else { json!({"waiting": {"reason": "ContainerCreating"}}) }}]}
            })
        }
    }

    /// An update of `old`: often only a label or annotation of the user's, sometimes more.
    fn an_update() -> impl Strategy<Value = (Value, Value)> {
        (a_pod(), a_pod(), 0..4u8).prop_map(|(old, other, how)| {
            let mut new = old.clone();
            match how {
                0 => new["metadata"]["annotations"]["team"] = json!("changed"),
                1 => new["metadata"]["labels"]["app"] = json!("other"),
                2 => new["metadata"]["labels"] = other["metadata"]["labels"].clone(),
                _ => new["metadata"]["annotations"] = other["metadata"]["annotations"].clone(),
            }
            (old, new)
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

        #[test]
        fn a_pod_write_the_mutating_webhook_skips_is_one_busyguard_leaves_unchanged_or_its_watch_repairs(
            (old, new) in an_update(),
        ) {
            let (selectors, expression) = ([not_idle()], pod_write_may_be_patched());
            // Stored unpatched, the pod reaches busyguard's watch, which plans as a create would.
            let repaired = |new: &Value| !crate::policy::marks::plan(&pod(new), None, config().mutation, config().max_busy, now()).is_empty();
            if !reaches(&selectors, &expression, "UPDATE", &new, &old) {
                let outcome = mutate::mutate_pod(&mutate::Mutation::of(&ask("UPDATE", "alice"), &pod(&new), Some(&pod(&old))), &config(), now());
                let allowed = matches!(outcome.answer, Answer::Allow { .. } | Answer::Patch { .. });
                prop_assert!(allowed && outcome.audit.is_none() && outcome.effects.is_empty(), "skipped, but {:?}", outcome.answer);
                prop_assert!(unchanged(&outcome) || repaired(&new), "skipped, and no one repairs it\nold {old}\nnew {new}");
            }
            // A pod created without the busy label reaches /mutate through a run-to-completion
            // webhook alone (by its owner's label: `run_to_completion`), and is made busy there.
            let opted_in = new["metadata"]["labels"].get(BUSY_LABEL).is_some();
            if opted_in && !reaches(&selectors, &expression, "CREATE", &new, &Value::Null) {
                let outcome = mutate::mutate_pod(&mutate::Mutation::of(&ask("CREATE", "alice"), &pod(&new), None), &config(), now());
                prop_assert!(unchanged(&outcome) || repaired(&new), "skipped, but busyguard answers {:?}\nnew {new}", outcome.answer);
            }
        }

        #[test]
        fn a_write_the_mark_webhook_skips_gives_no_pod_a_new_mark((old, new) in an_update()) {
            let (selectors, expression) = ([marked()], pod_write_marks_anew());
            if !reaches(&selectors, &expression, "UPDATE", &new, &old) {
                prop_assert!(!crate::policy::writes::marks_anew(&pod(&new), Some(&pod(&old))), "skipped\nold {old}\nnew {new}");
            }
            if !reaches(&selectors, &expression, "CREATE", &new, &Value::Null) {
                prop_assert!(!crate::policy::writes::marks_anew(&pod(&new), None), "skipped\nnew {new}");
            }
        }

        #[test]
        fn a_pod_delete_the_fail_closed_webhook_skips_is_one_busyguard_refuses_for_no_busy_pod(
            old in a_pod(),
            unavailable in 0..3u32,
        ) {
            let fail_closed = reaches(&[not_idle()], &pod_delete_may_be_refused(), "DELETE", &Value::Null, &old);
            let counted = reaches(&[under_a_budget()], &pod_delete_counted_by_a_budget(), "DELETE", &Value::Null, &old);
            prop_assert!(!(fail_closed && counted), "sent twice: {old}");
            if !fail_closed {
                let old = pod(&old);
                // As the view counts them: for opted-in pods under a budget only.
                let siblings = || old.label(BUSY_LABEL).and(old.label(MAX_UNAVAILABLE)).map(|_| crate::policy::testing::unavailable_siblings(unavailable));
                for user in ["alice", crate::policy::REPLICASET_CONTROLLER_USER, crate::policy::GARBAGE_COLLECTOR_USER] {
                    let ask = ask("DELETE", user);
                    let delete = disruption::Disruption { ask: &ask, taking: disruption::Taking::Delete, pod: &old, seen: Some(&old), siblings: siblings(), preempted: false };
                    let outcome = disruption::judge_disruption(&delete, &config(), now());
                    // Skipped by both: allowed unchanged; sent to the budget's (fail-open) alone:
                    // refused, if at all, for the budget only.
                    match &outcome.answer {
                        Answer::Deny { denial, .. } => prop_assert!(counted && *denial == crate::policy::outcome::Denial::Budget, "{user}: {:?}", outcome.answer),
                        _ => prop_assert!(counted || unchanged(&outcome), "{user}: skipped, but busyguard answers {:?}", outcome.answer),
                    }
                }
            }
        }
    }

    #[test]
    fn unrelated_writes_and_deletes_of_idle_pods_are_not_even_matched_by_the_selectors() {
        let idle = json!({"metadata": {"labels": {BUSY_LABEL: "false", "app": "w"}, "annotations": {"team": "a"}}});
        let mut annotated = idle.clone();
        annotated["metadata"]["annotations"]["team"] = json!("b");
        for selector in [not_idle(), under_a_budget(), marked()] {
            assert!(!selects(&selector, &idle) && !selects(&selector, &annotated), "{selector}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

        #[test]
        fn a_write_the_own_flag_rule_refuses_reaches_busyguard_whoever_makes_it(
            (old, new) in an_update(),
            worker in any::<bool>(),
        ) {
            use crate::policy::testing::write_judged;
            use crate::policy::writes::{Writer, marks_anew};
            // pod-flags, and idle-pod-flags (in every namespace not labelled own-flags=false).
            let mut user = json!({"username": "system:serviceaccount:jobs:worker"});
            if worker {
                user["extra"] = json!({crate::policy::POD_NAME_CLAIM: ["w"]});
            }
            let sent = |expression: &str| {
                holds(expression, &json!({"operation": "UPDATE", "namespace": "jobs", "userInfo": user}), &new, &old)
            };
            let by_whom = from_a_pod_or_on_busyguards_keys();
            // As the API server matches an update: the selector on the new or the old object.
            let matched = |selector: Value| selects(&selector, &new) || selects(&selector, &old);
            let reached = sent(&by_whom) && (matched(not_idle()) || (matched(idle()) && sent(&not_for_pod_flags())));
            let mut ask = ask("UPDATE", "system:serviceaccount:jobs:worker");
            ask.requester.pod = worker.then_some("w");
            let writer = if worker { Writer::Worker { namespace: "jobs", own_pod: "w" } } else { Writer::Other };
            let outcome = write_judged(&ask, &pod(&new), Some(&pod(&old)), writer, now());
            // Writes of pods that are not opted in, before or after, are not the rule's business.
            let opted_in = [&old, &new].iter().any(|p| p["metadata"]["labels"].get(BUSY_LABEL).is_some());
            if opted_in && !reached && !marks_anew(&pod(&new), Some(&pod(&old))) {
                prop_assert!(outcome.is_allowed(), "refused, but not sent\nold {old}\nnew {new}");
            }
        }
    }

    #[test]
    fn a_flip_goes_to_pod_flags_alone_and_other_writes_of_idle_pods_to_idle_pod_flags() {
        let idle_pod = json!({"metadata": {"labels": {BUSY_LABEL: "false"}}});
        let busy = json!({"metadata": {"labels": {BUSY_LABEL: "true"}}});
        let mut annotated = idle_pod.clone();
        annotated["metadata"]["annotations"] = json!({"karpenter.sh/do-not-disrupt": "true"});
        assert!(reaches(&[idle()], &not_for_pod_flags(), "UPDATE", &annotated, &idle_pod));
        assert!(!reaches(&[idle()], &not_for_pod_flags(), "UPDATE", &busy, &idle_pod), "a flip: pod-flags' own");
        assert!(reaches(&[not_idle()], "true", "UPDATE", &busy, &idle_pod));
    }

    #[test]
    fn flips_busy_pods_budgets_and_marks_are_sent() {
        let idle = json!({"metadata": {"labels": {BUSY_LABEL: "false"}}});
        let busy = json!({"metadata": {"labels": {BUSY_LABEL: "true"}}});
        let leftover = json!({"metadata": {"labels": {BUSY_LABEL: "true"}, "annotations": {BUSY_SINCE: "x"}}});
        let (selectors, expression) = ([not_idle()], pod_write_may_be_patched());
        assert!(reaches(&selectors, &expression, "UPDATE", &busy, &idle), "the flip to busy");
        assert!(reaches(&selectors, &expression, "UPDATE", &idle, &busy), "the flip to idle");
        assert!(reaches(&selectors, &expression, "UPDATE", &busy, &busy), "any write of a busy pod");
        assert!(reaches(&selectors, &expression, "UPDATE", &leftover, &leftover), "leftovers to restore");
        assert!(reaches(&selectors, &expression, "CREATE", &busy, &Value::Null), "a pod created busy");

        let deletes = [not_idle()];
        let readiness = |ready: &str| {
            json!({"metadata": {"labels": {BUSY_LABEL: WHEN_UNREADY}},
                   "status": {"conditions": [{"type": "Ready", "status": ready}]}})
        };
        let budget = json!({"metadata": {"labels": {BUSY_LABEL: "false", MAX_UNAVAILABLE: "1"}}});
        for old in [&busy, &readiness("False")] {
            assert!(reaches(&deletes, &pod_delete_may_be_refused(), "DELETE", &Value::Null, old), "{old}");
        }
        // A preemption's victim on a scheduler with kubernetes#126644: it ran, though it reads Pending.
        let victim = json!({"metadata": {"labels": {BUSY_LABEL: "true"}}, "spec": {"nodeName": "n1"},
            "status": {"phase": "Pending", "conditions": [{"type": "DisruptionTarget", "status": "True"}]}});
        assert!(reaches(&deletes, &pod_delete_may_be_refused(), "DELETE", &Value::Null, &victim), "{victim}");
        let finished = json!({"metadata": {"labels": {BUSY_LABEL: "true"}}, "spec": {"nodeName": "n1"},
            "status": {"phase": "Succeeded"}});
        let unscheduled =
            json!({"metadata": {"labels": {BUSY_LABEL: "true"}}, "spec": {}, "status": {"phase": "Pending"}});
        let pulling = json!({"metadata": {"labels": {BUSY_LABEL: "true"}}, "spec": {"nodeName": "n1"},
            "status": {"phase": "Pending", "containerStatuses": [{"name": "w", "restartCount": 0,
                "state": {"waiting": {"reason": "ErrImagePull"}}, "lastState": {}}]}});
        // While busyguard is down these go on: a Ready pod in readiness mode, an idle one, one
        // finished or not started.
        for old in [&idle, &readiness("True"), &budget, &finished, &unscheduled, &pulling] {
            assert!(!reaches(&deletes, &pod_delete_may_be_refused(), "DELETE", &Value::Null, old), "{old}");
        }
        let counted = ([under_a_budget()], pod_delete_counted_by_a_budget());
        assert!(reaches(&counted.0, &counted.1, "DELETE", &Value::Null, &budget), "an idle pod's, counted");

        let mark = |mut pod: Value| {
            pod["metadata"]["labels"][DELETE_REQUESTED] = json!("true");
            pod["metadata"]["annotations"] = json!({DELETE_REQUESTED: r#"{"by":"mallory"}"#});
            pod
        };
        let forged = ([marked()], pod_write_marks_anew());
        assert!(reaches(&forged.0, &forged.1, "UPDATE", &mark(idle.clone()), &idle), "a mark on an idle pod");
        assert!(!reaches(&forged.0, &forged.1, "UPDATE", &mark(busy.clone()), &mark(busy)), "a marked pod's write");
    }

    #[test]
    fn only_a_lower_replica_count_is_a_scale_down_to_prepare() {
        let replicas = |n: Option<i64>| match n {
            Some(n) => json!({"spec": {"replicas": n}}),
            None => json!({"spec": {}}),
        };
        let cases =
            [(Some(5), Some(2), true), (Some(2), Some(5), false), (Some(3), Some(3), false), (None, Some(1), false)];
        for (from, to, expected) in cases {
            assert_eq!(
                sent(LOWERS_REPLICAS, "UPDATE", "hpa", &replicas(to), &replicas(from)),
                expected,
                "{from:?} -> {to:?}"
            );
            let lowers = crate::policy::scale::is_scale_down(from.map(|n| n as i32), to.map(|n| n as i32)).is_some();
            assert_eq!(lowers, expected, "the scale-down path agrees");
        }
    }

    #[test]
    fn the_requesters_always_let_through_are_not_sent() {
        let pod = json!({"metadata": {"labels": {BUSY_LABEL: "true"}}});
        for user in [NAMESPACE_CONTROLLER_USER, POD_GC_USER].into_iter().chain(TAINT_MANAGER_USERS) {
            assert!(!sent(&pod_deletes_let_through(), "DELETE", user, &Value::Null, &pod), "{user}");
        }
        assert!(sent(&pod_deletes_let_through(), "DELETE", "alice", &Value::Null, &pod));
        let karpenter = vec!["system:serviceaccount:karpenter:karpenter".to_string()];
        for user in CLOUD_NODE_LIFECYCLE_USERS.iter().copied().chain(["system:serviceaccount:karpenter:karpenter"]) {
            assert!(!sent(&node_deletes_let_through(&karpenter), "DELETE", user, &Value::Null, &Value::Null), "{user}");
        }
    }

    #[test]
    fn only_the_deletes_of_node_claims_that_have_a_node_are_sent() {
        let karpenter = "system:serviceaccount:kube-system:karpenter";
        let claim = |status: Value| json!({"metadata": {"name": "default-x7k2p"}, "status": status});
        let sent_for = |status| sent(&node_claim_has_a_node(), "DELETE", karpenter, &Value::Null, &claim(status));
        assert!(sent_for(json!({"nodeName": "node-1", "conditions": []})));
        assert!(!sent_for(json!({"nodeName": ""})), "launched, not registered");
        assert!(!sent_for(json!({"providerID": "aws:///i-0"})), "no node yet");
        assert!(!sent(&node_claim_has_a_node(), "DELETE", karpenter, &Value::Null, &json!({"metadata": {}})));
    }

    #[test]
    fn the_fence_keeps_busyguards_token_to_its_own_pdb_and_leases() {
        let lets = |resource: &str, namespace: &str, object: Value| {
            let request = json!({"operation": "CREATE", "namespace": namespace, "resource": {"resource": resource}});
            holds(&busyguards_own_objects(), &request, &object, &Value::Null)
        };
        let ours = serde_json::to_value(crate::policy::pdb::busy_pdb("jobs")).unwrap();
        assert!(lets("poddisruptionbudgets", "jobs", ours.clone()), "busyguard's own, as it writes it");
        let mut every_pod = ours.clone();
        every_pod["spec"]["selector"] = json!({"matchLabels": {}});
        let mut renamed = ours.clone();
        renamed["metadata"]["name"] = json!("payments");
        for (what, pdb, namespace) in [
            ("selecting every pod", every_pod, "jobs"),
            ("another name", renamed, "jobs"),
            ("in kube-system", ours, "kube-system"),
        ] {
            assert!(!lets("poddisruptionbudgets", namespace, pdb), "{what}");
        }
        let lease = |name: &str| json!({"metadata": {"name": name}});
        assert!(lets("leases", "busyguard", lease("busyguard-budget-jobs.daemonset-agent")));
        assert!(!lets("leases", "busyguard", lease("busyguard-leader")), "another Lease of its namespace");
        assert!(!lets("leases", "jobs", lease("busyguard-budget-jobs.daemonset-agent")), "in a workload's namespace");
        assert!(!lets("leases", "kube-system", lease("busyguard-budget-x")), "in kube-system");
    }

    #[test]
    fn the_fence_keeps_busyguards_evictions_out_of_the_namespaces_it_never_guards_or_is_kept_out_of() {
        let lets_under = |rules: &[String], namespace: &str, labels: Value| {
            let mut context = cel::Context::default();
            let request = json!({"operation": "CREATE", "namespace": namespace, "subResource": "eviction"});
            let namespace = json!({"metadata": {"name": namespace, "labels": labels}});
            context.add_variable_from_value("request", cel::to_value(&request).unwrap());
            context.add_variable_from_value("namespaceObject", cel::to_value(&namespace).unwrap());
            let holds = |rule: &String| cel::Program::compile(rule).unwrap().execute(&context).unwrap();
            rules.iter().all(|rule| holds(rule) == cel::Value::Bool(true))
        };
        let every_namespace = [busyguards_own_evictions()];
        let lets = |namespace: &str, labels: Value| lets_under(&every_namespace, namespace, labels);
        assert!(lets("jobs", json!({})));
        assert!(lets("jobs", json!({NAMESPACE_ENABLED_LABEL: "true"})));
        assert!(!lets("jobs", json!({NAMESPACE_ENABLED_LABEL: "false"})), "a namespace labelled out");
        assert!(!lets("kube-system", json!({})));
        assert!(!lets("busyguard", json!({})));
        // Under --opt-in, where no webhook of busyguard's sees a namespace not labelled in.
        let opted_in = [busyguards_own_evictions(), busyguards_own_evictions_opted_in()];
        assert!(lets_under(&opted_in, "jobs", json!({NAMESPACE_ENABLED_LABEL: "true"})));
        assert!(!lets_under(&opted_in, "cert-manager", json!({})), "a namespace not opted in");
        assert!(!lets_under(&opted_in, "jobs", json!({NAMESPACE_ENABLED_LABEL: "false"})));
        assert!(!lets_under(&opted_in, "kube-system", json!({NAMESPACE_ENABLED_LABEL: "true"})));
    }

    #[test]
    fn the_fence_keeps_busyguards_pod_writes_to_metadata() {
        let update = json!({"operation": "UPDATE", "namespace": "jobs"});
        let old = json!({"metadata": {"labels": {BUSY_LABEL: "false"}}, "spec": {"containers": [{"name": "w", "image": "a"}]}});
        let mut relabelled = old.clone();
        relabelled["metadata"]["labels"][PROTECTED_LABEL] = json!("true");
        let mut new_image = old.clone();
        new_image["spec"]["containers"][0]["image"] = json!("b");
        assert!(holds(BUSYGUARDS_POD_WRITES, &update, &relabelled, &old), "its own labels");
        assert!(!holds(BUSYGUARDS_POD_WRITES, &update, &new_image, &old), "an image");
        assert!(holds(BUSYGUARDS_POD_WRITES, &json!({"operation": "DELETE"}), &Value::Null, &old), "a delete");
    }

    /// Whether the fence lets busyguard's token write or delete `pod` in `namespace`.
    fn fence_lets_through(namespace: &str, pod: &Value) -> bool {
        let request = json!({"operation": "UPDATE", "namespace": namespace});
        holds(&busyguards_own_pods(), &request, &Value::Null, pod)
    }

    #[test]
    fn the_fence_keeps_busyguards_token_to_pods_that_carry_its_keys_where_it_guards() {
        let pod =
            |labels: Value, annotations: Value| json!({"metadata": {"labels": labels, "annotations": annotations}});
        let cases = [
            ("jobs", pod(json!({BUSY_LABEL: "true"}), json!({})), true),
            ("jobs", pod(json!({BUSY_LABEL: "false", "app": "w"}), json!({})), true),
            // Its busy label removed: busyguard still restores it, and carries out its mark.
            ("jobs", pod(json!({"app": "w"}), json!({IDLE_COST: "1"})), true),
            ("jobs", pod(json!({DELETE_REQUESTED: "true"}), json!({})), true),
            ("jobs", pod(json!({"app": "w"}), json!({"team": "a"})), false),
            ("jobs", json!({"metadata": {}}), false),
            ("kube-system", pod(json!({BUSY_LABEL: "true"}), json!({})), false),
            ("busyguard", pod(json!({BUSY_LABEL: "true"}), json!({})), false),
        ];
        for (namespace, pod, expected) in cases {
            assert_eq!(fence_lets_through(namespace, &pod), expected, "{namespace}: {pod}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

        #[test]
        fn every_pod_busyguards_watch_writes_or_deletes_is_let_through_by_the_fence(old in a_pod()) {
            let target = crate::policy::pod::PodRef { namespace: "jobs".into(), name: "w".into(), uid: "u-w".into() };
            let effects = crate::policy::observed::due(&target, &pod(&old), &config(), now());
            prop_assert!(effects.is_empty() || fence_lets_through("jobs", &old), "{effects:?} on {old}");
        }
    }
}
