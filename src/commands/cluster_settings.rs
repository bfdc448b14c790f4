//! The settings busyguard runs with in the cluster, as its Deployment gives them: `busyguard
//! status` judges the pods as that busyguard does (its max-busy, its holds) wherever the user
//! gives no setting of their own.

use k8s_openapi::api::core::v1::Container;

use crate::config::{HoldArgs, MaxBusyArgs};
use crate::policy::busy::MaxBusy;
use crate::policy::hold::Holds;

/// The settings `status` judges the pods with, as `serve` runs with them.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub max_busy: MaxBusy,
    pub holds: Holds,
}

/// The settings `status` shares with `serve`, as clap names them, their flag and their variable:
/// where the user gives none, busyguard's own Deployment's are read (`cluster_settings`).
pub const SHARED_SETTINGS: [(&str, &str, &str); 5] = [
    ("max_busy", "--max-busy", "BUSYGUARD_MAX_BUSY"),
    ("max_busy_ceiling", "--max-busy-ceiling", "BUSYGUARD_MAX_BUSY_CEILING"),
    ("min_max_busy", "--min-max-busy", "BUSYGUARD_MIN_MAX_BUSY"),
    ("hold_after_eviction", "--hold-after-eviction", "BUSYGUARD_HOLD_AFTER_EVICTION"),
    ("hold_on_cordon", "--hold-on-cordon", "BUSYGUARD_HOLD_ON_CORDON"),
];

/// The shared settings a container of busyguard's sets, as `(flag, value)`, from its args
/// (`--flag=value` or `--flag value`) and its env, the args winning as they do for clap.
pub fn container_settings(container: &Container) -> Vec<(&'static str, String)> {
    let set =
        |(_, flag, variable): (&str, &'static str, &str)| Some((flag, container_flag(container, flag, variable)?));
    SHARED_SETTINGS.into_iter().filter_map(set).collect()
}

/// The value a container of busyguard's gives `flag`: by its args (`--flag=value` or `--flag
/// value`), else by its env's `variable`, as clap reads them.
pub fn container_flag(container: &Container, flag: &str, variable: &str) -> Option<String> {
    let args = container.args.as_deref().unwrap_or_default();
    let by_arg = args.iter().enumerate().find_map(|(i, arg)| match arg.strip_prefix(flag)? {
        "" => args.get(i + 1).cloned(),
        value => value.strip_prefix('=').map(str::to_string),
    });
    let by_env = || container.env.iter().flatten().find(|e| e.name == variable).and_then(|e| e.value.clone());
    by_arg.or_else(by_env)
}

/// The shared settings alone, to read a Deployment's values as `serve` reads them.
#[derive(Debug, clap::Parser)]
#[command(no_binary_name = true)]
struct Shared {
    #[command(flatten)]
    max_busy: MaxBusyArgs,
    #[command(flatten)]
    holds: HoldArgs,
}

/// `settings` with each shared setting the user did not give (`given`: flags) taken from
/// busyguard's container as its Deployment has it; what was taken, for the report. A value busyguard could
/// not have started with is an error that names it.
pub fn with_cluster_settings(
    settings: Settings,
    given: &[&str],
    cluster: &[(&'static str, String)],
) -> anyhow::Result<(Settings, Vec<String>)> {
    use clap::Parser;
    let taken: Vec<&(&str, String)> = cluster.iter().filter(|(flag, _)| !given.contains(flag)).collect();
    let argv = taken.iter().map(|(flag, value)| format!("{flag}={value}"));
    let parsed = Shared::try_parse_from(argv).map_err(|e| anyhow::anyhow!("busyguard's Deployment: {e}"))?;
    let (theirs, holds): (MaxBusy, Holds) = ((&parsed.max_busy).into(), (&parsed.holds).into());
    let mine = |flag: &str| !taken.iter().any(|(f, _)| *f == flag);
    let max_busy = MaxBusy {
        default: if mine("--max-busy") { settings.max_busy.default } else { theirs.default },
        ceiling: if mine("--max-busy-ceiling") { settings.max_busy.ceiling } else { theirs.ceiling },
        floor: if mine("--min-max-busy") { settings.max_busy.floor } else { theirs.floor },
    };
    let holds = Holds {
        after_eviction: if mine("--hold-after-eviction") {
            settings.holds.after_eviction
        } else {
            holds.after_eviction
        },
        on_cordon: if mine("--hold-on-cordon") { settings.holds.on_cordon } else { holds.on_cordon },
    };
    let said = taken.iter().map(|(flag, value)| format!("{flag} {value}")).collect();
    Ok((Settings { max_busy, holds }, said))
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::SignedDuration;

    fn container(args: &[&str], env: &[(&str, &str)]) -> Container {
        serde_json::from_value(serde_json::json!({"name": "busyguard", "args": args,
            "env": env.iter().map(|(name, value)| serde_json::json!({"name": name, "value": value})).collect::<Vec<_>>()}))
        .unwrap()
    }

    fn defaults() -> Settings {
        let max_busy =
            MaxBusy { default: SignedDuration::from_hours(24), ceiling: None, floor: SignedDuration::from_mins(1) };
        Settings { max_busy, holds: Holds { after_eviction: SignedDuration::from_secs(30), on_cordon: false } }
    }

    #[test]
    fn status_judges_with_the_clusters_max_busy_and_holds_but_for_what_the_user_gave() {
        let chart = container(
            &["serve", "--hold-on-cordon=true", "--max-busy-ceiling", "12h"],
            &[("BUSYGUARD_MAX_BUSY", "8h")],
        );
        let found = container_settings(&chart);
        assert_eq!(
            found,
            [
                ("--max-busy", "8h".to_string()),
                ("--max-busy-ceiling", "12h".into()),
                ("--hold-on-cordon", "true".into())
            ]
        );
        let (settings, said) = with_cluster_settings(defaults(), &["--max-busy-ceiling"], &found).unwrap();
        assert_eq!(settings.max_busy.default, SignedDuration::from_hours(8), "the cluster's max-busy");
        assert_eq!(settings.max_busy.ceiling, None, "the user's own (none) wins where given");
        assert!(settings.holds.on_cordon, "the cluster's hold on cordon");
        assert_eq!(settings.holds.after_eviction, SignedDuration::from_secs(30), "set nowhere: the default");
        assert_eq!(said, ["--max-busy 8h", "--hold-on-cordon true"]);
    }

    #[test]
    fn a_deployment_value_busyguard_could_not_start_with_is_named() {
        let broken = container(&["serve", "--max-busy=soon"], &[]);
        let why = with_cluster_settings(defaults(), &[], &container_settings(&broken)).unwrap_err().to_string();
        assert!(why.starts_with("busyguard's Deployment: ") && why.contains("soon"), "{why}");
    }
}
