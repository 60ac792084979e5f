//! TrueCrypt/VeraCrypt images of cryptsetup's own test suite
//! (`testdata/peer-tests/cryptsetup/tcrypt-images.tar.xz` with `expectations.json`): each
//! header decrypts in ucrypt's own Rust code (KDF, cipher chain, key files, PIM, hidden
//! and system headers), and the mapped volume shows the FAT filesystem serial the suite
//! expects (`DEAD-BABE`, hidden volumes `CAFE-BABE`), through stacked volumes for
//! cascades. Legacy CBC cascades and Blowfish (`cbci-tcrypt`, `cbc-tcrypt`), which
//! cryptsetup cannot map, are served too; but the suite wiped the data area of those 10
//! images (only their headers survive, all zeros after them), so for them the test checks
//! that they open and that the wiped area is indeed zeros on disk: their data path is checked
//! against TrueCrypt 4.3a's own code instead (`ucrypt-format`'s
//! `legacy_cbc_layers_match_truecrypt_4_3a`, `testdata/truecrypt-cbc/`). Wrong passphrases,
//! unknown hash/cipher hints and TrueCrypt-only mode on VeraCrypt images must fail.
//!
//! The suite's hash/cipher hints are passed, as the suite does, to keep the KDF work small;
//! `search_without_hints_finds_the_kdf` covers the full search.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use ucrypt::{HeaderOptions, OpenOptions, VolumeType};
use ucrypt_backend::Backend;
use ucrypt_format::tcrypt::TcryptOptions;

/// cryptsetup's test-suite images (`testdata/peer-tests/cryptsetup`), by the workspace's
/// skip rule.
fn base() -> Option<PathBuf> {
    ucrypt_testkit::testdata("peer-tests/cryptsetup", "expectations.json")
}

/// The extracted archive (once per test binary) and the TCRYPT entries.
fn setup() -> Option<&'static (tempfile::TempDir, Vec<serde_json::Value>)> {
    static DATA: OnceLock<Option<(tempfile::TempDir, Vec<serde_json::Value>)>> = OnceLock::new();
    DATA.get_or_init(|| {
        let b = base()?;
        let dir = tempfile::tempdir().unwrap();
        let st = std::process::Command::new("tar")
            .arg("xJSf")
            .arg(b.join("tcrypt-images.tar.xz"))
            .arg("-C")
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(st.success(), "extracting tcrypt-images.tar.xz");
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(b.join("expectations.json")).unwrap()).unwrap();
        let entries = v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["format"] == "tcrypt")
            .cloned()
            .collect();
        Some((dir, entries))
    })
    .as_ref()
}

/// Header options and passphrase of a case (the entry or one of its extra cases).
fn opts_of(
    c: &serde_json::Value,
    entry: &serde_json::Value,
    dir: &Path,
) -> (HeaderOptions, Vec<u8>) {
    let o = &c["options"];
    let key_files = c["key_files"]
        .as_array()
        .or(entry["key_files"].as_array())
        .map(|a| a.iter().map(|f| dir.join(f.as_str().unwrap())).collect())
        .unwrap_or_default();
    let pim = c["pim"]
        .as_u64()
        .or(entry["pim"].as_u64())
        .map(|p| p as u32);
    let h = HeaderOptions {
        kind: VolumeType::Tcrypt,
        tcrypt: TcryptOptions {
            veracrypt: o["veracrypt"].as_bool().unwrap_or(true),
            pim,
            hidden: o["tcrypt_hidden"].as_bool().unwrap_or(false),
            system: o["tcrypt_system"].as_bool().unwrap_or(false),
            backup: false,
            hash: o["hash"].as_str().map(String::from),
            cipher: o["cipher"].as_str().map(String::from),
            key_files,
            ..TcryptOptions::default()
        },
        ..HeaderOptions::default()
    };
    let pass = c["passphrase"].as_str().unwrap_or("").as_bytes().to_vec();
    (h, pass)
}

/// The FAT volume serial as blkid prints it (`DEAD-BABE`), if `boot` is a FAT boot sector.
fn fat_serial(boot: &[u8]) -> Option<String> {
    if boot.len() < 512 || boot[510..512] != [0x55, 0xaa] {
        return None;
    }
    let at = if &boot[0x52..0x57] == b"FAT32" {
        0x43
    } else if &boot[0x36..0x39] == b"FAT" {
        0x27
    } else {
        return None;
    };
    let s = u32::from_le_bytes(boot[at..at + 4].try_into().unwrap());
    Some(format!("{:04X}-{:04X}", s >> 16, s & 0xffff))
}

enum Outcome {
    /// Opened and the filesystem matched.
    Opened,
    /// A legacy CBC cascade/Blowfish image opened, but the suite zeroed its data area on
    /// disk, so there is no filesystem to see.
    OpenedDataWiped,
}

fn check(
    c: &serde_json::Value,
    entry: &serde_json::Value,
    dir: &Path,
    want_uuid: Option<&str>,
) -> Result<Outcome, String> {
    let img = dir.join(entry["image"].as_str().unwrap());
    let (h, pass) = opts_of(c, entry, dir);
    let header = ucrypt::tcrypt::load_header(&img, &pass, &h).map_err(|e| format!("{e:#}"))?;
    let (hdr, _) = header;
    if let Some(w) = c["expected_volume_key_hex"].as_str() {
        if hdr.volume_key().to_hex().as_str() != w {
            return Err("volume key differs from the expected one".into());
        }
    }
    let d = &c["expected_dump"];
    if let Some(g) = d["cipher"].as_str() {
        if hdr.chain.long_name != g {
            return Err(format!("cipher chain {} != {g}", hdr.chain.long_name));
        }
    }
    if let Some(g) = d["cipher_mode"].as_str() {
        if hdr.chain.mode.name() != g {
            return Err(format!("cipher mode {} != {g}", hdr.chain.mode.name()));
        }
    }
    if let Some(g) = d["volume_key_bytes"].as_u64() {
        if hdr.volume_key().len() as u64 != g {
            return Err(format!(
                "volume key bytes {} != {g}",
                hdr.volume_key().len()
            ));
        }
    }
    let u = ucrypt::unlock(&img, &pass, &h).map_err(|e| format!("{e:#}"))?;
    let mode = hdr.chain.mode.name();
    let wiped_legacy = if mode == "cbci-tcrypt" || mode == "cbc-tcrypt" {
        // The first data sector on disk, as stored in the image.
        let raw = std::fs::read(&img).map_err(|e| e.to_string())?;
        let at = usize::try_from(u.info.data_offset * 512).unwrap_or(usize::MAX);
        raw.get(at..at + 512)
            .is_some_and(|s| s.iter().all(|&b| b == 0))
    } else {
        false
    };
    for (field, got) in [
        ("data_offset_sectors", u.info.data_offset),
        ("iv_offset_sectors", u.info.iv_offset),
        ("active_size_sectors", u.first_line().length),
    ] {
        if let Some(w) = d[field].as_u64() {
            if got != w {
                return Err(format!("{field} {got} != {w}"));
            }
        }
    }
    let system_full = h.tcrypt.system && entry["image"].as_str().unwrap().contains("_full");
    let volume = ucrypt::open_unlocked(
        u,
        OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        },
    )
    .map_err(|e| format!("{e:#}"))?;
    // Whole-drive system encryption maps the encrypted area from sector 63; the FAT
    // partition starts at sector 2048 of the drive.
    let at = if system_full { (2048 - 63) * 512 } else { 0 };
    let mut boot = vec![0u8; 512];
    volume
        .read_at(&mut boot, at)
        .map_err(|e| format!("reading the volume: {e}"))?;
    let got = fat_serial(&boot);
    if wiped_legacy && got.is_none() {
        return Ok(Outcome::OpenedDataWiped);
    }
    let want = want_uuid.unwrap_or("DEAD-BABE");
    if got.as_deref() != Some(want) {
        return Err(format!("filesystem serial {got:?}, expected {want}"));
    }
    Ok(Outcome::Opened)
}

#[test]
fn suite_images_open() {
    let Some((tmp, entries)) = setup() else {
        return;
    };
    let dir = tmp.path();
    // (id, case, want uuid)
    let mut cases = Vec::new();
    for (n, e) in entries.iter().enumerate() {
        let id = e["id"].as_str().unwrap().to_string();
        cases.push((
            n,
            id.clone(),
            e.clone(),
            e["expected_fs_uuid"].as_str().map(String::from),
        ));
        for x in e["extra_cases"].as_array().into_iter().flatten() {
            let label = x["label"].as_str().unwrap_or("extra");
            cases.push((
                n,
                format!("{id} [{label}]"),
                x.clone(),
                x["expected_fs_uuid"].as_str().map(String::from),
            ));
        }
    }
    // Workers pop from the end: the costly KDFs (Argon2id, PIM, VeraCrypt) go first.
    let cost = |id: &str| {
        if id.contains("argon2id") || id.contains("vcpim") {
            2
        } else {
            u8::from(id.contains("/vc"))
        }
    };
    let mut queue: Vec<_> = cases.into_iter().enumerate().collect();
    queue.sort_by_key(|(_, c)| cost(&c.1));
    let queue = Mutex::new(queue);
    let results = Mutex::new(Vec::new());
    let heavy = Mutex::new(());
    // One worker more than CPUs: small cases wait on I/O, the KDFs keep the CPUs busy.
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get() + 1);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let Some((i, (n, id, c, want))) = queue.lock().unwrap().pop() else {
                    break;
                };
                // Argon2id cases fill memory bandwidth: one at a time.
                let _heavy = id.contains("argon2id").then(|| heavy.lock().unwrap());
                let started = std::time::Instant::now();
                let r = check(&c, &entries[n], dir, want.as_deref());
                eprintln!("{:>6.2}s {id}", started.elapsed().as_secs_f64());
                results.lock().unwrap().push((i, id, r));
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|r| r.0);
    let (mut opened, mut wiped, mut failed) = (0, 0, Vec::new());
    for (_, id, r) in &results {
        match r {
            Ok(Outcome::Opened) => {
                opened += 1;
                eprintln!("ok      {id}");
            }
            Ok(Outcome::OpenedDataWiped) => {
                wiped += 1;
                eprintln!("wiped   {id}: opened; the suite zeroed its data area");
            }
            Err(e) => {
                eprintln!("FAILED  {id}: {e}");
                failed.push(id.clone());
            }
        }
    }
    eprintln!(
        "TCRYPT suite: {} cases, {opened} opened with the expected filesystem, {wiped} legacy \
         CBC cascade/Blowfish cases opened over a data area the suite zeroed, {} failed",
        results.len(),
        failed.len()
    );
    assert!(failed.is_empty(), "failed: {failed:?}");
    // The 10 wiped images plus the hidden volume inside one of them; no other case may be
    // excused from showing its filesystem.
    assert_eq!(wiped, 11, "cases opened over a wiped data area");
}

#[test]
fn negative_checks_fail() {
    let Some((tmp, entries)) = setup() else {
        return;
    };
    let dir = tmp.path();
    let mut n = 0;
    for e in entries {
        for nc in e["negative_checks"].as_array().into_iter().flatten() {
            let img = dir.join(e["image"].as_str().unwrap());
            let (h, pass) = opts_of(nc, e, dir);
            // A TrueCrypt-only search over a VeraCrypt image must not find it.
            let r = ucrypt::tcrypt::load_header(&img, &pass, &h);
            assert!(r.is_err(), "{} [{}] must fail", e["id"], nc["label"]);
            n += 1;
        }
    }
    eprintln!("{n} negative checks failed as expected");
}

#[test]
fn search_without_hints_finds_the_kdf() {
    let Some((tmp, _)) = setup() else { return };
    // TrueCrypt SHA-512 is third in the search order; no hints at all (every KDF and
    // every cipher chain), as `ucrypt open --type tcrypt` without --hash/--cipher.
    let img = tmp.path().join("tcrypt-images/tc_4-sha512-xts-aes-twofish");
    let h = HeaderOptions {
        kind: VolumeType::Tcrypt,
        tcrypt: TcryptOptions {
            veracrypt: false,
            ..TcryptOptions::default()
        },
        ..HeaderOptions::default()
    };
    let (hdr, _) = ucrypt::tcrypt::load_header(&img, b"aaaaaaaaaaaa", &h).unwrap();
    assert_eq!(hdr.chain.long_name, "twofish-aes");
}

#[test]
fn cli_dump_open_and_wrong_passphrase() {
    let Some((tmp, _)) = setup() else { return };
    let img = tmp.path().join("tcrypt-images/tck_5-sha512-xts-aes");
    let kf1 = tmp.path().join("tcrypt-images/keyfile1");
    let kf2 = tmp.path().join("tcrypt-images/keyfile2");
    let (img, kf1, kf2) = (
        img.to_str().unwrap(),
        kf1.to_str().unwrap(),
        kf2.to_str().unwrap(),
    );
    let out = common::ucrypt(
        &[
            "tcryptDump",
            "--hash",
            "sha512",
            "-d",
            kf1,
            "--tcrypt-keyfile",
            kf2,
            "--dump-volume-key",
            "-q",
            img,
        ],
        b"aaaaaaaaaaaa\n",
    );
    let text = String::from_utf8(common::ok(out)).unwrap();
    assert!(text.contains("TCRYPT header information"), "{text}");
    assert!(text.contains("Cipher chain:\taes\n"), "{text}");
    assert!(text.contains("98 de e6 4a be 44 bb f4"), "{text}");
    // Without the confirmation, no key is shown (non-terminal: refused).
    let out = common::ucrypt(
        &[
            "tcryptDump",
            "--hash",
            "sha512",
            "-d",
            kf1,
            "--tcrypt-keyfile",
            kf2,
            "--dump-volume-key",
            img,
        ],
        b"aaaaaaaaaaaa\n",
    );
    assert!(!out.status.success());
    assert!(!String::from_utf8_lossy(&out.stdout).contains("98 de e6"));
    // A wrong passphrase: exit 2, nothing about the key in the message.
    let out = common::ucrypt(
        &[
            "tcryptDump",
            "--hash",
            "sha512",
            "-d",
            kf1,
            "--tcrypt-keyfile",
            kf2,
            img,
        ],
        b"wrongpassphrase\n",
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no TCRYPT/VeraCrypt header decrypts"), "{err}");
    // The table cryptsetup would load, and a cascade's stacked layers.
    let casc = tmp
        .path()
        .join("tcrypt-images/tc_5-sha512-xts-serpent-twofish-aes");
    let out = common::ucrypt(
        &[
            "luksOpen",
            "--print-table",
            "--type",
            "tcrypt",
            "--hash",
            "sha512",
            casc.to_str().unwrap(),
        ],
        b"aaaaaaaaaaaa\n",
    );
    let text = String::from_utf8(common::ok(out)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[0].contains("serpent-xts-plain64 <key:64-bytes> 256 ") && lines[0].ends_with(" 256"),
        "{text}"
    );
    assert!(lines[2].contains("aes-xts-plain64"), "{text}");
    let one = tmp.path().join("tcrypt-images/vc_1-sha512-xts-aes");
    let out = common::ucrypt(
        &[
            "open",
            "--type",
            "tcrypt",
            "--hash",
            "sha512",
            "--test-passphrase",
            one.to_str().unwrap(),
        ],
        b"wrong\n",
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = common::ucrypt(
        &[
            "open",
            "--type",
            "tcrypt",
            "--hash",
            "sha512",
            "--test-passphrase",
            one.to_str().unwrap(),
        ],
        b"aaaaaaaaaaaa\n",
    );
    common::ok(out);
}

/// `--veracrypt-query-pim`: the PIM is the line after the passphrase (a prompt on a
/// terminal); the same dump as `--veracrypt-pim`; cryptsetup's checks on the value (not a
/// number, 0, more than 32 bits: exit 1), as cryptsetup 2.6.1 answers them.
#[test]
fn veracrypt_query_pim_reads_the_pim_after_the_passphrase() {
    let Some((tmp, _)) = setup() else { return };
    let img = tmp.path().join("tcrypt-images/vcpim_1_1234-sha256-xts-aes");
    let img = img.to_str().unwrap();
    let bin = env!("CARGO_BIN_EXE_ucrypt");
    let hints = ["--hash", "sha256", "--cipher", "aes"];
    let run = |prog: &str, extra: &[&str], stdin: &str| {
        let mut child = std::process::Command::new(prog)
            .args(["tcryptDump", img])
            .args(hints)
            .args(extra)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), stdin.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    };
    let pass = "cccccccccccccccccccc";
    let queried = run(bin, &["--veracrypt-query-pim"], &format!("{pass}\n1234\n"));
    let given = run(bin, &["--veracrypt-pim", "1234"], &format!("{pass}\n"));
    assert!(queried.status.success(), "{queried:?}");
    assert_eq!(queried.stdout, given.stdout);
    for bad in ["abc", "0", "99999999999", ""] {
        let out = run(bin, &["--veracrypt-query-pim"], &format!("{pass}\n{bad}\n"));
        assert_eq!(out.status.code(), Some(1), "{bad}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("invalid PIM value"),
            "{bad}: {out:?}"
        );
        if ucrypt_testkit::require("cryptsetup") {
            let c = run(
                "cryptsetup",
                &["--veracrypt-query-pim"],
                &format!("{pass}\n{bad}\n"),
            );
            assert_eq!(c.status.code(), Some(1), "cryptsetup {bad}: {c:?}");
        }
    }
}
