//! `ucrypt luksAddKey <device> [<new key file>]`: a new keyslot, unlocked by an existing
//! passphrase (`--key-file` or the first prompt/line), holding the new one.

use super::exit::cs_error;
use super::luks::{luks_type, verbose, CsResult, DeviceArgs};
use super::secret::{self, KeyFileArgs, NewKeyFileArgs};
use super::{CliError, WithCode, EXIT_PARAMS};
use std::path::PathBuf;
use ucrypt::header::VolumeType;

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

    /// Applies the choices (if any) for the next keyslot.
    pub(crate) fn apply(&self, cd: &mut ucrypt::luks::CryptDevice) -> Result<(), CliError> {
        self.choice().apply(cd).map_err(cs_error)
    }

    /// Sets the PBKDF for the next keyslot: the choices, cryptsetup's defaults for the
    /// rest (argon2id for LUKS2, pbkdf2 for LUKS1), as `set_pbkdf_params` does.
    pub(crate) fn apply_always(&self, cd: &mut ucrypt::luks::CryptDevice) -> Result<(), CliError> {
        self.choice().apply_always(cd).map_err(cs_error)
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
    /// Sets the keyslot encryption on `cd` for the keyslot written next (nothing when not
    /// given). cryptsetup refuses it on LUKS1 ("can be set only for LUKS2 device", exit 1).
    pub(crate) fn apply(&self, cd: &mut ucrypt::luks::CryptDevice) -> Result<(), CliError> {
        let (Some(cipher), Some(bits)) = (&self.keyslot_cipher, self.keyslot_key_size) else {
            return Ok(());
        };
        if cd.info().kind != Some(ucrypt::luks::HeaderType::Luks2) {
            return Err(anyhow::anyhow!(
                "keyslot encryption parameters (--keyslot-cipher, --keyslot-key-size) can be \
                 set only for LUKS2 devices"
            ))
            .code(EXIT_PARAMS);
        }
        cd.set_keyslot_encryption(cipher, bits as usize / 8).cs()
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

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let _claimed = super::luks::claim_for_header_change(&a.dev)?;
    if a.unbound {
        return add_unbound(&a);
    }
    let mut cd = a.dev.load(a.kind)?;
    ucrypt::header::check_requirements(&mut cd).cs()?;
    a.keyslot_cipher.apply(&mut cd)?;
    // cryptsetup 2.6: without --new-key-slot, --key-slot names the new keyslot.
    let (old_slot, new_slot) = match (a.key_slot, a.new_key_slot) {
        (Some(s), None) => {
            if !a.batch_mode {
                println!("WARNING: The --key-slot parameter is used for new keyslot number.");
            }
            (None, Some(s))
        }
        other => other,
    };
    if let Some(s) = new_slot {
        if cd.keyslot_status(s) == ucrypt::luks::KeyslotStatus::Invalid {
            return Err(anyhow::anyhow!(
                "keyslot {s} is out of range for this header"
            ))
            .code(EXIT_PARAMS);
        }
    }
    // The volume key: from --volume-key-file, or unlocked by the existing passphrase, which
    // is checked before the new one is asked for (as cryptsetup does).
    let by_token = match &a.volume_key_file {
        Some(_) => None,
        None => ucrypt::unlock::token::volume_key(
            &a.dev.device,
            a.dev.header.as_deref(),
            a.kind,
            &a.token.tokens(),
            &mut super::prompt::Terminal::default(),
        )
        .map_err(super::exit::lib_error)?,
    };
    let key = match (&a.volume_key_file, by_token) {
        (_, Some(key)) => key,
        (Some(f), None) => {
            // As cryptsetup: the file's first key-size bytes (a shorter file is refused).
            let want = cd.info().key_bytes as u64;
            let key = ucrypt::luks::VolumeKey::new(secret::read_key_file(f, 0, want)?.to_vec());
            // A key that is not the volume's: exit 2, as cryptsetup's EPERM.
            cd.verify_volume_key(key.as_bytes()).code(2)?;
            key
        }
        (None, None) => {
            let old = secret::existing_asking(&a.key, "Enter any existing passphrase: ")?;
            let (slot, key) = super::progress::searching("Checking the passphrase", || {
                cd.volume_key(old_slot, &old)
            })
            .cs()?;
            // cryptsetup says so only for a typed (or piped) passphrase, not a key file.
            let from_file = a
                .key
                .key_file
                .as_ref()
                .is_some_and(|f| f.as_os_str() != "-");
            verbose(
                a.verbose && !from_file,
                format_args!("Key slot {slot} unlocked."),
            );
            key
        }
    };
    let new_file = a.new_key_file.as_deref().or(a.new_keyfile_opt.as_deref());
    if let (Some(token), None) = (a.new_token_id, new_file) {
        // The token gives the new passphrase (libcryptsetup's keyslot contexts, as
        // cryptsetup's `--new-token-id`).
        a.pbkdf.apply(&mut cd)?;
        let slot = super::progress::writing_header(
            "Adding the keyslot",
            &a.dev.local_header()?,
            0,
            || cd.add_keyslot_by_token(new_slot, &key, token).cs(),
        )?;
        verbose(a.verbose, format_args!("Key slot {slot} created."));
        verbose(a.verbose, "Command successful.");
        return Ok(());
    }
    let new = a
        .new_key
        .get(new_file, "Enter new passphrase for key slot: ")?;
    a.pbkdf.apply(&mut cd)?;
    // The Argon2 benchmark writes nothing: Ctrl-C ends it at once.
    let key_bytes = cd.info().key_bytes;
    super::progress::searching("Benchmarking the PBKDF", || {
        cd.prebenchmark_pbkdf(key_bytes)
    })
    .cs()?;
    let slot =
        super::progress::writing_header("Adding the keyslot", &a.dev.local_header()?, 0, || {
            cd.add_keyslot_by_volume_key(new_slot, Some(&key), &new)
                .cs()
        })?;
    verbose(a.verbose, format_args!("Key slot {slot} created."));
    verbose(a.verbose, "Command successful.");
    Ok(())
}

/// `luksAddKey --unbound`: a LUKS2 keyslot bound to no segment, holding a new random key of
/// `--key-size` bits (or the key in `--volume-key-file`), protected by the new passphrase;
/// no existing passphrase is asked (cryptsetup's `luksAddUnboundKey`). `--key-slot` names
/// the new keyslot.
fn add_unbound(a: &Args) -> Result<(), CliError> {
    let mut cd = a.dev.load(VolumeType::Luks2)?;
    ucrypt::header::check_requirements(&mut cd).cs()?;
    a.keyslot_cipher.apply(&mut cd)?;
    let key_bytes = a.key_size.unwrap_or(0) as usize / 8;
    a.pbkdf.apply(&mut cd)?;
    let key = match &a.volume_key_file {
        Some(f) => {
            let k = secret::read_key_file(f, 0, key_bytes as u64)?;
            Some(ucrypt::luks::VolumeKey::new(k.to_vec()))
        }
        None => None,
    };
    let new_file = a.new_key_file.as_deref().or(a.new_keyfile_opt.as_deref());
    let new = a
        .new_key
        .get(new_file, "Enter new passphrase for key slot: ")?;
    let key_bytes_c = key_bytes;
    super::progress::searching("Benchmarking the PBKDF", || {
        cd.prebenchmark_pbkdf(key_bytes_c)
    })
    .cs()?;
    let slot = super::progress::writing_header(
        "Adding the unbound keyslot",
        &a.dev.local_header()?,
        0,
        || {
            cd.add_unbound_keyslot(
                a.key_slot,
                key.as_ref().map(|k| k.as_bytes()),
                key_bytes,
                &new,
            )
            .cs()
        },
    )?;
    verbose(a.verbose, format_args!("Key slot {slot} created."));
    verbose(a.verbose, "Command successful.");
    Ok(())
}
