//! The issuing side of a request's hand-off to workers: a guard that keeps the request's
//! completion (and an ordered write's batch) alive until every chunk handed out is done,
//! on every path out of the issuing frame.

use crate::request::Completion;
use crate::submit::{Batch, Submitter};
use ucrypt_backend::BackendError;

/// Keeps what a request handed to workers (its completion, batch and buffers, all on the
/// issuing thread's stack) alive until they are done with it, on every path out of the
/// issuing frame, unwinding included: on drop it forgets the chunks never handed out and
/// waits for the others, so a panic between handing out jobs and waiting for them never
/// lets workers write into a freed stack frame. On the normal path the request has been
/// waited for, and the drop costs one atomic load.
pub(crate) struct HandOff<'a> {
    completion: &'a Completion,
    /// An ordered write's batch and its submitter: an abandoned batch must still reach
    /// the submitter (failed, unwritten), or every later ordered write waits for its number.
    batch: Option<(&'a Batch, &'a Submitter)>,
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
    pub(crate) fn batch(batch: &'a Batch, submitter: &'a Submitter, chunks: usize) -> Self {
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
    use std::sync::atomic::Ordering;
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
