//! `ucrypt isLuks <device>`: exit 0 when the device holds a valid LUKS header (of the
//! given `--type`), 1 when not, 4 when the device cannot be opened.

use super::luks::{luks_type, DeviceArgs};
use super::{CliError, WithCode, EXIT_PARAMS};
use ucrypt::header::VolumeType;

/// Arguments of `ucrypt isLuks`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    dev: DeviceArgs,
    /// Only accept this LUKS version: luks (any), luks1, luks2.
    #[arg(long = "type", short = 'M', default_value = "luks", value_parser = luks_type)]
    kind: VolumeType,
    /// Say the result.
    #[arg(short, long)]
    verbose: bool,
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let mut cd = a.dev.context()?;
    match ucrypt::header::load_luks(&mut cd, a.kind) {
        Ok(()) => {
            if a.verbose {
                println!("Command successful.");
            }
            Ok(())
        }
        Err(e) => Err(e).code(EXIT_PARAMS),
    }
}
