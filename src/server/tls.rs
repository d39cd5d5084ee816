//! The certificate of the HTTPS metrics server: from `--tls-cert-file` and
//! `--tls-private-key-file` (a mounted Secret, e.g. cert-manager's), read again
//! every [`RELOAD_PERIOD`] and swapped in when it changed; or, without them,
//! a self-signed one generated at start-up.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::locks;

/// How often mounted certificate files are read for a change (a Secret's
/// mount changes within about a minute of the Secret).
pub const RELOAD_PERIOD: Duration = Duration::from_secs(10);

/// Where the serving certificate comes from.
#[derive(Debug, Clone)]
pub enum CertSource {
    /// A self-signed certificate, made at start-up, for these names.
    SelfSigned(Vec<String>),
    /// PEM files: the certificate (chain) and its private key.
    Files { cert: PathBuf, key: PathBuf },
}

fn tls_error(what: String) -> Error {
    Error::Config(format!("metrics TLS: {what}"))
}

/// The certificate in use, replaced by the reload task.
#[derive(Debug)]
pub struct Reloading {
    current: RwLock<Arc<CertifiedKey>>,
}

impl Reloading {
    fn get(&self) -> Arc<CertifiedKey> {
        locks::read(&self.current).clone()
    }

    fn set(&self, key: CertifiedKey) {
        *locks::write(&self.current) = Arc::new(key);
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.get())
    }
}

fn certified_key(
    certs: Vec<CertificateDer<'static>>,
    key: &PrivateKeyDer<'_>,
) -> Result<CertifiedKey> {
    if certs.is_empty() {
        return Err(tls_error("no certificate in the certificate file".into()));
    }
    let signing = rustls::crypto::ring::sign::any_supported_type(key)
        .map_err(|e| tls_error(format!("unusable private key: {e}")))?;
    let certified = CertifiedKey::new(certs, signing);
    certified
        .keys_match()
        .map_err(|e| tls_error(format!("the key does not match the certificate: {e}")))?;
    Ok(certified)
}

/// Parses a PEM certificate chain and a PEM private key.
pub fn from_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey> {
    let certs = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| tls_error(format!("certificate PEM: {e}")))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| tls_error(format!("private key PEM: {e}")))?;
    certified_key(certs, &key)
}

/// A self-signed certificate for `names` (DNS names or IP addresses), with
/// its key as PEM.
pub fn self_signed(names: &[String]) -> Result<(CertifiedKey, String)> {
    let generated = rcgen::generate_simple_self_signed(names.to_vec())
        .map_err(|e| tls_error(format!("generating a self-signed certificate: {e}")))?;
    let cert_pem = generated.cert.pem();
    let key = PrivateKeyDer::Pkcs8(generated.signing_key.serialize_der().into());
    Ok((
        certified_key(vec![generated.cert.der().clone()], &key)?,
        cert_pem,
    ))
}

fn read_pair(cert: &Path, key: &Path) -> Result<(Vec<u8>, Vec<u8>)> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|e| tls_error(format!("reading {}: {e}", path.display())))
    };
    Ok((read(cert)?, read(key)?))
}

/// The server's TLS configuration (HTTP/1.1) serving `resolver`'s certificate.
pub fn server_config(resolver: Arc<Reloading>) -> Result<Arc<ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The first certificate of `source` and, for files, a task that reads them
/// every `period` ([`RELOAD_PERIOD`]) and swaps in a changed pair, until
/// `shutdown`.
pub fn load(
    source: &CertSource,
    period: Duration,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(Arc<Reloading>, Option<impl Future<Output = ()> + use<>>)> {
    let (first, files) = match source {
        CertSource::SelfSigned(names) => {
            let (key, _) = self_signed(names)?;
            tracing::info!(?names, "metrics TLS: self-signed certificate generated");
            (key, None)
        }
        CertSource::Files { cert, key } => {
            let (cert_pem, key_pem) = read_pair(cert, key)?;
            let loaded = from_pem(&cert_pem, &key_pem)?;
            (loaded, Some((cert.clone(), key.clone(), cert_pem, key_pem)))
        }
    };
    let resolver = Arc::new(Reloading {
        current: RwLock::new(Arc::new(first)),
    });
    let reloading = resolver.clone();
    let reload = files.map(|(cert, key, mut cert_pem, mut key_pem)| async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = tick.tick() => {}
            }
            // Off the runtime's threads: a mount can be slow to read.
            let paths = (cert.clone(), key.clone());
            let read = tokio::task::spawn_blocking(move || read_pair(&paths.0, &paths.1)).await;
            let (new_cert, new_key) = match read {
                Ok(Ok(pair)) => pair,
                Ok(Err(err)) => {
                    tracing::warn!(error = %err, "metrics TLS: cannot read the certificate files; keeping the loaded certificate");
                    continue;
                }
                Err(err) => {
                    tracing::warn!(error = %err, "metrics TLS: the certificate read did not finish; keeping the loaded certificate");
                    continue;
                }
            };
            if new_cert == cert_pem && new_key == key_pem {
                continue;
            }
            // A Secret mount swaps both files at once; a half-written pair
            // fails to parse or to match and is tried again next time.
            match from_pem(&new_cert, &new_key) {
                Ok(loaded) => {
                    reloading.set(loaded);
                    (cert_pem, key_pem) = (new_cert, new_key);
                    tracing::info!(cert = %cert.display(), "metrics TLS: certificate reloaded");
                }
                Err(err) => {
                    tracing::warn!(error = %err, "metrics TLS: new certificate files not usable yet; keeping the loaded one");
                }
            }
        }
    });
    Ok((resolver, reload))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_round_trips_through_pem() {
        let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let (key, cert_pem) = self_signed(&names).expect("generate");
        assert_eq!(key.cert.len(), 1);
        assert!(cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
    }

    #[test]
    fn mismatched_or_missing_parts_are_refused() {
        let names = vec!["a.example".to_string()];
        let one = rcgen::generate_simple_self_signed(names.clone()).expect("generate");
        let two = rcgen::generate_simple_self_signed(names).expect("generate");
        let ok = from_pem(
            one.cert.pem().as_bytes(),
            one.signing_key.serialize_pem().as_bytes(),
        );
        assert!(ok.is_ok(), "{:?}", ok.err());
        let mismatched = from_pem(
            one.cert.pem().as_bytes(),
            two.signing_key.serialize_pem().as_bytes(),
        );
        assert!(mismatched.is_err(), "a key of another certificate");
        assert!(from_pem(b"", one.signing_key.serialize_pem().as_bytes()).is_err());
        assert!(from_pem(one.cert.pem().as_bytes(), b"junk").is_err());
    }

    #[tokio::test]
    async fn files_are_reloaded_when_they_change() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let write = |names: Vec<String>| {
            let made = rcgen::generate_simple_self_signed(names).expect("generate");
            std::fs::write(&cert, made.cert.pem()).expect("write");
            std::fs::write(&key, made.signing_key.serialize_pem()).expect("write");
            made.cert.der().clone()
        };
        let first = write(vec!["first.example".into()]);
        let (_tx, rx) = watch::channel(false);
        let source = CertSource::Files {
            cert: cert.clone(),
            key: key.clone(),
        };
        let period = Duration::from_millis(20);
        let (resolver, reload) = load(&source, period, rx).expect("load");
        server_config(resolver.clone()).expect("config");
        let current = |r: &Arc<Reloading>| Some(r.get().cert[0].clone());
        assert_eq!(current(&resolver), Some(first.clone()));
        tokio::spawn(reload.expect("a reload task for files"));
        let second = write(vec!["second.example".into()]);
        tokio::time::sleep(period * 10).await;
        assert_eq!(current(&resolver), Some(second.clone()));
        // A broken pair is not taken; the loaded certificate stays.
        std::fs::write(&key, "junk").expect("write");
        tokio::time::sleep(period * 10).await;
        assert_eq!(current(&resolver), Some(second));
    }
}
