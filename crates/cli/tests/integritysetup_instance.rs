//! `ucrypt integritysetup open DEV NAME` starts a named instance like `ucrypt open` does
//! (here `--device none`: the NBD socket, no root needed), on images Linux's dm-integrity
//! wrote (testdata/integrity): real NBD clients (nbdcopy, qemu-io, nbdinfo) read what the
//! kernel read and write through it; `integritysetup status NAME` prints integritysetup
//! 2.6.1's lines with the values `dmsetup table` showed for the kernel's device; a flipped
//! tag byte is an I/O error for that block only and is counted in `failures`; `close NAME`
//! ends it and `status` then exits 4.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn data() -> Option<PathBuf> {
    let d = ucrypt_testkit::testdata("integrity", "README.md")?;
    ["xz", "qemu-io", "nbdcopy", "nbdinfo"]
        .iter()
        .all(|t| ucrypt_testkit::require(t))
        .then_some(d)
}

/// A scratch directory and, inside it, the runtime directory the test's instances live in.
fn scratch() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    std::fs::create_dir(&run).unwrap();
    (tmp, run)
}

fn unxz(src: &Path, dst: &Path) {
    let out = Command::new("xz").arg("-dc").arg(src).output().unwrap();
    assert!(out.status.success());
    std::fs::write(dst, out.stdout).unwrap();
}

/// `ucrypt` with its instances under `run`.
fn ucrypt(run: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ucrypt"))
        .env("UCRYPT_RUNTIME_DIR", run)
        .args(args)
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Closes the instance when a test ends, passed or not.
struct Instance<'a> {
    run: &'a Path,
    name: &'a str,
}

impl Drop for Instance<'_> {
    fn drop(&mut self) {
        let _ = ucrypt(self.run, &["integritysetup", "close", self.name]);
    }
}

fn open<'a>(run: &'a Path, name: &'a str, img: &Path, extra: &[&str]) -> Instance<'a> {
    let mut args = vec!["integritysetup", "open", img.to_str().unwrap(), name];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--device", "none"]);
    let out = ucrypt(run, &args);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout(&out).starts_with(&format!("nbd+unix:///{name}?socket=")),
        "{out:?}"
    );
    Instance { run, name }
}

fn uri(run: &Path, name: &str) -> String {
    format!(
        "nbd+unix:///{name}?socket={}",
        run.join(name).join("nbd.sock").display()
    )
}

fn qemu_io(uri: &str, cmds: &[&str]) -> Output {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw"]);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    c.arg(uri).output().unwrap()
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

const HMAC: &str = "hmac-sha256-4096-J";

/// Read, write, status, close, reopen read-only, tamper: one image through its life.
#[test]
fn a_named_instance_serves_reports_and_closes() {
    let Some(dir) = data() else { return };
    let (tmp, run) = scratch();
    let img = tmp.path().join("k.img");
    unxz(&dir.join(format!("{HMAC}.img.xz")), &img);
    let key = dir.join("key32.bin");
    let keyed = ["--integrity", "hmac-sha256", "--integrity-key-file"];
    let mut keyed: Vec<&str> = keyed.to_vec();
    keyed.push(key.to_str().unwrap());
    let size: u64 = std::fs::read_to_string(dir.join(format!("{HMAC}.size")))
        .unwrap()
        .trim()
        .parse()
        .unwrap();

    let vol = open(&run, "ivol", &img, &keyed);
    let u = uri(&run, "ivol");
    // nbdinfo sees the kernel's size; nbdcopy reads what the kernel read.
    let out = Command::new("nbdinfo")
        .args(["--size", &u])
        .output()
        .unwrap();
    assert_eq!(stdout(&out).trim(), size.to_string(), "{out:?}");
    let plain = tmp.path().join("plain");
    let out = Command::new("nbdcopy")
        .arg(&u)
        .arg(&plain)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let mut want = std::fs::read(&plain).unwrap();
    assert_eq!(
        sha256_hex(&want),
        std::fs::read_to_string(dir.join(format!("{HMAC}.sha256")))
            .unwrap()
            .trim()
    );

    // The status integritysetup 2.6.1 prints, with dmsetup table's values for this
    // image (block_size:4096 journal_sectors:264 interleave_sectors:32768
    // journal_watermark:50 commit_time:10000 internal_hash:hmac(sha256)).
    let out = ucrypt(&run, &["integritysetup", "status", "ivol"]);
    assert!(out.status.success(), "{out:?}");
    let device = std::fs::canonicalize(&img).unwrap();
    let expect = format!(
        "ivol is active.\n  type:    INTEGRITY\n  tag size: 32\n  integrity: hmac(sha256)\n  \
         device:  {}\n  sector size:  4096 bytes\n  interleave sectors: 32768\n  \
         size:    {} sectors\n  mode:    read/write\n  failures: 0\n  \
         journal size: {} bytes\n  journal watermark: 50%\n  journal commit time: 10000 ms\n",
        device.display(),
        size / 512,
        264 * 512
    );
    assert_eq!(stdout(&out), expect);

    // Writes through the instance: 64 KiB of 0xab at 8 KiB, read back at once.
    let out = qemu_io(&u, &["write -P 0xab 8192 65536", "read -P 0xab 8192 65536"]);
    assert!(
        out.status.success() && !stdout(&out).contains("fail"),
        "{out:?}"
    );
    want[8192..8192 + 65536].fill(0xab);
    // `ucrypt status` shows the same lines and the front end.
    let out = ucrypt(&run, &["status", "ivol"]);
    assert!(stdout(&out).contains("  type:    INTEGRITY\n"), "{out:?}");
    assert!(stdout(&out).contains("  front end: none\n"), "{out:?}");
    drop(vol);
    let out = ucrypt(&run, &["integritysetup", "status", "ivol"]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert_eq!(stdout(&out), "ivol is inactive.\n");

    // Reopened read-only: the writes are on the device (journal committed at close).
    let mut ro = keyed.clone();
    ro.push("--read-only");
    let vol = open(&run, "ivol", &img, &ro);
    let back = tmp.path().join("back");
    let out = Command::new("nbdcopy").arg(&u).arg(&back).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        sha256_hex(&std::fs::read(&back).unwrap()),
        sha256_hex(&want)
    );
    let st = stdout(&ucrypt(&run, &["integritysetup", "status", "ivol"]));
    assert!(st.contains("  mode:    readonly\n"), "{st}");
    let out = qemu_io(&u, &["write -P 1 0 4096"]);
    assert!(
        !out.status.success() || stdout(&out).contains("failed"),
        "{out:?}"
    );
    drop(vol);

    // One tag byte flipped: block 100 fails with EIO (its neighbours read), counted once.
    // (Not a block written above: the journal still holds those, and an open replays it
    // over their places, tags included, as the kernel's does.)
    let mut bytes = std::fs::read(&img).unwrap();
    bytes[(8 + 264) * 512 + 100 * 32] ^= 1;
    std::fs::write(&img, bytes).unwrap();
    let _vol = open(&run, "ivol", &img, &keyed);
    let out = qemu_io(&u, &["read 409600 4096"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("read failed: Input/output error")
            || String::from_utf8_lossy(&out.stderr).contains("Input/output error"),
        "{out:?}"
    );
    let out = qemu_io(
        &u,
        &[
            "read -P 0xab 36864 4096",
            "read 405504 4096",
            "read 413696 4096",
        ],
    );
    assert!(
        out.status.success() && !stdout(&out).contains("fail"),
        "{out:?}"
    );
    let st = stdout(&ucrypt(&run, &["integritysetup", "status", "ivol"]));
    assert!(st.contains("  failures: 1\n"), "{st}");
    let st = stdout(&ucrypt(&run, &["status", "ivol"]));
    assert!(st.contains("  failures: 1\n"), "{st}");
}

/// The modes' lines: `-D` says the journal is not active, `-B` prints the bitmap's
/// sectors per bit and flush interval; a taken name is refused with exit 5 before the
/// device is touched; a crypt instance is not an INTEGRITY device for `status`.
#[test]
fn status_of_each_mode_and_refusals() {
    let Some(dir) = data() else { return };
    let (tmp, run) = scratch();
    let d = tmp.path().join("d.img");
    unxz(&dir.join("crc32c-512-D.img.xz"), &d);
    let b = tmp.path().join("b.img");
    unxz(&dir.join("crc32c-4096-B.img.xz"), &b);

    let _dv = open(&run, "dvol", &d, &["-D"]);
    let st = stdout(&ucrypt(&run, &["integritysetup", "status", "dvol"]));
    assert!(st.contains("  integrity: crc32c\n  "), "{st}");
    assert!(st.contains("  tag size: 4\n"), "{st}");
    assert!(st.contains("  sector size:  512 bytes\n"), "{st}");
    assert!(
        st.ends_with("  failures: 0\n  journal: not active\n"),
        "{st}"
    );
    // The name is taken: exit 5, whatever the device.
    let out = ucrypt(
        &run,
        &[
            "integritysetup",
            "open",
            b.to_str().unwrap(),
            "dvol",
            "--device",
            "none",
        ],
    );
    assert_eq!(out.status.code(), Some(5), "{out:?}");

    let _bv = open(&run, "bvol", &b, &["-B"]);
    let st = stdout(&ucrypt(&run, &["integritysetup", "status", "bvol"]));
    assert!(st.contains("  sector size:  4096 bytes\n"), "{st}");
    assert!(st.contains("  bitmap 512-byte sectors per bit: "), "{st}");
    assert!(st.contains("  bitmap flush interval: 10000 ms\n"), "{st}");

    // A plain crypt instance: status refuses it by type.
    let plain = tmp.path().join("p.img");
    std::fs::write(&plain, vec![0u8; 1 << 20]).unwrap();
    let line = format!(
        "0 2048 crypt aes-xts-plain64 {} 0 {} 0",
        "11".repeat(64),
        plain.display()
    );
    let out = ucrypt(
        &run,
        &["open", "--table", &line, "cvol", "--device", "none"],
    );
    assert!(out.status.success(), "{out:?}");
    let out = ucrypt(&run, &["integritysetup", "status", "cvol"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an INTEGRITY device"));
    let out = ucrypt(&run, &["close", "cvol"]);
    assert!(out.status.success(), "{out:?}");
}

/// `--run CMD` (no NAME): the device served for CMD, which nbdinfo reads the size of.
#[test]
fn open_run_serves_for_the_command() {
    let Some(dir) = data() else { return };
    let (tmp, run) = scratch();
    let img = tmp.path().join("c.img");
    unxz(&dir.join("crc32c-512-J.img.xz"), &img);
    let size = std::fs::read_to_string(dir.join("crc32c-512-J.size")).unwrap();
    let out = ucrypt(
        &run,
        &[
            "integritysetup",
            "open",
            img.to_str().unwrap(),
            "--run",
            "nbdinfo --size \"$uri\"",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout(&out).trim(), size.trim());
}

/// `status` prints what integritysetup 2.6.1 printed on Linux 6.12 for a device of the same
/// options (testdata/integrity/status, captured by tests/lab/integrity_status.sh on 8 MiB
/// images integritysetup formatted): modes J, D and B, keyed tags with a journal MAC, an
/// encrypted journal with its watermark and commit time given. The one difference: the
/// device is the image itself, where integritysetup names the loop device it set up, then
/// the image.
#[test]
fn status_prints_what_integritysetup_printed() {
    let Some(dir) = data() else { return };
    let (tmp, run) = scratch();
    let key = tmp.path().join("key");
    std::fs::write(&key, [b'A'; 32]).unwrap();
    let jkey = tmp.path().join("jkey");
    std::fs::write(&jkey, [b'B'; 32]).unwrap();
    let (k, j) = (key.to_str().unwrap(), jkey.to_str().unwrap());
    let hmac = [
        "-I",
        "hmac-sha256",
        "--integrity-key-file",
        k,
        "--integrity-key-size",
        "32",
        "--journal-integrity",
        "hmac-sha256",
        "--journal-integrity-key-file",
        j,
        "--journal-integrity-key-size",
        "32",
    ];
    let jc = [
        "--journal-crypt",
        "ctr-aes",
        "--journal-crypt-key-file",
        j,
        "--journal-crypt-key-size",
        "32",
    ];
    let with = |a: &[&str], b: &[&str]| -> Vec<String> {
        a.iter().chain(b).map(|s| s.to_string()).collect()
    };
    let cases: Vec<(&str, Vec<String>, Vec<String>)> = vec![
        ("J", vec![], vec![]),
        ("D", vec![], vec!["-D".into()]),
        ("B", vec!["-B".into()], vec!["-B".into()]),
        ("hmac-jmac", with(&hmac, &["-s", "4096"]), with(&hmac, &[])),
        (
            "jc",
            with(&jc, &[]),
            with(
                &jc,
                &["--journal-watermark", "30", "--journal-commit-time", "5000"],
            ),
        ),
    ];
    for (mode, format, opts) in cases {
        let img = tmp.path().join(format!("{mode}.img"));
        std::fs::File::create(&img)
            .unwrap()
            .set_len(8 << 20)
            .unwrap();
        let mut args = vec!["-q", "integritysetup", "format", img.to_str().unwrap()];
        args.extend(format.iter().map(String::as_str));
        args.push("--integrity-no-wipe");
        let out = ucrypt(&run, &args);
        assert!(out.status.success(), "{mode}: {out:?}");
        let name = format!("k{mode}");
        let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
        let _vol = open(&run, &name, &img, &opts);
        let out = ucrypt(&run, &["integritysetup", "status", &name]);
        assert!(out.status.success(), "{mode}: {out:?}");
        let kernel =
            std::fs::read_to_string(dir.join("status").join(format!("{mode}.txt"))).unwrap();
        let device = std::fs::canonicalize(&img).unwrap();
        let mut want = String::new();
        for l in kernel.lines() {
            if l.starts_with("0 ") {
                continue; // dmsetup table, kept for reference
            } else if let Some(rest) = l.strip_prefix("/dev/mapper/") {
                want.push_str(rest);
            } else if l.starts_with("  device:  ") {
                want.push_str(&format!("  device:  {}", device.display()));
            } else if l.starts_with("  loop:    ") {
                continue;
            } else {
                want.push_str(l);
            }
            want.push('\n');
        }
        assert_eq!(stdout(&out), want, "{mode}");
    }
}

/// `--data-device`: `format META --data-device DATA`, `open META NAME --data-device DATA`
/// and `status NAME` print what integritysetup 2.6.1 printed on Linux 6.12 for 1 MiB of
/// metadata and 8 MiB of data in modes J, D, B and R (testdata/integrity/status/datadev-*,
/// made by testdata/integrity/datadev/make.sh; the devices are the images themselves where
/// integritysetup names its loop devices); a kernel-made pair reads back as the kernel read
/// it; the errors integritysetup gives for bad input, with its exit codes.
#[test]
fn data_device_format_open_status_and_refusals() {
    let Some(dir) = data() else { return };
    let (tmp, run) = scratch();
    let sized = |name: &str, bytes: u64| -> PathBuf {
        let p = tmp.path().join(name);
        std::fs::File::create(&p).unwrap().set_len(bytes).unwrap();
        std::fs::canonicalize(p).unwrap()
    };
    for (mode, opts) in [("J", ""), ("D", "-D"), ("B", "-B"), ("R", "-R")] {
        let meta = sized(&format!("{mode}.meta"), 1 << 20);
        let data = sized(&format!("{mode}.data"), 8 << 20);
        let (m, d) = (meta.to_str().unwrap(), data.to_str().unwrap());
        let out = ucrypt(
            &run,
            &["-q", "integritysetup", "format", m, "--data-device", d],
        );
        assert!(out.status.success(), "{mode}: {out:?}");
        let name = format!("s{mode}");
        let mut extra = vec!["--data-device", d];
        if !opts.is_empty() {
            extra.push(opts);
        }
        let _vol = open(&run, &name, &meta, &extra);
        let out = ucrypt(&run, &["integritysetup", "status", &name]);
        assert!(out.status.success(), "{mode}: {out:?}");
        let kernel =
            std::fs::read_to_string(dir.join("status").join(format!("datadev-{mode}.txt")))
                .unwrap();
        let mut want = String::new();
        for l in kernel.lines() {
            if l.starts_with("0 ") || l.starts_with("  loop:    ") {
                continue;
            } else if let Some(rest) = l.strip_prefix("/dev/mapper/") {
                want.push_str(rest);
            } else if l.starts_with("  device:  ") {
                want.push_str(&format!("  device:  {d} (detached)"));
            } else if l.starts_with("  metadata device:  ") {
                want.push_str(&format!("  metadata device:  {m}"));
            } else {
                want.push_str(l);
            }
            want.push('\n');
        }
        assert_eq!(stdout(&out), want, "{mode}");
        let out = ucrypt(&run, &["integritysetup", "dump", m]);
        assert!(
            stdout(&out).contains("log2_interleave_sectors 0\n"),
            "{out:?}"
        );
    }

    // A kernel-made pair: the NBD export reads what the kernel read.
    let dd = dir.join("datadev");
    let name = "crc32c-4096-datadev-J";
    let meta = tmp.path().join("k.meta");
    let data = tmp.path().join("k.data");
    unxz(&dd.join(format!("{name}.meta.img.xz")), &meta);
    unxz(&dd.join(format!("{name}.data.img.xz")), &data);
    let _k = open(
        &run,
        "kpair",
        &meta,
        &["--data-device", data.to_str().unwrap()],
    );
    let out = Command::new("nbdcopy")
        .args([&uri(&run, "kpair"), "-"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let want = std::fs::read_to_string(dd.join(format!("{name}.sha256"))).unwrap();
    assert_eq!(sha256_hex(&out.stdout), want.trim());

    // Bad input, as integritysetup 2.6.1 answered (testdata/integrity/datadev/errors.txt).
    let m = sized("bad.meta", 1 << 20);
    let d4 = sized("bad.data", 4 << 20);
    let tiny = sized("tiny", 4096);
    let empty = sized("empty", 0);
    let (ms, ds) = (m.to_str().unwrap(), d4.to_str().unwrap());
    let fmt = |meta: &str, data: &str| {
        ucrypt(
            &run,
            &[
                "-q",
                "integritysetup",
                "format",
                meta,
                "--data-device",
                data,
            ],
        )
    };
    // An empty data device: exit 1.
    let out = fmt(ms, empty.to_str().unwrap());
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("too small"),
        "{out:?}"
    );
    // A metadata device too small for one journal section and the tags: exit 4.
    let out = fmt(tiny.to_str().unwrap(), ds);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("metadata device"),
        "{out:?}"
    );
    // 4 KiB of data formats (8 sectors).
    let out = fmt(ms, tiny.to_str().unwrap());
    assert!(out.status.success(), "{out:?}");
    // A data-device format opened without its data device, a plain format opened with
    // one, and a data device smaller than formatted: exit 4 with the reason.
    let out = fmt(ms, ds);
    assert!(out.status.success(), "{out:?}");
    let open_fail = |dev: &str, extra: &[&str], want: &str| {
        let mut args = vec!["integritysetup", "open", dev, "x", "--device", "none"];
        args.extend_from_slice(extra);
        let out = ucrypt(&run, &args);
        assert_eq!(out.status.code(), Some(4), "{out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(want),
            "{want}: {out:?}"
        );
    };
    open_fail(ms, &[], "--data-device");
    let plain = sized("plain", 4 << 20);
    let out = ucrypt(
        &run,
        &["-q", "integritysetup", "format", plain.to_str().unwrap()],
    );
    assert!(out.status.success(), "{out:?}");
    open_fail(
        plain.to_str().unwrap(),
        &["--data-device", ds],
        "without a data device",
    );
    let d2 = sized("d2", 2 << 20);
    open_fail(ms, &["--data-device", d2.to_str().unwrap()], "too small");
}

/// `integritysetup close NAME --deferred` while a client is connected: integritysetup's
/// "still active and scheduled for deferred removal", the instance stays; `--cancel-deferred`
/// keeps it past its client; `--deferred` with no user closes at once.
#[test]
fn close_deferred_and_cancel_deferred() {
    let Some(dir) = data() else { return };
    let (tmp, run) = scratch();
    let img = tmp.path().join("c.img");
    unxz(&dir.join("crc32c-512-J.img.xz"), &img);
    let _vol = open(&run, "dvol", &img, &[]);
    let status = || stdout(&ucrypt(&run, &["status", "dvol"]));
    let mut client = Command::new("qemu-io")
        .args(["-f", "raw", &uri(&run, "dvol")])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !stdout(&ucrypt(&run, &["integritysetup", "status", "dvol"])).contains("in use")
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = ucrypt(&run, &["integritysetup", "close", "dvol", "--deferred"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        stdout(&out),
        "Device dvol is still active and scheduled for deferred removal.\n"
    );
    assert!(run.join("dvol").exists(), "{}", status());
    let out = ucrypt(
        &run,
        &["integritysetup", "close", "dvol", "--cancel-deferred"],
    );
    assert!(out.status.success(), "{out:?}");
    let _ = client.kill();
    let _ = client.wait();
    // The server sees the client gone (no longer "in use"), and stays: cancelled.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while stdout(&ucrypt(&run, &["integritysetup", "status", "dvol"])).contains("in use") {
        assert!(
            std::time::Instant::now() < deadline,
            "still in use after its client died"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(
        run.join("dvol").exists(),
        "cancelled: it outlives its client"
    );
    let out = ucrypt(&run, &["integritysetup", "close", "dvol", "--deferred"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout(&out), "", "no user: closed at once");
    let out = ucrypt(&run, &["integritysetup", "status", "dvol"]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
}
