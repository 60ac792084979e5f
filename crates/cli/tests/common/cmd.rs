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

/// Runs `cmd` (program, arguments, directory and environment already set) with `stdin`
/// fed from a thread (so a child that writes much before reading cannot deadlock); its
/// output, whatever the exit status.
pub fn piped(cmd: &mut Command, stdin: &[u8]) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{:?}: {e}", cmd.get_program()));
    let mut sin = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    let feeder = std::thread::spawn(move || {
        let _ = std::io::Write::write_all(&mut sin, &data);
    });
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    out
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
