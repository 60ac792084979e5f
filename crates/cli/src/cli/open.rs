//! `ucrypt open`: serve a table's decrypted view over NBD, in the foreground, like nbdkit.
//!
//! ```text
//! ucrypt open --table LINE | --table-file PATH | DEVICE [NAME] [--type luks|luks1|luks2|plain]
//!             [--socket PATH | --listen ADDR:PORT] [--run 'CMD'] [--pid-file FILE]
//!             [--read-only] [--raw]
//!             [--tls=off|on|require (--tls-certificates DIR [--tls-verify-peer] | --tls-psk FILE)]
//! ```
//!
//! **TLS** as nbdkit offers it: `--tls=on` offers `NBD_OPT_STARTTLS`, `--tls=require`
//! refuses clients that do not upgrade. Credentials are x509 (`--tls-certificates DIR`
//! with `server-cert.pem`, `server-key.pem` and, for `--tls-verify-peer`, `ca-cert.pem`)
//! or pre-shared keys (`--tls-psk FILE`, `username:hexkey` lines). The printed URI then
//! starts `nbds://` / `nbds+unix://`.
//!
//! **Where it serves.** Without `--socket`/`--listen`, on a private unix socket: mode 0600 in
//! a fresh directory of the caller's, mode 0700, removed when the server stops. The
//! decrypted volume is never on a TCP port by default, loopback included: any local user (or
//! container sharing the host's network) could connect there. `--listen` needs
//! `--tls=require` with credentials, or `--allow-cleartext-tcp` to say the user means it.
//!
//! **Readiness.** The server is ready when the socket is listening. At that moment (and not
//! before) the pid file is written (atomically: written aside, then renamed into place) and,
//! unless `--run` is given, the export's URI is printed as one line on stdout
//! (`nbd+unix:///?socket=PATH` or `nbd://127.0.0.1:PORT/`). A script can wait for either.
//!
//! **`--run 'CMD'`** runs `sh -c CMD` once the server is ready, with `$uri`, `$nbd` (the
//! same URI), `$unixsocket` (unix sockets) or `$port` (TCP) and `$exportname` set; when CMD
//! exits, the server shuts down (in-flight requests finish, the export is flushed) and
//! `ucrypt open` exits with CMD's status.
//!
//! **Signals.** SIGTERM/SIGINT shut down the same way (a second one exits at once).
//!
//! The table line (and its key) is never printed or logged.

use super::exit::lib_error;
use super::prompt::Terminal;
use super::{CliError, PerfArgs, TableArg, WithCode, EXIT_PARAMS};
use std::io::Write;
use std::path::PathBuf;
use ucrypt::export::{Ended, Endpoint, Exposure, ServeOptions, Shutdown, Tls, TlsMode};
use ucrypt::instance::frontend::Choice;
use ucrypt::open::{Opened, Source};

/// Arguments of `ucrypt open`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// The dm-crypt table line: '<start> <length> crypt <cipher> <key> <iv_offset> <device> <offset> [<#opts> <opts>...]'.
    #[arg(help_heading = "Unlock options", long, conflicts_with = "table_file")]
    table: Option<String>,
    /// Read the table from a file ('-' for standard input): one line, several targets of one
    /// device, or several devices as `NAME: <line>` stacked through /dev/mapper/NAME.
    #[arg(help_heading = "Unlock options", long, value_name = "PATH")]
    table_file: Option<PathBuf>,
    #[command(flatten, next_help_heading = "Unlock options")]
    pub(super) header: super::open_header::HeaderArgs,
    /// Stay in the foreground (a named instance otherwise goes to the background once
    /// its device is ready).
    #[arg(help_heading = "Serving options", long)]
    pub(super) foreground: bool,
    /// For a systemd service of Type=notify: stay in the foreground (this process is the
    /// server) and send READY=1 to $NOTIFY_SOCKET once the device (or socket) is ready; a
    /// passphrase is asked through systemd-ask-password when there is no terminal.
    #[arg(help_heading = "Serving options", long)]
    pub(super) notify: bool,
    /// The front end of a named instance: ublk (/dev/ublkbN), nbd (/dev/nbdN), fuse (a
    /// file, DIR/NAME), vhost-user (a socket a VM attaches as a virtio-blk disk), vduse
    /// (/dev/vdX, a virtio-blk disk of this host through VDUSE and virtio_vdpa), none (the
    /// NBD socket only) or auto (the first of ublk, nbd, fuse that works here).
    #[arg(help_heading = "Device options",
        long = "device",
        id = "frontend",
        default_value = "auto",
        value_name = "KIND",
        value_parser = frontend_parser(&Choice::NAMES)
    )]
    pub(super) frontend: Choice,
    /// Crash recovery: the server of NAME died (killed, crashed) and its device waits, with
    /// whatever is mounted on it; open the same volume again and reattach to that device
    /// instead of creating one. ublk (user recovery): requests in flight are re-issued, no
    /// deadline. Kernel NBD: new connections replace the dead ones (NBD_CMD_RECONFIGURE)
    /// within the device's 30 s dead-connection timeout. Without --device, the kind the
    /// dead instance used.
    #[arg(help_heading = "Device options", long)]
    pub(super) recover: bool,
    /// FUSE: mount at DIR and expose the volume as DIR/NAME (default: the instance's
    /// runtime directory).
    #[arg(help_heading = "Device options", long, value_name = "DIR")]
    pub(super) fuse: Option<PathBuf>,
    /// vhost-user: listen for the VM at PATH (mode 0600; default: vhost-user.sock in the
    /// instance's runtime directory).
    #[arg(help_heading = "Device options", long, value_name = "PATH")]
    pub(super) vhost_socket: Option<PathBuf>,
    /// ublk: after each round of requests a queue thread keeps polling for the next one for
    /// up to USECS microseconds before it sleeps (1..=100000), runs requests on its own
    /// thread, and may run on any CPU. Lower latency for small requests at the price of up
    /// to one CPU per busy queue (in the kernel lab: 4 KiB requests 1.2-2.4x as fast as
    /// dm-crypt, one more CPU busy).
    #[arg(help_heading = "Device options", long, value_name = "USECS", value_parser = super::bounded::<1, 100000>)]
    pub(super) ublk_poll: Option<usize>,
    /// Queues of the device (ublk, vhost-user, vduse: default one per CPU; 1..=64).
    #[arg(help_heading = "Device options", long, value_name = "N", value_parser = super::bounded::<1, 64>)]
    pub(super) queues: Option<usize>,
    /// Share the image with other --shared mappings (without it a mapping holds the image
    /// exclusively).
    #[arg(help_heading = "Device options", long)]
    pub(super) shared: bool,
    /// Serve on a unix socket at PATH (mode 0600). Without --socket or --listen: a private
    /// socket (0600, in a fresh 0700 directory of the caller's), printed as the URI.
    #[arg(
        help_heading = "Serving options",
        long,
        value_name = "PATH",
        conflicts_with = "listen"
    )]
    pub(super) socket: Option<PathBuf>,
    /// Serve on TCP ADDR:PORT (port 0 picks a free port; a bare PORT means
    /// 127.0.0.1:PORT). Needs --tls=require with credentials, or --allow-cleartext-tcp.
    #[arg(help_heading = "Serving options", long, value_name = "ADDR:PORT")]
    pub(super) listen: Option<String>,
    /// Allow --listen without --tls=require: the decrypted volume is then served in the
    /// clear, with no authentication, to whoever reaches the port (on loopback every local
    /// user and every container sharing this host's network); a warning is printed.
    #[arg(
        help_heading = "Serving options",
        long,
        alias = "allow-cleartext-network"
    )]
    pub(super) allow_cleartext_tcp: bool,
    /// With --socket: make the socket 0660 owned by GROUP (a name or number) so its
    /// members may connect; without it the socket is 0600 (only this user), whatever the
    /// umask.
    #[arg(
        help_heading = "Serving options",
        long,
        value_name = "GROUP",
        requires = "socket"
    )]
    pub(super) socket_group: Option<String>,
    /// Run CMD (via sh -c) once serving, with $uri, $nbd, $unixsocket/$port set; stop when
    /// it exits and return its status.
    #[arg(help_heading = "Serving options", long, value_name = "CMD")]
    pub(super) run: Option<String>,
    /// Write the server's pid to FILE once it is listening.
    #[arg(help_heading = "Serving options", long, value_name = "FILE")]
    pub(super) pid_file: Option<PathBuf>,
    /// LUKS2: store the activation flags given here (--allow-discards and the --perf-*
    /// flags) in the header's persistent flags, replacing the stored set, as cryptsetup's
    /// `open --persistent` does; later opens apply them without being told.
    #[arg(help_heading = "Unlock options", long)]
    pub(super) persistent: bool,
    /// Export read-only (cryptsetup's `--readonly`/`-r` are accepted too).
    #[arg(
        help_heading = "Device options",
        long,
        short = 'r',
        visible_alias = "readonly"
    )]
    pub(super) read_only: bool,
    /// Export the table's device as it is (ciphertext, no encryption): a baseline.
    #[arg(help_heading = "Device options", long)]
    pub(super) raw: bool,
    /// Connections served at once (1..=65536; multi-conn is advertised only above 1).
    #[arg(help_heading = "Serving options", long, default_value_t = 16, value_parser = super::bounded::<1, 65536>)]
    pub(super) max_connections: usize,
    /// Threads per connection, each receiving, running and answering requests (0 or 1: one
    /// request at a time, in the thread that reads the socket; at most 128). Default 8; 32
    /// for an rbd:POOL/IMAGE or NBD URI device, whose requests wait for a network round
    /// trip. With --device vhost-user or vduse: requests each queue keeps in flight.
    #[arg(help_heading = "Serving options", long, value_parser = super::bounded::<0, { ucrypt::export::MAX_WORKERS }>)]
    pub(super) nbd_workers: Option<usize>,
    /// Accept sector sizes above 4096 (the kernel cannot open such a volume).
    #[arg(help_heading = "Device options", long)]
    pub(super) large_sectors: bool,
    #[command(flatten, next_help_heading = "Device options")]
    pub(super) cache: super::CacheArgs,
    #[command(flatten, next_help_heading = "Engine options")]
    pub(super) perf: PerfArgs,
    /// TLS: off (default), on (offered), require (plaintext clients refused).
    #[arg(help_heading = "TLS options", long, value_enum, default_value_t = TlsArg::Off, value_name = "off|on|require")]
    tls: TlsArg,
    /// x509 credentials: DIR holds server-cert.pem, server-key.pem (and ca-cert.pem for
    /// --tls-verify-peer), as nbdkit's --tls-certificates.
    #[arg(
        help_heading = "TLS options",
        long,
        value_name = "DIR",
        conflicts_with = "tls_psk"
    )]
    tls_certificates: Option<PathBuf>,
    /// With x509: refuse clients without a certificate signed by DIR/ca-cert.pem.
    #[arg(help_heading = "TLS options", long, requires = "tls_certificates")]
    tls_verify_peer: bool,
    /// Pre-shared keys: FILE holds "username:hexkey" lines (GnuTLS psktool format).
    #[arg(help_heading = "TLS options", long, value_name = "FILE")]
    tls_psk: Option<PathBuf>,
    /// Print per-connection errors on stderr.
    #[arg(help_heading = "Serving options", long, short)]
    pub(super) verbose: bool,
    /// A table another command built (`integritysetup open`), served as --table's would
    /// be.
    #[arg(skip)]
    pub(super) built_table: Option<ucrypt::format::Mapping>,
}

/// A `--device KIND` parser: clap refuses a name not in `names` (listing them), the
/// library's [`Choice`] parser reads the rest.
pub(super) fn frontend_parser(
    names: &[&'static str],
) -> impl clap::builder::TypedValueParser<Value = Choice> {
    use clap::builder::TypedValueParser as _;
    clap::builder::PossibleValuesParser::new(names.iter().copied()).try_map(|s| s.parse::<Choice>())
}

/// `--tls`: nbdkit's values.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum TlsArg {
    Off,
    On,
    Require,
}

impl From<TlsArg> for TlsMode {
    fn from(t: TlsArg) -> TlsMode {
        match t {
            TlsArg::Off => TlsMode::Off,
            TlsArg::On => TlsMode::On,
            TlsArg::Require => TlsMode::Require,
        }
    }
}

/// Where and how the options serve ([`Exposure::check`] judges it).
pub(super) fn exposure(a: &Args) -> Exposure {
    let endpoint = match (&a.socket, &a.listen) {
        (Some(path), _) => Endpoint::Unix {
            path: path.clone(),
            group: a.socket_group.clone(),
        },
        (None, Some(listen)) => Endpoint::Tcp(listen.clone()),
        (None, None) => Endpoint::Private,
    };
    Exposure {
        endpoint,
        tls: Tls {
            mode: a.tls.into(),
            certificates: a.tls_certificates.clone(),
            verify_peer: a.tls_verify_peer,
            psk: a.tls_psk.clone(),
        },
        allow_cleartext_tcp: a.allow_cleartext_tcp,
    }
}

/// The engine and device options of `a`.
pub(super) fn open_options(a: &Args) -> ucrypt::OpenOptions {
    ucrypt::OpenOptions {
        read_only: a.read_only,
        cache: a.cache.cache(),
        allow_large_sectors: a.large_sectors,
        perf: a.perf.options(),
    }
}

/// The table of `a`: the one a command built, or the table input (`--table`/
/// `--table-file`, read once: it may be standard input).
pub(super) fn table(a: &mut Args) -> Result<ucrypt::format::Mapping, CliError> {
    if let Some(m) = a.built_table.take() {
        return Ok(m);
    }
    TableArg {
        table: a.table.clone(),
        table_file: a.table_file.clone(),
    }
    .mapping()
}

/// Checks the positional arguments and returns the instance name when `a` opens a named
/// instance (`ucrypt open DEV NAME` or `--table LINE NAME`, without `--run` or
/// `--test-passphrase`), which `instance::run` serves; `None` for [`run`]'s foreground
/// export.
pub(crate) fn instance_name(a: &mut Args) -> Result<Option<String>, CliError> {
    // `open --table LINE NAME`: the one positional is the name, not a device.
    let has_table = a.table.is_some() || a.table_file.is_some() || a.built_table.is_some();
    if has_table && a.header.device.is_some() {
        if a.header.name.is_some() || a.header.kind.is_some() || a.header.header.is_some() {
            return Err(anyhow::anyhow!(
                "give either a DEVICE or --table/--table-file, not both"
            ))
            .code(EXIT_PARAMS);
        }
        a.header.name = a
            .header
            .device
            .take()
            .map(|d| d.to_string_lossy().into_owned());
    }
    if !has_table && a.header.device.is_none() {
        return Err(anyhow::anyhow!(
            "give a DEVICE (with an optional NAME), or --table/--table-file"
        ))
        .code(EXIT_PARAMS);
    }
    Ok(a.header
        .name
        .clone()
        .filter(|_| a.run.is_none() && !a.header.test_passphrase))
}

/// `ucrypt open` without an instance name (after [`instance_name`]): serves in the
/// foreground until SIGTERM/SIGINT or `--run`'s command ends.
pub(crate) fn run(mut a: Args) -> Result<(), CliError> {
    if a.notify {
        super::secret::set_ask_password(true);
    }
    // First, before any thread exists (the engine starts workers): threads inherit the
    // blocked mask, so only the signal thread ever takes SIGTERM/SIGINT.
    let shutdown = Shutdown::default();
    ucrypt::export::shutdown_on_signals(&shutdown).code(EXIT_PARAMS)?;
    let mut prompt = Terminal::new(&a.header.tcrypt.progress);
    let exposure = exposure(&a);
    // TLS credentials are checked before a passphrase is asked for or a volume opened.
    let tls = exposure.check(&mut prompt).map_err(lib_error)?;

    let source = if a.header.device.is_some() {
        // No image lock is held here: a crashed reencryption hotzone is refused, not
        // recovered.
        Source::Header(Box::new(a.header.request(false)?))
    } else if a.raw {
        Source::Raw(table(&mut a)?)
    } else {
        Source::Table(table(&mut a)?)
    };
    let opened = ucrypt::open::open_source(source, open_options(&a), &mut prompt);
    let (export, description) = match opened.map_err(lib_error)? {
        Opened::Checked => return Ok(()),
        Opened::Volume {
            volume,
            description,
        } => (volume, description),
    };

    let mut bound = exposure.endpoint.bind(tls.is_some()).map_err(lib_error)?;
    if let Some(p) = &a.pid_file {
        bound.cleanup.write_pid_file(p).map_err(lib_error)?;
    }
    if a.run.is_none() {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", bound.uri)?;
        out.flush()?;
    }
    if a.notify {
        super::daemon::notify_ready(&bound.uri);
    }
    let opts = ServeOptions {
        description,
        read_only: a.read_only,
        max_connections: a.max_connections,
        workers: a.nbd_workers(),
        shutdown,
        log_errors: a.verbose,
        tls,
        ..ServeOptions::default()
    };
    match bound
        .serve(export, opts, a.run.as_deref())
        .map_err(lib_error)?
    {
        Ended::Stopped => Ok(()),
        // The server is down and flushed, files are cleaned up: hand back CMD's status.
        Ended::Command(status) => std::process::exit(status),
    }
}

impl Args {
    /// `--nbd-workers`, or the library's default for the device
    /// ([`ucrypt::export::default_workers`]: more threads for a device a network away).
    pub(super) fn nbd_workers(&self) -> usize {
        self.nbd_workers
            .unwrap_or_else(|| ucrypt::export::default_workers(self.header.device.as_deref()))
    }
}
