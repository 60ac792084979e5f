//! [`Volume`]: the plaintext view of a dm-crypt mapping over a backend.
//!
//! Mirrors what `crypt_map` does for one bio: positions are relative to the mapping
//! (`dm_target_offset`), ciphertext lives at `data_offset + position` on the device
//! (`cc->start`), and the IV numbering is the cipher's business.

use crate::rangelock::RangeLocks;
use crate::split::{split, Partial};
use crate::EngineError;
use std::sync::Arc;
use ucrypt_backend::{check_range, Backend, BackendError, BackendInfo, Caps, Support};
use ucrypt_crypto::{Sector512, SectorCipher};

/// Where the mapping sits on the backend and what it allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeConfig {
    /// Where the ciphertext starts on the backend, in bytes (table `offset` × 512).
    pub data_offset_bytes: u64,
    /// Plaintext size in bytes (table `length` × 512).
    pub length_bytes: u64,
    /// Refuse writes.
    pub read_only: bool,
    /// Pass discards down (dm-crypt `allow_discards`).
    pub allow_discards: bool,
}

/// Zeros written per call by `write_zeroes` (encrypted like any data, never a hole).
const ZERO_CHUNK: usize = 1 << 20;

/// The decrypted view of a backend; itself a [`Backend`].
pub struct Volume {
    cipher: Arc<dyn SectorCipher>,
    backend: Arc<dyn Backend>,
    cfg: VolumeConfig,
    info: BackendInfo,
    sector_bytes: u64,
    locks: RangeLocks,
}

impl Volume {
    /// Builds the view. Nothing outside `[data_offset, data_offset + length)` of the backend
    /// is ever read or written.
    ///
    /// # Errors
    /// [`EngineError::TooSmall`] if the mapping does not fit the backend,
    /// [`EngineError::Misaligned`] if offset or length are not whole sectors.
    pub fn new(
        cipher: Arc<dyn SectorCipher>,
        backend: Arc<dyn Backend>,
        cfg: VolumeConfig,
    ) -> Result<Self, EngineError> {
        let ss = cipher.sector_size();
        let sector_bytes = u64::from(ss.bytes());
        for (what, value) in [
            ("length", cfg.length_bytes),
            ("data offset", cfg.data_offset_bytes),
        ] {
            if value % sector_bytes != 0 {
                return Err(EngineError::Misaligned {
                    what,
                    value,
                    sector_size: ss.bytes(),
                });
            }
        }
        let device = backend.info().size_bytes;
        if cfg
            .data_offset_bytes
            .checked_add(cfg.length_bytes)
            .is_none_or(|end| end > device)
        {
            return Err(EngineError::TooSmall {
                offset: cfg.data_offset_bytes,
                length: cfg.length_bytes,
                device,
            });
        }
        let lower = backend.info().clone();
        let discard = if cfg.allow_discards && lower.caps.discard != Support::None {
            lower.caps.discard
        } else {
            Support::None
        };
        let info = BackendInfo {
            size_bytes: cfg.length_bytes,
            logical_block: ss.bytes().max(lower.logical_block),
            physical_block: ss.bytes().max(lower.physical_block),
            optimal_block: ss.bytes().max(lower.optimal_block),
            caps: Caps {
                flush: lower.caps.flush,
                discard,
                write_zeroes: Support::Emulate,
                read_only: cfg.read_only || lower.caps.read_only,
            },
        };
        Ok(Volume {
            cipher,
            backend,
            cfg,
            info,
            sector_bytes,
            locks: RangeLocks::default(),
        })
    }

    /// The sector cipher.
    pub fn cipher(&self) -> &Arc<dyn SectorCipher> {
        &self.cipher
    }

    /// The backend holding the ciphertext.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    fn lower(&self, pos: u64) -> u64 {
        self.cfg.data_offset_bytes + pos
    }

    /// Reads and decrypts whole sectors at `pos` into `buf`.
    fn read_sectors(&self, buf: &mut [u8], pos: u64) -> Result<(), BackendError> {
        self.backend.read_at(buf, self.lower(pos))?;
        self.cipher.decrypt(Sector512::from_bytes_floor(pos), buf);
        Ok(())
    }

    fn read_partial(&self, buf: &mut [u8], p: Partial) -> Result<(), BackendError> {
        let mut sector = vec![0u8; self.sector_bytes as usize];
        self.read_sectors(&mut sector, p.sector_start)?;
        buf.copy_from_slice(&sector[p.skip..p.skip + p.len]);
        Ok(())
    }
}

impl Backend for Volume {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), BackendError> {
        check_range(offset, buf.len() as u64, self.info.size_bytes)?;
        let s = split(offset, buf.len() as u64, self.sector_bytes);
        let mut at = 0usize;
        if let Some(h) = s.head {
            self.read_partial(&mut buf[..h.len], h)?;
            at = h.len;
        }
        if let Some((pos, len)) = s.body {
            // Whole sectors: decrypt in place in the caller's buffer, no copy.
            self.read_sectors(&mut buf[at..at + len as usize], pos)?;
            at += len as usize;
        }
        if let Some(t) = s.tail {
            self.read_partial(&mut buf[at..], t)?;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<(), BackendError> {
        if self.info.caps.read_only {
            return Err(BackendError::ReadOnly);
        }
        check_range(offset, buf.len() as u64, self.info.size_bytes)?;
        if buf.is_empty() {
            return Ok(());
        }
        let mask = self.sector_bytes - 1;
        let start = offset & !mask;
        let end = (offset + buf.len() as u64 + mask) & !mask;
        let _guard = self.locks.lock(start, end);
        let mut out = vec![0u8; (end - start) as usize];
        let s = split(offset, buf.len() as u64, self.sector_bytes);
        let ss = self.sector_bytes as usize;
        // Read-modify-write: partial edge sectors start from their current plaintext.
        if let Some(h) = s.head {
            self.read_sectors(&mut out[..ss], h.sector_start)?;
        }
        if let Some(t) = s.tail {
            if s.head.is_none_or(|h| h.sector_start != t.sector_start) {
                let n = out.len();
                self.read_sectors(&mut out[n - ss..], t.sector_start)?;
            }
        }
        let skip = (offset - start) as usize;
        out[skip..skip + buf.len()].copy_from_slice(buf);
        self.cipher
            .encrypt(Sector512::from_bytes_floor(start), &mut out);
        self.backend.write_at(&out, self.lower(start), fua)
    }

    fn flush(&self) -> Result<(), BackendError> {
        self.backend.flush()
    }

    fn discard(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        if self.info.caps.discard == Support::None {
            return Err(BackendError::Unsupported(
                "discard (the table has no allow_discards)",
            ));
        }
        check_range(offset, len, self.info.size_bytes)?;
        // Only whole sectors are discarded; a partial sector keeps its data (discard is
        // advisory, and zeroing part of a sector would need a read-modify-write).
        if let Some((pos, l)) = split(offset, len, self.sector_bytes).body {
            let _guard = self.locks.lock(pos, pos + l);
            self.backend.discard(self.lower(pos), l)?;
        }
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), BackendError> {
        check_range(offset, len, self.info.size_bytes)?;
        let zeros = vec![0u8; ZERO_CHUNK.min(len as usize)];
        let mut pos = offset;
        let end = offset + len;
        while pos < end {
            let n = (end - pos).min(zeros.len() as u64) as usize;
            self.write_at(&zeros[..n], pos, false)?;
            pos += n as u64;
        }
        if fua {
            // FUA covers the whole request: one flush after all chunks.
            self.backend.flush()?;
        }
        Ok(())
    }
}
