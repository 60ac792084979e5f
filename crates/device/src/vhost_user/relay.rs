//! The VM's control connection, passed message by message to the `vhost-user-backend`
//! daemon over a socket pair, with the few messages that library cannot handle answered
//! here:
//!
//! - `GET_INFLIGHT_FD` / `SET_INFLIGHT_FD` (inflight I/O tracking, `inflight.rs`): the
//!   library refuses both and has no hook for them;
//! - `SET_VRING_KICK`: passed on, then the queue is kicked once, so that a new back end
//!   resubmits what a dead one left in flight without waiting for the guest's next request
//!   (as QEMU's libvhost-user does);
//! - `SET_BACKEND_REQ_FD`: passed on, and a copy of the channel kept, on which
//!   [`Session::config_changed`] sends `VHOST_USER_BACKEND_CONFIG_CHANGE_MSG` (the
//!   library's `Backend` cannot send that message).
//!
//! Only the control messages pass here; the data moves through shared memory and eventfds
//! as before. Wire format (vhost-user.rst, "Message Specification"): a 12-byte header
//! (`request: u32, flags: u32, size: u32`, little-endian), `size` bytes of payload, file
//! descriptors as `SCM_RIGHTS` on the header.

use super::inflight::Region;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

const SET_VRING_KICK: u32 = 12;
const SET_BACKEND_REQ_FD: u32 = 21;
const GET_INFLIGHT_FD: u32 = 31;
const SET_INFLIGHT_FD: u32 = 32;
/// Back end to front end: the configuration space changed.
const BACKEND_CONFIG_CHANGE_MSG: u32 = 2;

const VERSION: u32 = 0x1;
const REPLY: u32 = 0x4;
const NEED_REPLY: u32 = 0x8;
/// `SET_VRING_KICK`'s payload: no file descriptor comes with it (polling mode).
const VRING_NOFD: u64 = 0x100;

/// Larger payloads than any message of the protocol are a broken peer.
const MAX_PAYLOAD: u32 = 4096;
/// File descriptors one message may carry (the memory table's regions).
const MAX_FDS: usize = 32;

/// What one VM connection's relay shares with its device and the attachment.
#[derive(Debug, Default)]
pub(crate) struct Session {
    inflight: Mutex<Option<Arc<Region>>>,
    backend_channel: Mutex<Option<UnixStream>>,
}

impl Session {
    /// The inflight region the VM handed over, if any.
    pub(super) fn inflight(&self) -> Option<Arc<Region>> {
        lock(&self.inflight).clone()
    }

    /// Whether the VM gave a back-end channel ([`Session::config_changed`] can work).
    pub(super) fn has_backend_channel(&self) -> bool {
        lock(&self.backend_channel).is_some()
    }

    /// Tells the VM to read the configuration space again (a new capacity). `false` when
    /// the VM gave no back-end channel to say it on.
    pub(super) fn config_changed(&self) -> io::Result<bool> {
        let mut ch = lock(&self.backend_channel);
        let Some(s) = ch.as_mut() else {
            return Ok(false);
        };
        s.write_all(&header(BACKEND_CONFIG_CHANGE_MSG, VERSION, 0))?;
        Ok(true)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn header(request: u32, flags: u32, size: u32) -> [u8; 12] {
    let mut h = [0u8; 12];
    h[0..4].copy_from_slice(&request.to_le_bytes());
    h[4..8].copy_from_slice(&flags.to_le_bytes());
    h[8..12].copy_from_slice(&size.to_le_bytes());
    h
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// One message as read.
struct Message {
    request: u32,
    flags: u32,
    payload: Vec<u8>,
    fds: Vec<OwnedFd>,
}

/// Reads one message; `None` at the end of the stream.
fn read_message(s: &mut UnixStream) -> io::Result<Option<Message>> {
    let mut h = [0u8; 12];
    let mut raw: [RawFd; MAX_FDS] = [-1; MAX_FDS];
    let mut iov = [libc::iovec {
        iov_base: h.as_mut_ptr().cast(),
        iov_len: h.len(),
    }];
    // SAFETY: the iovec points at `h`, which may take any bytes.
    let (n, nfds) = unsafe { s.recv_with_fds(&mut iov, &mut raw) }
        .map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
    let fds: Vec<OwnedFd> = raw[..nfds]
        .iter()
        // SAFETY: received just now; ours to close.
        .map(|&fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect();
    if n == 0 {
        return Ok(None);
    }
    if n < h.len() {
        s.read_exact(&mut h[n..])?;
    }
    let size = le32(&h, 8);
    if size > MAX_PAYLOAD {
        return Err(io::Error::other(format!(
            "a {size}-byte vhost-user message"
        )));
    }
    let mut payload = vec![0u8; size as usize];
    s.read_exact(&mut payload)?;
    Ok(Some(Message {
        request: le32(&h, 0),
        flags: le32(&h, 4),
        payload,
        fds,
    }))
}

/// Writes one message whole, with its file descriptors.
fn write_message(s: &UnixStream, m: &Message) -> io::Result<()> {
    let mut bytes = Vec::with_capacity(12 + m.payload.len());
    bytes.extend_from_slice(&header(m.request, m.flags, m.payload.len() as u32));
    bytes.extend_from_slice(&m.payload);
    let fds: Vec<RawFd> = m.fds.iter().map(std::os::fd::AsRawFd::as_raw_fd).collect();
    let n = s
        .send_with_fds(&[&bytes[..]], &fds)
        .map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
    if n < bytes.len() {
        (&*s).write_all(&bytes[n..])?;
    }
    Ok(())
}

/// Runs the relay between the VM (`front`) and the daemon (`back`) until either side
/// closes; then both are shut.
pub(super) fn run(front: UnixStream, back: UnixStream, session: &Arc<Session>) {
    let (Ok(front_w), Ok(back_r)) = (front.try_clone(), back.try_clone()) else {
        let _ = front.shutdown(std::net::Shutdown::Both);
        let _ = back.shutdown(std::net::Shutdown::Both);
        return;
    };
    // Replies reach the VM whole, from either thread.
    let to_front = Arc::new(Mutex::new(front_w));
    let replies = {
        let to_front = Arc::clone(&to_front);
        std::thread::Builder::new()
            .name("vhost-user-reply".into())
            .spawn(move || {
                let mut back_r = back_r;
                while let Ok(Some(m)) = read_message(&mut back_r) {
                    if write_message(&lock(&to_front), &m).is_err() {
                        break;
                    }
                }
                let _ = lock(&to_front).shutdown(std::net::Shutdown::Both);
                let _ = back_r.shutdown(std::net::Shutdown::Both);
            })
    };
    let mut front = front;
    loop {
        let m = match read_message(&mut front) {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(e) => {
                eprintln!("ucrypt: vhost-user: reading the VM's message: {e}");
                break;
            }
        };
        let r = match m.request {
            GET_INFLIGHT_FD => get_inflight(&m, session, &to_front),
            SET_INFLIGHT_FD => set_inflight(&m, session, &to_front),
            _ => forward(m, session, &back),
        };
        if let Err(e) = r {
            eprintln!("ucrypt: vhost-user: {e}");
            break;
        }
    }
    let _ = back.shutdown(std::net::Shutdown::Both);
    let _ = front.shutdown(std::net::Shutdown::Both);
    if let Ok(t) = replies {
        let _ = t.join();
    }
}

/// Passes `m` to the daemon, keeping what the session needs of it.
fn forward(m: Message, session: &Session, back: &UnixStream) -> io::Result<()> {
    let kick = match m.request {
        SET_VRING_KICK if m.payload.len() >= 8 && le64(&m.payload, 0) & VRING_NOFD == 0 => {
            m.fds.first().map(OwnedFd::try_clone).transpose()?
        }
        SET_BACKEND_REQ_FD => {
            if let Some(fd) = m.fds.first() {
                *lock(&session.backend_channel) = Some(UnixStream::from(fd.try_clone()?));
            }
            None
        }
        _ => None,
    };
    write_message(back, &m)?;
    if let Some(kick) = kick {
        // An eventfd counts: the queue's thread sees it once it watches the fd.
        File::from(kick).write_all(&1u64.to_ne_bytes())?;
    }
    Ok(())
}

/// The reply to a request of `m`'s kind.
fn reply(m: &Message, payload: Vec<u8>, fds: Vec<OwnedFd>) -> Message {
    Message {
        request: m.request,
        flags: VERSION | REPLY,
        payload,
        fds,
    }
}

/// `GET_INFLIGHT_FD` (payload `mmap_size: u64, mmap_offset: u64, num_queues: u16,
/// queue_size: u16`): a new zeroed region for the queues asked for, kept as the session's.
fn get_inflight(m: &Message, session: &Session, to_front: &Mutex<UnixStream>) -> io::Result<()> {
    if m.payload.len() < 20 {
        return Err(io::Error::other("a short GET_INFLIGHT_FD"));
    }
    let queues = u16::from_le_bytes([m.payload[16], m.payload[17]]);
    let queue_size = u16::from_le_bytes([m.payload[18], m.payload[19]]);
    let mut payload = m.payload.clone();
    let fds = match Region::create(queues, queue_size) {
        Ok((file, region)) => {
            let size = usize::from(queues) * super::inflight::queue_bytes(queue_size);
            payload[0..8].copy_from_slice(&(size as u64).to_le_bytes());
            *lock(&session.inflight) = Some(Arc::new(region));
            vec![OwnedFd::from(file)]
        }
        Err(e) => {
            // A size of zero tells the VM there is no region: it goes on without one.
            eprintln!("ucrypt: vhost-user: no inflight region: {e}");
            payload[0..8].copy_from_slice(&0u64.to_le_bytes());
            Vec::new()
        }
    };
    payload[8..16].copy_from_slice(&0u64.to_le_bytes());
    write_message(&lock(to_front), &reply(m, payload, fds))
}

/// `SET_INFLIGHT_FD`: the region (this back end's, or a dead one's) to track requests in.
fn set_inflight(m: &Message, session: &Session, to_front: &Mutex<UnixStream>) -> io::Result<()> {
    if m.payload.len() < 20 {
        return Err(io::Error::other("a short SET_INFLIGHT_FD"));
    }
    let size = le64(&m.payload, 0);
    let offset = le64(&m.payload, 8);
    let queues = u16::from_le_bytes([m.payload[16], m.payload[17]]);
    let queue_size = u16::from_le_bytes([m.payload[18], m.payload[19]]);
    let mapped = match m.fds.first() {
        Some(fd) => File::from(fd.try_clone()?),
        None => return Err(io::Error::other("SET_INFLIGHT_FD without its file")),
    };
    let region = usize::try_from(size)
        .map_err(io::Error::other)
        .and_then(|len| Region::map(&mapped, len, offset, queues, queue_size));
    let ok = match region {
        Ok(r) => {
            *lock(&session.inflight) = Some(Arc::new(r));
            true
        }
        Err(e) => {
            eprintln!("ucrypt: vhost-user: the VM's inflight region: {e}");
            false
        }
    };
    if m.flags & NEED_REPLY != 0 {
        let status: u64 = if ok { 0 } else { 1 };
        write_message(
            &lock(to_front),
            &reply(m, status.to_le_bytes().to_vec(), Vec::new()),
        )?;
    }
    Ok(())
}
