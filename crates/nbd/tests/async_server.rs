//! The server's asynchronous request path: an export that takes asynchronous requests
//! ([`AsyncThreads`] over memory: completions on other threads, out of order, as librbd's)
//! gets its reads and writes submitted by the receiving thread and answered from the
//! completions. Pipelined requests each get exactly one whole reply with their cookie,
//! data lands where it was written, backend errors become EIO and the connection goes on,
//! flush waits behind acknowledged writes, and a client hanging up with requests in
//! flight leaves the server serving.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use ucrypt_backend::testing::AsyncThreads;
use ucrypt_backend::{Backend, MemoryBackend};
use ucrypt_nbd::proto::*;
use ucrypt_nbd::{NbdBackend, RemoteOptions, ServeOptions};

fn start(size: u64) -> (Server, Arc<AsyncThreads>, Arc<MemoryBackend>) {
    let mem = Arc::new(MemoryBackend::new(size).unwrap());
    let a = Arc::new(AsyncThreads::new(mem.clone(), 4));
    let server = Server::start(a.clone(), ServeOptions::default());
    (server, a, mem)
}

fn block(i: u64) -> Vec<u8> {
    (0..4096u64).map(|j| (i * 31 + j * 7 + 1) as u8).collect()
}

/// Reads `n` simple replies (no data): cookie -> error.
fn replies(s: &mut std::os::unix::net::UnixStream, n: usize) -> HashMap<u64, u32> {
    let mut got = HashMap::new();
    for _ in 0..n {
        let (err, cookie) = simple(s);
        assert!(
            got.insert(cookie, err).is_none(),
            "cookie {cookie} answered twice"
        );
    }
    got
}

#[test]
fn pipelined_requests_each_get_one_reply_and_the_data_lands() {
    const N: u64 = 64;
    let (server, a, mem) = start(1 << 20);
    let mut s = server.connect();
    go(&mut s, false);
    // Every write sent before any reply is read: many in flight at once.
    for i in 0..N {
        request(
            &mut s,
            NBD_CMD_WRITE,
            0,
            1000 + i,
            i * 4096,
            4096,
            &block(i),
        );
    }
    let got = replies(&mut s, N as usize);
    for i in 0..N {
        assert_eq!(got.get(&(1000 + i)), Some(&0), "write {i}");
    }
    // Acknowledged writes are in the export.
    for i in 0..N {
        let mut b = vec![0u8; 4096];
        mem.read_at(&mut b, i * 4096).unwrap();
        assert!(b == block(i), "block {i} not written");
    }
    request(&mut s, NBD_CMD_FLUSH, 0, 7, 0, 0, &[]);
    assert_eq!(simple(&mut s), (0, 7));
    // Pipelined reads: replies in completion order, each with its own block.
    for i in 0..N {
        request(
            &mut s,
            NBD_CMD_READ,
            0,
            2000 + i,
            ((i * 5) % N) * 4096,
            4096,
            &[],
        );
    }
    let mut seen = 0;
    for _ in 0..N {
        let (err, cookie) = simple(&mut s);
        assert_eq!(err, 0);
        let i = cookie
            .checked_sub(2000)
            .filter(|&i| i < N)
            .expect("unknown cookie");
        let data = read_n(&mut s, 4096);
        assert!(data == block((i * 5) % N), "read {i} got another block");
        seen += 1;
    }
    assert_eq!(seen, N);
    assert!(
        a.accepted.load(Ordering::SeqCst) >= 2 * N,
        "the requests did not take the asynchronous path"
    );
    // FUA writes and partial ones take the synchronous path and still work.
    request(
        &mut s,
        NBD_CMD_WRITE,
        NBD_CMD_FLAG_FUA,
        9,
        0,
        4096,
        &block(99),
    );
    assert_eq!(simple(&mut s), (0, 9));
    request(&mut s, NBD_CMD_WRITE, 0, 10, 100, 10, &[0xee; 10]);
    assert_eq!(simple(&mut s), (0, 10));
    let mut want = block(99);
    want[100..110].fill(0xee);
    assert!(read_simple(&mut s, 11, 0, 4096) == want);
    drop(s);
    server.stop().unwrap();
}

#[test]
fn backend_errors_are_eio_and_the_connection_goes_on() {
    let (server, a, _mem) = start(1 << 20);
    let mut s = server.connect();
    go(&mut s, true);
    a.fail(true);
    request(&mut s, NBD_CMD_WRITE, 0, 1, 0, 4096, &block(1));
    request(&mut s, NBD_CMD_READ, 0, 2, 4096, 4096, &[]);
    let mut answered = HashMap::new();
    for _ in 0..2 {
        let h = read_n(&mut s, 4);
        let magic = u32_at(&h, 0);
        let rest = if magic == NBD_SIMPLE_REPLY_MAGIC {
            let r = read_n(&mut s, 12);
            (u32_at(&r, 0), u64_at(&r, 4))
        } else {
            assert_eq!(magic, NBD_STRUCTURED_REPLY_MAGIC);
            let r = read_n(&mut s, 16);
            let (flags, kind, cookie, len) =
                (u16_at(&r, 0), u16_at(&r, 2), u64_at(&r, 4), u32_at(&r, 12));
            assert_eq!(flags & NBD_REPLY_FLAG_DONE, NBD_REPLY_FLAG_DONE);
            assert_eq!(kind, NBD_REPLY_TYPE_ERROR);
            let p = read_n(&mut s, len as usize);
            (u32_at(&p, 0), cookie)
        };
        answered.insert(rest.1, rest.0);
    }
    assert_eq!(answered.get(&1), Some(&5), "the write's error is not EIO");
    assert_eq!(answered.get(&2), Some(&5), "the read's error is not EIO");
    a.fail(false);
    request(&mut s, NBD_CMD_WRITE, 0, 3, 0, 4096, &block(3));
    assert_eq!(simple(&mut s), (0, 3));
    request(&mut s, NBD_CMD_READ, 0, 4, 0, 4096, &[]);
    let (flags, kind, cookie, data) = chunk(&mut s);
    assert_eq!(
        (flags, kind, cookie),
        (NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_OFFSET_DATA, 4)
    );
    assert!(data[8..] == block(3)[..]);
    drop(s);
    server.stop().unwrap();
}

#[test]
fn many_client_threads_pass_the_conformance_suites() {
    let (server, a, _mem) = start(4 << 20);
    let uri = format!("nbd+unix:///?socket={}", server.path.display());
    let remote = NbdBackend::connect(&uri, RemoteOptions::default()).unwrap();
    ucrypt_backend::testing::conformance(&remote);
    ucrypt_backend::testing::conformance_concurrent(&remote, 16);
    assert!(a.accepted.load(Ordering::SeqCst) > 0);
    drop(remote);
    server.stop().unwrap();
}

#[test]
fn a_client_that_hangs_up_with_requests_in_flight_leaves_the_server_serving() {
    let mem = Arc::new(MemoryBackend::new(1 << 20).unwrap());
    let a = Arc::new(AsyncThreads::new(mem, 4));
    let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let opts = ServeOptions {
        connections: open.clone(),
        ..ServeOptions::default()
    };
    let server = Server::start(a.clone(), opts);
    for round in 0..4u64 {
        let mut s = server.connect();
        go(&mut s, false);
        for i in 0..32 {
            request(
                &mut s,
                NBD_CMD_WRITE,
                0,
                i,
                i * 4096,
                4096,
                &block(round + i),
            );
            request(&mut s, NBD_CMD_READ, 0, 100 + i, i * 4096, 4096, &[]);
        }
        drop(s);
    }
    // The hung-up clients' connections end, and a connection ends only once every
    // request it submitted has completed (none is lost or stuck holding it). Only then is
    // the block's content defined: NBD orders nothing between an unacknowledged write and
    // another connection's requests, so a write still in flight from a hung-up client may
    // land after a new client's.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while open.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(
        open.load(Ordering::SeqCst),
        0,
        "hung-up connections still open"
    );
    assert_eq!(
        a.completed.load(Ordering::SeqCst),
        a.accepted.load(Ordering::SeqCst),
        "a hung-up client's connection ended with requests in flight"
    );
    let mut s = server.connect();
    go(&mut s, false);
    request(&mut s, NBD_CMD_WRITE, 0, 1, 0, 4096, &block(7));
    assert_eq!(simple(&mut s), (0, 1));
    assert!(read_simple(&mut s, 2, 0, 4096) == block(7));
    drop(s);
    server.stop().unwrap();
}

/// Serves `mem` through [`AsyncThreads`] with 2 completion threads and `reply_timeout`.
fn start_bounded(mem: &Arc<MemoryBackend>, reply_timeout: std::time::Duration) -> Server {
    let a = Arc::new(AsyncThreads::new(mem.clone(), 2));
    Server::start(
        a,
        ServeOptions {
            reply_timeout,
            ..ServeOptions::default()
        },
    )
}

/// A second client's write and read, on a thread: its replies, or `None` if it was not
/// answered within 20 s (a hang guard, not a timing claim).
fn other_client(server: &Server) -> Option<((u32, u64), Vec<u8>)> {
    let (tx, rx) = std::sync::mpsc::channel();
    let mut s = server.connect();
    std::thread::spawn(move || {
        go(&mut s, false);
        request(&mut s, NBD_CMD_WRITE, 0, 1, 0, 4096, &block(3));
        let w = simple(&mut s);
        let r = read_simple(&mut s, 2, 0, 4096);
        let _ = tx.send((w, r));
    });
    rx.recv_timeout(std::time::Duration::from_secs(20)).ok()
}

/// Sends 16 reads of 1 MiB (far more than any socket buffer) without reading anything.
fn sixteen_big_reads(s: &mut std::os::unix::net::UnixStream) {
    for i in 0..16u64 {
        request(s, NBD_CMD_READ, 0, i, i << 20, 1 << 20, &[]);
    }
}

/// A client that stops reading its replies with its socket buffer full is cut off after
/// `reply_timeout` (its queued replies dropped), and meanwhile another client's requests
/// are answered: its replies wait in the connection's queue, not in a completion thread
/// (shared by every connection, as librbd's). Without the bound the stuck client's
/// replies would all arrive once it reads again.
#[test]
fn a_client_that_stops_reading_is_cut_off_and_others_are_answered() {
    let mem = Arc::new(MemoryBackend::new(64 << 20).unwrap());
    let server = start_bounded(&mem, std::time::Duration::from_millis(300));
    let mut stuck = server.connect();
    go(&mut stuck, false);
    sixteen_big_reads(&mut stuck);
    std::thread::sleep(std::time::Duration::from_millis(100));
    let (w, r) = other_client(&server).expect("the other client was never answered");
    assert_eq!(w, (0, 1));
    assert!(r == block(3));
    // Well past the bound: the server has given up on the stuck client. What its socket
    // still holds arrives, then EOF (or a reset) before the 16 replies are complete.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    stuck
        .set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    let mut got = 0usize;
    let mut b = vec![0u8; 1 << 16];
    loop {
        match std::io::Read::read(&mut stuck, &mut b) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    assert!(
        got < 16 * ((1 << 20) + 16),
        "the stuck client was not cut off: all {got} bytes of its replies arrived"
    );
    drop(stuck);
    server.stop().unwrap();
}

/// A client that reads its replies slowly (nothing for a while, then a little at a time)
/// holds up neither the completion threads nor other clients, and gets every reply whole:
/// the replies the socket would not take wait in its connection's queue. Before the
/// queue, a completion thread blocked in the slow client's socket: the other client was
/// answered only once the slow one was cut off (`reply_timeout`), and the slow one lost
/// its replies.
#[test]
fn a_slow_reader_gets_every_reply_and_holds_up_nobody() {
    let mem = Arc::new(MemoryBackend::new(64 << 20).unwrap());
    for i in 0..16u64 {
        mem.write_at(&vec![i as u8 + 1; 1 << 20], i << 20, false)
            .unwrap();
    }
    let server = start_bounded(&mem, std::time::Duration::from_secs(3));
    let mut slow = server.connect();
    go(&mut slow, false);
    sixteen_big_reads(&mut slow);
    std::thread::sleep(std::time::Duration::from_millis(100));
    let (w, r) = other_client(&server).expect("the other client was never answered");
    assert_eq!(w, (0, 1));
    assert!(r == block(3));
    // Everything the slow client is owed is queued or in its socket: it reads now, a
    // piece at a time, for longer than the bound in total (16 x 4 x 60 ms).
    let mut seen = [false; 16];
    for _ in 0..16 {
        let (err, cookie) = simple(&mut slow);
        assert_eq!(err, 0);
        let i = usize::try_from(cookie).unwrap();
        assert!(
            i < 16 && !seen[i],
            "cookie {cookie} unknown or answered twice"
        );
        seen[i] = true;
        let mut data = Vec::with_capacity(1 << 20);
        while data.len() < 1 << 20 {
            data.extend(read_n(&mut slow, 1 << 18));
            std::thread::sleep(std::time::Duration::from_millis(60));
        }
        assert!(
            data.iter().all(|&b| b == i as u8 + 1),
            "read {i} got other data"
        );
    }
    drop(slow);
    server.stop().unwrap();
}
