//! Reencryption through the library alone ([`ucrypt::reencrypt::run`], no command line):
//! a plaintext image encrypted in place under a new detached header and read back through
//! the unlocked volume, then decrypted back to the same bytes; a LUKS2 volume re-keyed to
//! another cipher; a pass stopped part-way (by the options and by the caller's stop
//! request), read back mid-way and resumed; and refusals as typed errors. The CLI's tests
//! compare the same operations with cryptsetup's on the same images.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use ucrypt::header::{unlock, HeaderOptions, VolumeType};
use ucrypt::reencrypt::{Level, Mode, Notice, Options, PbkdfChoice, Progress, Stage, Summary};
use ucrypt::unlock::{Prompt, Secret};
use ucrypt::ErrorKind;
use ucrypt_cryptsetup::{CryptDevice, LuksFormat, Pbkdf};

const PASS: &[u8] = b"correct horse";
const MIB: usize = 1 << 20;

/// A passphrase given up front; every confirmation granted.
struct Given(&'static [u8]);

impl Prompt for Given {
    fn passphrase(&mut self, _prompt: &str) -> ucrypt::Result<Secret> {
        Ok(Secret::copy_of(self.0))
    }
    fn confirm(&mut self, _question: &str) -> ucrypt::Result<()> {
        Ok(())
    }
}

/// What the library reported; asks to stop once `stop_at` bytes are done.
#[derive(Default)]
struct Seen {
    notices: Vec<Notice>,
    summaries: Vec<Summary>,
    last: u64,
    stop_at: Option<u64>,
    watching: bool,
}

impl Progress for Seen {
    fn notice(&mut self, notice: Notice) {
        self.notices.push(notice);
    }
    fn watch(&mut self) {
        self.watching = true;
    }
    fn stop_requested(&mut self) -> bool {
        self.watching && self.stop_at.is_some_and(|n| self.last >= n)
    }
    fn begin(&mut self, _device: &str, _total: u64, _resume_at: Option<u64>) {}
    fn advance(&mut self, done: u64) {
        self.last = done;
    }
    fn end(&mut self, _finished: bool) {}
    fn summary(&mut self, summary: &Summary) {
        self.summaries.push(summary.clone());
    }
}

/// Bytes no cipher leaves as they are: every 512-byte sector differs.
fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[(i / 512) % 4])
        .collect()
}

fn fast(opts: &mut Options) {
    opts.pbkdf = PbkdfChoice {
        kind: Some("pbkdf2".into()),
        iterations: Some(1000),
        ..PbkdfChoice::default()
    };
}

/// The decrypted data of the LUKS volume on `device` (header `header`), `len` bytes.
fn read_back(device: &Path, header: Option<&Path>, len: usize) -> Vec<u8> {
    let hopts = HeaderOptions {
        kind: VolumeType::Luks,
        header: header.map(Path::to_path_buf),
        ..HeaderOptions::default()
    };
    let unlocked = unlock(device, PASS, &hopts).unwrap();
    let volume = ucrypt::open_unlocked(unlocked, ucrypt::OpenOptions::default()).unwrap();
    let mut buf = vec![0u8; len];
    volume.read_at(&mut buf, 0).unwrap();
    buf
}

/// A LUKS2 image (2 MiB header, `data` after it) whose data area holds `data`.
fn luks2_image(dir: &Path, data: &[u8], cipher: &str) -> PathBuf {
    let img = dir.join("luks2.img");
    std::fs::write(&img, vec![0u8; 2 * MIB + data.len()]).unwrap();
    let mut cd = CryptDevice::init(&img).unwrap();
    cd.set_pbkdf(&Pbkdf {
        kind: "pbkdf2".into(),
        hash: None,
        iterations: Some(1000),
        time_ms: None,
        memory_kb: None,
        parallel: None,
    })
    .unwrap();
    cd.set_data_offset(4096).unwrap();
    cd.format_luks(
        &LuksFormat {
            luks2: true,
            cipher: cipher.into(),
            key_bytes: 64,
            uuid: None,
            hash: None,
            sector_size: None,
            label: None,
            subsystem: None,
            data_device: None,
            align_sectors: None,
        },
        None,
    )
    .unwrap();
    cd.add_keyslot_by_volume_key(None, None, PASS).unwrap();
    drop(cd);
    let hopts = HeaderOptions::default();
    let unlocked = unlock(&img, PASS, &hopts).unwrap();
    let volume = ucrypt::open_unlocked(unlocked, ucrypt::OpenOptions::default()).unwrap();
    volume.write_at(data, 0, true).unwrap();
    volume.flush().unwrap();
    img
}

fn in_reencryption(header: &Path) -> bool {
    let f = std::fs::File::open(header).unwrap();
    let h = ucrypt_format::luks2::disk::Header::read(&f, "header").unwrap();
    ucrypt_format::luks2::reencrypt::in_reencryption(&h.json)
}

#[test]
fn a_plaintext_image_is_encrypted_in_place_and_decrypted_back() {
    let tmp = tempfile::tempdir().unwrap();
    let data = pattern(4 * MIB);
    let img = tmp.path().join("plain.img");
    std::fs::write(&img, &data).unwrap();
    let hdr = tmp.path().join("hdr");

    let mut opts = Options::new(&img);
    opts.mode = Mode::Encrypt;
    opts.header = Some(hdr.clone());
    opts.cipher = Some("aes-xts-plain64".into());
    fast(&mut opts);
    let mut seen = Seen::default();
    ucrypt::reencrypt::run(&opts, &mut Given(PASS), &mut seen).unwrap();
    let on_disk = std::fs::read(&img).unwrap();
    assert_ne!(on_disk[..4096], data[..4096], "the data was not encrypted");
    assert_eq!(on_disk.len(), data.len());
    assert!(!in_reencryption(&hdr));
    assert_eq!(read_back(&img, Some(&hdr), data.len()), data);
    let last = seen.summaries.last().unwrap();
    assert!(last.finished);
    assert_eq!(
        (last.bytes, last.size),
        (data.len() as u64, data.len() as u64)
    );

    let mut opts = Options::new(&img);
    opts.mode = Mode::Decrypt;
    opts.header = Some(hdr.clone());
    ucrypt::reencrypt::run(&opts, &mut Given(PASS), &mut Seen::default()).unwrap();
    assert_eq!(std::fs::read(&img).unwrap(), data);
}

#[test]
fn a_luks2_volume_is_reencrypted_with_a_new_cipher() {
    let tmp = tempfile::tempdir().unwrap();
    let data = pattern(4 * MIB);
    let img = luks2_image(tmp.path(), &data, "aes-xts-plain64");
    let before = std::fs::read(&img).unwrap();

    let mut opts = Options::new(&img);
    opts.cipher = Some("aes-cbc-essiv:sha256".into());
    opts.key_size = Some(256);
    fast(&mut opts);
    ucrypt::reencrypt::run(&opts, &mut Given(PASS), &mut Seen::default()).unwrap();

    let after = std::fs::read(&img).unwrap();
    assert_ne!(
        after[2 * MIB..2 * MIB + 4096],
        before[2 * MIB..2 * MIB + 4096]
    );
    let mut cd = CryptDevice::init(&img).unwrap();
    cd.load(None).unwrap();
    let info = cd.info();
    assert_eq!(
        (info.cipher_spec().as_str(), info.key_bytes),
        ("aes-cbc-essiv:sha256", 32)
    );
    assert!(!in_reencryption(&img));
    assert_eq!(read_back(&img, None, data.len()), data);
}

#[test]
fn an_interrupted_reencryption_reads_back_mid_way_and_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let data = pattern(4 * MIB);
    let img = luks2_image(tmp.path(), &data, "aes-xts-plain64");

    // Stopped by the options after 1 MiB: not an error, the metadata says where.
    let mut opts = Options::new(&img);
    opts.hotzone_size = Some(256 << 10);
    opts.stop_after = Some(MIB as u64);
    fast(&mut opts);
    let mut seen = Seen::default();
    ucrypt::reencrypt::run(&opts, &mut Given(PASS), &mut seen).unwrap();
    let s = seen.summaries.last().unwrap();
    assert!(!s.finished);
    assert!(s.at >= MIB as u64 && s.at < data.len() as u64, "{s:?}");
    assert!(in_reencryption(&img));
    // Mid-way the volume opens as two segments, old key and new.
    assert_eq!(read_back(&img, None, data.len()), data);

    // A second start is refused: the metadata is there already.
    let mut again = opts.clone();
    again.stage = Stage::InitOnly;
    let e = ucrypt::reencrypt::run(&again, &mut Given(PASS), &mut Seen::default()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid);
    assert_eq!(
        e.to_string(),
        "LUKS2 reencryption already initialized in metadata"
    );

    // Stopped by the caller: the error "interrupted", resumable.
    let mut resume = Options::new(&img);
    resume.stage = Stage::ResumeOnly;
    resume.hotzone_size = Some(256 << 10);
    let mut seen = Seen {
        stop_at: Some(256 << 10),
        ..Seen::default()
    };
    let e = ucrypt::reencrypt::run(&resume, &mut Given(PASS), &mut seen).unwrap_err();
    assert_eq!(
        (e.kind(), e.to_string()),
        (ErrorKind::Invalid, "interrupted".into())
    );
    assert!(in_reencryption(&img));

    let mut seen = Seen::default();
    ucrypt::reencrypt::run(&resume, &mut Given(PASS), &mut seen).unwrap();
    assert!(seen.summaries.last().unwrap().finished);
    assert!(!in_reencryption(&img));
    assert_eq!(read_back(&img, None, data.len()), data);
}

#[test]
fn refused_combinations_and_wrong_passphrases_are_typed_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let data = pattern(MIB);
    let img = luks2_image(tmp.path(), &data, "aes-xts-plain64");
    let before = std::fs::read(&img).unwrap();
    let run = |opts: &Options, pass: &'static [u8]| {
        let mut seen = Seen::default();
        let r = ucrypt::reencrypt::run(opts, &mut Given(pass), &mut seen);
        (r, seen)
    };

    let mut keep = Options::new(&img);
    keep.keep_key = true;
    keep.mode = Mode::Encrypt;
    let (r, _) = run(&keep, PASS);
    let e = r.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid);
    assert!(
        e.to_string()
            .starts_with("reencrypt --keep-key keeps the key"),
        "{e}"
    );

    let mut decrypt = Options::new(&img);
    decrypt.mode = Mode::Decrypt;
    let e = run(&decrypt, PASS).0.unwrap_err();
    assert_eq!(
        (e.kind(), e.to_string()),
        (
            ErrorKind::Invalid,
            "LUKS2 decryption requires --header option.".into()
        )
    );

    let mut resume = Options::new(&img);
    resume.stage = Stage::ResumeOnly;
    let e = run(&resume, PASS).0.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid);

    let mut same = Options::new(&img);
    same.keep_key = true;
    let e = run(&same, PASS).0.unwrap_err();
    assert_eq!(
        e.to_string(),
        "No data segment parameters changed. Reencryption aborted."
    );

    let e = run(&Options::new(&img), b"wrong").0.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Permission);

    // An ignored option is a notice, not an error (here before the wrong passphrase).
    let mut offset = Options::new(&img);
    offset.offset = Some(8);
    let (r, seen) = run(&offset, b"wrong");
    assert_eq!(r.unwrap_err().kind(), ErrorKind::Permission);
    assert_eq!(seen.notices.len(), 1);
    assert_eq!(seen.notices[0].level, Level::Warning);

    assert_eq!(
        std::fs::read(&img).unwrap(),
        before,
        "a refusal wrote to the image"
    );
}
