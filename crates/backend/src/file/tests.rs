//! Tests of [`FileBackend`] on temporary files (buffered and `O_DIRECT`) and, where
//! `losetup` works, on a loop block device.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::*;
use crate::{testing, WriteOp};

const MIB: u64 = 1 << 20;

/// A temporary directory on a disk filesystem: /tmp may be tmpfs, where `O_DIRECT` and
/// hole punching behave differently from the filesystems ucrypt is deployed on.
fn tmpdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("ucrypt-backend-")
        .tempdir_in("/var/tmp")
        .or_else(|_| tempfile::tempdir())
        .unwrap()
}

fn make_file(dir: &Path, name: &str, size: u64) -> PathBuf {
    let path = dir.join(name);
    let f = File::create(&path).unwrap();
    f.set_len(size).unwrap();
    path
}

/// Opens with `O_DIRECT`, or returns `None` (printing why) if the filesystem refuses it.
fn open_direct(path: &Path) -> Option<FileBackend> {
    let opts = FileOptions {
        direct: true,
        ..FileOptions::default()
    };
    match FileBackend::open(path, opts) {
        Ok(b) => Some(b),
        Err(BackendError::Open { source, .. }) if source.raw_os_error() == Some(libc::EINVAL) => {
            println!("skipping: {} refuses O_DIRECT (EINVAL)", path.display());
            None
        }
        Err(e) => panic!("opening {} with O_DIRECT: {e}", path.display()),
    }
}

#[test]
fn buffered_file_passes_conformance() {
    let dir = tmpdir();
    let path = make_file(dir.path(), "img", 4 * MIB);
    let b = FileBackend::open(&path, FileOptions::default()).unwrap();
    assert!(!b.is_block_device());
    assert!(!b.is_direct());
    assert_eq!(b.info().size_bytes, 4 * MIB);
    assert_eq!(b.info().logical_block, 512);
    testing::conformance(&b);
    // Nothing was written past the end: the file did not grow.
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 4 * MIB);
}

#[test]
fn direct_file_passes_conformance() {
    let dir = tmpdir();
    let path = make_file(dir.path(), "img", 4 * MIB);
    let Some(b) = open_direct(&path) else { return };
    assert!(b.is_direct());
    let lb = b.info().logical_block;
    assert!(lb.is_power_of_two() && lb >= 512, "logical block {lb}");
    testing::conformance(&b);
}

#[test]
fn direct_rejects_misaligned_offset_and_length() {
    let dir = tmpdir();
    let path = make_file(dir.path(), "img", MIB);
    let Some(b) = open_direct(&path) else { return };
    let lb = u64::from(b.info().logical_block);
    let mut buf = AlignedBuf::zeroed(2 * lb as usize, 4096).unwrap();
    let misaligned = |r: Result<(), BackendError>, want: &str| match r {
        Err(BackendError::Misaligned { what, align, .. }) => {
            assert_eq!(what, want);
            assert_eq!(align, lb);
        }
        other => panic!("expected misaligned {want}, got {other:?}"),
    };
    misaligned(b.read_at(&mut buf[..lb as usize], 1), "offset");
    misaligned(b.read_at(&mut buf[..lb as usize + 1], 0), "length");
    misaligned(b.write_at(&buf[..lb as usize], lb / 2, false), "offset");
    misaligned(b.write_at(&buf[..lb as usize - 1], lb, false), "length");
    misaligned(b.write_zeroes(1, lb, false), "offset");
}

#[test]
fn direct_bounces_misaligned_buffers_to_the_right_place() {
    let dir = tmpdir();
    let path = make_file(dir.path(), "img", MIB);
    let Some(b) = open_direct(&path) else { return };
    let lb = b.info().logical_block as usize;
    // Larger than one bounce buffer, from memory one byte off alignment.
    let len = BOUNCE_BYTES + 3 * lb;
    let mut raw = vec![0u8; len + 1];
    for (i, x) in raw.iter_mut().enumerate() {
        *x = (i % 251) as u8;
    }
    b.write_at(&raw[1..], lb as u64, true).unwrap();
    // Check through the page cache, independently of the backend's read path.
    let mut on_disk = Vec::new();
    File::open(&path)
        .unwrap()
        .read_to_end(&mut on_disk)
        .unwrap();
    assert!(on_disk[..lb].iter().all(|&x| x == 0));
    assert!(on_disk[lb..lb + len] == raw[1..]);
    let mut back = vec![0u8; len + 1];
    b.read_at(&mut back[1..], lb as u64).unwrap();
    assert!(back[1..] == raw[1..]);
}

#[test]
fn direct_size_rounds_down_to_the_logical_block() {
    let dir = tmpdir();
    let path = make_file(dir.path(), "img", MIB + 100);
    let buffered = FileBackend::open(&path, FileOptions::default()).unwrap();
    assert_eq!(buffered.info().size_bytes, MIB + 100);
    let Some(b) = open_direct(&path) else { return };
    assert_eq!(b.info().size_bytes, MIB);
}

#[test]
fn read_only_refuses_every_write_class_request() {
    let dir = tmpdir();
    let path = make_file(dir.path(), "img", MIB);
    let opts = FileOptions {
        read_only: true,
        ..FileOptions::default()
    };
    let b = FileBackend::open(&path, opts).unwrap();
    let caps = b.info().caps;
    assert!(caps.read_only);
    assert_eq!(caps.discard, Support::None);
    assert_eq!(caps.write_zeroes, Support::None);
    let read_only = |r: Result<(), BackendError>| {
        assert!(matches!(r, Err(BackendError::ReadOnly)), "{r:?}");
    };
    read_only(b.write_at(&[1u8; 512], 0, false));
    read_only(b.write_zeroes(0, 512, false));
    read_only(b.discard(0, 512));
    read_only(b.submit_writes(&[WriteOp {
        offset: 0,
        buf: &[1u8; 512],
        fua: false,
    }]));
    let mut buf = [1u8; 512];
    b.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [0u8; 512]);
    b.flush().unwrap();
}

#[test]
fn discard_punches_a_hole_in_the_file() {
    let dir = tmpdir();
    let path = make_file(dir.path(), "img", 4 * MIB);
    let b = FileBackend::open(&path, FileOptions::default()).unwrap();
    if b.info().caps.discard == Support::None {
        println!("skipping: {} cannot punch holes", path.display());
        return;
    }
    assert_eq!(b.info().caps.write_zeroes, Support::Native);
    b.write_at(&vec![9u8; 2 * MIB as usize], 0, false).unwrap();
    b.flush().unwrap();
    let before = std::fs::metadata(&path).unwrap().blocks();
    b.discard(0, 2 * MIB).unwrap();
    let after = std::fs::metadata(&path).unwrap();
    assert!(after.blocks() < before, "{} -> {}", before, after.blocks());
    assert_eq!(after.len(), 4 * MIB, "KEEP_SIZE keeps the length");
}

#[test]
fn write_zeroes_falls_back_to_zero_writes() {
    let dir = tmpdir();
    let path = make_file(dir.path(), "img", MIB);
    let b = FileBackend::open(&path, FileOptions::default()).unwrap();
    // Pretend both fallocate methods were refused.
    b.zero_method.store(ZERO_WRITE, Ordering::Relaxed);
    b.write_at(&vec![9u8; 200 * 1024], 0, false).unwrap();
    b.write_zeroes(512, 150 * 1024, true).unwrap();
    let mut buf = vec![0u8; 200 * 1024];
    b.read_at(&mut buf, 0).unwrap();
    assert!(buf[..512].iter().all(|&x| x == 9));
    assert!(buf[512..512 + 150 * 1024].iter().all(|&x| x == 0));
    assert!(buf[512 + 150 * 1024..].iter().all(|&x| x == 9));
}

#[test]
fn fua_falls_back_to_write_and_fdatasync() {
    let dir = tmpdir();
    let path = make_file(dir.path(), "img", MIB);
    let b = FileBackend::open(&path, FileOptions::default()).unwrap();
    b.dsync_ok.store(false, Ordering::Relaxed);
    b.write_at(&[4u8; 4096], 8192, true).unwrap();
    let mut buf = [0u8; 4096];
    b.read_at(&mut buf, 8192).unwrap();
    assert_eq!(buf, [4u8; 4096]);
}

#[test]
fn open_of_missing_file_names_the_path() {
    let dir = tmpdir();
    let path = dir.path().join("no-such-image");
    let err = FileBackend::open(&path, FileOptions::default()).unwrap_err();
    assert!(matches!(err, BackendError::Open { .. }));
    assert!(err.to_string().contains("no-such-image"), "{err}");
}

#[test]
fn open_of_a_directory_is_refused() {
    let dir = tmpdir();
    let opts = FileOptions {
        read_only: true,
        ..FileOptions::default()
    };
    let err = FileBackend::open(dir.path(), opts).unwrap_err();
    let BackendError::Open { source, .. } = err else {
        panic!("expected an open error, got {err:?}")
    };
    assert!(
        source.to_string().contains("not a regular file"),
        "{source}"
    );
}

#[test]
fn io_error_names_path_op_and_offset() {
    let dir = tmpdir();
    let path = make_file(dir.path(), "img", MIB);
    let b = FileBackend::open(&path, FileOptions::default()).unwrap();
    // Shrink the file behind the backend's back: reads past the new end come up short.
    File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(4096)
        .unwrap();
    let err = b.read_at(&mut [0u8; 4096], 65536).unwrap_err();
    assert!(matches!(
        err,
        BackendError::Io {
            op: "read",
            offset: 65536,
            ..
        }
    ));
    let msg = err.to_string();
    assert!(msg.contains("read") && msg.contains("65536"), "{msg}");
    assert!(msg.contains(&path.display().to_string()), "{msg}");
}

/// A loop device over a file, detached on drop.
struct LoopDevice {
    dev: PathBuf,
}

impl LoopDevice {
    /// Attaches `file`, or returns why not.
    fn attach(file: &Path) -> Result<Self, String> {
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(file)
            .output()
            .map_err(|e| format!("cannot run losetup: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "losetup failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        Ok(Self { dev: dev.into() })
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}

#[test]
fn loop_block_device_passes_conformance_buffered_and_direct() {
    let dir = tmpdir();
    let backing = make_file(dir.path(), "loop-backing", 8 * MIB);
    let lo = match LoopDevice::attach(&backing) {
        Ok(lo) => lo,
        Err(why) => {
            println!("skipping: {why}");
            return;
        }
    };

    let b = FileBackend::open(&lo.dev, FileOptions::default()).unwrap();
    assert!(b.is_block_device());
    assert_eq!(b.info().size_bytes, 8 * MIB);
    assert!(b.info().logical_block >= 512);
    assert!(b.info().physical_block >= b.info().logical_block);
    assert_ne!(b.info().caps.write_zeroes, Support::None);
    testing::conformance(&b);
    drop(b);

    let d = FileBackend::open(
        &lo.dev,
        FileOptions {
            direct: true,
            ..FileOptions::default()
        },
    )
    .unwrap();
    testing::conformance(&d);

    // What the device received is what the backing file holds.
    let lb = d.info().logical_block as usize;
    let mut data = AlignedBuf::zeroed(64 * 1024, 4096).unwrap();
    for (i, x) in data.iter_mut().enumerate() {
        *x = (i % 253) as u8 ^ 0x5a;
    }
    let at = 5 * MIB + lb as u64;
    d.write_at(&data, at, true).unwrap();
    let mut file = Vec::new();
    File::open(&backing)
        .unwrap()
        .read_to_end(&mut file)
        .unwrap();
    let at = at as usize;
    assert!(file[at..at + data.len()] == data[..]);

    // BLKZEROOUT needs whole logical blocks even without O_DIRECT.
    if lb > 1 {
        assert!(matches!(
            d.write_zeroes(1, lb as u64, false),
            Err(BackendError::Misaligned { .. })
        ));
    }
}
