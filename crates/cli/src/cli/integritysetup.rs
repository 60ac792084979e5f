//! `ucrypt integritysetup dump|format|open DEVICE`: standalone dm-integrity, as cryptsetup's
//! `integritysetup` (2.6) does it, with `ucrypt-integrity` in place of the kernel.
//!
//! `format` writes what the kernel writes when `integritysetup format` activates its
//! temporary table (superblock, empty journal) and then, unless `--integrity-no-wipe`,
//! zeros with valid tags over the data; `dump` prints the superblock as integritysetup does;
//! `open` builds the kernel's table line from the superblock and the options and runs
//! `ucrypt open` on it (the line through a pipe, so no key is on a command line).

use super::secret::confirm;
use super::{CliError, WithCode, EXIT_DEVICE, EXIT_PARAMS};
use anyhow::{anyhow, Context};
use std::io::Read;
use ucrypt::integrity::{Algorithm, FormatParams, Mode, Options, Superblock, SALT_SIZE};
use ucrypt::open::Device;
use zeroize::Zeroizing;

/// Arguments of `ucrypt integritysetup`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    action: Action,
    /// Do not ask for confirmation (also before the action, as cryptsetup's global -q).
    #[arg(short = 'q', long = "batch-mode", global = true)]
    batch_mode: bool,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Print the dm-integrity superblock (integritysetup dump).
    Dump {
        /// The device or image.
        device: String,
    },
    /// Format a device for dm-integrity (integritysetup format).
    Format(Box<FormatArgs>),
    /// Serve a dm-integrity device (integritysetup open) over NBD in the foreground, as
    /// `ucrypt open` serves a table; options of `ucrypt open` go after `--`. Named
    /// instances (NAME) are refused for now.
    Open(Box<OpenArgs>),
}

/// Arguments of `ucrypt integritysetup open`.
#[derive(clap::Args)]
struct OpenArgs {
    /// The device or image.
    device: String,
    /// Instance name (refused for now: named instances describe crypt targets only).
    name: Option<String>,
    /// Internal hash (must be the one the device was formatted with).
    #[arg(long = "integrity", short = 'I', default_value = "crc32c")]
    integrity: String,
    /// Key of an HMAC internal hash, read from this file.
    #[arg(long = "integrity-key-file")]
    integrity_key_file: Option<String>,
    /// Bytes of that key to read (default: the hash's digest size).
    #[arg(long = "integrity-key-size")]
    integrity_key_size: Option<usize>,
    /// Journal MAC (when the device has one).
    #[arg(long = "journal-integrity")]
    journal_integrity: Option<String>,
    /// Key of the journal MAC, read from this file.
    #[arg(long = "journal-integrity-key-file")]
    journal_integrity_key_file: Option<String>,
    /// Bytes of that key to read.
    #[arg(long = "journal-integrity-key-size")]
    journal_integrity_key_size: Option<usize>,
    /// Direct writes (mode D): no journal, a crash can leave blocks whose tag fails.
    #[arg(long = "integrity-no-journal", short = 'D')]
    no_journal: bool,
    /// Bitmap mode (B).
    #[arg(long = "integrity-bitmap-mode", short = 'B')]
    bitmap_mode: bool,
    /// Recovery mode (R): read-only, tags not checked, journal not replayed.
    #[arg(long = "integrity-recovery-mode", short = 'R')]
    recovery: bool,
    /// Recompute every tag from the data.
    #[arg(long = "integrity-recalculate")]
    recalculate: bool,
    /// Allow recalculating HMAC tags (the kernel refuses it by default).
    #[arg(long = "integrity-legacy-recalculate")]
    legacy_recalculate: bool,
    /// Tag buffer sectors (the kernel's buffer_sectors).
    #[arg(long = "buffer-sectors")]
    buffer_sectors: Option<u32>,
    /// Journal watermark in percent.
    #[arg(long = "journal-watermark")]
    journal_watermark: Option<u32>,
    /// Journal commit time in milliseconds (accepted; ucrypt commits on flush and FUA).
    #[arg(long = "journal-commit-time")]
    journal_commit_time: Option<u32>,
    /// Sectors per bitmap bit (bitmap mode).
    #[arg(long = "bitmap-sectors-per-bit")]
    sectors_per_bit: Option<u64>,
    /// Bitmap flush interval in milliseconds (accepted; ucrypt clears the bitmap on flush).
    #[arg(long = "bitmap-flush-time")]
    bitmap_flush_time: Option<u32>,
    /// Serve read-only.
    #[arg(long = "read-only", short = 'r')]
    read_only: bool,
    /// Options for `ucrypt open` (`--device ublk`, `--socket PATH`, `--foreground`...).
    #[arg(last = true)]
    open_args: Vec<String>,
}

/// Arguments of `ucrypt integritysetup format`.
#[derive(clap::Args)]
struct FormatArgs {
    /// The device or image.
    device: String,
    /// Internal hash: crc32c (default), crc32, sha1, sha256, sha512, hmac-sha1,
    /// hmac-sha256, hmac-sha512.
    #[arg(long = "integrity", short = 'I', default_value = "crc32c")]
    integrity: String,
    /// Key of an HMAC internal hash, read from this file.
    #[arg(long = "integrity-key-file")]
    integrity_key_file: Option<String>,
    /// Bytes of that key to read (default: the hash's digest size).
    #[arg(long = "integrity-key-size")]
    integrity_key_size: Option<usize>,
    /// Tag bytes per block (default: the hash's digest size). No `-t`: that is ucrypt's
    /// global `--timeout`.
    #[arg(long = "tag-size")]
    tag_size: Option<u32>,
    /// Bytes per block: 512, 1024, 2048 or 4096.
    #[arg(long = "sector-size", short = 's', default_value_t = 512)]
    sector_size: u32,
    /// Data sectors between tag areas (default 32768).
    #[arg(long = "interleave-sectors", default_value_t = 0)]
    interleave_sectors: u32,
    /// Journal size in bytes (default: the kernel's, 1/128 of the device up to 64 MiB).
    #[arg(long = "journal-size", short = 'j')]
    journal_size: Option<u64>,
    /// Journal MAC: hmac-sha1, hmac-sha256 or hmac-sha512.
    #[arg(long = "journal-integrity")]
    journal_integrity: Option<String>,
    /// Key of the journal MAC, read from this file.
    #[arg(long = "journal-integrity-key-file")]
    journal_integrity_key_file: Option<String>,
    /// Bytes of that key to read.
    #[arg(long = "journal-integrity-key-size")]
    journal_integrity_key_size: Option<usize>,
    /// Journal encryption (refused: not supported yet).
    #[arg(long = "journal-crypt")]
    journal_crypt: Option<String>,
    /// Do not wipe the data area (its tags are then invalid until written).
    #[arg(long = "integrity-no-wipe")]
    no_wipe: bool,
    /// The legacy 128 KiB metadata padding (volumes made before Linux 4.19).
    #[arg(long = "integrity-legacy-padding")]
    legacy_padding: bool,
    /// Tags and journal MAC without the superblock's salt (before Linux 5.11).
    #[arg(long = "integrity-legacy-hmac")]
    legacy_hmac: bool,
    /// Format for bitmap mode (superblock version 3).
    #[arg(long = "integrity-bitmap-mode", short = 'B')]
    bitmap_mode: bool,
    /// Sectors per bitmap bit (bitmap mode; default 32768).
    #[arg(long = "bitmap-sectors-per-bit")]
    sectors_per_bit: Option<u64>,
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    match a.action {
        Action::Dump { device } => dump(&device),
        Action::Format(f) => format(*f, a.batch_mode),
        Action::Open(o) => open(*o),
    }
}

fn dump(device: &str) -> Result<(), CliError> {
    let dev = ucrypt::open::open_device(&Device::parse(device), true, false).code(EXIT_DEVICE)?;
    let mut first = vec![0u8; 512];
    dev.read_at(&mut first, 0)
        .with_context(|| format!("reading {device}"))
        .code(EXIT_DEVICE)?;
    let sb = Superblock::parse(&first)
        .map_err(|e| anyhow!("Device {device} is not a valid INTEGRITY device ({e})."))
        .code(EXIT_PARAMS)?;
    print!("{}", sb.dump(device));
    Ok(())
}

/// Up to `size` bytes of a key file (all of it without `size`).
fn key_file(path: &str, size: Option<usize>) -> Result<Zeroizing<Vec<u8>>, CliError> {
    let mut f = std::fs::File::open(path)
        .with_context(|| format!("opening key file {path}"))
        .code(EXIT_PARAMS)?;
    let mut key = Zeroizing::new(Vec::new());
    f.read_to_end(&mut key)
        .with_context(|| format!("reading key file {path}"))
        .code(EXIT_PARAMS)?;
    if let Some(n) = size {
        if key.len() < n {
            return Err(anyhow!(
                "key file {path} holds {} bytes, {n} asked for",
                key.len()
            ))
            .code(EXIT_PARAMS);
        }
        key.truncate(n);
    }
    Ok(key)
}

fn algorithm(name: &str) -> Result<Algorithm, CliError> {
    Algorithm::from_name(name)
        .map_err(|e| anyhow!(e))
        .code(EXIT_PARAMS)
}

fn format(a: FormatArgs, batch: bool) -> Result<(), CliError> {
    if a.journal_crypt.is_some() {
        return Err(anyhow!("--journal-crypt is not supported yet")).code(EXIT_PARAMS);
    }
    let hash = algorithm(&a.integrity)?;
    let mut opts = Options::new(hash);
    if hash.keyed() {
        let file = a
            .integrity_key_file
            .as_deref()
            .ok_or_else(|| anyhow!("--integrity {} needs --integrity-key-file", a.integrity))
            .code(EXIT_PARAMS)?;
        opts.hash_key = Some(key_file(
            file,
            Some(a.integrity_key_size.unwrap_or(hash.digest_size())),
        )?);
    } else if a.integrity_key_file.is_some() {
        return Err(anyhow!("--integrity {} takes no key", a.integrity)).code(EXIT_PARAMS);
    }
    if let Some(j) = &a.journal_integrity {
        let alg = algorithm(j)?;
        let key = match &a.journal_integrity_key_file {
            Some(f) => Some(key_file(
                f,
                Some(a.journal_integrity_key_size.unwrap_or(alg.digest_size())),
            )?),
            None if alg.keyed() => {
                return Err(anyhow!(
                    "--journal-integrity {j} needs --journal-integrity-key-file"
                ))
                .code(EXIT_PARAMS)
            }
            None => None,
        };
        opts.journal_mac = Some((alg, key));
    }
    if a.bitmap_mode {
        opts.mode = Mode::Bitmap;
    }
    let mut salt = [0u8; SALT_SIZE];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut salt))
        .context("reading /dev/urandom")?;
    let params = FormatParams {
        sector_size: a.sector_size,
        tag_size: a.tag_size.unwrap_or(hash.digest_size() as u32),
        journal_sectors: a.journal_size.map_or(0, |b| b / 512),
        interleave_sectors: a.interleave_sectors,
        journal_mac: opts.journal_mac.is_some(),
        keyed_or_hashed: true,
        fix_hmac: !a.legacy_hmac,
        fix_padding: !a.legacy_padding,
        bitmap_mode: a.bitmap_mode,
        sectors_per_bitmap_bit: a.sectors_per_bit,
        salt,
    };
    let dev =
        ucrypt::open::open_device(&Device::parse(&a.device), false, false).code(EXIT_DEVICE)?;
    confirm(
        batch,
        &format!("This will overwrite data on {} irrevocably", a.device),
    )?;
    let sb = ucrypt::integrity::format(dev, &params, &opts, !a.no_wipe)
        .with_context(|| format!("formatting {}", a.device))?;
    println!(
        "Formatted with tag size {}, internal integrity {}.",
        sb.tag_size, a.integrity
    );
    if !a.no_wipe {
        println!(
            "Wiped {} bytes of data to initialize the integrity tags.",
            sb.provided_data_sectors * 512
        );
    }
    Ok(())
}

fn hex(key: &[u8]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

/// The kernel's table line for the device, as integritysetup builds it from the superblock
/// and the options (`dmsetup table` shows it), keys in hex.
fn open_line(a: &OpenArgs) -> Result<Zeroizing<String>, CliError> {
    let dev =
        ucrypt::open::open_device(&Device::parse(&a.device), true, false).code(EXIT_DEVICE)?;
    let mut first = vec![0u8; 512];
    dev.read_at(&mut first, 0)
        .with_context(|| format!("reading {}", a.device))
        .code(EXIT_DEVICE)?;
    let sb = Superblock::parse(&first)
        .map_err(|e| anyhow!("Device {} is not a valid INTEGRITY device ({e}).", a.device))
        .code(EXIT_PARAMS)?;
    let hash = algorithm(&a.integrity)?;
    let mode = match (a.no_journal, a.bitmap_mode, a.recovery) {
        (false, false, false) => 'J',
        (true, false, false) => 'D',
        (false, true, false) => 'B',
        (false, false, true) => 'R',
        _ => {
            return Err(anyhow!(
                "--integrity-no-journal, --integrity-bitmap-mode and --integrity-recovery-mode \
                 exclude each other"
            ))
            .code(EXIT_PARAMS)
        }
    };
    let mut args: Vec<String> = Vec::new();
    if sb.block_bytes() != 512 {
        args.push(format!("block_size:{}", sb.block_bytes()));
    }
    for (k, v) in [
        ("buffer_sectors", a.buffer_sectors.map(u64::from)),
        ("journal_watermark", a.journal_watermark.map(u64::from)),
        ("commit_time", a.journal_commit_time.map(u64::from)),
        ("sectors_per_bit", a.sectors_per_bit),
        ("bitmap_flush_interval", a.bitmap_flush_time.map(u64::from)),
    ] {
        if let Some(v) = v {
            args.push(format!("{k}:{v}"));
        }
    }
    if a.recalculate {
        args.push("recalculate".into());
    }
    if a.legacy_recalculate {
        args.push("legacy_recalculate".into());
    }
    let mut line = Zeroizing::new(String::new());
    let keyed = |what: &str, alg: Algorithm, file: &Option<String>, size: Option<usize>| match (
        alg.keyed(),
        file,
    ) {
        (true, Some(f)) => {
            let key = key_file(f, Some(size.unwrap_or(alg.digest_size())))?;
            Ok(format!("{what}:{}:{}", alg.kernel_name(), hex(&key)))
        }
        (true, None) => Err(anyhow!("{} needs a key file", alg.kernel_name())).code(EXIT_PARAMS),
        (false, Some(_)) => Err(anyhow!("{} takes no key", alg.kernel_name())).code(EXIT_PARAMS),
        (false, None) => Ok(format!("{what}:{}", alg.kernel_name())),
    };
    let mut secret_args = vec![Zeroizing::new(keyed(
        "internal_hash",
        hash,
        &a.integrity_key_file,
        a.integrity_key_size,
    )?)];
    if let Some(j) = &a.journal_integrity {
        secret_args.push(Zeroizing::new(keyed(
            "journal_mac",
            algorithm(j)?,
            &a.journal_integrity_key_file,
            a.journal_integrity_key_size,
        )?));
    }
    line.push_str(&format!(
        "0 {} integrity {} 0 {} {mode} {}",
        sb.provided_data_sectors,
        a.device,
        sb.tag_size,
        args.len() + secret_args.len()
    ));
    for x in args
        .iter()
        .map(String::as_str)
        .chain(secret_args.iter().map(|s| s.as_str()))
    {
        line.push(' ');
        line.push_str(x);
    }
    line.push('\n');
    Ok(line)
}

/// `integritysetup open`: the table line, handed to `ucrypt open` through a pipe (the keys
/// never on a command line or on disk).
fn open(a: OpenArgs) -> Result<(), CliError> {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    if let Some(n) = &a.name {
        // The instance machinery (status, close, resize) describes crypt targets only.
        return Err(anyhow!(
            "integritysetup open {n}: named instances of a dm-integrity device are not \
             supported yet; serve it in the foreground (integritysetup open {} -- --socket \
             PATH, or --listen)",
            a.device
        ))
        .code(EXIT_PARAMS);
    }
    let line = open_line(&a)?;
    let (reader, mut writer) = std::io::pipe().context("creating a pipe")?;
    writer
        .write_all(line.as_bytes())
        .context("writing the table to the pipe")?;
    drop(writer);
    let mut argv: Vec<String> = vec![
        "ucrypt".into(),
        "open".into(),
        "--table-file".into(),
        format!("/dev/fd/{}", reader.as_raw_fd()),
    ];
    if a.read_only {
        argv.push("--read-only".into());
    }
    argv.extend(a.open_args.iter().cloned());
    super::run_open_args(argv, reader)
}
