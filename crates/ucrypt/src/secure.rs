//! Process hardening for commands that hold keys or passphrases.
//!
//! A core dump of a process that holds a volume key writes the key to disk, in the clear,
//! wherever `core_pattern` points (often a crash collector that keeps it). So before any
//! secret is read, [`disable_core_dumps`] sets `RLIMIT_CORE` to 0 (no core file) and
//! clears the dumpable flag (`prctl(PR_SET_DUMPABLE, 0)`: no core even through a pipe
//! `core_pattern`, and other processes of the same user cannot `ptrace` it or read its
//! `/proc/PID/mem`). Keys themselves live in `VolumeKey` (mlock'd, zeroized on drop).

/// Disables core dumps for this process (and what it executes: the limit is inherited).
///
/// # Errors
/// The OS refused either call (not expected for an unprivileged process lowering its own
/// limits); the caller decides whether that is fatal.
#[allow(unsafe_code)]
pub fn disable_core_dumps() -> std::io::Result<()> {
    let zero = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: setrlimit reads the struct we pass; lowering a limit needs no privilege.
    if unsafe { libc::setrlimit(libc::RLIMIT_CORE, &zero) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: PR_SET_DUMPABLE takes one integer argument; the rest are ignored.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether core dumps are off (`RLIMIT_CORE` is 0 and the process is not dumpable).
#[allow(unsafe_code)]
pub fn core_dumps_disabled() -> bool {
    let mut r = libc::rlimit {
        rlim_cur: 1,
        rlim_max: 1,
    };
    // SAFETY: getrlimit writes into the struct we own.
    let limit_zero = unsafe { libc::getrlimit(libc::RLIMIT_CORE, &mut r) } == 0 && r.rlim_cur == 0;
    // SAFETY: PR_GET_DUMPABLE takes no further arguments.
    let dumpable = unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) };
    limit_zero && dumpable == 0
}

/// Locks every page of the process in RAM as it is touched, now and in future
/// (`mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT)`; ONFAULT so thread stacks and
/// reserved buffers are not populated just to be locked), as libcryptsetup locks memory
/// while it handles keys: `VolumeKey` locks its own bytes, but the ciphers' key schedules
/// live in library contexts it cannot reach.
///
/// Done only where it cannot make later allocations fail: when the process's
/// `RLIMIT_MEMLOCK` is unlimited or it runs as root (CAP_IPC_LOCK). Otherwise nothing is
/// locked beyond the keys themselves and `Ok(false)` is returned.
///
/// # Errors
/// `mlockall` failed although the limits allowed it.
#[allow(unsafe_code)]
pub fn lock_all_memory() -> std::io::Result<bool> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own; geteuid has no arguments.
    let unlimited = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } == 0
        && r.rlim_cur == libc::RLIM_INFINITY;
    // SAFETY: as above.
    let root = unsafe { libc::geteuid() } == 0;
    if !(unlimited || root) {
        return Ok(false);
    }
    // SAFETY: mlockall takes flags only; it changes no memory contents.
    if unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE | libc::MCL_ONFAULT) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(true)
}

/// Whether any memory of this process is locked (`VmLck` in /proc/self/status).
pub fn locked_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmLck:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|kb| kb.parse::<u64>().ok())
            })
        })
        .map_or(0, |kb| kb * 1024)
}
