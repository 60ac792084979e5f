//! `IntegrityBackend` against the 20 images Linux 6.12's dm-integrity made
//! (testdata/integrity): every image reads back as the kernel wrote it (its pattern, and
//! the sha256 the kernel read); a journal the kernel left unflushed is replayed as the
//! kernel replays it (in memory when read-only, to its places when writable); one flipped
//! byte in a block's data or tag fails exactly that block with `BackendError::Integrity`
//! (EILSEQ) and the rest reads; and what ucrypt writes is byte for byte what the kernel
//! wrote where that is deterministic (the whole image in direct mode, everything but the
//! journal area in journal mode). Six of them have an encrypted journal (`--journal-crypt`
//! ctr-aes, cbc-aes, xts-aes, chacha20), five left unflushed: ucrypt decrypts and replays
//! them as the kernel does, and refuses them without the cipher or with a wrong key.

#![allow(clippy::unwrap_used)]

mod common;

use common::{dir, hex, load, pattern, read_all, snapshot, unxz};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::Arc;
use ucrypt_backend::{Backend, BackendError, MemoryBackend};
use ucrypt_format::integrity::{FormatParams, Superblock};
use ucrypt_integrity::{format, Algorithm, IntegrityBackend, Mode, Options};
use zeroize::Zeroizing;

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let n = e.unwrap().file_name().into_string().unwrap();
            n.strip_suffix(".img.xz").map(str::to_string)
        })
        .collect();
    v.sort();
    v
}

/// The options `integritysetup open` gave the kernel for an image of this name.
fn options(dir: &Path, name: &str) -> Options {
    let key = |f: &str| Some(Zeroizing::new(std::fs::read(dir.join(f)).unwrap()));
    let (alg, k) = if name.starts_with("hmac-sha256") {
        (Algorithm::HmacSha256, key("key32.bin"))
    } else if name.starts_with("hmac-sha512") {
        (Algorithm::HmacSha512, key("key64.bin"))
    } else {
        let h = name.split('-').next().unwrap();
        (Algorithm::from_name(h).unwrap(), None)
    };
    let mut o = Options::new(alg);
    o.hash_key = k;
    if name.contains("-jmac") {
        o.journal_mac = Some((Algorithm::HmacSha256, key("jkey32.bin")));
    }
    if let Some((_, rest)) = name.split_once("-jc-") {
        // NAME-jc-MODE-CIPHER-J... or NAME-jc-chacha20-J...
        let alg = match rest.split('-').collect::<Vec<_>>()[..] {
            ["chacha20", ..] => "chacha20".to_string(),
            [m, c, ..] => format!("{m}-{c}"),
            _ => panic!("{name}"),
        };
        let k = if alg.starts_with("xts") {
            "jckey64.bin"
        } else {
            "jckey32.bin"
        };
        o.journal_crypt = Some((alg, key(k).unwrap()));
    }
    o.mode = match name.rsplit('-').next().unwrap() {
        "D" => Mode::Direct,
        "B" | "Bdirty" => Mode::Bitmap,
        _ => Mode::Journal,
    };
    o
}

#[test]
fn every_kernel_image_reads_back_as_the_kernel_wrote_it() {
    let Some(dir) = dir() else { return };
    for name in names(&dir) {
        let img = unxz(&dir.join(format!("{name}.img.xz")));
        let want_sha = std::fs::read_to_string(dir.join(format!("{name}.sha256"))).unwrap();
        let second = name.ends_with("unflushed") || name.ends_with("dirty");
        // Read-only: a journal left behind is replayed in memory, nothing is written.
        let mem = load(&img);
        let mut o = options(&dir, &name);
        o.read_only = true;
        let dev = IntegrityBackend::open(mem.clone(), o)
            .unwrap_or_else(|e| panic!("{name}: open read-only: {e}"));
        let data = read_all(&dev);
        assert_eq!(
            hex(&Sha256::digest(&data)),
            want_sha.trim(),
            "{name}: sha256"
        );
        assert!(
            data == pattern(data.len() as u64, second),
            "{name}: pattern"
        );
        assert_eq!(dev.mismatches(), 0);
        drop(dev);
        assert!(snapshot(&*mem) == img, "{name}: a read-only open wrote");
        // Writable: the replay goes to the places, a clean close, and the next open (in
        // recovery mode: no replay, no tag checks) reads the same from the places.
        let dev = IntegrityBackend::open(mem.clone(), options(&dir, &name))
            .unwrap_or_else(|e| panic!("{name}: open: {e}"));
        assert!(read_all(&dev) == data, "{name}: after the replay");
        dev.close().unwrap();
        let mut o = options(&dir, &name);
        o.mode = Mode::Recovery;
        let dev = IntegrityBackend::open(mem.clone(), o).unwrap();
        assert!(
            read_all(&dev) == data,
            "{name}: after close, from the places"
        );
        drop(dev);
        let dev = IntegrityBackend::open(mem, options(&dir, &name)).unwrap();
        assert!(read_all(&dev) == data, "{name}: reopened, checked");
    }
}

/// The unflushed images hold committed journal sections the kernel had not yet copied:
/// recovery mode (no replay) still shows the first pattern there, a replay the second.
#[test]
fn an_unflushed_kernel_journal_is_replayed() {
    let Some(dir) = dir() else { return };
    for name in [
        "crc32c-512-Junflushed",
        "hmac-sha256-4096-Junflushed",
        "crc32c-512-jc-ctr-aes-Junflushed",
        "crc32c-512-jc-xts-aes-Junflushed",
        "crc32c-512-jc-chacha20-Junflushed",
        "hmac-sha256-512-jmac-jc-cbc-aes-Junflushed",
        // Not crc32c-4096-jc-cbc-aes-Junflushed: its 1 MiB journal has 5 sections of 4 KiB
        // blocks, the three writes passed the 50 % watermark and the kernel had copied them
        // all before the image was taken (its encrypted journal is still read, for the
        // commit ids, by every_kernel_image_reads_back_as_the_kernel_wrote_it).
    ] {
        let img = unxz(&dir.join(format!("{name}.img.xz")));
        let mut o = options(&dir, name);
        o.mode = Mode::Recovery;
        let raw = read_all(&IntegrityBackend::open(load(&img), o).unwrap());
        let size = raw.len() as u64;
        // At least one of the three second-pattern writes is still only in the journal
        // (with 4 KiB blocks the journal has few sections: the watermark had the kernel
        // copy the first ones already).
        let first = pattern(size, false);
        let s = size as usize;
        let pending = [(4096, 8192), (65536, 77824), (s - 8192, s)]
            .iter()
            .filter(|&&(a, b)| raw[a..b] == first[a..b])
            .count();
        assert!(pending > 0, "{name}: nothing left in the journal");
        let replayed = read_all(&IntegrityBackend::open(load(&img), options(&dir, name)).unwrap());
        assert!(replayed == pattern(size, true), "{name}: replayed");
    }
}

#[test]
fn a_flipped_byte_fails_exactly_its_block() {
    let Some(dir) = dir() else { return };
    for name in [
        "crc32c-512-J",
        "hmac-sha256-4096-J",
        "sha256-4096-i256-J",
        "crc32c-512-D",
    ] {
        let img = unxz(&dir.join(format!("{name}.img.xz")));
        let mem = load(&img);
        let probe = IntegrityBackend::open(mem.clone(), options(&dir, name)).unwrap();
        let geo = probe.geometry().clone();
        let bb = geo.block_bytes();
        drop(probe);
        let mut bad = img.clone();
        // Data of block 100 (sector 100 × block), tag of block 300 (in area 1 for i256).
        let data_block = 100u64;
        let tag_block = 300u64;
        let spb = bb / 512;
        bad[(geo.data_sector(data_block * spb) * 512 + 7) as usize] ^= 0x01;
        bad[geo.tag_byte(tag_block * spb) as usize] ^= 0x80;
        let dev = IntegrityBackend::open(load(&bad), options(&dir, name)).unwrap();
        let want = pattern(dev.info().size_bytes, false);
        let mut block = vec![0u8; bb as usize];
        let blocks = dev.info().size_bytes / bb;
        for b in 0..blocks {
            let r = dev.read_at(&mut block, b * bb);
            if b == data_block || b == tag_block {
                match r {
                    Err(e @ BackendError::Integrity { offset, len }) => {
                        assert_eq!((offset, len), (b * bb, bb), "{name}");
                        assert_eq!(e.errno(), 84, "EILSEQ");
                    }
                    other => panic!("{name}: block {b}: {other:?}"),
                }
            } else {
                r.unwrap_or_else(|e| panic!("{name}: block {b}: {e}"));
                assert!(block[..] == want[(b * bb) as usize..((b + 1) * bb) as usize]);
            }
        }
        assert_eq!(dev.mismatches(), 2, "{name}");
        // A request spanning the bad block fails; the same range without it reads.
        let mut two = vec![0u8; 2 * bb as usize];
        assert!(dev.read_at(&mut two, (data_block - 1) * bb).is_err());
        dev.read_at(&mut two, (data_block + 1) * bb).unwrap();
        // Rewriting the block makes it valid again.
        dev.write_at(
            &want[(data_block * bb) as usize..((data_block + 1) * bb) as usize],
            data_block * bb,
            true,
        )
        .unwrap();
        dev.read_at(&mut block, data_block * bb).unwrap();
    }
}

/// Formats and writes the pattern as make.sh did, with the kernel image's salt: direct
/// mode gives the kernel's image byte for byte; journal mode everything outside the
/// journal area (where the kernel's commits depended on its timer).
#[test]
fn what_ucrypt_writes_is_what_the_kernel_wrote() {
    let Some(dir) = dir() else { return };
    for name in [
        "crc32c-512-D",
        "crc32c-512-J",
        "crc32c-4096-J",
        "hmac-sha256-4096-J",
        "sha256-4096-i256-J",
    ] {
        let img = unxz(&dir.join(format!("{name}.img.xz")));
        let ksb = Superblock::parse(&img[..512]).unwrap();
        let opts = options(&dir, name);
        let table = std::fs::read_to_string(dir.join(format!("{name}.table"))).unwrap();
        let interleave = table
            .split_whitespace()
            .find_map(|w| w.strip_prefix("interleave_sectors:")?.parse().ok())
            .unwrap();
        let params = FormatParams {
            sector_size: ksb.block_bytes(),
            tag_size: opts.hash.digest_size() as u32,
            interleave_sectors: interleave,
            salt: ksb.salt,
            ..FormatParams::default()
        };
        let mem = Arc::new(MemoryBackend::new(img.len() as u64).unwrap());
        let sb = format(mem.clone(), &params, &opts, true).unwrap();
        assert_eq!(sb.to_sector()[..], img[..512], "{name}: superblock");
        let dev = IntegrityBackend::open(mem.clone(), opts.clone()).unwrap();
        let data = pattern(dev.info().size_bytes, false);
        for (k, chunk) in data.chunks(64 * 1024).enumerate() {
            dev.write_at(chunk, k as u64 * 64 * 1024, false).unwrap();
        }
        dev.flush().unwrap();
        let journal_end = (dev.geometry().initial_sectors * 512) as usize;
        dev.close().unwrap();
        let ours = snapshot(&*mem);
        if opts.mode == Mode::Direct {
            assert!(ours == img, "{name}: the whole image");
        } else {
            assert_eq!(ours[..512], img[..512], "{name}: superblock");
            let diff = (journal_end..img.len()).find(|&i| ours[i] != img[i]);
            assert_eq!(diff, None, "{name}: first differing byte after the journal");
        }
    }
}

/// ucrypt's own journal: writes committed (flush) and abandoned without a close, as a
/// crash leaves them, are replayed by the next open; uncommitted ones may be lost but
/// never give a block whose tag does not match.
#[test]
fn ucrypts_own_journal_survives_a_crash() {
    let Some(dir) = dir() else { return };
    for name in [
        "crc32c-512-Junflushed",
        "crc32c-512-jc-ctr-aes-Junflushed",
        "crc32c-4096-jc-cbc-aes-Junflushed",
    ] {
        own_journal_survives_a_crash(&dir, name);
    }
}

/// An encrypted journal without its cipher, with another key, or with another cipher
/// shows no valid commit id: refused, as the kernel fails the device. Bitmap mode with
/// journal_crypt and unknown ciphers are refused by name.
#[test]
fn an_encrypted_journal_needs_its_cipher_and_key() {
    let Some(dir) = dir() else { return };
    let name = "crc32c-512-jc-ctr-aes-Junflushed";
    let img = unxz(&dir.join(format!("{name}.img.xz")));
    let good = options(&dir, name);
    let mut none = good.clone();
    none.journal_crypt = None;
    let mut wrong_key = good.clone();
    wrong_key.journal_crypt = Some(("ctr-aes".into(), Zeroizing::new(vec![0x41; 32])));
    let mut wrong_cipher = good.clone();
    wrong_cipher.journal_crypt = Some(("chacha20".into(), key_of(&dir, "jckey32.bin")));
    for (what, o) in [("none", none), ("key", wrong_key), ("cipher", wrong_cipher)] {
        let e = IntegrityBackend::open(load(&img), o)
            .unwrap_err()
            .to_string();
        assert!(e.contains("commit id"), "{what}: {e}");
    }
    let mut bitmap = good.clone();
    bitmap.mode = Mode::Bitmap;
    let e = IntegrityBackend::open(load(&img), bitmap)
        .unwrap_err()
        .to_string();
    assert!(e.contains("bitmap mode with journal_crypt"), "{e}");
    let mut salsa = good;
    salsa.journal_crypt = Some(("salsa20".into(), key_of(&dir, "jckey32.bin")));
    let e = IntegrityBackend::open(load(&img), salsa)
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"salsa20\" is not supported"), "{e}");
}

fn key_of(dir: &Path, f: &str) -> Zeroizing<Vec<u8>> {
    Zeroizing::new(std::fs::read(dir.join(f)).unwrap())
}

fn own_journal_survives_a_crash(dir: &Path, name: &str) {
    let img = unxz(&dir.join(format!("{name}.img.xz")));
    let mem = load(&img);
    let opts = options(dir, name);
    let dev = IntegrityBackend::open(mem.clone(), opts.clone()).unwrap();
    let size = dev.info().size_bytes;
    let mut want = read_all(&dev);
    let block = vec![0x5au8; 4096];
    dev.write_at(&block, 8192, false).unwrap();
    dev.write_at(&block, 12 * 4096, true).unwrap();
    dev.flush().unwrap();
    want[8192..12288].copy_from_slice(&block);
    want[49152..53248].copy_from_slice(&block);
    let uncommitted = vec![0xa5u8; 4096];
    let last = size as usize - 4096;
    dev.write_at(&uncommitted, last as u64, false).unwrap();
    std::mem::forget(dev); // the process dies: no close
    let dev = IntegrityBackend::open(mem.clone(), opts.clone()).unwrap();
    let got = read_all(&dev);
    assert!(got[..last] == want[..last], "{name}");
    assert_eq!(dev.mismatches(), 0, "{name}");
}
