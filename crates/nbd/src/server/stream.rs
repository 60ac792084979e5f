//! One accepted connection's socket, unix or TCP.

use super::*;

/// Send buffer asked for on every connection (failure to get it is harmless).
const SEND_BUFFER_BYTES: usize = 4 << 20;

/// One accepted connection.
#[derive(Debug)]
pub(crate) enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    pub(crate) fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }

    pub(super) fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_nonblocking(on),
            Stream::Tcp(s) => s.set_nonblocking(on),
        }
    }

    pub(crate) fn set_write_timeout(&self, t: Option<Duration>) {
        let _ = match self {
            Stream::Unix(s) => s.set_write_timeout(t),
            Stream::Tcp(s) => s.set_write_timeout(t),
        };
    }

    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) {
        let _ = match self {
            Stream::Unix(s) => s.set_read_timeout(t),
            Stream::Tcp(s) => s.set_read_timeout(t),
        };
    }

    /// Asks for a send buffer of [`SEND_BUFFER_BYTES`] (the kernel caps it at
    /// `net.core.wmem_max`): with the default ~208 KiB a 1 MiB read reply blocks its thread
    /// five times while the client drains the socket.
    pub(super) fn grow_send_buffer(&self) {
        let fd = match self {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tcp(s) => s.as_raw_fd(),
        };
        let bytes = SEND_BUFFER_BYTES as libc::c_int;
        // SAFETY: fd is an open socket owned by self; the option value is a c_int that
        // lives across the call, and its size is passed.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                std::ptr::from_ref(&bytes).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }

    /// `sendmsg` with `MSG_DONTWAIT`: what the socket buffer takes now, `WouldBlock` if
    /// nothing, never blocking (the socket itself stays blocking for its other users).
    /// std has no per-call non-blocking send, hence libc.
    pub(crate) fn send_nonblocking(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let fd = match self {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tcp(s) => s.as_raw_fd(),
        };
        // SAFETY: an all-zero msghdr is valid (no name, no control data).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        // IoSlice is ABI-compatible with iovec on Unix (std documents it); sendmsg only
        // reads the buffers.
        msg.msg_iov = bufs.as_ptr().cast_mut().cast();
        msg.msg_iovlen = bufs.len() as _;
        loop {
            // SAFETY: fd is an open socket owned by self; msg points at `bufs`, which
            // outlive the call.
            let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    pub(crate) fn shutdown(&self, how: SockShutdown) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(how),
            Stream::Tcp(s) => s.shutdown(how),
        };
    }
}

impl io::Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl io::Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write_vectored(bufs),
            Stream::Tcp(s) => s.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
