//! `IntegrityBackend` passes the conformance suite every `Backend` runs (round trips at
//! assorted offsets from aligned and misaligned memory, range checks, batches, flush and
//! FUA, concurrent writers), in modes J, D and B, with 512- and 4096-byte blocks, with a
//! journal small enough to wrap many times; and readers racing writers over the same
//! blocks never see a tag mismatch (old or new data, nothing else).

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use ucrypt_backend::{Backend, MemoryBackend};
use ucrypt_format::integrity::FormatParams;
use ucrypt_integrity::{format, Algorithm, IntegrityBackend, Mode, Options};
use zeroize::Zeroizing;

fn device(mode: Mode, sector: u32, alg: Algorithm) -> IntegrityBackend {
    let inner: Arc<dyn Backend> = Arc::new(MemoryBackend::new(8 << 20).unwrap());
    let mut o = Options::new(alg);
    o.mode = mode;
    if alg.keyed() {
        o.hash_key = Some(Zeroizing::new(vec![9u8; 32]));
    }
    let params = FormatParams {
        sector_size: sector,
        tag_size: alg.digest_size() as u32,
        // A small journal (a few sections): the suite's writes wrap it many times.
        journal_sectors: 1024,
        ..FormatParams::default()
    };
    format(Arc::clone(&inner), &params, &o, true).unwrap();
    IntegrityBackend::open(inner, o).unwrap()
}

#[test]
fn the_conformance_suite_passes_in_every_mode() {
    for mode in [Mode::Journal, Mode::Direct, Mode::Bitmap] {
        for sector in [512, 4096] {
            for alg in [Algorithm::Crc32c, Algorithm::HmacSha256] {
                let dev = device(mode, sector, alg);
                ucrypt_backend::testing::conformance(&dev);
                assert_eq!(dev.mismatches(), 0, "{mode:?} {sector} {alg:?}");
                dev.close().unwrap();
            }
        }
    }
}

#[test]
fn readers_racing_writers_never_see_a_mismatch() {
    for mode in [Mode::Journal, Mode::Direct] {
        let dev = Arc::new(device(mode, 4096, Algorithm::Crc32c));
        let blocks = 64u64;
        std::thread::scope(|s| {
            for w in 0..2u8 {
                let dev = Arc::clone(&dev);
                s.spawn(move || {
                    for round in 0..200u64 {
                        let b = (round * 7 + u64::from(w) * 13) % blocks;
                        let v = [w.wrapping_mul(100).wrapping_add(round as u8); 4096];
                        dev.write_at(&v, b * 4096, round % 16 == 0).unwrap();
                    }
                });
            }
            for _ in 0..2 {
                let dev = Arc::clone(&dev);
                s.spawn(move || {
                    let mut buf = vec![0u8; 4 * 4096];
                    for round in 0..400u64 {
                        let b = round % (blocks - 3);
                        dev.read_at(&mut buf, b * 4096).unwrap();
                        for blk in buf.chunks(4096) {
                            assert!(blk.iter().all(|&x| x == blk[0]), "a torn block");
                        }
                    }
                });
            }
        });
        assert_eq!(dev.mismatches(), 0);
    }
}
