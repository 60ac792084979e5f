//! Every cryptsetup 2.6-2.8 action, alias and refused feature, and what ucrypt does with
//! it: the table below is the contract (docs/cryptsetup.md renders it). Each
//! action that exists must be accepted under cryptsetup's name; each refused one must fail
//! with exit 1 and its one-line reason; the installed cryptsetup's own action and alias
//! lists must all be in the table; docs/cryptsetup.md must list every row.
//!
//! What each action *does* is compared with cryptsetup elsewhere: `cryptsetup_compat.rs`
//! (token, keyslot and key-file options, luksDump, open --test-passphrase, luksFormat,
//! luksUUID, isLuks, luksHeaderBackup, config), `lifecycle.rs` (config, luksConvert, erase,
//! repair, named open/close/status/resize/refresh/luksSuspend/luksResume), `reencrypt.rs`,
//! `reencrypt_shift.rs` (--reduce-device-size), `bitlk_fvault2.rs`, `tcrypt.rs`, `cli.rs` (benchmark).

#![allow(clippy::unwrap_used)]

mod common;

use common::CHEAP_PBKDF;
use std::process::Output;

/// What ucrypt does with a cryptsetup action.
enum Does {
    /// Runs it as this ucrypt command (its `--help` says `Usage: ucrypt <command>`).
    Runs(&'static str),
    /// Refuses it: exit 1, one line containing this reason.
    Refused(&'static str),
}

use Does::{Refused, Runs};

/// (cryptsetup action, alias or option as typed, what ucrypt does).
const ACTIONS: &[(&str, Does)] = &[
    ("open", Runs("open")),
    ("close", Runs("close")),
    ("resize", Runs("resize")),
    ("status", Runs("status")),
    ("benchmark", Runs("benchmark")),
    ("repair", Runs("repair")),
    ("reencrypt", Runs("reencrypt")),
    ("erase", Runs("erase")),
    ("convert", Runs("luksConvert")),
    ("config", Runs("config")),
    ("luksFormat", Runs("luksFormat")),
    ("luksAddKey", Runs("luksAddKey")),
    ("luksRemoveKey", Runs("luksRemoveKey")),
    ("luksChangeKey", Runs("luksChangeKey")),
    ("luksConvertKey", Runs("luksConvertKey")),
    ("luksKillSlot", Runs("luksKillSlot")),
    ("luksUUID", Runs("luksUUID")),
    ("isLuks", Runs("isLuks")),
    ("luksDump", Runs("luksDump")),
    ("tcryptDump", Runs("tcryptDump")),
    ("bitlkDump", Runs("bitlkDump")),
    ("fvault2Dump", Runs("fvault2Dump")),
    ("luksSuspend", Runs("luksSuspend")),
    ("luksResume", Runs("luksResume")),
    ("luksHeaderBackup", Runs("luksHeaderBackup")),
    ("luksHeaderRestore", Runs("luksHeaderRestore")),
    ("token", Runs("token")),
    // Aliases.
    ("create", Runs("open")),
    ("plainOpen", Runs("open")),
    ("luksOpen", Runs("open")),
    ("tcryptOpen", Runs("open")),
    ("bitlkOpen", Runs("open")),
    ("fvault2Open", Runs("open")),
    ("loopaesOpen", Runs("open")),
    ("remove", Runs("close")),
    ("plainClose", Runs("close")),
    ("luksClose", Runs("close")),
    ("loopaesClose", Runs("close")),
    ("tcryptClose", Runs("close")),
    ("bitlkClose", Runs("close")),
    ("fvault2Close", Runs("close")),
    ("luksErase", Runs("erase")),
    ("luksConfig", Runs("config")),
    ("refresh", Runs("refresh")),
    // Options (cryptsetup 2.6-2.8) with what they do on the action they belong to.
    ("luksAddKey --unbound", Runs("luksAddKey")),
    ("luksDump --unbound", Runs("luksDump")),
    ("open --unbound", Runs("open")),
    ("luksAddKey --new-token-id", Runs("luksAddKey")),
    ("luksFormat --keyslot-cipher", Runs("luksFormat")),
    ("luksAddKey --keyslot-cipher", Runs("luksAddKey")),
    ("luksChangeKey --keyslot-cipher", Runs("luksChangeKey")),
    ("luksConvertKey --keyslot-key-size", Runs("luksConvertKey")),
    ("open --timeout", Runs("open")),
    ("--debug", Runs("luksDump")),
    ("--debug-json", Runs("luksDump")),
    ("--disable-keyring", Runs("open")),
    ("--disable-locks", Runs("open")),
    ("--disable-external-tokens", Runs("open")),
    ("--external-tokens-path", Runs("open")),
    ("open --link-vk-to-keyring", Runs("open")),
    ("open --serialize-memory-hard-pbkdf", Runs("open")),
    ("luksFormat --luks2-metadata-size", Runs("luksFormat")),
    ("luksFormat --luks2-keyslots-size", Runs("luksFormat")),
    ("luksFormat --use-random", Runs("luksFormat")),
    ("luksFormat --use-urandom", Runs("luksFormat")),
    ("luksFormat --volume-key-file", Runs("luksFormat")),
    ("luksAddKey --token-only", Runs("luksAddKey")),
    ("luksFormat --offset", Runs("luksFormat")),
    ("luksFormat --force-password", Runs("luksFormat")),
    ("luksAddKey --force-password", Runs("luksAddKey")),
    ("luksChangeKey --force-password", Runs("luksChangeKey")),
    ("--test-args", Runs("luksFormat")),
    ("--verify-passphrase", Runs("luksFormat")),
    ("tcryptDump --veracrypt-query-pim", Runs("tcryptDump")),
    ("close --cancel-deferred", Runs("close")),
    ("open --refresh", Runs("refresh")),
    ("open --persistent", Runs("open")),
    ("open --device-size", Runs("open")),
    // cryptsetup's LUKS1-only reencryption options (its legacy LUKS1 pass, ucrypt's
    // `reencrypt` of a LUKS1 volume).
    ("reencrypt --use-fsync", Runs("reencrypt")),
    ("reencrypt --block-size 4", Runs("reencrypt")),
    ("reencrypt --use-directio", Runs("reencrypt")),
    ("reencrypt --write-log", Runs("reencrypt")),
    ("reencrypt --active-name vol", Runs("reencrypt")),
    ("reencrypt --encrypt", Runs("reencrypt")),
    ("reencrypt --decrypt", Runs("reencrypt")),
    ("reencrypt --reduce-device-size", Runs("reencrypt")),
    ("reencrypt --keep-key", Runs("reencrypt")),
    ("reencrypt --device-size", Runs("reencrypt")),
    ("reencrypt --offset", Runs("reencrypt")),
    ("reencrypt --new", Runs("reencrypt")),
    ("reencrypt --luks2-metadata-size", Runs("reencrypt")),
    ("reencrypt --luks2-keyslots-size", Runs("reencrypt")),
    ("reencrypt --volume-key-file", Runs("reencrypt")),
    ("luksFormat --integrity hmac-sha256", Runs("luksFormat")),
    // Features that cannot make sense for ucrypt.
    (
        "luksFormat --hw-opal",
        Refused("OPAL self-encrypting drives"),
    ),
    (
        "luksFormat --hw-opal-only",
        Refused("OPAL self-encrypting drives"),
    ),
];

fn run(args: &[&str]) -> Output {
    common::ucrypt(args, b"")
}

/// The two tools, for the tests that run one command line through each.
const TOOLS: [(&str, &str); 2] = [
    ("ucrypt", env!("CARGO_BIN_EXE_ucrypt")),
    ("cryptsetup", "cryptsetup"),
];

/// A passphrase file ("pw") in `dir`, as a path string.
fn pass_file(dir: &std::path::Path) -> String {
    let pass = dir.join("pass");
    std::fs::write(&pass, b"pw").unwrap();
    pass.to_str().unwrap().to_string()
}

#[test]
fn every_action_runs_under_its_name_or_is_refused_with_its_reason() {
    for (typed, does) in ACTIONS {
        let mut args: Vec<&str> = typed.split(' ').collect();
        match does {
            Runs(cmd) => {
                // An option row: the option must be in the help of the command (the one
                // named, for options that go before the action).
                // (An option that turns the action into another, `open --refresh` being
                // `refresh`, is kept and only the usage line is checked.)
                let rewritten = !args[0].starts_with("--") && args[0] != *cmd;
                let option = args
                    .iter()
                    .rev()
                    .find(|a| a.starts_with("--"))
                    .copied()
                    .filter(|_| !rewritten);
                if option.is_some() {
                    args.retain(|a| !a.starts_with("--"));
                    if args.is_empty() {
                        args.push(cmd);
                    }
                }
                args.push("--help");
                let out = run(&args);
                let text = String::from_utf8_lossy(&out.stdout);
                assert!(out.status.success(), "{typed}: {out:?}");
                assert!(
                    text.contains(&format!("Usage: ucrypt {cmd} ")),
                    "{typed} is not ucrypt {cmd}:\n{text}"
                );
                if let Some(o) = option {
                    assert!(text.contains(o), "{typed}: no {o} in the help:\n{text}");
                }
            }
            Refused(why) => {
                args.push("/nonexistent/device");
                let out = run(&args);
                let err = String::from_utf8_lossy(&out.stderr);
                assert_eq!(out.status.code(), Some(1), "{typed}: {out:?}");
                assert_eq!(err.lines().count(), 1, "{typed}: not one line: {err}");
                assert!(
                    err.starts_with("ucrypt: ") && err.contains(why),
                    "{typed}: {err}"
                );
            }
        }
    }
}

#[test]
fn renamed_aliases_behave_as_their_action() {
    let tmp = tempfile::tempdir().unwrap();
    let img = common::image(tmp.path(), "img", 4 << 20);
    let key = tmp.path().join("key");
    std::fs::write(&key, [7u8; 64]).unwrap();
    let (img, key) = (img.to_str().unwrap(), key.to_str().unwrap());
    // `create NAME DEV` is `plainOpen DEV NAME`: the same table line.
    let a = run(&["create", "vol", img, "--print-table", "--key-file", key]);
    let b = run(&["plainOpen", img, "vol", "--print-table", "--key-file", key]);
    assert!(a.status.success(), "{a:?}");
    assert_eq!(a.stdout, b.stdout);
    assert!(!a.stdout.is_empty());
    // `luksClose NAME` is `close NAME`: the same answer for an unknown name.
    let dir = tmp.path().join("run");
    let env = [("UCRYPT_RUNTIME_DIR", dir.as_os_str())];
    let a = common::ucrypt_env(&["luksClose", "nothing"], b"", &env);
    let b = common::ucrypt_env(&["close", "nothing"], b"", &env);
    assert_eq!(a.status.code(), b.status.code());
    assert_eq!(a.stderr, b.stderr);
    assert!(!a.status.success());
}

/// The installed cryptsetup's own lists (`cryptsetup --help`): every action and alias it
/// names must be a row of [`ACTIONS`].
#[test]
fn the_table_covers_every_action_cryptsetup_lists() {
    if !common::require("cryptsetup") {
        return;
    }
    let out = std::process::Command::new("cryptsetup")
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    let mut names = Vec::new();
    let mut in_actions = false;
    for line in help.lines() {
        if line.starts_with("<action> is one of") {
            in_actions = true;
            continue;
        }
        if in_actions && line.starts_with('\t') {
            names.push(line.trim().split(' ').next().unwrap().to_string());
        } else if in_actions && !line.trim().is_empty() {
            in_actions = false;
        }
        // "\topen: create (plainOpen), luksOpen, ..." alias lines.
        if let Some(rest) = line
            .trim()
            .strip_prefix("open:")
            .or(line.trim().strip_prefix("close:"))
        {
            for a in rest.split([',', ' ', '(', ')']).filter(|a| !a.is_empty()) {
                names.push(a.to_string());
            }
        }
    }
    assert!(
        names.len() >= 27 + 12,
        "cryptsetup --help parsed to {names:?}"
    );
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !ACTIONS.iter().any(|(typed, _)| typed == n))
        .collect();
    assert!(missing.is_empty(), "not in the table: {missing:?}");
}

#[test]
fn the_docs_list_every_row() {
    let section = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/cryptsetup.md"
    ))
    .unwrap();
    for (typed, _) in ACTIONS {
        assert!(
            section.contains(&format!("| `{typed}`")),
            "docs/cryptsetup.md's table has no row for `{typed}`"
        );
    }
}

/// cryptsetup's global flags go before the action too (`cryptsetup -q luksFormat ...`) and
/// are accepted by every action: the same exit codes (and `-v isLuks`'s output) as
/// cryptsetup's.
#[test]
fn batch_mode_and_verbose_go_before_the_action_and_on_every_action() {
    if !common::require("cryptsetup") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let img = common::image(tmp.path(), "img", 20 << 20);
    let pass = pass_file(tmp.path());
    let (img, pass) = (img.to_str().unwrap(), pass.as_str());
    let out = run(&[&["-q", "luksFormat", img, "-d", pass][..], &CHEAP_PBKDF].concat());
    assert!(out.status.success(), "{out:?}");
    let cases: &[&[&str]] = &[
        &["-q", "isLuks", img],
        &["-v", "isLuks", img],
        &["--batch-mode", "luksUUID", img],
        &["-q", "-v", "open", "--test-passphrase", "-d", pass, img],
        &["open", "-q", "--test-passphrase", "-d", pass, img],
        &["-q", "luksDump", img],
        &["-q", "config", img, "--label", "x"],
        &[
            "-v",
            "luksHeaderBackup",
            img,
            "--header-backup-file",
            "/nonexistent/dir/f",
        ],
    ];
    for args in cases {
        let u = run(args);
        let c = std::process::Command::new("cryptsetup")
            .args(*args)
            .output()
            .unwrap();
        assert_eq!(u.status.code(), c.status.code(), "{args:?}\n{u:?}\n{c:?}");
    }
    let u = run(&["-v", "isLuks", img]);
    let c = std::process::Command::new("cryptsetup")
        .args(["-v", "isLuks", img])
        .output()
        .unwrap();
    assert_eq!(u.stdout, c.stdout);
}

/// `--usage` prints the short usage line and exits 0, alone or with an action.
#[test]
fn usage_prints_the_short_usage() {
    for args in [&["--usage"][..], &["open", "--usage"][..]] {
        let out = run(args);
        assert!(out.status.success(), "{args:?}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).starts_with("Usage: ucrypt "),
            "{args:?}: {out:?}"
        );
    }
}

/// `open --persistent` stores the activation flags it was given in the LUKS2 header, as
/// cryptsetup's does (read back with cryptsetup's own luksDump), and an open with
/// `--persistent` and no flag clears them.
#[test]
fn open_persistent_stores_the_activation_flags() {
    if !ucrypt_testkit::require("cryptsetup") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let img = common::image(tmp.path(), "img", 32 << 20);
    let key = tmp.path().join("key");
    std::fs::write(&key, b"pass").unwrap();
    let (img, key) = (img.to_str().unwrap(), key.to_str().unwrap());
    let st = std::process::Command::new("cryptsetup")
        .args(["luksFormat", "-q", "--type", "luks2", "--pbkdf", "pbkdf2"])
        .args(["--pbkdf-force-iterations", "1000", "--key-file", key, img])
        .status()
        .unwrap();
    assert!(st.success());
    let dir = tmp.path().join("run");
    let env = [("UCRYPT_RUNTIME_DIR", dir.as_os_str())];
    let flags = || {
        let out = std::process::Command::new("cryptsetup")
            .args(["luksDump", img])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|l| l.starts_with("Flags:"))
            .unwrap_or_default()
            .to_string()
    };
    for (extra, want) in [
        (
            &["--allow-discards", "--perf-no_read_workqueue"][..],
            "allow-discards no-read-workqueue",
        ),
        (&[][..], "(no flags)"),
    ] {
        let mut args = vec!["open", img, "p", "--device", "none", "--persistent"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--key-file", key]);
        let out = common::ucrypt_env(&args, b"", &env);
        assert!(out.status.success(), "{out:?}");
        let out = common::ucrypt_env(&["close", "p"], b"", &env);
        assert!(out.status.success(), "{out:?}");
        assert!(flags().contains(want), "{extra:?}: {}", flags());
    }
}

/// Plain mode's `--device-size` stands in for the device's real size: the mapping ends
/// there (less `--offset`), with cryptsetup's units; a size not in whole sectors is refused.
#[test]
fn plain_device_size_replaces_the_real_size() {
    let tmp = tempfile::tempdir().unwrap();
    let img = common::image(tmp.path(), "img", 16 << 20);
    let key = tmp.path().join("key");
    std::fs::write(&key, [7u8; 64]).unwrap();
    let (img, key) = (img.to_str().unwrap(), key.to_str().unwrap());
    let table = |size: &str| {
        run(&[
            "luksOpen",
            "--type",
            "plain",
            "-c",
            "aes-xts-plain64",
            "-s",
            "512",
            "--key-file",
            key,
            "--device-size",
            size,
            "-o",
            "8",
            "--print-table",
            img,
        ])
    };
    for (size, sectors) in [("8M", 16384 - 8), ("64S", 64 - 8), ("4194304", 8192 - 8)] {
        let out = table(size);
        assert!(out.status.success(), "{size}: {out:?}");
        let line = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            line.starts_with(&format!("0 {sectors} crypt ")),
            "{size}: {line}"
        );
    }
    let out = table("1000");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--device-size 1000"));
}

#[test]
fn luks_format_offset_places_the_data_as_cryptsetups() {
    if !common::require("cryptsetup") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let pass = pass_file(tmp.path());
    let pass = pass.as_str();
    for kind in ["luks2", "luks1"] {
        let mut dumps = Vec::new();
        for (tool, bin) in TOOLS {
            let img = common::image(tmp.path(), &format!("{tool}-{kind}"), 40 << 20);
            let img = img.to_str().unwrap();
            let out = std::process::Command::new(bin)
                .args([
                    "luksFormat",
                    "-q",
                    "--type",
                    kind,
                    "-d",
                    pass,
                    "--offset",
                    "40960",
                ])
                .args(CHEAP_PBKDF)
                .arg(img)
                .output()
                .unwrap();
            assert!(out.status.success(), "{tool} {kind}: {out:?}");
            let dump = std::process::Command::new("cryptsetup")
                .args(["luksDump", img])
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&dump.stdout).into_owned();
            let offsets: Vec<String> = text
                .lines()
                .filter(|l| l.contains("Payload offset") || l.trim_start().starts_with("offset:"))
                .map(str::to_string)
                .collect();
            assert!(!offsets.is_empty(), "{tool} {kind}: {text}");
            dumps.push(offsets);
        }
        assert_eq!(dumps[0], dumps[1], "{kind}: data offsets differ");
    }
    // Not a multiple of 4096 bytes on LUKS2: refused as cryptsetup refuses it.
    let img = common::image(tmp.path(), "bad", 40 << 20);
    let out = run(&[
        "luksFormat",
        "-q",
        "--type",
        "luks2",
        "-d",
        pass,
        "-o",
        "3",
        img.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}

/// Plain-mode options given to a type with no use for them are refused, never ignored:
/// where cryptsetup 2.6 refuses (its option checks run before it needs the kernel, so it
/// runs here), ucrypt refuses with the same exit code and words; where cryptsetup accepts
/// and ignores (`--size`, `--device-size` for LUKS and loop-AES), ucrypt refuses and says
/// so. The same options stay accepted where they apply.
#[test]
fn open_options_a_type_cannot_use_are_refused_as_cryptsetup_refuses_them() {
    if !common::require("cryptsetup") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let img = common::image(tmp.path(), "img", 16 << 20);
    let key = tmp.path().join("key");
    // One line of 40 printable characters: a loop-AES key file, a LUKS passphrase file and
    // (its first 32 bytes) a plain-mode raw key.
    std::fs::write(&key, b"abcdefghijklmnopqrstuvwxyz0123456789ABCD\n").unwrap();
    let (img, key) = (img.to_str().unwrap(), key.to_str().unwrap());
    let luks = tmp.path().join("luks");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ucrypt"))
        .args(["luksFormat", "-q", "--type", "luks2", "-d", key])
        .args(CHEAP_PBKDF)
        .arg(common::image(tmp.path(), "luks", 16 << 20))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let luks = luks.to_str().unwrap();
    // (type, option, cryptsetup refuses it too, words of the refusal)
    let cases: &[(&str, &[&str], bool, &str)] = &[
        ("luks", &["--offset", "8"], true, "--offset with open action is only supported for plain and loopaes"),
        ("luks", &["--skip", "8"], true, "--skip is supported only for open of plain and loopaes"),
        ("luks", &["--sector-size", "4096"], true, "ector size option with open action is supported only for plain"),
        ("luks", &["--iv-large-sectors"], true, "arge IV sectors option is supported only for opening plain"),
        ("luks", &["--size", "8"], false, "--size is supported only for open of plain devices"),
        ("luks", &["--device-size", "4M"], false, "--device-size is supported only for open of plain devices"),
        ("loopaes", &["--sector-size", "4096"], true, "ector size option with open action is supported only for plain"),
        ("loopaes", &["--iv-large-sectors"], true, "arge IV sectors option is supported only for opening plain"),
        ("loopaes", &["--test-passphrase"], true, "--test-passphrase is allowed only for open of LUKS, TCRYPT, BITLK and FVAULT2"),
        ("loopaes", &["--size", "8"], false, "--size is supported only for open of plain devices"),
        ("loopaes", &["--device-size", "4M"], false, "--device-size is supported only for open of plain devices"),
        ("plain", &["--test-passphrase"], true, "--test-passphrase is allowed only for open of LUKS, TCRYPT, BITLK and FVAULT2"),
        ("plain", &["--iv-large-sectors"], true, "arge IV sectors option is supported only for opening plain type device with sector size larger than 512"),
    ];
    for (kind, opts, cs_refuses, words) in cases {
        let dev = if *kind == "luks" { luks } else { img };
        let common_args = ["--type", kind, "--key-file", key];
        let cs = std::process::Command::new("cryptsetup")
            .arg("open")
            .args(common_args)
            .args(*opts)
            .args([dev, "ucrypt-opt-test"])
            .output()
            .unwrap();
        let cs_err = String::from_utf8_lossy(&cs.stderr).into_owned();
        if *cs_refuses {
            assert_eq!(
                cs.status.code(),
                Some(1),
                "cryptsetup {kind} {opts:?}: {cs_err}"
            );
            assert!(
                cs_err.contains(words),
                "cryptsetup {kind} {opts:?}: {cs_err}"
            );
        } else {
            // Accepted by its option checks: it goes on to the device (and, without
            // device-mapper here, fails there, not with a usage error).
            assert!(
                !cs_err.contains("supported only"),
                "cryptsetup {kind} {opts:?}: {cs_err}"
            );
        }
        let mut args = vec!["luksOpen", "--print-table"];
        args.extend(common_args);
        args.extend(*opts);
        args.extend([dev, "x"]);
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "ucrypt {kind} {opts:?}: {err}");
        assert!(err.contains(words), "ucrypt {kind} {opts:?}: {err}");
    }
    // Where they apply they are honoured.
    for (kind, opts, prefix) in [
        ("plain", &["--size", "8"][..], "0 8 crypt "),
        (
            "plain",
            &["--sector-size", "4096", "--iv-large-sectors"][..],
            "0 32768 crypt ",
        ),
        ("loopaes", &["--offset", "8"][..], "0 32760 crypt "),
    ] {
        let mut args = vec![
            "luksOpen",
            "--print-table",
            "--type",
            kind,
            "--key-file",
            key,
        ];
        args.extend(opts);
        args.extend([img, "x"]);
        let out = run(&args);
        let line = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{kind} {opts:?}: {out:?}");
        assert!(line.starts_with(prefix), "{kind} {opts:?}: {line}");
    }
}

/// `reencrypt -N` / `--new` are cryptsetup 2.6's older spellings of `--encrypt`: both tools
/// initialise the same kind of encryption from them.
#[test]
fn reencrypt_new_is_encrypt() {
    if !common::require("cryptsetup") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let pass = pass_file(tmp.path());
    let pass = pass.as_str();
    for spelling in ["-N", "--new"] {
        let mut modes = Vec::new();
        for (tool, bin) in TOOLS {
            let img = common::image(tmp.path(), &format!("{tool}{spelling}"), 32 << 20);
            let out = std::process::Command::new(bin)
                .args(["reencrypt", "-q", spelling, "--type", "luks2"])
                .args(["--reduce-device-size", "8M", "--init-only", "-d", pass])
                .args(CHEAP_PBKDF)
                .arg(&img)
                .output()
                .unwrap();
            assert!(out.status.success(), "{tool} {spelling}: {out:?}");
            let dump = std::process::Command::new("cryptsetup")
                .args(["luksDump", "--dump-json-metadata"])
                .arg(&img)
                .output()
                .unwrap();
            let json: serde_json::Value = serde_json::from_slice(&dump.stdout).unwrap();
            let reenc = json["keyslots"]
                .as_object()
                .unwrap()
                .values()
                .find(|k| k["type"] == "reencrypt")
                .cloned()
                .unwrap_or_else(|| panic!("{tool} {spelling}: no reencrypt keyslot: {json}"));
            modes.push((reenc["mode"].clone(), reenc["direction"].clone()));
        }
        assert_eq!(modes[0], modes[1], "{spelling}");
        assert_eq!(modes[0].0, "encrypt", "{spelling}");
    }
}

/// `--disable-locks` is a global option in cryptsetup, taken by every action before or
/// after it: the same exit codes from both tools on a range of actions.
#[test]
fn disable_locks_is_taken_by_every_action() {
    if !common::require("cryptsetup") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let img = common::image(tmp.path(), "img", 20 << 20);
    let pass = pass_file(tmp.path());
    let (img, pass) = (img.to_str().unwrap(), pass.as_str());
    let cases: &[&[&str]] = &[
        &["--disable-locks", "luksFormat", "-q", img, "-d", pass],
        &["isLuks", "--disable-locks", img],
        &["--disable-locks", "luksUUID", img],
        &["luksDump", "--disable-locks", img],
        &[
            "open",
            "--disable-locks",
            "--test-passphrase",
            "-d",
            pass,
            img,
        ],
        &["config", "--disable-locks", img, "--label", "x"],
        &[
            "luksAddKey",
            "--disable-locks",
            img,
            "-d",
            pass,
            "--new-keyfile",
            pass,
        ],
    ];
    for args in cases {
        let args: Vec<&str> = if args.contains(&"luksFormat") || args.contains(&"luksAddKey") {
            [*args, &CHEAP_PBKDF[..]].concat()
        } else {
            args.to_vec()
        };
        let u = run(&args);
        let c = std::process::Command::new("cryptsetup")
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(u.status.code(), c.status.code(), "{args:?}\n{u:?}\n{c:?}");
        assert_eq!(u.status.code(), Some(0), "{args:?}\n{u:?}");
    }
    // The two luksAddKey runs above added slots 1 and 2: each tool kills one.
    let u = run(&["luksKillSlot", "-q", "--disable-locks", img, "1"]);
    assert_eq!(u.status.code(), Some(0), "{u:?}");
    let c = std::process::Command::new("cryptsetup")
        .args(["luksKillSlot", "-q", "--disable-locks", img, "2"])
        .output()
        .unwrap();
    assert_eq!(c.status.code(), Some(0), "{c:?}");
}

/// `luksFormat --volume-key-file FILE` (and its older spelling `--master-key-file`) takes
/// the volume key from FILE's first --key-size bits, as cryptsetup's: the volume key
/// cryptsetup dumps from ucrypt's header is FILE's; a short FILE is refused (exit 1) with
/// nothing written.
#[test]
fn luks_format_takes_the_volume_key_from_a_file() {
    if !common::require("cryptsetup") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let pass = pass_file(tmp.path());
    let vk = tmp.path().join("vk");
    let key: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
    std::fs::write(&vk, &key).unwrap();
    let (pass, vk) = (pass.as_str(), vk.to_str().unwrap());
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    for (kind, spelling, bits) in [
        ("luks2", "--volume-key-file", "512"),
        ("luks1", "--master-key-file", "256"),
    ] {
        let img = common::image(tmp.path(), kind, 20 << 20);
        let img = img.to_str().unwrap();
        let out = run(&[
            "luksFormat",
            "-q",
            "--type",
            kind,
            "-d",
            pass,
            spelling,
            vk,
            "-s",
            bits,
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            img,
        ]);
        assert!(out.status.success(), "{kind}: {out:?}");
        let dump = std::process::Command::new("cryptsetup")
            .args(["luksDump", "-q", "--dump-volume-key", "-d", pass, img])
            .output()
            .unwrap();
        let text: String = String::from_utf8_lossy(&dump.stdout)
            .split("MK dump:")
            .nth(1)
            .unwrap_or_else(|| panic!("{kind}: {dump:?}"))
            .split_whitespace()
            .collect();
        let want = hex(&key[..bits.parse::<usize>().unwrap() / 8]);
        assert_eq!(text, want, "{kind}");
    }
    // 16 bytes for a 512-bit key: refused before anything is written.
    let short = tmp.path().join("short");
    std::fs::write(&short, [1u8; 16]).unwrap();
    let img = common::image(tmp.path(), "short-img", 20 << 20);
    let out = run(&[
        "luksFormat",
        "-q",
        "-d",
        pass,
        "--volume-key-file",
        short.to_str().unwrap(),
        img.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read 64 bytes"));
    assert!(
        std::fs::read(&img).unwrap().iter().all(|&b| b == 0),
        "header written"
    );
}

/// `reencrypt --encrypt --luks2-metadata-size/--luks2-keyslots-size` size the new header as
/// cryptsetup 2.6.1's (with `--header`, and with `--reduce-device-size`, where a keyslots
/// area too large for the data offset is shrunk to fit); without `--encrypt` refused.
#[test]
fn reencrypt_encrypt_sizes_the_new_header_as_cryptsetup() {
    if !common::require("cryptsetup") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let pass = pass_file(tmp.path());
    let pass = pass.as_str();
    let layout = |hdr: &std::path::Path| -> Vec<String> {
        let dump = std::process::Command::new("cryptsetup")
            .arg("luksDump")
            .arg(hdr)
            .output()
            .unwrap();
        String::from_utf8_lossy(&dump.stdout)
            .lines()
            .filter(|l| l.contains("area") || l.contains("offset") || l.contains("length"))
            .map(str::to_string)
            .collect()
    };
    for (case, extra) in [
        (
            "header",
            &[
                "--luks2-metadata-size",
                "64k",
                "--luks2-keyslots-size",
                "1M",
            ][..],
        ),
        (
            "shift",
            &[
                "--reduce-device-size",
                "2M",
                "--luks2-metadata-size",
                "64k",
                "--luks2-keyslots-size",
                "4M",
            ][..],
        ),
    ] {
        let mut layouts = Vec::new();
        for (tool, bin) in TOOLS {
            let img = common::image(tmp.path(), &format!("{tool}-{case}"), 32 << 20);
            let hdr = tmp.path().join(format!("{tool}-{case}.hdr"));
            let mut cmd = std::process::Command::new(bin);
            cmd.args(["reencrypt", "-q", "--encrypt", "--init-only", "-d", pass])
                .args(CHEAP_PBKDF)
                .args(extra);
            if case == "header" {
                cmd.arg("--header").arg(&hdr);
            }
            let out = cmd.arg(&img).output().unwrap();
            assert!(out.status.success(), "{tool} {case}: {out:?}");
            layouts.push(layout(if case == "header" { &hdr } else { &img }));
        }
        assert!(
            layouts[0].iter().any(|l| l.contains("65536")),
            "{case}: {:?}",
            layouts[0]
        );
        assert_eq!(
            layouts[0], layouts[1],
            "{case}: ucrypt's layout, then cryptsetup's"
        );
    }
    let img = common::image(tmp.path(), "luks", 32 << 20);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ucrypt"))
        .args(["luksFormat", "-q", "-d", pass])
        .args(CHEAP_PBKDF)
        .arg(&img)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let out = run(&[
        "reencrypt",
        "-q",
        "--init-only",
        "-d",
        pass,
        "--luks2-metadata-size",
        "64k",
        img.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}

/// `reencrypt` of a device that is not a local file or block device is refused with the
/// reason, before any passphrase is read (exit 1).
#[test]
fn reencrypt_of_a_remote_or_memory_device_is_refused_with_the_reason() {
    for dev in [
        "ram:16M",
        "nbd+unix:///x?socket=/nonexistent",
        "rbd:pool/image",
    ] {
        let out = run(&["reencrypt", "-q", dev]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{dev}: {out:?}");
        assert!(
            err.contains("local files and block devices only"),
            "{dev}: {err}"
        );
    }
}
