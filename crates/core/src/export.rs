//! Serving a volume over NBD in the caller's own process (`ucrypt open` in the
//! foreground, a test, a program embedding the library): the NBD server, its listeners,
//! TLS and shutdown. The `nbd` crate's server API is the library's for this (an
//! [`crate::open`] result is served as it is, over a listener the caller binds), so its
//! names are re-exported here; a named instance serves through [`crate::instance::server`].

pub use ucrypt_nbd::server::{on_signals, shutdown_on_signals, MAX_WORKERS};
pub use ucrypt_nbd::{serve, Listener, ServeOptions, Shutdown, TlsConfig, TlsMode};
