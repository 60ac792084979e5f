//! `ucrypt open DEV NAME` / `ucrypt open --table LINE NAME`: a named instance.
//!
//! In order: the front end is chosen (`--device`, or the automatic choice) and the name
//! and the image are claimed (the runtime directory, the image lock: both fail at once
//! with exit code 5, before any passphrase is asked for); the header is unlocked; the
//! process goes to the background (unless `--foreground`); the volume is built, the NBD
//! socket and the control socket are bound, the front end is attached, the description is
//! published, and only then does `ucrypt open` return 0 (printing the node, or the NBD URI
//! without one). Every failure before that is the command's exit status.
//!
//! The server then runs until `ucrypt close NAME` or SIGTERM/SIGINT: the front end is
//! detached (flushed), the NBD server stops (in-flight requests finish, the volume is
//! flushed), and the runtime directory is removed.

mod online;

use super::daemon::{self, Ready};
use super::open::{self, Args};
use super::{open_error, CliError, WithCode, EXIT_DEVICE, EXIT_PARAMS};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use ucrypt::instance::control::{self, Request};
use ucrypt::instance::frontend;
use ucrypt::instance::lock::{self, LockError, LockMode};
use ucrypt::instance::runtime::{Description, InstanceDir, InstanceError};
use ucrypt::instance::switch::Switch;
use ucrypt_backend::Backend;
use ucrypt_device::{AttachOptions, Attachment, FrontendKind};
use ucrypt_nbd::{Listener, ServeOptions, Shutdown};

/// Exit code for a busy device or name (cryptsetup's 5).
pub(crate) const EXIT_BUSY: u8 = 5;

/// Maps instance errors to exit codes: an existing name is "busy" (5).
pub(crate) fn instance_error(e: InstanceError) -> CliError {
    let code = match e {
        InstanceError::Exists { .. } => EXIT_BUSY,
        InstanceError::NotActive(_) => EXIT_DEVICE,
        _ => EXIT_PARAMS,
    };
    CliError {
        code,
        err: e.into(),
    }
}

/// Maps lock errors: in use is 5.
pub(crate) fn lock_error(e: LockError) -> CliError {
    let code = match e {
        LockError::InUse { .. } => EXIT_BUSY,
        LockError::Io { .. } => EXIT_DEVICE,
    };
    CliError {
        code,
        err: e.into(),
    }
}

/// How the volume is rebuilt for `luksResume`, `resize` and `refresh`.
enum Source {
    /// From the header: the secret (passphrase or key file) unlocks it again.
    Header {
        device: PathBuf,
        hopts: Box<ucrypt::HeaderOptions>,
    },
    /// From a table line: the client sends the line again.
    Table,
    /// `--raw`: nothing to rebuild.
    Raw,
}

/// What the control thread shares with the server.
struct Server {
    name: String,
    shutdown: Shutdown,
    switch: Arc<Switch>,
    attachment: Mutex<Option<Box<dyn Attachment>>>,
    connections: Arc<std::sync::atomic::AtomicUsize>,
    desc: Mutex<Description>,
    source: Source,
    opts: Mutex<ucrypt::OpenOptions>,
    /// A deferred close is pending.
    deferred: std::sync::atomic::AtomicBool,
    /// `close` detached the front end: stop once its answer is sent (stopping earlier
    /// would let the process exit before the client hears that it worked).
    stop_after_reply: std::sync::atomic::AtomicBool,
    /// Path of the description (rewritten on resize/refresh).
    dir: ucrypt::instance::runtime::Paths,
    /// Online reencryption (`reencrypt --active-name`), once started.
    online: Mutex<Option<online::Job>>,
}

/// The front end `--device`/`--fuse` ask for.
fn choose_frontend(a: &Args, name: &str) -> Result<FrontendKind, CliError> {
    let asked = frontend::parse(&a.frontend)
        .map_err(|e| anyhow::anyhow!(e))
        .code(EXIT_PARAMS)?;
    let kind = match asked {
        Some(k) => k,
        // `--recover`: the kind of device the dead instance left behind.
        None if a.recover => frontend::recover_kind(name).unwrap_or_else(frontend::auto),
        None if a.fuse.is_some() => FrontendKind::Fuse,
        None => frontend::auto(),
    };
    if a.fuse.is_some() && kind != FrontendKind::Fuse {
        return Err(anyhow::anyhow!("--fuse DIR needs --device fuse (or auto)")).code(EXIT_PARAMS);
    }
    if kind == FrontendKind::Fuse {
        ucrypt_device::fuse::available()
            .map_err(anyhow::Error::from)
            .code(EXIT_DEVICE)?;
    }
    if !frontend::available(kind) {
        // The constructor says why (module, permission, build).
        let ctx = frontend::Context {
            fuse_dir: PathBuf::new(),
            nbd_socket: None,
            recover: false,
        };
        let probe: Arc<dyn Backend> = Arc::new(ucrypt_backend::ZeroBackend::new(0));
        if let Err(e) = frontend::attach(kind, probe, &attach_options("probe", false, 512), &ctx) {
            return Err(anyhow::Error::from(e)).code(EXIT_DEVICE);
        }
    }
    Ok(kind)
}

fn attach_options(name: &str, read_only: bool, sector: u32) -> AttachOptions {
    AttachOptions {
        name: name.to_string(),
        read_only,
        logical_block: sector,
        queues: std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(64) as u16,
        queue_depth: 128,
    }
}

/// The facts of a table line for the description.
fn describe_table(t: &ucrypt_format::TableLine, kind: &str, desc: &mut Description) {
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
    desc.allow_discards = t.has(ucrypt_format::OptParam::AllowDiscards);
}

/// `ucrypt open ... NAME` without `--run`.
pub(crate) fn run(mut a: Args, name: String) -> Result<(), CliError> {
    ucrypt::instance::runtime::check_name(&name).map_err(instance_error)?;
    let tls = open::tls_config(&a)?;
    open::check_exposure(&a, tls.is_some())?;
    let kind = choose_frontend(&a, &name)?;
    let dir = InstanceDir::create(&name).map_err(instance_error)?;

    // What to serve, and the image to lock (the table input is read once: it may be
    // standard input).
    let mapping = if a.header.device.is_none() {
        Some(open::table_arg(&a).mapping()?)
    } else {
        None
    };
    let mut desc = Description {
        name: name.clone(),
        read_only: a.read_only,
        frontend: kind.as_str().to_string(),
        from_header: mapping.is_none(),
        header: a.header.header.as_ref().map(|h| h.display().to_string()),
        ..Description::default()
    };
    // Every real device the table names (not the /dev/mapper/NAME links between its own
    // stacked devices).
    let mut devices: Vec<PathBuf> = Vec::new();
    let device: PathBuf = match &mapping {
        Some(m) => {
            let first = m
                .crypt_lines()
                .last()
                .ok_or_else(|| anyhow::anyhow!("the table has no crypt target"))?;
            describe_table(first, if a.raw { "RAW" } else { "TABLE" }, &mut desc);
            desc.size_sectors = m.size_bytes() / 512;
            for path in m.crypt_lines().filter_map(|l| l.device.path()) {
                let p = PathBuf::from(path);
                if !path.starts_with("/dev/mapper/") && !devices.contains(&p) {
                    devices.push(p);
                }
            }
            devices
                .first()
                .cloned()
                .unwrap_or_else(|| PathBuf::from(first.device.to_string()))
        }
        None => {
            let d = a.header.device.clone().expect("checked by open::run");
            devices.push(d.clone());
            d
        }
    };
    // Absolute paths in the description: other processes (status, the lock holder
    // lookup) resolve them from elsewhere.
    if !ucrypt::remote_header::is_remote(&device) {
        if let Ok(abs) = std::fs::canonicalize(&device) {
            desc.device = abs.display().to_string();
        }
        if let Some(h) = &a.header.header {
            if let Ok(abs) = std::fs::canonicalize(h) {
                desc.header = Some(abs.display().to_string());
            }
        }
    }
    let mode = if a.shared {
        LockMode::Shared
    } else {
        LockMode::Exclusive
    };
    let mut locks = Vec::new();
    for d in &devices {
        locks.push(lock::lock_image(d, mode).map_err(lock_error)?);
    }
    if let Some(h) = &a.header.header {
        locks.push(lock::lock_image(h, mode).map_err(lock_error)?);
    }

    // Unlock in the foreground: the prompt and a wrong passphrase stay with the user.
    let unlocked = if mapping.is_none() {
        let Some((u, hopts)) = super::open_header::unlock(&a.header, !a.read_only)? else {
            return Ok(()); // --test-passphrase is handled by open::run; not reached
        };
        if a.persistent {
            // After the passphrase proved right, as cryptsetup stores them on activation.
            let mut flags = a.perf.activation_flags();
            if a.header.allow_discards {
                flags |= ucrypt_cryptsetup::ACTIVATE_ALLOW_DISCARDS;
            }
            let dev = super::luks::DeviceArgs {
                device: device.clone(),
                header: a.header.header.clone(),
            };
            dev.load(ucrypt::VolumeType::Luks2)?
                .set_persistent_activation_flags(flags)
                .map_err(super::luks::cs_error)?;
        }
        let kind_name = u
            .info
            .kind
            .map_or_else(|| "VOLUME".to_string(), |k| k.to_string());
        let shown = desc.device.clone();
        describe_table(u.first_line(), &kind_name, &mut desc);
        desc.device = if shown.is_empty() {
            device.display().to_string()
        } else {
            shown
        };
        desc.size_sectors = u.size_bytes() / 512;
        desc.uuid = u.info.uuid.clone();
        Some((u, hopts))
    } else {
        None
    };

    let mut ready = if a.foreground {
        Ready::Foreground
    } else {
        daemon::detach(&dir.paths.log())?
    };
    let result = serve(&mut a, kind, &dir, desc, mapping, unlocked, tls, &mut ready);
    if let Err(e) = &result {
        if ready.pending() && ready.fail(e) {
            // The parent prints it; the child exits quietly (directory removed by drop).
            drop(locks);
            drop(dir);
            std::process::exit(i32::from(e.code));
        }
    }
    drop(locks);
    drop(dir);
    result
}

/// The server's life, after the unlock.
#[allow(clippy::too_many_arguments)]
fn serve(
    a: &mut Args,
    kind: FrontendKind,
    dir: &InstanceDir,
    mut desc: Description,
    mapping: Option<ucrypt_format::Mapping>,
    unlocked: Option<(ucrypt::Unlocked, ucrypt::HeaderOptions)>,
    tls: Option<Arc<ucrypt_nbd::TlsConfig>>,
    ready: &mut Ready,
) -> Result<(), CliError> {
    // Before any other thread: only the signal thread takes SIGTERM/SIGINT.
    let shutdown = Shutdown::default();
    ucrypt_nbd::server::shutdown_on_signals(&shutdown).code(EXIT_PARAMS)?;
    let opts = ucrypt::OpenOptions {
        read_only: a.read_only,
        direct: a.direct,
        allow_large_sectors: a.large_sectors,
        perf: a.perf.options(),
    };
    let (volume, description, source) = match (mapping, unlocked) {
        (Some(m), _) if a.raw => {
            let Some(table) = m.single_line() else {
                return Err(anyhow::anyhow!(
                    "--raw exports the device of a one-line table; this table has several \
                     targets or devices"
                ))
                .code(EXIT_PARAMS);
            };
            let file = ucrypt::open::open_device(&table.device.to_string(), a.read_only, a.direct)
                .map_err(open_error)?;
            let d = format!("ucrypt raw export of {}", table.device);
            (file, d, Source::Raw)
        }
        (Some(m), _) => {
            let d = m.describe();
            let v = ucrypt::mapping::open_mapping(m, opts).map_err(open_error)?;
            (v, d, Source::Table)
        }
        (None, Some((u, hopts))) => {
            let d = super::open_header::describe(&u);
            let v = ucrypt::open_unlocked(u, opts).map_err(super::luks::cs_error)?;
            let device = a.header.device.clone().expect("header mode");
            (
                v,
                d,
                Source::Header {
                    device,
                    hopts: Box::new(hopts),
                },
            )
        }
        (None, None) => unreachable!("one of the two is given"),
    };
    let sector = volume.info().logical_block;
    let switch = Arc::new(Switch::new(volume));
    let export: Arc<dyn Backend> = Arc::clone(&switch) as Arc<dyn Backend>;

    // The NBD socket: --socket/--listen, or nbd.sock in the runtime directory.
    let mut cleanup = open::Cleanup(Vec::new());
    let listener = if a.socket.is_some() || a.listen.is_some() {
        open::listen(a, &mut cleanup)?
    } else {
        Listener::bind_unix(dir.paths.socket())
            .map_err(anyhow::Error::from)
            .code(EXIT_PARAMS)?
    };
    let mut uri = named_uri(&listener.uri(), &desc.name);
    if tls.is_some() {
        uri.replace_range(..3, "nbds");
    }
    let nbd_socket = listener.unix_path().map(PathBuf::from);
    let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let serve_opts = ServeOptions {
        export_name: desc.name.clone(),
        description,
        read_only: a.read_only,
        max_connections: a.max_connections,
        workers: a.nbd_workers(),
        shutdown: shutdown.clone(),
        log_errors: a.verbose,
        tls,
        // The engine read-modify-writes partial sectors: 512-byte requests are fine.
        min_block: (!a.raw).then_some(512),
        connections: Arc::clone(&connections),
        ..ServeOptions::default()
    };
    let control_listener = control::bind(&dir.paths.control())
        .map_err(|e| anyhow::anyhow!("binding {}: {e}", dir.paths.control().display()))?;
    let nbd_export = Arc::clone(&export);
    let nbd = std::thread::Builder::new()
        .name("nbd-accept".into())
        .spawn(move || ucrypt_nbd::serve(listener, nbd_export, serve_opts))?;

    // The front end.
    let ctx = frontend::Context {
        fuse_dir: a.fuse.clone().unwrap_or_else(|| dir.paths.fuse_dir()),
        nbd_socket,
        recover: a.recover,
    };
    let attached = frontend::attach(
        kind,
        Arc::clone(&export),
        &attach_options(&desc.name, a.read_only, sector),
        &ctx,
    );
    let attachment = match attached {
        Ok(at) => at,
        Err(e) => {
            shutdown.trigger();
            let _ = nbd.join();
            return Err(anyhow::Error::from(e)).code(EXIT_DEVICE);
        }
    };
    desc.node = attachment
        .as_ref()
        .map(|at| at.node().display().to_string())
        .unwrap_or_default();
    desc.uri = uri.clone();
    desc.pid = std::process::id();
    desc.started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    dir.publish(&desc).map_err(instance_error)?;
    if let Some(p) = &a.pid_file {
        open::write_pid_file(p)?;
        cleanup.0.push(p.clone());
    }
    let server = Arc::new(Server {
        name: desc.name.clone(),
        shutdown: shutdown.clone(),
        switch,
        attachment: Mutex::new(attachment),
        connections,
        desc: Mutex::new(desc.clone()),
        source,
        opts: Mutex::new(opts),
        deferred: Default::default(),
        stop_after_reply: Default::default(),
        dir: dir.paths.clone(),
        online: Mutex::new(None),
    });
    {
        let server = Arc::clone(&server);
        std::thread::Builder::new()
            .name("control".into())
            .spawn(move || {
                let s2 = Arc::clone(&server);
                control::serve(
                    control_listener,
                    |req| handle(&server, req),
                    move || {
                        if s2.stop_after_reply.load(Ordering::SeqCst) {
                            s2.shutdown.trigger();
                        }
                        s2.shutdown.is_triggered()
                    },
                );
            })?;
    }
    ready.ok(if desc.node.is_empty() {
        &uri
    } else {
        &desc.node
    });

    let served = nbd
        .join()
        .map_err(|_| anyhow::anyhow!("the server thread panicked"))?;
    // A data pass still running stops between hotzones, the header consistent.
    online::stop(&server);
    // Stopped by a signal, or by `close` (which detached already).
    let detached = match lock_ignoring_poison(&server.attachment).take() {
        Some(at) => at.detach().map_err(anyhow::Error::from),
        None => Ok(()),
    };
    drop(cleanup);
    served.map_err(anyhow::Error::from).code(EXIT_DEVICE)?;
    detached.code(EXIT_DEVICE)
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
fn usage(s: &Server) -> Result<Option<String>, String> {
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
fn close_now(s: &Server, now: bool) -> Result<(), String> {
    let at = lock_ignoring_poison(&s.attachment).take();
    let detached = at.map_or(Ok(()), |at| at.detach().map_err(|e| e.to_string()));
    if now {
        s.shutdown.trigger();
    } else {
        s.stop_after_reply.store(true, Ordering::SeqCst);
    }
    detached
}

/// Answers one control request.
fn handle(s: &Arc<Server>, req: Request) -> Value {
    if matches!(req.op(), "suspend" | "resume" | "resize" | "refresh") {
        // Asked once: a pass ending between two looks left the answer empty.
        if let Some(refusal) = online::busy(s) {
            return refusal;
        }
    }
    match req.op() {
        "status" => status(s),
        "reencrypt" => online::start(s, &req),
        "reencrypt_stop" => online::request_stop(s),
        "close" => {
            // A data pass stops between hotzones first (the header consistent).
            online::stop(s);
            let force = req.flag("force");
            let deferred = req.flag("deferred");
            if s.switch.is_suspended() {
                if !force {
                    return control::error(
                        EXIT_BUSY,
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
                return json!({"ok": true});
            }
            // FUSE sends RELEASE after the user's close(2) returned, and udev-like
            // probes come and go: give a just-closed user a second to be gone, as
            // cryptsetup retries a busy close.
            let deadline = std::time::Instant::now() + Duration::from_secs(1);
            while !force && matches!(usage(s), Ok(Some(_))) && std::time::Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            match usage(s) {
                Err(e) => control::error(EXIT_PARAMS, e),
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
                    json!({"ok": true, "deferred": true, "in_use": why})
                }
                Ok(Some(why)) if !force => control::error(
                    EXIT_BUSY,
                    format!(
                        "{} is still in use ({why}); use --force or --deferred",
                        s.name
                    ),
                ),
                _ => match close_now(s, false) {
                    Ok(()) => json!({"ok": true}),
                    Err(e) => control::error(EXIT_DEVICE, e),
                },
            }
        }
        "cancel_deferred" => {
            // The watcher of a deferred close stops at its next look (every 200 ms).
            s.deferred.store(false, Ordering::SeqCst);
            json!({"ok": true})
        }
        "suspend" => {
            if s.switch.is_suspended() {
                return control::error(EXIT_PARAMS, format!("{} is already suspended", s.name));
            }
            match s.switch.suspend() {
                Ok(()) => json!({"ok": true}),
                Err(e) => control::error(EXIT_DEVICE, format!("flushing before suspend: {e}")),
            }
        }
        "resume" | "resize" | "refresh" => reload(s, &req),
        other => control::error(EXIT_PARAMS, format!("unknown request {other:?}")),
    }
}

/// The live status.
fn status(s: &Server) -> Value {
    let desc = lock_ignoring_poison(&s.desc).clone();
    let mut v = serde_json::to_value(&desc).unwrap_or_else(|_| json!({}));
    let in_use = usage(s).ok().flatten();
    v["in_use"] = json!(in_use.is_some());
    if let Some(why) = in_use {
        v["in_use_by"] = json!(why);
    }
    v["nbd_connections"] = json!(s.connections.load(Ordering::SeqCst));
    v["suspended"] = json!(s.switch.is_suspended());
    if let Some(r) = online::status(s) {
        v["reencryption"] = r;
    }
    v["deferred_close"] = json!(s.deferred.load(Ordering::SeqCst));
    json!({"ok": true, "status": v})
}

/// `luksResume`, `resize`, `refresh`: rebuild the volume from the secret (header
/// instances) or the table line (table instances) and put it in place.
fn reload(s: &Server, req: &Request) -> Value {
    let op = req.op();
    let Some(secret) = req.secret.as_ref() else {
        return control::error(
            EXIT_PARAMS,
            format!("{op} needs a passphrase or table line"),
        );
    };
    if op == "resume" && !s.switch.is_suspended() {
        return control::error(EXIT_PARAMS, format!("{} is not suspended", s.name));
    }
    if op != "resume" && s.switch.is_suspended() {
        return control::error(
            EXIT_PARAMS,
            format!("{} is suspended; luksResume it first", s.name),
        );
    }
    let mut opts = *lock_ignoring_poison(&s.opts);
    let mut allow_discards = None;
    if op == "refresh" {
        if let Some(p) = req.body.get("perf") {
            match serde_json::from_value::<Vec<String>>(p.clone())
                .map_err(|e| e.to_string())
                .and_then(|args| parse_perf(&args))
            {
                Ok(perf) => opts.perf = perf,
                Err(e) => return control::error(EXIT_PARAMS, e),
            }
        }
        allow_discards = Some(req.flag("allow_discards"));
    }
    let size = req.body.get("size").and_then(Value::as_u64);
    let current = lock_ignoring_poison(&s.desc).size_sectors;
    let link = super::unlock_opts::UnlockOpts {
        link_vk_to_keyring: req
            .body
            .get("link_vk_to_keyring")
            .and_then(Value::as_str)
            .map(str::to_string),
        ..Default::default()
    };
    if link.link_vk_to_keyring.is_some() && !matches!(s.source, Source::Header { .. }) {
        return control::error(
            EXIT_PARAMS,
            "--link-vk-to-keyring needs an instance opened from a header (a table line \
             carries its key itself)",
        );
    }
    let built: Result<Arc<dyn Backend>, (u8, String)> = match &s.source {
        Source::Raw => Err((
            EXIT_PARAMS,
            "a --raw instance has no key to reload".to_string(),
        )),
        Source::Table => {
            let text = zeroize::Zeroizing::new(String::from_utf8_lossy(secret).into_owned());
            match ucrypt_format::Mapping::parse(&text) {
                Err(e) => Err((EXIT_PARAMS, format!("parsing the table: {e:#}"))),
                Ok(m) if size.is_none() && allow_discards.is_none() => {
                    ucrypt::mapping::open_mapping(m, opts)
                        .map_err(|e| (open_error(e).code, "opening the table".to_string()))
                }
                Ok(mut m) => match m.single_line_mut() {
                    None => Err((
                        EXIT_PARAMS,
                        "--size and --allow-discards need a one-line table".to_string(),
                    )),
                    Some(t) => {
                        if let Some(d) = allow_discards {
                            set_discards(t, d);
                        }
                        if let Some(n) = size {
                            t.length = n;
                        }
                        ucrypt::mapping::open_mapping(m, opts)
                            .map_err(|e| (open_error(e).code, "opening the table".to_string()))
                    }
                },
            }
        }
        Source::Header { device, hopts } => {
            let mut hopts = (**hopts).clone();
            if let Some(d) = allow_discards {
                hopts.allow_discards = d;
            }
            match ucrypt::unlock(device, secret, &hopts) {
                Err(e) => {
                    let e = super::luks::cs_error(e);
                    Err((e.code, super::error_line(&e.err)))
                }
                Ok(mut u) => {
                    if let Some(n) = size {
                        let Some(line) = u.mapping.single_line_mut() else {
                            return control::error(
                                EXIT_PARAMS,
                                "--size is not supported for multi-target volumes",
                            );
                        };
                        if n > line.length {
                            return control::error(
                                EXIT_PARAMS,
                                format!(
                                    "--size {n} is larger than the device allows ({} sectors)",
                                    line.length
                                ),
                            );
                        }
                        line.length = n;
                    } else if op == "resume" || op == "refresh" {
                        // Keep the size the instance has (a grown device shows up only
                        // through `resize`, as with cryptsetup).
                        if let Some(line) = u.mapping.single_line_mut().filter(|_| current > 0) {
                            line.length = line.length.min(current);
                        }
                    }
                    if let Err(e) = link.link_unlocked(&u) {
                        return control::error(e.code(), super::error_line(&e.err));
                    }
                    ucrypt::open_unlocked(u, opts).map_err(|e| {
                        let e = super::luks::cs_error(e);
                        (e.code, super::error_line(&e.err))
                    })
                }
            }
        }
    };
    let volume = match built {
        Ok(v) => v,
        Err((code, msg)) => return control::error(code, msg),
    };
    let info = volume.info().clone();
    if op == "resume" && info.size_bytes / 512 != current {
        return control::error(
            EXIT_PARAMS,
            format!(
                "the key opens a volume of {} sectors, the instance has {current}",
                info.size_bytes / 512
            ),
        );
    }
    if let Err(e) = s.switch.replace(volume) {
        return control::error(EXIT_DEVICE, format!("flushing the previous volume: {e}"));
    }
    *lock_ignoring_poison(&s.opts) = opts;
    let mut desc = lock_ignoring_poison(&s.desc);
    desc.size_sectors = info.size_bytes / 512;
    if let Some(d) = allow_discards {
        desc.allow_discards = d;
    }
    let _ = write_description(&s.dir, &desc);
    json!({"ok": true, "size_sectors": desc.size_sectors})
}

fn write_description(p: &ucrypt::instance::runtime::Paths, d: &Description) -> std::io::Result<()> {
    let tmp = p.description().with_extension("tmp");
    let json = serde_json::to_string_pretty(d).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, json)?;
    std::fs::rename(tmp, p.description())
}

/// Adds or removes `allow_discards` in a table line's optional parameters.
fn set_discards(t: &mut ucrypt_format::TableLine, on: bool) {
    use ucrypt_format::OptParam;
    t.opts.retain(|o| *o != OptParam::AllowDiscards);
    if on {
        t.opts.push(OptParam::AllowDiscards);
    }
}

/// `--perf-*` flags sent by `refresh`, parsed as `open` parses them.
fn parse_perf(args: &[String]) -> Result<ucrypt::config::PerfOptions, String> {
    #[derive(clap::Parser)]
    struct Perf {
        #[command(flatten)]
        perf: super::PerfArgs,
    }
    let p = <Perf as clap::Parser>::try_parse_from(
        std::iter::once("refresh".to_string()).chain(args.iter().cloned()),
    )
    .map_err(|e| e.to_string())?;
    Ok(p.perf.options())
}

/// For header-changing commands: refuses (exit 5, naming the holder) when an instance
/// maps the device or its detached header, and keeps new mappings out until the returned
/// locks are dropped. With `--disable-locks`: nothing is checked or taken.
pub(crate) fn claim_for_header_change(
    dev: &super::luks::DeviceArgs,
) -> Result<Vec<lock::ImageLock>, CliError> {
    let mut held = Vec::new();
    if super::DISABLE_LOCKS.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(held);
    }
    let paths = std::iter::once(dev.device.as_path()).chain(dev.header.as_deref());
    for p in paths {
        if let Some(l) = lock::lock_for_header_change(p).map_err(lock_error)? {
            held.push(l);
        }
    }
    Ok(held)
}
