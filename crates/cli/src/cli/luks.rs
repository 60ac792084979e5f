//! What the LUKS commands share: the device argument with `--header`, `--type`,
//! `--batch-mode`, error → exit code mapping, and loading the header.

use super::exit::lib_error;
pub(crate) use super::exit::{cs_error, CsResult};
use super::CliError;
use std::path::{Path, PathBuf};
use ucrypt::header::{crypt_device, load_luks, VolumeType};
use ucrypt::luks::CryptDevice;
use ucrypt::remote_header::Staging;

/// The device and its header location.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct DeviceArgs {
    /// The encrypted device: a block device, an image file or an NBD URI.
    pub(crate) device: PathBuf,
    /// Use a detached header file instead of the device's own.
    #[arg(long, value_name = "FILE")]
    pub(crate) header: Option<PathBuf>,
}

impl DeviceArgs {
    /// A libcryptsetup context on the device (and detached header); NBD URIs are staged
    /// locally ([`local_path`]).
    pub(crate) fn context(&self) -> Result<CryptDevice, CliError> {
        let (device, header) = self.local()?;
        crypt_device(&device, header.as_deref()).map_err(cs_error)
    }

    /// A context on the header location alone (the detached header or the device), for
    /// luksFormat; NBD URIs staged as in [`DeviceArgs::context`].
    pub(crate) fn header_context(&self) -> Result<CryptDevice, CliError> {
        crypt_device(&local_path(self.header_path(), true)?, None).map_err(cs_error)
    }

    /// The device and detached header as local paths: an NBD URI becomes its staged memfd
    /// (metadata copied where the header is; only sized for a data device whose header is
    /// detached).
    pub(crate) fn local(&self) -> Result<(PathBuf, Option<PathBuf>), CliError> {
        let header = match &self.header {
            Some(h) => Some(local_path(h, true)?),
            None => None,
        };
        Ok((local_path(&self.device, header.is_none())?, header))
    }

    /// The data device as a local path (see [`DeviceArgs::local`]).
    pub(crate) fn local_device(&self) -> Result<PathBuf, CliError> {
        Ok(self.local()?.0)
    }

    /// A context with the LUKS header of `kind` loaded.
    pub(crate) fn load(&self, kind: VolumeType) -> Result<CryptDevice, CliError> {
        let mut cd = self.context()?;
        load_luks(&mut cd, kind).map_err(cs_error)?;
        Ok(cd)
    }

    /// The header's location as a local path (the detached file or the device; an NBD URI
    /// as its staged copy), for [`super::progress::writing_header`].
    pub(crate) fn local_header(&self) -> Result<PathBuf, CliError> {
        local_path(self.header_path(), true)
    }

    /// Where the header is (the detached file or the device).
    pub(crate) fn header_path(&self) -> &Path {
        self.header.as_deref().unwrap_or(&self.device)
    }
}

/// Remote devices staged by this process's header command, written back by
/// [`write_back_remote`] when it ends.
pub(crate) static STAGED: Staging = Staging::new();

/// `path` itself, or for an NBD URI the path of its staged copy ([`Staging::local_path`]:
/// staged once per URI and process, `copy` naming whether its metadata is needed).
///
/// # Errors
/// The server cannot be reached or read (exit code 4), or its header is implausible.
pub(crate) fn local_path(path: &Path, copy: bool) -> Result<PathBuf, CliError> {
    STAGED.local_path(path, copy).map_err(lib_error)
}

/// Writes every staged remote device's changes back to its server
/// ([`Staging::write_back`]). Called when a command ends, and by luksFormat before it
/// wipes through the data path.
///
/// # Errors
/// The first write-back that failed (exit code 4, or 5 for a busy device).
pub(crate) fn write_back_remote() -> Result<(), CliError> {
    STAGED.write_back().map_err(lib_error)
}

/// `text` (libcryptsetup's dump) naming every staged remote device by its URI.
pub(crate) fn shown(text: String) -> String {
    STAGED.shown(text)
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

/// Prints "Key slot N unlocked." / "Key slot N created." like cryptsetup `-v`.
pub(crate) fn verbose(v: bool, msg: impl std::fmt::Display) {
    if v {
        println!("{msg}");
    }
}

/// For header-changing commands: refuses (exit 5, naming the holder) when an instance
/// maps the device or its detached header, and keeps new mappings out until the returned
/// locks are dropped. With `--disable-locks`: nothing is checked or taken.
pub(crate) fn claim_for_header_change(
    dev: &DeviceArgs,
) -> Result<Vec<ucrypt::instance::lock::ImageLock>, CliError> {
    let mut held = Vec::new();
    if super::DISABLE_LOCKS.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(held);
    }
    let paths = std::iter::once(dev.device.as_path()).chain(dev.header.as_deref());
    for p in paths {
        if let Some(l) =
            ucrypt::instance::lock::lock_for_header_change(p).map_err(super::exit::lock_error)?
        {
            held.push(l);
        }
    }
    Ok(held)
}
