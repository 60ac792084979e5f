//! Standalone dm-integrity devices (`integritysetup`): what `format`, `open` and `dump`
//! decide, as cryptsetup's `integritysetup` (2.6) decides it. A command fills a
//! [`FormatRequest`] or [`OpenRequest`] from its arguments and prints what comes back;
//! option checks, key files, the superblock and the kernel's table line are here.
//!
//! ```text
//!  FormatRequest ─► prepare_format (checks, keys, device) ─► PreparedFormat::run ─► Formatted
//!  OpenRequest   ─► open_table_line (superblock + options) ─► "0 N integrity DEV 0 T J ..."
//!                   open_table: the same line as a Mapping, opened like any table
//!  dump(device)  ─► the superblock as integritysetup dump prints it
//! ```
//!
//! Errors carry their kind: [`ErrorKind::Device`] when the device cannot be opened or read,
//! [`ErrorKind::Invalid`] for options and superblocks (integritysetup's exit codes 4 and 1).

use crate::error::{Context, Error, ErrorKind, Result};
use crate::format::Mapping;
use crate::open::Device;
use std::io::Read;
use std::sync::Arc;
use ucrypt_backend::Backend;
use zeroize::Zeroizing;

pub use ucrypt_format::integrity::{FormatParams, IntegrityLine, Superblock, SALT_SIZE};
pub use ucrypt_integrity::journal_crypt::{kernel_cipher_name, JOURNAL_CRYPT_NAMES};
pub use ucrypt_integrity::{format, format_separate, Algorithm, Mode, Options};

/// A key read from a file: its path and how many bytes to take (all without a size).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyFile {
    /// The file.
    pub path: String,
    /// Bytes to read.
    pub size: Option<usize>,
}

/// Keyed algorithms of a request: the internal hash, the journal MAC, the journal cipher.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keys {
    /// `--integrity` (default crc32c).
    pub integrity: Option<String>,
    /// `--integrity-key-file` / `--integrity-key-size`.
    pub integrity_key: Option<KeyFile>,
    /// `--journal-integrity`.
    pub journal_integrity: Option<String>,
    /// `--journal-integrity-key-file` / `--journal-integrity-key-size`.
    pub journal_integrity_key: Option<KeyFile>,
    /// `--journal-crypt` (`ctr-aes`, `cbc(aes)`, `chacha20`...).
    pub journal_crypt: Option<String>,
    /// `--journal-crypt-key-file` / `--journal-crypt-key-size`.
    pub journal_crypt_key: Option<KeyFile>,
    /// `--integrity-inline`: refused (see [`refuse_inline`]).
    pub inline: bool,
}

/// What `integritysetup format` is asked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FormatRequest {
    /// The device or image (the metadata device with `data_device`).
    pub device: String,
    /// `--data-device`: the data goes there, the superblock, journal and tags to `device`.
    pub data_device: Option<String>,
    /// Algorithms and keys.
    pub keys: Keys,
    /// `--tag-size` (default: the hash's digest size).
    pub tag_size: Option<u32>,
    /// `--sector-size` (default 512).
    pub sector_size: Option<u32>,
    /// `--interleave-sectors` (0: the kernel's 32768).
    pub interleave_sectors: u32,
    /// `--journal-size` in bytes (default: the kernel's).
    pub journal_size: Option<u64>,
    /// `--integrity-no-wipe`.
    pub no_wipe: bool,
    /// `--integrity-legacy-padding`.
    pub legacy_padding: bool,
    /// `--integrity-legacy-hmac`.
    pub legacy_hmac: bool,
    /// `--integrity-bitmap-mode`.
    pub bitmap_mode: bool,
    /// `--bitmap-sectors-per-bit`.
    pub sectors_per_bit: Option<u64>,
}

/// What `integritysetup open` is asked (besides how to serve the device).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenRequest {
    /// The device or image (the metadata device with `data_device`).
    pub device: String,
    /// `--data-device`: the device with the data of a device formatted with one.
    pub data_device: Option<String>,
    /// Algorithms and keys.
    pub keys: Keys,
    /// `--integrity-no-journal` (mode D).
    pub no_journal: bool,
    /// `--integrity-bitmap-mode` (mode B).
    pub bitmap_mode: bool,
    /// `--integrity-recovery-mode` (mode R).
    pub recovery: bool,
    /// `--integrity-recalculate`.
    pub recalculate: bool,
    /// `--integrity-legacy-recalculate`.
    pub legacy_recalculate: bool,
    /// `--buffer-sectors`.
    pub buffer_sectors: Option<u32>,
    /// `--journal-watermark` (percent).
    pub journal_watermark: Option<u32>,
    /// `--journal-commit-time` (ms).
    pub journal_commit_time: Option<u32>,
    /// `--bitmap-sectors-per-bit`.
    pub sectors_per_bit: Option<u64>,
    /// `--bitmap-flush-time` (ms).
    pub bitmap_flush_time: Option<u32>,
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::Invalid(msg.into())
}

/// `--integrity-inline` (Linux 6.11's mode I: tags in the drive's own metadata) is refused
/// with the reason.
///
/// # Errors
/// Always, when `inline` is set.
pub fn refuse_inline(inline: bool) -> Result<()> {
    if inline {
        return Err(invalid(
            "--integrity-inline is not supported: the inline mode (I) keeps the tags in the \
             drive's own per-sector metadata (protection information, Linux 6.11+), which a \
             userspace device cannot reach; format without it to keep the tags on the device",
        ));
    }
    Ok(())
}

/// Up to `size` bytes of a key file (all of it without `size`).
///
/// # Errors
/// The file cannot be read, or holds fewer bytes than asked.
pub fn read_key_file(key: &KeyFile) -> Result<Zeroizing<Vec<u8>>> {
    let path = &key.path;
    let mut bytes = Zeroizing::new(Vec::new());
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|e| invalid(format!("reading key file {path}: {e}")))?;
    if let Some(n) = key.size {
        if bytes.len() < n {
            return Err(invalid(format!(
                "key file {path} holds {} bytes, {n} asked for",
                bytes.len()
            )));
        }
        bytes.truncate(n);
    }
    Ok(bytes)
}

fn algorithm(name: &str) -> Result<Algorithm> {
    Algorithm::from_name(name).map_err(invalid)
}

/// The keyed algorithms, checked and their keys read, as [`Options`] (journal mode).
struct Keyed {
    opts: Options,
    /// The journal cipher's kernel name.
    jcrypt: Option<String>,
}

fn keyed(k: &Keys) -> Result<Keyed> {
    refuse_inline(k.inline)?;
    let name = k.integrity.as_deref().unwrap_or("crc32c");
    let hash = algorithm(name)?;
    let mut opts = Options::new(hash);
    match (hash.keyed(), &k.integrity_key) {
        (true, Some(f)) => {
            let f = KeyFile {
                size: Some(f.size.unwrap_or(hash.digest_size())),
                ..f.clone()
            };
            opts.hash_key = Some(read_key_file(&f)?);
        }
        (true, None) => {
            return Err(invalid(format!(
                "--integrity {name} needs --integrity-key-file"
            )))
        }
        (false, Some(_)) => return Err(invalid(format!("--integrity {name} takes no key"))),
        (false, None) => {}
    }
    if let Some(j) = &k.journal_integrity {
        let alg = algorithm(j)?;
        let key = match &k.journal_integrity_key {
            Some(f) => Some(read_key_file(&KeyFile {
                size: Some(f.size.unwrap_or(alg.digest_size())),
                ..f.clone()
            })?),
            None if alg.keyed() => {
                return Err(invalid(format!(
                    "--journal-integrity {j} needs --journal-integrity-key-file"
                )))
            }
            None => None,
        };
        opts.journal_mac = Some((alg, key));
    } else if k.journal_integrity_key.is_some() {
        return Err(invalid(
            "--journal-integrity-key-file needs --journal-integrity",
        ));
    }
    let mut jcrypt = None;
    match (&k.journal_crypt, &k.journal_crypt_key) {
        (Some(alg), Some(f)) => {
            let kernel = kernel_cipher_name(alg).map_err(invalid)?;
            opts.journal_crypt = Some((kernel.clone(), read_key_file(f)?));
            jcrypt = Some(kernel);
        }
        (Some(alg), None) => {
            return Err(invalid(format!(
                "--journal-crypt {alg} needs --journal-crypt-key-file"
            )))
        }
        (None, Some(_)) => return Err(invalid("--journal-crypt-key-file needs --journal-crypt")),
        (None, None) => {}
    }
    Ok(Keyed { opts, jcrypt })
}

/// Format, dump and the metadata checks before `open` are one-off passes over a few
/// sectors: they keep the page cache (the served device follows `ucrypt open`'s setting).
fn open_dev(device: &str, read_only: bool) -> Result<Arc<dyn Backend>> {
    crate::open::open_device(
        &Device::parse(device),
        read_only,
        crate::open::Cache::Buffered,
    )
    .map_err(|e| e.with_kind(ErrorKind::Device))
}

/// `--data-device`, unless it names the device itself (integritysetup then formats and
/// opens one device, as without it).
fn separate_data(device: &str, data: Option<&String>) -> Option<String> {
    let data = data?;
    let canon = |p: &str| std::fs::canonicalize(p).ok();
    if data == device || (canon(data).is_some() && canon(data) == canon(device)) {
        return None;
    }
    Some(data.clone())
}

fn read_superblock(dev: &dyn Backend, device: &str) -> Result<Superblock> {
    let mut first = vec![0u8; 512];
    dev.read_at(&mut first, 0)
        .with_context(|| format!("reading {device}"))
        .map_err(|e| e.with_kind(ErrorKind::Device))?;
    Superblock::parse(&first).map_err(|e| {
        invalid(format!(
            "Device {device} is not a valid INTEGRITY device ({e})."
        ))
    })
}

/// `integritysetup dump`: the superblock as integritysetup prints it.
///
/// # Errors
/// A device that cannot be read ([`ErrorKind::Device`]), no dm-integrity superblock.
pub fn dump(device: &str) -> Result<String> {
    let dev = open_dev(device, true)?;
    Ok(read_superblock(&*dev, device)?.dump(device))
}

/// A format checked and ready: the options valid, the keys read, the device open. Run it
/// after the user confirmed.
pub struct PreparedFormat {
    dev: Arc<dyn Backend>,
    data: Option<Arc<dyn Backend>>,
    params: FormatParams,
    opts: Options,
    wipe: bool,
}

impl std::fmt::Debug for PreparedFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedFormat")
            .field("params", &self.params)
            .finish_non_exhaustive()
    }
}

/// What a format wrote.
#[derive(Debug, Clone)]
pub struct Formatted {
    /// The superblock.
    pub superblock: Superblock,
    /// Bytes of data wiped to make every tag valid (`None` with `--integrity-no-wipe`).
    pub wiped_bytes: Option<u64>,
}

/// Checks a format request, reads its keys and opens the device.
///
/// # Errors
/// Options integritysetup refuses, unreadable key files, a device that cannot be opened
/// for writing ([`ErrorKind::Device`]), `/dev/urandom` unreadable.
pub fn prepare_format(req: &FormatRequest) -> Result<PreparedFormat> {
    let Keyed { mut opts, jcrypt } = keyed(&req.keys)?;
    if req.bitmap_mode {
        if jcrypt.is_some() {
            return Err(invalid(
                "--integrity-bitmap-mode with --journal-crypt is not supported",
            ));
        }
        opts.mode = Mode::Bitmap;
    }
    let mut salt = [0u8; SALT_SIZE];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut salt))
        .context("reading /dev/urandom")?;
    let params = FormatParams {
        sector_size: req.sector_size.unwrap_or(512),
        tag_size: req.tag_size.unwrap_or(opts.hash.digest_size() as u32),
        journal_sectors: req.journal_size.map_or(0, |b| b / 512),
        interleave_sectors: req.interleave_sectors,
        journal_mac: opts.journal_mac.is_some(),
        keyed_or_hashed: true,
        fix_hmac: !req.legacy_hmac,
        fix_padding: !req.legacy_padding,
        bitmap_mode: req.bitmap_mode,
        sectors_per_bitmap_bit: req.sectors_per_bit,
        salt,
    };
    let dev = open_dev(&req.device, false)?;
    let data = match separate_data(&req.device, req.data_device.as_ref()) {
        Some(d) => {
            let data = open_dev(&d, false)?;
            if data.info().size_bytes < 512 {
                // integritysetup 2.6.1 says so of an empty data device, exit 1.
                return Err(invalid(format!(
                    "Header detected but device {d} is too small (the data device holds no \
                     sector)."
                )));
            }
            Some(data)
        }
        None => None,
    };
    Ok(PreparedFormat {
        dev,
        data,
        params,
        opts,
        wipe: !req.no_wipe,
    })
}

impl PreparedFormat {
    /// Writes the superblock and the empty journal (encrypted with `--journal-crypt`) and,
    /// unless `--integrity-no-wipe`, zeros with valid tags over the data.
    ///
    /// # Errors
    /// Parameters the kernel refuses, a device too small, I/O errors.
    pub fn run(self) -> Result<Formatted> {
        let sb = match self.data {
            Some(data) => format_separate(self.dev, data, &self.params, &self.opts, self.wipe)
                .map_err(|e| {
                    // The kernel refuses the table then: integritysetup exits 4.
                    Error::Invalid(format!("Cannot format integrity for device: {e}"))
                        .with_kind(ErrorKind::Device)
                })?,
            None => format(self.dev, &self.params, &self.opts, self.wipe)?,
        };
        Ok(Formatted {
            wiped_bytes: self.wipe.then_some(sb.provided_data_sectors * 512),
            superblock: sb,
        })
    }
}

fn hex(key: &[u8]) -> Zeroizing<String> {
    let mut s = Zeroizing::new(String::with_capacity(key.len() * 2));
    for b in key {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// `integritysetup open`'s table line for the device (`dmsetup table` shows it, keys in
/// hex), from its superblock and the options.
///
/// # Errors
/// A device that cannot be read ([`ErrorKind::Device`]), no superblock, modes that exclude
/// each other, keys missing or not wanted, an unknown algorithm or journal cipher.
pub fn open_table_line(req: &OpenRequest) -> Result<Zeroizing<String>> {
    let Keyed { opts, jcrypt } = keyed(&req.keys)?;
    let mode =
        match (req.no_journal, req.bitmap_mode, req.recovery) {
            (false, false, false) => 'J',
            (true, false, false) => 'D',
            (false, true, false) => 'B',
            (false, false, true) => 'R',
            _ => return Err(invalid(
                "--integrity-no-journal, --integrity-bitmap-mode and --integrity-recovery-mode \
                 exclude each other",
            )),
        };
    if mode == 'B' && jcrypt.is_some() {
        return Err(invalid(
            "--integrity-bitmap-mode with --journal-crypt is not supported",
        ));
    }
    let dev = open_dev(&req.device, true)?;
    let sb = read_superblock(&*dev, &req.device)?;
    let data = separate_data(&req.device, req.data_device.as_ref());
    let mut args: Vec<Zeroizing<String>> = Vec::new();
    match &data {
        Some(d) => {
            if !sb.separate_metadata() {
                return Err(invalid(format!(
                    "Device {} was formatted without a data device: it keeps its data beside \
                     its tags (interleave {} sectors); open it without --data-device.",
                    req.device,
                    1u64 << sb.log2_interleave_sectors
                ))
                .with_kind(ErrorKind::Device));
            }
            let data_dev = open_dev(d, true)?;
            let have = data_dev.info().size_bytes / 512;
            if have < sb.provided_data_sectors {
                return Err(invalid(format!(
                    "The data device {d} is too small: {have} sectors, the superblock of {} \
                     says {} (the kernel refuses the table).",
                    req.device, sb.provided_data_sectors
                ))
                .with_kind(ErrorKind::Device));
            }
            args.push(Zeroizing::new(format!("meta_device:{}", req.device)));
        }
        None if sb.separate_metadata() => {
            return Err(invalid(format!(
                "Device {} holds the superblock, journal and tags of a device with a separate \
                 data device; give it with --data-device.",
                req.device
            ))
            .with_kind(ErrorKind::Device));
        }
        None => {}
    }
    if sb.block_bytes() != 512 {
        args.push(Zeroizing::new(format!("block_size:{}", sb.block_bytes())));
    }
    for (k, v) in [
        ("buffer_sectors", req.buffer_sectors.map(u64::from)),
        ("journal_watermark", req.journal_watermark.map(u64::from)),
        ("commit_time", req.journal_commit_time.map(u64::from)),
        ("sectors_per_bit", req.sectors_per_bit),
        (
            "bitmap_flush_interval",
            req.bitmap_flush_time.map(u64::from),
        ),
    ] {
        if let Some(v) = v {
            args.push(Zeroizing::new(format!("{k}:{v}")));
        }
    }
    if req.recalculate {
        args.push(Zeroizing::new("recalculate".into()));
    }
    if req.legacy_recalculate {
        args.push(Zeroizing::new("legacy_recalculate".into()));
    }
    let keyed_arg = |what: &str, alg: &str, key: Option<&Zeroizing<Vec<u8>>>| match key {
        Some(k) => Zeroizing::new(format!("{what}:{alg}:{}", hex(k).as_str())),
        None => Zeroizing::new(format!("{what}:{alg}")),
    };
    args.push(keyed_arg(
        "internal_hash",
        opts.hash.kernel_name(),
        opts.hash_key.as_ref(),
    ));
    if let Some((name, key)) = &opts.journal_crypt {
        args.push(keyed_arg("journal_crypt", name, Some(key)));
    }
    if let Some((alg, key)) = &opts.journal_mac {
        args.push(keyed_arg("journal_mac", alg.kernel_name(), key.as_ref()));
    }
    let mut line = Zeroizing::new(format!(
        "0 {} integrity {} 0 {} {mode} {}",
        sb.provided_data_sectors,
        data.as_deref().unwrap_or(&req.device),
        sb.tag_size,
        args.len()
    ));
    for a in &args {
        line.push(' ');
        line.push_str(a);
    }
    line.push('\n');
    Ok(line)
}

/// [`open_table_line`] as the volume model: what `integritysetup open` hands to
/// [`crate::open::open_source`] or [`crate::instance::start`] (the keys stay in memory,
/// never on a command line or in a file).
///
/// # Errors
/// As [`open_table_line`].
pub fn open_table(req: &OpenRequest) -> Result<Mapping> {
    let line = open_table_line(req)?;
    Mapping::parse(&line).context("parsing the table")
}

/// What `integritysetup status` shows of an active standalone dm-integrity device, taken
/// when it is opened (from the table line and the superblock), as the kernel's table
/// status reports it to libcryptsetup.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Status {
    /// Tag bytes per block.
    pub tag_size: u32,
    /// The internal hash, as the kernel names it (`crc32c`, `hmac(sha256)`).
    pub integrity: String,
    /// Bytes per block.
    pub sector_size: u32,
    /// Data sectors between tag areas.
    pub interleave_sectors: u64,
    /// `J`, `D`, `B` or `R`.
    pub mode: String,
    /// The journal area in bytes (the kernel's `journal_sectors` times 512).
    pub journal_bytes: u64,
    /// Journal watermark in percent (mode J).
    pub journal_watermark: u32,
    /// Journal commit time in milliseconds (mode J).
    pub commit_time_ms: u32,
    /// 512-byte sectors per bitmap bit (mode B).
    pub sectors_per_bit: u64,
    /// Bitmap flush interval in milliseconds (mode B).
    pub bitmap_flush_ms: u32,
    /// The journal MAC, as the kernel names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal_integrity: Option<String>,
    /// The journal cipher, as the kernel names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal_crypt: Option<String>,
    /// The separate metadata device (`meta_device:`), when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_device: Option<String>,
}

/// The kernel's defaults for `commit_time` and `bitmap_flush_interval` (10 s).
const DEFAULT_MSEC: u32 = 10_000;

/// The one dm-integrity target with an internal hash that `mapping` serves by itself
/// (`integritysetup open`'s table), if that is what it is.
pub fn standalone_line(mapping: &ucrypt_format::Mapping) -> Option<&IntegrityLine> {
    match &mapping.tables[..] {
        [t] => match &t.targets[..] {
            [ucrypt_format::mapping::Target::Integrity(l)] if l.internal_hash.is_some() => Some(l),
            _ => None,
        },
        _ => None,
    }
}

/// Describes the standalone dm-integrity target `line` for `integritysetup status`: its
/// superblock read from the line's device, the line's options or the kernel's defaults.
///
/// # Errors
/// A device that cannot be read ([`ErrorKind::Device`]), no superblock, a superblock whose
/// data does not fit the device.
pub fn describe(line: &IntegrityLine) -> Result<Status> {
    use ucrypt_format::integrity::{
        log2_blocks_per_bitmap_bit, Geometry, DEFAULT_BUFFER_SECTORS, DEFAULT_JOURNAL_WATERMARK,
        SB_SECTORS,
    };
    let data_path = line.device.to_string();
    let device = line
        .meta_device
        .as_ref()
        .map_or_else(|| data_path.clone(), ToString::to_string);
    let dev = open_dev(&device, true)?;
    let off = line.offset.saturating_mul(512);
    let mut first = vec![0u8; 512];
    dev.read_at(&mut first, off)
        .with_context(|| format!("reading {device}"))
        .map_err(|e| e.with_kind(ErrorKind::Device))?;
    let sb = Superblock::parse(&first).map_err(|e| {
        invalid(format!(
            "Device {device} is not a valid INTEGRITY device ({e})."
        ))
    })?;
    let sectors = (dev.info().size_bytes.saturating_sub(off)) / 512;
    let buffer = line.buffer_sectors.unwrap_or(DEFAULT_BUFFER_SECTORS);
    let geo = match &line.meta_device {
        Some(_) => {
            let data = open_dev(&data_path, true)?;
            Geometry::new_separate(&sb, sectors, data.info().size_bytes / 512, buffer)
        }
        None => Geometry::new(&sb, sectors, buffer),
    }
    .map_err(|e| invalid(e.to_string()))?;
    let spb = 1u64 << sb.log2_sectors_per_block;
    let log2_bit = log2_blocks_per_bitmap_bit(&sb, line.sectors_per_bit.unwrap_or(0));
    Ok(Status {
        tag_size: u32::from(sb.tag_size),
        integrity: line
            .internal_hash
            .as_ref()
            .map(|(a, _)| a.clone())
            .unwrap_or_default(),
        sector_size: sb.block_bytes(),
        interleave_sectors: geo.interleave_sectors(),
        mode: line.mode.to_string(),
        journal_bytes: geo.initial_sectors.saturating_sub(SB_SECTORS) * 512,
        // Mode R's table has no journal watermark or commit time: libcryptsetup reads 0.
        journal_watermark: if line.mode == 'R' {
            0
        } else {
            line.journal_watermark.unwrap_or(DEFAULT_JOURNAL_WATERMARK)
        },
        commit_time_ms: if line.mode == 'R' {
            0
        } else {
            line.commit_time.unwrap_or(DEFAULT_MSEC)
        },
        sectors_per_bit: spb << log2_bit,
        bitmap_flush_ms: line.bitmap_flush_interval.unwrap_or(DEFAULT_MSEC),
        journal_integrity: line.journal_mac.as_ref().map(|(a, _)| a.clone()),
        journal_crypt: line.journal_crypt.as_ref().map(|(a, _)| a.clone()),
        metadata_device: line.meta_device.as_ref().map(|m| {
            let m = m.to_string();
            std::fs::canonicalize(&m).map_or(m, |p| p.display().to_string())
        }),
    })
}

/// An active standalone dm-integrity device, as `integritysetup status NAME` is told it.
#[derive(Debug, Clone, Copy)]
pub struct Active<'a> {
    /// The name.
    pub name: &'a str,
    /// Whether something has it open.
    pub in_use: bool,
    /// The device (or image) under it.
    pub device: &'a str,
    /// Its size in 512-byte sectors.
    pub size_sectors: u64,
    /// Served read-only.
    pub read_only: bool,
    /// Blocks whose tag did not match since it was opened.
    pub failures: u64,
    /// Discards passed down.
    pub allow_discards: bool,
}

impl Status {
    /// The lines `integritysetup status NAME` (cryptsetup 2.6.1) prints, in its wording
    /// (compared with its output on Linux 6.12 for modes J, D, B, a journal MAC and an
    /// encrypted journal: testdata/integrity/status). The device is the image itself,
    /// where integritysetup names the loop device it set up and then the image.
    pub fn text(&self, a: &Active<'_>) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{} is active{}.",
            a.name,
            if a.in_use { " and is in use" } else { "" }
        );
        let _ = writeln!(s, "  type:    INTEGRITY");
        let _ = writeln!(s, "  tag size: {}", self.tag_size);
        let integrity = if self.integrity.is_empty() {
            "(none)"
        } else {
            &self.integrity
        };
        let _ = writeln!(s, "  integrity: {integrity}");
        match &self.metadata_device {
            Some(m) => {
                let _ = writeln!(s, "  device:  {} (detached)", a.device);
                let _ = writeln!(s, "  metadata device:  {m}");
            }
            None => {
                let _ = writeln!(s, "  device:  {}", a.device);
            }
        }
        let _ = writeln!(s, "  sector size:  {} bytes", self.sector_size);
        let _ = writeln!(s, "  interleave sectors: {}", self.interleave_sectors);
        let _ = writeln!(s, "  size:    {} sectors", a.size_sectors);
        let _ = writeln!(
            s,
            "  mode:    {}{}",
            if a.read_only {
                "readonly"
            } else {
                "read/write"
            },
            if self.mode == "R" { " recovery" } else { "" }
        );
        let _ = writeln!(s, "  failures: {}", a.failures);
        if self.mode == "B" {
            let _ = writeln!(
                s,
                "  bitmap 512-byte sectors per bit: {}",
                self.sectors_per_bit
            );
            let _ = writeln!(s, "  bitmap flush interval: {} ms", self.bitmap_flush_ms);
        }
        // Bitmap mode has no journal either (Linux 6.12's integritysetup 2.6.1 says so).
        if self.mode == "D" || self.mode == "B" {
            let _ = writeln!(s, "  journal: not active");
        } else {
            let _ = writeln!(s, "  journal size: {} bytes", self.journal_bytes);
            let _ = writeln!(s, "  journal watermark: {}%", self.journal_watermark);
            let _ = writeln!(s, "  journal commit time: {} ms", self.commit_time_ms);
            if let Some(m) = &self.journal_integrity {
                let _ = writeln!(s, "  journal integrity MAC: {m}");
            }
            if let Some(c) = &self.journal_crypt {
                let _ = writeln!(s, "  journal encryption: {c}");
            }
        }
        if a.allow_discards {
            let _ = writeln!(s, "  flags: discards ");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn kind(e: &Error) -> ErrorKind {
        e.kind()
    }

    #[test]
    fn inline_is_refused_with_the_reason() {
        let req = OpenRequest {
            device: "/nonexistent".into(),
            keys: Keys {
                inline: true,
                ..Keys::default()
            },
            ..OpenRequest::default()
        };
        let e = open_table_line(&req).unwrap_err();
        assert!(e.to_string().contains("per-sector metadata"), "{e}");
        assert_eq!(kind(&e), ErrorKind::Invalid);
    }

    #[test]
    fn option_checks_come_before_the_device() {
        let tmp = tempfile::tempdir().unwrap();
        let key = tmp.path().join("k");
        std::fs::write(&key, [7u8; 64]).unwrap();
        let kf = KeyFile {
            path: key.display().to_string(),
            size: None,
        };
        let cases: Vec<(Keys, &str)> = vec![
            (
                Keys {
                    integrity: Some("hmac-sha256".into()),
                    ..Keys::default()
                },
                "needs --integrity-key-file",
            ),
            (
                Keys {
                    integrity_key: Some(kf.clone()),
                    ..Keys::default()
                },
                "takes no key",
            ),
            (
                Keys {
                    journal_crypt: Some("ctr-aes".into()),
                    ..Keys::default()
                },
                "needs --journal-crypt-key-file",
            ),
            (
                Keys {
                    journal_crypt: Some("salsa20".into()),
                    journal_crypt_key: Some(kf.clone()),
                    ..Keys::default()
                },
                "\"salsa20\" is not supported",
            ),
            (
                Keys {
                    journal_crypt_key: Some(kf),
                    ..Keys::default()
                },
                "needs --journal-crypt",
            ),
        ];
        for (keys, want) in cases {
            let req = OpenRequest {
                device: "/nonexistent".into(),
                keys,
                ..OpenRequest::default()
            };
            let e = open_table_line(&req).unwrap_err();
            assert!(e.to_string().contains(want), "{e} (wanted {want})");
            assert_eq!(kind(&e), ErrorKind::Invalid);
        }
        let req = OpenRequest {
            device: "/nonexistent".into(),
            no_journal: true,
            recovery: true,
            ..OpenRequest::default()
        };
        assert!(open_table_line(&req)
            .unwrap_err()
            .to_string()
            .contains("exclude each other"));
        // A missing device is a device error (integritysetup's exit code 4).
        let req = OpenRequest {
            device: tmp.path().join("none").display().to_string(),
            ..OpenRequest::default()
        };
        assert_eq!(kind(&open_table_line(&req).unwrap_err()), ErrorKind::Device);
    }

    /// Format with an encrypted journal, then the table line names the kernel's cipher and
    /// the key, and the device opens through it with that journal.
    #[test]
    fn format_then_open_line_with_journal_crypt() {
        let tmp = tempfile::tempdir().unwrap();
        let img = tmp.path().join("img");
        std::fs::File::create(&img)
            .unwrap()
            .set_len(4 << 20)
            .unwrap();
        let key = tmp.path().join("jk");
        std::fs::write(&key, [0x40u8; 32]).unwrap();
        let keys = Keys {
            journal_crypt: Some("ctr-aes".into()),
            journal_crypt_key: Some(KeyFile {
                path: key.display().to_string(),
                size: Some(32),
            }),
            ..Keys::default()
        };
        let done = prepare_format(&FormatRequest {
            device: img.display().to_string(),
            keys: keys.clone(),
            no_wipe: true,
            ..FormatRequest::default()
        })
        .unwrap()
        .run()
        .unwrap();
        assert_eq!(done.wiped_bytes, None);
        assert_eq!(done.superblock.tag_size, 4);
        let req = OpenRequest {
            device: img.display().to_string(),
            keys,
            ..OpenRequest::default()
        };
        let line = open_table_line(&req).unwrap();
        // The mapping `integritysetup open` serves is that line, keys included.
        assert_eq!(
            open_table(&req).unwrap().to_lines(true),
            vec![line.trim_end().to_string()]
        );
        let want = format!("journal_crypt:ctr(aes):{}", "40".repeat(32));
        assert!(line.contains(&want), "{}", line.as_str());
        assert!(line.starts_with(&format!(
            "0 {} integrity {} 0 4 J 2 internal_hash:crc32c ",
            done.superblock.provided_data_sectors,
            img.display()
        )));
        let dump = dump(&img.display().to_string()).unwrap();
        assert!(dump.contains("integrity_tag_size 4"), "{dump}");
    }
}
