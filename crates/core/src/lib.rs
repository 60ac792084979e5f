//! # ucrypt: dm-crypt rebuilt in userspace
//!
//! The library half of the `ucrypt` command: it assembles the layers (table line →
//! cipher, device → backend, both → [`ucrypt_engine::Volume`]) so the CLI stays thin.
//!
//! ```text
//!  cli (parse, print) ──► open::open_table ──► format::TableLine ──► crypto::SectorCipher
//!                                         └──► backend::FileBackend ─┐
//!                                                                    ▼
//!                                                           engine::Volume
//! ```
//!
//! Every operation fails with a typed [`Error`] (what failed: the format layer's, the
//! backend's, the engine's error..., under `Context` links saying what was being done), so
//! callers choose by type, never by message text.

pub mod bench;
pub mod config;
pub mod error;
pub mod header;
pub mod instance;
pub mod keyring;
pub mod mapping;
pub mod open;
pub mod reencrypt;
pub mod reencrypt_luks1;
pub mod remote_header;
pub mod secure;
pub mod tcrypt;
pub mod unlocked;

pub use error::{Error, ErrorKind, Result};
pub use header::{open_header, open_unlocked, unlock, HeaderOptions, Unlocked, VolumeType};
pub use open::{open_parsed, open_table, OpenOptions, OpenedTable};
