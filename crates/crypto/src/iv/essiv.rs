//! `essiv:<hash>`: Encrypted Salt-Sector IV. salt = hash(subkey); IV = E_salt(le64(iv_sector)
//! ‖ 0), with the same block cipher as the data (for XTS the hash covers the whole XTS key,
//! and the IV cipher is the base cipher keyed with the digest).

use super::IvGenerator;
use crate::block::{new_block_cipher, BlockCipher};
use crate::CryptoError;
use digest::Digest;
use zeroize::Zeroizing;

/// Hashes ucrypt accepts for ESSIV, by kernel name.
pub const HASH_NAMES: &str =
    "sha1, sha224, sha256, sha384, sha512, sha3-224, sha3-256, sha3-384, sha3-512, md4, md5, \
     rmd160, wp256, wp384, wp512, streebog256, streebog512, blake2b-160, blake2b-256, \
     blake2b-384, blake2b-512";

/// Hashes `data` with the kernel-named hash.
///
/// # Errors
/// [`CryptoError::Unknown`] for an unknown hash.
pub fn hash(name: &str, data: &[u8]) -> Result<Zeroizing<Vec<u8>>, CryptoError> {
    let out = match name {
        "sha1" => sha1::Sha1::digest(data).to_vec(),
        "sha224" => sha2::Sha224::digest(data).to_vec(),
        "sha256" => sha2::Sha256::digest(data).to_vec(),
        "sha384" => sha2::Sha384::digest(data).to_vec(),
        "sha512" => sha2::Sha512::digest(data).to_vec(),
        "sha3-224" => sha3::Sha3_224::digest(data).to_vec(),
        "sha3-256" => sha3::Sha3_256::digest(data).to_vec(),
        "sha3-384" => sha3::Sha3_384::digest(data).to_vec(),
        "sha3-512" => sha3::Sha3_512::digest(data).to_vec(),
        "md4" => md4::Md4::digest(data).to_vec(),
        "md5" => md5::Md5::digest(data).to_vec(),
        "streebog256" => streebog::Streebog256::digest(data).to_vec(),
        "streebog512" => streebog::Streebog512::digest(data).to_vec(),
        // The kernel's blake2b-N: unkeyed BLAKE2b with an N-bit output parameter (not a
        // truncated BLAKE2b-512), as the blake2 crate's fixed-size types compute it.
        "blake2b-160" => blake2::Blake2b::<digest::consts::U20>::digest(data).to_vec(),
        "blake2b-256" => blake2::Blake2b::<digest::consts::U32>::digest(data).to_vec(),
        "blake2b-384" => blake2::Blake2b::<digest::consts::U48>::digest(data).to_vec(),
        "blake2b-512" => blake2::Blake2b512::digest(data).to_vec(),
        "rmd160" => ripemd::Ripemd160::digest(data).to_vec(),
        "wp512" => whirlpool::Whirlpool::digest(data).to_vec(),
        // The kernel's wp384/wp256 are Whirlpool truncated (crypto/wp512.c).
        "wp384" => whirlpool::Whirlpool::digest(data)[..48].to_vec(),
        "wp256" => whirlpool::Whirlpool::digest(data)[..32].to_vec(),
        other => {
            return Err(CryptoError::Unknown {
                what: "hash",
                name: other.to_string(),
                expected: HASH_NAMES,
            })
        }
    };
    Ok(Zeroizing::new(out))
}

/// The ESSIV generator for one subkey.
pub struct Essiv {
    salt_cipher: Box<dyn BlockCipher>,
}

impl Essiv {
    /// `cipher` is the base block cipher name, `subkey` the whole data key of this lane.
    ///
    /// # Errors
    /// Unknown hash, or a digest length the cipher cannot take as a key.
    pub fn new(cipher: &str, hash_name: &str, subkey: &[u8]) -> Result<Self, CryptoError> {
        let salt = hash(hash_name, subkey)?;
        let salt_cipher = new_block_cipher(cipher, &salt).map_err(|_| CryptoError::IvMode {
            iv: format!("essiv:{hash_name}"),
            reason: format!(
                "a {}-byte {hash_name} digest is not a valid {cipher} key",
                salt.len()
            ),
        })?;
        Ok(Essiv { salt_cipher })
    }
}

impl IvGenerator for Essiv {
    fn fill(&self, iv_sector: u64, iv: &mut [u8]) {
        iv.fill(0);
        iv[..8].copy_from_slice(&iv_sector.to_le_bytes());
        let bs = self.salt_cipher.block_size();
        self.salt_cipher.encrypt_blocks(&mut iv[..bs]);
    }
}
