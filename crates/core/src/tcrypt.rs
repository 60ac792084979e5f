//! TrueCrypt / VeraCrypt volumes: the header decrypted in Rust
//! ([`ucrypt_format::tcrypt`]), the data area mapped as cryptsetup's kernel mapping does.
//!
//! ```text
//!  single cipher:  device ─► Volume(aes-xts-plain64, offset = data offset, iv_offset)
//!  cascade:        device ─► Volume(serpent …, offset, iv_offset)      (outermost on disk)
//!                          ─► Volume(twofish …, offset 0, iv_offset)
//!                          ─► Volume(aes …,     offset 0, iv_offset)   (what is served)
//! ```
//! The header is read here (I/O, the sysfs partition probe); the mapping is built in the
//! format layer from the header and the geometry values
//! ([`ucrypt_format::tcrypt::TcryptHeader::data_area`] and `::mapping`).
//! The cascade is a stack of tables ([`ucrypt_format::Mapping::stack`]), each upper one on
//! the table below ([`ucrypt_format::DeviceRef::Layer`]); [`crate::mapping::open_mapping`]
//! builds each as an engine `Volume` on the one below, the way cryptsetup stacks its
//! `name_2`, `name_1`, `name` dm-crypt devices.

use crate::error::{Context, Result};
use crate::unlocked::{HeaderOptions, Unlocked};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use ucrypt_format::tcrypt::{self, TcryptHeader};

/// Size of a file or block device in bytes.
fn device_bytes(path: &Path) -> Result<u64> {
    use std::io::{Seek, SeekFrom};
    let mut f =
        std::fs::File::open(path).with_context(|| format!("opening device {}", path.display()))?;
    Ok(f.seek(SeekFrom::End(0))?)
}

/// A block-device partition: (whole drive, first sector of the partition).
fn partition_of(path: &Path) -> Option<(PathBuf, u64)> {
    let md = std::fs::metadata(path).ok()?;
    if !md.file_type().is_block_device() {
        return None;
    }
    let rdev = md.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    let start: u64 = std::fs::read_to_string(sys.join("start"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    std::fs::metadata(sys.join("partition")).ok()?;
    let parent = std::fs::canonicalize(&sys)
        .ok()?
        .parent()?
        .file_name()?
        .to_owned();
    Some((Path::new("/dev").join(parent), start))
}

/// Reads and decrypts the TCRYPT header for `device` (or the detached `opts.header`; the
/// parent drive of a partition for system encryption).
///
/// # Errors
/// As [`tcrypt::load`].
pub fn load_header(
    device: &Path,
    secret: &[u8],
    opts: &HeaderOptions,
) -> Result<(TcryptHeader, PathBuf)> {
    let t = &opts.tcrypt;
    let meta = match (&opts.header, t.system) {
        (Some(h), _) => h.clone(),
        (None, true) => partition_of(device).map_or_else(|| device.to_path_buf(), |(d, _)| d),
        (None, false) => device.to_path_buf(),
    };
    let hdr = tcrypt::load(&meta, secret, t)
        .with_context(|| format!("unlocking TCRYPT device {}", device.display()))?;
    Ok((hdr, meta))
}

/// Unlocks a TCRYPT volume: the bottom layer as `table`, the layers above in `layers`.
///
/// # Errors
/// As [`load_header`], plus a sector size that is not a multiple of 512, and a device too small for
/// the area the header describes.
pub fn unlock_tcrypt(device: &Path, secret: &[u8], opts: &HeaderOptions) -> Result<Unlocked> {
    let t = &opts.tcrypt;
    let (hdr, meta) = load_header(device, secret, opts)?;
    let device_str = device.display().to_string();
    let geometry = tcrypt::Geometry {
        header_device_bytes: device_bytes(&meta)?,
        data_device_bytes: device_bytes(device)?,
        partition_start: if t.system {
            partition_of(device).map(|(_, start)| start)
        } else {
            None
        },
        detached_header: opts.header.is_some(),
    };
    let area = hdr.data_area(t, &geometry, &device_str)?;
    let mapping = hdr.mapping(&device_str, &area, opts.allow_discards)?;
    let info = hdr.info(&area);
    Ok(Unlocked {
        mapping,
        info,
        slot: None,
    })
}
