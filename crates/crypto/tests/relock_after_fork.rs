//! Memory locks are not inherited by a child after `fork` (fork(2)), but the page-count
//! table of [`ucrypt_crypto::secret`] is: the background server (which forks after the
//! volume key is unlocked) must lock its secrets' pages again. Alone in its own test binary
//! so that the fork happens with this one thread (no other test can hold the table's lock).

#![allow(clippy::unwrap_used)]

use ucrypt_crypto::secret;

/// The kernel's `Locked:` figure (kB) for the mapping that starts at `addr`.
fn kernel_locked_kb(addr: usize) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let head = format!("{addr:x}-");
    let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&head));
    lines.next().expect("mapping listed");
    lines
        .find(|l| l.starts_with("Locked:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap()
}

#[test]
fn a_forked_child_locks_its_secrets_again() {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    // SAFETY: a fresh private anonymous mapping of one page, ours alone, never unmapped
    // while used (the process ends with it).
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    // SAFETY: the mapping is one readable, writable page.
    let key = unsafe { std::slice::from_raw_parts_mut(map.cast::<u8>(), 64) };
    if !secret::lock(key) {
        eprintln!("SKIP: mlock refused (RLIMIT_MEMLOCK)");
        return;
    }
    let addr = map as usize;
    let kb = page as u64 / 1024;
    assert_eq!(kernel_locked_kb(addr), kb, "locked in the parent");
    // SAFETY: this test binary runs this one test on one thread (see the module docs), so
    // the child is a complete copy; it only reads /proc, calls relock_after_fork and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let before = kernel_locked_kb(addr);
        let refused = secret::relock_after_fork();
        let after = kernel_locked_kb(addr);
        let code = match (before, refused, after) {
            (0, 0, a) if a == kb => 0,
            (b, _, _) if b != 0 => 2, // the kernel kept the lock: nothing to show here
            _ => 1,
        };
        // SAFETY: _exit ends the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child: {status}");
    match libc::WEXITSTATUS(status) {
        0 => {}
        2 => panic!("the child inherited the lock: fork(2) says it does not"),
        c => panic!("the child did not lock the secret's page again (exit {c})"),
    }
    secret::unlock(key);
}
