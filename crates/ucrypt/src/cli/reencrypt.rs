//! `ucrypt reencrypt DEV`: LUKS2 re-keying (new volume key, optionally a new cipher, key
//! size or sector size), offline, with cryptsetup's options and on-disk metadata, so that
//! `cryptsetup reencrypt --resume-only` can finish what ucrypt started and the reverse.
//! The metadata set-up is libcryptsetup's; the data pass is ucrypt's
//! ([`ucrypt::reencrypt`]).

use super::luks::{CsResult, DeviceArgs};
use super::luks_add_key::PbkdfArgs;
use super::progress;
use super::secret::{self, KeyFileArgs};
use super::{CliError, WithCode, EXIT_PARAMS};
use anyhow::anyhow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use ucrypt::reencrypt::{Outcome, Run, RunOptions, DEFAULT_MAX_HOTZONE};
use ucrypt_cryptsetup::{HeaderType, KeyslotStatus, ReencryptInit};

/// Arguments of `ucrypt reencrypt`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    dev: DeviceArgs,
    #[command(flatten)]
    key: KeyFileArgs,
    /// The keyslot whose passphrase is kept (the volume's other keyslots are removed at
    /// the end, as cryptsetup does); needed when the volume has several.
    #[arg(short = 'S', long)]
    key_slot: Option<u32>,
    /// New cipher (default: the current one).
    #[arg(short = 'c', long)]
    cipher: Option<String>,
    /// New key size in bits (default: the current one).
    #[arg(short = 's', long)]
    key_size: Option<u32>,
    /// New encryption sector size (default: the current one).
    #[arg(long)]
    sector_size: Option<u32>,
    /// How an interrupted hotzone is recovered: checksum, journal or none.
    #[arg(long, default_value = "checksum", value_parser = ["checksum", "journal", "none"])]
    resilience: String,
    /// Hash of the checksum resilience.
    #[arg(long, default_value = "sha256")]
    resilience_hash: String,
    /// Largest hotzone (bytes; K, M, G suffixes are binary units).
    #[arg(long, value_parser = parse_size)]
    hotzone_size: Option<u64>,
    /// Only write the reencryption metadata; do not touch data.
    #[arg(long, conflicts_with = "resume_only")]
    init_only: bool,
    /// Only resume a reencryption already in the metadata.
    #[arg(long)]
    resume_only: bool,
    /// Do not take ucrypt's image locks (a private image nobody else opens).
    #[arg(long)]
    disable_locks: bool,
    #[command(flatten)]
    progress: progress::ProgressArgs,
    /// Accepted for cryptsetup compatibility (ucrypt's reencryption is offline).
    #[arg(long, hide = true)]
    force_offline_reencrypt: bool,
    /// Encrypt a plain device (not supported yet).
    #[arg(long, hide = true)]
    encrypt: bool,
    /// Decrypt (not supported yet).
    #[arg(long, hide = true)]
    decrypt: bool,
    /// Data shift (not supported yet).
    #[arg(long, hide = true)]
    reduce_device_size: Option<String>,
    /// Keep the volume key, change other parameters (not supported yet).
    #[arg(long, hide = true)]
    keep_key: bool,
    /// Online reencryption of an active mapping (not supported: re-encrypt offline).
    #[arg(long, hide = true, value_name = "NAME")]
    active_name: Option<String>,
    /// Use only this much of the device (not supported yet).
    #[arg(long, hide = true, value_name = "SIZE")]
    device_size: Option<String>,
    /// LUKS1 reencryption block size in MiB (LUKS1 only; ucrypt re-encrypts LUKS2).
    #[arg(long, hide = true, value_name = "MIB")]
    block_size: Option<String>,
    /// LUKS1 reencryption with O_DIRECT (LUKS1 only).
    #[arg(long, hide = true)]
    use_directio: bool,
    /// LUKS1 reencryption with fsync after every block (LUKS1 only).
    #[arg(long, hide = true)]
    use_fsync: bool,
    /// LUKS1 reencryption log updated after every block (LUKS1 only).
    #[arg(long, hide = true)]
    write_log: bool,
    /// Stop cleanly after this many bytes (tests: a reproducible interruption).
    #[arg(long, hide = true, value_parser = parse_size)]
    debug_stop_after: Option<u64>,
    #[command(flatten)]
    pbkdf: PbkdfArgs,
    /// Do not ask for confirmation.
    #[arg(short = 'q', long = "batch-mode")]
    batch: bool,
}

/// `4096`, `8S`, `4K`, `16M`, `1G` (S = 512-byte sectors, binary units, as cryptsetup's
/// size arguments).
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mul) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'S' => 512u64,
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("unknown size unit in \"{s}\"")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("\"{s}\" is not a size (bytes, or K/M/G)"))?;
    n.checked_mul(mul)
        .ok_or_else(|| format!("\"{s}\" is too large"))
}

/// Writes the initial metadata through libcryptsetup.
fn initialise(a: &Args, passphrase: &[u8]) -> Result<(), CliError> {
    let mut cd = a.dev.load(ucrypt::header::VolumeType::Luks2)?;
    let info = cd.info();
    if info.kind != Some(HeaderType::Luks2) {
        return Err(anyhow!(
            "{} is not LUKS2 (reencryption needs LUKS2)",
            a.dev.device.display()
        ))
        .code(EXIT_PARAMS);
    }
    let active: Vec<u32> = (0..32)
        .filter(|&s| {
            matches!(
                cd.keyslot_status(s),
                KeyslotStatus::Active | KeyslotStatus::ActiveLast
            )
        })
        .collect();
    if active.len() > 1 && a.key_slot.is_none() {
        return Err(anyhow!(
            "{} has {} keyslots ({}); name the one to keep with --key-slot (the others are \
             removed when the reencryption finishes, as with cryptsetup reencrypt --key-slot)",
            a.dev.device.display(),
            active.len(),
            active
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .code(EXIT_PARAMS);
    }
    let old_slot = cd.check_passphrase(a.key_slot, passphrase).cs()?;
    a.pbkdf.apply(&mut cd)?;
    let key_bytes = match a.key_size {
        Some(bits) if bits % 8 == 0 && bits > 0 => bits as usize / 8,
        Some(bits) => {
            return Err(anyhow!(
                "key size {bits} is not a positive multiple of 8 bits"
            ))
            .code(EXIT_PARAMS)
        }
        None => info.key_bytes,
    };
    let new_slot = cd
        .add_keyslot_new_unbound_key(None, key_bytes, passphrase)
        .cs()?;
    let params = ReencryptInit {
        cipher: a.cipher.clone().unwrap_or_else(|| info.cipher_spec()),
        sector_size: a.sector_size.unwrap_or(info.sector_size),
        resilience: a.resilience.clone(),
        hash: Some(a.resilience_hash.clone()),
        max_hotzone_sectors: a.hotzone_size.unwrap_or(0) / 512,
    };
    if let Err(e) = cd.reencrypt_init(Some(old_slot), new_slot, passphrase, &params) {
        // Leave the header as it was.
        let _ = cd.destroy_keyslot(new_slot);
        return Err(e).cs();
    }
    Ok(())
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    if a.block_size.is_some() || a.use_directio || a.use_fsync || a.write_log {
        return Err(anyhow!(
            "reencrypt --block-size, --use-directio, --use-fsync and --write-log are \
             cryptsetup's LUKS1 reencryption options; ucrypt re-encrypts LUKS2 only \
             (`ucrypt convert --type luks2` first)"
        ))
        .code(EXIT_PARAMS);
    }
    if a.active_name.is_some() {
        return Err(anyhow!(
            "reencrypt --active-name (online reencryption of a served volume) is not \
             supported yet; close the volume and run `ucrypt reencrypt DEV` offline"
        ))
        .code(EXIT_PARAMS);
    }
    if a.keep_key || a.device_size.is_some() {
        return Err(anyhow!(
            "reencrypt --keep-key and --device-size are not supported yet (ucrypt re-keys \
             the whole LUKS2 data area with a new volume key)"
        ))
        .code(EXIT_PARAMS);
    }
    if a.encrypt || a.decrypt || a.reduce_device_size.is_some() {
        return Err(anyhow!(
            "reencrypt --encrypt, --decrypt and --reduce-device-size are not supported yet \
             (ucrypt re-keys LUKS2 volumes in place)"
        ))
        .code(EXIT_PARAMS);
    }
    if ucrypt::remote_header::is_remote(&a.dev.device)
        || a.dev
            .header
            .as_deref()
            .is_some_and(ucrypt::remote_header::is_remote)
    {
        return Err(anyhow!("reencrypt of an NBD export is not supported yet")).code(EXIT_PARAMS);
    }
    let _claimed = if a.disable_locks {
        Vec::new()
    } else {
        super::instance::claim_for_header_change(&a.dev)?
    };
    let passphrase = secret::existing(&a.key, &a.dev.device)?;
    let path = a.dev.device.clone();
    let header_path = a.dev.header_path().to_path_buf();
    let in_progress = {
        let f = std::fs::File::open(&header_path)
            .map_err(|e| anyhow!("opening {}: {e}", header_path.display()))
            .code(super::EXIT_DEVICE)?;
        let h = ucrypt_format::luks2::disk::Header::read(&f, &header_path.display().to_string())
            .cs()?;
        ucrypt_format::luks2::reencrypt::in_reencryption(&h.json)
    };
    if in_progress && a.init_only {
        return Err(anyhow!(
            "LUKS2 reencryption already initialized in metadata"
        ))
        .code(EXIT_PARAMS);
    }
    if !in_progress {
        if a.resume_only {
            return Err(anyhow!("{} is not in LUKS2 reencryption", path.display()))
                .code(EXIT_PARAMS);
        }
        initialise(&a, &passphrase)?;
        if a.init_only {
            return Ok(());
        }
    }
    // Signals stop the pass between hotzones with consistent metadata.
    let stop_signal = progress::StopOnSignal::new();
    let stop = AtomicBool::new(false);
    let mut r = match &a.dev.header {
        Some(h) => Run::open_detached(h, &path, &passphrase),
        None => Run::open(&path, &passphrase),
    }
    .cs()?;
    drop(passphrase);
    let opts = RunOptions {
        max_hotzone: a.hotzone_size.unwrap_or(DEFAULT_MAX_HOTZONE).max(4096),
        stop_after: a.debug_stop_after,
    };
    let start = Instant::now();
    let first = r.done();
    let device = path.display().to_string();
    let mut bar = progress::Bytes::new(
        &a.progress,
        "Reencrypting",
        &device,
        r.device_size() - first,
    );
    let mut last_done = first;
    let mut report = |done: u64, _size: u64| {
        last_done = done;
        if stop_signal.stopped() {
            stop.store(true, Ordering::Relaxed);
        }
        bar.set(done - first);
    };
    let outcome = r.run(&opts, &stop, &mut report);
    let done = last_done - first;
    match &outcome {
        Ok(Outcome::Finished) => bar.finish(),
        _ => bar.abandon(),
    }
    let outcome = outcome.cs()?;
    let quiet_lines = a.progress.progress_json || a.progress.progress_frequency.is_some();
    let secs = start.elapsed().as_secs_f64();
    if outcome == Outcome::Finished {
        if !quiet_lines {
            eprintln!("{}", progress::summary_line("Finished", done, secs));
        }
        return Ok(());
    }
    eprintln!("{}", progress::summary_line("Interrupted", done, secs));
    eprintln!(
        "Reencryption of {device} stopped at {last_done} of {} bytes; resume with `ucrypt \
         reencrypt --resume-only` (or cryptsetup's).",
        r.device_size()
    );
    if stop_signal.stopped() {
        return Err(anyhow!("interrupted")).code(EXIT_PARAMS);
    }
    Ok(())
}
