//! ucrypt against cryptsetup itself, for the actions and options that need no kernel: each
//! step runs on one copy of an image with ucrypt and on another with cryptsetup, and the
//! exit codes and what each prints (`luksDump`, `token export`) must agree.

#![allow(clippy::unwrap_used)]

mod common;

use common::require;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Runs `prog args` with `stdin`, in `dir`.
fn run(prog: &str, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(prog)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut sin = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    let feeder = std::thread::spawn(move || {
        let _ = std::io::Write::write_all(&mut sin, &data);
    });
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    out
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
