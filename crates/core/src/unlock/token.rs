//! LUKS2 tokens, tried before any passphrase as cryptsetup tries them (every token, or
//! `--token-id`, of any type or `--token-type`; a `luks2-keyring` token's passphrase comes
//! from the kernel keyring, nothing is asked). With `--token-only` no passphrase follows
//! when none unlocks.

use super::prompt::{Prompt, Step};
use crate::error::{Context, Error, Result};
use crate::VolumeType;
use std::path::{Path, PathBuf};
use ucrypt_crypto::VolumeKey;
use ucrypt_cryptsetup::{CryptDevice, HeaderType};

/// Which tokens to try.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    /// Only this token (`--token-id`).
    pub id: Option<u32>,
    /// No passphrase when no token unlocks (`--token-only`).
    pub only: bool,
    /// Only tokens of this type (`--token-type`).
    pub kind: Option<String>,
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

/// The volume key through a token of `device` (local LUKS2 only), or None to go on with a
/// passphrase.
///
/// # Errors
/// Only with `--token-only`: no token is usable (invalid), or a token's passphrase opens
/// none of its keyslots (the library's error: a wrong passphrase is a permission error).
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
    // No token at all: nothing to try (and no spinner flash on every open).
    if !(0..32).any(|t| cd.cd.token_status(t).0.in_use()) {
        return usage(format!(
            "{} has no LUKS2 token (--token-only)",
            device.display()
        ));
    }
    let r = {
        let _busy = prompt.busy(Step::Token);
        cd.cd.volume_key_by_token(tokens.id, tokens.kind.as_deref())
    };
    match r {
        Ok((_, key)) => Ok(Some(key)),
        Err(_) if !tokens.only => Ok(None),
        Err(e) => {
            Err(e).with_context(|| format!("no token unlocks {} (--token-only)", device.display()))
        }
    }
}
