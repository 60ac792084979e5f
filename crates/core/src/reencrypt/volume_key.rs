//! The new volume key's size and, with `--volume-key-file`, its bytes.

use crate::error::{anyhow, Result};
use std::path::Path;
use ucrypt_crypto::VolumeKey;

/// The first `len` bytes of `path`, a new volume key (cryptsetup's `tools_read_vk`: a
/// longer file is fine, a shorter one is refused). Zeroed when dropped; never printed.
///
/// # Errors
/// The file cannot be read, or is shorter than `len`.
pub(crate) fn read_volume_key(path: &Path, len: usize) -> Result<VolumeKey> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)
        .map_err(|e| anyhow!("Cannot read keyfile {} ({e}).", path.display()))?;
    let mut key = zeroize::Zeroizing::new(vec![0u8; len]);
    let mut got = 0;
    while got < len {
        match f.read(&mut key[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(anyhow!("Cannot read keyfile {} ({e}).", path.display())),
        }
    }
    if got < len {
        return Err(anyhow!(
            "Cannot read {len} bytes from keyfile {}.",
            path.display()
        ));
    }
    Ok(VolumeKey::new(std::mem::take(&mut *key)))
}

/// The key size in bytes for `bits` (None: cryptsetup's default, 512 bits for XTS and 256
/// otherwise).
///
/// # Errors
/// `bits` is not a positive multiple of 8.
pub(crate) fn key_bytes(bits: Option<u32>, cipher: &str) -> Result<usize> {
    match bits {
        Some(b) if b % 8 == 0 && b > 0 => Ok(b as usize / 8),
        Some(b) => Err(anyhow!("key size {b} is not a positive multiple of 8 bits")),
        None => Ok(if cipher.contains("xts") { 64 } else { 32 }),
    }
}

/// `cipher` if ucrypt's data path can serve it (the data pass is ucrypt's), else refused
/// before anything is written.
///
/// # Errors
/// The crypto layer does not take the cipher.
pub(crate) fn servable_cipher(cipher: String) -> Result<String> {
    cipher
        .parse::<ucrypt_crypto::CipherSpec>()
        .map_err(|e| anyhow!("--cipher {cipher}: {e}"))?;
    Ok(cipher)
}
