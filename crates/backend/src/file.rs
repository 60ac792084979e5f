//! A regular file or a block device as storage, with buffered or `O_DIRECT` I/O.
//!
//! This is what dm-crypt's target sits on: the underlying device (`dm-crypt.c`
//! `crypt_ctr`, `dm_get_device`). Geometry comes from the kernel: a block device reports
//! its size, logical and physical block (`BLKGETSIZE64`, `BLKSSZGET`, `BLKPBSZGET`,
//! `BLKIOOPT`); a regular file reports its length, 512-byte logical blocks when buffered,
//! and under `O_DIRECT` the alignment `statx(STATX_DIOALIGN)` states (4096 when the
//! filesystem does not say, which every filesystem accepts).
//!
//! | op | regular file | block device |
//! |---|---|---|
//! | read/write | `pread`/`pwrite` loops (short counts, `EINTR`) | same |
//! | FUA write | `pwritev2(RWF_DSYNC)`, else write + `fdatasync` | same (REQ_FUA) |
//! | flush | `fdatasync` | `fdatasync` (cache flush) |
//! | discard | `fallocate(PUNCH_HOLE\|KEEP_SIZE)` if probed to work | `BLKDISCARD` if the queue allows |
//! | write zeroes | `fallocate(ZERO_RANGE)`, else punch hole, else zero writes | `BLKZEROOUT` (whole logical blocks) |
//!
//! Under `O_DIRECT` offsets and lengths must be multiples of `info().logical_block`
//! ([`BackendError::Misaligned`] otherwise). Buffer addresses need the same alignment; a
//! misaligned caller buffer is copied through a pooled [`AlignedBuf`] instead of failing.

mod map;
mod sys;

pub use map::{install_sigbus_handler, sigbus_handler_installed};
#[cfg(test)]
mod tests;

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::aligned::{is_addr_aligned, AlignedBuf};
use crate::{
    check_range, emulate, Backend, BackendError, BackendInfo, Caps, Hints, Io, IoKind, Support,
};

/// How to open a [`FileBackend`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileOptions {
    /// Open read-only; every write-class operation fails with [`BackendError::ReadOnly`].
    pub read_only: bool,
    /// Bypass the page cache (`O_DIRECT`): offsets and lengths must be aligned to
    /// `info().logical_block`.
    pub direct: bool,
}

/// Bytes per bounce buffer: misaligned `O_DIRECT` requests are copied in pieces this size.
const BOUNCE_BYTES: usize = 256 * 1024;
/// Idle bounce buffers kept for reuse. Bounds the pool at 4 MiB; more concurrent
/// misaligned requests than this allocate and free their own buffer.
const BOUNCE_POOL_MAX: usize = 16;

/// Zeroes for the zero-writing fallback of write-zeroes; aligned so `O_DIRECT` takes
/// it as is.
#[repr(C, align(65536))]
struct ZeroPage([u8; 64 * 1024]);
static ZEROS: ZeroPage = ZeroPage([0; 64 * 1024]);

/// Which write-zeroes method still works on this file (stored in an `AtomicU8`).
const ZERO_RANGE: u8 = 0;
const ZERO_PUNCH: u8 = 1;
const ZERO_WRITE: u8 = 2;

/// A regular file or block device. See the [module docs](self).
pub struct FileBackend {
    file: File,
    path: PathBuf,
    block_device: bool,
    direct: bool,
    info: BackendInfo,
    /// Reused aligned buffers for misaligned `O_DIRECT` requests.
    //
    // Why a Mutex: it is held only for one push or pop, never across I/O, so threads
    // contend for nanoseconds; the aligned fast path never touches it.
    bounce: Mutex<Vec<AlignedBuf>>,
    /// False once `pwritev2(RWF_DSYNC)` failed as unsupported; then FUA = write + fdatasync.
    dsync_ok: AtomicBool,
    /// The first write-zeroes method not yet refused with `EOPNOTSUPP` (regular files).
    zero_method: AtomicU8,
    /// Submit batches of writes through io_uring ([`FileBackend::use_io_uring`]).
    uring: bool,
    /// Read-only mapping of a buffered regular file, for [`Backend::read_with`].
    map: Option<map::Mapping>,
    /// Reads shorter than this are not lent out of the mapping ([`LEND_MIN_BYTES`]).
    lend_min: usize,
}

/// The shortest read lent out of the mapping by default. Why not every read: a mapped read
/// of a page not mapped yet takes a page fault (the kernel then maps up to 16 cached pages
/// around it), and the mapping is dropped from the page tables every 32 MiB of reads to
/// bound the resident size, so small random reads fault nearly every time. Under `perf`,
/// 4 KiB random reads at depth 32 over NBD spent about 20 % of the server's samples in
/// faulting and unmapping; `pread` into the caller's buffer and decrypting in place costs
/// one copy of 4 KiB instead. From 64 KiB on, the copy (and for 1 MiB, two passes over
/// the data instead of one) costs more than the faults (BENCHMARKING.md, the read path).
pub const LEND_MIN_BYTES: usize = 64 * 1024;

impl std::fmt::Debug for FileBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileBackend")
            .field("path", &self.path)
            .field("block_device", &self.block_device)
            .field("direct", &self.direct)
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl FileBackend {
    /// Opens a regular file or block device and probes its geometry and capabilities.
    ///
    /// Under `direct`, a regular file's size is rounded down to the logical block, since
    /// the partial block at its end cannot be read with `O_DIRECT`.
    ///
    /// # Errors
    /// [`BackendError::Open`] if the path cannot be opened (a filesystem that refuses
    /// `O_DIRECT` gives `EINVAL`), is neither a regular file nor a block device, or its
    /// geometry cannot be read.
    pub fn open(path: impl AsRef<Path>, opts: FileOptions) -> Result<Self, BackendError> {
        let path = path.as_ref().to_path_buf();
        let open_err = |source: io::Error| BackendError::Open {
            path: path.clone(),
            source,
        };
        let mut oo = OpenOptions::new();
        oo.read(true).write(!opts.read_only);
        // O_NONBLOCK: opening a FIFO read-only would otherwise block until a writer came
        // (start-up hangs, deaf to SIGTERM); it is refused below like any other file that
        // is neither regular nor a block device, and the flag is cleared for those.
        let mut flags = libc::O_NONBLOCK;
        if opts.direct {
            flags |= libc::O_DIRECT;
        }
        oo.custom_flags(flags);
        let file = oo.open(&path).map_err(open_err)?;
        let meta = file.metadata().map_err(open_err)?;
        let ft = meta.file_type();
        if ft.is_file() || ft.is_block_device() {
            sys::clear_nonblock(&file).map_err(open_err)?;
        }
        let writable = !opts.read_only;

        let (info, block_device) = if ft.is_block_device() {
            let size_bytes = sys::blk_size_bytes(&file).map_err(open_err)?;
            let logical_block = sys::blk_logical_block(&file).map_err(open_err)?.max(512);
            let physical_block = sys::blk_physical_block(&file)
                .map_err(open_err)?
                .max(logical_block);
            let optimal_block = match sys::blk_optimal_io(&file).map_err(open_err)? {
                0 => physical_block,
                n => n.max(physical_block),
            };
            let rdev = meta.rdev();
            let discard = match sys::queue_limit(rdev, "discard_max_bytes") {
                Some(n) if n > 0 && writable => Support::Native,
                _ => Support::None,
            };
            let write_zeroes = match sys::queue_limit(rdev, "write_zeroes_max_bytes") {
                _ if !writable => Support::None,
                Some(n) if n > 0 => Support::Native,
                // BLKZEROOUT still works: the kernel writes zero pages itself.
                _ => Support::Emulate,
            };
            let info = BackendInfo {
                size_bytes,
                logical_block,
                physical_block,
                optimal_block,
                caps: Caps {
                    flush: Support::Native,
                    discard,
                    write_zeroes,
                    read_only: opts.read_only,
                },
            };
            (info, true)
        } else if ft.is_file() {
            let logical_block = if opts.direct {
                match sys::dio_align(&file) {
                    Some((off, mem)) => off.max(mem).max(512),
                    None => 4096,
                }
            } else {
                512
            };
            let blksize = u32::try_from(meta.blksize()).unwrap_or(4096);
            let physical_block = if blksize.is_power_of_two() {
                blksize.max(logical_block)
            } else {
                logical_block
            };
            let mut size_bytes = meta.len();
            if opts.direct {
                size_bytes -= size_bytes % u64::from(logical_block);
            }
            // Probe hole punching where it cannot touch data: past the end of the file,
            // with KEEP_SIZE. Filesystems without it fail with EOPNOTSUPP up front.
            let punch = writable
                && sys::fallocate(
                    &file,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    meta.len(),
                    1,
                )
                .is_ok();
            let info = BackendInfo {
                size_bytes,
                logical_block,
                physical_block,
                optimal_block: physical_block,
                caps: Caps {
                    flush: Support::Native,
                    discard: if punch {
                        Support::Native
                    } else {
                        Support::None
                    },
                    write_zeroes: match (writable, punch) {
                        (false, _) => Support::None,
                        (true, true) => Support::Native,
                        (true, false) => Support::Emulate,
                    },
                    read_only: opts.read_only,
                },
            };
            (info, false)
        } else {
            return Err(open_err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file or block device",
            )));
        };

        // Buffered regular files only: under O_DIRECT reads must bypass the page cache, and
        // a block device's size can change under a mapping.
        let map = (!block_device && !opts.direct)
            .then(|| map::Mapping::new(&file, info.size_bytes))
            .flatten();
        Ok(Self {
            file,
            path,
            block_device,
            direct: opts.direct,
            info,
            bounce: Mutex::new(Vec::new()),
            dsync_ok: AtomicBool::new(true),
            zero_method: AtomicU8::new(ZERO_RANGE),
            uring: false,
            map,
            lend_min: LEND_MIN_BYTES,
        })
    }

    /// Whether reads may be lent straight out of a memory mapping ([`Backend::read_with`]);
    /// on by default for buffered regular files once the program has installed the
    /// `SIGBUS` handler ([`install_sigbus_handler`]; never without it). Turning it off uses
    /// `pread` only.
    pub fn use_mmap(&mut self, on: bool) {
        if !on {
            self.map = None;
        } else if self.map.is_none() && !self.block_device && !self.direct {
            self.map = map::Mapping::new(&self.file, self.info.size_bytes);
        }
    }

    /// Lends reads of at least `bytes` out of the mapping ([`LEND_MIN_BYTES`] by default;
    /// 0: every read, as tests of the mapped path want); shorter ones are `pread`.
    pub fn lend_reads_from(&mut self, bytes: usize) {
        self.lend_min = bytes;
    }

    /// Whether reads go through a memory mapping now.
    pub fn is_mapped(&self) -> bool {
        self.map.as_ref().is_some_and(|m| !m.poisoned())
    }

    /// Submits batches of writes (`submit_writes`) through io_uring, one system call per
    /// batch, instead of one `pwrite` per write. Returns whether it is now on (false: the
    /// kernel has no io_uring). See `ucrypt bench uring` for when it pays.
    pub fn use_io_uring(&mut self, on: bool) -> bool {
        self.uring = on && crate::uring::available();
        self.uring
    }

    /// The path this backend was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True for a block device, false for a regular file.
    pub fn is_block_device(&self) -> bool {
        self.block_device
    }

    /// True when opened with `O_DIRECT`.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    fn io_err(&self, op: &'static str, offset: u64, source: io::Error) -> BackendError {
        BackendError::Io {
            op,
            offset,
            path: self.path.clone(),
            source,
        }
    }

    fn align(&self) -> u64 {
        u64::from(self.info.logical_block)
    }

    /// Under `O_DIRECT`, offset and length must be multiples of the logical block.
    fn check_aligned(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        if !self.direct {
            return Ok(());
        }
        let align = self.align();
        if offset % align != 0 {
            return Err(BackendError::Misaligned {
                what: "offset",
                value: offset,
                align,
            });
        }
        if len % align != 0 {
            return Err(BackendError::Misaligned {
                what: "length",
                value: len,
                align,
            });
        }
        Ok(())
    }

    fn check_writable(&self) -> Result<(), BackendError> {
        if self.info.caps.read_only {
            Err(BackendError::ReadOnly)
        } else {
            Ok(())
        }
    }

    /// True when `buf` must be copied through a bounce buffer (`O_DIRECT` only).
    fn needs_bounce(&self, buf: &[u8]) -> bool {
        self.direct && !is_addr_aligned(buf, self.align())
    }

    fn take_bounce(&self) -> Result<AlignedBuf, BackendError> {
        let pooled = self
            .bounce
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        match pooled {
            Some(b) => Ok(b),
            None => AlignedBuf::zeroed(BOUNCE_BYTES, (self.align() as usize).max(4096)),
        }
    }

    fn give_bounce(&self, buf: AlignedBuf) {
        let mut pool = self.bounce.lock().unwrap_or_else(PoisonError::into_inner);
        if pool.len() < BOUNCE_POOL_MAX {
            pool.push(buf);
        }
    }

    /// Writes `buf` (aligned as `O_DIRECT` needs, if direct) with or without FUA.
    fn write_raw(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        if fua && self.dsync_ok.load(Ordering::Relaxed) {
            match sys::pwrite_dsync(&self.file, buf, offset) {
                Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::ENOSYS)) => {
                    // Old kernel: remember, and write + fdatasync below (rewriting the same
                    // bytes is harmless if any landed).
                    self.dsync_ok.store(false, Ordering::Relaxed);
                }
                r => return r,
            }
        }
        self.file.write_all_at(buf, offset)?;
        if fua {
            self.file.sync_data()?;
        }
        Ok(())
    }

    fn read_bounced(&self, buf: &mut [u8], offset: u64) -> Result<(), BackendError> {
        let mut bounce = self.take_bounce()?;
        let mut result = Ok(());
        for (i, piece) in buf.chunks_mut(BOUNCE_BYTES).enumerate() {
            let at = offset + (i * BOUNCE_BYTES) as u64;
            let tmp = &mut bounce[..piece.len()];
            if let Err(e) = self.file.read_exact_at(tmp, at) {
                result = Err(self.io_err("read", at, e));
                break;
            }
            piece.copy_from_slice(tmp);
        }
        self.give_bounce(bounce);
        result
    }

    fn write_bounced(&self, buf: &[u8], offset: u64, fua: bool) -> Result<(), BackendError> {
        let mut bounce = self.take_bounce()?;
        let mut result = Ok(());
        for (i, piece) in buf.chunks(BOUNCE_BYTES).enumerate() {
            let at = offset + (i * BOUNCE_BYTES) as u64;
            let tmp = &mut bounce[..piece.len()];
            tmp.copy_from_slice(piece);
            if let Err(e) = self.write_raw(tmp, at, false) {
                result = Err(self.io_err("write", at, e));
                break;
            }
        }
        self.give_bounce(bounce);
        result?;
        if fua {
            self.file
                .sync_data()
                .map_err(|e| self.io_err("write (FUA sync)", offset, e))?;
        }
        Ok(())
    }

    /// Write-zeroes by writing zero pages (the emulation).
    fn write_zero_pages(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(ZEROS.0.len() as u64) as usize;
            self.file.write_all_at(&ZEROS.0[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
    }

    /// Write-zeroes on a regular file: ZERO_RANGE, else PUNCH_HOLE, else zero writes; a
    /// method refused with `EOPNOTSUPP` is not tried again.
    fn zero_file_range(&self, offset: u64, len: u64) -> io::Result<()> {
        loop {
            let method = self.zero_method.load(Ordering::Relaxed);
            let mode = match method {
                ZERO_RANGE => libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                ZERO_PUNCH => libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                _ => return self.write_zero_pages(offset, len),
            };
            match sys::fallocate(&self.file, mode, offset, len) {
                Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                    let next = if method == ZERO_RANGE {
                        ZERO_PUNCH
                    } else {
                        ZERO_WRITE
                    };
                    self.zero_method.store(next, Ordering::Relaxed);
                }
                r => return r,
            }
        }
    }
}

impl FileBackend {
    fn read(&self, buf: &mut [u8], offset: u64) -> Result<(), BackendError> {
        check_range(offset, buf.len() as u64, self.info.size_bytes)?;
        if buf.is_empty() {
            return Ok(());
        }
        self.check_aligned(offset, buf.len() as u64)?;
        if self.needs_bounce(buf) {
            return self.read_bounced(buf, offset);
        }
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| self.io_err("read", offset, e))
    }

    /// `None`: not lent (see [`IoKind::Lend`]).
    fn lend(
        &self,
        offset: u64,
        len: usize,
        f: &mut dyn FnMut(&[u8]),
    ) -> Option<Result<(), BackendError>> {
        let map = self.map.as_ref().filter(|m| !m.poisoned())?;
        // A zero-length call is how a caller asks whether reads are lent at all.
        if len > 0 && len < self.lend_min {
            return None;
        }
        if let Err(e) = check_range(offset, len as u64, self.info.size_bytes) {
            return Some(Err(e));
        }
        match map.read(offset, len, f) {
            Ok(()) => Some(Ok(())),
            // The file shrank under the mapping (here or in a concurrent read): what `f`
            // saw may hold zeros; the caller redoes the read with `pread`, which reports
            // a range past the new end as the short read it is.
            Err(map::Truncated) => None,
        }
    }

    fn write(&self, buf: &[u8], offset: u64, fua: bool) -> Result<(), BackendError> {
        self.check_writable()?;
        check_range(offset, buf.len() as u64, self.info.size_bytes)?;
        if buf.is_empty() {
            return Ok(());
        }
        self.check_aligned(offset, buf.len() as u64)?;
        if self.needs_bounce(buf) {
            return self.write_bounced(buf, offset, fua);
        }
        self.write_raw(buf, offset, fua)
            .map_err(|e| self.io_err("write", offset, e))
    }

    /// Holes of a regular file, from `SEEK_HOLE`/`SEEK_DATA` (block devices: unknown).
    fn find_holes(&self, offset: u64, len: u64) -> Option<Vec<(u64, u64)>> {
        use std::os::fd::AsRawFd;
        if self.block_device {
            return None;
        }
        let end = offset.checked_add(len)?.min(self.info.size_bytes);
        let fd = self.file.as_raw_fd();
        let mut out = Vec::new();
        let mut at = offset;
        while at < end {
            // SAFETY: lseek on the descriptor this backend owns; no memory is passed.
            let hole = unsafe { libc::lseek(fd, at as libc::off_t, libc::SEEK_HOLE) };
            if hole < 0 {
                return None;
            }
            let hole = hole as u64;
            if hole >= end {
                break;
            }
            // SAFETY: as above.
            let data = unsafe { libc::lseek(fd, hole as libc::off_t, libc::SEEK_DATA) };
            let data = if data < 0 {
                // ENXIO: no data after the hole, up to the end of the file.
                if std::io::Error::last_os_error().raw_os_error() != Some(libc::ENXIO) {
                    return None;
                }
                end
            } else {
                (data as u64).min(end)
            };
            if data > hole {
                out.push((hole, data - hole));
            }
            at = data.max(hole + 1);
        }
        Some(out)
    }

    fn discard_range(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        self.check_writable()?;
        if self.info.caps.discard == Support::None {
            return Err(BackendError::Unsupported("discard"));
        }
        check_range(offset, len, self.info.size_bytes)?;
        if len == 0 {
            return Ok(());
        }
        if self.block_device {
            // BLKDISCARD needs logical-block alignment. Discard is advisory, so shrink the
            // range to the whole blocks inside it rather than fail.
            let align = self.align();
            let start = offset.div_ceil(align) * align;
            let end = (offset + len) / align * align;
            if start < end {
                sys::blk_discard(&self.file, start, end - start)
                    .map_err(|e| self.io_err("discard", start, e))?;
            }
            Ok(())
        } else {
            sys::fallocate(
                &self.file,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset,
                len,
            )
            .map_err(|e| self.io_err("discard", offset, e))
        }
    }

    fn zero_range(&self, offset: u64, len: u64, fua: bool) -> Result<(), BackendError> {
        self.check_writable()?;
        check_range(offset, len, self.info.size_bytes)?;
        if len == 0 {
            return Ok(());
        }
        self.check_aligned(offset, len)?;
        if self.block_device {
            let align = self.align();
            if offset % align != 0 || len % align != 0 {
                // BLKZEROOUT refuses partial logical blocks even without O_DIRECT.
                let (what, value) = if offset % align != 0 {
                    ("offset", offset)
                } else {
                    ("length", len)
                };
                return Err(BackendError::Misaligned { what, value, align });
            }
            sys::blk_zeroout(&self.file, offset, len)
        } else {
            self.zero_file_range(offset, len)
        }
        .map_err(|e| self.io_err("write_zeroes", offset, e))?;
        if fua {
            self.file
                .sync_data()
                .map_err(|e| self.io_err("write_zeroes (FUA sync)", offset, e))?;
        }
        Ok(())
    }
}

impl Backend for FileBackend {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn submit(&self, io: Io<'_>) -> Result<(), BackendError> {
        match io.kind {
            IoKind::Read(buf) => self.read(buf, io.offset),
            IoKind::Write(buf) => self.write(buf, io.offset, io.fua),
            IoKind::Lend { len, f } => self
                .lend(io.offset, len, f)
                .unwrap_or(Err(BackendError::Unsupported("lend"))),
            IoKind::Holes { len, out } => {
                *out = self
                    .find_holes(io.offset, len)
                    .ok_or(BackendError::Unsupported("holes"))?;
                Ok(())
            }
            IoKind::Discard(len) => self.discard_range(io.offset, len),
            IoKind::WriteZeroes(len) => self.zero_range(io.offset, len, io.fua),
            _ => emulate::fallback(self, io),
        }
    }

    fn submit_writes(&self, batch: &[crate::WriteOp<'_>]) -> Result<(), BackendError> {
        let direct_ok = |w: &crate::WriteOp<'_>| !self.needs_bounce(w.buf);
        if !self.uring || batch.len() < 2 || !batch.iter().all(direct_ok) {
            for w in batch {
                self.write(w.buf, w.offset, w.fua)?;
            }
            return Ok(());
        }
        self.check_writable()?;
        let mut ops = [crate::uring::UringWrite {
            offset: 0,
            buf: &[],
            fua: false,
        }; 64];
        for chunk in batch.chunks(ops.len()) {
            for (op, w) in ops.iter_mut().zip(chunk) {
                check_range(w.offset, w.buf.len() as u64, self.info.size_bytes)?;
                self.check_aligned(w.offset, w.buf.len() as u64)?;
                *op = crate::uring::UringWrite {
                    offset: w.offset,
                    buf: w.buf,
                    fua: w.fua,
                };
            }
            crate::uring::write_batch(self.file.as_raw_fd(), &ops[..chunk.len()])
                .map_err(|e| self.io_err("io_uring write", chunk[0].offset, e))?;
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), BackendError> {
        self.file
            .sync_data()
            .map_err(|e| self.io_err("flush", 0, e))
    }

    /// A local file or device. A read the page cache does not hold waits for the disk;
    /// the NBD server notices slow requests and spreads them over threads again.
    fn hints(&self) -> Hints {
        Hints {
            local: true,
            ..Hints::default()
        }
    }
}
