//! The request's `object` and `oldObject`, decoded by the request's kind into only the fields
//! busyguard reads, in the same pass as the rest of the review: an 8 KB pod is read once, not
//! skipped over and then read again.

use std::fmt;

use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, Error, IgnoredAny};
use serde_json::value::RawValue;

use crate::policy::pod::{Condition, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Why a body is not a request busyguard can judge. Always the client's fault (HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidReview(pub String);

impl fmt::Display for InvalidReview {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The pod is boxed: an object is moved through each step of the decode, and unboxed every
/// object, an eviction's too, would move a pod's 448 bytes each time.
#[derive(Debug)]
pub enum Object {
    Pod(Box<Pod>),
    Eviction(Eviction),
    /// A Deployment or a ReplicaSet.
    Workload(Workload),
    /// `autoscaling/v1` Scale, the `scale` subresource of either.
    Scale(Scale),
    /// Karpenter's `karpenter.sh/v1` NodeClaim.
    NodeClaim(NodeClaim),
    /// A kind no decision reads; skipped unparsed.
    Unread,
}

/// `policy/v1` Eviction: only whether it is a dry run.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Eviction {
    #[serde(default)]
    pub delete_options: Option<DeleteOptions>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteOptions {
    #[serde(default)]
    pub dry_run: Option<Vec<String>>,
    #[serde(default)]
    pub grace_period_seconds: Option<i64>,
}

impl Eviction {
    /// An eviction's dry run is asked for in its body, not (only) in the request.
    pub fn is_dry_run(&self) -> bool {
        self.delete_options.as_ref().and_then(|o| o.dry_run.as_ref()).is_some_and(|modes| !modes.is_empty())
    }

    /// The grace period the eviction asks for, if it names one.
    pub fn grace_period(&self) -> Option<i64> {
        self.delete_options.as_ref().and_then(|o| o.grace_period_seconds)
    }
}

/// A ReplicaSet or Deployment: replicas and a structured selector.
#[derive(Debug, Deserialize)]
pub struct Workload {
    #[serde(default)]
    pub spec: WorkloadSpec,
}

#[derive(Debug, Default, Deserialize)]
pub struct WorkloadSpec {
    #[serde(default)]
    pub replicas: Option<i32>,
    #[serde(default)]
    pub selector: Option<LabelSelector>,
}

/// `autoscaling/v1` Scale: replicas, and the selector as a string.
#[derive(Debug, Deserialize)]
pub struct Scale {
    #[serde(default)]
    pub spec: ScaleSpec,
    #[serde(default)]
    pub status: ScaleStatus,
}

#[derive(Debug, Default, Deserialize)]
pub struct ScaleSpec {
    #[serde(default)]
    pub replicas: Option<i32>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ScaleStatus {
    #[serde(default)]
    pub selector: Option<String>,
}

/// Karpenter's NodeClaim: its node, why Karpenter is disrupting it, if it is, and what tells
/// its other ends apart (its age and `expireAfter`, its capacity type).
#[derive(Debug, Default, Deserialize)]
pub struct NodeClaim {
    #[serde(default)]
    pub metadata: NodeClaimMeta,
    #[serde(default)]
    pub spec: NodeClaimSpec,
    #[serde(default)]
    pub status: NodeClaimStatus,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimMeta {
    #[serde(default)]
    pub creation_timestamp: Option<String>,
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimSpec {
    /// `720h`, or `Never`.
    #[serde(default)]
    pub expire_after: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimStatus {
    #[serde(default)]
    pub node_name: Option<String>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

impl NodeClaim {
    /// The reason of its `DisruptionReason` condition, where it is True: Karpenter's disruption
    /// queue sets it (Underutilized, Empty, Drifted) before it deletes the NodeClaim, and its
    /// interruption handling (SpotInterruption and the like) too.
    pub fn disruption_reason(&self) -> Option<&str> {
        let condition = self.status.conditions.iter().find(|c| c.type_ == "DisruptionReason" && c.status == "True");
        condition.map(|c| c.reason.as_deref().unwrap_or_default())
    }
}

impl Object {
    pub fn kind(&self) -> &'static str {
        match self {
            Object::Pod(_) => "Pod",
            Object::Eviction(_) => "Eviction",
            Object::Workload(_) => "Deployment or ReplicaSet",
            Object::Scale(_) => "Scale",
            Object::NodeClaim(_) => "NodeClaim",
            Object::Unread => "kind busyguard does not read",
        }
    }

    /// Why this object does not fit a route that reads `wanted` ("a Pod") from `request.{field}`.
    pub fn mismatch(&self, field: &str, wanted: &str) -> InvalidReview {
        InvalidReview(format!("request.{field} is a {}, not {wanted}", self.kind()))
    }
}

/// Decodes one object field as the request's kind says. `None` for `null`.
pub struct ObjectSeed<'a> {
    pub kind: &'a str,
    pub field: &'static str,
}

impl<'de> DeserializeSeed<'de> for ObjectSeed<'_> {
    type Value = Option<Object>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        let decoded = match self.kind {
            "Pod" => Option::<Box<Pod>>::deserialize(deserializer).map(|o| o.map(Object::Pod)),
            "Eviction" => Option::<Eviction>::deserialize(deserializer).map(|o| o.map(Object::Eviction)),
            "Deployment" | "ReplicaSet" => {
                Option::<Workload>::deserialize(deserializer).map(|o| o.map(Object::Workload))
            }
            "Scale" => Option::<Scale>::deserialize(deserializer).map(|o| o.map(Object::Scale)),
            "NodeClaim" => Option::<NodeClaim>::deserialize(deserializer).map(|o| o.map(Object::NodeClaim)),
            _ => IgnoredAny::deserialize(deserializer).map(|_| Some(Object::Unread)),
        };
        decoded.map_err(|e| D::Error::custom(Invalid { field: self.field, kind: self.kind, error: e }))
    }
}

struct Invalid<'a, E> {
    field: &'static str,
    kind: &'a str,
    error: E,
}

impl<E: fmt::Display> fmt::Display for Invalid<'_, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "request.{} is not a valid {}: {}", self.field, self.kind, self.error)
    }
}

/// An object field as it arrived, kept when it came before the request's kind (the API server
/// always sends the kind first); decoded once the kind is known.
pub enum Pending {
    Decoded(Option<Object>),
    Raw(Box<RawValue>),
}

impl Pending {
    pub fn resolve(self, seed: ObjectSeed<'_>) -> Result<Option<Object>, serde_json::Error> {
        match self {
            Pending::Decoded(object) => Ok(object),
            Pending::Raw(raw) => {
                let mut deserializer = serde_json::Deserializer::from_str(raw.get());
                let object = seed.deserialize(&mut deserializer)?;
                deserializer.end()?;
                Ok(object)
            }
        }
    }
}
