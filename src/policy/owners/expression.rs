//! What a rule's CEL expression reads: the names it leaves unbound, the fields of the pod
//! busyguard does not keep, and the fields of the owner its kind's schema prunes.

/// What a rule may read of the pod: `pod.metadata.name`, `namespace`, `uid` and `labels` (the
/// view keeps no more of a pod).
pub const POD_FIELDS: [&str; 4] = ["name", "namespace", "uid", "labels"];

/// The fields under `pod.` an expression reads that busyguard does not keep of a pod (see
/// [`POD_FIELDS`]), as written after `pod.`.
pub(super) fn pod_fields_not_kept(expression: &str) -> Vec<String> {
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
pub(super) fn unbound_names(expr: &cel::IdedExpr, bound: &mut Vec<String>, found: &mut Vec<String>) {
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
