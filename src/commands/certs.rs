//! `busyguard certs`: a CA and an ECDSA P-256 serving certificate for development and for
//! clusters that manage their own webhook certificates. Valid files are kept unless forced.

use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use clap::Args;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    PKCS_ECDSA_P256_SHA256, SanType,
};
use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::crypto::{CertError, certified_key, provider};

#[derive(Debug, Args)]
pub struct CertsArgs {
    /// Folder for ca.crt, ca.key, tls.crt and tls.key.
    #[arg(long, env = "BUSYGUARD_CERTS_DIR", default_value = "certs")]
    pub dir: PathBuf,
    /// DNS names of the serving certificate.
    #[arg(
        long = "dns",
        env = "BUSYGUARD_CERTS_DNS",
        value_delimiter = ',',
        default_value = "localhost,busyguard,busyguard.busyguard,busyguard.busyguard.svc,busyguard.busyguard.svc.cluster.local",
        value_parser = dns_name
    )]
    pub dns_names: Vec<String>,
    /// IP addresses of the serving certificate.
    #[arg(long = "ip", env = "BUSYGUARD_CERTS_IPS", value_delimiter = ',', default_value = "127.0.0.1,::1")]
    pub ips: Vec<IpAddr>,
    /// No IP addresses in the serving certificate (for a Service, reached by name).
    #[arg(long, conflicts_with = "ips")]
    pub no_ip: bool,
    /// Validity of new certificates, in days.
    #[arg(long, env = "BUSYGUARD_CERTS_VALID_DAYS", default_value_t = 365, value_parser = clap::value_parser!(u32).range(2..=3650))]
    pub valid_days: u32,
    /// Write a new CA and serving pair even when the files there are still valid (rotation).
    /// Without it, a serving pair that no longer fits (a name added) is issued again under the
    /// CA already there, so the registered caBundle stays good.
    #[arg(long)]
    pub force: bool,
}

impl From<CertsArgs> for CertsRequest {
    fn from(args: CertsArgs) -> Self {
        CertsRequest {
            dir: args.dir,
            dns_names: args.dns_names,
            ips: if args.no_ip { Vec::new() } else { args.ips },
            valid_days: args.valid_days,
            force: args.force,
        }
    }
}

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
    /// A new serving pair under the CA already there (a caBundle made from it stays good),
    /// because the old pair was not usable (why).
    NewServingPair { why: String },
    /// A new CA and serving pair: asked for (`--force`), none there yet, or the CA there could
    /// not issue (why).
    NewCa { why: Option<String> },
}

pub fn ensure(request: &CertsRequest) -> anyhow::Result<CertsOutcome> {
    if request.force {
        write_new(request, None)?;
        return Ok(CertsOutcome::NewCa { why: None });
    }
    let problem = match check_existing(request) {
        Ok(()) => return Ok(CertsOutcome::Kept),
        Err(NotKept(problem)) => problem,
    };
    // The CA stays when it can issue: a changed name must not make the registered caBundle stale.
    if let Some(issuer) = existing_ca(&request.dir) {
        write_new(request, Some(issuer))?;
        if check_existing(request).is_ok() {
            return Ok(CertsOutcome::NewServingPair { why: problem });
        }
    }
    let nothing_there = !request.dir.join(CA_CERT).exists() && !request.dir.join(TLS_CERT).exists();
    write_new(request, None)?;
    Ok(CertsOutcome::NewCa { why: (!nothing_there).then_some(problem) })
}

/// The CA of the folder, to issue with: its key, and the name busyguard gives its CAs (a pair it
/// issues is checked against `ca.crt` before it counts).
fn existing_ca(dir: &Path) -> Option<Issuer<'static, KeyPair>> {
    let key = KeyPair::from_pem(&std::fs::read_to_string(dir.join(CA_KEY)).ok()?).ok()?;
    dir.join(CA_CERT).exists().then(|| Issuer::new(ca_params(time::OffsetDateTime::now_utc(), 1), key))
}

/// A DNS name a certificate may carry (`*.` allowed in front), else why not.
pub fn dns_name(name: &str) -> Result<String, String> {
    let checked = name.strip_prefix("*.").unwrap_or(name);
    match rustls_pki_types::DnsName::try_from(checked) {
        Ok(_) if !checked.is_empty() => Ok(name.to_string()),
        _ => Err(format!("{name:?} is not a DNS name (letters, digits, '-' and '.', e.g. busyguard.busyguard.svc)")),
    }
}

fn names(request: &CertsRequest) -> impl Iterator<Item = String> + '_ {
    request.dns_names.iter().cloned().chain(request.ips.iter().map(IpAddr::to_string))
}

/// Why the files in the folder are not kept (and a new pair is issued).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
struct NotKept(String);

impl From<String> for NotKept {
    fn from(why: String) -> Self {
        NotKept(why)
    }
}

impl From<&str> for NotKept {
    fn from(why: &str) -> Self {
        NotKept(why.to_string())
    }
}

impl From<CertError> for NotKept {
    fn from(e: CertError) -> Self {
        NotKept(e.0)
    }
}

/// `Ok` when the serving pair chains to the CA in the folder and stays valid for every name.
fn check_existing(request: &CertsRequest) -> Result<(), NotKept> {
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
        verifier.verify_server_cert(leaf, intermediates, &server_name, &[], at).map_err(|e| match e {
            rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName | rustls::CertificateError::NotValidForNameContext { .. },
            ) => format!("{TLS_CERT} does not name {name}"),
            e => format!("{TLS_CERT} is not valid for {name} for another day: {e}"),
        })?;
    }
    Ok(())
}

fn ca_params(now: time::OffsetDateTime, valid_days: u32) -> CertificateParams {
    let mut ca = CertificateParams::default();
    ca.distinguished_name.push(DnType::CommonName, "busyguard webhook CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    ca.not_before = now - time::Duration::hours(1);
    ca.not_after = now + time::Duration::days(i64::from(valid_days));
    ca
}

/// A serving pair issued by `ca`, or by a new CA written beside it when `None`.
fn write_new(request: &CertsRequest, ca: Option<Issuer<'static, KeyPair>>) -> anyhow::Result<()> {
    let now = time::OffsetDateTime::now_utc();
    let not_after = now + time::Duration::days(i64::from(request.valid_days));
    std::fs::create_dir_all(&request.dir).with_context(|| format!("creating {}", request.dir.display()))?;
    let issuer = match ca {
        Some(issuer) => issuer,
        None => {
            let ca_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
            let ca = ca_params(now, request.valid_days);
            let ca_cert = ca.self_signed(&ca_key)?;
            write_atomically(&request.dir, CA_KEY, ca_key.serialize_pem().as_bytes(), 0o600)?;
            write_atomically(&request.dir, CA_CERT, ca_cert.pem().as_bytes(), 0o644)?;
            Issuer::new(ca, ca_key)
        }
    };

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

    // The CA first, the key next and the serving certificate last: a server watching the folder
    // then sees a complete pair at its next look.
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
        assert_eq!(ensure(&request(dir.path())).unwrap(), CertsOutcome::NewCa { why: None }, "nothing there before");
        for name in [CA_CERT, CA_KEY, TLS_CERT, TLS_KEY] {
            assert!(dir.path().join(name).exists(), "{name}");
        }
        assert_eq!(check_existing(&request(dir.path())), Ok(()));
        let key_mode = std::fs::metadata(dir.path().join(TLS_KEY)).unwrap().permissions();
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&key_mode) & 0o777, 0o600);
    }

    #[test]
    fn valid_files_are_kept_and_force_replaces_them_ca_and_all() {
        let dir = tempfile::tempdir().unwrap();
        ensure(&request(dir.path())).unwrap();
        let read = |name: &str| std::fs::read(dir.path().join(name)).unwrap();
        let (ca, serving) = (read(CA_CERT), read(TLS_CERT));
        assert_eq!(ensure(&request(dir.path())).unwrap(), CertsOutcome::Kept);
        assert_eq!(read(TLS_CERT), serving);

        let forced = CertsRequest { force: true, ..request(dir.path()) };
        assert_eq!(ensure(&forced).unwrap(), CertsOutcome::NewCa { why: None });
        assert_ne!((read(CA_CERT), read(TLS_CERT)), (ca, serving));
    }

    #[test]
    fn a_new_name_gets_a_new_serving_pair_under_the_same_ca() {
        let dir = tempfile::tempdir().unwrap();
        ensure(&request(dir.path())).unwrap();
        let ca = std::fs::read(dir.path().join(CA_CERT)).unwrap();
        let mut wider = request(dir.path());
        wider.dns_names.push("busyguard.example.com".into());
        let outcome = ensure(&wider).unwrap();
        let CertsOutcome::NewServingPair { why } = outcome else { panic!("{outcome:?}") };
        assert_eq!(why, "tls.crt does not name busyguard.example.com");
        assert_eq!(check_existing(&wider), Ok(()));
        assert_eq!(std::fs::read(dir.path().join(CA_CERT)).unwrap(), ca, "the registered caBundle stays good");
    }

    #[test]
    fn a_ca_that_cannot_issue_is_replaced_and_said_so() {
        let dir = tempfile::tempdir().unwrap();
        ensure(&request(dir.path())).unwrap();
        // Its key lost: another one in its place cannot sign for the ca.crt there.
        let other = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        std::fs::write(dir.path().join(CA_KEY), other.serialize_pem()).unwrap();
        std::fs::remove_file(dir.path().join(TLS_CERT)).unwrap();
        let outcome = ensure(&request(dir.path())).unwrap();
        assert!(matches!(outcome, CertsOutcome::NewCa { why: Some(_) }), "{outcome:?}");
        assert_eq!(check_existing(&request(dir.path())), Ok(()));
    }

    #[test]
    fn only_dns_names_are_taken() {
        for good in ["localhost", "busyguard.busyguard.svc", "*.example.com", "a-b.c1"] {
            assert_eq!(dns_name(good).as_deref(), Ok(good));
        }
        for bad in ["bad name!", "", "*", "a..b", "under_score.example.com/x"] {
            let said = dns_name(bad).unwrap_err();
            assert!(said.contains("is not a DNS name"), "{bad}: {said}");
        }
    }

    #[test]
    fn a_serving_pair_with_a_foreign_key_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        ensure(&request(dir.path())).unwrap();
        let other = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        std::fs::write(dir.path().join(TLS_KEY), other.serialize_pem()).unwrap();
        let reason = check_existing(&request(dir.path())).unwrap_err().0;
        assert!(reason.contains("is not the certificate's"), "{reason}");
    }
}
