//! One connection: the handshake, then `workers` threads that each receive, run and answer
//! requests (nbdkit's model).
//!
//! ```text
//!            ┌─ read lock ─┐                 ┌─ write lock ─┐
//!  socket ──►│ header (+   │──► validate ──► run on Backend ──►│ reply (one  │──► socket
//!            │  payload)   │    (refusal:    (same thread)     │  writev)    │
//!            └─────────────┘     reply now)                    └─────────────┘
//!   thread 1: ── read ──── run ───────── reply ── read ── ...
//!   thread 2:         ── read ── run ── reply ── read ── ...      (replies in completion order)
//! ```
//!
//! The thread that received a request runs it and replies: "inline" means the receiving
//! thread, and there is no hand-off on the request path. With `workers <= 1` one thread does
//! everything, one request at a time. Small reads and writes of a local export run while
//! the thread keeps the read side, their replies sent together ([`serve_requests`]): at
//! depth 32 the other threads then sleep, and a request costs no wake-up at all. Memory is bounded by the thread count and [`Budget`]
//! (`max_in_flight_bytes` of payload between "header read" and "reply sent"; a request
//! larger than the budget runs alone), and payloads are at most `max_payload`.
//!
//! A connection whose reads and writes are answered asynchronously (an export with
//! [`Hints::async_submit`](ucrypt_backend::Hints::async_submit), plaintext) has a reply queue and one writer thread more:
//! a reply is sent at once without blocking if the socket takes it whole and nothing waits
//! before it, else queued and sent by the writer ([`Out::send`], [`Out::write_queued`]), so
//! no completion thread ever waits for a client.

use super::tls_stream::TlsStream;
use super::{chain, lock, ExportConfig, Stream};
use crate::command::{validate, Command, Limits, Request};
use crate::handshake::{Handshake, Negotiated, Step, TlsMode};
use crate::proto::*;
use crate::NbdError;
use std::io::{self, BufReader, IoSlice, Read, Write};
use std::sync::{Arc, Condvar, Mutex};
use ucrypt_backend::{emulate, AsyncIo, AsyncOp, Backend, BackendError, Io, IoCtx};

/// Read-side buffering: many small pipelined requests per `read` syscall. Larger payloads
/// bypass the buffer (`BufReader` reads straight into the destination when it is empty).
const READ_BUFFER_BYTES: usize = 64 * 1024;
/// Longest error message put in a structured error chunk.
const MAX_MESSAGE_BYTES: usize = 512;
/// Buffer bytes a connection keeps for reuse once its requests are done: enough for the
/// steady state of typical clients (1 MiB requests at depth 4..16) without holding a burst's
/// worth of 32 MiB buffers per idle connection.
const POOL_RETAIN_BYTES: usize = 16 << 20;
/// Requests at most this long run on the thread that read them, which keeps the read side
/// ([`serve_requests`]): reads and writes of a local export, whose run is a copy and a
/// cipher pass of a few microseconds, cheaper than waking another thread for it. Longer
/// ones go to threads side by side: 64 KiB reads of 512-byte AES-XTS sectors (about
/// 15 µs of cipher each) ran at 0.6-0.7x the rate inline that they reach on two CPUs
/// (bench/nbd-read.sh, BENCHMARKING.md).
const INLINE_MAX_BYTES: usize = 16 * 1024;
/// Replies of such requests held back to go out together, in one `writev`.
const BATCH_REPLIES: usize = 16;
/// Reply payload bytes held back at most.
const BATCH_BYTES: usize = 256 * 1024;
/// An inline request slower than this waited on something (a disk, a lock)...
const SLOW_INLINE: std::time::Duration = std::time::Duration::from_micros(100);
/// ...and after this many slow ones in a row (one can be a preemption, not the backend)...
const SLOW_STREAK: u32 = 3;
/// ...this many requests go to other threads before running inline is tried again.
const HAND_OFF_AFTER_SLOW: u32 = 1024;

/// The transmission phase's view of a socket: read and write it, and shut it down (to wake
/// a blocked reader, or after a failed send). A plaintext [`Stream`], or a [`TlsStream`].
/// Generic rather than `dyn`, so the plaintext path compiles exactly as before.
use std::time::Duration;

trait Transport: Read + Write + Send + 'static {
    fn shut(&self);
    /// A write blocked this long fails (`ServeOptions::reply_timeout`).
    fn bound_writes(&self, t: Duration);
    /// Writes what the socket takes now, without blocking (`WouldBlock` if nothing).
    fn try_write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize>;
}

impl Transport for Stream {
    fn shut(&self) {
        self.shutdown(std::net::Shutdown::Both);
    }
    fn bound_writes(&self, t: Duration) {
        self.set_write_timeout(Some(t));
    }
    fn try_write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.send_nonblocking(bufs)
    }
}

impl Transport for TlsStream {
    fn shut(&self) {
        self.close();
    }
    /// TLS connections answer synchronously, from their own thread: a client that stops
    /// reading holds up only itself.
    fn bound_writes(&self, _t: Duration) {}
    /// Never used: TLS connections answer synchronously (no reply queue).
    fn try_write_vectored(&mut self, _bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        Err(io::ErrorKind::WouldBlock.into())
    }
}

/// Runs one connection to the end; `entered` is called when transmission starts (the
/// handshake deadline no longer applies).
///
/// # Errors
/// Socket errors, TLS handshake failures and protocol violations; all end only this
/// connection.
pub(super) fn run(
    stream: Stream,
    id: u32,
    export: Arc<dyn Backend>,
    cfg: &ExportConfig,
    entered: &dyn Fn(),
) -> Result<(), NbdError> {
    let io_err = |op| move |source| NbdError::Io { op, source };
    let mut rd = BufReader::with_capacity(
        READ_BUFFER_BYTES,
        stream.try_clone().map_err(io_err("cloning the socket"))?,
    );
    let mut wr = stream;
    // A client that connects and never finishes negotiating would hold a connection slot
    // forever: the accept loop shuts the socket when the handshake deadline passes (the
    // whole handshake, TLS included: qemu-nbd's --handshake-limit). The socket's read
    // timeout below is only a first line (one silent read).
    wr.set_read_timeout(cfg.opts.handshake_timeout);
    let tls = cfg.opts.tls.as_deref();
    let mut hs = Handshake::with_tls(cfg.info.clone(), tls.map_or(TlsMode::Off, |t| t.mode()));
    wr.write_all(&hs.greeting())
        .map_err(io_err("sending the greeting"))?;
    match negotiate(&mut hs, &mut rd, &mut wr, cfg)? {
        Outcome::Closed => Ok(()),
        Outcome::Transmission(n) => {
            entered();
            wr.set_read_timeout(None);
            transmission(rd, wr, id, &export, cfg, n, cfg.opts.workers, true)
        }
        Outcome::StartTls => {
            // The handshake only says StartTls when TLS is configured.
            let Some(tls) = tls else { return Ok(()) };
            // The client must wait for our ACK before its ClientHello; anything it sent
            // sooner sits in our plaintext buffer and cannot be part of the TLS session.
            if !rd.buffer().is_empty() {
                return Err(NbdError::DataAfterStartTls);
            }
            drop(rd);
            let socket = wr.try_clone().map_err(io_err("cloning the socket"))?;
            let tls = TlsStream::new(tls.accept(wr)?, socket);
            hs.tls_started();
            let mut trd = BufReader::with_capacity(READ_BUFFER_BYTES, tls.clone());
            let mut twr = tls;
            match negotiate(&mut hs, &mut trd, &mut twr, cfg)? {
                Outcome::Transmission(n) => {
                    entered();
                    twr.socket().set_read_timeout(None);
                    // One thread per TLS connection: see `TlsStream` for why.
                    transmission(trd, twr, id, &export, cfg, n, 1, false)
                }
                Outcome::Closed | Outcome::StartTls => {
                    twr.close();
                    Ok(())
                }
            }
        }
    }
}

/// How option haggling ended.
enum Outcome {
    /// The client aborted, hung up, or asked for what ends the session.
    Closed,
    /// The client acknowledged `NBD_OPT_STARTTLS`: run the TLS handshake, then negotiate on.
    StartTls,
    /// Transmission starts.
    Transmission(Negotiated),
}

/// Drives the sans-IO handshake over the socket (the greeting already sent) until it ends,
/// enters transmission, or upgrades to TLS.
fn negotiate(
    hs: &mut Handshake,
    rd: &mut impl Read,
    wr: &mut impl Write,
    cfg: &ExportConfig,
) -> Result<Outcome, NbdError> {
    let mut input = Vec::new();
    let mut out = Vec::new();
    loop {
        if cfg.opts.shutdown.is_triggered() {
            hs.set_shutting_down();
        }
        input.resize(hs.wants(), 0);
        match rd.read_exact(&mut input) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(Outcome::Closed),
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
            Step::Close => return Ok(Outcome::Closed),
            Step::StartTls => return Ok(Outcome::StartTls),
            Step::Transmission(n) => return Ok(Outcome::Transmission(n)),
        }
    }
}

/// Requests and payload bytes in flight on one connection: a thread waits here (holding the
/// read lock) before taking a request, and releases after sending its reply. This is the
/// bound on per-connection memory (and the back-pressure that stops a client from queueing
/// without limit: once full, nobody reads the socket).
struct Budget {
    /// (requests, bytes) currently in flight, threads waiting.
    used: Mutex<(usize, usize, usize)>,
    freed: Condvar,
    max_requests: usize,
    max_bytes: usize,
}

impl Budget {
    fn acquire(&self, bytes: usize) {
        let mut u = lock(&self.used);
        // A request larger than the whole byte budget still runs, alone.
        while u.0 >= self.max_requests || (u.0 > 0 && u.1 + bytes > self.max_bytes) {
            u.2 += 1;
            u = self
                .freed
                .wait(u)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            u.2 -= 1;
        }
        u.0 += 1;
        u.1 += bytes;
    }

    /// [`Budget::acquire`] if that would not wait.
    fn try_acquire(&self, bytes: usize) -> bool {
        let mut u = lock(&self.used);
        if u.0 >= self.max_requests || (u.0 > 0 && u.1 + bytes > self.max_bytes) {
            return false;
        }
        u.0 += 1;
        u.1 += bytes;
        true
    }

    /// Returns a request's share. Wakes waiters only when there are some (a notify is a
    /// system call: one per request otherwise).
    fn release(&self, bytes: usize) {
        self.release_many(1, bytes);
    }

    /// Returns the shares of `requests` requests, `bytes` in all.
    fn release_many(&self, requests: usize, bytes: usize) {
        let mut u = lock(&self.used);
        u.0 -= requests;
        u.1 -= bytes;
        let waiting = u.2 > 0;
        drop(u);
        if waiting {
            self.freed.notify_all();
        }
    }

    /// Waits until every request has been answered (asynchronous ones end on other
    /// threads, after the connection's own threads have stopped reading).
    fn wait_idle(&self) {
        let mut u = lock(&self.used);
        while u.0 > 0 {
            u.2 += 1;
            u = self
                .freed
                .wait(u)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            u.2 -= 1;
        }
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

/// A validated request, read and about to run.
struct Job {
    cookie: u64,
    cmd: Command,
    /// READ/WRITE payload (its first `len` bytes are used).
    buf: Option<Vec<u8>>,
    /// Bytes charged to the [`Budget`].
    cost: usize,
}

/// A finished (or refused) request, about to be answered.
struct Reply {
    cookie: u64,
    /// `Some(offset)` for READ: its reply carries data (or, structured, an error chunk).
    read_offset: Option<u64>,
    /// For a BLOCK_STATUS: its `base:allocation` descriptors (length, status flags).
    block_status: Option<Vec<(u32, u32)>>,
    /// Bytes of `buf` that are the READ's data.
    len: usize,
    error: Option<(Errno, String)>,
    buf: Option<Vec<u8>>,
    cost: usize,
}

/// One connection's shared state: each direction of the socket is used by one thread at a
/// time, under its own lock.
struct Shared<'a, R, W> {
    /// The read side and, once reading has ended (DISC, EOF, violation), why.
    rd: Mutex<ReadSide<R>>,
    /// What answering needs, shared with asynchronous completions.
    out: Arc<Out<W>>,
    limits: Limits,
    cfg: &'a ExportConfig,
    export: &'a Arc<dyn Backend>,
    ctx: IoCtx,
    /// Reads and writes go to [`Backend::submit_async`] first (plaintext connections of an
    /// export that takes asynchronous requests).
    asynchronous: bool,
    /// Small reads and writes may run on the thread that read them ([`serve_requests`]):
    /// a synchronous [`Hints::local`](ucrypt_backend::Hints::local) export.
    inline: bool,
}

/// The answering side of a connection: used by its threads and by the completions of its
/// asynchronous requests (which may run on the backend's threads, after the connection's
/// threads stopped: [`transmission`] waits for them through the budget).
struct Out<W> {
    /// The write side: a reply is written whole under this lock (or queued under it), so
    /// replies never interleave.
    wr: Mutex<WriteSide<W>>,
    /// Wakes the connection's writer thread (replies queued, or the connection ending).
    queued: Condvar,
    /// Replies that would block go to the queue instead ([`Out::send`]): asynchronous
    /// connections, whose replies are sent from the backend's shared completion threads.
    queueing: bool,
    /// Replies of a synchronous connection that found another thread writing: that thread
    /// sends them before it lets the socket go ([`Out::send_batch`]).
    combine: Mutex<Combine>,
    budget: Budget,
    pool: BufPool,
    structured: bool,
    log_errors: bool,
}

/// Flat combining of a synchronous connection's replies. A thread with replies to send
/// either becomes the writer (`active` was false) or leaves them in `pending` for the
/// writer and goes back to serving requests. The writer sends what it has, then whatever
/// was left meanwhile, in one `writev` per round, until `pending` is empty, and only then
/// clears `active` (under the same lock as the check, so no reply is left behind). Before,
/// a thread whose reply was ready slept on the write lock until the writer finished and
/// woke it: at 64 KiB reads, depth 8, that was a third of the server's context switches.
#[derive(Default)]
struct Combine {
    active: bool,
    pending: Batch,
}

struct ReadSide<R> {
    rd: BufReader<R>,
    ended: Option<Result<(), NbdError>>,
    /// Slow inline requests in a row ([`SLOW_STREAK`]).
    slow: u32,
    /// Small requests still to hand to other threads before running one inline again.
    hand_off: u32,
}

struct WriteSide<W> {
    /// `None` while the writer thread writes a queued reply with it (outside the lock).
    wr: Option<W>,
    failed: bool,
    /// Replies waiting for the socket, in completion order; the first may be partly sent.
    /// Bounded by the [`Budget`]: a reply holds its request's share until it is sent.
    queue: std::collections::VecDeque<Queued>,
    /// The connection's threads have stopped and every request is answered: the writer
    /// thread ends once the queue is empty.
    closing: bool,
}

/// A reply on the wire: its header (and, for errors and block status, the rest of the
/// chunk), then the READ's data from its buffer; `sent` bytes of that are in the socket.
struct Queued {
    head: Vec<u8>,
    reply: Reply,
    sent: usize,
}

impl Queued {
    fn total(&self) -> usize {
        self.head.len() + payload(&self.reply).len()
    }

    /// The unsent rest, as at most two slices.
    fn rest(&self) -> [IoSlice<'_>; 2] {
        let data = payload(&self.reply);
        if self.sent < self.head.len() {
            [IoSlice::new(&self.head[self.sent..]), IoSlice::new(data)]
        } else {
            [
                IoSlice::new(&data[self.sent - self.head.len()..]),
                IoSlice::new(&[]),
            ]
        }
    }
}

/// What the read side produced.
enum Next {
    /// A valid request to run.
    Run(Job),
    /// A refused request: its error reply.
    Refused(Reply),
}

/// The transmission phase: `workers` threads (this one included) each take the read lock,
/// read one request (and its payload), release it, run the request, and write its reply
/// under the write lock. The thread that receives a request is the one that runs it and
/// replies (nbdkit's model): no hand-off between threads on the request path, many requests
/// in flight, replies in completion order.
///
/// A TLS connection gets `workers = 1`: one thread reads a request, runs it and replies,
/// then reads the next. Correct (the one `SSL` object is never used by two threads, and no
/// reader blocked in `SSL_read` holds up a reply), at the price of one request in flight
/// per TLS connection; clients that open several connections (multi-conn: `nbdcopy`
/// opens 4) still get that many requests running at once.
#[allow(clippy::too_many_arguments)]
fn transmission<R: Transport, W: Transport>(
    rd: BufReader<R>,
    wr: W,
    id: u32,
    export: &Arc<dyn Backend>,
    cfg: &ExportConfig,
    negotiated: Negotiated,
    workers: usize,
    asynchronous: bool,
) -> Result<(), NbdError> {
    let opts = &cfg.opts;
    let threads = workers.clamp(1, super::MAX_WORKERS);
    let asynchronous = asynchronous && export.hints().async_submit;
    if asynchronous {
        // Replies are written by the backend's shared completion threads: bounded.
        wr.bound_writes(opts.reply_timeout);
    }
    let shared = Shared {
        rd: Mutex::new(ReadSide {
            rd,
            ended: None,
            slow: 0,
            hand_off: 0,
        }),
        out: Arc::new(Out {
            wr: Mutex::new(WriteSide {
                wr: Some(wr),
                failed: false,
                queue: std::collections::VecDeque::new(),
                closing: false,
            }),
            queued: Condvar::new(),
            queueing: asynchronous,
            combine: Mutex::new(Combine::default()),
            budget: Budget {
                used: Mutex::new((0, 0, 0)),
                freed: Condvar::new(),
                // The reading thread's held-back replies count too.
                max_requests: threads + BATCH_REPLIES,
                max_bytes: opts.max_in_flight_bytes.max(1),
            },
            pool: BufPool {
                free: Mutex::new(Vec::new()),
                max_bytes: opts.max_in_flight_bytes.min(POOL_RETAIN_BYTES),
            },
            structured: negotiated.structured_replies,
            log_errors: opts.log_errors,
        }),
        limits: Limits {
            size_bytes: cfg.info.size_bytes,
            flags: negotiated.flags,
            max_payload: cfg.info.max_block,
            block_status: negotiated.base_allocation,
        },
        cfg,
        export,
        ctx: IoCtx { client: id },
        asynchronous,
        inline: !asynchronous && export.hints().local,
    };
    std::thread::scope(|s| {
        // The writer of queued replies: it must run until the last reply is sent, so it
        // is stopped below, after the connection's threads ended and every request was
        // answered. Without it (the system refused a thread) replies are written inline.
        if shared.out.queueing {
            let out = &*shared.out;
            if let Err(source) = std::thread::Builder::new()
                .name(format!("nbd-c{id}-w"))
                .spawn_scoped(s, move || out.write_queued())
            {
                // Queued replies would never be sent: the connection ends unserved.
                lock(&shared.rd).ended = Some(Err(NbdError::Io {
                    op: "starting the reply writer",
                    source,
                }));
                return;
            }
        }
        let servers: Vec<_> = (1..threads)
            .filter_map(|t| {
                // Fewer threads if the system refuses more: the connection still works.
                std::thread::Builder::new()
                    .name(format!("nbd-c{id}-{t}"))
                    .spawn_scoped(s, || serve_requests(&shared))
                    .ok()
            })
            .collect();
        serve_requests(&shared);
        for t in servers {
            let _ = t.join();
        }
        // Asynchronous requests still in the backend's hands answer on its threads: the
        // socket stays open (and the export in use) until the last has been answered.
        shared.out.budget.wait_idle();
        lock(&shared.out.wr).closing = true;
        shared.out.queued.notify_all();
    });
    let ReadSide { rd, ended, .. } = shared
        .rd
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    rd.get_ref().shut();
    ended.unwrap_or(Ok(()))
}

/// One thread's loop: read a request, run it, reply; until reading ends.
///
/// Small reads and writes of a local export run on the thread that read them, and it keeps
/// the read side: it goes on with the next request already in the read buffer, holds the
/// replies back and sends them together (one `writev` for up to [`BATCH_REPLIES`]) when
/// the buffer holds no complete request (the next read could block), the batch is full,
/// or it lets the read side go. At depth 32 a 4 KiB read then costs no thread wake-up and
/// a share of one `writev` and one `read`, where handing each request to the next thread
/// cost a futex wake-up and a task switch, and each reply its own `writev`. Other
/// requests (flush, trim, larger than [`INLINE_MAX_BYTES`]) and every request of an export
/// that is not [`Hints::local`](ucrypt_backend::Hints::local) (whose requests may wait on a network) let the read side go to the
/// next thread and run here, as do small requests for a while after inline ones were
/// found slow ([`SLOW_INLINE`]: a disk that must be read), so that they run side by side.
///
/// A read or write that the export takes asynchronously ([`Backend::submit_async`]) is
/// submitted and this thread goes on reading, keeping the read side: its reply is sent by
/// its completion, on the backend's thread. So with an asynchronous export (RBD) one thread
/// receives and submits every request, no thread blocks on a request, and nothing wakes a
/// thread per request (the synchronous hand-over of the read side and the backend's
/// completion each woke one). A request that has no asynchronous path (flush, trim,
/// FUA, partial sectors, ...) lets the read side go and runs here as before.
fn serve_requests<R: Transport, W: Transport>(sh: &Shared<'_, R, W>) {
    let mut batch = Batch::default();
    loop {
        let next = {
            let mut r = lock(&sh.rd);
            loop {
                if r.ended.is_some() {
                    break None;
                }
                if !batch.is_empty() && !request_buffered(&r.rd) {
                    sh.out.send_batch(&mut batch);
                }
                match next_request(&mut r.rd, sh, &mut batch) {
                    Ok(Some(Next::Run(job))) if sh.asynchronous => match submit(sh, job) {
                        Ok(()) => continue,
                        Err(job) => break Some(Next::Run(job)),
                    },
                    Ok(Some(Next::Run(job))) if sh.inline && runs_inline(&job) => {
                        if r.hand_off > 0 {
                            r.hand_off -= 1;
                            break Some(Next::Run(job));
                        }
                        let started = std::time::Instant::now();
                        let reply = execute_caught(sh, job);
                        if started.elapsed() > SLOW_INLINE {
                            r.slow += 1;
                            if r.slow >= SLOW_STREAK {
                                r.slow = 0;
                                r.hand_off = HAND_OFF_AFTER_SLOW;
                            }
                        } else {
                            r.slow = 0;
                        }
                        batch.push(reply, sh.out.structured);
                        if batch.is_full() {
                            sh.out.send_batch(&mut batch);
                        }
                    }
                    // A refusal costs nothing to answer: with the others.
                    Ok(Some(Next::Refused(reply))) if sh.inline => {
                        batch.push(reply, sh.out.structured);
                        if batch.is_full() {
                            sh.out.send_batch(&mut batch);
                        }
                    }
                    Ok(Some(next)) => break Some(next),
                    Ok(None) => {
                        r.ended = Some(Ok(()));
                        break None;
                    }
                    Err(e) => {
                        r.ended = Some(Err(e));
                        break None;
                    }
                }
            }
        };
        // The read side is the next thread's now; what this one held back goes first.
        sh.out.send_batch(&mut batch);
        let Some(next) = next else { return };
        let reply = match next {
            Next::Run(job) => execute_caught(sh, job),
            Next::Refused(reply) => reply,
        };
        sh.out.send(reply);
    }
}

/// Whether `job` may run on the reading thread: a read or a write (without FUA, whose
/// flush can take long) of at most [`INLINE_MAX_BYTES`].
fn runs_inline(job: &Job) -> bool {
    match job.cmd {
        Command::Read { len, .. }
        | Command::Write {
            len, fua: false, ..
        } => len as usize <= INLINE_MAX_BYTES,
        _ => false,
    }
}

/// Whether the read buffer holds a whole request (its header, and a write's payload), so
/// that taking it cannot block on the socket.
fn request_buffered<R: Read>(rd: &BufReader<R>) -> bool {
    let b = rd.buffer();
    let Some(h) = b.get(..REQUEST_HEADER_BYTES) else {
        return false;
    };
    let kind = u16::from_be_bytes([h[6], h[7]]);
    let len = u32::from_be_bytes([h[24], h[25], h[26], h[27]]) as usize;
    kind != NBD_CMD_WRITE || b.len() - REQUEST_HEADER_BYTES >= len
}

/// Replies held back by the thread that has the read side, sent together by
/// [`Out::send_batch`]: their frames in one buffer, reused from batch to batch.
#[derive(Default)]
struct Batch {
    /// The frames of `replies`, one after another.
    heads: Vec<u8>,
    /// Each reply and where its frame ends in `heads`.
    replies: Vec<(usize, Reply)>,
    /// Payload bytes held.
    bytes: usize,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.replies.is_empty()
    }

    fn is_full(&self) -> bool {
        self.replies.len() >= BATCH_REPLIES || self.bytes >= BATCH_BYTES
    }

    fn push(&mut self, reply: Reply, structured: bool) {
        frame_into(&reply, structured, &mut self.heads);
        self.bytes += payload(&reply).len();
        self.replies.push((self.heads.len(), reply));
    }
}

/// Submits a plain read or write (not FUA: that needs a flush after it, the synchronous
/// path's business) asynchronously; its completion answers it. `Err` hands the job back
/// for the synchronous path.
fn submit<R: Transport, W: Transport>(sh: &Shared<'_, R, W>, mut job: Job) -> Result<(), Job> {
    let (op, len) = match job.cmd {
        Command::Read { len, .. } => (AsyncOp::Read, len),
        Command::Write {
            len, fua: false, ..
        } => (AsyncOp::Write, len),
        _ => return Err(job),
    };
    let (offset, cookie, cmd, cost) = match job.cmd {
        Command::Read { offset, .. } | Command::Write { offset, .. } => {
            (offset, job.cookie, job.cmd, job.cost)
        }
        _ => return Err(job),
    };
    let Some(buf) = job.buf.take() else {
        return Err(job);
    };
    let out = Arc::clone(&sh.out);
    let io = AsyncIo {
        op,
        offset,
        len: len as usize,
        buf,
        ctx: sh.ctx,
        done: Box::new(move |buf, result| {
            let reply = answer(cookie, cmd, cost, Some(buf), result, out.log_errors);
            out.send(reply);
        }),
    };
    match Arc::clone(sh.export).submit_async(io) {
        Ok(()) => Ok(()),
        Err(io) => {
            job.buf = Some(io.buf);
            Err(job)
        }
    }
}

/// Reads and validates the next request; `None` on DISC or EOF (the client hung up, or our
/// shutdown closed the read side).
///
/// `batch` holds this thread's replies not sent yet: they go out before it waits for the
/// budget (which they hold a share of).
fn next_request<R: Transport, W: Transport>(
    rd: &mut BufReader<R>,
    sh: &Shared<'_, R, W>,
    batch: &mut Batch,
) -> Result<Option<Next>, NbdError> {
    let mut header = [0u8; REQUEST_HEADER_BYTES];
    match rd.read_exact(&mut header) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(source) => {
            return Err(NbdError::Io {
                op: "reading a request",
                source,
            })
        }
    }
    let req = Request::parse(&header)?;
    let payload = req.payload_bytes() as usize;
    let checked = if sh.cfg.opts.shutdown.is_triggered() && req.kind != NBD_CMD_DISC {
        // "The error value issued in respect of these requests and any subsequently
        // received requests SHOULD be ESHUTDOWN."
        Err(Errno::ESHUTDOWN)
    } else {
        // A connection keeps the size it was told at its handshake, but an export that grew
        // since (an instance resized under a kernel NBD device, which learnt the new size
        // from NBD_CMD_RECONFIGURE) is served up to its new end.
        validate(&req, &sh.limits).or_else(|refused| {
            let now = sh.export.info().size_bytes;
            if now > sh.limits.size_bytes {
                validate(
                    &req,
                    &Limits {
                        size_bytes: now,
                        ..sh.limits
                    },
                )
            } else {
                Err(refused)
            }
        })
    };
    let read_offset = (req.kind == NBD_CMD_READ).then_some(req.offset);
    match checked {
        Ok(Command::Disc) => Ok(None),
        Err(errno) => {
            // The payload must still be consumed or the stream loses its framing; it is
            // read in small pieces, never into one buffer of the claimed size.
            if payload > 0 && !drain(rd, payload)? {
                return Ok(None);
            }
            if sh.cfg.opts.log_errors && errno != Errno::ESHUTDOWN {
                eprintln!("ucrypt-nbd: refused {req:?}: {errno:?}");
            }
            sh.out.acquire(0, batch);
            Ok(Some(Next::Refused(Reply {
                cookie: req.cookie,
                read_offset,
                block_status: None,
                len: 0,
                error: Some((errno, refusal(errno).to_string())),
                buf: None,
                cost: 0,
            })))
        }
        Ok(cmd) => {
            let len = match cmd {
                Command::Read { len, .. } | Command::Write { len, .. } => len as usize,
                _ => 0,
            };
            // Under the read lock: while the budget is spent nobody reads the socket, which
            // is the back-pressure on a client that queues faster than we complete.
            sh.out.acquire(len, batch);
            let mut buf = (len > 0).then(|| sh.out.pool.get(len));
            if let (Command::Write { .. }, Some(b)) = (cmd, buf.as_mut()) {
                if let Err(e) = rd.read_exact(&mut b[..len]) {
                    sh.out.budget.release(len);
                    return match e.kind() {
                        io::ErrorKind::UnexpectedEof => Ok(None),
                        _ => Err(NbdError::Io {
                            op: "reading a write payload",
                            source: e,
                        }),
                    };
                }
            }
            Ok(Some(Next::Run(Job {
                cookie: req.cookie,
                cmd,
                buf,
                cost: len,
            })))
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

/// [`execute`], with a panic in the backend (a bug, or a fault injected by a test) caught:
/// the request is answered with `EIO`, its budget is returned by [`Out::send`] as for any
/// other reply, and the connection goes on serving. Its buffer is lost with the unwinding
/// stack (the pool allocates a new one). The panic message itself went to stderr through
/// the panic hook; the client only learns which operation failed.
fn execute_caught<R: Transport, W: Transport>(sh: &Shared<'_, R, W>, job: Job) -> Reply {
    let (cookie, cmd, cost) = (job.cookie, job.cmd, job.cost);
    let run = || execute(&**sh.export, job, sh.ctx, sh.cfg.opts.log_errors);
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
        Ok(reply) => reply,
        Err(_) => {
            if sh.cfg.opts.log_errors {
                eprintln!("ucrypt-nbd: {cmd:?} panicked; answered with EIO");
            }
            Reply {
                cookie,
                read_offset: match cmd {
                    Command::Read { offset, .. } => Some(offset),
                    _ => None,
                },
                block_status: None,
                len: 0,
                error: Some((Errno::EIO, wire_message(cmd, Errno::EIO, None))),
                buf: None,
                cost,
            }
        }
    }
}

/// The text sent with a failed request: the operation, its range and the errno, never
/// the backend's own message (it names host files and devices, which a remote client has
/// no business learning). The full error goes to the server's log with `log_errors`.
fn wire_message(cmd: Command, errno: Errno, host: Option<i32>) -> String {
    let (op, range) = match cmd {
        Command::Read { offset, len } => ("read", Some((offset, u64::from(len)))),
        Command::Write { offset, len, .. } => ("write", Some((offset, u64::from(len)))),
        Command::Flush => ("flush", None),
        Command::Trim { offset, len, .. } => ("trim", Some((offset, u64::from(len)))),
        Command::BlockStatus { offset, len, .. } => {
            ("block_status", Some((offset, u64::from(len))))
        }
        Command::WriteZeroes { offset, len, .. } => {
            ("write_zeroes", Some((offset, u64::from(len))))
        }
        _ => ("request", None),
    };
    // The host's errno when the spec's set has no name for it (it became EIO, ...).
    let detail = host
        .filter(|&h| h != errno.value() as i32)
        .map(|h| format!(" (host errno {h})"))
        .unwrap_or_default();
    let what = match range {
        Some((offset, len)) => format!("{op} of {len} bytes at offset {offset}"),
        None => op.to_string(),
    };
    format!("{what} failed: {errno:?}{detail}")
}

/// Runs one validated command against the export.
fn execute(export: &dyn Backend, job: Job, ctx: IoCtx, log: bool) -> Reply {
    let Job {
        cookie,
        cmd,
        mut buf,
        cost,
    } = job;
    let mut read_offset = None;
    let mut len = 0;
    let mut block_status = None;
    let result = match (cmd, buf.as_mut()) {
        // base:allocation: holes where the export reports them (a Volume: trimmed whole
        // sectors, only with allow_discards), data elsewhere. Never NBD_STATE_ZERO: a
        // sector that was never written or was trimmed decrypts to noise, not zeroes.
        (
            Command::BlockStatus {
                offset,
                len: l,
                one,
            },
            _,
        ) => {
            block_status = Some(allocation(export, offset, l, one));
            Ok(())
        }
        (Command::Read { offset, len: l }, Some(b)) => {
            read_offset = Some(offset);
            len = l as usize;
            export.submit(Io::read(&mut b[..len], offset).ctx(ctx))
        }
        (
            Command::Write {
                offset,
                len: l,
                fua,
            },
            Some(b),
            // The receive buffer is ours and read no more: the volume encrypts in place in it.
        ) => export.submit(
            Io::write_owned(&mut b[..l as usize], offset)
                .fua(fua)
                .ctx(ctx),
        ),
        (Command::Flush, _) => export.flush(),
        (Command::Trim { offset, len, fua }, _) => {
            emulate::discard(export, offset, u64::from(len), fua)
        }
        (Command::WriteZeroes { offset, len, fua }, _) => {
            emulate::write_zeroes(export, offset, u64::from(len), fua, ctx)
        }
        // Validation guarantees READ/WRITE carry a buffer and DISC never reaches a worker.
        _ => Err(BackendError::Other(
            "BUG: command without its buffer".into(),
        )),
    };
    let mut reply = answer(cookie, cmd, cost, buf, result, log);
    reply.read_offset = read_offset;
    reply.len = len;
    reply.block_status = block_status;
    reply
}

/// The reply to `cmd` given its outcome: for a READ, the data is `buf[..len]`; an error
/// becomes its errno (the spec's set: EIO for a failed backend request) and a message.
fn answer(
    cookie: u64,
    cmd: Command,
    cost: usize,
    buf: Option<Vec<u8>>,
    result: Result<(), BackendError>,
    log: bool,
) -> Reply {
    let error = result.err().map(|e| {
        if log {
            eprintln!("ucrypt-nbd: {cmd:?} failed: {}", chain(&e));
        }
        let errno = errno_of(&e);
        let mut msg = wire_message(cmd, errno, Some(e.errno()));
        if msg.len() > MAX_MESSAGE_BYTES {
            let mut cut = MAX_MESSAGE_BYTES;
            while !msg.is_char_boundary(cut) {
                cut -= 1;
            }
            msg.truncate(cut);
        }
        (errno, msg)
    });
    let (read_offset, len) = match cmd {
        Command::Read { offset, len } => (Some(offset), len as usize),
        _ => (None, 0),
    };
    Reply {
        cookie,
        read_offset,
        block_status: None,
        len,
        error,
        buf,
        cost,
    }
}

/// Most descriptors in one BLOCK_STATUS reply ("the server MAY return fewer descriptors
/// than needed to cover the whole length"; the client asks again from where they end).
const MAX_DESCRIPTORS: usize = 1024;

/// The `base:allocation` descriptors of `[offset, offset + len)`: `(length, flags)`,
/// holes as `NBD_STATE_HOLE`, data as 0; at most one with `one` (REQ_ONE).
fn allocation(export: &dyn Backend, offset: u64, len: u32, one: bool) -> Vec<(u32, u32)> {
    let end = offset + u64::from(len);
    let mut out: Vec<(u32, u32)> = Vec::new();
    let mut at = offset;
    let mut push = |l: u64, flags: u32| {
        // Each length fits: every range lies within the request, itself under 2^32.
        out.push((l as u32, flags));
    };
    for (o, l) in export.holes(offset, u64::from(len)).unwrap_or_default() {
        let (o, e) = (o.max(at), (o + l).min(end));
        if e <= o {
            continue;
        }
        if o > at {
            push(o - at, 0);
        }
        push(e - o, NBD_STATE_HOLE);
        at = e;
    }
    if at < end {
        push(end - at, 0);
    }
    out.truncate(if one { 1 } else { MAX_DESCRIPTORS });
    out
}

impl<W: Transport> Out<W> {
    /// Writes one reply whole (one `writev` for header and data), then returns its buffer
    /// and budget. After a send failure the client is gone: the socket is shut so the
    /// thread in `read` wakes up and the connection ends.
    ///
    /// On a queueing (asynchronous) connection this never blocks: it may run on the
    /// backend's completion thread, which every connection shares (librbd has one), so a
    /// client reading its replies slowly must not hold it. The reply goes out at once if
    /// the socket takes all of it and nothing is queued before it; otherwise (the rest
    /// of) it is queued for the connection's writer thread ([`Out::write_queued`]).
    fn send(&self, reply: Reply) {
        if !self.queueing {
            let mut batch = Batch::default();
            batch.push(reply, self.structured);
            self.send_batch(&mut batch);
            return;
        }
        let mut q = Queued {
            head: frame(&reply, self.structured),
            reply,
            sent: 0,
        };
        let mut guard = lock(&self.wr);
        let w = &mut *guard;
        if w.failed {
            drop(guard);
            self.done(q.reply);
            return;
        }
        if w.queue.is_empty() {
            // The writer is idle (it holds the socket only while the queue is not empty).
            if let Some(wr) = w.wr.as_mut() {
                loop {
                    match wr.try_write_vectored(&q.rest()) {
                        Ok(0) => break,
                        Ok(n) => {
                            q.sent += n;
                            if q.sent == q.total() {
                                drop(guard);
                                self.done(q.reply);
                                return;
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(_) => {
                            w.failed = true;
                            wr.shut();
                            drop(guard);
                            self.done(q.reply);
                            return;
                        }
                    }
                }
            }
        }
        w.queue.push_back(q);
        drop(guard);
        self.queued.notify_one();
    }

    /// Takes a request's share of the budget, sending `batch` first if it must wait.
    fn acquire(&self, bytes: usize, batch: &mut Batch) {
        if !self.budget.try_acquire(bytes) {
            self.send_batch(batch);
            self.budget.acquire(bytes);
        }
    }

    /// Sends the replies of `batch` (one `writev` per [`BATCH_REPLIES`], more if the socket
    /// takes part), then returns their buffers and budget; `batch` is empty after. If
    /// another thread is writing, the replies are left to it ([`Combine`]) and this returns
    /// at once.
    fn send_batch(&self, batch: &mut Batch) {
        if batch.replies.is_empty() {
            return;
        }
        if self.queueing {
            // Never batched (asynchronous connections answer from completions), but
            // should one come, the queue keeps replies whole.
            for (_, reply) in batch.replies.drain(..) {
                self.send(reply);
            }
            batch.heads.clear();
            batch.bytes = 0;
            return;
        }
        {
            let mut c = lock(&self.combine);
            if c.active {
                // The writer sends them before it lets the socket go.
                for (_, reply) in batch.replies.drain(..) {
                    c.pending.push(reply, self.structured);
                }
                batch.heads.clear();
                batch.bytes = 0;
                return;
            }
            c.active = true;
        }
        // Should a write panic, the next thread becomes the writer instead of leaving its
        // replies to nobody.
        struct Active<'a>(&'a Mutex<Combine>);
        impl Drop for Active<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    lock(self.0).active = false;
                }
            }
        }
        let _active = Active(&self.combine);
        loop {
            self.write_now(batch);
            let mut c = lock(&self.combine);
            if c.pending.is_empty() {
                c.active = false;
                return;
            }
            // `batch` is empty (written): take what was left meanwhile, leave it the
            // empty buffers.
            std::mem::swap(batch, &mut c.pending);
        }
    }

    /// Writes `batch` (the caller is the connection's writer: [`Combine::active`]), one
    /// `writev` per [`BATCH_REPLIES`] replies, then returns their buffers and budget;
    /// `batch` is empty after.
    fn write_now(&self, batch: &mut Batch) {
        {
            let mut guard = lock(&self.wr);
            let w = &mut *guard;
            if let (false, Some(wr)) = (w.failed, w.wr.as_mut()) {
                let mut start = 0;
                for chunk in batch.replies.chunks(BATCH_REPLIES) {
                    let mut iov = [IoSlice::new(&[]); 2 * BATCH_REPLIES];
                    let mut n = 0;
                    for (end, reply) in chunk {
                        iov[n] = IoSlice::new(&batch.heads[start..*end]);
                        n += 1;
                        let data = payload(reply);
                        if !data.is_empty() {
                            iov[n] = IoSlice::new(data);
                            n += 1;
                        }
                        start = *end;
                    }
                    if write_all_vectored(wr, &mut iov[..n]).is_err() {
                        w.failed = true;
                        wr.shut();
                        break;
                    }
                }
            }
        }
        let (mut count, mut bytes) = (0, 0);
        for (_, reply) in batch.replies.drain(..) {
            count += 1;
            bytes += reply.cost;
            if let Some(b) = reply.buf {
                self.pool.put(b);
            }
        }
        self.budget.release_many(count, bytes);
        batch.heads.clear();
        batch.bytes = 0;
    }

    /// A reply's end: its buffer back to the pool, its budget released.
    fn done(&self, reply: Reply) {
        if let Some(b) = reply.buf {
            self.pool.put(b);
        }
        self.budget.release(reply.cost);
    }

    /// The writer thread of a queueing connection: sends queued replies in order, taking
    /// the socket out of the lock while it blocks (senders meanwhile only queue). A
    /// client that reads slowly is served at its pace; one that reads nothing for
    /// `reply_timeout` (the socket's send timeout) fails the write and is cut off: the
    /// socket is shut and every queued reply dropped (its budget released).
    fn write_queued(&self) {
        let mut w = lock(&self.wr);
        loop {
            if w.queue.is_empty() {
                if w.closing || w.failed {
                    return;
                }
                w = self
                    .queued
                    .wait(w)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                continue;
            }
            if w.failed {
                let dropped: Vec<Queued> = w.queue.drain(..).collect();
                drop(w);
                for q in dropped {
                    self.done(q.reply);
                }
                w = lock(&self.wr);
                continue;
            }
            let (Some(mut wr), Some(mut q)) = (w.wr.take(), w.queue.pop_front()) else {
                return;
            };
            drop(w);
            let mut ok = true;
            while q.sent < q.total() {
                match wr.write_vectored(&q.rest()) {
                    Ok(0) => {
                        ok = false;
                        break;
                    }
                    Ok(n) => q.sent += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        ok = false;
                        break;
                    }
                }
            }
            if !ok {
                wr.shut();
            }
            self.done(q.reply);
            w = lock(&self.wr);
            w.wr = Some(wr);
            w.failed |= !ok;
        }
    }
}

/// `write_all` for several buffers (std's `write_all_vectored` is unstable).
fn write_all_vectored(w: &mut impl Write, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The data a reply carries after its [`frame`]: a successful READ's.
fn payload(r: &Reply) -> &[u8] {
    match (&r.error, &r.buf) {
        (None, Some(b)) if r.read_offset.is_some() && r.block_status.is_none() => &b[..r.len],
        _ => &[][..],
    }
}

/// A reply's bytes before its [`payload`]: simple, or (READ with structured replies) one
/// chunk with DONE set, or one block status chunk.
fn frame(r: &Reply, structured: bool) -> Vec<u8> {
    let mut h = Vec::new();
    frame_into(r, structured, &mut h);
    h
}

/// [`frame`], appended to `h`.
fn frame_into(r: &Reply, structured: bool, h: &mut Vec<u8>) {
    if let (true, Some(desc), None) = (structured, &r.block_status, &r.error) {
        // One NBD_REPLY_TYPE_BLOCK_STATUS chunk with DONE: the context id, then the
        // descriptors (length, status flags).
        h.reserve(STRUCTURED_REPLY_BYTES + 4 + 8 * desc.len());
        h.extend_from_slice(&NBD_STRUCTURED_REPLY_MAGIC.to_be_bytes());
        h.extend_from_slice(&NBD_REPLY_FLAG_DONE.to_be_bytes());
        h.extend_from_slice(&NBD_REPLY_TYPE_BLOCK_STATUS.to_be_bytes());
        h.extend_from_slice(&r.cookie.to_be_bytes());
        // At most MAX_DESCRIPTORS: far below 2^32 bytes.
        h.extend_from_slice(&((4 + 8 * desc.len()) as u32).to_be_bytes());
        h.extend_from_slice(&BASE_ALLOCATION_ID.to_be_bytes());
        for (l, f) in desc {
            h.extend_from_slice(&l.to_be_bytes());
            h.extend_from_slice(&f.to_be_bytes());
        }
        return;
    }
    if let (true, Some(offset)) = (structured, r.read_offset) {
        // "If structured replies are negotiated ... MUST NOT use a simple reply for
        // NBD_CMD_READ (even for the case of an early EINVAL due to bad flags)".
        h.extend_from_slice(&NBD_STRUCTURED_REPLY_MAGIC.to_be_bytes());
        h.extend_from_slice(&NBD_REPLY_FLAG_DONE.to_be_bytes());
        match &r.error {
            None => {
                h.extend_from_slice(&NBD_REPLY_TYPE_OFFSET_DATA.to_be_bytes());
                h.extend_from_slice(&r.cookie.to_be_bytes());
                // len <= max payload (32 MiB by default), far below 2^32 - 8.
                h.extend_from_slice(&((payload(r).len() + 8) as u32).to_be_bytes());
                h.extend_from_slice(&offset.to_be_bytes());
            }
            Some((errno, msg)) => {
                h.extend_from_slice(&NBD_REPLY_TYPE_ERROR.to_be_bytes());
                h.extend_from_slice(&r.cookie.to_be_bytes());
                h.extend_from_slice(&((6 + msg.len()) as u32).to_be_bytes());
                h.extend_from_slice(&errno.value().to_be_bytes());
                h.extend_from_slice(&(msg.len() as u16).to_be_bytes());
                h.extend_from_slice(msg.as_bytes());
            }
        }
    } else {
        h.extend_from_slice(&NBD_SIMPLE_REPLY_MAGIC.to_be_bytes());
        let errno = r.error.as_ref().map_or(0, |(e, _)| e.value());
        h.extend_from_slice(&errno.to_be_bytes());
        h.extend_from_slice(&r.cookie.to_be_bytes());
    }
}
