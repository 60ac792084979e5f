//! Process hardening for commands that hold keys or passphrases.
//!
//! A core dump of a process that holds a volume key writes the key to disk, in the clear,
//! wherever `core_pattern` points (often a crash collector that keeps it). So before any
//! secret is read, [`disable_core_dumps`] sets `RLIMIT_CORE` to 0 (no core file) and
//! clears the dumpable flag (`prctl(PR_SET_DUMPABLE, 0)`: no core even through a pipe
//! `core_pattern`, and other processes of the same user cannot `ptrace` it or read its
//! `/proc/PID/mem`).
//!
//! Memory locking: only secrets are locked, as cryptsetup >= 2.6 does (it dropped
//! `mlockall`): volume keys (`VolumeKey`), the ciphers' key schedules and keyed-context key
//! copies, passphrases and key-file contents (`ucrypt_crypto::secret`, page-counted so two
//! secrets on one page never unlock each other). Never `mlockall`: with `MCL_FUTURE` it
//! also locked every page of the memory-mapped image a read touched (4.2 GB `VmLck` after
//! one pass over a 3 GiB image), which for an image larger than RAM takes the machine down.

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

/// How much memory of this process is locked (`VmLck` in /proc/self/status), in bytes.
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

/// In a child after `fork`: locks again every page that holds a secret (memory locks are
/// not inherited). Returns how many pages the kernel refused.
pub fn relock_after_fork() -> usize {
    ucrypt_crypto::secret::relock_after_fork()
}
