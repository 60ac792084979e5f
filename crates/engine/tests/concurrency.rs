//! Randomized, model-checked concurrency stress of the read-modify-write path, in every
//! engine configuration and at 512- and 4096-byte sectors.
//!
//! 1. **Disjoint owners, shared sectors.** The volume is cut into random slots of 1..300
//!    bytes, each owned by one of 6 threads; every thread writes (plain, FUA,
//!    write-zeroes) random runs of its own adjacent slots, flushes now and then, and reads
//!    its own bytes back after each write. Neighbouring slots share sectors, so nearly
//!    every write is a read-modify-write of a sector other threads are modifying. The
//!    final image must equal the merged per-thread models exactly (no lost update).
//! 2. **Overlapping writers.** Threads write overlapping 4-byte-aligned ranges, each word
//!    tagged with the write's id. Afterwards every word must come from the *last* write of
//!    some thread covering it (a thread's own later write always wins over its earlier
//!    one), and within one encryption sector the winners must be consistent with a serial
//!    order (no A-over-B at one byte and B-over-A at another where both cover both).

#![allow(clippy::unwrap_used)]

mod common;
use common::*;
use std::collections::HashMap;
use std::sync::Arc;
use ucrypt_backend::Backend;

use ucrypt_testkit::Rng;

fn seed() -> u64 {
    ucrypt_testkit::seed("UCRYPT_STRESS_SEED")
}

const SIZE: u64 = 64 * 1024;
const THREADS: usize = 6;

#[test]
fn disjoint_owners_sharing_sectors_never_lose_an_update() {
    let seed = seed();
    let mut rng = Rng::new(seed);
    let mut total_writes = 0u64;
    for sector in [512u32, 4096] {
        for (name, opts, mem) in configs_over_memory(SIZE) {
            // Random slots, random owners.
            let mut slots: Vec<(u64, u64, usize)> = Vec::new(); // (start, len, owner)
            let mut at = 0;
            while at < SIZE {
                let len = (1 + rng.below(300)).min(SIZE - at);
                slots.push((at, len, rng.below(THREADS as u64) as usize));
                at += len;
            }
            let slots = Arc::new(slots);
            let v = Arc::new(volume(mem, cipher("aes-xts-plain64", sector), 0, opts));
            v.write_at(&vec![0u8; SIZE as usize], 0, false).unwrap();
            let threads: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (v, slots) = (Arc::clone(&v), Arc::clone(&slots));
                    let mut r = Rng::new(rng.next_u64() | 1);
                    std::thread::spawn(move || {
                        let mine: Vec<usize> =
                            (0..slots.len()).filter(|&i| slots[i].2 == t).collect();
                        let mut model: HashMap<u64, u8> = HashMap::new();
                        let mut writes = 0u64;
                        if mine.is_empty() {
                            return (model, writes);
                        }
                        for i in 0..400u64 {
                            // A run of this thread's slots that are adjacent in the volume.
                            let k = mine[r.below(mine.len() as u64) as usize];
                            let mut end = k + 1;
                            while end < slots.len() && slots[end].2 == t && r.below(2) == 0 {
                                end += 1;
                            }
                            let off = slots[k].0;
                            let len = slots[end - 1].0 + slots[end - 1].1 - off;
                            let val = (1 + (i * 7 + t as u64 * 40) % 250) as u8;
                            let op = r.below(10);
                            let data = if op == 0 {
                                vec![0u8; len as usize]
                            } else {
                                (0..len).map(|j| val ^ (j as u8 & 0x0f)).collect()
                            };
                            if op == 0 {
                                v.write_zeroes(off, len, r.below(2) == 0).unwrap();
                            } else {
                                v.write_at(&data, off, op == 1).unwrap();
                            }
                            writes += 1;
                            for (j, &b) in data.iter().enumerate() {
                                model.insert(off + j as u64, b);
                            }
                            let mut back = vec![0u8; len as usize];
                            v.read_at(&mut back, off).unwrap();
                            assert!(
                                back == data,
                                "thread {t} does not read its own write {i} back"
                            );
                            if r.below(20) == 0 {
                                v.flush().unwrap();
                            }
                        }
                        (model, writes)
                    })
                })
                .collect();
            let mut expected = vec![0u8; SIZE as usize];
            for t in threads {
                let (model, writes) = t.join().unwrap();
                total_writes += writes;
                for (pos, b) in model {
                    expected[pos as usize] = b;
                }
            }
            let mut image = vec![0u8; SIZE as usize];
            v.read_at(&mut image, 0).unwrap();
            if image != expected {
                let bad = image
                    .iter()
                    .zip(&expected)
                    .position(|(a, b)| a != b)
                    .unwrap();
                let owner = slots
                    .iter()
                    .find(|s| s.0 <= bad as u64 && (bad as u64) < s.0 + s.1)
                    .unwrap()
                    .2;
                panic!(
                    "{name}, {sector}-byte sectors (seed {seed}): byte {bad} (owner thread {owner}) \
                     is {} but its owner last wrote {}: a lost update",
                    image[bad], expected[bad]
                );
            }
        }
    }
    eprintln!("disjoint owners: seed {seed}: {total_writes} writes over 2 sector sizes x {} configurations, final images equal the model", configs().len());
}

#[test]
fn overlapping_writers_leave_a_serial_order_per_sector() {
    let seed = seed();
    let mut rng = Rng::new(seed ^ 0x5555);
    let mut total_writes = 0u64;
    for sector in [512u64, 4096] {
        for (name, opts, mem) in configs_over_memory(16 * 1024) {
            let size = 16 * 1024u64;
            let v = Arc::new(volume(
                mem,
                cipher("aes-xts-plain64", sector as u32),
                0,
                opts,
            ));
            v.write_at(&vec![0u8; size as usize], 0, false).unwrap();
            // Each write: (id, thread, offset, len); ids are unique, nonzero u32 words.
            let threads: Vec<_> = (0..4u64)
                .map(|t| {
                    let v = Arc::clone(&v);
                    let mut r = Rng::new(rng.next_u64() | 1);
                    std::thread::spawn(move || {
                        let mut log = Vec::new();
                        for i in 0..500u64 {
                            let long = r.below(4) == 0;
                            let words = 1 + r.below(if long { 1200 } else { 40 });
                            let first = r.below(size / 4 - words + 1);
                            let id = ((t + 1) << 24 | (i + 1)) as u32;
                            let data: Vec<u8> = (0..words).flat_map(|_| id.to_le_bytes()).collect();
                            v.write_at(&data, first * 4, r.below(8) == 0).unwrap();
                            log.push((id, first * 4, words * 4));
                        }
                        log
                    })
                })
                .collect();
            let logs: Vec<Vec<(u32, u64, u64)>> =
                threads.into_iter().map(|t| t.join().unwrap()).collect();
            total_writes += logs.iter().map(|l| l.len() as u64).sum::<u64>();
            let mut image = vec![0u8; size as usize];
            v.read_at(&mut image, 0).unwrap();
            let covers = |w: &(u32, u64, u64), pos: u64| w.1 <= pos && pos < w.1 + w.2;
            let by_id: HashMap<u32, (u32, u64, u64)> =
                logs.iter().flatten().map(|w| (w.0, *w)).collect();
            let mut winners = vec![0u32; (size / 4) as usize];
            for word in 0..size / 4 {
                let pos = word * 4;
                let got =
                    u32::from_le_bytes(image[pos as usize..pos as usize + 4].try_into().unwrap());
                // The last write of each thread covering this word.
                let allowed: Vec<u32> = logs
                    .iter()
                    .filter_map(|l| l.iter().rev().find(|w| covers(w, pos)).map(|w| w.0))
                    .collect();
                let ok = if allowed.is_empty() {
                    got == 0
                } else {
                    allowed.contains(&got)
                };
                assert!(
                    ok,
                    "{name}, {sector}-byte sectors (seed {seed}): word at {pos} holds {got:#x}, \
                     not the last write of any thread covering it ({allowed:x?})"
                );
                winners[word as usize] = got;
            }
            // Per sector: winners consistent with one serial order.
            for s in 0..size / sector {
                let words = (s * sector / 4)..((s + 1) * sector / 4);
                let mut after: HashMap<(u32, u32), u64> = HashMap::new(); // (winner, loser) -> word
                for word in words {
                    let w = winners[word as usize];
                    if w == 0 {
                        continue;
                    }
                    for l in logs.iter().flatten() {
                        if l.0 != w && covers(l, word * 4) && covers(&by_id[&w], word * 4) {
                            after.entry((w, l.0)).or_insert(word * 4);
                        }
                    }
                }
                for (&(a, b), &pos) in &after {
                    if let Some(&pos2) = after.get(&(b, a)) {
                        panic!(
                            "{name}, {sector}-byte sectors (seed {seed}): sector {s}: write {a:#x} \
                             won over {b:#x} at byte {pos} but lost to it at byte {pos2}: the \
                             sector is a mix of two writes"
                        );
                    }
                }
            }
        }
    }
    eprintln!("overlapping writers: seed {seed}: {total_writes} writes, every word from a thread's last write, every sector serial");
}

/// Issue 18: a read racing writes of the same sectors must return every sector as exactly
/// one write left it, never a mix of two (with CBC a mix decrypts to blocks nobody wrote;
/// with XTS to a garbled 16-byte block). Two writers fill a few hot sectors, each write
/// with one tag repeated over whole sectors; two readers read the hot sectors over and
/// over and check each sector holds one tag throughout. Over a buffered regular file, both
/// through its mapping (reads decrypt straight out of the page cache) and through `pread`.
#[test]
fn reads_never_return_a_mix_of_two_writes() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use ucrypt_backend::{FileBackend, FileOptions};
    ucrypt_backend::install_sigbus_handler().unwrap();
    const HOT: u64 = 4;
    let dir = tempfile::tempdir().unwrap();
    let (mut reads, mut writes) = (0u64, 0u64);
    for spec in ["aes-cbc-essiv:sha256", "aes-xts-plain64"] {
        for sector in [512u32, 4096] {
            for mapped in [true, false] {
                for (name, opts) in [
                    ("auto", ucrypt_engine::EngineOptions::default()),
                    ("kernel", ucrypt_engine::EngineOptions::kernel_default()),
                ] {
                    let what = format!("{spec} {sector} mapped={mapped} {name}");
                    let ss = u64::from(sector);
                    let path = dir.path().join("torn.img");
                    std::fs::write(&path, vec![0u8; (HOT * ss) as usize]).unwrap();
                    let mut file = FileBackend::open(&path, FileOptions::default()).unwrap();
                    file.use_mmap(mapped);
                    // Every read lent, however short: the mapped path is what is tested.
                    file.lend_reads_from(0);
                    assert_eq!(file.is_mapped(), mapped, "{what}");
                    let v = Arc::new(volume(Arc::new(file), cipher(spec, sector), 0, opts));
                    v.write_at(&vec![0u8; (HOT * ss) as usize], 0, false)
                        .unwrap();
                    let stop = Arc::new(AtomicBool::new(false));
                    let torn = Arc::new(AtomicU64::new(0));
                    let writers: Vec<_> = (1..=2u64)
                        .map(|t| {
                            let (v, stop) = (Arc::clone(&v), Arc::clone(&stop));
                            std::thread::spawn(move || {
                                let mut r = Rng::new(t.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
                                let mut n = 0u64;
                                while !stop.load(Ordering::Relaxed) {
                                    n += 1;
                                    let tag = (t << 48) | n;
                                    let first = r.below(HOT);
                                    let count = 1 + r.below(HOT - first);
                                    let buf: Vec<u8> = (0..count * ss / 8)
                                        .flat_map(|_| tag.to_le_bytes())
                                        .collect();
                                    v.write_at(&buf, first * ss, false).unwrap();
                                }
                                n
                            })
                        })
                        .collect();
                    let readers: Vec<_> = (0..2)
                        .map(|_| {
                            let (v, stop, torn) =
                                (Arc::clone(&v), Arc::clone(&stop), Arc::clone(&torn));
                            std::thread::spawn(move || {
                                let mut buf = vec![0u8; (HOT * ss) as usize];
                                let mut n = 0u64;
                                while !stop.load(Ordering::Relaxed) {
                                    v.read_at(&mut buf, 0).unwrap();
                                    n += 1;
                                    for s in buf.chunks(ss as usize) {
                                        let first = u64::from_le_bytes(s[..8].try_into().unwrap());
                                        let uniform = s
                                            .chunks(8)
                                            .all(|w| w == first.to_le_bytes().as_slice());
                                        let known = first == 0 || matches!(first >> 48, 1 | 2);
                                        if !(uniform && known) {
                                            torn.fetch_add(1, Ordering::Relaxed);
                                        }
                                    }
                                }
                                n
                            })
                        })
                        .collect();
                    std::thread::sleep(std::time::Duration::from_millis(120));
                    stop.store(true, Ordering::Relaxed);
                    writes += writers.into_iter().map(|t| t.join().unwrap()).sum::<u64>();
                    reads += readers.into_iter().map(|t| t.join().unwrap()).sum::<u64>();
                    assert_eq!(
                        torn.load(Ordering::Relaxed),
                        0,
                        "{what}: a read returned a sector mixing two writes"
                    );
                }
            }
        }
    }
    eprintln!("{reads} reads of {HOT} hot sectors raced {writes} writes: none torn");
}
