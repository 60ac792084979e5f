//! Modes D and B write under range locks, not the device-wide state lock: writes and reads
//! of other blocks go on while one write's I/O is held in the backend; writers of
//! neighbouring blocks (their tags in one tag unit) never lose each other's tag update;
//! readers racing a writer of the same blocks never see new data with an old tag (or the
//! reverse, or half a block); a flush still waits for the writes under way.

#![allow(clippy::unwrap_used)]

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use ucrypt_backend::{Backend, BackendError, BackendInfo, Io, IoKind, MemoryBackend};
use ucrypt_format::integrity::FormatParams;
use ucrypt_integrity::{format, Algorithm, IntegrityBackend, Mode, Options};

/// A memory backend whose writes take `delay_us` before they land (the window between a
/// tag unit's read and its write stays open), and whose writes starting in the gate's
/// range wait while it is shut.
struct Held {
    mem: MemoryBackend,
    delay_us: AtomicU64,
    /// (gated byte range, shut, writes waiting)
    gate: Mutex<(Range<u64>, bool, u32)>,
    cv: Condvar,
}

impl Held {
    fn new(bytes: u64) -> Held {
        Held {
            mem: MemoryBackend::new(bytes).unwrap(),
            delay_us: AtomicU64::new(0),
            gate: Mutex::new((0..0, false, 0)),
            cv: Condvar::new(),
        }
    }

    fn shut(&self, range: Range<u64>) {
        let mut g = self.gate.lock().unwrap();
        g.0 = range;
        g.1 = true;
    }

    fn open(&self) {
        self.gate.lock().unwrap().1 = false;
        self.cv.notify_all();
    }

    /// Whether a write came to the shut gate within 10 s.
    fn wait_held(&self) -> bool {
        let g = self.gate.lock().unwrap();
        let (g, _) = self
            .cv
            .wait_timeout_while(g, Duration::from_secs(10), |g| g.2 == 0)
            .unwrap();
        g.2 > 0
    }
}

impl Backend for Held {
    fn info(&self) -> &BackendInfo {
        self.mem.info()
    }

    fn submit(&self, io: Io<'_>) -> Result<(), BackendError> {
        if matches!(io.kind, IoKind::Write(_) | IoKind::WriteOwned(_)) {
            let us = self.delay_us.load(Ordering::Relaxed);
            if us > 0 {
                std::thread::sleep(Duration::from_micros(us));
            }
            let mut g = self.gate.lock().unwrap();
            if g.1 && g.0.contains(&io.offset) {
                g.2 += 1;
                self.cv.notify_all();
                while g.1 {
                    g = self.cv.wait(g).unwrap();
                }
                g.2 -= 1;
            }
        }
        self.mem.submit(io)
    }

    fn flush(&self) -> Result<(), BackendError> {
        self.mem.flush()
    }
}

fn options(mode: Mode) -> Options {
    let mut o = Options::new(Algorithm::Crc32c);
    o.mode = mode;
    o
}

/// A device of `sector`-byte blocks with crc32c tags (4 bytes: 128 blocks' tags share a
/// 512-byte tag unit) formatted on a fresh [`Held`] of `mib` MiB, whose writes take
/// `delay_us` once the device is open.
fn device(mode: Mode, sector: u32, mib: u64, delay_us: u64) -> (Arc<Held>, IntegrityBackend) {
    let held = Arc::new(Held::new(mib << 20));
    let inner: Arc<dyn Backend> = Arc::clone(&held) as Arc<dyn Backend>;
    let params = FormatParams {
        sector_size: sector,
        tag_size: 4,
        journal_sectors: 1024,
        ..FormatParams::default()
    };
    format(Arc::clone(&inner), &params, &options(mode), true).unwrap();
    let dev = IntegrityBackend::open(inner, options(mode)).unwrap();
    held.delay_us.store(delay_us, Ordering::Relaxed);
    (held, dev)
}

/// Block `block`'s contents at `version` (`bb` bytes): its number and version first, the
/// rest a fill of both.
fn versioned(block: u64, version: u64, bb: usize) -> Vec<u8> {
    let fill = (block as u8).wrapping_mul(31) ^ (version as u8) ^ 0x5a;
    let mut b = vec![fill; bb];
    b[..8].copy_from_slice(&block.to_le_bytes());
    b[8..16].copy_from_slice(&version.to_le_bytes());
    b
}

/// Many writers of neighbouring blocks (thread t writes every block b with b % 8 == t):
/// their tags share tag units, and each writer reads, changes and writes back a whole unit.
/// Every block must end at its last version with a valid tag, on the device as it stands
/// and after a close and a fresh open; a lost tag update reads as a mismatch.
#[test]
fn writers_of_neighbouring_blocks_never_lose_a_tag_update() {
    const THREADS: u64 = 8;
    const BLOCKS: u64 = 256;
    const ROUNDS: u64 = 6;
    for mode in [Mode::Direct, Mode::Bitmap] {
        let (held, dev) = device(mode, 512, 4, 40);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let dev = &dev;
                s.spawn(move || {
                    for round in 1..=ROUNDS {
                        // Each round in another order, so that neighbours meet.
                        let mut blocks: Vec<u64> = (t..BLOCKS).step_by(THREADS as usize).collect();
                        let by = (round * 5 + t) as usize % blocks.len();
                        blocks.rotate_left(by);
                        for b in blocks {
                            dev.write_at(&versioned(b, round, 512), b * 512, false)
                                .unwrap();
                        }
                    }
                });
            }
        });
        held.delay_us.store(0, Ordering::Relaxed);
        let check = |dev: &IntegrityBackend| {
            let mut buf = vec![0u8; 512];
            let mut bad = Vec::new();
            for b in 0..BLOCKS {
                match dev.read_at(&mut buf, b * 512) {
                    Ok(()) => assert_eq!(buf, versioned(b, ROUNDS, 512), "{mode:?} block {b}"),
                    Err(_) => bad.push(b),
                }
            }
            assert!(bad.is_empty(), "{mode:?}: tag mismatches at blocks {bad:?}");
            assert_eq!(dev.mismatches(), 0, "{mode:?}");
        };
        check(&dev);
        dev.close().unwrap();
        drop(dev);
        let inner: Arc<dyn Backend> = Arc::clone(&held) as Arc<dyn Backend>;
        let again = IntegrityBackend::open(inner, options(mode)).unwrap();
        check(&again);
    }
}

/// Readers racing a writer of the same blocks (one-block and four-block requests, writes
/// slow enough that the data lands well before the tag) see each block whole, old or new,
/// and never a tag mismatch.
#[test]
fn readers_racing_a_writer_of_the_same_blocks_see_no_mismatch() {
    for mode in [Mode::Direct, Mode::Bitmap] {
        let (_held, dev) = device(mode, 4096, 8, 100);
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let (dev, done) = (&dev, &done);
            s.spawn(move || {
                for round in 1..=150u64 {
                    let v = vec![round as u8; 4096 * ((round % 4) as usize + 1)];
                    dev.write_at(&v, 4 * 4096, round % 32 == 0).unwrap();
                }
                done.store(true, Ordering::Relaxed);
            });
            for r in 0..2u64 {
                s.spawn(move || {
                    let mut buf = vec![0u8; 4 * 4096];
                    let mut reads = 0u64;
                    while !done.load(Ordering::Relaxed) || reads < 10 {
                        let (at, n) = if (reads + r) % 2 == 0 {
                            (4, 4)
                        } else {
                            (4 + reads % 4, 1)
                        };
                        let part = &mut buf[..n * 4096];
                        dev.read_at(part, at * 4096)
                            .unwrap_or_else(|e| panic!("{mode:?}: read of block {at}: {e}"));
                        for blk in part.chunks(4096) {
                            assert!(blk.iter().all(|&x| x == blk[0]), "{mode:?}: a torn block");
                        }
                        reads += 1;
                    }
                });
            }
        });
        assert_eq!(dev.mismatches(), 0, "{mode:?}");
    }
}

/// Runs `f` on a thread of the scope; the receiver hears when it is done.
fn spawn_signal<'s, F>(s: &'s std::thread::Scope<'s, '_>, f: F) -> mpsc::Receiver<()>
where
    F: FnOnce() + Send + 's,
{
    let (tx, rx) = mpsc::channel();
    s.spawn(move || {
        f();
        let _ = tx.send(());
    });
    rx
}

/// One write's data held in the backend (the gate): a write and reads of distant blocks, and
/// a write of the neighbouring block (its tag in the same tag unit), go on; a read of the
/// held block waits for it, and so does a flush (in mode B it then clears the bitmap); once
/// the gate opens everything reads back as written. Under the device-wide state lock every
/// one of them waited for the held write.
#[test]
fn a_held_write_holds_only_its_own_blocks() {
    for mode in [Mode::Direct, Mode::Bitmap] {
        let (held, dev) = device(mode, 4096, 16, 0);
        let blocks = dev.info().size_bytes / 4096;
        let far = blocks - 1;
        let geo = dev.geometry();
        let at0 = geo.data_sector(0) * 512;
        held.shut(at0..at0 + 4096);
        let old_far = {
            let mut b = vec![0u8; 4096];
            dev.read_at(&mut b, (far - 1) * 4096).unwrap();
            b
        };
        std::thread::scope(|s| {
            let dev = &dev;
            let writer = spawn_signal(s, move || {
                dev.write_at(&versioned(0, 1, 4096), 0, false).unwrap();
            });
            assert!(
                held.wait_held(),
                "{mode:?}: the write never reached the gate"
            );
            let t = Duration::from_secs(10);
            // A distant write, a distant read, the neighbour's write: none waits.
            let others = spawn_signal(s, move || {
                dev.write_at(&versioned(far, 1, 4096), far * 4096, false)
                    .unwrap();
                let mut b = vec![0u8; 4096];
                dev.read_at(&mut b, (far - 1) * 4096).unwrap();
                assert_eq!(b, old_far);
                dev.read_at(&mut b, far * 4096).unwrap();
                assert_eq!(b, versioned(far, 1, 4096));
                dev.write_at(&versioned(1, 1, 4096), 4096, false).unwrap();
            });
            let others_went_on = others.recv_timeout(t).is_ok();
            // The held block's reader and a flush wait for the held write.
            let reader = spawn_signal(s, move || {
                let mut b = vec![0u8; 4096];
                dev.read_at(&mut b, 0).unwrap();
                assert_eq!(b, versioned(0, 1, 4096));
            });
            std::thread::sleep(Duration::from_millis(200));
            let read_early = reader.try_recv().is_ok();
            let flusher = spawn_signal(s, move || dev.flush().unwrap());
            std::thread::sleep(Duration::from_millis(200));
            let flush_early = flusher.try_recv().is_ok();
            let writer_early = writer.try_recv().is_ok();
            held.open();
            assert!(
                others_went_on,
                "{mode:?}: a write or read of other blocks waited for the held write"
            );
            assert!(!writer_early, "{mode:?}: the held write finished");
            assert!(
                !read_early,
                "{mode:?}: a read of the held block did not wait"
            );
            assert!(
                !flush_early,
                "{mode:?}: a flush did not wait for the held write"
            );
            writer.recv_timeout(t).unwrap();
            reader.recv_timeout(t).unwrap();
            flusher.recv_timeout(t).unwrap();
        });
        if mode == Mode::Bitmap {
            // The flush came after the held write: it cleared the bitmap (the journal
            // area's first bytes) with nothing dirty left behind.
            let mut bitmap = vec![0u8; 512];
            held.read_at(&mut bitmap, geo.journal_byte(0, 0)).unwrap();
            assert!(bitmap.iter().all(|&b| b == 0), "the bitmap is still dirty");
        }
        let mut b = vec![0u8; 4096];
        for (blk, want) in [(0, 1), (1, 1), (far, 1)] {
            dev.read_at(&mut b, blk * 4096).unwrap();
            assert_eq!(b, versioned(blk, want, 4096), "{mode:?} block {blk}");
        }
        assert_eq!(dev.mismatches(), 0, "{mode:?}");
    }
}
