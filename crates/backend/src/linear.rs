//! Ranges of backends placed end to end: device-mapper's `linear` target
//! (`drivers/md/dm-linear.c`: `START LEN linear DEV OFFSET` maps `LEN` sectors of `DEV` from
//! `OFFSET`) and a table of several targets, which is their concatenation. ucrypt serves a
//! table's `linear` targets with it ([`LinearBackend::ranges`]: a window of a device) and
//! joins a table's targets with it ([`LinearBackend::new`]: whole backends): BitLocker's
//! crypt and zero targets, several crypt targets of one device, a LUKS2 volume in the
//! middle of an encryption or decryption (crypt and linear targets).
//!
//! Flushes go to every piece that has a cache; requests are split at piece boundaries.
//! Discard and write-zeroes are not offered (pieces differ in what they support).

use crate::{
    check_range, emulate, Backend, BackendError, BackendInfo, Caps, Hints, Io, IoKind, Support,
};
use std::sync::Arc;

/// Backends placed end to end (dm's linear concatenation of a table's targets).
pub struct LinearBackend {
    /// (start byte, backend, its byte offset, length), sorted and contiguous.
    pieces: Vec<(u64, Arc<dyn Backend>, u64, u64)>,
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
    /// Concatenates `pieces` in order, each whole.
    ///
    /// # Errors
    /// [`BackendError::Other`] for no pieces.
    pub fn new(pieces: Vec<Arc<dyn Backend>>) -> Result<Self, BackendError> {
        Self::ranges(
            pieces
                .into_iter()
                .map(|p| {
                    let size = p.info().size_bytes;
                    (p, 0, size)
                })
                .collect(),
        )
    }

    /// Concatenates `(backend, offset, length)` ranges in order (bytes): each serves
    /// `length` bytes of its backend from `offset`, as a dm `linear` target serves `LEN`
    /// sectors of `DEV` from `OFFSET`.
    ///
    /// # Errors
    /// [`BackendError::Other`] for no ranges, an empty one, or one that runs past its
    /// backend's end (dm refuses such a table: the device is too small for the target).
    pub fn ranges(ranges: Vec<(Arc<dyn Backend>, u64, u64)>) -> Result<Self, BackendError> {
        if ranges.is_empty() {
            return Err(BackendError::Other(
                "a linear mapping needs at least one target".into(),
            ));
        }
        let mut at = 0u64;
        let mut placed = Vec::with_capacity(ranges.len());
        let mut logical = 512;
        let mut read_only = false;
        for (p, offset, len) in ranges {
            let i = p.info();
            if len == 0 {
                return Err(BackendError::Other(format!(
                    "a linear range at byte {at} is empty"
                )));
            }
            if offset.checked_add(len).is_none_or(|end| end > i.size_bytes) {
                return Err(BackendError::Other(format!(
                    "a linear range of {len} bytes from byte {offset} runs past the end of \
                     its {}-byte device",
                    i.size_bytes
                )));
            }
            logical = logical.max(i.logical_block);
            read_only |= i.caps.read_only;
            placed.push((at, p, offset, len));
            at = at
                .checked_add(len)
                .ok_or_else(|| BackendError::Other("linear range lengths overflow".into()))?;
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
        for (start, p, base, len) in &self.pieces {
            let pend = start + len;
            if pend <= offset || *start >= end {
                continue;
            }
            let a = offset.max(*start);
            let b = end.min(pend);
            f(
                p.as_ref(),
                base + (a - start),
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

    fn submit(&self, io: Io<'_>) -> Result<(), BackendError> {
        let (offset, fua, ctx) = (io.offset, io.fua, io.ctx);
        match io.kind {
            IoKind::Read(buf) => self.each(offset, buf.len(), |p, at, r| {
                p.submit(Io::read(&mut buf[r], at).ctx(ctx))
            }),
            IoKind::Write(buf) => {
                if self.info.caps.read_only {
                    return Err(BackendError::ReadOnly);
                }
                self.each(offset, buf.len(), |p, at, r| {
                    p.submit(Io::write(&buf[r], at).fua(fua).ctx(ctx))
                })
            }
            _ => emulate::fallback(self, io),
        }
    }

    fn flush(&self) -> Result<(), BackendError> {
        for (_, p, _, _) in &self.pieces {
            if p.info().caps.flush != Support::None {
                p.flush()?;
            }
        }
        Ok(())
    }

    fn hints(&self) -> Hints {
        Hints {
            local: self.pieces.iter().all(|(_, p, _, _)| p.hints().local),
            ..Hints::default()
        }
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

    /// Windows of devices (dm `linear` targets), one of them in the middle of a device
    /// shared with another window, pass the suite, and each byte lands where its range
    /// says: outside the windows the devices are untouched.
    #[test]
    fn ranges_pass_conformance_and_land_at_their_offsets() {
        const M: u64 = 1024 * 1024;
        let a = Arc::new(MemoryBackend::new(4 * M).unwrap());
        let b = Arc::new(MemoryBackend::new(3 * M).unwrap());
        let (ad, bd): (Arc<dyn Backend>, Arc<dyn Backend>) = (a.clone(), b.clone());
        let l = LinearBackend::ranges(vec![
            (ad.clone(), M + 4096, M + 12 * 1024),
            (bd, 512, 2 * M),
            (ad, 3 * M, M),
        ])
        .unwrap();
        assert_eq!(l.info().size_bytes, 4 * M + 12 * 1024);
        testing::conformance(&l);
        testing::conformance_concurrent(&l, 4);
        // A mark at the start of each window is at the device offset the range names.
        l.write_at(&[7u8; 512], 0, false).unwrap();
        l.write_at(&[8u8; 512], M + 12 * 1024, false).unwrap();
        l.write_at(&[9u8; 512], 3 * M + 12 * 1024, false).unwrap();
        let at = |d: &MemoryBackend, off: u64| {
            let mut buf = [0u8; 512];
            d.read_at(&mut buf, off).unwrap();
            buf
        };
        assert_eq!(at(&a, M + 4096), [7u8; 512]);
        assert_eq!(at(&b, 512), [8u8; 512]);
        assert_eq!(at(&a, 3 * M), [9u8; 512]);
        // Nothing before the first window or between the windows of `a` was written.
        let mut head = vec![1u8; (M + 4096) as usize];
        a.read_at(&mut head, 0).unwrap();
        assert!(head.iter().all(|&x| x == 0));
        let mut gap = vec![1u8; (3 * M - (2 * M + 16 * 1024)) as usize];
        a.read_at(&mut gap, 2 * M + 16 * 1024).unwrap();
        assert!(gap.iter().all(|&x| x == 0));
        let mut b0 = [1u8; 512];
        b.read_at(&mut b0, 0).unwrap();
        assert_eq!(b0, [0u8; 512]);
    }

    #[test]
    fn no_pieces_or_bad_ranges_are_errors() {
        assert!(LinearBackend::new(Vec::new()).is_err());
        let m: Arc<dyn Backend> = Arc::new(MemoryBackend::new(4096).unwrap());
        for (off, len) in [(0, 0), (512, 4096), (4096, 512), (u64::MAX, 512)] {
            let e = LinearBackend::ranges(vec![(m.clone(), off, len)]).unwrap_err();
            assert!(e.to_string().contains("linear range"), "{off} {len}: {e}");
        }
    }
}
