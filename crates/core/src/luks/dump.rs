//! `luksDump`: the header as libcryptsetup prints it, its LUKS2 JSON metadata, or, once
//! confirmed and unlocked, the volume key or an unbound keyslot's key (printed by the
//! caller, or stored to a new owner-only file here).

use super::{CryptDevice, KeyslotStatus, VolumeInfo, VolumeKey};
use crate::error::{Error, Result};
use crate::prompt::{Prompt, Step};
use crate::unlock::{existing, question, KeyFile};
use std::path::{Path, PathBuf};

/// What `luksDump` is asked for.
#[derive(Debug, Clone, Default)]
pub struct Dump {
    /// The device as named to the user (the passphrase question names it).
    pub device: PathBuf,
    /// `--dump-json-metadata`.
    pub json: bool,
    /// `--dump-volume-key`.
    pub volume_key: bool,
    /// `--unbound` with `--key-slot`: this unbound keyslot's key.
    pub unbound: Option<u32>,
    /// The passphrase's key file; none: asked for.
    pub key: KeyFile,
    /// `--volume-key-file`: the key goes to this new file instead of being returned.
    pub volume_key_file: Option<PathBuf>,
    /// `--batch-mode`: the dump of a key is not confirmed first.
    pub batch: bool,
}

/// A key a dump unlocked.
pub struct KeyDump {
    /// The header's parameters (cipher, data offset, UUID).
    pub info: VolumeInfo,
    /// The key's size in bits.
    pub bits: usize,
    /// The key, or none when it was stored to `--volume-key-file`.
    pub key: Option<VolumeKey>,
}

/// What a dump gives.
pub enum Output {
    /// The LUKS2 JSON metadata.
    Json(String),
    /// libcryptsetup's text dump.
    Text(String),
    /// The volume key.
    VolumeKey(KeyDump),
    /// The key of the unbound keyslot (the number).
    Unbound(u32, KeyDump),
}

/// cryptsetup's warning before the volume key is dumped.
const VOLUME_KEY_WARNING: &str = "Header dump with volume key is sensitive information that \
     allows access to the encrypted partition without a passphrase. This dump should always \
     be stored encrypted in a safe place";

/// cryptsetup's warning before an unbound key is dumped.
const UNBOUND_WARNING: &str = "The header dump with unbound key is sensitive information. \
     This dump should be stored encrypted in a safe place";

/// `luksDump` on a loaded header.
///
/// # Errors
/// `--volume-key-file` without a key to dump, a keyslot that holds no unbound key, an empty
/// volume key (invalid); not confirmed; a wrong passphrase ([`crate::ErrorKind::Permission`]);
/// the key file exists or cannot be written; libcryptsetup's.
pub fn dump(cd: &mut CryptDevice, d: &Dump, prompt: &mut dyn Prompt) -> Result<Output> {
    if d.json {
        return Ok(Output::Json(cd.dump_json()?));
    }
    if d.volume_key_file.is_some() && !d.volume_key && d.unbound.is_none() {
        return Err(Error::Invalid(
            "--volume-key-file needs --dump-volume-key or --unbound".into(),
        ));
    }
    if let (Some(slot), false) = (d.unbound, d.volume_key) {
        return unbound(cd, slot, d, prompt);
    }
    if !d.volume_key {
        return Ok(Output::Text(cd.dump()?));
    }
    confirm(d.batch, VOLUME_KEY_WARNING, prompt)?;
    let pass = existing(&d.key, &question(&d.device), prompt)?;
    let (_, key) = {
        let _busy = prompt.busy(Step::DumpVolumeKey);
        // Any keyslot, as cryptsetup 2.6 (it reads --key-slot only for --unbound).
        cd.volume_key(None, &pass)?
    };
    let info = cd.info();
    if key.is_empty() {
        return Err(Error::Invalid("empty volume key".into()));
    }
    Ok(Output::VolumeKey(stored(d, info, key)?))
}

/// `luksDump --unbound -S N`: the key of unbound keyslot N (cryptsetup's
/// `luksDump_with_unbound_key`).
fn unbound(cd: &mut CryptDevice, slot: u32, d: &Dump, prompt: &mut dyn Prompt) -> Result<Output> {
    if cd.keyslot_status(slot) != KeyslotStatus::Unbound {
        return Err(Error::Invalid(format!(
            "keyslot {slot} does not contain an unbound key"
        )));
    }
    confirm(d.batch, UNBOUND_WARNING, prompt)?;
    let pass = existing(&d.key, &question(&d.device), prompt)?;
    let key = {
        let _busy = prompt.busy(Step::UnboundKey);
        cd.unbound_key(slot, &pass)?
    };
    let info = cd.info();
    Ok(Output::Unbound(slot, stored(d, info, key)?))
}

/// The key as the dump returns it: stored to `--volume-key-file` if one is given.
fn stored(d: &Dump, info: VolumeInfo, key: VolumeKey) -> Result<KeyDump> {
    let bits = key.len() * 8;
    let key = match &d.volume_key_file {
        Some(f) => {
            write_key_file(f, key.as_bytes())?;
            None
        }
        None => Some(key),
    };
    Ok(KeyDump { info, bits, key })
}

/// Writes `key` to a new file (never overwritten), readable by its owner only, as
/// cryptsetup's `tools_write_mk`.
fn write_key_file(f: &Path, key: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o400)
        .open(f)
        .and_then(|mut file| file.write_all(key))
        .map_err(|e| Error::Invalid(format!("cannot write the key to {}: {e}", f.display())))
}

/// `question` confirmed by the caller, unless `batch`.
fn confirm(batch: bool, question: &str, prompt: &mut dyn Prompt) -> Result<()> {
    if batch {
        return Ok(());
    }
    prompt.confirm(question)
}
