//! The overlays and components: the network policy, the namespaced example, the fence, opt-in,
//! and the owner components.

use super::*;

#[test]
fn the_network_policy_lets_only_the_api_server_send_reviews_and_scrapers_reach_the_admin_port() {
    let objects = render(&manifests("examples/with-network-policy"));
    let policy = find(&objects, "NetworkPolicy", "busyguard");
    let deployment = find(&objects, "Deployment", "busyguard");
    assert!(selects(&selector(&policy["spec"]["podSelector"]), &deployment["spec"]["template"]["metadata"]["labels"]));
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));
    let rules = policy["spec"]["ingress"].as_array().unwrap();
    assert_eq!(rules.len(), 2);
    let port = |rule: &Value| rule["ports"][0]["port"].as_u64().unwrap();
    let ports = &deployment["spec"]["template"]["spec"]["containers"][0]["ports"];
    let named =
        |name: &str| ports.as_array().unwrap().iter().find(|p| p["name"] == name).unwrap()["containerPort"].clone();
    assert_eq!(json!(port(&rules[0])), named("https"));
    assert_eq!(rules[0]["from"], json!([{"ipBlock": {"cidr": "10.0.0.0/24"}}]), "the overlay's API server address");
    assert_eq!(json!(port(&rules[1])), named("admin"));
    assert!(rules.iter().all(|r| r["from"].as_array().is_some_and(|f| !f.is_empty())), "no rule open to all");
    // Without the overlay's address, the component lets no real API server in.
    let placeholder = std::fs::read_to_string(manifests("network-policy/networkpolicy.yaml")).unwrap();
    assert!(placeholder.contains("cidr: 192.0.2.0/24"));
}

#[test]
fn the_namespaced_example_grants_the_same_rules_in_its_namespace_only_and_watches_only_there() {
    let base = render(&manifests(""));
    let objects = render(&manifests("examples/namespaced"));
    let base_rules = find(&base, "ClusterRole", "busyguard")["rules"].as_array().unwrap().clone();
    let (cluster_wide, namespaced): (Vec<Value>, Vec<Value>) =
        base_rules.into_iter().partition(|rule| rule["resources"] == json!(["namespaces", "nodes"]));
    let cluster_roles: Vec<&Value> = objects.iter().filter(|o| o["kind"] == "ClusterRole").collect();
    assert_eq!(cluster_roles.len(), 1, "one cluster-wide role");
    assert_eq!(
        cluster_roles[0]["rules"],
        json!(cluster_wide),
        "cluster-wide: which namespaces opted out and which nodes are going, nothing more"
    );
    let role = find(&objects, "Role", "busyguard");
    assert_eq!(role["rules"], json!(namespaced), "the same calls, in one namespace");
    let binding = find(&objects, "RoleBinding", "busyguard");
    assert_eq!(binding["metadata"]["namespace"], role["metadata"]["namespace"]);
    assert_eq!(binding["subjects"][0]["name"], find(&objects, "ServiceAccount", "busyguard")["metadata"]["name"]);
    let env = &find(&objects, "Deployment", "busyguard")["spec"]["template"]["spec"]["containers"][0]["env"];
    let namespaces = env.as_array().unwrap().iter().find(|e| e["name"] == "BUSYGUARD_NAMESPACES").unwrap();
    assert_eq!(namespaces["value"], role["metadata"]["namespace"], "busyguard watches where it may");
}

#[test]
fn the_fence_refuses_busyguards_own_token_any_pod_that_is_not_busyguards() {
    let objects = render(&manifests(""));
    let policy = &find(&objects, "ValidatingAdmissionPolicy", "busyguard-fence")["spec"];
    let account = &find(&objects, "ServiceAccount", "busyguard")["metadata"];
    let username = format!(
        "system:serviceaccount:{}:{}",
        account["namespace"].as_str().unwrap(),
        account["name"].as_str().unwrap()
    );
    assert_eq!(policy["matchConditions"][0]["expression"], format!("request.userInfo.username == '{username}'"));
    assert_eq!(policy["failurePolicy"], "Fail");
    let rules = &policy["matchConstraints"]["resourceRules"];
    assert_eq!(
        rules,
        &json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE", "DELETE"], "resources": ["pods"]}])
    );
    let validations = policy["validations"].as_array().unwrap();
    assert_eq!(validations.len(), 2);
    assert_eq!(validations[0]["expression"], registrations::busyguards_own_pods());
    assert_eq!(validations[1]["expression"], registrations::BUSYGUARDS_POD_WRITES, "metadata only");
    assert!(
        quoted(&registrations::busyguards_own_pods()).contains(&account["namespace"].as_str().unwrap().to_string()),
        "nor in busyguard's own namespace"
    );
    let binding = &find(&objects, "ValidatingAdmissionPolicyBinding", "busyguard-fence")["spec"];
    assert_eq!((&binding["policyName"], &binding["validationActions"]), (&json!("busyguard-fence"), &json!(["Deny"])));
    // Its busy-pod PDB and the budgets' Leases, the other objects it writes.
    let objects_policy = &find(&objects, "ValidatingAdmissionPolicy", "busyguard-fence-objects")["spec"];
    assert_eq!(objects_policy["matchConditions"], policy["matchConditions"]);
    assert_eq!(objects_policy["failurePolicy"], "Fail");
    let resources: Vec<&Value> = objects_policy["matchConstraints"]["resourceRules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["resources"])
        .collect();
    assert_eq!(resources, [&json!(["poddisruptionbudgets"]), &json!(["leases"])]);
    assert_eq!(objects_policy["validations"][0]["expression"], registrations::busyguards_own_objects());
    let binding = &find(&objects, "ValidatingAdmissionPolicyBinding", "busyguard-fence-objects")["spec"];
    assert_eq!(binding["policyName"], "busyguard-fence-objects");
    // Its evictions, which a rule on pods does not match.
    let evictions = &find(&objects, "ValidatingAdmissionPolicy", "busyguard-fence-evictions")["spec"];
    assert_eq!(evictions["matchConditions"], policy["matchConditions"]);
    assert_eq!(evictions["failurePolicy"], "Fail");
    assert_eq!(
        evictions["matchConstraints"]["resourceRules"],
        json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods/eviction"]}])
    );
    assert_eq!(evictions["validations"][0]["expression"], registrations::busyguards_own_evictions());
    let binding = &find(&objects, "ValidatingAdmissionPolicyBinding", "busyguard-fence-evictions")["spec"];
    assert_eq!(
        (&binding["policyName"], &binding["validationActions"]),
        (&json!("busyguard-fence-evictions"), &json!(["Deny"]))
    );
}

#[test]
fn before_1_30_the_component_leaves_out_the_fence_and_nothing_else() {
    let is_fence = |o: &Value| o["kind"].as_str().unwrap().starts_with("ValidatingAdmissionPolicy");
    let mut shipped = render(&manifests("cert-manager"));
    let fences = shipped.iter().filter(|o| is_fence(o)).count();
    assert_eq!(fences, 6, "three policies and their bindings");
    shipped.retain(|o| !is_fence(o));
    assert_eq!(render(&manifests("examples/before-1.30")), shipped);
}

#[test]
fn opted_in_every_webhook_that_selects_namespaces_asks_for_the_enabled_label_and_busyguard_is_told() {
    let opted_in = render(&manifests("examples/opt-in"));
    assert_eq!(namespace_selectors_as_built(&opted_in, Enrolment::OptIn), 13, "every webhook but node-deletes");
    for webhook in webhooks(&opted_in).into_iter().filter(|w| w.get("namespaceSelector").is_some()) {
        let namespaces = selector(&webhook["namespaceSelector"]);
        let name = &webhook["name"];
        let mut opted = json!({"kubernetes.io/metadata.name": "batch", "busyguard.io/enabled": "true",
            "busyguard.io/run-to-completion": "true"});
        assert!(selects(&namespaces, &opted), "{name}: a namespace labelled in");
        opted.as_object_mut().unwrap().remove("busyguard.io/enabled");
        assert!(!selects(&namespaces, &opted), "{name}: a namespace not labelled");
    }
    let env = &find(&opted_in, "Deployment", "busyguard")["spec"]["template"]["spec"]["containers"][0]["env"];
    assert!(
        env.as_array().unwrap().contains(&json!({"name": "BUSYGUARD_OPT_IN", "value": "true"})),
        "busyguard is told"
    );
    // Its own token evicts nothing where no webhook of its own would refuse it.
    let fence = &find(&opted_in, "ValidatingAdmissionPolicy", "busyguard-fence-evictions")["spec"]["validations"];
    let rules: Vec<&Value> = fence.as_array().unwrap().iter().map(|v| &v["expression"]).collect();
    assert_eq!(
        rules,
        [&json!(registrations::busyguards_own_evictions()), &json!(registrations::busyguards_own_evictions_opted_in())]
    );
    // Nothing else changes.
    let without_the_choice = |mut objects: Vec<Value>| {
        for object in &mut objects {
            for webhook in object.get_mut("webhooks").and_then(Value::as_array_mut).into_iter().flatten() {
                webhook.as_object_mut().unwrap().remove("namespaceSelector");
            }
            if object["kind"] == "Deployment" {
                let env = object["spec"]["template"]["spec"]["containers"][0]["env"].as_array_mut().unwrap();
                env.retain(|var| var["name"] != "BUSYGUARD_OPT_IN");
            }
            if object["metadata"]["name"] == "busyguard-fence-evictions"
                && object["kind"] == "ValidatingAdmissionPolicy"
            {
                object["spec"]["validations"].as_array_mut().unwrap().truncate(1);
            }
        }
        objects
    };
    assert_eq!(without_the_choice(opted_in), without_the_choice(render(&manifests("cert-manager"))));
}

/// An overlay of one's own in a copy of `manifests/` (under examples/, so `../../X` names a
/// directory of manifests/), rendered.
fn overlay_in(root: &Path, resource: &str, components: &[&str]) -> Vec<Value> {
    let dir = root.join("examples/under-test");
    std::fs::create_dir_all(&dir).unwrap();
    let components: String = components.iter().map(|c| format!("  - ../../{c}\n")).collect();
    let kustomization = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../../{resource}\n\
         components:\n{components}"
    );
    std::fs::write(dir.join("kustomization.yaml"), kustomization).unwrap();
    render(&dir)
}

#[test]
fn each_owner_component_follows_opt_in_and_self_managed_by_name_whatever_the_order() {
    let (dir, certs) = self_managed_copy();
    let root = dir.path().join("manifests");
    let ca = base64(&std::fs::read(certs.join("ca.crt")).unwrap());
    let owners = ["actions-runner-controller", "agones"];
    let together = render(&manifests("examples/actions-runner-controller-and-agones"));
    for name in ["actions-runner-controller.busyguard.io", "agones.busyguard.io"] {
        assert_eq!(webhook(&together, name)["clientConfig"], webhook(&together, "pods.busyguard.io")["clientConfig"]);
    }
    // One webhook body for every owner: kustomize keeps a component's patches inside its own
    // folder, so the bodies are written twice and held the same here, but for what picks the pods.
    let body = |name: &str| {
        let mut hook = webhook(&together, name).clone();
        for picks in ["name", "objectSelector", "matchConditions"] {
            hook.as_object_mut().unwrap().remove(picks);
        }
        hook
    };
    assert_eq!(body("actions-runner-controller.busyguard.io"), body("agones.busyguard.io"));
    assert_eq!(
        body("actions-runner-controller.busyguard.io"),
        body("actions-runner-controller-workflows.busyguard.io")
    );
    // containerMode: kubernetes: the hooks' workflow pod (labelled with its runner's pod, no owner).
    let workflows = webhook(&together, "actions-runner-controller-workflows.busyguard.io");
    assert_eq!(workflows["clientConfig"], webhook(&together, "pods.busyguard.io")["clientConfig"]);
    let pod = |labels: Value| json!({"metadata": {"name": "r-workflow", "labels": labels}});
    assert!(sends_create(workflows, &pod(json!({"runner-pod": "r"}))));
    assert!(!sends_create(workflows, &pod(json!({"app": "w"}))), "only the hooks' pods");
    let args = &find(&together, "Deployment", "busyguard")["spec"]["template"]["spec"]["containers"][0]["args"];
    assert_eq!(
        args.as_array().unwrap().iter().filter(|a| a.as_str().unwrap().starts_with("--busy-when-owner")).count(),
        2
    );
    for order in [owners, [owners[1], owners[0]]] {
        let opt_in_first = [&["opt-in"][..], &order[..]].concat();
        let opt_in_last = [&order[..], &["opt-in"][..]].concat();
        for components in [opt_in_first, opt_in_last] {
            let objects = overlay_in(&root, "cert-manager", &components);
            assert_eq!(
                namespace_selectors_as_built(&objects, Enrolment::OptIn),
                17,
                "{components:?}: every webhook but node-deletes"
            );
        }
        let objects = overlay_in(&root, "cert-manager", &order);
        assert_eq!(namespace_selectors_as_built(&objects, Enrolment::OptOut), 17, "{order:?}");
        let objects = overlay_in(&root, "self-managed", &order);
        for webhook in webhooks(&objects) {
            assert_eq!(without_whitespace(&webhook["clientConfig"]["caBundle"]), ca, "{order:?}: {}", webhook["name"]);
        }
    }
}

#[test]
fn agones_own_deletes_of_its_game_servers_pods_skip_the_fail_closed_delete_webhooks() {
    let objects = render(&manifests("examples/agones"));
    let game_server = json!({"metadata": {"labels": {"agones.dev/gameserver": "gs", "busyguard.io/busy": "true"}}});
    let worker = json!({"metadata": {"labels": {"app": "w", "busyguard.io/busy": "true"}}});
    for name in ["pod-deletes.busyguard.io", "budget-deletes.busyguard.io"] {
        let conditions = webhook(&objects, name)["matchConditions"].as_array().unwrap().clone();
        let condition = conditions.iter().find(|c| c["name"] == "not-agones-ending-its-game-server").unwrap();
        let sent = |user: &str, pod: &Value| {
            let program = cel::Program::compile(condition["expression"].as_str().unwrap()).unwrap();
            let mut context = cel::Context::default();
            context.add_variable_from_value("request", cel::to_value(json!({"userInfo": {"username": user}})).unwrap());
            context.add_variable_from_value("oldObject", cel::to_value(pod).unwrap());
            program.execute(&context).unwrap() == cel::Value::Bool(true)
        };
        let agones = "system:serviceaccount:agones-system:agones-controller";
        assert!(!sent(agones, &game_server), "{name}: Agones' end of its own game server");
        assert!(sent(agones, &worker), "{name}: Agones' controller deleting another pod");
        assert!(sent("alice", &game_server), "{name}: a person's delete");
        assert!(conditions.len() > 1, "{name}: the base's conditions are kept");
    }
    // Only an allocation (a GameServer turning Allocated) is sent to busyguard.
    let allocations = webhook(&objects, "agones-allocations.busyguard.io");
    assert_eq!(allocations["clientConfig"], webhook(&objects, "pod-deletes.busyguard.io")["clientConfig"]);
    let condition = allocations["matchConditions"][0]["expression"].as_str().unwrap();
    let sent = |old: &str, new: &str| {
        let program = cel::Program::compile(condition).unwrap();
        let mut context = cel::Context::default();
        let state = |s: &str| json!({"status": {"state": s}});
        context.add_variable_from_value("object", cel::to_value(state(new)).unwrap());
        context.add_variable_from_value("oldObject", cel::to_value(state(old)).unwrap());
        program.execute(&context).unwrap() == cel::Value::Bool(true)
    };
    assert!(sent("Ready", "Allocated"));
    assert!(!sent("Allocated", "Allocated"), "an Allocated server's other updates");
    assert!(!sent("Allocated", "Ready"));
}

#[test]
fn an_overlay_of_your_own_sets_your_image_with_kubectl_alone() {
    let objects = render(&manifests("examples/your-image"));
    let deployment = find(&objects, "Deployment", "busyguard");
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        format!("registry.example.com/busyguard:{}", env!("CARGO_PKG_VERSION"))
    );
}

/// Whether the API server would send a pod's CREATE to `webhook`: its object selector, then its
/// match conditions, evaluated as CEL.
fn sends_create(webhook: &Value, pod: &Value) -> bool {
    let labels = &pod["metadata"]["labels"];
    selects(&selector(&webhook["objectSelector"]), labels)
        && webhook["matchConditions"].as_array().into_iter().flatten().all(|condition| {
            let program = cel::Program::compile(condition["expression"].as_str().unwrap()).unwrap();
            let mut context = cel::Context::default();
            context.add_variable_from_value("object", cel::to_value(pod).unwrap());
            program.execute(&context).unwrap() == cel::Value::Bool(true)
        })
}

#[test]
fn each_owner_recipe_opts_in_its_owners_pods_and_no_other_reads_its_owners_and_names_their_busy_rule() {
    let cert_manager = render(&manifests("cert-manager"));
    let recipes = [
        (
            "actions-runner-controller",
            "actions-ephemeral-runner",
            "actions.github.com/v1alpha1",
            "EphemeralRunner",
            "ephemeralrunners",
        ),
        ("agones", "agones.dev/gameserver", "agones.dev/v1", "GameServer", "gameservers"),
    ];
    for (recipe, label, api_version, kind, plural) in recipes {
        let objects = render(&manifests(&format!("examples/{recipe}")));
        let opt_in = webhook(&objects, &format!("{recipe}.busyguard.io"));
        assert_eq!(opt_in["clientConfig"]["service"]["path"], "/mutate", "{recipe}");
        assert_eq!(opt_in["rules"][0]["operations"], json!(["CREATE"]), "{recipe}");
        let owned_by = |api_version: &str, kind: &str, labels: Value| {
            json!({"metadata": {"name": "p", "labels": labels,
                "ownerReferences": [{"apiVersion": api_version, "kind": kind, "name": "o", "uid": "u", "controller": true}]}})
        };
        let theirs = owned_by(api_version, kind, json!({label: "x"}));
        assert!(sends_create(opt_in, &theirs), "{recipe}: its owner's pod is opted in");
        // busyguard check dry-runs such a pod, labelled as the webhook selects it.
        let (_, _, checked, value) = busyguard::commands::check::OPT_IN_LABELS
            .into_iter()
            .find(|(group, of, ..)| api_version.starts_with(&format!("{group}/")) && *of == kind)
            .unwrap_or_else(|| panic!("{recipe}: busyguard check does not know its label"));
        assert!(sends_create(opt_in, &owned_by(api_version, kind, json!({checked: value}))), "{recipe}");
        let version_later = owned_by(&api_version.replace("/v1", "/v2"), kind, json!({label: "x"}));
        assert!(sends_create(opt_in, &version_later), "{recipe}: of another version of the group too");
        assert!(
            !sends_create(opt_in, &owned_by("apps/v1", "ReplicaSet", json!({label: "x"}))),
            "{recipe}: not another's"
        );
        assert!(
            !sends_create(opt_in, &owned_by("example.com/v1", kind, json!({label: "x"}))),
            "{recipe}: nor a namesake's"
        );
        assert!(!sends_create(opt_in, &owned_by(api_version, kind, json!({label: "x", "busyguard.io/busy": "false"}))));
        assert!(
            !sends_create(opt_in, &owned_by(api_version, kind, json!({"app": "x"}))),
            "{recipe}: by its label alone"
        );

        // busyguard is told the rule, which it parses as it starts; only the owners are read.
        let args =
            find(&objects, "Deployment", "busyguard")["spec"]["template"]["spec"]["containers"][0]["args"].clone();
        let args: Vec<String> = serde_json::from_value(args).unwrap();
        let cli = Cli::try_parse_from(std::iter::once("busyguard".to_string()).chain(args)).unwrap();
        let BusyguardCommand::Serve(serve) = cli.command else { unreachable!() };
        let rules = serve.into_config().policy.owner_rules;
        assert_eq!(rules.len(), 1, "{recipe}");
        assert!(rules[0].covers(api_version, kind), "{recipe}: {}", rules[0]);
        let role = find(&objects, "ClusterRole", &format!("busyguard-{recipe}"));
        let group = api_version.split('/').next().unwrap();
        assert_eq!(
            role["rules"],
            json!([{"apiGroups": [group], "resources": [plural], "verbs": ["get", "list", "watch"]}])
        );
        let binding = find(&objects, "ClusterRoleBinding", &format!("busyguard-{recipe}"));
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": "busyguard", "namespace": "busyguard"}])
        );

        // Nothing else changes.
        let without_the_recipe = |objects: &[Value]| -> Vec<Value> {
            let mut objects: Vec<Value> = objects
                .iter()
                .filter(|o| !o["metadata"]["name"].as_str().unwrap().ends_with(recipe))
                .cloned()
                .collect();
            for object in &mut objects {
                if let Some(webhooks) = object.get_mut("webhooks").and_then(Value::as_array_mut) {
                    webhooks.retain(|w| !w["name"].as_str().unwrap().starts_with(recipe));
                    for conditions in webhooks.iter_mut().filter_map(|w| w["matchConditions"].as_array_mut()) {
                        conditions.retain(|c| !c["name"].as_str().unwrap().contains(recipe));
                    }
                }
                if object["kind"] == "Deployment" {
                    object["spec"]["template"]["spec"]["containers"][0]["args"] = json!(["serve"]);
                }
            }
            objects
        };
        assert_eq!(without_the_recipe(&objects), without_the_recipe(&cert_manager), "{recipe}");
    }
}
