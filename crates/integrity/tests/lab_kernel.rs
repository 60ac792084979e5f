//! Linux reads what ucrypt's dm-integrity wrote: images formatted and written here (direct,
//! journal, bitmap, a journal MAC, a journal left unflushed by a simulated crash, which the
//! kernel must replay), opened with `integritysetup open` by Debian's 6.12 kernel in the
//! repository's VM harness `tests/lab/run.sh` (`tests/lab/integrity.sh`, one boot): the
//! kernel reads the expected bytes, and in two tampered copies fails exactly the block
//! whose data or tag byte was flipped, with EILSEQ. Four have an encrypted journal
//! (`--journal-crypt` ctr-aes, xts-aes, chacha20, cbc-aes with a journal MAC), three of
//! them left unflushed: the kernel decrypts and replays what ucrypt encrypted. Four more
//! have a separate metadata device (`integritysetup open META NAME --data-device DATA`:
//! direct with a flipped tag, journal, a journal left unflushed, bitmap).
//!
//! Skipped with a message when `CI` is unset and the lab cannot start; fails when `CI` is
//! set.

#![allow(clippy::unwrap_used)]

mod common;

use common::{hex, pattern, read_all, second_ranges, snapshot, write_all};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::Arc;
use ucrypt_backend::{Backend, MemoryBackend};
use ucrypt_format::integrity::FormatParams;
use ucrypt_integrity::{format, format_separate, Algorithm, IntegrityBackend, Mode, Options};
use zeroize::Zeroizing;

struct Image {
    name: &'static str,
    alg: Algorithm,
    sector: u32,
    interleave: u32,
    journal_sectors: u64,
    mode: Mode,
    jmac: bool,
    unflushed: bool,
    /// (block to damage, in the tag rather than the data)
    tamper: Option<(u64, bool)>,
    /// `--journal-crypt` (integritysetup's name) and its key size; the key is 0x40, 0x41...
    jcrypt: Option<(&'static str, u8)>,
}

fn options(img: &Image, dir: &Path) -> (Options, String) {
    let mut o = Options::new(img.alg);
    o.mode = img.mode;
    let mut args = vec!["--integrity".to_string(), img.alg.kernel_name().into()];
    if img.alg == Algorithm::HmacSha256 {
        args = vec!["--integrity".into(), "hmac-sha256".into()];
        o.hash_key = Some(Zeroizing::new((0u8..32).collect()));
        let k = dir.join("key32.bin");
        std::fs::write(&k, (0u8..32).collect::<Vec<_>>()).unwrap();
        args.extend([
            "--integrity-key-file".into(),
            k.display().to_string(),
            "--integrity-key-size".into(),
            "32".into(),
        ]);
    }
    if img.jmac {
        o.journal_mac = Some((
            Algorithm::HmacSha256,
            Some(Zeroizing::new((128u8..160).collect())),
        ));
        let k = dir.join("jkey32.bin");
        std::fs::write(&k, (128u8..160).collect::<Vec<_>>()).unwrap();
        args.extend([
            "--journal-integrity".into(),
            "hmac-sha256".into(),
            "--journal-integrity-key-file".into(),
            k.display().to_string(),
            "--journal-integrity-key-size".into(),
            "32".into(),
        ]);
    }
    if let Some((alg, n)) = img.jcrypt {
        let key: Vec<u8> = (64u8..64 + n).collect();
        let k = dir.join(format!("jckey{n}.bin"));
        std::fs::write(&k, &key).unwrap();
        o.journal_crypt = Some((alg.to_string(), Zeroizing::new(key)));
        args.extend([
            "--journal-crypt".into(),
            alg.into(),
            "--journal-crypt-key-file".into(),
            k.display().to_string(),
            "--journal-crypt-key-size".into(),
            n.to_string(),
        ]);
    }
    match img.mode {
        Mode::Direct => args.push("--integrity-no-journal".into()),
        Mode::Bitmap => args.push("--integrity-bitmap-mode".into()),
        _ => {}
    }
    (o, args.join(" "))
}

/// Formats and writes one image into `dir`; returns nothing, leaves IMAGE.{img,sha256,args}
/// (and .bad/.badblock) for the guest.
fn make(img: &Image, dir: &Path) {
    let (opts, args) = options(img, dir);
    let mem = Arc::new(MemoryBackend::new(4 << 20).unwrap());
    let params = FormatParams {
        sector_size: img.sector,
        tag_size: img.alg.digest_size() as u32,
        interleave_sectors: img.interleave,
        journal_sectors: img.journal_sectors,
        journal_mac: img.jmac,
        salt: *b"ucrypt-lab-salt!",
        ..FormatParams::default()
    };
    format(mem.clone(), &params, &opts, true).unwrap();
    let dev = IntegrityBackend::open(mem.clone(), opts.clone()).unwrap();
    let size = dev.info().size_bytes;
    write_all(&dev, &pattern(size, false));
    dev.close().unwrap();
    drop(dev);
    let want = pattern(size, img.unflushed);
    if img.unflushed {
        let dev = IntegrityBackend::open(mem.clone(), opts.clone()).unwrap();
        for (from, len) in second_ranges(size) {
            dev.write_at(&want[from as usize..(from + len) as usize], from, false)
                .unwrap();
            dev.flush().unwrap();
        }
        std::mem::forget(dev); // a crash: the journal is committed, not written back
        let mut r = opts.clone();
        r.mode = Mode::Recovery;
        let raw = read_all(&IntegrityBackend::open(mem.clone(), r).unwrap());
        assert!(
            raw[4096..8192] == pattern(size, false)[4096..8192],
            "{}: the journal was written back before the crash",
            img.name
        );
    }
    let bytes = snapshot(&*mem);
    // ucrypt itself reads it back (read-only: the image stays as the crash left it).
    let mut ro = opts.clone();
    ro.read_only = true;
    let dev = IntegrityBackend::open(mem.clone(), ro).unwrap();
    assert!(read_all(&dev) == want, "{}: ucrypt reads it back", img.name);
    let geo = dev.geometry().clone();
    drop(dev);
    std::fs::write(dir.join(format!("{}.img", img.name)), &bytes).unwrap();
    std::fs::write(
        dir.join(format!("{}.sha256", img.name)),
        hex(&Sha256::digest(&want)),
    )
    .unwrap();
    std::fs::write(dir.join(format!("{}.args", img.name)), args).unwrap();
    if let Some((block, in_tag)) = img.tamper {
        let spb = geo.block_bytes() / 512;
        let at = if in_tag {
            geo.tag_byte(block * spb)
        } else {
            geo.data_sector(block * spb) * 512 + 100
        };
        let mut bad = bytes.clone();
        bad[at as usize] ^= 0x04;
        std::fs::write(dir.join(format!("{}.bad", img.name)), bad).unwrap();
        std::fs::write(
            dir.join(format!("{}.badblock", img.name)),
            format!("{block} {}", geo.block_bytes()),
        )
        .unwrap();
    }
}

/// A pair with a separate metadata device (`format_separate`): IMAGE.img is the metadata
/// device (1 MiB, 2 MiB with `journal_sectors`), IMAGE.data the 4 MiB data device; with
/// `tamper`, IMAGE.bad is the metadata device with one tag byte of that block flipped.
fn make_datadev(img: &Image, dir: &Path) {
    let (opts, args) = options(img, dir);
    let meta_bytes = if img.journal_sectors > 0 {
        2 << 20
    } else {
        1 << 20
    };
    let meta = Arc::new(MemoryBackend::new(meta_bytes).unwrap());
    let data = Arc::new(MemoryBackend::new(4 << 20).unwrap());
    let params = FormatParams {
        sector_size: img.sector,
        tag_size: img.alg.digest_size() as u32,
        journal_sectors: img.journal_sectors,
        salt: *b"ucrypt-lab-salt!",
        bitmap_mode: img.mode == Mode::Bitmap,
        ..FormatParams::default()
    };
    format_separate(meta.clone(), data.clone(), &params, &opts, true).unwrap();
    let open = |o: Options| IntegrityBackend::open_separate(meta.clone(), data.clone(), o);
    let dev = open(opts.clone()).unwrap();
    let size = dev.info().size_bytes;
    write_all(&dev, &pattern(size, false));
    dev.close().unwrap();
    drop(dev);
    let want = pattern(size, img.unflushed);
    if img.unflushed {
        let dev = open(opts.clone()).unwrap();
        for (from, len) in second_ranges(size) {
            dev.write_at(&want[from as usize..(from + len) as usize], from, false)
                .unwrap();
            dev.flush().unwrap();
        }
        std::mem::forget(dev); // a crash: the journal is committed, not written back
        let mut r = opts.clone();
        r.mode = Mode::Recovery;
        let raw = read_all(&open(r).unwrap());
        assert!(
            raw[4096..8192] == pattern(size, false)[4096..8192],
            "{}",
            img.name
        );
    }
    let mut ro = opts.clone();
    ro.read_only = true;
    let dev = open(ro).unwrap();
    assert!(read_all(&dev) == want, "{}: ucrypt reads it back", img.name);
    let geo = dev.geometry().clone();
    drop(dev);
    let meta_img = snapshot(&*meta);
    std::fs::write(dir.join(format!("{}.img", img.name)), &meta_img).unwrap();
    std::fs::write(dir.join(format!("{}.data", img.name)), snapshot(&*data)).unwrap();
    std::fs::write(
        dir.join(format!("{}.sha256", img.name)),
        hex(&Sha256::digest(&want)),
    )
    .unwrap();
    std::fs::write(dir.join(format!("{}.args", img.name)), args).unwrap();
    if let Some((block, _)) = img.tamper {
        let mut bad = meta_img;
        bad[geo.tag_byte(block * (geo.block_bytes() / 512)) as usize] ^= 0x04;
        std::fs::write(dir.join(format!("{}.bad", img.name)), bad).unwrap();
        std::fs::write(
            dir.join(format!("{}.badblock", img.name)),
            format!("{block} {}", geo.block_bytes()),
        )
        .unwrap();
    }
}

#[test]
fn the_kernel_reads_what_ucrypt_wrote() {
    let root = ucrypt_testkit::repo_root();
    // The guest sees the directory the harness is started from: the workspace.
    let dir = root.join("target/integrity-lab");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let images = [
        Image {
            name: "crc32c-512-D",
            alg: Algorithm::Crc32c,
            sector: 512,
            interleave: 0,
            journal_sectors: 0,
            mode: Mode::Direct,
            jmac: false,
            unflushed: false,
            tamper: Some((100, false)),
            jcrypt: None,
        },
        Image {
            name: "hmac-sha256-4096-J",
            alg: Algorithm::HmacSha256,
            sector: 4096,
            interleave: 0,
            journal_sectors: 0,
            mode: Mode::Journal,
            jmac: false,
            unflushed: false,
            tamper: Some((50, true)),
            jcrypt: None,
        },
        Image {
            name: "crc32c-512-Junflushed",
            alg: Algorithm::Crc32c,
            sector: 512,
            interleave: 0,
            journal_sectors: 2048,
            mode: Mode::Journal,
            jmac: false,
            unflushed: true,
            tamper: None,
            jcrypt: None,
        },
        Image {
            name: "hmac-sha256-4096-jmac-Junflushed",
            alg: Algorithm::HmacSha256,
            sector: 4096,
            interleave: 0,
            journal_sectors: 2048,
            mode: Mode::Journal,
            jmac: true,
            unflushed: true,
            tamper: None,
            jcrypt: None,
        },
        Image {
            name: "sha256-4096-i256-B",
            alg: Algorithm::Sha256,
            sector: 4096,
            interleave: 256,
            journal_sectors: 0,
            mode: Mode::Bitmap,
            jmac: false,
            unflushed: false,
            tamper: None,
            jcrypt: None,
        },
        Image {
            name: "crc32c-512-jc-ctr-aes-Junflushed",
            alg: Algorithm::Crc32c,
            sector: 512,
            interleave: 0,
            journal_sectors: 2048,
            mode: Mode::Journal,
            jmac: false,
            unflushed: true,
            tamper: None,
            jcrypt: Some(("ctr-aes", 32)),
        },
        Image {
            name: "crc32c-512-jc-xts-aes-J",
            alg: Algorithm::Crc32c,
            sector: 512,
            interleave: 0,
            journal_sectors: 0,
            mode: Mode::Journal,
            jmac: false,
            unflushed: false,
            tamper: None,
            jcrypt: Some(("xts-aes", 64)),
        },
        Image {
            name: "crc32c-512-jc-chacha20-Junflushed",
            alg: Algorithm::Crc32c,
            sector: 512,
            interleave: 0,
            journal_sectors: 2048,
            mode: Mode::Journal,
            jmac: false,
            unflushed: true,
            tamper: None,
            jcrypt: Some(("chacha20", 32)),
        },
        Image {
            name: "hmac-sha256-512-jmac-jc-cbc-aes-Junflushed",
            alg: Algorithm::HmacSha256,
            sector: 512,
            interleave: 0,
            journal_sectors: 2048,
            mode: Mode::Journal,
            jmac: true,
            unflushed: true,
            tamper: None,
            jcrypt: Some(("cbc-aes", 32)),
        },
    ];
    for img in &images {
        make(img, &dir);
    }
    // A separate metadata device (integritysetup --data-device).
    let plain = |name, alg, sector, mode| Image {
        name,
        alg,
        sector,
        interleave: 0,
        journal_sectors: 0,
        mode,
        jmac: false,
        unflushed: false,
        tamper: None,
        jcrypt: None,
    };
    let datadev = [
        Image {
            tamper: Some((100, true)),
            ..plain("crc32c-512-datadev-D", Algorithm::Crc32c, 512, Mode::Direct)
        },
        plain(
            "hmac-sha256-4096-datadev-J",
            Algorithm::HmacSha256,
            4096,
            Mode::Journal,
        ),
        Image {
            journal_sectors: 2048,
            unflushed: true,
            ..plain(
                "crc32c-512-datadev-Junflushed",
                Algorithm::Crc32c,
                512,
                Mode::Journal,
            )
        },
        plain(
            "crc32c-4096-datadev-B",
            Algorithm::Crc32c,
            4096,
            Mode::Bitmap,
        ),
    ];
    for img in &datadev {
        make_datadev(img, &dir);
    }
    let Some(out) = ucrypt_testkit::run_in_vm(
        &root.join("tests/lab/integrity.sh"),
        [&dir],
        &[("LAB_MODULES", "crc32c_generic"), ("LAB_TIMEOUT", "900")],
    ) else {
        return;
    };
    assert!(
        out.lines().any(|l| l == "16 passed, 0 failed"),
        "the lab script did not report its 16 checks"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
