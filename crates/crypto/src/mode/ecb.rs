//! ECB: every block encrypted alone; the IV is ignored (dm-crypt warns and drops the IV mode).

use super::Mode;
use crate::block::{new_block_cipher, BlockCipher};
use crate::CryptoError;

/// ECB over any block cipher.
pub struct Ecb {
    cipher: Box<dyn BlockCipher>,
}

impl Ecb {
    /// Keys the cipher.
    ///
    /// # Errors
    /// As [`new_block_cipher`].
    pub fn new(cipher: &str, key: &[u8]) -> Result<Self, CryptoError> {
        Ok(Ecb {
            cipher: new_block_cipher(cipher, key)?,
        })
    }
}

impl Mode for Ecb {
    fn iv_size(&self) -> usize {
        0
    }
    fn encrypt(&self, _iv: &[u8], data: &mut [u8]) {
        self.cipher.encrypt_blocks(data);
    }
    fn decrypt(&self, _iv: &[u8], data: &mut [u8]) {
        self.cipher.decrypt_blocks(data);
    }
}
