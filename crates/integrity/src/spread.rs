//! Helper threads that share a large request's AEAD work with the thread that received it
//! ([`crate::AeadVolume`], [`crate::Spread`]): the plain volume's split requests
//! (`ucrypt_engine`'s crypt workers, the issuer helping), for work that is a closure over
//! the request's buffers instead of a `SectorCipher` job.
//!
//! Why not the engine's pool: its jobs are `SectorCipher` operations (one job kind per
//! operation, the cipher and backend fixed when it starts), and an AEAD piece needs its
//! tags beside it and answers with the sector that failed; a generic job kind there would
//! sit on the plain volume's hot path. Why not a scoped thread per request: a new thread
//! starts behind every runnable thread (the scheduler's placement of new tasks), so on a
//! busy machine the request waited for its helper to be scheduled at all (measured in
//! BENCHMARKING.md, "AEAD of large requests over threads": 0.3-0.9x of one thread at load 8),
//! where a woken sleeper runs at once.
//!
//! ```text
//!   issuer: post k entries ──► queue ──► helper: run() ─┐
//!           run() itself                                 ├─ pieces taken in order, each once
//!           take back the entries nobody took           │
//!           wait until the helpers that took one are done ◄┘
//! ```
//!
//! An entry points at a closure on the issuer's stack. The issuer does not return (nor
//! unwind) before every entry it posted is either taken back or finished, which is the one
//! invariant the `unsafe` below relies on.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

/// What a request shares with the helpers that took its entries.
struct Done {
    /// Entries posted and neither taken back nor finished.
    left: Mutex<usize>,
    all: Condvar,
    /// A helper's run panicked (the issuer panics in turn: the pieces it ran are unknown).
    panicked: AtomicBool,
}

/// One helper's share of a request: run the closure (which takes pieces until none is
/// left), then count the entry finished.
struct Entry {
    run: *const (dyn Fn() + Sync + 'static),
    done: Arc<Done>,
}

// SAFETY: the closure is Sync and outlives the entry (module docs); `done` is an Arc.
unsafe impl Send for Entry {}

struct Queue {
    entries: Mutex<VecDeque<Entry>>,
    ready: Condvar,
    stop: AtomicBool,
}

/// The running helpers.
pub(crate) struct Helpers {
    queue: Arc<Queue>,
    threads: Vec<JoinHandle<()>>,
}

impl Helpers {
    /// Starts up to `n` helper threads (fewer if the system refuses more: the issuer then
    /// does their share).
    pub(crate) fn start(n: usize) -> Helpers {
        let queue = Arc::new(Queue {
            entries: Mutex::new(VecDeque::with_capacity(64)),
            ready: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let threads = (0..n)
            .map_while(|i| {
                let q = Arc::clone(&queue);
                std::thread::Builder::new()
                    .name(format!("ucrypt-aead{i}"))
                    .spawn(move || helper(&q))
                    .ok()
            })
            .collect();
        Helpers { queue, threads }
    }

    /// Runs `run` on this thread and on up to `more` helpers at once, returning when every
    /// run has returned. `run` must be safe to call concurrently and to call after the
    /// work is gone (it then returns at once): each call takes pieces until none is left.
    ///
    /// # Panics
    /// If `run` panicked on a helper (or here).
    pub(crate) fn run(&self, more: usize, run: &(dyn Fn() + Sync)) {
        let more = more.min(self.threads.len());
        let done = Arc::new(Done {
            left: Mutex::new(more),
            all: Condvar::new(),
            panicked: AtomicBool::new(false),
        });
        // SAFETY: only the lifetime is erased; `_wait` below keeps this frame (and so the
        // closure) alive until no helper can call it any more (module docs).
        let ptr: *const (dyn Fn() + Sync + 'static) = unsafe {
            std::mem::transmute::<*const (dyn Fn() + Sync + '_), *const (dyn Fn() + Sync)>(run)
        };
        let _wait = TakeBackAndWait {
            queue: &self.queue,
            done: &done,
        };
        if more > 0 {
            let mut q = self
                .queue
                .entries
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            for _ in 0..more {
                q.push_back(Entry {
                    run: ptr,
                    done: Arc::clone(&done),
                });
            }
            drop(q);
            for _ in 0..more {
                self.queue.ready.notify_one();
            }
        }
        run();
        drop(_wait);
        assert!(
            !done.panicked.load(Ordering::Relaxed),
            "BUG: an AEAD helper thread panicked"
        );
    }
}

/// Takes back the request's entries no helper took and waits for those taken to finish;
/// on drop, so that a panic on the issuer waits too.
struct TakeBackAndWait<'a> {
    queue: &'a Queue,
    done: &'a Arc<Done>,
}

impl Drop for TakeBackAndWait<'_> {
    fn drop(&mut self) {
        let mut q = self
            .queue
            .entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let before = q.len();
        q.retain(|e| !Arc::ptr_eq(&e.done, self.done));
        let taken_back = before - q.len();
        drop(q);
        let mut left = self
            .done
            .left
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *left -= taken_back;
        while *left > 0 {
            left = self
                .done
                .all
                .wait(left)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl Drop for Helpers {
    fn drop(&mut self) {
        self.queue.stop.store(true, Ordering::Release);
        {
            let _q = self
                .queue
                .entries
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            self.queue.ready.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn helper(q: &Queue) {
    loop {
        let entry = {
            let mut entries = q.entries.lock().unwrap_or_else(PoisonError::into_inner);
            loop {
                if let Some(e) = entries.pop_front() {
                    break e;
                }
                if q.stop.load(Ordering::Acquire) {
                    drop(entries);
                    // The thread's stack goes to glibc's cache of stacks, contents kept:
                    // nothing of the pieces it sealed or checked may stay there (the
                    // cipher burns after each use too; this covers every other frame).
                    ucrypt_crypto::secret::burn_stack();
                    return;
                }
                entries = q
                    .ready
                    .wait(entries)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        };
        // SAFETY: the issuer waits for this entry to be counted finished below before its
        // closure goes away (module docs).
        let run = unsafe { &*entry.run };
        if catch_unwind(AssertUnwindSafe(run)).is_err() {
            entry.done.panicked.store(true, Ordering::Relaxed);
        }
        let mut left = entry
            .done
            .left
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *left -= 1;
        entry.done.all.notify_one();
    }
}
