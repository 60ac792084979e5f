//! `ucrypt luksChangeKey <device> [<new key file>]`: replaces the passphrase of the
//! keyslot the old passphrase opens.

use super::luks::{luks_type, verbose, CsResult, DeviceArgs};
use super::luks_add_key::{KeyslotCipherArgs, PbkdfArgs};
use super::secret::{self, KeyFileArgs, NewKeyFileArgs};
use super::CliError;
use std::path::PathBuf;
use ucrypt::header::VolumeType;

/// Arguments of `ucrypt luksChangeKey`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    dev: DeviceArgs,
    /// File with the new passphrase (default: prompt, or the second line of stdin).
    new_key_file: Option<PathBuf>,
    #[command(flatten)]
    key: KeyFileArgs,
    #[command(flatten)]
    new_key: NewKeyFileArgs,
    /// Only the passphrase of this keyslot is changed.
    #[arg(short = 'S', long)]
    key_slot: Option<u32>,
    /// Expected LUKS type.
    #[arg(long = "type", short = 'M', default_value = "luks", value_parser = luks_type)]
    kind: VolumeType,
    #[command(flatten)]
    keyslot_cipher: KeyslotCipherArgs,
    #[command(flatten)]
    pbkdf: PbkdfArgs,
    /// Accepted as cryptsetup's: ucrypt runs no password quality check to disable.
    #[arg(long)]
    #[allow(dead_code)]
    force_password: bool,
    /// Print the slot used.
    #[arg(short, long)]
    verbose: bool,
    /// Accepted as cryptsetup's: this command asks no question.
    #[arg(short = 'q', long)]
    #[allow(dead_code)]
    batch_mode: bool,
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let _claimed = super::luks::claim_for_header_change(&a.dev)?;
    let mut cd = a.dev.load(a.kind)?;
    ucrypt::header::check_requirements(&mut cd).cs()?;
    a.keyslot_cipher.apply(&mut cd)?;
    let old = secret::existing_asking(&a.key, "Enter passphrase to be changed: ")?;
    // As cryptsetup: the old passphrase is checked before the new one is asked for.
    let unlocked = super::progress::searching("Checking the passphrase", || {
        cd.check_passphrase(a.key_slot, &old)
    })
    .cs()?;
    verbose(a.verbose, format_args!("Key slot {unlocked} unlocked."));
    let new = a
        .new_key
        .get(a.new_key_file.as_deref(), "Enter new passphrase: ")?;
    a.pbkdf.apply(&mut cd)?;
    // The Argon2 benchmark writes nothing: Ctrl-C ends it at once.
    let key_bytes = cd.info().key_bytes;
    super::progress::searching("Benchmarking the PBKDF", || {
        cd.prebenchmark_pbkdf(key_bytes)
    })
    .cs()?;
    let slot =
        super::progress::writing_header("Changing the keyslot", &a.dev.local_header()?, 0, || {
            cd.change_keyslot(a.key_slot, a.key_slot, &old, &new).cs()
        })?;
    verbose(a.verbose, format_args!("Key slot {slot} created."));
    verbose(a.verbose, "Command successful.");
    Ok(())
}
