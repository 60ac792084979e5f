//! A raw-bytes NBD client and a server fixture for the protocol tests (mini-redis style:
//! a real server on a unix socket in a temp dir, spoken to byte by byte).
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use ucrypt_backend::{Backend, BackendError, BackendInfo, MemoryBackend};
use ucrypt_nbd::proto::*;
use ucrypt_nbd::{serve, Listener, ServeOptions, Shutdown};

/// A server running on a thread; stopped (gracefully) on `stop` or drop.
pub struct Server {
    pub dir: tempfile::TempDir,
    pub path: std::path::PathBuf,
    pub shutdown: Shutdown,
    thread: Option<std::thread::JoinHandle<Result<(), ucrypt_nbd::NbdError>>>,
}

impl Server {
    pub fn start(export: Arc<dyn Backend>, mut opts: ServeOptions) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nbd.sock");
        let listener = Listener::bind_unix(&path).unwrap();
        let shutdown = Shutdown::default();
        opts.shutdown = shutdown.clone();
        let thread = std::thread::spawn(move || serve(listener, export, opts));
        Server {
            dir,
            path,
            shutdown,
            thread: Some(thread),
        }
    }

    pub fn memory(size: u64) -> (Server, Arc<MemoryBackend>) {
        let m = Arc::new(MemoryBackend::new(size).unwrap());
        (Server::start(m.clone(), ServeOptions::default()), m)
    }

    pub fn connect(&self) -> UnixStream {
        UnixStream::connect(&self.path).unwrap()
    }

    pub fn stop(mut self) -> Result<(), ucrypt_nbd::NbdError> {
        self.shutdown.trigger();
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.shutdown.trigger();
            let _ = t.join();
        }
    }
}

pub fn read_n(s: &mut impl Read, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    s.read_exact(&mut b).unwrap();
    b
}

pub fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(b[at..at + 2].try_into().unwrap())
}
pub fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}
pub fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

/// Reads the greeting and sends client flags.
pub fn greet(s: &mut UnixStream, client_flags: u32) {
    let g = read_n(s, 18);
    assert_eq!(&g[..16], b"NBDMAGICIHAVEOPT");
    s.write_all(&client_flags.to_be_bytes()).unwrap();
}

pub fn send_opt(s: &mut UnixStream, option: u32, data: &[u8]) {
    let mut m = IHAVEOPT.to_be_bytes().to_vec();
    m.extend_from_slice(&option.to_be_bytes());
    m.extend_from_slice(&(data.len() as u32).to_be_bytes());
    m.extend_from_slice(data);
    s.write_all(&m).unwrap();
}

/// One option reply: (option, type, data).
pub fn opt_reply(s: &mut UnixStream) -> (u32, u32, Vec<u8>) {
    let h = read_n(s, 20);
    assert_eq!(u64_at(&h, 0), NBD_REP_MAGIC);
    let len = u32_at(&h, 16) as usize;
    (u32_at(&h, 8), u32_at(&h, 12), read_n(s, len))
}

pub fn go_data(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        d.extend_from_slice(&i.to_be_bytes());
    }
    d
}

/// Handshake through NBD_OPT_GO; returns (size, transmission flags).
pub fn go(s: &mut UnixStream, structured: bool) -> (u64, u16) {
    greet(s, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES);
    if structured {
        send_opt(s, NBD_OPT_STRUCTURED_REPLY, &[]);
        assert_eq!(opt_reply(s).1, NBD_REP_ACK);
    }
    send_opt(s, NBD_OPT_GO, &go_data("", &[NBD_INFO_BLOCK_SIZE]));
    let mut size_flags = None;
    loop {
        let (o, t, d) = opt_reply(s);
        assert_eq!(o, NBD_OPT_GO);
        match t {
            NBD_REP_INFO if u16_at(&d, 0) == NBD_INFO_EXPORT => {
                size_flags = Some((u64_at(&d, 2), u16_at(&d, 10)));
            }
            NBD_REP_INFO => {}
            NBD_REP_ACK => return size_flags.unwrap(),
            other => panic!("unexpected reply {other:#x}"),
        }
    }
}

pub fn request(
    s: &mut UnixStream,
    kind: u16,
    flags: u16,
    cookie: u64,
    offset: u64,
    length: u32,
    payload: &[u8],
) {
    let r = ucrypt_nbd::command::Request {
        flags,
        kind,
        cookie,
        offset,
        length,
    };
    let mut m = r.encode().to_vec();
    m.extend_from_slice(payload);
    s.write_all(&m).unwrap();
}

/// A simple reply header: (error, cookie).
pub fn simple(s: &mut UnixStream) -> (u32, u64) {
    let h = read_n(s, 16);
    assert_eq!(
        u32_at(&h, 0),
        NBD_SIMPLE_REPLY_MAGIC,
        "not a simple reply: {h:02x?}"
    );
    (u32_at(&h, 4), u64_at(&h, 8))
}

/// A structured chunk: (flags, type, cookie, payload).
pub fn chunk(s: &mut UnixStream) -> (u16, u16, u64, Vec<u8>) {
    let h = read_n(s, 20);
    assert_eq!(
        u32_at(&h, 0),
        NBD_STRUCTURED_REPLY_MAGIC,
        "not a structured reply: {h:02x?}"
    );
    let len = u32_at(&h, 16) as usize;
    (u16_at(&h, 4), u16_at(&h, 6), u64_at(&h, 8), read_n(s, len))
}

/// Reads `len` bytes at `offset` with simple replies.
pub fn read_simple(s: &mut UnixStream, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    request(s, NBD_CMD_READ, 0, cookie, offset, len, &[]);
    assert_eq!(simple(s), (0, cookie));
    read_n(s, len as usize)
}

/// A backend that blocks reads at `gate_offset` until `open` is called, and counts flushes.
pub struct GateBackend {
    pub inner: MemoryBackend,
    pub gate_offset: u64,
    open: Mutex<bool>,
    cv: Condvar,
    pub flushes: AtomicU64,
    pub writes_before_flush: Mutex<Vec<u64>>,
}

impl GateBackend {
    pub fn new(size: u64, gate_offset: u64) -> Self {
        GateBackend {
            inner: MemoryBackend::new(size).unwrap(),
            gate_offset,
            open: Mutex::new(false),
            cv: Condvar::new(),
            flushes: AtomicU64::new(0),
            writes_before_flush: Mutex::new(Vec::new()),
        }
    }
    pub fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

impl GateBackend {
    fn read(&self, buf: &mut [u8], offset: u64) -> Result<(), BackendError> {
        if offset == self.gate_offset {
            let mut g = self.open.lock().unwrap();
            while !*g {
                g = self.cv.wait(g).unwrap();
            }
        }
        self.inner.read_at(buf, offset)
    }

    fn write(&self, buf: &[u8], offset: u64, fua: bool) -> Result<(), BackendError> {
        self.writes_before_flush.lock().unwrap().push(offset);
        self.inner.write_at(buf, offset, fua)
    }

    fn trim(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        self.inner.discard(offset, len)
    }
}

impl Backend for GateBackend {
    fn info(&self) -> &BackendInfo {
        self.inner.info()
    }

    fn submit(&self, io: ucrypt_backend::Io<'_>) -> Result<(), ucrypt_backend::BackendError> {
        match io.kind {
            ucrypt_backend::IoKind::Read(buf) => self.read(buf, io.offset),
            ucrypt_backend::IoKind::Write(buf) => self.write(buf, io.offset, io.fua),
            ucrypt_backend::IoKind::Discard(len) => self.trim(io.offset, len),
            _ => ucrypt_backend::emulate::fallback(self, io),
        }
    }

    fn flush(&self) -> Result<(), BackendError> {
        self.flushes.fetch_add(1, Ordering::SeqCst);
        self.writes_before_flush.lock().unwrap().clear();
        self.inner.flush()
    }
}
