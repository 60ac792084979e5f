//! The runtime directory of a named instance: `/run/ucrypt/NAME/` for root,
//! `$XDG_RUNTIME_DIR/ucrypt/NAME/` otherwise (`/tmp/ucrypt-UID/NAME/` without
//! `XDG_RUNTIME_DIR`; `$UCRYPT_RUNTIME_DIR/NAME/` when that is set, for tests and
//! containers).
//!
//! Beside the instance directories, `BASE/.NAME.lock` (never removed: a lock on a file
//! that can be unlinked and recreated is no lock) holds the name. Its byte [`LIVE`] is
//! locked by the server for its whole life: the liveness test. Its byte [`GATE`] is held
//! for a moment by whoever creates the directory or removes a dead server's: two `open
//! NAME`s, or an `open` and a `status`, never both decide under the same name. (A name
//! never starts with `.`, so these files never meet an instance directory.)
//!
//! | file | what |
//! |---|---|
//! | `lock` | `flock`ed by the server for its whole life, for older `ucrypt` binaries |
//! | `pid` | the server's pid |
//! | `instance.json` | the [`Description`] |
//! | `control.sock` | the control socket (status, close, suspend, resume, resize, refresh) |
//! | `nbd.sock` | the NBD socket, unless `--socket`/`--listen` named another |
//! | `log` | the server's standard error after it went to the background |
//! | `fuse/` | the default FUSE mount point (`fuse/NAME` is the volume file) |
//!
//! A directory whose name lock nobody holds belongs to a server that died (the kernel drops
//! the locks with the last descriptor, whatever killed the process): it is removed,
//! never trusted, with the dead server's FUSE mount, by the next `open`, `status`, `ls` or
//! `close` that meets it, which says so ([`Probe::Dead`]).

use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use ucrypt_device::FrontendKind;

/// The byte of the name lock a server holds while it lives.
const LIVE: i64 = 0;
/// The byte of the name lock held while a directory is created or a dead one removed.
const GATE: i64 = 1;
/// How long to wait for someone else's creation or clean-up under a name: both take
/// milliseconds; a stuck one (a hung unmount) must not hang every command.
const GATE_WAIT: Duration = Duration::from_secs(20);

/// Why an instance operation failed.
#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    /// The name cannot name an instance.
    #[error(
        "invalid instance name {0:?} (use 1-64 of A-Z a-z 0-9 . _ + -, not starting with . or -)"
    )]
    BadName(String),
    /// An instance of that name is running.
    #[error("instance {name} already exists (ucrypt open {name}, pid {pid})")]
    Exists {
        /// Its name.
        name: String,
        /// Its server's pid (0 if not yet written).
        pid: u32,
    },
    /// No running instance of that name.
    #[error("instance {0} is not active")]
    NotActive(String),
    /// The server of that name died, but the kernel device it served remains.
    #[error(
        "the server of instance {name} died, but its device {} remains; `ucrypt open \
         --recover {image} {name}` serves it again, `ucrypt close {name}` removes it",
        show_nodes(devices)
    )]
    DeadDevice {
        /// Its name.
        name: String,
        /// Its devices.
        devices: Vec<PathBuf>,
        /// The image it served (`IMAGE` when unknown).
        image: String,
    },
    /// `close` of a dead instance whose device is still open (mounted, a process).
    #[error(
        "the server of instance {name} died and its device {} is in use; `ucrypt open \
         --recover {image} {name}` serves it again, `ucrypt close --force {name}` removes \
         it (its users' I/O fails)",
        show_nodes(devices)
    )]
    DeadDeviceInUse {
        /// Its name.
        name: String,
        /// Its devices in use.
        devices: Vec<PathBuf>,
        /// The image it served (`IMAGE` when unknown).
        image: String,
    },
    /// A file-system operation failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: io::Error,
    },
}

fn show_nodes(nodes: &[PathBuf]) -> String {
    nodes
        .iter()
        .map(|n| n.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> InstanceError {
    let what = what.into();
    move |source| InstanceError::Io { what, source }
}

/// What `instance.json` says about an instance (written once it is ready).
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq, Eq)]
pub struct Description {
    /// The instance name (and NBD export name).
    pub name: String,
    /// The server's pid.
    pub pid: u32,
    /// The encrypted device or image.
    pub device: String,
    /// A detached header, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// LUKS1, LUKS2, PLAIN, BITLK, FVAULT2, TCRYPT, or TABLE (opened from a table line).
    #[serde(rename = "type")]
    pub kind: String,
    /// The cipher spec (`aes-xts-plain64`).
    pub cipher: String,
    /// Key size in bits.
    pub key_bits: u32,
    /// Authenticated encryption: the integrity (`hmac(sha256)`, `aead`, `poly1305`), as
    /// `cryptsetup status` names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub integrity: Option<String>,
    /// The integrity key's size in bits (HMAC), inside `key_bits`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub integrity_key_bits: Option<u32>,
    /// A standalone dm-integrity device (`integritysetup open`, type INTEGRITY): what
    /// `integritysetup status` shows of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub integrity_target: Option<crate::integrity::Status>,
    /// Encryption sector size in bytes.
    pub sector_size: u32,
    /// Where the data starts on the device, in 512-byte sectors.
    pub offset_sectors: u64,
    /// IV offset, in 512-byte sectors.
    pub iv_offset_sectors: u64,
    /// Size of the decrypted volume in 512-byte sectors.
    pub size_sectors: u64,
    /// Served read-only.
    pub read_only: bool,
    /// Discards passed down.
    pub allow_discards: bool,
    /// ublk, nbd, fuse or none.
    pub frontend: String,
    /// The node users open (`/dev/ublkb0`, `/dev/nbd0`, `DIR/NAME`); empty for `none`.
    pub node: String,
    /// The stable path, a symbolic link to the node ([`stable_path`]); none without a node
    /// or when the link could not be made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
    /// The NBD URI of the socket.
    pub uri: String,
    /// The header UUID, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Whether the instance was opened from a header (resume/resize/refresh ask for its
    /// passphrase) or from a table line (they need the line again).
    pub from_header: bool,
    /// Seconds since the epoch when it became ready.
    pub started: u64,
}

impl Description {
    /// The front end [`Description::frontend`] names; `None` for a name this build does
    /// not know (a description written by another version).
    pub fn frontend_kind(&self) -> Option<FrontendKind> {
        FrontendKind::from_name(&self.frontend)
    }
}

/// The base directory holding every instance's directory (not created here).
pub fn base_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("UCRYPT_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return PathBuf::from("/run/ucrypt");
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("ucrypt");
    }
    std::env::temp_dir().join(format!("ucrypt-{uid}"))
}

/// Where root's instances get their stable names, as cryptsetup's get `/dev/mapper/NAME`.
pub const DEV_LINKS: &str = "/dev/ucrypt";

/// The stable path of instance `name`'s node, a symbolic link that names it whatever
/// `/dev/ublkbN`, `/dev/nbdN` or FUSE file it got: `/dev/ucrypt/NAME` for root's
/// instances (runtime directory `/run/ucrypt`), `RUNDIR/NAME/node` for everyone else's (a
/// user cannot write `/dev`, and instances under a `UCRYPT_RUNTIME_DIR` must not meet
/// root's names there).
pub fn stable_path(name: &str) -> PathBuf {
    let base = base_dir();
    if base == Path::new("/run/ucrypt") {
        Path::new(DEV_LINKS).join(name)
    } else {
        base.join(name).join("node")
    }
}

/// Points instance `name`'s [`stable_path`] at `node`, replacing a link a dead server left
/// (the caller holds the name) but nothing that is not a symbolic link.
///
/// # Errors
/// I/O errors (a read-only `/dev`, a file in the way).
pub fn link_stable(name: &str, node: &Path) -> io::Result<PathBuf> {
    let path = stable_path(name);
    if let Some(parent) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)?;
    }
    match std::fs::symlink_metadata(&path) {
        Ok(md) if md.file_type().is_symlink() => std::fs::remove_file(&path)?,
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a symbolic link", path.display()),
            ))
        }
        Err(_) => {}
    }
    std::os::unix::fs::symlink(node, &path)?;
    Ok(path)
}

/// The live instance of this runtime directory whose node is `node` (`/dev/ublkb0`): what
/// udev's rule asks (`udev/99-ucrypt.rules`, through `ucrypt udev-name`) to name the
/// device `/dev/ucrypt/NAME`. Read-only, as a program run for a udev event must be: only
/// the descriptions are read; no lock is taken and a dead server's directory is left for
/// the next `ls` or `open` to clean up.
pub fn owner_of_node(node: &Path) -> Option<String> {
    let entries = std::fs::read_dir(base_dir()).ok()?;
    entries.flatten().find_map(|e| {
        let name = e.file_name().into_string().ok()?;
        let desc = Paths::of(&name).ok()?.read_description()?;
        let pid = libc::pid_t::try_from(desc.pid).ok().filter(|&p| p > 0)?;
        // SAFETY: kill(2) with signal 0 sends nothing; it only checks that the process
        // exists (EPERM: it does, under another user).
        let alive = unsafe { libc::kill(pid, 0) } == 0
            || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
        (alive && Path::new(&desc.node) == node).then_some(desc.name)
    })
}

/// Asks udev to look at the block device `node` again (a `change` event written to its
/// sysfs `uevent`): the kernel announced the device before the instance's description
/// named it, so udev's rule could not name it then. Without udev nobody listens; a node
/// that is not a block device of `/dev` is left alone.
pub fn announce_to_udev(node: &str) {
    let Some(kernel) = node.strip_prefix("/dev/").filter(|k| !k.contains('/')) else {
        return;
    };
    let uevent = Path::new("/sys/class/block").join(kernel).join("uevent");
    if uevent.exists() {
        let _ = std::fs::write(uevent, "change");
    }
}

/// Removes instance `name`'s [`stable_path`] when it is a symbolic link (the caller holds
/// the name, or found its server dead).
pub fn unlink_stable(name: &str) {
    let path = stable_path(name);
    if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
        let _ = std::fs::remove_file(&path);
    }
}

/// Checks that `name` can name an instance (it becomes a directory and a file name).
///
/// # Errors
/// [`InstanceError::BadName`].
pub fn check_name(name: &str) -> Result<(), InstanceError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with(['.', '-'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._+-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(InstanceError::BadName(name.to_string()))
    }
}

/// Creates the base directory (mode 0700) if needed and checks that it is ours and not
/// writable by others: instance directories hold sockets that give the decrypted volume.
fn ensure_base() -> Result<PathBuf, InstanceError> {
    let base = base_dir();
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&base)
    {
        Ok(()) => {}
        Err(e) => return Err(io_err(format!("creating {}", base.display()))(e)),
    }
    let md = std::fs::symlink_metadata(&base).map_err(io_err(base.display().to_string()))?;
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if !md.is_dir() || md.uid() != uid || md.mode() & 0o022 != 0 {
        return Err(InstanceError::Io {
            what: format!("{}", base.display()),
            source: io::Error::other(
                if std::env::var_os("UCRYPT_RUNTIME_DIR").is_some_and(|d| !d.is_empty()) {
                    "not a directory owned by this user and closed to others; refusing to use it \
                 (set UCRYPT_RUNTIME_DIR to a directory of your own)"
                } else {
                    "not a directory owned by this user and closed to others; refusing to use it \
                 (set XDG_RUNTIME_DIR to a directory of your own, mode 0700, such as \
                 /run/user/UID from a login session)"
                },
            ),
        });
    }
    Ok(base)
}

/// `flock(fd, op | LOCK_NB)`: `Ok(false)` when another holder has it.
pub(crate) fn try_flock(f: &File, exclusive: bool) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    let op = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    };
    // SAFETY: flock on a descriptor we own; no memory is passed.
    let r = unsafe { libc::flock(f.as_raw_fd(), op | libc::LOCK_NB) };
    if r == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// The paths of one instance's directory.
#[derive(Debug, Clone)]
pub struct Paths {
    /// The instance name.
    pub name: String,
    /// `BASE/NAME`.
    pub dir: PathBuf,
}

impl Paths {
    /// The paths of `name` (checked) under the base directory.
    ///
    /// # Errors
    /// [`InstanceError::BadName`].
    pub fn of(name: &str) -> Result<Paths, InstanceError> {
        check_name(name)?;
        Ok(Paths {
            name: name.to_string(),
            dir: base_dir().join(name),
        })
    }
    /// The lock of older binaries' servers, inside the directory.
    pub fn lock(&self) -> PathBuf {
        self.dir.join("lock")
    }
    /// The name lock, `BASE/.NAME.lock`, beside the directory (never removed).
    pub fn name_lock(&self) -> PathBuf {
        let base = self.dir.parent().unwrap_or_else(|| Path::new("."));
        base.join(format!(".{}.lock", self.name))
    }
    /// The pid file.
    pub fn pid(&self) -> PathBuf {
        self.dir.join("pid")
    }
    /// The JSON description.
    pub fn description(&self) -> PathBuf {
        self.dir.join("instance.json")
    }
    /// The control socket.
    pub fn control(&self) -> PathBuf {
        self.dir.join("control.sock")
    }
    /// The default NBD socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("nbd.sock")
    }
    /// The server's log (its standard error once in the background).
    pub fn log(&self) -> PathBuf {
        self.dir.join("log")
    }
    /// The default vhost-user socket, which a VM connects to.
    pub fn vhost_socket(&self) -> PathBuf {
        self.dir.join("vhost-user.sock")
    }
    /// The default FUSE mount point.
    pub fn fuse_dir(&self) -> PathBuf {
        self.dir.join("fuse")
    }

    /// The pid in the pid file (0 when absent or unreadable).
    pub fn read_pid(&self) -> u32 {
        std::fs::read_to_string(self.pid())
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The description, if written.
    pub fn read_description(&self) -> Option<Description> {
        let text = std::fs::read_to_string(self.description()).ok()?;
        serde_json::from_str(&text).ok()
    }
}

/// What is found under a name.
#[derive(Debug)]
pub enum Probe {
    /// No directory.
    Absent,
    /// A server that died had left its directory (and perhaps its FUSE mount): both are
    /// gone now.
    Dead(Debris),
    /// A live server holds the lock (`pid` 0: still starting up).
    Live {
        /// Its pid.
        pid: u32,
    },
}

/// What a dead server left and [`probe`] took away, or could not.
#[derive(Debug, Clone, Default)]
pub struct Debris {
    /// The instance's name.
    pub name: String,
    /// The dead server's pid (0 if it never wrote it).
    pub pid: u32,
    /// FUSE mounts of the dead server that were detached.
    pub unmounted: Vec<PathBuf>,
    /// Kernel devices (ublk, kernel NBD) the dead server left: they stay until `open
    /// --recover` serves them or `close` removes them, and so does the directory (its
    /// description says what they served).
    pub devices: Vec<ucrypt_device::Orphan>,
    /// What the description says the instance served (empty when unknown).
    pub image: String,
    /// Kernel devices `close` removed.
    pub removed: Vec<PathBuf>,
}

impl Debris {
    /// Whether `open --recover` can take over what the dead server left: a VDUSE device
    /// cannot be served again (only removed).
    pub fn recoverable(&self) -> bool {
        self.devices.is_empty() || self.devices.iter().any(|o| o.kind != FrontendKind::Vduse)
    }

    /// The image to name in a hint: the described one, or a placeholder.
    pub fn image_or_placeholder(&self) -> &str {
        if self.image.is_empty() {
            "IMAGE"
        } else {
            &self.image
        }
    }
}

impl std::fmt::Display for Debris {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.pid == 0 {
            write!(f, "its server had died")?;
        } else {
            write!(f, "its server (pid {}) had died", self.pid)?;
        }
        for d in &self.removed {
            write!(f, "; its device {} was removed", d.display())?;
        }
        if self.devices.is_empty() {
            write!(f, "; its runtime directory was removed")?;
        }
        for m in &self.unmounted {
            write!(f, ", its dead FUSE mount {} detached", m.display())?;
        }
        for d in &self.devices {
            write!(
                f,
                "; its {} device {} remains ({})",
                d.kind.as_str(),
                d.node.display(),
                d.state
            )?;
        }
        if !self.devices.is_empty() {
            write!(
                f,
                ": `ucrypt open --recover {} {name}` serves it again, `ucrypt close {name}` \
                 removes it",
                self.image_or_placeholder(),
                name = self.name
            )?;
        }
        Ok(())
    }
}

/// An OFD lock command (`F_OFD_SETLK`, `F_OFD_GETLK`...) on byte `at` of `f`: the name lock
/// here, the image locks in `lock.rs`.
pub(super) fn lock_byte(
    f: &File,
    at: i64,
    cmd: libc::c_int,
    typ: libc::c_int,
) -> io::Result<libc::flock> {
    // SAFETY: an all-zero `flock` is a valid value of this plain C struct.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = at;
    fl.l_len = 1;
    // SAFETY: fcntl with an OFD lock command reads and writes the `flock` we pass, which
    // lives for the call; the descriptor is ours.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), cmd, &mut fl) };
    if r == 0 {
        Ok(fl)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Write-locks byte `at`: `Ok(false)` when another open file description has it.
fn try_lock_byte(f: &File, at: i64) -> io::Result<bool> {
    match lock_byte(f, at, libc::F_OFD_SETLK, libc::F_WRLCK) {
        Ok(_) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether another open file description locks byte `at`.
fn byte_held(f: &File, at: i64) -> io::Result<bool> {
    let fl = lock_byte(f, at, libc::F_OFD_GETLK, libc::F_WRLCK)?;
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

/// The name's gate, held until dropped.
struct Gate<'a>(&'a File);

impl<'a> Gate<'a> {
    /// Waits (polling: `F_OFD_SETLKW` cannot time out) for the gate of name lock `f`.
    fn take(f: &'a File, what: &Path) -> Result<Gate<'a>, InstanceError> {
        let deadline = Instant::now() + GATE_WAIT;
        loop {
            if try_lock_byte(f, GATE).map_err(io_err(format!("locking {}", what.display())))? {
                return Ok(Gate(f));
            }
            if Instant::now() > deadline {
                return Err(InstanceError::Io {
                    what: format!("locking {}", what.display()),
                    source: io::Error::new(
                        io::ErrorKind::TimedOut,
                        "another ucrypt command has held it for 20 s",
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for Gate<'_> {
    fn drop(&mut self) {
        let _ = lock_byte(self.0, GATE, libc::F_OFD_SETLK, libc::F_UNLCK);
    }
}

/// Opens the name lock (created when `create`); `None` when it does not exist.
fn open_name_lock(p: &Paths, create: bool) -> Result<Option<File>, InstanceError> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(p.name_lock())
    {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == io::ErrorKind::NotFound && !create => Ok(None),
        Err(e) => Err(io_err(format!("opening {}", p.name_lock().display()))(e)),
    }
}

/// Whether a server of an older binary (which locks only `lock` in the directory) lives.
fn old_server_lives(p: &Paths) -> Result<bool, InstanceError> {
    let lock = match File::open(p.lock()) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io_err(format!("opening {}", p.lock().display()))(e)),
    };
    let free = try_flock(&lock, true).map_err(io_err(format!("locking {}", p.lock().display())))?;
    Ok(!free)
}

/// Whether `p`'s server is alive; a stale directory is removed.
///
/// # Errors
/// I/O errors other than "not there".
pub fn probe(p: &Paths) -> Result<Probe, InstanceError> {
    let Some(name_lock) = open_name_lock(p, false)? else {
        // Every directory is made after its name lock: without one, this is a directory
        // of an older binary's server, or debris; or nothing is left under the name but a
        // kernel device carrying it (the whole runtime directory was removed).
        if !p.dir.exists() {
            return Ok(if ucrypt_device::orphans_of(&p.name).is_empty() {
                Probe::Absent
            } else {
                Probe::Dead(remove_stale(p))
            });
        }
        if old_server_lives(p)? {
            return Ok(Probe::Live { pid: p.read_pid() });
        }
        return Ok(Probe::Dead(remove_stale(p)));
    };
    let _gate = Gate::take(&name_lock, &p.name_lock())?;
    let live = byte_held(&name_lock, LIVE)
        .map_err(io_err(format!("locking {}", p.name_lock().display())))?;
    if live || old_server_lives(p)? {
        return Ok(Probe::Live { pid: p.read_pid() });
    }
    // Without a directory, a device carrying the name is still the dead instance's.
    if std::fs::symlink_metadata(&p.dir).is_err() && ucrypt_device::orphans_of(&p.name).is_empty() {
        return Ok(Probe::Absent);
    }
    Ok(Probe::Dead(remove_stale(p)))
}

/// What dead instance `p` left that outlives it: the kernel devices (ublk, kernel NBD),
/// and a vhost-user socket, where the VM may be waiting to reconnect (QEMU's chardev
/// `reconnect=N`); `open --recover` serves either again.
fn orphans(p: &Paths) -> Vec<ucrypt_device::Orphan> {
    let mut found = ucrypt_device::orphans_of(&p.name);
    if let Some(node) = dead_vhost_socket(p) {
        found.push(ucrypt_device::Orphan {
            kind: FrontendKind::VhostUser,
            node,
            state: "a VM may be waiting to reconnect: its I/O waits",
        });
    }
    found
}

/// The vhost-user socket instance `p` described, when it is still there (its server
/// gone, nobody else removed it).
pub fn dead_vhost_socket(p: &Paths) -> Option<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    let d = p
        .read_description()
        .filter(|d| d.frontend_kind() == Some(FrontendKind::VhostUser))?;
    let node = PathBuf::from(d.node);
    std::fs::symlink_metadata(&node)
        .is_ok_and(|m| m.file_type().is_socket())
        .then_some(node)
}

/// Removes a dead server's directory, and its FUSE mount (the kernel leaves the mount of
/// a dead server; `fusermount3 -u -z` or `umount -l` takes it away): at the default mount
/// point and at the one its description names (`--fuse DIR`), if a FUSE file system of
/// this instance (source `ucrypt:NAME`) is mounted there.
fn remove_stale(p: &Paths) -> Debris {
    let mut debris = Debris {
        name: p.name.clone(),
        pid: p.read_pid(),
        devices: orphans(p),
        image: p.read_description().map(|d| d.device).unwrap_or_default(),
        ..Debris::default()
    };
    let mut points = vec![p.fuse_dir()];
    if let Some(d) = p
        .read_description()
        .filter(|d| d.frontend_kind() == Some(FrontendKind::Fuse))
    {
        if let Some(dir) = Path::new(&d.node)
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
        {
            if !points.iter().any(|q| q == dir) {
                points.push(dir.to_path_buf());
            }
        }
    }
    let source = format!("ucrypt:{}", p.name);
    for dir in points {
        if fuse_mount_of(&dir, &source) {
            lazy_unmount(&dir);
            if !fuse_mount_of(&dir, &source) {
                debris.unmounted.push(dir);
            }
        }
    }
    if debris.devices.is_empty() {
        unlink_stable(&p.name);
        let _ = std::fs::remove_dir_all(&p.dir);
    }
    debris
}

/// `close` of an instance whose server died: removes the kernel devices it left (refused
/// while one is in use, unless `force`: its users' I/O then fails), then its directory.
/// `None` when a live server has the name, or there is nothing under it.
///
/// # Errors
/// [`InstanceError::DeadDeviceInUse`]; the driver's refusal; I/O errors.
pub fn close_dead(p: &Paths, force: bool) -> Result<Option<Debris>, InstanceError> {
    let name_lock = match open_name_lock(p, false)? {
        Some(f) => f,
        // Only a kernel device is left under the name: take the name to remove it.
        None if !ucrypt_device::orphans_of(&p.name).is_empty() => {
            ensure_base()?;
            open_name_lock(p, true)?.ok_or_else(|| InstanceError::Io {
                what: format!("opening {}", p.name_lock().display()),
                source: io::ErrorKind::NotFound.into(),
            })?
        }
        None => {
            return match probe(p)? {
                Probe::Dead(d) if d.devices.is_empty() => Ok(Some(d)),
                _ => Ok(None),
            }
        }
    };
    let _gate = Gate::take(&name_lock, &p.name_lock())?;
    let live = byte_held(&name_lock, LIVE)
        .map_err(io_err(format!("locking {}", p.name_lock().display())))?;
    if live || old_server_lives(p)? {
        return Ok(None);
    }
    let exists = std::fs::symlink_metadata(&p.dir).is_ok();
    let mut debris = remove_stale(p);
    if !exists && debris.devices.is_empty() {
        return Ok(None);
    }
    if !force {
        let busy: Vec<PathBuf> = debris
            .devices
            .iter()
            // A VM waiting on a dead socket is not using it: nothing answers there.
            .filter(|d| d.kind != ucrypt_device::FrontendKind::VhostUser)
            .filter(|d| ucrypt_device::block_device_in_use(&d.node).unwrap_or(true))
            .map(|d| d.node.clone())
            .collect();
        if !busy.is_empty() {
            return Err(InstanceError::DeadDeviceInUse {
                name: p.name.clone(),
                devices: busy,
                image: debris.image_or_placeholder().to_string(),
            });
        }
    }
    for d in std::mem::take(&mut debris.devices) {
        ucrypt_device::remove_orphan(&d).map_err(|e| InstanceError::Io {
            what: format!("removing {}", d.node.display()),
            source: io::Error::other(e),
        })?;
        debris.removed.push(d.node);
    }
    unlink_stable(&p.name);
    let _ = std::fs::remove_dir_all(&p.dir);
    Ok(Some(debris))
}

/// Whether a FUSE file system with `source` is mounted at `dir` (`/proc/self/mountinfo`:
/// the mount point is field 5, then after `-` the type and the source; octal escapes).
fn fuse_mount_of(dir: &Path, source: &str) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = dir.as_os_str().as_encoded_bytes();
    info.lines().any(|line| {
        let mut halves = line.splitn(2, " - ");
        let (Some(head), Some(tail)) = (halves.next(), halves.next()) else {
            return false;
        };
        let point = head.split(' ').nth(4).map(unescape_mountinfo);
        let mut t = tail.split(' ');
        let (fstype, src) = (t.next().unwrap_or(""), t.next().map(unescape_mountinfo));
        point.as_deref() == Some(want)
            && (fstype == "fuse" || fstype.starts_with("fuse."))
            && src.as_deref() == Some(source.as_bytes())
    })
}

/// `\040`-style octal escapes of `/proc/self/mountinfo` undone.
fn unescape_mountinfo(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// Detaches a mount of a dead FUSE server at `dir` (lazily: nothing can use it anyway).
pub fn lazy_unmount(dir: &Path) {
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return;
    };
    // SAFETY: `c` is a valid NUL-terminated path; umount2 reads it and nothing else.
    let r = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    if r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM) {
        let _ = std::process::Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(dir)
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// An instance directory created and locked by the server that owns it. Dropping it
/// removes the directory (the locks go with the descriptors).
#[derive(Debug)]
pub struct InstanceDir {
    /// Its paths.
    pub paths: Paths,
    lock: Option<File>,
    /// The name lock, its [`LIVE`] byte held.
    name_lock: Option<File>,
}

impl InstanceDir {
    /// Takes the name (`BASE/.NAME.lock`) and creates `BASE/NAME`, removing what a dead
    /// server left there first. A kernel device a dead server of the name left is taken
    /// over only by `recover` (`open --recover`); otherwise it is refused.
    ///
    /// # Errors
    /// [`InstanceError::Exists`] when a live server (or one starting) has the name,
    /// [`InstanceError::DeadDevice`] when a dead one left a device and not `recover`; I/O
    /// errors.
    pub fn create(name: &str, recover: bool) -> Result<InstanceDir, InstanceError> {
        let paths = Paths::of(name)?;
        ensure_base()?;
        let name_lock = open_name_lock(&paths, true)?.ok_or_else(|| InstanceError::Io {
            what: format!("opening {}", paths.name_lock().display()),
            source: io::ErrorKind::NotFound.into(),
        })?;
        let exists = |paths: &Paths| InstanceError::Exists {
            name: name.to_string(),
            pid: paths.read_pid(),
        };
        let gate = Gate::take(&name_lock, &paths.name_lock())?;
        let ours = try_lock_byte(&name_lock, LIVE)
            .map_err(io_err(format!("locking {}", paths.name_lock().display())))?;
        if !ours || old_server_lives(&paths)? {
            return Err(exists(&paths));
        }
        let orphans = orphans(&paths);
        if !orphans.is_empty() && !recover {
            return Err(InstanceError::DeadDevice {
                name: name.to_string(),
                devices: orphans.into_iter().map(|o| o.node).collect(),
                image: paths
                    .read_description()
                    .map_or_else(|| "IMAGE".to_string(), |d| d.device),
            });
        }
        if std::fs::symlink_metadata(&paths.dir).is_ok() {
            remove_stale(&paths);
            // Kept for its devices, which this server is about to take over.
            let _ = std::fs::remove_dir_all(&paths.dir);
        }
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&paths.dir)
            .map_err(io_err(format!("creating {}", paths.dir.display())))?;
        let lock = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(paths.lock())
            .map_err(io_err(format!("creating {}", paths.lock().display())))?;
        if !try_flock(&lock, true).map_err(io_err("locking the instance"))? {
            let _ = std::fs::remove_dir_all(&paths.dir);
            return Err(exists(&paths));
        }
        drop(gate);
        Ok(InstanceDir {
            paths,
            lock: Some(lock),
            name_lock: Some(name_lock),
        })
    }

    /// Writes `pid` and the description (each written aside and renamed into place, so a
    /// reader never sees half a file).
    ///
    /// # Errors
    /// I/O errors.
    pub fn publish(&self, desc: &Description) -> Result<(), InstanceError> {
        let json = serde_json::to_string_pretty(desc).map_err(|e| InstanceError::Io {
            what: "encoding the description".into(),
            source: io::Error::other(e),
        })?;
        write_atomic(&self.paths.pid(), format!("{}\n", desc.pid).as_bytes())?;
        write_atomic(&self.paths.description(), json.as_bytes())
    }
}

impl Drop for InstanceDir {
    fn drop(&mut self) {
        // Remove first, unlock after: a concurrent `open NAME` that sees the name free
        // finds no directory of ours to delete under its feet.
        let node = self.paths.read_description().map(|d| d.node);
        unlink_stable(&self.paths.name);
        let _ = std::fs::remove_dir_all(&self.paths.dir);
        // udev's link goes too: its rule no longer finds the name (a disconnected NBD
        // device stays; a ublk device is gone already).
        if let Some(node) = node.filter(|n| !n.is_empty()) {
            if stable_path(&self.paths.name).starts_with(DEV_LINKS) {
                announce_to_udev(&node);
            }
        }
        self.lock.take();
        self.name_lock.take();
    }
}

fn write_atomic(path: &Path, data: &[u8]) -> Result<(), InstanceError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, data)
        .and_then(|()| std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)))
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(io_err(format!("writing {}", path.display())))
}

/// A dead instance whose kernel device still serves `image` (its description names it as
/// the device or the header): the name and the debris. Such an image is in use: a second
/// device on it would be written beside the first one's held I/O.
pub fn dead_holder(image: &Path) -> Option<(String, Debris)> {
    let id = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let target = id(image)?;
    scan().into_iter().find_map(|(p, probe)| match probe {
        Probe::Dead(debris) if !debris.devices.is_empty() => {
            let d = p.read_description()?;
            let same = id(Path::new(&d.device)) == Some(target)
                || d.header
                    .as_deref()
                    .is_some_and(|h| id(Path::new(h)) == Some(target));
            same.then_some((p.name, debris))
        }
        _ => None,
    })
}

/// Every live instance under the base directory, by name (stale ones are removed).
pub fn list() -> Vec<(Paths, u32)> {
    scan()
        .into_iter()
        .filter_map(|(p, probe)| match probe {
            Probe::Live { pid } => Some((p, pid)),
            _ => None,
        })
        .collect()
}

/// The names of the live instances, sorted, found without changing anything: no stale
/// directory removed, no lock taken, no server asked (shell completion runs it on every
/// TAB).
pub fn live_names() -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(base_dir()) else {
        return Vec::new();
    };
    let mut names: Vec<String> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| check_name(n).is_ok())
        .filter(|n| {
            let Ok(p) = Paths::of(n) else { return false };
            matches!(open_name_lock(&p, false), Ok(Some(f)) if byte_held(&f, LIVE).unwrap_or(false))
        })
        .collect();
    names.sort();
    names
}

/// Every instance directory under the base directory, by name, live or dead (the dead
/// ones' debris removed, as [`probe`] does), and, for root, the dead instances known only
/// by a kernel device that carries their name (a ublk or kernel NBD device whose server
/// died after its directory was removed).
pub fn scan() -> Vec<(Paths, Probe)> {
    let mut names: Vec<String> = std::fs::read_dir(base_dir())
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| check_name(n).is_ok())
        .collect();
    // Only root serves ublk and kernel NBD devices; a user's list is the user's own.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        names.extend(
            ucrypt_device::all_orphans()
                .into_iter()
                .map(|(name, _)| name)
                .filter(|n| check_name(n).is_ok()),
        );
    }
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter_map(|n| {
            let p = Paths::of(&n).ok()?;
            let probe = probe(&p).ok()?;
            Some((p, probe))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_could_escape_the_directory_are_refused() {
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "-x",
            ".hidden",
            "a b",
            &"x".repeat(65),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        for good in ["secret", "vol-1", "a.b_c+d", "X9"] {
            assert!(check_name(good).is_ok(), "{good:?}");
        }
    }
}
