//! TLS for client connections (rustls): `net.tls.mode` disabled, allowTLS, preferTLS or
//! requireTLS, the server's certificate and key from `net.tls.certificateKeyFile` (PEM), and
//! client certificates checked against `net.tls.CAFile` when one is given.
//!
//! allowTLS and preferTLS take both kinds of connection on one port: a TLS client's first
//! byte is a handshake record (0x16), which no MongoDB message starts with in practice (its
//! first byte is the low byte of a length of at least 16, and a 22-byte message is too short
//! to hold an OP_MSG with a command), so the first byte decides, as mongod does.

use common::{Code, Error, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// `net.tls.mode`: whether client connections use TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TlsMode {
    #[default]
    Disabled,
    /// TLS or plaintext, as each client chooses; connections to other members are
    /// plaintext.
    Allow,
    /// TLS or plaintext, as each client chooses; connections to other members use TLS.
    Prefer,
    /// TLS only: a plaintext connection is closed.
    Require,
}

impl TlsMode {
    pub fn parse(s: &str) -> Result<TlsMode> {
        match s {
            "disabled" => Ok(TlsMode::Disabled),
            "allowTLS" => Ok(TlsMode::Allow),
            "preferTLS" => Ok(TlsMode::Prefer),
            "requireTLS" => Ok(TlsMode::Require),
            other => Err(Error::new(Code::BadValue, format!("net.tls.mode must be disabled, allowTLS, preferTLS or requireTLS, not '{other}'"))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            TlsMode::Disabled => "disabled",
            TlsMode::Allow => "allowTLS",
            TlsMode::Prefer => "preferTLS",
            TlsMode::Require => "requireTLS",
        }
    }
}

/// `net.tls`.
#[derive(Clone, Debug, Default)]
pub struct TlsConfig {
    pub mode: TlsMode,
    /// PEM holding the server's certificate chain and its private key.
    pub certificate_key_file: Option<PathBuf>,
    /// PEM of the CAs that client certificates are checked against; without it, clients
    /// are not asked for one.
    pub ca_file: Option<PathBuf>,
    /// With a CA file: clients without a certificate are let in too.
    pub allow_connections_without_certificates: bool,
}

/// A client has this long to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The first byte of a TLS record carrying a handshake message.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// What accepts client connections: the mode, and the TLS configuration unless disabled.
pub struct Acceptor {
    mode: TlsMode,
    tls: Option<tokio_rustls::TlsAcceptor>,
}

impl Acceptor {
    pub fn new(config: &TlsConfig) -> Result<Acceptor> {
        if config.mode == TlsMode::Disabled {
            return Ok(Acceptor { mode: TlsMode::Disabled, tls: None });
        }
        let bad = |what: String| Error::new(Code::BadValue, what);
        let key_file = config.certificate_key_file.as_ref().ok_or_else(|| bad("net.tls.mode other than disabled needs net.tls.certificateKeyFile".into()))?;
        let (certs, key) = read_cert_and_key(key_file)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder =
            rustls::ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions().map_err(|e| bad(format!("TLS: {e}")))?;
        let builder = match &config.ca_file {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let roots = read_roots(ca)?;
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
                // mongod: with a CA file, clients must present a certificate unless
                // allowConnectionsWithoutCertificates says otherwise.
                let verifier = if config.allow_connections_without_certificates { verifier.allow_unauthenticated() } else { verifier };
                builder.with_client_cert_verifier(verifier.build().map_err(|e| bad(format!("TLS: {e}")))?)
            }
        };
        let server = builder.with_single_cert(certs, key).map_err(|e| bad(format!("TLS certificate and key of {}: {e}", key_file.display())))?;
        Ok(Acceptor { mode: config.mode, tls: Some(tokio_rustls::TlsAcceptor::from(Arc::new(server))) })
    }

    /// The connection as the client speaks it: TLS after a handshake, or plain where the
    /// mode allows. Err (the connection is dropped) for plaintext under requireTLS, a TLS
    /// client when TLS is disabled, or a failed or slow handshake.
    pub async fn accept(&self, stream: TcpStream) -> std::result::Result<Stream, String> {
        let Some(tls) = &self.tls else { return Ok(Stream::Plain(stream)) };
        let mut first = [0u8; 1];
        let wants_tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.peek(&mut first)).await {
            Ok(Ok(0)) => return Err("closed before its first byte".into()),
            Ok(Ok(_)) => first[0] == TLS_HANDSHAKE_RECORD,
            Ok(Err(e)) => return Err(format!("read error: {e}")),
            Err(_) => return Err("sent nothing within the TLS handshake timeout".into()),
        };
        if !wants_tls {
            return match self.mode {
                TlsMode::Require => Err("plaintext connection refused: net.tls.mode is requireTLS".into()),
                _ => Ok(Stream::Plain(stream)),
            };
        }
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(stream)).await {
            Ok(Ok(s)) => Ok(Stream::Tls(Box::new(s))),
            Ok(Err(e)) => Err(format!("TLS handshake failed: {e}")),
            Err(_) => Err("TLS handshake timed out".into()),
        }
    }
}

/// How this member connects to the others: TLS under preferTLS and requireTLS (mongod's
/// rule for the connections a server opens), verified against net.tls.CAFile and showing
/// the member's own certificate. Set once at startup.
static MEMBER_CLIENT: std::sync::OnceLock<tokio_rustls::TlsConnector> = std::sync::OnceLock::new();

/// Set up `MEMBER_CLIENT` from the configuration, when members must use TLS (a replica-set
/// member under preferTLS or requireTLS).
pub fn init_member_client(config: &TlsConfig) -> Result<()> {
    if !matches!(config.mode, TlsMode::Prefer | TlsMode::Require) {
        return Ok(());
    }
    let bad = |what: String| Error::new(Code::BadValue, what);
    let ca = config
        .ca_file
        .as_ref()
        .ok_or_else(|| bad("members connect to each other with TLS under preferTLS and requireTLS, and need net.tls.CAFile to verify each other".into()))?;
    let roots = read_roots(ca)?;
    let (certs, key) = read_cert_and_key(config.certificate_key_file.as_ref().ok_or_else(|| bad("net.tls.certificateKeyFile is missing".into()))?)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .map_err(|e| bad(format!("TLS client certificate: {e}")))?;
    let _ = MEMBER_CLIENT.set(tokio_rustls::TlsConnector::from(Arc::new(client)));
    Ok(())
}

/// The TLS connector members use to reach each other, when they must.
pub fn member_client() -> Option<&'static tokio_rustls::TlsConnector> {
    MEMBER_CLIENT.get()
}

fn read_roots(ca: &std::path::Path) -> Result<rustls::RootCertStore> {
    let bad = |what: String| Error::new(Code::BadValue, what);
    let pem = std::fs::read(ca).map_err(|e| bad(format!("cannot read net.tls.CAFile {}: {e}", ca.display())))?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&pem) {
        let c = c.map_err(|e| bad(format!("bad certificate in {}: {e:?}", ca.display())))?;
        roots.add(c).map_err(|e| bad(format!("bad CA certificate in {}: {e}", ca.display())))?;
    }
    Ok(roots)
}

fn read_cert_and_key(key_file: &std::path::Path) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let bad = |what: String| Error::new(Code::BadValue, what);
    let pem = std::fs::read(key_file).map_err(|e| bad(format!("cannot read net.tls.certificateKeyFile {}: {e}", key_file.display())))?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| bad(format!("bad certificate in {}: {e:?}", key_file.display())))?;
    if certs.is_empty() {
        return Err(bad(format!("no certificate in net.tls.certificateKeyFile {}", key_file.display())));
    }
    let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| bad(format!("no private key in net.tls.certificateKeyFile {}: {e:?}", key_file.display())))?;
    Ok((certs, key))
}

/// A connection, plain or TLS: `Stream` for clients' connections here, and members'
/// connections to others (`repl::peer`) with the client side's TLS stream.
pub enum MaybeTls<T> {
    Plain(TcpStream),
    Tls(Box<T>),
}

/// A client connection, plain or TLS.
pub type Stream = MaybeTls<tokio_rustls::server::TlsStream<TcpStream>>;

impl Stream {
    /// The subject of the client's certificate, verified against net.tls.CAFile during
    /// the handshake (None without one).
    pub fn peer_subject(&self) -> Option<String> {
        let Stream::Tls(s) = self else { return None };
        let cert = s.get_ref().1.peer_certificates()?.first()?;
        crate::x509::subject_name(cert.as_ref())
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for MaybeTls<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_read(cx, buf),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for MaybeTls<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_write(cx, buf),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_flush(cx),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_shutdown(cx),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[std::io::IoSlice<'_>]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            MaybeTls::Plain(s) => s.is_write_vectored(),
            MaybeTls::Tls(s) => s.is_write_vectored(),
        }
    }
}
