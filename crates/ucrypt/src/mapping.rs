//! Multi-target mappings: a device-mapper table of several lines (dm-crypt and dm-zero
//! targets side by side), as cryptsetup builds for BitLocker. Each crypt target becomes its
//! own [`ucrypt_engine::Volume`]; [`Linear`] puts them end to end like dm's table.
//!
//! ```text
//!  Target::Crypt(0 16 crypt ... 70592) ─► Volume ┐
//!  Target::Crypt(16 68760 crypt ... 16) ─► Volume ├─► Linear (one Backend, served over NBD)
//!  Target::Zero(68776 128)              ─► zeros  ┘
//! ```

use crate::open::{open_parsed, OpenOptions};
use anyhow::{bail, Result};
use std::sync::Arc;
use ucrypt_backend::{check_range, Backend, BackendError, BackendInfo, Caps, Support, ZeroBackend};
use ucrypt_format::TableLine;

/// One line of a multi-target table (positions in 512-byte sectors).
#[derive(Debug)]
pub enum Target {
    /// A dm-crypt target (its own `start` and `length`).
    Crypt(TableLine),
    /// A dm-zero target: reads zeros, writes are dropped.
    Zero {
        /// Start in the mapped device.
        start: u64,
        /// Length.
        length: u64,
    },
}

impl Target {
    /// Start in 512-byte sectors.
    pub fn start(&self) -> u64 {
        match self {
            Target::Crypt(t) => t.start,
            Target::Zero { start, .. } => *start,
        }
    }

    /// Length in 512-byte sectors.
    pub fn length(&self) -> u64 {
        match self {
            Target::Crypt(t) => t.length,
            Target::Zero { length, .. } => *length,
        }
    }

    /// The line as `dmsetup table` prints it (key hidden unless `show_keys`).
    pub fn to_line(&self, show_keys: bool) -> String {
        match self {
            Target::Crypt(t) => t.to_line(show_keys),
            Target::Zero { start, length } => format!("{start} {length} zero"),
        }
    }
}

/// Backends placed end to end (dm's linear concatenation of a table's targets).
pub struct Linear {
    /// (start byte, backend), sorted and contiguous.
    pieces: Vec<(u64, Arc<dyn Backend>)>,
    info: BackendInfo,
}

impl std::fmt::Debug for Linear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Linear")
            .field("pieces", &self.pieces.len())
            .field("size_bytes", &self.info.size_bytes)
            .finish()
    }
}

impl Linear {
    /// Concatenates `pieces` in order.
    ///
    /// # Errors
    /// No pieces.
    pub fn new(pieces: Vec<Arc<dyn Backend>>) -> Result<Self> {
        if pieces.is_empty() {
            bail!("a mapping needs at least one target");
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
        Ok(Linear {
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

impl Backend for Linear {
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

/// Opens every target of `targets` (sorted, contiguous from 0) and joins them.
///
/// # Errors
/// Gaps or overlaps between targets, and any error of opening a crypt target.
pub fn open_targets(targets: Vec<Target>, opts: OpenOptions) -> Result<Arc<dyn Backend>> {
    let mut at = 0;
    let mut pieces: Vec<Arc<dyn Backend>> = Vec::with_capacity(targets.len());
    for t in targets {
        if t.start() != at {
            bail!(
                "target \"{}\" starts at sector {}, expected {at} (targets must be contiguous)",
                t.to_line(false),
                t.start()
            );
        }
        at += t.length();
        pieces.push(match t {
            Target::Crypt(mut line) => {
                // Each target is its own volume; its place comes from the concatenation.
                line.start = 0;
                open_parsed(line, opts)?.volume
            }
            Target::Zero { length, .. } => Arc::new(ZeroBackend::new(length * 512)),
        });
    }
    Ok(Arc::new(Linear::new(pieces)?))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use ucrypt_backend::MemoryBackend;

    #[test]
    fn linear_reads_across_piece_boundaries() {
        let a = Arc::new(MemoryBackend::new(1024).unwrap());
        a.write_at(&[1u8; 1024], 0, false).unwrap();
        let z: Arc<dyn Backend> = Arc::new(ZeroBackend::new(512));
        let l = Linear::new(vec![a, z]).unwrap();
        assert_eq!(l.info().size_bytes, 1536);
        let mut buf = vec![9u8; 1024];
        l.read_at(&mut buf, 512).unwrap();
        assert!(buf[..512].iter().all(|&b| b == 1) && buf[512..].iter().all(|&b| b == 0));
        assert!(l.read_at(&mut buf, 1024).is_err());
    }
}
