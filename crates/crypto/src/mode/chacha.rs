//! The kernel's `chacha20` stream cipher as a dm-crypt "mode" (`capi:chacha20-plain64`), via
//! the `chacha20` crate. The kernel's 16-byte IV is the initial ChaCha state words 12..15:
//! a little-endian 32-bit block counter, then the 12-byte nonce (RFC 8439 layout); the
//! counter wraps at 2^32 as the kernel's `state[12]++` does. Proven by the kernel golden
//! vector `chacha20-plain64-k256` (`testdata/golden/make-kernel-ciphers.sh`).
//!
//! Compatibility only: with dm-crypt's IVs the counter is the sector number, so neighbouring
//! sectors share keystream (sector n's block 1 is sector n+1's block 0). dm-crypt accepts it;
//! so does ucrypt, for reading such volumes. Never use it for new ones.

use super::Mode;
use crate::CryptoError;
use chacha20::cipher::{KeyIvInit, StreamCipherCore};
use chacha20::variants::Ietf;
use chacha20::{ChaChaCore, R20};
use zeroize::Zeroizing;

/// `chacha20` keyed with a 32-byte key.
pub struct ChaCha {
    key: Zeroizing<[u8; 32]>,
}

impl ChaCha {
    /// `key` must be 32 bytes.
    ///
    /// # Errors
    /// [`CryptoError::KeyLength`] for another length.
    pub fn new(key: &[u8]) -> Result<Self, CryptoError> {
        let mut k = Zeroizing::new([0u8; 32]);
        if key.len() != 32 {
            return Err(CryptoError::KeyLength {
                got: key.len(),
                spec: "chacha20".into(),
                reason: "chacha20 takes keys of 32 bytes".into(),
            });
        }
        k.copy_from_slice(key);
        Ok(ChaCha { key: k })
    }

    fn apply(&self, iv: &[u8], data: &mut [u8]) {
        let counter = u32::from_le_bytes([iv[0], iv[1], iv[2], iv[3]]);
        let mut nonce = [0u8; 12];
        nonce.copy_from_slice(&iv[4..16]);
        let key: &[u8; 32] = &self.key;
        // The core, not the `ChaCha20` wrapper: the wrapper refuses to run past counter
        // 2^32 - 1, where the kernel wraps to 0. One block at a time, the counter set
        // explicitly for each, so the wrap never depends on how a SIMD backend carries.
        let mut core = ChaChaCore::<R20, Ietf>::new(key.into(), (&nonce).into());
        let mut ks = Zeroizing::new([0u8; 64]);
        for (i, chunk) in data.chunks_mut(64).enumerate() {
            #[allow(clippy::cast_possible_truncation)] // the counter wraps at 2^32 on purpose
            core.set_block_pos(counter.wrapping_add(i as u32));
            core.write_keystream_block((&mut *ks).into());
            for (d, k) in chunk.iter_mut().zip(ks.iter()) {
                *d ^= k;
            }
        }
    }
}

impl Mode for ChaCha {
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

    /// RFC 8439 section 2.4.2: key 00..1f, counter 1, nonce 000000000000004a00000000.
    #[test]
    fn rfc8439_keystream_with_the_kernel_iv_layout() {
        let key: Vec<u8> = (0u8..32).collect();
        let mut iv = [0u8; 16];
        iv[0] = 1;
        iv[4..16].copy_from_slice(&hex::decode("000000000000004a00000000").unwrap());
        let mut data = b"Ladies and Gentlemen of the class of '99: If I could offer you o".to_vec();
        ChaCha::new(&key).unwrap().encrypt(&iv, &mut data);
        assert_eq!(
            hex::encode(&data[..32]),
            "6e2e359a2568f98041ba0728dd0d6981e97e7aec1d4360c20a27afccfd9fae0b"
        );
    }

    #[test]
    fn counter_wraps_like_the_kernel() {
        // Reference: two calls at the counter values either side of the wrap.
        let c = ChaCha::new(&[9; 32]).unwrap();
        let mut iv = [0u8; 16];
        iv[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut both = vec![0u8; 128];
        c.encrypt(&iv, &mut both);
        let mut first = vec![0u8; 64];
        c.encrypt(&iv, &mut first);
        let mut second = vec![0u8; 64];
        iv[..4].copy_from_slice(&0u32.to_le_bytes());
        c.encrypt(&iv, &mut second);
        assert_eq!(both, [first, second].concat());
    }
}
