//! Secrets: no key byte in any error, log line, listing or command line; no core dumps
//! while keys are held; and what a scan of the process's own memory finds of a key after
//! its volume was closed.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Seek, SeekFrom};
use std::process::{Command, Stdio};

/// Every way the key could show: hex (either case, whole or its first 8 bytes) and raw.
fn assert_no_key(what: &str, out: &[u8], key: &[u8]) {
    let text = String::from_utf8_lossy(out).to_ascii_lowercase();
    let hex = hex::encode(key);
    assert!(!text.contains(&hex), "{what}: the key in hex:\n{text}");
    assert!(
        !text.contains(&hex[..16]),
        "{what}: the key's first 8 bytes in hex:\n{text}"
    );
    let spaced: Vec<String> = key[..8].iter().map(|b| format!("{b:02x}")).collect();
    assert!(
        !text.contains(&spaced.join(" ")),
        "{what}: the key as spaced hex:\n{text}"
    );
    assert!(
        !out.windows(8).any(|w| w == &key[..8]),
        "{what}: raw key bytes"
    );
}

fn run(args: &[&str], stdin: &[u8]) -> Vec<u8> {
    let out = common::ucrypt(args, stdin);
    [out.stdout, out.stderr].concat()
}

#[test]
fn no_key_byte_in_errors_logs_listings_or_the_command_line() {
    let tmp = tempfile::tempdir().unwrap();
    let img = common::image(tmp.path(), "d.img", 1 << 20);
    let small = common::image(tmp.path(), "small.img", 4096);
    let key = common::nbd::random_bytes(64);
    let k = hex::encode(&key);
    let d = img.to_str().unwrap();
    let table = |name: &str, line: String| {
        let p = tmp.path().join(name);
        std::fs::write(&p, line).unwrap();
        p.to_str().unwrap().to_string()
    };
    let good = table(
        "good",
        format!("0 2048 crypt aes-xts-plain64 {k} 0 {d} 0 1 sector_size:4096"),
    );
    let upper = table(
        "upper",
        format!("0 2048 crypt aes-xts-plain64 {} 0 {d} 0", k.to_uppercase()),
    );
    let broken = [
        format!("0 2048 crypt aes-xts-plain64 {k} 0 {d} 0 1 bogus"),
        format!("0 2048 crypt aes-xts-plain64 {k} 0 /nonexistent/dev 0"),
        format!("0 2048 crypt aes-xts-plain64 {k} 0 {} 0", small.display()),
        format!("0 2048 crypt aes-xts-plain64 {k} 0 {d} 0 1 sector_size:1000"),
        format!("0 2048 crypt nosuch-xts-plain64 {k} 0 {d} 0"),
        format!("0 2048 crypt aes-cbc-plain {k} 0 {d} 0"), // 64 bytes: wrong size for AES-CBC
        format!("0 2048 crypt aes-xts-plain64 {}x 0 {d} 0", &k[..127]),
        format!("0 2048 crypt aes-xts-plain64 {}{k} 0 {d} 0", &k[..2]),
        format!("0 2048 crypt aes-xts-plain64 {k} 0 {d} 0 1 sector_size:4096 extra"),
        format!("0 2048 crypt aes:64-cbc-lmk {k} 0 {d} 0"),
        format!("0 2048 crypt aes-xts-plain64 {k} 9 {d} 0 2 iv_large_sectors sector_size:4096"),
    ];
    let mut outputs: Vec<(String, Vec<u8>)> = Vec::new();
    for (i, line) in broken.into_iter().enumerate() {
        let t = table(&format!("bad{i}"), line.clone());
        for cmd in ["table", "read", "write"] {
            let args: &[&str] = match cmd {
                "read" => &[cmd, "--table-file", &t, "--length", "512"],
                _ => &[cmd, "--table-file", &t],
            };
            let out = common::ucrypt(args, b"x");
            assert!(
                cmd == "table" || !out.status.success(),
                "{cmd} accepted {line}"
            );
            outputs.push((
                format!("{cmd} on broken table {i}"),
                [out.stdout, out.stderr].concat(),
            ));
        }
    }
    for t in [&good, &upper] {
        outputs.push(("table".into(), run(&["table", "--table-file", t], b"")));
        outputs.push((
            "write past the end".into(),
            run(
                &["write", "--table-file", t, "--offset", "1048570"],
                b"0123456789",
            ),
        ));
        outputs.push((
            "read past the end".into(),
            run(
                &[
                    "read",
                    "--table-file",
                    t,
                    "--offset",
                    "1048576",
                    "--length",
                    "1",
                ],
                b"",
            ),
        ));
    }
    // `ucrypt open --verbose` logging hostile clients; its command line and environment.
    let sock = tmp.path().join("s.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ucrypt"))
        .args(["open", "--verbose", "--table-file", &good, "--socket"])
        .arg(&sock)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 8];
    stdout.read_exact(&mut first).unwrap();
    for garbage in [&[0xffu8; 40][..], &[0, 0, 0, 3, 0, 0][..]] {
        let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        let _ = std::io::Write::write_all(&mut s, garbage);
        let _ = s.shutdown(std::net::Shutdown::Write); // then vanish: the server sees EOF
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    }
    let pid = child.id();
    for f in ["cmdline", "environ"] {
        let b = std::fs::read(format!("/proc/{pid}/{f}")).unwrap_or_default();
        assert_no_key(&format!("/proc/PID/{f} of ucrypt open"), &b, &key);
    }
    // SAFETY: SIGTERM to our own child.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    outputs.push((
        "open --verbose".into(),
        [&first[..], &rest, &out.stderr].concat(),
    ));

    // Library: Debug and error chains of everything holding the key.
    let parsed: ucrypt_format::TableLine = std::fs::read_to_string(&good).unwrap().parse().unwrap();
    outputs.push((
        "TableLine Debug".into(),
        format!("{parsed:?} {parsed}").into_bytes(),
    ));
    let opened =
        ucrypt::open_table(&std::fs::read_to_string(&good).unwrap(), Default::default()).unwrap();
    outputs.push((
        "OpenedTable".into(),
        format!("{:?} {}", opened.table, opened.table.to_line(false)).into_bytes(),
    ));
    drop(opened);
    let Err(e) = ucrypt::open_table(
        &format!("0 4096 crypt aes-xts-plain64 {k} 0 {d} 0"),
        Default::default(),
    ) else {
        panic!("a 2 MiB mapping on a 1 MiB device must be refused");
    };
    outputs.push((
        "open_table error".into(),
        format!("{e:#} {e:?}").into_bytes(),
    ));

    let n = outputs.len();
    for (what, out) in outputs {
        assert_no_key(&what, &out, &key);
    }
    eprintln!(
        "{n} outputs (errors, logs, listings, Debug, /proc cmdline and environ) hold no key byte"
    );
}

#[test]
fn luks_dump_shows_the_volume_key_only_when_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let img = common::image(tmp.path(), "l.img", 4 << 20);
    let dev = img.to_str().unwrap();
    let kf = tmp.path().join("k");
    std::fs::write(&kf, b"secret passphrase").unwrap();
    let kf = kf.to_str().unwrap();
    common::ok(common::ucrypt(
        &[
            "luksFormat",
            dev,
            "-q",
            "--type",
            "luks2",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            kf,
        ],
        b"",
    ));
    // The explicit option shows it (as cryptsetup does)...
    let shown = String::from_utf8(common::ok(common::ucrypt(
        &["luksDump", dev, "--dump-volume-key", "-q", "--key-file", kf],
        b"",
    )))
    .unwrap();
    let hex: String = shown
        .lines()
        .skip_while(|l| !l.contains("MK dump") && !l.contains("Volume key"))
        .flat_map(|l| {
            l.split(|c: char| !c.is_ascii_hexdigit())
                .filter(|w| w.len() == 2)
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    let key = hex::decode(&hex).unwrap();
    assert_eq!(key.len(), 64, "volume key parsed from: {shown}");
    let print = common::ok(common::ucrypt(
        &[
            "luksOpen",
            dev,
            "--print-table",
            "--showkeys",
            "--key-file",
            kf,
        ],
        b"",
    ));
    assert!(
        String::from_utf8_lossy(&print).contains(&hex::encode(&key)),
        "the dump's key is the volume key"
    );
    // ...and nothing else does.
    for args in [
        &["luksDump", dev][..],
        &["luksDump", dev, "--dump-json-metadata"][..],
        &["luksDump", dev, "--dump-volume-key", "--key-file", kf][..], // not confirmed: refused
        &["luksOpen", dev, "--print-table", "--key-file", kf][..],
        &["luksOpen", dev, "--test-passphrase", "--key-file", kf][..],
        &["open", dev, "--test-passphrase", "--key-file", "-"][..],
        &["isLuks", dev][..],
        &["luksUUID", dev][..],
    ] {
        let out = run(args, b"wrong passphrase\n");
        assert_no_key(&format!("{args:?}"), &out, &key);
    }
}

#[test]
fn core_dumps_are_off_in_every_command_that_holds_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let img = common::image(tmp.path(), "d.img", 1 << 20);
    let (_, t) = common::nbd::xts_table(tmp.path(), &img, 512, &[]);
    let served =
        common::nbd::Served::start(&t, &["--socket", tmp.path().join("s").to_str().unwrap()]);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", served.child.id())).unwrap();
    let core = limits
        .lines()
        .find(|l| l.starts_with("Max core file size"))
        .unwrap();
    let fields: Vec<&str> = core.split_whitespace().collect();
    assert_eq!((fields[4], fields[5]), ("0", "0"), "{core}");
    served.stop();
    // The library call itself, in a child of this process: a process that is not
    // dumpable has a root-owned /proc/self/mem, which the memory scan of another test of
    // this binary, running meanwhile, could then not open unless run as root.
    // SAFETY: the child only makes system calls (no allocation, no lock) and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let ok =
            ucrypt::secure::disable_core_dumps().is_ok() && ucrypt::secure::core_dumps_disabled();
        // SAFETY: ends the child without running the parent's destructors or exit hooks.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above; `status` is ours.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "core dumps not off after disable_core_dumps (status {status:#x})"
    );
}

// ---------------------------------------------------------------------------------------
// Memory scan

const MASK: u8 = 0x5a;

/// Counts occurrences of `needle ^ MASK` (never unmasked in memory) in this process's
/// readable, writable mappings, skipping `skip` (the scan buffer). Returns (region, count).
fn scan(masked: &[u8], skip: std::ops::Range<usize>, buf: &mut [u8]) -> Vec<(String, usize)> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let mut mem = std::fs::File::open("/proc/self/mem").unwrap();
    let mut found = Vec::new();
    let n = masked.len();
    for line in maps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if !f[1].starts_with("rw") {
            continue;
        }
        let name = f.get(5).copied().unwrap_or("[anon]").to_string();
        let (a, b) = f[0].split_once('-').unwrap();
        let (lo, hi) = (
            usize::from_str_radix(a, 16).unwrap(),
            usize::from_str_radix(b, 16).unwrap(),
        );
        let mut pos = lo;
        while pos < hi {
            if skip.contains(&pos) {
                pos = skip.end;
                continue;
            }
            let end = hi
                .min(pos + buf.len())
                .min(if pos < skip.start { skip.start } else { hi });
            let len = end - pos;
            buf[..len].fill(0);
            if mem.seek(SeekFrom::Start(pos as u64)).is_err()
                || mem.read_exact(&mut buf[..len]).is_err()
            {
                pos = end;
                continue;
            }
            let mut hits = 0;
            for i in 0..len.saturating_sub(n - 1) {
                if buf[i] ^ MASK == masked[0] && (1..n).all(|j| buf[i + j] ^ MASK == masked[j]) {
                    hits += 1;
                }
            }
            buf[..len].fill(0);
            if hits > 0 {
                found.push((format!("{name} @{pos:#x}"), hits));
            }
            // Overlap by n-1 bytes so a key across chunk boundaries is seen.
            pos = if end < hi && len > n {
                end - (n - 1)
            } else {
                end
            };
        }
    }
    found
}

#[test]
fn memory_after_closing_a_volume_holds_no_copy_of_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let img = common::image(tmp.path(), "d.img", 1 << 20);
    // The key exists only masked here; the table line is built digit by digit into a
    // pre-sized zeroizing string (no reallocation leaves a stray copy).
    let masked = common::nbd::random_bytes(64);
    let mut line = zeroize::Zeroizing::new(String::with_capacity(512));
    line.push_str("0 2048 crypt aes-xts-plain64 ");
    for &m in &masked {
        let b = m ^ MASK;
        line.push(char::from_digit(u32::from(b >> 4), 16).unwrap());
        line.push(char::from_digit(u32::from(b & 15), 16).unwrap());
    }
    line.push_str(" 0 ");
    line.push_str(img.to_str().unwrap());
    line.push_str(" 0 1 sector_size:4096");
    assert!(line.len() < 512);
    // Hex needle (masked): the first 16 key bytes as lower-case hex.
    let hex_masked: Vec<u8> = masked[..16]
        .iter()
        .flat_map(|&m| {
            let b = m ^ MASK;
            [b >> 4, b & 15].map(|d| (char::from_digit(u32::from(d), 16).unwrap() as u8) ^ MASK)
        })
        .collect();
    let mut buf = vec![0u8; 1 << 20];
    let skip = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.len();
    let needles: [(&str, &[u8]); 3] = [
        ("XTS key 1 (bytes 0..32)", &masked[..32]),
        ("XTS key 2 (bytes 32..64)", &masked[32..]),
        ("key hex (first 16 bytes)", &hex_masked),
    ];
    let report = |when: &str, buf: &mut [u8]| -> usize {
        let mut total = 0;
        for (what, needle) in &needles {
            let found = scan(needle, skip.clone(), buf);
            let n: usize = found.iter().map(|f| f.1).sum();
            total += n;
            eprintln!("{when}: {what}: {n} copies {found:?}");
        }
        total
    };

    let opened = ucrypt::open_table(&line, ucrypt::OpenOptions::default()).unwrap();
    drop(line);
    let data = vec![0x3cu8; 1 << 20];
    ucrypt_backend::Backend::write_at(&*opened.volume, &data, 0, true).unwrap();
    let mut back = vec![0u8; 1 << 20];
    ucrypt_backend::Backend::read_at(&*opened.volume, &mut back, 0).unwrap();
    assert!(back == data);
    let open_copies = report("while open", &mut buf);
    assert!(
        open_copies > 0,
        "the scan finds the key while the volume is open (self-check)"
    );
    drop(opened);
    let closed_copies = report("after close", &mut buf);
    eprintln!(
        "key copies in process memory: {open_copies} while open, {closed_copies} after close"
    );
    assert_eq!(closed_copies, 0, "key material survives closing the volume");
}
