//! `ucrypt luksOpen <device> --test-passphrase`: checks a passphrase against the header
//! without mapping anything (libcryptsetup's activate with a NULL name), and
//! `--print-table`: prints the dm-crypt table line cryptsetup would load (key hidden
//! unless `--showkeys`), for `ucrypt read/write --table-file -`.
//!
//! Serving the volume over NBD belongs to `ucrypt open`.

use super::luks::{CsResult, DeviceArgs};
use super::plain_args::PlainArgs;
use super::secret::KeyFileArgs;
use super::{CliError, WithCode, EXIT_PARAMS};
use ucrypt::header::{HeaderOptions, VolumeType};

/// Arguments of `ucrypt luksOpen`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    dev: DeviceArgs,
    /// Mapping name (nothing is mapped; with --print-table it names the devices of a
    /// cascade, as cryptsetup names them: NAME_2, NAME_1, NAME; default "ucrypt").
    name: Option<String>,
    /// Device type: luks (any), luks1, luks2, plain, loopaes, bitlk, fvault2, tcrypt.
    #[arg(long = "type", short = 'M', default_value = "luks")]
    kind: String,
    /// Only check the passphrase.
    #[arg(long)]
    test_passphrase: bool,
    /// Print the equivalent dm-crypt table line.
    #[arg(long)]
    print_table: bool,
    /// With --print-table: show the volume key in the line.
    #[arg(long)]
    showkeys: bool,
    /// Only try this keyslot.
    #[arg(short = 'S', long)]
    key_slot: Option<u32>,
    /// Add allow_discards to the mapping.
    #[arg(long)]
    allow_discards: bool,
    /// INSECURE: accept LUKS keyslots or data encrypted with cipher_null (refused by
    /// default: whoever can write the header then chooses the key or the data,
    /// CVE-2025-59054).
    #[arg(long)]
    insecure_allow_null_cipher: bool,
    #[command(flatten)]
    key: KeyFileArgs,
    #[command(flatten)]
    token: super::token::UnlockArgs,
    #[command(flatten)]
    plain: PlainArgs,
    #[command(flatten)]
    tcrypt: super::tcrypt::TcryptArgs,
    #[command(flatten)]
    unlock: super::unlock_opts::UnlockOpts,
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let kind: VolumeType = a
        .kind
        .parse()
        .map_err(anyhow::Error::from)
        .code(EXIT_PARAMS)?;
    a.unlock.check_kind(kind)?;
    a.plain.check_kind(kind, a.test_passphrase)?;
    if !a.test_passphrase && !a.print_table {
        return Err(anyhow::anyhow!(
            "luksOpen only checks (--test-passphrase) or prints the table (--print-table); \
             serve the volume with `ucrypt open`"
        ))
        .code(EXIT_PARAMS);
    }
    if kind != VolumeType::Tcrypt && kind != VolumeType::Plain {
        if let Some(vk) = a.token.try_tokens(&a.dev, kind)? {
            let hopts = HeaderOptions {
                kind,
                header: a.dev.header.clone(),
                allow_discards: a.allow_discards,
                allow_null_cipher: a.insecure_allow_null_cipher,
                ..HeaderOptions::default()
            };
            let unlocked =
                ucrypt::header::unlock_by_volume_key(&a.dev.device, vk.as_bytes(), &hopts).cs()?;
            a.unlock.link_unlocked(&unlocked)?;
            print_table(&a, &unlocked);
            return Ok(());
        }
    }
    let (mut hopts, secret) = if kind == VolumeType::Tcrypt {
        super::tcrypt::inputs(
            &a.dev.device,
            a.dev.header.clone(),
            &a.key,
            &a.tcrypt,
            &a.plain,
            a.allow_discards,
        )?
    } else {
        super::unlock::inputs(&a.dev, kind, &a.key, a.key_slot, a.allow_discards, &a.plain)?
    };
    hopts.allow_null_cipher = a.insecure_allow_null_cipher;
    if a.test_passphrase
        && !a.print_table
        && a.unlock.link_vk_to_keyring.is_none()
        && !matches!(kind, VolumeType::Plain | VolumeType::Tcrypt)
        && !ucrypt::remote_header::is_remote(&a.dev.device)
    {
        // The passphrase check alone, exactly as `cryptsetup open --test-passphrase`.
        let mut cd = a.dev.load(kind)?;
        let info = cd.info();
        ucrypt::header::check_luks_ciphers(&mut cd, &info, hopts.allow_null_cipher).cs()?;
        let _lock = a.unlock.serialize()?;
        let unbound = a.key_slot.is_some() || a.unlock.unbound;
        super::progress::searching("Checking the passphrase", || {
            cd.check_passphrase_allowing(a.key_slot, &secret, unbound)
        })
        .cs()?;
        return Ok(());
    }
    let lock = a.unlock.serialize()?;
    let unlocked =
        super::progress::searching_maybe(super::unlock::unlocking(kind).as_deref(), || {
            ucrypt::unlock(&a.dev.device, &secret, &hopts)
        })
        .cs()?;
    drop(lock);
    a.unlock.link_unlocked(&unlocked)?;
    print_table(&a, &unlocked);
    Ok(())
}

/// With --print-table: the table lines (keys hidden unless --showkeys).
fn print_table(a: &Args, unlocked: &ucrypt::Unlocked) {
    if a.print_table {
        let name = a.name.as_deref().unwrap_or("ucrypt");
        for mut line in unlocked.table_lines(a.showkeys, name) {
            println!("{line}");
            zeroize::Zeroize::zeroize(&mut line);
        }
    }
}
