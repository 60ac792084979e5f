//! The remote devices one header command stages: each URI staged once (the first time a
//! path of the command names it), every header reader of the command handed the same
//! local copy, and all of them written back when the command ends.
//!
//! ```text
//!  Staging::local_path(URI, copy) ─► RemoteHeader::stage (once per URI) ─► /proc/self/fd/N
//!  … libcryptsetup / the TCRYPT reader change the copy …
//!  Staging::write_back ─► RemoteHeader::write_back for each ─► the first failure
//! ```

use super::{is_remote, RemoteHeader};
use crate::error::{open_kind, Error, ErrorKind, Result};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// The staged remote devices of one command (a process-wide value: header commands reach
/// it from wherever they open a header).
#[derive(Debug, Default)]
pub struct Staging {
    staged: Mutex<Vec<RemoteHeader>>,
}

impl Staging {
    /// Nothing staged yet.
    pub const fn new() -> Staging {
        Staging {
            staged: Mutex::new(Vec::new()),
        }
    }

    fn staged(&self) -> MutexGuard<'_, Vec<RemoteHeader>> {
        self.staged.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `path` itself, or for a remote device (an NBD URI, `rbd:`) the path of its staged
    /// copy, staged the first time it is asked for; `copy` says whether its metadata is
    /// needed (a data device whose header is detached needs only its size).
    ///
    /// # Errors
    /// A memory device (`ram:`) asked for its header (it holds none: [`ErrorKind::Invalid`]);
    /// the server cannot be reached or read, or its header is implausible
    /// ([`ErrorKind::Device`]).
    pub fn local_path(&self, path: &Path, copy: bool) -> Result<PathBuf> {
        if !is_remote(path) {
            return Ok(path.to_path_buf());
        }
        let uri = path.display().to_string();
        if copy && crate::open::is_ram(&uri) {
            return Err(Error::Invalid(crate::header::ram_holds_no_header(&uri)));
        }
        let mut staged = self.staged();
        if let Some(r) = staged.iter().find(|r| r.uri() == uri) {
            return Ok(r.path().to_path_buf());
        }
        let r = RemoteHeader::stage(&uri, copy).map_err(|e| e.with_kind(ErrorKind::Device))?;
        let local = r.path().to_path_buf();
        staged.push(r);
        Ok(local)
    }

    /// Writes every staged device's changes back to its server
    /// ([`RemoteHeader::write_back`]) and forgets them: when the command ends (also when it
    /// failed, as libcryptsetup's writes would stay on a local disk), or before a command
    /// goes on through the data path.
    ///
    /// # Errors
    /// The first write-back that failed ([`ErrorKind::Busy`] when the device is held by
    /// someone else, else [`ErrorKind::Device`]); the others are still attempted.
    pub fn write_back(&self) -> Result<()> {
        let staged = std::mem::take(&mut *self.staged());
        let mut first = None;
        for r in staged {
            if let Err(e) = r.write_back() {
                first.get_or_insert(e);
            }
        }
        match first {
            Some(e) => {
                let kind = if open_kind(&e) == ErrorKind::Busy {
                    ErrorKind::Busy
                } else {
                    ErrorKind::Device
                };
                Err(e.with_kind(kind))
            }
            None => Ok(()),
        }
    }

    /// `text` (libcryptsetup's dump, which names the device it read) with the path of
    /// every staged device replaced by its URI.
    pub fn shown(&self, mut text: String) -> String {
        for r in self.staged().iter() {
            let path = r.path().display().to_string();
            if text.contains(&path) {
                text = text.replace(&path, r.uri());
            }
        }
        text
    }
}
