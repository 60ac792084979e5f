//! What `open` (`open_header.rs`) and `luksOpen` (`luks_open.rs`) unlock with: the header
//! options and the secret read the way cryptsetup reads them for each volume type, and what
//! the spinner says meanwhile.

use super::luks::{cs_error, DeviceArgs};
use super::plain_args::PlainArgs;
use super::secret::{self, KeyFileArgs};
use super::{CliError, WithCode, EXIT_PARAMS};
use ucrypt::header::{HeaderOptions, VolumeType};

/// Builds the header options and reads the secret the way cryptsetup does for `kind`.
pub(crate) fn inputs(
    dev: &DeviceArgs,
    kind: VolumeType,
    key: &KeyFileArgs,
    key_slot: Option<u32>,
    allow_discards: bool,
    plain: &PlainArgs,
) -> Result<(HeaderOptions, secret::Secret), CliError> {
    let mut hopts = HeaderOptions {
        kind,
        header: dev.header.clone(),
        key_slot,
        plain: plain.options(),
        loopaes: plain.loopaes_options(),
        plain_raw_key: false,
        allow_discards,
        tcrypt: Default::default(),
        allow_null_cipher: false,
        recover_reencryption: false,
    };
    let secret = if kind == VolumeType::Plain {
        // cryptsetup: a key file other than stdin is the raw key, exactly key-size bytes
        // from --keyfile-offset (--hash and --keyfile-size do not apply).
        match key.key_file.as_deref().filter(|p| p.as_os_str() != "-") {
            Some(p) => {
                hopts.plain_raw_key = true;
                let bytes = hopts.plain.key_bytes().map_err(cs_error)?;
                secret::read_key_file(p, key.keyfile_offset, bytes as u64)?
            }
            None => secret::existing(key, &dev.device)?,
        }
    } else if kind == VolumeType::Loopaes {
        // loop-AES keys are a key file's lines, never a typed passphrase.
        let Some(p) = key.key_file.as_deref() else {
            return Err(anyhow::anyhow!(
                "loop-AES volumes open with --key-file (their key file's lines are the keys; \
                 `--key-file -` reads standard input, e.g. from `gpg --decrypt KEYFILE`)"
            ))
            .code(EXIT_PARAMS);
        };
        secret::read_key_file(p, key.keyfile_offset, key.keyfile_size)?
    } else {
        secret::existing(key, &dev.device)?
    };
    Ok((hopts, secret))
}

/// What the spinner says while a volume of `kind` is unlocked; none for TCRYPT, whose
/// search over every KDF and cipher chain draws its own bar (`progress::Search`).
pub(crate) fn unlocking(kind: VolumeType) -> Option<String> {
    (kind != VolumeType::Tcrypt).then(|| "Unlocking (key derivation)".to_string())
}
