//! `benbi`: the big-endian count of narrow (cipher-block) units from the start, 1-based,
//! in the last 8 bytes: be64((iv_sector << (9 - log2(block size))) + 1). Made for LRW.

use super::IvGenerator;
use crate::CryptoError;

/// The `benbi` generator for one cipher block size.
pub struct Benbi {
    shift: u32,
}

impl Benbi {
    /// `block_size` must be a power of two no larger than 512 (dm-crypt: "cypher blocksize
    /// is not a power of 2" / "cypher blocksize is > 512").
    ///
    /// # Errors
    /// [`CryptoError::IvMode`] otherwise.
    pub fn new(block_size: usize) -> Result<Self, CryptoError> {
        if !block_size.is_power_of_two() || block_size > 512 {
            return Err(CryptoError::IvMode {
                iv: "benbi".into(),
                reason: format!("cipher block size {block_size} is not a power of two up to 512"),
            });
        }
        Ok(Benbi {
            shift: 9 - block_size.trailing_zeros(),
        })
    }
}

impl IvGenerator for Benbi {
    fn fill(&self, iv_sector: u64, iv: &mut [u8]) {
        iv.fill(0);
        let n = iv.len();
        let v = (iv_sector << self.shift).wrapping_add(1);
        iv[n - 8..].copy_from_slice(&v.to_be_bytes());
    }
}
