//! FileVault2 metadata read in pure Rust from cryptsetup's suite image (testdata), against
//! the fields cryptsetup 2.6.1's `fvault2Dump` prints for it (expectations.json), and
//! damaged copies of it refused with the structure named.

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::Command;
use ucrypt_format::fvault2::{uuid_string, Layout, Metadata};

fn suite_image(dir: &std::path::Path) -> Option<PathBuf> {
    let base = ucrypt_testkit::testdata("peer-tests/cryptsetup", "fvault2-images.tar.xz")?;
    if !ucrypt_testkit::require("tar") {
        return None;
    }
    let st = Command::new("tar")
        .arg("xJSf")
        .arg(base.join("fvault2-images.tar.xz"))
        .arg("-C")
        .arg(dir)
        .status()
        .unwrap();
    assert!(st.success(), "unpacking fvault2-images.tar.xz");
    Some(dir.join("fvault2-images/small"))
}

#[test]
fn the_suite_image_gives_the_fields_cryptsetup_prints() {
    let dir = tempfile::tempdir().unwrap();
    let Some(img) = suite_image(dir.path()) else {
        return;
    };
    let exp: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            ucrypt_testkit::testdata_root().join("peer-tests/cryptsetup/expectations.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let e = exp["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == "fvault2/small")
        .unwrap();
    let d = &e["expected_dump"];
    let m = Metadata::read(&img).unwrap();
    assert_eq!(uuid_string(&m.layout.pv_uuid), d["physical_volume_uuid"]);
    assert_eq!(m.family_uuid, d["family_uuid"]);
    assert_eq!(m.lv_offset, d["logical_volume_offset_bytes"]);
    assert_eq!(m.lv_size, d["logical_volume_size_bytes"]);
    assert_eq!(m.pbkdf2_iterations, d["pbkdf2_iterations"]);
    let salt: String = m.pbkdf2_salt.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(salt, d["pbkdf2_salt_hex"]);
    // The ranges a header copy takes cover every structure read above.
    let ranges = m.layout.ranges(u64::MAX);
    for at in [
        0,
        m.layout.disk_label,
        m.layout.groups_descriptor,
        m.layout.encrypted_metadata,
    ] {
        assert!(
            ranges.iter().any(|(o, l)| *o <= at && at < o + l),
            "{at} not copied"
        );
    }
}

/// One flipped byte in each structure: an error naming it, never a panic or a geometry.
#[test]
fn damaged_structures_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let Some(img) = suite_image(dir.path()) else {
        return;
    };
    let size = std::fs::metadata(&img).unwrap().len();
    let f = std::fs::File::open(&img).unwrap();
    let mut read = |at: u64, n: usize| {
        let mut b = vec![0u8; n];
        f.read_exact_at(&mut b, at).unwrap();
        Ok(b)
    };
    let layout = Layout::read_with(&mut read, size, "small").unwrap();
    let cases = [
        (100u64, "volume header"),
        (layout.disk_label + 300, "disk label"),
        (layout.encrypted_metadata + 100, "encrypted metadata"),
    ];
    for (at, what) in cases {
        let copy = dir.path().join("copy");
        std::fs::copy(&img, &copy).unwrap();
        let w = std::fs::OpenOptions::new().write(true).open(&copy).unwrap();
        let mut b = [0u8];
        std::fs::File::open(&copy)
            .unwrap()
            .read_exact_at(&mut b, at)
            .unwrap();
        w.write_all_at(&[b[0] ^ 0x40], at).unwrap();
        let e = Metadata::read(&copy).unwrap_err().to_string();
        assert!(e.contains(what) && e.contains("checksum"), "{what}: {e}");
    }
    // A device cut short before the logical volume ends.
    let copy = dir.path().join("short");
    std::fs::copy(&img, &copy).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&copy)
        .unwrap()
        .set_len(100 << 20)
        .unwrap();
    let e = Metadata::read(&copy).unwrap_err().to_string();
    assert!(e.contains("logical volume"), "{e}");
}
