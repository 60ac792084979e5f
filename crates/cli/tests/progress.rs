//! Progress and interruption of long operations: `--progress-json` lines shaped as
//! cryptsetup's, no bar when stderr is not a terminal, and in a real terminal (tmux) a bar
//! while wiping, Ctrl-C ending a TCRYPT search at once and a wipe with how far it got.

#![allow(clippy::unwrap_used)]

mod common;

use common::require;
use common::tmux::Tmux;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn sh(cmd: &str) -> Output {
    Command::new("sh").arg("-c").arg(cmd).output().unwrap()
}

fn sh_ok(cmd: &str) -> String {
    let out = sh(cmd);
    assert!(out.status.success(), "{cmd}: {out:?}");
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The keys of a JSON object line, in order, with every value required to be a string
/// of decimal digits (but "device").
fn json_keys(line: &str) -> Vec<String> {
    let v: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON object: {line:?}: {e}"));
    for (k, val) in &v {
        let s = val
            .as_str()
            .unwrap_or_else(|| panic!("{k} is not a string: {line}"));
        if k != "device" {
            assert!(
                !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()),
                "{k}: {s:?} in {line}"
            );
        }
    }
    v.keys().cloned().collect()
}

#[test]
fn progress_json_lines_have_cryptsetups_shape() {
    if !require("cryptsetup") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    std::fs::write(d.join("pass"), "pw").unwrap();
    let (img, pass) = (d.join("img"), d.join("pass"));
    std::fs::File::create(&img)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let (img, pass) = (img.to_str().unwrap(), pass.to_str().unwrap());
    let fast = "--pbkdf pbkdf2 --pbkdf-force-iterations 1000";
    // cryptsetup's own line, from an offline reencryption of an image (no kernel needed).
    sh_ok(&format!(
        "cryptsetup luksFormat -q --type luks2 {fast} -d {pass} {img}"
    ));
    let theirs = sh_ok(&format!(
        "cd {} && cryptsetup reencrypt -q --force-offline-reencrypt --progress-json {fast} -d {pass} img",
        d.display()
    ));
    let their_line = theirs.lines().last().unwrap();
    // ucrypt's, from luksFormat --wipe.
    let out = Command::new(env!("CARGO_BIN_EXE_ucrypt"))
        .current_dir(d)
        .args(["luksFormat", "-q", "--pbkdf", "pbkdf2"])
        .args(["--pbkdf-force-iterations", "1000", "-d", pass, "img"])
        .args(["--wipe", "--progress-json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let ours = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = ours.lines().collect();
    assert!(!lines.is_empty(), "no progress lines");
    for l in &lines {
        assert_eq!(json_keys(l), json_keys(their_line), "{l} vs {their_line}");
    }
    // The last line: all of the data area (the image less the 16 MiB header), no ETA.
    let last: serde_json::Value = serde_json::from_str(lines.last().unwrap()).unwrap();
    assert_eq!(last["device"], "img");
    assert_eq!(last["device_size"], ((64u64 - 16) << 20).to_string());
    assert_eq!(last["device_bytes"], last["device_size"]);
    assert_eq!(last["eta_ms"], "0");
    // Progress goes to a terminal only: none of it on a piped stderr.
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("Wiping"),
        "{out:?}"
    );
    // --progress-frequency alone: cryptsetup's text lines, ending with "Finished".
    let out = Command::new(env!("CARGO_BIN_EXE_ucrypt"))
        .current_dir(d)
        .args(["luksFormat", "-q", "--pbkdf", "pbkdf2"])
        .args(["--pbkdf-force-iterations", "1000", "-d", pass, "img"])
        .args(["--wipe", "--progress-frequency", "1"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("Finished, time ") && last.contains("  48 MiB written, speed "),
        "{text}"
    );
}

/// Sends `cmd; echo rc=$? end<mark>` and waits for `needle`, then presses Ctrl-C and
/// returns the pane once the command ended, and how long that took.
fn interrupt_when(
    t: &Tmux,
    cmd: &str,
    typed: Option<&str>,
    needle: &str,
    mark: &str,
) -> (String, Duration) {
    // The command line shows `e""nd`; only the output shows `end`.
    t.send(&[&format!("{cmd}; echo rc=$? e\"\"nd{mark}"), "Enter"]);
    if let Some(p) = typed {
        t.answer("Enter passphrase", p);
    }
    t.wait(needle, 20);
    let pressed = Instant::now();
    t.send(&["C-c"]);
    let text = t.wait(&format!("end{mark}\n"), 20);
    (text, pressed.elapsed())
}

#[test]
fn ctrl_c_ends_a_tcrypt_search_at_once_and_a_wipe_saying_how_far_it_got() {
    if !require("tmux") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let bin = env!("CARGO_BIN_EXE_ucrypt");
    // Random bytes: no passphrase decrypts them, so the search tries every KDF (a minute).
    let junk = common::image_with(d, "junk", &common::random_bytes(1 << 20));
    let before = std::fs::read(&junk).unwrap();
    let t = Tmux::new("search", &[]);
    let (text, took) = interrupt_when(
        &t,
        &format!("{bin} tcryptDump {}", junk.display()),
        Some("wrong"),
        "Searching TCRYPT",
        "1",
    );
    assert!(
        text.contains("ucrypt: interrupted; nothing was changed"),
        "{text}"
    );
    assert!(text.contains("rc=1 end1"), "{text}");
    // The search drew a bar with its combinations and an ETA, not a spinner.
    let t2 = Tmux::new("searchbar", &[]);
    t2.send(&[&format!("{bin} tcryptDump {}", junk.display()), "Enter"]);
    t2.answer("Enter passphrase", "wrong");
    let bar = t2.wait("KDF x cipher combinations, ETA", 20);
    assert!(bar.contains("Searching TCRYPT/VeraCrypt headers"), "{bar}");
    t2.send(&["C-c"]);
    assert!(took < Duration::from_secs(3), "took {took:?}:\n{text}");
    assert_eq!(std::fs::read(&junk).unwrap(), before, "the image changed");

    // The Argon2 benchmark of a new keyslot writes nothing: Ctrl-C ends it at once and the
    // header keeps its one keyslot.
    if require("cryptsetup") {
        let luks = d.join("luks");
        std::fs::File::create(&luks)
            .unwrap()
            .set_len(20 << 20)
            .unwrap();
        std::fs::write(d.join("pw"), "pw").unwrap();
        let (luks, pw) = (
            luks.display().to_string(),
            d.join("pw").display().to_string(),
        );
        sh_ok(&format!(
            "cryptsetup luksFormat -q --pbkdf pbkdf2 --pbkdf-force-iterations 1000 -d {pw} {luks}"
        ));
        let before = std::fs::read(&luks).unwrap();
        let (text, took) = interrupt_when(
            &t,
            &format!("{bin} luksAddKey {luks} {pw} -d {pw}"),
            None,
            "Benchmarking the PBKDF",
            "0",
        );
        assert!(
            text.contains("ucrypt: interrupted; nothing was changed"),
            "{text}"
        );
        assert!(text.contains("rc=1 end0"), "{text}");
        assert!(took < Duration::from_secs(3), "took {took:?}:\n{text}");
        assert!(
            std::fs::read(&luks).unwrap() == before,
            "the header changed"
        );
    }

    // A wipe: the bar is drawn, Ctrl-C stops it at a block boundary with how far it got.
    let img = d.join("big");
    // Sparse; only what is wiped before Ctrl-C takes disk space.
    std::fs::File::create(&img)
        .unwrap()
        .set_len(16 << 30)
        .unwrap();
    std::fs::write(d.join("pass"), "pw").unwrap();
    let (text, took) = interrupt_when(
        &t,
        &format!(
            "{bin} luksFormat -q --pbkdf pbkdf2 --pbkdf-force-iterations 1000 -d {} {} --wipe",
            d.join("pass").display(),
            img.display()
        ),
        None,
        "Wiping",
        "2",
    );
    assert!(text.contains("rc=1 end2"), "{text}");
    assert!(took < Duration::from_secs(5), "took {took:?}:\n{text}");
    let line = text
        .lines()
        .find(|l| l.contains("wipe interrupted after"))
        .unwrap_or_else(|| panic!("no report:\n{text}"));
    let done: u64 = line
        .split("after ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(done > 0 && done % (4 << 20) == 0, "{line}");
    assert!(
        text.replace('\n', "").contains(&format!(
            "finish with: ucrypt wipe {} --offset {done}",
            img.display()
        )),
        "{text}"
    );
    // The header is intact: the volume opens.
    let out = Command::new(bin)
        .args(["luksOpen", img.to_str().unwrap(), "--test-passphrase", "-d"])
        .arg(d.join("pass"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn an_interrupted_wipe_is_finished_by_wipe_offset() {
    if !require("cryptsetup") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    // Old data that is not zeros, then a LUKS2 header over it (16 MiB header area).
    let img = common::image_with(d, "img", &common::random_bytes(48 << 20));
    std::fs::write(d.join("pass"), "pw").unwrap();
    let (img, pass) = (img.to_str().unwrap(), d.join("pass"));
    let pass = pass.to_str().unwrap();
    sh_ok(&format!(
        "cryptsetup luksFormat -q --pbkdf pbkdf2 --pbkdf-force-iterations 1000 -d {pass} {img}"
    ));
    let bin = env!("CARGO_BIN_EXE_ucrypt");
    let uc = |args: &[&str]| Command::new(bin).args(args).output().unwrap();
    // Offsets that are not what a wipe reports are refused before anything is written.
    for bad in ["1000", "999999999999"] {
        let out = uc(&["wipe", "-q", "-d", pass, img, "--offset", bad]);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
    }
    let offset = 16u64 << 20;
    let out = uc(&[
        "wipe",
        "-q",
        "-d",
        pass,
        img,
        "--offset",
        &offset.to_string(),
        "--progress-json",
    ]);
    assert!(out.status.success(), "{out:?}");
    let first: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().next().unwrap()).unwrap();
    let done: u64 = first["device_bytes"].as_str().unwrap().parse().unwrap();
    assert!(done > offset, "{first}");
    // The plaintext: before the offset what the old bytes decrypt to, from it on zeros.
    let table = uc(&["luksOpen", img, "--print-table", "--showkeys", "-d", pass]);
    assert!(table.status.success(), "{table:?}");
    let tf = d.join("table");
    std::fs::write(&tf, &table.stdout).unwrap();
    let read = |off: u64, len: u64| {
        let out = uc(&[
            "read",
            "--table-file",
            tf.to_str().unwrap(),
            "--offset",
            &off.to_string(),
            "--length",
            &len.to_string(),
        ]);
        assert!(out.status.success(), "{out:?}");
        out.stdout
    };
    let before = read(0, offset);
    assert!(
        before.iter().any(|&b| b != 0),
        "bytes before the offset were wiped"
    );
    let after = read(offset, (32 << 20) - offset);
    assert_eq!(after.len() as u64, (32 << 20) - offset);
    assert!(
        after.iter().all(|&b| b == 0),
        "bytes after the offset are not zeros"
    );
}

/// `--timeout`/`-t`: a passphrase prompt nobody answers ends after that many seconds with
/// exit 1, as cryptsetup's does, in a real terminal.
#[test]
fn an_unanswered_prompt_times_out_as_cryptsetups() {
    if !require("tmux") || !require("cryptsetup") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let img = d.join("img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(20 << 20)
        .unwrap();
    std::fs::write(d.join("pw"), "pw").unwrap();
    sh_ok(&format!(
        "cryptsetup luksFormat -q --pbkdf pbkdf2 --pbkdf-force-iterations 1000 -d {} {}",
        d.join("pw").display(),
        img.display()
    ));
    let t = Tmux::new("timeout", &[]);
    let bin = env!("CARGO_BIN_EXE_ucrypt");
    // The pane's shell has a minimal PATH: cryptsetup by its full path.
    let cs = sh_ok("command -v cryptsetup");
    for (prog, mark) in [(bin, "u"), (cs.trim(), "c")] {
        let started = Instant::now();
        t.send(&[
            &format!(
                "{prog} -t 1 open --test-passphrase {}; echo rc=$? e\"\"nd{mark}",
                img.display()
            ),
            "Enter",
        ]);
        let text = t.wait(&format!("end{mark}\n"), 20);
        assert!(text.contains(&format!("rc=1 end{mark}")), "{prog}:\n{text}");
        assert!(
            started.elapsed() >= Duration::from_millis(900),
            "{prog} did not wait"
        );
    }
    assert!(
        t.pane()
            .contains("no passphrase typed within --timeout 1 s"),
        "{}",
        t.pane()
    );
}

/// Ctrl-C (in a real terminal) and SIGTERM during the final keyslot derivation and write
/// end the command at once: the header area is put back as it was (the image's bytes are
/// unchanged), exit 1 saying so. A PBKDF2 keyslot of 30 million iterations derives for
/// several seconds.
#[test]
fn a_signal_during_a_keyslot_write_exits_at_once_with_the_header_unchanged() {
    if !require("tmux") || !require("cryptsetup") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let bin = env!("CARGO_BIN_EXE_ucrypt");
    // Old bytes that are not zeros, then a LUKS2 header over them.
    let img = common::image_with(d, "img", &common::random_bytes(24 << 20));
    std::fs::write(d.join("pw"), "pw").unwrap();
    std::fs::write(d.join("new"), "new").unwrap();
    let (img, pw, new) = (
        img.display().to_string(),
        d.join("pw").display().to_string(),
        d.join("new").display().to_string(),
    );
    let raw = std::fs::read(&img).unwrap();
    sh_ok(&format!(
        "cryptsetup luksFormat -q --pbkdf pbkdf2 --pbkdf-force-iterations 1000 -d {pw} {img}"
    ));
    let before = std::fs::read(&img).unwrap();
    let slow = "--pbkdf pbkdf2 --pbkdf-force-iterations 30000000";
    let t = Tmux::new("keyslot", &[]);
    let (text, took) = interrupt_when(
        &t,
        &format!("{bin} luksAddKey -q {img} {new} -d {pw} {slow}"),
        None,
        "Adding the keyslot",
        "0",
    );
    assert!(text.contains("rc=1 end0"), "{text}");
    assert!(
        text.contains("ucrypt: interrupted; the header was put back as it was before"),
        "{text}"
    );
    assert!(took < Duration::from_secs(2), "took {took:?}:\n{text}");
    assert!(std::fs::read(&img).unwrap() == before, "the header changed");

    // SIGTERM, without a terminal: luksChangeKey, luksConvertKey, and luksFormat over a
    // volume (its old header and data come back).
    let cases = [
        format!("luksChangeKey -q {img} {new} -d {pw} {slow}"),
        format!("luksConvertKey -q {img} -d {pw} {slow}"),
        format!("luksFormat -q {img} {new} {slow}"),
    ];
    for args in &cases {
        let mut child = Command::new(bin)
            .args(args.split(' '))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        let sent = Instant::now();
        // SAFETY: kill(2) on the child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let out = {
            let status = child.wait().unwrap();
            let took = sent.elapsed();
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            (status, took, err)
        };
        assert_eq!(out.0.code(), Some(1), "{args}: {out:?}");
        assert!(out.1 < Duration::from_secs(2), "{args}: took {:?}", out.1);
        assert!(
            out.2.contains("the header was put back"),
            "{args}: {}",
            out.2
        );
        assert!(
            std::fs::read(&img).unwrap() == before,
            "{args}: the header changed"
        );
    }
    // The data area was never the header's: luksFormat left the old bytes after 16 MiB.
    assert_eq!(
        std::fs::read(&img).unwrap()[16 << 20..],
        raw[16 << 20..],
        "the data area changed"
    );
}

/// `--progress-json` during a TCRYPT header search: cryptsetup's line shape, counting KDF x
/// cipher combinations (device_bytes of device_size), increasing, the last one complete when
/// nothing decrypts.
#[test]
fn a_tcrypt_search_prints_progress_json_lines() {
    let tmp = tempfile::tempdir().unwrap();
    let junk = common::image_with(tmp.path(), "junk", &common::random_bytes(1 << 20));
    let mut child = Command::new(env!("CARGO_BIN_EXE_ucrypt"))
        .args(["tcryptDump", junk.to_str().unwrap(), "--progress-json"])
        .args(["--hash", "sha512"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), b"wrong\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| {
            let mut keys = json_keys(l);
            keys.sort();
            assert_eq!(
                keys,
                [
                    "device",
                    "device_bytes",
                    "device_size",
                    "eta_ms",
                    "speed",
                    "time_ms"
                ],
                "{l}"
            );
            // In cryptsetup's order.
            assert!(
                l.starts_with("{\"device\":") && l.contains("\"eta_ms\":\"") && l.ends_with("\"}"),
                "{l}"
            );
            serde_json::from_str(l).unwrap()
        })
        .collect();
    assert!(lines.len() >= 2, "{text}");
    let n = |v: &serde_json::Value, k: &str| v[k].as_str().unwrap().parse::<u64>().unwrap();
    for w in lines.windows(2) {
        assert!(
            n(&w[0], "device_bytes") < n(&w[1], "device_bytes"),
            "{text}"
        );
    }
    let last = lines.last().unwrap();
    assert_eq!(n(last, "device_bytes"), n(last, "device_size"), "{text}");
    assert!(n(last, "device_size") > 0);
    // No bar on a piped stderr.
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("Searching"),
        "{out:?}"
    );
}

/// `-q` switches off the second "Verify passphrase" prompt of a new passphrase and `-y`
/// asks every passphrase twice, as cryptsetup's `verify_passphrase`, in a real terminal;
/// cryptsetup beside ucrypt for `luksFormat -q`.
#[test]
fn batch_mode_and_verify_passphrase_decide_the_second_prompt() {
    if !require("tmux") || !require("cryptsetup") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let bin = env!("CARGO_BIN_EXE_ucrypt");
    let cs = sh_ok("command -v cryptsetup");
    let t = Tmux::new("verify", &[]);
    let fast = "--pbkdf pbkdf2 --pbkdf-force-iterations 1000";
    for (i, prog) in [bin, cs.trim()].iter().enumerate() {
        let img = d.join(format!("img{i}"));
        std::fs::File::create(&img)
            .unwrap()
            .set_len(20 << 20)
            .unwrap();
        let mark = format!("q{i}");
        // The previous command's prompt must be gone before this one's is waited for.
        t.clear("Enter passphrase");
        t.send(&[
            &format!(
                "{prog} luksFormat -q {fast} {}; echo rc=$? e\"\"nd{mark}",
                img.display()
            ),
            "Enter",
        ]);
        t.answer("Enter passphrase", "pw");
        let text = t.wait(&format!("end{mark}\n"), 20);
        assert!(text.contains(&format!("rc=0 end{mark}")), "{prog}:\n{text}");
        assert!(!text.contains("Verify passphrase"), "{prog}:\n{text}");
    }
    // -y: the existing passphrase is asked twice too.
    t.clear("Enter passphrase");
    t.send(&[
        &format!(
            "{bin} -y open --test-passphrase {}; echo rc=$? e\"\"ndy",
            d.join("img0").display()
        ),
        "Enter",
    ]);
    t.answer("Enter passphrase", "pw");
    t.answer("Verify passphrase", "pw");
    let text = t.wait("endy\n", 20);
    assert!(text.contains("rc=0 endy"), "{text}");
}
