//! What the integrity test suites share: the kernel images' directory, make.sh's pattern,
//! the external-tag device an `integrity:N:aead` crypt target sits on.

#![allow(clippy::unwrap_used, dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use ucrypt_backend::{Backend, MemoryBackend};
use ucrypt_format::integrity::{FormatParams, SALT_SIZE};
use ucrypt_integrity::{IntegrityBackend, Mode, Options};

/// testdata/integrity, when it and `xz` are there (the testkit's skip rule otherwise).
pub fn dir() -> Option<PathBuf> {
    let d = ucrypt_testkit::testdata("integrity", "README.md")?;
    ucrypt_testkit::require("xz").then_some(d)
}

/// The decompressed image.
pub fn unxz(path: &Path) -> Vec<u8> {
    let out = Command::new("xz").arg("-dc").arg(path).output().unwrap();
    assert!(out.status.success(), "xz -dc {}", path.display());
    out.stdout
}

/// `bytes` in a memory backend.
pub fn load(bytes: &[u8]) -> Arc<MemoryBackend> {
    let m = MemoryBackend::new(bytes.len() as u64).unwrap();
    m.write_at(bytes, 0, false).unwrap();
    Arc::new(m)
}

/// All of a backend's bytes.
pub fn snapshot(m: &dyn Backend) -> Vec<u8> {
    let mut v = vec![0u8; m.info().size_bytes as usize];
    m.read_at(&mut v, 0).unwrap();
    v
}

/// The ranges make.sh rewrote with the second pattern, for a device of `size` bytes.
pub fn second_ranges(size: u64) -> [(u64, u64); 3] {
    [(4096, 4096), (65536, 12288), (size - 8192, 8192)]
}

/// The pattern of make.sh: bytes 16 i.. are `printf '%015x\n' i`; with `second`, the
/// ranges of [`second_ranges`] hold `printf 'j%014x\n' i`.
pub fn pattern(size: u64, second: bool) -> Vec<u8> {
    let mut v = Vec::with_capacity(size as usize);
    for i in 0..size / 16 {
        v.extend_from_slice(format!("{i:015x}\n").as_bytes());
    }
    if second {
        for (from, len) in second_ranges(size) {
            for i in from / 16..(from + len) / 16 {
                let at = (i * 16) as usize;
                v[at..at + 16].copy_from_slice(format!("j{i:014x}\n").as_bytes());
            }
        }
    }
    v
}

/// Reads a whole device in 64 KiB requests.
pub fn read_all(dev: &dyn Backend) -> Vec<u8> {
    let mut v = vec![0u8; dev.info().size_bytes as usize];
    for (k, chunk) in v.chunks_mut(64 * 1024).enumerate() {
        dev.read_at(chunk, k as u64 * 64 * 1024).unwrap();
    }
    v
}

/// Writes `data` over a device from byte 0 in 64 KiB requests.
pub fn write_all(dev: &dyn Backend, data: &[u8]) {
    for (k, chunk) in data.chunks(64 * 1024).enumerate() {
        dev.write_at(chunk, k as u64 * 64 * 1024, false).unwrap();
    }
}

/// Lower-case hex.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `dev` formatted as the dm-integrity device below an `integrity:N:aead` crypt target
/// (external `tag`-byte tags, `block`-byte blocks, no hash or journal MAC, a zero salt, not
/// wiped: a sector reads only once written), then opened in `mode`.
pub fn external_tag_device(
    dev: Arc<dyn Backend>,
    tag: u32,
    block: u32,
    mode: Mode,
) -> Arc<IntegrityBackend> {
    let params = FormatParams {
        sector_size: block,
        tag_size: tag,
        journal_mac: false,
        keyed_or_hashed: false,
        fix_hmac: false,
        salt: [0; SALT_SIZE],
        ..FormatParams::default()
    };
    let mut o = Options::external(tag);
    o.block_size = Some(block);
    ucrypt_integrity::format(Arc::clone(&dev), &params, &o, false).unwrap();
    o.mode = mode;
    Arc::new(IntegrityBackend::open(dev, o).unwrap())
}
