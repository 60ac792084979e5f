//! SHA-256 of 4096-byte blocks, the checksum resilience's work: the `sha2` crate (its
//! SHA-NI path) against aws-lc's (the library ucrypt's XTS comes from), one thread.
//! `cargo run --release -p ucrypt-crypto --example hash_speed [MIB]`
use sha2::Digest;
use std::time::Instant;

fn main() {
    let mib: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(256);
    let data: Vec<u8> = (0..mib << 20).map(|i| (i * 31 + i / 4096) as u8).collect();
    let mut sums = vec![0u8; data.len() / 4096 * 32];
    for round in 0..3 {
        let t = Instant::now();
        for (b, s) in data.chunks(4096).zip(sums.chunks_mut(32)) {
            s.copy_from_slice(&sha2::Sha256::digest(b));
        }
        let a = t.elapsed().as_secs_f64();
        let x = sums.clone();
        let t = Instant::now();
        for (b, s) in data.chunks(4096).zip(sums.chunks_mut(32)) {
            // SAFETY: `b` and `s` (32 bytes) are valid for the call.
            unsafe { aws_lc_sys::SHA256(b.as_ptr(), b.len(), s.as_mut_ptr()) };
        }
        let c = t.elapsed().as_secs_f64();
        assert_eq!(x, sums);
        let gb = data.len() as f64 / 1e9;
        println!(
            "round {round}: sha2 {:.2} GB/s, aws-lc {:.2} GB/s",
            gb / a,
            gb / c
        );
    }
}
