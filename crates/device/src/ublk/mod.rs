//! The ublk front end: the volume as `/dev/ublkbN`.
//!
//! The ublk driver (Linux ≥ 6.0, `ublk_drv`) forwards every block request of
//! `/dev/ublkbN` to this process through io_uring `URING_CMD`s on `/dev/ublkcN`: one
//! queue per CPU, one io_uring per queue thread, each tag a request slot with its own
//! buffer. The protocol (control commands, `FETCH_REQ`/`COMMIT_AND_FETCH_REQ`, parameters,
//! user recovery) is spoken by the `libublk` crate (ublk-org/libublk-rs, by the driver's
//! author), not by hand here: it is maintained next to the driver's changes and tested
//! against it, and this module only maps requests to [`Backend`] calls.
//!
//! ```text
//!  /dev/ublkbN ─ blk-mq ─ ublk_drv ─┬─ queue 0 thread: io_uring, one async task per tag ─┐
//!                                  └─ queue 1 thread: …                                 ├─► Backend
//!                                     (each task: request → Backend call → commit+fetch)─┘   (Volume)
//! ```
//!
//! ## Requests
//! | ublk op | Backend |
//! |---|---|
//! | `READ` | [`IoKind::Read`](ucrypt_backend::IoKind::Read) |
//! | `WRITE` (`FUA` flag) | [`IoKind::WriteOwned`](ucrypt_backend::IoKind::WriteOwned) with `fua` |
//! | `FLUSH` | [`Backend::flush`] |
//! | `DISCARD` | [`emulate::discard`] (advertised only when the backend supports it: dm-crypt's `allow_discards`) |
//! | `WRITE_ZEROES` | [`emulate::write_zeroes`] (the backend's own, or zero-filled writes when it has none) |
//!
//! The device's logical block size is the backend's (`logical_block`: the volume's
//! encryption sector size), so the kernel never sends a request smaller than a sector;
//! a volatile write cache and FUA are advertised when the backend can flush, so the
//! filesystem's flushes and FUA writes reach [`Backend::flush`] / `fua`.
//!
//! ## Where the backend runs
//! With [`UblkOptions::workers`] = 0 each request runs inline in its queue thread (one at a
//! time per queue: no hand-off, lowest latency). With N > 0, queue threads hand requests
//! to N worker threads and wait for them through an eventfd read on the queue's io_uring,
//! so a queue keeps up to its depth of requests in the backend at once (the way the NBD
//! server's per-connection workers do), which helps when one submitter drives one queue.
//! With [`UblkOptions::spill`] as well, a queue runs a request inline unless other requests
//! became ready beside it, and then keeps about `N / (N + 1)` of those at hand on the
//! workers and the rest inline: a lone request pays no hand-off, a burst of them uses
//! more than the queue's one CPU. That is the default ([`UblkOptions::default`]: one
//! worker per CPU but one, spilling).
//!
//! Each queue's thread runs on the CPUs blk-mq maps to that queue (libublk's placement),
//! unless [`UblkOptions::pin_queues`] is off: then on any CPU the process may. Pinned, a
//! single submitter (one `fio` job, one filesystem's writeback) and the thread serving it
//! take turns on one CPU; unpinned, the scheduler may run them side by side, at the price
//! of a cross-CPU wake-up per request. Neither won in every cell of the kernel lab
//! (BENCHMARKING.md, "Block devices in the kernel lab", 2026-12-03), so the default stays.
//!
//! With [`UblkOptions::poll`] a queue thread, after each round of requests, keeps entering
//! its ring without sleeping (which runs the driver's queued task work) for up to that long
//! before it waits the ordinary way: the next request finds it awake, with no wake-up and
//! no switch to pay, at the price of the CPU it spins on. `ucrypt open --ublk-poll USECS`
//! sets it with the queue threads unpinned and every request inline, the configuration
//! that won in the kernel lab (BENCHMARKING.md, runs 11-15: 4 KiB requests 1.45-2.35x the
//! kernel's dm-crypt with the null cipher, against 0.46-0.87x by default).
//!
//! ## User recovery
//! Devices are created with `UBLK_F_USER_RECOVERY | UBLK_F_USER_RECOVERY_REISSUE`. When the
//! server dies (even by `kill -9`), the driver quiesces the device instead of removing it:
//! `/dev/ublkbN` and the filesystem on it stay, I/O waits. [`recover`] (a new process,
//! same volume) reattaches with `START_USER_RECOVERY`/`END_USER_RECOVERY`; requests that
//! were in flight in the dead server are re-issued to the new one (REISSUE), which is safe
//! for block writes (they are idempotent) and means no acknowledged write is lost: a write
//! is acknowledged only after the backend's `write_at` returned, a flush only after the
//! backend's `flush` returned.

use crate::{block_device_in_use, AttachOptions, Attachment, DeviceError, Export, FrontendKind};
use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::helpers::IoBuf;
use libublk::io::{UblkDev, UblkQueue};
use libublk::{sys, BufDesc, UblkError, UblkFlags};
use std::cell::UnsafeCell;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use ucrypt_backend::{emulate, Backend, BackendError, Io, IoCtx, Support};

mod control;
mod queue;
#[cfg(test)]
mod tests;

pub use control::{
    all_orphans, available, find_waiting, orphans_of, query, remove, DeviceInfo, DeviceState,
};
use control::{ctrl_ring, instance_name};
use queue::{device_params, queue_main, Pool, Shared};

/// The control node whose presence means the driver is loaded.
pub const CONTROL: &str = "/dev/ublk-control";

/// The libublk target name of ucrypt's devices (stored in the device's JSON export, and
/// checked by [`recover`]).
const TARGET: &str = "ucrypt";

/// Largest request the device accepts (bytes): the kernel splits larger ones.
const IO_BUF_BYTES: u32 = 512 * 1024;

/// How long to wait for a new device to come up.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Options of the ublk front end beyond [`AttachOptions`].
#[derive(Debug, Clone)]
pub struct UblkOptions {
    /// Worker threads running backend calls off the queue threads (0: inline in each
    /// queue thread; see the module documentation).
    pub workers: usize,
    /// With `workers`: hand a request to them only when other requests are ready beside
    /// it (see the module documentation); without, every request goes to a worker.
    pub spill: bool,
    /// Create the device with user recovery: a dead server leaves the device quiesced for
    /// [`recover`] instead of removing it.
    pub user_recovery: bool,
    /// Keep each queue thread on its queue's CPUs (libublk's placement; the default).
    /// Off: the queue threads may run on any CPU this process may (see "Where the backend
    /// runs" in the module documentation).
    pub pin_queues: bool,
    /// After each round of requests, a queue thread keeps looking for the next one without
    /// sleeping for up to this long before it waits the ordinary way (hybrid polling: the
    /// next request finds the thread awake, at the price of that much CPU time per round).
    /// `None` (the default): always sleep. Useful only with `pin_queues` off: a pinned
    /// queue thread that polls keeps its own CPU from the submitter that shares it.
    pub poll: Option<Duration>,
}

impl Default for UblkOptions {
    fn default() -> Self {
        UblkOptions {
            // One worker per CPU but the queue's own, taking only bursts (`spill`): in the
            // kernel lab (BENCHMARKING.md, 2026-12-04) that kept inline's 4 KiB depth-1
            // latency and won 1.5-1.6x over it at depth 32; always handing off (`spill`
            // off) halved depth 1.
            workers: std::thread::available_parallelism().map_or(0, |n| n.get() - 1),
            spill: true,
            user_recovery: true,
            pin_queues: true,
            poll: None,
        }
    }
}

/// Creates `/dev/ublkbN` serving `export` and returns once the node exists and serves.
///
/// # Errors
/// [`DeviceError::Unavailable`] without the driver or permission, [`DeviceError::Io`] when
/// the driver refuses the device (message from the driver's errno).
pub fn attach(
    export: Export,
    opts: &AttachOptions,
    uopts: &UblkOptions,
) -> Result<UblkAttachment, DeviceError> {
    available()?;
    let ctrl = add(opts, uopts, -1).map_err(|e| ublk_err("adding a ublk device", e))?;
    start(ctrl, export, opts, uopts, false)
}

/// `ADD_DEV` of a device numbered `id` (-1: the driver's choice).
fn add(opts: &AttachOptions, uopts: &UblkOptions, id: i32) -> Result<UblkCtrl, UblkError> {
    let mut ctrl_flags = 0u64;
    if uopts.user_recovery {
        ctrl_flags |= u64::from(sys::UBLK_F_USER_RECOVERY | sys::UBLK_F_USER_RECOVERY_REISSUE);
    }
    UblkCtrlBuilder::default()
        .name(TARGET)
        .id(id)
        .nr_queues(opts.queues.max(1))
        .depth(opts.queue_depth.clamp(1, 4096))
        .io_buf_bytes(IO_BUF_BYTES)
        .ctrl_flags(ctrl_flags)
        .dev_flags(UblkFlags::UBLK_DEV_F_ADD_DEV)
        .build()
}

/// Reattaches a new server to device `dev_id`, whose server died (user recovery):
/// `/dev/ublkbN` and whatever is mounted on it continue.
///
/// # Errors
/// [`DeviceError::Unavailable`] when the device does not exist, is not waiting for
/// recovery (still served, or created without it), or does not match `export` (size or
/// logical block size differ: a different volume).
pub fn recover(
    export: Export,
    dev_id: u32,
    opts: &AttachOptions,
    uopts: &UblkOptions,
) -> Result<UblkAttachment, DeviceError> {
    let existing = query(dev_id)?;
    let refuse = |why: String| DeviceError::Unavailable {
        frontend: "ublk",
        why,
    };
    if existing.state != DeviceState::Quiesced {
        return Err(refuse(format!(
            "/dev/ublkb{dev_id} is not waiting for recovery (state {:?}{})",
            existing.state,
            if existing.state == DeviceState::Live {
                format!(", served by pid {}", existing.server_pid)
            } else {
                String::new()
            }
        )));
    }
    if let Some(owner) = instance_name(dev_id) {
        if owner != opts.name {
            return Err(refuse(format!(
                "/dev/ublkb{dev_id} belongs to instance {owner:?}, not {:?}",
                opts.name
            )));
        }
    }
    let info = export.info();
    if existing.size_bytes != info.size_bytes || existing.logical_block != opts.logical_block {
        return Err(refuse(format!(
            "/dev/ublkb{dev_id} has {} bytes in blocks of {}, this volume {} bytes in blocks of {}: \
             not the same volume",
            existing.size_bytes, existing.logical_block, info.size_bytes, opts.logical_block
        )));
    }
    let id =
        i32::try_from(dev_id).map_err(|_| refuse(format!("device id {dev_id} out of range")))?;
    let ctrl = UblkCtrlBuilder::default()
        .name(TARGET)
        .id(id)
        .nr_queues(opts.queues.max(1))
        .depth(opts.queue_depth.clamp(1, 4096))
        .io_buf_bytes(IO_BUF_BYTES)
        .dev_flags(UblkFlags::UBLK_DEV_F_RECOVER_DEV)
        .build()
        .map_err(|e| ublk_err(&format!("opening ublk device {dev_id} for recovery"), e))?;
    ctrl.start_user_recover()
        .map_err(|e| ublk_err(&format!("starting recovery of /dev/ublkb{dev_id}"), e))?;
    start(ctrl, export, opts, uopts, true)
}

/// Runs the device's server in a thread and waits until the device is live.
fn start(
    ctrl: UblkCtrl,
    export: Export,
    opts: &AttachOptions,
    uopts: &UblkOptions,
    recovering: bool,
) -> Result<UblkAttachment, DeviceError> {
    let ctrl = Arc::new(ctrl);
    let dev_id = ctrl.dev_info().dev_id;
    let pool = if uopts.workers > 0 {
        Some(Pool::start(uopts.workers, Arc::clone(&export))?)
    } else {
        None
    };
    let shared = Arc::new(Shared {
        export: Arc::clone(&export),
        pool: pool.as_ref().map(Pool::sender),
        spill: uopts.spill.then_some(uopts.workers),
        poll: uopts.poll,
        tids: Mutex::new(Vec::new()),
    });
    let params = device_params(&*export, opts);
    let logical_shift = params.basic.logical_bs_shift;
    let name = opts.name.clone();
    let unpin_to = if uopts.pin_queues {
        None
    } else {
        queue::allowed_cpus()
    };
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
    let server = {
        let ctrl = Arc::clone(&ctrl);
        let failed_tx = ready_tx.clone();
        std::thread::Builder::new()
            .name(format!("ublk-{dev_id}"))
            .spawn(move || {
                if let Err(e) = ctrl_ring() {
                    let _ = failed_tx.send(Err(describe(&e)));
                    return;
                }
                let tgt_init = move |dev: &mut UblkDev| {
                    dev.tgt.dev_size = params.basic.dev_sectors << 9;
                    dev.tgt.params = params;
                    dev.set_target_json(serde_json::json!({ "name": name }));
                    Ok(())
                };
                let q_shared = Arc::clone(&shared);
                let ready_shared = Arc::clone(&shared);
                let result = ctrl.run_target(
                    tgt_init,
                    move |qid, dev: &UblkDev| queue_main(qid, dev, &q_shared),
                    move |_ctrl: &UblkCtrl| {
                        if let Some(cpus) = &unpin_to {
                            let tids = ready_shared
                                .tids
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner);
                            queue::unpin_threads(&tids, cpus);
                        }
                        let _ = ready_tx.send(Ok(()));
                    },
                );
                if let Err(e) = result {
                    let _ = failed_tx.send(Err(describe(&e)));
                }
            })
            .map_err(|e| DeviceError::io("starting the ublk server thread", e))?
    };
    let what = if recovering {
        format!("recovering /dev/ublkb{dev_id}")
    } else {
        format!("starting /dev/ublkb{dev_id}")
    };
    match ready_rx.recv_timeout(START_TIMEOUT) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            let _ = server.join();
            return Err(DeviceError::io(what, std::io::Error::other(e)));
        }
        Err(_) => {
            let _ = ctrl.kill_dev();
            return Err(DeviceError::io(
                what,
                std::io::Error::new(std::io::ErrorKind::TimedOut, "the device did not start"),
            ));
        }
    }
    let node = PathBuf::from(format!("/dev/ublkb{dev_id}"));
    wait_for_node(&node)?;
    Ok(UblkAttachment {
        ctrl,
        node,
        dev_id,
        export,
        server: Some(server),
        pool,
        user_recovery: uopts.user_recovery || recovering,
        logical_shift,
        opts: opts.clone(),
        uopts: UblkOptions {
            user_recovery: uopts.user_recovery || recovering,
            ..uopts.clone()
        },
    })
}

/// Without udev (a minimal guest, a container) the block node may not appear by itself:
/// waits a moment for it, then creates it from sysfs's `dev` numbers.
fn wait_for_node(node: &Path) -> Result<(), DeviceError> {
    use std::os::unix::fs::FileTypeExt;
    for _ in 0..50 {
        if std::fs::metadata(node).is_ok_and(|m| m.file_type().is_block_device()) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let Some(base) = node.file_name().and_then(|n| n.to_str()) else {
        return Err(DeviceError::io(
            format!("{}", node.display()),
            std::io::Error::other("bad node name"),
        ));
    };
    let numbers = std::fs::read_to_string(format!("/sys/class/block/{base}/dev"))
        .map_err(|e| DeviceError::io(format!("reading /sys/class/block/{base}/dev"), e))?;
    let (major, minor) = numbers
        .trim()
        .split_once(':')
        .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)))
        .ok_or_else(|| {
            DeviceError::io(
                format!("/sys/class/block/{base}/dev"),
                std::io::Error::other(format!("unexpected contents {numbers:?}")),
            )
        })?;
    let path = std::ffi::CString::new(node.as_os_str().as_encoded_bytes())
        .map_err(|e| DeviceError::io(format!("{}", node.display()), std::io::Error::other(e)))?;
    // SAFETY: `path` is a valid NUL-terminated string; mknod only reads it.
    let rc = unsafe {
        libc::mknod(
            path.as_ptr(),
            libc::S_IFBLK | 0o660,
            libc::makedev(major, minor),
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(DeviceError::io(format!("creating {}", node.display()), e));
        }
    }
    Ok(())
}

fn describe(e: &UblkError) -> String {
    match e {
        UblkError::OtherError(n) | UblkError::UringIOError(n) if *n < 0 => {
            std::io::Error::from_raw_os_error(-n).to_string()
        }
        UblkError::IOError(io) => io.to_string(),
        other => other.to_string(),
    }
}

fn ublk_err(what: &str, e: UblkError) -> DeviceError {
    match e {
        UblkError::OtherError(n) | UblkError::UringIOError(n) if n < 0 => {
            DeviceError::io(what, std::io::Error::from_raw_os_error(-n))
        }
        UblkError::IOError(io) => DeviceError::io(what, io),
        other => DeviceError::io(what, std::io::Error::other(other.to_string())),
    }
}

/// A live `/dev/ublkbN`.
pub struct UblkAttachment {
    ctrl: Arc<UblkCtrl>,
    node: PathBuf,
    dev_id: u32,
    export: Export,
    server: Option<JoinHandle<()>>,
    pool: Option<Pool>,
    user_recovery: bool,
    /// log2 of the logical block size the device advertises.
    logical_shift: u8,
    /// What it was attached with ([`Attachment::reattach`] adds it again so).
    opts: AttachOptions,
    uopts: UblkOptions,
}

impl std::fmt::Debug for UblkAttachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UblkAttachment")
            .field("node", &self.node)
            .field("user_recovery", &self.user_recovery)
            .finish_non_exhaustive()
    }
}

impl UblkAttachment {
    /// The device number N of `/dev/ublkbN` (what [`recover`] takes).
    pub fn dev_id(&self) -> u32 {
        self.dev_id
    }

    /// Whether a dead server leaves the device waiting for [`recover`].
    pub fn user_recovery(&self) -> bool {
        self.user_recovery
    }

    fn shut_down(&mut self) -> Result<(), DeviceError> {
        ctrl_ring().map_err(|e| ublk_err("creating a ublk control ring", e))?;
        // STOP_DEV: the driver removes the disk (waiting for requests in flight, which
        // the queue threads still serve), then aborts the queues' fetches, so the queue
        // threads and `run_target` return.
        let stopped = self
            .ctrl
            .kill_dev()
            .map_err(|e| ublk_err(&format!("stopping {}", self.node.display()), e));
        if let Some(server) = self.server.take() {
            let _ = server.join();
        }
        let deleted = self
            .ctrl
            .del_dev()
            .map(|_| ())
            .map_err(|e| ublk_err(&format!("deleting {}", self.node.display()), e));
        if let Some(pool) = self.pool.take() {
            pool.stop();
        }
        let flushed = self.export.flush().map_err(|e| {
            DeviceError::io(
                format!("flushing the volume behind {}", self.node.display()),
                std::io::Error::other(e.to_string()),
            )
        });
        stopped.and(deleted).and(flushed)
    }
}

impl Attachment for UblkAttachment {
    fn kind(&self) -> FrontendKind {
        FrontendKind::Ublk
    }

    fn node(&self) -> &Path {
        &self.node
    }

    fn in_use(&self) -> Result<bool, DeviceError> {
        block_device_in_use(&self.node)
    }

    fn detach(mut self: Box<Self>) -> Result<(), DeviceError> {
        self.shut_down()
    }

    fn can_resize(&self) -> Result<(), DeviceError> {
        let features = self.ctrl.get_driver_features().unwrap_or(0);
        if features & u64::from(sys::UBLK_F_UPDATE_SIZE) == 0 {
            return Err(DeviceError::Unavailable {
                frontend: "ublk",
                why: format!(
                    "the ublk driver of this kernel cannot change the size of {} in place \
                     (UBLK_CMD_UPDATE_SIZE: Linux 6.16 or later)",
                    self.node.display()
                ),
            });
        }
        Ok(())
    }

    fn can_reattach(&self) -> bool {
        true
    }

    fn reattach(mut self: Box<Self>) -> Result<Box<dyn Attachment>, DeviceError> {
        let (export, opts, uopts) = (
            Arc::clone(&self.export),
            self.opts.clone(),
            self.uopts.clone(),
        );
        let id = i32::try_from(self.dev_id).unwrap_or(-1);
        self.shut_down()?;
        // The old control must not outlive the device: dropped undisowned, it would delete
        // whatever device has its number by then, the new one.
        self.ctrl.disown();
        drop(self);
        // DEL_DEV returned once the number was free; a concurrent `ADD_DEV` of another
        // server may still have taken it, and then any number does.
        let ctrl = add(&opts, &uopts, id)
            .or_else(|_| add(&opts, &uopts, -1))
            .map_err(|e| ublk_err("adding the ublk device again", e))?;
        Ok(Box::new(start(ctrl, export, &opts, &uopts, false)?))
    }

    fn resize(&self, size_bytes: u64) -> Result<(), DeviceError> {
        self.can_resize()?;
        ctrl_ring().map_err(|e| ublk_err("creating a ublk control ring", e))?;
        let shift = self.logical_shift;
        self.ctrl
            .update_size(size_bytes >> shift << shift)
            .map(|_| ())
            .map_err(|e| ublk_err(&format!("resizing {}", self.node.display()), e))
    }
}

impl Drop for UblkAttachment {
    fn drop(&mut self) {
        if self.server.is_none() {
            return; // detached
        }
        if self.user_recovery {
            // Leave the device for recovery: the server threads go on serving until the
            // process exits; then the driver quiesces the device for `recover`.
            self.ctrl.disown();
            return;
        }
        let _ = self.shut_down();
    }
}
