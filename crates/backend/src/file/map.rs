//! A read-only shared mapping of a regular file, so the engine can decrypt ciphertext
//! straight out of the page cache (one pass over the data) instead of `pread`ing it into a
//! buffer first (a copy, then a pass).
//!
//! The hazard of any file mapping is `SIGBUS`: if another process truncates the file, a
//! load from a page past the new end kills the process. Here such a fault is contained:
//! a process-wide handler looks the address up in a fixed table of live mappings; for one
//! of ours it maps a zero page over the faulting page (so the load completes) and marks
//! the mapping poisoned. The read that touched it reports an error, and every later read
//! goes through `pread`, which reports the shrunken file as the short read it is. A fault
//! anywhere else restores the previous action and returns, so it re-faults exactly as it
//! would have without us.
//!
//! Written by hand because no maintained crate does the containment: `memmap2` maps but
//! leaves `SIGBUS` fatal.
#![allow(unsafe_code)]

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Once;

/// Live mappings the handler knows about; more than this many open files simply read
/// through `pread`.
const SLOTS: usize = 64;

struct Slot {
    start: AtomicUsize,
    end: AtomicUsize,
    poisoned: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    poisoned: AtomicBool::new(false),
};
static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];
static PAGE: AtomicUsize = AtomicUsize::new(4096);
/// The `SIGBUS` action before ours, restored for faults that are not ours.
static mut PREVIOUS: std::mem::MaybeUninit<libc::sigaction> = std::mem::MaybeUninit::uninit();
static INSTALL: Once = Once::new();
static INSTALLED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // Async-signal-safe only: atomics, mmap, sigaction.
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    for slot in &TABLE {
        let (s, e) = (
            slot.start.load(Ordering::Acquire),
            slot.end.load(Ordering::Acquire),
        );
        if s != 0 && s <= addr && addr < e {
            slot.poisoned.store(true, Ordering::Release);
            let page = addr & !(PAGE.load(Ordering::Relaxed) - 1);
            // SAFETY: replaces one page inside our own live mapping with anonymous zeros;
            // nothing else owns that address range.
            unsafe {
                libc::mmap(
                    page as *mut libc::c_void,
                    PAGE.load(Ordering::Relaxed),
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                );
            }
            return;
        }
    }
    // Not ours: put the previous action back; returning re-executes the faulting load,
    // which then meets that action (by default: terminate with a core dump).
    // SAFETY: PREVIOUS was written by sigaction before this handler was installed.
    unsafe {
        libc::sigaction(
            libc::SIGBUS,
            std::ptr::addr_of!(PREVIOUS).cast(),
            std::ptr::null_mut(),
        );
    }
}

fn install() -> bool {
    INSTALL.call_once(|| {
        // SAFETY: sysconf and sigaction with fully initialised arguments; PREVIOUS is
        // written here once, before the handler that reads it can run.
        unsafe {
            let page = libc::sysconf(libc::_SC_PAGESIZE);
            if page > 0 {
                PAGE.store(page as usize, Ordering::Relaxed);
            }
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_sigbus as *const () as usize;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
            libc::sigemptyset(&mut act.sa_mask);
            let ok =
                libc::sigaction(libc::SIGBUS, &act, std::ptr::addr_of_mut!(PREVIOUS).cast()) == 0;
            INSTALLED.store(ok, Ordering::Release);
        }
    });
    INSTALLED.load(Ordering::Acquire)
}

/// A live read-only mapping of the first `len` bytes of a file.
pub(crate) struct Mapping {
    ptr: *mut u8,
    len: usize,
    slot: &'static Slot,
}

// SAFETY: the mapping is read-only memory shared by all threads; nothing in it is tied to
// the creating thread.
unsafe impl Send for Mapping {}
// SAFETY: as above; readers only load from it.
unsafe impl Sync for Mapping {}

/// A read that met a truncated file (the mapping is poisoned from now on).
#[derive(Debug)]
pub(crate) struct Truncated;

impl Mapping {
    /// Maps `len` bytes of `file` read-only, or `None` when it cannot (empty, no free
    /// slot, the handler could not be installed, `mmap` refused).
    pub(crate) fn new(file: &std::fs::File, len: u64) -> Option<Mapping> {
        let len = usize::try_from(len).ok().filter(|&l| l > 0)?;
        if !install() {
            return None;
        }
        // SAFETY: a fresh shared read-only mapping of an open file; the kernel picks the
        // address.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        let start = ptr as usize;
        for slot in &TABLE {
            if slot
                .start
                .compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                // Claimed (start = MAX matches no address yet); publish the range.
                slot.poisoned.store(false, Ordering::Relaxed);
                slot.end.store(start + len, Ordering::Release);
                slot.start.store(start, Ordering::Release);
                return Some(Mapping {
                    ptr: ptr.cast(),
                    len,
                    slot,
                });
            }
        }
        // SAFETY: unmapping what was just mapped, never handed out.
        unsafe { libc::munmap(ptr, len) };
        None
    }

    /// Whether a fault has hit this mapping (reads should use `pread` instead).
    pub(crate) fn poisoned(&self) -> bool {
        self.slot.poisoned.load(Ordering::Acquire)
    }

    /// Lends `[offset, offset + len)` to `f`, then reports whether every page was really
    /// there. On `Err` what `f` saw may contain zeros in place of lost data.
    ///
    /// # Panics
    /// If the range lies outside the mapping: a caller bug (ranges are checked first).
    pub(crate) fn read(
        &self,
        offset: u64,
        len: usize,
        f: &mut dyn FnMut(&[u8]),
    ) -> Result<(), Truncated> {
        let off = usize::try_from(offset).expect("BUG: mapped read offset");
        assert!(
            off <= self.len && len <= self.len - off,
            "BUG: mapped read out of range"
        );
        // SAFETY: in range (checked above), mapped readable for the mapping's life; a
        // page the file lost under us is replaced by zeros by the handler, never unmapped.
        let data = unsafe { std::slice::from_raw_parts(self.ptr.add(off), len) };
        f(data);
        if self.poisoned() {
            Err(Truncated)
        } else {
            Ok(())
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        self.slot.start.store(usize::MAX, Ordering::Release);
        self.slot.end.store(0, Ordering::Release);
        // SAFETY: our mapping, unmapped once; no borrow of it outlives `read`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
        self.slot.start.store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn reads_the_file_and_survives_its_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
        std::fs::File::create(&path)
            .unwrap()
            .write_all(&data)
            .unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let map = Mapping::new(&file, data.len() as u64).expect("maps");
        let mut seen = Vec::new();
        map.read(4096, 8192, &mut |b| seen.extend_from_slice(b))
            .unwrap();
        assert_eq!(seen, data[4096..12288]);
        // Another writer shrinks the file: a read past the new end must not kill us.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(8192)
            .unwrap();
        let mut sum = 0u64;
        let r = map.read(32768, 8192, &mut |b| {
            sum = b.iter().map(|&x| u64::from(x)).sum();
        });
        assert!(
            r.is_err(),
            "the read past the new end reports the truncation"
        );
        assert_eq!(sum, 0, "lost pages read as zeros");
        assert!(map.poisoned());
    }
}
