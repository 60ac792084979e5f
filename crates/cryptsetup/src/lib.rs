//! # ucrypt-cryptsetup: libcryptsetup, the reference LUKS implementation, behind a safe API
//!
//! The one crate of the header layer with `unsafe` (the format crate is
//! `#![forbid(unsafe_code)]`) and the only one linked with `-lcryptsetup`.
//!
//! ```text
//!  CryptDevice::init(path) ──► load / format_luks / format_plain
//!        │                          │
//!        │   keyslots: add_*, change, destroy, status, check_passphrase
//!        ▼
//!  volume_key(passphrase) ──► VolumeKey  +  info(): cipher, offsets, sector size
//! ```
//!
//! Header and keyslot work goes through the library (`libcryptsetup.h`, 2.6), linked as
//! `-lcryptsetup` with hand-written declarations ([`ffi`], no bindgen/clang). It works on
//! image files without device-mapper: `crypt_activate_by_passphrase` with a NULL name only
//! checks a passphrase. ucrypt does the data path itself from what [`VolumeInfo`] says.
//! The declarations are checked against the installed `libcryptsetup.h` by a test that
//! compiles a C program printing each struct's size, alignment and field offsets and each
//! constant ([`ffi`]'s `layout` tests).

mod device;
mod ffi;
pub mod plain;
mod token;

pub use device::{
    activation_flags, disable_external_tokens, disable_metadata_locking,
    disable_volume_key_keyring, external_tokens_dir, external_tokens_disabled, keyslot_max,
    set_debug, set_external_tokens_path, split_cipher, CryptDevice, KeyslotStatus, LuksFormat,
    Pbkdf, ReencryptInit, ReencryptMode, TokenStatus,
};
pub use token::KeyslotPriority;
/// The header facts [`CryptDevice::info`] reports, in the format layer's own types.
pub use ucrypt_format::{HeaderType, VolumeInfo};

/// Persistent activation flag `CRYPT_ACTIVATE_ALLOW_DISCARDS`.
pub const ACTIVATE_ALLOW_DISCARDS: u32 = 1 << 3;
/// Persistent activation flag `CRYPT_ACTIVATE_SAME_CPU_CRYPT`.
pub const ACTIVATE_SAME_CPU_CRYPT: u32 = 1 << 6;
/// Persistent activation flag `CRYPT_ACTIVATE_SUBMIT_FROM_CRYPT_CPUS`.
pub const ACTIVATE_SUBMIT_FROM_CRYPT_CPUS: u32 = 1 << 7;
/// Persistent activation flag `CRYPT_ACTIVATE_NO_READ_WORKQUEUE`.
pub const ACTIVATE_NO_READ_WORKQUEUE: u32 = 1 << 24;
/// Persistent activation flag `CRYPT_ACTIVATE_NO_WRITE_WORKQUEUE`.
pub const ACTIVATE_NO_WRITE_WORKQUEUE: u32 = 1 << 25;
/// Requirement flag: an offline reencryption is unfinished (LUKS2).
pub const REQUIREMENT_OFFLINE_REENCRYPT: u32 = 1;
/// Requirement flag: an online reencryption is unfinished (LUKS2).
pub const REQUIREMENT_ONLINE_REENCRYPT: u32 = 1 << 1;
/// Requirement flag: a requirement this libcryptsetup does not know.
pub const REQUIREMENT_UNKNOWN: u32 = 1 << 31;
