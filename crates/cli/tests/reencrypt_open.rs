//! `ucrypt open` of a LUKS2 volume in the middle of an encryption or decryption, mapped as
//! cryptsetup maps it (`LUKS2_assembly_multisegment_dmd`): one target per data segment, a
//! crypt target for the encrypted part and a linear target for the plaintext part. For
//! `--encrypt --header` (forward), `--decrypt --header` (backward), `--encrypt
//! --reduce-device-size` (backward with a data shift: the moved copy, the plaintext left,
//! the encrypted part) and `--decrypt --header NEWFILE` of that volume (forward with the
//! data shifted back: the moved encrypted copy, the plaintext done, the encrypted rest),
//! each stopped halfway:
//!
//! - `--print-table` prints one dm line per data segment of the header (checked against
//!   the segments the JSON metadata lists), crypt and linear;
//! - every sector reads back the original plaintext;
//! - writes through the mapping (on both sides of the boundary and across it) land in the
//!   right representation: ciphertext in the encrypted part, plaintext in the linear part
//!   (the device's bytes checked);
//! - the pass is then finished by ucrypt and, on a copy, by cryptsetup 2.6
//!   (`--force-offline-reencrypt`): both give the same data area and the volume (or, after
//!   a decryption, the device) holds the plaintext with the writes;
//! - a pass killed inside a hotzone is refused by a read-only open and recovered by a
//!   read-write one (as the re-keying case), which then serves the plaintext.
#![allow(clippy::unwrap_used)]

mod common;

use common::cmd::{ok, run, s};
use common::{require, Rng};
use std::path::{Path, PathBuf};

const PASS: &[u8] = b"reencrypt open passphrase";
const M: usize = 1 << 20;
const PBKDF: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_ucrypt")
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    /// `--encrypt --header`: forward, the part done first.
    Encrypt,
    /// `--decrypt --header`: backward, the plaintext at the end.
    Decrypt,
    /// `--encrypt --reduce-device-size 8M`: backward, data shifted by 4 MiB.
    Shift,
    /// `--decrypt --header NEWFILE` of a `Shift` volume: forward, data shifted back.
    Unshift,
}

struct Fx {
    dir: tempfile::TempDir,
    key: PathBuf,
}

/// One volume: data device and, for the detached modes, header file.
#[derive(Clone)]
struct Vol {
    mode: Mode,
    dev: PathBuf,
    hdr: Option<PathBuf>,
    /// The plaintext the volume serves (16 MiB).
    plain: Vec<u8>,
}

impl Vol {
    fn header(&self) -> &Path {
        self.hdr.as_deref().unwrap_or(&self.dev)
    }

    /// `--header HDR` for the detached modes.
    fn hdr_args(&self) -> Vec<&str> {
        match &self.hdr {
            Some(h) => vec!["--header", s(h)],
            None => Vec::new(),
        }
    }
}

/// The JSON metadata of a LUKS2 header as cryptsetup reads it (a kill between or inside
/// the two copies' writes leaves one of them stale or torn).
fn json(hdr: &Path) -> serde_json::Value {
    let out = ok("cryptsetup", &["luksDump", "--dump-json-metadata", s(hdr)]);
    serde_json::from_slice(&out.stdout).unwrap()
}

fn num(v: &serde_json::Value) -> u64 {
    match v {
        serde_json::Value::String(t) => t.parse().unwrap(),
        other => other.as_u64().unwrap(),
    }
}

impl Fx {
    fn new() -> Fx {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("pass");
        std::fs::write(&key, PASS).unwrap();
        Fx { dir, key }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn k(&self) -> &str {
        s(&self.key)
    }

    /// A volume of `mode` initialised (`--init-only`) by ucrypt over 16 MiB of random
    /// plaintext.
    fn init(&self, mode: Mode, name: &str, seed: u64) -> Vol {
        let mut plain = vec![0u8; 16 * M];
        Rng::new(seed).fill(&mut plain);
        let dev = self.path(&format!("{name}.dev"));
        let mut image = plain.clone();
        if matches!(mode, Mode::Shift | Mode::Unshift) {
            // 16 MiB of data plus the 8 MiB the header and the moved copy take.
            image.resize(24 * M, 0);
        }
        std::fs::write(&dev, &image).unwrap();
        let hdr = (mode != Mode::Shift).then(|| self.path(&format!("{name}.hdr")));
        let detached = matches!(mode, Mode::Encrypt | Mode::Decrypt);
        let v = Vol {
            mode,
            dev,
            hdr,
            plain,
        };
        let mut args = vec![
            "reencrypt",
            "--encrypt",
            "--init-only",
            "-q",
            "-d",
            self.k(),
        ];
        args.extend_from_slice(&PBKDF);
        if detached {
            args.extend(v.hdr_args());
        } else {
            args.extend_from_slice(&["--reduce-device-size", "8M"]);
        }
        args.extend_from_slice(&["--disable-locks", s(&v.dev)]);
        ok(bin(), &args);
        if mode == Mode::Unshift {
            // Encrypted with the data shift first, then the header goes to NEWFILE.
            let attached = Vol {
                hdr: None,
                mode: Mode::Shift,
                ..v.clone()
            };
            self.resume(&attached, &[]);
            self.init_decrypt(&v, &[]);
        }
        if mode == Mode::Decrypt {
            self.resume(&v, &[]);
            self.init_decrypt(&v, &["--resilience", "checksum"]);
        }
        v
    }

    /// `reencrypt --decrypt --init-only` of the encrypted `v` (its header to `v.hdr`).
    fn init_decrypt(&self, v: &Vol, extra: &[&str]) {
        let mut args = vec![
            "reencrypt",
            "--decrypt",
            "--init-only",
            "-q",
            "-d",
            self.k(),
        ];
        args.extend(v.hdr_args());
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--disable-locks", s(&v.dev)]);
        ok(bin(), &args);
        assert_eq!(json(v.header())["keyslots"]["1"]["mode"], "decrypt");
    }

    fn resume_args<'a>(&'a self, v: &'a Vol) -> Vec<&'a str> {
        let mut args = vec!["reencrypt", "--resume-only", "-q", "-d", self.k()];
        args.extend(v.hdr_args());
        if matches!(v.mode, Mode::Encrypt | Mode::Decrypt) {
            args.extend_from_slice(&["--hotzone-size", "4M"]);
        }
        args.extend_from_slice(&["--disable-locks", s(&v.dev)]);
        args
    }

    fn resume(&self, v: &Vol, extra: &[&str]) {
        let mut args = self.resume_args(v);
        args.extend_from_slice(extra);
        ok(bin(), &args);
    }

    fn copy(&self, v: &Vol, name: &str) -> Vol {
        let mut w = v.clone();
        w.dev = self.path(&format!("{name}.dev"));
        std::fs::copy(&v.dev, &w.dev).unwrap();
        if let Some(h) = &v.hdr {
            let nh = self.path(&format!("{name}.hdr"));
            std::fs::copy(h, &nh).unwrap();
            w.hdr = Some(nh);
        }
        w
    }

    /// `luksOpen --print-table` (keys shown or not).
    fn print_table(&self, v: &Vol, show_keys: bool) -> std::process::Output {
        let mut args = vec!["luksOpen", "--print-table", "-d", self.k()];
        if show_keys {
            args.push("--showkeys");
        }
        args.extend(v.hdr_args());
        args.push(s(&v.dev));
        run(bin(), &args)
    }

    /// The volume's table (keys shown) in a file, for `read`/`write --table-file`.
    fn table(&self, v: &Vol) -> PathBuf {
        let out = self.print_table(v, true);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let t = self.path("table");
        std::fs::write(&t, &out.stdout).unwrap();
        t
    }

    /// The whole volume through its table (16 MiB, or 20 MiB after a data shift).
    fn read(&self, v: &Vol) -> Vec<u8> {
        let t = self.table(v);
        let text = std::fs::read_to_string(&t).unwrap();
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        let size: u64 = targets(&lines).iter().map(|x| x.1).sum();
        ok(
            bin(),
            &["read", "--table-file", s(&t), "--length", &size.to_string()],
        )
        .stdout
    }

    fn write(&self, v: &Vol, offset: usize, data: &[u8]) {
        let t = self.table(v);
        let input = self.path("input");
        std::fs::write(&input, data).unwrap();
        ok(
            bin(),
            &[
                "write",
                "--table-file",
                s(&t),
                "--offset",
                &offset.to_string(),
                "--input",
                s(&input),
            ],
        );
    }
}

/// The table cryptsetup would load for the header's data segments (keys hidden): one line
/// per segment without a `backup-*` flag, in id order, end to end.
fn expected_table(v: &Vol) -> Vec<String> {
    let j = json(v.header());
    let dev_len = std::fs::metadata(&v.dev).unwrap().len();
    let segs = j["segments"].as_object().unwrap();
    let mut ids: Vec<u32> = segs.keys().map(|k| k.parse().unwrap()).collect();
    ids.sort_unstable();
    let mut at = 0u64;
    let mut out = Vec::new();
    for id in ids {
        let seg = &segs[&id.to_string()];
        let flags = seg["flags"].as_array().cloned().unwrap_or_default();
        if flags
            .iter()
            .any(|f| f.as_str().unwrap().starts_with("backup-"))
        {
            continue;
        }
        // cryptsetup's dynamic segment runs to the data area's end, the device's end.
        let len = if seg["size"] == "dynamic" {
            (dev_len - num(&seg["offset"])) / 512
        } else {
            num(&seg["size"]) / 512
        };
        let off = num(&seg["offset"]) / 512;
        let dev = s(&v.dev);
        out.push(match seg["type"].as_str().unwrap() {
            "crypt" => format!(
                "{at} {len} crypt {} <key:64-bytes> {} {dev} {off}",
                seg["encryption"].as_str().unwrap(),
                num(&seg["iv_tweak"])
            ),
            "linear" => format!("{at} {len} linear {dev} {off}"),
            t => panic!("segment type {t}"),
        });
        at += len;
    }
    out
}

/// The device range (byte offset) and kind of each target of the volume's table.
fn targets(lines: &[String]) -> Vec<(u64, u64, bool, u64)> {
    lines
        .iter()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (start, len) = (f[0].parse::<u64>().unwrap(), f[1].parse::<u64>().unwrap());
            let linear = f[2] == "linear";
            let off: u64 = f[if linear { 4 } else { 7 }].parse().unwrap();
            (start * 512, len * 512, linear, off * 512)
        })
        .collect()
}

/// The shape of each mode's table halfway (8 of 16 MiB done).
fn check_shape(v: &Vol, lines: &[String]) {
    let kinds: Vec<&str> = lines
        .iter()
        .map(|l| l.split_whitespace().nth(2).unwrap())
        .collect();
    let want: &[&str] = match v.mode {
        Mode::Encrypt | Mode::Decrypt => &["crypt", "linear"],
        Mode::Shift => &["linear", "linear", "crypt"],
        Mode::Unshift => &["crypt", "linear", "crypt"],
    };
    assert_eq!(kinds, want, "{:?}: {lines:?}", v.mode);
    let t = targets(lines);
    // Once encrypted with the shift, the volume runs to the device's end (20 MiB).
    let size = if v.mode == Mode::Unshift { 20 } else { 16 };
    assert_eq!(t.iter().map(|x| x.1).sum::<u64>(), size * M as u64);
}

/// Writes through the mapping around every target boundary, and checks where the bytes
/// landed: the plaintext itself in a linear target, something else (ciphertext) in a crypt
/// target; returns the plaintext the volume must serve now.
fn write_and_check(f: &Fx, v: &Vol, lines: &[String], seed: u64) -> Vec<u8> {
    let t = targets(lines);
    let mut want = f.read(v);
    assert!(want[..16 * M] == v.plain[..]);
    let mut rng = Rng::new(seed);
    let mut spots = vec![0usize, 16 * M - 4096, 5 * M + 1234];
    for &(start, _, _, _) in &t[1..] {
        let b = start as usize;
        spots.extend_from_slice(&[b - 4096, b - 2048, b, b + 4096]);
    }
    for &at in &spots {
        let mut block = vec![0u8; 4096];
        rng.fill(&mut block);
        f.write(v, at, &block);
        want[at..at + 4096].copy_from_slice(&block);
    }
    assert!(
        f.read(v) == want,
        "{:?}: the writes do not read back",
        v.mode
    );
    let dev = std::fs::read(&v.dev).unwrap();
    for &(start, len, linear, off) in &t {
        let (start, len, off) = (start as usize, len as usize, off as usize);
        let on_dev = &dev[off..off + len];
        let plain = &want[start..start + len];
        if linear {
            assert!(
                on_dev == plain,
                "{:?}: linear part at {start} is not the plaintext",
                v.mode
            );
        } else {
            // Every written 512-byte sector of the crypt part is ciphertext, not the data.
            for &at in &spots {
                for sec in (at..at + 4096).step_by(512) {
                    if sec >= start && sec < start + len {
                        let r = sec - start..sec - start + 512;
                        assert!(
                            on_dev[r.clone()] != plain[r],
                            "{:?}: plaintext written into the encrypted part at {sec}",
                            v.mode
                        );
                    }
                }
            }
        }
    }
    want
}

/// What the finished volume holds in its data area: its plaintext through the table, or,
/// after a decryption, the device itself.
fn finished_plaintext(f: &Fx, v: &Vol) -> Vec<u8> {
    let j = json(v.header());
    assert!(
        !j["config"].to_string().contains("online-reencrypt"),
        "{:?} not finished: {j}",
        v.mode
    );
    match v.mode {
        Mode::Decrypt | Mode::Unshift => std::fs::read(&v.dev).unwrap()[..16 * M].to_vec(),
        _ => f.read(v)[..16 * M].to_vec(),
    }
}

/// The data area's bytes on the device (for comparing two finished runs).
fn data_area(v: &Vol) -> Vec<u8> {
    let dev = std::fs::read(&v.dev).unwrap();
    match v.mode {
        // The data shifted by 4 MiB, after the header.
        Mode::Shift => dev[4 * M..20 * M].to_vec(),
        _ => dev[..16 * M].to_vec(),
    }
}

const MODES: [Mode; 4] = [Mode::Encrypt, Mode::Decrypt, Mode::Shift, Mode::Unshift];

fn cryptsetup_finish(f: &Fx, v: &Vol) {
    let mut args = vec![
        "reencrypt",
        "--resume-only",
        "--force-offline-reencrypt",
        "-q",
        "--key-file",
        f.k(),
    ];
    args.extend(v.hdr_args());
    args.push(s(&v.dev));
    ok("cryptsetup", &args);
}

#[test]
fn a_volume_halfway_through_encryption_or_decryption_opens_as_crypt_plus_linear() {
    if !require("cryptsetup") {
        return;
    }
    let f = Fx::new();
    for (i, mode) in MODES.into_iter().enumerate() {
        let v = f.init(mode, &format!("half{i}"), 0x0e11 + i as u64);
        f.resume(&v, &["--debug-stop-after", "8M"]);
        let out = f.print_table(&v, false);
        assert!(
            out.status.success(),
            "{mode:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines: Vec<String> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect();
        assert_eq!(lines, expected_table(&v), "{mode:?}");
        check_shape(&v, &lines);
        assert!(
            f.read(&v)[..16 * M] == v.plain[..],
            "{mode:?}: not the original plaintext"
        );

        let want = write_and_check(&f, &v, &lines, 0xa11 + i as u64);
        let by_cryptsetup = f.copy(&v, &format!("half{i}-cs"));
        f.resume(&v, &[]);
        cryptsetup_finish(&f, &by_cryptsetup);
        assert!(
            finished_plaintext(&f, &v) == want[..16 * M],
            "{mode:?}: ucrypt's finish"
        );
        assert!(
            finished_plaintext(&f, &by_cryptsetup) == want[..16 * M],
            "{mode:?}: cryptsetup's finish"
        );
        assert!(
            data_area(&v) == data_area(&by_cryptsetup),
            "{mode:?}: ucrypt and cryptsetup finished to different data"
        );
    }
}

#[test]
fn a_crashed_hotzone_is_recovered_by_a_read_write_open_only() {
    if !require("cryptsetup") || !require("strace") {
        return;
    }
    let f = Fx::new();
    for (i, mode) in MODES.into_iter().enumerate() {
        let init = f.init(mode, &format!("crash{i}"), 0xc0 + i as u64);
        // Kill ucrypt at its n-th pwrite until it dies inside a hotzone (the header shows
        // the in-reencryption segment); counting from the second hotzone on, so that a
        // part is already done.
        let mut crashed = None;
        for n in 16..90 {
            let v = f.copy(&init, &format!("crash{i}-{n}"));
            let inject = format!("inject=pwrite64:signal=SIGKILL:when={n}");
            let mut args = vec![
                "-f",
                "-o",
                "/dev/null",
                "-e",
                "trace=pwrite64",
                "-e",
                &inject,
            ];
            args.push(bin());
            args.extend(f.resume_args(&v));
            let out = run("strace", &args);
            let hot = json(v.header())["segments"]
                .to_string()
                .contains("in-reencryption");
            if !out.status.success() && hot {
                let done =
                    json(v.header())["segments"]["0"]["type"] == "crypt" || mode != Mode::Encrypt;
                if done {
                    eprintln!("{mode:?}: killed inside a hotzone at pwrite64 #{n}");
                    crashed = Some(v);
                    break;
                }
            }
            std::fs::remove_file(&v.dev).unwrap();
            if let Some(h) = &v.hdr {
                std::fs::remove_file(h).unwrap();
            }
        }
        let v = crashed.unwrap_or_else(|| panic!("{mode:?}: no kill landed in a hotzone"));
        // Read-only (print-table): refused with the way out named.
        let out = f.print_table(&v, false);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("--resume-only"),
            "{mode:?}: {err}"
        );
        // Read-write (what `ucrypt open` does): the hotzone recovered, then mapped.
        let opts = ucrypt::HeaderOptions {
            recover_reencryption: true,
            header: v.hdr.clone(),
            ..ucrypt::HeaderOptions::default()
        };
        let u = ucrypt::unlock(&v.dev, PASS, &opts).unwrap();
        let size = if mode == Mode::Unshift { 20 } else { 16 };
        assert_eq!(u.size_bytes(), size * M as u64, "{mode:?}");
        let segs = json(v.header())["segments"].to_string();
        assert!(!segs.contains("in-reencryption"), "{mode:?}: {segs}");
        let out = f.print_table(&v, false);
        assert!(out.status.success(), "{mode:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            text.contains(" linear ") && text.contains(" crypt "),
            "{mode:?}: {text}"
        );
        assert!(
            f.read(&v)[..16 * M] == v.plain[..],
            "{mode:?}: not the plaintext after recovery"
        );
        // And the pass finishes from there.
        f.resume(&v, &[]);
        assert!(
            finished_plaintext(&f, &v) == v.plain,
            "{mode:?}: after finishing"
        );
    }
}
