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
//!  Error::Context { context, source }   what was being done, around any of these
//! ```
//!
//! `Context` keeps the messages users see as they were with `anyhow`: each context is one
//! link of the [`std::error::Error::source`] chain, and the CLI prints the chain joined by
//! `": "`. The [`Context`] trait and the [`anyhow!`](crate::anyhow) / [`bail!`](crate::bail)
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
            Error::Invalid(_) | Error::Context { .. } => return None,
        })
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self, self.inner()) {
            (_, Some(e)) => write!(f, "{e}")?,
            (Error::Invalid(m), None) => f.write_str(m)?,
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
    Io(std::io::Error)
);

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
}
