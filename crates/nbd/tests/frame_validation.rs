//! Malformed input, each with the exact answer the spec asks for: an errno reply (and the
//! stream stays in sync), an option error, or a hard disconnect.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use ucrypt_backend::MemoryBackend;
use ucrypt_nbd::proto::*;
use ucrypt_nbd::ServeOptions;

const SIZE: u64 = 1 << 20;
const MAX_PAYLOAD: u32 = 64 * 1024;

fn server() -> Server {
    let mem = Arc::new(MemoryBackend::new(SIZE).unwrap());
    Server::start(
        mem,
        ServeOptions {
            max_payload: MAX_PAYLOAD,
            ..ServeOptions::default()
        },
    )
}

fn assert_closed(s: &mut UnixStream) {
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(
        rest.is_empty(),
        "expected a hard disconnect, got {rest:02x?}"
    );
}

/// The stream is still framed: a fresh read succeeds.
fn assert_in_sync(s: &mut UnixStream) {
    assert_eq!(read_simple(s, 0xfeed, 0, 512).len(), 512);
}

#[test]
fn invalid_requests_get_the_spec_errno_and_keep_the_stream_in_sync() {
    let srv = server();
    let mut s = srv.connect();
    go(&mut s, false);
    // (kind, flags, offset, length, payload bytes, errno)
    let cases: &[(u16, u16, u64, u32, usize, Errno)] = &[
        (42, 0, 0, 512, 0, Errno::EINVAL), // unknown command
        (NBD_CMD_BLOCK_STATUS, 0, 0, 512, 0, Errno::EINVAL), // not negotiated
        (NBD_CMD_CACHE, 0, 0, 512, 0, Errno::EINVAL), // not advertised
        (NBD_CMD_READ, 1 << 12, 0, 512, 0, Errno::EINVAL), // unknown flag
        (NBD_CMD_READ, NBD_CMD_FLAG_DF, 0, 512, 0, Errno::EINVAL), // DF without structured
        (
            NBD_CMD_WRITE_ZEROES,
            NBD_CMD_FLAG_FAST_ZERO,
            0,
            512,
            0,
            Errno::EINVAL,
        ), // not advertised
        (NBD_CMD_READ, 0, 0, 0, 0, Errno::EINVAL), // zero length
        (NBD_CMD_READ, 0, SIZE - 511, 512, 0, Errno::EINVAL), // read past the end
        (NBD_CMD_READ, 0, u64::MAX - 10, 512, 0, Errno::EINVAL), // offset overflow
        (NBD_CMD_WRITE, 0, SIZE - 511, 512, 512, Errno::ENOSPC), // write past the end
        (NBD_CMD_WRITE_ZEROES, 0, SIZE, 512, 0, Errno::ENOSPC),
        (NBD_CMD_TRIM, 0, SIZE - 1, 2, 0, Errno::ENOSPC),
        (NBD_CMD_READ, 0, 0, MAX_PAYLOAD + 512, 0, Errno::EOVERFLOW), // over the maximum
        (
            NBD_CMD_WRITE,
            0,
            0,
            MAX_PAYLOAD + 512,
            MAX_PAYLOAD as usize + 512,
            Errno::EOVERFLOW,
        ),
        (NBD_CMD_FLUSH, 0, 512, 0, 0, Errno::EINVAL), // reserved fields
        (NBD_CMD_FLUSH, 0, 0, 512, 0, Errno::EINVAL),
    ];
    for (i, &(kind, flags, offset, length, payload, errno)) in cases.iter().enumerate() {
        let cookie = 100 + i as u64;
        request(
            &mut s,
            kind,
            flags,
            cookie,
            offset,
            length,
            &vec![0x5a; payload],
        );
        assert_eq!(
            simple(&mut s),
            (errno.value(), cookie),
            "case {i}: kind {kind} flags {flags:#x}"
        );
        assert_in_sync(&mut s);
    }
}

#[test]
fn a_refused_write_payload_is_skipped_not_written() {
    let srv = server();
    let mut s = srv.connect();
    go(&mut s, false);
    // The payload of a refused write looks like a request: it must not be parsed as one.
    let fake = ucrypt_nbd::command::Request {
        flags: 0,
        kind: NBD_CMD_WRITE,
        cookie: 9,
        offset: 0,
        length: 0,
    };
    let mut payload = fake.encode().to_vec();
    payload.resize(512, 0);
    request(&mut s, NBD_CMD_WRITE, 0, 1, SIZE, 512, &payload);
    assert_eq!(simple(&mut s), (Errno::ENOSPC.value(), 1));
    assert_eq!(read_simple(&mut s, 2, 0, 512), vec![0; 512]);
}

#[test]
fn bad_request_magic_is_a_hard_disconnect() {
    let srv = server();
    let mut s = srv.connect();
    go(&mut s, false);
    let mut h = ucrypt_nbd::command::Request {
        flags: 0,
        kind: NBD_CMD_READ,
        cookie: 1,
        offset: 0,
        length: 512,
    }
    .encode();
    h[0] = 0;
    s.write_all(&h).unwrap();
    assert_closed(&mut s);
}

#[test]
fn unknown_client_flags_are_a_hard_disconnect() {
    let srv = server();
    let mut s = srv.connect();
    greet(&mut s, 1 << 5);
    assert_closed(&mut s);
}

#[test]
fn bad_option_magic_is_a_hard_disconnect() {
    let srv = server();
    let mut s = srv.connect();
    greet(&mut s, NBD_FLAG_C_FIXED_NEWSTYLE);
    s.write_all(&[0u8; 16]).unwrap();
    assert_closed(&mut s);
}

#[test]
fn a_huge_option_length_is_a_hard_disconnect_without_reading_it() {
    let srv = server();
    let mut s = srv.connect();
    greet(&mut s, NBD_FLAG_C_FIXED_NEWSTYLE);
    let mut m = IHAVEOPT.to_be_bytes().to_vec();
    m.extend_from_slice(&NBD_OPT_GO.to_be_bytes());
    m.extend_from_slice(&0xffff_fff0u32.to_be_bytes());
    s.write_all(&m).unwrap();
    assert_closed(&mut s);
}

#[test]
fn option_errors_leave_the_handshake_usable() {
    let srv = server();
    let mut s = srv.connect();
    greet(&mut s, NBD_FLAG_C_FIXED_NEWSTYLE);
    let cases: &[(u32, Vec<u8>, u32)] = &[
        (NBD_OPT_STARTTLS, vec![], NBD_REP_ERR_UNSUP),
        // Before NBD_OPT_STRUCTURED_REPLY a metadata context cannot be set.
        (NBD_OPT_SET_META_CONTEXT, vec![0; 8], NBD_REP_ERR_INVALID),
        (0x7fff_0000, vec![1, 2, 3], NBD_REP_ERR_UNSUP),
        (NBD_OPT_LIST, vec![0], NBD_REP_ERR_INVALID),
        (NBD_OPT_STRUCTURED_REPLY, vec![0], NBD_REP_ERR_INVALID),
        (NBD_OPT_GO, vec![0, 0, 0, 9, b'x'], NBD_REP_ERR_INVALID), // name longer than the data
        (
            NBD_OPT_INFO,
            go_data("", &[1]).into_iter().chain([0]).collect(),
            NBD_REP_ERR_INVALID,
        ),
        (
            NBD_OPT_GO,
            go_data("no-such-export", &[]),
            NBD_REP_ERR_UNKNOWN,
        ),
    ];
    for (option, data, want) in cases {
        send_opt(&mut s, *option, data);
        let (o, t, msg) = opt_reply(&mut s);
        assert_eq!((o, t), (*option, *want), "option {option:#x}");
        assert!(std::str::from_utf8(&msg).is_ok());
    }
    send_opt(&mut s, NBD_OPT_GO, &go_data("", &[]));
    loop {
        if opt_reply(&mut s).1 == NBD_REP_ACK {
            break;
        }
    }
    assert_in_sync(&mut s);
}

#[test]
fn export_name_for_an_unknown_export_terminates_the_session() {
    let srv = server();
    let mut s = srv.connect();
    greet(&mut s, NBD_FLAG_C_FIXED_NEWSTYLE);
    send_opt(&mut s, NBD_OPT_EXPORT_NAME, b"nope");
    assert_closed(&mut s);
}

#[test]
fn truncated_input_mid_request_ends_only_that_connection() {
    let srv = server();
    let mut s = srv.connect();
    go(&mut s, false);
    s.write_all(&[0x25, 0x60]).unwrap();
    drop(s);
    let mut t = srv.connect();
    go(&mut t, false);
    assert_in_sync(&mut t);
}
