//! Thin wrappers over the Linux calls the file backend needs and std does not offer:
//! block-device ioctls (`include/uapi/linux/fs.h`), `fallocate(2)`, `pwritev2(2)` with
//! `RWF_DSYNC`, `statx(2)` with `STATX_DIOALIGN`, and the block queue limits in sysfs
//! (`Documentation/ABI/stable/sysfs-block`). Each returns `io::Result`; the caller adds the
//! path, op and offset.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// `_IO(0x12, 119)`: discard a `[start, len]` byte range.
const BLKDISCARD: u32 = 0x1277;
/// `_IO(0x12, 127)`: write zeroes over a `[start, len]` byte range.
const BLKZEROOUT: u32 = 0x127f;

/// The `_IOC_READ` direction bit of the architecture's ioctl encoding.
#[cfg(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc",
    target_arch = "sparc64"
))]
const IOC_READ: u32 = 2 << 29;
#[cfg(not(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc",
    target_arch = "sparc64"
)))]
const IOC_READ: u32 = 2 << 30;

/// `_IOR(0x12, 114, size_t)`: device size in bytes. The kernel encodes `size_t` in the
/// number but always stores a `u64`.
const BLKGETSIZE64: u32 = IOC_READ | ((std::mem::size_of::<usize>() as u32) << 16) | 0x1272;

/// Clears `O_NONBLOCK` (set only so that opening cannot block on a FIFO).
pub(super) fn clear_nonblock(file: &File) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: F_GETFL on a descriptor we own; no pointers.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: F_SETFL with an integer argument on a descriptor we own; no pointers.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Converts a byte offset or length to `off_t`.
pub(super) fn off(v: u64) -> io::Result<libc::off_t> {
    libc::off_t::try_from(v).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{v} does not fit in off_t"),
        )
    })
}

/// Runs a call returning -1/errno until it stops failing with `EINTR`.
fn retry(mut f: impl FnMut() -> libc::c_int) -> io::Result<libc::c_int> {
    loop {
        let r = f();
        if r >= 0 {
            return Ok(r);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Size in bytes of a block device (`BLKGETSIZE64`).
pub(super) fn blk_size_bytes(file: &File) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points to a live,
    // writable u64 for the duration of the call; the fd is open.
    retry(|| unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            BLKGETSIZE64 as libc::Ioctl,
            &mut size as *mut u64,
        )
    })?;
    Ok(size)
}

/// Reads an `int`/`unsigned int` block-queue limit (`BLKSSZGET`, `BLKPBSZGET`, `BLKIOOPT`).
fn blk_get_u32(file: &File, req: libc::Ioctl) -> io::Result<u32> {
    let mut v: libc::c_uint = 0;
    // SAFETY: these ioctls write one int-sized value through the pointer, which points to
    // a live, writable c_uint for the duration of the call; the fd is open.
    retry(|| unsafe { libc::ioctl(file.as_raw_fd(), req, &mut v as *mut libc::c_uint) })?;
    Ok(v)
}

/// Logical block size of a block device (`BLKSSZGET`).
pub(super) fn blk_logical_block(file: &File) -> io::Result<u32> {
    blk_get_u32(file, libc::BLKSSZGET)
}

/// Physical block size of a block device (`BLKPBSZGET`).
pub(super) fn blk_physical_block(file: &File) -> io::Result<u32> {
    blk_get_u32(file, libc::BLKPBSZGET)
}

/// Optimal I/O size of a block device (`BLKIOOPT`); 0 when the device states none.
pub(super) fn blk_optimal_io(file: &File) -> io::Result<u32> {
    blk_get_u32(file, libc::BLKIOOPT)
}

/// Issues `BLKDISCARD` or `BLKZEROOUT` over a byte range.
fn blk_range(file: &File, req: u32, offset: u64, len: u64) -> io::Result<()> {
    let range: [u64; 2] = [offset, len];
    // SAFETY: both ioctls read two u64s through the pointer, which points to a live array
    // of two u64s for the duration of the call; the fd is open.
    retry(|| unsafe { libc::ioctl(file.as_raw_fd(), req as libc::Ioctl, range.as_ptr()) })?;
    Ok(())
}

/// Discards a byte range of a block device (`BLKDISCARD`); must be logical-block aligned.
pub(super) fn blk_discard(file: &File, offset: u64, len: u64) -> io::Result<()> {
    blk_range(file, BLKDISCARD, offset, len)
}

/// Zeroes a byte range of a block device (`BLKZEROOUT`); must be logical-block aligned.
/// The kernel writes zero pages itself when the device lacks WRITE ZEROES.
pub(super) fn blk_zeroout(file: &File, offset: u64, len: u64) -> io::Result<()> {
    blk_range(file, BLKZEROOUT, offset, len)
}

/// `fallocate(2)` with `mode` over a byte range.
pub(super) fn fallocate(file: &File, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
    let (o, l) = (off(offset)?, off(len)?);
    // SAFETY: fallocate takes plain integers; the fd is open for the call.
    retry(|| unsafe { libc::fallocate(file.as_raw_fd(), mode, o, l) })?;
    Ok(())
}

/// Writes all of `buf` at `offset` with `RWF_DSYNC`: each `pwritev2` returns only once its
/// data is durable (FUA on devices that have it). Short writes and `EINTR` are retried.
///
/// Fails with `EOPNOTSUPP` (flag unknown) or `ENOSYS` (no `pwritev2`) on old kernels;
/// the caller falls back to write + `fdatasync`.
pub(super) fn pwrite_dsync(file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
    let mut done = 0usize;
    while done < buf.len() {
        let rest = &buf[done..];
        let iov = libc::iovec {
            iov_base: rest.as_ptr() as *mut libc::c_void,
            iov_len: rest.len(),
        };
        let at = off(offset + done as u64)?;
        // SAFETY: `iov` describes `rest`, which stays borrowed and alive for the call; the
        // kernel only reads from it. The fd is open; `1` is the number of iovecs.
        let n = unsafe { libc::pwritev2(file.as_raw_fd(), &iov, 1, at, libc::RWF_DSYNC) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::from(io::ErrorKind::WriteZero));
        }
        done += n as usize;
    }
    Ok(())
}

/// The offset/length and memory alignment `O_DIRECT` needs on this file, as
/// `statx(STATX_DIOALIGN)` reports it (Linux 6.1+). `None` when the kernel or filesystem
/// does not say.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(super) fn dio_align(file: &File) -> Option<(u32, u32)> {
    // SAFETY: `statx` is a plain C struct of integers; all-zero is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let empty = c"";
    // SAFETY: with AT_EMPTY_PATH and an empty path, statx describes the open fd and writes
    // only into `stx`, which is live and writable for the call.
    let r = unsafe {
        libc::statx(
            file.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if r != 0 || stx.stx_mask & libc::STATX_DIOALIGN == 0 || stx.stx_dio_offset_align == 0 {
        return None;
    }
    Some((stx.stx_dio_offset_align, stx.stx_dio_mem_align))
}

/// Without glibc's `statx` binding the caller uses a safe default.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(super) fn dio_align(_file: &File) -> Option<(u32, u32)> {
    None
}

/// A block queue limit from sysfs (`/sys/dev/block/MAJ:MIN/queue/<attr>`), for a whole
/// disk or (through its parent) a partition. `None` if sysfs does not say.
pub(super) fn queue_limit(rdev: u64, attr: &str) -> Option<u64> {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let base = format!("/sys/dev/block/{major}:{minor}");
    [
        format!("{base}/queue/{attr}"),
        format!("{base}/../queue/{attr}"),
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok())
    .and_then(|s| s.trim().parse().ok())
}
