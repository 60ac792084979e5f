//! Concurrent overlapping writes to an [`AeadVolume`]: a partial-sector write (read the
//! sector, authenticate, change, encrypt, write) and a whole-sector write of the same
//! sector must not interleave, or the partial one writes back the sector as it was before
//! the whole one and that write is lost half-way (its other sectors kept, this one not).
//! Each round starts one whole write of four sectors (every byte the round's value) and one
//! partial write inside the second of them at the same moment, over a device whose reads
//! and writes are slow (the window is wide), then checks that the second sector is the
//! whole write's data, with or without the partial patch, and that every sector's tag
//! verifies.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Barrier};
use std::time::Duration;
use ucrypt_backend::{Backend, BackendError, BackendInfo, Io, IoKind, MemoryBackend};
use ucrypt_crypto::{CipherSpec, SectorParams, SectorSize, VolumeKey};
use ucrypt_integrity::{AeadVolume, Mode};

/// A memory device whose reads and writes take a while.
struct Slow {
    inner: MemoryBackend,
}

impl Backend for Slow {
    fn info(&self) -> &BackendInfo {
        self.inner.info()
    }
    fn submit(&self, io: Io<'_>) -> Result<(), BackendError> {
        if matches!(io.kind, IoKind::Read(_) | IoKind::Write(_)) {
            std::thread::sleep(Duration::from_micros(300));
        }
        self.inner.submit(io)
    }
    fn flush(&self) -> Result<(), BackendError> {
        self.inner.flush()
    }
}

const SS: usize = 4096;
const PATCH: std::ops::Range<usize> = 200..300;

fn volume(spec: &str, tag: u32, key_len: usize, mode: Mode) -> AeadVolume {
    let dev: Arc<dyn Backend> = Arc::new(Slow {
        inner: MemoryBackend::new(8 << 20).unwrap(),
    });
    let dev = common::external_tag_device(dev, tag, SS as u32, mode);
    let key = VolumeKey::new((0..key_len as u8).collect());
    let sp = SectorParams {
        sector_size: SectorSize::new(SS as u32).unwrap(),
        iv_offset: 0,
        iv_large_sectors: false,
    };
    let spec: CipherSpec = spec.parse().unwrap();
    let cipher = spec.build_aead(&key, sp, tag).unwrap();
    let sectors = dev.info().size_bytes / 512;
    let vol = AeadVolume::new(cipher, dev, sectors).unwrap();
    // Formatted without a wipe: the sectors the rounds touch get valid tags first.
    vol.write_at(&vec![0u8; 4 * SS], 0, false).unwrap();
    vol
}

fn rounds(vol: &AeadVolume, n: u8) -> Vec<String> {
    let mut bad = Vec::new();
    let barrier = Barrier::new(2);
    for r in 1..=n {
        std::thread::scope(|s| {
            s.spawn(|| {
                let whole = vec![r; 4 * SS];
                barrier.wait();
                vol.write_at(&whole, 0, false).unwrap();
            });
            s.spawn(|| {
                let patch = vec![0xeeu8; PATCH.len()];
                barrier.wait();
                vol.write_at(&patch, (SS + PATCH.start) as u64, false)
                    .unwrap();
            });
        });
        // Every tag verifies (a read that failed one would be an error).
        let mut got = vec![0u8; 4 * SS];
        vol.read_at(&mut got, 0).unwrap();
        let second = &got[SS..2 * SS];
        let outside_ok = second
            .iter()
            .enumerate()
            .all(|(i, &b)| PATCH.contains(&i) || b == r);
        let patch = &second[PATCH];
        let patch_ok = patch.iter().all(|&b| b == 0xee) || patch.iter().all(|&b| b == r);
        let others_ok = got[..SS].iter().chain(&got[2 * SS..]).all(|&b| b == r);
        if !(outside_ok && patch_ok && others_ok) {
            bad.push(format!(
                "round {r}: second sector holds {:#04x} outside the patch, {:#04x} in it",
                second[0], patch[0]
            ));
        }
    }
    bad
}

#[test]
fn overlapping_partial_and_whole_writes_leave_one_writers_data_authenticated() {
    for (spec, tag, key, mode) in [
        (
            "capi:authenc(hmac(sha256),xts(aes))-plain64",
            32,
            96,
            Mode::Journal,
        ),
        (
            "capi:authenc(hmac(sha256),xts(aes))-plain64",
            32,
            96,
            Mode::Direct,
        ),
        ("capi:gcm(aes)-random", 28, 32, Mode::Direct),
    ] {
        let vol = volume(spec, tag, key, mode);
        let bad = rounds(&vol, 60);
        assert!(
            bad.is_empty(),
            "{spec} ({mode:?}): {} of 60 rounds lost a write: {}",
            bad.len(),
            bad.join("; ")
        );
    }
}
