//! Key material: [`VolumeKey`] is locked in RAM where possible, zeroized on drop, and never
//! printed.

use crate::secret::SecretBytes;
use crate::CryptoError;
use zeroize::Zeroizing;

/// The key that encrypts the data area (dm-crypt's table key, LUKS's volume key).
///
/// `Debug` shows only the length. There is no `Display`, `Clone` or serialisation, so the
/// bytes cannot reach a log or an error message by accident.
pub struct VolumeKey {
    /// Locked (page-counted, so keys sharing a page never unlock each other), zeroed on
    /// drop before it is unlocked.
    bytes: SecretBytes,
}

impl VolumeKey {
    /// Takes ownership of key bytes (the source is zeroized).
    pub fn new(mut bytes: Vec<u8>) -> Self {
        let key = SecretBytes::copy_of(&bytes);
        zeroize::Zeroize::zeroize(&mut bytes);
        VolumeKey { bytes: key }
    }

    /// An empty key, for key-less ciphers (`cipher_null`), written `-` in a table line.
    pub fn empty() -> Self {
        VolumeKey {
            bytes: SecretBytes::zeroed(0),
        }
    }

    /// Parses a table-line key: hex digits (either case) or `-` for no key.
    ///
    /// # Errors
    /// [`CryptoError::KeyFormat`] naming the problem (odd length, a non-hex character at a
    /// position); the key text itself is never echoed.
    pub fn from_hex(text: &str) -> Result<Self, CryptoError> {
        if text == "-" {
            return Ok(Self::empty());
        }
        if text.len() % 2 != 0 {
            return Err(CryptoError::KeyFormat(format!(
                "hex key has an odd number of digits ({})",
                text.len()
            )));
        }
        if let Some(pos) = text.bytes().position(|b| !b.is_ascii_hexdigit()) {
            return Err(CryptoError::KeyFormat(format!(
                "hex key has a non-hex character at position {pos}"
            )));
        }
        let mut out = Zeroizing::new(vec![0u8; text.len() / 2]);
        hex::decode_to_slice(text, &mut out[..])
            .map_err(|_| CryptoError::KeyFormat("hex key could not be decoded".into()))?;
        Ok(Self::new(std::mem::take(&mut *out)))
    }

    /// The key bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether the key is empty (`-`).
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Lower-case hex, for `--showkeys`-style output the user asked for explicitly.
    pub fn to_hex(&self) -> Zeroizing<String> {
        if self.bytes.is_empty() {
            return Zeroizing::new("-".to_string());
        }
        Zeroizing::new(hex::encode(&self.bytes[..]))
    }

    /// Whether the bytes are locked in RAM (mlock succeeded).
    pub fn is_locked(&self) -> bool {
        self.bytes.is_locked()
    }
}

impl std::fmt::Debug for VolumeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VolumeKey(<redacted>, {} bytes)", self.bytes.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_key_bytes() {
        let key = VolumeKey::from_hex("deadbeefcafebabe").unwrap();
        let shown = format!("{key:?}");
        assert_eq!(shown, "VolumeKey(<redacted>, 8 bytes)");
        assert!(!shown.contains("dead"));
    }

    #[test]
    fn hex_in_either_case_decodes_the_same() {
        let a = VolumeKey::from_hex("ABCDEF01").unwrap();
        let b = VolumeKey::from_hex("abcdef01").unwrap();
        assert_eq!(a.as_bytes(), b.as_bytes());
        assert_eq!(&*a.to_hex(), "abcdef01");
    }

    #[test]
    fn dash_is_the_empty_key() {
        assert!(VolumeKey::from_hex("-").unwrap().is_empty());
    }

    #[test]
    fn bad_hex_is_refused_without_echoing_it() {
        let err = VolumeKey::from_hex("abc").unwrap_err().to_string();
        assert!(err.contains("odd number"), "{err}");
        let err = VolumeKey::from_hex("zzzz").unwrap_err().to_string();
        assert!(err.contains("position 0") && !err.contains("zzzz"), "{err}");
    }
}
