//! `ucrypt crypttab open|close|ls|generate` on the host: two LUKS2 volumes of one crypttab
//! opened with the FUSE front end (no kernel module), written, closed and opened again;
//! `--notify` as a Type=notify unit runs it (READY=1 on a datagram socket, the passphrase
//! through a stand-in systemd-ask-password); a key file on another device's file system;
//! bad files refused with file, line and option; the generator's units checked line by
//! line and by `systemd-analyze verify`.

#![allow(clippy::unwrap_used)]

mod common;

use common::runtime::Runtime;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

impl Runtime {
    fn uc(&self, args: &[&str]) -> Output {
        let dir = self.dir();
        common::ucrypt_env(args, b"", &[("UCRYPT_RUNTIME_DIR", dir.as_os_str())])
    }
    fn ok(&self, args: &[&str]) -> String {
        let out = self.uc(args);
        assert!(
            out.status.success(),
            "ucrypt {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
    /// A LUKS2 image (fast PBKDF2) whose passphrase is `pass`.
    fn luks(&self, name: &str, pass: &[u8]) -> PathBuf {
        let img = self.path(name);
        std::fs::File::create(&img)
            .unwrap()
            .set_len(20 << 20)
            .unwrap();
        let key = self.path(&format!("{name}.pass"));
        std::fs::write(&key, pass).unwrap();
        self.ok(&common::luks2_format_args(
            key.to_str().unwrap(),
            &[],
            img.to_str().unwrap(),
        ));
        img
    }
    fn fuse_file(&self, name: &str) -> PathBuf {
        self.dir().join(name).join("fuse").join(name)
    }
}

fn fuse_usable() -> bool {
    let ok = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .is_ok();
    common::require_that(ok, "/dev/fuse is not usable here")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Rows of `crypttab ls` as (name, state).
fn states(rt: &Runtime, tab: &Path) -> Vec<(String, String)> {
    let text = rt.ok(&["crypttab", "ls", "--file", tab.to_str().unwrap()]);
    let mut lines = text.lines();
    let head: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(head, ["NAME", "DEVICE", "KEY", "OPTIONS", "STATE"]);
    lines
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w[0].to_string(), w[w.len() - 1].to_string())
        })
        .collect()
}

#[test]
fn two_volumes_from_one_crypttab_open_and_close() {
    if !fuse_usable() {
        return;
    }
    let rt = Runtime::new();
    let a = rt.luks("a.img", b"secret-a");
    let b = rt.luks("b.img", b"secret-b");
    // keyfile-size=8: only the first 8 bytes are the key.
    std::fs::write(rt.path("b.img.pass"), b"secret-b and more").unwrap();
    let c = rt.luks("c.img", b"secret-c");
    let tab = rt.path("ucrypttab");
    std::fs::write(
        &tab,
        format!(
            "# name device key options\n\
             vola {a} {a}.pass luks,x-ucrypt-device=fuse,discard\n\
             \n\
             volb \"{b}\" {b}.pass luks,x-ucrypt-device=fuse,keyfile-size=8\n\
             volc {c} none noauto,headless,x-ucrypt-device=fuse\n",
            a = a.display(),
            b = b.display(),
            c = c.display()
        ),
    )
    .unwrap();
    let t = tab.to_str().unwrap();
    let closed = |n: &str| (n.to_string(), "closed".to_string());
    let open = |n: &str| (n.to_string(), "open".to_string());
    assert_eq!(
        states(&rt, &tab),
        [closed("vola"), closed("volb"), closed("volc")]
    );

    // Every entry without noauto: two nodes printed, both instances running.
    let out = rt.ok(&["crypttab", "open", "--file", t]);
    let nodes: Vec<&str> = out.lines().collect();
    assert_eq!(nodes.len(), 2, "{out}");
    assert_eq!(
        states(&rt, &tab),
        [open("vola"), open("volb"), closed("volc")]
    );
    let status = rt.ok(&["status", "volb"]);
    assert!(status.contains("LUKS2"), "{status}");

    // Data through both, then opened again: already open, nothing changes.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(rt.fuse_file("vola"))
        .unwrap();
    std::io::Write::write_all(&mut f, &vec![0xa5u8; 1 << 20]).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(rt.fuse_file("volb"))
        .unwrap();
    std::io::Write::write_all(&mut f, b"volume b says hello").unwrap();
    f.sync_all().unwrap();
    drop(f);
    let again = rt.uc(&["crypttab", "open", "--file", t]);
    assert!(again.status.success(), "{again:?}");
    assert!(stderr(&again).contains("vola is already open"), "{again:?}");

    // volc: headless, no key file: tokens only, and the image has none.
    let c = rt.uc(&["crypttab", "open", "--file", t, "volc"]);
    assert_ne!(c.status.code(), Some(0), "{c:?}");
    assert!(stderr(&c).contains("token"), "{c:?}");

    rt.ok(&["crypttab", "close", "--file", t]);
    assert_eq!(
        states(&rt, &tab),
        [closed("vola"), closed("volb"), closed("volc")]
    );
    let gone = rt.uc(&["crypttab", "close", "--file", t, "vola"]);
    assert_eq!(gone.status.code(), Some(4), "{gone:?}");

    // Opened again by name, in the order given: the plaintext is back.
    rt.ok(&["crypttab", "open", "--file", t, "volb", "vola"]);
    let back = std::fs::read(rt.fuse_file("volb")).unwrap();
    assert!(back.starts_with(b"volume b says hello"));
    let back = std::fs::read(rt.fuse_file("vola")).unwrap();
    assert!(back[..1 << 20].iter().all(|&x| x == 0xa5));
    // And the ciphertext on disk is not the plaintext.
    let raw = std::fs::read(&b).unwrap();
    assert!(!raw.windows(19).any(|w| w == b"volume b says hello"));
    rt.ok(&["crypttab", "close", "--file", t, "vola", "volb"]);
    assert!(rt.ok(&["ls"]).trim().is_empty());
}

#[test]
fn readonly_and_wrong_keys() {
    if !fuse_usable() {
        return;
    }
    let rt = Runtime::new();
    let a = rt.luks("a.img", b"right");
    let b = rt.luks("b.img", b"right");
    let wrong = rt.path("wrong.key");
    std::fs::write(&wrong, b"wrong").unwrap();
    let tab = rt.path("tab");
    std::fs::write(
        &tab,
        format!(
            "ro {a} {a}.pass luks,readonly,x-ucrypt-device=fuse\n\
             bad {b} {w} luks,x-ucrypt-device=fuse,nofail\n\
             gone /nonexistent/x.img {a}.pass luks,x-ucrypt-device=fuse\n",
            a = a.display(),
            b = b.display(),
            w = wrong.display()
        ),
    )
    .unwrap();
    let t = tab.to_str().unwrap();
    rt.ok(&["crypttab", "open", "--file", t, "ro"]);
    let w = std::fs::OpenOptions::new()
        .write(true)
        .open(rt.fuse_file("ro"));
    assert!(w.is_err(), "a readonly entry is writable");
    // Named, a wrong key is cryptsetup's exit 2, nofail or not.
    let bad = rt.uc(&["crypttab", "open", "--file", t, "bad"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    let gone = rt.uc(&["crypttab", "open", "--file", t, "gone"]);
    assert_eq!(gone.status.code(), Some(4), "{gone:?}");
    assert!(stderr(&gone).contains("/nonexistent/x.img"), "{gone:?}");
    rt.ok(&["crypttab", "close", "--file", t, "ro"]);
    // All of them: nofail lets the others go on, the failure without it is the status.
    let all = rt.uc(&["crypttab", "open", "--file", t]);
    assert_eq!(all.status.code(), Some(4), "{all:?}");
    assert!(stderr(&all).contains("(nofail: going on)"), "{all:?}");
    assert!(rt.fuse_file("ro").exists());
    rt.ok(&["crypttab", "close", "--file", t]);
    let ro = format!(
        "ro {a} {a}.pass luks,readonly,x-ucrypt-device=fuse\n",
        a = a.display()
    );
    let w = format!(
        "bad {b} {w} luks,nofail\n",
        b = b.display(),
        w = wrong.display()
    );
    std::fs::write(&tab, format!("{ro}{w}")).unwrap();
    rt.ok(&["crypttab", "open", "--file", t]);
    rt.ok(&["crypttab", "close", "--file", t]);
}

#[test]
fn bad_files_are_refused_with_file_line_and_option() {
    let rt = Runtime::new();
    let cases = [
        (
            "v /dev/null none luks,frobnicate\n",
            1,
            "2: unknown option frobnicate",
        ),
        ("v /dev/null none swap\n", 1, "option swap is not supported"),
        (
            "v /dev/null none luks,size=256\n",
            1,
            "option size= is for plain",
        ),
        (
            "v /dev/null none x-ucrypt-device=vdpa\n",
            1,
            "unknown front end",
        ),
        (
            "v /dev/null none tpm2-device=/dev/tpmrm0\n",
            1,
            "write tpm2-device=auto",
        ),
        ("v\n", 1, "2: a line needs at least a name and a device"),
        ("v /dev/null\nv /dev/zero\n", 1, "3: name v is used again"),
    ];
    for (body, code, want) in cases {
        let tab = rt.path("tab");
        std::fs::write(&tab, format!("# header\n{body}")).unwrap();
        for cmd in ["ls", "open", "close"] {
            let out = rt.uc(&["crypttab", cmd, "--file", tab.to_str().unwrap()]);
            assert_eq!(out.status.code(), Some(code), "{cmd} {body:?}: {out:?}");
            let err = stderr(&out);
            assert!(err.contains(&format!("{}:", tab.display())), "{err}");
            assert!(err.contains(want), "{body:?}: {err}");
        }
    }
    let missing = rt.uc(&["crypttab", "ls", "--file", "/nonexistent/tab"]);
    assert_eq!(missing.status.code(), Some(4), "{missing:?}");
    let tab = rt.path("tab");
    std::fs::write(&tab, "v /dev/null\n").unwrap();
    let nope = rt.uc(&["crypttab", "open", "--file", tab.to_str().unwrap(), "w"]);
    assert!(stderr(&nope).contains("has no entry w"), "{nope:?}");
    std::fs::write(&tab, "v /dev/null\nw /dev/zero\n").unwrap();
    let two = rt.uc(&[
        "crypttab",
        "open",
        "--notify",
        "--file",
        tab.to_str().unwrap(),
    ]);
    assert_eq!(two.status.code(), Some(1), "{two:?}");
    assert!(stderr(&two).contains("exactly one NAME"), "{two:?}");
}

/// `--notify` as systemd runs it: no terminal, `$NOTIFY_SOCKET`, the passphrase from
/// systemd-ask-password (a stand-in on PATH that prints it); READY=1 arrives once the
/// FUSE file exists, the process stays the server until `ucrypt close`.
#[test]
fn notify_unit_gets_ready_and_stops_on_close() {
    if !fuse_usable() {
        return;
    }
    let rt = Runtime::new();
    let a = rt.luks("a.img", b"asked for");
    let bin = rt.path("bin");
    std::fs::create_dir(&bin).unwrap();
    let ask = bin.join("systemd-ask-password");
    std::fs::write(
        &ask,
        format!(
            "#!/bin/sh\necho \"$@\" > {}\nprintf 'asked for\\n'\n",
            rt.path("asked").display()
        ),
    )
    .unwrap();
    std::os::unix::fs::PermissionsExt::set_mode(
        &mut std::fs::metadata(&ask).unwrap().permissions(),
        0o755,
    );
    std::fs::set_permissions(&ask, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let tab = rt.path("tab");
    std::fs::write(
        &tab,
        format!("vol {} - luks,x-ucrypt-device=fuse\n", a.display()),
    )
    .unwrap();
    let sock_path = rt.path("notify");
    let sock = std::os::unix::net::UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut server = Command::new(env!("CARGO_BIN_EXE_ucrypt"))
        .args(["crypttab", "open", "--notify", "--file"])
        .arg(&tab)
        .arg("vol")
        .env("UCRYPT_RUNTIME_DIR", rt.dir())
        .env("NOTIFY_SOCKET", &sock_path)
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut buf = [0u8; 256];
    let n = sock.recv(&mut buf).unwrap();
    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(msg.starts_with("READY=1\n"), "{msg}");
    assert!(
        msg.contains(&rt.fuse_file("vol").display().to_string()),
        "{msg}"
    );
    assert!(rt.fuse_file("vol").exists());
    let asked = std::fs::read_to_string(rt.path("asked")).unwrap();
    assert!(asked.contains("Enter passphrase for"), "{asked}");
    // The unit's main process is the server: still running.
    assert!(server.try_wait().unwrap().is_none());
    let pid = rt.ok(&["status", "vol"]);
    assert!(pid.contains(&format!("pid {}", server.id())), "{pid}");
    rt.ok(&["close", "vol"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = server.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the server did not stop after close"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
}

/// A key file on another device's file system (`FILE:DEVICE`): mounted read-only while
/// the key is read.
#[test]
fn key_file_on_another_device() {
    if !fuse_usable() || !common::require("mkfs.ext4") || !common::require("debugfs") {
        return;
    }
    let rt = Runtime::new();
    let a = rt.luks("a.img", b"on the stick");
    let stick = rt.path("stick.img");
    std::fs::File::create(&stick)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let ok = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-L", "KEYSTICK"])
        .arg(&stick)
        .status()
        .unwrap();
    assert!(ok.success());
    std::fs::write(rt.path("k"), b"on the stick").unwrap();
    let put = Command::new("debugfs")
        .args(["-w", "-R"])
        .arg(format!("write {} key.bin", rt.path("k").display()))
        .arg(&stick)
        .output()
        .unwrap();
    assert!(put.status.success(), "{put:?}");
    // mount(8) of an image file needs a loop device.
    let probe = rt.path("probe");
    std::fs::create_dir(&probe).unwrap();
    let mounted = Command::new("mount")
        .args(["-o", "ro"])
        .arg(&stick)
        .arg(&probe)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if mounted {
        let _ = Command::new("umount").arg(&probe).status();
    }
    if !common::require_that(
        mounted,
        "mount -o loop does not work here (no loop devices)",
    ) {
        return;
    }
    let tab = rt.path("tab");
    std::fs::write(
        &tab,
        format!(
            "vol {} /key.bin:{} luks,x-ucrypt-device=fuse\n",
            a.display(),
            stick.display()
        ),
    )
    .unwrap();
    rt.ok(&["crypttab", "open", "--file", tab.to_str().unwrap()]);
    assert!(rt.fuse_file("vol").exists());
    rt.ok(&["crypttab", "close", "--file", tab.to_str().unwrap()]);
}

#[test]
fn generator_writes_units_that_systemd_accepts() {
    let rt = Runtime::new();
    let img = rt.path("disk img");
    std::fs::write(&img, b"").unwrap();
    let key = rt.path("key");
    std::fs::write(&key, b"k").unwrap();
    let tab = rt.path("ucrypttab");
    std::fs::write(
        &tab,
        format!(
            "data UUID=2f5c9a0e-7d1b none luks,x-ucrypt-device=ublk,x-systemd.device-timeout=5s\n\
             img \"{}\" {} luks,nofail,x-ucrypt-device=fuse\n\
             net /dev/nbd9 - _netdev,noauto,x-ucrypt-device=nbd\n\
             swap-1 /dev/vdb /dev/urandom plain,cipher=aes-xts-plain64,size=512\n",
            img.display(),
            key.display()
        ),
    )
    .unwrap();
    let out = rt.path("gen");
    std::fs::create_dir(&out).unwrap();
    rt.ok(&[
        "crypttab",
        "generate",
        "--file",
        tab.to_str().unwrap(),
        out.to_str().unwrap(),
        "/nonexistent/early",
        "/nonexistent/late",
    ]);
    let mut files: Vec<String> = walk(&out)
        .iter()
        .map(|p| p.strip_prefix(&out).unwrap().display().to_string())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "cryptsetup.target.requires/ucrypt@data.service",
            "cryptsetup.target.requires/ucrypt@swap\\x2d1.service",
            "cryptsetup.target.wants/ucrypt@img.service",
            "dev-disk-by\\x2duuid-2f5c9a0e\\x2d7d1b.device.d/50-ucrypt-device-timeout.conf",
            "ucrypt@data.service",
            "ucrypt@img.service",
            "ucrypt@net.service",
            "ucrypt@swap\\x2d1.service",
        ]
    );
    let exe = std::fs::canonicalize(env!("CARGO_BIN_EXE_ucrypt")).unwrap();
    let data = std::fs::read_to_string(out.join("ucrypt@data.service")).unwrap();
    let exec = format!(
        "ExecStart={} crypttab open --file {} --notify data",
        exe.display(),
        tab.display()
    );
    assert!(data.lines().any(|l| l == exec), "{exec}\n{data}");
    let img_unit = std::fs::read_to_string(out.join("ucrypt@img.service")).unwrap();
    assert!(
        img_unit.contains(&format!("RequiresMountsFor=\"{}\"\n", img.display())),
        "{img_unit}"
    );
    assert!(!img_unit.contains("Before=cryptsetup.target"), "{img_unit}");
    let net = std::fs::read_to_string(out.join("ucrypt@net.service")).unwrap();
    assert!(net.contains("Wants=modprobe@nbd.service\n"), "{net}");
    assert!(net.contains("Before=remote-cryptsetup.target\n"), "{net}");

    // A bad line: no unit for it, the others written, exit 1 naming the line.
    let mixed = rt.path("mixed");
    std::fs::write(&mixed, "good /dev/vdc\nbad /dev/vdd none swap\n").unwrap();
    let some = rt.path("some");
    std::fs::create_dir(&some).unwrap();
    let out_mixed = rt.uc(&[
        "crypttab",
        "generate",
        "--file",
        mixed.to_str().unwrap(),
        some.to_str().unwrap(),
    ]);
    assert_eq!(out_mixed.status.code(), Some(1), "{out_mixed:?}");
    assert!(
        stderr(&out_mixed).contains(":2: option swap is not supported"),
        "{out_mixed:?}"
    );
    assert!(some.join("ucrypt@good.service").exists());
    assert!(!some.join("ucrypt@bad.service").exists());

    // No file: no units, no error (boot without a ucrypttab).
    let empty = rt.path("empty");
    std::fs::create_dir(&empty).unwrap();
    rt.ok(&[
        "crypttab",
        "generate",
        "--file",
        "/nonexistent/tab",
        empty.to_str().unwrap(),
    ]);
    assert!(walk(&empty).is_empty());

    if !common::require("systemd-analyze") {
        return;
    }
    // The shipped template, as an instance, with this build's binary.
    let template = std::fs::read_to_string(common_repo().join("systemd/ucrypt@.service"))
        .unwrap()
        .replace("/usr/local/bin/ucrypt", &exe.display().to_string());
    std::fs::write(out.join("ucrypt@byhand.service"), template).unwrap();
    let units: Vec<PathBuf> = ["data", "img", "net", "swap\\x2d1", "byhand"]
        .iter()
        .map(|n| out.join(format!("ucrypt@{n}.service")))
        .collect();
    let verify = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(&units)
        .env("SYSTEMD_UNIT_PATH", format!("{}:", out.display()))
        .env("SYSTEMD_LOG_LEVEL", "notice")
        .output()
        .unwrap();
    assert!(
        verify.status.success() && verify.stderr.is_empty(),
        "systemd-analyze verify: {verify:?}\n{}",
        String::from_utf8_lossy(&verify.stderr)
    );
}

fn common_repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every file and link under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let t = e.file_type().unwrap();
        if t.is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

#[allow(dead_code)]
fn _unused(_: &OsStr) {}
