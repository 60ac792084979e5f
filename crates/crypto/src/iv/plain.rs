//! `plain`: le32 of the IV sector (so it wraps at 2^32 sectors), zero-padded.
//! dm-crypt keeps it for compatibility with old volumes; use `plain64`.

use super::IvGenerator;

/// The `plain` generator.
pub struct Plain;

impl IvGenerator for Plain {
    fn fill(&self, iv_sector: u64, iv: &mut [u8]) {
        iv.fill(0);
        iv[..4].copy_from_slice(&(iv_sector as u32).to_le_bytes());
    }
}
