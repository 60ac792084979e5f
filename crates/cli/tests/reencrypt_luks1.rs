//! `ucrypt reencrypt` of LUKS1 volumes (cryptsetup 2.6's legacy LUKS1 reencryption) against
//! the real cryptsetup where it needs no kernel:
//!
//! - cryptsetup 2.6.1 without device-mapper writes its whole start state (the
//!   `LUKS-<UUID>.{log,org,new}` files in its working directory, the header marked
//!   `LUKS\xde\xad`) and then fails to activate its temporary mappings: ucrypt's start
//!   state from the same image is the same (log and `.org` byte for byte, the device's
//!   first page byte for byte, the `.new` header's luksDump but for salts and digests,
//!   the files' modes), and ucrypt resumes and finishes cryptsetup's;
//! - ucrypt's result: luksDump fields as before (UUID, offsets, keyslot numbers) with the
//!   new cipher/key, each passphrase accepted by cryptsetup's `--test-passphrase` in its
//!   own slot, the plaintext unchanged, the state files gone;
//! - `--key-slot`, `--keep-key` (header only: the data area byte for byte the same);
//! - kill -9 at random points of ucrypt's pass, resumed by ucrypt: the plaintext reads
//!   back (a seeded number of rounds);
//! - `--decrypt`: the plaintext from the device's first byte, resumed with `--uuid`;
//! - `--encrypt --type luks1` with `--reduce-device-size` (backward) or `--header`;
//! - refusals with cryptsetup's messages and exit codes, compared with cryptsetup's own.
#![allow(clippy::unwrap_used)]

mod common;

use common::{require, Rng};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const DATA: usize = 6 << 20;
const PW1: &[u8] = b"luks1 first passphrase";
const PW2: &[u8] = b"luks1 second passphrase";

fn ucrypt_bin() -> &'static str {
    env!("CARGO_BIN_EXE_ucrypt")
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs `cmd args` in `dir` with `stdin`.
fn run_in(dir: &Path, cmd: &str, args: &[&str], stdin: &[u8]) -> Output {
    common::cmd::piped(Command::new(cmd).args(args).current_dir(dir), stdin)
}

fn ok_in(dir: &Path, cmd: &str, args: &[&str], stdin: &[u8]) -> Output {
    let out = run_in(dir, cmd, args, stdin);
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn lines(p: &[&[u8]]) -> Vec<u8> {
    let mut v = Vec::new();
    for x in p {
        v.extend_from_slice(x);
        v.push(b'\n');
    }
    v
}

struct Fixture {
    dir: tempfile::TempDir,
    plain: Vec<u8>,
}

impl Fixture {
    fn new(seed: u64) -> Fixture {
        let mut plain = vec![0u8; DATA];
        Rng::new(seed).fill(&mut plain);
        Fixture {
            dir: tempfile::tempdir().unwrap(),
            plain,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A working directory of its own (the state files are named by UUID).
    fn subdir(&self, name: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    /// A LUKS1 image (aes-xts-plain64, 2 MiB header) with PW1 in slot 0 and PW2 in slot 5,
    /// holding the fixture's plaintext.
    fn image(&self, name: &str) -> PathBuf {
        let img = self.path(name);
        std::fs::File::create(&img)
            .unwrap()
            .set_len((2 << 20) + DATA as u64)
            .unwrap();
        let k1 = self.path("k1");
        let k2 = self.path("k2");
        std::fs::write(&k1, PW1).unwrap();
        std::fs::write(&k2, PW2).unwrap();
        let d = self.dir.path();
        ok_in(
            d,
            "cryptsetup",
            &[
                "luksFormat",
                "-q",
                "--type",
                "luks1",
                "--pbkdf-force-iterations",
                "1000",
                "--key-file",
                s(&k1),
                s(&img),
            ],
            b"",
        );
        ok_in(
            d,
            "cryptsetup",
            &[
                "luksAddKey",
                "-q",
                "--pbkdf-force-iterations",
                "1000",
                "-S",
                "5",
                "--key-file",
                s(&k1),
                s(&img),
                s(&k2),
            ],
            b"",
        );
        let input = self.path("plain.bin");
        std::fs::write(&input, &self.plain).unwrap();
        let t = self.table(&img, "k1");
        ok_in(
            d,
            ucrypt_bin(),
            &["write", "--table-file", s(&t), "--input", s(&input)],
            b"",
        );
        img
    }

    fn table(&self, img: &Path, key: &str) -> PathBuf {
        let out = ok_in(
            self.dir.path(),
            ucrypt_bin(),
            &[
                "luksOpen",
                "--print-table",
                "--showkeys",
                "-d",
                s(&self.path(key)),
                s(img),
            ],
            b"",
        );
        let t = self.path("table");
        std::fs::write(&t, &out.stdout).unwrap();
        t
    }

    fn assert_plain(&self, img: &Path) {
        for key in ["k1", "k2"] {
            let t = self.table(img, key);
            let out = ok_in(
                self.dir.path(),
                ucrypt_bin(),
                &["read", "--table-file", s(&t), "--length", &DATA.to_string()],
                b"",
            );
            assert!(
                out.stdout == self.plain,
                "{} reads back different plaintext",
                img.display()
            );
        }
    }

    fn copy(&self, img: &Path, to: &Path) -> PathBuf {
        let p = to.join("img");
        std::fs::copy(img, &p).unwrap();
        p
    }
}

/// cryptsetup's luksDump without what differs between two runs of the same operation
/// (salts, digests, iteration counts) and the header's file name.
fn dump(dir: &Path, header: &str) -> String {
    let out = ok_in(dir, "cryptsetup", &["luksDump", header], b"");
    let text = String::from_utf8(out.stdout).unwrap();
    let mut keep = Vec::new();
    let mut skip_cont = false;
    for l in text.lines() {
        let t = l.trim_start();
        if l.starts_with("LUKS header information") {
            continue;
        }
        if t.starts_with("MK digest")
            || t.starts_with("MK salt")
            || t.starts_with("Salt:")
            || t.contains("terations")
        {
            skip_cont = true;
            continue;
        }
        // A continuation line of a hex field.
        if skip_cont && l.starts_with(char::is_whitespace) && !t.contains(':') {
            continue;
        }
        skip_cont = false;
        keep.push(l.to_string());
    }
    keep.join("\n")
}

fn field(dump: &str, name: &str) -> String {
    dump.lines()
        .find(|l| l.starts_with(name))
        .map(|l| l[name.len()..].trim().to_string())
        .unwrap_or_default()
}

fn state_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("LUKS-"))
        .collect();
    v.sort();
    v
}

fn one(dir: &Path, ext: &str) -> PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == ext))
        .unwrap_or_else(|| panic!("no LUKS-*.{ext} in {}", dir.display()))
}

fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

fn first_page(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap()[..4096].to_vec()
}

const REKEY: &[&str] = &[
    "reencrypt",
    "-q",
    "--pbkdf-force-iterations",
    "1000",
    "-c",
    "aes-cbc-essiv:sha256",
    "-s",
    "256",
];

/// cryptsetup 2.6.1 started (and, without device-mapper, stopped at activating its
/// mappings); ucrypt's start state is the same, and ucrypt finishes cryptsetup's.
#[test]
fn start_state_equals_cryptsetups_and_ucrypt_finishes_it() {
    if !require("cryptsetup") {
        return;
    }
    let f = Fixture::new(0x1_0001);
    let img = f.image("img");
    let before = dump(f.dir.path(), s(&img));
    let (a, b) = (f.subdir("cs"), f.subdir("uc"));
    let (ia, ib) = (f.copy(&img, &a), f.copy(&img, &b));
    let stdin = lines(&[PW1, PW2]);
    let cs = run_in(
        &a,
        "cryptsetup",
        REKEY
            .iter()
            .copied()
            .chain(["img"])
            .collect::<Vec<_>>()
            .as_slice(),
        &stdin,
    );
    if cs.status.success() {
        // A kernel with device-mapper: cryptsetup did it all; nothing to compare.
        eprintln!("cryptsetup finished the LUKS1 reencryption itself (device-mapper present); start-state comparison skipped");
        return;
    }
    let mut args: Vec<&str> = REKEY.to_vec();
    args.extend(["--disable-locks", "--debug-stop-after", "0", "img"]);
    let uc = run_in(&b, ucrypt_bin(), &args, &stdin);
    assert_eq!(
        uc.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&uc.stderr)
    );
    assert!(String::from_utf8_lossy(&uc.stderr).contains("Reencryption interrupted"));
    // The same files (ucrypt's journal besides), modes, log and old header.
    let names = state_files(&a);
    assert_eq!(names.len(), 3, "{names:?}");
    let mut ub = state_files(&b);
    ub.retain(|n| !n.ends_with(".ucrypt-journal"));
    assert_eq!(names, ub);
    for ext in ["log", "org", "new"] {
        assert_eq!(mode(&one(&a, ext)), mode(&one(&b, ext)), "mode of .{ext}");
    }
    assert_eq!(mode(&one(&a, "log")), 0o600);
    assert_eq!(
        std::fs::read(one(&a, "log")).unwrap(),
        std::fs::read(one(&b, "log")).unwrap()
    );
    assert_eq!(
        std::fs::read(one(&a, "org")).unwrap(),
        std::fs::read(one(&b, "org")).unwrap()
    );
    assert_eq!(
        std::fs::metadata(one(&a, "new")).unwrap().len(),
        std::fs::metadata(one(&b, "new")).unwrap().len()
    );
    let (pa, pb) = (first_page(&ia), first_page(&ib));
    assert_eq!(
        &pa[..6],
        b"LUKS\xde\xad",
        "cryptsetup marks the header unusable"
    );
    assert_eq!(pa, pb, "the device's first page");
    let new_dump = dump(&a, s(&one(&a, "new")));
    assert_eq!(new_dump, dump(&b, s(&one(&b, "new"))));
    assert_eq!(field(&new_dump, "Cipher mode:"), "cbc-essiv:sha256");
    assert_eq!(field(&new_dump, "UUID:"), field(&before, "UUID:"));
    // Both tools see it in progress: cryptsetup refuses a LUKS2 type for it.
    let conflict = run_in(
        &a,
        "cryptsetup",
        &["reencrypt", "-q", "--type", "luks2", "img"],
        b"",
    );
    let ours = run_in(
        &b,
        ucrypt_bin(),
        &[
            "reencrypt",
            "-q",
            "--type",
            "luks2",
            "--disable-locks",
            "img",
        ],
        b"",
    );
    assert_eq!(conflict.status.code(), ours.status.code());
    assert!(String::from_utf8_lossy(&ours.stderr)
        .contains("Conflicting versions. Device img is in LUKS1 reencryption."));
    assert!(String::from_utf8_lossy(&conflict.stderr)
        .contains("Conflicting versions. Device img is in LUKS1 reencryption."));
    // ucrypt finishes cryptsetup's run (asked once, for any passphrase of the new header).
    let out = ok_in(
        &a,
        ucrypt_bin(),
        &["reencrypt", "-q", "--disable-locks", "img"],
        &lines(&[PW2]),
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("exists, resuming reencryption."));
    assert!(state_files(&a).is_empty(), "{:?}", state_files(&a));
    assert_eq!(dump(&a, "img"), new_dump);
    f.assert_plain(&ia);
    // And its own.
    ok_in(
        &b,
        ucrypt_bin(),
        &["reencrypt", "-q", "--disable-locks", "img"],
        &lines(&[PW1]),
    );
    assert!(state_files(&b).is_empty());
    assert_eq!(dump(&b, "img"), new_dump);
    f.assert_plain(&ib);
}

/// A re-key by ucrypt alone: every active slot's passphrase asked and kept in its slot,
/// the header's fields as cryptsetup's would be, cryptsetup accepts the passphrases.
#[test]
fn rekey_keeps_slots_uuid_and_plaintext() {
    if !require("cryptsetup") {
        return;
    }
    let f = Fixture::new(0x1_0002);
    let img = f.image("img");
    let before = dump(f.dir.path(), s(&img));
    let w = f.subdir("w");
    let img = f.copy(&img, &w);
    let old_key_area = std::fs::read(&img).unwrap()[2 << 20..].to_vec();
    let mut args: Vec<&str> = REKEY.to_vec();
    args.extend([
        "--disable-locks",
        "--block-size",
        "1",
        "--use-fsync",
        "--write-log",
        "img",
    ]);
    ok_in(&w, ucrypt_bin(), &args, &lines(&[PW1, PW2]));
    assert!(state_files(&w).is_empty(), "{:?}", state_files(&w));
    let after = dump(&w, "img");
    for k in [
        "Version:",
        "Payload offset:",
        "UUID:",
        "Key Slot 0:",
        "Key Slot 5:",
        "Key Slot 1:",
    ] {
        assert_eq!(field(&before, k), field(&after, k), "{k}");
    }
    assert_eq!(field(&after, "Cipher mode:"), "cbc-essiv:sha256");
    assert_eq!(field(&after, "MK bits:"), "256");
    for (slot, pw) in [("0", PW1), ("5", PW2)] {
        ok_in(
            &w,
            "cryptsetup",
            &["open", "--test-passphrase", "-S", slot, "img"],
            pw,
        );
    }
    let data = std::fs::read(&img).unwrap()[2 << 20..].to_vec();
    assert_ne!(data, old_key_area, "the data area is re-encrypted");
    f.assert_plain(&img);
}

/// `--key-slot N` keeps only that slot; `--keep-key` changes the header only.
#[test]
fn key_slot_and_keep_key() {
    if !require("cryptsetup") {
        return;
    }
    let f = Fixture::new(0x1_0003);
    let img = f.image("img");
    let w = f.subdir("w");
    let img = f.copy(&img, &w);
    ok_in(
        &w,
        ucrypt_bin(),
        &[
            "reencrypt",
            "-q",
            "--pbkdf-force-iterations",
            "1000",
            "-S",
            "5",
            "--disable-locks",
            "img",
        ],
        &lines(&[PW2]),
    );
    let d = dump(&w, "img");
    assert_eq!(field(&d, "Key Slot 0:"), "DISABLED");
    assert_eq!(field(&d, "Key Slot 5:"), "ENABLED");
    ok_in(
        &w,
        "cryptsetup",
        &["open", "--test-passphrase", "-S", "5", "img"],
        PW2,
    );
    let t = f.table(&img, "k2");
    let out = ok_in(
        &w,
        ucrypt_bin(),
        &["read", "--table-file", s(&t), "--length", &DATA.to_string()],
        b"",
    );
    assert!(out.stdout == f.plain);
    // --keep-key with a new hash: the data area is left byte for byte.
    let data = std::fs::read(&img).unwrap()[2 << 20..].to_vec();
    ok_in(
        &w,
        ucrypt_bin(),
        &[
            "reencrypt",
            "-q",
            "--keep-key",
            "--hash",
            "sha512",
            "--pbkdf-force-iterations",
            "1000",
            "--disable-locks",
            "img",
        ],
        &lines(&[PW2]),
    );
    assert!(state_files(&w).is_empty());
    assert_eq!(std::fs::read(&img).unwrap()[2 << 20..], data[..]);
    assert_eq!(field(&dump(&w, "img"), "Hash spec:"), "sha512");
    ok_in(
        &w,
        "cryptsetup",
        &["open", "--test-passphrase", "-S", "5", "img"],
        PW2,
    );
}

/// kill -9 at random points of ucrypt's pass (and of its resumes), resumed by ucrypt
/// until it finishes: the plaintext reads back every round.
#[test]
fn kill_9_rounds_resumed_by_ucrypt() {
    if !require("cryptsetup") {
        return;
    }
    let (mut rng, seed) = Rng::from_env("UCRYPT_LUKS1_KILL_SEED");
    let rounds: usize = std::env::var("UCRYPT_LUKS1_KILL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let f = Fixture::new(0x1_0004);
    let img = f.image("img");
    let w = f.subdir("w");
    let img = f.copy(&img, &w);
    let (mut kills, mut restored) = (0, 0);
    for round in 0..rounds {
        loop {
            let mut child = Command::new(ucrypt_bin())
                .args([
                    "reencrypt",
                    "-q",
                    "--pbkdf-force-iterations",
                    "1000",
                    "-B",
                    "1",
                    "--disable-locks",
                    "img",
                ])
                .current_dir(&w)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            {
                let mut sin = child.stdin.take().unwrap();
                std::io::Write::write_all(&mut sin, &lines(&[PW1, PW2])).unwrap();
            }
            std::thread::sleep(std::time::Duration::from_millis(rng.next_u64() % 150));
            let killed = child.try_wait().unwrap().is_none() && child.kill().is_ok();
            let out = child.wait_with_output().unwrap();
            restored += String::from_utf8_lossy(&out.stderr)
                .matches("Put back the block")
                .count();
            if killed {
                kills += 1;
                continue;
            }
            assert!(
                out.status.success(),
                "seed {seed} round {round}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            break;
        }
        assert!(
            state_files(&w).is_empty(),
            "seed {seed}: {:?}",
            state_files(&w)
        );
        f.assert_plain(&img);
    }
    eprintln!("LUKS1 kill -9: {rounds} re-keys, {kills} kills, {restored} journaled blocks put back (seed {seed})");
}

/// Refusals as cryptsetup's: same message, same exit code (run against cryptsetup where it
/// refuses before needing the kernel).
#[test]
fn refusals_match_cryptsetups() {
    if !require("cryptsetup") {
        return;
    }
    let f = Fixture::new(0x1_0005);
    let img = f.image("img");
    for (args, msg) in [
        (vec!["--type", "luks2"], "Conflicting versions. Device img is LUKS1."),
        (vec!["--resume-only"], "Device reencryption not in progress."),
        (vec!["-S", "8"], "Key slot is invalid."),
        (
            vec!["--uuid", "80d8515d-f58e-4afc-9854-b742c6dcadd0"],
            "No decryption in progress, provided UUID can be used only to resume suspended decryption process.",
        ),
        (vec!["--type", "luks1", "--active-name", "x"], "Option --active-name can be set only for LUKS2 device."),
    ] {
        let (a, b) = (f.subdir("ra"), f.subdir("rb"));
        f.copy(&img, &a);
        f.copy(&img, &b);
        let mut cs_args = vec!["reencrypt", "-q"];
        cs_args.extend(&args);
        cs_args.push("img");
        let cs = run_in(&a, "cryptsetup", &cs_args, &lines(&[PW1, PW2]));
        let mut uc_args = cs_args.clone();
        uc_args.insert(1, "--disable-locks");
        let uc = run_in(&b, ucrypt_bin(), &uc_args, &lines(&[PW1, PW2]));
        assert!(String::from_utf8_lossy(&cs.stderr).contains(msg), "cryptsetup {args:?}: {}", String::from_utf8_lossy(&cs.stderr));
        assert!(String::from_utf8_lossy(&uc.stderr).contains(msg), "ucrypt {args:?}: {}", String::from_utf8_lossy(&uc.stderr));
        assert_eq!(cs.status.code(), uc.status.code(), "{args:?}");
        assert_eq!(cs.status.code(), Some(1));
        // Nothing written by either.
        assert!(state_files(&a).is_empty() && state_files(&b).is_empty(), "{args:?}");
        assert_eq!(first_page(&a.join("img")), first_page(&img));
        assert_eq!(first_page(&b.join("img")), first_page(&img));
        std::fs::remove_dir_all(&a).unwrap();
        std::fs::remove_dir_all(&b).unwrap();
    }
    // A wrong passphrase leaves nothing behind (exit 2, as cryptsetup's).
    let w = f.subdir("wrong");
    let wi = f.copy(&img, &w);
    let uc = run_in(
        &w,
        ucrypt_bin(),
        &["reencrypt", "-q", "--disable-locks", "img"],
        &lines(&[b"nope", PW2]),
    );
    assert_eq!(
        uc.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&uc.stderr)
    );
    assert!(state_files(&w).is_empty());
    assert_eq!(first_page(&wi), first_page(&img));
}

/// `--decrypt` of a LUKS1 volume as cryptsetup's legacy pass: forward, plaintext written
/// from the device's first byte, the rest (the header's length) zeroed, no header left.
/// Stopped after the first blocks the header is gone: resumed with `--decrypt --uuid`
/// (cryptsetup's spelling), and without `--uuid` the hint names it. The `.new` file is
/// cryptsetup's cipher_null header (UUID cafecafe-..., payload offset 0), and a kill -9
/// mid-pass is finished by ucrypt.
#[test]
fn decrypt_forward_and_resume_with_uuid() {
    if !require("cryptsetup") {
        return;
    }
    let f = Fixture::new(0x1_0006);
    let img = f.image("img");
    let uuid = field(&dump(f.dir.path(), s(&img)), "UUID:");
    let w = f.subdir("w");
    let wi = f.copy(&img, &w);
    let out = run_in(
        &w,
        ucrypt_bin(),
        &[
            "reencrypt",
            "-q",
            "--decrypt",
            "-B",
            "1",
            "--debug-stop-after",
            "2M",
            "--disable-locks",
            "img",
        ],
        &lines(&[PW2]),
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = String::from_utf8(std::fs::read(one(&w, "log")).unwrap()).unwrap();
    assert!(
        log.contains("mode = 2\n") && log.contains("direction = 0\n"),
        "{log}"
    );
    let fake = dump(&w, s(&one(&w, "new")));
    assert_eq!(field(&fake, "Cipher name:"), "cipher_null");
    assert_eq!(field(&fake, "Payload offset:"), "0");
    assert_eq!(
        field(&fake, "UUID:"),
        "cafecafe-cafe-cafe-cafe-cafecafeeeee"
    );
    assert_eq!(
        field(&fake, "Key Slot 5:"),
        "ENABLED",
        "the passphrase's slot"
    );
    assert_ne!(&first_page(&wi)[..6], b"LUKS\xba\xbe");
    let hint = run_in(
        &w,
        ucrypt_bin(),
        &["reencrypt", "-q", "--decrypt", "--disable-locks", "img"],
        &lines(&[PW2]),
    );
    assert_eq!(hint.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&hint.stderr).contains(&format!("--decrypt --uuid {uuid}")));
    ok_in(
        &w,
        ucrypt_bin(),
        &[
            "reencrypt",
            "-q",
            "--decrypt",
            "--uuid",
            &uuid,
            "--disable-locks",
            "img",
        ],
        &lines(&[PW2]),
    );
    assert!(state_files(&w).is_empty(), "{:?}", state_files(&w));
    let dev = std::fs::read(&wi).unwrap();
    assert!(
        dev[..DATA] == f.plain[..],
        "the device is the plaintext from its first byte"
    );
    assert!(dev[DATA..].iter().all(|&b| b == 0), "the rest is zeroed");
    // kill -9 mid-pass, finished by ucrypt.
    let k = f.subdir("k");
    let ki = f.copy(&img, &k);
    let (mut rng, seed) = Rng::from_env("UCRYPT_LUKS1_DECRYPT_SEED");
    let mut kills = 0;
    // Up to 40 runs killed after a random 0-60 ms; the last one is left to finish.
    for i in 0..=40 {
        let mut args = vec![
            "reencrypt",
            "-q",
            "--decrypt",
            "-B",
            "1",
            "--disable-locks",
            "img",
        ];
        let logged = one_opt(&k, "log").is_some();
        if !logged && !is_luks_page(&first_page(&ki)) {
            // Finished (a kill that came after the run's end).
            break;
        }
        if logged && !is_luks_page(&first_page(&ki)) {
            args.extend(["--uuid", &uuid]);
        }
        let mut child = Command::new(ucrypt_bin())
            .args(&args)
            .current_dir(&k)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        {
            let mut sin = child.stdin.take().unwrap();
            std::io::Write::write_all(&mut sin, &lines(&[PW1])).unwrap();
        }
        let wait = rng.next_u64() % 60;
        let killed = i < 40 && {
            std::thread::sleep(std::time::Duration::from_millis(wait));
            child.try_wait().unwrap().is_none() && child.kill().is_ok()
        };
        let out = child.wait_with_output().unwrap();
        if killed {
            kills += 1;
            continue;
        }
        assert!(
            out.status.success(),
            "seed {seed}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        break;
    }
    assert!(
        state_files(&k).is_empty(),
        "seed {seed}: {:?}",
        state_files(&k)
    );
    let dev = std::fs::read(&ki).unwrap();
    assert!(
        dev[..DATA] == f.plain[..],
        "seed {seed}, {kills} kills: plaintext"
    );
    assert!(dev[DATA..].iter().all(|&b| b == 0));
    eprintln!("LUKS1 decrypt: {kills} kills (seed {seed})");
}

fn one_opt(dir: &Path, ext: &str) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == ext))
}

fn is_luks_page(p: &[u8]) -> bool {
    p[..4] == *b"LUKS"
}

/// `--encrypt --type luks1`, as cryptsetup's legacy LUKS1 encryption: with
/// `--reduce-device-size 2M` backward (log direction 1, mode 1; files named by cryptsetup's
/// UUID cafecafe-...), stopped, resumed (with the same options, as cryptsetup's), killed
/// (-9) and resumed; the LUKS1 header (aes-xts-plain64, 256 bits: cryptsetup's LUKS1
/// default key size, payload offset 4096) at the head, the volume the device's first
/// (size - 2 MiB) bytes. With a new `--header` file: forward, the header file made (the
/// `.new` moved), the volume the whole device.
#[test]
fn encrypt_with_reduction_or_header() {
    if !require("cryptsetup") {
        return;
    }
    let f = Fixture::new(0x1_0007);
    let w = f.subdir("e");
    let dev = w.join("dev");
    let mut data = vec![0u8; 8 << 20];
    Rng::new(0x1_0008).fill(&mut data);
    std::fs::write(&dev, &data).unwrap();
    let enc = [
        "reencrypt",
        "-q",
        "--encrypt",
        "--type",
        "luks1",
        "--reduce-device-size",
        "2M",
        "-B",
        "1",
        "--pbkdf-force-iterations",
        "1000",
        "--disable-locks",
    ];
    let mut args = enc.to_vec();
    args.extend(["--debug-stop-after", "3M", "dev"]);
    let out = run_in(&w, ucrypt_bin(), &args, &lines(&[PW1]));
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(one(&w, "log").ends_with("LUKS-cafecafe-cafe-cafe-cafe-cafecafeeeee.log"));
    let log = String::from_utf8(std::fs::read(one(&w, "log")).unwrap()).unwrap();
    assert!(
        log.contains("direction = 1\n") && log.contains("mode = 1\n"),
        "{log}"
    );
    assert!(log.contains("offset = 3145728\n"), "3 of 6 MiB left: {log}");
    assert_eq!(
        field(&dump(&w, s(&one(&w, "org"))), "Cipher name:"),
        "cipher_null"
    );
    // Killed and resumed until done.
    let (mut rng, seed) = Rng::from_env("UCRYPT_LUKS1_ENCRYPT_SEED");
    let mut kills = 0;
    for i in 0..=20 {
        let mut args = enc.to_vec();
        args.push("dev");
        let mut child = Command::new(ucrypt_bin())
            .args(&args)
            .current_dir(&w)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        {
            let mut sin = child.stdin.take().unwrap();
            std::io::Write::write_all(&mut sin, &lines(&[PW1])).unwrap();
        }
        let wait = rng.next_u64() % 40;
        let killed = i < 20 && {
            std::thread::sleep(std::time::Duration::from_millis(wait));
            child.try_wait().unwrap().is_none() && child.kill().is_ok()
        };
        let out = child.wait_with_output().unwrap();
        if killed {
            kills += 1;
            if one_opt(&w, "log").is_none() && is_luks_page(&first_page(&dev)) {
                break; // it had finished
            }
            continue;
        }
        assert!(
            out.status.success(),
            "seed {seed}: {} {:?} {:?}",
            String::from_utf8_lossy(&out.stderr),
            state_files(&w),
            &first_page(&dev)[..8]
        );
        break;
    }
    eprintln!("LUKS1 encrypt: {kills} kills (seed {seed})");
    assert!(
        state_files(&w).is_empty(),
        "seed {seed}: {:?}",
        state_files(&w)
    );
    let d = dump(&w, "dev");
    assert_eq!(field(&d, "Cipher mode:"), "xts-plain64");
    assert_eq!(field(&d, "MK bits:"), "256");
    assert_eq!(field(&d, "Payload offset:"), "4096");
    ok_in(&w, "cryptsetup", &["open", "--test-passphrase", "dev"], PW1);
    std::fs::write(f.path("k1"), PW1).unwrap();
    let t = f.table(&dev, "k1");
    let out = ok_in(
        &w,
        ucrypt_bin(),
        &[
            "read",
            "--table-file",
            s(&t),
            "--length",
            &(6 << 20).to_string(),
        ],
        b"",
    );
    assert!(
        out.stdout[..] == data[..6 << 20],
        "seed {seed}: the volume is the device's first 6 MiB"
    );

    // With a new header file: forward, the whole device.
    let h = f.subdir("h");
    let hdev = h.join("dev");
    std::fs::write(&hdev, &data).unwrap();
    ok_in(
        &h,
        ucrypt_bin(),
        &[
            "reencrypt",
            "-q",
            "--encrypt",
            "--type",
            "luks1",
            "--header",
            "hdr",
            "-c",
            "aes-cbc-essiv:sha256",
            "--pbkdf-force-iterations",
            "1000",
            "--disable-locks",
            "dev",
        ],
        &lines(&[PW1]),
    );
    assert!(state_files(&h).is_empty());
    let d = dump(&h, "hdr");
    assert_eq!(field(&d, "Payload offset:"), "0");
    assert_eq!(field(&d, "Cipher mode:"), "cbc-essiv:sha256");
    let out = ok_in(
        &h,
        ucrypt_bin(),
        &[
            "luksOpen",
            "--print-table",
            "--showkeys",
            "-d",
            s(&f.path("k1")),
            "--header",
            "hdr",
            "dev",
        ],
        b"",
    );
    std::fs::write(h.join("t"), &out.stdout).unwrap();
    let out = ok_in(
        &h,
        ucrypt_bin(),
        &[
            "read",
            "--table-file",
            "t",
            "--length",
            &(8 << 20).to_string(),
        ],
        b"",
    );
    assert!(out.stdout == data, "the volume is the whole device");
}

/// `--volume-key-file FILE` on a LUKS1 re-key, as cryptsetup's LUKS1 reencryption: the new
/// volume key is FILE's first key-size bytes (cryptsetup's `--dump-volume-key` of the
/// result shows them) and the plaintext survives; a FILE shorter than the key is refused
/// (exit 1) before any state file is written.
#[test]
fn rekey_takes_the_new_volume_key_from_a_file() {
    if !require("cryptsetup") {
        return;
    }
    let f = Fixture::new(0x1_0009);
    let img = f.image("img");
    let w = f.subdir("w");
    let img = f.copy(&img, &w);
    let vk: Vec<u8> = (0..80u8).map(|i| i.wrapping_mul(29) ^ 0xa5).collect();
    std::fs::write(w.join("vk"), &vk).unwrap();
    std::fs::write(w.join("short"), &vk[..16]).unwrap();
    let mut args: Vec<&str> = REKEY.to_vec();
    args.extend(["--disable-locks", "--volume-key-file", "short", "img"]);
    let out = run_in(&w, ucrypt_bin(), &args, &lines(&[PW1, PW2]));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(state_files(&w).is_empty(), "{:?}", state_files(&w));
    let mut args: Vec<&str> = REKEY.to_vec();
    args.extend(["--disable-locks", "--volume-key-file", "vk", "img"]);
    ok_in(&w, ucrypt_bin(), &args, &lines(&[PW1, PW2]));
    assert!(state_files(&w).is_empty(), "{:?}", state_files(&w));
    let out = ok_in(
        &w,
        "cryptsetup",
        &["luksDump", "-q", "--dump-volume-key", "img"],
        PW1,
    );
    let hex: String = String::from_utf8_lossy(&out.stdout)
        .split("MK dump:")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .collect();
    let want: String = vk[..32].iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, want);
    f.assert_plain(&img);
}
