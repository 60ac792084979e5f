//! CBC over any block cipher. Encryption is serial by nature; decryption hands the cipher
//! many blocks at once so AES-NI/VAES pipelines them.

use super::{xor_in_place, Mode};
use crate::block::{new_block_cipher, BlockCipher};
use crate::CryptoError;

/// Blocks decrypted per batch: big enough to fill the cipher's parallel lanes, small enough
/// to stay on the stack.
const BATCH_BYTES: usize = 1024;

/// CBC over any block cipher.
pub struct Cbc {
    cipher: Box<dyn BlockCipher>,
}

impl Cbc {
    /// Keys the cipher.
    ///
    /// # Errors
    /// As [`new_block_cipher`].
    pub fn new(cipher: &str, key: &[u8]) -> Result<Self, CryptoError> {
        Ok(Cbc {
            cipher: new_block_cipher(cipher, key)?,
        })
    }

    /// The underlying block cipher (for IV generators that encrypt with the data key).
    pub fn cipher(&self) -> &dyn BlockCipher {
        &*self.cipher
    }
}

impl Mode for Cbc {
    fn iv_size(&self) -> usize {
        self.cipher.block_size().max(8)
    }

    fn encrypt(&self, iv: &[u8], data: &mut [u8]) {
        let bs = self.cipher.block_size();
        let mut prev = [0u8; 16];
        prev[..bs].copy_from_slice(&iv[..bs]);
        for block in data.chunks_exact_mut(bs) {
            xor_in_place(block, &prev[..bs]);
            self.cipher.encrypt_blocks(block);
            prev[..bs].copy_from_slice(block);
        }
    }

    fn decrypt(&self, iv: &[u8], data: &mut [u8]) {
        let bs = self.cipher.block_size();
        let mut prev = [0u8; 16];
        prev[..bs].copy_from_slice(&iv[..bs]);
        let mut saved = [0u8; BATCH_BYTES];
        for chunk in data.chunks_mut(BATCH_BYTES) {
            let n = chunk.len();
            saved[..n].copy_from_slice(chunk);
            self.cipher.decrypt_blocks(chunk);
            xor_in_place(&mut chunk[..bs], &prev[..bs]);
            xor_in_place(&mut chunk[bs..], &saved[..n - bs]);
            prev[..bs].copy_from_slice(&saved[n - bs..n]);
        }
    }
}
