//! What the instance [`Switch`] (the suspendable backend every `ucrypt open NAME` front end
//! serves) adds to a request: 4 KiB reads and writes of a memory backend, the cheapest backend
//! there is, so the switch's share is as large as it can ever be. One thread, and two threads
//! at once (this machine's core count) to show the per-thread lock slots do not contend.
//!
//! `cargo bench -p ucrypt --bench switch`

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};
use ucrypt::instance::switch::Switch;
use ucrypt_backend::{Backend, MemoryBackend};

const BLOCK: usize = 4096;
const SPAN: u64 = 64 << 20;

fn image() -> Arc<dyn Backend> {
    let mem = MemoryBackend::new(SPAN).expect("memory backend");
    let fill = vec![0x5au8; 1 << 20];
    for off in (0..SPAN).step_by(fill.len()) {
        mem.write_at(&fill, off, false).expect("fill");
    }
    Arc::new(mem)
}

/// Runs `iters` 4 KiB operations on each of `threads` threads and returns the wall time
/// divided by `threads` (time per operation per thread, as criterion expects).
fn run(backend: &dyn Backend, iters: u64, threads: usize, write: bool) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                let mut buf = vec![0u8; BLOCK];
                let mut off = (t as u64) * (SPAN / 2);
                for _ in 0..iters {
                    if write {
                        backend.write_at(&buf, off, false).expect("write");
                    } else {
                        backend.read_at(&mut buf, off).expect("read");
                    }
                    off = (off + BLOCK as u64 * 7) % (SPAN - BLOCK as u64);
                }
                black_box(&buf);
            });
        }
    });
    start.elapsed()
}

fn bench(c: &mut Criterion) {
    let direct = image();
    let switched = Switch::new(image());
    let mut g = c.benchmark_group("switch_4k");
    g.measurement_time(Duration::from_secs(3));
    for threads in [1usize, 2] {
        for write in [false, true] {
            let op = if write { "write" } else { "read" };
            g.bench_function(format!("direct_{op}_t{threads}"), |b| {
                b.iter_custom(|n| run(direct.as_ref(), n, threads, write))
            });
            g.bench_function(format!("switch_{op}_t{threads}"), |b| {
                b.iter_custom(|n| run(&switched, n, threads, write))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
