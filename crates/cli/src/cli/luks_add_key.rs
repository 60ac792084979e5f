//! `ucrypt luksAddKey <device> [<new key file>]`: a new keyslot, unlocked by an existing
//! passphrase (`--key-file` or the first prompt/line), holding the new one.

use super::exit::lib_error;
use super::luks::{luks_type, verbose, DeviceArgs};
use super::prompt::Terminal;
use super::secret::{KeyFileArgs, NewKeyFileArgs};
use super::CliError;
use std::path::PathBuf;
use ucrypt::header::VolumeType;
use ucrypt::luks::keyslots;

/// PBKDF choices for a new keyslot (shared by luksAddKey and luksChangeKey).
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct PbkdfArgs {
    /// PBKDF: pbkdf2, argon2i, argon2id (default: the header's default).
    #[arg(long, value_parser = ["pbkdf2", "argon2i", "argon2id"])]
    pub(crate) pbkdf: Option<String>,
    /// Fixed PBKDF iterations (time cost for Argon2), no benchmark.
    #[arg(long)]
    pub(crate) pbkdf_force_iterations: Option<u32>,
    /// Target PBKDF time in milliseconds when benchmarking.
    #[arg(short = 'i', long)]
    pub(crate) iter_time: Option<u32>,
    /// Argon2 memory cost in KiB.
    #[arg(long)]
    pub(crate) pbkdf_memory: Option<u32>,
    /// Argon2 parallel threads.
    #[arg(long)]
    pub(crate) pbkdf_parallel: Option<u32>,
    /// PBKDF2 hash.
    #[arg(long)]
    pub(crate) hash: Option<String>,
}

impl PbkdfArgs {
    /// The library's PBKDF choice for these options.
    pub(crate) fn choice(&self) -> ucrypt::reencrypt::PbkdfChoice {
        ucrypt::reencrypt::PbkdfChoice {
            kind: self.pbkdf.clone(),
            iterations: self.pbkdf_force_iterations,
            time_ms: self.iter_time,
            memory_kb: self.pbkdf_memory,
            parallel: self.pbkdf_parallel,
            hash: self.hash.clone(),
        }
    }
}

/// `--keyslot-cipher` / `--keyslot-key-size`: how the LUKS2 keyslot area written next is
/// encrypted (default: the data segment's cipher), as cryptsetup's (luksFormat, luksAddKey,
/// luksChangeKey, luksConvertKey). Both or neither.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct KeyslotCipherArgs {
    /// LUKS2 keyslot area cipher (e.g. aes-xts-plain64), with --keyslot-key-size.
    #[arg(long, value_name = "SPEC", requires = "keyslot_key_size")]
    pub(crate) keyslot_cipher: Option<String>,
    /// LUKS2 keyslot area key size in bits, with --keyslot-cipher.
    #[arg(long, value_name = "BITS", requires = "keyslot_cipher", value_parser = key_bits)]
    pub(crate) keyslot_key_size: Option<u32>,
}

/// A key size in bits: a positive multiple of 8 (cryptsetup's check).
pub(crate) fn key_bits(s: &str) -> Result<u32, String> {
    let n: u32 = s.parse().map_err(|e| format!("{e}"))?;
    if n == 0 || n % 8 != 0 {
        return Err(format!(
            "{n}: key size must be a positive multiple of 8 bits"
        ));
    }
    Ok(n)
}

impl KeyslotCipherArgs {
    /// The library's choice for these options.
    pub(crate) fn choice(&self) -> ucrypt::luks::keyslots::KeyslotCipher {
        ucrypt::luks::keyslots::KeyslotCipher {
            cipher: self.keyslot_cipher.clone().zip(self.keyslot_key_size),
        }
    }
}

/// Arguments of `ucrypt luksAddKey`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    dev: DeviceArgs,
    /// File with the new passphrase (default: prompt, or the second line of stdin).
    new_key_file: Option<PathBuf>,
    /// File with the new passphrase (as the positional argument).
    #[arg(
        long = "new-keyfile",
        value_name = "FILE",
        conflicts_with = "new_key_file"
    )]
    new_keyfile_opt: Option<PathBuf>,
    #[command(flatten)]
    key: KeyFileArgs,
    #[command(flatten)]
    new_key: NewKeyFileArgs,
    /// Keyslot for the new passphrase (default: the first free); with --new-key-slot, the
    /// keyslot the existing passphrase must open.
    #[arg(short = 'S', long)]
    key_slot: Option<u32>,
    /// Keyslot for the new passphrase (default: the first free).
    #[arg(long, value_name = "INT")]
    new_key_slot: Option<u32>,
    /// Unlock with the volume key in this file instead of an existing passphrase.
    #[arg(long, value_name = "FILE")]
    volume_key_file: Option<PathBuf>,
    /// Unlock the existing volume key through LUKS2 tokens first (`--token-id`,
    /// `--token-type`; with `--token-only` no existing passphrase is asked), as
    /// cryptsetup 2.6's luksAddKey.
    #[command(flatten)]
    token: super::token::UnlockArgs,
    /// Do not print the --key-slot warning.
    #[arg(short = 'q', long)]
    batch_mode: bool,
    /// Expected LUKS type.
    #[arg(long = "type", short = 'M', default_value = "luks", value_parser = luks_type)]
    kind: VolumeType,
    #[command(flatten)]
    pbkdf: PbkdfArgs,
    #[command(flatten)]
    keyslot_cipher: KeyslotCipherArgs,
    /// Add an unbound LUKS2 keyslot (it opens nothing: a key for other uses) holding a new
    /// random key of --key-size bits, or the key in --volume-key-file; no existing
    /// passphrase is needed.
    #[arg(long, requires = "key_size")]
    unbound: bool,
    /// Key size in bits of the --unbound key.
    #[arg(short = 's', long, value_name = "BITS", value_parser = key_bits)]
    key_size: Option<u32>,
    /// The new keyslot's passphrase comes from LUKS2 token N (a luks2-keyring token: the
    /// kernel keyring key it names), and the token is assigned to the new keyslot.
    #[arg(long, value_name = "INT", conflicts_with = "unbound")]
    new_token_id: Option<u32>,
    /// Accepted as cryptsetup's: ucrypt runs no password quality check to disable.
    #[arg(long)]
    #[allow(dead_code)]
    force_password: bool,
    /// Print the slot used.
    #[arg(short, long)]
    verbose: bool,
}

impl Args {
    /// The new passphrase's key file: the positional argument or `--new-keyfile`.
    fn new_key(&self) -> ucrypt::unlock::KeyFile {
        self.new_key.inputs(
            self.new_key_file
                .as_deref()
                .or(self.new_keyfile_opt.as_deref()),
        )
    }
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let _claimed = super::luks::claim_for_header_change(&a.dev)?;
    let mut prompt = Terminal::default();
    let slot = if a.unbound {
        let mut cd = a.dev.load(VolumeType::Luks2)?;
        let o = keyslots::AddUnbound {
            key_slot: a.key_slot,
            key_bits: a.key_size.unwrap_or(0),
            key_file: a.volume_key_file.clone(),
            new_key: a.new_key(),
            pbkdf: a.pbkdf.choice(),
            keyslot_cipher: a.keyslot_cipher.choice(),
        };
        keyslots::add_unbound(&mut cd, &a.dev.local_header()?, &o, &mut prompt)
    } else {
        let mut cd = a.dev.load(a.kind)?;
        let o = keyslots::AddKey {
            device: a.dev.device.clone(),
            header: a.dev.header.clone(),
            kind: a.kind,
            key: a.key.inputs(),
            new_key: a.new_key(),
            key_slot: a.key_slot,
            new_key_slot: a.new_key_slot,
            volume_key_file: a.volume_key_file.clone(),
            tokens: a.token.tokens(),
            new_token_id: a.new_token_id,
            pbkdf: a.pbkdf.choice(),
            keyslot_cipher: a.keyslot_cipher.choice(),
            batch: a.batch_mode,
            verbose: a.verbose,
        };
        keyslots::add(&mut cd, &a.dev.local_header()?, &o, &mut prompt)
    }
    .map_err(lib_error)?;
    verbose(a.verbose, format_args!("Key slot {slot} created."));
    verbose(a.verbose, "Command successful.");
    Ok(())
}
