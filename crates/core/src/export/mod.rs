//! Serving a volume over NBD in the caller's own process (`ucrypt open` in the
//! foreground, a test, a program embedding the library): the NBD server, its listeners,
//! TLS and shutdown. The `nbd` crate's server API is the library's for this (an
//! [`crate::open`] result is served as it is), so its names are re-exported here; beside
//! them the library's decisions about serving: where ([`Endpoint`]), to whom
//! ([`Exposure`]: TLS, no plaintext on a TCP port unless asked for), with how many
//! threads ([`default_workers`]), and for how long ([`Bound::serve`]: until a signal, or
//! while a command runs beside the server). A named instance serves through
//! [`crate::instance::server`].

mod endpoint;
mod foreground;

pub use endpoint::{Bound, Cleanup, Endpoint, Exposure, Tls};
pub use foreground::Ended;
pub use ucrypt_nbd::server::{on_signals, shutdown_on_signals, MAX_WORKERS};
pub use ucrypt_nbd::{serve, Listener, ServeOptions, Shutdown, TlsConfig, TlsMode};

use crate::open::DeviceKind;
use std::path::Path;

/// Threads per NBD connection when the caller names none: 8, and 32 when the device is an
/// RBD image or an NBD URI. A request holds its thread until librbd or the remote server
/// answers (a network round trip), so a client at depth 32 has only as many requests in
/// flight as there are threads: 4 KiB random writes at depth 32 over `rbd:` went from 1167
/// to 1868 IOPS (medians of three alternating runs, bench/rbd.sh's cluster,
/// BENCHMARKING.md), and over a qemu-nbd export of RBD from 935 and 1159 to 1427 and 2353
/// (once its connections carried many requests each). A file backend answers in
/// microseconds, where 8 threads already keep two CPUs busy.
pub fn default_workers(device: Option<&Path>) -> usize {
    let remote = device
        .map(DeviceKind::of_path)
        .is_some_and(|k| matches!(k, DeviceKind::Rbd | DeviceKind::Nbd));
    if remote {
        32
    } else {
        8
    }
}
