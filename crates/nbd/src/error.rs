//! The one error type of the NBD layer. Peer faults ([`ProtocolViolation`]) are kept apart
//! from local failures (rustls `PeerMisbehaved`): a violation ends one connection, a local
//! failure (bind, flush) ends `serve`.

use std::path::PathBuf;

/// Everything the NBD server can fail with.
#[derive(Debug, thiserror::Error)]
pub enum NbdError {
    /// Binding or preparing a listening socket failed.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The socket path or address.
        addr: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Removing a stale socket file failed, or the path is not a socket.
    #[error("socket path {path} exists and is not a socket")]
    SocketPathInUse {
        /// The path.
        path: PathBuf,
    },
    /// Socket I/O failed (accepting, reading, writing), with what was being done.
    #[error("{op}")]
    Io {
        /// "accepting a connection", "reading a request", ...
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The client broke the protocol; the connection was closed.
    #[error("protocol violation")]
    Protocol(#[from] ProtocolViolation),
    /// The export cannot be served as it is (e.g. block sizes the protocol cannot express).
    #[error("export not servable: {0}")]
    Export(String),
    /// The backend failed (the final flush on shutdown).
    #[error("backend {op} failed")]
    Backend {
        /// The operation.
        op: &'static str,
        /// The backend's error.
        #[source]
        source: ucrypt_backend::BackendError,
    },
    /// A TLS credentials file cannot be read (missing certificate, key or PSK file).
    #[error("cannot read TLS file {path}")]
    TlsFile {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// OpenSSL refused the TLS configuration (a file that is not PEM, a key that does not
    /// match its certificate).
    #[error("TLS setup failed: {what}")]
    TlsSetup {
        /// What was being done, naming the file.
        what: String,
        /// OpenSSL's errors.
        #[source]
        source: openssl::error::ErrorStack,
    },
    /// A malformed line in a PSK file (the content is never shown: it holds keys).
    #[error("PSK file {path} line {line}: {reason} (format: username:hexkey per line)")]
    PskFile {
        /// The file.
        path: PathBuf,
        /// 1-based line number (0: the file as a whole).
        line: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The TLS handshake with a client failed (bad or missing certificate, unknown PSK
    /// identity, not TLS at all); the connection was closed.
    #[error("TLS handshake failed: {0}")]
    TlsHandshake(String),
    /// The client sent bytes after `NBD_OPT_STARTTLS` before the server's reply, so they
    /// cannot belong to the TLS handshake.
    #[error("data pipelined after NBD_OPT_STARTTLS")]
    DataAfterStartTls,
    /// Installing the signal handling failed.
    #[error("cannot set up signal handling")]
    Signals(#[source] std::io::Error),
}

/// A client broke a MUST of the spec, or sent input only an attacker would send. The
/// server answers with a hard disconnect ("If either the client or the server detects a
/// violation of a mandatory condition ('MUST' etc.) by the other party, it MAY initiate a
/// hard disconnect").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolViolation {
    /// Client flags with bits the server did not advertise.
    #[error("client flags {0:#x} contain unknown bits (known: 0x3)")]
    UnknownClientFlags(u32),
    /// An option header without the IHAVEOPT magic.
    #[error("option magic {0:#018x} is not IHAVEOPT (0x49484156454f5054)")]
    BadOptionMagic(u64),
    /// Option data larger than any option we understand needs.
    #[error("option {option} carries {len} bytes (at most {max} accepted)", max = crate::handshake::MAX_OPTION_BYTES)]
    OptionTooLarge {
        /// Option number.
        option: u32,
        /// Its claimed length.
        len: u32,
    },
    /// Too many options in one handshake.
    #[error("more than {0} options in one handshake")]
    TooManyOptions(u32),
    /// A request header without the request magic: framing is lost.
    #[error("request magic {0:#010x} is not NBD_REQUEST_MAGIC (0x25609513)")]
    BadRequestMagic(u32),
    /// The handshake driver fed the wrong number of bytes (a bug in the driver).
    #[error("handshake fed {got} bytes where {wanted} were wanted")]
    ShortInput {
        /// Bytes the state machine wanted.
        wanted: usize,
        /// Bytes it got.
        got: usize,
    },
    /// Input after the handshake ended (a bug in the driver).
    #[error("handshake input after the handshake ended")]
    HandshakeOver,
}
