//! # ucrypt-engine: the decrypted view of a backend
//!
//! [`Volume`] turns ciphertext on a [`Backend`](ucrypt_backend::Backend) into plaintext,
//! and is itself a `Backend`, so anything that serves or stacks storage can use it. It splits
//! byte requests into whole encryption sectors, encrypts and decrypts them, and handles
//! requests that cover only part of a sector by read-modify-write under a range lock.
//! Knows nothing of wire protocols.
//!
//! ```text
//!  read_at / write_at (bytes)
//!        │  split.rs: head (partial) │ body (whole sectors) │ tail (partial)
//!        ▼
//!  body: read → decrypt in place          head/tail: lock range → read sector → merge → encrypt → write
//!        │
//!        ▼
//!  backend at data_offset + position
//! ```

mod error;
mod handoff;
pub mod options;
pub mod pool;
mod rangelock;
mod request;
mod sector_io;
pub mod split;
pub mod stats;
mod submit;
mod volume;
mod workers;

pub use error::EngineError;
pub use options::{AutoPolicy, EngineOptions, Placement, PoolOptions, WriteOrder};
pub use stats::ClientStats;
pub use volume::{RecryptOut, RecryptRange, Volume, VolumeConfig};
pub use workers::Inspect;
