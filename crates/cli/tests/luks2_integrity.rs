//! LUKS2 volumes with authenticated encryption (cryptsetup luksFormat --integrity: dm-crypt's
//! AEAD modes over dm-integrity with external tags), as the command opens them.
//!
//! Offline: the kernel-made images of testdata/luks2-integrity unlock to the two tables
//! the kernel held (`luksOpen --print-table`: `NAME_dif` and `NAME` as `dmsetup table`
//! printed them), and those tables read the kernel's pattern exactly (`read`).
//!
//! In the kernel lab (`tests/lab/luks2_integrity.sh`, one boot): copies of those images
//! written through ucrypt (`write`, new data over the whole device, random IVs drawn by
//! ucrypt), then opened by Linux's cryptsetup: the kernel reads what ucrypt wrote, and in a
//! copy with one byte of one block's data flipped fails exactly that block with EILSEQ.
//! Skipped with a message when `CI` is unset and the lab cannot start; fails under `CI`.

#![allow(clippy::unwrap_used)]

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const IMAGES: [&str; 4] = [
    "hmac-sha256-xts-4096",
    "hmac-sha512-xts-512",
    "aes-gcm-random-4096",
    "chacha20-poly1305-4096",
];

fn dir() -> Option<PathBuf> {
    let d = ucrypt_testkit::testdata("luks2-integrity", "make.sh")?;
    ucrypt_testkit::require("xz").then_some(d)
}

fn uc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ucrypt"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> Vec<u8> {
    let o = uc(args);
    assert!(
        o.status.success(),
        "ucrypt {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o.stdout
}

fn unxz(from: &Path, to: &Path) {
    let out = Command::new("xz").arg("-dc").arg(from).output().unwrap();
    assert!(out.status.success());
    std::fs::write(to, out.stdout).unwrap();
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The volume's tables with keys, as `luksOpen --print-table --showkeys` prints them.
fn tables(d: &Path, img: &Path, name: &str) -> String {
    let pass = d.join("pass.txt");
    let out = ok(&[
        "luksOpen",
        img.to_str().unwrap(),
        name,
        "--print-table",
        "--showkeys",
        "--key-file",
        pass.to_str().unwrap(),
    ]);
    String::from_utf8(out).unwrap()
}

#[test]
fn kernel_made_volumes_unlock_to_the_kernels_tables_and_read_its_data() {
    let Some(d) = dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    for name in IMAGES {
        let img = tmp.path().join(format!("{name}.img"));
        unxz(&d.join(format!("{name}.img.xz")), &img);
        let text = tables(&d, &img, "v");
        // The kernel's lines (testdata NAME.table): dm-integrity as "dif: ...", then crypt,
        // with the kernel's device numbers and keyring key where ucrypt has paths and keys.
        let kernel = std::fs::read_to_string(d.join(format!("{name}.table"))).unwrap();
        let mut k = kernel.lines();
        let dif = k.next().unwrap().strip_prefix("dif: ").unwrap();
        let crypt = k.next().unwrap();
        let mut lines = text.lines();
        let got_dif = lines.next().unwrap().strip_prefix("v_dif: ").unwrap();
        let got_crypt = lines.next().unwrap().strip_prefix("v: ").unwrap();
        assert_eq!(
            got_dif.replace(img.to_str().unwrap(), "7:0"),
            dif,
            "{name}: the dm-integrity line"
        );
        let vk = std::fs::read_to_string(d.join(format!("{name}.vk"))).unwrap();
        let kernel_crypt: Vec<&str> = crypt.split_whitespace().collect();
        let mut want: Vec<&str> = kernel_crypt.clone();
        want[4] = vk.trim();
        want[6] = "/dev/mapper/v_dif";
        assert_eq!(got_crypt, want.join(" "), "{name}: the crypt line");
        // Those tables read the kernel's data.
        let table = tmp.path().join(format!("{name}.table"));
        std::fs::write(&table, &text).unwrap();
        let data = ok(&["read", "--table-file", table.to_str().unwrap()]);
        let sha = std::fs::read_to_string(d.join(format!("{name}.sha256"))).unwrap();
        assert_eq!(hex(&Sha256::digest(&data)), sha.trim(), "{name}");
        // Without the key nothing opens; --print-table alone hides it.
        let hidden = uc(&[
            "luksOpen",
            img.to_str().unwrap(),
            "v",
            "--print-table",
            "--key-file",
            d.join("pass.txt").to_str().unwrap(),
        ]);
        assert!(!String::from_utf8_lossy(&hidden.stdout).contains(vk.trim()));
    }
}

/// One byte of the data of the block holding 512-byte sector `sector`, flipped in `img`;
/// returns (block number, block size).
fn flip_data_byte(img: &Path, sector: u64) -> (u64, u64) {
    use ucrypt_format::integrity::{Geometry, Superblock, DEFAULT_BUFFER_SECTORS};
    let mut bytes = std::fs::read(img).unwrap();
    // The LUKS2 data offset of these images: 1 MiB (their tables say 2048 sectors).
    let off = 1 << 20;
    let sb = Superblock::parse(&bytes[off..off + 512]).unwrap();
    let dev_sectors = (bytes.len() - off) as u64 / 512;
    let geo = Geometry::new(&sb, dev_sectors, DEFAULT_BUFFER_SECTORS).unwrap();
    let bs = geo.block_bytes();
    let first = sector / (bs / 512) * (bs / 512);
    let at = off + (geo.data_sector(first) * 512) as usize + 100;
    bytes[at] ^= 0x01;
    std::fs::write(img, bytes).unwrap();
    (first * 512 / bs, bs)
}

#[test]
fn lab_the_kernel_reads_what_ucrypt_wrote() {
    let Some(d) = dir() else { return };
    let root = ucrypt_testkit::repo_root();
    // The guest sees the directory the harness is started from: the workspace.
    let lab = root.join("target/luks2-integrity-lab");
    let _ = std::fs::remove_dir_all(&lab);
    std::fs::create_dir_all(&lab).unwrap();
    std::fs::copy(d.join("pass.txt"), lab.join("pass.txt")).unwrap();
    for name in IMAGES {
        let img = lab.join(format!("{name}.img"));
        unxz(&d.join(format!("{name}.img.xz")), &img);
        let table = lab.join(format!("{name}.table"));
        std::fs::write(&table, tables(&d, &img, "v")).unwrap();
        let size: usize = std::fs::read_to_string(d.join(format!("{name}.size")))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // New data over the whole device, then a partial sector over it.
        let mut data: Vec<u8> = Vec::with_capacity(size);
        for i in 0..size / 16 {
            data.extend_from_slice(format!("u{i:014x}\n").as_bytes());
        }
        let input = lab.join(format!("{name}.plain"));
        std::fs::write(&input, &data).unwrap();
        ok(&[
            "write",
            "--table-file",
            table.to_str().unwrap(),
            "--input",
            input.to_str().unwrap(),
        ]);
        std::fs::write(&input, b"a partial sector").unwrap();
        ok(&[
            "write",
            "--table-file",
            table.to_str().unwrap(),
            "--input",
            input.to_str().unwrap(),
            "--offset",
            "1000",
        ]);
        data[1000..1016].copy_from_slice(b"a partial sector");
        std::fs::remove_file(&input).unwrap();
        // ucrypt reads it back itself first.
        let back = ok(&["read", "--table-file", table.to_str().unwrap()]);
        assert!(back == data, "{name}: ucrypt reads back what it wrote");
        std::fs::write(
            lab.join(format!("{name}.sha256")),
            hex(&Sha256::digest(&data)),
        )
        .unwrap();
        std::fs::remove_file(&table).unwrap();
        // A copy with one byte of block(sector 100)'s data flipped.
        let bad = lab.join(format!("{name}.bad"));
        std::fs::copy(&img, &bad).unwrap();
        let (block, bs) = flip_data_byte(&bad, 100);
        std::fs::write(
            lab.join(format!("{name}.badblock")),
            format!("{block} {bs}"),
        )
        .unwrap();
        let t2 = tables(&d, &bad, "b");
        let t2f = lab.join("bad.table");
        std::fs::write(&t2f, t2).unwrap();
        let o = uc(&["read", "--table-file", t2f.to_str().unwrap()]);
        assert!(
            !o.status.success(),
            "{name}: ucrypt fails the flipped block too"
        );
        std::fs::remove_file(&t2f).unwrap();
    }
    let Some(out) = ucrypt_testkit::run_in_vm(
        &root.join("tests/lab/luks2_integrity.sh"),
        [&lab],
        &[("LAB_TIMEOUT", "900")],
    ) else {
        return;
    };
    assert!(
        out.lines().any(|l| l == "8 passed, 0 failed"),
        "the lab script did not report its 8 checks"
    );
}
