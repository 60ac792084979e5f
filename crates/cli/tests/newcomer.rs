//! What a newcomer meets first: `ucrypt demo` (the README's main job), the order and
//! groups of `--help`, the values completions offer, and the texts of the prompts a
//! cryptsetup user reads.

#![allow(clippy::unwrap_used)]

mod common;
use common::*;

#[test]
fn demo_opens_writes_reads_and_closes_a_volume() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let dir = tmp.path().join("demo");
    let out = ucrypt_env(
        &["demo", "--dir", dir.to_str().unwrap()],
        b"",
        &[("UCRYPT_RUNTIME_DIR", run.as_os_str())],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for shown in [
        "$ ucrypt luksFormat",
        "$ ucrypt open",
        "wrote and read back: Hello from ucrypt",
        "does not contain the text",
        "$ ucrypt status",
        "front end:",
        "$ ucrypt close",
        "The binary is ",
        "ucrypt open ",
    ] {
        assert!(stdout.contains(shown), "no {shown:?} in:\n{stdout}");
    }
    // The image is a LUKS2 volume that stays for the next commands; the instance is gone.
    assert!(dir.join("disk.img").exists());
    ok(ucrypt(
        &[
            "isLuks",
            "--type",
            "luks2",
            dir.join("disk.img").to_str().unwrap(),
        ],
        b"",
    ));
    let left: Vec<_> = std::fs::read_dir(&run)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| !n.to_string_lossy().starts_with('.'))
        .collect();
    assert!(left.is_empty(), "instances left behind: {left:?}");
}
