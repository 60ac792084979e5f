//! Running the peers (cryptsetup, strace, ...) and ucrypt by path from the reencryption tests.
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// Runs `cmd args` with no stdin; its output, whatever the exit status.
pub fn run(cmd: &str, args: &[&str]) -> Output {
    Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"))
}

/// As [`run`], asserting success (the message holds both output streams).
pub fn ok(cmd: &str, args: &[&str]) -> Output {
    let out = run(cmd, args);
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A path as the `&str` argument lists take.
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}
