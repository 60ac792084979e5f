//! # ucrypt: dm-crypt rebuilt in userspace
//!
//! The library behind the `ucrypt` command (package `ucrypt-cli`): it assembles the layers
//! (table line or unlocked header → [`format::Mapping`] → backends
//! and [`ucrypt_engine::Volume`]) and runs named instances, so the command only parses,
//! prompts and prints.
//!
//! ```text
//!  table line ──► open::open_table ──► format::TableLine ──► crypto::SectorCipher
//!  header ──► header::unlock ──► Unlocked ─┐      └──► backend::FileBackend ─┐
//!                                          ▼                                 ▼
//!                             mapping::open_mapping ─────────────► engine::Volume
//!                                                                            │
//!  instance::server::serve: Switch ─► NBD server, front end, control socket ◄┘
//! ```
//!
//! Every operation fails with a typed [`Error`] (what failed: the format layer's, the
//! backend's, the engine's error..., under `Context` links saying what was being done), and
//! [`Error::kind`] sorts it into an [`ErrorKind`], so callers choose by type, never by
//! message text.

pub mod bench;
pub mod config;
pub mod crypttab;
pub mod error;
pub mod export;
pub mod format;
pub mod header;
pub mod instance;
pub mod integrity;
pub mod keyring;
pub mod luks;
pub mod mapping;
pub mod open;
pub mod prompt;
pub mod reencrypt;
pub mod remote_header;
pub mod sd_notify;
pub mod secret;
pub mod secure;
pub mod settings;
pub mod tcrypt;
pub mod tcrypt_dump;
pub mod unlock;
pub mod unlocked;

pub use error::{
    chain_kind, link_is_busy, link_is_device, link_kind, open_kind, Error, ErrorKind, Result,
};
pub use header::{open_header, open_unlocked, unlock, HeaderOptions, Unlocked, VolumeType};
pub use open::{open_parsed, open_table, OpenOptions, OpenedTable};
