//! dm-crypt's authenticated modes over dm-integrity with external tags: the crypt target
//! with `integrity:N:aead` on an [`IntegrityBackend`] without `internal_hash`, as a
//! `Backend`. Each sector is encrypted with its tag (and, for `random` IVs, the IV in the
//! tag) by [`ucrypt_crypto::aead::AeadCipher`] and written with its tag in one call, so the
//! journal keeps them together; a read fetches data and tags and fails exactly the sector
//! whose tag does not match ([`BackendError::Integrity`], EILSEQ), as the kernel's
//! `crypt_convert_block_aead` fails it with `BLK_STS_PROTECTION`.
//!
//! ```text
//!   front end ──► AeadVolume ──► IntegrityBackend (external tags) ──► Arc<dyn Backend>
//!                  read: data + tags, check, decrypt     J/D: data and tags together
//!                  write: encrypt, tags, write both
//! ```

use crate::IntegrityBackend;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use ucrypt_backend::{check_range, emulate, Backend, BackendError, BackendInfo, Io, IoKind};
use ucrypt_crypto::aead::AeadCipher;

/// An authenticated crypt target over a dm-integrity device. See the [module docs](self).
pub struct AeadVolume {
    cipher: AeadCipher,
    dev: Arc<IntegrityBackend>,
    info: BackendInfo,
    /// Sectors whose tag did not match since open.
    failures: AtomicU64,
    /// Orders writes that share a sector: a partial-sector write (read, change, write
    /// back) holds it exclusively from its read to its write; whole-sector writes hold it
    /// shared, so none lands between a partial write's read and its write (which would
    /// write back the sector as it was and lose that write half-way).
    order: RwLock<()>,
}

impl std::fmt::Debug for AeadVolume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AeadVolume")
            .field("cipher", &self.cipher)
            .field("size", &self.info.size_bytes)
            .finish_non_exhaustive()
    }
}

impl AeadVolume {
    /// The crypt target of `length` 512-byte sectors over `dev` (which must have external
    /// tags of the cipher's tag size and blocks of its sector size, as the kernel
    /// requires of the device below a crypt target with `integrity:N:aead`).
    ///
    /// # Errors
    /// A device with its own hash, another tag size or block size, or shorter than
    /// `length`.
    pub fn new(
        cipher: AeadCipher,
        dev: Arc<IntegrityBackend>,
        length: u64,
    ) -> Result<AeadVolume, BackendError> {
        let refuse = |m: String| Err(BackendError::Other(m));
        if !dev.external_tags() {
            return refuse(
                "integrity:N:aead needs a dm-integrity device without internal_hash below".into(),
            );
        }
        let geo = dev.geometry();
        if geo.tag_size as usize != cipher.tag_size() {
            return refuse(format!(
                "the crypt target's integrity tag is {} bytes, the dm-integrity device's {}",
                cipher.tag_size(),
                geo.tag_size
            ));
        }
        let ss = cipher.sector_size().bytes();
        if geo.block_bytes() != u64::from(ss) {
            return refuse(format!(
                "the crypt sector size {ss} differs from the dm-integrity block size {} (the \
                 kernel needs one tag per crypt sector)",
                geo.block_bytes()
            ));
        }
        let size_bytes = length.saturating_mul(512);
        if size_bytes > dev.info().size_bytes || size_bytes % u64::from(ss) != 0 {
            return refuse(format!(
                "the crypt target maps {length} sectors; the dm-integrity device provides {} \
                 in {ss}-byte sectors",
                dev.info().size_bytes / 512
            ));
        }
        let mut info = dev.info().clone();
        info.size_bytes = size_bytes;
        Ok(AeadVolume {
            cipher,
            dev,
            info,
            failures: AtomicU64::new(0),
            order: RwLock::new(()),
        })
    }

    /// Sectors that failed authentication since open.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// The dm-integrity device below.
    pub fn device(&self) -> &Arc<IntegrityBackend> {
        &self.dev
    }

    fn ss(&self) -> u64 {
        u64::from(self.cipher.sector_size().bytes())
    }

    /// Whole sectors at `offset` (aligned).
    fn read_sectors(&self, buf: &mut [u8], offset: u64) -> Result<(), BackendError> {
        let n = buf.len() / self.ss() as usize;
        let mut tags = vec![0u8; n * self.cipher.tag_size()];
        self.dev.read_tagged(buf, &mut tags, offset)?;
        self.cipher.decrypt(offset / 512, buf, &tags).map_err(|e| {
            self.failures.fetch_add(1, Ordering::Relaxed);
            BackendError::Integrity {
                offset: e.sector * 512,
                len: self.ss(),
            }
        })
    }

    /// Whole sectors at `offset` (aligned); `buf` is encrypted in place. Holds the write
    /// order shared ([`AeadVolume::order`]).
    fn write_whole(&self, buf: &mut [u8], offset: u64, fua: bool) -> Result<(), BackendError> {
        let _shared = self
            .order
            .read()
            .map_err(|_| BackendError::Other("write order lock poisoned".into()))?;
        self.write_sectors(buf, offset, fua)
    }

    /// Whole sectors at `offset` (aligned); `buf` is encrypted in place. The caller holds
    /// the write order.
    fn write_sectors(&self, buf: &mut [u8], offset: u64, fua: bool) -> Result<(), BackendError> {
        let n = buf.len() / self.ss() as usize;
        let mut tags = vec![0u8; n * self.cipher.tag_size()];
        self.cipher
            .encrypt(offset / 512, buf, &mut tags)
            .map_err(|e| BackendError::Other(e.to_string()))?;
        self.dev.write_tagged(buf, &tags, offset, fua)
    }

    fn read(&self, buf: &mut [u8], offset: u64) -> Result<(), BackendError> {
        check_range(offset, buf.len() as u64, self.info.size_bytes)?;
        let ss = self.ss();
        let start = offset - offset % ss;
        let end = (offset + buf.len() as u64).div_ceil(ss) * ss;
        if start == offset && end == offset + buf.len() as u64 {
            return self.read_sectors(buf, offset);
        }
        let mut whole = vec![0u8; (end - start) as usize];
        self.read_sectors(&mut whole, start)?;
        let from = (offset - start) as usize;
        buf.copy_from_slice(&whole[from..from + buf.len()]);
        Ok(())
    }

    fn write(&self, buf: &[u8], offset: u64, fua: bool) -> Result<(), BackendError> {
        if self.info.caps.read_only {
            return Err(BackendError::ReadOnly);
        }
        check_range(offset, buf.len() as u64, self.info.size_bytes)?;
        if buf.is_empty() {
            return Ok(());
        }
        let ss = self.ss();
        let start = offset - offset % ss;
        let end = (offset + buf.len() as u64).div_ceil(ss) * ss;
        if start == offset && end == offset + buf.len() as u64 {
            let mut own = buf.to_vec();
            return self.write_whole(&mut own, offset, fua);
        }
        // A partial sector: the whole sector read (and authenticated), changed, rewritten.
        let _exclusive = self
            .order
            .write()
            .map_err(|_| BackendError::Other("write order lock poisoned".into()))?;
        let mut whole = vec![0u8; (end - start) as usize];
        self.read_sectors(&mut whole, start)?;
        let from = (offset - start) as usize;
        whole[from..from + buf.len()].copy_from_slice(buf);
        self.write_sectors(&mut whole, start, fua)
    }
}

impl Backend for AeadVolume {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn submit(&self, io: Io<'_>) -> Result<(), BackendError> {
        match io.kind {
            IoKind::Read(buf) => self.read(buf, io.offset),
            IoKind::Write(buf) => self.write(buf, io.offset, io.fua),
            IoKind::WriteOwned(buf) => {
                let ss = self.ss();
                if io.offset % ss == 0 && buf.len() as u64 % ss == 0 && !self.info.caps.read_only {
                    check_range(io.offset, buf.len() as u64, self.info.size_bytes)?;
                    self.write_whole(buf, io.offset, io.fua)
                } else {
                    self.write(buf, io.offset, io.fua)
                }
            }
            _ => emulate::fallback(self, io),
        }
    }

    fn flush(&self) -> Result<(), BackendError> {
        self.dev.flush()
    }

    fn integrity_failures(&self) -> Option<u64> {
        Some(self.failures())
    }
}
