//! A TLS connection as the connection code uses a socket: a cloneable handle that reads,
//! writes and shuts the socket down.
//!
//! One `SslStream` (one OpenSSL `SSL` object) carries both directions, and an `SSL` object
//! is not safe for a read in one thread while another writes: unlike a plaintext socket,
//! whose two directions are independent file operations, TLS keeps shared state (record
//! sequence numbers, alerts, key updates, session tickets) in the one object. So every
//! handle locks the same mutex for each `read`/`write`, and the connection code runs a TLS
//! connection with a single thread (read a request, run it, reply), so the lock is never
//! contended and a reader blocked in `SSL_read` never holds up a reply (see `conn.rs`).

use super::{lock, Stream};
use openssl::ssl::SslStream;
use std::io::{self, IoSlice, Read, Write};
use std::net::Shutdown;
use std::sync::{Arc, Mutex};

/// Largest plaintext of one TLS record: a short reply header is sent in one record with
/// the start of its data rather than in a tiny record of its own.
const TLS_RECORD_BYTES: usize = 16 * 1024;

struct Inner {
    ssl: SslStream<Stream>,
    /// Where a header and the start of its data are put together (kept to avoid an
    /// allocation per reply).
    scratch: Vec<u8>,
}

struct Shared {
    /// Why a mutex: see the module doc (one `SSL` object, one user at a time).
    inner: Mutex<Inner>,
    /// The same socket, to shut it down without taking the lock (a thread blocked in
    /// `SSL_read` holds it).
    socket: Stream,
}

/// A handle on one TLS connection; clones share it.
#[derive(Clone)]
pub(crate) struct TlsStream(Arc<Shared>);

impl TlsStream {
    /// Wraps an established TLS session; `socket` is a clone of its socket.
    pub(crate) fn new(ssl: SslStream<Stream>, socket: Stream) -> TlsStream {
        TlsStream(Arc::new(Shared {
            inner: Mutex::new(Inner {
                ssl,
                scratch: Vec::with_capacity(TLS_RECORD_BYTES),
            }),
            socket,
        }))
    }

    /// The underlying socket (timeouts, shutdown).
    pub(crate) fn socket(&self) -> &Stream {
        &self.0.socket
    }

    /// Sends close_notify ("the server SHOULD ... shut down the TLS session first"), then
    /// shuts the socket. Best effort: the client may be gone already.
    pub(crate) fn close(&self) {
        if let Ok(mut i) = self.0.inner.try_lock() {
            let _ = i.ssl.shutdown();
        }
        self.0.socket.shutdown(Shutdown::Both);
    }
}

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        lock(&self.0.inner).ssl.read(buf)
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        lock(&self.0.inner).ssl.write(buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut bufs = bufs.iter().filter(|b| !b.is_empty());
        let Some(first) = bufs.next() else {
            return Ok(0);
        };
        let mut i = lock(&self.0.inner);
        if first.len() >= TLS_RECORD_BYTES {
            return i.ssl.write(first);
        }
        let Inner { ssl, scratch } = &mut *i;
        scratch.clear();
        scratch.extend_from_slice(first);
        for b in bufs {
            let room = TLS_RECORD_BYTES - scratch.len();
            if room == 0 {
                break;
            }
            scratch.extend_from_slice(&b[..b.len().min(room)]);
        }
        // SSL_write on a blocking socket writes all of it (no partial-write mode), so the
        // count covers whole slices and the start of the last one, as writev's would.
        ssl.write(scratch)
    }

    fn flush(&mut self) -> io::Result<()> {
        lock(&self.0.inner).ssl.flush()
    }
}
