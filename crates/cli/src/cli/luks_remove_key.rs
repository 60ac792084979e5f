//! `ucrypt luksRemoveKey <device> [<key file>]`: destroys the keyslot that the given
//! passphrase opens. Removing the last keyslot needs confirmation.

use super::luks::{luks_type, verbose, CsResult, DeviceArgs};
use super::secret::{self, KeyFileArgs};
use super::CliError;
use std::path::PathBuf;
use ucrypt::header::VolumeType;
use ucrypt::luks::KeyslotStatus;

/// Arguments of `ucrypt luksRemoveKey`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    dev: DeviceArgs,
    /// File with the passphrase to remove (same as --key-file).
    remove_key_file: Option<PathBuf>,
    #[command(flatten)]
    key: KeyFileArgs,
    /// Expected LUKS type.
    #[arg(long = "type", short = 'M', default_value = "luks", value_parser = luks_type)]
    kind: VolumeType,
    /// Do not ask before removing the last keyslot.
    #[arg(short = 'q', long)]
    batch_mode: bool,
    /// Print the slot removed.
    #[arg(short, long)]
    verbose: bool,
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let _claimed = super::luks::claim_for_header_change(&a.dev)?;
    let mut cd = a.dev.load(a.kind)?;
    ucrypt::header::check_requirements(&mut cd).cs()?;
    let mut k = a.key.clone();
    if let Some(p) = a.remove_key_file.clone() {
        k.key_file = Some(p);
    }
    let pass = secret::existing_asking(&k, "Enter passphrase to be deleted: ")?;
    let slot = super::progress::searching("Checking the passphrase", || {
        cd.check_passphrase(None, &pass)
    })
    .cs()?;
    if cd.keyslot_status(slot) == KeyslotStatus::ActiveLast {
        secret::confirm_last_keyslot(a.batch_mode)?;
    }
    cd.destroy_keyslot(slot).cs()?;
    verbose(a.verbose, format_args!("Key slot {slot} removed."));
    Ok(())
}
