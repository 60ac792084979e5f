//! Plain dm-crypt mode: no header, the key comes from the passphrase by cryptsetup's rules
//! (`cryptsetup open --type plain`, `lib/setup.c: process_key`, `lib/crypt_plain.c`).
//!
//! - With a hash (default `ripemd160` in cryptsetup 2.6): the key is the hash of the
//!   passphrase, extended by re-hashing with an `A` prefix per round (libcryptsetup does
//!   this; ucrypt calls it, see [`crate::cryptsetup`]). `hash:len` hashes only `len` bytes
//!   and pads the rest with zeros.
//! - Without a hash (`--hash plain`, or a key file that is not stdin): the first key-size
//!   bytes of the secret are the key, zero-padded when shorter.

use crate::cryptsetup::CryptDevice;
use crate::FormatError;
use std::path::Path;
use ucrypt_crypto::VolumeKey;

/// cryptsetup 2.6's default plain-mode cipher.
pub const DEFAULT_CIPHER: &str = "aes-cbc-essiv:sha256";
/// cryptsetup 2.6's default plain-mode key size in bits.
pub const DEFAULT_KEY_BITS: u32 = 256;
/// cryptsetup 2.6's default plain-mode passphrase hash.
pub const DEFAULT_HASH: &str = "ripemd160";

/// Plain-mode parameters (cryptsetup's options of the same names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlainOptions {
    /// `--cipher`.
    pub cipher: String,
    /// `--key-size` in bits.
    pub key_bits: u32,
    /// `--hash`; `None` or `"plain"`: the secret is the key.
    pub hash: Option<String>,
    /// `--offset`: data start on the device in 512-byte sectors.
    pub offset: u64,
    /// `--skip`: IV offset in 512-byte sectors.
    pub skip: u64,
    /// `--size` in 512-byte sectors (0: to the end of the device).
    pub size: u64,
    /// `--sector-size` in bytes.
    pub sector_size: u32,
    /// `--iv-large-sectors`.
    pub iv_large_sectors: bool,
}

impl Default for PlainOptions {
    fn default() -> Self {
        PlainOptions {
            cipher: DEFAULT_CIPHER.to_string(),
            key_bits: DEFAULT_KEY_BITS,
            hash: Some(DEFAULT_HASH.to_string()),
            offset: 0,
            skip: 0,
            size: 0,
            sector_size: 512,
            iv_large_sectors: false,
        }
    }
}

impl PlainOptions {
    /// Key size in bytes.
    ///
    /// # Errors
    /// A key size that is zero or not a multiple of 8 bits.
    pub fn key_bytes(&self) -> Result<usize, FormatError> {
        if self.key_bits == 0 || self.key_bits % 8 != 0 {
            return Err(FormatError::Rule(format!(
                "key size {} bits is not a positive multiple of 8",
                self.key_bits
            )));
        }
        Ok(self.key_bits as usize / 8)
    }

    /// The hash to apply, None for none (`plain` means none).
    pub fn effective_hash(&self) -> Option<&str> {
        self.hash.as_deref().filter(|h| *h != "plain")
    }
}

/// Derives the plain-mode volume key from `secret` for a volume on `device` (the device is
/// only used to set up libcryptsetup's context; nothing is written).
///
/// # Errors
/// A bad key size, an unknown hash ("Hash algorithm ... not supported"), or a hash
/// length longer than the key.
pub fn volume_key(
    device: &Path,
    opts: &PlainOptions,
    secret: &[u8],
) -> Result<VolumeKey, FormatError> {
    let key_bytes = opts.key_bytes()?;
    match opts.effective_hash() {
        None => {
            let mut key = vec![0u8; key_bytes];
            let n = secret.len().min(key_bytes);
            key[..n].copy_from_slice(&secret[..n]);
            Ok(VolumeKey::new(key))
        }
        Some(hash) => {
            let mut cd = CryptDevice::init(device)?;
            cd.format_plain(
                &opts.cipher,
                key_bytes,
                hash,
                (opts.offset, opts.skip, opts.size, opts.sector_size),
            )?;
            let (_, key) = cd.volume_key(None, secret)?;
            if key.len() != key_bytes {
                return Err(FormatError::Rule(format!(
                    "plain-mode hashing gave {} bytes, expected {key_bytes}",
                    key.len()
                )));
            }
            Ok(key)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_hash_takes_the_secret_prefix_zero_padded() {
        let opts = PlainOptions {
            hash: Some("plain".into()),
            key_bits: 64,
            ..PlainOptions::default()
        };
        let k = volume_key(Path::new("/nonexistent"), &opts, b"abc").unwrap();
        assert_eq!(k.as_bytes(), b"abc\0\0\0\0\0");
        let k = volume_key(Path::new("/nonexistent"), &opts, b"0123456789").unwrap();
        assert_eq!(k.as_bytes(), b"01234567");
    }

    #[test]
    fn sha256_hash_matches_cryptsetup_rule() {
        // 32-byte key from sha256: one round, the plain digest of the passphrase.
        let dir = std::env::temp_dir().join(format!("ucrypt-plain-{}", std::process::id()));
        std::fs::write(&dir, vec![0u8; 1 << 20]).unwrap();
        let opts = PlainOptions {
            hash: Some("sha256".into()),
            key_bits: 512,
            cipher: "aes-xts-plain64".into(),
            ..PlainOptions::default()
        };
        let k = volume_key(&dir, &opts, b"secret").unwrap();
        std::fs::remove_file(&dir).unwrap();
        // sha256("secret") then sha256("A" || "secret").
        let first = "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b";
        let second = "40a1e4d40dbee92612950e2d0657f16e2ef366d37d0adf587d3845ac27593b3a";
        assert_eq!(hex_of(&k.as_bytes()[..32]), first);
        assert_eq!(hex_of(&k.as_bytes()[32..]), second);
    }

    fn hex_of(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }
}
