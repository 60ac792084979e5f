//! An offline LUKS2 reencryption from start to end: which operation the options and the
//! header on disk make it (a new one, or one in progress to resume), the refusals that
//! need the header, the passphrase, the metadata ([`super::init`], [`super::encrypt`],
//! [`super::export`]) and the data pass ([`super::engine::Run`]).

use super::checks::{check, Checked};
use super::engine::{Outcome, Run, RunOptions, DEFAULT_MAX_HOTZONE};
use super::interact::{Notice, PassKind, Progress, Summary};
use super::options::{Mode, Options, ResilienceMode};
use super::probe::{header_shift_type, is_luks, luks_signature, reencrypt_mode};
use super::{claim, encrypt, export, init};
use crate::error::{anyhow, ErrorKind, Result};
use crate::prompt::Prompt;
use std::sync::atomic::{AtomicBool, Ordering};
use ucrypt_format::luks2::reencrypt::Resilience;

/// Runs the reencryption `opts` describes (checked by [`check`] first).
///
/// # Errors
/// A refusal ([`ErrorKind::Invalid`], with cryptsetup's words where it has them), a wrong
/// passphrase ([`ErrorKind::Permission`]), the prompt's, libcryptsetup's, I/O; a pass
/// stopped by [`Progress::stop_requested`] is the error "interrupted".
pub(crate) fn run(
    opts: &Options,
    prompt: &mut dyn Prompt,
    progress: &mut dyn Progress,
) -> Result<()> {
    let Checked { opts: a, export } = check(opts, progress)?;
    let _claimed = claim(&a)?;
    let path = a.device.clone();
    let header_path = a.header_path().to_path_buf();
    // A header to be created by --encrypt (or exported by --decrypt) is not read.
    let fresh = (a.encrypt() && !is_luks(&header_path)) || export;
    let (in_progress, mode) = if fresh {
        (false, None)
    } else {
        let f = std::fs::File::open(&header_path).map_err(|e| {
            anyhow!("opening {}: {e}", header_path.display()).with_kind(ErrorKind::Device)
        })?;
        let h = ucrypt_format::luks2::disk::Header::read(&f, &header_path.display().to_string())?;
        (
            ucrypt_format::luks2::reencrypt::in_reencryption(&h.json),
            reencrypt_mode(&h.json),
        )
    };
    let shifted = if in_progress {
        header_shift_type(&header_path)
    } else {
        None
    };
    if a.encrypt() && !in_progress {
        refuse_luks_already(&a, fresh)?;
    }
    if in_progress {
        // A data shift's resilience cannot change (cryptsetup refuses it too).
        // A decryption with a data shift keeps its moved segment's resilience too
        // (`--resilience checksum` names datashift-checksum, as with cryptsetup).
        if let (Some(r), Some(t)) = (a.resilience.map(ResilienceMode::as_str), shifted.as_deref()) {
            let same = r == t || t.strip_prefix("datashift-") == Some(r);
            if !same {
                return Err(anyhow!(
                    "Requested --resilience option cannot be applied to current \
                     reencryption operation."
                ));
            }
        }
        for (want, word) in [(Mode::Encrypt, "encrypt"), (Mode::Decrypt, "decrypt")] {
            if a.mode == want && mode != Some(want) {
                return Err(anyhow!(
                    "Device is not in LUKS2 {word}ion. Conflicting option --{word}."
                ));
            }
        }
    }
    let passphrase = if export {
        prompt.confirm(&format!(
            "Header file {} does not exist. Do you want to initialize LUKS2 decryption of \
             device {} and export LUKS2 header to file {}?",
            header_path.display(),
            path.display(),
            header_path.display()
        ))?;
        // The header is still the device's own until it is exported.
        let question = format!("Enter passphrase for {}: ", path.display());
        existing_passphrase(&a, &path, None, &question, prompt)?
    } else if fresh {
        if a.tokens_named() {
            return Err(anyhow!(
                "--token-only, --token-id and --token-type unlock an existing LUKS2 header; \
                 {} gets a new one and a new passphrase",
                header_path.display()
            ));
        }
        let what = match a.reduce_device_size {
            Some(r) => format!(
                "This will put a LUKS2 header at the head of {} and encrypt its data in \
                 place, shifted by {} bytes (its last {r} bytes are overwritten)",
                path.display(),
                r / 1024 * 512
            ),
            None => format!(
                "This will create a LUKS2 header in {} and encrypt the data of {} in place",
                header_path.display(),
                path.display()
            ),
        };
        prompt.confirm(&what)?;
        prompt.new_passphrase(&format!("Enter passphrase for {}: ", header_path.display()))?
    } else {
        let question = format!("Enter passphrase for {}: ", path.display());
        existing_passphrase(&a, &path, a.header.as_deref(), &question, prompt)?
    };
    if in_progress && a.init_only() {
        return Err(anyhow!(
            "LUKS2 reencryption already initialized in metadata"
        ));
    }
    if !in_progress {
        if a.resume_only() {
            return Err(anyhow!("{} is not in LUKS2 reencryption", path.display()));
        }
        match (a.mode, a.reduce_device_size) {
            (Mode::Encrypt, Some(r)) => encrypt::shifted(&a, r, &passphrase, progress)?,
            (Mode::Encrypt, None) => encrypt::detached(&a, &header_path, &passphrase, progress)?,
            (Mode::Decrypt, _) if export => {
                export::decrypt(&a, &header_path, &passphrase, progress)?
            }
            (Mode::Decrypt, _) => init::decrypt(&a, &passphrase)?,
            (Mode::Reencrypt, _) => init::rekey(&a, &passphrase, progress)?,
        }
        if a.init_only() {
            return Ok(());
        }
    }
    pass(&a, &passphrase, progress)
}

/// An encryption's refusals of a device or header that is LUKS already, or carries a
/// broken LUKS signature.
fn refuse_luks_already(a: &Options, fresh: bool) -> Result<()> {
    let header_path = a.header_path();
    if !fresh {
        return Err(anyhow!(
            "Device {} is already LUKS device. Aborting operation.",
            header_path.display()
        ));
    }
    if is_luks(&a.device) {
        return Err(anyhow!(
            "Device {} is already LUKS device. Aborting operation.",
            a.device.display()
        ));
    }
    // cryptsetup's check_broken_luks_signature: a LUKS signature blkid finds where no
    // LUKS header loads (the header file given, and the data device) is not encrypted
    // over.
    let header_given = a.header.as_deref().filter(|h| h.exists());
    for p in header_given.into_iter().chain([a.device.as_path()]) {
        if luks_signature(p) {
            return Err(anyhow!(
                "Device {} contains broken LUKS metadata. Aborting operation.",
                p.display()
            ));
        }
    }
    Ok(())
}

/// The data pass of the reencryption in the metadata, from where it stands.
fn pass(a: &Options, passphrase: &[u8], progress: &mut dyn Progress) -> Result<()> {
    let path = &a.device;
    // Stop requests end the pass between hotzones with consistent metadata.
    progress.watch();
    let stop = AtomicBool::new(false);
    let mut r = match &a.header {
        Some(h) => Run::open_detached(h, path, passphrase),
        None => Run::open(path, passphrase),
    }?;
    if let (Resilience::Datashift { shift }, Some(_)) = (r.resilience(), a.hotzone_size) {
        progress.notice(Notice::warning(format!(
            "With a data shift every hotzone is the shift ({shift} bytes), as with \
             cryptsetup: --hotzone-size does not apply."
        )));
    }
    let opts = RunOptions {
        max_hotzone: a.hotzone_size.unwrap_or(DEFAULT_MAX_HOTZONE).max(4096),
        stop_after: a.stop_after,
    };
    if let Some(limit) = a.device_size {
        r.limit_device_size(limit)
            .map_err(|e| e.with_kind(ErrorKind::Invalid))?;
    }
    let first = r.done();
    let device = path.display().to_string();
    progress.begin(
        &device,
        a.device_size
            .unwrap_or(r.device_size())
            .saturating_sub(first),
        None,
    );
    let mut last_done = first;
    let outcome = r.run(&opts, &stop, &mut |done: u64, _size: u64| {
        last_done = done;
        if progress.stop_requested() {
            stop.store(true, Ordering::Relaxed);
        }
        progress.advance(done - first);
    });
    progress.end(matches!(outcome, Ok(Outcome::Finished)));
    let outcome = outcome?;
    progress.summary(&Summary {
        kind: PassKind::Luks2,
        finished: outcome == Outcome::Finished,
        bytes: last_done - first,
        at: last_done,
        size: r.device_size(),
        device,
    });
    if outcome == Outcome::Interrupted && progress.stop_requested() {
        return Err(anyhow!("interrupted"));
    }
    Ok(())
}

/// The passphrase of an existing keyslot of the LUKS2 volume on `device` (its header on
/// `header`): through a LUKS2 token first, by the library's token policy as `open` tries
/// them (`--token-only`, `--token-id`, `--token-type`; only tokens of `--key-slot` when
/// it is given), else asked for through `prompt` as `question`. The token's passphrase is
/// what cryptsetup's reencryption takes from it too: the new keyslot gets the same one,
/// so the token opens the volume after the reencryption as before.
///
/// # Errors
/// Under `--token-only`, no token unlocks (nothing is asked); the prompt's errors.
pub(crate) fn existing_passphrase(
    opts: &Options,
    device: &std::path::Path,
    header: Option<&std::path::Path>,
    question: &str,
    prompt: &mut dyn Prompt,
) -> Result<crate::secret::Secret> {
    let mut tokens = opts.tokens.clone();
    tokens.keyslot = opts.key_slot;
    let kind = crate::header::VolumeType::Luks2;
    if let Some(o) = crate::unlock::token::passphrase(device, header, kind, &tokens, prompt)? {
        return Ok(o.passphrase);
    }
    prompt.passphrase(question)
}
