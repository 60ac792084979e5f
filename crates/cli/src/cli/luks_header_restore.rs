//! `ucrypt luksHeaderRestore <device> --header-backup-file FILE`: writes a header backup
//! back over the device's header area (asks first unless `--batch-mode`).

use super::luks::{CsResult, DeviceArgs};
use super::secret;
use super::CliError;
use std::path::PathBuf;

/// Arguments of `ucrypt luksHeaderRestore`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    dev: DeviceArgs,
    /// The backup made by luksHeaderBackup.
    #[arg(long, value_name = "FILE")]
    header_backup_file: PathBuf,
    /// Do not ask for confirmation.
    #[arg(short = 'q', long)]
    batch_mode: bool,
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let _claimed = super::luks::claim_for_header_change(&a.dev)?;
    secret::confirm(
        a.batch_mode,
        &format!(
            "Device {} will be overwritten with the header from {}; keyslots not in the backup will be lost",
            a.dev.header_path().display(),
            a.header_backup_file.display()
        ),
    )?;
    let mut cd = a.dev.context()?;
    // The backup's whole length is what the restore may write.
    let backup_len = std::fs::metadata(&a.header_backup_file).map_or(0, |m| m.len());
    super::progress::writing_header(
        "Restoring the header",
        &a.dev.local_header()?,
        backup_len,
        || cd.header_restore(&a.header_backup_file).cs(),
    )
}
