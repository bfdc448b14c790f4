//! What a person reads when busyguard refuses to take a busy pod: who is busy, since when,
//! until when at the latest, and how to force it.

use jiff::Timestamp;

use super::keys::BUSY_LABEL;
use super::pod::OwnerKey;

/// What makes a pod busy, as a refusal tells it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Busy<'a> {
    pub since: Option<Timestamp>,
    /// When its protection lapses at the latest.
    pub until: Option<Timestamp>,
    /// Busy because it is not Ready (compatibility mode), where the label says idle.
    pub by_readiness: bool,
    /// What its busy label follows, named `Kind/name`: its owner's status (`--busy-when-owner`),
    /// or the pod it is busy with (`--busy-with-pod`).
    pub followed: Option<OwnerKey<'a>>,
}

/// What a person reads when busyguard refuses: who is busy, since when, and how to override.
/// `enforced`: the refusal stands (not `--mode audit`, where the pod goes all the same).
pub fn busy_denial(namespace: &str, name: &str, busy: &Busy<'_>, enforced: bool) -> String {
    use std::fmt::Write;
    // One buffer, written once: every refusal of a busy pod builds this sentence, and then adds
    // what busyguard does next (`Consequence`'s words, up to some 300 bytes more).
    let mut message = String::with_capacity(640 + 2 * (namespace.len() + name.len()));
    let what = if busy.by_readiness { "busy (not Ready)" } else { "busy" };
    let _ = write!(message, "pod {namespace}/{name} is {what}");
    // Without a busy-since (busyguard missed the flip), max-busy counts from the pod's creation.
    let counted = match busy.since {
        Some(t) => {
            let _ = write!(message, " since {t}");
            ""
        }
        None => {
            message.push_str(", since when busyguard cannot tell");
            ", counted from the pod's creation"
        }
    };
    if let Some(t) = busy.until {
        let _ = write!(message, " ({}{counted})", lapses_at(t));
    }
    if !enforced {
        // Audit mode: the pod goes all the same, there is nothing to force.
        return message;
    }
    message.push_str("; it will be spared until it is idle");
    match busy.followed {
        // Its label is busyguard's to write: a person's relabelling is undone at the next flip.
        Some(OwnerKey { kind, name: owner, .. }) => {
            let _ = write!(
                message,
                "; its busy label follows {kind}/{owner}, and busyguard writes it: to force, end {kind}/{owner}'s \
                 task, or delete the pod as a user busyguard exempts (--exempt-user)"
            );
        }
        None => {
            let _ = write!(message, "; {}", how_to_force(namespace, name));
        }
    }
    message
}

/// An update refused because it would restart the container of a busy pod's task. A pod whose
/// busy label busyguard writes (it follows an owner or a leader) is forced by ending that task.
pub fn restart_while_busy(namespace: &str, name: &str, container: &str, busy: &Busy<'_>) -> String {
    let since = busy.since.map_or_else(|| "a time busyguard cannot tell".to_string(), |t| t.to_string());
    let until = busy.until.map_or_else(String::new, |t| format!(" ({})", lapses_at(t)));
    let force = match busy.followed {
        Some(OwnerKey { kind, name: owner, .. }) => {
            format!("to force: end {kind}/{owner}'s task, or update the pod as a user busyguard exempts")
        }
        None => how_to_force(namespace, name).to_string(),
    };
    format!(
        "pod {namespace}/{name} is busy since {since}{until}: this update would restart its container {container:?} \
         and end the task; retry once the pod is idle ({force})"
    )
}

/// Until when a busy pod is protected at the latest, as every refusal says it: written where
/// it is used, with no String of its own, since every refusal of a busy pod says it.
fn lapses_at(until: Timestamp) -> impl std::fmt::Display {
    struct LapsesAt(Timestamp);
    impl std::fmt::Display for LapsesAt {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "protection lapses at {} at the latest", self.0)
        }
    }
    LapsesAt(until)
}

/// How a person takes a busy pod's protection away, as every refusal says it (written where it
/// is used, as `lapses_at`).
fn how_to_force<'a>(namespace: &'a str, name: &'a str) -> impl std::fmt::Display + 'a {
    struct HowToForce<'a>(&'a str, &'a str);
    impl std::fmt::Display for HowToForce<'_> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            let HowToForce(namespace, name) = self;
            write!(f, "to force: kubectl label pod {name} -n {namespace} {BUSY_LABEL}=false --overwrite")
        }
    }
    HowToForce(namespace, name)
}
