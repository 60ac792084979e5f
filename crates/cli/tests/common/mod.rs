//! Shared helpers for the CLI tests: golden manifest, the binary, temp images.
#![allow(dead_code, clippy::unwrap_used)]

pub mod cmd;
pub mod nbd;
pub mod runtime;
pub mod tmux;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Output};
#[allow(unused_imports)] // not every test binary reads the golden vectors
pub use ucrypt_crypto::testing::golden_dir;
/// The workspace's one skip rule, RNG and image helpers (`ucrypt-testkit`).
#[allow(unused_imports)] // not every test binary uses each
pub use ucrypt_testkit::{
    ci, image, image_with, luks2_format_args, random_bytes, require, require_that, Rng,
    CHEAP_PBKDF, SMALL_LUKS2,
};

/// `cryptsetup luksFormat -q --type KIND` of `img` with [`CHEAP_PBKDF`], the passphrase
/// in `key_file`; asserts success.
pub fn cryptsetup_format(kind: &str, key_file: &Path, img: &Path) {
    let out = Command::new("cryptsetup")
        .args(["luksFormat", "-q", "--type", kind])
        .args(CHEAP_PBKDF)
        .arg("--key-file")
        .arg(key_file)
        .arg(img)
        .output()
        .unwrap_or_else(|e| panic!("cryptsetup: {e}"));
    assert!(
        out.status.success(),
        "cryptsetup luksFormat --type {kind} {} failed: {}",
        img.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// All manifest cases.
pub fn cases(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("manifest.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A case's ciphertext.
pub fn ciphertext(dir: &Path, case: &serde_json::Value) -> Vec<u8> {
    let gz = std::fs::File::open(dir.join(case["ciphertext_file"].as_str().unwrap())).unwrap();
    let mut ct = Vec::new();
    flate2::read::GzDecoder::new(gz)
        .read_to_end(&mut ct)
        .unwrap();
    ct
}

/// The golden plaintext for `sectors` 512-byte sectors.
pub fn pattern(sectors: u64) -> Vec<u8> {
    ucrypt_crypto::testing::pattern_v1(ucrypt_crypto::Sector512(0), sectors)
}

/// Runs the ucrypt binary with `args`, feeding `stdin`.
pub fn ucrypt(args: &[&str], stdin: &[u8]) -> Output {
    ucrypt_env(args, stdin, &[])
}

/// [`ucrypt`] with extra environment variables.
pub fn ucrypt_env(args: &[&str], stdin: &[u8], env: &[(&str, &std::ffi::OsStr)]) -> Output {
    cmd::piped(
        Command::new(env!("CARGO_BIN_EXE_ucrypt"))
            .args(args)
            .envs(env.iter().copied()),
        stdin,
    )
}

/// Asserts success and returns stdout.
pub fn ok(out: Output) -> Vec<u8> {
    assert!(
        out.status.success(),
        "ucrypt failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The JSON metadata of the LUKS2 header at the start of `path`
/// ([`ucrypt_testkit::luks2_json`]) with what is random in it (salts, digests, PBKDF
/// costs) blanked: what two headers made alike (ucrypt's and cryptsetup's) share.
pub fn luks2_shape(path: &Path) -> serde_json::Value {
    fn blank(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m.iter_mut() {
                    if ["salt", "digest", "iterations"].contains(&k.as_str()) {
                        *x = serde_json::Value::Null;
                    } else {
                        blank(x);
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(blank),
            _ => {}
        }
    }
    let mut v: serde_json::Value = serde_json::from_str(&ucrypt_testkit::luks2_json(path)).unwrap();
    blank(&mut v);
    v
}
