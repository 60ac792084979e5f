//! Byte-level protocol tests against a real server on a unix socket (mini-redis style).
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use std::io::{Read, Write};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use ucrypt_backend::{Backend, MemoryBackend};
use ucrypt_nbd::proto::*;
use ucrypt_nbd::{Listener, ServeOptions};

const MIB: u64 = 1 << 20;

#[test]
fn go_reports_size_block_sizes_and_transmission_flags() {
    let (server, _) = Server::memory(8 * MIB);
    let mut s = server.connect();
    greet(&mut s, NBD_FLAG_C_FIXED_NEWSTYLE);
    send_opt(&mut s, NBD_OPT_GO, &go_data("", &[NBD_INFO_BLOCK_SIZE]));
    let (_, t, export) = opt_reply(&mut s);
    assert_eq!((t, u16_at(&export, 0)), (NBD_REP_INFO, NBD_INFO_EXPORT));
    assert_eq!(u64_at(&export, 2), 8 * MIB);
    let flags = u16_at(&export, 10);
    for f in [
        NBD_FLAG_HAS_FLAGS,
        NBD_FLAG_SEND_FLUSH,
        NBD_FLAG_SEND_FUA,
        NBD_FLAG_SEND_TRIM,
        NBD_FLAG_SEND_WRITE_ZEROES,
        NBD_FLAG_CAN_MULTI_CONN,
    ] {
        assert_ne!(flags & f, 0, "flag {f:#x} missing from {flags:#x}");
    }
    assert_eq!(flags & (NBD_FLAG_READ_ONLY | NBD_FLAG_SEND_DF), 0);
    let (_, t, bs) = opt_reply(&mut s);
    assert_eq!((t, u16_at(&bs, 0)), (NBD_REP_INFO, NBD_INFO_BLOCK_SIZE));
    assert_eq!(u32_at(&bs, 2), 512, "minimum = the backend's logical block");
    assert_eq!(u32_at(&bs, 10), 32 << 20, "maximum = the payload limit");
    assert_eq!(opt_reply(&mut s).1, NBD_REP_ACK);
}

#[test]
fn write_then_read_round_trips_with_simple_replies() {
    let (server, mem) = Server::memory(MIB);
    let mut s = server.connect();
    go(&mut s, false);
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
    request(
        &mut s,
        NBD_CMD_WRITE,
        NBD_CMD_FLAG_FUA,
        1,
        4096,
        8192,
        &data,
    );
    assert_eq!(simple(&mut s), (0, 1));
    assert_eq!(read_simple(&mut s, 2, 4096, 8192), data);
    // Unaligned too: the export does not have to be read in whole blocks.
    assert_eq!(read_simple(&mut s, 3, 4099, 5), data[3..8].to_vec());
    let mut direct = vec![0u8; 8192];
    mem.read_at(&mut direct, 4096).unwrap();
    assert_eq!(direct, data, "the bytes reached the backend");
}

#[test]
fn structured_read_is_one_data_chunk_marked_done() {
    let (server, mem) = Server::memory(MIB);
    mem.write_at(b"hello, nbd", 1000, false).unwrap();
    let mut s = server.connect();
    let (_, flags) = go(&mut s, true);
    assert_ne!(
        flags & NBD_FLAG_SEND_DF,
        0,
        "DF comes with structured replies"
    );
    request(&mut s, NBD_CMD_READ, NBD_CMD_FLAG_DF, 9, 1000, 10, &[]);
    let (f, t, cookie, payload) = chunk(&mut s);
    assert_eq!(
        (f, t, cookie),
        (NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_OFFSET_DATA, 9)
    );
    assert_eq!(u64_at(&payload, 0), 1000);
    assert_eq!(&payload[8..], b"hello, nbd");
}

#[test]
fn structured_read_errors_are_error_chunks_not_simple_replies() {
    let (server, _) = Server::memory(MIB);
    let mut s = server.connect();
    go(&mut s, true);
    request(&mut s, NBD_CMD_READ, 0, 5, MIB - 1, 2, &[]);
    let (f, t, cookie, payload) = chunk(&mut s);
    assert_eq!(
        (f, t, cookie),
        (NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_ERROR, 5)
    );
    assert_eq!(u32_at(&payload, 0), Errno::EINVAL.value());
    let msg_len = u16_at(&payload, 4) as usize;
    assert_eq!(payload.len(), 6 + msg_len);
    // Non-read commands may still get simple replies.
    request(&mut s, NBD_CMD_FLUSH, 0, 6, 0, 0, &[]);
    assert_eq!(simple(&mut s), (0, 6));
}

#[test]
fn replies_are_sent_in_completion_order() {
    let gate = Arc::new(GateBackend::new(MIB, 0));
    let server = Server::start(gate.clone(), ServeOptions::default());
    let mut s = server.connect();
    go(&mut s, false);
    request(&mut s, NBD_CMD_READ, 0, 1, 0, 512, &[]); // blocks in the backend
    request(&mut s, NBD_CMD_READ, 0, 2, 4096, 512, &[]);
    assert_eq!(
        simple(&mut s),
        (0, 2),
        "the later request overtakes the blocked one"
    );
    read_n(&mut s, 512);
    gate.open();
    assert_eq!(simple(&mut s), (0, 1));
    read_n(&mut s, 512);
}

#[test]
fn many_pipelined_requests_are_all_answered() {
    let (server, _) = Server::memory(4 * MIB);
    let mut s = server.connect();
    go(&mut s, false);
    let n = 200u64;
    for i in 0..n {
        let block = vec![i as u8; 4096];
        request(&mut s, NBD_CMD_WRITE, 0, i, i * 4096, 4096, &block);
    }
    let mut seen: Vec<u64> = (0..n)
        .map(|_| simple(&mut s))
        .map(|(e, c)| {
            assert_eq!(e, 0);
            c
        })
        .collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..n).collect::<Vec<_>>());
    for i in (0..n).step_by(37) {
        assert_eq!(
            read_simple(&mut s, 1000 + i, i * 4096, 4096),
            vec![i as u8; 4096]
        );
    }
}

/// Small requests of a local export run on the reading thread with their replies sent
/// together; a large one goes to another thread meanwhile; refusals join the batch. Every
/// reply must come whole (frames never interleave) with the right data.
#[test]
fn batched_small_replies_and_handed_off_large_ones_stay_whole() {
    let (server, _) = Server::memory(4 * MIB);
    let mut s = server.connect();
    go(&mut s, true);
    let block = |i: u64| vec![(i * 7 + 1) as u8; 4096];
    let big: Vec<u8> = (0..MIB as usize).map(|i| (i % 251) as u8).collect();
    for i in 0..40u64 {
        request(&mut s, NBD_CMD_WRITE, 0, i, i * 4096, 4096, &block(i));
    }
    request(&mut s, NBD_CMD_WRITE, 0, 100, 2 * MIB, MIB as u32, &big);
    let mut done: Vec<u64> = (0..41)
        .map(|_| simple(&mut s))
        .map(|(e, c)| {
            assert_eq!(e, 0);
            c
        })
        .collect();
    done.sort_unstable();
    assert_eq!(done, (0..40).chain([100]).collect::<Vec<_>>());
    // Reads: small ones inline, the large one beside them, one past the end refused.
    for i in 0..40u64 {
        request(&mut s, NBD_CMD_READ, 0, i, i * 4096, 4096, &[]);
        if i == 20 {
            request(&mut s, NBD_CMD_READ, 0, 100, 2 * MIB, MIB as u32, &[]);
            request(&mut s, NBD_CMD_READ, 0, 200, 4 * MIB, 4096, &[]);
        }
    }
    let mut seen = Vec::new();
    for _ in 0..42 {
        let (flags, t, cookie, p) = chunk(&mut s);
        assert_eq!(flags & NBD_REPLY_FLAG_DONE, NBD_REPLY_FLAG_DONE);
        match cookie {
            200 => assert_eq!(t, NBD_REPLY_TYPE_ERROR),
            100 => {
                assert_eq!(t, NBD_REPLY_TYPE_OFFSET_DATA);
                assert_eq!(u64_at(&p, 0), 2 * MIB);
                assert!(p[8..] == big[..], "the large read's data");
            }
            i => {
                assert_eq!(t, NBD_REPLY_TYPE_OFFSET_DATA);
                assert_eq!(u64_at(&p, 0), i * 4096);
                assert_eq!(p[8..], block(i)[..], "read {i}");
            }
        }
        seen.push(cookie);
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..40).chain([100, 200]).collect::<Vec<_>>());
}

/// A local export whose requests turn out slow (a disk to be read, here a sleep) gets its
/// small requests spread over the connection's threads again instead of run one after
/// another by the reader.
#[test]
fn slow_local_requests_are_spread_over_threads_again() {
    use std::sync::atomic::AtomicUsize;
    struct Slow {
        inner: MemoryBackend,
        now: AtomicUsize,
        most: AtomicUsize,
    }
    impl Slow {
        fn read(&self, buf: &mut [u8], offset: u64) -> Result<(), ucrypt_backend::BackendError> {
            let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(n, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(2));
            self.now.fetch_sub(1, Ordering::SeqCst);
            self.inner.read_at(buf, offset)
        }

        fn write(
            &self,
            buf: &[u8],
            offset: u64,
            fua: bool,
        ) -> Result<(), ucrypt_backend::BackendError> {
            self.inner.write_at(buf, offset, fua)
        }
    }

    impl Backend for Slow {
        fn info(&self) -> &ucrypt_backend::BackendInfo {
            self.inner.info()
        }
        fn submit(&self, io: ucrypt_backend::Io<'_>) -> Result<(), ucrypt_backend::BackendError> {
            match io.kind {
                ucrypt_backend::IoKind::Read(buf) => self.read(buf, io.offset),
                ucrypt_backend::IoKind::Write(buf) => self.write(buf, io.offset, io.fua),
                _ => ucrypt_backend::emulate::fallback(self, io),
            }
        }
        fn flush(&self) -> Result<(), ucrypt_backend::BackendError> {
            Ok(())
        }
        fn hints(&self) -> ucrypt_backend::Hints {
            ucrypt_backend::Hints {
                local: true,
                ..Default::default()
            }
        }
    }
    let slow = Arc::new(Slow {
        inner: MemoryBackend::new(MIB).unwrap(),
        now: AtomicUsize::new(0),
        most: AtomicUsize::new(0),
    });
    let server = Server::start(slow.clone(), ServeOptions::default());
    let mut s = server.connect();
    go(&mut s, false);
    for i in 0..64u64 {
        request(&mut s, NBD_CMD_READ, 0, i, (i % 16) * 4096, 4096, &[]);
    }
    for _ in 0..64 {
        assert_eq!(simple(&mut s).0, 0);
        read_n(&mut s, 4096);
    }
    assert!(
        slow.most.load(Ordering::SeqCst) >= 2,
        "slow requests ran one at a time"
    );
}

#[test]
fn flush_on_one_connection_covers_writes_completed_on_another() {
    let gate = Arc::new(GateBackend::new(MIB, u64::MAX));
    let server = Server::start(gate.clone(), ServeOptions::default());
    let mut a = server.connect();
    let mut b = server.connect();
    let (_, flags) = go(&mut a, false);
    assert_ne!(flags & NBD_FLAG_CAN_MULTI_CONN, 0);
    go(&mut b, false);
    request(&mut a, NBD_CMD_WRITE, 0, 1, 8192, 512, &[0xab; 512]);
    assert_eq!(simple(&mut a), (0, 1));
    assert_eq!(gate.writes_before_flush.lock().unwrap().as_slice(), &[8192]);
    request(&mut b, NBD_CMD_FLUSH, 0, 2, 0, 0, &[]);
    assert_eq!(simple(&mut b), (0, 2));
    assert_eq!(gate.flushes.load(Ordering::SeqCst), 1);
    assert!(
        gate.writes_before_flush.lock().unwrap().is_empty(),
        "the write on A was flushed by B's FLUSH"
    );
}

#[test]
fn write_zeroes_and_trim_leave_zeroes() {
    let (server, mem) = Server::memory(MIB);
    mem.write_at(&[0xff; 8192], 0, false).unwrap();
    let mut s = server.connect();
    go(&mut s, false);
    request(
        &mut s,
        NBD_CMD_WRITE_ZEROES,
        NBD_CMD_FLAG_NO_HOLE | NBD_CMD_FLAG_FUA,
        1,
        0,
        4096,
        &[],
    );
    assert_eq!(simple(&mut s), (0, 1));
    assert_eq!(read_simple(&mut s, 2, 0, 4096), vec![0; 4096]);
    request(&mut s, NBD_CMD_TRIM, 0, 3, 4096, 4096, &[]);
    assert_eq!(simple(&mut s), (0, 3));
}

#[test]
fn read_only_export_advertises_it_and_refuses_writes_with_eperm() {
    let mem = Arc::new(MemoryBackend::new(MIB).unwrap());
    let opts = ServeOptions {
        read_only: true,
        ..ServeOptions::default()
    };
    let server = Server::start(mem, opts);
    let mut s = server.connect();
    let (_, flags) = go(&mut s, false);
    assert_ne!(flags & NBD_FLAG_READ_ONLY, 0);
    assert_eq!(flags & (NBD_FLAG_SEND_TRIM | NBD_FLAG_SEND_WRITE_ZEROES), 0);
    request(&mut s, NBD_CMD_WRITE, 0, 1, 0, 512, &[1; 512]);
    assert_eq!(simple(&mut s), (Errno::EPERM.value(), 1));
    assert_eq!(
        read_simple(&mut s, 2, 0, 512),
        vec![0; 512],
        "stream still in sync"
    );
}

#[test]
fn disc_answers_in_flight_requests_then_closes() {
    let (server, _) = Server::memory(MIB);
    let mut s = server.connect();
    go(&mut s, false);
    request(&mut s, NBD_CMD_WRITE, 0, 1, 0, 512, &[7; 512]);
    request(&mut s, NBD_CMD_DISC, 0, 2, 0, 0, &[]);
    assert_eq!(simple(&mut s), (0, 1));
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "no reply to DISC");
}

#[test]
fn shutdown_finishes_flushes_and_removes_the_socket() {
    let gate = Arc::new(GateBackend::new(MIB, u64::MAX));
    let server = Server::start(gate.clone(), ServeOptions::default());
    let path = server.path.clone();
    let mut s = server.connect();
    go(&mut s, false);
    request(&mut s, NBD_CMD_WRITE, 0, 1, 0, 512, &[7; 512]);
    assert_eq!(simple(&mut s), (0, 1));
    server.stop().unwrap();
    assert!(
        gate.flushes.load(Ordering::SeqCst) >= 1,
        "shutdown flushed the export"
    );
    assert!(!path.exists());
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
}

#[test]
fn a_client_mid_handshake_is_told_the_server_is_shutting_down() {
    let (server, _) = Server::memory(MIB);
    let mut s = server.connect();
    greet(&mut s, NBD_FLAG_C_FIXED_NEWSTYLE);
    send_opt(&mut s, NBD_OPT_LIST, &[]);
    assert_eq!(opt_reply(&mut s).1, NBD_REP_SERVER);
    assert_eq!(opt_reply(&mut s).1, NBD_REP_ACK);
    server.shutdown.trigger();
    // The read side is shut: the server sees EOF and closes without reading more.
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty());
}

#[test]
fn inline_mode_serves_requests_in_the_reading_thread() {
    let mem = Arc::new(MemoryBackend::new(MIB).unwrap());
    let opts = ServeOptions {
        workers: 0,
        ..ServeOptions::default()
    };
    let server = Server::start(mem, opts);
    let mut s = server.connect();
    go(&mut s, true);
    request(&mut s, NBD_CMD_WRITE, 0, 1, 512, 512, &[3; 512]);
    assert_eq!(simple(&mut s), (0, 1));
    request(&mut s, NBD_CMD_READ, 0, 2, 512, 512, &[]);
    let (_, t, _, p) = chunk(&mut s);
    assert_eq!((t, &p[8..]), (NBD_REPLY_TYPE_OFFSET_DATA, &[3u8; 512][..]));
}

#[test]
fn connection_limit_serves_the_next_client_when_one_leaves() {
    let mem = Arc::new(MemoryBackend::new(MIB).unwrap());
    let opts = ServeOptions {
        max_connections: 1,
        ..ServeOptions::default()
    };
    let server = Server::start(mem, opts);
    let mut first = server.connect();
    go(&mut first, false);
    let mut second = server.connect();
    request(&mut first, NBD_CMD_DISC, 0, 1, 0, 0, &[]);
    drop(first);
    go(&mut second, false);
    assert_eq!(read_simple(&mut second, 1, 0, 512), vec![0; 512]);
}

#[test]
fn tcp_listener_serves_and_reports_its_uri() {
    let mem: Arc<dyn Backend> = Arc::new(MemoryBackend::new(MIB).unwrap());
    let listener = Listener::bind_tcp("127.0.0.1:0").unwrap();
    let addr = listener.tcp_addr().unwrap();
    assert_eq!(listener.uri(), format!("nbd://127.0.0.1:{}/", addr.port()));
    let shutdown = ucrypt_nbd::Shutdown::default();
    let opts = ServeOptions {
        shutdown: shutdown.clone(),
        ..ServeOptions::default()
    };
    let t = std::thread::spawn(move || ucrypt_nbd::serve(listener, mem, opts));
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let g = read_n(&mut s, 18);
    assert_eq!(&g[..8], b"NBDMAGIC");
    s.write_all(&1u32.to_be_bytes()).unwrap();
    let mut m = IHAVEOPT.to_be_bytes().to_vec();
    m.extend_from_slice(&NBD_OPT_ABORT.to_be_bytes());
    m.extend_from_slice(&0u32.to_be_bytes());
    s.write_all(&m).unwrap();
    let r = read_n(&mut s, 20);
    assert_eq!(u32_at(&r, 12), NBD_REP_ACK);
    shutdown.trigger();
    t.join().unwrap().unwrap();
}

#[test]
fn bind_unix_refuses_a_path_that_is_not_a_socket() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("file");
    std::fs::write(&p, b"x").unwrap();
    assert!(matches!(
        Listener::bind_unix(&p),
        Err(ucrypt_nbd::NbdError::SocketPathInUse { .. })
    ));
}

#[test]
fn requests_larger_than_the_byte_budget_still_complete_one_at_a_time() {
    let mem = Arc::new(MemoryBackend::new(MIB).unwrap());
    mem.write_at(&[9; 65536], 0, false).unwrap();
    let opts = ServeOptions {
        workers: 2,
        max_in_flight_bytes: 4096,
        ..ServeOptions::default()
    };
    let server = Server::start(mem, opts);
    let mut s = server.connect();
    go(&mut s, false);
    for cookie in 0..6 {
        request(&mut s, NBD_CMD_READ, 0, cookie, 0, 65536, &[]);
    }
    for _ in 0..6 {
        assert_eq!(simple(&mut s).0, 0);
        assert_eq!(read_n(&mut s, 65536), vec![9; 65536]);
    }
}

#[test]
fn a_client_that_never_negotiates_is_dropped_after_the_handshake_limit() {
    let mem = Arc::new(MemoryBackend::new(MIB).unwrap());
    let opts = ServeOptions {
        handshake_timeout: Some(std::time::Duration::from_millis(50)),
        ..ServeOptions::default()
    };
    let server = Server::start(mem, opts);
    let mut s = server.connect();
    read_n(&mut s, 18);
    // Say nothing: the server gives up and closes (no assertion on how long it took).
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
}

/// Issue 18.5: a backend that panics while serving a request. The request is answered
/// with EIO, its budget and cookie are released (more panics than threads and budget
/// would otherwise wedge the connection), and the connection and the server go on.
#[test]
fn a_panicking_request_is_answered_with_eio_and_the_connection_goes_on() {
    let faulty = Arc::new(ucrypt_backend::FaultyBackend::new(Arc::new(
        MemoryBackend::new(MIB).unwrap(),
    )));
    faulty.write_at(&[5; 4096], 0, false).unwrap();
    faulty.panic_reads_in(4096..8192);
    let opts = ServeOptions {
        workers: 2,
        max_in_flight_bytes: 8192,
        ..ServeOptions::default()
    };
    let server = Server::start(faulty, opts);
    for structured in [false, true] {
        let mut s = server.connect();
        go(&mut s, structured);
        for cookie in 0..8 {
            request(&mut s, NBD_CMD_READ, 0, cookie, 4096, 4096, &[]);
            if structured {
                let (flags, t, c, p) = chunk(&mut s);
                assert_eq!(
                    (flags, t, c),
                    (NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_ERROR, cookie)
                );
                assert_eq!(u32_at(&p, 0), 5, "EIO");
                let msg = String::from_utf8_lossy(&p[6..]).to_string();
                assert!(msg.contains("read") && msg.contains("EIO"), "{msg}");
            } else {
                assert_eq!(simple(&mut s), (5, cookie));
            }
        }
        // The same connection still serves, with both threads' budget back.
        let mut t = server.connect();
        go(&mut t, false);
        for cookie in 100..104 {
            request(&mut s, NBD_CMD_READ, 0, cookie, 0, 4096, &[]);
        }
        for _ in 100..104 {
            let (err, _) = if structured {
                let (_, ty, c, p) = chunk(&mut s);
                assert_eq!(ty, NBD_REPLY_TYPE_OFFSET_DATA);
                assert_eq!(&p[8..], &[5u8; 4096][..]);
                (0, c)
            } else {
                let r = simple(&mut s);
                assert_eq!(read_n(&mut s, 4096), vec![5; 4096]);
                r
            };
            assert_eq!(err, 0);
        }
        assert_eq!(read_simple(&mut t, 7, 0, 512), vec![5; 512]);
    }
}

/// A backend whose errors name a host path, as `FileBackend`'s do.
struct PathErrors(MemoryBackend);

impl PathErrors {
    fn read(&self, _: &mut [u8], offset: u64) -> Result<(), ucrypt_backend::BackendError> {
        Err(ucrypt_backend::BackendError::Io {
            op: "read",
            offset,
            path: "/srv/secret-host-dir/disk.img".into(),
            source: std::io::Error::from_raw_os_error(libc::ENXIO),
        })
    }

    fn write(&self, b: &[u8], o: u64, f: bool) -> Result<(), ucrypt_backend::BackendError> {
        self.0.write_at(b, o, f)
    }

    fn trim(&self, o: u64, l: u64) -> Result<(), ucrypt_backend::BackendError> {
        self.0.discard(o, l)
    }
}

impl Backend for PathErrors {
    fn info(&self) -> &ucrypt_backend::BackendInfo {
        self.0.info()
    }

    fn submit(&self, io: ucrypt_backend::Io<'_>) -> Result<(), ucrypt_backend::BackendError> {
        match io.kind {
            ucrypt_backend::IoKind::Read(buf) => self.read(buf, io.offset),
            ucrypt_backend::IoKind::Write(buf) => self.write(buf, io.offset, io.fua),
            ucrypt_backend::IoKind::Discard(len) => self.trim(io.offset, len),
            _ => ucrypt_backend::emulate::fallback(self, io),
        }
    }

    fn flush(&self) -> Result<(), ucrypt_backend::BackendError> {
        self.0.flush()
    }
}

/// Issue 18.5: error messages sent to clients name the operation and errno, not host paths.
#[test]
fn error_messages_on_the_wire_name_the_operation_not_host_paths() {
    let server = Server::start(
        Arc::new(PathErrors(MemoryBackend::new(MIB).unwrap())),
        ServeOptions::default(),
    );
    let mut s = server.connect();
    go(&mut s, true);
    request(&mut s, NBD_CMD_READ, 0, 1, 8192, 512, &[]);
    let (_, t, _, p) = chunk(&mut s);
    assert_eq!((t, u32_at(&p, 0)), (NBD_REPLY_TYPE_ERROR, 5));
    let msg = String::from_utf8_lossy(&p[6..]).to_string();
    assert_eq!(
        msg,
        "read of 512 bytes at offset 8192 failed: EIO (host errno 6)"
    );
}

/// Reads until the server stops answering (its reply writes block: the client never
/// reads), returns the socket.
fn pipeline_without_reading(server: &Server) -> std::os::unix::net::UnixStream {
    let mut s = server.connect();
    go(&mut s, false);
    s.set_write_timeout(Some(std::time::Duration::from_millis(500)))
        .unwrap();
    // 1 MiB reads until our sends block: the server has stopped reading requests because
    // its replies cannot be sent.
    for cookie in 0..100_000 {
        let r = ucrypt_nbd::command::Request {
            flags: 0,
            kind: NBD_CMD_READ,
            cookie,
            offset: 0,
            length: 1 << 20,
        };
        if s.write_all(&r.encode()).is_err() {
            return s;
        }
    }
    panic!("the server read 100000 requests without sending a reply");
}

/// Issue 18.7: SIGTERM (shutdown) ends in bounded time with a client that pipelines
/// requests and never reads the replies; the export is still flushed.
#[test]
fn shutdown_is_bounded_when_a_client_never_reads_its_replies() {
    let gate = Arc::new(GateBackend::new(4 * MIB, u64::MAX));
    let opts = ServeOptions {
        shutdown_grace: std::time::Duration::from_millis(300),
        ..ServeOptions::default()
    };
    let server = Server::start(gate.clone(), opts);
    let _s = pipeline_without_reading(&server);
    let t = std::time::Instant::now();
    server.stop().unwrap();
    let took = t.elapsed();
    assert!(took < std::time::Duration::from_secs(5), "{took:?}");
    assert!(gate.flushes.load(Ordering::SeqCst) >= 1);
}

/// Issue 18.7: shutdown does not depend on the socket's path (it was woken by connecting
/// to it): removing the file while serving must not make SIGTERM hang.
#[test]
fn shutdown_works_after_the_socket_file_was_removed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nbd.sock");
    let listener = Listener::bind_unix(&path).unwrap();
    let shutdown = ucrypt_nbd::Shutdown::default();
    let opts = ServeOptions {
        shutdown: shutdown.clone(),
        ..ServeOptions::default()
    };
    let mem: Arc<dyn Backend> = Arc::new(MemoryBackend::new(MIB).unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(ucrypt_nbd::serve(listener, mem, opts).is_ok()));
    let mut s = std::os::unix::net::UnixStream::connect(&path).unwrap();
    go(&mut s, false);
    std::fs::remove_file(&path).unwrap();
    // A new file at the path (someone else's): not ours to remove.
    std::fs::write(&path, b"not ours").unwrap();
    shutdown.trigger();
    assert_eq!(
        rx.recv_timeout(std::time::Duration::from_secs(10)),
        Ok(true),
        "serve did not return"
    );
    assert_eq!(std::fs::read(&path).unwrap(), b"not ours");
}

/// Issue 18.7: the handshake limit is a deadline for the whole handshake, not for one
/// read: a client dribbling a byte at a time is closed when it passes.
#[test]
fn a_client_dribbling_the_handshake_is_closed_at_the_deadline() {
    let opts = ServeOptions {
        handshake_timeout: Some(std::time::Duration::from_millis(400)),
        ..ServeOptions::default()
    };
    let server = Server::start(Arc::new(MemoryBackend::new(MIB).unwrap()), opts);
    let mut s = server.connect();
    read_n(&mut s, 18);
    s.write_all(&NBD_FLAG_C_FIXED_NEWSTYLE.to_be_bytes())
        .unwrap();
    let t = std::time::Instant::now();
    // An option header sent one byte every 100 ms (each read well inside the limit),
    // then the same bytes again and again.
    let header = [IHAVEOPT.to_be_bytes(), [0; 8]].concat();
    let closed = header.iter().cycle().take(100).any(|b| {
        std::thread::sleep(std::time::Duration::from_millis(100));
        s.write_all(&[*b]).is_err()
    });
    assert!(closed, "still open after 10 s");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(3),
        "{:?}",
        t.elapsed()
    );
}

/// Issue 18.7: clients beyond the connection limit wait in a bounded queue, each for a
/// bounded time; one arriving at a full queue is closed at once, not left hanging.
#[test]
fn clients_waiting_for_a_slot_are_bounded_in_number_and_time() {
    let opts = ServeOptions {
        max_connections: 1,
        max_waiting: 1,
        // Long enough that "closed at once" and "closed at the limit" stay apart on a
        // loaded machine.
        handshake_timeout: Some(std::time::Duration::from_secs(2)),
        ..ServeOptions::default()
    };
    let server = Server::start(Arc::new(MemoryBackend::new(MIB).unwrap()), opts);
    let mut served = server.connect();
    let (_, flags) = go(&mut served, false);
    assert_eq!(
        flags & NBD_FLAG_CAN_MULTI_CONN,
        0,
        "one slot: no multi-conn"
    );
    let mut waiting = server.connect();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let mut refused = server.connect();
    let t = std::time::Instant::now();
    let mut buf = Vec::new();
    refused.read_to_end(&mut buf).unwrap();
    let refused_after = t.elapsed();
    assert!(buf.is_empty());
    assert!(
        refused_after < std::time::Duration::from_millis(1500),
        "the refused client waited {refused_after:?}"
    );
    // The waiting one is dropped once its wait exceeds the limit, not before.
    let _ = waiting.read_to_end(&mut buf);
    assert!(buf.is_empty());
    let waited = t.elapsed();
    assert!(
        waited > std::time::Duration::from_millis(1500)
            && waited < std::time::Duration::from_secs(10),
        "the waiting client was closed after {waited:?}"
    );
    // The served client was not disturbed; when it leaves, a new one gets the slot.
    assert_eq!(read_simple(&mut served, 1, 0, 512), vec![0; 512]);
    request(&mut served, NBD_CMD_DISC, 0, 2, 0, 0, &[]);
    drop(served);
    let mut next = server.connect();
    go(&mut next, false);
    assert_eq!(read_simple(&mut next, 3, 0, 512), vec![0; 512]);
}

/// Multi-conn is advertised when more than one connection is served.
#[test]
fn multi_conn_is_advertised_with_several_slots() {
    let (server, _) = Server::memory(MIB);
    let mut s = server.connect();
    let (_, flags) = go(&mut s, false);
    assert_ne!(flags & NBD_FLAG_CAN_MULTI_CONN, 0);
}

/// Issue 18.7: the socket is 0600 (0660 with a group) whatever the umask, and the file
/// goes away with the listener, a listener that never served included.
#[test]
fn unix_sockets_are_private_and_removed_with_their_listener() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("s.sock");
    let l = Listener::bind_unix(&p).unwrap();
    assert_eq!(
        std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
        0o600
    );
    drop(l);
    assert!(!p.exists());
    // SAFETY: getgid has no preconditions.
    let gid = unsafe { libc::getgid() };
    let l = Listener::bind_unix_with(&p, Some(gid)).unwrap();
    let meta = std::fs::metadata(&p).unwrap();
    assert_eq!(
        (meta.permissions().mode() & 0o777, meta.gid()),
        (0o660, gid)
    );
    drop(l);
    assert!(!p.exists());
}

/// Replies of threads that find another one writing are sent by that writer (flat
/// combining), never lost or sent twice: 64 KiB reads (each on its own thread) and 4 KiB
/// ones (answered in batches by the reading thread) pipelined on 8 threads while the client
/// reads nothing for a while, so the socket fills, the writer blocks and the others' replies
/// pile up behind it. Every cookie is answered once, whole, with its own data; a reply left
/// behind fails the read timeout (and the server, whose connection would wait for that
/// reply forever, is then leaked rather than joined, so the test fails instead of hanging).
#[test]
fn replies_piling_up_behind_a_blocked_writer_are_each_sent_once_whole() {
    const SIZE: u64 = 16 * MIB;
    let mem = Arc::new(MemoryBackend::new(SIZE).unwrap());
    let pattern: Vec<u8> = (0..SIZE).map(|i| (i * 7 + i / 4096) as u8).collect();
    mem.write_at(&pattern, 0, false).unwrap();
    let opts = ServeOptions {
        workers: 8,
        ..ServeOptions::default()
    };
    let server = Server::start(mem, opts);
    let mut s = server.connect();
    go(&mut s, false);
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        check_piled_up_replies(&mut s, &pattern);
    }));
    if let Err(e) = checked {
        std::mem::forget(server);
        std::panic::resume_unwind(e);
    }
}

fn check_piled_up_replies(s: &mut std::os::unix::net::UnixStream, pattern: &[u8]) {
    const SIZE: u64 = 16 * MIB;
    let n = 400u64;
    let shape = |i: u64| -> (u64, u32) {
        if i % 3 == 0 {
            ((i * 4096 * 5) % (SIZE - 4096), 4096)
        } else {
            ((i * 65536 * 3) % (SIZE - 65536), 65536)
        }
    };
    let mut w = s.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        for i in 0..n {
            let (off, len) = shape(i);
            request(&mut w, NBD_CMD_READ, 0, 5000 + i, off, len, &[]);
        }
    });
    std::thread::sleep(std::time::Duration::from_millis(200));
    let mut seen = vec![false; n as usize];
    for _ in 0..n {
        let (err, cookie) = simple(s);
        assert_eq!(err, 0);
        let i = cookie
            .checked_sub(5000)
            .filter(|&i| i < n)
            .expect("unknown cookie");
        assert!(!seen[i as usize], "cookie {cookie} answered twice");
        seen[i as usize] = true;
        let (off, len) = shape(i);
        let data = read_n(s, len as usize);
        assert!(
            data[..] == pattern[off as usize..(off + u64::from(len)) as usize],
            "read {i} ({len} bytes at {off}) got other bytes"
        );
    }
    sender.join().unwrap();
    assert!(seen.iter().all(|&x| x));
    // The connection still serves.
    assert!(read_simple(s, 1, 4096, 4096) == pattern[4096..8192]);
}
