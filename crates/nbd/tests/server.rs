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
