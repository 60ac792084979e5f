//! `ucrypt luksConvertKey <device> [<key file>]`: rewrites a LUKS2 keyslot with new PBKDF
//! parameters (`--pbkdf`, `--pbkdf-memory`, `--pbkdf-parallel`, `--iter-time`,
//! `--pbkdf-force-iterations`), same passphrase, as cryptsetup's: the keyslot is changed
//! to itself through libcryptsetup (`crypt_keyslot_change_by_passphrase`).

use super::exit::lib_error;
use super::luks::{verbose, DeviceArgs};
use super::luks_add_key::{KeyslotCipherArgs, PbkdfArgs};
use super::prompt::Terminal;
use super::secret::KeyFileArgs;
use super::CliError;
use std::path::PathBuf;
use ucrypt::header::VolumeType;
use ucrypt::luks::keyslots;

/// Arguments of `ucrypt luksConvertKey`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    dev: DeviceArgs,
    /// File with the passphrase (same as --key-file).
    positional_key_file: Option<PathBuf>,
    #[command(flatten)]
    key: KeyFileArgs,
    /// The keyslot to convert (default: the one the passphrase opens).
    #[arg(short = 'S', long)]
    key_slot: Option<u32>,
    #[command(flatten)]
    pbkdf: PbkdfArgs,
    #[command(flatten)]
    keyslot_cipher: KeyslotCipherArgs,
    /// Print the keyslot converted.
    #[arg(short, long)]
    verbose: bool,
    /// Accepted as cryptsetup's: this command asks no question.
    #[arg(short = 'q', long)]
    #[allow(dead_code)]
    batch_mode: bool,
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let _claimed = super::luks::claim_for_header_change(&a.dev)?;
    let mut cd = a.dev.load(VolumeType::Luks2)?;
    let mut key = a.key.inputs();
    if let Some(p) = a.positional_key_file.clone() {
        key.path = Some(p);
    }
    let o = keyslots::ConvertKey {
        key,
        key_slot: a.key_slot,
        pbkdf: a.pbkdf.choice(),
        keyslot_cipher: a.keyslot_cipher.choice(),
    };
    let slot = keyslots::convert(
        &mut cd,
        &a.dev.local_header()?,
        &o,
        &mut Terminal::default(),
    )
    .map_err(lib_error)?;
    verbose(a.verbose, format_args!("Key slot {slot} created."));
    verbose(a.verbose, "Command successful.");
    Ok(())
}
