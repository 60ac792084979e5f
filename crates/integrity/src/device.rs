//! The dm-integrity device: open (superblock checks, journal replay, recalculation),
//! reads that check tags, writes in modes J, D and B, close as the kernel's suspend leaves
//! the device.
//!
//! Locking: one `RwLock` over the state. Reads share it; mode J's writes (into the
//! journal) and flushes take it alone, so that a reader never sees a block's new data with
//! its old tag. In modes D and B a write, like a read, holds it shared for its whole
//! duration, and the blocks themselves are kept apart by range locks, as the kernel's
//! `add_new_range`/`wait_and_add_new_range` keep them:
//!
//! - `ranges`, over logical sectors: a D/B write locks its request's sectors alone, a D/B
//!   read shares them, so a request waits only for overlapping ones (first come, first
//!   served among those) and a reader never sees a block's new data with its old tag or the
//!   reverse, nor half a block. Requests to other blocks go on in parallel, the data and
//!   tag I/O of each included.
//! - `tag_units`, over the byte offsets of the aligned tag units (`TagUpdate`'s) on the
//!   metadata device: tags of neighbouring blocks share units, so a write locks the units it
//!   reads, changes and writes back, alone, for that read-modify-write only (the kernel's
//!   per-buffer lock of dm-bufio). Tag units rather than a logical range widened to every
//!   block sharing them: the units follow from device offsets alone, whatever the layout
//!   (areas, tag buffers, a separate metadata device), and neighbours wait for each other's
//!   tag update, not for each other's data. Taken after `ranges`, never the reverse. In
//!   every mode, every writer of tags (D/B writes, the journal's write-back and replay,
//!   recalculation) holds its units alone, and a read whose tags are not cached holds
//!   them shared while it reads them and puts them in `tag_cache`.
//! - `tag_cache` ([`UnitCache`]): the tag units last read or written, at most
//!   `Options::tag_cache_bytes` (4 MiB) whatever the device's size, as the kernel keeps
//!   dm-integrity's metadata in dm-bufio: reads whose units are there read no tags from
//!   the device, the write-back and D/B writes read none of the units they change in
//!   part. Write-through: a writer writes the device first and then the cache, so the
//!   device gets every tag write as without it (same batches, same flushes), and the
//!   `tag_units` lock keeps a read's fill from putting in bytes older than a write's (the
//!   argument is at [`UnitCache`]). As dm-bufio's buffers do, a cached unit hides a tag
//!   changed on the device behind the open device's back; data changed there is still
//!   caught (tags are checked against data read from the device).
//! - `bitmap` (mode B), a mutex held while a write marks its regions dirty and the changed
//!   bitmap is written (FUA), before the write's data and tags: a writer that finds its
//!   bits set finds them on the device.
//!
//! A flush, close (and everything on open: replay, recalculation, a resize) takes the state
//! lock alone, so it waits for every D/B write under way and none starts meanwhile (in
//! mode B a flush clears the bitmap only once no write that set a bit is in flight). Two
//! mutexes order the journal's slow steps, each taken before the state lock and never
//! while holding it:
//!
//! - `commit_lock`, held by the one commit under way (`integrity_commit`): it stamps the
//!   uncommitted sections with their commit ids and MACs them under the state lock, then
//!   writes them (FUA) *without* it, then marks them committed under it again. Meanwhile
//!   readers read (blocks in those sections included: nothing in them changes) and
//!   writers fill the free entries after them, which a later commit covers. A flush or
//!   FUA write commits through the same mutex, so it returns only once a commit that
//!   holds its blocks (the one under way, or its own after it) is on the device.
//! - `writeback`, held by the one write-back under way (`integrity_writer`: committed
//!   sections copied to their places): it commits, picks the blocks under the state lock
//!   and makes them whole in their sections (each sector's last 8 bytes back from its
//!   entry), writes them straight from the sections and flushes without it, and frees the
//!   sections under it again. Readers still find those blocks in the journal (their
//!   entries stay the newest until the sections are freed). The sections are page-aligned,
//!   so neither a commit's writes nor a write-back's are copied on their way to an
//!   `O_DIRECT` device.
//!
//! A writer whose entries reach the watermark starts the write-back on a thread of its
//! own and returns (the kernel's commit and writer workqueues), so that neither the
//! journal write nor the copy-out is in any writer's path; only a writer that finds the
//! journal full waits for it. Closing takes `writeback`, then `commit_lock`, then the
//! state lock, and holds all three.

use crate::hash::{Algorithm, Hasher};
use crate::journal_crypt::JournalCrypt;
use crate::range_lock::RangeLock;
use crate::tags::{TagUpdate, UnitCache, DEFAULT_TAG_CACHE_BYTES};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};
use std::thread::JoinHandle;
use ucrypt_backend::{
    check_range, emulate, AlignedBuf, Backend, BackendError, BackendInfo, Caps, Io, IoKind,
    Support, WriteOp,
};
use ucrypt_format::integrity::{
    commit_id_in, entry_state, log2_blocks_per_bitmap_bit, max_provided_data_sectors,
    next_commit_seq, set_entry_unused, AfterReplay, CommitIds, EntryState, Flags, FormatParams,
    Geometry, JournalShape, ReplayPlan, Superblock, BITMAP_BLOCK_SIZE, COMMIT_IDS,
    DEFAULT_BUFFER_SECTORS, DEFAULT_JOURNAL_WATERMARK, JOURNAL_BLOCK_SECTORS,
    JOURNAL_MAC_PER_SECTOR, JOURNAL_MAC_SIZE, SALT_SIZE, SB_SECTORS,
};
use ucrypt_format::FormatError;
use zeroize::Zeroizing;

/// How writes reach their places (the table's mode letter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `J`: through the journal, data and tag together (the default).
    Journal,
    /// `D`: straight to their places; a crash can leave a block whose tag does not match.
    Direct,
    /// `B`: straight to their places under a dirty bitmap; tags of blocks marked dirty are
    /// recalculated after a crash.
    Bitmap,
    /// `R`: recovery: read-only, tags not checked, journal not replayed.
    Recovery,
}

impl Mode {
    /// The table's letter.
    pub fn letter(self) -> char {
        match self {
            Mode::Journal => 'J',
            Mode::Direct => 'D',
            Mode::Bitmap => 'B',
            Mode::Recovery => 'R',
        }
    }
}

/// What opening takes besides the superblock (the kernel's table arguments). Its `Debug`
/// shows whether each key is there, never the key.
#[derive(Clone)]
pub struct Options {
    /// J, D, B or R.
    pub mode: Mode,
    /// `internal_hash` (ignored with `external_tags`).
    pub hash: Algorithm,
    /// No `internal_hash`: the tags are the layer above's (dm-crypt's authenticated
    /// modes), written with [`IntegrityBackend::write_tagged`] and returned by
    /// [`IntegrityBackend::read_tagged`] as they are, never computed or checked here.
    pub external_tags: bool,
    /// Its key (HMACs).
    pub hash_key: Option<Zeroizing<Vec<u8>>>,
    /// `journal_mac` and its key, required when the superblock says the journal has a MAC.
    pub journal_mac: Option<(Algorithm, Option<Zeroizing<Vec<u8>>>)>,
    /// `journal_crypt`: the cipher's name (`ctr(aes)`, `cbc-aes`...) and its key. The
    /// superblock does not say whether the journal is encrypted: without it, an encrypted
    /// journal shows no valid commit id and the device is refused, as the kernel fails it.
    pub journal_crypt: Option<(String, Zeroizing<Vec<u8>>)>,
    /// `buffer_sectors` (tags are addressed in buffers of this size; default 128).
    pub buffer_sectors: u32,
    /// `journal_watermark` in percent (the journal is written back when it is this full).
    pub journal_watermark: u32,
    /// `sectors_per_bit` of bitmap mode (0: 32768).
    pub sectors_per_bit: u64,
    /// Never write (the journal is replayed in memory only).
    pub read_only: bool,
    /// `legacy_recalculate`: allow recalculating HMAC tags (the kernel refuses it by
    /// default: an attacker could have the kernel sign data it wrote).
    pub legacy_recalculate: bool,
    /// The table's tag size, which must be the superblock's (`None`: take the
    /// superblock's).
    pub tag_size: Option<u32>,
    /// The table's `block_size`, which must be the superblock's (`None`: take it).
    pub block_size: Option<u32>,
    /// `recalculate`: recompute every tag from the data on open (from sector 0 unless a
    /// recalculation is already under way).
    pub recalculate: bool,
    /// Bytes of tag units kept in memory (the kernel's dm-bufio cache of metadata
    /// buffers; default 4 MiB whatever the device's size, 0: none). Never dirty: every tag
    /// write still reaches the device as it is made.
    pub tag_cache_bytes: usize,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let key = |k: Option<&Zeroizing<Vec<u8>>>| k.map(|k| format!("<{} bytes>", k.len()));
        f.debug_struct("Options")
            .field("mode", &self.mode)
            .field("hash", &self.hash)
            .field("external_tags", &self.external_tags)
            .field("hash_key", &key(self.hash_key.as_ref()))
            .field(
                "journal_mac",
                &self.journal_mac.as_ref().map(|(a, k)| (a, key(k.as_ref()))),
            )
            .field(
                "journal_crypt",
                &self.journal_crypt.as_ref().map(|(c, k)| (c, key(Some(k)))),
            )
            .field("buffer_sectors", &self.buffer_sectors)
            .field("journal_watermark", &self.journal_watermark)
            .field("sectors_per_bit", &self.sectors_per_bit)
            .field("read_only", &self.read_only)
            .field("legacy_recalculate", &self.legacy_recalculate)
            .field("tag_size", &self.tag_size)
            .field("block_size", &self.block_size)
            .field("recalculate", &self.recalculate)
            .field("tag_cache_bytes", &self.tag_cache_bytes)
            .finish()
    }
}

impl Options {
    /// Journal mode with external tags (a dm-integrity device under dm-crypt) of
    /// `tag_size` bytes, and the kernel's defaults.
    pub fn external(tag_size: u32) -> Options {
        let mut o = Options::new(Algorithm::Crc32c);
        o.external_tags = true;
        o.tag_size = Some(tag_size);
        o
    }

    /// Journal mode with `hash` and the kernel's defaults.
    pub fn new(hash: Algorithm) -> Options {
        Options {
            mode: Mode::Journal,
            hash,
            external_tags: false,
            hash_key: None,
            journal_mac: None,
            journal_crypt: None,
            buffer_sectors: DEFAULT_BUFFER_SECTORS,
            journal_watermark: DEFAULT_JOURNAL_WATERMARK,
            sectors_per_bit: 0,
            read_only: false,
            legacy_recalculate: false,
            tag_size: None,
            block_size: None,
            recalculate: false,
            tag_cache_bytes: DEFAULT_TAG_CACHE_BYTES,
        }
    }
}

/// Why a device cannot be opened or formatted.
#[derive(Debug, thiserror::Error)]
pub enum IntegrityError {
    /// The superblock or journal.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// The backing device.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The options do not fit the device, or the kernel would refuse the device.
    #[error("{0}")]
    Refused(String),
}

/// A dm-integrity device over a backend. See the [crate docs](crate) and the [module
/// docs](self) on locking.
pub struct IntegrityBackend {
    core: Arc<Core>,
}

/// The device itself, shared with its background write-back ([`Core::kick`]).
struct Core {
    /// The device with the superblock, the journal and the tags (and the data, without a
    /// separate data device).
    inner: Arc<dyn Backend>,
    /// The device with the data: `inner` itself, or the data device of a separate metadata
    /// device (`meta_device:`).
    data: Arc<dyn Backend>,
    info: BackendInfo,
    geo: Geometry,
    mode: Mode,
    read_only: bool,
    hash: Hasher,
    /// Tags are given by the layer above (no `internal_hash`).
    external: bool,
    /// The superblock's salt when tags and MACs cover it (fix_hmac).
    salt: Option<[u8; SALT_SIZE]>,
    jmac: Option<Hasher>,
    /// `journal_crypt`, keyed for this journal's shape.
    jcrypt: Option<JournalCrypt>,
    /// Aligned I/O unit of the backend (at least a sector).
    align: u64,
    /// Tags beyond this sector are not checked (recalculating, read-only).
    unchecked_from: u64,
    state: RwLock<State>,
    /// Modes D and B: the logical sectors of the requests under way (writes alone, reads
    /// shared), taken under the state lock shared (see the module docs).
    ranges: RangeLock,
    /// Modes D and B: the aligned tag units (byte offsets on `inner`) a write is reading,
    /// changing and writing back, alone (see the module docs).
    tag_units: RangeLock,
    /// The tag units last read or written (see the module docs and [`UnitCache`]).
    tag_cache: UnitCache,
    /// Bitmap mode: the on-disk bitmap (in the journal area), one bit per region; its own
    /// lock, held while a changed bitmap is written.
    bitmap: Mutex<Option<Vec<u8>>>,
    /// Held by the one journal write-back under way (see the module docs); taken before
    /// the commit mutex and the state lock, never while holding them.
    writeback: Mutex<()>,
    /// Held by the one journal commit under way, from stamping its sections to marking
    /// them committed; taken before the state lock, never while holding it.
    commit_lock: Mutex<()>,
    /// The background write-back's thread and what it is asked ([`Core::kick`]).
    writer: Mutex<Writer>,
    writer_cv: Condvar,
    /// This device, for the background write-back's thread (set once it is in its `Arc`).
    me: Weak<Core>,
    mismatches: AtomicU64,
}

/// Committed journal sections being copied to their places (the kernel's
/// `integrity_writer`): sections `[start, start + n)` (wrapping), and the entries to copy.
struct WriteBack {
    start: u32,
    n: u32,
    /// `(logical sector, entry)` of each block whose newest entry is in these sections,
    /// sorted by sector.
    list: Vec<(u64, u64)>,
}

/// Journal blocks to copy to their places, in runs contiguous on the data device (their
/// tags contiguous in one tag area) and in one journal section: each run is written
/// straight from the section's memory, as the kernel's `do_journal_write` does (the
/// sections are page-aligned for `O_DIRECT`; see [`Section`]), no copy in between.
struct Run {
    sector: u64,
    /// The section holding the run (shared: the write-back writes it without the state
    /// lock; nothing changes a committed section until its write-back has finished).
    sec: Arc<Section>,
    /// The run's bytes in `sec`.
    at: usize,
    len: usize,
    tags: Vec<u8>,
}

/// Where journal sections start in memory: a page, so that a commit's writes of them and a
/// write-back's writes from them go to an `O_DIRECT` device as they are (a misaligned
/// buffer is copied through a bounce buffer first).
const SECTION_ALIGN: usize = 4096;

/// One journal section's bytes, page-aligned ([`SECTION_ALIGN`]).
struct Section(AlignedBuf);

impl Section {
    fn zeroed(len: usize) -> Section {
        Section(
            AlignedBuf::zeroed(len, SECTION_ALIGN)
                .expect("a page-aligned buffer of a journal section's size"),
        )
    }
}

/// A copy, made only if a section were changed while a commit's write still held it, which
/// no caller does (see `Journal::secs`).
impl Clone for Section {
    fn clone(&self) -> Section {
        let mut s = Section::zeroed(self.0.len());
        s.0.copy_from_slice(&self.0);
        s
    }
}

impl std::ops::Deref for Section {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl std::ops::DerefMut for Section {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

impl std::fmt::Debug for IntegrityBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.core;
        f.debug_struct("IntegrityBackend")
            .field("mode", &c.mode)
            .field("geo", &c.geo)
            .finish_non_exhaustive()
    }
}

/// The background write-back thread (the kernel's commit and writer workqueues): started
/// by the first write to reach the journal's watermark, stopped when the device is dropped.
#[derive(Default)]
struct Writer {
    thread: Option<JoinHandle<()>>,
    /// A write-back is asked for (a writer reached the watermark since the thread last
    /// started one).
    pending: bool,
    stop: bool,
}

struct State {
    sb: Superblock,
    journal: Journal,
    log2_blocks_per_bit: u8,
    closed: bool,
    /// A failure that leaves the journal or tags in doubt fails every later request, as
    /// the kernel's `ic->failed` does.
    failed: Option<String>,
}

/// The journal as the kernel keeps it in memory: every section's bytes, where commits and
/// free entries stand, and the newest entry of each block.
struct Journal {
    shape: JournalShape,
    /// Each section's bytes. A section being written by a commit is shared with that
    /// write (see [`Core::commit`]); no one changes a section between its commit and its
    /// write-back, so the others are never shared when they are changed.
    secs: Vec<Arc<Section>>,
    commit_seq: u8,
    /// The commit ids (the kernel's, or encrypted by a stream `journal_crypt`).
    ids: CommitIds,
    committed_section: u32,
    n_committed: u32,
    /// Sections closed and stamped whose journal write is under way (after the committed
    /// ones, before `uncommitted_section`).
    n_committing: u32,
    uncommitted_section: u32,
    n_uncommitted: u32,
    free_section: u32,
    free_entry: u32,
    free_entries: u64,
    threshold: u64,
    /// Logical sector of a block -> its newest entry (section × section_entries + n).
    newest: HashMap<u64, u64>,
    wrote: bool,
}

impl Journal {
    fn section_bytes(&self) -> usize {
        self.shape.section_sectors as usize * 512
    }

    /// Fresh sections of `shape`, zeroed.
    fn zeroed_sections(shape: &JournalShape) -> Vec<Arc<Section>> {
        let bytes = shape.section_sectors as usize * 512;
        (0..shape.sections)
            .map(|_| Arc::new(Section::zeroed(bytes)))
            .collect()
    }

    fn section(&self, i: u32) -> &[u8] {
        &self.secs[i as usize]
    }

    /// Section `i` to change (a copy of it if a commit's write still holds it, which no
    /// caller does: see `secs`).
    fn section_mut(&mut self, i: u32) -> &mut [u8] {
        &mut Arc::make_mut(&mut self.secs[i as usize])[..]
    }

    fn entry(&self, global: u64) -> &[u8] {
        let (i, n) = self.split(global);
        let at = self.shape.entry_offset(n);
        &self.section(i)[at..at + self.shape.entry_size as usize]
    }

    fn entry_mut(&mut self, global: u64) -> &mut [u8] {
        let (i, n) = self.split(global);
        let at = self.shape.entry_offset(n);
        let len = self.shape.entry_size as usize;
        &mut self.section_mut(i)[at..at + len]
    }

    fn split(&self, global: u64) -> (u32, u32) {
        let se = u64::from(self.shape.section_entries);
        ((global / se) as u32, (global % se) as u32)
    }

    /// The block of entry `global` as written (each sector's last 8 bytes, which the
    /// journal sector gives to its commit id, put back from the entry).
    fn block_into(&self, global: u64, out: &mut [u8]) {
        let (i, n) = self.split(global);
        let sec = self.section(i);
        let entry = self.entry(global);
        for s in 0..self.shape.sectors_per_block {
            let at = self.shape.data_sector(n, s) as usize * 512;
            let o = &mut out[s as usize * 512..(s as usize + 1) * 512];
            o[..504].copy_from_slice(&sec[at..at + 504]);
            let lb = 8 + 8 * s as usize;
            o[504..].copy_from_slice(&entry[lb..lb + 8]);
        }
    }

    /// `restore_last_bytes`: entry `global`'s block made whole in its section again (each
    /// sector's last 8 bytes, lent to its commit id, copied back from the entry), so that
    /// the block can be written from there.
    fn restore_last_bytes(&mut self, global: u64) {
        let (i, n) = self.split(global);
        let entry = self.shape.entry_offset(n);
        let data = self.shape.data_sector(n, 0) as usize * 512;
        let spb = self.shape.sectors_per_block as usize;
        let sec = self.section_mut(i);
        for s in 0..spb {
            let from = entry + 8 + 8 * s;
            sec.copy_within(from..from + 8, data + s * 512 + 504);
        }
    }

    fn mark_all_unused(&mut self) {
        for i in 0..self.shape.sections {
            for n in 0..self.shape.section_entries {
                let g = u64::from(i) * u64::from(self.shape.section_entries) + u64::from(n);
                set_entry_unused(self.entry_mut(g));
            }
        }
    }

    /// Where commits and free entries stand after a replay that continues at `section`.
    fn restart(&mut self, section: u32, seq: u8) {
        self.commit_seq = seq;
        self.committed_section = section;
        self.n_committed = 0;
        self.n_committing = 0;
        self.uncommitted_section = section;
        self.n_uncommitted = 0;
        self.free_section = section;
        self.free_entry = 0;
        self.free_entries = self.shape.entries;
        self.newest.clear();
    }
}

impl State {
    /// Whether requests may use the device: not once it is closed or has failed.
    fn usable(&self) -> Result<(), BackendError> {
        if self.closed {
            return Err(BackendError::Other(
                "the dm-integrity device is closed".into(),
            ));
        }
        match &self.failed {
            Some(f) => Err(failed_err(f)),
            None => Ok(()),
        }
    }
}

fn refused(msg: impl Into<String>) -> IntegrityError {
    IntegrityError::Refused(msg.into())
}

fn failed_err(msg: &str) -> BackendError {
    BackendError::Other(format!("the dm-integrity device has failed: {msg}"))
}

impl Core {
    fn open_on(
        inner: Arc<dyn Backend>,
        data_dev: Option<Arc<dyn Backend>>,
        opts: Options,
    ) -> Result<Core, IntegrityError> {
        let dev_bytes = inner.info().size_bytes;
        let data = data_dev.clone().unwrap_or_else(|| Arc::clone(&inner));
        let align = u64::from(
            inner
                .info()
                .logical_block
                .max(data.info().logical_block)
                .max(512),
        );
        let read_only = opts.read_only
            || opts.mode == Mode::Recovery
            || inner.info().caps.read_only
            || data.info().caps.read_only;
        let mut first = vec![0u8; align.max(512) as usize];
        if dev_bytes < first.len() as u64 {
            return Err(refused(format!(
                "the device ({dev_bytes} bytes) is too small for a dm-integrity superblock"
            )));
        }
        inner.read_at(&mut first, 0)?;
        let mut sb = Superblock::parse(&first)?;
        if let Some(t) = opts.tag_size {
            if t != u32::from(sb.tag_size) {
                return Err(refused(format!(
                    "tag size {t} does not match the superblock's ({})",
                    sb.tag_size
                )));
            }
        }
        if let Some(b) = opts.block_size {
            if b != sb.block_bytes() {
                return Err(refused(format!(
                    "block size {b} does not match the superblock's ({})",
                    sb.block_bytes()
                )));
            }
        }
        if opts.recalculate && !sb.flags.has(Flags::RECALCULATING) {
            sb.flags.0 |= Flags::RECALCULATING;
            sb.recalc_sector = 0;
        }
        if opts.external_tags {
            if opts.tag_size.is_none() {
                return Err(refused("external tags need the table's tag size"));
            }
            if opts.mode == Mode::Bitmap {
                return Err(refused(
                    "bitmap mode without internal_hash is not supported (its dirty regions \
                     would need tags only the layer above can make)",
                ));
            }
            if opts.recalculate
                || (sb.flags.has(Flags::RECALCULATING)
                    && sb.recalc_sector < sb.provided_data_sectors)
            {
                return Err(refused(
                    "recalculate can only be used with internal_hash (the kernel's rule)",
                ));
            }
        }
        let hash = Hasher::new(opts.hash, opts.hash_key.as_ref().map(|k| k.as_slice()))
            .map_err(|e| refused(format!("internal hash: {e}")))?;
        let jmac = match &opts.journal_mac {
            Some((alg, key)) => Some(
                Hasher::new(*alg, key.as_ref().map(|k| k.as_slice()))
                    .map_err(|e| refused(format!("journal mac: {e}")))?,
            ),
            None => None,
        };
        if sb.flags.has(Flags::HAVE_JOURNAL_MAC) != jmac.is_some() {
            return Err(refused(if jmac.is_some() {
                "journal mac mismatch: the superblock says the journal has no MAC"
            } else {
                "journal mac mismatch: the superblock says the journal has a MAC \
                 (--journal-integrity and its key are needed)"
            }));
        }
        let salt = sb.flags.has(Flags::FIXED_HMAC).then_some(sb.salt);
        if let (Some(m), Some(_), false) = (&jmac, salt, opts.mode == Mode::Recovery) {
            verify_sb_mac(m, &first[..512])?;
        }
        let dev_sectors = dev_bytes / 512;
        let mut grown_from = None;
        let old_provided = sb.provided_data_sectors;
        let geo = match &data_dev {
            None => {
                let geo = Geometry::new(&sb, dev_sectors, opts.buffer_sectors)?;
                let room = max_provided_data_sectors(&sb, dev_sectors);
                if room < sb.provided_data_sectors {
                    return Err(refused(format!(
                        "the device provides {room} data sectors, the superblock says {}",
                        sb.provided_data_sectors
                    )));
                }
                geo
            }
            Some(d) => {
                let geo = Geometry::new_separate(
                    &sb,
                    dev_sectors,
                    d.info().size_bytes / 512,
                    opts.buffer_sectors,
                )?;
                if geo.provided_data_sectors < sb.provided_data_sectors {
                    // integritysetup maps the superblock's size, more than the kernel then
                    // provides: it refuses the table ("Not enough provided sectors").
                    return Err(refused(format!(
                        "the data device is too small: it holds {} sectors, the superblock \
                         says {} (a data device smaller than the one formatted)",
                        geo.provided_data_sectors, sb.provided_data_sectors
                    )));
                }
                if geo.provided_data_sectors > sb.provided_data_sectors {
                    grown_from = Some(sb.provided_data_sectors);
                    sb.provided_data_sectors = geo.provided_data_sectors;
                }
                geo
            }
        };
        let resized = geo.provided_data_sectors != old_provided;
        let shape = geo.journal;
        let jcrypt = journal_crypt(&opts, &shape)?;
        let threshold =
            (shape.entries * u64::from(100 - opts.journal_watermark.min(100)) + 50) / 100;
        let journal = Journal {
            shape,
            secs: Journal::zeroed_sections(&shape),
            commit_seq: 0,
            ids: jcrypt.as_ref().map_or(COMMIT_IDS, JournalCrypt::commit_ids),
            committed_section: 0,
            n_committed: 0,
            n_committing: 0,
            uncommitted_section: 0,
            n_uncommitted: 0,
            free_section: 0,
            free_entry: 0,
            free_entries: shape.entries,
            threshold,
            newest: HashMap::new(),
            wrote: false,
        };
        let block = geo.block_bytes();
        let log2_blocks_per_bit = log2_blocks_per_bitmap_bit(&sb, opts.sectors_per_bit);
        let info = BackendInfo {
            size_bytes: sb.provided_data_sectors * 512,
            logical_block: block as u32,
            physical_block: block as u32,
            optimal_block: (block as u32).max(4096),
            caps: Caps {
                flush: Support::Native,
                discard: Support::None,
                write_zeroes: Support::None,
                read_only,
            },
        };
        let recalculating = sb.flags.has(Flags::RECALCULATING);
        if recalculating
            && sb.recalc_sector < sb.provided_data_sectors
            && !read_only
            && !opts.legacy_recalculate
            && recalc_disabled(&sb, opts.hash_key.is_some(), jmac_keyed(&opts))
        {
            return Err(refused(
                "recalculating with HMAC is disabled for security reasons (the kernel's \
                 rule; legacy_recalculate overrides it)",
            ));
        }
        let dev = Core {
            inner,
            data,
            info,
            geo,
            mode: opts.mode,
            read_only,
            hash,
            external: opts.external_tags,
            salt,
            jmac,
            jcrypt,
            align,
            unchecked_from: u64::MAX,
            state: RwLock::new(State {
                sb,
                journal,
                log2_blocks_per_bit,
                closed: false,
                failed: None,
            }),
            ranges: RangeLock::default(),
            tag_units: RangeLock::default(),
            tag_cache: UnitCache::new(align, opts.tag_cache_bytes),
            bitmap: Mutex::new(None),
            writeback: Mutex::new(()),
            commit_lock: Mutex::new(()),
            writer: Mutex::new(Writer::default()),
            writer_cv: Condvar::new(),
            me: Weak::new(),
            mismatches: AtomicU64::new(0),
        };
        dev.activate(resized, grown_from)
    }

    /// The kernel's `dm_integrity_resume` for a freshly constructed target; `resized` when
    /// the data device's size is not the superblock's (`grown_from`: the old size, when it
    /// grew).
    fn activate(mut self, resized: bool, grown_from: Option<u64>) -> Result<Core, IntegrityError> {
        if self.mode == Mode::Recovery {
            self.unchecked_from = 0;
            return Ok(self);
        }
        let mut unchecked = u64::MAX;
        let mut guard = self.state.write().map_err(|_| refused("poisoned lock"))?;
        let st = &mut *guard;
        if resized && !self.read_only {
            // The kernel writes the new size before anything else; in bitmap mode it marks
            // the blocks gained dirty (their tags are recalculated), in the other modes they
            // read as mismatches until written.
            self.write_sb(st)?;
            if let (Some(old), Mode::Bitmap) = (grown_from, self.mode) {
                let new = st.sb.provided_data_sectors;
                self.recalc_range(old, new)?;
                self.flush_devices()?;
            }
        }
        let sb_flags = st.sb.flags;
        if sb_flags.has(Flags::DIRTY_BITMAP) {
            let bitmap = self.read_bitmap(st)?;
            let same_bits = st.sb.log2_blocks_per_bitmap_bit == st.log2_blocks_per_bit;
            let all_clear = bitmap.iter().all(|&b| b == 0);
            if self.mode == Mode::Bitmap {
                // Recalculate the regions the bitmap marks (all of them if the bit size
                // changed); the kernel does it in the background, ucrypt before serving.
                let regions = if same_bits {
                    bitmap
                } else {
                    vec![0xff; bitmap.len()]
                };
                st.sb.log2_blocks_per_bitmap_bit = st.log2_blocks_per_bit;
                if !self.read_only {
                    self.recalc_regions(st, &regions, same_bits)?;
                } else if !all_clear || !same_bits {
                    unchecked = 0;
                }
            } else {
                if !(same_bits && all_clear) {
                    st.sb.flags.0 |= Flags::RECALCULATING;
                    st.sb.recalc_sector = 0;
                }
                if !self.read_only {
                    let sections = st.journal.shape.sections;
                    self.init_journal(st, 0, sections, 0)?;
                    self.replay(st)?;
                    st.sb.flags.0 &= !Flags::DIRTY_BITMAP;
                } else {
                    unchecked = 0;
                }
            }
            if !self.read_only {
                self.write_sb(st)?;
            }
        } else {
            self.replay(st)?;
            if self.mode == Mode::Bitmap && !self.read_only {
                st.sb.flags.0 |= Flags::DIRTY_BITMAP;
                st.sb.log2_blocks_per_bitmap_bit = st.log2_blocks_per_bit;
                self.write_sb(st)?;
                let blocks = self.geo.bitmap_blocks(st.log2_blocks_per_bit);
                self.install_bitmap(vec![0u8; (blocks * BITMAP_BLOCK_SIZE) as usize])?;
            }
        }
        if st.sb.flags.has(Flags::RECALCULATING) {
            let from = st.sb.recalc_sector;
            if from < st.sb.provided_data_sectors {
                if self.read_only {
                    unchecked = unchecked.min(from);
                } else {
                    self.recalculate(st, from)?;
                }
            } else if from > st.sb.provided_data_sectors && !self.read_only {
                st.sb.recalc_sector = st.sb.provided_data_sectors;
                self.write_sb(st)?;
            }
        }
        if self.mode == Mode::Bitmap && self.lock_bitmap()?.is_none() && !self.read_only {
            let blocks = self.geo.bitmap_blocks(st.log2_blocks_per_bit);
            st.sb.flags.0 |= Flags::DIRTY_BITMAP;
            self.write_sb(st)?;
            self.install_bitmap(vec![0u8; (blocks * BITMAP_BLOCK_SIZE) as usize])?;
        }
        drop(guard);
        self.unchecked_from = unchecked;
        Ok(self)
    }

    /// The superblock as it stands.
    pub fn superblock(&self) -> Superblock {
        self.state
            .read()
            .map(|s| s.sb.clone())
            .unwrap_or_else(|p| p.into_inner().sb.clone())
    }

    /// Blocks whose tag did not match since open (the kernel's status counter).
    pub fn mismatches(&self) -> u64 {
        self.mismatches.load(Ordering::Relaxed)
    }

    /// Leaves the device as the kernel's suspend does: the journal committed, copied to
    /// its places and reset (mode J); the bitmap cleared and the journal area reset (B);
    /// everything flushed. Later requests fail.
    ///
    /// # Errors
    /// I/O errors.
    pub fn close(&self) -> Result<(), BackendError> {
        let _writeback = self
            .writeback
            .lock()
            .map_err(|_| BackendError::Other("dm-integrity write-back lock poisoned".into()))?;
        let _commit = self
            .commit_lock
            .lock()
            .map_err(|_| BackendError::Other("dm-integrity commit lock poisoned".into()))?;
        let mut st = self
            .state
            .write()
            .map_err(|_| BackendError::Other("dm-integrity state lock poisoned".into()))?;
        if st.closed || st.failed.is_some() {
            return Ok(());
        }
        st.closed = true;
        if self.read_only {
            return Ok(());
        }
        match self.mode {
            Mode::Journal => {
                self.commit_locked(&mut st)?;
                self.write_back(&mut st)?;
                self.flush_devices()?;
                if st.journal.wrote {
                    let (free, seq, sections) = (
                        st.journal.free_section,
                        st.journal.commit_seq,
                        st.journal.shape.sections,
                    );
                    self.init_journal(&mut st, free, sections - free, seq)?;
                    if free > 0 {
                        self.init_journal(&mut st, 0, free, next_commit_seq(seq))?;
                    }
                }
            }
            Mode::Bitmap => {
                self.flush_devices()?;
                let sections = st.journal.shape.sections;
                self.init_journal(&mut st, 0, sections, 0)?;
                st.sb.flags.0 &= !Flags::DIRTY_BITMAP;
                self.write_sb(&mut st)?;
            }
            Mode::Direct | Mode::Recovery => self.flush_devices()?,
        }
        Ok(())
    }

    fn lock_write(&self) -> Result<RwLockWriteGuard<'_, State>, BackendError> {
        let st = self
            .state
            .write()
            .map_err(|_| BackendError::Other("dm-integrity state lock poisoned".into()))?;
        st.usable()?;
        Ok(st)
    }

    /// The state lock shared, for a request (reads; writes in modes D and B), failing
    /// once the device is closed or has failed.
    fn lock_read(&self) -> Result<RwLockReadGuard<'_, State>, BackendError> {
        let st = self
            .state
            .read()
            .map_err(|_| BackendError::Other("dm-integrity state lock poisoned".into()))?;
        st.usable()?;
        Ok(st)
    }

    /// The tag of a block at logical `sector`.
    fn tag(&self, sector: u64, data: &[u8], out: &mut [u8]) {
        let s = sector.to_le_bytes();
        match &self.salt {
            Some(salt) => self.hash.digest_into(&[salt, &s, data], out),
            None => self.hash.digest_into(&[&s, data], out),
        }
    }

    /// Flushes the data device, then the metadata device (one device without a separate
    /// data device).
    fn flush_devices(&self) -> Result<(), BackendError> {
        if !Arc::ptr_eq(&self.inner, &self.data) {
            self.data.flush()?;
        }
        self.inner.flush()
    }

    fn spb(&self) -> u64 {
        1 << self.geo.log2_sectors_per_block
    }

    fn write_sb(&self, st: &mut State) -> Result<(), BackendError> {
        st.sb.version = st.sb.version_for(self.mode == Mode::Bitmap);
        let mut sector = st.sb.to_sector();
        if let (Some(m), Some(_)) = (&self.jmac, self.salt) {
            let n = m.algorithm().digest_size();
            let (body, mac) = sector.split_at_mut(512 - n);
            m.digest_into(&[body], mac);
        }
        let mut area = vec![0u8; (SB_SECTORS * 512) as usize];
        self.inner.read_at(&mut area, 0)?;
        area[..512].copy_from_slice(&sector);
        self.inner.write_at(&area, 0, true)
    }

    /// The section MAC of journal section `i` (`section_mac`): over the salt and the
    /// section number (fix_hmac) and every entry's sector field.
    fn section_mac(&self, j: &Journal, i: u32) -> [u8; JOURNAL_MAC_SIZE] {
        let mut out = [0u8; JOURNAL_MAC_SIZE];
        let Some(m) = &self.jmac else { return out };
        let se = u64::from(j.shape.section_entries);
        let mut parts: Vec<&[u8]> = Vec::with_capacity(j.shape.section_entries as usize + 2);
        let section_le = u64::from(i).to_le_bytes();
        if let Some(salt) = &self.salt {
            parts.push(salt);
            parts.push(&section_le);
        }
        for n in 0..se {
            parts.push(&j.entry(u64::from(i) * se + n)[..8]);
        }
        m.digest_into(&parts, &mut out);
        out
    }

    fn set_section_mac(&self, j: &mut Journal, i: u32) {
        if self.jmac.is_none() {
            return;
        }
        let mac = self.section_mac(j, i);
        let sec = j.section_mut(i);
        for s in 0..JOURNAL_BLOCK_SECTORS as usize {
            let at = s * 512 + 496;
            let m = JOURNAL_MAC_PER_SECTOR as usize;
            sec[at..at + m].copy_from_slice(&mac[s * m..(s + 1) * m]);
        }
    }

    fn check_section_mac(&self, j: &Journal, i: u32) -> Result<(), IntegrityError> {
        if self.jmac.is_none() {
            return Ok(());
        }
        let mac = self.section_mac(j, i);
        let sec = j.section(i);
        for s in 0..JOURNAL_BLOCK_SECTORS as usize {
            let at = s * 512 + 496;
            let m = JOURNAL_MAC_PER_SECTOR as usize;
            if sec[at..at + m] != mac[s * m..(s + 1) * m] {
                return Err(refused(format!(
                    "journal section {i}: its MAC does not match (the kernel fails the device)"
                )));
            }
        }
        Ok(())
    }

    /// Writes sections `[start, start + n)` (wrapping) of the in-memory journal, FUA.
    fn write_sections(&self, j: &Journal, start: u32, n: u32) -> Result<(), BackendError> {
        let sections = j.shape.sections;
        let list: Vec<(u32, Arc<Section>)> = (0..n)
            .map(|k| {
                let i = (start + k) % sections;
                (i, Arc::clone(&j.secs[i as usize]))
            })
            .collect();
        self.write_section_list(&list)
    }

    /// Writes each `(section number, its bytes)` in its place, together (one batch;
    /// encrypted first with `journal_crypt`), durable when it returns: one section FUA,
    /// several written then flushed once. The order among them does not matter: each
    /// sector's commit id tells a replay which ones arrived.
    fn write_section_list(&self, list: &[(u32, Arc<Section>)]) -> Result<(), BackendError> {
        let crypted: Vec<Zeroizing<Vec<u8>>> = match &self.jcrypt {
            None => Vec::new(),
            Some(c) => list
                .iter()
                .map(|(i, bytes)| {
                    let mut io = Zeroizing::new(bytes.to_vec());
                    c.encrypt_section(*i, &mut io);
                    io
                })
                .collect(),
        };
        let ops: Vec<WriteOp<'_>> = list
            .iter()
            .enumerate()
            .map(|(k, (i, bytes))| WriteOp {
                offset: self.geo.journal_byte(*i, 0),
                buf: crypted.get(k).map_or(&bytes[..], |c| &c[..]),
                fua: list.len() == 1,
            })
            .collect();
        self.inner.submit_writes(&ops)?;
        if list.len() > 1 {
            self.inner.flush()?;
        }
        Ok(())
    }

    /// `init_journal`: sections emptied, stamped with `seq`'s commit ids, written.
    fn init_journal(
        &self,
        st: &mut State,
        start: u32,
        n: u32,
        seq: u8,
    ) -> Result<(), BackendError> {
        if n == 0 {
            return Ok(());
        }
        let j = &mut st.journal;
        let sections = j.shape.sections;
        let (ids, shape) = (j.ids, j.shape);
        for k in 0..n {
            let i = (start + k) % sections;
            let sec = j.section_mut(i);
            for s in 0..shape.section_sectors {
                let at = s as usize * 512;
                sec[at..at + 504].fill(0);
                sec[at + 504..at + 512]
                    .copy_from_slice(&commit_id_in(&ids, i, s, seq).to_le_bytes());
            }
            for e in 0..shape.section_entries {
                set_entry_unused(&mut sec[shape.entry_offset(e)..]);
            }
        }
        let j = &mut st.journal;
        for k in 0..n {
            self.set_section_mac(j, (start + k) % sections);
        }
        self.write_sections(&st.journal, start, n)
    }

    /// `replay_journal`: reads the journal, decides as the kernel does, copies what it
    /// holds to its places (or, read-only, serves it from memory), and continues or clears
    /// the journal.
    fn replay(&self, st: &mut State) -> Result<(), IntegrityError> {
        let sb = st.journal.section_bytes();
        let mut buf = vec![0u8; st.journal.secs.len() * sb];
        self.inner.read_at(&mut buf, self.geo.journal_byte(0, 0))?;
        if let Some(c) = &self.jcrypt {
            for (i, section) in buf.chunks_exact_mut(sb).enumerate() {
                c.decrypt_section(i as u32, section);
            }
        }
        let plan = ReplayPlan::decide_with(
            &st.journal.shape,
            &buf,
            self.mode == Mode::Journal,
            &st.journal.ids,
        )?;
        st.journal.secs = buf
            .chunks_exact(sb)
            .map(|bytes| {
                let mut section = Section::zeroed(sb);
                section.copy_from_slice(bytes);
                Arc::new(section)
            })
            .collect();
        drop(buf);
        let se = u64::from(st.journal.shape.section_entries);
        let sections = st.journal.shape.sections;
        let mut newest: HashMap<u64, u64> = HashMap::new();
        if let Some((start, n)) = plan.replay {
            for k in 0..n {
                let i = (start + k) % sections;
                self.check_section_mac(&st.journal, i)?;
                for e in 0..se {
                    let g = u64::from(i) * se + e;
                    match entry_state(st.journal.entry(g)) {
                        EntryState::Unused | EntryState::InProgress => {}
                        EntryState::Sector(s) => {
                            if s % self.spb() != 0 {
                                return Err(refused(format!(
                                    "invalid sector {s} in the journal (the kernel fails the \
                                     device)"
                                )));
                            }
                            if s < self.geo.provided_data_sectors {
                                newest.insert(s, g);
                            }
                        }
                    }
                }
            }
        }
        // Every replayed block must match its tag, or the kernel fails the device.
        let mut block = vec![0u8; self.geo.block_bytes() as usize];
        let ts = self.geo.tag_size as usize;
        let mut tag = vec![0u8; ts];
        for (&s, &g) in newest.iter().filter(|_| !self.external) {
            st.journal.block_into(g, &mut block);
            self.tag(s, &block, &mut tag);
            let off = st.journal.shape.tag_offset();
            if st.journal.entry(g)[off..off + ts] != tag[..] {
                return Err(refused(format!(
                    "the journal's block for sector {s} does not match its tag (the kernel \
                     fails the device: \"tag mismatch when replaying journal\")"
                )));
            }
        }
        if self.read_only {
            // Served from memory: nothing is written, the journal is not reset.
            st.journal.newest = newest;
            st.journal.free_entries = 0;
            return Ok(());
        }
        if !newest.is_empty() {
            let list: Vec<(u64, u64)> = newest.into_iter().collect();
            self.copy_out(&mut st.journal, list)?;
            self.flush_devices()?;
        }
        match plan.then {
            AfterReplay::Continue { section, seq } => {
                st.journal.mark_all_unused();
                st.journal.restart(section, seq);
            }
            AfterReplay::Clear { from, erase_seq } => {
                self.init_journal(st, from, sections, erase_seq)?;
                st.journal.restart(0, next_commit_seq(erase_seq));
            }
        }
        Ok(())
    }

    /// Copies journal entries `(sector, entry)` to their places: data in runs, tags staged.
    fn copy_out(&self, j: &mut Journal, mut list: Vec<(u64, u64)>) -> Result<(), BackendError> {
        list.sort_unstable();
        let runs = self.runs(j, &list);
        self.write_runs(runs)
    }

    /// The blocks of `list` (sorted by sector) made ready to be written from the journal:
    /// first each block's sectors get back, in the section, the last 8 bytes their journal
    /// sectors lent to commit ids (the kernel's `restore_last_bytes`; the entries keep them
    /// too, so readers copying blocks out meanwhile see the same bytes), then blocks next to
    /// each other both on the data device (one area) and in one section form a run.
    fn runs(&self, j: &mut Journal, list: &[(u64, u64)]) -> Vec<Run> {
        // Two passes: a section is changed (restored) before any run shares it, so
        // `section_mut` never has to copy one.
        for &(_, g) in list {
            j.restore_last_bytes(g);
        }
        let ts = self.geo.tag_size as usize;
        let bb = self.geo.block_bytes() as usize;
        let toff = j.shape.tag_offset();
        let spb = self.spb();
        let mut runs: Vec<Run> = Vec::new();
        let mut prev: Option<(u64, u64)> = None;
        for &(s, g) in list {
            let (i, n) = j.split(g);
            let contiguous = prev.is_some_and(|(ps, pg)| {
                s == ps + spb
                    && g == pg + 1
                    && j.split(pg).0 == i
                    && self.geo.area_offset(ps).0 == self.geo.area_offset(s).0
            });
            if !contiguous {
                runs.push(Run {
                    sector: s,
                    sec: Arc::clone(&j.secs[i as usize]),
                    at: j.shape.data_sector(n, 0) as usize * 512,
                    len: 0,
                    tags: Vec::new(),
                });
            }
            if let Some(r) = runs.last_mut() {
                r.len += bb;
                r.tags.extend_from_slice(&j.entry(g)[toff..toff + ts]);
            }
            prev = Some((s, g));
        }
        runs
    }

    /// Writes runs of journal blocks to their places: the data (one batch, straight from
    /// the journal's sections), then the tags (each run's tags in one piece; only tag units
    /// partly covered and not in the cache are read first), holding the tag units from the
    /// first run's to the last run's alone meanwhile (one range: a holder never waits for a
    /// second one; reads that miss in between wait for this tag write, not the data's).
    fn write_runs(&self, runs: Vec<Run>) -> Result<(), BackendError> {
        let ops: Vec<WriteOp<'_>> = runs
            .iter()
            .map(|r| WriteOp {
                offset: self.geo.data_sector(r.sector) * 512,
                buf: &r.sec[r.at..r.at + r.len],
                fua: false,
            })
            .collect();
        self.data.submit_writes(&ops)?;
        let span = runs.iter().fold(None, |acc: Option<(u64, u64)>, r| {
            let (first, end) = self.unit_span(self.geo.tag_byte(r.sector), r.tags.len());
            Some(acc.map_or((first, end), |(f, e)| (f.min(first), e.max(end))))
        });
        let Some((first, end)) = span else {
            return Ok(());
        };
        let _units = self.tag_units.lock(first, end, true)?;
        let mut tags = TagUpdate::new(&*self.inner, self.align, &self.tag_cache);
        for r in &runs {
            tags.put(self.geo.tag_byte(r.sector), &r.tags)?;
        }
        tags.write_back()
    }

    /// The aligned tag units holding `len` bytes at device byte `at`: `[first, end)`.
    fn unit_span(&self, at: u64, len: usize) -> (u64, u64) {
        let first = at - at % self.align;
        let end = (at + len as u64).div_ceil(self.align) * self.align;
        (first, end)
    }

    /// Reads `out.len()` tag bytes at device byte `at`: from the cache if it holds every
    /// unit they touch, else from the device, whose units then go into the cache. The
    /// units are held shared from that read to their insertion, so that no writer changes
    /// them in between (see [`UnitCache`]).
    fn read_tags(&self, at: u64, out: &mut [u8]) -> Result<(), BackendError> {
        if self.tag_cache.read(at, out) {
            return Ok(());
        }
        let (first, end) = self.unit_span(at, out.len());
        let _units = self.tag_units.lock(first, end, false)?;
        let mut buf = vec![0u8; (end - first) as usize];
        self.inner.read_at(&mut buf, first)?;
        self.tag_cache.insert(first, &buf);
        let from = (at - first) as usize;
        out.copy_from_slice(&buf[from..from + out.len()]);
        Ok(())
    }

    /// `integrity_commit`, first half (state lock held): pads the open section, stamps
    /// the uncommitted sections with the commit ids of the current sequence (the next one
    /// past the journal's end) and MACs them; they become the committing ones. Returns
    /// them with their bytes (shared, not copied), `None` if there were none.
    #[allow(clippy::type_complexity)]
    fn stamp(&self, st: &mut State) -> Option<Vec<(u32, Arc<Section>)>> {
        let j = &mut st.journal;
        let sections = j.shape.sections;
        if j.free_entry != 0 {
            j.free_entries -= u64::from(j.shape.section_entries - j.free_entry);
            j.free_entry = 0;
            j.free_section = (j.free_section + 1) % sections;
            j.n_uncommitted += 1;
        }
        let (start, n) = (j.uncommitted_section, j.n_uncommitted);
        if n == 0 {
            return None;
        }
        j.wrote = true;
        let (ids, section_sectors) = (j.ids, j.shape.section_sectors);
        let mut i = start;
        for _ in 0..n {
            let seq = j.commit_seq;
            let sec = j.section_mut(i);
            for s in 0..section_sectors {
                let at = s as usize * 512 + 504;
                sec[at..at + 8].copy_from_slice(&commit_id_in(&ids, i, s, seq).to_le_bytes());
            }
            i += 1;
            if i >= sections {
                j.commit_seq = next_commit_seq(j.commit_seq);
                i = 0;
            }
        }
        for k in 0..n {
            self.set_section_mac(j, (start + k) % sections);
        }
        j.uncommitted_section = (start + n) % sections;
        j.n_uncommitted = 0;
        j.n_committing = n;
        Some(
            (0..n)
                .map(|k| {
                    let i = (start + k) % sections;
                    (i, Arc::clone(&j.secs[i as usize]))
                })
                .collect(),
        )
    }

    /// `integrity_commit`, second half: once the stamped sections are on the device, they
    /// are committed (the write-back may copy them); on a failed write the device fails.
    fn committed(&self, st: &mut State, res: Result<(), BackendError>) -> Result<(), BackendError> {
        if let Err(e) = res {
            st.failed = Some(format!("writing the journal: {e}"));
            return Err(e);
        }
        let j = &mut st.journal;
        j.n_committed += j.n_committing;
        j.n_committing = 0;
        Ok(())
    }

    /// `integrity_commit` with the state lock (and the commit mutex) held throughout
    /// (close).
    fn commit_locked(&self, st: &mut State) -> Result<(), BackendError> {
        if self.mode != Mode::Journal {
            return Ok(());
        }
        let Some(list) = self.stamp(st) else {
            return Ok(());
        };
        let res = self.write_section_list(&list);
        drop(list);
        self.committed(st, res)
    }

    /// `integrity_commit`: every block in the journal so far on the device when it
    /// returns. One commit at a time (`commit_lock`); the state lock is held only to stamp
    /// the sections and to mark them committed, not while they are written: readers and
    /// writers go on meanwhile (writers into the sections after them, which a later commit
    /// covers). A caller that finds another commit under way waits for it, then commits
    /// what is left (its own blocks are in one or the other).
    fn commit(&self) -> Result<(), BackendError> {
        if self.mode != Mode::Journal {
            return Ok(());
        }
        let _commit = self
            .commit_lock
            .lock()
            .map_err(|_| BackendError::Other("dm-integrity commit lock poisoned".into()))?;
        let list = {
            let mut st = self.lock_write()?;
            match self.stamp(&mut st) {
                Some(list) => list,
                None => return Ok(()),
            }
        };
        let res = self.write_section_list(&list);
        drop(list);
        let mut st = self
            .state
            .write()
            .map_err(|_| BackendError::Other("dm-integrity state lock poisoned".into()))?;
        self.committed(&mut st, res)
    }

    /// The committed sections and their blocks whose newest entry is there (older entries
    /// of a block are superseded by a later one, copied later); `None` without committed
    /// sections.
    fn write_back_plan(&self, j: &Journal) -> Option<WriteBack> {
        let (start, n) = (j.committed_section, j.n_committed);
        if n == 0 {
            return None;
        }
        let sections = j.shape.sections;
        let se = u64::from(j.shape.section_entries);
        let mut list = Vec::new();
        for k in 0..n {
            let i = (start + k) % sections;
            for e in 0..se {
                let g = u64::from(i) * se + e;
                if let EntryState::Sector(s) = entry_state(j.entry(g)) {
                    if j.newest.get(&s) == Some(&g) {
                        list.push((s, g));
                    }
                }
            }
        }
        list.sort_unstable();
        Some(WriteBack { start, n, list })
    }

    /// Once a write-back's blocks are in their places and flushed: the blocks whose newest
    /// entry is still the one copied are read from their places again, and the sections
    /// are free.
    fn finish_write_back(&self, j: &mut Journal, wb: &WriteBack) {
        debug_assert_eq!(j.committed_section, wb.start);
        for (s, g) in &wb.list {
            if j.newest.get(s) == Some(g) {
                j.newest.remove(s);
            }
        }
        let sections = j.shape.sections;
        let se = u64::from(j.shape.section_entries);
        for k in 0..wb.n {
            let i = (wb.start + k) % sections;
            for e in 0..se {
                set_entry_unused(j.entry_mut(u64::from(i) * se + e));
            }
        }
        j.committed_section = (wb.start + wb.n) % sections;
        j.n_committed -= wb.n;
        j.free_entries += u64::from(wb.n) * se;
    }

    /// `integrity_writer` with the state lock held throughout (close): copies the
    /// committed sections' newest entries to their places, flushes, and frees the sections.
    fn write_back(&self, st: &mut State) -> Result<(), BackendError> {
        let Some(wb) = self.write_back_plan(&st.journal) else {
            return Ok(());
        };
        let runs = self.runs(&mut st.journal, &wb.list);
        let res = self.write_runs(runs).and_then(|()| self.flush_devices());
        if let Err(e) = res {
            st.failed = Some(format!("copying the journal to its places: {e}"));
            return Err(e);
        }
        self.finish_write_back(&mut st.journal, &wb);
        Ok(())
    }

    /// Journal mode, once the journal is at its watermark (or full): commits it and copies
    /// the committed sections to their places, the copy without the state lock (see the
    /// module docs). Nothing to do if another write-back freed the journal meanwhile. With
    /// `wait` false (the journal has free entries), a write-back already under way is
    /// left to do the work, as the kernel queues its one writer: the caller's write is in
    /// the journal and needs nothing more.
    fn relieve(&self, wait: bool) -> Result<(), BackendError> {
        let poisoned = || BackendError::Other("dm-integrity write-back lock poisoned".into());
        let _writeback = if wait {
            self.writeback.lock().map_err(|_| poisoned())?
        } else {
            match self.writeback.try_lock() {
                Ok(g) => g,
                Err(std::sync::TryLockError::WouldBlock) => return Ok(()),
                Err(std::sync::TryLockError::Poisoned(_)) => return Err(poisoned()),
            }
        };
        {
            let st = self.lock_write()?;
            if st.journal.free_entries > st.journal.threshold {
                return Ok(());
            }
        }
        self.commit()?;
        // The sections stay committed (not free) until `finish_write_back`: no writer
        // touches their bytes, so what is written from them without the lock is what was
        // committed, and readers keep finding the blocks there.
        let (wb, runs) = {
            let mut st = self.lock_write()?;
            match self.write_back_plan(&st.journal) {
                Some(wb) => {
                    let runs = self.runs(&mut st.journal, &wb.list);
                    (wb, runs)
                }
                None => return Ok(()),
            }
        };
        let res = self.write_runs(runs);
        let res = res.and_then(|()| self.flush_devices());
        let mut st = self.state.write().map_err(|_| poisoned())?;
        if let Err(e) = res {
            st.failed = Some(format!("copying the journal to its places: {e}"));
            return Err(e);
        }
        self.finish_write_back(&mut st.journal, &wb);
        Ok(())
    }

    /// Journal mode, at the watermark: [`Core::relieve`] in the background, on the
    /// device's writer thread (the kernel's commit and writer workqueues), so that the
    /// writer that reached the watermark returns at once. As `queue_work`: asking while a
    /// write-back is already asked for adds nothing; asking while one runs has the thread
    /// look again once it is done. Inline when no thread can be started or the device is
    /// not in its `Arc` (format).
    fn kick(&self) -> Result<(), BackendError> {
        let Ok(mut w) = self.writer.lock() else {
            return self.relieve(false);
        };
        if w.pending || w.stop {
            return Ok(());
        }
        if w.thread.is_none() {
            let Some(me) = self.me.upgrade() else {
                drop(w);
                return self.relieve(false);
            };
            let spawned = std::thread::Builder::new()
                .name("integrity-writer".into())
                .spawn(move || me.writer_thread());
            match spawned {
                Ok(t) => w.thread = Some(t),
                Err(_) => {
                    drop(w);
                    return self.relieve(false);
                }
            }
        }
        w.pending = true;
        drop(w);
        self.writer_cv.notify_one();
        Ok(())
    }

    /// The writer thread: a write-back each time one is asked for, until stopped. An I/O
    /// error fails the device (`failed`), which the next request reports.
    fn writer_thread(&self) {
        loop {
            {
                let Ok(mut w) = self.writer.lock() else {
                    return;
                };
                while !w.pending && !w.stop {
                    w = match self.writer_cv.wait(w) {
                        Ok(w) => w,
                        Err(_) => return,
                    };
                }
                if w.stop {
                    return;
                }
                w.pending = false;
            }
            let _ = self.relieve(true);
        }
    }

    /// Stops the writer thread (after the write-back under way) and waits for it.
    fn stop_writer(&self) {
        let thread = match self.writer.lock() {
            Ok(mut w) => {
                w.stop = true;
                w.thread.take()
            }
            Err(_) => None,
        };
        self.writer_cv.notify_all();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }

    /// Journal mode: the blocks of `buf` (at logical `sector`) into free journal entries
    /// (the caller sees that there are enough).
    fn write_journal(&self, st: &mut State, buf: &[u8], given: &[u8], sector: u64) {
        let bb = self.geo.block_bytes() as usize;
        let ts = self.geo.tag_size as usize;
        let spb = self.spb();
        debug_assert!((buf.len() / bb) as u64 <= st.journal.free_entries);
        for (k, block) in buf.chunks(bb).enumerate() {
            let s = sector + k as u64 * spb;
            let j = &mut st.journal;
            let se = u64::from(j.shape.section_entries);
            let g = u64::from(j.free_section) * se + u64::from(j.free_entry);
            let (i, n) = j.split(g);
            let toff = j.shape.tag_offset();
            // The block's sectors are contiguous in the section (`data_sector`).
            let at = j.shape.data_sector(n, 0) as usize * 512;
            j.section_mut(i)[at..at + bb].copy_from_slice(block);
            let entry = j.entry_mut(g);
            for x in 0..(bb / 512) {
                entry[8 + 8 * x..16 + 8 * x].copy_from_slice(&block[x * 512 + 504..x * 512 + 512]);
            }
            entry[toff..toff + ts].copy_from_slice(&given[k * ts..(k + 1) * ts]);
            entry[..8].copy_from_slice(&s.to_le_bytes());
            j.newest.insert(s, g);
            j.free_entries -= 1;
            j.free_entry += 1;
            if j.free_entry == j.shape.section_entries {
                j.free_entry = 0;
                j.free_section = (j.free_section + 1) % j.shape.sections;
                j.n_uncommitted += 1;
            }
        }
    }

    /// Direct and bitmap modes: data and tags of `buf` (at logical `sector`) in place, the
    /// tags given (`tag_size` bytes per block). The caller holds the state lock shared and
    /// the request's logical range alone (see the module docs); each tag unit this write
    /// changes only in part (shared with blocks outside that range) is locked alone while
    /// it is read, changed and written back.
    fn write_direct(
        &self,
        st: &State,
        buf: &[u8],
        tags: &[u8],
        sector: u64,
        fua: bool,
    ) -> Result<(), BackendError> {
        if self.mode == Mode::Bitmap {
            self.mark_dirty(st, sector, buf.len() as u64 / 512)?;
        }
        let ts = self.geo.tag_size as usize;
        let bb = self.geo.block_bytes() as usize;
        let mut done = 0usize;
        while done < buf.len() {
            let s = sector + (done / 512) as u64;
            let room = self.geo.area_room(s).saturating_mul(512);
            let n = room.min((buf.len() - done) as u64) as usize;
            let part = &buf[done..done + n];
            let part_tags = &tags[done / bb * ts..(done + n) / bb * ts];
            self.data
                .write_at(part, self.geo.data_sector(s) * 512, false)?;
            // Tag units, not logical blocks, are locked here: the units a write touches are
            // found from the device bytes alone, whatever blocks (of this area or, in any
            // layout, another) share them, and the writers of neighbouring blocks wait for
            // each other only for this read-modify-write, not for their data writes. No unit
            // holds data (which `ranges` alone guards): the superblock, journal sections and
            // metadata runs are whole multiples of 4096 bytes, and `align` is at most that.
            let at = self.geo.tag_byte(s);
            let (first, end) = self.unit_span(at, part_tags.len());
            let _units = self.tag_units.lock(first, end, true)?;
            let mut update = TagUpdate::new(&*self.inner, self.align, &self.tag_cache);
            update.put(at, part_tags)?;
            update.write_back()?;
            done += n;
        }
        if fua {
            self.flush_devices()?;
        }
        Ok(())
    }

    /// Reads `buf` at logical `sector` from the data area and checks the tags; with
    /// external tags, reads the stored tags into `tags_out` (unchecked; none wanted: data
    /// only).
    fn read_checked(
        &self,
        buf: &mut [u8],
        mut tags_out: Option<&mut [u8]>,
        sector: u64,
    ) -> Result<(), BackendError> {
        let ts = self.geo.tag_size as usize;
        let bb = self.geo.block_bytes() as usize;
        let mut done = 0usize;
        let mut tag = vec![0u8; ts];
        while done < buf.len() {
            let s = sector + (done / 512) as u64;
            let room = self.geo.area_room(s).saturating_mul(512);
            let n = room.min((buf.len() - done) as u64) as usize;
            let part = &mut buf[done..done + n];
            self.data.read_at(part, self.geo.data_sector(s) * 512)?;
            if self.external {
                if let Some(out) = tags_out.as_deref_mut() {
                    let at = done / bb * ts;
                    let want = &mut out[at..at + n / bb * ts];
                    self.read_tags(self.geo.tag_byte(s), want)?;
                }
                done += n;
                continue;
            }
            if s + (n / 512) as u64 > self.unchecked_from {
                done += n;
                continue;
            }
            let mut stored = vec![0u8; n / bb * ts];
            self.read_tags(self.geo.tag_byte(s), &mut stored)?;
            for (k, block) in part.chunks(bb).enumerate() {
                let bs = s + (k * bb / 512) as u64;
                self.tag(bs, block, &mut tag);
                if stored[k * ts..(k + 1) * ts] != tag[..] {
                    self.mismatches.fetch_add(1, Ordering::Relaxed);
                    return Err(BackendError::Integrity {
                        offset: bs * 512,
                        len: bb as u64,
                    });
                }
            }
            done += n;
        }
        Ok(())
    }

    fn read_bitmap(&self, st: &State) -> Result<Vec<u8>, BackendError> {
        let blocks = self.geo.bitmap_blocks(st.sb.log2_blocks_per_bitmap_bit);
        let mut b = vec![0u8; (blocks * BITMAP_BLOCK_SIZE) as usize];
        self.inner.read_at(&mut b, self.geo.journal_byte(0, 0))?;
        Ok(b)
    }

    fn lock_bitmap(&self) -> Result<MutexGuard<'_, Option<Vec<u8>>>, BackendError> {
        self.bitmap
            .lock()
            .map_err(|_| BackendError::Other("dm-integrity bitmap lock poisoned".into()))
    }

    fn write_bitmap(&self, b: &[u8]) -> Result<(), BackendError> {
        self.inner.write_at(b, self.geo.journal_byte(0, 0), true)
    }

    /// Bitmap mode: `b` becomes the bitmap, written (FUA).
    fn install_bitmap(&self, b: Vec<u8>) -> Result<(), BackendError> {
        let mut g = self.lock_bitmap()?;
        self.write_bitmap(&b)?;
        *g = Some(b);
        Ok(())
    }

    /// Bitmap mode: marks the regions of `[sector, sector + n)` dirty on disk (FUA) before
    /// their data is written. The bitmap's lock is held while a changed bitmap is written:
    /// a writer that finds its bits set finds them on the device.
    fn mark_dirty(&self, st: &State, sector: u64, n: u64) -> Result<(), BackendError> {
        let shift = u32::from(self.geo.log2_sectors_per_block) + u32::from(st.log2_blocks_per_bit);
        let first = sector >> shift;
        let last = (sector + n - 1) >> shift;
        let mut g = self.lock_bitmap()?;
        let Some(b) = g.as_mut() else {
            return Ok(());
        };
        let clear = |bit: u64| {
            let (byte, mask) = ((bit / 8) as usize, 1u8 << (bit % 8));
            byte < b.len() && b[byte] & mask == 0
        };
        if !(first..=last).any(clear) {
            return Ok(());
        }
        // Changed on a copy, kept once it is on the device: after a failed write no
        // writer takes the bits as set.
        let mut next = b.clone();
        for bit in first..=last {
            let (byte, mask) = ((bit / 8) as usize, 1u8 << (bit % 8));
            if byte < next.len() {
                next[byte] |= mask;
            }
        }
        self.write_bitmap(&next)?;
        *b = next;
        Ok(())
    }

    /// Bitmap mode, on flush (state lock held alone: no write under way): once the data
    /// and tags are durable, the bitmap is cleared (the kernel does it
    /// `bitmap_flush_interval` after the last write).
    fn clear_bitmap(&self) -> Result<(), BackendError> {
        let mut g = self.lock_bitmap()?;
        if let Some(b) = g.as_mut() {
            if b.iter().any(|&x| x != 0) {
                b.fill(0);
                self.write_bitmap(b)?;
            }
        }
        Ok(())
    }

    /// Recalculates the tags of the regions `bitmap` marks.
    fn recalc_regions(
        &self,
        st: &mut State,
        bitmap: &[u8],
        _same: bool,
    ) -> Result<(), BackendError> {
        let shift = u32::from(self.geo.log2_sectors_per_block) + u32::from(st.log2_blocks_per_bit);
        let region = 1u64 << shift;
        let provided = st.sb.provided_data_sectors;
        let regions = provided.div_ceil(region);
        for bit in 0..regions {
            let (byte, mask) = ((bit / 8) as usize, 1u8 << (bit % 8));
            if byte < bitmap.len() && bitmap[byte] & mask != 0 {
                let from = bit << shift;
                self.recalc_range(from, (from + region).min(provided))?;
            }
        }
        self.flush_devices()
    }

    /// `integrity_recalc`: tags from `from` to the end computed from the data; the
    /// superblock records the end.
    fn recalculate(&self, st: &mut State, from: u64) -> Result<(), BackendError> {
        let provided = st.sb.provided_data_sectors;
        self.recalc_range(from, provided)?;
        self.flush_devices()?;
        st.sb.recalc_sector = provided;
        self.write_sb(st)
    }

    fn recalc_range(&self, from: u64, to: u64) -> Result<(), BackendError> {
        if self.external {
            return Err(BackendError::Other(
                "tags cannot be recalculated without internal_hash".into(),
            ));
        }
        const CHUNK: u64 = 2048;
        let ts = self.geo.tag_size as usize;
        let bb = self.geo.block_bytes() as usize;
        let mut s = from;
        while s < to {
            let n = (to - s).min(CHUNK).min(self.geo.area_room(s));
            let mut data = vec![0u8; (n * 512) as usize];
            self.data
                .read_at(&mut data, self.geo.data_sector(s) * 512)?;
            let mut tags = vec![0u8; data.len() / bb * ts];
            for (k, block) in data.chunks(bb).enumerate() {
                self.tag(
                    s + (k * bb / 512) as u64,
                    block,
                    &mut tags[k * ts..(k + 1) * ts],
                );
            }
            let at = self.geo.tag_byte(s);
            let (first, end) = self.unit_span(at, tags.len());
            let _units = self.tag_units.lock(first, end, true)?;
            let mut update = TagUpdate::new(&*self.inner, self.align, &self.tag_cache);
            update.put(at, &tags)?;
            update.write_back()?;
            s += n;
        }
        Ok(())
    }

    fn check_request(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        check_range(offset, len, self.info.size_bytes)?;
        let bb = self.geo.block_bytes();
        if offset % bb != 0 {
            return Err(BackendError::Misaligned {
                what: "offset",
                value: offset,
                align: bb,
            });
        }
        if len % bb != 0 {
            return Err(BackendError::Misaligned {
                what: "length",
                value: len,
                align: bb,
            });
        }
        Ok(())
    }
}

/// The kernel's `dm_integrity_disable_recalculate`.
fn recalc_disabled(sb: &Superblock, hash_keyed: bool, jmac_keyed: bool) -> bool {
    if sb.flags.has(Flags::FIXED_HMAC) {
        hash_keyed && !jmac_keyed
    } else {
        hash_keyed || jmac_keyed
    }
}

/// The keyed `journal_crypt` of `opts` for a journal of `shape`. Bitmap mode keeps its
/// bitmap where the journal would be; with an encrypted journal the kernel writes it
/// through the journal's encrypted buffer, which ucrypt does not reproduce: refused.
fn journal_crypt(
    opts: &Options,
    shape: &JournalShape,
) -> Result<Option<JournalCrypt>, IntegrityError> {
    let Some((name, key)) = &opts.journal_crypt else {
        return Ok(None);
    };
    if opts.mode == Mode::Bitmap {
        return Err(refused(
            "bitmap mode with journal_crypt is not supported (the kernel writes the bitmap \
             through the encrypted journal's buffer)",
        ));
    }
    JournalCrypt::new(name, key, shape)
        .map(Some)
        .map_err(refused)
}

fn jmac_keyed(opts: &Options) -> bool {
    matches!(&opts.journal_mac, Some((_, Some(_))))
}

fn verify_sb_mac(m: &Hasher, sector: &[u8]) -> Result<(), IntegrityError> {
    let n = m.algorithm().digest_size();
    let mut mac = vec![0u8; n];
    m.digest_into(&[&sector[..512 - n]], &mut mac);
    if mac[..] != sector[512 - n..512] {
        return Err(refused(
            "the superblock's MAC does not match (wrong journal integrity key, or the \
             superblock was changed)",
        ));
    }
    Ok(())
}

impl Core {
    /// External tags: reads `buf` at byte `offset` and the blocks' stored tags into `tags`
    /// (`tag_size` bytes per block), as the kernel hands dm-crypt a bio's integrity
    /// payload. Nothing is checked here.
    ///
    /// # Errors
    /// I/O errors, a request not in whole blocks, `tags` of the wrong length, a device
    /// with an internal hash.
    pub fn read_tagged(
        &self,
        buf: &mut [u8],
        tags: &mut [u8],
        offset: u64,
    ) -> Result<(), BackendError> {
        self.check_tags(buf.len(), tags.len())?;
        self.read_inner(buf, Some(tags), offset)
    }

    /// External tags: writes `buf` at byte `offset` with the blocks' tags from `tags`,
    /// together (through the journal in mode J, so that a crash leaves either both or
    /// neither).
    ///
    /// # Errors
    /// As [`IntegrityBackend::read_tagged`], and read-only devices.
    pub fn write_tagged(
        &self,
        buf: &[u8],
        tags: &[u8],
        offset: u64,
        fua: bool,
    ) -> Result<(), BackendError> {
        self.check_tags(buf.len(), tags.len())?;
        self.write_inner(buf, Some(tags), offset, fua)
    }

    fn check_tags(&self, len: usize, tags: usize) -> Result<(), BackendError> {
        if !self.external {
            return Err(BackendError::Other(
                "this dm-integrity device computes its own tags (internal_hash)".into(),
            ));
        }
        let want = len / self.geo.block_bytes() as usize * self.geo.tag_size as usize;
        if tags != want {
            return Err(BackendError::Other(format!(
                "{tags} tag bytes given for {len} data bytes ({want} wanted)"
            )));
        }
        Ok(())
    }

    fn read(&self, buf: &mut [u8], offset: u64) -> Result<(), BackendError> {
        self.read_inner(buf, None, offset)
    }

    fn read_inner(
        &self,
        buf: &mut [u8],
        mut tags: Option<&mut [u8]>,
        offset: u64,
    ) -> Result<(), BackendError> {
        self.check_request(offset, buf.len() as u64)?;
        let st = self.lock_read()?;
        let sector = offset / 512;
        if matches!(self.mode, Mode::Direct | Mode::Bitmap) && !self.read_only {
            // Its blocks' data and tags, never a writer's half (see the module docs).
            let end = sector + buf.len() as u64 / 512;
            let _range = self.ranges.lock(sector, end, false)?;
            return self.read_checked(buf, tags, sector);
        }
        if st.journal.newest.is_empty() {
            return self.read_checked(buf, tags, sector);
        }
        let ts = self.geo.tag_size as usize;
        let toff = st.journal.shape.tag_offset();
        // Blocks with a journal entry come from the journal; the runs between from their
        // places.
        let bb = self.geo.block_bytes() as usize;
        let spb = self.spb();
        let blocks = buf.len() / bb;
        let mut k = 0;
        while k < blocks {
            let s = sector + k as u64 * spb;
            if let Some(&g) = st.journal.newest.get(&s) {
                st.journal.block_into(g, &mut buf[k * bb..(k + 1) * bb]);
                if let Some(t) = tags.as_deref_mut() {
                    t[k * ts..(k + 1) * ts].copy_from_slice(&st.journal.entry(g)[toff..toff + ts]);
                }
                k += 1;
                continue;
            }
            let mut end = k + 1;
            while end < blocks && !st.journal.newest.contains_key(&(sector + end as u64 * spb)) {
                end += 1;
            }
            let part_tags = tags.as_deref_mut().map(|t| &mut t[k * ts..end * ts]);
            self.read_checked(&mut buf[k * bb..end * bb], part_tags, s)?;
            k = end;
        }
        Ok(())
    }

    fn write(&self, buf: &[u8], offset: u64, fua: bool) -> Result<(), BackendError> {
        if self.external {
            return Err(BackendError::Other(
                "a dm-integrity device without internal_hash is written with its tags \
                 (by the crypt target above it)"
                    .into(),
            ));
        }
        self.write_inner(buf, None, offset, fua)
    }

    fn write_inner(
        &self,
        buf: &[u8],
        tags: Option<&[u8]>,
        offset: u64,
        fua: bool,
    ) -> Result<(), BackendError> {
        if self.read_only {
            return Err(BackendError::ReadOnly);
        }
        self.check_request(offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        let sector = offset / 512;
        match self.mode {
            Mode::Journal => self.write_journaled(buf, tags, sector, fua),
            Mode::Direct | Mode::Bitmap => {
                let own;
                let tags = match tags {
                    Some(t) => t,
                    None => {
                        own = self.tags_of(buf, sector);
                        &own[..]
                    }
                };
                let st = self.lock_read()?;
                let end = sector + buf.len() as u64 / 512;
                let _range = self.ranges.lock(sector, end, true)?;
                self.write_direct(&st, buf, tags, sector, fua)
            }
            Mode::Recovery => Err(BackendError::ReadOnly),
        }
    }

    /// The internal hash's tags of the blocks of `buf` at logical `sector`.
    fn tags_of(&self, buf: &[u8], sector: u64) -> Vec<u8> {
        let bb = self.geo.block_bytes() as usize;
        let ts = self.geo.tag_size as usize;
        let mut t = vec![0u8; buf.len() / bb * ts];
        for (k, block) in buf.chunks(bb).enumerate() {
            let s = sector + k as u64 * self.spb();
            self.tag(s, block, &mut t[k * ts..(k + 1) * ts]);
        }
        t
    }

    /// Journal mode: as many blocks as there are free entries into the journal under the
    /// state lock, the journal committed and written back ([`Core::relieve`], this thread
    /// waiting) when full, the rest after that; with `fua` the journal is committed once
    /// the last block is in ([`Core::commit`]); at the watermark the writer thread is
    /// asked to write it back ([`Core::kick`]) and the write returns.
    fn write_journaled(
        &self,
        buf: &[u8],
        tags: Option<&[u8]>,
        sector: u64,
        fua: bool,
    ) -> Result<(), BackendError> {
        let bb = self.geo.block_bytes() as usize;
        let ts = self.geo.tag_size as usize;
        let blocks = buf.len() / bb;
        // The internal hash's tags, computed before the lock is taken.
        let own;
        let tags = match tags {
            Some(t) => t,
            None => {
                own = self.tags_of(buf, sector);
                &own[..]
            }
        };
        let mut done = 0usize;
        loop {
            let mut st = self.lock_write()?;
            let n =
                (blocks - done).min(usize::try_from(st.journal.free_entries).unwrap_or(usize::MAX));
            let part_tags = &tags[done * ts..(done + n) * ts];
            let at = sector + done as u64 * self.spb();
            self.write_journal(&mut st, &buf[done * bb..(done + n) * bb], part_tags, at);
            done += n;
            let last = done == blocks;
            let watermark = st.journal.free_entries <= st.journal.threshold;
            let full = st.journal.free_entries == 0 && !last;
            drop(st);
            if last && fua {
                self.commit()?;
            }
            if full {
                self.relieve(true)?;
            } else if watermark {
                self.kick()?;
            }
            if last {
                return Ok(());
            }
        }
    }
}

impl IntegrityBackend {
    /// Opens the dm-integrity device on `inner` (its superblock at byte 0), as the kernel
    /// activates the table `integrity DEV 0 TAG_SIZE MODE ... internal_hash:...`: checks
    /// the superblock against the options, replays a journal left behind, recalculates
    /// tags the superblock or a dirty bitmap marks.
    ///
    /// # Errors
    /// A superblock the kernel would refuse, options that do not match it, I/O errors, a
    /// journal the kernel would fail the device for (torn commit ids, a journal MAC or a
    /// replayed tag that does not match).
    pub fn open(
        inner: Arc<dyn Backend>,
        opts: Options,
    ) -> Result<IntegrityBackend, IntegrityError> {
        Core::open_on(inner, None, opts).map(IntegrityBackend::wrap)
    }

    /// Opens the dm-integrity device whose superblock, journal and tags are on `meta` and
    /// whose data is on `data` (the table's `meta_device:META` over the data device DATA;
    /// `integritysetup open META NAME --data-device DATA`). The data device's whole blocks
    /// are provided: a superblock that says otherwise is brought to that, as the kernel
    /// does on resume (in bitmap mode the tags of blocks gained are recalculated).
    ///
    /// # Errors
    /// As [`IntegrityBackend::open`]; a superblock of a device without a separate metadata
    /// device; a metadata device too small for the tags of the data device's blocks.
    pub fn open_separate(
        meta: Arc<dyn Backend>,
        data: Arc<dyn Backend>,
        opts: Options,
    ) -> Result<IntegrityBackend, IntegrityError> {
        Core::open_on(meta, Some(data), opts).map(IntegrityBackend::wrap)
    }

    fn wrap(core: Core) -> IntegrityBackend {
        IntegrityBackend {
            core: Arc::new_cyclic(move |me| {
                let mut core = core;
                core.me = Weak::clone(me);
                core
            }),
        }
    }

    /// The superblock as it stands.
    pub fn superblock(&self) -> Superblock {
        self.core.superblock()
    }

    /// The geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.core.geo
    }

    /// Blocks whose tag did not match since open (the kernel's status counter).
    pub fn mismatches(&self) -> u64 {
        self.core.mismatches()
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.core.mode
    }

    /// Tag units held in memory now, and the most it holds (`Options::tag_cache_bytes`
    /// over the unit size).
    pub fn tag_cache_units(&self) -> (usize, usize) {
        (self.core.tag_cache.len(), self.core.tag_cache.capacity())
    }

    /// Leaves the device as the kernel's suspend does: the journal committed, copied to
    /// its places and reset (mode J); the bitmap cleared and the journal area reset (B);
    /// everything flushed. Later requests fail.
    ///
    /// # Errors
    /// I/O errors.
    pub fn close(&self) -> Result<(), BackendError> {
        self.core.close()
    }

    /// External tags: reads `buf` at byte `offset` and the blocks' stored tags into `tags`
    /// (`tag_size` bytes per block), as the kernel hands dm-crypt a bio's integrity
    /// payload. Nothing is checked here.
    ///
    /// # Errors
    /// I/O errors, a request not in whole blocks, `tags` of the wrong length, a device
    /// with an internal hash.
    pub fn read_tagged(
        &self,
        buf: &mut [u8],
        tags: &mut [u8],
        offset: u64,
    ) -> Result<(), BackendError> {
        self.core.read_tagged(buf, tags, offset)
    }

    /// External tags: writes `buf` at byte `offset` with the blocks' tags from `tags`,
    /// together (through the journal in mode J, so that a crash leaves either both or
    /// neither).
    ///
    /// # Errors
    /// As [`IntegrityBackend::read_tagged`], and read-only devices.
    pub fn write_tagged(
        &self,
        buf: &[u8],
        tags: &[u8],
        offset: u64,
        fua: bool,
    ) -> Result<(), BackendError> {
        self.core.write_tagged(buf, tags, offset, fua)
    }

    /// Whether the tags are the layer above's (no `internal_hash`).
    pub fn external_tags(&self) -> bool {
        self.core.external
    }
}

impl Backend for IntegrityBackend {
    fn info(&self) -> &BackendInfo {
        &self.core.info
    }

    fn submit(&self, io: Io<'_>) -> Result<(), BackendError> {
        self.core.submit(io)
    }

    fn integrity_failures(&self) -> Option<u64> {
        self.core.integrity_failures()
    }

    fn flush(&self) -> Result<(), BackendError> {
        self.core.flush()
    }
}

impl Backend for Core {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn submit(&self, io: Io<'_>) -> Result<(), BackendError> {
        match io.kind {
            IoKind::Read(buf) => self.read(buf, io.offset),
            IoKind::Write(buf) => self.write(buf, io.offset, io.fua),
            _ => emulate::fallback(self, io),
        }
    }

    /// Blocks whose internal-hash tag did not match (the kernel's status counter); `None`
    /// with external tags, which the crypt target above checks and counts.
    fn integrity_failures(&self) -> Option<u64> {
        (!self.external).then(|| self.mismatches())
    }

    fn flush(&self) -> Result<(), BackendError> {
        if self.read_only {
            return Ok(());
        }
        if self.mode == Mode::Journal {
            self.commit()?;
            return self.flush_devices();
        }
        // Alone: no D or B write is under way (each holds the state lock shared).
        let _st = self.lock_write()?;
        match self.mode {
            Mode::Bitmap => {
                self.flush_devices()?;
                self.clear_bitmap()
            }
            Mode::Journal | Mode::Direct | Mode::Recovery => self.flush_devices(),
        }
    }
}

impl Drop for IntegrityBackend {
    fn drop(&mut self) {
        // A clean drop leaves the device as a clean close would; a crash leaves the
        // journal, which the next open replays.
        self.core.stop_writer();
        let _ = self.core.close();
    }
}

/// Formats `inner` as the kernel does when it activates a table over a zeroed superblock
/// (`initialize_superblock`, then `init_journal` with sequence 0), then, with `wipe`,
/// writes zeros with valid tags over the whole data area as `integritysetup format` does
/// (in direct mode). Returns the superblock written.
///
/// # Errors
/// Parameters out of range, a device too small, I/O errors.
pub fn format(
    inner: Arc<dyn Backend>,
    params: &FormatParams,
    opts: &Options,
    wipe: bool,
) -> Result<Superblock, IntegrityError> {
    let dev_sectors = inner.info().size_bytes / 512;
    let sb = Superblock::new_for_format(params, dev_sectors)?;
    let geo = Geometry::new(&sb, dev_sectors, opts.buffer_sectors)?;
    format_on(inner, None, sb, geo, opts, wipe)
}

/// [`format()`] with a separate metadata device: the superblock, the journal and the tags on
/// `meta`, the data (wiped with `wipe`) on `data`, as the kernel formats a table with
/// `meta_device:` (`integritysetup format META --data-device DATA`): superblock version 2
/// or more, interleave 0, no metadata padding, the journal as big as asked if it fits
/// beside the tags.
///
/// # Errors
/// Parameters out of range, a data device smaller than a block, a metadata device too
/// small for one journal section and the tags, I/O errors.
pub fn format_separate(
    meta: Arc<dyn Backend>,
    data: Arc<dyn Backend>,
    params: &FormatParams,
    opts: &Options,
    wipe: bool,
) -> Result<Superblock, IntegrityError> {
    let meta_sectors = meta.info().size_bytes / 512;
    let data_sectors = data.info().size_bytes / 512;
    let sb = Superblock::new_for_format_separate(
        params,
        meta_sectors,
        data_sectors,
        opts.buffer_sectors,
    )?;
    let geo = Geometry::new_separate(&sb, meta_sectors, data_sectors, opts.buffer_sectors)?;
    format_on(meta, Some(data), sb, geo, opts, wipe)
}

fn format_on(
    inner: Arc<dyn Backend>,
    data: Option<Arc<dyn Backend>>,
    sb: Superblock,
    geo: Geometry,
    opts: &Options,
    wipe: bool,
) -> Result<Superblock, IntegrityError> {
    // The superblock area zeroed, then the journal: every section empty with sequence 0.
    let zero_sb = vec![0u8; (SB_SECTORS * 512) as usize];
    inner.write_at(&zero_sb, 0, false)?;
    let mut first = zero_sb.clone();
    first[..512].copy_from_slice(&sb.to_sector());
    inner.write_at(&first, 0, true)?;
    let mut o = opts.clone();
    o.mode = Mode::Direct;
    o.read_only = false;
    // Opening in direct mode with a zeroed journal area would find no commit ids: write the
    // fresh journal first, through a device handle that has the superblock.
    let dev = Core::open_unreplayed(Arc::clone(&inner), data, o, sb.clone(), geo)?;
    {
        let mut st = dev.lock_write()?;
        let sections = st.journal.shape.sections;
        dev.init_journal(&mut st, 0, sections, 0)?;
        dev.write_sb(&mut st)?;
        if wipe {
            drop(st);
            let chunk = (1u64 << 20).max(dev.geo.block_bytes());
            let zeros = vec![0u8; chunk as usize];
            let size = dev.info.size_bytes;
            let mut at = 0;
            while at < size {
                let n = (size - at).min(chunk) as usize;
                dev.write_at(&zeros[..n], at, false)?;
                at += n as u64;
            }
        }
    }
    dev.flush()?;
    dev.close()?;
    Ok(dev.superblock())
}

impl Core {
    /// A handle over a superblock just written, without reading the journal (format).
    fn open_unreplayed(
        inner: Arc<dyn Backend>,
        data: Option<Arc<dyn Backend>>,
        opts: Options,
        sb: Superblock,
        geo: Geometry,
    ) -> Result<Core, IntegrityError> {
        let hash = Hasher::new(opts.hash, opts.hash_key.as_ref().map(|k| k.as_slice()))
            .map_err(|e| refused(format!("internal hash: {e}")))?;
        let jmac = match &opts.journal_mac {
            Some((alg, key)) => Some(
                Hasher::new(*alg, key.as_ref().map(|k| k.as_slice()))
                    .map_err(|e| refused(format!("journal mac: {e}")))?,
            ),
            None => None,
        };
        let shape = geo.journal;
        let jcrypt = journal_crypt(&opts, &shape)?;
        let ids = jcrypt.as_ref().map_or(COMMIT_IDS, JournalCrypt::commit_ids);
        let block = geo.block_bytes();
        let log2_blocks_per_bit = sb.log2_blocks_per_bitmap_bit;
        let data = data.unwrap_or_else(|| Arc::clone(&inner));
        let align = u64::from(
            inner
                .info()
                .logical_block
                .max(data.info().logical_block)
                .max(512),
        );
        Ok(Core {
            align,
            info: BackendInfo {
                size_bytes: sb.provided_data_sectors * 512,
                logical_block: block as u32,
                physical_block: block as u32,
                optimal_block: (block as u32).max(4096),
                caps: Caps {
                    flush: Support::Native,
                    discard: Support::None,
                    write_zeroes: Support::None,
                    read_only: false,
                },
            },
            inner,
            data,
            mode: opts.mode,
            read_only: false,
            salt: sb.flags.has(Flags::FIXED_HMAC).then_some(sb.salt),
            hash,
            external: opts.external_tags,
            jmac,
            jcrypt,
            unchecked_from: u64::MAX,
            state: RwLock::new(State {
                journal: Journal {
                    shape,
                    secs: Journal::zeroed_sections(&shape),
                    commit_seq: 0,
                    ids,
                    committed_section: 0,
                    n_committed: 0,
                    n_committing: 0,
                    uncommitted_section: 0,
                    n_uncommitted: 0,
                    free_section: 0,
                    free_entry: 0,
                    free_entries: shape.entries,
                    threshold: 0,
                    newest: HashMap::new(),
                    wrote: false,
                },
                sb,
                log2_blocks_per_bit,
                closed: false,
                failed: None,
            }),
            geo,
            ranges: RangeLock::default(),
            tag_units: RangeLock::default(),
            tag_cache: UnitCache::new(align, opts.tag_cache_bytes),
            bitmap: Mutex::new(None),
            writeback: Mutex::new(()),
            commit_lock: Mutex::new(()),
            writer: Mutex::new(Writer::default()),
            writer_cv: Condvar::new(),
            me: Weak::new(),
            mismatches: AtomicU64::new(0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_never_shows_a_key() {
        let mut o = Options::new(Algorithm::Crc32c);
        o.hash_key = Some(Zeroizing::new(b"HASHKEYSECRET".to_vec()));
        o.journal_mac = Some((
            Algorithm::Crc32c,
            Some(Zeroizing::new(b"MACKEYSECRET".to_vec())),
        ));
        o.journal_crypt = Some((
            "ctr(aes)".into(),
            Zeroizing::new(b"CRYPTKEYSECRET".to_vec()),
        ));
        let text = format!("{o:?}");
        assert!(!text.contains("SECRET"), "{text}");
        let bytes: Vec<String> = b"HASHKEYSECRET".iter().map(|b| b.to_string()).collect();
        assert!(!text.contains(&bytes.join(", ")), "{text}");
        assert!(
            text.contains("<13 bytes>") && text.contains("ctr(aes)"),
            "{text}"
        );
    }
}
