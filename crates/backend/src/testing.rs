//! A conformance suite any writable [`Backend`] must pass, as library code so every
//! implementation (and `engine::Volume`, which implements the same trait) runs the same
//! checks, in the manner of cloud-hypervisor's `block/src/raw/tests.rs`.
//!
//! [`conformance`] needs a writable backend of at least 256 units (a unit is 4 KiB or the
//! logical block, whichever is larger, so 1 MiB for most backends) whose contents it may
//! overwrite. Every offset and length it uses is a multiple of `info().logical_block`,
//! so `O_DIRECT` backends and large-sector volumes qualify. Buffers are deliberately
//! both aligned and misaligned in memory. Failures panic with the check, offset and
//! length, as a test assertion does.

use crate::aligned::AlignedBuf;
use crate::{AsyncIo, AsyncOp, Backend, BackendError, IoCtx, Support, WriteOp};
use std::sync::Arc;

/// The unit the checks' geometry is measured in: 4 KiB (so requests cross the memory
/// backend's 64 KiB chunks and page boundaries) or the logical block if larger.
fn unit(b: &dyn Backend) -> u64 {
    u64::from(b.info().logical_block).max(4096)
}

/// Units of space the suite needs at the start of the device.
const UNITS: u64 = 256;

/// The deterministic test pattern for absolute byte position `pos` under `seed`.
///
/// Every 8-byte word differs with its position, so data landing at the wrong offset
/// (or a stale copy) is caught, not only missing data.
fn pattern_byte(pos: u64, seed: u64) -> u8 {
    let word = ((pos / 8) ^ seed.rotate_left(17)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (word >> ((pos % 8) * 8)) as u8
}

fn fill(buf: &mut [u8], offset: u64, seed: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = pattern_byte(offset + i as u64, seed);
    }
}

fn pattern(offset: u64, len: u64, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len as usize];
    fill(&mut v, offset, seed);
    v
}

fn ok<T>(r: Result<T, BackendError>, what: &str, offset: u64, len: u64) -> T {
    r.unwrap_or_else(|e| panic!("{what} at {offset}+{len} failed: {e}"))
}

fn read(b: &dyn Backend, offset: u64, len: u64) -> Vec<u8> {
    let mut v = vec![0u8; len as usize];
    ok(b.read_at(&mut v, offset), "read", offset, len);
    v
}

/// Asserts that `[offset, offset+len)` holds `want`; names the first differing byte.
fn expect(b: &dyn Backend, offset: u64, want: &[u8], what: &str) {
    let got = read(b, offset, want.len() as u64);
    if let Some(i) = got.iter().zip(want).position(|(g, w)| g != w) {
        panic!(
            "{what}: byte at {} is {:#04x}, expected {:#04x} (request {offset}+{})",
            offset + i as u64,
            got[i],
            want[i],
            want.len()
        );
    }
}

fn expect_out_of_range(r: Result<(), BackendError>, what: &str) {
    match r {
        Err(BackendError::OutOfRange { .. }) => {}
        other => panic!("{what}: expected OutOfRange, got {other:?}"),
    }
}

/// Runs every check below on `b`.
///
/// # Panics
/// On the first check that fails, or if `b` is read-only, its logical block is not a
/// power of two, or it is smaller than 256 units (1 MiB for logical blocks up to 4 KiB).
pub fn conformance(b: &dyn Backend) {
    let info = b.info();
    assert!(!info.caps.read_only, "conformance needs a writable backend");
    assert!(
        info.logical_block.is_power_of_two(),
        "logical_block {} is not a power of two",
        info.logical_block
    );
    assert!(
        info.size_bytes >= UNITS * unit(b),
        "conformance needs at least {} bytes, backend has {}",
        UNITS * unit(b),
        info.size_bytes
    );
    round_trips(b);
    rejects_out_of_range(b);
    accepts_zero_length(b);
    write_zeroes_reads_back_zero(b);
    discard_keeps_neighbours(b);
    batch_keeps_order(b);
    flush_and_fua_succeed(b);
    conformance_concurrent(b, 4);
}

/// Write then read back at assorted aligned offsets and lengths, from aligned and
/// misaligned memory.
pub fn round_trips(b: &dyn Backend) {
    let lb = u64::from(b.info().logical_block);
    let size = b.info().size_bytes;
    let u = unit(b);
    let lens = [lb, 2 * lb, u, 8 * lb, 16 * u, 16 * u + lb, 32 * u + 3 * lb];
    let offsets = [0, lb, 3 * lb, 16 * u - lb, 16 * u, 48 * u + 5 * lb];
    let mut seed = 1;
    for &len in &lens {
        let ends = [size / lb * lb - len];
        for &offset in offsets.iter().chain(&ends) {
            seed += 1;
            let data = pattern(offset, len, seed);
            ok(b.write_at(&data, offset, false), "write", offset, len);
            expect(b, offset, &data, "round trip");

            // Aligned memory (the O_DIRECT fast path) for both directions.
            let mut abuf = ok(AlignedBuf::zeroed(len as usize, 4096), "alloc", 0, len);
            fill(&mut abuf, offset, seed + 1000);
            ok(
                b.write_at(&abuf, offset, false),
                "aligned write",
                offset,
                len,
            );
            let mut aread = ok(AlignedBuf::zeroed(len as usize, 4096), "alloc", 0, len);
            ok(b.read_at(&mut aread, offset), "aligned read", offset, len);
            assert!(
                aread[..] == abuf[..],
                "aligned round trip at {offset}+{len} differs"
            );

            // Misaligned memory (one byte into an allocation) for both directions.
            let mut raw = vec![0u8; len as usize + 1];
            fill(&mut raw[1..], offset, seed + 2000);
            ok(
                b.write_at(&raw[1..], offset, false),
                "misaligned write",
                offset,
                len,
            );
            let mut back = vec![0u8; len as usize + 1];
            ok(
                b.read_at(&mut back[1..], offset),
                "misaligned read",
                offset,
                len,
            );
            assert!(
                back[1..] == raw[1..],
                "misaligned round trip at {offset}+{len} differs"
            );
        }
    }
}

/// Requests reaching past the end fail with `OutOfRange` and change nothing.
pub fn rejects_out_of_range(b: &dyn Backend) {
    let lb = u64::from(b.info().logical_block);
    let size = b.info().size_bytes;
    let last = size / lb * lb - lb;
    let tail = pattern(last, lb, 77);
    ok(b.write_at(&tail, last, false), "write", last, lb);

    let mut buf = vec![0u8; 2 * lb as usize];
    expect_out_of_range(b.read_at(&mut buf[..lb as usize], size), "read at the end");
    expect_out_of_range(b.read_at(&mut buf, last), "read across the end");
    expect_out_of_range(
        b.read_at(&mut buf, u64::MAX - lb + 1),
        "read overflowing u64",
    );
    expect_out_of_range(b.write_at(&buf, last, false), "write across the end");
    expect_out_of_range(
        b.write_at(&buf[..lb as usize], size, true),
        "write at the end",
    );
    expect_out_of_range(
        b.write_at(&buf, u64::MAX - lb + 1, false),
        "write overflowing u64",
    );
    expect_out_of_range(
        b.submit_writes(&[WriteOp {
            offset: last,
            buf: &buf,
            fua: false,
        }]),
        "batched write across the end",
    );
    if b.info().caps.write_zeroes != Support::None {
        expect_out_of_range(
            b.write_zeroes(last, 2 * lb, false),
            "write_zeroes across the end",
        );
    }
    if b.info().caps.discard != Support::None {
        expect_out_of_range(b.discard(last, 2 * lb), "discard across the end");
    }
    expect(b, last, &tail, "last block after refused requests");
}

/// Zero-length requests succeed anywhere up to the end, and fail beyond it.
pub fn accepts_zero_length(b: &dyn Backend) {
    let size = b.info().size_bytes;
    for offset in [0, size] {
        ok(b.read_at(&mut [], offset), "empty read", offset, 0);
        ok(b.write_at(&[], offset, false), "empty write", offset, 0);
        ok(b.submit_writes(&[]), "empty batch", offset, 0);
        if b.info().caps.write_zeroes != Support::None {
            ok(
                b.write_zeroes(offset, 0, false),
                "empty write_zeroes",
                offset,
                0,
            );
        }
        if b.info().caps.discard != Support::None {
            ok(b.discard(offset, 0), "empty discard", offset, 0);
        }
    }
    expect_out_of_range(b.read_at(&mut [], size + 1), "empty read past the end");
}

/// After write-zeroes the range reads as zeros; its neighbours keep their data.
pub fn write_zeroes_reads_back_zero(b: &dyn Backend) {
    if b.info().caps.write_zeroes == Support::None {
        return;
    }
    let lb = u64::from(b.info().logical_block);
    let u = unit(b);
    for (offset, len, zoff, zlen, fua) in [
        (0, 64 * u, 4 * u, 16 * u + lb, false),
        (128 * u, 32 * u, 128 * u + lb, lb, true),
        (192 * u, 32 * u, 192 * u, 32 * u, false),
    ] {
        let data = pattern(offset, len, 300 + zoff);
        ok(b.write_at(&data, offset, false), "write", offset, len);
        ok(b.write_zeroes(zoff, zlen, fua), "write_zeroes", zoff, zlen);
        let mut want = data;
        let s = (zoff - offset) as usize;
        want[s..s + zlen as usize].fill(0);
        expect(b, offset, &want, "after write_zeroes");
    }
}

/// Discard succeeds, the range stays readable, and data around it is untouched.
pub fn discard_keeps_neighbours(b: &dyn Backend) {
    if b.info().caps.discard == Support::None {
        return;
    }
    let lb = u64::from(b.info().logical_block);
    let u = unit(b);
    let (offset, len) = (0, 128 * u);
    let data = pattern(offset, len, 400);
    ok(b.write_at(&data, offset, false), "write", offset, len);
    let (doff, dlen) = (16 * u + lb, 32 * u);
    ok(b.discard(doff, dlen), "discard", doff, dlen);
    read(b, doff, dlen); // contents unspecified, but readable
    let d = doff as usize;
    expect(b, offset, &data[..d], "before the discarded range");
    let e = (doff + dlen) as usize;
    expect(b, doff + dlen, &data[e..], "after the discarded range");
}

/// A batch reaches the device in order: of two writes to one offset, the later wins.
pub fn batch_keeps_order(b: &dyn Backend) {
    let lb = u64::from(b.info().logical_block);
    let (x, y) = (16 * lb, 64 * lb);
    let first = pattern(x, 4 * lb, 501);
    let second = pattern(x, 4 * lb, 502);
    let other = pattern(y, 2 * lb, 503);
    let partial = pattern(x + lb, lb, 504);
    let batch = [
        WriteOp {
            offset: x,
            buf: &first,
            fua: false,
        },
        WriteOp {
            offset: y,
            buf: &other,
            fua: true,
        },
        WriteOp {
            offset: x,
            buf: &second,
            fua: false,
        },
        WriteOp {
            offset: x + lb,
            buf: &partial,
            fua: false,
        },
    ];
    ok(b.submit_writes(&batch), "submit_writes", x, 4 * lb);
    let mut want = second.clone();
    want[lb as usize..2 * lb as usize].copy_from_slice(&partial);
    expect(b, x, &want, "batch order");
    expect(b, y, &other, "batch second target");
}

/// Flush succeeds (also with nothing written since the last one), and so do FUA writes,
/// whose data reads back.
pub fn flush_and_fua_succeed(b: &dyn Backend) {
    let lb = u64::from(b.info().logical_block);
    let offset = 100 * lb;
    let data = pattern(offset, 4 * lb, 600);
    ok(b.write_at(&data, offset, true), "FUA write", offset, 4 * lb);
    expect(b, offset, &data, "after FUA write");
    ok(b.flush(), "flush", 0, 0);
    ok(b.flush(), "second flush", 0, 0);
    ok(
        b.write_at(&data[..lb as usize], offset, false),
        "write",
        offset,
        lb,
    );
    ok(b.flush(), "flush after write", 0, 0);
}

/// `threads` writers fill interleaved units of the first 256 units (1 MiB for logical
/// blocks up to 4 KiB) at once, so neighbours share chunks, pages and stripes; then every
/// unit is checked.
///
/// # Panics
/// If any write fails or any block does not hold what its writer wrote.
pub fn conformance_concurrent(b: &dyn Backend, threads: u64) {
    let block = unit(b);
    let blocks = UNITS.min(b.info().size_bytes / block);
    let threads = threads.max(1);
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                for i in (t..blocks).step_by(threads as usize) {
                    let offset = i * block;
                    let data = pattern(offset, block, 700 + t);
                    ok(
                        b.write_at(&data, offset, i % 7 == 0),
                        "concurrent write",
                        offset,
                        block,
                    );
                    // Reads racing other writers must succeed too.
                    read(b, (i ^ 1).min(blocks - 1) * block, block);
                }
            });
        }
    });
    for i in 0..blocks {
        let offset = i * block;
        let want = pattern(offset, block, 700 + i % threads);
        expect(b, offset, &want, "concurrent writers");
    }
}

/// Runs one asynchronous request and waits for its completion; `None` when refused (the
/// buffer comes back untouched, which is checked).
fn run_async(b: &Arc<dyn Backend>, op: AsyncOp, offset: u64, buf: Vec<u8>) -> Option<Vec<u8>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let len = buf.len();
    let before = buf.clone();
    let io = AsyncIo {
        op,
        offset,
        len,
        buf,
        ctx: IoCtx::default(),
        done: Box::new(move |buf, r| tx.send((buf, r)).expect("the waiter is gone")),
    };
    match Arc::clone(b).submit_async(io) {
        Err(io) => {
            assert!(io.buf == before, "a refused request's buffer was changed");
            None
        }
        Ok(()) => {
            let (buf, r) = rx
                .recv()
                .expect("an accepted request's completion never ran");
            ok(r, "asynchronous request", offset, len as u64);
            assert!(
                rx.recv().is_err(),
                "a completion ran twice ({op:?} at {offset})"
            );
            Some(buf)
        }
    }
}

/// The asynchronous path of a backend that offers one (([`crate::Hints::async_submit`]):
/// `threads` submitters each keep many writes of their own units in flight at once (each
/// request's completion arrives on the backend's threads, in any order), then read every
/// unit back asynchronously and synchronously; a request out of range is refused
/// untouched or fails, never reaches past the end; every completion runs exactly once.
///
/// # Panics
/// If a request the backend accepted fails, a completion is lost or repeated, or the data
/// of the two paths differ.
pub fn async_conformance(b: &Arc<dyn Backend>, threads: u64) {
    assert!(
        b.hints().async_submit,
        "the backend has no asynchronous path"
    );
    let block = unit(&**b);
    let blocks = UNITS.min(b.info().size_bytes / block);
    let threads = threads.max(1);
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                // All of this thread's writes in flight at once.
                let (tx, rx) = std::sync::mpsc::channel();
                let mut sent = 0;
                for i in (t..blocks).step_by(threads as usize) {
                    let offset = i * block;
                    let tx = tx.clone();
                    let io = AsyncIo {
                        op: AsyncOp::Write,
                        offset,
                        len: block as usize,
                        buf: pattern(offset, block, 900 + t),
                        ctx: IoCtx::default(),
                        done: Box::new(move |_, r| tx.send((offset, r)).expect("waiter gone")),
                    };
                    match Arc::clone(b).submit_async(io) {
                        Ok(()) => sent += 1,
                        Err(io) => ok(
                            b.write_at(&io.buf, offset, false),
                            "synchronous write of a refused request",
                            offset,
                            block,
                        ),
                    }
                }
                drop(tx);
                let mut got = 0;
                for (offset, r) in rx.iter() {
                    ok(r, "asynchronous write", offset, block);
                    got += 1;
                }
                assert_eq!(got, sent, "completions lost or repeated");
            });
        }
    });
    for i in 0..blocks {
        let offset = i * block;
        let want = pattern(offset, block, 900 + i % threads);
        expect(&**b, offset, &want, "asynchronous writes, synchronous read");
        if let Some(buf) = run_async(b, AsyncOp::Read, offset, vec![0u8; block as usize]) {
            assert!(
                buf == want,
                "asynchronous read at {offset} differs from what was written"
            );
        }
    }
    // Past the end: refused untouched, or failed.
    let size = b.info().size_bytes;
    let (tx, rx) = std::sync::mpsc::channel();
    let io = AsyncIo {
        op: AsyncOp::Read,
        offset: size,
        len: block as usize,
        buf: vec![0u8; block as usize],
        ctx: IoCtx::default(),
        done: Box::new(move |_, r| tx.send(r).expect("waiter gone")),
    };
    if Arc::clone(b).submit_async(io).is_ok() {
        assert!(
            rx.recv().expect("completion lost").is_err(),
            "a read past the end succeeded"
        );
    }
    ok(b.flush(), "flush after asynchronous writes", 0, 0);
}

/// A backend with an asynchronous path for tests: requests submitted to it run on the
/// inner backend's synchronous methods on `threads` threads of its own, each after a
/// pseudo-random delay (so completions arrive out of order, on other threads, as librbd's
/// do), and fail with `EIO` while [`AsyncThreads::fail`] is set.
pub struct AsyncThreads {
    inner: Arc<dyn Backend>,
    queue: std::sync::Mutex<Option<std::sync::mpsc::Sender<AsyncIo>>>,
    threads: std::sync::Mutex<Vec<std::thread::JoinHandle<()>>>,
    fail: Arc<std::sync::atomic::AtomicBool>,
    /// Requests accepted so far.
    pub accepted: Arc<std::sync::atomic::AtomicU64>,
    /// Requests completed so far (counted just before their `done` is called).
    pub completed: Arc<std::sync::atomic::AtomicU64>,
}

impl AsyncThreads {
    /// Wraps `inner` with `threads` completion threads.
    pub fn new(inner: Arc<dyn Backend>, threads: usize) -> AsyncThreads {
        let (tx, rx) = std::sync::mpsc::channel::<AsyncIo>();
        let rx = Arc::new(std::sync::Mutex::new(rx));
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let completed = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let handles = (0..threads.max(1))
            .map(|t| {
                let (rx, inner, fail) = (Arc::clone(&rx), Arc::clone(&inner), Arc::clone(&fail));
                let completed = Arc::clone(&completed);
                std::thread::spawn(move || {
                    let mut seed = 0x9e37_79b9_u64 ^ t as u64;
                    loop {
                        let io = match rx.lock().map(|r| r.recv()) {
                            Ok(Ok(io)) => io,
                            _ => return,
                        };
                        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                        std::thread::sleep(std::time::Duration::from_micros((seed >> 33) % 300));
                        let AsyncIo {
                            op,
                            offset,
                            len,
                            mut buf,
                            done,
                            ..
                        } = io;
                        let r = if fail.load(std::sync::atomic::Ordering::SeqCst) {
                            Err(BackendError::Io {
                                op: "injected",
                                offset,
                                path: "async-threads".into(),
                                source: std::io::Error::from_raw_os_error(5),
                            })
                        } else {
                            match op {
                                AsyncOp::Read => inner.read_at(&mut buf[..len], offset),
                                AsyncOp::Write => inner.write_at(&buf[..len], offset, false),
                            }
                        };
                        // Counted before `done`: whoever waits for `done` sees it.
                        completed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        done(buf, r);
                    }
                })
            })
            .collect();
        AsyncThreads {
            inner,
            queue: std::sync::Mutex::new(Some(tx)),
            threads: std::sync::Mutex::new(handles),
            fail,
            accepted: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            completed,
        }
    }

    /// Makes every asynchronous request from now on fail (`true`) or succeed.
    pub fn fail(&self, on: bool) {
        self.fail.store(on, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for AsyncThreads {
    fn drop(&mut self) {
        if let Ok(mut q) = self.queue.lock() {
            q.take();
        }
        if let Ok(mut t) = self.threads.lock() {
            for h in t.drain(..) {
                let _ = h.join();
            }
        }
    }
}

impl Backend for AsyncThreads {
    fn info(&self) -> &crate::BackendInfo {
        self.inner.info()
    }
    /// The inner backend's, except what would bypass the asynchronous path's ordering.
    fn submit(&self, io: crate::Io<'_>) -> Result<(), BackendError> {
        match io.kind {
            crate::IoKind::Lend { .. } | crate::IoKind::Modify { .. } => {
                crate::emulate::fallback(self, io)
            }
            _ => self.inner.submit(io),
        }
    }
    fn flush(&self) -> Result<(), BackendError> {
        self.inner.flush()
    }
    fn hints(&self) -> crate::Hints {
        crate::Hints {
            async_submit: true,
            ..crate::Hints::default()
        }
    }
    fn submit_async(self: Arc<Self>, io: AsyncIo) -> Result<(), AsyncIo> {
        if io.len == 0
            || io.len > io.buf.len()
            || crate::check_range(io.offset, io.len as u64, self.info().size_bytes).is_err()
        {
            return Err(io);
        }
        let q = self
            .queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match q.as_ref() {
            Some(tx) => {
                self.accepted
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                // The threads live as long as the sender: the send cannot fail.
                tx.send(io).map_err(|e| e.0)
            }
            None => Err(io),
        }
    }
}
