//! LUKS interop with real peers: cryptsetup (header, keyslots, volume key), QEMU's LUKS
//! driver and nbdkit's luks filter (data written by one side reads back through the
//! other), OpenSSL (the LUKS2
//! 4096-byte-sector IV numbering) and cryptsetup's own compatibility images
//! (`testdata/peer-tests/cryptsetup/expectations.json`).
//!
//! Tools are required under `CI=true`; locally a missing tool skips with a message.
//! PBKDF costs are minimal everywhere so the file runs in well under a minute.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Command;
use ucrypt::{HeaderOptions, OpenOptions, VolumeType};
use ucrypt_backend::Backend;

use common::{require, require_that};

/// Runs a command with `stdin`, asserting success; returns stdout.
fn run(cmd: &str, args: &[&str], stdin: &[u8]) -> String {
    let out = run_status(cmd, args, stdin);
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn run_status(cmd: &str, args: &[&str], stdin: &[u8]) -> std::process::Output {
    common::cmd::piped(Command::new(cmd).args(args), stdin)
}

/// The volume key cryptsetup reports (`luksDump --dump-volume-key`).
fn cryptsetup_volume_key(img: &Path, pass: &[u8]) -> String {
    let out = run(
        "cryptsetup",
        &[
            "luksDump",
            "--dump-volume-key",
            "--batch-mode",
            "--key-file",
            "-",
            img.to_str().unwrap(),
        ],
        pass,
    );
    let dump = out.split("MK dump:").nth(1).expect("MK dump line");
    dump.split_whitespace()
        .take_while(|w| w.len() == 2 && w.chars().all(|c| c.is_ascii_hexdigit()))
        .collect()
}

fn hdr(kind: VolumeType) -> HeaderOptions {
    HeaderOptions {
        kind,
        ..HeaderOptions::default()
    }
}

fn open_rw(img: &Path, pass: &[u8]) -> ucrypt::OpenedTable {
    ucrypt::open_header(
        img,
        pass,
        &hdr(VolumeType::Luks),
        OpenOptions {
            read_only: false,
            ..OpenOptions::default()
        },
    )
    .unwrap()
}

/// `0 <len> crypt <cipher> <hexkey> ...` → the key hex.
fn key_hex(u: &ucrypt::Unlocked) -> String {
    u.first_line()
        .to_line(true)
        .split_whitespace()
        .nth(4)
        .unwrap()
        .to_string()
}

fn pbkdf_args(pbkdf: &str) -> Vec<&str> {
    if pbkdf == "pbkdf2" {
        vec!["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"]
    } else {
        vec![
            "--pbkdf",
            pbkdf,
            "--pbkdf-force-iterations",
            "4",
            "--pbkdf-memory",
            "32",
            "--pbkdf-parallel",
            "1",
        ]
    }
}

#[test]
fn luks_made_by_cryptsetup_opens_with_the_same_volume_key() {
    if !require("cryptsetup") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // (type, cipher, key bits, sector size, pbkdf)
    let cases: &[(&str, &str, &str, &str, &str)] = &[
        ("luks1", "aes-xts-plain64", "512", "512", "pbkdf2"),
        ("luks1", "aes-cbc-essiv:sha256", "256", "512", "pbkdf2"),
        ("luks1", "serpent-xts-plain64", "512", "512", "pbkdf2"),
        ("luks1", "twofish-xts-plain64", "256", "512", "pbkdf2"),
        ("luks2", "aes-xts-plain64", "512", "4096", "argon2id"),
        ("luks2", "aes-xts-plain64", "256", "512", "argon2i"),
        ("luks2", "aes-cbc-essiv:sha256", "256", "4096", "pbkdf2"),
        ("luks2", "serpent-xts-plain64", "512", "4096", "argon2i"),
        ("luks2", "twofish-xts-plain64", "512", "512", "argon2id"),
    ];
    let pass = b"correct horse";
    for (i, (kind, cipher, bits, sector, pbkdf)) in cases.iter().enumerate() {
        let img = common::image(dir.path(), &format!("cs{i}.img"), 20 << 20);
        let mut args = vec![
            "luksFormat",
            "--batch-mode",
            "--type",
            kind,
            "--cipher",
            cipher,
            "--key-size",
            bits,
            "--key-file",
            "-",
        ];
        if *kind == "luks2" {
            args.extend(["--sector-size", sector]);
        }
        args.extend(pbkdf_args(pbkdf));
        args.push(img.to_str().unwrap());
        let made = run_status("cryptsetup", &args, pass);
        let case = format!("{kind} {cipher} {bits} bits, sector {sector}, {pbkdf}");
        if !made.status.success() {
            // libcryptsetup encrypts keyslot areas with the kernel (AF_ALG or a temporary
            // dm-crypt mapping) for ciphers its userspace backend (OpenSSL) lacks, such as
            // Serpent and Twofish; without either, it cannot make (or unlock) them.
            let err = String::from_utf8_lossy(&made.stderr);
            assert!(err.contains("device-mapper"), "{case}: {err}");
            eprintln!("N/A {case}: cryptsetup cannot create it here (no dm-crypt/AF_ALG)");
            continue;
        }
        let want = cryptsetup_volume_key(&img, pass);
        let got = ucrypt::unlock(&img, pass, &hdr(VolumeType::Luks)).unwrap();
        assert_eq!(key_hex(&got), want, "{case}");
        assert_eq!(got.first_line().cipher.to_string(), *cipher, "{case}");
        assert_eq!(
            got.first_line().sector_size_bytes().to_string(),
            *sector,
            "{case}"
        );
        let wrong = ucrypt::unlock(&img, b"wrong", &hdr(VolumeType::Luks)).unwrap_err();
        let f = wrong.format().expect("a FormatError");
        assert_eq!(
            f.exit_code(),
            2,
            "{case}: wrong passphrase exits 2: {wrong:#}"
        );
        assert!(!format!("{wrong:#}").contains(&want));
    }
}

/// The pure-Rust keyslot unlock (the fallback for kernel-only ciphers) gives the key
/// cryptsetup dumps, for LUKS1 and LUKS2 with every PBKDF and several AF hashes, and
/// refuses a wrong passphrase with exit code 2.
#[test]
fn pure_rust_keyslot_unlock_matches_cryptsetup_volume_key() {
    if !require("cryptsetup") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str, &str, &str)] = &[
        ("luks1", "aes-xts-plain64", "sha256", "pbkdf2"),
        ("luks1", "aes-cbc-essiv:sha256", "sha1", "pbkdf2"),
        ("luks1", "aes-xts-plain64", "sha512", "pbkdf2"),
        ("luks1", "aes-xts-plain64", "ripemd160", "pbkdf2"),
        ("luks2", "aes-xts-plain64", "sha256", "argon2id"),
        ("luks2", "aes-xts-plain64", "sha512", "argon2i"),
        ("luks2", "aes-cbc-essiv:sha256", "sha1", "pbkdf2"),
    ];
    let pass = b"pure rust";
    for (i, (kind, cipher, hash, pbkdf)) in cases.iter().enumerate() {
        let img = common::image(dir.path(), &format!("n{i}.img"), 20 << 20);
        let mut args = vec![
            "luksFormat",
            "--batch-mode",
            "--type",
            kind,
            "--cipher",
            cipher,
            "--hash",
            hash,
            "--key-file",
            "-",
        ];
        args.extend(pbkdf_args(pbkdf));
        args.push(img.to_str().unwrap());
        run("cryptsetup", &args, pass);
        // A second keyslot, so the unlock has to skip one.
        let other = dir.path().join("other.key");
        std::fs::write(&other, b"second").unwrap();
        let mut add = vec!["luksAddKey", "--batch-mode", "--key-file", "-"];
        add.extend(pbkdf_args(pbkdf));
        add.extend([img.to_str().unwrap(), other.to_str().unwrap()]);
        run("cryptsetup", &add, pass);
        let want = cryptsetup_volume_key(&img, pass);
        let case = format!("{kind} {cipher} {hash} {pbkdf}");
        let unlock = |p: &[u8]| {
            if *kind == "luks1" {
                ucrypt_format::luks1::unlock(&img, None, p)
            } else {
                let mut cd = ucrypt_cryptsetup::CryptDevice::init(&img).unwrap();
                cd.load(None).unwrap();
                let meta = cd.luks2_metadata().unwrap();
                ucrypt_format::luks2::unlock(&img, &meta, None, p, false)
            }
        };
        let (slot, key) = unlock(pass).unwrap();
        assert_eq!(slot, 0, "{case}");
        assert_eq!(key.to_hex().as_str(), want, "{case}");
        let (slot, key) = unlock(b"second").unwrap();
        assert_eq!((slot, key.to_hex().as_str()), (1, want.as_str()), "{case}");
        let wrong = unlock(b"wrong").unwrap_err();
        assert_eq!(wrong.exit_code(), 2, "{case}: {wrong}");
        assert!(!wrong.to_string().contains(&want));
    }
}

#[test]
fn luks2_4096_byte_sectors_count_ivs_in_512_byte_units_like_python_cryptography_xts() {
    if !require("cryptsetup") || !require("python3") {
        return;
    }
    let has_module = Command::new("python3")
        .args(["-c", "import cryptography"])
        .status()
        .is_ok_and(|s| s.success());
    if !require_that(has_module, "python3 cryptography module not found") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::image(dir.path(), "l2.img", 20 << 20);
    let pass = b"pw";
    let mut args = vec![
        "luksFormat",
        "--batch-mode",
        "--type",
        "luks2",
        "--sector-size",
        "4096",
        "--key-file",
        "-",
    ];
    args.extend(pbkdf_args("pbkdf2"));
    args.push(img.to_str().unwrap());
    run("cryptsetup", &args, pass);
    let opened = open_rw(&img, pass);
    let plain: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
    opened.volume.write_at(&plain, 0, false).unwrap();
    opened.volume.flush().unwrap();
    let off = opened.table.offset_bytes();
    drop(opened);
    // Second 4096-byte sector: dm-crypt (LUKS2, no iv_large_sectors) uses IV 8.
    let raw = std::fs::read(&img).unwrap();
    let ct = dir.path().join("ct");
    std::fs::write(&ct, &raw[off as usize + 4096..off as usize + 8192]).unwrap();
    let key = cryptsetup_volume_key(&img, pass);
    // An independent AES-XTS (OpenSSL through python3-cryptography), tweak = 8 (LE).
    let script = "import sys\n\
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes\n\
key = bytes.fromhex(sys.argv[1]); ct = open(sys.argv[2], 'rb').read()\n\
d = Cipher(algorithms.AES(key), modes.XTS((8).to_bytes(16, 'little'))).decryptor()\n\
sys.stdout.buffer.write(d.update(ct) + d.finalize())\n";
    let out = Command::new("python3")
        .args(["-c", script, &key])
        .arg(&ct)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, plain[4096..]);
}

fn ucrypt_bin(args: &[&str], stdin: &[u8]) -> std::process::Output {
    common::ucrypt(args, stdin)
}

#[test]
fn luks_made_by_ucrypt_passes_cryptsetup_checks() {
    if !require("cryptsetup") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for kind in ["luks2", "luks1"] {
        let img = common::image(dir.path(), &format!("{kind}.img"), 20 << 20);
        let p = img.to_str().unwrap();
        let mut args = vec!["luksFormat", "-q", "--type", kind, "--uuid"];
        args.push("2a4a8a5c-9c61-4e1a-8b0f-6f1b3b1e0a11");
        args.extend(pbkdf_args(if kind == "luks1" {
            "pbkdf2"
        } else {
            "argon2id"
        }));
        args.push(p);
        common::ok(ucrypt_bin(&args, b"first\n"));
        run("cryptsetup", &["isLuks", "--type", kind, p], b"");
        let dump = run("cryptsetup", &["luksDump", p], b"");
        assert!(
            dump.contains("2a4a8a5c-9c61-4e1a-8b0f-6f1b3b1e0a11"),
            "{dump}"
        );
        run("cryptsetup", &["open", "--test-passphrase", p], b"first\n");
        // Our key equals theirs.
        let got = ucrypt::unlock(&img, b"first", &hdr(VolumeType::Luks)).unwrap();
        assert_eq!(key_hex(&got), cryptsetup_volume_key(&img, b"first"));
        // Keyslot management, each step checked by cryptsetup.
        let mut add = vec!["luksAddKey", p];
        add.extend(pbkdf_args("pbkdf2"));
        common::ok(ucrypt_bin(&add, b"first\nsecond\n"));
        run("cryptsetup", &["open", "--test-passphrase", p], b"second\n");
        let mut change = vec!["luksChangeKey", p];
        change.extend(pbkdf_args("pbkdf2"));
        common::ok(ucrypt_bin(&change, b"second\nthird\n"));
        run("cryptsetup", &["open", "--test-passphrase", p], b"third\n");
        assert!(
            !run_status("cryptsetup", &["open", "--test-passphrase", p], b"second\n")
                .status
                .success()
        );
        common::ok(ucrypt_bin(&["luksRemoveKey", p], b"third\n"));
        assert!(
            !run_status("cryptsetup", &["open", "--test-passphrase", p], b"third\n")
                .status
                .success()
        );
        // Killing the last slot needs --batch-mode; without it, nothing changes.
        assert!(!ucrypt_bin(&["luksKillSlot", p, "0"], b"first\n")
            .status
            .success());
        run("cryptsetup", &["open", "--test-passphrase", p], b"first\n");
        // Header backup, damage, restore.
        let bak = dir.path().join(format!("{kind}.hdr"));
        common::ok(ucrypt_bin(
            &[
                "luksHeaderBackup",
                p,
                "--header-backup-file",
                bak.to_str().unwrap(),
            ],
            b"",
        ));
        common::ok(ucrypt_bin(&["luksKillSlot", "-q", p, "0"], b""));
        assert!(
            !run_status("cryptsetup", &["open", "--test-passphrase", p], b"first\n")
                .status
                .success()
        );
        common::ok(ucrypt_bin(
            &[
                "luksHeaderRestore",
                "-q",
                p,
                "--header-backup-file",
                bak.to_str().unwrap(),
            ],
            b"",
        ));
        run("cryptsetup", &["open", "--test-passphrase", p], b"first\n");
        let uuid = common::ok(ucrypt_bin(&["luksUUID", p], b""));
        assert_eq!(
            String::from_utf8(uuid).unwrap().trim(),
            run("cryptsetup", &["luksUUID", p], b"").trim()
        );
        // Exit codes: bad passphrase 2, not LUKS 1, missing device 4.
        let bad = ucrypt_bin(&["luksOpen", "--test-passphrase", p], b"nope\n");
        assert_eq!(bad.status.code(), Some(2));
    }
    let plain = common::image(dir.path(), "plain.img", 1 << 20);
    let r = ucrypt_bin(&["isLuks", plain.to_str().unwrap()], b"");
    assert_eq!(r.status.code(), Some(1));
    let r = ucrypt_bin(&["isLuks", "/nonexistent/ucrypt"], b"");
    assert_eq!(r.status.code(), Some(4));
}

#[test]
fn luks_dump_volume_key_needs_confirmation_and_matches_cryptsetup() {
    if !require("cryptsetup") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::image(dir.path(), "d.img", 20 << 20);
    let p = img.to_str().unwrap();
    let mut args = vec!["luksFormat", "-q"];
    args.extend(pbkdf_args("pbkdf2"));
    args.push(p);
    common::ok(ucrypt_bin(&args, b"pw\n"));
    // Without --batch-mode (and no terminal): refused, nothing printed.
    let r = ucrypt_bin(&["luksDump", "--dump-volume-key", p], b"pw\n");
    assert_eq!(r.status.code(), Some(1));
    assert!(r.stdout.is_empty());
    let ours = String::from_utf8(common::ok(ucrypt_bin(
        &["luksDump", "--dump-volume-key", "-q", p],
        b"pw\n",
    )))
    .unwrap();
    let theirs = run(
        "cryptsetup",
        &["luksDump", "--dump-volume-key", "--batch-mode", p],
        b"pw\n",
    );
    let tail = |s: &str| s.split("MK dump:").nth(1).unwrap().to_string();
    assert_eq!(tail(&ours), tail(&theirs));
    // The text dump is libcryptsetup's own.
    let ours = String::from_utf8(common::ok(ucrypt_bin(&["luksDump", p], b""))).unwrap();
    assert_eq!(ours, run("cryptsetup", &["luksDump", p], b""));
    let json = common::ok(ucrypt_bin(&["luksDump", "--dump-json-metadata", p], b""));
    let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(v["segments"]["0"]["encryption"], "aes-xts-plain64");
}

fn qemu_secret(pass: &str) -> String {
    format!("secret,id=sec0,data={pass}")
}

#[test]
fn data_written_by_qemu_luks_reads_back_through_ucrypt_and_the_reverse() {
    if !require("qemu-img") || !require("qemu-io") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (name, opts) in [
        (
            "xts",
            "cipher-alg=aes-256,cipher-mode=xts,ivgen-alg=plain64,iter-time=10",
        ),
        (
            "essiv",
            "cipher-alg=aes-128,cipher-mode=cbc,ivgen-alg=essiv,ivgen-hash-alg=sha256,iter-time=10",
        ),
    ] {
        let img = dir.path().join(format!("q-{name}.img"));
        let p = img.to_str().unwrap();
        let create = [
            "create",
            "-f",
            "luks",
            "--object",
            &qemu_secret("qpass"),
            "-o",
            &format!("key-secret=sec0,{opts}"),
            p,
            "8M",
        ];
        // QEMU 7.2 times its PBKDF2 benchmark with the thread's CPU clock and fails
        // ("Unable to get accurate CPU usage") when the tick-sampled clock shows none for
        // its first 2^15 iterations (a few ms here): five in a row happened in a clean-clone
        // CI run. Retry that one failure, 20 times with a pause between (as nbd_interop's
        // qemu-img create does).
        for attempt in 1.. {
            let out = run_status("qemu-img", &create, b"");
            let err = String::from_utf8_lossy(&out.stderr);
            if out.status.success() {
                break;
            }
            assert!(
                attempt < 20 && err.contains("accurate CPU usage"),
                "qemu-img {create:?} failed: {err}"
            );
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        let image_opts = format!("driver=luks,key-secret=sec0,file.filename={p}");
        let qemu_io = |cmd: &str| {
            run(
                "qemu-io",
                &[
                    "--object",
                    &qemu_secret("qpass"),
                    "--image-opts",
                    &image_opts,
                    "-c",
                    cmd,
                ],
                b"",
            )
        };
        qemu_io("write -P 0xab 4096 1M");
        let opened = open_rw(&img, b"qpass");
        let mut buf = vec![0u8; 1 << 20];
        opened.volume.read_at(&mut buf, 4096).unwrap();
        assert!(
            buf.iter().all(|&b| b == 0xab),
            "{name}: QEMU's data reads back"
        );
        opened
            .volume
            .write_at(&vec![0xcd; 65536], 2 << 20, false)
            .unwrap();
        opened.volume.flush().unwrap();
        drop(opened);
        let out = qemu_io("read -P 0xcd 2M 64k");
        assert!(
            !out.contains("Pattern verification failed"),
            "{name}: {out}"
        );
    }
}

/// Runs `cmd` (a shell command using `$uri`) against nbdkit's luks filter over `img`.
fn nbdkit_luks(img: &Path, pass_file: &Path, cmd: &str) -> String {
    let pass = format!("passphrase=+{}", pass_file.display());
    run(
        "timeout",
        &[
            "120",
            "nbdkit",
            "-U",
            "-",
            "--filter=luks",
            "file",
            img.to_str().unwrap(),
            &pass,
            "--run",
            cmd,
        ],
        b"",
    )
}

/// nbdkit's luks filter (LUKS1 only) and ucrypt read each other's writes, on headers made
/// by cryptsetup and by ucrypt, for XTS and CBC (the filter knows no ESSIV).
#[test]
fn data_written_through_nbdkit_luks_reads_back_through_ucrypt_and_the_reverse() {
    if !require("cryptsetup") || !require("nbdkit") || !require("nbdcopy") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pass_file = dir.path().join("pass");
    std::fs::write(&pass_file, b"nbdpw").unwrap();
    let pattern = dir.path().join("pattern");
    std::fs::write(&pattern, vec![0x3c; 1 << 20]).unwrap();
    for (maker, cipher, key_size) in [
        ("cryptsetup", "aes-xts-plain64", "512"),
        ("cryptsetup", "aes-cbc-plain64", "256"),
        ("ucrypt", "aes-xts-plain64", "256"),
        ("ucrypt", "aes-cbc-plain", "128"),
    ] {
        let what = format!("{maker} {cipher}");
        let img = common::image(dir.path(), "nk.img", 16 << 20);
        let p = img.to_str().unwrap();
        let mut args = vec![
            "luksFormat",
            "--batch-mode",
            "--type",
            "luks1",
            "--cipher",
            cipher,
            "--key-size",
            key_size,
            "--key-file",
            pass_file.to_str().unwrap(),
        ];
        args.extend(pbkdf_args("pbkdf2"));
        args.push(p);
        if maker == "cryptsetup" {
            run("cryptsetup", &args, b"");
        } else {
            common::ok(ucrypt_bin(&args, b""));
        }
        // nbdkit writes 1 MiB of 0x3c at offset 0; ucrypt reads it back.
        let cmd = format!("nbdcopy {} \"$uri\"", pattern.display());
        nbdkit_luks(&img, &pass_file, &cmd);
        let opened = open_rw(&img, b"nbdpw");
        let mut buf = vec![0u8; 1 << 20];
        opened.volume.read_at(&mut buf, 0).unwrap();
        assert!(buf.iter().all(|&b| b == 0x3c), "{what}: nbdkit's data");
        // ucrypt writes 64 KiB of 0xe1 at 3 MiB (and an unaligned 1000 bytes at 5 MiB+17);
        // nbdkit reads them back.
        opened
            .volume
            .write_at(&vec![0xe1; 65536], 3 << 20, false)
            .unwrap();
        opened
            .volume
            .write_at(&[0x77; 1000], (5 << 20) + 17, false)
            .unwrap();
        opened.volume.flush().unwrap();
        drop(opened);
        let out = dir.path().join("via-nbdkit");
        let cmd = format!("nbdcopy \"$uri\" {}", out.display());
        nbdkit_luks(&img, &pass_file, &cmd);
        let data = std::fs::read(&out).unwrap();
        assert!(data[..1 << 20].iter().all(|&b| b == 0x3c), "{what}");
        assert!(
            data[3 << 20..(3 << 20) + 65536].iter().all(|&b| b == 0xe1),
            "{what}: ucrypt's aligned write as nbdkit sees it"
        );
        let at = (5 << 20) + 17;
        assert!(
            data[at..at + 1000].iter().all(|&b| b == 0x77),
            "{what}: ucrypt's unaligned write as nbdkit sees it"
        );
        std::fs::remove_file(&img).unwrap();
    }
}

/// cryptsetup's compatibility images: each opens and checks out, or is refused.
#[test]
fn cryptsetup_test_suite_images_open_or_are_refused_as_expected() {
    let Some(base) = ucrypt_testkit::testdata("peer-tests/cryptsetup", "expectations.json") else {
        return;
    };
    if !require("xz") || !require("tar") {
        return;
    }
    let exp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(base.join("expectations.json")).unwrap())
            .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut unpacked = std::collections::HashSet::new();
    let mut checked = 0;
    let mut failures = Vec::new();
    for e in exp["entries"].as_array().unwrap() {
        let format = e["format"].as_str().unwrap_or("");
        if format != "luks1" && format != "luks2" {
            continue;
        }
        let file = e["file"].as_str().unwrap();
        if unpacked.insert(file.to_string()) {
            let src = base.join(file);
            if file.ends_with(".tar.xz") {
                run(
                    "tar",
                    &[
                        "xJSf",
                        src.to_str().unwrap(),
                        "-C",
                        dir.path().to_str().unwrap(),
                    ],
                    b"",
                );
            } else {
                let out = Command::new("xz").args(["-dc"]).arg(&src).output().unwrap();
                let name = file.trim_end_matches(".xz");
                std::fs::write(dir.path().join(name), out.stdout).unwrap();
            }
        }
        let img = dir.path().join(e["image"].as_str().unwrap());
        if let Err(why) = check_entry(e, &img, dir.path()) {
            failures.push(format!("{}: {why}", e["id"]));
        }
        checked += 1;
    }
    assert!(checked >= 30, "only {checked} LUKS entries");
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn secret_of(e: &serde_json::Value, dir: &Path) -> Option<Vec<u8>> {
    if let Some(p) = e["passphrase"].as_str() {
        return Some(p.as_bytes().to_vec());
    }
    let files = e["key_files"].as_array()?;
    let mut s = Vec::new();
    for f in files {
        s.extend(std::fs::read(dir.join(f.as_str().unwrap())).unwrap());
    }
    Some(s)
}

fn opts_for(e: &serde_json::Value) -> HeaderOptions {
    HeaderOptions {
        key_slot: e["keyslot"].as_u64().map(|s| s as u32),
        ..hdr(VolumeType::Luks)
    }
}

fn check_entry(e: &serde_json::Value, img: &Path, dir: &Path) -> Result<(), String> {
    let role = e["role"].as_str().unwrap_or("");
    let secret = secret_of(e, dir);
    match role {
        "parse" => {
            let mut cd = ucrypt_cryptsetup::CryptDevice::init(img).map_err(|e| e.to_string())?;
            cd.load(None).map_err(|e| format!("must load: {e}"))?;
        }
        "reject" => {
            if let Some(s) = &secret {
                if let Ok(u) = ucrypt::unlock(img, s, &opts_for(e)) {
                    return Err(format!(
                        "must be refused, opened as {}",
                        u.first_line().to_line(false)
                    ));
                }
            } else if ucrypt::unlock(img, b"", &opts_for(e)).is_ok() {
                return Err("must be refused".into());
            }
        }
        "open" => {
            let s = secret.ok_or("no secret")?;
            // Serpent, Twofish, LRW and essiv:wp256 keyslots need the kernel in
            // libcryptsetup; ucrypt unlocks them in pure Rust (no N/A left).
            let u = ucrypt::unlock(img, &s, &opts_for(e))
                .map_err(|err| format!("must open: {err:#}"))?;
            if let Some(w) = e["observed"]["volume_key_hex"].as_str() {
                if key_hex(&u) != w {
                    return Err(format!("volume key {} != observed {w}", key_hex(&u)));
                }
            }
            let d = &e["expected_dump"];
            let info = &u.info;
            for (field, got) in [
                ("cipher", Some(info.cipher.clone())),
                ("cipher_mode", Some(info.cipher_mode.clone())),
                ("uuid", info.uuid.clone()),
            ] {
                if let Some(w) = d[field].as_str() {
                    if got.as_deref() != Some(w) {
                        return Err(format!("{field}: got {got:?}, expected {w}"));
                    }
                }
            }
            if let Some(w) = d["data_offset_sectors"].as_u64() {
                if info.data_offset != w {
                    return Err(format!("data offset {} != {w}", info.data_offset));
                }
            }
            if let Some(w) = d["volume_key_bytes"].as_u64() {
                if info.key_bytes as u64 != w {
                    return Err(format!("key bytes {} != {w}", info.key_bytes));
                }
            }
            if u.first_line().length == 0 {
                // Header-only image (data offset = device size): unlocking is the check.
                return Ok(());
            }
            let line = u
                .mapping
                .into_single_line()
                .map_err(|m| format!("expected one crypt line, got {:?}", m.to_lines(false)))?;
            let opened = ucrypt::open_parsed(
                line,
                OpenOptions {
                    read_only: true,
                    ..OpenOptions::default()
                },
            )
            .map_err(|e| format!("{e:#}"))?;
            let size = opened.volume.info().size_bytes;
            let mut all = vec![0u8; size as usize];
            opened
                .volume
                .read_at(&mut all, 0)
                .map_err(|e| e.to_string())?;
            if let Some(w) = e["expected_sha256_of_plaintext"].as_str() {
                let got = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&all));
                if got != w {
                    return Err(format!("plaintext sha256 {got} != {w}"));
                }
            }
            if let Some(w) = e["expected_sha1_of_plaintext"].as_str() {
                let got = hex::encode(<sha1::Sha1 as sha1::Digest>::digest(&all));
                if got != w {
                    return Err(format!("plaintext sha1 {got} != {w}"));
                }
            }
            if e["expected_fs_uuid"].as_str() == Some("DEAD-BABE") {
                // FAT volume serial, little-endian at 0x27 (FAT12/16) or 0x43 (FAT32).
                let serial = [0xbe, 0xba, 0xad, 0xde];
                if all.get(0x27..0x2b) != Some(&serial[..])
                    && all.get(0x43..0x47) != Some(&serial[..])
                {
                    return Err("FAT serial DEAD-BABE not found".into());
                }
            }
            for c in e["extra_cases"].as_array().into_iter().flatten() {
                let s = secret_of(c, dir).unwrap_or_else(|| s.clone());
                ucrypt::unlock(img, &s, &opts_for(c))
                    .map_err(|err| format!("{}: {err:#}", c["label"]))?;
            }
        }
        _ => {}
    }
    // Passphrase-only checks (reject entries too): must verify without activation.
    for c in e["extra_cases"].as_array().into_iter().flatten() {
        if c["options"]["test_passphrase"].as_bool() == Some(true) {
            let s = secret_of(c, dir).ok_or("no secret")?;
            let mut cd = ucrypt_cryptsetup::CryptDevice::init(img).map_err(|e| e.to_string())?;
            cd.load(None).map_err(|e| e.to_string())?;
            cd.check_passphrase(c["keyslot"].as_u64().map(|s| s as u32), &s)
                .map_err(|err| format!("{}: {err}", c["label"]))?;
        }
    }
    for n in e["negative_checks"].as_array().into_iter().flatten() {
        if n["label"].as_str().unwrap_or("").contains("truncated") {
            let short = dir.join("truncated.img");
            std::fs::copy(img, &short).unwrap();
            std::fs::OpenOptions::new()
                .write(true)
                .open(&short)
                .unwrap()
                .set_len(8191 * 512)
                .unwrap();
            if ucrypt::unlock(
                &short,
                n["passphrase"].as_str().unwrap().as_bytes(),
                &opts_for(e),
            )
            .is_ok()
            {
                return Err("truncated image must not open".into());
            }
            continue;
        }
        if let Some(p) = n["passphrase"].as_str() {
            if ucrypt::unlock(img, p.as_bytes(), &opts_for(n)).is_ok() {
                return Err(format!("{} must fail", n["label"]));
            }
        }
    }
    Ok(())
}

#[test]
fn ucrypt_open_serves_a_luks1_volume_qemu_wrote_over_nbd() {
    if !require("cryptsetup") || !require("qemu-io") || !require("nbdcopy") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::image(dir.path(), "o.img", 16 << 20);
    let p = img.to_str().unwrap();
    let mut args = vec![
        "luksFormat",
        "--batch-mode",
        "--type",
        "luks1",
        "--key-file",
        "-",
    ];
    args.extend(pbkdf_args("pbkdf2"));
    args.push(p);
    run("cryptsetup", &args, b"pw");
    let image_opts = format!("driver=luks,key-secret=sec0,file.filename={p}");
    run(
        "qemu-io",
        &[
            "--object",
            &qemu_secret("pw"),
            "--image-opts",
            &image_opts,
            "-c",
            "write -P 0x5a 0 1M",
        ],
        b"",
    );
    let out = dir.path().join("plain.out");
    let cmd = format!("nbdcopy \"$uri\" {}", out.display());
    common::ok(common::ucrypt(
        &["open", p, "--read-only", "--run", &cmd],
        b"pw\n",
    ));
    let data = std::fs::read(&out).unwrap();
    assert!(data[..1 << 20].iter().all(|&b| b == 0x5a));
    // --test-passphrase serves nothing and exits 0 / 2.
    common::ok(common::ucrypt(&["open", "--test-passphrase", p], b"pw\n"));
    let bad = common::ucrypt(&["open", "--test-passphrase", p], b"nope\n");
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn plain_mode_follows_cryptsetup_key_rules_and_options() {
    use sha2::Digest;
    let dir = tempfile::tempdir().unwrap();
    let img = common::image(dir.path(), "p.img", 4 << 20);
    let p = img.to_str().unwrap();
    // A hashed passphrase: sha256(pass) || sha256("A" || pass) for a 512-bit key.
    let line = common::ok(common::ucrypt(
        &[
            "luksOpen",
            "--print-table",
            "--showkeys",
            "--type",
            "plain",
            "--cipher",
            "aes-xts-plain64",
            "--key-size",
            "512",
            "--hash",
            "sha256",
            "--offset",
            "8",
            "--skip",
            "16",
            "--size",
            "4096",
            "--sector-size",
            "4096",
            "--iv-large-sectors",
            p,
        ],
        b"plainpass\n",
    ));
    let line = String::from_utf8(line).unwrap();
    let want = format!(
        "{}{}",
        hex::encode(sha2::Sha256::digest(b"plainpass")),
        hex::encode(sha2::Sha256::digest(b"Aplainpass"))
    );
    assert_eq!(
        line.trim(),
        format!("0 4096 crypt aes-xts-plain64 {want} 16 {p} 8 2 sector_size:4096 iv_large_sectors")
    );
    // Defaults (cryptsetup 2.6): aes-cbc-essiv:sha256, 256 bits, ripemd160.
    let line = common::ok(common::ucrypt(
        &["luksOpen", "--print-table", "--type", "plain", p],
        b"x\n",
    ));
    assert!(String::from_utf8(line)
        .unwrap()
        .starts_with("0 8192 crypt aes-cbc-essiv:sha256 <key:32-bytes> 0"));
    // A key file (not stdin) is the raw key: key-size bytes from --keyfile-offset.
    let kf = dir.path().join("key");
    let bytes: Vec<u8> = (0u8..100).collect();
    std::fs::write(&kf, &bytes).unwrap();
    let line = common::ok(common::ucrypt(
        &[
            "luksOpen",
            "--print-table",
            "--showkeys",
            "--type",
            "plain",
            "--cipher",
            "aes-xts-plain64",
            "--key-size",
            "256",
            "--key-file",
            kf.to_str().unwrap(),
            "--keyfile-offset",
            "10",
            p,
        ],
        b"",
    ));
    let line = String::from_utf8(line).unwrap();
    assert_eq!(
        line.split_whitespace().nth(4).unwrap(),
        hex::encode(&bytes[10..42])
    );
    // Too short a key file is an error, not a zero-padded key.
    let r = common::ucrypt(
        &[
            "luksOpen",
            "--print-table",
            "--type",
            "plain",
            "--key-size",
            "512",
            "--key-file",
            kf.to_str().unwrap(),
            "--keyfile-offset",
            "90",
            p,
        ],
        b"",
    );
    assert_eq!(r.status.code(), Some(1));
}

/// Waits until the tmux pane shows `what` (up to ~10 s); returns the pane text.
fn tmux_wait(session: &str, what: &str) -> String {
    for _ in 0..100 {
        let pane = run("tmux", &["capture-pane", "-t", session, "-p"], b"");
        if pane.contains(what) {
            return pane;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("tmux pane never showed {what:?}");
}

#[test]
fn passphrase_prompt_in_a_real_terminal_does_not_echo() {
    if !require("tmux") || !require("cryptsetup") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::image(dir.path(), "t.img", 20 << 20);
    let p = img.to_str().unwrap();
    let session = format!("ucrypt-luks-{}", std::process::id());
    let cmd = format!(
        "{} luksFormat --pbkdf pbkdf2 --pbkdf-force-iterations 1000 {p}; echo RC=$?; sleep 30",
        env!("CARGO_BIN_EXE_ucrypt")
    );
    run(
        "tmux",
        &[
            "new-session",
            "-d",
            "-s",
            &session,
            "-x",
            "200",
            "-y",
            "30",
            &cmd,
        ],
        b"",
    );
    let send = |keys: &str| run("tmux", &["send-keys", "-t", &session, keys, "Enter"], b"");
    tmux_wait(&session, "Type 'yes'");
    send("YES");
    tmux_wait(&session, "Enter passphrase");
    send("tty-secret-42");
    tmux_wait(&session, "Verify passphrase");
    send("tty-secret-42");
    let pane = tmux_wait(&session, "RC=");
    let _ = run_status("tmux", &["kill-session", "-t", &session], b"");
    assert!(pane.contains("RC=0"), "{pane}");
    assert!(
        !pane.contains("tty-secret-42"),
        "the passphrase was echoed:\n{pane}"
    );
    run(
        "cryptsetup",
        &["open", "--test-passphrase", "--key-file", "-", p],
        b"tty-secret-42",
    );
}
