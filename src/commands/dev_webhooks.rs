//! `busyguard dev-webhooks`: the webhook configurations of `manifests/base`, pointed by URL at a
//! busyguard running outside the cluster, for `make dev-register`. The rules, selectors and
//! policies are the base's own, so a laptop sees exactly the requests a deployment would.

use std::path::PathBuf;

use anyhow::{Context, bail};
use base64::Engine;
use clap::Args;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use serde_json::{Value, json};

use crate::policy::keys::MANAGED_BY;

#[derive(Debug, Args)]
pub struct DevWebhooksArgs {
    /// Where the API server reaches this busyguard: `https://host:port`.
    #[arg(long, env = "BUSYGUARD_DEV_URL", default_value = "https://127.0.0.1:8443")]
    pub url: String,
    /// CA of the serving certificate (PEM): the webhooks' caBundle.
    #[arg(long, env = "BUSYGUARD_DEV_CA_FILE", default_value = "certs/ca.crt")]
    pub ca_file: PathBuf,
}

const BASE_WEBHOOKS: &str = include_str!("../../manifests/base/webhooks.yaml");

/// Name of both dev configurations, distinct from the deployed ones so each can go on its own.
pub const DEV_NAME: &str = "busyguard-dev";

/// The base configurations as YAML documents, renamed to [`DEV_NAME`], every webhook calling
/// `url` + its path and trusting `ca_pem`.
pub fn dev_webhooks(url: &str, ca_pem: &[u8]) -> anyhow::Result<String> {
    let url = webhook_url_base(url)?;
    let certificates = CertificateDer::pem_slice_iter(ca_pem).collect::<Result<Vec<_>, _>>();
    match certificates {
        Ok(certificates) if !certificates.is_empty() => {}
        Ok(_) => bail!("the CA file holds no PEM certificate"),
        Err(e) => bail!("the CA file does not parse: {e}"),
    }
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let mut configurations: Vec<Value> =
        serde_saphyr::from_multiple(BASE_WEBHOOKS).context("manifests/base/webhooks.yaml")?;
    for configuration in &mut configurations {
        configuration["metadata"] = json!({"name": DEV_NAME, "labels": {MANAGED_BY.0: "busyguard-dev-register"}});
        for webhook in configuration["webhooks"].as_array_mut().into_iter().flatten() {
            let path = webhook["clientConfig"]["service"]["path"].as_str().unwrap_or("/").to_string();
            webhook["clientConfig"] = json!({"url": format!("{url}{path}"), "caBundle": ca_bundle});
        }
    }
    Ok(serde_saphyr::to_string_multiple(&configurations)?)
}

/// `https://host[:port][/prefix]` without a trailing slash; the API server refuses other
/// schemes, user info, queries and fragments in a webhook URL.
fn webhook_url_base(url: &str) -> anyhow::Result<&str> {
    let parsed: http::Uri = url.parse().with_context(|| format!("--url {url:?} is not a URL"))?;
    if parsed.scheme_str() != Some("https") {
        bail!("--url {url:?}: webhooks are called over https only");
    }
    let authority = parsed.authority().map(http::uri::Authority::as_str).unwrap_or_default();
    if authority.is_empty() || authority.contains('@') || parsed.query().is_some() || url.contains('#') {
        bail!("--url {url:?}: give https://host[:port] without user, query or fragment");
    }
    Ok(url.trim_end_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIBhTCCASugAwIBAgIUOBRbYYZKARBzTdchu62yxAr/L7EwCgYIKoZIzj0EAwIw\n-----END CERTIFICATE-----\n";

    #[test]
    fn every_base_webhook_calls_the_url_with_its_own_path_and_trusts_the_ca() {
        let yaml = dev_webhooks("https://127.0.0.1:8443/", CA.as_bytes()).unwrap();
        let configurations: Vec<Value> = serde_saphyr::from_multiple(&yaml).unwrap();
        let base: Vec<Value> = serde_saphyr::from_multiple(BASE_WEBHOOKS).unwrap();
        assert_eq!(configurations.len(), base.len());
        for (dev, base) in configurations.iter().zip(&base) {
            assert_eq!(dev["metadata"]["name"], DEV_NAME);
            assert_eq!(dev["kind"], base["kind"]);
            for (dev, base) in dev["webhooks"].as_array().unwrap().iter().zip(base["webhooks"].as_array().unwrap()) {
                let path = base["clientConfig"]["service"]["path"].as_str().unwrap();
                assert_eq!(dev["clientConfig"]["url"], format!("https://127.0.0.1:8443{path}"));
                let ca = base64::engine::general_purpose::STANDARD
                    .decode(dev["clientConfig"]["caBundle"].as_str().unwrap())
                    .unwrap();
                assert_eq!(ca, CA.as_bytes());
                let (mut dev, mut base) = (dev.clone(), base.clone());
                dev["clientConfig"] = Value::Null;
                base["clientConfig"] = Value::Null;
                assert_eq!(dev, base, "everything but the client config is the base's");
            }
        }
    }

    #[test]
    fn urls_the_api_server_would_refuse_are_refused_here() {
        for url in ["http://127.0.0.1:8443", "https://user@127.0.0.1", "https://host/?a=b", "https://host/#x", "host"] {
            assert!(dev_webhooks(url, CA.as_bytes()).is_err(), "{url}");
        }
    }

    #[test]
    fn a_ca_file_without_a_certificate_is_refused() {
        assert!(dev_webhooks("https://127.0.0.1:8443", b"not a certificate").is_err());
        assert!(dev_webhooks("https://127.0.0.1:8443", b"").is_err());
    }
}
