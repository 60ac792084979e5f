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
mod rangelock;
pub mod split;
mod volume;

pub use error::EngineError;
pub use volume::{Volume, VolumeConfig};
