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

pub mod bench;
pub mod config;
pub mod header;
pub mod instance;
pub mod mapping;
pub mod open;
pub mod reencrypt;
pub mod remote_header;
pub mod secure;
pub mod tcrypt;
pub mod unlocked;

pub use header::{open_header, open_unlocked, unlock, HeaderOptions, Unlocked, VolumeType};
pub use open::{open_parsed, open_table, OpenOptions, OpenedTable};
