//! Signal handlers for a phase of a command: [`install`] puts a handler on some signals and
//! unblocks them on the calling thread (a server's signal thread may have blocked them in
//! every other thread; threads started meanwhile inherit the mask); the returned [`Guard`]
//! puts the previous handlers and mask back when dropped. Used by the prompts
//! (`secret.rs`: a signal interrupts the terminal read) and by long operations
//! (`progress.rs`: exit at once, stop at a boundary, or put the header back and exit).

/// The signals that interrupt a prompt or a long operation (Ctrl-C, `kill`, a closed
/// terminal).
pub(crate) const INTERRUPTS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// The previous handlers and mask, put back on drop.
pub(crate) struct Guard {
    old: Vec<(libc::c_int, libc::sigaction)>,
    old_mask: libc::sigset_t,
}

/// Installs `handler` for `signals` with `flags` (`SA_RESTART`, or 0 so that a blocking
/// read returns `EINTR`) and unblocks them on this thread, until the guard is dropped.
/// The handler must be async-signal-safe.
pub(crate) fn install(
    signals: &[libc::c_int],
    handler: extern "C" fn(libc::c_int),
    flags: libc::c_int,
) -> Guard {
    let mut old = Vec::with_capacity(signals.len());
    // SAFETY: sigset_t and sigaction are plain C data (all-zero is a valid start); the
    // calls only read and write the structures passed, which outlive each call.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &sig in signals {
            libc::sigaddset(&mut set, sig);
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = handler as usize;
            act.sa_flags = flags;
            libc::sigemptyset(&mut act.sa_mask);
            let mut prev: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, &act, &mut prev) == 0 {
                old.push((sig, prev));
            }
        }
        let mut old_mask: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, &mut old_mask);
        Guard { old, old_mask }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // SAFETY: restores the mask and the actions saved by `install`.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.old_mask, std::ptr::null_mut());
            for (sig, prev) in &self.old {
                libc::sigaction(*sig, prev, std::ptr::null_mut());
            }
        }
    }
}

/// Makes a print to a closed stdout end the process as it ends a C tool: killed by
/// SIGPIPE, silently (`ucrypt status NAME | head -3`, `cryptsetup status NAME | head -3`).
///
/// Rust ignores SIGPIPE, so such a write fails with EPIPE and `println!` panics with a
/// backtrace. SIGPIPE stays ignored for everything else: the servers in this process write
/// to sockets whose peers may vanish (NBD clients, a VM, a remote export) and must see that
/// as an error on one connection, not die of it. So only this one panic is turned into the
/// signal.
pub(crate) fn die_of_sigpipe_when_stdout_is_closed() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to stdout")
            && message.contains(&std::io::Error::from_raw_os_error(libc::EPIPE).to_string())
        {
            // SAFETY: plain signal calls with valid arguments; the set is initialised by
            // sigemptyset before use. A server's signal thread may have blocked SIGPIPE in
            // this thread, hence the unblock before the raise.
            unsafe {
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGPIPE);
                libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
                libc::raise(libc::SIGPIPE);
            }
        }
        previous(info);
    }));
}
