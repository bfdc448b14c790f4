//! How a pod's JSON is read where serde's defaults would not do: `null` for an empty map, and
//! the facts busyguard reads of managedFields.

use std::fmt;

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

use crate::policy::keys::FIELD_MANAGER;

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
    Ok(Option::<Entries>::deserialize(deserializer)?.map_or_else(ByBusyguard::default, |entries| entries.0))
}

/// managedFields read entry by entry, nothing kept but the flags.
struct Entries(ByBusyguard);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_seq(EntriesVisitor)
    }
}

struct EntriesVisitor;

impl<'de> Visitor<'de> for EntriesVisitor {
    type Value = Entries;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of managedFields entries")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut entries: A) -> Result<Entries, A::Error> {
        let mut by = ByBusyguard::default();
        while let Some(Entry(entry)) = entries.next_element()? {
            by.mark |= entry.mark;
            by.busy_label |= entry.busy_label;
        }
        Ok(Entries(by))
    }
}

/// One entry: what busyguard's own manager wrote through the pod itself, if it is that.
/// The API server writes `manager` first: another manager's fields are then skipped unread.
struct Entry(ByBusyguard);

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "camelCase")]
enum EntryKey {
    Manager,
    /// `status` for a write through `pods/status`; none for the pod itself.
    Subresource,
    #[serde(rename = "fieldsV1")]
    Fields,
    #[serde(other)]
    Other,
}

impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(EntryVisitor)
    }
}

struct EntryVisitor;

impl<'de> Visitor<'de> for EntryVisitor {
    type Value = Entry;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a managedFields entry")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut entry: A) -> Result<Entry, A::Error> {
        let (mut ours, mut through_pod, mut keys) = (None, true, None);
        while let Some(key) = entry.next_key()? {
            match key {
                EntryKey::Manager => ours = Some(entry.next_value_seed(StrIs(Some(FIELD_MANAGER)))?),
                EntryKey::Subresource => through_pod = entry.next_value_seed(StrIs(None))?,
                EntryKey::Fields if ours != Some(false) => keys = entry.next_value::<Option<MetadataFields>>()?,
                _ => drop(entry.next_value::<IgnoredAny>()?),
            }
        }
        let keys = keys.and_then(|fields| fields.metadata).filter(|_| ours == Some(true) && through_pod);
        Ok(Entry(keys.map_or_else(ByBusyguard::default, |keys| ByBusyguard {
            mark: keys.annotations.is_some_and(|a| a.mark.is_some()),
            busy_label: keys.labels.is_some_and(|l| l.busy.is_some()),
        })))
    }
}

/// Whether a string (or `null`) is the one named, `None` standing for empty or `null`: read in
/// place, not copied into a String of its own.
struct StrIs(Option<&'static str>);

impl<'de> DeserializeSeed<'de> for StrIs {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for StrIs {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string or null")
    }

    fn visit_none<E>(self) -> Result<bool, E> {
        Ok(self.0.is_none())
    }

    fn visit_unit<E>(self) -> Result<bool, E> {
        Ok(self.0.is_none())
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_str(self)
    }

    fn visit_str<E>(self, value: &str) -> Result<bool, E> {
        Ok(value == self.0.unwrap_or_default())
    }
}

/// Kubernetes sends `null` for empty maps and lists now and then; treat it as empty.
pub fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}
