//! Reencryption of LUKS volumes, interchangeable with `cryptsetup reencrypt`: LUKS2
//! re-keying (a new volume key, cipher, key size or sector size; or `--keep-key`),
//! encryption of a plaintext device in place (a detached header, or the header at the
//! device's head with a data shift), decryption (a detached header, or an attached one
//! exported first), offline or inside a running instance; and cryptsetup's legacy LUKS1
//! reencryption. The metadata set-up is libcryptsetup's, the data passes are ucrypt's.
//!
//! ```text
//!  run(Options, Prompt, Progress)
//!   ├─ LUKS1 header (or --encrypt --type luks1) ─► luks1: state files, headers, pass
//!   │                                              (luks1_engine)
//!   ├─ --active-name NAME ─► online: metadata here, the pass in the instance
//!   │                        (instance::online), progress from its status
//!   └─ LUKS2 ─► checks ─► luks2: header facts, passphrase,
//!               metadata: init (re-key, keep-key, decrypt) | encrypt (new header)
//!                         | export (decrypt an attached header)
//!               ─► engine::Run (hotzones, resilience, header updates)
//! ```
//!
//! The caller supplies secrets and confirmations through the library's one [`Prompt`]
//! (`crate::prompt::Prompt`) and shows progress and messages through [`Progress`]; every refusal is an [`crate::Error`] of kind
//! [`crate::ErrorKind::Invalid`] with the reason, in cryptsetup's words where it has them.

mod checks;
mod encrypt;
pub mod engine;
mod export;
mod init;
mod interact;
mod luks1;
pub mod luks1_engine;
mod luks1_headers;
mod luks2;
mod online;
mod options;
mod probe;
mod volume_key;

pub use engine::{Gate, Outcome, ProgressFn, Run, RunOptions, DEFAULT_MAX_HOTZONE};
pub use interact::{Level, Notice, PassKind, Progress, Summary};

use crate::prompt::Prompt;
pub use options::{HeaderKind, Luks1Options, Mode, Options, PbkdfChoice, ResilienceMode, Stage};
pub use probe::is_luks;

use crate::error::{anyhow, Result};
use crate::instance::lock::ImageLock;

/// Runs the reencryption `opts` describe: a LUKS1 volume (or `--encrypt --type luks1`)
/// as cryptsetup's legacy LUKS1 reencryption, `--active-name` online in that instance,
/// anything else offline on LUKS2.
///
/// # Errors
/// A refusal ([`crate::ErrorKind::Invalid`] with the reason), a wrong passphrase
/// ([`crate::ErrorKind::Permission`]), a device in use ([`crate::ErrorKind::Busy`]), the
/// prompt's own errors, libcryptsetup's and I/O errors.
pub fn run(opts: &Options, prompt: &mut dyn Prompt, progress: &mut dyn Progress) -> Result<()> {
    if opts.kind_is(&HeaderKind::Luks1) && opts.active_name.is_some() {
        return Err(anyhow!(
            "Option --active-name can be set only for LUKS2 device."
        ));
    }
    if opts.active_name.is_none()
        && (luks1::applies(opts) || (opts.encrypt() && opts.kind_is(&HeaderKind::Luks1)))
    {
        if opts.tokens_named() {
            return Err(anyhow!(
                "--token-only, --token-id and --token-type need a LUKS2 volume (LUKS1 has no \
                 tokens)"
            ));
        }
        checks::unused_volume_key_file(opts, progress);
        return luks1::run(opts, prompt, progress);
    }
    luks1::decrypt_hint(opts)?;
    if opts.luks1.any() {
        return Err(anyhow!(
            "reencrypt --block-size, --use-directio, --use-fsync and --write-log are \
             options of cryptsetup's LUKS1 reencryption; {} is not LUKS1",
            opts.header_path().display()
        ));
    }
    if let Some(name) = &opts.active_name {
        return online::run(opts, name, prompt, progress);
    }
    luks2::run(opts, prompt, progress)
}

/// The image locks of a header change on the device and the header file (none with
/// `locks` off): another mapping of them is refused as busy.
fn claim(opts: &Options) -> Result<Vec<ImageLock>> {
    let mut held = Vec::new();
    if !opts.locks {
        return Ok(held);
    }
    let paths = std::iter::once(opts.device.as_path()).chain(opts.header.as_deref());
    for p in paths {
        if let Some(l) = crate::instance::lock::lock_for_header_change(p)? {
            held.push(l);
        }
    }
    Ok(held)
}
