//! TrueCrypt/VeraCrypt options shared by `open --type tcrypt`, `luksOpen --type tcrypt`
//! and `tcryptDump`, with cryptsetup's names. As in cryptsetup, `--key-file` names
//! TrueCrypt key files (mixed into the password), not the passphrase, which comes from a
//! prompt or one line of standard input (`--key-file -` reads it from standard input).

use super::luks::cs_error;
use super::plain_args::PlainArgs;
use super::secret::{self, KeyFileArgs, Secret};
use super::CliError;
use std::path::{Path, PathBuf};
use ucrypt::header::{HeaderOptions, VolumeType};
use ucrypt_format::tcrypt::TcryptOptions;

/// The TCRYPT options.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct TcryptArgs {
    /// Accept VeraCrypt headers (the default; kept for cryptsetup compatibility).
    #[arg(long)]
    pub(crate) veracrypt: bool,
    /// Only TrueCrypt headers and KDFs.
    #[arg(long)]
    pub(crate) disable_veracrypt: bool,
    /// VeraCrypt Personal Iterations Multiplier.
    #[arg(long, value_name = "PIM")]
    pub(crate) veracrypt_pim: Option<u32>,
    /// Ask for the VeraCrypt PIM after the passphrase ("Enter VeraCrypt PIM: ", or the
    /// next line of standard input), as cryptsetup's.
    #[arg(long, conflicts_with = "veracrypt_pim")]
    pub(crate) veracrypt_query_pim: bool,
    /// Use the hidden-volume header.
    #[arg(long)]
    pub(crate) tcrypt_hidden: bool,
    /// Use the system-encryption header (sector 62 of the drive).
    #[arg(long)]
    pub(crate) tcrypt_system: bool,
    /// Use the backup header at the end of the device.
    #[arg(long)]
    pub(crate) tcrypt_backup: bool,
    /// More TrueCrypt key files (besides --key-file); may be repeated.
    #[arg(long = "tcrypt-keyfile", value_name = "FILE")]
    pub(crate) key_files: Vec<PathBuf>,
    /// The TCRYPT header search's progress: a bar on a terminal, or (--progress-json)
    /// cryptsetup's JSON lines counting KDF x cipher combinations.
    #[command(flatten)]
    pub(crate) progress: super::progress::ProgressArgs,
}

/// Header options and passphrase for a TCRYPT device; `--hash` and `--cipher` are search
/// hints (substrings of the KDF hash and of the cipher chain).
pub(crate) fn inputs(
    device: &Path,
    header: Option<PathBuf>,
    key: &KeyFileArgs,
    t: &TcryptArgs,
    plain: &PlainArgs,
    allow_discards: bool,
) -> Result<(HeaderOptions, Secret), CliError> {
    let mut key_files = Vec::new();
    let mut pass_from_stdin = false;
    match key.key_file.as_deref() {
        Some(p) if p.as_os_str() == "-" => pass_from_stdin = true,
        Some(p) => key_files.push(p.to_path_buf()),
        None => {}
    }
    key_files.extend(t.key_files.iter().cloned());
    let pass_args = KeyFileArgs {
        key_file: pass_from_stdin.then(|| PathBuf::from("-")),
        ..KeyFileArgs::default()
    };
    let mut secret = secret::existing(&pass_args, device)?;
    if pass_from_stdin && secret.last() == Some(&b'\n') {
        secret.pop();
    }
    let pim = if t.veracrypt_query_pim {
        Some(query_pim()?)
    } else {
        t.veracrypt_pim.filter(|&p| p != 0)
    };
    let hopts = HeaderOptions {
        kind: VolumeType::Tcrypt,
        header,
        allow_discards,
        tcrypt: TcryptOptions {
            veracrypt: !t.disable_veracrypt,
            pim,
            hidden: t.tcrypt_hidden,
            system: t.tcrypt_system,
            backup: t.tcrypt_backup,
            hash: plain.hash.clone(),
            cipher: plain.cipher.clone(),
            key_files,
            progress: super::progress::Search::callback(&t.progress, &device.display().to_string()),
        },
        ..HeaderOptions::default()
    };
    Ok((hopts, secret))
}

/// `--veracrypt-query-pim`: the PIM asked for after the passphrase, with cryptsetup's
/// checks (a decimal number, not 0, at most 2^32-1; exit 1 otherwise).
fn query_pim() -> Result<u32, CliError> {
    let answer = secret::get(None, "Enter VeraCrypt PIM: ", false)?;
    let text = std::str::from_utf8(&answer).unwrap_or("");
    let why = if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        "parse error"
    } else {
        match text.parse::<u64>() {
            Ok(0) => "0",
            Ok(n) => match u32::try_from(n) {
                Ok(p) => return Ok(p),
                Err(_) => "outside of range",
            },
            Err(_) => "outside of range",
        }
    };
    Err(anyhow::anyhow!("invalid PIM value: {why}").into())
}

/// Arguments of `ucrypt tcryptDump`.
#[derive(clap::Args)]
pub(crate) struct DumpArgs {
    /// The TrueCrypt/VeraCrypt device or image.
    device: PathBuf,
    /// Read the header from this file instead of the device.
    #[arg(long, value_name = "FILE")]
    header: Option<PathBuf>,
    /// Print the volume key (needs --batch-mode or a typed YES).
    #[arg(long, alias = "dump-master-key")]
    dump_volume_key: bool,
    /// Confirms --dump-volume-key without a question.
    #[arg(short = 'q', long)]
    batch_mode: bool,
    #[command(flatten)]
    key: KeyFileArgs,
    #[command(flatten)]
    tcrypt: TcryptArgs,
    /// Only try KDFs whose hash contains this (e.g. sha512, argon2id).
    #[arg(long)]
    hash: Option<String>,
    /// Only try cipher chains whose name contains this (e.g. aes, serpent).
    #[arg(short, long)]
    cipher: Option<String>,
}

/// `tcryptDump`: the decrypted header as cryptsetup prints it, and the volume key when
/// confirmed.
pub(crate) fn run_dump(a: DumpArgs) -> Result<(), CliError> {
    if a.dump_volume_key {
        secret::confirm(
            a.batch_mode,
            "The header dump with volume key is sensitive information that allows access to \
             the encrypted partition without a passphrase. This dump should always be stored \
             encrypted in a safe place",
        )?;
    }
    let plain = PlainArgs {
        cipher: a.cipher.clone(),
        key_size: None,
        hash: a.hash.clone(),
        offset: 0,
        skip: None,
        size: None,
        sector_size: None,
        iv_large_sectors: false,
        device_size: None,
    };
    // NBD URIs are read through staged copies (super::luks::local_path); the dump names
    // what the user named.
    let header = match &a.header {
        Some(h) => Some(super::luks::local_path(h, true)?),
        None => None,
    };
    let device = super::luks::local_path(&a.device, header.is_none())?;
    let (hopts, secret) = inputs(&a.device, header, &a.key, &a.tcrypt, &plain, false)?;
    let (hdr, meta) = super::progress::searching_maybe(None, || {
        ucrypt::tcrypt::load_header(&device, &secret, &hopts)
    })
    .map_err(cs_error)?;
    drop(secret);
    let shown = if Some(&meta) == hopts.header.as_ref() {
        a.header.clone().unwrap_or(meta)
    } else if meta == device {
        a.device.clone()
    } else {
        meta
    };
    let mut out = hdr.dump(&shown.display().to_string());
    if a.dump_volume_key {
        let key = hdr.volume_key();
        out.push_str("MK dump:\t");
        out.push_str(&super::format_dump::hex_dump(key.as_bytes(), Some(16)));
    }
    print!("{out}");
    zeroize::Zeroize::zeroize(&mut out);
    Ok(())
}
