//! # ucrypt-crypto: dm-crypt compatible sector encryption
//!
//! Turns a dm-crypt cipher spec (`aes-xts-plain64`, `capi:cbc(aes)-essiv:sha256`,
//! `aes:64-cbc-lmk`), a key and sector parameters into a [`SectorCipher`] that produces
//! exactly the ciphertext the Linux kernel's dm-crypt produces. Knows nothing of files,
//! threads or protocols.
//!
//! ```text
//! CipherSpec::from_str ──► CipherSpec::build(key, SectorParams) ──► Box<dyn SectorCipher>
//!                                │
//!            key split per keycount (+ lmk seed / tcw seed+whitening / elephant key)
//!                                │
//!                 one lane per subkey: IV generator (iv/) + chaining mode (mode/)
//!                                  or a legacy cipher (legacy/)
//!                                │
//!                       block ciphers by kernel name (block.rs)
//! ```
//!
//! Correctness is defined by the kernel: `tests/golden.rs` replays ciphertext written by the
//! real dm-crypt (`testdata/golden/`, copied from the kernel-made set).
#![deny(unsafe_code)]

pub mod aead;
mod aead_spec;
pub mod block;
mod error;
pub mod iv;
mod key;
pub mod keyring;
pub mod lane;
pub mod legacy;
pub mod mode;
pub mod secret;
mod sector;
mod spec;
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod testing;

pub use block::twofish_code_path;
pub use error::CryptoError;
pub use key::VolumeKey;
pub use sector::{Sector512, SectorCipher, SectorParams, SectorSize};
pub use spec::CipherSpec;
