//! `eboiv`: Encrypted Byte-Offset IV (BitLocker): E_subkey(le64(iv_sector × sector_size) ‖ 0)
//! with the data cipher and key. dm-crypt multiplies by the sector size even without
//! `iv_large_sectors` (golden case `aes-cbc-eboiv-k256-ss4096`).

use super::IvGenerator;
use crate::block::{new_block_cipher, BlockCipher};
use crate::CryptoError;

/// The `eboiv` generator for one subkey.
pub struct Eboiv {
    cipher: Box<dyn BlockCipher>,
    sector_bytes: u64,
}

impl Eboiv {
    /// `cipher` and `subkey` are the data cipher's; `sector_bytes` the encryption unit.
    ///
    /// # Errors
    /// Key errors of the cipher.
    pub fn new(cipher: &str, subkey: &[u8], sector_bytes: u32) -> Result<Self, CryptoError> {
        Ok(Eboiv {
            cipher: new_block_cipher(cipher, subkey)?,
            sector_bytes: u64::from(sector_bytes),
        })
    }
}

impl IvGenerator for Eboiv {
    fn fill(&self, iv_sector: u64, iv: &mut [u8]) {
        iv.fill(0);
        iv[..8].copy_from_slice(&iv_sector.wrapping_mul(self.sector_bytes).to_le_bytes());
        let bs = self.cipher.block_size();
        self.cipher.encrypt_blocks(&mut iv[..bs]);
    }
}
