//! The TrueCrypt/VeraCrypt key-file pool: key files and the passphrase mixed into the
//! password the KDF sees (facts from cryptsetup's `lib/tcrypt/tcrypt.c` and the VeraCrypt
//! documentation).
//!
//! ```text
//!  key file bytes ─► running CRC-32 (reflected 0xEDB88320, from all ones, never finalised)
//!                    after each byte: pool[j..j+4] += crc (big-endian), j wraps at pool size
//!  passphrase     ─► pool[i] += byte
//! ```
//! Addition is modulo 256, so the order of the key files does not matter.

use crate::FormatError;
use std::io::Read;
use std::path::Path;
use zeroize::Zeroizing;

/// TrueCrypt's pool (and maximum passphrase) length.
pub const POOL_LEN: usize = 64;
/// VeraCrypt's pool length when the passphrase is longer than [`POOL_LEN`].
pub const VERA_POOL_LEN: usize = 128;
/// Only the first MiB of each key file counts.
pub const KEYFILE_MAX: u64 = 1024 * 1024;

fn crc32_step(mut crc: u32, byte: u8) -> u32 {
    crc ^= u32::from(byte);
    for _ in 0..8 {
        crc = if crc & 1 != 0 {
            (crc >> 1) ^ 0xEDB8_8320
        } else {
            crc >> 1
        };
    }
    crc
}

/// Adds one key file's contents (already read, at most [`KEYFILE_MAX`] bytes) to `pool`.
pub fn add_keyfile(pool: &mut [u8], data: &[u8]) {
    let len = pool.len();
    if len == 0 {
        return;
    }
    let mut crc = !0u32;
    let mut j = 0;
    for &b in data {
        crc = crc32_step(crc, b);
        for v in crc.to_be_bytes() {
            pool[j] = pool[j].wrapping_add(v);
            j += 1;
        }
        j %= len;
    }
}

/// The KDF password: `passphrase` alone without key files, else the whole pool with the
/// key files and the passphrase added.
///
/// # Errors
/// [`FormatError::Rule`] when the passphrase is longer than the format allows (64 bytes,
/// 128 for VeraCrypt), [`FormatError::Key`] when a key file cannot be read.
pub fn password(
    passphrase: &[u8],
    key_files: &[impl AsRef<Path>],
    veracrypt: bool,
) -> Result<Zeroizing<Vec<u8>>, FormatError> {
    let max = if veracrypt && passphrase.len() > POOL_LEN {
        VERA_POOL_LEN
    } else {
        POOL_LEN
    };
    if passphrase.len() > max {
        return Err(FormatError::Rule(format!(
            "maximum TCRYPT passphrase length ({max} bytes) exceeded ({} bytes given)",
            passphrase.len()
        )));
    }
    if key_files.is_empty() {
        return Ok(Zeroizing::new(passphrase.to_vec()));
    }
    let mut pool = Zeroizing::new(vec![0u8; max]);
    for kf in key_files {
        let path = kf.as_ref();
        let mut data = Zeroizing::new(Vec::new());
        std::fs::File::open(path)
            .and_then(|f| f.take(KEYFILE_MAX).read_to_end(&mut data))
            .map_err(|e| FormatError::Key(format!("reading key file {}: {e}", path.display())))?;
        add_keyfile(&mut pool, &data);
    }
    for (i, &b) in passphrase.iter().enumerate() {
        pool[i] = pool[i].wrapping_add(b);
    }
    Ok(pool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_matches_crc32_before_finalisation() {
        let data = b"123456789";
        let raw = data.iter().fold(!0u32, |c, &b| crc32_step(c, b));
        assert_eq!(!raw, 0xCBF4_3926);
    }

    #[test]
    fn pool_is_order_independent_and_wraps() {
        let (a, b) = (vec![7u8; 100], vec![1u8, 2, 3]);
        let mut p1 = [0u8; POOL_LEN];
        add_keyfile(&mut p1, &a);
        add_keyfile(&mut p1, &b);
        let mut p2 = [0u8; POOL_LEN];
        add_keyfile(&mut p2, &b);
        add_keyfile(&mut p2, &a);
        assert_eq!(p1, p2);
        assert_ne!(p1, [0u8; POOL_LEN]);
    }

    #[test]
    fn long_passphrase_rules() {
        let none: [&Path; 0] = [];
        assert!(password(&[b'a'; 65], &none, false).is_err());
        assert_eq!(password(&[b'a'; 72], &none, true).unwrap().len(), 72);
        assert!(password(&[b'a'; 129], &none, true).is_err());
    }
}
