//! Busy from the owner's status: for pods whose controlling owner is a custom resource that
//! knows when its pod works (Actions Runner Controller's `EphemeralRunner` while it has a job,
//! Agones' `GameServer` while Allocated), a rule per owner kind (`--busy-when-owner`) says when,
//! as a CEL expression over the owner, as ValidatingAdmissionPolicy and CRD validation rules
//! read objects. busyguard then flips the pod's busy label itself, and every path that guards a
//! busy pod guards it.

mod expression;
mod rule;
mod state;

pub use super::pod::{group_of, version_of};
pub use expression::{POD_FIELDS, pruned_fields};
pub use rule::{OwnerRule, PerPod, Terms, Undecided, Via, rule_for, rule_of, same_kind_twice};
pub use state::{OwnerState, flip_patch, follow};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::keys::{BUSY_LABEL, MAX_BUSY};
    use crate::policy::pod::{OwnerKey, PodRef};
    use jiff::Timestamp;
    use serde_json::json;

    fn rule(s: &str) -> OwnerRule {
        s.parse().unwrap()
    }

    /// The rules the components ship (manifests/actions-runner-controller, manifests/agones).
    fn shipped(component: &str) -> OwnerRule {
        let path = format!("{}/manifests/{component}/kustomization.yaml", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(path).unwrap();
        let arg = text.lines().find_map(|line| line.trim().strip_prefix("value: \"--busy-when-owner=")).unwrap();
        rule(arg.strip_suffix('"').unwrap())
    }

    #[test]
    fn a_runner_is_busy_while_its_status_has_a_job_on_every_release_of_actions_runner_controller() {
        let runner = shipped("actions-runner-controller");
        assert_eq!(runner.busy(&json!({"status": {"phase": "Running"}})), Ok(false));
        assert_eq!(runner.busy(&json!({"metadata": {"name": "r"}})), Ok(false));
        // gha-runner-scale-set 0.9 to 0.12: the listener writes the job request's id only.
        assert_eq!(runner.busy(&json!({"status": {"jobRequestId": 2794_u64}})), Ok(true));
        assert_eq!(runner.busy(&json!({"status": {"jobRequestId": 0}})), Ok(false));
        // 0.13 on: the job's id beside it.
        assert_eq!(runner.busy(&json!({"status": {"jobRequestId": 2794, "jobId": "c0ffee"}})), Ok(true));
        assert_eq!(runner.busy(&json!({"status": {"jobId": "c0ffee"}})), Ok(true));
        assert_eq!(runner.busy(&json!({"status": {"jobId": ""}})), Ok(false));
        // Being deleted while its job runs: Actions Runner Controller's finalizer waits for it.
        let deleting =
            json!({"metadata": {"deletionTimestamp": "2026-11-27T10:00:00Z"}, "status": {"jobRequestId": 7}});
        assert_eq!(runner.busy(&deleting), Ok(true));
    }

    #[test]
    fn a_game_server_is_busy_while_allocated_or_reserved_and_not_being_deleted() {
        let game_server = shipped("agones");
        assert_eq!(game_server.busy(&json!({"metadata": {}, "status": {"state": "Allocated"}})), Ok(true));
        // Held for a match until its reservedUntil (SDK.Reserve), when Agones moves it back to Ready.
        let reserved =
            json!({"metadata": {}, "status": {"state": "Reserved", "reservedUntil": "2026-11-27T10:00:30Z"}});
        assert_eq!(game_server.busy(&reserved), Ok(true));
        assert_eq!(game_server.busy(&json!({"metadata": {}, "status": {"state": "Ready"}})), Ok(false));
        assert_eq!(game_server.busy(&json!({"metadata": {}, "status": {"state": "Shutdown"}})), Ok(false));
        let deleting =
            json!({"metadata": {"deletionTimestamp": "2026-11-27T10:00:00Z"}, "status": {"state": "Allocated"}});
        assert_eq!(
            game_server.busy(&deleting),
            Ok(false),
            "deleting a GameServer ends its match (Agones deletes the pod)"
        );
    }

    /// A Sandbox as agent-sandbox v0.5.6 writes it, controlled by its `owner` (a SandboxClaim or
    /// a SandboxWarmPool), with `spec` and `status`.
    fn sandbox(owner: &str, spec: serde_json::Value, status: serde_json::Value) -> serde_json::Value {
        json!({"metadata": {"name": "python-warm-a", "ownerReferences": [{"apiVersion":
            "extensions.agents.x-k8s.io/v1beta1", "kind": owner, "name": "session-7", "uid": "c", "controller": true}]},
            "spec": spec, "status": status})
    }

    #[test]
    fn a_sandbox_is_busy_while_a_claim_holds_it_and_idle_in_its_warm_pool_suspended_or_expired() {
        let sandboxes = shipped("agent-sandbox");
        assert_eq!((sandboxes.group(), &*sandboxes.kind), ("agents.x-k8s.io", "Sandbox"));
        assert_eq!(sandboxes.terms.max_busy.as_deref(), Some("8h"), "a session is bounded");
        let template = json!({"podTemplate": {"spec": {}}});
        assert_eq!(sandboxes.busy(&sandbox("SandboxClaim", template.clone(), json!({}))), Ok(true));
        assert_eq!(sandboxes.busy(&sandbox("SandboxWarmPool", template.clone(), json!({}))), Ok(false), "a spare");
        assert_eq!(sandboxes.busy(&json!({"metadata": {"name": "mine"}, "spec": template})), Ok(false), "no claim");
        let suspended = json!({"podTemplate": {"spec": {}}, "operatingMode": "Suspended"});
        assert_eq!(sandboxes.busy(&sandbox("SandboxClaim", suspended, json!({}))), Ok(false));
        let running = json!({"podTemplate": {"spec": {}}, "operatingMode": "Running"});
        let ready = json!({"conditions": [{"type": "Ready", "status": "True", "reason": "DependenciesReady"}]});
        assert_eq!(sandboxes.busy(&sandbox("SandboxClaim", running.clone(), ready)), Ok(true));
        // Its shutdownTime reached: the controller marks it expired before it deletes the pod.
        let expired = json!({"conditions": [{"type": "Ready", "status": "False", "reason": "SandboxExpired"}]});
        assert_eq!(sandboxes.busy(&sandbox("SandboxClaim", running.clone(), expired)), Ok(false));
        let mut deleting = sandbox("SandboxClaim", running, json!({}));
        deleting["metadata"]["deletionTimestamp"] = json!("2026-12-02T10:00:00Z");
        assert_eq!(sandboxes.busy(&deleting), Ok(false), "the claim's end: the garbage collector deletes it");
    }

    /// The rule a page of docs/ gives as a recipe: the last `--busy-when-owner=` argument of the
    /// section headed `section` (after the one a patch tests for).
    fn recipe(page: &str, section: &str) -> OwnerRule {
        let path = format!("{}/docs/{page}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(path).unwrap();
        let mut lines = text.lines().skip_while(|line| !line.starts_with(section)).skip(1);
        let in_section = lines.by_ref().take_while(|line| !line.starts_with("## "));
        let args = in_section.filter_map(|line| line.trim().strip_prefix("value: \"--busy-when-owner="));
        rule(args.last().unwrap().strip_suffix('"').unwrap())
    }

    fn pod(name: &str) -> PodRef {
        PodRef { namespace: "spark".into(), name: name.into(), uid: format!("u-{name}") }
    }

    #[test]
    fn a_spark_executor_is_busy_while_its_applications_status_says_it_runs() {
        let executors = std::sync::Arc::new(recipe("spark.md", "# "));
        let via = executors.via.as_ref().unwrap();
        assert_eq!((via.group(), via.version(), &*via.kind), ("", "v1", "Pod"), "owned by the driver pod");
        assert_eq!((executors.group(), &*executors.kind), ("sparkoperator.k8s.io", "SparkApplication"));
        assert!(executors.reads_pod);
        assert!(executors.covers("v1", "Pod") && !executors.covers("sparkoperator.k8s.io/v1beta2", "SparkApplication"));
        assert_eq!(executors.kind_path(), "v1/Pod>sparkoperator.k8s.io/v1beta2/SparkApplication");
        // As the operator writes it: the executor pods' names and their phases.
        let app = json!({"metadata": {"name": "etl"}, "status": {"applicationState": {"state": "RUNNING"},
            "executorState": {"etl-exec-1": "RUNNING", "etl-exec-2": "COMPLETED", "etl-exec-3": "PENDING"}}});
        let per_pod = executors.per_pod(&app).unwrap();
        let state = OwnerState::judged_per_pod(per_pod);
        let labels = [(Box::from("spark-role"), Box::from("executor"))];
        let busy = |name: &str| state.pod_busy(&pod(name), &labels, None);
        assert_eq!(busy("etl-exec-1"), Ok(true));
        assert_eq!(busy("etl-exec-2"), Ok(false), "its work is done");
        assert_eq!(busy("etl-exec-3"), Ok(false), "not started");
        assert_eq!(busy("etl-exec-9"), Ok(false), "not (yet) in the status: beyond the operator's tracked executors");
        assert!(!state.busy(), "never busy as a whole: each pod is judged");
        let submitted = executors.per_pod(&json!({"metadata": {"name": "etl"}, "status": {}})).unwrap();
        assert_eq!(submitted.busy(&pod("etl-exec-1"), &labels), Ok(false), "no executor state yet");
    }

    #[test]
    fn a_ray_worker_is_busy_while_the_rayjob_over_its_cluster_runs_its_job() {
        let workers = recipe("kuberay.md", "# ");
        let via = workers.via.as_ref().unwrap();
        assert_eq!((via.group(), &*via.kind), ("ray.io", "RayCluster"));
        assert_eq!((workers.group(), &*workers.kind), ("ray.io", "RayJob"));
        assert!(!workers.reads_pod, "every worker of the job's cluster alike");
        let job = |status: serde_json::Value| json!({"metadata": {"name": "train"}, "status": status});
        assert_eq!(workers.busy(&job(json!({"jobStatus": "RUNNING"}))), Ok(true));
        for done in ["PENDING", "SUCCEEDED", "FAILED", "STOPPED"] {
            assert_eq!(workers.busy(&job(json!({"jobStatus": done}))), Ok(false), "{done}");
        }
        assert_eq!(workers.busy(&job(json!({}))), Ok(false), "not submitted yet");
        let deleting =
            json!({"metadata": {"deletionTimestamp": "2026-11-27T10:00:00Z"}, "status": {"jobStatus": "RUNNING"}});
        assert_eq!(workers.busy(&deleting), Ok(false), "a RayJob deleted ends its job");
    }

    #[test]
    fn a_game_server_with_sessions_on_its_counter_is_busy_though_ready() {
        let sessions = recipe("agones.md", "## Sessions on a counter");
        let with = |count: i64, state: &str| json!({"metadata": {}, "status": {"state": state, "counters": {"sessions": {"count": count, "capacity": 10}}}});
        assert_eq!(sessions.busy(&with(3, "Ready")), Ok(true), "sessions on a server Agones may still allocate");
        assert_eq!(sessions.busy(&with(0, "Ready")), Ok(false));
        assert_eq!(sessions.busy(&with(0, "Allocated")), Ok(true), "allocated, as the shipped rule says");
        assert_eq!(sessions.busy(&json!({"metadata": {}, "status": {"state": "Ready"}})), Ok(false), "no counters");
        let deleting = json!({"metadata": {"deletionTimestamp": "2026-11-27T10:00:00Z"},
            "status": {"state": "Ready", "counters": {"sessions": {"count": 3}}}});
        assert_eq!(sessions.busy(&deleting), Ok(false));
    }

    #[test]
    fn the_recipes_read_what_their_projects_crds_keep() {
        let peers = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/peers");
        for (page, crd) in [
            (
                "spark.md",
                "spark-operator-v2.5.2/charts/spark-operator-chart/crds/sparkoperator.k8s.io_sparkapplications.yaml",
            ),
            ("kuberay.md", "kuberay-v1.7.0/helm-chart/kuberay-operator/crds/ray.io_rayjobs.yaml"),
        ] {
            let Ok(text) = std::fs::read_to_string(format!("{peers}/{crd}")) else {
                println!("skipped: needs ../shared/peers (the Spark operator's and KubeRay's CRDs), not on this clone");
                return;
            };
            let rule = recipe(page, "# ");
            let crd: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
            let version = crd["spec"]["versions"].as_array().unwrap().iter().find(|v| v["name"] == rule.version());
            let schema = &version.unwrap()["schema"]["openAPIV3Schema"];
            assert_eq!(pruned_fields(&rule.expression, schema), Vec::<String>::new(), "{page}");
        }
    }

    #[test]
    fn a_rule_through_a_kind_between_is_its_own_and_reads_only_what_is_kept_of_the_pod() {
        let driver =
            rule("sparkoperator.k8s.io/v1beta2/SparkApplication=object.status.applicationState.state == 'RUNNING'");
        let executors = recipe("spark.md", "# ");
        assert_eq!(same_kind_twice(&[driver.clone(), executors.clone()]), None, "the driver's and the executors'");
        assert_ne!(
            driver.state_key("etl"),
            executors.state_key("etl"),
            "each keeps its own verdict on the application"
        );
        let said = same_kind_twice(&[executors.clone(), recipe("spark.md", "# ")]).unwrap();
        assert!(said.contains("two rules for /Pod>sparkoperator.k8s.io/SparkApplication"), "{said}");
        assert!(
            rule_for(std::slice::from_ref(&executors), "sparkoperator.k8s.io", "SparkApplication").is_none(),
            "not its pods"
        );
        assert!(rule_for(std::slice::from_ref(&driver), "sparkoperator.k8s.io", "SparkApplication").is_some());
        assert!(
            rule_of(&[driver, executors.clone()], OwnerKey::of("v1", "Pod", "etl-driver"))
                .is_some_and(|r| r.via.is_some())
        );
        for unkept in ["pod.spec.nodeName == 'n'", "pod.status.phase == 'Running'", "pod.metadata.annotations.a == 'b'"]
        {
            let error = format!("v1/Pod>example.com/v1/Task={unkept}").parse::<OwnerRule>().unwrap_err();
            assert!(error.contains("which busyguard does not keep of a pod"), "{error}");
        }
        let labels = "v1/Pod>example.com/v1/Task=pod.metadata.labels['role'] == 'executor' && object.spec.run";
        assert!(labels.parse::<OwnerRule>().is_ok_and(|r| r.reads_pod));
        assert!("example.com/v1/Task=object.spec.pod.x".parse::<OwnerRule>().is_ok(), "an owner's field named pod");
        for bad in ["v1/Pod>=true", ">example.com/v1/Task=true", "v1/Pod>example.com/v1/Task>x/v1/Y=true"] {
            assert!(bad.parse::<OwnerRule>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_rule_reading_a_field_its_owners_schema_prunes_is_told_which() {
        let schema = json!({"type": "object", "properties": {
            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "status": {"type": "object", "properties": {"jobRequestId": {"type": "integer"}}}}});
        let runner = shipped("actions-runner-controller");
        assert_eq!(pruned_fields(&runner.expression, &schema), ["status.jobId"], "0.12's schema has no jobId");
        assert!(pruned_fields("has(object.spec.anything.at.all)", &schema).is_empty(), "kept as it comes");
        assert!(pruned_fields("has(object.metadata.deletionTimestamp)", &schema).is_empty(), "every object's");
    }

    #[test]
    fn the_shipped_runner_rule_reads_what_each_release_of_actions_runner_controller_keeps() {
        let peers = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/peers");
        let runner = shipped("actions-runner-controller");
        for (release, pruned) in [("0.12.1", vec!["status.jobId"]), ("0.14.2", vec![])] {
            let path = format!(
                "{peers}/actions-runner-controller-{release}/charts/gha-runner-scale-set-controller/crds/\
                 actions.github.com_ephemeralrunners.yaml"
            );
            let Ok(text) = std::fs::read_to_string(&path) else {
                println!("skipped: needs ../shared/peers (Actions Runner Controller's CRDs), not on this clone");
                return;
            };
            let crd: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
            let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
            assert_eq!(pruned_fields(&runner.expression, schema), pruned, "{release}");
        }
    }

    #[test]
    fn a_rule_names_its_kind_by_group_version_and_kind() {
        let runner = shipped("actions-runner-controller");
        assert_eq!(
            (runner.group(), runner.version(), &*runner.kind),
            ("actions.github.com", "v1alpha1", "EphemeralRunner")
        );
        assert!(runner.covers("actions.github.com/v1alpha1", "EphemeralRunner"));
        assert!(runner.covers("actions.github.com/v1beta1", "EphemeralRunner"), "another version of the group");
        assert!(!runner.covers("example.com/v1alpha1", "EphemeralRunner"), "another group's kind of that name");
        assert!(!runner.covers("actions.github.com/v1alpha1", "EphemeralRunnerSet"));
        let core = rule("v1/ConfigMap=true");
        assert_eq!((core.group(), core.version()), ("", "v1"));
        assert!(core.covers("v1", "ConfigMap"));
        assert_eq!(runner.kind_path(), "actions.github.com/v1alpha1/EphemeralRunner");
        assert_eq!(runner.owner_key("r"), "actions.github.com/EphemeralRunner/r");
        assert_eq!(core.owner_key("c"), "/ConfigMap/c");
    }

    #[test]
    fn a_rule_that_does_not_parse_or_compile_is_refused_with_the_form_expected() {
        for bad in ["EphemeralRunner=true", "actions.github.com/v1alpha1/EphemeralRunner", "a/b/c/D=true", "/v1/X=true"]
        {
            let error = bad.parse::<OwnerRule>().unwrap_err();
            assert!(error.contains("expected GROUP/VERSION/KIND=EXPRESSION"), "{bad}: {error}");
        }
        let error = "agones.dev/v1/GameServer=object.status.state ==".parse::<OwnerRule>().unwrap_err();
        assert!(error.starts_with("agones.dev/v1/GameServer: the expression"), "{error}");
        assert!(error.contains("does not compile"), "{error}");
    }

    #[test]
    fn a_rule_reading_an_unquoted_word_or_the_same_kind_twice_is_refused_at_start() {
        let error = "agones.dev/v1/GameServer=object.status.state == Allocated".parse::<OwnerRule>().unwrap_err();
        assert!(
            error.contains("reads Allocated, which is not a variable (only object and pod are): a string is quoted"),
            "{error}"
        );
        let macros = "example.com/v1/Task=object.status.workers.exists(w, w.busy) && object.spec.all(k, k != '')";
        assert!(macros.parse::<OwnerRule>().is_ok(), "a macro's own variables are bound");
        let error = "example.com/v1/Task=object.status.workers.exists(w, x.busy)".parse::<OwnerRule>().unwrap_err();
        assert!(error.contains("reads x"), "{error}");
        let twice = [shipped("agones"), rule("agones.dev/v1/GameServer=true"), shipped("actions-runner-controller")];
        let said = same_kind_twice(&twice).unwrap();
        assert!(said.starts_with("--busy-when-owner: two rules for agones.dev/GameServer: keep one"), "{said}");
        assert_eq!(same_kind_twice(&[shipped("agones"), shipped("actions-runner-controller")]), None);
    }

    #[test]
    fn a_rule_that_is_not_a_boolean_on_an_owner_says_so() {
        let error = rule("agones.dev/v1/GameServer=object.status.state").busy(&json!({"status": {"state": "Ready"}}));
        assert!(error.unwrap_err().0.contains("not a boolean"));
        let missing = rule("agones.dev/v1/GameServer=object.status.state == 'Allocated'").busy(&json!({}));
        assert!(missing.is_err(), "a field the owner lacks is an error, as in Kubernetes' CEL");
    }

    #[test]
    fn under_a_rule_whose_new_pods_stay_idle_a_pod_created_after_its_owners_task_began_is_not_the_one_doing_it() {
        let runner = shipped("actions-runner-controller");
        assert!(runner.terms.new_pods_idle, "the shipped runner rule says so");
        let at = |s: &str| s.parse::<Timestamp>().unwrap();
        let idle = OwnerState::seen(&runner, None, false, at("2026-11-27T10:00:00Z"));
        let busy = OwnerState::seen(&runner, Some(&idle), true, at("2026-11-27T10:05:00Z"));
        assert_eq!(busy.busy_since, Some(at("2026-11-27T10:05:00Z")), "turned busy while watched");
        assert!(busy.busy() && !idle.busy());
        let later = OwnerState::seen(&runner, Some(&busy), true, at("2026-11-27T10:09:00Z"));
        assert_eq!(later, busy, "still the same task");
        assert!(busy.busy_for(Some(at("2026-11-27T09:59:00Z"))), "the runner's pod that took the job");
        assert!(busy.busy_for(Some(at("2026-11-27T10:05:03Z"))), "within the clocks' margin");
        assert!(!busy.busy_for(Some(at("2026-11-27T10:07:00Z"))), "re-created after its job was taken");
        // First seen busy (after busyguard's restart): its last write is the latest its task began.
        let first_seen_busy = OwnerState::seen(&runner, None, true, at("2026-11-27T10:05:00Z"));
        assert!(first_seen_busy.busy_for(Some(at("2026-11-27T10:04:00Z"))), "there when it was last written");
        assert!(!first_seen_busy.busy_for(Some(at("2026-11-27T10:07:00Z"))), "created after it");
        assert!(!OwnerState::seen(&runner, Some(&busy), false, at("2026-11-27T10:10:00Z")).busy_for(None));
    }

    #[test]
    fn a_pod_created_while_its_owners_task_runs_joins_it_and_a_restart_gives_the_same_answer() {
        let workers = recipe("kuberay.md", "# ");
        assert!(!workers.terms.new_pods_idle, "every worker of the job's cluster works for the job");
        let at = |s: &str| s.parse::<Timestamp>().unwrap();
        let running = OwnerState::seen(&workers, None, true, at("2026-11-27T10:05:00Z"));
        let added = Some(at("2026-11-27T10:40:00Z"));
        assert!(running.busy_for(added), "a worker the autoscaler added, or a replaced one");
        let after_restart = OwnerState::seen(&workers, None, true, at("2026-11-27T10:50:00Z"));
        assert_eq!(after_restart.busy_for(added), running.busy_for(added), "whatever the job's last write");
        let ended = OwnerState::seen(&workers, Some(&running), false, at("2026-11-27T11:00:00Z"));
        assert!(!ended.busy_for(added), "the job's end frees it");
    }

    #[test]
    fn a_rules_terms_follow_its_kinds_and_a_bad_one_is_refused() {
        let both: OwnerRule =
            "example.com/v1/Task;new-pods-idle;max-busy=6h15m=object.status.phase == 'Running'".parse().unwrap();
        assert_eq!((both.group(), &*both.kind), ("example.com", "Task"));
        assert_eq!(both.terms, Terms { new_pods_idle: true, max_busy: Some("6h15m".into()) });
        assert_eq!(both.expression, "object.status.phase == 'Running'");
        assert_eq!(both.to_string().parse::<OwnerRule>().unwrap().terms, both.terms, "written as it was read");
        let plain: OwnerRule = "example.com/v1/Task=object.spec.x == 'a=b;c'".parse().unwrap();
        assert_eq!((plain.terms.clone(), &*plain.expression), (Terms::default(), "object.spec.x == 'a=b;c'"));
        for (bad, said) in [
            ("example.com/v1/Task;max-busy=forever=true", "max-busy: \"forever\" is not a duration"),
            ("example.com/v1/Task;max-busy;new-pods-idle=true", "max-busy takes a duration"),
            ("example.com/v1/Task;sticky=true", "\"sticky\" is not a rule's term"),
            ("example.com/v1/Task;new-pods-idle", "expected GROUP/VERSION/KIND=EXPRESSION"),
        ] {
            let error = bad.parse::<OwnerRule>().unwrap_err();
            assert!(error.contains(said), "{bad}: {error}");
        }
    }

    #[test]
    fn a_pod_turning_busy_under_a_rule_with_a_max_busy_is_bounded_by_it() {
        assert_eq!(shipped("actions-runner-controller").terms.max_busy.as_deref(), Some("6h15m"));
        let patch = flip_patch("true", Some("6h15m"));
        assert_eq!(patch, json!({"metadata": {"labels": {BUSY_LABEL: "true"}, "annotations": {MAX_BUSY: "6h15m"}}}));
        assert_eq!(flip_patch("false", None), json!({"metadata": {"labels": {BUSY_LABEL: "false"}}}));
    }

    #[test]
    fn an_owners_pod_follows_it_unless_its_end_is_under_way() {
        assert_eq!(follow(Some("false"), true, false), Some("true"));
        assert_eq!(follow(Some("true"), false, false), Some("false"));
        assert_eq!(follow(Some("true"), true, false), None);
        assert_eq!(follow(None, true, false), None, "not opted in, or left alone: never written");
        assert_eq!(follow(Some("false"), true, true), None, "a terminating or finished pod is left as it is");
    }
}
