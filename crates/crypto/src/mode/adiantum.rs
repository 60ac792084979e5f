//! Adiantum (`xchacha12,aes-adiantum` and `xchacha20,aes-adiantum`) through the `adiantum`
//! crate. The whole sector is one wide block; the 32-byte IV is the tweak.

use super::Mode;
use crate::CryptoError;
use cipher::KeyInit;

type Xc12 = adiantum::Cipher<chacha20::XChaCha12, aes::Aes256>;
type Xc20 = adiantum::Cipher<chacha20::XChaCha20, aes::Aes256>;

enum Inner {
    X12(Box<Xc12>),
    X20(Box<Xc20>),
}

/// Adiantum keyed with a 32-byte key.
pub struct Adiantum {
    inner: Inner,
}

/// The largest sector Adiantum handles here (the crate's limit, and the kernel's maximum
/// dm-crypt sector size).
pub const MAX_SECTOR_BYTES: usize = 4096;

impl Adiantum {
    /// `cipher` is the kernel's `xchacha12,aes` or `xchacha20,aes`.
    ///
    /// # Errors
    /// [`CryptoError::Unknown`] for another cipher pair, [`CryptoError::KeyLength`] unless
    /// the key is 32 bytes.
    pub fn new(cipher: &str, key: &[u8]) -> Result<Self, CryptoError> {
        let bad_len = || CryptoError::KeyLength {
            got: key.len(),
            spec: format!("{cipher}-adiantum"),
            reason: "Adiantum takes a 32-byte key".into(),
        };
        let inner = match cipher {
            "xchacha12,aes" => {
                Inner::X12(Box::new(Xc12::new_from_slice(key).map_err(|_| bad_len())?))
            }
            "xchacha20,aes" => {
                Inner::X20(Box::new(Xc20::new_from_slice(key).map_err(|_| bad_len())?))
            }
            other => {
                return Err(CryptoError::Unknown {
                    what: "Adiantum cipher pair",
                    name: other.to_string(),
                    expected: "xchacha12,aes, xchacha20,aes",
                })
            }
        };
        Ok(Adiantum { inner })
    }
}

impl Mode for Adiantum {
    fn iv_size(&self) -> usize {
        32
    }
    fn encrypt(&self, iv: &[u8], data: &mut [u8]) {
        match &self.inner {
            Inner::X12(c) => c.encrypt(data, iv),
            Inner::X20(c) => c.encrypt(data, iv),
        }
    }
    fn decrypt(&self, iv: &[u8], data: &mut [u8]) {
        match &self.inner {
            Inner::X12(c) => c.decrypt(data, iv),
            Inner::X20(c) => c.decrypt(data, iv),
        }
    }
}
