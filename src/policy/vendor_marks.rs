//! Other autoscalers' and upgraders' own keys for "leave this pod, and its node, alone", which
//! busyguard writes on busy pods beside Karpenter's and cluster-autoscaler's (`--busy-annotation`,
//! `--busy-label`): CAST AI's, Spot Ocean's, a node maintenance operator's. `marks` plans them.

use super::keys::GUARDED;
use super::pod::PodFacts;

/// Where a [`Mark`] is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum On {
    Annotation,
    Label,
}

impl On {
    /// The value of `key` on `pod`, where this says.
    pub fn read<'p>(self, pod: &'p (impl PodFacts + ?Sized), key: &str) -> Option<&'p str> {
        match self {
            On::Annotation => pod.annotation(key),
            On::Label => pod.label(key),
        }
    }
}

/// A key another autoscaler or upgrader reads as "leave this pod, and its node, alone"
/// (`--busy-annotation KEY=VALUE`, `--busy-label KEY=VALUE`): `value` is written while the pod is
/// busy and protected, the pod's own value waits in `saved_as` meanwhile and comes back when it
/// is idle, as for Karpenter's and cluster-autoscaler's annotations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    pub on: On,
    pub key: &'static str,
    pub value: &'static str,
    /// `busyguard.io/idle-PREFIX_NAME` (an annotation; `idle-label-` for a label's).
    pub saved_as: &'static str,
}

impl Mark {
    /// A mark from `KEY=VALUE`, kept for the life of the process (read on every flip, like the
    /// built-in keys, and made once at the start).
    pub fn parse(on: On, text: &str) -> Result<Mark, String> {
        let (key, value) = text.split_once('=').ok_or_else(|| format!("{text:?}: expected KEY=VALUE"))?;
        let (prefix, name) = key
            .split_once('/')
            .ok_or_else(|| format!("{key:?}: a key with its owner's prefix, as PREFIX/NAME, is expected"))?;
        if !is_dns_subdomain(prefix) || !is_name(name) {
            return Err(format!("{key:?} is not a valid Kubernetes label or annotation key"));
        }
        if prefix == "busyguard.io" || GUARDED.iter().any(|(guarded, _)| *guarded == key) {
            return Err(format!("{key:?} is busyguard's own, or has a flag of its own"));
        }
        if on == On::Label && !(value.is_empty() || is_name(value)) {
            return Err(format!("{value:?} is not a valid label value"));
        }
        let kind = if on == On::Label { "idle-label-" } else { "idle-" };
        let saved_name = format!("{kind}{prefix}_{name}");
        if saved_name.len() > 63 {
            return Err(format!(
                "{key:?} is too long for busyguard to keep the pod's own value beside it \
                 (busyguard.io/{saved_name} is over 63 characters after the prefix)"
            ));
        }
        let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
        let saved_as = leak(format!("busyguard.io/{saved_name}"));
        Ok(Mark { on, key: leak(key.to_string()), value: leak(value.to_string()), saved_as })
    }
}

/// A DNS subdomain, as a key's prefix must be: lowercase alphanumerics, `-` and `.`.
fn is_dns_subdomain(text: &str) -> bool {
    let label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    text.len() <= 253 && text.split('.').all(label)
}

/// A key's name or a label's value: at most 63 alphanumerics, `-`, `_` and `.`, alphanumeric at
/// both ends.
fn is_name(text: &str) -> bool {
    let alphanumeric = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    text.len() <= 63
        && alphanumeric(text.chars().next())
        && alphanumeric(text.chars().last())
        && text.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vendor_key_is_taken_as_prefix_name_and_value_and_a_bad_one_is_refused_with_why() {
        let cast = Mark::parse(On::Annotation, "autoscaling.cast.ai/removal-disabled=true").unwrap();
        assert_eq!(
            (cast.key, cast.value, cast.saved_as),
            ("autoscaling.cast.ai/removal-disabled", "true", "busyguard.io/idle-autoscaling.cast.ai_removal-disabled")
        );
        let ocean = Mark::parse(On::Label, "spotinst.io/restrict-scale-down=true").unwrap();
        assert_eq!(ocean.saved_as, "busyguard.io/idle-label-spotinst.io_restrict-scale-down");
        let (annotation, label) = (On::Annotation, On::Label);
        for (on, bad, why) in [
            (annotation, "autoscaling.cast.ai/removal-disabled", "expected KEY=VALUE"),
            (annotation, "removal-disabled=true", "PREFIX/NAME"),
            (annotation, "Cast.AI/removal-disabled=true", "not a valid Kubernetes label or annotation key"),
            (annotation, "cast.ai/removal disabled=true", "not a valid Kubernetes label or annotation key"),
            (annotation, "karpenter.sh/do-not-disrupt=true", "has a flag of its own"),
            (annotation, "busyguard.io/busy=true", "busyguard's own"),
            (label, "spotinst.io/restrict-scale-down=not ok", "not a valid label value"),
            (annotation, "maintenance.example-operator.io/pod-non-interrupt-while-busy-with-a-task=1", "too long"),
        ] {
            let error = Mark::parse(on, bad).unwrap_err();
            assert!(error.contains(why), "{bad}: {error}");
        }
    }
}
