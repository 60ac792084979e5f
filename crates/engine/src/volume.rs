//! [`Volume`]: the plaintext view of a dm-crypt mapping over a backend.
//!
//! Mirrors what `crypt_map` does for one bio: positions are relative to the mapping
//! (`dm_target_offset`), ciphertext lives at `data_offset + position` on the device
//! (`cc->start`), and the IV numbering is the cipher's business. Where the crypto of a
//! request runs is decided in one function, [`Volume::placement`].

use crate::handoff::HandOff;
use crate::options::{EngineOptions, Placement};
use crate::pool::{BufferPool, Segment};
use crate::rangelock::RangeLocks;
use crate::request::Completion;
use crate::split::{split, Partial};
use crate::stats::{ClientStats, Stats};
use crate::submit::{Batch, SubmitterThread};
use crate::workers::{Inspect, Job, JobKind, RecryptIo, Workers};
use crate::EngineError;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use ucrypt_backend::{
    check_range, emulate, AsyncIo, AsyncOp, Backend, BackendError, BackendInfo, Caps, Hints, Io,
    IoCtx, IoKind, Support, WriteOp,
};
use ucrypt_crypto::{Sector512, SectorCipher};

/// Where the mapping sits on the backend and what it allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeConfig {
    /// Where the ciphertext starts on the backend, in bytes (table `offset` × 512).
    pub data_offset_bytes: u64,
    /// Plaintext size in bytes (table `length` × 512).
    pub length_bytes: u64,
    /// Refuse writes.
    pub read_only: bool,
    /// Pass discards down (dm-crypt `allow_discards`).
    pub allow_discards: bool,
}

/// Zeros written per call by `write_zeroes` (encrypted like any data, never a hole): a
/// shared static, so a request allocates nothing (it allocated up to 1 MiB per request);
/// the chunks are copied into pool buffers for encryption either way.
static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];

/// Jobs handed to workers per round (bounds the stack array; 64 × 128 KiB = 8 MiB).
const JOBS_PER_ROUND: usize = 64;

/// Requests this small are not counted in flight under the automatic policy (see
/// `Volume::enter`).
const UNCOUNTED_BELOW: usize = 32 * 1024;

/// Decrements the in-flight count when a request ends.
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Where [`Volume::recrypt_range`] leaves the new ciphertext.
pub enum RecryptOut<'a> {
    /// In `out` (as long as the range). With `keep` (as long too), the old ciphertext is
    /// read into `keep` and stays there; without, it is read into `out` and re-encrypted
    /// in place.
    Buffer {
        /// The new ciphertext.
        out: &'a mut [u8],
        /// The old ciphertext, if it is to be kept.
        keep: Option<&'a mut [u8]>,
    },
    /// Written back to the backend at this byte offset (the range's first byte), chunk by
    /// chunk through the volume's buffer pool: nothing of the range is kept.
    Write(u64),
}

/// One range for [`Volume::recrypt_range`].
pub struct RecryptRange<'a> {
    /// The cipher the plaintext is encrypted with.
    pub new: &'a (dyn SectorCipher + 'static),
    /// Position (IV) of the range's first byte, as for this volume's cipher.
    pub pos: u64,
    /// Bytes.
    pub len: usize,
    /// Backend byte offset of the range's old ciphertext (absolute: reencryption reads
    /// where no mapping says, a data shift below its destination).
    pub read_at: u64,
    /// Where the new ciphertext goes.
    pub out: RecryptOut<'a>,
    /// Sees every chunk's old ciphertext first: (its offset in the range, the bytes), on
    /// the thread that holds the chunk.
    pub inspect: Option<&'a Inspect<'a>>,
    /// Whether the calling thread works on chunks too (else it only waits, so that the
    /// workers' lower priority applies to all of the crypto, see
    /// [`EngineOptions::worker_nice`]).
    pub help: bool,
}

/// The decrypted view of a backend; itself a [`Backend`].
pub struct Volume {
    cipher: Arc<dyn SectorCipher>,
    backend: Arc<dyn Backend>,
    cfg: VolumeConfig,
    opts: EngineOptions,
    info: BackendInfo,
    sector_bytes: u64,
    /// Shared with asynchronous requests' completions, which release their range there.
    locks: Arc<RangeLocks>,
    pool: BufferPool,
    // Drop order matters: workers (which may hand batches to the submitter) stop first.
    workers: Option<Workers>,
    submitter: Option<SubmitterThread>,
    inflight: AtomicUsize,
    stats: Stats,
    /// Whether the backend lends reads in place ([`Backend::read_with`]); asked once, so
    /// a backend that never does (memory, zero, remote) costs reads nothing for it.
    lends_reads: bool,
    /// The backend's calls are atomic over stretches that hold whole sectors of this
    /// volume ([`Hints::atomic_unit`](ucrypt_backend::Hints::atomic_unit)), and it lends no reads: its own locking already
    /// keeps every sector whole for readers and writers, so this volume takes no range
    /// locks, and a partial-sector write merges inside [`Backend::modify_at`].
    atomic: bool,
    /// Whether the backend takes asynchronous requests ([`ucrypt_backend::Hints::async_submit`]).
    async_lower: bool,
    /// The cipher leaves data as it is ([`SectorCipher::is_identity`]): the automatic
    /// placement runs every request inline.
    identity: bool,
}

impl Volume {
    /// Builds the view with the default engine options. Nothing outside
    /// `[data_offset, data_offset + length)` of the backend is ever read or written.
    ///
    /// # Errors
    /// As [`Volume::with_options`].
    pub fn new(
        cipher: Arc<dyn SectorCipher>,
        backend: Arc<dyn Backend>,
        cfg: VolumeConfig,
    ) -> Result<Self, EngineError> {
        Self::with_options(cipher, backend, cfg, EngineOptions::default())
    }

    /// Builds the view with explicit engine options.
    ///
    /// # Errors
    /// [`EngineError::TooSmall`] if the mapping does not fit the backend,
    /// [`EngineError::Misaligned`] if offset or length are not whole sectors,
    /// [`EngineError::Pool`] if the buffer pool cannot be allocated.
    pub fn with_options(
        cipher: Arc<dyn SectorCipher>,
        backend: Arc<dyn Backend>,
        cfg: VolumeConfig,
        mut opts: EngineOptions,
    ) -> Result<Self, EngineError> {
        let ss = cipher.sector_size();
        let sector_bytes = u64::from(ss.bytes());
        for (what, value) in [
            ("length", cfg.length_bytes),
            ("data offset", cfg.data_offset_bytes),
        ] {
            if value % sector_bytes != 0 {
                return Err(EngineError::Misaligned {
                    what,
                    value,
                    sector_size: ss.bytes(),
                });
            }
        }
        let device = backend.info().size_bytes;
        if cfg
            .data_offset_bytes
            .checked_add(cfg.length_bytes)
            .is_none_or(|end| end > device)
        {
            return Err(EngineError::TooSmall {
                offset: cfg.data_offset_bytes,
                length: cfg.length_bytes,
                device,
            });
        }
        // Chunks and buffers hold whole sectors.
        opts.split_bytes = opts.split_bytes.max(ss.len()).next_multiple_of(ss.len());
        opts.pool.buffer_bytes = opts
            .pool
            .buffer_bytes
            .max(ss.len())
            .next_multiple_of(ss.len());
        let pool = BufferPool::new(opts.pool).map_err(EngineError::Pool)?;
        let lower = backend.info().clone();
        let discard = if cfg.allow_discards && lower.caps.discard != Support::None {
            lower.caps.discard
        } else {
            Support::None
        };
        let info = BackendInfo {
            size_bytes: cfg.length_bytes,
            logical_block: ss.bytes().max(lower.logical_block),
            physical_block: ss.bytes().max(lower.physical_block),
            optimal_block: ss.bytes().max(lower.optimal_block),
            caps: Caps {
                flush: lower.caps.flush,
                discard,
                write_zeroes: Support::Emulate,
                read_only: cfg.read_only || lower.caps.read_only,
            },
        };
        let submitter = (opts.needs_workers() && !opts.submit_from_crypt_cpus)
            .then(|| SubmitterThread::start(Arc::clone(&backend), opts.write_order));
        let workers = opts.needs_workers().then(|| {
            Workers::start(
                opts.workers,
                opts.same_cpu_crypt && opts.auto.is_none(),
                Arc::clone(&cipher),
                Arc::clone(&backend),
                submitter.as_ref().map(|s| Arc::clone(&s.shared)),
                opts.worker_nice,
            )
        });
        let lends_reads = backend.read_with(0, 0, &mut |_| {}).is_some();
        Ok(Volume {
            identity: cipher.is_identity(),
            cipher,
            cfg,
            opts,
            info,
            sector_bytes,
            locks: Arc::new(RangeLocks::default()),
            pool,
            workers,
            submitter,
            inflight: AtomicUsize::new(0),
            stats: Stats::new(),
            lends_reads,
            atomic: !lends_reads
                && backend
                    .hints()
                    .atomic_unit
                    .is_some_and(|u| u >= sector_bytes && u % sector_bytes == 0),
            async_lower: backend.hints().async_submit,
            backend,
        })
    }

    /// Whether this volume serialises its own requests with range locks (the rangelock
    /// module); `false` when the backend's calls are atomic per sector already
    /// ([`Hints::atomic_unit`](ucrypt_backend::Hints::atomic_unit)).
    pub fn range_locked(&self) -> bool {
        !self.atomic
    }

    /// The sector cipher.
    pub fn cipher(&self) -> &Arc<dyn SectorCipher> {
        &self.cipher
    }

    /// The backend holding the ciphertext.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The engine options in force.
    pub fn options(&self) -> &EngineOptions {
        &self.opts
    }

    /// Per-client request counters.
    pub fn client_stats(&self) -> Vec<ClientStats> {
        self.stats.snapshot()
    }

    /// How often a writer waited for a pool buffer (backpressure events).
    pub fn pool_waits(&self) -> u64 {
        self.pool.waits()
    }

    /// Where this request's crypto runs: the one place that decides.
    pub fn placement(&self, write: bool, len: usize, inflight: usize) -> Placement {
        let Some(workers) = &self.workers else {
            return Placement::Inline;
        };
        if let Some(auto) = self.opts.auto {
            // cipher_null: no crypto to spread; a split would only add wake-ups (and, for a
            // write, a copy into pool buffers). BENCHMARKING.md, kernel lab 2026-12-03. An
            // explicit placement (the kernel's workqueues) is still honoured: the
            // `cloudflare` experiment measures exactly that hand-off.
            if self.identity {
                return Placement::Inline;
            }
            // Split across workers only when it adds CPUs: a large request and fewer
            // requests in flight than workers; otherwise the receiving thread is as good a
            // CPU as any and handing off only adds latency (seed 000).
            return if len >= auto.split_min_bytes && inflight < workers.len() {
                Placement::Split
            } else {
                Placement::Inline
            };
        }
        let inline = if write {
            self.opts.no_write_workqueue
        } else {
            self.opts.no_read_workqueue
        };
        if inline {
            Placement::Inline
        } else {
            Placement::Workers
        }
    }

    /// Whether a waiting issuer should spin: not when its work runs on its own CPU
    /// (same_cpu_crypt), and not when more requests are in flight than CPUs (the spinning
    /// would take CPU time from the workers).
    fn spin(&self) -> bool {
        let depth = self.inflight.load(Ordering::Relaxed);
        !self.opts.same_cpu_crypt && depth <= self.workers.as_ref().map_or(0, Workers::len)
    }

    fn lower(&self, pos: u64) -> u64 {
        self.cfg.data_offset_bytes + pos
    }

    /// Counts the request in flight (only when placement depends on it: with workers).
    /// Under the automatic policy requests below [`UNCOUNTED_BELOW`] are not counted: they
    /// always run inline and never wait for a worker, and the shared counter's two atomic
    /// operations cost 3 % of a 4 KiB null-cipher read at depth 1 and 15 % at depth 32
    /// (`ucrypt bench cloudflare`, cache-line bouncing between CPUs). A large request then
    /// sees the large ones in flight, which hold CPUs for long enough to matter.
    fn enter(&self, len: usize) -> (Option<InFlight<'_>>, usize) {
        let uncounted = match self.opts.auto {
            Some(a) => len < UNCOUNTED_BELOW.min(a.split_min_bytes),
            // Both workqueues off: every request runs inline, nobody waits for a worker,
            // so nobody reads the count.
            None => self.opts.no_read_workqueue && self.opts.no_write_workqueue,
        };
        if self.workers.is_none() || uncounted {
            return (None, 1);
        }
        let n = self.inflight.fetch_add(1, Ordering::Relaxed) + 1;
        (Some(InFlight(&self.inflight)), n)
    }

    /// Decrypts whole sectors at position `pos` in place, where the placement says.
    fn decrypt(&self, pos: u64, data: &mut [u8], place: Placement) -> Result<(), BackendError> {
        self.crypt(pos, data, place, false)
    }

    /// Encrypts (`encrypt`) or decrypts whole sectors in place where the placement says:
    /// inline, or in chunks on the workers (with this thread helping when split).
    fn crypt(
        &self,
        pos: u64,
        data: &mut [u8],
        place: Placement,
        encrypt: bool,
    ) -> Result<(), BackendError> {
        let workers = match (&self.workers, place) {
            (Some(w), Placement::Workers | Placement::Split) => w,
            _ if encrypt => {
                self.cipher.encrypt(Sector512::from_bytes_floor(pos), data);
                return Ok(());
            }
            _ => {
                self.cipher.decrypt(Sector512::from_bytes_floor(pos), data);
                return Ok(());
            }
        };
        let split = self.opts.split_bytes;
        for (r, group) in data.chunks_mut(split * JOBS_PER_ROUND).enumerate() {
            let base = pos + (r * split * JOBS_PER_ROUND) as u64;
            let n = group.len().div_ceil(split);
            let completion = Completion::new(n);
            let mut hand_off = HandOff::new(&completion, n);
            let mut jobs = [EMPTY_JOB; JOBS_PER_ROUND];
            for (i, chunk) in group.chunks_mut(split).enumerate() {
                let completion = &completion;
                jobs[i] = Job {
                    kind: if encrypt {
                        JobKind::Encrypt { completion }
                    } else {
                        JobKind::Decrypt { completion }
                    },
                    first: Sector512::from_bytes_floor(base + (i * split) as u64),
                    ptr: chunk.as_mut_ptr(),
                    len: chunk.len(),
                };
            }
            workers.submit(&jobs[..n]);
            hand_off.sent(n);
            // Waiting here is what keeps `group` and `completion` alive for the workers.
            if place == Placement::Split {
                workers.help_until(&completion)?;
            } else {
                completion.wait(self.spin())?;
            }
        }
        Ok(())
    }

    /// Re-encrypts whole sectors in place, without I/O: `buf` holds this volume's
    /// ciphertext of position `pos`, decrypted with this volume's cipher and encrypted with
    /// `new` at the same position (`new`'s own IV offset applies). Each chunk is decrypted
    /// and encrypted while it is in one core's cache, on the worker pool with this thread
    /// helping (inline without workers). `inspect`, if given, first sees every chunk's old
    /// bytes (its offset in `buf`, the bytes) on the thread that holds the chunk.
    ///
    /// For reencryption, which reads and writes itself: its writes are ordered against
    /// its own metadata (resilience data, header), which no volume request knows of.
    ///
    /// # Errors
    /// [`BackendError::Misaligned`] if `pos` or `buf` are not whole sectors; a crypto
    /// worker's panic.
    pub fn recrypt_in_place(
        &self,
        new: &(dyn SectorCipher + 'static),
        pos: u64,
        buf: &mut [u8],
        inspect: Option<&Inspect<'_>>,
    ) -> Result<(), BackendError> {
        let ss = self.sector_bytes.max(u64::from(new.sector_size().bytes()));
        for (what, value) in [("position", pos), ("length", buf.len() as u64)] {
            if value % ss != 0 {
                return Err(BackendError::Misaligned {
                    what,
                    value,
                    align: ss,
                });
            }
        }
        let Some(workers) = &self.workers else {
            if let Some(f) = inspect {
                f(0, buf);
            }
            let first = Sector512::from_bytes_floor(pos);
            self.cipher.decrypt(first, buf);
            new.encrypt(first, buf);
            return Ok(());
        };
        let inspect = inspect.map(|f| {
            // SAFETY: a lifetime cast only: the jobs holding this pointer are all counted
            // done before this function returns (`help_until` below), so the hook
            // outlives them.
            unsafe { std::mem::transmute::<*const Inspect<'_>, *const Inspect<'static>>(f) }
        });
        let with = crate::workers::Recrypt {
            new,
            inspect,
            start: buf.as_ptr(),
        };
        let split = self.opts.split_bytes;
        for (r, group) in buf.chunks_mut(split * JOBS_PER_ROUND).enumerate() {
            let base = pos + (r * split * JOBS_PER_ROUND) as u64;
            let n = group.len().div_ceil(split);
            let completion = Completion::new(n);
            let mut hand_off = HandOff::new(&completion, n);
            let mut jobs = [EMPTY_JOB; JOBS_PER_ROUND];
            for (i, chunk) in group.chunks_mut(split).enumerate() {
                jobs[i] = Job {
                    kind: JobKind::Recrypt {
                        completion: &completion,
                        with: &with,
                    },
                    first: Sector512::from_bytes_floor(base + (i * split) as u64),
                    ptr: chunk.as_mut_ptr(),
                    len: chunk.len(),
                };
            }
            workers.submit_waking(&jobs[..n], workers.len().saturating_sub(1).max(1));
            hand_off.sent(n);
            // Helping and then waiting keeps `group`, `with` and `completion` alive.
            workers.help_until(&completion)?;
        }
        Ok(())
    }

    /// Reencryption's data pass over one range: every `split_bytes` chunk is read from
    /// the backend, shown to the hook, decrypted with this volume's cipher, encrypted with
    /// `new` and kept or written back, all while it is in one core's cache, on the worker
    /// pool (with this thread helping if asked; inline without workers). Chunks are handed
    /// out one at a time, so a worker the scheduler holds back does not hold back the
    /// others. The writes of [`RecryptOut::Write`] are not flushed: reencryption orders
    /// them against its own metadata.
    ///
    /// # Errors
    /// [`BackendError::Misaligned`] if `pos` or `len` are not whole sectors, or a buffer's
    /// length is not `len`; the first read or write error (the chunks not started then do
    /// nothing); a crypto worker's panic.
    pub fn recrypt_range(&self, r: RecryptRange<'_>) -> Result<(), BackendError> {
        // The position only numbers IVs (reencryption's sides may start at any 512-byte
        // IV sector); chunks must hold whole sectors of both sides.
        let ss = self
            .sector_bytes
            .max(u64::from(r.new.sector_size().bytes()));
        if r.len as u64 % ss != 0 {
            return Err(BackendError::Misaligned {
                what: "length",
                value: r.len as u64,
                align: ss,
            });
        }
        let (out, keep, write_at) = match r.out {
            RecryptOut::Buffer { out, keep } => {
                let n = keep.as_ref().map_or(r.len, |k| k.len());
                if out.len() != r.len || n != r.len {
                    return Err(BackendError::Misaligned {
                        what: "buffer length",
                        value: out.len().max(n) as u64,
                        align: r.len as u64,
                    });
                }
                (
                    out.as_mut_ptr(),
                    keep.map_or(std::ptr::null_mut(), |k| k.as_mut_ptr()),
                    None,
                )
            }
            RecryptOut::Write(at) => (std::ptr::null_mut(), std::ptr::null_mut(), Some(at)),
        };
        let inspect = r.inspect.map(|f| {
            // SAFETY: a lifetime cast only: every chunk holding this pointer is counted
            // done before this function returns (the hand-off guard and the wait below).
            unsafe { std::mem::transmute::<*const Inspect<'_>, *const Inspect<'static>>(f) }
        });
        let new = {
            let p: *const (dyn SectorCipher + '_) = r.new;
            // SAFETY: as above.
            unsafe {
                std::mem::transmute::<
                    *const (dyn SectorCipher + '_),
                    *const (dyn SectorCipher + 'static),
                >(p)
            }
        };
        let with = RecryptIo {
            new,
            inspect,
            read_at: r.read_at,
            keep,
            write_at,
            pool: &self.pool,
            failed: std::sync::atomic::AtomicBool::new(false),
        };
        let chunk = self.opts.split_bytes;
        if write_at.is_some() && self.pool.buffer_bytes() < chunk {
            return Err(BackendError::Other(format!(
                "BUG: pool buffers of {} bytes for chunks of {chunk}",
                self.pool.buffer_bytes()
            )));
        }
        let n = r.len.div_ceil(chunk);
        let job = |i: usize| {
            let off = i * chunk;
            let len = chunk.min(r.len - off);
            Job {
                kind: JobKind::RecryptIo {
                    completion: std::ptr::null(),
                    with: &with,
                    off,
                },
                first: Sector512::from_bytes_floor(r.pos + off as u64),
                // SAFETY (of the add): `off` lies inside the range `out` holds.
                ptr: if out.is_null() {
                    std::ptr::null_mut()
                } else {
                    out.wrapping_add(off)
                },
                len,
            }
        };
        let Some(workers) = &self.workers else {
            for i in 0..n {
                let j = job(i);
                // SAFETY: everything `j` points at is this frame's or the caller's.
                unsafe {
                    crate::workers::recrypt_io(
                        &*self.backend,
                        &*self.cipher,
                        &with,
                        j.first,
                        j.ptr,
                        j.len,
                        i * chunk,
                    )?;
                }
            }
            return Ok(());
        };
        let completion = Completion::new(n);
        let mut hand_off = HandOff::new(&completion, n);
        let jobs: Vec<Job> = (0..n)
            .map(|i| {
                let mut j = job(i);
                if let JobKind::RecryptIo { completion: c, .. } = &mut j.kind {
                    *c = &completion;
                }
                j
            })
            .collect();
        if r.help {
            workers.submit_waking(&jobs, workers.len());
            hand_off.sent(n);
            workers.help_until(&completion)
        } else {
            workers.submit(&jobs);
            hand_off.sent(n);
            completion.wait(false)
        }
    }

    fn read_sectors(&self, buf: &mut [u8], pos: u64, place: Placement) -> Result<(), BackendError> {
        if let (Some(workers), Placement::Split) = (&self.workers, place) {
            return self.read_split(workers, buf, pos);
        }
        if place == Placement::Inline || self.workers.is_none() {
            let (backend, cipher) = (&*self.backend, &*self.cipher);
            return crate::sector_io::read_decrypt(
                backend,
                cipher,
                pos,
                self.lower(pos),
                buf,
                self.lends_reads,
            );
        }
        self.backend.read_at(buf, self.lower(pos))?;
        self.decrypt(pos, buf, place)
    }

    /// The automatic policy's large read: every chunk read and decrypted in parallel by
    /// the workers and this thread (dm-crypt reads the whole bio, then decrypts).
    fn read_split(&self, workers: &Workers, buf: &mut [u8], pos: u64) -> Result<(), BackendError> {
        let split = self.opts.split_bytes;
        for (r, group) in buf.chunks_mut(split * JOBS_PER_ROUND).enumerate() {
            let base = pos + (r * split * JOBS_PER_ROUND) as u64;
            let n = group.len().div_ceil(split);
            let completion = Completion::new(n);
            let mut hand_off = HandOff::new(&completion, n);
            let mut jobs = [EMPTY_JOB; JOBS_PER_ROUND];
            for (i, chunk) in group.chunks_mut(split).enumerate() {
                let at = base + (i * split) as u64;
                let kind = JobKind::ReadDecrypt {
                    completion: &completion,
                    offset: self.lower(at),
                };
                let first = Sector512::from_bytes_floor(at);
                jobs[i] = Job {
                    kind,
                    first,
                    ptr: chunk.as_mut_ptr(),
                    len: chunk.len(),
                };
            }
            workers.submit_waking(&jobs[..n], workers.len().saturating_sub(1).max(1));
            hand_off.sent(n);
            // Helping and then waiting keeps `group` and `completion` alive for the workers.
            workers.help_until(&completion)?;
        }
        Ok(())
    }

    /// Reads part of one sector: the whole sector into a stack buffer, then the part asked
    /// for. (It took a 256 KiB pool buffer for the one sector, competing with writers for
    /// the pool.) Sectors above 4 KiB (ucrypt's extended sizes) still use a pool buffer.
    fn read_partial(&self, buf: &mut [u8], p: Partial) -> Result<(), BackendError> {
        let ss = self.sector_bytes as usize;
        if ss <= SMALL_WRITE_BYTES {
            let mut small = SmallBuf([0; SMALL_WRITE_BYTES]);
            let sector = &mut small.0[..ss];
            self.read_sectors(sector, p.sector_start, Placement::Inline)?;
            buf.copy_from_slice(&sector[p.skip..p.skip + p.len]);
            return Ok(());
        }
        let mut seg = self.pool.get_segment(ss)?;
        let sector = seg.pieces().next().expect("BUG: empty segment");
        self.read_sectors(sector, p.sector_start, Placement::Inline)?;
        buf.copy_from_slice(&sector[p.skip..p.skip + p.len]);
        Ok(())
    }

    /// Encrypts and writes one segment (pool buffers holding the plaintext of whole sectors
    /// from position `start`), where the placement says.
    fn write_segment(
        &self,
        start: u64,
        seg: &mut Segment<'_>,
        fua: bool,
        place: Placement,
    ) -> Result<(), BackendError> {
        let Some(workers) = self
            .workers
            .as_ref()
            .filter(|_| place == Placement::Workers)
        else {
            // Inline (dm-crypt no_write_workqueue): encrypt here, submit from here, the
            // segment as one plug.
            let mut at = start;
            for piece in seg.pieces() {
                self.cipher.encrypt(Sector512::from_bytes_floor(at), piece);
                at += piece.len() as u64;
            }
            return self.submit_segment(start, seg, fua);
        };
        let split = self.opts.split_bytes;
        let mut jobs = [EMPTY_JOB; JOBS_PER_ROUND];
        let mut n = 0;
        let mut at = start;
        let completion = Completion::new(seg_chunks(seg, split));
        let mut batch = None;
        if !self.opts.submit_from_crypt_cpus {
            let sub = self
                .submitter
                .as_ref()
                .expect("BUG: ordered writes without a submitter");
            let mut b = Batch::new(sub.shared.next_seq(), seg_chunks(seg, split), fua);
            let mut pos = start;
            for (i, piece) in seg.pieces_ref().enumerate() {
                b.pieces[i] = (self.lower(pos), piece.as_ptr(), piece.len());
                pos += piece.len() as u64;
            }
            b.n_pieces = seg.len();
            batch = Some(b);
        }
        let chunks = seg_chunks(seg, split);
        let mut hand_off = match (&batch, &self.submitter) {
            (Some(b), Some(sub)) => HandOff::batch(b, &sub.shared, chunks),
            _ => HandOff::new(&completion, chunks),
        };
        for piece in seg.pieces() {
            for chunk in piece.chunks_mut(split) {
                let kind = match &batch {
                    Some(b) => JobKind::EncryptOrdered { batch: b },
                    None => JobKind::EncryptWrite {
                        completion: &completion,
                        offset: self.lower(at),
                        fua,
                    },
                };
                jobs[n] = Job {
                    kind,
                    first: Sector512::from_bytes_floor(at),
                    ptr: chunk.as_mut_ptr(),
                    len: chunk.len(),
                };
                n += 1;
                at += chunk.len() as u64;
                if n == JOBS_PER_ROUND {
                    workers.submit(&jobs);
                    hand_off.sent(n);
                    n = 0;
                }
            }
        }
        workers.submit(&jobs[..n]);
        hand_off.sent(n);
        // Waiting keeps the segment, the batch and the completion alive for the workers
        // and the submitter (and `hand_off` does, should this thread unwind first).
        match &batch {
            Some(b) => b.completion.wait(self.spin()),
            None => completion.wait(self.spin()),
        }
    }

    /// Split write: each chunk of the segment is encrypted and written by a worker or this
    /// thread (no single plug: the chunks reach the backend from several CPUs, like
    /// dm-crypt's submit_from_crypt_cpus). With `src` (whole-sector requests) the chunk's
    /// plaintext is copied in by whoever takes it, so the copies run in parallel too;
    /// without, the segment already holds the plaintext (read-modify-write requests).
    fn write_split(
        &self,
        workers: &Workers,
        start: u64,
        seg: &mut Segment<'_>,
        src: Option<&[u8]>,
        fua: bool,
    ) -> Result<(), BackendError> {
        let split = self.opts.split_bytes;
        let completion = Completion::new(seg_chunks(seg, split));
        let mut hand_off = HandOff::new(&completion, seg_chunks(seg, split));
        let mut jobs = [EMPTY_JOB; JOBS_PER_ROUND];
        let (mut n, mut at) = (0, start);
        for piece in seg.pieces() {
            for chunk in piece.chunks_mut(split) {
                let (completion, offset) = (&completion, self.lower(at));
                let kind = match src {
                    Some(src) => {
                        let src = src[(at - start) as usize..].as_ptr();
                        JobKind::CopyEncryptWrite {
                            completion,
                            src,
                            offset,
                            fua,
                        }
                    }
                    None => JobKind::EncryptWrite {
                        completion,
                        offset,
                        fua,
                    },
                };
                let first = Sector512::from_bytes_floor(at);
                jobs[n] = Job {
                    kind,
                    first,
                    ptr: chunk.as_mut_ptr(),
                    len: chunk.len(),
                };
                n += 1;
                at += chunk.len() as u64;
                if n == JOBS_PER_ROUND {
                    workers.submit(&jobs);
                    hand_off.sent(n);
                    n = 0;
                }
            }
        }
        workers.submit_waking(&jobs[..n], workers.len().saturating_sub(1).max(1));
        hand_off.sent(n);
        // Helping and then waiting keeps `src`, the segment and the completion alive.
        workers.help_until(&completion)
    }

    /// Hands an encrypted segment to the backend as one plug, from this thread.
    fn submit_segment(&self, start: u64, seg: &Segment<'_>, fua: bool) -> Result<(), BackendError> {
        let mut ops = [WriteOp {
            offset: 0,
            buf: &[],
            fua,
        }; crate::pool::MAX_PIECES];
        let mut at = start;
        for (op, piece) in ops.iter_mut().zip(seg.pieces_ref()) {
            *op = WriteOp {
                offset: self.lower(at),
                buf: piece,
                fua,
            };
            at += piece.len() as u64;
        }
        self.backend.submit_writes(&ops[..seg.len()])
    }

    fn write_impl(
        &self,
        buf: &[u8],
        offset: u64,
        fua: bool,
        ctx: IoCtx,
    ) -> Result<(), BackendError> {
        if self.info.caps.read_only {
            return Err(BackendError::ReadOnly);
        }
        check_range(offset, buf.len() as u64, self.info.size_bytes)?;
        if buf.is_empty() {
            return Ok(());
        }
        self.stats.write(ctx, buf.len());
        let (_inflight, depth) = self.enter(buf.len());
        let ss = self.sector_bytes;
        let mask = ss - 1;
        let start = offset & !mask;
        let end = (offset + buf.len() as u64 + mask) & !mask;
        let s = split(offset, buf.len() as u64, ss);
        if self.atomic && (s.head.is_some() || s.tail.is_some()) {
            return self.write_edges_atomic(buf, offset, &s, fua);
        }
        let _guard = (!self.atomic).then(|| self.locks.lock(start, end));
        let place = self.placement(true, buf.len(), depth);
        if place == Placement::Inline && end - start <= SMALL_WRITE_BYTES as u64 {
            return self.write_small(buf, offset, start, end, &s, fua);
        }
        let seg_bytes = self.pool.segment_bytes() as u64;
        let mut seg_start = start;
        while seg_start < end {
            let seg_end = (seg_start + seg_bytes).min(end);
            let mut seg = self.pool.get_segment((seg_end - seg_start) as usize)?;
            // Read-modify-write: a partial edge sector starts from its current plaintext.
            for p in [s.head, s.tail].into_iter().flatten() {
                if (seg_start..seg_end).contains(&p.sector_start) {
                    // Straight into the segment: buffers are whole sectors, so a sector
                    // never straddles two; and taking another pool buffer while holding
                    // these could deadlock.
                    let at = (p.sector_start - seg_start) as usize;
                    let sector = seg
                        .slice_mut(at, ss as usize)
                        .expect("BUG: sector straddles buffers");
                    self.read_sectors(sector, p.sector_start, Placement::Inline)?;
                }
            }
            // The caller's bytes that fall into this segment.
            let lo = seg_start.max(offset);
            let hi = seg_end.min(offset + buf.len() as u64);
            let src = &buf[(lo - offset) as usize..(hi - offset) as usize];
            let aligned = s.head.is_none() && s.tail.is_none();
            match (&self.workers, place) {
                (Some(workers), Placement::Split) if aligned => {
                    self.write_split(workers, seg_start, &mut seg, Some(src), fua)?;
                }
                (Some(workers), Placement::Split) => {
                    seg.copy_in((lo - seg_start) as usize, src);
                    self.write_split(workers, seg_start, &mut seg, None, fua)?;
                }
                _ => {
                    seg.copy_in((lo - seg_start) as usize, src);
                    self.write_segment(seg_start, &mut seg, fua, place)?;
                }
            }
            seg_start = seg_end;
        }
        Ok(())
    }
}

impl Volume {
    /// An inline write of at most [`SMALL_WRITE_BYTES`] of whole sectors: read-modify-write,
    /// encrypt and submit from a buffer on this thread's stack instead of a pool buffer.
    ///
    /// Why: a 4 KiB write would hold a 256 KiB pool buffer, and at depth 256 four
    /// writers in five slept on the empty pool for a buffer they barely used (4 KiB random
    /// writes at depth 256 ran at two thirds of depth 4's rate). The stack buffer is as
    /// bounded as the pool (one per request in flight, and requests in flight are bounded
    /// by the threads issuing them) and costs no lock.
    fn write_small(
        &self,
        buf: &[u8],
        offset: u64,
        start: u64,
        end: u64,
        s: &crate::split::Split,
        fua: bool,
    ) -> Result<(), BackendError> {
        let mut small = SmallBuf([0; SMALL_WRITE_BYTES]);
        let data = &mut small.0[..(end - start) as usize];
        let ss = self.sector_bytes as usize;
        for p in [s.head, s.tail].into_iter().flatten() {
            let at = (p.sector_start - start) as usize;
            self.read_sectors(&mut data[at..at + ss], p.sector_start, Placement::Inline)?;
        }
        let at = (offset - start) as usize;
        data[at..at + buf.len()].copy_from_slice(buf);
        self.cipher
            .encrypt(Sector512::from_bytes_floor(start), data);
        self.backend.write_at(data, self.lower(start), fua)
    }
}

impl Volume {
    /// A write with partial sectors on an atomic backend (no range locks): the whole
    /// sectors go as any aligned write, and each partial edge sector is decrypted, merged
    /// and encrypted again inside one [`Backend::modify_at`], so no other write of that
    /// sector can land between its read and its write (the lost update the range locks
    /// prevent elsewhere).
    fn write_edges_atomic(
        &self,
        buf: &[u8],
        offset: u64,
        s: &crate::split::Split,
        fua: bool,
    ) -> Result<(), BackendError> {
        if let Some((pos, len)) = s.body {
            let at = (pos - offset) as usize;
            // Already counted in the stats: the inner call is unattributed.
            self.write_impl(&buf[at..at + len as usize], pos, fua, IoCtx::default())?;
        }
        for p in [s.head, s.tail].into_iter().flatten() {
            let at = (p.sector_start + p.skip as u64 - offset) as usize;
            let src = &buf[at..at + p.len];
            let sector = Sector512::from_bytes_floor(p.sector_start);
            self.backend.modify_at(
                self.lower(p.sector_start),
                self.sector_bytes as usize,
                fua,
                &mut |ct| {
                    self.cipher.decrypt(sector, ct);
                    ct[p.skip..p.skip + p.len].copy_from_slice(src);
                    self.cipher.encrypt(sector, ct);
                },
            )?;
        }
        Ok(())
    }
}
/// The largest request [`Volume::submit_async`] takes. Its crypto runs on one thread: a
/// write's on the submitter (the NBD connection's reader), a read's on the backend's
/// completion thread (librbd's). For small requests that is the point (no thread wakes per
/// request); for large ones it serialises the crypto of every request on one CPU, where
/// the synchronous path spreads it over the server threads. Measured (bench/rbd.sh, one
/// run, 2026-11-25, BENCHMARKING.md): every size asynchronous, 4 KiB reads went from 6998
/// to 9393 IOPS but 1 MiB reads from 669 to 485 MiB/s and 1 MiB writes from 663 to
/// 474. 64 KiB is 16 sectors of AES-XTS, about 16 µs: the order of the wake-ups saved.
const ASYNC_MAX_BYTES: usize = 64 * 1024;

/// The largest write [`Volume::write_small`] takes: one 4 KiB page.
const SMALL_WRITE_BYTES: usize = 4096;

/// A page-aligned stack buffer (aligned for O_DIRECT backends).
#[repr(C, align(4096))]
struct SmallBuf([u8; SMALL_WRITE_BYTES]);

fn seg_chunks(seg: &Segment<'_>, split: usize) -> usize {
    seg.pieces_ref().map(|p| p.len().div_ceil(split)).sum()
}

const EMPTY_JOB: Job = Job {
    kind: JobKind::Decrypt {
        completion: std::ptr::null(),
    },
    first: Sector512(0),
    ptr: std::ptr::null_mut(),
    len: 0,
};

impl Volume {
    fn read(&self, buf: &mut [u8], offset: u64, ctx: IoCtx) -> Result<(), BackendError> {
        check_range(offset, buf.len() as u64, self.info.size_bytes)?;
        self.stats.read(ctx, buf.len());
        if buf.is_empty() {
            return Ok(());
        }
        let (_inflight, depth) = self.enter(buf.len());
        // No write of this volume may change these sectors while they are read: a read
        // returns each sector as one write left it, never a mix of two (rangelock module
        // docs). A read-only volume has no writers.
        let mask = self.sector_bytes - 1;
        let (start, end) = (offset & !mask, (offset + buf.len() as u64 + mask) & !mask);
        let (mut _reading, mut _locked) = (None, None);
        if !self.info.caps.read_only && !self.atomic {
            _reading = self.locks.try_read(start, end);
            if _reading.is_none() {
                _locked = Some(self.locks.lock(start, end));
            }
        }
        let s = split(offset, buf.len() as u64, self.sector_bytes);
        let mut at = 0usize;
        if let Some(h) = s.head {
            self.read_partial(&mut buf[..h.len], h)?;
            at = h.len;
        }
        if let Some((pos, len)) = s.body {
            // Whole sectors: decrypt in place in the caller's buffer, no copy.
            let place = self.placement(false, len as usize, depth);
            self.read_sectors(&mut buf[at..at + len as usize], pos, place)?;
            at += len as usize;
        }
        if let Some(t) = s.tail {
            self.read_partial(&mut buf[at..], t)?;
        }
        Ok(())
    }

    /// Whole-sector writes placed inline or split are encrypted in the caller's buffer and
    /// written from it: no copy into a pool or stack buffer first (dm-crypt must copy: the
    /// bio's pages belong to the page cache). A split one is encrypted in chunks by the
    /// workers and this thread, then written whole from here: one write like an inline
    /// one. Under the same range lock as any write, so the no-torn-reads guarantee holds;
    /// requests with partial sectors or for the kernel's fixed workqueue placement take the
    /// copying path (as a [`IoKind::Write`]) and leave `buf` as it was.
    ///
    /// Why one write after a split encryption: written chunk by chunk from several CPUs
    /// (as the copying path does), 1M writes at depth 4 through NBD, which mostly split
    /// (the next request is still arriving), ran at 0.8-0.9x of inline ones: the pieces'
    /// writes contend for the file's lock. BENCHMARKING.md, 2026-12-04.
    fn write_owned(
        &self,
        buf: &mut [u8],
        offset: u64,
        fua: bool,
        ctx: IoCtx,
    ) -> Result<(), BackendError> {
        let mask = self.sector_bytes - 1;
        if self.info.caps.read_only
            || buf.is_empty()
            || offset & mask != 0
            || buf.len() as u64 & mask != 0
        {
            return self.write_impl(buf, offset, fua, ctx);
        }
        check_range(offset, buf.len() as u64, self.info.size_bytes)?;
        let (_inflight, depth) = self.enter(buf.len());
        let place = self.placement(true, buf.len(), depth);
        if !matches!(place, Placement::Inline | Placement::Split) {
            drop(_inflight);
            return self.write_impl(buf, offset, fua, ctx);
        }
        self.stats.write(ctx, buf.len());
        let _guard = (!self.atomic).then(|| self.locks.lock(offset, offset + buf.len() as u64));
        self.crypt(offset, buf, place, true)?;
        self.backend.write_at(buf, self.lower(offset), fua)
    }

    /// Whole sectors whose ciphertext is a hole of the device, and only with
    /// `allow_discards`: a trimmed range's content is unspecified, so a reader may take it
    /// as unallocated. Without it every sector counts as data (a hole in a sparse image
    /// still decrypts to a definite, if meaningless, content).
    fn find_holes(&self, offset: u64, len: u64) -> Option<Vec<(u64, u64)>> {
        if self.info.caps.discard == Support::None {
            return None;
        }
        let end = offset.checked_add(len)?.min(self.info.size_bytes);
        let lower = self
            .backend
            .holes(self.lower(offset), end.checked_sub(offset)?)?;
        let s = self.sector_bytes;
        Some(
            lower
                .into_iter()
                .filter_map(|(o, l)| {
                    let o = o.checked_sub(self.cfg.data_offset_bytes)?;
                    let (start, stop) = (o.div_ceil(s) * s, (o + l).min(end) / s * s);
                    (stop > start).then_some((start, stop - start))
                })
                .collect(),
        )
    }

    fn discard_range(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        if self.info.caps.discard == Support::None {
            return Err(BackendError::Unsupported(
                "discard (the table has no allow_discards)",
            ));
        }
        check_range(offset, len, self.info.size_bytes)?;
        // Only whole sectors are discarded; a partial sector keeps its data (discard is
        // advisory, and zeroing part of a sector would need a read-modify-write).
        if let Some((pos, l)) = split(offset, len, self.sector_bytes).body {
            let _guard = (!self.atomic).then(|| self.locks.lock(pos, pos + l));
            self.backend.discard(self.lower(pos), l)?;
        }
        Ok(())
    }

    fn zero_range(&self, offset: u64, len: u64, fua: bool, ctx: IoCtx) -> Result<(), BackendError> {
        check_range(offset, len, self.info.size_bytes)?;
        let mut pos = offset;
        let end = offset + len;
        while pos < end {
            // Chunks end on 64 KiB boundaries (so on sector boundaries): only the first
            // and last can need a read-modify-write.
            let chunk = ZEROS.len() as u64;
            let n = (end - pos).min(chunk - pos % chunk) as usize;
            self.write_impl(&ZEROS[..n], pos, false, ctx)?;
            pos += n as u64;
        }
        if fua {
            // FUA covers the whole request: one flush after all chunks.
            self.backend.flush()?;
        }
        Ok(())
    }
}

impl Backend for Volume {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn submit(&self, io: Io<'_>) -> Result<(), BackendError> {
        let (offset, fua, ctx) = (io.offset, io.fua, io.ctx);
        match io.kind {
            IoKind::Read(buf) => self.read(buf, offset, ctx),
            IoKind::Write(buf) => self.write_impl(buf, offset, fua, ctx),
            IoKind::WriteOwned(buf) => self.write_owned(buf, offset, fua, ctx),
            IoKind::WriteZeroes(len) => self.zero_range(offset, len, fua, ctx),
            IoKind::Discard(len) => self.discard_range(offset, len),
            IoKind::Holes { len, out } => {
                *out = self
                    .find_holes(offset, len)
                    .ok_or(BackendError::Unsupported("holes"))?;
                Ok(())
            }
            // Lending or modifying ciphertext in place would hand out what is not the data.
            IoKind::Lend { .. } | IoKind::Modify { .. } => emulate::fallback(self, io),
        }
    }

    /// The asynchronous path, for a backend that has one (RBD): whole-sector requests whose
    /// crypto the placement puts inline. A write takes its range lock (only if free: see
    /// below) and is encrypted in the caller's buffer here, then submitted; its completion
    /// releases the range. A read
    /// announces itself as any read does ([`RangeLocks::try_read`]) and is submitted; its
    /// completion decrypts in place (on the backend's completion thread), leaves the
    /// range, then reports. So the range-lock rules of the synchronous path hold unchanged
    /// (a read never sees a sector mid-write; writes to a sector are serialised), and
    /// a write is reported done only once the backend completed it. Everything else is
    /// handed back (`Err`) for the synchronous path: partial sectors (read-modify-write),
    /// requests for the workers, a read that meets a write in progress and a write that
    /// meets a write or read in progress (either would have to wait for the lock; the
    /// caller's thread must not), read-only volumes' writes, ranges out of bounds, requests
    /// above [`ASYNC_MAX_BYTES`].
    ///
    /// The completion holds the cipher and the range locks, not the volume (see
    /// [`Backend::submit_async`]): callers wait for their requests before dropping it.
    fn submit_async(self: Arc<Self>, io: AsyncIo) -> Result<(), AsyncIo> {
        let mask = self.sector_bytes - 1;
        let write = io.op == AsyncOp::Write;
        // An atomic backend's volume takes no range locks (its calls keep sectors whole);
        // whether its asynchronous calls would too is not promised: synchronous path.
        if !self.async_lower
            || self.atomic
            || io.len == 0
            || io.len > io.buf.len()
            || io.offset & mask != 0
            || io.len as u64 & mask != 0
            || check_range(io.offset, io.len as u64, self.info.size_bytes).is_err()
            || (write && self.info.caps.read_only)
            || io.len > ASYNC_MAX_BYTES
            || self.placement(write, io.len, usize::MAX) != Placement::Inline
        {
            return Err(io);
        }
        let (start, end) = (io.offset, io.offset + io.len as u64);
        // A write whose range another write (or a read) holds would have to wait: this
        // thread is the connection's only reader, so waiting here would stall every request
        // behind it for the holder's whole round trip to the backend (a random 4 KiB write
        // meets one about once in 2000 at depth 32 on 1 GiB; each stalled the queue for
        // milliseconds). It goes back for a thread that may wait.
        if write {
            match self.locks.try_lock(start, end) {
                Some(g) => g.keep(),
                None => return Err(io),
            }
        }
        let AsyncIo {
            op,
            offset,
            len,
            mut buf,
            ctx,
            done,
        } = io;
        let locks = Arc::clone(&self.locks);
        let inner = if write {
            self.stats.write(ctx, len);
            self.cipher
                .encrypt(Sector512::from_bytes_floor(offset), &mut buf[..len]);
            AsyncIo {
                op,
                offset: self.lower(offset),
                len,
                buf,
                ctx,
                done: Box::new(move |buf, r| {
                    locks.unlock(start, end);
                    drop(locks);
                    done(buf, r);
                }),
            }
        } else {
            // A read-only volume has no writers: no announcement (as `Volume::read`).
            let announced = !self.info.caps.read_only;
            if announced {
                match self.locks.try_read(start, end) {
                    Some(g) => g.keep(),
                    None => {
                        return Err(AsyncIo {
                            op,
                            offset,
                            len,
                            buf,
                            ctx,
                            done,
                        })
                    }
                }
            }
            self.stats.read(ctx, len);
            let cipher = Arc::clone(&self.cipher);
            AsyncIo {
                op,
                offset: self.lower(offset),
                len,
                buf,
                ctx,
                done: Box::new(move |mut buf, r| {
                    if r.is_ok() {
                        cipher.decrypt(Sector512::from_bytes_floor(offset), &mut buf[..len]);
                    }
                    drop(cipher);
                    if announced {
                        locks.leave_read(start, end);
                    }
                    drop(locks);
                    done(buf, r);
                }),
            }
        };
        if let Err(inner) = Arc::clone(&self.backend).submit_async(inner) {
            // The backend said it takes asynchronous requests and refused this valid one
            // (a bug): the range is released and the request fails, never runs twice.
            (inner.done)(
                inner.buf,
                Err(BackendError::Other(
                    "BUG: the backend refused an asynchronous request".into(),
                )),
            );
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), BackendError> {
        // Every write acknowledged so far has reached the backend (writes complete only
        // after the backend call returns), so flushing the backend covers them all, from
        // every client.
        self.backend.flush()
    }

    fn hints(&self) -> Hints {
        Hints {
            local: self.backend.hints().local,
            atomic_unit: None,
            async_submit: self.async_lower,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ucrypt_backend::MemoryBackend;
    use ucrypt_crypto::{CipherSpec, SectorParams, VolumeKey};

    fn null_volume(opts: EngineOptions) -> Volume {
        spec_volume("capi:ecb(cipher_null)", &[], opts)
    }

    /// A volume whose cipher has work to place (the placement tests' subject).
    fn aes_volume(opts: EngineOptions) -> Volume {
        spec_volume("aes-xts-plain64", &[7u8; 64], opts)
    }

    fn spec_volume(spec: &str, key: &[u8], opts: EngineOptions) -> Volume {
        let cipher = spec
            .parse::<CipherSpec>()
            .unwrap()
            .build(&VolumeKey::new(key.to_vec()), SectorParams::default())
            .unwrap();
        let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new(8 << 20).unwrap());
        let cfg = VolumeConfig {
            data_offset_bytes: 0,
            length_bytes: 8 << 20,
            read_only: false,
            allow_discards: false,
        };
        Volume::with_options(Arc::from(cipher), backend, cfg, opts).unwrap()
    }

    fn auto_volume(workers: usize) -> Volume {
        aes_volume(EngineOptions {
            workers,
            ..EngineOptions::default()
        })
    }

    #[test]
    fn auto_splits_large_requests_only_while_cpus_are_free() {
        let v = auto_volume(2);
        assert_eq!(v.placement(false, 1 << 20, 1), Placement::Split);
        assert_eq!(v.placement(true, 1 << 20, 1), Placement::Split);
        // As many large requests in flight as workers: every CPU is busy already.
        assert_eq!(v.placement(false, 1 << 20, 2), Placement::Inline);
        assert_eq!(v.placement(false, 64 << 10, 1), Placement::Inline);
        assert_eq!(v.placement(true, 4096, 1), Placement::Inline);
    }

    #[test]
    fn auto_counts_only_requests_that_could_matter_in_flight() {
        let v = auto_volume(2);
        {
            let (small, depth) = v.enter(4096);
            assert!(small.is_none());
            assert_eq!(depth, 1);
            assert_eq!(v.inflight.load(Ordering::Relaxed), 0);
            let (_big, depth) = v.enter(1 << 20);
            assert_eq!(depth, 1);
            let (_big2, depth) = v.enter(256 << 10);
            assert_eq!(depth, 2);
            assert_eq!(v.placement(false, 256 << 10, depth), Placement::Inline);
        }
        assert_eq!(
            v.inflight.load(Ordering::Relaxed),
            0,
            "guards undo the count"
        );
        // The kernel-default placements count every request (their waiters' spinning
        // depends on it).
        let k = aes_volume(EngineOptions::kernel_default());
        let (g, depth) = k.enter(4096);
        assert!(g.is_some());
        assert_eq!(depth, 1);
    }

    /// cipher_null has no crypto to spread: the automatic placement (which splits a large
    /// request of a real cipher) runs every request inline, the kernel's placement chosen
    /// explicitly still hands requests to the workers, and the data goes through unchanged
    /// either way.
    #[test]
    fn identity_cipher_is_never_split_by_the_automatic_placement() {
        let auto = EngineOptions {
            workers: 2,
            ..EngineOptions::default()
        };
        let kernel = EngineOptions {
            workers: 2,
            ..EngineOptions::kernel_default()
        };
        assert_eq!(
            aes_volume(auto).placement(true, 1 << 20, 1),
            Placement::Split
        );
        let v = null_volume(auto);
        for (write, len) in [
            (false, 1 << 20),
            (true, 1 << 20),
            (false, 4096),
            (true, 4096),
        ] {
            assert_eq!(
                v.placement(write, len, 1),
                Placement::Inline,
                "{write} {len}"
            );
        }
        assert_eq!(
            null_volume(kernel).placement(true, 1 << 20, 1),
            Placement::Workers
        );
        for opts in [auto, kernel] {
            let v = null_volume(opts);
            let data: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
            let mut owned = data.clone();
            v.submit(Io::write_owned(&mut owned, 1 << 20)).unwrap();
            let mut back = vec![0u8; 1 << 20];
            v.submit(Io::read(&mut back, 1 << 20)).unwrap();
            assert!(back == data, "cipher_null is the identity");
            let mut raw = vec![0u8; 1 << 20];
            v.backend().read_at(&mut raw, 1 << 20).unwrap();
            assert!(raw == data, "the device holds the plaintext");
        }
    }
}
