//! The one error type of the backend layer.

use std::path::PathBuf;

/// Everything a backend can fail with.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// An OS-level I/O error, with what was being done.
    #[error("{op} at offset {offset} on {path}")]
    Io {
        /// "read", "write", "flush", ...
        op: &'static str,
        /// Byte offset.
        offset: u64,
        /// The file or device.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Opening the backing file or device failed.
    #[error("cannot open {path}")]
    Open {
        /// The file or device.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A request reaches outside the device.
    #[error("range {offset}+{len} is outside the device ({size} bytes)")]
    OutOfRange {
        /// Byte offset.
        offset: u64,
        /// Length in bytes.
        len: u64,
        /// Device size.
        size: u64,
    },
    /// A request not aligned to what the backend needs (O_DIRECT).
    #[error("{what} {value} is not aligned to {align} bytes")]
    Misaligned {
        /// "offset", "length", "buffer address".
        what: &'static str,
        /// The value.
        value: u64,
        /// The required alignment.
        align: u64,
    },
    /// The backend refuses writes.
    #[error("the device is read-only")]
    ReadOnly,
    /// The operation is not supported by this backend.
    #[error("{0} is not supported by this backend")]
    Unsupported(&'static str),
    /// An injected failure (the `faulty` test backend).
    #[error("injected {op} error at offset {offset}")]
    Injected {
        /// The operation.
        op: &'static str,
        /// Byte offset.
        offset: u64,
    },
    /// A block whose stored tag does not match its data (dm-integrity): its data is not
    /// returned. The kernel fails such a block with EILSEQ; front ends without that code
    /// (NBD, FUSE) answer EIO.
    #[error("integrity tag mismatch in the block at offset {offset} ({len} bytes)")]
    Integrity {
        /// Byte offset of the block (in the device the error comes from).
        offset: u64,
        /// The block's size.
        len: u64,
    },
    /// Anything else, with a message (e.g. a remote backend's protocol error).
    #[error("{0}")]
    Other(String),
}

impl BackendError {
    /// The errno this error maps to at a protocol boundary (NBD replies carry errnos).
    pub fn errno(&self) -> i32 {
        match self {
            BackendError::Io { source, .. } | BackendError::Open { source, .. } => {
                source.raw_os_error().unwrap_or(libc_eio())
            }
            BackendError::OutOfRange { .. } | BackendError::Misaligned { .. } => 22, // EINVAL
            BackendError::ReadOnly => 1,                                             // EPERM
            BackendError::Unsupported(_) => 95,                                      // EOPNOTSUPP
            BackendError::Integrity { .. } => 84,                                    // EILSEQ
            BackendError::Injected { .. } | BackendError::Other(_) => libc_eio(),
        }
    }
}

const fn libc_eio() -> i32 {
    5
}
