//! Little-endian fields at byte offsets of on-disk structures (BitLocker, FileVault2).
//! Callers check the buffer length first; an index past it is a bug, not bad input.

/// The `u16` at `at`.
pub(crate) fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// The `u32` at `at`.
pub(crate) fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The `u64` at `at`.
pub(crate) fn le64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}
