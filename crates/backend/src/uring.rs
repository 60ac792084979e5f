//! io_uring submission of a batch of writes (one plug) for [`crate::FileBackend`].
//!
//! The engine hands a backend several writes at once through `submit_writes` (a request's
//! pool buffers, or the ordered submitter's released batches). With `pwrite` that is one
//! system call per write; here it is one `io_uring_enter` for the whole batch, and the
//! device sees the writes together. Single reads and writes stay on `pread`/`pwrite`: for
//! one synchronous operation io_uring is a system call all the same. Whether the batch
//! path pays is measured by `ucrypt bench uring` (BENCHMARKING.md).
//!
//! Each thread keeps its own ring (created on first use): rings are not shared, so no lock
//! is taken on the submission path.
//!
//! **Every path reaps every completion before returning.** The kernel reads the caller's
//! buffers until a write completes, so [`write_batch`] may not return (with success, an
//! error or a panic) while any entry it queued is still in flight: an [`InFlight`] guard
//! counts the entries queued and, whatever ends the call, waits for the rest (retrying a
//! wait interrupted by a signal, `EINTR`, or refused for a moment). Nothing is checked
//! or converted after the first entry of a group is queued, so no error can leave a group
//! half queued. A ring found with leftovers anyway (it cannot happen; defensive) is
//! discarded, not reused, and completions carry the call's generation so a stray one is
//! never taken for one of this call's.
#![allow(unsafe_code)]

use io_uring::{opcode, types, IoUring};
use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::RawFd;

/// Ring depth: batches longer than this are submitted in several rounds.
const DEPTH: u32 = 64;

thread_local! {
    static RING: RefCell<Option<IoUring>> = const { RefCell::new(None) };
    /// Counts calls on this thread; the high half of every entry's `user_data`.
    static GENERATION: Cell<u32> = const { Cell::new(0) };
}

/// Whether io_uring works on this kernel (a ring can be created).
pub fn available() -> bool {
    IoUring::new(2).is_ok()
}

/// One write of a batch.
#[derive(Debug, Clone, Copy)]
pub struct UringWrite<'a> {
    /// File offset.
    pub offset: u64,
    /// Data.
    pub buf: &'a [u8],
    /// Durable on completion (RWF_DSYNC).
    pub fua: bool,
}

/// Failures tests inject into the next [`write_batch`] on this thread.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Inject {
    None,
    /// Queueing fails after this many entries were queued (a full submission queue).
    QueueFullAfter(usize),
    /// The first completion reports only this many bytes written (a short write).
    ShortFirst(usize),
    /// The first completion reports this errno.
    FailFirst(i32),
}

#[cfg(test)]
thread_local! {
    static INJECT: Cell<Inject> = const { Cell::new(Inject::None) };
}

/// Entries queued on a ring and not yet reaped; waits for all of them however the call
/// ends (see the module docs).
struct InFlight<'r> {
    ring: &'r mut IoUring,
    generation: u32,
    queued: usize,
    reaped: usize,
}

impl InFlight<'_> {
    /// Submits what is queued and waits for at least one completion, retrying `EINTR`
    /// and momentary refusals (`EAGAIN`, `EBUSY`). Other errors are returned: the caller
    /// still waits for everything in flight before it returns (Drop).
    fn submit_and_wait(&mut self) -> io::Result<()> {
        let want = self.queued - self.reaped;
        loop {
            match self.ring.submit_and_wait(want.min(1)) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY)) => {
                    std::thread::sleep(std::time::Duration::from_micros(100));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Takes every completion available now: (index in the group, result) to `f`.
    fn reap(&mut self, f: &mut dyn FnMut(usize, i32)) {
        let generation = self.generation;
        let mut done = 0;
        for cqe in self.ring.completion() {
            let data = cqe.user_data();
            if (data >> 32) as u32 != generation {
                // Not ours (impossible while every call reaps its own; never indexed).
                continue;
            }
            done += 1;
            f((data & 0xffff_ffff) as usize, cqe.result());
        }
        self.reaped += done;
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        // Whatever ended the call (an error, a panic): no entry may outlive it.
        while self.reaped < self.queued {
            if self.submit_and_wait().is_err() {
                // The ring refuses to wait; the writes are still the kernel's. Keep
                // asking: returning would let it read buffers the caller reuses.
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            self.reap(&mut |_, _| {});
        }
    }
}

/// Writes every entry of `batch` to `fd`, submitting up to 64 at a time in one system
/// call and waiting for all of them. Short writes are completed with `pwrite`.
///
/// Writes submitted together may run in any order, so the batch is cut into groups with
/// no two overlapping writes: a later write to the same bytes waits for the earlier one,
/// and the batch keeps its order.
///
/// Returns only when no entry is in flight any more, on every path (module docs): the
/// buffers are free for reuse as soon as it returns.
///
/// # Errors
/// The first failed write's OS error; entries after it may or may not have been written.
pub fn write_batch(fd: RawFd, batch: &[UringWrite<'_>]) -> io::Result<()> {
    // Every length must fit an entry before anything is queued.
    if batch.iter().any(|w| u32::try_from(w.buf.len()).is_err()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "write over 4 GiB",
        ));
    }
    RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot
            .as_mut()
            .is_some_and(|r| !r.submission().is_empty() || !r.completion().is_empty())
        {
            // Leftovers (impossible while every call reaps its own): never reuse.
            *slot = None;
        }
        if slot.is_none() {
            *slot = Some(IoUring::new(DEPTH)?);
        }
        let ring = slot.as_mut().expect("ring just created");
        let generation = GENERATION.with(|g| {
            let n = g.get().wrapping_add(1);
            g.set(n);
            n
        });
        for group in groups(batch) {
            write_group(ring, generation, fd, group)?;
        }
        Ok(())
    })
}

/// One group of non-overlapping writes: queue all, wait for all, then finish short
/// writes and report the first error.
fn write_group(
    ring: &mut IoUring,
    generation: u32,
    fd: RawFd,
    group: &[UringWrite<'_>],
) -> io::Result<()> {
    let mut flight = InFlight {
        ring,
        generation,
        queued: 0,
        reaped: 0,
    };
    // Not yet completed: i32::MIN (no errno is that large).
    let mut results = [i32::MIN; DEPTH as usize];
    for (i, w) in group.iter().enumerate() {
        #[cfg(test)]
        if INJECT.with(|c| c.get()) == Inject::QueueFullAfter(i) {
            INJECT.with(|c| c.set(Inject::None));
            return Err(io::Error::other(
                "io_uring submission queue full (injected)",
            ));
        }
        let sqe = opcode::Write::new(types::Fd(fd), w.buf.as_ptr(), w.buf.len() as u32)
            .offset(w.offset)
            .rw_flags(if w.fua { libc::RWF_DSYNC } else { 0 })
            .build()
            .user_data((u64::from(generation) << 32) | i as u64);
        // SAFETY: the buffer stays borrowed (alive, unmoved) until `flight` has reaped
        // every completion of this group, which it does on every path out of this
        // function (its Drop waits for whatever is still queued or in flight).
        unsafe { flight.ring.submission().push(&sqe) }
            .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        flight.queued += 1;
    }
    while flight.reaped < flight.queued {
        flight.submit_and_wait()?;
        flight.reap(&mut |i, res| {
            if let Some(r) = results.get_mut(i) {
                *r = res;
            }
        });
    }
    drop(flight);
    #[cfg(test)]
    match INJECT.with(|c| c.replace(Inject::None)) {
        Inject::ShortFirst(n) => results[0] = results[0].min(n as i32),
        Inject::FailFirst(errno) => results[0] = -errno,
        _ => {}
    }
    // Every entry has completed: nothing below races the kernel. The group has no two
    // overlapping writes, so finishing a short one now keeps the batch's order.
    let mut first_err = None;
    for (w, &res) in group.iter().zip(&results) {
        if res < 0 {
            first_err.get_or_insert(io::Error::from_raw_os_error(-res));
        } else if (res as usize) < w.buf.len() {
            // A short write (rare on files): finish it the ordinary way.
            if let Err(e) = finish(fd, w, res as usize) {
                first_err.get_or_insert(e);
            }
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// Cuts the batch where a write overlaps one already in the current group (or the group
/// is full).
fn groups<'b, 'a>(batch: &'b [UringWrite<'a>]) -> impl Iterator<Item = &'b [UringWrite<'a>]> {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= batch.len() {
            return None;
        }
        let mut end = start + 1;
        while end < batch.len() && end - start < DEPTH as usize {
            let w = &batch[end];
            // Saturating: offset u64::MAX is io_uring's "current position" (a stream).
            let (lo, hi) = (w.offset, w.offset.saturating_add(w.buf.len() as u64));
            let overlaps = batch[start..end]
                .iter()
                .any(|g| g.offset < hi && lo < g.offset.saturating_add(g.buf.len() as u64));
            if overlaps {
                break;
            }
            end += 1;
        }
        let group = &batch[start..end];
        start = end;
        Some(group)
    })
}

fn finish(fd: RawFd, w: &UringWrite<'_>, written: usize) -> io::Result<()> {
    let mut at = written;
    while at < w.buf.len() {
        let rest = &w.buf[at..];
        let flags = if w.fua { libc::RWF_DSYNC } else { 0 };
        let iov = libc::iovec {
            iov_base: rest.as_ptr() as *mut libc::c_void,
            iov_len: rest.len(),
        };
        let off = if w.offset == u64::MAX {
            -1 // the current position, as the io_uring entry had it
        } else {
            libc::off_t::try_from(w.offset + at as u64)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?
        };
        // SAFETY: one iovec describing a live slice; pwritev2 only reads from it.
        let n = unsafe { libc::pwritev2(fd, &iov, 1, off, flags) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        at += n as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// A pipe whose writes block until the test reads: a write "in flight" for as long as
    /// the test wants. Returns (read end, write end).
    fn pipe() -> (std::fs::File, std::fs::File) {
        use std::os::fd::FromRawFd;
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills the two descriptors we own from here on.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: fresh descriptors, owned once each.
        unsafe {
            (
                std::fs::File::from_raw_fd(fds[0]),
                std::fs::File::from_raw_fd(fds[1]),
            )
        }
    }

    extern "C" fn on_usr1(_: libc::c_int) {}

    /// Runs `batch_then` on a thread whose `write_batch` into a pipe blocks; the main
    /// thread (after `poke` ran on the blocked thread's id) reads `want` bytes from the
    /// pipe. The thread overwrites its buffers with 0xbb the moment `write_batch` returns,
    /// so any write still in flight after the return shows up as 0xbb in the pipe.
    /// Returns what the pipe delivered and the call's result.
    fn blocked_batch(
        writes: usize,
        inject: Inject,
        poke: impl Fn(libc::pthread_t),
        want: usize,
    ) -> (Vec<u8>, io::Result<()>) {
        use std::io::Read;
        use std::os::unix::thread::JoinHandleExt;
        const LEN: usize = 256 * 1024; // four times a pipe's default capacity
        let (mut rd, wr) = pipe();
        let t = std::thread::spawn(move || {
            let mut bufs: Vec<Vec<u8>> = (0..writes).map(|_| vec![0xaa; LEN]).collect();
            let batch: Vec<UringWrite<'_>> = bufs
                .iter()
                .map(|b| UringWrite {
                    // -1: a pipe has no position (io_uring's "current position").
                    offset: u64::MAX,
                    buf: b,
                    fua: false,
                })
                .collect();
            INJECT.with(|c| c.set(inject));
            let r = write_batch(wr.as_raw_fd(), &batch);
            drop(batch);
            for b in &mut bufs {
                b.fill(0xbb);
            }
            drop(wr);
            // The next batch on the same thread (same ring) works and lands.
            let f = tempfile::tempfile().unwrap();
            let next = vec![7u8; 8192];
            let two = [
                UringWrite {
                    offset: 0,
                    buf: &next[..4096],
                    fua: false,
                },
                UringWrite {
                    offset: 4096,
                    buf: &next[4096..],
                    fua: false,
                },
            ];
            write_batch(f.as_raw_fd(), &two).unwrap();
            let mut back = vec![0u8; 8192];
            std::os::unix::fs::FileExt::read_exact_at(&f, &mut back, 0).unwrap();
            assert_eq!(back, next, "the next batch on the thread lands");
            r
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        poke(t.as_pthread_t());
        let mut got = Vec::new();
        (&mut rd).take(want as u64).read_to_end(&mut got).unwrap();
        let r = t.join().unwrap();
        // Anything after the thread closed its end: a write that outlived the call.
        rd.read_to_end(&mut got).unwrap();
        (got, r)
    }

    #[test]
    fn a_signal_during_the_wait_does_not_return_with_writes_in_flight() {
        if !available() {
            eprintln!("SKIP: io_uring not available");
            return;
        }
        // A handler without SA_RESTART, so the blocked io_uring_enter returns EINTR.
        // SAFETY: a valid handler for SIGUSR1, which nothing else in this binary uses.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_usr1 as *const () as usize;
            libc::sigemptyset(&mut act.sa_mask);
            assert_eq!(
                libc::sigaction(libc::SIGUSR1, &act, std::ptr::null_mut()),
                0
            );
        }
        let (got, r) = blocked_batch(
            1,
            Inject::None,
            |t| {
                for _ in 0..5 {
                    // SAFETY: the thread is alive (blocked in write_batch until we read).
                    unsafe { libc::pthread_kill(t, libc::SIGUSR1) };
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            },
            256 * 1024,
        );
        r.expect("EINTR is retried, not returned");
        assert_eq!(got.len(), 256 * 1024);
        assert!(
            got.iter().all(|&b| b == 0xaa),
            "a buffer was written after write_batch returned"
        );
    }

    #[test]
    fn a_full_queue_waits_for_what_it_queued() {
        if !available() {
            eprintln!("SKIP: io_uring not available");
            return;
        }
        // Two writes; queueing the second fails. The first is queued: the call must see
        // it complete (it blocks until we read) before returning its error.
        let (got, r) = blocked_batch(2, Inject::QueueFullAfter(1), |_| {}, 256 * 1024);
        assert!(r.unwrap_err().to_string().contains("queue full"));
        // The queued write went (a pipe may take it short: what it took, no more; the
        // rest of a short write is not finished once the call has failed).
        assert!(!got.is_empty() && got.len() <= 256 * 1024, "{}", got.len());
        assert!(
            got.iter().all(|&b| b == 0xaa),
            "a buffer was written after write_batch returned"
        );
    }

    fn four(d: &[u8]) -> [UringWrite<'_>; 4] {
        [0usize, 1, 2, 3].map(|i| UringWrite {
            offset: (i * 4096) as u64,
            buf: &d[i * 4096..(i + 1) * 4096],
            fua: false,
        })
    }

    #[test]
    fn short_and_failed_writes_are_finished_or_reported_and_the_ring_stays_usable() {
        if !available() {
            eprintln!("SKIP: io_uring not available");
            return;
        }
        let f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..16384u32).map(|i| (i % 251) as u8).collect();
        // Short: the rest of the first write is finished with pwrite.
        INJECT.with(|c| c.set(Inject::ShortFirst(100)));
        write_batch(f.as_raw_fd(), &four(&data)).unwrap();
        let mut back = vec![0u8; 16384];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut back, 0).unwrap();
        assert_eq!(back, data);
        // Failed: the error is returned, the others have completed by then.
        let other: Vec<u8> = data.iter().map(|b| b ^ 0xff).collect();
        INJECT.with(|c| c.set(Inject::FailFirst(libc::EIO)));
        let err = write_batch(f.as_raw_fd(), &four(&other)).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO));
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut back, 0).unwrap();
        assert_eq!(back[4096..], other[4096..]);
        // The next batch on this thread's ring works.
        write_batch(f.as_raw_fd(), &four(&data)).unwrap();
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut back, 0).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn a_batch_lands_in_order_with_later_writes_winning() {
        if !available() {
            eprintln!("SKIP: io_uring not available");
            return;
        }
        let f = tempfile::tempfile().unwrap();
        f.set_len(1 << 20).unwrap();
        let a = vec![1u8; 4096];
        let b = vec![2u8; 4096];
        let c = vec![3u8; 8192];
        let batch = [
            UringWrite {
                offset: 0,
                buf: &a,
                fua: false,
            },
            UringWrite {
                offset: 4096,
                buf: &c,
                fua: true,
            },
            UringWrite {
                offset: 0,
                buf: &b,
                fua: false,
            },
        ];
        write_batch(f.as_raw_fd(), &batch).unwrap();
        let mut out = vec![0u8; 12288];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut out, 0).unwrap();
        assert!(out[4096..].iter().all(|&x| x == 3));
        assert!(
            out[..4096].iter().all(|&x| x == 2),
            "the later overlapping write must win"
        );
    }

    #[test]
    fn groups_split_at_overlaps_only() {
        let a = [0u8; 100];
        let w = |offset| UringWrite {
            offset,
            buf: &a,
            fua: false,
        };
        let batch = [w(0), w(100), w(200), w(150), w(300)];
        let sizes: Vec<usize> = groups(&batch).map(<[_]>::len).collect();
        assert_eq!(sizes, vec![3, 2]);
    }

    #[test]
    fn a_bad_descriptor_is_an_error() {
        if !available() {
            return;
        }
        let a = vec![1u8; 512];
        let err = write_batch(
            -1,
            &[UringWrite {
                offset: 0,
                buf: &a,
                fua: false,
            }],
        )
        .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EBADF));
    }

    #[test]
    fn a_file_backend_with_io_uring_passes_the_conformance_suite() {
        if !available() {
            eprintln!("SKIP: io_uring not available");
            return;
        }
        for direct in [false, true] {
            let dir = tempfile::tempdir_in("/var/tmp").unwrap();
            let path = dir.path().join("u.img");
            std::fs::File::create(&path)
                .unwrap()
                .set_len(4 << 20)
                .unwrap();
            let opts = crate::FileOptions {
                read_only: false,
                direct,
            };
            let Ok(mut f) = crate::FileBackend::open(&path, opts) else {
                eprintln!("SKIP: O_DIRECT refused here");
                continue;
            };
            assert!(f.use_io_uring(true));
            crate::testing::conformance(&f);
        }
    }
}
