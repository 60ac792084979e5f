//! CTR over any block cipher, as the kernel's `ctr(cipher)` template: the IV is the first
//! counter block, incremented as one big-endian number of the block's width per block
//! (`crypto_inc`), the keystream XORed into the data. dm-crypt's `aes-ctr-plain64` gives it
//! le64(sector) ‖ zeros. Written here (a counter and an XOR around the block cipher's
//! batched `encrypt_blocks`); proven by kernel golden vectors (`*-ctr-*` cases, made with
//! `testdata/golden/make-aes-xts-extra.sh`: AES-128/256, Serpent, 4 KiB sectors, `plain`
//! and a wrapping `plain64` sector number).

use super::{xor_in_place, Mode};
use crate::block::{new_block_cipher, BlockCipher};
use crate::CryptoError;
use zeroize::Zeroize;

/// Keystream bytes computed per `encrypt_blocks` call.
const BATCH_BYTES: usize = 1024;

/// CTR over any block cipher.
pub struct Ctr {
    cipher: Box<dyn BlockCipher>,
}

impl Ctr {
    /// Keys the cipher.
    ///
    /// # Errors
    /// As [`new_block_cipher`]; [`CryptoError::Unsupported`] for `cipher_null`.
    pub fn new(cipher: &str, key: &[u8]) -> Result<Self, CryptoError> {
        let c = new_block_cipher(cipher, key)?;
        if c.block_size() != 16 && c.block_size() != 8 {
            return Err(CryptoError::Unsupported(format!(
                "ctr over {cipher} (block size {})",
                c.block_size()
            )));
        }
        Ok(Ctr { cipher: c })
    }

    fn apply(&self, iv: &[u8], data: &mut [u8]) {
        let bs = self.cipher.block_size();
        let mut counter = [0u8; 16];
        counter[16 - bs..].copy_from_slice(&iv[..bs]);
        let mut ctr = u128::from_be_bytes(counter);
        // The counter wraps at the block's width, as crypto_inc does.
        let mask = if bs == 16 {
            u128::MAX
        } else {
            (1u128 << (8 * bs)) - 1
        };
        let mut ks = [0u8; BATCH_BYTES];
        for chunk in data.chunks_mut(BATCH_BYTES) {
            let n = chunk.len().div_ceil(bs) * bs;
            for b in ks[..n].chunks_exact_mut(bs) {
                b.copy_from_slice(&ctr.to_be_bytes()[16 - bs..]);
                ctr = ctr.wrapping_add(1) & mask;
            }
            self.cipher.encrypt_blocks(&mut ks[..n]);
            xor_in_place(chunk, &ks[..chunk.len()]);
        }
        ks.zeroize();
    }
}

impl Mode for Ctr {
    fn iv_size(&self) -> usize {
        self.cipher.block_size().max(8)
    }
    fn encrypt(&self, iv: &[u8], data: &mut [u8]) {
        self.apply(iv, data);
    }
    fn decrypt(&self, iv: &[u8], data: &mut [u8]) {
        self.apply(iv, data);
    }
}

/// XCTR over a 16-byte block cipher, as the kernel's `xctr(cipher)` template (the stream
/// mode of HCTR2, usable alone as `capi:xctr(aes)-plain64`): keystream block i (from 1) is
/// E(IV ⊕ le128(i)). Proven by the kernel golden vector `aes-xctr-plain64-k256`
/// (`testdata/golden/make-kernel-ciphers.sh`) and by HCTR2's vectors, which run it too.
pub struct Xctr {
    cipher: Box<dyn BlockCipher>,
}

impl Xctr {
    /// Keys the cipher.
    ///
    /// # Errors
    /// As [`new_block_cipher`]; [`CryptoError::Unsupported`] for a block size other than 16.
    pub fn new(cipher: &str, key: &[u8]) -> Result<Self, CryptoError> {
        let c = new_block_cipher(cipher, key)?;
        if c.block_size() != 16 {
            return Err(CryptoError::Unsupported(format!(
                "xctr over {cipher} (block size {}; xctr needs 16)",
                c.block_size()
            )));
        }
        Ok(Xctr { cipher: c })
    }

    fn apply(&self, iv: &[u8], data: &mut [u8]) {
        let mut base = [0u8; 16];
        base.copy_from_slice(&iv[..16]);
        let base = u128::from_le_bytes(base);
        let mut i: u128 = 1;
        let mut ks = [0u8; BATCH_BYTES];
        for chunk in data.chunks_mut(BATCH_BYTES) {
            let n = chunk.len().div_ceil(16) * 16;
            for b in ks[..n].chunks_exact_mut(16) {
                b.copy_from_slice(&(base ^ i).to_le_bytes());
                i = i.wrapping_add(1);
            }
            self.cipher.encrypt_blocks(&mut ks[..n]);
            xor_in_place(chunk, &ks[..chunk.len()]);
        }
        ks.zeroize();
    }
}

impl Mode for Xctr {
    fn iv_size(&self) -> usize {
        16
    }
    fn encrypt(&self, iv: &[u8], data: &mut [u8]) {
        self.apply(iv, data);
    }
    fn decrypt(&self, iv: &[u8], data: &mut [u8]) {
        self.apply(iv, data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NIST SP 800-38A F.5.1 (CTR-AES128.Encrypt), the four blocks.
    #[test]
    fn sp800_38a_ctr_aes128() {
        let key = hex::decode("2b7e151628aed2a6abf7158809cf4f3c").unwrap();
        let iv = hex::decode("f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff").unwrap();
        let mut data = hex::decode(concat!(
            "6bc1bee22e409f96e93d7e117393172aae2d8a571e03ac9c9eb76fac45af8e51",
            "30c81c46a35ce411e5fbc1191a0a52eff69f2445df4f9b17ad2b417be66c3710"
        ))
        .unwrap();
        Ctr::new("aes", &key).unwrap().encrypt(&iv, &mut data);
        assert_eq!(
            hex::encode(data),
            concat!(
                "874d6191b620e3261bef6864990db6ce9806f66b7970fdff8617187bb9fffdff",
                "5ae4df3edbd5d35e5b4f09020db03eab1e031dda2fbe03d1792170a0f3009cee"
            )
        );
    }
}
