//! The one error type of the format layer.

use ucrypt_crypto::CryptoError;

/// Everything that can be wrong with a table line or header.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The table line does not have the dm-crypt shape.
    #[error("invalid table line: {0}")]
    Table(String),
    /// An optional parameter is unknown or malformed.
    #[error("invalid optional parameter \"{param}\": {reason}")]
    OptParam {
        /// The parameter as given.
        param: String,
        /// What is wrong.
        reason: String,
    },
    /// A feature dm-crypt has that ucrypt does not (yet).
    #[error("{0} is not supported yet")]
    NotSupported(String),
    /// A rule across fields is broken (sizes, alignment).
    #[error("{0}")]
    Rule(String),
    /// The key could not be obtained (keyring).
    #[error("key: {0}")]
    Key(String),
    /// The cipher part is refused by the crypto layer.
    #[error(transparent)]
    Crypto(#[from] CryptoError),
}
