//! Starting a named instance (`ucrypt open DEV NAME`, `open --table LINE NAME`): what is
//! decided before the server runs, in the order the caller meets the refusals.
//!
//! ```text
//! Start::claim     the name, the exposure (TLS, cleartext TCP), the front end, the runtime
//!                  directory: an existing name fails here, before any passphrase is asked
//!   ─► Claimed::lock     what is served described; the images locked (every real device
//!                        a table names, or the device and its detached header)
//!   ─► (a header: the caller unlocks it, Request::unlock) Locked::unlocked: --persistent's
//!                        flags stored once the passphrase proved right; the volume described
//!   ─► Locked::serve     the volume built, the NBD endpoint bound, server::serve until close
//! ```
//!
//! The caller decides only what is its own between the steps: the table input it reads,
//! the prompt, going to the background, how readiness is reported.

use super::frontend::{self, Choice, FrontendKind};
use super::lock::{self, ImageLock, LockMode};
use super::runtime::{self, Description, InstanceDir};
use super::server::{self, Input};
use crate::config::PerfOptions;
use crate::error::{chain_kind, open_kind, Error, ErrorKind, Result};
use crate::export::{Bound, Endpoint, Exposure, Shutdown, TlsConfig};
use crate::prompt::Prompt;
use crate::remote_header::Staging;
use crate::{HeaderOptions, OpenOptions, Unlocked, VolumeType};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use ucrypt_format::Mapping;

/// What the caller asks of a new instance's name, endpoint and front end.
pub struct Start {
    /// The instance name.
    pub name: String,
    /// Where the NBD server listens (`Endpoint::Private`: `nbd.sock` in the runtime
    /// directory) and with which TLS.
    pub exposure: Exposure,
    /// The front end asked for (`--device`).
    pub frontend: Choice,
    /// `--recover`: reattach what a dead server of the name left.
    pub recover: bool,
    /// FUSE: the mount point (`--fuse DIR`).
    pub fuse_dir: Option<PathBuf>,
    /// vhost-user: the socket a VM connects to (`--vhost-socket PATH`).
    pub vhost_socket: Option<PathBuf>,
    /// ublk: hybrid polling (`--ublk-poll USECS`, [`frontend::Context::ublk_poll`]).
    pub ublk_poll: Option<std::time::Duration>,
}

/// A claimed name: its runtime directory, the front end and endpoint it will serve.
pub struct Claimed {
    /// The runtime directory (removed when dropped).
    pub dir: InstanceDir,
    /// The front end.
    pub kind: FrontendKind,
    tls: Option<Arc<TlsConfig>>,
    endpoint: Endpoint,
    fuse_dir: Option<PathBuf>,
    vhost_socket: Option<PathBuf>,
    ublk_poll: Option<std::time::Duration>,
    recover: bool,
}

/// What an instance serves.
pub enum What {
    /// A table (`raw`: its one line's device as it is, ciphertext).
    Table {
        /// The table.
        mapping: Mapping,
        /// `--raw`.
        raw: bool,
    },
    /// A header to unlock, on `device` or in the detached `header`.
    Header {
        /// The encrypted device.
        device: PathBuf,
        /// A detached header.
        header: Option<PathBuf>,
    },
}

/// `--persistent`: the activation flags to store in a LUKS2 header.
#[derive(Debug, Clone, Copy)]
pub struct Persist {
    /// The engine flags given (`--perf-*`).
    pub perf: PerfOptions,
    /// `--allow-discards`.
    pub allow_discards: bool,
}

/// A claimed name whose images are locked: ready to be served once a header is unlocked.
/// Dropped, it releases the image locks, then the name.
pub struct Locked {
    // Declared first: dropped before the name.
    _locks: Vec<ImageLock>,
    /// What the instance describes itself as (published once it serves).
    pub desc: Description,
    /// Taken by [`Locked::serve`].
    what: Option<What>,
    unlocked: Option<(Unlocked, HeaderOptions)>,
    /// The claimed name.
    pub claimed: Claimed,
}

/// How a locked instance is served.
pub struct Serving {
    /// Open the device read-only and export it so.
    pub read_only: bool,
    /// Whether the device's page cache sits under the volume.
    pub cache: crate::open::Cache,
    /// Accept sector sizes above 4096.
    pub allow_large_sectors: bool,
    /// The engine settings asked for (the front end's defaults fill the rest).
    pub perf: PerfOptions,
    /// NBD connections served at once.
    pub max_connections: usize,
    /// Threads per NBD connection.
    pub workers: usize,
    /// Print per-connection errors.
    pub log_errors: bool,
    /// Queues of the front end (ublk, vhost-user, VDUSE); default one per CPU.
    pub queues: Option<u16>,
    /// Where to write the server's pid once it serves.
    pub pid_file: Option<PathBuf>,
    /// SIGTERM/SIGINT are taken by a signal thread started first and mean `close`
    /// (without `--force`); otherwise the caller routes them.
    pub take_signals: bool,
}

impl Start {
    /// Checks the name and the exposure, chooses the front end and claims the runtime
    /// directory. An automatic choice that passed a front end over says why through
    /// `prompt`'s notice.
    ///
    /// # Errors
    /// An invalid or taken name (busy), the exposure's refusal, a front end that cannot
    /// work here (device) or does not fit `--fuse`/`--vhost-socket` (invalid), a
    /// `--recover` of a vhost-user instance that left no socket (device) or with another
    /// socket (invalid).
    pub fn claim(self, prompt: &mut dyn Prompt) -> Result<Claimed> {
        runtime::check_name(&self.name)?;
        let tls = self.exposure.check(prompt)?;
        let kind = self.choose_frontend(prompt)?;
        let mut vhost_socket = self.vhost_socket;
        if self.recover && kind == FrontendKind::VhostUser {
            // The VM reconnects where it was: the dead instance's socket.
            let socket = frontend::vhost_user_recovery(&self.name)?;
            match &vhost_socket {
                Some(p) if *p != socket => {
                    return Err(Error::Invalid(format!(
                        "--recover serves the socket instance {} had, {}, not {}",
                        self.name,
                        socket.display(),
                        p.display()
                    )))
                }
                _ => vhost_socket = Some(socket),
            }
        }
        let dir = InstanceDir::create(&self.name, self.recover)?;
        let endpoint = match self.exposure.endpoint {
            Endpoint::Private => Endpoint::Unix {
                path: dir.paths.socket(),
                group: None,
            },
            asked => asked,
        };
        Ok(Claimed {
            dir,
            kind,
            tls,
            endpoint,
            fuse_dir: self.fuse_dir,
            vhost_socket,
            ublk_poll: self.ublk_poll,
            recover: self.recover,
        })
    }

    /// The front end asked for, or the one `--recover`, `--fuse` or `--vhost-socket`
    /// implies, or the automatic choice; checked to work here.
    fn choose_frontend(&self, prompt: &mut dyn Prompt) -> Result<FrontendKind> {
        let kind = match self.frontend {
            Choice::Kind(k) => k,
            // `--recover`: the kind of device the dead instance left behind.
            Choice::Auto if self.recover => {
                frontend::recover_kind(&self.name).unwrap_or_else(frontend::auto)
            }
            Choice::Auto if self.fuse_dir.is_some() => FrontendKind::Fuse,
            Choice::Auto if self.vhost_socket.is_some() => FrontendKind::VhostUser,
            Choice::Auto => {
                // One line whenever the choice passed something over: a user who expected
                // a block device learns why the volume is a FUSE file or a bare NBD socket.
                let (kind, skipped) = frontend::auto_explained();
                if !skipped.is_empty() {
                    prompt.notice(&format!(
                        "ucrypt: --device auto: {} ({})",
                        kind.as_str(),
                        skipped.join("; ")
                    ));
                }
                kind
            }
        };
        if self.fuse_dir.is_some() && kind != FrontendKind::Fuse {
            return Err(Error::Invalid(
                "--fuse DIR needs --device fuse (or auto)".into(),
            ));
        }
        if self.vhost_socket.is_some() && kind != FrontendKind::VhostUser {
            return Err(Error::Invalid(
                "--vhost-socket PATH needs --device vhost-user (or auto)".into(),
            ));
        }
        if self.ublk_poll.is_some() && kind != FrontendKind::Ublk {
            return Err(Error::Invalid(format!(
                "--ublk-poll USECS needs --device ublk (the front end here is {})",
                kind.as_str()
            )));
        }
        frontend::check(kind)?;
        Ok(kind)
    }
}

impl Claimed {
    /// Describes what `what` serves and locks its images (`shared`: beside other shared
    /// mappings; else exclusively): every real device a table names (not the
    /// `/dev/mapper/NAME` links between its own stacked devices), or the header's device
    /// and its detached header.
    ///
    /// # Errors
    /// A table without a crypt target (invalid); an image in use (busy) or that cannot
    /// be locked (device).
    pub fn lock(self, what: What, read_only: bool, shared: bool) -> Result<Locked> {
        let mut desc = Description {
            name: self.dir.paths.name.clone(),
            read_only,
            frontend: self.kind.as_str().to_string(),
            from_header: matches!(what, What::Header { .. }),
            header: match &what {
                What::Header {
                    header: Some(h), ..
                } => Some(h.display().to_string()),
                _ => None,
            },
            ..Description::default()
        };
        let mut devices: Vec<PathBuf> = Vec::new();
        // `integritysetup open`: one dm-integrity target with its own hash, served by itself.
        let standalone = match &what {
            What::Table {
                mapping,
                raw: false,
            } => crate::integrity::standalone_line(mapping),
            _ => None,
        };
        let device = match &what {
            What::Table { .. } if standalone.is_some() => {
                let line =
                    standalone.ok_or_else(|| Error::Invalid("no integrity target".into()))?;
                desc.kind = "INTEGRITY".into();
                desc.size_sectors = line.length;
                desc.sector_size = 512;
                let p = PathBuf::from(line.device.to_string());
                devices.push(p.clone());
                // A separate metadata device is locked like the data device.
                if let Some(m) = &line.meta_device {
                    devices.push(PathBuf::from(m.to_string()));
                }
                desc.device = p.display().to_string();
                p
            }
            What::Table { mapping, raw } => {
                let first = mapping
                    .crypt_lines()
                    .last()
                    .ok_or_else(|| Error::Invalid("the table has no crypt target".into()))?;
                server::describe_table(first, if *raw { "RAW" } else { "TABLE" }, &mut desc);
                desc.size_sectors = mapping.size_bytes() / 512;
                for path in mapping.crypt_lines().filter_map(|l| l.device.path()) {
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
            What::Header { device, .. } => {
                devices.push(device.clone());
                device.clone()
            }
        };
        let header = match &what {
            What::Header { header, .. } => header.clone(),
            What::Table { .. } => None,
        };
        // Absolute paths in the description: other processes (status, the lock holder
        // lookup) resolve them from elsewhere.
        if !crate::remote_header::is_remote(&device) {
            if let Ok(abs) = std::fs::canonicalize(&device) {
                desc.device = abs.display().to_string();
            }
            if let Some(h) = &header {
                if let Ok(abs) = std::fs::canonicalize(h) {
                    desc.header = Some(abs.display().to_string());
                }
            }
        }
        let mode = if shared {
            LockMode::Shared
        } else {
            LockMode::Exclusive
        };
        let mut locks = Vec::new();
        for d in devices.iter().chain(header.as_ref()) {
            locks.extend(lock::lock_image(d, mode)?);
        }
        if let Some(line) = standalone {
            // Read once the image is ours: the superblock cannot change under it.
            let st = crate::integrity::describe(line)?;
            desc.sector_size = st.sector_size;
            desc.integrity_target = Some(st);
        }
        Ok(Locked {
            _locks: locks,
            desc,
            what: Some(what),
            unlocked: None,
            claimed: self,
        })
    }
}

impl Locked {
    /// Whether a header must be unlocked ([`Locked::unlocked`]) before [`Locked::serve`].
    pub fn needs_unlock(&self) -> bool {
        matches!(self.what, Some(What::Header { .. })) && self.unlocked.is_none()
    }

    /// Takes the unlocked header: stores `persist`'s flags in it first (after the
    /// passphrase proved right, as cryptsetup stores them on activation; a remote
    /// header through `staging`), then describes the volume.
    ///
    /// # Errors
    /// Storing the flags (not a LUKS2 header, the write failed), with cryptsetup's kind.
    pub fn unlocked(
        &mut self,
        unlocked: Unlocked,
        hopts: HeaderOptions,
        persist: Option<Persist>,
        staging: &Staging,
    ) -> Result<()> {
        let Some(What::Header { device, header }) = &self.what else {
            return Err(Error::Invalid("a table instance has no header".into()));
        };
        if let Some(p) = persist {
            store_persistent(device, header.as_deref(), p, staging)?;
        }
        let kind_name = unlocked
            .info
            .kind
            .map_or_else(|| "VOLUME".to_string(), |k| k.to_string());
        let shown = self.desc.device.clone();
        server::describe_table(unlocked.first_line(), &kind_name, &mut self.desc);
        server::describe_integrity(&unlocked, &mut self.desc);
        self.desc.device = if shown.is_empty() {
            device.display().to_string()
        } else {
            shown
        };
        self.desc.size_sectors = unlocked.size_bytes() / 512;
        self.desc.uuid = unlocked.info.uuid.clone();
        self.unlocked = Some((unlocked, hopts));
        Ok(())
    }

    /// Serves the instance until `close` (or SIGTERM/SIGINT with
    /// [`Serving::take_signals`]): the volume built with the front end's engine defaults,
    /// the NBD endpoint bound, [`server::serve`]. Once everything is up, the pid file is
    /// written and `ready` is called with what users open (the node, or the NBD URI) and
    /// the stable link to it, if there is one.
    ///
    /// # Errors
    /// The signal thread (invalid); building the volume (a header's by cryptsetup's kind,
    /// a table's as an open's); binding; the pid file; the server's failure.
    pub fn serve(
        &mut self,
        serving: Serving,
        ready: impl FnOnce(&str, Option<&Path>),
    ) -> Result<()> {
        // Before any other thread: only the signal thread takes SIGTERM/SIGINT, and hands
        // them to the server, for which each one means `close` (refused while in use).
        let signals = if serving.take_signals {
            let (signal_tx, signals) = std::sync::mpsc::channel();
            crate::export::on_signals(move |sig| {
                let _ = signal_tx.send(sig);
            })
            .map_err(|e| Error::from(e).with_kind(ErrorKind::Invalid))?;
            Some(signals)
        } else {
            None
        };
        let kind = self.claimed.kind;
        let opts = OpenOptions {
            read_only: serving.read_only,
            cache: serving.cache,
            allow_large_sectors: serving.allow_large_sectors,
            perf: frontend::perf_defaults(kind, serving.perf),
        };
        let (input, raw) = match self.what.take() {
            None => return Err(Error::Invalid("the instance was served already".into())),
            Some(What::Table { mapping, raw: true }) => (Input::Raw(mapping), true),
            Some(What::Table { mapping, .. }) => (Input::Table(mapping), false),
            Some(What::Header { device, .. }) => {
                let Some((unlocked, hopts)) = self.unlocked.take() else {
                    return Err(Error::Invalid("the header is not unlocked".into()));
                };
                let input = Input::Header {
                    unlocked: Box::new(unlocked),
                    hopts: Box::new(hopts),
                    device,
                };
                (input, false)
            }
        };
        // A device that outlives its server (ublk, kernel NBD; given to a new server by
        // --recover) must have every completed write on an OSD: librbd write-through.
        if self.claimed.recover || matches!(kind, FrontendKind::Ublk | FrontendKind::Nbd) {
            crate::settings::set_rbd_writethrough(true);
        }
        let header_mode = matches!(input, Input::Header { .. });
        let built = server::build(input, opts).map_err(|e| {
            let kind = if header_mode {
                chain_kind(&e)
            } else {
                open_kind(&e)
            };
            e.with_kind(kind)
        })?;
        // The NBD socket: the endpoint asked for, or nbd.sock in the runtime directory.
        let Bound {
            listener,
            mut cleanup,
            ..
        } = self.claimed.endpoint.bind(false)?;
        let config = server::Config {
            frontend: kind,
            opts,
            raw,
            max_connections: serving.max_connections,
            workers: serving.workers,
            log_errors: serving.log_errors,
            tls: self.claimed.tls.clone(),
            fuse_dir: self.claimed.fuse_dir.clone(),
            recover: self.claimed.recover,
            vhost_socket: self.claimed.vhost_socket.clone(),
            ublk_poll: self.claimed.ublk_poll,
            queues: serving.queues,
            signals,
        };
        let dir = &self.claimed.dir;
        let pid_file = serving.pid_file;
        let desc = self.desc.clone();
        let served = server::serve(
            dir,
            desc,
            built,
            listener,
            config,
            Shutdown::default(),
            |shown| {
                if let Some(p) = &pid_file {
                    cleanup.write_pid_file(p)?;
                }
                let link = runtime::stable_path(&dir.paths.name);
                let link = std::fs::symlink_metadata(&link).is_ok().then_some(link);
                ready(shown, link.as_deref());
                Ok(())
            },
        );
        drop(cleanup);
        served
    }
}

/// Stores `persist`'s activation flags in the LUKS2 header of `device` (or the detached
/// `header`), a remote one staged through `staging`.
fn store_persistent(
    device: &Path,
    header: Option<&Path>,
    persist: Persist,
    staging: &Staging,
) -> Result<()> {
    let header = match header {
        Some(h) => Some(staging.local_path(h, true)?),
        None => None,
    };
    let device = staging.local_path(device, header.is_none())?;
    let as_cryptsetup = |e: Error| {
        let kind = chain_kind(&e);
        e.with_kind(kind)
    };
    let mut cd = crate::header::crypt_device(&device, header.as_deref()).map_err(as_cryptsetup)?;
    crate::header::load_luks(&mut cd, VolumeType::Luks2).map_err(as_cryptsetup)?;
    crate::luks::store_persistent_flags(&mut cd, &persist.perf, persist.allow_discards)
        .map_err(as_cryptsetup)
}
