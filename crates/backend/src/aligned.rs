//! Heap buffers with a chosen alignment, as `O_DIRECT` needs.
//!
//! With `O_DIRECT` the kernel DMAs straight into the caller's memory, so the buffer address
//! must be aligned like the offset and length (to the logical block size, see open(2),
//! "O_DIRECT"). A `Vec<u8>` only promises the alignment of `u8`; [`AlignedBuf`] allocates
//! with an explicit [`Layout`]. The file backend bounces misaligned caller buffers through
//! these, and tests use them to exercise the aligned fast path.

use std::alloc::Layout;
use std::ptr::NonNull;

use crate::BackendError;

/// A zero-initialised heap buffer whose address is a multiple of `align`.
pub struct AlignedBuf {
    /// The first aligned byte: where the buffer starts.
    ptr: NonNull<u8>,
    len: usize,
    /// The allocation (at `base`), which holds the buffer and, before it, fewer than
    /// `align` bytes to reach the alignment.
    base: NonNull<u8>,
    layout: Layout,
    align: usize,
}

// SAFETY: `AlignedBuf` owns its allocation exclusively (like `Box<[u8]>`); the raw pointer
// is never shared, so moving it to another thread is sound.
unsafe impl Send for AlignedBuf {}
// SAFETY: `&AlignedBuf` only gives out `&[u8]`; shared reads from several threads are sound.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len` zero bytes at an address that is a multiple of `align`.
    ///
    /// # Errors
    /// [`BackendError::Other`] if `align` is not a power of two or the size overflows.
    /// Running out of memory aborts, as for any std allocation.
    pub fn zeroed(len: usize, align: usize) -> Result<Self, BackendError> {
        // A zero-sized layout may not be passed to the allocator; allocate at least one
        // byte and remember the requested length separately.
        let err = |e: std::alloc::LayoutError| {
            BackendError::Other(format!("aligned buffer of {len} bytes at {align}: {e}"))
        };
        Layout::from_size_align(len.max(1), align).map_err(err)?;
        // Why not a layout with the alignment itself: the allocator zeroes such a block
        // with a memset in the calling thread (aligned_alloc has no zeroing twin), which
        // for a 64 MiB reencryption hotzone buffer cost about 20 ms of a 0.47 s pass.
        // calloc of the size plus the alignment gets fresh zero pages from the kernel
        // instead, faulted in by whichever thread first touches them, and the buffer
        // starts at the first aligned address inside.
        let extra = if align <= 16 { 0 } else { align };
        let layout = len
            .max(1)
            .checked_add(extra)
            .ok_or_else(|| BackendError::Other(format!("aligned buffer of {len} bytes")))
            .and_then(|n| Layout::from_size_align(n, align.min(16)).map_err(err))?;
        // SAFETY: `layout` has a non-zero size (at least 1 byte, see above).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(base) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        let off = (align - raw as usize % align) % align;
        // SAFETY: `off` < `align` <= `extra` when nonzero (0 when the allocator's own
        // alignment suffices), so `off + len` bytes lie inside the allocation.
        let ptr = unsafe { NonNull::new_unchecked(raw.add(off)) };
        Ok(Self {
            ptr,
            len,
            base,
            layout,
            align,
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The alignment the buffer was allocated with.
    pub fn align(&self) -> usize {
        self.align
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points to an allocation of at least `len` bytes, initialised by
        // `alloc_zeroed`, owned by `self` and alive for the borrow of `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` guarantees the access is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: `base` came from `alloc_zeroed` with exactly `self.layout` and is freed once.
        unsafe { std::alloc::dealloc(self.base.as_ptr(), self.layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("align", &self.align)
            .finish()
    }
}

/// True if `buf` starts at a multiple of `align` (a power of two).
pub(crate) fn is_addr_aligned(buf: &[u8], align: u64) -> bool {
    (buf.as_ptr() as usize as u64) % align == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_is_aligned_and_contents_zero() {
        for align in [512, 4096, 65536] {
            let b = AlignedBuf::zeroed(3 * 4096, align).unwrap();
            assert!(is_addr_aligned(&b, align as u64));
            assert_eq!(b.len(), 3 * 4096);
            assert!(b.iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn large_buffers_are_aligned_zero_and_whole() {
        for align in [8, 512, 4096, 1 << 20] {
            let mut b = AlignedBuf::zeroed((8 << 20) + 512, align).unwrap();
            assert!(is_addr_aligned(&b, align as u64), "{align}");
            assert_eq!(b.align(), align);
            assert!(b.iter().all(|&x| x == 0), "{align}");
            let n = b.len();
            b[0] = 1;
            b[n - 1] = 2;
            assert_eq!((b[0], b[n - 1]), (1, 2));
        }
    }

    #[test]
    fn zero_length_buffer_is_empty() {
        let b = AlignedBuf::zeroed(0, 4096).unwrap();
        assert!(b.is_empty());
        assert_eq!(&b[..], &[] as &[u8]);
    }

    #[test]
    fn rejects_alignment_not_power_of_two() {
        assert!(matches!(
            AlignedBuf::zeroed(4096, 3000),
            Err(BackendError::Other(_))
        ));
    }

    #[test]
    fn writable_through_deref_mut() {
        let mut b = AlignedBuf::zeroed(16, 64).unwrap();
        b[3] = 7;
        assert_eq!(b[3], 7);
    }
}
