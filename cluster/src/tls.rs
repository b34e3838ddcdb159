//! TLS between nodes (rustls through ractor_cluster's `IncomingEncryptionMode::Tls` and
//! `client_connect_enc`), with certificates and keys read from PEM files, and [`generate`] to
//! make a private CA and a node certificate for tests and small deployments (`fedshard cert`).
//!
//! The server node always presents a certificate, which client nodes check against a CA they
//! are given (`--tls-ca`): the secret authenticates a node to the federation, TLS keeps the
//! traffic private and tells a client node it reached the real server. Mutual TLS is optional:
//! a server given `--tls-client-ca` accepts only client nodes whose certificate that CA signed.
//!
//! The crypto provider is ring, named explicitly: the build also carries aws-lc-rs (through
//! tokio-rustls's defaults in ractor_cluster), and with two providers compiled in, rustls
//! cannot pick a process default by itself.

use crate::error::Error;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use time::OffsetDateTime;
use tokio_rustls::{TlsAcceptor, TlsConnector};

pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A [`Error::Pem`] about the file `path`.
fn pem(what: &'static str, path: &Path, reason: impl ToString) -> Error {
    Error::Pem {
        what,
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let file = |e: rustls::pki_types::pem::Error| pem("certificate file", path, e);
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(file)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(file)?;
    if certs.is_empty() {
        return Err(pem("certificate file", path, "no PEM certificate in it"));
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, Error> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| pem("key file", path, e))
}

fn roots(path: &Path) -> Result<Arc<RootCertStore>, Error> {
    let mut store = RootCertStore::empty();
    for cert in certificates(path)? {
        store.add(cert).map_err(|e| pem("CA file", path, e))?;
    }
    Ok(Arc::new(store))
}

/// The server node's side: its certificate chain and key, and the CA of client certificates
/// when client nodes must present one.
pub fn acceptor(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<TlsAcceptor, Error> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?;
    let builder = match client_ca {
        Some(ca) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(roots(ca)?, provider())
                .build()
                .map_err(|e| pem("client CA", ca, e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let config = builder
        .with_single_cert(certificates(cert)?, private_key(key)?)
        .map_err(|e| identity(cert, key, e))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A client node's side: the CA that signed the server's certificate, and the node's own
/// certificate and key when the server asks for one.
pub fn connector(ca: &Path, own: Option<(&Path, &Path)>) -> Result<TlsConnector, Error> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?
        .with_root_certificates(roots(ca)?);
    let config = match own {
        Some((cert, key)) => builder
            .with_client_auth_cert(certificates(cert)?, private_key(key)?)
            .map_err(|e| identity(cert, key, e))?,
        None => builder.with_no_client_auth(),
    };
    Ok(TlsConnector::from(Arc::new(config)))
}

fn identity(cert: &Path, key: &Path, e: rustls::Error) -> Error {
    Error::Identity {
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
        reason: e.to_string(),
    }
}

/// The name a client node expects in the server's certificate: an IP address or a DNS name.
pub fn server_name(name: &str) -> Result<ServerName<'static>, Error> {
    ServerName::try_from(name.to_string()).map_err(|e| Error::ServerName {
        name: name.to_string(),
        reason: e.to_string(),
    })
}

/// The files [`generate`] writes.
#[derive(Debug, Clone)]
pub struct Generated {
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    pub node_cert: PathBuf,
    pub node_key: PathBuf,
}

/// The longest validity `generate` gives (ten years).
pub const MAX_DAYS: u32 = 3650;

/// From a day before now to `days` days after now.
fn validity(days: u32) -> Result<(OffsetDateTime, OffsetDateTime), Error> {
    if days == 0 {
        return Err(Error::NoValidity);
    }
    if days > MAX_DAYS {
        return Err(Error::ValidityTooLong(days));
    }
    let now = OffsetDateTime::now_utc();
    Ok((
        now - time::Duration::days(1),
        now + time::Duration::days(i64::from(days)),
    ))
}

/// Writes a new private CA (`ca.pem`, `ca-key.pem`) and one node certificate it signs
/// (`node.pem`, `node-key.pem`), valid for every name in `names` (IP addresses or DNS names)
/// as a server and as a client, into `dir`. Keys are written readable by their owner only.
///
/// One certificate for every node keeps a small deployment simple; give each machine its own
/// by running this once per machine with the same CA kept aside (or use your own PKI).
///
/// Both certificates are valid from a day before now (nodes' clocks may disagree) until `days`
/// days after now: rcgen's default was the year 4096, a certificate that never expires.
///
/// Files already in `dir` are replaced only if `replace`: a new CA silently replacing the one
/// every node trusts would cut them all off.
pub fn generate(
    dir: &Path,
    names: &[String],
    days: u32,
    replace: bool,
) -> Result<Generated, Error> {
    if names.is_empty() {
        return Err(Error::NoCertificateNames);
    }
    for name in names {
        check_certificate_name(name)?;
    }
    let (not_before, not_after) = validity(days)?;
    let files = Generated {
        ca_cert: dir.join("ca.pem"),
        ca_key: dir.join("ca-key.pem"),
        node_cert: dir.join("node.pem"),
        node_key: dir.join("node-key.pem"),
    };
    let existing: Vec<String> = [
        &files.ca_cert,
        &files.ca_key,
        &files.node_cert,
        &files.node_key,
    ]
    .into_iter()
    .filter(|path| path.exists())
    .filter_map(|path| Some(path.file_name()?.to_string_lossy().into_owned()))
    .collect();
    if !replace && !existing.is_empty() {
        return Err(Error::CertificatesExist {
            dir: dir.to_path_buf(),
            files: existing,
        });
    }
    let err = |what: &'static str, e: rcgen::Error| Error::Certificate {
        what,
        reason: e.to_string(),
    };
    let mut ca_params =
        CertificateParams::new(Vec::<String>::new()).map_err(|e| err("CA parameters", e))?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    (ca_params.not_before, ca_params.not_after) = (not_before, not_after);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "fedshard private CA");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().map_err(|e| err("CA key", e))?;
    let ca_cert = ca_params
        .self_signed(&ca_key)
        .map_err(|e| err("CA certificate", e))?;
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(ca_params, ca_key);

    let mut params =
        CertificateParams::new(names.to_vec()).map_err(|e| err("certificate names", e))?;
    params
        .distinguished_name
        .push(DnType::CommonName, names[0].clone());
    params.use_authority_key_identifier_extension = true;
    (params.not_before, params.not_after) = (not_before, not_after);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let key = KeyPair::generate().map_err(|e| err("node key", e))?;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|e| err("node certificate", e))?;

    std::fs::create_dir_all(dir).map_err(|e| Error::Write {
        path: dir.to_path_buf(),
        reason: e.to_string(),
    })?;
    write(&files.ca_cert, &ca_cert.pem(), false)?;
    write(&files.ca_key, &ca_key_pem, true)?;
    write(&files.node_cert, &cert.pem(), false)?;
    write(&files.node_key, &key.serialize_pem(), true)?;
    Ok(files)
}

/// A certificate name is an IP address or a DNS name (letters, digits and hyphens in labels of
/// at most 63, a leading `*.` allowed); `300.1.1.1` is neither, though rcgen would take it as a
/// DNS name no client could ever match.
fn check_certificate_name(name: &str) -> Result<(), Error> {
    let refuse = |reason| {
        Err(Error::CertificateName {
            name: name.to_string(),
            reason,
        })
    };
    if name.parse::<std::net::IpAddr>().is_ok() {
        return Ok(());
    }
    if name.is_empty() {
        return refuse("it is empty");
    }
    if name.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return refuse(
            "it looks like an IPv4 address, but each of its four parts must be 0 to 255",
        );
    }
    if name.len() > 253 {
        return refuse("a DNS name has at most 253 characters");
    }
    let mut labels = name.strip_prefix("*.").unwrap_or(name).split('.');
    for label in labels.clone() {
        if label.is_empty() || label.len() > 63 {
            return refuse("each dot-separated part of a DNS name has 1 to 63 characters");
        }
        if !label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            || label.starts_with('-')
            || label.ends_with('-')
        {
            return refuse(
                "a DNS name has letters, digits and inner hyphens only (or is an IP address)",
            );
        }
    }
    if labels
        .next_back()
        .is_some_and(|top| top.chars().all(|c| c.is_ascii_digit()))
    {
        return refuse("the last part of a DNS name is not all digits");
    }
    Ok(())
}

fn write(path: &Path, text: &str, private: bool) -> Result<(), Error> {
    let io = |e: std::io::Error| Error::Write {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = private;
    use std::io::Write;
    options
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificates_expire_after_the_days_asked_for() {
        let (from, until) = validity(30).unwrap();
        assert_eq!((until - from).whole_days(), 31);
        assert!(from < OffsetDateTime::now_utc() && until > OffsetDateTime::now_utc());
        let dir = tempfile::tempdir().unwrap();
        let refused = generate(dir.path(), &["127.0.0.1".into()], 0, false).unwrap_err();
        assert_eq!(refused, Error::NoValidity);
        let refused = refused.to_string();
        assert!(refused.contains("at least one day"), "{refused}");
        let refused = generate(dir.path(), &["127.0.0.1".into()], 1_000_000, false).unwrap_err();
        assert_eq!(refused, Error::ValidityTooLong(1_000_000));
        assert!(refused.to_string().contains("at most 3650"), "{refused}");
        generate(dir.path(), &["127.0.0.1".into()], MAX_DAYS, false).unwrap();
    }

    #[test]
    fn every_name_is_an_ip_address_or_a_dns_name() {
        for good in [
            "127.0.0.1",
            "::1",
            "localhost",
            "node-1.example.org",
            "*.example.org",
        ] {
            check_certificate_name(good).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        for bad in [
            "",
            "300.1.1.1",
            "1.2.3",
            "a..b",
            "-a.org",
            "a_b.org",
            "exa mple",
            "a.123",
        ] {
            let error = check_certificate_name(bad).unwrap_err();
            assert!(
                error.to_string().contains(&format!("`{bad}`")),
                "{bad}: {error}"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let error = generate(dir.path(), &["127.0.0.1".into(), "".into()], 30, false).unwrap_err();
        assert!(matches!(error, Error::CertificateName { .. }), "{error:?}");
    }

    #[test]
    fn an_existing_ca_is_replaced_only_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let names = ["127.0.0.1".to_string()];
        let first = generate(dir.path(), &names, 30, false).unwrap();
        let ca = std::fs::read(&first.ca_cert).unwrap();
        let error = generate(dir.path(), &names, 30, false).unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains("ca.pem") && text.contains("--force"),
            "{text}"
        );
        assert_eq!(
            std::fs::read(&first.ca_cert).unwrap(),
            ca,
            "the CA was touched"
        );
        generate(dir.path(), &names, 30, true).unwrap();
        assert_ne!(std::fs::read(&first.ca_cert).unwrap(), ca);
    }

    #[test]
    fn generated_files_make_a_server_and_a_client_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let files = generate(
            dir.path(),
            &["127.0.0.1".into(), "localhost".into()],
            365,
            false,
        )
        .unwrap();
        acceptor(&files.node_cert, &files.node_key, None).unwrap();
        acceptor(&files.node_cert, &files.node_key, Some(&files.ca_cert)).unwrap();
        connector(&files.ca_cert, None).unwrap();
        connector(&files.ca_cert, Some((&files.node_cert, &files.node_key))).unwrap();
        server_name("127.0.0.1").unwrap();
        server_name("localhost").unwrap();
        // A key file where a certificate should be is an error naming the file.
        let Err(wrong) = acceptor(&files.node_key, &files.node_key, None) else {
            panic!("a key file taken for a certificate was accepted");
        };
        assert!(wrong.to_string().contains("node-key.pem"), "{wrong}");
    }

    /// A real handshake over loopback: the client trusts the generated CA and the name.
    #[tokio::test]
    async fn a_client_trusting_the_ca_completes_a_handshake() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let files = generate(dir.path(), &["127.0.0.1".into()], 365, false).unwrap();
        let acceptor = acceptor(&files.node_cert, &files.node_key, None).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut tls = acceptor.accept(tcp).await.unwrap();
            let mut buf = [0u8; 5];
            tls.read_exact(&mut buf).await.unwrap();
            buf
        });
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let connector = connector(&files.ca_cert, None).unwrap();
        let mut tls = connector
            .connect(server_name("127.0.0.1").unwrap(), tcp)
            .await
            .unwrap();
        tls.write_all(b"hello").await.unwrap();
        tls.flush().await.unwrap();
        assert_eq!(&server.await.unwrap(), b"hello");

        // Another CA's client refuses the server.
        let other = tempfile::tempdir().unwrap();
        let other = generate(other.path(), &["127.0.0.1".into()], 365, false).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor2 = super::acceptor(&files.node_cert, &files.node_key, None).unwrap();
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let _ = acceptor2.accept(tcp).await;
        });
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let untrusting = super::connector(&other.ca_cert, None).unwrap();
        assert!(
            untrusting
                .connect(server_name("127.0.0.1").unwrap(), tcp)
                .await
                .is_err()
        );
    }

    /// Mutual TLS: a server given a client CA accepts a client presenting a certificate it
    /// signed, and refuses one presenting none.
    #[tokio::test]
    async fn a_server_with_a_client_ca_needs_a_client_certificate() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let files = generate(dir.path(), &["127.0.0.1".into()], 365, false).unwrap();
        for with_identity in [true, false] {
            let acceptor =
                acceptor(&files.node_cert, &files.node_key, Some(&files.ca_cert)).unwrap();
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let server = tokio::spawn(async move {
                let (tcp, _) = listener.accept().await.unwrap();
                let mut tls = acceptor.accept(tcp).await.ok()?;
                let mut buf = [0u8; 2];
                tls.read_exact(&mut buf).await.ok()?;
                Some(buf)
            });
            let identity =
                with_identity.then_some((files.node_cert.as_path(), files.node_key.as_path()));
            let connector = connector(&files.ca_cert, identity).unwrap();
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            if let Ok(mut tls) = connector
                .connect(server_name("127.0.0.1").unwrap(), tcp)
                .await
            {
                let _ = tls.write_all(b"hi").await;
                let _ = tls.flush().await;
            }
            let received = server.await.unwrap();
            assert_eq!(
                received.is_some(),
                with_identity,
                "identity: {with_identity}"
            );
        }
    }
}
