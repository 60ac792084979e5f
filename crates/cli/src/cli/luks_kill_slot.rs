//! `ucrypt luksKillSlot <device> <slot>`: destroys one keyslot. Without `--batch-mode` a
//! passphrase of another keyslot must be given first (cryptsetup's rule), so a typo in
//! the slot number cannot lock the owner out.

use super::luks::{luks_type, verbose, CsResult, DeviceArgs};
use super::secret::{self, KeyFileArgs};
use super::{CliError, WithCode, EXIT_PARAMS};
use ucrypt::header::VolumeType;
use ucrypt::luks::KeyslotStatus;

/// Arguments of `ucrypt luksKillSlot`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    dev: DeviceArgs,
    /// The keyslot to destroy.
    slot: u32,
    #[command(flatten)]
    key: KeyFileArgs,
    /// Expected LUKS type.
    #[arg(long = "type", short = 'M', default_value = "luks", value_parser = luks_type)]
    kind: VolumeType,
    /// Do not ask for a remaining passphrase or confirmation.
    #[arg(short = 'q', long)]
    batch_mode: bool,
    /// Print the slot removed.
    #[arg(short, long)]
    verbose: bool,
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let _claimed = super::luks::claim_for_header_change(&a.dev)?;
    let mut cd = a.dev.load(a.kind)?;
    ucrypt::header::check_requirements(&mut cd).cs()?;
    match cd.keyslot_status(a.slot) {
        KeyslotStatus::Invalid => {
            return Err(anyhow::anyhow!("key slot {} is invalid", a.slot)).code(EXIT_PARAMS)
        }
        KeyslotStatus::Inactive => {
            return Err(anyhow::anyhow!("keyslot {} is not active", a.slot)).code(EXIT_PARAMS)
        }
        KeyslotStatus::ActiveLast => secret::confirm_last_keyslot(a.batch_mode)?,
        KeyslotStatus::Active | KeyslotStatus::Unbound => {
            if !a.batch_mode || a.key.key_file.is_some() {
                let pass = secret::get(
                    a.key
                        .key_file
                        .as_deref()
                        .map(|p| (p, a.key.keyfile_offset, a.key.keyfile_size)),
                    "Enter any remaining passphrase: ",
                    false,
                )?;
                let opened = super::progress::searching("Checking the passphrase", || {
                    cd.check_passphrase(None, &pass)
                })
                .cs()?;
                if opened == a.slot {
                    return Err(anyhow::anyhow!(
                        "the passphrase given opens keyslot {} itself; give one of another keyslot",
                        a.slot
                    ))
                    .code(2);
                }
            }
        }
    }
    cd.destroy_keyslot(a.slot).cs()?;
    verbose(a.verbose, format_args!("Key slot {} removed.", a.slot));
    Ok(())
}
