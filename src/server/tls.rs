//! TLS for the webhook port: rustls with ring, TLS 1.2 and 1.3, ALPN h2 and http/1.1, a
//! serving certificate that follows its files, and optionally client certificates required.
//!
//! The files are read again every `interval` and compared by content, which catches every way
//! they change: an editor's rewrite, `busyguard certs --force`, and the `..data` symlink swap of
//! a Kubernetes Secret volume (inotify on the file names misses the latter). A pair that does not
//! load keeps the last good one in service.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::RwLock;
use std::time::Duration;

use anyhow::Context;
use rustls::RootCertStore;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{ServerConfig, version};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tracing::{info, warn};

use crate::crypto::{CertError, certified_key, not_after, provider};
use crate::metrics::{Metrics, RELOAD_REJECTED, RELOADED, ResultLabels};

fn client_verifier(path: &Path) -> anyhow::Result<Arc<dyn ClientCertVerifier>> {
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(path)? {
        roots.add(ca?)?;
    }
    if roots.is_empty() {
        anyhow::bail!("no PEM certificate in it");
    }
    Ok(WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider()).build()?)
}

#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Both files' bytes, as last read.
#[derive(PartialEq, Eq)]
struct Contents(Vec<u8>, Vec<u8>);

impl CertFiles {
    fn read(&self) -> Result<Contents, CertError> {
        let read = |what: &str, path: &PathBuf| {
            std::fs::read(path).map_err(|e| {
                let hint = match e.kind() {
                    std::io::ErrorKind::NotFound => {
                        "; make development certificates with `busyguard certs` (or `make certs`), or point \
                         --tls-cert and --tls-key at yours"
                    }
                    _ => "",
                };
                CertError(format!("cannot read the serving {what} {}: {e}{hint}", path.display()))
            })
        };
        Ok(Contents(read("certificate", &self.cert)?, read("key", &self.key)?))
    }
}

/// The serving certificate, swapped in place when the files change.
#[derive(Debug)]
pub struct ReloadingCert {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().clone())
    }
}

impl ReloadingCert {
    fn set(&self, key: CertifiedKey) {
        *self.current.write() = Arc::new(key);
    }
}

/// Loads the pair once (a failure here stops the server), then keeps it fresh in the background.
pub fn load_and_watch(
    files: CertFiles,
    interval: Duration,
    metrics: Arc<Metrics>,
) -> anyhow::Result<(Arc<ReloadingCert>, tokio::task::JoinHandle<()>)> {
    let contents = files.read().map_err(anyhow::Error::msg)?;
    let key = certified_key(&contents.0, &contents.1)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("loading {} and {}", files.cert.display(), files.key.display()))?;
    record_expiry(&key, &metrics);
    let cert = Arc::new(ReloadingCert { current: RwLock::new(Arc::new(key)) });
    let watcher = tokio::spawn(watch(files, cert.clone(), contents, interval, metrics));
    Ok((cert, watcher))
}

async fn watch(
    files: CertFiles,
    cert: Arc<ReloadingCert>,
    mut last: Contents,
    interval: Duration,
    metrics: Arc<Metrics>,
) {
    let mut last_error = None;
    loop {
        tokio::time::sleep(interval).await;
        // Two small files: cheaper to read than to hand off to a blocking thread.
        let contents = match files.read() {
            Ok(contents) => contents,
            Err(e) => {
                if last_error.as_ref() != Some(&e) {
                    warn!(error = %e, "cannot read the certificate files; still serving the last good pair");
                    last_error = Some(e);
                }
                continue;
            }
        };
        last_error = None;
        if contents == last {
            continue;
        }
        match certified_key(&contents.0, &contents.1) {
            Ok(key) => {
                record_expiry(&key, &metrics);
                cert.set(key);
                metrics.tls_reloads.get_or_create(&ResultLabels { result: RELOADED }).inc();
                info!(cert = %files.cert.display(), "serving certificate reloaded");
            }
            Err(e) => {
                metrics.tls_reloads.get_or_create(&ResultLabels { result: RELOAD_REJECTED }).inc();
                warn!(error = %e, cert = %files.cert.display(), "new certificate files rejected; still serving the last good pair");
            }
        }
        // A rejected pair is not retried until the files change again.
        last = contents;
    }
}

/// When the serving certificate expires, for the alert that comes weeks before: after it the
/// API server's calls fail, and the fail-closed webhooks refuse every delete they are sent.
fn record_expiry(key: &CertifiedKey, metrics: &Metrics) {
    let expiry = key.cert.first().and_then(|leaf| not_after(leaf));
    metrics.tls_certificate_expiry.set(expiry.map_or(0, |t| t.as_second()));
}

/// With `client_ca`, only clients presenting a certificate issued by one of its CAs finish the
/// handshake.
pub fn server_config(cert: Arc<ReloadingCert>, client_ca: Option<&Path>) -> anyhow::Result<ServerConfig> {
    let builder =
        ServerConfig::builder_with_provider(provider()).with_protocol_versions(&[&version::TLS13, &version::TLS12])?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => builder.with_client_cert_verifier(
            client_verifier(path).with_context(|| format!("loading the client CA {}", path.display()))?,
        ),
    };
    let mut config = builder.with_cert_resolver(cert);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}
