//! Assembling a volume from a table line: the one place that shows where every part of
//! the line goes (cipher and key → crypto, device → backend, offsets and flags → engine).

use crate::config::{engine_options, PerfOptions};
use crate::error::{Context, Result};
use std::sync::Arc;
use ucrypt_backend::file::{FileBackend, FileOptions};
use ucrypt_backend::Backend;
use ucrypt_engine::{Volume, VolumeConfig};
use ucrypt_format::{DeviceRef, OptParam, TableLine, ValidateOptions};

/// How to open a table's device.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenOptions {
    /// Open the device read-only.
    pub read_only: bool,
    /// Bypass the page cache on the device.
    pub direct: bool,
    /// Accept sector sizes above 4096 (not openable by the kernel).
    pub allow_large_sectors: bool,
    /// Engine settings from the command line.
    pub perf: PerfOptions,
}

/// A table line opened: the volume and what it was built from.
pub struct OpenedTable {
    /// The parsed line.
    pub table: TableLine,
    /// The decrypted view.
    pub volume: Arc<Volume>,
}

/// Parses `line`, opens its device and builds the volume.
///
/// # Errors
/// Table errors (with the rule that failed), device open errors (with the path), and a
/// device too small for the mapping.
pub fn open_table(line: &str, opts: OpenOptions) -> Result<OpenedTable> {
    let table: TableLine = line.trim().parse().context("parsing the table line")?;
    open_parsed(table, opts)
}

/// Opens the device of an already parsed (or assembled, e.g. from a LUKS header) table
/// line and builds the volume.
///
/// # Errors
/// As [`open_table`], without the parse step.
pub fn open_parsed(table: TableLine, opts: OpenOptions) -> Result<OpenedTable> {
    open_parsed_with(table, opts, |t| match &t.device {
        DeviceRef::Path(p) => open_device(p, opts.read_only, opts.direct),
        DeviceRef::Layer(j) => crate::error::bail!(
            "the line sits on table {j} of a mapping: open the whole mapping \
             (crate::mapping::open_mapping)"
        ),
    })
}

/// Builds the volume of `table` on the backend `below` returns for it (the table's device
/// opened as a path, or a lower layer of a stacked mapping). The cipher (and key) is
/// checked before `below` is asked for its backend.
///
/// # Errors
/// As [`open_parsed`], and any error of `below`.
pub fn open_parsed_with(
    table: TableLine,
    opts: OpenOptions,
    below: impl FnOnce(&TableLine) -> Result<Arc<dyn Backend>>,
) -> Result<OpenedTable> {
    let cipher = table
        .build_cipher(ValidateOptions {
            allow_large_sectors: opts.allow_large_sectors,
        })
        .context("checking the table line")?;
    let backend = below(&table)?;
    let volume = Volume::with_options(
        Arc::from(cipher),
        backend,
        VolumeConfig {
            data_offset_bytes: table.offset_bytes(),
            length_bytes: table.length_bytes(),
            read_only: opts.read_only,
            allow_discards: table.has(OptParam::AllowDiscards),
        },
        engine_options(Some(&table), &opts.perf),
    )
    .with_context(|| format!("mapping device {}", table.device))?;
    Ok(OpenedTable {
        table,
        volume: Arc::new(volume),
    })
}

/// Opens a device that is not a local path: an NBD URI or an RBD image (`rbd:POOL/IMAGE`),
/// as its backend ([`is_remote`] tells which devices these are). A read-write RBD open
/// takes the image's exclusive lock (`ucrypt_backend::rbd`).
///
/// # Errors
/// Connection or open failures, with the device named; an RBD image another client holds
/// fails with `EBUSY` in its [`ucrypt_backend::BackendError::Open`].
pub fn open_remote(device: &str, read_only: bool) -> Result<Box<dyn Backend>> {
    if ucrypt_backend::rbd::is_rbd(device) {
        let rbd =
            ucrypt_backend::RbdBackend::open(device, ucrypt_backend::RbdOptions { read_only })
                .with_context(|| format!("opening RBD device {device}"))?;
        return Ok(Box::new(rbd));
    }
    let remote = ucrypt_nbd::NbdBackend::connect(
        device,
        ucrypt_nbd::RemoteOptions {
            read_only,
            ..ucrypt_nbd::RemoteOptions::default()
        },
    )
    .with_context(|| format!("connecting to NBD device {device}"))?;
    Ok(Box::new(remote))
}

/// Whether `device` names a remote device ([`open_remote`]) rather than a local path.
pub fn is_remote(device: &str) -> bool {
    ucrypt_nbd::remote::is_nbd_uri(device) || ucrypt_backend::rbd::is_rbd(device)
}

/// Opens a table's device: a file or block device, a remote NBD export
/// (`nbd+unix:///EXPORT?socket=PATH`, `nbd://HOST[:PORT]/EXPORT`) or a Ceph RBD image
/// (`rbd:POOL/IMAGE`), so ciphertext can live on another server while the key stays here.
///
/// # Errors
/// Open or connection failures, with the device named.
pub fn open_device(device: &str, read_only: bool, direct: bool) -> Result<Arc<dyn Backend>> {
    if is_remote(device) {
        return Ok(Arc::from(open_remote(device, read_only)?));
    }
    // A malformed line can shift the key into the device field: the error then describes
    // the field instead of echoing it (the backend's error would name it as its path).
    let named = ucrypt_format::table::shown(device);
    let mut file = FileBackend::open(device, FileOptions { read_only, direct })
        .map_err(|e| match e {
            ucrypt_backend::BackendError::Open { source, .. } if named != device => {
                ucrypt_backend::BackendError::Open {
                    path: named.clone().into(),
                    source,
                }
            }
            other => other,
        })
        .with_context(|| format!("opening device {named}"))?;
    // Measured (`ucrypt bench uring`, BENCHMARKING.md): with O_DIRECT, a request's batch of
    // writes through io_uring reaches the device in parallel (1 MiB writes 1.7x pwrite);
    // through the page cache the gain is within noise, so buffered files keep pwrite.
    if direct {
        file.use_io_uring(true);
    }
    Ok(Arc::new(file))
}
