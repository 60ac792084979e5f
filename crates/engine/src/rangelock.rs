//! Byte-range locks for writes.
//!
//! Why: a write that covers part of a sector must read the sector, merge and write it back
//! (read-modify-write). If another write to the same sector lands between that read and
//! write, its bytes are lost. So every write holds a lock on the sectors it touches, and
//! writes to different sectors never wait for each other (no global lock, unlike nbdkit's
//! luks filter). Reads take no lock: as with the kernel, a read racing a write of the same
//! sector may see either version.

use std::sync::{Condvar, Mutex};

/// Active ranges; small (bounded by requests in flight), so a linear scan is cheapest.
#[derive(Default)]
pub(crate) struct RangeLocks {
    active: Mutex<Active>,
    released: Condvar,
}

/// Held ranges and how many writers wait (no wake-up system call when none do).
#[derive(Default)]
struct Active {
    ranges: Vec<(u64, u64)>,
    waiters: usize,
}

/// Held while a write runs; releases on drop.
pub(crate) struct RangeGuard<'a> {
    locks: &'a RangeLocks,
    range: (u64, u64),
}

impl RangeLocks {
    /// Waits until `[start, end)` overlaps no held range, then holds it.
    pub(crate) fn lock(&self, start: u64, end: u64) -> RangeGuard<'_> {
        let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
        while active.ranges.iter().any(|&(s, e)| s < end && start < e) {
            active.waiters += 1;
            active = self
                .released
                .wait(active)
                .unwrap_or_else(|p| p.into_inner());
            active.waiters -= 1;
        }
        active.ranges.push((start, end));
        RangeGuard {
            locks: self,
            range: (start, end),
        }
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let mut active = self.locks.active.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = active.ranges.iter().position(|r| *r == self.range) {
            active.ranges.swap_remove(i);
        }
        let waiters = active.waiters;
        drop(active);
        if waiters > 0 {
            self.locks.released.notify_all();
        }
    }
}
