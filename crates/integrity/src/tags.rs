//! Byte-granular reads and writes of the tag areas over a backend that wants aligned I/O:
//! tags are a few bytes each at any offset, the backend (O_DIRECT) takes whole logical
//! blocks. Writes are staged per aligned unit and written back together.

use std::collections::BTreeMap;
use ucrypt_backend::{AlignedBuf, Backend, BackendError, WriteOp};

/// Dirty aligned units of the tag areas, written back by [`TagCache::write_back`].
pub(crate) struct TagCache<'a> {
    inner: &'a dyn Backend,
    align: u64,
    units: BTreeMap<u64, Vec<u8>>,
}

impl<'a> TagCache<'a> {
    pub(crate) fn new(inner: &'a dyn Backend, align: u64) -> TagCache<'a> {
        TagCache {
            inner,
            align,
            units: BTreeMap::new(),
        }
    }

    /// Stages `bytes` at device byte `at`. A unit not staged yet is read first unless
    /// `bytes` covers all of it.
    pub(crate) fn put(&mut self, at: u64, bytes: &[u8]) -> Result<(), BackendError> {
        let mut done = 0usize;
        while done < bytes.len() {
            let pos = at + done as u64;
            let unit = pos - pos % self.align;
            let within = (pos - unit) as usize;
            let n = (self.align as usize - within).min(bytes.len() - done);
            let buf = match self.units.entry(unit) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => {
                    let mut b = vec![0u8; self.align as usize];
                    if n < self.align as usize {
                        self.inner.read_at(&mut b, unit)?;
                    }
                    e.insert(b)
                }
            };
            buf[within..within + n].copy_from_slice(&bytes[done..done + n]);
            done += n;
        }
        Ok(())
    }

    /// Writes the staged units, adjacent ones together, all in one batch (one buffer
    /// aligned for `O_DIRECT`).
    pub(crate) fn write_back(self) -> Result<(), BackendError> {
        if self.units.len() <= 1 {
            // One unit (a write in mode D or B): written as it is, nothing to batch.
            for (unit, bytes) in &self.units {
                self.inner.write_at(bytes, *unit, false)?;
            }
            return Ok(());
        }
        let a = self.align as usize;
        let mut buf = AlignedBuf::zeroed(self.units.len() * a, a)?;
        // (device offset, start in `buf`, length) of each run of adjacent units.
        let mut spans: Vec<(u64, usize, usize)> = Vec::new();
        for (k, (unit, bytes)) in self.units.iter().enumerate() {
            buf[k * a..(k + 1) * a].copy_from_slice(bytes);
            match spans.last_mut() {
                Some(s) if s.0 + s.2 as u64 == *unit => s.2 += a,
                _ => spans.push((*unit, k * a, a)),
            }
        }
        let ops: Vec<WriteOp<'_>> = spans
            .iter()
            .map(|&(offset, from, len)| WriteOp {
                offset,
                buf: &buf[from..from + len],
                fua: false,
            })
            .collect();
        self.inner.submit_writes(&ops)
    }
}

/// Reads `out.len()` bytes at device byte `at` with aligned I/O.
pub(crate) fn read_unaligned(
    inner: &dyn Backend,
    align: u64,
    at: u64,
    out: &mut [u8],
) -> Result<(), BackendError> {
    let start = at - at % align;
    let end = (at + out.len() as u64).div_ceil(align) * align;
    if start == at && end == at + out.len() as u64 {
        return inner.read_at(out, at);
    }
    let mut buf = vec![0u8; (end - start) as usize];
    inner.read_at(&mut buf, start)?;
    let from = (at - start) as usize;
    out.copy_from_slice(&buf[from..from + out.len()]);
    Ok(())
}
