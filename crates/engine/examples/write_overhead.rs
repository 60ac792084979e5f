//! CPU time per 4 KiB null-cipher write, raw memory backend vs. an inline volume over it,
//! on one thread (CLOCK_THREAD_CPUTIME_ID), alternating: the engine's per-request overhead
//! without the scheduler noise of a loaded machine.
//! `cargo run --release -p ucrypt-engine --example write_overhead`

#![allow(clippy::unwrap_used)]
use std::sync::Arc;
use ucrypt_backend::memory::MemoryBackend;
use ucrypt_backend::{Backend, Io};
use ucrypt_crypto::{CipherSpec, SectorParams, VolumeKey};
use ucrypt_engine::{EngineOptions, Volume, VolumeConfig};

fn cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn run(dev: &dyn Backend, n: u64, region: u64) -> f64 {
    let mut buf = vec![0xa5u8; 4096];
    let slots = region / 4096;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let t = cpu_ns();
    for _ in 0..n {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let off = (rng % slots) * 4096;
        dev.submit(Io::write_owned(&mut buf, off)).unwrap();
    }
    (cpu_ns() - t) as f64 / n as f64
}

fn main() {
    let region = 256u64 << 20;
    let mem: Arc<dyn Backend> = Arc::new(MemoryBackend::new(region).unwrap());
    let mut buf = vec![1u8; 1 << 20];
    for at in (0..region).step_by(1 << 20) {
        mem.write_at(&buf, at, false).unwrap();
    }
    buf.clear();
    let cipher = "capi:ecb(cipher_null)"
        .parse::<CipherSpec>()
        .unwrap()
        .build(&VolumeKey::new(Vec::new()), SectorParams::default())
        .unwrap();
    let inline = EngineOptions {
        no_read_workqueue: true,
        no_write_workqueue: true,
        ..EngineOptions::kernel_default()
    };
    let cfg = VolumeConfig {
        data_offset_bytes: 0,
        length_bytes: region,
        read_only: false,
        allow_discards: false,
    };
    let vol = Volume::with_options(Arc::from(cipher), Arc::clone(&mem), cfg, inline).unwrap();
    let n = 200_000;
    let (mut raw, mut v, mut r) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..41 {
        let a = run(&*mem, n, region);
        let b = run(&vol, n, region);
        raw.push(a);
        v.push(b);
        r.push(a / b);
    }
    for x in [&mut raw, &mut v, &mut r] {
        x.sort_by(f64::total_cmp);
    }
    println!(
        "raw {:.0} ns, volume {:.0} ns per write; ratio {:.3} (median of 41 pairs, quartiles {:.3}..{:.3})",
        raw[20], v[20], r[20], r[10], r[30]
    );
}
