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

/// What one I/O does. Every offset an I/O carries is [`Io::offset`]; lengths are bytes.
pub enum IoKind<'a> {
    /// Read exactly the buffer's length.
    Read(&'a mut [u8]),
    /// Write all of the buffer.
    Write(&'a [u8]),
    /// Write all of a buffer the caller gives up: the backend may overwrite it (the
    /// engine's `Volume` encrypts in place in it instead of copying the plaintext into a
    /// buffer of its own first). For callers that own the buffer the request arrived in
    /// and do not read it afterwards (the NBD server's receive buffer, a ublk I/O
    /// buffer). On error the buffer may hold anything. By default, a [`IoKind::Write`].
    WriteOwned(&'a mut [u8]),
    /// Write zeroes over this many bytes (where `caps.write_zeroes` allows it; front ends
    /// go through [`emulate::write_zeroes`], which falls back to zero-filled writes).
    WriteZeroes(u64),
    /// Discard this many bytes: contents afterwards unspecified, reads succeed (where
    /// `caps.discard` allows it; front ends go through [`emulate`]).
    Discard(u64),
    /// Lend the `len` bytes to `f` in place, without copying them into a buffer, where
    /// the backend can (a regular file through a memory mapping).
    /// [`BackendError::Unsupported`]: it cannot (the default), it would rather copy a read
    /// this short (a mapped page costs a fault: `len == 0` asks only whether it lends at
    /// all), or the lent bytes turned out not to be the data (the file shrank under a
    /// mapping); the caller then reads, and must discard what `f` saw if it was called.
    ///
    /// The caller must keep its own writes off the range while `f` runs (the engine's
    /// range locks do): the bytes are the backend's live storage, not a copy.
    Lend {
        /// Bytes.
        len: usize,
        /// Sees the bytes.
        f: &'a mut dyn FnMut(&[u8]),
    },
    /// Hand the `len` bytes to `f` to change in place as one step of a backend with an
    /// atomic unit ([`Hints::atomic_unit`]): no other I/O touches them between the read
    /// and the write. The range must lie inside one unit. [`BackendError::Unsupported`]
    /// where there is no atomic unit (the default) or the range crosses one.
    Modify {
        /// Bytes.
        len: usize,
        /// Changes the bytes.
        f: &'a mut dyn FnMut(&mut [u8]),
    },
    /// Report the holes (unallocated ranges: never written, or discarded) among the `len`
    /// bytes into `out` (cleared first), sorted and disjoint, as `(offset, length)`.
    /// [`BackendError::Unsupported`] when the backend cannot tell (the default), and
    /// everything then counts as allocated. Answers NBD's `base:allocation` queries.
    Holes {
        /// Bytes.
        len: u64,
        /// The holes found.
        out: &'a mut Vec<(u64, u64)>,
    },
}

impl IoKind<'_> {
    /// Bytes the I/O covers.
    pub fn len(&self) -> u64 {
        match self {
            IoKind::Read(b) => b.len() as u64,
            IoKind::Write(b) => b.len() as u64,
            IoKind::WriteOwned(b) => b.len() as u64,
            IoKind::WriteZeroes(n) | IoKind::Discard(n) | IoKind::Holes { len: n, .. } => *n,
            IoKind::Lend { len, .. } | IoKind::Modify { len, .. } => *len as u64,
        }
    }

    /// Whether it covers no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What it is called in an [`BackendError::Unsupported`].
    pub fn name(&self) -> &'static str {
        match self {
            IoKind::Read(_) => "read",
            IoKind::Write(_) | IoKind::WriteOwned(_) => "write",
            IoKind::WriteZeroes(_) => "write_zeroes",
            IoKind::Discard(_) => "discard",
            IoKind::Lend { .. } => "lend",
            IoKind::Modify { .. } => "atomic read-modify-write (the backend has no atomic unit)",
            IoKind::Holes { .. } => "holes",
        }
    }

    /// Whether it changes the device's contents.
    pub fn writes(&self) -> bool {
        matches!(
            self,
            IoKind::Write(_)
                | IoKind::WriteOwned(_)
                | IoKind::WriteZeroes(_)
                | IoKind::Discard(_)
                | IoKind::Modify { .. }
        )
    }
}

impl std::fmt::Debug for IoKind<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}({})", self.name(), self.len())
    }
}

/// One I/O handed to [`Backend::submit`]: what, where, with which flags, for whom.
#[derive(Debug)]
pub struct Io<'a> {
    /// Byte offset.
    pub offset: u64,
    /// What it does.
    pub kind: IoKind<'a>,
    /// Durable on return (Force Unit Access); meaningful for the kinds that write.
    pub fua: bool,
    /// Who issued it.
    pub ctx: IoCtx,
}

impl<'a> Io<'a> {
    /// An I/O of `kind` at `offset`, without FUA, unattributed.
    pub fn new(offset: u64, kind: IoKind<'a>) -> Self {
        Io {
            offset,
            kind,
            fua: false,
            ctx: IoCtx::default(),
        }
    }
    /// A read into `buf` at `offset`.
    pub fn read(buf: &'a mut [u8], offset: u64) -> Self {
        Io::new(offset, IoKind::Read(buf))
    }
    /// A write of `buf` at `offset`.
    pub fn write(buf: &'a [u8], offset: u64) -> Self {
        Io::new(offset, IoKind::Write(buf))
    }
    /// A write of a buffer the backend may overwrite ([`IoKind::WriteOwned`]).
    pub fn write_owned(buf: &'a mut [u8], offset: u64) -> Self {
        Io::new(offset, IoKind::WriteOwned(buf))
    }
    /// Zeroes over `len` bytes at `offset`.
    pub fn write_zeroes(offset: u64, len: u64) -> Self {
        Io::new(offset, IoKind::WriteZeroes(len))
    }
    /// A discard of `len` bytes at `offset`.
    pub fn discard(offset: u64, len: u64) -> Self {
        Io::new(offset, IoKind::Discard(len))
    }
    /// With FUA set as given.
    #[must_use]
    pub fn fua(mut self, fua: bool) -> Self {
        self.fua = fua;
        self
    }
    /// On behalf of `ctx`.
    #[must_use]
    pub fn ctx(mut self, ctx: IoCtx) -> Self {
        self.ctx = ctx;
        self
    }
    /// The same I/O at another offset (a layer mapping it onto the device below).
    #[must_use]
    pub fn at(mut self, offset: u64) -> Self {
        self.offset = offset;
        self
    }
    /// The refusal of a backend without this kind: [`BackendError::Unsupported`].
    pub fn unsupported(&self) -> BackendError {
        BackendError::Unsupported(self.kind.name())
    }
}

/// What a backend promises beyond [`BackendInfo`], for callers choosing how to drive it.
/// Every field's default is the safe answer; wrappers that do not forward [`Backend::hints`]
/// keep it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hints {
    /// Requests are served from this machine (memory, the page cache, a local file or
    /// device) and never wait on another party (a network round trip, a gate held
    /// closed): a server may then run small ones on the thread that read them, one after
    /// another, instead of handing each to a thread of its own.
    pub local: bool,
    /// `Some(unit)`: every I/O of this backend is atomic with respect to every other I/O
    /// within each `unit`-aligned stretch of `unit` bytes: a read sees each stretch as one
    /// write left it, two writes of one stretch never interleave, and [`IoKind::Modify`]
    /// works there. The engine then needs no range locks of its own over sectors that
    /// never straddle a stretch (the memory backend's per-chunk locks already give it
    /// what the locks would).
    pub atomic_unit: Option<u64>,
    /// [`Backend::submit_async`] may accept requests.
    pub async_submit: bool,
}

/// Storage for ciphertext (or, for a `Volume`, plaintext).
///
/// The contract is three methods: [`Backend::info`] describes, [`Backend::submit`] runs
/// one [`Io`] (its kind, flags and context travel with it), [`Backend::flush`] makes
/// completed writes durable. The rest is optional, with a default that is always correct:
/// [`Backend::hints`] (nothing promised), [`Backend::submit_writes`] (one by one),
/// [`Backend::submit_async`] (refused: the caller runs the request synchronously). A
/// wrapper forwards these, nothing else. Callers use the helpers below (`read_at`,
/// `write_at`, ...), which build an [`Io`] and submit it, and which implementations do
/// not override; front ends give zeroing and discard requests their meaning through
/// [`emulate`].
///
/// Offsets and lengths are bytes. Callers validate ranges against `info().size_bytes`
/// before calling; implementations still return [`BackendError::OutOfRange`] rather than
/// touching anything outside the device.
pub trait Backend: Send + Sync {
    /// Sizes and capabilities.
    fn info(&self) -> &BackendInfo;

    /// Runs one I/O. A kind the backend does not implement goes to [`emulate::fallback`]
    /// (a [`IoKind::WriteOwned`] is written as a [`IoKind::Write`]; the optional kinds
    /// are refused with [`BackendError::Unsupported`]).
    ///
    /// # Errors
    /// I/O errors, out-of-range requests, writes to read-only backends, unsupported kinds.
    fn submit(&self, io: Io<'_>) -> Result<(), BackendError>;

    /// Makes every completed write durable.
    ///
    /// # Errors
    /// I/O errors.
    fn flush(&self) -> Result<(), BackendError>;

    /// What the backend promises beyond its info; nothing by default.
    fn hints(&self) -> Hints {
        Hints::default()
    }

    /// Sectors that failed authentication ([`BackendError::Integrity`]) since this
    /// backend was opened, for a backend that checks tags (dm-crypt's AEAD modes over
    /// dm-integrity); `None` for one that does not.
    fn integrity_failures(&self) -> Option<u64> {
        None
    }

    /// One plug: the device receives these writes together, in this order. The default
    /// submits them one by one; backends with a batch interface (io_uring) override it.
    ///
    /// # Errors
    /// The first failing write's error; later writes of the batch may or may not have been
    /// issued.
    fn submit_writes(&self, batch: &[WriteOp<'_>]) -> Result<(), BackendError> {
        emulate::writes_one_by_one(self, batch)
    }

    /// Starts `io` and returns without waiting for it: the asynchronous request path, for
    /// backends whose I/O completes on threads of their own (librbd, io_uring), so that no
    /// caller thread blocks per request ([`Hints::async_submit`] says whether to try).
    ///
    /// `Err(io)` hands the request back with its buffer **untouched** and `done` never to
    /// be called (a layer may have swapped it for its own: the caller drops it): this
    /// backend or this request (alignment, a conflicting write, ...) has no asynchronous
    /// path, and the caller runs it through [`Backend::submit`], which gives the same
    /// results. `Ok(())`: accepted; `io.done` is called exactly once, with
    /// the outcome, once the request has ended (a write: once the backend completed it, so
    /// a later [`Backend::flush`] covers it). Nothing a completion holds may keep the
    /// backend alive (a backend dropped on its own completion thread could wait for
    /// itself): callers wait for their requests to end before dropping the backend.
    fn submit_async(self: std::sync::Arc<Self>, io: AsyncIo) -> Result<(), AsyncIo> {
        Err(io)
    }

    // Call-site helpers: each builds one `Io` and submits it. Implementations never
    // override them (they are the contract's vocabulary, not part of it).

    /// Reads exactly `buf.len()` bytes at `offset`.
    ///
    /// # Errors
    /// I/O errors, out-of-range requests.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), BackendError> {
        self.submit(Io::read(buf, offset))
    }

    /// Writes all of `buf` at `offset`; with `fua` the data is durable on return.
    ///
    /// # Errors
    /// I/O errors, out-of-range requests, read-only backends.
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<(), BackendError> {
        self.submit(Io::write(buf, offset).fua(fua))
    }

    /// The backend's own write-zeroes over a range ([`IoKind::WriteZeroes`]); front ends
    /// use [`emulate::write_zeroes`].
    ///
    /// # Errors
    /// [`BackendError::Unsupported`] unless `caps.write_zeroes` allows it.
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), BackendError> {
        self.submit(Io::write_zeroes(offset, len).fua(fua))
    }

    /// The backend's own discard of a range ([`IoKind::Discard`]); front ends use
    /// [`emulate::discard`].
    ///
    /// # Errors
    /// [`BackendError::Unsupported`] unless `caps.discard` allows it.
    fn discard(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        self.submit(Io::discard(offset, len))
    }

    /// Lends the `len` bytes at `offset` to `f` ([`IoKind::Lend`]). `None`: not lent (the
    /// caller reads instead, discarding what `f` saw); `Some(Err)`: the read failed.
    fn read_with(
        &self,
        offset: u64,
        len: usize,
        f: &mut dyn FnMut(&[u8]),
    ) -> Option<Result<(), BackendError>> {
        match self.submit(Io::new(offset, IoKind::Lend { len, f })) {
            Err(BackendError::Unsupported(_)) => None,
            r => Some(r),
        }
    }

    /// The holes in `[offset, offset + len)` ([`IoKind::Holes`]); `None` when the backend
    /// cannot tell.
    fn holes(&self, offset: u64, len: u64) -> Option<Vec<(u64, u64)>> {
        let mut out = Vec::new();
        self.submit(Io::new(offset, IoKind::Holes { len, out: &mut out }))
            .ok()?;
        Some(out)
    }

    /// Changes the `len` bytes at `offset` in place as one atomic step ([`IoKind::Modify`]);
    /// with `fua` the result is durable on return.
    ///
    /// # Errors
    /// [`BackendError::Unsupported`] where there is no atomic unit or the range crosses
    /// one; out-of-range requests; I/O errors.
    fn modify_at(
        &self,
        offset: u64,
        len: usize,
        fua: bool,
        f: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), BackendError> {
        self.submit(Io::new(offset, IoKind::Modify { len, f }).fua(fua))
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
    fn submit(&self, io: Io<'_>) -> Result<(), BackendError> {
        (**self).submit(io)
    }
    fn flush(&self) -> Result<(), BackendError> {
        (**self).flush()
    }
    fn hints(&self) -> Hints {
        (**self).hints()
    }
    fn integrity_failures(&self) -> Option<u64> {
        (**self).integrity_failures()
    }
    fn submit_writes(&self, batch: &[WriteOp<'_>]) -> Result<(), BackendError> {
        (**self).submit_writes(batch)
    }
    fn submit_async(self: std::sync::Arc<Self>, io: AsyncIo) -> Result<(), AsyncIo> {
        std::sync::Arc::clone(&*self).submit_async(io)
    }
}
