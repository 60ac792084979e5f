//! ucrypt against cryptsetup itself, for the actions and options that need no kernel: each
//! step runs on one copy of an image with ucrypt and on another with cryptsetup, and the
//! exit codes and what each prints (`luksDump`, `token export`) must agree.

#![allow(clippy::unwrap_used)]

mod common;

use common::require;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs `prog args` with `stdin`.
fn run(prog: &str, args: &[&str], stdin: &[u8]) -> Output {
    common::cmd::piped(Command::new(prog).args(args), stdin)
}

fn ucrypt(args: &[&str], stdin: &[u8]) -> Output {
    run(env!("CARGO_BIN_EXE_ucrypt"), args, stdin)
}

fn cryptsetup(args: &[&str], stdin: &[u8]) -> Output {
    run("cryptsetup", args, stdin)
}

/// A LUKS image made by cryptsetup (PBKDF2 at 1000 iterations: fast), passphrase "pw" in
/// `dir/pass`, with a second keyslot (1) holding "pw2".
fn luks_image(dir: &Path, name: &str, kind: &str) -> PathBuf {
    let img = dir.join(name);
    std::fs::File::create(&img)
        .unwrap()
        .set_len(20 << 20)
        .unwrap();
    let pass = dir.join("pass");
    std::fs::write(&pass, "pw").unwrap();
    std::fs::write(dir.join("pass2"), "pw2").unwrap();
    let (img_s, pass_s) = (img.to_str().unwrap(), pass.to_str().unwrap());
    let mut args = vec![
        "luksFormat",
        "-q",
        "--type",
        kind,
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        "--key-file",
        pass_s,
        img_s,
    ];
    let out = cryptsetup(&args, b"");
    assert!(out.status.success(), "{out:?}");
    args = vec![
        "luksAddKey",
        "-q",
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        "--key-file",
        pass_s,
        img_s,
    ];
    let out = cryptsetup(&args, b"pw2");
    assert!(out.status.success(), "{out:?}");
    img
}

/// Two copies of `img`: (ucrypt's, cryptsetup's).
fn copies(dir: &Path, img: &Path) -> (String, String) {
    let mk = |n: &str| {
        let p = dir.join(n);
        std::fs::copy(img, &p).unwrap();
        p.to_str().unwrap().to_string()
    };
    (mk("ours"), mk("theirs"))
}

/// `cryptsetup luksDump` of `p`, the path replaced by IMG.
fn dump(p: &str) -> String {
    let out = cryptsetup(&["luksDump", p], b"");
    String::from_utf8_lossy(&out.stdout).replace(p, "IMG")
}

/// One step: `args` with `DEV` standing for the device (and `OUT` for a per-tool output
/// file), by both tools with the same standard input. Returns both outputs after checking
/// exit codes, standard output and the header dump agree.
fn step(dir: &Path, ours: &str, theirs: &str, args: &[&str], stdin: &[u8]) -> (Output, Output) {
    let subst = |dev: &str, out: &str| -> Vec<String> {
        args.iter()
            .map(|a| match *a {
                "DEV" => dev.to_string(),
                "OUT" => out.to_string(),
                a => a.to_string(),
            })
            .collect()
    };
    let (out_u, out_c) = (
        dir.join("out.ucrypt").display().to_string(),
        dir.join("out.cryptsetup").display().to_string(),
    );
    let _ = std::fs::remove_file(&out_u);
    let _ = std::fs::remove_file(&out_c);
    let a_u = subst(ours, &out_u);
    let a_c = subst(theirs, &out_c);
    let u = ucrypt(&a_u.iter().map(String::as_str).collect::<Vec<_>>(), stdin);
    let c = cryptsetup(&a_c.iter().map(String::as_str).collect::<Vec<_>>(), stdin);
    assert_eq!(
        u.status.code(),
        c.status.code(),
        "{args:?}: exit codes differ\nucrypt: {u:?}\ncryptsetup: {c:?}"
    );
    assert_eq!(
        String::from_utf8_lossy(&u.stdout),
        String::from_utf8_lossy(&c.stdout),
        "{args:?}: standard output differs"
    );
    assert_eq!(dump(ours), dump(theirs), "{args:?}: the headers differ");
    if Path::new(&out_c).exists() || Path::new(&out_u).exists() {
        assert_eq!(
            std::fs::read(&out_u).ok(),
            std::fs::read(&out_c).ok(),
            "{args:?}: the written files differ"
        );
    }
    (u, c)
}

#[test]
fn token_actions_do_what_cryptsetups_do() {
    if !require("cryptsetup") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let img = luks_image(dir, "img", "luks2");
    let (ours, theirs) = copies(dir, &img);
    let json = dir.join("token.json");
    std::fs::write(
        &json,
        r#"{"type":"ucrypt-test","keyslots":[],"note":"imported"}"#,
    )
    .unwrap();
    let json = json.to_str().unwrap();
    let bad = dir.join("bad.json");
    std::fs::write(&bad, r#"{"keyslots":[]}"#).unwrap();
    let bad = bad.to_str().unwrap();
    let mut failures = 0;
    let steps: &[(&[&str], &[u8])] = &[
        // Usage mistakes (cryptsetup's verify_token).
        (&["token", "add", "DEV"], b""),
        (&["token", "remove", "DEV"], b""),
        (&["token", "export", "DEV"], b""),
        (&["token", "unassign", "DEV", "--token-id", "0"], b""),
        (&["token", "unassign", "DEV", "--key-slot", "0"], b""),
        (
            &[
                "token",
                "add",
                "DEV",
                "--key-description",
                "d",
                "--unbound",
                "--key-slot",
                "0",
            ],
            b"",
        ),
        (&["token", "import", "DEV", "--unbound"], b""),
        (&["token", "frobnicate", "DEV"], b""),
        // add: to every active keyslot, to one, unbound, at an id, replacing.
        (
            &["token", "add", "DEV", "--key-description", "ucrypt:a"],
            b"",
        ),
        (
            &[
                "token",
                "add",
                "DEV",
                "--key-description",
                "ucrypt:b",
                "-S",
                "1",
            ],
            b"",
        ),
        (
            &[
                "token",
                "add",
                "DEV",
                "--key-description",
                "ucrypt:c",
                "--token-id",
                "5",
                "--unbound",
            ],
            b"",
        ),
        (
            &[
                "token",
                "add",
                "DEV",
                "--key-description",
                "ucrypt:d",
                "--token-id",
                "5",
            ],
            b"",
        ),
        (
            &[
                "token",
                "add",
                "DEV",
                "--key-description",
                "ucrypt:e",
                "--token-id",
                "5",
                "--token-replace",
                "--key-slot",
                "0",
            ],
            b"",
        ),
        (
            &[
                "token",
                "add",
                "DEV",
                "--key-description",
                "ucrypt:f",
                "--key-slot",
                "7",
            ],
            b"",
        ),
        (
            &[
                "token",
                "add",
                "DEV",
                "--key-description",
                "ucrypt:g",
                "--token-id",
                "32",
            ],
            b"",
        ),
        (
            &["token", "add", "DEV", "--key-description", "ucrypt:h", "-v"],
            b"",
        ),
        // import: from a file, from standard input, at an id and assigned, bad JSON.
        (&["token", "import", "DEV", "--json-file", json], b""),
        (
            &[
                "token",
                "import",
                "DEV",
                "--token-id",
                "9",
                "--key-slot",
                "1",
                "-v",
            ],
            br#"{"type":"ucrypt-stdin","keyslots":[]}"#,
        ),
        (&["token", "import", "DEV", "--json-file", bad], b""),
        (
            &[
                "token",
                "import",
                "DEV",
                "--json-file",
                json,
                "--token-id",
                "9",
            ],
            b"",
        ),
        // export: standard output and a file; a free id.
        (&["token", "export", "DEV", "--token-id", "0"], b""),
        (
            &[
                "token",
                "export",
                "DEV",
                "--token-id",
                "9",
                "--json-file",
                "OUT",
            ],
            b"",
        ),
        (&["token", "export", "DEV", "--token-id", "20"], b""),
        // unassign, twice (the second: not assigned).
        (
            &[
                "token",
                "unassign",
                "DEV",
                "--token-id",
                "0",
                "--key-slot",
                "0",
            ],
            b"",
        ),
        (
            &[
                "token",
                "unassign",
                "DEV",
                "--token-id",
                "0",
                "--key-slot",
                "0",
            ],
            b"",
        ),
        // remove, twice (the second: not in use), and an invalid id.
        (&["token", "remove", "DEV", "--token-id", "5", "-v"], b""),
        (&["token", "remove", "DEV", "--token-id", "5"], b""),
        (&["token", "remove", "DEV", "--token-id", "40"], b""),
        (&["token", "export", "DEV", "--token-id", "1"], b""),
    ];
    for (args, stdin) in steps {
        let (u, _) = step(dir, &ours, &theirs, args, stdin);
        if !u.status.success() {
            failures += 1;
            // One line, naming the problem; no panic, no errno clutter.
            let err = String::from_utf8_lossy(&u.stderr);
            assert!(
                err.starts_with("ucrypt: ") || err.contains("error:"),
                "{args:?}: {err}"
            );
            assert!(!err.contains("errno"), "{args:?}: {err}");
        }
    }
    // The table really exercised both outcomes.
    assert!(
        failures >= 12 && failures < steps.len(),
        "{failures} failures"
    );
    // Both headers now hold the same tokens: export every id the same.
    let meta: serde_json::Value = serde_json::from_str(&String::from_utf8_lossy(
        &cryptsetup(&["luksDump", "--dump-json-metadata", &ours], b"").stdout,
    ))
    .unwrap();
    let ids: Vec<String> = meta["tokens"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert!(ids.len() >= 4, "{ids:?}");
    for id in &ids {
        step(
            dir,
            &ours,
            &theirs,
            &["token", "export", "DEV", "--token-id", id],
            b"",
        );
    }
    // LUKS1 has no tokens: both refuse, with the same exit code.
    let img1 = luks_image(dir, "img1", "luks1");
    let (o1, t1) = copies(dir, &img1);
    let (u, _) = step(
        dir,
        &o1,
        &t1,
        &["token", "add", "DEV", "--key-description", "x"],
        b"",
    );
    assert!(!u.status.success());
}

/// `luksDump` text with what differs between two runs of the same operation removed:
/// salts, digests and their continuation lines, the header's own path; with `costs`, also
/// benchmarked PBKDF costs.
fn normalized_dump(path: &str, costs: bool) -> String {
    let out = cryptsetup(&["luksDump", path], b"");
    let text = String::from_utf8_lossy(&out.stdout).replace(path, "IMG");
    let mut keep = Vec::new();
    let mut in_hex = false;
    for line in text.lines() {
        let t = line.trim();
        let hex_only = !t.is_empty()
            && t.split(' ')
                .all(|w| w.len() == 2 && w.bytes().all(|b| b.is_ascii_hexdigit()));
        if in_hex && hex_only {
            continue;
        }
        in_hex = false;
        let key = t.split(':').next().unwrap_or("");
        if matches!(key, "Salt" | "Digest" | "MK digest" | "MK salt") {
            in_hex = true;
            continue;
        }
        if costs
            && matches!(
                key,
                "Iterations" | "MK iterations" | "Memory" | "Threads" | "Time cost"
            )
        {
            continue;
        }
        keep.push(line.to_string());
    }
    format!("exit {:?}\n{}", out.status.code(), keep.join("\n"))
}

/// Which keyslot each known secret opens now (cryptsetup's own check), one line each.
fn unlock_matrix(dir: &Path, dev: &str, hdr: Option<&str>) -> String {
    let mut lines = Vec::new();
    for secret in ["pass", "pass2", "newpass", "new3"] {
        let f = dir.join(secret);
        let mut args = vec!["open", "--test-passphrase", "-v", "--key-file"];
        let f = f.to_str().unwrap();
        args.push(f);
        if let Some(h) = hdr {
            args.extend(["--header", h]);
        }
        args.push(dev);
        let out = cryptsetup(&args, b"");
        lines.push(format!(
            "{secret}: {:?} {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).trim()
        ));
    }
    lines.join("\n")
}

/// Every key-file, keyslot, PBKDF, --header and --test-passphrase option cryptsetup has on
/// a command that needs no kernel, run by ucrypt on one copy and cryptsetup on another:
/// same exit code, same standard output (paths and `OUT` files compared too), the same
/// header (luksDump without salts and digests) and the same secrets opening the same
/// keyslots afterwards.
#[test]
fn keyfile_keyslot_pbkdf_and_header_options_do_what_cryptsetups_do() {
    if !require("cryptsetup") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let base2 = luks_image(dir, "base2", "luks2");
    let base1 = luks_image(dir, "base1", "luks1");
    // A detached-header volume: header file and data image, "pw" in keyslot 0.
    let (hdr_base, data_base) = (dir.join("hdr_base"), dir.join("data_base"));
    std::fs::File::create(&data_base)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let out = cryptsetup(
        &[
            "luksFormat",
            "-q",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            dir.join("pass").to_str().unwrap(),
            "--header",
            hdr_base.to_str().unwrap(),
            data_base.to_str().unwrap(),
        ],
        b"",
    );
    assert!(out.status.success(), "{out:?}");
    // Secrets: "pw2" inside a key file at offset 4, "NEW" at offset 3, a whole new one.
    std::fs::write(dir.join("kf"), "XXXXpw2YYYY").unwrap();
    std::fs::write(dir.join("kfnew"), "abcNEWxyz").unwrap();
    std::fs::write(dir.join("new3"), "NEW").unwrap();
    std::fs::write(dir.join("newpass"), "NEWPASS").unwrap();
    // The volume key of base2 (and one that is not).
    let vk = dir.join("vk");
    let out = cryptsetup(
        &[
            "luksDump",
            "-q",
            "--dump-volume-key",
            "--volume-key-file",
            vk.to_str().unwrap(),
            "--key-file",
            dir.join("pass").to_str().unwrap(),
            base2.to_str().unwrap(),
        ],
        b"",
    );
    assert!(out.status.success(), "{out:?}");
    let mut bad = std::fs::read(&vk).unwrap();
    bad[0] ^= 1;
    std::fs::write(dir.join("badvk"), bad).unwrap();
    // The key with bytes after it (cryptsetup reads the key's length) and cut short.
    let good = std::fs::read(&vk).unwrap();
    std::fs::write(dir.join("longvk"), [&good[..], b"trailing bytes"].concat()).unwrap();
    std::fs::write(dir.join("shortvk"), &good[..16]).unwrap();
    let f = |n: &str| dir.join(n).display().to_string();
    let (pass, pass2, kf, kfnew, newpass) =
        (f("pass"), f("pass2"), f("kf"), f("kfnew"), f("newpass"));
    let (vk, badvk, longvk, shortvk) = (f("vk"), f("badvk"), f("longvk"), f("shortvk"));
    let fast = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
    let argon = [
        "--pbkdf",
        "argon2id",
        "--pbkdf-memory",
        "32768",
        "--pbkdf-parallel",
        "1",
        "--pbkdf-force-iterations",
        "4",
    ];
    // (image: 2 = LUKS2, 1 = LUKS1, 0 = detached header; costs benchmarked; arguments).
    let kf_pw2 = [
        "--key-file",
        kf.as_str(),
        "--keyfile-offset",
        "4",
        "--keyfile-size",
        "3",
    ];
    let rows: Vec<(u8, bool, Vec<&str>)> = vec![
        // luksAddKey
        (
            2,
            false,
            [
                &[
                    "luksAddKey",
                    "-q",
                    "DEV",
                    newpass.as_str(),
                    "--key-file",
                    pass.as_str(),
                ][..],
                &fast,
            ]
            .concat(),
        ),
        (
            1,
            false,
            [
                &["luksAddKey", "-q", "DEV", "--new-keyfile", newpass.as_str()][..],
                &kf_pw2,
                &fast,
            ]
            .concat(),
        ),
        (
            2,
            false,
            [
                &[
                    "luksAddKey",
                    "-q",
                    "DEV",
                    "--new-keyfile",
                    kfnew.as_str(),
                    "--new-keyfile-offset",
                    "3",
                    "--new-keyfile-size",
                    "3",
                    "--key-file",
                    pass.as_str(),
                    "-S",
                    "5",
                ][..],
                &fast,
            ]
            .concat(),
        ),
        (
            2,
            false,
            [
                &[
                    "luksAddKey",
                    "DEV",
                    "--new-keyfile",
                    newpass.as_str(),
                    "--key-file",
                    pass.as_str(),
                    "-S",
                    "4",
                ][..],
                &fast,
            ]
            .concat(),
        ),
        (
            2,
            false,
            [
                &[
                    "luksAddKey",
                    "-q",
                    "DEV",
                    "--key-slot",
                    "1",
                    "--new-key-slot",
                    "6",
                    "--key-file",
                    pass2.as_str(),
                    "--new-keyfile",
                    newpass.as_str(),
                ][..],
                &fast,
            ]
            .concat(),
        ),
        (
            2,
            false,
            [
                &[
                    "luksAddKey",
                    "-q",
                    "DEV",
                    "--key-slot",
                    "0",
                    "--new-key-slot",
                    "6",
                    "--key-file",
                    pass2.as_str(),
                    "--new-keyfile",
                    newpass.as_str(),
                ][..],
                &fast,
            ]
            .concat(),
        ),
        (
            2,
            false,
            [
                &[
                    "luksAddKey",
                    "-q",
                    "DEV",
                    "--volume-key-file",
                    vk.as_str(),
                    "--new-keyfile",
                    newpass.as_str(),
                ][..],
                &fast,
            ]
            .concat(),
        ),
        (
            2,
            false,
            [
                &[
                    "luksAddKey",
                    "-q",
                    "DEV",
                    "--volume-key-file",
                    badvk.as_str(),
                    "--new-keyfile",
                    newpass.as_str(),
                ][..],
                &fast,
            ]
            .concat(),
        ),
        (
            2,
            false,
            [
                &[
                    "luksAddKey",
                    "-q",
                    "DEV",
                    "--volume-key-file",
                    longvk.as_str(),
                    "--new-keyfile",
                    newpass.as_str(),
                ][..],
                &fast,
            ]
            .concat(),
        ),
        (
            2,
            false,
            [
                &[
                    "luksAddKey",
                    "-q",
                    "DEV",
                    "--volume-key-file",
                    shortvk.as_str(),
                    "--new-keyfile",
                    newpass.as_str(),
                ][..],
                &fast,
            ]
            .concat(),
        ),
        (
            2,
            false,
            [
                &[
                    "luksAddKey",
                    "-q",
                    "-v",
                    "DEV",
                    newpass.as_str(),
                    "--key-file",
                    pass.as_str(),
                ][..],
                &fast,
            ]
            .concat(),
        ),
        (
            2,
            false,
            [
                &[
                    "luksAddKey",
                    "-q",
                    "DEV",
                    newpass.as_str(),
                    "--key-file",
                    pass.as_str(),
                ][..],
                &argon,
            ]
            .concat(),
        ),
        (
            2,
            true,
            vec![
                "luksAddKey",
                "-q",
                "DEV",
                newpass.as_str(),
                "--key-file",
                pass.as_str(),
                "--pbkdf",
                "pbkdf2",
                "--iter-time",
                "50",
            ],
        ),
        (
            2,
            true,
            vec![
                "luksAddKey",
                "-q",
                "DEV",
                newpass.as_str(),
                "--key-file",
                pass.as_str(),
                "--pbkdf",
                "argon2id",
                "--iter-time",
                "200",
                "--pbkdf-memory",
                "32768",
            ],
        ),
        (
            2,
            false,
            [
                &[
                    "luksAddKey",
                    "-q",
                    "DEV",
                    newpass.as_str(),
                    "--key-file",
                    pass.as_str(),
                    "--keyfile-size",
                    "1",
                ][..],
                &fast,
            ]
            .concat(),
        ),
        (
            0,
            false,
            [
                &[
                    "luksAddKey",
                    "-q",
                    "DEV",
                    "--header",
                    "HDR",
                    newpass.as_str(),
                    "--key-file",
                    pass.as_str(),
                ][..],
                &fast,
            ]
            .concat(),
        ),
        // luksChangeKey
        (
            2,
            false,
            [
                &[
                    "luksChangeKey",
                    "-q",
                    "DEV",
                    newpass.as_str(),
                    "--key-file",
                    pass.as_str(),
                ][..],
                &fast,
            ]
            .concat(),
        ),
        (
            1,
            false,
            [
                &[
                    "luksChangeKey",
                    "-q",
                    "-v",
                    "DEV",
                    kfnew.as_str(),
                    "--new-keyfile-offset",
                    "3",
                    "--new-keyfile-size",
                    "3",
                ][..],
                &kf_pw2,
                &fast,
            ]
            .concat(),
        ),
        (
            2,
            false,
            [
                &[
                    "luksChangeKey",
                    "-q",
                    "DEV",
                    newpass.as_str(),
                    "-S",
                    "0",
                    "--key-file",
                    pass2.as_str(),
                ][..],
                &fast,
            ]
            .concat(),
        ),
        (
            2,
            false,
            [
                &[
                    "luksChangeKey",
                    "-q",
                    "DEV",
                    newpass.as_str(),
                    "--key-file",
                    pass.as_str(),
                ][..],
                &argon,
            ]
            .concat(),
        ),
        (
            0,
            false,
            [
                &[
                    "luksChangeKey",
                    "-q",
                    "DEV",
                    "--header",
                    "HDR",
                    newpass.as_str(),
                    "--key-file",
                    pass.as_str(),
                ][..],
                &fast,
            ]
            .concat(),
        ),
        // luksConvertKey
        (
            2,
            false,
            [
                &["luksConvertKey", "-q", "DEV", "--key-file", pass.as_str()][..],
                &argon,
            ]
            .concat(),
        ),
        (
            2,
            false,
            [
                &["luksConvertKey", "-q", "DEV", "-S", "1"][..],
                &kf_pw2,
                &argon,
            ]
            .concat(),
        ),
        (
            2,
            false,
            [
                &[
                    "luksConvertKey",
                    "-q",
                    "DEV",
                    "-S",
                    "1",
                    "--key-file",
                    pass.as_str(),
                ][..],
                &fast,
            ]
            .concat(),
        ),
        (
            2,
            false,
            [
                &[
                    "luksConvertKey",
                    "-q",
                    "DEV",
                    "-S",
                    "5",
                    "--key-file",
                    pass.as_str(),
                ][..],
                &fast,
            ]
            .concat(),
        ),
        (
            1,
            false,
            [
                &["luksConvertKey", "-q", "DEV", "--key-file", pass.as_str()][..],
                &fast,
            ]
            .concat(),
        ),
        // luksRemoveKey, luksKillSlot
        (
            2,
            false,
            [&["luksRemoveKey", "-q", "DEV"][..], &kf_pw2].concat(),
        ),
        (1, false, vec!["luksRemoveKey", "-q", "DEV", pass.as_str()]),
        (
            2,
            false,
            vec![
                "luksRemoveKey",
                "-q",
                "DEV",
                "--key-file",
                pass.as_str(),
                "--keyfile-offset",
                "1",
            ],
        ),
        (
            0,
            false,
            vec![
                "luksRemoveKey",
                "-q",
                "DEV",
                "--header",
                "HDR",
                "--key-file",
                pass.as_str(),
            ],
        ),
        (
            2,
            false,
            [&["luksKillSlot", "DEV", "0"][..], &kf_pw2].concat(),
        ),
        (1, false, vec!["luksKillSlot", "-q", "DEV", "1"]),
        (
            2,
            false,
            vec!["luksKillSlot", "DEV", "1", "--key-file", pass2.as_str()],
        ),
        // luksDump --dump-volume-key
        (
            2,
            false,
            [&["luksDump", "-q", "DEV", "--dump-volume-key"][..], &kf_pw2].concat(),
        ),
        (
            1,
            false,
            vec![
                "luksDump",
                "-q",
                "DEV",
                "--dump-volume-key",
                "--key-file",
                pass.as_str(),
                "-S",
                "1",
            ],
        ),
        (
            2,
            false,
            vec![
                "luksDump",
                "-q",
                "DEV",
                "--dump-volume-key",
                "--key-file",
                pass.as_str(),
                "--volume-key-file",
                "OUT",
            ],
        ),
        (
            0,
            false,
            vec![
                "luksDump",
                "-q",
                "DEV",
                "--header",
                "HDR",
                "--dump-volume-key",
                "--key-file",
                pass.as_str(),
            ],
        ),
        // open --test-passphrase
        (
            2,
            false,
            [&["open", "--test-passphrase", "DEV"][..], &kf_pw2].concat(),
        ),
        (
            1,
            false,
            vec![
                "open",
                "--test-passphrase",
                "DEV",
                "--key-file",
                pass.as_str(),
                "--key-slot",
                "1",
            ],
        ),
        (
            2,
            false,
            vec![
                "open",
                "--test-passphrase",
                "DEV",
                "--key-file",
                pass.as_str(),
                "-S",
                "0",
            ],
        ),
        (
            0,
            false,
            vec![
                "open",
                "--test-passphrase",
                "DEV",
                "--header",
                "HDR",
                "--key-file",
                pass.as_str(),
            ],
        ),
        (
            0,
            false,
            vec![
                "open",
                "--test-passphrase",
                "DEV",
                "--header",
                "HDR",
                "--key-file",
                pass2.as_str(),
            ],
        ),
        // luksFormat with key-file options and keyslot choices.
        (
            2,
            false,
            [
                &[
                    "luksFormat",
                    "-q",
                    "DEV",
                    "--uuid",
                    "6e1b8dbf-0000-4000-8000-000000000001",
                    "-S",
                    "3",
                ][..],
                &kf_pw2,
                &fast,
            ]
            .concat(),
        ),
        (
            1,
            false,
            [
                &[
                    "luksFormat",
                    "-q",
                    "--type",
                    "luks1",
                    "DEV",
                    kfnew.as_str(),
                    "--keyfile-offset",
                    "3",
                    "--keyfile-size",
                    "3",
                    "--uuid",
                    "6e1b8dbf-0000-4000-8000-000000000002",
                ][..],
                &fast,
            ]
            .concat(),
        ),
        (
            2,
            false,
            [
                &[
                    "luksFormat",
                    "-q",
                    "DEV",
                    "--key-file",
                    pass.as_str(),
                    "--uuid",
                    "6e1b8dbf-0000-4000-8000-000000000003",
                ][..],
                &argon,
            ]
            .concat(),
        ),
        (
            0,
            false,
            [
                &[
                    "luksFormat",
                    "-q",
                    "DEV",
                    "--header",
                    "HDR",
                    "--key-file",
                    pass.as_str(),
                    "--uuid",
                    "6e1b8dbf-0000-4000-8000-000000000004",
                ][..],
                &fast,
            ]
            .concat(),
        ),
        // Unbound keyslots (luksAddKey --unbound, luksDump --unbound, open --unbound).
        (
            2,
            false,
            [
                &["luksAddKey", "-q", "DEV", "--unbound", "-s", "256"][..],
                &[newpass.as_str()],
                &fast,
            ]
            .concat(),
        ),
        (
            2,
            false,
            [
                &[
                    "luksAddKey",
                    "-q",
                    "DEV",
                    "--unbound",
                    "-s",
                    "512",
                    "--volume-key-file",
                    vk.as_str(),
                    // Positional: cryptsetup 2.6-2.8 read --unbound's new passphrase
                    // from it or standard input, never --new-keyfile (ucrypt takes both).
                    newpass.as_str(),
                    "-S",
                    "7",
                ][..],
                &fast,
            ]
            .concat(),
        ),
        (
            1,
            false,
            [
                &["luksAddKey", "-q", "DEV", "--unbound", "-s", "256"][..],
                &[newpass.as_str()],
                &fast,
            ]
            .concat(),
        ),
        (
            2,
            false,
            vec![
                "luksDump",
                "-q",
                "DEV",
                "--unbound",
                "-S",
                "0",
                "-d",
                pass.as_str(),
            ],
        ),
        (
            2,
            false,
            vec![
                "open",
                "--test-passphrase",
                "DEV",
                "--unbound",
                "-d",
                pass.as_str(),
            ],
        ),
        // An inactive keyslot: "No usable keyslot" (exit 1), not a wrong passphrase.
        (
            2,
            false,
            vec![
                "open",
                "--test-passphrase",
                "DEV",
                "-S",
                "20",
                "-d",
                pass.as_str(),
            ],
        ),
        // --keyslot-cipher / --keyslot-key-size on every keyslot writer (LUKS2 only).
        (
            2,
            false,
            [
                &[
                    "luksAddKey",
                    "-q",
                    "DEV",
                    newpass.as_str(),
                    "-d",
                    pass.as_str(),
                ][..],
                &["--keyslot-cipher", "aes-cbc-essiv:sha256"],
                &["--keyslot-key-size", "256"],
                &fast,
            ]
            .concat(),
        ),
        (
            1,
            false,
            [
                &[
                    "luksAddKey",
                    "-q",
                    "DEV",
                    newpass.as_str(),
                    "-d",
                    pass.as_str(),
                ][..],
                &["--keyslot-cipher", "aes-cbc-essiv:sha256"],
                &["--keyslot-key-size", "256"],
                &fast,
            ]
            .concat(),
        ),
        (
            2,
            false,
            [
                &[
                    "luksChangeKey",
                    "-q",
                    "DEV",
                    newpass.as_str(),
                    "-d",
                    pass.as_str(),
                ][..],
                &[
                    "--keyslot-cipher",
                    "aes-xts-plain64",
                    "--keyslot-key-size",
                    "256",
                ],
                &fast,
            ]
            .concat(),
        ),
        (
            2,
            false,
            [
                &["luksConvertKey", "-q", "DEV", "-d", pass.as_str()][..],
                &["--keyslot-cipher", "aes-cbc-essiv:sha256"],
                &["--keyslot-key-size", "256"],
                &argon,
            ]
            .concat(),
        ),
        (
            2,
            false,
            [
                &["luksFormat", "-q", "DEV", "-d", pass.as_str()][..],
                &["--uuid", "6e1b8dbf-0000-4000-8000-000000000005"],
                &["--keyslot-cipher", "aes-cbc-essiv:sha256"],
                &["--keyslot-key-size", "256"],
                &fast,
            ]
            .concat(),
        ),
        // luksFormat's metadata sizes and volume key source; --force-password (no quality
        // check to disable in ucrypt); --test-args runs nothing.
        (
            2,
            false,
            [
                &["luksFormat", "-q", "DEV", "-d", pass.as_str()][..],
                &["--uuid", "6e1b8dbf-0000-4000-8000-000000000006"],
                &[
                    "--luks2-metadata-size",
                    "64K",
                    "--luks2-keyslots-size",
                    "8M",
                ],
                &["--use-urandom", "--force-password"],
                &fast,
            ]
            .concat(),
        ),
        (
            2,
            false,
            [
                &["luksFormat", "-q", "DEV", "-d", pass.as_str()][..],
                &["--luks2-metadata-size", "5K"],
                &fast,
            ]
            .concat(),
        ),
        (
            1,
            false,
            [
                &[
                    "luksFormat",
                    "-q",
                    "--type",
                    "luks1",
                    "DEV",
                    "-d",
                    pass.as_str(),
                ][..],
                &["--luks2-keyslots-size", "8M"],
                &fast,
            ]
            .concat(),
        ),
        (
            2,
            false,
            [
                &[
                    "luksAddKey",
                    "-q",
                    "DEV",
                    newpass.as_str(),
                    "-d",
                    pass.as_str(),
                ][..],
                &["--force-password"],
                &fast,
            ]
            .concat(),
        ),
        (
            2,
            false,
            vec![
                "--test-args",
                "luksFormat",
                "-q",
                "DEV",
                "-d",
                pass.as_str(),
            ],
        ),
        // Global options before the action: a prompt timeout (key files are not timed),
        // no kernel keyring for volume keys, no token plugins, the memory-hard PBKDF lock.
        (
            2,
            false,
            [
                &[
                    "-t",
                    "5",
                    "luksAddKey",
                    "-q",
                    "DEV",
                    newpass.as_str(),
                    "-d",
                    pass.as_str(),
                ][..],
                &fast,
            ]
            .concat(),
        ),
        (
            2,
            false,
            vec![
                "--disable-keyring",
                "open",
                "--test-passphrase",
                "DEV",
                "-d",
                pass.as_str(),
            ],
        ),
        (
            2,
            false,
            vec![
                "--disable-external-tokens",
                "open",
                "--test-passphrase",
                "DEV",
                "-d",
                pass2.as_str(),
            ],
        ),
        (
            2,
            false,
            vec![
                "open",
                "--test-passphrase",
                "--serialize-memory-hard-pbkdf",
                "DEV",
                "-d",
                pass.as_str(),
            ],
        ),
        // --header on the other header commands.
        (0, false, vec!["luksUUID", "DEV", "--header", "HDR"]),
        (0, false, vec!["isLuks", "DEV", "--header", "HDR"]),
        (0, false, vec!["luksDump", "DEV", "--header", "HDR"]),
        (
            0,
            false,
            vec![
                "luksHeaderBackup",
                "DEV",
                "--header",
                "HDR",
                "--header-backup-file",
                "OUT",
            ],
        ),
        (
            0,
            false,
            vec!["config", "DEV", "--header", "HDR", "--label", "detached"],
        ),
    ];
    let mut failed = 0;
    for (kind, costs, args) in &rows {
        let (src, hdr_src) = match kind {
            2 => (&base2, None),
            1 => (&base1, None),
            _ => (&data_base, Some(&hdr_base)),
        };
        let mk = |name: &str, from: &Path| {
            let p = dir.join(name);
            std::fs::copy(from, &p).unwrap();
            p.display().to_string()
        };
        let (ours, theirs) = (mk("ours", src), mk("theirs", src));
        let hdrs = hdr_src.map(|h| (mk("ours.hdr", h), mk("theirs.hdr", h)));
        let (out_u, out_c) = (f("out.ucrypt"), f("out.cryptsetup"));
        let _ = std::fs::remove_file(&out_u);
        let _ = std::fs::remove_file(&out_c);
        let argv = |dev: &str, hdr: Option<&String>, out: &str| -> Vec<String> {
            args.iter()
                .map(|a| match *a {
                    "DEV" => dev.to_string(),
                    "HDR" => hdr.cloned().unwrap_or_default(),
                    "OUT" => out.to_string(),
                    a => a.to_string(),
                })
                .collect()
        };
        let a_u = argv(&ours, hdrs.as_ref().map(|h| &h.0), &out_u);
        let a_c = argv(&theirs, hdrs.as_ref().map(|h| &h.1), &out_c);
        let u = ucrypt(&a_u.iter().map(String::as_str).collect::<Vec<_>>(), b"");
        let c = cryptsetup(&a_c.iter().map(String::as_str).collect::<Vec<_>>(), b"");
        let ctx = format!("{args:?}\nucrypt: {u:?}\ncryptsetup: {c:?}");
        assert_eq!(u.status.code(), c.status.code(), "exit codes differ: {ctx}");
        failed += usize::from(!u.status.success());
        let shown = |o: &Output, dev: &str, hdr: Option<&String>, out: &str| {
            let mut s = String::from_utf8_lossy(&o.stdout).replace(out, "OUT");
            if let Some(h) = hdr {
                s = s.replace(h.as_str(), "HDR");
            }
            s.replace(dev, "DEV")
        };
        assert_eq!(
            shown(&u, &ours, hdrs.as_ref().map(|h| &h.0), &out_u),
            shown(&c, &theirs, hdrs.as_ref().map(|h| &h.1), &out_c),
            "standard output differs: {ctx}"
        );
        assert_eq!(
            std::fs::read(&out_u).ok(),
            std::fs::read(&out_c).ok(),
            "OUT files differ: {ctx}"
        );
        let (hu, hc) = match &hdrs {
            Some((hu, hc)) => (hu.as_str(), hc.as_str()),
            None => (ours.as_str(), theirs.as_str()),
        };
        assert_eq!(
            normalized_dump(hu, *costs),
            normalized_dump(hc, *costs).replace(hc, hu),
            "headers differ: {ctx}"
        );
        assert_eq!(
            unlock_matrix(dir, &ours, hdrs.as_ref().map(|h| h.0.as_str())),
            unlock_matrix(dir, &theirs, hdrs.as_ref().map(|h| h.1.as_str())),
            "secrets open different keyslots: {ctx}"
        );
    }
    // Both outcomes were exercised: refusals (wrong keyslot, wrong key, inactive slot)
    // and successes.
    assert!(
        (8..rows.len() - 30).contains(&failed),
        "{failed} of {} rows failed",
        rows.len()
    );
}

/// Runs `keyctl ARGS`, returning its trimmed stdout.
fn keyctl(args: &[&str]) -> String {
    let out = std::process::Command::new("keyctl")
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "keyctl {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Opening through LUKS2 tokens (`--token-only`, `--token-id`, `--token-type`, and the
/// token tried before the passphrase): a `luks2-keyring` token added by ucrypt, its
/// passphrase put in the kernel keyring with keyctl; ucrypt and cryptsetup must agree on
/// every exit code, and ucrypt's table line through the token must equal the one through
/// the passphrase.
#[test]
fn tokens_open_what_cryptsetup_opens_with_them() {
    if !require("cryptsetup") || !require("keyctl") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let img = luks_image(dir, "img", "luks2");
    let img = img.to_str().unwrap();
    let pass = dir.join("pass");
    let pass = pass.to_str().unwrap();
    let desc = format!("ucrypt-test:{}", std::process::id());
    let out = ucrypt(
        &["token", "add", img, "--key-description", &desc, "-S", "0"],
        b"",
    );
    assert!(out.status.success(), "{out:?}");
    let both = |args: &[&str]| {
        let mut a = args.to_vec();
        a.push(img);
        let u = ucrypt(&a, b"");
        let c = cryptsetup(&a, b"");
        assert_eq!(
            u.status.code(),
            c.status.code(),
            "{args:?}\nucrypt: {u:?}\ncryptsetup: {c:?}"
        );
        u.status.code()
    };
    let tp = ["open", "--test-passphrase"];
    // No key in the keyring: --token-only fails; without it the key file still opens.
    assert_ne!(both(&[&tp[..], &["--token-only"]].concat()), Some(0));
    assert_eq!(both(&[&tp[..], &["--key-file", pass]].concat()), Some(0));
    // The right passphrase in the keyring.
    let id = keyctl(&["add", "user", &desc, "pw", "@u"]);
    let cases: &[&[&str]] = &[
        &["--token-only"],
        &["--token-only", "--token-id", "0"],
        &["--token-only", "--token-id", "1"],
        &["--token-only", "--token-type", "luks2-keyring"],
        &["--token-only", "--token-type", "systemd-tpm2"],
        &["--token-only", "--key-slot", "1"],
    ];
    let mut opened = 0;
    for extra in cases {
        opened += usize::from(both(&[&tp[..], extra].concat()) == Some(0));
    }
    assert_eq!(opened, 4, "the token opens through the keyring");
    // Through the token, the same table line as through the passphrase.
    let by_token = ucrypt(
        &[
            "luksOpen",
            img,
            "--print-table",
            "--showkeys",
            "--token-only",
        ],
        b"",
    );
    let by_pass = ucrypt(
        &[
            "luksOpen",
            img,
            "--print-table",
            "--showkeys",
            "--key-file",
            pass,
        ],
        b"",
    );
    assert!(by_token.status.success(), "{by_token:?}");
    assert_eq!(by_token.stdout, by_pass.stdout);
    // luksAddKey unlocks through the token too (cryptsetup 2.6's --token-*): each tool adds
    // a passphrase to its own copy without being given the existing one, and the new
    // passphrase opens the copy.
    let (ours, theirs) = copies(dir, std::path::Path::new(img));
    let newpass = dir.join("newpass");
    std::fs::write(&newpass, b"new passphrase").unwrap();
    let newpass = newpass.to_str().unwrap();
    for (dev, out) in [
        (
            &ours,
            ucrypt(
                &[
                    "luksAddKey",
                    "--token-only",
                    "--pbkdf",
                    "pbkdf2",
                    "--pbkdf-force-iterations",
                    "1000",
                    ours.as_str(),
                    newpass,
                ],
                b"",
            ),
        ),
        (
            &theirs,
            cryptsetup(
                &[
                    "luksAddKey",
                    "--token-only",
                    "--pbkdf",
                    "pbkdf2",
                    "--pbkdf-force-iterations",
                    "1000",
                    theirs.as_str(),
                    newpass,
                ],
                b"",
            ),
        ),
    ] {
        assert!(out.status.success(), "{dev}: {out:?}");
        let check = cryptsetup(
            &[
                "open",
                "--test-passphrase",
                "--key-file",
                newpass,
                dev.as_str(),
            ],
            b"",
        );
        assert!(check.status.success(), "{dev}: {check:?}");
    }
    // A wrong passphrase in the keyring: the token opens nothing.
    keyctl(&["update", &id, "wrong"]);
    assert_ne!(both(&[&tp[..], &["--token-only"]].concat()), Some(0));
    let add = ["luksAddKey", "--token-only", img, newpass];
    assert_eq!(
        ucrypt(&add, b"").status.code(),
        cryptsetup(&add, b"").status.code(),
        "luksAddKey --token-only with a token that unlocks nothing"
    );
    assert_eq!(both(&[&tp[..], &["--key-file", pass]].concat()), Some(0));
    keyctl(&["unlink", &id, "@u"]);
}

/// `luksAddKey --new-token-id N`: the new keyslot's passphrase comes from token N (a
/// `luks2-keyring` token whose key is in the kernel keyring) and the token is assigned to
/// it, as cryptsetup does on a copy of the same image (same exit code and header); then
/// `--link-vk-to-keyring` (cryptsetup 2.7's) puts the volume key cryptsetup dumps into the
/// keyring.
#[test]
fn new_token_id_and_link_vk_to_keyring_use_the_kernel_keyring() {
    if !require("cryptsetup") || !require("keyctl") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let img = luks_image(dir, "img", "luks2");
    let (ours, theirs) = copies(dir, &img);
    let pass = dir.join("pass").display().to_string();
    let desc = format!("ucrypt-newtoken:{}", std::process::id());
    for (prog, dev) in [("ucrypt", &ours), ("cryptsetup", &theirs)] {
        let args = [
            "token",
            "add",
            dev.as_str(),
            "--key-description",
            &desc,
            "--unbound",
        ];
        let out = if prog == "ucrypt" {
            ucrypt(&args, b"")
        } else {
            cryptsetup(&args, b"")
        };
        assert!(out.status.success(), "{prog}: {out:?}");
    }
    let id = keyctl(&["add", "user", &desc, "tokpw", "@u"]);
    let fast = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
    // Same exit code and header (but the new keyslot's salt) in both.
    let both = |extra: &[&str]| {
        let run_on = |dev: &str, ucrypt_side: bool| {
            let args = [&["luksAddKey", "-q", dev][..], extra, &fast].concat();
            if ucrypt_side {
                ucrypt(&args, b"")
            } else {
                cryptsetup(&args, b"")
            }
        };
        let (u, c) = (run_on(&ours, true), run_on(&theirs, false));
        assert_eq!(u.status.code(), c.status.code(), "{extra:?}\n{u:?}\n{c:?}");
        assert_eq!(
            normalized_dump(&ours, false),
            normalized_dump(&theirs, false).replace(&theirs, &ours),
            "{extra:?}"
        );
        u
    };
    let u = both(&["--new-token-id", "0", "-d", &pass]);
    assert!(u.status.success(), "{u:?}");
    // The token now opens the new keyslot (2) in both.
    for (prog, dev) in [("ucrypt", &ours), ("cryptsetup", &theirs)] {
        let args = [
            "open",
            "--test-passphrase",
            "--token-only",
            "-v",
            dev.as_str(),
        ];
        let out = if prog == "ucrypt" {
            ucrypt(&args, b"")
        } else {
            cryptsetup(&args, b"")
        };
        assert!(out.status.success(), "{prog}: {out:?}");
    }
    // A token that does not exist: the same refusal, nothing written.
    let u = both(&["--new-token-id", "5", "-d", &pass]);
    assert!(!u.status.success(), "{u:?}");
    keyctl(&["unlink", &id, "@u"]);

    // --link-vk-to-keyring: the key in the keyring is the one cryptsetup dumps.
    let vk = dir.join("vk");
    let out = cryptsetup(
        &[
            "luksDump",
            "-q",
            "--dump-volume-key",
            "--volume-key-file",
            vk.to_str().unwrap(),
            "-d",
            &pass,
            &theirs,
        ],
        b"",
    );
    assert!(out.status.success(), "{out:?}");
    let vk_desc = format!("ucrypt-vk:{}", std::process::id());
    let spec = format!("@u::{vk_desc}");
    for cmd in ["luksOpen", "open"] {
        let out = ucrypt(
            &[
                cmd,
                "--test-passphrase",
                &ours,
                "-d",
                &pass,
                "--link-vk-to-keyring",
                &spec,
            ],
            b"",
        );
        assert!(out.status.success(), "{cmd}: {out:?}");
        let key_id = keyctl(&["search", "@u", "user", &vk_desc]);
        let linked = std::process::Command::new("keyctl")
            .args(["pipe", &key_id])
            .output()
            .unwrap();
        keyctl(&["unlink", &key_id, "@u"]);
        assert_eq!(linked.stdout, std::fs::read(&vk).unwrap(), "{cmd}");
    }
    // A malformed value and a keyring that does not exist: exit 1, nothing linked.
    for bad in ["@u:vk", "no-such-keyring-ucrypt::vk"] {
        let out = ucrypt(
            &[
                "open",
                "--test-passphrase",
                &ours,
                "-d",
                &pass,
                "--link-vk-to-keyring",
                bad,
            ],
            b"",
        );
        assert_eq!(out.status.code(), Some(1), "{bad}: {out:?}");
    }
}

/// `--debug`: libcryptsetup's and ucrypt's debug lines on stderr, each starting with `# `,
/// never the passphrase or the volume key; standard output as without it; `--timeout`,
/// `--disable-keyring`, `--disable-external-tokens` are accepted before or after the
/// action; `--external-tokens-path` is refused with its reason on libcryptsetup 2.6.
#[test]
fn debug_lines_go_to_stderr_without_secrets() {
    if !require("cryptsetup") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let img = luks_image(dir, "img", "luks2");
    let img = img.to_str().unwrap();
    let pass = dir.join("pass").display().to_string();
    let vk = dir.join("vk");
    let out = ucrypt(
        &[
            "luksDump",
            "-q",
            "--dump-volume-key",
            "--volume-key-file",
            vk.to_str().unwrap(),
            "-d",
            &pass,
            img,
        ],
        b"",
    );
    assert!(out.status.success(), "{out:?}");
    let key_hex: String = std::fs::read(&vk)
        .unwrap()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    // Standard output is what it is without --debug.
    let dump = ucrypt(&["luksDump", img], b"");
    let dump_debug = ucrypt(&["luksDump", "--debug", img], b"");
    assert!(dump.status.success(), "{dump:?}");
    assert_eq!(dump.stdout, dump_debug.stdout);
    // --debug implies --verbose (isLuks -v: "Command successful.").
    let is = ucrypt(&["isLuks", img], b"");
    let is_v = ucrypt(&["isLuks", "-v", img], b"");
    let is_debug = ucrypt(&["--debug", "isLuks", img], b"");
    assert_eq!(is_debug.stdout, is_v.stdout);
    assert_ne!(is.stdout, is_v.stdout);
    let args = ["open", "--test-passphrase", "-d", &pass, img];
    let debug = ucrypt(&[&["--debug"][..], &args].concat(), b"");
    assert!(debug.status.success(), "{debug:?}");
    let err = String::from_utf8_lossy(&debug.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert!(lines.len() > 10, "{err}");
    assert!(lines.iter().all(|l| l.starts_with("# ")), "{err}");
    assert!(lines[0].contains("processing"), "{err}");
    assert!(
        err.contains("Trying to open and read device") || err.contains("Allocating context"),
        "no libcryptsetup lines: {err}"
    );
    let compact: String = err.split_whitespace().collect::<Vec<_>>().join("");
    assert!(!compact.contains(&key_hex[..16]), "the volume key: {err}");
    assert!(
        !err.contains("\"pw\"") && !err.lines().any(|l| l.ends_with(" pw")),
        "{err}"
    );
    // --table's key is hidden in the command line line.
    let t = format!("0 8 crypt aes-xts-plain64 {key_hex} 0 {img} 32768");
    let out = ucrypt(&["--debug", "table", "--table", &t], b"");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--table <hidden>"), "{err}");
    assert!(!err.contains(&key_hex), "{err}");
    // Global options on either side of the action.
    for args in [
        &["-t", "3", "--disable-keyring", "isLuks", img][..],
        &["isLuks", img, "--timeout", "3", "--disable-external-tokens"][..],
    ] {
        let out = ucrypt(args, b"");
        assert!(out.status.success(), "{args:?}: {out:?}");
    }
    let out = ucrypt(&["--external-tokens-path", "/tmp", "isLuks", img], b"");
    if out.status.success() {
        // libcryptsetup 2.7 or later: the path was set.
        return;
    }
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs libcryptsetup 2.7"),
        "{out:?}"
    );
}
