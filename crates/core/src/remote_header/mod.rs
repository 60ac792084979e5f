//! Headers on a remote device: libcryptsetup reads headers from a path, so for a
//! device that is an NBD URI (`nbd://HOST/EXPORT`, `nbd+unix:///EXPORT?socket=PATH`) or a
//! Ceph RBD image (`rbd:POOL/IMAGE`, read-only while staged; the write-back opens it
//! read-write, under its exclusive lock) ucrypt
//! copies the header area into a memfd and hands libcryptsetup `/proc/self/fd/N`, as Ceph's
//! librbd does for its LUKS images. The memfd has the remote device's size (sparse: only the
//! copied header occupies memory), so size checks and data offsets come out as on the real
//! device. The data path then opens the URI itself; the key never leaves this process.
//!
//! What is copied: LUKS1 up to its payload offset (header and key-material areas), LUKS2
//! both binary headers with their JSON, the whole keyslots area (`config.keyslots_size`)
//! and every keyslot area the JSON names. For `open` anything else gets the first 4 KiB,
//! which is enough for libcryptsetup to say what it is not.
//!
//! ## Header commands ([`RemoteHeader`])
//! `luksFormat`, `isLuks`, `luksDump`, the keyslot commands, `luksUUID`,
//! `luksHeaderBackup/Restore`, `tcryptDump`, `bitlkDump` and `fvault2Dump` run libcryptsetup (or ucrypt's
//! TCRYPT reader) on the same kind of memfd, with what each format keeps outside a LUKS
//! header area copied too ([`metadata_ranges`]): BitLocker's three FVE metadata blocks at
//! the offsets its boot sector names; FileVault2's volume header, disk label, volume
//! groups descriptor and encrypted metadata blocks; TrueCrypt/VeraCrypt's first and last
//! 128 KiB (normal, hidden and system headers, and the backup headers at the end). After the command,
//! [`RemoteHeader::write_back`] sends the server exactly the bytes that differ from what it
//! holds:
//!
//! ```text
//!  compare  the copied ranges (memfd vs. the copy taken at staging) and every other page
//!           the command wrote (the memfd's data extents, SEEK_DATA) vs. the server's bytes
//!  refuse   if the server's bytes in a copied range changed meanwhile (another writer):
//!           nothing is written
//!  write    the differing byte runs (rounded out to the export's minimum block size;
//!           runs less than 512 bytes apart joined, the bytes between rewritten with the
//!           values the server holds), highest offset first, so keyslot material lands before the LUKS headers at
//!           the front that point at it (libcryptsetup's own order); then FLUSH
//! ```
//!
//! A command killed before the write-back leaves the server untouched; one that fails
//! still writes back what it changed (as libcryptsetup's writes would be on a local disk;
//! the command calls [`Staging::write_back`] after every command). There is no lock across machines: two hosts changing one remote header at
//! once is as unsafe as with cryptsetup on a shared disk; the changed-meanwhile check only
//! catches changes to the copied ranges.

mod staging;

pub use staging::Staging;

use crate::error::{bail, Context, Result};
use crate::open::{Device, DeviceKind};
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

/// Whether `device` names a remote device (an NBD export, an RBD image, memory) rather
/// than a local path ([`crate::open::DeviceKind`]).
pub fn is_remote(device: &std::path::Path) -> bool {
    DeviceKind::of_path(device).is_remote()
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
            .map_err(|e| crate::error::anyhow!("not UTF-8: {e}"))
            .and_then(|j| Ok(Metadata::parse(j)?))
            .context("LUKS2 JSON metadata does not parse")?;
        let mut end = 2 * hdr_size;
        if let Some(k) = meta.config.keyslots_size.as_ref().and_then(|k| k.get()) {
            end = end.max((2 * hdr_size).saturating_add(k));
        }
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
    let remote = crate::open::open_remote(&Device::parse(uri), true)?;
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

/// TrueCrypt/VeraCrypt keep headers in the first 128 KiB (normal at 0, system encryption
/// at sector 62, hidden at 64 KiB) and backups in the last 128 KiB.
const TCRYPT_SPAN: u64 = 128 << 10;

/// The byte ranges `(offset, length)` a header command needs from a device of `size`
/// bytes whose first 4 KiB are `first`: a LUKS header area ([`header_bytes`]); BitLocker's
/// boot sector and the three FVE metadata blocks it points at (`-FVE-FS-` volumes at byte
/// 176 of the boot sector, BitLocker To Go `MSWIN4.1` volumes at byte 440, as
/// libcryptsetup's `bitlk.c` reads them); anything else the first and last 128 KiB (the
/// TrueCrypt/VeraCrypt headers, and enough for libcryptsetup to say what it is not).
/// Sorted, merged, within the device.
///
/// # Errors
/// As [`header_bytes`].
pub fn metadata_ranges(
    first: &[u8],
    size: u64,
    read: &mut dyn FnMut(u64, usize) -> Result<Vec<u8>>,
) -> Result<Vec<(u64, u64)>> {
    use ucrypt_format::luks2::metadata::{MAGIC, MAGIC_REENCRYPT};
    let mut ranges = Vec::new();
    if first.starts_with(MAGIC) || first.starts_with(MAGIC_REENCRYPT) {
        // A header in reencryption (SKUL) has the LUKS2 layout: copy it the same way.
        let mut probe = first.to_vec();
        if probe.starts_with(MAGIC_REENCRYPT) {
            probe[..6].copy_from_slice(MAGIC);
        }
        ranges.push((0, header_bytes(&probe, size, read)?.max(4096)));
    } else if first.len() >= 512 && (&first[3..11] == b"-FVE-FS-" || &first[3..11] == b"MSWIN4.1") {
        let at = if &first[3..11] == b"-FVE-FS-" {
            176
        } else {
            440
        };
        ranges.push((0, 4096));
        let fve = ucrypt_format::bitlk::FVE_METADATA_BYTES;
        for i in 0..3 {
            let o = u64::from_le_bytes(first[at + 8 * i..at + 8 * i + 8].try_into()?);
            if o != 0 && o < size {
                ranges.push((o, fve));
            }
        }
    } else if first.len() >= 512 && first[88..90] == *b"CS" && first[8..10] == [1, 0] {
        ranges.extend(fvault2_ranges(size, read)?);
    } else {
        ranges.push((0, TCRYPT_SPAN));
        ranges.push((size.saturating_sub(TCRYPT_SPAN), TCRYPT_SPAN));
    }
    Ok(merge(ranges, size))
}

/// FileVault2 (Core Storage) metadata as libcryptsetup follows it: the ranges
/// [`ucrypt_format::fvault2::Layout`] finds from the unencrypted structures.
fn fvault2_ranges(
    size: u64,
    read: &mut dyn FnMut(u64, usize) -> Result<Vec<u8>>,
) -> Result<Vec<(u64, u64)>> {
    let mut read = |at: u64, len: usize| {
        read(at, len).map_err(|e| ucrypt_format::FormatError::Header {
            what: "reading FileVault2 metadata on the remote device".into(),
            reason: format!("{len} bytes at offset {at}: {e:#}"),
        })
    };
    let layout = ucrypt_format::fvault2::Layout::read_with(&mut read, size, "the remote device")?;
    Ok(layout.ranges(MAX_HEADER_BYTES))
}

/// Sorts `(offset, length)` ranges, clips them to `size` and merges overlapping ones.
fn merge(mut ranges: Vec<(u64, u64)>, size: u64) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (o, l) in ranges {
        let end = o.saturating_add(l).min(size);
        if o >= end {
            continue;
        }
        match out.last_mut() {
            Some((lo, ll)) if o <= *lo + *ll => *ll = (*ll).max(end - *lo),
            _ => out.push((o, end - o)),
        }
    }
    out
}

/// A remote device staged for a header command: a memfd of the device's size holding its
/// metadata ([`metadata_ranges`]), the copy taken then, and the connection the changes go
/// back through ([`RemoteHeader::write_back`]). See the module docs.
pub struct RemoteHeader {
    uri: String,
    staged: StagedHeader,
    /// Read-write for NBD; read-only (no lock) for RBD, whose write-back opens the image
    /// read-write, taking its exclusive lock, only when there is something to write.
    remote: Box<dyn Backend>,
    /// What the copied ranges held when they were read.
    snapshot: Vec<(u64, Vec<u8>)>,
}

impl std::fmt::Debug for RemoteHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteHeader")
            .field("uri", &self.uri)
            .field("staged", &self.staged)
            .field(
                "copied",
                &self
                    .snapshot
                    .iter()
                    .map(|(o, b)| (*o, b.len()))
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// What [`RemoteHeader::write_back`] sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteBack {
    /// Write requests sent (runs of changed bytes).
    pub runs: usize,
    /// Bytes written (changed bytes, rounded out to the export's minimum block size and
    /// joined across gaps under 512 bytes).
    pub bytes: u64,
}

impl RemoteHeader {
    /// Connects to `uri` and stages it: its metadata copied when `copy` (a device whose
    /// header is detached elsewhere needs only its size).
    ///
    /// # Errors
    /// Connection or read failures, an implausible header.
    pub fn stage(uri: &str, copy: bool) -> Result<RemoteHeader> {
        let device = Device::parse(uri);
        let remote: Box<dyn Backend> = if matches!(device.kind(), DeviceKind::Rbd | DeviceKind::Ram)
        {
            crate::open::open_remote(&device, true)?
        } else {
            Box::new(
                ucrypt_nbd::NbdBackend::connect(
                    uri,
                    ucrypt_nbd::RemoteOptions {
                        connections: 1,
                        read_only: false,
                    },
                )
                .with_context(|| format!("connecting to NBD device {uri}"))?,
            )
        };
        let size = remote.info().size_bytes;
        let mut read = |at: u64, len: usize| -> Result<Vec<u8>> {
            let len = len.min(size.saturating_sub(at) as usize);
            let mut b = vec![0u8; len];
            remote
                .read_at(&mut b, at)
                .with_context(|| format!("reading the metadata of {uri} at byte {at}"))?;
            Ok(b)
        };
        let ranges = if copy && size > 0 {
            let first = read(0, 4096)?;
            metadata_ranges(&first, size, &mut read)?
        } else {
            Vec::new()
        };
        let file = memfd("ucrypt-remote-header")?;
        file.set_len(size)
            .context("sizing the memfd for the remote header")?;
        seal_size(&file)?;
        let mut snapshot = Vec::new();
        for (o, l) in ranges {
            let bytes = read(o, l as usize)?;
            file.write_all_at(&bytes, o)
                .context("writing the remote metadata into the memfd")?;
            snapshot.push((o, bytes));
        }
        let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        Ok(RemoteHeader {
            uri: uri.to_string(),
            staged: StagedHeader { file, path, size },
            remote,
            snapshot,
        })
    }

    /// The local path header readers open (`/proc/self/fd/N`).
    pub fn path(&self) -> &std::path::Path {
        self.staged.path()
    }

    /// The URI staged.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// The ranges of the memfd the command may have changed: the copied ranges and every
    /// data extent (pages written), merged.
    fn candidate_ranges(&self) -> Result<Vec<(u64, u64)>> {
        let fd = self.staged.file.as_raw_fd();
        let size = self.staged.size;
        let mut ranges: Vec<(u64, u64)> = self
            .snapshot
            .iter()
            .map(|(o, b)| (*o, b.len() as u64))
            .collect();
        let mut at = 0u64;
        while at < size {
            // SAFETY: lseek on a descriptor this value owns; no memory is passed.
            let data = unsafe { libc::lseek(fd, at as libc::off_t, libc::SEEK_DATA) };
            if data < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::ENXIO) {
                    break; // no data after `at`
                }
                return Err(e).context("finding the pages written in the memfd (SEEK_DATA)");
            }
            // SAFETY: as above.
            let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
            if hole < 0 {
                return Err(std::io::Error::last_os_error())
                    .context("finding the pages written in the memfd (SEEK_HOLE)");
            }
            let (data, hole) = (data as u64, (hole as u64).min(size));
            if hole <= data {
                break;
            }
            ranges.push((data, hole - data));
            at = hole;
        }
        Ok(merge(ranges, size))
    }

    /// Sends the server the bytes the command changed (see the module docs) and flushes.
    ///
    /// # Errors
    /// The memfd changed size, the server's copy of the metadata changed since staging
    /// (nothing is written then), or a read, write or flush failed.
    pub fn write_back(&self) -> Result<WriteBack> {
        let size = self.staged.size;
        let now = self.staged.file.metadata()?.len();
        if now != size {
            bail!(
                "the staged copy of {} changed size ({size} -> {now} bytes); nothing written",
                self.uri
            );
        }
        let block = u64::from(self.remote.info().logical_block.max(1));
        let mut runs: Vec<(u64, u64)> = Vec::new();
        const PIECE: u64 = 1 << 20;
        // Runs closer than this are sent as one request, the bytes between rewritten with
        // the values the server holds (just compared): a wiped keyslot area of random bytes
        // over random bytes is then a handful of requests, not one per 256 bytes.
        const JOIN_GAP: u64 = 512;
        for (o, l) in self.candidate_ranges()? {
            let mut at = o;
            while at < o + l {
                let n = (o + l - at).min(PIECE) as usize;
                let mut cur = vec![0u8; n];
                self.staged
                    .file
                    .read_exact_at(&mut cur, at)
                    .context("reading the staged copy")?;
                let mut server = vec![0u8; n];
                self.remote
                    .read_at(&mut server, at)
                    .with_context(|| format!("reading {} at byte {at}", self.uri))?;
                self.check_unchanged(at, &server)?;
                let mut i = 0;
                while i < n {
                    if cur[i] == server[i] {
                        i += 1;
                        continue;
                    }
                    let start = i;
                    while i < n && cur[i] != server[i] {
                        i += 1;
                    }
                    let s = (at + start as u64) / block * block;
                    let e = (at + i as u64).div_ceil(block) * block;
                    let e = e.min(size);
                    match runs.last_mut() {
                        Some((ro, rl)) if s <= *ro + *rl + JOIN_GAP => *rl = (*rl).max(e - *ro),
                        _ => runs.push((s, e - s)),
                    }
                }
                at += n as u64;
            }
        }
        let mut done = WriteBack::default();
        if runs.is_empty() {
            return Ok(done);
        }
        // RBD: the staging handle is read-only; writing takes the image's exclusive lock
        // (refused while a mapping holds the image, EBUSY), and the copied ranges are
        // compared again under it.
        let rw;
        let device = Device::parse(&self.uri);
        let remote: &dyn Backend = if device.kind() == DeviceKind::Rbd {
            rw = crate::open::open_remote(&device, false)?;
            for (o, snap) in &self.snapshot {
                let mut server = vec![0u8; snap.len()];
                rw.read_at(&mut server, *o)
                    .with_context(|| format!("reading {} at byte {o}", self.uri))?;
                self.check_unchanged(*o, &server)?;
            }
            &*rw
        } else {
            &*self.remote
        };
        for &(o, l) in runs.iter().rev() {
            let mut buf = vec![0u8; l as usize];
            self.staged
                .file
                .read_exact_at(&mut buf, o)
                .context("reading the staged copy")?;
            remote.write_at(&buf, o, false).with_context(|| {
                format!(
                    "writing the changed header bytes to {} at byte {o}",
                    self.uri
                )
            })?;
            done.runs += 1;
            done.bytes += l;
        }
        remote
            .flush()
            .with_context(|| format!("flushing {}", self.uri))?;
        Ok(done)
    }

    /// Fails if the server's bytes `server` at `at` differ from the copy taken at staging
    /// wherever the two overlap.
    fn check_unchanged(&self, at: u64, server: &[u8]) -> Result<()> {
        let end = at + server.len() as u64;
        for (o, snap) in &self.snapshot {
            let (s, e) = (at.max(*o), end.min(*o + snap.len() as u64));
            if s < e
                && server[(s - at) as usize..(e - at) as usize]
                    != snap[(s - o) as usize..(e - o) as usize]
            {
                bail!(
                    "the metadata of {} changed on the server while this command ran \
                     (bytes {s}..{e}); nothing written, run the command again",
                    self.uri
                );
            }
        }
        Ok(())
    }
}

/// Seals `file` at its size: a write past the end fails (EPERM) as on the fixed-size
/// device it stands for, instead of growing the copy (libcryptsetup extends a regular file
/// that is too small for a header, where on a block device it fails).
fn seal_size(file: &File) -> Result<()> {
    // SAFETY: fcntl on a descriptor `file` owns; F_ADD_SEALS takes an int argument.
    let r = unsafe {
        libc::fcntl(
            file.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error()).context("sealing the memfd's size");
    }
    Ok(())
}

fn memfd(name: &str) -> Result<File> {
    let cname = std::ffi::CString::new(name).expect("no NUL in the name");
    // SAFETY: a valid NUL-terminated name and flags; the returned descriptor is owned by
    // the File below and closed with it.
    let fd =
        unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
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
