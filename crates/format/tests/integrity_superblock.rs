//! dm-integrity superblocks and geometry read in pure Rust from the 14 images Linux 6.12 made
//! (testdata/integrity, `make.sh`), against what the kernel and integritysetup 2.6.1 said of
//! each: `integritysetup dump` line for line, and the table the kernel loaded
//! (`journal_sectors`, `interleave_sectors`, `buffer_sectors`, `block_size`, the mapping's
//! length), which the kernel derives from the superblock and the device size as
//! `Geometry` does.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use ucrypt_format::integrity::{
    max_provided_data_sectors, Geometry, Superblock, DEFAULT_BUFFER_SECTORS,
};

fn images() -> Option<(PathBuf, Vec<String>)> {
    let dir = ucrypt_testkit::testdata("integrity", "README.md")?;
    if !ucrypt_testkit::require("xz") {
        return None;
    }
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let n = e.unwrap().file_name().into_string().unwrap();
            n.strip_suffix(".img.xz").map(str::to_string)
        })
        .collect();
    names.sort();
    Some((dir, names))
}

fn unxz(path: &Path) -> Vec<u8> {
    let out = Command::new("xz").arg("-dc").arg(path).output().unwrap();
    assert!(out.status.success(), "xz -dc {}", path.display());
    out.stdout
}

/// `key:value` of a table line.
fn table_arg(table: &str, key: &str) -> Option<u64> {
    table
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix(':')?.parse().ok())
}

#[test]
fn every_kernel_image_gives_the_dump_and_table_the_kernel_gave() {
    let Some((dir, names)) = images() else { return };
    assert_eq!(names.len(), 20, "{names:?}");
    for name in &names {
        let img = unxz(&dir.join(format!("{name}.img.xz")));
        let sb = Superblock::parse(&img[..512]).unwrap_or_else(|e| panic!("{name}: {e}"));
        let dump = std::fs::read_to_string(dir.join(format!("{name}.dump"))).unwrap();
        let ours = sb.dump("X");
        assert_eq!(
            ours.lines().skip(1).collect::<Vec<_>>(),
            dump.lines().skip(1).collect::<Vec<_>>(),
            "{name}: dump"
        );
        let size: u64 = std::fs::read_to_string(dir.join(format!("{name}.size")))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(sb.provided_data_sectors * 512, size, "{name}: size");
        let table = std::fs::read_to_string(dir.join(format!("{name}.table"))).unwrap();
        let f: Vec<&str> = table.split_whitespace().collect();
        assert_eq!(
            f[1].parse::<u64>().unwrap(),
            sb.provided_data_sectors,
            "{name}"
        );
        assert_eq!(
            f[5].parse::<u16>().unwrap(),
            sb.tag_size,
            "{name}: tag size"
        );
        let dev_sectors = img.len() as u64 / 512;
        let geo = Geometry::new(&sb, dev_sectors, DEFAULT_BUFFER_SECTORS).unwrap();
        assert_eq!(
            Some(geo.journal.sectors()),
            table_arg(&table, "journal_sectors"),
            "{name}: journal sectors"
        );
        assert_eq!(
            Some(geo.interleave_sectors()),
            table_arg(&table, "interleave_sectors"),
            "{name}"
        );
        assert_eq!(
            Some(1u64 << geo.log2_buffer_sectors),
            table_arg(&table, "buffer_sectors"),
            "{name}: buffer sectors"
        );
        assert_eq!(
            table_arg(&table, "block_size").unwrap_or(512),
            geo.block_bytes(),
            "{name}: block size"
        );
        // The kernel chose the largest data size that fits the device.
        assert_eq!(
            max_provided_data_sectors(&sb, dev_sectors),
            sb.provided_data_sectors,
            "{name}: provided data sectors"
        );
        // The superblock sector is written back as read.
        assert_eq!(sb.to_sector()[..], img[..512], "{name}: round trip");
    }
}
