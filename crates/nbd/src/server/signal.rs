//! SIGTERM/SIGINT → [`Shutdown::trigger`], without a signal handler: the signals are
//! blocked and one thread takes them with `sigwait`, so the shutdown runs as ordinary code
//! (locks, allocation, joins) rather than in async-signal context.

use super::Shutdown;
use crate::NbdError;

/// Blocks SIGINT and SIGTERM in the calling thread and starts a thread that waits for them:
/// the first triggers `shutdown` (graceful: in-flight requests finish, the export is
/// flushed); a second one exits the process at once with status 1.
///
/// Call it before spawning any other thread (threads inherit the signal mask; a thread
/// spawned earlier would still take the default action and kill the process). Child
/// processes started with `std::process::Command` get a cleared mask, so they are not
/// affected.
///
/// # Errors
/// [`NbdError::Signals`] if the mask cannot be set or the thread cannot start.
pub fn shutdown_on_signals(shutdown: &Shutdown) -> Result<(), NbdError> {
    let shutdown = shutdown.clone();
    let mut count = 0;
    on_signals(move |_| {
        count += 1;
        if count > 1 {
            std::process::exit(1);
        }
        shutdown.trigger();
    })
}

/// Blocks SIGINT and SIGTERM in the calling thread and starts a thread that calls `f`
/// with each one taken (`libc::SIGINT` or `libc::SIGTERM`), as ordinary code: what a
/// signal means is the caller's (a named instance treats it as `close`, which may refuse).
///
/// The same rule as [`shutdown_on_signals`]: call it before spawning any other thread.
///
/// # Errors
/// [`NbdError::Signals`] if the mask cannot be set or the thread cannot start.
pub fn on_signals(mut f: impl FnMut(libc::c_int) + Send + 'static) -> Result<(), NbdError> {
    let set = termination_set();
    // SAFETY: `set` is a valid, initialised sigset_t; a null old-set pointer is allowed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(NbdError::Signals(std::io::Error::from_raw_os_error(rc)));
    }
    std::thread::Builder::new()
        .name("nbd-signals".into())
        .spawn(move || loop {
            let mut sig: libc::c_int = 0;
            // SAFETY: `set` is initialised and `sig` is a valid place for the result.
            let rc = unsafe { libc::sigwait(&set, &mut sig) };
            if rc == 0 {
                f(sig);
            }
        })
        .map_err(NbdError::Signals)?;
    Ok(())
}

fn termination_set() -> libc::sigset_t {
    // SAFETY: sigset_t is a plain C struct; sigemptyset initialises it fully before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` points to a sigset_t we own; SIGINT/SIGTERM are valid signal numbers.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
    }
    set
}
