//! One VM connection's device: the `vhost-user-backend` trait implementation and the
//! virtio-blk requests of its queues (virtio 1.2, 5.2.6), run on the export.
//!
//! Each queue has its own thread (the library's epoll worker). It takes what the driver
//! has queued, up to [`MAX_BATCH`] requests at a time, and with helper threads
//! ([`crate::AttachOptions::workers`] > 0) keeps them all in flight: it runs one itself and
//! hands the others to the connection's helpers, puts each in the used ring as it ends and
//! notifies the driver once per batch. Without helpers it runs one request at a time and
//! completes each before the next. A batch ends before the queue thread looks at the ring
//! again, so nothing is in flight between two runs of a queue. A request's data is read into
//! or written from the VM's memory directly when its data buffer is one piece of one
//! memory region (the usual case), and through a per-queue bounce buffer otherwise.
//! Write-zeroes and discard go through [`emulate`], as for every front end.
//!
//! When the VM handed over an inflight region (`inflight.rs`), each request is marked
//! there from the moment it leaves the available ring until it is in the used ring, and a
//! queue's first run on a new connection resubmits what a dead server left marked.

use super::config::{Geometry, CONFIG_LEN, MAX_ZERO_SECTORS, MAX_ZERO_SEGMENTS};
use super::inflight::Region;
use super::relay::Session;
use crate::Export;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, RwLock};
use ucrypt_backend::{emulate, BackendError, Io, IoCtx};
use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP,
    VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN,
    VIRTIO_BLK_T_OUT, VIRTIO_BLK_T_WRITE_ZEROES,
};
use virtio_queue::desc::split::Descriptor;
use virtio_queue::QueueT;
use vm_memory::{
    Address, Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend,
    GuestMemoryMmap,
};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

/// The VM's memory as the library hands it over (no dirty-page bitmap: no migration log).
pub(crate) type Memory = GuestMemoryAtomic<GuestMemoryMmap>;

/// Descriptors per queue a VM may ask for.
pub(super) const MAX_QUEUE_SIZE: u16 = 1024;

/// The largest read or write a request may carry: larger ones fail with an I/O error
/// rather than grow the bounce buffer without bound (Linux sends at most `seg_max`
/// segments of at most a few pages each).
const MAX_DATA_BYTES: usize = 32 << 20;

/// The most requests a queue thread takes from its ring before it runs them: with helper
/// threads, the most it has in flight.
const MAX_BATCH: usize = 32;

/// Size of a request header (`struct virtio_blk_outhdr`).
const HEADER: usize = 16;

/// Size of one discard/write-zeroes segment (`struct virtio_blk_discard_write_zeroes`).
const ZERO_SEGMENT: usize = 16;

/// What every connection of an attachment shares.
pub(crate) struct Shared {
    pub export: Export,
    pub geometry: Geometry,
    /// The capacity the VM is shown, in bytes: the volume's, set again by a resize before
    /// a shrink takes effect.
    pub capacity: std::sync::atomic::AtomicU64,
    /// GET_ID's answer: the instance name, cut to 20 bytes, zero-padded.
    pub serial: [u8; VIRTIO_BLK_ID_BYTES as usize],
    /// Helper threads per connection ([`crate::AttachOptions::workers`]).
    pub workers: usize,
}

impl Shared {
    /// The device `opts` describe for `export`, with `queue_size` descriptors per queue
    /// at most.
    pub(crate) fn new(export: Export, opts: &crate::AttachOptions, queue_size: u16) -> Shared {
        let mut serial = [0u8; VIRTIO_BLK_ID_BYTES as usize];
        let name = opts.name.as_bytes();
        let n = name.len().min(serial.len());
        serial[..n].copy_from_slice(&name[..n]);
        Shared {
            geometry: Geometry {
                logical_block: opts.logical_block,
                queues: opts.queues,
                queue_size,
                read_only: opts.read_only,
                discard: export.info().caps.discard != ucrypt_backend::Support::None,
            },
            capacity: std::sync::atomic::AtomicU64::new(export.info().size_bytes),
            export,
            serial,
            workers: opts.workers,
        }
    }

    /// The configuration space's bytes `[offset, offset + size)`, zeroes past its end.
    pub(crate) fn config(&self, offset: u32, size: u32) -> Vec<u8> {
        // Read at each request: a resized volume shows its new capacity.
        let space = self
            .geometry
            .config_space(self.capacity.load(Ordering::Acquire));
        let (offset, size) = (offset as usize, (size as usize).min(4096));
        let mut out = vec![0u8; size];
        if offset < CONFIG_LEN {
            let n = size.min(CONFIG_LEN - offset);
            out[..n].copy_from_slice(&space[offset..offset + n]);
        }
        out
    }
}

/// One piece of a request's descriptor chain.
#[derive(Debug, Clone, Copy)]
struct Piece {
    addr: GuestAddress,
    len: usize,
    device_writes: bool,
}

/// One request taken from a ring, with the memory it runs with; reused from request to
/// request (no allocation per request once warmed up).
#[derive(Default)]
struct Slot {
    head: u16,
    pieces: Vec<Piece>,
    bounce: Vec<u8>,
    /// The used length once it ran (data read plus the status byte; 0: malformed).
    used: u32,
}

impl Slot {
    /// Runs the request on `shared`'s export.
    fn run(&mut self, shared: &Shared, mem: &GuestMemoryMmap, ctx: IoCtx) {
        self.used = shared.request(mem, &self.pieces, &mut self.bounce, ctx);
    }
}

/// A queue thread's reusable state.
struct Scratch {
    /// Slots not in use.
    free: Vec<Slot>,
    /// The batch being run.
    batch: Vec<Slot>,
    /// Where helpers return this queue's slots once run.
    done_tx: mpsc::Sender<Slot>,
    done_rx: mpsc::Receiver<Slot>,
    /// The inflight region this queue last checked for resubmissions (held, so that a new
    /// one is never taken for it).
    checked: Option<Arc<Region>>,
    /// Requests taken from this queue so far: their order in the inflight region.
    counter: u64,
}

impl Scratch {
    fn new() -> Scratch {
        let (done_tx, done_rx) = mpsc::channel();
        Scratch {
            free: Vec::new(),
            batch: Vec::new(),
            done_tx,
            done_rx,
            checked: None,
            counter: 0,
        }
    }

    fn slot(&mut self) -> Slot {
        self.free.pop().unwrap_or_default()
    }
}

/// A request a queue thread hands to a helper, with everything it needs to run.
struct Job {
    shared: Arc<Shared>,
    mem: Arc<GuestMemoryMmap>,
    slot: Slot,
    ctx: IoCtx,
    done: mpsc::Sender<Slot>,
}

/// A connection's helper threads: each runs the requests queue threads hand it, one after
/// another, and returns each slot to its queue. They end when the connection is dropped
/// (the job channel closes).
struct Helpers {
    jobs: mpsc::Sender<Job>,
}

impl Helpers {
    /// Starts `n` helpers; `None` when `n` is 0 or no thread could be started (the queue
    /// threads then run every request themselves).
    fn start(n: usize) -> Option<Helpers> {
        let (jobs, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut started = 0;
        for i in 0..n {
            let rx = Arc::clone(&rx);
            let spawned = std::thread::Builder::new()
                .name(format!("ucrypt-vq-{i}"))
                .spawn(move || loop {
                    let job = rx
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .recv();
                    let Ok(mut job) = job else { return };
                    job.slot.run(&job.shared, &job.mem, job.ctx);
                    // The queue thread waits for every slot it handed out: it is there.
                    let _ = job.done.send(job.slot);
                });
            if spawned.is_ok() {
                started += 1;
            }
        }
        (started > 0).then_some(Helpers { jobs })
    }
}

/// The device as one VM connection sees it.
pub(crate) struct Conn {
    shared: Arc<Shared>,
    session: Arc<Session>,
    mem: RwLock<Option<Memory>>,
    event_idx: AtomicBool,
    /// One per queue thread.
    scratch: Vec<Mutex<Scratch>>,
    /// Threads that run requests beside the queue threads (none: one at a time per queue).
    helpers: Option<Helpers>,
    /// The read ends of the queue threads' exit eventfds: `vhost-user-backend` registers
    /// each in its epoll as a bare descriptor and never closes it (one leaked per queue per
    /// connection); [`Conn::close_exit_events`] does, once the daemon is gone.
    exit_fds: Mutex<Vec<std::os::fd::RawFd>>,
}

impl Conn {
    pub(crate) fn new(shared: Arc<Shared>, session: Arc<Session>) -> Conn {
        let queues = usize::from(shared.geometry.queues);
        let helpers = Helpers::start(shared.workers);
        Conn {
            shared,
            session,
            mem: RwLock::new(None),
            event_idx: AtomicBool::new(false),
            scratch: (0..queues).map(|_| Mutex::new(Scratch::new())).collect(),
            helpers,
            exit_fds: Mutex::default(),
        }
    }

    /// Closes the exit eventfds the library left open. Call only after the daemon was
    /// dropped (its queue threads joined, their epolls closed): nothing uses them then.
    pub(super) fn close_exit_events(&self) {
        let fds = std::mem::take(
            &mut *self
                .exit_fds
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for fd in fds {
            // SAFETY: a descriptor the library took over as a bare number and never
            // closes; its only user (the daemon's epoll) is gone, so closing it here
            // is its one close.
            drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
        }
    }

    /// Runs every request the driver has queued on `vring`, completing each as it
    /// finishes; `signal` tells the driver of used requests (vhost-user: the VM's call
    /// eventfd; VDUSE: the kernel's interrupt injection).
    pub(crate) fn process(
        &self,
        vring: &VringRwLock<Memory>,
        thread: usize,
        signal: &dyn Fn() -> io::Result<()>,
    ) -> io::Result<()> {
        let Some(atomic) = self
            .mem
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
        else {
            return Ok(()); // no memory table yet: nothing can be queued
        };
        let event_idx = self.event_idx.load(Ordering::Acquire);
        let mut scratch = self
            .scratch
            .get(thread)
            .ok_or_else(|| io::Error::other("queue thread out of range"))?
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let ctx = IoCtx {
            client: u32::try_from(thread).unwrap_or(u32::MAX).saturating_add(1),
        };
        let q = u16::try_from(thread).unwrap_or(u16::MAX);
        let region = self.session.inflight();
        if let Some(r) = &region {
            if !scratch.checked.as_ref().is_some_and(|c| Arc::ptr_eq(c, r)) {
                scratch.checked = Some(Arc::clone(r));
                self.resubmit(vring, r, q, &atomic.memory(), &mut scratch, ctx, signal)?;
            }
        }
        loop {
            if event_idx {
                vring.disable_notification().map_err(io::Error::other)?;
            }
            loop {
                let mem = atomic.memory();
                let limit = if self.helpers.is_some() { MAX_BATCH } else { 1 };
                while scratch.batch.len() < limit {
                    let chain = vring
                        .get_mut()
                        .get_queue_mut()
                        .pop_descriptor_chain(atomic.memory());
                    let Some(chain) = chain else { break };
                    let mut slot = scratch.slot();
                    slot.head = chain.head_index();
                    if let Some(r) = &region {
                        r.begin(q, slot.head, scratch.counter);
                        scratch.counter = scratch.counter.wrapping_add(1);
                    }
                    slot.pieces.clear();
                    slot.pieces.extend(chain.map(|d| Piece {
                        addr: d.addr(),
                        len: d.len() as usize,
                        device_writes: d.is_write_only(),
                    }));
                    scratch.batch.push(slot);
                }
                if scratch.batch.is_empty() {
                    break;
                }
                self.run_batch(vring, region.as_deref(), q, mem, &mut scratch, ctx)?;
                if vring.needs_notification().map_err(io::Error::other)? {
                    signal()?;
                }
            }
            // With event indexes the VM may have queued more after the last pop and
            // before notifications were back on: look again.
            if !event_idx || !vring.enable_notification().map_err(io::Error::other)? {
                return Ok(());
            }
        }
    }

    /// Runs the requests of `scratch.batch` and puts each in the used ring as it ends: the
    /// last one on this thread, the others on the helpers (or here too when there are none
    /// or they are gone). Returns once every one has ended, the slots back in
    /// `scratch.free`.
    fn run_batch(
        &self,
        vring: &VringRwLock<Memory>,
        region: Option<&Region>,
        q: u16,
        mem: vm_memory::GuestMemoryLoadGuard<GuestMemoryMmap>,
        scratch: &mut Scratch,
        ctx: IoCtx,
    ) -> io::Result<()> {
        let mut own = scratch.batch.pop();
        let mut handed = 0usize;
        let mut first_error = None;
        let mut finish = |slot: Slot, free: &mut Vec<Slot>| {
            if let Err(e) = complete(vring, region, q, slot.head, slot.used) {
                first_error.get_or_insert(e);
            }
            free.push(slot);
        };
        if let Some(helpers) = &self.helpers {
            let shared_mem = mem.clone().into_inner();
            while let Some(slot) = scratch.batch.pop() {
                let job = Job {
                    shared: Arc::clone(&self.shared),
                    mem: Arc::clone(&shared_mem),
                    slot,
                    ctx,
                    done: scratch.done_tx.clone(),
                };
                match helpers.jobs.send(job) {
                    Ok(()) => handed += 1,
                    Err(mpsc::SendError(mut job)) => {
                        job.slot.run(&self.shared, &mem, ctx);
                        finish(job.slot, &mut scratch.free);
                    }
                }
            }
        }
        while let Some(mut slot) = scratch.batch.pop() {
            slot.run(&self.shared, &mem, ctx);
            finish(slot, &mut scratch.free);
        }
        if let Some(mut slot) = own.take() {
            slot.run(&self.shared, &mem, ctx);
            finish(slot, &mut scratch.free);
        }
        for _ in 0..handed {
            match scratch.done_rx.recv() {
                Ok(slot) => finish(slot, &mut scratch.free),
                // Unreachable while this thread holds a sender; never wait forever.
                Err(mpsc::RecvError) => break,
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// A queue's first run with inflight region `r`: the requests it holds as taken and not
    /// completed (a dead server's) run again, oldest first, and the available ring goes on
    /// after them.
    #[allow(clippy::too_many_arguments)]
    fn resubmit(
        &self,
        vring: &VringRwLock<Memory>,
        r: &Region,
        q: u16,
        mem: &GuestMemoryMmap,
        scratch: &mut Scratch,
        ctx: IoCtx,
        signal: &dyn Fn() -> io::Result<()>,
    ) -> io::Result<()> {
        let ring_used = vring.queue_used_idx().map_err(io::Error::other)?;
        let (heads, next) = r.resubmissions(q, ring_used);
        scratch.counter = next;
        if heads.is_empty() {
            return Ok(());
        }
        // Everything taken is either in the used ring or marked, whatever the order of
        // completion was.
        vring.set_queue_next_avail(ring_used.wrapping_add(heads.len() as u16));
        let (table, size) = {
            let state = vring.get_ref();
            let queue = state.get_queue();
            (GuestAddress(queue.desc_table()), queue.size())
        };
        let mut slot = scratch.slot();
        for head in heads {
            slot.pieces.clear();
            slot.used = 0;
            if chain_at(mem, table, size, head, &mut slot.pieces).is_some() {
                slot.run(&self.shared, mem, ctx);
            }
            complete(vring, Some(r), q, head, slot.used)?;
        }
        scratch.free.push(slot);
        if vring.needs_notification().map_err(io::Error::other)? {
            signal()?;
        }
        Ok(())
    }
}

impl Shared {
    /// Runs one request; returns the bytes written into the VM's buffers (the used
    /// length: data read plus the status byte).
    fn request(
        &self,
        mem: &GuestMemoryMmap,
        pieces: &[Piece],
        bounce: &mut Vec<u8>,
        ctx: IoCtx,
    ) -> u32 {
        let total: usize = pieces.iter().map(|p| p.len).sum();
        // A header, a status byte, and in between the data.
        if total < HEADER + 1 {
            return 0;
        }
        let status_at = total - 1;
        let mut header = [0u8; HEADER];
        if !window(pieces, status_at, 1).all(|p| p.device_writes)
            || !window(pieces, 0, HEADER).all(|p| !p.device_writes)
            || gather(mem, pieces, 0, &mut header).is_err()
        {
            return 0; // malformed: nothing we could answer through
        }
        let kind = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        let sector = u64::from_le_bytes(header[8..16].try_into().unwrap_or([0; 8]));
        let data_len = status_at - HEADER;
        let (status, written) = self.run(mem, pieces, bounce, kind, sector, data_len, ctx);
        let status_addr = window(pieces, status_at, 1).next().map(|p| p.addr);
        if let Some(a) = status_addr {
            let _ = mem.write_slice(&[status], a);
        }
        u32::try_from(written + 1).unwrap_or(u32::MAX)
    }

    /// The request's status and how many data bytes it wrote into the VM's memory.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        mem: &GuestMemoryMmap,
        pieces: &[Piece],
        bounce: &mut Vec<u8>,
        kind: u32,
        sector: u64,
        len: usize,
        ctx: IoCtx,
    ) -> (u8, usize) {
        let export = &*self.export;
        let geometry = &self.geometry;
        let data_dir_ok = |device_writes: bool| {
            window(pieces, HEADER, len).all(|p| p.device_writes == device_writes)
        };
        let size = export.info().size_bytes;
        let in_range = |offset: u64, n: u64| offset.checked_add(n).is_some_and(|end| end <= size);
        let status = |r: Result<(), BackendError>| match r {
            Ok(()) => VIRTIO_BLK_S_OK as u8,
            Err(BackendError::Unsupported(_)) => VIRTIO_BLK_S_UNSUPP as u8,
            Err(_) => VIRTIO_BLK_S_IOERR as u8,
        };
        let ioerr = (VIRTIO_BLK_S_IOERR as u8, 0);
        match kind {
            VIRTIO_BLK_T_IN | VIRTIO_BLK_T_OUT => {
                let read = kind == VIRTIO_BLK_T_IN;
                let Some(offset) = sector.checked_mul(512) else {
                    return ioerr;
                };
                if len % 512 != 0
                    || len > MAX_DATA_BYTES
                    || !in_range(offset, len as u64)
                    || !data_dir_ok(read)
                    || (!read && geometry.read_only)
                {
                    return ioerr;
                }
                let r = if read {
                    read_into(mem, pieces, bounce, len, |buf| {
                        export.submit(Io::read(buf, offset).ctx(ctx))
                    })
                } else {
                    // Never encrypted in place: the buffer is the VM's.
                    write_from(mem, pieces, bounce, len, |buf| {
                        export.submit(Io::write(buf, offset).ctx(ctx))
                    })
                };
                let r = match r {
                    Ok(()) => Ok(()),
                    Err(Failed::Backend(e)) => Err(e),
                    Err(Failed::Memory) => return ioerr,
                };
                (status(r), if read { len } else { 0 })
            }
            VIRTIO_BLK_T_FLUSH => (status(export.flush()), 0),
            VIRTIO_BLK_T_GET_ID => {
                let n = len.min(self.serial.len());
                if !data_dir_ok(true) || scatter(mem, pieces, HEADER, &self.serial[..n]).is_err() {
                    return ioerr;
                }
                (VIRTIO_BLK_S_OK as u8, n)
            }
            VIRTIO_BLK_T_DISCARD | VIRTIO_BLK_T_WRITE_ZEROES => {
                let discard = kind == VIRTIO_BLK_T_DISCARD;
                if geometry.read_only || (discard && !geometry.discard) {
                    return (VIRTIO_BLK_S_UNSUPP as u8, 0);
                }
                if len == 0
                    || len % ZERO_SEGMENT != 0
                    || len / ZERO_SEGMENT > MAX_ZERO_SEGMENTS as usize
                    || !data_dir_ok(false)
                {
                    return ioerr;
                }
                let mut seg = [0u8; ZERO_SEGMENT];
                for i in 0..len / ZERO_SEGMENT {
                    if gather(mem, pieces, HEADER + i * ZERO_SEGMENT, &mut seg).is_err() {
                        return ioerr;
                    }
                    let start = u64::from_le_bytes(seg[0..8].try_into().unwrap_or([0; 8]));
                    let count = u32::from_le_bytes(seg[8..12].try_into().unwrap_or([0; 4]));
                    let flags = u32::from_le_bytes(seg[12..16].try_into().unwrap_or([0; 4]));
                    // Bit 0 is "unmap" for write-zeroes (allowed, and ignored: a zeroed
                    // range is always written) and reserved for discard.
                    if flags & !u32::from(!discard) != 0 {
                        return (VIRTIO_BLK_S_UNSUPP as u8, 0);
                    }
                    let (Some(offset), bytes) = (start.checked_mul(512), u64::from(count) * 512)
                    else {
                        return ioerr;
                    };
                    if count > MAX_ZERO_SECTORS || !in_range(offset, bytes) {
                        return ioerr;
                    }
                    let r = if discard {
                        emulate::discard(export, offset, bytes, false)
                    } else {
                        emulate::write_zeroes(export, offset, bytes, false, ctx)
                    };
                    if r.is_err() {
                        return (status(r), 0);
                    }
                }
                (VIRTIO_BLK_S_OK as u8, 0)
            }
            _ => (VIRTIO_BLK_S_UNSUPP as u8, 0),
        }
    }
}

/// Puts request `head` in the used ring, the inflight region kept in step. The caller
/// notifies the driver afterwards if it asked to be (`needs_notification`).
fn complete(
    vring: &VringRwLock<Memory>,
    region: Option<&Region>,
    q: u16,
    head: u16,
    used: u32,
) -> io::Result<()> {
    if let Some(r) = region {
        r.completing(q, head);
    }
    vring.add_used(head, used).map_err(io::Error::other)?;
    if let Some(r) = region {
        r.completed(q, head, vring.get_ref().get_queue().next_used());
    }
    Ok(())
}

/// The pieces of the descriptor chain whose head is `head` in the descriptor table at
/// `table` of `size` entries, indirect tables followed (virtio 1.2, 2.7.5). For
/// resubmissions: the queue library hands out chains only as it pops them.
fn chain_at(
    mem: &GuestMemoryMmap,
    table: GuestAddress,
    size: u16,
    head: u16,
    out: &mut Vec<Piece>,
) -> Option<()> {
    const DESC: u64 = std::mem::size_of::<Descriptor>() as u64;
    let (mut table, mut size, mut i, mut ttl, mut indirect) = (table, size, head, size, false);
    loop {
        if i >= size || ttl == 0 {
            return None;
        }
        let d: Descriptor = mem.read_obj(table.checked_add(u64::from(i) * DESC)?).ok()?;
        if d.refers_to_indirect_table() {
            if indirect || u64::from(d.len()) % DESC != 0 {
                return None;
            }
            table = d.addr();
            size = u16::try_from(u64::from(d.len()) / DESC).ok()?;
            (i, ttl, indirect) = (0, size, true);
            continue;
        }
        out.push(Piece {
            addr: d.addr(),
            len: d.len() as usize,
            device_writes: d.is_write_only(),
        });
        if !d.has_next() {
            return Some(());
        }
        i = d.next();
        ttl -= 1;
    }
}

/// Why a read or write failed: the export, or the VM's memory (a buffer outside it).
enum Failed {
    Backend(BackendError),
    Memory,
}

impl From<BackendError> for Failed {
    fn from(e: BackendError) -> Failed {
        Failed::Backend(e)
    }
}

/// The pieces covering bytes `[from, from + len)` of the chain, cut to that window.
fn window(pieces: &[Piece], from: usize, len: usize) -> impl Iterator<Item = Piece> + '_ {
    let end = from + len;
    let mut pos = 0usize;
    pieces.iter().filter_map(move |p| {
        let (start, stop) = (pos, pos + p.len);
        pos = stop;
        let (a, b) = (start.max(from), stop.min(end));
        (a < b).then(|| Piece {
            addr: p.addr.unchecked_add((a - start) as u64),
            len: b - a,
            device_writes: p.device_writes,
        })
    })
}

/// Copies bytes `[from, from + out.len())` of the chain out of the VM's memory.
fn gather(
    mem: &GuestMemoryMmap,
    pieces: &[Piece],
    from: usize,
    out: &mut [u8],
) -> Result<(), vm_memory::GuestMemoryError> {
    let mut at = 0;
    for p in window(pieces, from, out.len()) {
        mem.read_slice(&mut out[at..at + p.len], p.addr)?;
        at += p.len;
    }
    Ok(())
}

/// Copies `data` into bytes `[from, from + data.len())` of the chain.
fn scatter(
    mem: &GuestMemoryMmap,
    pieces: &[Piece],
    from: usize,
    data: &[u8],
) -> Result<(), vm_memory::GuestMemoryError> {
    let mut at = 0;
    for p in window(pieces, from, data.len()) {
        mem.write_slice(&data[at..at + p.len], p.addr)?;
        at += p.len;
    }
    Ok(())
}

/// The data window as one slice of the VM's memory, when it is one piece inside one
/// region.
fn direct(mem: &GuestMemoryMmap, pieces: &[Piece], len: usize) -> Option<(*mut u8, usize)> {
    let mut w = window(pieces, HEADER, len);
    let p = w.next()?;
    if w.next().is_some() || p.len != len {
        return None;
    }
    let slice = mem.get_slice(p.addr, len).ok()?;
    (slice.len() == len).then(|| (slice.ptr_guard_mut().as_ptr(), len))
}

/// Runs `f` on a buffer that ends up in the request's data window: the VM's memory
/// itself when possible, else the bounce buffer, scattered afterwards.
fn read_into(
    mem: &GuestMemoryMmap,
    pieces: &[Piece],
    bounce: &mut Vec<u8>,
    len: usize,
    f: impl FnOnce(&mut [u8]) -> Result<(), BackendError>,
) -> Result<(), Failed> {
    if let Some((ptr, n)) = direct(mem, pieces, len) {
        // SAFETY: `get_slice` checked that [ptr, ptr + n) lies inside one mapped region
        // of the VM's memory, which stays mapped while `mem` (a load guard of the memory
        // table) lives, i.e. for this call. The VM handed this buffer to the device until
        // the request completes, as with DMA: it does not touch it meanwhile, and if it
        // did, only the bytes of its own request would be affected.
        let buf = unsafe { std::slice::from_raw_parts_mut(ptr, n) };
        return Ok(f(buf)?);
    }
    bounce.resize(len, 0);
    f(&mut bounce[..len])?;
    scatter(mem, pieces, HEADER, &bounce[..len]).map_err(|_| Failed::Memory)
}

/// Runs `f` on the request's data window as one buffer: the VM's memory itself when
/// possible, else gathered into the bounce buffer.
fn write_from(
    mem: &GuestMemoryMmap,
    pieces: &[Piece],
    bounce: &mut Vec<u8>,
    len: usize,
    f: impl FnOnce(&[u8]) -> Result<(), BackendError>,
) -> Result<(), Failed> {
    if let Some((ptr, n)) = direct(mem, pieces, len) {
        // SAFETY: as in `read_into`; the slice is only read (the export encrypts into a
        // buffer of its own).
        let buf = unsafe { std::slice::from_raw_parts(ptr.cast_const(), n) };
        return Ok(f(buf)?);
    }
    bounce.resize(len, 0);
    gather(mem, pieces, HEADER, &mut bounce[..len]).map_err(|_| Failed::Memory)?;
    Ok(f(&bounce[..len])?)
}

impl VhostUserBackend for Conn {
    type Bitmap = ();
    type Vring = VringRwLock<Memory>;

    fn num_queues(&self) -> usize {
        usize::from(self.shared.geometry.queues)
    }

    fn max_queue_size(&self) -> usize {
        usize::from(MAX_QUEUE_SIZE)
    }

    fn features(&self) -> u64 {
        self.shared.geometry.features()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        Geometry::protocol_features()
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Release);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        self.shared.config(offset, size)
    }

    fn update_memory(&self, mem: Memory) -> io::Result<()> {
        *self
            .mem
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(mem);
        Ok(())
    }

    /// One thread per queue: the queues of a multi-queue VM run side by side.
    fn queues_per_thread(&self) -> Vec<u64> {
        (0..self.shared.geometry.queues)
            .map(|q| 1u64 << q)
            .collect()
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        let pair =
            new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC).ok()?;
        self.exit_fds
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(std::os::fd::AsRawFd::as_raw_fd(&pair.0));
        Some(pair)
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[VringRwLock<Memory>],
        thread_id: usize,
    ) -> io::Result<()> {
        if evset != EventSet::IN {
            return Err(io::Error::other(format!(
                "unexpected queue event {evset:?}"
            )));
        }
        match vrings.get(usize::from(device_event)) {
            Some(vring) => self.process(vring, thread_id, &|| vring.signal_used_queue()),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    //! A queue driven by hand: rings written into a guest memory of our own, requests run
    //! by [`Conn::process`] as a VM's kick would run them.
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::sync::atomic::AtomicUsize;
    use ucrypt_backend::{BackendInfo, MemoryBackend};
    use vhost_user_backend::VringT;

    const SIZE: u16 = 256;
    const DESC: u64 = 0x1000;
    const AVAIL: u64 = 0x3000;
    const USED: u64 = 0x4000;
    const HEADERS: u64 = 0x10000;
    const DATA: u64 = 0x100000;

    /// A memory backend that counts the requests running at once, each taking a while.
    struct Counting {
        inner: MemoryBackend,
        now: AtomicUsize,
        max: AtomicUsize,
    }

    impl Backend for Counting {
        fn info(&self) -> &BackendInfo {
            self.inner.info()
        }
        fn submit(&self, io: Io<'_>) -> Result<(), BackendError> {
            let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.max.fetch_max(n, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(3));
            let r = self.inner.submit(io);
            self.now.fetch_sub(1, Ordering::SeqCst);
            r
        }
        fn flush(&self) -> Result<(), BackendError> {
            self.inner.flush()
        }
    }
    use ucrypt_backend::Backend;

    fn desc(mem: &GuestMemoryMmap, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let at = GuestAddress(DESC + u64::from(i) * 16);
        mem.write_obj(addr, at).unwrap();
        mem.write_obj(len, at.unchecked_add(8)).unwrap();
        mem.write_obj(flags, at.unchecked_add(12)).unwrap();
        mem.write_obj(next, at.unchecked_add(14)).unwrap();
    }

    /// Queues request `r` (reads of 4 KiB at even `r`, writes at odd) as chain `3r`.
    fn queue(mem: &GuestMemoryMmap, r: u16, avail_idx: u16) {
        const NEXT: u16 = 1;
        const WRITE: u16 = 2;
        let read = r % 2 == 0;
        let head = 3 * r;
        let hdr = HEADERS + u64::from(r) * 32;
        let kind = if read {
            VIRTIO_BLK_T_IN
        } else {
            VIRTIO_BLK_T_OUT
        };
        mem.write_obj(kind, GuestAddress(hdr)).unwrap();
        mem.write_obj(0u32, GuestAddress(hdr + 4)).unwrap();
        mem.write_obj(u64::from(r) * 8, GuestAddress(hdr + 8))
            .unwrap();
        mem.write_obj(0xffu8, GuestAddress(hdr + 16)).unwrap();
        let data = DATA + u64::from(r) * 4096;
        if !read {
            mem.write_slice(&[r as u8 ^ 0x5a; 4096], GuestAddress(data))
                .unwrap();
        }
        desc(mem, head, hdr, 16, NEXT, head + 1);
        desc(
            mem,
            head + 1,
            data,
            4096,
            NEXT | if read { WRITE } else { 0 },
            head + 2,
        );
        desc(mem, head + 2, hdr + 16, 1, WRITE, 0);
        let slot = GuestAddress(AVAIL + 4 + u64::from(avail_idx % SIZE) * 2);
        mem.write_obj(head, slot).unwrap();
    }

    /// Runs `n` requests (a backend pre-filled with a pattern) through one `process` call
    /// with `workers` helpers; returns the most requests the backend ran at once and how
    /// often the driver was notified, after checking every request's answer.
    fn run(workers: usize, n: u16) -> (usize, usize) {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 4 << 20)]).unwrap();
        let backend = Arc::new(Counting {
            inner: MemoryBackend::new(1 << 20).unwrap(),
            now: AtomicUsize::new(0),
            max: AtomicUsize::new(0),
        });
        let pattern: Vec<u8> = (0..1u32 << 20).map(|i| (i / 4096) as u8).collect();
        backend.inner.write_at(&pattern, 0, false).unwrap();
        let opts = crate::AttachOptions {
            name: "t".into(),
            read_only: false,
            logical_block: 512,
            queues: 1,
            queue_depth: 128,
            workers,
        };
        let export: crate::Export = backend.clone();
        let shared = Arc::new(Shared::new(export, &opts, SIZE));
        let conn = Conn::new(shared, Arc::new(Session::default()));
        let atomic = GuestMemoryAtomic::new(mem.clone());
        conn.update_memory(atomic.clone()).unwrap();
        let vring = VringRwLock::new(atomic, SIZE).unwrap();
        vring.set_queue_size(SIZE);
        vring.set_queue_info(DESC, AVAIL, USED).unwrap();
        vring.set_queue_ready(true);
        vring.set_enabled(true);
        for r in 0..n {
            queue(&mem, r, r);
        }
        mem.write_obj(n, GuestAddress(AVAIL + 2)).unwrap();
        let signals = AtomicUsize::new(0);
        conn.process(&vring, 0, &|| {
            signals.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
        let used_idx: u16 = mem.read_obj(GuestAddress(USED + 2)).unwrap();
        assert_eq!(used_idx, n, "every request is in the used ring");
        let mut heads: Vec<u32> = (0..n)
            .map(|i| {
                mem.read_obj(GuestAddress(USED + 4 + u64::from(i) * 8))
                    .unwrap()
            })
            .collect();
        heads.sort_unstable();
        let want: Vec<u32> = (0..u32::from(n)).map(|r| 3 * r).collect();
        assert_eq!(heads, want, "each request completed exactly once");
        for r in 0..n {
            let status: u8 = mem
                .read_obj(GuestAddress(HEADERS + u64::from(r) * 32 + 16))
                .unwrap();
            assert_eq!(status, VIRTIO_BLK_S_OK as u8, "request {r}");
            let mut got = vec![0u8; 4096];
            if r % 2 == 0 {
                mem.read_slice(&mut got, GuestAddress(DATA + u64::from(r) * 4096))
                    .unwrap();
                assert!(got.iter().all(|&b| b == r as u8), "read {r}");
            } else {
                backend
                    .inner
                    .read_at(&mut got, u64::from(r) * 4096)
                    .unwrap();
                assert!(got.iter().all(|&b| b == r as u8 ^ 0x5a), "write {r}");
            }
        }
        (
            backend.max.load(Ordering::SeqCst),
            signals.load(Ordering::SeqCst),
        )
    }

    #[test]
    fn without_helpers_a_queue_runs_one_request_at_a_time() {
        let (max, signals) = run(0, 40);
        assert_eq!(max, 1);
        assert_eq!(signals, 40, "each completion notifies the driver");
    }

    #[test]
    fn helpers_keep_a_batch_in_flight_and_notify_once_per_batch() {
        let (max, signals) = run(4, 40);
        // Up to four helpers and the queue thread at once (fewer when a helper wakes late).
        assert!((2..=5).contains(&max), "{max} requests at once");
        assert_eq!(signals, 2, "40 requests: batches of 32 and 8");
    }
}
