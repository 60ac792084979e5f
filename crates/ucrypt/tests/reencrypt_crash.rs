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

    /// Formatted by cryptsetup, the plaintext written, reencryption initialised.
    fn initialised(&self, resilience: &str) -> PathBuf {
        let img = self.path(&format!("init-{resilience}.img"));
        File::create(&img)
            .unwrap()
            .set_len(DATA_OFFSET + DATA as u64)
            .unwrap();
        ok(
            "cryptsetup",
            &[
                "luksFormat",
                "-q",
                "--type",
                "luks2",
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
                "--luks2-metadata-size",
                "16k",
                "--luks2-keyslots-size",
                "2m",
                "--key-file",
                s(&self.key),
                s(&img),
            ],
        );
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
                let mut child = Command::new(bin())
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
                std::thread::sleep(Duration::from_micros(rng.below(80_000)));
                let _ = child.kill();
                let out = child.wait_with_output().unwrap();
                if out.status.success() {
                    break;
                }
                assert!(
                    out.status.code().is_none(),
                    "{resilience}: reencrypt failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                kills += 1;
                let b = std::fs::read(&img).unwrap();
                if String::from_utf8_lossy(&b[4096..16384]).contains("in-reencryption") {
                    hot += 1;
                }
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
            return Err(std::io::Error::other("power cut"));
        }
        Ok(())
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
                    let mut child = resume(&hdr, &dev);
                    std::thread::sleep(Duration::from_micros(rng.below(80_000)));
                    let _ = child.kill();
                    let out = child.wait_with_output().unwrap();
                    if out.status.success() {
                        break;
                    }
                    assert!(
                        out.status.code().is_none(),
                        "{mode} {resilience}: reencrypt failed: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                    kills += 1;
                    let b = std::fs::read(&hdr).unwrap();
                    if String::from_utf8_lossy(&b[4096..16384]).contains("in-reencryption") {
                        hot += 1;
                    }
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
