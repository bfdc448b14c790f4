//! Busy from the owner's status: for pods whose controlling owner is a custom resource that
//! knows when its pod works (Actions Runner Controller's `EphemeralRunner` while it has a job,
//! Agones' `GameServer` while Allocated), a rule per owner kind (`--busy-when-owner`) says when,
//! as a CEL expression over the owner, as ValidatingAdmissionPolicy and CRD validation rules
//! read objects. busyguard then flips the pod's busy label itself, and every path that guards a
//! busy pod guards it.

use std::fmt;

use jiff::{SignedDuration, Timestamp};

use super::keys::{BUSY_LABEL, MAX_BUSY};
use super::pod::PodRef;
pub use super::pod::{group_of, owner_key, version_of};

/// One rule: pods owned by a `group/version` `kind` are busy while `expression` holds of the
/// owner (bound as `object`) and, if it reads it, of the pod (bound as `pod`). With `via`, the
/// pods are those of the kind's objects' own objects of the `via` kind (a Spark executor, owned
/// by its driver pod, owned by its SparkApplication).
#[derive(Clone)]
pub struct OwnerRule {
    /// `actions.github.com/v1alpha1`, or `v1` for the core group.
    pub api_version: String,
    pub kind: String,
    /// The kind between the pod and `kind`: the pod's controlling owner, whose own controlling
    /// owner is of `kind`.
    pub via: Option<Via>,
    pub expression: String,
    /// Whether the expression reads `pod`: the rule is then judged pod by pod.
    pub reads_pod: bool,
    /// What the rule says beyond its expression (`;new-pods-idle`, `;max-busy=…`).
    pub terms: Terms,
    program: std::sync::Arc<cel::Program>,
}

/// A rule's terms, written after its kinds: `KIND;new-pods-idle;max-busy=6h15m=EXPRESSION`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Terms {
    /// A pod created after its owner turned busy stays idle (`new-pods-idle`): the owner's task
    /// is the pod's that took it. An Actions Runner Controller runner's job is run by the pod
    /// there when the job was assigned; the pod re-created for it (its JIT config spent) runs
    /// nothing. Without it, every pod of a busy owner is busy: a Ray worker added while the job
    /// runs works for the job.
    pub new_pods_idle: bool,
    /// How long a pod this rule flips busy is protected, unless the pod says otherwise
    /// (`max-busy=DURATION`): written as the pod's `busyguard.io/max-busy` as it turns busy. An
    /// owner that never ends its task (a runner whose process hung) is not held for the default.
    pub max_busy: Option<String>,
}

impl fmt::Display for Terms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.new_pods_idle {
            write!(f, ";new-pods-idle")?;
        }
        if let Some(max_busy) = &self.max_busy {
            write!(f, ";max-busy={max_busy}")?;
        }
        Ok(())
    }
}

impl Terms {
    /// The terms after a rule's kinds (`;new-pods-idle;max-busy=6h`, each `;`-led), and the
    /// text after them (`=EXPRESSION`).
    fn parse(mut rest: &str) -> Result<(Terms, &str), String> {
        let mut terms = Terms::default();
        while let Some(after) = rest.strip_prefix(';') {
            let end = after.find(['=', ';']).unwrap_or(after.len());
            let name = after[..end].trim();
            rest = &after[end..];
            match name {
                "new-pods-idle" => terms.new_pods_idle = true,
                "max-busy" => {
                    let value = rest.strip_prefix('=').ok_or("max-busy takes a duration: ;max-busy=6h15m")?;
                    let end = value.find(['=', ';']).unwrap_or(value.len());
                    let duration = value[..end].trim();
                    crate::duration::parse_positive_duration(duration).map_err(|e| format!("max-busy: {e}"))?;
                    terms.max_busy = Some(duration.to_string());
                    rest = &value[end..];
                }
                other => return Err(format!("{other:?} is not a rule's term (new-pods-idle, max-busy=DURATION)")),
            }
        }
        Ok((terms, rest))
    }
}

/// The kind a rule's pods are owned by, when it is not the kind whose status the rule reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Via {
    pub api_version: String,
    pub kind: String,
}

impl Via {
    pub fn group(&self) -> &str {
        group_of(&self.api_version)
    }

    pub fn version(&self) -> &str {
        version_of(&self.api_version)
    }

    pub fn kind_path(&self) -> String {
        format!("{}/{}", self.api_version, self.kind)
    }
}

/// What a rule may read of the pod: `pod.metadata.name`, `namespace`, `uid` and `labels` (the
/// view keeps no more of a pod).
pub const POD_FIELDS: [&str; 4] = ["name", "namespace", "uid", "labels"];

impl fmt::Debug for OwnerRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self)
    }
}

impl fmt::Display for OwnerRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}={}", self.kind_path(), self.terms, self.expression)
    }
}

impl std::str::FromStr for OwnerRule {
    type Err = String;

    /// `GROUP/VERSION/KIND=EXPRESSION` (`VERSION/KIND=…` for the core group), or
    /// `VIA_KIND>KIND=EXPRESSION` for pods one owner further down, the kinds followed by the
    /// rule's [`Terms`] if any; the expression compiled here: a rule that does not compile is
    /// refused at start.
    fn from_str(rule: &str) -> Result<OwnerRule, String> {
        let usage = "expected GROUP/VERSION/KIND=EXPRESSION, e.g. \
                     agones.dev/v1/GameServer=has(object.status.state) && object.status.state == 'Allocated', or \
                     GROUP/VERSION/KIND>GROUP/VERSION/KIND=EXPRESSION for pods owned by the first kind's objects that \
                     the second kind's own";
        let kinds_end = rule.find(['=', ';']).ok_or_else(|| format!("{rule:?}: {usage}"))?;
        let (terms, rest) = Terms::parse(&rule[kinds_end..]).map_err(|why| format!("{rule:?}: {why}"))?;
        let expression = rest.strip_prefix('=').ok_or_else(|| format!("{rule:?}: {usage}"))?;
        let kind_path = rule[..kinds_end].trim();
        let (via, owner) = match kind_path.split_once('>') {
            Some((via, owner)) => (Some(via.trim()), owner.trim()),
            None => (None, kind_path),
        };
        let kind_of = |path: &str| -> Result<(String, String), String> {
            let (api_version, kind) = path.rsplit_once('/').ok_or_else(|| format!("{rule:?}: {usage}"))?;
            let parts = api_version.split('/').count();
            let named = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-');
            if !(1..=2).contains(&parts) || !api_version.split('/').all(named) || !named(kind) {
                return Err(format!("{rule:?}: {usage}"));
            }
            Ok((api_version.to_string(), kind.to_string()))
        };
        let (api_version, kind) = kind_of(owner)?;
        let via = via.map(kind_of).transpose()?.map(|(api_version, kind)| Via { api_version, kind });
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
                "{kind_path}: the expression {expression:?} reads {name}, which is not a variable (only object and \
                 pod are): a string is quoted, '{name}'"
            ));
        }
        if let Some(field) = pod_fields_not_kept(expression).first() {
            return Err(format!(
                "{kind_path}: the expression {expression:?} reads pod.{field}, which busyguard does not keep of a pod: \
                 a rule reads pod.metadata.name, namespace, uid and labels"
            ));
        }
        Ok(OwnerRule {
            api_version,
            kind,
            via,
            expression: expression.to_string(),
            reads_pod: program.references().has_variable("pod"),
            terms,
            program: std::sync::Arc::new(program),
        })
    }
}

/// The fields under `pod.` an expression reads that busyguard does not keep of a pod (see
/// [`POD_FIELDS`]), as written after `pod.`.
fn pod_fields_not_kept(expression: &str) -> Vec<String> {
    let mut not_kept = Vec::new();
    for (at, _) in expression.match_indices("pod.") {
        let before = expression[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.') {
            continue;
        }
        let rest = &expression[at + "pod.".len()..];
        let path: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.').collect();
        let mut fields = path.split('.');
        let kept = fields.next() == Some("metadata") && fields.next().is_none_or(|field| POD_FIELDS.contains(&field));
        if !kept {
            not_kept.push(path);
        }
    }
    not_kept
}

/// The names `expr` reads that nothing binds: neither `object`, `pod` nor a macro's own variables
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
        Expr::Ident(name) if name != "object" && name != "pod" && !name.starts_with('@') && !bound.contains(name) => {
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

/// Two rules for one kind (of one group), reached through the same kind: which would hold is
/// anyone's guess, so neither may.
pub fn same_kind_twice(rules: &[OwnerRule]) -> Option<String> {
    let mut kinds = std::collections::BTreeSet::new();
    let key = |rule: &OwnerRule| {
        let via = rule.via.as_ref().map(|via| (via.group().to_string(), via.kind.clone()));
        (via, rule.group().to_string(), rule.kind.clone())
    };
    let twice = rules.iter().find(|rule| !kinds.insert(key(rule)))?;
    let through = twice.via.as_ref().map(|via| format!("{}/{}>", via.group(), via.kind)).unwrap_or_default();
    Some(format!(
        "--busy-when-owner: two rules for {through}{}/{}: keep one (join their expressions with || if both should hold)",
        twice.group(),
        twice.kind
    ))
}

impl OwnerRule {
    /// The owner's API group (`""` for the core group).
    pub fn group(&self) -> &str {
        group_of(&self.api_version)
    }

    pub fn version(&self) -> &str {
        version_of(&self.api_version)
    }

    /// The kinds the rule follows, as the flag names them: `agones.dev/v1/GameServer`,
    /// `v1/Pod>sparkoperator.k8s.io/v1beta2/SparkApplication`.
    pub fn kind_path(&self) -> String {
        let via = self.via.as_ref().map(|via| format!("{}>", via.kind_path())).unwrap_or_default();
        format!("{via}{}/{}", self.api_version, self.kind)
    }

    /// How a pod's controlling owner of this rule's kind named `name` is keyed (see [`owner_key`]).
    pub fn owner_key(&self, name: &str) -> String {
        owner_key(self.group(), &self.kind, name)
    }

    /// How the view keeps this rule's verdict on its owner named `name`: the owner key, behind
    /// the kind between for a rule through one (`/Pod>sparkoperator.k8s.io/SparkApplication/etl`),
    /// so that two rules on one owner kind (a Spark application's driver and its executors)
    /// each keep their own.
    pub fn state_key(&self, name: &str) -> String {
        match &self.via {
            Some(via) => format!("{}/{}>{}", via.group(), via.kind, self.owner_key(name)),
            None => self.owner_key(name),
        }
    }

    /// The group and kind of the pods' controlling owners: `via`'s, else the rule's own.
    pub fn pods_owner(&self) -> (&str, &str) {
        match &self.via {
            Some(via) => (via.group(), &via.kind),
            None => (self.group(), &self.kind),
        }
    }

    /// Whether the rule is about pods controlled by owners of this `apiVersion` and `kind`, as an
    /// ownerReference names them: of any version of the group, since a pod's reference keeps
    /// the version its owner was created in.
    pub fn covers(&self, api_version: &str, kind: &str) -> bool {
        self.pods_owner() == (group_of(api_version), kind)
    }

    /// Whether the owner's pods are busy, or why the rule cannot tell (an expression that does
    /// not evaluate to a boolean on this owner). Not for a rule that reads the pod: see
    /// [`OwnerRule::per_pod`].
    pub fn busy(&self, owner: &impl serde::Serialize) -> Result<bool, Undecided> {
        self.judge(self.object(owner)?, None)
    }

    /// The owner as a rule reads it.
    pub fn object(&self, owner: &impl serde::Serialize) -> Result<cel::Value, Undecided> {
        cel::to_value(owner).map_err(|e| Undecided(format!("{self}: the owner does not convert: {e}")))
    }

    /// The owner as a rule that reads the pod judges each of its pods.
    pub fn per_pod(self: &std::sync::Arc<Self>, owner: &impl serde::Serialize) -> Result<PerPod, Undecided> {
        Ok(PerPod { rule: self.clone(), object: self.object(owner)? })
    }

    fn judge(&self, object: cel::Value, pod: Option<cel::Value>) -> Result<bool, Undecided> {
        let mut context = cel::Context::default();
        context.add_variable_from_value("object", object);
        if let Some(pod) = pod {
            context.add_variable_from_value("pod", pod);
        }
        match self.program.execute(&context) {
            Ok(cel::Value::Bool(busy)) => Ok(busy),
            Ok(other) => Err(Undecided(format!("{self}: evaluates to {other:?}, not a boolean"))),
            Err(e) => Err(Undecided(format!("{self}: {e}"))),
        }
    }
}

/// An owner under a rule that reads the pod, as last seen: its pods are judged one by one.
#[derive(Clone)]
pub struct PerPod {
    rule: std::sync::Arc<OwnerRule>,
    object: cel::Value,
}

impl fmt::Debug for PerPod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PerPod({})", self.rule)
    }
}

impl PartialEq for PerPod {
    fn eq(&self, other: &PerPod) -> bool {
        std::sync::Arc::ptr_eq(&self.rule, &other.rule) && self.object == other.object
    }
}

impl PerPod {
    /// Whether the pod (its metadata, as much as [`POD_FIELDS`] names) is busy as the owner says.
    pub fn busy(&self, pod: &PodRef, labels: &[(Box<str>, Box<str>)]) -> Result<bool, Undecided> {
        use std::collections::HashMap;
        let labels: HashMap<String, cel::Value> = labels.iter().map(|(k, v)| (k.to_string(), (&**v).into())).collect();
        let metadata = HashMap::from([
            ("name".to_string(), cel::Value::from(pod.name.as_str())),
            ("namespace".to_string(), pod.namespace.as_str().into()),
            ("uid".to_string(), pod.uid.as_str().into()),
            ("labels".to_string(), labels.into()),
        ]);
        let pod = HashMap::from([("metadata".to_string(), cel::Value::from(metadata))]);
        self.rule.judge(self.object.clone(), Some(pod.into()))
    }
}

/// The rule for owners of `group`'s `kind` that own their pods themselves, if any: the rule an
/// update of such an owner is judged by.
pub fn rule_for<'r>(rules: &'r [OwnerRule], group: &str, kind: &str) -> Option<&'r OwnerRule> {
    rules.iter().find(|rule| rule.via.is_none() && rule.group() == group && rule.kind == kind)
}

/// The rule that puts the pods of the owner keyed `owner_key` (`group/Kind/name`, the pod's
/// controlling owner) busy, if any.
pub fn rule_of<'r>(rules: &'r [OwnerRule], owner_key: &str) -> Option<&'r OwnerRule> {
    let mut parts = owner_key.splitn(3, '/');
    let (group, kind) = (parts.next()?, parts.next()?);
    rules.iter().find(|rule| rule.pods_owner() == (group, kind))
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
/// latest (`None`: it does not), or, under a rule that reads the pod, the owner to judge each of
/// its pods by; and the rule's terms.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnerState {
    pub busy_since: Option<Timestamp>,
    pub per_pod: Option<PerPod>,
    pub terms: Terms,
}

impl OwnerState {
    /// The owner seen `busy` by `rule` after it was seen as `before` (`None`: never), last
    /// written at `written` (its managedFields' latest time, as the API server keeps it): a task
    /// the owner took while watched began with the write that showed it; one it already had
    /// when first seen began at that write at the latest.
    pub fn seen(rule: &OwnerRule, before: Option<&OwnerState>, busy: bool, written: Timestamp) -> OwnerState {
        let kept = before.and_then(|before| before.busy_since);
        OwnerState { busy_since: busy.then(|| kept.unwrap_or(written)), per_pod: None, terms: rule.terms.clone() }
    }

    /// The owner seen under a rule that reads the pod: each pod is busy as the rule says of it.
    pub fn judged_per_pod(per_pod: PerPod) -> OwnerState {
        let terms = per_pod.rule.terms.clone();
        OwnerState { busy_since: None, per_pod: Some(per_pod), terms }
    }

    /// Whether the owner is busy as a whole (never, under a rule that reads the pod).
    pub fn busy(&self) -> bool {
        self.busy_since.is_some()
    }

    /// Whether the owner's pod created at `created` does the owner's task: the owner is busy,
    /// and, under a rule whose new pods stay idle ([`Terms::new_pods_idle`]), the pod was there
    /// when its task began.
    pub fn busy_for(&self, created: Option<Timestamp>) -> bool {
        match (self.busy_since, created) {
            (Some(_), _) if !self.terms.new_pods_idle => true,
            // Times to the second (and now, for an owner with no managedFields): a margin.
            (Some(since), Some(created)) => created <= since + SignedDuration::from_secs(5),
            (since, None) => since.is_some(),
            (None, Some(_)) => false,
        }
    }

    /// Whether the owner's pod is busy: as the rule says of it, under a rule that reads the pod;
    /// else as [`OwnerState::busy_for`] says.
    pub fn pod_busy(
        &self,
        pod: &PodRef,
        labels: &[(Box<str>, Box<str>)],
        created: Option<Timestamp>,
    ) -> Result<bool, Undecided> {
        match &self.per_pod {
            Some(per_pod) => per_pod.busy(pod, labels),
            None => Ok(self.busy_for(created)),
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

/// The merge patch that flips an owner's pod; turning busy, with the rule's max-busy where the
/// pod has none of its own.
pub fn flip_patch(value: &str, max_busy: Option<&str>) -> serde_json::Value {
    let mut patch = serde_json::json!({"metadata": {"labels": {BUSY_LABEL: value}}});
    if let Some(max_busy) = max_busy {
        patch["metadata"]["annotations"] = serde_json::json!({MAX_BUSY: max_busy});
    }
    patch
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

    /// The rule a page of docs/ gives as a recipe: the last `--busy-when-owner=` argument of the
    /// section headed `section` (after the one a patch tests for).
    fn recipe(page: &str, section: &str) -> OwnerRule {
        let path = format!("{}/docs/{page}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(path).unwrap();
        let mut lines = text.lines().skip_while(|line| !line.starts_with(section)).skip(1);
        let in_section = lines.by_ref().take_while(|line| !line.starts_with("## "));
        let args = in_section.filter_map(|line| line.trim().strip_prefix("value: \"--busy-when-owner="));
        rule(args.last().unwrap().strip_suffix('"').unwrap())
    }

    fn pod(name: &str) -> PodRef {
        PodRef { namespace: "spark".into(), name: name.into(), uid: format!("u-{name}") }
    }

    #[test]
    fn a_spark_executor_is_busy_while_its_applications_status_says_it_runs() {
        let executors = std::sync::Arc::new(recipe("spark.md", "# "));
        let via = executors.via.as_ref().unwrap();
        assert_eq!((via.group(), via.version(), &*via.kind), ("", "v1", "Pod"), "owned by the driver pod");
        assert_eq!((executors.group(), &*executors.kind), ("sparkoperator.k8s.io", "SparkApplication"));
        assert!(executors.reads_pod);
        assert!(executors.covers("v1", "Pod") && !executors.covers("sparkoperator.k8s.io/v1beta2", "SparkApplication"));
        assert_eq!(executors.kind_path(), "v1/Pod>sparkoperator.k8s.io/v1beta2/SparkApplication");
        // As the operator writes it: the executor pods' names and their phases.
        let app = json!({"metadata": {"name": "etl"}, "status": {"applicationState": {"state": "RUNNING"},
            "executorState": {"etl-exec-1": "RUNNING", "etl-exec-2": "COMPLETED", "etl-exec-3": "PENDING"}}});
        let per_pod = executors.per_pod(&app).unwrap();
        let state = OwnerState::judged_per_pod(per_pod);
        let labels = [(Box::from("spark-role"), Box::from("executor"))];
        let busy = |name: &str| state.pod_busy(&pod(name), &labels, None);
        assert_eq!(busy("etl-exec-1"), Ok(true));
        assert_eq!(busy("etl-exec-2"), Ok(false), "its work is done");
        assert_eq!(busy("etl-exec-3"), Ok(false), "not started");
        assert_eq!(busy("etl-exec-9"), Ok(false), "not (yet) in the status: beyond the operator's tracked executors");
        assert!(!state.busy(), "never busy as a whole: each pod is judged");
        let submitted = executors.per_pod(&json!({"metadata": {"name": "etl"}, "status": {}})).unwrap();
        assert_eq!(submitted.busy(&pod("etl-exec-1"), &labels), Ok(false), "no executor state yet");
    }

    #[test]
    fn a_ray_worker_is_busy_while_the_rayjob_over_its_cluster_runs_its_job() {
        let workers = recipe("kuberay.md", "# ");
        let via = workers.via.as_ref().unwrap();
        assert_eq!((via.group(), &*via.kind), ("ray.io", "RayCluster"));
        assert_eq!((workers.group(), &*workers.kind), ("ray.io", "RayJob"));
        assert!(!workers.reads_pod, "every worker of the job's cluster alike");
        let job = |status: serde_json::Value| json!({"metadata": {"name": "train"}, "status": status});
        assert_eq!(workers.busy(&job(json!({"jobStatus": "RUNNING"}))), Ok(true));
        for done in ["PENDING", "SUCCEEDED", "FAILED", "STOPPED"] {
            assert_eq!(workers.busy(&job(json!({"jobStatus": done}))), Ok(false), "{done}");
        }
        assert_eq!(workers.busy(&job(json!({}))), Ok(false), "not submitted yet");
        let deleting =
            json!({"metadata": {"deletionTimestamp": "2026-11-27T10:00:00Z"}, "status": {"jobStatus": "RUNNING"}});
        assert_eq!(workers.busy(&deleting), Ok(false), "a RayJob deleted ends its job");
    }

    #[test]
    fn a_game_server_with_sessions_on_its_counter_is_busy_though_ready() {
        let sessions = recipe("agones.md", "## Sessions on a counter");
        let with = |count: i64, state: &str| json!({"metadata": {}, "status": {"state": state, "counters": {"sessions": {"count": count, "capacity": 10}}}});
        assert_eq!(sessions.busy(&with(3, "Ready")), Ok(true), "sessions on a server Agones may still allocate");
        assert_eq!(sessions.busy(&with(0, "Ready")), Ok(false));
        assert_eq!(sessions.busy(&with(0, "Allocated")), Ok(true), "allocated, as the shipped rule says");
        assert_eq!(sessions.busy(&json!({"metadata": {}, "status": {"state": "Ready"}})), Ok(false), "no counters");
        let deleting = json!({"metadata": {"deletionTimestamp": "2026-11-27T10:00:00Z"},
            "status": {"state": "Ready", "counters": {"sessions": {"count": 3}}}});
        assert_eq!(sessions.busy(&deleting), Ok(false));
    }

    #[test]
    fn the_recipes_read_what_their_projects_crds_keep() {
        let peers = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/peers");
        for (page, crd) in [
            (
                "spark.md",
                "spark-operator-v2.5.2/charts/spark-operator-chart/crds/sparkoperator.k8s.io_sparkapplications.yaml",
            ),
            ("kuberay.md", "kuberay-v1.7.0/helm-chart/kuberay-operator/crds/ray.io_rayjobs.yaml"),
        ] {
            let Ok(text) = std::fs::read_to_string(format!("{peers}/{crd}")) else {
                println!("skipped: needs ../shared/peers (the Spark operator's and KubeRay's CRDs), not on this clone");
                return;
            };
            let rule = recipe(page, "# ");
            let crd: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
            let version = crd["spec"]["versions"].as_array().unwrap().iter().find(|v| v["name"] == rule.version());
            let schema = &version.unwrap()["schema"]["openAPIV3Schema"];
            assert_eq!(pruned_fields(&rule.expression, schema), Vec::<String>::new(), "{page}");
        }
    }

    #[test]
    fn a_rule_through_a_kind_between_is_its_own_and_reads_only_what_is_kept_of_the_pod() {
        let driver =
            rule("sparkoperator.k8s.io/v1beta2/SparkApplication=object.status.applicationState.state == 'RUNNING'");
        let executors = recipe("spark.md", "# ");
        assert_eq!(same_kind_twice(&[driver.clone(), executors.clone()]), None, "the driver's and the executors'");
        assert_ne!(
            driver.state_key("etl"),
            executors.state_key("etl"),
            "each keeps its own verdict on the application"
        );
        let said = same_kind_twice(&[executors.clone(), recipe("spark.md", "# ")]).unwrap();
        assert!(said.contains("two rules for /Pod>sparkoperator.k8s.io/SparkApplication"), "{said}");
        assert!(
            rule_for(std::slice::from_ref(&executors), "sparkoperator.k8s.io", "SparkApplication").is_none(),
            "not its pods"
        );
        assert!(rule_for(std::slice::from_ref(&driver), "sparkoperator.k8s.io", "SparkApplication").is_some());
        assert!(rule_of(&[driver, executors.clone()], "/Pod/etl-driver").is_some_and(|r| r.via.is_some()));
        for unkept in ["pod.spec.nodeName == 'n'", "pod.status.phase == 'Running'", "pod.metadata.annotations.a == 'b'"]
        {
            let error = format!("v1/Pod>example.com/v1/Task={unkept}").parse::<OwnerRule>().unwrap_err();
            assert!(error.contains("which busyguard does not keep of a pod"), "{error}");
        }
        let labels = "v1/Pod>example.com/v1/Task=pod.metadata.labels['role'] == 'executor' && object.spec.run";
        assert!(labels.parse::<OwnerRule>().is_ok_and(|r| r.reads_pod));
        assert!("example.com/v1/Task=object.spec.pod.x".parse::<OwnerRule>().is_ok(), "an owner's field named pod");
        for bad in ["v1/Pod>=true", ">example.com/v1/Task=true", "v1/Pod>example.com/v1/Task>x/v1/Y=true"] {
            assert!(bad.parse::<OwnerRule>().is_err(), "{bad}");
        }
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
            error.contains("reads Allocated, which is not a variable (only object and pod are): a string is quoted"),
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
    fn under_a_rule_whose_new_pods_stay_idle_a_pod_created_after_its_owners_task_began_is_not_the_one_doing_it() {
        let runner = shipped("actions-runner-controller");
        assert!(runner.terms.new_pods_idle, "the shipped runner rule says so");
        let at = |s: &str| s.parse::<Timestamp>().unwrap();
        let idle = OwnerState::seen(&runner, None, false, at("2026-11-27T10:00:00Z"));
        let busy = OwnerState::seen(&runner, Some(&idle), true, at("2026-11-27T10:05:00Z"));
        assert_eq!(busy.busy_since, Some(at("2026-11-27T10:05:00Z")), "turned busy while watched");
        assert!(busy.busy() && !idle.busy());
        let later = OwnerState::seen(&runner, Some(&busy), true, at("2026-11-27T10:09:00Z"));
        assert_eq!(later, busy, "still the same task");
        assert!(busy.busy_for(Some(at("2026-11-27T09:59:00Z"))), "the runner's pod that took the job");
        assert!(busy.busy_for(Some(at("2026-11-27T10:05:03Z"))), "within the clocks' margin");
        assert!(!busy.busy_for(Some(at("2026-11-27T10:07:00Z"))), "re-created after its job was taken");
        // First seen busy (after busyguard's restart): its last write is the latest its task began.
        let first_seen_busy = OwnerState::seen(&runner, None, true, at("2026-11-27T10:05:00Z"));
        assert!(first_seen_busy.busy_for(Some(at("2026-11-27T10:04:00Z"))), "there when it was last written");
        assert!(!first_seen_busy.busy_for(Some(at("2026-11-27T10:07:00Z"))), "created after it");
        assert!(!OwnerState::seen(&runner, Some(&busy), false, at("2026-11-27T10:10:00Z")).busy_for(None));
    }

    #[test]
    fn a_pod_created_while_its_owners_task_runs_joins_it_and_a_restart_gives_the_same_answer() {
        let workers = recipe("kuberay.md", "# ");
        assert!(!workers.terms.new_pods_idle, "every worker of the job's cluster works for the job");
        let at = |s: &str| s.parse::<Timestamp>().unwrap();
        let running = OwnerState::seen(&workers, None, true, at("2026-11-27T10:05:00Z"));
        let added = Some(at("2026-11-27T10:40:00Z"));
        assert!(running.busy_for(added), "a worker the autoscaler added, or a replaced one");
        let after_restart = OwnerState::seen(&workers, None, true, at("2026-11-27T10:50:00Z"));
        assert_eq!(after_restart.busy_for(added), running.busy_for(added), "whatever the job's last write");
        let ended = OwnerState::seen(&workers, Some(&running), false, at("2026-11-27T11:00:00Z"));
        assert!(!ended.busy_for(added), "the job's end frees it");
    }

    #[test]
    fn a_rules_terms_follow_its_kinds_and_a_bad_one_is_refused() {
        let both: OwnerRule =
            "example.com/v1/Task;new-pods-idle;max-busy=6h15m=object.status.phase == 'Running'".parse().unwrap();
        assert_eq!((both.group(), &*both.kind), ("example.com", "Task"));
        assert_eq!(both.terms, Terms { new_pods_idle: true, max_busy: Some("6h15m".into()) });
        assert_eq!(both.expression, "object.status.phase == 'Running'");
        assert_eq!(both.to_string().parse::<OwnerRule>().unwrap().terms, both.terms, "written as it was read");
        let plain: OwnerRule = "example.com/v1/Task=object.spec.x == 'a=b;c'".parse().unwrap();
        assert_eq!((plain.terms.clone(), &*plain.expression), (Terms::default(), "object.spec.x == 'a=b;c'"));
        for (bad, said) in [
            ("example.com/v1/Task;max-busy=forever=true", "max-busy: \"forever\" is not a duration"),
            ("example.com/v1/Task;max-busy;new-pods-idle=true", "max-busy takes a duration"),
            ("example.com/v1/Task;sticky=true", "\"sticky\" is not a rule's term"),
            ("example.com/v1/Task;new-pods-idle", "expected GROUP/VERSION/KIND=EXPRESSION"),
        ] {
            let error = bad.parse::<OwnerRule>().unwrap_err();
            assert!(error.contains(said), "{bad}: {error}");
        }
    }

    #[test]
    fn a_pod_turning_busy_under_a_rule_with_a_max_busy_is_bounded_by_it() {
        assert_eq!(shipped("actions-runner-controller").terms.max_busy.as_deref(), Some("6h15m"));
        let patch = flip_patch("true", Some("6h15m"));
        assert_eq!(patch, json!({"metadata": {"labels": {BUSY_LABEL: "true"}, "annotations": {MAX_BUSY: "6h15m"}}}));
        assert_eq!(flip_patch("false", None), json!({"metadata": {"labels": {BUSY_LABEL: "false"}}}));
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
