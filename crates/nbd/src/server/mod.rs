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

mod conn;
mod signal;
mod tls_stream;

pub use signal::shutdown_on_signals;

use crate::handshake::ExportInfo;
use crate::proto::*;
use crate::NbdError;
use std::collections::HashMap;
use std::io;
use std::net::{Shutdown as SockShutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use ucrypt_backend::{Backend, Support};

/// Default largest READ/WRITE payload: 32 MiB, the limit the spec recommends clients keep
/// to ("limit NBD_CMD_READ and NBD_CMD_WRITE commands to a maximum block size of 2^25").
pub const DEFAULT_MAX_PAYLOAD: u32 = 32 << 20;

/// How to serve an export.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Export name offered by `NBD_OPT_LIST` (the empty default name is always accepted).
    pub export_name: String,
    /// Export description (`NBD_INFO_DESCRIPTION`).
    pub description: String,
    /// Export read-only even if the backend is writable.
    pub read_only: bool,
    /// Connections served at once; further clients wait in the listen backlog until one
    /// closes (mini-redis's semaphore), which bounds threads and memory.
    pub max_connections: usize,
    /// Threads per connection, each receiving, running and answering requests (so this
    /// many requests can be in flight per connection). 0 or 1: one thread, one request at a
    /// time, everything inline in the thread that reads the socket.
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
    /// Longest a client may take to finish the handshake (`None`: unbounded).
    pub handshake_timeout: Option<std::time::Duration>,
    /// TLS (`NBD_OPT_STARTTLS`) offered or required, with its credentials; `None`: no TLS.
    /// A connection that upgrades to TLS runs its requests one at a time (`workers` does
    /// not apply to it): see `conn.rs` for why.
    pub tls: Option<Arc<crate::TlsConfig>>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            export_name: String::new(),
            description: String::new(),
            read_only: false,
            max_connections: 16,
            workers: 8,
            max_in_flight_bytes: 64 << 20,
            max_payload: DEFAULT_MAX_PAYLOAD,
            shutdown: Shutdown::default(),
            log_errors: false,
            handshake_timeout: Some(std::time::Duration::from_secs(10)),
            tls: None,
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
    /// A unix domain socket, removed when [`serve`] returns.
    Unix {
        /// The socket.
        listener: UnixListener,
        /// Its path.
        path: PathBuf,
    },
    /// A TCP socket.
    Tcp(TcpListener),
}

impl Listener {
    /// Listens on a unix socket at `path`, replacing a stale socket file (never any other
    /// kind of file).
    ///
    /// # Errors
    /// [`NbdError::SocketPathInUse`] if `path` exists and is not a socket; [`NbdError::Bind`].
    pub fn bind_unix(path: impl AsRef<Path>) -> Result<Listener, NbdError> {
        let path = path.as_ref().to_path_buf();
        if let Ok(meta) = std::fs::symlink_metadata(&path) {
            if !meta.file_type().is_socket() {
                return Err(NbdError::SocketPathInUse { path });
            }
            // A live server on it would still accept: refuse to steal its path.
            if UnixStream::connect(&path).is_ok() {
                return Err(NbdError::Bind {
                    addr: path.display().to_string(),
                    source: io::Error::new(io::ErrorKind::AddrInUse, "a server is listening there"),
                });
            }
            let _ = std::fs::remove_file(&path);
        }
        let listener = UnixListener::bind(&path).map_err(|source| NbdError::Bind {
            addr: path.display().to_string(),
            source,
        })?;
        Ok(Listener::Unix { listener, path })
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

    fn accept(&self) -> io::Result<Stream> {
        let stream = match self {
            Listener::Unix { listener, .. } => listener.accept().map(|(s, _)| Stream::Unix(s)),
            Listener::Tcp(l) => l.accept().map(|(s, _)| {
                // Replies are written whole; Nagle would only delay small ones.
                let _ = s.set_nodelay(true);
                Stream::Tcp(s)
            }),
        }?;
        stream.grow_send_buffer();
        Ok(stream)
    }

    /// Connects to ourselves so a blocked `accept` returns (the shutdown wake-up).
    fn wake(&self) {
        match self {
            Listener::Unix { path, .. } => {
                let _ = UnixStream::connect(path);
            }
            Listener::Tcp(l) => {
                if let Ok(mut a) = l.local_addr() {
                    if a.ip().is_unspecified() {
                        a.set_ip(match a {
                            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
                        });
                    }
                    let _ = TcpStream::connect(a);
                }
            }
        }
    }
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

    pub(crate) fn set_read_timeout(&self, t: Option<std::time::Duration>) {
        let _ = match self {
            Stream::Unix(s) => s.set_read_timeout(t),
            Stream::Tcp(s) => s.set_read_timeout(t),
        };
    }

    /// Asks for a send buffer of [`SEND_BUFFER_BYTES`] (the kernel caps it at
    /// `net.core.wmem_max`): with the default ~208 KiB a 1 MiB read reply blocks its thread
    /// five times while the client drains the socket.
    fn grow_send_buffer(&self) {
        use std::os::fd::AsRawFd;
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

/// Connections being served, so shutdown can reach their sockets.
#[derive(Default)]
struct Table {
    /// Set by shutdown; checked under the same lock as registration so no connection
    /// slips in after the read sides were shut.
    closing: bool,
    streams: HashMap<u32, Stream>,
}

struct Shared {
    table: Mutex<Table>,
    /// Signalled when a connection ends or shutdown starts: the accept loop waits on it
    /// while `max_connections` are open.
    changed: Condvar,
}

/// What a connection needs to know about the export.
#[derive(Debug, Clone)]
pub(crate) struct ExportConfig {
    pub(crate) info: ExportInfo,
    pub(crate) emulate_zeroes: bool,
    pub(crate) opts: ServeOptions,
}

/// Computes what the handshake announces from the backend and the options.
///
/// # Errors
/// [`NbdError::Export`] if the backend's block size cannot be expressed in NBD.
pub fn export_info(export: &dyn Backend, opts: &ServeOptions) -> Result<ExportInfo, NbdError> {
    let bi = export.info();
    let min = bi.logical_block.max(1);
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
        .max(min)
        .max(4096)
        .checked_next_power_of_two()
        .unwrap_or(max)
        .min(max)
        .max(min);
    let read_only = opts.read_only || bi.caps.read_only;
    let mut flags =
        NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH | NBD_FLAG_SEND_FUA | NBD_FLAG_CAN_MULTI_CONN;
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
        emulate_zeroes: export.info().caps.write_zeroes == Support::None,
        opts: opts.clone(),
    });
    let listener = Arc::new(listener);
    let shared = Arc::new(Shared {
        table: Mutex::new(Table::default()),
        changed: Condvar::new(),
    });
    {
        let shared = Arc::clone(&shared);
        let listener = Arc::clone(&listener);
        opts.shutdown.on_trigger(Box::new(move || {
            let mut t = lock(&shared.table);
            t.closing = true;
            for s in t.streams.values() {
                s.shutdown(SockShutdown::Read);
            }
            drop(t);
            shared.changed.notify_all();
            listener.wake();
        }));
    }
    let result = accept_loop(&listener, &export, &cfg, &shared);
    // Every connection has finished (accept_loop joins them): make it durable once more.
    let flushed = export.flush().map_err(|source| NbdError::Backend {
        op: "flush",
        source,
    });
    if let Some(p) = listener.unix_path() {
        let _ = std::fs::remove_file(p);
    }
    result.and(flushed)
}

fn accept_loop(
    listener: &Listener,
    export: &Arc<dyn Backend>,
    cfg: &Arc<ExportConfig>,
    shared: &Arc<Shared>,
) -> Result<(), NbdError> {
    let max = cfg.opts.max_connections.max(1);
    let mut handles: Vec<std::thread::JoinHandle<()>> = Vec::new();
    let mut next_id: u32 = 0;
    let result = loop {
        {
            // The connection limit: wait for a slot (or shutdown) before accepting.
            let mut t = lock(&shared.table);
            while t.streams.len() >= max && !t.closing {
                t = shared
                    .changed
                    .wait(t)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            if t.closing {
                break Ok(());
            }
        }
        let stream = match listener.accept() {
            Ok(s) => s,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                ) =>
            {
                continue
            }
            Err(e) if cfg.opts.shutdown.is_triggered() => {
                let _ = e;
                break Ok(());
            }
            Err(source) => {
                break Err(NbdError::Io {
                    op: "accepting a connection",
                    source,
                })
            }
        };
        handles.retain(|h| !h.is_finished());
        next_id = next_id.wrapping_add(1).max(1);
        let id = next_id;
        let Ok(registered) = stream.try_clone() else {
            continue;
        };
        {
            let mut t = lock(&shared.table);
            if t.closing {
                break Ok(());
            }
            t.streams.insert(id, registered);
        }
        let (c_export, c_cfg, c_shared) = (Arc::clone(export), Arc::clone(cfg), Arc::clone(shared));
        let spawned = std::thread::Builder::new()
            .name(format!("nbd-conn-{id}"))
            .spawn(move || {
                if let Err(e) = conn::run(stream, id, c_export, &c_cfg) {
                    if c_cfg.opts.log_errors {
                        eprintln!("ucrypt-nbd: connection {id}: {}", chain(&e));
                    }
                }
                lock(&c_shared.table).streams.remove(&id);
                c_shared.changed.notify_all();
            });
        match spawned {
            Ok(h) => handles.push(h),
            Err(_) => {
                lock(&shared.table).streams.remove(&id);
            }
        }
    };
    // Shutting down (or failed): stop readers of connections still open, then wait.
    {
        let mut t = lock(&shared.table);
        t.closing = true;
        for s in t.streams.values() {
            s.shutdown(SockShutdown::Read);
        }
    }
    for h in handles {
        let _ = h.join();
    }
    result
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
