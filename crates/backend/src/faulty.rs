//! An error-injecting wrapper for tests, like dm-error and dm-flakey
//! (`drivers/md/dm-flakey.c`, `Documentation/admin-guide/device-mapper/dm-flakey.rst`).
//!
//! [`FaultyBackend`] passes every request to the backend it wraps until told otherwise,
//! at run time, from the test:
//!
//! | call | effect | kernel analogue |
//! |---|---|---|
//! | [`fail_reads_in`](FaultyBackend::fail_reads_in) | reads overlapping the range fail | dm-error over part of a table |
//! | [`fail_writes_in`](FaultyBackend::fail_writes_in) | write-class requests overlapping it fail, nothing is written | dm-flakey `error_writes` |
//! | [`fail_flush`](FaultyBackend::fail_flush) | flush fails; FUA writes are written but report failure | a cache flush error |
//! | [`fail_after_writes`](FaultyBackend::fail_after_writes) | the next `n` write-class requests work, then all fail | a device dying mid-run |
//! | [`drop_writes`](FaultyBackend::drop_writes) | write-class requests report success and are thrown away | dm-flakey `drop_writes` |
//! | [`panic_reads_in`](FaultyBackend::panic_reads_in) | reads overlapping the range panic (a bug in a backend) | |
//! | [`clear`](FaultyBackend::clear) | all of the above off | |
//!
//! Write-class requests are writes (each [`WriteOp`] of a batch counts as one),
//! write-zeroes and discards. Injected failures are [`BackendError::Injected`].
//! `drop_writes` is the one fault that lies to the caller, so it has to be asked for
//! explicitly: it exists to prove that the layers above never report lost data as
//! success (a read-back, not a status code, detects it).

use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::{check_range, emulate, Backend, BackendError, BackendInfo, Io, IoKind, WriteOp};

/// What the wrapper has injected so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Requests failed with [`BackendError::Injected`].
    pub injected_errors: u64,
    /// Write-class requests reported as done but thrown away.
    pub dropped_writes: u64,
}

#[derive(Debug, Default)]
struct Faults {
    read_ranges: Vec<Range<u64>>,
    panic_ranges: Vec<Range<u64>>,
    write_ranges: Vec<Range<u64>>,
    fail_flush: bool,
    /// `Some(n)`: `n` more write-class requests may pass.
    writes_left: Option<u64>,
    drop_writes: bool,
    stats: FaultStats,
}

/// What to do with one write-class request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Pass,
    Drop,
    Fail,
}

fn overlaps(ranges: &[Range<u64>], offset: u64, len: u64) -> bool {
    let end = offset.saturating_add(len);
    ranges.iter().any(|r| offset < r.end && r.start < end)
}

/// Wraps a backend and injects faults on demand. See the [module docs](self).
pub struct FaultyBackend {
    inner: Arc<dyn Backend>,
    /// The configured faults and counters.
    //
    // Why one Mutex: this is a test device, not a hot path. One lock makes "check the
    // write budget and spend one" atomic, and lets a test reconfigure faults while other
    // threads do I/O. It is never held while calling into `inner`.
    faults: Mutex<Faults>,
}

impl std::fmt::Debug for FaultyBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyBackend")
            .field("info", self.inner.info())
            .field("faults", &*self.lock())
            .finish()
    }
}

impl FaultyBackend {
    /// Wraps `inner`; no faults are active until configured.
    pub fn new(inner: Arc<dyn Backend>) -> Self {
        Self {
            inner,
            faults: Mutex::new(Faults::default()),
        }
    }

    /// The wrapped backend (to inspect what really got stored).
    pub fn inner(&self) -> &Arc<dyn Backend> {
        &self.inner
    }

    fn lock(&self) -> MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes reads overlapping `range` (bytes) fail. Adds to earlier ranges.
    pub fn fail_reads_in(&self, range: Range<u64>) {
        self.lock().read_ranges.push(range);
    }

    /// Makes reads overlapping `range` (bytes) panic, to test that the layers above contain
    /// a bug in a backend. Adds to earlier ranges.
    pub fn panic_reads_in(&self, range: Range<u64>) {
        self.lock().panic_ranges.push(range);
    }

    /// Makes write-class requests overlapping `range` (bytes) fail without writing
    /// anything. Adds to earlier ranges.
    pub fn fail_writes_in(&self, range: Range<u64>) {
        self.lock().write_ranges.push(range);
    }

    /// Makes flush fail (`true`) or work again (`false`). While on, FUA writes reach the
    /// inner backend without FUA and then report failure: the data may be there, but its
    /// durability was not confirmed.
    pub fn fail_flush(&self, on: bool) {
        self.lock().fail_flush = on;
    }

    /// Lets the next `n` write-class requests through, then fails every later one.
    pub fn fail_after_writes(&self, n: u64) {
        self.lock().writes_left = Some(n);
    }

    /// Turns dm-flakey's `drop_writes` on or off: write-class requests report success but
    /// never reach the inner backend.
    pub fn drop_writes(&self, on: bool) {
        self.lock().drop_writes = on;
    }

    /// Turns every fault off. The counters in [`stats`](Self::stats) are kept.
    pub fn clear(&self) {
        let mut f = self.lock();
        let stats = f.stats;
        *f = Faults {
            stats,
            ..Faults::default()
        };
    }

    /// What has been injected so far.
    pub fn stats(&self) -> FaultStats {
        self.lock().stats
    }

    /// Decides the fate of one write-class request and books it.
    fn judge_write(&self, offset: u64, len: u64) -> Verdict {
        let mut f = self.lock();
        let verdict = if overlaps(&f.write_ranges, offset, len) || f.writes_left == Some(0) {
            Verdict::Fail
        } else {
            if let Some(n) = f.writes_left.as_mut() {
                *n -= 1;
            }
            if f.drop_writes {
                Verdict::Drop
            } else {
                Verdict::Pass
            }
        };
        match verdict {
            Verdict::Fail => f.stats.injected_errors += 1,
            Verdict::Drop => f.stats.dropped_writes += 1,
            Verdict::Pass => {}
        }
        verdict
    }

    /// True (and counted) if a flush, or the flush part of a FUA request, must fail.
    fn flush_fails(&self) -> bool {
        let mut f = self.lock();
        if f.fail_flush {
            f.stats.injected_errors += 1;
        }
        f.fail_flush
    }

    fn size(&self) -> u64 {
        self.inner.info().size_bytes
    }

    /// Runs one write-class request: `op(fua)` performs it on the inner backend.
    fn write_class(
        &self,
        name: &'static str,
        offset: u64,
        len: u64,
        fua: bool,
        op: impl FnOnce(bool) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        check_range(offset, len, self.size())?;
        match self.judge_write(offset, len) {
            Verdict::Fail => Err(BackendError::Injected { op: name, offset }),
            Verdict::Drop => Ok(()),
            Verdict::Pass if fua && self.flush_fails() => {
                op(false)?;
                Err(BackendError::Injected { op: name, offset })
            }
            Verdict::Pass => op(fua),
        }
    }
}

impl Backend for FaultyBackend {
    fn info(&self) -> &BackendInfo {
        self.inner.info()
    }

    /// Reads, writes, discards and write-zeroes are judged; every other kind is refused,
    /// as the wrapped backend's own would not be judged.
    fn submit(&self, io: Io<'_>) -> Result<(), BackendError> {
        let (offset, fua, ctx) = (io.offset, io.fua, io.ctx);
        match io.kind {
            IoKind::Read(buf) => {
                check_range(offset, buf.len() as u64, self.size())?;
                {
                    let mut f = self.lock();
                    if overlaps(&f.read_ranges, offset, buf.len() as u64) {
                        f.stats.injected_errors += 1;
                        return Err(BackendError::Injected { op: "read", offset });
                    }
                    if overlaps(&f.panic_ranges, offset, buf.len() as u64) {
                        f.stats.injected_errors += 1;
                        drop(f);
                        panic!("injected panic: read at offset {offset}");
                    }
                }
                self.inner.submit(Io::read(buf, offset).ctx(ctx))
            }
            IoKind::Write(buf) => self.write_class("write", offset, buf.len() as u64, fua, |fua| {
                self.inner.submit(Io::write(buf, offset).fua(fua).ctx(ctx))
            }),
            IoKind::Discard(len) => self.write_class("discard", offset, len, false, |_| {
                self.inner.submit(Io::discard(offset, len).ctx(ctx))
            }),
            IoKind::WriteZeroes(len) => self.write_class("write_zeroes", offset, len, fua, |fua| {
                self.inner
                    .submit(Io::write_zeroes(offset, len).fua(fua).ctx(ctx))
            }),
            _ => emulate::fallback(self, io),
        }
    }

    fn flush(&self) -> Result<(), BackendError> {
        if self.flush_fails() {
            return Err(BackendError::Injected {
                op: "flush",
                offset: 0,
            });
        }
        self.inner.flush()
    }

    /// Judges each write in order and hands the inner backend the passing runs as
    /// sub-batches, so a batching inner backend still sees batches and the order is kept.
    fn submit_writes(&self, batch: &[WriteOp<'_>]) -> Result<(), BackendError> {
        let mut pending: Vec<WriteOp<'_>> = Vec::with_capacity(batch.len());
        for w in batch {
            let len = w.buf.len() as u64;
            if let Err(e) = check_range(w.offset, len, self.size()) {
                self.inner.submit_writes(&pending)?;
                return Err(e);
            }
            match self.judge_write(w.offset, len) {
                Verdict::Pass if w.fua && self.flush_fails() => {
                    pending.push(WriteOp { fua: false, ..*w });
                    self.inner.submit_writes(&pending)?;
                    return Err(BackendError::Injected {
                        op: "write",
                        offset: w.offset,
                    });
                }
                Verdict::Pass => pending.push(*w),
                Verdict::Drop => {}
                Verdict::Fail => {
                    self.inner.submit_writes(&pending)?;
                    return Err(BackendError::Injected {
                        op: "write",
                        offset: w.offset,
                    });
                }
            }
        }
        self.inner.submit_writes(&pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryBackend;
    use crate::testing;

    const MIB: u64 = 1 << 20;

    fn faulty() -> (FaultyBackend, Arc<dyn Backend>) {
        let mem: Arc<dyn Backend> = Arc::new(MemoryBackend::new(4 * MIB).unwrap());
        (FaultyBackend::new(mem.clone()), mem)
    }

    fn read(b: &dyn Backend, offset: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        b.read_at(&mut v, offset).unwrap();
        v
    }

    fn injected<T: std::fmt::Debug>(r: Result<T, BackendError>, want_op: &str) {
        match r {
            Err(BackendError::Injected { op, .. }) => assert_eq!(op, want_op),
            other => panic!("expected injected {want_op} error, got {other:?}"),
        }
    }

    #[test]
    fn passes_conformance_without_faults() {
        let (f, _) = faulty();
        testing::conformance(&f);
        assert_eq!(f.stats(), FaultStats::default());
    }

    #[test]
    fn fails_reads_only_in_the_range() {
        let (f, _) = faulty();
        f.fail_reads_in(8192..12288);
        let mut buf = [0u8; 4096];
        injected(f.read_at(&mut buf, 8192), "read");
        injected(f.read_at(&mut buf, 4096 + 512), "read"); // overlaps the start
        f.read_at(&mut buf, 4096).unwrap(); // ends where the range starts
        f.read_at(&mut buf, 12288).unwrap(); // starts where it ends
        f.write_at(&buf, 8192, false).unwrap(); // writes unaffected
        assert_eq!(f.stats().injected_errors, 2);
    }

    #[test]
    fn failed_writes_leave_the_device_unchanged() {
        let (f, mem) = faulty();
        f.fail_writes_in(MIB..MIB + 4096);
        injected(f.write_at(&[1u8; 8192], MIB - 4096, false), "write");
        injected(f.write_zeroes(MIB, 512, false), "write_zeroes");
        injected(f.discard(MIB, 512), "discard");
        assert!(read(&*mem, MIB - 4096, 8192).iter().all(|&b| b == 0));
        f.write_at(&[1u8; 4096], MIB + 4096, false).unwrap();
        assert_eq!(read(&*mem, MIB + 4096, 4096), vec![1u8; 4096]);
    }

    #[test]
    fn failing_flush_fails_flush_and_fua_but_not_plain_writes() {
        let (f, mem) = faulty();
        f.fail_flush(true);
        injected(f.flush(), "flush");
        f.write_at(&[2u8; 512], 0, false).unwrap();
        injected(f.write_at(&[3u8; 512], 512, true), "write");
        injected(f.write_zeroes(0, 512, true), "write_zeroes");
        // The FUA write reached the device; only its durability was refused.
        assert_eq!(read(&*mem, 512, 512), vec![3u8; 512]);
        f.fail_flush(false);
        f.flush().unwrap();
        f.write_at(&[3u8; 512], 512, true).unwrap();
    }

    #[test]
    fn fails_every_write_after_the_budget() {
        let (f, mem) = faulty();
        f.fail_after_writes(2);
        f.write_at(&[1u8; 512], 0, false).unwrap();
        f.write_zeroes(512, 512, false).unwrap();
        injected(f.write_at(&[1u8; 512], 1024, false), "write");
        injected(f.write_at(&[1u8; 512], 1536, false), "write");
        assert!(read(&*mem, 1024, 1024).iter().all(|&b| b == 0));
        // Reads and flushes go on working on a dying device.
        f.read_at(&mut [0u8; 512], 0).unwrap();
        f.flush().unwrap();
        f.clear();
        f.write_at(&[1u8; 512], 1024, false).unwrap();
    }

    #[test]
    fn batch_stops_at_the_write_that_exceeds_the_budget() {
        let (f, mem) = faulty();
        f.fail_after_writes(1);
        let batch = [
            WriteOp {
                offset: 0,
                buf: &[1u8; 512],
                fua: false,
            },
            WriteOp {
                offset: 512,
                buf: &[2u8; 512],
                fua: false,
            },
        ];
        injected(f.submit_writes(&batch), "write");
        assert_eq!(read(&*mem, 0, 512), vec![1u8; 512]);
        assert_eq!(read(&*mem, 512, 512), vec![0u8; 512]);
    }

    #[test]
    fn dropped_writes_report_success_and_store_nothing() {
        let (f, mem) = faulty();
        f.write_at(&[5u8; 4096], 0, false).unwrap();
        f.drop_writes(true);
        f.write_at(&[6u8; 4096], 0, true).unwrap();
        f.write_zeroes(0, 4096, false).unwrap();
        f.discard(0, 4096).unwrap();
        f.submit_writes(&[WriteOp {
            offset: 0,
            buf: &[7u8; 4096],
            fua: false,
        }])
        .unwrap();
        // Only a read-back reveals the loss.
        assert_eq!(read(&f, 0, 4096), vec![5u8; 4096]);
        assert_eq!(read(&*mem, 0, 4096), vec![5u8; 4096]);
        assert_eq!(f.stats().dropped_writes, 4);
        f.drop_writes(false);
        f.write_at(&[6u8; 4096], 0, false).unwrap();
        assert_eq!(read(&f, 0, 4096), vec![6u8; 4096]);
    }

    #[test]
    fn clear_turns_every_fault_off_and_keeps_counters() {
        let (f, _) = faulty();
        f.fail_reads_in(0..MIB);
        f.fail_writes_in(0..MIB);
        f.fail_flush(true);
        f.fail_after_writes(0);
        f.drop_writes(true);
        injected(f.flush(), "flush");
        f.clear();
        f.write_at(&[1u8; 512], 0, true).unwrap();
        assert_eq!(read(&f, 0, 512), vec![1u8; 512]);
        f.flush().unwrap();
        assert_eq!(f.stats().injected_errors, 1);
    }

    #[test]
    fn out_of_range_is_reported_as_such_not_injected() {
        let (f, _) = faulty();
        f.fail_writes_in(0..u64::MAX);
        assert!(matches!(
            f.write_at(&[0u8; 512], 4 * MIB, false),
            Err(BackendError::OutOfRange { .. })
        ));
    }
}
