//! `ucrypt reencrypt DEV`: LUKS2 re-keying (new volume key, optionally a new cipher, key
//! size or sector size), `--encrypt --header HDR` (a plaintext device gets a detached
//! LUKS2 header and is encrypted in place) and `--decrypt --header HDR` (the reverse),
//! offline, with cryptsetup's options and on-disk metadata, so that `cryptsetup reencrypt
//! --resume-only` can finish what ucrypt started and the reverse. The metadata set-up is
//! libcryptsetup's (for `--encrypt` the luksFormat of cryptsetup's `encrypt_luks2_init`
//! too); the data pass is ucrypt's ([`ucrypt::reencrypt`]). A LUKS1 volume is re-keyed as
//! cryptsetup's legacy LUKS1 reencryption does it ([`luks1`]).

mod luks1;
mod online;

use super::luks::{CsResult, DeviceArgs};
use super::luks_add_key::PbkdfArgs;
use super::progress;
use super::secret::{self, KeyFileArgs};
use super::{CliError, WithCode, EXIT_PARAMS};
use anyhow::anyhow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use ucrypt::reencrypt::{Outcome, Run, RunOptions, DEFAULT_MAX_HOTZONE};
use ucrypt_cryptsetup::{HeaderType, KeyslotStatus, LuksFormat, ReencryptInit, ReencryptMode};
use ucrypt_format::size::parse_size;

/// Arguments of `ucrypt reencrypt`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// The LUKS2 or LUKS1 device: a block device or an image file (with --active-name, the
    /// one the instance serves unless given). A LUKS1 volume is re-keyed, decrypted (or a
    /// device encrypted with --type luks1) as cryptsetup's legacy LUKS1 reencryption does,
    /// its state files in the current directory.
    #[arg(required_unless_present = "active_name")]
    device: Option<std::path::PathBuf>,
    /// Use a detached header file instead of the device's own.
    #[arg(long, value_name = "FILE")]
    header: Option<std::path::PathBuf>,
    /// The device and header as resolved by [`run`].
    #[arg(skip)]
    pub(crate) dev: DeviceArgs,
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
    /// How an interrupted hotzone is recovered: checksum (the default), journal or none;
    /// datashift (the only one) with --reduce-device-size.
    #[arg(long, value_enum)]
    resilience: Option<ResilienceArg>,
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
    #[command(flatten)]
    progress: progress::ProgressArgs,
    /// Accepted for cryptsetup compatibility (ucrypt's reencryption is offline).
    #[arg(long, hide = true)]
    force_offline_reencrypt: bool,
    /// Encrypt a plaintext device in place; its new LUKS2 header goes to --header
    /// (`-N`/`--new`: cryptsetup's older spellings).
    #[arg(long, short = 'N', visible_alias = "new", conflicts_with = "decrypt")]
    encrypt: bool,
    /// Decrypt a LUKS2 device whose header is detached (--header) in place.
    #[arg(long)]
    decrypt: bool,
    /// Header type for --encrypt: luks2 (the default) or luks1 (cryptsetup's legacy LUKS1
    /// encryption).
    #[arg(long = "type", short = 'M', value_name = "TYPE")]
    kind: Option<String>,
    /// UUID of the new header (--encrypt); with --decrypt of LUKS1, the UUID of the
    /// decryption to resume once its header is overwritten.
    #[arg(long)]
    uuid: Option<String>,
    /// Label of the new header (--encrypt).
    #[arg(long)]
    label: Option<String>,
    /// Subsystem label of the new header (--encrypt).
    #[arg(long)]
    subsystem: Option<String>,
    /// With --encrypt: put the LUKS2 header at the head of the device, shifting the data
    /// by half of SIZE (cryptsetup's; at most 1 GiB, 512-byte units, K/M/G suffixes).
    /// The filesystem must have been shrunk by SIZE first: the device's last SIZE bytes
    /// are overwritten.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    reduce_device_size: Option<u64>,
    /// With --encrypt: the new header's data offset in 512-byte sectors (cryptsetup's
    /// `-o`). With --header the data segment starts there on the device (the header file
    /// is sized to it); with --reduce-device-size at most half the reduction, which is
    /// then adjusted to twice the offset.
    #[arg(short = 'o', long, value_name = "SECTORS")]
    offset: Option<u64>,
    /// With --encrypt: the new header's JSON metadata area size (bytes; K/M suffixes),
    /// 16K..4M, a power of two, as luksFormat's.
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    luks2_metadata_size: Option<u64>,
    /// With --encrypt: the new header's keyslots area size (bytes; K/M suffixes), as
    /// luksFormat's; with --reduce-device-size shrunk to what fits below the data offset
    /// (with cryptsetup's warning).
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    luks2_keyslots_size: Option<u64>,
    /// Keep the volume key (and keyslots); change the cipher or sector size only.
    #[arg(long)]
    keep_key: bool,
    /// The new volume key: the first --key-size bits of FILE instead of a random key (a
    /// re-key, or --encrypt's new header; cryptsetup's). The volume's own key in FILE
    /// means --keep-key. `--master-key-file` is its older spelling.
    #[arg(long, alias = "master-key-file", value_name = "FILE")]
    volume_key_file: Option<std::path::PathBuf>,
    /// Online reencryption of the volume the named instance serves (`ucrypt open DEV NAME`):
    /// its clients keep reading and writing meanwhile; DEVICE may then be left out.
    #[arg(long, value_name = "NAME")]
    active_name: Option<String>,
    /// Re-encrypt only this much of the data area (bytes; K, M, G suffixes), as
    /// cryptsetup's: the rest is left as it is, yet the finished header's segment covers
    /// the whole device. DANGEROUS (for a device whose filesystem was shrunk first).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    device_size: Option<u64>,
    /// LUKS1 reencryption block size in MiB, 1 to 1024 (default 4; LUKS1 only).
    #[arg(short = 'B', long, value_name = "MIB")]
    block_size: Option<String>,
    /// LUKS1 reencryption with O_DIRECT (LUKS1 only).
    #[arg(long)]
    use_directio: bool,
    /// LUKS1 reencryption with fsync after every block (LUKS1 only; ucrypt syncs every
    /// block anyway).
    #[arg(long)]
    use_fsync: bool,
    /// LUKS1 reencryption log updated after every block (LUKS1 only; ucrypt always
    /// does).
    #[arg(long)]
    write_log: bool,
    /// Stop cleanly after this many bytes (tests: a reproducible interruption).
    #[arg(long, hide = true, value_parser = parse_size)]
    debug_stop_after: Option<u64>,
    #[command(flatten)]
    pbkdf: PbkdfArgs,
    /// Do not ask for confirmation.
    #[arg(short = 'q', long = "batch-mode")]
    batch_mode: bool,
}

/// `--resilience`: how an interrupted hotzone is recovered (checksum, journal, none, or a
/// data shift's datashift). The variants carry no doc comments: clap would print them as a
/// list in `--help` instead of cryptsetup's one line of possible values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum ResilienceArg {
    Checksum,
    Journal,
    None,
    Datashift,
}

impl ResilienceArg {
    /// libcryptsetup's and the metadata's word.
    fn as_str(self) -> &'static str {
        match self {
            ResilienceArg::Checksum => "checksum",
            ResilienceArg::Journal => "journal",
            ResilienceArg::None => "none",
            ResilienceArg::Datashift => "datashift",
        }
    }
}

impl std::fmt::Display for ResilienceArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Args {
    /// The resilience asked for (cryptsetup's default: checksum).
    fn resilience(&self) -> String {
        self.resilience
            .unwrap_or(ResilienceArg::Checksum)
            .as_str()
            .into()
    }
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
    if a.keep_key {
        return initialise_keep_key(a, cd, &info, passphrase);
    }
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
    let cipher = new_data_cipher(a, &info);
    // cryptsetup's reencrypt_luks2_init: with -s or a new cipher the key size is -s or its
    // default for the new cipher's mode; otherwise the volume's.
    let key_bytes = if a.key_size.is_some() || cipher != info.cipher_spec() {
        key_bytes(a.key_size, &cipher)?
    } else {
        info.key_bytes
    };
    let new_slot = match &a.volume_key_file {
        Some(f) => {
            let key = read_volume_key(f, key_bytes)?;
            if cd.verify_volume_key(key.as_bytes()).is_ok() {
                // The volume's own key (cryptsetup's crypt_volume_key_verify check): the
                // key stays, as with --keep-key.
                drop(key);
                return initialise_keep_key(a, cd, &info, passphrase);
            }
            cd.add_unbound_keyslot(None, Some(key.as_bytes()), key_bytes, passphrase)
        }
        None => cd.add_keyslot_new_unbound_key(None, key_bytes, passphrase),
    }
    .cs()?;
    let params = ReencryptInit {
        mode: ReencryptMode::Reencrypt,
        cipher,
        sector_size: a.sector_size.unwrap_or(info.sector_size),
        resilience: a.resilience(),
        hash: Some(a.resilience_hash.clone()),
        max_hotzone_sectors: a.hotzone_size.unwrap_or(0) / 512,
        device_size_sectors: a.device_size.unwrap_or(0) / 512,
        data_shift_sectors: 0,
        move_first_segment: false,
    };
    if let Err(e) = cd.reencrypt_init(Some(old_slot), Some(new_slot), passphrase, &params) {
        // Leave the header as it was.
        let _ = cd.destroy_keyslot(new_slot);
        return Err(e).cs();
    }
    Ok(())
}

/// The data cipher after a re-key: `--cipher`, else the volume's, except that a volume
/// without encryption (`cipher_null`) gets cryptsetup's default, as cryptsetup 2.6 does.
fn new_data_cipher(a: &Args, info: &ucrypt_cryptsetup::VolumeInfo) -> String {
    if let Some(c) = &a.cipher {
        return c.clone();
    }
    let current = info.cipher_spec();
    let name = current.split('-').next().unwrap_or_default();
    if name == "cipher_null" || name == "null" {
        println!("Switching data encryption cipher to aes-xts-plain64.");
        return "aes-xts-plain64".into();
    }
    current
}

/// The first `len` bytes of `path`, a new volume key (cryptsetup's `tools_read_vk`: a
/// longer file is fine, a shorter one is refused). Zeroed when dropped; never printed.
pub(super) fn read_volume_key(
    path: &std::path::Path,
    len: usize,
) -> Result<ucrypt_crypto::VolumeKey, CliError> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)
        .map_err(|e| anyhow!("Cannot read keyfile {} ({e}).", path.display()))
        .code(EXIT_PARAMS)?;
    let mut key = zeroize::Zeroizing::new(vec![0u8; len]);
    let mut got = 0;
    while got < len {
        match f.read(&mut key[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(anyhow!("Cannot read keyfile {} ({e}).", path.display()))
                    .code(EXIT_PARAMS)
            }
        }
    }
    if got < len {
        return Err(anyhow!(
            "Cannot read {len} bytes from keyfile {}.",
            path.display()
        ))
        .code(EXIT_PARAMS);
    }
    Ok(ucrypt_crypto::VolumeKey::new(std::mem::take(&mut *key)))
}

/// The key size in bytes for `bits` (None: cryptsetup's default, 512 bits for XTS and 256
/// otherwise).
fn key_bytes(bits: Option<u32>, cipher: &str) -> Result<usize, CliError> {
    match bits {
        Some(b) if b % 8 == 0 && b > 0 => Ok(b as usize / 8),
        Some(b) => {
            Err(anyhow!("key size {b} is not a positive multiple of 8 bits")).code(EXIT_PARAMS)
        }
        None => Ok(if cipher.contains("xts") { 64 } else { 32 }),
    }
}

/// `--keep-key`, as cryptsetup's `reencrypt_luks2_init` without a volume key change: the
/// same key (and keyslots), a new cipher or sector size; the old and new segments share
/// the one digest and no keyslot is removed at the end.
fn initialise_keep_key(
    a: &Args,
    mut cd: ucrypt_cryptsetup::CryptDevice,
    info: &ucrypt_cryptsetup::VolumeInfo,
    passphrase: &[u8],
) -> Result<(), CliError> {
    let cipher = a.cipher.clone().unwrap_or_else(|| info.cipher_spec());
    let sector_size = a.sector_size.unwrap_or(info.sector_size);
    if a.key_size.is_some_and(|b| b as usize != info.key_bytes * 8) {
        return Err(anyhow!(
            "reencrypt --keep-key keeps the {}-bit volume key: -s cannot change its size",
            info.key_bytes * 8
        ))
        .code(EXIT_PARAMS);
    }
    if cipher == info.cipher_spec() && sector_size == info.sector_size {
        return Err(anyhow!(
            "No data segment parameters changed. Reencryption aborted."
        ))
        .code(EXIT_PARAMS);
    }
    let slot = cd.check_passphrase(a.key_slot, passphrase).cs()?;
    let params = ReencryptInit {
        mode: ReencryptMode::Reencrypt,
        cipher,
        sector_size,
        resilience: a.resilience(),
        hash: Some(a.resilience_hash.clone()),
        max_hotzone_sectors: a.hotzone_size.unwrap_or(0) / 512,
        device_size_sectors: a.device_size.unwrap_or(0) / 512,
        data_shift_sectors: 0,
        move_first_segment: false,
    };
    cd.reencrypt_init(Some(slot), Some(slot), passphrase, &params)
        .cs()?;
    Ok(())
}

/// The new header's cipher for `--encrypt` (`--cipher`, default aes-xts-plain64) and its
/// key length in bytes (`--key-size`). The data path is ucrypt's: a cipher it cannot serve
/// is refused before anything is written.
fn new_cipher(a: &Args) -> Result<(String, usize), CliError> {
    let cipher = a.cipher.clone().unwrap_or_else(|| "aes-xts-plain64".into());
    cipher
        .parse::<ucrypt_crypto::CipherSpec>()
        .map_err(|e| anyhow!("--cipher {cipher}: {e}"))
        .code(EXIT_PARAMS)?;
    let key_bytes = key_bytes(a.key_size, &cipher)?;
    Ok((cipher, key_bytes))
}

/// luksFormat of the new LUKS2 header of `--encrypt` in `cd` (a random volume key; UUID,
/// label, subsystem and sector size as given: a malformed --uuid is refused by
/// crypt_format, EINVAL, before anything is written), then the passphrase's keyslot
/// (--key-slot or the first free); the keyslot number.
fn format_new_header(
    a: &Args,
    cd: &mut ucrypt_cryptsetup::CryptDevice,
    cipher: &str,
    key_bytes: usize,
    data_device: std::path::PathBuf,
    passphrase: &[u8],
) -> Result<u32, CliError> {
    if a.luks2_metadata_size.is_some() || a.luks2_keyslots_size.is_some() {
        let metadata = a.luks2_metadata_size.unwrap_or(0);
        let mut keyslots = a.luks2_keyslots_size.unwrap_or(0);
        // cryptsetup's encrypt_luks2_init: with the header at the head of the device, a
        // keyslots area that does not fit below the data offset is shrunk to fit.
        if let (Some(r), Some(k)) = (a.reduce_device_size, a.luks2_keyslots_size) {
            let room = (r / 2).saturating_sub(2 * metadata.max(16 << 10));
            if k > room {
                keyslots = room;
                eprintln!("WARNING: LUKS2 keyslots area size changed to {room} bytes.");
            }
        }
        cd.set_metadata_size(metadata, keyslots)
            .map_err(|e| anyhow!("unsupported LUKS2 metadata size options").context(e.to_string()))
            .code(EXIT_PARAMS)?;
    }
    // cryptsetup's luksFormat --volume-key-file: the first key-size bytes of the file.
    let key = a
        .volume_key_file
        .as_deref()
        .map(|f| read_volume_key(f, key_bytes))
        .transpose()?;
    cd.format_luks(
        &LuksFormat {
            luks2: true,
            cipher: cipher.to_owned(),
            key_bytes,
            uuid: a.uuid.clone(),
            hash: None,
            sector_size: a.sector_size,
            label: a.label.clone(),
            subsystem: a.subsystem.clone(),
            data_device: Some(data_device),
            align_sectors: None,
        },
        key.as_ref(),
    )
    .cs()?;
    drop(key);
    cd.add_keyslot_by_volume_key(a.key_slot, None, passphrase)
        .cs()
}

/// `--encrypt --header HDR DEV`, as cryptsetup's `encrypt_luks2_init`: a LUKS2 header on
/// HDR for DEV (luksFormat with the options given, a random volume key, the passphrase in
/// --key-slot or 0), then the encryption metadata (mode encrypt, direction forward, the
/// whole device one linear segment).
fn initialise_encrypt(
    a: &Args,
    header: &std::path::Path,
    passphrase: &[u8],
) -> Result<(), CliError> {
    let (cipher, key_bytes) = new_cipher(a)?;
    if !header.exists() {
        // 4 KiB, as cryptsetup's luksFormat creates it: libcryptsetup grows it to the
        // header's size (16 MiB by default, the data offset with --offset).
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(header)
            .map_err(|e| anyhow!("creating header file {}: {e}", header.display()))?;
        f.set_len(4096)
            .map_err(|e| anyhow!("sizing header file {}: {e}", header.display()))?;
    }
    let mut cd = a.dev.header_context()?;
    a.pbkdf.apply_always(&mut cd)?;
    if let Some(o) = a.offset.filter(|&o| o > 0) {
        // cryptsetup's luksFormat --offset: the data segment starts there.
        cd.set_data_offset(o).cs()?;
    }
    let slot = format_new_header(
        a,
        &mut cd,
        &cipher,
        key_bytes,
        a.dev.local_device()?,
        passphrase,
    )?;
    let params = ReencryptInit {
        mode: ReencryptMode::Encrypt,
        cipher,
        sector_size: a.sector_size.unwrap_or(512),
        resilience: a.resilience(),
        hash: Some(a.resilience_hash.clone()),
        max_hotzone_sectors: a.hotzone_size.unwrap_or(0) / 512,
        device_size_sectors: a.device_size.unwrap_or(0) / 512,
        data_shift_sectors: 0,
        move_first_segment: false,
    };
    if let Err(e) = cd.reencrypt_init(None, Some(slot), passphrase, &params) {
        let _ = cd.destroy_keyslot(slot);
        return Err(e).cs();
    }
    Ok(())
}

/// `--encrypt --reduce-device-size SIZE DEV` (no --header), as cryptsetup's
/// `encrypt_luks2_init`: a LUKS2 header with its data offset at SIZE/2 is formatted into a
/// temporary file for DEV, its passphrase keyslot added, then the encryption metadata with
/// a data shift of SIZE/2 written (libcryptsetup first copies DEV's first SIZE/2 bytes to
/// its end, the `backup-moved-segment`), and the header restored onto the head of DEV
/// over those bytes. Mode encrypt, direction backward, resilience datashift.
fn initialise_encrypt_shift(a: &Args, reduce: u64, passphrase: &[u8]) -> Result<(), CliError> {
    let (cipher, key_bytes) = new_cipher(a)?;
    // cryptsetup: the data offset is half the reduction, and so is the shift (sectors).
    let shift_sectors = reduce / 1024;
    let device = a.dev.local_device()?;
    let dir = tempfile::Builder::new()
        .prefix("ucrypt-LUKS2-temp-")
        .tempdir()
        .map_err(|e| anyhow!("creating a directory for the temporary header: {e}"))?;
    let tmp = dir.path().join("header");
    // 4 KiB, as cryptsetup's: libcryptsetup grows it; an empty file is refused.
    std::fs::File::create(&tmp)
        .and_then(|f| f.set_len(4096))
        .map_err(|e| anyhow!("creating temporary header file {}: {e}", tmp.display()))?;
    let staged = DeviceArgs {
        device: device.clone(),
        header: Some(tmp.clone()),
    };
    let mut cd = staged.header_context()?;
    a.pbkdf.apply_always(&mut cd)?;
    cd.set_data_offset(shift_sectors).cs()?;
    let slot = format_new_header(a, &mut cd, &cipher, key_bytes, device.clone(), passphrase)?;
    let params = ReencryptInit {
        mode: ReencryptMode::Encrypt,
        cipher,
        sector_size: a.sector_size.unwrap_or(512),
        resilience: "datashift".into(),
        hash: Some(a.resilience_hash.clone()),
        max_hotzone_sectors: a.hotzone_size.unwrap_or(0) / 512,
        device_size_sectors: 0,
        data_shift_sectors: shift_sectors,
        move_first_segment: true,
    };
    // Nothing of DEV is overwritten before this returns but its last SIZE/2 bytes (the
    // copy); a failure leaves the header in the temporary file only.
    cd.reencrypt_init(None, Some(slot), passphrase, &params)
        .cs()?;
    drop(cd);
    let head = DeviceArgs {
        device: device.clone(),
        header: None,
    };
    let mut cd = head.header_context()?;
    cd.header_restore(&tmp).map_err(|e| {
        anyhow!(
            "Failed to place new header at head of device {}: {e}",
            device.display()
        )
    })?;
    Ok(())
}

/// `--decrypt --header HDR DEV`, as cryptsetup's `decrypt_luks2_init`: the decryption
/// metadata (mode decrypt, direction backward, the new side a linear segment).
fn initialise_decrypt(a: &Args, passphrase: &[u8]) -> Result<(), CliError> {
    let mut cd = a.dev.load(ucrypt::header::VolumeType::Luks2)?;
    let info = cd.info();
    if info.kind != Some(HeaderType::Luks2) {
        return Err(anyhow!(
            "{} is not LUKS2 (decryption needs LUKS2)",
            a.dev.header_path().display()
        ))
        .code(EXIT_PARAMS);
    }
    if info.data_offset > 0 {
        return Err(anyhow!(
            "LUKS2 decryption is supported with detached header device only (with data offset \
             set to 0)."
        ))
        .code(EXIT_PARAMS);
    }
    cd.check_passphrase(a.key_slot, passphrase).cs()?;
    let params = ReencryptInit {
        mode: ReencryptMode::Decrypt,
        cipher: String::new(),
        sector_size: 0,
        resilience: a.resilience(),
        hash: Some(a.resilience_hash.clone()),
        max_hotzone_sectors: a.hotzone_size.unwrap_or(0) / 512,
        device_size_sectors: a.device_size.unwrap_or(0) / 512,
        data_shift_sectors: 0,
        move_first_segment: false,
    };
    cd.reencrypt_init(a.key_slot, None, passphrase, &params)
        .cs()?;
    Ok(())
}

/// `--decrypt --header NEWFILE DEV` of a device whose LUKS2 header is attached, as
/// cryptsetup 2.6's `decrypt_luks2_datashift_init`: the header is exported to NEWFILE
/// (`crypt_header_backup`), the LUKS signatures on DEV are wiped, then libcryptsetup
/// writes the decryption metadata into NEWFILE (mode decrypt, direction forward,
/// resilience `datashift-checksum` or with `--resilience journal` `datashift-journal`, a
/// data shift of the data offset) after copying the first ciphertext (the data offset,
/// at most 20 MiB, or `--hotzone-size`) to the head of DEV: the moved segment. A failure
/// before that restores the header onto DEV and removes NEWFILE.
fn initialise_decrypt_shift(
    a: &Args,
    header: &std::path::Path,
    passphrase: &[u8],
) -> Result<(), CliError> {
    let device = a.dev.local_device()?;
    let on_device = DeviceArgs {
        device: device.clone(),
        header: None,
    };
    let mut cd = on_device.load(ucrypt::header::VolumeType::Luks2)?;
    let info = cd.info();
    if info.kind != Some(HeaderType::Luks2) {
        return Err(anyhow!(
            "{} is not LUKS2 (decryption needs LUKS2)",
            device.display()
        ))
        .code(EXIT_PARAMS);
    }
    let (_, req) = cd.persistent_flags().cs()?;
    if req != 0 {
        return Err(anyhow!(
            "the LUKS2 header of {} has requirements (an unfinished reencryption?); \
             decryption needs a clean header",
            device.display()
        ))
        .code(EXIT_PARAMS);
    }
    cd.check_passphrase(a.key_slot, passphrase).cs()?;
    cd.header_backup(header).cs()?;
    drop(cd);
    let restore = |e: CliError| -> CliError {
        // Back as it was: the header onto the device, the exported file gone.
        let restored = on_device
            .header_context()
            .and_then(|mut cd| cd.header_restore(header).cs());
        match restored {
            Ok(()) => {
                let _ = std::fs::remove_file(header);
                e
            }
            Err(_) => {
                eprintln!(
                    "Reencryption initialization failed. Header backup is available in {}.",
                    header.display()
                );
                e
            }
        }
    };
    {
        // crypt_header_backup leaves the file read-only; cryptsetup adds u+rw.
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(header)
            .map(|m| m.permissions().mode())
            .unwrap_or(0o400);
        std::fs::set_permissions(header, std::fs::Permissions::from_mode(mode | 0o600)).map_err(
            |e| {
                restore(
                    anyhow!("Failed to add read/write permissions to exported header file ({e}).")
                        .into(),
                )
            },
        )?;
    }
    wipe_luks_signatures(&device).map_err(restore)?;
    let mut cd = a
        .dev
        .load(ucrypt::header::VolumeType::Luks2)
        .map_err(restore)?;
    let params = ReencryptInit {
        mode: ReencryptMode::Decrypt,
        cipher: String::new(),
        sector_size: 0,
        resilience: match a.resilience {
            Some(ResilienceArg::Journal) => "datashift-journal".into(),
            _ => "datashift-checksum".into(),
        },
        hash: Some(a.resilience_hash.clone()),
        max_hotzone_sectors: a.hotzone_size.unwrap_or(0) / 512,
        device_size_sectors: 0,
        data_shift_sectors: info.data_offset,
        move_first_segment: true,
    };
    if let Err(e) = cd.reencrypt_init(a.key_slot, None, passphrase, &params) {
        drop(cd);
        // Nothing was moved unless the metadata says a decryption is in progress.
        if header_shift_type(header).is_none() {
            return Err(e).cs().map_err(restore);
        }
        return Err(e).cs();
    }
    Ok(())
}

/// Wipes the LUKS signatures of `device` (the magic of the primary header at 0 and of the
/// secondary at its `hdr_size`), as cryptsetup's `tools_wipe_all_signatures` (libblkid)
/// does before moving the data over them: a device left half-way is not taken for the
/// LUKS volume whose header was exported.
fn wipe_luks_signatures(device: &std::path::Path) -> Result<(), CliError> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(device)
        .map_err(|e| anyhow!("opening {}: {e}", device.display()))?;
    let mut head = [0u8; 16];
    f.read_exact_at(&mut head, 0)
        .map_err(|e| anyhow!("reading {}: {e}", device.display()))?;
    let hdr_size = u64::from_be_bytes(head[8..16].try_into().unwrap_or_default());
    let mut at = vec![0u64];
    if (16384..=4 << 20).contains(&hdr_size) {
        at.push(hdr_size);
    }
    for off in at {
        let mut magic = [0u8; 6];
        if f.read_exact_at(&mut magic, off).is_ok()
            && (magic == *b"LUKS\xba\xbe" || magic == *b"SKUL\xba\xbe")
        {
            f.write_all_at(&[0u8; 6], off)
                .map_err(|e| anyhow!("wiping the LUKS signature of {}: {e}", device.display()))?;
        }
    }
    f.sync_all()
        .map_err(|e| anyhow!("syncing {}: {e}", device.display()))?;
    Ok(())
}

/// The `mode` of the header's reencrypt keyslot.
fn reencrypt_mode(json: &ucrypt_format::luks2::json::Json) -> Option<String> {
    json.get("keyslots")?
        .members()
        .iter()
        .find(|(_, k)| k.get("type").and_then(|t| t.as_str()) == Some("reencrypt"))
        .and_then(|(_, k)| k.get("mode")?.as_str().map(str::to_string))
}

/// The resilience (`datashift`, `datashift-checksum`, `datashift-journal`) of the
/// reencryption in `header`'s metadata when it has a data shift.
fn header_shift_type(header: &std::path::Path) -> Option<String> {
    let f = std::fs::File::open(header).ok()?;
    let h = ucrypt_format::luks2::disk::Header::read(&f, "header").ok()?;
    let keyslots = h.json.get("keyslots")?;
    keyslots.members().iter().find_map(|(_, ks)| {
        ks.get("area")
            .and_then(|a| a.get("type"))
            .and_then(|t| t.as_str())
            .filter(|t| t.starts_with("datashift"))
            .map(str::to_string)
    })
}

/// Whether blkid's LUKS probe (libblkid `superblocks/luks.c`) finds a signature on `path`:
/// the LUKS magic at 0, or a LUKS2 secondary header's magic (`SKUL\xba\xbe`, version 2) at
/// one of the offsets a LUKS2 header may have its second copy at. Hand-written: the probe
/// is a few fixed reads, and libblkid's bindings are not in the workspace.
fn luks_signature(path: &std::path::Path) -> bool {
    use std::os::unix::fs::FileExt;
    let Ok(f) = std::fs::File::open(path) else {
        return false;
    };
    let at = |o: u64| {
        let mut b = [0u8; 8];
        f.read_exact_at(&mut b, o).ok().map(|()| b)
    };
    if at(0).is_some_and(|b| b[..6] == *b"LUKS\xba\xbe") {
        return true;
    }
    (14..=22).any(|shift| {
        at(1 << shift).is_some_and(|b| b[..6] == *b"SKUL\xba\xbe" && b[6..8] == [0, 2])
    })
}

/// Whether `path` starts with a LUKS header (either version).
pub(super) fn is_luks(path: &std::path::Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 6];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && (magic == *b"LUKS\xba\xbe" || magic == *b"SKUL\xba\xbe")
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let mut a = a;
    a.dev = DeviceArgs {
        device: a.device.clone().unwrap_or_default(),
        header: a.header.clone(),
    };
    if a.kind.as_deref() == Some("luks1") && a.active_name.is_some() {
        return Err(anyhow!(
            "Option --active-name can be set only for LUKS2 device."
        ))
        .code(EXIT_PARAMS);
    }
    if a.active_name.is_none()
        && (luks1::applies(a.dev.header_path(), &a)
            || (a.encrypt && a.kind.as_deref() == Some("luks1")))
    {
        if let (Some(f), true) = (&a.volume_key_file, a.decrypt || a.keep_key) {
            eprintln!(
                "--volume-key-file {} is not used: {} sets no new volume key.",
                f.display(),
                if a.decrypt { "--decrypt" } else { "--keep-key" }
            );
        }
        // cryptsetup's legacy LUKS1 reencryption.
        return luks1::run(&a);
    }
    luks1::decrypt_hint(&a)?;
    if a.block_size.is_some() || a.use_directio || a.use_fsync || a.write_log {
        return Err(anyhow!(
            "reencrypt --block-size, --use-directio, --use-fsync and --write-log are \
             options of cryptsetup's LUKS1 reencryption; {} is not LUKS1",
            a.dev.header_path().display()
        ))
        .code(EXIT_PARAMS);
    }
    if let Some(name) = a.active_name.clone() {
        return online::run(&mut a, &name);
    }
    if let Some(n) = a.device_size {
        // cryptsetup's own checks of the option (tools_check_args).
        if n == 0 {
            return Err(anyhow!("Invalid device size specification.")).code(EXIT_PARAMS);
        }
        if n % 512 != 0 {
            return Err(anyhow!("Device size must be multiple of 512 bytes sector."))
                .code(EXIT_PARAMS);
        }
    }
    if a.keep_key && (a.encrypt || a.decrypt) {
        return Err(anyhow!(
            "reencrypt --keep-key keeps the key of a LUKS2 volume being re-encrypted; \
             --encrypt and --decrypt have one key only"
        ))
        .code(EXIT_PARAMS);
    }
    if !a.encrypt && (a.luks2_metadata_size.is_some() || a.luks2_keyslots_size.is_some()) {
        return Err(anyhow!(
            "--luks2-metadata-size and --luks2-keyslots-size size a new header: they apply to \
             reencrypt --encrypt only (cryptsetup ignores them otherwise)"
        ))
        .code(EXIT_PARAMS);
    }
    if a.reduce_device_size == Some(0) {
        // cryptsetup's: no reduction at all.
        a.reduce_device_size = None;
    }
    if let (Some(o), false) = (a.offset, a.encrypt) {
        // cryptsetup 2.6.1 takes the option and does nothing with it.
        eprintln!("--offset {o} applies to --encrypt only; ignored, as by cryptsetup.");
    }
    if let Some(r) = a.reduce_device_size {
        // cryptsetup's checks of the option, then what ucrypt does not do with it.
        let refusal = if r > 1 << 30 {
            Some("Maximum device reduce size is 1 GiB.".to_string())
        } else if r % 512 != 0 {
            Some("Reduce size must be multiple of 512 bytes sector.".into())
        } else if a.device_size.is_some() {
            Some("Options --reduce-device-size and --data-size cannot be combined.".into())
        } else if !a.encrypt {
            Some(
                "reencrypt --reduce-device-size is supported with --encrypt (a plaintext \
                 device gets its LUKS2 header at its head); ucrypt does not re-key with a \
                 data shift"
                    .into(),
            )
        } else if a.dev.header.is_some() {
            Some(
                "reencrypt --encrypt --reduce-device-size puts the LUKS2 header at the head of \
                 the device; with a detached header (--header) encrypt without \
                 --reduce-device-size"
                    .into(),
            )
        } else {
            match a.resilience {
                Some(x) if x != ResilienceArg::Datashift => Some(format!(
                    "--resilience {x} does not apply to --reduce-device-size: a data shift's \
                     resilience is datashift (each hotzone is written a shift above its old \
                     data, which stays until it is done)"
                )),
                _ => None,
            }
        };
        if let Some(why) = refusal {
            return Err(anyhow!(why)).code(EXIT_PARAMS);
        }
        // cryptsetup's encrypt_luks2_init: an offset beyond half the reduction is refused,
        // one below it shrinks the reduction to twice the offset.
        if let Some(o) = a.offset.filter(|&o| o > 0) {
            if o > r / 1024 {
                return Err(anyhow!(
                    "Requested data offset must be less than or equal to half of \
                     --reduce-device-size parameter."
                ))
                .code(EXIT_PARAMS);
            }
            if o < r / 1024 {
                a.reduce_device_size = Some(o * 1024);
                println!(
                    "Adjusting --reduce-device-size value to twice the --offset {} (sectors).",
                    o * 2
                );
            }
        }
    } else if a.resilience == Some(ResilienceArg::Datashift) {
        return Err(anyhow!(
            "--resilience datashift is the resilience of --encrypt --reduce-device-size"
        ))
        .code(EXIT_PARAMS);
    }
    // cryptsetup 2.6: `--decrypt --header NEWFILE` of a device whose LUKS2 header is
    // attached exports the header to NEWFILE and moves the data to the device's head.
    let export =
        a.decrypt && a.dev.header.as_deref().is_some_and(|h| !h.exists()) && is_luks(&a.dev.device);
    if export {
        let refusal = match a.resilience {
            Some(ResilienceArg::Datashift | ResilienceArg::None) => Some(
                "Requested --resilience option cannot be applied to current reencryption \
                 operation."
                    .to_string(),
            ),
            _ if a.device_size.is_some() => Some(
                "reencrypt --decrypt of a device whose header is attached (exported to \
                 --header) with --device-size is not supported by ucrypt"
                    .into(),
            ),
            _ => None,
        };
        if let Some(why) = refusal {
            return Err(anyhow!(why)).code(EXIT_PARAMS);
        }
    }
    if a.kind.as_deref() == Some("luks1") && !a.encrypt && is_luks(a.dev.header_path()) {
        return Err(anyhow!(
            "Conflicting versions. Device {} is LUKS2.",
            a.dev.header_path().display()
        ))
        .code(EXIT_PARAMS);
    }
    if let (Some(f), true) = (&a.volume_key_file, a.decrypt || a.keep_key) {
        // cryptsetup 2.6.1 takes the option and does nothing with it here either.
        eprintln!(
            "--volume-key-file {} is not used: {} sets no new volume key.",
            f.display(),
            if a.decrypt { "--decrypt" } else { "--keep-key" }
        );
    }
    if a.kind.as_deref().is_some_and(|t| t != "luks2") {
        return Err(anyhow!(
            "reencrypt --type {}: the header types of reencrypt are luks1 and luks2",
            a.kind.as_deref().unwrap_or_default()
        ))
        .code(EXIT_PARAMS);
    }
    if !a.encrypt && (a.uuid.is_some() || a.label.is_some() || a.subsystem.is_some()) {
        return Err(anyhow!(
            "reencrypt --uuid, --label and --subsystem name the new header of --encrypt"
        ))
        .code(EXIT_PARAMS);
    }
    let shift_resume = a.encrypt && a.reduce_device_size.is_none() && is_luks(&a.dev.device);
    if ((a.encrypt && a.reduce_device_size.is_none() && !shift_resume) || a.decrypt)
        && a.dev.header.is_none()
    {
        return Err(anyhow!(if a.encrypt {
            "Encryption without detached header (--header) is not possible without data \
             device size reduction (--reduce-device-size)."
        } else {
            "LUKS2 decryption requires --header option."
        }))
        .code(EXIT_PARAMS);
    }
    if a.decrypt && (a.cipher.is_some() || a.key_size.is_some() || a.sector_size.is_some()) {
        return Err(anyhow!(
            "reencrypt --decrypt takes no --cipher, --key-size or --sector-size (the result \
             is plaintext)"
        ))
        .code(EXIT_PARAMS);
    }
    if a.decrypt && a.resilience == Some(ResilienceArg::None) {
        // cryptsetup 2.6.1 refuses it too (decrypt_verify_and_set_params).
        return Err(anyhow!(
            "Requested --resilience option cannot be applied to current reencryption operation."
        ))
        .code(EXIT_PARAMS);
    }
    if ucrypt::remote_header::is_remote(&a.dev.device)
        || a.dev
            .header
            .as_deref()
            .is_some_and(ucrypt::remote_header::is_remote)
    {
        return Err(anyhow!(
            "reencrypt works on local files and block devices only: the pass writes the \
             device with O_DIRECT and fdatasync between its steps, which NBD exports, rbd: \
             images and ram: devices do not offer here (copy the image to a local file, \
             re-encrypt it, copy it back)"
        ))
        .code(EXIT_PARAMS);
    }
    let _claimed = super::luks::claim_for_header_change(&a.dev)?;
    let path = a.dev.device.clone();
    let header_path = a.dev.header_path().to_path_buf();
    // A header to be created by --encrypt (or exported by --decrypt) is not read.
    let fresh = (a.encrypt && !is_luks(&header_path)) || export;
    let (in_progress, mode) = if fresh {
        (false, None)
    } else {
        let f = std::fs::File::open(&header_path)
            .map_err(|e| anyhow!("opening {}: {e}", header_path.display()))
            .code(super::EXIT_DEVICE)?;
        let h = ucrypt_format::luks2::disk::Header::read(&f, &header_path.display().to_string())
            .cs()?;
        (
            ucrypt_format::luks2::reencrypt::in_reencryption(&h.json),
            reencrypt_mode(&h.json),
        )
    };
    let shifted = if in_progress {
        header_shift_type(&header_path)
    } else {
        None
    };
    if a.encrypt {
        if !in_progress && !fresh {
            return Err(anyhow!(
                "Device {} is already LUKS device. Aborting operation.",
                header_path.display()
            ))
            .code(EXIT_PARAMS);
        }
        if !in_progress && is_luks(&path) {
            return Err(anyhow!(
                "Device {} is already LUKS device. Aborting operation.",
                path.display()
            ))
            .code(EXIT_PARAMS);
        }
        // cryptsetup's check_broken_luks_signature: a LUKS signature blkid finds where no
        // LUKS header loads (the header file given, and the data device) is not encrypted
        // over.
        if !in_progress {
            let header_given = a.dev.header.as_deref().filter(|h| h.exists());
            for p in header_given.into_iter().chain([path.as_path()]) {
                if luks_signature(p) {
                    return Err(anyhow!(
                        "Device {} contains broken LUKS metadata. Aborting operation.",
                        p.display()
                    ))
                    .code(EXIT_PARAMS);
                }
            }
        }
    }
    if in_progress {
        // A data shift's resilience cannot change (cryptsetup refuses it too).
        // A decryption with a data shift keeps its moved segment's resilience too
        // (`--resilience checksum` names datashift-checksum, as with cryptsetup).
        if let (Some(r), Some(t)) = (a.resilience.map(ResilienceArg::as_str), shifted.as_deref()) {
            let same = r == t || t.strip_prefix("datashift-") == Some(r);
            if !same {
                return Err(anyhow!(
                    "Requested --resilience option cannot be applied to current \
                     reencryption operation."
                ))
                .code(EXIT_PARAMS);
            }
        }
        for (flag, want) in [(a.encrypt, "encrypt"), (a.decrypt, "decrypt")] {
            if flag && mode.as_deref() != Some(want) {
                return Err(anyhow!(
                    "Device is not in LUKS2 {want}ion. Conflicting option --{want}."
                ))
                .code(EXIT_PARAMS);
            }
        }
    }
    let passphrase = if export {
        secret::confirm(
            a.batch_mode,
            &format!(
                "Header file {} does not exist. Do you want to initialize LUKS2 decryption of \
                 device {} and export LUKS2 header to file {}?",
                header_path.display(),
                path.display(),
                header_path.display()
            ),
        )?;
        secret::existing(&a.key, &a.dev.device)?
    } else if fresh {
        if !a.batch_mode {
            let what = match a.reduce_device_size {
                Some(r) => format!(
                    "This will put a LUKS2 header at the head of {} and encrypt its data in \
                     place, shifted by {} bytes (its last {r} bytes are overwritten)",
                    path.display(),
                    r / 1024 * 512
                ),
                None => format!(
                    "This will create a LUKS2 header in {} and encrypt the data of {} in place",
                    header_path.display(),
                    path.display()
                ),
            };
            secret::confirm(a.batch_mode, &what)?;
        }
        secret::get(
            a.key
                .key_file
                .as_deref()
                .map(|p| (p, a.key.keyfile_offset, a.key.keyfile_size)),
            &format!("Enter passphrase for {}: ", header_path.display()),
            true,
        )?
    } else {
        secret::existing(&a.key, &a.dev.device)?
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
        if let (true, Some(r)) = (a.encrypt, a.reduce_device_size) {
            initialise_encrypt_shift(&a, r, &passphrase)?;
        } else if a.encrypt {
            initialise_encrypt(&a, &header_path, &passphrase)?;
        } else if export {
            initialise_decrypt_shift(&a, &header_path, &passphrase)?;
        } else if a.decrypt {
            initialise_decrypt(&a, &passphrase)?;
        } else {
            initialise(&a, &passphrase)?;
        }
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
    if let (ucrypt_format::luks2::reencrypt::Resilience::Datashift { shift }, Some(_)) =
        (r.resilience(), a.hotzone_size)
    {
        eprintln!(
            "With a data shift every hotzone is the shift ({shift} bytes), as with \
             cryptsetup: --hotzone-size does not apply."
        );
    }
    let opts = RunOptions {
        max_hotzone: a.hotzone_size.unwrap_or(DEFAULT_MAX_HOTZONE).max(4096),
        stop_after: a.debug_stop_after,
    };
    if let Some(limit) = a.device_size {
        r.limit_device_size(limit).code(EXIT_PARAMS)?;
    }
    let start = Instant::now();
    let first = r.done();
    let device = path.display().to_string();
    let mut bar = progress::Bytes::new(
        &a.progress,
        "Reencrypting",
        &device,
        a.device_size
            .unwrap_or(r.device_size())
            .saturating_sub(first),
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
