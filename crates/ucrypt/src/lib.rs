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

pub mod config;
pub mod open;

pub use open::{open_table, OpenOptions, OpenedTable};
