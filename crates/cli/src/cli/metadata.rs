//! cryptsetup's metadata-only actions (none needs the kernel), as the library's
//! `ucrypt::luks::header` decides them:
//! `config` (label, subsystem, keyslot priority), `luksConvert`/`convert` (LUKS1 <->
//! LUKS2), `erase`/`luksErase` (every keyslot destroyed: the volume can no longer be
//! opened by any passphrase) and `repair`.

use super::exit::lib_error;
use super::luks::DeviceArgs;
use super::prompt::Terminal;
use super::CliError;
use ucrypt::header::VolumeType;
use ucrypt::luks::header;

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
    let c = header::Config {
        label: a.label.clone(),
        subsystem: a.subsystem.clone(),
        priority: a.priority.clone().zip(a.key_slot),
    };
    c.check().map_err(lib_error)?;
    let _claimed = super::luks::claim_for_header_change(&a.dev)?;
    let mut cd = a.dev.load(VolumeType::Luks2)?;
    header::config(&mut cd, &c).map_err(lib_error)
}

/// `ucrypt luksConvert DEV --type luks1|luks2`.
pub(crate) fn convert(a: ConvertArgs) -> Result<(), CliError> {
    let to = header::convert_target(&a.kind).map_err(lib_error)?;
    let _claimed = super::luks::claim_for_header_change(&a.dev)?;
    let mut cd = a.dev.load(VolumeType::Luks)?;
    header::convert(
        &mut cd,
        &a.dev.device,
        to,
        a.batch_mode,
        &mut Terminal::default(),
    )
    .map_err(lib_error)
}

/// `ucrypt erase DEV`: every keyslot destroyed (cryptsetup's `erase` for LUKS).
pub(crate) fn erase(a: ConfirmArgs) -> Result<(), CliError> {
    let _claimed = super::luks::claim_for_header_change(&a.dev)?;
    let mut cd = a.dev.load(VolumeType::Luks)?;
    header::erase(
        &mut cd,
        &a.dev.device,
        a.batch_mode,
        &mut Terminal::default(),
    )
    .map_err(lib_error)
}

/// `ucrypt repair DEV`: libcryptsetup's repair of a LUKS header.
pub(crate) fn repair(a: ConfirmArgs) -> Result<(), CliError> {
    let _claimed = super::luks::claim_for_header_change(&a.dev)?;
    let mut cd = a.dev.context()?;
    header::repair(
        &mut cd,
        &a.dev.device,
        a.batch_mode,
        &mut Terminal::default(),
    )
    .map_err(lib_error)
}
