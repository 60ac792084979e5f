//! cryptsetup's actions on a LUKS header as a whole, none of which needs the kernel:
//! `config` (label, subsystem, keyslot priority), `convert` (LUKS1 <-> LUKS2), `erase`
//! (every keyslot destroyed), `repair`, and header backup and restore. What each checks
//! and asks before it writes is decided here; the caller loads the header and confirms
//! through its [`Prompt`].

use super::{CryptDevice, HeaderType};
use crate::error::{Error, Result};
use crate::prompt::{Prompt, Step};
use std::path::Path;

/// What `config` sets.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// The LUKS2 label (set together with the subsystem; the one not given is cleared).
    pub label: Option<String>,
    /// The LUKS2 subsystem (`""` clears it).
    pub subsystem: Option<String>,
    /// A keyslot's priority (`ignore`, `normal` or `prefer`) with the keyslot.
    pub priority: Option<(String, u32)>,
}

impl Config {
    /// Refuses a `config` that sets nothing (checked before the device is read).
    ///
    /// # Errors
    /// Nothing to set (invalid).
    pub fn check(&self) -> Result<()> {
        if self.label.is_none() && self.subsystem.is_none() && self.priority.is_none() {
            return Err(Error::Invalid(
                "config needs --label, --subsystem or --priority with --key-slot".into(),
            ));
        }
        Ok(())
    }
}

/// `config`: label and subsystem (as cryptsetup, both at once), then the keyslot priority,
/// on a LUKS2 header.
///
/// # Errors
/// Nothing to set or an unknown priority (invalid; a label already set stays so);
/// libcryptsetup's.
pub fn config(cd: &mut CryptDevice, c: &Config) -> Result<()> {
    c.check()?;
    if c.label.is_some() || c.subsystem.is_some() {
        cd.set_label(c.label.as_deref(), c.subsystem.as_deref())?;
    }
    if let Some((p, slot)) = &c.priority {
        let prio = match p.as_str() {
            "ignore" => 0,
            "normal" => 1,
            "prefer" => 2,
            other => {
                return Err(Error::Invalid(format!(
                    "unknown --priority {other:?} (ignore, normal or prefer)"
                )))
            }
        };
        cd.set_keyslot_priority(*slot, prio)?;
    }
    Ok(())
}

/// The header type `convert --type` names.
///
/// # Errors
/// Neither `luks1` nor `luks2` (invalid).
pub fn convert_target(kind: &str) -> Result<HeaderType> {
    match kind {
        "luks1" => Ok(HeaderType::Luks1),
        "luks2" => Ok(HeaderType::Luks2),
        other => Err(Error::Invalid(format!(
            "--type {other:?}: luksConvert converts to luks1 or luks2"
        ))),
    }
}

/// `convert`: the header of `device` (as named to the user) rewritten as `to`, once
/// confirmed (`batch`: without asking).
///
/// # Errors
/// Already of that type (invalid), not confirmed, libcryptsetup's.
pub fn convert(
    cd: &mut CryptDevice,
    device: &Path,
    to: HeaderType,
    batch: bool,
    prompt: &mut dyn Prompt,
) -> Result<()> {
    if cd.info().kind == Some(to) {
        return Err(Error::Invalid(format!(
            "{} is already {to}",
            device.display()
        )));
    }
    confirm(
        batch,
        &format!(
            "In-place conversion to {to} format is dangerous operation. Are you sure?\n\
             Operation converts type of device {}",
            device.display()
        ),
        prompt,
    )?;
    Ok(cd.convert(to)?)
}

/// `erase`: every keyslot of `device`'s header destroyed once confirmed; no passphrase
/// opens the volume afterwards.
///
/// # Errors
/// Not confirmed, or the first keyslot that could not be destroyed.
pub fn erase(
    cd: &mut CryptDevice,
    device: &Path,
    batch: bool,
    prompt: &mut dyn Prompt,
) -> Result<()> {
    confirm(
        batch,
        &format!(
            "This operation will erase all keyslots on device {}.\nDevice will become unusable \
             after this operation",
            device.display()
        ),
        prompt,
    )?;
    super::erase_keyslots(cd)
}

/// `repair`: libcryptsetup's repair of `device`'s header once confirmed (`cd` need not
/// have loaded it).
///
/// # Errors
/// Not confirmed, libcryptsetup's.
pub fn repair(
    cd: &mut CryptDevice,
    device: &Path,
    batch: bool,
    prompt: &mut dyn Prompt,
) -> Result<()> {
    confirm(
        batch,
        &format!(
            "Really try to repair LUKS device header of {}",
            device.display()
        ),
        prompt,
    )?;
    Ok(cd.repair(None)?)
}

/// `luksHeaderBackup`: the whole header area (binary headers, keyslots) copied to the new
/// file `backup`.
///
/// # Errors
/// libcryptsetup's (the file exists, the header cannot be read).
pub fn backup(cd: &mut CryptDevice, backup: &Path, prompt: &mut dyn Prompt) -> Result<()> {
    prompt.write_header(Step::BackupHeader, None, 0, &mut || {
        Ok(cd.header_backup(backup)?)
    })
}

/// The question `luksHeaderRestore` asks before it writes.
fn restore_question(header: &Path, backup: &Path) -> String {
    format!(
        "Device {} will be overwritten with the header from {}; keyslots not in the backup \
         will be lost",
        header.display(),
        backup.display()
    )
}

/// Asks `luksHeaderRestore`'s question for the header at `header` (as named to the user),
/// unless `batch`; asked before the device is read.
///
/// # Errors
/// Not confirmed.
pub fn confirm_restore(
    header: &Path,
    backup: &Path,
    batch: bool,
    prompt: &mut dyn Prompt,
) -> Result<()> {
    confirm(batch, &restore_question(header, backup), prompt)
}

/// `luksHeaderRestore` once confirmed ([`confirm_restore`]): the backup written over the
/// header at `local` (the local path of the header or device `cd` opened), as much of it
/// as the backup holds.
///
/// # Errors
/// libcryptsetup's (not a backup, not the same volume type).
pub fn restore(
    cd: &mut CryptDevice,
    local: &Path,
    backup: &Path,
    prompt: &mut dyn Prompt,
) -> Result<()> {
    // The backup's whole length is what the restore may write.
    let len = std::fs::metadata(backup).map_or(0, |m| m.len());
    prompt.write_header(Step::RestoreHeader, Some(local), len, &mut || {
        Ok(cd.header_restore(backup)?)
    })
}

/// `question` confirmed by the caller, unless `batch`.
fn confirm(batch: bool, question: &str, prompt: &mut dyn Prompt) -> Result<()> {
    if batch {
        return Ok(());
    }
    prompt.confirm(question)
}
