//! [`NbdBackend`]: ciphertext on another NBD server, as a [`Backend`]. The table line names
//! it as its device (`nbd+unix:///EXPORT?socket=PATH` or `nbd://HOST[:PORT]/EXPORT`), so
//! the keys stay on this machine while the data sits on network or distributed storage that
//! exports NBD (nbdkit plugins, qemu-storage-daemon, Ceph's rbd-nbd).
//!
//! ```text
//!  Volume ──► NbdBackend ──► pool of connections (Pipelined: many requests in flight
//!                              each; over TLS one at a time) ──► server
//! ```
//!
//! Every calling thread has its own request in flight: a plaintext connection carries
//! many at once ([`crate::client::Pipelined`]). Requests go round robin over several
//! connections when the server offers `NBD_FLAG_CAN_MULTI_CONN` (then a FLUSH on any of
//! them covers writes completed on all, which is what `Backend::flush` promises); otherwise
//! there is one. A TLS connection runs one request at a time (its session is shared by
//! both directions under one lock), so over TLS only multi-conn gives concurrency.
//!
//! ## Reconnecting, and what it cannot promise
//! A connection that fails is dropped, its requests fail, and it is re-established on its
//! next use. A request is never sent twice (one that finds its connection already failed,
//! unsent, goes to a new one; one that was sent fails with the connection). A write the
//! old connection acknowledged may sit in the server's cache, and a server that restarted
//! (or a different server now behind the address) lost it; a FLUSH on the new connection
//! cannot cover it. So the backend counts writes acknowledged since the last successful
//! FLUSH, and a reconnect while any are outstanding marks them *possibly lost*: the next
//! FLUSH fails with `EIO` (once; the flush after it reports only on what came later), as
//! the kernel reports a writeback error to `fsync`. It is conservative: a reconnect to a
//! server that merely dropped a TCP connection, cache intact, fails one FLUSH too. Writes
//! sent with FUA are durable when acknowledged and are not counted; an export without
//! FLUSH support (write-through) is not tracked.

use crate::client::{Address, Connection, ExportFacts, Pipelined};
use crate::command::Request;
use crate::proto::*;
use crate::tls::{ClientTls, ClientTlsParams};
use crate::NbdError;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use ucrypt_backend::{emulate, Backend, BackendError, BackendInfo, Caps, Io, IoKind, Support};

/// Default TCP port of NBD (IANA).
pub const NBD_DEFAULT_PORT: u16 = 10809;

/// How to use a remote export.
#[derive(Debug, Clone, Copy)]
pub struct RemoteOptions {
    /// Connections to open when the server allows multi-conn.
    pub connections: usize,
    /// Refuse writes even if the server accepts them.
    pub read_only: bool,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            connections: 4,
            read_only: false,
        }
    }
}

/// Parses `nbd+unix:///EXPORT?socket=PATH` and `nbd://HOST[:PORT][/EXPORT]`, and their
/// TLS forms `nbds+unix://` and `nbds://` (see [`parse_uri_tls`]); percent-escapes in the
/// query are decoded.
///
/// # Errors
/// [`NbdError::Export`] naming what is wrong with the URI.
pub fn parse_uri(uri: &str) -> Result<(Address, String), NbdError> {
    let (addr, export, _) = split_uri(uri)?;
    Ok((addr, export))
}

/// [`parse_uri`] plus the TLS client for `nbds://` and `nbds+unix://` URIs, from the query
/// parameters libnbd takes ([`crate::tls::ClientTls`]: `tls-certificates`,
/// `tls-psk-file`, `tls-username` or `user@`, `tls-verify-peer`, `tls-hostname`).
///
/// # Errors
/// As [`parse_uri`], plus unreadable or malformed credentials.
pub fn parse_uri_tls(uri: &str) -> Result<(Address, String, Option<ClientTls>), NbdError> {
    let (addr, export, tls) = split_uri(uri)?;
    let tls = match tls {
        Some(p) => Some(ClientTls::new(&p)?),
        None => None,
    };
    Ok((addr, export, tls))
}

fn split_uri(uri: &str) -> Result<(Address, String, Option<ClientTlsParams>), NbdError> {
    let bad = |why: &str| NbdError::Export(format!("NBD URI {uri:?}: {why}"));
    let (scheme, rest) = uri
        .split_once("://")
        .ok_or_else(|| bad("expected nbd://, nbd+unix://, nbds:// or nbds+unix://"))?;
    let (unix, tls) = match scheme {
        "nbd" => (false, false),
        "nbds" => (false, true),
        "nbd+unix" => (true, false),
        "nbds+unix" => (true, true),
        _ => return Err(bad("expected nbd://, nbd+unix://, nbds:// or nbds+unix://")),
    };
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let mut params = Vec::new();
    for kv in query.split('&').filter(|kv| !kv.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        let v = percent_decode(v).ok_or_else(|| bad("bad percent-escape in the query"))?;
        params.push((k, v));
    }
    let param = |k: &str| params.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
    let (authority, export) = rest.split_once('/').unwrap_or((rest, ""));
    let (user, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u.to_string()), h),
        None => (None, authority),
    };
    let addr = if unix {
        let socket = param("socket")
            .filter(|s| !s.is_empty())
            .ok_or_else(|| bad("missing ?socket=PATH"))?;
        Address::Unix(PathBuf::from(socket))
    } else {
        if hostport.is_empty() {
            return Err(bad("missing host"));
        }
        let has_port = match hostport.rfind(']') {
            Some(close) => hostport[close..].contains(':'),
            None => hostport.contains(':'),
        };
        Address::Tcp(if has_port {
            hostport.to_string()
        } else {
            format!("{hostport}:{NBD_DEFAULT_PORT}")
        })
    };
    let tls = tls.then(|| {
        let host = match hostport.rfind(']') {
            Some(close) => hostport[..close].trim_start_matches('['),
            None => hostport.split(':').next().unwrap_or(""),
        };
        ClientTlsParams {
            certificates: param("tls-certificates").map(PathBuf::from),
            psk_file: param("tls-psk-file").map(PathBuf::from),
            username: param("tls-username").or(user),
            verify_peer: !matches!(
                param("tls-verify-peer").as_deref(),
                Some("false" | "0" | "no" | "off")
            ),
            hostname: param("tls-hostname")
                .or_else(|| (!unix && !host.is_empty()).then(|| host.to_string())),
        }
    });
    Ok((addr, export.to_string(), tls))
}

/// `%XX` escapes decoded (hand-written: a few lines, for query values only).
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// One connection of the pool.
#[derive(Debug)]
enum Link {
    /// Plaintext: any number of requests at once.
    Pipe(Pipelined),
    /// TLS: one request at a time; the flag says it failed.
    Serial(Mutex<Connection>, AtomicBool),
}

impl Link {
    fn new(c: Connection) -> Link {
        match c.pipelined() {
            Ok(p) => Link::Pipe(p),
            Err(c) => Link::Serial(Mutex::new(*c), AtomicBool::new(false)),
        }
    }

    fn failed(&self) -> bool {
        match self {
            Link::Pipe(p) => p.failed(),
            Link::Serial(_, f) => f.load(Ordering::SeqCst),
        }
    }

    /// Whether a request would start at once (a serial link not busy).
    fn idle(&self) -> bool {
        match self {
            Link::Pipe(_) => true,
            Link::Serial(c, _) => c.try_lock().is_ok(),
        }
    }

    /// Runs a request; `Ok(None)`: not sent, the link had failed (another request's
    /// failure, seen only once this one's turn came).
    fn call(&self, req: Request, payload: &[u8], data: &mut [u8]) -> Result<Option<u32>, NbdError> {
        match self {
            Link::Pipe(p) if p.failed() => Ok(None),
            Link::Pipe(p) => p.call(req, payload, data).map(Some),
            Link::Serial(c, failed) => {
                let mut c = crate::server::lock(c);
                if failed.load(Ordering::SeqCst) {
                    return Ok(None);
                }
                let r = c.call(req, payload, data);
                if r.is_err() {
                    failed.store(true, Ordering::SeqCst);
                }
                r.map(Some)
            }
        }
    }
}

/// A remote NBD export as a backend.
pub struct NbdBackend {
    uri: String,
    addr: Address,
    export: String,
    /// TLS for `nbds://` URIs (every connection, reconnects too).
    tls: Option<ClientTls>,
    info: BackendInfo,
    /// The connections; `None`, or one that failed, is (re)connected on its next use.
    conns: Vec<Mutex<Option<Arc<Link>>>>,
    /// Round-robin start for picking a connection.
    next: AtomicUsize,
    /// Largest READ/WRITE sent (the server's maximum block size).
    max_io: u32,
    /// Non-FUA write-class requests acknowledged so far (a sequence number).
    acked: AtomicU64,
    /// `acked` as it was when the last successful FLUSH was sent: writes up to it are
    /// durable.
    covered: AtomicU64,
    /// A reconnect happened while acknowledged writes were not yet covered by a FLUSH: the
    /// next FLUSH fails (see the module docs).
    lost: AtomicBool,
}

impl std::fmt::Debug for NbdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbdBackend")
            .field("uri", &self.uri)
            .field("info", &self.info)
            .field("connections", &self.conns.len())
            .finish()
    }
}

impl NbdBackend {
    /// Connects to the export at `uri`.
    ///
    /// # Errors
    /// Bad URIs, connection and negotiation failures.
    pub fn connect(uri: &str, opts: RemoteOptions) -> Result<NbdBackend, NbdError> {
        let (addr, export, tls) = parse_uri_tls(uri)?;
        let first = Connection::connect_tls(&addr, &export, tls.as_ref())?;
        let ExportFacts {
            size_bytes,
            flags,
            block,
        } = first.facts();
        let n = if flags & NBD_FLAG_CAN_MULTI_CONN != 0 {
            opts.connections.max(1)
        } else {
            1
        };
        let mut conns = vec![Mutex::new(Some(Arc::new(Link::new(first))))];
        for _ in 1..n {
            let c = Connection::connect_tls(&addr, &export, tls.as_ref())?;
            conns.push(Mutex::new(Some(Arc::new(Link::new(c)))));
        }
        let support = |f: u16| {
            if flags & f != 0 {
                Support::Native
            } else {
                Support::None
            }
        };
        let (min, preferred, max) = block;
        // The spec caps the minimum block size at 64 KiB; a server claiming more (or a
        // minimum that is not a power of two) cannot be spoken to in whole blocks.
        if (min != 0 && !min.is_power_of_two()) || min > 64 * 1024 {
            return Err(NbdError::Export(format!(
                "{uri}: the server's minimum block size {min} is not a power of two up to 65536"
            )));
        }
        let min = min.max(1);
        let info = BackendInfo {
            size_bytes,
            logical_block: min,
            physical_block: preferred.max(min),
            optimal_block: preferred.max(min),
            caps: Caps {
                flush: support(NBD_FLAG_SEND_FLUSH),
                discard: support(NBD_FLAG_SEND_TRIM),
                write_zeroes: support(NBD_FLAG_SEND_WRITE_ZEROES),
                read_only: opts.read_only || flags & NBD_FLAG_READ_ONLY != 0,
            },
        };
        // Keep requests aligned to the minimum and within the maximum (and our own 32 MiB);
        // min <= 64 KiB here, so the bounds are ordered.
        let max_io = (max.max(min).min(32 << 20) / min) * min;
        Ok(NbdBackend {
            uri: uri.to_string(),
            addr,
            export,
            tls,
            info,
            conns,
            next: AtomicUsize::new(0),
            max_io,
            acked: AtomicU64::new(0),
            covered: AtomicU64::new(0),
            lost: AtomicBool::new(false),
        })
    }

    /// Runs one request on the next connection (reconnecting a failed one); a serial (TLS)
    /// connection that is busy is passed over for an idle one.
    fn call(
        &self,
        op: &'static str,
        req: Request,
        payload: &[u8],
        data: &mut [u8],
    ) -> Result<(), BackendError> {
        let offset = req.offset;
        let counted = matches!(
            req.kind,
            NBD_CMD_WRITE | NBD_CMD_WRITE_ZEROES | NBD_CMD_TRIM
        ) && req.flags & NBD_CMD_FLAG_FUA == 0
            && self.info.caps.flush != Support::None;
        // A request that was never sent (its link failed under it) goes to a fresh link,
        // once; a request that was sent is never repeated (module docs).
        let mut r = self.link()?.call(req, payload, data);
        if let Ok(None) = r {
            r = self.link()?.call(req, payload, data);
        }
        match r {
            Ok(None) => Err(BackendError::Other(format!(
                "{op} at offset {offset} on {}: the connection failed again",
                self.uri
            ))),
            Ok(Some(0)) => {
                if counted {
                    self.acked.fetch_add(1, Ordering::SeqCst);
                }
                Ok(())
            }
            Ok(Some(errno)) => Err(BackendError::Io {
                op,
                offset,
                path: PathBuf::from(&self.uri),
                source: io::Error::from_raw_os_error(errno as i32),
            }),
            Err(e) => Err(BackendError::Other(format!(
                "{op} at offset {offset} on {}: {}",
                self.uri,
                crate::server::chain(&e)
            ))),
        }
    }

    /// The connection for the next request, (re)connected if it failed.
    fn link(&self) -> Result<Arc<Link>, BackendError> {
        let n = self.conns.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let usable = |i: usize| {
            crate::server::lock(&self.conns[i])
                .as_ref()
                .is_some_and(|l| !l.failed() && l.idle())
        };
        let i = (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| usable(i))
            .unwrap_or(start);
        let mut slot = crate::server::lock(&self.conns[i]);
        if let Some(l) = slot.as_ref().filter(|l| !l.failed()) {
            return Ok(Arc::clone(l));
        }
        // Requests still in flight on a failed connection keep it until they end.
        *slot = None;
        let c =
            Connection::connect_tls(&self.addr, &self.export, self.tls.as_ref()).map_err(|e| {
                BackendError::Other(format!(
                    "reconnecting to {}: {}",
                    self.uri,
                    crate::server::chain(&e)
                ))
            })?;
        // Writes the server acknowledged but nobody flushed may have died with it.
        if self.acked.load(Ordering::SeqCst) > self.covered.load(Ordering::SeqCst) {
            self.lost.store(true, Ordering::SeqCst);
        }
        let l = Arc::new(Link::new(c));
        *slot = Some(Arc::clone(&l));
        Ok(l)
    }

    fn check_writable(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        if self.info.caps.read_only {
            return Err(BackendError::ReadOnly);
        }
        ucrypt_backend::check_range(offset, len, self.info.size_bytes)
    }

    /// Splits `[offset, offset+len)` into pieces of at most `max` bytes.
    fn pieces(offset: u64, len: u64, max: u64) -> impl Iterator<Item = (u64, u32)> {
        let mut pos = 0;
        std::iter::from_fn(move || {
            (pos < len).then(|| {
                let n = (len - pos).min(max);
                let at = offset + pos;
                pos += n;
                (at, n as u32)
            })
        })
    }
}

/// A request header (the connection assigns the cookie).
fn req(kind: u16, flags: u16, offset: u64, length: u32) -> Request {
    Request {
        flags,
        kind,
        cookie: 0,
        offset,
        length,
    }
}

impl NbdBackend {
    fn read(&self, buf: &mut [u8], offset: u64) -> Result<(), BackendError> {
        ucrypt_backend::check_range(offset, buf.len() as u64, self.info.size_bytes)?;
        let mut done = 0usize;
        for (at, n) in Self::pieces(offset, buf.len() as u64, u64::from(self.max_io)) {
            let n = n as usize;
            self.call(
                "read",
                req(NBD_CMD_READ, 0, at, n as u32),
                &[],
                &mut buf[done..done + n],
            )?;
            done += n;
        }
        Ok(())
    }

    fn write(&self, buf: &[u8], offset: u64, fua: bool) -> Result<(), BackendError> {
        self.check_writable(offset, buf.len() as u64)?;
        let flags = if fua && self.info.caps.flush != Support::None {
            NBD_CMD_FLAG_FUA
        } else {
            0
        };
        let mut done = 0usize;
        for (at, n) in Self::pieces(offset, buf.len() as u64, u64::from(self.max_io)) {
            let n = n as usize;
            self.call(
                "write",
                req(NBD_CMD_WRITE, flags, at, n as u32),
                &buf[done..done + n],
                &mut [],
            )?;
            done += n;
        }
        Ok(())
    }

    fn trim(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        if self.info.caps.discard == Support::None {
            return Err(BackendError::Unsupported("discard"));
        }
        self.check_writable(offset, len)?;
        for (at, n) in Self::pieces(
            offset,
            len,
            u64::from(u32::MAX / self.info.logical_block * self.info.logical_block),
        ) {
            self.call("trim", req(NBD_CMD_TRIM, 0, at, n), &[], &mut [])?;
        }
        Ok(())
    }

    fn zero_range(&self, offset: u64, len: u64, fua: bool) -> Result<(), BackendError> {
        if self.info.caps.write_zeroes == Support::None {
            return Err(BackendError::Unsupported("write_zeroes"));
        }
        self.check_writable(offset, len)?;
        let mut flags = NBD_CMD_FLAG_NO_HOLE;
        if fua && self.info.caps.flush != Support::None {
            flags |= NBD_CMD_FLAG_FUA;
        }
        for (at, n) in Self::pieces(offset, len, u64::from(self.max_io)) {
            self.call(
                "write_zeroes",
                req(NBD_CMD_WRITE_ZEROES, flags, at, n),
                &[],
                &mut [],
            )?;
        }
        Ok(())
    }
}

impl Backend for NbdBackend {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn submit(&self, io: Io<'_>) -> Result<(), BackendError> {
        match io.kind {
            IoKind::Read(buf) => self.read(buf, io.offset),
            IoKind::Write(buf) => self.write(buf, io.offset, io.fua),
            IoKind::Discard(len) => self.trim(io.offset, len),
            IoKind::WriteZeroes(len) => self.zero_range(io.offset, len, io.fua),
            _ => emulate::fallback(self, io),
        }
    }

    fn flush(&self) -> Result<(), BackendError> {
        if self.info.caps.flush == Support::None {
            return Ok(());
        }
        // Writes acknowledged before the FLUSH is sent are the ones it covers.
        let upto = self.acked.load(Ordering::SeqCst);
        self.call("flush", req(NBD_CMD_FLUSH, 0, 0, 0), &[], &mut [])?;
        self.covered.fetch_max(upto, Ordering::SeqCst);
        if self.lost.swap(false, Ordering::SeqCst) {
            return Err(BackendError::Io {
                op: "flush",
                offset: 0,
                path: PathBuf::from(&self.uri),
                source: io::Error::other(
                    "the connection to the server was re-established since writes it \
                     acknowledged were last flushed: they may be lost",
                ),
            });
        }
        Ok(())
    }
}

impl Drop for NbdBackend {
    fn drop(&mut self) {
        // A soft disconnect, as the spec asks of clients.
        for c in &self.conns {
            if let Some(link) = crate::server::lock(c).as_ref().filter(|l| !l.failed()) {
                let _ = link.call(req(NBD_CMD_DISC, 0, 0, 0), &[], &mut []);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_unix_and_tcp_uris() {
        assert_eq!(
            parse_uri("nbd+unix:///?socket=/tmp/s.sock").unwrap(),
            (Address::Unix("/tmp/s.sock".into()), String::new())
        );
        assert_eq!(
            parse_uri("nbd+unix:///disk?socket=/run/x").unwrap(),
            (Address::Unix("/run/x".into()), "disk".into())
        );
        assert_eq!(
            parse_uri("nbd://example.org/vol").unwrap(),
            (Address::Tcp("example.org:10809".into()), "vol".into())
        );
        assert_eq!(
            parse_uri("nbd://127.0.0.1:1234").unwrap(),
            (Address::Tcp("127.0.0.1:1234".into()), String::new())
        );
        assert_eq!(
            parse_uri("nbd://[::1]/").unwrap(),
            (Address::Tcp("[::1]:10809".into()), String::new())
        );
        for bad in [
            "nbd+unix:///x",
            "nbd://",
            "nbds+unix:///",
            "ftp://h/",
            "/dev/sda",
        ] {
            assert!(parse_uri(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tls_uris_carry_libnbd_parameters() {
        let (addr, export, p) =
            split_uri("nbds://alice@store.example:10810/vol?tls-certificates=/etc/pki/x%20y")
                .unwrap();
        assert_eq!(addr, Address::Tcp("store.example:10810".into()));
        assert_eq!(export, "vol");
        let p = p.unwrap();
        assert_eq!(p.certificates, Some("/etc/pki/x y".into()));
        assert_eq!(p.username.as_deref(), Some("alice"));
        assert!(p.verify_peer && p.psk_file.is_none());
        assert_eq!(p.hostname.as_deref(), Some("store.example"));
        let (addr, _, p) = split_uri(
            "nbds+unix:///?socket=/s&tls-psk-file=/k.psk&tls-username=bob&tls-verify-peer=false",
        )
        .unwrap();
        let p = p.unwrap();
        assert_eq!(addr, Address::Unix("/s".into()));
        assert_eq!(
            (p.psk_file, p.username),
            (Some("/k.psk".into()), Some("bob".into()))
        );
        assert!(!p.verify_peer && p.hostname.is_none());
        assert!(split_uri("nbd://h/").unwrap().2.is_none());
    }

    #[test]
    fn pieces_cover_the_range_in_bounded_steps() {
        let p: Vec<_> = NbdBackend::pieces(100, 25, 10).collect();
        assert_eq!(p, vec![(100, 10), (110, 10), (120, 5)]);
        assert_eq!(NbdBackend::pieces(0, 0, 10).count(), 0);
    }
}
