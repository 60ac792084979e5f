//! The Volume in every engine configuration: the backend conformance suite, ciphertext
//! identical to the (kernel-proven) sector cipher's, no lost updates under concurrent
//! read-modify-write, and backend failures surfacing as errors.

#![allow(clippy::unwrap_used)]

mod common;
use common::*;
use std::sync::Arc;
use ucrypt_backend::testing::{conformance, conformance_concurrent};
use ucrypt_backend::{Backend, FaultyBackend};
use ucrypt_crypto::Sector512;

#[test]
fn every_configuration_passes_the_backend_conformance_suite() {
    for (name, opts, mem) in configs_over_memory(2 << 20) {
        let v = volume(mem, cipher("aes-xts-plain64", 512), 0, opts);
        eprintln!("conformance: {name}");
        conformance(&v);
        conformance_concurrent(&v, 4);
    }
}

#[test]
fn every_configuration_writes_the_sector_ciphers_bytes() {
    let c = cipher("aes-xts-plain64", 4096);
    let data: Vec<u8> = (0..(1u32 << 20))
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let mut expected = data.clone();
    c.encrypt(Sector512(0), &mut expected);
    for (name, opts) in configs() {
        let mem = memory(1 << 20 | 8192);
        let v = volume(Arc::clone(&mem), Arc::clone(&c), 8192, opts);
        // Large, medium and unaligned writes, so splitting, batching and RMW all run.
        v.write_at(&data[..600_000], 0, false).unwrap();
        v.write_at(&data[600_000..600_001], 600_000, true).unwrap();
        v.write_at(&data[600_001..], 600_001, false).unwrap();
        let mut ct = vec![0u8; 1 << 20];
        mem.read_at(&mut ct, 8192).unwrap();
        assert!(
            ct == expected,
            "{name}: ciphertext differs from the sector cipher's"
        );
        let mut back = vec![0u8; 1 << 20];
        v.read_at(&mut back, 0).unwrap();
        assert!(back == data, "{name}: read back differs");
        let mut head = [0u8; 8192];
        mem.read_at(&mut head, 0).unwrap();
        assert!(
            head.iter().all(|&b| b == 0),
            "{name}: wrote before the data offset"
        );
    }
}

/// `IoKind::WriteOwned` (the NBD server's and ublk's write call) in every configuration:
/// whole-sector requests of 4 KiB, 64 KiB and 1 MiB (inline and split ones encrypted in
/// the caller's buffer, the kernel placement's through the copying path) and unaligned ones
/// leave the sector cipher's ciphertext on the backend and read back as written; an
/// unaligned request's buffer is left as it was, and the automatic policy's split 1 MiB
/// request was encrypted where it lay.
#[test]
fn in_place_writes_leave_the_sector_ciphers_bytes() {
    use ucrypt_backend::{Io, IoCtx};
    let c = cipher("aes-xts-plain64", 4096);
    let data: Vec<u8> = (0..(1u32 << 20))
        .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
        .collect();
    let mut expected = data.clone();
    c.encrypt(Sector512(0), &mut expected);
    for (name, opts) in configs() {
        let mem = memory(1 << 20 | 8192);
        let v = volume(Arc::clone(&mem), Arc::clone(&c), 8192, opts);
        let ctx = IoCtx::default();
        let mut whole = data.clone();
        v.submit(Io::write_owned(&mut whole, 0).ctx(ctx)).unwrap();
        assert!(
            whole == expected || (name != "auto" && whole == data),
            "{name}: the owned buffer holds neither the plaintext nor, encrypted in place, \
             the ciphertext"
        );
        for (at, len) in [(4096usize, 4096usize), (65536, 65536), (200_704, 4096)] {
            let mut b = data[at..at + len].to_vec();
            v.submit(Io::write_owned(&mut b, at as u64).fua(true).ctx(ctx))
                .unwrap();
        }
        let mut odd = data[5000..9001].to_vec();
        v.submit(Io::write_owned(&mut odd, 5000).ctx(ctx)).unwrap();
        assert!(odd == data[5000..9001], "{name}: unaligned buffer changed");
        let mut ct = vec![0u8; 1 << 20];
        mem.read_at(&mut ct, 8192).unwrap();
        assert!(
            ct == expected,
            "{name}: ciphertext differs from the sector cipher's"
        );
        let mut back = vec![0u8; 1 << 20];
        v.read_at(&mut back, 0).unwrap();
        assert!(back == data, "{name}: read back differs");
    }
}

#[test]
fn range_locks_only_where_the_backend_is_not_atomic_per_sector() {
    let spec = cipher("aes-xts-plain64", 4096);
    let bare = volume(
        memory(1 << 20),
        Arc::clone(&spec),
        0,
        ucrypt_engine::EngineOptions::default(),
    );
    assert!(!bare.range_locked(), "memory chunks are atomic: no locks");
    let hidden = Arc::new(FaultyBackend::new(memory(1 << 20)));
    let wrapped = volume(
        hidden,
        Arc::clone(&spec),
        0,
        ucrypt_engine::EngineOptions::default(),
    );
    assert!(wrapped.range_locked(), "a backend without an atomic unit");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.img");
    std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
    let file = ucrypt_backend::FileBackend::open(&path, Default::default()).unwrap();
    let file = volume(
        Arc::new(file),
        spec,
        0,
        ucrypt_engine::EngineOptions::default(),
    );
    assert!(file.range_locked(), "files promise no atomicity to readers");
}

#[test]
fn concurrent_sub_sector_writes_never_lose_an_update() {
    // 8 threads each own every 8th 64-byte slot of the same 4 KiB sectors: every write is a
    // read-modify-write of a sector other threads are modifying too.
    for (name, opts, mem) in configs_over_memory(256 * 1024) {
        let v = Arc::new(volume(mem, cipher("aes-xts-plain64", 4096), 0, opts));
        let threads: Vec<_> = (0..8u8)
            .map(|t| {
                let v = Arc::clone(&v);
                std::thread::spawn(move || {
                    for round in 0..3u8 {
                        for slot in (t as u64..4096).step_by(8) {
                            v.write_at(&[t ^ (round * 16) ^ 0x5a; 64], slot * 64, false)
                                .unwrap();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut all = vec![0u8; 256 * 1024];
        v.read_at(&mut all, 0).unwrap();
        for (slot, bytes) in all.chunks(64).enumerate() {
            let t = (slot % 8) as u8;
            assert!(
                bytes.iter().all(|&b| b == t ^ 32 ^ 0x5a),
                "{name}: slot {slot} lost an update"
            );
        }
    }
}

#[test]
fn failed_backend_writes_are_errors_not_success() {
    for (name, opts) in configs() {
        let faulty = Arc::new(FaultyBackend::new(memory(1 << 20)));
        let v = volume(faulty.clone(), cipher("aes-xts-plain64", 512), 0, opts);
        faulty.fail_writes_in(65536..65537);
        assert!(
            v.write_at(&[1u8; 300_000], 0, false).is_err(),
            "{name}: big write"
        );
        assert!(
            v.write_at(&[1u8; 100], 65530, false).is_err(),
            "{name}: RMW write"
        );
        assert!(
            v.write_at(&[1u8; 4096], 0, false).is_ok(),
            "{name}: untouched range"
        );
        faulty.fail_flush(true);
        assert!(v.flush().is_err(), "{name}: flush");
        faulty.clear();
        faulty.fail_reads_in(0..1);
        let mut b = [0u8; 512];
        assert!(v.read_at(&mut b, 0).is_err(), "{name}: read");
    }
}

#[test]
fn write_zeroes_encrypts_zeros_and_discard_needs_allow_discards() {
    let mem = memory(1 << 20);
    let v = volume(
        Arc::clone(&mem),
        cipher("aes-xts-plain64", 512),
        0,
        configs()[0].1,
    );
    v.write_at(&[7u8; 8192], 0, false).unwrap();
    v.write_zeroes(100, 5000, true).unwrap();
    let mut b = vec![0u8; 8192];
    v.read_at(&mut b, 0).unwrap();
    assert!(b[100..5100].iter().all(|&x| x == 0) && b[..100].iter().all(|&x| x == 7));
    let mut ct = vec![0u8; 512];
    mem.read_at(&mut ct, 512).unwrap();
    assert!(
        ct.iter().any(|&x| x != 0),
        "zeros must be encrypted, not holes"
    );
}

#[test]
fn requests_carry_their_client() {
    use ucrypt_backend::{Io, IoCtx};
    let v = volume(
        memory(1 << 20),
        cipher("aes-xts-plain64", 512),
        0,
        configs()[1].1,
    );
    v.submit(Io::write(&[1u8; 4096], 0).ctx(IoCtx { client: 3 }))
        .unwrap();
    let mut b = [0u8; 512];
    v.submit(Io::read(&mut b, 0).ctx(IoCtx { client: 5 }))
        .unwrap();
    v.submit(Io::read(&mut b, 512).ctx(IoCtx { client: 5 }))
        .unwrap();
    let stats = v.client_stats();
    let c3 = stats.iter().find(|c| c.client == 3).unwrap();
    let c5 = stats.iter().find(|c| c.client == 5).unwrap();
    assert_eq!((c3.writes, c3.write_bytes, c3.reads), (1, 4096, 0));
    assert_eq!((c5.reads, c5.read_bytes, c5.writes), (2, 1024, 0));
}

/// Over a buffered regular file reads are decrypted straight out of its mapping (inline, in
/// split reads and on read-modify-write): every configuration must still read back what
/// it wrote and leave the sector cipher's bytes in the file; and a file truncated under
/// the volume must give an error, not kill the process, then errors from `pread`.
#[test]
fn mapped_file_reads_decrypt_the_same_and_survive_truncation() {
    use ucrypt_backend::{FileBackend, FileOptions};
    // Files are mapped only once the program has installed the SIGBUS handler.
    ucrypt_backend::install_sigbus_handler().unwrap();
    let c = cipher("aes-xts-plain64", 4096);
    let data: Vec<u8> = (0..(1u32 << 20))
        .map(|i| (i.wrapping_mul(2246822519) >> 11) as u8)
        .collect();
    let mut expected = data.clone();
    c.encrypt(Sector512(0), &mut expected);
    let dir = tempfile::tempdir().unwrap();
    for (name, opts) in configs() {
        let path = dir.path().join(name);
        std::fs::write(&path, vec![0u8; (1 << 20) + 8192]).unwrap();
        let file = FileBackend::open(&path, FileOptions::default()).unwrap();
        assert!(file.is_mapped(), "a buffered regular file is mapped");
        let v = volume(Arc::new(file), Arc::clone(&c), 8192, opts);
        v.write_at(&data[..700_001], 0, false).unwrap();
        v.write_at(&data[700_001..], 700_001, false).unwrap();
        let on_disk = std::fs::read(&path).unwrap();
        assert!(
            on_disk[8192..] == expected[..],
            "{name}: ciphertext differs"
        );
        for (off, len) in [(0usize, 1usize << 20), (4096, 300_000), (12_345, 1)] {
            let mut back = vec![0u8; len];
            v.read_at(&mut back, off as u64).unwrap();
            assert!(
                back == data[off..off + len],
                "{name}: read at {off} differs"
            );
        }
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(8192 + 65536)
            .unwrap();
        let mut back = vec![0u8; 65536];
        assert!(
            v.read_at(&mut back, 512 * 1024).is_err(),
            "{name}: a read past the truncated end must fail"
        );
        assert!(
            v.read_at(&mut back, 512 * 1024).is_err(),
            "{name}: and again"
        );
        v.read_at(&mut back, 0).unwrap();
        assert!(
            back == data[..65536],
            "{name}: data before the cut still reads"
        );
    }
}

/// `recrypt_in_place` (reencryption's crypto) in every configuration: the buffer ends as
/// the new cipher's ciphertext of what the old cipher's decrypts to, across sector sizes
/// (512-byte old sectors, 4096-byte new), and the hook sees every old byte exactly once.
#[test]
fn recrypt_in_place_gives_the_new_ciphers_bytes_and_shows_the_old_ones() {
    use std::sync::Mutex;
    let old = cipher("aes-xts-plain64", 512);
    let new = cipher("aes-cbc-essiv:sha256", 4096);
    let plain: Vec<u8> = (0..(1u32 << 20) + 8192)
        .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
        .collect();
    let pos = 3 << 20;
    let mut old_ct = plain.clone();
    old.encrypt(Sector512::from_bytes_floor(pos), &mut old_ct);
    let mut expected = plain.clone();
    new.encrypt(Sector512::from_bytes_floor(pos), &mut expected);
    for (name, opts) in configs() {
        let v = volume(memory(8 << 20), Arc::clone(&old), 0, opts);
        let mut buf = old_ct.clone();
        let seen = Mutex::new(vec![0u8; buf.len()]);
        let hook = |at: usize, b: &[u8]| {
            let mut s = seen.lock().unwrap();
            assert!(
                s[at..at + b.len()].iter().all(|&x| x == 0),
                "{name}: seen twice"
            );
            s[at..at + b.len()].copy_from_slice(b);
        };
        v.recrypt_in_place(&*new, pos, &mut buf, Some(&hook))
            .unwrap();
        assert!(buf == expected, "{name}: not the new cipher's bytes");
        assert!(
            *seen.lock().unwrap() == old_ct,
            "{name}: the hook missed old bytes"
        );
        let mut again = old_ct.clone();
        v.recrypt_in_place(&*new, pos, &mut again, None).unwrap();
        assert!(again == expected, "{name}: without a hook");
        assert!(v.recrypt_in_place(&*new, 512, &mut again, None).is_err());
    }
}

/// `recrypt_range` (reencryption's data pass) in every configuration, with workers at a
/// lower priority and without, the calling thread helping and not: the old ciphertext read
/// from the backend ends as the new cipher's ciphertext, in the buffer (old ciphertext
/// kept or not) or written back to the backend at another offset; the hook sees every old
/// byte once; a length of partial sectors is refused.
#[test]
fn recrypt_range_reads_re_encrypts_and_keeps_or_writes_back() {
    use std::sync::Mutex;
    use ucrypt_engine::{RecryptOut, RecryptRange};
    let old = cipher("aes-xts-plain64", 512);
    let new = cipher("aes-cbc-essiv:sha256", 4096);
    let len = (1usize << 20) + 8192;
    let plain: Vec<u8> = (0..len as u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
        .collect();
    let pos = 3 << 20;
    let (read_at, write_at) = (65536u64, 2 << 20);
    let mut old_ct = plain.clone();
    old.encrypt(Sector512::from_bytes_floor(pos), &mut old_ct);
    let mut expected = plain.clone();
    new.encrypt(Sector512::from_bytes_floor(pos), &mut expected);
    let mut variants = configs();
    let mut low = variants[0].1;
    low.worker_nice = 1;
    low.auto = None;
    variants.push(("lower priority", low));
    for (name, opts) in variants {
        for help in [true, false] {
            let mem = memory(4 << 20);
            mem.write_at(&old_ct, read_at, false).unwrap();
            let v = volume(Arc::clone(&mem), Arc::clone(&old), 0, opts);
            let seen = Mutex::new(vec![0u8; len]);
            let hook = |at: usize, b: &[u8]| {
                let mut s = seen.lock().unwrap();
                assert!(
                    s[at..at + b.len()].iter().all(|&x| x == 0),
                    "{name}: seen twice"
                );
                s[at..at + b.len()].copy_from_slice(b);
            };
            let mut out = vec![0u8; len];
            let mut keep = vec![0u8; len];
            v.recrypt_range(RecryptRange {
                inspect: Some(&hook),
                ..ranged(
                    &*new,
                    pos,
                    read_at,
                    help,
                    RecryptOut::Buffer {
                        out: &mut out,
                        keep: Some(&mut keep),
                    },
                )
            })
            .unwrap();
            assert!(out == expected, "{name}: not the new cipher's bytes");
            assert!(keep == old_ct, "{name}: the old ciphertext not kept");
            assert!(
                *seen.lock().unwrap() == old_ct,
                "{name}: the hook missed old bytes"
            );
            let mut out = vec![0u8; len];
            v.recrypt_range(ranged(
                &*new,
                pos,
                read_at,
                help,
                RecryptOut::Buffer {
                    out: &mut out,
                    keep: None,
                },
            ))
            .unwrap();
            assert!(out == expected, "{name}: in place");
            v.recrypt_range(ranged(
                &*new,
                pos,
                read_at,
                help,
                RecryptOut::Write(write_at),
            ))
            .unwrap();
            let mut back = vec![0u8; len];
            mem.read_at(&mut back, write_at).unwrap();
            assert!(back == expected, "{name}: written back");
            let mut short = vec![0u8; 512];
            assert!(v
                .recrypt_range(ranged(
                    &*new,
                    pos,
                    read_at,
                    help,
                    RecryptOut::Buffer {
                        out: &mut short,
                        keep: None,
                    }
                ))
                .is_err());
        }
    }
}

/// A [`ucrypt_engine::RecryptRange`] over all of `out`'s bytes, without a hook.
fn ranged<'a>(
    new: &'a (dyn ucrypt_crypto::SectorCipher + 'static),
    pos: u64,
    read_at: u64,
    help: bool,
    out: ucrypt_engine::RecryptOut<'a>,
) -> ucrypt_engine::RecryptRange<'a> {
    let len = match &out {
        ucrypt_engine::RecryptOut::Buffer { out, .. } => out.len(),
        ucrypt_engine::RecryptOut::Write(_) => (1 << 20) + 8192,
    };
    ucrypt_engine::RecryptRange {
        new,
        pos,
        len,
        read_at,
        out,
        inspect: None,
        help,
    }
}
