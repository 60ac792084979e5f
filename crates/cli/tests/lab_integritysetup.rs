//! `ucrypt integritysetup open DEV NAME --device ublk` and `status NAME` against Linux's
//! dm-integrity and integritysetup 2.6.1, in one boot of the repository's VM harness
//! (`tests/lab/integrity_status.sh`): for 8 MiB devices of modes J, D and B, keyed tags
//! with a journal MAC and 4096-byte blocks, and an encrypted journal with its watermark
//! and commit time, integritysetup formats and opens each and prints its status (which
//! must still be what testdata/integrity/status holds), then ucrypt serves the same image
//! over ublk and prints the same lines (the device aside: the image itself, where
//! integritysetup names its loop device, then the image). A tag byte flipped: reading that
//! block through `/dev/ublkbN` fails, the next block reads, and `failures: 1` is shown.
//!
//! Skipped with a message when `CI` is unset and the guest cannot start; fails under `CI`.

#![allow(clippy::unwrap_used)]

const MODES: [&str; 5] = ["J", "D", "B", "hmac-jmac", "jc"];

/// The status lines without the device and loop lines and the table.
fn without_device(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| {
            !l.starts_with("  device:  ") && !l.starts_with("  loop:    ") && !l.starts_with("0 ")
        })
        .collect()
}

#[test]
fn integritysetup_status_and_ublk_match_linux() {
    let root = ucrypt_testkit::repo_root();
    let out_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let out = out_dir.path();
    let Some(log) = ucrypt_testkit::run_in_vm(
        &root.join("tests/lab/integrity_status.sh"),
        [
            out.display().to_string(),
            env!("CARGO_BIN_EXE_ucrypt").to_string(),
        ],
        &[("LAB_TIMEOUT", "900")],
    ) else {
        return;
    };
    assert!(log.lines().any(|l| l == "8 passed, 0 failed"), "{log}");
    for mode in MODES {
        let kernel = std::fs::read_to_string(out.join(format!("{mode}.kernel"))).unwrap();
        let committed = std::fs::read_to_string(
            root.join("testdata/integrity/status")
                .join(format!("{mode}.txt")),
        )
        .unwrap();
        assert_eq!(
            without_device(&kernel),
            without_device(&committed),
            "{mode}: integritysetup printed something else than testdata/integrity/status"
        );
        let ours = std::fs::read_to_string(out.join(format!("{mode}.ucrypt"))).unwrap();
        let want: Vec<String> = without_device(&kernel)
            .iter()
            .map(|l| l.replace(&format!("/dev/mapper/k{mode}"), &format!("u{mode}")))
            .collect();
        assert_eq!(without_device(&ours), want, "{mode}");
        let device = format!("  device:  /dev/shm/istatus/{mode}.img");
        assert!(ours.lines().any(|l| l == device), "{mode}: {ours}");
    }
    let tamper = std::fs::read_to_string(out.join("tamper.ucrypt")).unwrap();
    assert!(tamper.contains("\n  failures: 1\n"), "{tamper}");
}
