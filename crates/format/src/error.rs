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
    /// A libcryptsetup call failed (`errno` is the positive error number it returned;
    /// `detail` is the library's own message, never key material).
    #[error("{}", cryptsetup_message(.op, .device, .detail, *.errno))]
    Cryptsetup {
        /// What was being done ("loading the header").
        op: String,
        /// The device or file.
        device: String,
        /// Positive errno (EPERM: no keyslot opens with that passphrase).
        errno: i32,
        /// The library's error lines.
        detail: String,
    },
    /// The device (or detached header) cannot be opened at all: missing, not readable,
    /// not a file or block device. cryptsetup's "wrong device" (exit 4; EPERM: 2).
    #[error("{}", cryptsetup_message("opening device", .device, .detail, *.errno))]
    DeviceUnavailable {
        /// The device or file.
        device: String,
        /// Positive errno.
        errno: i32,
        /// The library's or the OS's message.
        detail: String,
    },
    /// The header is readable but must not be opened or changed (requirements, unbound
    /// keyslots, kernel driver cipher names).
    #[error("{0}")]
    Refused(String),
    /// An on-disk header (or a field of it) is malformed or outside what the format allows.
    #[error("{what}: {reason}")]
    Header {
        /// What was being read ("LUKS1 header on disk.img").
        what: String,
        /// What is wrong and what was acceptable.
        reason: String,
    },
    /// No keyslot (or not the requested one) opens with the given passphrase or key file.
    #[error("{device}: no key available with this passphrase ({tried})")]
    BadPassphrase {
        /// The header device.
        device: String,
        /// Which keyslots were tried.
        tried: String,
    },
    /// An error of one part of a larger input (`at` names it: "table line 3").
    #[error("{at}")]
    At {
        /// Where: the line or part.
        at: String,
        /// What is wrong there.
        #[source]
        source: Box<FormatError>,
    },
    /// The cipher part is refused by the crypto layer.
    #[error(transparent)]
    Crypto(#[from] CryptoError),
}

/// One line for a libcryptsetup failure: the library's own message when it has one (it
/// already names the device; otherwise the operation and device go in front), else what
/// the errno means. No errno numbers: the exit code carries the class.
fn cryptsetup_message(op: &str, device: &str, detail: &str, errno: i32) -> String {
    let what = match errno {
        libc::EPERM => "no key available with this passphrase (or permission denied)",
        libc::ENOENT => "not found",
        libc::EINVAL => "invalid argument or no valid header",
        libc::EBUSY => "device busy",
        libc::ENOMEM => "out of memory",
        libc::ENOTBLK | libc::ENODEV => "wrong device",
        libc::EEXIST => "already exists",
        libc::ENOTSUP => "not supported",
        _ => "failed",
    };
    let detail = detail.trim().trim_end_matches('.');
    if detail.is_empty() {
        format!("{op} on {device}: {what}")
    } else if detail.contains(device) {
        detail.to_string()
    } else {
        format!("{op} on {device}: {detail}")
    }
}

impl FormatError {
    /// cryptsetup's exit code for this error: 1 wrong parameters, 2 no permission or bad
    /// passphrase, 3 out of memory, 4 wrong device, 5 device busy.
    pub fn exit_code(&self) -> u8 {
        match self {
            FormatError::Cryptsetup { errno, .. } => match *errno {
                libc::EPERM => 2,
                libc::ENOMEM => 3,
                libc::ENOTBLK | libc::ENODEV => 4,
                libc::EBUSY | libc::EEXIST => 5,
                _ => 1,
            },
            FormatError::BadPassphrase { .. } => 2,
            FormatError::DeviceUnavailable { errno, .. } if *errno == libc::EPERM => 2,
            FormatError::DeviceUnavailable { .. } => 4,
            FormatError::At { source, .. } => source.exit_code(),
            _ => 1,
        }
    }
}
