//! `ucrypt bitlkDump` / `fvault2Dump <device>`: the header as cryptsetup
//! prints it (libcryptsetup's own `crypt_dump`), or the volume key (only when confirmed).

use super::luks::{CsResult, DeviceArgs};
use super::secret::{self, KeyFileArgs};
use super::CliError;
use ucrypt::header::{load_luks, VolumeType};

/// Arguments of `ucrypt bitlkDump` and `fvault2Dump` (`tcryptDump`: see `cli::tcrypt`).
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    dev: DeviceArgs,
    /// Print the volume key (needs the passphrase, and --batch-mode or a typed YES).
    #[arg(long, alias = "dump-master-key")]
    dump_volume_key: bool,
    /// Confirms --dump-volume-key without a question.
    #[arg(short = 'q', long)]
    batch_mode: bool,
    #[command(flatten)]
    key: KeyFileArgs,
}

/// Runs the dump for `kind` (Bitlk or Fvault2).
pub(crate) fn run(kind: VolumeType, a: Args) -> Result<(), CliError> {
    let mut cd = a.dev.context()?;
    load_luks(&mut cd, kind).map_err(super::luks::cs_error)?;
    if !a.dump_volume_key {
        print!("{}", super::luks::shown(cd.dump().cs()?));
        return Ok(());
    }
    secret::confirm(
        a.batch_mode,
        "The header dump with volume key is sensitive information that allows access to \
         the encrypted partition without a passphrase. This dump should always be stored \
         encrypted in a safe place",
    )?;
    let pass = secret::existing(&a.key, &a.dev.device)?;
    let (_, key) = cd.volume_key(None, &pass).cs()?;
    let info = cd.info();
    let mut out = format!(
        "{} header information for {}\nCipher name:   \t{}\nCipher mode:   \t{}\nVolume key bits:\t{}\nVolume key:    \t",
        info.kind.map_or("Volume".into(), |k| k.to_string()),
        a.dev.device.display(),
        info.cipher,
        info.cipher_mode,
        key.len() * 8
    );
    for b in key.as_bytes() {
        out.push_str(&format!("{b:02x}"));
    }
    out.push('\n');
    print!("{out}");
    zeroize::Zeroize::zeroize(&mut out);
    Ok(())
}
