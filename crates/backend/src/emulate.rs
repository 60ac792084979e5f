//! What a front end's zeroing and discard requests mean, decided once for every front end
//! (the NBD server, ublk, FUSE, kernel NBD through the NBD server, and those to come). A
//! front end maps its protocol's request onto one of these functions and never calls the
//! backend's [`IoKind::WriteZeroes`]/[`IoKind::Discard`] itself, so all front ends give a
//! request the same meaning:
//!
//! | request | backend has it | backend has not |
//! |---|---|---|
//! | write zeroes | [`IoKind::WriteZeroes`] | zero-filled writes, 64 KiB at a time |
//! | discard | [`IoKind::Discard`] | refused, `Unsupported` (dm-crypt without `allow_discards`) |
//! | punch a hole (must read back as zeroes) | write zeroes | refused, as discard |
//!
//! FUA is one flush after the whole request, whatever the request and however many
//! writes it took: a request is acknowledged durable as one piece. A discard of an
//! encrypted volume's ciphertext leaves noise behind (the plaintext of whatever the device
//! then holds), so a request whose contract is "reads back as zeroes" (fallocate's
//! `PUNCH_HOLE`) is [`punch_hole`], never a discard.
//!
//! It also holds the default paths of the backend contract: [`fallback`] for the kinds of
//! I/O a backend does not implement, [`writes_one_by_one`] for a batch.

use crate::{Backend, BackendError, Io, IoCtx, IoKind, Support, WriteOp};

/// What a backend does with a kind of I/O it does not implement itself: a
/// [`IoKind::WriteOwned`] is an ordinary write, every optional kind is refused with
/// [`BackendError::Unsupported`].
///
/// # Errors
/// As the write, or `Unsupported`.
pub fn fallback<B: Backend + ?Sized>(b: &B, io: Io<'_>) -> Result<(), BackendError> {
    match io.kind {
        IoKind::WriteOwned(buf) => b.submit(Io {
            kind: IoKind::Write(buf),
            ..io
        }),
        _ => Err(io.unsupported()),
    }
}

/// A batch of writes as single writes, in order (the default [`Backend::submit_writes`]).
///
/// # Errors
/// The first failing write's error; the writes after it are not issued.
pub fn writes_one_by_one<B: Backend + ?Sized>(
    b: &B,
    batch: &[WriteOp<'_>],
) -> Result<(), BackendError> {
    for w in batch {
        b.submit(Io::write(w.buf, w.offset).fua(w.fua))?;
    }
    Ok(())
}

/// A zero buffer for emulated write-zeroes (statically zero: no allocation per request).
pub static ZEROES: [u8; 64 * 1024] = [0; 64 * 1024];

/// Makes `[offset, offset + len)` read back as zeroes: the backend's own write-zeroes if it
/// has one, else zero-filled writes. With `fua`, durable before returning.
///
/// # Errors
/// The backend's errors (a range beyond the device among them).
pub fn write_zeroes(
    b: &dyn Backend,
    offset: u64,
    len: u64,
    fua: bool,
    ctx: IoCtx,
) -> Result<(), BackendError> {
    if b.info().caps.write_zeroes != Support::None {
        return b.submit(Io::write_zeroes(offset, len).fua(fua).ctx(ctx));
    }
    let mut pos = 0;
    while pos < len {
        // At most ZEROES.len(), so it fits a usize.
        let n = (len - pos).min(ZEROES.len() as u64) as usize;
        b.submit(Io::write(&ZEROES[..n], offset + pos).ctx(ctx))?;
        pos += n as u64;
    }
    if fua {
        b.flush()?;
    }
    Ok(())
}

/// Discards `[offset, offset + len)`: the contents are undefined afterwards (for an
/// encrypted volume, noise). With `fua`, durable before returning.
///
/// # Errors
/// [`BackendError::Unsupported`] when the backend does not discard (the front end then
/// answers as its protocol says for an unsupported request); the backend's errors.
pub fn discard(b: &dyn Backend, offset: u64, len: u64, fua: bool) -> Result<(), BackendError> {
    if b.info().caps.discard == Support::None {
        return Err(BackendError::Unsupported("discard"));
    }
    b.submit(Io::discard(offset, len))?;
    if fua {
        b.flush()?;
    }
    Ok(())
}

/// A discard whose contract is that the range reads back as zeroes (fallocate(2)'s
/// `PUNCH_HOLE`, which the loop driver also sends for a block device's write-zeroes):
/// written as zeroes (partial sectors read-modify-written), refused where discards are.
///
/// # Errors
/// [`BackendError::Unsupported`] when the backend does not discard; the backend's errors.
pub fn punch_hole(
    b: &dyn Backend,
    offset: u64,
    len: u64,
    fua: bool,
    ctx: IoCtx,
) -> Result<(), BackendError> {
    if b.info().caps.discard == Support::None {
        return Err(BackendError::Unsupported("discard"));
    }
    write_zeroes(b, offset, len, fua, ctx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BackendInfo, Caps, MemoryBackend};
    use std::sync::Mutex;

    /// A memory device that logs the calls it gets and claims the given capabilities.
    struct Log {
        inner: MemoryBackend,
        info: BackendInfo,
        calls: Mutex<Vec<String>>,
    }

    impl Log {
        fn new(discard: Support, write_zeroes: Support) -> Log {
            let inner = MemoryBackend::new(1 << 20).expect("memory");
            let info = BackendInfo {
                caps: Caps {
                    discard,
                    write_zeroes,
                    ..inner.info().caps
                },
                ..inner.info().clone()
            };
            Log {
                inner,
                info,
                calls: Mutex::new(Vec::new()),
            }
        }
        fn calls(&self) -> Vec<String> {
            std::mem::take(&mut *self.calls.lock().expect("lock"))
        }
        fn log(&self, s: String) {
            self.calls.lock().expect("lock").push(s);
        }
    }

    impl Backend for Log {
        fn info(&self) -> &BackendInfo {
            &self.info
        }
        fn submit(&self, io: Io<'_>) -> Result<(), BackendError> {
            let (offset, fua) = (io.offset, io.fua);
            match &io.kind {
                IoKind::Write(buf) => self.log(format!("write {offset} {} fua={fua}", buf.len())),
                IoKind::Discard(len) => self.log(format!("discard {offset} {len}")),
                IoKind::WriteZeroes(len) => self.log(format!("zeroes {offset} {len} fua={fua}")),
                _ => {}
            }
            self.inner.submit(io)
        }
        fn flush(&self) -> Result<(), BackendError> {
            self.log("flush".into());
            Ok(())
        }
    }

    fn reads_zero(b: &Log, offset: u64, len: usize) -> bool {
        let mut back = vec![1u8; len];
        b.inner.read_at(&mut back, offset).expect("read");
        back.iter().all(|&x| x == 0)
    }

    #[test]
    fn write_zeroes_without_support_writes_zeroes_and_flushes_once_for_fua() {
        let b = Log::new(Support::None, Support::None);
        b.inner
            .write_at(&[0xffu8; 150_000], 0, false)
            .expect("fill");
        write_zeroes(&b, 1000, 140_000, true, IoCtx::default()).expect("zeroes");
        assert!(reads_zero(&b, 1000, 140_000));
        let mut edge = [0u8; 1];
        b.inner.read_at(&mut edge, 999).expect("read");
        assert_eq!(edge[0], 0xff, "the byte before the range is kept");
        assert_eq!(
            b.calls(),
            [
                "write 1000 65536 fua=false",
                "write 66536 65536 fua=false",
                "write 132072 8928 fua=false",
                "flush"
            ]
        );
        write_zeroes(&b, 0, 4096, false, IoCtx::default()).expect("zeroes");
        assert_eq!(
            b.calls(),
            ["write 0 4096 fua=false"],
            "no flush without FUA"
        );
    }

    #[test]
    fn write_zeroes_uses_the_backends_own() {
        let b = Log::new(Support::None, Support::Native);
        write_zeroes(&b, 0, 8192, true, IoCtx::default()).expect("zeroes");
        assert_eq!(b.calls(), ["zeroes 0 8192 fua=true"]);
    }

    #[test]
    fn discard_is_refused_without_support_and_flushed_for_fua() {
        let b = Log::new(Support::None, Support::Native);
        assert!(matches!(
            discard(&b, 0, 4096, false),
            Err(BackendError::Unsupported(_))
        ));
        assert!(b.calls().is_empty(), "nothing reached the backend");
        let b = Log::new(Support::Native, Support::Native);
        discard(&b, 0, 4096, true).expect("discard");
        assert_eq!(b.calls(), ["discard 0 4096", "flush"]);
    }

    #[test]
    fn a_punched_hole_reads_back_as_zeroes_and_is_refused_without_discards() {
        let b = Log::new(Support::None, Support::None);
        assert!(matches!(
            punch_hole(&b, 0, 4096, false, IoCtx::default()),
            Err(BackendError::Unsupported(_))
        ));
        let b = Log::new(Support::Native, Support::None);
        b.inner.write_at(&[0xffu8; 8192], 0, false).expect("fill");
        punch_hole(&b, 512, 4096, false, IoCtx::default()).expect("punch");
        assert!(reads_zero(&b, 512, 4096));
        assert_eq!(
            b.calls(),
            ["write 512 4096 fua=false"],
            "zeroes, not a discard"
        );
    }
}
