//! dm-crypt's authenticated modes against the kernel: the LUKS2 images of
//! testdata/luks2-integrity (cryptsetup luksFormat --integrity, written through the kernel's
//! dm-crypt over dm-integrity) read by [`AeadVolume`] over [`IntegrityBackend`] with
//! external tags, from the two table lines the kernel held (`NAME.table`) and the volume
//! key (`NAME.vk`): the kernel's pattern exactly; one byte flipped in a sector's data or in
//! its tag fails exactly that sector with `BackendError::Integrity`; what ucrypt writes
//! reads back after a reopen; a journal the kernel left unflushed (`NAME-Junflushed`: the
//! image copied while the kernel's device was active, its last writes committed to the
//! journal only) is replayed as the kernel replays it, in memory when read-only, to its
//! places when writable.

#![allow(clippy::unwrap_used)]

mod common;

use common::{hex, load, pattern, read_all, unxz};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use ucrypt_backend::{Backend, BackendError, LinearBackend, MemoryBackend};
use ucrypt_crypto::{CipherSpec, SectorParams, SectorSize, VolumeKey};
use ucrypt_integrity::{AeadVolume, IntegrityBackend, Options};

const IMAGES: [&str; 4] = [
    "hmac-sha256-xts-4096",
    "hmac-sha512-xts-512",
    "aes-gcm-random-4096",
    "chacha20-poly1305-4096",
];

fn dir() -> Option<PathBuf> {
    let d = ucrypt_testkit::testdata("luks2-integrity", "make.sh")?;
    ucrypt_testkit::require("xz").then_some(d)
}

/// What the two lines of NAME.table say.
struct Table {
    /// dm-integrity's offset on the image (512-byte sectors).
    offset: u64,
    tag: u32,
    length: u64,
    cipher: String,
    sector: u32,
}

fn table(d: &Path, name: &str) -> Table {
    let text = std::fs::read_to_string(d.join(format!("{name}.table"))).unwrap();
    let mut lines = text.lines();
    let dif: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    let crypt: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(dif[3], "integrity");
    assert_eq!(crypt[2], "crypt");
    let tag = crypt
        .iter()
        .find_map(|w| w.strip_prefix("integrity:"))
        .and_then(|w| w.strip_suffix(":aead"))
        .unwrap();
    let sector = crypt
        .iter()
        .find_map(|w| w.strip_prefix("sector_size:"))
        .map_or(512, |s| s.parse().unwrap());
    Table {
        offset: dif[5].parse().unwrap(),
        tag: tag.parse().unwrap(),
        length: crypt[1].parse().unwrap(),
        cipher: crypt[3].to_string(),
        sector,
    }
}

struct Opened {
    image: Arc<MemoryBackend>,
    vol: AeadVolume,
}

fn open(d: &Path, name: &str, image: Arc<MemoryBackend>) -> Opened {
    open_with(d, name, image, |_| {})
}

/// As [`open`], with the dm-integrity options changed by `set` (mode, read-only).
fn open_with(
    d: &Path,
    name: &str,
    image: Arc<MemoryBackend>,
    set: impl FnOnce(&mut Options),
) -> Opened {
    let t = table(d, name);
    let key = std::fs::read_to_string(d.join(format!("{name}.vk"))).unwrap();
    let key = VolumeKey::from_hex(key.trim()).unwrap();
    let spec: CipherSpec = t.cipher.parse().unwrap();
    let params = SectorParams {
        sector_size: SectorSize::new(t.sector).unwrap(),
        iv_offset: 0,
        iv_large_sectors: false,
    };
    let cipher = spec.build_aead(&key, params, t.tag).unwrap();
    let size = image.info().size_bytes;
    let off = t.offset * 512;
    let window: Arc<dyn Backend> = Arc::new(
        LinearBackend::ranges(vec![(image.clone() as Arc<dyn Backend>, off, size - off)]).unwrap(),
    );
    let mut opts = Options::external(t.tag);
    set(&mut opts);
    let dev = Arc::new(IntegrityBackend::open(window, opts).unwrap());
    let vol = AeadVolume::new(cipher, dev, t.length).unwrap();
    Opened { image, vol }
}

fn image(d: &Path, name: &str) -> Arc<MemoryBackend> {
    load(&unxz(&d.join(format!("{name}.img.xz"))))
}

#[test]
fn kernel_images_read_as_the_kernel_wrote_them() {
    let Some(d) = dir() else { return };
    for name in IMAGES {
        let o = open(&d, name, image(&d, name));
        let size: u64 = std::fs::read_to_string(d.join(format!("{name}.size")))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(o.vol.info().size_bytes, size, "{name}");
        let got = read_all(&o.vol);
        let want = std::fs::read_to_string(d.join(format!("{name}.sha256"))).unwrap();
        assert_eq!(hex(&Sha256::digest(&got)), want.trim(), "{name}");
        assert!(got == pattern(size, false), "{name}: the pattern");
        // An unaligned read inside a sector.
        let mut part = [0u8; 100];
        o.vol.read_at(&mut part, 4096 + 700).unwrap();
        assert_eq!(&part[..], &got[4096 + 700..4096 + 800], "{name}");
        assert_eq!(o.vol.failures(), 0);
    }
}

#[test]
fn a_flipped_byte_in_data_or_tag_fails_exactly_that_sector() {
    let Some(d) = dir() else { return };
    for name in IMAGES {
        let t = table(&d, name);
        let ss = u64::from(t.sector);
        let clean = image(&d, name);
        let bytes = common::snapshot(&*clean);
        for in_tag in [false, true] {
            let img = load(&bytes);
            let o = open(&d, name, img);
            let geo = o.vol.device().geometry();
            let victim = 100 * 512 / ss * ss / 512; // the sector holding 512-byte sector 100
            let at = t.offset * 512
                + if in_tag {
                    geo.tag_byte(victim) + 3
                } else {
                    geo.data_sector(victim) * 512 + 17
                };
            let mut b = [0u8; 1];
            o.image.read_at(&mut b, at).unwrap();
            b[0] ^= 0x40;
            o.image.write_at(&b, at, false).unwrap();
            let mut buf = vec![0u8; ss as usize];
            let e = o.vol.read_at(&mut buf, victim * 512).unwrap_err();
            match e {
                BackendError::Integrity { offset, len } => {
                    assert_eq!((offset, len), (victim * 512, ss), "{name} tag={in_tag}");
                }
                other => panic!("{name}: {other}"),
            }
            assert_eq!(e.errno(), 84, "EILSEQ");
            // The neighbours read right; a read that spans the victim fails.
            let want = pattern(o.vol.info().size_bytes, false);
            for s in [victim - ss / 512, victim + ss / 512] {
                o.vol.read_at(&mut buf, s * 512).unwrap();
                let from = (s * 512) as usize;
                assert_eq!(buf[..], want[from..from + ss as usize], "{name} {s}");
            }
            let mut three = vec![0u8; 3 * ss as usize];
            let first = (victim - ss / 512) * 512;
            assert!(o.vol.read_at(&mut three, first).is_err(), "{name}");
            assert_eq!(o.vol.failures(), 2, "{name}");
        }
    }
}

#[test]
fn what_ucrypt_writes_reads_back_after_reopening() {
    let Some(d) = dir() else { return };
    for name in IMAGES {
        let t = table(&d, name);
        let img = image(&d, name);
        let o = open(&d, name, img.clone());
        let size = o.vol.info().size_bytes;
        let mut want = pattern(size, false);
        // Whole sectors, a partial sector, FUA, and a write over the last sector.
        let a: Vec<u8> = (0..3 * t.sector as usize)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        o.vol.write_at(&a, u64::from(t.sector), false).unwrap();
        want[t.sector as usize..t.sector as usize + a.len()].copy_from_slice(&a);
        o.vol
            .write_at(b"partial", 5 * u64::from(t.sector) + 33, true)
            .unwrap();
        want[5 * t.sector as usize + 33..5 * t.sector as usize + 40].copy_from_slice(b"partial");
        let last = size - u64::from(t.sector);
        let z = vec![0x5au8; t.sector as usize];
        o.vol.write_at(&z, last, false).unwrap();
        want[last as usize..].copy_from_slice(&z);
        o.vol.flush().unwrap();
        assert!(read_all(&o.vol) == want, "{name}: before reopening");
        drop(o);
        let again = open(&d, name, img);
        assert!(read_all(&again.vol) == want, "{name}: after reopening");
    }
}

/// The kernel's journals left unflushed: the first pattern at its places, the second
/// pattern's three ranges committed to the journal only. Recovery mode (no replay) reads
/// the first pattern; a read-only open replays in memory (the kernel's sha256 of the
/// device, the image unchanged, no tag mismatch); a writable open replays to the places,
/// and after a clean close recovery mode reads the second pattern from the places.
#[test]
fn journals_the_kernel_left_unflushed_are_replayed() {
    let Some(d) = dir() else { return };
    for name in [
        "hmac-sha256-xts-4096-Junflushed",
        "aes-gcm-random-4096-Junflushed",
        "chacha20-poly1305-4096-Junflushed",
        "hmac-sha512-xts-512-Junflushed",
    ] {
        let bytes = common::snapshot(&*image(&d, name));
        let size: u64 = std::fs::read_to_string(d.join(format!("{name}.size")))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let want = pattern(size, true);
        let sha = std::fs::read_to_string(d.join(format!("{name}.sha256"))).unwrap();
        assert_eq!(
            hex(&Sha256::digest(&want)),
            sha.trim(),
            "{name}: the kernel's read"
        );
        let recovery = |o: &mut Options| {
            o.mode = ucrypt_integrity::Mode::Recovery;
            o.read_only = true;
        };
        let before = open_with(&d, name, load(&bytes), recovery);
        assert!(
            read_all(&before.vol) == pattern(size, false),
            "{name}: the second pattern is in the journal only"
        );
        // Read-only: replayed in memory, nothing written.
        let ro = open_with(&d, name, load(&bytes), |o| o.read_only = true);
        assert!(read_all(&ro.vol) == want, "{name}: read-only replay");
        assert_eq!(ro.vol.failures(), 0, "{name}");
        let img = ro.image.clone();
        drop(ro);
        assert!(common::snapshot(&*img) == bytes, "{name}: read-only wrote");
        // Writable: replayed to the places.
        let rw = open(&d, name, load(&bytes));
        assert!(read_all(&rw.vol) == want, "{name}: writable replay");
        assert_eq!(rw.vol.failures(), 0, "{name}");
        let img = rw.image.clone();
        rw.vol.flush().unwrap();
        drop(rw);
        let after = open_with(&d, name, img, recovery);
        assert!(
            read_all(&after.vol) == want,
            "{name}: the replay reached the places"
        );
    }
}
