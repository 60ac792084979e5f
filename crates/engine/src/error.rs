//! The one error type of the engine.

/// What can go wrong building a volume.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The mapping does not fit the backend.
    #[error(
        "mapping of {length} bytes at offset {offset} does not fit a device of {device} bytes"
    )]
    TooSmall {
        /// Data offset in bytes.
        offset: u64,
        /// Mapping length in bytes.
        length: u64,
        /// Backend size in bytes.
        device: u64,
    },
    /// The mapping is not a whole number of sectors.
    #[error("{what} {value} is not a multiple of the sector size {sector_size}")]
    Misaligned {
        /// "length" or "data offset".
        what: &'static str,
        /// The value in bytes.
        value: u64,
        /// The sector size in bytes.
        sector_size: u32,
    },
    /// The buffer pool could not be allocated.
    #[error("allocating the buffer pool")]
    Pool(#[source] ucrypt_backend::BackendError),
}
