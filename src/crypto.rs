//! The one crypto provider in the tree (ring), and a certificate with its key loaded from PEM:
//! shared by the serving side (`server::tls`) and the certificate writer (`certs`).

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// When a certificate (DER) expires: its `tbsCertificate.validity.notAfter`, read by walking the
/// few DER elements before it. `None` when it does not read as a certificate.
pub fn not_after(certificate: &[u8]) -> Option<jiff::Timestamp> {
    let (0x30, certificate, _) = element(certificate)? else { return None };
    let (0x30, tbs, _) = element(certificate)? else { return None };
    // [0] version (absent in v1), serialNumber, signature, issuer, then validity.
    let (tag, _, after_version) = element(tbs)?;
    let mut rest = if tag == 0xa0 { after_version } else { tbs };
    for _ in 0..3 {
        rest = element(rest)?.2;
    }
    let (0x30, validity, _) = element(rest)? else { return None };
    let (tag, time, _) = element(element(validity)?.2)?;
    let time = std::str::from_utf8(time).ok()?;
    // UTCTime YYMMDDHHMMSSZ (years 1950-2049), or GeneralizedTime YYYYMMDDHHMMSSZ.
    let time = match (tag, time.get(..2)?.parse::<u8>().ok()?) {
        (0x17, year) => format!("{}{time}", if year >= 50 { "19" } else { "20" }),
        (0x18, _) => time.to_string(),
        _ => return None,
    };
    let field = |from: usize, to: usize| time.get(from..to);
    let iso = format!(
        "{}-{}-{}T{}:{}:{}Z",
        field(0, 4)?,
        field(4, 6)?,
        field(6, 8)?,
        field(8, 10)?,
        field(10, 12)?,
        field(12, 14)?
    );
    iso.parse().ok()
}

/// One DER element of `input`: its tag, its contents, and what follows it.
fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (length, rest) = match first {
        short @ 0..0x80 => (usize::from(short), rest),
        long => {
            let bytes = usize::from(long & 0x7f);
            if bytes == 0 || bytes > 4 || rest.len() < bytes {
                return None;
            }
            (rest[..bytes].iter().fold(0, |length, b| (length << 8) | usize::from(*b)), &rest[bytes..])
        }
    };
    (rest.len() >= length).then(|| (tag, &rest[..length], &rest[length..]))
}

/// A certificate chain (PEM, leaf first) and its private key (PEM), checked to belong together.
pub fn certified_key(cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, CertError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CertError(format!("certificate file: {e}")))?;
    if chain.is_empty() {
        return Err(CertError("certificate file holds no PEM certificate".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| CertError(format!("key file: {e}")))?;
    CertifiedKey::from_der(chain, key, &provider()).map_err(|e| {
        CertError(match e {
            rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
                "the key file's private key is not the certificate's (a key of another pair?)".to_string()
            }
            e => format!("certificate and key: {e}"),
        })
    })
}

/// Why a certificate and key cannot serve: a reload keeps the pair in use, a start stops.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CertError(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_of_another_pair_is_said_plainly() {
        let pair = |name: &str| {
            let key = rcgen::KeyPair::generate().unwrap();
            let certificate = rcgen::CertificateParams::new(vec![name.into()]).unwrap().self_signed(&key).unwrap();
            (certificate.pem(), key.serialize_pem())
        };
        let ((certificate, _), (_, other_key)) = (pair("a"), pair("b"));
        let refused = certified_key(certificate.as_bytes(), other_key.as_bytes()).err().unwrap();
        assert_eq!(refused.0, "the key file's private key is not the certificate's (a key of another pair?)");
    }

    #[test]
    fn a_certificates_expiry_is_read_from_its_der() {
        for (year, month, day) in [(2027, 11, 25), (2051, 2, 3)] {
            let mut params = rcgen::CertificateParams::new(vec!["busyguard.busyguard.svc".into()]).unwrap();
            params.not_after = rcgen::date_time_ymd(year, month, day);
            let key = rcgen::KeyPair::generate().unwrap();
            let certificate = params.self_signed(&key).unwrap();
            let expected: jiff::Timestamp = format!("{year}-{month:02}-{day:02}T00:00:00Z").parse().unwrap();
            assert_eq!(
                not_after(certificate.der()),
                Some(expected),
                "{year}: UTCTime before 2050, GeneralizedTime after"
            );
        }
        assert_eq!(not_after(b"not a certificate"), None);
        assert_eq!(not_after(&[0x30, 0x82, 0xff]), None, "a length past the end");
    }
}
