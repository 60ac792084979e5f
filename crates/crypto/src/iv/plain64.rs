//! `plain64`: le64 of the IV sector, zero-padded. The default of cryptsetup and LUKS.

use super::IvGenerator;

/// The `plain64` generator.
pub struct Plain64;

impl IvGenerator for Plain64 {
    #[inline]
    fn fill(&self, iv_sector: u64, iv: &mut [u8]) {
        iv.fill(0);
        iv[..8].copy_from_slice(&iv_sector.to_le_bytes());
    }
}
