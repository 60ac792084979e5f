//! Backends placed end to end, like device-mapper's linear concatenation of a table's
//! targets (`drivers/md/dm-linear.c` maps one range; a table of several targets is their
//! concatenation). ucrypt joins a table's targets with it: BitLocker's crypt and zero
//! targets, or several crypt targets of one device.
//!
//! Flushes go to every piece that has a cache; requests are split at piece boundaries.
//! Discard and write-zeroes are not offered (pieces differ in what they support).

use crate::{check_range, Backend, BackendError, BackendInfo, Caps, Support};
use std::sync::Arc;

/// Backends placed end to end (dm's linear concatenation of a table's targets).
pub struct LinearBackend {
    /// (start byte, backend), sorted and contiguous.
    pieces: Vec<(u64, Arc<dyn Backend>)>,
    info: BackendInfo,
}

impl std::fmt::Debug for LinearBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinearBackend")
            .field("pieces", &self.pieces.len())
            .field("size_bytes", &self.info.size_bytes)
            .finish()
    }
}

impl LinearBackend {
    /// Concatenates `pieces` in order.
    ///
    /// # Errors
    /// [`BackendError::Other`] for no pieces.
    pub fn new(pieces: Vec<Arc<dyn Backend>>) -> Result<Self, BackendError> {
        if pieces.is_empty() {
            return Err(BackendError::Other(
                "a linear mapping needs at least one target".into(),
            ));
        }
        let mut at = 0;
        let mut placed = Vec::with_capacity(pieces.len());
        let mut logical = 512;
        let mut read_only = false;
        for p in pieces {
            let i = p.info();
            logical = logical.max(i.logical_block);
            read_only |= i.caps.read_only;
            let size = i.size_bytes;
            placed.push((at, p));
            at += size;
        }
        Ok(LinearBackend {
            pieces: placed,
            info: BackendInfo {
                size_bytes: at,
                logical_block: logical,
                physical_block: logical,
                optimal_block: logical.max(4096),
                caps: Caps {
                    flush: Support::Native,
                    discard: Support::None,
                    write_zeroes: Support::None,
                    read_only,
                },
            },
        })
    }

    /// Calls `f(piece, offset within piece, range of the buffer)` for each piece the byte
    /// range `[offset, offset + len)` touches.
    fn each(
        &self,
        offset: u64,
        len: usize,
        mut f: impl FnMut(&dyn Backend, u64, std::ops::Range<usize>) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        check_range(offset, len as u64, self.info.size_bytes)?;
        let end = offset + len as u64;
        for (start, p) in &self.pieces {
            let pend = start + p.info().size_bytes;
            if pend <= offset || *start >= end {
                continue;
            }
            let a = offset.max(*start);
            let b = end.min(pend);
            f(
                p.as_ref(),
                a - start,
                (a - offset) as usize..(b - offset) as usize,
            )?;
        }
        Ok(())
    }
}

impl Backend for LinearBackend {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), BackendError> {
        let len = buf.len();
        self.each(offset, len, |p, at, r| p.read_at(&mut buf[r], at))
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<(), BackendError> {
        if self.info.caps.read_only {
            return Err(BackendError::ReadOnly);
        }
        self.each(offset, buf.len(), |p, at, r| p.write_at(&buf[r], at, fua))
    }

    fn flush(&self) -> Result<(), BackendError> {
        for (_, p) in &self.pieces {
            if p.info().caps.flush != Support::None {
                p.flush()?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::{testing, MemoryBackend, ZeroBackend};

    #[test]
    fn linear_reads_across_piece_boundaries() {
        let a = Arc::new(MemoryBackend::new(1024).unwrap());
        a.write_at(&[1u8; 1024], 0, false).unwrap();
        let z: Arc<dyn Backend> = Arc::new(ZeroBackend::new(512));
        let l = LinearBackend::new(vec![a, z]).unwrap();
        assert_eq!(l.info().size_bytes, 1536);
        let mut buf = vec![9u8; 1024];
        l.read_at(&mut buf, 512).unwrap();
        assert!(buf[..512].iter().all(|&b| b == 1) && buf[512..].iter().all(|&b| b == 0));
        assert!(l.read_at(&mut buf, 1024).is_err());
    }

    /// Three memory pieces of unequal sizes (boundaries inside the suite's requests) pass
    /// the whole backend conformance suite, sequential and concurrent.
    #[test]
    fn passes_conformance() {
        let piece = |mib: u64| {
            Arc::new(MemoryBackend::new(mib * 1024 * 1024 + 12 * 1024).unwrap()) as Arc<dyn Backend>
        };
        let l = LinearBackend::new(vec![piece(1), piece(2), piece(1)]).unwrap();
        testing::conformance(&l);
        testing::conformance_concurrent(&l, 4);
    }

    #[test]
    fn no_pieces_is_an_error() {
        assert!(LinearBackend::new(Vec::new()).is_err());
    }
}
