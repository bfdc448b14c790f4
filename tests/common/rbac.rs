//! RBAC as the API server applies it to busyguard's ServiceAccount: what `manifests/base/rbac.yaml`
//! grants, and the permission each request of the stand-in API server needs.

use std::collections::BTreeSet;
use std::sync::LazyLock;

use axum::http::Method;
use serde_json::Value;

/// What RBAC authorizes: (API group, resource, verb, the one name a rule's `resourceNames`
/// narrows it to, if any, and the namespace a Role's rule holds in; `None`: a ClusterRole's).
pub type Permission = (String, String, String, Option<String>, Option<String>);

/// What busyguard's ServiceAccount is granted by `manifests/base/rbac.yaml`: the rules of the
/// ClusterRole its ClusterRoleBinding names, and of each Role a RoleBinding names, in its
/// namespace.
pub static GRANTED: LazyLock<BTreeSet<Permission>> = LazyLock::new(|| {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/base/rbac.yaml");
    let documents: Vec<Value> = serde_saphyr::from_multiple(&std::fs::read_to_string(path).unwrap()).unwrap();
    let of_kind = |kind: &'static str| documents.iter().filter(move |d| d["kind"] == kind);
    let to_busyguard = |b: &&Value| {
        b["subjects"].as_array().unwrap().iter().any(|s| s["kind"] == "ServiceAccount" && s["name"] == "busyguard")
    };
    let strings = |v: &Value| v.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect::<Vec<_>>();
    let mut granted = BTreeSet::new();
    let mut grant = |role: &Value, namespace: Option<String>| {
        for rule in role["rules"].as_array().unwrap() {
            let names: Vec<Option<String>> = match rule.get("resourceNames") {
                Some(names) => strings(names).into_iter().map(Some).collect(),
                None => vec![None],
            };
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    for verb in strings(&rule["verbs"]) {
                        for name in &names {
                            let permission =
                                (group.clone(), resource.clone(), verb.clone(), name.clone(), namespace.clone());
                            granted.insert(permission);
                        }
                    }
                }
            }
        }
    };
    let binding = of_kind("ClusterRoleBinding").find(to_busyguard).expect("a ClusterRoleBinding for busyguard");
    grant(of_kind("ClusterRole").find(|r| r["metadata"]["name"] == binding["roleRef"]["name"]).unwrap(), None);
    for binding in of_kind("RoleBinding").filter(to_busyguard) {
        let namespace = &binding["metadata"]["namespace"];
        let role = of_kind("Role")
            .find(|r| r["metadata"]["name"] == binding["roleRef"]["name"] && r["metadata"]["namespace"] == *namespace);
        grant(role.expect("the Role a RoleBinding names"), namespace.as_str().map(String::from));
    }
    granted
});

/// The permission a request needs, derived from its method and path as the API server does.
pub fn permission_of(method: &Method, segments: &[&str], query: &str) -> Option<Permission> {
    let (group, rest) = match segments {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let (resource, name, namespace) = match rest {
        [resource] => (resource.to_string(), None, None),
        ["namespaces", namespace, resource] => (resource.to_string(), None, Some(namespace.to_string())),
        ["namespaces", namespace, resource, name] => {
            (resource.to_string(), Some(name.to_string()), Some(namespace.to_string()))
        }
        ["namespaces", namespace, resource, name, subresource] => {
            (format!("{resource}/{subresource}"), Some(name.to_string()), Some(namespace.to_string()))
        }
        _ => return None,
    };
    let named = name.is_some();
    let verb = match (method.as_str(), named) {
        ("GET", false) if query.split('&').any(|p| p == "watch=true") => "watch",
        ("GET", false) => "list",
        ("GET", true) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    };
    Some((group.to_string(), resource, verb.to_string(), name, namespace))
}

/// The grant that authorizes `needed`: a ClusterRole's or, in its namespace, a Role's; for any
/// name of the resource, or for its own.
pub fn granted(needed: &Permission) -> Option<Permission> {
    let (group, resource, verb, name, namespace) = needed.clone();
    let with = |name: Option<String>, namespace: Option<String>| {
        (group.clone(), resource.clone(), verb.clone(), name, namespace)
    };
    let scopes = [None, namespace.clone()];
    let mut candidates = scopes.iter().flat_map(|ns| [with(None, ns.clone()), with(name.clone(), ns.clone())]);
    candidates.find(|p| GRANTED.contains(p))
}
