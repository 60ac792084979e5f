//! `--decrypt --header NEWFILE DEV` of a device whose LUKS2 header is attached, as
//! cryptsetup 2.6's `decrypt_luks2_datashift_init`: the header is exported to NEWFILE
//! (`crypt_header_backup`), the LUKS signatures on DEV are wiped, then libcryptsetup
//! writes the decryption metadata into NEWFILE (mode decrypt, direction forward,
//! resilience `datashift-checksum` or with `--resilience journal` `datashift-journal`, a
//! data shift of the data offset) after copying the first ciphertext (the data offset,
//! at most 20 MiB, or `--hotzone-size`) to the head of DEV: the moved segment. A failure
//! before that restores the header onto DEV and removes NEWFILE.

use super::init::{load, params};
use super::interact::{Notice, Progress};
use super::options::{Mode, Options, ResilienceMode};
use super::probe::header_shift_type;
use crate::error::{anyhow, Error, Result};
use crate::header::{crypt_device, load_luks, VolumeType};
use std::path::Path;
use ucrypt_cryptsetup::HeaderType;

/// Initialises the decryption, exporting the header to `header`.
///
/// # Errors
/// Not LUKS2, a header with requirements, a wrong passphrase, I/O, libcryptsetup's.
pub(crate) fn decrypt(
    opts: &Options,
    header: &Path,
    passphrase: &[u8],
    progress: &mut dyn Progress,
) -> Result<()> {
    let device = opts.device.clone();
    let mut cd = crypt_device(&device, None)?;
    load_luks(&mut cd, VolumeType::Luks2)?;
    let info = cd.info();
    if info.kind != Some(HeaderType::Luks2) {
        return Err(anyhow!(
            "{} is not LUKS2 (decryption needs LUKS2)",
            device.display()
        ));
    }
    let (_, req) = cd.persistent_flags()?;
    if req != 0 {
        return Err(anyhow!(
            "the LUKS2 header of {} has requirements (an unfinished reencryption?); \
             decryption needs a clean header",
            device.display()
        ));
    }
    cd.check_passphrase(opts.key_slot, passphrase)?;
    cd.header_backup(header)?;
    drop(cd);
    let mut undo = |e: Error| restore(e, &device, header, progress);
    {
        // crypt_header_backup leaves the file read-only; cryptsetup adds u+rw.
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(header)
            .map(|m| m.permissions().mode())
            .unwrap_or(0o400);
        std::fs::set_permissions(header, std::fs::Permissions::from_mode(mode | 0o600)).map_err(
            |e| {
                undo(anyhow!(
                    "Failed to add read/write permissions to exported header file ({e})."
                ))
            },
        )?;
    }
    wipe_luks_signatures(&device).map_err(&mut undo)?;
    let mut cd = load(opts).map_err(&mut undo)?;
    let mut p = params(opts, Mode::Decrypt, String::new(), 0);
    p.resilience = match opts.resilience {
        Some(ResilienceMode::Journal) => "datashift-journal".into(),
        _ => "datashift-checksum".into(),
    };
    p.device_size_sectors = 0;
    p.data_shift_sectors = info.data_offset;
    p.move_first_segment = true;
    if let Err(e) = cd.reencrypt_init(opts.key_slot, None, passphrase, &p) {
        drop(cd);
        // Nothing was moved unless the metadata says a decryption is in progress.
        if header_shift_type(header).is_none() {
            return Err(undo(e.into()));
        }
        return Err(e.into());
    }
    Ok(())
}

/// Back as it was after `e`: the header onto the device, the exported file gone (or, if
/// the header cannot be put back, where its copy is).
fn restore(e: Error, device: &Path, header: &Path, progress: &mut dyn Progress) -> Error {
    let restored = crypt_device(device, None).and_then(|mut cd| Ok(cd.header_restore(header)?));
    match restored {
        Ok(()) => {
            let _ = std::fs::remove_file(header);
        }
        Err(_) => progress.notice(Notice::warning(format!(
            "Reencryption initialization failed. Header backup is available in {}.",
            header.display()
        ))),
    }
    e
}

/// Wipes the LUKS signatures of `device` (the magic of the primary header at 0 and of the
/// secondary at its `hdr_size`), as cryptsetup's `tools_wipe_all_signatures` (libblkid)
/// does before moving the data over them: a device left half-way is not taken for the
/// LUKS volume whose header was exported.
fn wipe_luks_signatures(device: &Path) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(device)
        .map_err(|e| anyhow!("opening {}: {e}", device.display()))?;
    let mut head = [0u8; 16];
    f.read_exact_at(&mut head, 0)
        .map_err(|e| anyhow!("reading {}: {e}", device.display()))?;
    let hdr_size = u64::from_be_bytes(head[8..16].try_into().unwrap_or_default());
    let mut at = vec![0u64];
    if (16384..=4 << 20).contains(&hdr_size) {
        at.push(hdr_size);
    }
    for off in at {
        let mut magic = [0u8; 6];
        if f.read_exact_at(&mut magic, off).is_ok()
            && (magic == *b"LUKS\xba\xbe" || magic == *b"SKUL\xba\xbe")
        {
            f.write_all_at(&[0u8; 6], off)
                .map_err(|e| anyhow!("wiping the LUKS signature of {}: {e}", device.display()))?;
        }
    }
    f.sync_all()
        .map_err(|e| anyhow!("syncing {}: {e}", device.display()))?;
    Ok(())
}
