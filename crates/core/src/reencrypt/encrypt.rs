//! A plaintext device's new LUKS2 header and its encryption metadata, as cryptsetup's
//! `encrypt_luks2_init`: luksFormat (a random or `--volume-key-file` key; UUID, label,
//! subsystem, sector size, metadata and keyslots area sizes as given), the passphrase's
//! keyslot, then `crypt_reencrypt_init` in mode encrypt. With a detached header the whole
//! device is one linear segment, forward; with `--reduce-device-size` the header goes to
//! the device's head over data libcryptsetup first copies to the device's end, and the
//! pass runs backward with resilience `datashift`.

use super::init::params;
use super::interact::{Notice, Progress};
use super::options::{Mode, Options};
use super::volume_key::{key_bytes, read_volume_key, servable_cipher};
use crate::error::{anyhow, Result};
use crate::header::crypt_device;
use std::path::{Path, PathBuf};
use ucrypt_cryptsetup::{CryptDevice, LuksFormat};

/// The new header's cipher (`--cipher`, default aes-xts-plain64) and its key length in
/// bytes (`--key-size`). The data path is ucrypt's: a cipher it cannot serve is refused
/// before anything is written.
fn new_cipher(opts: &Options) -> Result<(String, usize)> {
    let cipher = servable_cipher(
        opts.cipher
            .clone()
            .unwrap_or_else(|| "aes-xts-plain64".into()),
    )?;
    let key_bytes = key_bytes(opts.key_size, &cipher)?;
    Ok((cipher, key_bytes))
}

/// luksFormat of the new LUKS2 header in `cd` (a random volume key; UUID, label,
/// subsystem and sector size as given: a malformed UUID is refused by crypt_format,
/// EINVAL, before anything is written), then the passphrase's keyslot (`--key-slot` or
/// the first free); the keyslot number.
fn format_new_header(
    opts: &Options,
    cd: &mut CryptDevice,
    cipher: &str,
    key_bytes: usize,
    data_device: PathBuf,
    passphrase: &[u8],
    progress: &mut dyn Progress,
) -> Result<u32> {
    if opts.luks2_metadata_size.is_some() || opts.luks2_keyslots_size.is_some() {
        let metadata = opts.luks2_metadata_size.unwrap_or(0);
        let mut keyslots = opts.luks2_keyslots_size.unwrap_or(0);
        // cryptsetup's encrypt_luks2_init: with the header at the head of the device, a
        // keyslots area that does not fit below the data offset is shrunk to fit.
        if let (Some(r), Some(k)) = (opts.reduce_device_size, opts.luks2_keyslots_size) {
            let room = (r / 2).saturating_sub(2 * metadata.max(16 << 10));
            if k > room {
                keyslots = room;
                progress.notice(Notice::warning(format!(
                    "WARNING: LUKS2 keyslots area size changed to {room} bytes."
                )));
            }
        }
        cd.set_metadata_size(metadata, keyslots)
            .map_err(|e| crate::Error::Context {
                context: e.to_string(),
                source: Box::new(anyhow!("unsupported LUKS2 metadata size options")),
            })?;
    }
    // cryptsetup's luksFormat --volume-key-file: the first key-size bytes of the file.
    let key = opts
        .volume_key_file
        .as_deref()
        .map(|f| read_volume_key(f, key_bytes))
        .transpose()?;
    cd.format_luks(
        &LuksFormat {
            luks2: true,
            cipher: cipher.to_owned(),
            key_bytes,
            uuid: opts.uuid.clone(),
            hash: None,
            sector_size: opts.sector_size,
            label: opts.label.clone(),
            subsystem: opts.subsystem.clone(),
            data_device: Some(data_device),
            align_sectors: None,
        },
        key.as_ref(),
    )?;
    drop(key);
    Ok(cd.add_keyslot_by_volume_key(opts.key_slot, None, passphrase)?)
}

/// `--encrypt --header HDR DEV`: a LUKS2 header on HDR for DEV, then the encryption
/// metadata (mode encrypt, direction forward, the whole device one linear segment).
///
/// # Errors
/// A cipher or option refused, the header file cannot be created, libcryptsetup's.
pub(crate) fn detached(
    opts: &Options,
    header: &Path,
    passphrase: &[u8],
    progress: &mut dyn Progress,
) -> Result<()> {
    let (cipher, key_bytes) = new_cipher(opts)?;
    if !header.exists() {
        // 4 KiB, as cryptsetup's luksFormat creates it: libcryptsetup grows it to the
        // header's size (16 MiB by default, the data offset with --offset).
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(header)
            .map_err(|e| anyhow!("creating header file {}: {e}", header.display()))?;
        f.set_len(4096)
            .map_err(|e| anyhow!("sizing header file {}: {e}", header.display()))?;
    }
    let mut cd = crypt_device(header, None)?;
    opts.pbkdf.apply_always(&mut cd)?;
    if let Some(o) = opts.offset.filter(|&o| o > 0) {
        // cryptsetup's luksFormat --offset: the data segment starts there.
        cd.set_data_offset(o)?;
    }
    let slot = format_new_header(
        opts,
        &mut cd,
        &cipher,
        key_bytes,
        opts.device.clone(),
        passphrase,
        progress,
    )?;
    let p = params(opts, Mode::Encrypt, cipher, opts.sector_size.unwrap_or(512));
    if let Err(e) = cd.reencrypt_init(None, Some(slot), passphrase, &p) {
        let _ = cd.destroy_keyslot(slot);
        return Err(e.into());
    }
    Ok(())
}

/// `--encrypt --reduce-device-size SIZE DEV` (no `--header`): a LUKS2 header with its
/// data offset at SIZE/2 is formatted into a temporary file for DEV, its passphrase
/// keyslot added, then the encryption metadata with a data shift of SIZE/2 written
/// (libcryptsetup first copies DEV's first SIZE/2 bytes to its end, the
/// `backup-moved-segment`), and the header restored onto the head of DEV over those
/// bytes. Mode encrypt, direction backward, resilience datashift.
///
/// # Errors
/// A cipher or option refused, the temporary header, libcryptsetup's.
pub(crate) fn shifted(
    opts: &Options,
    reduce: u64,
    passphrase: &[u8],
    progress: &mut dyn Progress,
) -> Result<()> {
    let (cipher, key_bytes) = new_cipher(opts)?;
    // cryptsetup: the data offset is half the reduction, and so is the shift (sectors).
    let shift_sectors = reduce / 1024;
    let device = opts.device.clone();
    let dir = tempfile::Builder::new()
        .prefix("ucrypt-LUKS2-temp-")
        .tempdir()
        .map_err(|e| anyhow!("creating a directory for the temporary header: {e}"))?;
    let tmp = dir.path().join("header");
    // 4 KiB, as cryptsetup's: libcryptsetup grows it; an empty file is refused.
    std::fs::File::create(&tmp)
        .and_then(|f| f.set_len(4096))
        .map_err(|e| anyhow!("creating temporary header file {}: {e}", tmp.display()))?;
    let mut cd = crypt_device(&tmp, None)?;
    opts.pbkdf.apply_always(&mut cd)?;
    cd.set_data_offset(shift_sectors)?;
    let slot = format_new_header(
        opts,
        &mut cd,
        &cipher,
        key_bytes,
        device.clone(),
        passphrase,
        progress,
    )?;
    let mut p = params(opts, Mode::Encrypt, cipher, opts.sector_size.unwrap_or(512));
    p.resilience = "datashift".into();
    p.device_size_sectors = 0;
    p.data_shift_sectors = shift_sectors;
    p.move_first_segment = true;
    // Nothing of DEV is overwritten before this returns but its last SIZE/2 bytes (the
    // copy); a failure leaves the header in the temporary file only.
    cd.reencrypt_init(None, Some(slot), passphrase, &p)?;
    drop(cd);
    let mut cd = crypt_device(&device, None)?;
    cd.header_restore(&tmp).map_err(|e| {
        anyhow!(
            "Failed to place new header at head of device {}: {e}",
            device.display()
        )
    })?;
    Ok(())
}
