//! `ucrypt reencrypt --encrypt --reduce-device-size SIZE` (a plaintext device encrypted in
//! place, its LUKS2 header at its head, the data shifted by SIZE/2) against the real
//! cryptsetup 2.6 (offline, `--force-offline-reencrypt`):
//!
//! - the metadata `--init-only` writes has cryptsetup's shape field for field (everything
//!   but salts, digests and PBKDF costs equal, also with --cipher/-s/--sector-size/--uuid/
//!   --label/--key-slot): mode encrypt, direction backward, resilience datashift, the first
//!   SIZE/2 bytes of plaintext copied to the device's end (`backup-moved-segment`);
//! - from one initialised device, ucrypt's result equals cryptsetup's: the JSON byte for
//!   byte, the binary headers and keyslots, the data area byte for byte (the reencrypt
//!   keyslot's area and the moved copy are wiped with random bytes by both, so not
//!   compared); `ucrypt open`'s table serves the original plaintext, its first SIZE/2 bytes
//!   (the ones that moved) included;
//! - a run ucrypt stopped after one hotzone has the header cryptsetup has at that point
//!   (byte for byte) and is finished by cryptsetup; ucrypt killed mid-hotzone is
//!   recovered by cryptsetup (repair, then resume) and by ucrypt; cryptsetup killed at a
//!   hotzone's data write is recovered and finished by ucrypt;
//! - geometries: data a multiple of the shift, not a multiple (a shorter hotzone before the
//!   moved one), shorter than the shift (one hotzone);
//! - what cryptsetup refuses with a data shift is refused, and what ucrypt does not do
//!   (a detached header with a shift, re-keying with a shift, cryptsetup 2.6's decryption
//!   of an attached-header device) is refused with a reason, nothing written.
#![allow(clippy::unwrap_used)]

mod common;

use common::cmd::{ok, run, s};

use common::{luks2_shape as shape, require, Rng};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use ucrypt_testkit::luks2_json as json;

const PASS: &[u8] = b"reencrypt shift passphrase";
const PBKDF: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
const MIB: u64 = 1 << 20;

fn ucrypt_bin() -> &'static str {
    env!("CARGO_BIN_EXE_ucrypt")
}

fn tools() -> bool {
    require("cryptsetup") && require("strace")
}

/// A device geometry: `data` bytes of plaintext the filesystem uses, the device `reduce`
/// bytes larger (what `--reduce-device-size` takes away).
#[derive(Clone, Copy, Debug)]
struct Geometry {
    data: u64,
    reduce: u64,
}

impl Geometry {
    fn shift(&self) -> u64 {
        self.reduce / 2
    }
    fn device(&self) -> u64 {
        self.data + self.reduce
    }
    fn reduce_arg(&self) -> String {
        format!("{}M", self.reduce / MIB)
    }
}

struct Fixture {
    dir: tempfile::TempDir,
    key: PathBuf,
    plain: Vec<u8>,
    g: Geometry,
}

impl Fixture {
    fn new(g: Geometry, seed: u64) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("pass");
        std::fs::write(&key, PASS).unwrap();
        // The whole device is random: what lies past the data must not matter.
        let mut plain = vec![0u8; g.device() as usize];
        Rng::new(seed).fill(&mut plain);
        Fixture { dir, key, plain, g }
    }

    /// Runs cryptsetup with `cs_args` under strace: the 1-based numbers of its write()
    /// calls larger than 1 MiB (where a later run is killed to stop it at that write).
    fn large_writes(&self, cs_args: &[&str]) -> Vec<usize> {
        let log = self.path("writes.log");
        let mut args = vec![
            "-f",
            "-s",
            "0",
            "-e",
            "trace=write",
            "-o",
            s(&log),
            "cryptsetup",
        ];
        args.extend_from_slice(cs_args);
        ok("strace", &args);
        std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .filter(|l| l.contains("write("))
            .enumerate()
            .filter(|(_, l)| {
                l.rsplit("= ")
                    .next()
                    .and_then(|n| n.trim().parse::<u64>().ok())
                    .is_some_and(|n| n > MIB)
            })
            .map(|(i, _)| i + 1)
            .collect()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn plain_device(&self, name: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, &self.plain).unwrap();
        p
    }

    /// `reencrypt --encrypt --reduce-device-size --init-only` by `tool`.
    fn init(&self, tool: &str, name: &str, extra: &[&str]) -> PathBuf {
        let p = self.plain_device(name);
        let reduce = self.g.reduce_arg();
        let mut args = vec!["reencrypt", "--encrypt", "--init-only", "-q"];
        args.extend_from_slice(&["--reduce-device-size", &reduce]);
        args.extend_from_slice(&["--key-file", s(&self.key)]);
        args.extend_from_slice(&PBKDF);
        args.extend_from_slice(extra);
        if tool == "cryptsetup" {
            args.extend_from_slice(&["--force-offline-reencrypt", s(&p)]);
            // cryptsetup writes its temporary header into the working directory.
            let out = Command::new("cryptsetup")
                .args(&args)
                .current_dir(self.dir.path())
                .stdin(Stdio::null())
                .output()
                .unwrap();
            assert!(out.status.success(), "cryptsetup {args:?}: {out:?}");
        } else {
            args.extend_from_slice(&["--disable-locks", s(&p)]);
            ok(ucrypt_bin(), &args);
        }
        p
    }

    fn copy(&self, p: &Path, name: &str) -> PathBuf {
        let q = self.path(name);
        std::fs::copy(p, &q).unwrap();
        q
    }

    fn ucrypt_resume_args<'a>(&'a self, p: &'a Path) -> Vec<&'a str> {
        vec![
            "reencrypt",
            "--resume-only",
            "-q",
            "-d",
            s(&self.key),
            "--disable-locks",
            s(p),
        ]
    }

    fn ucrypt_resume(&self, p: &Path, extra: &[&str]) -> Output {
        let mut args = self.ucrypt_resume_args(p);
        args.extend_from_slice(extra);
        ok(ucrypt_bin(), &args)
    }

    fn cryptsetup_resume_args<'a>(&'a self, p: &'a Path) -> Vec<&'a str> {
        vec![
            "reencrypt",
            "--resume-only",
            "--force-offline-reencrypt",
            "-q",
            "--key-file",
            s(&self.key),
            s(p),
        ]
    }

    fn cryptsetup_resume(&self, p: &Path) {
        if json(p).contains("in-reencryption") {
            // cryptsetup's CLI recovers a crashed hotzone in `repair`.
            ok(
                "cryptsetup",
                &["repair", "-q", "--key-file", s(&self.key), s(p)],
            );
            if !json(p).contains("online-reencrypt-v2") {
                // The recovered hotzone was the last one: repair finished it.
                return;
            }
        }
        ok("cryptsetup", &self.cryptsetup_resume_args(p));
    }

    /// The encrypted device serves the original data (`ucrypt open`'s table, read).
    fn assert_serves_plain(&self, p: &Path) {
        let out = ok(
            ucrypt_bin(),
            &[
                "luksOpen",
                "--print-table",
                "--showkeys",
                "-d",
                s(&self.key),
                s(p),
            ],
        );
        let t = self.path("table");
        std::fs::write(&t, &out.stdout).unwrap();
        let len = self.g.data.to_string();
        let out = ok(
            ucrypt_bin(),
            &["read", "--table-file", s(&t), "--length", &len],
        );
        let shift = self.g.shift().min(self.g.data) as usize;
        assert!(
            out.stdout[..shift] == self.plain[..shift],
            "{}: the moved first {shift} bytes do not read back",
            p.display()
        );
        assert!(
            out.stdout == self.plain[..self.g.data as usize],
            "{} does not serve the plaintext",
            p.display()
        );
    }

    /// `cmd` run under strace, killed (SIGKILL on entry) at its `nth` `syscall`.
    fn killed_at(&self, syscall: &str, nth: usize, cmd: &str, args: &[&str]) {
        let inject = format!("inject={syscall}:signal=SIGKILL:when={nth}");
        let trace = format!("trace={syscall}");
        let mut all = vec!["-f", "-o", "/dev/null", "-e", &trace, "-e", &inject, cmd];
        all.extend_from_slice(args);
        let out = run("strace", &all);
        assert!(
            !out.status.success(),
            "{cmd} was not killed at {syscall} #{nth}"
        );
    }

    /// Same JSON, binary headers and keyslots, same data area; the reencrypt keyslot's
    /// area (`area` of `init`) and the moved copy are random in both.
    fn assert_same(&self, area: (usize, usize), a: &Path, b: &Path) {
        assert_eq!(json(a), json(b), "JSON metadata differs");
        let (x, y) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
        for copy in [0usize, 16384] {
            assert_eq!(x[copy..copy + 16], y[copy..copy + 16]);
            assert_eq!(x[copy + 24..copy + 448], y[copy + 24..copy + 448]);
        }
        let (at, size) = area;
        assert!(x[32768..at] == y[32768..at], "keyslot areas differ");
        let shift = self.g.shift() as usize;
        let end = shift + self.g.data as usize;
        assert!(x[at + size..shift] == y[at + size..shift]);
        assert!(
            x[shift..end] == y[shift..end],
            "data of {} and {} differ",
            a.display(),
            b.display()
        );
        // The moved copy of the first plaintext is gone.
        let copy = &x[end..end + shift.min(self.g.data as usize)];
        assert!(copy != &self.plain[..copy.len()], "moved copy not wiped");
    }
}

/// The reencrypt keyslot's area (offset, size) in `dev`'s metadata.
fn reencrypt_area(dev: &Path) -> (usize, usize) {
    let v: serde_json::Value = serde_json::from_str(&json(dev)).unwrap();
    let ks = v["keyslots"]
        .as_object()
        .unwrap()
        .values()
        .find(|k| k["type"] == "reencrypt")
        .unwrap();
    let n = |k: &str| ks["area"][k].as_str().unwrap().parse().unwrap();
    (n("offset"), n("size"))
}

#[test]
fn shift_init_has_cryptsetups_shape() {
    if !tools() {
        return;
    }
    let f = Fixture::new(
        Geometry {
            data: 32 * MIB,
            reduce: 32 * MIB,
        },
        0x5eed_5417,
    );
    let cases: [&[&str]; 3] = [
        &[],
        &["--resilience", "datashift"],
        &[
            "-c",
            "aes-cbc-essiv:sha256",
            "-s",
            "256",
            "--sector-size",
            "4096",
            "--uuid",
            "3f1b2e4c-8f5e-4a2b-9c3d-112233445566",
            "--label",
            "shift-test",
            "--key-slot",
            "3",
        ],
    ];
    let shift = f.g.shift() as usize;
    for (i, extra) in cases.iter().enumerate() {
        let uc = f.init("ucrypt", &format!("uc{i}"), extra);
        let cs = f.init("cryptsetup", &format!("cs{i}"), extra);
        assert_eq!(shape(&uc), shape(&cs), "case {extra:?}");
        let j = json(&uc);
        assert!(
            j.contains("\"mode\":\"encrypt\"")
                && j.contains("\"direction\":\"backward\"")
                && j.contains("\"type\":\"datashift\"")
                && j.contains(&format!("\"shift_size\":\"{shift}\""))
                && j.contains("backup-moved-segment"),
            "{j}"
        );
        let (x, y) = (std::fs::read(&uc).unwrap(), std::fs::read(&cs).unwrap());
        // Past the header both devices are alike: the plaintext where it was, the first
        // shift bytes copied to the end.
        assert!(x[shift..] == y[shift..], "case {extra:?}: data differs");
        let end = f.plain.len();
        assert!(x[end - shift..] == f.plain[..shift], "no moved copy");
        assert!(x[shift..end - shift] == f.plain[shift..end - shift]);
        // The binary headers' label, UUID and subsystem agree.
        assert_eq!(x[24..72], y[24..72]);
        if i == 2 {
            assert_eq!(x[168..208], y[168..208]);
            assert!(x[24..72].starts_with(b"shift-test\0"));
        }
    }
}

/// Each geometry: cryptsetup's run and ucrypt's from one initialised device agree; ucrypt
/// stopped after one hotzone is finished by cryptsetup; ucrypt killed in the second
/// hotzone's "post" header write is recovered by either tool; cryptsetup killed at the
/// second hotzone's data write is recovered by ucrypt.
#[test]
fn shift_encryption_equals_cryptsetups_and_either_tool_finishes_the_other() {
    if !tools() {
        return;
    }
    let geometries = [
        // Data a multiple of the shift: two hotzones, the second the moved copy's.
        (32 * MIB, 32 * MIB, &[][..]),
        // Not a multiple: 16 MiB, 8 MiB, then the moved copy's; 4 KiB sectors.
        (40 * MIB, 32 * MIB, &["--sector-size", "4096"][..]),
        // Shorter than the shift: the moved copy's hotzone only.
        (6 * MIB, 16 * MIB, &[][..]),
    ];
    for (i, (data, reduce, extra)) in geometries.into_iter().enumerate() {
        let f = Fixture::new(Geometry { data, reduce }, 0x5eed_0000 + i as u64);
        let what = format!("{:?}", f.g);
        let init = f.init("ucrypt", "init", extra);
        let area = reencrypt_area(&init);
        let reference = f.copy(&init, "reference");
        f.cryptsetup_resume(&reference);
        f.assert_serves_plain(&reference);

        let uc = f.copy(&init, "uc");
        let out = f.ucrypt_resume(&uc, &[]);
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("Finished"),
            "{what}"
        );
        assert!(!json(&uc).contains("reencrypt"), "{what}: {}", json(&uc));
        f.assert_same(area, &reference, &uc);
        f.assert_serves_plain(&uc);

        if data <= f.g.shift() {
            continue;
        }
        // ucrypt stops after one hotzone (the last shift of the data: encrypted a shift
        // higher); cryptsetup finishes.
        let a = f.copy(&init, "a");
        f.ucrypt_resume(&a, &["--debug-stop-after", "1M"]);
        let j = json(&a);
        let first = data - f.g.shift();
        assert!(
            j.contains(&format!(
                "{{\"type\":\"crypt\",\"offset\":\"{}\",\"size\":\"{}\"",
                f.g.shift() + first,
                f.g.shift()
            )),
            "{what}: {j}"
        );
        // cryptsetup killed as it starts hotzone 2 (its 14th write(): per hotzone two
        // header writes of three write()s each and one data write) left the same header.
        let cs_one = f.copy(&init, "cs-one");
        f.killed_at(
            "write",
            14,
            "cryptsetup",
            &f.cryptsetup_resume_args(&cs_one),
        );
        assert_eq!(json(&cs_one), j, "{what}: header after one hotzone differs");
        f.cryptsetup_resume(&a);
        f.assert_same(area, &reference, &a);

        // ucrypt killed at hotzone 2's first "post" header write (per hotzone: 6 pwrites
        // for the "hot" header, one data write, 6 for the "post" header).
        let crashed = f.copy(&init, "crashed");
        f.killed_at(
            "pwrite64",
            21,
            ucrypt_bin(),
            &f.ucrypt_resume_args(&crashed),
        );
        assert!(json(&crashed).contains("in-reencryption"), "{what}");
        let by_cs = f.copy(&crashed, "by-cs");
        f.cryptsetup_resume(&by_cs);
        f.assert_same(area, &reference, &by_cs);
        f.ucrypt_resume(&crashed, &[]);
        f.assert_same(area, &reference, &crashed);

        // cryptsetup killed at its second hotzone's data write (a traced run on a scratch
        // copy says which write() that is: the second larger than the 1 MiB of its wipe).
        let scratch = f.copy(&init, "scratch");
        let big = f.large_writes(&f.cryptsetup_resume_args(&scratch));
        assert!(big.len() >= 2, "{what}: {big:?}");
        let cs_crashed = f.copy(&init, "cs-crashed");
        f.killed_at(
            "write",
            big[1],
            "cryptsetup",
            &f.cryptsetup_resume_args(&cs_crashed),
        );
        assert!(json(&cs_crashed).contains("in-reencryption"), "{what}");
        f.ucrypt_resume(&cs_crashed, &[]);
        f.assert_same(area, &reference, &cs_crashed);
    }
}

#[test]
fn what_ucrypt_does_not_do_with_a_shift_is_refused() {
    if !tools() {
        return;
    }
    let f = Fixture::new(
        Geometry {
            data: 16 * MIB,
            reduce: 16 * MIB,
        },
        0x5eed_0bad,
    );
    let dev = f.plain_device("plain");
    let k = s(&f.key);
    let d = s(&dev);
    let hdr = f.path("hdr");
    let refused = |args: &[&str], why: &str| {
        let mut all = vec!["reencrypt", "-q", "-d", k, "--disable-locks"];
        all.extend_from_slice(args);
        let out = run(ucrypt_bin(), &all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(why), "{args:?}: {err}");
        assert!(std::fs::read(&dev).unwrap() == f.plain, "{args:?} wrote");
        assert!(!hdr.exists());
    };
    let h = s(&hdr);
    let e = ["--encrypt", "--reduce-device-size", "16M"];
    refused(
        &["--reduce-device-size", "16M", d],
        "supported with --encrypt",
    );
    refused(&[&e[..], &["--header", h, d]].concat(), "detached header");
    refused(
        &[&e[..], &["--device-size", "8M", d]].concat(),
        "cannot be combined",
    );
    refused(
        &[&e[..], &["--resilience", "journal", d]].concat(),
        "does not apply",
    );
    refused(&["--encrypt", "--reduce-device-size", "2G", d], "1 GiB");
    refused(
        &["--encrypt", "--reduce-device-size", "1000", d],
        "multiple of 512",
    );
    refused(
        &["--encrypt", "--resilience", "datashift", "--header", h, d],
        "datashift",
    );
    // The decryption of an attached-header device (the header exported, the data shifted
    // back) takes no datashift or none resilience (cryptsetup's message), nor
    // --device-size; nothing is written, no header file is left.
    let luks = f.init("ucrypt", "luks", &[]);
    f.ucrypt_resume(&luks, &[]);
    let before = std::fs::read(&luks).unwrap();
    for extra in [
        &["--resilience", "none"][..],
        &["--resilience", "datashift"][..],
        &["--device-size", "4M"][..],
    ] {
        let mut args = vec!["reencrypt", "--decrypt", "-q", "-d", k, "--header", h];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--disable-locks", s(&luks)]);
        let out = run(ucrypt_bin(), &args);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {out:?}");
        assert!(std::fs::read(&luks).unwrap() == before && !hdr.exists());
    }
    // A wrong passphrase: refused before the header is exported.
    let bad = f.path("bad");
    std::fs::write(&bad, b"not the passphrase").unwrap();
    let out = run(
        ucrypt_bin(),
        &[
            "reencrypt",
            "--decrypt",
            "-q",
            "-d",
            s(&bad),
            "--header",
            h,
            "--disable-locks",
            s(&luks),
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(std::fs::read(&luks).unwrap() == before && !hdr.exists());
    // A finished shift encryption is a LUKS device: not encrypted again.
    let out = run(
        ucrypt_bin(),
        &[
            "reencrypt",
            "--encrypt",
            "-q",
            "--reduce-device-size",
            "16M",
            "-d",
            k,
            "--disable-locks",
            s(&luks),
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("already LUKS device"));
    assert!(std::fs::read(&luks).unwrap() == before);
}

/// A device whose header was attached and the header file its decryption exports.
struct Exported {
    hdr: PathBuf,
    dev: PathBuf,
}

impl Fixture {
    /// The plaintext encrypted with a data shift (ucrypt's `--encrypt
    /// --reduce-device-size`, finished): a LUKS2 device whose header is attached.
    fn encrypted(&self, name: &str, extra: &[&str]) -> PathBuf {
        let p = self.init("ucrypt", name, extra);
        self.ucrypt_resume(&p, &[]);
        assert!(!json(&p).contains("reencrypt"));
        p
    }

    /// `reencrypt --decrypt --header NAME.hdr --init-only` of a copy of `enc` by `tool`.
    fn init_decrypt(&self, tool: &str, enc: &Path, name: &str, extra: &[&str]) -> Exported {
        let e = Exported {
            hdr: self.path(&format!("{name}.hdr")),
            dev: self.copy(enc, &format!("{name}.dev")),
        };
        let _ = std::fs::remove_file(&e.hdr);
        let mut args = vec!["reencrypt", "--decrypt", "--init-only", "-q"];
        args.extend_from_slice(&["--header", s(&e.hdr), "--key-file", s(&self.key)]);
        args.extend_from_slice(extra);
        if tool == "cryptsetup" {
            args.extend_from_slice(&["--force-offline-reencrypt", s(&e.dev)]);
            ok("cryptsetup", &args);
        } else {
            args.extend_from_slice(&["--disable-locks", s(&e.dev)]);
            ok(ucrypt_bin(), &args);
        }
        e
    }

    fn copy_pair(&self, e: &Exported, name: &str) -> Exported {
        let hdr = self.path(&format!("{name}.hdr"));
        std::fs::copy(&e.hdr, &hdr).unwrap();
        Exported {
            hdr,
            dev: self.copy(&e.dev, &format!("{name}.dev")),
        }
    }

    fn ucrypt_decrypt_args<'a>(&'a self, e: &'a Exported) -> Vec<&'a str> {
        vec![
            "reencrypt",
            "--resume-only",
            "-q",
            "-d",
            s(&self.key),
            "--header",
            s(&e.hdr),
            "--disable-locks",
            s(&e.dev),
        ]
    }

    fn cryptsetup_decrypt_args<'a>(&'a self, e: &'a Exported) -> Vec<&'a str> {
        vec![
            "reencrypt",
            "--resume-only",
            "--force-offline-reencrypt",
            "-q",
            "--key-file",
            s(&self.key),
            "--header",
            s(&e.hdr),
            s(&e.dev),
        ]
    }

    /// cryptsetup finishes `e` (`repair` first when a hotzone was interrupted).
    fn cryptsetup_finish(&self, e: &Exported) {
        if json(&e.hdr).contains("in-reencryption") {
            ok(
                "cryptsetup",
                &[
                    "repair",
                    "-q",
                    "--key-file",
                    s(&self.key),
                    "--header",
                    s(&e.hdr),
                    s(&e.dev),
                ],
            );
            if !json(&e.hdr).contains("online-reencrypt") {
                return;
            }
        }
        ok("cryptsetup", &self.cryptsetup_decrypt_args(e));
    }

    /// A finished decryption equals the reference: the same JSON (and binary header
    /// fields but the sequence id, which counts cryptsetup's extra header write at each
    /// resume), the same device up to its last shift bytes (random in both), the
    /// plaintext back at the device's head.
    fn assert_decrypted(&self, reference: &Exported, e: &Exported) {
        assert_eq!(json(&reference.hdr), json(&e.hdr), "JSON metadata differs");
        let (x, y) = (
            std::fs::read(&reference.hdr).unwrap(),
            std::fs::read(&e.hdr).unwrap(),
        );
        for copy in [0usize, 16384] {
            assert_eq!(x[copy..copy + 16], y[copy..copy + 16]);
            assert_eq!(x[copy + 24..copy + 448], y[copy + 24..copy + 448]);
        }
        let (a, b) = (
            std::fs::read(&reference.dev).unwrap(),
            std::fs::read(&e.dev).unwrap(),
        );
        let len = (self.g.device() - self.g.shift()) as usize;
        assert!(a[..len] == b[..len], "{}: data differs", e.dev.display());
        assert!(
            b[..self.g.data as usize] == self.plain[..self.g.data as usize],
            "{}: not the plaintext at the head",
            e.dev.display()
        );
        assert!(
            b[len..] != a[len..],
            "the device's last shift bytes not wiped"
        );
    }

    /// `ucrypt open --header` of `e` (its table printed) fails naming `why`, and changes
    /// nothing.
    fn assert_open_refused(&self, e: &Exported, why: &str) {
        let before = (
            std::fs::read(&e.hdr).unwrap(),
            std::fs::read(&e.dev).unwrap(),
        );
        let out = run(
            ucrypt_bin(),
            &[
                "luksOpen",
                "--print-table",
                "-d",
                s(&self.key),
                "--header",
                s(&e.hdr),
                s(&e.dev),
            ],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(why), "{err}");
        assert!(
            before
                == (
                    std::fs::read(&e.hdr).unwrap(),
                    std::fs::read(&e.dev).unwrap()
                )
        );
    }

    /// The JSON `segments` object of a header.
    fn segments(&self, hdr: &Path) -> serde_json::Value {
        let v: serde_json::Value = serde_json::from_str(&json(hdr)).unwrap();
        v["segments"].clone()
    }
}

/// cryptsetup 2.6's `reencrypt --decrypt --header NEWFILE` of a device whose header is
/// attached (the header exported, the data moved to the head of the device: mode decrypt,
/// direction forward, `datashift-checksum` or `datashift-journal`, requirement
/// `online-reencrypt-v3`), against ucrypt's, for three geometries: ucrypt's init equals
/// cryptsetup's (metadata shape, the device byte for byte: the first ciphertext copied to
/// the head); from one initialised pair both tools' results are equal; ucrypt stopped after
/// one hotzone is finished by cryptsetup; ucrypt killed at a hotzone's "post" header, in
/// the moved segment's hotzone before and after its data write, is recovered by either
/// tool; cryptsetup killed at the moved segment's data write is recovered by ucrypt; a
/// journal run; `open` of a half-done device is refused with a reason.
#[test]
fn attached_header_decryption_equals_cryptsetups_and_either_tool_finishes_the_other() {
    if !tools() {
        return;
    }
    let geometries = [
        // 48 MiB to decrypt: moved 16 MiB, then [16, 32), [32, 48), then the moved one.
        (32 * MIB, 32 * MIB, &[][..]),
        // 56 MiB, 4 KiB sectors: the last shift hotzone 8 MiB.
        (40 * MIB, 32 * MIB, &["--sector-size", "4096"][..]),
        // 14 MiB: moved 8 MiB, one 6 MiB hotzone.
        (6 * MIB, 16 * MIB, &[][..]),
    ];
    for (i, (data, reduce, extra)) in geometries.into_iter().enumerate() {
        let f = Fixture::new(Geometry { data, reduce }, 0x5eed_de00 + i as u64);
        let what = format!("{:?}", f.g);
        let enc = f.encrypted("enc", extra);
        let uc = f.init_decrypt("ucrypt", &enc, "uc", &[]);
        let cs = f.init_decrypt("cryptsetup", &enc, "cs", &[]);
        assert_eq!(shape(&uc.hdr), shape(&cs.hdr), "{what}");
        let j = json(&uc.hdr);
        assert!(
            j.contains("\"mode\":\"decrypt\",\"direction\":\"forward\"")
                && j.contains("\"type\":\"datashift-checksum\"")
                && j.contains("online-reencrypt-v3")
                && j.contains("backup-moved-segment"),
            "{what}: {j}"
        );
        assert!(
            std::fs::read(&uc.dev).unwrap() == std::fs::read(&cs.dev).unwrap(),
            "{what}: the devices differ after init"
        );
        assert!(
            std::fs::metadata(&uc.hdr).unwrap().len() == std::fs::metadata(&cs.hdr).unwrap().len()
        );

        let reference = f.copy_pair(&cs, "reference");
        ok("cryptsetup", &f.cryptsetup_decrypt_args(&reference));
        let out = ok(ucrypt_bin(), &f.ucrypt_decrypt_args(&uc));
        assert!(String::from_utf8_lossy(&out.stderr).contains("Finished"));
        f.assert_decrypted(&reference, &uc);
        // ucrypt finishes cryptsetup's init.
        let b = f.copy_pair(&cs, "b");
        ok(ucrypt_bin(), &f.ucrypt_decrypt_args(&b));
        f.assert_decrypted(&reference, &b);

        // Hotzones after the moved segment, each a shift long at most.
        let len = f.g.device() - f.g.shift();
        let moved = f.g.shift().min(len).min(20 * MIB);
        let k = (len - moved).div_ceil(f.g.shift()) as usize;
        // ucrypt stopped after one hotzone: cryptsetup's segments at that point (its run
        // killed as it starts hotzone 2: 3 writes per header copy, 2 copies, per hotzone a
        // hot and a post header and one data write; cryptsetup writes one header more at
        // its start), then cryptsetup finishes.
        if k > 1 {
            let a = f.copy_pair(&uc_init(&f, &enc), "a");
            ok(
                ucrypt_bin(),
                &[
                    &f.ucrypt_decrypt_args(&a)[..],
                    &["--debug-stop-after", "1M"],
                ]
                .concat(),
            );
            let cs_one = f.copy_pair(&cs, "cs-one");
            f.killed_at(
                "write",
                6 + 13 + 1,
                "cryptsetup",
                &f.cryptsetup_decrypt_args(&cs_one),
            );
            assert_eq!(f.segments(&a.hdr), f.segments(&cs_one.hdr), "{what}");
            // Half plaintext: opened as cryptsetup maps it, crypt and linear targets
            // (reencrypt_open.rs checks the data such a mapping serves).
            let out = ok(
                ucrypt_bin(),
                &[
                    "luksOpen",
                    "--print-table",
                    "-d",
                    s(&f.key),
                    "--header",
                    s(&a.hdr),
                    s(&a.dev),
                ],
            );
            let table = String::from_utf8_lossy(&out.stdout);
            assert!(
                table.contains(" linear ") && table.contains(" crypt "),
                "{what}: {table}"
            );
            f.cryptsetup_finish(&a);
            f.assert_decrypted(&reference, &a);
        }
        // ucrypt killed at a shift hotzone's post header (its I/O thread's pwrites: per
        // hotzone hot header 6, data 1, post 6), and before and after the moved segment's
        // data write (its main thread's: the checksums, the hot header, the data, the post
        // header; strace counts a thread's own calls, so only the main thread is traced).
        let mut kills = vec![(8, false), (9, false)];
        if k > 1 {
            kills.push((13 + 8, true));
        }
        for (nth, io_thread) in kills {
            let crashed = f.copy_pair(&uc_init(&f, &enc), &format!("crashed{nth}"));
            let args = f.ucrypt_decrypt_args(&crashed);
            if io_thread {
                f.killed_at("pwrite64", nth, ucrypt_bin(), &args);
            } else {
                killed_in_main_thread(nth, &args);
            }
            assert!(
                json(&crashed.hdr).contains("in-reencryption"),
                "{what}: kill at {nth}"
            );
            f.assert_open_refused(&crashed, "interrupted by a crash");
            let by_cs = f.copy_pair(&crashed, &format!("by-cs{nth}"));
            f.cryptsetup_finish(&by_cs);
            f.assert_decrypted(&reference, &by_cs);
            ok(ucrypt_bin(), &f.ucrypt_decrypt_args(&crashed));
            f.assert_decrypted(&reference, &crashed);
        }
        // cryptsetup killed at the moved segment's data write (its (k+1)th write larger
        // than the 1 MiB of its wipes, found by a traced run on a scratch copy).
        let scratch = f.copy_pair(&cs, "scratch");
        let big = f.large_writes(&f.cryptsetup_decrypt_args(&scratch));
        // The hotzones' data writes, then the wipe of the reencrypt keyslot's area.
        assert_eq!(big.len(), k + 2, "{what}: {big:?}");
        let cs_crashed = f.copy_pair(&cs, "cs-crashed");
        f.killed_at(
            "write",
            big[k],
            "cryptsetup",
            &f.cryptsetup_decrypt_args(&cs_crashed),
        );
        assert!(json(&cs_crashed.hdr).contains("in-reencryption"), "{what}");
        ok(ucrypt_bin(), &f.ucrypt_decrypt_args(&cs_crashed));
        f.assert_decrypted(&reference, &cs_crashed);
    }
    // datashift-journal: the moved segment (here 8 MiB, --hotzone-size) journaled.
    let f = Fixture::new(
        Geometry {
            data: 32 * MIB,
            reduce: 32 * MIB,
        },
        0x5eed_de10,
    );
    let enc = f.encrypted("enc", &[]);
    let j = ["--resilience", "journal", "--hotzone-size", "8M"];
    let uc = f.init_decrypt("ucrypt", &enc, "uc", &j);
    let cs = f.init_decrypt("cryptsetup", &enc, "cs", &j);
    assert_eq!(shape(&uc.hdr), shape(&cs.hdr));
    assert!(json(&uc.hdr).contains("\"type\":\"datashift-journal\""));
    let reference = f.copy_pair(&cs, "reference");
    ok("cryptsetup", &f.cryptsetup_decrypt_args(&reference));
    // Killed after the moved segment's journal, hot header and data write (16 MiB moved
    // 8: hotzones [8, 24), [24, 40), [40, 48)).
    let crashed = f.copy_pair(&uc, "crashed");
    killed_in_main_thread(9, &f.ucrypt_decrypt_args(&crashed));
    assert!(json(&crashed.hdr).contains("in-reencryption"));
    let by_cs = f.copy_pair(&crashed, "by-cs");
    f.cryptsetup_finish(&by_cs);
    f.assert_decrypted(&reference, &by_cs);
    ok(ucrypt_bin(), &f.ucrypt_decrypt_args(&crashed));
    f.assert_decrypted(&reference, &crashed);
    ok(ucrypt_bin(), &f.ucrypt_decrypt_args(&uc));
    f.assert_decrypted(&reference, &uc);
}

/// ucrypt (`args`) killed (SIGKILL on entry) at its main thread's `nth` pwrite64.
fn killed_in_main_thread(nth: usize, args: &[&str]) {
    let inject = format!("inject=pwrite64:signal=SIGKILL:when={nth}");
    let mut all = vec!["-o", "/dev/null", "-e", "trace=pwrite64", "-e", &inject];
    all.push(ucrypt_bin());
    all.extend_from_slice(args);
    let out = run("strace", &all);
    assert!(
        !out.status.success(),
        "ucrypt was not killed at pwrite64 #{nth}"
    );
}

/// A fresh ucrypt `--decrypt --init-only` of a copy of `enc`.
fn uc_init(f: &Fixture, enc: &Path) -> Exported {
    f.init_decrypt("ucrypt", enc, "fresh", &[])
}

/// `reencrypt -o/--offset SECTORS` as cryptsetup 2.6.1 takes it: with `--encrypt --header`
/// the data segment starts at the offset (the header file sized to it, with libcryptsetup's
/// "keyslots area is very small" warning on stdout) and the device's first SECTORS stay as
/// they are; with `--reduce-device-size` an offset below half the reduction adjusts the
/// reduction to twice the offset (cryptsetup's line on stdout), one above it is refused
/// (rc 1, nothing written); without `--encrypt` it is ignored (a re-key runs, rc 0). From
/// one initialised device both tools' runs are equal, and a run ucrypt stopped is finished
/// by cryptsetup.
#[test]
fn offset_equals_cryptsetups() {
    if !tools() {
        return;
    }
    // --encrypt --header -o 4096: 2 MiB left as it is, the header file 2 MiB.
    let f = Fixture::new(
        Geometry {
            data: 32 * MIB,
            reduce: 0,
        },
        0x5eed_0ff5,
    );
    let mut outs = Vec::new();
    for tool in ["ucrypt", "cryptsetup"] {
        let dev = f.plain_device(&format!("{tool}.dev"));
        let hdr = f.path(&format!("{tool}.hdr"));
        let mut args = vec!["reencrypt", "--encrypt", "--init-only", "-q", "-o", "4096"];
        args.extend_from_slice(&["--header", s(&hdr), "--key-file", s(&f.key)]);
        args.extend_from_slice(&PBKDF);
        let out = if tool == "ucrypt" {
            args.extend_from_slice(&["--disable-locks", s(&dev)]);
            ok(ucrypt_bin(), &args)
        } else {
            args.extend_from_slice(&["--force-offline-reencrypt", s(&dev)]);
            ok("cryptsetup", &args)
        };
        assert!(
            String::from_utf8_lossy(&out.stdout)
                .contains("keyslots area (2064384 bytes) is very small"),
            "{tool}: {out:?}"
        );
        assert_eq!(std::fs::metadata(&hdr).unwrap().len(), 2 * MIB, "{tool}");
        outs.push(Exported { hdr, dev });
    }
    assert_eq!(shape(&outs[0].hdr), shape(&outs[1].hdr));
    assert!(json(&outs[0].hdr).contains(r#""segments":{"0":{"type":"linear","offset":"2097152""#));
    let uc = &outs[0];
    let reference = f.copy_pair(uc, "reference");
    // (The resume arguments of a detached header, whichever the mode.)
    ok("cryptsetup", &f.cryptsetup_decrypt_args(&reference));
    let stopped = f.copy_pair(uc, "stopped");
    let mut uc_args = f.ucrypt_decrypt_args(uc);
    ok(ucrypt_bin(), &uc_args);
    uc_args = f.ucrypt_decrypt_args(&stopped);
    uc_args.extend_from_slice(&["--hotzone-size", "4M", "--debug-stop-after", "4M"]);
    ok(ucrypt_bin(), &uc_args);
    assert!(json(&stopped.hdr).contains("online-reencrypt-v2"));
    ok("cryptsetup", &f.cryptsetup_decrypt_args(&stopped));
    for e in [uc, &stopped] {
        assert_eq!(json(&reference.hdr), json(&e.hdr));
        let (a, b) = (
            std::fs::read(&reference.dev).unwrap(),
            std::fs::read(&e.dev).unwrap(),
        );
        assert!(a == b, "{}: data differs", e.dev.display());
        assert!(
            b[..2 * MIB as usize] == f.plain[..2 * MIB as usize],
            "the first 2 MiB changed"
        );
    }

    // --reduce-device-size 8M -o 4096: adjusted to 4M (a 2 MiB shift).
    let f = Fixture::new(
        Geometry {
            data: 28 * MIB,
            reduce: 4 * MIB,
        },
        0x5eed_0ff6,
    );
    let shifted = |tool: &str, name: &str, offset: &str| -> (PathBuf, Output) {
        let p = f.plain_device(name);
        let mut args = vec!["reencrypt", "--encrypt", "--init-only", "-q"];
        args.extend_from_slice(&["--reduce-device-size", "8M", "--offset", offset]);
        args.extend_from_slice(&["--key-file", s(&f.key)]);
        args.extend_from_slice(&PBKDF);
        let out = if tool == "cryptsetup" {
            args.extend_from_slice(&["--force-offline-reencrypt", s(&p)]);
            Command::new("cryptsetup")
                .args(&args)
                .current_dir(f.dir.path())
                .stdin(Stdio::null())
                .output()
                .unwrap()
        } else {
            args.extend_from_slice(&["--disable-locks", s(&p)]);
            run(ucrypt_bin(), &args)
        };
        (p, out)
    };
    let (uc, uc_out) = shifted("ucrypt", "uc-shift", "4096");
    let (cs, cs_out) = shifted("cryptsetup", "cs-shift", "4096");
    for out in [&uc_out, &cs_out] {
        assert!(out.status.success(), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains(
            "Adjusting --reduce-device-size value to twice the --offset 8192 (sectors)."
        ));
    }
    assert_eq!(shape(&uc), shape(&cs));
    assert!(json(&uc).contains(r#""shift_size":"2097152""#));
    let area = reencrypt_area(&uc);
    let reference = f.copy(&uc, "shift-reference");
    f.cryptsetup_resume(&reference);
    f.ucrypt_resume(&uc, &[]);
    f.assert_same(area, &reference, &uc);
    f.assert_serves_plain(&uc);
    // An offset beyond half the reduction: refused by both, nothing written.
    for tool in ["ucrypt", "cryptsetup"] {
        let (p, out) = shifted(tool, &format!("{tool}-big"), "16384");
        assert_eq!(out.status.code(), Some(1), "{tool}: {out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains(
            "Requested data offset must be less than or equal to half of --reduce-device-size parameter."
        ));
        assert!(std::fs::read(&p).unwrap() == f.plain, "{tool} wrote");
    }
    // Without --encrypt: ignored, the re-key runs (rc 0) for both.
    for tool in ["ucrypt", "cryptsetup"] {
        let p = f.copy(&reference, &format!("{tool}-rekey"));
        let mut args = vec![
            "reencrypt",
            "-q",
            "--offset",
            "4096",
            "--key-file",
            s(&f.key),
        ];
        args.extend_from_slice(&PBKDF);
        if tool == "ucrypt" {
            args.extend_from_slice(&["--disable-locks", s(&p)]);
            ok(ucrypt_bin(), &args);
        } else {
            args.extend_from_slice(&["--force-offline-reencrypt", s(&p)]);
            ok("cryptsetup", &args);
        }
        f.assert_serves_plain(&p);
    }
}
