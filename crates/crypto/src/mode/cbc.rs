//! CBC over any block cipher. Encryption is serial within a sector, but sectors are
//! independent: [`Mode::encrypt_sectors`] runs up to [`LANES`] sectors' chains side by side,
//! handing the cipher one block of each per call, so AES-NI/VAES pipelines them as it does
//! for decryption, which hands the cipher many blocks of one sector at once.

use super::{xor_in_place, Mode};
use crate::block::{new_block_cipher, BlockCipher};
use crate::CryptoError;

/// Blocks decrypted per batch: big enough to fill the cipher's parallel lanes, small enough
/// to stay on the stack.
const BATCH_BYTES: usize = 1024;

/// Sectors encrypted side by side: one block of each per `encrypt_blocks` call.
pub const LANES: usize = 16;

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

    fn encrypt_sectors(&self, ivs: &[u8], iv_size: usize, data: &mut [u8], sector_bytes: usize) {
        let bs = self.cipher.block_size();
        let mut row = [0u8; LANES * 16];
        for (g, group) in data.chunks_mut(LANES * sector_bytes).enumerate() {
            let k = group.len() / sector_bytes;
            // row[l] holds lane l's chaining value: its IV, then its last ciphertext block.
            for l in 0..k {
                let iv = &ivs[(g * LANES + l) * iv_size..];
                row[l * bs..(l + 1) * bs].copy_from_slice(&iv[..bs]);
            }
            for off in (0..sector_bytes).step_by(bs) {
                for l in 0..k {
                    let at = l * sector_bytes + off;
                    xor_in_place(&mut row[l * bs..(l + 1) * bs], &group[at..at + bs]);
                }
                self.cipher.encrypt_blocks(&mut row[..k * bs]);
                for l in 0..k {
                    let at = l * sector_bytes + off;
                    group[at..at + bs].copy_from_slice(&row[l * bs..(l + 1) * bs]);
                }
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Interleaved encryption equals sector-by-sector encryption, for every group size
    /// around the lane count, 16- and 8-byte blocks, 512- and 4096-byte sectors.
    #[test]
    fn interleaved_sectors_equal_one_sector_at_a_time() {
        for (cipher, key_len) in [("aes", 32usize), ("aes", 16), ("blowfish", 16)] {
            let key: Vec<u8> = (0..key_len).map(|i| (i * 11 + 5) as u8).collect();
            let cbc = Cbc::new(cipher, &key).unwrap();
            let iv_size = cbc.iv_size();
            for ss in [512usize, 4096] {
                for k in [1usize, 2, 15, 16, 17, 33] {
                    let plain: Vec<u8> = (0..k * ss).map(|i| (i * 7 + i / 512) as u8).collect();
                    let ivs: Vec<u8> = (0..k * iv_size).map(|i| (i * 3 + 1) as u8).collect();
                    let mut want = plain.clone();
                    for (j, s) in want.chunks_exact_mut(ss).enumerate() {
                        cbc.encrypt(&ivs[j * iv_size..(j + 1) * iv_size], s);
                    }
                    let mut got = plain.clone();
                    cbc.encrypt_sectors(&ivs, iv_size, &mut got, ss);
                    assert!(got == want, "{cipher}/{key_len} sector {ss} x{k}");
                }
            }
        }
    }
}
