//! systemd's readiness protocol (`sd_notify(3)`), written out: one datagram of
//! `KEY=VALUE` lines to the unix socket `$NOTIFY_SOCKET` names (a path, or `@NAME` in the
//! abstract namespace). A service of `Type=notify` is started once `READY=1` arrives.
//! Hand-written rather than a crate: it is one `sendto`, and libsystemd is not linked.

use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Sends `state` (`READY=1`, `STATUS=...`, `STOPPING=1`, newline-separated) to the service
/// manager. `Ok(false)` when no manager listens (`$NOTIFY_SOCKET` unset): not an error.
///
/// # Errors
/// `$NOTIFY_SOCKET` is set but cannot be reached.
pub fn notify(state: &str) -> std::io::Result<bool> {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    send(&socket, state).map(|()| true)
}

/// Sends `state` to the socket `$NOTIFY_SOCKET` names (`socket`).
fn send(socket: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    let bytes = std::os::unix::ffi::OsStrExt::as_bytes(socket);
    let addr = match bytes.split_first() {
        Some((b'@', name)) => {
            <SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(name)?
        }
        Some((b'/', _)) => SocketAddr::from_pathname(socket)?,
        _ => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "NOTIFY_SOCKET is neither a path nor an abstract socket (@NAME)",
            ))
        }
    };
    let sock = UnixDatagram::unbound()?;
    sock.send_to_addr(state.as_bytes(), &addr)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_to_a_path_and_an_abstract_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        let name = format!("ucrypt-notify-test-{}", std::process::id());
        let abs =
            <SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(name.as_bytes())
                .unwrap();
        let rx2 = UnixDatagram::bind_addr(&abs).unwrap();
        // `send`, not `notify`: setting the process's environment while other tests'
        // threads may read it from C (getenv) is not safe.
        assert!(send(path.as_os_str(), "READY=1\nSTATUS=up").is_ok());
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=up");
        assert!(send(format!("@{name}").as_ref(), "STOPPING=1").is_ok());
        let n = rx2.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
        let e = send("relative".as_ref(), "READY=1").unwrap_err();
        assert!(e.to_string().contains("neither a path"), "{e}");
    }
}
