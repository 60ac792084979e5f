//! The hot path allocates nothing per request (seed 002): after a warm-up, steady-state
//! reads and writes through a Volume, in each placement, make zero heap allocations in any
//! thread (workers and submitter included). Counted with a wrapping global allocator.

#![allow(clippy::unwrap_used)]

mod common;
use common::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use ucrypt_backend::{Backend, Io};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn workload(v: &dyn Backend, buf: &mut [u8]) {
    for i in 0..64u64 {
        v.write_at(&buf[..4096], (i * 4096) % (1 << 20), i % 7 == 0)
            .unwrap();
        v.read_at(&mut buf[..4096], (i * 8192) % (1 << 20)).unwrap();
    }
    for i in 0..4u64 {
        v.write_at(&buf[..], 0, false).unwrap();
        v.read_at(&mut buf[..], 0).unwrap();
        v.write_at(&buf[..1000], 1 + i * 3000, false).unwrap(); // read-modify-write
    }
    // The NBD server's and ublk's write: encrypted in the caller's buffer where inline.
    let ctx = ucrypt_backend::IoCtx::default();
    for i in 0..16u64 {
        v.submit(Io::write_owned(&mut buf[..4096], (i * 4096) % (1 << 20)).ctx(ctx))
            .unwrap();
    }
    v.submit(Io::write_owned(&mut buf[..], 0).ctx(ctx)).unwrap();
}

#[test]
fn steady_state_io_makes_no_allocations_in_any_placement() {
    // Only the pooled configurations: "per-request-alloc" allocates on purpose.
    let mut report = Vec::new();
    for (name, opts) in configs()
        .into_iter()
        .filter(|(n, _)| *n != "per-request-alloc")
    {
        let v = volume(memory(1 << 20), cipher("aes-xts-plain64", 4096), 0, opts);
        let mut buf = vec![0x33u8; 1 << 20];
        workload(&v, &mut buf); // warm-up: backend chunks, thread handles, lazy state
        ALLOCS.store(0, Ordering::SeqCst);
        COUNTING.store(true, Ordering::SeqCst);
        workload(&v, &mut buf);
        COUNTING.store(false, Ordering::SeqCst);
        report.push((name, ALLOCS.load(Ordering::SeqCst)));
    }
    eprintln!("allocations during 153 steady-state requests: {report:?}");
    assert!(
        report.iter().all(|(_, n)| *n == 0),
        "allocations on the hot path: {report:?}"
    );
}
