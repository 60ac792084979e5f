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
#![allow(unsafe_code)]

use io_uring::{opcode, types, IoUring};
use std::cell::RefCell;
use std::io;
use std::os::fd::RawFd;

/// Ring depth: batches longer than this are submitted in several rounds.
const DEPTH: u32 = 64;

thread_local! {
    static RING: RefCell<Option<IoUring>> = const { RefCell::new(None) };
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

/// Writes every entry of `batch` to `fd`, submitting up to 64 at a time in one system
/// call and waiting for all of them. Short writes are completed with `pwrite`.
///
/// Writes submitted together may run in any order, so the batch is cut into groups with
/// no two overlapping writes: a later write to the same bytes waits for the earlier one,
/// and the batch keeps its order.
///
/// # Errors
/// The first failed write's OS error; entries after it may or may not have been written.
pub fn write_batch(fd: RawFd, batch: &[UringWrite<'_>]) -> io::Result<()> {
    RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(IoUring::new(DEPTH)?);
        }
        let ring = slot.as_mut().expect("ring just created");
        for group in groups(batch) {
            for (i, w) in group.iter().enumerate() {
                let len = u32::try_from(w.buf.len())
                    .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "write over 4 GiB"))?;
                let sqe = opcode::Write::new(types::Fd(fd), w.buf.as_ptr(), len)
                    .offset(w.offset)
                    .rw_flags(if w.fua { libc::RWF_DSYNC } else { 0 })
                    .build()
                    .user_data(i as u64);
                // SAFETY: the buffer stays borrowed (alive, unmoved) until this function has
                // reaped every completion of the group below; the queue has room because a
                // group is at most DEPTH entries and the ring is empty between groups.
                unsafe { ring.submission().push(&sqe) }
                    .map_err(|_| io::Error::other("io_uring submission queue full"))?;
            }
            ring.submit_and_wait(group.len())?;
            let mut done = 0;
            let mut first_err = None;
            while done < group.len() {
                let Some(cqe) = ring.completion().next() else {
                    ring.submit_and_wait(group.len() - done)?;
                    continue;
                };
                done += 1;
                let w = &group[cqe.user_data() as usize];
                let res = cqe.result();
                if res < 0 {
                    first_err.get_or_insert(io::Error::from_raw_os_error(-res));
                } else if (res as usize) < w.buf.len() {
                    // A short write (rare on files): finish it the ordinary way.
                    if let Err(e) = finish(fd, w, res as usize) {
                        first_err.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = first_err {
                return Err(e);
            }
        }
        Ok(())
    })
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
            let (lo, hi) = (w.offset, w.offset + w.buf.len() as u64);
            let overlaps = batch[start..end]
                .iter()
                .any(|g| g.offset < hi && lo < g.offset + g.buf.len() as u64);
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
        let off = libc::off_t::try_from(w.offset + at as u64)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
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
