//! The vhost-user-blk front end: the volume served to a VM (QEMU, cloud-hypervisor) over a
//! unix socket, the guest's `virtio-blk` disk with the data moving through the VM's shared
//! memory. No kernel block device and no root: the plaintext never meets the host's block
//! layer.
//!
//! Built on the rust-vmm crates cloud-hypervisor and virtiofsd use: `vhost` (the protocol),
//! `vhost-user-backend` (the daemon, one epoll thread per queue), `virtio-queue` (the rings)
//! and `vm-memory` (the VM's memory, mapped from the file descriptors the VM sends: a
//! memfd or hugetlbfs backend with `share=on`). The VM connects as the client; one VM at a
//! time is served, and after it disconnects (shut down, rebooted into a new QEMU) the
//! socket accepts the next. The node users see is the socket.
//!
//! The VM's control connection passes through a relay (`relay.rs`) that answers what the
//! library cannot: inflight I/O tracking (`inflight.rs`), so that a server killed under a
//! running VM is replaced (`open --recover` on the same socket, QEMU's chardev
//! `reconnect=N`) with the requests it had in flight run again; and the configuration-change
//! message that tells a connected VM of a resize.
//!
//! What the guest gets: `VIRTIO_BLK_F_MQ` with the queues asked for, flush, write-zeroes,
//! discard where the volume has `allow_discards`, read-only (`VIRTIO_BLK_F_RO`), the
//! volume's sector size as the logical block size, `GET_ID` answering the instance name.

pub(crate) mod config;
mod inflight;
pub(crate) mod queue;
pub(crate) mod relay;

use crate::{AttachOptions, Attachment, DeviceError, Export, FrontendKind};
use queue::{Conn, Memory, Shared};
use relay::Session;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use vhost_user_backend::{ShutdownHandle, VhostUserDaemon};
use vm_memory::GuestMemoryMmap;

/// What the accept thread and the attachment share.
struct Control {
    /// Detaching: accept no further VM.
    stop: bool,
    /// The connected VM's connection, to cut it on a forced close.
    current: Option<ShutdownHandle>,
    /// The connected VM's session, to tell it of a resize.
    session: Option<Arc<Session>>,
}

/// The volume served on a vhost-user socket.
pub struct VhostUserAttachment {
    socket: PathBuf,
    shared: Arc<Shared>,
    export: Export,
    control: Arc<Mutex<Control>>,
    connected: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for VhostUserAttachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VhostUserAttachment")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

/// The front end works wherever unix sockets do: nothing to check.
pub fn available() -> Result<(), DeviceError> {
    Ok(())
}

fn unavailable(why: String) -> DeviceError {
    DeviceError::Unavailable {
        frontend: "vhost-user",
        why,
    }
}

/// Listens on `socket` (mode 0600) and serves `export` to the VM that connects there, one
/// VM at a time, with `opts.queues` queues (1..=64). Returns once the socket exists: a VM
/// may be started from then on.
///
/// # Errors
/// [`DeviceError::Busy`] when a server already answers on `socket`;
/// [`DeviceError::Unavailable`] when `socket` exists and is not a socket, or the options
/// are out of range; [`DeviceError::Io`] when the socket cannot be made.
pub fn attach(
    export: Export,
    socket: &Path,
    opts: &AttachOptions,
) -> Result<Box<dyn Attachment>, DeviceError> {
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
    let listener = bind(socket)?;
    // seg_max follows the queue size: QEMU's queues are 128 descriptors unless told
    // otherwise.
    let shared = Arc::new(Shared::new(Arc::clone(&export), opts, 128));
    let control = Arc::new(Mutex::new(Control {
        stop: false,
        current: None,
        session: None,
    }));
    let connected = Arc::new(AtomicBool::new(false));
    let thread = {
        let shared = Arc::clone(&shared);
        let (control, connected) = (Arc::clone(&control), Arc::clone(&connected));
        let name = opts.name.clone();
        std::thread::Builder::new()
            .name("vhost-user".into())
            .spawn(move || accept_loop(listener, &shared, &control, &connected, &name))
            .map_err(|e| DeviceError::io("starting the vhost-user thread", e))?
    };
    Ok(Box::new(VhostUserAttachment {
        socket: socket.to_path_buf(),
        shared,
        export,
        control,
        connected,
        thread: Some(thread),
    }))
}

/// Binds `socket`, replacing a stale one (no server answers) but never a live socket or a
/// file of another kind.
fn bind(socket: &Path) -> Result<UnixListener, DeviceError> {
    let what = || format!("binding {}", socket.display());
    match std::fs::symlink_metadata(socket) {
        Ok(md) if !md.file_type().is_socket() => {
            return Err(unavailable(format!(
                "{} exists and is not a socket",
                socket.display()
            )))
        }
        Ok(_) => {
            if UnixStream::connect(socket).is_ok() {
                return Err(DeviceError::Busy(socket.to_path_buf()));
            }
            std::fs::remove_file(socket).map_err(|e| DeviceError::io(what(), e))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(DeviceError::io(what(), e)),
    }
    // Whoever connects gets the plaintext: the owner only, and nobody in the moment
    // between bind and chmod either (the socket listens only once it is 0600).
    ucrypt_nbd::server::private_unix_listener(socket).map_err(|e| DeviceError::io(what(), e))
}

/// Starts `daemon` on a connection of its own, returned: the library connects only to a
/// path, so the path is a socket in a new directory only this process may enter, gone
/// once connected.
fn connect_daemon(
    daemon: &mut VhostUserDaemon<Arc<Conn>>,
    socket: &Path,
) -> std::io::Result<UnixStream> {
    use std::sync::atomic::AtomicU64;
    static N: AtomicU64 = AtomicU64::new(0);
    let parent = socket.parent().unwrap_or(Path::new("."));
    let dir = parent.join(format!(
        ".vhost-user.{}.{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    let path = dir.join("s");
    let r = (|| {
        let inner = UnixListener::bind(&path)?;
        let path = path
            .to_str()
            .ok_or_else(|| std::io::Error::other("a socket path that is not UTF-8"))?;
        daemon
            .start_client(path)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(inner.accept()?.0)
    })();
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir(&dir);
    r
}

/// Serves one VM after another until the attachment stops.
fn accept_loop(
    listener: UnixListener,
    shared: &Arc<Shared>,
    control: &Mutex<Control>,
    connected: &AtomicBool,
    name: &str,
) {
    let lock = || {
        control
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    };
    let socket = listener
        .local_addr()
        .ok()
        .and_then(|a| a.as_pathname().map(Path::to_path_buf))
        .unwrap_or_default();
    loop {
        if lock().stop {
            return;
        }
        let front = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("ucrypt: vhost-user: accepting a VM: {e}");
                return;
            }
        };
        if lock().stop {
            return;
        }
        let session = Arc::new(Session::default());
        let conn = Arc::new(Conn::new(Arc::clone(shared), Arc::clone(&session)));
        let memory = Memory::new(GuestMemoryMmap::new());
        let daemon = VhostUserDaemon::new(format!("vhost-user-{name}"), Arc::clone(&conn), memory);
        let mut daemon = match daemon {
            Ok(d) => d,
            Err(e) => {
                eprintln!("ucrypt: vhost-user: {e}");
                return;
            }
        };
        let back = match connect_daemon(&mut daemon, &socket) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("ucrypt: vhost-user: {e}");
                return;
            }
        };
        {
            let mut c = lock();
            if c.stop {
                drop(c);
                daemon.request_shutdown();
                let _ = daemon.wait();
                return;
            }
            c.current = daemon.shutdown_handle();
            c.session = Some(Arc::clone(&session));
            connected.store(true, Ordering::SeqCst);
        }
        relay::run(front, back, &session);
        if let Err(e) = daemon.wait() {
            // The VM went away uncleanly (killed): its next start connects afresh.
            eprintln!("ucrypt: vhost-user: the VM's connection ended: {e}");
        }
        {
            let mut c = lock();
            c.current = None;
            c.session = None;
        }
        // Dropping the daemon stops its queue threads. Whatever the VM wrote reaches the
        // device even if it went away without a flush.
        drop(daemon);
        conn.close_exit_events();
        if let Err(e) = shared.export.flush() {
            eprintln!("ucrypt: vhost-user: flushing after the VM left: {e}");
        }
        // In use until the connection's threads and descriptors are gone and its writes
        // flushed: whoever waits for "not in use" (close, a test counting descriptors)
        // finds nothing of it left.
        connected.store(false, Ordering::SeqCst);
    }
}

impl VhostUserAttachment {
    /// The connected VM's session.
    fn session(&self) -> Option<Arc<Session>> {
        self.control
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .session
            .clone()
    }

    /// Stops accepting, cuts a connected VM off, waits for the thread and removes the
    /// socket. Idempotent.
    fn stop(&mut self) {
        let current = {
            let mut c = self
                .control
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            c.stop = true;
            c.current.take()
        };
        match current {
            Some(h) => h.shutdown(),
            // Waiting in accept (or about to): a connection of our own wakes it, and it
            // sees `stop`.
            None => drop(UnixStream::connect(&self.socket)),
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Attachment for VhostUserAttachment {
    fn kind(&self) -> FrontendKind {
        FrontendKind::VhostUser
    }

    fn node(&self) -> &Path {
        &self.socket
    }

    /// A VM is connected.
    fn in_use(&self) -> Result<bool, DeviceError> {
        Ok(self.connected.load(Ordering::SeqCst))
    }

    fn detach(mut self: Box<Self>) -> Result<(), DeviceError> {
        self.stop();
        self.export.flush().map_err(|e| {
            DeviceError::io("flushing the volume", std::io::Error::other(e.to_string()))
        })
    }

    /// A VM that is not connected reads the capacity when it connects; a connected one is
    /// told through its back-end channel (`VHOST_USER_BACKEND_CONFIG_CHANGE_MSG`), which
    /// it must have given.
    fn can_resize(&self) -> Result<(), DeviceError> {
        if self.session().is_some_and(|s| !s.has_backend_channel()) {
            return Err(unavailable(
                "the connected VM gave no back-end channel to tell it of a new capacity; \
                 resize while no VM is connected"
                    .into(),
            ));
        }
        Ok(())
    }

    fn resize(&self, size_bytes: u64) -> Result<(), DeviceError> {
        self.shared.capacity.store(size_bytes, Ordering::Release);
        if let Some(s) = self.session() {
            s.config_changed()
                .map_err(|e| DeviceError::io("telling the VM of the new capacity", e))?;
        }
        Ok(())
    }
}

impl Drop for VhostUserAttachment {
    fn drop(&mut self) {
        // No recovery yet: the socket goes away with the server.
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn the_socket_is_the_owners_only_from_its_first_moment_and_nothing_is_left_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        // A directory anyone may enter, as /tmp is: the socket's own mode must protect it.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let socket = dir.path().join("vm.sock");
        let listener = bind(&socket).unwrap();
        let md = std::fs::symlink_metadata(&socket).unwrap();
        assert!(md.file_type().is_socket());
        assert_eq!(md.mode() & 0o777, 0o600);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("vm.sock")]);
        // The renamed socket is the listening one.
        assert!(UnixStream::connect(&socket).is_ok());
        // A live socket is refused, a stale one replaced.
        assert!(matches!(bind(&socket), Err(DeviceError::Busy(_))));
        drop(listener);
        bind(&socket).unwrap();
    }

    fn open_fds() -> usize {
        std::fs::read_dir("/proc/self/fd").unwrap().count()
    }

    /// Each VM connection gets a daemon whose queue threads have exit eventfds; the
    /// library never closes their read ends, the front end does once the daemon is gone.
    /// A connection that sends nothing and hangs up makes and drops a whole daemon.
    #[test]
    fn connections_leave_no_descriptor_behind() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("vm.sock");
        let export: Export = Arc::new(ucrypt_backend::ZeroBackend::new(1 << 20));
        let opts = AttachOptions {
            name: "fds".into(),
            read_only: false,
            logical_block: 512,
            queues: 4,
            queue_depth: 128,
            workers: 0,
        };
        let at = attach(export, &socket, &opts).unwrap();
        let wait = |connected: bool| {
            let t0 = std::time::Instant::now();
            while at.in_use().unwrap() != connected {
                assert!(t0.elapsed().as_secs() < 10, "the connection was not served");
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        };
        let once = || {
            let s = UnixStream::connect(&socket).unwrap();
            wait(true);
            drop(s);
            wait(false);
        };
        once();
        let before = open_fds();
        for _ in 0..20 {
            once();
        }
        // Other tests of this process open files meanwhile: a leak of one per queue per
        // connection would be 80.
        let after = open_fds();
        assert!(
            after < before + 10,
            "{before} descriptors open, then {after}"
        );
        at.detach().unwrap();
    }
}
