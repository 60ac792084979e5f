//! Named instances on the host (no kernel module needed): `ucrypt open DEV NAME` in the
//! background with the FUSE front end or the NBD socket only, `status`/`ls`/`close`, the
//! exclusive-access refusals, stale runtime directories, `luksSuspend`/`luksResume`,
//! `resize`, `refresh`, and the 512-byte minimum block size through nbdfuse.
//!
//! Peers that check our bytes: `mkfs.ext4`/`debugfs` (e2fsprogs) on the FUSE file, QEMU's
//! own LUKS driver (`qemu-img convert`) reading back what went in through FUSE, cryptsetup
//! making the headers, nbdfuse/nbdcopy/nbdinfo (libnbd) on the socket.

#![allow(clippy::unwrap_used)]

mod common;

use common::runtime::Runtime;

use common::nbd::require;
use common::tmux::Tmux;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

impl Runtime {
    /// Runs ucrypt with this runtime directory.
    fn uc(&self, args: &[&str], stdin: &[u8]) -> Output {
        let dir = self.dir();
        common::ucrypt_env(args, stdin, &[("UCRYPT_RUNTIME_DIR", dir.as_os_str())])
    }
    fn ok(&self, args: &[&str], stdin: &[u8]) -> String {
        let out = self.uc(args, stdin);
        assert!(
            out.status.success(),
            "ucrypt {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
    fn status(&self, name: &str) -> serde_json::Value {
        serde_json::from_str(&self.ok(&["status", name, "--json"], b"")).unwrap()
    }
    fn pid(&self, name: &str) -> i32 {
        self.status(name)["pid"].as_i64().unwrap() as i32
    }
    /// Starts a foreground server with this runtime directory and returns once it is ready
    /// (its first line, the URI, printed); the caller kills it.
    fn foreground(&self, args: &[&str]) -> std::process::Child {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ucrypt"))
            .args(args)
            .env("UCRYPT_RUNTIME_DIR", self.dir())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut ready = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut ready,
        )
        .unwrap();
        assert!(!ready.is_empty(), "ucrypt {args:?} did not become ready");
        child
    }
}

fn assert_code(out: &Output, code: i32, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{out:?}");
    assert!(err.contains(needle), "expected {needle:?} in: {err}");
}

/// Whether FUSE mounts work here (root or fusermount3, and /dev/fuse), by the workspace's
/// skip rule.
fn fuse_usable() -> bool {
    let ok = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .is_ok();
    common::require_that(ok, "/dev/fuse is not usable here")
}

fn sh(cmd: &str) -> Output {
    Command::new("sh").arg("-c").arg(cmd).output().unwrap()
}

fn sh_ok(cmd: &str) -> String {
    let out = sh(cmd);
    assert!(out.status.success(), "{cmd}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A LUKS image made by cryptsetup (fast PBKDF2), passphrase "pw".
fn luks_image(rt: &Runtime, name: &str, mib: u64, luks: &str, sector: u32) -> (PathBuf, PathBuf) {
    let img = rt.path(name);
    std::fs::File::create(&img)
        .unwrap()
        .set_len(mib << 20)
        .unwrap();
    let pass = rt.path("pass");
    std::fs::write(&pass, "pw").unwrap();
    let mut args = vec![
        "luksFormat".to_string(),
        "-q".into(),
        "--type".into(),
        luks.into(),
        "--pbkdf-force-iterations".into(),
        "1000".into(),
        "--key-file".into(),
        pass.display().to_string(),
    ];
    if luks == "luks2" {
        args.extend([
            "--pbkdf".into(),
            "pbkdf2".into(),
            "--sector-size".into(),
            sector.to_string(),
        ]);
    }
    args.push(img.display().to_string());
    let out = Command::new("cryptsetup").args(&args).output().unwrap();
    assert!(out.status.success(), "cryptsetup {args:?}: {out:?}");
    (img, pass)
}

/// Waits until `name` is gone from the runtime directory.
fn wait_gone(rt: &Runtime, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while rt.dir().join(name).exists() {
        assert!(Instant::now() < deadline, "{name} still there");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn fuse_file_of_a_4k_luks2_volume_takes_mkfs_and_keeps_files_across_close_and_reopen() {
    if !fuse_usable() || !require("cryptsetup") || !require("mkfs.ext4") || !require("debugfs") {
        return;
    }
    let rt = Runtime::new();
    let (img, pass) = luks_image(&rt, "img", 64, "luks2", 4096);
    let (img, pass) = (img.to_str().unwrap(), pass.to_str().unwrap());
    // open returns once the file is there, and prints it.
    let node = rt.ok(
        &["open", img, "vol", "--device", "fuse", "--key-file", pass],
        b"",
    );
    assert!(node.ends_with("/vol"), "{node}");
    assert_eq!(std::fs::metadata(&node).unwrap().len(), 48 << 20);
    let st = rt.status("vol");
    assert_eq!(st["type"], "LUKS2");
    assert_eq!(st["sector_size"], 4096);
    assert_eq!(st["frontend"], "fuse");
    assert_eq!(st["node"], node.as_str());
    assert_eq!(st["in_use"], false);
    let text = rt.ok(&["status", "vol"], b"");
    for want in [
        "vol is active.",
        "type:    LUKS2",
        "cipher:  aes-xts-plain64",
        "keysize: 512 bits",
        "sector size:  4096",
        "offset:  32768 sectors",
        "size:    98304 sectors",
        "mode:    read/write",
        "front end: fuse",
    ] {
        assert!(text.contains(want), "{want:?} not in:\n{text}");
    }
    assert!(rt.ok(&["ls"], b"").contains("vol"));

    sh_ok(&format!("mkfs.ext4 -q -F {node}"));
    let data = common::nbd::random_bytes(300_000);
    let src = rt.path("data");
    std::fs::write(&src, &data).unwrap();
    sh_ok(&format!(
        "debugfs -w -R 'write {} data' {node}",
        src.display()
    ));

    // Held open (as a loop device or a mount would): close refuses with 5.
    let held = std::fs::File::open(&node).unwrap();
    assert_eq!(rt.status("vol")["in_use"], true);
    assert_code(&rt.uc(&["close", "vol"], b""), 5, "in use");
    drop(held);
    rt.ok(&["close", "vol"], b"");
    assert!(!Path::new(&node).exists());
    let out = rt.uc(&["status", "vol"], b"");
    assert_eq!(out.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&out.stdout).contains("vol is inactive."));

    // Reopen: the file system and the file are intact.
    let node = rt.ok(
        &["open", img, "vol", "--key-file", pass, "--device", "fuse"],
        b"",
    );
    let back = rt.path("back");
    sh_ok(&format!("debugfs -R 'dump data {}' {node}", back.display()));
    assert!(
        std::fs::read(&back).unwrap() == data,
        "file changed across close/reopen"
    );
    sh_ok(&format!("e2fsck -fn {node}"));
    rt.ok(&["close", "vol"], b"");
}

#[test]
fn files_written_through_fuse_read_back_through_qemus_luks_driver() {
    if !fuse_usable()
        || !require("cryptsetup")
        || !require("mkfs.ext4")
        || !require("debugfs")
        || !require("qemu-img")
    {
        return;
    }
    let rt = Runtime::new();
    // QEMU's LUKS driver reads LUKS1 (512-byte sectors).
    let (img, pass) = luks_image(&rt, "img1", 32, "luks1", 512);
    let mnt = rt.path("mnt");
    let node = rt.ok(
        &[
            "open",
            img.to_str().unwrap(),
            "one",
            "--fuse",
            mnt.to_str().unwrap(),
            "--key-file",
            pass.to_str().unwrap(),
        ],
        b"",
    );
    assert_eq!(Path::new(&node), mnt.join("one"));
    sh_ok(&format!("mkfs.ext4 -q -F {node}"));
    let data = common::nbd::random_bytes(200_000);
    let src = rt.path("data");
    std::fs::write(&src, &data).unwrap();
    sh_ok(&format!("debugfs -w -R 'write {} f' {node}", src.display()));
    rt.ok(&["close", "one"], b"");
    assert!(!mnt.exists(), "the mount point we created is removed");
    let raw = rt.path("plain.raw");
    sh_ok(&format!(
        "qemu-img convert --object secret,id=s0,file={} --image-opts \
         driver=luks,key-secret=s0,file.filename={} -O raw {}",
        pass.display(),
        img.display(),
        raw.display()
    ));
    let back = rt.path("back");
    sh_ok(&format!(
        "debugfs -R 'dump f {}' {}",
        back.display(),
        raw.display()
    ));
    assert!(
        std::fs::read(&back).unwrap() == data,
        "qemu read other data"
    );
}

#[test]
fn images_in_use_refuse_a_second_open_and_header_changes_with_exit_5() {
    if !require("cryptsetup") {
        return;
    }
    let rt = Runtime::new();
    let (img, pass) = luks_image(&rt, "img", 20, "luks2", 512);
    let (img, pass) = (img.to_str().unwrap(), pass.to_str().unwrap());
    rt.ok(
        &["open", img, "a", "--device", "none", "--key-file", pass],
        b"",
    );
    let pid = rt.pid("a");
    let holder = format!("in use by ucrypt open a, pid {pid}");
    // The name is taken.
    let other = rt.path("other");
    std::fs::File::create(&other)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let t = format!(
        "0 2048 crypt aes-xts-plain64 {} 0 {} 0",
        "ab".repeat(64),
        other.display()
    );
    assert_code(
        &rt.uc(&["open", "--table", &t, "a", "--device", "none"], b""),
        5,
        "already exists",
    );
    // A second mapping of the image, read-write or read-only.
    assert_code(
        &rt.uc(
            &["open", img, "b", "--device", "none", "--key-file", pass],
            b"",
        ),
        5,
        &holder,
    );
    assert_code(
        &rt.uc(
            &[
                "open",
                img,
                "b",
                "--device",
                "none",
                "--read-only",
                "--shared",
                "--key-file",
                pass,
            ],
            b"",
        ),
        5,
        &holder,
    );
    // Every header-changing command.
    let backup = rt.path("hdr");
    Command::new("cryptsetup")
        .args(["luksHeaderBackup", img, "--header-backup-file"])
        .arg(&backup)
        .status()
        .unwrap();
    let new = rt.path("new");
    std::fs::write(&new, "pw2").unwrap();
    let new = new.to_str().unwrap();
    let cases: Vec<Vec<&str>> = vec![
        vec!["luksFormat", "-q", img, pass],
        vec!["luksAddKey", img, "--key-file", pass, new],
        vec!["luksChangeKey", img, "--key-file", pass, new],
        vec!["luksRemoveKey", img, pass, "--batch-mode"],
        vec!["luksKillSlot", img, "0", "--batch-mode"],
        vec![
            "luksUUID",
            img,
            "--uuid",
            "12345678-1234-1234-1234-123456789abc",
            "--batch-mode",
        ],
        vec![
            "luksHeaderRestore",
            img,
            "--header-backup-file",
            backup.to_str().unwrap(),
            "--batch-mode",
        ],
    ];
    let before = std::fs::read(img).unwrap()[..16384].to_vec();
    for c in &cases {
        assert_code(&rt.uc(c, b""), 5, &holder);
    }
    assert!(
        std::fs::read(img).unwrap()[..16384] == before[..],
        "a header changed"
    );
    // Reading the header is not a change (and cryptsetup's own flock is not ours).
    rt.ok(&["luksDump", img], b"");
    assert!(Command::new("cryptsetup")
        .args(["luksDump", img])
        .output()
        .unwrap()
        .status
        .success());
    rt.ok(&["close", "a"], b"");

    // --shared: several read-only mappings; a read-write one and header changes refused.
    rt.ok(
        &[
            "open",
            img,
            "r1",
            "--device",
            "none",
            "--read-only",
            "--shared",
            "--key-file",
            pass,
        ],
        b"",
    );
    rt.ok(
        &[
            "open",
            img,
            "r2",
            "--device",
            "none",
            "--read-only",
            "--shared",
            "--key-file",
            pass,
        ],
        b"",
    );
    let out = rt.uc(
        &["open", img, "rw", "--device", "none", "--key-file", pass],
        b"",
    );
    assert_eq!(out.status.code(), Some(5), "{out:?}");
    assert_code(
        &rt.uc(&["luksKillSlot", img, "0", "--batch-mode"], b""),
        5,
        "in use by ucrypt open r",
    );
    rt.ok(&["close", "r1"], b"");
    rt.ok(&["close", "r2"], b"");
    // Free again.
    rt.ok(
        &[
            "luksUUID",
            img,
            "--uuid",
            "12345678-1234-1234-1234-123456789abc",
            "--batch-mode",
        ],
        b"",
    );
}

/// `ucrypt open`s started together, each waited for: `(name, exit code, stderr)`.
fn open_together(rt: &Runtime, opens: &[(String, Vec<String>)]) -> Vec<(String, i32, String)> {
    let children: Vec<_> = opens
        .iter()
        .map(|(name, args)| {
            let child = Command::new(env!("CARGO_BIN_EXE_ucrypt"))
                .args(args)
                .env("UCRYPT_RUNTIME_DIR", rt.dir())
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            (name.clone(), child)
        })
        .collect();
    children
        .into_iter()
        .map(|(name, child)| {
            let out = child.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            (name, out.status.code().unwrap_or(-1), err)
        })
        .collect()
}

/// Many `open ... NAME` of one name started at once (each with its own image): exactly
/// one wins, the others exit 5 "already exists"; exclusive and `--shared` opens of one
/// image under different names started at once: an exclusive one never wins beside
/// another. Once the winners are closed nothing is left but the name locks.
#[test]
fn concurrent_opens_of_one_name_or_one_image_have_one_winner() {
    let rt = Runtime::new();
    std::fs::create_dir_all(rt.dir()).unwrap();
    let key = "ab".repeat(64);
    let table = |img: &Path| format!("0 2048 crypt aes-xts-plain64 {key} 0 {} 0", img.display());
    let image = |name: &str| {
        let img = rt.path(name);
        std::fs::File::create(&img)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        img
    };
    let words = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let images: Vec<PathBuf> = (0..8).map(|i| image(&format!("img{i}"))).collect();
    for round in 0..6 {
        let opens: Vec<_> = images
            .iter()
            .map(|img| {
                let t = table(img);
                (
                    "same".to_string(),
                    words(&["open", "--table", &t, "same", "--device", "none"]),
                )
            })
            .collect();
        let results = open_together(&rt, &opens);
        let won = results.iter().filter(|r| r.1 == 0).count();
        assert_eq!(won, 1, "round {round}: {results:#?}");
        for (_, code, err) in results.iter().filter(|r| r.1 != 0) {
            assert_eq!(*code, 5, "round {round}: {err}");
            assert!(err.contains("already exists"), "round {round}: {err}");
        }
        assert_eq!(rt.ok(&["ls", "--json"], b"").matches("\"name\"").count(), 1);
        rt.ok(&["close", "same"], b"");
        wait_gone(&rt, "same");
    }
    let shared_img = image("readers.img");
    let t = table(&shared_img);
    for round in 0..6 {
        let opens: Vec<_> = (0..4)
            .map(|i| {
                let name = format!("m{i}");
                let mut args = words(&["open", "--table", &t, &name, "--device", "none"]);
                if i % 2 == 1 {
                    args.extend(words(&["--read-only", "--shared"]));
                }
                (name, args)
            })
            .collect();
        let results = open_together(&rt, &opens);
        let winners: Vec<&str> = results
            .iter()
            .filter(|r| r.1 == 0)
            .map(|r| r.0.as_str())
            .collect();
        assert!(!winners.is_empty(), "round {round}: {results:#?}");
        if winners.contains(&"m0") || winners.contains(&"m2") {
            assert_eq!(
                winners.len(),
                1,
                "round {round}: exclusive beside another: {results:#?}"
            );
        }
        for (_, code, err) in results.iter().filter(|r| r.1 != 0) {
            assert_eq!(*code, 5, "round {round}: {err}");
            assert!(err.contains("is in use by"), "round {round}: {err}");
        }
        for name in winners {
            rt.ok(&["close", name], b"");
            wait_gone(&rt, name);
        }
    }
    let mut left: Vec<String> = std::fs::read_dir(rt.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [".m0.lock", ".m1.lock", ".m2.lock", ".m3.lock", ".same.lock"]
    );
}

/// `resize` reaches the FUSE file: `stat` shows the new size at once (not after the
/// kernel's attribute timeout), shrunk and grown again, with the file held open meanwhile;
/// a new NBD connection sees it too, and the bytes below the old end are intact.
#[test]
fn resize_reaches_the_fuse_file_at_once() {
    if !fuse_usable() {
        return;
    }
    let rt = Runtime::new();
    let img = rt.path("img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    let t = format!(
        "0 8192 crypt aes-xts-plain64 {} 0 {} 0",
        "e1".repeat(64),
        img.display()
    );
    rt.ok(&["open", "--table", &t, "rs", "--device", "fuse"], b"");
    let st = rt.status("rs");
    let node = PathBuf::from(st["node"].as_str().unwrap());
    let uri = st["uri"].as_str().unwrap().to_string();
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + 3) as u8).collect();
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().write(true).open(&node).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
    }
    let held = std::fs::File::open(&node).unwrap();
    let size = |what: &str| {
        let via_path = std::fs::metadata(&node).unwrap().len();
        let via_fd = held.metadata().unwrap().len();
        assert_eq!(via_path, via_fd, "{what}: stat and fstat differ");
        via_path
    };
    assert_eq!(size("opened"), 8192 * 512);
    rt.ok(&["resize", "rs", "--size", "4096", "--table", &t], b"");
    assert_eq!(size("shrunk"), 4096 * 512, "stat right after the resize");
    if common::nbd::require("nbdinfo") {
        assert_eq!(
            sh_ok(&format!("nbdinfo --size '{uri}'")),
            (4096 * 512).to_string(),
            "a new NBD connection"
        );
    }
    rt.ok(&["resize", "rs", "--table", &t], b"");
    assert_eq!(size("grown"), 8192 * 512, "stat right after the growth");
    drop(held);
    let back = std::fs::read(&node).unwrap();
    assert!(
        back[..data.len()] == data[..],
        "the data below the old end changed"
    );
    rt.ok(&["close", "rs"], b"");
    wait_gone(&rt, "rs");
}

#[test]
fn a_dead_servers_directory_is_recognised_and_cleaned() {
    let rt = Runtime::new();
    let img = rt.path("img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    let t = format!(
        "0 8192 crypt aes-xts-plain64 {} 0 {} 0",
        "cd".repeat(64),
        img.display()
    );
    let fuse = fuse_usable();
    let dev = if fuse { "fuse" } else { "none" };
    rt.ok(&["open", "--table", &t, "dead", "--device", dev], b"");
    let pid = rt.pid("dead");
    // SAFETY: kill(2) on the server this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert!(exits_within(pid, 10), "killed server {pid} lingers");
    assert!(rt.dir().join("dead").exists(), "the debris is there");
    // status does not trust it, and cleans it.
    let out = rt.uc(&["status", "dead"], b"");
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert!(!rt.dir().join("dead").exists());
    // The lock died with the server: the image opens again under the same name.
    rt.ok(&["open", "--table", &t, "dead", "--device", dev], b"");
    let pid = rt.pid("dead");
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    // Its lock goes when its files are closed: wait for it to be gone.
    assert!(exits_within(pid, 10), "killed server {pid} lingers");
    // open meets the debris and cleans it too.
    rt.ok(&["open", "--table", &t, "dead", "--device", "none"], b"");
    assert_eq!(rt.ok(&["ls", "--json"], b"").matches("\"name\"").count(), 1);
    rt.ok(&["close", "dead"], b"");
    wait_gone(&rt, "dead");
}

/// Whether `needle` occurs in the readable memory of process `pid` (its anonymous
/// mappings: file mappings, the binary, libraries, the image, hold no key).
fn memory_contains(pid: i32, needle: &[u8]) -> bool {
    !memory_holders(pid, &[needle.to_vec()])[0].is_empty()
}

/// A new empty `mib` MiB image `img` and a passphrase file `pass` ("pw") in `rt`'s
/// directory: their paths.
fn image_and_pass(rt: &Runtime, mib: u64) -> (String, String) {
    let pass = rt.path("pass");
    std::fs::write(&pass, "pw").unwrap();
    let img = rt.path("img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(mib << 20)
        .unwrap();
    (img.display().to_string(), pass.display().to_string())
}

/// The volume key of a LUKS image, as cryptsetup dumps it.
fn volume_key(img: &str, pass: &str) -> Vec<u8> {
    let dump = Command::new("cryptsetup")
        .args([
            "luksDump",
            "--dump-volume-key",
            "--batch-mode",
            "--key-file",
            pass,
            img,
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&dump.stdout);
    let hex: String = text
        .split("MK dump:")
        .nth(1)
        .or_else(|| text.split("Volume key:").nth(1))
        .unwrap_or_else(|| panic!("no key in {text}"))
        .split_whitespace()
        .take_while(|w| w.len() == 2 && w.chars().all(|c| c.is_ascii_hexdigit()))
        .collect();
    hex::decode(&hex).unwrap()
}

/// Plain volumes lose their key at `luksSuspend` from every thread. AES-128-XTS (a 256-bit
/// volume key) runs on ucrypt's own VAES code where the CPU has it: its round keys, the
/// first of which is each 16-byte key half, must leave the server's memory with the key,
/// stack copies included. aes-cbc-essiv:sha256 (AES-256-CBC, RustCrypto's `aes` through
/// `mode/cbc.rs`, the IV cipher keyed with SHA-256 of the key) the same, and the ESSIV
/// key too. Before the suspend every piece is found (the scan can see them); after it,
/// none. A failure names the mappings holding each piece, never the bytes.
#[test]
fn suspend_wipes_aes128_xts_and_cbc_essiv_keys_from_every_thread() {
    if !require("cryptsetup") || !require("nbdcopy") {
        return;
    }
    let mut leftovers = Vec::new();
    for cipher in ["aes-xts-plain64", "aes-cbc-essiv:sha256"] {
        let rt = Runtime::new();
        let (img, pass) = image_and_pass(&rt, 32);
        let (img, pass) = (img.as_str(), pass.as_str());
        let extra = ["--cipher", cipher, "--key-size", "256"];
        let args = ucrypt_testkit::luks2_format_args(pass, &extra, img);
        sh_ok(&format!("cryptsetup {}", args.join(" ")));
        let uri = rt.ok(
            &["open", img, "k", "--device", "none", "--key-file", pass],
            b"",
        );
        let data = rt.path("data");
        std::fs::write(&data, common::nbd::random_bytes(4 << 20)).unwrap();
        sh_ok(&format!("nbdcopy {} '{uri}'", data.display()));
        sh_ok(&format!("nbdcopy '{uri}' {}", rt.path("back").display()));
        let key = volume_key(img, pass);
        assert_eq!(key.len(), 32);
        let mut needles: Vec<(String, Vec<u8>)> = key
            .chunks(16)
            .enumerate()
            .map(|(i, p)| (format!("volume key bytes {}..", i * 16), p.to_vec()))
            .collect();
        if cipher.contains("essiv") {
            use sha2::Digest;
            let salt = sha2::Sha256::digest(&key);
            needles.extend(
                salt.chunks(16)
                    .enumerate()
                    .map(|(i, p)| (format!("ESSIV key bytes {}..", i * 16), p.to_vec())),
            );
        }
        let bytes: Vec<Vec<u8>> = needles.iter().map(|n| n.1.clone()).collect();
        let pid = rt.pid("k");
        for ((name, _), at) in needles.iter().zip(memory_holders(pid, &bytes)) {
            assert!(
                !at.is_empty(),
                "{cipher}: {name} not found before the suspend: the scan would prove nothing"
            );
        }
        rt.ok(&["luksSuspend", "k"], b"");
        let left: Vec<String> = needles
            .iter()
            .zip(memory_holders(pid, &bytes))
            .filter(|(_, at)| !at.is_empty())
            .map(|((name, _), at)| format!("{name} in {}", at.join(", ")))
            .collect();
        if !left.is_empty() {
            leftovers.push(format!("{cipher}: {left:#?}"));
        }
        rt.ok(&["close", "k", "--force"], b"");
        wait_gone(&rt, "k");
    }
    assert!(
        leftovers.is_empty(),
        "after luksSuspend, key material still in memory: {leftovers:#?}"
    );
}

/// Where each of `needles` lies in the anonymous mappings of process `pid`: per needle, a label for every mapping holding it, `stack of
/// thread TID (NAME)` for a live thread's stack (found from the stack pointer in
/// /proc/PID/task/TID/syscall), otherwise the mapping's name or its range and size (a glibc
/// stack cache entry of an exited thread is an unnamed mapping of its stack's size). Labels
/// only: never the bytes, which are key material.
fn memory_holders(pid: i32, needles: &[Vec<u8>]) -> Vec<Vec<String>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut stacks = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let t = t.unwrap().path();
        let name = std::fs::read_to_string(t.join("comm")).unwrap_or_default();
        let sys = std::fs::read_to_string(t.join("syscall")).unwrap_or_default();
        let f: Vec<&str> = sys.split_whitespace().collect();
        // "NR a1 .. a6 SP PC" for a thread blocked in a system call.
        if f.len() == 9 {
            if let Ok(sp) = u64::from_str_radix(f[7].trim_start_matches("0x"), 16) {
                let tid = t.file_name().unwrap().to_string_lossy().into_owned();
                stacks.push((sp, format!("stack of thread {tid} ({})", name.trim())));
            }
        }
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut found = vec![Vec::new(); needles.len()];
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (range, perms) = (f.next().unwrap(), f.next().unwrap());
        let path = f.nth(3).unwrap_or("");
        if !perms.starts_with('r') || path.starts_with('/') || path == "[vvar]" {
            continue; // file mappings (the binary, libraries, the image) hold no key
        }
        let (a, b) = range.split_once('-').unwrap();
        let (a, b) = (
            u64::from_str_radix(a, 16).unwrap(),
            u64::from_str_radix(b, 16).unwrap(),
        );
        let mut buf = vec![0u8; (b - a) as usize];
        if mem.seek(SeekFrom::Start(a)).is_err() || mem.read_exact(&mut buf).is_err() {
            continue;
        }
        let label = stacks
            .iter()
            .find(|(sp, _)| (a..b).contains(sp))
            .map(|(_, l)| l.clone())
            .unwrap_or_else(|| match path {
                "" => format!("anonymous {range} ({} KiB)", (b - a) >> 10),
                p => p.to_string(),
            });
        for (n, out) in needles.iter().zip(&mut found) {
            let hits = buf.windows(n.len()).filter(|w| w == n).count();
            if hits > 0 {
                out.push(format!("{label} x{hits}"));
            }
        }
    }
    found
}

/// The threads of process `pid` named `ucrypt-aead*` (the AEAD helpers of
/// `ucrypt_integrity`'s spread).
fn aead_helpers(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter(|t| {
            let comm = t.as_ref().unwrap().path().join("comm");
            std::fs::read_to_string(comm)
                .unwrap_or_default()
                .starts_with("ucrypt-aead")
        })
        .count()
}

/// Authenticated volumes (LUKS2 `--integrity`, dm-crypt's AEAD modes over dm-integrity,
/// served by `AeadVolume`) lose their key at `luksSuspend` as plain ones do: AES-256-XTS +
/// HMAC-SHA256 or HMAC-SHA512, AES-256-GCM, AES-128-GCM and ChaCha20-Poly1305, each
/// written and read through NBD in 4 KiB requests (on the receiving thread) and 1 MiB ones
/// (spread over the AEAD helper threads, checked to have started). Before the suspend
/// every 16-byte piece of the cipher's key is found in the server (and HMAC's inner and
/// outer states, which stand for its key: the raw HMAC key is not kept; and GCM's hash key
/// H = AES_K(0^128) in the twisted form AWS-LC keeps), so the scan can see them; after it,
/// no piece of the volume key, neither HMAC state and no H (raw or twisted), the helpers
/// gone. A failure names the mappings holding each piece, never the bytes.
#[test]
fn suspend_wipes_the_keys_of_authenticated_volumes_from_every_thread() {
    if !require("nbdcopy") || !require("cryptsetup") {
        return;
    }
    let mut leftovers = Vec::new();
    // (name, cipher, integrity, --key-size: the cipher's bits, the HMAC key comes on top,
    // HMAC key bytes)
    for (what, cipher, integrity, key_size, mac_len) in [
        ("hmac-sha256", "aes-xts-plain64", "hmac-sha256", "512", 32),
        ("hmac-sha512", "aes-xts-plain64", "hmac-sha512", "512", 64),
        ("aes-256-gcm", "aes-gcm-random", "aead", "256", 0),
        ("aes-128-gcm", "aes-gcm-random", "aead", "128", 0),
        ("chacha20", "chacha20-random", "poly1305", "256", 0),
    ] {
        let rt = Runtime::new();
        let (img, pass) = image_and_pass(&rt, 24);
        let (img, pass) = (img.as_str(), pass.as_str());
        let extra = [
            &common::SMALL_LUKS2[..],
            &[
                "--cipher",
                cipher,
                "--key-size",
                key_size,
                "--integrity",
                integrity,
                "--sector-size",
                "4096",
            ],
        ]
        .concat();
        rt.ok(&ucrypt_testkit::luks2_format_args(pass, &extra, img), b"");
        let uri = rt.ok(
            &["open", img, "a", "--device", "none", "--key-file", pass],
            b"",
        );
        let pid = rt.pid("a");
        let size = rt.status("a")["size_sectors"].as_u64().unwrap() * 512;
        let data = rt.path("data");
        std::fs::write(&data, common::nbd::random_bytes(size as usize)).unwrap();
        let back = rt.path("back");
        let (data_s, back_s) = (data.display().to_string(), back.display().to_string());
        // One request at a time: a large one is spread only while fewer are in flight
        // than there are threads.
        let one = "--connections=1 --requests=1";
        for (from, to) in [(&data_s, &uri), (&uri, &back_s)] {
            for rs in [4096, 1 << 20] {
                sh_ok(&format!(
                    "nbdcopy {one} --request-size={rs} '{from}' '{to}'"
                ));
            }
        }
        assert!(
            std::fs::read(&back).unwrap() == std::fs::read(&data).unwrap(),
            "{what}: read back differs"
        );
        assert!(aead_helpers(pid) > 0, "{what}: no request was spread");
        let key = volume_key(img, pass);
        let cipher_len = key.len() - mac_len;
        // (what, bytes, whether the server must hold it while serving): every piece of the
        // cipher's key (AES round keys start with the key; AWS-LC's ChaCha20 context holds
        // it); the raw HMAC key is not kept, its inner and outer states are.
        let mut needles: Vec<(String, Vec<u8>, bool)> = key
            .chunks(16)
            .enumerate()
            .map(|(i, p)| {
                let at = i * 16;
                (
                    format!("volume key bytes {at}.."),
                    p.to_vec(),
                    at < cipher_len,
                )
            })
            .collect();
        let states: Vec<Vec<u8>> = match mac_len {
            32 => ucrypt_crypto::testing::hmac_sha256_states(&key[cipher_len..])
                .map(|s| s.to_vec())
                .into(),
            64 => ucrypt_crypto::testing::hmac_sha512_states(&key[cipher_len..])
                .map(|s| s.to_vec())
                .into(),
            _ => Vec::new(),
        };
        if mac_len > 0 {
            assert_eq!(
                key.len(),
                64 + mac_len,
                "{what}: AES-256-XTS key and HMAC key"
            );
        }
        for (name, state) in ["inner", "outer"].iter().zip(states) {
            needles.push((format!("HMAC {name} state"), state[..16].to_vec(), true));
        }
        if cipher == "aes-gcm-random" {
            // GHASH's key H = AES_K(0^128): AWS-LC keeps it only in x86-64's twisted form
            // (the first entry of its table of powers of H; the raw H it computes is
            // cleansed at once), so the twisted form must be found while serving and the
            // raw one need not be (`aws_aead`'s unit test
            // `a_gcm_context_keeps_the_hash_key_twisted_not_raw`); neither after.
            let [raw, twisted] = ucrypt_crypto::testing::gcm_hash_keys(&key);
            #[cfg(target_arch = "x86_64")]
            let clmul = std::arch::is_x86_feature_detected!("pclmulqdq");
            #[cfg(not(target_arch = "x86_64"))]
            let clmul = false;
            needles.push(("GHASH key H".into(), raw.to_vec(), false));
            needles.push(("GHASH key H (twisted)".into(), twisted.to_vec(), clmul));
        }
        let bytes: Vec<Vec<u8>> = needles.iter().map(|n| n.1.clone()).collect();
        let before = memory_holders(pid, &bytes);
        for ((name, _, held), at) in needles.iter().zip(&before) {
            assert!(
                !held || !at.is_empty(),
                "{what}: {name} not found before the suspend: the scan would prove nothing"
            );
        }
        rt.ok(&["luksSuspend", "a"], b"");
        assert_eq!(rt.status("a")["suspended"], true);
        let after = memory_holders(pid, &bytes);
        let left: Vec<String> = needles
            .iter()
            .zip(&after)
            .filter(|(_, at)| !at.is_empty())
            .map(|((name, _, _), at)| format!("{name} in {}", at.join(", ")))
            .collect();
        if !left.is_empty() {
            leftovers.push(format!("{what}: {left:#?}"));
        }
        assert_eq!(aead_helpers(pid), 0, "{what}: AEAD helpers still running");
        rt.ok(&["close", "a", "--force"], b"");
        wait_gone(&rt, "a");
    }
    assert!(
        leftovers.is_empty(),
        "after luksSuspend, key material still in memory: {leftovers:#?}"
    );
}

#[test]
fn suspend_holds_io_and_wipes_the_key_resume_resize_and_refresh_over_the_socket() {
    if !require("cryptsetup") || !require("nbdcopy") || !require("nbdinfo") {
        return;
    }
    let rt = Runtime::new();
    let (img, pass) = luks_image(&rt, "img", 32, "luks2", 512);
    let (img, pass) = (img.to_str().unwrap(), pass.to_str().unwrap());
    let uri = rt.ok(
        &["open", img, "s", "--device", "none", "--key-file", pass],
        b"",
    );
    assert!(uri.starts_with("nbd+unix:///s?socket="), "{uri}");
    let data = common::nbd::random_bytes(1 << 20);
    let src = rt.path("data");
    std::fs::write(&src, &data).unwrap();
    sh_ok(&format!("nbdcopy {} '{uri}'", src.display()));
    // The volume key, from cryptsetup, to look for in the server's memory.
    let key = volume_key(img, pass);
    assert_eq!(key.len(), 64);
    let pid = rt.pid("s");
    // Each XTS half is an AES-256 key: its first round key is the half itself.
    assert!(
        memory_contains(pid, &key[..32]),
        "key not found: the scan would prove nothing"
    );

    rt.ok(&["luksSuspend", "s"], b"");
    let st = rt.status("s");
    assert_eq!(st["suspended"], true);
    assert!(
        !memory_contains(pid, &key[..32]),
        "key half 1 still in memory"
    );
    assert!(
        !memory_contains(pid, &key[32..]),
        "key half 2 still in memory"
    );
    // I/O waits.
    let out_path = rt.path("out");
    let mut reader = Command::new("nbdcopy")
        .args([uri.as_str(), out_path.to_str().unwrap()])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        reader.try_wait().unwrap().is_none(),
        "a read went through while suspended"
    );
    // A wrong passphrase: exit 2, still suspended.
    let bad = rt.path("bad");
    std::fs::write(&bad, "nope").unwrap();
    assert_code(
        &rt.uc(
            &["luksResume", "s", "--key-file", bad.to_str().unwrap()],
            b"",
        ),
        2,
        "passphrase",
    );
    assert_eq!(rt.status("s")["suspended"], true);
    assert_code(&rt.uc(&["close", "s"], b""), 5, "suspended");
    // --link-vk-to-keyring (cryptsetup 2.7's luksResume option): a malformed value is
    // refused before anything runs (exit 1, still suspended); a good one puts the volume
    // key in the user keyring as the volume is resumed.
    assert_code(
        &rt.uc(
            &[
                "luksResume",
                "s",
                "--key-file",
                pass,
                "--link-vk-to-keyring",
                "@u:vk",
            ],
            b"",
        ),
        1,
        "invalid --link-vk-to-keyring value",
    );
    assert_eq!(rt.status("s")["suspended"], true);
    let vk_desc = format!("ucrypt-resume-vk:{}", std::process::id());
    rt.ok(
        &[
            "luksResume",
            "s",
            "--key-file",
            pass,
            "--link-vk-to-keyring",
            &format!("@u::{vk_desc}"),
        ],
        b"",
    );
    let keyctl = |args: &[&str]| {
        let out = Command::new("keyctl").args(args).output().unwrap();
        assert!(out.status.success(), "keyctl {args:?}: {out:?}");
        out.stdout
    };
    let id = String::from_utf8(keyctl(&["search", "@u", "user", &vk_desc])).unwrap();
    let id = id.trim();
    let linked = keyctl(&["pipe", id]);
    keyctl(&["unlink", id, "@u"]);
    assert!(linked == key, "the linked key is not the volume key");
    assert!(reader.wait().unwrap().success());
    assert!(std::fs::read(&out_path).unwrap()[..data.len()] == data[..]);

    // resize to 4 MiB, then back to all the device holds.
    rt.ok(&["resize", "s", "--size", "8192", "--key-file", pass], b"");
    assert_eq!(
        sh_ok(&format!("nbdinfo --size '{uri}'")),
        (8192 * 512).to_string()
    );
    rt.ok(&["resize", "s", "--key-file", pass], b"");
    assert_eq!(
        sh_ok(&format!("nbdinfo --size '{uri}'")),
        (16u64 << 20).to_string()
    );
    // refresh with discards: the export now offers trim.
    assert!(!sh_ok(&format!("nbdinfo '{uri}'")).contains("can_trim: true"));
    rt.ok(
        &[
            "refresh",
            "s",
            "--allow-discards",
            "--perf-no_read_workqueue",
            "--key-file",
            pass,
        ],
        b"",
    );
    assert!(sh_ok(&format!("nbdinfo '{uri}'")).contains("can_trim: true"));
    assert_eq!(rt.status("s")["allow_discards"], true);
    // cryptsetup's spelling, `open --refresh DEV NAME`, is the same refresh.
    rt.ok(
        &[
            "open",
            "--refresh",
            img,
            "s",
            "--allow-discards",
            "--key-file",
            pass,
        ],
        b"",
    );
    assert_eq!(rt.status("s")["allow_discards"], true);
    assert_code(
        &rt.uc(&["open", "--refresh", "nothing", "--key-file", pass], b""),
        4,
        "is not active",
    );
    sh_ok(&format!("nbdcopy '{uri}' {}", out_path.display()));
    assert!(std::fs::read(&out_path).unwrap()[..data.len()] == data[..]);
    // A connected client makes the instance busy: qemu-io (qemu-utils) stays connected
    // while its standard input is open.
    let mut client = Command::new("qemu-io")
        .args(["-f", "raw", uri.as_str()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .ok();
    if client.is_some() {
        // Busy once the client is connected (qemu-io starts in well under 10 s).
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let out = rt.uc(&["status", "s", "--json"], b"");
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            if v["in_use"] == true || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_code(&rt.uc(&["close", "s"], b""), 5, "NBD connection");
        rt.ok(&["close", "s", "--deferred"], b"");
        assert!(
            rt.dir().join("s").exists(),
            "deferred close waits for the client"
        );
        assert_eq!(rt.status("s")["deferred_close"], true);
        // cryptsetup's close --cancel-deferred: the instance outlives its client.
        rt.ok(&["close", "s", "--cancel-deferred"], b"");
        assert_eq!(rt.status("s")["deferred_close"], false);
        if let Some(c) = client.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        std::thread::sleep(Duration::from_millis(1000));
        assert_eq!(rt.status("s")["deferred_close"], false, "closed anyway");
        assert!(rt.dir().join("s").exists(), "closed anyway");
        rt.ok(&["close", "s", "--deferred"], b"");
        wait_gone(&rt, "s");
    } else {
        rt.ok(&["close", "s"], b"");
    }
}

#[test]
fn mkfs_works_on_an_nbdfuse_file_of_a_4k_sector_volume() {
    if !fuse_usable() || !require("cryptsetup") || !require("nbdfuse") || !require("mkfs.ext4") {
        return;
    }
    let rt = Runtime::new();
    let (img, pass) = luks_image(&rt, "img", 32, "luks2", 4096);
    let uri = rt.ok(
        &[
            "open",
            img.to_str().unwrap(),
            "n",
            "--device",
            "none",
            "--key-file",
            pass.to_str().unwrap(),
        ],
        b"",
    );
    let info = sh_ok(&format!("nbdinfo '{uri}'"));
    assert!(info.contains("block_size_minimum: 512"), "{info}");
    assert!(info.contains("block_size_preferred: 4096"), "{info}");
    let mnt = rt.path("nbdfuse");
    std::fs::create_dir(&mnt).unwrap();
    let mut fuse = Command::new("nbdfuse").arg(&mnt).arg(&uri).spawn().unwrap();
    let file = mnt.join("nbd");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !file.exists() {
        assert!(Instant::now() < deadline, "nbdfuse did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = sh(&format!("mkfs.ext4 -q -F {}", file.display()));
    let fsck = sh(&format!("e2fsck -fn {}", file.display()));
    let _ = Command::new("umount").arg(&mnt).status();
    let _ = fuse.wait();
    assert!(out.status.success(), "mkfs.ext4 on nbdfuse: {out:?}");
    assert!(fsck.status.success(), "e2fsck: {fsck:?}");
    rt.ok(&["close", "n"], b"");
}

/// A loop device attached for one test, detached on drop.
struct Loop(String);

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// Opens `dev` with `O_EXCL` in a child that holds it until its stdin closes.
fn hold_exclusively(dev: &str) -> std::process::Child {
    let mut child = Command::new("python3")
        .args([
            "-c",
            "import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY|os.O_EXCL); print('held', flush=True); sys.stdin.read()",
            dev,
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(
        line.trim(),
        "held",
        "the holder could not open {dev} O_EXCL"
    );
    child
}

/// A 20 MiB LUKS image of type `luks` (512-byte sectors) made by cryptsetup, attached to a
/// loop device; `None` (the test skips, by the workspace's rule) without cryptsetup,
/// losetup or loop devices.
fn loop_image(rt: &Runtime, luks: &str) -> Option<(PathBuf, PathBuf, Loop)> {
    if !require("cryptsetup") || !require("losetup") {
        return None;
    }
    if !common::require_that(
        Path::new("/dev/loop-control").exists(),
        "no loop devices here (/dev/loop-control is missing)",
    ) {
        return None;
    }
    let (img, pass) = luks_image(rt, "img", 20, luks, 512);
    let lo = Loop(sh_ok(&format!("losetup -f --show {}", img.display())));
    Some((img, pass, lo))
}

/// Whether an `O_EXCL` open of `dev` by another process is refused with EBUSY.
fn excl_refused(dev: &str) -> bool {
    let out = sh(&format!(
        "python3 -c 'import os,sys,errno\ntry:\n os.open(sys.argv[1], os.O_RDONLY|os.O_EXCL)\nexcept OSError as e:\n sys.exit(7 if e.errno==errno.EBUSY else 1)' {dev}"
    ));
    match out.status.code() {
        Some(7) => true,
        Some(0) => false,
        _ => panic!("probing {dev}: {out:?}"),
    }
}

#[test]
fn a_real_block_device_is_held_with_o_excl_and_refused_when_the_kernel_holds_it() {
    if !require("python3") {
        return;
    }
    let rt = Runtime::new();
    let Some((_img, pass, lo)) = loop_image(&rt, "luks2") else {
        return;
    };
    let pass = pass.to_str().unwrap();
    let dev = lo.0.as_str();
    assert!(!excl_refused(dev), "{dev} is busy before the test");

    // Served read-write: the kernel refuses other exclusive openers (mkfs, mount, dm-crypt).
    rt.ok(
        &["open", dev, "a", "--device", "none", "--key-file", pass],
        b"",
    );
    assert!(excl_refused(dev), "{dev} is served but not held O_EXCL");
    let mkfs = sh(&format!("mkfs.ext4 -q -F {dev} 2>&1"));
    assert!(!mkfs.status.success(), "mkfs.ext4 ran on a served device");
    rt.ok(&["close", "a"], b"");
    wait_gone(&rt, "a");
    assert!(!excl_refused(dev), "{dev} still held after close");

    // Held by someone else (as a mount or dm-crypt would): open and header changes exit 5.
    let mut holder = hold_exclusively(dev);
    assert_code(
        &rt.uc(
            &["open", dev, "b", "--device", "none", "--key-file", pass],
            b"",
        ),
        5,
        "in use by the kernel",
    );
    assert!(
        !rt.dir().join("b").exists(),
        "a refused open left a directory"
    );
    drop(holder.stdin.take());
    holder.wait().unwrap();
    // Free again: it opens.
    rt.ok(
        &["open", dev, "b", "--device", "none", "--key-file", pass],
        b"",
    );
    rt.ok(&["close", "b"], b"");
    wait_gone(&rt, "b");
}

/// The `O_DIRECT` flag of each descriptor process `pid` holds on `path`.
fn direct_flags(pid: i32, path: &str) -> Vec<bool> {
    let mut flags = Vec::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        if std::fs::read_link(fd.path()).is_ok_and(|l| l == Path::new(path)) {
            let info = std::fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                fd.file_name().to_string_lossy()
            ))
            .unwrap();
            let octal = info
                .lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .unwrap()
                .trim();
            flags.push(i32::from_str_radix(octal, 8).unwrap() & libc::O_DIRECT != 0);
        }
    }
    flags
}

#[test]
fn a_block_device_is_served_without_the_page_cache_unless_asked() {
    if !require("nbdcopy") || !require("qemu-img") {
        return;
    }
    let rt = Runtime::new();
    let Some((img, pass, lo)) = loop_image(&rt, "luks1") else {
        return;
    };
    let pass = pass.to_str().unwrap();
    let dev = lo.0.as_str();
    assert_eq!(sh_ok(&format!("blockdev --getss {dev}")), "512");
    let data: Vec<u8> = (0..3u32 << 20).map(|i| (i * 31 + i / 4093) as u8).collect();
    let src = rt.path("src");
    std::fs::write(&src, &data).unwrap();

    // Default: the device is read and written with O_DIRECT (as dm-crypt, no page cache).
    rt.ok(
        &["open", dev, "d", "--device", "none", "--key-file", pass],
        b"",
    );
    let flags = direct_flags(rt.pid("d"), dev);
    assert!(
        flags.contains(&true),
        "no O_DIRECT descriptor on {dev}: {flags:?}"
    );
    let uri = rt.status("d")["uri"].as_str().unwrap().to_string();
    sh_ok(&format!("nbdcopy {} '{uri}'", src.display()));
    let back = rt.path("back");
    sh_ok(&format!("nbdcopy '{uri}' {}", back.display()));
    assert!(
        std::fs::read(&back).unwrap()[..data.len()] == data[..],
        "read back other data"
    );
    rt.ok(&["close", "d"], b"");
    wait_gone(&rt, "d");
    // QEMU's own LUKS driver reads the image under the loop device: the writes reached it.
    let raw = rt.path("plain.raw");
    sh_ok(&format!(
        "qemu-img convert --object secret,id=s0,file={pass} --image-opts \
         driver=luks,key-secret=s0,file.filename={} -O raw {}",
        img.display(),
        raw.display()
    ));
    assert!(
        std::fs::read(&raw).unwrap()[..data.len()] == data[..],
        "qemu read other data"
    );

    // --buffered keeps the page cache; a regular file keeps it by default.
    rt.ok(
        &[
            "open",
            dev,
            "b",
            "--device",
            "none",
            "--key-file",
            pass,
            "--buffered",
        ],
        b"",
    );
    let flags = direct_flags(rt.pid("b"), dev);
    assert!(!flags.is_empty() && !flags.contains(&true), "{flags:?}");
    rt.ok(&["close", "b"], b"");
    wait_gone(&rt, "b");
    drop(lo);
    rt.ok(
        &[
            "open",
            img.to_str().unwrap(),
            "f",
            "--device",
            "none",
            "--key-file",
            pass,
        ],
        b"",
    );
    let flags = direct_flags(rt.pid("f"), img.to_str().unwrap());
    assert!(!flags.is_empty() && !flags.contains(&true), "{flags:?}");
    // The two settings together are refused.
    let both = rt.uc(
        &["open", img.to_str().unwrap(), "x", "--direct", "--buffered"],
        b"",
    );
    assert_code(&both, 1, "cannot be used with");
    rt.ok(&["close", "f"], b"");
    wait_gone(&rt, "f");
}

#[test]
fn cryptsetups_per_type_open_commands_open_by_name() {
    if !require("cryptsetup") {
        return;
    }
    let rt = Runtime::new();
    let (img, pass) = luks_image(&rt, "img", 20, "luks2", 512);
    let (img, pass) = (img.to_str().unwrap(), pass.to_str().unwrap());
    // `luksOpen DEV NAME` serves, as `open --type luks DEV NAME`.
    rt.ok(
        &["luksOpen", img, "l", "--device", "none", "--key-file", pass],
        b"",
    );
    let st = rt.status("l");
    assert_eq!(st["type"], "LUKS2", "{st}");
    rt.ok(&["close", "l"], b"");
    wait_gone(&rt, "l");
    // With the user's own --type, and with --test-passphrase (checks, serves nothing).
    rt.ok(
        &[
            "luksOpen",
            img,
            "l2",
            "--type",
            "luks2",
            "--device",
            "none",
            "--key-file",
            pass,
        ],
        b"",
    );
    rt.ok(&["close", "l2"], b"");
    wait_gone(&rt, "l2");
    rt.ok(
        &["luksOpen", img, "--test-passphrase", "--key-file", pass],
        b"",
    );
    assert!(!rt.dir().join("ucrypt").exists());
    // `plainOpen DEV NAME` is `open --type plain`: the same table as --print-table prints.
    let key = rt.path("plainkey");
    std::fs::write(&key, [7u8; 32]).unwrap();
    let key = key.to_str().unwrap();
    rt.ok(
        &["plainOpen", img, "p", "--device", "none", "--key-file", key],
        b"",
    );
    assert_eq!(rt.status("p")["type"], "PLAIN");
    rt.ok(&["close", "p"], b"");
    let printed = rt.ok(&["plainOpen", img, "--print-table", "--key-file", key], b"");
    assert!(printed.contains("aes-cbc-essiv:sha256"), "{printed}");
}

#[test]
fn ctrl_c_at_a_passphrase_prompt_exits_promptly_with_the_terminal_restored() {
    if !require("cryptsetup") || !require("tmux") {
        return;
    }
    let rt = Runtime::new();
    let (img, _) = luks_image(&rt, "img", 20, "luks2", 512);
    let bin = env!("CARGO_BIN_EXE_ucrypt");
    let runtime = rt.dir().display().to_string();
    let t = Tmux::new("prompt", &[("UCRYPT_RUNTIME_DIR", &runtime)]);
    // A command without a server (luksOpen --test-passphrase), one whose signal thread
    // already blocks SIGINT everywhere else (open serving over NBD in the foreground), and
    // a named open (the background server forks after the prompt).
    let cases = [
        format!("{bin} luksOpen {} --test-passphrase", img.display()),
        format!("{bin} open {}", img.display()),
        format!("{bin} open {} named --device none", img.display()),
    ];
    for (i, cmd) in cases.iter().enumerate() {
        // The previous case's prompt must be gone before this one's is waited for.
        t.clear("Enter passphrase");
        let mark = format!("done{i}");
        let line =
            format!("{cmd}; echo rc=$? {mark}; stty -a | tr ' ;' '\\n\\n' | grep -x -- '-\\?echo'");
        t.send(&[&line, "Enter"]);
        t.wait("Enter passphrase", 20);
        let pressed = Instant::now();
        t.send(&["C-c"]);
        let text = t.wait(&format!("{mark}\n"), 5);
        let took = pressed.elapsed();
        assert!(text.contains(&format!("rc=1 {mark}")), "{cmd}:\n{text}");
        assert!(text.contains("interrupted"), "{cmd}: no message:\n{text}");
        // The command line holds "echo" too: wait for stty's own line, after the mark.
        let after = |text: &str| {
            text.split(&format!("{mark}\n"))
                .nth(1)
                .unwrap_or("")
                .to_owned()
        };
        let echo = t.wait_until("stty's echo line", 5, |text| {
            after(text)
                .lines()
                .any(|l| matches!(l.trim(), "echo" | "-echo"))
        });
        assert!(
            after(&echo).lines().any(|l| l.trim() == "echo"),
            "{cmd}: terminal echo not restored:\n{echo}"
        );
        assert!(took < Duration::from_secs(3), "{cmd}: took {took:?}");
        assert!(!rt.dir().join("named").join("pid").exists());
    }
}

#[test]
fn a_wrong_passphrase_at_a_terminal_is_asked_again_tries_times() {
    if !require("cryptsetup") || !require("tmux") {
        return;
    }
    let rt = Runtime::new();
    let (img, _) = luks_image(&rt, "img", 20, "luks2", 512);
    let bin = env!("CARGO_BIN_EXE_ucrypt");
    let t = Tmux::new("tries", &[]);
    // Default 3 tries: wrong, wrong, right -> 0.
    let cmd = format!(
        "{bin} open {} --test-passphrase; echo rc=$? end",
        img.display()
    );
    t.send(&[&cmd, "Enter"]);
    for (n, pass) in ["bad1", "bad2", "pw"].iter().enumerate() {
        t.answer_nth("Enter passphrase", n + 1, pass);
    }
    let text = t.wait("rc=0 end", 20);
    assert_eq!(
        text.matches("No key available with this passphrase.")
            .count(),
        2,
        "{text}"
    );
    // --tries 1: one wrong passphrase ends it with exit 2. (The first run's prompts must be
    // gone before this one's is waited for.)
    t.clear("Enter passphrase");
    let cmd = format!(
        "{bin} open {} --test-passphrase --tries 1; echo rc=$? end",
        img.display()
    );
    t.send(&[&cmd, "Enter"]);
    t.answer("Enter passphrase", "bad");
    let text = t.wait("rc=2 end", 20);
    assert_eq!(text.matches("Enter passphrase").count(), 1, "{text}");
}

#[test]
fn open_with_a_volume_key_file_serves_what_the_passphrase_serves() {
    if !require("cryptsetup") || !require("nbdcopy") {
        return;
    }
    let rt = Runtime::new();
    let (img, pass) = luks_image(&rt, "img", 20, "luks2", 512);
    let (img, pass) = (img.to_str().unwrap(), pass.to_str().unwrap());
    // cryptsetup writes the volume key to a file.
    let vk = rt.path("vk.bin");
    let vk = vk.to_str().unwrap();
    sh_ok(&format!(
        "cryptsetup luksDump --dump-volume-key --volume-key-file {vk} -q --key-file {pass} {img}"
    ));
    let view = |args: &[&str], out: &str| {
        let mut all = vec!["open", img, "--read-only"];
        all.extend_from_slice(args);
        let run = format!("nbdcopy \"$uri\" {out}");
        all.extend_from_slice(&["--run", &run]);
        rt.ok(&all, b"");
        sh_ok(&format!("sha256sum < {out}"))
    };
    let by_pass = view(
        &["--key-file", pass],
        &rt.path("a.raw").display().to_string(),
    );
    let by_key = view(
        &["--volume-key-file", vk],
        &rt.path("b.raw").display().to_string(),
    );
    assert_eq!(by_pass, by_key, "the volume key opens a different view");
    rt.ok(
        &["open", img, "--volume-key-file", vk, "--test-passphrase"],
        b"",
    );
    // A key that is not the volume's: refused, exit 1, nothing served.
    let mut wrong = std::fs::read(vk).unwrap();
    wrong[0] ^= 1;
    let bad = rt.path("bad.bin");
    std::fs::write(&bad, wrong).unwrap();
    let out = rt.uc(
        &[
            "open",
            img,
            "--volume-key-file",
            bad.to_str().unwrap(),
            "--test-passphrase",
        ],
        b"",
    );
    // Exit 2, as cryptsetup's.
    assert_code(&out, 2, "does not match the header's digest");
}

/// The metadata-only actions against cryptsetup itself: each is run by ucrypt on one copy
/// of an image and by cryptsetup on another, and `cryptsetup luksDump` of both must agree
/// (and the exit codes).
#[test]
fn config_convert_erase_and_repair_do_what_cryptsetups_do() {
    if !require("cryptsetup") {
        return;
    }
    let rt = Runtime::new();
    let (img, pass) = luks_image(&rt, "img", 20, "luks2", 512);
    let pass = pass.to_str().unwrap().to_string();
    let copy = |name: &str| {
        let p = rt.path(name);
        std::fs::copy(&img, &p).unwrap();
        p.to_str().unwrap().to_string()
    };
    let dump = |p: &str| sh_ok(&format!("cryptsetup luksDump {p}"));
    let cs = |args: &str| sh(&format!("cryptsetup -q {args}"));
    let steps: &[(&[&str], &str)] = &[
        (
            &["config", "--label", "data", "--subsystem", "backup"],
            "config --label data --subsystem backup",
        ),
        (
            &["config", "--subsystem", "other"],
            "config --subsystem other",
        ),
        (
            &["config", "--priority", "prefer", "--key-slot", "0"],
            "config --priority prefer --key-slot 0",
        ),
        (
            &["luksConvert", "--type", "luks1", "-q"],
            "convert --type luks1",
        ),
        (
            &["convert", "--type", "luks2", "-q"],
            "convert --type luks2",
        ),
        (&["repair", "-q"], "repair"),
        (&["erase", "-q"], "erase"),
    ];
    let (ours, theirs) = (copy("ours"), copy("theirs"));
    for (args, cs_args) in steps {
        let mut all = args.to_vec();
        all.push(&ours);
        let out = rt.uc(&all, b"");
        let them = cs(&format!("{cs_args} {theirs}"));
        assert_eq!(
            out.status.code(),
            them.status.code(),
            "{args:?}: {out:?} vs {them:?}"
        );
        assert_eq!(
            dump(&ours).replace(&ours, "IMG"),
            dump(&theirs).replace(&theirs, "IMG"),
            "{args:?}: the headers differ"
        );
    }
    // After erase nothing opens it, for either tool.
    let tp = format!("open --test-passphrase --key-file {pass}");
    assert!(!cs(&format!("{tp} {theirs}")).status.success());
    assert!(!rt
        .uc(
            &["open", &ours, "--test-passphrase", "--key-file", &pass],
            b""
        )
        .status
        .success());
}

#[test]
fn luks_resume_at_a_terminal_asks_again_tries_times() {
    if !require("cryptsetup") || !require("tmux") {
        return;
    }
    let rt = Runtime::new();
    let (img, pass) = luks_image(&rt, "img", 20, "luks2", 512);
    let (img, pass) = (img.to_str().unwrap(), pass.to_str().unwrap());
    rt.ok(
        &["open", img, "s", "--device", "none", "--key-file", pass],
        b"",
    );
    rt.ok(&["luksSuspend", "s"], b"");
    let bin = env!("CARGO_BIN_EXE_ucrypt");
    let runtime = rt.dir().display().to_string();
    let t = Tmux::new("resume", &[("UCRYPT_RUNTIME_DIR", &runtime)]);
    // Default 3 tries: wrong, wrong, right -> 0, resumed. (`e""nd`: only the output
    // shows "end".)
    t.send(&[&format!("{bin} luksResume s; echo rc=$? e\"\"nd1"), "Enter"]);
    for (n, p) in ["bad1", "bad2", "pw"].iter().enumerate() {
        t.answer_nth("Enter passphrase", n + 1, p);
    }
    let text = t.wait("rc=0 end1", 30);
    assert_eq!(
        text.matches("No key available with this passphrase.")
            .count(),
        2,
        "{text}"
    );
    assert_eq!(rt.status("s")["suspended"], false);
    // --tries 1: one wrong passphrase ends it with exit 2, still suspended.
    rt.ok(&["luksSuspend", "s"], b"");
    t.send(&[
        &format!("{bin} luksResume s --tries 1; echo rc=$? e\"\"nd2"),
        "Enter",
    ]);
    t.answer_nth("Enter passphrase", 4, "bad");
    t.wait("rc=2 end2", 30);
    assert_eq!(rt.status("s")["suspended"], true);
    rt.ok(&["luksResume", "s", "--key-file", pass], b"");
    rt.ok(&["close", "s"], b"");
}

/// The volume key cryptsetup reads from `img` with `pass`.
fn cryptsetup_volume_key(img: &str, pass: &str) -> Vec<u8> {
    let dump = Command::new("cryptsetup")
        .args([
            "luksDump",
            "--dump-volume-key",
            "-q",
            "--key-file",
            pass,
            img,
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&dump.stdout);
    let hex: String = text
        .split("MK dump:")
        .nth(1)
        .unwrap_or_else(|| panic!("no key in {text}"))
        .split_whitespace()
        .take_while(|w| w.len() == 2 && w.chars().all(|c| c.is_ascii_hexdigit()))
        .collect();
    hex::decode(hex).unwrap()
}

/// Online reencryption (`reencrypt --active-name`, cryptsetup's online mode): while a
/// client keeps rewriting the whole volume through the instance's NBD socket, the instance
/// re-keys itself, for each resilience mode. Afterwards the volume holds exactly the last
/// pattern the client finished, the header is cryptsetup's finished state (new volume
/// key, no reencrypt requirement, one keyslot) and a fresh open reads the same. A
/// SIGINT to the command stops the pass with the instance still serving both keys; a second
/// run finishes it.
#[test]
fn online_reencryption_keeps_serving_and_rekeys() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    if !require("cryptsetup") || !require("nbdcopy") {
        return;
    }
    let rt = Runtime::new();
    let patterns: Vec<PathBuf> = (0..2u8)
        .map(|i| {
            let p = rt.path(&format!("pattern{i}"));
            let data: Vec<u8> = (0..16u32 << 20)
                .map(|x| (x.wrapping_mul(2_654_435_761) >> (8 + i)) as u8 ^ i)
                .collect();
            std::fs::write(&p, data).unwrap();
            p
        })
        .collect();
    for (n, resilience) in ["checksum", "journal", "none"].iter().enumerate() {
        let name = format!("on{n}");
        let (img, pass) = luks_image(&rt, &format!("img{n}"), 32, "luks2", 4096);
        let (img, pass) = (img.to_str().unwrap(), pass.to_str().unwrap());
        let key_before = cryptsetup_volume_key(img, pass);
        if n == 0 {
            // A read-only instance is not re-encrypted (others may serve the image too).
            rt.ok(
                &[
                    "open",
                    img,
                    "ro",
                    "--device",
                    "none",
                    "--read-only",
                    "--key-file",
                    pass,
                ],
                b"",
            );
            assert_code(
                &rt.uc(
                    &["reencrypt", "--active-name", "ro", "--key-file", pass],
                    b"",
                ),
                1,
                "served read-only",
            );
            rt.ok(&["close", "ro"], b"");
        }
        let uri = rt.ok(
            &["open", img, &name, "--device", "none", "--key-file", pass],
            b"",
        );
        let copy = |from: &str, to: &str| {
            let out = Command::new("nbdcopy").args([from, to]).output().unwrap();
            assert!(out.status.success(), "nbdcopy {from} {to}: {out:?}");
        };
        copy(patterns[0].to_str().unwrap(), &uri);
        // The client: whole-volume rewrites, alternating patterns, until told to stop.
        let stop = Arc::new(AtomicBool::new(false));
        let last = Arc::new(AtomicUsize::new(0));
        let writer = {
            let (stop, last, uri, patterns) =
                (stop.clone(), last.clone(), uri.clone(), patterns.clone());
            std::thread::spawn(move || {
                let mut rounds = 0;
                while !stop.load(Ordering::SeqCst) || rounds < 2 {
                    let i = (rounds + 1) % 2;
                    let out = Command::new("nbdcopy")
                        .args([patterns[i].to_str().unwrap(), uri.as_str()])
                        .output()
                        .unwrap();
                    assert!(out.status.success(), "{out:?}");
                    last.store(i, Ordering::SeqCst);
                    rounds += 1;
                }
                rounds
            })
        };
        let args = [
            "reencrypt",
            "--active-name",
            &name,
            "--key-file",
            pass,
            "--resilience",
            resilience,
            "--hotzone-size",
            "262144",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
        ];
        if n == 1 {
            // Interrupted first: SIGINT while the pass runs.
            let dir = rt.dir();
            let child = Command::new(env!("CARGO_BIN_EXE_ucrypt"))
                .args(args)
                .env("UCRYPT_RUNTIME_DIR", &dir)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(60);
            while rt.status(&name)["reencryption"]["done"]
                .as_u64()
                .unwrap_or(0)
                == 0
            {
                assert!(Instant::now() < deadline, "the pass never started");
                std::thread::sleep(Duration::from_millis(5));
            }
            sigint(child.id());
            let out = child.wait_with_output().unwrap();
            let r = rt.status(&name)["reencryption"].clone();
            eprintln!("after SIGINT: {r}");
            if r["state"] == "interrupted" {
                assert_eq!(out.status.code(), Some(1), "{out:?}");
                let done = r["done"].as_u64().unwrap();
                assert!(done < 32 << 20, "{r}");
            } else {
                // The pass was quicker than the signal: nothing to resume.
                assert_eq!(r["state"], "finished", "{r}: {out:?}");
            }
        }
        rt.ok(&args, b"");
        stop.store(true, Ordering::SeqCst);
        let rounds = writer.join().unwrap();
        let st = rt.status(&name);
        assert_eq!(st["reencryption"]["state"], "finished", "{st}");
        let out = rt.path("out");
        copy(&uri, out.to_str().unwrap());
        let want = &patterns[last.load(Ordering::SeqCst)];
        assert!(
            std::fs::read(&out).unwrap() == std::fs::read(want).unwrap(),
            "{resilience}: the volume is not the last pattern written ({rounds} rounds)"
        );
        rt.ok(&["close", &name], b"");
        let dump = sh_ok(&format!("cryptsetup luksDump {img}"));
        assert!(!dump.contains("reencrypt"), "{dump}");
        let key_after = cryptsetup_volume_key(img, pass);
        assert_ne!(
            key_before, key_after,
            "{resilience}: the volume key did not change"
        );
        let uri = rt.ok(
            &["open", img, &name, "--device", "none", "--key-file", pass],
            b"",
        );
        copy(&uri, out.to_str().unwrap());
        assert!(
            std::fs::read(&out).unwrap() == std::fs::read(want).unwrap(),
            "{resilience}: reopened, the volume differs"
        );
        rt.ok(&["close", &name], b"");
    }
}

fn sigint(pid: u32) {
    // SAFETY: kill(2) on a child of this test.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
}

/// `fallocate -p` on the FUSE file (what the loop driver sends for a block device's
/// write-zeroes and discards) leaves zeroes, partial sectors included, and nothing around
/// it changes; QEMU's own LUKS driver reads the same bytes from the image after close.
/// Without --allow-discards the punch is refused (the kernel then writes zeroes itself).
#[test]
fn a_hole_punched_in_the_fuse_file_reads_back_as_zeroes() {
    if !fuse_usable() || !require("cryptsetup") || !require("qemu-img") || !require("fallocate") {
        return;
    }
    let rt = Runtime::new();
    let (img, pass) = luks_image(&rt, "img", 16, "luks1", 512);
    let (img, pass) = (img.to_str().unwrap(), pass.to_str().unwrap());
    let open = |extra: &[&str]| {
        let mut args = vec!["open", img, "vol", "--device", "fuse", "--key-file", pass];
        args.extend_from_slice(extra);
        rt.ok(&args, b"")
    };
    let node = open(&[]);
    let data = common::nbd::random_bytes(1 << 20);
    // Not fs::write: its O_TRUNC would ask to change the volume's size (EPERM).
    std::os::unix::fs::FileExt::write_all_at(
        &std::fs::OpenOptions::new().write(true).open(&node).unwrap(),
        &data,
        0,
    )
    .unwrap();
    // No allow_discards: refused, the data untouched.
    let out = sh(&format!("fallocate -p -o 4096 -l 8192 {node}"));
    assert!(
        !out.status.success(),
        "punch without --allow-discards: {out:?}"
    );
    assert!(std::fs::read(&node).unwrap()[..1 << 20] == data[..]);
    rt.ok(&["close", "vol"], b"");
    wait_gone(&rt, "vol");

    let node = open(&["--allow-discards"]);
    // Unaligned at both ends (partial 512-byte sectors), and one whole-sector range.
    let holes = [(1000u64, 70_000u64), (300_000, 4096)];
    let mut expect = data.clone();
    for (off, len) in holes {
        sh_ok(&format!("fallocate -p -o {off} -l {len} {node}"));
        expect[off as usize..(off + len) as usize].fill(0);
    }
    sh_ok(&format!("fallocate -z -o 600001 -l 5000 {node}"));
    expect[600_001..605_001].fill(0);
    let back = std::fs::read(&node).unwrap();
    assert!(
        back[..1 << 20] == expect[..],
        "the FUSE file after the punches"
    );
    rt.ok(&["close", "vol"], b"");
    wait_gone(&rt, "vol");

    let raw = rt.path("plain.raw");
    sh_ok(&format!(
        "qemu-img convert --object secret,id=s0,file={pass} --image-opts \
         driver=luks,key-secret=s0,file.filename={img} -O raw {}",
        raw.display()
    ));
    assert!(
        std::fs::read(&raw).unwrap()[..1 << 20] == expect[..],
        "QEMU's LUKS driver reads other bytes"
    );
}

/// Answering anything but YES when luksRemoveKey or luksKillSlot would take away the last
/// keyslot: cryptsetup 2.6's words ("Operation aborted, the keyslot was NOT wiped.") and
/// exit code 2, from both tools side by side; the keyslot is still there afterwards.
#[test]
fn aborting_the_removal_of_the_last_keyslot_exits_2_as_cryptsetup() {
    if !require("cryptsetup") || !require("tmux") {
        return;
    }
    let rt = Runtime::new();
    let (img, pass) = luks_image(&rt, "img", 20, "luks2", 512);
    let (img, pass) = (img.to_str().unwrap(), pass.to_str().unwrap());
    let bin = env!("CARGO_BIN_EXE_ucrypt");
    let t = Tmux::new("lastslot", &[]);
    // The pane's PATH is /usr/bin:/bin; cryptsetup may be in /usr/sbin.
    let cs = sh_ok("command -v cryptsetup");
    for (n, tool) in [bin, &cs, bin, &cs].iter().enumerate() {
        let action = if n < 2 {
            format!("luksRemoveKey {img} --key-file {pass}")
        } else {
            format!("luksKillSlot {img} 0")
        };
        t.send(&[&format!("{tool} {action}; echo rc=$? end{n}"), "Enter"]);
        // A plain question (echo stays on), not a passphrase prompt.
        t.wait_count("Are you sure?", n + 1, 30);
        t.send(&["no", "Enter"]);
        let end = format!("end{n}");
        let text = t.wait_until(&end, 30, |p| {
            p.lines().any(|l| l.starts_with("rc=") && l.ends_with(&end))
        });
        assert!(
            text.contains(&format!("rc=2 end{n}")),
            "{tool} {action}: {text}"
        );
        assert_eq!(
            text.matches("Operation aborted, the keyslot was NOT wiped.")
                .count(),
            n + 1,
            "{tool} {action}: {text}"
        );
    }
    // Still opens with the passphrase.
    let out = Command::new("cryptsetup")
        .args(["open", "--test-passphrase", img, "--key-file", pass])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    // Without a terminal (and without --batch-mode) ucrypt refuses the same way.
    let out = rt.uc(&["luksRemoveKey", img, "--key-file", pass], b"");
    assert_code(&out, 2, "the keyslot was NOT wiped");
}

/// A server started with `--table LINE` (named in the background, and in the foreground)
/// does not keep the key in its command line, which every local user can read in
/// `/proc/PID/cmdline` for as long as it runs: the value is overwritten once parsed.
#[test]
fn a_table_given_on_the_command_line_leaves_no_key_in_the_servers_cmdline() {
    let rt = Runtime::new();
    let img = common::image(rt.root(), "img", 1 << 20);
    let (line, _) = common::nbd::xts_table(rt.root(), &img, 4096, &[]);
    let key = line.split_whitespace().nth(4).unwrap().to_string();
    let cmdline = |pid: i32| {
        String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap())
            .replace('\0', " ")
    };
    rt.ok(&["open", "--table", &line, "bg", "--device", "none"], b"");
    let bg = cmdline(rt.pid("bg"));
    let table_eq = format!("--table={line}");
    let sock = rt.path("fg.sock");
    let mut fg = rt.foreground(&["open", &table_eq, "--socket", sock.to_str().unwrap()]);
    let fg_line = cmdline(fg.id() as i32);
    let _ = fg.kill();
    let _ = fg.wait();
    rt.ok(&["close", "bg"], b"");
    for (what, text) in [("background", &bg), ("foreground", &fg_line)] {
        assert!(
            !text.contains(&key),
            "{what} server's cmdline holds the key: {text}"
        );
        assert!(text.contains(&"x".repeat(key.len())), "{what}: {text}");
        assert!(
            text.contains("open"),
            "{what}: the rest stays readable: {text}"
        );
    }
}

/// `VmLck` of a process, in kB.
fn vm_locked_kb(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with("VmLck:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or_else(|| panic!("no VmLck in {status}"))
}

/// The background server locks its key material as the foreground one does: the volume key
/// is unlocked before the fork and memory locks are not inherited, so the child locks its
/// secrets' pages again (it showed 0 kB locked where the foreground server shows 4).
#[test]
fn the_background_server_locks_its_keys_as_the_foreground_one() {
    if !require("cryptsetup") {
        return;
    }
    let rt = Runtime::new();
    let (img, pass) = luks_image(&rt, "img", 20, "luks2", 4096);
    let (img, pass) = (img.to_str().unwrap(), pass.to_str().unwrap());
    let shared = ["--key-file", pass, "--read-only", "--shared"];
    let mut args = vec!["open", img, "bg", "--device", "none"];
    args.extend(shared);
    rt.ok(&args, b"");
    let bg = vm_locked_kb(rt.pid("bg"));
    let sock = rt.path("fg.sock");
    let mut args = vec!["open", img];
    args.extend(shared);
    args.extend(["--socket", sock.to_str().unwrap()]);
    let mut fg = rt.foreground(&args);
    let fg_kb = vm_locked_kb(fg.id() as i32);
    let _ = fg.kill();
    let _ = fg.wait();
    rt.ok(&["close", "bg"], b"");
    eprintln!("VmLck: background {bg} kB, foreground {fg_kb} kB");
    if fg_kb == 0 {
        // RLIMIT_MEMLOCK 0: nothing can be locked here, so nothing to compare.
        common::require_that(false, "mlock refused (RLIMIT_MEMLOCK)");
        return;
    }
    assert!(
        bg >= fg_kb,
        "the background server has {bg} kB locked, the foreground one {fg_kb} kB"
    );
}

/// The control socket serves each client on its own, against a deadline: 300 idle
/// connections, 20 that sent half a request and 20 that sent garbage do not delay `status`
/// or `close` of anyone else (one idle connection used to block every command for 30 s).
#[test]
fn stuck_or_hostile_control_clients_delay_no_one() {
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    let rt = Runtime::new();
    let img = common::image(rt.root(), "img", 1 << 20);
    let (_, table) = common::nbd::xts_table(rt.root(), &img, 4096, &[]);
    let t = table.to_str().unwrap();
    rt.ok(
        &["open", "--table-file", t, "busy", "--device", "none"],
        b"",
    );
    let ctl = rt.dir().join("busy/control.sock");
    let mut held = Vec::new();
    for i in 0..340 {
        let mut s = UnixStream::connect(&ctl).unwrap();
        match i % 17 {
            0 => s.write_all(br#"{"op":"sta"#).unwrap(),
            1 => s.write_all(b"\x00\xffgarbage\n").unwrap(),
            _ => {}
        }
        held.push(s);
    }
    let t0 = Instant::now();
    let st = rt.status("busy");
    let took = t0.elapsed();
    assert_eq!(st["name"], "busy", "{st}");
    // Below the control socket's 5 s request deadline (what one stuck client served in
    // turn would cost), with room for a loaded machine's process start.
    assert!(
        took < Duration::from_secs(4),
        "status took {took:?} behind stuck clients"
    );
    let t0 = Instant::now();
    rt.ok(&["close", "busy"], b"");
    let took = t0.elapsed();
    assert!(
        took < Duration::from_millis(4500),
        "close took {took:?} behind stuck clients"
    );
    wait_gone(&rt, "busy");
    drop(held);
}

/// Waits until process `pid` is gone; false if it is still there after `secs`.
fn exits_within(pid: i32, secs: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Path::new(&format!("/proc/{pid}")).exists() {
        // A zombie of ours would stay: the servers are daemons (not our children).
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

fn sigterm(pid: i32) {
    // SAFETY: kill(2) on a server this test started.
    unsafe { libc::kill(pid, libc::SIGTERM) };
}

fn table_image(rt: &Runtime, mib: u64) -> String {
    let img = rt.path("img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(mib << 20)
        .unwrap();
    format!(
        "0 {} crypt aes-xts-plain64 {} 0 {} 0",
        mib << 11,
        "ab".repeat(64),
        img.display()
    )
}

#[test]
fn sigterm_stops_a_suspended_instance_cleanly() {
    let rt = Runtime::new();
    let t = table_image(&rt, 4);
    let mut devices = vec!["none"];
    if fuse_usable() {
        devices.push("fuse");
    }
    for dev in devices {
        rt.ok(&["open", "--table", &t, "s", "--device", dev], b"");
        let pid = rt.pid("s");
        rt.ok(&["luksSuspend", "s"], b"");
        assert_eq!(rt.status("s")["suspended"], true);
        sigterm(pid);
        // Before: the final flush waited on the held gate for ever.
        assert!(
            exits_within(pid, 10),
            "{dev}: a suspended server ignored SIGTERM"
        );
        assert!(
            !rt.dir().join("s").exists(),
            "{dev}: the runtime directory stayed"
        );
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        assert!(
            !mounts.contains(rt.dir().to_str().unwrap()),
            "{dev}: a mount stayed: {mounts}"
        );
        // Nothing left behind: the name opens again.
        rt.ok(&["open", "--table", &t, "s", "--device", dev], b"");
        rt.ok(&["close", "s"], b"");
        wait_gone(&rt, "s");
    }
}

#[test]
fn sigterm_is_a_close_refused_while_the_device_is_in_use() {
    if !fuse_usable() {
        return;
    }
    let rt = Runtime::new();
    let t = table_image(&rt, 4);
    let node = rt.ok(&["open", "--table", &t, "busy", "--device", "fuse"], b"");
    let pid = rt.pid("busy");
    let user = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&node)
        .unwrap();
    // close refuses (exit 5); SIGTERM, twice, is logged and ignored, as close.
    assert_code(&rt.uc(&["close", "busy"], b""), 5, "in use");
    sigterm(pid);
    std::thread::sleep(Duration::from_millis(300));
    sigterm(pid);
    assert!(!exits_within(pid, 3), "SIGTERM detached a device in use");
    let log = std::fs::read_to_string(rt.dir().join("busy/log")).unwrap();
    assert!(
        log.contains("SIGTERM ignored") && log.contains("close --force"),
        "{log}"
    );
    // The user's I/O still works.
    use std::os::unix::fs::FileExt;
    user.write_all_at(&[7u8; 4096], 8192).unwrap();
    let mut back = [0u8; 4096];
    user.read_exact_at(&mut back, 8192).unwrap();
    assert_eq!(back, [7u8; 4096]);
    // Once the user is gone, SIGTERM stops it as it always did.
    drop(user);
    sigterm(pid);
    assert!(exits_within(pid, 10), "an unused instance ignored SIGTERM");
    wait_gone(&rt, "busy");
    // No user at all: SIGTERM stops at once (--device none).
    rt.ok(&["open", "--table", &t, "idle", "--device", "none"], b"");
    let pid = rt.pid("idle");
    sigterm(pid);
    assert!(exits_within(pid, 10));
    wait_gone(&rt, "idle");
}

/// luksAddKey, luksRemoveKey and luksChangeKey ask for the existing passphrase in
/// cryptsetup's words (luksRemoveKey says that passphrase is the one deleted), and a wrong
/// answer ends both tools the same way: side by side in tmux.
#[test]
fn key_commands_ask_in_cryptsetups_words() {
    if !require("cryptsetup") || !require("tmux") {
        return;
    }
    let rt = Runtime::new();
    let (img, _) = luks_image(&rt, "img", 20, "luks2", 512);
    let img = img.to_str().unwrap();
    let bin = env!("CARGO_BIN_EXE_ucrypt");
    let cs = sh_ok("command -v cryptsetup");
    let t = Tmux::new("keywords", &[]);
    let mut n = 0;
    for (action, prompt) in [
        ("luksAddKey", "Enter any existing passphrase: "),
        ("luksRemoveKey", "Enter passphrase to be deleted: "),
        ("luksChangeKey", "Enter passphrase to be changed: "),
    ] {
        let mut codes = Vec::new();
        for tool in [bin, cs.as_str()] {
            n += 1;
            let end = format!("end{n}");
            t.send(&[&format!("{tool} {action} {img}; echo rc=$? {end}"), "Enter"]);
            t.answer_nth(prompt.trim_end(), 1, "wrong");
            let text = t.wait_until(&end, 30, |p| {
                p.lines().any(|l| l.starts_with("rc=") && l.ends_with(&end))
            });
            let rc = text
                .lines()
                .find(|l| l.starts_with("rc=") && l.ends_with(&end))
                .unwrap()
                .to_string();
            codes.push(rc.replace(&end, ""));
            t.clear(prompt.trim_end());
        }
        assert_eq!(codes[0], codes[1], "{action}: ucrypt vs cryptsetup");
    }
}

#[test]
fn a_killed_fuse_instance_is_shown_and_its_mount_taken_away() {
    if !fuse_usable() {
        return;
    }
    let rt = Runtime::new();
    let t = table_image(&rt, 4);
    let mnt = rt.path("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = || {
        std::fs::read_to_string("/proc/self/mounts")
            .unwrap()
            .contains(&format!(" {} fuse", mnt.display()))
    };
    // close, ls and status each meet one killed server (its mount at --fuse DIR).
    for cmd in ["close", "ls", "status"] {
        let m = mnt.to_str().unwrap();
        rt.ok(
            &["open", "--table", &t, "k", "--device", "fuse", "--fuse", m],
            b"",
        );
        let pid = rt.pid("k");
        // SAFETY: kill(2) on the server this test started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        assert!(exits_within(pid, 10));
        assert!(mounted(), "{cmd}: the dead mount is there to take away");
        let out = match cmd {
            "close" => rt.uc(&["close", "k"], b""),
            "ls" => rt.uc(&["ls"], b""),
            _ => rt.uc(&["status", "k"], b""),
        };
        let err = String::from_utf8_lossy(&out.stderr);
        // Before: close exited 4 ("not active") and ls/status said nothing; the mount stayed.
        assert!(
            err.contains(&format!("server (pid {pid}) had died"))
                && err.contains(&format!("dead FUSE mount {m} detached")),
            "{cmd}: {out:?}"
        );
        let code = if cmd == "status" { 4 } else { 0 };
        assert_eq!(out.status.code(), Some(code), "{cmd}: {out:?}");
        assert!(!mounted(), "{cmd}: the dead mount stayed");
        assert!(!rt.dir().join("k").exists());
    }
}
