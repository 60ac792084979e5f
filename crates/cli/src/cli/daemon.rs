//! Going to the background the way cryptsetup's callers expect from `open`: the command
//! returns once the device is ready, with a status that says whether it is.
//!
//! [`detach`] forks once the key is unlocked (the passphrase prompt and its errors stay in
//! the foreground) and before any thread exists (the engine's workers, the signal thread:
//! `fork` keeps only the calling thread, so they are started in the child). The parent
//! waits on a pipe: the child writes one line, `ok <text>` (printed by the parent, which
//! exits 0) or `err <code> <message>` (printed on stderr, exit `code`); a child that dies
//! before writing closes the pipe, and the parent exits 1 pointing at the log. The child
//! starts a new session (no controlling terminal), takes `/dev/null` as stdin and stdout
//! and its log file as stderr.

use super::{CliError, EXIT_PARAMS};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// How the server tells whoever started it that it is ready (or failed).
pub(crate) enum Ready {
    /// In the foreground: print it ourselves.
    Foreground,
    /// In the foreground under a service manager (`--notify`): print it, and tell the
    /// manager (READY=1 on `$NOTIFY_SOCKET`).
    Notify,
    /// In the background child: the pipe to the waiting parent (taken when used).
    Pipe(Option<File>),
}

impl Ready {
    /// Start-up succeeded: `text` is what the starting command prints.
    pub(crate) fn ok(&mut self, text: &str) {
        match self {
            Ready::Foreground | Ready::Notify => {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{text}");
                let _ = out.flush();
                if matches!(self, Ready::Notify) {
                    notify_ready(text);
                }
            }
            Ready::Pipe(p) => {
                if let Some(mut f) = p.take() {
                    let _ = writeln!(f, "ok {text}");
                }
            }
        }
    }

    /// A line for the user on standard error (`ucrypt: ` and `line`) before [`Ready::ok`]:
    /// printed here in the foreground, by the waiting parent otherwise.
    pub(crate) fn note(&mut self, line: &str) {
        match self {
            Ready::Foreground | Ready::Notify => eprintln!("ucrypt: {line}"),
            Ready::Pipe(Some(f)) => {
                let _ = writeln!(f, "note {}", line.replace('\n', " "));
            }
            Ready::Pipe(None) => {}
        }
    }

    /// Start-up failed. In the foreground the error is returned to the caller as usual;
    /// in the background it goes to the parent. Returns whether it was sent.
    pub(crate) fn fail(&mut self, e: &CliError) -> bool {
        match self {
            Ready::Foreground | Ready::Notify => false,
            Ready::Pipe(p) => match p.take() {
                Some(mut f) => {
                    let msg = super::error_line(&e.err).replace('\n', " ");
                    let _ = writeln!(f, "err {} {msg}", e.code);
                    true
                }
                None => false,
            },
        }
    }

    /// Whether the start-up is still being waited for.
    pub(crate) fn pending(&self) -> bool {
        matches!(self, Ready::Pipe(Some(_)))
    }
}

/// Tells the service manager the instance is up (`READY=1`, with `shown`, the node or URI,
/// as its status). Without `$NOTIFY_SOCKET` nothing is sent; a manager that cannot be
/// reached is said on stderr (the unit will then time out or fail, which says the rest).
pub(crate) fn notify_ready(shown: &str) {
    let state = format!("READY=1\nSTATUS=serving {}", shown.replace('\n', " "));
    if let Err(e) = ucrypt::sd_notify::notify(&state) {
        eprintln!("ucrypt: telling the service manager READY=1: {e}");
    }
}

/// Threads of this process (from /proc).
fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(1, Iterator::count)
}

/// Forks: the parent waits for the child's readiness line and exits with its verdict (it
/// never returns); the child returns its end of the pipe. `log` becomes the child's
/// standard error.
///
/// # Errors
/// When threads already exist, or pipe/fork/open fail.
pub(crate) fn detach(log: &Path) -> Result<Ready, CliError> {
    if thread_count() > 1 {
        return Err(anyhow::anyhow!(
            "cannot go to the background: threads are already running (use --foreground)"
        ))
        .map_err(CliError::from);
    }
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .mode(0o600)
        .append(true)
        .open(log)
        .map_err(|e| anyhow::anyhow!("creating {}: {e}", log.display()))?;
    let devnull = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| anyhow::anyhow!("opening /dev/null: {e}"))?;
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(anyhow::anyhow!("pipe: {}", std::io::Error::last_os_error()).into());
    }
    // SAFETY: pipe2 succeeded: both descriptors are open and owned by nobody else.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let _ = std::io::stdout().flush();
    // SAFETY: the process has a single thread (checked above), so the child is a complete
    // copy and may run Rust code freely.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(anyhow::anyhow!("fork: {}", std::io::Error::last_os_error()).into());
    }
    if pid > 0 {
        drop(wr);
        parent(File::from(rd), log)
    }
    drop(rd);
    // The volume key was unlocked before the fork, and memory locks are not inherited:
    // lock its pages (and every other secret's) again in the process that serves.
    let refused = ucrypt::secure::relock_after_fork();
    if refused > 0 {
        eprintln!(
            "ucrypt: warning: {refused} page(s) of key material could not be locked in RAM \
             (RLIMIT_MEMLOCK)"
        );
    }
    // SAFETY: setsid has no memory-safety preconditions; the child is not a group leader.
    unsafe { libc::setsid() };
    // SAFETY: dup2 onto the standard descriptors from descriptors we own.
    unsafe {
        libc::dup2(devnull.as_raw_fd(), 0);
        libc::dup2(devnull.as_raw_fd(), 1);
        libc::dup2(log_file.as_raw_fd(), 2);
    }
    Ok(Ready::Pipe(Some(File::from(wr))))
}

/// The parent's side: relay the verdict and exit.
fn parent(rd: File, log: &Path) -> ! {
    let mut rd = BufReader::new(rd);
    let mut line = String::new();
    loop {
        line.clear();
        let _ = rd.read_line(&mut line);
        match line.trim_end().strip_prefix("note ") {
            Some(note) => eprintln!("ucrypt: {note}"),
            None => break,
        }
    }
    let line = line.trim_end();
    if let Some(text) = line.strip_prefix("ok ") {
        if !text.is_empty() {
            println!("{text}");
        }
        let _ = std::io::stdout().flush();
        std::process::exit(0);
    }
    if let Some(rest) = line.strip_prefix("err ") {
        let (code, msg) = rest.split_once(' ').unwrap_or((rest, ""));
        eprintln!("ucrypt: {msg}");
        std::process::exit(code.parse().unwrap_or(i32::from(EXIT_PARAMS)));
    }
    eprintln!(
        "ucrypt: the server exited during start-up (its log: {})",
        log.display()
    );
    std::process::exit(1);
}
