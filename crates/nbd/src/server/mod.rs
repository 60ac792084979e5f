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
mod listener;
mod options;
mod shutdown;
mod signal;
mod stream;
mod tls_stream;

pub use listener::{private_unix_listener, Listener};
use listener::{wait_for, Waker};
pub use options::{ServeOptions, DEFAULT_MAX_PAYLOAD, MAX_WORKERS};
pub use shutdown::Shutdown;
pub use signal::{on_signals, shutdown_on_signals};
pub(crate) use stream::Stream;

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
    impl Sized4k {
        fn read(&self, _: &mut [u8], _: u64) -> Result<(), BackendError> {
            Ok(())
        }

        fn write(&self, _: &[u8], _: u64, _: bool) -> Result<(), BackendError> {
            Ok(())
        }
    }

    impl Backend for Sized4k {
        fn info(&self) -> &BackendInfo {
            &self.0
        }
        fn submit(&self, io: ucrypt_backend::Io<'_>) -> Result<(), ucrypt_backend::BackendError> {
            match io.kind {
                ucrypt_backend::IoKind::Read(buf) => self.read(buf, io.offset),
                ucrypt_backend::IoKind::Write(buf) => self.write(buf, io.offset, io.fua),
                _ => ucrypt_backend::emulate::fallback(self, io),
            }
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
