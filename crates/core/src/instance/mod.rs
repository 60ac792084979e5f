//! Named instances: what `ucrypt open DEV NAME` leaves running, and how the other commands
//! find it.
//!
//! - [`runtime`]: the runtime directory (`/run/ucrypt/NAME/`), liveness, stale cleanup.
//! - [`lock`]: exclusive access to the image (OFD locks, `O_EXCL` on block devices).
//! - [`control`]: the control socket's protocol.
//! - [`frontend`]: choosing and attaching ublk, kernel NBD, FUSE or none.
//! - [`switch`]: the suspendable, replaceable backend every front end serves.
//! - [`reencrypting`]: what an instance serves while it re-encrypts itself (online).

pub mod control;
pub mod frontend;
pub mod lock;
pub mod reencrypting;
pub mod runtime;
pub mod switch;
