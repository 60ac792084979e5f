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
    lock_range(bytes.as_ptr(), bytes.len())
}

/// [`lock`] of `[ptr, ptr + len)`, for memory that is not (or not yet) a valid `&[u8]` (a
/// C library's allocation before it is written). Only the address is used.
fn lock_range(ptr: *const u8, len: usize) -> bool {
    if len == 0 {
        return false;
    }
    let mut held = PAGES.lock().unwrap_or_else(PoisonError::into_inner);
    let mut fresh = Vec::new();
    for page in pages(ptr, len) {
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
    for page in pages(ptr, len) {
        *held.entry(page).or_insert(0) += 1;
    }
    true
}

/// Releases a [`lock`] of the same range; pages no other holder needs are unlocked.
pub fn unlock(bytes: &[u8]) {
    unlock_range(bytes.as_ptr(), bytes.len());
}

/// [`unlock`] of `[ptr, ptr + len)` (as [`lock_range`]).
fn unlock_range(ptr: *const u8, len: usize) {
    if len == 0 {
        return;
    }
    let mut held = PAGES.lock().unwrap_or_else(PoisonError::into_inner);
    for page in pages(ptr, len) {
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

/// Memory a C library allocated and owns (AWS-LC's `cipher_data`, where an
/// `EVP_CIPHER_CTX` keeps its key schedule), locked through the same page counts as every
/// other secret: a page it shares with another secret stays locked until both are gone.
///
/// The pages are those of the library's heap allocation, so the other allocations that
/// share them (whatever the allocator put next to it) are locked along with it: a page or
/// two per allocation, for as long as it lives, which keeps the bound of "only secrets
/// (and their page neighbours) are locked".
///
/// Not `Drop`: its owner calls [`ForeignLock::zero_and_unlock`] while the allocation is
/// still live, just before the library frees it (after the free, the pages may already
/// hold someone else's memory). Never calling it only leaves the pages locked.
pub(crate) struct ForeignLock {
    ptr: *mut u8,
    len: usize,
    locked: bool,
}

impl ForeignLock {
    /// Locks the pages of `[ptr, ptr + len)`, the range of an allocation its owner will
    /// keep at this address until [`ForeignLock::zero_and_unlock`]. Safe: locking only
    /// takes the address (nothing is read or written); the kernel refusing
    /// (`RLIMIT_MEMLOCK`) leaves it unlocked, `ForeignLock::is_locked` (a test helper) false.
    pub(crate) fn new(ptr: *mut u8, len: usize) -> Self {
        let locked = lock_range(ptr, len);
        ForeignLock { ptr, len, locked }
    }

    /// Whether the range's pages are locked in RAM.
    #[cfg(test)]
    pub(crate) fn is_locked(&self) -> bool {
        self.locked
    }

    /// The locked range, as (address, length).
    pub(crate) fn range(&self) -> (usize, usize) {
        (self.ptr as usize, self.len)
    }

    /// Zeroes the range, then releases its pages (zeroed first: a page must not reach swap
    /// while it holds the secret, as [`SecretBytes`]).
    ///
    /// # Safety
    /// The range is still allocated (not yet freed) and writable, and nothing else reads
    /// or writes it during the call.
    pub(crate) unsafe fn zero_and_unlock(self) {
        for i in 0..self.len {
            // SAFETY: the caller's contract: `ptr + i` is inside the live, writable range
            // and no one else accesses it. Byte writes through the raw pointer, volatile
            // so they are kept although the memory is freed next; they need no valid
            // Rust value there (the library may have left padding uninitialised).
            unsafe { self.ptr.add(i).write_volatile(0) };
        }
        std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
        if self.locked {
            unlock_range(self.ptr, self.len);
        }
    }
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
        // `&*inner`: the value on the heap (`&inner` would be the Box itself, a pointer on
        // this stack frame, which is what this locked until the AWS-LC AEAD's page test
        // found it).
        let locked = lock(as_bytes::<T>(&inner));
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

/// Page-level evidence for tests of memory locked through this module: the table's count
/// and the kernel's own flag for each page.
#[cfg(test)]
pub(crate) mod page_check {
    use super::{page_size, pages, PoisonError, PAGES};
    use std::collections::BTreeMap;

    /// Whether the kernel has the page holding `addr` mlocked: its frame number from
    /// `/proc/self/pagemap`, then bit 33 (`KPF_MLOCKED`) of `/proc/kpageflags`. `None`
    /// when the frame number is hidden (without `CAP_SYS_ADMIN`) or the files cannot be
    /// read; `Some(false)` for a page not in memory (a locked page always is).
    pub(crate) fn kernel_mlocked(addr: usize) -> Option<bool> {
        use std::os::unix::fs::FileExt;
        let mut e = [0u8; 8];
        std::fs::File::open("/proc/self/pagemap")
            .ok()?
            .read_exact_at(&mut e, (addr / page_size() * 8) as u64)
            .ok()?;
        let e = u64::from_le_bytes(e);
        if (e >> 63) & 1 == 0 {
            return Some(false);
        }
        let pfn = e & ((1 << 55) - 1);
        if pfn == 0 {
            return None;
        }
        let mut f = [0u8; 8];
        std::fs::File::open("/proc/kpageflags")
            .ok()?
            .read_exact_at(&mut f, pfn * 8)
            .ok()?;
        Some((u64::from_le_bytes(f) >> 33) & 1 == 1)
    }

    /// The table's holders of `page` and the kernel's flag for it, read while the table is
    /// held (so no lock or unlock of this module runs in between).
    fn state(page: usize) -> (usize, Option<bool>) {
        let held = PAGES.lock().unwrap_or_else(PoisonError::into_inner);
        (held.get(&page).copied().unwrap_or(0), kernel_mlocked(page))
    }

    /// Drops `items` in order, checking for every page of every item's locked `ranges`
    /// (address, length), before and after each drop: the kernel has the page locked
    /// exactly when the table counts a holder; the table counts at least the ranges of the
    /// items still alive; a drop takes away exactly the dropped item's ranges on it. So a
    /// page two items share stays locked after the first leaves, and every page is
    /// unlocked when its last holder leaves (unless a holder outside `items` is on it).
    /// Asserts that some page is shared by two or more items (or sharing went unshown),
    /// and notes on stderr when the kernel's flag was unreadable (not root: the counts
    /// alone were checked).
    pub(crate) fn drop_checking_pages<T>(
        mut items: Vec<T>,
        ranges: impl Fn(&T) -> Vec<(usize, usize)>,
    ) {
        // Page -> how many ranges of each item are on it.
        let per_item: Vec<BTreeMap<usize, usize>> = items
            .iter()
            .map(|it| {
                let mut m = BTreeMap::new();
                for (a, l) in ranges(it) {
                    for p in pages(a as *const u8, l) {
                        *m.entry(p).or_insert(0) += 1;
                    }
                }
                m
            })
            .collect();
        let all: BTreeMap<usize, usize> = per_item
            .iter()
            .flat_map(|m| m.keys().map(|&p| (p, 0)))
            .collect();
        let shared = all
            .keys()
            .filter(|p| per_item.iter().filter(|m| m.contains_key(p)).count() >= 2)
            .count();
        let mut kernel_seen = false;
        let mut check = |alive: &[BTreeMap<usize, usize>]| -> BTreeMap<usize, usize> {
            all.keys()
                .map(|&p| {
                    let (holders, kernel) = state(p);
                    let ours: usize = alive.iter().filter_map(|m| m.get(&p)).sum();
                    assert!(
                        holders >= ours,
                        "page {p:#x}: table counts {holders} holders, {ours} alive"
                    );
                    if let Some(k) = kernel {
                        kernel_seen = true;
                        assert_eq!(
                            k,
                            holders > 0,
                            "page {p:#x}: kernel's lock differs from {holders} holders"
                        );
                    }
                    (p, holders)
                })
                .collect()
        };
        let mut before = check(&per_item);
        for i in 0..per_item.len() {
            drop(items.remove(0));
            let after = check(&per_item[i + 1..]);
            for (p, &h) in &after {
                let gone = per_item[i].get(p).copied().unwrap_or(0);
                assert_eq!(
                    before[p].checked_sub(h),
                    Some(gone),
                    "page {p:#x}: {} holders before dropping item {i}, {h} after; it had \
                     {gone}",
                    before[p]
                );
            }
            before = after;
        }
        assert!(
            shared > 0,
            "no page held by two items: nothing shown about sharing"
        );
        if !kernel_seen {
            eprintln!("note: page frame numbers hidden (not root): checked the counts only");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh private anonymous page, so the kernel's lock count for it is not disturbed
    /// by tests running alongside; the caller frees it with [`free_page`]. It sits between
    /// two inaccessible guard pages: without them the kernel may merge it with another
    /// test's page mapped right beside it (same flags, both locked), and `/proc/self/smaps`
    /// then shows one two-page mapping (8 kB locked, or a start address that is not ours).
    fn own_page() -> *mut libc::c_void {
        let page = page_size();
        // SAFETY: a fresh private anonymous mapping of three pages; nothing else refers
        // to it.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                3 * page,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED);
        // SAFETY: the middle page of the mapping just made, made accessible; the guards
        // keep PROT_NONE, so its mapping can merge with neither neighbour.
        let mid = unsafe { map.cast::<u8>().add(page) }.cast::<libc::c_void>();
        // SAFETY: `mid` is page-aligned and inside the three-page mapping above.
        let rc = unsafe { libc::mprotect(mid, page, libc::PROT_READ | libc::PROT_WRITE) };
        assert_eq!(rc, 0);
        mid
    }

    /// Unmaps a page of [`own_page`] with its guards.
    fn free_page(mid: *mut libc::c_void) {
        let page = page_size();
        // SAFETY: `mid` came from `own_page`: one page past the start of a three-page
        // mapping of ours, which nothing uses any more.
        unsafe { libc::munmap(mid.cast::<u8>().sub(page).cast(), 3 * page) };
    }

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
        let map = own_page();
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
        // No borrow of the page is used after this.
        free_page(map);
    }

    #[test]
    fn foreign_memory_is_zeroed_before_it_is_unlocked_and_counted_with_the_rest() {
        // A page of its own, as above, standing in for a C library's allocation: two
        // 536-byte "key schedules" on it, one locked as foreign memory, one as a slice.
        let map = own_page();
        let base = map.cast::<u8>();
        // SAFETY: the first 1072 bytes of the one-page mapping, ours alone.
        unsafe { std::ptr::write_bytes(base, 0xa5, 1072) };
        let foreign = ForeignLock::new(base, 536);
        if !foreign.is_locked() {
            eprintln!("SKIP: mlock refused (RLIMIT_MEMLOCK)");
            return;
        }
        // SAFETY: bytes 536..1072 of the mapping, not aliased by `foreign`'s range.
        let other = unsafe { std::slice::from_raw_parts(base.add(536), 536) };
        assert!(lock(other));
        let addr = map as usize;
        assert_eq!(kernel_locked_kb(addr), page_size() as u64 / 1024);
        // SAFETY: the range is mapped and writable; nothing else touches it now.
        unsafe { foreign.zero_and_unlock() };
        // SAFETY: reading the mapping's first 1072 bytes, all initialised above.
        let bytes = unsafe { std::slice::from_raw_parts(base, 1072) };
        assert!(bytes[..536].iter().all(|&b| b == 0), "zeroed");
        assert!(
            bytes[536..].iter().all(|&b| b == 0xa5),
            "its neighbour untouched"
        );
        assert_eq!(
            kernel_locked_kb(addr),
            page_size() as u64 / 1024,
            "the other secret still holds the page"
        );
        unlock(other);
        assert_eq!(kernel_locked_kb(addr), 0);
        // No borrow of the page is used after this.
        free_page(map);
    }

    /// A LockedBox locks the pages of its value on the heap (not of the Box pointer on
    /// the stack, as it did) and releases them when dropped, shared pages counted.
    #[test]
    fn a_locked_box_locks_its_value_until_dropped() {
        let boxes: Vec<LockedBox<[u64; 40]>> =
            (0..16).map(|i| LockedBox::new([i as u64; 40])).collect();
        if !boxes[0].is_locked() {
            eprintln!("SKIP: mlock refused (RLIMIT_MEMLOCK)");
            return;
        }
        page_check::drop_checking_pages(boxes, |b| {
            vec![(std::ptr::from_ref::<[u64; 40]>(b) as usize, 320)]
        });
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
