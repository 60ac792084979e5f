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
//! | `READ` | [`Backend::read_at_ctx`] |
//! | `WRITE` (`FUA` flag) | [`Backend::write_at_ctx`] with `fua` |
//! | `FLUSH` | [`Backend::flush`] |
//! | `DISCARD` | [`Backend::discard`] (advertised only when the backend supports it: dm-crypt's `allow_discards`) |
//! | `WRITE_ZEROES` | [`Backend::write_zeroes`] (or zero-filled writes when the backend has none) |
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
use ucrypt_backend::{emulate, Backend, BackendError, IoCtx, Support};

/// The control node whose presence means the driver is loaded.
pub const CONTROL: &str = "/dev/ublk-control";

/// The libublk target name of ucrypt's devices (stored in the device's JSON export, and
/// checked by [`recover`]).
const TARGET: &str = "ucrypt";

/// Largest request the device accepts (bytes): the kernel splits larger ones.
const IO_BUF_BYTES: u32 = 512 * 1024;

/// How long to wait for a new device to come up.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// libublk sends control commands through a per-thread io_uring, created by the thread
/// that builds a `UblkCtrl`; any other thread that uses the same control (the server
/// thread, whoever detaches) needs its own ring first.
fn ctrl_ring() -> Result<(), UblkError> {
    libublk::ublk_init_ctrl_task_ring(|ring| {
        if ring.is_none() {
            *ring = Some(
                io_uring::IoUring::<io_uring::squeue::Entry128>::builder()
                    .build(16)
                    .map_err(UblkError::IOError)?,
            );
        }
        Ok(())
    })
}

/// Options of the ublk front end beyond [`AttachOptions`].
#[derive(Debug, Clone)]
pub struct UblkOptions {
    /// Worker threads running backend calls off the queue threads (0: inline in each
    /// queue thread; see the module documentation).
    pub workers: usize,
    /// Create the device with user recovery: a dead server leaves the device quiesced for
    /// [`recover`] instead of removing it.
    pub user_recovery: bool,
}

impl Default for UblkOptions {
    fn default() -> Self {
        UblkOptions {
            workers: 0,
            user_recovery: true,
        }
    }
}

/// Whether this kernel has the ublk driver loaded (`/dev/ublk-control` exists).
///
/// # Errors
/// [`DeviceError::Unavailable`] naming what is missing.
pub fn available() -> Result<(), DeviceError> {
    if Path::new(CONTROL).exists() {
        Ok(())
    } else {
        Err(DeviceError::Unavailable {
            frontend: "ublk",
            why: format!("{CONTROL} does not exist (modprobe ublk_drv; Linux 6.0 or later)"),
        })
    }
}

/// The state of an existing ublk device, as the driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceState {
    /// Added, not started (or stopped).
    Dead,
    /// Served.
    Live,
    /// Its server died; waiting for [`recover`].
    Quiesced,
    /// Its server died and the device fails I/O.
    FailIo,
    /// A state this code does not know.
    Other(u16),
}

/// What [`query`] reports about an existing ublk device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device number (`/dev/ublkbN`).
    pub dev_id: u32,
    /// Driver state.
    pub state: DeviceState,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Logical block size.
    pub logical_block: u32,
    /// Pid of the server that started it.
    pub server_pid: i32,
}

/// Asks the driver about device `dev_id`.
///
/// # Errors
/// The device does not exist, or the driver refuses.
pub fn query(dev_id: u32) -> Result<DeviceInfo, DeviceError> {
    available()?;
    let id = i32::try_from(dev_id).map_err(|_| DeviceError::Unavailable {
        frontend: "ublk",
        why: format!("device id {dev_id} out of range"),
    })?;
    ctrl_ring().map_err(|e| ublk_err("creating a ublk control ring", e))?;
    let ctrl =
        UblkCtrl::new_simple(id).map_err(|e| ublk_err(&format!("ublk device {dev_id}"), e))?;
    let info = ctrl.dev_info();
    let mut params = sys::ublk_params {
        len: std::mem::size_of::<sys::ublk_params>() as u32,
        types: sys::UBLK_PARAM_TYPE_BASIC,
        ..Default::default()
    };
    ctrl.get_params(&mut params).map_err(|e| {
        ublk_err(
            &format!("reading the parameters of ublk device {dev_id}"),
            e,
        )
    })?;
    let state = match u32::from(info.state) {
        sys::UBLK_S_DEV_DEAD => DeviceState::Dead,
        sys::UBLK_S_DEV_LIVE => DeviceState::Live,
        sys::UBLK_S_DEV_QUIESCED => DeviceState::Quiesced,
        sys::UBLK_S_DEV_FAIL_IO => DeviceState::FailIo,
        _ => DeviceState::Other(info.state),
    };
    // The controlling handle must not delete the device when dropped: it was not added here.
    ctrl.disown();
    Ok(DeviceInfo {
        dev_id,
        state,
        size_bytes: params.basic.dev_sectors << 9,
        logical_block: 1u32 << params.basic.logical_bs_shift.min(31),
        server_pid: info.ublksrv_pid,
    })
}

/// The instance name a ucrypt ublk device was created for (kept by libublk in
/// `/run/ublksrvd/N.json`), if any.
fn instance_name(dev_id: u32) -> Option<String> {
    let ctrl = UblkCtrl::new_simple(i32::try_from(dev_id).ok()?).ok()?;
    let name = ctrl
        .get_target_data_from_json()
        .and_then(|v| v.get("name").and_then(|n| n.as_str()).map(str::to_string));
    ctrl.disown();
    name
}

/// The ublk devices that exist (numbers N of `/dev/ublkcN`), from sysfs.
fn device_ids() -> Vec<u32> {
    let mut ids: Vec<u32> = std::fs::read_dir("/sys/class/ublk-char")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("ublkc"))
                .and_then(|n| n.parse().ok())
        })
        .collect();
    ids.sort_unstable();
    ids
}

/// The instance name in the JSON libublk exported for device `dev_id`
/// (`/run/ublksrvd/NNNN.json`, kept until the device is deleted), read as a file: no
/// control command, so it can run before `ucrypt open` forks.
fn exported_name(dev_id: u32) -> Option<String> {
    let path = format!("{}/{dev_id:04}.json", UblkCtrl::run_dir());
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v.get("target_data")?
        .get("name")?
        .as_str()
        .map(str::to_string)
}

/// Whether some process has `/dev/ublkc{dev_id}` open: a live server always does.
fn served(dev_id: u32) -> bool {
    let Ok(numbers) = std::fs::read_to_string(format!("/sys/class/ublk-char/ublkc{dev_id}/dev"))
    else {
        return false;
    };
    let Some((major, minor)) = numbers
        .trim()
        .split_once(':')
        .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)))
    else {
        return false;
    };
    crate::device_open_anywhere(libc::makedev(major, minor), false, None)
}

/// The ublk devices of instance `name` that no server serves (what a server killed with
/// `-9` leaves: quiesced, its I/O held for [`recover`]). Files only: sysfs, the exported
/// JSON, `/proc`.
pub fn orphans_of(name: &str) -> Vec<u32> {
    device_ids()
        .into_iter()
        .filter(|&id| exported_name(id).as_deref() == Some(name) && !served(id))
        .collect()
}

/// Stops and deletes device `dev_id`, whose server is gone: its held I/O fails. The
/// deletion does not wait for the last opener (a filesystem still mounted on it).
///
/// # Errors
/// The driver refused.
pub fn remove(dev_id: u32) -> Result<(), DeviceError> {
    available()?;
    let id = i32::try_from(dev_id).map_err(|_| DeviceError::Unavailable {
        frontend: "ublk",
        why: format!("device id {dev_id} out of range"),
    })?;
    ctrl_ring().map_err(|e| ublk_err("creating a ublk control ring", e))?;
    let ctrl =
        UblkCtrl::new_simple(id).map_err(|e| ublk_err(&format!("ublk device {dev_id}"), e))?;
    let stopped = ctrl
        .kill_dev()
        .map(|_| ())
        .map_err(|e| ublk_err(&format!("stopping /dev/ublkb{dev_id}"), e));
    let deleted = ctrl
        .del_dev_async()
        .or_else(|_| ctrl.del_dev())
        .map(|_| ())
        .map_err(|e| ublk_err(&format!("deleting /dev/ublkb{dev_id}"), e));
    ctrl.disown();
    stopped.and(deleted)
}

/// The device of instance `name` whose server died and which waits for [`recover`]
/// (`ucrypt open --recover NAME` finds it by name: no state of the dead server needed).
///
/// # Errors
/// [`DeviceError::Unavailable`] without the driver.
pub fn find_waiting(name: &str) -> Result<Option<u32>, DeviceError> {
    available()?;
    Ok(device_ids().into_iter().find(|&id| {
        query(id).is_ok_and(|i| i.state == DeviceState::Quiesced)
            && instance_name(id).as_deref() == Some(name)
    }))
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
    let mut ctrl_flags = 0u64;
    if uopts.user_recovery {
        ctrl_flags |= u64::from(sys::UBLK_F_USER_RECOVERY | sys::UBLK_F_USER_RECOVERY_REISSUE);
    }
    let ctrl = UblkCtrlBuilder::default()
        .name(TARGET)
        .id(-1)
        .nr_queues(opts.queues.max(1))
        .depth(opts.queue_depth.clamp(1, 4096))
        .io_buf_bytes(IO_BUF_BYTES)
        .ctrl_flags(ctrl_flags)
        .dev_flags(UblkFlags::UBLK_DEV_F_ADD_DEV)
        .build()
        .map_err(|e| ublk_err("adding a ublk device", e))?;
    start(ctrl, export, opts, uopts, false)
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
    });
    let params = device_params(&*export, opts);
    let logical_shift = params.basic.logical_bs_shift;
    let name = opts.name.clone();
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
                let result = ctrl.run_target(
                    tgt_init,
                    move |qid, dev: &UblkDev| queue_main(qid, dev, &q_shared),
                    move |_ctrl: &UblkCtrl| {
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

/// The parameters the device advertises, from the backend's geometry and capabilities.
fn device_params(export: &dyn Backend, opts: &AttachOptions) -> sys::ublk_params {
    let info = export.info();
    let shift = |v: u32| -> u8 {
        // Powers of two in 512..=64 KiB for block sizes; anything else falls back to 512.
        let v = v.max(512);
        if v.is_power_of_two() {
            v.trailing_zeros().min(16) as u8
        } else {
            9
        }
    };
    let logical = opts.logical_block.max(info.logical_block);
    let logical_shift = shift(logical);
    let physical_shift = shift(info.physical_block).max(logical_shift);
    let opt_shift = shift(info.optimal_block).max(physical_shift);
    let mut attrs = 0;
    if info.caps.flush != Support::None {
        attrs |= sys::UBLK_ATTR_VOLATILE_CACHE | sys::UBLK_ATTR_FUA;
    }
    let read_only = opts.read_only || info.caps.read_only;
    if read_only {
        attrs |= sys::UBLK_ATTR_READ_ONLY;
    }
    let mut params = sys::ublk_params {
        len: std::mem::size_of::<sys::ublk_params>() as u32,
        types: sys::UBLK_PARAM_TYPE_BASIC,
        basic: sys::ublk_param_basic {
            attrs,
            logical_bs_shift: logical_shift,
            physical_bs_shift: physical_shift,
            io_opt_shift: opt_shift,
            io_min_shift: physical_shift,
            max_sectors: IO_BUF_BYTES >> 9,
            // The kernel rounds nothing: a size that is not whole logical blocks would
            // expose a partial last block, so it is cut to whole blocks.
            dev_sectors: (info.size_bytes >> logical_shift << logical_shift) >> 9,
            ..Default::default()
        },
        ..Default::default()
    };
    if !read_only {
        let discard = info.caps.discard != Support::None;
        params.types |= sys::UBLK_PARAM_TYPE_DISCARD;
        params.discard = sys::ublk_param_discard {
            discard_alignment: 0,
            discard_granularity: 1u32 << physical_shift,
            max_discard_sectors: if discard { u32::MAX >> 9 } else { 0 },
            // Zeroes are always available: written as (encrypted) data when the backend
            // has no native write-zeroes.
            max_write_zeroes_sectors: u32::MAX >> 9,
            max_discard_segments: 1,
            reserved0: 0,
        };
    }
    params
}

/// What every queue thread shares.
struct Shared {
    export: Export,
    pool: Option<mpsc::Sender<Job>>,
}

/// One tag's buffers: the request data and the eventfd the workers complete it through.
/// Shared (`Arc`) with the worker running the request, so the memory stays valid even if
/// the queue's task is dropped while a worker still writes into it.
struct Slot {
    buf: IoBuf<u8>,
    /// Where the eventfd read lands (the kernel writes it during the read SQE).
    counter: UnsafeCell<u64>,
    done: OwnedFd,
    result: AtomicI32,
}

// SAFETY: `buf` is only touched by one party at a time: the queue task before handing the
// slot to a worker and after the worker signalled `done`, the worker in between (the
// task awaits the eventfd and does nothing else with the slot). `counter` is written only
// by the kernel for the task's read SQE and read by nobody. `done` and `result` are
// thread-safe by themselves.
unsafe impl Sync for Slot {}
// SAFETY: as above; every field is either Send or only accessed under that hand-off.
unsafe impl Send for Slot {}

impl Slot {
    fn new(bytes: usize) -> Result<Self, UblkError> {
        // SAFETY: plain syscall without pointers.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(UblkError::IOError(std::io::Error::last_os_error()));
        }
        Ok(Slot {
            buf: IoBuf::new(bytes),
            counter: UnsafeCell::new(0),
            // SAFETY: `fd` was just returned by eventfd and is owned by nobody else.
            done: unsafe { OwnedFd::from_raw_fd(fd) },
            result: AtomicI32::new(0),
        })
    }

    /// The whole buffer, writable.
    ///
    /// # Safety
    /// Only the party that currently owns the slot (see the `Sync` impl) may call it, and
    /// only one such slice may be alive at a time.
    #[allow(clippy::mut_from_ref)]
    unsafe fn data(&self) -> &mut [u8] {
        let s = self.buf.as_slice();
        // SAFETY: IoBuf owns `s.len()` bytes at this address for its whole life; the
        // caller guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(s.as_ptr().cast_mut(), s.len()) }
    }
}

/// A request decoded from the driver's descriptor.
#[derive(Debug, Clone, Copy)]
struct Request {
    op: u32,
    fua: bool,
    offset: u64,
    len: u64,
    client: u32,
}

/// A request handed to a worker.
struct Job {
    req: Request,
    slot: Arc<Slot>,
}

/// Worker threads that run backend calls for the queue threads.
struct Pool {
    tx: Option<mpsc::Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl Pool {
    fn start(n: usize, export: Export) -> Result<Self, DeviceError> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let rx = Arc::clone(&rx);
            let export = Arc::clone(&export);
            let t = std::thread::Builder::new()
                .name(format!("ublk-worker-{i}"))
                .spawn(move || loop {
                    let job = {
                        let guard = rx.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                        guard.recv()
                    };
                    let Ok(job) = job else { break };
                    // SAFETY: the slot was handed over with the job; the queue task does
                    // not touch its buffer until `done` is signalled below.
                    let data = unsafe { job.slot.data() };
                    let res = execute(&*export, job.req, data);
                    job.slot.result.store(res, Ordering::Release);
                    let one: u64 = 1;
                    // SAFETY: writes 8 bytes from a live u64 to an eventfd we own.
                    let _ = unsafe {
                        libc::write(
                            job.slot.done.as_raw_fd(),
                            (&raw const one).cast(),
                            std::mem::size_of::<u64>(),
                        )
                    };
                })
                .map_err(|e| DeviceError::io("starting a ublk worker thread", e))?;
            threads.push(t);
        }
        Ok(Pool {
            tx: Some(tx),
            threads,
        })
    }

    fn sender(&self) -> mpsc::Sender<Job> {
        self.tx.clone().expect("the pool's sender lives until stop")
    }

    fn stop(mut self) {
        self.tx = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One queue's thread: an async task per tag on a local executor, driven by the queue's
/// io_uring (libublk's pattern, see its `examples/loop.rs`).
fn queue_main(qid: u16, dev: &UblkDev, shared: &Arc<Shared>) {
    let q = match UblkQueue::new(qid, dev) {
        Ok(q) => Rc::new(q),
        Err(e) => {
            eprintln!("ucrypt: ublk queue {qid}: {}", describe(&e));
            return;
        }
    };
    let exe_rc = Rc::new(smol::LocalExecutor::new());
    let exe = Rc::clone(&exe_rc);
    let buf_bytes = dev.dev_info.max_io_buf_bytes as usize;
    let mut tasks = Vec::new();
    for tag in q.tags() {
        let q = Rc::clone(&q);
        let shared = Arc::clone(shared);
        tasks.push(exe.spawn(async move {
            match io_task(&q, tag, &shared, buf_bytes).await {
                Ok(()) | Err(UblkError::QueueIsDown) => {}
                Err(e) => eprintln!("ucrypt: ublk queue {qid} tag {tag}: {}", describe(&e)),
            }
        }));
    }
    smol::block_on(exe_rc.run(async move {
        let run_ops = || while exe.try_tick() {};
        let done = || tasks.iter().all(|t| t.is_finished());
        if let Err(e) = libublk::wait_and_handle_io_events(&q, Some(20), run_ops, done).await {
            eprintln!("ucrypt: ublk queue {qid}: {}", describe(&e));
        }
    }));
}

/// One tag: fetch a request, run it, commit the result and fetch the next, until the
/// queue goes down.
async fn io_task(
    q: &UblkQueue<'_>,
    tag: u16,
    shared: &Shared,
    buf_bytes: usize,
) -> Result<(), UblkError> {
    let slot = Arc::new(Slot::new(buf_bytes)?);
    q.submit_io_prep_cmd(tag, BufDesc::Slice(slot.buf.as_slice()), 0, Some(&slot.buf))
        .await?;
    let client = u32::from(q.get_qid()) + 1;
    loop {
        let iod = *q.get_iod(tag);
        let req = Request {
            op: iod.op_flags & 0xff,
            fua: iod.op_flags & sys::UBLK_IO_F_FUA != 0,
            offset: iod.start_sector << 9,
            len: u64::from(iod.nr_sectors) << 9,
            client,
        };
        let res = match &shared.pool {
            None => {
                // SAFETY: no worker holds this slot (inline mode): the task owns it.
                let data = unsafe { slot.data() };
                execute(&*shared.export, req, data)
            }
            Some(tx) => offload(tx, req, &slot, shared).await,
        };
        q.submit_io_commit_cmd(tag, BufDesc::Slice(slot.buf.as_slice()), res)
            .await?;
    }
}

/// Hands `req` to a worker and waits (without blocking the queue thread) for its eventfd.
async fn offload(tx: &mpsc::Sender<Job>, req: Request, slot: &Arc<Slot>, shared: &Shared) -> i32 {
    let job = Job {
        req,
        slot: Arc::clone(slot),
    };
    if tx.send(job).is_err() {
        // The pool is gone (shutting down): run it here.
        // SAFETY: the job was not taken by any worker (send failed), so the task owns it.
        let data = unsafe { slot.data() };
        return execute(&*shared.export, req, data);
    }
    let sqe = io_uring::opcode::Read::new(
        io_uring::types::Fd(slot.done.as_raw_fd()),
        slot.counter.get().cast::<u8>(),
        std::mem::size_of::<u64>() as u32,
    )
    .build();
    loop {
        match libublk::uring_async::ublk_submit_sqe_async(
            sqe.clone(),
            libublk::UblkUringData::Target as u64,
        )
        .await
        {
            Ok(n) if n == std::mem::size_of::<u64>() as i32 => break,
            Ok(n) if n == -libc::EINTR || n == -libc::EAGAIN => continue,
            // The eventfd read failed (it cannot, short of a kernel bug): the worker may
            // still be running, so wait for it the blocking way rather than reuse the slot.
            _ => {
                let mut v: u64 = 0;
                // SAFETY: reads 8 bytes into a live u64 from an eventfd we own.
                let _ = unsafe {
                    libc::read(
                        slot.done.as_raw_fd(),
                        (&raw mut v).cast(),
                        std::mem::size_of::<u64>(),
                    )
                };
                break;
            }
        }
    }
    slot.result.load(Ordering::Acquire)
}

/// Runs one request on the backend; returns what the driver expects: bytes for reads and
/// writes, 0 for the others, `-errno` on failure.
fn execute(export: &dyn Backend, req: Request, data: &mut [u8]) -> i32 {
    let size = export.info().size_bytes;
    let ctx = IoCtx { client: req.client };
    let in_range = req
        .offset
        .checked_add(req.len)
        .is_some_and(|end| end <= size);
    let result: Result<i32, BackendError> = match req.op {
        sys::UBLK_IO_OP_READ | sys::UBLK_IO_OP_WRITE => {
            let Ok(len) = usize::try_from(req.len) else {
                return -libc::EINVAL;
            };
            if len > data.len() || !in_range {
                return -libc::EINVAL;
            }
            let buf = &mut data[..len];
            if req.op == sys::UBLK_IO_OP_READ {
                export.read_at_ctx(buf, req.offset, ctx)
            } else {
                // The I/O buffer is ours until the commit, and the kernel copies a write's
                // data into it afresh at every dispatch: the volume encrypts in place.
                export.write_in_place_ctx(buf, req.offset, req.fua, ctx)
            }
            .map(|()| len as i32)
        }
        sys::UBLK_IO_OP_FLUSH => export.flush().map(|()| 0),
        sys::UBLK_IO_OP_DISCARD if in_range => {
            emulate::discard(export, req.offset, req.len, req.fua).map(|()| 0)
        }
        sys::UBLK_IO_OP_WRITE_ZEROES if in_range => {
            emulate::write_zeroes(export, req.offset, req.len, req.fua, ctx).map(|()| 0)
        }
        sys::UBLK_IO_OP_DISCARD | sys::UBLK_IO_OP_WRITE_ZEROES => return -libc::EINVAL,
        _ => return -libc::EOPNOTSUPP,
    };
    match result {
        Ok(n) => n,
        Err(e) => -e.errno().max(1),
    }
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
                    "the ublk driver of this kernel cannot change the size of {} \
                     (UBLK_CMD_UPDATE_SIZE: Linux 6.16 or later); close the instance and \
                     open it again to serve the new size",
                    self.node.display()
                ),
            });
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use ucrypt_backend::{BackendInfo, Caps, MemoryBackend};

    fn opts(logical_block: u32, read_only: bool) -> AttachOptions {
        AttachOptions {
            name: "t".into(),
            read_only,
            logical_block,
            queues: 1,
            queue_depth: 4,
        }
    }

    fn req(op: u32, offset: u64, len: u64) -> Request {
        Request {
            op,
            fua: false,
            offset,
            len,
            client: 1,
        }
    }

    /// A backend that records which operations reached it, over a memory backend.
    struct Recorder {
        inner: MemoryBackend,
        info: BackendInfo,
        calls: Mutex<Vec<String>>,
    }

    impl Recorder {
        fn new(size: u64, discard: Support, write_zeroes: Support) -> Self {
            let inner = MemoryBackend::new(size).expect("memory backend");
            let mut info = inner.info().clone();
            info.logical_block = 4096;
            info.caps = Caps {
                flush: Support::Native,
                discard,
                write_zeroes,
                read_only: false,
            };
            Recorder {
                inner,
                info,
                calls: Mutex::new(Vec::new()),
            }
        }
        fn log(&self, s: String) {
            self.calls.lock().expect("lock").push(s);
        }
    }

    impl Backend for Recorder {
        fn info(&self) -> &BackendInfo {
            &self.info
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), BackendError> {
            self.log(format!("read {offset} {}", buf.len()));
            self.inner.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<(), BackendError> {
            self.log(format!("write {offset} {} fua={fua}", buf.len()));
            self.inner.write_at(buf, offset, fua)
        }
        fn flush(&self) -> Result<(), BackendError> {
            self.log("flush".into());
            Ok(())
        }
        fn discard(&self, offset: u64, len: u64) -> Result<(), BackendError> {
            self.log(format!("discard {offset} {len}"));
            Ok(())
        }
        fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), BackendError> {
            self.log(format!("zeroes {offset} {len} fua={fua}"));
            Ok(())
        }
    }

    #[test]
    fn params_follow_the_volume() {
        let b = Recorder::new(1 << 20, Support::None, Support::Emulate);
        let p = device_params(&b, &opts(4096, false));
        assert_eq!(p.basic.logical_bs_shift, 12, "logical block = sector size");
        assert_eq!(p.basic.dev_sectors, (1 << 20) >> 9);
        assert_ne!(
            p.basic.attrs & sys::UBLK_ATTR_VOLATILE_CACHE,
            0,
            "flush reaches us"
        );
        assert_ne!(p.basic.attrs & sys::UBLK_ATTR_FUA, 0);
        assert_eq!(p.basic.attrs & sys::UBLK_ATTR_READ_ONLY, 0);
        assert_eq!(
            p.discard.max_discard_sectors, 0,
            "no discard without allow_discards"
        );
        assert_ne!(p.discard.max_write_zeroes_sectors, 0);
        assert_eq!(p.discard.max_discard_segments, 1, "the driver wants 1");

        let b = Recorder::new(1 << 20, Support::Native, Support::Native);
        let p = device_params(&b, &opts(512, true));
        assert_eq!(
            p.basic.logical_bs_shift, 12,
            "never below the backend's block"
        );
        assert_ne!(p.basic.attrs & sys::UBLK_ATTR_READ_ONLY, 0);
        assert_eq!(
            p.types & sys::UBLK_PARAM_TYPE_DISCARD,
            0,
            "read-only: no discard"
        );
    }

    #[test]
    fn requests_map_to_backend_calls() {
        let b = Recorder::new(1 << 20, Support::Native, Support::Native);
        let mut buf = vec![0x5au8; 64 * 1024];
        assert_eq!(
            execute(&b, req(sys::UBLK_IO_OP_WRITE, 8192, 4096), &mut buf),
            4096
        );
        let mut fua = req(sys::UBLK_IO_OP_WRITE, 0, 4096);
        fua.fua = true;
        assert_eq!(execute(&b, fua, &mut buf), 4096);
        buf.fill(0);
        assert_eq!(
            execute(&b, req(sys::UBLK_IO_OP_READ, 8192, 4096), &mut buf),
            4096
        );
        assert!(
            buf[..4096].iter().all(|&x| x == 0x5a),
            "read back what was written"
        );
        assert_eq!(execute(&b, req(sys::UBLK_IO_OP_FLUSH, 0, 0), &mut buf), 0);
        assert_eq!(
            execute(&b, req(sys::UBLK_IO_OP_DISCARD, 0, 8192), &mut buf),
            0
        );
        assert_eq!(
            execute(&b, req(sys::UBLK_IO_OP_WRITE_ZEROES, 4096, 4096), &mut buf,),
            0
        );
        let calls = b.calls.lock().expect("lock").clone();
        assert_eq!(
            calls,
            [
                "write 8192 4096 fua=false",
                "write 0 4096 fua=true",
                "read 8192 4096",
                "flush",
                "discard 0 8192",
                "zeroes 4096 4096 fua=false"
            ]
        );
    }

    #[test]
    fn bad_requests_are_refused_not_served() {
        let b = Recorder::new(1 << 20, Support::Native, Support::Native);
        let mut buf = vec![0u8; 8192];
        // Past the end, larger than the buffer, overflowing, unknown op.
        assert_eq!(
            execute(&b, req(sys::UBLK_IO_OP_READ, 1 << 20, 4096), &mut buf,),
            -libc::EINVAL
        );
        assert_eq!(
            execute(&b, req(sys::UBLK_IO_OP_WRITE, 0, 16384), &mut buf),
            -libc::EINVAL
        );
        assert_eq!(
            execute(
                &b,
                req(sys::UBLK_IO_OP_DISCARD, u64::MAX - 10, 4096),
                &mut buf,
            ),
            -libc::EINVAL
        );
        assert_eq!(
            execute(&b, req(sys::UBLK_IO_OP_ZONE_OPEN, 0, 4096), &mut buf),
            -libc::EOPNOTSUPP
        );
        assert!(
            b.calls.lock().expect("lock").is_empty(),
            "nothing reached the backend"
        );
        // A backend error comes back as its errno.
        let ro = MemoryBackend::new(1 << 20).expect("memory");
        let ro = ucrypt_backend::FaultyBackend::new(Arc::new(ro));
        ro.fail_writes_in(0..4096);
        let res = execute(&ro, req(sys::UBLK_IO_OP_WRITE, 0, 4096), &mut buf);
        assert!(res < 0, "a failed write is not acknowledged: {res}");
    }

    #[test]
    fn write_zeroes_without_backend_support_writes_zeroes() {
        let b = Recorder::new(1 << 20, Support::None, Support::None);
        let mut buf = vec![0x77u8; 8192];
        b.inner.write_at(&[0xffu8; 20480], 0, false).expect("fill");
        let mut r = req(sys::UBLK_IO_OP_WRITE_ZEROES, 0, 20480);
        r.fua = true;
        assert_eq!(execute(&b, r, &mut buf), 0);
        let mut back = vec![1u8; 20480];
        b.inner.read_at(&mut back, 0).expect("read");
        assert!(back.iter().all(|&x| x == 0));
        let calls = b.calls.lock().expect("lock").clone();
        assert_eq!(
            calls,
            ["write 0 20480 fua=false", "flush"],
            "zero-filled writes (backend::emulate), FUA as one flush after them"
        );
    }
}
