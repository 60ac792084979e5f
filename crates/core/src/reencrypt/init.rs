//! The reencryption metadata of a LUKS2 volume that stays LUKS2 where it is: a re-key
//! (a new volume key in a new unbound keyslot, or `--keep-key`) and the decryption of a
//! volume whose header is detached. libcryptsetup writes it (`crypt_reencrypt_init`), as
//! cryptsetup's `reencrypt_luks2_init` and `decrypt_luks2_init` call it, so that either
//! tool resumes what the other started.

use super::interact::{Notice, Progress};
use super::options::{Mode, Options};
use super::volume_key::{key_bytes, read_volume_key};
use crate::error::{anyhow, Result};
use crate::header::{crypt_device, load_luks, VolumeType};
use ucrypt_cryptsetup::{CryptDevice, HeaderType, KeyslotStatus, ReencryptInit, ReencryptMode};

/// libcryptsetup's context on the volume with its LUKS2 header loaded.
pub(crate) fn load(opts: &Options) -> Result<CryptDevice> {
    let mut cd = crypt_device(&opts.device, opts.header.as_deref())?;
    load_luks(&mut cd, VolumeType::Luks2)?;
    Ok(cd)
}

/// `crypt_reencrypt_init`'s parameters for `mode` with the options' resilience, hotzone
/// and device size, without a data shift.
pub(crate) fn params(
    opts: &Options,
    mode: Mode,
    cipher: String,
    sector_size: u32,
) -> ReencryptInit {
    ReencryptInit {
        mode: match mode {
            Mode::Reencrypt => ReencryptMode::Reencrypt,
            Mode::Encrypt => ReencryptMode::Encrypt,
            Mode::Decrypt => ReencryptMode::Decrypt,
        },
        cipher,
        sector_size,
        resilience: opts.resilience_word(),
        hash: Some(opts.resilience_hash.clone()),
        max_hotzone_sectors: opts.hotzone_size.unwrap_or(0) / 512,
        device_size_sectors: opts.device_size.unwrap_or(0) / 512,
        data_shift_sectors: 0,
        move_first_segment: false,
    }
}

/// A re-key's metadata: a new volume key (random, or `--volume-key-file`'s) in an unbound
/// keyslot for the passphrase, then the reencrypt keyslot and segments.
///
/// # Errors
/// Not LUKS2, several keyslots and no `--key-slot`, a wrong passphrase, libcryptsetup's.
pub(crate) fn rekey(opts: &Options, passphrase: &[u8], progress: &mut dyn Progress) -> Result<()> {
    let mut cd = load(opts)?;
    let info = cd.info();
    if info.kind != Some(HeaderType::Luks2) {
        return Err(anyhow!(
            "{} is not LUKS2 (reencryption needs LUKS2)",
            opts.device.display()
        ));
    }
    let active: Vec<u32> = (0..32)
        .filter(|&s| {
            matches!(
                cd.keyslot_status(s),
                KeyslotStatus::Active | KeyslotStatus::ActiveLast
            )
        })
        .collect();
    if opts.keep_key {
        return keep_key(opts, cd, &info, passphrase);
    }
    if active.len() > 1 && opts.key_slot.is_none() {
        return Err(anyhow!(
            "{} has {} keyslots ({}); name the one to keep with --key-slot (the others are \
             removed when the reencryption finishes, as with cryptsetup reencrypt --key-slot)",
            opts.device.display(),
            active.len(),
            active
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let old_slot = cd.check_passphrase(opts.key_slot, passphrase)?;
    opts.pbkdf.apply(&mut cd)?;
    let cipher = new_data_cipher(opts, &info, progress);
    // cryptsetup's reencrypt_luks2_init: with -s or a new cipher the key size is -s or its
    // default for the new cipher's mode; otherwise the volume's.
    let key_bytes = if opts.key_size.is_some() || cipher != info.cipher_spec() {
        key_bytes(opts.key_size, &cipher)?
    } else {
        info.key_bytes
    };
    let new_slot = match &opts.volume_key_file {
        Some(f) => {
            let key = read_volume_key(f, key_bytes)?;
            if cd.verify_volume_key(key.as_bytes()).is_ok() {
                // The volume's own key (cryptsetup's crypt_volume_key_verify check): the
                // key stays, as with --keep-key.
                drop(key);
                return keep_key(opts, cd, &info, passphrase);
            }
            cd.add_unbound_keyslot(None, Some(key.as_bytes()), key_bytes, passphrase)
        }
        None => cd.add_keyslot_new_unbound_key(None, key_bytes, passphrase),
    }?;
    let p = params(
        opts,
        Mode::Reencrypt,
        cipher,
        opts.sector_size.unwrap_or(info.sector_size),
    );
    // The old keyslot's tokens open the new one too (its passphrase is the same), as
    // cryptsetup's assign_tokens does: the old keyslot goes when the reencryption ends,
    // and its tokens would be left assigned to nothing.
    let assigned = assign_tokens(&mut cd, old_slot, new_slot);
    let init = assigned.and_then(|()| {
        cd.reencrypt_init(Some(old_slot), Some(new_slot), passphrase, &p)
            .map_err(Into::into)
    });
    if let Err(e) = init {
        // Leave the header as it was.
        let _ = cd.destroy_keyslot(new_slot);
        return Err(e);
    }
    Ok(())
}

/// Assigns every token of keyslot `old` to keyslot `new` too.
fn assign_tokens(cd: &mut CryptDevice, old: u32, new: u32) -> Result<()> {
    for token in 0..32 {
        if cd.token_is_assigned(token, old)? {
            cd.assign_token(token, Some(new))?;
        }
    }
    Ok(())
}

/// The data cipher after a re-key: `--cipher`, else the volume's, except that a volume
/// without encryption (`cipher_null`) gets cryptsetup's default, as cryptsetup 2.6 does.
fn new_data_cipher(
    opts: &Options,
    info: &ucrypt_cryptsetup::VolumeInfo,
    progress: &mut dyn Progress,
) -> String {
    if let Some(c) = &opts.cipher {
        return c.clone();
    }
    let current = info.cipher_spec();
    let name = current.split('-').next().unwrap_or_default();
    if name == "cipher_null" || name == "null" {
        progress.notice(Notice::info(
            "Switching data encryption cipher to aes-xts-plain64.",
        ));
        return "aes-xts-plain64".into();
    }
    current
}

/// `--keep-key`, as cryptsetup's `reencrypt_luks2_init` without a volume key change: the
/// same key (and keyslots), a new cipher or sector size; the old and new segments share
/// the one digest and no keyslot is removed at the end.
fn keep_key(
    opts: &Options,
    mut cd: CryptDevice,
    info: &ucrypt_cryptsetup::VolumeInfo,
    passphrase: &[u8],
) -> Result<()> {
    let cipher = opts.cipher.clone().unwrap_or_else(|| info.cipher_spec());
    let sector_size = opts.sector_size.unwrap_or(info.sector_size);
    if opts
        .key_size
        .is_some_and(|b| b as usize != info.key_bytes * 8)
    {
        return Err(anyhow!(
            "reencrypt --keep-key keeps the {}-bit volume key: -s cannot change its size",
            info.key_bytes * 8
        ));
    }
    if cipher == info.cipher_spec() && sector_size == info.sector_size {
        return Err(anyhow!(
            "No data segment parameters changed. Reencryption aborted."
        ));
    }
    let slot = cd.check_passphrase(opts.key_slot, passphrase)?;
    let p = params(opts, Mode::Reencrypt, cipher, sector_size);
    cd.reencrypt_init(Some(slot), Some(slot), passphrase, &p)?;
    Ok(())
}

/// `--decrypt --header HDR DEV`, as cryptsetup's `decrypt_luks2_init`: the decryption
/// metadata (mode decrypt, direction backward, the new side a linear segment).
///
/// # Errors
/// Not LUKS2, a header with a data offset (attached), a wrong passphrase, libcryptsetup's.
pub(crate) fn decrypt(opts: &Options, passphrase: &[u8]) -> Result<()> {
    let mut cd = load(opts)?;
    let info = cd.info();
    if info.kind != Some(HeaderType::Luks2) {
        return Err(anyhow!(
            "{} is not LUKS2 (decryption needs LUKS2)",
            opts.header_path().display()
        ));
    }
    if info.data_offset > 0 {
        return Err(anyhow!(
            "LUKS2 decryption is supported with detached header device only (with data offset \
             set to 0)."
        ));
    }
    cd.check_passphrase(opts.key_slot, passphrase)?;
    let p = params(opts, Mode::Decrypt, String::new(), 0);
    cd.reencrypt_init(opts.key_slot, None, passphrase, &p)?;
    Ok(())
}
