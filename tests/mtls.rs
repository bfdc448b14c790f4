//! `--client-ca`: only a client presenting a certificate issued by that CA (the API server, set
//! up through its AdmissionConfiguration) gets past the handshake.

mod common;

use std::sync::Arc;

use common::{TestServer, fixture, http1, post_request, test_config, try_send};
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

struct ClientCa {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn client_ca(name: &str) -> ClientCa {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    let pem = params.self_signed(&key).unwrap().pem();
    ClientCa { pem, issuer: Issuer::new(params, key) }
}

/// A client certificate for `kube-apiserver`, as the API server presents it.
fn client_cert(ca: &ClientCa) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, "kube-apiserver");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    (vec![cert.der().clone()], PrivateKeyDer::try_from(key.serialize_der()).unwrap())
}

/// Posts a review over a new connection presenting `identity`; the HTTP status, or why there was none.
async fn post_as(
    server: &TestServer,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<u16, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(server.ca()).unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(busyguard::crypto::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match identity {
        Some((chain, key)) => builder.with_client_auth_cert(chain, key).unwrap(),
        None => builder.with_no_client_auth(),
    };
    let tcp = TcpStream::connect(server.webhook).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let stream = TlsConnector::from(Arc::new(config)).connect(name, tcp).await.map_err(|e| e.to_string())?;
    let body = serde_json::to_vec(&fixture("pod-delete-by-user.json")).unwrap();
    Ok(try_send(&mut http1(stream).await, post_request("/validate", body)).await?.status)
}

async fn server_trusting(ca: &ClientCa) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("client-ca.crt");
    std::fs::write(&path, &ca.pem).unwrap();
    TestServer::start_with(|config| config.client_ca = Some(path)).await
}

#[tokio::test]
async fn with_a_client_ca_only_clients_holding_a_certificate_from_it_are_answered() {
    let apiserver_ca = client_ca("apiserver client CA");
    let server = server_trusting(&apiserver_ca).await;

    assert_eq!(post_as(&server, Some(client_cert(&apiserver_ca))).await, Ok(200));

    let anonymous = post_as(&server, None).await.unwrap_err();
    assert!(anonymous.contains("CertificateRequired"), "refused in the handshake: {anonymous}");
    let stranger = post_as(&server, Some(client_cert(&client_ca("another CA")))).await.unwrap_err();
    assert!(stranger.contains("UnknownCA"), "refused in the handshake: {stranger}");

    assert_eq!(post_as(&server, Some(client_cert(&apiserver_ca))).await, Ok(200), "still serving");
}

#[tokio::test]
async fn a_client_ca_file_without_a_certificate_stops_the_start_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    common::fresh_certs(dir.path());
    let empty = dir.path().join("client-ca.crt");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    let config = busyguard::server::ServeConfig { client_ca: Some(empty.clone()), ..test_config(dir.path()) };
    let error = busyguard::server::start(config).await.err().expect("refuses to start");
    assert_eq!(format!("{error:#}"), format!("loading the client CA {}: no PEM certificate in it", empty.display()));
}
