//! `tcryptDump`: a TrueCrypt/VeraCrypt header decrypted and shown as cryptsetup shows it,
//! with its volume key when that was confirmed first.
//!
//! ```text
//!  with the key: Prompt::confirm (before any passphrase)
//!  device and detached header staged when remote (the caller's Staging)
//!  Request::tcrypt_inputs: passphrase, TrueCrypt key files, PIM
//!  tcrypt::load_header under Prompt::busy(TcryptSearch) ─► the dump, naming the device
//!    (or header) as the caller named it
//! ```

use crate::error::{chain_kind, Result};
use crate::prompt::{Prompt, Step};
use crate::remote_header::Staging;
use crate::unlock::Request;
use ucrypt_crypto::VolumeKey;
use zeroize::Zeroizing;

/// What cryptsetup asks to have confirmed before it prints a volume key.
const KEY_WARNING: &str = "The header dump with volume key is sensitive information that \
                           allows access to the encrypted partition without a passphrase. \
                           This dump should always be stored encrypted in a safe place";

/// A decrypted TCRYPT header, as `tcryptDump` shows it.
pub struct TcryptDump {
    /// cryptsetup's dump text (no key material).
    pub text: Zeroizing<String>,
    /// The volume key, when it was asked for.
    pub volume_key: Option<VolumeKey>,
}

/// Decrypts the TCRYPT header of `request.device` (or `request.header`) with the
/// passphrase and TrueCrypt key files of `request` ([`Request::tcrypt_inputs`]); with
/// `with_key`, asks `prompt` to confirm first and returns the volume key too. Remote
/// devices are read through `staging`.
///
/// # Errors
/// Not confirmed (nothing asked after it); the staging's; the inputs'; no header found
/// with this passphrase ([`crate::ErrorKind::Permission`]).
pub fn tcrypt_dump(
    request: &Request,
    staging: &Staging,
    with_key: bool,
    prompt: &mut dyn Prompt,
) -> Result<TcryptDump> {
    if with_key {
        prompt.confirm(KEY_WARNING)?;
    }
    let header = match &request.header {
        Some(h) => Some(staging.local_path(h, true)?),
        None => None,
    };
    let device = staging.local_path(&request.device, header.is_none())?;
    let staged = Request {
        header,
        ..request.clone()
    };
    let (hopts, secret) = staged.tcrypt_inputs(prompt)?;
    let (hdr, meta) = {
        let _busy = prompt.busy(Step::TcryptSearch);
        crate::tcrypt::load_header(&device, &secret, &hopts).map_err(|e| {
            let kind = chain_kind(&e);
            e.with_kind(kind)
        })?
    };
    drop(secret);
    // The dump names what the user named, not a staged copy.
    let shown = if Some(&meta) == hopts.header.as_ref() {
        request.header.clone().unwrap_or(meta)
    } else if meta == device {
        request.device.clone()
    } else {
        meta
    };
    Ok(TcryptDump {
        text: Zeroizing::new(hdr.dump(&shown.display().to_string())),
        volume_key: with_key.then(|| hdr.volume_key()),
    })
}
