//! # ucrypt-backend: where ciphertext is stored
//!
//! One small trait, [`Backend`], for every kind of storage: regular files and block devices
//! ([`mod@file`]), Ceph RBD images through librbd ([`rbd`], loaded at run time), a sparse
//! ramdisk like brd ([`memory`]) and a sink like dm-zero ([`zero`]). The decrypted view
//! (`ucrypt_engine::Volume`) implements the same trait, so layers stack and a raw
//! passthrough needs no special path. Knows nothing of encryption. [`aligned`] holds the
//! aligned buffers `O_DIRECT` needs.
//!
//! For tests only, behind the `testing` feature (which only the workspace's
//! dev-dependencies turn on): `testing`, the conformance suite every implementation runs,
//! and `faulty`, an error-injecting wrapper like dm-flakey (`FaultyBackend`).
//!
//! ```text
//!   engine::Volume ──► Arc<dyn Backend> ──► FileBackend | RbdBackend | MemoryBackend | ZeroBackend
//!                                                 ▲
//!                                     FaultyBackend (wraps any; tests only)
//! ```

pub mod aligned;
pub mod emulate;
mod error;
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod faulty;
pub mod file;
pub mod linear;
pub mod memory;
pub mod rbd;
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod testing;
pub mod uring;
pub mod zero;

pub use aligned::AlignedBuf;
pub use error::BackendError;
#[cfg(any(test, feature = "testing"))]
pub use faulty::FaultyBackend;
pub use file::{
    install_sigbus_handler, sigbus_handler_installed, FileBackend, FileOptions, LEND_MIN_BYTES,
};
pub use linear::LinearBackend;
pub use memory::MemoryBackend;
pub use rbd::{RbdBackend, RbdOptions};
pub use zero::ZeroBackend;

/// How a backend supports an optional operation (nbdkit's `can_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// Not at all: callers must not call it.
    None,
    /// Emulated (e.g. write-zeroes as ordinary writes): correct, not faster.
    Emulate,
    /// Natively, cheaper than the emulation.
    Native,
}

/// What a backend can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Flush (and FUA) make data durable; `None` means writes are durable at once or never.
    pub flush: Support,
    /// Discard (TRIM).
    pub discard: Support,
    /// Write zeroes.
    pub write_zeroes: Support,
    /// Refuses writes.
    pub read_only: bool,
}

/// Sizes and capabilities of a backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendInfo {
    /// Size in bytes.
    pub size_bytes: u64,
    /// Smallest I/O unit that works (O_DIRECT needs the device's logical block size).
    pub logical_block: u32,
    /// Preferred minimum I/O unit.
    pub physical_block: u32,
    /// Preferred I/O size.
    pub optimal_block: u32,
    /// Capabilities.
    pub caps: Caps,
}

/// Who issued a request: carried with every request so stats and fairness can be per
/// client (the userspace analogue of dm-crypt forwarding the bio's cgroup to its workers).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct IoCtx {
    /// Client number (the NBD server uses its connection number; 0 = unattributed).
    pub client: u32,
}

/// One write of a batch handed to [`Backend::submit_writes`].
#[derive(Debug, Clone, Copy)]
pub struct WriteOp<'a> {
    /// Byte offset.
    pub offset: u64,
    /// Data.
    pub buf: &'a [u8],
    /// Durable before completion (Force Unit Access).
    pub fua: bool,
}

/// What an asynchronous request ([`AsyncIo`]) does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncOp {
    /// Read into the buffer.
    Read,
    /// Write from the buffer (never FUA: a FUA write takes the synchronous path).
    Write,
}

/// Called exactly once when an accepted asynchronous request has ended, from whichever
/// thread completed it (librbd's callback thread for RBD), with the request's buffer back.
pub type AsyncDone = Box<dyn FnOnce(Vec<u8>, Result<(), BackendError>) + Send>;

/// One asynchronous request: a read into, or a write from, `buf[..len]` at `offset`
/// ([`Backend::submit_async`]).
pub struct AsyncIo {
    /// Read or write.
    pub op: AsyncOp,
    /// Byte offset.
    pub offset: u64,
    /// Bytes (the first `len` of `buf`).
    pub len: usize,
    /// The data: read into, or written from (a layer may transform it in place, as the
    /// volume encrypts a write in the caller's buffer).
    pub buf: Vec<u8>,
    /// Who issued it.
    pub ctx: IoCtx,
    /// The completion.
    pub done: AsyncDone,
}

impl std::fmt::Debug for AsyncIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncIo")
            .field("op", &self.op)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// Storage for ciphertext (or, for a `Volume`, plaintext).
///
/// Offsets and lengths are bytes. Callers validate ranges against `info().size_bytes`
/// before calling; implementations still return [`BackendError::OutOfRange`] rather than
/// touching anything outside the device.
pub trait Backend: Send + Sync {
    /// Sizes and capabilities.
    fn info(&self) -> &BackendInfo;

    /// Reads exactly `buf.len()` bytes at `offset`.
    ///
    /// # Errors
    /// I/O errors, out-of-range requests.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), BackendError>;

    /// Writes all of `buf` at `offset`; with `fua` the data is durable on return.
    ///
    /// # Errors
    /// I/O errors, out-of-range requests, read-only backends.
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<(), BackendError>;

    /// Lends the `len` bytes at `offset` to `f` in place, without copying them into a
    /// buffer, where the backend can (a regular file through a memory mapping). `None`:
    /// it cannot (the default), it would rather copy a read this short (a mapped page
    /// costs a fault: `len == 0` asks only whether it lends at all), or the lent bytes
    /// turned out not to be the data (the file shrank under a mapping), and the caller
    /// uses [`Backend::read_at`]; what `f` saw, if it was called, must be discarded.
    /// `Some(Err)`: the read failed.
    ///
    /// The caller must keep its own writes off the range while `f` runs (the engine's
    /// range locks do): the bytes are the backend's live storage, not a copy.
    fn read_with(
        &self,
        offset: u64,
        len: usize,
        f: &mut dyn FnMut(&[u8]),
    ) -> Option<Result<(), BackendError>> {
        let _ = (offset, len, f);
        None
    }

    /// [`Backend::read_at`] on behalf of a client. Backends that keep per-client state
    /// (the engine's `Volume`) override it; the default ignores the context.
    ///
    /// # Errors
    /// As [`Backend::read_at`].
    fn read_at_ctx(&self, buf: &mut [u8], offset: u64, ctx: IoCtx) -> Result<(), BackendError> {
        let _ = ctx;
        self.read_at(buf, offset)
    }

    /// [`Backend::write_at`] on behalf of a client; see [`Backend::read_at_ctx`].
    ///
    /// # Errors
    /// As [`Backend::write_at`].
    fn write_at_ctx(
        &self,
        buf: &[u8],
        offset: u64,
        fua: bool,
        ctx: IoCtx,
    ) -> Result<(), BackendError> {
        let _ = ctx;
        self.write_at(buf, offset, fua)
    }

    /// [`Backend::write_at_ctx`] from a buffer the caller gives up: the backend may
    /// overwrite `buf` (the engine's `Volume` encrypts in place in it instead of copying the
    /// plaintext into a buffer of its own first). For callers that own the buffer the
    /// request arrived in and do not read it afterwards (the NBD server's receive buffer, a
    /// ublk I/O buffer). The default writes it as [`Backend::write_at_ctx`] does.
    ///
    /// # Errors
    /// As [`Backend::write_at`]; on error `buf` may hold anything.
    fn write_in_place_ctx(
        &self,
        buf: &mut [u8],
        offset: u64,
        fua: bool,
        ctx: IoCtx,
    ) -> Result<(), BackendError> {
        self.write_at_ctx(buf, offset, fua, ctx)
    }

    /// Makes every completed write durable.
    ///
    /// # Errors
    /// I/O errors.
    fn flush(&self) -> Result<(), BackendError>;

    /// Discards a range (contents afterwards unspecified, but reads succeed).
    ///
    /// # Errors
    /// [`BackendError::Unsupported`] unless `caps.discard` allows it.
    fn discard(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        let _ = (offset, len);
        Err(BackendError::Unsupported("discard"))
    }

    /// The holes (unallocated ranges: never written, or discarded) in
    /// `[offset, offset + len)`, sorted and disjoint, as `(offset, length)`; `None` when
    /// the backend cannot tell, and everything then counts as allocated. Answers NBD's
    /// `base:allocation` queries.
    fn holes(&self, offset: u64, len: u64) -> Option<Vec<(u64, u64)>> {
        let _ = (offset, len);
        None
    }

    /// Writes zeroes over a range.
    ///
    /// # Errors
    /// [`BackendError::Unsupported`] unless `caps.write_zeroes` allows it.
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), BackendError> {
        let _ = (offset, len, fua);
        Err(BackendError::Unsupported("write_zeroes"))
    }

    /// [`Backend::write_zeroes`] on behalf of a client; see [`Backend::read_at_ctx`].
    ///
    /// # Errors
    /// As [`Backend::write_zeroes`].
    fn write_zeroes_ctx(
        &self,
        offset: u64,
        len: u64,
        fua: bool,
        ctx: IoCtx,
    ) -> Result<(), BackendError> {
        let _ = ctx;
        self.write_zeroes(offset, len, fua)
    }

    /// `Some(unit)`: every call of this backend is atomic with respect to every other call
    /// within each `unit`-aligned stretch of `unit` bytes: a read sees each stretch as one
    /// write left it, two writes of one stretch never interleave, and
    /// [`Backend::modify_at`] works there. The engine then needs no range locks of its own
    /// over sectors that never straddle a stretch (the memory backend's per-chunk locks
    /// already give it what the locks would). `None` (the default): no such promise, and
    /// wrappers that do not forward it keep the default.
    fn atomic_unit(&self) -> Option<u64> {
        None
    }

    /// Hands the `len` bytes at `offset` to `f` to change in place, as one step of a
    /// backend with an [`Backend::atomic_unit`]: no other call touches them between the
    /// read and the write. The range must lie inside one unit. With `fua` the result is
    /// durable on return.
    ///
    /// # Errors
    /// [`BackendError::Unsupported`] where there is no atomic unit (the default) or the
    /// range crosses one; out-of-range requests; I/O errors.
    fn modify_at(
        &self,
        offset: u64,
        len: usize,
        fua: bool,
        f: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), BackendError> {
        let _ = (offset, len, fua, f);
        Err(BackendError::Unsupported(
            "atomic read-modify-write (the backend has no atomic unit)",
        ))
    }

    /// One plug: the device receives these writes together, in this order. The default
    /// issues them one by one; backends with a batch interface (io_uring) override it.
    ///
    /// # Errors
    /// The first failing write's error; later writes of the batch may or may not have been
    /// issued.
    fn submit_writes(&self, batch: &[WriteOp<'_>]) -> Result<(), BackendError> {
        for w in batch {
            self.write_at(w.buf, w.offset, w.fua)?;
        }
        Ok(())
    }

    /// Whether [`Backend::submit_async`] may accept requests (a hint for callers choosing
    /// how to drive requests; false by default).
    fn supports_async(&self) -> bool {
        false
    }

    /// Whether requests are served from this machine (memory, the page cache, a local
    /// file or device) and never wait on another party (a network round trip, a gate held
    /// closed): a server may then run small ones on the thread that read them, one after
    /// another, instead of handing each to a thread of its own. A hint; false by default
    /// (every request may block for long), wrappers forward it.
    fn local(&self) -> bool {
        false
    }

    /// Starts `io` and returns without waiting for it: the asynchronous request path, for
    /// backends whose I/O completes on threads of their own (librbd), so that no caller
    /// thread blocks per request.
    ///
    /// `Err(io)` hands the request back with its buffer **untouched** and `done` never to
    /// be called (a layer may have swapped it for its own: the caller drops it): this
    /// backend or this request (alignment, a conflicting write, ...) has no asynchronous
    /// path, and the caller runs it through the synchronous methods, which give the same
    /// results. `Ok(())`: accepted; `io.done` is called exactly once, with
    /// the outcome, once the request has ended (a write: once the backend completed it, so
    /// a later [`Backend::flush`] covers it). Nothing a completion holds may keep the
    /// backend alive (a backend dropped on its own completion thread could wait for
    /// itself): callers wait for their requests to end before dropping the backend.
    fn submit_async(self: std::sync::Arc<Self>, io: AsyncIo) -> Result<(), AsyncIo> {
        Err(io)
    }
}

/// Checks that `[offset, offset + len)` lies inside a device of `size` bytes.
///
/// # Errors
/// [`BackendError::OutOfRange`] otherwise (including on overflow).
pub fn check_range(offset: u64, len: u64, size: u64) -> Result<(), BackendError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(BackendError::OutOfRange { offset, len, size }),
    }
}

impl<T: Backend + ?Sized> Backend for std::sync::Arc<T> {
    fn info(&self) -> &BackendInfo {
        (**self).info()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), BackendError> {
        (**self).read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<(), BackendError> {
        (**self).write_at(buf, offset, fua)
    }
    fn read_at_ctx(&self, buf: &mut [u8], offset: u64, ctx: IoCtx) -> Result<(), BackendError> {
        (**self).read_at_ctx(buf, offset, ctx)
    }
    fn read_with(
        &self,
        offset: u64,
        len: usize,
        f: &mut dyn FnMut(&[u8]),
    ) -> Option<Result<(), BackendError>> {
        (**self).read_with(offset, len, f)
    }
    fn write_at_ctx(
        &self,
        buf: &[u8],
        offset: u64,
        fua: bool,
        ctx: IoCtx,
    ) -> Result<(), BackendError> {
        (**self).write_at_ctx(buf, offset, fua, ctx)
    }
    fn write_in_place_ctx(
        &self,
        buf: &mut [u8],
        offset: u64,
        fua: bool,
        ctx: IoCtx,
    ) -> Result<(), BackendError> {
        (**self).write_in_place_ctx(buf, offset, fua, ctx)
    }
    fn flush(&self) -> Result<(), BackendError> {
        (**self).flush()
    }
    fn holes(&self, offset: u64, len: u64) -> Option<Vec<(u64, u64)>> {
        (**self).holes(offset, len)
    }
    fn discard(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        (**self).discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), BackendError> {
        (**self).write_zeroes(offset, len, fua)
    }
    fn write_zeroes_ctx(
        &self,
        offset: u64,
        len: u64,
        fua: bool,
        ctx: IoCtx,
    ) -> Result<(), BackendError> {
        (**self).write_zeroes_ctx(offset, len, fua, ctx)
    }
    fn submit_writes(&self, batch: &[WriteOp<'_>]) -> Result<(), BackendError> {
        (**self).submit_writes(batch)
    }
    fn atomic_unit(&self) -> Option<u64> {
        (**self).atomic_unit()
    }
    fn modify_at(
        &self,
        offset: u64,
        len: usize,
        fua: bool,
        f: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), BackendError> {
        (**self).modify_at(offset, len, fua, f)
    }
    fn supports_async(&self) -> bool {
        (**self).supports_async()
    }
    fn local(&self) -> bool {
        (**self).local()
    }
    fn submit_async(self: std::sync::Arc<Self>, io: AsyncIo) -> Result<(), AsyncIo> {
        std::sync::Arc::clone(&*self).submit_async(io)
    }
}
