//! # ucrypt-device: the decrypted volume as something to mount
//!
//! `ucrypt open DEV NAME` ends where `cryptsetup open` ends: with a device. This crate
//! attaches any [`Backend`] (in practice the engine's decrypting `Volume`) to one of the
//! kernel's userspace block-device front ends, or exposes it as a file:
//!
//! | front end | node | needs |
//! |---|---|---|
//! | `ublk` | `/dev/ublkbN` | root, `ublk_drv` (Linux ≥ 6.0), io_uring |
//! | `nbd` (kernel client) | `/dev/nbdN` | root, the `nbd` module |
//! | `fuse` | `DIR/NAME`, one regular file | `/dev/fuse` (no root) |
//!
//! Every front end implements [`Attachment`]; `ucrypt`'s instance code picks one with
//! [`FrontendKind`] and never needs to know which it got.

pub mod fuse;
pub mod nbd_kernel;
pub mod ublk;

use std::path::{Path, PathBuf};
use ucrypt_backend::Backend;

/// Which front end exposes the volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrontendKind {
    /// The ublk driver: `/dev/ublkbN`.
    Ublk,
    /// The kernel's NBD client: `/dev/nbdN`.
    Nbd,
    /// One file in a FUSE mount.
    Fuse,
    /// No local node: the NBD socket only.
    None,
}

impl FrontendKind {
    /// The name used on the command line and in status output.
    pub fn as_str(self) -> &'static str {
        match self {
            FrontendKind::Ublk => "ublk",
            FrontendKind::Nbd => "nbd",
            FrontendKind::Fuse => "fuse",
            FrontendKind::None => "none",
        }
    }
}

/// How to attach a volume.
#[derive(Debug, Clone)]
pub struct AttachOptions {
    /// Instance name (the FUSE file's name; shown in logs).
    pub name: String,
    /// Refuse writes.
    pub read_only: bool,
    /// Logical block size the device advertises: the volume's sector size (512..4096).
    pub logical_block: u32,
    /// Hardware queues (ublk: one per CPU).
    pub queues: u16,
    /// Requests in flight per queue.
    pub queue_depth: u16,
}

/// Why a front end could not attach or detach.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The front end is not available here (module missing, no permission).
    #[error("{frontend} is not available: {why}")]
    Unavailable {
        /// Front end name.
        frontend: &'static str,
        /// What is missing.
        why: String,
    },
    /// The device is held open (mounted, or opened by a process).
    #[error("{0} is in use")]
    Busy(PathBuf),
    /// A system call failed.
    #[error("{what}")]
    Io {
        /// The operation.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl DeviceError {
    /// An [`DeviceError::Io`] for `what`.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        DeviceError::Io {
            what: what.into(),
            source,
        }
    }
}

/// A volume attached to a front end. Dropping it without [`Attachment::detach`] leaves
/// the node in place where the front end supports recovery (ublk), and removes it
/// otherwise.
pub trait Attachment: Send {
    /// Which front end this is.
    fn kind(&self) -> FrontendKind;
    /// The node users open: `/dev/ublkb0`, `/dev/nbd0`, `/mnt/x/NAME`.
    fn node(&self) -> &Path;
    /// Whether anything holds the node open (a mount, a process): `close` refuses then.
    ///
    /// # Errors
    /// When the check itself fails.
    fn in_use(&self) -> Result<bool, DeviceError>;
    /// Flushes, detaches and removes the node; returns once it is gone.
    ///
    /// # Errors
    /// [`DeviceError::Busy`] is not returned here: callers check [`Attachment::in_use`]
    /// first when they want to refuse; detaching a busy device fails its users' I/O.
    fn detach(self: Box<Self>) -> Result<(), DeviceError>;
}

/// Whether a block device node is held open or mounted: an exclusive open (`O_EXCL`)
/// fails with `EBUSY` then (the kernel's own rule, which is what `cryptsetup close` sees).
///
/// # Errors
/// Other open failures.
pub fn block_device_in_use(node: &Path) -> Result<bool, DeviceError> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(node)
    {
        Ok(_) => Ok(false),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(true),
        Err(e) => Err(DeviceError::io(format!("opening {}", node.display()), e)),
    }
}

/// Re-exported so front ends and their callers name one trait.
pub type Export = std::sync::Arc<dyn Backend>;
