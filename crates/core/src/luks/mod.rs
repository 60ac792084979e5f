//! LUKS header commands: what `luksFormat`, the keyslot and token commands, `config`,
//! `convert`, `erase` and the dumps do to a header, over libcryptsetup.
//!
//! The header handle is the `cryptsetup` crate's [`CryptDevice`] (with its status and
//! type enums): its methods are the header operations themselves, each one libcryptsetup
//! call with a typed error, so the library hands it out as it is rather than wrapping
//! every method. [`crate::header::crypt_device`] and [`crate::header::load_luks`] open
//! one; the commands' decisions on top of those calls are here: [`keyslots`] (adding,
//! changing, converting and destroying keyslots), [`tokens`] (the `token` action), [`dump`] (`luksDump`),
//! [`header`] (actions on the header as a whole, backup and restore), [`format`](mod@format)
//! (`luksFormat`, with `--integrity`), and below, the
//! persistent flags, erasing every keyslot and the data-cipher check.

pub mod dump;
pub mod format;
pub mod header;
pub mod keyslots;
pub mod tokens;

pub use ucrypt_cryptsetup::{
    keyslot_max, CryptDevice, HeaderType, KeyslotStatus, LuksFormat, Pbkdf, TokenStatus, VolumeInfo,
};

use crate::config::PerfOptions;
use crate::error::Result;

/// Stores the activation flags of `perf` (and discards, if `allow_discards`) as the
/// header's persistent flags, replacing the stored set, as cryptsetup's `open --persistent`
/// does after the passphrase proved right.
///
/// # Errors
/// libcryptsetup's (not a LUKS2 header, the write failed).
pub fn store_persistent_flags(
    cd: &mut CryptDevice,
    perf: &PerfOptions,
    allow_discards: bool,
) -> Result<()> {
    let mut flags = perf.activation_flags();
    if allow_discards {
        flags |= ucrypt_cryptsetup::ACTIVATE_ALLOW_DISCARDS;
    }
    Ok(cd.set_persistent_activation_flags(flags)?)
}

/// Destroys every keyslot of the header (cryptsetup's `erase`): no passphrase opens the
/// volume afterwards.
///
/// # Errors
/// The first keyslot that could not be destroyed (those before it are gone).
pub fn erase_keyslots(cd: &mut CryptDevice) -> Result<()> {
    let max = cd.info().kind.map_or(0, keyslot_max);
    for slot in 0..max {
        if !matches!(
            cd.keyslot_status(slot),
            KeyslotStatus::Invalid | KeyslotStatus::Inactive
        ) {
            cd.destroy_keyslot(slot)?;
        }
    }
    Ok(())
}

/// A volume key as the header commands take it (`--volume-key-file`): zeroed on drop.
pub use ucrypt_crypto::VolumeKey;

/// Checks that ucrypt's data path serves the data cipher `spec` (e.g. `aes-xts-plain64`),
/// before a header naming it is written.
///
/// # Errors
/// The crypto layer's reason for refusing it.
pub fn check_data_cipher(spec: &str) -> Result<()> {
    spec.parse::<ucrypt_crypto::CipherSpec>()?;
    Ok(())
}
