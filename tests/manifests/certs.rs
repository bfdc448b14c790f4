//! The certificates of each overlay: cert-manager's, `make cluster-certs` and its rotation.

use super::*;

#[test]
fn the_cert_manager_overlay_issues_the_serving_secret_and_injects_its_ca() {
    let objects = render(&manifests("cert-manager"));
    let certificate = find(&objects, "Certificate", "busyguard");
    assert_eq!(certificate["spec"]["secretName"], "busyguard-tls", "the Deployment's volume");
    let names = certificate["spec"]["dnsNames"].as_array().unwrap();
    assert!(names.contains(&json!("busyguard.busyguard.svc")), "the name the API server dials");
    let issuer = find(&objects, "Issuer", certificate["spec"]["issuerRef"]["name"].as_str().unwrap());
    let ca = find(&objects, "Certificate", "busyguard-ca");
    assert_eq!(issuer["spec"]["ca"]["secretName"], ca["spec"]["secretName"]);
    assert_eq!(ca["spec"]["isCA"], true);
    for kind in ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"] {
        let annotations = &find(&objects, kind, "busyguard")["metadata"]["annotations"];
        assert_eq!(annotations["cert-manager.io/inject-ca-from"], "busyguard/busyguard", "{kind}");
    }
}

fn certificates_in(pem: &[u8]) -> usize {
    String::from_utf8_lossy(pem).matches("-----BEGIN CERTIFICATE-----").count()
}

#[test]
fn the_self_managed_overlay_turns_make_cluster_certs_into_the_secret_and_every_ca_bundle() {
    let (dir, certs) = self_managed_copy();
    let objects = render(&dir.path().join("manifests/self-managed"));
    let secret = find(&objects, "Secret", "busyguard-tls");
    assert_eq!(secret["metadata"]["namespace"], "busyguard");
    assert_eq!(secret["type"], "kubernetes.io/tls");
    for file in ["tls.crt", "tls.key", "ca.crt"] {
        let written = std::fs::read(certs.join(file)).unwrap();
        assert_eq!(without_whitespace(&secret["data"][file]), base64(&written), "{file}");
    }
    let ca = std::fs::read(certs.join("ca.crt")).unwrap();
    for webhook in webhooks(&objects) {
        assert_eq!(without_whitespace(&webhook["clientConfig"]["caBundle"]), base64(&ca), "{}", webhook["name"]);
    }
    assert_serves_the_service_under_the_first_ca(&certs);
}

/// `busyguard certs` keeps (does not rewrite) a serving pair only when it is valid for the
/// Service's name and chains to the first CA in `ca.crt`.
fn assert_serves_the_service_under_the_first_ca(certs: &Path) {
    let serving = std::fs::read(certs.join("tls.crt")).unwrap();
    let check =
        run(Command::new(BUSYGUARD).args(["certs", "--dns", "busyguard.busyguard.svc", "--no-ip", "--dir"]).arg(certs));
    assert!(String::from_utf8_lossy(&check.stdout).contains("kept"), "{check:?}");
    assert_eq!(std::fs::read(certs.join("tls.crt")).unwrap(), serving, "kept as it was");
}

#[test]
fn a_rotation_trusts_the_old_and_the_new_ca_until_it_is_finished() {
    let (_dir, certs) = self_managed_copy();
    let old_ca = std::fs::read(certs.join("ca.crt")).unwrap();
    let old_serving = std::fs::read(certs.join("tls.crt")).unwrap();

    make(&["cluster-certs-rotate"], &[("CLUSTER_CERTS", &certs)]);
    let during = std::fs::read(certs.join("ca.crt")).unwrap();
    assert_eq!(certificates_in(&during), 2);
    assert!(during.ends_with(&old_ca), "the old CA is still trusted");
    assert_ne!(std::fs::read(certs.join("tls.crt")).unwrap(), old_serving, "a new serving pair");
    assert_serves_the_service_under_the_first_ca(&certs);

    make(&["cluster-certs-rotated"], &[("CLUSTER_CERTS", &certs)]);
    let after = std::fs::read(certs.join("ca.crt")).unwrap();
    assert_eq!(certificates_in(&after), 1);
    assert!(during.starts_with(&after), "only the new CA is left");
}
