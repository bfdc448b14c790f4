//! May this pod be taken away now? The answer for deletes (and, through the cluster view,
//! evictions): busy pods are spared unless their protection lapsed or the requester is exempt.

use jiff::Timestamp;

use super::busy::{BUSY_LABEL, BusyState, Lapse};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exemptions {
    pub users: Vec<String>,
    pub groups: Vec<String>,
}

/// Who asks, as the API server authenticated them.
#[derive(Debug, Clone, Copy)]
pub struct Requester<'a> {
    pub username: &'a str,
    pub groups: &'a [String],
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing busy is at stake.
    Allow,
    /// A pod marked busy goes anyway, for the reason given (audited).
    AllowBusy(Override),
    /// The pod is busy and protected.
    Deny { since: Option<Timestamp>, until: Option<Timestamp> },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Override {
    Lapsed { since: Timestamp, lapse: Lapse },
    ExemptUser(String),
    ExemptGroup(String),
}

impl Override {
    /// Short reason for audit lines and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Override::Lapsed { lapse: Lapse::MaxBusy { .. }, .. } => "max-busy-exceeded",
            Override::Lapsed { lapse: Lapse::Restarted { .. }, .. } => "stale-after-restart",
            Override::ExemptUser(_) => "exempt-user",
            Override::ExemptGroup(_) => "exempt-group",
        }
    }
}

pub fn judge(state: BusyState, requester: Requester<'_>, exemptions: &Exemptions) -> Verdict {
    match state {
        BusyState::NotOptedIn | BusyState::Idle | BusyState::Terminating | BusyState::Terminal => Verdict::Allow,
        BusyState::Lapsed { since, lapse } => Verdict::AllowBusy(Override::Lapsed { since, lapse }),
        BusyState::Busy { since, until } => {
            if exemptions.users.iter().any(|u| u == requester.username) {
                return Verdict::AllowBusy(Override::ExemptUser(requester.username.to_string()));
            }
            if let Some(group) = requester.groups.iter().find(|g| exemptions.groups.contains(g)) {
                return Verdict::AllowBusy(Override::ExemptGroup(group.clone()));
            }
            Verdict::Deny { since, until }
        }
    }
}

/// What a person reads when busyguard refuses: who is busy, since when, and how to override.
pub fn denial_message(namespace: &str, name: &str, since: Option<Timestamp>, until: Option<Timestamp>) -> String {
    let since = since.map_or_else(|| " (since unknown)".to_string(), |t| format!(" since {t}"));
    let until = until.map_or_else(String::new, |t| format!(" (protection lapses at {t} at the latest)"));
    format!(
        "pod {namespace}/{name} is busy{since}{until}; it will be spared until it is idle; \
         to force: kubectl label pod {name} -n {namespace} {BUSY_LABEL}=false --overwrite"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::SignedDuration;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    const NO_GROUPS: &[String] = &[];

    fn admin() -> Requester<'static> {
        Requester { username: "admin", groups: NO_GROUPS }
    }

    fn busy() -> BusyState {
        BusyState::Busy { since: Some(ts("2026-11-21T20:00:00Z")), until: Some(ts("2026-11-22T20:00:00Z")) }
    }

    #[test]
    fn busy_pod_is_denied() {
        assert_eq!(
            judge(busy(), admin(), &Exemptions::default()),
            Verdict::Deny { since: Some(ts("2026-11-21T20:00:00Z")), until: Some(ts("2026-11-22T20:00:00Z")) }
        );
    }

    #[test]
    fn idle_terminating_terminal_and_unlabelled_pods_are_allowed() {
        for state in [BusyState::Idle, BusyState::Terminating, BusyState::Terminal, BusyState::NotOptedIn] {
            assert_eq!(judge(state, admin(), &Exemptions::default()), Verdict::Allow, "{state:?}");
        }
    }

    #[test]
    fn lapsed_protection_allows_and_says_why() {
        let lapse = Lapse::MaxBusy { limit: SignedDuration::from_hours(1) };
        let verdict =
            judge(BusyState::Lapsed { since: ts("2026-11-21T20:00:00Z"), lapse }, admin(), &Exemptions::default());
        let Verdict::AllowBusy(over) = verdict else { panic!("{verdict:?}") };
        assert_eq!(over.reason(), "max-busy-exceeded");
    }

    #[test]
    fn exempt_user_and_exempt_group_may_delete_busy_pods() {
        let exemptions = Exemptions {
            users: vec!["system:serviceaccount:kube-system:pod-garbage-collector".into()],
            groups: vec!["ops:breakglass".into()],
        };
        let gc = Requester { username: "system:serviceaccount:kube-system:pod-garbage-collector", groups: NO_GROUPS };
        assert_eq!(
            judge(busy(), gc, &exemptions),
            Verdict::AllowBusy(Override::ExemptUser("system:serviceaccount:kube-system:pod-garbage-collector".into()))
        );
        let groups = vec!["system:authenticated".to_string(), "ops:breakglass".to_string()];
        let person = Requester { username: "alice", groups: &groups };
        assert_eq!(
            judge(busy(), person, &exemptions),
            Verdict::AllowBusy(Override::ExemptGroup("ops:breakglass".into()))
        );
        assert!(matches!(judge(busy(), admin(), &exemptions), Verdict::Deny { .. }));
    }

    #[test]
    fn denial_message_names_the_pod_the_time_and_the_override() {
        let message =
            denial_message("capture", "worker-1", Some(ts("2026-11-21T20:00:00Z")), Some(ts("2026-11-22T20:00:00Z")));
        assert_eq!(
            message,
            "pod capture/worker-1 is busy since 2026-11-21T20:00:00Z (protection lapses at \
             2026-11-22T20:00:00Z at the latest); it will be spared until it is idle; to force: \
             kubectl label pod worker-1 -n capture busyguard.io/busy=false --overwrite"
        );
        assert!(denial_message("ns", "p", None, None).contains("busy (since unknown);"));
    }
}
