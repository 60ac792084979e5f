//! Crash consistency: nothing acknowledged as durable is lost, and no sector is torn.
//!
//! Several NBD connections drive a random mix of writes, FUA writes and flushes while every
//! acknowledgement and every completed flush is logged against one global event clock.
//! Then the server dies, and a fresh server + fresh client read the whole volume back:
//!
//! - every sector must hold exactly one write's pattern (a header naming the write id and
//!   sector, then bytes derived from both): no mix of two writes, no garbage;
//! - the write it holds must not be older than a *durable* write to that sector, where
//!   durable means acknowledged before the start of a flush that completed (on any
//!   connection: the export advertises multi-conn) or acknowledged with FUA. Precisely: a
//!   sector may hold write X only if no durable write D to it was *sent* after X was
//!   acknowledged (or, for X never acknowledged, after the crash).
//!
//! Two ways to die:
//! - [`sigkill_rounds_lose_no_acknowledged_write`]: the real `ucrypt open` on a file, killed
//!   with SIGKILL at random points, many rounds. The page cache survives a process kill, so
//!   this proves ucrypt never acknowledges a write it has not handed to the kernel and never
//!   tears a sector, in every engine placement.
//! - [`power_cut_loses_only_unflushed_writes`]: the NBD server and engine in process, over a
//!   backend with a volatile write cache (a disk's cache). The "power cut" keeps only
//!   flushed/FUA data plus a random subset of cached sectors, so a FLUSH or FUA that did not
//!   reach the backend's flush/FUA would lose data and be caught.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use ucrypt_backend::{Backend, BackendError, BackendInfo, Caps, MemoryBackend, Support};
use ucrypt_nbd::client::{Address, Connection};
use ucrypt_nbd::command::Request;
use ucrypt_nbd::proto::*;

const SECTOR: u64 = 4096;
const SECTORS: u64 = 512; // 2 MiB volume
const CONNS: usize = 4;
const MAGIC: &[u8; 8] = b"UCRASH01";

use ucrypt_testkit::Rng;

fn seed() -> u64 {
    ucrypt_testkit::seed("UCRYPT_CRASH_SEED")
}

/// The content write `id` puts in volume sector `sector`.
fn fill(id: u64, sector: u64, out: &mut [u8]) {
    out[..8].copy_from_slice(MAGIC);
    out[8..16].copy_from_slice(&id.to_le_bytes());
    out[16..24].copy_from_slice(&sector.to_le_bytes());
    let mut r = Rng::new((id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ sector) | 1);
    for c in out[24..].chunks_mut(8) {
        let v = r.next_u64().to_le_bytes();
        c.copy_from_slice(&v[..c.len()]);
    }
}

/// The write id a sector holds, if it is one complete, untorn pattern for this sector.
fn holder(sector: u64, data: &[u8]) -> Result<u64, String> {
    if &data[..8] != MAGIC {
        return Err(format!(
            "sector {sector}: no write header (garbage: {:02x?})",
            &data[..16]
        ));
    }
    let id = u64::from_le_bytes(data[8..16].try_into().unwrap());
    let at = u64::from_le_bytes(data[16..24].try_into().unwrap());
    if at != sector {
        return Err(format!(
            "sector {sector} holds write {id}'s data for sector {at}"
        ));
    }
    let mut want = vec![0u8; data.len()];
    fill(id, sector, &mut want);
    if want != data {
        let first = want.iter().zip(data).position(|(a, b)| a != b).unwrap();
        return Err(format!(
            "sector {sector}: torn: header names write {id} but byte {first} differs"
        ));
    }
    Ok(id)
}

/// One global order of events (sends, acknowledgements, flush starts/ends, crashes).
static CLOCK: AtomicU64 = AtomicU64::new(1);
fn tick() -> u64 {
    CLOCK.fetch_add(1, Ordering::SeqCst)
}

#[derive(Debug, Clone)]
struct WriteRec {
    id: u64,
    first: u64,
    count: u64,
    fua: bool,
    sent: u64,
    /// Acknowledged with errno 0 at this time.
    acked: Option<u64>,
}

#[derive(Debug, Default)]
struct RoundLog {
    writes: Vec<WriteRec>,
    /// Start times of flushes that completed successfully.
    flush_starts: Vec<u64>,
    ops: u64,
}

/// Drives one connection until `stop`, the op budget, or a dead socket.
fn drive(
    addr: Address,
    mut rng: Rng,
    next_id: Arc<AtomicU64>,
    done_ops: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    max_ops: u64,
) -> RoundLog {
    let mut log = RoundLog::default();
    let Ok(mut c) = Connection::connect(&addr, "") else {
        return log;
    };
    assert!(
        c.facts().flags & NBD_FLAG_CAN_MULTI_CONN != 0,
        "multi-conn is advertised"
    );
    let mut buf = Vec::new();
    while !stop.load(Ordering::SeqCst) && log.ops < max_ops {
        let roll = rng.below(100);
        if roll < 15 {
            let start = tick();
            let r = c.call(
                Request {
                    flags: 0,
                    kind: NBD_CMD_FLUSH,
                    cookie: 0,
                    offset: 0,
                    length: 0,
                },
                &[],
                &mut [],
            );
            match r {
                Ok(0) => log.flush_starts.push(start),
                _ => break,
            }
        } else {
            let count = 1 + rng.below(8);
            // Half the writes go to a hot spot so connections overwrite each other.
            let span = if rng.below(2) == 0 { 32 } else { SECTORS };
            let first = rng.below(span - count + 1);
            let fua = roll >= 75;
            let id = next_id.fetch_add(1, Ordering::SeqCst);
            buf.resize((count * SECTOR) as usize, 0);
            for (i, s) in buf.chunks_mut(SECTOR as usize).enumerate() {
                fill(id, first + i as u64, s);
            }
            let sent = tick();
            log.writes.push(WriteRec {
                id,
                first,
                count,
                fua,
                sent,
                acked: None,
            });
            let r = c.call(
                Request {
                    flags: if fua { NBD_CMD_FLAG_FUA } else { 0 },
                    kind: NBD_CMD_WRITE,
                    cookie: 0,
                    offset: first * SECTOR,
                    length: (count * SECTOR) as u32,
                },
                &buf,
                &mut [],
            );
            match r {
                Ok(0) => log.writes.last_mut().unwrap().acked = Some(tick()),
                Ok(_) => {} // refused: may or may not have landed
                Err(_) => break,
            }
        }
        log.ops += 1;
        done_ops.fetch_add(1, Ordering::SeqCst);
    }
    log
}

/// The per-sector model: what each sector held at the last verification, and this
/// round's writes.
struct Model {
    baseline: Vec<u64>,
    round: Vec<WriteRec>,
    flush_starts: Vec<u64>,
    /// Totals for the report.
    acked: u64,
    durable: u64,
    sectors_checked: u64,
    unacked_landed: u64,
}

impl Model {
    /// A model of the volume `prefill` wrote (`baseline`), no round yet.
    fn new(baseline: Vec<u64>) -> Model {
        Model {
            baseline,
            round: Vec::new(),
            flush_starts: Vec::new(),
            acked: 0,
            durable: 0,
            sectors_checked: 0,
            unacked_landed: 0,
        }
    }

    fn durable(&self, w: &WriteRec) -> bool {
        match w.acked {
            Some(a) => w.fua || self.flush_starts.iter().any(|&f| f > a),
            None => false,
        }
    }

    /// Checks the whole volume read back after a crash at `crash_t`, then makes what it
    /// holds the new baseline.
    fn verify(&mut self, image: &[u8], crash_t: u64) -> Result<(), String> {
        let mut by_sector: HashMap<u64, Vec<&WriteRec>> = HashMap::new();
        for w in &self.round {
            for s in w.first..w.first + w.count {
                by_sector.entry(s).or_default().push(w);
            }
        }
        let mut errors = Vec::new();
        let mut new_base = self.baseline.clone();
        for s in 0..SECTORS {
            let data = &image[(s * SECTOR) as usize..((s + 1) * SECTOR) as usize];
            let id = match holder(s, data) {
                Ok(id) => id,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            self.sectors_checked += 1;
            let writes = by_sector.get(&s).map(Vec::as_slice).unwrap_or(&[]);
            let durable: Vec<&&WriteRec> = writes.iter().filter(|w| self.durable(w)).collect();
            // The time after which X can no longer have landed.
            let landed_by = if id == self.baseline[s as usize] {
                0
            } else if let Some(x) = writes.iter().find(|w| w.id == id) {
                if x.acked.is_none() {
                    self.unacked_landed += 1;
                }
                x.acked.unwrap_or(crash_t)
            } else {
                errors.push(format!(
                    "sector {s} holds write {id}, which is neither its previous content ({}) nor \
                     one of this round's writes to it",
                    self.baseline[s as usize]
                ));
                continue;
            };
            if let Some(d) = durable.iter().find(|d| d.sent > landed_by && d.id != id) {
                errors.push(format!(
                    "sector {s} holds write {id} but durable write {} (sent at {}, acknowledged \
                     at {:?}, fua {}) was issued after it completed: acknowledged data lost",
                    d.id, d.sent, d.acked, d.fua
                ));
            }
            new_base[s as usize] = id;
        }
        self.acked += self.round.iter().filter(|w| w.acked.is_some()).count() as u64;
        self.durable += self.round.iter().filter(|w| self.durable(w)).count() as u64;
        self.baseline = new_base;
        self.round.clear();
        self.flush_starts.clear();
        if errors.is_empty() {
            Ok(())
        } else {
            errors.truncate(10);
            Err(errors.join("\n"))
        }
    }
}

/// Reads the whole volume through a fresh client.
fn read_all(addr: &Address) -> Vec<u8> {
    let mut c = Connection::connect(addr, "").unwrap();
    let mut image = vec![0u8; (SECTORS * SECTOR) as usize];
    for (i, chunk) in image.chunks_mut(1 << 20).enumerate() {
        let errno = c
            .call(
                Request {
                    flags: 0,
                    kind: NBD_CMD_READ,
                    cookie: 0,
                    offset: (i as u64) << 20,
                    length: chunk.len() as u32,
                },
                &[],
                chunk,
            )
            .unwrap();
        assert_eq!(errno, 0, "read after restart failed");
    }
    image
}

/// Writes the initial content (write id = 1 + sector) and flushes.
fn prefill(addr: &Address) -> Vec<u64> {
    let mut c = Connection::connect(addr, "").unwrap();
    let mut buf = vec![0u8; (SECTORS * SECTOR) as usize];
    for (s, chunk) in buf.chunks_mut(SECTOR as usize).enumerate() {
        fill(1 + s as u64, s as u64, chunk);
    }
    for (i, chunk) in buf.chunks(1 << 20).enumerate() {
        let req = Request {
            flags: NBD_CMD_FLAG_FUA,
            kind: NBD_CMD_WRITE,
            cookie: 0,
            offset: (i as u64) << 20,
            length: chunk.len() as u32,
        };
        assert_eq!(c.call(req, chunk, &mut []).unwrap(), 0);
    }
    (0..SECTORS).map(|s| 1 + s).collect()
}

/// One round of load: `CONNS` connections until `crash` has been called after the main
/// thread saw `kill_after` completed operations. Returns the logs and the crash time.
fn load_round(
    addr: &Address,
    rng: &mut Rng,
    next_id: &Arc<AtomicU64>,
    kill_after: u64,
    crash: impl FnOnce(),
) -> (Vec<RoundLog>, u64) {
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let max_ops = 4 * kill_after; // a connection never runs on unbounded
    let threads: Vec<_> = (0..CONNS)
        .map(|_| {
            let (a, r, n, d, s) = (
                addr.clone(),
                Rng::new(rng.next_u64() | 1),
                Arc::clone(next_id),
                Arc::clone(&done),
                Arc::clone(&stop),
            );
            std::thread::spawn(move || drive(a, r, n, d, s, max_ops))
        })
        .collect();
    // Bounded wait: every connection stops by itself after `max_ops`.
    while done.load(Ordering::SeqCst) < kill_after && !threads.iter().all(|t| t.is_finished()) {
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    crash();
    let crash_t = tick();
    stop.store(true, Ordering::SeqCst);
    let logs = threads.into_iter().map(|t| t.join().unwrap()).collect();
    (logs, crash_t)
}

fn absorb(model: &mut Model, logs: Vec<RoundLog>) -> u64 {
    let mut ops = 0;
    for l in logs {
        ops += l.ops;
        model.round.extend(l.writes);
        model.flush_starts.extend(l.flush_starts);
    }
    ops
}

fn report(what: &str, rounds: u64, ops: u64, m: &Model, seed: u64) {
    eprintln!(
        "{what}: seed {seed}: {rounds} rounds, {ops} operations, {} writes acknowledged, \
         {} durable writes (acknowledged before a completed flush, or FUA) verified present, \
         {} sectors verified untorn, {} sectors held a write that was in flight at the crash",
        m.acked, m.durable, m.sectors_checked, m.unacked_landed
    );
}

/// What every crash test keeps across its rounds (a round: load until a random number of
/// operations completed, crash, recover, read back, verify): the model, the next write id
/// and the operations run.
struct Rounds {
    model: Model,
    next_id: Arc<AtomicU64>,
    rounds: u64,
    ops: u64,
}

impl Rounds {
    /// Rounds starting from the volume `prefill` wrote (`baseline`).
    fn new(baseline: Vec<u64>) -> Rounds {
        Rounds {
            model: Model::new(baseline),
            next_id: Arc::new(AtomicU64::new(1 + SECTORS)),
            rounds: 0,
            ops: 0,
        }
    }

    /// The load of one round through `addr`, `crash` called once 20..320 operations have
    /// completed; returns the crash time.
    fn load(&mut self, addr: &Address, rng: &mut Rng, crash: impl FnOnce()) -> u64 {
        let kill_after = 20 + rng.below(300);
        let (logs, crash_t) = load_round(addr, rng, &self.next_id, kill_after, crash);
        self.ops += absorb(&mut self.model, logs);
        self.rounds += 1;
        crash_t
    }

    /// Verifies the volume read back after the crash at `crash_t`; a failure names the
    /// round as `what` says.
    fn verify(&mut self, image: &[u8], crash_t: u64, what: impl std::fmt::Display) {
        if let Err(e) = self.model.verify(image, crash_t) {
            panic!("{what}:\n{e}");
        }
    }

    /// The report line, and the check that the rounds proved something: durable writes
    /// were verified present and every sector of every round was checked.
    fn finish(&self, what: &str, seed: u64) {
        report(what, self.rounds, self.ops, &self.model, seed);
        assert!(self.model.durable > 0 && self.model.sectors_checked == self.rounds * SECTORS);
    }
}

// ---------------------------------------------------------------------------------------
// SIGKILL of the real server process.

struct Proc {
    child: std::process::Child,
    addr: Address,
}

fn start(table: &Path, sock: PathBuf, flags: &[&str]) -> Proc {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ucrypt"))
        .args(["open", "--table-file"])
        .arg(table)
        .arg("--socket")
        .arg(&sock)
        .args(flags)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("nbd+unix"), "no URI: {line:?}");
    Proc {
        child,
        addr: Address::Unix(sock),
    }
}

/// Engine placements and server modes, one per round in turn.
const VARIANTS: &[&[&str]] = &[
    &[],
    &["--placement", "kernel"],
    &["--placement", "kernel", "--perf-submit_from_crypt_cpus"],
    &["--placement", "kernel", "--write-order", "sorted"],
    &["--placement", "kernel", "--perf-same_cpu_crypt"],
    &["--perf-no_read_workqueue", "--perf-no_write_workqueue"],
    &["--nbd-workers", "0"],
    &["--split-bytes", "8192", "--placement", "kernel"],
];

fn rounds(default: u64) -> u64 {
    std::env::var("UCRYPT_CRASH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[test]
fn sigkill_rounds_lose_no_acknowledged_write() {
    let seed = seed();
    let mut rng = Rng::new(seed);
    let tmp = tempfile::tempdir().unwrap();
    let img = common::image(tmp.path(), "disk.img", SECTORS * SECTOR);
    let (_, table) = common::nbd::xts_table(tmp.path(), &img, SECTOR as u32, &[]);
    let mut server = start(&table, tmp.path().join("s0.sock"), VARIANTS[0]);
    let mut rounds = Rounds::new(prefill(&server.addr));
    for round in 0..self::rounds(80) {
        let child = &mut server.child;
        let crash_t = rounds.load(&server.addr, &mut rng, || {
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();
        });
        let variant = VARIANTS[(round as usize + 1) % VARIANTS.len()];
        server = start(
            &table,
            tmp.path().join(format!("s{}.sock", round + 1)),
            variant,
        );
        let what = format!("round {round} (seed {seed}, restarted with {variant:?})");
        rounds.verify(&read_all(&server.addr), crash_t, what);
    }
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    rounds.finish("sigkill", seed);
}

// ---------------------------------------------------------------------------------------
// Power cut under a volatile write cache, in process.

/// A disk with a volatile write cache: writes land in the cache (one entry per sector, the
/// physical block), FLUSH and FUA make data durable, and [`Cache::cut`] loses power.
struct Cache {
    info: BackendInfo,
    /// The unit a power cut keeps or loses whole (the disk's atomic write).
    unit: u64,
    state: Mutex<CacheState>,
}

struct CacheState {
    durable: Vec<u8>,
    /// Unit → data written since the last flush (latest only: a newer write replaces
    /// the older one in the cache).
    dirty: HashMap<u64, Vec<u8>>,
    dead: bool,
}

impl Cache {
    fn new(durable: Vec<u8>) -> Self {
        Cache::with_unit(durable, SECTOR)
    }

    /// A disk whose atomic unit is `unit` bytes (512: writes of dm-integrity's journal,
    /// tags and superblock, torn at any 512-byte boundary by a cut).
    fn with_unit(durable: Vec<u8>, unit: u64) -> Self {
        Cache {
            unit,
            info: BackendInfo {
                size_bytes: durable.len() as u64,
                logical_block: 512,
                physical_block: unit as u32,
                optimal_block: unit as u32,
                caps: Caps {
                    flush: Support::Native,
                    discard: Support::None,
                    write_zeroes: Support::None,
                    read_only: false,
                },
            },
            state: Mutex::new(CacheState {
                durable,
                dirty: HashMap::new(),
                dead: false,
            }),
        }
    }

    /// Power loss: the durable bytes plus a random subset of the cached sectors.
    fn cut(&self, rng: &mut Rng) -> Vec<u8> {
        let mut st = self.state.lock().unwrap();
        st.dead = true;
        let mut image = st.durable.clone();
        let u = self.unit;
        for (&s, data) in &st.dirty {
            if rng.below(2) == 0 {
                image[(s * u) as usize..((s + 1) * u) as usize].copy_from_slice(data);
            }
        }
        image
    }
}

fn dead() -> BackendError {
    BackendError::Other("the disk lost power".into())
}

impl Cache {
    fn read(&self, buf: &mut [u8], offset: u64) -> Result<(), BackendError> {
        let st = self.state.lock().unwrap();
        if st.dead {
            return Err(dead());
        }
        ucrypt_backend::check_range(offset, buf.len() as u64, self.info.size_bytes)?;
        let o = offset as usize;
        buf.copy_from_slice(&st.durable[o..o + buf.len()]);
        let u = self.unit;
        let (first, last) = (offset / u, (offset + buf.len() as u64 - 1) / u);
        if st.dirty.len() < (last - first + 1) as usize {
            for (&s, d) in &st.dirty {
                if s >= first && s <= last {
                    Self::overlay(buf, offset, s, u, d);
                }
            }
        } else {
            for s in first..=last {
                if let Some(d) = st.dirty.get(&s) {
                    Self::overlay(buf, offset, s, u, d);
                }
            }
        }
        Ok(())
    }

    fn overlay(buf: &mut [u8], offset: u64, s: u64, u: u64, d: &[u8]) {
        let (lo, hi) = (
            (s * u).max(offset),
            ((s + 1) * u).min(offset + buf.len() as u64),
        );
        buf[(lo - offset) as usize..(hi - offset) as usize]
            .copy_from_slice(&d[(lo - s * u) as usize..(hi - s * u) as usize]);
    }

    fn write(&self, buf: &[u8], offset: u64, fua: bool) -> Result<(), BackendError> {
        let mut st = self.state.lock().unwrap();
        if st.dead {
            return Err(dead());
        }
        ucrypt_backend::check_range(offset, buf.len() as u64, self.info.size_bytes)?;
        // The engine writes whole encryption sectors, aligned: the physical block (and
        // dm-integrity whole 512-byte sectors).
        let u = self.unit;
        assert!(offset % u == 0 && buf.len() as u64 % u == 0);
        for (i, chunk) in buf.chunks(u as usize).enumerate() {
            let s = offset / u + i as u64;
            if fua {
                st.dirty.remove(&s);
                let o = (s * u) as usize;
                st.durable[o..o + u as usize].copy_from_slice(chunk);
            } else {
                st.dirty.insert(s, chunk.to_vec());
            }
        }
        Ok(())
    }
}

impl Backend for Cache {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn submit(&self, io: ucrypt_backend::Io<'_>) -> Result<(), ucrypt_backend::BackendError> {
        match io.kind {
            ucrypt_backend::IoKind::Read(buf) => self.read(buf, io.offset),
            ucrypt_backend::IoKind::Write(buf) => self.write(buf, io.offset, io.fua),
            _ => ucrypt_backend::emulate::fallback(self, io),
        }
    }

    fn flush(&self) -> Result<(), BackendError> {
        let mut st = self.state.lock().unwrap();
        if st.dead {
            return Err(dead());
        }
        let dirty = std::mem::take(&mut st.dirty);
        let u = self.unit as usize;
        for (s, d) in dirty {
            let o = s as usize * u;
            st.durable[o..o + u].copy_from_slice(&d);
        }
        Ok(())
    }
}

fn xts() -> Arc<dyn ucrypt_crypto::SectorCipher> {
    let key: Vec<u8> = (0..64u8)
        .map(|i| i.wrapping_mul(29).wrapping_add(3))
        .collect();
    Arc::from(
        "aes-xts-plain64"
            .parse::<ucrypt_crypto::CipherSpec>()
            .unwrap()
            .build(
                &ucrypt_crypto::VolumeKey::new(key),
                ucrypt_crypto::SectorParams {
                    sector_size: ucrypt_crypto::SectorSize::new(SECTOR as u32).unwrap(),
                    ..Default::default()
                },
            )
            .unwrap(),
    )
}

fn engine_variants() -> Vec<ucrypt_engine::EngineOptions> {
    use ucrypt_engine::{AutoPolicy, EngineOptions, WriteOrder};
    let base = EngineOptions {
        auto: None,
        split_bytes: 8192,
        ..EngineOptions::default()
    };
    vec![
        EngineOptions::default(),
        base,
        EngineOptions {
            no_read_workqueue: true,
            no_write_workqueue: true,
            ..base
        },
        EngineOptions {
            submit_from_crypt_cpus: true,
            ..base
        },
        EngineOptions {
            write_order: WriteOrder::Sorted,
            ..base
        },
        EngineOptions {
            same_cpu_crypt: true,
            ..base
        },
        EngineOptions {
            auto: Some(AutoPolicy {
                split_min_bytes: 8192,
            }),
            ..base
        },
    ]
}

/// Serves a Volume over `backend` in process on a unix socket.
struct InProc {
    shutdown: ucrypt_nbd::Shutdown,
    thread: Option<std::thread::JoinHandle<Result<(), ucrypt_nbd::NbdError>>>,
    addr: Address,
}

impl InProc {
    fn start(backend: Arc<dyn Backend>, opts: ucrypt_engine::EngineOptions, sock: PathBuf) -> Self {
        let volume = ucrypt_engine::Volume::with_options(
            xts(),
            backend,
            ucrypt_engine::VolumeConfig {
                data_offset_bytes: 0,
                length_bytes: SECTORS * SECTOR,
                read_only: false,
                allow_discards: false,
            },
            opts,
        )
        .unwrap();
        InProc::serve(Arc::new(volume), sock)
    }

    /// Serves `export` as it is (an authenticated volume has no engine).
    fn serve(export: Arc<dyn Backend>, sock: PathBuf) -> Self {
        let listener = ucrypt_nbd::Listener::bind_unix(&sock).unwrap();
        let shutdown = ucrypt_nbd::Shutdown::default();
        let serve_opts = ucrypt_nbd::ServeOptions {
            shutdown: shutdown.clone(),
            ..Default::default()
        };
        let thread = std::thread::spawn(move || ucrypt_nbd::serve(listener, export, serve_opts));
        InProc {
            shutdown,
            thread: Some(thread),
            addr: Address::Unix(sock),
        }
    }

    fn stop(mut self) {
        self.shutdown.trigger();
        // The backend may be dead: the final flush may fail; only the join matters.
        let _ = self.thread.take().unwrap().join().unwrap();
    }
}

#[test]
fn power_cut_loses_only_unflushed_writes() {
    let seed = seed();
    let mut rng = Rng::new(seed);
    let tmp = tempfile::tempdir().unwrap();
    let variants = engine_variants();
    // Round 0 prefills through a plain memory backend, so the first cache starts durable.
    let mem = Arc::new(MemoryBackend::new(SECTORS * SECTOR).unwrap());
    let srv = InProc::start(mem.clone(), variants[0], tmp.path().join("p.sock"));
    let mut rounds = Rounds::new(prefill(&srv.addr));
    srv.stop();
    let mut image = vec![0u8; (SECTORS * SECTOR) as usize];
    mem.read_at(&mut image, 0).unwrap();
    for round in 0..self::rounds(150) {
        let opts = variants[round as usize % variants.len()];
        let disk = Arc::new(Cache::new(image));
        let srv = InProc::start(
            disk.clone(),
            opts,
            tmp.path().join(format!("c{round}.sock")),
        );
        let mut cut_rng = Rng::new(rng.next_u64() | 1);
        let mut after = Vec::new();
        let crash_t = rounds.load(&srv.addr, &mut rng, || {
            after = disk.cut(&mut cut_rng);
        });
        srv.stop();
        image = after;
        // Verify through a fresh engine + server over what survived.
        let survived = Arc::new(MemoryBackend::new(SECTORS * SECTOR).unwrap());
        survived.write_at(&image, 0, false).unwrap();
        let check = InProc::start(
            survived,
            variants[0],
            tmp.path().join(format!("v{round}.sock")),
        );
        let plain = read_all(&check.addr);
        check.stop();
        let what = format!("round {round} (seed {seed}, engine {opts:?})");
        rounds.verify(&plain, crash_t, what);
    }
    rounds.finish("power-cut", seed);
}

/// The checker itself catches lost data: a disk that drops every cached write at the cut
/// and ignores FLUSH (a lying disk) must fail verification once flushed writes exist.
#[test]
fn the_checker_catches_a_disk_that_ignores_flush() {
    struct Liar(Cache);
    impl Liar {
        fn read(&self, buf: &mut [u8], offset: u64) -> Result<(), BackendError> {
            self.0.read_at(buf, offset)
        }

        fn write(&self, buf: &[u8], offset: u64, _fua: bool) -> Result<(), BackendError> {
            self.0.write_at(buf, offset, false)
        }
    }

    impl Backend for Liar {
        fn info(&self) -> &BackendInfo {
            self.0.info()
        }
        fn submit(&self, io: ucrypt_backend::Io<'_>) -> Result<(), ucrypt_backend::BackendError> {
            match io.kind {
                ucrypt_backend::IoKind::Read(buf) => self.read(buf, io.offset),
                ucrypt_backend::IoKind::Write(buf) => self.write(buf, io.offset, io.fua),
                _ => ucrypt_backend::emulate::fallback(self, io),
            }
        }
        fn flush(&self) -> Result<(), BackendError> {
            Ok(())
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut image = vec![0u8; (SECTORS * SECTOR) as usize];
    let mem = Arc::new(MemoryBackend::new(SECTORS * SECTOR).unwrap());
    let srv = InProc::start(mem.clone(), engine_variants()[0], tmp.path().join("p.sock"));
    let baseline = prefill(&srv.addr);
    srv.stop();
    mem.read_at(&mut image, 0).unwrap();
    let liar = Arc::new(Liar(Cache::new(image)));
    let srv = InProc::start(
        liar.clone(),
        engine_variants()[0],
        tmp.path().join("l.sock"),
    );
    let next_id = Arc::new(AtomicU64::new(1 + SECTORS));
    let mut rng = Rng::new(7);
    let (logs, crash_t) = load_round(&srv.addr, &mut rng, &next_id, 200, || {});
    // Lose every cached sector: nothing reached "stable storage".
    let mut st = liar.0.state.lock().unwrap();
    st.dead = true;
    let lost = st.durable.clone();
    drop(st);
    srv.stop();
    let mut model = Model::new(baseline);
    absorb(&mut model, logs);
    let mem = Arc::new(MemoryBackend::new(SECTORS * SECTOR).unwrap());
    mem.write_at(&lost, 0, false).unwrap();
    let check = InProc::start(mem, engine_variants()[0], tmp.path().join("v.sock"));
    let plain = read_all(&check.addr);
    check.stop();
    let err = model
        .verify(&plain, crash_t)
        .expect_err("a disk that ignores FLUSH and FUA must be caught");
    assert!(err.contains("acknowledged data lost"), "{err}");
}

// ---------------------------------------------------------------------------------------
// Authenticated volumes: dm-crypt's AEAD modes over dm-integrity's journal (LUKS2
// `--integrity`). The same load and the same model over the volume's first 2 MiB, plus
// one more check after every crash: the whole volume reads without a single tag mismatch
// (a block whose data and tag disagree would fail with EILSEQ/EIO, never return data).

/// Reads the whole export in 4 KiB requests; returns its first `SECTORS` sectors and
/// the byte offsets of every request that failed (a tag mismatch is an I/O error).
fn read_checked(addr: &Address) -> (Vec<u8>, Vec<u64>) {
    let mut c = Connection::connect(addr, "").unwrap();
    let size = c.facts().size_bytes;
    assert!(
        size >= SECTORS * SECTOR,
        "the volume holds the test's 2 MiB"
    );
    let mut all = vec![0u8; size as usize];
    let mut failed = Vec::new();
    for (i, chunk) in all.chunks_mut(SECTOR as usize).enumerate() {
        let offset = i as u64 * SECTOR;
        let errno = c
            .call(
                Request {
                    flags: 0,
                    kind: NBD_CMD_READ,
                    cookie: 0,
                    offset,
                    length: chunk.len() as u32,
                },
                &[],
                chunk,
            )
            .unwrap();
        if errno != 0 {
            failed.push(offset);
        }
    }
    all.truncate((SECTORS * SECTOR) as usize);
    (all, failed)
}

/// `ucrypt luksFormat --integrity` options of the volumes the kill rounds use.
const AEAD_FORMATS: &[(&str, &[&str])] = &[
    (
        "hmac-sha256",
        &["--integrity", "hmac-sha256", "--sector-size", "4096"],
    ),
    (
        "aes-gcm-random",
        &[
            "--cipher",
            "aes-gcm-random",
            "--integrity",
            "aead",
            "--sector-size",
            "4096",
        ],
    ),
];

/// A LUKS2 `--integrity` volume made by `ucrypt luksFormat` (journal mode, wiped), and its
/// two-line table (`luksOpen --print-table --showkeys`).
fn aead_volume(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    let img = dir.join(format!("{name}.img"));
    std::fs::File::create(&img)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    let pass = dir.join("pass");
    std::fs::write(&pass, b"crash-rounds").unwrap();
    let opts = [&common::SMALL_LUKS2[..], args].concat();
    let a = common::luks2_format_args(pass.to_str().unwrap(), &opts, img.to_str().unwrap());
    common::ok(common::ucrypt(&a, b""));
    let tables = common::ok(common::ucrypt(
        &[
            "luksOpen",
            img.to_str().unwrap(),
            name,
            "--print-table",
            "--showkeys",
            "--key-file",
            pass.to_str().unwrap(),
        ],
        b"",
    ));
    let table = dir.join(format!("{name}.table"));
    std::fs::write(&table, tables).unwrap();
    table
}

#[test]
fn aead_sigkill_rounds_lose_no_flushed_write_and_leave_no_tag_mismatch() {
    let seed = seed();
    let mut rng = Rng::new(seed);
    let tmp = tempfile::tempdir().unwrap();
    let per = self::rounds(60) / AEAD_FORMATS.len() as u64;
    for (name, args) in AEAD_FORMATS {
        let table = aead_volume(tmp.path(), name, args);
        let mut server = start(&table, tmp.path().join(format!("{name}-0.sock")), &[]);
        let mut rounds = Rounds::new(prefill(&server.addr));
        let mut blocks_read = 0;
        for round in 0..per {
            let child = &mut server.child;
            let crash_t = rounds.load(&server.addr, &mut rng, || {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
            });
            server = start(
                &table,
                tmp.path().join(format!("{name}-{}.sock", round + 1)),
                &[],
            );
            let (image, failed) = read_checked(&server.addr);
            blocks_read += Connection::connect(&server.addr, "")
                .unwrap()
                .facts()
                .size_bytes
                / SECTOR;
            assert!(
                failed.is_empty(),
                "{name} round {round} (seed {seed}): blocks failing authentication after the \
                 kill, at byte offsets {failed:?}"
            );
            rounds.verify(
                &image,
                crash_t,
                format!("{name} round {round} (seed {seed})"),
            );
        }
        server.child.kill().unwrap();
        server.child.wait().unwrap();
        rounds.finish(&format!("aead sigkill {name}"), seed);
        eprintln!("aead sigkill {name}: {blocks_read} blocks read back, 0 tag mismatches");
    }
}

/// An in-process authenticated volume: (crypt spec, key bytes, tag bytes, journal sectors
/// at format; 0 is the kernel's default, one section on this small device).
const AEAD_STACKS: &[(&str, usize, u32, u64)] = &[
    ("capi:authenc(hmac(sha256),xts(aes))-plain64", 96, 32, 0),
    ("capi:gcm(aes)-random", 32, 28, 1024),
];

/// The crypt target over dm-integrity (external tags, journal mode) over `disk`, mapping
/// exactly the test's 2 MiB. Opening replays a journal left behind.
fn aead_stack(disk: Arc<dyn Backend>, stack: usize) -> Arc<ucrypt_integrity::AeadVolume> {
    let (spec, key_len, tag, _) = AEAD_STACKS[stack];
    let key: Vec<u8> = (0..key_len as u8)
        .map(|i| i.wrapping_mul(31).wrapping_add(7))
        .collect();
    let cipher = spec
        .parse::<ucrypt_crypto::CipherSpec>()
        .unwrap()
        .build_aead(
            &ucrypt_crypto::VolumeKey::new(key),
            ucrypt_crypto::SectorParams {
                sector_size: ucrypt_crypto::SectorSize::new(SECTOR as u32).unwrap(),
                ..Default::default()
            },
            tag,
        )
        .unwrap();
    let dev =
        ucrypt_integrity::IntegrityBackend::open(disk, ucrypt_integrity::Options::external(tag))
            .unwrap();
    Arc::new(
        ucrypt_integrity::AeadVolume::new(cipher, Arc::new(dev), SECTORS * SECTOR / 512).unwrap(),
    )
}

#[test]
fn aead_power_cut_loses_only_unflushed_writes_and_leaves_no_tag_mismatch() {
    let seed = seed();
    let mut rng = Rng::new(seed);
    let tmp = tempfile::tempdir().unwrap();
    let per = self::rounds(100) / AEAD_STACKS.len() as u64;
    for (k, &(spec, _, tag, journal)) in AEAD_STACKS.iter().enumerate() {
        // Formatted without a wipe: the prefill writes every sector of the 2 MiB mapped.
        let mem = Arc::new(MemoryBackend::new(4 << 20).unwrap());
        let params = ucrypt_format::integrity::FormatParams {
            sector_size: SECTOR as u32,
            tag_size: tag,
            journal_sectors: journal,
            fix_padding: true,
            ..Default::default()
        };
        ucrypt_integrity::format(
            mem.clone(),
            &params,
            &ucrypt_integrity::Options::external(tag),
            false,
        )
        .unwrap();
        let srv = InProc::serve(aead_stack(mem.clone(), k), tmp.path().join("p.sock"));
        let mut rounds = Rounds::new(prefill(&srv.addr));
        srv.stop();
        let mut image = vec![0u8; 4 << 20];
        mem.read_at(&mut image, 0).unwrap();
        for round in 0..per {
            // 512-byte atomic units: a cut may keep any subset of the sectors of a journal
            // section, a tag buffer or a data block written since the last flush.
            let disk = Arc::new(Cache::with_unit(image, 512));
            let srv = InProc::serve(
                aead_stack(disk.clone(), k),
                tmp.path().join(format!("a{k}-{round}.sock")),
            );
            let mut cut_rng = Rng::new(rng.next_u64() | 1);
            let mut after = Vec::new();
            let crash_t = rounds.load(&srv.addr, &mut rng, || {
                after = disk.cut(&mut cut_rng);
            });
            srv.stop();
            image = after;
            // What survived, opened afresh on a copy (the journal replayed), read sector by sector.
            let survived = Arc::new(MemoryBackend::new(4 << 20).unwrap());
            survived.write_at(&image, 0, false).unwrap();
            let vol = aead_stack(survived.clone(), k);
            let mut plain = vec![0u8; (SECTORS * SECTOR) as usize];
            let mut failed = Vec::new();
            for (s, chunk) in plain.chunks_mut(SECTOR as usize).enumerate() {
                if vol.read_at(chunk, s as u64 * SECTOR).is_err() {
                    failed.push(s);
                }
            }
            assert!(
                failed.is_empty() && vol.failures() == 0,
                "{spec} round {round} (seed {seed}): sectors failing authentication after the \
                 cut: {failed:?}"
            );
            rounds.verify(
                &plain,
                crash_t,
                format!("{spec} round {round} (seed {seed})"),
            );
            // The next round starts from the image as the cut left it: its open replays
            // the journal onto a disk that may lose power again before a flush.
        }
        rounds.finish(&format!("aead power-cut {spec}"), seed);
    }
}
