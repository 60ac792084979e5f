//! The crypt worker pool: dm-crypt's kcryptd workqueue, in userspace.
//!
//! One thread per CPU, each pinned to its CPU. With `same_cpu_crypt` every worker has its
//! own queue and a request goes to the worker of the CPU that received it (dm-crypt's
//! per-CPU bound workqueue). Without it there is one shared queue and any idle worker
//! takes the next chunk (the 2013 unbound workqueue), so one large request spreads over
//! all CPUs.
//!
//! Jobs point into buffers owned by the thread that submitted them. That thread waits on
//! the job's [`Completion`] (or, for ordered writes, the submitter's) before it returns, so
//! the memory outlives the job: the one invariant the `unsafe` blocks below rely on.

use crate::request::{Completion, SPIN};
use crate::submit::{Batch, Submitter};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use ucrypt_backend::{Backend, BackendError};
use ucrypt_crypto::{Sector512, SectorCipher};

/// What a worker does with its chunk.
#[derive(Clone, Copy)]
pub(crate) enum JobKind {
    /// Decrypt in place, then count the chunk done.
    Decrypt { completion: *const Completion },
    /// Encrypt in place, then count the chunk done (the issuer writes the whole request).
    Encrypt { completion: *const Completion },
    /// Read the chunk's ciphertext from the backend at `offset`, decrypt it in place,
    /// count it done: the whole read in parallel (the automatic policy's split reads).
    ReadDecrypt {
        completion: *const Completion,
        offset: u64,
    },
    /// Copy `len` plaintext bytes from `src` into the chunk, encrypt, write at `offset`,
    /// count it done (the automatic policy's split writes).
    CopyEncryptWrite {
        completion: *const Completion,
        src: *const u8,
        offset: u64,
        fua: bool,
    },
    /// Encrypt in place, then write it to the backend at `offset` (submit_from_crypt_cpus).
    EncryptWrite {
        completion: *const Completion,
        offset: u64,
        fua: bool,
    },
    /// Encrypt in place, then tell the ordered submitter the chunk of `batch` is ready.
    EncryptOrdered { batch: *const Batch },
    /// Show the chunk to the hook, decrypt it in place, encrypt it with the other cipher,
    /// count it done (reencryption: [`crate::Volume::recrypt_in_place`]).
    Recrypt {
        completion: *const Completion,
        with: *const Recrypt,
    },
    /// Read the old ciphertext of the bytes `off` into the range, show them to the hook,
    /// re-encrypt them and keep them in the chunk or write them back, count it done
    /// ([`crate::Volume::recrypt_range`]).
    RecryptIo {
        completion: *const Completion,
        with: *const RecryptIo,
        off: usize,
    },
}

/// The hook of [`crate::Volume::recrypt_in_place`]: (offset of a chunk in the buffer, the
/// chunk's old bytes).
pub type Inspect<'a> = dyn Fn(usize, &[u8]) + Sync + 'a;

/// What a [`JobKind::Recrypt`] chunk needs beside the pool's own cipher; lives on the
/// issuer's stack until its completion is counted (module docs).
pub(crate) struct Recrypt {
    /// The cipher the plaintext is encrypted with.
    pub new: *const (dyn SectorCipher + 'static),
    /// Sees each chunk's old bytes first: (offset of the chunk in the buffer, bytes).
    pub inspect: Option<*const Inspect<'static>>,
    /// The buffer's first byte, to tell the hook where a chunk lies.
    pub start: *const u8,
}

/// What a [`JobKind::RecryptIo`] chunk needs; lives on the issuer's stack until its
/// completion is counted (module docs).
pub(crate) struct RecryptIo {
    /// The cipher the plaintext is encrypted with.
    pub new: *const (dyn SectorCipher + 'static),
    /// Sees each chunk's old bytes first: (offset of the chunk in the range, bytes).
    pub inspect: Option<*const Inspect<'static>>,
    /// Backend offset of the range's old ciphertext.
    pub read_at: u64,
    /// Where the old ciphertext is kept (the journal), chunk by chunk at the chunk's
    /// offset; null: read into the chunk itself.
    pub keep: *mut u8,
    /// Backend offset the new ciphertext is written to; `None`: kept in the chunk.
    pub write_at: Option<u64>,
    /// Buffers for chunks written back (they have no memory of the issuer's).
    pub pool: *const crate::pool::BufferPool,
    /// Set by the first chunk that fails: the others do nothing more.
    pub failed: AtomicBool,
}

/// Runs one [`JobKind::RecryptIo`] chunk (on a worker or the issuer).
///
/// # Safety
/// `ptr`/`len` and `with`'s pointers as the module docs say: alive and untouched by others
/// until the chunk is counted done.
pub(crate) unsafe fn recrypt_io(
    backend: &dyn Backend,
    cipher: &dyn SectorCipher,
    with: &RecryptIo,
    first: Sector512,
    ptr: *mut u8,
    len: usize,
    off: usize,
) -> Result<(), BackendError> {
    if with.failed.load(Ordering::Relaxed) {
        return Ok(());
    }
    let from = with.read_at + off as u64;
    // SAFETY: the caller's contract.
    let new = unsafe { &*with.new };
    let show = |old: &[u8]| {
        if let Some(f) = with.inspect {
            // SAFETY: the caller's contract: the hook outlives the chunk.
            unsafe { (*f)(off, old) };
        }
    };
    let r = match with.write_at {
        None => {
            // SAFETY: the caller's contract.
            let out = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
            if with.keep.is_null() {
                backend.read_at(out, from).map(|()| {
                    show(out);
                    cipher.decrypt(first, out);
                    new.encrypt(first, out);
                })
            } else {
                // SAFETY: the caller's contract: `keep` is as long as the range.
                let keep = unsafe { std::slice::from_raw_parts_mut(with.keep.add(off), len) };
                backend.read_at(keep, from).map(|()| {
                    show(keep);
                    cipher.decrypt_from(first, keep, out);
                    new.encrypt(first, out);
                })
            }
        }
        Some(to) => {
            // SAFETY: the caller's contract: the pool outlives the chunk.
            let pool = unsafe { &*with.pool };
            pool.get(len).and_then(|mut buf| {
                let buf = &mut buf[..];
                backend.read_at(buf, from)?;
                show(buf);
                cipher.decrypt(first, buf);
                new.encrypt(first, buf);
                backend.write_at(buf, to + off as u64, false)
            })
        }
    };
    if r.is_err() {
        with.failed.store(true, Ordering::Relaxed);
    }
    r
}

/// One chunk of crypto.
#[derive(Clone, Copy)]
pub(crate) struct Job {
    pub kind: JobKind,
    /// Position of the chunk's first sector.
    pub first: Sector512,
    pub ptr: *mut u8,
    pub len: usize,
}

// SAFETY: a Job only points at memory whose owner waits for the job's completion (module
// docs), and each chunk is touched by exactly one worker.
unsafe impl Send for Job {}

/// Jobs queued for workers, with the condition workers sleep on.
struct Queue {
    jobs: Mutex<Jobs>,
    ready: Condvar,
    /// Jobs queued, readable without the lock so idle workers can spin on it.
    queued: AtomicUsize,
}

struct Jobs {
    list: VecDeque<Job>,
    /// Workers asleep on `ready`: submitters make the wake-up system call only when > 0.
    sleepers: usize,
}

impl Queue {
    fn new() -> Self {
        // Why this capacity: the pool and the callers' depth bound the jobs in flight;
        // reserving up front keeps the hot path free of allocation.
        Queue {
            jobs: Mutex::new(Jobs {
                list: VecDeque::with_capacity(4096),
                sleepers: 0,
            }),
            ready: Condvar::new(),
            queued: AtomicUsize::new(0),
        }
    }
}

struct Shared {
    /// `same_cpu_crypt`: one queue per worker; otherwise a single shared queue.
    queues: Vec<Queue>,
    cipher: Arc<dyn SectorCipher>,
    backend: Arc<dyn Backend>,
    submitter: Option<Arc<Submitter>>,
    stop: AtomicBool,
    /// Workers spinning for the next job, and how many may (CPUs - 1: one CPU stays free
    /// for the thread that will hand them work).
    spinners: AtomicUsize,
    max_spinners: usize,
}

/// The running pool.
pub(crate) struct Workers {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    same_cpu: bool,
}

fn current_cpu() -> usize {
    // SAFETY: sched_getcpu has no arguments and no memory effects.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).unwrap_or(0)
}

/// Raises the calling thread's nice value by `by` (Linux's nice value is per thread;
/// raising it needs no privilege). Failure leaves the priority as it was.
fn lower_priority(by: i32) {
    // SAFETY: getpriority and setpriority have no memory effects; on Linux PRIO_PROCESS
    // with id 0 is the calling thread only.
    unsafe {
        let base = libc::getpriority(libc::PRIO_PROCESS, 0);
        libc::setpriority(libc::PRIO_PROCESS, 0, base + by);
    }
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: the cpu_set_t is zero-initialised then filled by the libc macros; the call
    // affects only the calling thread (pid 0). Failure (restricted cpuset) is harmless.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

impl Workers {
    pub(crate) fn start(
        n: usize,
        same_cpu: bool,
        cipher: Arc<dyn SectorCipher>,
        backend: Arc<dyn Backend>,
        submitter: Option<Arc<Submitter>>,
        nice: i32,
    ) -> Self {
        let n = n.max(1);
        let queues = (0..if same_cpu { n } else { 1 })
            .map(|_| Queue::new())
            .collect();
        let shared = Arc::new(Shared {
            queues,
            cipher,
            backend,
            submitter,
            stop: AtomicBool::new(false),
            spinners: AtomicUsize::new(0),
            max_spinners: if same_cpu {
                0
            } else {
                std::thread::available_parallelism()
                    .map_or(1, |c| c.get())
                    .saturating_sub(1)
            },
        });
        let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
        // The pool is ready once every worker runs: a thread's start-up (its name, its
        // signal stack) allocates, and must not fall on the first requests' time (the
        // no_alloc test caught a late-starting worker allocating mid-workload).
        let started = Arc::new(std::sync::Barrier::new(n + 1));
        let threads = (0..n)
            .map(|i| {
                let s = Arc::clone(&shared);
                let started = Arc::clone(&started);
                std::thread::Builder::new()
                    .name(format!("ucrypt-crypt{i}"))
                    .spawn(move || {
                        started.wait();
                        if nice != 0 {
                            lower_priority(nice);
                        }
                        // Only same_cpu_crypt workers are bound to a CPU (dm-crypt's bound
                        // per-CPU workqueue); the shared pool floats like the unbound
                        // workqueue, so the scheduler can put a woken worker on the CPU the
                        // issuer is not using.
                        if same_cpu {
                            pin_to_cpu(i % cpus);
                        }
                        worker_loop(&s, if same_cpu { i } else { 0 });
                    })
                    .expect("spawning a crypt worker thread")
            })
            .collect();
        started.wait();
        Workers {
            shared,
            threads,
            same_cpu,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.threads.len()
    }

    /// Queues jobs: all on the receiving CPU's worker (`same_cpu_crypt`) or on the shared
    /// queue, waking every sleeping worker that has a job to take.
    pub(crate) fn submit(&self, jobs: &[Job]) {
        self.submit_waking(jobs, usize::MAX);
    }

    /// Queues jobs waking at most `wake` sleeping workers: a split request's issuer works
    /// too, so waking one worker per other CPU is enough, and more threads than CPUs would
    /// only take turns.
    pub(crate) fn submit_waking(&self, jobs: &[Job], wake: usize) {
        let q = if self.same_cpu {
            &self.shared.queues[current_cpu() % self.shared.queues.len()]
        } else {
            &self.shared.queues[0]
        };
        if jobs.is_empty() {
            return;
        }
        let mut queue = q.jobs.lock().unwrap_or_else(|p| p.into_inner());
        queue.list.extend(jobs.iter().copied());
        q.queued.fetch_add(jobs.len(), Ordering::Release);
        let sleepers = queue.sleepers;
        drop(queue);
        let wake = sleepers.min(jobs.len()).min(wake);
        if self.same_cpu || wake == 1 {
            if sleepers > 0 && wake > 0 {
                q.ready.notify_one();
            }
        } else if wake >= sleepers {
            if sleepers > 0 {
                q.ready.notify_all();
            }
        } else {
            for _ in 0..wake {
                q.ready.notify_one();
            }
        }
    }

    /// The issuer of a split request helps: it runs queued jobs itself until its own
    /// request is done, then waits for chunks still running on workers. Work is balanced
    /// without a wake-up when the issuer gets there first.
    pub(crate) fn help_until(&self, completion: &Completion) -> Result<(), BackendError> {
        let q = &self.shared.queues[0];
        while !completion.is_done() {
            if q.queued.load(Ordering::Acquire) == 0 {
                break;
            }
            let job = {
                let mut jobs = q.jobs.lock().unwrap_or_else(|p| p.into_inner());
                let j = jobs.list.pop_front();
                if j.is_some() {
                    q.queued.fetch_sub(1, Ordering::Relaxed);
                }
                j
            };
            match job {
                Some(j) => run_job(&self.shared, j),
                None => break,
            }
        }
        completion.wait(true)
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for q in &self.shared.queues {
            let _guard = q.jobs.lock().unwrap_or_else(|p| p.into_inner());
            q.ready.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn worker_loop(s: &Shared, queue: usize) {
    let q = &s.queues[queue];
    loop {
        // Spin briefly for the next job, but never on every CPU: with as many spinning
        // workers as CPUs the thread about to hand them work loses its CPU (measured: 1 MiB
        // split reads got slower than inline). At most CPUs - 1 spin; the rest sleep.
        if s.spinners.fetch_add(1, Ordering::AcqRel) < s.max_spinners {
            let spin_until = std::time::Instant::now() + SPIN;
            while q.queued.load(Ordering::Acquire) == 0
                && !s.stop.load(Ordering::Relaxed)
                && std::time::Instant::now() < spin_until
            {
                std::hint::spin_loop();
            }
        }
        s.spinners.fetch_sub(1, Ordering::AcqRel);
        let job = {
            let mut jobs = q.jobs.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if let Some(j) = jobs.list.pop_front() {
                    q.queued.fetch_sub(1, Ordering::Relaxed);
                    break j;
                }
                if s.stop.load(Ordering::Acquire) {
                    return;
                }
                jobs.sleepers += 1;
                jobs = q.ready.wait(jobs).unwrap_or_else(|p| p.into_inner());
                jobs.sleepers -= 1;
            }
        };
        run_job(s, job);
    }
}

fn run_job(s: &Shared, job: Job) {
    // Before `data` below: a chunk written back has no memory of the issuer's (null).
    if let JobKind::RecryptIo {
        completion,
        with,
        off,
    } = job.kind
    {
        let r = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: the issuer keeps `with` and the chunk alive until the completion
            // below is counted (module docs).
            unsafe {
                recrypt_io(
                    &*s.backend,
                    &*s.cipher,
                    &*with,
                    job.first,
                    job.ptr,
                    job.len,
                    off,
                )
            }
        }))
        .unwrap_or_else(|_| Err(BackendError::Other("BUG: crypto worker panicked".into())));
        // SAFETY: the completion lives until its count reaches zero (module docs).
        let completion = unsafe { &*completion };
        completion.done(r);
        return;
    }
    // SAFETY: see the module docs: the submitter of the job keeps this memory alive and
    // untouched until the job's completion is counted, which happens below.
    let data = unsafe { std::slice::from_raw_parts_mut(job.ptr, job.len) };
    let encrypt = !matches!(
        job.kind,
        JobKind::Decrypt { .. } | JobKind::ReadDecrypt { .. }
    );
    if let JobKind::CopyEncryptWrite { src, .. } = job.kind {
        // SAFETY: `src` points at `job.len` bytes of the issuer's buffer, alive and unchanged
        // until the issuer's completion is counted (module docs).
        data.copy_from_slice(unsafe { std::slice::from_raw_parts(src, job.len) });
    }
    if let JobKind::Recrypt { completion, with } = job.kind {
        // SAFETY: `with`, the cipher and the hook it points at live on the issuer's side
        // until the completion below is counted (module docs).
        let with = unsafe { &*with };
        let r = catch_unwind(AssertUnwindSafe(|| {
            if let Some(f) = with.inspect {
                // SAFETY: as above; `start` and `data` point into the same buffer.
                let at = unsafe { data.as_ptr().offset_from(with.start) } as usize;
                // SAFETY: as above: the hook outlives the job.
                unsafe { (*f)(at, data) };
            }
            s.cipher.decrypt(job.first, data);
            // SAFETY: as above.
            unsafe { (*with.new).encrypt(job.first, data) };
        }))
        .map_err(|_| BackendError::Other("BUG: crypto worker panicked".into()));
        // SAFETY: the completion lives until its count reaches zero (module docs).
        let completion = unsafe { &*completion };
        completion.done(r);
        return;
    }
    if let JobKind::ReadDecrypt { completion, offset } = job.kind {
        // Read and decrypt in one step (out of the backend's mapping when it has one).
        let pos = job.first.0 << 9;
        let r = catch_unwind(AssertUnwindSafe(|| {
            crate::sector_io::read_decrypt(&*s.backend, &*s.cipher, pos, offset, data, true)
        }))
        .unwrap_or_else(|_| Err(BackendError::Other("BUG: crypto worker panicked".into())));
        // SAFETY: the completion lives until its count reaches zero (module docs).
        let completion = unsafe { &*completion };
        completion.done(r);
        return;
    }
    // A panic in crypto is a bug; it must still complete the request (as an error), or
    // its submitter would wait forever.
    let crypto = catch_unwind(AssertUnwindSafe(|| {
        if encrypt {
            s.cipher.encrypt(job.first, data);
        } else {
            s.cipher.decrypt(job.first, data);
        }
    }))
    .map_err(|_| BackendError::Other("BUG: crypto worker panicked".into()));
    match job.kind {
        JobKind::Decrypt { completion }
        | JobKind::Encrypt { completion }
        | JobKind::ReadDecrypt { completion, .. }
        | JobKind::Recrypt { completion, .. }
        | JobKind::RecryptIo { completion, .. } => {
            // SAFETY: the completion lives until its count reaches zero (module docs).
            let completion = unsafe { &*completion };
            completion.done(crypto);
        }
        JobKind::EncryptWrite {
            completion,
            offset,
            fua,
        }
        | JobKind::CopyEncryptWrite {
            completion,
            offset,
            fua,
            ..
        } => {
            let r = crypto.and_then(|()| s.backend.write_at(data, offset, fua));
            // SAFETY: as above.
            let completion = unsafe { &*completion };
            completion.done(r);
        }
        JobKind::EncryptOrdered { batch } => {
            // SAFETY: the batch lives until the submitter completes it (module docs).
            let batch = unsafe { &*batch };
            if let Err(e) = crypto {
                batch.fail(e);
            }
            if batch.chunk_encrypted() {
                s.submitter
                    .as_ref()
                    .expect("BUG: ordered write without a submitter")
                    .ready(batch);
            }
        }
    }
}
