//! Standalone dm-integrity devices (`integritysetup`): the superblock, the format
//! parameters and the formatting of a device. The `integrity` crate's format API is the
//! library's for these devices (a command chooses the algorithms and parameters, the
//! crate writes the superblock, journal and tags), so its names are re-exported here;
//! opening one is [`crate::mapping::open_mapping`]'s, from an `integrity` table line.

pub use ucrypt_format::integrity::{FormatParams, Superblock, SALT_SIZE};
pub use ucrypt_integrity::{format, Algorithm, Mode, Options};
