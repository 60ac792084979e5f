//! The `token` action on a LUKS2 header (adding, importing, exporting, removing and
//! unassigning tokens; how a token unlocks is [`crate::unlock::token`]'s), with cryptsetup
//! 2.6's checks in its order (`action_token`, `verify_token`): option combinations each
//! action refuses before the device is read, then the token and keyslot named, then the
//! write; a token whose assignment fails is removed again.

use super::{CryptDevice, KeyslotStatus, TokenStatus};
use crate::error::{Context, Error, Result};
use std::io::Read;
use std::path::Path;

/// libcryptsetup's largest LUKS2 metadata area (4 MiB, binary header included): no token
/// JSON can be larger.
pub const MAX_TOKEN_JSON: u64 = 4 << 20;

/// What the `token` action does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// A `luks2-keyring` token (the passphrase is the kernel keyring key it names).
    Add,
    /// A token removed.
    Remove,
    /// A token's JSON stored as it is given.
    Import,
    /// A token's JSON read.
    Export,
    /// A token unassigned from a keyslot.
    Unassign,
}

/// The options of the `token` action.
#[derive(Debug, Clone, Default)]
pub struct Token {
    /// `--token-id` (add, import: default the first free one; required otherwise).
    pub id: Option<u32>,
    /// `--token-replace`: a token already at `id` is replaced (add, import).
    pub replace: bool,
    /// `--key-slot`: the keyslot the token is assigned to (add: default every active
    /// keyslot; import: default none; unassign: required).
    pub key_slot: Option<u32>,
    /// `--key-description` (add): the kernel keyring key of the passphrase.
    pub key_description: Option<String>,
    /// `--unbound` (add): assigned to no keyslot.
    pub unbound: bool,
}

fn usage(msg: &str) -> Error {
    Error::Invalid(msg.into())
}

/// cryptsetup's `verify_token`: the option combinations `action` refuses, checked before
/// the device is read.
///
/// # Errors
/// The first combination refused, in cryptsetup's words (invalid).
pub fn verify(action: Action, t: &Token) -> Result<()> {
    if action == Action::Add && t.key_description.is_none() {
        return Err(usage(
            "--key-description parameter is mandatory for token add action",
        ));
    }
    if t.id.is_none() && matches!(action, Action::Remove | Action::Export) {
        return Err(usage(
            "action requires specific token; use --token-id parameter",
        ));
    }
    if t.unbound {
        if action != Action::Add {
            return Err(usage(
                "option --unbound is valid only with token add action",
            ));
        }
        if t.key_slot.is_some() {
            return Err(usage("options --key-slot and --unbound cannot be combined"));
        }
    }
    if action == Action::Unassign {
        if t.key_slot.is_none() {
            return Err(usage(
                "action requires specific keyslot; use --key-slot parameter",
            ));
        }
        if t.id.is_none() {
            return Err(usage(
                "action requires specific token; use --token-id parameter",
            ));
        }
    }
    Ok(())
}

/// The checks `add` and `import` share: a given id must be valid and free (or replaced),
/// a given keyslot active.
fn check_target(cd: &mut CryptDevice, t: &Token) -> Result<()> {
    if let Some(id) = t.id {
        match cd.token_status(id).0 {
            TokenStatus::Invalid => return Err(usage(&format!("token {id} is invalid"))),
            s if s.in_use() && !t.replace => {
                return Err(usage(&format!(
                    "token {id} in use (--token-replace replaces it)"
                )))
            }
            _ => {}
        }
    }
    if let Some(slot) = t.key_slot {
        if cd.keyslot_status(slot) == KeyslotStatus::Inactive {
            return Err(usage(&format!("keyslot {slot} is not active")));
        }
    }
    Ok(())
}

/// Refuses a token id that is out of range or not in use.
fn check_in_use(cd: &mut CryptDevice, id: u32) -> Result<()> {
    match cd.token_status(id).0 {
        TokenStatus::Invalid => Err(usage(&format!("token {id} is invalid"))),
        TokenStatus::Inactive => Err(usage(&format!("token {id} is not in use"))),
        _ => Ok(()),
    }
}

/// Assigns a token just stored to `slot` (none: every active keyslot); on failure the
/// token is removed again, as cryptsetup does.
fn assign_or_undo(cd: &mut CryptDevice, id: u32, slot: Option<u32>) -> Result<()> {
    if let Err(e) = cd.assign_token(id, slot) {
        let _ = cd.set_token_json(Some(id), None);
        let what = slot.map_or("the active keyslots".to_string(), |s| {
            format!("keyslot {s}")
        });
        return Err(e).context(format!("failed to assign token {id} to {what}"));
    }
    Ok(())
}

/// `token add`: a `luks2-keyring` token for `t.key_description`, assigned unless
/// `t.unbound`. The token's id.
///
/// # Errors
/// The id is invalid or in use, the keyslot is not active (invalid); libcryptsetup's.
pub fn add(cd: &mut CryptDevice, t: &Token) -> Result<u32> {
    check_target(cd, t)?;
    let desc = t.key_description.as_deref().unwrap_or_default();
    let id = cd.add_keyring_token(t.id, desc)?;
    if !t.unbound {
        assign_or_undo(cd, id, t.key_slot)?;
    }
    Ok(id)
}

/// `token import`: the JSON that `json` gives (asked for once the target is checked)
/// stored, and assigned to `t.key_slot` if given. The token's id.
///
/// # Errors
/// As [`add`]; `json`'s.
pub fn import(
    cd: &mut CryptDevice,
    t: &Token,
    json: impl FnOnce() -> Result<String>,
) -> Result<u32> {
    check_target(cd, t)?;
    let json = json()?;
    let id = cd.set_token_json(t.id, Some(&json))?;
    if t.key_slot.is_some() {
        assign_or_undo(cd, id, t.key_slot)?;
    }
    Ok(id)
}

/// Reads a token's JSON for [`import`] from `input` (`name` in messages): at most
/// [`MAX_TOKEN_JSON`] bytes (larger cannot fit any LUKS2 header), UTF-8.
///
/// # Errors
/// Unreadable, too large or not text (invalid).
pub fn read_json(input: impl Read, name: &str) -> Result<String> {
    let mut buf = Vec::new();
    input
        .take(MAX_TOKEN_JSON)
        .read_to_end(&mut buf)
        .map_err(|e| Error::Invalid(format!("failed to read JSON file {name}: {e}")))?;
    if buf.len() as u64 >= MAX_TOKEN_JSON {
        return Err(Error::Invalid(format!(
            "{name}: token JSON of 4 MiB or more cannot fit a LUKS2 header"
        )));
    }
    String::from_utf8(buf)
        .map_err(|_| Error::Invalid(format!("{name}: token JSON is not text (UTF-8)")))
}

/// [`read_json`] of the file `path`.
///
/// # Errors
/// It cannot be opened; as [`read_json`].
pub fn read_json_file(path: &Path) -> Result<String> {
    let f = std::fs::File::open(path).map_err(|e| {
        Error::Invalid(format!(
            "failed to open file {} in read-only mode: {e}",
            path.display()
        ))
    })?;
    read_json(f, &path.display().to_string())
}

/// `token remove`.
///
/// # Errors
/// The token is invalid or not in use (invalid); libcryptsetup's.
pub fn remove(cd: &mut CryptDevice, id: u32) -> Result<()> {
    check_in_use(cd, id)?;
    cd.set_token_json(Some(id), None)?;
    Ok(())
}

/// `token export`: the token's stored JSON.
///
/// # Errors
/// As [`remove`].
pub fn export(cd: &mut CryptDevice, id: u32) -> Result<String> {
    check_in_use(cd, id)?;
    Ok(cd.token_json(id)?)
}

/// Writes an exported token's JSON to the file `path`: owner-only, as cryptsetup creates
/// it; unlike cryptsetup's (which overwrites in place and keeps any longer old tail), an
/// existing file is truncated.
///
/// # Errors
/// The file cannot be written (invalid).
pub fn write_json_file(path: &Path, json: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(json.as_bytes()))
        .map_err(|e| Error::Invalid(format!("failed to write JSON file {}: {e}", path.display())))
}

/// `token unassign`: the token no longer opens `slot`.
///
/// # Errors
/// It is not assigned to it (invalid); libcryptsetup's.
pub fn unassign(cd: &mut CryptDevice, id: u32, slot: u32) -> Result<()> {
    let failed = || format!("failed to unassign token {id} from keyslot {slot}");
    if !cd.token_is_assigned(id, slot).with_context(failed)? {
        return Err(usage(&format!(
            "token {id} is not assigned to keyslot {slot}"
        )));
    }
    cd.unassign_token(id, Some(slot)).with_context(failed)
}
