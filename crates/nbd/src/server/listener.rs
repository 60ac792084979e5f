//! Listening sockets (unix or TCP) and waiting on one with a wake-up pipe beside it.

use super::*;

/// A listening socket: unix or TCP.
#[derive(Debug)]
pub enum Listener {
    /// A unix domain socket, removed when the listener is dropped (if the path still
    /// names this socket).
    Unix {
        /// The socket.
        listener: UnixListener,
        /// Its path.
        path: PathBuf,
        /// (device, inode) of the socket file, to remove only our own.
        file_id: (u64, u64),
    },
    /// A TCP socket.
    Tcp(TcpListener),
}

impl Listener {
    /// Listens on a unix socket at `path`, replacing a stale socket file (never any other
    /// kind of file). The socket is created with mode 0600 whatever the umask (see
    /// [`Listener::bind_unix_with`]).
    ///
    /// # Errors
    /// [`NbdError::SocketPathInUse`] if `path` exists and is not a socket; [`NbdError::Bind`].
    pub fn bind_unix(path: impl AsRef<Path>) -> Result<Listener, NbdError> {
        Self::bind_unix_with(path, None)
    }

    /// [`Listener::bind_unix`], with the socket's access: `None` makes it 0600 (only this
    /// user may connect), `Some(gid)` makes it 0660 owned by group `gid`. The mode is set
    /// between `bind` and `listen`, so no client can connect while it follows the umask.
    ///
    /// # Errors
    /// As [`Listener::bind_unix`]; [`NbdError::Bind`] also if the mode or group cannot be
    /// set (the socket file is then removed).
    pub fn bind_unix_with(
        path: impl AsRef<Path>,
        group: Option<u32>,
    ) -> Result<Listener, NbdError> {
        let path = path.as_ref().to_path_buf();
        let bind_err = |source: io::Error| NbdError::Bind {
            addr: path.display().to_string(),
            source,
        };
        if let Ok(meta) = std::fs::symlink_metadata(&path) {
            if !meta.file_type().is_socket() {
                return Err(NbdError::SocketPathInUse { path });
            }
            // A live server on it would still accept: refuse to steal its path.
            if UnixStream::connect(&path).is_ok() {
                return Err(bind_err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    "a server is listening there",
                )));
            }
            let _ = std::fs::remove_file(&path);
        }
        let fd = unix_socket_bound(&path).map_err(bind_err)?;
        // From here on the file exists: remove it on any failure.
        let prepared = (|| {
            let (mode, gid) = match group {
                Some(g) => (0o660, Some(g)),
                None => (0o600, None),
            };
            std::os::unix::fs::lchown(&path, None, gid)?;
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(mode))?;
            let meta = std::fs::symlink_metadata(&path)?;
            // SAFETY: fd is a bound unix stream socket we own; listen has no memory effects.
            if unsafe { libc::listen(fd.as_raw_fd(), 128) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok((meta.dev(), meta.ino()))
        })();
        match prepared {
            Ok(file_id) => Ok(Listener::Unix {
                listener: UnixListener::from(fd),
                path,
                file_id,
            }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(bind_err(e))
            }
        }
    }

    /// Listens on a TCP address (port 0 picks a free port; see [`Listener::uri`]).
    ///
    /// # Errors
    /// [`NbdError::Bind`].
    pub fn bind_tcp(addr: impl ToSocketAddrs + std::fmt::Display) -> Result<Listener, NbdError> {
        let listener = TcpListener::bind(&addr).map_err(|source| NbdError::Bind {
            addr: addr.to_string(),
            source,
        })?;
        Ok(Listener::Tcp(listener))
    }

    /// The NBD URI a client connects to (`nbd+unix:///?socket=PATH` or `nbd://HOST:PORT/`).
    pub fn uri(&self) -> String {
        match self {
            Listener::Unix { path, .. } => format!("nbd+unix:///?socket={}", path.display()),
            Listener::Tcp(l) => match l.local_addr() {
                Ok(SocketAddr::V4(a)) => format!("nbd://{}:{}/", a.ip(), a.port()),
                Ok(SocketAddr::V6(a)) => format!("nbd://[{}]:{}/", a.ip(), a.port()),
                Err(_) => "nbd://".to_string(),
            },
        }
    }

    /// The unix socket path, if any.
    pub fn unix_path(&self) -> Option<&Path> {
        match self {
            Listener::Unix { path, .. } => Some(path),
            Listener::Tcp(_) => None,
        }
    }

    /// The bound TCP address, if any.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        match self {
            Listener::Tcp(l) => l.local_addr().ok(),
            Listener::Unix { .. } => None,
        }
    }

    pub(super) fn fd(&self) -> RawFd {
        match self {
            Listener::Unix { listener, .. } => listener.as_raw_fd(),
            Listener::Tcp(l) => l.as_raw_fd(),
        }
    }

    pub(super) fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            Listener::Unix { listener, .. } => listener.set_nonblocking(true),
            Listener::Tcp(l) => l.set_nonblocking(true),
        }
    }

    /// Accepts one pending connection (the listener is non-blocking: `WouldBlock` when
    /// none is pending). The connection itself is blocking.
    pub(super) fn accept(&self) -> io::Result<Stream> {
        let stream = match self {
            Listener::Unix { listener, .. } => listener.accept().map(|(s, _)| Stream::Unix(s)),
            Listener::Tcp(l) => l.accept().map(|(s, _)| {
                // Replies are written whole; Nagle would only delay small ones.
                let _ = s.set_nodelay(true);
                Stream::Tcp(s)
            }),
        }?;
        stream.set_nonblocking(false)?;
        stream.grow_send_buffer();
        Ok(stream)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix { path, file_id, .. } = self {
            // Only if the path still names our socket (not one a later server bound).
            if std::fs::symlink_metadata(&*path).is_ok_and(|m| (m.dev(), m.ino()) == *file_id) {
                let _ = std::fs::remove_file(&*path);
            }
        }
    }
}

/// A listening unix socket at `path` that only its owner may connect to, whatever the
/// umask and the directory: bound, made 0600, and only then listening, so no other user
/// can connect in between (for other front ends that hand out plaintext over a socket).
/// The path is removed again if any step fails.
///
/// # Errors
/// Binding, changing the mode or listening failed.
pub fn private_unix_listener(path: &Path) -> io::Result<UnixListener> {
    let fd = unix_socket_bound(path)?;
    let ready = std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .and_then(|()| {
            // SAFETY: fd is a bound unix stream socket we own; listen has no memory effects.
            if unsafe { libc::listen(fd.as_raw_fd(), 128) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    if let Err(e) = ready {
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(UnixListener::from(fd))
}

/// A unix stream socket bound to `path` (not yet listening), close-on-exec.
fn unix_socket_bound(path: &Path) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: sockaddr_un is a plain C struct for which all-zero bytes are valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    // One byte is kept for the terminating NUL (already zero).
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a unix socket path must be 1 to {} bytes without NUL",
                addr.sun_path.len() - 1
            ),
        ));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: socket(2) with constant arguments; the result is checked before use.
    let raw = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: raw is a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: addr is an initialised sockaddr_un that outlives the call, and its size is
    // passed.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            std::ptr::from_ref(&addr).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Wakes the accept loop (shutdown, a connection ended) through a pipe it polls together
/// with the listening socket: nothing depends on connecting to the socket's path, which
/// may have been removed or replaced while serving.
pub(super) struct Waker {
    rd: OwnedFd,
    wr: OwnedFd,
}

impl Waker {
    pub(super) fn new() -> io::Result<Waker> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: fds is a valid array of two c_ints for pipe2 to fill.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded: both descriptors are fresh and owned by nobody else.
        let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok(Waker { rd, wr })
    }

    /// Makes the pipe readable (a full pipe already is: EAGAIN is ignored).
    pub(super) fn wake(&self) {
        // SAFETY: writes one byte from a live local to a descriptor we own.
        let _ = unsafe { libc::write(self.wr.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
    }

    /// Empties the pipe (non-blocking).
    pub(super) fn drain(&self) {
        let mut buf = [0u8; 64];
        // SAFETY: reads at most buf.len() bytes into a live local buffer from a descriptor
        // we own.
        while unsafe { libc::read(self.rd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
    }
}

/// Waits until the listener has a connection pending (true), the waker was woken or the
/// timeout passed (false).
pub(super) fn wait_for(
    listener: RawFd,
    waker: &Waker,
    timeout: Option<Duration>,
) -> io::Result<bool> {
    let mut fds = [
        libc::pollfd {
            fd: listener,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: waker.rd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // Rounded up, so a deadline is not polled for again and again just before it passes.
    let ms = timeout.map_or(-1, |t| {
        libc::c_int::try_from(t.as_millis() + 1).unwrap_or(libc::c_int::MAX)
    });
    // SAFETY: fds is a valid array of two pollfd for the duration of the call.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fds[0].revents != 0)
}
