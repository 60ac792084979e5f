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
//! What the guest gets: `VIRTIO_BLK_F_MQ` with the queues asked for, flush, write-zeroes,
//! discard where the volume has `allow_discards`, read-only (`VIRTIO_BLK_F_RO`), the
//! volume's sector size as the logical block size, `GET_ID` answering the instance name.

mod config;
mod queue;

use crate::{AttachOptions, Attachment, DeviceError, Export, FrontendKind};
use config::Geometry;
use queue::{Conn, Memory, Shared};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use ucrypt_backend::Support;
use vhost::vhost_user::Listener;
use vhost_user_backend::{ShutdownHandle, VhostUserDaemon};
use vm_memory::GuestMemoryMmap;

/// What the accept thread and the attachment share.
struct Control {
    /// Detaching: accept no further VM.
    stop: bool,
    /// The connected VM's connection, to cut it on a forced close.
    current: Option<ShutdownHandle>,
}

/// The volume served on a vhost-user socket.
pub struct VhostUserAttachment {
    socket: PathBuf,
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
    let mut serial = [0u8; 20];
    let name = opts.name.as_bytes();
    let n = name.len().min(serial.len());
    serial[..n].copy_from_slice(&name[..n]);
    let shared = Arc::new(Shared {
        geometry: Geometry {
            logical_block: opts.logical_block,
            queues: opts.queues,
            // seg_max follows: QEMU's queues are 128 descriptors unless told otherwise.
            queue_size: 128,
            read_only: opts.read_only,
            discard: export.info().caps.discard != Support::None,
        },
        export: Arc::clone(&export),
        serial,
    });
    let control = Arc::new(Mutex::new(Control {
        stop: false,
        current: None,
    }));
    let connected = Arc::new(AtomicBool::new(false));
    let thread = {
        let (control, connected) = (Arc::clone(&control), Arc::clone(&connected));
        let name = opts.name.clone();
        std::thread::Builder::new()
            .name("vhost-user".into())
            .spawn(move || accept_loop(listener, &shared, &control, &connected, &name))
            .map_err(|e| DeviceError::io("starting the vhost-user thread", e))?
    };
    Ok(Box::new(VhostUserAttachment {
        socket: socket.to_path_buf(),
        export,
        control,
        connected,
        thread: Some(thread),
    }))
}

/// Binds `socket`, replacing a stale one (no server answers) but never a live socket or a
/// file of another kind.
fn bind(socket: &Path) -> Result<Listener, DeviceError> {
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
    let l = ucrypt_nbd::server::private_unix_listener(socket)
        .map_err(|e| DeviceError::io(what(), e))?;
    Ok(Listener::from(l))
}

/// Serves one VM after another until the attachment stops.
fn accept_loop(
    mut listener: Listener,
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
    loop {
        if lock().stop {
            return;
        }
        let conn = Arc::new(Conn::new(Arc::clone(shared)));
        let memory = Memory::new(GuestMemoryMmap::new());
        let mut daemon = match VhostUserDaemon::new(format!("vhost-user-{name}"), conn, memory) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("ucrypt: vhost-user: {e}");
                return;
            }
        };
        if let Err(e) = daemon.start(&mut listener) {
            eprintln!("ucrypt: vhost-user: {e}");
            return;
        }
        {
            let mut c = lock();
            if c.stop {
                drop(c);
                daemon.request_shutdown();
                let _ = daemon.wait();
                return;
            }
            c.current = daemon.shutdown_handle();
            connected.store(true, Ordering::SeqCst);
        }
        if let Err(e) = daemon.wait() {
            // The VM went away uncleanly (killed): its next start connects afresh.
            eprintln!("ucrypt: vhost-user: the VM's connection ended: {e}");
        }
        lock().current = None;
        connected.store(false, Ordering::SeqCst);
        // Dropping the daemon stops its queue threads. Whatever the VM wrote reaches the
        // device even if it went away without a flush.
        drop(daemon);
        if let Err(e) = shared.export.flush() {
            eprintln!("ucrypt: vhost-user: flushing after the VM left: {e}");
        }
    }
}

impl VhostUserAttachment {
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

    /// A VM that is not connected reads the capacity when it connects; a connected one
    /// would have to be sent a configuration-change message, which the vhost-user library
    /// used here has no way to send.
    fn can_resize(&self) -> Result<(), DeviceError> {
        if self.connected.load(Ordering::SeqCst) {
            return Err(unavailable(
                "a VM is connected, and the vhost-user library cannot tell it of a new \
                 capacity (no configuration-change message); resize while no VM is connected"
                    .into(),
            ));
        }
        Ok(())
    }

    fn resize(&self, _size_bytes: u64) -> Result<(), DeviceError> {
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
}
