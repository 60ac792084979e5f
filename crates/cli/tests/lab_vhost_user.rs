//! `ucrypt open DEV NAME --device vhost-user` serving a real VM: two instances started on
//! the host (a LUKS2 volume of 4096-byte sectors with `--allow-discards` and two queues, and
//! a LUKS2 volume of 512-byte sectors `--read-only` with one), then one boot of the kernel
//! lab's guest (`tests/lab/run.sh` with `LAB_SHARED_MEM=1`, both sockets attached as
//! `vhost-user-blk-pci` disks) running `tests/lab/vhost_user.sh`: each disk found by its
//! serial (the instance name, `VIRTIO_BLK_T_GET_ID`), logical block = sector size, capacity,
//! 2 queues, mkfs.ext4 / mount / write / fsync / read back, direct writes from both CPUs at
//! once, `blkdiscard` and `blkdiscard -z` (the zeroed range reads back as zeroes), the
//! read-only disk read-only and reading what the host reads; then the kernel's dm-crypt over
//! the same image finds the file, the zeroes and the raw writes. On the host meanwhile:
//! `status` shows the socket as the node and the VM as a user, `close` is refused (exit 5)
//! while the VM is connected. While the guest writes (whole passes over 8 MiB, direct): the
//! read-only instance's server is killed with SIGKILL under the attached VM and `close`
//! cleans up after it (exit 0, socket and instance gone); the read-write volume is
//! `luksSuspend`ed (status says so, the guest's writes wait), `luksResume`d and `refresh`ed,
//! and after the refresh the server still runs no crypt worker thread (the front end's
//! default, crypto on the queue threads, kept); the guest's writes read back, in the guest
//! and through dm-crypt. Afterwards `close` works, and the file written in the guest is
//! read back from the image by `ucrypt read` and `debugfs`.
//!
//! Skipped with a message when `CI` is unset and the guest cannot start (no QEMU, no kernel
//! to download: `scripts/setup.sh` installs and fetches both); fails when `CI` is set.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const UCRYPT: &str = env!("CARGO_BIN_EXE_ucrypt");

fn ucrypt(args: &[&str]) -> Output {
    Command::new(UCRYPT)
        .args(args)
        .output()
        .expect("running ucrypt")
}

fn ok(args: &[&str]) -> String {
    let out = ucrypt(args);
    assert!(
        out.status.success(),
        "ucrypt {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sh_out(cmd: &str) -> String {
    let out = Command::new("bash")
        .args(["-c", cmd])
        .output()
        .expect("bash");
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn status(name: &str) -> serde_json::Value {
    serde_json::from_str(&ok(&["status", "--json", name])).expect("status JSON")
}

/// Closes the instances it names when dropped (a failed assertion leaves none running).
struct Instances(Vec<String>);

impl Drop for Instances {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = ucrypt(&["close", "--force", n]);
        }
    }
}

fn luks_image(dir: &Path, name: &str, mib: u64, sector: &str) -> PathBuf {
    let img = dir.join(name);
    std::fs::File::create(&img)
        .and_then(|f| f.set_len(mib << 20))
        .expect("image");
    let pass = dir.join("pass");
    ok(&[
        "luksFormat",
        "-q",
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        "--sector-size",
        sector,
        "-d",
        pass.to_str().expect("utf-8"),
        img.to_str().expect("utf-8"),
    ]);
    img
}

#[test]
fn a_vm_gets_an_encrypted_disk_over_vhost_user() {
    if !ucrypt_testkit::require("qemu-system-x86_64") || !ucrypt_testkit::require("debugfs") {
        return;
    }
    // The guest shares the repository directory, not /tmp: the images live under target/.
    let root = ucrypt_testkit::repo_root();
    let base = root.join("target");
    std::fs::create_dir_all(&base).expect("target/");
    let tmp = tempfile::Builder::new()
        .prefix("lab-vhost-user.")
        .tempdir_in(&base)
        .expect("tempdir");
    let w = tmp.path();
    let ws = w.to_str().expect("utf-8 path");
    std::fs::write(w.join("pass"), "lab passphrase").expect("pass");
    let pass = format!("{ws}/pass");
    let rw = luks_image(w, "rw.img", 64, "4096");
    let ro = luks_image(w, "ro.img", 24, "512");
    let (rws, ros) = (rw.to_str().expect("utf-8"), ro.to_str().expect("utf-8"));
    std::fs::write(
        w.join("rw.table"),
        ok(&["luksOpen", "--print-table", "--showkeys", "-d", &pass, rws]),
    )
    .expect("rw.table");
    std::fs::write(
        w.join("ro.table"),
        ok(&["luksOpen", "--print-table", "--showkeys", "-d", &pass, ros]),
    )
    .expect("ro.table");
    // Something to read on the read-only disk that is not all one byte.
    std::fs::write(w.join("ro.pattern"), ucrypt_testkit::random_bytes(1 << 20)).expect("pattern");
    ok(&[
        "write",
        "--table-file",
        &format!("{ws}/ro.table"),
        "--input",
        &format!("{ws}/ro.pattern"),
    ]);
    let ro_sha = sh_out(&format!(
        "{UCRYPT} read --table-file {ws}/ro.table --length 1048576 | sha256sum | cut -d' ' -f1"
    ));
    std::fs::write(w.join("ro.sha"), &ro_sha).expect("ro.sha");

    let id = std::process::id();
    let (rw_name, ro_name) = (format!("vurw{id}"), format!("vuro{id}"));
    let mut instances = Instances(Vec::new());
    let (rw_sock, ro_sock) = (format!("{ws}/rw.sock"), format!("{ws}/ro.sock"));
    let shown = ok(&[
        "open",
        rws,
        &rw_name,
        "--device",
        "vhost-user",
        "--vhost-socket",
        &rw_sock,
        "--queues",
        "2",
        "--allow-discards",
        "-d",
        &pass,
    ]);
    instances.0.push(rw_name.clone());
    assert_eq!(shown.trim(), rw_sock, "open prints the socket");
    ok(&[
        "open",
        ros,
        &ro_name,
        "--device",
        "vhost-user",
        "--vhost-socket",
        &ro_sock,
        "--queues",
        "1",
        "--read-only",
        "-d",
        &pass,
    ]);
    instances.0.push(ro_name.clone());
    let s = status(&rw_name);
    assert_eq!(s["frontend"], "vhost-user");
    assert_eq!(s["node"], rw_sock.as_str());
    assert_eq!(s["in_use"], false, "no VM yet");
    let rw_bytes = s["size_sectors"].as_u64().expect("size") * 512;

    let qemu_args = format!(
        "-chardev socket,id=vu0,path={rw_sock} -device vhost-user-blk-pci,chardev=vu0,num-queues=2 \
         -chardev socket,id=vu1,path={ro_sock} -device vhost-user-blk-pci,chardev=vu1,num-queues=1"
    );
    let script = root.join("tests/lab/vhost_user.sh");
    let args = [
        ws.to_string(),
        rw_name.clone(),
        ro_name.clone(),
        rw_bytes.to_string(),
    ];
    let guest = std::thread::spawn(move || {
        ucrypt_testkit::run_in_vm(
            &script,
            args,
            &[
                ("LAB_SHARED_MEM", "1"),
                ("LAB_QEMU_ARGS", qemu_args.as_str()),
                ("LAB_TIMEOUT", "900"),
            ],
        )
    });

    // While the VM is connected: status says so, close is refused and changes nothing.
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut saw_vm = false;
    while !guest.is_finished() && Instant::now() < deadline {
        if status(&rw_name)["in_use"] == true {
            saw_vm = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let refused = saw_vm.then(|| ucrypt(&["close", &rw_name]));

    // While the guest writes: the read-only instance's server is killed (-9) and `close`
    // cleans up after it with the VM still attached; the read-write volume is suspended
    // (its I/O waits), resumed and refreshed, and the refresh keeps the front end's
    // default of crypto on the queue threads (no crypt worker threads in the server).
    let mut phase = None;
    while saw_vm && !guest.is_finished() && Instant::now() < deadline {
        if !w.join("io-running").exists() {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        let ro_pid = status(&ro_name)["pid"].as_u64().expect("pid");
        sh_out(&format!("kill -9 {ro_pid}"));
        let t0 = Instant::now();
        while Path::new(&format!("/proc/{ro_pid}")).exists() && t0.elapsed().as_secs() < 10 {
            std::thread::sleep(Duration::from_millis(50));
        }
        let dead_close = ucrypt(&["close", &ro_name]);
        let ro_dir_gone = !Path::new(&ro_sock).exists();
        let suspend = ucrypt(&["luksSuspend", &rw_name]);
        let suspended = status(&rw_name)["suspended"] == true;
        std::thread::sleep(Duration::from_secs(3));
        let resume = ucrypt(&["luksResume", &rw_name, "-d", &pass]);
        let refresh = ucrypt(&["refresh", &rw_name, "-d", &pass]);
        let pid = status(&rw_name)["pid"].as_u64().expect("pid");
        let crypt_threads = sh_out(&format!(
            "cat /proc/{pid}/task/*/comm | grep -c '^ucrypt-crypt' || true"
        ));
        std::fs::write(w.join("resumed"), "").expect("resumed");
        phase = Some((
            dead_close,
            ro_dir_gone,
            suspend,
            suspended,
            resume,
            refresh,
            crypt_threads,
        ));
        break;
    }
    let out = guest.join().expect("guest thread");
    let Some(out) = out else {
        return; // skipped: the lab could not start
    };
    assert!(saw_vm, "status never showed the VM as connected");
    let refused = refused.expect("close was tried");
    assert_eq!(
        refused.status.code(),
        Some(5),
        "close while a VM is connected: {}",
        String::from_utf8_lossy(&refused.stderr)
    );
    ucrypt_testkit::assert_lab_passed(&out);
    let (dead_close, ro_dir_gone, suspend, suspended, resume, refresh, crypt_threads) =
        phase.expect("the guest never started its writes for the suspend phase");
    let said = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        dead_close.status.success(),
        "close of the killed instance: {}",
        said(&dead_close)
    );
    assert!(
        ro_dir_gone,
        "close of the killed instance removes its socket"
    );
    assert!(
        !Path::new(&format!("{ws}/ro.sock")).exists()
            && ucrypt(&["status", &ro_name]).status.code() == Some(4),
        "nothing is left of the killed instance"
    );
    assert!(suspend.status.success(), "luksSuspend: {}", said(&suspend));
    assert!(suspended, "status shows the volume suspended");
    assert!(resume.status.success(), "luksResume: {}", said(&resume));
    assert!(refresh.status.success(), "refresh: {}", said(&refresh));
    assert_eq!(
        crypt_threads.trim(),
        "0",
        "after refresh the crypto still runs on the queue threads"
    );

    // The VM is gone: close works, and the host reads the guest's file from the image.
    let deadline = Instant::now() + Duration::from_secs(30);
    while status(&rw_name)["in_use"] == true && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    ok(&["close", &rw_name]);
    instances.0.clear();
    assert!(!Path::new(&rw_sock).exists(), "close removes the socket");
    let guest_sha = std::fs::read_to_string(w.join("guest.sha")).expect("guest.sha");
    ok(&[
        "read",
        "--table-file",
        &format!("{ws}/rw.table"),
        "--output",
        &format!("{ws}/plain.img"),
    ]);
    let host_sha = sh_out(&format!(
        "debugfs -R 'cat /data' {ws}/plain.img 2>/dev/null | sha256sum | cut -d' ' -f1"
    ));
    assert_eq!(host_sha, guest_sha.trim(), "the file as the host reads it");
}

/// The VM's analogue of ublk recovery: QEMU's chardev with `reconnect=1`, a guest writing
/// and fsync'ing files one after another on an ext4 of the disk (`tests/lab/vhost_reconnect.sh`),
/// the server `kill -9`'d under it and a new one started with `open --recover` on the same
/// socket; the guest goes on (requests the dead server had in flight resubmitted from the
/// inflight region QEMU kept), and afterwards every file whose fsync returned reads back
/// from the image through a fresh `ucrypt read`. Also the rules of `--recover` for this
/// front end: refused while the server lives (exit 5) and for a name with no dead instance
/// (exit 4); `status` of the dead instance keeps its socket for the VM. Then a `resize`
/// after the image grew reaches the connected VM (a configuration-change message).
#[test]
fn a_vm_gets_its_disk_back_after_kill_9_and_open_recover() {
    if !ucrypt_testkit::require("qemu-system-x86_64") || !ucrypt_testkit::require("debugfs") {
        return;
    }
    let root = ucrypt_testkit::repo_root();
    let base = root.join("target");
    std::fs::create_dir_all(&base).expect("target/");
    let tmp = tempfile::Builder::new()
        .prefix("lab-vhost-reconnect.")
        .tempdir_in(&base)
        .expect("tempdir");
    let w = tmp.path();
    let ws = w.to_str().expect("utf-8 path");
    std::fs::write(w.join("pass"), "lab passphrase").expect("pass");
    let pass = format!("{ws}/pass");
    let img = luks_image(w, "rc.img", 64, "512");
    let imgs = img.to_str().expect("utf-8");
    let id = std::process::id();
    let name = format!("vurc{id}");
    let sock = format!("{ws}/rc.sock");
    let pid_file = format!("{ws}/rc.pid");
    let mut instances = Instances(Vec::new());
    let open = |recover: bool| {
        let mut args = vec![
            "open",
            imgs,
            &name,
            "--device",
            "vhost-user",
            "--queues",
            "2",
            "--pid-file",
            &pid_file,
            "-d",
            &pass,
        ];
        if recover {
            args.push("--recover");
        } else {
            args.extend(["--vhost-socket", &sock]);
        }
        ucrypt(&args)
    };
    let out = open(false);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    instances.0.push(name.clone());
    let live = open(true);
    assert_eq!(live.status.code(), Some(5), "--recover of a live instance");
    let none = ucrypt(&[
        "open",
        imgs,
        &format!("vunone{id}"),
        "--device",
        "vhost-user",
        "--recover",
        "-d",
        &pass,
    ]);
    assert_eq!(
        none.status.code(),
        Some(4),
        "--recover with nothing to recover"
    );
    assert!(
        String::from_utf8_lossy(&none.stderr).contains("waits for recovery"),
        "{}",
        String::from_utf8_lossy(&none.stderr)
    );

    let qemu_args = format!(
        "-chardev socket,id=vu0,path={sock},reconnect=1 \
         -device vhost-user-blk-pci,chardev=vu0,num-queues=2"
    );
    let script = root.join("tests/lab/vhost_reconnect.sh");
    let args = [ws.to_string(), name.clone()];
    let guest = std::thread::spawn(move || {
        ucrypt_testkit::run_in_vm(
            &script,
            args,
            &[
                ("LAB_SHARED_MEM", "1"),
                ("LAB_QEMU_ARGS", qemu_args.as_str()),
                ("LAB_TIMEOUT", "1200"),
            ],
        )
    });
    let deadline = Instant::now() + Duration::from_secs(900);
    while !guest.is_finished() && !w.join("ready").exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut recovered = None;
    if w.join("ready").exists() {
        let pid = std::fs::read_to_string(&pid_file).expect("pid file");
        sh_out(&format!("kill -9 {}", pid.trim()));
        let t0 = Instant::now();
        while Path::new(&format!("/proc/{}", pid.trim())).exists() && t0.elapsed().as_secs() < 10 {
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(500));
        let st = ucrypt(&["status", &name]);
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&st.stdout),
            String::from_utf8_lossy(&st.stderr)
        );
        assert!(Path::new(&sock).exists(), "status left the socket: {said}");
        assert!(
            said.contains("--recover"),
            "status of the dead instance: {said}"
        );
        let out = open(true);
        std::fs::write(w.join("recovered"), "").expect("recovered");
        recovered = Some((out, t0.elapsed()));
    }
    // A resize while the VM is connected reaches it (a configuration-change message).
    while recovered.is_some()
        && !guest.is_finished()
        && !w.join("written").exists()
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut resized = None;
    if w.join("written").exists() {
        std::fs::File::options()
            .write(true)
            .open(&img)
            .and_then(|f| f.set_len(80 << 20))
            .expect("growing the image");
        resized = Some(ucrypt(&["resize", &name, "--key-file", &pass]));
        let bytes = status(&name)["size_sectors"].as_u64().expect("size") * 512;
        std::fs::write(w.join("resized"), bytes.to_string()).expect("resized");
    }
    let out = guest.join().expect("guest thread");
    let Some(out) = out else {
        return; // skipped: the lab could not start
    };
    let resized = resized.expect("the guest never said it had written");
    assert!(
        resized.status.success(),
        "resize with the VM connected: {}",
        String::from_utf8_lossy(&resized.stderr)
    );
    let (reopened, took) = recovered.expect("the guest never said it was ready");
    assert!(
        reopened.status.success(),
        "open --recover: {}",
        String::from_utf8_lossy(&reopened.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&reopened.stdout).trim(), sock);
    eprintln!("kill -9 to a new server: {took:?}");
    ucrypt_testkit::assert_lab_passed(&out);

    let deadline = Instant::now() + Duration::from_secs(30);
    while status(&name)["in_use"] == true && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    ok(&["close", &name]);
    instances.0.clear();
    // A fresh open of the image reads every file whose fsync returned in the guest.
    std::fs::write(
        w.join("rc.table"),
        ok(&["luksOpen", "--print-table", "--showkeys", "-d", &pass, imgs]),
    )
    .expect("table");
    ok(&[
        "read",
        "--table-file",
        &format!("{ws}/rc.table"),
        "--output",
        &format!("{ws}/plain.img"),
    ]);
    let list = std::fs::read_to_string(w.join("fsynced")).expect("fsynced");
    let mut n = 0;
    for line in list.lines() {
        let (f, want) = line.split_once(' ').expect("name and sha");
        let got = sh_out(&format!(
            "debugfs -R 'cat /{f}' {ws}/plain.img 2>/dev/null | sha256sum | cut -d' ' -f1"
        ));
        assert_eq!(got, want, "{f} as the host reads it");
        n += 1;
    }
    assert!(n >= 20, "only {n} files were written");
    eprintln!("{n} fsync'd files read back on the host");
}
