//! The VDUSE front end: the volume as a virtio-blk device of the host's own kernel
//! (`/dev/vdX`), served from this process through VDUSE (vDPA Device in Userspace,
//! `drivers/vdpa/vdpa_user`, Linux ≥ 5.15) and driven by `virtio_vdpa` + `virtio_blk`.
//!
//! The device is the vhost-user front end's: the same virtio-blk request handling, feature
//! bits and configuration space ([`crate::vhost_user::queue::Conn`],
//! [`crate::vhost_user::config::Geometry`]), on rings that live in VDUSE's IOVA domain
//! instead of a VM's memory. What differs is the transport:
//!
//! - the device is created on `/dev/vduse/control` (`VDUSE_CREATE_DEV`: virtio-blk, its
//!   features with `VIRTIO_F_ACCESS_PLATFORM`, its configuration space), its queues set up
//!   (`VDUSE_VQ_SETUP`), then put on the vDPA bus (`vdpa dev add ... mgmtdev vduse`, sent
//!   as its netlink message) where `virtio_vdpa` binds it and `virtio_blk` makes `/dev/vdX`;
//! - the kernel's control requests come as messages on `/dev/vduse/NAME`: status changes
//!   (`DRIVER_OK` starts the queues: their addresses from `VDUSE_VQ_GET_INFO`, a kick
//!   eventfd each with `VDUSE_VQ_SETUP_KICKFD`; a reset stops them), IOTLB invalidations;
//! - the driver's memory is what `VDUSE_IOTLB_GET_FD` hands out, mapped here: the bounce
//!   buffer the kernel copies requests' pages through, and the rings' coherent pages. It is
//!   enumerated again after an invalidation, and at a kick while the bounce buffer (which
//!   the kernel maps at the first request) is not yet there;
//! - used requests are signalled with `VDUSE_VQ_INJECT_IRQ`; a resize writes the capacity
//!   with `VDUSE_DEV_SET_CONFIG` and raises `VDUSE_DEV_INJECT_CONFIG_IRQ`.
//!
//! Root only, and the modules `vduse` (with `vdpa`) and `virtio_vdpa`; where one is
//! missing [`available`] says which. No recovery: a dead server's device stays until
//! `close` removes it (its I/O fails meanwhile).

mod sys;
mod vdpa;

use crate::vhost_user::config::CONFIG_LEN;
use crate::vhost_user::queue::{Conn, Memory, Shared};
use crate::vhost_user::relay::Session;
use crate::{AttachOptions, Attachment, DeviceError, Export, FrontendKind};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use vm_memory::{
    FileOffset, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend,
    GuestMemoryMmap, GuestRegionMmap, MmapRegion,
};
use vmm_sys_util::eventfd::{EventFd, EFD_CLOEXEC, EFD_NONBLOCK};

const CONTROL: &str = "/dev/vduse/control";

/// Descriptors per queue (virtio_blk's seg_max follows: 126 segments).
const QUEUE_SIZE: u16 = 128;

fn unavailable(why: impl Into<String>) -> DeviceError {
    DeviceError::Unavailable {
        frontend: "vduse",
        why: why.into(),
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Whether VDUSE can give a host block device here: root, `/dev/vduse/control` (the
/// `vduse` module) and the `virtio_vdpa` driver.
///
/// # Errors
/// [`DeviceError::Unavailable`] naming what is missing.
pub fn available() -> Result<(), DeviceError> {
    if !is_root() {
        return Err(unavailable(
            "needs root (VDUSE devices are created on /dev/vduse/control, root's only)",
        ));
    }
    if !Path::new(CONTROL).exists() {
        return Err(unavailable(format!(
            "no {CONTROL}: the vduse module is not loaded (modprobe vduse)"
        )));
    }
    if !Path::new("/sys/bus/vdpa/drivers/virtio_vdpa").exists() {
        return Err(unavailable(
            "the virtio_vdpa driver is not loaded (modprobe virtio_vdpa): without it a \
             VDUSE device gives no host block device",
        ));
    }
    Ok(())
}

/// The VDUSE (and vDPA) name of instance `name`'s device.
pub fn device_name(name: &str) -> String {
    format!("ucrypt-{name}")
}

/// The driver's memory and the queues started on it: one device life between a
/// `DRIVER_OK` and a reset.
struct Running {
    threads: Vec<QueueThread>,
}

/// One started queue.
struct QueueThread {
    q: u16,
    vring: Arc<VringRwLock<Memory>>,
    /// Written to stop the thread.
    stop: EventFd,
    thread: JoinHandle<()>,
}

/// What the control thread, the queue threads and the attachment share.
struct Device {
    /// `/dev/vduse/NAME`.
    dev: File,
    shared: Arc<Shared>,
    conn: Arc<Conn>,
    /// The driver's memory (IOVA space) as mapped here; replaced in place.
    mem: Memory,
    /// Serializes re-mapping.
    remap: Mutex<()>,
    running: Mutex<Option<Running>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Device {
    /// Maps every IOVA region the kernel has for the device now, in place of the old
    /// mappings (which requests still running keep until they finish).
    fn remap(&self) -> io::Result<()> {
        let _g = lock(&self.remap);
        let mut regions = Vec::new();
        let mut start = 0u64;
        loop {
            let mut e = sys::IotlbEntry {
                start,
                last: u64::MAX,
                ..Default::default()
            };
            // SAFETY: IOTLB_GET_FD reads and writes one `vduse_iotlb_entry`.
            let fd = match unsafe { sys::ioctl(&self.dev, sys::IOTLB_GET_FD, &mut e) } {
                Ok(fd) => fd,
                // No region at or after `start`.
                Err(err) if err.raw_os_error() == Some(libc::EINVAL) => break,
                Err(err) => return Err(err),
            };
            // SAFETY: the ioctl returned a new descriptor, ours to own.
            let file = unsafe { File::from_raw_fd(fd) };
            if e.last < e.start || e.start < start {
                return Err(io::Error::other(format!(
                    "an IOTLB entry out of order: {e:?}"
                )));
            }
            let len = usize::try_from(e.last - e.start + 1)
                .map_err(|_| io::Error::other("an IOTLB region too large to map"))?;
            let region = MmapRegion::from_file(FileOffset::new(file, e.offset), len)
                .map_err(io::Error::other)?;
            regions.push(
                GuestRegionMmap::new(region, GuestAddress(e.start))
                    .ok_or_else(|| io::Error::other("an IOTLB region past the address space"))?,
            );
            match e.last.checked_add(1) {
                Some(next) => start = next,
                None => break,
            }
        }
        let map = if regions.is_empty() {
            GuestMemoryMmap::new()
        } else {
            GuestMemoryMmap::from_regions(regions).map_err(io::Error::other)?
        };
        self.mem
            .lock()
            .map_err(|_| io::Error::other("the memory lock is poisoned"))?
            .replace(map);
        Ok(())
    }

    fn inject_irq(&self, q: u16) -> io::Result<()> {
        let mut index = u32::from(q);
        // SAFETY: VQ_INJECT_IRQ reads one u32.
        unsafe { sys::ioctl(&self.dev, sys::VQ_INJECT_IRQ, &mut index) }.map(drop)
    }

    fn set_kickfd(&self, q: u16, fd: i32) -> io::Result<()> {
        let mut e = sys::VqEventfd {
            index: u32::from(q),
            fd,
        };
        // SAFETY: VQ_SETUP_KICKFD reads one `vduse_vq_eventfd`.
        unsafe { sys::ioctl(&self.dev, sys::VQ_SETUP_KICKFD, &mut e) }.map(drop)
    }

    /// `DRIVER_OK`: the driver's memory mapped, each ready queue given a vring over it, a
    /// kick eventfd and a thread.
    fn start(self: &Arc<Device>) -> io::Result<()> {
        let mut running = lock(&self.running);
        if running.is_some() {
            return Ok(());
        }
        let mut features = 0u64;
        // SAFETY: DEV_GET_FEATURES writes one u64.
        unsafe { sys::ioctl(&self.dev, sys::DEV_GET_FEATURES, &mut features) }?;
        let event_idx = features & (1 << VIRTIO_RING_F_EVENT_IDX) != 0;
        self.conn.set_event_idx(event_idx);
        self.remap()?;
        self.conn.update_memory(self.mem.clone())?;
        let mut threads = Vec::new();
        for q in 0..self.shared.geometry.queues {
            let mut info = sys::VqInfo {
                index: u32::from(q),
                ..Default::default()
            };
            // SAFETY: VQ_GET_INFO reads and writes one `vduse_vq_info`.
            unsafe { sys::ioctl(&self.dev, sys::VQ_GET_INFO, &mut info) }?;
            if info.ready == 0 {
                continue; // a queue the driver does not use (fewer CPUs than queues)
            }
            let vring = VringRwLock::new(self.mem.clone(), QUEUE_SIZE).map_err(io::Error::other)?;
            vring.set_queue_size(
                u16::try_from(info.num).map_err(|_| io::Error::other("queue size"))?,
            );
            vring
                .set_queue_info(info.desc_addr, info.driver_addr, info.device_addr)
                .map_err(io::Error::other)?;
            vring.set_queue_event_idx(event_idx);
            vring.set_queue_next_avail(info.avail_index);
            vring.set_queue_next_used(info.avail_index);
            vring.set_queue_ready(true);
            vring.set_enabled(true);
            let vring = Arc::new(vring);
            let kick = EventFd::new(EFD_NONBLOCK | EFD_CLOEXEC)?;
            let stop = EventFd::new(EFD_NONBLOCK | EFD_CLOEXEC)?;
            self.set_kickfd(q, kick.as_raw_fd())?;
            let thread = {
                let (dev, vring) = (Arc::clone(self), Arc::clone(&vring));
                let stop = stop.try_clone()?;
                std::thread::Builder::new()
                    .name(format!("vduse-q{q}"))
                    .spawn(move || dev.serve_queue(q, &vring, &kick, &stop))?
            };
            threads.push(QueueThread {
                q,
                vring,
                stop,
                thread,
            });
        }
        *running = Some(Running { threads });
        Ok(())
    }

    /// A reset: the queue threads stopped (what they had taken is done), kick eventfds
    /// withdrawn, the mappings dropped, the volume flushed.
    fn stop(&self) {
        let Some(running) = lock(&self.running).take() else {
            return;
        };
        for t in running.threads {
            let _ = t.stop.write(1);
            let _ = t.thread.join();
            let _ = self.set_kickfd(t.q, -1);
        }
        if let Ok(g) = self.mem.lock() {
            g.replace(GuestMemoryMmap::new());
        }
        if let Err(e) = self.shared.export.flush() {
            eprintln!("ucrypt: vduse: flushing after the driver reset the device: {e}");
        }
    }

    /// One queue's thread: each kick runs what the driver queued.
    fn serve_queue(&self, q: u16, vring: &VringRwLock<Memory>, kick: &EventFd, stop: &EventFd) {
        loop {
            let mut fds = [
                libc::pollfd {
                    fd: kick.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: stop.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: two valid pollfds.
            let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if r < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                eprintln!(
                    "ucrypt: vduse: queue {q}: poll: {}",
                    io::Error::last_os_error()
                );
                return;
            }
            if fds[1].revents != 0 {
                return;
            }
            let _ = kick.read();
            // The bounce buffer appears at the driver's first request: map it then.
            if !self.mem.memory().address_in_range(GuestAddress(0)) {
                if let Err(e) = self.remap() {
                    eprintln!("ucrypt: vduse: mapping the driver's memory: {e}");
                }
            }
            let signal = || self.inject_irq(q);
            if let Err(e) = self.conn.process(vring, usize::from(q), &signal) {
                eprintln!("ucrypt: vduse: queue {q}: {e}");
            }
        }
    }

    /// The answer to one control message.
    fn answer(self: &Arc<Device>, req: &[u8; sys::MSG_LEN]) -> [u8; sys::MSG_LEN] {
        let word = |at: usize| u32::from_le_bytes([req[at], req[at + 1], req[at + 2], req[at + 3]]);
        let kind = word(0);
        let id = word(4);
        let mut resp = [0u8; sys::MSG_LEN];
        resp[0..4].copy_from_slice(&id.to_le_bytes());
        let u = sys::MSG_UNION;
        let result = match kind {
            sys::REQ_SET_STATUS => {
                let status = req[u];
                if status & sys::STATUS_DRIVER_OK != 0 {
                    match self.start() {
                        Ok(()) => sys::RESULT_OK,
                        Err(e) => {
                            eprintln!("ucrypt: vduse: starting the queues: {e}");
                            sys::RESULT_FAILED
                        }
                    }
                } else {
                    if status == 0 {
                        self.stop();
                    }
                    sys::RESULT_OK
                }
            }
            sys::REQ_GET_VQ_STATE => {
                let index = word(u);
                let avail = lock(&self.running)
                    .as_ref()
                    .and_then(|r| r.threads.iter().find(|t| u32::from(t.q) == index))
                    .map_or(0, |t| t.vring.queue_next_avail());
                resp[u..u + 4].copy_from_slice(&index.to_le_bytes());
                resp[u + 4..u + 6].copy_from_slice(&avail.to_le_bytes());
                sys::RESULT_OK
            }
            sys::REQ_UPDATE_IOTLB => match self.remap() {
                Ok(()) => sys::RESULT_OK,
                Err(e) => {
                    eprintln!("ucrypt: vduse: mapping the driver's memory: {e}");
                    sys::RESULT_FAILED
                }
            },
            _ => sys::RESULT_FAILED,
        };
        resp[4..8].copy_from_slice(&result.to_le_bytes());
        resp
    }

    /// The control thread: the kernel's messages answered until `stop` is written.
    fn control(self: &Arc<Device>, stop: &EventFd) {
        let mut dev = &self.dev;
        loop {
            let mut fds = [
                libc::pollfd {
                    fd: self.dev.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: stop.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: two valid pollfds.
            let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if r < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                eprintln!("ucrypt: vduse: poll: {}", io::Error::last_os_error());
                return;
            }
            if fds[1].revents != 0 {
                return;
            }
            if fds[0].revents & libc::POLLIN == 0 {
                if fds[0].revents & (libc::POLLERR | libc::POLLHUP) != 0 {
                    return;
                }
                continue;
            }
            let mut req = [0u8; sys::MSG_LEN];
            match dev.read(&mut req) {
                Ok(n) if n == sys::MSG_LEN => {}
                Ok(_) => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                    ) =>
                {
                    continue
                }
                Err(e) => {
                    eprintln!("ucrypt: vduse: reading the kernel's request: {e}");
                    return;
                }
            }
            let resp = self.answer(&req);
            if let Err(e) = dev.write_all(&resp) {
                eprintln!("ucrypt: vduse: answering the kernel: {e}");
            }
        }
    }
}

/// The volume as the host's `/dev/vdX`.
pub struct VduseAttachment {
    name: String,
    node: PathBuf,
    device: Option<Arc<Device>>,
    control_stop: EventFd,
    control_thread: Option<JoinHandle<()>>,
    control: File,
    export: Export,
    detached: bool,
}

impl std::fmt::Debug for VduseAttachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VduseAttachment")
            .field("name", &self.name)
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

fn destroy(control: &File, name: &str) -> io::Result<()> {
    let mut buf = [0u8; sys::NAME_MAX];
    let n = name.len().min(sys::NAME_MAX - 1);
    buf[..n].copy_from_slice(&name.as_bytes()[..n]);
    // SAFETY: DESTROY_DEV reads VDUSE_NAME_MAX bytes.
    unsafe { sys::ioctl(control, sys::DESTROY_DEV, buf.as_mut_ptr()) }.map(drop)
}

/// Waits up to `limit` for `f` to give something.
fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if t0.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The block device virtio_blk made for vDPA device `name`: `/sys/bus/vdpa/devices/NAME/
/// virtioN/block/vdX`.
fn block_of(name: &str) -> Option<String> {
    let dev = Path::new("/sys/bus/vdpa/devices").join(name);
    std::fs::read_dir(&dev).ok()?.flatten().find_map(|e| {
        let n = e.file_name().to_string_lossy().into_owned();
        if !n.starts_with("virtio") {
            return None;
        }
        std::fs::read_dir(e.path().join("block"))
            .ok()?
            .flatten()
            .next()
            .map(|b| b.file_name().to_string_lossy().into_owned())
    })
}

/// Creates the VDUSE device of `export` (named `ucrypt-NAME`), puts it on the vDPA bus and
/// returns once the host's `/dev/vdX` is there.
///
/// # Errors
/// [`DeviceError::Unavailable`] where VDUSE cannot work here (not root, a module missing,
/// the kernel refusing the device); [`DeviceError::Busy`] when a VDUSE device of that name
/// exists; [`DeviceError::Io`] otherwise.
pub fn attach(export: Export, opts: &AttachOptions) -> Result<Box<dyn Attachment>, DeviceError> {
    available()?;
    if opts.queues == 0 || opts.queues > 64 {
        return Err(unavailable(format!(
            "{} queues asked for; 1 to 64 are possible",
            opts.queues
        )));
    }
    if !matches!(opts.logical_block, 512 | 1024 | 2048 | 4096) {
        return Err(unavailable(format!(
            "a virtio-blk disk has a logical block of 512 to 4096 bytes, not {}",
            opts.logical_block
        )));
    }
    let name = device_name(&opts.name);
    if name.len() >= sys::NAME_MAX {
        return Err(unavailable(format!(
            "the name {name:?} is too long for VDUSE"
        )));
    }
    let control = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(CONTROL)
        .map_err(|e| DeviceError::io(format!("opening {CONTROL}"), e))?;
    let mut version = sys::API_VERSION;
    // SAFETY: SET_API_VERSION reads one u64.
    unsafe { sys::ioctl(&control, sys::SET_API_VERSION, &mut version) }
        .map_err(|e| DeviceError::io("VDUSE_SET_API_VERSION", e))?;

    let shared = Arc::new(Shared::new(Arc::clone(&export), opts, QUEUE_SIZE));
    let geometry = shared.geometry;
    let mut cfg = sys::DevConfig {
        name: [0; sys::NAME_MAX],
        vendor_id: 0,
        device_id: sys::VIRTIO_ID_BLOCK,
        features: geometry.virtio_features() | 1 << sys::VIRTIO_F_ACCESS_PLATFORM,
        vq_num: u32::from(geometry.queues),
        vq_align: 4096,
        reserved: [0; 13],
        config_size: CONFIG_LEN as u32,
    };
    cfg.name[..name.len()].copy_from_slice(name.as_bytes());
    let mut buf = vec![0u8; std::mem::size_of::<sys::DevConfig>() + CONFIG_LEN];
    // SAFETY: `buf` is larger than a DevConfig, which is plain data (repr(C), no padding
    // that matters: the buffer was zeroed).
    unsafe { std::ptr::write_unaligned(buf.as_mut_ptr().cast::<sys::DevConfig>(), cfg) };
    buf[std::mem::size_of::<sys::DevConfig>()..]
        .copy_from_slice(&shared.config(0, CONFIG_LEN as u32));
    // SAFETY: CREATE_DEV reads a `vduse_dev_config` and `config_size` bytes after it.
    if let Err(e) = unsafe { sys::ioctl(&control, sys::CREATE_DEV, buf.as_mut_ptr()) } {
        return Err(match e.raw_os_error() {
            Some(libc::EEXIST) => DeviceError::Busy(PathBuf::from(format!("/dev/vduse/{name}"))),
            Some(libc::EPERM) => unavailable(format!("VDUSE_CREATE_DEV: {e} (needs root)")),
            Some(libc::EINVAL) => unavailable(format!(
                "the kernel refused the virtio-blk device (VDUSE_CREATE_DEV: {e})"
            )),
            _ => DeviceError::io("VDUSE_CREATE_DEV", e),
        });
    }
    let undo = |control: &File| {
        let _ = destroy(control, &name);
    };
    let devpath = PathBuf::from(format!("/dev/vduse/{name}"));
    let dev = match wait_for(Duration::from_secs(10), || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&devpath)
            .ok()
    }) {
        Some(f) => f,
        None => {
            undo(&control);
            return Err(DeviceError::io(
                format!("opening {}", devpath.display()),
                io::Error::from(io::ErrorKind::NotFound),
            ));
        }
    };
    for q in 0..geometry.queues {
        let mut vq = sys::VqConfig {
            index: u32::from(q),
            max_size: QUEUE_SIZE,
            reserved: [0; 13],
        };
        // SAFETY: VQ_SETUP reads one `vduse_vq_config`.
        if let Err(e) = unsafe { sys::ioctl(&dev, sys::VQ_SETUP, &mut vq) } {
            drop(dev);
            undo(&control);
            return Err(DeviceError::io("VDUSE_VQ_SETUP", e));
        }
    }
    let conn = Arc::new(Conn::new(Arc::clone(&shared), Arc::new(Session::default())));
    let device = Arc::new(Device {
        dev,
        shared,
        conn,
        mem: GuestMemoryAtomic::new(GuestMemoryMmap::new()),
        remap: Mutex::new(()),
        running: Mutex::new(None),
    });
    let control_stop =
        EventFd::new(EFD_NONBLOCK | EFD_CLOEXEC).map_err(|e| DeviceError::io("eventfd", e))?;
    let control_thread = {
        let device = Arc::clone(&device);
        let stop = control_stop
            .try_clone()
            .map_err(|e| DeviceError::io("eventfd", e))?;
        std::thread::Builder::new()
            .name("vduse".into())
            .spawn(move || device.control(&stop))
            .map_err(|e| DeviceError::io("starting the VDUSE thread", e))?
    };
    let mut at = VduseAttachment {
        name: name.clone(),
        node: PathBuf::new(),
        device: Some(device),
        control_stop,
        control_thread: Some(control_thread),
        control,
        export,
        detached: false,
    };
    // From here on, dropping `at` undoes everything.
    vdpa::add(&name)?;
    vdpa::bind_virtio(&name)?;
    let block = wait_for(Duration::from_secs(60), || block_of(&name)).ok_or_else(|| {
        DeviceError::io(
            format!("vDPA device {name} gave no block device"),
            io::Error::from(io::ErrorKind::TimedOut),
        )
    })?;
    at.node = PathBuf::from(format!("/dev/{block}"));
    if wait_for(Duration::from_secs(10), || at.node.exists().then_some(())).is_none() {
        return Err(DeviceError::io(
            format!("{} did not appear", at.node.display()),
            io::Error::from(io::ErrorKind::NotFound),
        ));
    }
    Ok(Box::new(at))
}

impl VduseAttachment {
    /// Takes the device off the vDPA bus (the driver resets it: queues stopped), stops the
    /// control thread and destroys the VDUSE device. Idempotent.
    fn teardown(&mut self) -> Result<(), DeviceError> {
        if self.detached {
            return Ok(());
        }
        self.detached = true;
        let mut first_err = None;
        if vdpa::exists(&self.name) {
            if let Err(e) = vdpa::del(&self.name) {
                first_err = Some(e);
            }
        }
        let _ = self.control_stop.write(1);
        if let Some(t) = self.control_thread.take() {
            let _ = t.join();
        }
        if let Some(d) = self.device.take() {
            d.stop();
            // The last reference: the device's file closes here, as VDUSE_DESTROY_DEV
            // requires.
            drop(d);
        }
        if let Err(e) = destroy(&self.control, &self.name) {
            if e.raw_os_error() != Some(libc::EINVAL) && first_err.is_none() {
                first_err = Some(DeviceError::io(
                    format!("destroying VDUSE device {}", self.name),
                    e,
                ));
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Attachment for VduseAttachment {
    fn kind(&self) -> FrontendKind {
        FrontendKind::Vduse
    }

    fn node(&self) -> &Path {
        &self.node
    }

    fn in_use(&self) -> Result<bool, DeviceError> {
        crate::block_device_in_use(&self.node)
    }

    fn detach(mut self: Box<Self>) -> Result<(), DeviceError> {
        self.teardown()?;
        self.export.flush().map_err(|e| {
            DeviceError::io("flushing the volume", std::io::Error::other(e.to_string()))
        })
    }

    fn can_resize(&self) -> Result<(), DeviceError> {
        Ok(())
    }

    /// The new capacity written into the configuration space and a configuration
    /// interrupt raised: virtio_blk reads it and resizes `/dev/vdX`.
    fn resize(&self, size_bytes: u64) -> Result<(), DeviceError> {
        let Some(d) = &self.device else {
            return Ok(());
        };
        d.shared.capacity.store(size_bytes, Ordering::Release);
        // `struct vduse_config_data` (offset, length) and the 8 capacity bytes at 0.
        let mut buf = [0u8; 16];
        buf[4..8].copy_from_slice(&8u32.to_le_bytes());
        buf[8..16].copy_from_slice(&(size_bytes / 512).to_le_bytes());
        // SAFETY: DEV_SET_CONFIG reads a `vduse_config_data` and `length` bytes after it.
        unsafe { sys::ioctl(&d.dev, sys::DEV_SET_CONFIG, buf.as_mut_ptr()) }
            .map_err(|e| DeviceError::io("VDUSE_DEV_SET_CONFIG", e))?;
        // SAFETY: DEV_INJECT_CONFIG_IRQ takes no argument.
        unsafe {
            sys::ioctl(
                &d.dev,
                sys::DEV_INJECT_CONFIG_IRQ,
                std::ptr::null_mut::<u8>(),
            )
        }
        .map_err(|e| DeviceError::io("VDUSE_DEV_INJECT_CONFIG_IRQ", e))?;
        Ok(())
    }
}

impl Drop for VduseAttachment {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("ucrypt: vduse: {e}");
        }
    }
}

/// The VDUSE devices of instances whose server died: `ucrypt-NAME` devices whose
/// `/dev/vduse/` node no process holds open (a live server holds its own), with the
/// instance name and the node to show: `/dev/vdX` while on the vDPA bus.
pub fn orphans() -> Vec<(String, PathBuf)> {
    use std::os::unix::fs::MetadataExt;
    let Ok(dir) = std::fs::read_dir("/dev/vduse") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let dev = e.file_name().to_string_lossy().into_owned();
            let name = dev.strip_prefix("ucrypt-")?.to_string();
            let rdev = std::fs::metadata(e.path()).ok()?.rdev();
            if crate::device_open_anywhere(rdev, false, None) {
                return None;
            }
            let node = block_of(&dev).map_or(e.path(), |b| PathBuf::from(format!("/dev/{b}")));
            Some((name, node))
        })
        .collect()
}

/// Removes an orphan [`orphans`] found at `node` (`/dev/vdX` or `/dev/vduse/ucrypt-NAME`):
/// its vDPA device (`/dev/vdX` goes; its users' I/O fails) and its VDUSE device.
///
/// # Errors
/// The kernel refused.
pub fn remove_orphan(node: &Path) -> Result<(), DeviceError> {
    let base = node
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dev = if node.starts_with("/dev/vduse") {
        base
    } else {
        // /sys/class/block/vdX/device is virtioN, whose parent is the vDPA device.
        std::fs::canonicalize(Path::new("/sys/class/block").join(&base).join("device"))
            .ok()
            .and_then(|p| {
                p.parent()
                    .and_then(|d| d.file_name())
                    .map(|n| n.to_string_lossy().into_owned())
            })
            .ok_or_else(|| {
                DeviceError::io(
                    format!("finding the vDPA device of {}", node.display()),
                    io::Error::from(io::ErrorKind::NotFound),
                )
            })?
    };
    if vdpa::exists(&dev) {
        vdpa::del(&dev)?;
    }
    let control = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(CONTROL)
        .map_err(|e| DeviceError::io(format!("opening {CONTROL}"), e))?;
    match destroy(&control, &dev) {
        Err(e) if e.raw_os_error() != Some(libc::EINVAL) => {
            Err(DeviceError::io(format!("destroying VDUSE device {dev}"), e))
        }
        _ => Ok(()),
    }
}
