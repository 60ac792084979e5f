//! `ucrypt table`: check a table (one line, several targets, or stacked devices) and print
//! it canonically (like `dmsetup table`).

use super::{CliError, TableArg};
use ucrypt::format::ValidateOptions;

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
    let mapping = a.table.mapping()?;
    for (i, table) in mapping.crypt_lines().enumerate() {
        let checked: Result<(), anyhow::Error> = table
            .build_cipher(ValidateOptions {
                allow_large_sectors: a.large_sectors,
            })
            .map(drop)
            .map_err(Into::into);
        if mapping.single_line().is_some() {
            checked?;
        } else {
            checked.map_err(|e| e.context(format!("crypt target {} ({})", i + 1, table.device)))?;
        }
    }
    super::read::warn_large(mapping.crypt_lines());
    for line in mapping.to_lines(a.showkeys) {
        println!("{}", zeroize::Zeroizing::new(line).as_str());
    }
    Ok(())
}
