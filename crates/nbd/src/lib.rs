//! # ucrypt-nbd: the NBD front end
//!
//! Serves any `Arc<dyn Backend>` (the decrypted `engine::Volume`, or a raw `FileBackend`
//! as a baseline) to NBD clients: the kernel's `nbd-client`, QEMU, libnbd's `nbdinfo`,
//! `nbdcopy` and `nbdfuse`, fio's `nbd` engine. Knows nothing of ciphers.
//!
//! ```text
//!  socket ──► handshake (sans-IO) ──► per connection, N threads, each:
//!               read request (read lock) ──► command::validate ──► Backend ──► reply (write lock)
//!                                                │ refused: errno reply
//! ```
//!
//! - [`proto`]: the spec's constants under the spec's names.
//! - [`handshake`]: fixed newstyle negotiation as a state machine (bytes in, bytes out).
//! - [`command`]: request parsing and validation, with the spec's errnos.
//! - [`server`]: listeners (unix, TCP), the connection limit, per-connection threads that
//!   each receive, run and answer requests, graceful shutdown ([`serve`]).
//! - [`tls`]: TLS credentials (x509 or PSK) for `NBD_OPT_STARTTLS`; a TLS connection runs
//!   its requests one at a time (see `server/conn.rs`).
//! - [`client`], [`remote`]: the other direction, [`NbdBackend`]: ciphertext stored on
//!   another NBD server.
//!
//! Spec: NetworkBlockDevice/nbd `doc/proto.md`.

pub mod client;
pub mod command;
mod error;
pub mod handshake;
pub mod proto;
pub mod remote;
pub mod server;
pub mod tls;

pub use error::{NbdError, ProtocolViolation};
pub use handshake::TlsMode;
pub use remote::{NbdBackend, RemoteOptions};
pub use server::{serve, Listener, ServeOptions, Shutdown};
pub use tls::{ClientTls, ClientTlsParams, TlsConfig, TlsKind};
