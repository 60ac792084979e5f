//! The options of an offline LUKS2 reencryption checked against each other before any
//! device is claimed or any passphrase asked for: cryptsetup's own checks of them
//! (`tools_check_args`, `encrypt_luks2_init`, `decrypt_verify_and_set_params`) in its
//! words, and what ucrypt does not do, refused by name. Options cryptsetup takes and
//! ignores are ignored with a notice.

use super::interact::{Notice, Progress};
use super::options::{HeaderKind, Options, ResilienceMode};
use super::probe::is_luks;
use crate::error::{anyhow, Result};

/// What the checks decided besides refusals.
pub(crate) struct Checked {
    /// The options, `--reduce-device-size` adjusted as cryptsetup adjusts it.
    pub(crate) opts: Options,
    /// A decryption that exports an attached header to the new `--header` file.
    pub(crate) export: bool,
}

/// `--volume-key-file` with an operation that sets no new key: cryptsetup 2.6.1 takes
/// the option and does nothing with it.
pub(crate) fn unused_volume_key_file(opts: &Options, progress: &mut dyn Progress) {
    if let (Some(f), true) = (&opts.volume_key_file, opts.decrypt() || opts.keep_key) {
        progress.notice(Notice::warning(format!(
            "--volume-key-file {} is not used: {} sets no new volume key.",
            f.display(),
            if opts.decrypt() {
                "--decrypt"
            } else {
                "--keep-key"
            }
        )));
    }
}

/// Checks `opts` for an offline LUKS2 reencryption.
///
/// # Errors
/// [`crate::ErrorKind::Invalid`]: a combination refused, with the reason.
pub(crate) fn check(opts: &Options, progress: &mut dyn Progress) -> Result<Checked> {
    let mut a = opts.clone();
    if let Some(n) = a.device_size {
        // cryptsetup's own checks of the option (tools_check_args).
        if n == 0 {
            return Err(anyhow!("Invalid device size specification."));
        }
        if n % 512 != 0 {
            return Err(anyhow!("Device size must be multiple of 512 bytes sector."));
        }
    }
    if a.keep_key && (a.encrypt() || a.decrypt()) {
        return Err(anyhow!(
            "reencrypt --keep-key keeps the key of a LUKS2 volume being re-encrypted; \
             --encrypt and --decrypt have one key only"
        ));
    }
    if !a.encrypt() && (a.luks2_metadata_size.is_some() || a.luks2_keyslots_size.is_some()) {
        return Err(anyhow!(
            "--luks2-metadata-size and --luks2-keyslots-size size a new header: they apply to \
             reencrypt --encrypt only (cryptsetup ignores them otherwise)"
        ));
    }
    if a.reduce_device_size == Some(0) {
        // cryptsetup's: no reduction at all.
        a.reduce_device_size = None;
    }
    if let (Some(o), false) = (a.offset, a.encrypt()) {
        // cryptsetup 2.6.1 takes the option and does nothing with it.
        progress.notice(Notice::warning(format!(
            "--offset {o} applies to --encrypt only; ignored, as by cryptsetup."
        )));
    }
    if let Some(r) = a.reduce_device_size {
        check_reduction(&mut a, r, progress)?;
    } else if a.resilience == Some(ResilienceMode::Datashift) {
        return Err(anyhow!(
            "--resilience datashift is the resilience of --encrypt --reduce-device-size"
        ));
    }
    // cryptsetup 2.6: `--decrypt --header NEWFILE` of a device whose LUKS2 header is
    // attached exports the header to NEWFILE and moves the data to the device's head.
    let export =
        a.decrypt() && a.header.as_deref().is_some_and(|h| !h.exists()) && is_luks(&a.device);
    if export {
        match a.resilience {
            Some(ResilienceMode::Datashift | ResilienceMode::None) => {
                return Err(anyhow!(
                    "Requested --resilience option cannot be applied to current reencryption \
                     operation."
                ))
            }
            _ if a.device_size.is_some() => {
                return Err(anyhow!(
                    "reencrypt --decrypt of a device whose header is attached (exported to \
                     --header) with --device-size is not supported by ucrypt"
                ))
            }
            _ => {}
        }
    }
    if a.kind_is(&HeaderKind::Luks1) && !a.encrypt() && is_luks(a.header_path()) {
        return Err(anyhow!(
            "Conflicting versions. Device {} is LUKS2.",
            a.header_path().display()
        ));
    }
    unused_volume_key_file(&a, progress);
    match &a.header_kind {
        None | Some(HeaderKind::Luks2) => {}
        Some(HeaderKind::Luks1) => {
            return Err(anyhow!(
                "reencrypt --type luks1: the header types of reencrypt are luks1 and luks2"
            ))
        }
        Some(HeaderKind::Other(t)) => {
            return Err(anyhow!(
                "reencrypt --type {t}: the header types of reencrypt are luks1 and luks2"
            ))
        }
    }
    if !a.encrypt() && (a.uuid.is_some() || a.label.is_some() || a.subsystem.is_some()) {
        return Err(anyhow!(
            "reencrypt --uuid, --label and --subsystem name the new header of --encrypt"
        ));
    }
    let shift_resume = a.encrypt() && a.reduce_device_size.is_none() && is_luks(&a.device);
    if ((a.encrypt() && a.reduce_device_size.is_none() && !shift_resume) || a.decrypt())
        && a.header.is_none()
    {
        return Err(anyhow!(
            "{}",
            if a.encrypt() {
                "Encryption without detached header (--header) is not possible without data \
                 device size reduction (--reduce-device-size)."
            } else {
                "LUKS2 decryption requires --header option."
            }
        ));
    }
    if a.decrypt() && (a.cipher.is_some() || a.key_size.is_some() || a.sector_size.is_some()) {
        return Err(anyhow!(
            "reencrypt --decrypt takes no --cipher, --key-size or --sector-size (the result \
             is plaintext)"
        ));
    }
    if a.decrypt() && a.resilience == Some(ResilienceMode::None) {
        // cryptsetup 2.6.1 refuses it too (decrypt_verify_and_set_params).
        return Err(anyhow!(
            "Requested --resilience option cannot be applied to current reencryption operation."
        ));
    }
    if crate::remote_header::is_remote(&a.device)
        || a.header
            .as_deref()
            .is_some_and(crate::remote_header::is_remote)
    {
        return Err(remote_refused());
    }
    Ok(Checked { opts: a, export })
}

/// The refusal of a device that is no local file or block device.
pub(crate) fn remote_refused() -> crate::Error {
    anyhow!(
        "reencrypt works on local files and block devices only: the pass writes the \
         device with O_DIRECT and fdatasync between its steps, which NBD exports, rbd: \
         images and ram: devices do not offer here (copy the image to a local file, \
         re-encrypt it, copy it back)"
    )
}

/// `--reduce-device-size R`: cryptsetup's checks of the option, then what ucrypt does not
/// do with it; an `--offset` below half of R shrinks R to twice the offset.
fn check_reduction(a: &mut Options, r: u64, progress: &mut dyn Progress) -> Result<()> {
    if r > 1 << 30 {
        return Err(anyhow!("Maximum device reduce size is 1 GiB."));
    }
    if r % 512 != 0 {
        return Err(anyhow!("Reduce size must be multiple of 512 bytes sector."));
    }
    if a.device_size.is_some() {
        return Err(anyhow!(
            "Options --reduce-device-size and --data-size cannot be combined."
        ));
    }
    if !a.encrypt() {
        return Err(anyhow!(
            "reencrypt --reduce-device-size is supported with --encrypt (a plaintext \
             device gets its LUKS2 header at its head); ucrypt does not re-key with a \
             data shift"
        ));
    }
    if a.header.is_some() {
        return Err(anyhow!(
            "reencrypt --encrypt --reduce-device-size puts the LUKS2 header at the head of \
             the device; with a detached header (--header) encrypt without \
             --reduce-device-size"
        ));
    }
    if let Some(x) = a.resilience.filter(|&x| x != ResilienceMode::Datashift) {
        return Err(anyhow!(
            "--resilience {x} does not apply to --reduce-device-size: a data shift's \
             resilience is datashift (each hotzone is written a shift above its old \
             data, which stays until it is done)"
        ));
    }
    // cryptsetup's encrypt_luks2_init: an offset beyond half the reduction is refused,
    // one below it shrinks the reduction to twice the offset.
    if let Some(o) = a.offset.filter(|&o| o > 0) {
        if o > r / 1024 {
            return Err(anyhow!(
                "Requested data offset must be less than or equal to half of \
                 --reduce-device-size parameter."
            ));
        }
        if o < r / 1024 {
            a.reduce_device_size = Some(o * 1024);
            progress.notice(Notice::info(format!(
                "Adjusting --reduce-device-size value to twice the --offset {} (sectors).",
                o * 2
            )));
        }
    }
    Ok(())
}
