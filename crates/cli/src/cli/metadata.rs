//! cryptsetup's metadata-only actions, through libcryptsetup (none needs the kernel):
//! `config` (label, subsystem, keyslot priority), `luksConvert`/`convert` (LUKS1 <->
//! LUKS2), `erase`/`luksErase` (every keyslot destroyed: the volume can no longer be
//! opened by any passphrase) and `repair`.

use super::luks::{CsResult, DeviceArgs};
use super::secret;
use super::{CliError, WithCode, EXIT_PARAMS};
use ucrypt::header::VolumeType;
use ucrypt::luks::HeaderType;

/// Arguments of `ucrypt config`.
#[derive(clap::Args)]
pub(crate) struct ConfigArgs {
    #[command(flatten)]
    dev: DeviceArgs,
    /// Set the LUKS2 label (as cryptsetup: label and subsystem are set together; the one
    /// not given is cleared).
    #[arg(long)]
    label: Option<String>,
    /// Set the LUKS2 subsystem ("" clears it).
    #[arg(long)]
    subsystem: Option<String>,
    /// Keyslot priority (with --key-slot): ignore, normal or prefer.
    #[arg(long, requires = "key_slot")]
    priority: Option<String>,
    /// The keyslot --priority applies to.
    #[arg(short = 'S', long)]
    key_slot: Option<u32>,
}

/// Arguments of `ucrypt luksConvert` / `convert`.
#[derive(clap::Args)]
pub(crate) struct ConvertArgs {
    #[command(flatten)]
    dev: DeviceArgs,
    /// The format to convert to: luks1 or luks2.
    #[arg(long = "type", short = 'M')]
    kind: String,
    /// Do not ask for confirmation.
    #[arg(short = 'q', long)]
    batch_mode: bool,
}

/// Arguments of `ucrypt erase` / `luksErase` and `ucrypt repair`.
#[derive(clap::Args)]
pub(crate) struct ConfirmArgs {
    #[command(flatten)]
    dev: DeviceArgs,
    /// Do not ask for confirmation.
    #[arg(short = 'q', long)]
    batch_mode: bool,
}

/// `ucrypt config DEV --label L --subsystem S [--priority P --key-slot N]`.
pub(crate) fn config(a: ConfigArgs) -> Result<(), CliError> {
    if a.label.is_none() && a.subsystem.is_none() && a.priority.is_none() {
        return Err(anyhow::anyhow!(
            "config needs --label, --subsystem or --priority with --key-slot"
        ))
        .code(EXIT_PARAMS);
    }
    let _claimed = super::luks::claim_for_header_change(&a.dev)?;
    let mut cd = a.dev.load(VolumeType::Luks2)?;
    if a.label.is_some() || a.subsystem.is_some() {
        // As cryptsetup: both are set at once, and the one not given is cleared.
        cd.set_label(a.label.as_deref(), a.subsystem.as_deref())
            .cs()?;
    }
    if let (Some(p), Some(slot)) = (&a.priority, a.key_slot) {
        let prio = match p.as_str() {
            "ignore" => 0,
            "normal" => 1,
            "prefer" => 2,
            other => {
                return Err(anyhow::anyhow!(
                    "unknown --priority {other:?} (ignore, normal or prefer)"
                ))
                .code(EXIT_PARAMS)
            }
        };
        cd.set_keyslot_priority(slot, prio).cs()?;
    }
    Ok(())
}

/// `ucrypt luksConvert DEV --type luks1|luks2`.
pub(crate) fn convert(a: ConvertArgs) -> Result<(), CliError> {
    let to = match a.kind.as_str() {
        "luks1" => HeaderType::Luks1,
        "luks2" => HeaderType::Luks2,
        other => {
            return Err(anyhow::anyhow!(
                "--type {other:?}: luksConvert converts to luks1 or luks2"
            ))
            .code(EXIT_PARAMS)
        }
    };
    let _claimed = super::luks::claim_for_header_change(&a.dev)?;
    let mut cd = a.dev.load(VolumeType::Luks)?;
    if cd.info().kind == Some(to) {
        return Err(anyhow::anyhow!(
            "{} is already {to}",
            a.dev.device.display()
        ))
        .code(EXIT_PARAMS);
    }
    secret::confirm(
        a.batch_mode,
        &format!(
            "In-place conversion to {to} format is dangerous operation. Are you sure?\n\
             Operation converts type of device {}",
            a.dev.device.display()
        ),
    )?;
    cd.convert(to).cs()
}

/// `ucrypt erase DEV`: every keyslot destroyed (cryptsetup's `erase` for LUKS).
pub(crate) fn erase(a: ConfirmArgs) -> Result<(), CliError> {
    let _claimed = super::luks::claim_for_header_change(&a.dev)?;
    let mut cd = a.dev.load(VolumeType::Luks)?;
    secret::confirm(
        a.batch_mode,
        &format!(
            "This operation will erase all keyslots on device {}.\nDevice will become unusable \
             after this operation",
            a.dev.device.display()
        ),
    )?;
    ucrypt::luks::erase_keyslots(&mut cd).cs()
}

/// `ucrypt repair DEV`: libcryptsetup's repair of a LUKS header.
pub(crate) fn repair(a: ConfirmArgs) -> Result<(), CliError> {
    let _claimed = super::luks::claim_for_header_change(&a.dev)?;
    let mut cd = a.dev.context()?;
    secret::confirm(
        a.batch_mode,
        &format!(
            "Really try to repair LUKS device header of {}",
            a.dev.device.display()
        ),
    )?;
    cd.repair(None).cs()
}
