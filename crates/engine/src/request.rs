//! A request's completion: the receiving thread waits on it while workers and the
//! submitter finish the request's chunks.
//!
//! Lives on the waiting thread's stack, so completing a request allocates nothing. Workers
//! hold a pointer to it only until they count their chunk done; the waiter does not return
//! (and so the completion is not freed) before the count reaches zero.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread::Thread;
use ucrypt_backend::BackendError;

/// How long a waiter spins before sleeping.
pub(crate) const SPIN: std::time::Duration = std::time::Duration::from_micros(30);

/// Counts outstanding chunks of one request and wakes its waiter at zero.
pub(crate) struct Completion {
    remaining: AtomicUsize,
    waiter: Thread,
    error: Mutex<Option<BackendError>>,
}

impl Completion {
    pub(crate) fn new(chunks: usize) -> Self {
        Completion {
            remaining: AtomicUsize::new(chunks),
            waiter: std::thread::current(),
            error: Mutex::new(None),
        }
    }

    /// Marks one chunk done (with its result).
    pub(crate) fn done(&self, result: Result<(), BackendError>) {
        if let Err(e) = result {
            let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert(e);
        }
        // Clone the handle before the decrement: once the count is zero the waiter may
        // return and free `self`.
        let waiter = self.waiter.clone();
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            waiter.unpark();
        }
    }

    /// Forgets `n` chunks that were never handed out (the issuer is unwinding).
    pub(crate) fn forget(&self, n: usize) {
        if n > 0 {
            self.remaining.fetch_sub(n, Ordering::AcqRel);
        }
    }

    /// Waits until every chunk handed out is done, ignoring results (for the hand-off guard, `handoff::HandOff`).
    pub(crate) fn wait_quiet(&self) {
        while self.remaining.load(Ordering::Acquire) != 0 {
            std::thread::park();
        }
    }

    /// Whether every chunk is done.
    pub(crate) fn is_done(&self) -> bool {
        self.remaining.load(Ordering::Acquire) == 0
    }

    /// Waits for every chunk; returns the first error.
    /// With `spin`, spins briefly before sleeping: a wake-up through the scheduler costs
    /// tens of microseconds on a VM, longer than the crypto of a small chunk. Callers pass
    /// false when the work runs on their own CPU (same_cpu_crypt), where spinning would
    /// only delay it.
    pub(crate) fn wait(&self, spin: bool) -> Result<(), BackendError> {
        let spin_until = std::time::Instant::now()
            + if spin {
                SPIN
            } else {
                std::time::Duration::ZERO
            };
        while self.remaining.load(Ordering::Acquire) != 0 && std::time::Instant::now() < spin_until
        {
            std::hint::spin_loop();
        }
        while self.remaining.load(Ordering::Acquire) != 0 {
            std::thread::park();
        }
        match self.error.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
