//! The unlock policy through the library alone, with a scripted [`Prompt`]: what is asked
//! for, how often, in which order tokens, key files and passphrases are tried, what
//! `--test-passphrase` gives, and the kinds of the errors (which the command turns into
//! cryptsetup's exit codes). LUKS2 images are made here with libcryptsetup (PBKDF2, 1000
//! iterations); TCRYPT images are cryptsetup's own test suite's
//! (`testdata/peer-tests/cryptsetup/tcrypt-images.tar.xz`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use ucrypt::unlock::{KeyFile, Outcome, Prompt, Request, Secret, Step, TcryptInputs, Tokens};
use ucrypt::{ErrorKind, VolumeType};
use ucrypt_cryptsetup::CryptDevice;

/// A prompt that answers from a script and records what it was asked and told.
#[derive(Default)]
struct Script {
    answers: VecDeque<&'static [u8]>,
    /// Whether a wrong passphrase may be asked for again.
    typed: bool,
    /// What `--key-file -` reads.
    stdin: Option<&'static [u8]>,
    asked: Vec<String>,
    notices: Vec<String>,
    steps: Vec<Step>,
    searches: usize,
}

impl Script {
    fn typing(answers: &[&'static [u8]]) -> Script {
        Script {
            answers: answers.iter().copied().collect(),
            typed: true,
            ..Script::default()
        }
    }
}

impl Prompt for Script {
    fn passphrase(&mut self, prompt: &str) -> ucrypt::Result<Secret> {
        self.asked.push(prompt.to_string());
        match self.answers.pop_front() {
            Some(a) => Ok(Secret::copy_of(a)),
            None => Err(ucrypt::Error::Invalid(
                "the script has no more answers".into(),
            )),
        }
    }

    fn interactive(&self) -> bool {
        self.typed
    }

    fn standard_input(&mut self) -> ucrypt::Result<Box<dyn std::io::Read + '_>> {
        Ok(Box::new(self.stdin.take().unwrap_or_default()))
    }

    fn notice(&mut self, text: &str) {
        self.notices.push(text.to_string());
    }

    fn busy(&mut self, step: Step) -> Box<dyn std::any::Any> {
        self.steps.push(step);
        Box::new(())
    }

    fn tcrypt_progress(&mut self, _device: &Path) -> ucrypt_format::tcrypt::SearchProgress {
        self.searches += 1;
        ucrypt_format::tcrypt::SearchProgress::default()
    }
}

const NO_KEY: &str = "No key available with this passphrase.";

fn request(img: &Path) -> Request {
    Request {
        kind: Some(VolumeType::Luks),
        ..Request::new(img)
    }
}

fn unlocked(o: Outcome) -> Box<ucrypt::Unlocked> {
    match o {
        Outcome::Unlocked(u, _) => u,
        Outcome::Checked => panic!("expected the volume, got Checked"),
    }
}

#[test]
fn a_wrong_passphrase_is_asked_again_within_tries() {
    let tmp = tempfile::tempdir().unwrap();
    let img = crate::common::luks_image(tmp.path(), true, 16 << 20, &[b"right"]);
    let mut p = Script::typing(&[b"wrong", b"right"]);
    let u = unlocked(request(&img).unlock(&mut p).unwrap());
    assert_eq!(u.slot, Some(0));
    let q = format!("Enter passphrase for {}: ", img.display());
    assert_eq!(p.asked, [q.clone(), q]);
    assert_eq!(p.notices, [NO_KEY]);
    assert_eq!(p.steps, [Step::KeyDerivation, Step::KeyDerivation]);
}

#[test]
fn tries_run_out_with_a_permission_error() {
    let tmp = tempfile::tempdir().unwrap();
    let img = crate::common::luks_image(tmp.path(), true, 16 << 20, &[b"right"]);
    let mut p = Script::typing(&[b"a", b"b", b"right"]);
    let r = Request {
        tries: 2,
        ..request(&img)
    };
    let e = r.unlock(&mut p).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Permission, "{e:#}");
    assert_eq!((p.asked.len(), p.notices.len()), (2, 1));

    // Nobody typing (a pipe, a script): one try, whatever --tries says.
    let mut piped = Script {
        typed: false,
        ..Script::typing(&[b"wrong", b"right"])
    };
    let e = request(&img).unlock(&mut piped).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Permission);
    assert_eq!((piped.asked.len(), piped.notices.len()), (1, 0));

    // Another failure is not retried: the prompt's own error ends the unlock.
    let mut silent = Script::typing(&[]);
    let e = request(&img).unlock(&mut silent).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid);
    assert_eq!(e.to_string(), "the script has no more answers");
}

#[test]
fn a_key_file_is_read_from_its_offset_for_its_size_and_asks_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let img = crate::common::luks_image(tmp.path(), true, 16 << 20, &[b"secret"]);
    let kf = tmp.path().join("key");
    std::fs::write(&kf, b"0123secret\nmore").unwrap();
    let with = |offset, size| Request {
        key: KeyFile {
            path: Some(kf.clone()),
            offset,
            size,
        },
        ..request(&img)
    };
    let mut p = Script::typing(&[b"never asked"]);
    let u = unlocked(with(4, 6).unlock(&mut p).unwrap());
    assert_eq!(u.slot, Some(0));
    assert!(p.asked.is_empty());
    // The newline is part of a key file (size 0: to the end); a key file is tried once.
    let e = with(4, 0).unlock(&mut p).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Permission);
    assert!(p.asked.is_empty() && p.notices.is_empty());
    // More than the file holds after the offset.
    let e = with(4, 100).unlock(&mut p).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid);
    assert!(
        e.to_string()
            .starts_with("cannot read 100 bytes from key file"),
        "{e}"
    );
    // `-` is the caller's standard input, read by the same rules.
    let mut stdin = Script {
        stdin: Some(b"xxsecretyy"),
        ..Script::default()
    };
    let r = Request {
        key: KeyFile {
            path: Some("-".into()),
            offset: 2,
            size: 6,
        },
        ..request(&img)
    };
    unlocked(r.unlock(&mut stdin).unwrap());
}

#[test]
fn a_keyslot_restriction_tries_that_keyslot_only() {
    let tmp = tempfile::tempdir().unwrap();
    let img = crate::common::luks_image(tmp.path(), true, 16 << 20, &[b"zero", b"one"]);
    let slot1 = Request {
        key_slot: Some(1),
        ..request(&img)
    };
    let mut p = Script::typing(&[b"zero", b"one"]);
    let u = unlocked(slot1.unlock(&mut p).unwrap());
    assert_eq!(u.slot, Some(1));
    assert_eq!(p.notices, [NO_KEY]);
    let mut q = Script::typing(&[b"one"]);
    assert_eq!(
        unlocked(request(&img).unlock(&mut q).unwrap()).slot,
        Some(1)
    );
}

#[test]
fn token_only_without_a_usable_token_asks_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let img = crate::common::luks_image(tmp.path(), true, 16 << 20, &[b"pw"]);
    let only = Request {
        tokens: Tokens {
            only: true,
            ..Tokens::default()
        },
        ..request(&img)
    };
    let mut p = Script::typing(&[b"pw"]);
    let e = only.unlock(&mut p).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid);
    assert_eq!(
        e.to_string(),
        format!("{} has no LUKS2 token (--token-only)", img.display())
    );
    assert!(p.asked.is_empty() && p.steps.is_empty());

    // A token whose passphrase is not in the kernel keyring: tried first, then the
    // passphrase is asked for; with --token-only the token's failure is the answer.
    let mut cd = CryptDevice::init(&img).unwrap();
    cd.load(None).unwrap();
    let id = cd
        .add_keyring_token(None, "ucrypt-unlock-test-absent-key")
        .unwrap();
    cd.assign_token(id, Some(0)).unwrap();
    drop(cd);
    let mut p = Script::typing(&[b"pw"]);
    unlocked(request(&img).unlock(&mut p).unwrap());
    assert_eq!(p.steps, [Step::Token, Step::KeyDerivation]);
    assert_eq!(p.asked.len(), 1);
    let mut p = Script::default();
    let e = only.unlock(&mut p).unwrap_err();
    assert!(
        format!("{e:#}").starts_with(&format!("no token unlocks {}", img.display())),
        "{e:#}"
    );
    assert!(p.asked.is_empty());
    // Tokens are LUKS2's: --token-only on another type is refused before anything.
    let plain = Request {
        kind: Some(VolumeType::Plain),
        ..only.clone()
    };
    let e = plain.unlock(&mut Script::default()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid);
}

#[test]
fn test_passphrase_checks_and_opens_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let img = crate::common::luks_image(tmp.path(), true, 16 << 20, &[b"pw"]);
    let test = Request {
        test_passphrase: true,
        ..request(&img)
    };
    let mut p = Script::typing(&[b"pw"]);
    assert!(matches!(test.unlock(&mut p).unwrap(), Outcome::Checked));
    // The keyslots are checked; no volume key derivation into a mapping.
    assert_eq!(p.steps, [Step::Passphrase]);
    let mut p = Script::typing(&[b"bad", b"pw"]);
    assert!(matches!(test.unlock(&mut p).unwrap(), Outcome::Checked));
    assert_eq!(p.notices, [NO_KEY]);
    // With the volume wanted as well (luksOpen --test-passphrase --print-table): unlocked.
    let both = Request {
        volume_wanted: true,
        ..test.clone()
    };
    let mut p = Script::typing(&[b"pw"]);
    assert_eq!(unlocked(both.unlock(&mut p).unwrap()).slot, Some(0));
    // Plain volumes have nothing to check a key against: refused before anything is asked.
    let plain = Request {
        kind: Some(VolumeType::Plain),
        ..test.clone()
    };
    let mut p = Script::typing(&[b"pw"]);
    let e = plain.unlock(&mut p).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid);
    assert!(e
        .to_string()
        .starts_with("option --test-passphrase is allowed only"));
    assert!(p.asked.is_empty());
}

#[test]
fn no_signature_and_no_type_is_refused_before_asking() {
    let tmp = tempfile::tempdir().unwrap();
    let img = ucrypt_testkit::image(tmp.path(), "blank", 1 << 20);
    let mut p = Script::typing(&[b"pw"]);
    let e = Request::new(&img).unlock(&mut p).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid);
    assert!(e.to_string().contains("no signature found"), "{e}");
    assert!(p.asked.is_empty());
    // --unbound is for LUKS only.
    let r = Request {
        kind: Some(VolumeType::Bitlk),
        test_passphrase: true,
        unbound: true,
        ..Request::new(&img)
    };
    assert_eq!(
        r.check().unwrap_err().to_string(),
        "option --unbound is allowed only for open of LUKS devices"
    );
}

/// cryptsetup's TCRYPT test images, extracted once per test binary.
fn tcrypt_images() -> Option<&'static Path> {
    static DIR: OnceLock<Option<tempfile::TempDir>> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = ucrypt_testkit::testdata("peer-tests/cryptsetup", "tcrypt-images.tar.xz")?;
        let dir = tempfile::tempdir().unwrap();
        let st = std::process::Command::new("tar")
            .arg("xJf")
            .arg(base.join("tcrypt-images.tar.xz"))
            .arg("-C")
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(st.success(), "extracting tcrypt-images.tar.xz");
        Some(dir)
    })
    .as_ref()
    .map(|d| d.path().join("tcrypt-images"))
    .map(|p| &*Box::leak(p.into_boxed_path()))
}

/// The FAT volume serial of a boot sector (`DEAD-BABE`).
fn fat_serial(volume: &dyn ucrypt_backend::Backend) -> String {
    let mut boot = [0u8; 512];
    volume.read_at(&mut boot, 0).unwrap();
    let at = if &boot[0x52..0x57] == b"FAT32" {
        0x43
    } else {
        0x27
    };
    let s = u32::from_le_bytes(boot[at..at + 4].try_into().unwrap());
    format!("{:04X}-{:04X}", s >> 16, s & 0xffff)
}

fn tcrypt(img: PathBuf, hash: &str) -> Request {
    Request {
        kind: Some(VolumeType::Tcrypt),
        plain: ucrypt::unlock::PlainInputs {
            hash: Some(hash.into()),
            cipher: Some("aes".into()),
            ..Default::default()
        },
        ..Request::new(img)
    }
}

#[test]
fn tcrypt_searches_the_hidden_header_with_the_second_passphrase() {
    let Some(dir) = tcrypt_images() else { return };
    let r = Request {
        tcrypt: TcryptInputs {
            veracrypt: false,
            hidden: true,
            ..TcryptInputs::default()
        },
        ..tcrypt(dir.join("tc_2-ripemd160-cbc-aes-hidden"), "ripemd160")
    };
    // The outer volume's passphrase finds no hidden header; the hidden one's does.
    let mut p = Script::typing(&[b"aaaaaaaaaaaa", b"bbbbbbbbbbbb"]);
    let u = unlocked(r.unlock(&mut p).unwrap());
    assert_eq!(p.notices, [NO_KEY]);
    assert_eq!(p.steps, [Step::TcryptSearch, Step::TcryptSearch]);
    assert_eq!(p.searches, 2);
    let volume = ucrypt::open_unlocked(*u, ucrypt::OpenOptions::default()).unwrap();
    assert_eq!(fat_serial(&*volume), "CAFE-BABE");
    // The outer passphrase without --tcrypt-hidden: the outer volume.
    let outer = Request {
        tcrypt: TcryptInputs {
            veracrypt: false,
            ..TcryptInputs::default()
        },
        ..r.clone()
    };
    let mut p = Script::typing(&[b"aaaaaaaaaaaa"]);
    let u = unlocked(outer.unlock(&mut p).unwrap());
    let volume = ucrypt::open_unlocked(*u, ucrypt::OpenOptions::default()).unwrap();
    assert_eq!(fat_serial(&*volume), "DEAD-BABE");
}

#[test]
fn tcrypt_key_files_pim_and_a_passphrase_from_standard_input() {
    let Some(dir) = tcrypt_images() else { return };
    // --key-file names a TrueCrypt key file, --tcrypt-keyfile another; the passphrase is
    // asked for.
    let r = Request {
        key: KeyFile {
            path: Some(dir.join("keyfile1")),
            ..KeyFile::default()
        },
        tcrypt: TcryptInputs {
            key_files: vec![dir.join("keyfile2")],
            ..TcryptInputs::default()
        },
        ..tcrypt(dir.join("tck_5-sha512-xts-aes"), "sha512")
    };
    let mut p = Script::typing(&[b"aaaaaaaaaaaa"]);
    let u = unlocked(r.unlock(&mut p).unwrap());
    assert_eq!(u.first_line().cipher.to_string(), "aes-xts-plain64");
    // A key file missing: the search fails, and a key file is tried once.
    let one = Request {
        tcrypt: TcryptInputs::default(),
        ..r.clone()
    };
    let mut p = Script::typing(&[b"aaaaaaaaaaaa", b"aaaaaaaaaaaa"]);
    assert_eq!(
        one.unlock(&mut p).unwrap_err().kind(),
        ErrorKind::Permission
    );
    assert_eq!(p.asked.len(), 1);

    // `--key-file -`: the passphrase is standard input (its last newline dropped); the
    // PIM is asked for after it.
    let pim = Request {
        key: KeyFile {
            path: Some("-".into()),
            ..KeyFile::default()
        },
        tcrypt: TcryptInputs {
            query_pim: true,
            ..TcryptInputs::default()
        },
        ..tcrypt(dir.join("vcpim_1_1234-sha256-xts-aes"), "sha256")
    };
    let mut p = Script {
        stdin: Some(b"cccccccccccccccccccc\n"),
        ..Script::typing(&[b"1234"])
    };
    let u = unlocked(pim.unlock(&mut p).unwrap());
    assert_eq!(p.asked, ["Enter VeraCrypt PIM: "]);
    let volume = ucrypt::open_unlocked(*u, ucrypt::OpenOptions::default()).unwrap();
    assert_eq!(fat_serial(&*volume), "DEAD-BABE");
    // cryptsetup's checks of a PIM, before any key derivation.
    for (answer, why) in [
        (&b"0"[..], "0"),
        (b"12x", "parse error"),
        (b"99999999999", "outside of range"),
    ] {
        let mut p = Script {
            stdin: Some(b"cccccccccccccccccccc\n"),
            ..Script::typing(&[answer])
        };
        let e = pim.unlock(&mut p).unwrap_err();
        assert_eq!(e.to_string(), format!("invalid PIM value: {why}"));
        assert!(p.steps.is_empty());
    }
}

#[test]
fn a_malformed_keyring_link_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let img = crate::common::luks_image(tmp.path(), true, 16 << 20, &[b"pw"]);
    let r = Request {
        link_vk_to_keyring: Some("no-separator".into()),
        ..request(&img)
    };
    let e = r.unlock(&mut Script::typing(&[b"pw"])).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid);
    assert_eq!(
        e.to_string(),
        "invalid --link-vk-to-keyring value (expected KEYRING::KEY)"
    );
}
