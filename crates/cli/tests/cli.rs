//! The offline commands as a user meets them: errors, bounds, keys kept out of output.

#![allow(clippy::unwrap_used)]

mod common;
use common::*;

const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f";

fn table(img: &std::path::Path, rest: &str) -> String {
    format!(
        "0 64 crypt aes-xts-plain64 {KEY} 0 {} 8{rest}",
        img.display()
    )
}

#[test]
fn round_trip_and_nothing_outside_the_mapping_changes() {
    let tmp = tempfile::tempdir().unwrap();
    // 8 sectors before, 64 mapped, 8 after, all 0xee.
    let img = tmp.path().join("d.img");
    std::fs::write(&img, vec![0xeeu8; 80 * 512]).unwrap();
    let t = table(&img, "");
    let data: Vec<u8> = (0..64 * 512).map(|i| (i * 7 % 251) as u8).collect();
    ok(ucrypt(&["write", "--table", &t], &data));
    let disk = std::fs::read(&img).unwrap();
    assert!(disk[..8 * 512]
        .iter()
        .chain(&disk[72 * 512..])
        .all(|&b| b == 0xee));
    assert_ne!(&disk[8 * 512..72 * 512], &data[..]);
    assert_eq!(ok(ucrypt(&["read", "--table", &t], b"")), data);
}

#[test]
fn writing_past_the_end_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let img = image(tmp.path(), "d.img", 80 * 512);
    let t = table(&img, "");
    let out = ucrypt(&["write", "--table", &t, "--offset", "32000"], &[1u8; 1000]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("longer than the mapping"));
    let input = tmp.path().join("in.bin");
    std::fs::write(&input, vec![1u8; 64 * 512 + 1]).unwrap();
    let before = std::fs::read(&img).unwrap();
    let out = ucrypt(
        &["write", "--table", &t, "--input", input.to_str().unwrap()],
        b"",
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing written"));
    assert_eq!(std::fs::read(&img).unwrap(), before);
    let out = ucrypt(
        &[
            "read", "--table", &t, "--offset", "32000", "--length", "1000",
        ],
        b"",
    );
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn missing_device_exits_4_and_small_device_exits_4() {
    let tmp = tempfile::tempdir().unwrap();
    let out = ucrypt(
        &["read", "--table", &table(&tmp.path().join("nope"), "")],
        b"",
    );
    assert_eq!(out.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope"));
    let img = image(tmp.path(), "small.img", 4096);
    let out = ucrypt(&["read", "--table", &table(&img, "")], b"");
    assert_eq!(out.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not fit"));
}

#[test]
fn errors_never_show_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    for t in [
        table(&tmp.path().join("nope"), ""),
        table(&tmp.path().join("nope"), " 1 frobnicate"),
        format!("0 63 crypt aes-xts-plain64 {KEY} 0 x 0 1 sector_size:4096"),
        format!("0 64 crypt aes-cbc-plain64 {KEY}0 0 x 0"),
    ] {
        let out = ucrypt(&["read", "--table", &t], b"");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(!err.contains(&KEY[..16]), "key leaked: {err}");
    }
}

#[test]
fn table_command_prints_canonically_and_hides_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let t = table(
        &tmp.path().join("x"),
        " 3 iv_large_sectors allow_discards sector_size:4096",
    );
    let out = String::from_utf8(ok(ucrypt(&["table", "--table", &t], b""))).unwrap();
    assert!(
        out.ends_with(" 8 3 allow_discards sector_size:4096 iv_large_sectors\n"),
        "{out}"
    );
    assert!(!out.contains(KEY));
    let out = String::from_utf8(ok(ucrypt(&["table", "--showkeys", "--table", &t], b""))).unwrap();
    assert!(out.contains(KEY));
}

#[test]
fn table_file_keeps_the_key_off_the_command_line() {
    let tmp = tempfile::tempdir().unwrap();
    let img = image(tmp.path(), "d.img", 80 * 512);
    let tf = tmp.path().join("table");
    std::fs::write(&tf, format!("# comment\n{}\n", table(&img, ""))).unwrap();
    ok(ucrypt(
        &["write", "--table-file", tf.to_str().unwrap()],
        b"hello",
    ));
    let out = ok(ucrypt(
        &["read", "--table", &table(&img, ""), "--length", "5"],
        b"",
    ));
    assert_eq!(out, b"hello");
}

#[test]
fn large_sectors_need_the_flag_and_warn() {
    let tmp = tempfile::tempdir().unwrap();
    let img = image(tmp.path(), "d.img", 1 << 20);
    let t = format!(
        "0 1024 crypt aes-xts-plain64 {KEY} 0 {} 0 1 sector_size:65536",
        img.display()
    );
    let out = ucrypt(&["write", "--table", &t], b"x");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--large-sectors"));
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    let out = ucrypt(
        &[
            "write",
            "--large-sectors",
            "--table",
            &t,
            "--offset",
            "1000",
        ],
        &data,
    );
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot open this volume"));
    let out = ok(ucrypt(
        &[
            "read",
            "--large-sectors",
            "--table",
            &t,
            "--offset",
            "1000",
            "--length",
            "200000",
        ],
        b"",
    ));
    assert_eq!(out, data);
}

#[test]
fn keyring_user_key_works_like_the_hex_key() {
    if !require("keyctl") {
        return;
    }
    let desc = format!("ucrypt-test-{}", std::process::id());
    let key = hex::decode(KEY).unwrap();
    let mut child = std::process::Command::new("keyctl")
        .args(["padd", "user", &desc, "@u"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), &key).unwrap();
    drop(child.stdin.take());
    let id = String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let img = image(tmp.path(), "d.img", 80 * 512);
    let kt = format!(
        "0 64 crypt aes-xts-plain64 :64:user:{desc} 0 {} 8",
        img.display()
    );
    ok(ucrypt(&["write", "--table", &kt], b"via keyring"));
    let out = ok(ucrypt(
        &["read", "--table", &table(&img, ""), "--length", "11"],
        b"",
    ));
    assert_eq!(out, b"via keyring");
    let wrong = format!(
        "0 64 crypt aes-xts-plain64 :32:user:{desc} 0 {} 8",
        img.display()
    );
    let out = ucrypt(&["read", "--table", &wrong], b"");
    assert!(String::from_utf8_lossy(&out.stderr).contains("is 64 bytes, the table says 32"));
    let _ = std::process::Command::new("keyctl")
        .args(["unlink", id.trim(), "@u"])
        .output();
}

#[test]
fn bench_emits_json_rows_with_the_required_fields_and_a_chart() {
    let tmp = tempfile::tempdir().unwrap();
    let chart = tmp.path().join("c.svg");
    let out = ok(ucrypt(
        &[
            "bench",
            "cloudflare",
            "sector-size",
            "--seconds",
            "0.01",
            "--repeat",
            "1",
            "--region-mib",
            "8",
            "--json",
            "--chart",
            chart.to_str().unwrap(),
        ],
        b"",
    ));
    let rows = json_lines(out);
    // cloudflare: 8 cells x (raw + 3 variants); sector-size: 6 cells x (raw + 2).
    assert_eq!(rows.len(), 8 * 4 + 6 * 3);
    for r in &rows {
        for k in [
            "experiment",
            "variant",
            "op",
            "block_size",
            "iodepth",
            "mib_s",
            "iops",
            "ratio_to_raw",
        ] {
            assert!(r.get(k).is_some(), "missing {k} in {r}");
        }
        assert!(r["mib_s"].as_f64().unwrap() > 0.0, "{r}");
        if r["variant"] == "raw" {
            assert_eq!(r["ratio_to_raw"].as_f64().unwrap(), 1.0);
        }
    }
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("cloudflare") && svg.contains("sector-size"));
    // Run parameters and date on the chart; a variant keeps its colour in both panels.
    assert!(svg.contains("0.01 s per measurement, 1 repeats") && svg.contains(" UTC |"));
    let fills = |variant: &str| -> std::collections::BTreeSet<String> {
        svg.lines()
            .filter(|l| l.starts_with("<rect x") && l.contains(&format!("<title>{variant}:")))
            .map(|l| {
                l.split("fill=\"")
                    .nth(1)
                    .unwrap()
                    .split('"')
                    .next()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    for v in ["raw", "auto"] {
        assert_eq!(fills(v).len(), 1, "{v}: {:?}", fills(v));
    }
    assert_ne!(fills("raw"), fills("auto"));
}

#[test]
fn benchmark_chart_has_both_directions_error_bars_and_the_run_parameters() {
    let tmp = tempfile::tempdir().unwrap();
    let chart = tmp.path().join("b.svg");
    ok(ucrypt(
        &[
            "benchmark",
            "--cipher",
            "aes-xts-plain64",
            "--key-size",
            "256",
            "--seconds",
            "0.05",
            "--chart",
            chart.to_str().unwrap(),
        ],
        b"",
    ));
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(
        svg.contains(">Encryption<") && svg.contains(">Decryption<"),
        "{svg}"
    );
    assert!(
        svg.contains("sector size 4096") && svg.contains(" UTC |"),
        "{svg}"
    );
    // ucrypt's bar and the aes crate's beside it, in each panel, each with its title.
    assert_eq!(
        svg.matches("<title>ucrypt: aes-xts-plain64 256b").count(),
        2,
        "{svg}"
    );
    assert_eq!(svg.matches("<title>aes crate XTS: ").count(), 2, "{svg}");
}

/// No unauthenticated plaintext on a TCP port, loopback included: `--listen` without
/// `--tls=require` is refused (exit 1, naming the way out) unless `--allow-cleartext-tcp`
/// (old spelling `--allow-cleartext-network`) says the user means it, which warns.
#[test]
fn cleartext_tcp_needs_tls_or_an_explicit_flag_and_warns() {
    let tmp = tempfile::tempdir().unwrap();
    let img = image(tmp.path(), "d.img", 80 * 512);
    let t = table(&img, "");
    let open = |addr: &str, extra: &[&str]| {
        let mut args = vec!["open", "--table", &t, "--listen", addr, "--run", "true"];
        args.extend_from_slice(extra);
        ucrypt(&args, b"")
    };
    for (addr, reach) in [
        ("127.0.0.1:0", "every local user"),
        ("0", "every local user"),
        ("0.0.0.0:0", "other machines"),
    ] {
        let out = open(addr, &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{addr}: {err}");
        assert!(
            err.contains("no authentication")
                && err.contains(reach)
                && err.contains("--allow-cleartext-tcp"),
            "{addr}: {err}"
        );
        for flag in ["--allow-cleartext-tcp", "--allow-cleartext-network"] {
            let out = open(addr, &[flag]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{addr} {flag}: {err}");
            assert!(
                err.contains("warning: serving decrypted data without authentication")
                    && err.contains(reach),
                "{addr} {flag}: {err}"
            );
        }
    }
}

/// Without `--socket`/`--listen` the foreground server is on a private unix socket: 0600,
/// in a fresh 0700 directory of the caller's, removed at exit; nothing on a TCP port.
#[test]
fn open_without_socket_or_listen_serves_a_private_unix_socket() {
    use std::io::BufRead;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let tmp = tempfile::tempdir().unwrap();
    let img = image(tmp.path(), "d.img", 80 * 512);
    let t = table(&img, "");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ucrypt"))
        .args(["open", "--table", &t])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let sock = std::path::PathBuf::from(
        line.trim()
            .strip_prefix("nbd+unix:///?socket=")
            .unwrap_or_else(|| panic!("not a unix socket URI: {line}")),
    );
    let sock_meta = std::fs::symlink_metadata(&sock).unwrap();
    let dir = sock.parent().unwrap().to_path_buf();
    let dir_meta = std::fs::metadata(&dir).unwrap();
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    assert_eq!(sock_meta.permissions().mode() & 0o777, 0o600, "{sock:?}");
    assert_eq!(dir_meta.permissions().mode() & 0o777, 0o700, "{dir:?}");
    assert_eq!((sock_meta.uid(), dir_meta.uid()), (me, me));
    // The socket serves: a client gets the volume's size.
    if common::nbd::require("nbdinfo") {
        let out = std::process::Command::new("nbdinfo")
            .args(["--size", line.trim()])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "32768");
    }
    // SAFETY: kill(2) on our own child, not yet reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
    assert!(!dir.exists(), "the private directory is removed at exit");
}

#[test]
fn a_foreign_sigbus_does_not_switch_off_truncation_containment() {
    // Issue 18: after one SIGBUS sent by another process, the mapped-read containment
    // used to switch itself off (the previous action, Rust's runtime handler, reset SIGBUS
    // to the default), and truncating the served image then killed the server.
    use common::nbd::*;
    if !require("nbdcopy") || !require("nbdinfo") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("d.img");
    std::fs::write(&img, random_bytes(8 << 20)).unwrap();
    let (_, table_file) = xts_table(tmp.path(), &img, 4096, &[]);
    let mut served = Served::start(&table_file, &[]);
    let copy = |what: &str| sh(&format!("nbdcopy '{}' {what}", served.uri));
    let out = copy("null:");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pid = libc::pid_t::try_from(served.child.id()).unwrap();
    for _ in 0..3 {
        // SAFETY: kill(2) on our own live child.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGBUS) }, 0);
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        served.child.try_wait().unwrap().is_none(),
        "a SIGBUS sent with kill is not a fault: the server keeps serving"
    );
    std::fs::OpenOptions::new()
        .write(true)
        .open(&img)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    // Reads past the new end fail (EIO replies), and must not kill the server.
    let out = copy("null:");
    assert!(
        !out.status.success(),
        "reads past the truncated end cannot succeed"
    );
    assert!(
        served.child.try_wait().unwrap().is_none(),
        "the server died on the truncation (SIGBUS) after a foreign SIGBUS"
    );
    let info = sh(&format!("nbdinfo --size '{}'", served.uri));
    assert!(info.status.success(), "still serving: {info:?}");
    assert!(served.stop().success());
}

/// cryptsetup's exit codes for usage: 1 for a wrong command line (clap's default is 2,
/// which cryptsetup uses for a wrong passphrase), 0 for --help and --version.
#[test]
fn usage_errors_exit_1_and_help_exits_0_as_cryptsetups() {
    for args in [
        &["frobnicate"][..],
        &["open", "--no-such-option", "x"][..],
        &["luksDump"][..],
    ] {
        let out = ucrypt(args, b"");
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        assert!(!out.stderr.is_empty(), "{args:?}: no message");
    }
    for args in [&["--help"][..], &["--version"][..], &["open", "--help"][..]] {
        let out = ucrypt(args, b"");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
        assert!(!out.stdout.is_empty(), "{args:?}: nothing printed");
    }
}

/// `--readonly` and `-r` (cryptsetup's spellings) mean `--read-only`: the instance is
/// read-only in `status`.
#[test]
fn readonly_and_r_are_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "img", 1 << 20);
    let t = table(&img, "");
    let run = dir.path().join("run");
    let env = [("UCRYPT_RUNTIME_DIR", run.as_os_str())];
    for (i, flag) in ["--readonly", "-r", "--read-only"].iter().enumerate() {
        let name = format!("ro{i}");
        let out = ucrypt_env(
            &["open", "--table", &t, &name, flag, "--device", "none"],
            b"",
            &env,
        );
        assert_eq!(out.status.code(), Some(0), "{flag}: {out:?}");
        let st = ucrypt_env(&["status", &name, "--json"], b"", &env);
        let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
        let closed = ucrypt_env(&["close", &name], b"", &env);
        assert_eq!(closed.status.code(), Some(0), "{closed:?}");
        assert_eq!(v["read_only"], serde_json::Value::Bool(true), "{flag}: {v}");
    }
}

/// libcryptsetup failures read as one plain line: the library's message, no errno
/// numbers, the device named once.
#[test]
fn header_errors_carry_no_errno_clutter() {
    let out = ucrypt(&["luksDump", "/nonexistent/ucrypt-test"], b"");
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("errno"), "{err}");
    assert_eq!(err.matches("/nonexistent/ucrypt-test").count(), 1, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// `--version` names the build (commit), the libcryptsetup it links and the CPU paths.
#[test]
fn long_version_names_commit_libcryptsetup_and_crypto_paths() {
    let out = ucrypt(&["--version"], b"");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("ucrypt "), "{text}");
    for needle in ["(commit ", "libcryptsetup ", "crypto paths on this CPU: "] {
        assert!(text.contains(needle), "no {needle:?} in {text}");
    }
    assert!(!text.contains("libcryptsetup unknown"), "{text}");
}

/// Man pages and completions come from the command-line definition: one page per command
/// plus ucrypt.1, each a page `man` renders; bash accepts the completion script.
#[test]
fn man_pages_and_completions_are_generated_for_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let out = ucrypt(&["man", dir.path().to_str().unwrap()], b"");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let help = String::from_utf8_lossy(&ucrypt(&["--help"], b"").stdout).to_string();
    // The commands are listed under several headings, before the options.
    let commands: Vec<&str> = help
        .split("\nOptions:")
        .next()
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.len() > 20, "{commands:?}");
    for c in &commands {
        let page = dir.path().join(format!("ucrypt-{c}.1"));
        let text = std::fs::read_to_string(&page).unwrap_or_else(|e| panic!("{c}: {e}"));
        assert!(
            text.starts_with(".ie") || text.contains(".TH"),
            "{c}: {text:.200}"
        );
        // roff escapes every hyphen, also those inside a command's name (udev-name).
        let name = format!("ucrypt-{c}").replace('-', "\\-");
        assert!(text.contains(&name), "{c}: no NAME {name}");
    }
    let main = std::fs::read_to_string(dir.path().join("ucrypt.1")).unwrap();
    assert!(main.contains(".TH ucrypt 1"), "{main:.300}");
    if std::path::Path::new("/usr/bin/man").exists() {
        let rendered = std::process::Command::new("man")
            .arg("-l")
            .arg(dir.path().join("ucrypt-open.1"))
            .env("MANPAGER", "cat")
            .env("MANWIDTH", "100")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&rendered.stdout);
        assert!(text.contains("--key-file"), "{text:.500}");
    }
    for shell in ["bash", "zsh", "fish"] {
        let out = ucrypt(&["completions", shell], b"");
        assert_eq!(out.status.code(), Some(0), "{shell}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("luksFormat"),
            "{shell}"
        );
    }
    let script = dir.path().join("ucrypt.bash");
    std::fs::write(&script, ucrypt(&["completions", "bash"], b"").stdout).unwrap();
    let check = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("source {} && complete -p ucrypt", script.display()))
        .output()
        .unwrap();
    assert!(check.status.success(), "{check:?}");
    assert!(String::from_utf8_lossy(&check.stdout).contains("ucrypt"));
    // Not `unknown shell`: a clear usage error, exit 1.
    assert_eq!(ucrypt(&["completions", "tcsh"], b"").status.code(), Some(1));
}

/// SIGTERM to `open --run` reaches everything the command started (its process group),
/// and ucrypt waits for it and exits with its status, promptly.
#[test]
fn sigterm_to_open_run_stops_the_command_and_what_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "img", 1 << 20);
    let table = dir.path().join("t");
    std::fs::write(&table, self::table(&img, "")).unwrap();
    let pidfile = dir.path().join("grandchild");
    let run = format!("sleep 60 & echo $! > {}; wait", pidfile.display());
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ucrypt"))
        .args([
            "open",
            "--table-file",
            table.to_str().unwrap(),
            "--run",
            &run,
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let grandchild: i32 = loop {
        if let Some(p) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            break p;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the command did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let pid = i32::try_from(child.id()).unwrap();
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let t = std::time::Instant::now();
    let status = child.wait().unwrap();
    assert!(
        t.elapsed() < std::time::Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(status.code(), Some(143), "{status:?}");
    std::thread::sleep(std::time::Duration::from_millis(100));
    // Gone, or a zombie waiting for init to reap it (killed, not running on).
    let state = std::fs::read_to_string(format!("/proc/{grandchild}/stat")).unwrap_or_default();
    let running = state
        .rsplit(')')
        .next()
        .and_then(|rest| rest.split_whitespace().next())
        .is_some_and(|s| s != "Z" && s != "X");
    assert!(
        !running,
        "the command's own child {grandchild} outlived ucrypt: {state}"
    );
}

/// `ucrypt status NAME | head -3`: once the reader has gone, the next print ends ucrypt
/// as it ends cryptsetup, by SIGPIPE and silently, not with a panic and a backtrace.
#[test]
fn a_closed_stdout_ends_the_command_by_sigpipe_without_a_panic() {
    use std::os::unix::process::ExitStatusExt;
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ucrypt"))
        .arg("--usage")
        .stdin(std::process::Stdio::null())
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{}: {stderr}",
        out.status
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn bench_integrity_compares_each_authenticated_mode_with_plain() {
    let out = ok(ucrypt(
        &[
            "bench",
            "integrity",
            "--quick",
            "--seconds",
            "0.01",
            "--repeat",
            "1",
            "--region-mib",
            "8",
            "--json",
        ],
        b"",
    ));
    let rows = json_lines(out);
    // --quick: 4 cells (4k and 1M, read and write) x (raw + plain + 3 AEADs x J/D).
    assert_eq!(rows.len(), 4 * 8);
    let variants: std::collections::BTreeSet<&str> = rows
        .iter()
        .map(|r| r["variant"].as_str().unwrap())
        .collect();
    for v in [
        "raw",
        "plain",
        "hmac-sha256 J",
        "aes-gcm D",
        "chacha20-poly1305 J",
    ] {
        assert!(variants.contains(v), "no {v} in {variants:?}");
    }
    for r in &rows {
        assert_eq!(r["experiment"], "integrity");
        assert!(r["mib_s"].as_f64().unwrap() > 0.0, "{r}");
        let base = r["ratio_to_base"].as_f64().unwrap();
        if r["variant"] == "plain" {
            assert_eq!(base, 1.0, "{r}");
        } else {
            assert!(base > 0.0, "{r}");
        }
    }
}

/// One JSON value per line of a command's output.
fn json_lines(out: Vec<u8>) -> Vec<serde_json::Value> {
    String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}
