//! How a pod's JSON is read where serde's defaults would not do: `null` for an empty map, and
//! the facts busyguard reads of managedFields.

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
    metadata: Option<KeyFields>,
}

#[derive(Deserialize)]
struct KeyFields {
    #[serde(default, rename = "f:annotations")]
    annotations: Option<MarkField>,
    #[serde(default, rename = "f:labels")]
    labels: Option<BusyField>,
}

/// `f:` and [`DELETE_REQUESTED`] (a test holds the two together).
#[derive(Deserialize)]
struct MarkField {
    #[serde(default, rename = "f:busyguard.io/delete-requested")]
    mark: Option<serde::de::IgnoredAny>,
}

/// `f:` and [`BUSY_LABEL`](crate::policy::keys::BUSY_LABEL).
#[derive(Deserialize)]
struct BusyField {
    #[serde(default, rename = "f:busyguard.io/busy")]
    busy: Option<serde::de::IgnoredAny>,
}

/// Which of busyguard's keys busyguard itself (its field manager) last wrote through the pod
/// itself, not its status (which no webhook of the pod's sees), as managedFields record it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ByBusyguard {
    /// The delete-requested mark's annotation.
    pub mark: bool,
    /// The busy label: busyguard writes it for a pod that follows its owner or its leader.
    pub busy_label: bool,
}

pub fn by_busyguard<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ByBusyguard, D::Error> {
    let entries = Option::<Vec<ManagedFields>>::deserialize(deserializer)?.unwrap_or_default();
    let ours = entries.iter().filter(|entry| {
        entry.manager.as_deref() == Some(FIELD_MANAGER) && entry.subresource.as_deref().unwrap_or_default().is_empty()
    });
    let mut by = ByBusyguard::default();
    for keys in ours.filter_map(|entry| entry.fields.as_ref()?.metadata.as_ref()) {
        by.mark |= keys.annotations.as_ref().is_some_and(|a| a.mark.is_some());
        by.busy_label |= keys.labels.as_ref().is_some_and(|l| l.busy.is_some());
    }
    Ok(by)
}

/// Kubernetes sends `null` for empty maps and lists now and then; treat it as empty.
pub fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}
