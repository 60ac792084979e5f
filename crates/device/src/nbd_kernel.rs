//! The kernel NBD front end: the volume as `/dev/nbdN`, connected by ucrypt itself.
//!
//! As `qemu-nbd -c` and `nbd-client -N` do, the connection has two halves:
//! 1. **Negotiation in userspace.** ucrypt's own NBD server ([`ucrypt_nbd::serve`]) listens
//!    on a private unix socket (a fresh 0700 directory, removed as soon as the connections
//!    exist, so nobody else can connect). ucrypt connects to it `connections` times and
//!    runs the fixed-newstyle handshake on each ([`ucrypt_nbd::client::Connection`]),
//!    which yields the export's size and transmission flags.
//! 2. **Hand-over to the kernel** through the generic-netlink family `nbd`
//!    (`include/uapi/linux/nbd-netlink.h`): `NBD_CMD_CONNECT` with the socket fds
//!    (`NBD_ATTR_SOCKETS`), the size, the block size (the volume's sector size), the
//!    server's transmission flags (flush, FUA, trim, write-zeroes, read-only, multi-conn)
//!    and a dead-connection timeout; the kernel answers with the device index it chose.
//!    `NBD_CMD_DISCONNECT` undoes it.
//!
//! The netlink messages go through the `neli` crate (a maintained netlink library), with
//! the family's command and attribute numbers declared here from the kernel header.
//!
//! ```text
//!  /dev/nbdN ── kernel nbd ══ unix socket(s) ══ ucrypt_nbd::serve ──► Backend (Volume)
//!               (netlink CONNECT gave it the fds)
//! ```
//!
//! **Dead connections.** The server lives in this process; if the process dies, the kernel
//! sees the sockets close and holds the device's I/O for `dead_conn_timeout` (30 s by
//! default), then fails it (a mounted filesystem gets errors rather than hanging forever).
//! Within that time a new server can take over: [`reconnect`] (`ucrypt open --recover`)
//! finds the device by its backend identifier (`ucrypt:NAME`, in
//! `/sys/block/nbdN/backend`) and hands the kernel new sockets with `NBD_CMD_RECONFIGURE`;
//! the held requests are then served. ublk's user recovery has no such deadline.

use crate::{block_device_in_use, AttachOptions, Attachment, DeviceError, Export, FrontendKind};
use neli::consts::{nl::NlmF, socket::NlFamily};
use neli::genl::{AttrTypeBuilder, Genlmsghdr, GenlmsghdrBuilder, Nlattr, NlattrBuilder};
use neli::neli_enum;
use neli::nl::NlPayload;
use neli::router::synchronous::NlRouter;
use neli::types::{Buffer, GenlBuffer};
use neli::utils::Groups;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;
use ucrypt_nbd::client::Connection;
use ucrypt_nbd::{Listener, ServeOptions, Shutdown};

/// The generic-netlink family of the kernel's NBD driver.
const FAMILY: &str = "nbd";
/// `NBD_GENL_VERSION`.
const VERSION: u8 = 1;

/// `enum { NBD_CMD_UNSPEC, NBD_CMD_CONNECT, NBD_CMD_DISCONNECT, ... }` of nbd-netlink.h.
#[neli_enum(serialized_type = "u8")]
pub enum NbdCmd {
    /// `NBD_CMD_UNSPEC`
    Unspec = 0,
    /// `NBD_CMD_CONNECT`
    Connect = 1,
    /// `NBD_CMD_DISCONNECT`
    Disconnect = 2,
    /// `NBD_CMD_RECONFIGURE`
    Reconfigure = 3,
    /// `NBD_CMD_LINK_DEAD`
    LinkDead = 4,
    /// `NBD_CMD_STATUS`
    Status = 5,
}
impl neli::consts::genl::Cmd for NbdCmd {}

/// `enum { NBD_ATTR_UNSPEC, NBD_ATTR_INDEX, ... }` of nbd-netlink.h.
#[neli_enum(serialized_type = "u16")]
pub enum NbdAttr {
    /// `NBD_ATTR_UNSPEC`
    Unspec = 0,
    /// `NBD_ATTR_INDEX` (u32)
    Index = 1,
    /// `NBD_ATTR_SIZE_BYTES` (u64)
    SizeBytes = 2,
    /// `NBD_ATTR_BLOCK_SIZE_BYTES` (u64)
    BlockSizeBytes = 3,
    /// `NBD_ATTR_TIMEOUT` (u64 seconds)
    Timeout = 4,
    /// `NBD_ATTR_SERVER_FLAGS` (u64: the transmission flags)
    ServerFlags = 5,
    /// `NBD_ATTR_CLIENT_FLAGS` (u64)
    ClientFlags = 6,
    /// `NBD_ATTR_SOCKETS` (nested `NBD_SOCK_ITEM`s)
    Sockets = 7,
    /// `NBD_ATTR_DEAD_CONN_TIMEOUT` (u64 seconds)
    DeadConnTimeout = 8,
    /// `NBD_ATTR_DEVICE_LIST`
    DeviceList = 9,
    /// `NBD_ATTR_BACKEND_IDENTIFIER` (string)
    BackendIdentifier = 10,
}
impl neli::consts::genl::NlAttrType for NbdAttr {}

/// `NBD_SOCK_ITEM` (nested in `NBD_ATTR_SOCKETS`).
const NBD_SOCK_ITEM: u16 = 1;
/// `NBD_SOCK_FD` (u32, nested in `NBD_SOCK_ITEM`).
const NBD_SOCK_FD: u16 = 1;

/// Options of the kernel NBD front end beyond [`AttachOptions`].
#[derive(Debug, Clone)]
pub struct NbdOptions {
    /// Sockets handed to the kernel (NBD multi-conn: the kernel spreads requests over
    /// them, one per hardware queue).
    pub connections: usize,
    /// Server threads per connection (requests in flight per socket).
    pub workers: usize,
    /// How long the kernel waits for a dead connection to come back before failing I/O.
    pub dead_conn_timeout: Duration,
    /// A particular `/dev/nbdN` (`None`: the kernel picks a free one).
    pub index: Option<u32>,
}

impl Default for NbdOptions {
    fn default() -> Self {
        NbdOptions {
            connections: 1,
            workers: 8,
            dead_conn_timeout: Duration::from_secs(30),
            index: None,
        }
    }
}

/// Whether the kernel's NBD driver is loaded.
///
/// # Errors
/// [`DeviceError::Unavailable`] naming what is missing.
pub fn available() -> Result<(), DeviceError> {
    if Path::new("/sys/module/nbd").exists() || Path::new("/dev/nbd0").exists() {
        Ok(())
    } else {
        Err(DeviceError::Unavailable {
            frontend: "nbd",
            why: "the nbd module is not loaded (modprobe nbd)".into(),
        })
    }
}

fn netlink_err(what: &str, e: impl std::fmt::Display) -> DeviceError {
    DeviceError::io(what, std::io::Error::other(e.to_string()))
}

fn attr<P: neli::ToBytes + neli::Size>(
    kind: NbdAttr,
    payload: P,
) -> Result<Nlattr<NbdAttr, Buffer>, DeviceError> {
    NlattrBuilder::default()
        .nla_type(
            AttrTypeBuilder::default()
                .nla_type(kind)
                .build()
                .map_err(|e| netlink_err("building a netlink attribute", e))?,
        )
        .nla_payload(payload)
        .build()
        .map_err(|e| netlink_err("building a netlink attribute", e))
}

/// Sends one command of the `nbd` family and returns the kernel's answer (an error
/// reply becomes an error naming the errno).
fn call(
    cmd: NbdCmd,
    attrs: GenlBuffer<NbdAttr, Buffer>,
    what: &str,
) -> Result<Option<u32>, DeviceError> {
    let (sock, _) = NlRouter::connect(NlFamily::Generic, Some(0), Groups::empty())
        .map_err(|e| netlink_err("opening a generic netlink socket", e))?;
    let family = sock
        .resolve_genl_family(FAMILY)
        .map_err(|e| DeviceError::Unavailable {
            frontend: "nbd",
            why: format!("the kernel has no \"{FAMILY}\" netlink family ({e}); modprobe nbd"),
        })?;
    let msg = GenlmsghdrBuilder::default()
        .cmd(cmd)
        .version(VERSION)
        .attrs(attrs)
        .build()
        .map_err(|e| netlink_err("building a netlink message", e))?;
    let recv = sock
        .send::<_, _, u16, Genlmsghdr<NbdCmd, NbdAttr>>(family, NlmF::ACK, NlPayload::Payload(msg))
        .map_err(|e| netlink_err(what, e))?;
    let mut index = None;
    for reply in recv {
        let reply = reply.map_err(|e| match e {
            // The kernel's answer is an errno: name it, not the whole echoed message.
            neli::err::RouterError::Nlmsgerr(m) => {
                DeviceError::io(what, std::io::Error::from_raw_os_error(-*m.error()))
            }
            e => netlink_err(what, e),
        })?;
        if let NlPayload::Payload(p) = reply.nl_payload() {
            if let Ok(i) = p
                .attrs()
                .get_attr_handle()
                .get_attr_payload_as::<u32>(NbdAttr::Index)
            {
                index = Some(i);
            }
        }
    }
    Ok(index)
}

/// A private directory for the server's socket: `$XDG_RUNTIME_DIR` or the temp dir,
/// mode 0700, a name nobody else has.
///
/// `$XDG_RUNTIME_DIR` only when it is ours and nobody else may write in it: after `su`
/// without `-` or `sudo -E`, root still has the user's, and a socket in a directory the
/// user owns could be swapped for one of theirs, which root's `/dev/nbdN` would then serve.
fn private_dir() -> Result<PathBuf, DeviceError> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| owned_and_private(p))
        .unwrap_or_else(std::env::temp_dir);
    let pid = std::process::id();
    for n in 0..1000u32 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = base.join(format!("ucrypt-nbd-{pid}-{nanos:x}-{n}"));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(DeviceError::io(format!("creating {}", dir.display()), e)),
        }
    }
    Err(DeviceError::io(
        "creating a private socket directory",
        std::io::Error::other("no free name"),
    ))
}

/// Whether `dir` is a directory (not a symlink) owned by this process's effective user that
/// no one else can write to.
fn owned_and_private(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    std::fs::symlink_metadata(dir)
        .is_ok_and(|m| m.is_dir() && m.uid() == me && m.mode() & 0o022 == 0)
}

/// What [`NbdAttachment`]s are known by in sysfs (`/sys/block/nbdN/backend`, set with
/// `NBD_ATTR_BACKEND_IDENTIFIER`): which instance a device belongs to, for
/// [`reconnect`].
fn backend_identifier(name: &str) -> String {
    format!("ucrypt:{name}")
}

/// Starts the server on a private socket and negotiates `connections` sockets with it:
/// the attachment (not yet indexed: dropping it stops the server), the negotiated socket
/// fds to hand to the kernel, and the export's facts.
fn serve_and_negotiate(
    export: Export,
    opts: &AttachOptions,
    nopts: &NbdOptions,
) -> Result<(NbdAttachment, Vec<OwnedFd>, ucrypt_nbd::client::ExportFacts), DeviceError> {
    let connections = nopts.connections.max(1);
    let dir = private_dir()?;
    let sock_path = dir.join("nbd.sock");
    let listener = Listener::bind_unix(&sock_path)
        .map_err(|e| netlink_err(&format!("listening on {}", sock_path.display()), e))?;
    let shutdown = Shutdown::default();
    let sopts = ServeOptions {
        export_name: opts.name.clone(),
        description: format!("ucrypt {}", opts.name),
        read_only: opts.read_only,
        max_connections: connections,
        workers: nopts.workers,
        shutdown: shutdown.clone(),
        log_errors: true,
        ..ServeOptions::default()
    };
    let server = {
        let export = std::sync::Arc::clone(&export);
        std::thread::Builder::new()
            .name("nbd-kernel-server".into())
            .spawn(move || {
                if let Err(e) = ucrypt_nbd::serve(listener, export, sopts) {
                    eprintln!("ucrypt: NBD server behind the kernel device: {e}");
                }
            })
            .map_err(|e| DeviceError::io("starting the NBD server thread", e))?
    };
    let attachment = NbdAttachment {
        node: PathBuf::new(),
        index: None,
        shutdown,
        server: Some(server),
        name: opts.name.clone(),
        block: u64::from(opts.logical_block.max(512)),
    };
    // From here on, dropping `attachment` stops the server (and disconnects, once indexed).
    let negotiated =
        (|| -> Result<(Vec<OwnedFd>, ucrypt_nbd::client::ExportFacts), DeviceError> {
            let mut fds = Vec::with_capacity(connections);
            let mut facts = None;
            for _ in 0..connections {
                let s = UnixStream::connect(&sock_path).map_err(|e| {
                    DeviceError::io(format!("connecting to {}", sock_path.display()), e)
                })?;
                let keep = s
                    .try_clone()
                    .map_err(|e| DeviceError::io("duplicating a socket", e))?;
                let conn = Connection::over_unix(s, &opts.name)
                    .map_err(|e| netlink_err("negotiating with ucrypt's NBD server", e))?;
                facts = Some(conn.facts());
                // Dropping the connection closes only its duplicates of the fd; `keep` stays
                // open, positioned right after the handshake (the server sends nothing until
                // a request arrives).
                drop(conn);
                fds.push(OwnedFd::from(keep));
            }
            let facts = facts.ok_or_else(|| netlink_err("negotiating", "no connection"))?;
            Ok((fds, facts))
        })();
    // Nobody else may connect: the socket's name goes now (the listener stays).
    let _ = std::fs::remove_file(&sock_path);
    let _ = std::fs::remove_dir(&dir);
    let (fds, facts) = negotiated?;
    Ok((attachment, fds, facts))
}

/// `NBD_ATTR_SOCKETS` with one `NBD_SOCK_ITEM` per fd.
fn sockets_attr(fds: &[OwnedFd]) -> Result<Nlattr<NbdAttr, Buffer>, DeviceError> {
    fn built(e: impl std::fmt::Display) -> DeviceError {
        netlink_err("building a netlink attribute", e)
    }
    let mut sockets = attr(NbdAttr::Sockets, Vec::<u8>::new())?;
    for fd in fds {
        let raw =
            u32::try_from(fd.as_raw_fd()).map_err(|_| netlink_err("socket fd", "negative"))?;
        let item = NlattrBuilder::default()
            .nla_type(
                AttrTypeBuilder::default()
                    .nla_type(NBD_SOCK_ITEM)
                    .build()
                    .map_err(built)?,
            )
            .nla_payload(Vec::<u8>::new())
            .build()
            .map_err(built)?
            .nest(
                &NlattrBuilder::default()
                    .nla_type(
                        AttrTypeBuilder::default()
                            .nla_type(NBD_SOCK_FD)
                            .build()
                            .map_err(built)?,
                    )
                    .nla_payload(raw)
                    .build()
                    .map_err(built)?,
            )
            .map_err(|e| netlink_err("nesting a netlink attribute", e))?;
        sockets = sockets
            .nest(&item)
            .map_err(|e| netlink_err("nesting a netlink attribute", e))?;
    }
    Ok(sockets)
}

/// Connects `export` to a kernel NBD device and returns once `/dev/nbdN` has its size.
///
/// # Errors
/// [`DeviceError::Unavailable`] without the nbd module, [`DeviceError::Io`] when the
/// server, the handshake or the kernel's `NBD_CMD_CONNECT` fails (with the errno).
pub fn attach(
    export: Export,
    opts: &AttachOptions,
    nopts: &NbdOptions,
) -> Result<NbdAttachment, DeviceError> {
    available()?;
    let (mut attachment, fds, facts) = serve_and_negotiate(export, opts, nopts)?;
    let block = u64::from(opts.logical_block.max(512));
    // The kernel's size must be whole blocks.
    let size = facts.size_bytes / block * block;
    let mut attrs: GenlBuffer<NbdAttr, Buffer> = GenlBuffer::new();
    if let Some(i) = nopts.index {
        attrs.push(attr(NbdAttr::Index, i)?);
    }
    attrs.push(attr(NbdAttr::SizeBytes, size)?);
    attrs.push(attr(NbdAttr::BlockSizeBytes, block)?);
    attrs.push(attr(NbdAttr::ServerFlags, u64::from(facts.flags))?);
    attrs.push(attr(
        NbdAttr::DeadConnTimeout,
        nopts.dead_conn_timeout.as_secs().max(1),
    )?);
    attrs.push(attr(
        NbdAttr::BackendIdentifier,
        backend_identifier(&opts.name),
    )?);
    attrs.push(sockets_attr(&fds)?);
    let index = call(
        NbdCmd::Connect,
        attrs,
        "connecting the kernel NBD device (NBD_CMD_CONNECT)",
    )?
    .or(nopts.index)
    .ok_or_else(|| netlink_err("NBD_CMD_CONNECT", "the kernel did not say which device"))?;
    // The kernel holds its own references to the sockets now.
    drop(fds);
    attachment.index = Some(index);
    attachment.node = PathBuf::from(format!("/dev/nbd{index}"));
    wait_for_size(&attachment.node, index)?;
    Ok(attachment)
}

/// The kernel NBD device that instance `name` connected (its backend identifier), if one
/// is still configured.
pub fn find_by_instance(name: &str) -> Option<u32> {
    let want = backend_identifier(name);
    let mut found: Vec<u32> = std::fs::read_dir("/sys/block")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n: u32 = e.file_name().to_str()?.strip_prefix("nbd")?.parse().ok()?;
            let id = std::fs::read_to_string(e.path().join("backend")).ok()?;
            (id.trim() == want).then_some(n)
        })
        .collect();
    found.sort_unstable();
    found.first().copied()
}

/// The kernel NBD devices of instance `name` whose server died: configured with its
/// backend identifier, and the process that connected them (`/sys/block/nbdN/pid`) is
/// gone. Sysfs only.
pub fn orphans_of(name: &str) -> Vec<u32> {
    all_orphans()
        .into_iter()
        .filter(|(n, _)| n == name)
        .map(|(_, i)| i)
        .collect()
}

/// Every kernel NBD device a ucrypt instance connected whose server died, with the
/// instance name its backend identifier carries. Sysfs only.
pub fn all_orphans() -> Vec<(String, u32)> {
    let prefix = backend_identifier("");
    let mut found: Vec<(String, u32)> = std::fs::read_dir("/sys/block")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n: u32 = e.file_name().to_str()?.strip_prefix("nbd")?.parse().ok()?;
            let id = std::fs::read_to_string(e.path().join("backend")).ok()?;
            let name = id.trim().strip_prefix(&prefix)?.to_string();
            let pid: Option<i32> = std::fs::read_to_string(e.path().join("pid"))
                .ok()
                .and_then(|p| p.trim().parse().ok());
            let alive = pid.is_some_and(|p| {
                // SAFETY: kill with signal 0 only asks whether the process exists.
                let r = unsafe { libc::kill(p, 0) };
                r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
            });
            (!alive).then_some((name, n))
        })
        .collect();
    found.sort_unstable_by_key(|&(_, n)| n);
    found
}

/// Disconnects `/dev/nbd{index}` (`NBD_CMD_DISCONNECT`): what `ucrypt close` does to the
/// device of an instance whose server died. Its waiting I/O fails.
///
/// # Errors
/// The kernel refused.
pub fn disconnect(index: u32) -> Result<(), DeviceError> {
    available()?;
    let mut attrs: GenlBuffer<NbdAttr, Buffer> = GenlBuffer::new();
    attrs.push(attr(NbdAttr::Index, index)?);
    call(
        NbdCmd::Disconnect,
        attrs,
        &format!("disconnecting /dev/nbd{index} (NBD_CMD_DISCONNECT)"),
    )
    .map(|_| ())
}

/// Hands freshly negotiated sockets of a new server to `/dev/nbd{index}`, whose server
/// died, with `NBD_CMD_RECONFIGURE`: the kernel replaces its dead connections with them
/// and requeues what was waiting, so the device and whatever is mounted on it continue
/// (within the dead-connection timeout the device was connected with; after it, the
/// waiting requests had already failed with EIO). The caller makes sure no live instance
/// of the name exists.
///
/// # Errors
/// [`DeviceError::Unavailable`] when the device belongs to another instance or another
/// volume (size or block size differ); [`DeviceError::Io`] when the kernel refuses (its
/// connections are alive: `ENOSPC`; it is not configured: `EINVAL`).
pub fn reconnect(
    export: Export,
    index: u32,
    opts: &AttachOptions,
    nopts: &NbdOptions,
) -> Result<NbdAttachment, DeviceError> {
    available()?;
    let refuse = |why: String| DeviceError::Unavailable {
        frontend: "nbd",
        why,
    };
    let sys = PathBuf::from(format!("/sys/block/nbd{index}"));
    let owner = std::fs::read_to_string(sys.join("backend")).unwrap_or_default();
    if owner.trim() != backend_identifier(&opts.name) {
        return Err(refuse(format!(
            "/dev/nbd{index} belongs to {:?}, not to instance {:?}",
            owner.trim(),
            opts.name
        )));
    }
    let block = u64::from(opts.logical_block.max(512));
    let size = export.info().size_bytes / block * block;
    let sectors: u64 = std::fs::read_to_string(sys.join("size"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let logical: u64 = std::fs::read_to_string(sys.join("queue/logical_block_size"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    if sectors * 512 != size || logical != block {
        return Err(refuse(format!(
            "/dev/nbd{index} has {} bytes in blocks of {logical}, this volume {size} bytes in \
             blocks of {block}: not the same volume",
            sectors * 512
        )));
    }
    let (mut attachment, fds, _facts) = serve_and_negotiate(export, opts, nopts)?;
    let mut attrs: GenlBuffer<NbdAttr, Buffer> = GenlBuffer::new();
    attrs.push(attr(NbdAttr::Index, index)?);
    // The kernel refuses to reconfigure a device that has an identifier without it.
    attrs.push(attr(
        NbdAttr::BackendIdentifier,
        backend_identifier(&opts.name),
    )?);
    attrs.push(attr(
        NbdAttr::DeadConnTimeout,
        nopts.dead_conn_timeout.as_secs().max(1),
    )?);
    attrs.push(sockets_attr(&fds)?);
    call(
        NbdCmd::Reconfigure,
        attrs,
        &format!("reconnecting /dev/nbd{index} (NBD_CMD_RECONFIGURE)"),
    )?;
    drop(fds);
    attachment.index = Some(index);
    attachment.node = PathBuf::from(format!("/dev/nbd{index}"));
    Ok(attachment)
}

/// The block device shows its size once the kernel has set the connection up.
fn wait_for_size(node: &Path, index: u32) -> Result<(), DeviceError> {
    let sys = format!("/sys/block/nbd{index}/size");
    for _ in 0..500 {
        if std::fs::read_to_string(&sys).is_ok_and(|s| s.trim() != "0") && node.exists() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(DeviceError::io(
        format!("{}", node.display()),
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the device did not get its size",
        ),
    ))
}

/// A connected `/dev/nbdN`.
pub struct NbdAttachment {
    node: PathBuf,
    index: Option<u32>,
    shutdown: Shutdown,
    server: Option<JoinHandle<()>>,
    /// The instance name (the backend identifier the kernel checks on reconfigure).
    name: String,
    /// The device's block size.
    block: u64,
}

impl std::fmt::Debug for NbdAttachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbdAttachment")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl NbdAttachment {
    /// N of `/dev/nbdN`.
    pub fn index(&self) -> Option<u32> {
        self.index
    }

    fn shut_down(&mut self) -> Result<(), DeviceError> {
        let mut result = Ok(());
        if let Some(index) = self.index.take() {
            let mut attrs: GenlBuffer<NbdAttr, Buffer> = GenlBuffer::new();
            attrs.push(attr(NbdAttr::Index, index)?);
            // NBD_CMD_DISCONNECT: the kernel sends NBD_CMD_DISC after the requests in
            // flight and shuts the sockets, so the server's connections end by themselves.
            result = call(
                NbdCmd::Disconnect,
                attrs,
                "disconnecting the kernel NBD device (NBD_CMD_DISCONNECT)",
            )
            .map(|_| ());
        }
        // Then the server: in-flight requests finish, the export is flushed, it returns.
        self.shutdown.trigger();
        if let Some(server) = self.server.take() {
            let _ = server.join();
        }
        result
    }
}

impl Attachment for NbdAttachment {
    fn kind(&self) -> FrontendKind {
        FrontendKind::Nbd
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
        Ok(())
    }

    /// `NBD_CMD_RECONFIGURE` with the new size: the kernel sets the capacity and tells the
    /// block layer (what `NBD_SET_SIZE` does for devices set up by ioctl, which the kernel
    /// refuses on netlink devices).
    fn resize(&self, size_bytes: u64) -> Result<(), DeviceError> {
        let Some(index) = self.index else {
            return Ok(());
        };
        let mut attrs: GenlBuffer<NbdAttr, Buffer> = GenlBuffer::new();
        attrs.push(attr(NbdAttr::Index, index)?);
        attrs.push(attr(
            NbdAttr::BackendIdentifier,
            backend_identifier(&self.name),
        )?);
        attrs.push(attr(
            NbdAttr::SizeBytes,
            size_bytes / self.block * self.block,
        )?);
        attrs.push(attr(NbdAttr::BlockSizeBytes, self.block)?);
        call(
            NbdCmd::Reconfigure,
            attrs,
            &format!("resizing /dev/nbd{index} (NBD_CMD_RECONFIGURE)"),
        )
        .map(|_| ())
    }
}

impl Drop for NbdAttachment {
    fn drop(&mut self) {
        let _ = self.shut_down();
    }
}

#[cfg(test)]
mod tests {
    use super::owned_and_private;
    use std::os::unix::fs::PermissionsExt;

    /// The socket directory's base: only a directory of our own that nobody else can write
    /// (root with a user's `$XDG_RUNTIME_DIR` must not put its socket there).
    #[test]
    fn only_a_private_directory_of_our_own_holds_the_socket() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("run");
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        assert!(owned_and_private(&dir));
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).expect("symlink");
        assert!(!owned_and_private(&link), "a symlink is not taken");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        assert!(
            !owned_and_private(&dir),
            "a world-writable directory is not taken"
        );
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&dir, Some(65534), None).expect("chown");
            assert!(
                !owned_and_private(&dir),
                "another user's directory is not taken"
            );
        }
        assert!(!owned_and_private(&tmp.path().join("missing")));
    }
}
