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

    /// Waits for every chunk; returns the first error.
    pub(crate) fn wait(&self) -> Result<(), BackendError> {
        while self.remaining.load(Ordering::Acquire) != 0 {
            std::thread::park();
        }
        match self.error.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
