//! What the LUKS commands share: the device argument with `--header`, `--type`,
//! `--batch-mode`, error → exit code mapping, and loading the header.

use super::{CliError, EXIT_DEVICE};
use std::path::{Path, PathBuf};
use ucrypt::header::{crypt_device, load_luks, VolumeType};
use ucrypt_format::cryptsetup::CryptDevice;
use ucrypt_format::FormatError;

/// The device and its header location.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct DeviceArgs {
    /// The LUKS device or image file.
    pub(crate) device: PathBuf,
    /// Use a detached LUKS header file instead of the device's own.
    #[arg(long, value_name = "FILE")]
    pub(crate) header: Option<PathBuf>,
}

impl DeviceArgs {
    /// A libcryptsetup context on the device (and detached header).
    pub(crate) fn context(&self) -> Result<CryptDevice, CliError> {
        crypt_device(&self.device, self.header.as_deref()).map_err(cs_error)
    }

    /// A context with the LUKS header of `kind` loaded.
    pub(crate) fn load(&self, kind: VolumeType) -> Result<CryptDevice, CliError> {
        let mut cd = self.context()?;
        load_luks(&mut cd, kind).map_err(cs_error)?;
        Ok(cd)
    }

    /// Where the header is (the detached file or the device).
    pub(crate) fn header_path(&self) -> &Path {
        self.header.as_deref().unwrap_or(&self.device)
    }
}

/// Parses `--type` for LUKS commands.
pub(crate) fn luks_type(s: &str) -> Result<VolumeType, String> {
    match s.parse::<VolumeType>() {
        Ok(VolumeType::Plain) => Err("plain volumes have no LUKS header".into()),
        Ok(t @ (VolumeType::Bitlk | VolumeType::Fvault2 | VolumeType::Tcrypt)) => Err(format!(
            "{t:?} is not a LUKS type (expected luks, luks1 or luks2)"
        )),
        Ok(t) => Ok(t),
        Err(e) => Err(e.to_string()),
    }
}

/// Maps an error to cryptsetup's exit code: libcryptsetup's errno where there is one
/// (EPERM → 2, ENOMEM → 3, ENODEV/ENOTBLK → 4, EBUSY → 5), a missing or unreadable device
/// → 4, anything else → 1.
pub(crate) fn cs_error(e: anyhow::Error) -> CliError {
    let mut code = None;
    for c in e.chain() {
        if let Some(f) = c.downcast_ref::<FormatError>() {
            if let FormatError::Cryptsetup { op, errno, .. } = f {
                if op == "opening device" && *errno != libc::EPERM {
                    code = Some(EXIT_DEVICE);
                    break;
                }
            }
            code = Some(f.exit_code());
            break;
        }
        if c.downcast_ref::<ucrypt_backend::BackendError>().is_some()
            || c.downcast_ref::<ucrypt_engine::EngineError>().is_some()
        {
            code = Some(EXIT_DEVICE);
            break;
        }
    }
    CliError {
        code: code.unwrap_or(super::EXIT_PARAMS),
        err: e,
    }
}

/// `anyhow` conversion plus [`cs_error`] for library results.
pub(crate) trait CsResult<T> {
    /// Maps the error with [`cs_error`].
    fn cs(self) -> Result<T, CliError>;
}

impl<T, E: Into<anyhow::Error>> CsResult<T> for Result<T, E> {
    fn cs(self) -> Result<T, CliError> {
        self.map_err(|e| cs_error(e.into()))
    }
}

/// Prints "Key slot N unlocked." / "Key slot N created." like cryptsetup `-v`.
pub(crate) fn verbose(v: bool, msg: impl std::fmt::Display) {
    if v {
        println!("{msg}");
    }
}
