//! TrueCrypt's cipher cascades (`serpent+twofish+aes`): several block ciphers of one block
//! size applied to each block in turn, as one composite block cipher. The kernel has no
//! cascade template; TrueCrypt's outer-CBC mode ([`crate::legacy::tcrypt_cbc`]) runs `tcw`
//! over it. Compatibility only.

use super::{block_size_of, is_known, new_block_cipher, BlockCipher};
use crate::CryptoError;

/// The most ciphers of a cascade (TrueCrypt's three-cipher chains).
pub const MAX_CASCADE: usize = 3;

/// Separator of the ciphers of a cascade name (`serpent+twofish+aes`).
pub const CASCADE_SEP: char = '+';

/// The ciphers of a cascade name with their common block size, when the name is a valid
/// cascade: 2 to [`MAX_CASCADE`] known ciphers (no `cipher_null`, no nested cascade), all of
/// one block size.
pub fn cascade_parts(name: &str) -> Option<(Vec<&str>, usize)> {
    let parts: Vec<&str> = name.split(CASCADE_SEP).collect();
    if !(2..=MAX_CASCADE).contains(&parts.len()) {
        return None;
    }
    let mut bs = None;
    for p in &parts {
        if p.is_empty() || *p == "cipher_null" || !is_known(p) {
            return None;
        }
        let b = block_size_of(p)?;
        if *bs.get_or_insert(b) != b {
            return None;
        }
    }
    Some((parts, bs?))
}

/// Several block ciphers of one block size applied to each block in turn (TrueCrypt's
/// outer-CBC cascade): encryption runs the first cipher first, decryption the last first.
pub struct Cascade {
    ciphers: Vec<Box<dyn BlockCipher>>,
    block_size: usize,
}

impl Cascade {
    /// Keys the cascade `name` (`serpent+twofish+aes`): `key` is split in equal parts, one
    /// per cipher in name order (TrueCrypt's 32-byte keys side by side).
    ///
    /// # Errors
    /// [`CryptoError::Spec`] for a name that is not a valid cascade,
    /// [`CryptoError::KeyLength`] when the key does not split or a cipher refuses its part.
    pub fn new(name: &str, key: &[u8]) -> Result<Self, CryptoError> {
        let (parts, block_size) = cascade_parts(name).ok_or_else(|| CryptoError::Spec {
            spec: name.to_string(),
            reason: format!(
                "a cipher cascade is 2 to {MAX_CASCADE} known ciphers of one block size joined \
                 by '{CASCADE_SEP}' (serpent+twofish+aes)"
            ),
        })?;
        if key.is_empty() || key.len() % parts.len() != 0 {
            return Err(CryptoError::KeyLength {
                got: key.len(),
                spec: name.to_string(),
                reason: format!(
                    "the key of a {}-cipher cascade is split in {} equal parts",
                    parts.len(),
                    parts.len()
                ),
            });
        }
        let share = key.len() / parts.len();
        let ciphers = parts
            .iter()
            .zip(key.chunks_exact(share))
            .map(|(p, k)| new_block_cipher(p, k))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| match e {
                CryptoError::KeyLength { reason, .. } => CryptoError::KeyLength {
                    got: key.len(),
                    spec: name.to_string(),
                    reason: format!("each cipher gets {share} bytes: {reason}"),
                },
                other => other,
            })?;
        Ok(Cascade {
            ciphers,
            block_size,
        })
    }
}

impl BlockCipher for Cascade {
    fn block_size(&self) -> usize {
        self.block_size
    }
    fn encrypt_blocks(&self, data: &mut [u8]) {
        // Whole buffer per cipher: same result as block by block (each block is
        // independent in ECB), and each cipher gets many blocks at once.
        for c in &self.ciphers {
            c.encrypt_blocks(data);
        }
    }
    fn decrypt_blocks(&self, data: &mut [u8]) {
        for c in self.ciphers.iter().rev() {
            c.decrypt_blocks(data);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cascade_names_are_checked() {
        assert_eq!(
            cascade_parts("serpent+twofish+aes"),
            Some((vec!["serpent", "twofish", "aes"], 16))
        );
        assert!(cascade_parts("aes").is_none());
        assert!(
            cascade_parts("aes+blowfish").is_none(),
            "block sizes differ"
        );
        assert!(cascade_parts("aes+cipher_null").is_none());
        assert!(cascade_parts("aes+rot13").is_none());
        assert!(cascade_parts("aes+").is_none());
        assert!(cascade_parts("aes+aes+aes+aes").is_none());
    }

    #[test]
    fn cascade_is_the_ciphers_in_order() {
        // Reference: the RustCrypto ciphers applied one after the other by hand.
        let key: Vec<u8> = (0u8..96).collect();
        let c = Cascade::new("serpent+twofish+aes", &key).unwrap();
        let mut data: Vec<u8> = (0u8..64).map(|b| b.wrapping_mul(37)).collect();
        let mut want = data.clone();
        for (name, k) in ["serpent", "twofish", "aes"].iter().zip(key.chunks(32)) {
            new_block_cipher(name, k).unwrap().encrypt_blocks(&mut want);
        }
        let plain = data.clone();
        c.encrypt_blocks(&mut data);
        assert_eq!(data, want);
        c.decrypt_blocks(&mut data);
        assert_eq!(data, plain);
    }

    #[test]
    fn cascade_key_errors_name_the_split() {
        let e = Cascade::new("aes+serpent", &[0; 63])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("2 equal parts"), "{e}");
        let e = Cascade::new("aes+serpent", &[0; 40])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("each cipher gets 20 bytes"), "{e}");
        let e = Cascade::new("aes+blowfish", &[0; 32])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("one block size"), "{e}");
    }
}
