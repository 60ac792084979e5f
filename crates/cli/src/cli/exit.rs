//! Exit codes: the one place that turns errors into cryptsetup's codes (1 wrong
//! parameters, 2 no permission or bad passphrase, 3 out of memory, 4 wrong device, 5 device
//! busy), from the error's type: the library's [`ucrypt::ErrorKind`], and for the links of
//! an error chain the library's classification ([`ucrypt::link_kind`]: the format layer's
//! errno, device failures), instance and lock errors.

use ucrypt::instance::lock::LockError;
use ucrypt::instance::runtime::InstanceError;
use ucrypt::ErrorKind;

/// Exit code for a wrong passphrase or no permission (cryptsetup's 2).
pub(crate) const EXIT_PERMISSION: u8 = 2;
/// Exit code for a busy device or name (cryptsetup's 5).
pub(crate) const EXIT_BUSY: u8 = 5;

/// cryptsetup's exit code for a kind of failure.
pub(crate) fn code_of(kind: ErrorKind) -> u8 {
    match kind {
        ErrorKind::Invalid => EXIT_PARAMS,
        ErrorKind::Permission => EXIT_PERMISSION,
        ErrorKind::NoMemory => 3,
        ErrorKind::Device => EXIT_DEVICE,
        ErrorKind::Busy => EXIT_BUSY,
    }
}

/// A library error with the exit code of its kind ([`ucrypt::Error::kind`]).
pub(crate) fn lib_error(e: ucrypt::Error) -> CliError {
    CliError {
        code: code_of(e.kind()),
        err: e.into(),
    }
}

/// A command's error as the library's, for a callback the library made (a prompt that
/// was interrupted, timed out, got a passphrase too long): its message chain on one line,
/// the kind of its exit code.
pub(crate) fn caller_error(e: CliError) -> ucrypt::Error {
    ucrypt::Error::Invalid(error_line(&e.err)).with_kind(ErrorKind::from_exit_code(e.code))
}

/// Maps instance errors to exit codes: an existing name is "busy" (5).
pub(crate) fn instance_error(e: InstanceError) -> CliError {
    lib_error(ucrypt::Error::Instance(e))
}

/// Maps lock errors: in use is 5.
pub(crate) fn lock_error(e: LockError) -> CliError {
    lib_error(ucrypt::Error::Lock(e))
}

/// An error whose message was already printed: only its exit code remains.
#[derive(Debug)]
pub(crate) struct Printed;

impl std::fmt::Display for Printed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("(printed)")
    }
}

impl std::error::Error for Printed {}

/// An error with the exit code it maps to.
pub(crate) struct CliError {
    pub(crate) code: u8,
    pub(crate) err: anyhow::Error,
}

impl CliError {
    /// The exit code this error gives.
    pub(crate) fn code(&self) -> u8 {
        self.code
    }
}

/// Exit code for wrong parameters (cryptsetup's 1).
pub(crate) const EXIT_PARAMS: u8 = 1;
/// Exit code for a wrong device (cryptsetup's 4).
pub(crate) const EXIT_DEVICE: u8 = 4;

impl<E: Into<anyhow::Error>> From<E> for CliError {
    fn from(e: E) -> Self {
        CliError {
            code: EXIT_PARAMS,
            err: e.into(),
        }
    }
}

/// Attaches an exit code to an error.
pub(crate) trait WithCode<T> {
    fn code(self, code: u8) -> Result<T, CliError>;
}

impl<T, E: Into<anyhow::Error>> WithCode<T> for Result<T, E> {
    fn code(self, code: u8) -> Result<T, CliError> {
        self.map_err(|e| CliError {
            code,
            err: e.into(),
        })
    }
}

/// An error and its context chain on one line, outermost first.
pub(crate) fn error_line(err: &anyhow::Error) -> String {
    let msg: Vec<String> = err.chain().map(ToString::to_string).collect();
    msg.join(": ")
}

/// Maps an error to cryptsetup's exit code from its type ([`ucrypt::chain_kind`]: busy 5,
/// else the first link that decides: the format layer's errno, EPERM 2, ENOMEM 3,
/// ENODEV/ENOTBLK 4, EBUSY 5; a device failure 4), anything else 1.
pub(crate) fn cs_error(e: impl Into<anyhow::Error>) -> CliError {
    let err = e.into();
    CliError {
        code: code_of(ucrypt::chain_kind(err.as_ref())),
        err,
    }
}

/// `anyhow` conversion plus [`cs_error`] for library results.
pub(crate) trait CsResult<T> {
    /// Maps the error with [`cs_error`].
    fn cs(self) -> Result<T, CliError>;
}

impl<T, E: Into<anyhow::Error>> CsResult<T> for Result<T, E> {
    fn cs(self) -> Result<T, CliError> {
        self.map_err(cs_error)
    }
}
