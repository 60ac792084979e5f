//! Crash safety of `ucrypt reencrypt` (RELIABILITY.md section 12), per resilience mode:
//!
//! - `kill -9` at random moments of real `ucrypt reencrypt` runs, with writes through the
//!   volume between runs (the interrupted hotzone recovered first, then random blocks written
//!   through the mid-reencryption mapping, which maps the old and new key parts): after the
//!   last run every sector reads back as the last write to it (or the original data);
//! - a power cut emulated under the data pass: a volatile write cache where writes since the
//!   last sync survive in any subset, torn at the given granularity (512 bytes for the
//!   journal, which rebuilds the whole hotzone; the 4096-byte encryption sector for checksums,
//!   whose recovery decides per block), then a resume: the data area equals a run that was
//!   never interrupted.
//!
//! - `kill -9` of an encryption with a data shift (`--reduce-device-size`), resumed until
//!   it finishes: the device serves the original plaintext;
//! - `kill -9` of the decryption of a device whose header is attached (`--decrypt --header
//!   NEWFILE`: the data shifted back to the device's head, the moved segment last), resumed
//!   until it finishes: the device holds the original plaintext from its first byte.
//!
//! Rounds scale with `UCRYPT_CRASH_ROUNDS` (default 50 per mode); the seed is printed and
//! taken from `UCRYPT_CRASH_SEED`.
#![allow(clippy::unwrap_used)]

mod common;

use common::{require, Rng};
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;
use std::time::Duration;
use ucrypt::reencrypt::{Outcome, Run, RunOptions};
use ucrypt_format::luks2::disk::Io;

const PASS: &[u8] = b"crash test passphrase";
/// `--luks2-keyslots-size 2m` puts the data at 3 MiB.
const DATA_OFFSET: u64 = 3 << 20;
const DATA: usize = 4 << 20;
const HOTZONE: u64 = 256 << 10;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_ucrypt")
}

fn ok(cmd: &str, args: &[&str]) -> Output {
    let out = Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn rounds() -> u32 {
    std::env::var("UCRYPT_CRASH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50)
}

struct Fx {
    dir: tempfile::TempDir,
    key: PathBuf,
    plain: Vec<u8>,
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

impl Fx {
    fn new(seed: u64) -> Fx {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("pass");
        std::fs::write(&key, PASS).unwrap();
        let mut plain = vec![0u8; DATA];
        Rng::new(seed).fill(&mut plain);
        Fx { dir, key, plain }
    }

    fn path(&self, n: &str) -> PathBuf {
        self.dir.path().join(n)
    }

    /// A new image formatted by cryptsetup (LUKS2, the data at [`DATA_OFFSET`]).
    fn formatted(&self, name: &str) -> PathBuf {
        let img = self.path(name);
        File::create(&img)
            .unwrap()
            .set_len(DATA_OFFSET + DATA as u64)
            .unwrap();
        let areas = [
            "--luks2-metadata-size",
            "16k",
            "--luks2-keyslots-size",
            "2m",
        ];
        ok(
            "cryptsetup",
            &common::luks2_format_args(s(&self.key), &areas, s(&img)),
        );
        img
    }

    /// Formatted by cryptsetup, the plaintext written, reencryption initialised.
    fn initialised(&self, resilience: &str) -> PathBuf {
        let img = self.formatted(&format!("init-{resilience}.img"));
        self.write(&img, 0, &self.plain.clone());
        ok(
            bin(),
            &[
                "reencrypt",
                "--init-only",
                "-q",
                "-d",
                s(&self.key),
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
                "--resilience",
                resilience,
                "--disable-locks",
                s(&img),
            ],
        );
        img
    }

    fn table(&self, img: &Path) -> PathBuf {
        let out = ok(
            bin(),
            &[
                "luksOpen",
                "--print-table",
                "--showkeys",
                "-d",
                s(&self.key),
                s(img),
            ],
        );
        let t = self.path("table");
        std::fs::write(&t, &out.stdout).unwrap();
        t
    }

    fn write(&self, img: &Path, at: usize, data: &[u8]) {
        let input = self.path("input");
        std::fs::write(&input, data).unwrap();
        let t = self.table(img);
        ok(
            bin(),
            &[
                "write",
                "--table-file",
                s(&t),
                "--offset",
                &at.to_string(),
                "--input",
                s(&input),
            ],
        );
    }

    fn read_all(&self, img: &Path) -> Vec<u8> {
        let t = self.table(img);
        ok(
            bin(),
            &["read", "--table-file", s(&t), "--length", &DATA.to_string()],
        )
        .stdout
    }

    fn data_area(img: &Path) -> Vec<u8> {
        std::fs::read(img).unwrap()[DATA_OFFSET as usize..].to_vec()
    }

    /// Whether the header a reader takes (the valid copy with the higher seqid, as
    /// libcryptsetup picks it) has no reencryption left. Not the primary copy's text
    /// alone: a kill between writing a copy's JSON and its checksum leaves that text new
    /// and the copy invalid, while the other copy still says "in reencryption".
    fn finished(img: &Path) -> bool {
        let f = File::open(img).unwrap();
        let h = ucrypt_format::luks2::disk::Header::read(&f, "test image").unwrap();
        !h.json.to_compact().contains("reencrypt")
    }
}

/// Kills a `ucrypt reencrypt` run a random 0-80 ms after its start. `None`: it finished
/// first (success); otherwise whether the header it left (`header`) names a hotzone.
fn kill_later(
    child: std::process::Child,
    rng: &mut Rng,
    header: &Path,
    what: &str,
) -> Option<bool> {
    let mut child = child;
    std::thread::sleep(Duration::from_micros(rng.below(80_000)));
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        return None;
    }
    assert!(
        out.status.code().is_none(),
        "{what}: reencrypt failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let b = std::fs::read(header).unwrap();
    Some(String::from_utf8_lossy(&b[4096..16384]).contains("in-reencryption"))
}

#[test]
fn kill_9_at_random_points_with_writes_between_runs_loses_nothing() {
    if !require("cryptsetup") {
        return;
    }
    let (mut rng, seed) = Rng::from_env("UCRYPT_CRASH_SEED");
    eprintln!("seed {seed} (UCRYPT_CRASH_SEED)");
    let f = Fx::new(seed);
    for resilience in ["checksum", "journal"] {
        let init = f.initialised(resilience);
        let (mut kills, mut images, mut writes, mut hot) = (0u32, 0u32, 0u32, 0u32);
        while kills < rounds() {
            images += 1;
            let img = f.path("work.img");
            std::fs::copy(&init, &img).unwrap();
            let mut model = f.plain.clone();
            loop {
                let child = Command::new(bin())
                    .args([
                        "reencrypt",
                        "--resume-only",
                        "-q",
                        "-d",
                        s(&f.key),
                        "--hotzone-size",
                        &HOTZONE.to_string(),
                        "--disable-locks",
                        s(&img),
                    ])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap();
                let Some(in_hotzone) = kill_later(child, &mut rng, &img, resilience) else {
                    break;
                };
                kills += 1;
                hot += u32::from(in_hotzone);
                if Fx::finished(&img) {
                    // Killed after its last header write.
                    break;
                }
                // Recover the interrupted hotzone (stop at once), then write through the
                // mapping as it stands: random 4 KiB-aligned blocks, some across the
                // boundary between the old and new key.
                ok(
                    bin(),
                    &[
                        "reencrypt",
                        "--resume-only",
                        "-q",
                        "-d",
                        s(&f.key),
                        "--disable-locks",
                        "--debug-stop-after",
                        "0",
                        s(&img),
                    ],
                );
                for _ in 0..2 {
                    let len = 4096 * (1 + rng.below(16) as usize);
                    let at = 4096 * rng.below(((DATA - len) / 4096) as u64) as usize;
                    let mut data = vec![0u8; len];
                    rng.fill(&mut data);
                    f.write(&img, at, &data);
                    model[at..at + len].copy_from_slice(&data);
                    writes += 1;
                }
                if Fx::finished(&img) {
                    // The recovery reached the end (the hotzone was the last one).
                    break;
                }
            }
            assert!(Fx::finished(&img), "{resilience}: not finished");
            let got = f.read_all(&img);
            if let Some(pos) = got.iter().zip(&model).position(|(a, b)| a != b) {
                panic!("{resilience}: byte {pos} (sector {}) differs from the last write (seed {seed})", pos / 4096);
            }
        }
        eprintln!(
            "{resilience}: {kills} kill -9 mid-run ({hot} inside a hotzone) over {images} volumes, {writes} writes between runs, all data verified"
        );
    }
}

/// A disk with a volatile write cache: writes stay in `cache` (in `grain`-byte blocks) until
/// `sync`; at write/sync number `cut_at` the power goes: a random subset of the cached
/// blocks reaches the file, every later call fails.
struct CutIo {
    file: File,
    grain: u64,
    st: Mutex<CutState>,
}

struct CutState {
    cache: BTreeMap<u64, Vec<u8>>,
    ops: u64,
    cut_at: u64,
    dead: bool,
    rng: Rng,
    kept: u64,
    dropped: u64,
}

impl CutIo {
    fn block(&self, st: &CutState, b: u64) -> Vec<u8> {
        if let Some(c) = st.cache.get(&b) {
            return c.clone();
        }
        let mut v = vec![0u8; self.grain as usize];
        self.file.read_exact_at(&mut v, b * self.grain).unwrap();
        v
    }

    /// Counts an operation; the power cut when it is the one.
    fn tick(&self, st: &mut CutState) -> std::io::Result<()> {
        if st.dead {
            return Err(std::io::Error::other("power is off"));
        }
        st.ops += 1;
        if st.ops == st.cut_at {
            self.power_off(st);
            return Err(std::io::Error::other("power cut"));
        }
        Ok(())
    }

    /// The power goes: a random subset of the cached blocks reaches the file, every later
    /// call fails.
    fn power_off(&self, st: &mut CutState) {
        let cache = std::mem::take(&mut st.cache);
        for (b, data) in cache {
            if st.rng.below(2) == 1 {
                self.file.write_all_at(&data, b * self.grain).unwrap();
                st.kept += 1;
            } else {
                st.dropped += 1;
            }
        }
        st.dead = true;
    }
}

impl Io for CutIo {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let st = self.st.lock().unwrap();
        if st.dead {
            return Err(std::io::Error::other("power is off"));
        }
        self.file.read_exact_at(buf, offset)?;
        let end = offset + buf.len() as u64;
        for (&b, data) in st
            .cache
            .range(offset / self.grain..end.div_ceil(self.grain))
        {
            let bs = b * self.grain;
            let from = bs.max(offset);
            let to = (bs + self.grain).min(end);
            buf[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&data[(from - bs) as usize..(to - bs) as usize]);
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        let mut st = self.st.lock().unwrap();
        self.tick(&mut st)?;
        let end = offset + buf.len() as u64;
        for b in offset / self.grain..end.div_ceil(self.grain) {
            let mut block = self.block(&st, b);
            let bs = b * self.grain;
            let from = bs.max(offset);
            let to = (bs + self.grain).min(end);
            block[(from - bs) as usize..(to - bs) as usize]
                .copy_from_slice(&buf[(from - offset) as usize..(to - offset) as usize]);
            st.cache.insert(b, block);
        }
        Ok(())
    }

    fn sync(&self) -> std::io::Result<()> {
        let mut st = self.st.lock().unwrap();
        self.tick(&mut st)?;
        for (b, data) in std::mem::take(&mut st.cache) {
            self.file.write_all_at(&data, b * self.grain).unwrap();
        }
        Ok(())
    }
}

fn cut_run(
    img: &Path,
    grain: u64,
    cut_at: u64,
    rng: Rng,
) -> (Result<Outcome, String>, u64, u64, u64) {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .unwrap();
    let io = std::sync::Arc::new(CutIo {
        file,
        grain,
        st: Mutex::new(CutState {
            cache: BTreeMap::new(),
            ops: 0,
            cut_at,
            dead: false,
            rng,
            kept: 0,
            dropped: 0,
        }),
    });
    struct Shared(std::sync::Arc<CutIo>);
    impl Io for Shared {
        fn read_at(&self, b: &mut [u8], o: u64) -> std::io::Result<()> {
            self.0.read_at(b, o)
        }
        fn write_at(&self, b: &[u8], o: u64) -> std::io::Result<()> {
            self.0.write_at(b, o)
        }
        fn sync(&self) -> std::io::Result<()> {
            self.0.sync()
        }
    }
    let opts = RunOptions {
        max_hotzone: HOTZONE,
        stop_after: None,
    };
    let r = Run::open_with(Box::new(Shared(io.clone())), img, PASS)
        .and_then(|mut run| run.run(&opts, &AtomicBool::new(false), &mut |_, _| {}))
        .map_err(|e| format!("{e:#}"));
    let st = io.st.lock().unwrap();
    (r, st.ops, st.kept, st.dropped)
}

#[test]
fn power_cut_during_the_data_pass_loses_nothing() {
    if !require("cryptsetup") {
        return;
    }
    let (mut rng, seed) = Rng::from_env("UCRYPT_CRASH_SEED");
    eprintln!("seed {seed} (UCRYPT_CRASH_SEED)");
    let f = Fx::new(seed ^ 1);
    for (resilience, grain) in [("checksum", 4096u64), ("journal", 512)] {
        let init = f.initialised(resilience);
        // The run nobody interrupts, and how many writes and syncs it makes.
        let reference = f.path("reference.img");
        std::fs::copy(&init, &reference).unwrap();
        let (r, total, _, _) = cut_run(&reference, grain, u64::MAX, Rng::new(0));
        assert_eq!(r, Ok(Outcome::Finished));
        assert!(f.read_all(&reference) == f.plain);
        let want = Fx::data_area(&reference);
        let (mut kept, mut dropped, mut in_cleanup, mut after_end) = (0, 0, 0, 0);
        for round in 0..rounds() {
            let img = f.path("cut.img");
            std::fs::copy(&init, &img).unwrap();
            let cut_at = 1 + rng.below(total);
            let (r, _, k, d) = cut_run(&img, grain, cut_at, Rng::new(rng.next_u64()));
            assert!(
                r.is_err(),
                "{resilience} round {round}: no cut at op {cut_at} of {total}"
            );
            kept += k;
            dropped += d;
            // Power back: resume on the real file (unless the cut came after the last
            // header write had reached the disk).
            if Fx::finished(&img) {
                after_end += 1;
                let got = Fx::data_area(&img);
                assert!(
                    got == want,
                    "{resilience} round {round}: finished with other data"
                );
                continue;
            }
            let mut run = Run::open(&img, PASS).unwrap_or_else(|e| {
                panic!("{resilience} round {round} (cut at {cut_at}/{total}, seed {seed}): {e:#}")
            });
            if run.done() == run.device_size() {
                in_cleanup += 1;
            }
            let out = run
                .run(
                    &RunOptions {
                        max_hotzone: HOTZONE,
                        stop_after: None,
                    },
                    &AtomicBool::new(false),
                    &mut |_, _| {},
                )
                .unwrap();
            assert_eq!(out, Outcome::Finished);
            assert!(Fx::finished(&img));
            let got = Fx::data_area(&img);
            if let Some(pos) = got.iter().zip(&want).position(|(a, b)| a != b) {
                panic!("{resilience} round {round}: cut at op {cut_at} of {total}: data byte {pos} differs (seed {seed})");
            }
        }
        assert!(f.read_all(&f.path("cut.img")) == f.plain);
        eprintln!(
            "{resilience}: {} power cuts among {total} writes/syncs, {kept} cached blocks kept and {dropped} dropped, {in_cleanup} during the clean-up, {after_end} after the last header write; data identical every time",
            rounds()
        );
    }
}

/// `kill -9` at random moments of `ucrypt reencrypt --encrypt --header` and `--decrypt
/// --header` runs (a 4 MiB plaintext device, 256 KiB hotzones), resumed by ucrypt until a
/// run completes: the encrypted device then serves the plaintext, the decrypted one is the
/// plaintext. No writes between runs: a volume that is part plaintext is not opened.
#[test]
fn kill_9_during_encryption_and_decryption_loses_nothing() {
    if !require("cryptsetup") {
        return;
    }
    let (mut rng, seed) = Rng::from_env("UCRYPT_CRASH_SEED");
    eprintln!("seed {seed} (UCRYPT_CRASH_SEED)");
    let f = Fx::new(seed ^ 2);
    let (hdr, dev) = (f.path("enc.hdr"), f.path("enc.dev"));
    let finished = |hdr: &Path| {
        let h = ucrypt_format::luks2::disk::Header::read(&File::open(hdr).unwrap(), "hdr").unwrap();
        !h.json.to_compact().contains("reencrypt")
    };
    let resume = |hdr: &Path, dev: &Path| {
        Command::new(bin())
            .args([
                "reencrypt",
                "--resume-only",
                "-q",
                "--header",
                s(hdr),
                "-d",
                s(&f.key),
                "--hotzone-size",
                &HOTZONE.to_string(),
                "--disable-locks",
                s(dev),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let init = |mode: &str, resilience: &str| -> (PathBuf, PathBuf) {
        let (h, d) = (
            f.path(&format!("{mode}-{resilience}.hdr")),
            f.path(&format!("{mode}-{resilience}.dev")),
        );
        std::fs::write(&d, &f.plain).unwrap();
        let enc = |h: &Path, d: &Path, extra: &[&str]| {
            let mut args = vec![
                "reencrypt",
                "--encrypt",
                "-q",
                "--header",
                s(h),
                "-d",
                s(&f.key),
            ];
            args.extend_from_slice(&["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"]);
            args.extend_from_slice(&["--disable-locks"]);
            args.extend_from_slice(extra);
            args.push(s(d));
            ok(bin(), &args);
        };
        if mode == "encrypt" {
            enc(&h, &d, &["--init-only", "--resilience", resilience]);
        } else {
            let _ = std::fs::remove_file(&h);
            enc(&h, &d, &[]);
            ok(
                bin(),
                &[
                    "reencrypt",
                    "--decrypt",
                    "--init-only",
                    "-q",
                    "--header",
                    s(&h),
                    "-d",
                    s(&f.key),
                    "--resilience",
                    resilience,
                    "--disable-locks",
                    s(&d),
                ],
            );
        }
        (h, d)
    };
    for mode in ["encrypt", "decrypt"] {
        for resilience in ["checksum", "journal"] {
            let (ih, id) = init(mode, resilience);
            let (mut kills, mut images, mut hot) = (0u32, 0u32, 0u32);
            while kills < rounds().div_ceil(2) {
                images += 1;
                std::fs::copy(&ih, &hdr).unwrap();
                std::fs::copy(&id, &dev).unwrap();
                loop {
                    let child = resume(&hdr, &dev);
                    let what = format!("{mode} {resilience}");
                    let Some(in_hotzone) = kill_later(child, &mut rng, &hdr, &what) else {
                        break;
                    };
                    kills += 1;
                    hot += u32::from(in_hotzone);
                    if finished(&hdr) {
                        break;
                    }
                }
                assert!(finished(&hdr), "{mode} {resilience}: not finished");
                if mode == "decrypt" {
                    assert!(
                        std::fs::read(&dev).unwrap() == f.plain,
                        "{mode} {resilience}: not the plaintext (seed {seed})"
                    );
                } else {
                    let out = ok(
                        bin(),
                        &[
                            "luksOpen",
                            "--print-table",
                            "--showkeys",
                            "--header",
                            s(&hdr),
                            "-d",
                            s(&f.key),
                            s(&dev),
                        ],
                    );
                    let t = f.path("table");
                    std::fs::write(&t, &out.stdout).unwrap();
                    let got = ok(
                        bin(),
                        &["read", "--table-file", s(&t), "--length", &DATA.to_string()],
                    )
                    .stdout;
                    assert!(
                        got == f.plain,
                        "{mode} {resilience}: plaintext differs (seed {seed})"
                    );
                }
            }
            eprintln!(
                "{mode} {resilience}: {kills} kill -9 mid-run ({hot} inside a hotzone) over {images} devices, all data verified"
            );
        }
    }
}

/// `kill -9` at random moments of `ucrypt reencrypt --encrypt --reduce-device-size` (the
/// header at the head of the device, the data shifted, resilience datashift), resumed
/// until it finishes: the device then serves the original plaintext, the first shift of it
/// (moved to the device's end meanwhile, then encrypted from there) included. 4 MiB of
/// data, a 512 KiB shift (8 hotzones).
#[test]
fn kill_9_during_encryption_with_a_data_shift_loses_nothing() {
    if !require("cryptsetup") {
        return;
    }
    let (mut rng, seed) = Rng::from_env("UCRYPT_CRASH_SEED");
    eprintln!("seed {seed} (UCRYPT_CRASH_SEED)");
    let f = Fx::new(seed ^ 3);
    const REDUCE: usize = 1 << 20;
    // The device: the data, then the REDUCE bytes the filesystem gave up (random too).
    let mut device = f.plain.clone();
    device.extend_from_slice(&f.plain[..REDUCE]);
    device[DATA..].reverse();
    let init = f.path("shift-init.img");
    std::fs::write(&init, &device).unwrap();
    let mut args = vec!["reencrypt", "--encrypt", "--init-only", "-q"];
    args.extend_from_slice(&["--reduce-device-size", "1M", "-d", s(&f.key)]);
    args.extend_from_slice(&["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"]);
    args.extend_from_slice(&["--disable-locks", s(&init)]);
    ok(bin(), &args);
    let img = f.path("shift.img");
    let resume = || {
        Command::new(bin())
            .args(["reencrypt", "--resume-only", "-q", "-d", s(&f.key)])
            .args(["--disable-locks", s(&img)])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (mut kills, mut images, mut hot) = (0u32, 0u32, 0u32);
    while kills < rounds() {
        images += 1;
        std::fs::copy(&init, &img).unwrap();
        while let Some(in_hotzone) = kill_later(resume(), &mut rng, &img, "datashift") {
            kills += 1;
            hot += u32::from(in_hotzone);
            if Fx::finished(&img) {
                break;
            }
        }
        assert!(Fx::finished(&img), "datashift: not finished (seed {seed})");
        let got = f.read_all(&img);
        assert!(
            got[..REDUCE / 2] == f.plain[..REDUCE / 2],
            "datashift: the moved first sectors differ (seed {seed})"
        );
        assert!(got == f.plain, "datashift: plaintext differs (seed {seed})");
    }
    eprintln!(
        "datashift: {kills} kill -9 mid-run ({hot} inside a hotzone) over {images} devices, all data verified"
    );
}

/// `kill -9` at random moments of `ucrypt reencrypt --decrypt --header NEWFILE` of a device
/// whose LUKS2 header is attached (cryptsetup 2.6's: the header exported, resilience
/// datashift-checksum or datashift-journal, the data moved a shift towards the device's
/// start, the moved first segment decrypted in place last), resumed until it finishes:
/// the device then holds the original plaintext from its first byte. The device is the
/// shift encryption's (4 MiB of data, a 512 KiB shift: 9 shift hotzones, then the moved
/// segment); half the rounds with the journal (the moved segment 128 KiB, so the journal
/// fits the small keyslots area).
#[test]
fn kill_9_during_an_attached_header_decryption_loses_nothing() {
    if !require("cryptsetup") {
        return;
    }
    let (mut rng, seed) = Rng::from_env("UCRYPT_CRASH_SEED");
    eprintln!("seed {seed} (UCRYPT_CRASH_SEED)");
    let f = Fx::new(seed ^ 4);
    const REDUCE: usize = 1 << 20;
    let mut device = f.plain.clone();
    device.extend_from_slice(&f.plain[..REDUCE]);
    let enc = f.path("enc.img");
    std::fs::write(&enc, &device).unwrap();
    let mut args = vec!["reencrypt", "--encrypt", "-q"];
    args.extend_from_slice(&["--reduce-device-size", "1M", "-d", s(&f.key)]);
    args.extend_from_slice(&["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"]);
    args.extend_from_slice(&["--disable-locks", s(&enc)]);
    ok(bin(), &args);
    let (img, hdr) = (f.path("dec.img"), f.path("dec.hdr"));
    let mut inits = Vec::new();
    for (name, extra) in [
        ("checksum", &[][..]),
        (
            "journal",
            &["--resilience", "journal", "--hotzone-size", "128K"][..],
        ),
    ] {
        let (i_img, i_hdr) = (
            f.path(&format!("{name}.img")),
            f.path(&format!("{name}.hdr")),
        );
        std::fs::copy(&enc, &i_img).unwrap();
        let mut args = vec![
            "reencrypt",
            "--decrypt",
            "--init-only",
            "-q",
            "-d",
            s(&f.key),
        ];
        args.extend_from_slice(&["--header", s(&i_hdr)]);
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--disable-locks", s(&i_img)]);
        ok(bin(), &args);
        inits.push((name, i_img, i_hdr));
    }
    let resume = || {
        Command::new(bin())
            .args(["reencrypt", "--resume-only", "-q", "-d", s(&f.key)])
            .args(["--header", s(&hdr), "--disable-locks", s(&img)])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (mut kills, mut images, mut hot) = (0u32, 0u32, 0u32);
    while kills < rounds() {
        let (name, i_img, i_hdr) = &inits[images as usize % 2];
        images += 1;
        std::fs::copy(i_img, &img).unwrap();
        std::fs::copy(i_hdr, &hdr).unwrap();
        while let Some(in_hotzone) = kill_later(resume(), &mut rng, &hdr, name) {
            kills += 1;
            hot += u32::from(in_hotzone);
            if Fx::finished(&hdr) {
                break;
            }
        }
        assert!(Fx::finished(&hdr), "{name}: not finished (seed {seed})");
        let got = std::fs::read(&img).unwrap();
        assert!(
            got[..REDUCE / 2] == f.plain[..REDUCE / 2],
            "{name}: the moved first sectors differ (seed {seed})"
        );
        assert!(
            got[..DATA] == f.plain[..],
            "{name}: plaintext differs (seed {seed})"
        );
    }
    eprintln!(
        "attached-header decryption: {kills} kill -9 mid-run ({hot} inside a hotzone) over {images} devices, all data verified"
    );
}

/// Starts `ucrypt open IMG NAME --device none` in the runtime directory `run`; returns the
/// NBD URI.
fn serve(run: &Path, img: &Path, key: &Path, name: &str) -> String {
    let out = Command::new(bin())
        .args([
            "open",
            s(img),
            name,
            "--device",
            "none",
            "--key-file",
            s(key),
        ])
        .env("UCRYPT_RUNTIME_DIR", run)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "open: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The `status --json` of instance `name`.
fn instance_status(run: &Path, name: &str) -> serde_json::Value {
    let out = Command::new(bin())
        .args(["status", name, "--json"])
        .env("UCRYPT_RUNTIME_DIR", run)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
}

/// 4 KiB block `b` as written for the `seq`-th time: its number and the count, repeated.
fn tagged(b: u64, seq: u64) -> Vec<u8> {
    (0..512u64)
        .flat_map(|i| (b << 40 | seq << 12 | i).to_le_bytes())
        .collect()
}

/// Online reencryption (`reencrypt --active-name`) killed with `kill -9` of the serving
/// instance at a random moment of its data pass, while four clients keep writing random
/// 4 KiB blocks through its NBD socket: reopened (the interrupted hotzone recovered) every
/// block reads back as the last write acknowledged to it or the one in flight at the kill;
/// then the reencryption is resumed online and the volume still reads the same, the header
/// finished. For `checksum` and `journal` (with `none` a crash inside a hotzone loses it,
/// as with cryptsetup). Rounds per mode: `UCRYPT_CRASH_ROUNDS` / 5 (default 10; about 2 s each).
#[test]
fn kill_9_of_an_online_reencryption_with_concurrent_writes_loses_nothing() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    if !require("cryptsetup") {
        return;
    }
    let (mut rng, seed) = Rng::from_env("UCRYPT_CRASH_SEED");
    eprintln!("seed {seed}");
    let rounds = (rounds() / 5).max(1);
    const BLOCKS: u64 = (DATA / 4096) as u64;
    let mut kills_during_pass = 0;
    let mut total = 0;
    let acked = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut in_flight_kept = 0;
    for resilience in ["checksum", "journal"] {
        for round in 0..rounds {
            let fx = Fx::new(rng.next_u64());
            let run = fx.path("run");
            let img = fx.formatted("online.img");
            let name = "crash";
            let uri = serve(&run, &img, &fx.key, name);
            let dev = ucrypt::open::open_device(
                &ucrypt::open::Device::parse(&uri),
                false,
                ucrypt::open::Cache::Auto,
            )
            .unwrap();
            dev.write_at(&fx.plain, 0, false).unwrap();
            // What each block must hold: the last acknowledged write, or (a write was in
            // flight at the kill) that one.
            type Model = Vec<(Vec<u8>, Option<Vec<u8>>)>;
            let model: Arc<Mutex<Model>> = Arc::new(Mutex::new(
                fx.plain.chunks(4096).map(|c| (c.to_vec(), None)).collect(),
            ));
            let stop = Arc::new(AtomicBool::new(false));
            let clients: Vec<_> = (0..4u64)
                .map(|t| {
                    let (dev, model, stop, acked) =
                        (dev.clone(), model.clone(), stop.clone(), acked.clone());
                    let mut r = Rng::new(rng.next_u64() | 1);
                    std::thread::spawn(move || {
                        let mut seq = 0;
                        while !stop.load(Ordering::SeqCst) {
                            // Each client owns the blocks equal to it modulo 4.
                            let b = r.below(BLOCKS / 4) * 4 + t;
                            seq += 1;
                            let data = tagged(b, seq);
                            model.lock().unwrap()[b as usize].1 = Some(data.clone());
                            if dev.write_at(&data, b * 4096, false).is_err() {
                                return; // the server is gone; the write stays in flight
                            }
                            let mut m = model.lock().unwrap();
                            m[b as usize] = (data, None);
                            acked.fetch_add(1, Ordering::Relaxed);
                        }
                    })
                })
                .collect();
            let mut child = Command::new(bin())
                .args([
                    "reencrypt",
                    "--active-name",
                    name,
                    "-q",
                    "--key-file",
                    s(&fx.key),
                    "--resilience",
                    resilience,
                    "--hotzone-size",
                    "65536",
                    "--pbkdf",
                    "pbkdf2",
                    "--pbkdf-force-iterations",
                    "1000",
                ])
                .env("UCRYPT_RUNTIME_DIR", &run)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            // Kill once the pass has started, a random moment later.
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            let pid = instance_status(&run, name)["pid"].as_i64().unwrap() as i32;
            loop {
                let st = instance_status(&run, name);
                if st["reencryption"]["state"] == "running" {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "no pass started: {st}"
                );
                std::thread::sleep(Duration::from_millis(2));
            }
            std::thread::sleep(Duration::from_micros(rng.below(30_000)));
            let st = instance_status(&run, name);
            if st["reencryption"]["state"] == "running" {
                kills_during_pass += 1;
            }
            // SAFETY: kill(2) of the instance this test started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let _ = child.kill();
            let _ = child.wait();
            stop.store(true, Ordering::SeqCst);
            for c in clients {
                c.join().unwrap();
            }
            drop(dev);
            // Wait for the process to be gone (its image lock with it).
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while Path::new(&format!("/proc/{pid}")).exists() {
                assert!(std::time::Instant::now() < deadline, "pid {pid} lingers");
                std::thread::sleep(Duration::from_millis(5));
            }
            let check = |what: &str| {
                let uri = serve(&run, &img, &fx.key, name);
                let dev = ucrypt::open::open_device(
                    &ucrypt::open::Device::parse(&uri),
                    true,
                    ucrypt::open::Cache::Auto,
                )
                .unwrap();
                let mut all = vec![0u8; DATA];
                dev.read_at(&mut all, 0).unwrap();
                drop(dev);
                let m = model.lock().unwrap();
                let mut kept = 0;
                for (b, got) in all.chunks(4096).enumerate() {
                    let (acked, inflight) = &m[b];
                    assert!(
                        got == acked.as_slice() || inflight.as_deref() == Some(got),
                        "{resilience} round {round} ({what}): block {b} is neither its last \
                         acknowledged write nor the one in flight (seed {seed})"
                    );
                    kept += usize::from(got != acked.as_slice());
                }
                (all, kept)
            };
            let (after_kill, kept) = check("reopened after the kill");
            in_flight_kept += kept;
            let out = Command::new(bin())
                .args([
                    "reencrypt",
                    "--active-name",
                    name,
                    "-q",
                    "--key-file",
                    s(&fx.key),
                    "--resilience",
                    resilience,
                    "--pbkdf",
                    "pbkdf2",
                    "--pbkdf-force-iterations",
                    "1000",
                ])
                .env("UCRYPT_RUNTIME_DIR", &run)
                .stdin(Stdio::null())
                .output()
                .unwrap();
            let finished_already = Fx::finished(&img);
            assert!(
                out.status.success() || finished_already,
                "{resilience} round {round}: resume: {out:?}"
            );
            let uri_now = instance_status(&run, name)["uri"]
                .as_str()
                .map(str::to_string);
            let dev = ucrypt::open::open_device(
                &ucrypt::open::Device::parse(&uri_now.unwrap_or(uri)),
                true,
                ucrypt::open::Cache::Auto,
            )
            .unwrap();
            let mut all = vec![0u8; DATA];
            dev.read_at(&mut all, 0).unwrap();
            drop(dev);
            assert!(
                all == after_kill,
                "{resilience} round {round}: the resumed pass changed the data (seed {seed})"
            );
            let close = Command::new(bin())
                .args(["close", name])
                .env("UCRYPT_RUNTIME_DIR", &run)
                .output()
                .unwrap();
            assert!(close.status.success(), "close: {close:?}");
            assert!(
                Fx::finished(&img),
                "{resilience} round {round}: not finished"
            );
            total += 1;
        }
    }
    eprintln!(
        "online kill -9 rounds: {total} ({kills_during_pass} with the pass running at the kill), \
         {} writes acknowledged and verified, {in_flight_kept} blocks held the write in flight at \
         the kill, seed {seed}",
        acked.load(Ordering::Relaxed)
    );
    assert!(kills_during_pass > 0, "no kill landed during a pass");
}

/// The data pass's own I/O in the online power-cut rounds: the power goes at its
/// `cut_at`-th write or sync, whatever the clients are doing at that moment.
struct PassIo {
    disk: std::sync::Arc<CutIo>,
    /// Every disk of the machine (with a detached header, the header's and the data's):
    /// the power goes for all at once.
    all: Vec<std::sync::Arc<CutIo>>,
    ops: std::sync::Arc<std::sync::atomic::AtomicU64>,
    cut_at: u64,
}

/// The power goes for every disk (those already off stay off).
fn power_off_all(disks: &[std::sync::Arc<CutIo>]) {
    for d in disks {
        let mut st = d.st.lock().unwrap();
        if !st.dead {
            d.power_off(&mut st);
        }
    }
}

impl PassIo {
    fn tick(&self) -> std::io::Result<()> {
        use std::sync::atomic::Ordering;
        if self.ops.fetch_add(1, Ordering::SeqCst) + 1 == self.cut_at {
            power_off_all(&self.all);
            return Err(std::io::Error::other("power cut"));
        }
        Ok(())
    }
}

impl Io for PassIo {
    fn read_at(&self, b: &mut [u8], o: u64) -> std::io::Result<()> {
        self.disk.read_at(b, o)
    }
    fn write_at(&self, b: &[u8], o: u64) -> std::io::Result<()> {
        self.tick()?;
        self.disk.write_at(b, o)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.tick()?;
        self.disk.sync()
    }
}

/// The same disk as the served volume's backend, for the clients: a FLUSH syncs the cache,
/// FUA writes through it.
struct DiskBackend {
    disk: std::sync::Arc<CutIo>,
    info: ucrypt_backend::BackendInfo,
}

fn backend_err(e: std::io::Error) -> ucrypt_backend::BackendError {
    ucrypt_backend::BackendError::Other(e.to_string())
}

impl DiskBackend {
    fn read(&self, buf: &mut [u8], offset: u64) -> Result<(), ucrypt_backend::BackendError> {
        self.disk.read_at(buf, offset).map_err(backend_err)
    }

    fn write(
        &self,
        buf: &[u8],
        offset: u64,
        fua: bool,
    ) -> Result<(), ucrypt_backend::BackendError> {
        self.disk.write_at(buf, offset).map_err(backend_err)?;
        if fua {
            self.disk.sync().map_err(backend_err)?;
        }
        Ok(())
    }
}

impl ucrypt_backend::Backend for DiskBackend {
    fn info(&self) -> &ucrypt_backend::BackendInfo {
        &self.info
    }

    fn submit(&self, io: ucrypt_backend::Io<'_>) -> Result<(), ucrypt_backend::BackendError> {
        match io.kind {
            ucrypt_backend::IoKind::Read(buf) => self.read(buf, io.offset),
            ucrypt_backend::IoKind::Write(buf) => self.write(buf, io.offset, io.fua),
            _ => ucrypt_backend::emulate::fallback(self, io),
        }
    }

    fn flush(&self) -> Result<(), ucrypt_backend::BackendError> {
        self.disk.sync().map_err(backend_err)
    }
}

/// One online round: the instance's two-sided view ([`Reencrypting`]: new key below the
/// boundary, old above, hotzones held) over the volatile-cache disk, four client threads
/// writing tagged 4 KiB blocks through it (each owns the blocks equal to it modulo 4) and
/// flushing after every 8 writes, while the data pass runs gated on the same disk until the
/// power goes at its `cut_at`-th write or sync (or it finishes: the power goes then).
struct OnlineRound {
    pass_ops: u64,
    cut: bool,
    /// Per block: the last write known durable (acknowledged before a FLUSH of its client
    /// that completed) and the last write issued (acknowledged or in flight); 0 is the
    /// original data.
    model: Vec<(u64, u64)>,
    acked: u64,
    flushes: u64,
    kept: u64,
    dropped: u64,
}

///
/// With `header` (a detached header: the LUKS2 header on that file, its own disk and write
/// cache, the data area on `img`), the header's final state is copied back over `img`'s own
/// header area when the round ends, so `img` is then the same volume with its header
/// attached, for the checks and the recovery.
fn online_round(img: &Path, cut_at: u64, rng: &mut Rng, header: Option<&Path>) -> OnlineRound {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use ucrypt::instance::reencrypting::Reencrypting;
    use ucrypt_backend::{Backend, BackendInfo, Caps, Support};
    const BLOCKS: u64 = (DATA / 4096) as u64;
    let cut_disk = |path: &Path, rng: &mut Rng| {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        Arc::new(CutIo {
            file,
            // The encryption sector: a client's write is one, and so is each checksum's
            // block.
            grain: 4096,
            st: Mutex::new(CutState {
                cache: BTreeMap::new(),
                ops: 0,
                cut_at: u64::MAX,
                dead: false,
                rng: Rng::new(rng.next_u64()),
                kept: 0,
                dropped: 0,
            }),
        })
    };
    let len = std::fs::metadata(img).unwrap().len();
    let disk = cut_disk(img, rng);
    let hdisk = header.map(|h| cut_disk(h, rng));
    let all: Vec<Arc<CutIo>> = std::iter::once(disk.clone()).chain(hdisk.clone()).collect();
    let ops = Arc::new(AtomicU64::new(0));
    let pass = |d: &Arc<CutIo>| PassIo {
        disk: d.clone(),
        all: all.clone(),
        ops: ops.clone(),
        cut_at,
    };
    let mut run = match (header, &hdisk) {
        (Some(h), Some(hd)) => {
            Run::open_detached_with(Box::new(pass(hd)), h, Box::new(pass(&disk)), img, PASS)
        }
        _ => Run::open_with(Box::new(pass(&disk)), img, PASS),
    }
    .unwrap();
    let backend: Arc<dyn Backend> = Arc::new(DiskBackend {
        disk: disk.clone(),
        info: BackendInfo {
            size_bytes: len,
            logical_block: 512,
            physical_block: 4096,
            optimal_block: 4096,
            caps: Caps {
                flush: Support::Native,
                discard: Support::None,
                write_zeroes: Support::None,
                read_only: false,
            },
        },
    });
    let (old, new) = run.side_lines(s(img), &[]).unwrap();
    let side =
        |line| -> Arc<dyn Backend> {
            ucrypt::open::open_parsed_with(line, ucrypt::OpenOptions::default(), |_| {
                Ok(backend.clone())
            })
            .unwrap()
            .volume
        };
    let view = Reencrypting::new(side(old), side(new), run.done()).unwrap();
    let model = Mutex::new(vec![(0u64, 0u64); BLOCKS as usize]);
    let stop = AtomicBool::new(false);
    let (acked, flushes) = (AtomicU64::new(0), AtomicU64::new(0));
    let seeds: Vec<u64> = (0..4).map(|_| rng.next_u64() | 1).collect();
    let result = std::thread::scope(|sc| {
        for (t, seed) in seeds.into_iter().enumerate() {
            let (view, model, stop, acked, flushes) = (&view, &model, &stop, &acked, &flushes);
            sc.spawn(move || {
                let mut r = Rng::new(seed);
                let mut pending = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    let b = r.below(BLOCKS / 4) * 4 + t as u64;
                    let seq = {
                        let mut m = model.lock().unwrap();
                        m[b as usize].1 += 1;
                        m[b as usize].1
                    };
                    if view.write_at(&tagged(b, seq), b * 4096, false).is_err() {
                        return; // the power is off: this write stays in flight
                    }
                    acked.fetch_add(1, Ordering::Relaxed);
                    pending.push((b, seq));
                    if pending.len() == 8 {
                        if view.flush().is_err() {
                            return;
                        }
                        flushes.fetch_add(1, Ordering::Relaxed);
                        let mut m = model.lock().unwrap();
                        for (b, seq) in pending.drain(..) {
                            let d = &mut m[b as usize].0;
                            *d = (*d).max(seq);
                        }
                    }
                }
            });
        }
        let r = run.run_gated(
            &RunOptions {
                max_hotzone: HOTZONE,
                stop_after: None,
            },
            &AtomicBool::new(false),
            &mut |_, _| {},
            Some(&view),
        );
        if r.is_err() {
            view.fail_held();
        } else {
            // Finished before the cut: let the clients write on the new key a moment.
            std::thread::sleep(Duration::from_millis(5));
        }
        power_off_all(&all);
        stop.store(true, Ordering::SeqCst);
        r
    });
    if let Some(h) = header {
        let head = std::fs::read(h).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(img)
            .unwrap()
            .write_all_at(&head[..DATA_OFFSET as usize], 0)
            .unwrap();
    }
    let st = disk.st.lock().unwrap();
    OnlineRound {
        pass_ops: ops.load(Ordering::SeqCst),
        cut: result.is_err(),
        model: model.into_inner().unwrap(),
        acked: acked.load(Ordering::Relaxed),
        flushes: flushes.load(Ordering::Relaxed),
        kept: st.kept,
        dropped: st.dropped,
    }
}

/// A power cut during an online reencryption (the instance's two-sided view and the data
/// pass in process, as `ucrypt reencrypt --active-name` runs them) while four clients
/// write tagged 4 KiB blocks and flush: the disk has a volatile write cache (writes since
/// the last sync survive in any subset, torn at the 4 KiB encryption sector), the power
/// goes at a random write or sync of the pass; then the volume is reopened from the real
/// file, the hotzone recovered and the pass resumed to the end. Every block must read as
/// its last flushed write or a later one (acknowledged or in flight), never older, never
/// torn or garbage. For `checksum` and `journal`, and `checksum` with a detached header
/// (the header on a disk of its own, whose sync does not cover the clients' writes to the
/// data disk), `UCRYPT_CRASH_ROUNDS` each (default 50).
#[test]
fn power_cut_of_an_online_reencryption_loses_no_flushed_write() {
    if !require("cryptsetup") {
        return;
    }
    let (mut rng, seed) = Rng::from_env("UCRYPT_CRASH_SEED");
    eprintln!("seed {seed} (UCRYPT_CRASH_SEED)");
    let f = Fx::new(seed ^ 3);
    for (resilience, detached) in [("checksum", false), ("journal", false), ("checksum", true)] {
        let init = f.initialised(resilience);
        let img = f.path("online-cut.img");
        let hdr = f.path("online-cut.hdr");
        let header = detached.then_some(hdr.as_path());
        let layout = if detached { " (detached header)" } else { "" };
        let fresh = || {
            std::fs::copy(&init, &img).unwrap();
            if detached {
                std::fs::copy(&init, &hdr).unwrap();
            }
        };
        // An uncut round: how many writes and syncs the pass makes.
        fresh();
        let total = online_round(&img, u64::MAX, &mut rng, header).pass_ops;
        let (mut acked, mut flushes, mut kept, mut dropped) = (0, 0, 0, 0);
        let (mut later, mut durable_checked, mut in_cleanup, mut after_end) = (0, 0, 0, 0);
        for round in 0..rounds() {
            fresh();
            let cut_at = 1 + rng.below(total);
            let r = online_round(&img, cut_at, &mut rng, header);
            assert!(
                r.cut,
                "{resilience}{layout} round {round}: no cut at op {cut_at} of {total}"
            );
            acked += r.acked;
            flushes += r.flushes;
            kept += r.kept;
            dropped += r.dropped;
            let what = format!(
                "{resilience}{layout} round {round} (cut at {cut_at}/{total}, seed {seed})"
            );
            if Fx::finished(&img) {
                after_end += 1;
            } else {
                let mut run = Run::open(&img, PASS).unwrap_or_else(|e| panic!("{what}: {e:#}"));
                if run.done() == run.device_size() {
                    in_cleanup += 1;
                }
                let out = run
                    .run(
                        &RunOptions {
                            max_hotzone: HOTZONE,
                            stop_after: None,
                        },
                        &AtomicBool::new(false),
                        &mut |_, _| {},
                    )
                    .unwrap_or_else(|e| panic!("{what}: resume: {e:#}"));
                assert_eq!(out, Outcome::Finished, "{what}");
            }
            assert!(Fx::finished(&img), "{what}: not finished");
            let got = f.read_all(&img);
            for (b, blk) in got.chunks(4096).enumerate() {
                let (durable, issued) = r.model[b];
                let held = if blk == &f.plain[b * 4096..(b + 1) * 4096] {
                    0
                } else {
                    let v = u64::from_le_bytes(blk[..8].try_into().unwrap());
                    let seq = (v >> 12) & 0xfff_ffff;
                    assert!(
                        blk == tagged(b as u64, seq).as_slice(),
                        "{what}: block {b} is torn or garbage (neither the original data nor one write)"
                    );
                    seq
                };
                assert!(
                    held >= durable && held <= issued,
                    "{what}: block {b} holds write {held}; the last flushed is {durable}, the last issued {issued}"
                );
                later += u64::from(held > durable);
                durable_checked += u64::from(durable > 0);
            }
        }
        eprintln!(
            "{resilience}{layout} online: {} power cuts among the pass's {total} writes/syncs ({in_cleanup} in the clean-up, {after_end} after the last header write), {acked} client writes acknowledged, {flushes} flushes, {durable_checked} flushed blocks verified, {later} blocks held a later unflushed write, {kept} cached blocks kept and {dropped} dropped",
            rounds()
        );
    }
}
