//! What [`serve`] is told: limits, timeouts, TLS, logging.

use super::*;

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
