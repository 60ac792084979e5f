//! The library's error type: what failed, typed, so that callers (the CLI's exit codes)
//! decide by type and never by message text.
//!
//! ```text
//!  Error::Format(FormatError)     header/table: wrong passphrase, device missing, refused field…
//!  Error::Backend(BackendError)   the device: cannot be opened, busy (an RBD lock), I/O
//!  Error::Nbd(NbdError)           a remote NBD export cannot be reached
//!  Error::Engine(EngineError)     the volume cannot be built on the device
//!  Error::Crypto(CryptoError)     a cipher the crypto layer refuses
//!  Error::Io(io::Error)           other I/O (sizes, reads and writes of a reencryption)
//!  Error::Invalid(String)         a request the library cannot act on, with the reason
//!  Error::Instance(InstanceError)  a named instance: exists, not active, runtime directory
//!  Error::Lock(LockError)          an image in use by another mapping, or not lockable
//!  Error::Frontend(DeviceError)    a front end (ublk, kernel NBD, FUSE) cannot attach
//!  Error::Refused { kind, message } a running instance's refusal, as its control socket said
//!  Error::Kind { kind, source }    an error whose kind the operation decided
//!  Error::Context { context, source }   what was being done, around any of these
//! ```
//!
//! [`Error::kind`] sorts every error into an [`ErrorKind`] (invalid request, permission or
//! passphrase, memory, device, busy): what a caller branches on, and what the command
//! line turns into cryptsetup's exit codes.
//!
//! `Context` keeps the messages users see as they were with `anyhow`: each context is one
//! link of the [`std::error::Error::source`] chain, and the CLI prints the chain joined by
//! `": "`. The [`Context`] trait and the [`anyhow!`](macro@anyhow) / [`bail!`](macro@bail)
//! macros keep anyhow's names so the code reads as before (they build an
//! [`Error::Invalid`]); nothing here depends on the `anyhow` crate.

use ucrypt_backend::BackendError;
use ucrypt_crypto::CryptoError;
use ucrypt_engine::EngineError;
use ucrypt_format::FormatError;

/// Everything the library's operations can fail with.
///
/// Displayed as anyhow displayed it: `{}` is this link's message, `{:#}` the whole chain
/// (`outer: inner: cause`), so messages users and tests see are unchanged.
#[derive(Debug)]
pub enum Error {
    /// A header, table line or key problem ([`FormatError`]: wrong passphrase, device that
    /// cannot be opened, refused header field, libcryptsetup's error...).
    Format(FormatError),
    /// The device or remote export ([`BackendError`]: open failures, a busy RBD image, I/O).
    Backend(BackendError),
    /// A remote NBD export cannot be reached or spoken to.
    Nbd(ucrypt_nbd::NbdError),
    /// The volume cannot be built on its device.
    Engine(EngineError),
    /// A cipher the crypto layer does not take.
    Crypto(CryptoError),
    /// Other I/O.
    Io(std::io::Error),
    /// A request the library cannot act on (sizes, states, options), with the reason.
    Invalid(String),
    /// A named instance's runtime directory: the name is taken, not active, invalid.
    Instance(crate::instance::runtime::InstanceError),
    /// An image lock: in use by another mapping, or the lock itself failed.
    Lock(crate::instance::lock::LockError),
    /// A front end (ublk, kernel NBD, FUSE) that cannot be attached.
    Frontend(ucrypt_device::DeviceError),
    /// What a running instance answered when it refused a request (its kind and its
    /// message, the chain already joined).
    Refused {
        /// What kind of failure the instance reported.
        kind: ErrorKind,
        /// Its message.
        message: String,
    },
    /// An error whose kind the failing operation decided (a front end that failed while
    /// serving is a device error whatever its cause). Shown as `source` alone.
    Kind {
        /// The kind.
        kind: ErrorKind,
        /// The error.
        source: Box<Error>,
    },
    /// What was being done when `source` failed.
    Context {
        /// What was being done ("unlocking disk.img").
        context: String,
        /// What failed.
        source: Box<Error>,
    },
}

impl Error {
    /// The wrapped error a typed variant stands for (its message and source are shown as
    /// its own, as `#[error(transparent)]` would).
    fn inner(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(match self {
            Error::Format(e) => e,
            Error::Backend(e) => e,
            Error::Nbd(e) => e,
            Error::Engine(e) => e,
            Error::Crypto(e) => e,
            Error::Io(e) => e,
            Error::Instance(e) => e,
            Error::Lock(e) => e,
            Error::Frontend(e) => e,
            Error::Kind { source, .. } => source.as_ref(),
            Error::Invalid(_) | Error::Refused { .. } | Error::Context { .. } => return None,
        })
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self, self.inner()) {
            (_, Some(e)) => write!(f, "{e}")?,
            (Error::Invalid(m), None) | (Error::Refused { message: m, .. }, None) => {
                f.write_str(m)?
            }
            (Error::Context { context, .. }, None) => f.write_str(context)?,
            _ => {}
        }
        if f.alternate() {
            let mut next = std::error::Error::source(self);
            while let Some(c) = next {
                write!(f, ": {c}")?;
                next = c.source();
            }
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Context { source, .. } => Some(source.as_ref()),
            other => other.inner().and_then(std::error::Error::source),
        }
    }
}

macro_rules! from {
    ($($variant:ident($t:ty)),*) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Self {
                Error::$variant(e)
            }
        }
    )*};
}

from!(
    Format(FormatError),
    Backend(BackendError),
    Nbd(ucrypt_nbd::NbdError),
    Engine(EngineError),
    Crypto(CryptoError),
    Io(std::io::Error),
    Instance(crate::instance::runtime::InstanceError),
    Lock(crate::instance::lock::LockError),
    Frontend(ucrypt_device::DeviceError)
);

/// A dm-integrity device that cannot be opened: its superblock or journal (a format
/// error), its device (a backend error), or a refusal with the reason.
impl From<ucrypt_integrity::IntegrityError> for Error {
    fn from(e: ucrypt_integrity::IntegrityError) -> Self {
        match e {
            ucrypt_integrity::IntegrityError::Format(e) => Error::Format(e),
            ucrypt_integrity::IntegrityError::Backend(e) => Error::Backend(e),
            ucrypt_integrity::IntegrityError::Refused(m) => Error::Invalid(m),
        }
    }
}

/// A number or a slice of on-disk data that does not fit the type it is read into (a size
/// beyond `usize`, a short field): a request the library cannot act on.
impl From<std::num::TryFromIntError> for Error {
    fn from(e: std::num::TryFromIntError) -> Self {
        Error::Invalid(e.to_string())
    }
}

impl From<std::array::TryFromSliceError> for Error {
    fn from(e: std::array::TryFromSliceError) -> Self {
        Error::Invalid(e.to_string())
    }
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The error under every [`Error::Context`]: what failed.
    pub fn root(&self) -> &Error {
        match self {
            Error::Context { source, .. } => source.root(),
            other => other,
        }
    }

    /// The format layer's error, if that is what failed.
    pub fn format(&self) -> Option<&FormatError> {
        match self.root() {
            Error::Format(f) => Some(f),
            _ => None,
        }
    }

    /// What kind of failure this is: the kind an operation set ([`Error::Kind`], the
    /// outermost wins) or a running instance reported ([`Error::Refused`]); otherwise
    /// from what failed: a busy device, lock or name is [`ErrorKind::Busy`]; the format
    /// layer's errors by their errno (a wrong passphrase is [`ErrorKind::Permission`]);
    /// backend, engine and front-end errors, a lock that could not be taken and an
    /// inactive instance are [`ErrorKind::Device`]; the rest [`ErrorKind::Invalid`].
    pub fn kind(&self) -> ErrorKind {
        use crate::instance::lock::LockError;
        use crate::instance::runtime::InstanceError;
        match self {
            Error::Kind { kind, .. } | Error::Refused { kind, .. } => return *kind,
            Error::Context { source, .. } => return source.kind(),
            _ => {}
        }
        if self.is_busy() {
            return ErrorKind::Busy;
        }
        match self {
            Error::Format(f) => ErrorKind::from_exit_code(f.exit_code()),
            Error::Backend(_) | Error::Engine(_) | Error::Frontend(_) => ErrorKind::Device,
            Error::Instance(
                InstanceError::Exists { .. }
                | InstanceError::DeadDevice { .. }
                | InstanceError::DeadDeviceInUse { .. },
            ) => ErrorKind::Busy,
            Error::Instance(InstanceError::NotActive(_)) => ErrorKind::Device,
            Error::Lock(LockError::InUse { .. }) => ErrorKind::Busy,
            Error::Lock(LockError::Io { .. }) => ErrorKind::Device,
            _ => ErrorKind::Invalid,
        }
    }

    /// Gives this error the kind `kind` (see [`Error::Kind`]).
    pub fn with_kind(self, kind: ErrorKind) -> Error {
        Error::Kind {
            kind,
            source: Box::new(self),
        }
    }

    /// Whether the device failed (could not be opened or used: a backend or engine error).
    pub fn is_device(&self) -> bool {
        matches!(self.root(), Error::Backend(_) | Error::Engine(_))
    }

    /// Whether the device is held by someone else: a remote device that refused the open
    /// as busy (an RBD image whose exclusive lock another client holds).
    pub fn is_busy(&self) -> bool {
        matches!(
            self.root(),
            Error::Backend(BackendError::Open { source, .. })
                if source.kind() == std::io::ErrorKind::ResourceBusy
        )
    }
}

/// Whether one link of an error chain (a caller's own error type may hold the library's
/// errors or those of the crates under it, as returned by the types the library re-exports)
/// says the device failed: the library's device errors, a backend or engine error.
pub fn link_is_device(link: &(dyn std::error::Error + 'static)) -> bool {
    link.downcast_ref::<Error>().is_some_and(Error::is_device)
        || link.downcast_ref::<BackendError>().is_some()
        || link.downcast_ref::<EngineError>().is_some()
}

/// Whether one link of an error chain says the device is held by someone else (see
/// [`Error::is_busy`]; also a bare backend error saying so).
pub fn link_is_busy(link: &(dyn std::error::Error + 'static)) -> bool {
    link.downcast_ref::<Error>().is_some_and(Error::is_busy)
        || matches!(
            link.downcast_ref::<BackendError>(),
            Some(BackendError::Open { source, .. })
                if source.kind() == std::io::ErrorKind::ResourceBusy
        )
}

/// The kind one link of an error chain decides, if it decides one: the format layer's
/// error (bare or under the library's) by its errno, a device failure as
/// [`ErrorKind::Device`]; `None` for a link that says nothing (a context, a message).
pub fn link_kind(link: &(dyn std::error::Error + 'static)) -> Option<ErrorKind> {
    if let Some(u) = link.downcast_ref::<Error>() {
        if let Some(f) = u.format() {
            return Some(ErrorKind::from_exit_code(f.exit_code()));
        }
        if u.is_device() {
            return Some(ErrorKind::Device);
        }
    }
    if let Some(f) = link.downcast_ref::<FormatError>() {
        return Some(ErrorKind::from_exit_code(f.exit_code()));
    }
    if link.downcast_ref::<BackendError>().is_some() || link.downcast_ref::<EngineError>().is_some()
    {
        return Some(ErrorKind::Device);
    }
    None
}

/// The kind an error chain has as cryptsetup reports it: busy when a link says the device
/// is held by someone else ([`link_is_busy`]), else the kind of the first link that decides
/// one ([`link_kind`]: the format layer's errno, a device failure), else
/// [`ErrorKind::Invalid`]. For errors of other types that hold the library's, or the
/// library's own built by an operation that names no kind.
pub fn chain_kind(e: &(dyn std::error::Error + 'static)) -> ErrorKind {
    if links(e).any(link_is_busy) {
        return ErrorKind::Busy;
    }
    links(e).find_map(link_kind).unwrap_or(ErrorKind::Invalid)
}

/// The kind of a failed open of a device or table: busy as in [`chain_kind`], a device
/// failure anywhere in the chain ([`link_is_device`]) [`ErrorKind::Device`], anything
/// else (the table, its cipher, an option) [`ErrorKind::Invalid`].
pub fn open_kind(e: &(dyn std::error::Error + 'static)) -> ErrorKind {
    if links(e).any(link_is_busy) {
        ErrorKind::Busy
    } else if links(e).any(link_is_device) {
        ErrorKind::Device
    } else {
        ErrorKind::Invalid
    }
}

/// `e` and every error under it.
fn links<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(e), |l| l.source())
}

/// The kinds of failure callers tell apart (cryptsetup's exit codes 1 to 5 are one per kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// A request that cannot be acted on: bad options, wrong state, unknown names.
    Invalid,
    /// No permission, or no key with this passphrase.
    Permission,
    /// Out of memory.
    NoMemory,
    /// The device (or instance) is missing or failed.
    Device,
    /// The device, image or name is in use.
    Busy,
}

impl ErrorKind {
    /// The kind cryptsetup's exit code `code` stands for (the format layer's errors carry
    /// cryptsetup's codes).
    pub fn from_exit_code(code: u8) -> ErrorKind {
        match code {
            2 => ErrorKind::Permission,
            3 => ErrorKind::NoMemory,
            4 => ErrorKind::Device,
            5 => ErrorKind::Busy,
            _ => ErrorKind::Invalid,
        }
    }
}

/// anyhow's `Context`, for the library's [`Error`]: wraps an error (or a `None`) in what
/// was being done.
pub trait Context<T> {
    /// Wraps the error in `context`.
    ///
    /// # Errors
    /// The wrapped error.
    fn context<C: std::fmt::Display>(self, context: C) -> Result<T>;

    /// Wraps the error in the context `f` gives (called only on an error).
    ///
    /// # Errors
    /// The wrapped error.
    fn with_context<C: std::fmt::Display, F: FnOnce() -> C>(self, f: F) -> Result<T>;
}

impl<T, E: Into<Error>> Context<T> for std::result::Result<T, E> {
    fn context<C: std::fmt::Display>(self, context: C) -> Result<T> {
        self.map_err(|e| Error::Context {
            context: context.to_string(),
            source: Box::new(e.into()),
        })
    }

    fn with_context<C: std::fmt::Display, F: FnOnce() -> C>(self, f: F) -> Result<T> {
        self.map_err(|e| Error::Context {
            context: f().to_string(),
            source: Box::new(e.into()),
        })
    }
}

impl<T> Context<T> for Option<T> {
    fn context<C: std::fmt::Display>(self, context: C) -> Result<T> {
        self.ok_or_else(|| Error::Invalid(context.to_string()))
    }

    fn with_context<C: std::fmt::Display, F: FnOnce() -> C>(self, f: F) -> Result<T> {
        self.ok_or_else(|| Error::Invalid(f().to_string()))
    }
}

/// An [`Error::Invalid`] from a format string (anyhow's name, the library's type).
macro_rules! anyhow {
    ($($arg:tt)*) => {
        $crate::error::Error::Invalid(format!($($arg)*))
    };
}

/// Returns an [`Error::Invalid`] from a format string (anyhow's name, the library's type).
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::error::Error::Invalid(format!($($arg)*)))
    };
}

pub(crate) use {anyhow, bail};

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A context chain reads as anyhow's did (outermost first, each link one message), and
    /// the type under it stays reachable.
    #[test]
    fn contexts_chain_like_anyhow_and_keep_the_type() {
        let e: Result<()> = Err(FormatError::BadPassphrase {
            device: "d".into(),
            tried: "all".into(),
        })
        .context("inner")
        .with_context(|| "outer");
        let e = e.unwrap_err();
        let mut chain = vec![e.to_string()];
        let mut s = std::error::Error::source(&e);
        while let Some(c) = s {
            chain.push(c.to_string());
            s = c.source();
        }
        assert_eq!(
            chain,
            [
                "outer",
                "inner",
                "d: no key available with this passphrase (all)"
            ]
        );
        assert_eq!(
            format!("{e:#}"),
            "outer: inner: d: no key available with this passphrase (all)"
        );
        assert_eq!(e.format().unwrap().exit_code(), 2);
        assert!(!e.is_device() && !e.is_busy());
        let none: Option<u8> = None;
        assert_eq!(none.context("empty").unwrap_err().to_string(), "empty");
    }

    /// Kinds come from what failed, a kind set by the operation wins, and an instance's
    /// refusal keeps its kind and message.
    #[test]
    fn kinds_follow_what_failed() {
        use crate::instance::lock::LockError;
        use crate::instance::runtime::InstanceError;
        let bad_pass = Error::from(FormatError::BadPassphrase {
            device: "d".into(),
            tried: "all".into(),
        });
        assert_eq!(bad_pass.kind(), ErrorKind::Permission);
        let exists = Error::from(InstanceError::Exists {
            name: "n".into(),
            pid: 1,
        });
        assert_eq!(exists.kind(), ErrorKind::Busy);
        let gone = Error::from(InstanceError::NotActive("n".into()));
        assert_eq!(gone.kind(), ErrorKind::Device);
        let held = Error::from(LockError::InUse {
            path: "p".into(),
            holder: "h".into(),
        });
        assert_eq!(held.kind(), ErrorKind::Busy);
        let busy_rbd = Error::from(BackendError::Open {
            path: "rbd:p/i".into(),
            source: std::io::Error::from(std::io::ErrorKind::ResourceBusy),
        });
        assert_eq!(busy_rbd.kind(), ErrorKind::Busy);
        let e: Result<()> = Err(Error::Invalid("x".into())).context("doing y");
        assert_eq!(e.unwrap_err().kind(), ErrorKind::Invalid);
        let set = Error::Invalid("served".into()).with_kind(ErrorKind::Device);
        assert_eq!(
            (set.kind(), set.to_string()),
            (ErrorKind::Device, "served".into())
        );
        let refused = Error::Refused {
            kind: ErrorKind::Busy,
            message: "n is in use".into(),
        };
        assert_eq!(
            (refused.kind(), format!("{refused:#}")),
            (ErrorKind::Busy, "n is in use".into())
        );
        for code in 1..=5 {
            assert_eq!(
                ErrorKind::from_exit_code(code),
                [
                    ErrorKind::Invalid,
                    ErrorKind::Permission,
                    ErrorKind::NoMemory,
                    ErrorKind::Device,
                    ErrorKind::Busy
                ][usize::from(code - 1)]
            );
        }
    }
}
