//! Modes J, D and B over a backend with I/O latency: 4 KiB random writes, then random reads,
//! from DEPTH threads at once (fio's psync engine with numjobs = DEPTH), over a memory
//! backend whose every read and write first sleeps LAT_US microseconds (a device's latency,
//! which the memory backend of `ucrypt bench` does not have). With one lock over every
//! write, IOPS stay at one write's latency whatever the depth; with range locks they grow
//! with it. Crc32c tags, 4096-byte blocks, IOPS medians of ROUNDS.
//!
//! ```text
//! cargo run --release -p ucrypt-integrity --example latency_depth [LAT_US] [SECONDS] [ROUNDS] [MODES]
//! ```
//!
//! MODES: the mode letters to measure, in order (default `JDB`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use ucrypt_backend::{Backend, BackendError, BackendInfo, Io, MemoryBackend};
use ucrypt_format::integrity::FormatParams;
use ucrypt_integrity::{format, Algorithm, IntegrityBackend, Mode, Options};

/// A memory backend whose requests each take `lat` first.
struct Latency {
    mem: MemoryBackend,
    lat: AtomicU64,
}

impl Backend for Latency {
    fn info(&self) -> &BackendInfo {
        self.mem.info()
    }

    fn submit(&self, io: Io<'_>) -> Result<(), BackendError> {
        let us = self.lat.load(Ordering::Relaxed);
        if us > 0 {
            std::thread::sleep(Duration::from_micros(us));
        }
        self.mem.submit(io)
    }

    fn flush(&self) -> Result<(), BackendError> {
        self.mem.flush()
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// IOPS of `depth` threads issuing 4 KiB requests at random blocks for `secs`.
fn iops(dev: &IntegrityBackend, depth: u64, write: bool, secs: f64) -> f64 {
    let blocks = dev.info().size_bytes / 4096;
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let t = Instant::now();
    std::thread::scope(|s| {
        for d in 0..depth {
            let (stop, done) = (&stop, &done);
            s.spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (d + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
                let mut buf = vec![d as u8; 4096];
                while !stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let at = (x % blocks) * 4096;
                    if write {
                        dev.write_at(&buf, at, false).expect("write");
                    } else {
                        dev.read_at(&mut buf, at).expect("read");
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
    });
    done.load(Ordering::Relaxed) as f64 / t.elapsed().as_secs_f64()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let lat: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(50);
    let secs: f64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(0.5);
    let rounds: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(3);
    let modes: Vec<Mode> = args
        .get(4)
        .map_or("JDB", String::as_str)
        .chars()
        .filter_map(|c| match c {
            'J' => Some(Mode::Journal),
            'D' => Some(Mode::Direct),
            'B' => Some(Mode::Bitmap),
            _ => None,
        })
        .collect();
    println!("latency {lat} us per backend request, {secs} s per cell, median of {rounds}");
    println!("mode op    depth   IOPS");
    for mode in modes {
        let mem = Arc::new(Latency {
            mem: MemoryBackend::new(64 << 20).expect("memory"),
            lat: AtomicU64::new(0),
        });
        let inner: Arc<dyn Backend> = Arc::clone(&mem) as Arc<dyn Backend>;
        let mut o = Options::new(Algorithm::Crc32c);
        o.mode = mode;
        let params = FormatParams {
            sector_size: 4096,
            tag_size: 4,
            ..FormatParams::default()
        };
        format(Arc::clone(&inner), &params, &o, true).expect("format");
        let dev = IntegrityBackend::open(inner, o).expect("open");
        mem.lat.store(lat, Ordering::Relaxed);
        for write in [true, false] {
            for depth in [1u64, 8, 32] {
                let v: Vec<f64> = (0..rounds)
                    .map(|_| iops(&dev, depth, write, secs))
                    .collect();
                let op = if write { "write" } else { "read " };
                println!("{}    {op} {depth:>5} {:>8.0}", mode.letter(), median(v));
            }
        }
        mem.lat.store(0, Ordering::Relaxed);
        dev.close().expect("close");
    }
}
