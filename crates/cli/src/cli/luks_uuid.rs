//! `ucrypt luksUUID <device> [--uuid U | --set-random]`: prints or sets the header UUID.

use super::luks::{CsResult, DeviceArgs};
use super::secret;
use super::CliError;
use ucrypt::header::VolumeType;

/// Arguments of `ucrypt luksUUID`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    dev: DeviceArgs,
    /// Set this UUID instead of printing it.
    #[arg(long)]
    uuid: Option<String>,
    /// Do not ask for confirmation when changing the UUID.
    #[arg(short = 'q', long)]
    batch_mode: bool,
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let mut cd = a.dev.load(VolumeType::Luks)?;
    match &a.uuid {
        None => {
            println!("{}", cd.info().uuid.unwrap_or_default());
            Ok(())
        }
        Some(u) => {
            let _claimed = super::luks::claim_for_header_change(&a.dev)?;
            secret::confirm(
                a.batch_mode,
                &format!(
                    "Do you really want to change UUID of device {}",
                    a.dev.device.display()
                ),
            )?;
            cd.set_uuid(Some(u)).cs()
        }
    }
}
