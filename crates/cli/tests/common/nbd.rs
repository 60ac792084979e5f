//! Helpers for the NBD interop tests: peer-tool requirements (nbdkit's `requires`), a
//! served table (`ucrypt open`), and table lines with fresh keys.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// The workspace's skip rule and OS randomness (`ucrypt-testkit`), for the tests that
/// import this module alone.
#[allow(unused_imports)] // not every test binary uses each
pub use ucrypt_testkit::{random_bytes, require};

/// A table line for `img` (all of it) with a fresh 512-bit aes-xts-plain64 key, written to
/// a file so the key never appears on a command line. Returns (line, table file).
pub fn xts_table(
    dir: &Path,
    img: &Path,
    sector_size: u32,
    extra_opts: &[&str],
) -> (String, PathBuf) {
    let sectors = std::fs::metadata(img).unwrap().len() / 512;
    let key = hex::encode(random_bytes(64));
    let mut opts = vec![format!("sector_size:{sector_size}")];
    opts.extend(extra_opts.iter().map(|s| s.to_string()));
    let line = format!(
        "0 {sectors} crypt aes-xts-plain64 {key} 0 {} 0 {} {}",
        img.display(),
        opts.len(),
        opts.join(" ")
    );
    let file = dir.join(format!(
        "{}.table",
        img.file_name().unwrap().to_string_lossy()
    ));
    std::fs::write(&file, &line).unwrap();
    (line, file)
}

/// `ucrypt open --table-file T --run CMD [args]`: the server lives exactly as long as CMD.
pub fn open_run(table_file: &Path, cmd: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ucrypt"))
        .args(["open", "--table-file"])
        .arg(table_file)
        .args(args)
        .args(["--run", cmd])
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Asserts a `--run` finished with status 0, showing its output otherwise.
pub fn run_ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A `ucrypt open` in the background, ready (its URI line read); SIGTERM on drop.
pub struct Served {
    pub child: Child,
    pub uri: String,
}

impl Served {
    /// Starts `ucrypt open --table-file T ARGS` and waits for the URI line on stdout.
    pub fn start(table_file: &Path, args: &[&str]) -> Served {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ucrypt"))
            .args(["open", "--table-file"])
            .arg(table_file)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("nbd"), "no URI on stdout: {line:?}");
        Served {
            child,
            uri: line.trim().to_string(),
        }
    }

    /// Sends SIGTERM and waits: the exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
        self.terminate()
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        // SAFETY: kill(2) on our own child, which has not been reaped yet.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        self.child.wait().unwrap()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.terminate();
        }
    }
}

/// The plaintext view through ucrypt's own offline read path (`ucrypt read`).
pub fn ucrypt_read(table_file: &Path) -> Vec<u8> {
    let out = Command::new(env!("CARGO_BIN_EXE_ucrypt"))
        .args(["read", "--table-file"])
        .arg(table_file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Runs a shell command, returning its output.
pub fn sh(cmd: &str) -> Output {
    Command::new("sh").args(["-c", cmd]).output().unwrap()
}
