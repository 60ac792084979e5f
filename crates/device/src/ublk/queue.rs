//! Serving a started device: one thread and io_uring per queue, one task per tag, each
//! request mapped to a [`Backend`] call (inline, or on a worker pool).

use super::*;

/// The parameters the device advertises, from the backend's geometry and capabilities.
pub(super) fn device_params(export: &dyn Backend, opts: &AttachOptions) -> sys::ublk_params {
    let info = export.info();
    let shift = |v: u32| -> u8 {
        // Powers of two in 512..=64 KiB for block sizes; anything else falls back to 512.
        let v = v.max(512);
        if v.is_power_of_two() {
            v.trailing_zeros().min(16) as u8
        } else {
            9
        }
    };
    let logical = opts.logical_block.max(info.logical_block);
    let logical_shift = shift(logical);
    let physical_shift = shift(info.physical_block).max(logical_shift);
    let opt_shift = shift(info.optimal_block).max(physical_shift);
    let mut attrs = 0;
    if info.caps.flush != Support::None {
        attrs |= sys::UBLK_ATTR_VOLATILE_CACHE | sys::UBLK_ATTR_FUA;
    }
    let read_only = opts.read_only || info.caps.read_only;
    if read_only {
        attrs |= sys::UBLK_ATTR_READ_ONLY;
    }
    let mut params = sys::ublk_params {
        len: std::mem::size_of::<sys::ublk_params>() as u32,
        types: sys::UBLK_PARAM_TYPE_BASIC,
        basic: sys::ublk_param_basic {
            attrs,
            logical_bs_shift: logical_shift,
            physical_bs_shift: physical_shift,
            io_opt_shift: opt_shift,
            io_min_shift: physical_shift,
            max_sectors: IO_BUF_BYTES >> 9,
            // The kernel rounds nothing: a size that is not whole logical blocks would
            // expose a partial last block, so it is cut to whole blocks.
            dev_sectors: (info.size_bytes >> logical_shift << logical_shift) >> 9,
            ..Default::default()
        },
        ..Default::default()
    };
    if !read_only {
        let discard = info.caps.discard != Support::None;
        params.types |= sys::UBLK_PARAM_TYPE_DISCARD;
        params.discard = sys::ublk_param_discard {
            discard_alignment: 0,
            discard_granularity: 1u32 << physical_shift,
            max_discard_sectors: if discard { u32::MAX >> 9 } else { 0 },
            // Zeroes are always available: written as (encrypted) data when the backend
            // has no native write-zeroes.
            max_write_zeroes_sectors: u32::MAX >> 9,
            max_discard_segments: 1,
            reserved0: 0,
        };
    }
    params
}

/// What every queue thread shares.
pub(super) struct Shared {
    pub(super) export: Export,
    pub(super) pool: Option<mpsc::Sender<Job>>,
    /// [`UblkOptions::spill`]: the pool's worker count when set.
    pub(super) spill: Option<usize>,
    /// [`UblkOptions::poll`].
    pub(super) poll: Option<Duration>,
    /// The queue threads' ids (for [`unpin_threads`]).
    pub(super) tids: Mutex<Vec<libc::pid_t>>,
}

/// The CPUs the calling thread may run on (`None` if the kernel does not say).
pub(super) fn allowed_cpus() -> Option<libc::cpu_set_t> {
    // SAFETY: cpu_set_t is plain data (all zeroes is the empty set); sched_getaffinity
    // writes at most `size_of::<cpu_set_t>()` bytes into it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        (libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0)
            .then_some(set)
    }
}

/// Lets threads `tids` run on any CPU of `cpus`. For the queue threads, once the device is
/// live, undoing libublk's pinning of each queue thread to its queue's CPUs (see
/// [`UblkOptions::pin_queues`]): libublk pins each thread before `START_DEV` returns, and
/// every queue thread lives until the device stops (`START_DEV` needs all of them), so
/// no id here can belong to another thread yet.
pub(super) fn unpin_threads(tids: &[libc::pid_t], cpus: &libc::cpu_set_t) {
    for &tid in tids {
        // SAFETY: `cpus` is a live, initialised cpu_set_t of the size passed; the call
        // only reads it. A failure (ESRCH, EINVAL for a set without any CPU of ours)
        // leaves the thread as it was.
        unsafe {
            libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), cpus);
        }
    }
}

/// One tag's buffers: the request data and the eventfd the workers complete it through.
/// Shared (`Arc`) with the worker running the request, so the memory stays valid even if
/// the queue's task is dropped while a worker still writes into it.
struct Slot {
    buf: IoBuf<u8>,
    /// Where the eventfd read lands (the kernel writes it during the read SQE).
    counter: UnsafeCell<u64>,
    done: OwnedFd,
    result: AtomicI32,
}

// SAFETY: `buf` is only touched by one party at a time: the queue task before handing the
// slot to a worker and after the worker signalled `done`, the worker in between (the
// task awaits the eventfd and does nothing else with the slot). `counter` is written only
// by the kernel for the task's read SQE and read by nobody. `done` and `result` are
// thread-safe by themselves.
unsafe impl Sync for Slot {}
// SAFETY: as above; every field is either Send or only accessed under that hand-off.
unsafe impl Send for Slot {}

impl Slot {
    fn new(bytes: usize) -> Result<Self, UblkError> {
        // SAFETY: plain syscall without pointers.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(UblkError::IOError(std::io::Error::last_os_error()));
        }
        Ok(Slot {
            buf: IoBuf::new(bytes),
            counter: UnsafeCell::new(0),
            // SAFETY: `fd` was just returned by eventfd and is owned by nobody else.
            done: unsafe { OwnedFd::from_raw_fd(fd) },
            result: AtomicI32::new(0),
        })
    }

    /// The whole buffer, writable.
    ///
    /// # Safety
    /// Only the party that currently owns the slot (see the `Sync` impl) may call it, and
    /// only one such slice may be alive at a time.
    #[allow(clippy::mut_from_ref)]
    unsafe fn data(&self) -> &mut [u8] {
        let s = self.buf.as_slice();
        // SAFETY: IoBuf owns `s.len()` bytes at this address for its whole life; the
        // caller guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(s.as_ptr().cast_mut(), s.len()) }
    }
}

/// A request decoded from the driver's descriptor.
#[derive(Debug, Clone, Copy)]
pub(super) struct Request {
    pub(super) op: u32,
    pub(super) fua: bool,
    pub(super) offset: u64,
    pub(super) len: u64,
    pub(super) client: u32,
}

/// A request handed to a worker.
pub(super) struct Job {
    req: Request,
    slot: Arc<Slot>,
}

/// Worker threads that run backend calls for the queue threads.
pub(super) struct Pool {
    tx: Option<mpsc::Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl Pool {
    pub(super) fn start(n: usize, export: Export) -> Result<Self, DeviceError> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let rx = Arc::clone(&rx);
            let export = Arc::clone(&export);
            let t = std::thread::Builder::new()
                .name(format!("ublk-worker-{i}"))
                .spawn(move || loop {
                    let job = {
                        let guard = rx.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                        guard.recv()
                    };
                    let Ok(job) = job else { break };
                    // SAFETY: the slot was handed over with the job; the queue task does
                    // not touch its buffer until `done` is signalled below.
                    let data = unsafe { job.slot.data() };
                    let res = execute(&*export, job.req, data);
                    job.slot.result.store(res, Ordering::Release);
                    let one: u64 = 1;
                    // SAFETY: writes 8 bytes from a live u64 to an eventfd we own.
                    let _ = unsafe {
                        libc::write(
                            job.slot.done.as_raw_fd(),
                            (&raw const one).cast(),
                            std::mem::size_of::<u64>(),
                        )
                    };
                })
                .map_err(|e| DeviceError::io("starting a ublk worker thread", e))?;
            threads.push(t);
        }
        Ok(Pool {
            tx: Some(tx),
            threads,
        })
    }

    pub(super) fn sender(&self) -> mpsc::Sender<Job> {
        self.tx.clone().expect("the pool's sender lives until stop")
    }

    pub(super) fn stop(mut self) {
        self.tx = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One queue's thread: an async task per tag on a local executor, driven by the queue's
/// io_uring (libublk's pattern, see its `examples/loop.rs`).
pub(super) fn queue_main(qid: u16, dev: &UblkDev, shared: &Arc<Shared>) {
    // SAFETY: gettid has no arguments and cannot fail.
    let tid = unsafe { libc::gettid() };
    shared
        .tids
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(tid);
    let q = match UblkQueue::new(qid, dev) {
        Ok(q) => Rc::new(q),
        Err(e) => {
            eprintln!("ucrypt: ublk queue {qid}: {}", describe(&e));
            return;
        }
    };
    let exe_rc = Rc::new(smol::LocalExecutor::new());
    let exe = Rc::clone(&exe_rc);
    let buf_bytes = dev.dev_info.max_io_buf_bytes as usize;
    let load = Rc::new(QueueLoad::default());
    let mut tasks = Vec::new();
    for tag in q.tags() {
        let q = Rc::clone(&q);
        let shared = Arc::clone(shared);
        let load = Rc::clone(&load);
        tasks.push(exe.spawn(async move {
            match io_task(&q, tag, &shared, &load, buf_bytes).await {
                Ok(()) | Err(UblkError::QueueIsDown) => {}
                Err(e) => eprintln!("ucrypt: ublk queue {qid} tag {tag}: {}", describe(&e)),
            }
        }));
    }
    let poll = shared.poll;
    smol::block_on(exe_rc.run(async move {
        let run_ops = || while exe.try_tick() {};
        let done = || tasks.iter().all(|t| t.is_finished());
        let result = match poll {
            None => libublk::wait_and_handle_io_events(&q, Some(IDLE_SECS), run_ops, done).await,
            Some(budget) => {
                let idle = io_uring::types::Timespec::new().sec(IDLE_SECS);
                let wait = || async {
                    if poll_ring(&q, budget) {
                        return Ok(false);
                    }
                    libublk::uring_async::uring_poll_io_fn::<io_uring::squeue::Entry>(
                        &q,
                        Some(idle),
                        1,
                    )
                };
                let reap = |timed_out| {
                    libublk::uring_async::ublk_reap_io_events_with_update_queue(
                        &q,
                        timed_out,
                        None,
                        |cqe| libublk::uring_async::ublk_wake_task(cqe.user_data(), cqe),
                    )
                };
                libublk::uring_async::run_uring_tasks(wait, reap, run_ops, done).await
            }
        };
        if let Err(e) = result {
            eprintln!("ucrypt: ublk queue {qid}: {}", describe(&e));
        }
    }));
}

/// `io_uring_enter`'s flag to reap completions (`include/uapi/linux/io_uring.h`; the
/// io-uring crate does not export its constants).
const IORING_ENTER_GETEVENTS: u32 = 1;

/// Seconds without a request after which libublk counts a queue idle.
const IDLE_SECS: u64 = 20;

/// [`UblkOptions::poll`]: submits what the queue's tasks queued and looks for completions
/// without sleeping, again and again for up to `budget`; true as soon as there is one.
/// False when the budget ran out (or the queue is stopping): the caller then waits the
/// ordinary, sleeping way, which also handles the stop.
fn poll_ring(q: &UblkQueue<'_>, budget: Duration) -> bool {
    let start = std::time::Instant::now();
    loop {
        if q.is_stopping() {
            return false;
        }
        let ready = libublk::io::with_task_io_ring_mut(|ring| {
            let pending = u32::try_from(ring.submission().len()).unwrap_or(u32::MAX);
            // GETEVENTS with a minimum of 0 runs the ring's pending task work (the
            // driver's new requests and commit results land that way under COOP_TASKRUN)
            // and returns at once. An error (EINTR, EBUSY with a full completion queue)
            // only ends this round: the completions are looked at all the same.
            // SAFETY: no argument pointer is passed (`None`), so the kernel reads no
            // memory of ours besides the rings the `IoUring` owns.
            let _ = unsafe {
                ring.submitter()
                    .enter::<libc::sigset_t>(pending, 0, IORING_ENTER_GETEVENTS, None)
            };
            !ring.completion().is_empty()
        });
        if ready {
            return true;
        }
        if start.elapsed() >= budget {
            return false;
        }
        std::hint::spin_loop();
    }
}

/// One tag: fetch a request, run it, commit the result and fetch the next, until the
/// queue goes down.
async fn io_task(
    q: &UblkQueue<'_>,
    tag: u16,
    shared: &Shared,
    load: &QueueLoad,
    buf_bytes: usize,
) -> Result<(), UblkError> {
    let slot = Arc::new(Slot::new(buf_bytes)?);
    q.submit_io_prep_cmd(tag, BufDesc::Slice(slot.buf.as_slice()), 0, Some(&slot.buf))
        .await?;
    let client = u32::from(q.get_qid()) + 1;
    loop {
        let iod = *q.get_iod(tag);
        let req = Request {
            op: iod.op_flags & 0xff,
            fua: iod.op_flags & sys::UBLK_IO_F_FUA != 0,
            offset: iod.start_sector << 9,
            len: u64::from(iod.nr_sectors) << 9,
            client,
        };
        let res = match &shared.pool {
            None => {
                // SAFETY: no worker holds this slot (inline mode): the task owns it.
                let data = unsafe { slot.data() };
                execute(&*shared.export, req, data)
            }
            Some(tx) => match shared.spill {
                Some(workers) if !load.spill(workers).await => {
                    // SAFETY: not handed to a worker: the task owns the slot.
                    let data = unsafe { slot.data() };
                    execute(&*shared.export, req, data)
                }
                Some(_) => {
                    let res = offload(tx, req, &slot, shared).await;
                    load.offloaded.set(load.offloaded.get() - 1);
                    res
                }
                None => offload(tx, req, &slot, shared).await,
            },
        };
        q.submit_io_commit_cmd(tag, BufDesc::Slice(slot.buf.as_slice()), res)
            .await?;
    }
}

/// What one queue's tasks know of each other (all on the queue's thread).
#[derive(Default)]
pub(super) struct QueueLoad {
    /// Tasks holding a request they have not yet started or handed off.
    ready: std::cell::Cell<usize>,
    /// Requests handed to the workers and not yet back.
    pub(super) offloaded: std::cell::Cell<usize>,
}

impl QueueLoad {
    /// [`UblkOptions::spill`]'s choice for a task that just got a request: whether to hand
    /// it to the `workers` (counted in `offloaded`, which the caller decrements when the
    /// request is back) or run it inline. The task counts itself ready and yields once, so
    /// every task woken by the same batch of completions has counted itself before any
    /// decides; then the queue keeps about `workers / (workers + 1)` of its requests at
    /// hand (ready or offloaded) on the workers. A request ready alone always runs inline.
    pub(super) async fn spill(&self, workers: usize) -> bool {
        self.ready.set(self.ready.get() + 1);
        smol::future::yield_now().await;
        let ready = self.ready.get();
        self.ready.set(ready - 1);
        let off = self.offloaded.get();
        let spill = ready > 1 && off * (workers + 1) < (off + ready) * workers;
        if spill {
            self.offloaded.set(off + 1);
        }
        spill
    }
}

/// Hands `req` to a worker and waits (without blocking the queue thread) for its eventfd.
async fn offload(tx: &mpsc::Sender<Job>, req: Request, slot: &Arc<Slot>, shared: &Shared) -> i32 {
    let job = Job {
        req,
        slot: Arc::clone(slot),
    };
    if tx.send(job).is_err() {
        // The pool is gone (shutting down): run it here.
        // SAFETY: the job was not taken by any worker (send failed), so the task owns it.
        let data = unsafe { slot.data() };
        return execute(&*shared.export, req, data);
    }
    let sqe = io_uring::opcode::Read::new(
        io_uring::types::Fd(slot.done.as_raw_fd()),
        slot.counter.get().cast::<u8>(),
        std::mem::size_of::<u64>() as u32,
    )
    .build();
    loop {
        match libublk::uring_async::ublk_submit_sqe_async(
            sqe.clone(),
            libublk::UblkUringData::Target as u64,
        )
        .await
        {
            Ok(n) if n == std::mem::size_of::<u64>() as i32 => break,
            Ok(n) if n == -libc::EINTR || n == -libc::EAGAIN => continue,
            // The eventfd read failed (it cannot, short of a kernel bug): the worker may
            // still be running, so wait for it the blocking way rather than reuse the slot.
            _ => {
                let mut v: u64 = 0;
                // SAFETY: reads 8 bytes into a live u64 from an eventfd we own.
                let _ = unsafe {
                    libc::read(
                        slot.done.as_raw_fd(),
                        (&raw mut v).cast(),
                        std::mem::size_of::<u64>(),
                    )
                };
                break;
            }
        }
    }
    slot.result.load(Ordering::Acquire)
}

/// Runs one request on the backend; returns what the driver expects: bytes for reads and
/// writes, 0 for the others, `-errno` on failure.
pub(super) fn execute(export: &dyn Backend, req: Request, data: &mut [u8]) -> i32 {
    let size = export.info().size_bytes;
    let ctx = IoCtx { client: req.client };
    let in_range = req
        .offset
        .checked_add(req.len)
        .is_some_and(|end| end <= size);
    let result: Result<i32, BackendError> = match req.op {
        sys::UBLK_IO_OP_READ | sys::UBLK_IO_OP_WRITE => {
            let Ok(len) = usize::try_from(req.len) else {
                return -libc::EINVAL;
            };
            if len > data.len() || !in_range {
                return -libc::EINVAL;
            }
            let buf = &mut data[..len];
            if req.op == sys::UBLK_IO_OP_READ {
                export.submit(Io::read(buf, req.offset).ctx(ctx))
            } else {
                // The I/O buffer is ours until the commit, and the kernel copies a write's
                // data into it afresh at every dispatch: the volume encrypts in place.
                export.submit(Io::write_owned(buf, req.offset).fua(req.fua).ctx(ctx))
            }
            .map(|()| len as i32)
        }
        sys::UBLK_IO_OP_FLUSH => export.flush().map(|()| 0),
        sys::UBLK_IO_OP_DISCARD if in_range => {
            emulate::discard(export, req.offset, req.len, req.fua).map(|()| 0)
        }
        sys::UBLK_IO_OP_WRITE_ZEROES if in_range => {
            emulate::write_zeroes(export, req.offset, req.len, req.fua, ctx).map(|()| 0)
        }
        sys::UBLK_IO_OP_DISCARD | sys::UBLK_IO_OP_WRITE_ZEROES => return -libc::EINVAL,
        _ => return -libc::EOPNOTSUPP,
    };
    match result {
        Ok(n) => n,
        Err(e) => -e.errno().max(1),
    }
}
