//! LUKS2 reencryption (re-keying) in userspace, interchangeable with `cryptsetup reencrypt`.
//!
//! ```text
//!  init:   libcryptsetup: new keyslot with a random unbound key, then
//!          crypt_reencrypt_init_by_passphrase(INITIALIZE_ONLY): the reencrypt keyslot,
//!          backup segments, digests and requirement, byte for byte cryptsetup's
//!  run:    format::luks2::reencrypt (state, segment layouts, digest check)
//!          + format::luks2::disk (both header copies, cryptsetup's write order)
//!          per hotzone: read old ciphertext ─► resilience data into the reencrypt
//!          keyslot area + header "hot" ─► decrypt old key, encrypt new key (all cores)
//!          ─► write, fdatasync ─► header "post"
//!  finish: old keyslots wiped and destroyed, then the reencrypt keyslot, backup segments,
//!          requirement and unused digests, as cryptsetup leaves the header
//! ```
//!
//! Offline only: the caller holds the image (ucrypt's image locks); nothing else may
//! write the data area meanwhile.

use crate::error::{anyhow, bail, Context, Result};
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use ucrypt_crypto::{CipherSpec, Sector512, SectorCipher, SectorParams, SectorSize, VolumeKey};
use ucrypt_format::kdf::Hash;
use ucrypt_format::luks2::disk::{Header, Io};
use ucrypt_format::luks2::json::Json;
use ucrypt_format::luks2::reencrypt::{self, Progress, Reencrypt, Resilience};
use ucrypt_format::luks2::{self, Metadata};
use ucrypt_format::FormatError;
use zeroize::Zeroizing;

/// Largest hotzone ucrypt uses by default (cryptsetup's offline default is up to 1 GiB;
/// 64 MiB keeps the buffer small and the header writes rare).
pub const DEFAULT_MAX_HOTZONE: u64 = 64 << 20;

/// What the data pass is asked to do.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Largest hotzone in bytes.
    pub max_hotzone: u64,
    /// Stop (cleanly, metadata consistent) after this many bytes of progress; for tests.
    pub stop_after: Option<u64>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            max_hotzone: DEFAULT_MAX_HOTZONE,
            stop_after: None,
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The volume is under the new key only; the reencryption metadata is gone.
    Finished,
    /// Stopped (signal or `stop_after`) with consistent metadata; resume later.
    Interrupted,
}

/// Progress report: (bytes done, bytes in the data area).
pub type ProgressFn<'a> = dyn FnMut(u64, u64) + 'a;

/// An open reencryption: the device, its header, the state and both keys.
pub struct Run {
    /// The header's device (with an attached header, the data's as well).
    file: Box<dyn Io>,
    /// The data device when the header is detached (`--header`).
    data: Option<(Box<dyn Io>, String)>,
    device: String,
    header: Header,
    state: Reencrypt,
    device_size: u64,
    old: Box<dyn SectorCipher>,
    new: Box<dyn SectorCipher>,
    /// Both volume keys, for [`Run::side_lines`] (online reencryption serves both sides).
    keys: (VolumeKey, VolumeKey),
    /// The data device opened with `O_DIRECT`, for the resilient passes' hotzone writes
    /// (see [`write_direct`]); `None` where it cannot be opened so (tmpfs) or the I/O is a
    /// caller's model ([`Run::open_with`]).
    direct: Option<File>,
}

/// Keeps a served volume's client I/O off each hotzone while the data pass rewrites it
/// (online reencryption, `crate::instance::reencrypting`).
pub trait Gate: Sync {
    /// Before the pass reads data-area bytes `[at, at + len)`: from now on no client
    /// request may touch them; returns once the requests already there have finished.
    fn hold(&self, at: u64, len: u64);
    /// Once `[at, at + len)` is under the new key and the header says so: requests there
    /// go to the new key from now on.
    fn release(&self, at: u64, len: u64);
}

fn fe(e: FormatError) -> crate::error::Error {
    crate::error::Error::Format(e)
}

/// The data area's size: the device less the data offset, checked against both sector
/// sizes.
fn data_size(path: &Path, device: &str, st: &Reencrypt) -> Result<u64> {
    use std::io::{Seek, SeekFrom};
    // Seeking to the end gives the size of block devices as well as files.
    let len = File::open(path)
        .and_then(|mut f| f.seek(SeekFrom::End(0)))
        .with_context(|| format!("reading the size of {device}"))?;
    let size = len.checked_sub(st.new.offset).ok_or_else(|| {
        anyhow!(
            "{device} ({len} bytes) is smaller than the data offset {}",
            st.new.offset
        )
    })?;
    let align = u64::from(st.old.sector_size.max(st.new.sector_size));
    if size % align != 0 {
        bail!("the data area of {device} ({size} bytes) is not a multiple of the {align}-byte sector size");
    }
    Ok(size)
}

fn open_rw(path: &Path) -> Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))
}

/// The key of digest `digest`: tries the keyslots bound to it with `passphrase`. No
/// digest (a linear side, plaintext): the empty key of `cipher_null`.
fn key_of(
    path: &Path,
    meta: &Metadata,
    digest: Option<u32>,
    which: &str,
    passphrase: &[u8],
) -> Result<VolumeKey> {
    let Some(digest) = digest else {
        return Ok(VolumeKey::new(Vec::new()));
    };
    let slots = meta
        .digests
        .get(&digest)
        .map(|d| d.keyslots.clone())
        .unwrap_or_default();
    let mut last = None;
    for slot in slots {
        match luks2::unlock(path, meta, Some(slot), passphrase, true) {
            Ok((_, key)) => return Ok(key),
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) => fe(e),
        None => anyhow!("no keyslot holds the key of digest {digest}"),
    })
    .with_context(|| format!("unlocking the {which} volume key (digest {digest})"))
}

fn cipher(side: &reencrypt::Side, key: &VolumeKey) -> Result<Box<dyn SectorCipher>> {
    let spec: CipherSpec = side
        .encryption
        .parse()
        .with_context(|| format!("cipher {}", side.encryption))?;
    // A `cipher_null` segment (cryptsetup's "custom encryption" to re-key later) still has
    // a digest and a volume key in its keyslot; the cipher takes none, as dm-crypt's.
    let empty = VolumeKey::empty();
    let null = side.encryption.split('-').next() == Some("cipher_null");
    Ok(spec.build(
        if null { &empty } else { key },
        SectorParams {
            sector_size: SectorSize::new(side.sector_size)?,
            iv_offset: 0,
            iv_large_sectors: false,
        },
    )?)
}

/// The IV sector of the data area's first byte: the encrypted side's (the new one unless
/// decrypting; re-keying keeps the IVs).
fn iv_base(st: &Reencrypt) -> u64 {
    if st.new.linear {
        st.old.iv_tweak
    } else {
        st.new.iv_tweak
    }
}

/// Both ciphers and the IV of the data area's first sector.
#[derive(Clone, Copy)]
struct Cipher<'a> {
    old: &'a dyn SectorCipher,
    new: &'a dyn SectorCipher,
    iv_base: u64,
}

/// One hotzone of a resilient pass on its way from the workers to the I/O thread and back
/// (the buffers are reused): old ciphertext, new ciphertext, checksums.
#[derive(Default)]
struct Hotzone {
    at: u64,
    len: u64,
    // Old and new ciphertext only (plaintext lives in `out` for the moment between a
    // piece's decryption and encryption), so not zeroized: wiping two hotzones of bytes
    // cost as much as a cipher pass.
    src: Vec<u8>,
    out: Vec<u8>,
    sums: Vec<u8>,
}

/// Makes `buf` at least `n` bytes long. A new buffer is the allocator's zeroed memory
/// (fresh pages, faulted in by the threads that first write them, in parallel) rather than
/// zeros this thread writes: filling two 64 MiB buffers cost about 0.2 s before the first
/// read (page faults in this VM run at about 0.5 GB/s).
fn room(buf: &mut Vec<u8>, n: usize) {
    if buf.len() < n {
        *buf = vec![0u8; n];
    }
}

/// Alignment of the hotzone buffers' windows: what `O_DIRECT` asks of a buffer's address
/// (the logical block size; 4096 covers every device).
const DIRECT_ALIGN: usize = 4096;

/// The `n`-byte window of `buf` that starts at a [`DIRECT_ALIGN`]-aligned address, growing
/// `buf` (as [`room`]) when it is too short.
fn window(buf: &mut Vec<u8>, n: usize) -> &mut [u8] {
    room(buf, n + DIRECT_ALIGN);
    let off = (DIRECT_ALIGN - buf.as_ptr() as usize % DIRECT_ALIGN) % DIRECT_ALIGN;
    &mut buf[off..off + n]
}

/// The window [`window`] gave out, to read.
fn window_of(buf: &[u8], n: usize) -> &[u8] {
    let off = (DIRECT_ALIGN - buf.as_ptr() as usize % DIRECT_ALIGN) % DIRECT_ALIGN;
    &buf[off..off + n]
}

/// The data device opened for `O_DIRECT` writes, if it can be.
fn open_direct(path: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .ok()
}

/// Writes a whole hotzone (or the journal) at `at`: through `direct` (`O_DIRECT`) when
/// there is one, else through `io`. A hotzone is written once, in full, and synced at
/// once: through the page cache that is a copy into it and then the writeback of every
/// page by the sync, about a fifth of a checksum pass's CPU in the kernel
/// (`copy_folio_from_iter_atomic`, ext4's writeback) taken from the threads that
/// re-encrypt the next hotzone. `O_DIRECT` hands the buffer to the device instead; the
/// sync that follows (on `io`, the same inode) still flushes the device's cache, so the
/// order on disk is the same. The kernel invalidates the page cache over the range, so
/// buffered readers (the next open, an instance's clients, held off the hotzone
/// meanwhile) see the new bytes. A device that refuses the alignment (`EINVAL`) is
/// written through `io` instead: the same bytes.
///
/// The buffer goes out as [`WRITE_PIECE`]-byte writes, [`WRITES_IN_FLIGHT`] at a time (one
/// thread each), which kept this VM's virtio disk busier than one hotzone-sized write
/// (`fio`, 512 MiB, `O_DIRECT`, fsync every 64 MiB, load 7: 1.7-1.8 GB/s as 64 MiB writes,
/// 2.0-2.3 GB/s as 4 MiB writes 4 deep). All of them complete before this returns, so the
/// sync after it covers the whole buffer as before. With `split` false the buffer goes
/// out as one write: the data shift's pass (not measured here) keeps one write per
/// hotzone, which its interoperability tests count on (they kill the run at the n-th
/// `pwrite64` to stop it at a given step).
fn write_direct(
    direct: Option<&File>,
    io: &dyn Io,
    buf: &[u8],
    at: u64,
    split: bool,
) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    if let Some(f) = direct {
        let pieces = if split {
            buf.len().div_ceil(WRITE_PIECE)
        } else {
            1
        };
        let r = if pieces <= 1 {
            f.write_all_at(buf, at)
        } else {
            let next = AtomicU64::new(0);
            let failed = AtomicBool::new(false);
            let work = || -> std::io::Result<()> {
                loop {
                    let off = next.fetch_add(WRITE_PIECE as u64, Ordering::Relaxed) as usize;
                    if off >= buf.len() || failed.load(Ordering::Relaxed) {
                        return Ok(());
                    }
                    let piece = &buf[off..buf.len().min(off + WRITE_PIECE)];
                    if let Err(e) = f.write_all_at(piece, at + off as u64) {
                        failed.store(true, Ordering::Relaxed);
                        return Err(e);
                    }
                }
            };
            on_threads(WRITES_IN_FLIGHT.min(pieces), &work)
        };
        match r {
            // Refused alignment: the same bytes through `io` (a piece that was written
            // already is written again, with the same bytes).
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            r => return r,
        }
    }
    io.write_at(buf, at)
}

/// Bytes of one `O_DIRECT` write of [`write_direct`] (a multiple of [`DIRECT_ALIGN`]).
const WRITE_PIECE: usize = 4 << 20;

/// How many [`WRITE_PIECE`] writes [`write_direct`] keeps in flight.
const WRITES_IN_FLIGHT: usize = 4;

/// Runs `work` on `threads` threads (this one among them) and returns the first error.
fn on_threads(
    threads: usize,
    work: &(dyn Fn() -> std::io::Result<()> + Sync),
) -> std::io::Result<()> {
    std::thread::scope(|s| {
        let others: Vec<_> = (1..threads).map(|_| s.spawn(work)).collect();
        let mine = work();
        others.into_iter().fold(mine, |first, h| {
            let r = h
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("a re-encryption thread panicked")));
            first.and(r)
        })
    })
}

/// As [`on_threads`], all on new threads that run `nice_up` nice levels below the calling
/// thread (Linux's nice value is per thread; raising it needs no privilege).
fn on_lower_threads(
    threads: usize,
    nice_up: i32,
    work: &(dyn Fn() -> std::io::Result<()> + Sync),
) -> std::io::Result<()> {
    if nice_up == 0 {
        return on_threads(threads, work);
    }
    // SAFETY: getpriority has no memory effects.
    let base = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    let lowered = move || {
        // SAFETY: as above; on Linux PRIO_PROCESS with id 0 is the calling thread only.
        unsafe {
            libc::setpriority(libc::PRIO_PROCESS, 0, base + nice_up);
        }
        work()
    };
    std::thread::scope(|s| {
        let all: Vec<_> = (0..threads).map(|_| s.spawn(lowered)).collect();
        let mut first = Ok(());
        for h in all {
            let r = h
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("a re-encryption thread panicked")));
            if first.is_ok() {
                first = r;
            }
        }
        first
    })
}

/// How many nice levels the `journal` pass's re-encrypting threads run below its I/O
/// thread ([`transform`]). Each step of the I/O thread's chain (write, sync, header copy,
/// sync, ...) starts when the previous one's system call returns, so a woken I/O thread
/// that waits for a CPU the re-encrypting threads hold delays the whole chain. `journal`,
/// whose chain is its bound (its I/O thread was busy 1.28 s of a 1.45 s run), fell from
/// 2.02 to 1.85 s (512 MiB, medians of 7 interleaved runs, load 9.7; in one traced run
/// each its header updates took 0.54 s without, 0.29 s with); `checksum`, bound by the
/// re-encrypting threads' CPU at that load, moved within the noise (0.67-4.07 s for one
/// binary), and keeps its threads' priority: under load its bound is their CPU time, which
/// a lower priority would give to other processes.
const WORKER_NICE: i32 = 2;

/// Bytes one thread reads, converts and (for [`rekey_in_place`]) writes at a time: small
/// enough to stay in the core's cache from the read to the write (one pass each over a
/// whole 32 MiB slice ran at half the speed), large enough to keep the system calls few.
const PIECE: usize = 256 << 10;

/// The number of threads the data pass uses: one per CPU.
fn workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Re-encrypts data-area bytes `[at, at + len)` in place on the device (data area at device
/// offset `base`), streaming: every thread takes the next piece, reads it, decrypts it with
/// the old key, encrypts it with the new and writes it back while it is in the core's
/// cache, the shape of `ucrypt write` (no hotzone-sized buffer, no separate writer).
/// Pieces are handed out one at a time, so a thread the scheduler holds back (the machine
/// is shared) does not hold the others back. For resilience `none` only: a piece is
/// overwritten with nothing kept to recover it.
///
/// # Errors
/// The first read or write error; the other threads stop at their next piece.
fn rekey_in_place(
    c: Cipher<'_>,
    io: &dyn Io,
    base: u64,
    at: u64,
    len: u64,
    align: usize,
    threads: usize,
) -> std::io::Result<()> {
    let piece = PIECE.div_ceil(align) * align;
    let next = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let work = || -> std::io::Result<()> {
        // Holds plaintext between the decryption and the encryption of a piece.
        let mut buf = Zeroizing::new(vec![0u8; piece]);
        loop {
            let off = next.fetch_add(piece as u64, Ordering::Relaxed);
            if off >= len || failed.load(Ordering::Relaxed) {
                return Ok(());
            }
            let b = &mut buf[..(len - off).min(piece as u64) as usize];
            let pos = at + off;
            let r = io.read_at(b, base + pos).and_then(|()| {
                let first = Sector512(c.iv_base + pos / 512);
                c.old.decrypt(first, b);
                c.new.encrypt(first, b);
                io.write_at(b, base + pos)
            });
            if r.is_err() {
                failed.store(true, Ordering::Relaxed);
                return r;
            }
        }
    };
    on_threads(threads, &work)
}

/// Reads the old ciphertext of data-area bytes from `at` (device offset `from.1`) and
/// re-encrypts it into `out` on `threads` threads, piece by piece (each piece read, summed,
/// decrypted and encrypted while it is in the core's cache; pieces handed out one at a
/// time). With `src` (the journal) the old ciphertext is kept there and decrypted from it
/// into `out`; without (checksums need only its digests, a data shift leaves the old data
/// where it is) it is read into `out` and re-encrypted in place: one hotzone-sized buffer less to fault in and to stream through
/// memory. With `sums`, also the digest of every `bs`-byte block of the old ciphertext
/// (the checksum resilience data), in the same pass. With `nice_up` above 0 the threads
/// run that many nice levels below the caller (see [`WORKER_NICE`]).
///
/// # Errors
/// The first read error.
#[allow(clippy::too_many_arguments)]
fn transform(
    c: Cipher<'_>,
    from: (&dyn Io, u64),
    at: u64,
    src: Option<&mut [u8]>,
    out: &mut [u8],
    sums: Option<(Hash, usize, &mut [u8])>,
    align: usize,
    threads: usize,
    nice_up: i32,
) -> std::io::Result<()> {
    let unit = sums.as_ref().map_or(align, |(_, bs, _)| align.max(*bs));
    let piece = PIECE.div_ceil(unit) * unit;
    let (io, base) = from;
    let (hash, bs, sums) = match sums {
        Some((h, bs, s)) => (Some(h), bs, Some(s)),
        None => (None, 1, None),
    };
    let hl = hash.map_or(0, |h| h.size());
    type Sums<'s> = Box<dyn Iterator<Item = Option<&'s mut [u8]>> + Send + 's>;
    let sums: Sums<'_> = match sums {
        Some(s) => Box::new(s.chunks_mut(piece / bs * hl).map(Some)),
        None => Box::new(std::iter::repeat_with(|| None)),
    };
    type Src<'s> = Box<dyn Iterator<Item = Option<&'s mut [u8]>> + Send + 's>;
    let src: Src<'_> = match src {
        Some(s) => Box::new(s.chunks_mut(piece).map(Some)),
        None => Box::new(std::iter::repeat_with(|| None)),
    };
    let jobs = Mutex::new(src.zip(out.chunks_mut(piece)).zip(sums).enumerate());
    let failed = AtomicBool::new(false);
    let work = || -> std::io::Result<()> {
        loop {
            let job = jobs.lock().unwrap_or_else(PoisonError::into_inner).next();
            let Some((j, ((mut src, out), sums))) = job else {
                return Ok(());
            };
            if failed.load(Ordering::Relaxed) {
                return Ok(());
            }
            let pos = (j * piece) as u64;
            let first = Sector512(c.iv_base + (at + pos) / 512);
            let read = match &mut src {
                Some(src) => io.read_at(src, base + pos),
                None => io.read_at(out, base + pos),
            };
            if let Err(e) = read {
                failed.store(true, Ordering::Relaxed);
                return Err(e);
            }
            if let (Some(h), Some(sums)) = (hash, sums) {
                let old: &[u8] = match &src {
                    Some(src) => src,
                    None => out,
                };
                for (block, sum) in old.chunks(bs).zip(sums.chunks_mut(hl)) {
                    sum.copy_from_slice(&h.digest(&[block]));
                }
            }
            match src {
                Some(src) => c.old.decrypt_from(first, src, out),
                None => c.old.decrypt(first, out),
            }
            c.new.encrypt(first, out);
        }
    };
    on_lower_threads(threads, nice_up, &work)
}

impl Run {
    /// Opens `path` (header and data on one device), unlocks the old and new keys with
    /// `passphrase`, checks the reencryption digest.
    ///
    /// # Errors
    /// Not in reencryption, an unsupported kind (a data shift other than `--encrypt
    /// --reduce-device-size`'s, cryptsetup < 2.4's metadata), a passphrase that opens
    /// neither key, a digest that does not match.
    pub fn open(path: &Path, passphrase: &[u8]) -> Result<Run> {
        let mut run = Self::open_parts(Box::new(open_rw(path)?), path, None, passphrase)?;
        run.direct = open_direct(path);
        Ok(run)
    }

    /// As [`Run::open`] with a detached header: the LUKS2 header (keyslots, reencrypt
    /// area) on `header`, the data area (from the segments' offset, usually 0) on `data`.
    ///
    /// # Errors
    /// As [`Run::open`].
    pub fn open_detached(header: &Path, data: &Path, passphrase: &[u8]) -> Result<Run> {
        let io = Box::new(open_rw(data)?);
        let mut run = Self::open_parts(
            Box::new(open_rw(header)?),
            header,
            Some((io, data)),
            passphrase,
        )?;
        run.direct = open_direct(data);
        Ok(run)
    }

    /// As [`Run::open`], with the device's I/O through `io` (a test's model of a volatile
    /// write cache); `path` names the same device (its size, and the keyslots read by the
    /// pure-Rust unlock, which the data pass never changes).
    ///
    /// # Errors
    /// As [`Run::open`].
    pub fn open_with(io: Box<dyn Io>, path: &Path, passphrase: &[u8]) -> Result<Run> {
        Self::open_parts(io, path, None, passphrase)
    }

    /// As [`Run::open_detached`], with the header's and the data device's I/O through
    /// `header_io` and `data_io` (a test's model of volatile write caches).
    ///
    /// # Errors
    /// As [`Run::open`].
    pub fn open_detached_with(
        header_io: Box<dyn Io>,
        header: &Path,
        data_io: Box<dyn Io>,
        data: &Path,
        passphrase: &[u8],
    ) -> Result<Run> {
        Self::open_parts(header_io, header, Some((data_io, data)), passphrase)
    }

    fn open_parts(
        io: Box<dyn Io>,
        path: &Path,
        data: Option<(Box<dyn Io>, &Path)>,
        passphrase: &[u8],
    ) -> Result<Run> {
        let device = path.display().to_string();
        let header = Header::read(io.as_ref(), &device).map_err(fe)?;
        if !reencrypt::in_reencryption(&header.json) {
            bail!(
                "{device} is not in LUKS2 reencryption (no \"{}\" requirement)",
                reencrypt::REQUIREMENT
            );
        }
        // The size needs the data offset: read the state with a provisional size first.
        let probe = Reencrypt::load(&header.json, u64::MAX).map_err(fe)?;
        let device_size = match &data {
            Some((_, d)) => data_size(d, &d.display().to_string(), &probe)?,
            None => data_size(path, &device, &probe)?,
        };
        let data = data.map(|(io, d)| (io, d.display().to_string()));
        let state = Reencrypt::load(&header.json, device_size).map_err(fe)?;
        if let Some((shift, s)) = state.decrypt_shifted() {
            // The data area is the device less the shift, the moved segment its start.
            if device_size < shift + s {
                bail!(
                    "{device} ({device_size} bytes) is smaller than its data shift ({shift} \
                     bytes) and moved segment ({s} bytes)"
                );
            }
        } else if let Some(m) = &state.moved {
            // The last hotzone reads a whole shift from the moved copy: the device must
            // still end where it did when the encryption started.
            let shift = state.new.offset - state.old.offset;
            let len = device_size + state.new.offset;
            if len < m.offset + shift {
                bail!(
                    "{device} ({len} bytes) is smaller than when its encryption with a data \
                     shift started ({} bytes); its moved data would be lost",
                    m.offset + shift
                );
            }
        }
        // With a data shift the pass covers the data before the moved copy only.
        let device_size = state.data_length(device_size);
        let meta = Metadata::parse(&header.json.to_compact()).map_err(fe)?;
        let new_key = key_of(path, &meta, state.new.digest, "new", passphrase)?;
        let new = cipher(&state.new, &new_key)?;
        let old_key = match key_of(path, &meta, state.old.digest, "old", passphrase) {
            Ok(k) => k,
            // All data is under the new key and only the clean-up is left: the old key's
            // keyslot may already be wiped (a crash inside the clean-up, between a
            // keyslot's wipe and the header write that drops it). Finishing wipes and
            // deletes metadata only, so it proceeds with the new key alone. A decryption
            // has no new key to check the passphrase against, but once it is done the
            // whole data area is plaintext: the old key guards nothing any more, and
            // finishing only wipes the keyslots that still hold it.
            Err(_) if state.progress == (Progress::Clean { done: device_size }) => {
                return Ok(Run {
                    file: io,
                    data,
                    device,
                    header,
                    old: cipher(&state.new, &new_key)?,
                    state,
                    device_size,
                    new,
                    keys: (VolumeKey::new(new_key.as_bytes().to_vec()), new_key),
                    direct: None,
                })
            }
            Err(e) => return Err(e),
        };
        state
            .verify(&header.json, old_key.as_bytes(), new_key.as_bytes())
            .map_err(fe)?;
        let old = cipher(&state.old, &old_key)?;
        Ok(Run {
            file: io,
            data,
            device,
            header,
            state,
            device_size,
            old,
            new,
            keys: (old_key, new_key),
            direct: None,
        })
    }

    /// Bytes of the data area.
    pub fn device_size(&self) -> u64 {
        self.device_size
    }

    /// Bytes already under the new key (the start of a crashed hotzone while it is not
    /// recovered).
    pub fn done(&self) -> u64 {
        match self.state.progress {
            Progress::Clean { done } => done,
            Progress::Crashed { offset, length } => {
                self.state.done_before(offset, length, self.device_size)
            }
        }
    }

    /// The resilience mode recorded in the header.
    pub fn resilience(&self) -> &Resilience {
        &self.state.resilience
    }

    /// Whether this is a re-key from the start of the data area to its end (cryptsetup's
    /// mode `reencrypt`, direction `forward`): the one kind ucrypt runs online.
    pub fn forward_rekey(&self) -> bool {
        self.state.mode == reencrypt::Mode::Reencrypt && !self.state.backward()
    }

    /// dm-crypt table lines of the old and the new side, each over the whole data area of
    /// `device` (the data device's name as the served instance opens it), with `opts`
    /// besides each side's sector size: what an online reencryption serves on either side
    /// of its moving boundary.
    ///
    /// # Errors
    /// A side's cipher spec that does not parse.
    pub fn side_lines(
        &self,
        device: &str,
        opts: &[ucrypt_format::OptParam],
    ) -> Result<(ucrypt_format::TableLine, ucrypt_format::TableLine)> {
        let line = |side: &reencrypt::Side, key: &VolumeKey| -> Result<ucrypt_format::TableLine> {
            let mut o = opts.to_vec();
            if side.sector_size != 512 {
                o.push(ucrypt_format::OptParam::SectorSize(side.sector_size));
            }
            Ok(ucrypt_format::TableLine {
                start: 0,
                length: self.device_size / 512,
                cipher: side
                    .encryption
                    .parse()
                    .with_context(|| format!("cipher {}", side.encryption))?,
                key: ucrypt_format::KeySource::Hex(VolumeKey::new(key.as_bytes().to_vec())),
                iv_offset: side.iv_tweak,
                device: device.to_string().into(),
                offset: side.offset / 512,
                opts: o,
            })
        };
        Ok((
            line(&self.state.old, &self.keys.0)?,
            line(&self.state.new, &self.keys.1)?,
        ))
    }

    fn write_header(&mut self) -> Result<()> {
        self.header
            .write(self.file.as_ref(), &self.device)
            .map_err(fe)
    }

    fn pread(&self, buf: &mut [u8], at: u64) -> Result<()> {
        self.file
            .read_at(buf, at)
            .with_context(|| format!("reading {} bytes at {at} of {}", buf.len(), self.device))
    }

    fn pwrite(&self, buf: &[u8], at: u64) -> Result<()> {
        self.file
            .write_at(buf, at)
            .with_context(|| format!("writing {} bytes at {at} of {}", buf.len(), self.device))
    }

    /// The data area's device and its name.
    fn data_io(&self) -> (&dyn Io, &str) {
        match &self.data {
            Some((io, name)) => (io.as_ref(), name),
            None => (self.file.as_ref(), &self.device),
        }
    }

    fn data_read(&self, buf: &mut [u8], at: u64) -> Result<()> {
        let (io, name) = self.data_io();
        io.read_at(buf, at)
            .with_context(|| format!("reading {} bytes at {at} of {name}", buf.len()))
    }

    fn data_write(&self, buf: &[u8], at: u64) -> Result<()> {
        let (io, name) = self.data_io();
        io.write_at(buf, at)
            .with_context(|| format!("writing {} bytes at {at} of {name}", buf.len()))
    }

    fn data_sync(&self) -> Result<()> {
        let (io, name) = self.data_io();
        io.sync().with_context(|| format!("syncing {name}"))
    }

    /// The IV sector of data-area byte `at`.
    fn iv(&self, at: u64) -> Sector512 {
        Sector512(iv_base(&self.state) + at / 512)
    }

    /// Decrypts with the old key and encrypts with the new, in place, on every core.
    fn rekey(&self, buf: &mut [u8], at: u64) {
        let align = self.state.old.sector_size.max(self.state.new.sector_size) as usize;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let per = buf.len().div_ceil(threads).div_ceil(align).max(1) * align;
        std::thread::scope(|s| {
            for (i, chunk) in buf.chunks_mut(per).enumerate() {
                let pos = at + (i * per) as u64;
                let first = self.iv(pos);
                let (old, new) = (&self.old, &self.new);
                s.spawn(move || {
                    old.decrypt(first, chunk);
                    new.encrypt(first, chunk);
                });
            }
        });
    }

    /// `--device-size`: the run covers only `limit` bytes of the data area (the first, or
    /// backward the last of them), with fixed-size segments meanwhile, as cryptsetup's
    /// fixed-length mode (`reencrypt_context_init`). Call before [`Run::run`].
    ///
    /// # Errors
    /// A limit beyond the data area or not a multiple of the sector size; a crashed
    /// hotzone beyond it; a backward run already started.
    pub fn limit_device_size(&mut self, limit: u64) -> Result<()> {
        if self.state.moved.is_some() {
            bail!("Options --reduce-device-size and --device-size cannot be combined.");
        }
        if limit > self.device_size {
            bail!("Reduced data size is larger than real device size.");
        }
        let align = u64::from(self.state.old.sector_size.max(self.state.new.sector_size));
        if limit == 0 || limit % align != 0 {
            bail!("Device size must be multiple of calculated zone alignment ({align} bytes).");
        }
        let done = match self.state.progress {
            Progress::Clean { done } => done.min(limit),
            Progress::Crashed { offset, length } => {
                if offset + length > limit {
                    bail!("the interrupted hotzone [{offset}, +{length}) lies beyond --device-size {limit}");
                }
                self.state.done_before(offset, length, self.device_size)
            }
        };
        if self.state.backward() && done > 0 {
            bail!("--device-size with a backward run that has started is not supported");
        }
        if let Progress::Clean { .. } = self.state.progress {
            self.state.progress = Progress::Clean { done };
        }
        self.device_size = limit;
        self.state.fixed_length = true;
        Ok(())
    }

    /// Recovers the hotzone a crash interrupted, if there is one, and stops there (the
    /// data pass is not resumed): what cryptsetup's activation does for a LUKS2 device in
    /// the crash state. Returns whether there was a hotzone to recover.
    ///
    /// # Errors
    /// As [`Run::run`]'s recovery: I/O errors, resilience `none`.
    pub fn recover_crash(&mut self) -> Result<bool> {
        match self.state.progress {
            Progress::Crashed { offset, length } => {
                self.recover(offset, length)?;
                Ok(true)
            }
            Progress::Clean { .. } => Ok(false),
        }
    }

    /// Recovers a crashed hotzone as cryptsetup does, then records it as done.
    fn recover(&mut self, offset: u64, length: u64) -> Result<()> {
        let data_at = self.state.new.offset + offset;
        let (area_at, area_size) = self.state.area;
        let len = usize::try_from(length)?;
        let mut buf = Zeroizing::new(vec![0u8; len]);
        // A decryption's moved segment is rewritten in place: its own resilience.
        match self.state.resilience_at(offset).clone() {
            Resilience::Checksum { hash, sector_size } => {
                let h = Hash::from_name(&hash).map_err(fe)?;
                let bs = sector_size as usize;
                let count = len / bs;
                let sums_len = count * h.size();
                if sums_len as u64 > area_size {
                    bail!("hotzone of {length} bytes needs {sums_len} bytes of checksums; the area has {area_size}");
                }
                let mut sums = vec![0u8; sums_len];
                self.pread(&mut sums, area_at)?;
                self.data_read(&mut buf, data_at)?;
                for s in 0..count {
                    let block = &mut buf[s * bs..(s + 1) * bs];
                    if h.digest(&[block])[..] == sums[s * h.size()..(s + 1) * h.size()] {
                        // Still the old ciphertext.
                        let pos = offset + (s * bs) as u64;
                        self.rekey(block, pos);
                        self.data_write(block, data_at + (s * bs) as u64)?;
                    }
                }
            }
            Resilience::Journal => {
                if length > area_size {
                    bail!("hotzone of {length} bytes is larger than the {area_size}-byte journal");
                }
                self.pread(&mut buf, area_at)?;
                self.rekey(&mut buf, offset);
                self.data_write(&buf, data_at)?;
            }
            Resilience::Datashift { .. } => {
                // The hotzone's old data is intact (the new lies a shift above it, or the
                // last hotzone's below the moved copy): do it again.
                self.data_read(&mut buf, self.state.old_offset(offset))?;
                self.rekey(&mut buf, offset);
                self.data_write(&buf, data_at)?;
            }
            Resilience::None => bail!(
                "{}: a hotzone was interrupted with resilience \"none\"; its data cannot be recovered",
                self.device
            ),
        }
        self.data_sync()?;
        let done = self.state.done_after(offset, length, self.device_size);
        self.state
            .set_done(&mut self.header.json, done, self.device_size);
        self.write_header()?;
        self.state.progress = Progress::Clean { done };
        Ok(())
    }

    /// Runs (or resumes) the data pass and, when it completes, the final metadata change.
    /// `stop` is polled between hotzones (a signal handler's flag).
    ///
    /// Resilience `none`: [`Run::pass_none`]. `checksum` and `journal`: two hotzones in
    /// flight. One I/O thread writes, strictly in order, each hotzone's resilience data
    /// (synced), its "hot" header, its new ciphertext (synced) and its "post" header, the
    /// on-disk sequence of cryptsetup; meanwhile this thread and one worker per CPU read
    /// the next hotzone and re-encrypt it out of place (with its checksums in the same
    /// pass), so the syncs overlap the cipher work. Hotzone k+1 is only read before k's
    /// post header, and the reencrypt keyslot's area rewritten only after it.
    ///
    /// # Errors
    /// I/O errors; a crash state that cannot be recovered (resilience `none`).
    pub fn run(
        &mut self,
        opts: &RunOptions,
        stop: &AtomicBool,
        progress: &mut ProgressFn<'_>,
    ) -> Result<Outcome> {
        self.run_gated(opts, stop, progress, None)
    }

    /// As [`Run::run`], for a volume being served: every hotzone is held through `gate`
    /// from before it is read until the header says it is done, and with resilience `none`
    /// the header is written after every hotzone (the served boundary moves with it).
    ///
    /// # Errors
    /// As [`Run::run`].
    pub fn run_gated(
        &mut self,
        opts: &RunOptions,
        stop: &AtomicBool,
        progress: &mut ProgressFn<'_>,
        gate: Option<&dyn Gate>,
    ) -> Result<Outcome> {
        if let Progress::Crashed { offset, length } = self.state.progress {
            self.recover(offset, length)?;
        }
        let start = self.done();
        let size = self.device_size;
        progress(start, size);
        let mut reached = if self.state.resilience == Resilience::None {
            self.pass_none(start, opts, stop, progress, gate)?
        } else {
            self.pass_resilient(start, opts, stop, progress, gate)?
        };
        if reached == self.state.shifted_part(size)
            && reached < size
            && !stop.load(Ordering::Relaxed)
            && opts.stop_after.is_none_or(|n| reached - start < n)
        {
            // A decryption with a data shift ends with its moved segment, in place.
            reached = self.moved_hotzone()?;
            progress(reached, size);
        }
        if reached < size {
            return Ok(Outcome::Interrupted);
        }
        self.finish()?;
        Ok(Outcome::Finished)
    }

    /// The data pass with resilience `none`: hotzone by hotzone (the unit of progress and
    /// of stopping), each re-encrypted in place by [`rekey_in_place`]; the header is
    /// written once, at the end or when stopped (as cryptsetup does). Returns how far it
    /// got.
    fn pass_none(
        &mut self,
        start: u64,
        opts: &RunOptions,
        stop: &AtomicBool,
        progress: &mut ProgressFn<'_>,
        gate: Option<&dyn Gate>,
    ) -> Result<u64> {
        let size = self.device_size;
        let threads = workers();
        let Run {
            file,
            data,
            device,
            header,
            state,
            old,
            new,
            ..
        } = self;
        let align = state.old.sector_size.max(state.new.sector_size) as usize;
        let c = Cipher {
            old: old.as_ref(),
            new: new.as_ref(),
            iv_base: iv_base(state),
        };
        let (io, name): (&dyn Io, &str) = match &*data {
            Some((d, n)) => (&**d, n.as_str()),
            None => (file.as_ref(), device.as_str()),
        };
        let base = state.new.offset;
        let mut done = start;
        let mut recorded = start;
        while done < size
            && !stop.load(Ordering::Relaxed)
            && opts.stop_after.is_none_or(|n| done - start < n)
        {
            let (at, len) = state.next_hotzone(done, size, opts.max_hotzone);
            if let Some(g) = gate {
                g.hold(at, len);
            }
            rekey_in_place(c, io, base, at, len, align, threads).map_err(|e| {
                anyhow!("re-encrypting {len} bytes at {} on {name}: {e}", base + at)
            })?;
            done += len;
            if let Some(g) = gate {
                // Served: the boundary moves only once the header says so.
                io.sync().map_err(|e| anyhow!("syncing {name}: {e}"))?;
                state.set_done(&mut header.json, done, size);
                header.write(file.as_ref(), device).map_err(fe)?;
                recorded = done;
                g.release(at, len);
            }
            progress(done, size);
        }
        if done > recorded {
            io.sync().map_err(|e| anyhow!("syncing {name}: {e}"))?;
            state.set_done(&mut header.json, done, size);
            header.write(file.as_ref(), device).map_err(fe)?;
        }
        state.progress = Progress::Clean { done };
        Ok(done)
    }

    /// The data pass with resilience `checksum` or `journal`: see [`Run::run`]. Returns how
    /// far it got.
    fn pass_resilient(
        &mut self,
        start: u64,
        opts: &RunOptions,
        stop: &AtomicBool,
        progress: &mut ProgressFn<'_>,
        gate: Option<&dyn Gate>,
    ) -> Result<u64> {
        let size = self.device_size;
        let threads = workers();
        let sums_of = match &self.state.resilience {
            Resilience::Checksum { hash, sector_size } => {
                Some((Hash::from_name(hash).map_err(fe)?, *sector_size as usize))
            }
            _ => None,
        };
        let Run {
            file,
            data,
            device,
            header,
            state,
            old,
            new,
            direct,
            ..
        } = self;
        let io: &dyn Io = file.as_ref();
        let device = device.as_str();
        let direct = direct.as_ref();
        // The journal goes through `O_DIRECT` too when it is on the data device.
        let jdirect = direct.filter(|_| data.is_none());
        // The data area's device: the header's unless detached.
        let detached = data.is_some();
        let (dio, dname): (&dyn Io, &str) = match &*data {
            Some((d, name)) => (&**d, name.as_str()),
            None => (io, device),
        };
        let (old, new) = (old.as_ref(), new.as_ref());
        let align = state.old.sector_size.max(state.new.sector_size) as usize;
        let iv_base = iv_base(state);
        let st: &Reencrypt = state;
        let shifted = matches!(st.resilience, Resilience::Datashift { .. });
        let journal = st.resilience == Resilience::Journal;
        let io_err = |what: &str, e: std::io::Error| anyhow!("{what} on {device}: {e}");
        let (to_io, from_main) = std::sync::mpsc::sync_channel::<Hotzone>(0);
        let (to_main, from_io) = std::sync::mpsc::channel::<Hotzone>();
        let done = std::thread::scope(|scope| -> Result<u64> {
            // The I/O thread: per hotzone, cryptsetup's on-disk sequence, strictly in order.
            let writer = scope.spawn(move || -> Result<()> {
                for z in from_main {
                    let n = z.len as usize;
                    // The commit point: resilience data, synced, then the "hot" header.
                    // A data shift has none: the old data stays where it was.
                    if !shifted && detached && gate.is_some() {
                        // Online with a detached header, the clients' writes to the data
                        // device (acknowledged, not yet flushed) are not covered by the
                        // header device's sync below. The checksums are of what was read,
                        // those writes included: durable first, or a power cut keeps sums
                        // of data the disk lost, and recovery takes the stale old
                        // ciphertext for new and decrypts it with the new key.
                        dio.sync().map_err(|e| anyhow!("syncing {dname}: {e}"))?;
                    }
                    if !shifted {
                        match sums_of {
                            Some(_) => io.write_at(&z.sums, st.area.0),
                            None => {
                                write_direct(jdirect, io, window_of(&z.src, n), st.area.0, true)
                            }
                        }
                        .map_err(|e| io_err("writing the resilience data", e))?;
                        // Durable before the header names the hotzone: cryptsetup relies
                        // on the header's own fsync, which leaves a window where a power
                        // cut keeps the header and loses part of the checksums or journal.
                        io.sync().map_err(|e| io_err("syncing", e))?;
                    }
                    st.set_hot(&mut header.json, z.at, z.len, size);
                    header.write(io, device).map_err(fe)?;
                    let data_at = st.new.offset + z.at;
                    write_direct(direct, dio, window_of(&z.out, n), data_at, !shifted)
                        .map_err(|e| anyhow!("writing {n} bytes at {data_at} on {dname}: {e}"))?;
                    dio.sync().map_err(|e| anyhow!("syncing {dname}: {e}"))?;
                    st.set_done(&mut header.json, st.done_after(z.at, z.len, size), size);
                    header.write(io, device).map_err(fe)?;
                    if let Some(g) = gate {
                        g.release(z.at, z.len);
                    }
                    if to_main.send(z).is_err() {
                        break;
                    }
                }
                Ok(())
            });
            // This thread and the workers: read and re-encrypt the next hotzone while the
            // I/O thread writes the previous one; at most two hotzones' buffers exist.
            let mut free: Vec<Hotzone> = Vec::new();
            let mut made = 0;
            let mut done = start;
            let mut next = start;
            let mut sent = 0;
            let mut back = |z: Hotzone, free: &mut Vec<Hotzone>, done: &mut u64| {
                *done = st.done_after(z.at, z.len, size);
                progress(*done, size);
                free.push(z);
            };
            // A decryption with a data shift stops before its moved segment's hotzone
            // ([`Run::moved_hotzone`]).
            let end = st.shifted_part(size);
            while next < end
                && !stop.load(Ordering::Relaxed)
                && opts.stop_after.is_none_or(|n| next - start < n)
            {
                while let Ok(z) = from_io.try_recv() {
                    sent -= 1;
                    back(z, &mut free, &mut done);
                }
                let mut z = match free.pop() {
                    Some(z) => z,
                    None if made < 2 => {
                        made += 1;
                        Hotzone::default()
                    }
                    None => match from_io.recv() {
                        Ok(z) => {
                            sent -= 1;
                            back(z, &mut free, &mut done);
                            free.pop().unwrap_or_default()
                        }
                        // The I/O thread stopped: its error below.
                        Err(_) => break,
                    },
                };
                let (at, len) = st.next_hotzone(next, size, opts.max_hotzone);
                let n = usize::try_from(len)?;
                z.at = at;
                z.len = len;
                // Only the journal keeps the old ciphertext (it is the resilience data).
                let src = journal.then(|| window(&mut z.src, n));
                let out = window(&mut z.out, n);
                if let Some((h, bs)) = &sums_of {
                    z.sums.resize(n / bs * h.size(), 0);
                }
                // The old data: where the new goes, or with a data shift a shift below it
                // (the moved copy for the last hotzone).
                let data_at = st.old_offset(at);
                if let Some(g) = gate {
                    g.hold(at, len);
                }
                transform(
                    Cipher { old, new, iv_base },
                    (dio, data_at),
                    at,
                    src,
                    out,
                    sums_of.as_ref().map(|(h, bs)| (*h, *bs, &mut z.sums[..])),
                    align,
                    threads,
                    if journal { WORKER_NICE } else { 0 },
                )
                .map_err(|e| anyhow!("reading {n} bytes at {data_at} on {dname}: {e}"))?;
                if to_io.send(z).is_err() {
                    break;
                }
                sent += 1;
                next += len;
            }
            drop(to_io);
            while sent > 0 {
                let Ok(z) = from_io.recv() else { break };
                sent -= 1;
                back(z, &mut free, &mut done);
            }
            writer
                .join()
                .map_err(|_| anyhow!("the writer thread panicked"))??;
            Ok(done)
        })?;
        state.progress = Progress::Clean { done };
        Ok(done)
    }

    /// The last hotzone of a decryption with a data shift: the moved segment (the first
    /// ciphertext, copied to the device's head at the start), decrypted in place under its
    /// own resilience (`datashift-checksum`: the old ciphertext's block checksums;
    /// `datashift-journal`: the old ciphertext itself) in cryptsetup's order: resilience
    /// data (synced), "hot" header, plaintext (synced), "post" header. Returns the bytes
    /// done (all).
    fn moved_hotzone(&mut self) -> Result<u64> {
        let size = self.device_size;
        let (at, len) = self
            .state
            .next_hotzone(self.state.shifted_part(size), size, 0);
        let n = usize::try_from(len)?;
        let mut buf = Zeroizing::new(vec![0u8; n]);
        self.data_read(&mut buf, self.state.old_offset(at))?;
        let (area_at, area_size) = self.state.area;
        match self.state.resilience_at(at).clone() {
            Resilience::Checksum { hash, sector_size } => {
                let h = Hash::from_name(&hash).map_err(fe)?;
                let mut sums = Vec::with_capacity(n / sector_size as usize * h.size());
                for block in buf.chunks(sector_size as usize) {
                    sums.extend_from_slice(&h.digest(&[block]));
                }
                if sums.len() as u64 > area_size {
                    bail!("the moved segment's checksums ({} bytes) exceed the {area_size}-byte area", sums.len());
                }
                self.pwrite(&sums, area_at)?;
            }
            Resilience::Journal => {
                if len > area_size {
                    bail!("the moved segment ({len} bytes) exceeds the {area_size}-byte journal");
                }
                self.pwrite(&buf, area_at)?;
            }
            other => bail!(
                "the moved segment's hotzone has resilience \"{}\"; cryptsetup writes checksum or journal",
                other.name()
            ),
        }
        self.file
            .sync()
            .with_context(|| format!("syncing {}", self.device))?;
        self.state.set_hot(&mut self.header.json, at, len, size);
        self.write_header()?;
        self.rekey(&mut buf, at);
        self.data_write(&buf, self.state.new.offset + at)?;
        self.data_sync()?;
        let done = self.state.done_after(at, len, size);
        self.state.set_done(&mut self.header.json, done, size);
        self.write_header()?;
        self.state.progress = Progress::Clean { done };
        Ok(done)
    }

    /// Wipes `size` bytes at `at` with random bytes (as `crypt_keyslot_destroy` does on a
    /// non-rotational device). Not synced on its own: the header write that follows (which
    /// drops the keyslot) syncs the file, and either order of the two reaching the disk is
    /// safe (a keyslot still named but wiped is handled by [`Run::open_with`]).
    ///
    /// The bytes are a ChaCha20 keystream under a key from `/dev/urandom` (the kernel's
    /// own generator is ChaCha20 too): reading the 16 MiB reencrypt area from
    /// `/dev/urandom` cost 5-7 % of a 512 MiB run's CPU in the kernel.
    fn wipe_random(&self, at: u64, size: u64, on_data: bool) -> Result<()> {
        use chacha20::cipher::{KeyIvInit, StreamCipher};
        use std::io::Read;
        let mut key = Zeroizing::new([0u8; 32]);
        File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut key[..]))
            .context("reading /dev/urandom")?;
        let mut stream = chacha20::ChaCha20::new(&(*key).into(), &[0u8; 12].into());
        let mut chunk = vec![0u8; 1 << 20];
        let mut pos = 0;
        while pos < size {
            let n = (size - pos).min(chunk.len() as u64) as usize;
            chunk[..n].fill(0);
            stream.apply_keystream(&mut chunk[..n]);
            if on_data {
                self.data_write(&chunk[..n], at + pos)?;
            } else {
                self.pwrite(&chunk[..n], at + pos)?;
            }
            pos += n as u64;
        }
        Ok(())
    }

    /// The end: the old keyslots go one by one, then everything of the reencryption.
    /// With a data shift the moved copy of the first plaintext bytes is wiped first (as
    /// cryptsetup's `reencrypt_wipe_unused_device_area`).
    fn finish(&mut self) -> Result<()> {
        if let Some((shift, _)) = self.state.decrypt_shifted() {
            // reencrypt_wipe_unused_device_area: the device's last `shift` bytes, where
            // the old data's end lay.
            self.wipe_random(self.state.new.offset + self.device_size, shift, true)?;
            self.data_sync()?;
        } else if let Some(m) = &self.state.moved {
            let (at, size) = (m.offset, m.size);
            self.wipe_random(at, size, true)?;
            self.data_sync()?;
        }
        for (slot, at, size) in self.state.old_keyslots(&self.header.json) {
            self.wipe_random(at, size, false)?;
            Reencrypt::destroy_keyslot(&mut self.header.json, slot);
            self.write_header()?;
        }
        let (at, size) = self.state.area;
        self.wipe_random(at, size, false)?;
        self.state.finish(&mut self.header.json);
        self.write_header()
    }

    /// The JSON metadata as it is now (tests compare it with cryptsetup's).
    pub fn json(&self) -> &Json {
        &self.header.json
    }
}
