//! The make targets that build, register and smoke-test without a cluster.

use super::*;

#[test]
fn make_image_builds_one_image_for_amd64_and_arm64_and_pushes_it() {
    let dir = tempfile::tempdir().unwrap();
    let docker = dir.path().join("docker");
    let script = format!("#!/bin/sh\necho \"$@\" >> {log}\n", log = dir.path().join("docker.log").display());
    std::fs::write(&docker, script).unwrap();
    run(Command::new("chmod").arg("+x").arg(&docker));
    make(&["image", "IMAGE=registry.example.com/busyguard:0.2.0"], &[("CONTAINER", &docker)]);
    let log = std::fs::read_to_string(dir.path().join("docker.log")).unwrap();
    let commit =
        String::from_utf8(run(Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).current_dir(ROOT)).stdout)
            .unwrap();
    assert_eq!(
        log.trim(),
        format!(
            "buildx build --platform linux/amd64,linux/arm64 --build-arg BUSYGUARD_COMMIT={} -t \
             registry.example.com/busyguard:0.2.0 --push .",
            commit.trim()
        )
    );
}

#[test]
fn make_dev_register_applies_url_webhooks_trusting_the_local_ca_and_dev_unregister_removes_them() {
    let dir = tempfile::tempdir().unwrap();
    let kubectl = fake_kubectl(dir.path());
    let certs = dir.path().join("certs");
    make(&["dev-register"], &[("KUBECTL", &kubectl), ("CERTS_DIR", &certs)]);
    let applied = certs.join("dev-webhooks.yaml");
    let log = std::fs::read_to_string(dir.path().join("kubectl.log")).unwrap();
    assert_eq!(log, format!("apply -f {}\n", applied.display()));

    let objects: Vec<Value> = serde_saphyr::from_multiple(&std::fs::read_to_string(&applied).unwrap()).unwrap();
    let base = render(&manifests(""));
    let ca = std::fs::read(certs.join("ca.crt")).unwrap();
    assert_eq!(objects.len(), 2);
    for object in &objects {
        assert_eq!(object["apiVersion"], "admissionregistration.k8s.io/v1");
        assert_eq!(object["metadata"]["name"], "busyguard-dev");
        let deployed = find(&base, object["kind"].as_str().unwrap(), "busyguard");
        let dev = object["webhooks"].as_array().unwrap();
        assert_eq!(dev.len(), deployed["webhooks"].as_array().unwrap().len());
        for (dev, deployed) in dev.iter().zip(deployed["webhooks"].as_array().unwrap()) {
            let client = dev["clientConfig"].as_object().unwrap();
            let path = deployed["clientConfig"]["service"]["path"].as_str().unwrap();
            assert_eq!(client["url"], format!("https://127.0.0.1:8443{path}"), "exactly one of url and service");
            assert!(!client.contains_key("service"));
            assert_eq!(client["caBundle"], base64(&ca));
            for field in ["name", "rules", "failurePolicy", "sideEffects", "admissionReviewVersions", "timeoutSeconds"]
            {
                assert_eq!(dev[field], deployed[field], "{field}");
            }
        }
    }

    make(&["dev-unregister"], &[("KUBECTL", &kubectl)]);
    let log = std::fs::read_to_string(dir.path().join("kubectl.log")).unwrap();
    let deleted = log.lines().last().unwrap();
    assert_eq!(
        deleted,
        "delete mutatingwebhookconfiguration/busyguard-dev validatingwebhookconfiguration/busyguard-dev --ignore-not-found"
    );
}

#[test]
fn make_e2e_cluster_without_a_reachable_cluster_says_so_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n\
         users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n\
         current-context: c\n",
    )
    .unwrap();
    let output =
        Command::new("make").args(["-s", "-C", ROOT, "e2e-cluster"]).env("KUBECONFIG", &kubeconfig).output().unwrap();
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("no cluster reachable"), "{said}");
    assert!(said.contains("nothing was tested"), "{said}");
}
