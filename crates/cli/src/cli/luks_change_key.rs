//! `ucrypt luksChangeKey <device> [<new key file>]`: replaces the passphrase of the
//! keyslot the old passphrase opens.

use super::exit::lib_error;
use super::luks::{luks_type, verbose, DeviceArgs};
use super::luks_add_key::{KeyslotCipherArgs, PbkdfArgs};
use super::prompt::Terminal;
use super::secret::{KeyFileArgs, NewKeyFileArgs};
use super::CliError;
use std::path::PathBuf;
use ucrypt::header::VolumeType;
use ucrypt::luks::keyslots;

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
    let o = keyslots::ChangeKey {
        key: a.key.inputs(),
        new_key: a.new_key.inputs(a.new_key_file.as_deref()),
        key_slot: a.key_slot,
        pbkdf: a.pbkdf.choice(),
        keyslot_cipher: a.keyslot_cipher.choice(),
        verbose: a.verbose,
    };
    let slot = keyslots::change(
        &mut cd,
        &a.dev.local_header()?,
        &o,
        &mut Terminal::default(),
    )
    .map_err(lib_error)?;
    verbose(a.verbose, format_args!("Key slot {slot} created."));
    verbose(a.verbose, "Command successful.");
    Ok(())
}
