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

use anyhow::{anyhow, bail, Context, Result};
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
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
    file: Box<dyn Io>,
    device: String,
    header: Header,
    state: Reencrypt,
    device_size: u64,
    old: Box<dyn SectorCipher>,
    new: Box<dyn SectorCipher>,
}

fn fe(e: FormatError) -> anyhow::Error {
    anyhow::Error::new(e)
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

/// The key of digest `digest`: tries the keyslots bound to it with `passphrase`.
fn key_of(
    path: &Path,
    meta: &Metadata,
    digest: u32,
    which: &str,
    passphrase: &[u8],
) -> Result<VolumeKey> {
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
    Ok(spec.build(
        key,
        SectorParams {
            sector_size: SectorSize::new(side.sector_size)?,
            iv_offset: 0,
            iv_large_sectors: false,
        },
    )?)
}

/// Both ciphers and the IV of the data area's first sector.
#[derive(Clone, Copy)]
struct Cipher<'a> {
    old: &'a dyn SectorCipher,
    new: &'a dyn SectorCipher,
    iv_base: u64,
}

/// Reads the old ciphertext of data-area bytes from `at` (device offset `from.1`) into
/// `src` and re-encrypts it into `out`, on every core, each thread reading and converting
/// its own aligned slice (reads from the page cache are copies: they scale with cores);
/// with `sums`, also the digest of every `bs`-byte block of `src` (the checksum resilience
/// data), in the same pass.
///
/// # Errors
/// The first read error.
fn transform(
    c: Cipher<'_>,
    from: (&dyn Io, u64),
    at: u64,
    src: &mut [u8],
    out: &mut [u8],
    sums: Option<(Hash, usize, &mut [u8])>,
    align: usize,
) -> std::io::Result<()> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let unit = sums.as_ref().map_or(align, |(_, bs, _)| align.max(*bs));
    let per = src.len().div_ceil(threads).div_ceil(unit).max(1) * unit;
    let (hash, bs, sums) = match sums {
        Some((h, bs, s)) => (Some(h), bs, Some(s)),
        None => (None, 1, None),
    };
    let hl = hash.map_or(0, |h| h.size());
    let (io, base) = from;
    std::thread::scope(|s| {
        let mut sums_left = sums;
        let mut workers = Vec::new();
        for (i, (src, out)) in src.chunks_mut(per).zip(out.chunks_mut(per)).enumerate() {
            let mine = match sums_left.take() {
                Some(rest) => {
                    let (a, b) = rest.split_at_mut((src.len() / bs * hl).min(rest.len()));
                    sums_left = Some(b);
                    Some(a)
                }
                None => None,
            };
            let off = (i * per) as u64;
            workers.push(s.spawn(move || -> std::io::Result<()> {
                // In pieces that stay in the core's cache through the four passes (read,
                // checksums, decrypt, encrypt): one pass each over a whole 32 MiB slice
                // ran at half the speed.
                let piece = (256usize << 10).div_ceil(unit) * unit;
                let mut mine = mine;
                for (j, (src, out)) in src.chunks_mut(piece).zip(out.chunks_mut(piece)).enumerate()
                {
                    let pos = off + (j * piece) as u64;
                    io.read_at(src, base + pos)?;
                    if let (Some(h), Some(rest)) = (hash, mine.take()) {
                        let (now, later) = rest.split_at_mut((src.len() / bs * hl).min(rest.len()));
                        for (block, sum) in src.chunks(bs).zip(now.chunks_mut(hl)) {
                            sum.copy_from_slice(&h.digest(&[block]));
                        }
                        mine = Some(later);
                    }
                    let first = Sector512(c.iv_base + (at + pos) / 512);
                    c.old.decrypt_from(first, src, out);
                    c.new.encrypt(first, out);
                }
                Ok(())
            }));
        }
        workers.into_iter().try_for_each(|w| {
            w.join()
                .unwrap_or_else(|_| Err(std::io::Error::other("a re-encryption thread panicked")))
        })
    })
}

impl Run {
    /// Opens `path` (header and data on one device), unlocks the old and new keys with
    /// `passphrase`, checks the reencryption digest.
    ///
    /// # Errors
    /// Not in reencryption, unsupported kind (encrypt, decrypt, data shift, backward), a
    /// passphrase that opens neither key, a digest that does not match.
    pub fn open(path: &Path, passphrase: &[u8]) -> Result<Run> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        Self::open_with(Box::new(file), path, passphrase)
    }

    /// As [`Run::open`], with the device's I/O through `io` (a test's model of a volatile
    /// write cache); `path` names the same device (its size, and the keyslots read by the
    /// pure-Rust unlock, which the data pass never changes).
    ///
    /// # Errors
    /// As [`Run::open`].
    pub fn open_with(io: Box<dyn Io>, path: &Path, passphrase: &[u8]) -> Result<Run> {
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
        let device_size = data_size(path, &device, &probe)?;
        let state = Reencrypt::load(&header.json, device_size).map_err(fe)?;
        let meta = Metadata::parse(&header.json.to_compact()).map_err(fe)?;
        let new_key = key_of(path, &meta, state.new.digest, "new", passphrase)?;
        let new = cipher(&state.new, &new_key)?;
        let old_key = match key_of(path, &meta, state.old.digest, "old", passphrase) {
            Ok(k) => k,
            // All data is under the new key and only the clean-up is left: the old key's
            // keyslot may already be wiped (a crash inside the clean-up). Finishing
            // deletes metadata only, so it proceeds with the new key alone.
            Err(_) if state.progress == (Progress::Clean { done: device_size }) => {
                return Ok(Run {
                    file: io,
                    device,
                    header,
                    old: cipher(&state.new, &new_key)?,
                    state,
                    device_size,
                    new,
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
            header,
            state,
            device_size,
            old,
            new,
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
            Progress::Crashed { offset, .. } => offset,
        }
    }

    /// The resilience mode recorded in the header.
    pub fn resilience(&self) -> &Resilience {
        &self.state.resilience
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

    fn sync(&self) -> Result<()> {
        self.file
            .sync()
            .with_context(|| format!("syncing {}", self.device))
    }

    /// The IV sector of data-area byte `at`.
    fn iv(&self, at: u64) -> Sector512 {
        Sector512(self.state.new.iv_tweak + at / 512)
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
        match self.state.resilience.clone() {
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
                self.pread(&mut buf, data_at)?;
                for s in 0..count {
                    let block = &mut buf[s * bs..(s + 1) * bs];
                    if h.digest(&[block])[..] == sums[s * h.size()..(s + 1) * h.size()] {
                        // Still the old ciphertext.
                        let pos = offset + (s * bs) as u64;
                        self.rekey(block, pos);
                        self.pwrite(block, data_at + (s * bs) as u64)?;
                    }
                }
            }
            Resilience::Journal => {
                if length > area_size {
                    bail!("hotzone of {length} bytes is larger than the {area_size}-byte journal");
                }
                self.pread(&mut buf, area_at)?;
                self.rekey(&mut buf, offset);
                self.pwrite(&buf, data_at)?;
            }
            Resilience::None => bail!(
                "{}: a hotzone was interrupted with resilience \"none\"; its data cannot be recovered",
                self.device
            ),
        }
        self.sync()?;
        self.state
            .set_done(&mut self.header.json, offset + length, self.device_size);
        self.write_header()?;
        self.state.progress = Progress::Clean {
            done: offset + length,
        };
        Ok(())
    }

    /// Runs (or resumes) the data pass and, when it completes, the final metadata change.
    /// `stop` is polled between hotzones (a signal handler's flag).
    ///
    /// Two hotzones are in flight: while a writer thread writes hotzone k (then syncs it),
    /// this thread reads hotzone k+1 and re-encrypts it out of place on every core (with
    /// its checksums in the same pass); then k's "post" header, k+1's resilience data and
    /// "hot" header, and k+1 goes to the writer. Hotzone k+1's area is read only, and the
    /// reencrypt keyslot's area rewritten only after k's post header, so the on-disk
    /// sequence per hotzone stays cryptsetup's.
    ///
    /// # Errors
    /// I/O errors; a crash state that cannot be recovered (resilience `none`).
    pub fn run(
        &mut self,
        opts: &RunOptions,
        stop: &AtomicBool,
        progress: &mut ProgressFn<'_>,
    ) -> Result<Outcome> {
        if let Progress::Crashed { offset, length } = self.state.progress {
            self.recover(offset, length)?;
        }
        let start = self.done();
        let size = self.device_size;
        progress(start, size);
        let none = self.state.resilience == Resilience::None;
        let sums_of = match &self.state.resilience {
            Resilience::Checksum { hash, sector_size } => {
                Some((Hash::from_name(hash).map_err(fe)?, *sector_size as usize))
            }
            _ => None,
        };
        let Run {
            file,
            device,
            header,
            state,
            old,
            new,
            ..
        } = self;
        let io: &dyn Io = file.as_ref();
        let device = device.as_str();
        let (old, new) = (old.as_ref(), new.as_ref());
        let align = state.old.sector_size.max(state.new.sector_size) as usize;
        let iv_base = state.new.iv_tweak;
        let mut src: Zeroizing<Vec<u8>> = Zeroizing::new(Vec::new());
        let mut spare: Zeroizing<Vec<u8>> = Zeroizing::new(Vec::new());
        let mut sums: Vec<u8> = Vec::new();
        let io_err = |what: &str, e: std::io::Error| anyhow!("{what} on {device}: {e}");
        let reached = std::thread::scope(|scope| -> Result<u64> {
            type Writing<'s> = std::thread::ScopedJoinHandle<'s, Result<Zeroizing<Vec<u8>>>>;
            let mut pending: Option<(Writing<'_>, u64)> = None;
            let mut next = start;
            let mut dirty = false;
            let mut done = start;
            loop {
                let stopping = stop.load(Ordering::Relaxed)
                    || opts.stop_after.is_some_and(|n| next - start >= n);
                // Phase 1 of the next hotzone, while the previous one is being written.
                let work = if next < size && !stopping {
                    let len = state.hotzone_length(next, size, opts.max_hotzone);
                    let n = usize::try_from(len)?;
                    src.resize(n, 0);
                    let mut out = std::mem::take(&mut spare);
                    out.resize(n, 0);
                    let data_at = state.new.offset + next;
                    if let Some((h, bs)) = &sums_of {
                        sums.resize(n / bs * h.size(), 0);
                    }
                    transform(
                        Cipher { old, new, iv_base },
                        (io, data_at),
                        next,
                        &mut src[..n],
                        &mut out[..n],
                        sums_of.as_ref().map(|(h, bs)| (*h, *bs, &mut sums[..])),
                        align,
                    )
                    .map_err(|e| io_err(&format!("reading {n} bytes at {data_at}"), e))?;
                    Some((next, len, out))
                } else {
                    None
                };
                if let Some((h, d)) = pending.take() {
                    spare = h
                        .join()
                        .map_err(|_| anyhow!("the writer thread panicked"))??;
                    state.set_done(&mut header.json, d, size);
                    if none {
                        dirty = true;
                    } else {
                        header.write(io, device).map_err(fe)?;
                    }
                    state.progress = Progress::Clean { done: d };
                    done = d;
                    progress(d, size);
                }
                let Some((at, len, out)) = work else {
                    break;
                };
                // The commit point: resilience data, synced, then the "hot" header.
                let n = len as usize;
                match sums_of {
                    Some(_) => io.write_at(&sums, state.area.0),
                    None if state.resilience == Resilience::Journal => {
                        io.write_at(&src[..n], state.area.0)
                    }
                    None => Ok(()),
                }
                .map_err(|e| io_err("writing the resilience data", e))?;
                if !none {
                    // Durable before the header names the hotzone: cryptsetup relies on
                    // the header's own fsync, which leaves a window where a power cut
                    // keeps the header and loses part of the checksums or journal.
                    io.sync().map_err(|e| io_err("syncing", e))?;
                    state.set_hot(&mut header.json, at, len, size);
                    header.write(io, device).map_err(fe)?;
                }
                let data_at = state.new.offset + at;
                let handle = scope.spawn(move || -> Result<Zeroizing<Vec<u8>>> {
                    io.write_at(&out[..n], data_at)
                        .map_err(|e| anyhow!("writing {n} bytes at {data_at} on {device}: {e}"))?;
                    if !none {
                        io.sync().map_err(|e| anyhow!("syncing {device}: {e}"))?;
                    }
                    Ok(out)
                });
                pending = Some((handle, at + len));
                next = at + len;
            }
            if dirty {
                io.sync().map_err(|e| io_err("syncing", e))?;
                header.write(io, device).map_err(fe)?;
            }
            Ok(done)
        })?;
        if reached < size {
            return Ok(Outcome::Interrupted);
        }
        self.finish()?;
        Ok(Outcome::Finished)
    }

    /// Wipes `size` bytes at `at` with random bytes (as `crypt_keyslot_destroy` does on a
    /// non-rotational device). Not synced on its own: the header write that follows (which
    /// drops the keyslot) syncs the file, and either order of the two reaching the disk is
    /// safe (a keyslot still named but wiped is handled by [`Run::open_with`]).
    fn wipe_random(&self, at: u64, size: u64) -> Result<()> {
        use std::io::Read;
        let mut rng = File::open("/dev/urandom").context("opening /dev/urandom")?;
        let mut chunk = vec![0u8; 1 << 20];
        let mut pos = 0;
        while pos < size {
            let n = (size - pos).min(chunk.len() as u64) as usize;
            rng.read_exact(&mut chunk[..n])?;
            self.pwrite(&chunk[..n], at + pos)?;
            pos += n as u64;
        }
        Ok(())
    }

    /// The end: the old keyslots go one by one, then everything of the reencryption.
    fn finish(&mut self) -> Result<()> {
        for (slot, at, size) in self.state.old_keyslots(&self.header.json) {
            self.wipe_random(at, size)?;
            Reencrypt::destroy_keyslot(&mut self.header.json, slot);
            self.write_header()?;
        }
        let (at, size) = self.state.area;
        self.wipe_random(at, size)?;
        self.state.finish(&mut self.header.json);
        self.write_header()
    }

    /// The JSON metadata as it is now (tests compare it with cryptsetup's).
    pub fn json(&self) -> &Json {
        &self.header.json
    }
}
