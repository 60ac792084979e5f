//! A read-only shared mapping of a regular file, so the engine can decrypt ciphertext
//! straight out of the page cache (one pass over the data) instead of `pread`ing it into a
//! buffer first (a copy, then a pass).
//!
//! The hazard of any file mapping is `SIGBUS`: if another process truncates the file, a
//! load from a page past the new end kills the process. Here such a fault is contained by
//! a handler the **program** installs ([`install_sigbus_handler`], called by the `ucrypt`
//! binary before it opens anything): a library never changes process-wide signal policy by
//! itself, and without the handler no file is mapped (every read uses `pread`); a library
//! user who wants no mappings at all simply does not install it, or calls
//! `FileBackend::use_mmap(false)`.
//!
//! The handler, for a kernel-generated fault (`si_code > 0`) of kind `BUS_ADRERR` at an
//! address inside one of our live mappings (a fixed table), maps a zero page over the
//! faulting page so the load completes, and marks the mapping poisoned: the read that
//! touched it is redone with `pread` (which reports the shrunken file as the short read it
//! is), and so is every later one. If that remap fails, the fault cannot be contained: the
//! default action is restored and the fault repeats (the process ends, as it would have
//! without the handler; it never spins). Everything else goes to the action that was
//! installed before ours, which stays installed ours for good (a foreign signal never
//! switches containment off):
//! - a real fault elsewhere: the previous handler, or the default action (terminate);
//! - a `SIGBUS` *sent* by a process (`kill -BUS`, `si_code <= 0`) is not a memory fault:
//!   the previous handler if there was one (then ours is put back if it removed itself, as
//!   Rust's runtime handler does), else it is ignored with a note on stderr.
//!
//! The mapping also keeps the process's resident size bounded: pages a read touched stay
//! mapped (and counted in RSS) until unmapped, so after every [`RELEASE_BYTES`] of reads the
//! whole mapping is dropped from the page tables (`MADV_DONTNEED`: for a shared file
//! mapping the page cache keeps the data; the next touch maps it again).
//!
//! Written by hand because no maintained crate does the containment: `memmap2` maps but
//! leaves `SIGBUS` fatal.
#![allow(unsafe_code)]

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Live mappings the handler knows about; more than this many open files simply read
/// through `pread`.
const SLOTS: usize = 64;

/// Bytes of reads (each counted as at least [`FAULT_AROUND`]) after which a mapping's
/// pages are dropped from the process's page tables, bounding its resident size.
pub(crate) const RELEASE_BYTES: usize = 32 << 20;
/// What one read may map: the kernel maps up to 16 cached pages around a fault.
const FAULT_AROUND: usize = 64 << 10;

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

/// Handler state: not installed, being installed, installed.
const NONE: u8 = 0;
const BUSY: u8 = 1;
const READY: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(NONE);
/// Serialises installation (the state machine above is read by the handler without it).
static INSTALLING: Mutex<()> = Mutex::new(());
/// The `SIGBUS` action before ours; written once, before our handler is installed, and
/// only read afterwards.
static mut PREVIOUS: std::mem::MaybeUninit<libc::sigaction> = std::mem::MaybeUninit::uninit();

/// Writes a fixed message to stderr from the handler (write(2) is async-signal-safe).
fn note(msg: &[u8]) {
    // SAFETY: write of a static buffer to fd 2; the result is deliberately ignored.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
    }
}

/// Restores the default action; the faulting instruction then repeats and the process
/// ends as it would have without any handler.
fn default_action(sig: libc::c_int) {
    // SAFETY: a zeroed sigaction with SIG_DFL is fully initialised.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut dfl.sa_mask);
        libc::sigaction(sig, &dfl, std::ptr::null_mut());
    }
}

/// Runs the action installed before ours, for a signal that is not one of our faults;
/// after a sent (not faulting) signal, puts our handler back if that action removed it
/// (Rust's own runtime handler, the usual previous action, resets `SIGBUS` to the default
/// for anything that is not a stack overflow: after one `kill -BUS` the next truncation
/// would have killed the process).
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void, fault: bool) {
    chain_previous(sig, info, ctx, fault);
    if !fault {
        // SAFETY: sigaction with a valid out-pointer, then with our own fully initialised
        // action; both async-signal-safe.
        unsafe {
            let mut now: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut now) == 0
                && now.sa_sigaction != on_sigbus as *const () as usize
            {
                libc::sigaction(sig, &our_action(), std::ptr::null_mut());
            }
        }
    }
}

/// Our `SIGBUS` action.
fn our_action() -> libc::sigaction {
    // SAFETY: a zeroed sigaction is a valid value to fill in.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = on_sigbus as *const () as usize;
    // No SA_NODEFER: a fault inside the handler itself must end the process, not recurse.
    act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
    // SAFETY: sa_mask is a valid sigset_t inside `act`.
    unsafe { libc::sigemptyset(&mut act.sa_mask) };
    act
}

fn chain_previous(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
    fault: bool,
) {
    // SAFETY: PREVIOUS was written before our handler was installed (STATE is READY only
    // after that) and is never written again.
    let prev = unsafe { (*std::ptr::addr_of!(PREVIOUS)).assume_init_ref() };
    let handler = prev.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        if fault {
            // The kernel forces a faulting SIGBUS even when ignored: end as it would.
            default_action(sig);
        } else {
            note(b"ucrypt: ignoring a SIGBUS sent by another process (not a memory fault)\n");
        }
    } else if prev.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous action was installed with SA_SIGINFO, so this is its
        // three-argument handler; called with the kernel's own arguments.
        unsafe {
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                std::mem::transmute(handler);
            f(sig, info, ctx);
        }
    } else {
        // SAFETY: a one-argument handler, as installed without SA_SIGINFO.
        unsafe {
            let f: extern "C" fn(libc::c_int) = std::mem::transmute(handler);
            f(sig);
        }
    }
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // Async-signal-safe only: atomics, mmap, sigaction, write.
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    if code <= 0 {
        // SI_USER, SI_TKILL, SI_QUEUE...: sent, not a fault; si_addr means nothing.
        chain(sig, info, ctx, false);
        return;
    }
    if code == libc::BUS_ADRERR {
        for slot in &TABLE {
            let (s, e) = (
                slot.start.load(Ordering::Acquire),
                slot.end.load(Ordering::Acquire),
            );
            if s != 0 && s <= addr && addr < e {
                slot.poisoned.store(true, Ordering::Release);
                let page_size = PAGE.load(Ordering::Relaxed);
                let page = addr & !(page_size - 1);
                // SAFETY: replaces one page inside our own live mapping with anonymous
                // zeros; nothing else owns that address range.
                let r = unsafe {
                    libc::mmap(
                        page as *mut libc::c_void,
                        page_size,
                        libc::PROT_READ,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                        -1,
                        0,
                    )
                };
                if r == page as *mut libc::c_void {
                    return;
                }
                note(b"ucrypt: cannot contain a SIGBUS in a mapped file (remap failed)\n");
                default_action(sig);
                return;
            }
        }
    }
    chain(sig, info, ctx, true);
}

/// Installs the process-wide `SIGBUS` handler that makes mapped reads of regular files
/// safe against truncation (see the [module docs](self)); until a program calls this, no
/// file is mapped. Idempotent; the action found is kept and chained to.
///
/// # Errors
/// `sigaction` failed.
pub fn install_sigbus_handler() -> std::io::Result<()> {
    let _serial = INSTALLING.lock().unwrap_or_else(|p| p.into_inner());
    if STATE.load(Ordering::Acquire) == READY {
        return Ok(());
    }
    STATE.store(BUSY, Ordering::Release);
    // SAFETY: sysconf and sigaction with fully initialised arguments. PREVIOUS is written
    // only here, under INSTALLING, while our handler is not installed (so nothing reads it).
    unsafe {
        let page = libc::sysconf(libc::_SC_PAGESIZE);
        if page > 0 {
            PAGE.store(page as usize, Ordering::Relaxed);
        }
        let mut prev: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut prev) != 0 {
            STATE.store(NONE, Ordering::Release);
            return Err(std::io::Error::last_os_error());
        }
        (*std::ptr::addr_of_mut!(PREVIOUS)).write(prev);
        if libc::sigaction(libc::SIGBUS, &our_action(), std::ptr::null_mut()) != 0 {
            STATE.store(NONE, Ordering::Release);
            return Err(std::io::Error::last_os_error());
        }
    }
    STATE.store(READY, Ordering::Release);
    Ok(())
}

/// Whether [`install_sigbus_handler`] has run (files are mapped only then).
pub fn sigbus_handler_installed() -> bool {
    STATE.load(Ordering::Acquire) == READY
}

/// A live read-only mapping of the first `len` bytes of a file.
pub(crate) struct Mapping {
    ptr: *mut u8,
    len: usize,
    slot: &'static Slot,
    /// Bytes lent since the pages were last dropped from the page tables.
    lent: AtomicUsize,
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
    /// slot, the program installed no `SIGBUS` handler, `mmap` refused).
    pub(crate) fn new(file: &std::fs::File, len: u64) -> Option<Mapping> {
        let len = usize::try_from(len).ok().filter(|&l| l > 0)?;
        if !sigbus_handler_installed() {
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
                    lent: AtomicUsize::new(0),
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
    /// The caller must ensure no write of this process changes the range while `f` runs
    /// (the engine's range locks do: readers and writers of one sector exclude each
    /// other); writers in other processes are outside any process's control, as for every
    /// shared file.
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
        // page the file lost under us is replaced by zeros by the handler, never unmapped;
        // the caller keeps this process's writers off the range while it is lent.
        let data = unsafe { std::slice::from_raw_parts(self.ptr.add(off), len) };
        f(data);
        let r = if self.poisoned() {
            Err(Truncated)
        } else {
            Ok(())
        };
        self.account(len);
        r
    }

    /// Counts a read; past [`RELEASE_BYTES`] drops every page of the mapping from the
    /// page tables so the process's resident size stays bounded. Concurrent readers are
    /// unaffected: their next load maps the page again from the page cache.
    fn account(&self, len: usize) {
        let n = len.max(FAULT_AROUND);
        let before = self.lent.fetch_add(n, Ordering::Relaxed);
        if before < RELEASE_BYTES && before + n >= RELEASE_BYTES {
            // SAFETY: advice over our own live mapping; for a shared file mapping
            // MADV_DONTNEED only unmaps pages (their contents stay in the file).
            unsafe { libc::madvise(self.ptr.cast(), self.len, libc::MADV_DONTNEED) };
            self.lent.store(0, Ordering::Relaxed);
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
        install_sigbus_handler().unwrap();
        // A SIGBUS sent by a process (here: this one) is not a fault: it is passed on
        // (the test harness has no handler, so it is ignored) and containment stays on.
        // SAFETY: raise sends a signal to this thread; our handler is installed.
        assert_eq!(unsafe { libc::raise(libc::SIGBUS) }, 0);
        assert!(sigbus_handler_installed());
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
