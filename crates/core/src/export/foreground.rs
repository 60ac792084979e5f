//! Serving a volume in the caller's own process until it is told to stop, or, as
//! nbdkit's `--run`, for as long as a command runs beside the server.
//!
//! ```text
//!  Bound::serve ─► NBD server thread (until the Shutdown triggers)
//!    with a command: sh -c CMD, $uri $nbd $unixsocket|$port $exportname set
//!      CMD exits            ─► shutdown (in-flight requests finish, export flushed)
//!      SIGTERM/SIGINT       ─► shutdown, and SIGTERM to CMD (its process group)
//!    ─► the socket's directory and the pid file removed ─► Ended
//! ```

use super::endpoint::Bound;
use super::{Listener, ServeOptions};
use crate::error::{Error, ErrorKind, Result};
use crate::open::Backend;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use ucrypt_nbd::NbdError;

/// How a foreground server ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Stopped by its [`super::Shutdown`] (a signal), the export flushed.
    Stopped,
    /// The command ran beside it exited with this status (a signal `N` as `128 + N`, as
    /// the shell reports it); the export is flushed.
    Command(i32),
}

impl Bound {
    /// Serves `export` with `opts` on this endpoint until `opts.shutdown` triggers or, with
    /// `command`, until `sh -c command` exits (see the module documentation). The
    /// command's environment names the export as nbdkit's does.
    ///
    /// Call it from a thread that blocks SIGTERM/SIGINT (see
    /// [`super::shutdown_on_signals`]): the command gets an empty signal mask. Without a
    /// terminal on standard input the command gets a process group of its own, so that a
    /// signal reaches everything it started (`sh -c 'a; b'` would otherwise leave `a`
    /// running); on a terminal it stays in the foreground group, where Ctrl-C reaches it
    /// directly and it may read the terminal.
    ///
    /// # Errors
    /// The server failed ([`ErrorKind::Device`]); the command could not be started or
    /// waited for.
    pub fn serve(
        self,
        export: Arc<dyn Backend>,
        opts: ServeOptions,
        command: Option<&str>,
    ) -> Result<Ended> {
        let Bound {
            listener,
            uri,
            cleanup,
        } = self;
        let env = command_env(&listener, &uri);
        let shutdown = opts.shutdown.clone();
        let server = std::thread::Builder::new()
            .name("nbd-accept".into())
            .spawn(move || super::serve(listener, export, opts))?;

        let Some(cmd) = command else {
            let r = join(server)?;
            drop(cleanup);
            return server_result(r).map(|()| Ended::Stopped);
        };

        // SAFETY: isatty only inspects the descriptor.
        let own_group = unsafe { libc::isatty(libc::STDIN_FILENO) } != 1;
        let mut command = std::process::Command::new("sh");
        command.arg("-c").arg(cmd).envs(env);
        if own_group {
            std::os::unix::process::CommandExt::process_group(&mut command, 0);
        }
        // This thread blocks SIGINT/SIGTERM (only the signal thread takes them) and a
        // child inherits the mask: unblock everything in the child, or the command (and
        // all it starts) could never be stopped by a signal.
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
            .map_err(|e| Error::Invalid(format!("starting --run command: {e}")))?;
        let pid = child.id();
        let child_done = Arc::new(AtomicBool::new(false));
        let waiter = {
            let shutdown = shutdown.clone();
            let done = Arc::clone(&child_done);
            std::thread::spawn(move || {
                let status = child.wait();
                done.store(true, Ordering::SeqCst);
                shutdown.trigger();
                status
            })
        };
        // A stop request (the signal thread triggers `shutdown`) goes on to the command at
        // once, and the command is waited for below: its clients finish before the server
        // stops.
        {
            let shutdown = shutdown.clone();
            let done = Arc::clone(&child_done);
            std::thread::spawn(move || {
                while !done.load(Ordering::SeqCst) {
                    if shutdown.is_triggered() {
                        signal_child(pid, own_group);
                        return;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            });
        }
        let r = join(server)?;
        if !child_done.load(Ordering::SeqCst) {
            // The server stopped first (a signal): stop the command too.
            signal_child(pid, own_group);
        }
        let status = waiter
            .join()
            .map_err(|_| Error::Invalid("the --run waiter panicked".into()))?
            .map_err(|e| Error::Invalid(format!("waiting for --run command: {e}")))?;
        drop(cleanup);
        server_result(r)?;
        Ok(Ended::Command(exit_code(status)))
    }
}

/// The server thread's result.
fn join(
    server: JoinHandle<std::result::Result<(), NbdError>>,
) -> Result<std::result::Result<(), NbdError>> {
    server
        .join()
        .map_err(|_| Error::Invalid("the server thread panicked".into()))
}

/// The server's own failure: the device's.
fn server_result(r: std::result::Result<(), NbdError>) -> Result<()> {
    r.map_err(|e| Error::from(e).with_kind(ErrorKind::Device))
}

/// SIGTERM to the command: to its whole process group when it has its own.
fn signal_child(pid: u32, own_group: bool) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        let target = if own_group { -pid } else { pid };
        // SAFETY: kill(2) has no memory-safety preconditions; `pid` is our own child (and
        // the leader of its group), not yet reaped while the waiter runs, so not reused.
        unsafe { libc::kill(target, libc::SIGTERM) };
    }
}

/// The environment the command gets (nbdkit's names).
fn command_env(listener: &Listener, uri: &str) -> Vec<(&'static str, String)> {
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

/// A child's status as an exit code (signals as 128 + signal number, like the shell).
fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}
