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

use super::{CliError, PerfArgs, TableArg, WithCode, EXIT_DEVICE, EXIT_PARAMS};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use ucrypt::export::{Listener, ServeOptions, Shutdown, TlsConfig, TlsMode};
use ucrypt::open::Backend;

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
    /// file, DIR/NAME), vhost-user (a socket a VM attaches as a virtio-blk disk), none
    /// (the NBD socket only) or auto (the first of ublk, nbd, fuse that works here).
    #[arg(help_heading = "Device options",
        long = "device",
        id = "frontend",
        default_value = "auto",
        value_name = "KIND",
        value_parser = ["auto", "ublk", "nbd", "fuse", "vhost-user", "none"]
    )]
    pub(super) frontend: String,
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
    /// Queues of the device (ublk, vhost-user: default one per CPU; 1..=64).
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
    socket_group: Option<String>,
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
    /// trip.
    #[arg(help_heading = "Serving options", long, value_parser = super::bounded::<0, { ucrypt::export::MAX_WORKERS }>)]
    pub(super) nbd_workers: Option<usize>,
    /// Accept sector sizes above 4096 (the kernel cannot open such a volume).
    #[arg(help_heading = "Device options", long)]
    pub(super) large_sectors: bool,
    /// Bypass the page cache on the device (O_DIRECT).
    #[arg(help_heading = "Device options", long)]
    pub(super) direct: bool,
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
}

/// `--tls`: nbdkit's values.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum TlsArg {
    Off,
    On,
    Require,
}

/// The TLS configuration the options ask for (`None`: no TLS).
pub(super) fn tls_config(a: &Args) -> Result<Option<Arc<TlsConfig>>, CliError> {
    let mode = match a.tls {
        TlsArg::Off => {
            if a.tls_certificates.is_some() || a.tls_psk.is_some() {
                return Err(anyhow::anyhow!(
                    "--tls-certificates/--tls-psk need --tls=on or --tls=require"
                ))
                .code(EXIT_PARAMS);
            }
            return Ok(None);
        }
        TlsArg::On => TlsMode::On,
        TlsArg::Require => TlsMode::Require,
    };
    let config = match (&a.tls_certificates, &a.tls_psk) {
        (Some(dir), None) => TlsConfig::x509(dir, a.tls_verify_peer, mode),
        (None, Some(file)) => TlsConfig::psk(file, mode),
        _ => {
            return Err(anyhow::anyhow!(
                "--tls=on/require needs --tls-certificates DIR or --tls-psk FILE"
            ))
            .code(EXIT_PARAMS)
        }
    };
    Ok(Some(Arc::new(
        config.map_err(anyhow::Error::from).code(EXIT_PARAMS)?,
    )))
}

/// Removes a path when dropped (the pid file, the private socket directory).
pub(super) struct Cleanup(pub(super) Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in self.0.iter().rev() {
            if p.is_dir() {
                let _ = std::fs::remove_dir_all(p);
            } else {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// The table input of `a` (`--table`/`--table-file`).
pub(super) fn table_arg(a: &Args) -> TableArg {
    TableArg {
        table: a.table.clone(),
        table_file: a.table_file.clone(),
    }
}

/// Checks the positional arguments and returns the instance name when `a` opens a named
/// instance (`ucrypt open DEV NAME` or `--table LINE NAME`, without `--run` or
/// `--test-passphrase`), which `instance::run` serves; `None` for [`run`]'s foreground
/// export.
pub(crate) fn instance_name(a: &mut Args) -> Result<Option<String>, CliError> {
    // `open --table LINE NAME`: the one positional is the name, not a device.
    let has_table = a.table.is_some() || a.table_file.is_some();
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
pub(crate) fn run(a: Args) -> Result<(), CliError> {
    if a.notify {
        super::secret::set_ask_password(true);
    }
    // First, before any thread exists (the engine starts workers): threads inherit the
    // blocked mask, so only the signal thread ever takes SIGTERM/SIGINT.
    let shutdown = Shutdown::default();
    ucrypt::export::shutdown_on_signals(&shutdown).code(EXIT_PARAMS)?;
    // TLS credentials are checked before a passphrase is asked for or a volume opened.
    let tls = tls_config(&a)?;
    check_exposure(&a, tls.is_some())?;

    let (export, description) = if a.header.device.is_some() {
        let opts = ucrypt::OpenOptions {
            read_only: a.read_only,
            direct: a.direct,
            allow_large_sectors: a.large_sectors,
            perf: a.perf.options(),
        };
        match super::open_header::export(&a.header, opts)? {
            super::open_header::HeaderExport::Checked => return Ok(()),
            super::open_header::HeaderExport::Serve(v, d) => (v, d),
        }
    } else {
        open_export(&a)?
    };

    let mut cleanup = Cleanup(Vec::new());
    let listener = listen(&a, &mut cleanup)?;
    let mut uri = listener.uri();
    if tls.is_some() {
        // libnbd's scheme for "TLS required": nbds:// and nbds+unix://.
        uri.replace_range(..3, "nbds");
    }
    if let Some(p) = &a.pid_file {
        write_pid_file(p)?;
        cleanup.0.push(p.clone());
    }
    let env = run_env(&listener, &uri);
    if a.run.is_none() {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{uri}")?;
        out.flush()?;
    }
    if a.notify {
        super::daemon::notify_ready(&uri);
    }

    let opts = ServeOptions {
        description,
        read_only: a.read_only,
        max_connections: a.max_connections,
        workers: a.nbd_workers(),
        shutdown: shutdown.clone(),
        log_errors: a.verbose,
        tls,
        ..ServeOptions::default()
    };
    let server = std::thread::Builder::new()
        .name("nbd-accept".into())
        .spawn(move || ucrypt::export::serve(listener, export, opts))?;

    let Some(cmd) = &a.run else {
        let served = server
            .join()
            .map_err(|_| anyhow::anyhow!("the server thread panicked"))?;
        drop(cleanup);
        return served.map_err(anyhow::Error::from).code(EXIT_DEVICE);
    };

    // Without a terminal (scripts, service managers) CMD gets a process group of its own,
    // so that a signal to ucrypt reaches everything CMD started (`sh -c 'a; b'` would
    // otherwise leave `a` running); on a terminal it stays in the foreground group, where
    // Ctrl-C reaches it directly and it may read the terminal.
    // SAFETY: isatty only inspects the descriptor.
    let own_group = unsafe { libc::isatty(libc::STDIN_FILENO) } != 1;
    let mut command = std::process::Command::new("sh");
    command.arg("-c").arg(cmd).envs(env);
    if own_group {
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
    }
    // This thread blocks SIGINT/SIGTERM (only the signal thread takes them) and a child
    // inherits the mask: unblock everything in the child, or CMD (and all it starts) could
    // never be stopped by a signal.
    // SAFETY: the closure runs between fork and exec and calls only sigemptyset and
    // pthread_sigmask, which are async-signal-safe, on a local sigset_t.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .map_err(|e| anyhow::anyhow!("starting --run command: {e}"))?;
    let pid = child.id();
    let child_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let waiter = {
        let shutdown = shutdown.clone();
        let done = Arc::clone(&child_done);
        std::thread::spawn(move || {
            let status = child.wait();
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            shutdown.trigger();
            status
        })
    };
    // SIGTERM/SIGINT to ucrypt (the signal thread triggers `shutdown`) go on to CMD at
    // once, and ucrypt waits for it below: CMD's clients finish before the server stops.
    {
        let shutdown = shutdown.clone();
        let done = Arc::clone(&child_done);
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                if shutdown.is_triggered() {
                    signal_child(pid, own_group);
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        });
    }
    let served = server
        .join()
        .map_err(|_| anyhow::anyhow!("the server thread panicked"))?;
    if !child_done.load(std::sync::atomic::Ordering::SeqCst) {
        // The server stopped first (a signal): stop the command too.
        signal_child(pid, own_group);
    }
    let status = waiter
        .join()
        .map_err(|_| anyhow::anyhow!("the --run waiter panicked"))?
        .map_err(|e| anyhow::anyhow!("waiting for --run command: {e}"))?;
    drop(cleanup);
    served.map_err(anyhow::Error::from).code(EXIT_DEVICE)?;
    // The server is down and flushed, files are cleaned up: hand back CMD's status.
    std::process::exit(exit_code(status));
}

/// SIGTERM to the `--run` command: to its whole process group when it has its own.
fn signal_child(pid: u32, own_group: bool) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        let target = if own_group { -pid } else { pid };
        // SAFETY: kill(2) has no memory-safety preconditions; `pid` is our own child (and
        // the leader of its group), not yet reaped while the waiter runs, so not reused.
        unsafe { libc::kill(target, libc::SIGTERM) };
    }
}

/// The decrypted volume, or with `--raw` the table's device as it is.
fn open_export(a: &Args) -> Result<(Arc<dyn Backend>, String), CliError> {
    let opts = ucrypt::OpenOptions {
        read_only: a.read_only,
        direct: a.direct,
        allow_large_sectors: a.large_sectors,
        perf: a.perf.options(),
    };
    if a.raw {
        let mapping = table_arg(a).mapping()?;
        let Some(table) = mapping.single_line() else {
            return Err(anyhow::anyhow!(
                "--raw exports the device of a one-line table; this table has several targets \
                 or devices"
            ))
            .code(EXIT_PARAMS);
        };
        let Some(device) = table.device.device() else {
            return Err(anyhow::anyhow!(
                "--raw exports a device; this table sits on another table"
            ))
            .code(EXIT_PARAMS);
        };
        let file =
            ucrypt::open::open_device(device, a.read_only, a.direct).map_err(super::open_error)?;
        return Ok((file, format!("ucrypt raw export of {}", table.device)));
    }
    super::read::open_input(&table_arg(a), opts)
}

/// The TCP address `--listen` names (a bare PORT means 127.0.0.1:PORT).
fn listen_addr(listen: &str) -> String {
    if listen.contains(':') {
        listen.to_string()
    } else {
        format!("127.0.0.1:{listen}")
    }
}

/// No unauthenticated plaintext on a network port, loopback included: a TCP port has no
/// owner, so on 127.0.0.1 every local user (and every container sharing the host's
/// network) can read and write the volume. `--listen` needs `--tls=require` (with its
/// credentials, which authenticate the client by certificate or pre-shared key) or
/// `--allow-cleartext-tcp`, which serves in the clear with a warning.
pub(super) fn check_exposure(a: &Args, tls: bool) -> Result<(), CliError> {
    let Some(listen) = a.listen.as_deref() else {
        return Ok(()); // unix sockets: 0600, or the group --socket-group names
    };
    // --tls=on only offers TLS: a plaintext client is still served, in the clear.
    if tls && a.tls == TlsArg::Require {
        return Ok(());
    }
    let addr = listen_addr(listen);
    let addrs: Vec<std::net::SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(addr.as_str())
        .map_err(|e| anyhow::anyhow!("--listen {addr}: {e}"))
        .code(EXIT_PARAMS)?
        .collect();
    let reach = if addrs.iter().all(|s| s.ip().is_loopback()) {
        "every local user and every container sharing this host's network"
    } else {
        "other machines"
    };
    let tls_state = if a.tls == TlsArg::On {
        "TLS is only offered (--tls=on serves plaintext clients too)"
    } else {
        "TLS is off"
    };
    if !a.allow_cleartext_tcp {
        return Err(anyhow::anyhow!(
            "--listen {addr}: {tls_state}, so the decrypted volume would be served with no \
             authentication to {reach}; use --tls=require with --tls-certificates or \
             --tls-psk, a unix socket (--socket PATH, or no --listen for a private one), or \
             pass --allow-cleartext-tcp"
        ))
        .code(EXIT_PARAMS);
    }
    eprintln!(
        "ucrypt: warning: serving decrypted data without authentication on {addr}, \
         reachable by {reach} ({tls_state})"
    );
    Ok(())
}

/// Binds the socket the options ask for.
pub(super) fn listen(a: &Args, cleanup: &mut Cleanup) -> Result<Listener, CliError> {
    if let Some(p) = &a.socket {
        let group = a.socket_group.as_deref().map(group_id).transpose()?;
        return Listener::bind_unix_with(p, group)
            .map_err(anyhow::Error::from)
            .code(EXIT_PARAMS);
    }
    let Some(listen) = a.listen.as_deref() else {
        // A private socket (as nbdkit's for --run without a port): 0600 in a directory
        // made by mkdtemp (a fresh random name, mode 0700, never one that already exists),
        // so no other local user can connect, nor put a socket of their own where a
        // client will connect.
        let dir = tempfile::Builder::new()
            .prefix("ucrypt-open-")
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .tempdir()
            .map_err(|e| {
                anyhow::anyhow!(
                    "creating a private socket directory in {}: {e}",
                    std::env::temp_dir().display()
                )
            })?
            .keep();
        cleanup.0.push(dir.clone());
        return Listener::bind_unix(dir.join("nbd.sock"))
            .map_err(anyhow::Error::from)
            .code(EXIT_PARAMS);
    };
    let addr = listen_addr(listen);
    Listener::bind_tcp(addr.as_str())
        .map_err(anyhow::Error::from)
        .code(EXIT_PARAMS)
}

/// The environment `--run` gets (nbdkit's names).
fn run_env(listener: &Listener, uri: &str) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("uri", uri.to_string()),
        ("nbd", uri.to_string()),
        ("exportname", String::new()),
    ];
    if let Some(p) = listener.unix_path() {
        env.push(("unixsocket", p.display().to_string()));
    }
    if let Some(a) = listener.tcp_addr() {
        env.push(("port", a.port().to_string()));
    }
    env
}

/// Writes our pid to `path` atomically (a reader never sees a partial file).
///
/// The file is written under a fresh random name in the same directory (mkstemp:
/// `O_CREAT|O_EXCL`, so never through a symlink someone planted), then renamed over `path`
/// (which replaces a symlink at `path` rather than following it).
pub(super) fn write_pid_file(path: &Path) -> Result<(), CliError> {
    use std::os::unix::fs::PermissionsExt;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let written = (|| {
        let mut tmp = tempfile::Builder::new()
            .prefix(".ucrypt-pid-")
            .tempfile_in(dir)?;
        writeln!(tmp, "{}", std::process::id())?;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))?;
        tmp.persist(path).map_err(|e| e.error)?;
        Ok::<(), std::io::Error>(())
    })();
    written.map_err(|e| anyhow::anyhow!("writing pid file {}: {e}", path.display()))?;
    Ok(())
}

/// A group given by name or number, as its gid.
fn group_id(group: &str) -> Result<u32, CliError> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    let name = std::ffi::CString::new(group)
        .map_err(|_| anyhow::anyhow!("--socket-group {group:?}: not a group name"))
        .code(EXIT_PARAMS)?;
    // SAFETY: `group` is a plain C struct for which all-zero bytes are valid.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 64 * 1024];
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call: a NUL-terminated name, a group struct
    // and a buffer (with its length) that getgrnam_r fills, and the result slot.
    let rc = unsafe {
        libc::getgrnam_r(
            name.as_ptr(),
            &mut grp,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 || found.is_null() {
        return Err(anyhow::anyhow!("--socket-group {group}: no such group")).code(EXIT_PARAMS);
    }
    Ok(grp.gr_gid)
}

/// A child's status as an exit code (signals as 128 + signal number, like the shell).
fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

impl Args {
    /// `--nbd-workers`, or its default: 8, and 32 when the device is an RBD image or an NBD
    /// URI. A request holds its thread until librbd or the remote server answers (a network
    /// round trip), so a client at depth 32 has only as many requests in flight as there
    /// are threads: 4 KiB random writes at depth 32 over `rbd:` went from 1167 to 1868 IOPS
    /// (medians of three alternating runs, bench/rbd.sh's cluster, BENCHMARKING.md), and
    /// over a qemu-nbd export of RBD from 935 and 1159 to 1427 and 2353 (once its
    /// connections carried many requests each). A file backend answers in microseconds,
    /// where 8 threads already keep two CPUs busy.
    pub(super) fn nbd_workers(&self) -> usize {
        self.nbd_workers.unwrap_or_else(|| {
            let remote = self
                .header
                .device
                .as_deref()
                .map(ucrypt::open::DeviceKind::of_path)
                .is_some_and(|k| {
                    matches!(
                        k,
                        ucrypt::open::DeviceKind::Rbd | ucrypt::open::DeviceKind::Nbd
                    )
                });
            if remote {
                32
            } else {
                8
            }
        })
    }
}
