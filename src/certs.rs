//! `busyguard certs`: a CA and an ECDSA P-256 serving certificate for development and for
//! clusters that manage their own webhook certificates. Valid files are kept unless forced.

use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    PKCS_ECDSA_P256_SHA256, SanType,
};
use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::crypto::{certified_key, provider};

pub const CA_CERT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const TLS_CERT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";

/// Existing files must stay valid at least this much longer to be kept.
const KEEP_IF_VALID_FOR: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, Clone)]
pub struct CertsRequest {
    pub dir: PathBuf,
    pub dns_names: Vec<String>,
    pub ips: Vec<IpAddr>,
    pub valid_days: u32,
    pub force: bool,
}

#[derive(Debug, PartialEq, Eq)]
pub enum CertsOutcome {
    /// The files there were valid for every name: nothing written.
    Kept,
    /// New files were written, for this reason.
    Written { reason: String },
}

pub fn ensure(request: &CertsRequest) -> anyhow::Result<CertsOutcome> {
    let reason = if request.force {
        "asked to (--force)".to_string()
    } else {
        match check_existing(request) {
            Ok(()) => return Ok(CertsOutcome::Kept),
            Err(problem) => format!("no usable certificates there: {problem}"),
        }
    };
    write_new(request)?;
    Ok(CertsOutcome::Written { reason })
}

fn names(request: &CertsRequest) -> impl Iterator<Item = String> + '_ {
    request.dns_names.iter().cloned().chain(request.ips.iter().map(IpAddr::to_string))
}

/// `Ok` when the serving pair chains to the CA in the folder and stays valid for every name.
fn check_existing(request: &CertsRequest) -> Result<(), String> {
    let read = |name: &str| {
        let path = request.dir.join(name);
        std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))
    };
    let ca = CertificateDer::from_pem_slice(&read(CA_CERT)?).map_err(|e| format!("{CA_CERT}: {e}"))?;
    let serving = certified_key(&read(TLS_CERT)?, &read(TLS_KEY)?)?;
    let mut roots = RootCertStore::empty();
    roots.add(ca).map_err(|e| format!("{CA_CERT}: {e}"))?;
    let verifier =
        WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider()).build().map_err(|e| e.to_string())?;
    let at = UnixTime::since_unix_epoch(
        SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default() + KEEP_IF_VALID_FOR,
    );
    let (leaf, intermediates) = serving.cert.split_first().ok_or("no serving certificate")?;
    for name in names(request) {
        let server_name = ServerName::try_from(name.as_str()).map_err(|e| format!("{name:?}: {e}"))?;
        verifier
            .verify_server_cert(leaf, intermediates, &server_name, &[], at)
            .map_err(|e| format!("{TLS_CERT} is not valid for {name} for another day: {e}"))?;
    }
    Ok(())
}

fn write_new(request: &CertsRequest) -> anyhow::Result<()> {
    let now = time::OffsetDateTime::now_utc();
    let not_after = now + time::Duration::days(i64::from(request.valid_days));

    let ca_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut ca = CertificateParams::default();
    ca.distinguished_name.push(DnType::CommonName, "busyguard webhook CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    ca.not_before = now - time::Duration::hours(1);
    ca.not_after = not_after;
    let ca_cert = ca.self_signed(&ca_key)?;
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut leaf = CertificateParams::new(request.dns_names.clone())?;
    leaf.subject_alt_names.extend(request.ips.iter().map(|ip| SanType::IpAddress(*ip)));
    let common_name = names(request).next().unwrap_or_else(|| "busyguard".into());
    leaf.distinguished_name.push(DnType::CommonName, common_name);
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.use_authority_key_identifier_extension = true;
    leaf.not_before = now - time::Duration::hours(1);
    leaf.not_after = not_after;
    let cert = leaf.signed_by(&key, &issuer)?;

    std::fs::create_dir_all(&request.dir).with_context(|| format!("creating {}", request.dir.display()))?;
    // Keys first and the serving certificate last: a server watching the folder then sees a
    // complete pair at its next look.
    write_atomically(&request.dir, CA_KEY, ca_key_pem.as_bytes(), 0o600)?;
    write_atomically(&request.dir, CA_CERT, ca_cert.pem().as_bytes(), 0o644)?;
    write_atomically(&request.dir, TLS_KEY, key.serialize_pem().as_bytes(), 0o600)?;
    write_atomically(&request.dir, TLS_CERT, cert.pem().as_bytes(), 0o644)?;
    Ok(())
}

/// Written beside and renamed over, so no reader ever sees half a file.
fn write_atomically(dir: &Path, name: &str, contents: &[u8], mode: u32) -> anyhow::Result<()> {
    let path = dir.join(name);
    let temporary = dir.join(format!(".{name}.new"));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&temporary)
        .with_context(|| format!("writing {}", temporary.display()))?;
    file.write_all(contents)?;
    file.sync_all()?;
    std::fs::rename(&temporary, &path).with_context(|| format!("replacing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(dir: &Path) -> CertsRequest {
        CertsRequest {
            dir: dir.to_path_buf(),
            dns_names: vec!["localhost".into(), "busyguard.busyguard.svc".into()],
            ips: vec!["127.0.0.1".parse().unwrap()],
            valid_days: 30,
            force: false,
        }
    }

    #[test]
    fn writes_a_ca_and_a_serving_pair_valid_for_every_name() {
        let dir = tempfile::tempdir().unwrap();
        let outcome = ensure(&request(dir.path())).unwrap();
        assert!(matches!(outcome, CertsOutcome::Written { .. }), "{outcome:?}");
        for name in [CA_CERT, CA_KEY, TLS_CERT, TLS_KEY] {
            assert!(dir.path().join(name).exists(), "{name}");
        }
        assert_eq!(check_existing(&request(dir.path())), Ok(()));
        let key_mode = std::fs::metadata(dir.path().join(TLS_KEY)).unwrap().permissions();
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&key_mode) & 0o777, 0o600);
    }

    #[test]
    fn valid_files_are_kept_and_force_replaces_them() {
        let dir = tempfile::tempdir().unwrap();
        ensure(&request(dir.path())).unwrap();
        let before = std::fs::read(dir.path().join(TLS_CERT)).unwrap();
        assert_eq!(ensure(&request(dir.path())).unwrap(), CertsOutcome::Kept);
        assert_eq!(std::fs::read(dir.path().join(TLS_CERT)).unwrap(), before);

        let forced = CertsRequest { force: true, ..request(dir.path()) };
        assert!(matches!(ensure(&forced).unwrap(), CertsOutcome::Written { .. }));
        assert_ne!(std::fs::read(dir.path().join(TLS_CERT)).unwrap(), before);
    }

    #[test]
    fn a_new_name_makes_the_files_invalid_and_they_are_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        ensure(&request(dir.path())).unwrap();
        let mut wider = request(dir.path());
        wider.dns_names.push("busyguard.example.com".into());
        let outcome = ensure(&wider).unwrap();
        let CertsOutcome::Written { reason } = outcome else { panic!("{outcome:?}") };
        assert!(reason.contains("busyguard.example.com"), "{reason}");
        assert_eq!(check_existing(&wider), Ok(()));
    }

    #[test]
    fn a_serving_pair_with_a_foreign_key_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        ensure(&request(dir.path())).unwrap();
        let other = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        std::fs::write(dir.path().join(TLS_KEY), other.serialize_pem()).unwrap();
        let reason = check_existing(&request(dir.path())).unwrap_err();
        assert!(reason.contains("certificate and key"), "{reason}");
    }
}
