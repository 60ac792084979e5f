//! Where a volume is served and who may reach it: a private unix socket (the default), a
//! unix socket at a path (0600, or 0660 for one group), or a TCP address; the TLS the
//! server offers or requires; and the rule that keeps an unauthenticated plaintext volume
//! off a TCP port unless the caller says so.
//!
//! ```text
//!  Exposure::check   TLS credentials built (before anything is unlocked)
//!                    TCP without --tls=require: refused, or served with a warning
//!  Endpoint::bind    Private: nbd.sock in a fresh 0700 directory (removed with Bound)
//!                    Unix:    PATH, 0600 or 0660 for GROUP
//!                    Tcp:     ADDR:PORT (a bare PORT is 127.0.0.1:PORT)
//!                    ─► Bound { listener, uri (nbds… with TLS), cleanup }
//! ```

use super::{Listener, TlsConfig, TlsMode};
use crate::error::{Error, Result};
use crate::prompt::Prompt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where the NBD server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A private unix socket: mode 0600 in a directory made for it (mkdtemp, mode 0700),
    /// so no other local user can connect, nor put a socket of their own where a client
    /// will connect.
    Private,
    /// A unix socket at `path`: mode 0600, or 0660 owned by `group` (a name or a number).
    Unix {
        /// The socket's path.
        path: PathBuf,
        /// The group whose members may connect too.
        group: Option<String>,
    },
    /// TCP `ADDR:PORT` (port 0 picks a free one; a bare `PORT` means `127.0.0.1:PORT`).
    Tcp(String),
}

/// The TLS the server offers or requires, and its credentials (nbdkit's options).
#[derive(Debug, Clone, Default)]
pub struct Tls {
    /// Off, offered or required.
    pub mode: TlsMode,
    /// x509: the directory of `server-cert.pem`, `server-key.pem` (and `ca-cert.pem`).
    pub certificates: Option<PathBuf>,
    /// x509: refuse clients without a certificate signed by `ca-cert.pem`.
    pub verify_peer: bool,
    /// Pre-shared keys: a file of `username:hexkey` lines.
    pub psk: Option<PathBuf>,
}

impl Tls {
    /// The server's TLS configuration (`None`: no TLS).
    ///
    /// # Errors
    /// Credentials without TLS, TLS without credentials, credentials that cannot be read.
    pub fn config(&self) -> Result<Option<Arc<TlsConfig>>> {
        if self.mode == TlsMode::Off {
            if self.certificates.is_some() || self.psk.is_some() {
                return Err(Error::Invalid(
                    "--tls-certificates/--tls-psk need --tls=on or --tls=require".into(),
                ));
            }
            return Ok(None);
        }
        let config = match (&self.certificates, &self.psk) {
            (Some(dir), None) => TlsConfig::x509(dir, self.verify_peer, self.mode),
            (None, Some(file)) => TlsConfig::psk(file, self.mode),
            _ => {
                return Err(Error::Invalid(
                    "--tls=on/require needs --tls-certificates DIR or --tls-psk FILE".into(),
                ))
            }
        };
        Ok(Some(Arc::new(config?)))
    }
}

/// Where and how a volume is served: what [`Exposure::check`] judges before anything is
/// unlocked.
#[derive(Debug, Clone)]
pub struct Exposure {
    /// Where the server listens.
    pub endpoint: Endpoint,
    /// Its TLS.
    pub tls: Tls,
    /// Serve plaintext on a TCP port without authentication (`--allow-cleartext-tcp`).
    pub allow_cleartext_tcp: bool,
}

impl Exposure {
    /// The TLS configuration, after the rule that no unauthenticated plaintext goes to a
    /// network port, loopback included: a TCP port has no owner, so on 127.0.0.1 every
    /// local user (and every container sharing the host's network) can read and write the
    /// volume. TCP needs TLS required (its credentials authenticate the client by
    /// certificate or pre-shared key), or `allow_cleartext_tcp`, which serves in the clear
    /// after a [`Prompt::warning`]. Unix sockets are 0600 (or the group's).
    ///
    /// # Errors
    /// As [`Tls::config`]; a TCP endpoint without required TLS nor `allow_cleartext_tcp`;
    /// an address that does not resolve.
    pub fn check(&self, prompt: &mut dyn Prompt) -> Result<Option<Arc<TlsConfig>>> {
        let tls = self.tls.config()?;
        let Endpoint::Tcp(listen) = &self.endpoint else {
            return Ok(tls);
        };
        // --tls=on only offers TLS: a plaintext client is still served, in the clear.
        if tls.is_some() && self.tls.mode == TlsMode::Require {
            return Ok(tls);
        }
        let addr = tcp_addr(listen);
        let addrs: Vec<std::net::SocketAddr> =
            std::net::ToSocketAddrs::to_socket_addrs(addr.as_str())
                .map_err(|e| Error::Invalid(format!("--listen {addr}: {e}")))?
                .collect();
        let reach = if addrs.iter().all(|s| s.ip().is_loopback()) {
            "every local user and every container sharing this host's network"
        } else {
            "other machines"
        };
        let tls_state = if self.tls.mode == TlsMode::On {
            "TLS is only offered (--tls=on serves plaintext clients too)"
        } else {
            "TLS is off"
        };
        if !self.allow_cleartext_tcp {
            return Err(Error::Invalid(format!(
                "--listen {addr}: {tls_state}, so the decrypted volume would be served with \
                 no authentication to {reach}; use --tls=require with --tls-certificates or \
                 --tls-psk, a unix socket (--socket PATH, or no --listen for a private one), \
                 or pass --allow-cleartext-tcp"
            )));
        }
        prompt.warning(&format!(
            "serving decrypted data without authentication on {addr}, reachable by {reach} \
             ({tls_state})"
        ));
        Ok(tls)
    }
}

/// A bound endpoint: the listener, the URI clients connect to, and what goes when the
/// server stops.
pub struct Bound {
    /// The listening socket.
    pub listener: Listener,
    /// `nbd+unix:///?socket=PATH` or `nbd://ADDR:PORT/` (`nbds…` when TLS is required or
    /// offered: libnbd's scheme).
    pub uri: String,
    /// The private socket's directory and the pid file, removed when dropped.
    pub cleanup: Cleanup,
}

impl Endpoint {
    /// Binds the socket; `tls` (the server speaks TLS) gives the URI its `nbds` scheme.
    ///
    /// # Errors
    /// The socket cannot be bound, the private directory cannot be made, the group does
    /// not exist.
    pub fn bind(&self, tls: bool) -> Result<Bound> {
        let mut cleanup = Cleanup::default();
        let listener = match self {
            Endpoint::Unix { path, group } => {
                let gid = group.as_deref().map(group_id).transpose()?;
                Listener::bind_unix_with(path, gid)?
            }
            Endpoint::Tcp(listen) => Listener::bind_tcp(tcp_addr(listen).as_str())?,
            Endpoint::Private => {
                let dir = tempfile::Builder::new()
                    .prefix("ucrypt-open-")
                    .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
                    .tempdir()
                    .map_err(|e| {
                        Error::Invalid(format!(
                            "creating a private socket directory in {}: {e}",
                            std::env::temp_dir().display()
                        ))
                    })?
                    .keep();
                cleanup.0.push(dir.clone());
                Listener::bind_unix(dir.join("nbd.sock"))?
            }
        };
        let mut uri = listener.uri();
        if tls {
            uri.replace_range(..3, "nbds");
        }
        Ok(Bound {
            listener,
            uri,
            cleanup,
        })
    }
}

/// The TCP address `--listen` names (a bare PORT means 127.0.0.1:PORT).
fn tcp_addr(listen: &str) -> String {
    if listen.contains(':') {
        listen.to_string()
    } else {
        format!("127.0.0.1:{listen}")
    }
}

/// Paths removed when this is dropped, last added first (a pid file, a private socket
/// directory).
#[derive(Debug, Default)]
pub struct Cleanup(Vec<PathBuf>);

impl Cleanup {
    /// Writes this process's pid to `path` atomically (a reader never sees a partial
    /// file) and removes it when dropped. The file is written under a fresh random name in
    /// the same directory (mkstemp: `O_CREAT|O_EXCL`, so never through a symlink someone
    /// planted), then renamed over `path` (which replaces a symlink at `path` rather than
    /// following it).
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn write_pid_file(&mut self, path: &Path) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let written = (|| {
            let mut tmp = tempfile::Builder::new()
                .prefix(".ucrypt-pid-")
                .tempfile_in(dir)?;
            writeln!(tmp, "{}", std::process::id())?;
            tmp.as_file()
                .set_permissions(std::fs::Permissions::from_mode(0o644))?;
            tmp.persist(path).map_err(|e| e.error)?;
            Ok::<(), std::io::Error>(())
        })();
        written.map_err(|e| Error::Invalid(format!("writing pid file {}: {e}", path.display())))?;
        self.0.push(path.to_path_buf());
        Ok(())
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in self.0.iter().rev() {
            if p.is_dir() {
                let _ = std::fs::remove_dir_all(p);
            } else {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// A group given by name or number, as its gid.
fn group_id(group: &str) -> Result<u32> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    let name = std::ffi::CString::new(group)
        .map_err(|_| Error::Invalid(format!("--socket-group {group:?}: not a group name")))?;
    // SAFETY: `group` is a plain C struct for which all-zero bytes are valid.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 64 * 1024];
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call: a NUL-terminated name, a group struct
    // and a buffer (with its length) that getgrnam_r fills, and the result slot.
    let rc = unsafe {
        libc::getgrnam_r(
            name.as_ptr(),
            &mut grp,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 || found.is_null() {
        return Err(Error::Invalid(format!(
            "--socket-group {group}: no such group"
        )));
    }
    Ok(grp.gr_gid)
}
