//! `ucrypt luksHeaderRestore <device> --header-backup-file FILE`: writes a header backup
//! back over the device's header area (asks first unless `--batch-mode`).

use super::exit::lib_error;
use super::luks::DeviceArgs;
use super::prompt::Terminal;
use super::CliError;
use std::path::PathBuf;
use ucrypt::luks::header;

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
    let mut prompt = Terminal::default();
    header::confirm_restore(
        a.dev.header_path(),
        &a.header_backup_file,
        a.batch_mode,
        &mut prompt,
    )
    .map_err(lib_error)?;
    let mut cd = a.dev.context()?;
    header::restore(
        &mut cd,
        &a.dev.local_header()?,
        &a.header_backup_file,
        &mut prompt,
    )
    .map_err(lib_error)
}
