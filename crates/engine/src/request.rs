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

    /// Waits until every chunk handed out is done, ignoring results (for [`HandOff`]).
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

/// Keeps what a request handed to workers (its completion, batch and buffers, all on the
/// issuing thread's stack) alive until they are done with it, on every path out of the
/// issuing frame, unwinding included: on drop it forgets the chunks never handed out and
/// waits for the others. Before, the hand-off relied on the issuer never unwinding
/// between handing out jobs and waiting for them (a panic there would have let workers
/// write into a freed stack frame). On the normal path the request has been waited for,
/// and the drop costs one atomic load.
pub(crate) struct HandOff<'a> {
    completion: &'a Completion,
    /// An ordered write's batch and its submitter: an abandoned batch must still reach
    /// the submitter (failed, unwritten), or every later ordered write waits for its number.
    batch: Option<(&'a crate::submit::Batch, &'a crate::submit::Submitter)>,
    unsent: usize,
}

impl<'a> HandOff<'a> {
    /// Guards `completion`, of which `chunks` are still to be handed out.
    pub(crate) fn new(completion: &'a Completion, chunks: usize) -> Self {
        HandOff {
            completion,
            batch: None,
            unsent: chunks,
        }
    }

    /// Guards an ordered write's batch instead, of which `chunks` are still to be handed
    /// out.
    pub(crate) fn batch(
        batch: &'a crate::submit::Batch,
        submitter: &'a crate::submit::Submitter,
        chunks: usize,
    ) -> Self {
        HandOff {
            completion: &batch.completion,
            batch: Some((batch, submitter)),
            unsent: chunks,
        }
    }

    /// Records `n` more chunks handed out.
    pub(crate) fn sent(&mut self, n: usize) {
        self.unsent -= n;
    }
}

impl Drop for HandOff<'_> {
    fn drop(&mut self) {
        if self.completion.is_done() {
            return;
        }
        match self.batch {
            Some((batch, submitter)) => {
                if self.unsent > 0 {
                    batch.fail(BackendError::Other("the issuing thread unwound".into()));
                    if batch.abandon_chunks(self.unsent) {
                        submitter.ready(batch);
                    }
                }
            }
            None => self.completion.forget(self.unsent),
        }
        self.completion.wait_quiet();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn an_unwinding_issuer_waits_for_the_chunks_it_handed_out() {
        // Three chunks planned, one handed to a slow "worker", then the issuer panics: the
        // guard must forget the two never handed out and wait for the slow one before the
        // frame (and the completion in it) goes away.
        let finished = Arc::new(AtomicBool::new(false));
        let f2 = Arc::clone(&finished);
        let r = std::panic::catch_unwind(move || {
            let completion = Completion::new(3);
            let mut hand_off = HandOff::new(&completion, 3);
            let ptr = &completion as *const Completion as usize;
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                f2.store(true, Ordering::SeqCst);
                // SAFETY: the guard keeps the completion alive until this is done.
                #[allow(unsafe_code)]
                let c = unsafe { &*(ptr as *const Completion) };
                c.done(Ok(()));
            });
            hand_off.sent(1);
            panic!("issuer unwinds with a chunk in flight");
        });
        assert!(r.is_err());
        assert!(
            finished.load(Ordering::SeqCst),
            "the frame was left before the worker finished with it"
        );
    }
}
