//! How a pod's JSON is read where serde's defaults would not do: `null` for an empty map, and
//! the one fact busyguard reads of managedFields.

use serde::{Deserialize, Deserializer};

use crate::policy::keys::FIELD_MANAGER;

/// One managedFields entry, as far as the mark's writer goes.
#[derive(Deserialize)]
struct ManagedFields {
    #[serde(default)]
    manager: Option<String>,
    /// `status` for a write through `pods/status`; none for the pod itself.
    #[serde(default)]
    subresource: Option<String>,
    #[serde(default, rename = "fieldsV1")]
    fields: Option<MetadataFields>,
}

#[derive(Deserialize)]
struct MetadataFields {
    #[serde(default, rename = "f:metadata")]
    metadata: Option<AnnotationFields>,
}

#[derive(Deserialize)]
struct AnnotationFields {
    #[serde(default, rename = "f:annotations")]
    annotations: Option<MarkField>,
}

/// `f:` and [`DELETE_REQUESTED`] (a test holds the two together).
#[derive(Deserialize)]
struct MarkField {
    #[serde(default, rename = "f:busyguard.io/delete-requested")]
    mark: Option<serde::de::IgnoredAny>,
}

pub fn mark_by_busyguard<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    let entries = Option::<Vec<ManagedFields>>::deserialize(deserializer)?.unwrap_or_default();
    Ok(entries.iter().any(|entry| {
        entry.manager.as_deref() == Some(FIELD_MANAGER)
            && entry.subresource.as_deref().unwrap_or_default().is_empty()
            && (entry.fields.as_ref().and_then(|f| f.metadata.as_ref()?.annotations.as_ref()?.mark.as_ref())).is_some()
    }))
}

/// Kubernetes sends `null` for empty maps and lists now and then; treat it as empty.
pub fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}
