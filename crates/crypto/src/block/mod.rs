//! Block ciphers by their kernel names, behind one object-safe trait.
//!
//! Every cipher here comes from a maintained crate (RustCrypto), except those written here
//! and checked against outside references: Twofish with key-dependent tables and AVX-512
//! (`twofish`), Serpent bit-sliced over SIMD lanes (`serpent`), both for speed, and AFS's
//! `fcrypt`, which no crate has. TrueCrypt's cascades compose these (`cascade`). The kernel
//! names are the ones dm-crypt accepts in a cipher spec: `aes`, `serpent`, `twofish`,
//! `camellia`, `kuznyechik`, `blowfish`, `des`, `des3_ede`, `cast5`, `cast6`, `cipher_null`;
//! plus two TrueCrypt-only names the kernel lacks, `blowfish_le` and cascades `a+b[+c]`
//! ([`cascade`], used by [`crate::legacy::tcrypt_cbc`]); and `fcrypt`.

pub mod cascade;
mod fcrypt;
pub(crate) mod serpent;
mod twofish;

pub use twofish::code_path as twofish_code_path;

use crate::CryptoError;
use cipher::{array::Array, BlockCipherDecrypt, BlockCipherEncrypt, BlockSizeUser, KeyInit};

/// The block ciphers ucrypt knows, by kernel name.
pub const CIPHER_NAMES: &str =
    "aes, serpent, twofish, camellia, kuznyechik, blowfish, des, des3_ede, cast5, cast6, cipher_null, \
     fcrypt (TrueCrypt cbc-tcw only: blowfish_le, cascades like serpent+twofish+aes)";

/// A keyed block cipher working on whole blocks in place.
pub trait BlockCipher: Send + Sync {
    /// Block size in bytes (16, or 8 for blowfish and des3_ede, 1 for cipher_null).
    fn block_size(&self) -> usize;
    /// Encrypts whole blocks in place, independently (ECB).
    ///
    /// # Panics
    /// If `data.len()` is not a multiple of the block size.
    fn encrypt_blocks(&self, data: &mut [u8]);
    /// Decrypts whole blocks in place, independently (ECB).
    ///
    /// # Panics
    /// If `data.len()` is not a multiple of the block size.
    fn decrypt_blocks(&self, data: &mut [u8]);
}

struct Rc<C>(C);

impl<C> BlockCipher for Rc<C>
where
    C: BlockCipherEncrypt + BlockCipherDecrypt + BlockSizeUser + Send + Sync,
{
    fn block_size(&self) -> usize {
        C::block_size()
    }
    fn encrypt_blocks(&self, data: &mut [u8]) {
        let (blocks, rest) = Array::slice_as_chunks_mut(data);
        assert!(rest.is_empty(), "BUG: data is not a whole number of blocks");
        self.0.encrypt_blocks(blocks);
    }
    fn decrypt_blocks(&self, data: &mut [u8]) {
        let (blocks, rest) = Array::slice_as_chunks_mut(data);
        assert!(rest.is_empty(), "BUG: data is not a whole number of blocks");
        self.0.decrypt_blocks(blocks);
    }
}

/// `cipher_null`: the kernel's identity "cipher" (block size 1, no key).
struct NullCipher;

impl BlockCipher for NullCipher {
    fn block_size(&self) -> usize {
        1
    }
    fn encrypt_blocks(&self, _data: &mut [u8]) {}
    fn decrypt_blocks(&self, _data: &mut [u8]) {}
}

fn rc<C>(key: &[u8]) -> Option<Box<dyn BlockCipher>>
where
    C: KeyInit + BlockCipherEncrypt + BlockCipherDecrypt + BlockSizeUser + Send + Sync + 'static,
{
    // The key schedule is as secret as the key: locked in RAM (crate::secret).
    C::new_from_slice(key)
        .ok()
        .map(|c| Box::new(crate::secret::LockedBox::new(Rc(c))) as Box<dyn BlockCipher>)
}

impl<T: BlockCipher> BlockCipher for crate::secret::LockedBox<T> {
    fn block_size(&self) -> usize {
        (**self).block_size()
    }
    fn encrypt_blocks(&self, data: &mut [u8]) {
        (**self).encrypt_blocks(data);
    }
    fn decrypt_blocks(&self, data: &mut [u8]) {
        (**self).decrypt_blocks(data);
    }
}

/// The key lengths (bytes) a cipher accepts, for error messages.
pub fn key_lengths(name: &str) -> &'static str {
    match name {
        "aes" | "twofish" | "camellia" => "16, 24 or 32",
        "serpent" => "16 to 32",
        "blowfish" | "blowfish_le" => "4 to 56",
        "des" | "fcrypt" => "8",
        "des3_ede" => "24",
        "cast6" => "16, 20, 24, 28 or 32",
        "kuznyechik" => "32",
        "cast5" => "5 to 16",
        "cipher_null" => "0",
        n if n.contains(cascade::CASCADE_SEP) => "an equal share per cipher",
        _ => "?",
    }
}

/// Whether `name` is a block cipher ucrypt knows.
pub fn is_known(name: &str) -> bool {
    matches!(
        name,
        "aes"
            | "serpent"
            | "twofish"
            | "camellia"
            | "kuznyechik"
            | "blowfish"
            | "des"
            | "des3_ede"
            | "cast5"
            | "cast6"
            | "cipher_null"
            | "blowfish_le"
            | "fcrypt"
    ) || cascade::cascade_parts(name).is_some()
}

/// Block size of a known cipher, without a key.
pub fn block_size_of(name: &str) -> Option<usize> {
    match name {
        "aes" | "serpent" | "twofish" | "camellia" | "kuznyechik" | "cast6" => Some(16),
        "blowfish" | "blowfish_le" | "des" | "des3_ede" | "cast5" | "fcrypt" => Some(8),
        "cipher_null" => Some(1),
        n => cascade::cascade_parts(n).map(|(_, bs)| bs),
    }
}

/// The block cipher `name` from its RustCrypto crate where ucrypt runs its own faster code
/// instead (today Serpent): the reference `ucrypt benchmark` measures beside ucrypt's.
/// `None` for other names or a key the crate refuses.
pub fn reference_block_cipher(name: &str, key: &[u8]) -> Option<Box<dyn BlockCipher>> {
    match name {
        "serpent" => rc::<::serpent::Serpent>(key),
        _ => None,
    }
}

/// Builds the cipher `name` with `key`.
///
/// # Errors
/// [`CryptoError::Unknown`] for an unknown name, [`CryptoError::KeyLength`] when the cipher
/// refuses the key length.
pub fn new_block_cipher(name: &str, key: &[u8]) -> Result<Box<dyn BlockCipher>, CryptoError> {
    let built = match name {
        "aes" => match key.len() {
            16 => rc::<aes::Aes128>(key),
            24 => rc::<aes::Aes192>(key),
            32 => rc::<aes::Aes256>(key),
            _ => None,
        },
        "serpent" => serpent::Serpent::new(key)
            .map(|c| Box::new(crate::secret::LockedBox::new(c)) as Box<dyn BlockCipher>),
        "twofish" => twofish::Twofish::new(key).map(|c| Box::new(c) as Box<dyn BlockCipher>),
        "camellia" => match key.len() {
            16 => rc::<camellia::Camellia128>(key),
            24 => rc::<camellia::Camellia192>(key),
            32 => rc::<camellia::Camellia256>(key),
            _ => None,
        },
        "blowfish" => rc::<blowfish::Blowfish>(key),
        // TrueCrypt's Blowfish: the block's 32-bit halves little-endian, same key schedule.
        "blowfish_le" => rc::<blowfish::BlowfishLE>(key),
        "des" => rc::<des::Des>(key),
        "des3_ede" => rc::<des::TdesEde3>(key),
        // The kernel's cast6 takes 128- to 256-bit keys in 32-bit steps.
        "cast6" if key.len() % 4 == 0 => rc::<cast6::Cast6>(key),
        "cast6" => None,
        "kuznyechik" => rc::<kuznyechik::Kuznyechik>(key),
        "cast5" => rc::<cast5::Cast5>(key),
        // AFS's cipher: compatibility with tables the kernel accepts, never for new data.
        "fcrypt" => fcrypt::Fcrypt::new(key)
            .map(|c| Box::new(crate::secret::LockedBox::new(c)) as Box<dyn BlockCipher>),
        "cipher_null" => key
            .is_empty()
            .then(|| Box::new(NullCipher) as Box<dyn BlockCipher>),
        n if n.contains(cascade::CASCADE_SEP) => {
            // The cascade's ciphers keep their schedules in LockedBoxes of their own.
            let c = cascade::Cascade::new(n, key)?;
            return Ok(Box::new(c));
        }
        other => {
            return Err(CryptoError::Unknown {
                what: "cipher",
                name: other.to_string(),
                expected: CIPHER_NAMES,
            })
        }
    };
    built.ok_or_else(|| CryptoError::KeyLength {
        got: key.len(),
        spec: name.to_string(),
        reason: format!("{name} takes keys of {} bytes", key_lengths(name)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aes_128_matches_fips_197_vector() {
        let key = hex::decode("000102030405060708090a0b0c0d0e0f").unwrap();
        let mut block = hex::decode("00112233445566778899aabbccddeeff").unwrap();
        let c = new_block_cipher("aes", &key).unwrap();
        c.encrypt_blocks(&mut block);
        assert_eq!(hex::encode(&block), "69c4e0d86a7b0430d8cdb78070b4c55a");
        c.decrypt_blocks(&mut block);
        assert_eq!(hex::encode(&block), "00112233445566778899aabbccddeeff");
    }

    #[test]
    fn wrong_key_length_names_the_accepted_lengths() {
        let err = new_block_cipher("aes", &[0; 20]).err().unwrap().to_string();
        assert!(err.contains("16, 24 or 32"), "{err}");
        let err = new_block_cipher("rot13", &[0; 16])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("unknown cipher \"rot13\""), "{err}");
    }
}
