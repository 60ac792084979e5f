//! AES-256-XTS through AWS-LC's EVP interface: the fastest XTS measured on this kind of
//! machine (AVX-512 VAES kernel, 12 GB/s per core at 4 KiB in
//! shared/research/crypto-and-deps.md, against 5.7 for `aes` + our batched XTS).
//!
//! AWS-LC only offers XTS with a 512-bit key, so AES-128-XTS and AES-192-XTS take the
//! generic path in [`super::xts`]. An `EVP_CIPHER_CTX` must not be used by two threads at
//! once, and keying one costs far more than a sector, so each instance keeps a small pool
//! of keyed contexts (one encrypt and one decrypt per slot) and a caller takes a slot for
//! the duration of one call. Per sector only the IV is reset (`EVP_CipherInit_ex` with NULL
//! cipher and key), the pattern the research measured as "raw EVP".
#![allow(unsafe_code)]

use super::Mode;
use crate::secret::ForeignLock;
use aws_lc_sys as ffi;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

struct Ctx {
    enc: *mut ffi::EVP_CIPHER_CTX,
    dec: *mut ffi::EVP_CIPHER_CTX,
    /// The key schedules (each context's `cipher_data`, which AWS-LC allocates), locked
    /// through [`crate::secret`]'s page counts: `[enc, dec]`, `None` until allocated.
    schedules: [Option<ForeignLock>; 2],
}

/// AWS-LC's `EVP_AES_XTS_CTX` (crypto/fipsmodule/modes/internal.h), the `cipher_data` of an
/// AES-256-XTS context: both AES key schedules, then the XTS mode's key and function
/// pointers and a flag. Never built; only its size is used, as the length of the
/// allocation to lock (the library's `ctx_size` is internal). The test
/// `key_schedules_stay_in_locked_pages_while_the_contexts_live` checks it against the
/// size AWS-LC records for the allocation.
#[repr(C)]
#[allow(dead_code)]
struct XtsCtxLayout {
    ks1: XtsKey,
    ks2: XtsKey,
    xts: [*const u8; 4],
    data_unit_processed: u8,
}

/// `union { double align; AES_KEY ks; }`, as in `EVP_AES_XTS_CTX`.
#[repr(C)]
#[allow(dead_code)]
union XtsKey {
    align: f64,
    ks: ffi::AES_KEY,
}

/// Bytes of an AES-256-XTS context's `cipher_data` (536 on x86-64).
const XTS_CTX_BYTES: usize = std::mem::size_of::<XtsCtxLayout>();

// SAFETY: an EVP_CIPHER_CTX has no thread affinity; it only must not be used by two threads
// at the same time, which the Mutex around every Ctx guarantees. The ForeignLocks are the
// addresses of the contexts' own key schedules, touched only by Drop.
unsafe impl Send for Ctx {}

impl Drop for Ctx {
    fn drop(&mut self) {
        for (c, schedule) in [self.enc, self.dec].into_iter().zip(&mut self.schedules) {
            if let Some(schedule) = schedule.take() {
                // SAFETY: `c` is live (freed only below) and keyed with a cipher once, so
                // its `cipher_data` is still the allocation `schedule` locked (only
                // `EVP_CipherInit_ex` with a cipher reallocates it; per sector the cipher
                // is NULL); nothing else uses `c` (`&mut self`). The zeroing is ours, while
                // the pages are still locked: AWS-LC's free cleanses `cipher_data` too
                // (`EVP_CIPHER_CTX_cleanup` -> `OPENSSL_free` -> `OPENSSL_cleanse`), but
                // only after the pages are unlocked, as it frees them.
                unsafe {
                    debug_assert_eq!((*c).cipher_data.cast::<u8>() as usize, schedule.range().0);
                    schedule.zero_and_unlock();
                }
            }
        }
        // SAFETY: both pointers came from EVP_CIPHER_CTX_new (or are NULL, which the free
        // accepts) and are freed once, here.
        unsafe {
            ffi::EVP_CIPHER_CTX_free(self.enc);
            ffi::EVP_CIPHER_CTX_free(self.dec);
        }
    }
}

impl Ctx {
    /// Keys an encrypt and a decrypt context. Each context's `cipher_data` is allocated
    /// first (the cipher set, no key), locked, and only then keyed: the key schedule is
    /// written into locked pages, never into pages that could be swapped out before they
    /// were locked. If the kernel refuses the lock (`RLIMIT_MEMLOCK`) the context is keyed
    /// all the same, unlocked, as [`crate::secret::SecretBytes`] degrades.
    fn new(key: &[u8]) -> Option<Ctx> {
        if key.len() != 64 {
            return None; // AWS-LC would read 64 bytes
        }
        // SAFETY: plain constructor calls; failures are checked below and the partially
        // built Ctx is dropped (freeing whatever was allocated) on every error path.
        let mut ctx = unsafe {
            Ctx {
                enc: ffi::EVP_CIPHER_CTX_new(),
                dec: ffi::EVP_CIPHER_CTX_new(),
                schedules: [None, None],
            }
        };
        if ctx.enc.is_null() || ctx.dec.is_null() {
            return None;
        }
        // SAFETY: a constructor without preconditions returning a static description.
        let cipher = unsafe { ffi::EVP_aes_256_xts() };
        for (i, (c, enc)) in [(ctx.enc, 1), (ctx.dec, 0)].into_iter().enumerate() {
            // SAFETY: `c` is a live context of ours. Setting the cipher without a key or IV
            // allocates `cipher_data` (XTS_CTX_BYTES) and clears its key pointers
            // (EVP_CTRL_INIT); no key is written.
            let data = unsafe {
                if ffi::EVP_CipherInit_ex(
                    c,
                    cipher,
                    std::ptr::null_mut(),
                    std::ptr::null(),
                    std::ptr::null(),
                    enc,
                ) != 1
                {
                    return None;
                }
                (*c).cipher_data.cast::<u8>()
            };
            if data.is_null() {
                return None;
            }
            ctx.schedules[i] = Some(ForeignLock::new(data, XTS_CTX_BYTES));
            // SAFETY: `c` has its cipher set; a NULL cipher keeps `cipher_data` where it is
            // and expands `key` (64 readable bytes, checked above) into it.
            let keyed = unsafe {
                ffi::EVP_CipherInit_ex(
                    c,
                    std::ptr::null(),
                    std::ptr::null_mut(),
                    key.as_ptr(),
                    std::ptr::null(),
                    enc,
                )
            };
            if keyed != 1 {
                return None;
            }
        }
        Some(ctx)
    }

    /// One data unit out of place: reset the IV, transform `src` into `dst`.
    #[inline]
    fn unit_to(ctx: *mut ffi::EVP_CIPHER_CTX, iv: &[u8], src: &[u8], dst: &mut [u8]) {
        assert_eq!(src.len(), dst.len(), "BUG: XTS unit lengths differ");
        // SAFETY: `src` is valid for reading and `dst` for writing `src.len()` bytes, and
        // they cannot overlap (a shared and a unique borrow).
        unsafe { Self::transform(ctx, iv, src.as_ptr(), dst.as_mut_ptr(), src.len()) }
    }

    /// One data unit: reset the IV, transform in place.
    #[inline]
    fn unit(ctx: *mut ffi::EVP_CIPHER_CTX, iv: &[u8], data: &mut [u8]) {
        let p = data.as_mut_ptr();
        // SAFETY: `data` is valid for reading and writing its length; EVP permits
        // in == out for XTS.
        unsafe { Self::transform(ctx, iv, p, p, data.len()) }
    }

    /// Resets the IV and transforms `len` bytes from `src` to `dst`.
    ///
    /// # Safety
    /// `src` readable and `dst` writable for `len` bytes, either equal or disjoint; `ctx` a
    /// keyed AES-256-XTS context owned by the caller's slot.
    #[inline]
    unsafe fn transform(
        ctx: *mut ffi::EVP_CIPHER_CTX,
        iv: &[u8],
        src: *const u8,
        dst: *mut u8,
        len: usize,
    ) {
        assert!(iv.len() >= 16, "BUG: XTS IV shorter than 16 bytes");
        let len = i32::try_from(len).expect("BUG: sector larger than 2 GiB");
        let mut out_len = 0;
        // SAFETY: the caller's contract; iv holds at least 16 bytes (checked above).
        let ok = unsafe {
            ffi::EVP_CipherInit_ex(
                ctx,
                std::ptr::null(),
                std::ptr::null_mut(),
                std::ptr::null(),
                iv.as_ptr(),
                -1,
            ) == 1
                && ffi::EVP_CipherUpdate(ctx, dst, &mut out_len, src, len) == 1
        };
        assert!(
            ok && out_len == len,
            "BUG: AWS-LC XTS refused a whole sector"
        );
    }
}

/// AES-256-XTS (64-byte key) via AWS-LC.
pub struct AwsXts {
    slots: Box<[Mutex<Ctx>]>,
    spare: Mutex<Spare>,
}

/// Contexts for callers that find every slot busy, keyed on demand from a kept copy of the
/// key and kept for reuse (so their number is bounded by the callers ever busy at once).
///
/// Why not wait for a slot: a thread holds a slot for a whole request's crypto, and with
/// many more threads than CPUs (the NBD server at depth 256, `ucrypt bench parallel`)
/// holders get preempted mid-request; everyone queued behind a sleeping holder stalled,
/// which made depth-256 throughput swing by up to 2x between identical runs.
struct Spare {
    /// Locked in RAM like the volume key itself (crate::secret), zeroed on drop.
    key: crate::secret::SecretBytes,
    free: Vec<Ctx>,
}

/// Hands each thread a home slot, round robin, so threads rarely meet on one lock.
fn home_slot(n: usize) -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local!(static HOME: usize = NEXT.fetch_add(1, Ordering::Relaxed));
    HOME.with(|h| *h % n)
}

impl AwsXts {
    /// Keys the contexts; `None` if AWS-LC refuses the key (it refuses XTS keys whose two
    /// halves are equal), in which case the caller falls back to the generic XTS.
    pub fn new(key: &[u8]) -> Option<Self> {
        if key.len() != 64 {
            return None;
        }
        // Why this many: one per CPU is enough for the worker pool; twice that leaves room
        // for receiving threads doing crypto inline, so try_lock nearly always succeeds.
        let n = std::thread::available_parallelism().map_or(2, |n| n.get()) * 2;
        let slots = (0..n)
            .map(|_| Ctx::new(key).map(Mutex::new))
            .collect::<Option<Vec<_>>>()?;
        Some(AwsXts {
            slots: slots.into_boxed_slice(),
            spare: Mutex::new(Spare {
                key: crate::secret::SecretBytes::copy_of(key),
                free: Vec::new(),
            }),
        })
    }

    /// Runs `f` with a context slot held: a free slot if there is one, else a spare
    /// context (never waiting for a busy slot).
    #[inline]
    pub fn with_slot<R>(&self, f: impl FnOnce(&mut AwsXtsSlot<'_>) -> R) -> R {
        let n = self.slots.len();
        let home = home_slot(n);
        for i in 0..n {
            if let Ok(mut guard) = self.slots[(home + i) % n].try_lock() {
                return f(&mut AwsXtsSlot { ctx: &mut guard });
            }
        }
        self.with_spare(f)
    }

    #[cold]
    fn with_spare<R>(&self, f: impl FnOnce(&mut AwsXtsSlot<'_>) -> R) -> R {
        let taken = {
            let mut spare = self.spare.lock().unwrap_or_else(|p| p.into_inner());
            match spare.free.pop() {
                Some(ctx) => Some(ctx),
                None => Ctx::new(&spare.key),
            }
        };
        let Some(mut ctx) = taken else {
            // Keying cannot fail for a key that keyed the slots; if the library still
            // refuses (out of memory), wait for a slot rather than fail the request.
            let mut guard = self.slots[home_slot(self.slots.len())]
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            return f(&mut AwsXtsSlot { ctx: &mut guard });
        };
        let r = f(&mut AwsXtsSlot { ctx: &mut ctx });
        self.spare
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .free
            .push(ctx);
        r
    }

    /// Contexts keyed beyond the fixed slots so far (for tests).
    pub fn spare_contexts(&self) -> usize {
        self.spare
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .free
            .len()
    }
}

/// A held context slot: transforms any number of sectors without further locking.
pub struct AwsXtsSlot<'a> {
    ctx: &'a mut Ctx,
}

impl AwsXtsSlot<'_> {
    /// Encrypts one data unit with the given 16-byte tweak IV.
    #[inline]
    pub fn encrypt(&mut self, iv: &[u8], data: &mut [u8]) {
        Ctx::unit(self.ctx.enc, iv, data);
    }
    /// Decrypts one data unit with the given 16-byte tweak IV.
    #[inline]
    pub fn decrypt(&mut self, iv: &[u8], data: &mut [u8]) {
        Ctx::unit(self.ctx.dec, iv, data);
    }
    /// Decrypts one data unit from `src` into `dst` (same length).
    #[inline]
    pub fn decrypt_to(&mut self, iv: &[u8], src: &[u8], dst: &mut [u8]) {
        Ctx::unit_to(self.ctx.dec, iv, src, dst);
    }
}

impl Mode for AwsXts {
    fn iv_size(&self) -> usize {
        16
    }
    fn encrypt(&self, iv: &[u8], data: &mut [u8]) {
        self.with_slot(|s| s.encrypt(iv, data));
    }
    fn decrypt(&self, iv: &[u8], data: &mut [u8]) {
        self.with_slot(|s| s.decrypt(iv, data));
    }
}

/// The raw library rate benchmarks compare against: one keyed AWS-LC context, one
/// `EVP_CipherInit_ex` (IV only) + `EVP_CipherUpdate` per sector with a plain64 IV, no
/// ucrypt code in between.
pub struct RawLibraryXts {
    ctx: Ctx,
}

impl RawLibraryXts {
    /// Keys a context (64-byte key); `None` if AWS-LC refuses the key.
    pub fn new(key: &[u8]) -> Option<Self> {
        Ctx::new(key).map(|ctx| RawLibraryXts { ctx })
    }

    /// Transforms `data` sector by sector, sector n getting plain64 IV `n`.
    pub fn run(&mut self, data: &mut [u8], sector_bytes: usize, encrypt: bool) {
        let c = if encrypt { self.ctx.enc } else { self.ctx.dec };
        let mut iv = [0u8; 16];
        for (n, sector) in data.chunks_exact_mut(sector_bytes).enumerate() {
            iv[..8].copy_from_slice(&(n as u64).to_le_bytes());
            Ctx::unit(c, &iv, sector);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_generic_xts() {
        let key: Vec<u8> = (0..64).map(|i| (i * 13 + 1) as u8).collect();
        let fast = AwsXts::new(&key).expect("AWS-LC keys AES-256-XTS");
        let slow = super::super::xts::Xts::new("aes", &key).unwrap();
        let mut a: Vec<u8> = (0..4096).map(|i| (i * 31) as u8).collect();
        let mut b = a.clone();
        let iv = [9u8; 16];
        fast.encrypt(&iv, &mut a);
        slow.encrypt(&iv, &mut b);
        assert_eq!(a, b);
        fast.decrypt(&iv, &mut a);
        assert!(a.iter().enumerate().all(|(i, &x)| x == (i * 31) as u8));
    }

    /// Where each context's key schedule is, as (address, length): its `cipher_data`.
    fn schedules(c: &Ctx) -> Vec<(usize, usize)> {
        c.schedules
            .iter()
            .map(|s| s.as_ref().expect("keyed").range())
            .collect()
    }

    /// Every context's key schedule (AWS-LC's `cipher_data`) is in locked pages from
    /// keying until the context is freed, by the kernel's own flag for each page
    /// (`/proc/kpageflags`, as root) and the page counts: contexts sharing a page do not
    /// unlock it for each other, and the last one out unlocks it.
    #[test]
    fn key_schedules_stay_in_locked_pages_while_the_contexts_live() {
        let key: Vec<u8> = (0..64).map(|i| (i * 11 + 5) as u8).collect();
        let ctxs: Vec<Ctx> = (0..8).map(|_| Ctx::new(&key).unwrap()).collect();
        if !ctxs[0].schedules[0].as_ref().unwrap().is_locked() {
            eprintln!("SKIP: mlock refused (RLIMIT_MEMLOCK)");
            return;
        }
        for c in &ctxs {
            for (i, (addr, len)) in schedules(c).into_iter().enumerate() {
                assert!(c.schedules[i].as_ref().unwrap().is_locked());
                assert_eq!(len, XTS_CTX_BYTES);
                // SAFETY: `addr` is the live `cipher_data` of a keyed context of `c`;
                // AWS-LC's malloc records the allocation's size in the 8 bytes before it
                // (OPENSSL_MALLOC_PREFIX), and nothing writes either while `c` is
                // borrowed.
                let (recorded, data) = unsafe {
                    (
                        (addr as *const usize).sub(1).read_unaligned(),
                        std::slice::from_raw_parts(addr as *const u8, len),
                    )
                };
                assert_eq!(recorded, XTS_CTX_BYTES, "EVP_AES_XTS_CTX's size changed");
                // The tweak key's schedule (the second AES key, encrypting in both
                // contexts) is inside the locked range: its first round key is the key's
                // third quarter, as bytes (AES-NI) or as big-endian words (C code).
                let raw = &key[32..48];
                let words: Vec<u8> = raw
                    .chunks(4)
                    .flat_map(|w| [w[3], w[2], w[1], w[0]])
                    .collect();
                assert!(
                    data.windows(16).any(|w| w == raw || w == &words[..]),
                    "context {i}: no tweak key schedule in the locked range"
                );
            }
        }
        crate::secret::page_check::drop_checking_pages(ctxs, schedules);
    }

    #[test]
    fn callers_beyond_the_slots_get_spare_contexts_with_the_same_key() {
        let key: Vec<u8> = (0..64).map(|i| (i * 7 + 3) as u8).collect();
        let fast = AwsXts::new(&key).unwrap();
        let slow = super::super::xts::Xts::new("aes", &key).unwrap();
        let plain: Vec<u8> = (0..4096).map(|i| (i * 17) as u8).collect();
        let mut want = plain.clone();
        slow.encrypt(&[5u8; 16], &mut want);
        // Hold every slot, then encrypt: the call must not wait, and must use the key.
        let guards: Vec<_> = fast.slots.iter().map(|s| s.lock().unwrap()).collect();
        let mut got = plain.clone();
        fast.encrypt(&[5u8; 16], &mut got);
        drop(guards);
        assert_eq!(got, want);
        assert_eq!(fast.spare_contexts(), 1, "the spare is kept for reuse");
    }
}
