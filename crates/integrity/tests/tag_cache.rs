//! The cache of tag units (`Options::tag_cache_bytes`, the kernel's dm-bufio): coherent
//! with every writer of tags in modes J, D and B (partial overwrites of blocks whose tags
//! share units, read back while cached, after write-backs, after a reopen, with a cache too
//! small to hold them); a read's fill racing a writer of the same unit never leaves a stale
//! tag behind; bounded; and it saves the tag reads it is for (a second write-back or D
//! write over the same units reads no tags, a read of cached blocks reads only their data).

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::Duration;
use ucrypt_backend::{Backend, BackendError, BackendInfo, Io, IoKind, MemoryBackend};
use ucrypt_format::integrity::FormatParams;
use ucrypt_integrity::{format, Algorithm, IntegrityBackend, Mode, Options};

/// A memory backend that counts reads and can hold the first read at one offset.
struct Probe {
    mem: MemoryBackend,
    reads: AtomicU64,
    /// (offset of the read to hold, armed, a read is held, released)
    gate: Mutex<(u64, bool, bool, bool)>,
    cv: Condvar,
}

impl Probe {
    fn new(bytes: u64) -> Probe {
        Probe {
            mem: MemoryBackend::new(bytes).unwrap(),
            reads: AtomicU64::new(0),
            gate: Mutex::new((0, false, false, false)),
            cv: Condvar::new(),
        }
    }

    fn reads(&self) -> u64 {
        self.reads.load(Ordering::SeqCst)
    }

    /// Holds the next read at `offset` (once) until [`Probe::release`].
    fn hold(&self, offset: u64) {
        *self.gate.lock().unwrap() = (offset, true, false, false);
    }

    fn wait_held(&self) -> bool {
        let g = self.gate.lock().unwrap();
        let (g, _) = self
            .cv
            .wait_timeout_while(g, Duration::from_secs(10), |g| !g.2)
            .unwrap();
        g.2
    }

    fn release(&self) {
        self.gate.lock().unwrap().3 = true;
        self.cv.notify_all();
    }
}

impl Backend for Probe {
    fn info(&self) -> &BackendInfo {
        self.mem.info()
    }

    fn submit(&self, io: Io<'_>) -> Result<(), BackendError> {
        if matches!(io.kind, IoKind::Read(_)) {
            self.reads.fetch_add(1, Ordering::SeqCst);
            let mut g = self.gate.lock().unwrap();
            if g.1 && g.0 == io.offset {
                // One-shot: later reads at the offset go through.
                g.1 = false;
                g.2 = true;
                self.cv.notify_all();
                while !g.3 {
                    g = self.cv.wait(g).unwrap();
                }
            }
        }
        self.mem.submit(io)
    }

    fn flush(&self) -> Result<(), BackendError> {
        self.mem.flush()
    }
}

fn options(mode: Mode, cache: Option<usize>) -> Options {
    let mut o = Options::new(Algorithm::Crc32c);
    o.mode = mode;
    if let Some(c) = cache {
        o.tag_cache_bytes = c;
    }
    o
}

/// 512-byte blocks, crc32c tags (4 bytes: 128 blocks' tags share a 512-byte unit), a small
/// journal (it wraps many times), formatted on a fresh [`Probe`] of 8 MiB.
fn device(mode: Mode, cache: Option<usize>) -> (Arc<Probe>, IntegrityBackend) {
    let probe = Arc::new(Probe::new(8 << 20));
    let inner: Arc<dyn Backend> = Arc::clone(&probe) as Arc<dyn Backend>;
    let params = FormatParams {
        sector_size: 512,
        tag_size: 4,
        journal_sectors: 256,
        ..FormatParams::default()
    };
    format(Arc::clone(&inner), &params, &options(mode, cache), true).unwrap();
    let dev = IntegrityBackend::open(inner, options(mode, cache)).unwrap();
    (probe, dev)
}

fn reopen(probe: &Arc<Probe>, mode: Mode, cache: Option<usize>) -> IntegrityBackend {
    let inner: Arc<dyn Backend> = Arc::clone(probe) as Arc<dyn Backend>;
    IntegrityBackend::open(inner, options(mode, cache)).unwrap()
}

fn versioned(block: u64, version: u64) -> Vec<u8> {
    let mut b = vec![(block as u8) ^ (version as u8).wrapping_mul(29) ^ 0xa5; 512];
    b[..8].copy_from_slice(&block.to_le_bytes());
    b[8..16].copy_from_slice(&version.to_le_bytes());
    b
}

/// Every block reads back at its version in `want` (a stale tag reads as a mismatch).
fn check(dev: &IntegrityBackend, want: &[u64], what: &str) {
    let mut buf = vec![0u8; 512];
    for (b, &v) in want.iter().enumerate() {
        let b = b as u64;
        match dev.read_at(&mut buf, b * 512) {
            Ok(()) => assert!(buf == versioned(b, v), "{what}: block {b} is not at {v}"),
            Err(e) => panic!("{what}: block {b} (version {v}): {e}"),
        }
    }
    assert_eq!(dev.mismatches(), 0, "{what}");
}

#[test]
fn every_mode_reads_back_each_write_through_the_cache_and_after_a_reopen() {
    const BLOCKS: u64 = 700;
    // The default cache, and one of two units (the blocks' tags span six): evictions all
    // the time.
    for cache in [None, Some(1024)] {
        for mode in [Mode::Journal, Mode::Direct, Mode::Bitmap] {
            let what = format!("{mode:?} cache {cache:?}");
            let (probe, dev) = device(mode, cache);
            let mut want = vec![1u64; BLOCKS as usize];
            for b in 0..BLOCKS {
                dev.write_at(&versioned(b, 1), b * 512, false).unwrap();
            }
            check(&dev, &want, &format!("{what}, written"));
            // Every third block again, then every fifth, read back in between: their
            // neighbours' tags are in the same units, cached by the reads.
            for (step, v) in [(3u64, 2u64), (5, 3)] {
                for b in (0..BLOCKS).step_by(step as usize) {
                    dev.write_at(&versioned(b, v), b * 512, false).unwrap();
                    want[b as usize] = v;
                }
                check(&dev, &want, &format!("{what}, every {step}th at {v}"));
            }
            dev.flush().unwrap();
            dev.close().unwrap();
            drop(dev);
            reopened(&probe, mode, cache, &want, &what);
        }
    }
}

/// The second half of the round above, on a fresh open: more overwrites, then a reopen.
fn reopened(probe: &Arc<Probe>, mode: Mode, cache: Option<usize>, want: &[u64], what: &str) {
    let dev = reopen(probe, mode, cache);
    let mut want = want.to_vec();
    check(&dev, &want, &format!("{what}, second open"));
    for b in (1..want.len() as u64).step_by(7) {
        dev.write_at(&versioned(b, 9), b * 512, false).unwrap();
        want[b as usize] = 9;
    }
    check(&dev, &want, &format!("{what}, every 7th at 9"));
    drop(dev);
    let dev = reopen(probe, mode, cache);
    check(&dev, &want, &format!("{what}, last open"));
    let (held, most) = dev.tag_cache_units();
    assert!(held > 0 && held <= most, "{what}: {held} of {most}");
}

/// A read of block A that misses fills the cache with the unit holding A's and B's tags;
/// its device read is held while a writer of B changes that unit. The writer must wait for
/// the fill (else the fill would put the unit's old bytes over the writer's new ones):
/// afterwards B reads back at its new version, A at its old one.
#[test]
fn a_fill_racing_a_writer_of_the_same_unit_leaves_no_stale_tag() {
    for mode in [Mode::Direct, Mode::Bitmap] {
        let (probe, dev) = device(mode, None);
        let (a, b) = (10u64, 11u64);
        dev.write_at(&versioned(a, 1), a * 512, false).unwrap();
        dev.write_at(&versioned(b, 1), b * 512, false).unwrap();
        dev.close().unwrap();
        drop(dev);
        // A fresh open: nothing cached.
        let dev = reopen(&probe, mode, None);
        let geo = dev.geometry();
        let unit = geo.tag_byte(a) / 512 * 512;
        assert_eq!(
            geo.tag_byte(b) / 512 * 512,
            unit,
            "A's and B's tags share a unit"
        );
        probe.hold(unit);
        let (wtx, wrx) = mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut buf = vec![0u8; 512];
                dev.read_at(&mut buf, a * 512).unwrap();
                assert!(buf == versioned(a, 1), "{mode:?}: A");
            });
            assert!(probe.wait_held(), "{mode:?}: the fill's read of the unit");
            s.spawn(|| {
                dev.write_at(&versioned(b, 2), b * 512, false).unwrap();
                wtx.send(()).unwrap();
            });
            // The writer waits for the fill (a writer that did not would be done by now).
            let waited = wrx.recv_timeout(Duration::from_millis(300)).is_err();
            probe.release();
            if waited {
                wrx.recv_timeout(Duration::from_secs(10)).unwrap();
            }
            assert!(waited, "{mode:?}: the writer changed the unit under a fill");
        });
        let mut buf = vec![0u8; 512];
        dev.read_at(&mut buf, b * 512).unwrap();
        assert!(buf == versioned(b, 2), "{mode:?}: B");
        dev.read_at(&mut buf, a * 512).unwrap();
        assert!(buf == versioned(a, 1), "{mode:?}: A again");
        assert_eq!(dev.mismatches(), 0);
    }
}

/// Touching many more units than the cache holds leaves it at its bound, with every
/// block reading right.
#[test]
fn the_cache_holds_at_most_its_bound() {
    let (_probe, dev) = device(Mode::Direct, Some(16 * 512));
    assert_eq!(dev.tag_cache_units(), (0, 16));
    // One block per unit (128 blocks' tags per unit), 100 units: 6 times the bound.
    let blocks: Vec<u64> = (0..100u64).map(|k| k * 128 + k % 128).collect();
    for &b in &blocks {
        dev.write_at(&versioned(b, 1), b * 512, false).unwrap();
        assert!(dev.tag_cache_units().0 <= 16);
    }
    let mut buf = vec![0u8; 512];
    for &b in &blocks {
        dev.read_at(&mut buf, b * 512).unwrap();
        assert!(buf == versioned(b, 1), "block {b}");
        assert!(dev.tag_cache_units().0 <= 16);
    }
    assert_eq!(dev.tag_cache_units(), (16, 16));
    // The default: 4 MiB of 512-byte units.
    let (_probe, dev) = device(Mode::Direct, None);
    assert_eq!(dev.tag_cache_units().1, 8192);
}

/// Blocks one per tag unit, written in rounds that wrap the journal several times (mode J)
/// or in place (D): with the cache each unit is read at most once (the first time it is
/// changed in part), without it every write-back (every D write) reads it again; a read of
/// cached blocks reads their data only.
#[test]
fn a_second_write_back_over_the_same_units_reads_no_tags() {
    const N: u64 = 40;
    const ROUNDS: u64 = 12;
    let blocks: Vec<u64> = (0..N).map(|k| k * 128 + 5).collect();
    for mode in [Mode::Journal, Mode::Direct] {
        let mut reads = Vec::new();
        for cache in [None, Some(0)] {
            let (probe, dev) = device(mode, cache);
            let before = probe.reads();
            for round in 1..=ROUNDS {
                for &b in &blocks {
                    dev.write_at(&versioned(b, round), b * 512, false).unwrap();
                }
            }
            dev.flush().unwrap();
            dev.close().unwrap();
            reads.push(probe.reads() - before);
            drop(dev);
            if cache.is_none() && mode == Mode::Direct {
                // Reads: after a first pass that caches the units, data only.
                let dev = reopen(&probe, mode, None);
                let mut buf = vec![0u8; 512];
                for &b in &blocks {
                    dev.read_at(&mut buf, b * 512).unwrap();
                }
                let before = probe.reads();
                for &b in &blocks {
                    dev.read_at(&mut buf, b * 512).unwrap();
                    assert!(buf == versioned(b, ROUNDS));
                }
                assert_eq!(probe.reads() - before, N, "one data read per block");
            }
        }
        // Mode J: the superblock's read on close comes on top.
        assert!(
            reads[0] <= N + 1,
            "{mode:?}: {} device reads with the cache, for {N} units",
            reads[0]
        );
        assert!(
            reads[1] >= 2 * N,
            "{mode:?}: {} device reads without the cache: the journal did not wrap?",
            reads[1]
        );
    }
}

/// Behind an open device's back: a changed data byte is still caught though its tag is
/// cached (tags are checked against data read from the device); a changed tag byte is
/// hidden by the cached unit, as dm-bufio's buffer hides it in the kernel, and caught
/// once the device is opened again.
#[test]
fn data_changed_under_an_open_device_is_caught_with_its_tag_cached() {
    let (probe, dev) = device(Mode::Direct, None);
    for b in 0..4u64 {
        dev.write_at(&versioned(b, 1), b * 512, false).unwrap();
    }
    let mut buf = vec![0u8; 512];
    dev.read_at(&mut buf, 0).unwrap();
    let geo = dev.geometry().clone();
    let flip = |at: u64| {
        let mut x = [0u8; 1];
        probe.mem.read_at(&mut x, at).unwrap();
        x[0] ^= 0x10;
        probe.mem.write_at(&x, at, false).unwrap();
    };
    flip(geo.data_sector(1) * 512 + 100);
    match dev.read_at(&mut buf, 512) {
        Err(BackendError::Integrity { offset, len }) => assert_eq!((offset, len), (512, 512)),
        other => panic!("changed data read as {other:?}"),
    }
    flip(geo.tag_byte(2));
    dev.read_at(&mut buf, 2 * 512).unwrap();
    assert!(buf == versioned(2, 1));
    dev.close().unwrap();
    drop(dev);
    let dev = reopen(&probe, Mode::Direct, None);
    assert!(matches!(
        dev.read_at(&mut buf, 2 * 512),
        Err(BackendError::Integrity { offset: 1024, .. })
    ));
    dev.read_at(&mut buf, 3 * 512).unwrap();
}
