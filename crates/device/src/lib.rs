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
//! | `vhost-user` | a unix socket a VM attaches as a virtio-blk disk | nothing (no root) |
//! | `vduse` | `/dev/vdX` (virtio-blk through `virtio_vdpa`) | root, `vduse`, `virtio_vdpa` |
//!
//! Every front end implements [`Attachment`]; `ucrypt`'s instance code picks one with
//! [`FrontendKind`] and never needs to know which it got.

pub mod fuse;
pub mod nbd_kernel;
pub mod ublk;
pub mod vduse;
pub mod vhost_user;

use std::os::unix::fs::{FileTypeExt, MetadataExt};
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
    /// A vhost-user-blk socket for a VM.
    VhostUser,
    /// The host's own virtio-blk device through VDUSE: `/dev/vdX`.
    Vduse,
    /// No local node: the NBD socket only.
    None,
}

impl FrontendKind {
    /// Every kind, in the order the command line lists them.
    pub const ALL: [FrontendKind; 6] = [
        FrontendKind::Ublk,
        FrontendKind::Nbd,
        FrontendKind::Fuse,
        FrontendKind::VhostUser,
        FrontendKind::Vduse,
        FrontendKind::None,
    ];

    /// The kind named `name` ([`FrontendKind::as_str`]'s inverse): the one place a front
    /// end's name is read.
    pub fn from_name(name: &str) -> Option<FrontendKind> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// The name used on the command line and in status output.
    pub const fn as_str(self) -> &'static str {
        match self {
            FrontendKind::Ublk => "ublk",
            FrontendKind::Nbd => "nbd",
            FrontendKind::Fuse => "fuse",
            FrontendKind::VhostUser => "vhost-user",
            FrontendKind::Vduse => "vduse",
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
    /// Hardware queues (ublk, vhost-user: one per CPU by default).
    pub queues: u16,
    /// Requests in flight per queue.
    pub queue_depth: u16,
    /// vhost-user and VDUSE: threads per VM connection that run a queue's requests beside
    /// its own thread, so that a queue keeps up to 32 requests in flight (0: one at a time
    /// on the queue's thread). The other front ends ignore it.
    pub workers: usize,
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
    /// Whether [`Attachment::resize`] can work here (asked before the volume changes, so
    /// that a front end that cannot follow refuses the resize instead of keeping its
    /// old size).
    ///
    /// # Errors
    /// [`DeviceError::Unavailable`] saying why not.
    fn can_resize(&self) -> Result<(), DeviceError>;
    /// Makes the node show the volume's new size, `size_bytes`.
    ///
    /// # Errors
    /// The driver refused.
    fn resize(&self, size_bytes: u64) -> Result<(), DeviceError>;
    /// Whether a front end that cannot change its size in place ([`Attachment::can_resize`]
    /// refuses) can take a new size by [`Attachment::reattach`]: the node removed and
    /// added again, which only a node nobody uses survives.
    fn can_reattach(&self) -> bool {
        false
    }
    /// Removes the node and adds it again (the same number where the driver allows), at
    /// the export's size now. The caller checked that nothing uses the node: a user that
    /// opened it meanwhile sees it go away.
    ///
    /// # Errors
    /// The driver refused; the node is then gone.
    fn reattach(self: Box<Self>) -> Result<Box<dyn Attachment>, DeviceError> {
        Err(DeviceError::Unavailable {
            frontend: self.kind().as_str(),
            why: "this front end cannot be added again".into(),
        })
    }
}

/// A kernel device (or a vhost-user socket) left by an instance whose server died.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    /// ublk, nbd, vhost-user or vduse.
    pub kind: FrontendKind,
    /// `/dev/ublkbN`, `/dev/nbdN`, the vhost-user socket.
    pub node: PathBuf,
    /// What happens to its I/O.
    pub state: &'static str,
}

/// The kernel devices instance `name` left when its server died (ublk devices waiting for
/// recovery, kernel NBD devices still configured). Reads sysfs, `/run/ublksrvd` and
/// `/proc` only: it runs in `ucrypt open` before the fork.
pub fn orphans_of(name: &str) -> Vec<Orphan> {
    let mut found: Vec<Orphan> = ublk::orphans_of(name)
        .into_iter()
        .map(ublk_orphan)
        .collect();
    found.extend(nbd_kernel::orphans_of(name).into_iter().map(nbd_orphan));
    found.extend(
        vduse::orphans()
            .into_iter()
            .filter(|(n, _)| n == name)
            .map(|(_, node)| vduse_orphan(node)),
    );
    found
}

/// Every kernel device a ucrypt instance left when its server died, with the instance
/// name the device carries (ublk: the target data libublk exports in `/run/ublksrvd`;
/// kernel NBD: the backend identifier in sysfs), whatever runtime directory it was in.
pub fn all_orphans() -> Vec<(String, Orphan)> {
    let mut found: Vec<(String, Orphan)> = ublk::all_orphans()
        .into_iter()
        .map(|(name, id)| (name, ublk_orphan(id)))
        .collect();
    found.extend(
        nbd_kernel::all_orphans()
            .into_iter()
            .map(|(name, i)| (name, nbd_orphan(i))),
    );
    found.extend(
        vduse::orphans()
            .into_iter()
            .map(|(name, node)| (name, vduse_orphan(node))),
    );
    found
}

fn vduse_orphan(node: PathBuf) -> Orphan {
    Orphan {
        kind: FrontendKind::Vduse,
        node,
        state: "its server is gone: its I/O waits until close removes it",
    }
}

fn ublk_orphan(id: u32) -> Orphan {
    Orphan {
        kind: FrontendKind::Ublk,
        node: PathBuf::from(format!("/dev/ublkb{id}")),
        state: "waiting for a new server: its I/O is held",
    }
}

fn nbd_orphan(i: u32) -> Orphan {
    Orphan {
        kind: FrontendKind::Nbd,
        node: PathBuf::from(format!("/dev/nbd{i}")),
        state: "its connections are dead: I/O waits, then fails after the dead-connection timeout",
    }
}

/// Removes a device [`orphans_of`] found (ublk: stopped and deleted; kernel NBD:
/// disconnected). Its users' I/O fails from then on: callers check
/// [`block_device_in_use`] first.
///
/// # Errors
/// The driver refused.
pub fn remove_orphan(o: &Orphan) -> Result<(), DeviceError> {
    let number = |prefix: &str| -> Result<u32, DeviceError> {
        o.node
            .to_str()
            .and_then(|n| n.strip_prefix(prefix))
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| {
                DeviceError::io(
                    o.node.display().to_string(),
                    std::io::Error::other("not a device node of this front end"),
                )
            })
    };
    match o.kind {
        FrontendKind::Ublk => ublk::remove(number("/dev/ublkb")?),
        FrontendKind::Nbd => nbd_kernel::disconnect(number("/dev/nbd")?),
        FrontendKind::Vduse => vduse::remove_orphan(&o.node),
        FrontendKind::VhostUser => match std::fs::remove_file(&o.node) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(DeviceError::io(o.node.display().to_string(), e))
            }
            _ => Ok(()),
        },
        _ => Ok(()),
    }
}

/// Whether a process has the character or block device `rdev` open (`want_block`: a
/// block device), by `/proc/PID/fd`. `except` is left out (this process, say).
pub(crate) fn device_open_anywhere(rdev: u64, want_block: bool, except: Option<u32>) -> bool {
    let except = except.map(|p| p.to_string());
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return false;
    };
    procs.flatten().any(|p| {
        let pid = p.file_name();
        let pid = pid.to_string_lossy();
        if !pid.bytes().all(|b| b.is_ascii_digit()) || except.as_deref() == Some(&*pid) {
            return false;
        }
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            return false; // gone, or not ours to look at
        };
        fds.flatten().any(|fd| {
            std::fs::metadata(fd.path()).is_ok_and(|m| {
                let t = m.file_type();
                (if want_block {
                    t.is_block_device()
                } else {
                    t.is_char_device()
                }) && m.rdev() == rdev
            })
        })
    })
}

/// Whether a block device node is held open or mounted, as `cryptsetup close` asks the
/// kernel for a mapping's open count: mounted or held exclusively (an `O_EXCL` open fails
/// with `EBUSY`), stacked under another device (`/sys/block/X/holders/`), backing a loop
/// device, or simply open in some process (`dd`, a VM, a shell's redirection: found in
/// `/proc/PID/fd`, as fuser(1) finds them; our own descriptors do not count). A holder only
/// seen by the descriptor scan must still be there 200 ms later: udev's probes open new
/// devices for a moment.
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
        Ok(_) => {}
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return Ok(true),
        Err(e) => return Err(DeviceError::io(format!("opening {}", node.display()), e)),
    }
    let rdev = std::fs::metadata(node)
        .map_err(|e| DeviceError::io(format!("inspecting {}", node.display()), e))?
        .rdev();
    if held_in_sysfs(node, rdev) {
        return Ok(true);
    }
    for attempt in 0..3 {
        if !open_in_a_process(rdev) {
            return Ok(false);
        }
        if attempt < 2 {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
    Ok(true)
}

/// Another block device stacked on `node` (device-mapper, md: `holders/`), or a loop
/// device whose backing file it is.
fn held_in_sysfs(node: &Path, rdev: u64) -> bool {
    let name = node.file_name().map(|n| n.to_string_lossy().into_owned());
    if let Some(name) = &name {
        let holders = Path::new("/sys/class/block").join(name).join("holders");
        if std::fs::read_dir(holders).is_ok_and(|mut d| d.next().is_some()) {
            return true;
        }
    }
    let Ok(loops) = std::fs::read_dir("/sys/block") else {
        return false;
    };
    loops.flatten().any(|e| {
        let backing = e.path().join("loop/backing_file");
        std::fs::read_to_string(backing).is_ok_and(|b| {
            std::fs::metadata(b.trim())
                .is_ok_and(|m| m.file_type().is_block_device() && m.rdev() == rdev)
        })
    })
}

/// Whether a process other than this one has the block device `rdev` open.
fn open_in_a_process(rdev: u64) -> bool {
    device_open_anywhere(rdev, true, Some(std::process::id()))
}

/// Re-exported so front ends and their callers name one trait.
pub type Export = std::sync::Arc<dyn Backend>;

#[cfg(test)]
mod tests {
    use super::block_device_in_use;
    use std::process::Command;

    /// A loop device (the host has them; the test needs root to make one): free, then held
    /// open by another process without O_EXCL (`sleep` with it on its standard input, as
    /// `dd` or a VM would hold a ublk device), then stacked under a second loop device.
    #[test]
    fn a_block_device_open_in_another_process_is_in_use() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let img = tmp.path().join("img");
        std::fs::File::create(&img)
            .and_then(|f| f.set_len(1 << 20))
            .expect("image");
        // Not root, or no loop devices (the only way to a block device here): skipped,
        // except under CI, which runs as root on a machine with loop devices.
        let skip = |why: String| {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
            eprintln!("skipped: {why}");
        };
        let out = match Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&img)
            .output()
        {
            Ok(out) if out.status.success() => out,
            Ok(out) => return skip(format!("losetup: {}", String::from_utf8_lossy(&out.stderr))),
            Err(e) => return skip(format!("losetup: {e}")),
        };
        let node = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let detach = |n: &str| {
            let _ = Command::new("losetup").args(["-d", n]).status();
        };
        // udev's probe of the new device (blkid) holds it open for a moment: let it end.
        let _ = Command::new("udevadm")
            .args(["settle", "--timeout=10"])
            .stderr(std::process::Stdio::null())
            .status();
        let free = block_device_in_use(node.as_ref());
        let holder = Command::new("sh")
            .args(["-c", &format!("exec sleep 30 < {node}")])
            .spawn();
        let mut holder = holder.expect("sleep");
        // The redirection is opened by the shell before exec: wait until it is there.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let fd0 = format!("/proc/{}/fd/0", holder.id());
        while std::fs::read_link(&fd0).map_or(true, |l| l.to_string_lossy() != node)
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let held = block_device_in_use(node.as_ref());
        let _ = holder.kill();
        let _ = holder.wait();
        let released = block_device_in_use(node.as_ref());
        let stacked = Command::new("losetup")
            .args(["-f", "--show", &node])
            .output()
            .expect("losetup");
        let upper = String::from_utf8_lossy(&stacked.stdout).trim().to_string();
        let under_loop = block_device_in_use(node.as_ref());
        if !upper.is_empty() {
            detach(&upper);
        }
        detach(&node);
        assert!(!free.expect("free"), "a fresh loop device");
        assert!(held.expect("held"), "open in another process");
        assert!(!released.expect("released"), "after that process ended");
        assert!(stacked.status.success(), "{stacked:?}");
        assert!(under_loop.expect("stacked"), "backing another loop device");
    }
}
