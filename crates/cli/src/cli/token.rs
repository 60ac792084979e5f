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
//! Checks, their order and exit codes are cryptsetup 2.6's (`action_token`,
//! `verify_token`): usage mistakes and refused ids exit 1, library errors by their errno.

use super::luks::{verbose, CsResult, DeviceArgs};
use super::{CliError, WithCode, EXIT_PARAMS};
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use ucrypt::header::VolumeType;
use ucrypt::luks::{CryptDevice, KeyslotStatus, TokenStatus};

/// libcryptsetup's largest LUKS2 metadata area (4 MiB, binary header included): no token
/// JSON can be larger.
const MAX_TOKEN_JSON: u64 = 4 << 20;

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

/// A usage mistake (exit 1) with cryptsetup's wording.
fn usage(msg: &str) -> CliError {
    anyhow::anyhow!("{msg}").into()
}

/// cryptsetup's `verify_token`: option combinations each action refuses before the device
/// is read.
fn verify(a: &Args) -> Result<(), CliError> {
    let act = a.action.as_str();
    if act == "add" && a.key_description.is_none() {
        return Err(usage(
            "--key-description parameter is mandatory for token add action",
        ));
    }
    if a.token_id.is_none() && matches!(act, "remove" | "export") {
        return Err(usage(
            "action requires specific token; use --token-id parameter",
        ));
    }
    if a.unbound {
        if act != "add" {
            return Err(usage(
                "option --unbound is valid only with token add action",
            ));
        }
        if a.key_slot.is_some() {
            return Err(usage("options --key-slot and --unbound cannot be combined"));
        }
    }
    if act == "unassign" {
        if a.key_slot.is_none() {
            return Err(usage(
                "action requires specific keyslot; use --key-slot parameter",
            ));
        }
        if a.token_id.is_none() {
            return Err(usage(
                "action requires specific token; use --token-id parameter",
            ));
        }
    }
    Ok(())
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    verify(&a)?;
    let _claimed = if a.action == "export" {
        Vec::new()
    } else {
        super::luks::claim_for_header_change(&a.dev)?
    };
    let mut cd = a.dev.load(VolumeType::Luks2)?;
    match a.action.as_str() {
        "add" => {
            let id = add(&a, &mut cd)?;
            verbose(a.verbose, format_args!("Token {id} created."));
        }
        "remove" => {
            let id = a.token_id.unwrap_or_default();
            match cd.token_status(id).0 {
                TokenStatus::Invalid => return Err(usage(&format!("token {id} is invalid"))),
                TokenStatus::Inactive => return Err(usage(&format!("token {id} is not in use"))),
                _ => {}
            }
            cd.set_token_json(Some(id), None).cs()?;
            verbose(a.verbose, format_args!("Token {id} removed."));
        }
        "import" => {
            let id = import(&a, &mut cd)?;
            verbose(a.verbose, format_args!("Token {id} created."));
        }
        "export" => export(&a, &mut cd)?,
        _ => unassign(&a, &mut cd)?,
    }
    verbose(a.verbose, "Command successful.");
    Ok(())
}

/// The checks `add` and `import` share: a given --token-id must be valid and free (or
/// --token-replace), a given --key-slot active.
fn check_target(a: &Args, cd: &mut CryptDevice) -> Result<(), CliError> {
    if let Some(id) = a.token_id {
        match cd.token_status(id).0 {
            TokenStatus::Invalid => return Err(usage(&format!("token {id} is invalid"))),
            s if s.in_use() && !a.token_replace => {
                return Err(usage(&format!(
                    "token {id} in use (--token-replace replaces it)"
                )))
            }
            _ => {}
        }
    }
    if let Some(slot) = a.key_slot {
        if cd.keyslot_status(slot) == KeyslotStatus::Inactive {
            return Err(usage(&format!("keyslot {slot} is not active")));
        }
    }
    Ok(())
}

/// Assigns a token just stored to --key-slot (None: every active keyslot); on failure the
/// token is removed again, as cryptsetup does.
fn assign_or_undo(cd: &mut CryptDevice, id: u32, slot: Option<u32>) -> Result<(), CliError> {
    if let Err(e) = cd.assign_token(id, slot) {
        let _ = cd.set_token_json(Some(id), None);
        let what = slot.map_or("the active keyslots".to_string(), |s| {
            format!("keyslot {s}")
        });
        return Err(anyhow::Error::new(e).context(format!("failed to assign token {id} to {what}")))
            .cs();
    }
    Ok(())
}

fn add(a: &Args, cd: &mut CryptDevice) -> Result<u32, CliError> {
    check_target(a, cd)?;
    let desc = a.key_description.as_deref().unwrap_or_default();
    let id = cd.add_keyring_token(a.token_id, desc).cs()?;
    if !a.unbound {
        assign_or_undo(cd, id, a.key_slot)?;
    }
    Ok(id)
}

fn import(a: &Args, cd: &mut CryptDevice) -> Result<u32, CliError> {
    check_target(a, cd)?;
    let json = read_json(a)?;
    let id = cd.set_token_json(a.token_id, Some(&json)).cs()?;
    if a.key_slot.is_some() {
        assign_or_undo(cd, id, a.key_slot)?;
    }
    Ok(id)
}

/// Whether --json-file names standard input/output.
fn is_std(p: &Option<PathBuf>) -> bool {
    p.as_ref().is_none_or(|p| p.as_os_str() == "-")
}

/// The token JSON for import: from --json-file or standard input, at most
/// [`MAX_TOKEN_JSON`] bytes (larger cannot fit any LUKS2 header).
fn read_json(a: &Args) -> Result<String, CliError> {
    let (mut input, name): (Box<dyn Read>, String) = if is_std(&a.json_file) {
        if std::io::stdin().is_terminal() && !a.batch_mode {
            println!("Provide valid LUKS2 token JSON:");
        }
        (Box::new(std::io::stdin().lock()), "standard input".into())
    } else {
        let p = a.json_file.as_deref().unwrap_or_else(|| "-".as_ref());
        let f = std::fs::File::open(p).map_err(|e| {
            anyhow::anyhow!("failed to open file {} in read-only mode: {e}", p.display())
        })?;
        (Box::new(f), p.display().to_string())
    };
    let mut buf = Vec::new();
    (&mut input)
        .take(MAX_TOKEN_JSON)
        .read_to_end(&mut buf)
        .map_err(|e| anyhow::anyhow!("failed to read JSON file {name}: {e}"))?;
    if buf.len() as u64 >= MAX_TOKEN_JSON {
        return Err(anyhow::anyhow!(
            "{name}: token JSON of 4 MiB or more cannot fit a LUKS2 header"
        ))
        .code(EXIT_PARAMS);
    }
    String::from_utf8(buf)
        .map_err(|_| anyhow::anyhow!("{name}: token JSON is not text (UTF-8)"))
        .code(EXIT_PARAMS)
}

fn export(a: &Args, cd: &mut CryptDevice) -> Result<(), CliError> {
    let id = a.token_id.unwrap_or_default();
    match cd.token_status(id).0 {
        TokenStatus::Invalid => return Err(usage(&format!("token {id} is invalid"))),
        TokenStatus::Inactive => return Err(usage(&format!("token {id} is not in use"))),
        _ => {}
    }
    let json = cd.token_json(id).cs()?;
    if is_std(&a.json_file) {
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
        return Ok(());
    }
    let p = a.json_file.as_deref().unwrap_or_else(|| "-".as_ref());
    // Owner-only, as cryptsetup creates it; unlike cryptsetup's (which overwrites in place
    // and keeps any longer old tail), an existing file is truncated.
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(p)
        .and_then(|mut f| f.write_all(json.as_bytes()))
        .map_err(|e| anyhow::anyhow!("failed to write JSON file {}: {e}", p.display()))?;
    Ok(())
}

fn unassign(a: &Args, cd: &mut CryptDevice) -> Result<(), CliError> {
    let (id, slot) = (
        a.token_id.unwrap_or_default(),
        a.key_slot.unwrap_or_default(),
    );
    let failed = || format!("failed to unassign token {id} from keyslot {slot}");
    if !cd
        .token_is_assigned(id, slot)
        .map_err(|e| anyhow::Error::new(e).context(failed()))
        .cs()?
    {
        return Err(usage(&format!(
            "token {id} is not assigned to keyslot {slot}"
        )));
    }
    cd.unassign_token(id, Some(slot))
        .map_err(|e| anyhow::Error::new(e).context(failed()))
        .cs()
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
