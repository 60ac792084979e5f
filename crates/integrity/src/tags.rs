//! Byte-granular reads and writes of the tag areas over a backend that wants aligned I/O:
//! tags are a few bytes each at any offset, the backend (O_DIRECT) takes whole logical
//! blocks. Writes are staged per aligned unit and written back together ([`TagUpdate`]);
//! the units last read or written are kept in memory ([`UnitCache`]), as the kernel's
//! dm-bufio keeps dm-integrity's metadata buffers.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};
use ucrypt_backend::{AlignedBuf, Backend, BackendError, WriteOp};

/// Bytes of tag units a device keeps in memory by default (`Options::tag_cache_bytes`).
///
/// 4 MiB whatever the device's size: 8192 units of 512 bytes (1024 of 4096). With 4-byte
/// tags (crc32c) over 4096-byte blocks that is the tags of 4 GiB of data; with 32-byte
/// tags (hmac-sha256) over 512-byte blocks, of 64 MiB. The kernel's dm-bufio shares a
/// cache of a few percent of memory among its clients; a bounded per-device cache of this
/// size keeps the tags of a random-write working set of that size in memory.
pub const DEFAULT_TAG_CACHE_BYTES: usize = 4 << 20;

/// Aligned tag units (their bytes on the metadata device) kept in memory, at most
/// `capacity` of them, evicted by CLOCK (second chance): a unit used since the hand last
/// passed it is kept one more round. Memory: `capacity` × the unit size, plus a map entry
/// per unit, whatever the device's size.
///
/// Never dirty: every unit here is what the device holds (or is about to hold, see below).
/// Writers write the device first and then put the bytes written here (or drop the unit
/// when the write failed), so the device gets every tag write exactly as without a cache.
///
/// Coherence (the device's `tag_units` range lock): a writer holds its units alone from
/// the read of a unit it changes in part to the unit's place here; a read that misses
/// holds them shared from its read of the device to its insertion. So a fill never reads
/// a unit while a writer is changing it, and never inserts bytes a writer wrote over
/// before the fill's insertion: a writer either finished (device and cache new) before
/// the fill read, or starts after the fill inserted and puts its bytes over the fill's.
/// Reads that hit take no range lock: they may copy a unit while a writer of *other*
/// blocks in it is about to replace it, but the bytes they use (their own blocks' tags)
/// are not being changed (mode J: blocks being written back are read from the journal
/// until their write-back is over; modes D and B: `ranges` keeps readers and writers of
/// the same blocks apart).
pub(crate) struct UnitCache {
    align: usize,
    capacity: usize,
    clock: Mutex<Clock>,
}

#[derive(Default)]
struct Clock {
    /// Unit (device byte offset) -> its slot.
    map: HashMap<u64, usize>,
    slots: Vec<Slot>,
    /// Slots whose unit was dropped.
    free: Vec<usize>,
    hand: usize,
}

struct Slot {
    unit: Option<u64>,
    used: bool,
    bytes: Box<[u8]>,
}

impl Clock {
    fn clear(&mut self) {
        *self = Clock::default();
    }
}

impl UnitCache {
    /// A cache of at most `bytes` of `align`-byte units (none if `bytes < align`).
    pub(crate) fn new(align: u64, bytes: usize) -> UnitCache {
        let align = usize::try_from(align).unwrap_or(usize::MAX).max(1);
        UnitCache {
            align,
            capacity: bytes / align,
            clock: Mutex::new(Clock::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Clock> {
        match self.clock.lock() {
            Ok(g) => g,
            // A panic while holding it could have left a unit half copied: start afresh
            // (the device holds everything).
            Err(p) => {
                let mut g = p.into_inner();
                g.clear();
                g
            }
        }
    }

    /// Units held.
    pub(crate) fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// The most units held.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Copies the `out.len()` bytes at device byte `at` into `out` if every unit they
    /// touch is held; `false` (and `out` untouched) otherwise.
    pub(crate) fn read(&self, at: u64, out: &mut [u8]) -> bool {
        if self.capacity == 0 {
            return false;
        }
        let a = self.align as u64;
        let first = at - at % a;
        let end = at + out.len() as u64;
        let mut c = self.lock();
        let mut unit = first;
        while unit < end {
            if !c.map.contains_key(&unit) {
                return false;
            }
            unit += a;
        }
        let mut done = 0usize;
        while done < out.len() {
            let pos = at + done as u64;
            let unit = pos - pos % a;
            let within = (pos - unit) as usize;
            let n = (self.align - within).min(out.len() - done);
            let Some(&i) = c.map.get(&unit) else {
                return false;
            };
            let slot = &mut c.slots[i];
            slot.used = true;
            out[done..done + n].copy_from_slice(&slot.bytes[within..within + n]);
            done += n;
        }
        true
    }

    /// Puts `bytes` (whole units) in as the units from device byte `start` on.
    pub(crate) fn insert(&self, start: u64, bytes: &[u8]) {
        if self.capacity == 0 {
            return;
        }
        let mut c = self.lock();
        for (k, unit_bytes) in bytes.chunks_exact(self.align).enumerate() {
            let unit = start + (k * self.align) as u64;
            let i = match c.map.get(&unit) {
                Some(&i) => i,
                None => {
                    // New units start unmarked: the hand has just passed their slot, so
                    // they stay a whole round unless used again (a long scan, such as a
                    // write-back of the whole journal, does not push out the units
                    // reads keep using).
                    let i = self.take_slot(&mut c);
                    c.map.insert(unit, i);
                    c.slots[i].unit = Some(unit);
                    c.slots[i].used = false;
                    c.slots[i].bytes.copy_from_slice(unit_bytes);
                    continue;
                }
            };
            let slot = &mut c.slots[i];
            slot.used = true;
            slot.bytes.copy_from_slice(unit_bytes);
        }
    }

    /// A slot for a new unit: a free one, a new one below the capacity, or the one the
    /// clock's hand evicts.
    fn take_slot(&self, c: &mut Clock) -> usize {
        if let Some(i) = c.free.pop() {
            return i;
        }
        if c.slots.len() < self.capacity {
            c.slots.push(Slot {
                unit: None,
                used: false,
                bytes: vec![0u8; self.align].into_boxed_slice(),
            });
            return c.slots.len() - 1;
        }
        loop {
            let i = c.hand;
            c.hand = (c.hand + 1) % c.slots.len();
            let slot = &mut c.slots[i];
            if slot.used {
                slot.used = false;
                continue;
            }
            if let Some(old) = slot.unit.take() {
                c.map.remove(&old);
            }
            return i;
        }
    }

    /// Drops the units from device byte `start` to `end` (a write that failed: the device
    /// holds old or new bytes, or neither).
    pub(crate) fn invalidate(&self, start: u64, end: u64) {
        if self.capacity == 0 {
            return;
        }
        let mut c = self.lock();
        let a = self.align as u64;
        let mut unit = start - start % a;
        while unit < end {
            if let Some(i) = c.map.remove(&unit) {
                c.slots[i].unit = None;
                c.slots[i].used = false;
                c.free.push(i);
            }
            unit += a;
        }
    }
}

/// A change of the tag areas: the aligned units it touches, staged, then written back by
/// [`TagUpdate::write_back`]. The caller holds those units alone (`tag_units`, see
/// [`UnitCache`]).
pub(crate) struct TagUpdate<'a> {
    inner: &'a dyn Backend,
    cache: &'a UnitCache,
    align: u64,
    units: BTreeMap<u64, Vec<u8>>,
}

impl<'a> TagUpdate<'a> {
    pub(crate) fn new(inner: &'a dyn Backend, align: u64, cache: &'a UnitCache) -> TagUpdate<'a> {
        TagUpdate {
            inner,
            cache,
            align,
            units: BTreeMap::new(),
        }
    }

    /// Stages `bytes` at device byte `at`. A unit not staged yet is taken from the cache,
    /// or read from the device if it is not there, unless `bytes` covers all of it.
    pub(crate) fn put(&mut self, at: u64, bytes: &[u8]) -> Result<(), BackendError> {
        let mut done = 0usize;
        while done < bytes.len() {
            let pos = at + done as u64;
            let unit = pos - pos % self.align;
            let within = (pos - unit) as usize;
            let n = (self.align as usize - within).min(bytes.len() - done);
            let buf = match self.units.entry(unit) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(e) => {
                    let mut b = vec![0u8; self.align as usize];
                    if n < self.align as usize && !self.cache.read(unit, &mut b) {
                        self.inner.read_at(&mut b, unit)?;
                    }
                    e.insert(b)
                }
            };
            buf[within..within + n].copy_from_slice(&bytes[done..done + n]);
            done += n;
        }
        Ok(())
    }

    /// Writes the staged units, adjacent ones together, all in one batch (one buffer
    /// aligned for `O_DIRECT`), then puts them in the cache (drops them from it if the
    /// write failed).
    pub(crate) fn write_back(self) -> Result<(), BackendError> {
        let res = self.write_units();
        for (unit, bytes) in &self.units {
            match res {
                Ok(()) => self.cache.insert(*unit, bytes),
                Err(_) => self.cache.invalidate(*unit, *unit + self.align),
            }
        }
        res
    }

    fn write_units(&self) -> Result<(), BackendError> {
        if self.units.len() <= 1 {
            // One unit (a write in mode D or B): written as it is, nothing to batch.
            for (unit, bytes) in &self.units {
                self.inner.write_at(bytes, *unit, false)?;
            }
            return Ok(());
        }
        let a = self.align as usize;
        let mut buf = AlignedBuf::zeroed(self.units.len() * a, a)?;
        // (device offset, start in `buf`, length) of each run of adjacent units.
        let mut spans: Vec<(u64, usize, usize)> = Vec::new();
        for (k, (unit, bytes)) in self.units.iter().enumerate() {
            buf[k * a..(k + 1) * a].copy_from_slice(bytes);
            match spans.last_mut() {
                Some(s) if s.0 + s.2 as u64 == *unit => s.2 += a,
                _ => spans.push((*unit, k * a, a)),
            }
        }
        let ops: Vec<WriteOp<'_>> = spans
            .iter()
            .map(|&(offset, from, len)| WriteOp {
                offset,
                buf: &buf[from..from + len],
                fua: false,
            })
            .collect();
        self.inner.submit_writes(&ops)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(a: usize, fill: u8) -> Vec<u8> {
        vec![fill; a]
    }

    #[test]
    fn holds_at_most_its_capacity_and_keeps_units_in_use() {
        let c = UnitCache::new(512, 8 * 512);
        assert_eq!(c.capacity(), 8);
        for k in 0..1000u64 {
            c.insert(k * 512, &unit(512, k as u8));
            assert!(c.len() <= 8);
            // Unit 0 is used after every insertion: CLOCK never evicts it.
            let mut b = [0u8; 4];
            assert!(c.read(0, &mut b), "after {k}");
            assert_eq!(b, [0u8; 4]);
        }
        assert_eq!(c.len(), 8);
        // The newest unit is there with its bytes; an old one is not.
        let mut b = [0u8; 512];
        assert!(c.read(999 * 512, &mut b));
        assert!(b.iter().all(|&x| x == 999u64 as u8));
        assert!(!c.read(500 * 512, &mut b));
    }

    #[test]
    fn a_read_across_units_needs_them_all_and_invalidation_drops_them() {
        let c = UnitCache::new(512, 1 << 20);
        c.insert(1024, &[unit(512, 1), unit(512, 2)].concat());
        let mut b = [0u8; 8];
        assert!(c.read(1024 + 508, &mut b));
        assert_eq!(b, [1, 1, 1, 1, 2, 2, 2, 2]);
        assert!(!c.read(1024 + 1020, &mut b), "the unit at 2048 is not held");
        c.invalidate(1536, 1537);
        assert!(!c.read(1024 + 508, &mut b));
        assert!(c.read(1024, &mut b[..4]));
        assert_eq!(c.len(), 1);
        // A freed slot is used again.
        c.insert(4096, &unit(512, 9));
        assert_eq!(c.len(), 2);
        let none = UnitCache::new(512, 0);
        none.insert(0, &unit(512, 1));
        assert!(!none.read(0, &mut b) && none.len() == 0);
    }
}
