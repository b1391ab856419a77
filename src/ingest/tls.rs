//! TLS for the broker connection: rustls with the ring provider, the
//! configured CA (or the bundled Mozilla roots), an optional client
//! certificate for mutual TLS, an optional server name to verify instead of
//! the URL's host, and, for labs only, no verification at all.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::config::MqttTls;

/// Why TLS could not be set up (a configuration problem: exit 78).
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("mqtt.tls.{key}: cannot read {path}: {source}")]
    Read {
        key: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("mqtt.tls.{key}: {message}")]
    Invalid { key: &'static str, message: String },
}

fn read(key: &'static str, path: &std::path::Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        key,
        path: path.display().to_string(),
        source,
    })
}

fn invalid(key: &'static str, message: impl ToString) -> TlsError {
    TlsError::Invalid {
        key,
        message: message.to_string(),
    }
}

fn certificates(key: &'static str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(key, format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(invalid(key, "no certificate in the file"));
    }
    Ok(certs)
}

/// The rustls client configuration for `tls`.
pub fn client_config(tls: &MqttTls) -> Result<ClientConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    match &tls.ca_file {
        Some(path) => {
            for cert in certificates("ca_file", &read("ca_file", path)?)? {
                roots
                    .add(cert)
                    .map_err(|e| invalid("ca_file", format!("unusable CA certificate: {e}")))?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let verifier: Arc<dyn ServerCertVerifier> = if tls.insecure_skip_verify {
        Arc::new(NoVerification(provider.clone()))
    } else {
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|e| invalid("ca_file", e))?;
        match &tls.server_name {
            Some(name) => Arc::new(FixedName {
                inner: webpki,
                name: ServerName::try_from(name.clone()).map_err(|e| invalid("server_name", e))?,
            }),
            None => webpki,
        }
    };
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid("ca_file", e))?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => {
            let chain = certificates("cert_file", &read("cert_file", cert)?)?;
            let key = PrivateKeyDer::from_pem_slice(&read("key_file", key)?)
                .map_err(|e| invalid("key_file", format!("no usable private key: {e}")))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| invalid("cert_file", e))
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

/// Verifies the certificate against a configured name instead of the host
/// palletd connected to.
#[derive(Debug)]
struct FixedName {
    inner: Arc<WebPkiServerVerifier>,
    name: ServerName<'static>,
}

impl ServerCertVerifier for FixedName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner
            .verify_server_cert(end_entity, intermediates, &self.name, ocsp, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Accepts any certificate (`insecure_skip_verify`); handshake signatures
/// are still checked, so the peer holds the key of what it presented.
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
