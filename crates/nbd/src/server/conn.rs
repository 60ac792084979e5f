//! One connection: the handshake, then a reader, a small worker pool and a writer.
//!
//! ```text
//!  socket ─► reader ──(jobs, bounded)──► workers ─┐
//!   (this     │ validation errors                  ├─(replies)─► writer ─► socket
//!   thread)   └────────────────────────────────────┘   completion order
//! ```
//!
//! The reader is the thread that handshook; with `workers == 0` it also runs every request
//! itself ("inline": the thread that read the request from the socket). Memory is bounded
//! by [`Budget`]: at most `max_in_flight` requests and `max_in_flight_bytes` of payload
//! between "header read" and "reply sent", and payloads are at most `max_payload`.

use super::{chain, lock, ExportConfig, Stream};
use crate::command::{validate, Command, Limits, Request};
use crate::handshake::{Handshake, Negotiated, Step};
use crate::proto::*;
use crate::NbdError;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex};
use ucrypt_backend::{Backend, BackendError, IoCtx};

/// Read-side buffering: many small pipelined requests per `read` syscall. Larger payloads
/// bypass the buffer (`BufReader` reads straight into the destination when it is empty).
const READ_BUFFER_BYTES: usize = 64 * 1024;
/// Write-side buffering: replies that complete together go out in one `write`.
const WRITE_BUFFER_BYTES: usize = 256 * 1024;
/// Longest error message put in a structured error chunk.
const MAX_MESSAGE_BYTES: usize = 512;
/// Buffer bytes a connection keeps for reuse once its requests are done: enough for the
/// steady state of typical clients (1 MiB requests at depth 4..16) without holding a burst's
/// worth of 32 MiB buffers per idle connection.
const POOL_RETAIN_BYTES: usize = 16 << 20;
/// Source of zeroes when the backend cannot write zeroes itself.
static ZEROES: [u8; 64 * 1024] = [0; 64 * 1024];

/// Runs one connection to the end.
///
/// # Errors
/// Socket errors and protocol violations; both end only this connection.
pub(super) fn run(
    stream: Stream,
    id: u32,
    export: Arc<dyn Backend>,
    cfg: &ExportConfig,
) -> Result<(), NbdError> {
    let io_err = |op| move |source| NbdError::Io { op, source };
    let mut rd = BufReader::with_capacity(
        READ_BUFFER_BYTES,
        stream.try_clone().map_err(io_err("cloning the socket"))?,
    );
    let mut wr = stream;
    // A client that connects and never finishes negotiating would hold a connection slot
    // forever: bound the handshake (qemu-nbd's --handshake-limit), not the transmission.
    wr.set_read_timeout(cfg.opts.handshake_timeout);
    let Some(negotiated) = handshake(&mut rd, &mut wr, cfg)? else {
        return Ok(());
    };
    wr.set_read_timeout(None);
    transmission(rd, wr, id, export, cfg, negotiated)
}

/// Drives the sans-IO handshake over the socket; `None` if the session ended in it.
fn handshake(
    rd: &mut impl Read,
    wr: &mut impl Write,
    cfg: &ExportConfig,
) -> Result<Option<Negotiated>, NbdError> {
    let mut hs = Handshake::new(cfg.info.clone());
    wr.write_all(&hs.greeting())
        .map_err(|source| NbdError::Io {
            op: "sending the greeting",
            source,
        })?;
    let mut input = Vec::new();
    let mut out = Vec::new();
    loop {
        if cfg.opts.shutdown.is_triggered() {
            hs.set_shutting_down();
        }
        input.resize(hs.wants(), 0);
        match rd.read_exact(&mut input) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(source) => {
                return Err(NbdError::Io {
                    op: "reading an option",
                    source,
                })
            }
        }
        out.clear();
        let step = hs.feed(&input, &mut out)?;
        wr.write_all(&out).map_err(|source| NbdError::Io {
            op: "sending an option reply",
            source,
        })?;
        match step {
            Step::Continue => {}
            Step::Close => return Ok(None),
            Step::Transmission(n) => return Ok(Some(n)),
        }
    }
}

/// Requests and payload bytes in flight on one connection: the reader waits here before
/// taking a request, the writer releases after sending its reply. This is the bound on
/// per-connection memory (and the back-pressure that stops a client from queueing without
/// limit: once full, we stop reading the socket).
struct Budget {
    /// (requests, bytes) currently in flight.
    used: Mutex<(usize, usize)>,
    freed: Condvar,
    max_requests: usize,
    max_bytes: usize,
}

impl Budget {
    fn acquire(&self, bytes: usize) {
        let mut u = lock(&self.used);
        // A request larger than the whole byte budget still runs, alone.
        while u.0 >= self.max_requests || (u.0 > 0 && u.1 + bytes > self.max_bytes) {
            u = self
                .freed
                .wait(u)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        u.0 += 1;
        u.1 += bytes;
    }

    fn release(&self, bytes: usize) {
        let mut u = lock(&self.used);
        u.0 -= 1;
        u.1 -= bytes;
        drop(u);
        self.freed.notify_one();
    }
}

/// Payload buffers reused across requests, so steady-state I/O does not allocate (and a
/// 32 MiB buffer is not zeroed again for every read). Bounded: at most `max_bytes` are kept.
struct BufPool {
    free: Mutex<Vec<Vec<u8>>>,
    max_bytes: usize,
}

impl BufPool {
    /// A buffer of at least `len` bytes (the smallest that fits, else a new one).
    fn get(&self, len: usize) -> Vec<u8> {
        let mut f = lock(&self.free);
        let best = f
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len() >= len)
            .min_by_key(|(_, b)| b.len())
            .map(|(i, _)| i);
        match best {
            Some(i) => f.swap_remove(i),
            None => {
                drop(f);
                vec![0u8; len]
            }
        }
    }

    fn put(&self, buf: Vec<u8>) {
        let mut f = lock(&self.free);
        let kept: usize = f.iter().map(Vec::len).sum();
        if kept + buf.len() <= self.max_bytes {
            f.push(buf);
        }
    }
}

/// A validated request on its way to a worker.
struct Job {
    cookie: u64,
    cmd: Command,
    /// READ/WRITE payload (its first `len` bytes are used).
    buf: Option<Vec<u8>>,
    /// Bytes charged to the [`Budget`].
    cost: usize,
}

/// A finished request on its way to the writer.
struct Reply {
    cookie: u64,
    /// `Some(offset)` for READ: its reply carries data (or, structured, an error chunk).
    read_offset: Option<u64>,
    /// Bytes of `buf` that are the READ's data.
    len: usize,
    error: Option<(Errno, String)>,
    buf: Option<Vec<u8>>,
    cost: usize,
}

fn transmission(
    mut rd: BufReader<Stream>,
    wr: Stream,
    id: u32,
    export: Arc<dyn Backend>,
    cfg: &ExportConfig,
    negotiated: Negotiated,
) -> Result<(), NbdError> {
    let opts = &cfg.opts;
    let limits = Limits {
        size_bytes: cfg.info.size_bytes,
        flags: negotiated.flags,
        max_payload: cfg.info.max_block,
    };
    let budget = Arc::new(Budget {
        used: Mutex::new((0, 0)),
        freed: Condvar::new(),
        max_requests: opts.max_in_flight.max(1),
        max_bytes: opts.max_in_flight_bytes.max(1),
    });
    let pool = Arc::new(BufPool {
        free: Mutex::new(Vec::new()),
        max_bytes: opts.max_in_flight_bytes.min(POOL_RETAIN_BYTES),
    });
    let ctx = IoCtx { client: id };

    // Replies: unbounded channel, but never longer than the budget allows.
    let (reply_tx, reply_rx) = mpsc::channel::<Reply>();
    let writer = {
        let (budget, pool) = (Arc::clone(&budget), Arc::clone(&pool));
        let structured = negotiated.structured_replies;
        std::thread::Builder::new()
            .name(format!("nbd-wr-{id}"))
            .spawn(move || writer(wr, reply_rx, structured, &budget, &pool))
            .map_err(|source| NbdError::Io {
                op: "spawning the writer",
                source,
            })?
    };

    // Jobs: bounded by max_in_flight anyway; the sync channel just makes that explicit.
    let (job_tx, workers) = if opts.workers == 0 {
        (None, Vec::new())
    } else {
        let (tx, rx) = mpsc::sync_channel::<Job>(opts.max_in_flight.max(1));
        // std's Receiver is not Sync: workers take turns waiting on it. The lock is held
        // only while one idle worker waits, so busy workers never contend for it.
        let rx = Arc::new(Mutex::new(rx));
        let mut hs = Vec::with_capacity(opts.workers);
        for w in 0..opts.workers {
            let (rx, tx, export) = (Arc::clone(&rx), reply_tx.clone(), Arc::clone(&export));
            let (emulate, log) = (cfg.emulate_zeroes, opts.log_errors);
            let h = std::thread::Builder::new()
                .name(format!("nbd-w{id}-{w}"))
                .spawn(move || loop {
                    let job = lock(&rx).recv();
                    let Ok(job) = job else { break };
                    let _ = tx.send(execute(&*export, job, ctx, emulate, log));
                })
                .map_err(|source| NbdError::Io {
                    op: "spawning a worker",
                    source,
                })?;
            hs.push(h);
        }
        (Some(tx), hs)
    };

    let result = reader(
        &mut rd,
        &limits,
        cfg,
        &budget,
        &pool,
        |job| match &job_tx {
            Some(tx) => dispatch(tx, job),
            None => {
                let _ = reply_tx.send(execute(
                    &*export,
                    job,
                    ctx,
                    cfg.emulate_zeroes,
                    opts.log_errors,
                ));
            }
        },
        &reply_tx,
    );

    // Disconnect: let in-flight requests finish and their replies go out, then close.
    drop(job_tx);
    for w in workers {
        let _ = w.join();
    }
    drop(reply_tx);
    let _ = writer.join();
    rd.get_ref().shutdown(std::net::Shutdown::Both);
    result
}

fn dispatch(tx: &SyncSender<Job>, job: Job) {
    // Workers live until the sender is dropped, so this cannot fail while we hold it.
    let _ = tx.send(job);
}

/// Reads and validates requests until DISC, EOF (client gone or shutdown), or a violation.
fn reader(
    rd: &mut BufReader<Stream>,
    limits: &Limits,
    cfg: &ExportConfig,
    budget: &Budget,
    pool: &BufPool,
    mut submit: impl FnMut(Job),
    replies: &Sender<Reply>,
) -> Result<(), NbdError> {
    let mut header = [0u8; REQUEST_HEADER_BYTES];
    loop {
        match rd.read_exact(&mut header) {
            Ok(()) => {}
            // A hard disconnect by the client, or our own shutdown of the read side.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(source) => {
                return Err(NbdError::Io {
                    op: "reading a request",
                    source,
                })
            }
        }
        let req = Request::parse(&header)?;
        let payload = req.payload_bytes() as usize;
        let checked = if cfg.opts.shutdown.is_triggered() && req.kind != NBD_CMD_DISC {
            // "The error value issued in respect of these requests and any subsequently
            // received requests SHOULD be ESHUTDOWN."
            Err(Errno::ESHUTDOWN)
        } else {
            validate(&req, limits)
        };
        let read_offset = (req.kind == NBD_CMD_READ).then_some(req.offset);
        match checked {
            Ok(Command::Disc) => return Ok(()),
            Err(errno) => {
                // The payload must still be consumed or the stream loses its framing; it
                // is read in small pieces, never into one buffer of the claimed size.
                if payload > 0 && !drain(rd, payload)? {
                    return Ok(());
                }
                if cfg.opts.log_errors && errno != Errno::ESHUTDOWN {
                    eprintln!("ucrypt-nbd: refused {req:?}: {errno:?}");
                }
                budget.acquire(0);
                let _ = replies.send(Reply {
                    cookie: req.cookie,
                    read_offset,
                    len: 0,
                    error: Some((errno, refusal(errno).to_string())),
                    buf: None,
                    cost: 0,
                });
            }
            Ok(cmd) => {
                let len = match cmd {
                    Command::Read { len, .. } | Command::Write { len, .. } => len as usize,
                    _ => 0,
                };
                budget.acquire(len);
                let mut buf = (len > 0).then(|| pool.get(len));
                if let (Command::Write { .. }, Some(b)) = (cmd, buf.as_mut()) {
                    match rd.read_exact(&mut b[..len]) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                            budget.release(len);
                            return Ok(());
                        }
                        Err(source) => {
                            budget.release(len);
                            return Err(NbdError::Io {
                                op: "reading a write payload",
                                source,
                            });
                        }
                    }
                }
                submit(Job {
                    cookie: req.cookie,
                    cmd,
                    buf,
                    cost: len,
                });
            }
        }
    }
}

/// Skips `n` payload bytes; false on EOF.
fn drain(rd: &mut impl Read, n: usize) -> Result<bool, NbdError> {
    let copied =
        io::copy(&mut rd.take(n as u64), &mut io::sink()).map_err(|source| NbdError::Io {
            op: "skipping a refused payload",
            source,
        })?;
    Ok(copied == n as u64)
}

/// The human-readable text sent with a refused request.
fn refusal(errno: Errno) -> &'static str {
    match errno {
        Errno::EPERM => "the export is read-only",
        Errno::ENOSPC => "the request reaches past the end of the export",
        Errno::EOVERFLOW => "the request is larger than the maximum block size",
        Errno::ESHUTDOWN => "the server is shutting down",
        _ => "invalid request (command, flags, offset or length)",
    }
}

/// Runs one validated command against the export.
fn execute(export: &dyn Backend, job: Job, ctx: IoCtx, emulate_zeroes: bool, log: bool) -> Reply {
    let Job {
        cookie,
        cmd,
        mut buf,
        cost,
    } = job;
    let mut read_offset = None;
    let mut len = 0;
    let result = match (cmd, buf.as_mut()) {
        (Command::Read { offset, len: l }, Some(b)) => {
            read_offset = Some(offset);
            len = l as usize;
            export.read_at_ctx(&mut b[..len], offset, ctx)
        }
        (
            Command::Write {
                offset,
                len: l,
                fua,
            },
            Some(b),
        ) => export.write_at_ctx(&b[..l as usize], offset, fua, ctx),
        (Command::Flush, _) => export.flush(),
        (Command::Trim { offset, len, fua }, _) => {
            // FUA on a trim: the discard must be durable before the reply.
            export.discard(offset, u64::from(len)).and_then(|()| {
                if fua {
                    export.flush()
                } else {
                    Ok(())
                }
            })
        }
        (Command::WriteZeroes { offset, len, fua }, _) if emulate_zeroes => {
            write_zeroes(export, offset, u64::from(len), fua, ctx)
        }
        (Command::WriteZeroes { offset, len, fua }, _) => {
            export.write_zeroes(offset, u64::from(len), fua)
        }
        // Validation guarantees READ/WRITE carry a buffer and DISC never reaches a worker.
        _ => Err(BackendError::Other(
            "BUG: command without its buffer".into(),
        )),
    };
    let error = result.err().map(|e| {
        if log {
            eprintln!("ucrypt-nbd: {cmd:?} failed: {}", chain(&e));
        }
        let mut msg = chain(&e);
        if msg.len() > MAX_MESSAGE_BYTES {
            let mut cut = MAX_MESSAGE_BYTES;
            while !msg.is_char_boundary(cut) {
                cut -= 1;
            }
            msg.truncate(cut);
        }
        (errno_of(&e), msg)
    });
    Reply {
        cookie,
        read_offset,
        len,
        error,
        buf,
        cost,
    }
}

/// Write-zeroes for a backend without it: zeroes written as ordinary data.
fn write_zeroes(
    export: &dyn Backend,
    offset: u64,
    len: u64,
    fua: bool,
    ctx: IoCtx,
) -> Result<(), BackendError> {
    let mut pos = 0;
    while pos < len {
        let n = (len - pos).min(ZEROES.len() as u64) as usize;
        export.write_at_ctx(&ZEROES[..n], offset + pos, false, ctx)?;
        pos += n as u64;
    }
    if fua {
        export.flush()?;
    }
    Ok(())
}

/// Sends replies in the order requests complete; batches replies that are ready together.
fn writer(stream: Stream, rx: Receiver<Reply>, structured: bool, budget: &Budget, pool: &BufPool) {
    let mut w = BufWriter::with_capacity(WRITE_BUFFER_BYTES, stream);
    let mut failed = false;
    loop {
        let reply = match rx.try_recv() {
            Ok(r) => r,
            Err(TryRecvError::Empty) => {
                // Nothing else ready: push out what is buffered, then wait.
                if !failed && w.flush().is_err() {
                    failed = true;
                    w.get_ref().shutdown(std::net::Shutdown::Both);
                }
                match rx.recv() {
                    Ok(r) => r,
                    Err(_) => break,
                }
            }
            Err(TryRecvError::Disconnected) => break,
        };
        // After a send failure the client is gone; keep draining so the budget is released
        // and the reader (blocked on it, or on the now shut socket) can finish.
        if !failed && encode(&mut w, &reply, structured).is_err() {
            failed = true;
            w.get_ref().shutdown(std::net::Shutdown::Both);
        }
        budget.release(reply.cost);
        if let Some(b) = reply.buf {
            pool.put(b);
        }
    }
    if !failed {
        let _ = w.flush();
    }
}

/// Writes one reply: simple, or (READ with structured replies) one chunk with DONE set.
fn encode(w: &mut impl Write, r: &Reply, structured: bool) -> io::Result<()> {
    let data = match (&r.error, &r.buf) {
        (None, Some(b)) if r.read_offset.is_some() => &b[..r.len],
        _ => &[][..],
    };
    if let (true, Some(offset)) = (structured, r.read_offset) {
        // "If structured replies are negotiated ... MUST NOT use a simple reply for
        // NBD_CMD_READ (even for the case of an early EINVAL due to bad flags)".
        let mut h = [0u8; STRUCTURED_REPLY_BYTES];
        h[..4].copy_from_slice(&NBD_STRUCTURED_REPLY_MAGIC.to_be_bytes());
        h[4..6].copy_from_slice(&NBD_REPLY_FLAG_DONE.to_be_bytes());
        h[8..16].copy_from_slice(&r.cookie.to_be_bytes());
        match &r.error {
            None => {
                h[6..8].copy_from_slice(&NBD_REPLY_TYPE_OFFSET_DATA.to_be_bytes());
                // len <= max payload (32 MiB by default), far below 2^32 - 8.
                h[16..].copy_from_slice(&((data.len() + 8) as u32).to_be_bytes());
                w.write_all(&h)?;
                w.write_all(&offset.to_be_bytes())?;
                w.write_all(data)
            }
            Some((errno, msg)) => {
                h[6..8].copy_from_slice(&NBD_REPLY_TYPE_ERROR.to_be_bytes());
                h[16..].copy_from_slice(&((6 + msg.len()) as u32).to_be_bytes());
                w.write_all(&h)?;
                w.write_all(&errno.value().to_be_bytes())?;
                w.write_all(&(msg.len() as u16).to_be_bytes())?;
                w.write_all(msg.as_bytes())
            }
        }
    } else {
        let mut h = [0u8; SIMPLE_REPLY_BYTES];
        h[..4].copy_from_slice(&NBD_SIMPLE_REPLY_MAGIC.to_be_bytes());
        let errno = r.error.as_ref().map_or(0, |(e, _)| e.value());
        h[4..8].copy_from_slice(&errno.to_be_bytes());
        h[8..].copy_from_slice(&r.cookie.to_be_bytes());
        w.write_all(&h)?;
        w.write_all(data)
    }
}
