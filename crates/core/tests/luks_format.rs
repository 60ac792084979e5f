//! `luksFormat`'s decisions through the library alone (`ucrypt::luks::format`): the volume
//! key sizes cryptsetup 2.6.1 picks (with `--integrity`, the integrity key added to the
//! cipher's), what is refused before anything is written (each refusal by name), and
//! LUKS2 volumes with integrity written as cryptsetup writes them: the JSON metadata, the
//! binary header's fields and the dm-integrity superblock below compared field by field
//! with the kernel-made images of testdata/luks2-integrity (formatted there by
//! `cryptsetup luksFormat --integrity` in the kernel lab), and the volume opening and
//! reading zeros after the wipe, or failing every sector without it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use ucrypt::luks::format::{self, Plan, Request};
use ucrypt::luks::keyslots::KeyslotCipher;
use ucrypt::luks::{CryptDevice, LuksFormat, VolumeKey};
use ucrypt_format::luks2::disk::Header;
use ucrypt_format::luks2::json::Json;

fn req(cipher: &str, integrity: Option<&str>, key_bits: Option<u32>) -> Request {
    Request {
        luks2: true,
        cipher: cipher.into(),
        key_bits,
        integrity: integrity.map(Into::into),
        pbkdf: Some("pbkdf2".into()),
        pbkdf_iterations: Some(1000),
        ..Request::default()
    }
}

fn plan(cipher: &str, integrity: Option<&str>, key_bits: Option<u32>) -> ucrypt::Result<Plan> {
    format::plan(&req(cipher, integrity, key_bits))
}

#[test]
fn key_sizes_are_cryptsetups() {
    let p = plan("aes-xts-plain64", None, None).unwrap();
    assert_eq!((p.key_bytes, p.integrity.is_none()), (64, true));
    assert_eq!(
        plan("aes-cbc-essiv:sha256", None, None).unwrap().key_bytes,
        32
    );
    // hmac-sha256 + xts-512: the 64-byte XTS key, then the 32-byte HMAC key.
    let p = plan("aes-xts-plain64", Some("hmac-sha256"), None).unwrap();
    let i = p.integrity.unwrap();
    assert_eq!(p.key_bytes, 96);
    assert_eq!(
        (i.kind.as_str(), i.key_bytes, i.tag_size),
        ("hmac(sha256)", 32, 32)
    );
    assert_eq!(
        i.kernel_cipher,
        "capi:authenc(hmac(sha256),xts(aes))-plain64"
    );
    assert!(i.wipe && !i.legacy_padding);
    let p = plan("aes-xts-plain64", Some("hmac-sha512"), Some(256)).unwrap();
    assert_eq!((p.key_bytes, p.integrity.unwrap().tag_size), (96, 64));
    let p = plan("aes-xts-plain64", Some("hmac-sha1"), None).unwrap();
    assert_eq!((p.key_bytes, p.integrity.unwrap().tag_size), (84, 20));
    let p = plan("aes-gcm-random", Some("aead"), None).unwrap();
    let i = p.integrity.unwrap();
    assert_eq!((p.key_bytes, i.tag_size, i.key_bytes), (32, 28, 0));
    assert_eq!(i.kernel_cipher, "capi:gcm(aes)-random");
    let p = plan("aes-gcm-random", Some("aead"), Some(128)).unwrap();
    assert_eq!(p.key_bytes, 16);
    let p = plan("chacha20-random", Some("poly1305"), None).unwrap();
    let i = p.integrity.unwrap();
    assert_eq!((p.key_bytes, i.tag_size), (32, 28));
    assert_eq!(i.kernel_cipher, "capi:rfc7539(chacha20,poly1305)-random");
    // `none` with a cipher that stores nothing in tags: a plain LUKS2 volume, as cryptsetup.
    let p = plan("aes-xts-plain64", Some("none"), None).unwrap();
    assert!(p.integrity.is_none());
    let mut r = req("aes-xts-plain64", Some("hmac-sha256"), None);
    r.integrity_no_wipe = true;
    r.integrity_legacy_padding = true;
    let i = format::plan(&r).unwrap().integrity.unwrap();
    assert!(!i.wipe && i.legacy_padding);
}

/// Cipher, `--integrity`, `--key-size`, LUKS2 (else LUKS1), the words of the refusal.
type Refusal = (
    &'static str,
    Option<&'static str>,
    Option<u32>,
    bool,
    &'static str,
);

/// Each refusal: the kind (invalid: exit 1) and the words that name what is refused.
#[test]
fn what_ucrypt_cannot_serve_is_refused_by_name_before_anything_is_written() {
    let cases: &[Refusal] = &[
        ("aes-xts-plain64", Some("cmac-aes"), None, true, "cmac"),
        (
            "aes-xts-plain64",
            Some("crc32c"),
            None,
            true,
            "no known integrity",
        ),
        // integrity:N:none: random IVs kept in tags that authenticate nothing.
        ("aes-xts-random", None, None, true, "integrity:N:none"),
        (
            "aes-gcm-random",
            Some("none"),
            None,
            true,
            "integrity:N:none",
        ),
        // authenc with a random IV, and authenc over something else than XTS.
        (
            "aes-xts-random",
            Some("hmac-sha256"),
            None,
            true,
            "IV mode random",
        ),
        (
            "aes-cbc-essiv:sha256",
            Some("hmac-sha256"),
            None,
            true,
            "cbc(aes)",
        ),
        // AEAD modes ucrypt does not serve, and mismatched pairs.
        ("aes-ccm-random", Some("aead"), None, true, "ccm(aes)"),
        ("aegis128-random", Some("aead"), None, true, "aegis128"),
        ("aes-xts-plain64", Some("aead"), None, true, "xts(aes)"),
        (
            "aes-gcm-random",
            Some("poly1305"),
            None,
            true,
            "poly1305 goes with",
        ),
        ("aes-gcm-plain64", Some("aead"), None, true, "random"),
        (
            "aes-gcm-random",
            Some("aead"),
            Some(192),
            true,
            "16- or 32-byte key",
        ),
        (
            "chacha20-random",
            Some("poly1305"),
            Some(128),
            true,
            "32-byte key",
        ),
        (
            "aes-xts-plain64",
            Some("hmac-sha256"),
            Some(200),
            true,
            "AES-XTS key",
        ),
    ];
    for (cipher, integrity, bits, luks2, words) in cases {
        let mut r = req(cipher, *integrity, *bits);
        r.luks2 = *luks2;
        let e = format::plan(&r).expect_err(&format!("{cipher} {integrity:?} {bits:?}"));
        assert_eq!(
            e.kind(),
            ucrypt::ErrorKind::Invalid,
            "{cipher} {integrity:?}"
        );
        let text = format!("{e:#}");
        assert!(
            text.contains(words),
            "{cipher} {integrity:?} {bits:?}: {text:?} does not name {words:?}"
        );
    }
    let mut r = req("aes-xts-plain64", Some("hmac-sha256"), None);
    r.luks2 = false;
    r.pbkdf = None;
    let e = format::plan(&r).unwrap_err();
    assert!(format!("{e}").contains("only for LUKS2"), "{e}");
    let mut r = req("aes-xts-plain64", Some("hmac-sha256"), None);
    r.remote = true;
    assert!(format!("{}", format::plan(&r).unwrap_err()).contains("remote"));
}

fn testdata() -> Option<PathBuf> {
    let d = ucrypt_testkit::testdata("luks2-integrity", "make.sh")?;
    ucrypt_testkit::require("xz").then_some(d)
}

fn unxz(from: &Path, to: &Path) {
    let out = Command::new("xz").arg("-dc").arg(from).output().unwrap();
    assert!(out.status.success());
    std::fs::write(to, out.stdout).unwrap();
}

/// The JSON with what is random per format (salts, digests, UUID) blanked.
fn normalized(j: &Json) -> String {
    let text = j.to_compact();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    fn walk(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m.iter_mut() {
                    if k == "salt" || k == "digest" {
                        *x = serde_json::Value::String("-".into());
                    } else {
                        walk(x);
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut v);
    // Key order is kept (serde_json's preserve_order is not assumed: compare the text of
    // both sides after the same round trip, and the raw key order separately).
    v.to_string()
}

/// Keys in the order they appear in the compact JSON text.
fn key_order(text: &str) -> Vec<String> {
    let mut keys = Vec::new();
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'"' {
            let end = text[i + 1..].find('"').unwrap() + i + 1;
            if b.get(end + 1) == Some(&b':') {
                keys.push(text[i + 1..end].to_string());
            }
            i = end + 1;
        } else {
            i += 1;
        }
    }
    keys
}

/// The fields of the binary header that do not change per format (magic, version,
/// hdr_size, seqid, checksum algorithm, offsets of both copies).
fn binary_fields(path: &Path) -> Vec<(u64, u64, u64, String)> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path).unwrap();
    let mut out = Vec::new();
    let mut bin = vec![0u8; 4096];
    f.read_exact_at(&mut bin, 0).unwrap();
    let be = |b: &[u8], at: usize| u64::from_be_bytes(b[at..at + 8].try_into().unwrap());
    let hdr = be(&bin, 8);
    for at in [0, hdr] {
        f.read_exact_at(&mut bin, at).unwrap();
        let alg = String::from_utf8_lossy(&bin[72..104])
            .trim_end_matches('\0')
            .to_string();
        out.push((
            be(&bin, 8),
            be(&bin, 16),
            be(&bin, 256),
            format!("{:?}{alg}", &bin[..8]),
        ));
    }
    out
}

struct Case {
    name: &'static str,
    cipher: &'static str,
    bits: u32,
    integrity: &'static str,
    sector: u32,
}

const CASES: [Case; 4] = [
    Case {
        name: "hmac-sha256-xts-4096",
        cipher: "aes-xts-plain64",
        bits: 512,
        integrity: "hmac-sha256",
        sector: 4096,
    },
    Case {
        name: "hmac-sha512-xts-512",
        cipher: "aes-xts-plain64",
        bits: 256,
        integrity: "hmac-sha512",
        sector: 512,
    },
    Case {
        name: "aes-gcm-random-4096",
        cipher: "aes-gcm-random",
        bits: 256,
        integrity: "aead",
        sector: 4096,
    },
    Case {
        name: "chacha20-poly1305-4096",
        cipher: "chacha20-random",
        bits: 256,
        integrity: "poly1305",
        sector: 4096,
    },
];

/// Formats `img` (a zeroed 4 MiB file) as testdata/luks2-integrity/make.sh formatted its
/// images with cryptsetup: PBKDF2 1000, 16 KiB metadata, 512 KiB keyslots, the volume key
/// 0x40, 0x41, ...; returns what the library wrote.
fn format_like_make_sh(img: &Path, c: &Case, no_wipe: bool) -> (Plan, format::Formatted) {
    std::fs::write(img, vec![0u8; 4 << 20]).unwrap();
    let mut r = req(c.cipher, Some(c.integrity), Some(c.bits));
    r.metadata_size = Some(16 << 10);
    r.keyslots_size = Some(512 << 10);
    r.integrity_no_wipe = no_wipe;
    let plan = format::plan(&r).unwrap();
    let vk = VolumeKey::new((0x40..0x40 + plan.key_bytes as u8).collect());
    let mut cd = CryptDevice::init(img).unwrap();
    plan.prepare(&mut cd, &r).unwrap();
    let fmt = LuksFormat {
        luks2: true,
        cipher: c.cipher.into(),
        key_bytes: plan.key_bytes,
        sector_size: Some(c.sector),
        ..LuksFormat::default()
    };
    let done = plan
        .write(
            cd,
            &fmt,
            &KeyslotCipher::default(),
            None,
            Some(&vk),
            b"ucrypt-aead",
            img,
            img,
            false,
        )
        .unwrap();
    (plan, done)
}

#[test]
fn integrity_headers_and_superblocks_are_cryptsetups_field_by_field() {
    let Some(d) = testdata() else { return };
    let tmp = tempfile::tempdir().unwrap();
    for c in &CASES {
        let kernel = tmp.path().join(format!("{}.kernel", c.name));
        unxz(&d.join(format!("{}.img.xz", c.name)), &kernel);
        let ours = tmp.path().join(format!("{}.ours", c.name));
        let (plan, done) = format_like_make_sh(&ours, c, true);
        assert_eq!(done.slot, 0);
        assert_eq!(done.volume_key.as_ref().unwrap().len(), plan.key_bytes);
        // The JSON metadata: every field, in cryptsetup's order, salts and digests aside.
        let read = |p: &Path| {
            let f = std::fs::File::open(p).unwrap();
            Header::read(&f, &p.display().to_string()).unwrap()
        };
        let (k, o) = (read(&kernel), read(&ours));
        assert_eq!(normalized(&o.json), normalized(&k.json), "{}: JSON", c.name);
        assert_eq!(
            key_order(&o.json.to_compact()),
            key_order(&k.json.to_compact()),
            "{}: JSON key order",
            c.name
        );
        // Epoch (seqid), hdr_size, offsets, magic and checksum algorithm of both copies.
        assert_eq!(
            binary_fields(&ours),
            binary_fields(&kernel),
            "{}: binary header",
            c.name
        );
        // The dm-integrity superblock at the data offset (1 MiB): every field.
        let sb = |p: &Path| {
            use std::os::unix::fs::FileExt;
            let mut s = vec![0u8; 512];
            std::fs::File::open(p)
                .unwrap()
                .read_exact_at(&mut s, 1 << 20)
                .unwrap();
            s
        };
        let (ks, os) = (sb(&kernel), sb(&ours));
        assert_eq!(
            ucrypt::integrity::Superblock::parse(&os).unwrap(),
            ucrypt::integrity::Superblock::parse(&ks).unwrap(),
            "{}: superblock",
            c.name
        );
        assert_eq!(os, ks, "{}: superblock bytes", c.name);
        // The volume key is the one given, and the passphrase opens it.
        let mut cd = CryptDevice::init(&ours).unwrap();
        cd.load(None).unwrap();
        let (_, key) = cd.volume_key(None, b"ucrypt-aead").unwrap();
        assert_eq!(key.as_bytes(), done.volume_key.as_ref().unwrap().as_bytes());
    }
}

#[test]
fn the_wipe_makes_every_tag_valid_and_without_it_every_sector_fails() {
    let tmp = tempfile::tempdir().unwrap();
    for c in &CASES {
        let img = tmp.path().join(format!("{}.img", c.name));
        let (_, done) = format_like_make_sh(&img, c, false);
        let key = done.volume_key.unwrap();
        let t = format::wipe_target(&img, None, &key).unwrap();
        let size = t.volume.info().size_bytes;
        assert!(t.chunk >= 1 << 20, "{}: chunk {}", c.name, t.chunk);
        // Before the wipe: no sector authenticates.
        let mut buf = vec![0u8; c.sector as usize];
        for at in [
            0,
            size / 2 / u64::from(c.sector) * u64::from(c.sector),
            size - u64::from(c.sector),
        ] {
            let e = t.volume.read_at(&mut buf, at).unwrap_err();
            assert!(
                matches!(e, ucrypt_backend::BackendError::Integrity { .. }),
                "{}: {e}",
                c.name
            );
        }
        let zeros = vec![0u8; t.chunk];
        let mut at = 0;
        while at < size {
            let n = (size - at).min(t.chunk as u64) as usize;
            t.volume.write_at(&zeros[..n], at, false).unwrap();
            at += n as u64;
        }
        t.volume.flush().unwrap();
        drop(t);
        // Opened as `open` opens it (journal mode), every byte reads back zero.
        let opts = ucrypt::HeaderOptions {
            kind: ucrypt::VolumeType::Luks2,
            ..ucrypt::HeaderOptions::default()
        };
        let u = ucrypt::unlock(&img, b"ucrypt-aead", &opts).unwrap();
        let vol = ucrypt::open_unlocked(u, ucrypt::OpenOptions::default()).unwrap();
        let mut all = vec![0xffu8; vol.info().size_bytes as usize];
        vol.read_at(&mut all, 0).unwrap();
        assert!(all.iter().all(|&b| b == 0), "{}: not all zeros", c.name);
    }
}
