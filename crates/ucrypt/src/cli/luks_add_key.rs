//! `ucrypt luksAddKey <device> [<new key file>]`: a new keyslot, unlocked by an existing
//! passphrase (`--key-file` or the first prompt/line), holding the new one.

use super::luks::{luks_type, verbose, CsResult, DeviceArgs};
use super::secret::{self, KeyFileArgs};
use super::CliError;
use std::path::PathBuf;
use ucrypt::header::VolumeType;
use ucrypt_cryptsetup::Pbkdf;

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
    /// Applies the choices (if any) for the next keyslot.
    pub(crate) fn apply(&self, cd: &mut ucrypt_cryptsetup::CryptDevice) -> Result<(), CliError> {
        let any = self.pbkdf.is_some()
            || self.pbkdf_force_iterations.is_some()
            || self.iter_time.is_some()
            || self.pbkdf_memory.is_some()
            || self.pbkdf_parallel.is_some()
            || self.hash.is_some();
        if !any {
            return Ok(());
        }
        let luks1 = cd.info().kind == Some(ucrypt_cryptsetup::HeaderType::Luks1);
        let kind = self
            .pbkdf
            .clone()
            .unwrap_or_else(|| if luks1 { "pbkdf2" } else { "argon2id" }.to_string());
        cd.set_pbkdf(&Pbkdf {
            kind,
            hash: self.hash.clone(),
            iterations: self.pbkdf_force_iterations,
            time_ms: self.iter_time,
            memory_kb: self.pbkdf_memory,
            parallel: self.pbkdf_parallel,
        })
        .cs()
    }
}

/// Arguments of `ucrypt luksAddKey`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    dev: DeviceArgs,
    /// File with the new passphrase (default: prompt, or the second line of stdin).
    new_key_file: Option<PathBuf>,
    #[command(flatten)]
    key: KeyFileArgs,
    /// Keyslot for the new passphrase (default: the first free).
    #[arg(short = 'S', long)]
    key_slot: Option<u32>,
    /// Expected LUKS type.
    #[arg(long = "type", short = 'M', default_value = "luks", value_parser = luks_type)]
    kind: VolumeType,
    #[command(flatten)]
    pbkdf: PbkdfArgs,
    /// Print the slot used.
    #[arg(short, long)]
    verbose: bool,
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let _claimed = super::instance::claim_for_header_change(&a.dev)?;
    let mut cd = a.dev.load(a.kind)?;
    ucrypt::header::check_requirements(&mut cd).cs()?;
    let old = secret::existing(&a.key, &a.dev.device)?;
    let new = secret::get(
        a.new_key_file.as_deref().map(|p| (p, 0, 0)),
        "Enter new passphrase for key slot: ",
        true,
    )?;
    a.pbkdf.apply(&mut cd)?;
    let slot = super::progress::writing("Adding the keyslot (PBKDF benchmark)", || {
        cd.add_keyslot_by_passphrase(a.key_slot, &old, &new).cs()
    })?;
    verbose(a.verbose, format_args!("Key slot {slot} created."));
    Ok(())
}
