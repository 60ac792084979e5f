//! Kernel golden vectors: ciphertext written by the real Linux dm-crypt (6.1) for every
//! accepted case of `testdata/golden/manifest.jsonl`, checked in both directions, as one
//! run, one sector at a time and in uneven chunks. Under CI a missing vector directory
//! fails; locally it skips with a message.

#![allow(clippy::unwrap_used)]

use std::io::Read;
use ucrypt_crypto::testing::{check, golden_dir, pattern_v1};
use ucrypt_crypto::{CipherSpec, Sector512, SectorParams, SectorSize, VolumeKey};

fn params(case: &serde_json::Value) -> SectorParams {
    let opts = case["opt_params"].as_str().unwrap_or("");
    let mut p = SectorParams {
        iv_offset: case["iv_offset"].as_u64().unwrap(),
        ..Default::default()
    };
    for o in opts.split_whitespace().skip(1) {
        if let Some(n) = o.strip_prefix("sector_size:") {
            p.sector_size = SectorSize::new(n.parse().unwrap()).unwrap();
        } else if o == "iv_large_sectors" {
            p.iv_large_sectors = true;
        }
    }
    p
}

#[test]
fn every_accepted_kernel_case_matches_in_both_directions() {
    let Some(dir) = golden_dir() else { return };
    let manifest = std::fs::read_to_string(dir.join("manifest.jsonl")).unwrap();
    let mut failures = Vec::new();
    let mut checked = 0;
    for line in manifest.lines() {
        let case: serde_json::Value = serde_json::from_str(line).unwrap();
        if case["result"] != "ok" {
            continue;
        }
        let name = case["name"].as_str().unwrap();
        let mut ct = Vec::new();
        let gz = std::fs::File::open(dir.join(case["ciphertext_file"].as_str().unwrap())).unwrap();
        flate2::read::GzDecoder::new(gz)
            .read_to_end(&mut ct)
            .unwrap();
        let plain = pattern_v1(Sector512(0), case["sectors"].as_u64().unwrap());
        let built = case["cipher"]
            .as_str()
            .unwrap()
            .parse::<CipherSpec>()
            .and_then(|s| {
                s.build(
                    &VolumeKey::from_hex(case["key_hex"].as_str().unwrap())?,
                    params(&case),
                )
            });
        match built {
            Err(e) => failures.push(format!("{name}: refused: {e}")),
            Ok(c) => {
                for f in check(&*c, Sector512(0), &plain, &ct) {
                    failures.push(format!("{name}: {f}"));
                }
                // A run that starts mid-volume must agree with the whole-volume ciphertext.
                let unit = c.sector_size().sectors512();
                let from = (case["sectors"].as_u64().unwrap() / 2 / unit) * unit;
                let at = (from * 512) as usize;
                for f in check(&*c, Sector512(from), &plain[at..], &ct[at..]) {
                    failures.push(format!("{name} from sector {from}: {f}"));
                }
            }
        }
        checked += 1;
    }
    assert!(checked >= 40, "only {checked} accepted cases found");
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!("{checked} kernel cases match");
}
