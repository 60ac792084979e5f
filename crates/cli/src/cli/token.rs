//! `ucrypt token <add|remove|import|export|unassign> DEVICE`: cryptsetup's LUKS2 token
//! action, through libcryptsetup (`crypt_token_*`; nothing needs the kernel).
//!
//! - `add --key-description D`: a `luks2-keyring` token (the passphrase comes from the
//!   kernel keyring entry D when opening), assigned to `--key-slot` or, without it, every
//!   active keyslot; `--unbound` leaves it unassigned.
//! - `remove --token-id N`.
//! - `import [--json-file F]`: a token object from F or standard input, optionally
//!   assigned to `--key-slot`.
//! - `export --token-id N [--json-file F]`: the stored JSON to F or standard output (a
//!   newline only on a terminal, as cryptsetup).
//! - `unassign --token-id N --key-slot S`.
//!
//! Checks, their order and what is written are the library's (`ucrypt::luks::tokens`,
//! cryptsetup 2.6's): usage mistakes and refused ids exit 1, library errors by their errno.

use super::exit::lib_error;
use super::luks::{verbose, DeviceArgs};
use super::CliError;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use ucrypt::header::VolumeType;
use ucrypt::luks::tokens::{self, Action};

/// Arguments of `ucrypt token`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// What to do: add (a luks2-keyring token), remove, import, export or unassign.
    #[arg(value_parser = ["add", "remove", "import", "export", "unassign"])]
    action: String,
    #[command(flatten)]
    dev: DeviceArgs,
    /// Token number (default: the first free one for add/import; required otherwise).
    #[arg(long, value_name = "INT")]
    token_id: Option<u32>,
    /// Replace the token already at --token-id (add, import).
    #[arg(long)]
    token_replace: bool,
    /// The keyslot the token is assigned to (add: default every active keyslot; import:
    /// default none; unassign: required).
    #[arg(short = 'S', long, value_name = "INT")]
    key_slot: Option<u32>,
    /// Read (import) or write (export) the token JSON from or to this file ('-' or none:
    /// standard input or output).
    #[arg(long, value_name = "FILE")]
    json_file: Option<PathBuf>,
    /// Kernel keyring description of the passphrase for a luks2-keyring token (add).
    #[arg(long, value_name = "STRING")]
    key_description: Option<String>,
    /// Add the token assigned to no keyslot.
    #[arg(long)]
    unbound: bool,
    /// Do not ask for the JSON with a prompt when standard input is a terminal.
    #[arg(short = 'q', long)]
    batch_mode: bool,
    /// Print "Token N created." / "Token N removed.".
    #[arg(short, long)]
    verbose: bool,
}

impl Args {
    /// The action as the library names it.
    fn action(&self) -> Action {
        match self.action.as_str() {
            "add" => Action::Add,
            "remove" => Action::Remove,
            "import" => Action::Import,
            "export" => Action::Export,
            _ => Action::Unassign,
        }
    }

    /// The options as the library takes them.
    fn token(&self) -> tokens::Token {
        tokens::Token {
            id: self.token_id,
            replace: self.token_replace,
            key_slot: self.key_slot,
            key_description: self.key_description.clone(),
            unbound: self.unbound,
        }
    }
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let (action, t) = (a.action(), a.token());
    tokens::verify(action, &t).map_err(lib_error)?;
    let _claimed = if action == Action::Export {
        Vec::new()
    } else {
        super::luks::claim_for_header_change(&a.dev)?
    };
    let mut cd = a.dev.load(VolumeType::Luks2)?;
    let id = t.id.unwrap_or_default();
    match action {
        Action::Add => {
            let id = tokens::add(&mut cd, &t).map_err(lib_error)?;
            verbose(a.verbose, format_args!("Token {id} created."));
        }
        Action::Remove => {
            tokens::remove(&mut cd, id).map_err(lib_error)?;
            verbose(a.verbose, format_args!("Token {id} removed."));
        }
        Action::Import => {
            let id = tokens::import(&mut cd, &t, || read_json(&a)).map_err(lib_error)?;
            verbose(a.verbose, format_args!("Token {id} created."));
        }
        Action::Export => export(&a, &tokens::export(&mut cd, id).map_err(lib_error)?)?,
        Action::Unassign => {
            tokens::unassign(&mut cd, id, a.key_slot.unwrap_or_default()).map_err(lib_error)?
        }
    }
    verbose(a.verbose, "Command successful.");
    Ok(())
}

/// Whether --json-file names standard input/output.
fn is_std(p: &Option<PathBuf>) -> bool {
    p.as_ref().is_none_or(|p| p.as_os_str() == "-")
}

/// The token JSON for import: from --json-file, or standard input (asked for on a
/// terminal).
fn read_json(a: &Args) -> ucrypt::Result<String> {
    match &a.json_file {
        Some(p) if !is_std(&a.json_file) => tokens::read_json_file(p),
        _ => {
            if std::io::stdin().is_terminal() && !a.batch_mode {
                println!("Provide valid LUKS2 token JSON:");
            }
            tokens::read_json(std::io::stdin().lock(), "standard input")
        }
    }
}

/// The exported JSON to --json-file, or standard output (a newline only on a terminal, as
/// cryptsetup).
fn export(a: &Args, json: &str) -> Result<(), CliError> {
    match &a.json_file {
        Some(p) if !is_std(&a.json_file) => tokens::write_json_file(p, json).map_err(lib_error),
        _ => {
            let mut out = std::io::stdout().lock();
            out.write_all(json.as_bytes())
                .and_then(|()| {
                    if std::io::stdout().is_terminal() {
                        out.write_all(b"\n")
                    } else {
                        Ok(())
                    }
                })
                .and_then(|()| out.flush())
                .map_err(|e| anyhow::anyhow!("failed to write JSON to standard output: {e}"))?;
            Ok(())
        }
    }
}

/// cryptsetup's token options for opening: LUKS2 tokens are tried before any passphrase
/// (every token, or `--token-id`, of any type or `--token-type`); with `--token-only` no
/// passphrase is asked for when none unlocks.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct UnlockArgs {
    /// Try only this LUKS2 token before asking for a passphrase.
    #[arg(long, value_name = "INT")]
    pub(crate) token_id: Option<u32>,
    /// Do not ask for a passphrase if no token unlocks the volume.
    #[arg(long)]
    pub(crate) token_only: bool,
    /// Try only tokens of this type (luks2-keyring, clevis, systemd-tpm2, systemd-fido2,
    /// systemd-pkcs11, or another plugin's type).
    #[arg(long, value_name = "STRING")]
    pub(crate) token_type: Option<String>,
    /// Seconds to keep trying tokens whose device or server is missing (a FIDO2 key not
    /// plugged in yet, no TPM2 yet, tang unreachable), as systemd's crypttab token-timeout=;
    /// also the longest a clevis decrypt may take (default 0: each token once, clevis 30 s).
    #[arg(long, value_name = "SECS", default_value_t = 0)]
    pub(crate) token_timeout: u64,
}

impl UnlockArgs {
    /// The options as the library's unlock takes them.
    pub(crate) fn tokens(&self) -> ucrypt::unlock::Tokens {
        ucrypt::unlock::Tokens {
            id: self.token_id,
            only: self.token_only,
            kind: self.token_type.clone(),
            timeout: std::time::Duration::from_secs(self.token_timeout),
            ..ucrypt::unlock::Tokens::default()
        }
    }
}
