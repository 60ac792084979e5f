//! The keyslot commands (`luksAddKey`, `luksChangeKey`, `luksConvertKey`, `luksKillSlot`,
//! `luksRemoveKey`) as cryptsetup 2.6 runs them: which keyslot is meant, which passphrase
//! is checked before anything else is asked or written, what is refused, and that the
//! last keyslot goes only when confirmed.
//!
//! Each takes a header already loaded ([`crate::header::load_luks`]) and the local path of
//! where that header lives (a detached header or the device), for
//! [`Prompt::write_header`]. Secrets come from the key files named in the options or from
//! the [`Prompt`]; long steps are announced through [`Prompt::busy`].

use super::{CryptDevice, HeaderType, KeyslotStatus, VolumeKey};
use crate::error::{Error, ErrorKind, Result};
use crate::header::{check_requirements, VolumeType};
use crate::prompt::{Prompt, Step};
use crate::secret::Secret;
use crate::unlock::{existing, read_key_input, KeyFile, Tokens};
use std::path::{Path, PathBuf};

pub use crate::reencrypt::PbkdfChoice;

/// `--keyslot-cipher` with `--keyslot-key-size`: how the LUKS2 keyslot area written next is
/// encrypted (default: the data segment's cipher).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyslotCipher {
    /// The cipher (`aes-xts-plain64`) and its key size in bits; none: the default.
    pub cipher: Option<(String, u32)>,
}

impl KeyslotCipher {
    /// Sets it on `cd` for the keyslot written next (nothing when not chosen).
    ///
    /// # Errors
    /// A LUKS1 header (cryptsetup: "can be set only for LUKS2 devices"), or libcryptsetup's.
    pub fn apply(&self, cd: &mut CryptDevice) -> Result<()> {
        let Some((cipher, bits)) = &self.cipher else {
            return Ok(());
        };
        if cd.info().kind != Some(HeaderType::Luks2) {
            return Err(Error::Invalid(
                "keyslot encryption parameters (--keyslot-cipher, --keyslot-key-size) can be \
                 set only for LUKS2 devices"
                    .into(),
            ));
        }
        Ok(cd.set_keyslot_encryption(cipher, *bits as usize / 8)?)
    }
}

/// The new passphrase: from `file` (with the new key file's offset and size), else asked
/// for as a new one.
fn new_passphrase(file: &KeyFile, question: &str, prompt: &mut dyn Prompt) -> Result<Secret> {
    match &file.path {
        Some(p) => read_key_input(p, file.offset, file.size, prompt),
        None => prompt.new_passphrase(question),
    }
}

/// The PBKDF benchmark of the keyslot written next (it writes nothing).
fn benchmark(cd: &mut CryptDevice, key_bytes: usize, prompt: &mut dyn Prompt) -> Result<()> {
    let _busy = prompt.busy(Step::Benchmark);
    Ok(cd.prebenchmark_pbkdf(key_bytes)?)
}

/// A keyslot write through [`Prompt::write_header`]; its keyslot number.
fn write_keyslot(
    prompt: &mut dyn Prompt,
    step: Step,
    header: &Path,
    mut write: impl FnMut() -> Result<u32>,
) -> Result<u32> {
    let mut slot = None;
    prompt.write_header(step, Some(header), 0, &mut || {
        slot = Some(write()?);
        Ok(())
    })?;
    slot.ok_or_else(|| Error::Invalid("the keyslot write did not run".into()))
}

/// A passphrase checked against the keyslots (`slot`, or any), announced as
/// [`Step::Passphrase`]: the keyslot it opens.
fn check_passphrase(
    cd: &mut CryptDevice,
    slot: Option<u32>,
    pass: &[u8],
    prompt: &mut dyn Prompt,
) -> Result<u32> {
    let _busy = prompt.busy(Step::Passphrase);
    Ok(cd.check_passphrase(slot, pass)?)
}

/// What `luksAddKey` is asked to do.
#[derive(Debug, Clone, Default)]
pub struct AddKey {
    /// The device as the user named it (tokens are read from it).
    pub device: PathBuf,
    /// Its detached header as named, if any.
    pub header: Option<PathBuf>,
    /// The LUKS type expected (`--type`).
    pub kind: VolumeType,
    /// The existing passphrase's key file (`--key-file`); none: asked for.
    pub key: KeyFile,
    /// The new passphrase's key file (the positional argument or `--new-keyfile`, with
    /// `--new-keyfile-offset`/`--new-keyfile-size`); none: asked for.
    pub new_key: KeyFile,
    /// `--key-slot`: with `new_key_slot` the keyslot the existing passphrase must open,
    /// without it the new keyslot (cryptsetup 2.6's meaning, with a warning).
    pub key_slot: Option<u32>,
    /// `--new-key-slot`: the new keyslot (default: the first free).
    pub new_key_slot: Option<u32>,
    /// `--volume-key-file`: the volume key instead of an existing passphrase.
    pub volume_key_file: Option<PathBuf>,
    /// The tokens tried for the volume key before an existing passphrase is asked for.
    pub tokens: Tokens,
    /// `--new-token-id`: the new passphrase comes from this token (a luks2-keyring token),
    /// which is assigned to the new keyslot.
    pub new_token_id: Option<u32>,
    /// PBKDF choices for the new keyslot.
    pub pbkdf: PbkdfChoice,
    /// The new keyslot's area encryption.
    pub keyslot_cipher: KeyslotCipher,
    /// `--batch-mode`: no warning about `--key-slot`'s meaning.
    pub batch: bool,
    /// `-v`: say which keyslot the passphrase unlocked ([`Prompt::info`]).
    pub verbose: bool,
}

/// `luksAddKey`: a new keyslot holding the new passphrase (or bound to a token), for the
/// volume key that `--volume-key-file`, a token or an existing passphrase gives, the
/// existing one checked before the new one is asked for. The new keyslot's number.
///
/// # Errors
/// The header's requirements are not met, `--keyslot-cipher` on LUKS1, a new keyslot out
/// of range (invalid); a volume key that is not the volume's or a wrong passphrase
/// ([`ErrorKind::Permission`]); the caller's prompt; libcryptsetup's.
pub fn add(
    cd: &mut CryptDevice,
    header: &Path,
    o: &AddKey,
    prompt: &mut dyn Prompt,
) -> Result<u32> {
    check_requirements(cd)?;
    o.keyslot_cipher.apply(cd)?;
    // cryptsetup 2.6: without --new-key-slot, --key-slot names the new keyslot.
    let (old_slot, new_slot) = match (o.key_slot, o.new_key_slot) {
        (Some(s), None) => {
            if !o.batch {
                prompt.info("WARNING: The --key-slot parameter is used for new keyslot number.");
            }
            (None, Some(s))
        }
        other => other,
    };
    if let Some(s) = new_slot {
        if cd.keyslot_status(s) == KeyslotStatus::Invalid {
            return Err(Error::Invalid(format!(
                "keyslot {s} is out of range for this header"
            )));
        }
    }
    let key = volume_key(cd, o, old_slot, prompt)?;
    if let (Some(token), None) = (o.new_token_id, &o.new_key.path) {
        // The token gives the new passphrase (libcryptsetup's keyslot contexts).
        o.pbkdf.apply(cd)?;
        return write_keyslot(prompt, Step::AddKeyslot, header, || {
            Ok(cd.add_keyslot_by_token(new_slot, &key, token)?)
        });
    }
    let new = new_passphrase(&o.new_key, "Enter new passphrase for key slot: ", prompt)?;
    o.pbkdf.apply(cd)?;
    let key_bytes = cd.info().key_bytes;
    benchmark(cd, key_bytes, prompt)?;
    write_keyslot(prompt, Step::AddKeyslot, header, || {
        Ok(cd.add_keyslot_by_volume_key(new_slot, Some(&key), &new)?)
    })
}

/// The volume key a new keyslot gets: from a token, else `--volume-key-file` (verified
/// against the header), else unlocked by an existing passphrase (of `old_slot`, if given).
fn volume_key(
    cd: &mut CryptDevice,
    o: &AddKey,
    old_slot: Option<u32>,
    prompt: &mut dyn Prompt,
) -> Result<VolumeKey> {
    if let Some(f) = &o.volume_key_file {
        // As cryptsetup: the file's first key-size bytes (a shorter file is refused).
        let want = cd.info().key_bytes as u64;
        let key = VolumeKey::new(read_key_input(f, 0, want, prompt)?.to_vec());
        cd.verify_volume_key(key.as_bytes())
            .map_err(|e| Error::from(e).with_kind(ErrorKind::Permission))?;
        return Ok(key);
    }
    let by_token = crate::unlock::token::volume_key(
        &o.device,
        o.header.as_deref(),
        o.kind,
        &o.tokens,
        prompt,
    )?;
    if let Some(key) = by_token {
        return Ok(key);
    }
    let old = existing(&o.key, "Enter any existing passphrase: ", prompt)?;
    let (slot, key) = {
        let _busy = prompt.busy(Step::Passphrase);
        cd.volume_key(old_slot, &old)?
    };
    // cryptsetup says so only for a typed (or piped) passphrase, not a key file.
    let from_file = o.key.path.as_ref().is_some_and(|f| f.as_os_str() != "-");
    if o.verbose && !from_file {
        prompt.info(&format!("Key slot {slot} unlocked."));
    }
    Ok(key)
}

/// What `luksAddKey --unbound` is asked to do.
#[derive(Debug, Clone, Default)]
pub struct AddUnbound {
    /// The new keyslot (`--key-slot`; default: the first free).
    pub key_slot: Option<u32>,
    /// The key's size in bits (`--key-size`).
    pub key_bits: u32,
    /// The key to store (`--volume-key-file`); none: a new random one.
    pub key_file: Option<PathBuf>,
    /// The new passphrase's key file; none: asked for.
    pub new_key: KeyFile,
    /// PBKDF choices for the new keyslot.
    pub pbkdf: PbkdfChoice,
    /// The new keyslot's area encryption.
    pub keyslot_cipher: KeyslotCipher,
}

/// `luksAddKey --unbound` (cryptsetup's `luksAddUnboundKey`): a LUKS2 keyslot bound to no
/// segment, holding a new random key (or the given one) under the new passphrase; no
/// existing passphrase is needed. `cd` holds a LUKS2 header. The new keyslot's number.
///
/// # Errors
/// As [`add`].
pub fn add_unbound(
    cd: &mut CryptDevice,
    header: &Path,
    o: &AddUnbound,
    prompt: &mut dyn Prompt,
) -> Result<u32> {
    check_requirements(cd)?;
    o.keyslot_cipher.apply(cd)?;
    let key_bytes = o.key_bits as usize / 8;
    o.pbkdf.apply(cd)?;
    let key = match &o.key_file {
        Some(f) => Some(VolumeKey::new(
            read_key_input(f, 0, key_bytes as u64, prompt)?.to_vec(),
        )),
        None => None,
    };
    let new = new_passphrase(&o.new_key, "Enter new passphrase for key slot: ", prompt)?;
    benchmark(cd, key_bytes, prompt)?;
    write_keyslot(prompt, Step::AddUnboundKeyslot, header, || {
        Ok(cd.add_unbound_keyslot(
            o.key_slot,
            key.as_ref().map(VolumeKey::as_bytes),
            key_bytes,
            &new,
        )?)
    })
}

/// What `luksChangeKey` is asked to do.
#[derive(Debug, Clone, Default)]
pub struct ChangeKey {
    /// The passphrase to change, from this key file; none: asked for.
    pub key: KeyFile,
    /// The new passphrase's key file; none: asked for.
    pub new_key: KeyFile,
    /// Only this keyslot's passphrase (`--key-slot`).
    pub key_slot: Option<u32>,
    /// PBKDF choices for the rewritten keyslot.
    pub pbkdf: PbkdfChoice,
    /// The rewritten keyslot's area encryption.
    pub keyslot_cipher: KeyslotCipher,
    /// `-v`: say which keyslot the old passphrase unlocked.
    pub verbose: bool,
}

/// `luksChangeKey`: the keyslot the old passphrase opens gets the new passphrase, the old
/// one checked before the new one is asked for. The keyslot written.
///
/// # Errors
/// A wrong old passphrase ([`ErrorKind::Permission`]); as [`add`].
pub fn change(
    cd: &mut CryptDevice,
    header: &Path,
    o: &ChangeKey,
    prompt: &mut dyn Prompt,
) -> Result<u32> {
    check_requirements(cd)?;
    o.keyslot_cipher.apply(cd)?;
    let old = existing(&o.key, "Enter passphrase to be changed: ", prompt)?;
    let unlocked = check_passphrase(cd, o.key_slot, &old, prompt)?;
    if o.verbose {
        prompt.info(&format!("Key slot {unlocked} unlocked."));
    }
    let new = new_passphrase(&o.new_key, "Enter new passphrase: ", prompt)?;
    o.pbkdf.apply(cd)?;
    let key_bytes = cd.info().key_bytes;
    benchmark(cd, key_bytes, prompt)?;
    write_keyslot(prompt, Step::ChangeKeyslot, header, || {
        Ok(cd.change_keyslot(o.key_slot, o.key_slot, &old, &new)?)
    })
}

/// What `luksConvertKey` is asked to do.
#[derive(Debug, Clone, Default)]
pub struct ConvertKey {
    /// The keyslot's passphrase, from this key file; none: asked for.
    pub key: KeyFile,
    /// The keyslot to convert (default: the one the passphrase opens).
    pub key_slot: Option<u32>,
    /// The new PBKDF (cryptsetup's defaults for what is not chosen).
    pub pbkdf: PbkdfChoice,
    /// The rewritten keyslot's area encryption.
    pub keyslot_cipher: KeyslotCipher,
}

/// `luksConvertKey`: a LUKS2 keyslot rewritten with new PBKDF parameters, same passphrase
/// (the keyslot changed to itself). `cd` holds a LUKS2 header. The keyslot written.
///
/// # Errors
/// The keyslot is not active (invalid); a wrong passphrase ([`ErrorKind::Permission`]);
/// as [`add`].
pub fn convert(
    cd: &mut CryptDevice,
    header: &Path,
    o: &ConvertKey,
    prompt: &mut dyn Prompt,
) -> Result<u32> {
    check_requirements(cd)?;
    if let Some(s) = o.key_slot {
        if cd.keyslot_status(s) == KeyslotStatus::Inactive {
            return Err(Error::Invalid(format!("keyslot {s} is not active")));
        }
    }
    o.keyslot_cipher.apply(cd)?;
    o.pbkdf.apply_always(cd)?;
    let pass = existing(
        &o.key,
        "Enter passphrase for keyslot to be converted: ",
        prompt,
    )?;
    let key_bytes = cd.info().key_bytes;
    benchmark(cd, key_bytes, prompt)?;
    write_keyslot(prompt, Step::ConvertKeyslot, header, || {
        Ok(cd.change_keyslot(o.key_slot, o.key_slot, &pass, &pass)?)
    })
}

/// cryptsetup's warning before the last keyslot is destroyed.
const LAST_KEYSLOT: &str =
    "This is the last keyslot. Device will become unusable after purging this key";
/// cryptsetup's words when that is not confirmed.
const LAST_KEYSLOT_KEPT: &str = "Operation aborted, the keyslot was NOT wiped.";

/// The last-keyslot rule: with `batch` it goes, else only once the caller confirms.
fn confirm_last(batch: bool, prompt: &mut dyn Prompt) -> Result<()> {
    if batch {
        return Ok(());
    }
    prompt.confirm_destroy(LAST_KEYSLOT, LAST_KEYSLOT_KEPT)
}

/// What `luksKillSlot` is asked to do.
#[derive(Debug, Clone, Default)]
pub struct KillSlot {
    /// The keyslot to destroy.
    pub slot: u32,
    /// A remaining passphrase's key file; none: asked for (unless `batch`).
    pub key: KeyFile,
    /// `--batch-mode`: no remaining passphrase asked for (one is still checked when a key
    /// file gives it), and the last keyslot goes without confirmation.
    pub batch: bool,
}

/// `luksKillSlot`: destroys one keyslot. Without `batch` a passphrase of another keyslot
/// must be given first, so that a typo in the number cannot lock the owner out; the last
/// keyslot goes only when confirmed.
///
/// # Errors
/// A keyslot out of range or not active (invalid); a wrong passphrase, or one of the
/// keyslot itself, or no confirmation for the last one ([`ErrorKind::Permission`]).
pub fn kill(cd: &mut CryptDevice, o: &KillSlot, prompt: &mut dyn Prompt) -> Result<()> {
    check_requirements(cd)?;
    match cd.keyslot_status(o.slot) {
        KeyslotStatus::Invalid => {
            return Err(Error::Invalid(format!("key slot {} is invalid", o.slot)))
        }
        KeyslotStatus::Inactive => {
            return Err(Error::Invalid(format!("keyslot {} is not active", o.slot)))
        }
        KeyslotStatus::ActiveLast => confirm_last(o.batch, prompt)?,
        KeyslotStatus::Active | KeyslotStatus::Unbound => {
            if !o.batch || o.key.path.is_some() {
                let pass = existing(&o.key, "Enter any remaining passphrase: ", prompt)?;
                if check_passphrase(cd, None, &pass, prompt)? == o.slot {
                    return Err(Error::Invalid(format!(
                        "the passphrase given opens keyslot {} itself; give one of another \
                         keyslot",
                        o.slot
                    ))
                    .with_kind(ErrorKind::Permission));
                }
            }
        }
    }
    Ok(cd.destroy_keyslot(o.slot)?)
}

/// What `luksRemoveKey` is asked to do.
#[derive(Debug, Clone, Default)]
pub struct RemoveKey {
    /// The passphrase to remove, from this key file; none: asked for.
    pub key: KeyFile,
    /// `--batch-mode`: the last keyslot goes without confirmation.
    pub batch: bool,
}

/// `luksRemoveKey`: destroys the keyslot the passphrase opens; the last one only when
/// confirmed. The keyslot destroyed.
///
/// # Errors
/// A wrong passphrase, or no confirmation for the last keyslot
/// ([`ErrorKind::Permission`]); libcryptsetup's.
pub fn remove(cd: &mut CryptDevice, o: &RemoveKey, prompt: &mut dyn Prompt) -> Result<u32> {
    check_requirements(cd)?;
    let pass = existing(&o.key, "Enter passphrase to be deleted: ", prompt)?;
    let slot = check_passphrase(cd, None, &pass, prompt)?;
    if cd.keyslot_status(slot) == KeyslotStatus::ActiveLast {
        confirm_last(o.batch, prompt)?;
    }
    cd.destroy_keyslot(slot)?;
    Ok(slot)
}
