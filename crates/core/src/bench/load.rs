//! The load generator: `iodepth` threads, each issuing synchronous requests of one size at
//! random aligned offsets for a fixed time (fio's `psync` engine with `numjobs = iodepth`).
//! A synchronous call per thread is exactly what a `Volume` sees from the NBD server, one
//! in-flight request per server thread.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use ucrypt_backend::{Backend, IoCtx};

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
                        Op::Write => dev.write_in_place_ctx(&mut buf, off, false, IoCtx::default()),
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
