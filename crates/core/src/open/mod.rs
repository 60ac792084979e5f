//! Assembling a volume from a table line: the one place that shows where every part of
//! the line goes (cipher and key → crypto, device → backend, offsets and flags → engine);
//! opening the devices a line names; and what an `open` serves ([`Source`], `source.rs`).

mod source;

pub use source::{beyond_kernel, large_sector_warning, open_source, Opened, Source};

use crate::config::{engine_options, PerfOptions};
use crate::error::{Context, Result};
use std::sync::Arc;
use ucrypt_backend::file::{FileBackend, FileOptions};
use ucrypt_backend::MemoryBackend;
use ucrypt_engine::{Volume, VolumeConfig};
use ucrypt_format::{DeviceRef, OptParam, TableLine, ValidateOptions};

/// Whether a local device is read and written through the page cache.
///
/// dm-crypt has no page cache under it: its bios go to the device below as they are. A
/// userspace server reading a block device through the page cache copies every request
/// once more (the device's pages, then the server's buffer) and caches the device a second
/// time under the cache the filesystem above already keeps: measured in the kernel lab
/// (BENCHMARKING.md, "Block devices in the kernel lab"), 1 MiB requests over a ramdisk ran
/// about 3x faster with `O_DIRECT`. So block devices bypass it by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Cache {
    /// `O_DIRECT` for block devices with 512-byte logical blocks (every I/O the volume
    /// makes is a multiple of 512 bytes at a multiple of 512 bytes, so none is refused);
    /// regular files, whose page cache serves reads from a memory mapping, and block
    /// devices with larger logical blocks keep the page cache.
    #[default]
    Auto,
    /// `O_DIRECT` for every local device (`--direct`).
    Direct,
    /// The page cache for every local device (`--buffered`).
    Buffered,
}

/// How to open a table's device.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenOptions {
    /// Open the device read-only.
    pub read_only: bool,
    /// Whether the device's page cache sits under the volume.
    pub cache: Cache,
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
        DeviceRef::Device(d) => open_device(d, opts.read_only, opts.cache),
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

pub use ucrypt_format::device::{Device, DeviceKind, RAM_PREFIX};

/// What an open returns is a backend (a decrypted volume is one too): its trait, for
/// reading, writing and sizing it.
pub use ucrypt_backend::Backend;

/// A remote NBD export as a backend (what [`open_remote`] opens for an NBD URI), for a
/// caller that talks to an export it serves itself.
pub use ucrypt_nbd::{NbdBackend, RemoteOptions};

/// Opens a device that is not a local path: an NBD URI, an RBD image (`rbd:POOL/IMAGE`) or
/// a memory device (`ram:SIZE`), as its backend ([`DeviceKind`] tells which devices these
/// are). A read-write RBD open takes the image's exclusive lock (`ucrypt_backend::rbd`).
///
/// # Errors
/// Connection or open failures, with the device named; an RBD image another client holds
/// fails with `EBUSY` in its [`ucrypt_backend::BackendError::Open`].
pub fn open_remote(device: &Device, read_only: bool) -> Result<Box<dyn Backend>> {
    let device = match device {
        Device::Ram(text) => return Ok(Box::new(open_ram(text)?)),
        Device::Rbd(text) => {
            let rbd = ucrypt_backend::RbdBackend::open(
                text,
                ucrypt_backend::RbdOptions {
                    read_only,
                    ..Default::default()
                },
            )
            .with_context(|| format!("opening RBD device {device}"))?;
            return Ok(Box::new(rbd));
        }
        Device::Nbd(text) | Device::Local(text) => text.as_str(),
    };
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

/// Whether `device` names a memory device (`ram:SIZE`).
pub fn is_ram(device: &str) -> bool {
    DeviceKind::of(device) == DeviceKind::Ram
}

/// Memory devices alive in this process, by the string that names them.
static RAM_DEVICES: std::sync::Mutex<Vec<(String, std::sync::Weak<MemoryBackend>)>> =
    std::sync::Mutex::new(Vec::new());

/// The memory device `ram:SIZE`: a sparse ramdisk ([`MemoryBackend`], like the kernel's
/// brd) that reads as zeros until written and lives as long as this process holds it, so
/// ciphertext can sit in memory only (scratch space, tests, benchmarks). Within one process
/// the same string names the same device (two table lines on `ram:1G` share it, as two
/// lines on `/dev/ram0` would); once nothing holds it, its memory is freed.
///
/// # Errors
/// A size that is not cryptsetup's size syntax, zero, not a multiple of 512 bytes, or above
/// [`ucrypt_backend::memory::MAX_SIZE_BYTES`].
pub fn open_ram(device: &str) -> Result<Arc<MemoryBackend>> {
    let spec = device.strip_prefix(RAM_PREFIX).unwrap_or(device);
    let size = ucrypt_format::size::parse_size(spec)
        .map_err(|e| crate::Error::Invalid(format!("memory device {device}: {e}")))?;
    if size == 0 || size % 512 != 0 {
        return Err(crate::Error::Invalid(format!(
            "memory device {device}: the size must be a non-zero multiple of 512 bytes"
        )));
    }
    let mut live = RAM_DEVICES.lock().unwrap_or_else(|p| p.into_inner());
    live.retain(|(_, w)| w.strong_count() > 0);
    if let Some(ram) = live
        .iter()
        .find(|(n, _)| n == device)
        .and_then(|(_, w)| w.upgrade())
    {
        return Ok(ram);
    }
    let ram = Arc::new(
        MemoryBackend::new(size)
            .map_err(|e| crate::Error::Invalid(format!("memory device {device}: {e}")))?,
    );
    live.push((device.to_string(), Arc::downgrade(&ram)));
    Ok(ram)
}

/// Opens a table's device: a file or block device, a remote NBD export
/// (`nbd+unix:///EXPORT?socket=PATH`, `nbd://HOST[:PORT]/EXPORT`), a Ceph RBD image
/// (`rbd:POOL/IMAGE`), so ciphertext can live on another server while the key stays here,
/// or memory (`ram:SIZE`, [`open_ram`]).
///
/// # Errors
/// Open or connection failures, with the device named.
pub fn open_device(device: &Device, read_only: bool, cache: Cache) -> Result<Arc<dyn Backend>> {
    let device = match device {
        Device::Local(path) => path.as_str(),
        remote => return Ok(Arc::from(open_remote(remote, read_only)?)),
    };
    let file = match cache {
        Cache::Direct => open_file(device, read_only, true)?,
        Cache::Buffered => open_file(device, read_only, false)?,
        Cache::Auto => {
            let block_device = std::fs::metadata(device)
                .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()));
            // A block device that refuses O_DIRECT (EINVAL) or has larger logical blocks
            // than every request is sure to be a multiple of keeps the page cache.
            match block_device.then(|| open_file(device, read_only, true)) {
                Some(Ok(f)) if f.info().logical_block == 512 => f,
                _ => open_file(device, read_only, false)?,
            }
        }
    };
    Ok(Arc::new(file))
}

/// Opens a local file or block device, with `O_DIRECT` or without.
fn open_file(device: &str, read_only: bool, direct: bool) -> Result<FileBackend> {
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
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
                       202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f";

    fn line(device: &str) -> String {
        format!("0 64 crypt aes-xts-plain64 {KEY} 0 {device} 8 1 sector_size:4096")
    }

    #[test]
    fn a_memory_device_holds_the_ciphertext_a_file_would() {
        let plain: Vec<u8> = (0..32 * 1024u32)
            .map(|i| (i * 7 + i / 4096) as u8)
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("disk.img");
        std::fs::write(&img, vec![0u8; 72 * 512]).unwrap();
        let file = open_table(&line(img.to_str().unwrap()), OpenOptions::default()).unwrap();
        file.volume.write_at(&plain, 0, false).unwrap();
        file.volume.flush().unwrap();
        let ram = open_table(&line("ram:36K"), OpenOptions::default()).unwrap();
        ram.volume.write_at(&plain, 0, false).unwrap();
        // The same string names the same device while the volume holds it.
        let mem = open_ram("ram:36K").unwrap();
        let mut in_memory = vec![0u8; 72 * 512];
        mem.read_at(&mut in_memory, 0).unwrap();
        assert!(
            in_memory == std::fs::read(&img).unwrap(),
            "memory and file devices hold different ciphertext for the same line"
        );
        assert_ne!(
            in_memory[4096..8192],
            plain[..4096],
            "memory holds plaintext"
        );
        assert_eq!(in_memory[..4096], [0; 4096], "the offset was not honoured");
        let mut back = vec![0u8; plain.len()];
        ram.volume.read_at(&mut back, 0).unwrap();
        assert!(back == plain);
    }

    #[test]
    fn a_memory_device_lives_while_held_and_starts_empty() {
        let a = open_ram("ram:8S").unwrap();
        a.write_at(&[0xa5; 512], 0, false).unwrap();
        let mut b = [0u8; 512];
        open_ram("ram:8S").unwrap().read_at(&mut b, 0).unwrap();
        assert_eq!(
            b, [0xa5; 512],
            "a second open of the same name is another device"
        );
        drop(a);
        open_ram("ram:8S").unwrap().read_at(&mut b, 0).unwrap();
        assert_eq!(b, [0; 512], "a device nothing holds kept its data");
        assert!(Device::parse("ram:1G").is_remote() && is_ram("ram:1G") && !is_ram("/dev/ram0"));
    }

    #[test]
    fn bad_memory_sizes_are_named() {
        for (spec, why) in [
            ("ram:", "not a size"),
            ("ram:12Q", "unknown size unit"),
            ("ram:1000", "multiple of 512"),
            ("ram:0", "multiple of 512"),
            ("ram:4096T", "larger than the maximum"),
        ] {
            let e = open_ram(spec).unwrap_err().to_string();
            assert!(e.contains(spec) && e.contains(why), "{spec}: {e}");
        }
    }
}
