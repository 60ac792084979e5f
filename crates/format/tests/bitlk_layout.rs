//! BitLocker layouts read in pure Rust from the 21 images of cryptsetup's suite (testdata),
//! against what cryptsetup 2.6.1's `bitlkDump` printed for each (expectations.json,
//! `observed`): sector size, volume size, cipher, FVE metadata offsets, the volume
//! header's location and size, clear-key protectors, and which images cryptsetup refuses
//! to activate.

#![allow(clippy::unwrap_used)]

use std::process::Command;
use ucrypt_format::bitlk::Layout;

#[test]
fn every_suite_image_gives_the_layout_cryptsetup_prints() {
    let Some(base) = ucrypt_testkit::testdata("peer-tests/cryptsetup", "bitlk-images.tar.xz")
    else {
        return;
    };
    if !ucrypt_testkit::require("tar") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let st = Command::new("tar")
        .arg("xJSf")
        .arg(base.join("bitlk-images.tar.xz"))
        .arg("-C")
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(st.success(), "unpacking bitlk-images.tar.xz");
    let exp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(base.join("expectations.json")).unwrap())
            .unwrap();
    let mut checked = 0;
    for e in exp["entries"].as_array().unwrap() {
        if e["format"] != "bitlk" {
            continue;
        }
        let id = e["id"].as_str().unwrap();
        let o = &e["observed"];
        let l = Layout::read(&dir.path().join(e["image"].as_str().unwrap()))
            .unwrap_or_else(|err| panic!("{id}: {err}"));
        assert_eq!(u64::from(l.sector_size), o["sector_size"], "{id}");
        assert_eq!(l.volume_size, o["volume_size_bytes"], "{id}");
        assert_eq!(
            l.cipher,
            format!(
                "{}-{}",
                o["cipher_name"].as_str().unwrap(),
                o["cipher_mode"].as_str().unwrap()
            ),
            "{id}"
        );
        let fve: Vec<u64> = o["fve_metadata_offsets_bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(l.fve_offsets.to_vec(), fve, "{id}");
        assert_eq!(
            l.volume_header_offset, o["volume_header_offset_bytes"],
            "{id}"
        );
        assert_eq!(l.volume_header_size, o["volume_header_size_bytes"], "{id}");
        let clear = o["vmks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["protection"] == "clear key");
        assert_eq!(l.clear_key, clear, "{id}");
        // The two images cryptsetup refuses to activate (an encrypt-on-write volume and a
        // partially encrypted one; both carry the encrypt-on-write GUID) and only those.
        let refused = id.ends_with("-eow") || id.contains("partially");
        assert_eq!(l.activation_refusal().is_some(), refused, "{id}");
        assert_eq!(l.eow, refused, "{id}");
        checked += 1;
    }
    assert_eq!(checked, 21);
}
