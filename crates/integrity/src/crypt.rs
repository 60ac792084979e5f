//! dm-crypt's authenticated modes over dm-integrity with external tags: the crypt target
//! with `integrity:N:aead` on an [`IntegrityBackend`] without `internal_hash`, as a
//! `Backend`. Each sector is encrypted with its tag (and, for `random` IVs, the IV in the
//! tag) by [`ucrypt_crypto::aead::AeadCipher`] and written with its tag in one call, so the
//! journal keeps them together; a read fetches data and tags and fails exactly the sector
//! whose tag does not match ([`BackendError::Integrity`], EILSEQ), as the kernel's
//! `crypt_convert_block_aead` fails it with `BLK_STS_PROTECTION`.
//!
//! ```text
//!   front end ──► AeadVolume ──► IntegrityBackend (external tags) ──► Arc<dyn Backend>
//!                  read: data + tags, check, decrypt     J/D: data and tags together
//!                  write: encrypt, tags, write both
//! ```
//!
//! A large request's AEAD work is spread over threads ([`Spread`]), as the plain volume
//! (`ucrypt_engine::Volume`) spreads a large request's crypto over its workers and the
//! kernel's dm-crypt over its kcryptd workers: the data and tags are still read, and
//! written, in one call to the device below (the journal keeps a request's sectors
//! together as before); only the sealing and the checking are shared out, so the bytes
//! on disk do not depend on it.

use crate::spread::Helpers;
use crate::IntegrityBackend;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use ucrypt_backend::{check_range, emulate, Backend, BackendError, BackendInfo, Io, IoKind};
use ucrypt_crypto::aead::AeadCipher;

/// Where a large request's AEAD work runs: the plain volume's automatic placement
/// (`ucrypt_engine::Volume::placement`) with its table flags. A request of at least
/// `min_bytes` is cut into pieces of `piece_bytes` that the receiving thread and up to
/// `threads - 1` helpers seal or check, while fewer such requests are in flight than
/// `threads` (otherwise the other CPUs are busy with those and the receiving thread is as
/// good a CPU as any); smaller requests, and reads or writes the flags keep inline, run
/// on the receiving thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spread {
    /// Threads a large request is shared among, the receiving one included (1: never).
    pub threads: usize,
    /// Requests this large (bytes, whole sectors) or larger are spread.
    pub min_bytes: usize,
    /// Bytes per piece (rounded down to whole sectors, at least one).
    pub piece_bytes: usize,
    /// Reads checked and decrypted in the receiving thread (dm-crypt `no_read_workqueue`).
    pub inline_reads: bool,
    /// Writes encrypted in the receiving thread (dm-crypt `no_write_workqueue`).
    pub inline_writes: bool,
}

impl Default for Spread {
    /// The plain volume's defaults: one thread per CPU, requests of 256 KiB and more, in
    /// pieces of 128 KiB (`ucrypt_engine::EngineOptions::default`).
    fn default() -> Self {
        Spread {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            min_bytes: 256 * 1024,
            piece_bytes: 128 * 1024,
            inline_reads: false,
            inline_writes: false,
        }
    }
}

impl Spread {
    /// Every request on the thread that receives it.
    pub fn inline() -> Self {
        Spread {
            threads: 1,
            inline_reads: true,
            inline_writes: true,
            ..Spread::default()
        }
    }
}

/// Threads a request's reading (checking, decrypting) and writing (encrypting) run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Threads {
    read: usize,
    write: usize,
}

/// Counts a large request in flight while it runs ([`AeadVolume::threads_for`]).
struct Large<'a>(&'a AtomicUsize);

impl Drop for Large<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Runs `work` on every piece, on up to `threads` threads: this one and `threads - 1` of
/// `helpers` ([`crate::spread`]), each taking the next piece in order until none is left.
/// Returns the error of the lowest piece that failed (so the answer does not depend on
/// which thread got there first: it is the one a single thread going through the pieces in
/// order gives).
fn spread<P: Send, E: Send>(
    helpers: &Helpers,
    threads: usize,
    pieces: Vec<P>,
    work: impl Fn(P) -> Result<(), E> + Sync,
) -> Result<(), E> {
    let more = threads.min(pieces.len()).saturating_sub(1);
    let queue = Mutex::new(pieces.into_iter().enumerate());
    let failed: Mutex<Option<(usize, E)>> = Mutex::new(None);
    let run = || loop {
        let next = queue.lock().unwrap_or_else(PoisonError::into_inner).next();
        let Some((i, piece)) = next else { break };
        if let Err(e) = work(piece) {
            let mut f = failed.lock().unwrap_or_else(PoisonError::into_inner);
            if f.as_ref().is_none_or(|(j, _)| i < *j) {
                *f = Some((i, e));
            }
        }
    };
    helpers.run(more, &run);
    match failed.into_inner().unwrap_or_else(PoisonError::into_inner) {
        Some((_, e)) => Err(e),
        None => Ok(()),
    }
}

/// An authenticated crypt target over a dm-integrity device. See the [module docs](self).
pub struct AeadVolume {
    cipher: AeadCipher,
    dev: Arc<IntegrityBackend>,
    info: BackendInfo,
    /// Sectors whose tag did not match since open.
    failures: AtomicU64,
    /// Orders writes that share a sector: a partial-sector write (read, change, write
    /// back) holds it exclusively from its read to its write; whole-sector writes hold it
    /// shared, so none lands between a partial write's read and its write (which would
    /// write back the sector as it was and lose that write half-way).
    order: RwLock<()>,
    /// Where large requests' AEAD work runs.
    spread: Spread,
    /// Requests of at least `spread.min_bytes` in flight.
    large: AtomicUsize,
    /// Reads and writes spread over threads since open.
    spread_count: AtomicU64,
    /// `spread.threads - 1` helper threads, started by the first request spread.
    helpers: OnceLock<Helpers>,
}

impl std::fmt::Debug for AeadVolume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AeadVolume")
            .field("cipher", &self.cipher)
            .field("size", &self.info.size_bytes)
            .finish_non_exhaustive()
    }
}

impl AeadVolume {
    /// The crypt target of `length` 512-byte sectors over `dev` (which must have external
    /// tags of the cipher's tag size and blocks of its sector size, as the kernel
    /// requires of the device below a crypt target with `integrity:N:aead`).
    ///
    /// # Errors
    /// A device with its own hash, another tag size or block size, or shorter than
    /// `length`.
    pub fn new(
        cipher: AeadCipher,
        dev: Arc<IntegrityBackend>,
        length: u64,
    ) -> Result<AeadVolume, BackendError> {
        let refuse = |m: String| Err(BackendError::Other(m));
        if !dev.external_tags() {
            return refuse(
                "integrity:N:aead needs a dm-integrity device without internal_hash below".into(),
            );
        }
        let geo = dev.geometry();
        if geo.tag_size as usize != cipher.tag_size() {
            return refuse(format!(
                "the crypt target's integrity tag is {} bytes, the dm-integrity device's {}",
                cipher.tag_size(),
                geo.tag_size
            ));
        }
        let ss = cipher.sector_size().bytes();
        if geo.block_bytes() != u64::from(ss) {
            return refuse(format!(
                "the crypt sector size {ss} differs from the dm-integrity block size {} (the \
                 kernel needs one tag per crypt sector)",
                geo.block_bytes()
            ));
        }
        let size_bytes = length.saturating_mul(512);
        if size_bytes > dev.info().size_bytes || size_bytes % u64::from(ss) != 0 {
            return refuse(format!(
                "the crypt target maps {length} sectors; the dm-integrity device provides {} \
                 in {ss}-byte sectors",
                dev.info().size_bytes / 512
            ));
        }
        let mut info = dev.info().clone();
        info.size_bytes = size_bytes;
        Ok(AeadVolume {
            cipher,
            dev,
            info,
            failures: AtomicU64::new(0),
            order: RwLock::new(()),
            spread: Spread::default(),
            large: AtomicUsize::new(0),
            spread_count: AtomicU64::new(0),
            helpers: OnceLock::new(),
        })
    }

    /// This volume with large requests' AEAD work placed as `spread` says (the default:
    /// [`Spread::default`]).
    #[must_use]
    pub fn with_spread(mut self, spread: Spread) -> AeadVolume {
        self.spread = spread;
        self
    }

    /// Reads and writes whose AEAD work was spread over threads since open (a
    /// partial-sector write's read and its write count apart).
    pub fn spread_requests(&self) -> u64 {
        self.spread_count.load(Ordering::Relaxed)
    }

    /// How many threads the reading and the writing of a request of `len` bytes (whole
    /// sectors) are shared among, and, for a large one, its place among the large
    /// requests in flight (held until it ends). The one place that decides.
    fn threads_for(&self, len: usize) -> (Threads, Option<Large<'_>>) {
        let s = &self.spread;
        let inline = Threads { read: 1, write: 1 };
        if (s.inline_reads && s.inline_writes)
            || s.threads < 2
            || len < s.min_bytes
            || len <= self.piece_bytes()
        {
            return (inline, None);
        }
        let n = self.large.fetch_add(1, Ordering::Relaxed) + 1;
        let guard = Large(&self.large);
        if n >= s.threads {
            return (inline, Some(guard));
        }
        // The CPUs the other large requests in flight do not already hold.
        let t = s.threads - (n - 1);
        let pick = |keep_inline: bool| if keep_inline { 1 } else { t };
        let threads = Threads {
            read: pick(s.inline_reads),
            write: pick(s.inline_writes),
        };
        (threads, Some(guard))
    }

    fn helpers(&self) -> &Helpers {
        self.helpers
            .get_or_init(|| Helpers::start(self.spread.threads.saturating_sub(1)))
    }

    /// Bytes per piece of a spread request: whole sectors, at least one.
    fn piece_bytes(&self) -> usize {
        let ss = self.ss() as usize;
        (self.spread.piece_bytes / ss).max(1) * ss
    }

    /// Sectors that failed authentication since open.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// The dm-integrity device below.
    pub fn device(&self) -> &Arc<IntegrityBackend> {
        &self.dev
    }

    fn ss(&self) -> u64 {
        u64::from(self.cipher.sector_size().bytes())
    }

    /// Runs `work(first 512-byte sector, data, its tags)` over `buf`: whole on this thread,
    /// or in pieces of [`AeadVolume::piece_bytes`] on `threads` threads, `split` cutting
    /// `tags` to match (the error of the first failing piece wins, as one thread's would).
    fn by_pieces<T: Send, E: Send>(
        &self,
        buf: &mut [u8],
        offset: u64,
        threads: usize,
        tags: T,
        split: impl FnOnce(T, usize) -> Vec<T>,
        work: impl Fn(u64, &mut [u8], T) -> Result<(), E> + Sync,
    ) -> Result<(), E> {
        if threads <= 1 {
            return work(offset / 512, buf, tags);
        }
        self.spread_count.fetch_add(1, Ordering::Relaxed);
        let piece = self.piece_bytes();
        let per = piece / self.ss() as usize * self.cipher.tag_size();
        let pieces: Vec<_> = buf
            .chunks_mut(piece)
            .zip(split(tags, per))
            .enumerate()
            .collect();
        spread(self.helpers(), threads, pieces, |(i, (data, tags))| {
            work((offset + (i * piece) as u64) / 512, data, tags)
        })
    }

    /// Whole sectors at `offset` (aligned), checked and decrypted on `threads` threads.
    /// A request that fails fails at its first sector whose tag does not match, counted
    /// once, however it was spread (as the kernel's `crypt_convert` stops at the first).
    fn read_sectors(
        &self,
        buf: &mut [u8],
        offset: u64,
        threads: usize,
    ) -> Result<(), BackendError> {
        let n = buf.len() / self.ss() as usize;
        let ts = self.cipher.tag_size();
        let mut tags = vec![0u8; n * ts];
        self.dev.read_tagged(buf, &mut tags, offset)?;
        let r = self.by_pieces(
            buf,
            offset,
            threads,
            &tags[..],
            |t, per| t.chunks(per).collect(),
            |first, data, tags| self.cipher.decrypt(first, data, tags),
        );
        r.map_err(|e| {
            self.failures.fetch_add(1, Ordering::Relaxed);
            BackendError::Integrity {
                offset: e.sector * 512,
                len: self.ss(),
            }
        })
    }

    /// Whole sectors at `offset` (aligned); `buf` is encrypted in place. Holds the write
    /// order shared ([`AeadVolume::order`]).
    fn write_whole(&self, buf: &mut [u8], offset: u64, fua: bool) -> Result<(), BackendError> {
        let (threads, _large) = self.threads_for(buf.len());
        let _shared = self
            .order
            .read()
            .map_err(|_| BackendError::Other("write order lock poisoned".into()))?;
        self.write_sectors(buf, offset, fua, threads.write)
    }

    /// Whole sectors at `offset` (aligned); `buf` is encrypted in place on `threads`
    /// threads, then written with its tags in one call. The caller holds the write order.
    fn write_sectors(
        &self,
        buf: &mut [u8],
        offset: u64,
        fua: bool,
        threads: usize,
    ) -> Result<(), BackendError> {
        let n = buf.len() / self.ss() as usize;
        let ts = self.cipher.tag_size();
        let mut tags = vec![0u8; n * ts];
        let r = self.by_pieces(
            buf,
            offset,
            threads,
            &mut tags[..],
            |t, per| t.chunks_mut(per).collect(),
            |first, data, tags| self.cipher.encrypt(first, data, tags),
        );
        r.map_err(|e| BackendError::Other(e.to_string()))?;
        self.dev.write_tagged(buf, &tags, offset, fua)
    }

    fn read(&self, buf: &mut [u8], offset: u64) -> Result<(), BackendError> {
        check_range(offset, buf.len() as u64, self.info.size_bytes)?;
        let ss = self.ss();
        let start = offset - offset % ss;
        let end = (offset + buf.len() as u64).div_ceil(ss) * ss;
        let (threads, _large) = self.threads_for((end - start) as usize);
        if start == offset && end == offset + buf.len() as u64 {
            return self.read_sectors(buf, offset, threads.read);
        }
        let mut whole = vec![0u8; (end - start) as usize];
        self.read_sectors(&mut whole, start, threads.read)?;
        let from = (offset - start) as usize;
        buf.copy_from_slice(&whole[from..from + buf.len()]);
        Ok(())
    }

    fn write(&self, buf: &[u8], offset: u64, fua: bool) -> Result<(), BackendError> {
        if self.info.caps.read_only {
            return Err(BackendError::ReadOnly);
        }
        check_range(offset, buf.len() as u64, self.info.size_bytes)?;
        if buf.is_empty() {
            return Ok(());
        }
        let ss = self.ss();
        let start = offset - offset % ss;
        let end = (offset + buf.len() as u64).div_ceil(ss) * ss;
        if start == offset && end == offset + buf.len() as u64 {
            let mut own = buf.to_vec();
            return self.write_whole(&mut own, offset, fua);
        }
        // A partial sector: the whole sector read (and authenticated), changed, rewritten.
        let (threads, _large) = self.threads_for((end - start) as usize);
        let _exclusive = self
            .order
            .write()
            .map_err(|_| BackendError::Other("write order lock poisoned".into()))?;
        let mut whole = vec![0u8; (end - start) as usize];
        self.read_sectors(&mut whole, start, threads.read)?;
        let from = (offset - start) as usize;
        whole[from..from + buf.len()].copy_from_slice(buf);
        self.write_sectors(&mut whole, start, fua, threads.write)
    }
}

impl Backend for AeadVolume {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn submit(&self, io: Io<'_>) -> Result<(), BackendError> {
        match io.kind {
            IoKind::Read(buf) => self.read(buf, io.offset),
            IoKind::Write(buf) => self.write(buf, io.offset, io.fua),
            IoKind::WriteOwned(buf) => {
                let ss = self.ss();
                if io.offset % ss == 0 && buf.len() as u64 % ss == 0 && !self.info.caps.read_only {
                    check_range(io.offset, buf.len() as u64, self.info.size_bytes)?;
                    self.write_whole(buf, io.offset, io.fua)
                } else {
                    self.write(buf, io.offset, io.fua)
                }
            }
            _ => emulate::fallback(self, io),
        }
    }

    fn flush(&self) -> Result<(), BackendError> {
        self.dev.flush()
    }

    fn integrity_failures(&self) -> Option<u64> {
        Some(self.failures())
    }
}
