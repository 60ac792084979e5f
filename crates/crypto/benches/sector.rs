//! Throughput of each sector cipher, side by side with the raw library call in the same run.
//!
//! `cargo bench -p ucrypt-crypto --bench sector` (criterion). The row to watch is
//! `aes-xts-plain64/512bit` against `raw-awslc-xts`: the ratio is what ucrypt's layering
//! costs over calling AWS-LC once per sector directly.

#![allow(clippy::unwrap_used)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use ucrypt_crypto::mode::aws_xts::RawLibraryXts;
use ucrypt_crypto::{CipherSpec, Sector512, SectorParams, SectorSize, VolumeKey};

const RUN_BYTES: usize = 256 * 1024;

fn specs() -> Vec<(&'static str, usize)> {
    vec![
        ("aes-xts-plain64", 64),
        ("aes-xts-plain64", 32),
        ("aes-cbc-essiv:sha256", 32),
        ("serpent-xts-plain64", 64),
        ("twofish-xts-plain64", 64),
        ("xchacha12,aes-adiantum-plain64", 32),
        ("capi:ecb(cipher_null)", 0),
    ]
}

fn bench(c: &mut Criterion) {
    for ss in [512u32, 4096] {
        let mut g = c.benchmark_group(format!("sector{ss}"));
        g.throughput(Throughput::Bytes(RUN_BYTES as u64));
        g.sample_size(20);
        let key: Vec<u8> = (0..64u8).collect();
        let mut data = vec![0x5au8; RUN_BYTES];
        let mut raw = RawLibraryXts::new(&key).expect("AWS-LC XTS key");
        g.bench_function("raw-awslc-xts/512bit", |b| {
            b.iter(|| raw.run(black_box(&mut data), ss as usize, true))
        });
        for (spec, key_len) in specs() {
            let cipher = spec
                .parse::<CipherSpec>()
                .unwrap()
                .build(
                    &VolumeKey::new(key[..key_len].to_vec()),
                    SectorParams {
                        sector_size: SectorSize::new(ss).unwrap(),
                        ..Default::default()
                    },
                )
                .unwrap();
            let id = BenchmarkId::new(spec, format!("{}bit", key_len * 8));
            g.bench_function(id, |b| {
                b.iter(|| cipher.encrypt(Sector512(0), black_box(&mut data)))
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
