//! `ucrypt luksRemoveKey <device> [<key file>]`: destroys the keyslot that the given
//! passphrase opens. Removing the last keyslot needs confirmation.

use super::exit::lib_error;
use super::luks::{luks_type, verbose, DeviceArgs};
use super::prompt::Terminal;
use super::secret::KeyFileArgs;
use super::CliError;
use std::path::PathBuf;
use ucrypt::header::VolumeType;
use ucrypt::luks::keyslots;

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
    let mut key = a.key.inputs();
    if let Some(p) = a.remove_key_file.clone() {
        key.path = Some(p);
    }
    let o = keyslots::RemoveKey {
        key,
        batch: a.batch_mode,
    };
    let slot = keyslots::remove(&mut cd, &o, &mut Terminal::default()).map_err(lib_error)?;
    verbose(a.verbose, format_args!("Key slot {slot} removed."));
    Ok(())
}
