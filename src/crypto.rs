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

/// A certificate chain (PEM, leaf first) and its private key (PEM), checked to belong together.
pub fn certified_key(cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, String> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("certificate file: {e}"))?;
    if chain.is_empty() {
        return Err("certificate file holds no PEM certificate".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| format!("key file: {e}"))?;
    CertifiedKey::from_der(chain, key, &provider()).map_err(|e| format!("certificate and key: {e}"))
}
