//! Byte-range locks for writes, and a read protocol that keeps reads off sectors being
//! written.
//!
//! Why: a write that covers part of a sector must read the sector, merge and write it back
//! (read-modify-write). If another write to the same sector lands between that read and
//! write, its bytes are lost. So every write holds a lock on the sectors it touches, and
//! writes to different sectors never wait for each other (no global lock, unlike nbdkit's
//! luks filter).
//!
//! Reads: a read racing a write of the same sector must return the old or the new sector,
//! never a mix (with CBC a mix decrypts to blocks nobody wrote), and a read lent straight
//! out of the backend's file mapping must not see the bytes change under it. So a read
//! announces itself in the [`READ_SLOTS`] slots of the regions it covers ([`RangeLocks::try_read`])
//! and goes ahead only if no writer is announced there; every writer announces itself in
//! the same slots once it holds its range and then waits until the readers already there
//! have left. Both sides announce first and look second (sequentially consistent), so at
//! least one of them sees the other: either the reader backs off or the writer waits for
//! it. A reader that backs off takes the range like a writer ([`RangeLocks::lock`]) and
//! reads under it. Readers never wait while announced, so a writer waits at most for the
//! reads already running (no starvation), and the common case costs a reader two atomic
//! additions and one load per 256 KiB region, no lock.
//!
//! The held ranges live in [`SHARDS`] shards: the device is cut into [`REGION_BYTES`]
//! regions, region `r` belongs to shard `r % SHARDS`, and a range is recorded in the shard
//! of every region it touches. Two overlapping ranges share a byte, so a region, so a
//! shard: checking only one's own shards finds every conflict.
//!
//! Why shards rather than one list under one lock: at depth 256 on two CPUs a thread
//! holding the single lock was often preempted while scanning 256 ranges, and every
//! writer queued behind it (4 KiB writes at depth 256 ran at a third of depth 4's rate).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

/// Number of shards.
const SHARDS: usize = 64;
/// log2 of the region size: 256 KiB, so a 4 KiB write locks one shard, a 1 MiB write 4-5.
const REGION_SHIFT: u32 = 18;
/// Bytes per region.
#[cfg(test)]
const REGION_BYTES: u64 = 1 << REGION_SHIFT;

/// Slots of the read protocol: region `r` announces in slot `r % READ_SLOTS`.
pub(crate) const READ_SLOTS: usize = 256;

/// Active ranges, sharded by region, and the read protocol's slots.
pub(crate) struct RangeLocks {
    shards: Box<[Shard]>,
    slots: Box<[ReadSlot]>,
}

impl Default for RangeLocks {
    fn default() -> Self {
        RangeLocks {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            slots: (0..READ_SLOTS).map(|_| ReadSlot::default()).collect(),
        }
    }
}

/// Writers and readers announced in one slot (a cache line each, so slots do not share).
#[derive(Default)]
#[repr(align(64))]
struct ReadSlot {
    writers: AtomicUsize,
    readers: AtomicUsize,
}

/// The read slots a non-empty range `[start, end)` touches (each once).
fn slots_of(start: u64, end: u64) -> impl Iterator<Item = usize> {
    let first = start >> REGION_SHIFT;
    let last = (end.max(start + 1) - 1) >> REGION_SHIFT;
    let n = (last - first + 1).min(READ_SLOTS as u64) as usize;
    let base = (first % READ_SLOTS as u64) as usize;
    (0..n).map(move |i| (base + i) % READ_SLOTS)
}

/// A read announced in its slots ([`RangeLocks::try_read`]); leaves them on drop.
pub(crate) struct ReadGuard<'a> {
    locks: &'a RangeLocks,
    range: (u64, u64),
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        for i in slots_of(self.range.0, self.range.1) {
            self.locks.slots[i].readers.fetch_sub(1, Ordering::Release);
        }
    }
}

/// One shard: its held ranges (a short list, so a linear scan is cheapest) and a condition
/// for writers waiting on one of them.
#[derive(Default)]
struct Shard {
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

/// The shards a non-empty range `[start, end)` touches, in ascending order (the order
/// they are locked in, so two writers never hold them crosswise).
fn shards_of(start: u64, end: u64) -> impl Iterator<Item = usize> {
    let first = start >> REGION_SHIFT;
    let last = (end.max(start + 1) - 1) >> REGION_SHIFT;
    let n = (last - first + 1).min(SHARDS as u64) as usize;
    let base = (first % SHARDS as u64) as usize;
    // n consecutive shards starting at `base`, wrapping: ascending is the part after the
    // wrap point first.
    let wrapped = (base + n).saturating_sub(SHARDS);
    (0..wrapped).chain(base..(base + n).min(SHARDS))
}

fn lock_shard(shard: &Shard) -> MutexGuard<'_, Active> {
    shard.active.lock().unwrap_or_else(|p| p.into_inner())
}

impl RangeLocks {
    /// Waits until `[start, end)` overlaps no held range, then holds it.
    ///
    /// The range is recorded shard by shard in ascending order, waiting in a shard while
    /// an overlapping range is recorded there. Deadlock-free for the reason ordered lock
    /// acquisition is: a writer only ever waits in a shard above every shard it has
    /// recorded in, so no cycle of waits can form. Mutual exclusion holds because two
    /// overlapping ranges share a shard, and the later one to reach it waits there.
    pub(crate) fn lock(&self, start: u64, end: u64) -> RangeGuard<'_> {
        let overlaps = |a: &Active| a.ranges.iter().any(|&(s, e)| s < end && start < e);
        for i in shards_of(start, end) {
            let shard = &self.shards[i];
            let mut g = lock_shard(shard);
            if overlaps(&g) {
                g.waiters += 1;
                g = shard
                    .released
                    .wait_while(g, |a| overlaps(a))
                    .unwrap_or_else(|p| p.into_inner());
                g.waiters -= 1;
            }
            g.ranges.push((start, end));
        }
        // Announce to readers, then wait for those already reading here to leave. New
        // readers see the announcement and back off (see the module docs).
        for i in slots_of(start, end) {
            self.slots[i].writers.fetch_add(1, Ordering::SeqCst);
        }
        for i in slots_of(start, end) {
            let mut spins = 0u32;
            while self.slots[i].readers.load(Ordering::SeqCst) != 0 {
                // A read in flight takes microseconds to a millisecond (1 MiB decrypted).
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else if spins < 256 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(std::time::Duration::from_micros(20));
                }
            }
        }
        RangeGuard {
            locks: self,
            range: (start, end),
        }
    }

    /// Announces a read of `[start, end)` and returns its guard, or `None` when a writer
    /// is announced in one of its slots (the caller then reads under [`RangeLocks::lock`]).
    /// While the guard lives no writer of this process changes the range.
    pub(crate) fn try_read(&self, start: u64, end: u64) -> Option<ReadGuard<'_>> {
        for i in slots_of(start, end) {
            self.slots[i].readers.fetch_add(1, Ordering::SeqCst);
        }
        let guard = ReadGuard {
            locks: self,
            range: (start, end),
        };
        if slots_of(start, end).any(|i| self.slots[i].writers.load(Ordering::SeqCst) != 0) {
            return None; // the guard's drop leaves the slots
        }
        Some(guard)
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let (start, end) = self.range;
        for i in slots_of(start, end) {
            self.locks.slots[i].writers.fetch_sub(1, Ordering::Release);
        }
        for i in shards_of(start, end) {
            let shard = &self.locks.shards[i];
            let mut active = lock_shard(shard);
            if let Some(p) = active.ranges.iter().position(|r| *r == self.range) {
                active.ranges.swap_remove(p);
            }
            let waiters = active.waiters;
            drop(active);
            if waiters > 0 {
                shard.released.notify_all();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn shards_are_ascending_distinct_and_cover_every_region() {
        for (start, end) in [
            (0, 1),
            (0, REGION_BYTES),
            (REGION_BYTES - 1, REGION_BYTES + 1),
            (62 * REGION_BYTES, 66 * REGION_BYTES),
            (5 * REGION_BYTES, 5 * REGION_BYTES + 100 * REGION_BYTES),
        ] {
            let v: Vec<usize> = shards_of(start, end).collect();
            assert!(v.windows(2).all(|w| w[0] < w[1]), "{start}..{end}: {v:?}");
            for r in (start >> REGION_SHIFT)..=((end - 1) >> REGION_SHIFT) {
                assert!(v.contains(&((r % SHARDS as u64) as usize)));
            }
        }
    }

    /// A writer on an overlapping range waits for the holder, including when the two
    /// ranges overlap only in a region other than their first.
    #[test]
    fn overlapping_ranges_wait_and_disjoint_ones_do_not() {
        let locks = Arc::new(RangeLocks::default());
        let a = locks.lock(REGION_BYTES - 4096, 3 * REGION_BYTES);
        // Disjoint, same shards: no wait.
        drop(locks.lock(3 * REGION_BYTES, 3 * REGION_BYTES + 4096));
        // Same shard number, different region (64 regions further): no wait.
        let far = (SHARDS as u64 + 1) * REGION_BYTES;
        drop(locks.lock(far, far + 4096));
        let done = Arc::new(AtomicBool::new(false));
        let (l2, d2) = (Arc::clone(&locks), Arc::clone(&done));
        let t = std::thread::spawn(move || {
            let _g = l2.lock(2 * REGION_BYTES + 4096, 4 * REGION_BYTES);
            d2.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !done.load(Ordering::SeqCst),
            "overlapping lock did not wait"
        );
        drop(a);
        t.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
    }
}
