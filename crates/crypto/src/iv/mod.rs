//! IV generators: how a sector number becomes the IV of its sector.
//!
//! One enum, [`IvMode`], names them all; the mode string is compared nowhere else. Modes
//! that also transform data (`lmk`, `tcw`, `elephant`) are ciphers in [`crate::legacy`], not
//! generators; here they are only names.
//!
//! | mode | IV (dm-crypt 6.1, `iv_sector` in 512-byte units unless `iv_large_sectors`) |
//! |---|---|
//! | `plain` | le32(iv_sector), zero-padded (wraps at 2^32) |
//! | `plain64` | le64(iv_sector), zero-padded |
//! | `plain64be` | be64(iv_sector) in the last 8 bytes |
//! | `essiv:<hash>` | E_{hash(subkey)}(le64(iv_sector) ‖ 0) |
//! | `benbi` | be64((iv_sector << (9 - log2 block)) + 1) in the last 8 bytes (big-endian narrow block index, for LRW) |
//! | `null` | zeros |
//! | `eboiv` | E_subkey(le64(iv_sector × sector_size) ‖ 0) (BitLocker) |
//! | `lmk` | loop-AES, legacy: MD5 over the sector (see `legacy::lmk`) |
//! | `tcw` | TrueCrypt, legacy: seed ⊕ sector, plus whitening (see `legacy::tcw`) |
//! | `elephant` | BitLocker with diffuser, legacy (see `legacy::elephant`) |
//! | `random` | refused: it needs dm-integrity to store the IV |

pub mod benbi;
pub mod eboiv;
pub mod essiv;
pub mod null;
pub mod plain;
pub mod plain64;
pub mod plain64be;

use crate::CryptoError;

/// The IV modes ucrypt knows, by kernel name.
pub const IV_NAMES: &str =
    "plain, plain64, plain64be, essiv, benbi, null, eboiv, lmk, tcw, elephant";

/// Fills the IV for one IV-sector number. Pure: no state changes between calls.
pub trait IvGenerator: Send + Sync {
    /// Writes the IV for `iv_sector` into `iv` (its whole length, dm-crypt's IV size).
    fn fill(&self, iv_sector: u64, iv: &mut [u8]);
}

/// An IV mode by name (with its option, for `essiv:<hash>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IvMode {
    /// le32 of the sector number.
    Plain,
    /// le64 of the sector number.
    Plain64,
    /// be64 of the sector number, at the end of the IV.
    Plain64Be,
    /// Encrypted salt-sector IV with the named hash.
    Essiv(String),
    /// Big-endian narrow block count (for LRW).
    Benbi,
    /// All zeros.
    Null,
    /// Encrypted byte-offset IV (BitLocker).
    Eboiv,
    /// loop-AES compatibility (a legacy cipher, see `legacy::lmk`).
    Lmk,
    /// TrueCrypt compatibility (a legacy cipher, see `legacy::tcw`).
    Tcw,
    /// BitLocker with the Elephant diffuser (a legacy cipher, see `legacy::elephant`).
    Elephant,
    /// Random IVs: needs dm-integrity, refused when building.
    Random,
}

impl IvMode {
    /// Parses `name` with its `:`-option (`essiv:sha256` → name `essiv`, opts `sha256`).
    ///
    /// # Errors
    /// [`CryptoError::Unknown`] for an unknown name; [`CryptoError::IvMode`] for `essiv`
    /// without a hash.
    pub fn parse(name: &str, opts: Option<&str>) -> Result<Self, CryptoError> {
        Ok(match name {
            "plain" => IvMode::Plain,
            "plain64" => IvMode::Plain64,
            "plain64be" => IvMode::Plain64Be,
            "essiv" => match opts {
                Some(h) if !h.is_empty() => IvMode::Essiv(h.to_string()),
                _ => {
                    return Err(CryptoError::IvMode {
                        iv: "essiv".into(),
                        reason: "digest algorithm missing for ESSIV mode (write essiv:sha256)"
                            .into(),
                    })
                }
            },
            "benbi" => IvMode::Benbi,
            "null" => IvMode::Null,
            "eboiv" => IvMode::Eboiv,
            "lmk" => IvMode::Lmk,
            "tcw" => IvMode::Tcw,
            "elephant" => IvMode::Elephant,
            "random" => IvMode::Random,
            other => {
                return Err(CryptoError::Unknown {
                    what: "IV mode",
                    name: other.to_string(),
                    expected: IV_NAMES,
                })
            }
        })
    }

    /// The kernel name, with its option.
    pub fn name(&self) -> String {
        match self {
            IvMode::Plain => "plain".into(),
            IvMode::Plain64 => "plain64".into(),
            IvMode::Plain64Be => "plain64be".into(),
            IvMode::Essiv(h) => format!("essiv:{h}"),
            IvMode::Benbi => "benbi".into(),
            IvMode::Null => "null".into(),
            IvMode::Eboiv => "eboiv".into(),
            IvMode::Lmk => "lmk".into(),
            IvMode::Tcw => "tcw".into(),
            IvMode::Elephant => "elephant".into(),
            IvMode::Random => "random".into(),
        }
    }

    /// Whether the mode transforms data and so is built as a legacy cipher.
    pub fn is_legacy(&self) -> bool {
        matches!(self, IvMode::Lmk | IvMode::Tcw | IvMode::Elephant)
    }
}
