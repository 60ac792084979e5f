//! Block-cipher chaining modes, each applied to one sector with a given IV.
//!
//! dm-crypt hands the crypto API one sector and one IV at a time; so does [`Mode`]. Which
//! IV a sector gets is the IV generator's business (`crate::iv`), not the mode's.
//!
//! | mode | file | IV |
//! |---|---|---|
//! | `ecb` | [`ecb`] | none |
//! | `ctr` | [`ctr`] | block size (the first counter block) |
//! | `cbc` | [`cbc`] | block size |
//! | `pcbc` | [`pcbc`] | block size |
//! | `cts` (only `capi:cts(cbc(X))`) | [`cts`] | block size |
//! | `xctr` | [`ctr`] ([`ctr::Xctr`]) | 16 |
//! | `chacha20` (only `capi:chacha20`, a stream cipher) | [`chacha`] | 16 |
//! | `xts` | [`xts`] (any 16-byte cipher), [`aws_xts`] (AES-256-XTS via AWS-LC), [`vaes_xts`] (AES-128/192-XTS with VAES, and AES-256-XTS plain64 on sectors up to 1 KiB) | 16 |
//! | `lrw` | [`lrw`] | 16 (big-endian block index) |
//! | `adiantum` | [`adiantum`] | 32 |
//! | `hctr2` | [`hctr2`] | 32 (the tweak) |
//!
//! [`aws_aead`] is not a sector mode but the AEADs (AES-GCM, ChaCha20-Poly1305) of the
//! authenticated crypt targets (`crate::aead`), through AWS-LC.

pub mod adiantum;
pub mod aws_aead;
pub mod aws_xts;
pub mod cbc;
pub mod chacha;
pub mod ctr;
pub mod cts;
pub mod ecb;
pub mod hctr2;
pub mod lrw;
pub mod pcbc;
pub mod vaes_xts;
pub mod xts;

use crate::CryptoError;

/// The chaining modes ucrypt knows, by kernel name.
pub const MODE_NAMES: &str =
    "cbc, pcbc, ctr, xctr, ecb, xts, lrw, adiantum, hctr2 (and capi:cts(cbc(X)), capi:chacha20)";

/// A keyed chaining mode: transforms one sector given its IV.
pub trait Mode: Send + Sync {
    /// IV length in bytes the mode consumes (0 for ECB).
    fn iv_size(&self) -> usize;
    /// Encrypts one sector in place.
    fn encrypt(&self, iv: &[u8], data: &mut [u8]);
    /// Decrypts one sector in place.
    fn decrypt(&self, iv: &[u8], data: &mut [u8]);
    /// Encrypts consecutive sectors of `sector_bytes` each in place, sector k with
    /// `ivs[k * iv_size..][..iv_size]`. The default goes sector by sector; CBC overrides it
    /// to run independent sectors' chains side by side.
    fn encrypt_sectors(&self, ivs: &[u8], iv_size: usize, data: &mut [u8], sector_bytes: usize) {
        for (k, sector) in data.chunks_exact_mut(sector_bytes).enumerate() {
            self.encrypt(&ivs[k * iv_size..(k + 1) * iv_size], sector);
        }
    }
}

/// A chaining mode by name, before keying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainMode {
    /// Electronic codebook: every block alone, no IV.
    Ecb,
    /// Cipher block chaining.
    Cbc,
    /// Counter mode (the kernel's `ctr` template).
    Ctr,
    /// XEX with ciphertext stealing (IEEE 1619), key = data key ‖ tweak key.
    Xts,
    /// Liskov-Rivest-Wagner, key = cipher key ‖ 16-byte tweak key.
    Lrw,
    /// Adiantum (`xchacha12,aes-adiantum`), a wide-block mode.
    Adiantum,
    /// HCTR2 (`aes-hctr2-plain64`), a wide-block mode with a 32-byte tweak.
    Hctr2,
    /// Propagating CBC (the kernel's `pcbc` template).
    Pcbc,
    /// CBC with ciphertext stealing, `cts(cbc(cipher))`; only in the `capi:` form.
    Cts,
    /// XCTR (little-endian counter XORed into the IV), the kernel's `xctr` template.
    Xctr,
    /// The `chacha20` stream cipher itself (`capi:chacha20-plain64`; cipher `chacha20`).
    Chacha20,
}

impl ChainMode {
    /// Parses a kernel chain-mode name.
    ///
    /// # Errors
    /// [`CryptoError::Unknown`] listing the known modes.
    pub fn parse(name: &str) -> Result<Self, CryptoError> {
        Ok(match name {
            "ecb" => ChainMode::Ecb,
            "cbc" => ChainMode::Cbc,
            "ctr" => ChainMode::Ctr,
            "xts" => ChainMode::Xts,
            "lrw" => ChainMode::Lrw,
            "adiantum" => ChainMode::Adiantum,
            "hctr2" => ChainMode::Hctr2,
            "pcbc" => ChainMode::Pcbc,
            "xctr" => ChainMode::Xctr,
            other => {
                return Err(CryptoError::Unknown {
                    what: "chain mode",
                    name: other.to_string(),
                    expected: MODE_NAMES,
                })
            }
        })
    }

    /// The kernel name.
    pub fn name(self) -> &'static str {
        match self {
            ChainMode::Ecb => "ecb",
            ChainMode::Cbc => "cbc",
            ChainMode::Ctr => "ctr",
            ChainMode::Xts => "xts",
            ChainMode::Lrw => "lrw",
            ChainMode::Adiantum => "adiantum",
            ChainMode::Hctr2 => "hctr2",
            ChainMode::Pcbc => "pcbc",
            ChainMode::Cts => "cts",
            ChainMode::Xctr => "xctr",
            ChainMode::Chacha20 => "chacha20",
        }
    }

    /// IV length for a block cipher of `block_size` bytes (dm-crypt raises anything non-zero
    /// to at least 8).
    pub fn iv_size(self, block_size: usize) -> usize {
        match self {
            ChainMode::Ecb => 0,
            ChainMode::Adiantum | ChainMode::Hctr2 => 32,
            ChainMode::Xctr | ChainMode::Chacha20 => 16,
            _ => block_size.max(8),
        }
    }

    /// Builds the keyed mode over the cipher `cipher` (kernel name) with `key`.
    ///
    /// # Errors
    /// Key length errors from the cipher; [`CryptoError::Unsupported`] for combinations that
    /// make no sense (XTS/LRW over a 64-bit block cipher).
    pub fn build(self, cipher: &str, key: &[u8]) -> Result<Box<dyn Mode>, CryptoError> {
        match self {
            ChainMode::Ecb => Ok(Box::new(ecb::Ecb::new(cipher, key)?)),
            ChainMode::Cbc => Ok(Box::new(cbc::Cbc::new(cipher, key)?)),
            ChainMode::Ctr => Ok(Box::new(ctr::Ctr::new(cipher, key)?)),
            ChainMode::Xts => {
                if cipher == "aes" && key.len() == 64 {
                    if let Some(fast) = aws_xts::AwsXts::new(key) {
                        return Ok(Box::new(fast));
                    }
                }
                if cipher == "aes" {
                    if let Some(fast) = vaes_xts::VaesXts::new(key) {
                        return Ok(Box::new(fast));
                    }
                }
                Ok(Box::new(xts::Xts::new(cipher, key)?))
            }
            ChainMode::Lrw => Ok(Box::new(lrw::Lrw::new(cipher, key)?)),
            ChainMode::Adiantum => Ok(Box::new(adiantum::Adiantum::new(cipher, key)?)),
            ChainMode::Hctr2 => Ok(Box::new(hctr2::Hctr2::new(cipher, key)?)),
            ChainMode::Pcbc => Ok(Box::new(pcbc::Pcbc::new(cipher, key)?)),
            ChainMode::Cts => Ok(Box::new(cts::Cts::new(cipher, key)?)),
            ChainMode::Xctr => Ok(Box::new(ctr::Xctr::new(cipher, key)?)),
            ChainMode::Chacha20 => Ok(Box::new(chacha::ChaCha::new(key)?)),
        }
    }
}

/// XORs `src` into `dst` (equal lengths).
#[inline]
pub(crate) fn xor_in_place(dst: &mut [u8], src: &[u8]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d ^= s;
    }
}
