//! Named instances: what `ucrypt open DEV NAME` leaves running, and how the other commands
//! find it.
//!
//! - [`runtime`]: the runtime directory (`/run/ucrypt/NAME/`), liveness, stale cleanup.
//! - [`lock`]: exclusive access to the image (OFD locks, `O_EXCL` on block devices).
//! - [`server`]: a running instance: the volume, the NBD server, the front end, the
//!   control socket's requests (`online` runs an online reencryption inside it).
//! - [`start`]: what starting one decides: name, front end, description, image locks,
//!   `--persistent`, and then serving it.
//! - [`control`]: the control socket's typed protocol ([`control::Request`], [`control::Reply`]).
//! - [`frontend`]: choosing and attaching ublk, kernel NBD, FUSE or none.
//! - [`switch`]: the suspendable, replaceable backend every front end serves.
//! - [`reencrypting`]: what an instance serves while it re-encrypts itself (online).
//! - [`rekey`]: what rebuilds a running instance's volume (resume, resize, refresh).

pub mod control;
pub mod frontend;
pub mod lock;
mod online;
pub mod reencrypting;
pub mod rekey;
pub mod runtime;
pub mod server;
pub mod start;
pub mod switch;
