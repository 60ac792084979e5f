//! `ucrypt luksKillSlot <device> <slot>`: destroys one keyslot. Without `--batch-mode` a
//! passphrase of another keyslot must be given first (cryptsetup's rule), so a typo in
//! the slot number cannot lock the owner out.

use super::exit::lib_error;
use super::luks::{luks_type, verbose, DeviceArgs};
use super::prompt::Terminal;
use super::secret::KeyFileArgs;
use super::CliError;
use ucrypt::header::VolumeType;
use ucrypt::luks::keyslots;

/// Arguments of `ucrypt luksKillSlot`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    dev: DeviceArgs,
    /// The keyslot to destroy.
    slot: u32,
    #[command(flatten)]
    key: KeyFileArgs,
    /// Expected LUKS type.
    #[arg(long = "type", short = 'M', default_value = "luks", value_parser = luks_type)]
    kind: VolumeType,
    /// Do not ask for a remaining passphrase or confirmation.
    #[arg(short = 'q', long)]
    batch_mode: bool,
    /// Print the slot removed.
    #[arg(short, long)]
    verbose: bool,
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let _claimed = super::luks::claim_for_header_change(&a.dev)?;
    let mut cd = a.dev.load(a.kind)?;
    let o = keyslots::KillSlot {
        slot: a.slot,
        key: a.key.inputs(),
        batch: a.batch_mode,
    };
    keyslots::kill(&mut cd, &o, &mut Terminal::default()).map_err(lib_error)?;
    verbose(a.verbose, format_args!("Key slot {} removed.", a.slot));
    Ok(())
}
