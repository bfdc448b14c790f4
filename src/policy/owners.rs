//! Busy from the owner's status: for pods whose controlling owner is a custom resource that
//! knows when its pod works (Actions Runner Controller's `EphemeralRunner` while it has a job,
//! Agones' `GameServer` while Allocated), a rule per owner kind (`--busy-when-owner`) says when,
//! as a CEL expression over the owner, as ValidatingAdmissionPolicy and CRD validation rules
//! read objects. busyguard then flips the pod's busy label itself, and every path that guards a
//! busy pod guards it.

use std::fmt;

use jiff::{SignedDuration, Timestamp};

use super::keys::BUSY_LABEL;

/// One rule: pods owned by a `group/version` `kind` are busy while `expression` holds of the
/// owner (bound as `object`).
#[derive(Clone)]
pub struct OwnerRule {
    /// `actions.github.com/v1alpha1`, or `v1` for the core group.
    pub api_version: String,
    pub kind: String,
    pub expression: String,
    program: std::sync::Arc<cel::Program>,
}

impl fmt::Debug for OwnerRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self)
    }
}

impl fmt::Display for OwnerRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}={}", self.api_version, self.kind, self.expression)
    }
}

impl std::str::FromStr for OwnerRule {
    type Err = String;

    /// `GROUP/VERSION/KIND=EXPRESSION` (`VERSION/KIND=…` for the core group), the expression
    /// compiled here: a rule that does not compile is refused at start.
    fn from_str(rule: &str) -> Result<OwnerRule, String> {
        let usage = "expected GROUP/VERSION/KIND=EXPRESSION, e.g. \
                     agones.dev/v1/GameServer=has(object.status.state) && object.status.state == 'Allocated'";
        let (kind_path, expression) = rule.split_once('=').ok_or_else(|| format!("{rule:?}: {usage}"))?;
        let (api_version, kind) = kind_path.trim().rsplit_once('/').ok_or_else(|| format!("{rule:?}: {usage}"))?;
        let parts = api_version.split('/').count();
        let named = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-');
        if !(1..=2).contains(&parts) || !api_version.split('/').all(named) || !named(kind) {
            return Err(format!("{rule:?}: {usage}"));
        }
        let expression = expression.trim();
        // CEL's error, in its first line (the rest draws the expression and a caret).
        let program = cel::Program::compile(expression).map_err(|e| {
            let why = e.to_string();
            format!("{kind_path}: the expression {expression:?} does not compile: {}", why.lines().next().unwrap_or(""))
        })?;
        let mut unknown = Vec::new();
        unbound_names(program.expression(), &mut Vec::new(), &mut unknown);
        if let Some(name) = unknown.first() {
            return Err(format!(
                "{kind_path}: the expression {expression:?} reads {name}, which is not a variable (only object is): a \
                 string is quoted, '{name}'"
            ));
        }
        Ok(OwnerRule {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            expression: expression.to_string(),
            program: std::sync::Arc::new(program),
        })
    }
}

/// The names `expr` reads that nothing binds: neither `object` nor a macro's own variables
/// (`exists(o, …)`). CEL compiles them and fails only as each owner is judged.
fn unbound_names(expr: &cel::IdedExpr, bound: &mut Vec<String>, found: &mut Vec<String>) {
    use cel::common::ast::{EntryExpr, Expr};
    fn entry(entry: &EntryExpr) -> Vec<&cel::IdedExpr> {
        match entry {
            EntryExpr::StructField(field) => vec![&field.value],
            EntryExpr::MapEntry(entry) => vec![&entry.key, &entry.value],
        }
    }
    match &expr.expr {
        Expr::Ident(name) if name != "object" && !name.starts_with('@') && !bound.contains(name) => {
            found.push(name.clone());
        }
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
        Expr::Call(call) => {
            for operand in call.target.iter().map(|t| &**t).chain(&call.args) {
                unbound_names(operand, bound, found);
            }
        }
        Expr::Comprehension(comprehension) => {
            unbound_names(&comprehension.iter_range, bound, found);
            let outer = bound.len();
            bound.push(comprehension.iter_var.clone());
            bound.extend(comprehension.iter_var2.clone());
            bound.push(comprehension.accu_var.clone());
            for part in
                [&comprehension.accu_init, &comprehension.loop_cond, &comprehension.loop_step, &comprehension.result]
            {
                unbound_names(part, bound, found);
            }
            bound.truncate(outer);
        }
        Expr::List(list) => list.elements.iter().for_each(|e| unbound_names(e, bound, found)),
        Expr::Map(map) => map.entries.iter().flat_map(|e| entry(&e.expr)).for_each(|e| unbound_names(e, bound, found)),
        Expr::Struct(structure) => {
            structure.entries.iter().flat_map(|e| entry(&e.expr)).for_each(|e| unbound_names(e, bound, found))
        }
        Expr::Select(select) => unbound_names(&select.operand, bound, found),
    }
}

/// Two rules for one kind (of one group): which would hold is anyone's guess, so neither may.
pub fn same_kind_twice(rules: &[OwnerRule]) -> Option<String> {
    let mut kinds = std::collections::BTreeSet::new();
    let twice = rules.iter().find(|rule| !kinds.insert((rule.group().to_string(), rule.kind.clone())))?;
    Some(format!(
        "--busy-when-owner: two rules for {}/{}: keep one (join their expressions with || if both should hold)",
        twice.group(),
        twice.kind
    ))
}

impl OwnerRule {
    /// The owner's API group (`""` for the core group).
    pub fn group(&self) -> &str {
        self.api_version.rsplit_once('/').map_or("", |(group, _)| group)
    }

    pub fn version(&self) -> &str {
        self.api_version.rsplit_once('/').map_or(&self.api_version, |(_, version)| version)
    }

    /// The kind the rule follows, as the flag names it: `agones.dev/v1/GameServer`.
    pub fn kind_path(&self) -> String {
        format!("{}/{}", self.api_version, self.kind)
    }

    /// How the view keys an owner of this rule's kind named `name` (see [`owner_key`]).
    pub fn owner_key(&self, name: &str) -> String {
        owner_key(self.group(), &self.kind, name)
    }

    /// Whether the rule is about owners of this `apiVersion` and `kind`, as an ownerReference
    /// names them: of any version of the group, since a pod's reference keeps the version its
    /// owner was created in.
    pub fn covers(&self, api_version: &str, kind: &str) -> bool {
        kind == self.kind && group_of(api_version) == self.group()
    }

    /// Whether the owner's pod is busy, or why the rule cannot tell (an expression that does not
    /// evaluate to a boolean on this owner).
    pub fn busy(&self, owner: &impl serde::Serialize) -> Result<bool, Undecided> {
        let mut context = cel::Context::default();
        let value = cel::to_value(owner).map_err(|e| Undecided(format!("{self}: the owner does not convert: {e}")))?;
        context.add_variable_from_value("object", value);
        match self.program.execute(&context) {
            Ok(cel::Value::Bool(busy)) => Ok(busy),
            Ok(other) => Err(Undecided(format!("{self}: evaluates to {other:?}, not a boolean"))),
            Err(e) => Err(Undecided(format!("{self}: {e}"))),
        }
    }
}

/// An owner as the view keys it: `group/Kind/name` (`/Kind/name` for the core group), so two
/// groups' kinds of the same name are never taken for each other.
pub fn owner_key(group: &str, kind: &str, name: &str) -> String {
    format!("{group}/{kind}/{name}")
}

/// The group of an ownerReference's `apiVersion` (`""` for the core group's `v1`).
pub fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

/// The rule for owners of `group`'s `kind`, if any.
pub fn rule_for<'r>(rules: &'r [OwnerRule], group: &str, kind: &str) -> Option<&'r OwnerRule> {
    rules.iter().find(|rule| rule.group() == group && rule.kind == kind)
}

/// The rule that puts the pods of the owner keyed `owner_key` (`group/Kind/name`) busy, if any.
pub fn rule_of<'r>(rules: &'r [OwnerRule], owner_key: &str) -> Option<&'r OwnerRule> {
    let mut parts = owner_key.splitn(3, '/');
    rule_for(rules, parts.next()?, parts.next()?)
}

/// The `Kind/name` of an owner key, as people name an owner.
pub fn kind_and_name(owner_key: &str) -> &str {
    owner_key.split_once('/').map_or(owner_key, |(_, kind_and_name)| kind_and_name)
}

/// The fields under `spec` or `status` a rule's expression reads (`object.status.jobId`) that
/// the owner kind's schema (its CRD's `openAPIV3Schema` for the rule's version) does not keep:
/// the API server prunes them, so the parts of the rule reading them never hold.
pub fn pruned_fields(expression: &str, schema: &serde_json::Value) -> Vec<String> {
    let mut pruned = Vec::new();
    for (at, _) in expression.match_indices("object.") {
        let rest = &expression[at + "object.".len()..];
        let path: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.').collect();
        let fields: Vec<&str> = path.split('.').filter(|f| !f.is_empty()).collect();
        if !matches!(fields.first(), Some(&"spec" | &"status")) || pruned.contains(&fields.join(".")) {
            continue;
        }
        let mut node = schema;
        for field in &fields {
            if node.get("x-kubernetes-preserve-unknown-fields") == Some(&serde_json::Value::Bool(true)) {
                break;
            }
            match node.get("properties").and_then(|p| p.get(*field)) {
                Some(next) => node = next,
                None => {
                    pruned.push(fields.join("."));
                    break;
                }
            }
        }
    }
    pruned
}

/// Why a rule cannot tell whether an owner's pods are busy: they are left as they are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Undecided(pub String);

/// An owner under a busy rule as its watch last saw it: since when its rule holds, at the
/// latest (`None`: it does not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnerState {
    pub busy_since: Option<Timestamp>,
}

impl OwnerState {
    /// The owner seen `busy` after it was seen as `before` (`None`: never), last written at
    /// `written` (its managedFields' latest time, as the API server keeps it): a task the owner
    /// took while watched began with the write that showed it; one it already had when first
    /// seen began at that write at the latest.
    pub fn seen(before: Option<OwnerState>, busy: bool, written: Timestamp) -> OwnerState {
        let kept = before.and_then(|before| before.busy_since);
        OwnerState { busy_since: busy.then(|| kept.unwrap_or(written)) }
    }

    pub fn busy(self) -> bool {
        self.busy_since.is_some()
    }

    /// Whether the owner's pod created at `created` does the owner's task: the owner is busy, and
    /// the pod was there when its task began. Actions Runner Controller re-creates the pod of a
    /// runner whose job was already taken (its JIT config spent): that pod takes no job.
    pub fn busy_for(self, created: Option<Timestamp>) -> bool {
        match (self.busy_since, created) {
            // Times to the second (and now, for an owner with no managedFields): a margin.
            (Some(since), Some(created)) => created <= since + SignedDuration::from_secs(5),
            (since, None) => since.is_some(),
            (None, Some(_)) => false,
        }
    }
}

/// The busy label's value an owner's pod should carry, if it carries another: `"true"` while its
/// owner is busy, `"false"` when it is not. A pod being deleted, or finished, is left as it is:
/// its end is under way, and a flip to busy would be refused. A pod without the label is not
/// busyguard's to write: not opted in, or in a namespace busyguard leaves alone.
pub fn follow(label: Option<&str>, busy: bool, ending: bool) -> Option<&'static str> {
    let wanted = if busy { "true" } else { "false" };
    (!ending && label? != wanted).then_some(wanted)
}

/// The merge patch that flips an owner's pod.
pub fn flip_patch(value: &str) -> serde_json::Value {
    serde_json::json!({"metadata": {"labels": {BUSY_LABEL: value}}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(s: &str) -> OwnerRule {
        s.parse().unwrap()
    }

    /// The rules the components ship (manifests/actions-runner-controller, manifests/agones).
    fn shipped(component: &str) -> OwnerRule {
        let path = format!("{}/manifests/{component}/kustomization.yaml", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(path).unwrap();
        let arg = text.lines().find_map(|line| line.trim().strip_prefix("value: \"--busy-when-owner=")).unwrap();
        rule(arg.strip_suffix('"').unwrap())
    }

    #[test]
    fn a_runner_is_busy_while_its_status_has_a_job_on_every_release_of_actions_runner_controller() {
        let runner = shipped("actions-runner-controller");
        assert_eq!(runner.busy(&json!({"status": {"phase": "Running"}})), Ok(false));
        assert_eq!(runner.busy(&json!({"metadata": {"name": "r"}})), Ok(false));
        // gha-runner-scale-set 0.9 to 0.12: the listener writes the job request's id only.
        assert_eq!(runner.busy(&json!({"status": {"jobRequestId": 2794_u64}})), Ok(true));
        assert_eq!(runner.busy(&json!({"status": {"jobRequestId": 0}})), Ok(false));
        // 0.13 on: the job's id beside it.
        assert_eq!(runner.busy(&json!({"status": {"jobRequestId": 2794, "jobId": "c0ffee"}})), Ok(true));
        assert_eq!(runner.busy(&json!({"status": {"jobId": "c0ffee"}})), Ok(true));
        assert_eq!(runner.busy(&json!({"status": {"jobId": ""}})), Ok(false));
        // Being deleted while its job runs: Actions Runner Controller's finalizer waits for it.
        let deleting =
            json!({"metadata": {"deletionTimestamp": "2026-11-27T10:00:00Z"}, "status": {"jobRequestId": 7}});
        assert_eq!(runner.busy(&deleting), Ok(true));
    }

    #[test]
    fn a_game_server_is_busy_while_allocated_or_reserved_and_not_being_deleted() {
        let game_server = shipped("agones");
        assert_eq!(game_server.busy(&json!({"metadata": {}, "status": {"state": "Allocated"}})), Ok(true));
        // Held for a match until its reservedUntil (SDK.Reserve), when Agones moves it back to Ready.
        let reserved =
            json!({"metadata": {}, "status": {"state": "Reserved", "reservedUntil": "2026-11-27T10:00:30Z"}});
        assert_eq!(game_server.busy(&reserved), Ok(true));
        assert_eq!(game_server.busy(&json!({"metadata": {}, "status": {"state": "Ready"}})), Ok(false));
        assert_eq!(game_server.busy(&json!({"metadata": {}, "status": {"state": "Shutdown"}})), Ok(false));
        let deleting =
            json!({"metadata": {"deletionTimestamp": "2026-11-27T10:00:00Z"}, "status": {"state": "Allocated"}});
        assert_eq!(
            game_server.busy(&deleting),
            Ok(false),
            "deleting a GameServer ends its match (Agones deletes the pod)"
        );
    }

    #[test]
    fn a_rule_reading_a_field_its_owners_schema_prunes_is_told_which() {
        let schema = json!({"type": "object", "properties": {
            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "status": {"type": "object", "properties": {"jobRequestId": {"type": "integer"}}}}});
        let runner = shipped("actions-runner-controller");
        assert_eq!(pruned_fields(&runner.expression, &schema), ["status.jobId"], "0.12's schema has no jobId");
        assert!(pruned_fields("has(object.spec.anything.at.all)", &schema).is_empty(), "kept as it comes");
        assert!(pruned_fields("has(object.metadata.deletionTimestamp)", &schema).is_empty(), "every object's");
    }

    #[test]
    fn the_shipped_runner_rule_reads_what_each_release_of_actions_runner_controller_keeps() {
        let peers = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/peers");
        let runner = shipped("actions-runner-controller");
        for (release, pruned) in [("0.12.1", vec!["status.jobId"]), ("0.14.2", vec![])] {
            let path = format!(
                "{peers}/actions-runner-controller-{release}/charts/gha-runner-scale-set-controller/crds/\
                 actions.github.com_ephemeralrunners.yaml"
            );
            let Ok(text) = std::fs::read_to_string(&path) else {
                println!("skipped: needs ../shared/peers (Actions Runner Controller's CRDs), not on this clone");
                return;
            };
            let crd: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
            let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
            assert_eq!(pruned_fields(&runner.expression, schema), pruned, "{release}");
        }
    }

    #[test]
    fn a_rule_names_its_kind_by_group_version_and_kind() {
        let runner = shipped("actions-runner-controller");
        assert_eq!(
            (runner.group(), runner.version(), &*runner.kind),
            ("actions.github.com", "v1alpha1", "EphemeralRunner")
        );
        assert!(runner.covers("actions.github.com/v1alpha1", "EphemeralRunner"));
        assert!(runner.covers("actions.github.com/v1beta1", "EphemeralRunner"), "another version of the group");
        assert!(!runner.covers("example.com/v1alpha1", "EphemeralRunner"), "another group's kind of that name");
        assert!(!runner.covers("actions.github.com/v1alpha1", "EphemeralRunnerSet"));
        let core = rule("v1/ConfigMap=true");
        assert_eq!((core.group(), core.version()), ("", "v1"));
        assert!(core.covers("v1", "ConfigMap"));
        assert_eq!(runner.kind_path(), "actions.github.com/v1alpha1/EphemeralRunner");
        assert_eq!(runner.owner_key("r"), "actions.github.com/EphemeralRunner/r");
        assert_eq!(core.owner_key("c"), "/ConfigMap/c");
        assert_eq!(kind_and_name("apps/ReplicaSet/w"), "ReplicaSet/w");
    }

    #[test]
    fn a_rule_that_does_not_parse_or_compile_is_refused_with_the_form_expected() {
        for bad in ["EphemeralRunner=true", "actions.github.com/v1alpha1/EphemeralRunner", "a/b/c/D=true", "/v1/X=true"]
        {
            let error = bad.parse::<OwnerRule>().unwrap_err();
            assert!(error.contains("expected GROUP/VERSION/KIND=EXPRESSION"), "{bad}: {error}");
        }
        let error = "agones.dev/v1/GameServer=object.status.state ==".parse::<OwnerRule>().unwrap_err();
        assert!(error.starts_with("agones.dev/v1/GameServer: the expression"), "{error}");
        assert!(error.contains("does not compile"), "{error}");
    }

    #[test]
    fn a_rule_reading_an_unquoted_word_or_the_same_kind_twice_is_refused_at_start() {
        let error = "agones.dev/v1/GameServer=object.status.state == Allocated".parse::<OwnerRule>().unwrap_err();
        assert!(
            error.contains("reads Allocated, which is not a variable (only object is): a string is quoted"),
            "{error}"
        );
        let macros = "example.com/v1/Task=object.status.workers.exists(w, w.busy) && object.spec.all(k, k != '')";
        assert!(macros.parse::<OwnerRule>().is_ok(), "a macro's own variables are bound");
        let error = "example.com/v1/Task=object.status.workers.exists(w, x.busy)".parse::<OwnerRule>().unwrap_err();
        assert!(error.contains("reads x"), "{error}");
        let twice = [shipped("agones"), rule("agones.dev/v1/GameServer=true"), shipped("actions-runner-controller")];
        let said = same_kind_twice(&twice).unwrap();
        assert!(said.starts_with("--busy-when-owner: two rules for agones.dev/GameServer: keep one"), "{said}");
        assert_eq!(same_kind_twice(&[shipped("agones"), shipped("actions-runner-controller")]), None);
    }

    #[test]
    fn a_rule_that_is_not_a_boolean_on_an_owner_says_so() {
        let error = rule("agones.dev/v1/GameServer=object.status.state").busy(&json!({"status": {"state": "Ready"}}));
        assert!(error.unwrap_err().0.contains("not a boolean"));
        let missing = rule("agones.dev/v1/GameServer=object.status.state == 'Allocated'").busy(&json!({}));
        assert!(missing.is_err(), "a field the owner lacks is an error, as in Kubernetes' CEL");
    }

    #[test]
    fn a_pod_created_after_its_owners_task_began_is_not_the_one_doing_it() {
        let at = |s: &str| s.parse::<Timestamp>().unwrap();
        let idle = OwnerState::seen(None, false, at("2026-11-27T10:00:00Z"));
        let busy = OwnerState::seen(Some(idle), true, at("2026-11-27T10:05:00Z"));
        assert_eq!(busy.busy_since, Some(at("2026-11-27T10:05:00Z")), "turned busy while watched");
        assert!(busy.busy() && !idle.busy());
        assert_eq!(OwnerState::seen(Some(busy), true, at("2026-11-27T10:09:00Z")), busy, "still the same task");
        assert!(busy.busy_for(Some(at("2026-11-27T09:59:00Z"))), "the runner's pod that took the job");
        assert!(busy.busy_for(Some(at("2026-11-27T10:05:03Z"))), "within the clocks' margin");
        assert!(!busy.busy_for(Some(at("2026-11-27T10:07:00Z"))), "re-created after its job was taken");
        // First seen busy (after busyguard's restart): its last write is the latest its task began.
        let first_seen_busy = OwnerState::seen(None, true, at("2026-11-27T10:05:00Z"));
        assert!(first_seen_busy.busy_for(Some(at("2026-11-27T10:04:00Z"))), "there when it was last written");
        assert!(!first_seen_busy.busy_for(Some(at("2026-11-27T10:07:00Z"))), "created after it");
        assert!(!OwnerState::seen(Some(busy), false, at("2026-11-27T10:10:00Z")).busy_for(None));
    }

    #[test]
    fn an_owners_pod_follows_it_unless_its_end_is_under_way() {
        assert_eq!(follow(Some("false"), true, false), Some("true"));
        assert_eq!(follow(Some("true"), false, false), Some("false"));
        assert_eq!(follow(Some("true"), true, false), None);
        assert_eq!(follow(None, true, false), None, "not opted in, or left alone: never written");
        assert_eq!(follow(Some("false"), true, true), None, "a terminating or finished pod is left as it is");
    }
}
