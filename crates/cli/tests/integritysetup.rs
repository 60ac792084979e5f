//! `ucrypt integritysetup dump|format` against what Linux and integritysetup 2.6.1 made
//! (testdata/integrity): `dump` prints what integritysetup printed for each of the 14 kernel
//! images; `format` gives the superblock fields the kernel chose for the same options and
//! size, and a device whose every block reads back (zeros, valid tags) through
//! `ucrypt-integrity`; refusals exit 1 with the reason.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use ucrypt_backend::{Backend, FileBackend, FileOptions};
use ucrypt_integrity::{Algorithm, IntegrityBackend, Options};
use zeroize::Zeroizing;

fn ucrypt(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ucrypt"))
        .args(args)
        .output()
        .unwrap()
}

fn data() -> Option<PathBuf> {
    let d = ucrypt_testkit::testdata("integrity", "README.md")?;
    ucrypt_testkit::require("xz").then_some(d)
}

fn unxz(src: &Path, dst: &Path) {
    let out = Command::new("xz").arg("-dc").arg(src).output().unwrap();
    assert!(out.status.success());
    std::fs::write(dst, out.stdout).unwrap();
}

#[test]
fn dump_prints_what_integritysetup_printed() {
    let Some(dir) = data() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        let Some(stem) = name.strip_suffix(".img.xz") else {
            continue;
        };
        let img = tmp.path().join(format!("{stem}.img"));
        unxz(&dir.join(&name), &img);
        let out = ucrypt(&["integritysetup", "dump", img.to_str().unwrap()]);
        assert!(out.status.success(), "{stem}: {out:?}");
        let want = std::fs::read_to_string(dir.join(format!("{stem}.dump"))).unwrap();
        let want = want.replacen("/dev/shm/integrity/check.img", img.to_str().unwrap(), 1);
        assert_eq!(String::from_utf8(out.stdout).unwrap(), want, "{stem}");
        n += 1;
    }
    assert_eq!(n, 20);
    let other = tmp.path().join("other.img");
    std::fs::write(&other, vec![0x55u8; 8192]).unwrap();
    let out = ucrypt(&["integritysetup", "dump", other.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a valid INTEGRITY device"));
}

#[test]
fn format_makes_what_the_kernel_makes() {
    let Some(dir) = data() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("u.img");
    std::fs::write(&img, vec![0xeeu8; 4 << 20]).unwrap();
    let key = dir.join("key32.bin");
    let out = ucrypt(&[
        "-q",
        "integritysetup",
        "format",
        img.to_str().unwrap(),
        "--integrity",
        "hmac-sha256",
        "--integrity-key-file",
        key.to_str().unwrap(),
        "--sector-size",
        "4096",
    ]);
    assert!(out.status.success(), "{out:?}");
    // The fields the kernel chose for hmac-sha256-4096-J (same size and options); the
    // salt is random.
    let ours = ucrypt(&["integritysetup", "dump", img.to_str().unwrap()]);
    let ours = String::from_utf8(ours.stdout).unwrap();
    let kernel = std::fs::read_to_string(dir.join("hmac-sha256-4096-J.dump")).unwrap();
    assert_eq!(
        ours.lines().skip(1).collect::<Vec<_>>(),
        kernel.lines().skip(1).collect::<Vec<_>>()
    );
    // Wiped: every block reads as zeros with a valid tag.
    let file: Arc<dyn Backend> = Arc::new(FileBackend::open(&img, FileOptions::default()).unwrap());
    let mut o = Options::new(Algorithm::HmacSha256);
    o.hash_key = Some(Zeroizing::new(std::fs::read(&key).unwrap()));
    o.read_only = true;
    let dev = IntegrityBackend::open(file, o).unwrap();
    let mut buf = vec![1u8; dev.info().size_bytes as usize];
    dev.read_at(&mut buf, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    // Refusals: no confirmation without a terminal, a hash without its key, journal
    // encryption, and `--integrity` outside integritysetup.
    for args in [
        vec!["integritysetup", "format", img.to_str().unwrap()],
        vec![
            "-q",
            "integritysetup",
            "format",
            img.to_str().unwrap(),
            "--integrity",
            "hmac-sha256",
        ],
        vec![
            "-q",
            "integritysetup",
            "format",
            img.to_str().unwrap(),
            "--journal-crypt",
            "aes",
        ],
        vec![
            "luksFormat",
            "-q",
            "--integrity",
            "hmac-sha256",
            img.to_str().unwrap(),
        ],
    ] {
        let out = ucrypt(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
    }
}

fn ucrypt_stdin(args: &[&str], input: &[u8]) -> Output {
    use std::io::Write;
    let mut c = Command::new(env!("CARGO_BIN_EXE_ucrypt"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = c.stdin.take().unwrap();
    stdin.write_all(input).unwrap();
    drop(stdin);
    c.wait_with_output().unwrap()
}

/// An `integrity` table line is served like any other target: `ucrypt read` of a kernel
/// image reads what the kernel read; `ucrypt write` then `read` through a journal-mode
/// line; a zeroed device is formatted by its first activation (the kernel does the same,
/// without wiping: unwritten blocks then fail); a tag size that is not the superblock's
/// is refused.
#[test]
fn an_integrity_table_line_is_served() {
    let Some(dir) = data() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("k.img");
    unxz(&dir.join("hmac-sha256-4096-J.img.xz"), &img);
    let key: String = (0u8..32).map(|b| format!("{b:02x}")).collect();
    let table = tmp.path().join("table");
    let line = |mode: &str, tag: &str| {
        format!(
            "0 7664 integrity {} 0 {tag} {mode} 2 block_size:4096 internal_hash:hmac(sha256):{key}",
            img.display()
        )
    };
    std::fs::write(&table, line("J", "32")).unwrap();
    let t = table.to_str().unwrap();
    let out = ucrypt(&["read", "--table-file", t]);
    assert!(out.status.success(), "{out:?}");
    use sha2::Digest;
    let got: String = sha2::Sha256::digest(&out.stdout)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let want = std::fs::read_to_string(dir.join("hmac-sha256-4096-J.sha256")).unwrap();
    assert_eq!(got, want.trim());
    let block = vec![0x42u8; 8192];
    let out = ucrypt_stdin(&["write", "--table-file", t, "--offset", "40960"], &block);
    assert!(out.status.success(), "{out:?}");
    let out = ucrypt(&[
        "read",
        "--table-file",
        t,
        "--offset",
        "40960",
        "--length",
        "8192",
    ]);
    assert!(out.status.success() && out.stdout == block, "{out:?}");
    std::fs::write(&table, line("J", "16")).unwrap();
    let out = ucrypt(&["read", "--table-file", t, "--length", "4096"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("tag size 16"));
    // A zeroed device: formatted on first use, as the kernel formats it.
    std::fs::write(&img, vec![0u8; 4 << 20]).unwrap();
    std::fs::write(&table, line("D", "32")).unwrap();
    let out = ucrypt_stdin(
        &["write", "--table-file", t, "--offset", "4096"],
        &block[..4096],
    );
    assert!(out.status.success(), "{out:?}");
    let dump = ucrypt(&["integritysetup", "dump", img.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&dump.stdout).contains("integrity_tag_size 32"));
    let out = ucrypt(&[
        "read",
        "--table-file",
        t,
        "--offset",
        "4096",
        "--length",
        "4096",
    ]);
    assert!(
        out.status.success() && out.stdout[..] == block[..4096],
        "{out:?}"
    );
    let out = ucrypt(&[
        "read",
        "--table-file",
        t,
        "--offset",
        "8192",
        "--length",
        "4096",
    ]);
    assert!(
        !out.status.success(),
        "an unwritten block of an unwiped device has no valid tag"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("integrity tag mismatch"));
}

/// `integritysetup open DEVICE -- --socket PATH` serves the device over NBD in the
/// foreground: qemu-img reads what the kernel read; with one tag byte flipped, the read
/// fails (EIO over NBD).
#[test]
fn open_serves_the_device_over_nbd() {
    let Some(dir) = data() else { return };
    if !ucrypt_testkit::require("qemu-img") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("k.img");
    unxz(&dir.join("hmac-sha256-4096-J.img.xz"), &img);
    let key = dir.join("key32.bin");
    let want = std::fs::read_to_string(dir.join("hmac-sha256-4096-J.sha256")).unwrap();
    for tamper in [false, true] {
        if tamper {
            // The tag of block 10: the first tag byte is after the superblock and the
            // one-section journal (8 + 264 sectors), 32 bytes a block.
            let mut bytes = std::fs::read(&img).unwrap();
            bytes[(8 + 264) * 512 + 10 * 32] ^= 1;
            std::fs::write(&img, bytes).unwrap();
        }
        let sock = tmp.path().join(format!("s{tamper}"));
        let mut server = Command::new(env!("CARGO_BIN_EXE_ucrypt"))
            .args(["integritysetup", "open", img.to_str().unwrap()])
            .args(["--integrity", "hmac-sha256", "--integrity-key-file"])
            .arg(&key)
            .args(["--", "--socket"])
            .arg(&sock)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        for _ in 0..100 {
            if sock.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let plain = tmp.path().join("plain");
        let out = Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "raw"])
            .arg(format!("nbd+unix:///?socket={}", sock.display()))
            .arg(&plain)
            .output()
            .unwrap();
        let _ = server.kill();
        let _ = server.wait();
        if tamper {
            assert!(!out.status.success(), "a tampered block read over NBD");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("Input/output error"), "{err}");
        } else {
            assert!(out.status.success(), "{out:?}");
            use sha2::Digest;
            let got: String = sha2::Sha256::digest(std::fs::read(&plain).unwrap())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            assert_eq!(got, want.trim());
        }
    }
}

/// `--journal-crypt`: a kernel image whose encrypted journal was left unflushed reads
/// through an `integrity` table line with `journal_crypt:ctr(aes):KEY` as the kernel read
/// it; `integritysetup format --journal-crypt ctr-aes` writes a volume that opens so; an
/// unknown cipher and `--integrity-inline` are refused by name with exit code 1.
#[test]
fn journal_crypt_is_served_and_unknown_ciphers_are_refused() {
    let Some(dir) = data() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("k.img");
    unxz(&dir.join("crc32c-512-jc-ctr-aes-Junflushed.img.xz"), &img);
    let jkey = dir.join("jckey32.bin");
    let hex: String = std::fs::read(&jkey)
        .unwrap()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let table = tmp.path().join("table");
    let size: u64 = std::fs::read_to_string(dir.join("crc32c-512-jc-ctr-aes-Junflushed.size"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    std::fs::write(
        &table,
        format!(
            "0 {} integrity {} 0 4 J 2 internal_hash:crc32c journal_crypt:ctr(aes):{hex}",
            size / 512,
            img.display()
        ),
    )
    .unwrap();
    let out = ucrypt(&["read", "--table-file", table.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    use sha2::Digest;
    let got: String = sha2::Sha256::digest(&out.stdout)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let want =
        std::fs::read_to_string(dir.join("crc32c-512-jc-ctr-aes-Junflushed.sha256")).unwrap();
    assert_eq!(got, want.trim(), "the replayed device");
    // ucrypt's own format with an encrypted journal.
    let u = tmp.path().join("u.img");
    std::fs::write(&u, vec![0u8; 4 << 20]).unwrap();
    let u = u.to_str().unwrap();
    let jk = jkey.to_str().unwrap();
    let out = ucrypt(&[
        "-q",
        "integritysetup",
        "format",
        u,
        "--journal-crypt",
        "ctr-aes",
        "--journal-crypt-key-file",
        jk,
        "--journal-crypt-key-size",
        "32",
    ]);
    assert!(out.status.success(), "{out:?}");
    let sb =
        ucrypt_format::integrity::Superblock::parse(&std::fs::read(u).unwrap()[..512]).unwrap();
    std::fs::write(
        &table,
        format!(
            "0 {} integrity {u} 0 4 J 2 internal_hash:crc32c journal_crypt:ctr(aes):{hex}",
            sb.provided_data_sectors
        ),
    )
    .unwrap();
    let out = ucrypt(&[
        "read",
        "--table-file",
        table.to_str().unwrap(),
        "--length",
        "4096",
    ]);
    assert!(
        out.status.success() && out.stdout == vec![0u8; 4096],
        "{out:?}"
    );
    // Without the journal's cipher: refused (no valid commit id), never garbage.
    std::fs::write(
        &table,
        format!(
            "0 {} integrity {u} 0 4 J 1 internal_hash:crc32c",
            sb.provided_data_sectors
        ),
    )
    .unwrap();
    let out = ucrypt(&[
        "read",
        "--table-file",
        table.to_str().unwrap(),
        "--length",
        "4096",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("commit id"),
        "{out:?}"
    );
    for (args, want) in [
        (
            vec!["--journal-crypt", "salsa20", "--journal-crypt-key-file", jk],
            "\"salsa20\" is not supported",
        ),
        (
            vec!["--integrity-inline"],
            "--integrity-inline is not supported",
        ),
    ] {
        for action in ["format", "open"] {
            let mut argv = vec!["-q", "integritysetup", action, u];
            argv.extend(args.iter());
            let out = ucrypt(&argv);
            assert_eq!(out.status.code(), Some(1), "{argv:?}: {out:?}");
            assert!(
                String::from_utf8_lossy(&out.stderr).contains(want),
                "{argv:?}: {out:?}"
            );
        }
    }
}

/// `integritysetup open`'s serving options and `ucrypt open`'s after `--` are one set of
/// options: one given on both sides, `--socket` with `--listen`, `--direct` with
/// `--buffered`, and `--socket-group` without `--socket` are refused with exit code 1 before anything is served; a
/// `--socket-group` after `--` belongs to integritysetup's `--socket`.
#[test]
fn open_options_before_and_after_the_separator_are_one_set() {
    let Some(dir) = data() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("k.img");
    unxz(&dir.join("crc32c-4096-J.img.xz"), &img);
    let img = img.to_str().unwrap();
    let a = tmp.path().join("a").display().to_string();
    let b = tmp.path().join("b").display().to_string();
    for (args, want) in [
        (
            vec!["--socket", &a, "--", "--socket", &b],
            "'--socket' cannot be used multiple times",
        ),
        (
            vec!["--run", "true", "--", "--run", "true"],
            "'--run' cannot be used multiple times",
        ),
        (
            vec!["--socket", &a, "--", "--listen", "127.0.0.1:0"],
            "cannot be used with",
        ),
        (vec!["--", "--socket-group", "0"], "--socket <PATH>"),
        (vec!["--direct", "--", "--buffered"], "cannot be used with"),
    ] {
        let out = ucrypt(&[&["integritysetup", "open", img][..], &args].concat());
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(
            !Path::new(&a).exists() && !Path::new(&b).exists(),
            "{args:?} served"
        );
    }
    // Accepted together (the group: the caller's own): --run's command sees the socket
    // integritysetup named.
    let gid = std::os::unix::fs::MetadataExt::gid(&std::fs::metadata(tmp.path()).unwrap());
    let out = ucrypt(&[
        "integritysetup",
        "open",
        img,
        "--socket",
        &a,
        "--run",
        "test -S \"$unixsocket\" && echo \"$unixsocket\"",
        "--",
        "--socket-group",
        &gid.to_string(),
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), a);
}
