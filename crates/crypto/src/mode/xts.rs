//! XTS (IEEE 1619) over any 16-byte block cipher, written here because the `xts-mode` crate
//! encrypts one block per call (1.0-1.6 GB/s measured in shared/research/crypto-and-deps.md)
//! while handing `encrypt_blocks` a whole batch lets `aes` use VAES (3.4-5.7 GB/s).
//! Sectors are whole blocks, so ciphertext stealing is never needed. Proven by the IEEE
//! vector below and the kernel golden vectors (serpent/twofish/camellia/aes-xts cases).

use super::{xor_in_place, Mode};
use crate::block::{new_block_cipher, BlockCipher};
use crate::CryptoError;

const BATCH_BYTES: usize = 1024;

/// XTS over a 16-byte block cipher; key = data key ‖ tweak key (equal halves).
pub struct Xts {
    data: Box<dyn BlockCipher>,
    tweak: Box<dyn BlockCipher>,
}

impl Xts {
    /// Splits the key in halves and keys both ciphers.
    ///
    /// # Errors
    /// [`CryptoError::KeyLength`] for an odd key length or one the cipher refuses;
    /// [`CryptoError::Unsupported`] for a cipher whose block is not 16 bytes.
    pub fn new(cipher: &str, key: &[u8]) -> Result<Self, CryptoError> {
        if key.len() % 2 != 0 || key.is_empty() {
            return Err(CryptoError::KeyLength {
                got: key.len(),
                spec: format!("{cipher}-xts"),
                reason: "XTS needs two equal halves".into(),
            });
        }
        let (k1, k2) = key.split_at(key.len() / 2);
        let data = new_block_cipher(cipher, k1).map_err(|e| halve(e, cipher))?;
        let tweak = new_block_cipher(cipher, k2).map_err(|e| halve(e, cipher))?;
        if data.block_size() != 16 {
            return Err(CryptoError::Unsupported(format!(
                "xts over {cipher} (block size {})",
                data.block_size()
            )));
        }
        Ok(Xts { data, tweak })
    }

    /// XTS over two already keyed ciphers (data, tweak), e.g. a reference implementation
    /// measured beside ucrypt's own; `None` unless both have 16-byte blocks.
    pub fn from_ciphers(data: Box<dyn BlockCipher>, tweak: Box<dyn BlockCipher>) -> Option<Self> {
        (data.block_size() == 16 && tweak.block_size() == 16).then_some(Xts { data, tweak })
    }

    fn run(&self, iv: &[u8], data: &mut [u8], encrypt: bool) {
        let mut t = [0u8; 16];
        t.copy_from_slice(&iv[..16]);
        self.tweak.encrypt_blocks(&mut t);
        let mut tweak = u128::from_le_bytes(t);
        let mut tweaks = [0u8; BATCH_BYTES];
        for chunk in data.chunks_mut(BATCH_BYTES) {
            let n = chunk.len();
            for slot in tweaks[..n].chunks_exact_mut(16) {
                slot.copy_from_slice(&tweak.to_le_bytes());
                tweak = mul_alpha(tweak);
            }
            xor_in_place(chunk, &tweaks[..n]);
            if encrypt {
                self.data.encrypt_blocks(chunk);
            } else {
                self.data.decrypt_blocks(chunk);
            }
            xor_in_place(chunk, &tweaks[..n]);
        }
    }
}

fn halve(e: CryptoError, cipher: &str) -> CryptoError {
    match e {
        CryptoError::KeyLength { got, .. } => CryptoError::KeyLength {
            got: got * 2,
            spec: format!("{cipher}-xts"),
            reason: format!(
                "XTS needs two {cipher} keys of {} bytes each",
                crate::block::key_lengths(cipher)
            ),
        },
        other => other,
    }
}

/// Multiplies an XTS tweak by α in GF(2^128) (little-endian convention of IEEE 1619).
#[inline]
fn mul_alpha(t: u128) -> u128 {
    (t << 1) ^ (((t >> 127) as u8 as u128) * 0x87)
}

impl Mode for Xts {
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

    /// IEEE 1619-2007 XTS-AES-256 vector 10: data unit 0xff, 512 bytes 00..ff twice.
    #[test]
    fn ieee_1619_vector_10() {
        let key = hex::decode(concat!(
            "2718281828459045235360287471352662497757247093699959574966967627",
            "3141592653589793238462643383279502884197169399375105820974944592"
        ))
        .unwrap();
        let xts = Xts::new("aes", &key).unwrap();
        let mut data: Vec<u8> = (0..512).map(|i| i as u8).collect();
        let mut iv = [0u8; 16];
        iv[0] = 0xff;
        xts.encrypt(&iv, &mut data);
        assert_eq!(
            hex::encode(&data[..32]),
            "1c3b3a102f770386e4836c99e370cf9bea00803f5e482357a4ae12d414a3e63b"
        );
        xts.decrypt(&iv, &mut data);
        assert!(data.iter().enumerate().all(|(i, &b)| b == i as u8));
    }
}
