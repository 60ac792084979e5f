//! `ucrypt open <device> [<name>] --type luks|luks1|luks2|plain|bitlk|fvault2`: the header half of
//! `ucrypt open`. cryptsetup's form: a device instead of a table line, the header
//! detected (`--type luks` takes LUKS1 or LUKS2; without `--type`, BitLocker and FileVault2
//! signatures are recognised too) or plain-mode options, and
//! the passphrase from `--key-file` or a prompt. The volume is then served like a table's.
//! `--test-passphrase` only checks the passphrase and serves nothing.

use super::luks::{cs_error, CsResult, DeviceArgs};
use super::plain_args::PlainArgs;
use super::secret::KeyFileArgs;
use super::{CliError, WithCode, EXIT_DEVICE, EXIT_PARAMS};
use std::path::PathBuf;
use std::sync::Arc;
use ucrypt::header::VolumeType;
use ucrypt_backend::Backend;

/// The cryptsetup-style arguments of `ucrypt open`.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct HeaderArgs {
    /// A LUKS (or, with --type plain, plain dm-crypt) device to open instead of a table line.
    #[arg(value_name = "DEVICE")]
    pub(crate) device: Option<PathBuf>,
    /// Instance name: the server goes to the background once its device is ready, and
    /// `status`, `close`, `luksSuspend`, `luksResume`, `resize`, `refresh` find it by name.
    #[arg(value_name = "NAME")]
    pub(crate) name: Option<String>,
    /// Device type: luks (LUKS1 or LUKS2, detected), luks1, luks2, plain, loopaes, bitlk,
    /// fvault2, tcrypt. Default: LUKS, or BitLocker/FileVault2 when the device carries their
    /// signature (TCRYPT, loop-AES and plain volumes have none: name them).
    #[arg(long = "type", short = 'M', requires = "device")]
    pub(crate) kind: Option<String>,
    /// A detached LUKS header file.
    #[arg(long, value_name = "FILE", requires = "device")]
    pub(crate) header: Option<PathBuf>,
    /// Only check the passphrase; serve nothing.
    #[arg(long, requires = "device")]
    pub(crate) test_passphrase: bool,
    /// Only try this keyslot.
    #[arg(short = 'S', long, requires = "device")]
    pub(crate) key_slot: Option<u32>,
    /// Pass discards down for this mapping (the header's own persistent flags apply too;
    /// they are not changed).
    #[arg(long, requires = "device")]
    pub(crate) allow_discards: bool,
    /// Open with the volume key in FILE (raw bytes, as `luksDump --dump-volume-key
    /// --volume-key-file` writes it) instead of a passphrase: no keyslot is used, the key
    /// must match the header's digest (LUKS1/LUKS2; forensics and recovery).
    #[arg(
        long,
        value_name = "FILE",
        requires = "device",
        alias = "master-key-file"
    )]
    pub(crate) volume_key_file: Option<PathBuf>,
    /// How often to ask for the passphrase on a terminal (cryptsetup's default 3; a key
    /// file or a pipe is tried once).
    #[arg(short = 'T', long, default_value_t = 3, value_name = "N")]
    pub(crate) tries: u32,
    /// INSECURE: accept LUKS keyslots or data encrypted with cipher_null (refused by
    /// default: whoever can write the header then chooses the key or the data,
    /// CVE-2025-59054).
    #[arg(long, requires = "device")]
    pub(crate) insecure_allow_null_cipher: bool,
    #[command(flatten)]
    pub(crate) key: KeyFileArgs,
    #[command(flatten)]
    pub(crate) token: super::token::UnlockArgs,
    #[command(flatten)]
    pub(crate) plain: PlainArgs,
    #[command(flatten)]
    pub(crate) tcrypt: super::tcrypt::TcryptArgs,
    #[command(flatten)]
    pub(crate) unlock: super::unlock_opts::UnlockOpts,
}

/// What the header path gives `ucrypt open`: nothing more to do (`--test-passphrase`), or
/// the volume to serve and its description.
pub(crate) enum HeaderExport {
    /// The passphrase checked out; exit 0.
    Checked,
    /// Serve this.
    Serve(Arc<dyn Backend>, String),
}

/// Unlocks `h.device` and builds its volume with the engine options of `opts`.
pub(crate) fn export(h: &HeaderArgs, opts: ucrypt::OpenOptions) -> Result<HeaderExport, CliError> {
    // No image lock is held here: a crashed reencryption hotzone is refused, not recovered.
    let Some((unlocked, _)) = unlock(h, false)? else {
        return Ok(HeaderExport::Checked);
    };
    let description = unlocked.export_description();
    let volume = ucrypt::open_unlocked(unlocked, opts).map_err(cs_error)?;
    Ok(HeaderExport::Serve(volume, description))
}

/// Exit code of a wrong passphrase (cryptsetup's 2).
const EXIT_BAD_PASSPHRASE: u8 = 2;

/// Reads the secret and unlocks `h.device`: the volume key and table, and the header
/// options that unlock it again (`luksResume`, `resize`, `refresh`). `None` with
/// `--test-passphrase` once the passphrase checked out. A wrong passphrase typed at a
/// terminal is asked for again, `--tries` times in all (as cryptsetup does). `writable`: the
/// open is read-write and holds the image lock, so a LUKS2 reencryption hotzone a crash
/// interrupted may be recovered first (as cryptsetup's activation does).
pub(crate) fn unlock(
    h: &HeaderArgs,
    writable: bool,
) -> Result<Option<(ucrypt::Unlocked, ucrypt::HeaderOptions)>, CliError> {
    let tries = if super::secret::prompts(&h.key) {
        h.tries.max(1)
    } else {
        1
    };
    let mut attempt = 1;
    loop {
        match unlock_once(h, writable) {
            Err(e) if e.code() == EXIT_BAD_PASSPHRASE && attempt < tries => {
                eprintln!("No key available with this passphrase.");
                attempt += 1;
            }
            r => return r,
        }
    }
}

/// One attempt of [`unlock`].
fn unlock_once(
    h: &HeaderArgs,
    writable: bool,
) -> Result<Option<(ucrypt::Unlocked, ucrypt::HeaderOptions)>, CliError> {
    let device = h.device.clone().expect("called only with a device");
    let kind: VolumeType = match &h.kind {
        Some(k) => k.parse().map_err(anyhow::Error::from).code(EXIT_PARAMS)?,
        None if h.header.is_none() => ucrypt::header::detect_type(&device),
        None => VolumeType::Luks,
    };
    h.unlock.check_kind(kind)?;
    h.plain.check_kind(kind, h.test_passphrase)?;
    let dev = DeviceArgs {
        device: device.clone(),
        header: h.header.clone(),
    };
    // No --type and no signature: say what to add before asking for a passphrase that
    // could not help (cryptsetup only says "not a valid LUKS device"). A device that
    // cannot be read is an I/O error, not a missing signature: no --type would help.
    let probe = h.kind.is_none()
        && h.header.is_none()
        && kind == VolumeType::Luks
        && !ucrypt::remote_header::is_remote(&device);
    if probe {
        if let Ok(f) = std::fs::File::open(&device) {
            let mut first = [0u8; 4096];
            if let Err(e) = std::os::unix::fs::FileExt::read_at(&f, &mut first, 0) {
                return Err(anyhow::anyhow!(
                    "cannot read the header of {}: {e}",
                    device.display()
                ))
                .code(EXIT_DEVICE);
            }
            if dev.load(VolumeType::Luks).is_err() {
                return Err(anyhow::anyhow!(
                    "{} is not a LUKS, BitLocker or FileVault2 volume (no signature found); a \
                     TrueCrypt/VeraCrypt volume needs --type tcrypt, plain dm-crypt --type plain",
                    device.display()
                ))
                .code(EXIT_PARAMS);
            }
        }
    }
    if let Some(vk_file) = &h.volume_key_file {
        let hopts = ucrypt::HeaderOptions {
            kind,
            header: h.header.clone(),
            key_slot: None,
            plain: h.plain.options(),
            loopaes: h.plain.loopaes_options(),
            plain_raw_key: false,
            allow_discards: h.allow_discards,
            tcrypt: Default::default(),
            allow_null_cipher: h.insecure_allow_null_cipher,
            recover_reencryption: false,
        };
        // The whole file; its length must be the header's key size (checked on unlock).
        let vk = super::secret::read_key_file(vk_file, 0, 0)?;
        let unlocked = super::progress::searching("Checking the volume key", || {
            ucrypt::header::unlock_by_volume_key(&device, &vk, &hopts)
        })
        .map_err(cs_error)?;
        drop(vk);
        h.unlock.link_unlocked(&unlocked)?;
        if h.test_passphrase {
            return Ok(None);
        }
        return Ok(Some((unlocked, hopts)));
    }
    // LUKS2 tokens first, as cryptsetup (a luks2-keyring token's passphrase comes from the
    // kernel keyring; nothing is asked).
    if kind != VolumeType::Tcrypt && kind != VolumeType::Plain {
        if let Some(vk) = h.token.try_tokens(&dev, kind)? {
            let hopts = ucrypt::HeaderOptions {
                kind,
                header: h.header.clone(),
                allow_discards: h.allow_discards,
                allow_null_cipher: h.insecure_allow_null_cipher,
                ..ucrypt::HeaderOptions::default()
            };
            let unlocked = ucrypt::header::unlock_by_volume_key(&device, vk.as_bytes(), &hopts)
                .map_err(cs_error)?;
            h.unlock.link_unlocked(&unlocked)?;
            if h.test_passphrase {
                return Ok(None);
            }
            return Ok(Some((unlocked, hopts)));
        }
    }
    let (mut hopts, secret) = if kind == VolumeType::Tcrypt {
        super::tcrypt::inputs(
            &device,
            h.header.clone(),
            &h.key,
            &h.tcrypt,
            &h.plain,
            h.allow_discards,
        )?
    } else {
        super::unlock::inputs(&dev, kind, &h.key, h.key_slot, h.allow_discards, &h.plain)?
    };
    hopts.allow_null_cipher = h.insecure_allow_null_cipher;
    hopts.recover_reencryption = writable && !h.test_passphrase;
    if h.test_passphrase
        && h.unlock.link_vk_to_keyring.is_none()
        && !matches!(kind, VolumeType::Plain | VolumeType::Tcrypt)
        && !ucrypt::remote_header::is_remote(&device)
    {
        let mut cd = dev.load(kind)?;
        let info = cd.info();
        ucrypt::header::check_luks_ciphers(&mut cd, &info, hopts.allow_null_cipher).cs()?;
        let _lock = h.unlock.serialize()?;
        // cryptsetup: an explicit keyslot or --unbound may be an unbound one.
        let unbound = h.key_slot.is_some() || h.unlock.unbound;
        super::progress::searching("Checking the passphrase", || {
            cd.check_passphrase_allowing(h.key_slot, &secret, unbound)
        })
        .cs()?;
        return Ok(None);
    }
    let lock = h.unlock.serialize()?;
    let unlocked =
        super::progress::searching_maybe(super::unlock::unlocking(kind).as_deref(), || {
            ucrypt::unlock(&device, &secret, &hopts)
        })
        .map_err(cs_error)?;
    drop(lock);
    drop(secret);
    h.unlock.link_unlocked(&unlocked)?;
    if h.test_passphrase {
        return Ok(None);
    }
    Ok(Some((unlocked, hopts)))
}
