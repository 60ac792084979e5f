//! `ucrypt luksConvertKey <device> [<key file>]`: rewrites a LUKS2 keyslot with new PBKDF
//! parameters (`--pbkdf`, `--pbkdf-memory`, `--pbkdf-parallel`, `--iter-time`,
//! `--pbkdf-force-iterations`), same passphrase, as cryptsetup's: the keyslot is changed
//! to itself through libcryptsetup (`crypt_keyslot_change_by_passphrase`).

use super::luks::{verbose, CsResult, DeviceArgs};
use super::luks_add_key::{KeyslotCipherArgs, PbkdfArgs};
use super::secret::{self, KeyFileArgs};
use super::{CliError, WithCode, EXIT_PARAMS};
use std::path::PathBuf;
use ucrypt::header::VolumeType;
use ucrypt::luks::KeyslotStatus;

/// Arguments of `ucrypt luksConvertKey`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    dev: DeviceArgs,
    /// File with the passphrase (same as --key-file).
    positional_key_file: Option<PathBuf>,
    #[command(flatten)]
    key: KeyFileArgs,
    /// The keyslot to convert (default: the one the passphrase opens).
    #[arg(short = 'S', long)]
    key_slot: Option<u32>,
    #[command(flatten)]
    pbkdf: PbkdfArgs,
    #[command(flatten)]
    keyslot_cipher: KeyslotCipherArgs,
    /// Print the keyslot converted.
    #[arg(short, long)]
    verbose: bool,
    /// Accepted as cryptsetup's: this command asks no question.
    #[arg(short = 'q', long)]
    #[allow(dead_code)]
    batch_mode: bool,
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let _claimed = super::luks::claim_for_header_change(&a.dev)?;
    let mut cd = a.dev.load(VolumeType::Luks2)?;
    ucrypt::header::check_requirements(&mut cd).cs()?;
    if let Some(s) = a.key_slot {
        if cd.keyslot_status(s) == KeyslotStatus::Inactive {
            return Err(anyhow::anyhow!("keyslot {s} is not active")).code(EXIT_PARAMS);
        }
    }
    a.keyslot_cipher.apply(&mut cd)?;
    a.pbkdf.apply_always(&mut cd)?;
    let mut k = a.key.clone();
    if let Some(p) = a.positional_key_file.clone() {
        k.key_file = Some(p);
    }
    let pass = secret::get(
        k.key_file
            .as_deref()
            .map(|p| (p, k.keyfile_offset, k.keyfile_size)),
        "Enter passphrase for keyslot to be converted: ",
        false,
    )?;
    // The Argon2 benchmark writes nothing: Ctrl-C ends it at once.
    let key_bytes = cd.info().key_bytes;
    super::progress::searching("Benchmarking the PBKDF", || {
        cd.prebenchmark_pbkdf(key_bytes)
    })
    .cs()?;
    let slot = super::progress::writing_header(
        "Converting the keyslot",
        &a.dev.local_header()?,
        0,
        || cd.change_keyslot(a.key_slot, a.key_slot, &pass, &pass).cs(),
    )?;
    verbose(a.verbose, format_args!("Key slot {slot} created."));
    verbose(a.verbose, "Command successful.");
    Ok(())
}
