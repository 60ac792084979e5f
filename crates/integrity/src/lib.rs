//! # ucrypt-integrity: dm-integrity in userspace
//!
//! [`IntegrityBackend`] keeps a tag per block beside the data, as Linux's dm-integrity does,
//! on any [`ucrypt_backend::Backend`], and is itself a `Backend` (as `engine::Volume` is):
//! reads check every block against its tag and fail exactly the blocks that do not match
//! ([`ucrypt_backend::BackendError::Integrity`], EILSEQ), writes go through the kernel's
//! journal with its commit ids (mode J), straight to their places (D), under a dirty
//! bitmap (B), or not at all (R: recovery, read-only, unchecked). A journal the kernel (or
//! ucrypt) left behind is replayed on open as the kernel replays it. The on-disk format is
//! `ucrypt_format::integrity`'s.
//!
//! ```text
//!   front end ──► IntegrityBackend ──► Arc<dyn Backend> (file, block device, RBD, memory)
//!                  │ read: data + tags, hash, compare (journal entries first in mode J)
//!                  │ write: J: journal entry + commit id, later copied; D/B: data + tags
//! ```
//!
//! Without `internal_hash` the tags are the layer above's ([`Options::external`],
//! [`IntegrityBackend::read_tagged`], [`IntegrityBackend::write_tagged`]): dm-crypt's
//! authenticated modes, which [`AeadVolume`] serves over such a device.

mod crypt;
mod device;
pub mod hash;
pub mod journal_crypt;
mod range_lock;
mod spread;
mod tags;

pub use crypt::{AeadVolume, Spread};
pub use device::{format, format_separate, IntegrityBackend, IntegrityError, Mode, Options};
pub use hash::{Algorithm, Hasher};
pub use journal_crypt::JournalCrypt;
