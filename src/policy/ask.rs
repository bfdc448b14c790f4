//! The request being decided, as the decisions see it: who asks, what, of which object. No wire
//! format (`admission::review` reads it off the AdmissionReview).

/// Who asks, as the API server authenticated them.
#[derive(Debug, Clone, Copy)]
pub struct Requester<'a> {
    pub username: &'a str,
    pub groups: &'a [String],
    /// The pod whose bound service-account token made the request, if one did
    /// (`authentication.kubernetes.io/pod-name` in the user's extra info).
    pub pod: Option<&'a str>,
}

/// A request's operation, as the AdmissionReview names it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize, strum::IntoStaticStr, strum::EnumString,
)]
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
