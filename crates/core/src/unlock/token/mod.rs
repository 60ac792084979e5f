//! LUKS2 tokens, tried before any passphrase as cryptsetup tries them: every token in id
//! order, or only `--token-id`, of any type or only `--token-type`. Each type goes its own
//! way:
//!
//! - `clevis` (tang, tpm2, sss pins): `clevis decrypt` gives the keyslot passphrase
//!   ([`clevis`]), as `clevis luks unlock` does;
//! - `systemd-recovery`: holds no secret; the recovery key is typed at the passphrase prompt;
//! - everything else (`luks2-keyring`, `systemd-tpm2`, `systemd-fido2`, `systemd-pkcs11`, any
//!   type with a plugin) through libcryptsetup and its external token plugins, with a PIN
//!   when the plugin asks for one and the user named tokens (`--token-only`, `--token-id`,
//!   `--token-type`, as cryptsetup asks only then).
//!
//! A token that cannot work here (no TPM2, no FIDO2 key, tang unreachable, clevis not
//! installed) is passed over with one line through [`Prompt::verbose`]; one whose device or
//! server is missing is tried again until `--token-timeout` runs out. With `--token-only` no
//! passphrase follows when none unlocks.

mod clevis;

use super::{inputs::read_key_input, KeyFile, Secret};
use crate::error::{Context, Error, Result};
use crate::prompt::{Prompt, Step};
use crate::VolumeType;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use ucrypt_crypto::VolumeKey;
use ucrypt_cryptsetup::{CryptDevice, HeaderType};
use ucrypt_format::FormatError;

/// Which tokens to try, and how.
#[derive(Debug, Clone)]
pub struct Tokens {
    /// Only this token (`--token-id`).
    pub id: Option<u32>,
    /// No passphrase when no token unlocks (`--token-only`).
    pub only: bool,
    /// Only tokens of this type (`--token-type`).
    pub kind: Option<String>,
    /// How long a token whose device or server is missing (no FIDO2 key plugged in yet,
    /// tang not reachable yet) is tried again (`--token-timeout`, systemd's crypttab
    /// `token-timeout=`); zero: each token once, as cryptsetup. Also the longest one
    /// `clevis decrypt` may run (30 s when zero).
    pub timeout: Duration,
    /// A token PIN from this file instead of a prompt (the first line: one trailing newline
    /// is dropped). [`super::Request::unlock`] sets it to the key file under `--token-only`,
    /// where the key file has no passphrase to give.
    pub pin_file: Option<KeyFile>,
    /// How often a PIN typed at a terminal is asked for (cryptsetup's `--tries`).
    pub pin_tries: u32,
}

impl Default for Tokens {
    fn default() -> Self {
        Tokens {
            id: None,
            only: false,
            kind: None,
            timeout: Duration::ZERO,
            pin_file: None,
            pin_tries: 3,
        }
    }
}

/// A libcryptsetup context with the header of `kind` loaded, and the staged copy of a
/// remote detached header it reads (kept as long as the context).
pub(crate) struct Loaded {
    pub(crate) cd: CryptDevice,
    _staged: Option<crate::remote_header::RemoteHeader>,
}

/// Opens `device` (with its detached `header`) and loads its header of `kind`; a header
/// that is an NBD URI is read through a staged copy.
///
/// # Errors
/// The header cannot be staged (a device error), or no valid header of `kind`.
pub(crate) fn load(device: &Path, header: Option<&Path>, kind: VolumeType) -> Result<Loaded> {
    let staged = match header {
        Some(h) if crate::remote_header::is_remote(h) => Some(stage(h)?),
        _ => None,
    };
    let header: Option<PathBuf> = match &staged {
        Some(s) => Some(s.path().to_path_buf()),
        None => header.map(Path::to_path_buf),
    };
    let mut cd = crate::header::crypt_device(device, header.as_deref())?;
    crate::header::load_luks(&mut cd, kind)?;
    Ok(Loaded {
        cd,
        _staged: staged,
    })
}

/// A header at an NBD URI, copied into a memfd for libcryptsetup.
fn stage(uri: &Path) -> Result<crate::remote_header::RemoteHeader> {
    let uri = uri.display().to_string();
    if crate::open::is_ram(&uri) {
        return Err(Error::Invalid(crate::header::ram_holds_no_header(&uri)));
    }
    crate::remote_header::RemoteHeader::stage(&uri, true)
        .map_err(|e| e.with_kind(crate::ErrorKind::Device))
}

/// Why one token did not unlock, ranked as libcryptsetup ranks its errors when it tries
/// every token (a PIN that is needed says most, a wrong keyslot passphrase next, a missing
/// device next, an unusable token least), so that `--token-only` fails with what matters.
struct Failure {
    rank: u8,
    /// Worth trying again while `--token-timeout` runs (a device or server missing).
    again: bool,
    /// The `-v` line, without the token's number and type.
    line: String,
    error: Error,
}

impl Failure {
    fn unusable(line: impl Into<String>) -> Failure {
        let line = line.into();
        Failure {
            rank: 0,
            again: false,
            error: Error::Invalid(line.clone()),
            line,
        }
    }

    /// A libcryptsetup error of token `id` of type `kind`, with cryptsetup's meaning of
    /// its errno.
    fn from_library(e: FormatError, kind: &str) -> Failure {
        let errno = match &e {
            FormatError::Cryptsetup { errno, .. } => *errno,
            _ => 0,
        };
        let (rank, again, line) = match errno {
            libc::ENOANO => (3, false, "needs a PIN".to_string()),
            libc::EPERM => (
                2,
                false,
                "cannot unlock its keyslot(s) (wrong keyslot passphrase)".to_string(),
            ),
            libc::EAGAIN => (
                1,
                true,
                match kind {
                    "systemd-tpm2" => "no TPM2 device found".to_string(),
                    "systemd-fido2" => "no FIDO2 security key found".to_string(),
                    "systemd-pkcs11" => "its PKCS#11 security token is not present".to_string(),
                    _ => "requires additional missing resource".to_string(),
                },
            ),
            libc::ENOENT if kind == "luks2-keyring" => (
                0,
                false,
                "its passphrase is not in the kernel keyring".to_string(),
            ),
            libc::ENOENT => (
                0,
                false,
                format!(
                    "not usable here (no token plugin for type {kind} in {}, or it is disabled)",
                    ucrypt_cryptsetup::external_tokens_dir()
                ),
            ),
            _ => (0, false, e.to_string()),
        };
        Failure {
            rank,
            again,
            line,
            error: e.into(),
        }
    }
}

/// The volume key through a token of `device` (local LUKS2 only), or None to go on with a
/// passphrase.
///
/// # Errors
/// Only with `--token-only`: no token is usable (invalid), or the most telling failure of
/// the tokens tried (a needed PIN, a wrong keyslot passphrase: a permission error).
pub fn volume_key(
    device: &Path,
    header: Option<&Path>,
    kind: VolumeType,
    tokens: &Tokens,
    prompt: &mut dyn Prompt,
) -> Result<Option<VolumeKey>> {
    let usage = |msg: String| -> Result<Option<VolumeKey>> {
        if tokens.only {
            Err(Error::Invalid(msg))
        } else {
            Ok(None)
        }
    };
    let local_luks = matches!(kind, VolumeType::Luks | VolumeType::Luks2)
        && !crate::remote_header::is_remote(device);
    if !local_luks {
        return usage(
            "--token-only needs a local LUKS2 volume (tokens are a LUKS2 feature)".into(),
        );
    }
    let mut cd = match load(device, header, kind) {
        Ok(l) => l,
        Err(_) if !tokens.only => return Ok(None),
        Err(e) => return Err(e),
    };
    if cd.cd.info().kind != Some(HeaderType::Luks2) {
        return usage("--token-only needs LUKS2 (LUKS1 has no tokens)".into());
    }
    let present: Vec<(u32, String)> = (0..32)
        .filter_map(|t| match cd.cd.token_status(t) {
            (s, kind) if s.in_use() => Some((t, kind.unwrap_or_default())),
            _ => None,
        })
        .collect();
    // No token at all: nothing to try (and no spinner flash on every open).
    if present.is_empty() {
        return usage(format!(
            "{} has no LUKS2 token (--token-only)",
            device.display()
        ));
    }
    let chosen: Vec<(u32, String)> = present
        .into_iter()
        .filter(|(t, k)| {
            tokens.id.is_none_or(|id| id == *t) && tokens.kind.as_ref().is_none_or(|want| want == k)
        })
        .collect();
    if chosen.is_empty() {
        let what = match (tokens.id, &tokens.kind) {
            (Some(id), Some(k)) => format!("token {id} of type {k}"),
            (Some(id), None) => format!("token {id}"),
            (None, Some(k)) => format!("token of type {k}"),
            (None, None) => "token".into(),
        };
        prompt.verbose(&format!("No {what} on {}.", device.display()));
        return usage(format!("{} has no {what} (--token-only)", device.display()));
    }
    // cryptsetup asks for a PIN only when the user named tokens; otherwise a token that
    // needs one is passed over for the passphrase.
    let ask_pin = tokens.only || tokens.id.is_some() || tokens.kind.is_some();
    let deadline = Instant::now() + tokens.timeout;
    let mut said: Vec<Option<String>> = vec![None; chosen.len()];
    let mut worst: Option<Failure> = None;
    loop {
        let mut again = false;
        for (i, (id, kind)) in chosen.iter().enumerate() {
            let f = match try_one(&mut cd.cd, *id, kind, tokens, ask_pin, prompt) {
                Ok(key) => {
                    prompt.verbose(&format!("Token {id} ({kind}) unlocked the volume key."));
                    return Ok(Some(key));
                }
                Err(f) => f,
            };
            // One line per token, and again only if what it says changes.
            if said[i].as_deref() != Some(f.line.as_str()) {
                prompt.verbose(&format!("Token {id} ({kind}): {}.", f.line));
                said[i] = Some(f.line.clone());
            }
            again |= f.again;
            if worst.as_ref().is_none_or(|w| f.rank > w.rank) {
                worst = Some(f);
            }
        }
        let now = Instant::now();
        if !again || now >= deadline {
            break;
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(500)));
    }
    if !tokens.only {
        return Ok(None);
    }
    let error = worst.map_or_else(|| Error::Invalid("no usable token".into()), |w| w.error);
    Err(error).with_context(|| format!("no token unlocks {} (--token-only)", device.display()))
}

/// Tries token `id` of type `kind` once (a PIN asked for up to `pin_tries` times).
fn try_one(
    cd: &mut CryptDevice,
    id: u32,
    kind: &str,
    tokens: &Tokens,
    ask_pin: bool,
    prompt: &mut dyn Prompt,
) -> std::result::Result<VolumeKey, Failure> {
    match kind {
        "clevis" => return try_clevis(cd, id, tokens, prompt),
        "systemd-recovery" => {
            return Err(Failure::unusable(
                "holds no secret: its recovery key is typed at the passphrase prompt",
            ))
        }
        _ => {}
    }
    let first = {
        let _busy = prompt.busy(Step::Token);
        cd.volume_key_by_token(Some(id), None, None)
    };
    let e = match first {
        Ok((_, key)) => return Ok(key),
        Err(e) => e,
    };
    let needs_pin = matches!(e, FormatError::Cryptsetup { errno, .. } if errno == libc::ENOANO);
    if !needs_pin {
        return Err(Failure::from_library(e, kind));
    }
    if !ask_pin {
        let mut f = Failure::from_library(e, kind);
        f.line = "needs a PIN (name the token with --token-only, --token-id or --token-type                   to be asked for it)"
            .into();
        return Err(f);
    }
    let tries = if tokens.pin_file.is_none() && prompt.interactive() {
        tokens.pin_tries.max(1)
    } else {
        1
    };
    let mut last = e;
    for attempt in 1..=tries {
        let pin = read_pin(id, tokens.pin_file.as_ref(), prompt).map_err(|e| Failure {
            rank: 3,
            again: false,
            line: format!("no PIN: {e}"),
            error: e,
        })?;
        let r = {
            let _busy = prompt.busy(Step::Token);
            cd.volume_key_by_token(Some(id), None, Some(&pin))
        };
        match r {
            Ok((_, key)) => return Ok(key),
            Err(e @ FormatError::Cryptsetup { errno, .. }) if errno == libc::ENOANO => {
                if attempt < tries {
                    prompt.notice("No token could be unlocked with this PIN.");
                }
                last = e;
            }
            Err(e) => return Err(Failure::from_library(e, kind)),
        }
    }
    let mut f = Failure::from_library(last, kind);
    f.line = "no token could be unlocked with this PIN".into();
    Err(f)
}

/// A token PIN: from the PIN file (one trailing newline dropped), else asked for. An
/// empty one is no PIN: it is never tried, since every wrong try counts against a smart
/// card's or FIDO2 key's retry counter.
fn read_pin(id: u32, file: Option<&KeyFile>, prompt: &mut dyn Prompt) -> Result<Secret> {
    let pin = match file {
        Some(KeyFile {
            path: Some(p),
            offset,
            size,
        }) => {
            let mut pin = read_key_input(p, *offset, *size, prompt)?;
            if pin.last() == Some(&b'\n') {
                pin.pop();
            }
            pin
        }
        _ => prompt.passphrase(&format!("Enter token {id} PIN: "))?,
    };
    if pin.is_empty() {
        return Err(Error::Invalid(
            "an empty PIN was given; it is not tried".into(),
        ));
    }
    Ok(pin)
}

/// A `clevis` token: `clevis decrypt` gives the passphrase of its keyslots.
fn try_clevis(
    cd: &mut CryptDevice,
    id: u32,
    tokens: &Tokens,
    prompt: &mut dyn Prompt,
) -> std::result::Result<VolumeKey, Failure> {
    if ucrypt_cryptsetup::external_tokens_disabled() {
        return Err(Failure::unusable(
            "not tried (--disable-external-tokens: only built-in token types)",
        ));
    }
    let json = cd
        .token_json(id)
        .map_err(|e| Failure::unusable(e.to_string()))?;
    let token = clevis::ClevisToken::parse(&json).map_err(|e| Failure::unusable(e.to_string()))?;
    let Some(program) = clevis::find() else {
        return Err(Failure::unusable(
            "clevis is not installed (no clevis on PATH; Debian: apt install clevis clevis-luks)",
        ));
    };
    let timeout = if tokens.timeout.is_zero() {
        clevis::DEFAULT_TIMEOUT
    } else {
        tokens.timeout
    };
    let _busy = prompt.busy(Step::Token);
    let pass = clevis::decrypt(&program, &token.compact, timeout).map_err(|e| Failure {
        rank: 1,
        again: true,
        line: e.to_string(),
        error: e,
    })?;
    let mut last = None;
    for &slot in &token.keyslots {
        match cd.volume_key(Some(slot), &pass) {
            Ok((_, key)) => return Ok(key),
            Err(e) => last = Some(e),
        }
    }
    drop(pass);
    Err(match last {
        Some(e) => Failure {
            rank: 2,
            again: false,
            line: "its passphrase opens none of its keyslots".into(),
            error: e.into(),
        },
        None => Failure::unusable("it is assigned to no keyslot"),
    })
}
