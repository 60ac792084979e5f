//! What an `open` serves: a table input's volume, a one-line table's device as it is
//! (`--raw`, the ciphertext baseline), or a header unlocked by the unlock policy; and
//! what the export is called.
//!
//! ```text
//!  Source::Table(Mapping)  ─► mapping::open_mapping ─────────────────┐
//!  Source::Raw(Mapping)    ─► one line, on a device ─► open_device ──┼─► Opened::Volume
//!  Source::Header(Request) ─► Request::unlock ─► open_unlocked ──────┘     { volume, description }
//!                                   └─ --test-passphrase ─► Opened::Checked
//! ```
//!
//! Errors carry the kind cryptsetup's exit code gives them: a device that cannot be used
//! or is busy is [`ErrorKind::Device`] or [`ErrorKind::Busy`], a refused table or option
//! [`ErrorKind::Invalid`], the unlock's own kinds unchanged.

use super::{open_device, Backend, OpenOptions};
use crate::error::{chain_kind, open_kind, Error, ErrorKind, Result};
use crate::prompt::Prompt;
use crate::unlock::{Outcome, Request};
use std::sync::Arc;
use ucrypt_format::{Mapping, TableLine};

/// What to open.
#[derive(Debug)]
pub enum Source {
    /// A table input: every line (several targets of a device, or stacked devices).
    Table(Mapping),
    /// A one-line table's device itself, ciphertext and all (no key is used).
    Raw(Mapping),
    /// A device with a header (or plain, TCRYPT, loop-AES... options), unlocked by the
    /// library's policy with the caller's prompt.
    Header(Box<Request>),
}

/// What an open gives.
pub enum Opened {
    /// `--test-passphrase`: the secret checked out; nothing is served.
    Checked,
    /// The volume to serve and its NBD export description.
    Volume {
        /// The decrypted view (or the raw device).
        volume: Arc<dyn Backend>,
        /// What the export calls itself (`NBD_INFO_DESCRIPTION`).
        description: String,
    },
}

/// The largest sector size the kernel's dm-crypt opens.
const KERNEL_MAX_SECTOR: u32 = 4096;

/// Opens `source` with `opts`. A table whose sector size the kernel cannot open
/// (`opts.allow_large_sectors`) is opened with a [`Prompt::warning`] saying so, once it
/// opened; a header's secrets are asked for through `prompt`.
///
/// # Errors
/// The table's, the device's (kind [`ErrorKind::Device`], or [`ErrorKind::Busy`] for an
/// image another client holds), the unlock's; `--raw` of a table that is not one line on
/// a device.
pub fn open_source(source: Source, opts: OpenOptions, prompt: &mut dyn Prompt) -> Result<Opened> {
    match source {
        Source::Table(mapping) => {
            let big = mapping
                .crypt_lines()
                .map(TableLine::sector_size_bytes)
                .max()
                .unwrap_or(512);
            let description = mapping.describe();
            let volume = crate::mapping::open_mapping(mapping, opts).map_err(kind_by(open_kind))?;
            // Only for a table that opened (a refused one gets its error alone).
            if big > KERNEL_MAX_SECTOR {
                prompt.warning(&large_sector_warning(big));
            }
            Ok(Opened::Volume {
                volume,
                description,
            })
        }
        Source::Raw(mapping) => {
            let Some(table) = mapping.single_line() else {
                return Err(Error::Invalid(
                    "--raw exports the device of a one-line table; this table has several \
                     targets or devices"
                        .into(),
                ));
            };
            let Some(device) = table.device.device() else {
                return Err(Error::Invalid(
                    "--raw exports a device; this table sits on another table".into(),
                ));
            };
            let volume =
                open_device(device, opts.read_only, opts.cache).map_err(kind_by(open_kind))?;
            Ok(Opened::Volume {
                volume,
                description: format!("ucrypt raw export of {}", table.device),
            })
        }
        Source::Header(request) => {
            let Outcome::Unlocked(unlocked, _) = request.unlock(prompt)? else {
                return Ok(Opened::Checked);
            };
            if request.test_passphrase {
                return Ok(Opened::Checked);
            }
            let description = unlocked.export_description();
            let volume =
                crate::header::open_unlocked(*unlocked, opts).map_err(kind_by(chain_kind))?;
            Ok(Opened::Volume {
                volume,
                description,
            })
        }
    }
}

/// What a table of sector size `big` is warned with.
pub fn large_sector_warning(big: u32) -> String {
    format!(
        "sector_size {big} is beyond the kernel's limit of {KERNEL_MAX_SECTOR}: the Linux \
         kernel's dm-crypt cannot open this volume"
    )
}

/// The largest sector size of `lines`, when the kernel could not open it.
pub fn beyond_kernel<'a>(lines: impl IntoIterator<Item = &'a TableLine>) -> Option<u32> {
    lines
        .into_iter()
        .map(TableLine::sector_size_bytes)
        .max()
        .filter(|&b| b > KERNEL_MAX_SECTOR)
}

/// An error given the kind `rule` finds in its chain.
fn kind_by(rule: fn(&(dyn std::error::Error + 'static)) -> ErrorKind) -> impl Fn(Error) -> Error {
    move |e| {
        let kind = rule(&e);
        e.with_kind(kind)
    }
}
