//! A sparse ramdisk, like the kernel's brd (`drivers/block/brd.c`).
//!
//! brd keeps one page per written sector range in an xarray and reads holes as zeros. Here
//! storage comes in fixed 64 KiB chunks, allocated on the first write that touches them;
//! unwritten chunks read as zeros. Discard and write-zeroes free every chunk they cover
//! whole and zero the covered part of the others, so both are [`Support::Native`], as in
//! brd (`brd_do_discard`).
//!
//! ```text
//!   groups: [ OnceLock ─► [ RwLock<Option<chunk>> × 4096 ] ]   one group = 256 MiB
//!                 │                   │
//!          created on first     allocated on first write,
//!          write in the group   freed by discard / write-zeroes
//! ```
//!
//! Flush is [`Support::None`]: like brd, there is no volatile cache, so a write is as
//! durable as this device gets when it returns. `flush()` still succeeds (a no-op) for
//! callers that flush anyway.
//!
//! This stands in for the ramdisk in the Cloudflare benchmark (4 KiB I/O at high rates
//! from many threads), so the hot path is one atomic load, one uncontended lock, and one
//! copy.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{OnceLock, PoisonError, RwLock};

use crate::{
    check_range, emulate, Backend, BackendError, BackendInfo, Caps, Hints, Io, IoKind, Support,
};

/// Bytes per chunk: the allocation unit. 64 KiB keeps the per-chunk lock and pointer
/// overhead (~32 bytes) under 0.1%, while a 4 KiB request still copies only its own bytes.
pub const CHUNK_BYTES: u64 = 64 * 1024;
/// Chunks per group (256 MiB of address space per group).
const GROUP_CHUNKS: usize = 4096;
const GROUP_BYTES: u64 = CHUNK_BYTES * GROUP_CHUNKS as u64;
/// The largest size accepted: 1 PiB costs a 64 MiB group table up front.
pub const MAX_SIZE_BYTES: u64 = 1 << 50;

/// One chunk: `None` until first written.
///
/// Why one `RwLock` per chunk rather than one lock for the device: concurrent requests to
/// different chunks never touch the same lock, and readers of one chunk share it. A 4 KiB
/// request takes one lock (two if it straddles a chunk boundary), held only for its
/// memcpy. A request spanning chunks takes their locks one after another, never two at
/// once, so no lock order exists to get wrong. As on a real disk, a read racing a write
/// may see the write applied to some chunks and not others, never a torn chunk.
type Chunk = RwLock<Option<Box<[u8]>>>;

/// A group of chunks, created on the first write inside its 256 MiB.
///
/// Why `OnceLock`: after creation finding a group is one atomic load, with no lock at all;
/// two first writers racing to create it agree on one winner.
type Group = OnceLock<Box<[Chunk]>>;

/// A sparse ramdisk. See the [module docs](self).
pub struct MemoryBackend {
    info: BackendInfo,
    groups: Box<[Group]>,
    /// Chunks currently allocated (for [`MemoryBackend::allocated_bytes`]).
    allocated_chunks: AtomicU64,
}

impl std::fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("size_bytes", &self.info.size_bytes)
            .field("allocated_bytes", &self.allocated_bytes())
            .finish()
    }
}

/// One piece of a request that falls inside one chunk.
struct Span {
    /// Chunk number from the start of the device.
    chunk: u64,
    /// Offset inside the chunk.
    at: usize,
    /// Length of the piece.
    len: usize,
    /// Offset of the piece inside the request.
    pos: usize,
}

/// Splits `[offset, offset + len)` at chunk boundaries.
fn spans(offset: u64, len: u64) -> impl Iterator<Item = Span> {
    let end = offset + len;
    let mut cur = offset;
    std::iter::from_fn(move || {
        if cur >= end {
            return None;
        }
        let chunk = cur / CHUNK_BYTES;
        let at = cur % CHUNK_BYTES;
        let n = (CHUNK_BYTES - at).min(end - cur);
        let span = Span {
            chunk,
            at: at as usize,
            len: n as usize,
            pos: (cur - offset) as usize,
        };
        cur += n;
        Some(span)
    })
}

impl MemoryBackend {
    /// A ramdisk of `size_bytes`, all zeros, using no memory until written.
    ///
    /// # Errors
    /// [`BackendError::Other`] if `size_bytes` exceeds [`MAX_SIZE_BYTES`].
    pub fn new(size_bytes: u64) -> Result<Self, BackendError> {
        if size_bytes > MAX_SIZE_BYTES {
            return Err(BackendError::Other(format!(
                "memory backend of {size_bytes} bytes is larger than the maximum \
                 {MAX_SIZE_BYTES} bytes"
            )));
        }
        let groups = size_bytes.div_ceil(GROUP_BYTES) as usize;
        Ok(Self {
            info: BackendInfo {
                size_bytes,
                logical_block: 512,
                // brd states PAGE_SIZE as its physical block.
                physical_block: 4096,
                optimal_block: 4096,
                caps: Caps {
                    flush: Support::None,
                    discard: Support::Native,
                    write_zeroes: Support::Native,
                    read_only: false,
                },
            },
            groups: (0..groups).map(|_| OnceLock::new()).collect(),
            allocated_chunks: AtomicU64::new(0),
        })
    }

    /// Memory held by written chunks, in bytes (excludes the small per-group tables).
    pub fn allocated_bytes(&self) -> u64 {
        self.allocated_chunks.load(Ordering::Relaxed) * CHUNK_BYTES
    }

    /// The chunk slot for chunk number `chunk`, if its group exists.
    fn chunk(&self, chunk: u64) -> Option<&Chunk> {
        let g = self.groups.get((chunk / GROUP_CHUNKS as u64) as usize)?;
        g.get()?.get((chunk % GROUP_CHUNKS as u64) as usize)
    }

    /// The chunk slot for chunk number `chunk`, creating its group if needed.
    fn chunk_or_create(&self, chunk: u64) -> Option<&Chunk> {
        let g = self.groups.get((chunk / GROUP_CHUNKS as u64) as usize)?;
        let chunks = g.get_or_init(|| (0..GROUP_CHUNKS).map(|_| RwLock::new(None)).collect());
        chunks.get((chunk % GROUP_CHUNKS as u64) as usize)
    }

    /// Frees the chunks `[offset, offset + len)` covers whole and zeroes the covered part
    /// of the others (discard and write-zeroes alike).
    fn zero_range(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        check_range(offset, len, self.info.size_bytes)?;
        for s in spans(offset, len) {
            let Some(slot) = self.chunk(s.chunk) else {
                continue; // the whole group is unwritten
            };
            // Why the write lock: it excludes readers mid-copy and a concurrent writer
            // allocating or filling this chunk.
            let mut data = slot.write().unwrap_or_else(PoisonError::into_inner);
            if s.len as u64 == CHUNK_BYTES {
                if data.take().is_some() {
                    self.allocated_chunks.fetch_sub(1, Ordering::Relaxed);
                }
            } else if let Some(d) = data.as_mut() {
                d[s.at..s.at + s.len].fill(0);
            }
        }
        Ok(())
    }
}

impl MemoryBackend {
    fn read(&self, buf: &mut [u8], offset: u64) -> Result<(), BackendError> {
        check_range(offset, buf.len() as u64, self.info.size_bytes)?;
        for s in spans(offset, buf.len() as u64) {
            let out = &mut buf[s.pos..s.pos + s.len];
            match self.chunk(s.chunk) {
                None => out.fill(0),
                Some(slot) => {
                    // Why a read lock: readers of one chunk proceed together; only a
                    // writer of the same chunk waits, for one memcpy.
                    let data = slot.read().unwrap_or_else(PoisonError::into_inner);
                    match data.as_deref() {
                        Some(d) => out.copy_from_slice(&d[s.at..s.at + s.len]),
                        None => out.fill(0),
                    }
                }
            }
        }
        Ok(())
    }

    fn write(&self, buf: &[u8], offset: u64) -> Result<(), BackendError> {
        check_range(offset, buf.len() as u64, self.info.size_bytes)?;
        for s in spans(offset, buf.len() as u64) {
            let Some(slot) = self.chunk_or_create(s.chunk) else {
                // Unreachable after check_range; refuse rather than panic.
                return Err(BackendError::OutOfRange {
                    offset,
                    len: buf.len() as u64,
                    size: self.info.size_bytes,
                });
            };
            // Why the write lock: allocation on first write and the copy must not
            // interleave with another writer or a reader of this chunk.
            let mut data = slot.write().unwrap_or_else(PoisonError::into_inner);
            let d = data.get_or_insert_with(|| {
                self.allocated_chunks.fetch_add(1, Ordering::Relaxed);
                vec![0u8; CHUNK_BYTES as usize].into_boxed_slice()
            });
            d[s.at..s.at + s.len].copy_from_slice(&buf[s.pos..s.pos + s.len]);
        }
        Ok(())
    }

    fn modify(
        &self,
        offset: u64,
        len: usize,
        f: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), BackendError> {
        check_range(offset, len as u64, self.info.size_bytes)?;
        if len == 0 {
            return Ok(());
        }
        let chunk = offset / CHUNK_BYTES;
        if (offset + len as u64 - 1) / CHUNK_BYTES != chunk {
            return Err(BackendError::Unsupported(
                "atomic read-modify-write across a 64 KiB chunk of the memory backend",
            ));
        }
        let Some(slot) = self.chunk_or_create(chunk) else {
            return Err(BackendError::OutOfRange {
                offset,
                len: len as u64,
                size: self.info.size_bytes,
            });
        };
        let mut data = slot.write().unwrap_or_else(PoisonError::into_inner);
        let d = data.get_or_insert_with(|| {
            self.allocated_chunks.fetch_add(1, Ordering::Relaxed);
            vec![0u8; CHUNK_BYTES as usize].into_boxed_slice()
        });
        let at = (offset % CHUNK_BYTES) as usize;
        f(&mut d[at..at + len]);
        Ok(())
    }
}

impl Backend for MemoryBackend {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    /// Discards and write-zeroes drop chunks; FUA means nothing (no cache).
    fn submit(&self, io: Io<'_>) -> Result<(), BackendError> {
        match io.kind {
            IoKind::Read(buf) => self.read(buf, io.offset),
            IoKind::Write(buf) => self.write(buf, io.offset),
            IoKind::WriteOwned(buf) => self.write(buf, io.offset),
            IoKind::Discard(len) | IoKind::WriteZeroes(len) => self.zero_range(io.offset, len),
            IoKind::Modify { len, f } => self.modify(io.offset, len, f),
            _ => emulate::fallback(self, io),
        }
    }

    /// A no-op: there is no cache to write back (caps say [`Support::None`]).
    fn flush(&self) -> Result<(), BackendError> {
        Ok(())
    }

    /// Memory: every request is a copy. Each chunk is one `RwLock`: every I/O holds the
    /// locks of the chunks it touches while it copies, so I/Os are atomic per chunk.
    fn hints(&self) -> Hints {
        Hints {
            local: true,
            atomic_unit: Some(CHUNK_BYTES),
            async_submit: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    #[test]
    fn passes_conformance() {
        let m = MemoryBackend::new(8 << 20).unwrap();
        testing::conformance(&m);
    }

    #[test]
    fn passes_conformance_with_size_not_multiple_of_chunk() {
        let m = MemoryBackend::new((1 << 20) + 3 * 512).unwrap();
        testing::conformance(&m);
    }

    #[test]
    fn unwritten_space_reads_zero_and_allocates_nothing() {
        let m = MemoryBackend::new(1 << 30).unwrap();
        let mut buf = vec![0xffu8; 8192];
        m.read_at(&mut buf, 12345).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        assert_eq!(m.allocated_bytes(), 0);
    }

    #[test]
    fn write_allocates_only_touched_chunks() {
        let m = MemoryBackend::new(1 << 30).unwrap();
        m.write_at(&[1u8; 4096], 3 * CHUNK_BYTES, false).unwrap();
        assert_eq!(m.allocated_bytes(), CHUNK_BYTES);
        // Straddling a boundary touches two chunks.
        m.write_at(&[2u8; 4096], 10 * CHUNK_BYTES - 2048, false)
            .unwrap();
        assert_eq!(m.allocated_bytes(), 3 * CHUNK_BYTES);
    }

    #[test]
    fn discard_frees_whole_chunks_and_zeroes_partial_ones() {
        let m = MemoryBackend::new(1 << 20).unwrap();
        m.write_at(&vec![7u8; 4 * CHUNK_BYTES as usize], 0, false)
            .unwrap();
        assert_eq!(m.allocated_bytes(), 4 * CHUNK_BYTES);
        // Half of chunk 0, all of chunks 1 and 2, nothing of chunk 3.
        m.discard(CHUNK_BYTES / 2, 2 * CHUNK_BYTES + CHUNK_BYTES / 2)
            .unwrap();
        assert_eq!(m.allocated_bytes(), 2 * CHUNK_BYTES);
        let mut buf = vec![0u8; 4 * CHUNK_BYTES as usize];
        m.read_at(&mut buf, 0).unwrap();
        let half = CHUNK_BYTES as usize / 2;
        assert!(buf[..half].iter().all(|&b| b == 7));
        assert!(buf[half..3 * 2 * half].iter().all(|&b| b == 0));
        assert!(buf[3 * 2 * half..].iter().all(|&b| b == 7));
    }

    #[test]
    fn write_zeroes_frees_whole_chunks() {
        let m = MemoryBackend::new(1 << 20).unwrap();
        m.write_at(&vec![7u8; 2 * CHUNK_BYTES as usize], 0, false)
            .unwrap();
        m.write_zeroes(0, 2 * CHUNK_BYTES, true).unwrap();
        assert_eq!(m.allocated_bytes(), 0);
    }

    #[test]
    fn modify_at_changes_one_chunk_in_place_and_refuses_to_cross_one() {
        let m = MemoryBackend::new(1 << 20).unwrap();
        assert_eq!(m.hints().atomic_unit, Some(CHUNK_BYTES));
        // An unwritten chunk reads as zeros inside the closure too.
        m.modify_at(CHUNK_BYTES + 512, 512, false, &mut |b| {
            assert!(b.iter().all(|&x| x == 0));
            b.fill(9);
        })
        .unwrap();
        let mut back = vec![0u8; 2048];
        m.read_at(&mut back, CHUNK_BYTES).unwrap();
        assert!(back[..512].iter().all(|&x| x == 0));
        assert!(back[512..1024].iter().all(|&x| x == 9));
        assert!(back[1024..].iter().all(|&x| x == 0));
        let mut called = false;
        let crossing = m.modify_at(CHUNK_BYTES - 256, 512, false, &mut |_| called = true);
        assert!(matches!(crossing, Err(BackendError::Unsupported(_))));
        assert!(!called, "nothing is modified across chunks");
        assert!(matches!(
            m.modify_at((1 << 20) - 256, 512, false, &mut |_| {}),
            Err(BackendError::OutOfRange { .. })
        ));
    }

    #[test]
    fn rejects_size_above_maximum() {
        assert!(MemoryBackend::new(MAX_SIZE_BYTES + 1).is_err());
        assert!(MemoryBackend::new(u64::MAX).is_err());
    }

    #[test]
    fn zero_sized_device_accepts_only_empty_requests() {
        let m = MemoryBackend::new(0).unwrap();
        m.read_at(&mut [], 0).unwrap();
        m.write_at(&[], 0, false).unwrap();
        assert!(matches!(
            m.write_at(&[0u8; 512], 0, false),
            Err(BackendError::OutOfRange { .. })
        ));
    }

    #[test]
    fn reports_brd_like_caps() {
        let m = MemoryBackend::new(1 << 20).unwrap();
        let caps = m.info().caps;
        assert_eq!(caps.flush, Support::None);
        assert_eq!(caps.discard, Support::Native);
        assert_eq!(caps.write_zeroes, Support::Native);
        assert!(!caps.read_only);
        m.flush().unwrap();
    }
}
