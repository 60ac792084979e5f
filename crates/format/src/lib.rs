//! # ucrypt-format: what describes a volume
//!
//! Parses and prints dm-crypt table lines ([`table`]; keyring keys are read through
//! `ucrypt_crypto::keyring`). On-disk headers: LUKS2's binary header and JSON metadata as
//! typed values ([`luks2::metadata`]); libcryptsetup (LUKS1, LUKS2, and the other types it
//! reads) is bound in its own crate, `ucrypt-cryptsetup`, so that this one is pure Rust
//! without `unsafe`; [`plain`] holds cryptsetup's plain-mode key rules.
//! [`tcrypt`] decrypts TrueCrypt/VeraCrypt headers in pure Rust.
//! [`luks1`] and [`luks2`] unlock keyslots in pure Rust ([`kdf`], [`af`], ucrypt's own
//! ciphers) for ciphers libcryptsetup can only use through the kernel (Serpent, Twofish,
//! LRW, ESSIV with Whirlpool).
//! Knows nothing of I/O scheduling or protocols.
//!
//! ```text
//! "0 2048 crypt aes-xts-plain64 <key> 0 disk.img 0 1 sector_size:4096"
//!      │ TableLine::from_str          ▲ TableLine::to_line(ShowKeys)
//!      ▼                              │
//!  TableLine { cipher: CipherSpec, key: KeySource, opts: Vec<OptParam>, .. }
//!      │ TableLine::validate / build_cipher
//!      ▼
//!  Box<dyn ucrypt_crypto::SectorCipher>
//! ```

#![forbid(unsafe_code)]

pub mod af;
pub mod bitlk;
mod bytes;
pub mod device;
mod error;
pub mod fvault2;
pub mod info;
pub mod integrity;
pub mod kdf;
pub mod loopaes;
pub mod luks;
pub mod luks1;
pub mod luks2;
pub mod mapping;
pub mod plain;
pub mod size;
pub mod table;
pub mod tcrypt;

pub use device::{Device, DeviceKind};
pub use error::FormatError;
pub use info::{HeaderType, VolumeInfo};
pub use mapping::{Mapping, Table, Target};
pub use table::{DeviceRef, KeySource, OptParam, TableLine, ValidateOptions};
