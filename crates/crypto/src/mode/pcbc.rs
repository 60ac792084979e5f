//! PCBC (propagating CBC) over any block cipher, as the kernel's `pcbc(cipher)` template
//! (crypto/pcbc.c): the chaining value after each block is plaintext ⊕ ciphertext.
//!
//! ```text
//! v = IV;  for each block:  C = E(P ⊕ v);  v = P ⊕ C        (decrypt: P = D(C) ⊕ v)
//! ```
//!
//! Written here, not taken from the `pcbc` crate: that crate drives a RustCrypto cipher type,
//! while ucrypt's ciphers are chosen at run time by kernel name (`Box<dyn BlockCipher>`), and
//! the mode is two XORs around the block cipher. Proven by kernel golden vectors
//! (`aes-pcbc-plain64-k256`, `des3_ede-pcbc-plain64-k192`, made with
//! `testdata/golden/make-kernel-ciphers.sh`).

use super::{xor_in_place, Mode};
use crate::block::{new_block_cipher, BlockCipher};
use crate::CryptoError;
use zeroize::Zeroize;

/// PCBC over any block cipher.
pub struct Pcbc {
    cipher: Box<dyn BlockCipher>,
}

impl Pcbc {
    /// Keys the cipher.
    ///
    /// # Errors
    /// As [`new_block_cipher`]; [`CryptoError::Unsupported`] for `cipher_null`.
    pub fn new(cipher: &str, key: &[u8]) -> Result<Self, CryptoError> {
        let c = new_block_cipher(cipher, key)?;
        if c.block_size() < 8 {
            return Err(CryptoError::Unsupported(format!("pcbc over {cipher}")));
        }
        Ok(Pcbc { cipher: c })
    }
}

impl Mode for Pcbc {
    fn iv_size(&self) -> usize {
        self.cipher.block_size()
    }

    fn encrypt(&self, iv: &[u8], data: &mut [u8]) {
        let bs = self.cipher.block_size();
        let mut v = [0u8; 16];
        let mut p = [0u8; 16];
        v[..bs].copy_from_slice(&iv[..bs]);
        for block in data.chunks_exact_mut(bs) {
            p[..bs].copy_from_slice(block);
            xor_in_place(block, &v[..bs]);
            self.cipher.encrypt_blocks(block);
            v[..bs].copy_from_slice(block);
            xor_in_place(&mut v[..bs], &p[..bs]);
        }
        v.zeroize();
        p.zeroize();
    }

    fn decrypt(&self, iv: &[u8], data: &mut [u8]) {
        let bs = self.cipher.block_size();
        let mut v = [0u8; 16];
        let mut c = [0u8; 16];
        v[..bs].copy_from_slice(&iv[..bs]);
        for block in data.chunks_exact_mut(bs) {
            c[..bs].copy_from_slice(block);
            self.cipher.decrypt_blocks(block);
            xor_in_place(block, &v[..bs]);
            v[..bs].copy_from_slice(block);
            xor_in_place(&mut v[..bs], &c[..bs]);
        }
        v.zeroize();
        c.zeroize();
    }
}
