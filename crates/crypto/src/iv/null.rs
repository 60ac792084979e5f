//! `null`: an all-zero IV (for compatibility only: identical plaintext sectors encrypt
//! identically).

use super::IvGenerator;

/// The `null` generator.
pub struct Null;

impl IvGenerator for Null {
    fn fill(&self, _iv_sector: u64, iv: &mut [u8]) {
        iv.fill(0);
    }
}
