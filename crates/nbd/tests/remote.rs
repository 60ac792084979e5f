//! `NbdBackend` against our own server: the backend conformance suite over NBD, and the
//! capabilities it reads from the handshake.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use std::sync::Arc;
use ucrypt_backend::{Backend, MemoryBackend, Support};
use ucrypt_nbd::{NbdBackend, RemoteOptions, ServeOptions};

fn uri(server: &Server) -> String {
    format!("nbd+unix:///?socket={}", server.path.display())
}

#[test]
fn nbd_backend_passes_the_backend_conformance_suite() {
    let (server, _) = Server::memory(4 << 20);
    let remote = NbdBackend::connect(&uri(&server), RemoteOptions::default()).unwrap();
    let caps = remote.info().caps;
    assert_eq!(
        (caps.flush, caps.discard, caps.write_zeroes),
        (Support::Native, Support::Native, Support::Native)
    );
    ucrypt_backend::testing::conformance(&remote);
}

#[test]
fn nbd_backend_writes_reach_the_remote_device() {
    let (server, mem) = Server::memory(1 << 20);
    let remote = NbdBackend::connect(
        &uri(&server),
        RemoteOptions {
            connections: 2,
            read_only: false,
        },
    )
    .unwrap();
    assert_eq!(remote.info().size_bytes, 1 << 20);
    remote.write_at(&[0x42; 4096], 8192, true).unwrap();
    let mut b = vec![0u8; 4096];
    mem.read_at(&mut b, 8192).unwrap();
    assert_eq!(b, vec![0x42; 4096]);
    remote.flush().unwrap();
}

#[test]
fn read_only_remote_export_is_a_read_only_backend() {
    let mem = Arc::new(MemoryBackend::new(1 << 20).unwrap());
    let server = Server::start(
        mem,
        ServeOptions {
            read_only: true,
            ..ServeOptions::default()
        },
    );
    let remote = NbdBackend::connect(&uri(&server), RemoteOptions::default()).unwrap();
    assert!(remote.info().caps.read_only);
    assert!(matches!(
        remote.write_at(&[1; 512], 0, false),
        Err(ucrypt_backend::BackendError::ReadOnly)
    ));
}

#[test]
fn a_server_error_becomes_a_backend_error_with_its_errno() {
    let faulty = Arc::new(ucrypt_backend::FaultyBackend::new(Arc::new(
        MemoryBackend::new(1 << 20).unwrap(),
    )));
    faulty.fail_reads_in(4096..8192);
    let server = Server::start(faulty, ServeOptions::default());
    let remote = NbdBackend::connect(&uri(&server), RemoteOptions::default()).unwrap();
    let err = remote.read_at(&mut [0u8; 512], 4096).unwrap_err();
    assert_eq!(err.errno(), 5, "EIO: {err}");
    // The connection is still usable afterwards.
    remote.read_at(&mut [0u8; 512], 0).unwrap();
}
