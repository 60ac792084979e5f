//! The control socket (`control.sock` in the instance directory): how `status`, `close`,
//! `luksSuspend`, `luksResume`, `resize` and `refresh` talk to a running server.
//!
//! One request per connection: a JSON object on one line (`{"op":"status"}`), followed, when
//! it carries `"secret_len": N`, by exactly N raw bytes (a passphrase or a table line with
//! its key: kept out of the JSON so it is never copied into a parser's strings, and read
//! into a zeroizing buffer). The answer is one JSON line: `{"ok":true,...}` or
//! `{"ok":false,"code":5,"error":"..."}` with a cryptsetup exit code.
//!
//! The socket is mode 0600 in a 0700 directory, and the server also checks the peer's
//! credentials (`SO_PEERCRED`): only its own user and root may talk to it.

use serde_json::{json, Value};
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

/// A request as the server sees it.
#[derive(Debug)]
pub struct Request {
    /// The JSON object.
    pub body: Value,
    /// The raw secret that followed, if any.
    pub secret: Option<Zeroizing<Vec<u8>>>,
}

impl Request {
    /// `body["op"]` as a string.
    pub fn op(&self) -> &str {
        self.body.get("op").and_then(Value::as_str).unwrap_or("")
    }
    /// A boolean field (absent: false).
    pub fn flag(&self, key: &str) -> bool {
        self.body.get(key).and_then(Value::as_bool).unwrap_or(false)
    }
}

/// A failed request's answer.
pub fn error(code: u8, message: impl std::fmt::Display) -> Value {
    json!({"ok": false, "code": code, "error": message.to_string()})
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

/// Reads one request from `s`.
fn read_request(s: &UnixStream) -> Result<Request, String> {
    let mut r = BufReader::new(s);
    let mut line = Zeroizing::new(String::new());
    (&mut r)
        .take(MAX_LINE)
        .read_line(&mut line)
        .map_err(|e| format!("reading the request: {e}"))?;
    let body: Value =
        serde_json::from_str(line.trim()).map_err(|e| format!("malformed request: {e}"))?;
    let secret = match body.get("secret_len").and_then(Value::as_u64) {
        None => None,
        Some(n) if n as usize > MAX_SECRET => return Err("secret too long".into()),
        Some(n) => {
            let mut buf = Zeroizing::new(vec![0u8; n as usize]);
            r.read_exact(&mut buf)
                .map_err(|e| format!("reading the secret: {e}"))?;
            Some(buf)
        }
    };
    Ok(Request { body, secret })
}

/// Serves requests on `listener` one at a time until `stop()` is true after a request (or
/// the listener fails). `handle` answers each.
pub fn serve(
    listener: UnixListener,
    mut handle: impl FnMut(Request) -> Value,
    stop: impl Fn() -> bool,
) {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    for conn in listener.incoming() {
        let Ok(mut s) = conn else { continue };
        let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
        let answer = match peer_uid(&s) {
            Ok(uid) if uid == me || uid == 0 => match read_request(&s) {
                Ok(req) => handle(req),
                Err(e) => error(1, e),
            },
            Ok(uid) => error(2, format!("uid {uid} may not control this instance")),
            Err(e) => error(1, format!("reading peer credentials: {e}")),
        };
        let _ = writeln!(s, "{answer}");
        let _ = s.flush();
        drop(s);
        if stop() {
            break;
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

/// Sends `body` (with `secret` after it, if any) to the control socket at `path` and
/// returns the answer. `timeout` bounds the wait for the answer (a resume runs the KDF).
///
/// # Errors
/// The server is not there or the exchange failed.
pub fn call(
    path: &Path,
    mut body: Value,
    secret: Option<&[u8]>,
    timeout: Duration,
) -> Result<Value, CallError> {
    let err = |source| CallError {
        path: path.display().to_string(),
        source,
    };
    let mut s = UnixStream::connect(path).map_err(err)?;
    s.set_read_timeout(Some(timeout)).map_err(err)?;
    if let Some(sec) = secret {
        body["secret_len"] = json!(sec.len());
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
