//! A named instance's server: the volume behind a [`Switch`], the NBD server, the front
//! end, the published description and the control socket, until `close` or a signal.
//!
//! ```text
//!  Input (table, raw device, unlocked header) ──build──► Built { volume, Source }
//!  serve(Built, Listener, Config) ──► Switch ─┬─► NBD server (nbd-accept thread)
//!                                             ├─► front end (ublk, kernel NBD, FUSE, none)
//!                                             └─► control socket (control thread): handle(Request) → Reply
//! ```
//!
//! The caller (the `ucrypt` command) claims the name and the image, unlocks, forks, binds
//! the NBD listener and says when the instance is ready; everything after that is here.

use super::control::{self, refuse, Received, Reply, Request, Status};
use super::frontend;
use super::online;
use super::runtime::{self, Description, InstanceDir, Paths};
use super::switch::Switch;
use crate::config::PerfOptions;
use crate::error::{Context, Error, ErrorKind, Result};
use crate::keyring::KeyringLink;
use crate::{HeaderOptions, OpenOptions, Unlocked};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use ucrypt_backend::Backend;
use ucrypt_device::{Attachment, FrontendKind};
use ucrypt_format::{Mapping, OptParam, TableLine};
use ucrypt_nbd::{Listener, ServeOptions, Shutdown};

/// What an instance serves, before it is built.
pub enum Input {
    /// A table (one line, several targets, stacked devices).
    Table(Mapping),
    /// `--raw`: a one-line table's device as it is (ciphertext).
    Raw(Mapping),
    /// An unlocked header, and what unlocks it again (`luksResume`, `resize`, `refresh`).
    Header {
        /// The volume.
        unlocked: Box<Unlocked>,
        /// The options that unlocked it.
        hopts: Box<HeaderOptions>,
        /// The encrypted device.
        device: PathBuf,
    },
}

/// How the volume is rebuilt for `luksResume`, `resize` and `refresh`.
pub enum Source {
    /// From the header: the secret (passphrase or key file) unlocks it again.
    Header {
        /// The encrypted device.
        device: PathBuf,
        /// The options that unlock it.
        hopts: Box<HeaderOptions>,
    },
    /// From a table line: the client sends the line again.
    Table,
    /// `--raw`: nothing to rebuild.
    Raw,
}

/// A built volume, ready to serve.
pub struct Built {
    /// The volume.
    pub volume: Arc<dyn Backend>,
    /// The NBD export's description.
    pub description: String,
    /// How it is rebuilt.
    pub source: Source,
}

/// Builds what `input` names with the engine options `opts`.
///
/// # Errors
/// A raw export of a table of several lines; the device or the engine.
pub fn build(input: Input, opts: OpenOptions) -> Result<Built> {
    Ok(match input {
        Input::Raw(m) => {
            let Some(table) = m.single_line() else {
                return Err(Error::Invalid(
                    "--raw exports the device of a one-line table; this table has several \
                     targets or devices"
                        .into(),
                ));
            };
            let Some(device) = table.device.device() else {
                return Err(Error::Invalid(
                    "--raw exports a device; this table sits on another table".into(),
                ));
            };
            let volume = crate::open::open_device(device, opts.read_only, opts.cache)?;
            Built {
                volume,
                description: format!("ucrypt raw export of {}", table.device),
                source: Source::Raw,
            }
        }
        Input::Table(m) => {
            let description = m.describe();
            Built {
                volume: crate::mapping::open_mapping(m, opts)?,
                description,
                source: Source::Table,
            }
        }
        Input::Header {
            unlocked,
            hopts,
            device,
        } => {
            let description = unlocked.export_description();
            Built {
                volume: crate::open_unlocked(*unlocked, opts)?,
                description,
                source: Source::Header { device, hopts },
            }
        }
    })
}

/// How an instance is served.
pub struct Config {
    /// The front end.
    pub frontend: FrontendKind,
    /// The engine options the volume was built with (kept for rebuilds).
    pub opts: OpenOptions,
    /// A raw export (no 512-byte minimum block: the device's own).
    pub raw: bool,
    /// NBD connections served at once.
    pub max_connections: usize,
    /// Threads per NBD connection; for vhost-user and VDUSE, the requests a queue keeps in
    /// flight (its own thread and `workers - 1` helpers per VM connection).
    pub workers: usize,
    /// Print per-connection errors.
    pub log_errors: bool,
    /// TLS on the NBD socket.
    pub tls: Option<Arc<ucrypt_nbd::TlsConfig>>,
    /// FUSE mount point (default: `fuse/` in the instance directory).
    pub fuse_dir: Option<PathBuf>,
    /// Reattach the device a dead server left (ublk, kernel NBD).
    pub recover: bool,
    /// vhost-user socket (default: `vhost-user.sock` in the instance directory).
    pub vhost_socket: Option<PathBuf>,
    /// ublk: hybrid polling ([`frontend::Context::ublk_poll`]).
    pub ublk_poll: Option<std::time::Duration>,
    /// Queues of the front end (ublk, vhost-user); default one per CPU.
    pub queues: Option<u16>,
    /// SIGTERM/SIGINT as the caller's signal thread takes them
    /// (`ucrypt_nbd::server::on_signals`): each one is a `close` without `--force`, logged
    /// and ignored while the device is in use.
    /// `None`: the caller routes signals elsewhere (to `shutdown`, say).
    pub signals: Option<std::sync::mpsc::Receiver<i32>>,
}

/// What the control thread shares with the server.
struct Server {
    name: String,
    shutdown: Shutdown,
    switch: Arc<Switch>,
    attachment: Mutex<Option<Box<dyn Attachment>>>,
    connections: Arc<AtomicUsize>,
    desc: Mutex<Description>,
    source: Source,
    opts: Mutex<OpenOptions>,
    /// A deferred close is pending.
    deferred: AtomicBool,
    /// `close` detached the front end: stop once its answer is sent (stopping earlier
    /// would let the process exit before the client hears that it worked).
    stop_after_reply: AtomicBool,
    /// Path of the description (rewritten on resize/refresh).
    dir: Paths,
    /// Online reencryption (`reencrypt --active-name`), once started.
    online: online::Slot,
}

/// Writes the facts of a table line into a description.
pub fn describe_table(t: &TableLine, kind: &str, desc: &mut Description) {
    desc.device = t.device.to_string();
    desc.kind = kind.to_string();
    desc.cipher = t.cipher.to_string();
    desc.key_bits = match &t.key {
        ucrypt_format::KeySource::Hex(k) => (k.len() * 8) as u32,
        ucrypt_format::KeySource::Keyring { size, .. } => (*size * 8) as u32,
    };
    desc.sector_size = t.sector_size_bytes();
    desc.offset_sectors = t.offset;
    desc.iv_offset_sectors = t.iv_offset;
    desc.size_sectors = t.length;
    desc.allow_discards = t.has(OptParam::AllowDiscards);
}

/// Writes what `cryptsetup status` says of a volume with integrity into a description:
/// the header's cipher (`aes-xts-plain64`, not the kernel's `capi:authenc(...)`), the
/// integrity as cryptsetup names it (`hmac(sha256)`, `aead`, `poly1305`) and the HMAC
/// key's size. Nothing for a volume without integrity.
pub fn describe_integrity(u: &crate::Unlocked, desc: &mut Description) {
    use ucrypt_crypto::aead::AeadKind;
    let Some(kind) = u.first_line().cipher.aead else {
        return;
    };
    let (name, key) = match kind {
        AeadKind::AuthencXts(h) => (format!("hmac({})", h.name()), h.digest_size()),
        AeadKind::Gcm => ("aead".to_string(), 0),
        AeadKind::ChaCha20Poly1305 => ("poly1305".to_string(), 0),
    };
    if u.info.kind.is_some() {
        desc.cipher = u.info.cipher_spec();
    }
    desc.integrity = Some(name);
    desc.integrity_key_bits = (key > 0).then_some(key as u32 * 8);
}

/// Serves `built` as the instance `dir` until `close` or `shutdown` (SIGTERM/SIGINT, when
/// the caller routed them there): the NBD server on `listener`, the front end, the
/// description published, the control socket. `ready` is called with what users open
/// (the node, or the NBD URI without one) once all of it is up; an error from it stops the
/// instance.
///
/// # Errors
/// Binding the control socket, attaching the front end, publishing the description,
/// `ready`'s error, and the NBD server's or the front end's failure at the end (kind
/// [`ErrorKind::Device`]).
pub fn serve(
    dir: &InstanceDir,
    mut desc: Description,
    built: Built,
    listener: Listener,
    config: Config,
    shutdown: Shutdown,
    ready: impl FnOnce(&str) -> Result<()>,
) -> Result<()> {
    let Built {
        volume,
        description,
        source,
    } = built;
    let sector = volume.info().logical_block;
    let switch = Arc::new(Switch::new(volume));
    let export: Arc<dyn Backend> = Arc::clone(&switch) as Arc<dyn Backend>;

    let mut uri = named_uri(&listener.uri(), &desc.name);
    if config.tls.is_some() {
        uri.replace_range(..3, "nbds");
    }
    let nbd_socket = listener.unix_path().map(PathBuf::from);
    let connections = Arc::new(AtomicUsize::new(0));
    let serve_opts = ServeOptions {
        export_name: desc.name.clone(),
        description,
        read_only: config.opts.read_only,
        max_connections: config.max_connections,
        workers: config.workers,
        shutdown: shutdown.clone(),
        log_errors: config.log_errors,
        tls: config.tls.clone(),
        // The engine read-modify-writes partial sectors: 512-byte requests are fine.
        min_block: (!config.raw).then_some(512),
        connections: Arc::clone(&connections),
        ..ServeOptions::default()
    };
    let control_listener = control::bind(&dir.paths.control())
        .with_context(|| format!("binding {}", dir.paths.control().display()))?;
    let nbd_export = Arc::clone(&export);
    let nbd = std::thread::Builder::new()
        .name("nbd-accept".into())
        .spawn(move || ucrypt_nbd::serve(listener, nbd_export, serve_opts))?;

    let ctx = frontend::Context {
        fuse_dir: config
            .fuse_dir
            .clone()
            .unwrap_or_else(|| dir.paths.fuse_dir()),
        nbd_socket,
        vhost_socket: config
            .vhost_socket
            .clone()
            .unwrap_or_else(|| dir.paths.vhost_socket()),
        recover: config.recover,
        ublk_poll: config.ublk_poll,
    };
    let mut options = frontend::attach_options(&desc.name, config.opts.read_only, sector);
    if let Some(q) = config.queues {
        options.queues = q;
    }
    // A VM's queue keeps as many requests in flight as an NBD connection would: its own
    // thread and `workers - 1` helpers.
    options.workers = config.workers.saturating_sub(1);
    let attached = frontend::attach(config.frontend, Arc::clone(&export), &options, &ctx);
    let attachment = match attached {
        Ok(at) => at,
        Err(e) => {
            shutdown.trigger();
            let _ = nbd.join();
            return Err(Error::from(e));
        }
    };
    desc.node = attachment
        .as_ref()
        .map(|at| at.node().display().to_string())
        .unwrap_or_default();
    if !desc.node.is_empty() {
        // Not fatal: the node works without its stable name (a read-only /dev in a
        // container); status then shows none.
        match runtime::link_stable(&desc.name, Path::new(&desc.node)) {
            Ok(link) => desc.link = Some(link.display().to_string()),
            Err(e) => eprintln!(
                "ucrypt: warning: no stable path {}: {e}",
                runtime::stable_path(&desc.name).display()
            ),
        }
    }
    desc.uri = uri.clone();
    desc.pid = std::process::id();
    desc.started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // From here on a failure must not leave a new device behind: a ublk device would stay
    // quiesced with nobody to serve or close it. One taken over by --recover is left as it
    // was found, waiting for the next try.
    let recovered = config.recover;
    let abandon = |at: Option<Box<dyn Attachment>>| {
        shutdown.trigger();
        match at {
            Some(at) if !recovered => {
                if let Err(e) = at.detach() {
                    eprintln!("ucrypt: removing {} after a failed start: {e}", desc.node);
                }
            }
            other => drop(other),
        }
    };
    if let Err(e) = dir.publish(&desc) {
        abandon(attachment);
        return Err(e.into());
    }
    // Root's instances: udev names the node /dev/ucrypt/NAME once it can find the name.
    if !desc.node.is_empty() && runtime::stable_path(&desc.name).starts_with(runtime::DEV_LINKS) {
        runtime::announce_to_udev(&desc.node);
    }
    let server = Arc::new(Server {
        name: desc.name.clone(),
        shutdown: shutdown.clone(),
        switch,
        attachment: Mutex::new(attachment),
        connections,
        desc: Mutex::new(desc.clone()),
        source,
        opts: Mutex::new(config.opts),
        deferred: AtomicBool::new(false),
        stop_after_reply: AtomicBool::new(false),
        dir: dir.paths.clone(),
        online: Mutex::new(None),
    });
    let started = (|| -> Result<()> {
        let control_server = Arc::clone(&server);
        std::thread::Builder::new()
            .name("control".into())
            .spawn(move || {
                let s2 = Arc::clone(&control_server);
                control::serve(
                    control_listener,
                    |req| handle(&control_server, req),
                    move || {
                        if s2.stop_after_reply.load(Ordering::SeqCst) {
                            s2.shutdown.trigger();
                        }
                        s2.shutdown.is_triggered()
                    },
                );
            })?;
        if let Some(signals) = config.signals {
            let server = Arc::clone(&server);
            std::thread::Builder::new()
                .name("signals".into())
                .spawn(move || {
                    while let Ok(sig) = signals.recv() {
                        on_signal(&server, sig);
                    }
                })?;
        }
        ready(if desc.node.is_empty() {
            &uri
        } else {
            &desc.node
        })
    })();
    if let Err(e) = started {
        abandon(lock_ignoring_poison(&server.attachment).take());
        return Err(e);
    }

    let served = nbd
        .join()
        .map_err(|_| Error::Invalid("the server thread panicked".into()))?;
    // A data pass still running stops between hotzones, the header consistent.
    online::stop(&server.online);
    // Stopped by a signal, or by `close` (which detached already).
    let detached = match lock_ignoring_poison(&server.attachment).take() {
        Some(at) => at.detach().map_err(Error::from),
        None => Ok(()),
    };
    served.map_err(|e| Error::from(e).with_kind(ErrorKind::Device))?;
    detached.map_err(|e| e.with_kind(ErrorKind::Device))
}

fn lock_ignoring_poison<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The listener's URI with the export name in it (`nbd+unix:///NAME?socket=...`).
fn named_uri(uri: &str, name: &str) -> String {
    if let Some(rest) = uri.strip_prefix("nbd+unix:///") {
        format!("nbd+unix:///{name}{rest}")
    } else if uri.ends_with('/') {
        format!("{uri}{name}")
    } else {
        uri.to_string()
    }
}

/// Whether the instance is in use, and by what.
fn usage(s: &Server) -> std::result::Result<Option<String>, String> {
    let mut why = Vec::new();
    if let Some(at) = lock_ignoring_poison(&s.attachment).as_ref() {
        if at.in_use().map_err(|e| e.to_string())? {
            why.push(format!("{} is open", at.node().display()));
        }
    }
    let n = s.connections.load(Ordering::SeqCst);
    if n > 0 {
        why.push(format!("{n} NBD connection(s)"));
    }
    Ok((!why.is_empty()).then(|| why.join(", ")))
}

/// Detaches the front end and stops the server (`now`), or has it stop once the
/// control request's answer is out.
fn close_now(s: &Server, now: bool) -> std::result::Result<(), String> {
    let at = lock_ignoring_poison(&s.attachment).take();
    let detached = at.map_or(Ok(()), |at| at.detach().map_err(|e| e.to_string()));
    if now {
        s.shutdown.trigger();
    } else {
        s.stop_after_reply.store(true, Ordering::SeqCst);
    }
    detached
}

/// A termination signal is a `close` without `--force`: while the device is in use (what
/// `close` refuses, exit 5) it is logged and ignored, since detaching would fail the I/O
/// of a mounted filesystem; otherwise the instance stops. A suspended instance stops too
/// (everything was flushed at suspend; the held gate is closed, so nothing waits on it).
/// A second signal is judged the same way: none exits without detaching.
fn on_signal(s: &Arc<Server>, sig: i32) {
    let name = match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        _ => "signal",
    };
    if s.shutdown.is_triggered() || s.stop_after_reply.load(Ordering::SeqCst) {
        eprintln!("ucrypt: {name}: {} is already stopping", s.name);
        return;
    }
    // As `close`: a user that just closed the device may still be leaving (FUSE's RELEASE).
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    while matches!(usage(s), Ok(Some(_))) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    match usage(s) {
        Err(e) => eprintln!(
            "ucrypt: {name} ignored: cannot tell whether {} is in use ({e}); \
             `ucrypt close --force {}` stops it",
            s.name, s.name
        ),
        Ok(Some(why)) => eprintln!(
            "ucrypt: {name} ignored: {} is in use ({why}); `ucrypt close {}` once it is \
             free, or `ucrypt close --force {}` to pull it from under its users",
            s.name, s.name, s.name
        ),
        Ok(None) => {
            eprintln!("ucrypt: {name}: closing {}", s.name);
            online::stop(&s.online);
            let suspended = s.switch.is_suspended();
            // Flushed at suspend; held requests (none: not in use) would fail now.
            s.switch.close_suspended();
            match close_now(s, true) {
                Err(e) if !suspended => eprintln!("ucrypt: closing {}: {e}", s.name),
                _ => {}
            }
        }
    }
}

/// Answers one control request.
fn handle(s: &Arc<Server>, received: Received) -> Reply {
    let Received {
        request,
        secret,
        volume_key,
    } = received;
    let secret = secret.as_ref().map(|s| s.as_slice());
    if volume_key
        && !matches!(
            request,
            Request::Resume { .. } | Request::Resize { .. } | Request::Refresh { .. }
        )
    {
        return refuse(
            ErrorKind::Invalid,
            format!("{} takes no volume key", request.op()),
        );
    }
    let secret = secret.map(|bytes| {
        if volume_key {
            Secret::VolumeKey(bytes)
        } else {
            Secret::Passphrase(bytes)
        }
    });
    if matches!(
        request,
        Request::Suspend
            | Request::Resume { .. }
            | Request::Resize { .. }
            | Request::Refresh { .. }
    ) {
        // Asked once: a pass ending between two looks left the answer empty.
        if let Some(refusal) = online::busy(&s.online, &s.name) {
            return refusal;
        }
    }
    match request {
        Request::Status => Reply::Status(Box::new(status(s))),
        Request::Reencrypt { hotzone } => {
            let header = match &s.source {
                Source::Header { device, hopts } => {
                    Some((device.as_path(), hopts.header.as_deref()))
                }
                _ => None,
            };
            let instance = online::Instance {
                name: &s.name,
                switch: &s.switch,
                desc: &s.desc,
                opts: *lock_ignoring_poison(&s.opts),
                header,
                slot: &s.online,
            };
            online::start(&instance, secret.map(Secret::bytes), hotzone)
        }
        Request::ReencryptStop => online::request_stop(&s.online, &s.name),
        Request::Close { force, deferred } => close(s, force, deferred),
        Request::CancelDeferred => {
            // The watcher of a deferred close stops at its next look (every 200 ms).
            s.deferred.store(false, Ordering::SeqCst);
            Reply::Done
        }
        Request::Suspend => {
            if s.switch.is_suspended() {
                return refuse(
                    ErrorKind::Invalid,
                    format!("{} is already suspended", s.name),
                );
            }
            match s.switch.suspend() {
                Ok(()) => Reply::Done,
                Err(e) => refuse(ErrorKind::Device, format!("flushing before suspend: {e}")),
            }
        }
        Request::Resume { link_vk_to_keyring } => {
            reload(s, Reload::Resume, secret, link_vk_to_keyring.as_deref())
        }
        Request::Resize { size } => reload(s, Reload::Resize(size), secret, None),
        Request::Refresh {
            perf,
            allow_discards,
        } => reload(
            s,
            Reload::Refresh {
                perf,
                allow_discards,
            },
            secret,
            None,
        ),
    }
}

/// `close`: refused while suspended (unless forced) or in use (unless forced or
/// deferred).
fn close(s: &Arc<Server>, force: bool, deferred: bool) -> Reply {
    // A data pass stops between hotzones first (the header consistent).
    online::stop(&s.online);
    if s.switch.is_suspended() {
        if !force {
            return refuse(
                ErrorKind::Busy,
                format!(
                    "{} is suspended; luksResume it first, or close --force",
                    s.name
                ),
            );
        }
        // Everything was flushed at suspend; held requests fail now.
        s.switch.close_suspended();
        let at = lock_ignoring_poison(&s.attachment).take();
        if let Some(at) = at {
            let _ = at.detach(); // its flush fails without a volume; it unmounts
        }
        s.stop_after_reply.store(true, Ordering::SeqCst);
        return Reply::Done;
    }
    // FUSE sends RELEASE after the user's close(2) returned, and udev-like probes come and
    // go: give a just-closed user a second to be gone, as cryptsetup retries a busy close.
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    while !force && matches!(usage(s), Ok(Some(_))) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    match usage(s) {
        Err(e) => refuse(ErrorKind::Invalid, e),
        Ok(Some(why)) if !force && deferred => {
            s.deferred.store(true, Ordering::SeqCst);
            let s = Arc::clone(s);
            std::thread::spawn(move || loop {
                std::thread::sleep(Duration::from_millis(200));
                if s.shutdown.is_triggered() || !s.deferred.load(Ordering::SeqCst) {
                    return;
                }
                if matches!(usage(&s), Ok(None)) {
                    let _ = close_now(&s, true);
                    return;
                }
            });
            Reply::Deferred { in_use: why }
        }
        Ok(Some(why)) if !force => refuse(
            ErrorKind::Busy,
            format!(
                "{} is still in use ({why}); use --force or --deferred",
                s.name
            ),
        ),
        _ => match close_now(s, false) {
            Ok(()) => Reply::Done,
            Err(e) => refuse(ErrorKind::Device, e),
        },
    }
}

/// The live status.
fn status(s: &Server) -> Status {
    let in_use_by = usage(s).ok().flatten();
    Status {
        description: lock_ignoring_poison(&s.desc).clone(),
        in_use: in_use_by.is_some(),
        in_use_by,
        nbd_connections: s.connections.load(Ordering::SeqCst),
        suspended: s.switch.is_suspended(),
        reencryption: online::status(&s.online),
        deferred_close: s.deferred.load(Ordering::SeqCst),
        integrity_failures: s.switch.integrity_failures(),
    }
}

/// What a client sent to rebuild the volume with.
#[derive(Clone, Copy)]
enum Secret<'a> {
    /// A passphrase or key file (header instances), or a table line (table instances).
    Passphrase(&'a [u8]),
    /// The volume key itself (header instances of a LUKS volume).
    VolumeKey(&'a [u8]),
}

impl<'a> Secret<'a> {
    fn bytes(self) -> &'a [u8] {
        match self {
            Secret::Passphrase(b) | Secret::VolumeKey(b) => b,
        }
    }
}

/// Which rebuild.
#[derive(Clone, Copy)]
enum Reload {
    Resume,
    Resize(Option<u64>),
    Refresh {
        perf: PerfOptions,
        allow_discards: bool,
    },
}

impl Reload {
    fn op(self) -> &'static str {
        match self {
            Reload::Resume => "resume",
            Reload::Resize(_) => "resize",
            Reload::Refresh { .. } => "refresh",
        }
    }
}

/// A refusal from a library error: its kind, its whole chain as the message.
fn refuse_error(e: &Error) -> Reply {
    refuse(e.kind(), format!("{e:#}"))
}

/// `luksResume`, `resize`, `refresh`: rebuild the volume from the secret (header
/// instances) or the table line (table instances) and put it in place.
fn reload(s: &Server, what: Reload, secret: Option<Secret<'_>>, link: Option<&str>) -> Reply {
    let op = what.op();
    let Some(secret) = secret else {
        return refuse(
            ErrorKind::Invalid,
            format!("{op} needs a passphrase or table line"),
        );
    };
    let resume = matches!(what, Reload::Resume);
    if resume && !s.switch.is_suspended() {
        return refuse(ErrorKind::Invalid, format!("{} is not suspended", s.name));
    }
    if !resume && s.switch.is_suspended() {
        return refuse(
            ErrorKind::Invalid,
            format!("{} is suspended; luksResume it first", s.name),
        );
    }
    let mut opts = *lock_ignoring_poison(&s.opts);
    let mut allow_discards = None;
    if let Reload::Refresh {
        perf,
        allow_discards: d,
    } = what
    {
        // The front end's own defaults (vhost-user: crypto on the queue thread) stay
        // unless the refresh chose a placement, as at open.
        let kind = lock_ignoring_poison(&s.attachment)
            .as_ref()
            .map_or(FrontendKind::None, |a| a.kind());
        opts.perf = frontend::perf_defaults(kind, perf);
        allow_discards = Some(d);
    }
    let size = match what {
        Reload::Resize(n) => n,
        _ => None,
    };
    let current = lock_ignoring_poison(&s.desc).size_sectors;
    let link = match link.map(KeyringLink::parse).transpose() {
        Ok(l) => l,
        Err(e) => return refuse_error(&e),
    };
    if link.is_some() && !matches!(s.source, Source::Header { .. }) {
        return refuse(
            ErrorKind::Invalid,
            "--link-vk-to-keyring needs an instance opened from a header (a table line \
             carries its key itself)",
        );
    }
    let built: std::result::Result<Arc<dyn Backend>, Reply> = match &s.source {
        Source::Raw => Err(refuse(
            ErrorKind::Invalid,
            "a --raw instance has no key to reload",
        )),
        Source::Table => {
            let Secret::Passphrase(secret) = secret else {
                return refuse(
                    ErrorKind::Invalid,
                    format!("{} was opened from a table line: give it again", s.name),
                );
            };
            let text = zeroize::Zeroizing::new(String::from_utf8_lossy(secret).into_owned());
            let opened = |m| {
                crate::mapping::open_mapping(m, opts)
                    .map_err(|e| refuse(e.kind(), "opening the table"))
            };
            match Mapping::parse(&text) {
                Err(e) => Err(refuse(
                    ErrorKind::Invalid,
                    format!("parsing the table: {e:#}"),
                )),
                Ok(m) if size.is_none() && allow_discards.is_none() => opened(m),
                Ok(mut m) => match m.single_line_mut() {
                    None => Err(refuse(
                        ErrorKind::Invalid,
                        "--size and --allow-discards need a one-line table",
                    )),
                    Some(t) => {
                        if let Some(d) = allow_discards {
                            set_discards(t, d);
                        }
                        if let Some(n) = size {
                            t.length = n;
                        }
                        opened(m)
                    }
                },
            }
        }
        Source::Header { device, hopts } => {
            let mut hopts = (**hopts).clone();
            if let Some(d) = allow_discards {
                hopts.allow_discards = d;
            }
            let unlocked = match secret {
                Secret::Passphrase(p) => crate::unlock(device, p, &hopts),
                Secret::VolumeKey(k) => crate::header::unlock_by_volume_key(device, k, &hopts),
            };
            match unlocked {
                Err(e) => Err(refuse_error(&e)),
                Ok(mut u) => {
                    if let Some(n) = size {
                        let Some(line) = u.mapping.single_line_mut() else {
                            return refuse(
                                ErrorKind::Invalid,
                                "--size is not supported for multi-target volumes",
                            );
                        };
                        if n > line.length {
                            return refuse(
                                ErrorKind::Invalid,
                                format!(
                                    "--size {n} is larger than the device allows ({} sectors)",
                                    line.length
                                ),
                            );
                        }
                        line.length = n;
                    } else if !matches!(what, Reload::Resize(_)) {
                        // Keep the size the instance has (a grown device shows up only
                        // through `resize`, as with cryptsetup).
                        if let Some(line) = u.mapping.single_line_mut().filter(|_| current > 0) {
                            line.length = line.length.min(current);
                        }
                    }
                    if let Some(l) = &link {
                        if let Err(e) = l.add_unlocked(&u) {
                            return refuse_error(&e);
                        }
                    }
                    crate::open_unlocked(u, opts).map_err(|e| refuse_error(&e))
                }
            }
        }
    };
    let volume = match built {
        Ok(v) => v,
        Err(reply) => return reply,
    };
    let info = volume.info().clone();
    let old_bytes = current * 512;
    let new_bytes = info.size_bytes;
    // The front end follows a resize (a shrink before the volume shrinks, a growth after
    // it grew), or is added again at the new size once the volume changed (a front end
    // that cannot change its size in place, while nobody uses it), or the resize is
    // refused before anything changed.
    let mut attachment = lock_ignoring_poison(&s.attachment);
    let mut readd = false;
    let front = attachment
        .as_ref()
        .filter(|_| matches!(what, Reload::Resize(_)) && new_bytes != old_bytes);
    if let Some(at) = front {
        if let Err(e) = at.can_resize() {
            let e = match e {
                ucrypt_device::DeviceError::Unavailable { why, .. } => why,
                other => other.to_string(),
            };
            if !at.can_reattach() {
                return refuse(ErrorKind::Device, format!("{} keeps its size: {e}", s.name));
            }
            match at.in_use() {
                Ok(false) => readd = true,
                Ok(true) => {
                    return refuse(
                        ErrorKind::Busy,
                        format!(
                            "{} keeps its size: {e}, and {} is in use (mounted, or open in a \
                             process), so it cannot be added again at the new size either; \
                             unmount it or stop what holds it open and resize again",
                            s.name,
                            at.node().display()
                        ),
                    )
                }
                Err(busy) => {
                    return refuse(
                        ErrorKind::Device,
                        format!("{} keeps its size: {e}; {busy}", s.name),
                    )
                }
            }
        } else if new_bytes < old_bytes {
            if let Err(e) = at.resize(new_bytes) {
                return refuse(
                    ErrorKind::Device,
                    format!("shrinking {}: {e}", at.node().display()),
                );
            }
        }
    }
    let front_follows = front.is_some();
    if resume && info.size_bytes / 512 != current {
        return refuse(
            ErrorKind::Invalid,
            format!(
                "the key opens a volume of {} sectors, the instance has {current}",
                info.size_bytes / 512
            ),
        );
    }
    if let Err(e) = s.switch.replace(volume) {
        return refuse(
            ErrorKind::Device,
            format!("flushing the previous volume: {e}"),
        );
    }
    let mut node = None;
    let grown = if readd {
        let old = attachment.take().map(|at| (at.node().to_path_buf(), at));
        match old {
            Some((was, at)) => match at.reattach() {
                Ok(at) => {
                    node = Some(at.node().to_path_buf());
                    *attachment = Some(at);
                    Ok(())
                }
                Err(e) => Err(format!(
                    "the volume has {} sectors now, but {} could not be added again at that \
                     size and is gone: {e}; close the instance and open it again",
                    new_bytes / 512,
                    was.display()
                )),
            },
            None => Ok(()),
        }
    } else {
        match attachment.as_ref().filter(|_| front_follows) {
            Some(at) if new_bytes > old_bytes => at.resize(new_bytes).map_err(|e| {
                format!(
                    "the volume grew to {} sectors, but {} keeps its old size: {e}",
                    new_bytes / 512,
                    at.node().display()
                )
            }),
            _ => Ok(()),
        }
    };
    drop(attachment);
    *lock_ignoring_poison(&s.opts) = opts;
    let mut desc = lock_ignoring_poison(&s.desc);
    desc.size_sectors = info.size_bytes / 512;
    if let Some(node) = node.filter(|n| n.as_os_str() != desc.node.as_str()) {
        // Added again under another number: the stable name follows it.
        desc.node = node.display().to_string();
        desc.link = runtime::link_stable(&desc.name, &node)
            .ok()
            .map(|l| l.display().to_string());
    }
    if let Some(d) = allow_discards {
        desc.allow_discards = d;
    }
    let _ = write_description(&s.dir, &desc);
    if let Err(e) = grown {
        return refuse(ErrorKind::Device, e);
    }
    Reply::Resized {
        size_sectors: desc.size_sectors,
    }
}

fn write_description(p: &Paths, d: &Description) -> std::io::Result<()> {
    let tmp = p.description().with_extension("tmp");
    let json = serde_json::to_string_pretty(d).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, json)?;
    std::fs::rename(tmp, p.description())
}

/// Adds or removes `allow_discards` in a table line's optional parameters.
fn set_discards(t: &mut TableLine, on: bool) {
    t.opts.retain(|o| *o != OptParam::AllowDiscards);
    if on {
        t.opts.push(OptParam::AllowDiscards);
    }
}
