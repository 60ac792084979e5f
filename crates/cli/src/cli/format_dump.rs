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
    let (_, key) =
        super::progress::searching("Unlocking the volume key", || cd.volume_key(None, &pass))
            .cs()?;
    let info = cd.info();
    // cryptsetup's own formats (2.6): BITLK prints a summary and an "MK dump" of 16 bytes a
    // line (cryptsetup.c); FVAULT2 prints its usual dump and one "Volume key" line.
    let mut out = if kind == VolumeType::Bitlk {
        format!(
            "BITLK header information for {}\nCipher name:   \t{}\nCipher mode:   \t{}\nUUID:          \t{}\nMK bits:       \t{}\nMK dump:\t{}",
            a.dev.device.display(),
            info.cipher,
            info.cipher_mode,
            info.uuid.as_deref().unwrap_or(""),
            key.len() * 8,
            hex_dump(key.as_bytes(), Some(16))
        )
    } else {
        format!(
            "{}Volume key:       \t{}",
            super::luks::shown(cd.dump().cs()?),
            hex_dump(key.as_bytes(), None)
        )
    };
    print!("{out}");
    zeroize::Zeroize::zeroize(&mut out);
    Ok(())
}

/// Bytes as cryptsetup's `crypt_log_hex` prints keys: "xx " each, after every `per_line`
/// bytes (when more follow) a new line indented by two tabs, and a final newline.
pub(crate) fn hex_dump(bytes: &[u8], per_line: Option<usize>) -> String {
    let mut out = String::with_capacity(bytes.len() * 3 + 8);
    for (i, b) in bytes.iter().enumerate() {
        if let Some(n) = per_line {
            if i > 0 && i % n == 0 {
                out.push_str("\n\t\t");
            }
        }
        out.push_str(&format!("{b:02x} "));
    }
    out.push('\n');
    out
}
