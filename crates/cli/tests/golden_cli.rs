//! Every kernel golden case end to end through the `ucrypt` binary: `ucrypt write` of the
//! pattern into a zeroed image gives the kernel's ciphertext at the table's offset and leaves
//! every other byte zero; `ucrypt read` of the kernel's ciphertext gives the pattern back;
//! every table the kernel rejected makes `ucrypt read` exit non-zero with one line on stderr.

#![allow(clippy::unwrap_used)]

mod common;
use common::*;

#[test]
fn write_then_compare_with_kernel_ciphertext_for_every_case() {
    let Some(dir) = golden_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for case in cases(&dir).iter().filter(|c| c["result"] == "ok") {
        let name = case["name"].as_str().unwrap();
        let sectors = case["sectors"].as_u64().unwrap();
        let offset = case["offset_sectors"].as_u64().unwrap();
        let total = (offset + sectors + 16) * 512;
        let img = image(tmp.path(), &format!("{name}.img"), total);
        let table = case["table"]
            .as_str()
            .unwrap()
            .replace("/dev/ram0", img.to_str().unwrap());
        let out = ucrypt(&["write", "--table", &table], &pattern(sectors));
        if !out.status.success() {
            failures.push(format!(
                "{name}: write failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
            continue;
        }
        let disk = std::fs::read(&img).unwrap();
        let (lo, hi) = ((offset * 512) as usize, ((offset + sectors) * 512) as usize);
        if disk[lo..hi] != ciphertext(&dir, case)[..] {
            failures.push(format!("{name}: ciphertext differs from the kernel's"));
        }
        if disk[..lo].iter().chain(&disk[hi..]).any(|&b| b != 0) {
            failures.push(format!("{name}: bytes outside the mapping changed"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn read_of_kernel_ciphertext_gives_the_pattern_for_every_case() {
    let Some(dir) = golden_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for case in cases(&dir).iter().filter(|c| c["result"] == "ok") {
        let name = case["name"].as_str().unwrap();
        let sectors = case["sectors"].as_u64().unwrap();
        let offset = case["offset_sectors"].as_u64().unwrap();
        let mut disk = vec![0u8; ((offset + sectors) * 512) as usize];
        disk[(offset * 512) as usize..].copy_from_slice(&ciphertext(&dir, case));
        let img = tmp.path().join(format!("{name}.img"));
        std::fs::write(&img, &disk).unwrap();
        let table = case["table"]
            .as_str()
            .unwrap()
            .replace("/dev/ram0", img.to_str().unwrap());
        let out = ucrypt(&["read", "--table", &table], b"");
        if !out.status.success() {
            failures.push(format!(
                "{name}: read failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        } else if out.stdout != pattern(sectors) {
            failures.push(format!("{name}: plaintext differs"));
        }
        // An unaligned slice in the middle reads the same bytes.
        let (at, len) = (777u64, 5000u64.min(sectors * 512 - 777));
        let out = ucrypt(
            &[
                "read",
                "--table",
                &table,
                "--offset",
                &at.to_string(),
                "--length",
                &len.to_string(),
            ],
            b"",
        );
        if out.stdout[..] != pattern(sectors)[at as usize..(at + len) as usize] {
            failures.push(format!("{name}: unaligned read differs"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn unaligned_writes_in_pieces_give_the_kernel_ciphertext() {
    let Some(dir) = golden_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    for name in [
        "aes-xts-plain64-k512-ss4096",
        "aes-cbc-essiv-sha256-k256",
        "aes-cbc-lmk-k256",
    ] {
        let case = cases(&dir).into_iter().find(|c| c["name"] == name).unwrap();
        let sectors = case["sectors"].as_u64().unwrap();
        let img = image(tmp.path(), "pieces.img", sectors * 512);
        let table = case["table"]
            .as_str()
            .unwrap()
            .replace("/dev/ram0", img.to_str().unwrap());
        let plain = pattern(sectors);
        // Odd-sized pieces at odd offsets, out of order: every edge is a read-modify-write.
        let cuts = [0usize, 1, 700, 4095, 4097, 9000, 70001, plain.len()];
        for w in cuts.windows(2).rev() {
            let off = w[0].to_string();
            ok(ucrypt(
                &["write", "--table", &table, "--offset", &off],
                &plain[w[0]..w[1]],
            ));
        }
        assert!(
            std::fs::read(&img).unwrap() == ciphertext(&dir, &case),
            "{name}"
        );
    }
}

#[test]
fn rejected_tables_exit_nonzero_with_one_line() {
    let Some(dir) = golden_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let img = image(tmp.path(), "r.img", 1 << 20);
    for case in cases(&dir).iter().filter(|c| c["result"] == "rejected") {
        let table = case["table"]
            .as_str()
            .unwrap()
            .replace("/dev/ram0", img.to_str().unwrap());
        let out = ucrypt(&["read", "--table", &table, "--length", "512"], b"");
        let all = String::from_utf8_lossy(&out.stderr);
        // --table warns that the key is on the command line; the error is the one other line.
        let err: String = all
            .lines()
            .filter(|l| !l.starts_with("ucrypt: warning: --table puts the key"))
            .collect();
        assert_eq!(out.status.code(), Some(1), "{}: {all}", case["name"]);
        assert_eq!(all.lines().count(), 2, "{}: {all}", case["name"]);
        assert!(err.starts_with("ucrypt: "), "{err}");
        assert!(out.stdout.is_empty());
    }
}
