//! Choosing and attaching the front end of an instance: the one place that knows every
//! kind. Each kind has one function below; a new front end is one line in [`attach`].
//!
//! The automatic choice (`--device auto`, the default) is the first that can work here:
//! ublk where `/dev/ublk-control` exists and we are root, else the kernel's NBD client
//! where `/dev/nbd0` exists and we are root, else FUSE when `/dev/fuse` is usable, else
//! none (the NBD socket only). [`auto_explained`] says why each one before the choice
//! was passed over. vhost-user is never chosen automatically: it serves a VM, not this
//! host; nor is VDUSE (`/dev/vdX`), which ublk does without the vDPA bus.

use std::path::{Path, PathBuf};
use ucrypt_device::{AttachOptions, Attachment, DeviceError, Export};

/// The kinds of front end (ublk, kernel NBD, FUSE, vhost-user, VDUSE, none).
pub use ucrypt_device::FrontendKind;

/// What a front end may need besides the export.
#[derive(Debug, Clone)]
pub struct Context {
    /// FUSE: the mount point (`--fuse DIR`, or `fuse/` in the instance directory).
    pub fuse_dir: PathBuf,
    /// The instance's NBD socket when it is a unix socket (a kernel NBD client can
    /// connect its sockets there).
    pub nbd_socket: Option<PathBuf>,
    /// vhost-user: the socket a VM connects to (`--vhost-socket PATH`, or `vhost-user.sock`
    /// in the instance directory).
    pub vhost_socket: PathBuf,
    /// ublk, kernel NBD: reattach to the device of this instance whose server died (`open
    /// --recover`) instead of creating one; vhost-user: serve the dead instance's socket,
    /// where its VM reconnects.
    pub recover: bool,
    /// ublk: after each round of requests a queue thread polls for the next one for this
    /// long before it sleeps, runs requests on its own thread and may run on any CPU
    /// (`--ublk-poll USECS`; [`ucrypt_device::ublk::UblkOptions::poll`]). `None`: the
    /// default, sleeping queue threads on their queues' CPUs with a spilling worker pool.
    pub ublk_poll: Option<std::time::Duration>,
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The automatic front end for this machine and user.
pub fn auto() -> FrontendKind {
    auto_explained().0
}

/// [`auto`]'s choice, with one reason for each front end it passed over before it (what
/// `open` tells the user, so that a fallback to FUSE or a bare NBD socket is never
/// silent).
pub fn auto_explained() -> (FrontendKind, Vec<String>) {
    let mut skipped = Vec::new();
    let root = is_root();
    for (kind, node, module) in [
        (FrontendKind::Ublk, "/dev/ublk-control", "ublk_drv"),
        (FrontendKind::Nbd, "/dev/nbd0", "nbd"),
    ] {
        let why = if !root {
            "needs root".to_string()
        } else if !Path::new(node).exists() {
            format!("no {node} (modprobe {module})")
        } else {
            let check = match kind {
                FrontendKind::Ublk => ucrypt_device::ublk::available(),
                _ => ucrypt_device::nbd_kernel::available(),
            };
            match check {
                Ok(()) => return (kind, skipped),
                Err(e) => reason(e),
            }
        };
        skipped.push(format!("{}: {why}", kind.as_str()));
    }
    match ucrypt_device::fuse::available() {
        Ok(()) => (FrontendKind::Fuse, skipped),
        Err(e) => {
            skipped.push(format!("fuse: {}", reason(e)));
            (FrontendKind::None, skipped)
        }
    }
}

/// What is missing, without the front end's name (the caller names it).
fn reason(e: DeviceError) -> String {
    match e {
        DeviceError::Unavailable { why, .. } => why,
        e => e.to_string(),
    }
}

/// Whether this build has the front end at all.
pub fn available(kind: FrontendKind) -> bool {
    match kind {
        FrontendKind::Ublk => ublk_available(),
        FrontendKind::Nbd => nbd_available(),
        FrontendKind::Fuse | FrontendKind::VhostUser | FrontendKind::Vduse | FrontendKind::None => {
            true
        }
    }
}

/// The front end's attach options for a volume of logical block `sector`.
pub fn attach_options(name: &str, read_only: bool, sector: u32) -> AttachOptions {
    AttachOptions {
        name: name.to_string(),
        read_only,
        logical_block: sector,
        queues: std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(64) as u16,
        queue_depth: 128,
        workers: 0,
    }
}

/// The engine settings front end `kind` runs with, from those the command line chose.
/// vhost-user runs a request's crypto on its queue's thread unless a placement was chosen
/// (a `--perf-*` flag, `--placement`, `--workers`, `--split-bytes`): a VM's vCPU threads
/// keep the host's cores busy, and a hand-off to a crypt worker waits for a slice
/// (BENCHMARKING.md, "A VM's disk over vhost-user": 4 KiB at QD1 five times as fast
/// inline, 1 MiB no slower).
pub fn perf_defaults(
    kind: FrontendKind,
    perf: crate::config::PerfOptions,
) -> crate::config::PerfOptions {
    let chosen = perf.no_read_workqueue
        || perf.no_write_workqueue
        || perf.same_cpu_crypt
        || perf.submit_from_crypt_cpus
        || perf.placement == crate::config::PlacementPolicy::Kernel
        || perf.workers.is_some()
        || perf.split_bytes.is_some();
    if kind != FrontendKind::VhostUser || chosen {
        return perf;
    }
    crate::config::PerfOptions {
        no_read_workqueue: true,
        no_write_workqueue: true,
        ..perf
    }
}

/// Checks that front end `kind` can attach here, before anything is unlocked: FUSE needs a
/// usable `/dev/fuse`; a kind this build or machine lacks fails to attach a probe, whose
/// error says why (module, permission, build).
///
/// # Errors
/// [`DeviceError`] saying why `kind` cannot work here.
pub fn check(kind: FrontendKind) -> Result<(), DeviceError> {
    if kind == FrontendKind::Fuse {
        ucrypt_device::fuse::available()?;
    }
    if kind == FrontendKind::Vduse {
        ucrypt_device::vduse::available()?;
    }
    if !available(kind) {
        let ctx = Context {
            fuse_dir: PathBuf::new(),
            nbd_socket: None,
            vhost_socket: PathBuf::new(),
            recover: false,
            ublk_poll: None,
        };
        let probe: Export = std::sync::Arc::new(ucrypt_backend::ZeroBackend::new(0));
        attach(kind, probe, &attach_options("probe", false, 512), &ctx)?;
    }
    Ok(())
}

/// The front end asked for (`open --device KIND`): one kind, or the automatic choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Choice {
    /// `auto`: [`auto_explained`]'s choice (with `--recover`, the kind the dead instance
    /// used).
    #[default]
    Auto,
    /// This kind and no other.
    Kind(FrontendKind),
}

impl Choice {
    /// The names `--device` takes: `auto`, then every kind's.
    pub const NAMES: [&'static str; 7] = [
        "auto",
        FrontendKind::ALL[0].as_str(),
        FrontendKind::ALL[1].as_str(),
        FrontendKind::ALL[2].as_str(),
        FrontendKind::ALL[3].as_str(),
        FrontendKind::ALL[4].as_str(),
        FrontendKind::ALL[5].as_str(),
    ];

    /// The kind asked for; `None` for [`Choice::Auto`].
    pub fn kind(self) -> Option<FrontendKind> {
        match self {
            Choice::Auto => None,
            Choice::Kind(k) => Some(k),
        }
    }

    /// The name `--device` takes for this choice.
    pub fn as_str(self) -> &'static str {
        match self {
            Choice::Auto => Self::NAMES[0],
            Choice::Kind(k) => k.as_str(),
        }
    }
}

impl std::str::FromStr for Choice {
    type Err = String;

    /// Parses `--device`: ublk, nbd, fuse, vhost-user, vduse, none, or auto.
    fn from_str(s: &str) -> Result<Choice, String> {
        if s == Self::NAMES[0] {
            return Ok(Choice::Auto);
        }
        FrontendKind::from_name(s).map(Choice::Kind).ok_or_else(|| {
            format!("unknown --device {s:?} (ublk, nbd, fuse, vhost-user, vduse, none or auto)")
        })
    }
}

impl std::fmt::Display for Choice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Attaches `export` with front end `kind`; `None` for [`FrontendKind::None`].
///
/// # Errors
/// [`DeviceError::Unavailable`] when the kind cannot work here, or its attach error.
pub fn attach(
    kind: FrontendKind,
    export: Export,
    opts: &AttachOptions,
    ctx: &Context,
) -> Result<Option<Box<dyn Attachment>>, DeviceError> {
    if ctx.recover
        && !matches!(
            kind,
            FrontendKind::Ublk | FrontendKind::Nbd | FrontendKind::VhostUser
        )
    {
        return Err(DeviceError::Unavailable {
            frontend: kind.as_str(),
            why: "--recover reattaches a ublk or kernel NBD device, or a VM's vhost-user \
                  socket, whose server died; use --device ublk, nbd or vhost-user"
                .into(),
        });
    }
    match kind {
        FrontendKind::Ublk => ublk(export, opts, ctx).map(Some),
        FrontendKind::Nbd => nbd(export, opts, ctx).map(Some),
        FrontendKind::Fuse => ucrypt_device::fuse::attach(export, &ctx.fuse_dir, opts).map(Some),
        FrontendKind::VhostUser => {
            ucrypt_device::vhost_user::attach(export, &ctx.vhost_socket, opts).map(Some)
        }
        FrontendKind::Vduse => ucrypt_device::vduse::attach(export, opts).map(Some),
        FrontendKind::None => Ok(None),
    }
}

fn ublk_available() -> bool {
    ucrypt_device::ublk::available().is_ok()
}

/// The ublk front end (`/dev/ublkbN`, created with user recovery), or with `ctx.recover`
/// the instance's device that waits for a new server (user recovery).
fn ublk(
    export: Export,
    opts: &AttachOptions,
    ctx: &Context,
) -> Result<Box<dyn Attachment>, DeviceError> {
    use ucrypt_device::ublk;
    let uopts = match ctx.ublk_poll {
        None => ublk::UblkOptions::default(),
        // Measured in the kernel lab (BENCHMARKING.md, 2026-12-04, runs 11-14): polling
        // pays only on a thread that does not share its CPU with the submitter, and with
        // requests inline (a worker would wait for a CPU the poller holds).
        Some(d) => ublk::UblkOptions {
            workers: 0,
            spill: false,
            pin_queues: false,
            poll: Some(d),
            ..ublk::UblkOptions::default()
        },
    };
    if ctx.recover {
        let id = ublk::find_waiting(&opts.name)?.ok_or_else(|| DeviceError::Unavailable {
            frontend: "ublk",
            why: format!(
                "no ublk device of instance {:?} waits for recovery (its server is alive, \
                 it was closed, or it was not opened with --device ublk)",
                opts.name
            ),
        })?;
        return Ok(Box::new(ublk::recover(export, id, opts, &uopts)?));
    }
    Ok(Box::new(ublk::attach(export, opts, &uopts)?))
}

fn nbd_available() -> bool {
    ucrypt_device::nbd_kernel::available().is_ok()
}

/// The kernel NBD client front end (`/dev/nbdN`, connected to its own server socket), or
/// with `ctx.recover` the instance's device whose server died, given new connections.
fn nbd(
    export: Export,
    opts: &AttachOptions,
    ctx: &Context,
) -> Result<Box<dyn Attachment>, DeviceError> {
    use ucrypt_device::nbd_kernel;
    let nopts = nbd_kernel::NbdOptions {
        connections: usize::from(opts.queues.clamp(1, 4)),
        ..Default::default()
    };
    if ctx.recover {
        let index =
            nbd_kernel::find_by_instance(&opts.name).ok_or_else(|| DeviceError::Unavailable {
                frontend: "nbd",
                why: format!(
                    "no kernel NBD device of instance {:?} is configured (it was closed, its \
                     dead-connection timeout disconnected it, or it was not opened with \
                     --device nbd)",
                    opts.name
                ),
            })?;
        return Ok(Box::new(nbd_kernel::reconnect(
            export, index, opts, &nopts,
        )?));
    }
    Ok(Box::new(nbd_kernel::attach(export, opts, &nopts)?))
}

/// For `open --recover --device vhost-user`: the socket of dead instance `name`, where
/// its VM waits to reconnect.
///
/// # Errors
/// [`DeviceError::Unavailable`] when no dead vhost-user instance of that name left its
/// socket (never opened so, closed, or its server is alive: `open` then says the name is
/// taken).
pub fn vhost_user_recovery(name: &str) -> Result<PathBuf, DeviceError> {
    super::runtime::Paths::of(name)
        .ok()
        .and_then(|p| super::runtime::dead_vhost_socket(&p))
        .ok_or_else(|| DeviceError::Unavailable {
            frontend: "vhost-user",
            why: format!(
                "no vhost-user socket of instance {name:?} waits for recovery (it was \
                 closed, or not opened with --device vhost-user)"
            ),
        })
}

/// For `open --recover` without `--device`: the front end instance `name` used, from the
/// description its dead server left in the runtime directory, else a ublk or kernel NBD
/// device carrying its name. Reads files only: it runs before `open` forks, where no thread may
/// have been started yet (libublk's control calls would start some).
pub fn recover_kind(name: &str) -> Option<FrontendKind> {
    let described = super::runtime::Paths::of(name)
        .ok()
        .and_then(|p| p.read_description())
        .and_then(|d| d.frontend_kind())
        .filter(|k| {
            matches!(
                k,
                FrontendKind::Ublk | FrontendKind::Nbd | FrontendKind::VhostUser
            )
        });
    if described.is_some() {
        return described;
    }
    ucrypt_device::orphans_of(name)
        .first()
        .map(|o| o.kind)
        .or_else(|| ucrypt_device::nbd_kernel::find_by_instance(name).map(|_| FrontendKind::Nbd))
}

#[cfg(test)]
mod tests {
    use super::{Choice, FrontendKind};

    #[test]
    fn every_name_parses_to_its_choice_and_back() {
        assert_eq!("auto".parse::<Choice>(), Ok(Choice::Auto));
        for kind in FrontendKind::ALL {
            let c: Choice = kind.as_str().parse().unwrap();
            assert_eq!(c, Choice::Kind(kind));
            assert_eq!(c.kind(), Some(kind));
        }
        for name in Choice::NAMES {
            assert_eq!(name.parse::<Choice>().unwrap().as_str(), name);
        }
    }

    #[test]
    fn an_unknown_name_is_refused_with_the_allowed_ones() {
        for bad in ["", "UBLK", "vdpa", "auto ", "nbd0"] {
            let e = bad.parse::<Choice>().unwrap_err();
            assert!(
                e.contains("ublk, nbd, fuse, vhost-user, vduse, none or auto"),
                "{e}"
            );
        }
    }
}
