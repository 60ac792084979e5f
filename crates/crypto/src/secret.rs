//! Keeping secrets out of swap: page-granular `mlock` with reference counts, and
//! [`SecretBytes`], a zeroized buffer locked in RAM.
//!
//! Why reference counts: `mlock` and `munlock` work on whole pages, and the kernel does not
//! count. Two keys that share a page (two small heap allocations usually do) would unlock
//! each other: dropping the first `munlock`s the page while the second still lives on it.
//! So every page is locked when its first holder arrives and unlocked when its last one
//! leaves ([`lock`], [`unlock`]).
//!
//! Only secrets are locked, never the whole process: ucrypt used `mlockall(MCL_FUTURE)`,
//! which also locked every page of a memory-mapped image it read (a 3 GiB image locked
//! 4.2 GB), the reason cryptsetup 2.6 stopped using `mlockall` and locks key buffers only.
//!
//! Written by hand: the `memsec`/`secrets` crates lock allocations but do not count shared
//! pages, and `region` has no reference counting either.
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock, PoisonError};
use zeroize::Zeroize;

/// Locked pages (page address → number of live holders).
static PAGES: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());

fn page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf takes a constant and has no side effects.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(p)
            .ok()
            .filter(|p| p.is_power_of_two())
            .unwrap_or(4096)
    })
}

/// The pages `[ptr, ptr + len)` touches, as page addresses.
fn pages(ptr: *const u8, len: usize) -> impl Iterator<Item = usize> {
    let page = page_size();
    let start = ptr as usize & !(page - 1);
    let end = (ptr as usize).saturating_add(len);
    (start..end).step_by(page)
}

fn mlock_page(page: usize) -> bool {
    // SAFETY: mlock only pins the page; `page` is page-aligned and part of a live
    // allocation the caller holds (it never changes memory contents).
    unsafe { libc::mlock(page as *const libc::c_void, page_size()) == 0 }
}

fn munlock_page(page: usize) {
    // SAFETY: as mlock_page; munlock of a page changes no contents.
    unsafe {
        libc::munlock(page as *const libc::c_void, page_size());
    }
}

/// Locks the pages holding `bytes` in RAM (counted: a page stays locked until every
/// holder that locked it has called [`unlock`]). Returns false, with nothing locked, when
/// the kernel refuses (`RLIMIT_MEMLOCK` reached); the secret still works, it may swap.
///
/// A caller that got `true` must call [`unlock`] with the same range exactly once, while
/// the memory is still allocated.
pub fn lock(bytes: &[u8]) -> bool {
    if bytes.is_empty() {
        return false;
    }
    let mut held = PAGES.lock().unwrap_or_else(PoisonError::into_inner);
    let mut fresh = Vec::new();
    for page in pages(bytes.as_ptr(), bytes.len()) {
        if !held.contains_key(&page) {
            if !mlock_page(page) {
                for p in fresh {
                    munlock_page(p);
                }
                return false;
            }
            fresh.push(page);
        }
    }
    for page in pages(bytes.as_ptr(), bytes.len()) {
        *held.entry(page).or_insert(0) += 1;
    }
    true
}

/// Releases a [`lock`] of the same range; pages no other holder needs are unlocked.
pub fn unlock(bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let mut held = PAGES.lock().unwrap_or_else(PoisonError::into_inner);
    for page in pages(bytes.as_ptr(), bytes.len()) {
        if let Some(n) = held.get_mut(&page) {
            *n -= 1;
            if *n == 0 {
                held.remove(&page);
                munlock_page(page);
            }
        }
    }
}

/// Locks again, in a child after `fork`, every page this table holds: memory locks are
/// not inherited (fork(2)), but the table is, and it would go on saying they are locked,
/// so a secret allocated later on one of them would not be locked either. Returns how many
/// pages the kernel refused (`RLIMIT_MEMLOCK`, as a first [`lock`] can be refused); their
/// counts stay, so the secrets on them still unlock each other correctly.
pub fn relock_after_fork() -> usize {
    let held = PAGES.lock().unwrap_or_else(PoisonError::into_inner);
    held.keys().filter(|&&p| !mlock_page(p)).count()
}

/// How many pages are locked through [`lock`] now (for tests and diagnostics).
pub fn locked_pages() -> usize {
    PAGES.lock().unwrap_or_else(PoisonError::into_inner).len()
}

/// A fixed-size secret buffer: locked in RAM while alive (where the kernel allows),
/// zeroed before it is unlocked and freed. `Debug` shows only the length.
///
/// Fixed size on purpose: a growing `Vec` leaves copies of its old contents in freed,
/// unlocked memory.
pub struct SecretBytes {
    bytes: Box<[u8]>,
    locked: bool,
}

impl SecretBytes {
    /// `len` zero bytes, locked.
    pub fn zeroed(len: usize) -> Self {
        let bytes = vec![0u8; len].into_boxed_slice();
        let locked = lock(&bytes);
        SecretBytes { bytes, locked }
    }

    /// A locked copy of `src` (the caller zeroizes its own copy).
    pub fn copy_of(src: &[u8]) -> Self {
        let mut s = Self::zeroed(src.len());
        s.bytes.copy_from_slice(src);
        s
    }

    /// Whether the bytes are locked in RAM (`mlock` succeeded).
    pub fn is_locked(&self) -> bool {
        self.locked
    }
}

impl std::ops::Deref for SecretBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl std::ops::DerefMut for SecretBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }
}

impl Drop for SecretBytes {
    fn drop(&mut self) {
        // Zero first, then unlock: the page must not reach swap while it holds the secret.
        self.bytes.zeroize();
        if self.locked {
            unlock(&self.bytes);
        }
    }
}

impl std::fmt::Debug for SecretBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretBytes(<redacted>, {} bytes)", self.bytes.len())
    }
}

/// Bytes of the calling thread's stack [`burn_stack`] overwrites below its caller's frame.
const BURN_STACK_BYTES: usize = 64 * 1024;

/// Overwrites the stack below the caller's frame with zeroes, as libgcrypt's
/// `_gcry_burn_stack` does after keying: the frames of functions that built a key schedule
/// (a cipher constructed on the stack and moved to the heap, a hash of the key) keep their
/// bytes until something else reuses that stack, which on a thread that only keys a volume
/// may be never. Call it right after such a function returns, from a frame that holds no
/// key itself.
#[inline]
pub fn burn_stack() {
    burn_stack_words::<{ BURN_STACK_BYTES / 8 }>();
}

/// Overwrites `WORDS` 8-byte words of the stack below the caller's frame with zeroes: a
/// [`burn_stack`] of another depth, for code that leaves key material in its frames on
/// every call (not only when keying) and must clean up after each use at a small cost
/// (8 KiB: a thousand stores). The caller's own frame is not touched.
#[inline(never)]
pub fn burn_stack_words<const WORDS: usize>() {
    let mut buf = [0u64; WORDS];
    // Volatile writes (8 bytes each): kept although `buf` is dead afterwards.
    zeroize::Zeroize::zeroize(&mut buf[..]);
    std::hint::black_box(&buf);
}

/// Burns `WORDS` 8-byte words of the stack below the frame that holds it
/// ([`burn_stack_words`]) when it goes out of scope, on every way out (error returns and
/// unwinding included), if told to: for ciphers whose per-call code (a library's, not
/// ours) leaves key material in its frames on every call, so that no thread that served
/// a request keeps it in its stack (a thread that lives on, or one that exited: glibc
/// keeps freed stacks for reuse) once the key is dropped.
pub(crate) struct BurnOnReturn<const WORDS: usize>(bool);

impl<const WORDS: usize> BurnOnReturn<WORDS> {
    /// A guard that burns when dropped if `on`.
    pub(crate) fn new(on: bool) -> Self {
        BurnOnReturn(on)
    }
}

impl<const WORDS: usize> Drop for BurnOnReturn<WORDS> {
    fn drop(&mut self) {
        if self.0 {
            burn_stack_words::<WORDS>();
        }
    }
}

/// A heap value locked in RAM for its lifetime (a cipher's key schedule): locked after it
/// is placed on the heap, dropped (the value zeroizes itself if it is `ZeroizeOnDrop`)
/// before its pages are unlocked.
pub struct LockedBox<T> {
    inner: std::mem::ManuallyDrop<Box<T>>,
    locked: bool,
}

impl<T> LockedBox<T> {
    /// Moves `value` to the heap and locks it.
    pub fn new(value: T) -> Self {
        let inner = Box::new(value);
        let locked = lock(as_bytes(&inner));
        LockedBox {
            inner: std::mem::ManuallyDrop::new(inner),
            locked,
        }
    }

    /// Places `blank` (a value holding no secret) on the heap, locks it, then lets `fill`
    /// write the secret in place: a secret built on the stack and moved here would leave
    /// its bytes in the stack frames it passed through, which nothing zeroes. `None` (the
    /// value dropped, so zeroized if it zeroizes itself) when `fill` says it failed.
    pub fn filled(blank: T, fill: impl FnOnce(&mut T) -> bool) -> Option<Self> {
        let mut b = Self::new(blank);
        fill(&mut **b.inner).then_some(b)
    }

    /// Whether the value's pages are locked in RAM.
    pub fn is_locked(&self) -> bool {
        self.locked
    }
}

/// The bytes a heap value occupies, as a range to lock (never read through).
fn as_bytes<T>(b: &T) -> &[u8] {
    // SAFETY: only the address and length are used (by mlock/munlock and the page
    // table); the slice is never read, so padding bytes are never observed.
    unsafe { std::slice::from_raw_parts((b as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

impl<T> std::ops::Deref for LockedBox<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T> Drop for LockedBox<T> {
    fn drop(&mut self) {
        let (addr, len) = (
            (&**self.inner as *const T).cast::<u8>(),
            std::mem::size_of::<T>(),
        );
        // Drop the value (it zeroizes itself) while its pages are still locked.
        // SAFETY: dropped exactly once, here; `inner` is not used afterwards.
        let boxed = unsafe { std::mem::ManuallyDrop::take(&mut self.inner) };
        // Keep the allocation (so the pages stay ours) while the value is dropped, then
        // unlock, then free.
        let raw = Box::into_raw(boxed);
        // SAFETY: `raw` came from Box::into_raw of a live value; it is dropped in place
        // once and its memory freed below as a MaybeUninit of the same layout.
        unsafe { std::ptr::drop_in_place(raw) };
        if self.locked && len > 0 {
            // SAFETY: the allocation is still live (not yet freed); the range is only
            // passed to munlock's page accounting.
            unlock(unsafe { std::slice::from_raw_parts(addr, len) });
        }
        // SAFETY: frees the allocation of the value dropped above without dropping again.
        drop(unsafe { Box::from_raw(raw.cast::<std::mem::MaybeUninit<T>>()) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's `Locked:` figure (kB) for the mapping that starts at `addr`.
    fn kernel_locked_kb(addr: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let head = format!("{addr:x}-");
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&head));
        lines.next().expect("mapping listed");
        lines
            .find(|l| l.starts_with("Locked:"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap()
    }

    #[test]
    fn keys_sharing_a_page_do_not_unlock_each_other() {
        // A page of its own (an anonymous mapping) so the kernel's count for it is not
        // disturbed by tests running alongside; two 64-byte secrets on it.
        // SAFETY: a fresh private anonymous mapping, unmapped at the end.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page_size(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED);
        // SAFETY: the mapping is one page, readable and writable, ours alone.
        let page = unsafe { std::slice::from_raw_parts_mut(map.cast::<u8>(), page_size()) };
        let (a, b) = page[..128].split_at_mut(64);
        if !lock(a) {
            eprintln!("SKIP: mlock refused (RLIMIT_MEMLOCK)");
            return;
        }
        assert!(lock(b));
        let addr = map as usize;
        assert_eq!(kernel_locked_kb(addr), page_size() as u64 / 1024);
        unlock(a);
        assert_eq!(
            kernel_locked_kb(addr),
            page_size() as u64 / 1024,
            "b still holds the page: it stays locked"
        );
        unlock(b);
        assert_eq!(kernel_locked_kb(addr), 0, "the last holder unlocked it");
        // SAFETY: unmapping the page mapped above; no borrow of it is used after this.
        unsafe { libc::munmap(map, page_size()) };
    }

    #[test]
    fn secret_bytes_are_locked_and_redacted() {
        let mut s = SecretBytes::zeroed(32);
        s[0] = 7;
        assert_eq!(s[0], 7);
        assert_eq!(format!("{s:?}"), "SecretBytes(<redacted>, 32 bytes)");
        let b = LockedBox::new([1u64; 8]);
        assert_eq!(b[3], 1);
        if s.is_locked() {
            assert!(b.is_locked());
        }
    }
}
