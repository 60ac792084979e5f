//! The one read of whole encryption sectors, shared by the inline path (`volume`) and the
//! crypt workers (`workers`), so that neither module reaches into the other.

use ucrypt_backend::{Backend, BackendError};
use ucrypt_crypto::{Sector512, SectorCipher};

/// Reads the ciphertext of the whole sectors at plaintext position `pos` (backend offset
/// `lower`) and decrypts it into `buf`: straight out of the backend's mapping when it lends
/// one ([`Backend::read_with`]: one pass over the data), else `read_at` and decrypt in
/// place (a copy, then a pass).
/// `try_lend: false` skips asking (a backend known never to lend).
pub(crate) fn read_decrypt(
    backend: &dyn Backend,
    cipher: &dyn SectorCipher,
    pos: u64,
    lower: u64,
    buf: &mut [u8],
    try_lend: bool,
) -> Result<(), BackendError> {
    let first = Sector512::from_bytes_floor(pos);
    let len = buf.len();
    if try_lend {
        let lent = backend.read_with(lower, len, &mut |src| {
            cipher.decrypt_from(first, src, buf);
        });
        if let Some(r) = lent {
            return r;
        }
    }
    backend.read_at(buf, lower)?;
    cipher.decrypt(first, buf);
    Ok(())
}
