//! The server: listeners, the connection limit, graceful shutdown, and [`serve`].
//!
//! One thread accepts; each connection gets a thread that handshakes, then `workers`
//! threads that each read, run and answer requests (see `conn.rs`).
//!
//! ## Multi-conn and FLUSH
//! `NBD_FLAG_CAN_MULTI_CONN` promises that "the effects of NBD_CMD_FLUSH and
//! NBD_CMD_FLAG_FUA MUST be visible across all connections when the server sends its reply".
//! That holds here because every connection calls the same `Arc<dyn Backend>`, no
//! connection keeps a cache of its own, and a write is replied to only after the backend's
//! `write_at` returned. A client that follows the spec ("MUST NOT issue an NBD_CMD_FLUSH
//! request until it has received the reply for all write commands which it expects to be
//! covered by the flush") therefore sends FLUSH after those writes reached the shared
//! backend, and the backend's `flush` (an `fsync` of the device, or `Volume::flush`, which
//! waits for its submitter and then flushes the device) covers them, whichever connection
//! they came from.
//!
//! ## Shutdown
//! [`Shutdown::trigger`] (called from a signal thread, see [`shutdown_on_signals`], or by
//! the embedding program) stops the accept loop, shuts the read side of every connection
//! so readers stop taking new requests, lets in-flight requests finish and their replies
//! go out ("the server SHOULD wait for inflight requests to be serviced prior to initiating
//! a hard disconnect"), then flushes the export once and returns.
//!
//! Shutdown is bounded whatever clients do: the accept loop is woken through a pipe (never
//! by connecting to the socket's path, which may have been removed), and a client that
//! does not read its replies gets [`ServeOptions::shutdown_grace`] to do so; then both
//! directions of its socket are shut, its blocked reply fails, and its requests, already
//! run against the backend, are dropped unanswered (as if it had hung up).
//!
//! ## Connection slots
//! At most `max_connections` connections are served. Clients beyond that wait, accepted,
//! in a queue of at most `max_waiting`, each for at most `handshake_timeout`; a client
//! arriving at a full queue is closed at once. A connection in its handshake holds its
//! slot for at most `handshake_timeout` in all (a deadline for the whole handshake,
//! TLS included, not a limit per read: a client sending a byte now and then is closed
//! when the deadline passes).

mod conn;
mod signal;
mod tls_stream;

pub use signal::{on_signals, shutdown_on_signals};

use crate::handshake::ExportInfo;
use crate::proto::*;
use crate::NbdError;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{Shutdown as SockShutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use ucrypt_backend::{Backend, Support};

/// Default largest READ/WRITE payload: 32 MiB, the limit the spec recommends clients keep
/// to ("limit NBD_CMD_READ and NBD_CMD_WRITE commands to a maximum block size of 2^25").
pub const DEFAULT_MAX_PAYLOAD: u32 = 32 << 20;

/// Most threads one connection gets (`ServeOptions::workers` is capped to it): each
/// thread holds a stack and up to a request's payload, so 100,000 of them exhaust memory
/// and abort the process instead of serving.
pub const MAX_WORKERS: usize = 128;

/// How to serve an export.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Export name offered by `NBD_OPT_LIST` (the empty default name is always accepted).
    pub export_name: String,
    /// Export description (`NBD_INFO_DESCRIPTION`).
    pub description: String,
    /// Export read-only even if the backend is writable.
    pub read_only: bool,
    /// Connections served at once (0 counts as 1); further clients wait (see
    /// `max_waiting`). Bounds threads and memory. Multi-conn is advertised only when this
    /// is above 1: a client told it may open several connections would otherwise wait for
    /// a slot that its own first connection holds.
    pub max_connections: usize,
    /// Clients accepted while every slot is taken, waiting for one (each for at most
    /// `handshake_timeout`); a client arriving when this many wait is closed at once.
    pub max_waiting: usize,
    /// Threads per connection, each receiving, running and answering requests (so this
    /// many requests can be in flight per connection). 0 or 1: one thread, one request at a
    /// time, everything inline in the thread that reads the socket. At most [`MAX_WORKERS`].
    pub workers: usize,
    /// Payload bytes in flight per connection: bounds buffer memory together with `workers`
    /// (a request larger than this runs alone).
    pub max_in_flight_bytes: usize,
    /// Largest READ/WRITE payload accepted (advertised as the maximum block size; larger
    /// requests get `EOVERFLOW`). Rounded down to a multiple of the minimum block size.
    pub max_payload: u32,
    /// Stops the server when triggered.
    pub shutdown: Shutdown,
    /// Print per-connection errors (protocol violations, backend failures) on stderr.
    pub log_errors: bool,
    /// Longest a client may take to finish the whole handshake, and longest it may wait
    /// for a connection slot (`None`: unbounded).
    pub handshake_timeout: Option<Duration>,
    /// On shutdown, how long clients get to read the replies of their in-flight requests
    /// before their sockets are shut (a client that never reads cannot hold shutdown).
    pub shutdown_grace: Duration,
    /// TLS (`NBD_OPT_STARTTLS`) offered or required, with its credentials; `None`: no TLS.
    /// A connection that upgrades to TLS runs its requests one at a time (`workers` does
    /// not apply to it): see `conn.rs` for why.
    pub tls: Option<Arc<crate::TlsConfig>>,
    /// The minimum block size to advertise instead of the backend's logical block size
    /// (`None`: the logical block). For backends that accept smaller requests, as the
    /// engine's `Volume` does by read-modify-write: clients such as nbdfuse or the kernel
    /// then send 512-byte requests instead of refusing them as unaligned, while the
    /// logical block (the encryption sector) stays the preferred size. A power of two no
    /// larger than the logical block; other values are ignored.
    pub min_block: Option<u32>,
    /// Connections currently open (kept up to date by [`serve`]): a supervisor reads it to
    /// tell whether the export is in use.
    pub connections: Arc<std::sync::atomic::AtomicUsize>,
    /// On a connection whose requests are answered asynchronously: how long its socket may
    /// take nothing (a client that stops reading with its socket buffer full) before the
    /// connection is closed. Those replies come from the backend's completion threads,
    /// which every connection shares (librbd has one), so they never block: what the
    /// socket does not take at once waits in the connection's reply queue (at most its
    /// in-flight budget), sent by the connection's writer thread at the client's pace, and
    /// this bounds only a client that reads nothing at all.
    pub reply_timeout: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            export_name: String::new(),
            description: String::new(),
            read_only: false,
            max_connections: 16,
            max_waiting: 16,
            workers: 8,
            max_in_flight_bytes: 64 << 20,
            max_payload: DEFAULT_MAX_PAYLOAD,
            shutdown: Shutdown::default(),
            log_errors: false,
            handshake_timeout: Some(Duration::from_secs(10)),
            shutdown_grace: Duration::from_secs(5),
            tls: None,
            min_block: None,
            connections: Arc::default(),
            reply_timeout: Duration::from_secs(10),
        }
    }
}

type Hook = Box<dyn Fn() + Send + Sync>;

#[derive(Default)]
struct ShutdownInner {
    triggered: AtomicBool,
    /// Run once on trigger: wake the accept loop, shut connections' read sides. A lock
    /// because `serve` registers while another thread may be triggering.
    hooks: Mutex<Vec<Hook>>,
}

/// A handle that stops [`serve`]: clone it into a signal thread or a supervisor.
#[derive(Clone, Default)]
pub struct Shutdown {
    inner: Arc<ShutdownInner>,
}

impl std::fmt::Debug for Shutdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shutdown")
            .field("triggered", &self.is_triggered())
            .finish()
    }
}

impl Shutdown {
    /// Asks the server to stop: no new connections or requests; in-flight requests finish,
    /// the export is flushed, [`serve`] returns. Idempotent.
    pub fn trigger(&self) {
        if self.inner.triggered.swap(true, Ordering::SeqCst) {
            return;
        }
        let hooks = std::mem::take(&mut *lock(&self.inner.hooks));
        for h in hooks {
            h();
        }
    }

    /// Whether [`Shutdown::trigger`] was called.
    pub fn is_triggered(&self) -> bool {
        self.inner.triggered.load(Ordering::SeqCst)
    }

    /// Runs `hook` on trigger (at once if already triggered).
    fn on_trigger(&self, hook: Hook) {
        let mut hooks = lock(&self.inner.hooks);
        if self.is_triggered() {
            drop(hooks);
            hook();
        } else {
            hooks.push(hook);
        }
    }
}

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

    fn fd(&self) -> RawFd {
        match self {
            Listener::Unix { listener, .. } => listener.as_raw_fd(),
            Listener::Tcp(l) => l.as_raw_fd(),
        }
    }

    fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            Listener::Unix { listener, .. } => listener.set_nonblocking(true),
            Listener::Tcp(l) => l.set_nonblocking(true),
        }
    }

    /// Accepts one pending connection (the listener is non-blocking: `WouldBlock` when
    /// none is pending). The connection itself is blocking.
    fn accept(&self) -> io::Result<Stream> {
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
struct Waker {
    rd: OwnedFd,
    wr: OwnedFd,
}

impl Waker {
    fn new() -> io::Result<Waker> {
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
    fn wake(&self) {
        // SAFETY: writes one byte from a live local to a descriptor we own.
        let _ = unsafe { libc::write(self.wr.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
    }

    /// Empties the pipe (non-blocking).
    fn drain(&self) {
        let mut buf = [0u8; 64];
        // SAFETY: reads at most buf.len() bytes into a live local buffer from a descriptor
        // we own.
        while unsafe { libc::read(self.rd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
    }
}

/// Waits until the listener has a connection pending (true), the waker was woken or the
/// timeout passed (false).
fn wait_for(listener: RawFd, waker: &Waker, timeout: Option<Duration>) -> io::Result<bool> {
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

/// Send buffer asked for on every connection (failure to get it is harmless).
const SEND_BUFFER_BYTES: usize = 4 << 20;

/// One accepted connection.
#[derive(Debug)]
pub(crate) enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    pub(crate) fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }

    fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_nonblocking(on),
            Stream::Tcp(s) => s.set_nonblocking(on),
        }
    }

    pub(crate) fn set_write_timeout(&self, t: Option<Duration>) {
        let _ = match self {
            Stream::Unix(s) => s.set_write_timeout(t),
            Stream::Tcp(s) => s.set_write_timeout(t),
        };
    }

    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) {
        let _ = match self {
            Stream::Unix(s) => s.set_read_timeout(t),
            Stream::Tcp(s) => s.set_read_timeout(t),
        };
    }

    /// Asks for a send buffer of [`SEND_BUFFER_BYTES`] (the kernel caps it at
    /// `net.core.wmem_max`): with the default ~208 KiB a 1 MiB read reply blocks its thread
    /// five times while the client drains the socket.
    fn grow_send_buffer(&self) {
        let fd = match self {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tcp(s) => s.as_raw_fd(),
        };
        let bytes = SEND_BUFFER_BYTES as libc::c_int;
        // SAFETY: fd is an open socket owned by self; the option value is a c_int that
        // lives across the call, and its size is passed.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                std::ptr::from_ref(&bytes).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }

    /// `sendmsg` with `MSG_DONTWAIT`: what the socket buffer takes now, `WouldBlock` if
    /// nothing, never blocking (the socket itself stays blocking for its other users).
    /// std has no per-call non-blocking send, hence libc.
    pub(crate) fn send_nonblocking(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let fd = match self {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tcp(s) => s.as_raw_fd(),
        };
        // SAFETY: an all-zero msghdr is valid (no name, no control data).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        // IoSlice is ABI-compatible with iovec on Unix (std documents it); sendmsg only
        // reads the buffers.
        msg.msg_iov = bufs.as_ptr().cast_mut().cast();
        msg.msg_iovlen = bufs.len() as _;
        loop {
            // SAFETY: fd is an open socket owned by self; msg points at `bufs`, which
            // outlive the call.
            let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    pub(crate) fn shutdown(&self, how: SockShutdown) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(how),
            Stream::Tcp(s) => s.shutdown(how),
        };
    }
}

impl io::Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl io::Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write_vectored(bufs),
            Stream::Tcp(s) => s.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One connection being served.
struct Entry {
    /// A clone of its socket, so shutdown and the handshake deadline can reach it.
    stream: Stream,
    /// Until transmission starts: when the handshake must be over.
    handshake_deadline: Option<Instant>,
}

/// Connections being served, so shutdown can reach their sockets.
#[derive(Default)]
struct Table {
    /// Set by shutdown; checked under the same lock as registration so no connection
    /// slips in after the read sides were shut.
    closing: bool,
    streams: HashMap<u32, Entry>,
}

struct Shared {
    table: Mutex<Table>,
    /// Signalled when a connection ends: shutdown waits on it for connections to finish.
    changed: Condvar,
    /// Wakes the accept loop: shutdown, a connection ended (a slot is free).
    waker: Waker,
}

/// What a connection needs to know about the export.
#[derive(Debug, Clone)]
pub(crate) struct ExportConfig {
    pub(crate) info: ExportInfo,
    pub(crate) opts: ServeOptions,
}

/// Computes what the handshake announces from the backend and the options.
///
/// # Errors
/// [`NbdError::Export`] if the backend's block size cannot be expressed in NBD.
pub fn export_info(export: &dyn Backend, opts: &ServeOptions) -> Result<ExportInfo, NbdError> {
    let bi = export.info();
    let logical = bi.logical_block.max(1);
    let min = match opts.min_block {
        Some(m) if m.is_power_of_two() && m <= logical => m,
        _ => logical,
    };
    // "the minimum block size MUST be a power of 2 between 1 and 64 KiB" — the encryption
    // sector size always is (512..=65536).
    if !min.is_power_of_two() || min > 64 * 1024 {
        return Err(NbdError::Export(format!(
            "logical block {min} is not a power of two in 1..=65536"
        )));
    }
    let max = (opts.max_payload / min) * min;
    if max == 0 {
        return Err(NbdError::Export(format!(
            "max payload {} is below the minimum block size {min}",
            opts.max_payload
        )));
    }
    let preferred = bi
        .physical_block
        .max(bi.optimal_block)
        .max(logical)
        .max(4096)
        .checked_next_power_of_two()
        .unwrap_or(max)
        .min(max)
        .max(min);
    let read_only = opts.read_only || bi.caps.read_only;
    let mut flags = NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH | NBD_FLAG_SEND_FUA;
    // Multi-conn invites a client to open several connections (nbdcopy opens 4 and
    // negotiates them all before copying): with one slot its second connection would wait
    // for a slot its first one holds, forever.
    if opts.max_connections > 1 {
        flags |= NBD_FLAG_CAN_MULTI_CONN;
    }
    if read_only {
        flags |= NBD_FLAG_READ_ONLY;
    } else {
        // Zeroes are written as data (encrypted by a Volume), so always available.
        flags |= NBD_FLAG_SEND_WRITE_ZEROES;
        // Trim only when the table allows it (dm-crypt's allow_discards).
        if bi.caps.discard != Support::None {
            flags |= NBD_FLAG_SEND_TRIM;
        }
    }
    Ok(ExportInfo {
        name: opts.export_name.clone(),
        description: opts.description.clone(),
        size_bytes: bi.size_bytes,
        flags,
        min_block: min,
        preferred_block: preferred,
        max_block: max,
    })
}

/// Serves `export` on `listener` until `opts.shutdown` is triggered, then waits for every
/// connection to finish its in-flight requests, flushes the export and returns.
///
/// # Errors
/// [`NbdError::Export`] if the export cannot be served, [`NbdError::Backend`] if the final
/// flush fails, [`NbdError::Io`] if accepting fails for good. Per-connection failures
/// (client errors, protocol violations) end only that connection.
pub fn serve(
    listener: Listener,
    export: Arc<dyn Backend>,
    opts: ServeOptions,
) -> Result<(), NbdError> {
    let info = export_info(&*export, &opts)?;
    let cfg = Arc::new(ExportConfig {
        info,
        opts: opts.clone(),
    });
    let shared = Arc::new(Shared {
        table: Mutex::new(Table::default()),
        changed: Condvar::new(),
        waker: Waker::new().map_err(|source| NbdError::Io {
            op: "creating the wake-up pipe",
            source,
        })?,
    });
    listener.set_nonblocking().map_err(|source| NbdError::Io {
        op: "preparing the listening socket",
        source,
    })?;
    {
        // The hook holds the shared state, not the listener: the listener (and its socket
        // file) goes away when `serve` returns, triggered or not.
        let shared = Arc::clone(&shared);
        opts.shutdown.on_trigger(Box::new(move || {
            let mut t = lock(&shared.table);
            t.closing = true;
            for e in t.streams.values() {
                e.stream.shutdown(SockShutdown::Read);
            }
            drop(t);
            shared.changed.notify_all();
            shared.waker.wake();
        }));
    }
    let result = accept_loop(&listener, &export, &cfg, &shared);
    // No new clients from here on; the socket file goes now, not after the flush.
    drop(listener);
    // Every connection has finished (accept_loop joins them): make it durable once more.
    let flushed = export.flush().map_err(|source| NbdError::Backend {
        op: "flush",
        source,
    });
    result.and(flushed)
}

/// Errors of `accept` that say "not now" (descriptor or memory exhaustion, a client that
/// left before being accepted) rather than "this listener is broken".
fn accept_is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted | io::ErrorKind::WouldBlock
    ) || matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::EPROTO)
    )
}

/// The accept loop: an event loop over the listening socket and the wake-up pipe that
/// admits connections into free slots, queues a bounded number of waiting ones, and
/// enforces the handshake and waiting deadlines. Returns when shutdown starts, after every
/// connection ended (see [`finish_connections`]).
fn accept_loop(
    listener: &Listener,
    export: &Arc<dyn Backend>,
    cfg: &Arc<ExportConfig>,
    shared: &Arc<Shared>,
) -> Result<(), NbdError> {
    let max = cfg.opts.max_connections.max(1);
    let limit = cfg.opts.handshake_timeout;
    let mut waiting: VecDeque<(Stream, Instant)> = VecDeque::new();
    let mut handles: Vec<std::thread::JoinHandle<()>> = Vec::new();
    let mut next_id: u32 = 0;
    let mut start = |t: &mut Table, stream: Stream, handles: &mut Vec<_>| {
        handles.retain(|h: &std::thread::JoinHandle<()>| !h.is_finished());
        next_id = next_id.wrapping_add(1).max(1);
        if let Some(h) = start_connection(t, stream, next_id, export, cfg, shared) {
            handles.push(h);
        }
    };
    let result = 'serving: loop {
        shared.waker.drain();
        let now = Instant::now();
        let mut next_deadline: Option<Instant> = None;
        {
            let mut t = lock(&shared.table);
            if t.closing {
                break Ok(());
            }
            for e in t.streams.values_mut() {
                match e.handshake_deadline {
                    Some(d) if d <= now => {
                        // The whole handshake took too long: its thread sees EOF.
                        e.stream.shutdown(SockShutdown::Both);
                        e.handshake_deadline = None;
                    }
                    Some(d) => next_deadline = Some(next_deadline.map_or(d, |n| n.min(d))),
                    None => {}
                }
            }
            if let Some(l) = limit {
                waiting.retain(|(_, since)| now < *since + l);
            }
            while t.streams.len() < max {
                let Some((stream, _)) = waiting.pop_front() else {
                    break;
                };
                start(&mut t, stream, &mut handles);
            }
            if let (Some(l), Some((_, since))) = (limit, waiting.front()) {
                let d = *since + l;
                next_deadline = Some(next_deadline.map_or(d, |n| n.min(d)));
            }
        }
        let timeout = next_deadline.map(|d| d.saturating_duration_since(Instant::now()));
        match wait_for(listener.fd(), &shared.waker, timeout) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => {
                break Err(NbdError::Io {
                    op: "waiting for connections",
                    source,
                })
            }
        }
        loop {
            let stream = match listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if accept_is_transient(&e) => {
                    if cfg.opts.log_errors {
                        eprintln!("ucrypt-nbd: accepting a connection: {e}");
                    }
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) {
                        continue;
                    }
                    // Out of descriptors or memory: the pending client stays pending and
                    // poll would report it again at once; give the system a moment.
                    std::thread::sleep(Duration::from_millis(50));
                    break;
                }
                Err(source) => {
                    break 'serving Err(NbdError::Io {
                        op: "accepting a connection",
                        source,
                    })
                }
            };
            let mut t = lock(&shared.table);
            if t.closing {
                break;
            }
            if t.streams.len() < max && waiting.is_empty() {
                start(&mut t, stream, &mut handles);
            } else if waiting.len() < cfg.opts.max_waiting {
                waiting.push_back((stream, Instant::now()));
            } else if cfg.opts.log_errors {
                eprintln!(
                    "ucrypt-nbd: {max} connections served and {} waiting: closing a new one",
                    waiting.len()
                );
            }
        }
    };
    // Waiting clients were never served: closing them is all there is to do.
    drop(waiting);
    finish_connections(shared, cfg.opts.shutdown_grace);
    for h in handles {
        let _ = h.join();
    }
    result
}

/// Registers and starts one connection's thread (`None` if the system refuses a thread:
/// the connection is then closed).
fn start_connection(
    t: &mut Table,
    stream: Stream,
    id: u32,
    export: &Arc<dyn Backend>,
    cfg: &Arc<ExportConfig>,
    shared: &Arc<Shared>,
) -> Option<std::thread::JoinHandle<()>> {
    let registered = stream.try_clone().ok()?;
    t.streams.insert(
        id,
        Entry {
            stream: registered,
            handshake_deadline: cfg.opts.handshake_timeout.map(|l| Instant::now() + l),
        },
    );
    // The export may have changed since the server started (an instance resized or
    // refreshed under it): each new connection is told what it is now.
    let c_cfg = match export_info(&**export, &cfg.opts) {
        Ok(info) if info != cfg.info => Arc::new(ExportConfig {
            info,
            ..(**cfg).clone()
        }),
        _ => Arc::clone(cfg),
    };
    let (c_export, c_shared) = (Arc::clone(export), Arc::clone(shared));
    let spawned = std::thread::Builder::new()
        .name(format!("nbd-conn-{id}"))
        .spawn(move || {
            let _counted = Counted::new(&c_cfg.opts.connections);
            // Frees the slot however the connection ends, a panic included.
            let _leave = Leave {
                shared: &c_shared,
                id,
            };
            let entered = || {
                if let Some(e) = lock(&c_shared.table).streams.get_mut(&id) {
                    e.handshake_deadline = None;
                }
            };
            if let Err(e) = conn::run(stream, id, c_export, &c_cfg, &entered) {
                if c_cfg.opts.log_errors {
                    eprintln!("ucrypt-nbd: connection {id}: {}", chain(&e));
                }
            }
        });
    match spawned {
        Ok(h) => Some(h),
        Err(_) => {
            t.streams.remove(&id);
            None
        }
    }
}

/// Counts a connection in [`ServeOptions::connections`] while it lives.
struct Counted<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Counted<'a> {
    fn new(n: &'a std::sync::atomic::AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::SeqCst);
        Counted(n)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Removes a connection from the table when its thread ends, and wakes whoever waits for
/// a slot or for the last connection to end.
struct Leave<'a> {
    shared: &'a Shared,
    id: u32,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        lock(&self.shared.table).streams.remove(&self.id);
        self.shared.changed.notify_all();
        self.shared.waker.wake();
    }
}

/// Shutdown of the connections still open: their read sides are shut (no new requests),
/// in-flight requests finish and their replies go out; a connection still open after
/// `grace` (its client does not read its replies, so a reply write blocks) has both
/// directions shut, which fails the blocked write and ends it.
fn finish_connections(shared: &Shared, grace: Duration) {
    let end = Instant::now() + grace;
    let mut t = lock(&shared.table);
    t.closing = true;
    for e in t.streams.values() {
        e.stream.shutdown(SockShutdown::Read);
    }
    while !t.streams.is_empty() {
        let now = Instant::now();
        if now >= end {
            for e in t.streams.values() {
                e.stream.shutdown(SockShutdown::Both);
            }
            break;
        }
        t = shared
            .changed
            .wait_timeout(t, end - now)
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0;
    }
}

/// Locks a mutex, surviving poisoning: the data under our locks (tables, free lists,
/// counters) stays consistent even if a holder panicked mid-way.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An error and its sources on one line.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use ucrypt_backend::{BackendError, BackendInfo, Caps};

    /// A backend that only reports sizes (export_info reads nothing else).
    struct Sized4k(BackendInfo);
    impl Backend for Sized4k {
        fn info(&self) -> &BackendInfo {
            &self.0
        }
        fn read_at(&self, _: &mut [u8], _: u64) -> Result<(), BackendError> {
            Ok(())
        }
        fn write_at(&self, _: &[u8], _: u64, _: bool) -> Result<(), BackendError> {
            Ok(())
        }
        fn flush(&self) -> Result<(), BackendError> {
            Ok(())
        }
    }

    #[test]
    fn min_block_lowers_the_minimum_and_keeps_the_sector_preferred() {
        let b = Sized4k(BackendInfo {
            size_bytes: 1 << 20,
            logical_block: 4096,
            physical_block: 4096,
            optimal_block: 4096,
            caps: Caps {
                flush: Support::Native,
                discard: Support::None,
                write_zeroes: Support::None,
                read_only: false,
            },
        });
        let i = export_info(&b, &ServeOptions::default()).unwrap();
        assert_eq!((i.min_block, i.preferred_block), (4096, 4096));
        let opts = ServeOptions {
            min_block: Some(512),
            ..ServeOptions::default()
        };
        let i = export_info(&b, &opts).unwrap();
        assert_eq!((i.min_block, i.preferred_block), (512, 4096));
        // Not a power of two, or above the logical block: ignored.
        for bad in [3000, 8192] {
            let opts = ServeOptions {
                min_block: Some(bad),
                ..ServeOptions::default()
            };
            assert_eq!(export_info(&b, &opts).unwrap().min_block, 4096);
        }
    }
}
