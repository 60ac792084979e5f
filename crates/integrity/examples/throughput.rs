//! In-process throughput of `IntegrityBackend` against the raw backend under it (a memory
//! backend, so that only the integrity layer's own cost shows): sequential writes, writes
//! in a random order (every request once, as fio's `randwrite` with `randrepeat`), then
//! sequential reads of the whole device in requests of 4 KiB and 1 MiB, one thread,
//! median of several rounds, for a hash and a mode.
//!
//! ```text
//! cargo run --release -p ucrypt-integrity --example throughput [MIB] [ROUNDS]
//! ```

use std::sync::Arc;
use std::time::Instant;
use ucrypt_backend::{Backend, MemoryBackend};
use ucrypt_format::integrity::FormatParams;
use ucrypt_integrity::{format, Algorithm, IntegrityBackend, Mode, Options};
use zeroize::Zeroizing;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// MB/s of writing `dev` whole in order, then in a random order, then reading it, in
/// requests of `io` bytes, `rounds` times.
fn run(dev: &dyn Backend, io: usize, rounds: usize) -> (f64, f64, f64) {
    let size = dev.info().size_bytes as usize / io * io;
    let buf = vec![0x5au8; io];
    let mut out = vec![0u8; io];
    let (mut w, mut rw, mut r) = (Vec::new(), Vec::new(), Vec::new());
    // A fixed permutation of the requests (Fisher-Yates over a xorshift generator).
    let mut order: Vec<usize> = (0..size / io).collect();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in (1..order.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    for round in 0..rounds {
        let mut b = buf.clone();
        b[0] = round as u8;
        let t = Instant::now();
        for off in (0..size).step_by(io) {
            dev.write_at(&b, off as u64, false).expect("write");
        }
        dev.flush().expect("flush");
        w.push(size as f64 / t.elapsed().as_secs_f64() / 1e6);
        let t = Instant::now();
        for &k in &order {
            dev.write_at(&b, (k * io) as u64, false).expect("write");
        }
        dev.flush().expect("flush");
        rw.push(size as f64 / t.elapsed().as_secs_f64() / 1e6);
        let t = Instant::now();
        for off in (0..size).step_by(io) {
            dev.read_at(&mut out, off as u64).expect("read");
        }
        r.push(size as f64 / t.elapsed().as_secs_f64() / 1e6);
    }
    (median(w), median(rw), median(r))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mib: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(256);
    let rounds: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(5);
    let bytes = mib << 20;
    println!("device {mib} MiB in memory, {rounds} rounds, medians (MB/s)");
    println!(
        "{:<34} {:>6} {:>9} {:>9} {:>9}",
        "layer", "io", "write", "randwrite", "read"
    );
    for io in [4096usize, 1 << 20] {
        let raw = MemoryBackend::new(bytes).expect("memory");
        let (w, rw, r) = run(&raw, io, rounds);
        println!(
            "{:<34} {:>6} {w:>9.0} {rw:>9.0} {r:>9.0}",
            "raw memory backend",
            label(io)
        );
        for (alg, key) in [(Algorithm::Crc32c, None), (Algorithm::HmacSha256, Some(32))] {
            for mode in [Mode::Journal, Mode::Direct] {
                let inner: Arc<dyn Backend> = Arc::new(MemoryBackend::new(bytes).expect("memory"));
                let mut o = Options::new(alg);
                o.mode = mode;
                o.hash_key = key.map(|n| Zeroizing::new(vec![7u8; n]));
                let params = FormatParams {
                    sector_size: 4096,
                    tag_size: alg.digest_size() as u32,
                    ..FormatParams::default()
                };
                format(Arc::clone(&inner), &params, &o, false).expect("format");
                let dev = IntegrityBackend::open(inner, o).expect("open");
                let (w, rw, r) = run(&dev, io, rounds);
                let name = format!("integrity {} {:?} 4k", alg.kernel_name(), mode);
                println!("{name:<34} {:>6} {w:>9.0} {rw:>9.0} {r:>9.0}", label(io));
            }
        }
    }
}

fn label(io: usize) -> String {
    if io >= 1 << 20 {
        format!("{}M", io >> 20)
    } else {
        format!("{}k", io >> 10)
    }
}
