//! `ucrypt luksFormat <device> [<key file>]`: a new LUKS1 or LUKS2 header through
//! libcryptsetup, with cryptsetup's defaults (LUKS2, aes-xts-plain64, 512-bit key,
//! argon2id for LUKS2 and pbkdf2 for LUKS1, sector size chosen by the library).

use super::exit::lib_error;
use super::luks::{verbose, CsResult, DeviceArgs};
use super::progress::{self, ProgressArgs};
use super::secret::{self, KeyFileArgs};
use super::{CliError, WithCode, EXIT_PARAMS};
use std::path::PathBuf;
use ucrypt::luks::{format, LuksFormat};

/// Arguments of `ucrypt luksFormat`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    dev: DeviceArgs,
    /// Key file with the new passphrase (same as --key-file).
    new_key_file: Option<PathBuf>,
    #[command(flatten)]
    key: KeyFileArgs,
    /// luks2 (default) or luks1.
    #[arg(long = "type", short = 'M', default_value = "luks2", value_parser = ["luks", "luks1", "luks2"])]
    kind: String,
    /// Cipher spec.
    #[arg(short, long, default_value = "aes-xts-plain64")]
    cipher: String,
    /// Volume key size in bits (default 512 for XTS, 256 otherwise).
    #[arg(short = 's', long)]
    key_size: Option<u32>,
    /// Encryption sector size in bytes (LUKS2 only).
    #[arg(long)]
    sector_size: Option<u32>,
    /// Hash for PBKDF2 and the header digest (default sha256).
    #[arg(long)]
    hash: Option<String>,
    /// PBKDF: pbkdf2, argon2i, argon2id (default argon2id for LUKS2, pbkdf2 for LUKS1).
    #[arg(long, value_parser = ["pbkdf2", "argon2i", "argon2id"])]
    pbkdf: Option<String>,
    /// Fixed PBKDF iterations (time cost for Argon2), no benchmark.
    #[arg(long)]
    pbkdf_force_iterations: Option<u32>,
    /// Target PBKDF time in milliseconds when benchmarking.
    #[arg(short = 'i', long)]
    iter_time: Option<u32>,
    /// Argon2 memory cost in KiB.
    #[arg(long)]
    pbkdf_memory: Option<u32>,
    /// Argon2 parallel threads.
    #[arg(long)]
    pbkdf_parallel: Option<u32>,
    #[command(flatten)]
    keyslot_cipher: super::luks_add_key::KeyslotCipherArgs,
    /// LUKS2 JSON metadata area size (bytes; K/M suffixes): 16K..4M, a power of two.
    #[arg(long, value_name = "BYTES", value_parser = ucrypt::format::parse_size)]
    luks2_metadata_size: Option<u64>,
    /// LUKS2 keyslots area size (bytes; K/M suffixes): a multiple of 4 KiB, at most 128M.
    #[arg(long, value_name = "BYTES", value_parser = ucrypt::format::parse_size)]
    luks2_keyslots_size: Option<u64>,
    /// Take the volume key from /dev/random (blocking until the kernel's pool is ready).
    #[arg(long, conflicts_with = "use_urandom")]
    use_random: bool,
    /// Take the volume key from /dev/urandom (libcryptsetup's default).
    #[arg(long)]
    use_urandom: bool,
    /// Accepted as cryptsetup's: ucrypt runs no password quality check to disable.
    #[arg(long)]
    #[allow(dead_code)]
    force_password: bool,
    /// UUID for the new header.
    #[arg(long)]
    uuid: Option<String>,
    /// LUKS2 label.
    #[arg(long)]
    label: Option<String>,
    /// LUKS2 subsystem label.
    #[arg(long)]
    subsystem: Option<String>,
    /// Use the volume key in FILE (its first --key-size bits) instead of a random one, as
    /// cryptsetup's (`--master-key-file` is its older spelling).
    #[arg(long, alias = "master-key-file", value_name = "FILE")]
    volume_key_file: Option<std::path::PathBuf>,
    /// Keyslot for the passphrase (default: the first).
    #[arg(short = 'S', long)]
    key_slot: Option<u32>,
    /// Data alignment in 512-byte sectors.
    #[arg(long)]
    align_payload: Option<u64>,
    /// Data offset in 512-byte sectors (cryptsetup's `crypt_set_data_offset`; with a
    /// detached header, where the data starts on the device).
    #[arg(short = 'o', long, value_name = "SECTORS")]
    offset: Option<u64>,
    /// Do not ask for confirmation.
    #[arg(short = 'q', long)]
    batch_mode: bool,
    /// Print what was done.
    #[arg(short, long)]
    verbose: bool,
    /// After formatting, overwrite the whole data area with encrypted zeros through
    /// ucrypt's data path (a progress bar on stderr), so no old plaintext stays readable.
    #[arg(long)]
    wipe: bool,
    /// Authenticated encryption (LUKS2): hmac-sha256, hmac-sha512, hmac-sha1 (with an XTS
    /// cipher), aead (with --cipher aes-gcm-random), poly1305 (with --cipher
    /// chacha20-random); a dm-integrity layer below keeps a tag per sector.
    #[arg(short = 'I', long, value_name = "ALG")]
    integrity: Option<String>,
    /// Do not wipe the device after an --integrity format (every sector not yet written
    /// then fails to read, as with cryptsetup).
    #[arg(long)]
    integrity_no_wipe: bool,
    /// Accepted as cryptsetup's: a journal choice of open (--integrity-no-journal there),
    /// not written into the header.
    #[arg(long)]
    #[allow(dead_code)]
    integrity_no_journal: bool,
    /// Format dm-integrity without fix_padding (for kernels before 5.4), as cryptsetup's.
    #[arg(long)]
    integrity_legacy_padding: bool,
    #[command(flatten)]
    progress: ProgressArgs,
}

/// Writes encrypted zeros over the whole data area of the freshly formatted volume.
fn wipe(a: &Args, pass: &[u8]) -> Result<(), CliError> {
    let hopts = ucrypt::HeaderOptions {
        header: a.dev.header.clone(),
        // The header was just written here with the cipher the user named: wiping a
        // cipher_null volume is what they asked for (opening it later is refused).
        allow_null_cipher: true,
        ..ucrypt::HeaderOptions::default()
    };
    let unlocked = {
        // The header is written; nothing of the data area yet.
        let _exit = progress::ExitOnSignal::with_message(
            "ucrypt: interrupted before the wipe: the header is formatted, the data area was \
             not wiped\n",
        );
        let _spin = progress::Spinner::new("Unlocking the new keyslot for the wipe");
        ucrypt::unlock(&a.dev.device, pass, &hopts).cs()?
    };
    let target = format::wipe_volume(unlocked).cs()?;
    super::wipe::fill(&*target.volume, &a.dev, 0, target.chunk, &a.progress)
}

/// The initial wipe of an --integrity format (cryptsetup's `_wipe_data_device`): every
/// sector written once through the new volume so that its tag is valid.
fn integrity_wipe(a: &Args, key: &ucrypt::luks::VolumeKey) -> Result<(), CliError> {
    if !a.batch_mode {
        eprintln!(
            "Wiping device to initialize integrity checksum.\nYou can interrupt this by \
             pressing CTRL+c (rest of not wiped device will contain invalid checksum)."
        );
    }
    let target = {
        let _exit = progress::ExitOnSignal::with_message(
            "ucrypt: interrupted before the wipe: the header is formatted, the data area was \
             not wiped (its sectors fail to read until written; ucrypt wipe DEVICE writes \
             them all)\n",
        );
        format::wipe_target(&a.dev.device, a.dev.header.as_deref(), key).cs()?
    };
    super::wipe::fill(&*target.volume, &a.dev, 0, target.chunk, &a.progress)
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let _claimed = super::luks::claim_for_header_change(&a.dev)?;
    let req = format::Request {
        luks2: a.kind != "luks1",
        cipher: a.cipher.clone(),
        key_bits: a.key_size,
        pbkdf: a.pbkdf.clone(),
        hash: a.hash.clone(),
        pbkdf_iterations: a.pbkdf_force_iterations,
        pbkdf_time_ms: a.iter_time,
        pbkdf_memory_kb: a.pbkdf_memory,
        pbkdf_parallel: a.pbkdf_parallel,
        labels: a.label.is_some() || a.subsystem.is_some(),
        metadata_size: a.luks2_metadata_size,
        keyslots_size: a.luks2_keyslots_size,
        rng_random: (a.use_random || a.use_urandom).then_some(a.use_random),
        offset: a.offset,
        integrity: a.integrity.clone(),
        integrity_legacy_padding: a.integrity_legacy_padding,
        integrity_no_wipe: a.integrity_no_wipe,
        remote: ucrypt::remote_header::is_remote(&a.dev.device)
            || a.dev
                .header
                .as_deref()
                .is_some_and(ucrypt::remote_header::is_remote),
    };
    let plan = format::plan(&req).map_err(lib_error)?;
    if a.new_key_file.is_some() && a.key.key_file.is_some() {
        return Err(anyhow::anyhow!(
            "give the key file either positionally or with --key-file"
        ))
        .code(EXIT_PARAMS);
    }
    let key_file = a.new_key_file.as_deref().or(a.key.key_file.as_deref());
    // Read before anything is written: a short file is refused with the header untouched.
    let volume_key = match &a.volume_key_file {
        Some(f) => Some(ucrypt::luks::VolumeKey::new(
            secret::read_key_file(f, 0, plan.key_bytes as u64)?.to_vec(),
        )),
        None => None,
    };
    secret::confirm(
        a.batch_mode,
        &format!(
            "This will overwrite data on {} irrevocably",
            a.dev.header_path().display()
        ),
    )?;
    let pass = secret::get(
        key_file.map(|p| (p, a.key.keyfile_offset, a.key.keyfile_size)),
        &format!("Enter passphrase for {}: ", a.dev.header_path().display()),
        true,
    )?;
    // A detached header is formatted on its own file (created if missing, as cryptsetup
    // does), naming the data device in the format parameters.
    if let Some(h) = &a.dev.header {
        if !h.exists() {
            // Sized for the default LUKS2 header area (16 MiB; LUKS1 needs at most 2 MiB
            // with a 512-bit key): libcryptsetup does not grow a header file itself.
            let f = std::fs::File::create(h)
                .map_err(|e| anyhow::anyhow!("creating header file {}: {e}", h.display()))?;
            f.set_len(16 << 20)
                .map_err(|e| anyhow::anyhow!("sizing header file {}: {e}", h.display()))?;
        }
    }
    let mut cd = a.dev.header_context()?;
    plan.prepare(&mut cd, &req).map_err(lib_error)?;
    // The Argon2 benchmark writes nothing: Ctrl-C ends it at once.
    progress::searching("Benchmarking the PBKDF", || {
        cd.prebenchmark_pbkdf(plan.key_bytes)
    })
    .cs()?;
    // What libcryptsetup may write: the default LUKS2 header area (16 MiB; LUKS1's fits in
    // it), or up to an --align-payload data offset.
    let area = (16u64 << 20)
        .max(a.align_payload.unwrap_or(0).saturating_mul(512))
        .max(a.offset.unwrap_or(0).saturating_mul(512))
        .min(256 << 20);
    let header = a.dev.local_header()?;
    let formatted =
        progress::writing_header("Formatting the header and keyslot", &header, area, || {
            format_header(&a, &plan, cd, volume_key.as_ref(), &pass, &header)
        })?;
    verbose(
        a.verbose,
        format_args!("Key slot {} created.", formatted.slot),
    );
    // A remote header reaches its server before the wipe reads it back from there.
    super::luks::write_back_remote()?;
    if let Some(key) = &formatted.volume_key {
        if plan.integrity.as_ref().is_some_and(|i| i.wipe) {
            integrity_wipe(&a, key)?;
        }
    }
    if a.wipe {
        wipe(&a, &pass)?;
        verbose(a.verbose, "Data area wiped with encrypted zeros.");
    }
    verbose(a.verbose, "Command successful.");
    Ok(())
}

/// Writes the header and its first keyslot on `cd` (PBKDF set), and with --integrity the
/// dm-integrity superblock below it ([`format::Plan::write`]).
fn format_header(
    a: &Args,
    plan: &format::Plan,
    cd: ucrypt::luks::CryptDevice,
    volume_key: Option<&ucrypt::luks::VolumeKey>,
    pass: &[u8],
    header: &std::path::Path,
) -> Result<format::Formatted, CliError> {
    let data = match &a.dev.header {
        Some(_) => Some(a.dev.local_device()?),
        None => None,
    };
    let fmt = LuksFormat {
        luks2: plan.luks2,
        cipher: a.cipher.clone(),
        key_bytes: plan.key_bytes,
        uuid: a.uuid.clone(),
        hash: a.hash.clone(),
        sector_size: a.sector_size,
        label: a.label.clone(),
        subsystem: a.subsystem.clone(),
        data_device: data.clone(),
        align_sectors: a.align_payload,
    };
    plan.write(
        cd,
        &fmt,
        &a.keyslot_cipher.choice(),
        a.key_slot,
        volume_key,
        pass,
        header,
        data.as_deref().unwrap_or(header),
        a.use_random,
    )
    .map_err(lib_error)
}
