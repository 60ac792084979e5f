//! Compatibility ciphers that dm-crypt files under "IV modes" but that transform data:
//! `lmk` (loop-AES), `tcw` (TrueCrypt), `elephant` (BitLocker's diffuser). Each is a
//! [`crate::lane::Lane`] wrapping CBC. Compatibility only; do not use them for new volumes.

pub mod elephant;
pub mod lmk;
pub mod tcw;
