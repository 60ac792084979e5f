//! `ucrypt luksHeaderBackup <device> --header-backup-file FILE`: copies the whole LUKS
//! header area (binary headers, keyslots) to a new file.

use super::exit::lib_error;
use super::luks::DeviceArgs;
use super::prompt::Terminal;
use super::CliError;
use std::path::PathBuf;
use ucrypt::header::VolumeType;

/// Arguments of `ucrypt luksHeaderBackup`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    dev: DeviceArgs,
    /// The backup file to create (must not exist).
    #[arg(long, value_name = "FILE")]
    header_backup_file: PathBuf,
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let mut cd = a.dev.load(VolumeType::Luks)?;
    ucrypt::luks::header::backup(&mut cd, &a.header_backup_file, &mut Terminal::default())
        .map_err(lib_error)
}
