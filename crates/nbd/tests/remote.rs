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

use ucrypt_testkit::require;

/// nbdkit's file plugin serving `img` on `sock`, in the foreground, killed on drop.
struct Nbdkit(std::process::Child);

impl Nbdkit {
    fn start(sock: &std::path::Path, img: &std::path::Path) -> Nbdkit {
        let _ = std::fs::remove_file(sock);
        let child = std::process::Command::new("nbdkit")
            .args(["-f", "-U"])
            .arg(sock)
            .arg("file")
            .arg(img)
            .spawn()
            .unwrap();
        let t = std::time::Instant::now();
        while std::os::unix::net::UnixStream::connect(sock).is_err() {
            assert!(t.elapsed().as_secs() < 30, "nbdkit did not start");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Nbdkit(child)
    }

    /// SIGKILL, as a crash of the storage server.
    fn kill(mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Nbdkit {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads until `n` reads in a row succeed (each failed one drops a dead connection, the
/// next use of it reconnects; single-threaded use cycles through all `n` connections).
fn read_until_reconnected(remote: &NbdBackend, n: usize) {
    let (mut ok, mut failed) = (0, 0);
    while ok < n {
        if remote.read_at(&mut [0u8; 512], 0).is_ok() {
            ok += 1;
        } else {
            (ok, failed) = (0, failed + 1);
            assert!(failed <= 2 * n, "no reconnect");
        }
    }
}

/// Issue 18.4: a write acknowledged by a storage server that then restarts is not covered
/// by a FLUSH on the new connection; the backend must report it (EIO), not succeed. The
/// flush after that, and flushes with no write outstanding at the reconnect, succeed.
#[test]
fn a_reconnect_with_unflushed_writes_fails_the_next_flush() {
    if !require("nbdkit") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (sock, img) = (dir.path().join("up.sock"), dir.path().join("disk.img"));
    std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    for connections in [1, 4] {
        let server = Nbdkit::start(&sock, &img);
        let remote = NbdBackend::connect(
            &uri,
            RemoteOptions {
                connections,
                read_only: false,
            },
        )
        .unwrap();
        // The control: a flushed write, then a restart: nothing outstanding, flush works.
        remote.write_at(&[1; 4096], 0, false).unwrap();
        remote.flush().unwrap();
        server.kill();
        let server = Nbdkit::start(&sock, &img);
        read_until_reconnected(&remote, connections);
        remote.flush().unwrap();

        // The attack: a write acknowledged, the server restarted, then a FLUSH that only
        // the new server sees. Reads first, so that the FLUSH itself runs on a fresh
        // connection and would succeed on its own.
        remote.write_at(&[2; 4096], 8192, false).unwrap();
        server.kill();
        let server = Nbdkit::start(&sock, &img);
        read_until_reconnected(&remote, connections);
        let err = remote.flush().unwrap_err();
        assert_eq!(err.errno(), 5, "{connections} connections: EIO: {err}");
        assert!(err.to_string().contains("flush"), "{err}");
        // Reported once: later flushes cover later writes.
        remote.flush().unwrap();
        remote.write_at(&[3; 4096], 16384, false).unwrap();
        remote.flush().unwrap();
        // A FUA write is durable when acknowledged: a restart after it loses nothing.
        remote.write_at(&[4; 4096], 24576, true).unwrap();
        server.kill();
        let _server = Nbdkit::start(&sock, &img);
        read_until_reconnected(&remote, connections);
        remote.flush().unwrap();
    }
}

/// A storage server advertising block sizes NBD does not allow (a minimum above 64 KiB,
/// here 64 MiB, once a `clamp` panic) is refused with an error naming it.
#[test]
fn a_server_with_an_impossible_minimum_block_size_is_refused() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("evil.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let t = std::thread::spawn(move || {
        // A real handshake, with block sizes no real server may send.
        let (mut s, _) = listener.accept().unwrap();
        let mut hs = ucrypt_nbd::handshake::Handshake::new(ucrypt_nbd::handshake::ExportInfo {
            name: String::new(),
            description: String::new(),
            size_bytes: 1 << 30,
            flags: ucrypt_nbd::proto::NBD_FLAG_HAS_FLAGS,
            min_block: 64 << 20,
            preferred_block: 64 << 20,
            max_block: 32 << 20,
        });
        s.write_all(&hs.greeting()).unwrap();
        let mut out = Vec::new();
        loop {
            let mut input = vec![0u8; hs.wants()];
            if s.read_exact(&mut input).is_err() {
                return;
            }
            out.clear();
            match hs.feed(&input, &mut out) {
                Ok(step) => {
                    s.write_all(&out).unwrap();
                    if !matches!(step, ucrypt_nbd::handshake::Step::Continue) {
                        // Hold the connection until the client gives up.
                        let _ = s.read_to_end(&mut Vec::new());
                        return;
                    }
                }
                Err(_) => return,
            }
        }
    });
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    let err = NbdBackend::connect(&uri, RemoteOptions::default()).unwrap_err();
    assert!(err.to_string().contains("minimum block size"), "{err}");
    t.join().unwrap();
}

/// Holds each read until another read is in flight too (or 200 ms passed), counting the
/// most reads it saw at once.
struct Rendezvous {
    inner: MemoryBackend,
    now: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
}

impl Rendezvous {
    fn read(&self, buf: &mut [u8], offset: u64) -> Result<(), ucrypt_backend::BackendError> {
        use std::sync::atomic::Ordering::SeqCst;
        let n = self.now.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(n, SeqCst);
        let until = std::time::Instant::now() + std::time::Duration::from_millis(200);
        while self.now.load(SeqCst) < 2 && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        self.most.fetch_max(self.now.load(SeqCst), SeqCst);
        let r = self.inner.read_at(buf, offset);
        self.now.fetch_sub(1, SeqCst);
        r
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

impl Backend for Rendezvous {
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
        self.inner.flush()
    }
}

/// One connection carries the requests of many threads at once (it carried one at a time,
/// so ucrypt over an NBD export had 4 requests in flight, one per connection), and every
/// reply reaches the thread whose request it answers: each thread reads back its own block.
#[test]
fn one_connection_carries_many_requests_at_once_each_answered_to_its_sender() {
    let slow = Arc::new(Rendezvous {
        inner: MemoryBackend::new(1 << 20).unwrap(),
        now: 0.into(),
        most: 0.into(),
    });
    let server = Server::start(slow.clone(), ServeOptions::default());
    let remote = NbdBackend::connect(
        &uri(&server),
        RemoteOptions {
            connections: 1,
            read_only: false,
        },
    )
    .unwrap();
    std::thread::scope(|s| {
        for t in 0..8u8 {
            let remote = &remote;
            s.spawn(move || {
                let at = u64::from(t) * 8192;
                for round in 0..10u8 {
                    let pattern = [t.wrapping_mul(31).wrapping_add(round); 8192];
                    remote.write_at(&pattern, at, false).unwrap();
                    let mut b = vec![0u8; 8192];
                    remote.read_at(&mut b, at).unwrap();
                    assert!(b == pattern, "thread {t} round {round} read another's data");
                }
            });
        }
    });
    remote.flush().unwrap();
    let most = slow.most.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        most >= 2,
        "at most {most} request(s) in flight on one connection"
    );
}
