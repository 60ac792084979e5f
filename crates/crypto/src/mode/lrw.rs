//! LRW (Liskov, Rivest, Wagner) as the kernel's `lrw` template does it: key = cipher key ‖
//! 16-byte tweak key K2; the IV is a 128-bit big-endian block index I; block i is
//! `E(P ⊕ T) ⊕ T` with `T = K2 ⊗ (I + i)` in GF(2^128), "bbe" convention (big-endian, x^0
//! in the last bit), polynomial x^128 + x^7 + x^2 + x + 1.
//!
//! No maintained crate implements LRW; it is legacy (dm-crypt keeps it for old volumes), so
//! this is the plain textbook form. Proven by the kernel golden vector `aes-lrw-benbi-k384`.
//! `T` is updated per block with the kernel's trick: `I ⊕ (I + 1)` is `2^(k+1) - 1` where k
//! counts the trailing ones of I, so `T(I+1) = T(I) ⊕ K2 ⊗ (2^(k+1) - 1)`, a table lookup.

use super::{xor_in_place, Mode};
use crate::block::{new_block_cipher, BlockCipher};
use crate::CryptoError;
use zeroize::Zeroize;

const BATCH_BYTES: usize = 1024;

/// LRW over a 16-byte block cipher.
pub struct Lrw {
    cipher: Box<dyn BlockCipher>,
    /// K2 as a field element.
    k2: u128,
    /// `steps[k] = K2 ⊗ (2^(k+1) - 1)`.
    steps: Box<[u128; 128]>,
}

impl Drop for Lrw {
    fn drop(&mut self) {
        self.k2.zeroize();
        self.steps.zeroize();
    }
}

#[inline]
fn mul_x(a: u128) -> u128 {
    (a << 1) ^ (((a >> 127) as u8 as u128) * 0x87)
}

fn gf_mul(mut a: u128, b: u128) -> u128 {
    let mut r = 0u128;
    for i in 0..128 {
        if (b >> i) & 1 == 1 {
            r ^= a;
        }
        a = mul_x(a);
    }
    r
}

impl Lrw {
    /// Splits off the 16-byte tweak key and keys the cipher with the rest.
    ///
    /// # Errors
    /// [`CryptoError::KeyLength`] if the key is not a cipher key plus 16 bytes.
    pub fn new(cipher: &str, key: &[u8]) -> Result<Self, CryptoError> {
        if key.len() <= 16 {
            return Err(CryptoError::KeyLength {
                got: key.len(),
                spec: format!("{cipher}-lrw"),
                reason: "LRW needs a cipher key followed by a 16-byte tweak key".into(),
            });
        }
        let (k1, k2) = key.split_at(key.len() - 16);
        let cipher_box = new_block_cipher(cipher, k1).map_err(|_| CryptoError::KeyLength {
            got: key.len(),
            spec: format!("{cipher}-lrw"),
            reason: format!(
                "LRW needs a {cipher} key ({} bytes) followed by a 16-byte tweak key",
                crate::block::key_lengths(cipher)
            ),
        })?;
        if cipher_box.block_size() != 16 {
            return Err(CryptoError::Unsupported(format!("lrw over {cipher}")));
        }
        let mut k2_bytes = [0u8; 16];
        k2_bytes.copy_from_slice(k2);
        let k2 = u128::from_be_bytes(k2_bytes);
        k2_bytes.zeroize();
        let mut steps = Box::new([0u128; 128]);
        let mut power = k2; // K2 ⊗ x^j
        let mut acc = 0u128;
        for step in steps.iter_mut() {
            acc ^= power;
            *step = acc;
            power = mul_x(power);
        }
        Ok(Lrw {
            cipher: cipher_box,
            k2,
            steps,
        })
    }

    fn run(&self, iv: &[u8], data: &mut [u8], encrypt: bool) {
        let mut ib = [0u8; 16];
        ib.copy_from_slice(&iv[..16]);
        let mut index = u128::from_be_bytes(ib);
        let mut t = gf_mul(self.k2, index);
        let mut tweaks = [0u8; BATCH_BYTES];
        for chunk in data.chunks_mut(BATCH_BYTES) {
            let n = chunk.len();
            for slot in tweaks[..n].chunks_exact_mut(16) {
                slot.copy_from_slice(&t.to_be_bytes());
                t ^= self.steps[index.trailing_ones().min(127) as usize];
                index = index.wrapping_add(1);
            }
            xor_in_place(chunk, &tweaks[..n]);
            if encrypt {
                self.cipher.encrypt_blocks(chunk);
            } else {
                self.cipher.decrypt_blocks(chunk);
            }
            xor_in_place(chunk, &tweaks[..n]);
        }
        tweaks.zeroize();
    }
}

impl Mode for Lrw {
    fn iv_size(&self) -> usize {
        16
    }
    fn encrypt(&self, iv: &[u8], data: &mut [u8]) {
        self.run(iv, data, true);
    }
    fn decrypt(&self, iv: &[u8], data: &mut [u8]) {
        self.run(iv, data, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incremental_tweak_equals_direct_multiplication() {
        let key: Vec<u8> = (0..48).map(|i| (i * 7 + 3) as u8).collect();
        let lrw = Lrw::new("aes", &key).unwrap();
        for start in [0u128, 1, 7, 31, 0xffff_ffff, u128::MAX - 3] {
            let mut idx = start;
            let mut t = gf_mul(lrw.k2, idx);
            for _ in 0..8 {
                t ^= lrw.steps[idx.trailing_ones().min(127) as usize];
                idx = idx.wrapping_add(1);
                assert_eq!(t, gf_mul(lrw.k2, idx));
            }
        }
    }
}
