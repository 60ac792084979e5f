//! cryptsetup's legacy LUKS1 reencryption (`src/utils_reencrypt_luks1.c` in cryptsetup
//! 2.6, formerly `cryptsetup-reencrypt`): its files, the unusable header mark and the data
//! pass, so that a run of either tool can be resumed by the other.
//!
//! cryptsetup keeps the state in the current directory, named by the volume's UUID:
//! - `LUKS-<UUID>.org`: the old header (`crypt_header_backup`; for `--encrypt` a
//!   `cipher_null` header with UUID [`NO_UUID`] and data offset 0);
//! - `LUKS-<UUID>.new`: the new header (for `--decrypt` a `cipher_null` one);
//! - `LUKS-<UUID>.log`: one 512-byte sector of text, [`Log`]; its existence means "in
//!   progress".
//!
//! While a re-key or a decryption runs, the device's LUKS1 magic `LUKS\xba\xbe` is
//! `LUKS\xde\xad` ([`UNUSABLE_MAGIC`]), so that nothing opens the half re-encrypted volume.
//! The data pass reads the data area through the old header's mapping and writes it
//! through the new one, block by block (`--block-size` MiB, 4 by default), forward (offset
//! counts up from 0) or with `--reduce-device-size` backward (offset counts down from the
//! size). cryptsetup maps both with dm-crypt; ucrypt reads and writes the device through a
//! [`Backend`] and re-encrypts each block through the engine
//! ([`Volume::recrypt_in_place`], every core).
//!
//! Crash safety: cryptsetup writes the log at the start and end of a pass (and after each
//! block with `--write-log`), so a kill -9 leaves blocks re-encrypted that the log says
//! are not, and a resume decrypts them with the old key. ucrypt writes the log after every
//! block, after the block is on disk (fdatasync), and before overwriting a block keeps its
//! old contents in a journal file of its own (`LUKS-<UUID>.ucrypt-journal`, checksummed,
//! on disk before the block is written): a resume by ucrypt first puts a journaled block
//! that the log says is not done back as it was. (cryptsetup does not read the journal: a
//! ucrypt run killed with -9 in the instant between a block's write and its log update is
//! safe to resume with ucrypt only.)

use sha2::{Digest, Sha256};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use ucrypt_backend::{Backend, BackendError};
use ucrypt_crypto::{CipherSpec, SectorCipher, SectorParams, VolumeKey};
use ucrypt_engine::{EngineOptions, Volume, VolumeConfig};

/// The UUID of cryptsetup's `--encrypt` state files (the plaintext device has none).
pub const NO_UUID: &str = "cafecafe-cafe-cafe-cafe-cafecafeeeee";
/// LUKS1 magic of a usable header.
pub const MAGIC: [u8; 6] = *b"LUKS\xba\xbe";
/// LUKS1 magic while cryptsetup's LUKS1 reencryption runs.
pub const UNUSABLE_MAGIC: [u8; 6] = *b"LUKS\xde\xad";
/// Log file size: one sector.
pub const LOG_SIZE: usize = 512;
/// cryptsetup's default `--block-size` (MiB).
pub const DEFAULT_BLOCK_MIB: u32 = 4;

/// Errors of the LUKS1 reencryption files and pass.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The log is not cryptsetup's format (cryptsetup: "Wrong log format.").
    #[error("Wrong log format.")]
    LogFormat,
    /// A read or write failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        source: io::Error,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

/// As [`io_err`] for the device's errors (its message, the OS error's kind kept).
fn dev_err(what: impl Into<String>) -> impl FnOnce(BackendError) -> Error {
    let what = what.into();
    move |e| Error::Io {
        what,
        source: match e {
            BackendError::Io { source, .. } | BackendError::Open { source, .. } => source,
            other => io::Error::other(other),
        },
    }
}

/// Pass direction (cryptsetup's numbers in the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Offset counts up from 0 (re-key, decryption).
    Forward = 0,
    /// Offset counts down from the size (`--reduce-device-size`: the data moves up).
    Backward = 1,
}

/// What the pass does (cryptsetup's numbers in the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// New volume key (and maybe cipher).
    Reencrypt = 0,
    /// Plaintext device to LUKS1.
    Encrypt = 1,
    /// LUKS1 to plaintext.
    Decrypt = 2,
}

/// The log file's contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Log {
    /// The volume's UUID ([`NO_UUID`] for `--encrypt`).
    pub uuid: String,
    /// Pass direction.
    pub direction: Direction,
    /// Pass mode.
    pub mode: Mode,
    /// Forward: bytes done from the start; backward: bytes left (done from here to the
    /// end); `u64::MAX` before a backward pass starts.
    pub offset: u64,
    /// Always 0 (cryptsetup 2.6 writes it and never sets it).
    pub shift: u64,
}

impl Log {
    /// The 512-byte sector cryptsetup writes (text, zero-padded).
    pub fn render(&self) -> [u8; LOG_SIZE] {
        let text = format!(
            "# LUKS reencryption log, DO NOT EDIT OR DELETE.\nversion = 2\nUUID = {}\n\
             direction = {}\nmode = {}\noffset = {}\nshift = {}\n# EOF\n",
            self.uuid, self.direction as u8, self.mode as u8, self.offset, self.shift
        );
        let mut buf = [0u8; LOG_SIZE];
        let n = text.len().min(LOG_SIZE - 1);
        buf[..n].copy_from_slice(&text.as_bytes()[..n]);
        buf
    }

    /// Parses a log as cryptsetup does (`parse_log`): every complete line a comment or a
    /// known `key = value`, the UUID the volume's (`uuid`). Missing lines keep cryptsetup's
    /// defaults (forward, re-key, offset 0).
    ///
    /// # Errors
    /// [`Error::LogFormat`] on an unknown line, a bad version, mode or another UUID.
    pub fn parse(buf: &[u8], uuid: &str) -> Result<Log, Error> {
        let end = buf.len().min(LOG_SIZE - 1);
        let text = &buf[..end];
        let text = &text[..text.iter().position(|&b| b == 0).unwrap_or(text.len())];
        let text = std::str::from_utf8(text).map_err(|_| Error::LogFormat)?;
        let mut log = Log {
            uuid: uuid.to_owned(),
            direction: Direction::Forward,
            mode: Mode::Reencrypt,
            offset: 0,
            shift: 0,
        };
        // Only newline-terminated lines count (cryptsetup's loop drops the tail).
        let mut lines: Vec<&str> = text.split('\n').collect();
        lines.pop();
        for line in lines {
            if line.starts_with('#') {
                continue;
            }
            let (key, value) = line.split_once(" = ").ok_or(Error::LogFormat)?;
            let value = value.trim_end();
            let num = || value.parse::<u64>().map_err(|_| Error::LogFormat);
            match key {
                "version" => {
                    if !matches!(num()?, 1 | 2) {
                        return Err(Error::LogFormat);
                    }
                }
                "UUID" => {
                    if value.get(..40.min(value.len())) != Some(uuid) {
                        return Err(Error::LogFormat);
                    }
                }
                "direction" => {
                    log.direction = if num()? == 1 {
                        Direction::Backward
                    } else {
                        Direction::Forward
                    }
                }
                "mode" => {
                    log.mode = match num()? {
                        0 => Mode::Reencrypt,
                        1 => Mode::Encrypt,
                        2 => Mode::Decrypt,
                        _ => return Err(Error::LogFormat),
                    }
                }
                "offset" => log.offset = num()?,
                "shift" => log.shift = num()?,
                _ => return Err(Error::LogFormat),
            }
        }
        Ok(log)
    }
}

/// The state files of the volume `uuid` in `dir` (cryptsetup: the current directory).
#[derive(Debug, Clone)]
pub struct Files {
    /// `LUKS-<UUID>.log`.
    pub log: PathBuf,
    /// `LUKS-<UUID>.org`.
    pub org: PathBuf,
    /// `LUKS-<UUID>.new`.
    pub new: PathBuf,
    /// `LUKS-<UUID>.ucrypt-journal` (ucrypt's only).
    pub journal: PathBuf,
}

impl Files {
    /// The files for `uuid` in `dir`.
    pub fn new(dir: &Path, uuid: &str) -> Files {
        let f = |ext: &str| dir.join(format!("LUKS-{uuid}.{ext}"));
        Files {
            log: f("log"),
            org: f("org"),
            new: f("new"),
            journal: f("ucrypt-journal"),
        }
    }
}

/// Reads the first 4 KiB of `path` (cryptsetup's `device_check` reads a page).
fn first_page(path: &Path) -> io::Result<Vec<u8>> {
    let f = File::open(path)?;
    let mut buf = vec![0u8; 4096];
    f.read_exact_at(&mut buf, 0)?;
    Ok(buf)
}

fn version(page: &[u8]) -> u16 {
    u16::from_be_bytes([page[6], page[7]])
}

/// cryptsetup's `reencrypt_luks1_in_progress`: the UUID of a LUKS1 header marked unusable
/// (magic `LUKS\xde\xad`, version 1), None otherwise.
pub fn unusable_uuid(path: &Path) -> Option<String> {
    let page = first_page(path).ok()?;
    if page[..6] != UNUSABLE_MAGIC || version(&page) != 1 {
        return None;
    }
    let raw = &page[0xa8..0xa8 + 40];
    let raw = &raw[..raw.iter().position(|&b| b == 0).unwrap_or(raw.len())];
    Some(String::from_utf8_lossy(raw).into_owned())
}

/// Whether `path` holds a usable LUKS1 header's magic and version.
pub fn is_luks1(path: &Path) -> bool {
    first_page(path).is_ok_and(|p| p[..6] == MAGIC && version(&p) == 1)
}

/// Marks the LUKS1 header on `path` unusable (`unusable`) or usable again: its magic only,
/// synced (cryptsetup's `MAKE_UNUSABLE`).
///
/// # Errors
/// The header is not LUKS1 in the other state, or I/O.
pub fn set_unusable(path: &Path, unusable: bool) -> Result<(), Error> {
    let (from, to) = if unusable {
        (MAGIC, UNUSABLE_MAGIC)
    } else {
        (UNUSABLE_MAGIC, MAGIC)
    };
    let what = || format!("marking the LUKS1 header of {}", path.display());
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(io_err(what()))?;
    let mut page = vec![0u8; 4096];
    f.read_exact_at(&mut page, 0).map_err(io_err(what()))?;
    if page[..6] != from || version(&page) != 1 {
        return Err(Error::Io {
            what: what(),
            source: io::Error::new(io::ErrorKind::InvalidData, "not a LUKS1 header"),
        });
    }
    f.write_all_at(&to, 0).map_err(io_err(what()))?;
    f.sync_all().map_err(io_err(what()))
}

/// Writes `log` to its file (the whole sector, at 0) and syncs it.
///
/// # Errors
/// I/O (cryptsetup: "Cannot write reencryption log file.").
pub fn write_log(file: &File, log: &Log) -> Result<(), Error> {
    file.write_all_at(&log.render(), 0)
        .and_then(|()| file.sync_data())
        .map_err(io_err("Cannot write reencryption log file"))
}

/// One side of the pass: a data area at `base` bytes into the device, encrypted with
/// `cipher` (None: plaintext, cryptsetup's `cipher_null` header).
pub struct Side {
    /// dm-crypt compatible sector cipher of the side's header, IVs from the data area's
    /// start (LUKS1: 512-byte sectors, no IV offset).
    pub cipher: Option<Arc<dyn SectorCipher>>,
    /// The data area's start on the device, bytes.
    pub base: u64,
}

/// The data pass.
pub struct Pass {
    /// Where the data is read from (old header).
    pub old: Side,
    /// Where it is written to (new header).
    pub new: Side,
    /// Bytes of the data area to process (cryptsetup's `device_size`).
    pub size: u64,
    /// Bytes per block (`--block-size` MiB).
    pub block: u64,
    /// Direction.
    pub direction: Direction,
    /// Journal file path (ucrypt's own crash safety).
    pub journal: PathBuf,
}

/// How a pass ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// All of the data area is done.
    Finished,
    /// Stopped on request; the log says where.
    Interrupted,
}

const JOURNAL_MAGIC: &[u8; 16] = b"ucrypt-luks1-jnl";
const JOURNAL_HEAD: usize = 512;

/// The journal header: magic, offset (mapping bytes), length, SHA-256 of the data.
fn journal_head(offset: u64, data: &[u8]) -> [u8; JOURNAL_HEAD] {
    let mut h = [0u8; JOURNAL_HEAD];
    h[..16].copy_from_slice(JOURNAL_MAGIC);
    h[16..24].copy_from_slice(&offset.to_le_bytes());
    h[24..32].copy_from_slice(&(data.len() as u64).to_le_bytes());
    h[32..64].copy_from_slice(&Sha256::digest(data));
    h
}

impl Pass {
    /// The engine over `dev` with the old side's cipher (whose
    /// [`Volume::recrypt_in_place`] does each block's crypto on every core), and the new
    /// side's cipher.
    fn engine(&self, dev: &Arc<dyn Backend>) -> Result<(Volume, Arc<dyn SectorCipher>), Error> {
        let cfg = VolumeConfig {
            data_offset_bytes: self.old.base,
            length_bytes: self.size,
            read_only: false,
            allow_discards: false,
        };
        let opts = EngineOptions {
            submit_from_crypt_cpus: true,
            ..EngineOptions::default()
        };
        let old = Volume::with_options(side_cipher(&self.old)?, Arc::clone(dev), cfg, opts)
            .map_err(|e| Error::Io {
                what: "the old side's volume".into(),
                source: io::Error::other(e),
            })?;
        Ok((old, side_cipher(&self.new)?))
    }

    /// The physical range a block of the data area at `off` (len `len`) reads from and
    /// writes to overlap: the old bytes are then lost once the write starts.
    fn overlaps(&self, off: u64, len: u64) -> bool {
        let (a, b) = (self.old.base + off, self.new.base + off);
        a < b + len && b < a + len
    }

    /// Puts back a journaled block that `log` says is not done (a ucrypt run killed while
    /// writing it), so that the pass can read it with the old key again. Returns whether
    /// one was restored.
    ///
    /// # Errors
    /// I/O.
    pub fn recover(&self, dev: &dyn Backend, log: &Log) -> Result<bool, Error> {
        let Ok(j) = std::fs::read(&self.journal) else {
            return Ok(false);
        };
        if j.len() < JOURNAL_HEAD || &j[..16] != JOURNAL_MAGIC {
            return Ok(false);
        }
        let off = u64::from_le_bytes(j[16..24].try_into().unwrap_or_default());
        let len = u64::from_le_bytes(j[24..32].try_into().unwrap_or_default());
        let Some(data) = usize::try_from(len)
            .ok()
            .and_then(|l| j.get(JOURNAL_HEAD..JOURNAL_HEAD + l))
        else {
            return Ok(false);
        };
        if j[32..64] != Sha256::digest(data)[..] {
            // Torn: the journal was not on disk yet, so the block was not touched.
            return Ok(false);
        }
        let pending = match self.direction {
            Direction::Forward => off == log.offset,
            Direction::Backward => off.checked_add(len) == Some(log.offset),
        };
        if !pending {
            return Ok(false);
        }
        dev.write_at(data, self.old.base + off, false)
            .and_then(|()| dev.flush())
            .map_err(dev_err("restoring the journaled block"))?;
        Ok(true)
    }

    /// Runs the pass from `log.offset` until done or `stop`, writing `log` to `log_file`
    /// after every block (after the block is on disk). `progress(done, size)`.
    ///
    /// # Errors
    /// I/O on the device, journal or log.
    pub fn run(
        &self,
        dev: &Arc<dyn Backend>,
        log_file: &File,
        log: &mut Log,
        stop: &AtomicBool,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Outcome, Error> {
        if self.direction == Direction::Backward && log.offset > self.size {
            log.offset = self.size;
        }
        if self.direction == Direction::Forward && log.offset > self.size {
            log.offset = self.size;
        }
        write_log(log_file, log)?;
        let journal = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(&self.journal)
        }
        .map_err(io_err(format!("opening {}", self.journal.display())))?;
        let block = self.block.max(512);
        let mut buf = vec![0u8; usize::try_from(block).unwrap_or(4 << 20)];
        let (old, new) = self.engine(dev)?;
        let done = |log: &Log| match self.direction {
            Direction::Forward => log.offset,
            Direction::Backward => self.size - log.offset,
        };
        progress(done(log), self.size);
        loop {
            let (off, len) = match self.direction {
                Direction::Forward if log.offset < self.size => {
                    (log.offset, block.min(self.size - log.offset))
                }
                Direction::Backward if log.offset > 0 => {
                    let len = block.min(log.offset);
                    (log.offset - len, len)
                }
                _ => return Ok(Outcome::Finished),
            };
            if stop.load(Ordering::Relaxed) {
                return Ok(Outcome::Interrupted);
            }
            let data = &mut buf[..len as usize];
            dev.read_at(data, self.old.base + off)
                .map_err(dev_err("IO error during reencryption (read)"))?;
            if self.overlaps(off, len) {
                let head = journal_head(off, data);
                journal
                    .write_all_at(data, JOURNAL_HEAD as u64)
                    .and_then(|()| journal.write_all_at(&head, 0))
                    .and_then(|()| journal.sync_data())
                    .map_err(io_err("writing the block journal"))?;
            }
            old.recrypt_in_place(&*new, off, data, None)
                .map_err(dev_err("IO error during reencryption (crypto)"))?;
            dev.write_at(data, self.new.base + off, false)
                .and_then(|()| dev.flush())
                .map_err(dev_err("IO error during reencryption (write)"))?;
            log.offset = match self.direction {
                Direction::Forward => off + len,
                Direction::Backward => off,
            };
            write_log(log_file, log)?;
            progress(done(log), self.size);
        }
    }
}

/// Writes zeros over `[from, to)` of `dev` (cryptsetup wipes what a decryption leaves
/// beyond the plaintext: the old data area is longer than the new one by the header).
///
/// # Errors
/// I/O.
pub fn zero_range(dev: &dyn Backend, from: u64, to: u64) -> Result<(), Error> {
    let zeros = vec![0u8; 1 << 20];
    let mut at = from;
    while at < to {
        let n = (to - at).min(zeros.len() as u64);
        dev.write_at(&zeros[..n as usize], at, false)
            .map_err(dev_err("zeroing the rest of the device"))?;
        at += n;
    }
    dev.flush()
        .map_err(dev_err("zeroing the rest of the device"))
}

/// A side's cipher; plaintext (no cipher) as `cipher_null`, whose crypto is the identity.
fn side_cipher(side: &Side) -> Result<Arc<dyn SectorCipher>, Error> {
    if let Some(c) = &side.cipher {
        return Ok(Arc::clone(c));
    }
    let spec: CipherSpec = "cipher_null-ecb".parse().map_err(|e| Error::Io {
        what: "cipher_null".into(),
        source: io::Error::other(e),
    })?;
    let c = spec
        .build(&VolumeKey::empty(), SectorParams::default())
        .map_err(|e| Error::Io {
            what: "cipher_null".into(),
            source: io::Error::other(e),
        })?;
    Ok(Arc::from(c))
}

/// OS random bytes (`getrandom(2)`).
fn random(out: &mut [u8]) -> io::Result<()> {
    let mut at = 0;
    while at < out.len() {
        // SAFETY: the pointer and length name the unfilled tail of `out`, valid for writes.
        let n = unsafe { libc::getrandom(out[at..].as_mut_ptr().cast(), out.len() - at, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
            continue;
        }
        at += n as usize;
    }
    Ok(())
}

/// Writes the `cipher_null` LUKS1 header cryptsetup's `backup_fake_header` makes for the
/// plaintext side of a decryption (the `.new` file): cipher `cipher_null-ecb`, UUID
/// [`NO_UUID`], data offset 0 (a detached header), a random `key_bytes` volume key, one
/// keyslot `slot` (PBKDF2 with `hash`, `iterations`) that opens with the empty passphrase
/// only, as libcryptsetup allows for `cipher_null` (its keyslot area is stored as is: the
/// null cipher does not encrypt). Written by hand because libcryptsetup's `crypt_format`
/// checks the cipher through the kernel (device-mapper), which ucrypt does without; the
/// layout is LUKS1's (`LUKS_generate_phdr`): keyslot areas from sector 8, each rounded up
/// to 8 sectors, 4000 stripes.
///
/// # Errors
/// An unknown hash, or I/O.
pub fn write_null_header(
    path: &Path,
    key_bytes: usize,
    hash: &str,
    slot: u32,
    iterations: u32,
) -> Result<(), Error> {
    use ucrypt_format::kdf::Hash;
    const STRIPES: u32 = 4000;
    let h = Hash::from_name(hash).map_err(|e| Error::Io {
        what: format!("hash {hash}"),
        source: io::Error::new(io::ErrorKind::InvalidInput, e.to_string()),
    })?;
    let iterations = iterations.max(1000);
    let rnd = |n: usize| -> Result<zeroize::Zeroizing<Vec<u8>>, Error> {
        let mut v = zeroize::Zeroizing::new(vec![0u8; n]);
        random(&mut v).map_err(io_err("random bytes"))?;
        Ok(v)
    };
    let vk = rnd(key_bytes)?;
    let mk_salt = rnd(32)?;
    let mut digest = [0u8; 20];
    h.pbkdf2(&vk, &mk_salt, iterations, &mut digest);
    let mut hdr = vec![0u8; 4096];
    let put = |hdr: &mut Vec<u8>, at: usize, b: &[u8]| hdr[at..at + b.len()].copy_from_slice(b);
    put(&mut hdr, 0, &MAGIC);
    put(&mut hdr, 6, &1u16.to_be_bytes());
    put(&mut hdr, 8, b"cipher_null");
    put(&mut hdr, 40, b"ecb");
    put(&mut hdr, 72, hash.as_bytes());
    put(&mut hdr, 104, &0u32.to_be_bytes());
    put(&mut hdr, 108, &(key_bytes as u32).to_be_bytes());
    put(&mut hdr, 112, &digest);
    put(&mut hdr, 132, &mk_salt);
    put(&mut hdr, 164, &iterations.to_be_bytes());
    put(&mut hdr, 168, NO_UUID.as_bytes());
    let area = (key_bytes * STRIPES as usize).div_ceil(512) as u32;
    let area = area.div_ceil(8) * 8;
    let mut material = None;
    for i in 0..8u32 {
        let at = 208 + 48 * i as usize;
        let offset = 8 + i * area;
        if i == slot {
            let salt = rnd(32)?;
            put(&mut hdr, at, &0x00AC_71F3u32.to_be_bytes());
            put(&mut hdr, at + 4, &iterations.to_be_bytes());
            put(&mut hdr, at + 8, &salt);
            let fill = rnd(key_bytes * (STRIPES as usize - 1))?;
            material = Some((offset, ucrypt_format::af::split(&vk, STRIPES, h, &fill)));
        } else {
            put(&mut hdr, at, &0x0000_DEADu32.to_be_bytes());
            put(&mut hdr, at + 4, &0u32.to_be_bytes());
        }
        put(&mut hdr, at + 40, &offset.to_be_bytes());
        put(&mut hdr, at + 44, &STRIPES.to_be_bytes());
    }
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(io_err(format!("opening {}", path.display())))?;
    let what = format!("writing {}", path.display());
    f.set_len(u64::from(8 + 8 * area) * 512)
        .map_err(io_err(what.clone()))?;
    if let Some((offset, m)) = material {
        f.write_all_at(&m, u64::from(offset) * 512)
            .map_err(io_err(what.clone()))?;
    }
    f.write_all_at(&hdr, 0)
        .and_then(|()| f.sync_all())
        .map_err(io_err(what))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_round_trips_in_cryptsetups_text() {
        let log = Log {
            uuid: "1945d832-aa67-4de0-9445-e4992e1499fc".into(),
            direction: Direction::Backward,
            mode: Mode::Encrypt,
            offset: 123456,
            shift: 0,
        };
        let buf = log.render();
        let text = std::str::from_utf8(&buf[..buf.iter().position(|&b| b == 0).unwrap()]).unwrap();
        assert_eq!(
            text,
            "# LUKS reencryption log, DO NOT EDIT OR DELETE.\nversion = 2\nUUID = \
             1945d832-aa67-4de0-9445-e4992e1499fc\ndirection = 1\nmode = 1\noffset = \
             123456\nshift = 0\n# EOF\n"
        );
        assert_eq!(Log::parse(&buf, &log.uuid).unwrap(), log);
        assert!(matches!(
            Log::parse(&buf, "00000000-aa67-4de0-9445-e4992e1499fc"),
            Err(Error::LogFormat)
        ));
        let mut bad = buf;
        bad[2] = b'X';
        bad[0] = b'x';
        assert!(Log::parse(&bad, &log.uuid).is_err());
    }

    #[test]
    fn journaled_block_is_restored_only_when_pending() {
        let dir = tempfile::tempdir().unwrap();
        let dev_path = dir.path().join("dev");
        std::fs::write(&dev_path, vec![7u8; 8192]).unwrap();
        let dev = ucrypt_backend::FileBackend::open(&dev_path, Default::default()).unwrap();
        let pass = Pass {
            old: Side {
                cipher: None,
                base: 0,
            },
            new: Side {
                cipher: None,
                base: 0,
            },
            size: 8192,
            block: 4096,
            direction: Direction::Forward,
            journal: dir.path().join("j"),
        };
        let old = vec![1u8; 4096];
        let mut j = journal_head(4096, &old).to_vec();
        j.extend_from_slice(&old);
        std::fs::write(&pass.journal, &j).unwrap();
        let mut log = Log {
            uuid: NO_UUID.into(),
            direction: Direction::Forward,
            mode: Mode::Reencrypt,
            offset: 8192,
            shift: 0,
        };
        assert!(!pass.recover(&dev, &log).unwrap());
        log.offset = 4096;
        assert!(pass.recover(&dev, &log).unwrap());
        let back = std::fs::read(&dev_path).unwrap();
        assert_eq!(&back[4096..], &old[..]);
        assert_eq!(&back[..4096], &[7u8; 4096][..]);
        // A torn journal (data not matching its checksum) is ignored.
        j[JOURNAL_HEAD] ^= 1;
        std::fs::write(&pass.journal, &j).unwrap();
        assert!(!pass.recover(&dev, &log).unwrap());
    }
}
