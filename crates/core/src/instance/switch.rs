//! [`Switch`]: the backend every front end of an instance serves, standing in front of the
//! volume so that the volume can be taken away (`luksSuspend`: I/O held, key wiped) and
//! replaced (`luksResume`, `resize`, `refresh`) while clients stay connected.
//!
//! Each request holds a read lock on one of [`SHARDS`] slots for its duration; the slot is
//! chosen per thread, so concurrent requests from different threads do not share a cache
//! line (a single shared lock word cost 3-15% of 4 KiB null-cipher requests in the engine's
//! own measurements, see BENCHMARKING.md). Suspending takes every slot's write lock, which
//! waits for in-flight requests to finish, then empties the slots: requests arriving while
//! suspended wait on a condition variable until a volume is put back. Dropping the last
//! reference to the old volume stops its workers and drops its cipher contexts, whose key
//! schedules are zeroized on drop.
//!
//! Asynchronous requests ([`Backend::submit_async`], the RBD path) do not hold the slot's
//! lock while in flight: the request takes an `Arc` of the current volume under the read
//! lock, counts itself in its slot's `pending`, and the count drops when the volume reports
//! it done. Suspending and replacing wait, after taking the volume out of the slots, until
//! every slot's count is zero, then flush: so "no request in flight, every acknowledged
//! write flushed" holds for them too. The completion keeps only the counters alive, never
//! the switch or the volume (a volume dropped on librbd's callback thread would close the
//! image from inside librbd).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use ucrypt_backend::{AsyncIo, Backend, BackendError, BackendInfo, Hints, Io, IoKind, WriteOp};

/// Lock slots (a power of two).
pub const SHARDS: usize = 16;

/// One slot, on its own cache line.
#[repr(align(128))]
struct Slot(RwLock<Option<Arc<dyn Backend>>>);

/// Asynchronous requests in flight, counted in the slot of the thread that submitted them
/// (on its own cache line).
#[repr(align(128))]
#[derive(Default)]
struct Pending(AtomicUsize);

/// Decrements one slot's pending count when dropped (when the request's completion ran,
/// or when a refused request's completion is dropped unused).
struct PendingGuard(Arc<[Pending]>, usize);

impl Drop for PendingGuard {
    fn drop(&mut self) {
        self.0[self.1].0.fetch_sub(1, Ordering::Release);
    }
}

/// A swappable, suspendable backend.
pub struct Switch {
    slots: Vec<Slot>,
    pending: Arc<[Pending]>,
    /// The current volume's sizes (leaked once per swap: swaps are operator actions, a few
    /// dozen bytes each, and `Backend::info` must hand out a reference).
    info: RwLock<&'static BackendInfo>,
    /// Whether requests are held, or refused for good.
    suspended: Mutex<Gate>,
    resumed: Condvar,
}

/// What requests that find no volume do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gate {
    /// A volume is in place.
    Open,
    /// Suspended: wait for [`Switch::replace`].
    Held,
    /// Closed while suspended: fail.
    Closed,
}

impl std::fmt::Debug for Switch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Switch")
            .field("suspended", &self.is_suspended())
            .finish_non_exhaustive()
    }
}

thread_local! {
    static SLOT: usize = {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS
    };
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Switch {
    /// Serves `volume`.
    pub fn new(volume: Arc<dyn Backend>) -> Switch {
        let info: &'static BackendInfo = Box::leak(Box::new(volume.info().clone()));
        Switch {
            slots: (0..SHARDS)
                .map(|_| Slot(RwLock::new(Some(Arc::clone(&volume)))))
                .collect(),
            pending: (0..SHARDS).map(|_| Pending::default()).collect(),
            info: RwLock::new(info),
            suspended: Mutex::new(Gate::Open),
            resumed: Condvar::new(),
        }
    }

    /// Whether requests are being held.
    pub fn is_suspended(&self) -> bool {
        *self.gate() == Gate::Held
    }

    fn gate(&self) -> std::sync::MutexGuard<'_, Gate> {
        self.suspended
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `f` on the current volume, waiting while suspended; fails once closed.
    fn with<R>(&self, f: impl FnOnce(&dyn Backend) -> R) -> Result<R, BackendError> {
        let slot = &self.slots[SLOT.with(|s| *s)].0;
        loop {
            {
                let g = read(slot);
                if let Some(v) = g.as_ref() {
                    return Ok(f(&**v));
                }
            }
            let mut s = self.gate();
            while *s == Gate::Held {
                s = self
                    .resumed
                    .wait(s)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            if *s == Gate::Closed {
                return Err(BackendError::Other(
                    "the instance was closed while suspended".into(),
                ));
            }
        }
    }

    /// Fails every held and future request of a suspended switch (closing it without a
    /// key). No effect while a volume is in place.
    pub fn close_suspended(&self) {
        let mut s = self.gate();
        if *s == Gate::Held {
            *s = Gate::Closed;
            self.resumed.notify_all();
        }
    }

    /// Holds new requests, waits for in-flight ones, flushes and drops the volume (its key
    /// goes with it). Returns the flush result; the volume is gone either way.
    ///
    /// # Errors
    /// The final flush failed (already-acknowledged writes may not be durable).
    pub fn suspend(&self) -> Result<(), BackendError> {
        *self.gate() = Gate::Held;
        // All write locks at once: no request is in flight past this point.
        let mut guards: Vec<_> = self.slots.iter().map(|s| write(&s.0)).collect();
        let old = guards.iter_mut().filter_map(|g| g.take()).next();
        for g in &mut guards {
            **g = None;
        }
        drop(guards);
        self.wait_pending();
        match old {
            Some(v) => v.flush(),
            None => Ok(()),
        }
    }

    /// Serves `volume` from now on (after [`Switch::suspend`], or in place of the current
    /// one: in-flight requests finish on the old volume, which is flushed and dropped).
    ///
    /// # Errors
    /// The old volume's flush failed.
    pub fn replace(&self, volume: Arc<dyn Backend>) -> Result<(), BackendError> {
        let info: &'static BackendInfo = Box::leak(Box::new(volume.info().clone()));
        let mut guards: Vec<_> = self.slots.iter().map(|s| write(&s.0)).collect();
        let mut old = None;
        for g in &mut guards {
            let prev = g.replace(Arc::clone(&volume));
            if old.is_none() {
                old = prev;
            }
        }
        *write(&self.info) = info;
        self.wait_pending();
        let flushed = old.map_or(Ok(()), |v| v.flush());
        drop(guards);
        *self.gate() = Gate::Open;
        self.resumed.notify_all();
        flushed
    }

    /// Waits until no asynchronous request is in flight (the slots' write locks are held,
    /// or the slots emptied: no new one starts on the old volume). A suspend is an operator
    /// action and requests take milliseconds: a short sleep between looks.
    fn wait_pending(&self) {
        while self
            .pending
            .iter()
            .any(|p| p.0.load(Ordering::Acquire) != 0)
        {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }

    /// The volume currently served (`None` while suspended).
    pub fn current(&self) -> Option<Arc<dyn Backend>> {
        read(&self.slots[0].0).clone()
    }
}

impl Backend for Switch {
    fn info(&self) -> &BackendInfo {
        *read(&self.info)
    }
    /// On the current volume, waiting while suspended. A holes query does not wait: a
    /// suspended switch cannot tell.
    fn submit(&self, io: Io<'_>) -> Result<(), BackendError> {
        if let IoKind::Holes { .. } = io.kind {
            return match self.current() {
                Some(v) => v.submit(io),
                None => Err(io.unsupported()),
            };
        }
        self.with(|v| v.submit(io))?
    }
    fn flush(&self) -> Result<(), BackendError> {
        match self.with(|v| v.flush()) {
            Ok(r) => r,
            // Closed while suspended: everything written before was flushed at suspend,
            // and every write since failed. Nothing is left to make durable.
            Err(_) if *self.gate() == Gate::Closed => Ok(()),
            Err(e) => Err(e),
        }
    }
    fn submit_writes(&self, batch: &[WriteOp<'_>]) -> Result<(), BackendError> {
        self.with(|v| v.submit_writes(batch))?
    }
    /// The current volume's count (since it was opened or last rebuilt).
    fn integrity_failures(&self) -> Option<u64> {
        self.current().and_then(|v| v.integrity_failures())
    }
    /// The current volume's `local` and `async_submit` (nothing while suspended). `local`
    /// lets the NBD server run small requests on the thread that reads the connection
    /// (bench/nbd-read.sh: 4 KiB reads at depth 32 cost half the CPU that way). A
    /// suspended switch holds such a request, and with it the connection's read side and
    /// the replies batched before it, until `replace`: that waits on the operator's
    /// resume over the control socket, never on this or any other NBD client, so nothing
    /// waits in a circle, and every request of the connection is held alike with or
    /// without the inline path. `atomic_unit` is not forwarded: a replaced volume may
    /// promise less, and no layer sits above a switch that would use it.
    fn hints(&self) -> Hints {
        let h = self.current().map(|v| v.hints()).unwrap_or_default();
        Hints {
            local: h.local,
            async_submit: h.async_submit,
            atomic_unit: None,
        }
    }
    /// On the current volume, counted in flight until its completion ran. While suspended
    /// (no volume) the request is handed back: the synchronous path waits, or fails once
    /// closed, as for any request.
    fn submit_async(self: Arc<Self>, mut io: AsyncIo) -> Result<(), AsyncIo> {
        let i = SLOT.with(|s| *s);
        let volume = {
            let g = read(&self.slots[i].0);
            let Some(v) = g.as_ref().filter(|v| v.hints().async_submit) else {
                return Err(io);
            };
            // Counted before the lock is let go: a suspend that takes the volume out next
            // waits for this request.
            self.pending[i].0.fetch_add(1, Ordering::Relaxed);
            Arc::clone(v)
        };
        let guard = PendingGuard(Arc::clone(&self.pending), i);
        let done = io.done;
        io.done = Box::new(move |buf, r| {
            drop(guard);
            done(buf, r);
        });
        volume.submit_async(io).map_err(|mut io| {
            // Refused, buffer untouched: the caller runs it synchronously and drops
            // `done`; the wrapper (and with it the count) goes now.
            io.done = Box::new(|_, _| {});
            io
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use ucrypt_backend::IoCtx;
    use ucrypt_backend::MemoryBackend;

    /// Asynchronous requests in flight hold no slot lock: suspending must still wait for
    /// every one of them to complete before it flushes and drops the volume.
    #[test]
    fn suspend_waits_for_asynchronous_requests_in_flight() {
        use std::sync::atomic::AtomicU64;
        use ucrypt_backend::testing::AsyncThreads;
        use ucrypt_backend::{AsyncIo, AsyncOp};
        let mem: Arc<dyn Backend> = Arc::new(MemoryBackend::new(1 << 20).unwrap());
        let lower: Arc<dyn Backend> = Arc::new(AsyncThreads::new(Arc::clone(&mem), 2));
        let sw = Arc::new(Switch::new(lower));
        assert!(sw.hints().async_submit);
        let done = Arc::new(AtomicU64::new(0));
        const N: u64 = 64;
        for i in 0..N {
            let d = Arc::clone(&done);
            let io = AsyncIo {
                op: AsyncOp::Write,
                offset: i * 4096,
                len: 4096,
                buf: vec![i as u8 + 1; 4096],
                ctx: IoCtx::default(),
                done: Box::new(move |_, r| {
                    r.unwrap();
                    d.fetch_add(1, Ordering::SeqCst);
                }),
            };
            Arc::clone(&sw).submit_async(io).unwrap();
        }
        sw.suspend().unwrap();
        assert_eq!(
            done.load(Ordering::SeqCst),
            N,
            "suspend returned with asynchronous writes in flight"
        );
        // While suspended the request is handed back (the synchronous path waits).
        let io = AsyncIo {
            op: AsyncOp::Read,
            offset: 0,
            len: 4096,
            buf: vec![0; 4096],
            ctx: IoCtx::default(),
            done: Box::new(|_, _| panic!("ran while suspended")),
        };
        assert!(Arc::clone(&sw).submit_async(io).is_err());
        let mut b = [0u8; 4096];
        mem.read_at(&mut b, (N - 1) * 4096).unwrap();
        assert_eq!(b, [N as u8; 4096]);
    }

    /// The NBD server's inline path for small requests needs `local`: a switch in front of
    /// a local volume says so, in front of a remote one not, and while suspended nothing.
    #[test]
    fn hints_follow_the_current_volume() {
        use ucrypt_backend::testing::AsyncThreads;
        let mem: Arc<dyn Backend> = Arc::new(MemoryBackend::new(1 << 20).unwrap());
        let sw = Switch::new(Arc::clone(&mem));
        assert_eq!(
            sw.hints(),
            Hints {
                local: true,
                atomic_unit: None,
                async_submit: false
            }
        );
        sw.replace(Arc::new(AsyncThreads::new(Arc::clone(&mem), 1)))
            .unwrap();
        assert_eq!(
            sw.hints(),
            Hints {
                local: false,
                atomic_unit: None,
                async_submit: true
            }
        );
        sw.suspend().unwrap();
        assert_eq!(sw.hints(), Hints::default());
    }

    /// Over NBD, small reads of a local volume run on the thread that reads the connection,
    /// their replies batched: a suspend holds that thread in the switch, and every reply
    /// still arrives, with the new volume's data, once the volume is replaced; closed while
    /// suspended, the held reads fail instead of hanging.
    #[test]
    fn nbd_requests_held_by_a_suspend_are_answered_after_it() {
        use ucrypt_nbd::client::Connection;
        use ucrypt_nbd::command::Request;
        use ucrypt_nbd::proto::NBD_CMD_READ;
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("sock");
        let filled = |b: u8| -> Arc<dyn Backend> {
            let m = MemoryBackend::new(1 << 20).unwrap();
            m.write_at(&vec![b; 1 << 20], 0, false).unwrap();
            Arc::new(m)
        };
        let sw = Arc::new(Switch::new(filled(1)));
        let shutdown = ucrypt_nbd::Shutdown::default();
        let server = {
            let listener = ucrypt_nbd::Listener::bind_unix(&path).unwrap();
            let export: Arc<dyn Backend> = Arc::clone(&sw) as Arc<dyn Backend>;
            let opts = ucrypt_nbd::ServeOptions {
                workers: 8,
                shutdown: shutdown.clone(),
                ..Default::default()
            };
            std::thread::spawn(move || ucrypt_nbd::serve(listener, export, opts))
        };
        let conn = {
            let s = std::os::unix::net::UnixStream::connect(&path).unwrap();
            Arc::new(Connection::over_unix(s, "").unwrap().pipelined().unwrap())
        };
        // Four clients of one connection, 16 reads of 4 KiB each: what each saw.
        let reads = |conn: &Arc<ucrypt_nbd::client::Pipelined>| -> Vec<_> {
            (0..4u64)
                .map(|t| {
                    let conn = Arc::clone(conn);
                    std::thread::spawn(move || {
                        (0..16u64)
                            .map(|i| {
                                let mut b = vec![0u8; 4096];
                                let req = Request {
                                    flags: 0,
                                    kind: NBD_CMD_READ,
                                    cookie: 0,
                                    offset: (t * 16 + i) * 4096,
                                    length: 4096,
                                };
                                let errno = conn.call(req, &[], &mut b).unwrap();
                                (errno, b.iter().all(|&x| x == b[0]).then_some(b[0]))
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect()
        };
        // Each read's NBD error and, where the block is one repeated byte, that byte.
        type Answers = Vec<(u32, Option<u8>)>;
        let all = |r: Vec<std::thread::JoinHandle<Answers>>| -> Answers {
            r.into_iter().flat_map(|h| h.join().unwrap()).collect()
        };
        assert!(all(reads(&conn)).iter().all(|r| *r == (0, Some(1))));

        sw.suspend().unwrap();
        let held = reads(&conn);
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            held.iter().all(|h| !h.is_finished()),
            "a read was answered while suspended"
        );
        sw.replace(filled(2)).unwrap();
        let seen = all(held);
        assert_eq!(seen.len(), 64);
        assert!(seen.iter().all(|r| *r == (0, Some(2))), "{seen:?}");

        sw.suspend().unwrap();
        let held = reads(&conn);
        std::thread::sleep(Duration::from_millis(100));
        sw.close_suspended();
        let seen = all(held);
        assert_eq!(seen.len(), 64);
        assert!(seen.iter().all(|r| r.0 != 0), "{seen:?}");

        shutdown.trigger();
        drop(conn);
        server.join().unwrap().unwrap();
    }

    #[test]
    fn requests_wait_while_suspended_and_see_the_new_volume() {
        let a: Arc<dyn Backend> = Arc::new(MemoryBackend::new(4096).unwrap());
        a.write_at(&[1; 512], 0, false).unwrap();
        let sw = Arc::new(Switch::new(a));
        sw.suspend().unwrap();
        assert!(sw.is_suspended() && sw.current().is_none());
        let reader = {
            let sw = Arc::clone(&sw);
            std::thread::spawn(move || {
                let mut b = [0u8; 512];
                sw.read_at(&mut b, 0).unwrap();
                b[0]
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        assert!(!reader.is_finished(), "a read went through while suspended");
        let b: Arc<dyn Backend> = Arc::new(MemoryBackend::new(8192).unwrap());
        b.write_at(&[2; 512], 0, false).unwrap();
        sw.replace(b).unwrap();
        assert_eq!(reader.join().unwrap(), 2);
        assert_eq!(sw.info().size_bytes, 8192);
        // Closed while suspended: held requests fail instead of waiting for ever.
        sw.suspend().unwrap();
        let reader = {
            let sw = Arc::clone(&sw);
            std::thread::spawn(move || sw.read_at(&mut [0u8; 512], 0))
        };
        std::thread::sleep(Duration::from_millis(50));
        sw.close_suspended();
        assert!(reader.join().unwrap().is_err());
        assert!(sw.write_at(&[3; 512], 0, false).is_err());
        // Everything written before was flushed at suspend and every write since failed:
        // the flush of a stopping server (SIGTERM to a suspended instance) succeeds.
        assert!(sw.flush().is_ok());
    }
}
