//! loop-AES volumes against the real kernel: `testdata/loopaes/` holds images that
//! cryptsetup 2.6.1's `loopaesOpen` mapped through dm-crypt (Debian's 6.12 kernel, made by
//! its `make-images.sh` in the kernel lab), the tables the kernel loaded (`dmsetup table
//! --showkeys`) and the options that cryptsetup refused. For every case ucrypt must load
//! the same table (keys included), read the kernel's ciphertext back as `plain.bin`, and
//! write `plain.bin` into the same bytes; and refuse what cryptsetup refused.

#![allow(clippy::unwrap_used)]

mod common;
use common::*;
use std::path::Path;

/// One line of `cases.txt`: `N|KEYFILE|OPTIONS|TABLE` (the device field as `DEV`) or
/// `N|KEYFILE|OPTIONS|REFUSED rc=RC`.
struct Case {
    n: String,
    key: String,
    args: Vec<String>,
    table: Option<String>,
}

fn cases(dir: &Path) -> Vec<Case> {
    std::fs::read_to_string(dir.join("cases.txt"))
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.splitn(4, '|').collect();
            Case {
                n: f[0].to_string(),
                key: f[1].to_string(),
                args: f[2].split_whitespace().map(String::from).collect(),
                table: (!f[3].starts_with("REFUSED")).then(|| f[3].to_string()),
            }
        })
        .collect()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn loopaes_volumes_match_the_kernels_tables_and_bytes() {
    let Some(dir) = ucrypt_testkit::testdata("loopaes", "cases.txt") else {
        return;
    };
    let plain = std::fs::read(dir.join("plain.bin")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let all = cases(&dir);
    assert!(all.len() >= 12 && all.iter().filter(|c| c.table.is_none()).count() >= 2);
    for c in &all {
        let key = dir.join(&c.key);
        // A copy: the image is opened read-write, as cryptsetup's loopaesOpen does.
        let img = tmp.path().join(format!("img.{}", c.n));
        let mut args = vec!["loopaesOpen", "--key-file", key.to_str().unwrap()];
        args.extend(c.args.iter().map(String::as_str));
        let Some(kernel_table) = &c.table else {
            std::fs::write(&img, vec![0u8; 192 << 10]).unwrap();
            args.extend([img.to_str().unwrap(), "--print-table"]);
            let out = ucrypt(&args, b"");
            assert_eq!(
                out.status.code(),
                Some(1),
                "case {}: cryptsetup refused {:?}, ucrypt: {}",
                c.n,
                c.args,
                stderr(&out)
            );
            continue;
        };
        std::fs::copy(dir.join(format!("img.{}", c.n)), &img).unwrap();
        args.extend([img.to_str().unwrap(), "--print-table", "--showkeys"]);
        let out = ucrypt(&args, b"");
        assert!(out.status.success(), "case {}: {}", c.n, stderr(&out));
        let ours = String::from_utf8(out.stdout).unwrap();
        let ours = ours.trim();
        assert_eq!(
            ours.replace(img.to_str().unwrap(), "DEV"),
            *kernel_table,
            "case {} ({:?}): another table than the kernel's",
            c.n,
            c.args
        );
        // The kernel's ciphertext reads back as the plaintext written through dm-crypt.
        let out = ucrypt(&["read", "--table", ours, "--length", "131072"], b"");
        assert!(out.status.success(), "case {}: {}", c.n, stderr(&out));
        assert!(out.stdout == plain, "case {}: wrong plaintext", c.n);
        // And ucrypt writes the kernel's bytes.
        let fresh = tmp.path().join(format!("fresh.{}", c.n));
        std::fs::write(&fresh, vec![0u8; 192 << 10]).unwrap();
        let line = ours.replace(img.to_str().unwrap(), fresh.to_str().unwrap());
        let out = ucrypt(&["write", "--table", &line], &plain);
        assert!(out.status.success(), "case {}: {}", c.n, stderr(&out));
        assert!(
            std::fs::read(&fresh).unwrap() == std::fs::read(&img).unwrap(),
            "case {}: ucrypt's ciphertext differs from the kernel's",
            c.n
        );
    }
}

#[test]
fn loopaes_open_serves_the_plaintext_and_refuses_bad_inputs() {
    let Some(dir) = ucrypt_testkit::testdata("loopaes", "cases.txt") else {
        return;
    };
    if !ucrypt_testkit::require("nbdcopy") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("img");
    std::fs::copy(dir.join("img.3"), &img).unwrap();
    let back = tmp.path().join("back");
    let key = std::fs::read(dir.join("key_v3")).unwrap();
    // The key file on standard input, as from `gpg --decrypt KEYFILE |`.
    let cmd = format!(r#"nbdcopy "$uri" {}"#, back.display());
    let out = ucrypt(
        &[
            "loopaesOpen",
            "--key-file",
            "-",
            img.to_str().unwrap(),
            "--run",
            &cmd,
        ],
        &key,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let plain = std::fs::read(dir.join("plain.bin")).unwrap();
    assert!(std::fs::read(&back).unwrap()[..plain.len()] == plain[..]);
    // No key file: the keys cannot be typed.
    let out = ucrypt(&["open", "--type", "loopaes", img.to_str().unwrap()], b"");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("--key-file"), "{}", stderr(&out));
    // A GPG-encrypted key file is named as such, with the pipe that decrypts it.
    let gpg = tmp.path().join("key.gpg");
    std::fs::write(&gpg, b"-----BEGIN PGP MESSAGE-----\n\nhQEMA\n").unwrap();
    let out = ucrypt(
        &[
            "loopaesOpen",
            "--key-file",
            gpg.to_str().unwrap(),
            img.to_str().unwrap(),
            "--print-table",
        ],
        b"",
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("gpg --decrypt"), "{}", stderr(&out));
}
