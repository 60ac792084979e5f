//! [`AeadVolume`] spreading a large request's AEAD work over threads ([`Spread`]): the bytes
//! on disk are those one thread writes (sector for sector, data and tags), a spread read
//! fails at exactly the first sector whose tag does not match, counted once, as the
//! one-thread path does, and the flags that keep the work inline do.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use ucrypt_backend::{Backend, BackendError, MemoryBackend};
use ucrypt_crypto::{CipherSpec, SectorParams, SectorSize, VolumeKey};
use ucrypt_integrity::{AeadVolume, IntegrityBackend, Mode, Spread};

const SS: usize = 4096;
const MIB: usize = 1 << 20;
const HMAC: (&str, u32, usize) = ("capi:authenc(hmac(sha256),xts(aes))-plain64", 32, 96);
const GCM: (&str, u32, usize) = ("capi:gcm(aes)-random", 28, 32);

/// Four threads, 64 KiB pieces: a 1 MiB request is 16 pieces, more than threads, so the
/// pieces are handed out as threads come free.
fn split() -> Spread {
    Spread {
        threads: 4,
        min_bytes: 256 << 10,
        piece_bytes: 64 << 10,
        inline_reads: false,
        inline_writes: false,
    }
}

/// A formatted dm-integrity device with external tags (8 MiB of memory, 4096-byte blocks).
fn device((_, tag, _): (&str, u32, usize), mode: Mode) -> Arc<IntegrityBackend> {
    let mem: Arc<dyn Backend> = Arc::new(MemoryBackend::new(8 << 20).unwrap());
    common::external_tag_device(mem, tag, SS as u32, mode)
}

/// The crypt target on `dev`, its AEAD work placed as `spread` says.
fn volume(
    (spec, tag, key_len): (&str, u32, usize),
    dev: &Arc<IntegrityBackend>,
    spread: Spread,
) -> AeadVolume {
    let key = VolumeKey::new((0..key_len).map(|i| (i * 13 + 5) as u8).collect());
    let sp = SectorParams {
        sector_size: SectorSize::new(SS as u32).unwrap(),
        iv_offset: 0,
        iv_large_sectors: false,
    };
    let cipher = spec
        .parse::<CipherSpec>()
        .unwrap()
        .build_aead(&key, sp, tag)
        .unwrap();
    let sectors = dev.info().size_bytes / 512;
    AeadVolume::new(cipher, Arc::clone(dev), sectors)
        .unwrap()
        .with_spread(spread)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i >> 12) as u8)
        .collect()
}

/// Data and tags as stored for `len` bytes at `offset` (whole blocks).
fn stored(dev: &IntegrityBackend, offset: u64, len: usize, tag: u32) -> (Vec<u8>, Vec<u8>) {
    let mut data = vec![0u8; len];
    let mut tags = vec![0u8; len / SS * tag as usize];
    dev.read_tagged(&mut data, &mut tags, offset).unwrap();
    (data, tags)
}

/// A 1 MiB write spread over threads stores the ciphertext and tags one thread stores,
/// aligned and not (the partial-sector path reads, merges and writes the whole range), in
/// the journal's mode and without it.
#[test]
fn spread_writes_store_what_one_thread_stores() {
    for mode in [Mode::Journal, Mode::Direct] {
        let (a, b) = (device(HMAC, mode), device(HMAC, mode));
        let (spread, inline) = (
            volume(HMAC, &a, split()),
            volume(HMAC, &b, Spread::inline()),
        );
        // Every sector the unaligned write touches at its ends gets valid tags first.
        let base = pattern(2 * MIB, 1);
        for v in [&spread, &inline] {
            v.write_at(&base, 0, false).unwrap();
        }
        let data = pattern(MIB, 7);
        for (off, len) in [(3 * SS, MIB), (5 * SS + 100, MIB - 300)] {
            for v in [&spread, &inline] {
                v.write_at(&data[..len], off as u64, false).unwrap();
            }
        }
        assert!(
            spread.spread_requests() >= 3,
            "{}",
            spread.spread_requests()
        );
        assert_eq!(inline.spread_requests(), 0);
        for v in [&spread, &inline] {
            v.flush().unwrap();
        }
        let (da, ta) = stored(&a, 0, 2 * MIB, HMAC.1);
        let (db, tb) = stored(&b, 0, 2 * MIB, HMAC.1);
        assert!(da == db, "{mode:?}: ciphertext differs");
        assert!(ta == tb, "{mode:?}: tags differ");
        let mut want = base.clone();
        want[3 * SS..3 * SS + MIB].copy_from_slice(&data);
        want[5 * SS + 100..5 * SS + 100 + MIB - 300].copy_from_slice(&data[..MIB - 300]);
        for v in [&spread, &inline] {
            let mut got = vec![0u8; 2 * MIB];
            v.read_at(&mut got, 0).unwrap();
            assert!(got == want, "{mode:?}: read back differs");
        }
    }
}

/// Random IVs (aes-gcm-random): what one placement writes, the other reads, both ways.
#[test]
fn spread_and_inline_read_each_others_random_iv_writes() {
    let dev = device(GCM, Mode::Journal);
    let spread = volume(GCM, &dev, split());
    let inline = volume(GCM, &dev, Spread::inline());
    let (one, two) = (pattern(MIB, 3), pattern(MIB, 9));
    spread.write_at(&one, 0, false).unwrap();
    inline.write_at(&two, MIB as u64, false).unwrap();
    let mut got = vec![0u8; MIB];
    inline.read_at(&mut got, 0).unwrap();
    assert!(got == one);
    spread.read_at(&mut got, MIB as u64).unwrap();
    assert!(got == two);
    assert_eq!(spread.spread_requests(), 2);
    // The same plaintext again gets new IVs: the stored sectors change.
    let before = stored(&dev, 0, MIB, GCM.1);
    spread.write_at(&one, 0, false).unwrap();
    assert!(stored(&dev, 0, MIB, GCM.1).1 != before.1);
}

/// Changes one byte of the stored ciphertext of block `block`, behind the crypt target.
fn tamper(dev: &IntegrityBackend, block: usize, tag: u32) {
    let off = (block * SS) as u64;
    let (mut data, tags) = stored(dev, off, SS, tag);
    data[77] ^= 0x10;
    dev.write_tagged(&data, &tags, off, false).unwrap();
}

/// A spread 1 MiB read over a block whose data was changed fails with exactly that block
/// (EILSEQ) and counts one failure; with two such blocks in different pieces, the first
/// one, every time (a helper finishing the later piece first does not change the answer),
/// as one thread answers; the blocks around them still read.
#[test]
fn a_spread_read_fails_at_exactly_the_first_tampered_block() {
    for spec in [HMAC, GCM] {
        let dev = device(spec, Mode::Journal);
        let spread = volume(spec, &dev, split());
        let inline = volume(spec, &dev, Spread::inline());
        let data = pattern(MIB, 5);
        spread.write_at(&data, 0, false).unwrap();
        tamper(&dev, 200, spec.1);
        let want = |block: usize| BackendError::Integrity {
            offset: (block * SS) as u64,
            len: SS as u64,
        };
        let mut buf = vec![0u8; MIB];
        let (f0, s0) = (spread.failures(), spread.spread_requests());
        let e = spread.read_at(&mut buf, 0).unwrap_err();
        assert_eq!(e.to_string(), want(200).to_string(), "{}", spec.0);
        assert!(
            matches!(e, BackendError::Integrity { offset, len } if offset == 200 * SS as u64 && len == SS as u64)
        );
        assert_eq!(spread.failures(), f0 + 1);
        assert_eq!(spread.spread_requests(), s0 + 1);
        // Block 40 lies in piece 2, block 200 in piece 12.
        tamper(&dev, 40, spec.1);
        for _ in 0..20 {
            let f = spread.failures();
            let e = spread.read_at(&mut buf, 0).unwrap_err();
            assert!(
                matches!(e, BackendError::Integrity { offset, .. } if offset == 40 * SS as u64),
                "{e}"
            );
            assert_eq!(spread.failures(), f + 1);
        }
        let e = inline.read_at(&mut buf, 0).unwrap_err();
        assert!(matches!(e, BackendError::Integrity { offset, .. } if offset == 40 * SS as u64));
        assert_eq!(inline.failures(), 1);
        // Everything else reads, spread too (41..200 is 159 blocks).
        for (from, to) in [(0, 40), (41, 200), (201, 256)] {
            let mut part = vec![0u8; (to - from) * SS];
            spread.read_at(&mut part, (from * SS) as u64).unwrap();
            assert!(part == data[from * SS..to * SS], "{from}..{to}");
        }
        // A spread unaligned read over the block fails at it too.
        let mut part = vec![0u8; 512 << 10];
        let e = spread
            .read_at(&mut part, (150 * SS + 10) as u64)
            .unwrap_err();
        assert!(matches!(e, BackendError::Integrity { offset, .. } if offset == 200 * SS as u64));
    }
}

/// The table flags keep reads (no_read_workqueue) or writes (no_write_workqueue) on the
/// receiving thread; requests below `min_bytes` always run there.
#[test]
fn inline_flags_and_small_requests_are_not_spread() {
    let dev = device(HMAC, Mode::Direct);
    let data = pattern(MIB, 2);
    let mut buf = vec![0u8; MIB];
    let no_read = volume(
        HMAC,
        &dev,
        Spread {
            inline_reads: true,
            ..split()
        },
    );
    no_read.write_at(&data, 0, false).unwrap();
    assert_eq!(no_read.spread_requests(), 1);
    no_read.read_at(&mut buf, 0).unwrap();
    assert_eq!(no_read.spread_requests(), 1);
    assert!(buf == data);
    // An unaligned write: its read stays inline, its write is spread.
    no_read.write_at(&data[..MIB - SS], 100, false).unwrap();
    assert_eq!(no_read.spread_requests(), 2);
    let no_write = volume(
        HMAC,
        &dev,
        Spread {
            inline_writes: true,
            ..split()
        },
    );
    no_write.write_at(&data, 0, false).unwrap();
    assert_eq!(no_write.spread_requests(), 0);
    no_write.read_at(&mut buf, 0).unwrap();
    assert_eq!(no_write.spread_requests(), 1);
    assert!(buf == data);
    let small = volume(HMAC, &dev, split());
    small.write_at(&data[..128 << 10], 0, false).unwrap();
    small.read_at(&mut buf[..(256 << 10) - SS], 0).unwrap();
    assert_eq!(small.spread_requests(), 0);
    small.read_at(&mut buf[..256 << 10], 0).unwrap();
    assert_eq!(small.spread_requests(), 1);
}
