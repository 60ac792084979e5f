//! Compatibility ciphers that dm-crypt files under "IV modes" but that transform data:
//! `lmk` (loop-AES), `tcw` (TrueCrypt), `elephant` (BitLocker's diffuser). Each is a
//! [`crate::lane::Lane`] wrapping CBC. Compatibility only; do not use them for new volumes.
//! [`tcrypt_cbc`] adds the ciphers TrueCrypt's CBC cascades and Blowfish need on top of
//! `tcw`, which the kernel does not have.

pub mod elephant;
pub mod lmk;
pub mod tcrypt_cbc;
pub mod tcw;
