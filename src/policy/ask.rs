//! The request being decided, as the decisions see it: who asks, what, of which object. No wire
//! format (`admission::review` reads it off the AdmissionReview).

use serde::{Deserialize, Serialize};
use strum::{EnumCount, EnumIter, EnumString, IntoStaticStr};

/// Who asks, as the API server authenticated them.
#[derive(Debug, Clone, Copy)]
pub struct Requester<'a> {
    pub username: &'a str,
    pub groups: &'a [String],
    /// The pod whose bound service-account token made the request, if one did
    /// (`authentication.kubernetes.io/pod-name` in the user's extra info).
    pub pod: Option<&'a str>,
}

impl<'a> Requester<'a> {
    /// The pod of `namespace` whose token made the request, if one did: the pod's name with its
    /// service account's namespace, so a pod of the same name elsewhere is not it. (A bound
    /// token outlives no pod: the API server refuses it once its pod, by uid, is gone.)
    pub fn pod_in(&self, namespace: &str) -> Option<&'a str> {
        let account = self.username.strip_prefix("system:serviceaccount:")?;
        let (own_namespace, _) = account.split_once(':')?;
        self.pod.filter(|_| own_namespace == namespace)
    }
}

/// A request's operation, as the AdmissionReview names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, IntoStaticStr, EnumString, EnumCount, EnumIter)]
#[serde(rename_all = "UPPERCASE")]
#[strum(serialize_all = "UPPERCASE")]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// The request being decided, as the decisions see it: no wire format.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    pub uid: &'a str,
    pub operation: Operation,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub requester: Requester<'a>,
    /// The request changes nothing (`dryRun`, or an eviction's `deleteOptions.dryRun`).
    pub dry_run: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_token_names_its_pod_in_its_own_namespace_only() {
        let token = Requester { username: "system:serviceaccount:ci:runner", groups: &[], pod: Some("r-1") };
        assert_eq!(token.pod_in("ci"), Some("r-1"));
        assert_eq!(token.pod_in("other"), None, "a pod of that name in another namespace is another pod");
        let person = Requester { username: "alice", pod: Some("r-1"), ..token };
        assert_eq!(person.pod_in("ci"), None, "no service account, no pod");
    }
}
