//! `IntegrityBackend` passes the conformance suite every `Backend` runs (round trips at
//! assorted offsets from aligned and misaligned memory, range checks, batches, flush and
//! FUA, concurrent writers), in modes J, D and B, with 512- and 4096-byte blocks, with a
//! journal small enough to wrap many times; and readers racing writers over the same
//! blocks never see a tag mismatch (old or new data, nothing else).

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use ucrypt_backend::{Backend, MemoryBackend};
use ucrypt_format::integrity::FormatParams;
use ucrypt_integrity::{format, Algorithm, IntegrityBackend, Mode, Options};
use zeroize::Zeroizing;

fn device(mode: Mode, sector: u32, alg: Algorithm) -> IntegrityBackend {
    let inner: Arc<dyn Backend> = Arc::new(MemoryBackend::new(8 << 20).unwrap());
    let mut o = Options::new(alg);
    o.mode = mode;
    if alg.keyed() {
        o.hash_key = Some(Zeroizing::new(vec![9u8; 32]));
    }
    let params = FormatParams {
        sector_size: sector,
        tag_size: alg.digest_size() as u32,
        // A small journal (a few sections): the suite's writes wrap it many times.
        journal_sectors: 1024,
        ..FormatParams::default()
    };
    format(Arc::clone(&inner), &params, &o, true).unwrap();
    IntegrityBackend::open(inner, o).unwrap()
}

#[test]
fn the_conformance_suite_passes_in_every_mode() {
    for mode in [Mode::Journal, Mode::Direct, Mode::Bitmap] {
        for sector in [512, 4096] {
            for alg in [Algorithm::Crc32c, Algorithm::HmacSha256] {
                let dev = device(mode, sector, alg);
                ucrypt_backend::testing::conformance(&dev);
                assert_eq!(dev.mismatches(), 0, "{mode:?} {sector} {alg:?}");
                dev.close().unwrap();
            }
        }
    }
}

#[test]
fn readers_racing_writers_never_see_a_mismatch() {
    for mode in [Mode::Journal, Mode::Direct] {
        let dev = Arc::new(device(mode, 4096, Algorithm::Crc32c));
        let blocks = 64u64;
        std::thread::scope(|s| {
            for w in 0..2u8 {
                let dev = Arc::clone(&dev);
                s.spawn(move || {
                    for round in 0..200u64 {
                        let b = (round * 7 + u64::from(w) * 13) % blocks;
                        let v = [w.wrapping_mul(100).wrapping_add(round as u8); 4096];
                        dev.write_at(&v, b * 4096, round % 16 == 0).unwrap();
                    }
                });
            }
            for _ in 0..2 {
                let dev = Arc::clone(&dev);
                s.spawn(move || {
                    let mut buf = vec![0u8; 4 * 4096];
                    for round in 0..400u64 {
                        let b = round % (blocks - 3);
                        dev.read_at(&mut buf, b * 4096).unwrap();
                        for blk in buf.chunks(4096) {
                            assert!(blk.iter().all(|&x| x == blk[0]), "a torn block");
                        }
                    }
                });
            }
        });
        assert_eq!(dev.mismatches(), 0);
    }
}

/// A block of `conformance`'s version test: its number and version in the first 16 bytes,
/// the rest a fill derived from both.
fn versioned(block: u64, version: u64) -> Vec<u8> {
    let fill = (block as u8).wrapping_mul(31) ^ (version as u8);
    let mut b = vec![fill; 4096];
    b[..8].copy_from_slice(&block.to_le_bytes());
    b[8..16].copy_from_slice(&version.to_le_bytes());
    b
}

/// The version a block read back holds (panics on anything but a block `versioned` made
/// for this block number, or zeros: never written).
fn version_of(block: u64, b: &[u8]) -> u64 {
    if b.iter().all(|&x| x == 0) {
        return 0;
    }
    let v = u64::from_le_bytes(b[8..16].try_into().unwrap());
    assert_eq!(
        b,
        &versioned(block, v)[..],
        "block {block}: not a version written"
    );
    v
}

/// A memory backend whose writes take a while (the write-back's window stays open long
/// enough for readers and writers to run inside it).
struct Slow(MemoryBackend);

impl Backend for Slow {
    fn info(&self) -> &ucrypt_backend::BackendInfo {
        self.0.info()
    }

    fn submit(&self, io: ucrypt_backend::Io<'_>) -> Result<(), ucrypt_backend::BackendError> {
        if matches!(io.kind, ucrypt_backend::IoKind::Write(_)) {
            std::thread::sleep(std::time::Duration::from_micros(300));
        }
        self.0.submit(io)
    }

    fn flush(&self) -> Result<(), ucrypt_backend::BackendError> {
        self.0.flush()
    }
}

/// The journal's write-back runs without the state lock while other writers fill the
/// journal and readers read: a reader never sees a block go back to an older version (its
/// newest entry stays in the journal until the block is in its place), every block ends at
/// its last version, and after a crash (no close) the replayed journal gives the same.
#[test]
fn write_backs_overlapping_writers_and_readers_keep_every_block_newest() {
    let inner: Arc<dyn Backend> = Arc::new(Slow(MemoryBackend::new(8 << 20).unwrap()));
    let mut o = Options::new(Algorithm::Crc32c);
    o.mode = Mode::Journal;
    let params = FormatParams {
        sector_size: 4096,
        tag_size: 4,
        // Two sections of 48 entries: requests of up to 8 blocks fill it every few writes.
        journal_sectors: 1024,
        ..FormatParams::default()
    };
    format(Arc::clone(&inner), &params, &o, true).unwrap();
    let dev = Arc::new(IntegrityBackend::open(Arc::clone(&inner), o.clone()).unwrap());
    let (writers, per_writer, rounds) = (3u64, 24u64, 300u64);
    let blocks = writers * per_writer;
    let last: Vec<Vec<u64>> = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for w in 0..writers {
            let dev = Arc::clone(&dev);
            handles.push(s.spawn(move || {
                let mut last = vec![0u64; per_writer as usize];
                for round in 1..=rounds {
                    let first = (round * 5 + w * 7) % per_writer;
                    let n = (1 + round % 8).min(per_writer - first);
                    let mut buf = Vec::new();
                    for k in 0..n {
                        buf.extend(versioned(w * per_writer + first + k, round));
                        last[(first + k) as usize] = round;
                    }
                    let at = (w * per_writer + first) * 4096;
                    dev.write_at(&buf, at, round % 50 == 0).unwrap();
                }
                last
            }));
        }
        for r in 0..2u64 {
            let dev = Arc::clone(&dev);
            s.spawn(move || {
                let mut seen = vec![0u64; blocks as usize];
                let mut buf = vec![0u8; 6 * 4096];
                for round in 0..1500u64 {
                    let first = (round * 11 + r * 3) % (blocks - 5);
                    dev.read_at(&mut buf, first * 4096).unwrap();
                    for (k, b) in buf.chunks(4096).enumerate() {
                        let blk = first + k as u64;
                        let v = version_of(blk, b);
                        assert!(
                            v >= seen[blk as usize],
                            "block {blk} went back from version {} to {v}",
                            seen[blk as usize]
                        );
                        seen[blk as usize] = v;
                    }
                }
            });
        }
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(dev.mismatches(), 0);
    let check = |dev: &IntegrityBackend| {
        let mut b = vec![0u8; 4096];
        for w in 0..writers {
            for k in 0..per_writer {
                let blk = w * per_writer + k;
                dev.read_at(&mut b, blk * 4096).unwrap();
                assert_eq!(
                    version_of(blk, &b),
                    last[w as usize][k as usize],
                    "block {blk}"
                );
            }
        }
    };
    check(&dev);
    dev.flush().unwrap();
    // A crash: the device is never closed; the next open replays what the journal holds.
    std::mem::forget(dev);
    let again = IntegrityBackend::open(inner, o).unwrap();
    check(&again);
    assert_eq!(again.mismatches(), 0);
}

/// A memory backend whose writes into the journal area wait while the gate is shut, and
/// which can be copied as it stands (what a crash at that moment leaves).
struct Gate {
    mem: MemoryBackend,
    journal: std::sync::Mutex<std::ops::Range<u64>>,
    /// (shut, journal writes waiting)
    state: std::sync::Mutex<(bool, u32)>,
    cv: std::sync::Condvar,
}

impl Gate {
    fn new(bytes: u64) -> Gate {
        Gate {
            mem: MemoryBackend::new(bytes).unwrap(),
            journal: std::sync::Mutex::new(0..0),
            state: std::sync::Mutex::new((false, 0)),
            cv: std::sync::Condvar::new(),
        }
    }

    fn set_shut(&self, shut: bool) {
        self.state.lock().unwrap().0 = shut;
        self.cv.notify_all();
    }

    /// Whether a journal write came to the shut gate within `secs`.
    fn wait_held(&self, secs: u64) -> bool {
        let g = self.state.lock().unwrap();
        let (g, _) = self
            .cv
            .wait_timeout_while(g, std::time::Duration::from_secs(secs), |g| g.1 == 0)
            .unwrap();
        g.1 > 0
    }

    /// The device as it stands, as a new memory backend.
    fn snapshot(&self) -> Arc<dyn Backend> {
        let size = self.mem.info().size_bytes;
        let mut all = vec![0u8; size as usize];
        self.mem.read_at(&mut all, 0).unwrap();
        let copy = MemoryBackend::new(size).unwrap();
        copy.write_at(&all, 0, false).unwrap();
        Arc::new(copy)
    }
}

impl Backend for Gate {
    fn info(&self) -> &ucrypt_backend::BackendInfo {
        self.mem.info()
    }

    fn submit(&self, io: ucrypt_backend::Io<'_>) -> Result<(), ucrypt_backend::BackendError> {
        let write = matches!(
            io.kind,
            ucrypt_backend::IoKind::Write(_) | ucrypt_backend::IoKind::WriteOwned(_)
        );
        if write && self.journal.lock().unwrap().contains(&io.offset) {
            let mut g = self.state.lock().unwrap();
            g.1 += 1;
            self.cv.notify_all();
            while g.0 {
                g = self.cv.wait(g).unwrap();
            }
            g.1 -= 1;
        }
        self.mem.submit(io)
    }

    fn flush(&self) -> Result<(), ucrypt_backend::BackendError> {
        self.mem.flush()
    }
}

/// Blocks `0..4` at `v`, blocks `10..14` at `w`, read from a device opened (journal
/// replayed) on `inner`, without a tag mismatch.
fn expect_versions(inner: Arc<dyn Backend>, o: &Options, v: u64, w: u64) {
    let dev = IntegrityBackend::open(inner, o.clone()).unwrap();
    let mut b = vec![0u8; 4096];
    for (blocks, want) in [(0..4u64, v), (10..14u64, w)] {
        for blk in blocks {
            dev.read_at(&mut b, blk * 4096).unwrap();
            assert_eq!(version_of(blk, &b), want, "block {blk}");
        }
    }
    assert_eq!(dev.mismatches(), 0);
}

/// The journal's commit writes its sections without the state lock: while that write is
/// held in the backend, readers (of the blocks being committed too) and writers go on; the
/// flush that started the commit returns only once the write is done, and a second flush
/// (its blocks written meanwhile) only after it, with a commit of its own. A crash while
/// the commit is held leaves what the flush before it made durable; a crash after both
/// flushes, everything they covered.
#[test]
fn a_commit_holds_no_reader_or_writer_and_a_flush_waits_for_its_commit() {
    let gate = Arc::new(Gate::new(8 << 20));
    let inner: Arc<dyn Backend> = Arc::clone(&gate) as Arc<dyn Backend>;
    let mut o = Options::new(Algorithm::Crc32c);
    o.mode = Mode::Journal;
    let params = FormatParams {
        sector_size: 4096,
        tag_size: 4,
        // Sections to spare: the three commits below never reach the watermark.
        journal_sectors: 8192,
        ..FormatParams::default()
    };
    format(Arc::clone(&inner), &params, &o, true).unwrap();
    let dev = IntegrityBackend::open(Arc::clone(&inner), o.clone()).unwrap();
    let geo = dev.geometry();
    let start = geo.journal_byte(0, 0);
    *gate.journal.lock().unwrap() = start..start + geo.journal.sectors() * 512;
    let write = |blocks: std::ops::Range<u64>, v: u64| {
        for blk in blocks {
            dev.write_at(&versioned(blk, v), blk * 4096, false).unwrap();
        }
    };
    write(0..4, 1);
    dev.flush().unwrap();
    write(0..4, 2);
    gate.set_shut(true);
    let (flushed1, flush1_rx) = std::sync::mpsc::channel();
    let (flushed2, flush2_rx) = std::sync::mpsc::channel();
    let (went_on, went_on_rx) = std::sync::mpsc::channel();
    let crash_during = std::thread::scope(|s| {
        s.spawn(|| {
            dev.flush().unwrap();
            flushed1.send(()).unwrap();
        });
        let held = gate.wait_held(10);
        let crash = gate.snapshot();
        s.spawn(|| {
            let mut b = vec![0u8; 4096];
            for blk in 0..4u64 {
                dev.read_at(&mut b, blk * 4096).unwrap();
                assert_eq!(version_of(blk, &b), 2, "block {blk}");
            }
            write(10..14, 3);
            went_on.send(()).unwrap();
        });
        let on = went_on_rx.recv_timeout(std::time::Duration::from_secs(10));
        let flush1_early = flush1_rx.try_recv().is_ok();
        s.spawn(|| {
            dev.flush().unwrap();
            flushed2.send(()).unwrap();
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        let flush2_early = flush2_rx.try_recv().is_ok();
        gate.set_shut(false);
        assert!(held, "the flush wrote no journal");
        assert!(
            on.is_ok(),
            "a reader or writer waited for the journal write"
        );
        assert!(
            !flush1_early,
            "a flush returned before its commit was written"
        );
        assert!(
            !flush2_early,
            "a flush returned before the commit under way was written"
        );
        let t = std::time::Duration::from_secs(10);
        flush1_rx.recv_timeout(t).unwrap();
        flush2_rx.recv_timeout(t).unwrap();
        crash
    });
    let crash_after = gate.snapshot();
    expect_versions(crash_during, &o, 1, 0);
    expect_versions(crash_after, &o, 2, 3);
    assert_eq!(dev.mismatches(), 0);
}
