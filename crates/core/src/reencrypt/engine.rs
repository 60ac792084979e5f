//! LUKS2 reencryption (re-keying) in userspace, interchangeable with `cryptsetup reencrypt`.
//!
//! ```text
//!  init:   libcryptsetup: new keyslot with a random unbound key, then
//!          crypt_reencrypt_init_by_passphrase(INITIALIZE_ONLY): the reencrypt keyslot,
//!          backup segments, digests and requirement, byte for byte cryptsetup's
//!  run:    format::luks2::reencrypt (state, segment layouts, digest check)
//!          + format::luks2::disk (both header copies, cryptsetup's write order)
//!          per hotzone: read old ciphertext ─► resilience data into the reencrypt
//!          keyslot area + header "hot" ─► decrypt old key, encrypt new key
//!          ─► write, fdatasync ─► header "post"
//!  data:   through backend::Backend (a FileBackend; O_DIRECT for hotzone writes), the
//!          crypto by engine::Volume::recrypt_range on the engine's workers, chunk by
//!          chunk (read, decrypt, encrypt, [write] while in one core's cache)
//!  finish: old keyslots wiped and destroyed, then the reencrypt keyslot, backup segments,
//!          requirement and unused digests, as cryptsetup leaves the header
//! ```
//!
//! Offline only: the caller holds the image (ucrypt's image locks); nothing else may
//! write the data area meanwhile.

use crate::error::{anyhow, bail, Context, Result};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use ucrypt_backend::{
    AlignedBuf, Backend, BackendError, BackendInfo, Caps, FileBackend, FileOptions, IoKind,
    Support, WriteOp,
};
use ucrypt_crypto::{CipherSpec, SectorCipher, SectorParams, SectorSize, VolumeKey};
use ucrypt_engine::{
    EngineOptions, Inspect, PoolOptions, RecryptOut, RecryptRange, Volume, VolumeConfig, WriteOrder,
};
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
    /// The header's device: the header, the keyslots and the reencrypt keyslot's area.
    file: Arc<dyn Io>,
    device: String,
    /// The data area's device (the header's unless detached) and its name: every read and
    /// write of the data goes through it.
    dev: Arc<dyn Backend>,
    dname: String,
    /// Whether the header is detached (`--header`).
    detached: bool,
    header: Header,
    state: Reencrypt,
    device_size: u64,
    old: Arc<dyn SectorCipher>,
    new: Arc<dyn SectorCipher>,
    /// Both volume keys, for [`Run::side_lines`] (online reencryption serves both sides).
    keys: (VolumeKey, VolumeKey),
    /// The data device opened with `O_DIRECT`, for the resilient passes' hotzone writes
    /// (see [`write_direct`]); `None` where it cannot be opened so (tmpfs) or the I/O is a
    /// caller's model ([`Run::open_with`]).
    direct: Option<FileBackend>,
    /// The engine over `dev` with the old side's cipher: the crypto of the data pass, on
    /// its workers (started by the first data pass or recovery).
    engine: Option<Volume>,
}

/// A caller's [`Io`] (a test's model of a volatile write cache) as the data device's
/// [`Backend`].
struct IoBackend {
    io: Arc<dyn Io>,
    path: PathBuf,
    info: BackendInfo,
}

impl IoBackend {
    fn new(io: Arc<dyn Io>, path: &Path) -> Result<IoBackend> {
        use std::io::{Seek, SeekFrom};
        let size_bytes = File::open(path)
            .and_then(|mut f| f.seek(SeekFrom::End(0)))
            .with_context(|| format!("reading the size of {}", path.display()))?;
        Ok(IoBackend {
            io,
            path: path.to_path_buf(),
            info: BackendInfo {
                size_bytes,
                logical_block: 512,
                physical_block: 512,
                optimal_block: 512,
                caps: Caps {
                    flush: Support::Native,
                    discard: Support::None,
                    write_zeroes: Support::None,
                    read_only: false,
                },
            },
        })
    }
}

impl Backend for IoBackend {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn submit(&self, io: ucrypt_backend::Io<'_>) -> std::result::Result<(), BackendError> {
        let (offset, fua) = (io.offset, io.fua);
        let err = |op, source| BackendError::Io {
            op,
            offset,
            path: self.path.clone(),
            source,
        };
        match io.kind {
            IoKind::Read(buf) => self.io.read_at(buf, offset).map_err(|e| err("read", e)),
            IoKind::Write(buf) => self.io.write_at(buf, offset).map_err(|e| err("write", e)),
            IoKind::WriteOwned(buf) => self.io.write_at(buf, offset).map_err(|e| err("write", e)),
            other => Err(BackendError::Unsupported(other.name())),
        }?;
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&self) -> std::result::Result<(), BackendError> {
        self.io.sync().map_err(|source| BackendError::Io {
            op: "flush",
            offset: 0,
            path: self.path.clone(),
            source,
        })
    }
}

/// A backend error with its cause (the OS error), for messages.
fn berr(e: &BackendError) -> String {
    match std::error::Error::source(e) {
        Some(s) => format!("{e}: {s}"),
        None => e.to_string(),
    }
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

fn cipher(side: &reencrypt::Side, key: &VolumeKey) -> Result<Arc<dyn SectorCipher>> {
    let spec: CipherSpec = side
        .encryption
        .parse()
        .with_context(|| format!("cipher {}", side.encryption))?;
    // A `cipher_null` segment (cryptsetup's "custom encryption" to re-key later) still has
    // a digest and a volume key in its keyslot; the cipher takes none, as dm-crypt's.
    let empty = VolumeKey::empty();
    let null = side.encryption.split('-').next() == Some("cipher_null");
    Ok(Arc::from(spec.build(
        if null { &empty } else { key },
        SectorParams {
            sector_size: SectorSize::new(side.sector_size)?,
            iv_offset: 0,
            iv_large_sectors: false,
        },
    )?))
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

/// The engine's position (bytes, for the IV) of data-area byte `at`.
fn iv_pos(iv_base: u64, at: u64) -> Result<u64> {
    iv_base
        .checked_mul(512)
        .and_then(|b| b.checked_add(at))
        .ok_or_else(|| anyhow!("IV sector {iv_base} is out of range"))
}

/// One hotzone of a resilient pass on its way from the engine to the I/O thread and back
/// (the buffers are reused): old ciphertext, new ciphertext, checksums.
#[derive(Default)]
struct Hotzone {
    at: u64,
    len: u64,
    // Old and new ciphertext only (plaintext lives in `out` for the moment between a
    // piece's decryption and encryption), so not zeroized: wiping two hotzones of bytes
    // cost as much as a cipher pass.
    src: Option<AlignedBuf>,
    out: Option<AlignedBuf>,
    sums: Vec<u8>,
}

/// The first `n` bytes of `buf`, which is made at least that long. A new buffer is the
/// allocator's zeroed memory (fresh pages, faulted in by the threads that first write
/// them, in parallel) rather than zeros this thread writes: filling two 64 MiB buffers
/// cost about 0.2 s before the first read (page faults in this VM run at about 0.5 GB/s).
/// Aligned as `align` (the `O_DIRECT` device's logical block) so that its writes need no
/// bounce buffer.
fn room(buf: &mut Option<AlignedBuf>, n: usize, align: usize) -> Result<&mut [u8]> {
    if buf.as_ref().is_none_or(|b| b.len() < n) {
        *buf = None;
        *buf = Some(AlignedBuf::zeroed(n, align).map_err(|e| anyhow!("{e}"))?);
    }
    match buf {
        Some(b) => Ok(&mut b[..n]),
        None => bail!("BUG: no hotzone buffer"),
    }
}

/// Writes a whole hotzone (or the journal) at `at`: through `direct` (`O_DIRECT`) when
/// there is one, else through `dev`. A hotzone is written once, in full, and synced at
/// once: through the page cache that is a copy into it and then the writeback of every
/// page by the sync, about a fifth of a checksum pass's CPU in the kernel
/// (`copy_folio_from_iter_atomic`, ext4's writeback) taken from the threads that
/// re-encrypt the next hotzone. `O_DIRECT` hands the buffer to the device instead; the
/// sync that follows (on `dev`, the same inode) still flushes the device's cache, so the
/// order on disk is the same. The kernel invalidates the page cache over the range, so
/// buffered readers (the next open, an instance's clients, held off the hotzone
/// meanwhile) see the new bytes. A device that refuses the alignment is written through
/// `dev` instead: the same bytes.
///
/// With `split` the buffer goes out as [`WRITE_PIECE`]-byte writes submitted together
/// (the backend's batch, io_uring), which kept this VM's virtio disk busier than one
/// hotzone-sized write (`fio`, 512 MiB, `O_DIRECT`, fsync every 64 MiB, load 7: 1.7-1.8
/// GB/s as 64 MiB writes, 2.0-2.3 GB/s as 4 MiB writes 4 deep). All of them complete
/// before this returns, so the sync after it covers the whole buffer. With `split` false
/// the buffer goes out as one write: the data shift's pass keeps one write per hotzone,
/// which its interoperability tests count on (they kill the run at the n-th `pwrite64`
/// to stop it at a given step).
fn write_direct(
    direct: Option<&FileBackend>,
    dev: &dyn Backend,
    buf: &[u8],
    at: u64,
    split: bool,
) -> std::result::Result<(), BackendError> {
    if let Some(d) = direct {
        let r = if split && buf.len() > WRITE_PIECE {
            let ops: Vec<WriteOp<'_>> = buf
                .chunks(WRITE_PIECE)
                .enumerate()
                .map(|(i, piece)| WriteOp {
                    offset: at + (i * WRITE_PIECE) as u64,
                    buf: piece,
                    fua: false,
                })
                .collect();
            d.submit_writes(&ops)
        } else {
            d.write_at(buf, at, false)
        };
        match r {
            // Refused alignment: the same bytes through `dev` (a piece that was written
            // already is written again, with the same bytes).
            Err(BackendError::Misaligned { .. } | BackendError::OutOfRange { .. }) => {}
            Err(BackendError::Io { ref source, .. })
                if source.raw_os_error() == Some(libc::EINVAL) => {}
            r => return r,
        }
    }
    dev.write_at(buf, at, false)
}

/// Bytes of one `O_DIRECT` write of [`write_direct`].
const WRITE_PIECE: usize = 4 << 20;

/// How many nice levels the `journal` pass's re-encrypting threads run below its I/O
/// thread ([`EngineOptions::worker_nice`]). Each step of the I/O thread's chain (write,
/// sync, header copy, sync, ...) starts when the previous one's system call returns, so a
/// woken I/O thread that waits for a CPU the re-encrypting threads hold delays the whole
/// chain. `journal`, whose chain is its bound (its I/O thread was busy 1.28 s of a 1.45 s
/// run), fell from 2.02 to 1.85 s (512 MiB, medians of 7 interleaved runs, load 9.7; in one
/// traced run each its header updates took 0.54 s without, 0.29 s with); `checksum`, bound
/// by the re-encrypting threads' CPU at that load, moved within the noise (0.67-4.07 s for
/// one binary), and keeps its threads' priority: under load its bound is their CPU time,
/// which a lower priority would give to other processes.
const WORKER_NICE: i32 = 2;

/// Bytes one thread reads, converts and (resilience `none`) writes at a time (the
/// engine's chunk): small enough to stay in the core's cache from the read to the write
/// (one pass each over a whole 32 MiB slice ran at half the speed), large enough to keep
/// the system calls few.
const PIECE: usize = 256 << 10;

/// The number of threads the data pass uses: one per CPU.
fn workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The data device as a [`FileBackend`] (buffered, `pread`/`pwrite`: the data pass reads
/// each byte once, so a memory mapping would only add page faults).
fn file_backend(path: &Path) -> Result<Arc<dyn Backend>> {
    let mut b = FileBackend::open(path, FileOptions::default())
        .map_err(|e| anyhow!("opening {}: {}", path.display(), berr(&e)))?;
    b.use_mmap(false);
    Ok(Arc::new(b))
}

/// The data device opened with `O_DIRECT` (writes batched through io_uring where the
/// kernel has it), if it can be.
fn open_direct(path: &Path) -> Option<FileBackend> {
    let mut b = FileBackend::open(
        path,
        FileOptions {
            read_only: false,
            direct: true,
        },
    )
    .ok()?;
    b.use_io_uring(true);
    Some(b)
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
        let dev = file_backend(path)?;
        let mut run = Self::open_parts(Arc::new(open_rw(path)?), path, dev, None, passphrase)?;
        run.direct = open_direct(path);
        Ok(run)
    }

    /// As [`Run::open`] with a detached header: the LUKS2 header (keyslots, reencrypt
    /// area) on `header`, the data area (from the segments' offset, usually 0) on `data`.
    ///
    /// # Errors
    /// As [`Run::open`].
    pub fn open_detached(header: &Path, data: &Path, passphrase: &[u8]) -> Result<Run> {
        let dev = file_backend(data)?;
        let mut run = Self::open_parts(
            Arc::new(open_rw(header)?),
            header,
            dev,
            Some(data),
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
        let io: Arc<dyn Io> = Arc::from(io);
        let dev = Arc::new(IoBackend::new(Arc::clone(&io), path)?);
        Self::open_parts(io, path, dev, None, passphrase)
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
        let dev = Arc::new(IoBackend::new(Arc::from(data_io), data)?);
        Self::open_parts(Arc::from(header_io), header, dev, Some(data), passphrase)
    }

    /// `io`: the header's device, `path` its name; `dev`: the data area's device, `data`
    /// its name when it is not the header's.
    fn open_parts(
        io: Arc<dyn Io>,
        path: &Path,
        dev: Arc<dyn Backend>,
        data: Option<&Path>,
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
        let device_size = match data {
            Some(d) => data_size(d, &d.display().to_string(), &probe)?,
            None => data_size(path, &device, &probe)?,
        };
        let dname = data.map_or_else(|| device.clone(), |d| d.display().to_string());
        let detached = data.is_some();
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
                    device,
                    dev,
                    dname,
                    detached,
                    header,
                    old: cipher(&state.new, &new_key)?,
                    state,
                    device_size,
                    new,
                    keys: (VolumeKey::new(new_key.as_bytes().to_vec()), new_key),
                    direct: None,
                    engine: None,
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
            device,
            dev,
            dname,
            detached,
            header,
            state,
            device_size,
            old,
            new,
            keys: (old_key, new_key),
            direct: None,
            engine: None,
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

    fn data_read(&self, buf: &mut [u8], at: u64) -> Result<()> {
        self.dev.read_at(buf, at).map_err(|e| {
            anyhow!(
                "reading {} bytes at {at} of {}: {}",
                buf.len(),
                self.dname,
                berr(&e)
            )
        })
    }

    fn data_write(&self, buf: &[u8], at: u64) -> Result<()> {
        self.dev.write_at(buf, at, false).map_err(|e| {
            anyhow!(
                "writing {} bytes at {at} of {}: {}",
                buf.len(),
                self.dname,
                berr(&e)
            )
        })
    }

    fn data_sync(&self) -> Result<()> {
        self.dev
            .flush()
            .map_err(|e| anyhow!("syncing {}: {}", self.dname, berr(&e)))
    }

    /// Starts the engine (once): one volume over the data device with the old side's
    /// cipher, whose workers do the data pass's chunks. Resilience `none` and `checksum`:
    /// one worker per CPU but one, this thread working too; `journal`: one per CPU, at a
    /// lower priority than the I/O thread ([`WORKER_NICE`]), this thread only waiting.
    fn start_engine(&mut self) -> Result<()> {
        if self.engine.is_some() {
            return Ok(());
        }
        let cpus = workers();
        let journal = self.state.resilience == Resilience::Journal;
        let sum_block = match &self.state.resilience {
            Resilience::Checksum { sector_size, .. } => *sector_size as usize,
            _ => 1,
        };
        let align = self.state.old.sector_size.max(self.state.new.sector_size) as usize;
        let unit = align.max(sum_block);
        let piece = PIECE.div_ceil(unit) * unit;
        let threads = if journal { cpus } else { cpus - 1 };
        let opts = EngineOptions {
            // No workers at all (one CPU, this thread working): everything inline.
            no_read_workqueue: threads == 0,
            no_write_workqueue: threads == 0,
            same_cpu_crypt: false,
            submit_from_crypt_cpus: true,
            write_order: WriteOrder::Issue,
            split_bytes: piece,
            workers: threads.max(1),
            auto: None,
            pool: PoolOptions {
                // Resilience `none` writes each chunk back from a pool buffer: one per
                // thread at work.
                buffers: if self.state.resilience == Resilience::None {
                    cpus
                } else {
                    1
                },
                buffer_bytes: piece,
                per_request_alloc: false,
            },
            worker_nice: if journal { WORKER_NICE } else { 0 },
        };
        let ss = u64::from(self.old.sector_size().bytes());
        let cfg = VolumeConfig {
            data_offset_bytes: 0,
            length_bytes: self.dev.info().size_bytes / ss * ss,
            read_only: false,
            allow_discards: false,
        };
        let v = Volume::with_options(Arc::clone(&self.old), Arc::clone(&self.dev), cfg, opts)
            .map_err(|e| anyhow!("starting the engine on {}: {e}", self.dname))?;
        self.engine = Some(v);
        Ok(())
    }

    /// Decrypts with the old key and encrypts with the new, in place, on the engine.
    fn rekey(&self, buf: &mut [u8], at: u64) -> Result<()> {
        let Some(engine) = &self.engine else {
            bail!("BUG: the engine is not started");
        };
        engine
            .recrypt_in_place(&*self.new, iv_pos(iv_base(&self.state), at)?, buf, None)
            .map_err(|e| anyhow!("re-encrypting {} bytes at {at}: {}", buf.len(), berr(&e)))
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
                self.start_engine()?;
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
                        self.rekey(block, pos)?;
                        self.data_write(block, data_at + (s * bs) as u64)?;
                    }
                }
            }
            Resilience::Journal => {
                if length > area_size {
                    bail!("hotzone of {length} bytes is larger than the {area_size}-byte journal");
                }
                self.pread(&mut buf, area_at)?;
                self.rekey(&mut buf, offset)?;
                self.data_write(&buf, data_at)?;
            }
            Resilience::Datashift { .. } => {
                // The hotzone's old data is intact (the new lies a shift above it, or the
                // last hotzone's below the moved copy): do it again.
                self.data_read(&mut buf, self.state.old_offset(offset))?;
                self.rekey(&mut buf, offset)?;
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
        // Only a run that has nothing left but the clean-up needs no engine.
        if self.state.progress
            != (Progress::Clean {
                done: self.device_size,
            })
        {
            self.start_engine()?;
        }
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
    /// of stopping), each re-encrypted in place by the engine, chunk by chunk (read,
    /// decrypted, encrypted and written back while in one core's cache, no hotzone-sized
    /// buffer); the header is written once, at the end or when stopped (as cryptsetup
    /// does). Returns how far it got.
    fn pass_none(
        &mut self,
        start: u64,
        opts: &RunOptions,
        stop: &AtomicBool,
        progress: &mut ProgressFn<'_>,
        gate: Option<&dyn Gate>,
    ) -> Result<u64> {
        let size = self.device_size;
        let Run {
            file,
            device,
            dev,
            dname,
            header,
            state,
            new,
            engine,
            ..
        } = self;
        let engine = engine
            .as_ref()
            .ok_or_else(|| anyhow!("BUG: the engine is not started"));
        let iv0 = iv_base(state);
        let base = state.new.offset;
        let sync = || {
            dev.flush()
                .map_err(|e| anyhow!("syncing {dname}: {}", berr(&e)))
        };
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
            engine
                .as_ref()
                .map_err(|e| anyhow!("{e}"))?
                .recrypt_range(RecryptRange {
                    new: &**new,
                    pos: iv_pos(iv0, at)?,
                    len: usize::try_from(len)?,
                    read_at: base + at,
                    out: RecryptOut::Write(base + at),
                    inspect: None,
                    help: true,
                })
                .map_err(|e| {
                    anyhow!(
                        "re-encrypting {len} bytes at {} on {dname}: {}",
                        base + at,
                        berr(&e)
                    )
                })?;
            done += len;
            if let Some(g) = gate {
                // Served: the boundary moves only once the header says so.
                sync()?;
                state.set_done(&mut header.json, done, size);
                header.write(file.as_ref(), device).map_err(fe)?;
                recorded = done;
                g.release(at, len);
            }
            progress(done, size);
        }
        if done > recorded {
            sync()?;
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
        let sums_of = match &self.state.resilience {
            Resilience::Checksum { hash, sector_size } => {
                Some((Hash::from_name(hash).map_err(fe)?, *sector_size as usize))
            }
            _ => None,
        };
        let Run {
            file,
            device,
            dev,
            dname,
            detached,
            header,
            state,
            new,
            direct,
            engine,
            ..
        } = self;
        let engine = engine
            .as_ref()
            .ok_or_else(|| anyhow!("BUG: the engine is not started"));
        let chunk = engine.as_ref().map_or(PIECE, |e| e.options().split_bytes);
        let io: &dyn Io = file.as_ref();
        let device = device.as_str();
        let direct = direct.as_ref();
        let detached = *detached;
        // The journal goes through `O_DIRECT` too when it is on the data device.
        let jdirect = direct.filter(|_| !detached);
        let (dev, dname): (&dyn Backend, &str) = (dev.as_ref(), dname.as_str());
        let new: &(dyn SectorCipher + 'static) = &**new;
        // Hotzone buffers aligned for the `O_DIRECT` device (no bounce buffer).
        let buf_align = direct.map_or(8, |d| d.info().logical_block as usize);
        let iv0 = iv_base(state);
        let st: &Reencrypt = state;
        let shifted = matches!(st.resilience, Resilience::Datashift { .. });
        let journal = st.resilience == Resilience::Journal;
        let io_err = |what: &str, e: std::io::Error| anyhow!("{what} on {device}: {e}");
        let (to_io, from_main) = std::sync::mpsc::sync_channel::<Hotzone>(0);
        let (to_main, from_io) = std::sync::mpsc::channel::<Hotzone>();
        let done = std::thread::scope(|scope| -> Result<u64> {
            // The I/O thread: per hotzone, cryptsetup's on-disk sequence, strictly in order.
            let writer = scope.spawn(move || -> Result<()> {
                let dsync = || {
                    dev.flush()
                        .map_err(|e| anyhow!("syncing {dname}: {}", berr(&e)))
                };
                for z in from_main {
                    let n = z.len as usize;
                    let out = z.out.as_ref().map_or(&[][..], |b| &b[..n]);
                    // The commit point: resilience data, synced, then the "hot" header.
                    // A data shift has none: the old data stays where it was.
                    if !shifted && detached && gate.is_some() {
                        // Online with a detached header, the clients' writes to the data
                        // device (acknowledged, not yet flushed) are not covered by the
                        // header device's sync below. The checksums are of what was read,
                        // those writes included: durable first, or a power cut keeps sums
                        // of data the disk lost, and recovery takes the stale old
                        // ciphertext for new and decrypts it with the new key.
                        dsync()?;
                    }
                    if !shifted {
                        match sums_of {
                            Some(_) => io.write_at(&z.sums, st.area.0),
                            None if detached => {
                                io.write_at(z.src.as_ref().map_or(&[][..], |b| &b[..n]), st.area.0)
                            }
                            None => write_direct(
                                jdirect,
                                dev,
                                z.src.as_ref().map_or(&[][..], |b| &b[..n]),
                                st.area.0,
                                true,
                            )
                            .map_err(|e| std::io::Error::other(berr(&e))),
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
                    write_direct(direct, dev, out, data_at, !shifted).map_err(|e| {
                        anyhow!("writing {n} bytes at {data_at} on {dname}: {}", berr(&e))
                    })?;
                    dsync()?;
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
            // This thread and the engine: read and re-encrypt the next hotzone while the
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
                if let Some((h, bs)) = &sums_of {
                    z.sums.resize(n / bs * h.size(), 0);
                }
                let Hotzone { src, out, sums, .. } = &mut z;
                // Only the journal keeps the old ciphertext (it is the resilience data).
                let keep = if journal {
                    Some(room(src, n, buf_align)?)
                } else {
                    None
                };
                let out = room(out, n, buf_align)?;
                // The checksums of each chunk's old ciphertext, computed by the thread
                // that holds the chunk.
                let slots: Vec<Mutex<&mut [u8]>> = match &sums_of {
                    Some((h, bs)) => sums
                        .chunks_mut(chunk / bs * h.size())
                        .map(Mutex::new)
                        .collect(),
                    None => Vec::new(),
                };
                let sum = |off: usize, old: &[u8]| {
                    if let (Some((h, bs)), Some(slot)) = (&sums_of, slots.get(off / chunk)) {
                        let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
                        for (block, s) in old.chunks(*bs).zip(slot.chunks_mut(h.size())) {
                            s.copy_from_slice(&h.digest(&[block]));
                        }
                    }
                };
                let hook: &Inspect<'_> = &sum;
                // The old data: where the new goes, or with a data shift a shift below it
                // (the moved copy for the last hotzone).
                let data_at = st.old_offset(at);
                if let Some(g) = gate {
                    g.hold(at, len);
                }
                engine
                    .as_ref()
                    .map_err(|e| anyhow!("{e}"))?
                    .recrypt_range(RecryptRange {
                        new,
                        pos: iv_pos(iv0, at)?,
                        len: n,
                        read_at: data_at,
                        out: RecryptOut::Buffer { out, keep },
                        inspect: sums_of.is_some().then_some(hook),
                        help: !journal,
                    })
                    .map_err(|e| {
                        anyhow!("reading {n} bytes at {data_at} on {dname}: {}", berr(&e))
                    })?;
                drop(slots);
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
        self.rekey(&mut buf, at)?;
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
