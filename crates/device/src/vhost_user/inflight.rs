//! Inflight I/O tracking (vhost-user `VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD`, QEMU's
//! docs/interop/vhost-user.rst, "Inflight I/O tracking", split virtqueues): a shared memory
//! region in which the back end marks each request it has taken from a queue and clears the
//! mark once the request is in the used ring. The region is a memfd the back end makes when
//! the VM asks (`GET_INFLIGHT_FD`); the VM keeps it and hands it to the next back end
//! (`SET_INFLIGHT_FD`) after the first one died, which then resubmits the marked requests,
//! oldest first, before anything new.
//!
//! Hand-written because `vhost-user-backend` (0.24, the newest release) refuses both
//! messages and offers no hook for them; the relay (`relay.rs`) answers them instead.
//!
//! Layout of one queue's part (the specification's `QueueRegionSplit`, little-endian, as
//! QEMU's libvhost-user writes it): `features: u64, version: u16, desc_num: u16,
//! last_batch_head: u16, used_idx: u16`, then `desc_num` entries of
//! `inflight: u8, padding: [u8; 5], next: u16, counter: u64`. Queues follow each other, each
//! rounded up to 64 bytes.
//!
//! Every field is accessed through atomics: the process may die between any two stores,
//! and the next back end must find them in program order.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{fence, AtomicU16, AtomicU64, AtomicU8, Ordering};

const HEADER: usize = 16;
const ENTRY: usize = 16;
const ALIGN: usize = 64;
/// The region's format version this code writes and reads.
const VERSION: u16 = 1;

/// Bytes of one queue's part for queues of `queue_size` descriptors.
pub(super) fn queue_bytes(queue_size: u16) -> usize {
    (HEADER + ENTRY * usize::from(queue_size)).div_ceil(ALIGN) * ALIGN
}

/// A mapped inflight region.
pub(super) struct Region {
    ptr: *mut u8,
    len: usize,
    queues: u16,
    queue_size: u16,
}

// SAFETY: the mapping is plain shared memory, only ever accessed through atomics.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("len", &self.len)
            .field("queues", &self.queues)
            .field("queue_size", &self.queue_size)
            .finish()
    }
}

impl Region {
    /// A new zeroed region in a memfd for `queues` queues of `queue_size`: the file to hand
    /// to the VM and the region mapped.
    pub(super) fn create(queues: u16, queue_size: u16) -> io::Result<(File, Region)> {
        if queues == 0 || queue_size == 0 {
            return Err(io::Error::other("an inflight region of no queue"));
        }
        let len = usize::from(queues) * queue_bytes(queue_size);
        // SAFETY: a NUL-terminated name and valid flags; the result is checked.
        let fd =
            unsafe { libc::memfd_create(c"ucrypt-vhost-inflight".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(len as u64)?;
        let region = Region::map(&file, len, 0, queues, queue_size)?;
        for q in 0..queues {
            region
                .u16_at(region.base(q) + 10)
                .store(queue_size, Ordering::Relaxed);
        }
        Ok((file, region))
    }

    /// Maps the region the VM handed back (`SET_INFLIGHT_FD`).
    pub(super) fn map(
        file: &File,
        len: usize,
        offset: u64,
        queues: u16,
        queue_size: u16,
    ) -> io::Result<Region> {
        if queues == 0 || queue_size == 0 || len < usize::from(queues) * queue_bytes(queue_size) {
            return Err(io::Error::other(format!(
                "an inflight region of {len} bytes cannot hold {queues} queues of {queue_size}"
            )));
        }
        let offset = libc::off_t::try_from(offset).map_err(io::Error::other)?;
        // SAFETY: a new shared mapping of `len` bytes of the file; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Region {
            ptr: ptr.cast(),
            len,
            queues,
            queue_size,
        })
    }

    fn base(&self, q: u16) -> usize {
        usize::from(q) * queue_bytes(self.queue_size)
    }

    fn u8_at(&self, at: usize) -> &AtomicU8 {
        assert!(at < self.len);
        // SAFETY: inside the mapping (checked), which lives as long as `self`.
        unsafe { AtomicU8::from_ptr(self.ptr.add(at)) }
    }

    fn u16_at(&self, at: usize) -> &AtomicU16 {
        assert!(at + 2 <= self.len && at % 2 == 0);
        // SAFETY: inside the mapping and aligned (checked; the mapping is page-aligned).
        unsafe { AtomicU16::from_ptr(self.ptr.add(at).cast()) }
    }

    fn u64_at(&self, at: usize) -> &AtomicU64 {
        assert!(at + 8 <= self.len && at % 8 == 0);
        // SAFETY: as in `u16_at`.
        unsafe { AtomicU64::from_ptr(self.ptr.add(at).cast()) }
    }

    fn entry(&self, q: u16, head: u16) -> usize {
        self.base(q) + HEADER + ENTRY * usize::from(head)
    }

    /// Whether queue `q` and descriptor `head` are inside the region.
    fn holds(&self, q: u16, head: u16) -> bool {
        q < self.queues && head < self.queue_size
    }

    /// Request `head` of queue `q` taken from the available ring, the `counter`th taken.
    pub(super) fn begin(&self, q: u16, head: u16, counter: u64) {
        if !self.holds(q, head) {
            return;
        }
        let e = self.entry(q, head);
        self.u64_at(e + 8).store(counter.to_le(), Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.u8_at(e).store(1, Ordering::SeqCst);
    }

    /// Request `head` of queue `q` about to go into the used ring (call before it does).
    pub(super) fn completing(&self, q: u16, head: u16) {
        if !self.holds(q, head) {
            return;
        }
        self.u16_at(self.base(q) + 12)
            .store(head.to_le(), Ordering::SeqCst);
    }

    /// Request `head` of queue `q` is in the used ring, whose index is now `used_idx`.
    pub(super) fn completed(&self, q: u16, head: u16, used_idx: u16) {
        if !self.holds(q, head) {
            return;
        }
        self.u8_at(self.entry(q, head)).store(0, Ordering::SeqCst);
        self.u16_at(self.base(q) + 14)
            .store(used_idx.to_le(), Ordering::SeqCst);
    }

    /// A new back end's first look at queue `q`, whose used ring's index is `ring_used`:
    /// the requests a dead back end had taken and not completed, oldest first, and the
    /// counter to go on from. A region never used is marked as this version's.
    pub(super) fn resubmissions(&self, q: u16, ring_used: u16) -> (Vec<u16>, u64) {
        if q >= self.queues {
            return (Vec::new(), 0);
        }
        let base = self.base(q);
        if u16::from_le(self.u16_at(base + 8).load(Ordering::SeqCst)) == 0 {
            self.u16_at(base + 8)
                .store(VERSION.to_le(), Ordering::SeqCst);
            return (Vec::new(), 0);
        }
        let used_at = self.u16_at(base + 14);
        if u16::from_le(used_at.load(Ordering::SeqCst)) != ring_used {
            // Died between putting the last request in the used ring and clearing its
            // mark: it is done.
            let last = u16::from_le(self.u16_at(base + 12).load(Ordering::SeqCst));
            if last < self.queue_size {
                self.u8_at(self.entry(q, last)).store(0, Ordering::SeqCst);
            }
            used_at.store(ring_used.to_le(), Ordering::SeqCst);
        }
        let mut marked: Vec<(u64, u16)> = (0..self.queue_size)
            .filter(|&h| self.u8_at(self.entry(q, h)).load(Ordering::SeqCst) == 1)
            .map(|h| {
                let c = u64::from_le(self.u64_at(self.entry(q, h) + 8).load(Ordering::SeqCst));
                (c, h)
            })
            .collect();
        marked.sort_unstable();
        let next = marked.last().map_or(0, |&(c, _)| c.wrapping_add(1));
        (marked.into_iter().map(|(_, h)| h).collect(), next)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_second_mapping_finds_what_the_first_left_in_flight_oldest_first() {
        let (file, first) = Region::create(2, 8).unwrap();
        assert_eq!(queue_bytes(8), 192);
        assert_eq!(first.resubmissions(1, 0), (Vec::new(), 0), "fresh: nothing");
        // Queue 1: heads 5, 2, 7 taken in that order; 2 completed; 7 went into the used
        // ring (index 1 -> 2) but the process died before clearing its mark.
        first.begin(1, 5, 0);
        first.begin(1, 2, 1);
        first.begin(1, 7, 2);
        first.completing(1, 2);
        first.completed(1, 2, 1);
        first.completing(1, 7);
        drop(first);
        let len = usize::try_from(file.metadata().unwrap().len()).unwrap();
        let second = Region::map(&file, len, 0, 2, 8).unwrap();
        assert_eq!(second.resubmissions(1, 2), (vec![5], 1));
        assert_eq!(second.resubmissions(0, 0), (Vec::new(), 0));
        // The spec's layout: head 5's mark at its entry, desc_num in the header.
        let raw = std::fs::read(format!("/proc/self/fd/{}", file.as_raw_fd())).unwrap();
        assert_eq!(raw[192 + 16 + 5 * 16], 1);
        assert_eq!(u16::from_le_bytes([raw[192 + 10], raw[192 + 11]]), 8);
        assert!(Region::map(&file, len, 0, 3, 8).is_err(), "too small");
    }
}
