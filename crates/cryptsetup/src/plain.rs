//! Plain dm-crypt mode's volume key ([`ucrypt_format::plain`] holds the options and rules):
//! with a hash, libcryptsetup derives it (`crypt_format` of a plain context, then
//! `crypt_volume_key_get`), so ucrypt's key is the one `cryptsetup open --type plain` gives
//! the kernel; without one, the secret's prefix.

use crate::CryptDevice;
use std::path::Path;
use ucrypt_crypto::VolumeKey;
use ucrypt_format::plain::PlainOptions;
use ucrypt_format::FormatError;

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
