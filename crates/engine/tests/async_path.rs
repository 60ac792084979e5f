//! The Volume's asynchronous request path ([`Backend::submit_async`]) over a backend that
//! completes requests on threads of its own, out of order ([`AsyncThreads`], standing in for
//! librbd): the same ciphertext and plaintext as the synchronous path, the range-lock rules
//! (a read never overlaps a write in progress; writes to one sector serialise), errors
//! reported through the completion with the range released, and what it hands back.

#![allow(clippy::unwrap_used)]

mod common;
use common::*;
use std::sync::mpsc::channel;
use std::sync::Arc;
use ucrypt_backend::testing::{async_conformance, conformance, AsyncThreads};
use ucrypt_backend::{AsyncIo, AsyncOp, Backend, BackendError, IoCtx};
use ucrypt_crypto::Sector512;

fn async_volume(
    threads: usize,
    sector: u32,
) -> (Arc<AsyncThreads>, Arc<dyn Backend>, Arc<dyn Backend>) {
    let mem = memory(2 << 20);
    let lower = Arc::new(AsyncThreads::new(Arc::clone(&mem), threads));
    let opts = configs()[0].1;
    let v: Arc<dyn Backend> = Arc::new(volume(
        Arc::clone(&lower) as Arc<dyn Backend>,
        cipher("aes-xts-plain64", sector),
        4096,
        opts,
    ));
    (lower, mem, v)
}

/// Submits and waits; `None` when handed back.
fn run(
    v: &Arc<dyn Backend>,
    op: AsyncOp,
    offset: u64,
    buf: Vec<u8>,
) -> Option<(Vec<u8>, Result<(), BackendError>)> {
    let (tx, rx) = channel();
    let io = AsyncIo {
        op,
        offset,
        len: buf.len(),
        buf,
        ctx: IoCtx::default(),
        done: Box::new(move |b, r| tx.send((b, r)).unwrap()),
    };
    match Arc::clone(v).submit_async(io) {
        Ok(()) => Some(rx.recv().unwrap()),
        Err(_) => None,
    }
}

#[test]
fn the_asynchronous_path_passes_both_conformance_suites() {
    for sector in [512, 4096] {
        let (lower, _mem, v) = async_volume(4, sector);
        assert!(v.hints().async_submit);
        conformance(&*v);
        async_conformance(&v, 4);
        assert!(
            lower.accepted.load(std::sync::atomic::Ordering::SeqCst) > 0,
            "nothing went the asynchronous way"
        );
    }
}

#[test]
fn asynchronous_writes_leave_the_sector_ciphers_bytes() {
    let (_lower, mem, v) = async_volume(2, 4096);
    let c = cipher("aes-xts-plain64", 4096);
    let data: Vec<u8> = (0..65536u32).map(|i| (i * 7 + 3) as u8).collect();
    let (_, r) = run(&v, AsyncOp::Write, 8192, data.clone()).expect("handed back");
    r.unwrap();
    let mut want = data.clone();
    c.encrypt(Sector512::from_bytes_floor(8192), &mut want);
    let mut ct = vec![0u8; data.len()];
    mem.read_at(&mut ct, 4096 + 8192).unwrap();
    assert!(ct == want, "ciphertext differs from the sector cipher's");
    let (back, r) = run(&v, AsyncOp::Read, 8192, vec![0; data.len()]).expect("handed back");
    r.unwrap();
    assert!(back == data);
}

#[test]
fn partial_sectors_and_out_of_range_are_handed_back_untouched() {
    let (_lower, _mem, v) = async_volume(2, 4096);
    let size = v.info().size_bytes;
    for (op, offset, len) in [
        (AsyncOp::Write, 512, 4096),   // not on a sector boundary
        (AsyncOp::Write, 0, 1000),     // not whole sectors
        (AsyncOp::Read, 4096, 512),    // part of a sector
        (AsyncOp::Read, size, 4096),   // past the end
        (AsyncOp::Write, 0, 0),        // empty
        (AsyncOp::Read, 0, 128 << 10), // large: its crypto is spread by the sync path
    ] {
        let buf = vec![0x5a; len.max(1)];
        let (tx, _rx) = channel::<()>();
        let io = AsyncIo {
            op,
            offset,
            len,
            buf: buf.clone(),
            ctx: IoCtx::default(),
            done: Box::new(move |_, _| tx.send(()).unwrap()),
        };
        let back = Arc::clone(&v).submit_async(io).expect_err("accepted");
        assert!(back.buf == buf, "{op:?} {offset}+{len}: buffer changed");
    }
}

/// A write to a sector another write holds is handed back with its buffer untouched
/// (plaintext, for the synchronous path), instead of stalling the submitting thread until
/// the first completes; once the first completes the same write is taken.
#[test]
fn a_write_meeting_a_write_in_progress_is_handed_back_untouched() {
    let (_lower, _mem, v) = async_volume(2, 4096);
    let mut handed_back = 0;
    for _ in 0..200 {
        let (tx, rx) = channel();
        let first = AsyncIo {
            op: AsyncOp::Write,
            offset: 0,
            len: 4096,
            buf: vec![1; 4096],
            ctx: IoCtx::default(),
            done: Box::new(move |_, r| tx.send(r).unwrap()),
        };
        Arc::clone(&v)
            .submit_async(first)
            .expect("first write handed back");
        let (tx2, rx2) = channel();
        let second = AsyncIo {
            op: AsyncOp::Write,
            offset: 0,
            len: 4096,
            buf: vec![2; 4096],
            ctx: IoCtx::default(),
            done: Box::new(move |_, r| tx2.send(r).unwrap()),
        };
        match Arc::clone(&v).submit_async(second) {
            Err(back) => {
                assert!(back.buf == vec![2; 4096], "handed back encrypted");
                handed_back += 1;
                rx.recv().unwrap().unwrap();
            }
            // The first had completed already (its delay is random).
            Ok(()) => {
                rx.recv().unwrap().unwrap();
                rx2.recv().unwrap().unwrap();
            }
        }
    }
    assert!(handed_back > 0, "no write ever met the one in progress");
    let mut b = [0u8; 4096];
    v.read_at(&mut b, 0).unwrap();
    assert!(b == [1; 4096] || b == [2; 4096]);
}

#[test]
fn a_backend_error_reaches_the_completion_and_releases_the_range() {
    let (lower, _mem, v) = async_volume(2, 4096);
    v.write_at(&[1; 4096], 0, false).unwrap();
    lower.fail(true);
    let (_, r) = run(&v, AsyncOp::Write, 0, vec![2; 4096]).expect("handed back");
    assert_eq!(r.unwrap_err().errno(), 5);
    let (_, r) = run(&v, AsyncOp::Read, 0, vec![0; 4096]).expect("handed back");
    assert_eq!(r.unwrap_err().errno(), 5);
    lower.fail(false);
    // The failed write's range and the failed read's announcement were released: this
    // write would wait for ever otherwise.
    v.write_at(&[3; 4096], 0, false).unwrap();
    let mut b = [0u8; 4096];
    v.read_at(&mut b, 0).unwrap();
    assert_eq!(b, [3; 4096]);
}

/// Writers of whole 4 KiB sectors, each sector all one byte, race asynchronous readers of
/// the same sectors: every read sees one write's sector whole (the range lock), and the
/// writes to one sector never interleave.
#[test]
fn asynchronous_reads_never_see_a_sector_mid_write() {
    let (_lower, _mem, v) = async_volume(4, 4096);
    for i in 0..4u64 {
        v.write_at(&[0; 4096], i * 4096, false).unwrap();
    }
    std::thread::scope(|s| {
        for t in 0..3u8 {
            let v = &v;
            s.spawn(move || {
                for n in 0..200u64 {
                    let byte = t * 80 + (n % 80) as u8 + 1;
                    let at = (n % 4) * 4096;
                    // A write that meets a write or read in progress is handed back:
                    // written the synchronous way (it waits for the lock), as the NBD
                    // server does.
                    match run(v, AsyncOp::Write, at, vec![byte; 4096]) {
                        Some((_, r)) => r.unwrap(),
                        None => v.write_at(&[byte; 4096], at, false).unwrap(),
                    }
                }
            });
        }
        for _ in 0..2 {
            let v = &v;
            s.spawn(move || {
                for n in 0..400u64 {
                    let at = (n % 4) * 4096;
                    // A read that meets a write in progress is handed back: read it the
                    // synchronous way (it waits under the lock), as the NBD server does.
                    let b = match run(v, AsyncOp::Read, at, vec![0; 4096]) {
                        Some((b, r)) => {
                            r.unwrap();
                            b
                        }
                        None => {
                            let mut b = vec![0; 4096];
                            v.read_at(&mut b, at).unwrap();
                            b
                        }
                    };
                    assert!(b.iter().all(|&x| x == b[0]), "torn sector at {at}");
                }
            });
        }
    });
}
