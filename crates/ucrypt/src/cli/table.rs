//! `ucrypt table`: check a table line and print it canonically (like `dmsetup table`).

use super::{CliError, TableArg};
use ucrypt_format::{TableLine, ValidateOptions};

/// Arguments of `ucrypt table`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    table: TableArg,
    /// Print the key (dmsetup's --showkeys); hidden otherwise.
    #[arg(long)]
    showkeys: bool,
    /// Accept sector sizes above 4096 (the kernel cannot open such a volume).
    #[arg(long)]
    large_sectors: bool,
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let line = a.table.line()?;
    let table: TableLine = line.parse()?;
    table.build_cipher(ValidateOptions {
        allow_large_sectors: a.large_sectors,
    })?;
    super::read::warn_large(&table);
    println!(
        "{}",
        zeroize::Zeroizing::new(table.to_line(a.showkeys)).as_str()
    );
    Ok(())
}
