//! `ucrypt reencrypt` against the real cryptsetup (2.6, which re-encrypts image files
//! offline in userspace with `--force-offline-reencrypt`):
//!
//! - from the same initialised image, ucrypt's result equals cryptsetup's: the JSON
//!   metadata byte for byte, the binary headers but for `seqid`/checksum, the data area and
//!   the new keyslot's area;
//! - a run ucrypt stopped is finished by cryptsetup, and the reverse;
//! - a run killed mid-hotzone (strace injects SIGKILL at the hotzone's data write) by
//!   either tool is recovered by either tool, also with the hotzone half rewritten;
//! - altered reencryption parameters are refused (the reencryption digest).
//!
//! Images are 40 MiB (24 MiB of data), PBKDF costs minimal, hotzones 4 MiB.
#![allow(clippy::unwrap_used)]

mod common;

use common::cmd::{ok, run};

use common::{luks2_format_args, require, Rng};
use std::path::{Path, PathBuf};
use std::process::Output;
use ucrypt_testkit::luks2_json as json;

const PASS: &[u8] = b"reencrypt test passphrase";
const DATA_OFFSET: u64 = 16 << 20;
const DATA: usize = 24 << 20;

fn ucrypt_bin() -> &'static str {
    env!("CARGO_BIN_EXE_ucrypt")
}

fn tools() -> bool {
    require("cryptsetup") && require("strace")
}

struct Fixture {
    dir: tempfile::TempDir,
    key: PathBuf,
    plain: Vec<u8>,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("pass");
        std::fs::write(&key, PASS).unwrap();
        let mut plain = vec![0u8; DATA];
        Rng::new(0x5eed_0016).fill(&mut plain);
        Fixture { dir, key, plain }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn s(p: &Path) -> &str {
        p.to_str().unwrap()
    }

    /// A cryptsetup-formatted image holding the fixture's plaintext, then the reencryption
    /// metadata written by `ucrypt reencrypt --init-only` with `extra` options.
    fn initialised(&self, name: &str, resilience: &str, extra: &[&str]) -> PathBuf {
        let img = self.path(name);
        std::fs::File::create(&img)
            .unwrap()
            .set_len(DATA_OFFSET + DATA as u64)
            .unwrap();
        ok(
            "cryptsetup",
            &luks2_format_args(Self::s(&self.key), &[], Self::s(&img)),
        );
        self.write_plain(&img);
        let mut args = vec![
            "reencrypt",
            "--init-only",
            "-q",
            "-d",
            Self::s(&self.key),
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--resilience",
            resilience,
            "--disable-locks",
            Self::s(&img),
        ];
        args.extend_from_slice(extra);
        ok(ucrypt_bin(), &args);
        assert!(json(&img).contains("online-reencrypt-v2"));
        img
    }

    fn table(&self, img: &Path) -> PathBuf {
        let out = ok(
            ucrypt_bin(),
            &[
                "luksOpen",
                "--print-table",
                "--showkeys",
                "-d",
                Self::s(&self.key),
                Self::s(img),
            ],
        );
        let t = self.path(&format!(
            "{}.table",
            img.file_name().unwrap().to_str().unwrap()
        ));
        std::fs::write(&t, &out.stdout).unwrap();
        t
    }

    fn write_plain(&self, img: &Path) {
        let input = self.path("plain.bin");
        std::fs::write(&input, &self.plain).unwrap();
        let t = self.table(img);
        ok(
            ucrypt_bin(),
            &[
                "write",
                "--table-file",
                Self::s(&t),
                "--input",
                Self::s(&input),
            ],
        );
    }

    /// The plaintext the volume (reencrypted to the end) serves equals what was written.
    fn assert_plain(&self, img: &Path) {
        let t = self.table(img);
        let out = ok(
            ucrypt_bin(),
            &[
                "read",
                "--table-file",
                Self::s(&t),
                "--length",
                &DATA.to_string(),
            ],
        );
        assert!(
            out.stdout == self.plain,
            "{} reads back different plaintext",
            img.display()
        );
    }

    fn copy(&self, img: &Path, name: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::copy(img, &p).unwrap();
        p
    }

    fn ucrypt_resume(&self, img: &Path, extra: &[&str]) -> Output {
        let mut args = vec![
            "reencrypt",
            "--resume-only",
            "-q",
            "-d",
            Self::s(&self.key),
            "--hotzone-size",
            "4M",
            "--disable-locks",
            Self::s(img),
        ];
        args.extend_from_slice(extra);
        ok(ucrypt_bin(), &args)
    }

    fn cryptsetup_resume(&self, img: &Path) {
        if self.in_crash_state(img) {
            // cryptsetup's CLI recovers a crashed hotzone in `repair`, not in `reencrypt`.
            ok(
                "cryptsetup",
                &[
                    "repair",
                    "-q",
                    "--key-file",
                    Self::s(&self.key),
                    Self::s(img),
                ],
            );
            assert!(!self.in_crash_state(img));
        }
        ok(
            "cryptsetup",
            &[
                "reencrypt",
                "--resume-only",
                "--force-offline-reencrypt",
                "-q",
                "--key-file",
                Self::s(&self.key),
                "--hotzone-size",
                "4M",
                Self::s(img),
            ],
        );
    }

    /// Runs `cmd` under strace, killed (SIGKILL on entry) at its `nth` `syscall`.
    fn killed_at(&self, syscall: &str, nth: u32, cmd: &str, args: &[&str]) {
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

    fn in_crash_state(&self, img: &Path) -> bool {
        json(img).contains("in-reencryption")
    }
}

/// Field by field: both JSON areas equal, binary headers equal but for seqid and checksum,
/// data areas equal, and the new keyslot's area equal.
fn assert_same(a: &Path, b: &Path) {
    let x = std::fs::read(a).unwrap();
    let y = std::fs::read(b).unwrap();
    assert_eq!(x.len(), y.len());
    for copy in [0usize, 16384] {
        let (hx, hy) = (&x[copy..copy + 4096], &y[copy..copy + 4096]);
        assert_eq!(hx[..16], hy[..16], "magic/version/hdr_size");
        assert_eq!(
            hx[24..448],
            hy[24..448],
            "label, csum_alg, salt, uuid, subsystem, hdr_offset"
        );
        let (jx, jy) = (&x[copy + 4096..copy + 16384], &y[copy + 4096..copy + 16384]);
        assert!(
            jx == jy,
            "JSON differs:\n{}\n{}",
            String::from_utf8_lossy(jx.split(|&c| c == 0).next().unwrap()),
            String::from_utf8_lossy(jy.split(|&c| c == 0).next().unwrap())
        );
    }
    let json: serde_json::Value =
        serde_json::from_slice(x[4096..16384].split(|&c| c == 0).next().unwrap()).unwrap();
    for (_, ks) in json["keyslots"].as_object().unwrap() {
        let off: usize = ks["area"]["offset"].as_str().unwrap().parse().unwrap();
        let len: usize = ks["area"]["size"].as_str().unwrap().parse().unwrap();
        assert!(
            x[off..off + len] == y[off..off + len],
            "keyslot area at {off} differs"
        );
    }
    assert!(
        x[DATA_OFFSET as usize..] == y[DATA_OFFSET as usize..],
        "data areas of {} and {} differ",
        a.display(),
        b.display()
    );
}

#[test]
fn result_equals_cryptsetups_for_each_resilience_and_a_new_cipher_shape() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    let cases: [(&str, &[&str]); 5] = [
        ("checksum", &[]),
        ("journal", &[]),
        ("none", &[]),
        // The same key, a new sector size: one digest on both sides, no keyslot removed.
        ("checksum", &["--keep-key", "--sector-size", "512"]),
        (
            "checksum",
            &[
                "-s",
                "256",
                "--sector-size",
                "512",
                "--resilience-hash",
                "sha512",
            ],
        ),
    ];
    for (i, (resilience, extra)) in cases.iter().enumerate() {
        let init = f.initialised(&format!("init{i}.img"), resilience, extra);
        let cs = f.copy(&init, &format!("cs{i}.img"));
        let uc = f.copy(&init, &format!("uc{i}.img"));
        f.cryptsetup_resume(&cs);
        let out = f.ucrypt_resume(&uc, &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("Finished, time") && err.contains("MiB/s"),
            "{err}"
        );
        assert!(!json(&uc).contains("reencrypt"), "{}", json(&uc));
        assert_same(&cs, &uc);
        f.assert_plain(&uc);
    }
}

#[test]
fn a_run_stopped_by_either_tool_is_finished_by_the_other() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    for resilience in ["checksum", "journal", "none"] {
        let init = f.initialised(&format!("init-{resilience}.img"), resilience, &[]);
        let reference = f.copy(&init, "reference.img");
        f.cryptsetup_resume(&reference);

        // ucrypt stops cleanly after 8 MiB; cryptsetup finishes.
        let a = f.copy(&init, "a.img");
        f.ucrypt_resume(&a, &["--debug-stop-after", "8M"]);
        let j = json(&a);
        assert!(
            j.contains("\"size\":\"8388608\"") && j.contains("online-reencrypt-v2"),
            "{j}"
        );
        f.cryptsetup_resume(&a);
        assert_same(&reference, &a);

        // ucrypt stops, ucrypt resumes, with --progress-json.
        let b = f.copy(&init, "b.img");
        f.ucrypt_resume(&b, &["--debug-stop-after", "12M"]);
        let out = f.ucrypt_resume(&b, &["--progress-json"]);
        let last: serde_json::Value =
            serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap())
                .unwrap();
        // Counted from where this run started, as the bar is.
        assert_eq!(last["device_bytes"], last["device_size"]);
        assert_eq!(last["device_size"], (DATA - (12 << 20)).to_string());
        assert_same(&reference, &b);
    }
}

#[test]
fn a_run_killed_mid_hotzone_is_recovered_by_either_tool() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    for resilience in ["checksum", "journal"] {
        let init = f.initialised(&format!("init-{resilience}.img"), resilience, &[]);
        let reference = f.copy(&init, "reference.img");
        f.cryptsetup_resume(&reference);

        // ucrypt killed as its I/O thread starts hotzone 2's "post" header (its 23rd
        // pwrite, strace counting per thread: per hotzone, in order, one resilience write,
        // 6 for the "hot" header (two copies, each binary header, JSON, binary header), one
        // data write (synced), 6 for the "post" header; the other threads only read). On
        // disk: hotzone [4M, 8M) marked in-reencryption, its data all new. From that, by
        // copying the old ciphertext back from the initialised image: the hotzone all old
        // (killed before the data write), and torn (first half new, the rest old).
        let crashed = f.copy(&init, "crashed.img");
        f.killed_at(
            "pwrite64",
            23,
            ucrypt_bin(),
            &[
                "reencrypt",
                "--resume-only",
                "-q",
                "-d",
                Fixture::s(&f.key),
                "--hotzone-size",
                "4M",
                "--disable-locks",
                Fixture::s(&crashed),
            ],
        );
        assert!(f.in_crash_state(&crashed), "{}", json(&crashed));
        let with_old = |name: &str, from: u64, len: usize| {
            use std::os::unix::fs::FileExt;
            let img = f.copy(&crashed, name);
            let r = std::fs::File::open(&init).unwrap();
            let t = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
            let mut old = vec![0u8; len];
            r.read_exact_at(&mut old, DATA_OFFSET + from).unwrap();
            t.write_all_at(&old, DATA_OFFSET + from).unwrap();
            img
        };
        let variants = [
            f.copy(&crashed, "all-new.img"),
            with_old("all-old.img", 4 << 20, 4 << 20),
            with_old("torn.img", 6 << 20, 2 << 20),
        ];
        for v in &variants {
            let by_cs = f.copy(v, "by-cs.img");
            f.cryptsetup_resume(&by_cs);
            assert_same(&reference, &by_cs);
            f.ucrypt_resume(v, &[]);
            assert_same(&reference, v);
        }

        // cryptsetup killed as it writes hotzone 2's data; ucrypt recovers and finishes.
        // Which write that is comes from a traced run on a scratch copy: the second 4 MiB
        // data write (the fourth 4 MiB write with the journal, which copies each hotzone).
        let scratch = f.copy(&init, "scratch.img");
        let log = f.path("writes.log");
        ok(
            "strace",
            &[
                "-f",
                "-s",
                "0",
                "-e",
                "trace=write",
                "-o",
                Fixture::s(&log),
                "cryptsetup",
                "reencrypt",
                "--resume-only",
                "--force-offline-reencrypt",
                "-q",
                "--key-file",
                Fixture::s(&f.key),
                "--hotzone-size",
                "4M",
                Fixture::s(&scratch),
            ],
        );
        let writes: Vec<String> = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .filter(|l| l.contains("write("))
            .map(str::to_string)
            .collect();
        let big: Vec<usize> = writes
            .iter()
            .enumerate()
            .filter(|(_, l)| l.trim_end().ends_with("= 4194304"))
            .map(|(i, _)| i + 1)
            .collect();
        let nth = if resilience == "journal" {
            big[3]
        } else {
            big[1]
        };
        let cs_crashed = f.copy(&init, "cs-crashed.img");
        f.killed_at(
            "write",
            u32::try_from(nth).unwrap(),
            "cryptsetup",
            &[
                "reencrypt",
                "--resume-only",
                "--force-offline-reencrypt",
                "-q",
                "--key-file",
                Fixture::s(&f.key),
                "--hotzone-size",
                "4M",
                Fixture::s(&cs_crashed),
            ],
        );
        assert!(f.in_crash_state(&cs_crashed), "{}", json(&cs_crashed));
        f.ucrypt_resume(&cs_crashed, &[]);
        // cryptsetup re-created the reencryption digest when it started (its id differs),
        // and the old keyslot's wipe is random: compare the data and the plaintext.
        let x = std::fs::read(&reference).unwrap();
        let y = std::fs::read(&cs_crashed).unwrap();
        assert!(x[DATA_OFFSET as usize..] == y[DATA_OFFSET as usize..]);
        assert!(!json(&cs_crashed).contains("reencrypt"));
        f.assert_plain(&cs_crashed);
    }
}

#[test]
fn altered_reencryption_parameters_are_refused() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    let init = f.initialised("init.img", "checksum", &[]);
    // Change the checksum block size in both header copies (checksums recomputed): the
    // reencryption digest no longer matches.
    {
        use ucrypt_format::luks2::disk::Header;
        use ucrypt_format::luks2::json::Json;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&init)
            .unwrap();
        let mut h = Header::read(&file, "init.img").unwrap();
        let ks = h.json.get_mut("keyslots").unwrap().get_mut("2").unwrap();
        ks.get_mut("area")
            .unwrap()
            .set("sector_size", Json::int(512));
        h.write(&file, "init.img").unwrap();
    }
    let out = run(
        ucrypt_bin(),
        &[
            "reencrypt",
            "--resume-only",
            "-q",
            "-d",
            Fixture::s(&f.key),
            "--disable-locks",
            Fixture::s(&init),
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("reencryption digest does not match"),
        "{err}"
    );
    // cryptsetup refuses it too.
    let out = run(
        "cryptsetup",
        &[
            "reencrypt",
            "--resume-only",
            "--force-offline-reencrypt",
            "-q",
            "--key-file",
            Fixture::s(&f.key),
            Fixture::s(&init),
        ],
    );
    assert!(!out.status.success());
    // Wrong passphrase: exit 2, nothing changed.
    let bad = f.path("bad");
    std::fs::write(&bad, b"wrong").unwrap();
    let before = std::fs::read(&init).unwrap();
    let out = run(
        ucrypt_bin(),
        &[
            "reencrypt",
            "--resume-only",
            "-q",
            "-d",
            Fixture::s(&bad),
            "--disable-locks",
            Fixture::s(&init),
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::read(&init).unwrap() == before);
}

#[test]
fn a_volume_mid_reencryption_is_served_as_two_segments_and_written_through() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    let img = f.initialised("mid.img", "checksum", &[]);
    f.ucrypt_resume(&img, &["--debug-stop-after", "8M"]);
    // Two crypt targets: [0, 8 MiB) under the new key, the rest under the old one.
    let out = ok(
        ucrypt_bin(),
        &[
            "luksOpen",
            "--print-table",
            "-d",
            Fixture::s(&f.key),
            Fixture::s(&img),
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].starts_with("0 16384 crypt aes-xts-plain64 "),
        "{text}"
    );
    assert!(
        lines[1].starts_with("16384 32768 crypt aes-xts-plain64 "),
        "{text}"
    );
    assert!(
        lines[1].contains(" 16384 ") && lines[1].ends_with(" 49152 1 sector_size:4096"),
        "{text}"
    );
    f.assert_plain(&img);
    // A write across the boundary goes to both keys; the finished volume has it.
    let patch: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
    let at = (8usize << 20) - (512 << 10);
    let input = f.path("patch.bin");
    std::fs::write(&input, &patch).unwrap();
    let t = f.table(&img);
    ok(
        ucrypt_bin(),
        &[
            "write",
            "--table-file",
            Fixture::s(&t),
            "--offset",
            &at.to_string(),
            "--input",
            Fixture::s(&input),
        ],
    );
    f.cryptsetup_resume(&img);
    let t = f.table(&img);
    let out = ok(
        ucrypt_bin(),
        &[
            "read",
            "--table-file",
            Fixture::s(&t),
            "--length",
            &DATA.to_string(),
        ],
    );
    let mut want = f.plain.clone();
    want[at..at + patch.len()].copy_from_slice(&patch);
    assert!(
        out.stdout == want,
        "the write across the reencryption boundary was lost"
    );

    // A crashed hotzone is not served until it is recovered.
    let crashed = f.initialised("crashed.img", "journal", &[]);
    f.killed_at(
        "pwrite64",
        8,
        ucrypt_bin(),
        &[
            "reencrypt",
            "--resume-only",
            "-q",
            "-d",
            Fixture::s(&f.key),
            "--hotzone-size",
            "4M",
            "--disable-locks",
            Fixture::s(&crashed),
        ],
    );
    assert!(f.in_crash_state(&crashed));
    let out = run(
        ucrypt_bin(),
        &[
            "luksOpen",
            "--print-table",
            "-d",
            Fixture::s(&f.key),
            Fixture::s(&crashed),
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--resume-only"),
        "{err}"
    );
    // A read-write `ucrypt open` (which holds the image lock) recovers the hotzone first, as
    // cryptsetup's activation does, and maps the volume; the header is clean afterwards.
    let recovered = f.copy(&crashed, "recovered.img");
    let opts = ucrypt::HeaderOptions {
        recover_reencryption: true,
        ..ucrypt::HeaderOptions::default()
    };
    let secret = std::fs::read(&f.key).unwrap();
    let u = ucrypt::unlock(&recovered, &secret, &opts).unwrap();
    assert!(!f.in_crash_state(&recovered), "{}", json(&recovered));
    assert!(u.size_bytes() > 0);
    f.assert_plain(&recovered);
    f.ucrypt_resume(&crashed, &["--debug-stop-after", "4M"]);
    f.assert_plain(&crashed);
}

/// A detached-header volume (`--header`): 16 MiB header file, the data file all data
/// (segment offset 0), initialised by ucrypt, plaintext written first.
fn detached(f: &Fixture, tag: &str, resilience: &str) -> (PathBuf, PathBuf) {
    let (hdr, data) = (
        f.path(&format!("{tag}.hdr")),
        f.path(&format!("{tag}.data")),
    );
    std::fs::File::create(&hdr)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    std::fs::File::create(&data)
        .unwrap()
        .set_len(DATA as u64)
        .unwrap();
    let (h, d, k) = (Fixture::s(&hdr), Fixture::s(&data), Fixture::s(&f.key));
    ok("cryptsetup", &luks2_format_args(k, &["--header", h], d));
    let table = ok(
        ucrypt_bin(),
        &[
            "luksOpen",
            "--print-table",
            "--showkeys",
            "-d",
            k,
            "--header",
            h,
            d,
        ],
    );
    let t = f.path(&format!("{tag}.table"));
    std::fs::write(&t, &table.stdout).unwrap();
    let input = f.path("plain.bin");
    std::fs::write(&input, &f.plain).unwrap();
    ok(
        ucrypt_bin(),
        &[
            "write",
            "--table-file",
            Fixture::s(&t),
            "--input",
            Fixture::s(&input),
        ],
    );
    ok(
        ucrypt_bin(),
        &[
            "reencrypt",
            "--init-only",
            "-q",
            "-d",
            k,
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--resilience",
            resilience,
            "--header",
            h,
            "--disable-locks",
            d,
        ],
    );
    assert!(json(&hdr).contains("online-reencrypt-v2"));
    (hdr, data)
}

fn copy_pair(f: &Fixture, (h, d): &(PathBuf, PathBuf), tag: &str) -> (PathBuf, PathBuf) {
    (
        f.copy(h, &format!("{tag}.hdr")),
        f.copy(d, &format!("{tag}.data")),
    )
}

fn cryptsetup_resume_detached(f: &Fixture, (h, d): &(PathBuf, PathBuf)) {
    let (hs, ds, k) = (Fixture::s(h), Fixture::s(d), Fixture::s(&f.key));
    if f.in_crash_state(h) {
        ok(
            "cryptsetup",
            &["repair", "-q", "--key-file", k, "--header", hs, ds],
        );
    }
    ok(
        "cryptsetup",
        &[
            "reencrypt",
            "--resume-only",
            "--force-offline-reencrypt",
            "-q",
            "--key-file",
            k,
            "--hotzone-size",
            "4M",
            "--header",
            hs,
            ds,
        ],
    );
}

fn ucrypt_resume_detached(f: &Fixture, (h, d): &(PathBuf, PathBuf), extra: &[&str]) {
    let mut args = vec![
        "reencrypt",
        "--resume-only",
        "-q",
        "-d",
        Fixture::s(&f.key),
        "--hotzone-size",
        "4M",
        "--disable-locks",
        "--header",
        Fixture::s(h),
        Fixture::s(d),
    ];
    args.extend_from_slice(extra);
    ok(ucrypt_bin(), &args);
}

/// Header files field by field (as [`assert_same`]), data files byte for byte, and the
/// plaintext read back through the detached header.
fn assert_same_detached(f: &Fixture, a: &(PathBuf, PathBuf), b: &(PathBuf, PathBuf)) {
    assert_same(&a.0, &b.0);
    assert!(
        std::fs::read(&a.1).unwrap() == std::fs::read(&b.1).unwrap(),
        "data files {} and {} differ",
        a.1.display(),
        b.1.display()
    );
    assert!(!json(&b.0).contains("reencrypt"), "{}", json(&b.0));
    let (lines, plain) = read_detached(f, b);
    assert_eq!(lines, 1);
    assert!(
        plain == f.plain,
        "{} reads back different plaintext",
        b.1.display()
    );
}

/// The table `luksOpen --print-table --header` gives for a detached pair (its number of
/// lines) and the plaintext read through it.
fn read_detached(f: &Fixture, (h, d): &(PathBuf, PathBuf)) -> (usize, Vec<u8>) {
    let k = Fixture::s(&f.key);
    let table = ok(
        ucrypt_bin(),
        &[
            "luksOpen",
            "--print-table",
            "--showkeys",
            "-d",
            k,
            "--header",
            Fixture::s(h),
            Fixture::s(d),
        ],
    );
    let t = f.path("detached-check.table");
    std::fs::write(&t, &table.stdout).unwrap();
    let out = ok(
        ucrypt_bin(),
        &[
            "read",
            "--table-file",
            Fixture::s(&t),
            "--length",
            &DATA.to_string(),
        ],
    );
    (
        String::from_utf8_lossy(&table.stdout).lines().count(),
        out.stdout,
    )
}

#[test]
fn a_detached_header_volume_is_reencrypted_as_cryptsetup_does_and_resumed_by_either_tool() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    for resilience in ["checksum", "journal", "none"] {
        let init = detached(&f, &format!("init-{resilience}"), resilience);
        let reference = copy_pair(&f, &init, "reference");
        cryptsetup_resume_detached(&f, &reference);

        // ucrypt alone.
        let u = copy_pair(&f, &init, "u");
        ucrypt_resume_detached(&f, &u, &[]);
        assert_same_detached(&f, &reference, &u);

        // ucrypt stops after 8 MiB (the header file says so); cryptsetup finishes.
        let a = copy_pair(&f, &init, "a");
        ucrypt_resume_detached(&f, &a, &["--debug-stop-after", "8M"]);
        assert!(
            json(&a.0).contains("\"size\":\"8388608\""),
            "{}",
            json(&a.0)
        );
        // Mid-way, the detached pair maps as two segments (new key, old key) and reads back.
        let (lines, plain) = read_detached(&f, &a);
        assert_eq!(lines, 2, "{resilience}: mid-reencryption table");
        assert!(plain == f.plain, "{resilience}: mid-reencryption plaintext");
        cryptsetup_resume_detached(&f, &a);
        assert_same_detached(&f, &reference, &a);
        if resilience == "none" {
            continue;
        }

        // cryptsetup killed as it writes hotzone 2's data (found as in
        // a_run_killed_mid_hotzone_is_recovered_by_either_tool: its 4 MiB writes are the
        // journal copies, into the header file, and the data writes); ucrypt recovers the
        // hotzone from the header file's resilience area and finishes.
        let scratch = copy_pair(&f, &init, "scratch");
        let log = f.path("detached-writes.log");
        let k = Fixture::s(&f.key);
        let cs_args = |p: &(PathBuf, PathBuf)| -> Vec<String> {
            [
                "reencrypt",
                "--resume-only",
                "--force-offline-reencrypt",
                "-q",
                "--key-file",
                k,
                "--hotzone-size",
                "4M",
                "--header",
                Fixture::s(&p.0),
                Fixture::s(&p.1),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect()
        };
        let mut traced = vec!["-f", "-s", "0", "-e", "trace=write", "-o", Fixture::s(&log)];
        traced.push("cryptsetup");
        let sa = cs_args(&scratch);
        traced.extend(sa.iter().map(String::as_str));
        ok("strace", &traced);
        let big: Vec<usize> = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .filter(|l| l.contains("write("))
            .enumerate()
            .filter(|(_, l)| l.trim_end().ends_with("= 4194304"))
            .map(|(i, _)| i + 1)
            .collect();
        let nth = if resilience == "journal" {
            big[3]
        } else {
            big[1]
        };
        let crashed = copy_pair(&f, &init, "cs-crashed");
        let ca = cs_args(&crashed);
        let ca: Vec<&str> = ca.iter().map(String::as_str).collect();
        f.killed_at("write", u32::try_from(nth).unwrap(), "cryptsetup", &ca);
        assert!(f.in_crash_state(&crashed.0), "{}", json(&crashed.0));
        // A read-write open recovers the hotzone from the header file's resilience area
        // and maps the pair; the plaintext is intact.
        let opened = copy_pair(&f, &crashed, "cs-crashed-opened");
        let opts = ucrypt::HeaderOptions {
            header: Some(opened.0.clone()),
            recover_reencryption: true,
            ..ucrypt::HeaderOptions::default()
        };
        let secret = std::fs::read(&f.key).unwrap();
        ucrypt::unlock(&opened.1, &secret, &opts).unwrap();
        assert!(!f.in_crash_state(&opened.0), "{}", json(&opened.0));
        assert!(
            read_detached(&f, &opened).1 == f.plain,
            "{resilience}: recovered plaintext"
        );
        ucrypt_resume_detached(&f, &crashed, &[]);
        // cryptsetup re-created the reencryption digest when it started, and keyslot
        // wipes are random: the data file and the plaintext are what must match.
        assert!(std::fs::read(&reference.1).unwrap() == std::fs::read(&crashed.1).unwrap());
        assert!(!json(&crashed.0).contains("reencrypt"));
    }
}
