//! TrueCrypt/VeraCrypt options shared by `open --type tcrypt`, `luksOpen --type tcrypt`
//! and `tcryptDump`, with cryptsetup's names. As in cryptsetup, `--key-file` names
//! TrueCrypt key files (mixed into the password), not the passphrase, which comes from a
//! prompt or one line of standard input (`--key-file -` reads it from standard input).

use super::exit::lib_error;
use super::prompt::Terminal;
use super::secret::KeyFileArgs;
use super::CliError;
use std::path::PathBuf;
use ucrypt::unlock::{PlainInputs, Request, TcryptInputs};

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

impl TcryptArgs {
    /// The options as the library's unlock takes them.
    pub(crate) fn inputs(&self) -> TcryptInputs {
        TcryptInputs {
            veracrypt: !self.disable_veracrypt,
            pim: self.veracrypt_pim,
            query_pim: self.veracrypt_query_pim,
            hidden: self.tcrypt_hidden,
            system: self.tcrypt_system,
            backup: self.tcrypt_backup,
            key_files: self.key_files.clone(),
        }
    }
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
/// confirmed ([`ucrypt::tcrypt_dump::tcrypt_dump`]).
pub(crate) fn run_dump(a: DumpArgs) -> Result<(), CliError> {
    let request = Request {
        header: a.header.clone(),
        kind: Some(ucrypt::VolumeType::Tcrypt),
        key: a.key.inputs(),
        plain: PlainInputs {
            cipher: a.cipher.clone(),
            hash: a.hash.clone(),
            ..PlainInputs::default()
        },
        tcrypt: a.tcrypt.inputs(),
        ..Request::new(&a.device)
    };
    let mut prompt = Terminal {
        progress: a.tcrypt.progress.clone(),
        batch: a.batch_mode,
        ..Terminal::default()
    };
    let staging = &super::luks::STAGED;
    let dump = ucrypt::tcrypt_dump::tcrypt_dump(&request, staging, a.dump_volume_key, &mut prompt)
        .map_err(lib_error)?;
    let mut out = dump.text;
    if let Some(key) = &dump.volume_key {
        let hex = zeroize::Zeroizing::new(super::format_dump::hex_dump(key.as_bytes(), Some(16)));
        out.push_str("MK dump:\t");
        out.push_str(&hex);
    }
    print!("{}", *out);
    Ok(())
}
