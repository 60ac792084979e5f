//! A private runtime directory for the tests of named instances: every server still
//! running in it is killed, and its FUSE mount detached, when the test ends (also when it
//! fails). The test files add their own ways to run ucrypt in it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A temporary directory; `dir()` is the runtime directory (`UCRYPT_RUNTIME_DIR`).
pub struct Runtime {
    tmp: tempfile::TempDir,
}

impl Runtime {
    #[allow(clippy::unwrap_used)]
    pub fn new() -> Runtime {
        Runtime {
            tmp: tempfile::tempdir().unwrap(),
        }
    }
    pub fn dir(&self) -> PathBuf {
        self.tmp.path().join("run")
    }
    /// The temporary directory that holds the runtime directory and the test's files.
    pub fn root(&self) -> &Path {
        self.tmp.path()
    }
    /// A file beside the runtime directory (images, keys, tables).
    pub fn path(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let Ok(rd) = std::fs::read_dir(self.dir()) else {
            return;
        };
        for e in rd.flatten() {
            let pid = std::fs::read_to_string(e.path().join("pid")).unwrap_or_default();
            if let Ok(pid) = pid.trim().parse::<i32>() {
                // SAFETY: kill(2) with a pid this test's servers wrote; no memory involved.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            // Not `exists()`: the mount of a killed server fails stat with ENOTCONN.
            let _ = Command::new("umount")
                .arg("-l")
                .arg(e.path().join("fuse"))
                .stderr(Stdio::null())
                .status();
        }
    }
}
