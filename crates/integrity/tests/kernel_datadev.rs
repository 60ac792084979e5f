//! dm-integrity with a separate metadata device (`integritysetup format META --data-device
//! DATA`, the table's `meta_device:`), against the four pairs Linux 6.12 made
//! (testdata/integrity/datadev, made by its make.sh in the kernel lab): each reads back as
//! the kernel wrote it, read-only and writable, including a journal the kernel left
//! unflushed and a dirty bitmap; the superblock, `dump` and table numbers are the kernel's;
//! a flipped byte in a data block (on the data device) or in a tag (on the metadata device)
//! fails exactly that block; ucrypt's own format makes the kernel's superblock and layout;
//! a data device or a metadata device too small is refused with the reason.

#![allow(clippy::unwrap_used)]

mod common;

use common::{hex, load, pattern, read_all, snapshot, unxz};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use ucrypt_backend::{Backend, BackendError, MemoryBackend};
use ucrypt_format::integrity::{
    FormatParams, Geometry, IntegrityLine, Superblock, DEFAULT_BUFFER_SECTORS,
};
use ucrypt_integrity::{format_separate, Algorithm, IntegrityBackend, Mode, Options};
use zeroize::Zeroizing;

const NAMES: [&str; 4] = [
    "crc32c-4096-datadev-J",
    "hmac-sha256-512-datadev-D",
    "crc32c-512-datadev-Junflushed",
    "crc32c-512-datadev-Bdirty",
];

fn dir() -> Option<PathBuf> {
    common::dir().map(|d| d.join("datadev"))
}

/// (metadata device, data device) of a pair.
fn pair(dir: &Path, name: &str) -> (Vec<u8>, Vec<u8>) {
    (
        unxz(&dir.join(format!("{name}.meta.img.xz"))),
        unxz(&dir.join(format!("{name}.data.img.xz"))),
    )
}

fn options(dir: &Path, name: &str) -> Options {
    let mut o = if name.starts_with("hmac-sha256") {
        let mut o = Options::new(Algorithm::HmacSha256);
        let key = std::fs::read(dir.join("../key32.bin")).unwrap();
        o.hash_key = Some(Zeroizing::new(key));
        o
    } else {
        Options::new(Algorithm::Crc32c)
    };
    o.mode = match name.rsplit('-').next().unwrap() {
        "D" => Mode::Direct,
        "Bdirty" => Mode::Bitmap,
        _ => Mode::Journal,
    };
    o
}

fn open(
    meta: &Arc<MemoryBackend>,
    data: &Arc<MemoryBackend>,
    o: Options,
) -> Result<IntegrityBackend, ucrypt_integrity::IntegrityError> {
    IntegrityBackend::open_separate(meta.clone(), data.clone(), o)
}

#[test]
fn every_kernel_pair_reads_back_as_the_kernel_wrote_it() {
    let Some(dir) = dir() else { return };
    for name in NAMES {
        let (m, d) = pair(&dir, name);
        let want_sha = std::fs::read_to_string(dir.join(format!("{name}.sha256"))).unwrap();
        let second = name.ends_with("unflushed") || name.ends_with("dirty");
        let (meta, data) = (load(&m), load(&d));
        let mut o = options(&dir, name);
        o.read_only = true;
        let dev = open(&meta, &data, o).unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = read_all(&dev);
        assert_eq!(
            hex(&Sha256::digest(&got)),
            want_sha.trim(),
            "{name}: sha256"
        );
        assert!(got == pattern(got.len() as u64, second), "{name}: pattern");
        assert_eq!(dev.mismatches(), 0);
        drop(dev);
        assert!(
            snapshot(&*meta) == m && snapshot(&*data) == d,
            "{name}: read-only wrote"
        );
        // Writable: the journal replayed to the places (the bitmap's regions recalculated),
        // closed cleanly, then recovery mode reads the same from the places.
        let dev = open(&meta, &data, options(&dir, name)).unwrap();
        assert!(read_all(&dev) == got, "{name}: writable");
        dev.close().unwrap();
        drop(dev);
        let mut o = options(&dir, name);
        o.mode = Mode::Recovery;
        assert!(
            read_all(&open(&meta, &data, o).unwrap()) == got,
            "{name}: recovery"
        );
        let dev = open(&meta, &data, options(&dir, name)).unwrap();
        assert!(read_all(&dev) == got, "{name}: reopened");
        assert_eq!(dev.mismatches(), 0);
    }
}

/// Recovery mode does not replay: the unflushed pair shows the first pattern where its
/// journal holds the second.
#[test]
fn the_unflushed_kernel_journal_is_replayed() {
    let Some(dir) = dir() else { return };
    let name = "crc32c-512-datadev-Junflushed";
    let (m, d) = pair(&dir, name);
    let mut o = options(&dir, name);
    o.mode = Mode::Recovery;
    let raw = read_all(&open(&load(&m), &load(&d), o).unwrap());
    assert!(
        raw[4096..4112] == pattern(8192, false)[4096..4112],
        "not yet in place"
    );
    let dev = open(&load(&m), &load(&d), options(&dir, name)).unwrap();
    let got = read_all(&dev);
    assert!(got == pattern(got.len() as u64, true));
    // What the replay wrote to the data device is the second pattern, at the same bytes.
    drop(dev);
}

#[test]
fn superblock_dump_and_table_are_the_kernels() {
    let Some(dir) = dir() else { return };
    for name in NAMES {
        let (m, d) = pair(&dir, name);
        let sb = Superblock::parse(&m[..512]).unwrap();
        assert!(sb.separate_metadata(), "{name}");
        let dump = std::fs::read_to_string(dir.join(format!("{name}.dump"))).unwrap();
        assert_eq!(
            sb.dump("X").lines().skip(1).collect::<Vec<_>>(),
            dump.lines().skip(1).collect::<Vec<_>>(),
            "{name}: dump"
        );
        let table = std::fs::read_to_string(dir.join(format!("{name}.table"))).unwrap();
        // make.sh replaced the keys with KEY.
        let line: IntegrityLine = table.trim().replace(":KEY", ":00").parse().unwrap();
        assert_eq!(line.meta_device.as_ref().unwrap().to_string(), "7:1");
        assert_eq!(line.length, sb.provided_data_sectors, "{name}");
        assert_eq!(line.interleave_sectors, Some(1), "{name}");
        let geo = Geometry::new_separate(
            &sb,
            m.len() as u64 / 512,
            d.len() as u64 / 512,
            DEFAULT_BUFFER_SECTORS,
        )
        .unwrap();
        assert_eq!(geo.provided_data_sectors, sb.provided_data_sectors);
        assert_eq!(
            Some(geo.journal.sectors()),
            line.journal_sectors.map(u64::from),
            "{name}: journal sectors"
        );
        assert_eq!(geo.interleave_sectors(), 1);
        assert_eq!(line.buffer_sectors, Some(1 << geo.log2_buffer_sectors));
        assert_eq!(sb.to_sector()[..], m[..512], "{name}: round trip");
        // Without its data device the superblock is refused with the reason.
        let e = Geometry::new(&sb, m.len() as u64 / 512, 128).unwrap_err();
        assert!(e.to_string().contains("--data-device"), "{e}");
        let e = IntegrityBackend::open(load(&m), options(&dir, name)).unwrap_err();
        assert!(e.to_string().contains("separate metadata device"), "{e}");
    }
}

#[test]
fn a_flipped_byte_fails_exactly_its_block() {
    let Some(dir) = dir() else { return };
    for name in ["crc32c-4096-datadev-J", "hmac-sha256-512-datadev-D"] {
        let (mut m, mut d) = pair(&dir, name);
        let geo = open(&load(&m), &load(&d), options(&dir, name))
            .unwrap()
            .geometry()
            .clone();
        let bb = geo.block_bytes();
        let spb = bb / 512;
        let (data_block, tag_block) = (100u64, 300u64);
        d[(geo.data_sector(data_block * spb) * 512 + 7) as usize] ^= 0x01;
        assert_eq!(geo.data_sector(data_block * spb), data_block * spb);
        m[geo.tag_byte(tag_block * spb) as usize] ^= 0x80;
        let dev = open(&load(&m), &load(&d), options(&dir, name)).unwrap();
        let want = pattern(dev.info().size_bytes, false);
        let mut block = vec![0u8; bb as usize];
        for b in 0..dev.info().size_bytes / bb {
            let r = dev.read_at(&mut block, b * bb);
            if b == data_block || b == tag_block {
                match r {
                    Err(e @ BackendError::Integrity { offset, len }) => {
                        assert_eq!((offset, len), (b * bb, bb), "{name}");
                        assert_eq!(e.errno(), 84);
                    }
                    other => panic!("{name}: block {b}: {other:?}"),
                }
            } else {
                r.unwrap_or_else(|e| panic!("{name}: block {b}: {e}"));
                assert!(block[..] == want[(b * bb) as usize..((b + 1) * bb) as usize]);
            }
        }
        assert_eq!(dev.mismatches(), 2, "{name}");
    }
}

/// ucrypt's format of the same sizes and options gives the kernel's superblock (its salt
/// aside: the kernel draws it) and, written with the pattern in direct mode, the kernel's
/// data device and tags byte for byte.
#[test]
fn ucrypt_formats_what_the_kernel_formatted() {
    let Some(dir) = dir() else { return };
    for (name, sector, journal) in [
        ("crc32c-4096-datadev-J", 4096, 0),
        ("hmac-sha256-512-datadev-D", 512, 0),
        ("crc32c-512-datadev-Junflushed", 512, 1 << 20),
        ("crc32c-512-datadev-Bdirty", 512, 0),
    ] {
        let (m, d) = pair(&dir, name);
        let ksb = Superblock::parse(&m[..512]).unwrap();
        let opts = options(&dir, name);
        let params = FormatParams {
            sector_size: sector,
            tag_size: opts.hash.digest_size() as u32,
            journal_sectors: journal / 512,
            salt: ksb.salt,
            ..FormatParams::default()
        };
        let meta = Arc::new(MemoryBackend::new(m.len() as u64).unwrap());
        let data = Arc::new(MemoryBackend::new(d.len() as u64).unwrap());
        let mut o = opts.clone();
        o.mode = Mode::Direct;
        let sb = format_separate(meta.clone(), data.clone(), &params, &o, false).unwrap();
        let mut want = ksb.clone();
        // Bitmap mode leaves its flag and the bitmap's size in the kernel's superblock.
        want.flags.0 &= !ucrypt_format::integrity::Flags::DIRTY_BITMAP;
        assert_eq!(
            sb.to_sector()[..64],
            want.to_sector()[..64],
            "{name}: superblock"
        );
        if name.ends_with("-D") {
            let dev = open(&meta, &data, opts).unwrap();
            common::write_all(&dev, &pattern(dev.info().size_bytes, false));
            dev.close().unwrap();
            drop(dev);
            assert!(snapshot(&*data) == d, "{name}: data device");
            let geo = Geometry::new_separate(&sb, m.len() as u64 / 512, d.len() as u64 / 512, 128)
                .unwrap();
            let tags = geo.initial_sectors as usize * 512;
            let n = geo.provided_data_sectors as usize * 32;
            assert!(
                snapshot(&*meta)[tags..tags + n] == m[tags..tags + n],
                "{name}: tags"
            );
        }
    }
}

#[test]
fn devices_too_small_are_refused_with_the_reason() {
    let p = FormatParams::default();
    let o = Options::new(Algorithm::Crc32c);
    let mem = |n: u64| Arc::new(MemoryBackend::new(n).unwrap());
    // 64 KiB of metadata for 4 MiB of data: one journal section (176 sectors) does not fit.
    let e = format_separate(mem(64 << 10), mem(4 << 20), &p, &o, false).unwrap_err();
    assert!(e.to_string().contains("metadata device"), "{e}");
    // A data device smaller than a block.
    let p4k = FormatParams {
        sector_size: 4096,
        ..FormatParams::default()
    };
    let e = format_separate(mem(1 << 20), mem(2048), &p4k, &o, false).unwrap_err();
    assert!(e.to_string().contains("data device"), "{e}");
    // 4 KiB of data formats (integritysetup 2.6.1 does it too: 8 sectors provided).
    let sb = format_separate(mem(1 << 20), mem(4096), &p, &o, true).unwrap();
    assert_eq!(sb.provided_data_sectors, 8);
    // Opened with a data device smaller than formatted: refused; larger: the superblock
    // grows to it, as the kernel writes it on resume.
    let (meta, data) = (mem(1 << 20), mem(4 << 20));
    format_separate(meta.clone(), data.clone(), &p, &o, true).unwrap();
    let e = IntegrityBackend::open_separate(meta.clone(), mem(2 << 20), o.clone()).unwrap_err();
    assert!(e.to_string().contains("data device is too small"), "{e}");
    let big = mem(8 << 20);
    let head = snapshot(&*data);
    big.write_at(&head, 0, false).unwrap();
    let dev = IntegrityBackend::open_separate(meta.clone(), big, o.clone()).unwrap();
    assert_eq!(dev.info().size_bytes, 8 << 20);
    let mut b = vec![0u8; 512];
    dev.read_at(&mut b, 0).unwrap();
    drop(dev);
    assert_eq!(
        Superblock::parse(&snapshot(&*meta)[..512])
            .unwrap()
            .provided_data_sectors,
        16384
    );
}
