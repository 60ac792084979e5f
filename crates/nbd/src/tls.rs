//! TLS for NBD exports, as nbdkit offers it (NBD `doc/proto.md`, "TLS support" and
//! `NBD_OPT_STARTTLS`): x509 certificates from a directory, optionally requiring a client
//! certificate signed by the CA, or pre-shared keys in GnuTLS `psktool` format.
//!
//! ```text
//!  --tls-certificates DIR   DIR/server-cert.pem, DIR/server-key.pem (+ DIR/ca-cert.pem,
//!                           needed with --tls-verify-peer: clients must present a
//!                           certificate signed by it)
//!  --tls-psk FILE           lines "username:hexkey"; the client names its username
//! ```
//!
//! **Why OpenSSL.** The clients that matter (libnbd's `nbdcopy`/`nbdinfo`, qemu, nbdkit's
//! own clients) speak TLS with x509 *and* with pre-shared keys (TLS-PSK). rustls has no PSK
//! support at all; the `openssl` crate over the system's OpenSSL 3 (Debian's `libssl-dev`)
//! does both through one `SslAcceptor` (`set_psk_server_callback` for PSK), and is the
//! library every distribution already patches. The TLS session is only the wire; nothing
//! of the volume's encryption goes through it.
//!
//! Secrets: PSK keys are kept in zeroizing memory, never formatted (`Debug` of
//! [`TlsConfig`] names the kind and mode only), and errors about the PSK file name the file
//! and line, never its content.

use crate::handshake::TlsMode;
use crate::NbdError;
use openssl::ssl::{
    SslAcceptor, SslFiletype, SslMethod, SslOptions, SslStream, SslVerifyMode, SslVersion,
};
use openssl::x509::X509Name;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// Longest PSK accepted (OpenSSL's `PSK_MAX_PSK_LEN`).
const MAX_PSK_BYTES: usize = 512;

/// What the server authenticates with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsKind {
    /// x509 certificates (server certificate; client certificates when verifying peers).
    X509 {
        /// Clients must present a certificate signed by `ca-cert.pem`.
        verify_peer: bool,
    },
    /// Pre-shared keys.
    Psk,
}

/// A TLS server configuration: the mode ([`TlsMode::On`] or [`TlsMode::Require`]) and the
/// credentials. Build one with [`TlsConfig::x509`] or [`TlsConfig::psk`].
pub struct TlsConfig {
    mode: TlsMode,
    kind: TlsKind,
    acceptor: SslAcceptor,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the keys: only what kind of credentials and the mode.
        f.debug_struct("TlsConfig")
            .field("mode", &self.mode)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl TlsConfig {
    /// x509 credentials from `dir`, laid out as nbdkit's `--tls-certificates`:
    /// `server-cert.pem` (the certificate, optionally followed by its chain),
    /// `server-key.pem`, and with `verify_peer` also `ca-cert.pem`, which must have signed
    /// every client's certificate (clients without one are refused).
    ///
    /// # Errors
    /// [`NbdError::TlsFile`] for a missing file, [`NbdError::TlsSetup`] if OpenSSL refuses
    /// a file (not PEM, key not matching the certificate), [`NbdError::Export`] if `mode`
    /// is [`TlsMode::Off`].
    pub fn x509(dir: &Path, verify_peer: bool, mode: TlsMode) -> Result<TlsConfig, NbdError> {
        let file = |name: &str| -> Result<PathBuf, NbdError> {
            let p = dir.join(name);
            std::fs::metadata(&p).map_err(|source| NbdError::TlsFile {
                path: p.clone(),
                source,
            })?;
            Ok(p)
        };
        let cert = file("server-cert.pem")?;
        let key = file("server-key.pem")?;
        let mut b = builder()?;
        b.set_certificate_chain_file(&cert)
            .map_err(setup(format!("loading certificate {}", cert.display())))?;
        b.set_private_key_file(&key, SslFiletype::PEM)
            .map_err(setup(format!("loading private key {}", key.display())))?;
        b.check_private_key().map_err(setup(format!(
            "private key {} does not match certificate {}",
            key.display(),
            cert.display()
        )))?;
        if verify_peer {
            let ca = file("ca-cert.pem")?;
            b.set_ca_file(&ca)
                .map_err(setup(format!("loading CA certificate {}", ca.display())))?;
            // Tell clients which CA we accept, so they pick the matching certificate.
            let names = X509Name::load_client_ca_file(&ca)
                .map_err(setup(format!("reading CA names from {}", ca.display())))?;
            b.set_client_ca_list(names);
            b.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
        } else {
            b.set_verify(SslVerifyMode::NONE);
        }
        Self::finish(b, mode, TlsKind::X509 { verify_peer })
    }

    /// Pre-shared keys from `file` in GnuTLS `psktool` format: one `username:hexkey` per
    /// line (as nbdkit's `--tls-psk`). A client is accepted when it names a username of the
    /// file and proves it holds that key.
    ///
    /// # Errors
    /// [`NbdError::TlsFile`] if the file cannot be read, [`NbdError::PskFile`] for a
    /// malformed line (the message names the line, never its content), or an empty file.
    pub fn psk(file: &Path, mode: TlsMode) -> Result<TlsConfig, NbdError> {
        let text =
            Zeroizing::new(
                std::fs::read_to_string(file).map_err(|source| NbdError::TlsFile {
                    path: file.to_path_buf(),
                    source,
                })?,
            );
        let keys = parse_psk_file(&text).map_err(|(line, reason)| NbdError::PskFile {
            path: file.to_path_buf(),
            line,
            reason,
        })?;
        let mut b = builder()?;
        // TLS 1.2 PSK suites (TLS 1.3 uses its default suites with the external PSK).
        b.set_cipher_list(
            "ECDHE-PSK-AES256-CBC-SHA384:ECDHE-PSK-AES128-CBC-SHA256:\
             DHE-PSK-AES256-GCM-SHA384:DHE-PSK-AES128-GCM-SHA256:\
             PSK-AES256-GCM-SHA384:PSK-AES128-GCM-SHA256",
        )
        .map_err(setup("choosing the PSK cipher suites".to_string()))?;
        b.set_verify(SslVerifyMode::NONE);
        b.set_psk_server_callback(move |_ssl, identity, out| {
            // An unknown username (or no identity) is 0 bytes of key: OpenSSL then fails
            // the handshake with "unknown PSK identity".
            let Some(key) = identity.and_then(|id| keys.get(id)) else {
                return Ok(0);
            };
            match out.get_mut(..key.len()) {
                Some(dst) => {
                    dst.copy_from_slice(key);
                    Ok(key.len())
                }
                None => Ok(0),
            }
        });
        Self::finish(b, mode, TlsKind::Psk)
    }

    fn finish(
        b: openssl::ssl::SslAcceptorBuilder,
        mode: TlsMode,
        kind: TlsKind,
    ) -> Result<TlsConfig, NbdError> {
        if mode == TlsMode::Off {
            return Err(NbdError::Export(
                "a TLS configuration needs mode on or require (off means no TLS)".into(),
            ));
        }
        Ok(TlsConfig {
            mode,
            kind,
            acceptor: b.build(),
        })
    }

    /// The mode: [`TlsMode::On`] or [`TlsMode::Require`].
    pub fn mode(&self) -> TlsMode {
        self.mode
    }

    /// The kind of credentials.
    pub fn kind(&self) -> TlsKind {
        self.kind
    }

    /// Runs the server side of the TLS handshake on `stream`.
    ///
    /// # Errors
    /// [`NbdError::TlsHandshake`]: the client failed to authenticate, spoke something else,
    /// or hung up.
    pub(crate) fn accept<S: Read + Write + std::fmt::Debug>(
        &self,
        stream: S,
    ) -> Result<SslStream<S>, NbdError> {
        self.acceptor
            .accept(stream)
            .map_err(|e| NbdError::TlsHandshake(e.to_string()))
    }
}

/// The client side of TLS, for `nbds://` and `nbds+unix://` devices, configured from the
/// URI's query parameters as libnbd reads them (`nbdinfo`, `nbdcopy`):
///
/// ```text
///  tls-certificates=DIR   DIR/ca-cert.pem verifies the server (default: the system's
///                         CAs); DIR/client-cert.pem + DIR/client-key.pem, when present,
///                         are the client's certificate (for --tls-verify-peer servers)
///  tls-verify-peer=false  do not verify the server's certificate
///  tls-psk-file=FILE      pre-shared keys (psktool's username:hexkey lines)
///  tls-username=USER      the PSK identity (default: the URI's user@, else $LOGNAME/$USER)
///  tls-hostname=NAME      the name the server's certificate must carry (default: the
///                         URI's host; not checked for unix sockets)
/// ```
#[derive(Clone)]
pub struct ClientTls {
    connector: openssl::ssl::SslConnector,
    kind: TlsKind,
    hostname: Option<String>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key: the kind and the name checked only.
        f.debug_struct("ClientTls")
            .field("kind", &self.kind)
            .field("hostname", &self.hostname)
            .finish_non_exhaustive()
    }
}

/// What [`ClientTls::new`] is built from (the URI's parameters).
#[derive(Debug, Clone, Default)]
pub struct ClientTlsParams {
    /// `tls-certificates`: a directory with `ca-cert.pem` (and `client-cert.pem`,
    /// `client-key.pem`).
    pub certificates: Option<PathBuf>,
    /// `tls-psk-file`.
    pub psk_file: Option<PathBuf>,
    /// `tls-username` (or the URI's `user@`).
    pub username: Option<String>,
    /// `tls-verify-peer` (default true).
    pub verify_peer: bool,
    /// The name the server's certificate is checked against (`None`: not checked).
    pub hostname: Option<String>,
}

impl ClientTls {
    /// Builds the client's TLS context: PSK when a PSK file is named, x509 otherwise.
    ///
    /// # Errors
    /// Unreadable or malformed files, a username the PSK file has no key for, OpenSSL
    /// refusing a certificate or key.
    pub fn new(p: &ClientTlsParams) -> Result<ClientTls, NbdError> {
        use openssl::ssl::SslConnector;
        let mut b = SslConnector::builder(SslMethod::tls_client())
            .map_err(setup("creating the TLS client context".to_string()))?;
        b.set_min_proto_version(Some(SslVersion::TLS1_2))
            .map_err(setup("setting the minimum TLS version".to_string()))?;
        b.set_options(SslOptions::IGNORE_UNEXPECTED_EOF | SslOptions::NO_RENEGOTIATION);
        let kind = if let Some(file) = &p.psk_file {
            let text = Zeroizing::new(std::fs::read_to_string(file).map_err(|source| {
                NbdError::TlsFile {
                    path: file.clone(),
                    source,
                }
            })?);
            let keys = parse_psk_file(&text).map_err(|(line, reason)| NbdError::PskFile {
                path: file.clone(),
                line,
                reason,
            })?;
            let user = p
                .username
                .clone()
                .or_else(|| std::env::var("LOGNAME").ok())
                .or_else(|| std::env::var("USER").ok())
                .unwrap_or_default();
            let key = keys.get(user.as_bytes()).cloned().ok_or_else(|| {
                NbdError::Export(format!(
                    "PSK file {} has no key for username {user:?} (set tls-username)",
                    file.display()
                ))
            })?;
            b.set_cipher_list(
                "ECDHE-PSK-AES256-CBC-SHA384:ECDHE-PSK-AES128-CBC-SHA256:\
                 DHE-PSK-AES256-GCM-SHA384:DHE-PSK-AES128-GCM-SHA256:\
                 PSK-AES256-GCM-SHA384:PSK-AES128-GCM-SHA256",
            )
            .map_err(setup("choosing the PSK cipher suites".to_string()))?;
            b.set_verify(SslVerifyMode::NONE);
            let identity = user.into_bytes();
            b.set_psk_client_callback(move |_ssl, _hint, id_out, key_out| {
                // The identity NUL-terminated, the key copied; 0 bytes fails the handshake.
                let (Some(id), Some(k)) = (
                    id_out.get_mut(..identity.len() + 1),
                    key_out.get_mut(..key.len()),
                ) else {
                    return Ok(0);
                };
                id[..identity.len()].copy_from_slice(&identity);
                id[identity.len()] = 0;
                k.copy_from_slice(&key);
                Ok(key.len())
            });
            TlsKind::Psk
        } else {
            let dir = p.certificates.as_deref();
            let file = |name: &str| dir.map(|d| d.join(name)).filter(|f| f.exists());
            match file("ca-cert.pem") {
                Some(ca) => b
                    .set_ca_file(&ca)
                    .map_err(setup(format!("loading {}", ca.display())))?,
                None => b
                    .set_default_verify_paths()
                    .map_err(setup("loading the system's CA certificates".to_string()))?,
            }
            if let (Some(cert), Some(key)) = (file("client-cert.pem"), file("client-key.pem")) {
                b.set_certificate_chain_file(&cert)
                    .map_err(setup(format!("loading {}", cert.display())))?;
                b.set_private_key_file(&key, SslFiletype::PEM)
                    .map_err(setup(format!("loading {}", key.display())))?;
            }
            b.set_verify(if p.verify_peer {
                SslVerifyMode::PEER
            } else {
                SslVerifyMode::NONE
            });
            TlsKind::X509 {
                verify_peer: p.verify_peer,
            }
        };
        let check_name = matches!(kind, TlsKind::X509 { verify_peer: true });
        Ok(ClientTls {
            connector: b.build(),
            kind,
            hostname: p.hostname.clone().filter(|_| check_name),
        })
    }

    /// What the client authenticates with.
    pub fn kind(&self) -> TlsKind {
        self.kind
    }

    /// Runs the client side of the TLS handshake on `stream` (after `NBD_OPT_STARTTLS`).
    ///
    /// # Errors
    /// [`NbdError::TlsHandshake`]: the server's certificate did not verify, the PSK was
    /// refused, or the server hung up.
    pub(crate) fn connect<S: Read + Write + std::fmt::Debug>(
        &self,
        stream: S,
    ) -> Result<SslStream<S>, NbdError> {
        let mut c = self
            .connector
            .configure()
            .map_err(setup("configuring the TLS connection".to_string()))?;
        c.set_verify_hostname(self.hostname.is_some());
        c.set_use_server_name_indication(self.hostname.is_some());
        c.connect(self.hostname.as_deref().unwrap_or(""), stream)
            .map_err(|e| NbdError::TlsHandshake(e.to_string()))
    }
}

/// An acceptor with the settings both kinds share.
fn builder() -> Result<openssl::ssl::SslAcceptorBuilder, NbdError> {
    let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server())
        .map_err(setup("creating the TLS context".to_string()))?;
    b.set_min_proto_version(Some(SslVersion::TLS1_2))
        .map_err(setup("setting the minimum TLS version".to_string()))?;
    // A client that closes the socket without close_notify (a killed nbdcopy, or our own
    // shutdown closing the read side) is an ordinary end of stream for NBD, whose own DISC
    // marks a clean end: read it as EOF, not as an error.
    b.set_options(SslOptions::IGNORE_UNEXPECTED_EOF | SslOptions::NO_RENEGOTIATION);
    Ok(b)
}

fn setup(what: String) -> impl FnOnce(openssl::error::ErrorStack) -> NbdError {
    move |source| NbdError::TlsSetup { what, source }
}

/// Keys by username.
type PskKeys = HashMap<Vec<u8>, Zeroizing<Vec<u8>>>;

/// Parses `username:hexkey` lines; on error, the 1-based line and what is wrong with it.
fn parse_psk_file(text: &str) -> Result<PskKeys, (usize, &'static str)> {
    let mut keys = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        let (user, hex) = line
            .rsplit_once(':')
            .ok_or((n, "expected username:hexkey"))?;
        if user.is_empty() {
            return Err((n, "empty username"));
        }
        let key = Zeroizing::new(decode_hex(hex.trim()).ok_or((n, "key is not hex"))?);
        if key.is_empty() || key.len() > MAX_PSK_BYTES {
            return Err((n, "key must be 1..=512 bytes"));
        }
        keys.insert(user.as_bytes().to_vec(), key);
    }
    if keys.is_empty() {
        return Err((0, "no username:hexkey line"));
    }
    Ok(keys)
}

/// Even-length hex in either case; `None` otherwise.
fn decode_hex(s: &str) -> Option<Vec<u8>> {
    let nibble = |c: u8| (c as char).to_digit(16);
    let b = s.as_bytes();
    if b.len() % 2 != 0 {
        return None;
    }
    b.chunks_exact(2)
        .map(|p| Some((nibble(p[0])? * 16 + nibble(p[1])?) as u8))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psk_file_lines_parse_to_keys_by_username() {
        let k = parse_psk_file("alice:00ff10\n\nbob:ABcd\r\n").unwrap();
        assert_eq!(k[&b"alice".to_vec()].as_slice(), [0, 0xff, 0x10]);
        assert_eq!(k[&b"bob".to_vec()].as_slice(), [0xab, 0xcd]);
    }

    #[test]
    fn malformed_psk_lines_name_the_line() {
        assert_eq!(
            parse_psk_file("a:00\nnocolon\n").unwrap_err(),
            (2, "expected username:hexkey")
        );
        assert_eq!(parse_psk_file("a:0g").unwrap_err(), (1, "key is not hex"));
        assert_eq!(parse_psk_file("a:012").unwrap_err(), (1, "key is not hex"));
        assert_eq!(parse_psk_file(":00").unwrap_err(), (1, "empty username"));
        assert_eq!(
            parse_psk_file("\n").unwrap_err().1,
            "no username:hexkey line"
        );
    }

    #[test]
    fn debug_and_errors_never_show_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("keys.psk");
        std::fs::write(&f, "user:5ec2e75ec2e7\n").unwrap();
        let c = TlsConfig::psk(&f, TlsMode::Require).unwrap();
        assert!(!format!("{c:?}").contains("5ec2e7"));
        std::fs::write(&f, "user:5ec2e75ec2e7zz\n").unwrap();
        let e = TlsConfig::psk(&f, TlsMode::Require).unwrap_err();
        assert!(!format!("{e} {e:?}").contains("5ec2e7"), "{e}");
        assert!(e.to_string().contains("line 1"), "{e}");
    }

    #[test]
    fn missing_certificate_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let e = TlsConfig::x509(dir.path(), false, TlsMode::On).unwrap_err();
        assert!(e.to_string().contains("server-cert.pem"), "{e}");
    }
}
