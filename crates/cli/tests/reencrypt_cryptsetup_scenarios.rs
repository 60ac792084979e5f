//! cryptsetup 2.6.1's own `tests/luks2-reencryption-test`, replayed against ucrypt (issue
//! 16 item 5): its numbered scenarios, each either replayed here (the steps that need no
//! device-mapper device, with cryptsetup's expectations: what it checks by a hash of the
//! opened device is checked by reading the volume through `ucrypt luksOpen --print-table`,
//! with random data instead of the script's zeros) or skipped with the reason. The test
//! prints the list.
//!
//! The facts come from the script; nothing of it is copied. Scenario numbers are its
//! `echo "[N] ..."` lines.
#![allow(clippy::unwrap_used)]

mod common;

use common::cmd::{run, s};

use common::{require, Rng};
use std::path::{Path, PathBuf};
use std::process::Output;

const MIB: usize = 1 << 20;

/// What happens to each of the script's scenarios.
enum Replay {
    /// Replayed by this function.
    Runs(fn(&Fx)),
    /// Not replayed, and why.
    Skipped(&'static str),
}
use Replay::{Runs, Skipped};

const ONLINE: &str = "online: needs an active device-mapper device (ucrypt's online \
     reencryption is lifecycle.rs / reencrypt_crash.rs)";
const DM_ERRORS: &str = "needs dm-error/dm-delay targets to inject I/O errors (ucrypt's crash \
     recovery is reencrypt_crash.rs: kill -9 and power-cut rounds)";
const DECRYPT_SHIFT_ERRORS: &str = "injects write errors into the shift area or the moved \
     segment with a dm-error target stacked under the device (needs device-mapper); the \
     crashes themselves are reencrypt_shift.rs (ucrypt and cryptsetup killed in either part, \
     both resiliences) and reencrypt_crash.rs (kill -9 rounds)";
const ELSEWHERE: &str = "not replayed here: the same operations are compared with cryptsetup \
     byte for byte in reencrypt.rs / reencrypt_modes.rs";

const SCENARIOS: &[(u32, &str, Replay)] = &[
    (1, "Reencryption", Runs(reencryption)),
    (
        2,
        "Encryption with data shift",
        Runs(encryption_with_data_shift),
    ),
    (
        3,
        "Encryption with detached header",
        Runs(encryption_with_detached_header),
    ),
    (4, "Reencryption with detached header", Skipped(ELSEWHERE)),
    (
        5,
        "Decryption with detached header",
        Runs(decryption_with_detached_header),
    ),
    (6, "Reencryption recovery", Skipped(DM_ERRORS)),
    (
        7,
        "Reencryption recovery (online i/o error)",
        Skipped(ONLINE),
    ),
    (
        8,
        "Reencryption with detached header recovery",
        Skipped(DM_ERRORS),
    ),
    (
        9,
        "... with detached header recovery (online i/o error)",
        Skipped(ONLINE),
    ),
    (10, "Encryption recovery", Skipped(DM_ERRORS)),
    (
        11,
        "Encryption recovery (online i/o error)",
        Skipped(ONLINE),
    ),
    (
        12,
        "Encryption with detached header recovery",
        Skipped(DM_ERRORS),
    ),
    (
        13,
        "... with detached header recovery (online i/o error)",
        Skipped(ONLINE),
    ),
    (
        14,
        "Decryption with detached header recovery",
        Skipped(DM_ERRORS),
    ),
    (
        15,
        "... with detached header recovery (online i/o error)",
        Skipped(ONLINE),
    ),
    (
        16,
        "Offline reencryption with fixed device size",
        Skipped(ELSEWHERE),
    ),
    (
        17,
        "Online reencryption with fixed device size",
        Skipped(ONLINE),
    ),
    (
        18,
        "Offline ... fixed device size (detached header)",
        Skipped(ELSEWHERE),
    ),
    (
        19,
        "Online ... fixed device size (detached header)",
        Skipped(ONLINE),
    ),
    (
        20,
        "Offline encryption with fixed device size",
        Runs(encryption_with_fixed_device_size),
    ),
    (
        21,
        "Offline decryption with fixed device size",
        Runs(decryption_with_fixed_device_size),
    ),
    (22, "Multi-keyslot device reencryption", Runs(multi_keyslot)),
    (
        23,
        "Reencryption with specified new volume key",
        Runs(new_volume_key),
    ),
    (
        24,
        "Reencryption with initial cipher_null",
        Runs(initial_cipher_null),
    ),
    (
        25,
        "Reencryption recovery with cipher_null",
        Skipped(DM_ERRORS),
    ),
    (
        26,
        "... recovery with cipher_null (online i/o error)",
        Skipped(ONLINE),
    ),
    (
        27,
        "Test passphrase mode with reencryption metadata",
        Runs(test_passphrase_mid_reencryption),
    ),
    (
        28,
        "Prevent nested encryption",
        Runs(prevent_nested_encryption),
    ),
    (
        29,
        "Conflicting reencryption parameters",
        Runs(conflicting_parameters),
    ),
    (
        30,
        "Prevent nested encryption of broken LUKS device",
        Runs(prevent_nested_encryption_of_broken_luks),
    ),
    (
        31,
        "Prevent dangerous sector size increase",
        Skipped("checks a filesystem's block size through blkid on an active device"),
    ),
    (
        32,
        "Removal of encryption (legacy cryptsetup-reencrypt test)",
        Skipped(ELSEWHERE),
    ),
    (
        33,
        "Decryption with datashift recovery (error in shift area)",
        Skipped(DECRYPT_SHIFT_ERRORS),
    ),
    (
        34,
        "Decryption with datashift recovery (error in moved segment)",
        Skipped(DECRYPT_SHIFT_ERRORS),
    ),
    (
        35,
        "Decryption with datashift recovery (online, shift area)",
        Skipped(ONLINE),
    ),
    (
        36,
        "Decryption with datashift recovery (online, moved segment)",
        Skipped(ONLINE),
    ),
    (
        37,
        "Decryption with datashift (large data offsets)",
        Runs(decryption_with_large_data_offset),
    ),
];

struct Fx {
    dir: tempfile::TempDir,
    key: PathBuf,
    rng: std::cell::RefCell<Rng>,
}

const PBKDF: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

impl Fx {
    /// On a 60 MiB device with `hdr` initialised: `--device-size` beyond the device, and
    /// (sectors above 512 bytes) one not a multiple of the sector size, are both refused
    /// with nothing written.
    fn refuses_bad_device_sizes(
        &self,
        dev: &Path,
        hdr: &Path,
        sector: &str,
        mib: usize,
        resilience: &str,
    ) {
        let ss: usize = sector.parse().unwrap();
        let beyond = format!("{}", 60 * MIB + ss);
        let misaligned = format!("{}", mib * MIB + ss - 512);
        let mut sizes = vec![beyond];
        if ss > 512 {
            sizes.push(misaligned);
        }
        for size in &sizes {
            let args = [
                "--header",
                s(hdr),
                "--device-size",
                size,
                "--resilience",
                resilience,
            ];
            self.fails(dev, Some(hdr), &args);
        }
    }

    fn path(&self, n: &str) -> PathBuf {
        self.dir.path().join(n)
    }

    /// A device of `mib` MiB of random data.
    fn device(&self, name: &str, mib: usize) -> (PathBuf, Vec<u8>) {
        let p = self.path(name);
        let mut data = vec![0u8; mib * MIB];
        self.rng.borrow_mut().fill(&mut data);
        std::fs::write(&p, &data).unwrap();
        (p, data)
    }

    /// `ucrypt reencrypt ARGS -d KEY --pbkdf... --disable-locks -q DEV`.
    fn reencrypt(&self, dev: &Path, args: &[&str]) -> Output {
        let mut all = vec!["reencrypt", "-q", "-d", s(&self.key), "--disable-locks"];
        all.extend_from_slice(&PBKDF);
        all.extend_from_slice(args);
        all.push(s(dev));
        run(env!("CARGO_BIN_EXE_ucrypt"), &all)
    }

    fn ok(&self, dev: &Path, args: &[&str]) {
        let out = self.reencrypt(dev, args);
        assert!(out.status.success(), "reencrypt {args:?}: {out:?}");
    }

    /// The step fails (cryptsetup's `&& fail`) and leaves `dev` (and `hdr`) as they were.
    fn fails(&self, dev: &Path, hdr: Option<&Path>, args: &[&str]) {
        let before = std::fs::read(dev).unwrap();
        let hdr_before = hdr.map(|h| std::fs::read(h).ok());
        let out = self.reencrypt(dev, args);
        assert!(!out.status.success(), "reencrypt {args:?} succeeded");
        assert!(
            std::fs::read(dev).unwrap() == before,
            "reencrypt {args:?} failed but wrote"
        );
        if let (Some(h), Some(b)) = (hdr, hdr_before) {
            assert_eq!(
                std::fs::read(h).ok(),
                b,
                "reencrypt {args:?} wrote the header"
            );
        }
    }

    /// cryptsetup's `check_hash_head`: the first `len` bytes of the unlocked volume.
    fn head(&self, dev: &Path, hdr: Option<&Path>, len: usize) -> Vec<u8> {
        let mut args = vec![
            "luksOpen",
            "--print-table",
            "--showkeys",
            "-d",
            s(&self.key),
        ];
        if let Some(h) = hdr {
            args.extend_from_slice(&["--header", s(h)]);
        }
        args.push(s(dev));
        let out = run(env!("CARGO_BIN_EXE_ucrypt"), &args);
        assert!(out.status.success(), "{out:?}");
        let t = self.path("table");
        std::fs::write(&t, &out.stdout).unwrap();
        let n = len.to_string();
        let out = run(
            env!("CARGO_BIN_EXE_ucrypt"),
            &["read", "--table-file", s(&t), "--length", &n],
        );
        assert!(out.status.success(), "{out:?}");
        out.stdout
    }

    fn cryptsetup(&self, args: &[&str]) {
        let mut all = args.to_vec();
        all.extend_from_slice(&["-q", "--key-file", s(&self.key)]);
        all.extend_from_slice(&PBKDF);
        let out = run("cryptsetup", &all);
        assert!(out.status.success(), "cryptsetup {args:?}: {out:?}");
    }
}

/// [2]: encryption with `--reduce-device-size` keeps the first (device - reduction) bytes.
fn encryption_with_data_shift(f: &Fx) {
    let cases: [(usize, &[&str], usize); 3] = [
        (
            64,
            &[
                "-c",
                "aes-cbc-essiv:sha256",
                "-s",
                "128",
                "--reduce-device-size",
                "8M",
            ],
            56,
        ),
        (64, &["--reduce-device-size", "33M"], 31),
        // "Small device": the data (1 MiB) is shorter than the shift (32 MiB).
        (65, &["--reduce-device-size", "64M"], 1),
    ];
    for (mib, args, keep) in cases {
        let (dev, data) = f.device("dev", mib);
        let mut a = vec!["--encrypt"];
        a.extend_from_slice(args);
        f.ok(&dev, &a);
        assert!(
            f.head(&dev, None, keep * MIB) == data[..keep * MIB],
            "{args:?}: the first {keep} MiB differ"
        );
    }
    // The script's twofish cases: libcryptsetup checks the cipher through the kernel when
    // it formats (device-mapper/AF_ALG are missing here; cryptsetup fails alike); its
    // --offset cases: ucrypt's reencrypt has no --offset.
    // A reduction as large as the device fails.
    let (dev, _) = f.device("dev", 64);
    f.fails(&dev, None, &["--encrypt", "--reduce-device-size", "64M"]);
    // Initialised, then the device shrinks by one sector: the run is refused; grown back,
    // it finishes.
    let (dev, data) = f.device("dev", 64);
    f.ok(
        &dev,
        &["--encrypt", "--reduce-device-size", "8M", "--init-only"],
    );
    // (The last sector is the end of the moved copy of the first 4 MiB: kept aside.)
    let tail = std::fs::read(&dev).unwrap()[64 * MIB - 512..].to_vec();
    let file = std::fs::OpenOptions::new().write(true).open(&dev).unwrap();
    file.set_len((64 * MIB - 512) as u64).unwrap();
    f.fails(&dev, None, &["--resume-only"]);
    std::os::unix::fs::FileExt::write_all_at(&file, &tail, (64 * MIB - 512) as u64).unwrap();
    drop(file);
    f.ok(&dev, &["--resume-only"]);
    assert!(f.head(&dev, None, 56 * MIB) == data[..56 * MIB]);
    // A detached header with a data shift: refused by ucrypt (cryptsetup does it).
    let hdr = f.path("hdr");
    let (dev, _) = f.device("dev", 64);
    let h = s(&hdr).to_string();
    f.fails(
        &dev,
        Some(&hdr),
        &["--encrypt", "--header", &h, "--reduce-device-size", "21M"],
    );
    assert!(!hdr.exists());
    // Initialised with a key file, keyslot 11: the passphrase opens it.
    let (dev, _) = f.device("dev", 64);
    f.ok(
        &dev,
        &[
            "--encrypt",
            "--init-only",
            "-S",
            "11",
            "--reduce-device-size",
            "8M",
        ],
    );
    let out = run(
        "cryptsetup",
        &[
            "open",
            "--test-passphrase",
            "-S",
            "11",
            "--key-file",
            s(&f.key),
            s(&dev),
        ],
    );
    assert!(out.status.success(), "{out:?}");
}

/// `ucrypt ARGS`, which must succeed.
fn ucrypt_ok(args: &[&str]) -> Vec<u8> {
    let out = run(env!("CARGO_BIN_EXE_ucrypt"), args);
    assert!(out.status.success(), "ucrypt {args:?}: {out:?}");
    out.stdout
}

/// [1]: chains of offline re-encryptions keep the data (cryptsetup's own luksFormat with
/// `--offset 8192`, aes-cbc-essiv 128-bit; then default, journal with a new cipher and key
/// size, none, checksum back to aes-cbc-essiv, and the same with sector sizes 4096, 2048,
/// 1024, 512), on 32 MiB and on a 5 MiB device (1 MiB of data). The script's twofish steps
/// use aes-xts 256-bit here (libcryptsetup checks twofish through the kernel, missing
/// here); its 4096-byte-sector devices are scsi_debug devices (files here); its
/// `--active-name` step is online.
fn reencryption(f: &Fx) {
    let steps: [&[&str]; 8] = [
        &[],
        &[
            "-s",
            "256",
            "-c",
            "aes-xts-plain64",
            "--resilience",
            "journal",
        ],
        &["--resilience", "none"],
        &[
            "-s",
            "128",
            "-c",
            "aes-cbc-essiv:sha256",
            "--resilience",
            "checksum",
        ],
        &["--sector-size", "4096"],
        &[
            "-s",
            "256",
            "-c",
            "aes-xts-plain64",
            "--resilience",
            "journal",
            "--sector-size",
            "2048",
        ],
        &["--resilience", "none", "--sector-size", "1024"],
        &[
            "-s",
            "128",
            "-c",
            "aes-cbc-essiv:sha256",
            "--resilience",
            "checksum",
            "--sector-size",
            "512",
        ],
    ];
    for mib in [32, 5] {
        let (dev, _) = f.device("re1", mib);
        f.cryptsetup(&[
            "luksFormat",
            "--type",
            "luks2",
            "-s",
            "128",
            "-c",
            "aes-cbc-essiv:sha256",
            "--offset",
            "8192",
            s(&dev),
        ]);
        let mut data = vec![0u8; (mib - 4) * MIB];
        f.rng.borrow_mut().fill(&mut data);
        write_through(f, &dev, None, &data);
        for step in steps {
            f.ok(&dev, step);
            assert!(
                f.head(&dev, None, data.len()) == data,
                "{mib} MiB, {step:?}: the volume changed"
            );
        }
    }
}

/// Writes `data` through the unlocked volume (ucrypt's table), from its start.
fn write_through(f: &Fx, dev: &Path, hdr: Option<&Path>, data: &[u8]) {
    let k = s(&f.key).to_string();
    let mut args = vec!["luksOpen", "--print-table", "--showkeys", "-d", &k];
    if let Some(h) = hdr {
        args.extend_from_slice(&["--header", s(h)]);
    }
    args.push(s(dev));
    let table = ucrypt_ok(&args);
    let t = f.path("table-w");
    std::fs::write(&t, table).unwrap();
    let input = f.path("input-w");
    std::fs::write(&input, data).unwrap();
    ucrypt_ok(&["write", "--table-file", s(&t), "--input", s(&input)]);
}

/// [22], in part: with several keyslots the one kept must be named (`-S`); with it the run
/// succeeds and the volume keeps its data. Not replayed: cryptsetup's re-keying of every
/// keyslot, each with its own passphrase (ucrypt keeps the named keyslot and removes the
/// others, as `cryptsetup reencrypt --key-slot` does).
fn multi_keyslot(f: &Fx) {
    let (dev, _) = f.device("multi22", 17);
    f.cryptsetup(&[
        "luksFormat",
        "--type",
        "luks2",
        "--offset",
        "32768",
        s(&dev),
    ]);
    let key2 = f.path("key22");
    std::fs::write(&key2, b"another passphrase").unwrap();
    f.cryptsetup(&["luksAddKey", s(&dev), s(&key2)]);
    let mut data = vec![0u8; MIB];
    f.rng.borrow_mut().fill(&mut data);
    write_through(f, &dev, None, &data);
    f.fails(&dev, None, &[]);
    f.ok(&dev, &["-S", "0"]);
    assert!(f.head(&dev, None, MIB) == data);
}

/// The script's `VKEY1`: 32 bytes, of which `-s 128` takes the first 16.
const VKEY1: [u8; 32] = [
    0x44, 0xc6, 0x74, 0x4f, 0x41, 0x4e, 0x50, 0xc0, 0x79, 0xc2, 0x2d, 0x5b, 0x5f, 0x68, 0x84, 0x17,
    0x9c, 0x03, 0xba, 0xbe, 0x4d, 0x0f, 0x9a, 0x75, 0xb3, 0x90, 0x70, 0x32, 0x0a, 0xf8, 0xae, 0xc4,
];

/// The volume key of `dev` (`cryptsetup luksDump --dump-volume-key`, written to a file).
fn cryptsetup_volume_key(f: &Fx, dev: &Path, hdr: Option<&Path>) -> Vec<u8> {
    let out = f.path("vk.dump");
    let _ = std::fs::remove_file(&out);
    let mut args = vec![
        "luksDump",
        "--dump-volume-key",
        "-q",
        "--key-file",
        s(&f.key),
        "--volume-key-file",
        s(&out),
    ];
    if let Some(h) = hdr {
        args.extend_from_slice(&["--header", s(h)]);
    }
    args.push(s(dev));
    let o = run("cryptsetup", &args);
    assert!(o.status.success(), "{o:?}");
    std::fs::read(&out).unwrap()
}

/// [23]: re-keying with `--volume-key-file VKEY1 -s 128` (aes-cbc-essiv 256-bit volume,
/// `--offset 8192`, two keyslots, `-S 0` kept): the volume keeps its data, its key is the
/// file's first 16 bytes (the script erases every keyslot and adds one back with
/// `luksAddKey --volume-key-file VKEY1 -s 128`: the volume still reads the data), and
/// cryptsetup 2.6.1's own run (`--force-offline-reencrypt`) on a copy of the same image
/// leaves the same data area byte for byte. Beyond the script: a file shorter than the key
/// and the volume's own key with nothing else changed are refused as by cryptsetup
/// ("Cannot read 16 bytes from keyfile", "No data segment parameters changed"), nothing
/// written; `--encrypt --header` takes the file's key for the new header, as cryptsetup's.
fn new_volume_key(f: &Fx) {
    let (dev, _) = f.device("vk23", 32);
    f.cryptsetup(&[
        "luksFormat",
        "--type",
        "luks2",
        "-s",
        "256",
        "-c",
        "aes-cbc-essiv:sha256",
        "--offset",
        "8192",
        s(&dev),
    ]);
    let key3 = f.path("key23");
    std::fs::write(&key3, b"1-9Qu5Ejfnqv").unwrap();
    f.cryptsetup(&["luksAddKey", s(&dev), s(&key3)]);
    let mut data = vec![0u8; 28 * MIB];
    f.rng.borrow_mut().fill(&mut data);
    write_through(f, &dev, None, &data);
    let vk = f.path("vkey1");
    std::fs::write(&vk, VKEY1).unwrap();
    let short = f.path("vkey-short");
    std::fs::write(&short, &VKEY1[..15]).unwrap();
    f.fails(
        &dev,
        None,
        &["-S", "0", "--volume-key-file", s(&short), "-s", "128"],
    );
    let theirs = f.path("vk23-cryptsetup");
    std::fs::copy(&dev, &theirs).unwrap();
    f.ok(&dev, &["-S", "0", "--volume-key-file", s(&vk), "-s", "128"]);
    assert!(f.head(&dev, None, data.len()) == data);
    assert_eq!(cryptsetup_volume_key(f, &dev, None), VKEY1[..16]);
    f.cryptsetup(&[
        "reencrypt",
        "--force-offline-reencrypt",
        "-S",
        "0",
        "--volume-key-file",
        s(&vk),
        "-s",
        "128",
        s(&theirs),
    ]);
    let (a, b) = (
        std::fs::read(&dev).unwrap(),
        std::fs::read(&theirs).unwrap(),
    );
    assert!(
        a[4 * MIB..] == b[4 * MIB..],
        "the data area differs from cryptsetup's"
    );
    // The volume's own key now, nothing else changed: refused, nothing written.
    let own = f.path("vk23-own");
    std::fs::write(&own, &VKEY1[..16]).unwrap();
    f.fails(&dev, None, &["--volume-key-file", s(&own), "-s", "128"]);
    // The script's check: every keyslot erased, one added back from VKEY1.
    let o = run("cryptsetup", &["luksErase", "-q", s(&dev)]);
    assert!(o.status.success(), "{o:?}");
    let o = run(
        "cryptsetup",
        &[
            "luksAddKey",
            "-q",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--volume-key-file",
            s(&vk),
            "-s",
            "128",
            s(&dev),
            s(&f.key),
        ],
    );
    assert!(o.status.success(), "{o:?}");
    assert!(f.head(&dev, None, data.len()) == data);
    // --encrypt: the new header holds the file's key (64 bytes for aes-xts-plain64).
    let vk64: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
    let vkf = f.path("vkey64");
    std::fs::write(&vkf, &vk64).unwrap();
    let hdr = f.path("vk23.hdr");
    let (plain, data) = f.device("vk23-plain", 8);
    f.ok(
        &plain,
        &[
            "--encrypt",
            "--header",
            s(&hdr),
            "--volume-key-file",
            s(&vkf),
        ],
    );
    assert!(f.head(&plain, Some(&hdr), data.len()) == data);
    assert_eq!(cryptsetup_volume_key(f, &plain, Some(&hdr)), vk64);
}

/// A LUKS2 volume of `mib` MiB of random data whose data segment is `cipher_null-ecb`, as
/// cryptsetup's `luksFormat -c cipher_null-ecb -s BITS` writes it (a volume key of BITS in
/// an aes-xts-plain64 512-bit keyslot, the data stored as it is). cryptsetup's luksFormat
/// (and ucrypt's, through libcryptsetup) checks that cipher through device-mapper, missing
/// here, so ucrypt formats aes-cbc-plain64 with such a keyslot and the segment's cipher is
/// rewritten in both header copies (checksums recomputed). Returns the device and the data
/// the volume holds (all of its data area).
fn null_cipher_volume(
    f: &Fx,
    name: &str,
    mib: usize,
    bits: &str,
    offset: &str,
) -> (PathBuf, Vec<u8>) {
    use ucrypt_format::luks2::disk::Header;
    use ucrypt_format::luks2::json::Json;
    let (dev, data) = f.device(name, mib);
    let mut args = vec![
        "luksFormat",
        "-q",
        "--type",
        "luks2",
        "-c",
        "aes-cbc-plain64",
        "-s",
        bits,
        "--keyslot-cipher",
        "aes-xts-plain64",
        "--keyslot-key-size",
        "512",
        "--sector-size",
        "512",
        "--offset",
        offset,
        "-d",
        s(&f.key),
    ];
    args.extend_from_slice(&PBKDF);
    args.push(s(&dev));
    ucrypt_ok(&args);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&dev)
        .unwrap();
    let mut h = Header::read(&file, name).unwrap();
    h.json
        .get_mut("segments")
        .and_then(|x| x.get_mut("0"))
        .unwrap()
        .set("encryption", Json::str("cipher_null-ecb"));
    h.write(&file, name).unwrap();
    drop(file);
    let at = offset.parse::<usize>().unwrap() * 512;
    let plain = std::fs::read(&dev).unwrap()[at..].to_vec();
    assert!(plain == data[at..], "the format wrote into the data area");
    (dev, plain)
}

/// `cryptsetup luksDump`'s data segment cipher and sector size and keyslot key sizes.
fn dump_shape(dev: &Path) -> Vec<String> {
    let out = run("cryptsetup", &["luksDump", s(dev)]);
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("cipher:") || l.starts_with("sector:") || l.starts_with("Key:"))
        .map(str::to_string)
        .collect()
}

/// [24], offline: a volume formatted with `cipher_null` (its data stored as it is) is
/// re-keyed: `-c aes-xts-plain64` on 32 MiB (`-s 128` null volume, `--offset 8192`), and
/// with no `-c` on 64 MiB (`-c null`, 256 bits, `--offset 16384`, `--hotzone-size 1M
/// --resilience none`: "Switching data encryption cipher to aes-xts-plain64."). The volume
/// then reads the data through aes-xts-plain64 with a 512-bit key (cryptsetup's default for
/// the new cipher; not the null volume's key size); cryptsetup 2.6.1 re-keys a copy of the
/// same image the same way (same cipher, sector and key sizes; its volume reads the same
/// data). The format is ucrypt's ([`null_cipher_volume`]). Not replayed: the online runs
/// (an active device-mapper device) and the LUKS2 volume converted from a LUKS1
/// `cipher_null` one (its keyslots cipher_null too): cryptsetup's LUKS1 luksFormat with
/// cipher_null checks it through device-mapper as well, and ucrypt writes no such keyslot.
fn initial_cipher_null(f: &Fx) {
    let cases: [(&str, usize, &str, &str, &[&str]); 2] = [
        ("null24a", 32, "128", "8192", &["-c", "aes-xts-plain64"]),
        (
            "null24b",
            64,
            "256",
            "16384",
            &["--hotzone-size", "1M", "--resilience", "none"],
        ),
    ];
    for (name, mib, bits, offset, args) in cases {
        let (dev, data) = null_cipher_volume(f, name, mib, bits, offset);
        let theirs = f.path(&format!("{name}-cryptsetup"));
        std::fs::copy(&dev, &theirs).unwrap();
        let out = f.reencrypt(&dev, args);
        assert!(out.status.success(), "{name} {args:?}: {out:?}");
        if args.is_empty() || !args.contains(&"-c") {
            assert!(
                String::from_utf8_lossy(&out.stdout)
                    .contains("Switching data encryption cipher to aes-xts-plain64."),
                "{out:?}"
            );
        }
        assert!(f.head(&dev, None, data.len()) == data, "{name}: data lost");
        let mut cs = vec!["reencrypt", "--force-offline-reencrypt"];
        cs.extend_from_slice(args);
        cs.push(s(&theirs));
        f.cryptsetup(&cs);
        assert!(f.head(&theirs, None, data.len()) == data);
        let shape = dump_shape(&dev);
        assert_eq!(shape, dump_shape(&theirs), "{name}");
        assert!(
            shape.contains(&"cipher: aes-xts-plain64".to_string())
                && shape.contains(&"Key:        512 bits".to_string()),
            "{shape:?}"
        );
    }
}

/// [3]: encryption under a detached header keeps the data (aes-cbc-essiv 128-bit, journal,
/// none). The script's twofish and serpent cases: libcryptsetup's format checks those
/// ciphers through the kernel, missing here (cryptsetup fails alike).
fn encryption_with_detached_header(f: &Fx) {
    let cases: [&[&str]; 3] = [
        &["-c", "aes-cbc-essiv:sha256", "-s", "128"],
        &["--resilience", "journal"],
        &["--resilience", "none"],
    ];
    for extra in cases {
        let hdr = f.path("enc3.hdr");
        let _ = std::fs::remove_file(&hdr);
        let h = s(&hdr).to_string();
        let (dev, data) = f.device("enc3", 16);
        let mut a = vec!["--encrypt", "--header", &h];
        a.extend_from_slice(extra);
        f.ok(&dev, &a);
        assert!(
            f.head(&dev, Some(&hdr), data.len()) == data,
            "{extra:?}: the volume is not the data"
        );
    }
}

/// [5]: decryption of a detached-header volume leaves the plaintext written through it
/// (checksum, journal; `none` is refused for decryption, as by cryptsetup 2.6.1's CLI).
fn decryption_with_detached_header(f: &Fx) {
    for (resilience, ok) in [("checksum", true), ("journal", true), ("none", false)] {
        let hdr = f.path("dec5.hdr");
        let _ = std::fs::remove_file(&hdr);
        let h = s(&hdr).to_string();
        let (dev, _) = f.device("dec5", 16);
        let k = s(&f.key).to_string();
        let mut args = vec![
            "luksFormat",
            "-q",
            "--type",
            "luks2",
            "--header",
            &h,
            "-d",
            &k,
        ];
        args.extend_from_slice(&PBKDF);
        args.extend_from_slice(&["-c", "aes-cbc-essiv:sha256", "-s", "128", s(&dev)]);
        ucrypt_ok(&args);
        // The script's `wipe`: data written through the volume (random here).
        let mut data = vec![0u8; 16 * MIB];
        f.rng.borrow_mut().fill(&mut data);
        let table = ucrypt_ok(&[
            "luksOpen",
            "--print-table",
            "--showkeys",
            "--header",
            &h,
            "-d",
            &k,
            s(&dev),
        ]);
        let t = f.path("table5");
        std::fs::write(&t, table).unwrap();
        let input = f.path("input5");
        std::fs::write(&input, &data).unwrap();
        ucrypt_ok(&["write", "--table-file", s(&t), "--input", s(&input)]);
        let args = ["--decrypt", "--header", &h, "--resilience", resilience];
        if ok {
            f.ok(&dev, &args);
            assert!(
                std::fs::read(&dev).unwrap() == data,
                "{resilience}: not the plaintext"
            );
        } else {
            f.fails(&dev, Some(&hdr), &args);
        }
    }
}

/// [20]: encryption under a detached header with `--device-size` (the script's 60 MiB
/// device; a subset of its sector size × resilience × size grid: 512/checksum/28 MiB,
/// 4096/journal/1 MiB, 4096/none/31 MiB): the volume's first SIZE bytes are the data; a
/// size one encryption sector beyond the device, and (4 KiB sectors) one not a multiple of
/// the sector, fail on an initialised header and leave it and the device as they were.
fn encryption_with_fixed_device_size(f: &Fx) {
    for (sector, resilience, mib) in [
        ("512", "checksum", 28usize),
        ("4096", "journal", 1),
        ("4096", "none", 31),
    ] {
        let hdr = f.path("enc20.hdr");
        let _ = std::fs::remove_file(&hdr);
        let h = s(&hdr).to_string();
        let (dev, data) = f.device("enc20", 60);
        let size = format!("{}", mib * MIB);
        f.ok(
            &dev,
            &[
                "--encrypt",
                "--header",
                &h,
                "--sector-size",
                sector,
                "--device-size",
                &size,
                "--resilience",
                resilience,
            ],
        );
        assert!(
            f.head(&dev, Some(&hdr), mib * MIB) == data[..mib * MIB],
            "{sector}/{resilience}/{mib}M: the volume's head is not the data"
        );
        let _ = std::fs::remove_file(&hdr);
        let (dev, _) = f.device("enc20", 60);
        f.ok(
            &dev,
            &[
                "--encrypt",
                "--header",
                &h,
                "--sector-size",
                sector,
                "--init-only",
            ],
        );
        f.refuses_bad_device_sizes(&dev, &hdr, sector, mib, resilience);
    }
}

/// [21]: decryption of a detached-header volume with `--device-size` (the script's 60 MiB
/// device, a subset of its grid: 512/checksum/28 MiB, 4096/journal/1 MiB): the device's
/// first SIZE bytes are the plaintext written through the volume; on an initialised header
/// a size one sector beyond the device, and (4 KiB sectors) a misaligned one, fail and
/// leave header and device as they were.
fn decryption_with_fixed_device_size(f: &Fx) {
    for (sector, resilience, mib) in [("512", "checksum", 28usize), ("4096", "journal", 1)] {
        let hdr = f.path("dec21.hdr");
        let h = s(&hdr).to_string();
        let k = s(&f.key).to_string();
        let format = |dev: &Path| {
            let _ = std::fs::remove_file(&hdr);
            let mut args = vec![
                "luksFormat",
                "-q",
                "--type",
                "luks2",
                "--header",
                &h,
                "-d",
                &k,
            ];
            args.extend_from_slice(&PBKDF);
            args.extend_from_slice(&["--sector-size", sector, s(dev)]);
            ucrypt_ok(&args);
        };
        let (dev, _) = f.device("dec21", 60);
        format(&dev);
        let mut data = vec![0u8; 60 * MIB];
        f.rng.borrow_mut().fill(&mut data);
        write_through(f, &dev, Some(&hdr), &data);
        let size = format!("{}", mib * MIB);
        f.ok(
            &dev,
            &[
                "--decrypt",
                "--header",
                &h,
                "--device-size",
                &size,
                "--resilience",
                resilience,
            ],
        );
        assert!(
            std::fs::read(&dev).unwrap()[..mib * MIB] == data[..mib * MIB],
            "{sector}/{resilience}/{mib}M: not the plaintext"
        );
        let (dev, _) = f.device("dec21", 60);
        format(&dev);
        f.ok(&dev, &["--decrypt", "--header", &h, "--init-only"]);
        f.refuses_bad_device_sizes(&dev, &hdr, sector, mib, resilience);
    }
}

/// [37]: decryption of a device whose header is attached with a large data offset (the
/// script's 512 MiB device, `--offset 1015808 --luks2-keyslots-size 16M`: 496 MiB of
/// header, 16 MiB of data, all of it the moved segment): the header is exported, the data
/// comes back at the device's first byte. The script's third case (a 1 MiB data area
/// behind a 511 MiB offset) is the same path with a smaller moved segment; left out for
/// the suite's time (every case wipes the 496+ MiB the header held).
fn decryption_with_large_data_offset(f: &Fx) {
    let dev = f.path("dec37");
    std::fs::File::create(&dev)
        .unwrap()
        .set_len(512 * MIB as u64)
        .unwrap();
    f.cryptsetup(&[
        "luksFormat",
        "--type",
        "luks2",
        "--sector-size",
        "512",
        "--offset",
        "1015808",
        "--luks2-keyslots-size",
        "16M",
        s(&dev),
    ]);
    let mut data = vec![0u8; 16 * MIB];
    f.rng.borrow_mut().fill(&mut data);
    write_through(f, &dev, None, &data);
    let hdr = f.path("dec37.hdr");
    f.ok(&dev, &["--decrypt", "--header", s(&hdr)]);
    let got = std::fs::read(&dev).unwrap();
    assert!(got[..16 * MIB] == data, "not the plaintext at the head");
    let j = std::fs::read(&hdr).unwrap();
    assert!(String::from_utf8_lossy(&j[4096..16384])
        .contains(r#""segments":{"0":{"type":"linear","offset":"0","size":"dynamic"}}"#));
}

/// [27]: `open --test-passphrase` works on a header in the middle of a reencryption
/// (re-keying with an unbound keyslot present, decryption, encryption with a detached
/// header, encryption with a data shift).
fn test_passphrase_mid_reencryption(f: &Fx) {
    let k = s(&f.key).to_string();
    let tp = |target: &[&str]| {
        let mut args = vec!["open", "--test-passphrase", "-d", &k];
        args.extend_from_slice(target);
        ucrypt_ok(&args);
    };
    let format = |dev: &Path, hdr: Option<&str>| {
        let mut args = vec!["luksFormat", "-q", "-S5", "--type", "luks2", "-d", &k];
        if let Some(h) = hdr {
            args.extend_from_slice(&["--header", h]);
        }
        args.extend_from_slice(&PBKDF);
        args.push(s(dev));
        ucrypt_ok(&args);
        let mut args = vec!["luksAddKey", "--unbound", "-s", "80", "-S0", "-d", &k];
        args.extend_from_slice(&["--new-keyfile", &k]);
        args.extend_from_slice(&PBKDF);
        args.push(hdr.unwrap_or(s(dev)));
        ucrypt_ok(&args);
    };
    let (dev, _) = f.device("tp27", 32);
    format(&dev, None);
    f.ok(&dev, &["--init-only"]);
    tp(&[s(&dev)]);

    let hdr = f.path("tp27.hdr");
    let h = s(&hdr).to_string();
    let (dev, _) = f.device("tp27", 32);
    format(&dev, Some(&h));
    f.ok(&dev, &["--decrypt", "--init-only", "--header", &h]);
    tp(&[&h]);
    std::fs::remove_file(&hdr).unwrap();

    let (dev, _) = f.device("tp27", 32);
    f.ok(&dev, &["--encrypt", "--init-only", "--header", &h]);
    tp(&[&h]);

    let (dev, _) = f.device("tp27", 32);
    f.ok(
        &dev,
        &["--encrypt", "--init-only", "--reduce-device-size", "8M"],
    );
    tp(&[s(&dev)]);
}

/// [28]: no encryption of what is already LUKS2 (a device, a detached header, either in
/// reencryption); no header file is created.
/// [30]: no encryption over a broken LUKS device. The script's image is an LVM PV written
/// over a LUKS2 volume: the primary header gone, the secondary one (at 16 KiB) left, which
/// blkid still reports as crypto_LUKS (libcryptsetup does not load it: the LVM label makes
/// the signatures ambiguous). Made here without the LVM label: a LUKS2 volume whose first
/// 16 KiB are zeroed. As the header (`--header`), as the device with `--reduce-device-size`,
/// and as the data device under a new header file: each refused with cryptsetup's message
/// ("contains broken LUKS metadata"), nothing written, no header file made.
fn prevent_nested_encryption_of_broken_luks(f: &Fx) {
    let (pv, _) = f.device("broken-pv", 25);
    f.cryptsetup(&["luksFormat", "--type", "luks2", s(&pv)]);
    {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new().write(true).open(&pv).unwrap();
        file.write_all_at(&[0u8; 16384], 0).unwrap();
    }
    let bytes = std::fs::read(&pv).unwrap();
    assert_eq!(
        &bytes[16384..16390],
        b"SKUL\xba\xbe",
        "the secondary header is left"
    );
    let hdr = f.path("broken.hdr");
    let h = s(&hdr).to_string();
    let (dev, _) = f.device("broken-data", 32);
    let broken = |out: Output| {
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("contains broken LUKS metadata"),
            "{out:?}"
        );
    };
    // Broken header.
    broken(f.reencrypt(&dev, &["--encrypt", "--type", "luks2", "--header", s(&pv)]));
    f.fails(
        &dev,
        Some(&pv),
        &["--encrypt", "--type", "luks2", "--header", s(&pv)],
    );
    // Broken device.
    broken(f.reencrypt(
        &pv,
        &["--encrypt", "--type", "luks2", "--reduce-device-size", "8m"],
    ));
    f.fails(
        &pv,
        None,
        &["--encrypt", "--type", "luks2", "--reduce-device-size", "8m"],
    );
    // Broken data device only.
    broken(f.reencrypt(&pv, &["--encrypt", "--type", "luks2", "--header", &h]));
    f.fails(&pv, None, &["--encrypt", "--type", "luks2", "--header", &h]);
    assert!(!hdr.exists());
    assert!(std::fs::read(&pv).unwrap() == bytes);
}

fn prevent_nested_encryption(f: &Fx) {
    let hdr = f.path("nested.hdr");
    let h = s(&hdr).to_string();
    let (dev, _) = f.device("nested", 32);
    f.cryptsetup(&["luksFormat", "--type", "luks2", s(&dev)]);
    for t in ["luks1", "luks2"] {
        f.fails(
            &dev,
            None,
            &["--encrypt", "--type", t, "--reduce-device-size", "2M"],
        );
        f.fails(
            &dev,
            Some(&hdr),
            &["--encrypt", "--type", t, "--header", &h],
        );
        assert!(!hdr.exists());
    }
    f.fails(&dev, None, &["--type", "luks1"]);

    let (dev, _) = f.device("nested", 32);
    f.cryptsetup(&["luksFormat", "--type", "luks2", "--header", &h, s(&dev)]);
    for t in ["luks1", "luks2"] {
        f.fails(
            &dev,
            Some(&hdr),
            &["--encrypt", "--type", t, "--header", &h],
        );
    }
    f.fails(&dev, Some(&hdr), &["--type", "luks1", "--header", &h]);
    std::fs::remove_file(&hdr).unwrap();

    let (dev, _) = f.device("nested", 32);
    f.cryptsetup(&["luksFormat", "--type", "luks2", s(&dev)]);
    f.ok(&dev, &["--init-only"]);
    for t in ["luks1", "luks2"] {
        f.fails(
            &dev,
            Some(&hdr),
            &["--encrypt", "--type", t, "--header", &h],
        );
        assert!(!hdr.exists());
    }
    f.fails(&dev, None, &["--type", "luks1"]);

    let (dev, _) = f.device("nested", 32);
    f.ok(
        &dev,
        &[
            "--encrypt",
            "--init-only",
            "--type",
            "luks2",
            "--header",
            &h,
        ],
    );
    f.fails(
        &dev,
        Some(&hdr),
        &["--encrypt", "--type", "luks1", "--header", &h],
    );
    std::fs::remove_file(&hdr).unwrap();
}

/// [29]: a reencryption in progress is not resumed as another kind, nor with a resilience
/// it cannot take.
fn conflicting_parameters(f: &Fx) {
    let (dev, _) = f.device("conflict", 32);
    f.cryptsetup(&["luksFormat", "--type", "luks2", s(&dev)]);
    f.ok(&dev, &["--init-only"]);
    f.fails(&dev, None, &["--encrypt", "--reduce-device-size", "4M"]);
    f.fails(&dev, None, &["--decrypt"]);
    for r in ["datashift", "datashift-checksum", "datashift-journal"] {
        f.fails(&dev, None, &["--resilience", r]);
    }

    let (dev, _) = f.device("conflict", 32);
    f.ok(
        &dev,
        &["--encrypt", "--init-only", "--reduce-device-size", "16M"],
    );
    f.fails(&dev, None, &["--decrypt"]);
    for r in ["journal", "datashift-checksum", "datashift-journal"] {
        f.fails(&dev, None, &["--resilience", r]);
    }

    let hdr = f.path("conflict.hdr");
    let h = s(&hdr).to_string();
    let (dev, _) = f.device("conflict", 32);
    f.cryptsetup(&["luksFormat", "--type", "luks2", "--header", &h, s(&dev)]);
    f.ok(&dev, &["--header", &h, "--init-only"]);
    f.fails(&dev, Some(&hdr), &["--encrypt", "--header", &h]);
    f.fails(&dev, Some(&hdr), &["--decrypt", "--header", &h]);
}

#[test]
fn cryptsetups_reencryption_scenarios() {
    if !require("cryptsetup") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("pass");
    std::fs::write(&key, b"cryptsetup scenario passphrase").unwrap();
    let (rng, seed) = Rng::from_env("UCRYPT_SCENARIO_SEED");
    eprintln!("seed {seed} (UCRYPT_SCENARIO_SEED)");
    let f = Fx {
        dir,
        key,
        rng: std::cell::RefCell::new(rng),
    };
    // The list is the script's: numbers 1 to 37, each once.
    let numbers: Vec<u32> = SCENARIOS.iter().map(|(n, _, _)| *n).collect();
    assert_eq!(numbers, (1..=37).collect::<Vec<_>>());
    let (mut ran, mut skipped) = (0, 0);
    for (n, name, replay) in SCENARIOS {
        match replay {
            Runs(test) => {
                test(&f);
                ran += 1;
                eprintln!("[{n}] {name}: replayed, passed");
            }
            Skipped(why) => {
                skipped += 1;
                eprintln!("[{n}] {name}: skipped ({why})");
            }
        }
    }
    eprintln!("{ran} scenarios replayed, {skipped} skipped");
}
