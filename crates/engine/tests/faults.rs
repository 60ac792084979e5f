//! Backend failures surface as errors, never as silent success, in every engine
//! configuration (inline, workers, same-CPU, submit-from-crypt-CPUs, sorted, auto, small
//! pool, per-request allocation). Complements `volume.rs`'s
//! `failed_backend_writes_are_errors_not_success` with the remaining dm-flakey-style faults:
//! a device that dies after N writes, a failing cache flush under FUA writes and write-zeroes,
//! a read failure inside a read-modify-write, and random faults under concurrency where
//! every success is checked by reading the data back. `drop_writes` (a disk that lies)
//! shows what a status code cannot catch and a read-back can.

#![allow(clippy::unwrap_used)]

mod common;
use common::*;
use std::sync::Arc;
use ucrypt_backend::{Backend, FaultyBackend};

const MIB: u64 = 1 << 20;

fn faulty_volume(
    opts: ucrypt_engine::EngineOptions,
    sector: u32,
) -> (Arc<FaultyBackend>, ucrypt_engine::Volume) {
    let faulty = Arc::new(FaultyBackend::new(memory(MIB)));
    let v = volume(faulty.clone(), cipher("aes-xts-plain64", sector), 0, opts);
    (faulty, v)
}

#[test]
fn a_device_that_dies_after_n_writes_fails_every_later_write() {
    for (name, opts) in configs() {
        for n in [0u64, 1, 3, 17] {
            let (faulty, v) = faulty_volume(opts, 4096);
            faulty.fail_after_writes(n);
            // Large (split), medium, and sub-sector (RMW) writes.
            let mut failed = 0;
            for (i, (len, off)) in [(300_000usize, 0u64), (4096, 409_600), (100, 500_001)]
                .into_iter()
                .cycle()
                .take(30)
                .enumerate()
            {
                let data = vec![i as u8 + 1; len];
                match v.write_at(&data, off, false) {
                    Ok(()) => {
                        faulty.clear();
                        let mut back = vec![0u8; len];
                        v.read_at(&mut back, off).unwrap();
                        assert!(
                            back == data,
                            "{name}: n={n}: write {i} reported success but its data is not there"
                        );
                        faulty.fail_after_writes(0);
                    }
                    Err(_) => failed += 1,
                }
            }
            assert!(failed > 0, "{name}: n={n}: no write failed");
            assert!(faulty.stats().injected_errors >= failed, "{name}");
        }
    }
}

#[test]
fn a_failing_cache_flush_fails_fua_writes_zeroes_and_flush() {
    for (name, opts) in configs() {
        let (faulty, v) = faulty_volume(opts, 512);
        faulty.fail_flush(true);
        assert!(v.flush().is_err(), "{name}: flush");
        assert!(
            v.write_at(&[3u8; 300_000], 0, true).is_err(),
            "{name}: large FUA write"
        );
        assert!(
            v.write_at(&[3u8; 512], 512, true).is_err(),
            "{name}: FUA write"
        );
        assert!(
            v.write_at(&[3u8; 7], 1030, true).is_err(),
            "{name}: sub-sector FUA write"
        );
        assert!(
            v.write_zeroes(0, 70_000, true).is_err(),
            "{name}: FUA write-zeroes"
        );
        // Without FUA nothing asks for durability: these succeed and are readable.
        v.write_at(&[4u8; 1000], 10_000, false).unwrap();
        faulty.clear();
        let mut b = [0u8; 1000];
        v.read_at(&mut b, 10_000).unwrap();
        assert_eq!(b, [4u8; 1000], "{name}");
        v.flush().unwrap();
    }
}

#[test]
fn write_zeroes_and_discard_failures_are_errors() {
    for (name, opts) in configs() {
        let (faulty, v) = faulty_volume(opts, 4096);
        faulty.fail_writes_in(200_000..200_001);
        assert!(v.write_zeroes(0, 300_000, false).is_err(), "{name}: zeroes");
        assert!(
            v.write_zeroes(199_999, 3, false).is_err(),
            "{name}: RMW zeroes"
        );
        assert!(v.discard(196_608, 8192).is_err(), "{name}: discard");
        assert!(v.write_zeroes(0, 4096, false).is_ok(), "{name}: elsewhere");
    }
}

#[test]
fn a_read_failure_inside_read_modify_write_fails_the_write_and_changes_nothing() {
    for (name, opts) in configs() {
        let (faulty, v) = faulty_volume(opts, 4096);
        v.write_at(&[9u8; 8192], 8192, false).unwrap();
        faulty.fail_reads_in(8192..8193);
        assert!(
            v.write_at(&[1u8; 10], 8200, false).is_err(),
            "{name}: head RMW"
        );
        assert!(
            v.write_at(&[1u8; 200], 4096 + 4000, false).is_err(),
            "{name}: write spanning into a sector whose read fails"
        );
        faulty.clear();
        let mut b = vec![0u8; 8192];
        v.read_at(&mut b, 8192).unwrap();
        assert!(
            b.iter().all(|&x| x == 9),
            "{name}: a failed RMW changed the sector"
        );
    }
}

/// Random faults while 4 threads write: every write that reports success is read back
/// (faults off) and must be there; failures are allowed to leave anything.
#[test]
fn under_random_faults_every_reported_success_is_real() {
    for (name, opts) in configs() {
        let (faulty, v) = faulty_volume(opts, 512);
        let v = Arc::new(v);
        // Each thread owns a quarter of the volume, so its read-back is unambiguous.
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let (v, faulty) = (Arc::clone(&v), Arc::clone(&faulty));
                std::thread::spawn(move || {
                    let mut rng = ucrypt_testkit::Rng::new(0x9e37_79b9_u64 ^ (t << 32) | 1);
                    let mut rnd = move || rng.next_u64();
                    let (mut ok, mut err) = (0, 0);
                    let quarter = MIB / 4;
                    for i in 0..60u64 {
                        let len = 1 + rnd() % 70_000;
                        let off = t * quarter + rnd() % (quarter - len);
                        let data: Vec<u8> = (0..len).map(|j| (i * 31 + j + t) as u8).collect();
                        if rnd() % 3 == 0 {
                            let at = off + rnd() % len;
                            faulty.fail_writes_in(at..at + 1);
                        }
                        match v.write_at(&data, off, rnd() % 4 == 0) {
                            Ok(()) => {
                                ok += 1;
                                let mut back = vec![0u8; len as usize];
                                // Reads may hit a failing read range of no one: none set.
                                v.read_at(&mut back, off).unwrap();
                                assert!(back == data, "thread {t}: write {i} reported success but reads back differently");
                            }
                            Err(_) => err += 1,
                        }
                    }
                    (ok, err)
                })
            })
            .collect();
        let (mut ok, mut err) = (0, 0);
        for t in threads {
            let (o, e) = t.join().unwrap();
            ok += o;
            err += e;
        }
        eprintln!("{name}: {ok} writes succeeded and were verified, {err} failed");
        assert!(err > 0 && ok > 0, "{name}: the mix should have both");
    }
}

/// dm-flakey's `drop_writes`: the one fault no status code can reveal. The engine passes the
/// lie up (it cannot know); a read-back, as the crash test does, catches it.
#[test]
fn dropped_writes_are_invisible_to_status_codes_but_not_to_read_back() {
    for (name, opts) in configs() {
        let (faulty, v) = faulty_volume(opts, 4096);
        v.write_at(&[1u8; 8192], 0, false).unwrap();
        faulty.drop_writes(true);
        v.write_at(&[2u8; 8192], 0, true).unwrap();
        v.write_at(&[2u8; 10], 9000, true).unwrap();
        v.flush().unwrap();
        faulty.clear();
        assert!(faulty.stats().dropped_writes >= 2, "{name}");
        let mut b = vec![0u8; 8192];
        v.read_at(&mut b, 0).unwrap();
        assert!(
            b.iter().all(|&x| x == 1),
            "{name}: the dropped write is gone"
        );
    }
}
