//! Range locks (the kernel dm-integrity's `add_new_range` / `wait_and_add_new_range`): a
//! request locks the range of sectors (or bytes) it touches and waits only for ranges that
//! overlap it, shared with other shared holders, alone against exclusive ones.
//!
//! Waiting is first come, first served among overlapping requests: a request waits for
//! every earlier one that overlaps it and conflicts (either is exclusive), granted or not,
//! as the kernel queues a bio behind an overlapping waiting one, so that a stream of
//! readers cannot starve a writer of the same blocks and the reverse. A request never
//! waits for a later one, so the waits form no cycle as long as no holder waits for a range
//! of the same lock while holding one.

use std::sync::{Condvar, Mutex, MutexGuard};
use ucrypt_backend::BackendError;

/// Ranges held or waited for, in arrival order.
#[derive(Default)]
pub(crate) struct RangeLock {
    state: Mutex<Ranges>,
    cv: Condvar,
}

#[derive(Default)]
struct Ranges {
    next_id: u64,
    /// Held and waiting ranges, oldest first.
    list: Vec<Range>,
    /// Ranges in `list` not granted yet (a release wakes the waiters only if there are).
    waiting: usize,
}

struct Range {
    id: u64,
    start: u64,
    end: u64,
    exclusive: bool,
}

impl Range {
    fn conflicts(&self, other: &Range) -> bool {
        self.start < other.end && other.start < self.end && (self.exclusive || other.exclusive)
    }
}

/// A held range; dropping it releases the range and wakes the requests waiting for it.
pub(crate) struct RangeGuard<'a> {
    lock: &'a RangeLock,
    id: u64,
}

fn poisoned() -> BackendError {
    BackendError::Other("dm-integrity range lock poisoned".into())
}

impl RangeLock {
    fn inner(&self) -> Result<MutexGuard<'_, Ranges>, BackendError> {
        self.state.lock().map_err(|_| poisoned())
    }

    /// Locks `[start, end)`, shared or `exclusive`, once no earlier overlapping request
    /// conflicts with it. An empty range is granted at once.
    pub(crate) fn lock(
        &self,
        start: u64,
        end: u64,
        exclusive: bool,
    ) -> Result<RangeGuard<'_>, BackendError> {
        let mut st = self.inner()?;
        let id = st.next_id;
        st.next_id += 1;
        let me = Range {
            id,
            start,
            end,
            exclusive,
        };
        let blocked = st.list.iter().any(|r| r.conflicts(&me));
        st.list.push(me);
        if blocked {
            st.waiting += 1;
            loop {
                st = self.cv.wait(st).map_err(|_| poisoned())?;
                let pos = st.list.iter().position(|r| r.id == id).unwrap_or(0);
                let (before, rest) = st.list.split_at(pos);
                let still = rest
                    .first()
                    .is_some_and(|me| before.iter().any(|r| r.conflicts(me)));
                if !still {
                    break;
                }
            }
            st.waiting -= 1;
        }
        Ok(RangeGuard { lock: self, id })
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let mut st = self
            .lock
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(pos) = st.list.iter().position(|r| r.id == self.id) {
            st.list.remove(pos);
        }
        if st.waiting > 0 {
            drop(st);
            self.lock.cv.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Whether `f`, run on a thread of its own, finishes while the caller still holds its
    /// guards (within 10 s: a loaded machine may start the thread late; one that waits for
    /// a guard would wait forever, the scope joining it).
    fn runs_while_held(lock: &RangeLock, f: impl FnOnce(&RangeLock) + Send) -> bool {
        let (tx, rx) = mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                f(lock);
                tx.send(()).unwrap_or(());
            });
            rx.recv_timeout(Duration::from_secs(10)).is_ok()
        })
    }

    /// Waits (up to 10 s) until `n` threads wait in `lock`.
    fn wait_for_waiters(lock: &RangeLock, n: usize) {
        let until = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let waiting = lock
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .waiting;
            if waiting >= n {
                return;
            }
            assert!(
                std::time::Instant::now() < until,
                "{waiting} of {n} waiting"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn overlapping_conflicts_wait_and_others_do_not() {
        let lock = RangeLock::default();
        let held = lock.lock(10, 20, true).unwrap();
        // Disjoint ranges, touching ones included, go at once.
        assert!(runs_while_held(&lock, |l| drop(
            l.lock(20, 30, true).unwrap()
        )));
        assert!(runs_while_held(&lock, |l| drop(
            l.lock(0, 10, false).unwrap()
        )));
        // An overlapping one waits until the holder lets go.
        let (tx, rx) = mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                let g = lock.lock(19, 21, false).unwrap();
                tx.send(()).unwrap();
                drop(g);
            });
            assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
            drop(held);
            rx.recv_timeout(Duration::from_secs(5)).unwrap();
        });
        // Shared with shared: no wait.
        let r = lock.lock(0, 100, false).unwrap();
        assert!(runs_while_held(&lock, |l| drop(
            l.lock(50, 60, false).unwrap()
        )));
        drop(r);
    }

    #[test]
    fn a_reader_queues_behind_a_waiting_writer() {
        // Reader A holds; writer W waits for A; reader B (overlapping W) must wait behind W,
        // though it does not conflict with A: no writer starves behind a stream of readers.
        let lock = RangeLock::default();
        let a = lock.lock(0, 10, false).unwrap();
        let (wtx, wrx) = mpsc::channel();
        let (btx, brx) = mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                let g = lock.lock(5, 15, true).unwrap();
                wtx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(50));
                drop(g);
            });
            // W waits (for A) before B asks: without that, B would only overlap A.
            wait_for_waiters(&lock, 1);
            s.spawn(|| {
                let g = lock.lock(8, 9, false).unwrap();
                btx.send(()).unwrap();
                drop(g);
            });
            assert!(brx.recv_timeout(Duration::from_millis(200)).is_err());
            drop(a);
            wrx.recv_timeout(Duration::from_secs(5)).unwrap();
            brx.recv_timeout(Duration::from_secs(5)).unwrap();
        });
    }
}
