//! The ordered submitter: encrypted writes reach the backend from one thread, in the order
//! the requests arrived, each request (plug) released whole once its last chunk is
//! encrypted, and consecutive ready requests handed down together as one batch. Tejun
//! Heo's counter-proposal in seed 001, instead of sorting; the sorted variant (Mikulas
//! Patocka's rb-tree) is `WriteOrder::Sorted`, for comparison.
//!
//! A [`Batch`] lives on the stack of the thread that issued the write; that thread waits
//! on the batch's completion, which the submitter signals only after the write.

use crate::options::WriteOrder;
use crate::pool::MAX_PIECES;
use crate::request::Completion;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use ucrypt_backend::{Backend, BackendError, WriteOp};

/// One write request on its way to the backend.
pub(crate) struct Batch {
    pub seq: u64,
    /// (backend offset, pointer, length) per pool buffer.
    pub pieces: [(u64, *const u8, usize); MAX_PIECES],
    pub n_pieces: usize,
    pub fua: bool,
    chunks_left: AtomicUsize,
    failed: Mutex<Option<BackendError>>,
    pub completion: Completion,
}

impl Batch {
    pub(crate) fn new(seq: u64, chunks: usize, fua: bool) -> Self {
        Batch {
            seq,
            pieces: [(0, std::ptr::null(), 0); MAX_PIECES],
            n_pieces: 0,
            fua,
            chunks_left: AtomicUsize::new(chunks),
            failed: Mutex::new(None),
            completion: Completion::new(1),
        }
    }

    /// Counts one chunk encrypted; true for the last one.
    pub(crate) fn chunk_encrypted(&self) -> bool {
        self.chunks_left.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// Counts `n` chunks that will never be encrypted (the issuer unwound); true when that
    /// leaves none, i.e. the batch is to be handed to the submitter now.
    pub(crate) fn abandon_chunks(&self, n: usize) -> bool {
        n > 0 && self.chunks_left.fetch_sub(n, Ordering::AcqRel) == n
    }

    /// Records a crypto failure: the batch is then completed with it and not written.
    pub(crate) fn fail(&self, e: BackendError) {
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(e);
    }
}

#[derive(Clone, Copy)]
struct BatchPtr(*const Batch);
// SAFETY: the batch outlives its pointer (module docs); it is only read through `&`.
unsafe impl Send for BatchPtr {}

impl BatchPtr {
    fn get(&self) -> &Batch {
        // SAFETY: a batch handed to `ready` stays alive until the submitter completes it
        // (its issuer waits on the completion), and the submitter drops the pointer then.
        unsafe { &*self.0 }
    }
}

/// A ready batch, ordered by sequence number (the heap's top is the lowest).
struct Ready {
    seq: u64,
    batch: BatchPtr,
}

impl PartialEq for Ready {
    fn eq(&self, other: &Self) -> bool {
        self.seq == other.seq
    }
}
impl Eq for Ready {}
impl PartialOrd for Ready {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Ready {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // Reversed: BinaryHeap is a max-heap, the submitter wants the lowest number.
        other.seq.cmp(&self.seq)
    }
}

struct State {
    next_seq: u64,
    /// Why a heap: releasing the run of consecutive numbers from an unordered list was a
    /// scan per released batch, quadratic in the batches waiting; the heap's top is the
    /// next candidate (O(log n) per batch).
    ready: BinaryHeap<Ready>,
}

/// The submitter thread's shared half.
pub(crate) struct Submitter {
    issued: AtomicU64,
    state: Mutex<State>,
    wake: Condvar,
    stop: AtomicBool,
    order: WriteOrder,
}

/// The running submitter.
pub(crate) struct SubmitterThread {
    pub shared: Arc<Submitter>,
    thread: Option<JoinHandle<()>>,
}

impl Submitter {
    /// Takes the next issue-order number. Every number taken must reach [`Submitter::ready`]
    /// or later batches wait forever.
    pub(crate) fn next_seq(&self) -> u64 {
        self.issued.fetch_add(1, Ordering::AcqRel)
    }

    /// Hands over a batch whose chunks are all encrypted.
    pub(crate) fn ready(&self, batch: &Batch) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.ready.push(Ready {
            seq: batch.seq,
            batch: BatchPtr(batch),
        });
        drop(st);
        self.wake.notify_one();
    }
}

impl SubmitterThread {
    pub(crate) fn start(backend: Arc<dyn Backend>, order: WriteOrder) -> Self {
        let shared = Arc::new(Submitter {
            issued: AtomicU64::new(0),
            // Why this capacity: at most one entry per write in flight; reserved so the
            // hot path does not allocate.
            state: Mutex::new(State {
                next_seq: 0,
                ready: BinaryHeap::with_capacity(1024),
            }),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            order,
        });
        let s = Arc::clone(&shared);
        // Running before the first write (see `Workers::new`: thread start-up allocates).
        let started = Arc::new(std::sync::Barrier::new(2));
        let started2 = Arc::clone(&started);
        let thread = std::thread::Builder::new()
            .name("ucrypt-submit".into())
            .spawn(move || {
                started2.wait();
                submit_loop(&s, &*backend)
            })
            .expect("spawning the write submitter thread");
        started.wait();
        SubmitterThread {
            shared,
            thread: Some(thread),
        }
    }
}

impl Drop for SubmitterThread {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        {
            let _g = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
            self.shared.wake.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn submit_loop(s: &Submitter, backend: &dyn Backend) {
    let mut take: Vec<BatchPtr> = Vec::with_capacity(1024);
    let mut ops: Vec<WriteOp<'static>> = Vec::with_capacity(1024 * MAX_PIECES);
    loop {
        {
            let mut st = s.state.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                match s.order {
                    WriteOrder::Issue => {
                        // Release the run of consecutive sequence numbers that are ready.
                        while st.ready.peek().is_some_and(|r| r.seq == st.next_seq) {
                            let r = st.ready.pop().expect("peeked");
                            take.push(r.batch);
                            st.next_seq += 1;
                        }
                    }
                    WriteOrder::Sorted => {
                        take.extend(st.ready.drain().map(|r| r.batch));
                        take.sort_by_key(|b| b.get().pieces[0].0);
                    }
                }
                if !take.is_empty() {
                    break;
                }
                if s.stop.load(Ordering::Acquire) && st.ready.is_empty() {
                    return;
                }
                st = s.wake.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        }
        // One plug: every released batch goes down in one submit_writes call.
        for b in &take {
            let batch = b.get();
            if batch
                .failed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_some()
            {
                continue;
            }
            for &(offset, ptr, len) in &batch.pieces[..batch.n_pieces] {
                // SAFETY: the piece is a pool buffer held by the waiting issuer; the
                // 'static lifetime never escapes this loop iteration (ops is cleared).
                let buf: &'static [u8] = unsafe { std::slice::from_raw_parts(ptr, len) };
                ops.push(WriteOp {
                    offset,
                    buf,
                    fua: batch.fua,
                });
            }
        }
        let result = backend.submit_writes(&ops);
        ops.clear();
        for b in take.drain(..) {
            // After done() the issuer may free the batch, so that call is the last use.
            let batch = b.get();
            let failed = batch
                .failed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            let r = match (failed, &result) {
                (Some(e), _) => Err(e),
                (None, Ok(())) => Ok(()),
                (None, Err(e)) => Err(BackendError::Other(format!("batched write failed: {e}"))),
            };
            batch.completion.done(r);
        }
    }
}
