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
//! The same boot opens volumes `ucrypt luksFormat --integrity` made (every mode, 512 and
//! 4096-byte sectors, legacy padding, three interleave areas), half written through ucrypt:
//! the kernel reads every block (the wipe made every tag valid) and the data.
//! The same boot replays journals ucrypt left behind: copies of the kernel's unflushed
//! images (`NAME-Junflushed`, whose journal `ucrypt open` replays when it starts) written
//! through `ucrypt open` over NBD, flushed, and the server killed with SIGKILL with its
//! journal committed but not copied to its places: the kernel replays it and reads exactly
//! what ucrypt flushed, every block (no EILSEQ).
//! Skipped with a message when `CI` is unset and the lab cannot start; fails under `CI`.
//!
//! Offline too: those kernel journals read through `ucrypt read` as the kernel read them,
//! the image left as it was.
//!
//! Against real cryptsetup on the host: what `ucrypt luksFormat --integrity` writes dumps
//! (`cryptsetup luksDump`) as the header cryptsetup wrote for the same options in the lab
//! (UUID, salts and digests aside) and passes `cryptsetup open --test-passphrase`; the
//! wiped volume reads zeros; `--integrity-no-wipe` leaves sectors failing until `ucrypt
//! wipe` (resumed from an offset) writes them; what ucrypt cannot serve is refused by name
//! with nothing written.

#![allow(clippy::unwrap_used)]

mod common;

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const IMAGES: [&str; 4] = [
    "hmac-sha256-xts-4096",
    "hmac-sha512-xts-512",
    "aes-gcm-random-4096",
    "chacha20-poly1305-4096",
];

/// Kernel images with a journal the kernel left unflushed (make.sh, `-Junflushed`).
const UNFLUSHED: [&str; 4] = [
    "hmac-sha256-xts-4096-Junflushed",
    "aes-gcm-random-4096-Junflushed",
    "chacha20-poly1305-4096-Junflushed",
    "hmac-sha512-xts-512-Junflushed",
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

/// Volumes `ucrypt luksFormat` makes for the lab: (name, MiB, options). The first spans
/// three dm-integrity interleave areas (16 MiB of data each).
const FORMATTED: &[(&str, u64, &[&str])] = &[
    (
        "fmt-hmac-sha256-4096",
        40,
        &["--integrity", "hmac-sha256", "--sector-size", "4096"],
    ),
    (
        "fmt-hmac-sha512-512-legacy",
        4,
        &[
            "--integrity",
            "hmac-sha512",
            "--key-size",
            "256",
            "--sector-size",
            "512",
            "--integrity-legacy-padding",
        ],
    ),
    ("fmt-hmac-sha1-auto", 8, &["--integrity", "hmac-sha1"]),
    (
        "fmt-aes-gcm-random-4096",
        4,
        &[
            "--cipher",
            "aes-gcm-random",
            "--integrity",
            "aead",
            "--sector-size",
            "4096",
        ],
    ),
    (
        "fmt-chacha20-poly1305-512",
        4,
        &[
            "--cipher",
            "chacha20-random",
            "--integrity",
            "poly1305",
            "--sector-size",
            "512",
        ],
    ),
];

/// The luksFormat options testdata/luks2-integrity/make.sh gave cryptsetup for `name`.
fn format_args(name: &str) -> &'static [&'static str] {
    match name {
        "hmac-sha256-xts-4096" => &[
            "--cipher",
            "aes-xts-plain64",
            "--key-size",
            "512",
            "--integrity",
            "hmac-sha256",
            "--sector-size",
            "4096",
        ],
        "hmac-sha512-xts-512" => &[
            "--cipher",
            "aes-xts-plain64",
            "--key-size",
            "256",
            "--integrity",
            "hmac-sha512",
            "--sector-size",
            "512",
        ],
        "aes-gcm-random-4096" => &[
            "--cipher",
            "aes-gcm-random",
            "--key-size",
            "256",
            "--integrity",
            "aead",
            "--sector-size",
            "4096",
        ],
        _ => &[
            "--cipher",
            "chacha20-random",
            "--key-size",
            "256",
            "--integrity",
            "poly1305",
            "--sector-size",
            "4096",
        ],
    }
}

/// `ucrypt luksFormat` of a new `mib` MiB image `img` as make.sh formats with cryptsetup
/// (its passphrase, PBKDF2 1000, small header, the volume key 0x40, 0x41, ...), plus
/// `extra` options.
fn ucrypt_format(d: &Path, img: &Path, mib: u64, args: &[&str], extra: &[&str]) -> Output {
    std::fs::File::create(img)
        .unwrap()
        .set_len(mib << 20)
        .unwrap();
    let vk = img.with_extension("vk.bin");
    std::fs::write(&vk, (64u8..192).collect::<Vec<u8>>()).unwrap();
    let pass = d.join("pass.txt");
    let vk_arg = ["--volume-key-file", vk.to_str().unwrap()];
    let opts = [&common::SMALL_LUKS2[..], &vk_arg, args, extra].concat();
    uc(&common::luks2_format_args(
        pass.to_str().unwrap(),
        &opts,
        img.to_str().unwrap(),
    ))
}

/// cryptsetup's luksDump with what differs per format (UUID, salts, digests) blanked.
fn dump_normalized(text: &str) -> String {
    let mut out = String::new();
    let mut hex_block = false;
    for line in text.lines() {
        let t = line.trim_start();
        let key = t.split(':').next().unwrap_or("");
        if matches!(key, "UUID" | "Salt" | "Digest") {
            out.push_str(&format!("{key}: -\n"));
            hex_block = true;
            continue;
        }
        // The continuation lines of a salt or digest: hex bytes only.
        if hex_block && line.starts_with('\t') && t.split_whitespace().all(|w| w.len() == 2) {
            continue;
        }
        hex_block = false;
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[test]
fn ucrypt_formatted_volumes_dump_and_open_as_cryptsetups() {
    let Some(d) = dir() else { return };
    if !ucrypt_testkit::require("cryptsetup") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let pass = d.join("pass.txt");
    for name in IMAGES {
        let img = tmp.path().join(format!("{name}.img"));
        let o = ucrypt_format(&d, &img, 4, format_args(name), &[]);
        assert!(
            o.status.success(),
            "{name}: luksFormat: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        // Real cryptsetup reads our header as it reads its own: the same dump.
        let dump = Command::new("cryptsetup")
            .arg("luksDump")
            .arg(&img)
            .output()
            .unwrap();
        assert!(dump.status.success(), "{name}: cryptsetup luksDump");
        let kernel = std::fs::read_to_string(d.join(format!("{name}.dump"))).unwrap();
        assert_eq!(
            dump_normalized(&String::from_utf8_lossy(&dump.stdout)),
            dump_normalized(&kernel),
            "{name}: cryptsetup luksDump of ucrypt's header vs of cryptsetup's"
        );
        // ucrypt's luksDump prints the same (libcryptsetup's dump, integrity line included).
        let ours = ok(&["luksDump", img.to_str().unwrap()]);
        assert_eq!(
            dump_normalized(&String::from_utf8_lossy(&ours)),
            dump_normalized(&kernel),
            "{name}: ucrypt luksDump"
        );
        let t = Command::new("cryptsetup")
            .args(["open", "--test-passphrase", "--key-file"])
            .arg(&pass)
            .arg(&img)
            .output()
            .unwrap();
        assert!(
            t.status.success(),
            "{name}: cryptsetup open --test-passphrase: {}",
            String::from_utf8_lossy(&t.stderr)
        );
        // The wipe left every sector authenticated: the whole volume reads zeros.
        let table = tmp.path().join(format!("{name}.table"));
        std::fs::write(&table, tables(&d, &img, "v")).unwrap();
        let data = ok(&["read", "--table-file", table.to_str().unwrap()]);
        let size: usize = std::fs::read_to_string(d.join(format!("{name}.size")))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(data.len(), size, "{name}: the size the kernel's volume had");
        assert!(
            data.iter().all(|&b| b == 0),
            "{name}: the wiped volume reads zeros"
        );
    }
}

#[test]
fn no_wipe_leaves_sectors_failing_until_ucrypt_wipe_writes_them() {
    let Some(d) = dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("nowipe.img");
    let args = format_args("hmac-sha256-xts-4096");
    let o = ucrypt_format(&d, &img, 4, args, &["--integrity-no-wipe"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = tmp.path().join("t");
    std::fs::write(&table, tables(&d, &img, "v")).unwrap();
    let r = uc(&[
        "read",
        "--table-file",
        table.to_str().unwrap(),
        "--length",
        "4096",
    ]);
    assert!(!r.status.success(), "an unwiped sector must not read");
    // A wipe resumed from the middle (what an interrupted one reports) makes the rest good.
    let pass = d.join("pass.txt");
    let half = (5616 * 512 / 2 / 4096 * 4096).to_string();
    ok(&[
        "wipe",
        img.to_str().unwrap(),
        "-q",
        "--key-file",
        pass.to_str().unwrap(),
        "--offset",
        &half,
    ]);
    let r = uc(&[
        "read",
        "--table-file",
        table.to_str().unwrap(),
        "--offset",
        &half,
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(r.stdout.iter().all(|&b| b == 0));
    let r = uc(&[
        "read",
        "--table-file",
        table.to_str().unwrap(),
        "--length",
        "4096",
    ]);
    assert!(!r.status.success(), "the first half was not wiped");
    ok(&[
        "wipe",
        img.to_str().unwrap(),
        "-q",
        "--key-file",
        pass.to_str().unwrap(),
    ]);
    let r = ok(&["read", "--table-file", table.to_str().unwrap()]);
    assert!(r.iter().all(|&b| b == 0));
}

#[test]
fn luks_format_refuses_what_ucrypt_cannot_serve() {
    let tmp = tempfile::tempdir().unwrap();
    let pass = tmp.path().join("pass");
    std::fs::write(&pass, "x").unwrap();
    for (args, words) in [
        (&["--integrity", "cmac-aes"][..], "cmac"),
        (&["--cipher", "aes-xts-random"][..], "integrity:N:none"),
        (
            &["--cipher", "aes-xts-random", "--integrity", "hmac-sha256"][..],
            "IV mode random",
        ),
        (
            &[
                "--cipher",
                "aes-cbc-essiv:sha256",
                "--integrity",
                "hmac-sha256",
            ][..],
            "cbc(aes)",
        ),
        (
            &["--cipher", "aes-ccm-random", "--integrity", "aead"][..],
            "ccm(aes)",
        ),
        (
            &["--cipher", "aes-xts-plain64", "--integrity", "aead"][..],
            "xts(aes)",
        ),
        (
            &["--type", "luks1", "--integrity", "hmac-sha256"][..],
            "only for LUKS2",
        ),
    ] {
        let img = tmp.path().join("img");
        std::fs::write(&img, vec![0u8; 4 << 20]).unwrap();
        let mut a = vec!["luksFormat", "-q", "--key-file", pass.to_str().unwrap()];
        a.extend_from_slice(args);
        a.push(img.to_str().unwrap());
        let o = uc(&a);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains(words),
            "{args:?}: {err:?} does not name {words:?}"
        );
        // Nothing was written.
        assert!(
            std::fs::read(&img).unwrap().iter().all(|&b| b == 0),
            "{args:?}"
        );
    }
}

/// `status NAME` of an open volume with integrity: cryptsetup's integrity lines (as the
/// kernel-made NAME.status has them) and the failures since open, counted as reads fail.
#[test]
fn status_shows_integrity_and_counts_failed_sectors() {
    let Some(d) = dir() else { return };
    if !ucrypt_testkit::require("nbdcopy") {
        return;
    }
    let rt = common::runtime::Runtime::new();
    let img = rt.path("s.img");
    let o = ucrypt_format(&d, &img, 4, format_args("hmac-sha256-xts-4096"), &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // One byte of the data of the block holding sector 100 flipped.
    let (block, bs) = flip_data_byte(&img, 100);
    let env = [("UCRYPT_RUNTIME_DIR", rt.dir().into_os_string())];
    let env: Vec<(&str, &std::ffi::OsStr)> = env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
    let pass = d.join("pass.txt");
    let run = |args: &[&str]| common::ucrypt_env(args, b"", &env);
    let o = run(&[
        "open",
        img.to_str().unwrap(),
        "iv",
        "--device",
        "none",
        "--key-file",
        pass.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8(run(&["status", "iv"]).stdout).unwrap();
    let kernel = std::fs::read_to_string(d.join("hmac-sha256-xts-4096.status")).unwrap();
    for want in [
        "cipher:",
        "keysize:",
        "integrity:",
        "integrity keysize:",
        "sector size:",
    ] {
        let line = |t: &str| {
            t.lines()
                .find(|l| l.trim_start().starts_with(want))
                .map(|l| l.trim().to_string())
        };
        assert_eq!(line(&text), line(&kernel), "{want} in\n{text}");
    }
    assert!(text.contains("  integrity failures: 0\n"), "{text}");
    // Read the whole volume over NBD: exactly the flipped block fails.
    let st: serde_json::Value =
        serde_json::from_slice(&run(&["status", "iv", "--json"]).stdout).unwrap();
    let uri = st["uri"].as_str().unwrap().to_string();
    let out = rt.path("copy");
    let c = Command::new("nbdcopy")
        .arg(&uri)
        .arg(&out)
        .output()
        .unwrap();
    assert!(!c.status.success(), "nbdcopy read past a bad block");
    let st: serde_json::Value =
        serde_json::from_slice(&run(&["status", "iv", "--json"]).stdout).unwrap();
    let failures = st["integrity_failures"].as_u64().unwrap();
    assert!(failures >= 1, "block {block} ({bs} bytes) failed: {st}");
    assert_eq!(st["integrity"], "hmac(sha256)");
    assert_eq!(st["integrity_key_bits"], 256);
    let o = run(&["close", "iv"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn unflushed_kernel_journals_read_as_the_kernel_read_them() {
    let Some(d) = dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    for name in UNFLUSHED {
        let img = tmp.path().join(format!("{name}.img"));
        unxz(&d.join(format!("{name}.img.xz")), &img);
        let before = std::fs::read(&img).unwrap();
        let table = tmp.path().join(format!("{name}.table"));
        std::fs::write(&table, tables(&d, &img, "v")).unwrap();
        let data = ok(&["read", "--table-file", table.to_str().unwrap()]);
        let sha = std::fs::read_to_string(d.join(format!("{name}.sha256"))).unwrap();
        assert_eq!(hex(&Sha256::digest(&data)), sha.trim(), "{name}");
        assert!(
            std::fs::read(&img).unwrap() == before,
            "{name}: reading wrote"
        );
    }
}

/// The table with the dm-integrity line in recovery mode (R: no replay, no checks of its
/// own), to see what the places hold.
fn recovery(table: &str) -> String {
    let mut lines: Vec<String> = table.lines().map(String::from).collect();
    assert!(lines[0].contains(" integrity ") && lines[0].contains(" J "));
    lines[0] = lines[0].replacen(" J ", " R ", 1);
    lines.join("\n") + "\n"
}

/// `ucrypt open` (NBD on a socket) on `table`, the given writes (offset, data), one
/// flush, then SIGKILL: the journal is committed (the flush) and not copied to its places.
fn write_flush_and_kill(table: &Path, sock: &Path, writes: &[(u64, Vec<u8>)]) {
    use std::io::BufRead;
    use ucrypt_nbd::client::{Address, Connection};
    use ucrypt_nbd::command::Request;
    use ucrypt_nbd::proto::{NBD_CMD_FLUSH, NBD_CMD_WRITE};
    let mut child = Command::new(env!("CARGO_BIN_EXE_ucrypt"))
        .args(["open", "--table-file"])
        .arg(table)
        .arg("--socket")
        .arg(sock)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("nbd+unix"), "no URI: {line:?}");
    let mut c = Connection::connect(&Address::Unix(sock.to_path_buf()), "").unwrap();
    let req = |kind, offset, length| Request {
        flags: 0,
        kind,
        cookie: 0,
        offset,
        length,
    };
    for (at, data) in writes {
        let r = req(NBD_CMD_WRITE, *at, data.len() as u32);
        assert_eq!(c.call(r, data, &mut []).unwrap(), 0);
    }
    assert_eq!(c.call(req(NBD_CMD_FLUSH, 0, 0), &[], &mut []).unwrap(), 0);
    child.kill().unwrap(); // SIGKILL, with the connection still open
    child.wait().unwrap();
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
    // Volumes ucrypt formatted (header, superblock, wipe), half of each then written
    // through ucrypt: the kernel must read every block (the wipe made every tag valid) and
    // the data.
    for (name, mib, args) in FORMATTED {
        let img = lab.join(format!("{name}.img"));
        let o = ucrypt_format(&d, &img, *mib, args, &[]);
        assert!(
            o.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let table = lab.join(format!("{name}.table"));
        std::fs::write(&table, tables(&d, &img, "v")).unwrap();
        let size = ok(&["read", "--table-file", table.to_str().unwrap()]).len();
        let mut data = vec![0u8; size];
        let half = size / 2 / 4096 * 4096;
        for i in 0..half / 16 {
            data[i * 16..(i + 1) * 16].copy_from_slice(format!("f{i:014x}\n").as_bytes());
        }
        let input = lab.join(format!("{name}.plain"));
        std::fs::write(&input, &data[..half]).unwrap();
        ok(&[
            "write",
            "--table-file",
            table.to_str().unwrap(),
            "--input",
            input.to_str().unwrap(),
        ]);
        std::fs::remove_file(&input).unwrap();
        let back = ok(&["read", "--table-file", table.to_str().unwrap()]);
        assert!(back == data, "{name}: ucrypt reads back what it wrote");
        std::fs::write(
            lab.join(format!("{name}.sha256")),
            hex(&Sha256::digest(&data)),
        )
        .unwrap();
        std::fs::remove_file(&table).unwrap();
        let _ = std::fs::remove_file(img.with_extension("vk.bin"));
    }
    // Journals ucrypt left: the kernel's unflushed images, opened by `ucrypt open` (which
    // replays the kernel's journal to its places), three ranges written, one flush, then
    // SIGKILL.
    for name in UNFLUSHED {
        let killed = format!("ucrypt-killed-{name}");
        let img = lab.join(format!("{killed}.img"));
        unxz(&d.join(format!("{name}.img.xz")), &img);
        let text = tables(&d, &img, "v");
        let table = lab.join(format!("{killed}.table"));
        std::fs::write(&table, &text).unwrap();
        let size: u64 = std::fs::read_to_string(d.join(format!("{name}.size")))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // The kernel's data: the first pattern with the second over make.sh's ranges.
        let mut data: Vec<u8> = Vec::with_capacity(size as usize);
        for i in 0..size / 16 {
            data.extend_from_slice(format!("{i:015x}\n").as_bytes());
        }
        for (from, len) in [(4096u64, 4096u64), (65536, 12288), (size - 8192, 8192)] {
            for i in from / 16..(from + len) / 16 {
                let at = (i * 16) as usize;
                data[at..at + 16].copy_from_slice(format!("j{i:014x}\n").as_bytes());
            }
        }
        let kernel = data.clone();
        let mut writes = Vec::new();
        for (from, len) in [(8192u64, 4096u64), (69632, 4096), (size - 16384, 8192)] {
            let mut w = Vec::with_capacity(len as usize);
            for i in from / 16..(from + len) / 16 {
                w.extend_from_slice(format!("u{i:014x}\n").as_bytes());
            }
            data[from as usize..(from + len) as usize].copy_from_slice(&w);
            writes.push((from, w));
        }
        write_flush_and_kill(&table, &lab.join(format!("{killed}.sock")), &writes);
        // The places hold the kernel's data (its journal replayed when ucrypt opened),
        // ucrypt's writes are in ucrypt's journal only; a normal open replays them.
        let rtable = lab.join(format!("{killed}.rtable"));
        std::fs::write(&rtable, recovery(&text)).unwrap();
        let places = ok(&["read", "--table-file", rtable.to_str().unwrap()]);
        assert!(
            places == kernel,
            "{name}: ucrypt's journal was copied to its places before the kill"
        );
        // On a copy: the image goes to the kernel as the kill left it.
        let copy = lab.join(format!("{killed}.copy"));
        std::fs::copy(&img, &copy).unwrap();
        let ctable = lab.join(format!("{killed}.ctable"));
        let ctext = text.replace(img.to_str().unwrap(), copy.to_str().unwrap());
        std::fs::write(&ctable, ctext).unwrap();
        let back = ok(&["read", "--table-file", ctable.to_str().unwrap()]);
        assert!(back == data, "{name}: ucrypt replays its own journal");
        std::fs::write(
            lab.join(format!("{killed}.sha256")),
            hex(&Sha256::digest(&data)),
        )
        .unwrap();
        for f in [&table, &rtable, &ctable, &copy] {
            std::fs::remove_file(f).unwrap();
        }
    }
    let Some(out) = ucrypt_testkit::run_in_vm(
        &root.join("tests/lab/luks2_integrity.sh"),
        [&lab],
        &[("LAB_TIMEOUT", "900")],
    ) else {
        return;
    };
    let want = format!(
        "{} passed, 0 failed",
        2 * IMAGES.len() + FORMATTED.len() + UNFLUSHED.len()
    );
    assert!(
        out.lines().any(|l| l == want),
        "the lab script did not report {want}"
    );
}
