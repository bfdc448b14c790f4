//! Command line: every flag has a long name and a `BUSYGUARD_*` environment variable.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args};
use jiff::SignedDuration;

use crate::cluster::outbox::OutboxSettings;
use crate::cluster::{ClusterSettings, ClusterSource};
use crate::duration::parse_positive_duration;
use crate::policy::Exemptions;
use crate::policy::busy::MaxBusy;
use crate::policy::hold::Holds;
use crate::policy::marks::{Mark, MutationSettings, On};
use crate::policy::owners::OwnerRule;
use crate::policy::{Enrolment, KARPENTER_USERS, Mode, OWNER_CONTROLLER_USERS, POD_GC_USER, PolicyConfig};
use crate::server::ServeConfig;
use crate::server::tls::CertFiles;

mod limits;

pub use limits::{LimitArgs, std_duration};

/// The cluster a person's command reaches with their own kubeconfig, and where in it.
#[derive(Debug, Args)]
pub struct UsersCluster {
    /// Kubeconfig to reach the cluster with; without it, `KUBECONFIG` or `~/.kube/config`.
    #[arg(long, env = "BUSYGUARD_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use, as `kubectl --context`; its current one without it.
    #[arg(long)]
    pub context: Option<String>,
    /// Namespaces to look at (comma-separated, or repeated); all without it.
    #[arg(long = "namespace", short = 'n', env = "BUSYGUARD_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,
}

impl UsersCluster {
    pub fn source(&self) -> ClusterSource {
        users_source(self.kubeconfig.clone(), self.context.clone())
    }
}

/// The cluster a person's command reaches: a kubeconfig's context, else its current one.
pub fn users_source(kubeconfig: Option<PathBuf>, context: Option<String>) -> ClusterSource {
    match (kubeconfig, context) {
        (kubeconfig, Some(context)) => ClusterSource::Context { kubeconfig, context },
        (Some(path), None) => ClusterSource::Kubeconfig(path),
        (None, None) => ClusterSource::Infer,
    }
}

/// An address to listen on, `IP:PORT`, with a hint for the forms people try first.
fn listen_address(value: &str) -> Result<SocketAddr, String> {
    value.parse().map_err(|_| {
        format!("{value:?} is not IP:PORT: give an address and a port, e.g. 127.0.0.1:8443 (this machine only) or 0.0.0.0:8443 (every interface)")
    })
}

/// When a pod whose disruption is wanted takes no new task.
#[derive(Debug, Args)]
pub struct HoldArgs {
    /// After busyguard refuses an eviction of a busy pod, the pod takes no new task for this long
    /// (its next flip to busy is refused, 409 BusyguardDisruptionWanted), counted from the last
    /// refused eviction: an evictor that keeps asking (a drain every 5 s, Karpenter, cluster-
    /// autoscaler every 10 s) gets the pod at its next idle moment; one that gave up leaves it
    /// free again after this. Keep it above the evictors' retry interval.
    #[arg(long, env = "BUSYGUARD_HOLD_AFTER_EVICTION", default_value = "30s", value_parser = parse_positive_duration)]
    pub hold_after_eviction: SignedDuration,
    /// A cordoned node (unschedulable) holds its pods from new tasks too, as a node that
    /// Karpenter or cluster-autoscaler takes away, or whose lifecycle condition says it goes,
    /// always does. Off: a cordon alone (maintenance without a drain) lets work go on.
    #[arg(long, env = "BUSYGUARD_HOLD_ON_CORDON", default_value_t = false, action = ArgAction::Set)]
    pub hold_on_cordon: bool,
}

impl From<&HoldArgs> for Holds {
    fn from(args: &HoldArgs) -> Self {
        Holds { after_eviction: args.hold_after_eviction, on_cordon: args.hold_on_cordon }
    }
}

/// How long a busy pod is protected.
#[derive(Debug, Args)]
pub struct MaxBusyArgs {
    /// Protection ends after a pod has been busy this long, unless the pod's own
    /// `busyguard.io/max-busy` annotation says otherwise (for `status`: the cluster's value).
    #[arg(long, env = "BUSYGUARD_MAX_BUSY", default_value = "24h", value_parser = parse_positive_duration)]
    pub max_busy: SignedDuration,
    /// No pod is protected longer than this, whatever its own `busyguard.io/max-busy` says.
    #[arg(long, env = "BUSYGUARD_MAX_BUSY_CEILING", value_parser = parse_positive_duration)]
    pub max_busy_ceiling: Option<SignedDuration>,
    /// No pod's own `busyguard.io/max-busy` protects it for less: a flip to busy with a shorter
    /// one is refused, and one set meanwhile counts as this.
    #[arg(long, env = "BUSYGUARD_MIN_MAX_BUSY", default_value = "1m", value_parser = parse_positive_duration)]
    pub min_max_busy: SignedDuration,
}

impl From<&MaxBusyArgs> for MaxBusy {
    fn from(args: &MaxBusyArgs) -> Self {
        MaxBusy { default: args.max_busy, ceiling: args.max_busy_ceiling, floor: args.min_max_busy }
    }
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Append audit lines to this file instead of stdout.
    #[arg(long, env = "BUSYGUARD_AUDIT_LOG")]
    pub audit_log: Option<PathBuf>,
    #[command(flatten)]
    pub ports: PortArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub policy: PolicyArgs,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

#[derive(Debug, Args)]
#[command(next_help_heading = "Ports and certificates")]
pub struct PortArgs {
    /// Address of the HTTPS webhook port.
    #[arg(long, env = "BUSYGUARD_LISTEN", default_value = "0.0.0.0:8443", value_parser = listen_address)]
    pub listen: SocketAddr,
    /// Address of the plain-HTTP admin port: /healthz, /readyz (serving), /metrics, and /status
    /// (the view of opted-in pods and the audit log: ok, or what is wrong).
    #[arg(long, env = "BUSYGUARD_ADMIN_LISTEN", default_value = "0.0.0.0:8080", value_parser = listen_address)]
    pub admin_listen: SocketAddr,
    /// Serving certificate (PEM, leaf first); reloaded when the file changes.
    #[arg(long, env = "BUSYGUARD_TLS_CERT", default_value = "certs/tls.crt")]
    pub tls_cert: PathBuf,
    /// Private key of the serving certificate (PEM).
    #[arg(long, env = "BUSYGUARD_TLS_KEY", default_value = "certs/tls.key")]
    pub tls_key: PathBuf,
    /// Require a client certificate issued by a CA in this PEM file (the API server's, set in
    /// its AdmissionConfiguration); connections without one are refused in the handshake.
    #[arg(long, env = "BUSYGUARD_CLIENT_CA")]
    pub client_ca: Option<PathBuf>,
    /// How often the certificate files are read again for changes.
    #[arg(long, env = "BUSYGUARD_CERT_RELOAD_INTERVAL", default_value = "1s", value_parser = std_duration)]
    pub cert_reload_interval: Duration,
}

#[derive(Debug, Args)]
#[command(next_help_heading = "Policy")]
pub struct PolicyArgs {
    #[command(flatten)]
    pub max_busy: MaxBusyArgs,
    /// `enforce` denies disruptions of busy pods; `audit` (formerly `dry-run`) is a trial that
    /// changes nothing: every request allowed unpatched, no PDB, what enforce would do audited.
    #[arg(long, env = "BUSYGUARD_MODE", value_enum, default_value_t = Mode::Enforce)]
    pub mode: Mode,
    /// Users who may delete busy pods (comma-separated, or repeated). Replaces the default.
    #[arg(long = "exempt-user", env = "BUSYGUARD_EXEMPT_USERS", value_delimiter = ',', default_value = POD_GC_USER)]
    pub exempt_users: Vec<String>,
    /// Groups whose members may delete busy pods (comma-separated, or repeated).
    #[arg(long = "exempt-group", env = "BUSYGUARD_EXEMPT_GROUPS", value_delimiter = ',')]
    pub exempt_groups: Vec<String>,
    /// Karpenter's users (comma-separated, or repeated): a *delete* of a busy pod by one
    /// of them goes through, audited, since Karpenter deletes pods only when its node's
    /// terminationGracePeriod runs out; its evictions are refused like anyone's.
    #[arg(
        long = "karpenter-user",
        env = "BUSYGUARD_KARPENTER_USERS",
        value_delimiter = ',',
        default_value = KARPENTER_USERS
    )]
    pub karpenter_users: Vec<String>,
    /// The controllers that run pods to completion (comma-separated, or repeated): a delete by
    /// one of them of a pod carrying a Job's, an Argo Workflow's or a Tekton TaskRun's label goes
    /// through, audited (`owner-controller`): the workload's own end (its deadline, suspend,
    /// backoff limit, success policy, lowered parallelism; a stop, cancel or timeout).
    #[arg(
        long = "owner-controller-user",
        env = "BUSYGUARD_OWNER_CONTROLLER_USERS",
        value_delimiter = ',',
        default_value = OWNER_CONTROLLER_USERS
    )]
    pub owner_controller_users: Vec<String>,
    /// Set `karpenter.sh/do-not-disrupt` on busy pods (`"true"`, or the time left with
    /// --karpenter-bounded): Karpenter then neither evicts them nor consolidates their node, and
    /// the user's own value comes back when the pod is idle.
    #[arg(long, env = "BUSYGUARD_KARPENTER_ANNOTATION", default_value_t = true, action = ArgAction::Set)]
    pub karpenter_annotation: bool,
    /// Write `karpenter.sh/do-not-disrupt` as the seconds left of the protection, counted from
    /// the pod's start, so it ends when max-busy would even if busyguard is gone. Only Karpenter
    /// 1.12 and later read that form (kubernetes-sigs/karpenter#2874); 1.0 to 1.11 read anything
    /// but "true" as not protected. Off: `"true"`, which every Karpenter honours.
    #[arg(long, env = "BUSYGUARD_KARPENTER_BOUNDED", default_value_t = false, action = ArgAction::Set)]
    pub karpenter_bounded: bool,
    /// Set `cluster-autoscaler.kubernetes.io/safe-to-evict: "false"` on busy pods.
    #[arg(long, env = "BUSYGUARD_CLUSTER_AUTOSCALER_ANNOTATION", default_value_t = true, action = ArgAction::Set)]
    pub cluster_autoscaler_annotation: bool,
    /// Write it as `"on-completion"`: cluster-autoscaler 1.36 and later then neither evict the
    /// pod nor take its node for empty, and may still move the node's other pods. Older ones
    /// read that value as no annotation at all: only with 1.36 or later.
    #[arg(long, env = "BUSYGUARD_CLUSTER_AUTOSCALER_ON_COMPLETION", default_value_t = false, action = ArgAction::Set)]
    pub cluster_autoscaler_on_completion: bool,
    /// Another autoscaler's or upgrader's annotation to set on busy pods (repeated):
    /// `KEY=VALUE`, e.g. `autoscaling.cast.ai/removal-disabled=true`. Written while the pod is
    /// busy and protected; the pod's own value waits in `busyguard.io/idle-PREFIX_NAME` and comes
    /// back when it is idle. In the environment, one per line.
    #[arg(long = "busy-annotation", env = "BUSYGUARD_BUSY_ANNOTATION", value_delimiter = '\n',
          value_name = "KEY=VALUE", value_parser = |text: &str| Mark::parse(On::Annotation, text))]
    pub busy_annotations: Vec<Mark>,
    /// The same for a label (repeated): `KEY=VALUE`, e.g. `spotinst.io/restrict-scale-down=true`;
    /// the pod's own value waits in `busyguard.io/idle-label-PREFIX_NAME`.
    #[arg(long = "busy-label", env = "BUSYGUARD_BUSY_LABEL", value_delimiter = '\n',
          value_name = "KEY=VALUE", value_parser = |text: &str| Mark::parse(On::Label, text))]
    pub busy_labels: Vec<Mark>,
    /// Busy from the owner's status (repeated, one per owner kind): `GROUP/VERSION/KIND=EXPR`,
    /// a CEL expression over the owner (`object`) that holds while its pods are busy. busyguard
    /// watches those owners and flips their pods' busy label itself; their pods are opted in at
    /// creation by a webhook of the kind's component (manifests/actions-runner-controller,
    /// manifests/agones). A rule that does not compile stops the start; a kind the API server
    /// does not serve (yet, or any more) is reported and followed once it is, while everything
    /// else is served. In the environment, one rule per line.
    #[arg(
        long = "busy-when-owner",
        env = "BUSYGUARD_BUSY_WHEN_OWNER",
        value_delimiter = '\n',
        value_name = "GROUP/VERSION/KIND=EXPR"
    )]
    pub busy_when_owner: Vec<OwnerRule>,
    /// Busy with another pod: a pod carrying this label, whose value names a pod of its
    /// namespace, is busy while that pod is (Actions Runner Controller's `runner-pod`, on the
    /// workflow pods of `containerMode: kubernetes`); it is opted in at creation by the
    /// component's webhook, and that pod's own token may delete it.
    #[arg(long = "busy-with-pod", env = "BUSYGUARD_BUSY_WITH_POD", value_name = "LABEL")]
    pub busy_with_pod: Option<String>,
    #[command(flatten)]
    pub holds: HoldArgs,
}

#[derive(Debug, Args)]
#[command(next_help_heading = "Cluster")]
pub struct ClusterArgs {
    /// Kubeconfig to reach the API server with. Without it: the in-cluster service account,
    /// else `KUBECONFIG` or `~/.kube/config`, else no cluster (evictions are answered 503).
    #[arg(long, env = "BUSYGUARD_KUBECONFIG", conflicts_with = "no_cluster")]
    pub kubeconfig: Option<PathBuf>,
    /// Run without a cluster even if one is configured: no watch, no side effects.
    #[arg(long, env = "BUSYGUARD_NO_CLUSTER")]
    pub no_cluster: bool,
    /// Namespaces whose opted-in pods are watched (comma-separated, or repeated);
    /// all namespaces without it. Evictions and scale-downs elsewhere find no pods.
    #[arg(long = "namespace", env = "BUSYGUARD_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// Guard only the namespaces labelled `busyguard.io/enabled=true`, as the webhooks of the
    /// `manifests/opt-in` component select them; off: every namespace not labelled `false`.
    #[arg(long, env = "BUSYGUARD_OPT_IN", default_value_t = false, action = ArgAction::Set)]
    pub opt_in: bool,
    /// How long the watch of opted-in pods may go without a sign of life before the view counts
    /// as stale: evictions and node deletes then get 503, scale-downs go unprepared, and /status
    /// and busyguard_view_unavailable say so. /readyz stays up: deletes are judged without the view.
    #[arg(long, env = "BUSYGUARD_VIEW_STALE_AFTER", default_value = "60s", value_parser = std_duration)]
    pub view_stale_after: Duration,
    /// How often every watched pod is looked at again: a protection that ran out gives the pod
    /// its own annotations back and lets a deferred delete go, and a patch that failed is
    /// tried again.
    #[arg(long, env = "BUSYGUARD_SWEEP_INTERVAL", default_value = "30s", value_parser = std_duration)]
    pub sweep_interval: Duration,
    /// Keep a PodDisruptionBudget of busy pods (`busyguard-busy`, no disruption allowed) in each
    /// namespace with opted-in pods, so the API server refuses their evictions even while
    /// busyguard is down; skipped where a PDB of yours selects the same pods.
    #[arg(long, env = "BUSYGUARD_BUSY_PDB", default_value_t = false, action = ArgAction::Set)]
    pub busy_pdb: bool,
    /// Hold Kueue's preemptions in the namespaces labelled `busyguard.io/hold-preemption=true`:
    /// the Job controller's delete of a busy pod of a Job whose Workload Kueue preempted is
    /// refused while the pod is busy (within max-busy), as any cluster disruption, and Kueue's
    /// preemptor waits for it. Watches Kueue's Workloads (`get`, `list`, `watch` on
    /// `workloads.kueue.x-k8s.io`). Off: a preempted Job's pods go at once, as the Job's own end.
    #[arg(long, env = "BUSYGUARD_HOLD_KUEUE_PREEMPTION", default_value_t = false, action = ArgAction::Set)]
    pub hold_kueue_preemption: bool,
    /// At most one DisruptionBlocked Event per pod in each such interval of the clock (with 60s,
    /// each minute), whichever replica refuses.
    #[arg(long, env = "BUSYGUARD_EVENT_INTERVAL", default_value = "60s", value_parser = std_duration)]
    pub event_interval: Duration,
    /// busyguard's own namespace (the downward API's `metadata.namespace`), where it keeps the
    /// Leases of workload budgets; its RBAC grants Leases there only.
    #[arg(long, env = "POD_NAMESPACE", default_value = "busyguard", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub own_namespace: String,
}

impl ServeArgs {
    pub fn into_config(self) -> ServeConfig {
        let ports = self.ports;
        ServeConfig {
            listen: ports.listen,
            admin_listen: ports.admin_listen,
            cert: CertFiles { cert: ports.tls_cert, key: ports.tls_key },
            client_ca: ports.client_ca,
            cert_reload_interval: ports.cert_reload_interval,
            limits: (&self.limits).into(),
            shutdown_delay: self.limits.shutdown_delay,
            shutdown_timeout: self.limits.shutdown_timeout,
            policy: self.policy.into(),
            audit_log: self.audit_log,
            cluster: self.cluster.into(),
        }
    }
}

impl From<PolicyArgs> for PolicyConfig {
    fn from(args: PolicyArgs) -> Self {
        let listed = |names: Vec<String>| names.into_iter().filter(|n| !n.is_empty()).collect();
        PolicyConfig {
            mode: args.mode,
            max_busy: (&args.max_busy).into(),
            exemptions: Exemptions {
                users: listed(args.exempt_users),
                groups: listed(args.exempt_groups),
                karpenter: listed(args.karpenter_users),
                owner_controllers: listed(args.owner_controller_users),
            },
            mutation: MutationSettings {
                karpenter: args.karpenter_annotation,
                karpenter_bounded: args.karpenter_bounded,
                cluster_autoscaler: args.cluster_autoscaler_annotation,
                cluster_autoscaler_on_completion: args.cluster_autoscaler_on_completion,
                marks: marks(args.busy_annotations, args.busy_labels),
            },
            holds: (&args.holds).into(),
            owner_rules: args.busy_when_owner,
            busy_with_pod: args.busy_with_pod,
        }
    }
}

/// The marks of `--busy-annotation` and `--busy-label`, each key once (the last said wins),
/// kept for the life of the process.
pub fn marks(annotations: Vec<Mark>, labels: Vec<Mark>) -> &'static [Mark] {
    let mut marks: Vec<Mark> = Vec::new();
    for mark in annotations.into_iter().chain(labels) {
        marks.retain(|m| (m.on, m.key) != (mark.on, mark.key));
        marks.push(mark);
    }
    Box::leak(marks.into_boxed_slice())
}

impl From<ClusterArgs> for ClusterSettings {
    fn from(args: ClusterArgs) -> Self {
        ClusterSettings {
            source: match (args.no_cluster, args.kubeconfig) {
                (true, _) => ClusterSource::None,
                (false, Some(path)) => ClusterSource::Kubeconfig(path),
                (false, None) => ClusterSource::Infer,
            },
            namespaces: args.namespaces.into_iter().filter(|n| !n.is_empty()).collect(),
            enrolment: if args.opt_in { Enrolment::OptIn } else { Enrolment::OptOut },
            stale_after: args.view_stale_after,
            sweep_interval: args.sweep_interval,
            busy_pdb: args.busy_pdb,
            hold_kueue_preemption: args.hold_kueue_preemption,
            own_namespace: args.own_namespace,
            outbox: OutboxSettings { event_interval: args.event_interval, ..OutboxSettings::default() },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn serve(args: &[&str]) -> ServeConfig {
        let cli = Cli::try_parse_from(["busyguard", "serve"].iter().chain(args)).unwrap();
        let Command::Serve(serve) = cli.command else { panic!() };
        serve.into_config()
    }

    #[test]
    fn defaults_enforce_with_a_day_of_max_busy_and_the_pod_gc_exempt() {
        let config = serve(&[]);
        assert_eq!(config.policy.mode, Mode::Enforce);
        assert_eq!(config.policy.max_busy, MaxBusy::new(SignedDuration::from_hours(24)));
        assert_eq!(config.policy.exemptions.users, vec![POD_GC_USER.to_string()]);
        assert!(config.policy.mutation.karpenter && config.policy.mutation.cluster_autoscaler);
        assert_eq!(config.listen, "0.0.0.0:8443".parse().unwrap());
        assert_eq!(config.limits.header_read_timeout, Duration::from_secs(10));
        assert_eq!(config.limits.keep_alive_timeout, Duration::from_secs(120), "past the API server's 90 s");
        assert!(matches!(config.cluster.source, ClusterSource::Infer));
        assert!(config.cluster.namespaces.is_empty(), "all namespaces");
        assert_eq!(config.cluster.stale_after, Duration::from_secs(60));
    }

    #[test]
    fn cluster_flags_pick_the_source_and_namespaces() {
        let config = serve(&["--kubeconfig", "/tmp/kc", "--namespace", "a,b"]);
        assert!(matches!(config.cluster.source, ClusterSource::Kubeconfig(ref p) if p.to_str() == Some("/tmp/kc")));
        assert_eq!(config.cluster.namespaces, vec!["a", "b"]);
        assert!(matches!(serve(&["--no-cluster"]).cluster.source, ClusterSource::None));
    }

    #[test]
    fn flags_set_mode_durations_exemptions_and_annotations() {
        let config = serve(&[
            "--mode",
            "audit",
            "--max-busy",
            "1h30m",
            "--exempt-user",
            "a,b",
            "--exempt-group",
            "ops",
            "--karpenter-annotation=false",
            "--body-read-timeout",
            "500ms",
        ]);
        assert_eq!(config.policy.mode, Mode::Audit);
        assert_eq!(serve(&["--mode", "dry-run"]).policy.mode, Mode::Audit, "the former name still works");
        assert_eq!(config.policy.max_busy.default, SignedDuration::from_mins(90));
        assert_eq!(config.policy.exemptions.users, vec!["a", "b"]);
        assert_eq!(config.policy.exemptions.groups, vec!["ops"]);
        assert!(!config.policy.mutation.karpenter);
        assert_eq!(config.limits.body_read_timeout, Duration::from_millis(500));
    }

    #[test]
    fn an_empty_exempt_user_list_exempts_nobody() {
        assert!(serve(&["--exempt-user", ""]).policy.exemptions.users.is_empty());
    }

    #[test]
    fn nonsense_durations_are_refused() {
        for bad in ["--max-busy=forever", "--max-busy=0s", "--header-read-timeout=-1s"] {
            assert!(Cli::try_parse_from(["busyguard", "serve", bad]).is_err(), "{bad}");
        }
    }
}
