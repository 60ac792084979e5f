//! The backend a named instance serves while it re-encrypts itself (online reencryption,
//! `ucrypt reencrypt --active-name NAME`): the data area in two parts around a moving
//! boundary, `[0, boundary)` through the new key's volume and `[boundary, end)` through the
//! old key's, as the LUKS2 header's two segments say.
//!
//! The data pass ([`crate::reencrypt::Run::run_gated`]) holds each hotzone through
//! [`Gate`] from before it reads the old ciphertext until the header names the hotzone
//! done: client requests that touch a held range wait, and a hold waits for the requests
//! already in flight there. So a client never reads a sector while it is rewritten, never
//! writes one the pass is about to overwrite with what it read before, and the boundary a
//! request was split at cannot move under it. The header on disk always describes what is
//! where: a crash leaves a state that the next open (or `reencrypt --resume-only`) recovers
//! exactly as after an offline run.
//!
//! One mutex per request guards the few ranges in flight; the cost is paid only while a
//! reencryption runs (afterwards the instance serves a plain volume again).

use crate::reencrypt::Gate;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use ucrypt_backend::{emulate, Backend, BackendError, BackendInfo, Io, IoKind};

/// Old and new volumes around a boundary that only grows.
pub struct Reencrypting {
    old: Arc<dyn Backend>,
    new: Arc<dyn Backend>,
    info: BackendInfo,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// Bytes `[0, boundary)` are under the new key.
    boundary: u64,
    /// Ranges the data pass holds.
    held: Vec<(u64, u64)>,
    /// Ranges of client requests in flight (one entry per request).
    inflight: Vec<(u64, u64)>,
    /// The pass failed while holding a range: requests there fail instead of waiting for a
    /// release that will not come (the on-disk hotzone needs recovery at the next open).
    failed: bool,
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

/// A request registered in flight; leaves on drop.
struct InFlight<'a> {
    gate: &'a Reencrypting,
    range: (u64, u64),
    boundary: u64,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut st = self.gate.lock();
        if let Some(i) = st.inflight.iter().position(|r| *r == self.range) {
            st.inflight.swap_remove(i);
        }
        drop(st);
        self.gate.changed.notify_all();
    }
}

impl Reencrypting {
    /// Serves `new` below `boundary` and `old` from it on; both views cover the whole data
    /// area (the same size).
    ///
    /// # Errors
    /// The two views differ in size.
    pub fn new(
        old: Arc<dyn Backend>,
        new: Arc<dyn Backend>,
        boundary: u64,
    ) -> Result<Reencrypting, String> {
        let (a, b) = (old.info(), new.info());
        if a.size_bytes != b.size_bytes {
            return Err(format!(
                "the old key's view has {} bytes, the new key's {}",
                a.size_bytes, b.size_bytes
            ));
        }
        let mut info = a.clone();
        // Requests are split at the boundary, which moves by whole hotzones (aligned to
        // both sector sizes): each part must be whole sectors of its side.
        info.logical_block = a.logical_block.max(b.logical_block);
        info.physical_block = a.physical_block.max(b.physical_block);
        info.optimal_block = a.optimal_block.max(b.optimal_block);
        info.caps.read_only = a.caps.read_only || b.caps.read_only;
        let size = a.size_bytes;
        Ok(Reencrypting {
            old,
            new,
            info,
            state: Mutex::new(State {
                boundary: boundary.min(size),
                ..State::default()
            }),
            changed: Condvar::new(),
        })
    }

    /// Bytes under the new key.
    pub fn boundary(&self) -> u64 {
        self.lock().boundary
    }

    /// After a failed pass: requests in held ranges fail (EIO) rather than wait.
    pub fn fail_held(&self) {
        self.lock().failed = true;
        self.changed.notify_all();
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until `[at, at + len)` is not held, then registers it in flight.
    fn enter(&self, at: u64, len: u64) -> Result<InFlight<'_>, BackendError> {
        let range = (at, at + len);
        let mut st = self.lock();
        while st.held.iter().any(|h| overlaps(*h, range)) {
            if st.failed {
                return Err(BackendError::Other(format!(
                    "bytes {at}+{len} lie in a reencryption hotzone whose rewrite failed; \
                     reopen the volume to recover it"
                )));
            }
            st = self
                .changed
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner);
        }
        st.inflight.push(range);
        Ok(InFlight {
            gate: self,
            range,
            boundary: st.boundary,
        })
    }

    /// Runs `f` on the parts of `[at, at + len)` on either side of the boundary: the view,
    /// the part's offset and its place in the request.
    fn each_side(
        &self,
        at: u64,
        len: u64,
        mut f: impl FnMut(&dyn Backend, u64, std::ops::Range<usize>) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        ucrypt_backend::check_range(at, len, self.info.size_bytes)?;
        if len == 0 {
            return Ok(());
        }
        let g = self.enter(at, len)?;
        let cut = g.boundary.clamp(at, at + len);
        if cut > at {
            f(self.new.as_ref(), at, 0..(cut - at) as usize)?;
        }
        if cut < at + len {
            f(self.old.as_ref(), cut, (cut - at) as usize..len as usize)?;
        }
        Ok(())
    }
}

impl Gate for Reencrypting {
    fn hold(&self, at: u64, len: u64) {
        let range = (at, at + len);
        let mut st = self.lock();
        st.held.push(range);
        while st.inflight.iter().any(|r| overlaps(*r, range)) {
            st = self
                .changed
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn release(&self, at: u64, len: u64) {
        let mut st = self.lock();
        if let Some(i) = st.held.iter().position(|h| *h == (at, at + len)) {
            st.held.swap_remove(i);
        }
        st.boundary = st.boundary.max(at + len);
        drop(st);
        self.changed.notify_all();
    }
}

impl Backend for Reencrypting {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    /// Split at the boundary: the part below it goes to the new view, the rest to the
    /// old one.
    fn submit(&self, io: Io<'_>) -> Result<(), BackendError> {
        let (offset, fua, ctx) = (io.offset, io.fua, io.ctx);
        match io.kind {
            IoKind::Read(buf) => self.each_side(offset, buf.len() as u64, |side, at, r| {
                side.submit(Io::read(&mut buf[r], at).ctx(ctx))
            }),
            IoKind::Write(buf) => self.each_side(offset, buf.len() as u64, |side, at, r| {
                side.submit(Io::write(&buf[r], at).fua(fua).ctx(ctx))
            }),
            IoKind::WriteOwned(buf) => self.each_side(offset, buf.len() as u64, |side, at, r| {
                side.submit(Io::write_owned(&mut buf[r], at).fua(fua).ctx(ctx))
            }),
            IoKind::Discard(len) => self.each_side(offset, len, |side, at, r| {
                side.submit(Io::discard(at, (r.end - r.start) as u64))
            }),
            IoKind::WriteZeroes(len) => self.each_side(offset, len, |side, at, r| {
                side.submit(
                    Io::write_zeroes(at, (r.end - r.start) as u64)
                        .fua(fua)
                        .ctx(ctx),
                )
            }),
            _ => emulate::fallback(self, io),
        }
    }

    fn flush(&self) -> Result<(), BackendError> {
        // Both views write the same device; flushing each covers either's writes.
        self.new.flush()?;
        self.old.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ucrypt_backend::MemoryBackend;

    fn mem(fill: u8) -> Arc<dyn Backend> {
        let m = MemoryBackend::new(1 << 20).unwrap();
        m.write_at(&vec![fill; 1 << 20], 0, false).unwrap();
        Arc::new(m)
    }

    #[test]
    fn requests_split_at_the_boundary_and_follow_it() {
        let (old, new) = (mem(1), mem(2));
        let r = Reencrypting::new(Arc::clone(&old), Arc::clone(&new), 8192).unwrap();
        let mut buf = vec![0u8; 16384];
        r.read_at(&mut buf, 0).unwrap();
        assert!(buf[..8192].iter().all(|&b| b == 2) && buf[8192..].iter().all(|&b| b == 1));
        r.hold(8192, 4096);
        r.release(8192, 4096);
        assert_eq!(r.boundary(), 12288);
        r.write_at(&[9u8; 8192], 8192, false).unwrap();
        let (mut a, mut b) = (vec![0u8; 8192], vec![0u8; 8192]);
        new.read_at(&mut a, 8192).unwrap();
        old.read_at(&mut b, 8192).unwrap();
        assert!(a[..4096].iter().all(|&x| x == 9) && a[4096..].iter().all(|&x| x == 2));
        assert!(b[..4096].iter().all(|&x| x == 1) && b[4096..].iter().all(|&x| x == 9));
    }

    #[test]
    fn a_held_range_waits_for_requests_and_requests_wait_for_it() {
        let r = Arc::new(Reencrypting::new(mem(1), mem(2), 0).unwrap());
        r.hold(0, 65536);
        let reader = {
            let r = Arc::clone(&r);
            std::thread::spawn(move || {
                let mut b = [0u8; 512];
                r.read_at(&mut b, 4096).unwrap();
                b[0]
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!reader.is_finished(), "a read went through a held hotzone");
        // Outside the hold: not blocked.
        let mut b = [0u8; 512];
        r.read_at(&mut b, 65536).unwrap();
        assert_eq!(b[0], 1);
        r.release(0, 65536);
        assert_eq!(
            reader.join().unwrap(),
            2,
            "read after the release: the new side"
        );
    }

    #[test]
    fn a_failed_pass_fails_requests_in_its_hotzone_instead_of_hanging() {
        let r = Arc::new(Reencrypting::new(mem(1), mem(2), 0).unwrap());
        r.hold(0, 4096);
        let reader = {
            let r = Arc::clone(&r);
            std::thread::spawn(move || r.read_at(&mut [0u8; 512], 0).is_err())
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        r.fail_held();
        assert!(reader.join().unwrap());
        assert!(r.read_at(&mut [0u8; 512], 4096).is_ok());
    }
}
