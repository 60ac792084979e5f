//! LUKS2 tokens, tried before any passphrase in cryptsetup's order ([`unlock`]: the
//! header's order, keyslots of priority `prefer` before `normal` ones; or only
//! `--token-id`), of any type or only `--token-type`. Each token's secret, the passphrase
//! of its keyslots, is read once and its keyslots opened with it here, so that the same
//! unlock gives the volume key (open) and the passphrase (a reencryption's new keyslot).
//! Each type goes its own way to its secret:
//!
//! - `clevis` (tang, tpm2, sss pins): `clevis decrypt` ([`clevis`]), as `clevis luks
//!   unlock` does;
//! - `systemd-recovery`: holds no secret; the recovery key is typed at the passphrase prompt;
//! - everything else (`luks2-keyring`, `systemd-tpm2`, `systemd-fido2`, `systemd-pkcs11`, any
//!   type with a plugin) through libcryptsetup's token handlers, called once per try
//!   ([`CryptDevice::token_secret`]), with a PIN when the handler asks for one and the
//!   user named tokens (`--token-only`, `--token-id`, `--token-type`, as cryptsetup asks
//!   only then).
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
use ucrypt_cryptsetup::{CryptDevice, HeaderType, KeyslotPriority, KeyslotStatus};
use ucrypt_format::FormatError;
use zeroize::Zeroizing;

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
    /// Only tokens assigned to this keyslot, and only it opened (reencrypt's
    /// `--key-slot`, as cryptsetup's `luks_try_token_unlock` takes it).
    pub keyslot: Option<u32>,
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
            keyslot: None,
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
    /// Not to be tried again in this round (its secret could not be read: a PIN missing
    /// or wrong, a device missing); a keyslot failure may still meet other keyslots in the
    /// next pass.
    settled: bool,
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
            settled: false,
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
            libc::EPERM if kind == "luks2-keyring" => (
                2,
                false,
                "its passphrase is not in the kernel keyring".to_string(),
            ),
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
                "the kernel keyring is not usable here".to_string(),
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
            settled: true,
            line,
            error: e.into(),
        }
    }
}

/// What a token unlocked: the passphrase of a keyslot (a reencryption puts it in the new
/// keyslot, as cryptsetup does) and, from [`unlock`], the volume key it gave.
pub struct Opened {
    /// The token.
    pub token: u32,
    /// The keyslot its passphrase opened.
    pub keyslot: u32,
    /// The token's passphrase for that keyslot.
    pub passphrase: Secret,
    /// The volume key; None from [`passphrase`], which only checks the keyslot (a volume
    /// in reencryption has two keys, and the keyslot may hold either).
    pub key: Option<VolumeKey>,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened")
            .field("token", &self.token)
            .field("keyslot", &self.keyslot)
            .finish_non_exhaustive()
    }
}

/// The volume key through a token of `device` (local LUKS2 only), or None to go on with a
/// passphrase. See [`unlock`].
///
/// # Errors
/// As [`unlock`].
pub fn volume_key(
    device: &Path,
    header: Option<&Path>,
    kind: VolumeType,
    tokens: &Tokens,
    prompt: &mut dyn Prompt,
) -> Result<Option<VolumeKey>> {
    Ok(unlock(device, header, kind, tokens, prompt)?.and_then(|o| o.key))
}

/// The passphrase of a keyslot through a token of `device`, as [`unlock`] finds it but
/// without taking the volume key out (a reencryption needs the passphrase, and its
/// keyslots may hold the old or the new key), or None to go on with a typed passphrase.
///
/// # Errors
/// As [`unlock`].
pub fn passphrase(
    device: &Path,
    header: Option<&Path>,
    kind: VolumeType,
    tokens: &Tokens,
    prompt: &mut dyn Prompt,
) -> Result<Option<Opened>> {
    run(device, header, kind, tokens, false, prompt)
}

/// One token of the header: its id, type and keyslots, in the header's order.
struct HeaderToken {
    id: u32,
    kind: String,
    keyslots: Vec<u32>,
}

/// The header's tokens in the order libcryptsetup walks them (its JSON object's order,
/// which is the order they were added in, not always by id).
fn header_tokens(cd: &mut CryptDevice) -> Vec<HeaderToken> {
    let ids: Vec<u32> = cd
        .dump_json()
        .ok()
        .and_then(|j| ucrypt_format::luks2::json::Json::parse(&j).ok())
        .and_then(|j| match j.get("tokens") {
            Some(ucrypt_format::luks2::json::Json::Obj(m)) => {
                Some(m.iter().filter_map(|(k, _)| k.parse().ok()).collect())
            }
            _ => None,
        })
        .unwrap_or_else(|| (0..32).collect());
    ids.into_iter()
        .filter_map(|id| {
            let (status, kind) = cd.token_status(id);
            if !status.in_use() {
                return None;
            }
            let keyslots = cd
                .token_json(id)
                .ok()
                .and_then(|j| ucrypt_format::luks2::json::Json::parse(&j).ok())
                .and_then(|j| match j.get("keyslots") {
                    Some(ucrypt_format::luks2::json::Json::Arr(a)) => Some(
                        a.iter()
                            .filter_map(|k| k.as_str().and_then(|s| s.parse().ok()))
                            .collect(),
                    ),
                    _ => None,
                })
                .unwrap_or_default();
            Some(HeaderToken {
                id,
                kind: kind.unwrap_or_default(),
                keyslots,
            })
        })
        .collect()
}

/// Tries the tokens of `device` in cryptsetup's order and gives what the first that
/// unlocks opened, or None to go on with a passphrase.
///
/// The order is libcryptsetup's (`LUKS2_token_unlock_key`): with `--token-id`, that token
/// on any of its keyslots, whatever their priority; otherwise every token (of
/// `--token-type`) in the header's order, first on its keyslots of priority `prefer`, then
/// again on those of priority `normal`; keyslots of priority `ignore` are used only through
/// a token named by id. A token whose PIN is missing or wrong is not tried again in the
/// second round. Each token's secret is read once per round (one plugin call, one FIDO2
/// touch, one PKCS#11 login, one `clevis decrypt`), and its keyslots opened with it here.
/// With [`Tokens::keyslot`] only that keyslot is opened.
///
/// # Errors
/// Only with `--token-only`: no token is usable (invalid), or the most telling failure of
/// the tokens tried (a needed PIN, a wrong keyslot passphrase: a permission error).
pub fn unlock(
    device: &Path,
    header: Option<&Path>,
    kind: VolumeType,
    tokens: &Tokens,
    prompt: &mut dyn Prompt,
) -> Result<Option<Opened>> {
    run(device, header, kind, tokens, true, prompt)
}

/// [`unlock`] (`want_key`) or [`passphrase`].
fn run(
    device: &Path,
    header: Option<&Path>,
    kind: VolumeType,
    tokens: &Tokens,
    want_key: bool,
    prompt: &mut dyn Prompt,
) -> Result<Option<Opened>> {
    let usage = |msg: String| -> Result<Option<Opened>> {
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
    let present = header_tokens(&mut cd.cd);
    // No token at all: nothing to try (and no spinner flash on every open).
    if present.is_empty() {
        return usage(format!(
            "{} has no LUKS2 token (--token-only)",
            device.display()
        ));
    }
    let chosen: Vec<HeaderToken> = present
        .into_iter()
        .filter(|t| {
            tokens.id.is_none_or(|id| id == t.id)
                && tokens.kind.as_ref().is_none_or(|want| *want == t.kind)
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
    let passes: &[KeyslotPriority] = if tokens.id.is_some() {
        &[KeyslotPriority::Ignore]
    } else {
        &[KeyslotPriority::Prefer, KeyslotPriority::Normal]
    };
    let deadline = Instant::now() + tokens.timeout;
    let mut said: Vec<Option<String>> = vec![None; chosen.len()];
    let mut worst: Option<Failure> = None;
    loop {
        // Per token, this round: its secret once read, and its last failure.
        let mut secrets: Vec<Option<Zeroizing<Vec<u8>>>> = vec![None; chosen.len()];
        let mut failed: Vec<Option<Failure>> = (0..chosen.len()).map(|_| None).collect();
        for &pass in passes {
            for (i, t) in chosen.iter().enumerate() {
                // A PIN missing or wrong, or a secret that failed: not again this round.
                if failed[i].as_ref().is_some_and(|f| f.settled) {
                    continue;
                }
                let slots = usable_keyslots(&mut cd.cd, t, pass, tokens.keyslot);
                if slots.is_empty() {
                    if failed[i].is_none() || pass != passes[0] {
                        failed[i] = Some(no_keyslot(&mut cd.cd, t, tokens.keyslot));
                    }
                    continue;
                }
                let secret = match secrets[i].take() {
                    Some(s) => s,
                    None => match open_secret(&mut cd.cd, t, tokens, ask_pin, prompt) {
                        Ok(s) => s,
                        Err(mut f) => {
                            f.settled = true;
                            failed[i] = Some(f);
                            continue;
                        }
                    },
                };
                match open_keyslots(&mut cd.cd, t, &slots, &secret, want_key, prompt) {
                    Ok(opened) => {
                        prompt.verbose(&format!(
                            "Token {} ({}) unlocked {} (keyslot {}).",
                            t.id,
                            t.kind,
                            if want_key {
                                "the volume key"
                            } else {
                                "its passphrase"
                            },
                            opened.keyslot
                        ));
                        return Ok(Some(opened));
                    }
                    Err(f) => failed[i] = Some(f),
                }
                secrets[i] = Some(secret);
            }
        }
        drop(secrets);
        let mut again = false;
        for (i, f) in failed.into_iter().enumerate() {
            let Some(f) = f else { continue };
            let t = &chosen[i];
            // One line per token, and again only if what it says changes.
            if said[i].as_deref() != Some(f.line.as_str()) {
                prompt.verbose(&format!("Token {} ({}): {}.", t.id, t.kind, f.line));
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

/// The keyslots of token `t` that this pass may open, in the token's order: bound to
/// the volume key (not unbound), of priority `pass` or higher (`Ignore`: any), and
/// `only` if given.
fn usable_keyslots(
    cd: &mut CryptDevice,
    t: &HeaderToken,
    pass: KeyslotPriority,
    only: Option<u32>,
) -> Vec<u32> {
    t.keyslots
        .iter()
        .copied()
        .filter(|&s| {
            let bound = matches!(
                cd.keyslot_status(s),
                KeyslotStatus::Active | KeyslotStatus::ActiveLast
            );
            let p = cd.keyslot_priority(s);
            only.is_none_or(|o| o == s) && bound && p != KeyslotPriority::Invalid && p >= pass
        })
        .collect()
}

/// Why token `t` has no keyslot to open.
fn no_keyslot(cd: &mut CryptDevice, t: &HeaderToken, only: Option<u32>) -> Failure {
    if t.keyslots.is_empty() {
        return Failure::unusable("it is assigned to no keyslot");
    }
    if let Some(o) = only {
        if !t.keyslots.contains(&o) {
            return Failure::unusable(format!("it is not assigned to keyslot {o}"));
        }
    }
    let ignored = t
        .keyslots
        .iter()
        .any(|&s| cd.keyslot_priority(s) == KeyslotPriority::Ignore);
    if ignored {
        return Failure::unusable(
            "its keyslots have priority ignore (used only when the token is named with \
             --token-id)",
        );
    }
    Failure::unusable("none of its keyslots holds the volume key")
}

/// Opens `slots` with the secret of token `t`, first that opens wins: takes the volume
/// key out (`want_key`), or only checks that the keyslot opens.
fn open_keyslots(
    cd: &mut CryptDevice,
    t: &HeaderToken,
    slots: &[u32],
    secret: &[u8],
    want_key: bool,
    prompt: &mut dyn Prompt,
) -> std::result::Result<Opened, Failure> {
    let _busy = prompt.busy(Step::Token);
    let mut wrong = None;
    for &slot in slots {
        let r = if want_key {
            cd.volume_key(Some(slot), secret).map(|(s, k)| (s, Some(k)))
        } else {
            cd.check_passphrase(Some(slot), secret).map(|s| (s, None))
        };
        match r {
            Ok((keyslot, key)) => {
                return Ok(Opened {
                    token: t.id,
                    keyslot,
                    passphrase: Secret::copy_of(secret),
                    key,
                })
            }
            Err(e @ FormatError::Cryptsetup { errno, .. })
                if errno == libc::EPERM || errno == libc::ENOENT =>
            {
                if errno == libc::EPERM || wrong.is_none() {
                    wrong = Some(e);
                }
            }
            // A wrong passphrase, or a keyslot of the other key mid-reencryption.
            Err(e @ (FormatError::BadPassphrase { .. } | FormatError::Refused(_))) => {
                wrong = Some(e)
            }
            Err(e) => return Err(Failure::from_library(e, &t.kind)),
        }
    }
    Err(match wrong {
        Some(e) => Failure {
            rank: 2,
            again: false,
            settled: false,
            line: "its passphrase opens none of its keyslots".into(),
            error: e.into(),
        },
        None => Failure::unusable("it is assigned to no keyslot"),
    })
}

/// The secret of token `t`, read once: `clevis decrypt` for a clevis token, else
/// libcryptsetup's handler for its type (the kernel keyring, a plugin), with a PIN asked
/// for up to `pin_tries` times when it needs one and `ask_pin`.
fn open_secret(
    cd: &mut CryptDevice,
    t: &HeaderToken,
    tokens: &Tokens,
    ask_pin: bool,
    prompt: &mut dyn Prompt,
) -> std::result::Result<Zeroizing<Vec<u8>>, Failure> {
    match t.kind.as_str() {
        "clevis" => return clevis_secret(cd, t.id, tokens, prompt),
        "systemd-recovery" => {
            return Err(Failure::unusable(
                "holds no secret: its recovery key is typed at the passphrase prompt",
            ))
        }
        _ => {}
    }
    let first = {
        let _busy = prompt.busy(Step::Token);
        cd.token_secret(t.id, &t.kind, None)
    };
    let e = match first {
        Ok(s) => return Ok(s),
        Err(e) => e,
    };
    let needs_pin = matches!(e, FormatError::Cryptsetup { errno, .. } if errno == libc::ENOANO);
    if !needs_pin {
        return Err(Failure::from_library(e, &t.kind));
    }
    if !ask_pin {
        let mut f = Failure::from_library(e, &t.kind);
        f.line = "needs a PIN (name the token with --token-only, --token-id or --token-type \
                  to be asked for it)"
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
        let pin = read_pin(t.id, tokens.pin_file.as_ref(), prompt).map_err(|e| Failure {
            rank: 3,
            again: false,
            settled: true,
            line: format!("no PIN: {e}"),
            error: e,
        })?;
        let r = {
            let _busy = prompt.busy(Step::Token);
            cd.token_secret(t.id, &t.kind, Some(&pin))
        };
        match r {
            Ok(s) => return Ok(s),
            Err(e @ FormatError::Cryptsetup { errno, .. }) if errno == libc::ENOANO => {
                if attempt < tries {
                    prompt.notice("No token could be unlocked with this PIN.");
                }
                last = e;
            }
            Err(e) => return Err(Failure::from_library(e, &t.kind)),
        }
    }
    let mut f = Failure::from_library(last, &t.kind);
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

/// A `clevis` token's secret: what `clevis decrypt` makes of its JWE.
fn clevis_secret(
    cd: &mut CryptDevice,
    id: u32,
    tokens: &Tokens,
    prompt: &mut dyn Prompt,
) -> std::result::Result<Zeroizing<Vec<u8>>, Failure> {
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
        settled: true,
        line: e.to_string(),
        error: e,
    })?;
    Ok(Zeroizing::new(pass.to_vec()))
}
