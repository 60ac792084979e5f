//! The one error type of the crypto layer.
//!
//! Messages name the input and what would have been accepted. They carry lengths and
//! names, never key bytes.

/// Everything that can go wrong turning a cipher spec and key into a [`crate::SectorCipher`].
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum CryptoError {
    /// The cipher spec string could not be parsed.
    #[error("invalid cipher spec \"{spec}\": {reason}")]
    Spec {
        /// The spec as given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A cipher, chain mode, IV mode or hash that ucrypt does not know.
    #[error("unknown {what} \"{name}\" (expected one of {expected})")]
    Unknown {
        /// "cipher", "chain mode", "IV mode", "hash".
        what: &'static str,
        /// The name as given.
        name: String,
        /// The accepted names.
        expected: &'static str,
    },
    /// A combination the kernel accepts but ucrypt cannot serve (yet).
    #[error("{0} is not supported")]
    Unsupported(String),
    /// The key has the wrong length for the cipher, mode and IV mode.
    #[error("key of {got} bytes does not fit {spec}: {reason}")]
    KeyLength {
        /// Key length in bytes.
        got: usize,
        /// The cipher spec.
        spec: String,
        /// What was expected.
        reason: String,
    },
    /// The key text is neither hex nor `-`.
    #[error("key is not valid: {0}")]
    KeyFormat(String),
    /// A sector size outside what is allowed.
    #[error("sector_size {0} is not a power of two in 512..=4096 (8192..=65536 only with the large-sector extension)")]
    SectorSize(u32),
    /// An IV mode that cannot work with the chosen sector parameters.
    #[error("IV mode {iv} cannot be used here: {reason}")]
    IvMode {
        /// The IV mode.
        iv: String,
        /// Why not.
        reason: String,
    },
    /// `iv_offset` is not a multiple of the sector size when `iv_large_sectors` is set.
    #[error("iv_offset {iv_offset} is not a multiple of {unit} 512-byte sectors (required with iv_large_sectors and sector_size {sector_size})")]
    IvOffsetAlignment {
        /// The offending offset.
        iv_offset: u64,
        /// Sector size in 512-byte units.
        unit: u64,
        /// Sector size in bytes.
        sector_size: u32,
    },
    /// A crypto library call failed.
    #[error("crypto library failure: {0}")]
    Library(&'static str),
}
