//! Wrong data must be impossible by construction (issue 18, point 0), against volumes made
//! by independent tools on the real kernel (`testdata/wrongdata/make-images.sh`, run in the
//! kernel lab; the images and `expected.txt` are committed):
//!
//! - TrueCrypt cipher cascades made by `tcplay`, with a known pattern written through
//!   tcplay's own kernel mapping and read back through cryptsetup's: `luksOpen
//!   --print-table` (one device per layer) fed to `read --table-file -` must give exactly
//!   what `open DEV --type tcrypt` serves, and the pattern. Before the fix, `read` used the
//!   first line only: one layer of decryption, exit 0.
//! - LUKS2 headers made by `cryptsetup luksFormat --integrity` (dm-integrity tags
//!   interleaved with the data) must be refused by `--print-table` and `open`, naming the
//!   feature, before any data is served (a header with an unfinished reencryption, refused
//!   until issue 16, is now served as cryptsetup maps it), while
//!   `--test-passphrase` (which maps nothing) still checks the passphrase as cryptsetup does.
#![allow(clippy::unwrap_used)]

mod common;

use common::ucrypt;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

const PASS: &[u8] = b"ucrypt-wrongdata";

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/wrongdata")
}

/// The 64 KiB every image had written through a kernel mapping (see make-images.sh).
fn pattern() -> Vec<u8> {
    let p: Vec<u8> = (0..2048)
        .flat_map(|i| Sha256::digest(format!("ucrypt-wrongdata-{i}").as_bytes()).to_vec())
        .collect();
    let want = std::fs::read_to_string(data_dir().join("expected.txt")).unwrap();
    assert!(
        want.contains(&format!(
            "pattern_sha256 {}",
            hex::encode(Sha256::digest(&p))
        )),
        "the pattern differs from the one make-images.sh wrote"
    );
    p
}

/// Decompresses `name.img.xz` into `dir`.
fn image(dir: &Path, name: &str) -> PathBuf {
    image_file(dir, &format!("{name}.img.xz"))
}

/// Decompresses `testdata/wrongdata/<file>` (an `.xz`) into `dir`.
fn image_file(dir: &Path, file: &str) -> PathBuf {
    let out = dir.join(file.trim_end_matches(".xz"));
    let xz = std::process::Command::new("xz")
        .arg("-dc")
        .arg(data_dir().join(file))
        .output()
        .unwrap();
    assert!(xz.status.success(), "xz -dc {file}");
    std::fs::write(&out, xz.stdout).unwrap();
    out
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// What `ucrypt open DEV --type tcrypt` serves, copied out by nbdcopy.
fn served_by_open(dir: &Path, img: &Path) -> Vec<u8> {
    let out = dir.join("served.bin");
    let _ = std::fs::remove_file(&out);
    let run = format!("nbdcopy \"$uri\" {}", out.display());
    common::ok(ucrypt(
        &[
            "open",
            s(img),
            "--type",
            "tcrypt",
            "--read-only",
            "--run",
            &run,
        ],
        PASS,
    ));
    std::fs::read(&out).unwrap()
}

#[test]
fn tcplay_cascades_print_table_round_trips_to_what_tcplay_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let pattern = pattern();
    for (name, layers) in [("tc-cascade3", 3), ("tc-cascade2", 2)] {
        let img = image(dir.path(), name);
        let table = common::ok(ucrypt(
            &[
                "luksOpen",
                s(&img),
                "vol",
                "--type",
                "tcrypt",
                "--print-table",
                "--showkeys",
            ],
            PASS,
        ));
        let text = String::from_utf8(table.clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), layers, "{name}: one device per layer:\n{text}");
        // cryptsetup's names: vol_N on the image, each layer on the one below, vol on top.
        assert!(
            lines[0].starts_with(&format!("vol_{}: ", layers - 1)),
            "{text}"
        );
        assert!(lines[layers - 1].starts_with("vol: "), "{text}");
        assert!(lines[layers - 1].contains(" /dev/mapper/vol_1 0"), "{text}");

        // The whole table, three ways in: stdin, a file, --table.
        let stdin = common::ok(ucrypt(&["read", "--table-file", "-"], &table));
        let file = dir.path().join(format!("{name}.table"));
        std::fs::write(&file, &table).unwrap();
        let from_file = common::ok(ucrypt(&["read", "--table-file", s(&file)], b""));
        let from_arg = common::ok(ucrypt(&["read", "--table", &text], b""));
        assert_eq!(stdin.len(), 1536 * 512, "{name}: the data area");
        assert!(
            stdin == from_file && stdin == from_arg,
            "{name}: inputs disagree"
        );
        // What tcplay wrote through its kernel mapping (cryptsetup read it back there).
        assert!(
            stdin[..pattern.len()] == pattern[..],
            "{name}: not the plaintext tcplay wrote"
        );
        // The same bytes as `open --type tcrypt` serves.
        assert!(
            served_by_open(dir.path(), &img) == stdin,
            "{name}: open and read disagree"
        );
        // ... and as `open --table-file` serves (the NBD export of the same table).
        let out = dir.path().join("served-table.bin");
        let run = format!("nbdcopy \"$uri\" {}", out.display());
        common::ok(ucrypt(
            &[
                "open",
                "--table-file",
                s(&file),
                "--read-only",
                "--run",
                &run,
            ],
            b"",
        ));
        assert!(
            std::fs::read(&out).unwrap() == stdin,
            "{name}: open --table-file"
        );

        // The old defect: the first line alone is one layer of the cascade, not the data.
        let first = lines[0].split_once(": ").unwrap().1;
        let one = common::ok(ucrypt(&["read", "--table", first], b""));
        assert!(
            one[..pattern.len()] != pattern[..],
            "{name}: one layer must not decrypt"
        );

        // Writes go through every layer: what `write` puts in, `open` serves.
        let new: Vec<u8> = (0..8192u32).map(|i| (i * 13 % 256) as u8).collect();
        let input = dir.path().join("new.bin");
        std::fs::write(&input, &new).unwrap();
        common::ok(ucrypt(
            &[
                "write",
                "--table-file",
                s(&file),
                "--offset",
                "65536",
                "--input",
                s(&input),
            ],
            b"",
        ));
        let after = served_by_open(dir.path(), &img);
        assert!(
            after[65536..65536 + 8192] == new[..],
            "{name}: write through the stack"
        );
        assert!(
            after[..pattern.len()] == pattern[..],
            "{name}: write spilled"
        );
    }
}

/// A multi-line table must be read whole or refused: a gap, an overlap, an unknown target
/// type or an unused device is an error naming the rule, never a silently shorter mapping.
#[test]
fn malformed_multi_line_tables_are_refused_with_the_rule() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("d.img");
    std::fs::write(&img, vec![0u8; 64 * 512]).unwrap();
    let k = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    let line = |start: u64, len: u64, dev: &str| {
        format!("{start} {len} crypt aes-xts-plain64 {k} {start} {dev} {start}")
    };
    let d = s(&img);
    let rows = [
        (
            format!("{}\n{}", line(0, 8, d), line(16, 8, d)),
            "without gaps or overlaps",
        ),
        (
            format!("{}\n{}", line(0, 8, d), line(4, 8, d)),
            "without gaps or overlaps",
        ),
        (
            format!("{}\n8 8 striped 2 8 {d} 0 {d} 8", line(0, 8, d)),
            "\"striped\" is not supported",
        ),
        (
            format!("a: {}\nb: {}", line(0, 8, d), line(0, 8, d)),
            "only one can be served",
        ),
        (format!("a: {}\n{}", line(0, 8, d), line(0, 8, d)), "mixed"),
    ];
    for (text, want) in rows {
        for cmd in ["read", "write", "table"] {
            let o = ucrypt(&[cmd, "--table-file", "-"], text.as_bytes());
            let e = stderr(&o);
            assert_eq!(o.status.code(), Some(1), "{cmd} {text:?}: {e}");
            assert!(e.contains(want), "{cmd} {text:?}: {e}");
            assert!(!e.contains(k), "key in the error: {e}");
            assert!(o.stdout.is_empty(), "{cmd} {text:?} wrote output");
        }
    }
    // Two targets of one device are one mapping of their summed length, as dmsetup makes.
    let two = format!("{}\n{}", line(0, 8, d), line(8, 8, d));
    let out = common::ok(ucrypt(&["read", "--table-file", "-"], two.as_bytes()));
    let one = common::ok(ucrypt(&["read", "--table", &line(0, 16, d)], b""));
    assert!(
        out == one,
        "two targets differ from the one line they split"
    );
}

/// LUKS2 headers that once were refused: an unfinished reencryption and integrity volumes
/// map as cryptsetup maps them, the passphrase check alone still works; a header with
/// requirements no tool knows is refused before any data.
#[test]
fn luks2_reencryption_integrity_and_unknown_requirement_headers() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, PASS).unwrap();
    // A header with an unfinished online reencryption (no kernel needed to make it).
    let re2 = dir.path().join("luks2-reencrypt.img");
    std::fs::write(&re2, vec![0u8; 8 << 20]).unwrap();
    let cs = |args: &[&str]| {
        let o = std::process::Command::new("cryptsetup")
            .args(args)
            .args(["-q", "--key-file", s(&key), "--pbkdf", "pbkdf2"])
            .args(["--pbkdf-force-iterations", "1000", s(&re2)])
            .output()
            .unwrap();
        assert!(o.status.success(), "cryptsetup {args:?}: {}", stderr(&o));
    };
    cs(&[
        "luksFormat",
        "--type",
        "luks2",
        "--luks2-metadata-size",
        "16k",
    ]);
    let before = ucrypt(
        &[
            "luksOpen",
            s(&re2),
            "--print-table",
            "--showkeys",
            "-d",
            s(&key),
        ],
        b"",
    );
    assert!(before.status.success(), "{}", stderr(&before));
    cs(&["reencrypt", "--init-only", "--resilience", "none"]);
    // Since issue 16 a volume in reencryption is served as cryptsetup maps it: nothing is
    // done yet, so exactly the old mapping (the reencryption tests cover the rest).
    let after = ucrypt(
        &[
            "luksOpen",
            s(&re2),
            "--print-table",
            "--showkeys",
            "-d",
            s(&key),
        ],
        b"",
    );
    assert!(after.status.success(), "{}", stderr(&after));
    assert_eq!(after.stdout, before.stdout);
    // LUKS2 volumes with integrity (made with --integrity-no-wipe, so no tag is valid
    // yet) are mapped as cryptsetup maps them: dm-integrity below dm-crypt's AEAD, the
    // volume key split into the cipher's key and the HMAC key.
    let rows = [
        (
            "luks2-hmac-512",
            "capi:authenc(hmac(sha256),xts(aes))-plain64 <key:96-bytes>",
            " 32 J ",
            "integrity:32:aead",
        ),
        (
            "luks2-hmac-256",
            "capi:authenc(hmac(sha256),xts(aes))-plain64 <key:64-bytes>",
            " 32 J ",
            "integrity:32:aead",
        ),
        (
            "luks2-aead-gcm",
            "capi:gcm(aes)-random <key:32-bytes>",
            " 28 J ",
            "integrity:28:aead",
        ),
    ];
    for (name, cipher, tag, crypt_tag) in rows {
        let img = image(dir.path(), name);
        let k = s(&key);
        let o = ucrypt(&["luksOpen", s(&img), "--print-table", "-d", k], b"");
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{name}: two tables: {out}");
        assert!(
            lines[0].contains(" integrity ") && lines[0].contains(tag),
            "{name}: {out}"
        );
        assert!(
            lines[1].contains(" crypt ") && lines[1].contains(cipher),
            "{name}: {out}"
        );
        assert!(lines[1].contains(crypt_tag), "{name}: {out}");
        // --test-passphrase maps nothing: the right passphrase passes, a wrong one fails.
        let o = ucrypt(&["open", s(&img), "--test-passphrase", "-d", k], b"");
        assert!(
            o.status.success(),
            "{name}: open --test-passphrase: {}",
            stderr(&o)
        );
        let wrong = dir.path().join("wrong");
        std::fs::write(&wrong, b"not it").unwrap();
        let o = ucrypt(
            &["luksOpen", s(&img), "--test-passphrase", "-d", s(&wrong)],
            b"",
        );
        assert_eq!(o.status.code(), Some(2), "{name}: wrong passphrase");
    }
    // cryptsetup's suite image with requirements no tool knows ("req0", "req1").
    let suite =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/peer-tests/cryptsetup");
    let st = std::process::Command::new("tar")
        .arg("xJSf")
        .arg(suite.join("luks2_header_requirements.tar.xz"))
        .arg("-C")
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(st.success());
    let img = dir.path().join("luks2_header_requirements");
    let pass = dir.path().join("suite-pass");
    std::fs::write(&pass, b"blablabl").unwrap();
    let o = ucrypt(&["luksOpen", s(&img), "--print-table", "-d", s(&pass)], b"");
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains("config.requirements.mandatory: [\"req0\", \"req1\"]"),
        "{e}"
    );
    assert!(!e.contains("reencrypt"), "not a reencryption: {e}");
    let o = ucrypt(
        &["luksOpen", s(&img), "--test-passphrase", "-d", s(&pass)],
        b"",
    );
    assert!(
        o.status.success(),
        "suite: passphrase verification is allowed: {}",
        stderr(&o)
    );

    // The control made the same way without --integrity maps, and gives what the kernel's
    // dm-crypt wrote.
    let img = image(dir.path(), "luks2-plain");
    let table = common::ok(ucrypt(
        &[
            "luksOpen",
            s(&img),
            "--print-table",
            "--showkeys",
            "-d",
            s(&key),
        ],
        b"",
    ));
    let out = common::ok(ucrypt(&["read", "--table-file", "-"], &table));
    let pattern = pattern();
    assert!(
        out[..pattern.len()] == pattern[..],
        "luks2-plain: not the kernel's plaintext"
    );
}

/// Replaces the key field of a crypt line with `<keyring>` (the kernel's view of a LUKS2
/// key held in its keyring: its bytes are not in the table).
fn keyring_key(line: &str) -> String {
    let mut f: Vec<&str> = line.split_whitespace().collect();
    if f.len() > 4 && f[2] == "crypt" {
        f[4] = "<keyring>";
    }
    f.join(" ")
}

/// The field audit against the kernel: for every volume cryptsetup formatted and opened in
/// the kernel lab (plain mode with every option, LUKS1 and LUKS2 headers with their cipher,
/// key size, payload offset, sector size, detached header, discards) and every suite image
/// (BitLocker multi-target layouts, TrueCrypt/VeraCrypt single ciphers and cascades, LRW),
/// ucrypt's `--print-table --showkeys` is the table cryptsetup loaded into the kernel
/// (`testdata/wrongdata/kernel-tables.jsonl`, made by `make-kernel-tables.py`): same targets,
/// cipher, key (where the kernel table shows it), IV offset, device offset, length and
/// optional parameters; cascades as the same stack of named devices. Volumes are made again
/// here by the same cryptsetup with the same arguments (the table depends only on them).
#[test]
fn print_table_is_the_table_cryptsetup_gives_the_kernel() {
    let rows: Vec<serde_json::Value> =
        std::fs::read_to_string(data_dir().join("kernel-tables.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, PASS).unwrap();
    let rawkey = dir.path().join("rawkey");
    std::fs::write(&rawkey, (0..64u8).collect::<Vec<u8>>()).unwrap();
    let suite =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/peer-tests/cryptsetup");
    let mut extracted = std::collections::HashSet::new();
    let mut checked = 0;
    for row in &rows {
        let id = row["id"].as_str().unwrap();
        let Some(kernel) = row["tables"].as_object() else {
            panic!(
                "{id}: the kernel refused it in the lab: {}",
                row["kernel_error"]
            );
        };
        let name = row["name"].as_str().unwrap();
        let open: Vec<String> = row["open"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| match a.as_str().unwrap() {
                "<key>" => s(&key).to_string(),
                "<rawkey>" => s(&rawkey).to_string(),
                a => a.to_string(),
            })
            .collect();
        if open.iter().any(|a| a.starts_with("--perf-")) {
            // cryptsetup's one-off --perf-* flags have no luksOpen equivalent in ucrypt
            // (`open --perf-*` sets them; they do not change a byte of data).
            continue;
        }
        let mut args: Vec<String> = vec!["luksOpen".into()];
        let mut stdin = Vec::new();
        let img;
        if let Some(image) = row["suite"].as_str() {
            let archive = row["archive"].as_str().unwrap();
            if extracted.insert(archive.to_string()) {
                let st = std::process::Command::new("tar")
                    .arg("xJSf")
                    .arg(suite.join(archive))
                    .arg("-C")
                    .arg(dir.path())
                    .status()
                    .unwrap();
                assert!(st.success(), "extracting {archive}");
            }
            img = dir.path().join(image);
            stdin = row["passphrase"].as_str().unwrap().as_bytes().to_vec();
            args.extend(open.iter().filter(|a| *a != "--readonly").cloned());
        } else {
            img = dir.path().join(format!("{id}.img"));
            let f = std::fs::File::create(&img).unwrap();
            f.set_len(row["mib"].as_u64().unwrap() << 20).unwrap();
            if let Some(h) = row["header_file"].as_str() {
                // A header kept from the lab (its persistent flags cannot be set without
                // the kernel), opened as a detached header over a data file of the size.
                let hdr = image_file(dir.path(), h);
                args.extend(["--header".to_string(), s(&hdr).to_string()]);
            }
            let mut fmt_args: Vec<String> = Vec::new();
            if let Some(fmt) = row["format"].as_array() {
                let hdr = dir.path().join(format!("{id}.hdr"));
                for a in fmt {
                    fmt_args.push(match a.as_str().unwrap() {
                        "<hdr>" => {
                            let f = std::fs::File::create(&hdr).unwrap();
                            f.set_len(16 << 20).unwrap();
                            s(&hdr).to_string()
                        }
                        a => a.to_string(),
                    });
                }
                let o = std::process::Command::new("cryptsetup")
                    .args(["luksFormat", "-q", "--pbkdf", "pbkdf2"])
                    .args(["--pbkdf-force-iterations", "1000", "--key-file", s(&key)])
                    .args(&fmt_args)
                    .arg(&img)
                    .output()
                    .unwrap();
                if !o.status.success() && stderr(&o).contains("Cannot initialize device-mapper") {
                    // Twofish/Serpent keyslots: this host's libcryptsetup can only encrypt
                    // them through the kernel's dm-crypt, which the host lacks. The lab row
                    // stays as the kernel's record; TCRYPT cascades cover these ciphers here.
                    eprintln!("SKIP {id}: luksFormat needs device-mapper on this host");
                    continue;
                }
                assert!(o.status.success(), "{id}: luksFormat: {}", stderr(&o));
                if fmt_args.iter().any(|a| a == "--header") {
                    args.extend(["--header".to_string(), s(&hdr).to_string()]);
                }
            }
            if open.iter().any(|a| a == "-") {
                stdin = PASS.to_vec();
            }
            args.extend(open.iter().cloned());
        }
        args.extend([
            s(&img).to_string(),
            name.to_string(),
            "--print-table".into(),
            "--showkeys".into(),
        ]);
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = String::from_utf8(common::ok(ucrypt(&argv, &stdin))).unwrap();
        // ucrypt's table: device name -> lines (one unnamed device is the kernel's `name`).
        let mut ours: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for line in out.lines() {
            let line = line.replace(s(&img), "<dev>");
            let (dev, body) = match line.split_once(": ") {
                Some((n, b)) if !n.contains(' ') => (n.to_string(), b.to_string()),
                _ => (name.to_string(), line.clone()),
            };
            ours.entry(dev).or_default().push(body);
        }
        let theirs: std::collections::BTreeMap<String, Vec<String>> = kernel
            .iter()
            .map(|(n, lines)| {
                let lines = lines
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|l| l.as_str().unwrap().to_string());
                (n.clone(), lines.collect())
            })
            .collect();
        // A LUKS volume made again here has a new random volume key, and the kernel holds a
        // LUKS2 key in its keyring: compare everything but the key there. Plain-mode keys
        // (from the passphrase or key file) and suite images' keys are compared.
        let fresh_key = row["format"].is_array();
        let mut theirs = theirs;
        for (n, lines) in &mut ours {
            let Some(k) = theirs.get_mut(n) else { continue };
            for (l, kl) in lines.iter_mut().zip(k.iter_mut()) {
                if fresh_key || kl.split_whitespace().nth(4) == Some("<keyring>") {
                    *l = keyring_key(l);
                    *kl = keyring_key(kl);
                }
            }
        }
        assert_eq!(
            ours, theirs,
            "{id}: ucrypt's table differs from the kernel's"
        );
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} rows checked");
}

/// dm-crypt's data-neutral flags (where the work runs, not what it computes) are honoured as
/// engine settings and change no byte: the same table with each flag reads and writes the
/// same bytes as without it (the kernel golden vectors check the same for the kernel's own
/// `no_read_workqueue`/`same_cpu_crypt`... cases; `sector_size` and `iv_large_sectors`, which
/// do change the data, are checked against kernel ciphertext there).
#[test]
fn data_neutral_table_flags_change_no_byte() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("d.img");
    let data: Vec<u8> = (0..256 * 512u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&img, &data).unwrap();
    let k = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    let base = format!("0 256 crypt aes-xts-plain64 {k} 0 {} 0", s(&img));
    let read = |line: &str| common::ok(ucrypt(&["read", "--table", line], b""));
    for flag in [
        "allow_discards",
        "same_cpu_crypt",
        "submit_from_crypt_cpus",
        "no_read_workqueue",
        "no_write_workqueue",
        "high_priority",
    ] {
        let line = format!("{base} 1 {flag}");
        let plain = read(&base);
        assert!(read(&line) == plain, "{flag} changed the plaintext");
        // A write through the flagged table is read back the same without it.
        let chunk: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 256) as u8).collect();
        let input = dir.path().join("chunk");
        std::fs::write(&input, &chunk).unwrap();
        common::ok(ucrypt(
            &[
                "write",
                "--table",
                &line,
                "--offset",
                "8192",
                "--input",
                s(&input),
            ],
            b"",
        ));
        assert!(read(&base)[8192..8192 + 4096] == chunk[..], "{flag}: write");
    }
}
