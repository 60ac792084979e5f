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
//! The server then runs until `ucrypt close NAME` or SIGTERM/SIGINT, which mean the same
//! (`close` without `--force`: while the device is in use the signal is logged and
//! ignored; a suspended instance stops too): the front end is detached (flushed), the NBD
//! server stops (in-flight requests finish, the volume is flushed), and the runtime
//! directory is removed.

use super::daemon::{self, Ready};
use super::exit::{instance_error, lib_error, lock_error};
use super::open::{self, Args};
use super::prompt::Terminal;
use super::{open_error, CliError, WithCode, EXIT_DEVICE, EXIT_PARAMS};
use std::path::PathBuf;
use std::sync::Arc;
use ucrypt::export::{Bound, Endpoint, Shutdown};
use ucrypt::instance::frontend;
use ucrypt::instance::frontend::FrontendKind;
use ucrypt::instance::lock::{self, LockMode};
use ucrypt::instance::runtime::{Description, InstanceDir};
use ucrypt::instance::server::{self, Input};

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
        None if a.vhost_socket.is_some() => FrontendKind::VhostUser,
        None => {
            // One line whenever the choice passed something over: a user who expected a
            // block device learns why the volume is a FUSE file or a bare NBD socket.
            let (kind, skipped) = frontend::auto_explained();
            if !skipped.is_empty() {
                eprintln!(
                    "ucrypt: --device auto: {} ({})",
                    kind.as_str(),
                    skipped.join("; ")
                );
            }
            kind
        }
    };
    if a.fuse.is_some() && kind != FrontendKind::Fuse {
        return Err(anyhow::anyhow!("--fuse DIR needs --device fuse (or auto)")).code(EXIT_PARAMS);
    }
    if a.vhost_socket.is_some() && kind != FrontendKind::VhostUser {
        return Err(anyhow::anyhow!(
            "--vhost-socket PATH needs --device vhost-user (or auto)"
        ))
        .code(EXIT_PARAMS);
    }
    frontend::check(kind)
        .map_err(anyhow::Error::from)
        .code(EXIT_DEVICE)?;
    Ok(kind)
}

/// `ucrypt open ... NAME` without `--run`.
pub(crate) fn run(mut a: Args, name: String) -> Result<(), CliError> {
    ucrypt::instance::runtime::check_name(&name).map_err(instance_error)?;
    if a.notify {
        super::secret::set_ask_password(true);
    }
    let exposure = open::exposure(&a);
    let tls = exposure
        .check(&mut Terminal::new(&a.header.tcrypt.progress))
        .map_err(lib_error)?;
    let kind = choose_frontend(&a, &name)?;
    if a.recover && kind == FrontendKind::VhostUser {
        // The VM reconnects where it was: the dead instance's socket.
        let socket = frontend::vhost_user_recovery(&name)
            .map_err(anyhow::Error::from)
            .code(EXIT_DEVICE)?;
        match &a.vhost_socket {
            Some(p) if *p != socket => {
                return Err(anyhow::anyhow!(
                    "--recover serves the socket instance {name} had, {}, not {}",
                    socket.display(),
                    p.display()
                ))
                .code(EXIT_PARAMS)
            }
            _ => a.vhost_socket = Some(socket),
        }
    }
    let dir = InstanceDir::create(&name, a.recover).map_err(instance_error)?;

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
            server::describe_table(first, if a.raw { "RAW" } else { "TABLE" }, &mut desc);
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
            let dev = super::luks::DeviceArgs {
                device: device.clone(),
                header: a.header.header.clone(),
            };
            let mut cd = dev.load(ucrypt::VolumeType::Luks2)?;
            ucrypt::luks::store_persistent_flags(
                &mut cd,
                &a.perf.options(),
                a.header.allow_discards,
            )
            .map_err(super::luks::cs_error)?;
        }
        let kind_name = u
            .info
            .kind
            .map_or_else(|| "VOLUME".to_string(), |k| k.to_string());
        let shown = desc.device.clone();
        server::describe_table(u.first_line(), &kind_name, &mut desc);
        server::describe_integrity(&u, &mut desc);
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

    let mut ready = if a.notify {
        Ready::Notify
    } else if a.foreground {
        Ready::Foreground
    } else {
        daemon::detach(&dir.paths.log())?
    };
    let endpoint = match exposure.endpoint {
        // Without --socket/--listen: nbd.sock in the runtime directory.
        Endpoint::Private => Endpoint::Unix {
            path: dir.paths.socket(),
            group: None,
        },
        asked => asked,
    };
    let result = serve(
        &mut a, kind, endpoint, tls, &dir, desc, mapping, unlocked, &mut ready,
    );
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

/// The server's life, after the unlock: the library's [`server::serve`] with this
/// command's listener, pid file and readiness report.
#[allow(clippy::too_many_arguments)]
fn serve(
    a: &mut Args,
    kind: FrontendKind,
    endpoint: Endpoint,
    tls: Option<Arc<ucrypt::export::TlsConfig>>,
    dir: &InstanceDir,
    desc: Description,
    mapping: Option<ucrypt::format::Mapping>,
    unlocked: Option<(ucrypt::Unlocked, ucrypt::HeaderOptions)>,
    ready: &mut Ready,
) -> Result<(), CliError> {
    // Before any other thread: only the signal thread takes SIGTERM/SIGINT, and hands
    // them to the server, for which each one means `close` (refused while in use).
    let shutdown = Shutdown::default();
    let (signal_tx, signals) = std::sync::mpsc::channel();
    ucrypt::export::on_signals(move |sig| {
        let _ = signal_tx.send(sig);
    })
    .code(EXIT_PARAMS)?;
    let opts = ucrypt::OpenOptions {
        read_only: a.read_only,
        direct: a.direct,
        allow_large_sectors: a.large_sectors,
        perf: frontend::perf_defaults(kind, a.perf.options()),
    };
    let input = match (mapping, unlocked) {
        (Some(m), _) if a.raw => Input::Raw(m),
        (Some(m), _) => Input::Table(m),
        (None, Some((unlocked, hopts))) => Input::Header {
            unlocked: Box::new(unlocked),
            hopts: Box::new(hopts),
            device: a.header.device.clone().expect("header mode"),
        },
        (None, None) => unreachable!("one of the two is given"),
    };
    // A device that outlives its server (ublk, kernel NBD; given to a new server by
    // --recover) must have every completed write on an OSD: librbd write-through.
    if a.recover || matches!(kind, FrontendKind::Ublk | FrontendKind::Nbd) {
        ucrypt::settings::set_rbd_writethrough(true);
    }
    let header_mode = matches!(input, Input::Header { .. });
    let built = server::build(input, opts).map_err(|e| {
        if header_mode {
            super::luks::cs_error(e)
        } else {
            open_error(e)
        }
    })?;

    // The NBD socket: --socket/--listen, or nbd.sock in the runtime directory.
    let Bound {
        listener,
        mut cleanup,
        ..
    } = endpoint.bind(false).map_err(lib_error)?;
    let config = server::Config {
        frontend: kind,
        opts,
        raw: a.raw,
        max_connections: a.max_connections,
        workers: a.nbd_workers(),
        log_errors: a.verbose,
        tls,
        fuse_dir: a.fuse.clone(),
        recover: a.recover,
        vhost_socket: a.vhost_socket.clone(),
        queues: a.queues.map(|q| q as u16),
        signals: Some(signals),
    };
    let pid_file = a.pid_file.clone();
    let served = server::serve(dir, desc, built, listener, config, shutdown, |shown| {
        if let Some(p) = &pid_file {
            cleanup.write_pid_file(p)?;
        }
        let link = ucrypt::instance::runtime::stable_path(&dir.paths.name);
        if std::fs::symlink_metadata(&link).is_ok() {
            ready.note(&format!("stable path: {}", link.display()));
        }
        ready.ok(shown);
        Ok(())
    });
    drop(cleanup);
    served.map_err(lib_error)
}
