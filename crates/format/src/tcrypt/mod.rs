//! TrueCrypt and VeraCrypt (TCRYPT) headers in pure Rust: key derivation, header
//! decryption by trial of every KDF and cipher chain, and the device-mapper layers
//! cryptsetup builds from the result (facts from cryptsetup's `lib/tcrypt/tcrypt.c` and
//! the VeraCrypt documentation).
//!
//! ```text
//!  device ─► 512-byte header at 0 / 64 KiB (hidden) / end-1536 (old hidden) /
//!            31744 (system) / end-128 KiB, end-64 KiB (backups)
//!            [salt 64][encrypted 448]
//!  passphrase + key files ─► pool ─► every KDF (PBKDF2 per hash and iteration count,
//!            Argon2id; PIM changes the costs) ─► 192-byte header key
//!  header key ─► every cipher chain (XTS, LRW, legacy CBC) ─► magic TRUE/VERA + CRC-32s
//!  decrypted keys ─► one dm-crypt layer per cipher (innermost = last cipher, on disk)
//! ```

pub mod keyfile;

use crate::{DeviceRef, FormatError, KeySource, Mapping, OptParam, TableLine};
use std::os::unix::fs::FileExt;
use std::path::Path;
use ucrypt_crypto::block::new_block_cipher;
use ucrypt_crypto::{CipherSpec, Sector512, SectorParams, VolumeKey};
use zeroize::Zeroizing;

/// Bytes of one header on disk.
pub const HEADER_BYTES: usize = 512;
const SALT_LEN: usize = 64;
const ENC_LEN: usize = 448;
const HDR_KEY_LEN: usize = 192;
/// Byte offset of the hidden-volume header.
pub const HIDDEN_OFFSET: u64 = 65536;
/// Distance from the device end of the hidden header in the oldest TrueCrypt format.
pub const HIDDEN_OFFSET_OLD_FROM_END: u64 = 1536;
/// Distance from the device end of the backup (normal) header.
pub const BACKUP_OFFSET_FROM_END: u64 = 131072;
/// Distance from the device end of the backup hidden header.
pub const HIDDEN_BACKUP_OFFSET_FROM_END: u64 = 65536;
/// Byte offset of the system-encryption header on the whole drive (sector 62).
pub const SYSTEM_OFFSET: u64 = 31744;

mod header;
mod search;
mod tables;
#[cfg(test)]
mod tests;

pub use header::{DataArea, Geometry, Layer, TcryptHeader};
pub use search::{
    chain_candidates, kdf_candidates, load, SearchProgress, SearchStep, TcryptOptions,
};
pub use tables::{Alg, Algs, ChainMode, KdfEntry, TcHash, CHAINS, KDFS};
