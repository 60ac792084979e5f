//! Kernel golden tables: every accepted line parses, builds, and prints back exactly as the
//! kernel printed it (`dmsetup table --showkeys`, device shown as major:minor); every line
//! the kernel rejected is refused with an error naming the problem. The ciphertext side is
//! checked in ucrypt-crypto's `tests/golden.rs` and end to end in the `ucrypt` CLI tests.

#![allow(clippy::unwrap_used)]

use ucrypt_format::{TableLine, ValidateOptions};

fn manifest() -> Option<Vec<serde_json::Value>> {
    let dir = ucrypt_crypto::testing::golden_dir()?;
    let text = std::fs::read_to_string(dir.join("manifest.jsonl")).unwrap();
    Some(
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect(),
    )
}

#[test]
fn accepted_tables_print_back_as_the_kernel_did() {
    let Some(cases) = manifest() else { return };
    let mut failures = Vec::new();
    for case in cases.iter().filter(|c| c["result"] == "ok") {
        let name = case["name"].as_str().unwrap();
        let table = case["table"].as_str().unwrap().replace("/dev/ram0", "1:0");
        let t: TableLine = match table.parse() {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{name}: parse: {e}"));
                continue;
            }
        };
        if let Err(e) = t.build_cipher(ValidateOptions::default()) {
            failures.push(format!("{name}: build: {e}"));
        }
        let want = case["kernel_table"].as_str().unwrap();
        let got = t.to_line(true);
        if got != want {
            failures.push(format!("{name}:\n  got  {got}\n  want {want}"));
        }
        assert!(
            !t.to_string().contains(case["key_hex"].as_str().unwrap()) || case["key_hex"] == "-"
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn rejected_tables_are_refused_with_a_reason() {
    let Some(cases) = manifest() else { return };
    let mut accepted = Vec::new();
    let mut n = 0;
    for case in cases.iter().filter(|c| c["result"] == "rejected") {
        let name = case["name"].as_str().unwrap();
        let table = case["table"]
            .as_str()
            .unwrap()
            .replace("/dev/ram0", "disk.img");
        let result = table
            .parse::<TableLine>()
            .and_then(|t| t.build_cipher(ValidateOptions::default()).map(|_| ()));
        match result {
            Ok(()) => accepted.push(name.to_string()),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.len() > 10, "{name}: error too terse: {msg}");
                eprintln!("{name}: {msg}  (kernel: {})", case["kernel_messages"][0]);
            }
        }
        n += 1;
    }
    assert!(n >= 10, "only {n} rejected cases");
    assert!(
        accepted.is_empty(),
        "accepted what the kernel refused: {accepted:?}"
    );
}
