//! `plain64be`: be64 of the IV sector in the last 8 bytes of the IV, zeros before.

use super::IvGenerator;

/// The `plain64be` generator.
pub struct Plain64Be;

impl IvGenerator for Plain64Be {
    fn fill(&self, iv_sector: u64, iv: &mut [u8]) {
        iv.fill(0);
        let n = iv.len();
        iv[n - 8..].copy_from_slice(&iv_sector.to_be_bytes());
    }
}
