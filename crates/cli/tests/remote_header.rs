//! Header commands on remote NBD devices (`nbd+unix://`), served by nbdkit's file plugin
//! with its log filter, compared with cryptsetup run on a local copy of the same image:
//! every command's output and the image bytes after it, and every write the server saw
//! (each starts and ends on a byte that changed: only changed bytes go back).
//!
//! nbdkit and cryptsetup are required under `CI=true`; locally a missing tool skips.
#![allow(clippy::unwrap_used)]

mod common;

use common::nbd::require;
use common::CHEAP_PBKDF;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// nbdkit serving `img` on a unix socket (with the log filter), stopped on drop.
struct Nbdkit {
    child: Child,
    uri: String,
    log: PathBuf,
}

impl Nbdkit {
    fn start(dir: &Path, name: &str, img: &Path, read_only: bool) -> Nbdkit {
        let sock = dir.join(format!("{name}.sock"));
        let log = dir.join(format!("{name}.log"));
        // A socket left by an earlier server of that name would look like this one.
        let _ = std::fs::remove_file(&sock);
        let mut cmd = Command::new("nbdkit");
        cmd.args(["-f", "--exit-with-parent", "-U"])
            .arg(&sock)
            .arg("--filter=log");
        if read_only {
            cmd.arg("-r");
        }
        let child = cmd
            .arg("file")
            .arg(img)
            .arg(format!("logfile={}", log.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let up = (0..250).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            std::os::unix::net::UnixStream::connect(&sock).is_ok()
        });
        assert!(up, "nbdkit does not listen on {}", sock.display());
        Nbdkit {
            child,
            uri: format!("nbd+unix:///?socket={}", sock.display()),
            log,
        }
    }

    /// The (offset, count) of every write in the log since the last call.
    fn take_writes(&self) -> Vec<(u64, u64)> {
        let text = std::fs::read(&self.log).unwrap_or_default();
        std::fs::write(&self.log, b"").unwrap();
        let text = String::from_utf8_lossy(&text);
        let hex = |l: &str, key: &str| -> u64 {
            let v = l
                .split(key)
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap();
            u64::from_str_radix(v.trim_start_matches("0x"), 16).unwrap()
        };
        text.lines()
            .filter(|l| l.contains(" Write id=") && !l.contains("...Write"))
            .map(|l| (hex(l, "offset="), hex(l, "count=")))
            .collect()
    }
}

impl Drop for Nbdkit {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ucrypt(args: &[&str], stdin: &[u8]) -> Output {
    common::ucrypt(args, stdin)
}

fn cryptsetup(args: &[&str]) -> Output {
    Command::new("cryptsetup").args(args).output().unwrap()
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Asserts that every write starts and ends on a byte that differs between `before` and
/// `after`, and that every changed byte was written.
fn only_changed_bytes_written(writes: &[(u64, u64)], before: &[u8], after: &[u8], what: &str) {
    assert!(!writes.is_empty(), "{what}: nothing written");
    for &(o, n) in writes {
        let (s, e) = (o as usize, (o + n) as usize - 1);
        assert!(
            before[s] != after[s] && before[e] != after[e],
            "{what}: write {o}+{n} starts or ends on an unchanged byte"
        );
    }
    for (i, (b, a)) in before.iter().zip(after).enumerate() {
        if b != a {
            assert!(
                writes
                    .iter()
                    .any(|&(o, n)| (o..o + n).contains(&(i as u64))),
                "{what}: byte {i} changed but was not written"
            );
        }
    }
}

#[test]
fn luks_header_commands_on_an_nbd_uri_match_cryptsetup_on_a_local_copy() {
    if !require("cryptsetup") || !require("nbdkit") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let a = common::image(d, "a.img", 32 << 20);
    let b = d.join("b.img");
    let (ap, bp) = (a.to_str().unwrap(), b.to_str().unwrap());
    for (n, pw) in [("pw1", "first"), ("pw2", "second"), ("pw3", "third")] {
        std::fs::write(d.join(n), pw).unwrap();
    }
    let pw = |n: &str| d.join(n).to_str().unwrap().to_string();
    let mut args = vec!["luksFormat", "-q", "--type", "luks2", "--key-file"];
    let pw1 = pw("pw1");
    args.push(&pw1);
    args.extend(CHEAP_PBKDF);
    args.push(ap);
    ok(cryptsetup(&args), "cryptsetup luksFormat");
    std::fs::copy(&a, &b).unwrap();
    let srv = Nbdkit::start(d, "a", &a, false);
    let uri = srv.uri.as_str();

    // Read-only commands: same output and exit codes as cryptsetup, nothing written.
    assert_eq!(ucrypt(&["isLuks", uri], b"").status.code(), Some(0));
    for t in ["luks1", "luks2"] {
        assert_eq!(
            ucrypt(&["isLuks", "--type", t, uri], b"").status.code(),
            cryptsetup(&["isLuks", "--type", t, bp]).status.code(),
            "isLuks --type {t}"
        );
    }
    assert_eq!(
        ok(ucrypt(&["luksDump", uri], b""), "luksDump"),
        ok(cryptsetup(&["luksDump", bp]), "cryptsetup luksDump")
    );
    assert_eq!(
        ok(ucrypt(&["luksUUID", uri], b""), "luksUUID"),
        ok(cryptsetup(&["luksUUID", bp]), "cryptsetup luksUUID")
    );
    let hb_u = d.join("hb-ucrypt");
    let hb_c = d.join("hb-cryptsetup");
    ok(
        ucrypt(
            &[
                "luksHeaderBackup",
                uri,
                "--header-backup-file",
                hb_u.to_str().unwrap(),
            ],
            b"",
        ),
        "luksHeaderBackup",
    );
    ok(
        cryptsetup(&[
            "luksHeaderBackup",
            bp,
            "--header-backup-file",
            hb_c.to_str().unwrap(),
        ]),
        "cryptsetup luksHeaderBackup",
    );
    assert!(
        std::fs::read(&hb_u).unwrap() == std::fs::read(&hb_c).unwrap(),
        "header backups differ"
    );
    assert!(srv.take_writes().is_empty(), "read-only commands wrote");

    // luksUUID --uuid: the same bytes as cryptsetup's, and only the changed ones sent.
    let before = std::fs::read(&a).unwrap();
    let u = "11111111-2222-3333-4444-555555555555";
    ok(
        ucrypt(&["luksUUID", "-q", "--uuid", u, uri], b""),
        "luksUUID --uuid",
    );
    ok(
        cryptsetup(&["luksUUID", "-q", "--uuid", u, bp]),
        "cryptsetup luksUUID --uuid",
    );
    let after = std::fs::read(&a).unwrap();
    assert!(
        after == std::fs::read(&b).unwrap(),
        "luksUUID: images differ from cryptsetup's"
    );
    let writes = srv.take_writes();
    only_changed_bytes_written(&writes, &before, &after, "luksUUID");
    // Both binary headers (UUID, checksum, JSON), nothing else.
    assert!(writes.iter().all(|&(o, n)| o + n <= 32768), "{writes:?}");

    // luksAddKey: cryptsetup opens the new keyslot.
    let (pw2, pw3) = (pw("pw2"), pw("pw3"));
    let mut add = vec!["luksAddKey", "--key-file", &pw1];
    add.extend(CHEAP_PBKDF);
    add.extend([uri, &pw2]);
    ok(ucrypt(&add, b""), "luksAddKey");
    let test = |key: &str| {
        cryptsetup(&["open", "--test-passphrase", "--key-file", key, ap])
            .status
            .success()
    };
    assert!(
        test(&pw2),
        "cryptsetup does not open the keyslot ucrypt added remotely"
    );
    srv.take_writes();

    // luksKillSlot: the headers equal cryptsetup's; keyslot 1's area is wiped with random
    // bytes by both (so it differs), nothing else does.
    std::fs::copy(&a, &b).unwrap();
    let json: serde_json::Value = serde_json::from_str(&ok(
        cryptsetup(&["luksDump", "--dump-json-metadata", bp]),
        "cryptsetup luksDump --dump-json-metadata",
    ))
    .unwrap();
    let area = &json["keyslots"]["1"]["area"];
    let num = |v: &serde_json::Value| v.as_str().unwrap().parse::<usize>().unwrap();
    let (ko, kl) = (num(&area["offset"]), num(&area["size"]));
    let before = std::fs::read(&a).unwrap();
    ok(
        ucrypt(&["luksKillSlot", "-q", uri, "1"], b""),
        "luksKillSlot",
    );
    ok(
        cryptsetup(&["luksKillSlot", "-q", bp, "1"]),
        "cryptsetup luksKillSlot",
    );
    let (after, theirs) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    for (i, (x, y)) in after.iter().zip(&theirs).enumerate() {
        assert!(
            x == y || (ko..ko + kl).contains(&i),
            "luksKillSlot: byte {i} differs"
        );
    }
    assert!(
        after[ko..ko + kl] != before[ko..ko + kl],
        "keyslot 1 area not wiped"
    );
    only_changed_bytes_written(&srv.take_writes(), &before, &after, "luksKillSlot");
    assert!(!test(&pw2), "the killed keyslot still opens");

    // luksChangeKey: the new passphrase opens, the old one no longer does.
    let mut change = vec!["luksChangeKey", "--key-file", &pw1];
    change.extend(CHEAP_PBKDF);
    change.extend([uri, &pw3]);
    ok(ucrypt(&change, b""), "luksChangeKey");
    assert!(test(&pw3) && !test(&pw1), "luksChangeKey");
    srv.take_writes();

    // luksHeaderRestore of cryptsetup's backup: the whole image equals cryptsetup's.
    std::fs::copy(&a, &b).unwrap();
    let before = std::fs::read(&a).unwrap();
    let hb = hb_c.to_str().unwrap();
    ok(
        ucrypt(
            &["luksHeaderRestore", "-q", uri, "--header-backup-file", hb],
            b"",
        ),
        "luksHeaderRestore",
    );
    ok(
        cryptsetup(&["luksHeaderRestore", "-q", bp, "--header-backup-file", hb]),
        "cryptsetup luksHeaderRestore",
    );
    let after = std::fs::read(&a).unwrap();
    assert!(
        after == std::fs::read(&b).unwrap(),
        "luksHeaderRestore differs"
    );
    only_changed_bytes_written(&srv.take_writes(), &before, &after, "luksHeaderRestore");
    assert!(test(&pw1) && !test(&pw3), "restored header");

    // luksRemoveKey of the last keyslot (confirmed): cryptsetup no longer opens it.
    ok(
        ucrypt(&["luksRemoveKey", "-q", "--key-file", &pw1, uri], b""),
        "luksRemoveKey",
    );
    assert!(!test(&pw1), "luksRemoveKey");

    // luksFormat --type luks1 over it: cryptsetup reads a LUKS1 header that opens.
    let mut fmt = vec!["luksFormat", "-q", "--type", "luks1", "--key-file", &pw2];
    fmt.extend(CHEAP_PBKDF);
    fmt.push(uri);
    ok(ucrypt(&fmt, b""), "luksFormat");
    assert!(ok(cryptsetup(&["luksDump", ap]), "cryptsetup luksDump").contains("Version:       \t1"));
    assert!(
        test(&pw2),
        "cryptsetup does not open the remote luksFormat's keyslot"
    );
    // LUKS1's dump names the device: the URI where cryptsetup names the path.
    assert_eq!(
        ok(ucrypt(&["luksDump", uri], b""), "luksDump LUKS1"),
        ok(cryptsetup(&["luksDump", ap]), "cryptsetup luksDump LUKS1").replace(ap, uri)
    );
    drop(srv);

    // A server that is not there: exit 4 (wrong device), as for a missing local device.
    let gone = format!("nbd+unix:///?socket={}", d.join("none.sock").display());
    let out = ucrypt(&["luksDump", &gone], b"");
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Extracts one member of a test-suite archive into `dir`.
fn extract(dir: &Path, archive: &str, member: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/peer-tests/cryptsetup")
        .join(archive);
    let st = Command::new("tar")
        .arg("-xJf")
        .arg(&src)
        .arg("-C")
        .arg(dir)
        .arg(member)
        .status()
        .unwrap();
    assert!(st.success(), "extracting {member} from {archive}");
    dir.join(member)
}

#[test]
fn bitlk_tcrypt_and_fvault2_dumps_on_an_nbd_uri_match_the_local_ones() {
    if !require("cryptsetup") || !require("nbdkit") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // BitLocker (and To Go, whose boot sector keeps the metadata offsets elsewhere):
    // libcryptsetup's dump, with the URI where cryptsetup names the local path.
    for (i, img) in [
        "bitlk-images/bitlk-aes-xts-128.img",
        "bitlk-images/bitlk-togo-aes-xts-128.img",
    ]
    .into_iter()
    .enumerate()
    {
        let local = extract(d, "bitlk-images.tar.xz", img);
        let srv = Nbdkit::start(d, &format!("bitlk{i}"), &local, true);
        let theirs = ok(
            cryptsetup(&["bitlkDump", local.to_str().unwrap()]),
            "cryptsetup bitlkDump",
        );
        let ours = ok(ucrypt(&["bitlkDump", &srv.uri], b""), "bitlkDump");
        assert_eq!(
            ours,
            theirs.replace(local.to_str().unwrap(), &srv.uri),
            "{img}"
        );
        std::fs::remove_file(&local).unwrap();
    }
    // TrueCrypt/VeraCrypt: the header decrypted from the remote copy equals the local
    // one (cryptsetup's tcryptDump needs the kernel's crypto API, absent here; ucrypt's
    // local dump is checked against cryptsetup's expectations in tests/tcrypt.rs).
    let img = "tcrypt-images/tc_3-sha512-xts-aes-hidden";
    let local = extract(d, "tcrypt-images.tar.xz", img);
    let srv = Nbdkit::start(d, "tcrypt", &local, true);
    for (pass, hidden) in [("aaaaaaaaaaaa", false), ("bbbbbbbbbbbb", true)] {
        let mut args = vec!["tcryptDump", "--key-file", "-"];
        if hidden {
            args.push("--tcrypt-hidden");
        }
        let mut l = args.clone();
        l.push(local.to_str().unwrap());
        args.push(&srv.uri);
        let theirs = ok(ucrypt(&l, pass.as_bytes()), "local tcryptDump");
        let ours = ok(ucrypt(&args, pass.as_bytes()), "remote tcryptDump");
        assert_eq!(ours, theirs.replace(local.to_str().unwrap(), &srv.uri));
    }
    assert!(srv.take_writes().is_empty());
    drop(srv);
    // FileVault2: the volume header, disk label and encrypted metadata blocks followed
    // over NBD; libcryptsetup's dump as cryptsetup prints it for the local image (a sparse
    // 512 MiB file of 52 KiB).
    let local = extract(d, "fvault2-images.tar.xz", "fvault2-images/small");
    let srv = Nbdkit::start(d, "fvault2", &local, true);
    let theirs = ok(
        cryptsetup(&["fvault2Dump", local.to_str().unwrap()]),
        "cryptsetup fvault2Dump",
    );
    let ours = ok(ucrypt(&["fvault2Dump", &srv.uri], b""), "fvault2Dump");
    assert_eq!(ours, theirs.replace(local.to_str().unwrap(), &srv.uri));
    assert!(srv.take_writes().is_empty());
}
