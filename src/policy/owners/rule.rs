//! A busy rule as `--busy-when-owner` gives it: the kinds it follows, its terms, its CEL
//! expression compiled, and how it judges an owner (and, if it reads it, each of its pods).

use std::fmt;

use super::expression::{pod_fields_not_kept, unbound_names};
use crate::policy::pod::{OwnerKey, PodRef, group_of, version_of};

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

    /// How a pod's controlling owner of this rule's kind named `name` is keyed (see [`OwnerKey`]).
    pub fn owner_key(&self, name: &str) -> String {
        OwnerKey { group: self.group(), kind: &self.kind, name }.to_string()
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
    /// The terms of the rule it is judged by.
    pub fn terms(&self) -> &Terms {
        &self.rule.terms
    }

    /// Whether the pod (its metadata, as much as [`super::POD_FIELDS`] names) is busy as the owner says.
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

/// The rule that puts the pods of `owner` (the pod's controlling owner) busy, if any.
pub fn rule_of<'r>(rules: &'r [OwnerRule], owner: OwnerKey<'_>) -> Option<&'r OwnerRule> {
    rules.iter().find(|rule| rule.pods_owner() == (owner.group, owner.kind))
}

/// Why a rule cannot tell whether an owner's pods are busy: they are left as they are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Undecided(pub String);
