//! LUKS2 headers crafted to use ciphers cryptsetup refuses (issue 15, item 6): a keyslot or
//! data segment with `cipher_null` (CVE-2025-59054, refused since cryptsetup 2.8.1) and a
//! keyslot cipher in the kernel crypto API form (`capi:`, refused since 2.7). The image is
//! made by libcryptsetup (`ucrypt luksFormat`), then its JSON metadata is rewritten in both
//! header copies with their SHA-256 checksums recomputed, so libcryptsetup loads it as a
//! valid header and only ucrypt's policy stands between it and an unlock.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

const PASS: &[u8] = b"policy test passphrase";

/// Rewrites the LUKS2 JSON of both header copies with `edit` and fixes their checksums
/// (SHA-256 over `hdr_size` bytes with the 64-byte checksum field at 448 zeroed).
fn rewrite_json(img: &Path, edit: impl Fn(&mut serde_json::Value)) {
    use sha2::Digest;
    let mut b = std::fs::read(img).unwrap();
    let hdr_size = u64::from_be_bytes(b[8..16].try_into().unwrap()) as usize;
    for off in [0, hdr_size] {
        let area = &b[off + 4096..off + hdr_size];
        let end = area.iter().position(|&c| c == 0).unwrap_or(area.len());
        let mut v: serde_json::Value = serde_json::from_slice(&area[..end]).unwrap();
        edit(&mut v);
        let json = serde_json::to_vec(&v).unwrap();
        assert!(json.len() < hdr_size - 4096, "rewritten JSON too large");
        b[off + 4096..off + hdr_size].fill(0);
        b[off + 4096..off + 4096 + json.len()].copy_from_slice(&json);
        b[off + 448..off + 512].fill(0);
        let sum = sha2::Sha256::digest(&b[off..off + hdr_size]);
        b[off + 448..off + 480].copy_from_slice(&sum);
    }
    std::fs::write(img, b).unwrap();
}

fn luks2_image(dir: &Path, name: &str) -> std::path::PathBuf {
    let img = common::image(dir, name, 20 << 20);
    let img_s = img.to_str().unwrap();
    common::ok(common::ucrypt(
        &[
            "luksFormat",
            "-q",
            "--type",
            "luks2",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            img_s,
            "--key-file",
            "-",
        ],
        PASS,
    ));
    img
}

/// `ucrypt luksOpen IMG --test-passphrase [extra]` and `ucrypt luksOpen --print-table`:
/// (succeeded, stderr) of each.
fn try_open(img: &Path, extra: &[&str]) -> Vec<(bool, String)> {
    ["--test-passphrase", "--print-table"]
        .iter()
        .map(|how| {
            let mut args = vec!["luksOpen", img.to_str().unwrap(), how, "--key-file", "-"];
            args.extend_from_slice(extra);
            let out = common::ucrypt(&args, PASS);
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        })
        .collect()
}

#[test]
fn null_cipher_and_capi_keyslots_are_refused_and_the_option_names_the_risk() {
    let tmp = tempfile::tempdir().unwrap();
    // Control: the untouched image opens.
    let plain = luks2_image(tmp.path(), "ok.img");
    for (ok, err) in try_open(&plain, &[]) {
        assert!(ok, "untouched LUKS2 image refused: {err}");
    }

    // A keyslot "encrypted" with cipher_null: refused before any keyslot is tried.
    let img = luks2_image(tmp.path(), "ks-null.img");
    rewrite_json(&img, |v| {
        v["keyslots"]["0"]["area"]["encryption"] = "cipher_null-ecb".into();
    });
    for (ok, err) in try_open(&img, &[]) {
        assert!(!ok, "null-cipher keyslot opened");
        assert!(
            err.contains("keyslot 0 uses the null cipher") && err.contains("CVE-2025-59054"),
            "{err}"
        );
        assert!(err.contains("--insecure-allow-null-cipher"), "{err}");
    }

    // A data segment with cipher_null (what a header swap to "no encryption" looks like):
    // refused by default; the option opens it (the keyslot itself is a real AES one).
    let img = luks2_image(tmp.path(), "seg-null.img");
    rewrite_json(&img, |v| {
        v["segments"]["0"]["encryption"] = "cipher_null-ecb".into();
    });
    for (ok, err) in try_open(&img, &[]) {
        assert!(!ok, "null-cipher segment opened");
        assert!(err.contains("data segment 0 uses the null cipher"), "{err}");
    }
    let allowed = try_open(&img, &["--insecure-allow-null-cipher"]);
    assert!(
        allowed[0].0,
        "--insecure-allow-null-cipher: {}",
        allowed[0].1
    );

    // A keyslot cipher in crypto API form: refused, with or without the option.
    let img = luks2_image(tmp.path(), "ks-capi.img");
    rewrite_json(&img, |v| {
        v["keyslots"]["0"]["area"]["encryption"] = "capi:xts(aes)-plain64".into();
    });
    for extra in [&[][..], &["--insecure-allow-null-cipher"][..]] {
        for (ok, err) in try_open(&img, extra) {
            assert!(!ok, "capi: keyslot opened");
            assert!(err.contains("kernel crypto API string"), "{err}");
        }
    }
}
