//! ucrypt's RBD backend (`rbd:POOL/IMAGE`) against a real single-node Ceph cluster
//! (`tests/ceph/cluster.sh`: one monitor, one bluestore OSD, data in a temp dir, a watchdog
//! that stops it once this test process exits), and against librbd's own LUKS encryption
//! (`tests/ceph/rbd_io.py`: python3-rbd's `encryption_format`/`encryption_load`):
//!
//! * an image formatted by `rbd encryption format luks2` and written through librbd's
//!   encryption reads the same plaintext in ucrypt, and what ucrypt writes there librbd
//!   reads back;
//! * images formatted by ucrypt (LUKS1, LUKS2) and written by ucrypt read the same in
//!   librbd, and the reverse;
//! * a cryptsetup-made image, imported with `rbd import`, opens in both;
//! * a read-write open holds the image: a second ucrypt open and a header change exit 5,
//!   librbd's writes fail with EROFS, a read-only open still works;
//! * `kill -9` of a serving ucrypt during writes: after reopening (the dead client's lock is
//!   broken once its watch expires), every write acknowledged before a completed FLUSH is
//!   there;
//! * the OSD killed and restarted during I/O (its own cluster): requests wait or fail,
//!   every acknowledged write reads back, nothing reads wrong;
//! * with `--allow-discards` a discard of a whole object reaches librbd (the object goes).
//! * a two-target table (crypt + linear) on one image opens it once: served read-write, a
//!   second writer is still refused with exit 5 and data crosses the boundary intact.
//!
//! The ceph packages (`scripts/setup.sh`) are required under `CI=true`; by hand a machine
//! without them skips. Cheap KDFs (pbkdf2, 1000 iterations) everywhere except the one real
//! `rbd encryption format` (libcryptsetup benchmarks argon2id there: seconds and ~700 MiB
//! per open).
#![allow(clippy::unwrap_used)]

mod common;

use common::{random_bytes, require, require_that, CHEAP_PBKDF};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use ucrypt_backend::Backend;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A cluster started by `tests/ceph/cluster.sh`; stopped on drop (and by its watchdog when
/// this process dies).
struct Cluster {
    conf: PathBuf,
    dir: PathBuf,
}

impl Cluster {
    fn start() -> Option<Cluster> {
        let tools = ["ceph-mon", "ceph-osd", "rbd", "cryptsetup"]
            .iter()
            .all(|t| ucrypt_testkit::on_path(t));
        let py = Command::new("/usr/bin/python3")
            .args(["-c", "import rados, rbd"])
            .status()
            .is_ok_and(|s| s.success());
        if !require_that(
            tools && py,
            "ceph-mon, ceph-osd, rbd (ceph-common), cryptsetup and python3-rbd are needed for \
             the RBD tests (run scripts/setup.sh)",
        ) {
            return None;
        }
        // The monitor's port is picked free but can be taken before it binds: try twice.
        let mut last = String::new();
        for _ in 0..2 {
            let out = Command::new(repo().join("tests/ceph/cluster.sh"))
                .arg("start")
                .env("CEPH_WATCH_PID", std::process::id().to_string())
                .env("TMPDIR", "/tmp")
                .stderr(Stdio::piped())
                .output()
                .unwrap();
            if out.status.success() {
                let text = String::from_utf8(out.stdout).unwrap();
                let var = |k: &str| {
                    text.lines()
                        .find_map(|l| l.strip_prefix(&format!("export {k}=")))
                        .map(PathBuf::from)
                        .unwrap()
                };
                return Some(Cluster {
                    conf: var("CEPH_CONF"),
                    dir: var("CEPH_TEST_DIR"),
                });
            }
            last = String::from_utf8_lossy(&out.stderr).into_owned();
        }
        panic!("the test cluster did not start:\n{last}");
    }

    fn rbd(&self, args: &[&str]) -> Output {
        Command::new("rbd")
            .arg("-c")
            .arg(&self.conf)
            .args(args)
            .output()
            .unwrap()
    }

    fn create(&self, image: &str, size: &str) {
        ok(
            self.rbd(&["create", "--size", size, &format!("rbd/{image}")]),
            "rbd create",
        );
    }

    /// `tests/ceph/rbd_io.py` with `args`.
    fn py(&self, args: &[&str]) -> Output {
        Command::new("/usr/bin/python3")
            .arg(repo().join("tests/ceph/rbd_io.py"))
            .args(args)
            .env("CEPH_CONF", &self.conf)
            .output()
            .unwrap()
    }

    /// librbd's decrypted view: `len` bytes at `off`.
    fn librbd_read(&self, image: &str, fmt: &str, pass: &Path, off: u64, len: usize) -> Vec<u8> {
        let out = tmp().join(format!("{image}.{off}.librbd-read"));
        ok(
            self.py(&[
                "read",
                "rbd",
                image,
                fmt,
                s(pass),
                &off.to_string(),
                &len.to_string(),
                s(&out),
            ]),
            "librbd read",
        );
        let v = std::fs::read(&out).unwrap();
        std::fs::remove_file(&out).unwrap();
        v
    }

    fn librbd_write(&self, image: &str, fmt: &str, pass: &Path, off: u64, data: &[u8]) {
        let f = tmp().join(format!("{image}.{off}.librbd-write"));
        std::fs::write(&f, data).unwrap();
        ok(
            self.py(&["write", "rbd", image, fmt, s(pass), &off.to_string(), s(&f)]),
            "librbd write",
        );
        std::fs::remove_file(&f).unwrap();
    }

    /// Runs ucrypt with this cluster's configuration (`--ceph-conf`).
    fn ucrypt(&self, args: &[&str], stdin: &[u8]) -> Output {
        let mut a: Vec<&str> = args.to_vec();
        a.extend(["--ceph-conf", s(&self.conf)]);
        common::ucrypt_env(&a, stdin, &[("UCRYPT_RUNTIME_DIR", tmp().as_os_str())])
    }

    /// The table line (with the key) of `dev` unlocked with the passphrase in `pass`.
    fn table(&self, dev: &str, pass: &Path) -> PathBuf {
        let line = ok(
            self.ucrypt(
                &[
                    "luksOpen",
                    "--print-table",
                    "--showkeys",
                    dev,
                    "--key-file",
                    s(pass),
                ],
                b"",
            ),
            "luksOpen --print-table",
        );
        let f = tmp().join(format!("{}.table", dev.replace(['/', ':'], "_")));
        std::fs::write(&f, line).unwrap();
        f
    }

    /// ucrypt's decrypted view of `dev` (through its table line).
    fn ucrypt_read(&self, table: &Path, off: u64, len: usize) -> Vec<u8> {
        ok(
            self.ucrypt(
                &[
                    "read",
                    "--table-file",
                    s(table),
                    "--offset",
                    &off.to_string(),
                    "--length",
                    &len.to_string(),
                ],
                b"",
            ),
            "ucrypt read",
        )
    }

    fn ucrypt_write(&self, table: &Path, off: u64, data: &[u8]) {
        ok(
            self.ucrypt(
                &[
                    "write",
                    "--table-file",
                    s(table),
                    "--offset",
                    &off.to_string(),
                ],
                data,
            ),
            "ucrypt write",
        );
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(repo().join("tests/ceph/cluster.sh"))
            .arg("stop")
            .arg(&self.dir)
            .output();
    }
}

/// The cluster the tests share (all but the OSD restart): started once, stopped by its
/// watchdog when the test process exits.
fn shared() -> Option<&'static Cluster> {
    static C: OnceLock<Mutex<Option<&'static Cluster>>> = OnceLock::new();
    let m = C.get_or_init(|| Mutex::new(None));
    let mut g = m.lock().unwrap_or_else(|p| p.into_inner());
    if g.is_none() {
        // Leaked on purpose: a static is never dropped; the watchdog stops it.
        *g = Cluster::start().map(|c| &*Box::leak(Box::new(c)));
    }
    *g
}

/// This run's scratch directory, `/tmp/ucrypt-rbd-tests/PID`. A static is never dropped, so
/// a `TempDir` here would stay behind after every run: instead each run removes the
/// directories of runs whose process is gone.
fn tmp() -> &'static Path {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        let base = Path::new("/tmp/ucrypt-rbd-tests");
        std::fs::create_dir_all(base).unwrap();
        for e in std::fs::read_dir(base).unwrap().flatten() {
            let name = e.file_name();
            let pid = name.to_str().and_then(|n| n.parse::<u32>().ok());
            if pid.is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists()) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        let d = base.join(std::process::id().to_string());
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        d
    })
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn ok(out: Output, what: &str) -> Vec<u8> {
    assert!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn passfile(name: &str, pw: &str) -> PathBuf {
    let p = tmp().join(name);
    std::fs::write(&p, pw).unwrap();
    p
}

/// Both directions on one image: librbd writes A (aligned) and B (unaligned), ucrypt reads
/// them; ucrypt writes C (unaligned, across a 4 KiB sector), librbd reads it.
fn both_ways(c: &Cluster, image: &str, fmt: &str, pass: &Path) {
    let (a, b, cc) = (
        random_bytes(1 << 20),
        random_bytes(10000),
        random_bytes(20000),
    );
    c.librbd_write(image, fmt, pass, 0, &a);
    c.librbd_write(image, fmt, pass, 5_251_073, &b);
    let table = c.table(&format!("rbd:rbd/{image}"), pass);
    assert!(
        c.ucrypt_read(&table, 0, a.len()) == a,
        "{image}: ucrypt reads other bytes than librbd wrote (aligned)"
    );
    assert!(
        c.ucrypt_read(&table, 5_251_073, b.len()) == b,
        "{image}: ucrypt reads other bytes than librbd wrote (unaligned)"
    );
    c.ucrypt_write(&table, 9_000_001, &cc);
    assert!(
        c.librbd_read(image, fmt, pass, 9_000_001, cc.len()) == cc,
        "{image}: librbd reads other bytes than ucrypt wrote"
    );
    // Nothing else moved: librbd still reads its own A.
    assert!(c.librbd_read(image, fmt, pass, 0, a.len()) == a);
}

#[test]
fn an_image_formatted_by_librbd_luks2_reads_the_same_in_ucrypt_and_back() {
    let Some(c) = shared() else { return };
    let pass = passfile("real.pw", "correct horse battery staple");
    c.create("real-luks2", "64M");
    // The one real `rbd encryption format` (7 s and more: libcryptsetup's PBKDF benchmark).
    ok(
        c.py(&["format", "rbd", "real-luks2", "luks2", s(&pass)]),
        "rbd encryption format luks2",
    );
    let dump = String::from_utf8(ok(
        c.ucrypt(&["luksDump", "rbd:rbd/real-luks2"], b""),
        "luksDump",
    ))
    .unwrap();
    assert!(dump.contains("Version:       \t2"), "{dump}");
    assert!(dump.contains("offset: 16777216 [bytes]"), "{dump}");
    assert!(dump.contains("sector: 4096 [bytes]"), "{dump}");
    let size = String::from_utf8(ok(
        c.py(&["size", "rbd", "real-luks2", "luks2", s(&pass)]),
        "size",
    ))
    .unwrap();
    assert_eq!(size.trim(), (48u64 << 20).to_string(), "librbd's view");
    both_ways(c, "real-luks2", "luks2", &pass);
    // A wrong passphrase is refused by both (ucrypt: exit 2 as cryptsetup).
    let bad = passfile("bad.pw", "wrong");
    let out = c.ucrypt(
        &[
            "open",
            "--test-passphrase",
            "rbd:rbd/real-luks2",
            "--key-file",
            s(&bad),
        ],
        b"",
    );
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn images_formatted_by_ucrypt_read_the_same_in_librbd_and_back() {
    let Some(c) = shared() else { return };
    let pass = passfile("u.pw", "ucrypt made this");
    for (image, ty, fmt) in [("u-luks2", "luks2", "luks2"), ("u-luks1", "luks1", "luks1")] {
        c.create(image, "64M");
        let dev = format!("rbd:rbd/{image}");
        let mut args = vec!["luksFormat", "-q", "--type", ty, &dev, s(&pass)];
        args.extend(CHEAP_PBKDF);
        ok(c.ucrypt(&args, b""), "ucrypt luksFormat");
        let out = c.ucrypt(&["isLuks", &dev], b"");
        assert!(out.status.success(), "isLuks");
        both_ways(c, image, fmt, &pass);
        // A keyslot added through the RBD device opens the image in librbd too.
        let pass2 = passfile(&format!("{image}.pw2"), "second passphrase");
        let mut args = vec!["luksAddKey", &dev, "--key-file", s(&pass), s(&pass2)];
        args.extend(CHEAP_PBKDF);
        ok(c.ucrypt(&args, b""), "ucrypt luksAddKey");
        let got = c.librbd_read(image, fmt, &pass2, 0, 4096);
        assert_eq!(got, c.librbd_read(image, fmt, &pass, 0, 4096));
    }
}

#[test]
fn a_cryptsetup_image_imported_with_rbd_import_opens_in_both() {
    let Some(c) = shared() else { return };
    let pass = passfile("cs.pw", "made by cryptsetup");
    let img = common::image(tmp(), "cs.img", 64 << 20);
    let out = Command::new("cryptsetup")
        .args([
            "luksFormat",
            "-q",
            "--type",
            "luks2",
            "--sector-size",
            "4096",
        ])
        .args(CHEAP_PBKDF)
        .arg(&img)
        .arg(&pass)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Plaintext written into the local file (through ucrypt's table for it) before import.
    let table = c.table(s(&img), &pass);
    let data = random_bytes(300_000);
    c.ucrypt_write(&table, 123_457, &data);
    ok(
        c.rbd(&["import", "--no-progress", s(&img), "rbd/cs"]),
        "rbd import",
    );
    std::fs::remove_file(&img).unwrap();
    assert!(c.librbd_read("cs", "luks2", &pass, 123_457, data.len()) == data);
    let table = c.table("rbd:rbd/cs", &pass);
    assert!(c.ucrypt_read(&table, 123_457, data.len()) == data);
    both_ways(c, "cs", "luks2", &pass);
}

/// `ucrypt open DEV NAME --device none`: the NBD URI it prints.
fn serve(c: &Cluster, dev: &str, name: &str, pass: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["open", dev, name, "--device", "none", "--key-file", s(pass)];
    args.extend(extra);
    c.ucrypt(&args, b"")
}

fn close(c: &Cluster, name: &str) {
    let _ = c.ucrypt(&["close", name], b"");
}

fn format_cheap(c: &Cluster, image: &str, pass: &Path) -> String {
    c.create(image, "64M");
    let dev = format!("rbd:rbd/{image}");
    let mut args = vec!["luksFormat", "-q", "--type", "luks2", &dev, s(pass)];
    args.extend(CHEAP_PBKDF);
    ok(c.ucrypt(&args, b""), "ucrypt luksFormat");
    dev
}

#[test]
fn a_read_write_open_holds_the_image_against_other_writers() {
    let Some(c) = shared() else { return };
    let pass = passfile("lock.pw", "locked");
    let dev = format_cheap(c, "lock", &pass);
    let uri = String::from_utf8(ok(serve(c, &dev, "lock1", &pass, &[]), "open")).unwrap();
    assert!(uri.starts_with("nbd+unix:"), "{uri}");
    let busy = serve(c, &dev, "lock2", &pass, &[]);
    assert_eq!(
        busy.status.code(),
        Some(5),
        "a second writer: {}",
        String::from_utf8_lossy(&busy.stderr)
    );
    let err = String::from_utf8_lossy(&busy.stderr);
    assert!(err.contains("in use"), "{err}");
    // A header change needs the lock too.
    let pass2 = passfile("lock.pw2", "another");
    let mut args = vec!["luksAddKey", &dev, "--key-file", s(&pass), s(&pass2)];
    args.extend(CHEAP_PBKDF);
    let out = c.ucrypt(&args, b"");
    assert_eq!(
        out.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // librbd's own writes are refused (EROFS), reads of the header still work.
    let f = tmp().join("lock.data");
    std::fs::write(&f, [7u8; 4096]).unwrap();
    let out = c.py(&["write-unlocked", "rbd", "lock", "20000000", s(&f)]);
    assert_eq!(
        out.status.code(),
        Some(30),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ok(c.ucrypt(&["luksDump", &dev], b""), "luksDump while open");
    // A read-only open takes no lock.
    let ro = serve(c, &dev, "lock-ro", &pass, &["--read-only"]);
    assert!(
        ro.status.success(),
        "{}",
        String::from_utf8_lossy(&ro.stderr)
    );
    close(c, "lock-ro");
    close(c, "lock1");
    let again = serve(c, &dev, "lock3", &pass, &[]);
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    close(c, "lock3");
}

/// The pattern of block `i` in generation `g` (4 KiB blocks).
fn block(i: u64, g: u64) -> Vec<u8> {
    let mut rng = common::Rng::new(i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ g ^ 0x5eed);
    let mut b = vec![0u8; 4096];
    rng.fill(&mut b);
    b
}

/// Writes blocks 0, 1, 2, ... through `uri` until `stop` or an error, a FLUSH after every
/// 8: `flushed` is the count covered by a completed FLUSH, `acked` the count acknowledged.
fn writer(
    uri: String,
    stop: Arc<AtomicBool>,
    flushed: Arc<AtomicU64>,
    acked: Arc<AtomicU64>,
    blocks: u64,
) -> std::thread::JoinHandle<Option<String>> {
    std::thread::spawn(move || {
        let nbd = match ucrypt_nbd::NbdBackend::connect(&uri, ucrypt_nbd::RemoteOptions::default())
        {
            Ok(n) => n,
            Err(e) => return Some(format!("connect: {e}")),
        };
        let mut i = 0;
        while !stop.load(Ordering::SeqCst) {
            if let Err(e) = nbd.write_at(&block(i % blocks, i / blocks), (i % blocks) * 4096, false)
            {
                return Some(format!("write {i}: {e}"));
            }
            i += 1;
            acked.store(i, Ordering::SeqCst);
            if i % 8 == 0 {
                if let Err(e) = nbd.flush() {
                    return Some(format!("flush after {i}: {e}"));
                }
                flushed.store(i, Ordering::SeqCst);
            }
        }
        None
    })
}

/// The `ucrypt open` server's pid from its status output.
fn server_pid(c: &Cluster, name: &str) -> i32 {
    let st = String::from_utf8(ok(c.ucrypt(&["status", name], b""), "status")).unwrap();
    st.lines()
        .find_map(|l| l.split("(pid ").nth(1))
        .and_then(|r| r.trim_end_matches(')').parse().ok())
        .unwrap_or_else(|| panic!("no pid in {st}"))
}

#[test]
fn kill_9_of_the_server_during_writes_loses_nothing_flushed() {
    let Some(c) = shared() else { return };
    let pass = passfile("kill.pw", "killed");
    let dev = format_cheap(c, "kill", &pass);
    let uri = String::from_utf8(ok(serve(c, &dev, "kill1", &pass, &[]), "open")).unwrap();
    let pid = server_pid(c, "kill1");
    let (stop, flushed, acked) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    // Fewer blocks than writes: later generations overwrite earlier ones.
    const BLOCKS: u64 = 600;
    let w = writer(
        uri.trim().to_string(),
        stop.clone(),
        flushed.clone(),
        acked.clone(),
        BLOCKS,
    );
    let t = Instant::now();
    while flushed.load(Ordering::SeqCst) < 800 && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill(2) on the pid of the server this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let err = w.join().unwrap();
    assert!(
        err.is_some(),
        "the writer went on after the server was killed"
    );
    let (f, a) = (flushed.load(Ordering::SeqCst), acked.load(Ordering::SeqCst));
    assert!(f >= 800, "only {f} writes flushed in a minute");
    // Reopen: the dead client's lock goes once its watch expires (15 s in this cluster).
    let t = Instant::now();
    let table = loop {
        let out = serve(c, &dev, "kill2", &pass, &[]);
        if out.status.success() {
            close(c, "kill2");
            break c.table(&dev, &pass);
        }
        assert_eq!(
            out.status.code(),
            Some(5),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            t.elapsed() < Duration::from_secs(90),
            "the dead server's lock was never broken"
        );
        std::thread::sleep(Duration::from_secs(1));
    };
    eprintln!(
        "kill -9: {f} writes flushed, {a} acknowledged; reopened after {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let view = c.ucrypt_read(&table, 0, (BLOCKS * 4096) as usize);
    for i in 0..BLOCKS {
        let got = &view[(i * 4096) as usize..((i + 1) * 4096) as usize];
        // The last write of block i that a completed FLUSH covered, or a later one that
        // was acknowledged (or not: in flight when the server died) before the kill.
        let last_flushed = (0..f).rev().find(|n| n % BLOCKS == i);
        // (f >= 800 > BLOCKS: every block had a flushed write.)
        let last_flushed = last_flushed.unwrap();
        let ok = (last_flushed..=a)
            .filter(|n| n % BLOCKS == i)
            .any(|n| got == block(i, n / BLOCKS).as_slice());
        assert!(
            ok,
            "block {i}: not the last flushed write ({last_flushed:?}) nor a later one \
             (flushed {f}, acknowledged {a})"
        );
    }
}

#[test]
fn an_osd_restart_during_io_waits_or_fails_but_never_returns_wrong_data() {
    if !require("ceph-osd") {
        return;
    }
    let Some(c) = Cluster::start() else { return };
    let pass = passfile("osd.pw", "osd restart");
    let dev = format_cheap(&c, "osd", &pass);
    let uri = String::from_utf8(ok(serve(&c, &dev, "osd1", &pass, &[]), "open")).unwrap();
    let (stop, flushed, acked) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    const BLOCKS: u64 = 400;
    let w = writer(
        uri.trim().to_string(),
        stop.clone(),
        flushed.clone(),
        acked.clone(),
        BLOCKS,
    );
    let t = Instant::now();
    while acked.load(Ordering::SeqCst) < 200 && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = acked.load(Ordering::SeqCst);
    let out = Command::new(repo().join("tests/ceph/cluster.sh"))
        .arg("restart-osd")
        .arg(&c.dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Writes go on after the restart (they waited for the OSD, or the writer saw an error).
    let t = Instant::now();
    while acked.load(Ordering::SeqCst) < before + 300
        && t.elapsed() < Duration::from_secs(90)
        && !w.is_finished()
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::SeqCst);
    let err = w.join().unwrap();
    let (f, a) = (flushed.load(Ordering::SeqCst), acked.load(Ordering::SeqCst));
    eprintln!(
        "osd restart: {before} acknowledged before, {a} after, {f} flushed, writer error {err:?}"
    );
    // Every block reads back as its last acknowledged write (or a later one in flight).
    let nbd =
        ucrypt_nbd::NbdBackend::connect(uri.trim(), ucrypt_nbd::RemoteOptions::default()).unwrap();
    for i in 0..BLOCKS.min(a) {
        let mut got = vec![0u8; 4096];
        nbd.read_at(&mut got, i * 4096).unwrap();
        let last = (0..a).rev().find(|n| n % BLOCKS == i).unwrap();
        let ok = (last..=a)
            .filter(|n| n % BLOCKS == i)
            .any(|n| got == block(i, n / BLOCKS));
        assert!(ok, "block {i} reads wrong data after the OSD restart");
    }
    drop(nbd);
    close(&c, "osd1");
}

#[test]
fn a_discard_reaches_the_image_with_allow_discards() {
    let Some(c) = shared() else { return };
    let pass = passfile("trim.pw", "trimmed");
    let dev = format_cheap(c, "trim", &pass);
    let uri = String::from_utf8(ok(
        serve(c, &dev, "trim1", &pass, &["--allow-discards"]),
        "open",
    ))
    .unwrap();
    let nbd =
        ucrypt_nbd::NbdBackend::connect(uri.trim(), ucrypt_nbd::RemoteOptions::default()).unwrap();
    // Plaintext 0..4 MiB is image bytes 16..20 MiB: one whole RADOS object (4 MiB objects),
    // which librbd removes on discard (it skips partial-object discards by default).
    let data = random_bytes(4 << 20);
    nbd.write_at(&data, 0, false).unwrap();
    nbd.flush().unwrap();
    let raw = || c.librbd_read("trim", "raw", &pass, 16 << 20, 1 << 20);
    assert!(raw().iter().any(|&b| b != 0), "no ciphertext written");
    nbd.discard(0, 4 << 20).unwrap();
    nbd.flush().unwrap();
    assert!(
        raw().iter().all(|&b| b == 0),
        "the discard did not reach the image (its object is still there)"
    );
    drop(nbd);
    close(c, "trim1");
}

/// librbd's asynchronous path as the backend offers it (`rbd_aio_*` with a completion
/// callback): writes of several submitters all in flight at once, completions on librbd's
/// threads, read back both ways; out-of-range requests refused or failed.
#[test]
fn the_rbd_backend_passes_the_asynchronous_conformance_suite() {
    let Some(c) = shared() else { return };
    c.create("asyncconf", "8M");
    let dev = format!("rbd:rbd/asyncconf:conf={}", c.conf.display());
    let b: Arc<dyn Backend> = Arc::new(
        ucrypt_backend::RbdBackend::open(&dev, ucrypt_backend::RbdOptions::default()).unwrap(),
    );
    ucrypt_backend::testing::async_conformance(&b, 8);
    ucrypt_backend::testing::conformance_concurrent(&*b, 8);
}

/// One NBD connection at depth 32 (32 threads sharing it) through `ucrypt open` of an RBD
/// image, so reads and writes take the asynchronous path (submitted by the receiving thread,
/// answered from librbd's completion): each thread writes and reads back its own blocks over
/// three generations, and every thread also overwrites and reads one shared block, which
/// must always read as one writer's block whole (never a mix: the range lock); after a
/// flush and a close, a fresh open reads every block's last generation.
#[test]
fn depth_32_on_one_connection_through_the_asynchronous_path_reads_what_it_wrote() {
    let Some(c) = shared() else { return };
    let pass = passfile("depth.pw", "deep");
    let dev = format_cheap(c, "depth", &pass);
    let uri = String::from_utf8(ok(serve(c, &dev, "depth1", &pass, &[]), "open")).unwrap();
    let nbd = Arc::new(
        ucrypt_nbd::NbdBackend::connect(uri.trim(), ucrypt_nbd::RemoteOptions::default()).unwrap(),
    );
    const THREADS: u64 = 32;
    const PER: u64 = 16;
    const SHARED: u64 = THREADS * PER;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let nbd = Arc::clone(&nbd);
            s.spawn(move || {
                for g in 0..3 {
                    for k in 0..PER {
                        let i = t + k * THREADS;
                        nbd.write_at(&block(i, g), i * 4096, false).unwrap();
                        nbd.write_at(&block(SHARED, t), SHARED * 4096, false)
                            .unwrap();
                    }
                    for k in 0..PER {
                        let i = t + k * THREADS;
                        let mut got = vec![0u8; 4096];
                        nbd.read_at(&mut got, i * 4096).unwrap();
                        assert!(got == block(i, g), "block {i} generation {g} reads wrong");
                        nbd.read_at(&mut got, SHARED * 4096).unwrap();
                        assert!(
                            (0..THREADS).any(|w| got == block(SHARED, w)),
                            "the shared block reads as no single writer's block"
                        );
                    }
                }
            });
        }
    });
    nbd.flush().unwrap();
    drop(nbd);
    close(c, "depth1");
    let table = c.table(&dev, &pass);
    let view = c.ucrypt_read(&table, 0, (SHARED * 4096) as usize);
    for i in 0..SHARED {
        assert!(
            view[(i * 4096) as usize..((i + 1) * 4096) as usize] == block(i, 2)[..],
            "block {i} lost its last generation after flush and close"
        );
    }
}

/// A table of two targets on one image (a crypt target and a linear one after it, as a LUKS2
/// volume in the middle of a reencryption maps it) opens the image once: served read-write it
/// holds the exclusive lock with one handle (no refusal, no lock passed back and forth
/// between its own handles), a second ucrypt writer is still refused with exit 5, and data
/// written across the boundary lands encrypted before it and as it is after it.
#[test]
fn a_two_target_table_on_one_image_holds_one_handle_and_the_lock() {
    let Some(c) = shared() else { return };
    let pass = passfile("twot.pw", "two targets");
    let dev = format_cheap(c, "twot", &pass);
    let line = String::from_utf8(std::fs::read(c.table(&dev, &pass)).unwrap()).unwrap();
    // start length crypt cipher key iv_offset device offset [options]
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!((f[2], f[6]), ("crypt", dev.as_str()), "{line}");
    let (len, off): (u64, u64) = (f[1].parse().unwrap(), f[7].parse().unwrap());
    let half = len / 2;
    let mut first: Vec<String> = f.iter().map(|s| s.to_string()).collect();
    first[1] = half.to_string();
    let table = tmp().join("twot.two-targets");
    std::fs::write(
        &table,
        format!(
            "{}\n{half} {} linear {dev} {}\n",
            first.join(" "),
            len - half,
            off + half
        ),
    )
    .unwrap();
    let uri = String::from_utf8(ok(
        c.ucrypt(
            &[
                "open",
                "--table-file",
                s(&table),
                "twot1",
                "--device",
                "none",
            ],
            b"",
        ),
        "open of a two-target table on one image",
    ))
    .unwrap();
    let busy = serve(c, &dev, "twot2", &pass, &[]);
    assert_eq!(
        busy.status.code(),
        Some(5),
        "a second writer beside the two-target table: {}",
        String::from_utf8_lossy(&busy.stderr)
    );
    let nbd =
        ucrypt_nbd::NbdBackend::connect(uri.trim(), ucrypt_nbd::RemoteOptions::default()).unwrap();
    // 1 MiB across the boundary (half a MiB each side), then 4 KiB blocks on both sides at
    // depth 8, every one read back.
    let at = half * 512 - (512 << 10);
    let data = random_bytes(1 << 20);
    nbd.write_at(&data, at, false).unwrap();
    let nbd = Arc::new(nbd);
    std::thread::scope(|sc| {
        for t in 0..8u64 {
            let nbd = Arc::clone(&nbd);
            sc.spawn(move || {
                for k in 0..16u64 {
                    let i = t + 8 * k;
                    let pos = at + (1 << 20) + i * 4096;
                    nbd.write_at(&block(i, 0), pos, false).unwrap();
                    let mut got = vec![0u8; 4096];
                    nbd.read_at(&mut got, pos).unwrap();
                    assert!(
                        got == block(i, 0),
                        "block {i} past the boundary reads wrong"
                    );
                }
            });
        }
    });
    nbd.flush().unwrap();
    let mut back = vec![0u8; data.len()];
    nbd.read_at(&mut back, at).unwrap();
    assert!(
        back == data,
        "the write across the boundary reads back wrong"
    );
    drop(nbd);
    close(c, "twot1");
    // The first half is ciphertext of the volume's key, the second the bytes as written.
    let whole = c.table(&dev, &pass);
    let enc = c.ucrypt_read(&whole, at, 512 << 10);
    assert!(enc == data[..512 << 10], "the crypt target's part");
    let raw = tmp().join("twot.raw");
    std::fs::write(&raw, format!("0 {} linear {dev} 0\n", off + len)).unwrap();
    let plain = c.ucrypt_read(&raw, off * 512 + half * 512, 512 << 10);
    assert!(plain == data[512 << 10..], "the linear target's part");
    let ct = c.ucrypt_read(&raw, off * 512 + at, 512 << 10);
    assert!(ct != data[..512 << 10], "the crypt target wrote plaintext");
    // Released on close: a one-line open takes the lock again.
    let again = serve(c, &dev, "twot3", &pass, &[]);
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    close(c, "twot3");
}

/// A recoverable instance's writes (`rbd::set_writethrough`, what `open --device ublk|nbd`
/// and `--recover` set) complete only once an OSD has them: with the OSD stopped
/// (SIGSTOP) a write after the first flush stays pending, where librbd's default
/// write-around cache completes it at once (checked in the same run, so the test can fail).
#[test]
fn a_recoverable_instance_acknowledges_only_writes_an_osd_has() {
    let Some(c) = shared() else { return };
    c.create("wthrough", "8M");
    let dev = format!("rbd:rbd/wthrough:conf={}", c.conf.display());
    // The OSD stopped (SIGSTOP), not `ceph osd pause`: a client that has not seen the new
    // map yet sends its writes anyway.
    let osd: i32 = std::fs::read_to_string(c.dir.join("run/osd.0.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let ceph = |arg: &str| {
        let sig = if arg == "pause" {
            libc::SIGSTOP
        } else {
            libc::SIGCONT
        };
        // SAFETY: kill(2) on this test's own cluster's OSD.
        assert_eq!(unsafe { libc::kill(osd, sig) }, 0, "signalling the OSD");
    };
    // Whether a write completes within 2 s while the OSD is stopped.
    let acked_while_paused = |writethrough: bool| -> bool {
        let b = Arc::new(
            ucrypt_backend::RbdBackend::open(
                &dev,
                ucrypt_backend::RbdOptions {
                    read_only: false,
                    writethrough,
                },
            )
            .unwrap(),
        );
        // Past librbd's writethrough-until-flush start.
        b.write_at(&[1u8; 4096], 0, false).unwrap();
        b.flush().unwrap();
        ceph("pause");
        let (tx, rx) = std::sync::mpsc::channel();
        let w = Arc::clone(&b);
        let t = std::thread::spawn(move || {
            let r = w.write_at(&[2u8; 4096], 1 << 20, false);
            let _ = tx.send(());
            r
        });
        let acked = rx.recv_timeout(Duration::from_secs(2)).is_ok();
        ceph("unpause");
        t.join().unwrap().unwrap();
        b.flush().unwrap();
        acked
    };
    assert!(
        acked_while_paused(false),
        "librbd's default cache waited for the OSD: this test would prove nothing"
    );
    assert!(
        !acked_while_paused(true),
        "a write-through open acknowledged a write no OSD has"
    );
}
