//! The LUKS header commands' policy through the library alone (`ucrypt::luks::{keyslots,
//! tokens, header, dump}`), with a scripted [`Prompt`]: which keyslot is meant, that the
//! existing passphrase is checked before a new one is asked for, what is refused and with
//! which kind of error, the last-keyslot rule, what is confirmed before a key is shown. LUKS2 and LUKS1 images are made here with libcryptsetup (PBKDF2, 1000
//! iterations); each outcome is checked on the header itself.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use ucrypt::luks::keyslots::{
    self, AddKey, AddUnbound, ChangeKey, ConvertKey, KeyslotCipher, KillSlot, PbkdfChoice,
    RemoveKey,
};
use ucrypt::luks::{CryptDevice, KeyslotStatus};
use ucrypt::prompt::{Prompt, Step};
use ucrypt::secret::Secret;
use ucrypt::unlock::KeyFile;
use ucrypt::{ErrorKind, VolumeType};

/// A prompt that answers from a script and records what it was asked and told.
#[derive(Default)]
struct Script {
    answers: VecDeque<&'static [u8]>,
    /// Whether the last keyslot may go.
    confirm: bool,
    asked: Vec<String>,
    confirmations: Vec<String>,
    info: Vec<String>,
    steps: Vec<Step>,
    writes: Vec<(Step, PathBuf)>,
}

impl Script {
    fn answering(answers: &[&'static [u8]]) -> Script {
        Script {
            answers: answers.iter().copied().collect(),
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

    fn confirm_destroy(&mut self, question: &str, refusal: &str) -> ucrypt::Result<()> {
        self.confirmations.push(question.to_string());
        if self.confirm {
            Ok(())
        } else {
            Err(ucrypt::Error::Invalid(refusal.into()).with_kind(ErrorKind::Permission))
        }
    }

    fn info(&mut self, text: &str) {
        self.info.push(text.to_string());
    }

    fn busy(&mut self, step: Step) -> Box<dyn std::any::Any> {
        self.steps.push(step);
        Box::new(())
    }

    fn write_header(
        &mut self,
        step: Step,
        header: Option<&Path>,
        _min_len: u64,
        write: &mut dyn FnMut() -> ucrypt::Result<()>,
    ) -> ucrypt::Result<()> {
        // A write beside the header (a backup) is recorded with an empty path.
        self.writes
            .push((step, header.map(Path::to_path_buf).unwrap_or_default()));
        write()
    }
}

fn fast() -> PbkdfChoice {
    PbkdfChoice {
        kind: Some("pbkdf2".into()),
        iterations: Some(1000),
        ..PbkdfChoice::default()
    }
}

fn load(img: &Path) -> CryptDevice {
    let mut cd = ucrypt::header::crypt_device(img, None).unwrap();
    ucrypt::header::load_luks(&mut cd, VolumeType::Luks).unwrap();
    cd
}

/// The keyslot `pass` opens on the image as it is on disk now.
fn opens(img: &Path, pass: &[u8]) -> Option<u32> {
    load(img).check_passphrase(None, pass).ok()
}

fn key_file(dir: &Path, name: &str, content: &[u8]) -> KeyFile {
    let p = dir.join(name);
    std::fs::write(&p, content).unwrap();
    KeyFile {
        path: Some(p),
        ..KeyFile::default()
    }
}

fn add_key(img: &Path) -> AddKey {
    AddKey {
        device: img.to_path_buf(),
        kind: VolumeType::Luks,
        pbkdf: fast(),
        ..AddKey::default()
    }
}

#[test]
fn add_key_checks_the_existing_passphrase_before_asking_for_the_new_one() {
    let tmp = tempfile::tempdir().unwrap();
    let img = crate::common::luks_image(tmp.path(), true, 16 << 20, &[b"old"]);
    let mut p = Script::answering(&[b"wrong", b"new"]);
    let e = keyslots::add(&mut load(&img), &img, &add_key(&img), &mut p).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Permission, "{e:#}");
    assert_eq!(p.asked, ["Enter any existing passphrase: "]);
    assert!(p.writes.is_empty());
    assert_eq!(load(&img).keyslot_status(1), KeyslotStatus::Inactive);
    assert_eq!(opens(&img, b"new"), None);
}

#[test]
fn add_key_with_key_slot_alone_names_the_new_keyslot_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let img = crate::common::luks_image(tmp.path(), true, 16 << 20, &[b"old"]);
    let mut p = Script::answering(&[b"old", b"new"]);
    let o = AddKey {
        key_slot: Some(5),
        verbose: true,
        ..add_key(&img)
    };
    let slot = keyslots::add(&mut load(&img), &img, &o, &mut p).unwrap();
    assert_eq!(slot, 5);
    assert_eq!(
        p.asked,
        [
            "Enter any existing passphrase: ",
            "Enter new passphrase for key slot: "
        ]
    );
    assert_eq!(
        p.info,
        [
            "WARNING: The --key-slot parameter is used for new keyslot number.",
            "Key slot 0 unlocked."
        ]
    );
    assert_eq!(
        p.steps,
        [Step::Passphrase, Step::Benchmark],
        "the benchmark is announced, nothing else"
    );
    assert_eq!(p.writes, [(Step::AddKeyslot, img.clone())]);
    assert_eq!(opens(&img, b"new"), Some(5));
    assert_eq!(opens(&img, b"old"), Some(0));
}

#[test]
fn add_key_from_key_files_asks_nothing_and_batch_mode_warns_of_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let img = crate::common::luks_image(tmp.path(), true, 16 << 20, &[b"old"]);
    let mut p = Script::default();
    let o = AddKey {
        key: key_file(tmp.path(), "old", b"old"),
        new_key: key_file(tmp.path(), "new", b"new"),
        key_slot: Some(3),
        batch: true,
        verbose: true,
        ..add_key(&img)
    };
    assert_eq!(keyslots::add(&mut load(&img), &img, &o, &mut p).unwrap(), 3);
    assert!(p.asked.is_empty());
    // A key file's keyslot is not reported (cryptsetup reports a typed one only).
    assert!(p.info.is_empty(), "{:?}", p.info);
    assert_eq!(opens(&img, b"new"), Some(3));
}

#[test]
fn add_key_refuses_a_new_keyslot_out_of_range_before_asking() {
    let tmp = tempfile::tempdir().unwrap();
    let img = crate::common::luks_image(tmp.path(), true, 16 << 20, &[b"old"]);
    let mut p = Script::answering(&[b"old", b"new"]);
    let o = AddKey {
        new_key_slot: Some(40),
        ..add_key(&img)
    };
    let e = keyslots::add(&mut load(&img), &img, &o, &mut p).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid);
    assert_eq!(e.to_string(), "keyslot 40 is out of range for this header");
    assert!(p.asked.is_empty());
}

#[test]
fn add_key_with_a_volume_key_file_verifies_it() {
    let tmp = tempfile::tempdir().unwrap();
    let img = crate::common::luks_image(tmp.path(), true, 16 << 20, &[b"old"]);
    let wrong = tmp.path().join("wrong-vk");
    std::fs::write(&wrong, [7u8; 64]).unwrap();
    let o = AddKey {
        volume_key_file: Some(wrong),
        new_key: key_file(tmp.path(), "new", b"new"),
        ..add_key(&img)
    };
    let mut p = Script::default();
    let e = keyslots::add(&mut load(&img), &img, &o, &mut p).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Permission, "{e:#}");
    assert!(p.writes.is_empty());

    let (_, vk) = load(&img).volume_key(None, b"old").unwrap();
    let right = tmp.path().join("vk");
    std::fs::write(&right, vk.as_bytes()).unwrap();
    let o = AddKey {
        volume_key_file: Some(right),
        ..o
    };
    assert_eq!(keyslots::add(&mut load(&img), &img, &o, &mut p).unwrap(), 1);
    assert!(p.asked.is_empty(), "no existing passphrase is asked for");
    assert_eq!(opens(&img, b"new"), Some(1));
}

#[test]
fn keyslot_cipher_is_refused_on_luks1_before_any_passphrase() {
    let tmp = tempfile::tempdir().unwrap();
    let img = crate::common::luks_image(tmp.path(), false, 16 << 20, &[b"old"]);
    let mut p = Script::answering(&[b"old", b"new"]);
    let o = AddKey {
        keyslot_cipher: KeyslotCipher {
            cipher: Some(("aes-xts-plain64".into(), 512)),
        },
        ..add_key(&img)
    };
    let e = keyslots::add(&mut load(&img), &img, &o, &mut p).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid);
    assert!(e.to_string().contains("only for LUKS2"), "{e}");
    assert!(p.asked.is_empty());
}

#[test]
fn add_unbound_stores_a_keyslot_that_opens_no_segment() {
    let tmp = tempfile::tempdir().unwrap();
    let img = crate::common::luks_image(tmp.path(), true, 16 << 20, &[b"old"]);
    let mut p = Script::answering(&[b"unbound"]);
    let o = AddUnbound {
        key_bits: 256,
        pbkdf: fast(),
        ..AddUnbound::default()
    };
    let slot = keyslots::add_unbound(&mut load(&img), &img, &o, &mut p).unwrap();
    assert_eq!(slot, 1);
    assert_eq!(p.writes, [(Step::AddUnboundKeyslot, img.clone())]);
    assert_eq!(load(&img).keyslot_status(1), KeyslotStatus::Unbound);
}

#[test]
fn change_key_checks_the_old_passphrase_first_and_rewrites_its_keyslot() {
    let tmp = tempfile::tempdir().unwrap();
    let img = crate::common::luks_image(tmp.path(), true, 16 << 20, &[b"zero", b"one"]);
    let mut p = Script::answering(&[b"wrong", b"new"]);
    let o = ChangeKey {
        pbkdf: fast(),
        verbose: true,
        ..ChangeKey::default()
    };
    let e = keyslots::change(&mut load(&img), &img, &o, &mut p).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Permission);
    assert_eq!(p.asked, ["Enter passphrase to be changed: "]);

    let mut p = Script::answering(&[b"one", b"new"]);
    let slot = keyslots::change(&mut load(&img), &img, &o, &mut p).unwrap();
    assert_eq!(slot, 1);
    assert_eq!(p.info, ["Key slot 1 unlocked."]);
    assert_eq!(p.asked[1], "Enter new passphrase: ");
    assert_eq!(opens(&img, b"new"), Some(1));
    assert_eq!(opens(&img, b"one"), None);
    assert_eq!(opens(&img, b"zero"), Some(0));
}

#[test]
fn convert_key_refuses_an_inactive_keyslot_and_keeps_the_passphrase() {
    let tmp = tempfile::tempdir().unwrap();
    let img = crate::common::luks_image(tmp.path(), true, 16 << 20, &[b"pw"]);
    let mut p = Script::answering(&[b"pw"]);
    let o = ConvertKey {
        key_slot: Some(9),
        pbkdf: fast(),
        ..ConvertKey::default()
    };
    let e = keyslots::convert(&mut load(&img), &img, &o, &mut p).unwrap_err();
    assert_eq!(
        (e.kind(), e.to_string()),
        (ErrorKind::Invalid, "keyslot 9 is not active".into())
    );
    assert!(p.asked.is_empty());

    let o = ConvertKey {
        key_slot: Some(0),
        pbkdf: PbkdfChoice {
            iterations: Some(1001),
            ..fast()
        },
        ..o
    };
    assert_eq!(
        keyslots::convert(&mut load(&img), &img, &o, &mut p).unwrap(),
        0
    );
    assert_eq!(p.writes, [(Step::ConvertKeyslot, img.clone())]);
    assert_eq!(opens(&img, b"pw"), Some(0));
}

#[test]
fn the_last_keyslot_is_not_killed_without_confirmation() {
    let tmp = tempfile::tempdir().unwrap();
    let img = crate::common::luks_image(tmp.path(), true, 16 << 20, &[b"pw"]);
    let mut p = Script::default();
    let o = KillSlot {
        slot: 0,
        ..KillSlot::default()
    };
    let e = keyslots::kill(&mut load(&img), &o, &mut p).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Permission);
    assert_eq!(
        e.to_string(),
        "Operation aborted, the keyslot was NOT wiped."
    );
    assert_eq!(p.confirmations.len(), 1);
    assert_eq!(opens(&img, b"pw"), Some(0), "the keyslot is still there");

    // Confirmed by the caller, it goes.
    p.confirm = true;
    keyslots::kill(&mut load(&img), &o, &mut p).unwrap();
    assert_eq!(load(&img).keyslot_status(0), KeyslotStatus::Inactive);
}

#[test]
fn batch_mode_kills_the_last_keyslot_without_asking() {
    let tmp = tempfile::tempdir().unwrap();
    let img = crate::common::luks_image(tmp.path(), true, 16 << 20, &[b"pw"]);
    let mut p = Script::default();
    let o = KillSlot {
        slot: 0,
        batch: true,
        ..KillSlot::default()
    };
    keyslots::kill(&mut load(&img), &o, &mut p).unwrap();
    assert!(p.confirmations.is_empty() && p.asked.is_empty());
    assert_eq!(load(&img).keyslot_status(0), KeyslotStatus::Inactive);
}

#[test]
fn kill_slot_wants_a_passphrase_of_another_keyslot() {
    let tmp = tempfile::tempdir().unwrap();
    let img = crate::common::luks_image(tmp.path(), true, 16 << 20, &[b"zero", b"one"]);
    let o = KillSlot {
        slot: 1,
        ..KillSlot::default()
    };
    // The keyslot's own passphrase: refused, kept.
    let mut p = Script::answering(&[b"one"]);
    let e = keyslots::kill(&mut load(&img), &o, &mut p).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Permission);
    assert!(e.to_string().contains("opens keyslot 1 itself"), "{e}");
    assert_eq!(p.asked, ["Enter any remaining passphrase: "]);
    assert_eq!(opens(&img, b"one"), Some(1));
    // A wrong one: refused, kept.
    let mut p = Script::answering(&[b"nope"]);
    let e = keyslots::kill(&mut load(&img), &o, &mut p).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Permission);
    assert_eq!(opens(&img, b"one"), Some(1));
    // Out of range and inactive keyslots: invalid, nothing asked.
    for (slot, msg) in [
        (99, "key slot 99 is invalid"),
        (3, "keyslot 3 is not active"),
    ] {
        let mut p = Script::default();
        let e =
            keyslots::kill(&mut load(&img), &KillSlot { slot, ..o.clone() }, &mut p).unwrap_err();
        assert_eq!((e.kind(), e.to_string()), (ErrorKind::Invalid, msg.into()));
        assert!(p.asked.is_empty());
    }
    // Another keyslot's passphrase: it goes, not being the last no confirmation.
    let mut p = Script::answering(&[b"zero"]);
    keyslots::kill(&mut load(&img), &o, &mut p).unwrap();
    assert!(p.confirmations.is_empty());
    assert_eq!(opens(&img, b"one"), None);
    assert_eq!(opens(&img, b"zero"), Some(0));
}

#[test]
fn remove_key_removes_the_keyslot_of_the_passphrase_and_the_last_only_when_confirmed() {
    let tmp = tempfile::tempdir().unwrap();
    let img = crate::common::luks_image(tmp.path(), true, 16 << 20, &[b"zero", b"one"]);
    let mut p = Script::answering(&[b"one", b"zero", b"zero"]);
    let o = RemoveKey::default();
    assert_eq!(keyslots::remove(&mut load(&img), &o, &mut p).unwrap(), 1);
    assert!(p.confirmations.is_empty());
    assert_eq!(opens(&img, b"one"), None);

    let e = keyslots::remove(&mut load(&img), &o, &mut p).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Permission);
    assert_eq!(p.confirmations.len(), 1);
    assert_eq!(opens(&img, b"zero"), Some(0));

    p.confirm = true;
    assert_eq!(keyslots::remove(&mut load(&img), &o, &mut p).unwrap(), 0);
    assert_eq!(load(&img).keyslot_status(0), KeyslotStatus::Inactive);
    assert_eq!(p.asked, ["Enter passphrase to be deleted: "; 3]);
}

mod tokens {
    use super::*;
    use ucrypt::luks::tokens::{self, Action, Token};

    #[test]
    fn option_combinations_are_refused_before_the_device_is_read() {
        let cases = [
            (Action::Add, Token::default(), "--key-description"),
            (Action::Remove, Token::default(), "--token-id"),
            (Action::Export, Token::default(), "--token-id"),
            (
                Action::Import,
                Token {
                    unbound: true,
                    ..Token::default()
                },
                "--unbound is valid only",
            ),
            (
                Action::Unassign,
                Token {
                    id: Some(0),
                    ..Token::default()
                },
                "specific keyslot",
            ),
        ];
        for (action, t, says) in cases {
            let e = tokens::verify(action, &t).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Invalid);
            assert!(e.to_string().contains(says), "{action:?}: {e}");
        }
        let add = Token {
            key_description: Some("k".into()),
            ..Token::default()
        };
        tokens::verify(Action::Add, &add).unwrap();
    }

    #[test]
    fn add_assigns_export_reads_and_remove_removes() {
        let tmp = tempfile::tempdir().unwrap();
        let img = crate::common::luks_image(tmp.path(), true, 16 << 20, &[b"zero", b"one"]);
        let t = Token {
            key_description: Some("ucrypt:test".into()),
            key_slot: Some(1),
            ..Token::default()
        };
        let id = tokens::add(&mut load(&img), &t).unwrap();
        let json = tokens::export(&mut load(&img), id).unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["type"], "luks2-keyring");
        assert_eq!(v["key_description"], "ucrypt:test");
        assert_eq!(v["keyslots"], serde_json::json!(["1"]));
        // The id is taken now: refused without --token-replace.
        let again = Token { id: Some(id), ..t };
        let e = tokens::add(&mut load(&img), &again).unwrap_err();
        assert!(e.to_string().contains("in use"), "{e}");
        tokens::unassign(&mut load(&img), id, 1).unwrap();
        let e = tokens::unassign(&mut load(&img), id, 1).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("token {id} is not assigned to keyslot 1")
        );
        tokens::remove(&mut load(&img), id).unwrap();
        let e = tokens::export(&mut load(&img), id).unwrap_err();
        assert_eq!(e.to_string(), format!("token {id} is not in use"));
    }

    #[test]
    fn import_checks_the_target_before_reading_the_json() {
        let tmp = tempfile::tempdir().unwrap();
        let img = crate::common::luks_image(tmp.path(), true, 16 << 20, &[b"zero"]);
        let t = Token {
            key_slot: Some(4),
            ..Token::default()
        };
        let mut read = false;
        let e = tokens::import(&mut load(&img), &t, || {
            read = true;
            Ok(String::new())
        })
        .unwrap_err();
        assert_eq!(e.to_string(), "keyslot 4 is not active");
        assert!(!read, "the JSON is not read for a refused target");

        let json = r#"{"type":"ucrypt-test","keyslots":[]}"#;
        let t = Token {
            key_slot: Some(0),
            ..Token::default()
        };
        let id = tokens::import(&mut load(&img), &t, || Ok(json.into())).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&tokens::export(&mut load(&img), id).unwrap()).unwrap();
        assert_eq!(v["keyslots"], serde_json::json!(["0"]));
    }

    #[test]
    fn json_that_cannot_fit_a_header_or_is_not_text_is_refused() {
        let big = vec![b' '; usize::try_from(tokens::MAX_TOKEN_JSON).unwrap()];
        let e = tokens::read_json(&big[..], "big").unwrap_err();
        assert!(e.to_string().contains("4 MiB"), "{e}");
        let e = tokens::read_json(&[0xffu8, 0xfe][..], "bin").unwrap_err();
        assert!(e.to_string().contains("not text"), "{e}");
        assert_eq!(tokens::read_json(&b"{}"[..], "ok").unwrap(), "{}");
    }
}

mod header {
    use super::*;
    use ucrypt::luks::header::{self, Config};
    use ucrypt::luks::HeaderType;

    /// A prompt that refuses every confirmation and records the questions.
    #[derive(Default)]
    struct Refuse(Vec<String>);

    impl Prompt for Refuse {
        fn passphrase(&mut self, _prompt: &str) -> ucrypt::Result<Secret> {
            Err(ucrypt::Error::Invalid("no passphrase here".into()))
        }

        fn confirm(&mut self, question: &str) -> ucrypt::Result<()> {
            self.0.push(question.to_string());
            Err(ucrypt::Error::Invalid("not confirmed".into()))
        }
    }

    #[test]
    fn erase_and_convert_change_nothing_unless_confirmed() {
        let tmp = tempfile::tempdir().unwrap();
        let img = crate::common::luks_image(tmp.path(), false, 16 << 20, &[b"pw"]);
        let mut p = Refuse::default();
        header::erase(&mut load(&img), &img, false, &mut p).unwrap_err();
        assert_eq!(opens(&img, b"pw"), Some(0));
        header::convert(&mut load(&img), &img, HeaderType::Luks2, false, &mut p).unwrap_err();
        assert_eq!(load(&img).info().kind, Some(HeaderType::Luks1));
        assert_eq!(p.0.len(), 2);
        assert!(
            p.0[1].contains("In-place conversion to LUKS2"),
            "{}",
            p.0[1]
        );

        // Converting to what it is already is refused before asking.
        let e =
            header::convert(&mut load(&img), &img, HeaderType::Luks1, false, &mut p).unwrap_err();
        assert!(e.to_string().ends_with("is already LUKS1"), "{e}");
        assert_eq!(p.0.len(), 2);

        // Batch mode asks nothing.
        header::convert(&mut load(&img), &img, HeaderType::Luks2, true, &mut p).unwrap();
        assert_eq!(load(&img).info().kind, Some(HeaderType::Luks2));
        assert_eq!(opens(&img, b"pw"), Some(0));
        header::erase(&mut load(&img), &img, true, &mut p).unwrap();
        assert_eq!(opens(&img, b"pw"), None);
        assert_eq!(p.0.len(), 2);
    }

    #[test]
    fn config_needs_something_and_refuses_an_unknown_priority() {
        let tmp = tempfile::tempdir().unwrap();
        let img = crate::common::luks_image(tmp.path(), true, 16 << 20, &[b"pw"]);
        let e = header::config(&mut load(&img), &Config::default()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Invalid);
        let c = Config {
            label: Some("data".into()),
            priority: Some(("often".into(), 0)),
            ..Config::default()
        };
        let e = header::config(&mut load(&img), &c).unwrap_err();
        assert!(e.to_string().contains("unknown --priority"), "{e}");
        let c = Config {
            priority: Some(("prefer".into(), 0)),
            ..c
        };
        header::config(&mut load(&img), &c).unwrap();
        assert_eq!(load(&img).info().label.as_deref(), Some("data"));
    }

    #[test]
    fn a_restore_puts_back_the_keyslots_of_the_backup() {
        let tmp = tempfile::tempdir().unwrap();
        let img = crate::common::luks_image(tmp.path(), true, 16 << 20, &[b"pw"]);
        let backup = tmp.path().join("hdr");
        let mut p = Script::default();
        header::backup(&mut load(&img), &backup, &mut p).unwrap();
        assert_eq!(p.writes, [(Step::BackupHeader, PathBuf::new())]);
        p.writes.clear();
        let mut q = Refuse::default();
        header::confirm_restore(&img, &backup, false, &mut q).unwrap_err();
        assert!(q.0[0].contains("will be overwritten"), "{}", q.0[0]);
        header::erase(&mut load(&img), &img, true, &mut q).unwrap();
        assert_eq!(opens(&img, b"pw"), None);
        let mut cd = ucrypt::header::crypt_device(&img, None).unwrap();
        header::restore(&mut cd, &img, &backup, &mut p).unwrap();
        assert_eq!(p.writes, [(Step::RestoreHeader, img.clone())]);
        assert_eq!(opens(&img, b"pw"), Some(0));
    }
}

mod dump {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use ucrypt::luks::dump::{self, Dump, Output};

    fn volume_key(img: &Path) -> Dump {
        Dump {
            device: img.to_path_buf(),
            volume_key: true,
            ..Dump::default()
        }
    }

    #[test]
    fn the_volume_key_is_shown_only_when_confirmed_and_unlocked() {
        let tmp = tempfile::tempdir().unwrap();
        let img = crate::common::luks_image(tmp.path(), true, 16 << 20, &[b"pw"]);
        // Not confirmed: no passphrase is even asked for.
        let mut p = Script::answering(&[b"pw"]);
        let Err(e) = dump::dump(&mut load(&img), &volume_key(&img), &mut p) else {
            panic!("dumped without confirmation");
        };
        assert!(e.to_string().contains("not confirmed"), "{e}");
        assert!(p.asked.is_empty());

        let batch = Dump {
            batch: true,
            ..volume_key(&img)
        };
        let mut p = Script::answering(&[b"nope"]);
        let Err(e) = dump::dump(&mut load(&img), &batch, &mut p) else {
            panic!("dumped with a wrong passphrase");
        };
        assert_eq!(e.kind(), ErrorKind::Permission);
        assert_eq!(
            p.asked,
            [format!("Enter passphrase for {}: ", img.display())]
        );

        let mut p = Script::answering(&[b"pw"]);
        let Ok(Output::VolumeKey(k)) = dump::dump(&mut load(&img), &batch, &mut p) else {
            panic!("no volume key");
        };
        let (_, want) = load(&img).volume_key(None, b"pw").unwrap();
        assert_eq!(k.key.unwrap().as_bytes(), want.as_bytes());
        assert_eq!((k.bits, k.info.cipher.as_str()), (512, "aes"));
        assert_eq!(p.steps, [Step::DumpVolumeKey]);
    }

    #[test]
    fn a_key_file_is_new_and_owner_read_only() {
        let tmp = tempfile::tempdir().unwrap();
        let img = crate::common::luks_image(tmp.path(), true, 16 << 20, &[b"pw"]);
        let f = tmp.path().join("vk");
        let d = Dump {
            batch: true,
            volume_key_file: Some(f.clone()),
            key: key_file(tmp.path(), "pass", b"pw"),
            ..volume_key(&img)
        };
        let mut p = Script::default();
        let Ok(Output::VolumeKey(k)) = dump::dump(&mut load(&img), &d, &mut p) else {
            panic!("no dump");
        };
        assert!(k.key.is_none(), "the key went to the file");
        let (_, want) = load(&img).volume_key(None, b"pw").unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), want.as_bytes());
        let mode = std::fs::metadata(&f).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o400);
        // Never overwritten.
        let Err(e) = dump::dump(&mut load(&img), &d, &mut p) else {
            panic!("overwrote the key file");
        };
        assert!(e.to_string().contains("cannot write the key"), "{e}");
    }

    #[test]
    fn a_key_file_without_a_key_and_a_bound_keyslot_as_unbound_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let img = crate::common::luks_image(tmp.path(), true, 16 << 20, &[b"pw"]);
        let mut p = Script::answering(&[b"pw"]);
        let d = Dump {
            device: img.clone(),
            volume_key_file: Some(tmp.path().join("vk")),
            ..Dump::default()
        };
        let Err(e) = dump::dump(&mut load(&img), &d, &mut p) else {
            panic!("accepted --volume-key-file alone");
        };
        assert_eq!(e.kind(), ErrorKind::Invalid);
        let d = Dump {
            unbound: Some(0),
            batch: true,
            volume_key_file: None,
            ..d
        };
        let Err(e) = dump::dump(&mut load(&img), &d, &mut p) else {
            panic!("dumped a bound keyslot as unbound");
        };
        assert_eq!(e.to_string(), "keyslot 0 does not contain an unbound key");
        assert!(p.asked.is_empty());
        // The text dump needs nothing.
        let d = Dump { unbound: None, ..d };
        let Ok(Output::Text(t)) = dump::dump(&mut load(&img), &d, &mut p) else {
            panic!("no text dump");
        };
        assert!(t.contains("LUKS header information"), "{t}");
    }
}
