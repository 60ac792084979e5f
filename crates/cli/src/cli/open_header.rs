//! `ucrypt open <device> [<name>] --type luks|luks1|luks2|plain|bitlk|fvault2`: the header half of
//! `ucrypt open`. cryptsetup's form: a device instead of a table line, the header
//! detected (`--type luks` takes LUKS1 or LUKS2; without `--type`, BitLocker and FileVault2
//! signatures are recognised too) or plain-mode options, and
//! the passphrase from `--key-file` or a prompt, as an unlock request for the library
//! (`ucrypt::open::Source::Header`; a named instance unlocks it itself first).

use super::exit::lib_error;
use super::plain_args::PlainArgs;
use super::prompt::Terminal;
use super::secret::KeyFileArgs;
use super::{CliError, WithCode, EXIT_PARAMS};
use std::path::PathBuf;
use ucrypt::header::VolumeType;
use ucrypt::unlock::{Outcome, Request};

/// The cryptsetup-style arguments of `ucrypt open`.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct HeaderArgs {
    /// A LUKS (or, with --type plain, plain dm-crypt) device to open instead of a table line.
    #[arg(value_name = "DEVICE", help_heading = None::<&str>)]
    pub(crate) device: Option<PathBuf>,
    /// Instance name: the server goes to the background once its device is ready, and
    /// `status`, `close`, `luksSuspend`, `luksResume`, `resize`, `refresh` find it by name.
    #[arg(value_name = "NAME", help_heading = None::<&str>)]
    pub(crate) name: Option<String>,
    /// Device type: luks (LUKS1 or LUKS2, detected), luks1, luks2, plain, loopaes, bitlk,
    /// fvault2, tcrypt. Default: LUKS, or BitLocker/FileVault2 when the device carries their
    /// signature (TCRYPT, loop-AES and plain volumes have none: name them).
    #[arg(long = "type", short = 'M', requires = "device", value_name = "TYPE",
          value_parser = ["luks", "luks1", "luks2", "plain", "loopaes", "bitlk", "fvault2", "tcrypt"])]
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

impl HeaderArgs {
    /// The unlock request these options make for the library's policy
    /// ([`ucrypt::unlock::Request::unlock`]). `writable`: the open is read-write and holds
    /// the image lock, so a LUKS2 reencryption hotzone a crash interrupted may be recovered
    /// first (as cryptsetup's activation does).
    pub(crate) fn request(&self, writable: bool) -> Result<Request, CliError> {
        let device = self.device.clone().expect("called only with a device");
        let kind = match &self.kind {
            Some(k) => Some(
                k.parse::<VolumeType>()
                    .map_err(anyhow::Error::from)
                    .code(EXIT_PARAMS)?,
            ),
            None => None,
        };
        Ok(Request {
            header: self.header.clone(),
            kind,
            key: self.key.inputs(),
            key_slot: self.key_slot,
            volume_key_file: self.volume_key_file.clone(),
            tokens: self.token.tokens(),
            plain: self.plain.inputs(),
            tcrypt: self.tcrypt.inputs(),
            allow_discards: self.allow_discards,
            allow_null_cipher: self.insecure_allow_null_cipher,
            tries: self.tries,
            test_passphrase: self.test_passphrase,
            unbound: self.unlock.unbound,
            serialize_memory_hard_pbkdf: self.unlock.serialize_memory_hard_pbkdf,
            link_vk_to_keyring: self.unlock.link_vk_to_keyring.clone(),
            recover_reencryption: writable,
            ..Request::new(device)
        })
    }
}

/// Unlocks `h.device` with the terminal's prompt ([`HeaderArgs::request`]): the volume key
/// and table, and the header options that unlock it again (`luksResume`, `resize`,
/// `refresh`). `None` with `--test-passphrase` once the passphrase checked out.
pub(crate) fn unlock(
    h: &HeaderArgs,
    writable: bool,
) -> Result<Option<(ucrypt::Unlocked, ucrypt::HeaderOptions)>, CliError> {
    let request = h.request(writable)?;
    let mut prompt = Terminal::new(&h.tcrypt.progress);
    match request.unlock(&mut prompt).map_err(lib_error)? {
        Outcome::Unlocked(unlocked, hopts) if !h.test_passphrase => Ok(Some((*unlocked, *hopts))),
        _ => Ok(None),
    }
}
