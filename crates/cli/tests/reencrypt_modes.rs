//! `ucrypt reencrypt --encrypt --header` and `--decrypt --header` against the real
//! cryptsetup 2.6 (offline, `--force-offline-reencrypt`):
//!
//! - the metadata `--init-only` writes has cryptsetup's shape field for field (everything
//!   but salts, digests and PBKDF costs equal, also with --cipher/-s/--sector-size/--uuid/
//!   --label), for every resilience;
//! - from one initialised pair, ucrypt's result equals cryptsetup's: the JSON byte for byte,
//!   the data area byte for byte; the encrypted device reads back the plaintext through
//!   `ucrypt open`'s table, the decrypted one is the plaintext again;
//! - a run ucrypt stopped is finished by cryptsetup and the reverse; ucrypt killed
//!   mid-hotzone is recovered by cryptsetup (repair, then resume) and by ucrypt; cryptsetup
//!   killed at a hotzone's data write is recovered and finished by ucrypt;
//! - what cryptsetup refuses is refused (no --header, an existing LUKS header, decryption
//!   with resilience none); the data shift (`--reduce-device-size`) is `reencrypt_shift.rs`.
//!
//! Devices are 24 MiB of data, PBKDF costs minimal, hotzones 4 MiB.
#![allow(clippy::unwrap_used)]

mod common;

use common::cmd::{ok, run, s};

use common::{luks2_shape as shape, require, Rng};
use std::path::{Path, PathBuf};
use std::process::Output;
use ucrypt_testkit::luks2_json as json;

const PASS: &[u8] = b"reencrypt modes passphrase";
const DATA: usize = 24 << 20;

fn ucrypt_bin() -> &'static str {
    env!("CARGO_BIN_EXE_ucrypt")
}

fn tools() -> bool {
    require("cryptsetup") && require("strace")
}

/// A pair: detached header file and data device.
#[derive(Clone)]
struct Pair {
    hdr: PathBuf,
    dev: PathBuf,
}

struct Fixture {
    dir: tempfile::TempDir,
    key: PathBuf,
    plain: Vec<u8>,
}

const PBKDF: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("pass");
        std::fs::write(&key, PASS).unwrap();
        let mut plain = vec![0u8; DATA];
        Rng::new(0x5eed_0e1c).fill(&mut plain);
        Fixture { dir, key, plain }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A plaintext device `name` (no header yet).
    fn plain_device(&self, name: &str) -> Pair {
        let dev = self.path(&format!("{name}.dev"));
        std::fs::write(&dev, &self.plain).unwrap();
        Pair {
            hdr: self.path(&format!("{name}.hdr")),
            dev,
        }
    }

    /// `reencrypt --encrypt --init-only` by `tool` ("ucrypt" or "cryptsetup").
    fn init_encrypt(&self, tool: &str, name: &str, extra: &[&str]) -> Pair {
        let p = self.plain_device(name);
        let mut args = vec!["reencrypt", "--encrypt", "--init-only", "-q"];
        args.extend_from_slice(&["--header", s(&p.hdr), "--key-file", s(&self.key)]);
        args.extend_from_slice(&PBKDF);
        args.extend_from_slice(extra);
        if tool == "cryptsetup" {
            args.push("--force-offline-reencrypt");
            args.push(s(&p.dev));
            ok("cryptsetup", &args);
        } else {
            args.extend_from_slice(&["--disable-locks", s(&p.dev)]);
            ok(ucrypt_bin(), &args);
        }
        p
    }

    /// An encrypted pair (cryptsetup's encryption of the plaintext, finished), then
    /// `reencrypt --decrypt --init-only` by ucrypt.
    fn init_decrypt(&self, name: &str, resilience: &str) -> Pair {
        let p = self.init_encrypt("ucrypt", name, &[]);
        self.cryptsetup_resume(&p);
        ok(
            ucrypt_bin(),
            &[
                "reencrypt",
                "--decrypt",
                "--init-only",
                "-q",
                "--header",
                s(&p.hdr),
                "--key-file",
                s(&self.key),
                "--resilience",
                resilience,
                "--disable-locks",
                s(&p.dev),
            ],
        );
        assert!(json(&p.hdr).contains("\"mode\":\"decrypt\""));
        p
    }

    fn copy(&self, p: &Pair, name: &str) -> Pair {
        let q = Pair {
            hdr: self.path(&format!("{name}.hdr")),
            dev: self.path(&format!("{name}.dev")),
        };
        std::fs::copy(&p.hdr, &q.hdr).unwrap();
        std::fs::copy(&p.dev, &q.dev).unwrap();
        q
    }

    fn ucrypt_resume_args<'a>(&'a self, p: &'a Pair) -> Vec<&'a str> {
        vec![
            "reencrypt",
            "--resume-only",
            "-q",
            "--header",
            s(&p.hdr),
            "-d",
            s(&self.key),
            "--hotzone-size",
            "4M",
            "--disable-locks",
            s(&p.dev),
        ]
    }

    fn ucrypt_resume(&self, p: &Pair, extra: &[&str]) -> Output {
        let mut args = self.ucrypt_resume_args(p);
        args.extend_from_slice(extra);
        ok(ucrypt_bin(), &args)
    }

    fn cryptsetup_resume_args<'a>(&'a self, p: &'a Pair) -> Vec<&'a str> {
        vec![
            "reencrypt",
            "--resume-only",
            "--force-offline-reencrypt",
            "-q",
            "--header",
            s(&p.hdr),
            "--key-file",
            s(&self.key),
            "--hotzone-size",
            "4M",
            s(&p.dev),
        ]
    }

    fn cryptsetup_resume(&self, p: &Pair) {
        if json(&p.hdr).contains("in-reencryption") {
            // cryptsetup's CLI recovers a crashed hotzone in `repair`.
            ok(
                "cryptsetup",
                &[
                    "repair",
                    "-q",
                    "--header",
                    s(&p.hdr),
                    "--key-file",
                    s(&self.key),
                    s(&p.dev),
                ],
            );
        }
        ok("cryptsetup", &self.cryptsetup_resume_args(p));
    }

    /// The encrypted device serves the plaintext (`ucrypt open`'s table, read).
    fn assert_serves_plain(&self, p: &Pair) {
        let out = ok(
            ucrypt_bin(),
            &[
                "luksOpen",
                "--print-table",
                "--showkeys",
                "--header",
                s(&p.hdr),
                "-d",
                s(&self.key),
                s(&p.dev),
            ],
        );
        let t = self.path("table");
        std::fs::write(&t, &out.stdout).unwrap();
        let out = ok(
            ucrypt_bin(),
            &["read", "--table-file", s(&t), "--length", &DATA.to_string()],
        );
        assert!(
            out.stdout == self.plain,
            "{} does not serve the plaintext",
            p.dev.display()
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
}

/// Same JSON bytes, same binary header fields but seqid/checksum, same data.
fn assert_same(a: &Pair, b: &Pair) {
    assert_eq!(json(&a.hdr), json(&b.hdr), "JSON metadata differs");
    let (x, y) = (
        std::fs::read(&a.hdr).unwrap(),
        std::fs::read(&b.hdr).unwrap(),
    );
    for copy in [0usize, 16384] {
        assert_eq!(x[copy..copy + 16], y[copy..copy + 16]);
        assert_eq!(x[copy + 24..copy + 448], y[copy + 24..copy + 448]);
    }
    assert!(
        std::fs::read(&a.dev).unwrap() == std::fs::read(&b.dev).unwrap(),
        "data of {} and {} differ",
        a.dev.display(),
        b.dev.display()
    );
}

#[test]
fn encrypt_init_has_cryptsetups_shape() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    let cases: [&[&str]; 4] = [
        &["--resilience", "checksum"],
        &["--resilience", "journal"],
        &["--resilience", "none"],
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
            "enc-test",
            "--resilience-hash",
            "sha512",
            "--key-slot",
            "3",
        ],
    ];
    for (i, extra) in cases.iter().enumerate() {
        let uc = f.init_encrypt("ucrypt", &format!("uc{i}"), extra);
        let cs = f.init_encrypt("cryptsetup", &format!("cs{i}"), extra);
        assert_eq!(shape(&uc.hdr), shape(&cs.hdr), "case {extra:?}");
        // Neither touched the data.
        assert!(std::fs::read(&uc.dev).unwrap() == f.plain);
        let j = json(&uc.hdr);
        assert!(
            j.contains("\"mode\":\"encrypt\"") && j.contains("\"direction\":\"forward\""),
            "{j}"
        );
    }
    // The header carries the UUID and label asked for.
    let b = std::fs::read(f.path("uc3.hdr")).unwrap();
    assert!(b[24..72].starts_with(b"enc-test\0"));
    assert!(b[168..208].starts_with(b"3f1b2e4c-8f5e-4a2b-9c3d-112233445566\0"));
}

#[test]
fn encryption_equals_cryptsetups_and_either_tool_finishes_the_other() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    for resilience in ["checksum", "journal", "none"] {
        let init = f.init_encrypt(
            "ucrypt",
            &format!("init-{resilience}"),
            &["--resilience", resilience],
        );
        let reference = f.copy(&init, "reference");
        f.cryptsetup_resume(&reference);
        let uc = f.copy(&init, "uc");
        let out = f.ucrypt_resume(&uc, &[]);
        assert!(String::from_utf8_lossy(&out.stderr).contains("Finished"));
        assert!(!json(&uc.hdr).contains("reencrypt"), "{}", json(&uc.hdr));
        assert_same(&reference, &uc);
        f.assert_serves_plain(&uc);

        // ucrypt stops after 8 MiB (the layout is cryptsetup's: encrypted, then linear);
        // cryptsetup finishes.
        let a = f.copy(&init, "a");
        f.ucrypt_resume(&a, &["--debug-stop-after", "8M"]);
        let j = json(&a.hdr);
        assert!(
            j.contains("\"0\":{\"type\":\"crypt\",\"offset\":\"0\",\"size\":\"8388608\"")
                && j.contains(
                    "\"1\":{\"type\":\"linear\",\"offset\":\"8388608\",\"size\":\"dynamic\"}"
                ),
            "{j}"
        );
        f.cryptsetup_resume(&a);
        assert_same(&reference, &a);
    }
}

#[test]
fn decryption_equals_cryptsetups_and_either_tool_finishes_the_other() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    for resilience in ["checksum", "journal"] {
        let init = f.init_decrypt(&format!("init-{resilience}"), resilience);
        // cryptsetup's own --decrypt --init-only writes the same shape.
        let cs_init = f.init_encrypt("ucrypt", &format!("csinit-{resilience}"), &[]);
        f.cryptsetup_resume(&cs_init);
        ok(
            "cryptsetup",
            &[
                "reencrypt",
                "--decrypt",
                "--init-only",
                "--force-offline-reencrypt",
                "-q",
                "--header",
                s(&cs_init.hdr),
                "--key-file",
                s(&f.key),
                "--resilience",
                resilience,
                s(&cs_init.dev),
            ],
        );
        let j = json(&init.hdr);
        assert!(j.contains("\"direction\":\"backward\""), "{j}");
        assert_eq!(shape(&init.hdr), shape(&cs_init.hdr));

        let reference = f.copy(&init, "reference");
        f.cryptsetup_resume(&reference);
        let uc = f.copy(&init, "uc");
        f.ucrypt_resume(&uc, &[]);
        assert_same(&reference, &uc);
        assert!(
            std::fs::read(&uc.dev).unwrap() == f.plain,
            "not the plaintext again"
        );
        assert!(json(&uc.hdr).contains("\"segments\":{\"0\":{\"type\":\"linear\""));

        // ucrypt stops after 8 MiB: the last 8 MiB are plaintext (backward).
        let a = f.copy(&init, "a");
        f.ucrypt_resume(&a, &["--debug-stop-after", "8M"]);
        let j = json(&a.hdr);
        let left = (DATA - (8 << 20)).to_string();
        assert!(
            j.contains(&format!("\"size\":\"{left}\""))
                && j.contains(&format!(
                    "\"1\":{{\"type\":\"linear\",\"offset\":\"{left}\""
                )),
            "{j}"
        );
        assert!(std::fs::read(&a.dev).unwrap()[DATA - (8 << 20)..] == f.plain[DATA - (8 << 20)..]);
        f.cryptsetup_resume(&a);
        assert_same(&reference, &a);

        // ucrypt runs a decryption cryptsetup initialised.
        let b = f.copy(&cs_init, "b");
        f.ucrypt_resume(&b, &[]);
        assert!(std::fs::read(&b.dev).unwrap() == f.plain);
    }
}

/// Kills ucrypt at hotzone 2's "post" header (its 23rd pwrite: per hotzone one resilience
/// write, 6 for the "hot" header, one data write, 6 for the "post" header) and cryptsetup at
/// hotzone 2's data write; the other tool recovers and finishes.
#[test]
fn a_run_killed_mid_hotzone_is_recovered_by_either_tool() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    let mut cases = Vec::new();
    for resilience in ["checksum", "journal"] {
        cases.push((
            "encrypt",
            resilience,
            f.init_encrypt(
                "ucrypt",
                &format!("e-{resilience}"),
                &["--resilience", resilience],
            ),
        ));
        cases.push((
            "decrypt",
            resilience,
            f.init_decrypt(&format!("d-{resilience}"), resilience),
        ));
    }
    for (mode, resilience, init) in &cases {
        let what = format!("{mode} {resilience}");
        let reference = f.copy(init, "reference");
        f.cryptsetup_resume(&reference);

        let crashed = f.copy(init, "crashed");
        f.killed_at(
            "pwrite64",
            23,
            ucrypt_bin(),
            &f.ucrypt_resume_args(&crashed),
        );
        assert!(json(&crashed.hdr).contains("in-reencryption"), "{what}");
        let by_cs = f.copy(&crashed, "by-cs");
        f.cryptsetup_resume(&by_cs);
        assert_same(&reference, &by_cs);
        f.ucrypt_resume(&crashed, &[]);
        assert_same(&reference, &crashed);

        // cryptsetup killed at its second hotzone's data write (a traced run on a scratch
        // copy says which write that is: the second 4 MiB one, the fourth with the
        // journal, which copies each hotzone).
        let scratch = f.copy(init, "scratch");
        let log = f.path("writes.log");
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
        let cs_args = f.cryptsetup_resume_args(&scratch);
        args.extend_from_slice(&cs_args);
        ok("strace", &args);
        let big: Vec<usize> = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .filter(|l| l.contains("write("))
            .enumerate()
            .filter(|(_, l)| l.trim_end().ends_with("= 4194304"))
            .map(|(i, _)| i + 1)
            .collect();
        let nth = if *resilience == "journal" {
            big[3]
        } else {
            big[1]
        };
        let cs_crashed = f.copy(init, "cs-crashed");
        f.killed_at(
            "write",
            nth,
            "cryptsetup",
            &f.cryptsetup_resume_args(&cs_crashed),
        );
        assert!(json(&cs_crashed.hdr).contains("in-reencryption"), "{what}");
        f.ucrypt_resume(&cs_crashed, &[]);
        assert!(
            std::fs::read(&reference.dev).unwrap() == std::fs::read(&cs_crashed.dev).unwrap(),
            "{what}: data differs after ucrypt recovered cryptsetup's crash"
        );
        assert!(!json(&cs_crashed.hdr).contains("reencrypt"));
    }
}

#[test]
fn what_cryptsetup_refuses_is_refused() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    let p = f.plain_device("plain");
    let k = s(&f.key);
    let refused = |args: &[&str], why: &str| {
        let out = run(ucrypt_bin(), args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(why), "{args:?}: {err}");
    };
    let dev = s(&p.dev);
    let hdr = s(&p.hdr);
    refused(
        &[
            "reencrypt",
            "--encrypt",
            "-q",
            "-d",
            k,
            "--disable-locks",
            dev,
        ],
        "not possible without data device size reduction",
    );
    refused(
        &[
            "reencrypt",
            "--encrypt",
            "--type",
            "plain",
            "--header",
            hdr,
            "-q",
            "-d",
            k,
            dev,
        ],
        "luks1 and luks2",
    );
    refused(
        &[
            "reencrypt",
            "--decrypt",
            "-q",
            "-d",
            k,
            "--disable-locks",
            dev,
        ],
        "requires --header",
    );
    // An existing LUKS header is not overwritten; the data is untouched.
    let e = f.init_encrypt("ucrypt", "enc", &[]);
    f.ucrypt_resume(&e, &[]);
    let before = std::fs::read(&e.hdr).unwrap();
    refused(
        &[
            "reencrypt",
            "--encrypt",
            "-q",
            "--header",
            s(&e.hdr),
            "-d",
            k,
            "--disable-locks",
            s(&e.dev),
        ],
        "already LUKS device",
    );
    assert!(std::fs::read(&e.hdr).unwrap() == before);
    refused(
        &[
            "reencrypt",
            "--decrypt",
            "--resilience",
            "none",
            "-q",
            "--header",
            s(&e.hdr),
            "-d",
            k,
            "--disable-locks",
            s(&e.dev),
        ],
        "cannot be applied",
    );
    // An encryption in progress is not resumed as a decryption.
    let i = f.init_encrypt("ucrypt", "inprogress", &[]);
    refused(
        &[
            "reencrypt",
            "--decrypt",
            "-q",
            "--header",
            s(&i.hdr),
            "-d",
            k,
            "--disable-locks",
            s(&i.dev),
        ],
        "Conflicting option --decrypt",
    );
    // Initialised but not started, the volume opens as cryptsetup maps it: its one data
    // segment, linear (all of it is still plaintext; reencrypt_open.rs has the halfway
    // states).
    let out = ok(
        ucrypt_bin(),
        &[
            "luksOpen",
            "--print-table",
            "--header",
            s(&i.hdr),
            "-d",
            k,
            s(&i.dev),
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("0 {} linear {} 0\n", DATA / 512, s(&i.dev))
    );
}

/// `--keep-key` on a LUKS2 image (cryptsetup's own re-keying run of it is compared in
/// `reencrypt.rs`): the metadata `--init-only` writes has the shape of cryptsetup's (the
/// old and new segments bound to the one digest), and cryptsetup's refusals are ucrypt's.
#[test]
fn keep_key_init_has_cryptsetups_shape() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    let k = s(&f.key);
    let image = |name: &str| {
        let p = f.path(name);
        std::fs::File::create(&p)
            .unwrap()
            .set_len(40 << 20)
            .unwrap();
        let mut args = vec!["luksFormat", "-q", "--type", "luks2", "--key-file", k];
        args.extend_from_slice(&PBKDF);
        args.push(s(&p));
        ok("cryptsetup", &args);
        p
    };
    let uc = image("uc.img");
    let cs = f.path("cs.img");
    std::fs::copy(&uc, &cs).unwrap();
    let keep = [
        "reencrypt",
        "--keep-key",
        "--init-only",
        "-q",
        "--sector-size",
        "512",
    ];
    let mut args = keep.to_vec();
    args.extend_from_slice(&["-d", k, "--disable-locks", s(&uc)]);
    ok(ucrypt_bin(), &args);
    let mut args = keep.to_vec();
    args.extend_from_slice(&["--key-file", k, "--force-offline-reencrypt", s(&cs)]);
    ok("cryptsetup", &args);
    assert_eq!(shape(&uc), shape(&cs));
    let j = json(&uc);
    assert!(j.contains("\"segments\":[\"0\",\"1\",\"2\"]"), "{j}");

    // Nothing to change: refused as by cryptsetup (exit 1). A key size change: refused
    // (cryptsetup 2.6.1 ignores -s with --keep-key and keeps the key's size). Nothing
    // written either way.
    let other = image("other.img");
    let before = std::fs::read(&other).unwrap();
    for extra in [&[][..], &["-s", "256", "--sector-size", "512"][..]] {
        let mut args = vec!["reencrypt", "--keep-key", "-q", "-d", k, "--disable-locks"];
        args.extend_from_slice(extra);
        args.push(s(&other));
        let out = run(ucrypt_bin(), &args);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {out:?}");
        assert!(std::fs::read(&other).unwrap() == before);
        if extra.is_empty() {
            let cs_args = [
                "reencrypt",
                "--keep-key",
                "-q",
                "--key-file",
                k,
                "--force-offline-reencrypt",
                s(&other),
            ];
            let cs_out = run("cryptsetup", &cs_args);
            assert_eq!(cs_out.status.code(), Some(1), "cryptsetup: {cs_out:?}");
        }
    }
}

/// `--device-size` (cryptsetup's fixed-length mode): only that much of the data area is
/// re-encrypted, the segments carry fixed sizes meanwhile; ucrypt's run, and ucrypt stopped
/// half-way then cryptsetup finishing, equal cryptsetup's run; bad sizes are refused.
#[test]
fn device_size_equals_cryptsetups() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    let k = s(&f.key);
    let init = f.path("init.img");
    std::fs::File::create(&init)
        .unwrap()
        .set_len(40 << 20)
        .unwrap();
    let mut args = vec!["luksFormat", "-q", "--type", "luks2", "--key-file", k];
    args.extend_from_slice(&PBKDF);
    args.push(s(&init));
    ok("cryptsetup", &args);
    let mut args = vec![
        "reencrypt",
        "--init-only",
        "-q",
        "-d",
        k,
        "--device-size",
        "8M",
    ];
    args.extend_from_slice(&PBKDF);
    args.extend_from_slice(&["--disable-locks", s(&init)]);
    ok(ucrypt_bin(), &args);
    let copy = |name: &str| {
        let p = f.path(name);
        std::fs::copy(&init, &p).unwrap();
        p
    };
    let cs_run = |img: &Path| {
        ok(
            "cryptsetup",
            &[
                "reencrypt",
                "--resume-only",
                "--force-offline-reencrypt",
                "-q",
                "--key-file",
                k,
                "--device-size",
                "8M",
                "--hotzone-size",
                "2M",
                s(img),
            ],
        );
    };
    let uc_run = |img: &Path, extra: &[&str]| {
        let mut args = vec!["reencrypt", "--resume-only", "-q", "-d", k];
        args.extend_from_slice(&["--device-size", "8M", "--hotzone-size", "2M"]);
        args.extend_from_slice(&["--disable-locks", s(img)]);
        args.extend_from_slice(extra);
        ok(ucrypt_bin(), &args)
    };
    let reference = copy("reference.img");
    cs_run(&reference);
    let same = |a: &Path, b: &Path| {
        assert_eq!(json(a), json(b), "JSON differs");
        let (x, y) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
        assert!(x[16 << 20..] == y[16 << 20..], "data areas differ");
    };
    let uc = copy("uc.img");
    uc_run(&uc, &[]);
    same(&reference, &uc);
    // Past 8 MiB the data is as it was (cryptsetup leaves it; the header says otherwise).
    let before = std::fs::read(&init).unwrap();
    assert!(std::fs::read(&uc).unwrap()[24 << 20..] == before[24 << 20..]);
    assert!(std::fs::read(&uc).unwrap()[16 << 20..24 << 20] != before[16 << 20..24 << 20]);

    let half = copy("half.img");
    uc_run(&half, &["--debug-stop-after", "4M"]);
    let j = json(&half);
    assert!(
        j.contains("\"1\":{\"type\":\"crypt\",\"offset\":\"20971520\",\"size\":\"4194304\""),
        "{j}"
    );
    cs_run(&half);
    same(&reference, &half);

    for (size, why) in [
        ("64M", "larger than real device size"),
        ("1000", "multiple of 512"),
    ] {
        let img = copy("bad.img");
        let out = run(
            ucrypt_bin(),
            &[
                "reencrypt",
                "--resume-only",
                "-q",
                "-d",
                k,
                "--device-size",
                size,
                "--disable-locks",
                s(&img),
            ],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{size}: {err}");
        assert!(err.contains(why), "{size}: {err}");
        assert!(std::fs::read(&img).unwrap() == before);
    }
}
