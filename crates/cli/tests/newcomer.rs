//! What a newcomer meets first: `ucrypt demo` (the README's main job), the order and
//! groups of `--help`, the values and live instance names completions offer, and the texts
//! of the prompts a cryptsetup user reads.

#![allow(clippy::unwrap_used)]

mod common;
use common::*;

#[test]
fn demo_opens_writes_reads_and_closes_a_volume() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let dir = tmp.path().join("demo");
    let out = ucrypt_env(
        &["demo", "--dir", dir.to_str().unwrap()],
        b"",
        &[("UCRYPT_RUNTIME_DIR", run.as_os_str())],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for shown in [
        "$ ucrypt luksFormat",
        "$ ucrypt open",
        "$ mke2fs -q -t ext4 -E root_owner -F ",
        "$ debugfs -w -R 'write hello.txt hello.txt' ",
        "wrote and read back hello.txt: Hello from ucrypt",
        "does not contain the text",
        "$ ucrypt status",
        "front end:",
        "$ ucrypt close",
        "The binary is ",
        "ucrypt open ",
    ] {
        assert!(stdout.contains(shown), "no {shown:?} in:\n{stdout}");
    }
    let secs: f64 = stdout
        .split("Done in ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|t| t.parse().ok())
        .unwrap();
    // About 1 s on an idle 2-core machine; the bound leaves room for a loaded one.
    assert!(secs < 20.0, "the demo took {secs} s");
    // The file system stays on the image: dm-crypt's view of it (ucrypt read) holds ext4
    // with hello.txt.
    let key = dir.join("passphrase");
    let table = String::from_utf8(ok(ucrypt(
        &[
            "luksOpen",
            "--print-table",
            "--showkeys",
            "-d",
            key.to_str().unwrap(),
            dir.join("disk.img").to_str().unwrap(),
        ],
        b"",
    )))
    .unwrap();
    let plain = tmp.path().join("plain.img");
    let tf = tmp.path().join("table");
    std::fs::write(&tf, table).unwrap();
    ok(ucrypt(
        &[
            "read",
            "--table-file",
            tf.to_str().unwrap(),
            "--output",
            plain.to_str().unwrap(),
        ],
        b"",
    ));
    let listed = std::process::Command::new("/sbin/debugfs")
        .args(["-R", "cat hello.txt"])
        .arg(&plain)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&listed.stdout).starts_with("Hello from ucrypt"),
        "{listed:?}"
    );
    // The image is a LUKS2 volume that stays for the next commands; the instance is gone.
    assert!(dir.join("disk.img").exists());
    ok(ucrypt(
        &[
            "isLuks",
            "--type",
            "luks2",
            dir.join("disk.img").to_str().unwrap(),
        ],
        b"",
    ));
    let left: Vec<_> = std::fs::read_dir(&run)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| !n.to_string_lossy().starts_with('.'))
        .collect();
    assert!(left.is_empty(), "instances left behind: {left:?}");
}

#[test]
fn demo_without_a_node_writes_a_sector_and_says_why() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let dir = tmp.path().join("demo");
    let out = ucrypt_env(
        &["demo", "--device", "none", "--dir", dir.to_str().unwrap()],
        b"",
        &[("UCRYPT_RUNTIME_DIR", run.as_os_str())],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    for shown in [
        "(no file system: the front end gives no node, only an NBD socket)",
        "wrote and read back: Hello from ucrypt",
        "mkfs.ext4 -q -E root_owner NODE",
        "The binary is ",
    ] {
        assert!(stdout.contains(shown), "no {shown:?} in:\n{stdout}");
    }
    assert!(!stdout.contains("$ mke2fs"), "{stdout}");
}

/// The command names of `ucrypt --help`, by heading, in order.
fn help_groups() -> Vec<(String, Vec<String>)> {
    let out = ok(ucrypt(&["--help"], b""));
    let text = String::from_utf8(out).unwrap();
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for line in text.lines() {
        if line == "Options:" {
            break;
        }
        if !line.starts_with(' ') && line.ends_with(':') && !line.starts_with("Usage") {
            groups.push((line.trim_end_matches(':').to_string(), Vec::new()));
        } else if let (Some((_, names)), Some(name)) = (groups.last_mut(), line.strip_prefix("  "))
        {
            if !name.starts_with(' ') {
                names.push(name.split_whitespace().next().unwrap().to_string());
            }
        }
    }
    groups
}

#[test]
fn help_lists_commands_grouped_as_cryptsetup_with_open_close_status_first() {
    let groups = help_groups();
    let headings: Vec<&str> = groups.iter().map(|(h, _)| h.as_str()).collect();
    assert_eq!(
        headings,
        [
            "Basic actions",
            "LUKS actions",
            "TCRYPT, BITLK and FVAULT2 actions",
            "Miscellaneous actions",
            "ucrypt's own"
        ]
    );
    assert_eq!(groups[0].1[..3], ["open", "close", "status"]);
    assert!(groups[1].1.starts_with(&["luksFormat".to_string()]));
    assert!(groups[4].1.contains(&"demo".to_string()));
    // Every command once: the list covers what clap knows (a command missing from the
    // groups would still be listed, at the end).
    let all: Vec<&String> = groups.iter().flat_map(|(_, n)| n).collect();
    for name in [
        "open",
        "close",
        "status",
        "ls",
        "luksFormat",
        "luksAddKey",
        "luksDump",
        "reencrypt",
        "benchmark",
        "repair",
        "tcryptDump",
        "integritysetup",
        "completions",
        "man",
        "help",
    ] {
        assert_eq!(
            all.iter().filter(|n| n.as_str() == name).count(),
            1,
            "{name} listed once in {all:?}"
        );
    }
    assert!(all.len() >= 40, "only {} commands listed", all.len());
}

#[test]
fn open_help_groups_its_options() {
    let text = String::from_utf8(ok(ucrypt(&["open", "--help"], b""))).unwrap();
    let headings: Vec<&str> = text.lines().filter(|l| l.ends_with("options:")).collect();
    assert_eq!(
        headings,
        [
            "Unlock options:",
            "Serving options:",
            "Device options:",
            "Engine options:",
            "TLS options:"
        ]
    );
    let section = |h: &str| {
        let start = text.find(h).unwrap();
        let end = text[start + h.len()..]
            .find("options:\n")
            .map_or(text.len(), |e| start + h.len() + e);
        text[start..end].to_string()
    };
    for (heading, option) in [
        ("Unlock options:", "--key-file"),
        ("Unlock options:", "--type"),
        ("Serving options:", "--socket"),
        ("Device options:", "--device"),
        ("Device options:", "--fuse"),
        ("Engine options:", "--perf-same_cpu_crypt"),
        ("TLS options:", "--tls-psk"),
    ] {
        assert!(
            section(heading).contains(option),
            "{option} not under {heading}"
        );
    }
}

#[test]
fn completions_offer_the_values_of_device_type_and_resilience() {
    for shell in ["bash", "zsh", "fish"] {
        let script = String::from_utf8(ok(ucrypt(&["completions", shell], b""))).unwrap();
        for values in [
            ["auto", "ublk", "nbd", "fuse", "none"].as_slice(),
            &[
                "luks", "luks1", "luks2", "plain", "loopaes", "bitlk", "fvault2", "tcrypt",
            ],
            &["checksum", "journal", "none", "datashift"],
        ] {
            // bash and zsh list them space-separated; fish one by one, each with its
            // description after a tab.
            let listed = match shell {
                "fish" => values.iter().all(|v| script.contains(&format!("{v}\\t"))),
                _ => script.contains(&values.join(" ")),
            };
            assert!(listed, "{shell} completions do not offer {values:?}");
        }
    }
}

/// What bash offers for the last word of `line` (a word may be empty: `close ` + TAB),
/// through the completion script `ucrypt completions bash` printed, with `bin`'s
/// directory first on PATH (the script asks `ucrypt ls --names`).
fn bash_offers(
    script: &std::path::Path,
    line: &[&str],
    env: &[(&str, &std::ffi::OsStr)],
) -> Vec<String> {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_ucrypt"));
    let words = line
        .iter()
        .map(|w| format!("'{w}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let prog = format!(
        "source '{}'\nCOMP_WORDS=({words})\nCOMP_CWORD={}\nCOMP_LINE='{}'\nCOMP_POINT=${{#COMP_LINE}}\n\
         _ucrypt_with_instances ucrypt '{}' '{}'\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        script.display(),
        line.len() - 1,
        line.join(" "),
        line[line.len() - 1],
        line[line.len() - 2],
    );
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &prog])
        .env("PATH", path)
        .envs(env.iter().map(|(k, v)| (*k, *v)))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn completions_offer_live_instance_names() {
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("d.img");
    std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
    let table = tmp.path().join("t.line");
    std::fs::write(
        &table,
        format!(
            "0 2048 crypt aes-xts-plain64 {} 0 {} 0",
            "ef".repeat(64),
            img.display()
        ),
    )
    .unwrap();
    let run = tmp.path().join("run");
    let env = [("UCRYPT_RUNTIME_DIR", run.as_os_str())];
    let t = table.to_str().unwrap();
    let script = tmp.path().join("ucrypt.bash");
    std::fs::write(&script, ok(ucrypt(&["completions", "bash"], b""))).unwrap();
    // Nothing runs yet: clap's options stay.
    let before = bash_offers(&script, &["ucrypt", "close", ""], &env);
    assert!(before.contains(&"--force".to_string()), "{before:?}");
    ok(ucrypt_env(
        &["open", "--device", "none", "--table-file", t, "vault-one"],
        b"",
        &env,
    ));
    let names = ok(ucrypt_env(&["ls", "--names"], b"", &env));
    assert_eq!(String::from_utf8(names).unwrap(), "vault-one\n");
    let one = vec!["vault-one".to_string()];
    let offered = |line: &[&str]| bash_offers(&script, line, &env);
    assert_eq!(offered(&["ucrypt", "close", ""]), one, "close");
    assert_eq!(offered(&["ucrypt", "close", "va"]), one, "close va");
    assert_eq!(offered(&["ucrypt", "status", ""]), one, "status");
    assert_eq!(offered(&["ucrypt", "luksSuspend", ""]), one, "luksSuspend");
    assert_eq!(
        offered(&["ucrypt", "-v", "luksResume", "-d", "key", ""]),
        one,
        "after -d KEY"
    );
    assert_eq!(
        offered(&["ucrypt", "resize", "--size", "100", ""]),
        one,
        "resize"
    );
    assert_eq!(offered(&["ucrypt", "refresh", ""]), one, "refresh");
    assert_eq!(
        offered(&["ucrypt", "reencrypt", "--active-name", ""]),
        one,
        "--active-name"
    );
    assert!(
        offered(&["ucrypt", "close", "x"]).is_empty(),
        "no match for x"
    );
    // Not where a name is not wanted: an option's value, a second argument, other commands.
    assert!(!offered(&["ucrypt", "resize", "--size", ""]).contains(&one[0]));
    assert!(!offered(&["ucrypt", "close", "vault-one", ""]).contains(&one[0]));
    assert!(!offered(&["ucrypt", "open", ""]).contains(&one[0]));
    // Options are still clap's.
    assert!(offered(&["ucrypt", "close", "--f"]).contains(&"--force".to_string()));
    // zsh and fish call a function that asks the same listing.
    let zsh = String::from_utf8(ok(ucrypt(&["completions", "zsh"], b""))).unwrap();
    assert_eq!(
        zsh.matches(":_ucrypt_instances'").count(),
        7,
        "6 NAMEs and --active-name"
    );
    assert!(zsh.contains("ucrypt ls --names"));
    let fish = String::from_utf8(ok(ucrypt(&["completions", "fish"], b""))).unwrap();
    assert!(fish.contains(
        "__fish_ucrypt_using_subcommand close status luksSuspend luksResume resize refresh\" -f -a \"(__fish_ucrypt_instances)\""
    ));
    assert!(fish.contains("ucrypt ls --names"));
    assert!(!zsh.contains("UCRYPT_INSTANCE_NAMES") && !fish.contains("UCRYPT_INSTANCE_NAMES"));
    ok(ucrypt_env(&["close", "vault-one"], b"", &env));
    assert!(
        !offered(&["ucrypt", "close", ""]).contains(&one[0]),
        "after close"
    );
}

#[test]
fn man_pages_have_exit_status_files_environment_examples_and_a_typed_synopsis() {
    let tmp = tempfile::tempdir().unwrap();
    ok(ucrypt(&["man", tmp.path().to_str().unwrap()], b""));
    let page = |name: &str| std::fs::read_to_string(tmp.path().join(name)).unwrap();
    let main = page("ucrypt.1");
    let open = page("ucrypt-open.1");
    for (name, text) in [("ucrypt.1", &main), ("ucrypt-open.1", &open)] {
        for section in [
            ".SH \"EXIT STATUS\"",
            ".SH FILES",
            ".SH ENVIRONMENT",
            ".SH EXAMPLES",
        ] {
            assert!(text.contains(section), "{name} has no {section}");
        }
        assert!(text.contains("XDG_RUNTIME_DIR") && text.contains("/tmp/ucrypt\\-UID"));
    }
    // The synopsis is the command as typed, the page's name ucrypt-open.
    let synopsis = open.split(".SH SYNOPSIS").nth(1).unwrap();
    let first = synopsis.lines().nth(1).unwrap();
    assert!(first.contains("ucrypt open"), "synopsis: {first}");
    assert!(!first.contains("ucrypt\\-open"), "synopsis: {first}");
    assert!(open.contains(".TH ucrypt-open 1"), "{open:.200}");
    assert!(page("ucrypt-luksDump.1").contains(".SH \"EXIT STATUS\""));
}

/// Whether this test runs as root and `runuser` can run a command as `nobody`.
fn can_run_as_nobody() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() == 0 };
    root && std::process::Command::new("runuser")
        .args(["-u", "nobody", "--", "true"])
        .status()
        .is_ok_and(|s| s.success())
}

/// A directory `nobody` can use: a fresh one under /tmp, world-traversable, owned by it.
fn nobodys_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = tmp.path().join("home");
    std::fs::create_dir(&dir).unwrap();
    let ok = std::process::Command::new("chown")
        .args(["nobody", dir.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(ok.success());
    tmp
}

#[test]
fn auto_says_which_front_ends_it_passed_over_and_why() {
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("d.img");
    std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
    let table = tmp.path().join("t.line");
    std::fs::write(
        &table,
        format!(
            "0 2048 crypt aes-xts-plain64 {} 0 {} 0",
            "ab".repeat(64),
            img.display()
        ),
    )
    .unwrap();
    let run = tmp.path().join("run");
    let env = [("UCRYPT_RUNTIME_DIR", run.as_os_str())];
    let t = table.to_str().unwrap();
    let out = ucrypt_env(&["open", "--table-file", t, "auto1"], b"", &env);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{out:?}");
    let status =
        String::from_utf8(ok(ucrypt_env(&["status", "auto1", "--json"], b"", &env))).unwrap();
    ok(ucrypt_env(&["close", "auto1"], b"", &env));
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    let kind = v["frontend"].as_str().unwrap().to_string();
    if kind == "ublk" {
        assert!(!stderr.contains("--device auto"), "{stderr}");
    } else {
        let line = format!("ucrypt: --device auto: {kind} (ublk: ");
        assert!(stderr.contains(&line), "no {line:?} in {stderr}");
    }
}

#[test]
fn as_a_user_the_demo_works_and_a_squatted_runtime_directory_names_the_fix() {
    if !can_run_as_nobody() {
        eprintln!("skipped: needs root and runuser to run as nobody");
        return;
    }
    let tmp = nobodys_dir();
    let home = tmp.path().join("home");
    let bin = env!("CARGO_BIN_EXE_ucrypt");
    // The demo, start to end, as a user without XDG_RUNTIME_DIR (su -, runuser): its
    // instances go to its own runtime directory, the front end is FUSE or the NBD socket.
    let out = std::process::Command::new("runuser")
        .args(["-u", "nobody", "--", "env", "-u", "XDG_RUNTIME_DIR"])
        .arg(format!("UCRYPT_RUNTIME_DIR={}/run", home.display()))
        .args([bin, "demo", "--dir"])
        .arg(home.join("demo"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("does not contain the text"), "{stdout}");
    // With the FUSE file, a user gets the file system and the file too.
    if stderr.contains("--device auto: fuse") {
        assert!(
            stdout.contains("wrote and read back hello.txt: Hello from ucrypt"),
            "{stdout}"
        );
    }
    assert!(
        stderr.contains("ublk: needs root; nbd: needs root"),
        "{stderr}"
    );

    // Another user's directory where this user's runtime directory would be: refused,
    // with the way out.
    let squat = tmp.path().join("xdg");
    std::fs::create_dir_all(squat.join("ucrypt")).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(squat.join("ucrypt"), std::fs::Permissions::from_mode(0o777))
            .unwrap();
    }
    let out = std::process::Command::new("runuser")
        .args(["-u", "nobody", "--", "env", "-u", "UCRYPT_RUNTIME_DIR"])
        .arg(format!("XDG_RUNTIME_DIR={}", squat.display()))
        .args([
            bin,
            "open",
            "--device",
            "none",
            "--table-file",
            "/nonexistent",
            "x",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("refusing to use it") && stderr.contains("set XDG_RUNTIME_DIR"),
        "{stderr}"
    );
}

#[test]
fn an_instance_has_a_stable_path_shown_by_open_and_status_and_removed_on_close() {
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("d.img");
    std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
    let table = tmp.path().join("t.line");
    std::fs::write(
        &table,
        format!(
            "0 2048 crypt aes-xts-plain64 {} 0 {} 0",
            "cd".repeat(64),
            img.display()
        ),
    )
    .unwrap();
    let run = tmp.path().join("run");
    let env = [("UCRYPT_RUNTIME_DIR", run.as_os_str())];
    let t = table.to_str().unwrap();
    // FUSE where it works here; the NBD socket alone has no node and so no link.
    let fuse = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .is_ok();
    if !fuse {
        eprintln!("skipped: /dev/fuse is not usable here");
        return;
    }
    let out = ucrypt_env(
        &["open", "--device", "fuse", "--table-file", t, "st1"],
        b"",
        &env,
    );
    assert!(out.status.success(), "{out:?}");
    let node = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let link = run.join("st1/node");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("stable path: {}", link.display())),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        std::path::Path::new(&node)
    );
    let status = String::from_utf8(ok(ucrypt_env(&["status", "st1"], b"", &env))).unwrap();
    assert!(
        status.contains(&format!("link:    {}", link.display())),
        "{status}"
    );
    let json = String::from_utf8(ok(ucrypt_env(&["status", "st1", "--json"], b"", &env))).unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["link"].as_str(), Some(link.to_str().unwrap()));
    // The link reaches the volume: what is written through it is read through the node.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&link).unwrap();
        f.write_all_at(b"through the stable path", 0).unwrap();
        f.sync_all().unwrap();
    }
    let back = std::fs::read(&node).unwrap();
    assert!(back.starts_with(b"through the stable path"));
    ok(ucrypt_env(&["close", "st1"], b"", &env));
    assert!(
        std::fs::symlink_metadata(&link).is_err(),
        "link left after close"
    );
}

#[test]
fn benchmarks_argon2_rows_say_they_are_a_fixed_cost() {
    let out = ok(ucrypt(
        &[
            "benchmark",
            "--pbkdf",
            "argon2id",
            "--pbkdf-memory",
            "8192",
            "--pbkdf-force-iterations",
            "1",
        ],
        b"",
    ));
    let text = String::from_utf8(out).unwrap();
    let row = text
        .lines()
        .find(|l| l.starts_with("argon2id"))
        .unwrap_or_else(|| panic!("no argon2id row in {text}"));
    assert!(
        row.contains("1 iterations,    8192 KiB memory, 1 thread")
            && row.contains("ms per derivation (fixed cost; cryptsetup's row is the cost tuned"),
        "{row}"
    );
}
