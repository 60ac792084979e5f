//! The control socket (`control.sock` in the instance directory): how `status`, `close`,
//! `luksSuspend`, `luksResume`, `resize`, `refresh` and online `reencrypt` talk to a
//! running server.
//!
//! One [`Request`] per connection, serialized as a JSON object on one line
//! (`{"op":"status"}`), followed, when it carries `"secret_len": N`, by exactly N raw bytes
//! (a passphrase or a table line with its key, or with `"secret_kind": "volume_key"` the
//! volume key a LUKS2 token gave the client: kept out of the JSON so it is never copied
//! into a parser's strings, and read into a zeroizing buffer). The answer is one [`Reply`]
//! on one JSON line; a refusal carries its [`ErrorKind`] and message.
//!
//! The socket is mode 0600 in a 0700 directory, and the server also checks the peer's
//! credentials (`SO_PEERCRED`): only its own user and root may talk to it.

use crate::config::PerfOptions;
use crate::error::ErrorKind;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Duration;
use zeroize::Zeroizing;

/// Longest request line accepted (a request is a few hundred bytes).
const MAX_LINE: u64 = 64 * 1024;
/// Longest secret accepted (cryptsetup's key-file limit, 8 MiB).
const MAX_SECRET: usize = 8192 * 1024;
/// How long a client has to send its whole request (line and secret), from its connect.
/// An idle, slow or half-sent request is refused then; it never holds up anyone else,
/// since each connection is read on a thread of its own.
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// Connections being read at once; one more is refused at once as busy. Each reader ends
/// within [`REQUEST_DEADLINE`], and only this user and root can connect at all.
const MAX_READERS: usize = 1024;
/// How often the accept loop looks whether serving should stop.
const ACCEPT_POLL: Duration = Duration::from_millis(500);

/// What a client asks a running instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// The live [`Status`].
    Status,
    /// Detach the front end and stop.
    Close {
        /// Even while in use (the users' I/O fails from then on).
        force: bool,
        /// Once the last user is gone.
        deferred: bool,
    },
    /// Cancel a pending deferred close.
    CancelDeferred,
    /// Flush, hold I/O and wipe the key.
    Suspend,
    /// Rebuild the key from the secret sent along and release held I/O.
    Resume {
        /// `KEYRING::KEY` to add the volume key to once unlocked.
        link_vk_to_keyring: Option<String>,
    },
    /// Rebuild the volume at a new size (all the device holds without one).
    Resize {
        /// 512-byte sectors.
        size: Option<u64>,
    },
    /// Rebuild the volume with new engine options and discard setting.
    Refresh {
        /// The engine options (`--perf-*`, `--write-order`...).
        perf: PerfOptions,
        /// Pass discards down.
        allow_discards: bool,
    },
    /// Start online reencryption (the metadata is initialised already), with the
    /// passphrase sent along.
    Reencrypt {
        /// Largest hotzone in bytes (default [`crate::reencrypt::DEFAULT_MAX_HOTZONE`]).
        hotzone: Option<u64>,
    },
    /// Ask a running reencryption to stop after its hotzone.
    ReencryptStop,
}

impl Request {
    /// The request's name on the wire (`"status"`, `"close"`...).
    pub fn op(&self) -> &'static str {
        match self {
            Request::Status => "status",
            Request::Close { .. } => "close",
            Request::CancelDeferred => "cancel_deferred",
            Request::Suspend => "suspend",
            Request::Resume { .. } => "resume",
            Request::Resize { .. } => "resize",
            Request::Refresh { .. } => "refresh",
            Request::Reencrypt { .. } => "reencrypt",
            Request::ReencryptStop => "reencrypt_stop",
        }
    }
}

/// An instance's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    /// Done.
    Done,
    /// `close --deferred` while in use: the instance closes once unused.
    Deferred {
        /// What uses it.
        in_use: String,
    },
    /// The answer to [`Request::Status`].
    Status(Box<Status>),
    /// A rebuilt volume's size (resume, resize, refresh).
    Resized {
        /// 512-byte sectors.
        size_sectors: u64,
    },
    /// Refused or failed.
    Refused {
        /// What kind of failure.
        kind: ErrorKind,
        /// Why (the whole chain of messages).
        message: String,
    },
}

/// A refusal.
pub fn refuse(kind: ErrorKind, message: impl std::fmt::Display) -> Reply {
    Reply::Refused {
        kind,
        message: message.to_string(),
    }
}

/// A live instance's status: its description and what only the server knows.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Status {
    /// What `ucrypt open` published.
    #[serde(flatten)]
    pub description: super::runtime::Description,
    /// Whether the node is open or an NBD client is connected.
    pub in_use: bool,
    /// By what, when in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_use_by: Option<String>,
    /// NBD connections open now.
    pub nbd_connections: usize,
    /// Suspended (`luksSuspend`): I/O held, key wiped.
    pub suspended: bool,
    /// An online reencryption that ran in this instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reencryption: Option<Reencryption>,
    /// A deferred close is pending.
    pub deferred_close: bool,
    /// Sectors that failed authentication (EILSEQ) since the volume was opened (volumes
    /// with integrity only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub integrity_failures: Option<u64>,
}

/// Where an online reencryption stands.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Reencryption {
    /// Running, finished, interrupted or failed.
    pub state: PassState,
    /// Bytes of the data area done.
    pub done: u64,
    /// The data area's size in bytes.
    pub size: u64,
    /// Why it failed, or what went wrong after it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The state of an online reencryption's data pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PassState {
    /// Running.
    #[default]
    Running,
    /// Done: the instance serves the new key alone.
    Finished,
    /// Stopped between hotzones; the instance serves both keys.
    Interrupted,
    /// Failed.
    Failed,
}

impl PassState {
    /// Its name in `status --json`.
    pub fn as_str(self) -> &'static str {
        match self {
            PassState::Running => "running",
            PassState::Finished => "finished",
            PassState::Interrupted => "interrupted",
            PassState::Failed => "failed",
        }
    }
}

/// A request with the secret that came after it.
#[derive(Debug)]
pub struct Received {
    /// The request.
    pub request: Request,
    /// The raw secret that followed, if any.
    pub secret: Option<Zeroizing<Vec<u8>>>,
    /// The secret is the volume key itself (a LUKS2 token unlocked it on the client's
    /// side), not a passphrase or table line (`"secret_kind": "volume_key"`).
    pub volume_key: bool,
}

/// Binds the control socket at `path` (mode 0600).
///
/// # Errors
/// Bind failures.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    let _ = std::fs::remove_file(path);
    let l = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// The uid of the process at the other end of `s`.
fn peer_uid(s: &UnixStream) -> std::io::Result<u32> {
    // SAFETY: an all-zero `ucred` is a valid value of this plain C struct.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt(SO_PEERCRED) writes at most `len` bytes into `cred`, which lives
    // for the call; the descriptor is ours.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r == 0 {
        Ok(cred.uid)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A connection read against a deadline: each read waits at most until `until`.
struct Deadline<'a> {
    s: &'a UnixStream,
    until: std::time::Instant,
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self
            .until
            .saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "no complete request within {} s",
                    REQUEST_DEADLINE.as_secs()
                ),
            ));
        }
        self.s.set_read_timeout(Some(left))?;
        match self.s.read(buf) {
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock) => {
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "no complete request within {} s",
                        REQUEST_DEADLINE.as_secs()
                    ),
                ))
            }
            r => r,
        }
    }
}

/// Reads one request from `s`, all of it before `REQUEST_DEADLINE` has passed.
fn read_request(s: &UnixStream) -> Result<Received, String> {
    let mut r = BufReader::new(Deadline {
        s,
        until: std::time::Instant::now() + REQUEST_DEADLINE,
    });
    let mut line = Zeroizing::new(String::new());
    (&mut r)
        .take(MAX_LINE)
        .read_line(&mut line)
        .map_err(|e| format!("reading the request: {e}"))?;
    let body: Value =
        serde_json::from_str(line.trim()).map_err(|e| format!("malformed request: {e}"))?;
    let secret_len = body.get("secret_len").and_then(Value::as_u64);
    let volume_key = body.get("secret_kind").and_then(Value::as_str) == Some("volume_key");
    let request: Request =
        serde_json::from_value(body).map_err(|e| format!("malformed request: {e}"))?;
    let secret = match secret_len {
        None => None,
        Some(n) if n as usize > MAX_SECRET => return Err("secret too long".into()),
        Some(n) => {
            let mut buf = Zeroizing::new(vec![0u8; n as usize]);
            r.read_exact(&mut buf)
                .map_err(|e| format!("reading the secret: {e}"))?;
            Some(buf)
        }
    };
    Ok(Received {
        request,
        secret,
        volume_key,
    })
}

/// Serves requests on `listener` until `stop()` is true after a request (or the listener
/// fails). Each connection is read on a thread of its own, against a deadline, so an idle,
/// slow or hostile client delays nobody; complete requests are answered by `handle` one
/// at a time, in the order they were complete, on the calling thread.
pub fn serve(
    listener: UnixListener,
    mut handle: impl FnMut(Received) -> Reply,
    stop: impl Fn() -> bool,
) {
    let (tx, rx) = std::sync::mpsc::channel::<(UnixStream, Result<Received, Reply>)>();
    let stopping = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        // The accept loop owns the sender: once it has ended (the listener failed) and the
        // readers it started are done, `rx` ends too.
        let (listener, stopping) = (&listener, &stopping);
        let accept = sc.spawn(move || accept_loop(listener, tx, stopping));
        for (mut s, got) in &rx {
            let answer = match got {
                Ok(req) => handle(req),
                Err(refusal) => refusal,
            };
            answer_with(&mut s, &answer);
            drop(s);
            if stop() {
                break;
            }
        }
        stopping.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = accept.join();
    });
}

/// Writes `answer` as one JSON line (a client that never reads its answer cannot hold the
/// writer: the line fits the socket's buffer, and the write gives up after a while).
fn answer_with(s: &mut UnixStream, answer: &Reply) {
    let line = serde_json::to_string(answer).unwrap_or_else(|e| {
        format!(r#"{{"reply":"refused","kind":"invalid","message":"encoding the answer: {e}"}}"#)
    });
    let _ = s.set_write_timeout(Some(REQUEST_DEADLINE));
    let _ = writeln!(s, "{line}");
    let _ = s.flush();
}

/// Accepts connections until `stopping` (looked at every [`ACCEPT_POLL`]) or the listener
/// fails; checks each peer's credentials and hands the connection to a reader thread,
/// which sends what it read (or the refusal) to `tx`.
fn accept_loop(
    listener: &UnixListener,
    tx: std::sync::mpsc::Sender<(UnixStream, Result<Received, Reply>)>,
    stopping: &std::sync::atomic::AtomicBool,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    let readers = Arc::new(AtomicUsize::new(0));
    while !stopping.load(Ordering::SeqCst) {
        let mut s = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let mut fd = libc::pollfd {
                    fd: listener.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one pollfd that lives for the call.
                unsafe { libc::poll(&mut fd, 1, ACCEPT_POLL.as_millis() as libc::c_int) };
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        if s.set_nonblocking(false).is_err() {
            continue;
        }
        let refusal = match peer_uid(&s) {
            Ok(uid) if uid == me || uid == 0 => None,
            Ok(uid) => Some(refuse(
                ErrorKind::Permission,
                format!("uid {uid} may not control this instance"),
            )),
            Err(e) => Some(refuse(
                ErrorKind::Invalid,
                format!("reading peer credentials: {e}"),
            )),
        };
        if let Some(r) = refusal {
            answer_with(&mut s, &r);
            continue;
        }
        if readers.fetch_add(1, Ordering::SeqCst) >= MAX_READERS {
            readers.fetch_sub(1, Ordering::SeqCst);
            answer_with(
                &mut s,
                &refuse(
                    ErrorKind::Busy,
                    format!("{MAX_READERS} control requests are being read; try again"),
                ),
            );
            continue;
        }
        let (tx, readers2) = (tx.clone(), Arc::clone(&readers));
        let spawned = std::thread::Builder::new()
            .name("control-read".into())
            .stack_size(256 * 1024)
            .spawn(move || {
                let got = read_request(&s).map_err(|e| refuse(ErrorKind::Invalid, e));
                readers2.fetch_sub(1, Ordering::SeqCst);
                // The serving loop may be gone (stopping): then nobody answers.
                let _ = tx.send((s, got));
            });
        if spawned.is_err() {
            readers.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Why a request could not be made.
#[derive(Debug, thiserror::Error)]
#[error("talking to {path}")]
pub struct CallError {
    /// The control socket.
    pub path: String,
    /// The error.
    #[source]
    pub source: std::io::Error,
}

/// Sends `request` (with `secret` after it, if any) to the control socket at `path` and
/// returns the answer. `timeout` bounds the wait for the answer (a resume runs the KDF).
///
/// # Errors
/// The server is not there or the exchange failed.
pub fn call(
    path: &Path,
    request: &Request,
    secret: Option<&[u8]>,
    timeout: Duration,
) -> Result<Reply, CallError> {
    exchange(path, request, secret, false, timeout)
}

/// Like [`call`], with the volume key itself as the secret (`luksResume`, `resize`,
/// `refresh` of an instance opened from a LUKS header, once a token gave the key).
///
/// # Errors
/// As [`call`].
pub fn call_with_volume_key(
    path: &Path,
    request: &Request,
    key: &[u8],
    timeout: Duration,
) -> Result<Reply, CallError> {
    exchange(path, request, Some(key), true, timeout)
}

fn exchange(
    path: &Path,
    request: &Request,
    secret: Option<&[u8]>,
    volume_key: bool,
    timeout: Duration,
) -> Result<Reply, CallError> {
    let err = |source| CallError {
        path: path.display().to_string(),
        source,
    };
    let mut s = UnixStream::connect(path).map_err(err)?;
    s.set_read_timeout(Some(timeout)).map_err(err)?;
    let mut body = serde_json::to_value(request).map_err(|e| err(std::io::Error::other(e)))?;
    if let Some(sec) = secret {
        body["secret_len"] = Value::from(sec.len());
        if volume_key {
            body["secret_kind"] = Value::from("volume_key");
        }
    }
    let mut msg = body.to_string().into_bytes();
    msg.push(b'\n');
    s.write_all(&msg).map_err(err)?;
    if let Some(sec) = secret {
        s.write_all(sec).map_err(err)?;
    }
    s.flush().map_err(err)?;
    let mut line = String::new();
    BufReader::new(&s)
        .take(MAX_LINE)
        .read_line(&mut line)
        .map_err(err)?;
    if line.trim().is_empty() {
        return Err(err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the server closed the connection without answering",
        )));
    }
    serde_json::from_str(line.trim()).map_err(|e| err(std::io::Error::other(e)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The wire form: one JSON object per request, named by `op`, fields by name; replies
    /// named by `reply`. A client and a server of the same build agree by construction;
    /// these pin the names so a rename is a deliberate protocol change.
    #[test]
    fn requests_and_replies_have_their_wire_names() {
        let close = Request::Close {
            force: true,
            deferred: false,
        };
        assert_eq!(
            serde_json::to_string(&close).unwrap(),
            r#"{"op":"close","force":true,"deferred":false}"#
        );
        assert_eq!(close.op(), "close");
        for r in [
            Request::Status,
            close,
            Request::CancelDeferred,
            Request::Suspend,
            Request::Resume {
                link_vk_to_keyring: Some("@u::vk".into()),
            },
            Request::Resize { size: Some(8) },
            Request::Refresh {
                perf: PerfOptions {
                    write_order: ucrypt_engine::WriteOrder::Sorted,
                    workers: Some(3),
                    ..PerfOptions::default()
                },
                allow_discards: true,
            },
            Request::Reencrypt { hotzone: None },
            Request::ReencryptStop,
        ] {
            let text = serde_json::to_string(&r).unwrap();
            assert!(
                text.starts_with(&format!(r#"{{"op":"{}""#, r.op())),
                "{text}"
            );
            assert_eq!(serde_json::from_str::<Request>(&text).unwrap(), r);
        }
        let refused = refuse(ErrorKind::Busy, "in use");
        assert_eq!(
            serde_json::to_string(&refused).unwrap(),
            r#"{"reply":"refused","kind":"busy","message":"in use"}"#
        );
        let status = Reply::Status(Box::new(Status {
            reencryption: Some(Reencryption {
                state: PassState::Interrupted,
                done: 4096,
                size: 8192,
                error: None,
            }),
            ..Status::default()
        }));
        let text = serde_json::to_string(&status).unwrap();
        assert!(text.contains(r#""state":"interrupted""#), "{text}");
        assert!(
            text.contains(r#""type":"""#),
            "the description is flattened: {text}"
        );
        assert_eq!(serde_json::from_str::<Reply>(&text).unwrap(), status);
        // Unknown operations and fields of the wrong type are refused, not guessed.
        assert!(serde_json::from_str::<Request>(r#"{"op":"format"}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"resize","size":"big"}"#).is_err());
    }
}
