//! Fuzz targets that run on stable, bounded, in the normal test suite: a random-mutation
//! loop over the committed corpus in `fuzz/corpus/<target>/` (bit flips, interesting
//! integers, truncation, deletion, insertion, splicing; table lines also get token-level
//! edits). Each target runs for `UCRYPT_FUZZ_SECONDS` (default 2) or 5,000,000 inputs,
//! whichever comes first. A panic saves the input under `fuzz/artifacts/<target>/` and
//! fails the test with its path; replay with `UCRYPT_FUZZ_SEED`.
//!
//! | target | what runs | properties beyond "no panic" |
//! |---|---|---|
//! | `nbd_handshake` | `handshake::Handshake::feed` with the bytes as the client's side | reads bounded by `MAX_OPTION_BYTES`, every `Continue` reply is whole option-reply frames, at most `MAX_OPTIONS` options, then the rest as a request stream |
//! | `nbd_requests` | `command::Request::parse` + `command::validate` over a byte stream | a validated command lies inside the export and under the payload limit |
//! | `table_line` | `TableLine::from_str`, `to_line`, `validate`, `build_cipher` | the canonical line re-parses to itself; the key never shows in the hidden line or an error |
//! | `bitlk_metadata` | an FVE metadata block through `bitlk::keys::Metadata` (entries, VMK protectors, clear-key AES-CCM unwrapping, FVEK) | a key comes out only in a size dm-crypt takes (16, 32 or 64 bytes) |
//! | `luks_header` | LUKS1/LUKS2 header bytes through `ucrypt::unlock` (libcryptsetup load, requirements, cipher, keyslot) | errors, never panics; the key never shows in an error |

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ucrypt_testkit::Rng;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = root().join("corpus").join(target);
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    let c: Vec<Vec<u8>> = names.iter().map(|p| std::fs::read(p).unwrap()).collect();
    assert!(!c.is_empty(), "empty corpus {}", dir.display());
    c
}

const U32S: [u32; 10] = [
    0,
    1,
    511,
    512,
    4096,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_fffe,
    0xffff_ffff,
    65536,
];
const U64S: [u64; 6] = [0, 1, 1 << 20, u64::MAX, u64::MAX - 511, 1 << 63];

/// Mutations are aimed at the first `hot` bytes four times out of five.
fn mutate(rng: &mut Rng, base: &[u8], corpus: &[Vec<u8>], hot: usize) -> Vec<u8> {
    let mut v = base.to_vec();
    for _ in 0..1 + rng.index(4) {
        let span = if rng.index(5) != 0 {
            v.len().min(hot)
        } else {
            v.len()
        };
        let at = rng.index(span.max(1));
        let last = at.min(v.len().saturating_sub(1));
        match rng.index(10) {
            0 if !v.is_empty() => v[last] ^= 1 << rng.index(8),
            1 if !v.is_empty() => {
                v[last] = [0, 1, 0x7f, 0x80, 0xff, b'0', b'9', b' ', b'"'][rng.index(9)]
            }
            2 if at + 4 <= v.len() => {
                v[at..at + 4].copy_from_slice(&U32S[rng.index(U32S.len())].to_be_bytes())
            }
            3 if at + 8 <= v.len() => {
                v[at..at + 8].copy_from_slice(&U64S[rng.index(U64S.len())].to_be_bytes())
            }
            4 => v.truncate(at),
            5 if at < v.len() => {
                let n = 1 + rng.index((v.len() - at).min(64));
                v.drain(at..at + n);
            }
            6 if at <= v.len() => {
                let n = 1 + rng.index(32);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
                v.splice(at..at, bytes);
            }
            7 => {
                let other = &corpus[rng.index(corpus.len())];
                let from = rng.index(other.len() + 1);
                v.truncate(at);
                v.extend_from_slice(&other[from..]);
            }
            8 if at < v.len() => {
                // Duplicate a chunk (repeated frames, repeated options).
                let n = 1 + rng.index((v.len() - at).min(256));
                let chunk = v[at..at + n].to_vec();
                v.splice(at..at, chunk);
            }
            _ if !v.is_empty() => v[last] = rng.next_u64() as u8,
            _ => v.push(rng.next_u64() as u8),
        }
    }
    v
}

fn seed() -> u64 {
    ucrypt_testkit::seed("UCRYPT_FUZZ_SEED")
}

fn budget() -> Duration {
    Duration::from_secs_f64(
        std::env::var("UCRYPT_FUZZ_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(2.0),
    )
}

/// Runs `check` on every corpus entry, then on mutants until the budget is spent.
/// `mutator` may post-process a mutant (e.g. fix a checksum); it gets the RNG.
fn fuzz(
    target: &str,
    hot: usize,
    extra: impl Fn(&mut Rng, Vec<u8>) -> Vec<u8>,
    check: impl Fn(&[u8]),
) -> u64 {
    let seed = seed();
    let mut rng = Rng::new(seed);
    let corpus = corpus(target);
    let start = Instant::now();
    let mut n = 0u64;
    let run = |input: &[u8], n: u64| {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(input))).is_err() {
            let dir = root().join("artifacts").join(target);
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join(format!("crash-{seed}-{n}"));
            std::fs::write(&path, input).unwrap();
            panic!(
                "fuzz target {target} panicked (seed {seed}); input saved to {}",
                path.display()
            );
        }
    };
    for c in &corpus {
        run(c, n);
        n += 1;
    }
    while start.elapsed() < budget() && n < 5_000_000 {
        let base = &corpus[rng.index(corpus.len())];
        let m = mutate(&mut rng, base, &corpus, hot);
        let m = extra(&mut rng, m);
        run(&m, n);
        n += 1;
    }
    eprintln!(
        "fuzz {target}: seed {seed}: {n} inputs in {:.1} s, no panic",
        start.elapsed().as_secs_f64()
    );
    n
}

// ---------------------------------------------------------------------------------------
// NBD

mod nbd_targets {
    use ucrypt_nbd::command::{validate, Command, Limits, Request};
    use ucrypt_nbd::handshake::{ExportInfo, Handshake, Step, MAX_OPTIONS, MAX_OPTION_BYTES};
    use ucrypt_nbd::proto::*;

    pub const SIZE: u64 = 1 << 20;
    pub const MAX_PAYLOAD: u32 = 64 << 10;

    pub fn export() -> ExportInfo {
        ExportInfo {
            name: "fuzz".into(),
            description: "fuzzed export".into(),
            size_bytes: SIZE,
            flags: NBD_FLAG_HAS_FLAGS
                | NBD_FLAG_SEND_FLUSH
                | NBD_FLAG_SEND_FUA
                | NBD_FLAG_SEND_TRIM
                | NBD_FLAG_SEND_WRITE_ZEROES
                | NBD_FLAG_CAN_MULTI_CONN,
            min_block: 512,
            preferred_block: 4096,
            max_block: MAX_PAYLOAD,
        }
    }

    /// Whole option-reply frames (magic, option, type, length, data), nothing else.
    fn assert_option_replies(mut out: &[u8]) {
        while !out.is_empty() {
            assert!(out.len() >= 20, "a truncated option reply: {out:02x?}");
            let magic = u64::from_be_bytes(out[..8].try_into().unwrap());
            assert_eq!(magic, NBD_REP_MAGIC, "option reply magic");
            let len = u32::from_be_bytes(out[16..20].try_into().unwrap()) as usize;
            assert!(
                out.len() >= 20 + len,
                "option reply shorter than its length"
            );
            out = &out[20 + len..];
        }
    }

    pub fn handshake(input: &[u8]) {
        let mut hs = Handshake::new(export());
        let mut rest = input;
        let mut steps = 0u32;
        loop {
            let want = hs.wants();
            assert!(want <= MAX_OPTION_BYTES as usize, "asks for {want} bytes");
            if want > rest.len() {
                return; // the client vanished mid-message
            }
            let (chunk, r) = rest.split_at(want);
            rest = r;
            let mut out = Vec::new();
            steps += 1;
            assert!(
                steps <= MAX_OPTIONS + 2,
                "more than MAX_OPTIONS options accepted"
            );
            match hs.feed(chunk, &mut out) {
                Ok(Step::Continue) => assert_option_replies(&out),
                Ok(Step::Transmission(n)) => {
                    let limits = Limits {
                        size_bytes: SIZE,
                        flags: n.flags,
                        max_payload: MAX_PAYLOAD,
                        block_status: n.base_allocation,
                    };
                    requests(rest, &limits);
                    return;
                }
                Ok(Step::Close | Step::StartTls) | Err(_) => return,
            }
        }
    }

    pub fn requests(mut rest: &[u8], limits: &Limits) {
        while rest.len() >= REQUEST_HEADER_BYTES {
            let h: [u8; REQUEST_HEADER_BYTES] = rest[..REQUEST_HEADER_BYTES].try_into().unwrap();
            rest = &rest[REQUEST_HEADER_BYTES..];
            let Ok(req) = Request::parse(&h) else {
                return; // bad magic: hard disconnect
            };
            assert_eq!(Request::parse(&req.encode()), Ok(req), "header round trip");
            let in_range = |offset: u64, len: u32| {
                len > 0
                    && offset
                        .checked_add(u64::from(len))
                        .is_some_and(|e| e <= limits.size_bytes)
            };
            match validate(&req, limits) {
                Ok(Command::Read { offset, len }) => {
                    assert!(
                        in_range(offset, len) && len <= limits.max_payload,
                        "{req:?}"
                    )
                }
                Ok(Command::Write { offset, len, .. }) => {
                    assert!(
                        in_range(offset, len) && len <= limits.max_payload,
                        "{req:?}"
                    );
                    assert!(limits.flags & NBD_FLAG_READ_ONLY == 0);
                }
                Ok(
                    Command::Trim { offset, len, .. } | Command::WriteZeroes { offset, len, .. },
                ) => {
                    assert!(in_range(offset, len), "{req:?}")
                }
                Ok(Command::BlockStatus { offset, len, .. }) => {
                    assert!(in_range(offset, len) && limits.block_status, "{req:?}")
                }
                Ok(Command::Flush) => assert!(req.offset == 0 && req.length == 0),
                Ok(Command::Disc) => return,
                Err(e) => assert_ne!(e.value(), 0, "an error reply must carry an errno"),
            }
            // The payload of a write is consumed whether or not it was accepted.
            let p = req.payload_bytes() as usize;
            if p > rest.len() {
                return;
            }
            rest = &rest[p..];
        }
    }
}

#[test]
fn fuzz_nbd_handshake() {
    fuzz(
        "nbd_handshake",
        usize::MAX,
        |_, v| v,
        nbd_targets::handshake,
    );
}

#[test]
fn fuzz_nbd_requests() {
    use ucrypt_nbd::proto::*;
    let limits = |flags| ucrypt_nbd::command::Limits {
        size_bytes: nbd_targets::SIZE,
        flags,
        max_payload: nbd_targets::MAX_PAYLOAD,
        block_status: true,
    };
    fuzz(
        "nbd_requests",
        usize::MAX,
        |_, v| v,
        |input| {
            nbd_targets::requests(input, &limits(nbd_targets::export().flags));
            nbd_targets::requests(input, &limits(NBD_FLAG_HAS_FLAGS | NBD_FLAG_READ_ONLY));
        },
    );
}

// ---------------------------------------------------------------------------------------
// Table lines

const TOKENS: &[&str] = &[
    "0",
    "1",
    "-1",
    "18446744073709551615",
    "18446744073709551616",
    "-",
    ":",
    ":64:user:",
    ":64:logon:x",
    "capi:",
    "capi:xts(aes)-plain64",
    "aes-xts-plain64",
    "aes-cbc-essiv:",
    "aes:0-cbc-lmk",
    "aes:4294967296-cbc-lmk",
    "sector_size:0",
    "sector_size:513",
    "sector_size:65536",
    "sector_size:131072",
    "iv_large_sectors",
    "integrity:28:aead",
    "99",
    "",
    "crypt",
];

fn mutate_tokens(rng: &mut Rng, v: Vec<u8>) -> Vec<u8> {
    if rng.index(2) == 0 {
        return v;
    }
    let s = String::from_utf8_lossy(&v).into_owned();
    let mut t: Vec<String> = s.split(' ').map(str::to_string).collect();
    let i = rng.index(t.len());
    match rng.index(4) {
        0 => t[i] = TOKENS[rng.index(TOKENS.len())].to_string(),
        1 => {
            let j = rng.index(t.len());
            t.swap(i, j);
        }
        2 => t.insert(i, TOKENS[rng.index(TOKENS.len())].to_string()),
        _ => {
            t.remove(i);
        }
    }
    t.join(" ").into_bytes()
}

fn table_line(input: &[u8]) {
    use ucrypt_format::{KeySource, TableLine, ValidateOptions};
    let s = String::from_utf8_lossy(input);
    let key_tok = s
        .split_whitespace()
        .nth(4)
        .filter(|k| k.len() >= 16 && k.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(str::to_ascii_lowercase);
    match s.parse::<TableLine>() {
        Ok(t) => {
            let shown = t.to_line(true);
            let again: TableLine = shown
                .parse()
                .unwrap_or_else(|e| panic!("canonical line {shown:?} does not re-parse: {e}"));
            assert_eq!(again.to_line(true), shown, "canonical form is not stable");
            let hidden = t.to_line(false);
            if let KeySource::Hex(k) = &t.key {
                if !k.is_empty() {
                    // The device path may contain anything; the key field must not.
                    let field = hidden.split_whitespace().nth(4).unwrap();
                    assert!(
                        field.starts_with("<key:") && !field.contains(&*k.to_hex()),
                        "key in the hidden line: {field}"
                    );
                }
            }
            // Other fields are echoed as given: check only keys that appear nowhere else,
            // also not once Debug has escaped them (a NUL before "0112..." prints as
            // "\00112...", which a key "00112..." then matches).
            let elsewhere = |k: &String| {
                s.split_whitespace().enumerate().any(|(i, f)| {
                    i != 4
                        && (f.to_ascii_lowercase().contains(k.as_str())
                            || format!("{f:?}").to_ascii_lowercase().contains(k.as_str()))
                })
            };
            if let Some(k) = key_tok.as_ref().filter(|k| !elsewhere(k)) {
                assert!(
                    !format!("{t:?}").to_ascii_lowercase().contains(k.as_str()),
                    "key in Debug"
                );
            }
            if matches!(t.key, KeySource::Hex(_)) {
                for large in [false, true] {
                    let opts = ValidateOptions {
                        allow_large_sectors: large,
                    };
                    if let Err(e) = t.build_cipher(opts) {
                        let msg = e.to_string();
                        if let Some(k) = key_tok.as_ref().filter(|k| !elsewhere(k)) {
                            assert!(
                                !msg.to_ascii_lowercase().contains(k.as_str()),
                                "key in error: {msg}"
                            );
                        }
                    }
                }
            }
        }
        Err(e) => {
            let msg = e.to_string();
            if let Some(k) = &key_tok {
                assert!(
                    !msg.to_ascii_lowercase().contains(k.as_str()),
                    "a table error echoes the key: {msg}"
                );
            }
        }
    }
}

#[test]
fn fuzz_table_line() {
    fuzz("table_line", usize::MAX, mutate_tokens, table_line);
}

// ---------------------------------------------------------------------------------------
// LUKS headers through ucrypt's open path

/// The passphrase of the `ucrypt-*` corpus entries (made with `--pbkdf-force-iterations 1000`).
const PASS: &[u8] = b"fuzz";
const DEVICE_BYTES: u64 = 4 << 20;

/// Keeps a mutant cheap to unlock: LUKS1 PBKDF2 iteration counts above 1000 (keyslots, the
/// volume-key digest) and key sizes above 64 bytes are clamped; a mutated iteration count
/// must not turn a test into a 4-billion-round PBKDF2. Returns false for LUKS2 headers whose
/// JSON asks for costly KDFs (those are only loaded, not unlocked).
fn tame(v: &mut [u8]) -> bool {
    let be = |b: &[u8]| u32::from_be_bytes(b.try_into().unwrap());
    if v.len() >= 8 && &v[..6] == b"LUKS\xba\xbe" && v[6..8] == [0, 1] {
        let mut clamp = |at: usize, max: u32| {
            if v.len() >= at + 4 && be(&v[at..at + 4]) > max {
                v[at..at + 4].copy_from_slice(&max.to_be_bytes());
            }
        };
        clamp(108, 64); // key bytes
        clamp(164, 1000); // volume-key digest iterations
        for slot in 0..8 {
            clamp(208 + 48 * slot + 4, 1000);
        }
        return true;
    }
    let json = String::from_utf8_lossy(&v[v.len().min(4096)..v.len().min(32768)]).into_owned();
    if json.contains("argon") {
        return false;
    }
    let mut rest = json.as_str();
    while let Some(i) = rest.find("\"iterations\"") {
        rest = &rest[i + 12..];
        let digits: String = rest
            .chars()
            .skip_while(|c| !c.is_ascii_digit() && *c != ',' && *c != '}')
            .take_while(char::is_ascii_digit)
            .collect();
        if digits.len() > 4 || digits.parse::<u32>().map_or(true, |n| n > 5000) {
            return false;
        }
    }
    true
}

/// Recomputes the LUKS2 primary header checksum (SHA-256 over `hdr_size` bytes with the
/// checksum field zeroed), so mutations reach the JSON parser instead of stopping at the
/// checksum (and falling back to the intact secondary header).
fn fix_luks2_checksum(rng: &mut Rng, mut v: Vec<u8>) -> Vec<u8> {
    use sha2::Digest;
    if rng.index(2) == 0 || v.len() < 512 || &v[..6] != b"LUKS\xba\xbe" || v[6..8] != [0, 2] {
        return v;
    }
    let size = u64::from_be_bytes(v[8..16].try_into().unwrap());
    if !(4096..=v.len() as u64).contains(&size) {
        return v;
    }
    v[448..512].fill(0);
    let sum = sha2::Sha256::digest(&v[..size as usize]);
    v[448..448 + 32].copy_from_slice(&sum);
    v
}

fn luks_header(path: &Path, input: &[u8]) {
    use ucrypt::{HeaderOptions, VolumeType};
    let mut v = input.to_vec();
    let cheap = tame(&mut v);
    std::fs::write(path, &v).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len((v.len() as u64).max(DEVICE_BYTES)).unwrap();
    drop(f);
    let opts = HeaderOptions {
        kind: VolumeType::Luks,
        ..HeaderOptions::default()
    };
    if cheap {
        match ucrypt::unlock(path, PASS, &opts) {
            Ok(u) => {
                let line = u.first_line().to_line(false);
                if let ucrypt_format::KeySource::Hex(k) = &u.first_line().key {
                    assert!(k.is_empty() || !line.contains(&*k.to_hex()));
                }
                let _ = format!("{u:?}");
            }
            Err(e) => {
                let _ = format!("{e:#}");
            }
        }
    } else {
        let Ok(mut cd) = ucrypt::header::crypt_device(path, None) else {
            return;
        };
        if ucrypt::header::load_luks(&mut cd, VolumeType::Luks).is_ok() {
            let _ = ucrypt::header::check_requirements(&mut cd);
            let _ = cd.info();
        }
    }
}

#[test]
fn fuzz_luks_headers() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("hdr.img");
    // The control: the corpus entry itself opens with its passphrase.
    let good =
        std::fs::read(root().join("corpus/luks1_header/ucrypt-luks1-aes-cbc-essiv-pbkdf2-1000"))
            .unwrap();
    std::fs::write(&path, &good).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(DEVICE_BYTES)
        .unwrap();
    ucrypt::unlock(&path, PASS, &ucrypt::HeaderOptions::default())
        .expect("the LUKS1 corpus entry opens with its passphrase");
    // libcryptsetup keeps per-thread logs; run both header kinds in this one thread.
    fuzz("luks1_header", 1024, |_, v| v, |i| luks_header(&path, i));
    fuzz("luks2_header", 16384, fix_luks2_checksum, |i| {
        luks_header(&path, i)
    });
}

// ---------------------------------------------------------------------------------------
// BitLocker FVE metadata

fn bitlk_metadata(input: &[u8]) {
    use ucrypt_format::bitlk::keys::Metadata;
    let Ok(m) = Metadata::from_block(input.to_vec(), "fuzz") else {
        return;
    };
    let _ = m.protections();
    // Not UTF-8: no passphrase or recovery stretch (2^20 SHA-256 each), clear keys only.
    match m.volume_key(b"\xff") {
        Ok(k) => assert!(
            [16, 32, 64].contains(&k.as_bytes().len()),
            "{} key bytes",
            k.as_bytes().len()
        ),
        Err(e) => {
            let _ = e.to_string();
        }
    }
}

#[test]
fn fuzz_bitlk_metadata() {
    // The control: the clear-key corpus entry unwraps to the FVEK cryptsetup's suite states.
    let good = std::fs::read(root().join("corpus/bitlk_metadata/clearkey-only")).unwrap();
    let key = ucrypt_format::bitlk::keys::Metadata::from_block(good, "corpus")
        .unwrap()
        .volume_key(b"")
        .unwrap();
    assert_eq!(
        &*key.to_hex(),
        "0d465940133298dd6d9c91b81f2b221e49995ce15f7576cd26b0807edd34a1bb"
    );
    fuzz("bitlk_metadata", 1024, |_, v| v, bitlk_metadata);
}
