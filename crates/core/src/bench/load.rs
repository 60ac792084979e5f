//! The load generator: `iodepth` threads, each issuing synchronous requests of one size at
//! random aligned offsets for a fixed time (fio's `psync` engine with `numjobs = iodepth`).
//! A synchronous call per thread is exactly what a `Volume` sees from the NBD server, one
//! in-flight request per server thread.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use ucrypt_backend::{Backend, Io, IoCtx};

/// Read or write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Random reads.
    Read,
    /// Random writes.
    Write,
}

impl Op {
    /// Name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "randread",
            Op::Write => "randwrite",
        }
    }
}

/// One measurement's result.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Requests completed.
    pub ops: u64,
    /// Wall time.
    pub secs: f64,
    /// Bytes per request.
    pub block: usize,
}

impl Sample {
    /// MiB/s.
    pub fn mib_s(&self) -> f64 {
        self.ops as f64 * self.block as f64 / self.secs / (1024.0 * 1024.0)
    }
    /// Requests per second.
    pub fn iops(&self) -> f64 {
        self.ops as f64 / self.secs
    }
}

/// Runs `depth` threads of `op` with `block`-byte requests over the first `region` bytes of
/// `dev` for `secs`.
pub fn run(
    dev: &Arc<dyn Backend>,
    op: Op,
    block: usize,
    depth: usize,
    region: u64,
    secs: f64,
) -> Sample {
    // Counted ops are exactly those between `go` and `stop`, timed by the main thread at
    // those two stores: with many more threads than CPUs, a barrier's wake-ups and the
    // final joins take milliseconds, and counting across them made cells at depth 32-256
    // spread by 30-60 % between repeats.
    let go = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    // Set by the first request to complete: a window shorter than one request (a 10 ms
    // cell on a loaded machine) is stretched until one has, so no cell reports 0 MiB/s.
    let progressed = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(depth + 1));
    let slots = (region / block as u64).max(1);
    let threads: Vec<_> = (0..depth)
        .map(|t| {
            let (dev, go, stop, total, start, progressed) = (
                Arc::clone(dev),
                Arc::clone(&go),
                Arc::clone(&stop),
                Arc::clone(&total),
                Arc::clone(&start),
                Arc::clone(&progressed),
            );
            std::thread::spawn(move || {
                let mut buf = vec![0xa5u8; block];
                let mut rng =
                    0x9e37_79b9_7f4a_7c15u64 ^ (t as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                let mut ops = 0u64;
                start.wait();
                while !go.load(Ordering::Acquire) {
                    std::thread::yield_now();
                }
                while !stop.load(Ordering::Relaxed) {
                    // xorshift64: cheap, and the same sequence every run.
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let off = (rng % slots) * block as u64;
                    let r = match op {
                        Op::Read => dev.read_at(&mut buf, off),
                        // As the NBD server and ublk do: the request's buffer is given up.
                        Op::Write => dev.submit(Io::write_owned(&mut buf, off)),
                    };
                    if let Err(e) = r {
                        eprintln!("bench: {} at {off}: {e}", op.name());
                        break;
                    }
                    ops += 1;
                    if ops == 1 {
                        progressed.store(true, Ordering::Relaxed);
                    }
                }
                total.fetch_add(ops, Ordering::Relaxed);
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    go.store(true, Ordering::Release);
    std::thread::sleep(Duration::from_secs_f64(secs));
    // Bounded: a device that fails every request ends its threads, not this wait.
    while !progressed.load(Ordering::Relaxed)
        && t0.elapsed() < Duration::from_secs(10)
        && threads.iter().any(|t| !t.is_finished())
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, Ordering::Relaxed);
    let secs = t0.elapsed().as_secs_f64();
    for t in threads {
        let _ = t.join();
    }
    Sample {
        ops: total.load(Ordering::Relaxed),
        secs,
        block,
    }
}

/// How a queued load lays out its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Random aligned offsets (fio `randread`/`randwrite`).
    Random,
    /// One after the other, wrapping at the region's end (fio `read`/`write`).
    Sequential,
}

/// One queued measurement: what was done and what it cost this process.
#[derive(Debug, Clone, Copy)]
pub struct QueuedSample {
    /// Requests completed in the window, time and size.
    pub sample: Sample,
    /// CPU time (user + system) of the whole process over the window, in microseconds:
    /// the load generator, the engine and, for a device such as RBD, its client library's
    /// threads.
    pub cpu_us: f64,
}

impl QueuedSample {
    /// CPU time per completed request, in microseconds.
    pub fn cpu_us_per_op(&self) -> f64 {
        self.cpu_us / self.sample.ops.max(1) as f64
    }
}

/// User + system CPU time of this process so far, in microseconds.
fn process_cpu_us() -> f64 {
    // SAFETY: an all-zero rusage is valid; getrusage only writes it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    us(u.ru_utime) + us(u.ru_stime)
}

/// Keeps `depth` requests of `block` bytes in flight over `[base, base + region)` of `dev`
/// for `secs`, from one thread, as fio's `rbd` engine keeps its queue full: each request
/// goes to [`Backend::submit_async`] and completes on the device's own thread; a request
/// the device does not take asynchronously (a volume's large or partial-sector requests)
/// runs synchronously on one of `depth` helper threads instead, as ucrypt's NBD server
/// runs it. So the same generator drives a device (librbd without a crypt layer) and a
/// volume over it, and the two are compared without any NBD hop. Requests completed
/// before the deadline are counted; those still in flight then are waited for, not
/// counted.
///
/// # Errors
/// The first failed request, once every request in flight has ended.
#[allow(clippy::too_many_arguments)]
pub fn run_queued(
    dev: &Arc<dyn Backend>,
    base: u64,
    region: u64,
    op: Op,
    pattern: Pattern,
    block: usize,
    depth: usize,
    secs: f64,
) -> Result<QueuedSample, String> {
    use std::sync::mpsc;
    use ucrypt_backend::{AsyncIo, AsyncOp, BackendError};
    type Done = (Vec<u8>, Result<(), BackendError>);
    let depth = depth.max(1);
    let slots = (region / block as u64).max(1);
    let (done_tx, done_rx) = mpsc::channel::<Done>();
    // The synchronous helpers: idle unless the device refuses asynchronous requests.
    let (job_tx, job_rx) = mpsc::channel::<(u64, Vec<u8>)>();
    let job_rx = Arc::new(std::sync::Mutex::new(job_rx));
    let helpers: Vec<_> = (0..depth)
        .map(|_| {
            let (dev, rx, tx) = (Arc::clone(dev), Arc::clone(&job_rx), done_tx.clone());
            std::thread::spawn(move || loop {
                let job = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                let Ok((off, mut buf)) = job else { return };
                let r = match op {
                    Op::Read => dev.read_at(&mut buf, off),
                    Op::Write => dev.submit(Io::write_owned(&mut buf, off)),
                };
                if tx.send((buf, r)).is_err() {
                    return;
                }
            })
        })
        .collect();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next_seq = 0u64;
    let mut next_offset = || match pattern {
        Pattern::Random => {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            base + (rng % slots) * block as u64
        }
        Pattern::Sequential => {
            let o = base + (next_seq % slots) * block as u64;
            next_seq += 1;
            o
        }
    };
    let submit = |off: u64, buf: Vec<u8>| {
        let tx = done_tx.clone();
        let io = AsyncIo {
            op: match op {
                Op::Read => AsyncOp::Read,
                Op::Write => AsyncOp::Write,
            },
            offset: off,
            len: block,
            buf,
            ctx: IoCtx::default(),
            done: Box::new(move |buf, r| {
                let _ = tx.send((buf, r));
            }),
        };
        if let Err(io) = Arc::clone(dev).submit_async(io) {
            // Cannot fail: the helpers hold the receiver until `job_tx` is dropped.
            let _ = job_tx.send((off, io.buf));
        }
    };
    let t0 = Instant::now();
    let cpu0 = process_cpu_us();
    let deadline = t0 + Duration::from_secs_f64(secs);
    for _ in 0..depth {
        submit(next_offset(), vec![0xa5u8; block]);
    }
    let (mut in_flight, mut ops, mut failed) = (depth, 0u64, None);
    let mut end = None;
    while in_flight > 0 {
        let Ok((buf, r)) = done_rx.recv() else { break };
        in_flight -= 1;
        if let Err(e) = r {
            failed.get_or_insert_with(|| format!("{} at some offset: {e}", op.name()));
        }
        if end.is_none() {
            if Instant::now() < deadline {
                ops += 1;
            } else {
                end = Some((t0.elapsed().as_secs_f64(), process_cpu_us()));
            }
        }
        if end.is_none() && failed.is_none() {
            submit(next_offset(), buf);
            in_flight += 1;
        }
    }
    drop(job_tx);
    for h in helpers {
        let _ = h.join();
    }
    if let Some(e) = failed {
        return Err(e);
    }
    let (secs, cpu1) = end.unwrap_or_else(|| (t0.elapsed().as_secs_f64(), process_cpu_us()));
    Ok(QueuedSample {
        sample: Sample { ops, secs, block },
        cpu_us: cpu1 - cpu0,
    })
}
