//! A minimal synchronous NBD client connection: fixed newstyle handshake with `NBD_OPT_GO`
//! (falling back to `NBD_OPT_EXPORT_NAME`), then requests with simple replies: one at a
//! time ([`Connection::call`]), or, over a plaintext socket, many at once from many threads
//! ([`Pipelined`]). [`crate::remote::NbdBackend`] keeps a pool of these, so ciphertext can
//! live on another NBD server (nbdkit, qemu-nbd, qemu-storage-daemon, rbd-nbd) while keys
//! stay local.
//!
//! Spec: NBD `doc/proto.md`, "Fixed newstyle negotiation", "Transmission".

use crate::command::Request;
use crate::proto::*;
use crate::tls::ClientTls;
use crate::NbdError;
use std::collections::HashMap;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};

/// Where an NBD server is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// A unix socket path.
    Unix(PathBuf),
    /// A TCP `host:port`.
    Tcp(String),
}

/// What the server said about its export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportFacts {
    /// Size in bytes.
    pub size_bytes: u64,
    /// Transmission flags.
    pub flags: u16,
    /// Block size constraints (min, preferred, max); the spec's defaults if not sent.
    pub block: (u32, u32, u32),
}

trait Duplex: Read + Write + Send {}
impl<T: Read + Write + Send> Duplex for T {}

/// One connection in the transmission phase.
pub struct Connection {
    rd: BufReader<Box<dyn Duplex>>,
    wr: BufWriter<Box<dyn Duplex>>,
    next_cookie: u64,
    facts: ExportFacts,
    /// Over TLS: both halves share one session under a lock, so a reader blocked for a
    /// reply would hold up every sender; such a connection is used one request at a time.
    tls: bool,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("facts", &self.facts)
            .finish()
    }
}

fn io(op: &'static str) -> impl FnOnce(io::Error) -> NbdError {
    move |source| NbdError::Io { op, source }
}

fn refused(msg: String) -> NbdError {
    NbdError::Io {
        op: "negotiating with the NBD server",
        source: io::Error::new(io::ErrorKind::InvalidData, msg),
    }
}

impl Connection {
    /// Connects and negotiates `export`.
    ///
    /// # Errors
    /// Connection failures, a server that is not fixed newstyle, an unknown export.
    pub fn connect(addr: &Address, export: &str) -> Result<Connection, NbdError> {
        Self::connect_tls(addr, export, None)
    }

    /// Connects and negotiates `export`, first upgrading to TLS with `tls` (the server must
    /// accept `NBD_OPT_STARTTLS`; nothing but the greeting is exchanged in the clear).
    ///
    /// # Errors
    /// As [`Connection::connect`], plus a server without TLS and a failed TLS handshake.
    pub fn connect_tls(
        addr: &Address,
        export: &str,
        tls: Option<&ClientTls>,
    ) -> Result<Connection, NbdError> {
        let (r, w): (Box<dyn Duplex>, Box<dyn Duplex>) = match addr {
            Address::Unix(p) => {
                let s = UnixStream::connect(p).map_err(io("connecting to the NBD server"))?;
                (
                    Box::new(s.try_clone().map_err(io("cloning a socket"))?),
                    Box::new(s),
                )
            }
            Address::Tcp(a) => {
                let s = TcpStream::connect(a).map_err(io("connecting to the NBD server"))?;
                let _ = s.set_nodelay(true);
                (
                    Box::new(s.try_clone().map_err(io("cloning a socket"))?),
                    Box::new(s),
                )
            }
        };
        let Some(tls) = tls else {
            return Self::negotiate(r, w, export);
        };
        let (mut r, mut w) = (r, w);
        let no_zeroes = starttls(&mut *r, &mut *w)?;
        drop(r);
        // One TLS session over the socket, shared by the reading and the writing half (a
        // connection runs one request at a time, so the lock is never contended).
        let ssl = Arc::new(Mutex::new(tls.connect(Plain(w))?));
        let mut c = Connection {
            rd: BufReader::with_capacity(256 * 1024, Box::new(TlsHalf(ssl.clone()))),
            wr: BufWriter::with_capacity(256 * 1024, Box::new(TlsHalf(ssl))),
            next_cookie: 1,
            facts: ExportFacts {
                size_bytes: 0,
                flags: 0,
                block: (1, 4096, DEFAULT_MAX_BLOCK),
            },
            tls: true,
        };
        c.go(export, no_zeroes)?;
        Ok(c)
    }

    /// Negotiates `export` over an already connected unix socket (a socketpair end, or a
    /// socket whose fd the caller also keeps, as the kernel NBD front end does: it
    /// negotiates here, then hands its duplicate of the fd to the kernel).
    ///
    /// # Errors
    /// As [`Connection::connect`], without the connect step.
    pub fn over_unix(stream: UnixStream, export: &str) -> Result<Connection, NbdError> {
        let r = stream.try_clone().map_err(io("cloning a socket"))?;
        Self::negotiate(Box::new(r), Box::new(stream), export)
    }

    fn negotiate(
        r: Box<dyn Duplex>,
        w: Box<dyn Duplex>,
        export: &str,
    ) -> Result<Connection, NbdError> {
        let mut c = Connection {
            rd: BufReader::with_capacity(256 * 1024, r),
            wr: BufWriter::with_capacity(256 * 1024, w),
            next_cookie: 1,
            facts: ExportFacts {
                size_bytes: 0,
                flags: 0,
                block: (1, 4096, DEFAULT_MAX_BLOCK),
            },
            tls: false,
        };
        c.handshake(export)?;
        Ok(c)
    }

    /// What the server said about the export.
    pub fn facts(&self) -> ExportFacts {
        self.facts
    }

    /// The connection for many requests at once, or `Err(self)` over TLS (see
    /// [`Pipelined`]).
    ///
    /// # Errors
    /// `self`, unchanged, when the connection is TLS.
    pub fn pipelined(self) -> Result<Pipelined, Box<Connection>> {
        if self.tls {
            return Err(Box::new(self));
        }
        Ok(Pipelined {
            tx: Mutex::new(Tx {
                wr: self.wr,
                next_cookie: self.next_cookie,
            }),
            rx: Mutex::new(self.rd),
            state: Mutex::new(Waiting {
                slots: HashMap::new(),
                reading: false,
                failed: None,
            }),
            answered: Condvar::new(),
        })
    }

    fn read_n<const N: usize>(&mut self) -> Result<[u8; N], NbdError> {
        let mut b = [0u8; N];
        self.rd
            .read_exact(&mut b)
            .map_err(io("reading from the NBD server"))?;
        Ok(b)
    }

    fn handshake(&mut self, export: &str) -> Result<(), NbdError> {
        let g: [u8; 18] = self.read_n()?;
        if g[..8] != NBDMAGIC.to_be_bytes() || g[8..16] != IHAVEOPT.to_be_bytes() {
            return Err(refused("not a newstyle NBD server".into()));
        }
        let hflags = u16::from_be_bytes([g[16], g[17]]);
        if hflags & NBD_FLAG_FIXED_NEWSTYLE == 0 {
            return Err(refused("the server does not speak fixed newstyle".into()));
        }
        let no_zeroes = hflags & NBD_FLAG_NO_ZEROES != 0;
        let mut cflags = NBD_FLAG_C_FIXED_NEWSTYLE;
        if no_zeroes {
            cflags |= NBD_FLAG_C_NO_ZEROES;
        }
        self.send(&cflags.to_be_bytes())?;
        self.go(export, no_zeroes)
    }

    /// The options after the greeting: `NBD_OPT_GO` (or `NBD_OPT_EXPORT_NAME`).
    fn go(&mut self, export: &str, no_zeroes: bool) -> Result<(), NbdError> {
        let mut data = (export.len() as u32).to_be_bytes().to_vec();
        data.extend_from_slice(export.as_bytes());
        data.extend_from_slice(&1u16.to_be_bytes());
        data.extend_from_slice(&NBD_INFO_BLOCK_SIZE.to_be_bytes());
        self.option(NBD_OPT_GO, &data)?;
        let mut got_export = false;
        loop {
            let h: [u8; 20] = self.read_n()?;
            let kind = u32::from_be_bytes([h[12], h[13], h[14], h[15]]);
            let len = u32::from_be_bytes([h[16], h[17], h[18], h[19]]);
            if len > 64 * 1024 {
                return Err(refused(format!("option reply of {len} bytes")));
            }
            let mut payload = vec![0u8; len as usize];
            self.rd
                .read_exact(&mut payload)
                .map_err(io("reading from the NBD server"))?;
            match kind {
                NBD_REP_INFO
                    if payload.len() >= 12 && payload[..2] == NBD_INFO_EXPORT.to_be_bytes() =>
                {
                    let mut s = [0u8; 8];
                    s.copy_from_slice(&payload[2..10]);
                    self.facts.size_bytes = u64::from_be_bytes(s);
                    self.facts.flags = u16::from_be_bytes([payload[10], payload[11]]);
                    got_export = true;
                }
                NBD_REP_INFO
                    if payload.len() >= 14 && payload[..2] == NBD_INFO_BLOCK_SIZE.to_be_bytes() =>
                {
                    let at = |i: usize| {
                        u32::from_be_bytes([
                            payload[i],
                            payload[i + 1],
                            payload[i + 2],
                            payload[i + 3],
                        ])
                    };
                    self.facts.block = (at(2), at(6), at(10));
                }
                NBD_REP_INFO => {}
                NBD_REP_ACK if got_export => return Ok(()),
                NBD_REP_ERR_UNSUP => return self.export_name(export, no_zeroes),
                other => {
                    let msg = String::from_utf8_lossy(&payload);
                    return Err(refused(format!("NBD_OPT_GO refused ({other:#x}): {msg}")));
                }
            }
        }
    }

    /// The old way in, for servers without `NBD_OPT_GO`.
    fn export_name(&mut self, export: &str, no_zeroes: bool) -> Result<(), NbdError> {
        self.option(NBD_OPT_EXPORT_NAME, export.as_bytes())?;
        let r: [u8; 10] = self.read_n()?;
        let mut s = [0u8; 8];
        s.copy_from_slice(&r[..8]);
        self.facts.size_bytes = u64::from_be_bytes(s);
        self.facts.flags = u16::from_be_bytes([r[8], r[9]]);
        if !no_zeroes {
            let _: [u8; 124] = self.read_n()?;
        }
        Ok(())
    }

    fn option(&mut self, option: u32, data: &[u8]) -> Result<(), NbdError> {
        let mut m = IHAVEOPT.to_be_bytes().to_vec();
        m.extend_from_slice(&option.to_be_bytes());
        m.extend_from_slice(&(data.len() as u32).to_be_bytes());
        m.extend_from_slice(data);
        self.send(&m)
    }

    fn send(&mut self, b: &[u8]) -> Result<(), NbdError> {
        self.wr
            .write_all(b)
            .and_then(|()| self.wr.flush())
            .map_err(io("writing to the NBD server"))
    }

    /// Sends one request (with `payload` for WRITE; `req.cookie` is replaced by our own),
    /// waits for its simple reply, and fills `data` for READ. Returns the server's errno
    /// (0 = success).
    ///
    /// # Errors
    /// Socket failures and replies that do not match the request (the connection is then
    /// unusable).
    pub fn call(&mut self, req: Request, payload: &[u8], data: &mut [u8]) -> Result<u32, NbdError> {
        let cookie = self.next_cookie;
        self.next_cookie = self.next_cookie.wrapping_add(1);
        let kind = req.kind;
        let req = Request { cookie, ..req };
        self.wr
            .write_all(&req.encode())
            .map_err(io("writing to the NBD server"))?;
        self.wr
            .write_all(payload)
            .map_err(io("writing to the NBD server"))?;
        self.wr.flush().map_err(io("writing to the NBD server"))?;
        if kind == NBD_CMD_DISC {
            return Ok(0);
        }
        let r: [u8; SIMPLE_REPLY_BYTES] = self.read_n()?;
        let magic = u32::from_be_bytes([r[0], r[1], r[2], r[3]]);
        let errno = u32::from_be_bytes([r[4], r[5], r[6], r[7]]);
        let mut c = [0u8; 8];
        c.copy_from_slice(&r[8..]);
        if magic != NBD_SIMPLE_REPLY_MAGIC || u64::from_be_bytes(c) != cookie {
            return Err(refused(format!("unexpected reply (magic {magic:#x})")));
        }
        if kind == NBD_CMD_READ && errno == 0 {
            self.rd
                .read_exact(data)
                .map_err(io("reading from the NBD server"))?;
        }
        Ok(errno)
    }
}

/// A plaintext [`Connection`] shared by threads, each with its own request in flight: the
/// NBD protocol lets a client send requests without waiting for replies, and the server
/// answers in any order, naming the request by its cookie. Without this, a connection
/// carried one request at a time, and ucrypt over an NBD export of RBD had as many requests
/// in flight as connections (4) where its own clients had 32 (BENCHMARKING.md, "Ceph RBD").
///
/// A caller sends its request whole under the sending lock, then waits for its reply. The
/// replies are read by one of the waiting callers at a time (whoever finds nobody reading):
/// it reads a reply header, copies a READ's data straight into the buffer of the caller it
/// belongs to, marks that caller's request answered and wakes the waiters; it keeps reading
/// until its own reply has come, then leaves the reading to another waiter. A socket error,
/// or a reply to a request nobody is waiting for, fails every unanswered request and the
/// connection (the owner reconnects). Hand-written: no maintained crate offers a blocking,
/// multi-threaded NBD client (libnbd's bindings are asynchronous or single-threaded).
pub struct Pipelined {
    tx: Mutex<Tx>,
    rx: Mutex<BufReader<Box<dyn Duplex>>>,
    state: Mutex<Waiting>,
    answered: Condvar,
}

impl std::fmt::Debug for Pipelined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipelined")
            .field("failed", &self.failed())
            .finish_non_exhaustive()
    }
}

struct Tx {
    wr: BufWriter<Box<dyn Duplex>>,
    next_cookie: u64,
}

struct Waiting {
    /// Requests sent and not yet handed back to their callers, by cookie.
    slots: HashMap<u64, Slot>,
    /// A caller is reading replies.
    reading: bool,
    /// Why the connection is unusable.
    failed: Option<String>,
}

/// One request in flight: where a READ's data goes, and its outcome once answered.
struct Slot {
    kind: u16,
    data: *mut u8,
    len: usize,
    /// The server's errno, or why the connection failed.
    result: Option<Result<u32, String>>,
}

// SAFETY: `data` points into the buffer of the caller that owns the slot, which stays in
// `Pipelined::wait` (so the buffer stays borrowed) until `result` is set; only the reading
// caller writes through it, and only before setting `result`.
unsafe impl Send for Slot {}

fn broken(why: &str) -> NbdError {
    NbdError::Io {
        op: "talking to the NBD server",
        source: io::Error::new(io::ErrorKind::BrokenPipe, why.to_string()),
    }
}

impl Pipelined {
    /// Whether the connection failed (requests on it fail; open a new one).
    pub fn failed(&self) -> bool {
        crate::server::lock(&self.state).failed.is_some()
    }

    /// [`Connection::call`] for any number of threads at once.
    ///
    /// # Errors
    /// Socket failures, replies the protocol does not allow, and any request on a
    /// connection that failed before: the connection is then unusable.
    pub fn call(&self, req: Request, payload: &[u8], data: &mut [u8]) -> Result<u32, NbdError> {
        let kind = req.kind;
        let cookie = {
            let mut tx = crate::server::lock(&self.tx);
            let cookie = tx.next_cookie;
            tx.next_cookie = tx.next_cookie.wrapping_add(1);
            {
                let mut w = crate::server::lock(&self.state);
                if let Some(why) = &w.failed {
                    return Err(broken(why));
                }
                if kind != NBD_CMD_DISC {
                    w.slots.insert(
                        cookie,
                        Slot {
                            kind,
                            data: data.as_mut_ptr(),
                            len: data.len(),
                            result: None,
                        },
                    );
                }
            }
            let req = Request { cookie, ..req };
            let sent = tx
                .wr
                .write_all(&req.encode())
                .and_then(|()| tx.wr.write_all(payload))
                .and_then(|()| tx.wr.flush());
            if let Err(e) = sent {
                // The server did not get the whole request, so it will not answer it and
                // no reader touches the slot: it is dropped here. Requests sent whole before
                // are still answered; nothing is sent after a partial one.
                let mut w = crate::server::lock(&self.state);
                w.slots.remove(&cookie);
                w.failed
                    .get_or_insert_with(|| format!("writing to the NBD server: {e}"));
                return Err(NbdError::Io {
                    op: "writing to the NBD server",
                    source: e,
                });
            }
            cookie
        };
        if kind == NBD_CMD_DISC {
            return Ok(0);
        }
        self.wait(cookie)
    }

    /// Waits for the reply to `cookie`, reading replies while nobody else does.
    fn wait(&self, cookie: u64) -> Result<u32, NbdError> {
        let mut w = crate::server::lock(&self.state);
        loop {
            if let Some(r) = w.slots.get_mut(&cookie).and_then(|s| s.result.take()) {
                w.slots.remove(&cookie);
                return r.map_err(|why| broken(&why));
            }
            if w.reading {
                w = self
                    .answered
                    .wait(w)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                continue;
            }
            w.reading = true;
            drop(w);
            let outcome = self.read_reply();
            w = crate::server::lock(&self.state);
            w.reading = false;
            if let Err(why) = outcome {
                for s in w.slots.values_mut() {
                    s.result.get_or_insert_with(|| Err(why.clone()));
                }
                w.failed.get_or_insert(why);
            }
            self.answered.notify_all();
        }
    }

    /// Reads one reply and hands it to the request it answers.
    fn read_reply(&self) -> Result<(), String> {
        let mut rx = crate::server::lock(&self.rx);
        let mut r = [0u8; SIMPLE_REPLY_BYTES];
        rx.read_exact(&mut r)
            .map_err(|e| format!("reading from the NBD server: {e}"))?;
        let magic = u32::from_be_bytes([r[0], r[1], r[2], r[3]]);
        let errno = u32::from_be_bytes([r[4], r[5], r[6], r[7]]);
        let mut c = [0u8; 8];
        c.copy_from_slice(&r[8..]);
        let cookie = u64::from_be_bytes(c);
        if magic != NBD_SIMPLE_REPLY_MAGIC {
            return Err(format!("unexpected reply (magic {magic:#x})"));
        }
        let (kind, data, len) = {
            let w = crate::server::lock(&self.state);
            match w.slots.get(&cookie) {
                Some(s) if s.result.is_none() => (s.kind, s.data, s.len),
                _ => return Err(format!("reply to no request in flight (cookie {cookie})")),
            }
        };
        if kind == NBD_CMD_READ && errno == 0 {
            // SAFETY: the slot's owner waits until its result is set (below, by this
            // thread), so its buffer of `len` bytes is alive and not otherwise used.
            let buf = unsafe { std::slice::from_raw_parts_mut(data, len) };
            rx.read_exact(buf)
                .map_err(|e| format!("reading from the NBD server: {e}"))?;
        }
        let mut w = crate::server::lock(&self.state);
        if let Some(s) = w.slots.get_mut(&cookie) {
            s.result = Some(Ok(errno));
        }
        Ok(())
    }
}

/// The spec's default maximum for clients that were told nothing ("limit NBD_CMD_READ and
/// NBD_CMD_WRITE commands to a maximum block size of 2^25").
const DEFAULT_MAX_BLOCK: u32 = 32 << 20;

/// The greeting, the client flags and `NBD_OPT_STARTTLS` in the clear, on the raw socket
/// (unbuffered: no byte of the TLS handshake may be read ahead). Returns whether the
/// server omits the 124 zero bytes of `NBD_OPT_EXPORT_NAME`.
fn starttls(r: &mut dyn Duplex, w: &mut dyn Duplex) -> Result<bool, NbdError> {
    let mut g = [0u8; 18];
    r.read_exact(&mut g)
        .map_err(io("reading from the NBD server"))?;
    if g[..8] != NBDMAGIC.to_be_bytes() || g[8..16] != IHAVEOPT.to_be_bytes() {
        return Err(refused("not a newstyle NBD server".into()));
    }
    let hflags = u16::from_be_bytes([g[16], g[17]]);
    if hflags & NBD_FLAG_FIXED_NEWSTYLE == 0 {
        return Err(refused("the server does not speak fixed newstyle".into()));
    }
    let no_zeroes = hflags & NBD_FLAG_NO_ZEROES != 0;
    let mut cflags = NBD_FLAG_C_FIXED_NEWSTYLE;
    if no_zeroes {
        cflags |= NBD_FLAG_C_NO_ZEROES;
    }
    let mut m = cflags.to_be_bytes().to_vec();
    m.extend_from_slice(&IHAVEOPT.to_be_bytes());
    m.extend_from_slice(&NBD_OPT_STARTTLS.to_be_bytes());
    m.extend_from_slice(&0u32.to_be_bytes());
    w.write_all(&m)
        .and_then(|()| w.flush())
        .map_err(io("writing to the NBD server"))?;
    let mut h = [0u8; 20];
    r.read_exact(&mut h)
        .map_err(io("reading from the NBD server"))?;
    let kind = u32::from_be_bytes([h[12], h[13], h[14], h[15]]);
    let len = u32::from_be_bytes([h[16], h[17], h[18], h[19]]);
    if len > 64 * 1024 {
        return Err(refused(format!("option reply of {len} bytes")));
    }
    let mut msg = vec![0u8; len as usize];
    r.read_exact(&mut msg)
        .map_err(io("reading from the NBD server"))?;
    if kind != NBD_REP_ACK {
        return Err(refused(format!(
            "the server refused TLS (NBD_OPT_STARTTLS: {kind:#x} {})",
            String::from_utf8_lossy(&msg)
        )));
    }
    Ok(no_zeroes)
}

/// The socket under TLS (OpenSSL's handshake errors want `Debug`).
struct Plain(Box<dyn Duplex>);

impl std::fmt::Debug for Plain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NBD socket")
    }
}

impl Read for Plain {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Plain {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// One half of a connection over a shared TLS session.
struct TlsHalf(Arc<Mutex<openssl::ssl::SslStream<Plain>>>);

impl TlsHalf {
    fn lock(&self) -> std::sync::MutexGuard<'_, openssl::ssl::SslStream<Plain>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Read for TlsHalf {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.lock().read(buf)
    }
}

impl Write for TlsHalf {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.lock().write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.lock().flush()
    }
}
