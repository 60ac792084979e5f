//! BitLocker and FileVault2 images of cryptsetup's own test suite
//! (`testdata/peer-tests/cryptsetup/`): each opens (volume key through libcryptsetup,
//! mapping and data path by ucrypt) and its whole decrypted device hashes to the SHA-256
//! the suite states, or is refused as stated. Every other secret of an image (recovery
//! passphrase, second recovery passphrase, BEK startup key) must give the same volume key.
//! Two images need ucrypt's own protector code (`ucrypt_format::bitlk::keys`) because
//! Debian 12's libcryptsetup 2.6.1 cannot open them: a non-ASCII passphrase and a volume
//! protected only by a clear key.
#![allow(clippy::unwrap_used)]

use sha2::Digest;
use std::path::{Path, PathBuf};
use std::process::Command;
use ucrypt::{HeaderOptions, OpenOptions, VolumeType};

/// cryptsetup's test-suite images (`testdata/peer-tests/cryptsetup`), by the workspace's
/// skip rule.
fn base() -> Option<PathBuf> {
    ucrypt_testkit::testdata("peer-tests/cryptsetup", "expectations.json")
}

fn secret(c: &serde_json::Value, dir: &Path) -> Option<Vec<u8>> {
    if let Some(p) = c["passphrase"].as_str() {
        return Some(p.as_bytes().to_vec());
    }
    let f = c["key_files"].as_array()?.first()?.as_str()?;
    Some(std::fs::read(dir.join(f)).unwrap())
}

fn opts(kind: VolumeType) -> HeaderOptions {
    HeaderOptions {
        kind,
        ..HeaderOptions::default()
    }
}

fn key_of(u: &ucrypt::Unlocked) -> String {
    u.first_line()
        .to_line(true)
        .split_whitespace()
        .nth(4)
        .unwrap()
        .to_string()
}

/// The FVEK from `ucrypt_format::bitlk` alone (layout and keys, no libcryptsetup).
fn own_bitlk_key(img: &Path, secret: &[u8]) -> Result<String, String> {
    let layout = ucrypt_format::bitlk::Layout::read(img).map_err(|e| e.to_string())?;
    let m = ucrypt_format::bitlk::keys::Metadata::read(img, &layout.fve_offsets)
        .map_err(|e| e.to_string())?;
    let k = m
        .volume_key(secret)
        .map_err(|e| format!("pure-Rust unlock: {e}"))?;
    Ok(k.to_hex().to_string())
}

fn check(e: &serde_json::Value, dir: &Path) -> Result<String, String> {
    let img = dir.join(e["image"].as_str().unwrap());
    let kind = match e["format"].as_str() {
        Some("bitlk") => VolumeType::Bitlk,
        _ => VolumeType::Fvault2,
    };
    let pass = secret(e, dir);
    // A volume whose only protector is a clear key opens with no secret at all.
    let pass = match pass {
        Some(p) => p,
        None if e["secret_kind"]
            .as_str()
            .is_some_and(|k| k.contains("clear key")) =>
        {
            Vec::new()
        }
        None => return Err("no secret".into()),
    };
    if e["role"] == "reject" {
        let err = ucrypt::unlock(&img, &pass, &opts(kind))
            .err()
            .ok_or("must be refused, but opened")?;
        let msg = format!("{err:#}");
        if !msg.contains("cannot be activated") && !msg.contains("not supported") {
            return Err(format!("refused for the wrong reason: {msg}"));
        }
        // The passphrase itself is right: the volume key dump works (cryptsetup's
        // `bitlkDump --dump-volume-key`).
        let mut cd = ucrypt_cryptsetup::CryptDevice::init(&img).unwrap();
        cd.load(Some(ucrypt_cryptsetup::HeaderType::Bitlk)).unwrap();
        let (_, vk) = cd
            .volume_key(None, &pass)
            .map_err(|e| format!("volume key dump: {e}"))?;
        if let Some(w) = e["observed"]["volume_key_hex"].as_str() {
            if vk.to_hex().as_str() != w {
                return Err("dumped volume key differs from the observed one".into());
            }
        }
        return Ok(format!("refused: {msg}"));
    }
    let u = ucrypt::unlock(&img, &pass, &opts(kind)).map_err(|e| format!("{e:#}"))?;
    let key = key_of(&u);
    if kind == VolumeType::Bitlk && e["key_files"].is_null() {
        // ucrypt's own protector code agrees with libcryptsetup wherever both work.
        let own = own_bitlk_key(&img, &pass)?;
        if own != key {
            return Err(format!("pure-Rust FVEK {own} != {key}"));
        }
    }
    for w in [
        &e["observed"]["volume_key_hex"],
        &e["expected_volume_key_hex"],
    ] {
        if let Some(w) = w.as_str() {
            if key != w {
                return Err(format!("volume key differs from the expected {w}"));
            }
        }
    }
    if let Some(g) = e["expected_dump"]["cipher"].as_str() {
        if u.first_line().cipher.to_string() != g {
            return Err(format!("cipher {} != {g}", u.first_line().cipher));
        }
    }
    let lines = u.table_lines(false, "ucrypt");
    let volume = ucrypt::open_unlocked(
        u,
        OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        },
    )
    .map_err(|e| format!("{e:#}"))?;
    let size = volume.info().size_bytes;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 4 << 20];
    let mut at = 0;
    while at < size {
        let n = (size - at).min(buf.len() as u64) as usize;
        volume
            .read_at(&mut buf[..n], at)
            .map_err(|e| e.to_string())?;
        h.update(&buf[..n]);
        at += n as u64;
    }
    let got = hex::encode(h.finalize());
    if let Some(w) = e["expected_sha256_of_plaintext"].as_str() {
        if got != w {
            return Err(format!(
                "sha256 {got} != {w}; mapping:\n{}",
                lines.join("\n")
            ));
        }
    }
    for c in e["extra_cases"].as_array().into_iter().flatten() {
        if let Some(s) = secret(c, dir) {
            let other = ucrypt::unlock(&img, &s, &opts(kind))
                .map_err(|err| format!("{}: {err:#}", c["label"]))?;
            if key_of(&other) != key {
                return Err(format!("{}: a different volume key", c["label"]));
            }
        }
    }
    for n in e["negative_checks"].as_array().into_iter().flatten() {
        if let Some(p) = n["passphrase"].as_str() {
            let err = ucrypt::unlock(&img, p.as_bytes(), &opts(kind))
                .err()
                .ok_or(format!("{} must fail", n["label"]))?;
            let code = err.format().map(ucrypt_format::FormatError::exit_code);
            if code != Some(2) {
                return Err(format!("{}: exit code {code:?}, expected 2", n["label"]));
            }
        }
    }
    Ok(format!("ok, {} target(s), sha256 {got}", lines.len()))
}

#[test]
fn bitlocker_and_filevault2_images_open_with_the_suites_plaintext() {
    let Some(base) = base() else { return };
    let exp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(base.join("expectations.json")).unwrap())
            .unwrap();
    let dir = tempfile::tempdir().unwrap();
    for a in ["bitlk-images.tar.xz", "fvault2-images.tar.xz"] {
        let st = Command::new("tar")
            .arg("xJSf")
            .arg(base.join(a))
            .arg("-C")
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(st.success(), "unpacking {a}");
    }
    let (mut ok, mut failures) = (0, Vec::new());
    for e in exp["entries"].as_array().unwrap() {
        if !matches!(e["format"].as_str(), Some("bitlk" | "fvault2")) {
            continue;
        }
        match check(e, dir.path()) {
            Ok(what) => {
                eprintln!("{}: {what}", e["id"]);
                ok += 1;
            }
            Err(why) => failures.push(format!("{}: {why}", e["id"])),
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(ok, 22, "21 BitLocker images and 1 FileVault2 image");
}

fn ucrypt_bin(args: &[&str], stdin: &[u8]) -> std::process::Output {
    run_with_stdin(env!("CARGO_BIN_EXE_ucrypt"), args, stdin)
}

/// Runs `program` with `stdin` fed to it and its output collected.
fn run_with_stdin(program: &str, args: &[&str], stdin: &[u8]) -> std::process::Output {
    use std::io::Write;
    let mut c = Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(stdin).unwrap();
    c.wait_with_output().unwrap()
}

/// `bitlkDump`, `fvault2Dump --dump-volume-key`, `luksOpen --type bitlk --print-table`,
/// `tcryptDump` on a non-TCRYPT image (exit 2) and `benchmark --pbkdf` through the binary.
#[test]
fn dump_commands_print_cryptsetups_fields_and_the_pbkdf_benchmark_runs() {
    let Some(base) = base() else { return };
    let dir = tempfile::tempdir().unwrap();
    for a in ["bitlk-images.tar.xz", "fvault2-images.tar.xz"] {
        let st = Command::new("tar")
            .arg("xJSf")
            .arg(base.join(a))
            .arg("-C")
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(st.success());
    }
    let bitlk = dir.path().join("bitlk-images/bitlk-aes-cbc-128-4k.img");
    let out = ucrypt_bin(&["bitlkDump", bitlk.to_str().unwrap()], b"");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(text.contains("e6c131e8-3875-4833-af6b-7807e8eff324") && text.contains("cbc-eboiv"));
    let out = ucrypt_bin(
        &[
            "luksOpen",
            "--type",
            "bitlk",
            "--print-table",
            "--key-file",
            "-",
            bitlk.to_str().unwrap(),
        ],
        b"anaconda",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(text.lines().count() >= 9, "{text}");
    assert!(text.contains(" zero") && text.contains("sector_size:4096 iv_large_sectors"));
    let fv = dir.path().join("fvault2-images/small");
    let out = ucrypt_bin(
        &[
            "fvault2Dump",
            "--dump-volume-key",
            "-q",
            "--key-file",
            "-",
            fv.to_str().unwrap(),
        ],
        b"heslo123",
    );
    let ours = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(ours.contains(
        "Volume key:       \t20 73 4d 33 89 21 27 74 d7 61 0c 29 d7 32 88 09 16 f3 be 14 c4 b1 2a \
         c7 aa f0 7e 5c cc 77 b3 19 \n"
    ));
    // Byte for byte what cryptsetup prints (scripts parse it), for FileVault2 and BitLocker
    // (a 128-bit and a 512-bit key: one and four "MK dump" lines).
    let theirs = |args: &[&str], pass: &[u8]| {
        String::from_utf8(run_with_stdin("cryptsetup", args, pass).stdout).unwrap()
    };
    let fv_args = [
        "fvault2Dump",
        "--dump-volume-key",
        "-q",
        "--key-file",
        "-",
        fv.to_str().unwrap(),
    ];
    assert_eq!(ours, theirs(&fv_args, b"heslo123"));
    for img in ["bitlk-aes-cbc-128.img", "bitlk-aes-xts-256.img"] {
        let p = dir.path().join("bitlk-images").join(img);
        let args = [
            "bitlkDump",
            "--dump-volume-key",
            "-q",
            "--key-file",
            "-",
            p.to_str().unwrap(),
        ];
        let ours = ucrypt_bin(&args, b"anaconda");
        assert!(ours.status.success(), "{ours:?}");
        let ours = String::from_utf8_lossy(&ours.stdout).to_string();
        assert!(ours.contains("MK dump:\t"), "{ours}");
        assert_eq!(ours, theirs(&args, b"anaconda"), "{img}");
    }
    let out = ucrypt_bin(
        &[
            "fvault2Dump",
            "--dump-volume-key",
            "-q",
            "--key-file",
            "-",
            fv.to_str().unwrap(),
        ],
        b"wrongpass",
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    // `open` without --type recognises BitLocker and FileVault2 signatures (and keeps
    // refuses anything else with exit 1, naming --type tcrypt/plain); a clear-key-only
    // BitLocker volume opens with an empty passphrase.
    let size_of = |img: &Path, pass: &[u8]| {
        let out = ucrypt_bin(
            &[
                "open",
                img.to_str().unwrap(),
                "--read-only",
                "--key-file",
                "-",
                "--run",
                "nbdinfo --size \"$uri\"",
            ],
            pass,
        );
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    if ucrypt_testkit::require("nbdinfo") {
        assert_eq!(size_of(&fv, b"heslo123"), "167772160");
        let unicode = dir
            .path()
            .join("bitlk-images/bitlk-aes-xts-128-unicode.img");
        assert_eq!(size_of(&unicode, "anaconda\u{a3}".as_bytes()), "105906176");
        let clear = dir
            .path()
            .join("bitlk-images/bitlk-aes-xts-128-clearkey-only.img");
        assert_eq!(size_of(&clear, b""), "104857600");
    }
    let plain = dir.path().join("zeros.img");
    std::fs::write(&plain, vec![0u8; 1 << 20]).unwrap();
    let out = ucrypt_bin(&["open", plain.to_str().unwrap(), "--key-file", "-"], b"x");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    // Refused before any passphrase is read, with the fix named.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is not a LUKS, BitLocker or FileVault2 volume")
            && err.contains("--type tcrypt"),
        "{err}"
    );
    // Not a TrueCrypt volume: no header decrypts (exit 2, as a wrong passphrase).
    let out = ucrypt_bin(
        &[
            "tcryptDump",
            "--hash",
            "sha512",
            "-c",
            "aes",
            fv.to_str().unwrap(),
        ],
        b"",
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = ucrypt_bin(
        &[
            "benchmark",
            "--pbkdf",
            "pbkdf2",
            "--hash",
            "sha256",
            "--seconds",
            "0.1",
        ],
        b"",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("PBKDF2-sha256"),
        "{text}"
    );
    assert!(
        !text.contains("aes-xts"),
        "--pbkdf alone prints no cipher rows: {text}"
    );
}

/// `luksFormat --wipe`: the data area holds encrypted zeros (reads back as zeros through
/// ucrypt, is not all zeros on disk), and cryptsetup accepts the header.
#[test]
fn luks_format_wipe_fills_the_data_area_with_encrypted_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("w.img");
    std::fs::write(&img, vec![0xabu8; 20 << 20]).unwrap();
    let out = ucrypt_bin(
        &[
            "luksFormat",
            "-q",
            "--wipe",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            "-",
            img.to_str().unwrap(),
        ],
        b"wipe me",
    );
    assert!(out.status.success(), "{out:?}");
    let u = ucrypt::unlock(&img, b"wipe me", &opts(VolumeType::Luks)).unwrap();
    let data_offset = u.first_line().offset * 512;
    let v = ucrypt::open_unlocked(u, OpenOptions::default()).unwrap();
    let mut plain = vec![1u8; v.info().size_bytes as usize];
    v.read_at(&mut plain, 0).unwrap();
    assert!(plain.iter().all(|&b| b == 0), "plaintext is zeros");
    let raw = std::fs::read(&img).unwrap();
    let data = &raw[data_offset as usize..];
    assert!(!data.windows(16).any(|w| w == [0xab; 16]), "old bytes gone");
    assert!(data.iter().filter(|&&b| b == 0).count() < data.len() / 100);
    if ucrypt_testkit::require("cryptsetup") {
        let ok = Command::new("cryptsetup")
            .args(["isLuks", img.to_str().unwrap()])
            .status()
            .map(|s| s.success());
        assert!(ok.unwrap(), "cryptsetup isLuks");
    }
}
