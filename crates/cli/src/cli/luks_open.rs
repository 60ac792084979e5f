//! `ucrypt luksOpen <device> --test-passphrase`: checks a passphrase against the header
//! without mapping anything (libcryptsetup's activate with a NULL name), and
//! `--print-table`: prints the dm-crypt table line cryptsetup would load (key hidden
//! unless `--showkeys`), for `ucrypt read/write --table-file -`.
//!
//! Serving the volume over NBD belongs to `ucrypt open`.

use super::exit::lib_error;
use super::luks::DeviceArgs;
use super::plain_args::PlainArgs;
use super::prompt::Terminal;
use super::secret::KeyFileArgs;
use super::{CliError, WithCode, EXIT_PARAMS};
use ucrypt::header::VolumeType;
use ucrypt::unlock::{Outcome, Request};

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
    let request = Request {
        header: a.dev.header.clone(),
        kind: Some(kind),
        key: a.key.inputs(),
        key_slot: a.key_slot,
        tokens: a.token.tokens(),
        plain: a.plain.inputs(),
        tcrypt: a.tcrypt.inputs(),
        allow_discards: a.allow_discards,
        allow_null_cipher: a.insecure_allow_null_cipher,
        // luksOpen asks once.
        tries: 1,
        test_passphrase: a.test_passphrase,
        volume_wanted: a.print_table,
        unbound: a.unlock.unbound,
        serialize_memory_hard_pbkdf: a.unlock.serialize_memory_hard_pbkdf,
        link_vk_to_keyring: a.unlock.link_vk_to_keyring.clone(),
        ..Request::new(&a.dev.device)
    };
    request.check().map_err(lib_error)?;
    if !a.test_passphrase && !a.print_table {
        return Err(anyhow::anyhow!(
            "luksOpen only checks (--test-passphrase) or prints the table (--print-table); \
             serve the volume with `ucrypt open`"
        ))
        .code(EXIT_PARAMS);
    }
    let mut prompt = Terminal::new(&a.tcrypt.progress);
    if let Outcome::Unlocked(unlocked, _) = request.unlock(&mut prompt).map_err(lib_error)? {
        print_table(&a, &unlocked);
    }
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
