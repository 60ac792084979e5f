//! Headers on a remote NBD device: libcryptsetup reads headers from a path, so for a
//! device that is an NBD URI (`nbd://HOST/EXPORT`, `nbd+unix:///EXPORT?socket=PATH`) ucrypt
//! copies the header area into a memfd and hands libcryptsetup `/proc/self/fd/N`, as Ceph's
//! librbd does for its LUKS images. The memfd has the remote device's size (sparse: only the
//! copied header occupies memory), so size checks and data offsets come out as on the real
//! device. The data path then opens the URI itself; the key never leaves this process.
//!
//! What is copied: LUKS1 up to its payload offset (header and key-material areas), LUKS2
//! both binary headers with their JSON and every keyslot area the JSON names. Anything
//! else gets the first 4 KiB, which is enough for libcryptsetup to say what it is not.

use anyhow::{bail, Context, Result};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use ucrypt_backend::Backend;

/// Never copy more than this: a LUKS header area is 16 MiB by default and at most a few
/// hundred MiB with huge keyslot areas; a larger claim is a damaged or hostile header.
const MAX_HEADER_BYTES: u64 = 256 << 20;

/// A local stand-in for a remote device's header area, alive as long as this value.
pub struct StagedHeader {
    file: File,
    path: PathBuf,
    /// The remote device's size in bytes.
    pub size: u64,
}

impl StagedHeader {
    /// The path libcryptsetup (or any header reader) opens.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl std::fmt::Debug for StagedHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagedHeader")
            .field("path", &self.path)
            .field("fd", &self.file.as_raw_fd())
            .field("size", &self.size)
            .finish()
    }
}

/// Whether `device` names a remote NBD export rather than a local path.
pub fn is_remote(device: &std::path::Path) -> bool {
    device.to_str().is_some_and(ucrypt_nbd::remote::is_nbd_uri)
}

/// How many leading bytes of a device hold its LUKS header area, judged from its first
/// 4 KiB (and, for LUKS2, its JSON area, read through `read`).
///
/// # Errors
/// A header claiming an area beyond [`MAX_HEADER_BYTES`] or the device, or read errors.
pub fn header_bytes(
    first: &[u8],
    size: u64,
    read: &mut dyn FnMut(u64, usize) -> Result<Vec<u8>>,
) -> Result<u64> {
    use ucrypt_format::luks2::{self, BinaryHeader, Metadata};
    let version = (first.len() >= 8 && first.starts_with(luks2::metadata::MAGIC))
        .then(|| u16::from_be_bytes([first[6], first[7]]));
    let want = if first.len() >= 4096 && version == Some(1) {
        // LUKS1: payloadOffset (512-byte sectors) at byte 104.
        let payload = u32::from_be_bytes(first[104..108].try_into().expect("4 bytes"));
        u64::from(payload) * 512
    } else if first.len() >= 4096 && version == Some(2) {
        let hdr_size = BinaryHeader::parse(first)?.hdr_size;
        if !(4096..=MAX_HEADER_BYTES / 2).contains(&hdr_size) {
            bail!("LUKS2 header size {hdr_size} is out of range");
        }
        let json = read(4096, (hdr_size - 4096) as usize)?;
        let json = &json[..json.iter().position(|&b| b == 0).unwrap_or(json.len())];
        let meta = std::str::from_utf8(json)
            .map_err(|e| anyhow::anyhow!("not UTF-8: {e}"))
            .and_then(|j| Ok(Metadata::parse(j)?))
            .context("LUKS2 JSON metadata does not parse")?;
        let mut end = 2 * hdr_size;
        for area in meta.keyslots.values().filter_map(|k| k.area.as_ref()) {
            if let (Some(o), Some(l)) = (area.offset.get(), area.size.get()) {
                end = end.max(o.saturating_add(l));
            }
        }
        end
    } else if first.starts_with(luks2::metadata::MAGIC_REENCRYPT) {
        bail!("the device holds a LUKS2 header in the middle of a reencryption (SKUL magic)");
    } else {
        4096
    };
    if want > MAX_HEADER_BYTES {
        bail!(
            "the header claims {want} bytes of metadata, more than the {MAX_HEADER_BYTES} a \
             LUKS header can use"
        );
    }
    Ok(want.min(size))
}

/// Copies the header area of the NBD export `uri` into a memfd of the export's size (with
/// `copy` false, only sizes it: plain mode and detached headers read nothing there).
///
/// # Errors
/// Connection or read failures, or an implausible header.
pub fn stage(uri: &str, copy: bool) -> Result<StagedHeader> {
    let remote = ucrypt_nbd::NbdBackend::connect(
        uri,
        ucrypt_nbd::RemoteOptions {
            read_only: true,
            ..ucrypt_nbd::RemoteOptions::default()
        },
    )
    .with_context(|| format!("connecting to NBD device {uri}"))?;
    let size = remote.info().size_bytes;
    let mut read = |at: u64, len: usize| -> Result<Vec<u8>> {
        let len = len.min(size.saturating_sub(at) as usize);
        let mut b = vec![0u8; len];
        remote
            .read_at(&mut b, at)
            .with_context(|| format!("reading the header of {uri} at byte {at}"))?;
        Ok(b)
    };
    let n = if copy {
        let first = read(0, 4096)?;
        header_bytes(&first, size, &mut read)?
    } else {
        0
    };
    let file = memfd("ucrypt-remote-header")?;
    file.set_len(size)
        .context("sizing the memfd for the remote header")?;
    // Copy in 1 MiB pieces: a 16 MiB LUKS2 area never sits in one buffer.
    let mut at = 0u64;
    while at < n {
        let len = (n - at).min(1 << 20) as usize;
        let piece = read(at, len)?;
        file.write_all_at(&piece, at)
            .context("writing the remote header into the memfd")?;
        at += len as u64;
    }
    (&file).flush()?;
    let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    Ok(StagedHeader { file, path, size })
}

fn memfd(name: &str) -> Result<File> {
    let cname = std::ffi::CString::new(name).expect("no NUL in the name");
    // SAFETY: a valid NUL-terminated name and flags; the returned descriptor is owned by
    // the File below and closed with it.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("memfd_create");
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_read(_: u64, _: usize) -> Result<Vec<u8>> {
        panic!("not expected to read")
    }

    #[test]
    fn luks1_copies_up_to_the_payload() {
        let mut h = vec![0u8; 4096];
        h[..6].copy_from_slice(ucrypt_format::luks1::MAGIC);
        h[6..8].copy_from_slice(&1u16.to_be_bytes());
        h[104..108].copy_from_slice(&4096u32.to_be_bytes());
        assert_eq!(header_bytes(&h, 64 << 20, &mut no_read).unwrap(), 2 << 20);
        // A device smaller than the claim: only what exists.
        assert_eq!(header_bytes(&h, 1 << 20, &mut no_read).unwrap(), 1 << 20);
    }

    #[test]
    fn luks2_copies_both_headers_and_every_keyslot_area() {
        let mut h = vec![0u8; 4096];
        h[..6].copy_from_slice(ucrypt_format::luks1::MAGIC);
        h[6..8].copy_from_slice(&2u16.to_be_bytes());
        h[8..16].copy_from_slice(&16384u64.to_be_bytes());
        let json = br#"{"keyslots":{"0":{"area":{"offset":"32768","size":"258048"}},
            "3":{"area":{"offset":"1048576","size":"4096"}}}}"#;
        let mut read = |at: u64, len: usize| -> Result<Vec<u8>> {
            assert_eq!((at, len), (4096, 12288));
            let mut v = json.to_vec();
            v.resize(len, 0);
            Ok(v)
        };
        assert_eq!(header_bytes(&h, 64 << 20, &mut read).unwrap(), 1052672);
    }

    #[test]
    fn implausible_headers_are_refused_and_others_get_4k() {
        let mut h = vec![0u8; 4096];
        h[..6].copy_from_slice(ucrypt_format::luks1::MAGIC);
        h[6..8].copy_from_slice(&2u16.to_be_bytes());
        h[8..16].copy_from_slice(&u64::MAX.to_be_bytes());
        assert!(header_bytes(&h, 1 << 40, &mut no_read).is_err());
        h[6..8].copy_from_slice(&1u16.to_be_bytes());
        h[104..108].copy_from_slice(&u32::MAX.to_be_bytes());
        let e = header_bytes(&h, 1 << 40, &mut no_read).unwrap_err();
        assert!(e.to_string().contains("more than"), "{e}");
        assert_eq!(
            header_bytes(&[0u8; 4096], 1 << 30, &mut no_read).unwrap(),
            4096
        );
    }
}
