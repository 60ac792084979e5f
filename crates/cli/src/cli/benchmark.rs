//! `ucrypt benchmark`: cipher throughput per spec and sector size, measured through
//! ucrypt's own data path (`SectorCipher`), like `cryptsetup benchmark`, with the raw
//! AWS-LC XTS call measured in the same run for comparison. PBKDF rows come first, as in
//! cryptsetup: PBKDF2 iterations per second per hash and Argon2i/Argon2id time per
//! derivation, from the pure-Rust KDFs ucrypt's own keyslot unlock uses.

use super::CliError;
use std::time::{Duration, Instant};
use ucrypt_crypto::mode::aws_xts::RawLibraryXts;
use ucrypt_crypto::{CipherSpec, Sector512, SectorCipher, SectorParams, SectorSize, VolumeKey};

/// Arguments of `ucrypt benchmark`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Measure only this cipher spec (e.g. aes-xts-plain64); default: cryptsetup's list.
    #[arg(long, short = 'c')]
    cipher: Option<String>,
    /// Key size in bits for --cipher.
    #[arg(long, short = 's', default_value_t = 512)]
    key_size: usize,
    /// Encryption sector size in bytes.
    #[arg(long, default_value_t = 4096)]
    sector_size: u32,
    /// Bytes per measured call (a request's worth of sectors).
    #[arg(long, default_value_t = 1 << 20)]
    buffer: usize,
    /// Seconds measured per row and direction, split into 5 rounds (median reported).
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// Also measure the specs beyond cryptsetup's default list (HCTR2, XChaCha20-Adiantum,
    /// Camellia, Kuznyechik, CTR/LRW/benbi, CAST5, Blowfish, 3DES).
    #[arg(long)]
    all: bool,
    /// Print one JSON object per row instead of the table.
    #[arg(long)]
    json: bool,
    /// Measure only this PBKDF (pbkdf2 [with --hash], argon2i, argon2id); no cipher rows.
    #[arg(long)]
    pbkdf: Option<String>,
    /// Hash for --pbkdf pbkdf2 (default: all of sha1, sha256, sha512, ripemd160, whirlpool).
    #[arg(long)]
    hash: Option<String>,
    /// Argon2 memory cost in KiB for the Argon2 rows.
    #[arg(long, default_value_t = 65536)]
    pbkdf_memory: u32,
    /// Argon2 time cost (iterations) for the Argon2 rows.
    #[arg(long, default_value_t = 4)]
    pbkdf_force_iterations: u32,
    /// Also write an SVG chart of the cipher rows here (encryption and decryption panels,
    /// the spread of the rounds as error bars).
    #[arg(long, value_name = "FILE")]
    chart: Option<std::path::PathBuf>,
}

/// The chart of the cipher rows: a panel per direction, a group per spec and key size,
/// ucrypt's bar and the alternative library's beside it (one colour per library).
fn chart(a: &Args, ss: SectorSize, buffer: usize, rows: &[(Row, Option<Row>)]) -> String {
    use ucrypt::bench::chart::{render, Bar, Group, Panel};
    let bar = |variant: &str, r: Rate| Bar {
        variant: variant.to_string(),
        value: r.median,
        lo: r.lo,
        hi: r.hi,
        note: String::new(),
    };
    let panel = |title: &str, pick: fn(&Row) -> Rate| Panel {
        title: title.into(),
        unit: "MiB/s".into(),
        reference: None,
        log: true,
        groups: rows
            .iter()
            .map(|(r, alt)| Group {
                label: format!("{} {}b", r.name, r.key_bits),
                bars: std::iter::once(bar(
                    if r.name.starts_with("raw ") {
                        "raw AWS-LC"
                    } else {
                        "ucrypt"
                    },
                    pick(r),
                ))
                .chain(alt.iter().map(|x| bar(&x.name, pick(x))))
                .collect(),
            })
            .collect(),
    };
    render(
        "ucrypt benchmark: cipher throughput in memory (median of the rounds; error bars: lowest..highest)",
        &format!(
            "{} | sector size {ss}, {buffer} bytes per call, {ROUNDS} rounds in {} s per row and direction | {} CPUs | ucrypt {}",
            ucrypt::bench::chart::now_utc(),
            a.seconds,
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            env!("CARGO_PKG_VERSION")
        ),
        &[
            panel("Encryption", |r| r.enc),
            panel("Decryption", |r| r.dec),
        ],
    )
}

/// One PBKDF row.
enum KdfRow {
    /// PBKDF2 with a hash: iterations per second (256-bit key).
    Pbkdf2 { hash: String, per_second: f64 },
    /// Argon2: milliseconds per derivation with the given costs.
    Argon2 {
        kind: &'static str,
        time: u32,
        memory_kib: u32,
        ms: f64,
    },
}

/// Measures the PBKDF rows `a` asks for.
fn kdf_rows(a: &Args, seconds: f64) -> Result<Vec<KdfRow>, CliError> {
    use ucrypt_format::kdf::{argon2, Argon2Cost, Argon2Kind, Hash};
    let (do_pbkdf2, argons): (bool, Vec<&'static str>) = match a.pbkdf.as_deref() {
        None => (true, vec!["argon2i", "argon2id"]),
        Some("pbkdf2") => (true, vec![]),
        Some("argon2i") => (false, vec!["argon2i"]),
        Some("argon2id") => (false, vec!["argon2id"]),
        Some(other) => {
            return Err(anyhow::anyhow!(
                "unknown PBKDF \"{other}\" (expected pbkdf2, argon2i or argon2id)"
            )
            .into())
        }
    };
    let hashes: Vec<String> = match &a.hash {
        Some(h) => vec![h.clone()],
        None => ["sha1", "sha256", "sha512", "ripemd160", "whirlpool"]
            .map(String::from)
            .to_vec(),
    };
    let salt = [0x5cu8; 32];
    let mut out = [0u8; 32];
    let mut rows = Vec::new();
    let steps = super::progress::Steps::new(
        "PBKDF",
        (if do_pbkdf2 { hashes.len() } else { 0 } + argons.len()) as u64,
    );
    if do_pbkdf2 {
        for name in hashes {
            steps.message(format!("pbkdf2-{name}"));
            let hash = Hash::from_name(&name).map_err(anyhow::Error::from)?;
            // Grow the iteration count until one run takes a measurable time.
            let mut iters = 1000u32;
            let per_second = loop {
                let start = Instant::now();
                hash.pbkdf2(b"benchmark passphrase", &salt, iters, &mut out);
                let t = start.elapsed().as_secs_f64();
                if t >= seconds || iters >= 1 << 30 {
                    break f64::from(iters) / t.max(1e-9);
                }
                iters = iters.saturating_mul(if t < seconds / 8.0 { 8 } else { 2 });
            };
            rows.push(KdfRow::Pbkdf2 {
                hash: name,
                per_second,
            });
            steps.inc();
        }
    }
    for kind in argons {
        steps.message(kind);
        let cost = Argon2Cost {
            time: a.pbkdf_force_iterations.max(1),
            memory_kib: a.pbkdf_memory.max(8),
            lanes: 1,
        };
        let k = if kind == "argon2i" {
            Argon2Kind::I
        } else {
            Argon2Kind::Id
        };
        let start = Instant::now();
        argon2(k, cost, b"benchmark passphrase", &salt, &mut out).map_err(anyhow::Error::from)?;
        rows.push(KdfRow::Argon2 {
            kind,
            time: cost.time,
            memory_kib: cost.memory_kib,
            ms: start.elapsed().as_secs_f64() * 1000.0,
        });
        steps.inc();
    }
    steps.finish();
    Ok(rows)
}

fn print_kdf_rows(rows: &[KdfRow], json: bool) {
    for r in rows {
        match (r, json) {
            (KdfRow::Pbkdf2 { hash, per_second }, false) => println!(
                "PBKDF2-{hash:<10} {:>9.0} iterations per second for 256-bit key",
                per_second
            ),
            (KdfRow::Pbkdf2 { hash, per_second }, true) => println!(
                "{{\"pbkdf\":\"pbkdf2\",\"hash\":\"{hash}\",\"iterations_per_second\":{per_second:.0}}}"
            ),
            (KdfRow::Argon2 { kind, time, memory_kib, ms }, false) => println!(
                "{kind:<10} {time:>4} iterations, {memory_kib:>7} memory, 1 parallel threads (CPUs) for 256-bit key: {ms:.0} ms per derivation"
            ),
            (KdfRow::Argon2 { kind, time, memory_kib, ms }, true) => println!(
                "{{\"pbkdf\":\"{kind}\",\"time\":{time},\"memory_kib\":{memory_kib},\"threads\":1,\"ms_per_derivation\":{ms:.1}}}"
            ),
        }
    }
}

const DEFAULT_SPECS: &[(&str, usize)] = &[
    ("aes-cbc-essiv:sha256", 128),
    ("serpent-cbc-essiv:sha256", 128),
    ("twofish-cbc-essiv:sha256", 128),
    ("aes-cbc-essiv:sha256", 256),
    ("serpent-cbc-essiv:sha256", 256),
    ("twofish-cbc-essiv:sha256", 256),
    ("aes-xts-plain64", 256),
    ("serpent-xts-plain64", 256),
    ("twofish-xts-plain64", 256),
    ("aes-xts-plain64", 512),
    ("serpent-xts-plain64", 512),
    ("twofish-xts-plain64", 512),
    ("xchacha12,aes-adiantum-plain64", 256),
];

/// Added to the default list by `--all`: the other specs ucrypt serves that
/// `cryptsetup benchmark` does not list: HCTR2, Adiantum over XChaCha20, the ciphers of
/// VeraCrypt volumes (Camellia, Kuznyechik; Serpent and Twofish are above) and the older
/// modes and 64-bit block ciphers LUKS1 and loop-AES era volumes use.
const EXTRA_SPECS: &[(&str, usize)] = &[
    ("aes-hctr2-plain64", 128),
    ("aes-hctr2-plain64", 256),
    ("xchacha20,aes-adiantum-plain64", 256),
    ("camellia-xts-plain64", 256),
    ("camellia-xts-plain64", 512),
    ("camellia-cbc-essiv:sha256", 256),
    ("kuznyechik-xts-plain64", 512),
    ("kuznyechik-cbc-essiv:sha256", 256),
    ("aes-cbc-plain64", 256),
    ("aes-ctr-plain64", 256),
    ("aes-lrw-benbi", 384),
    ("aes-cbc-benbi", 256),
    ("serpent-cbc-plain64", 256),
    ("twofish-cbc-plain64", 256),
    ("cast5-cbc-plain64", 128),
    ("blowfish-cbc-plain64", 256),
    ("des3_ede-cbc-plain64", 192),
];

const ROUNDS: usize = 5;

/// CPU time of the calling thread. Rates are bytes per second of it: the cipher rows run
/// on this one thread, and on a shared machine its CPU time is what the work cost, where
/// wall time also counts the time other processes held the CPU (on an idle machine the
/// two agree).
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for clock_gettime to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// MiB per second of this thread's CPU time of `f`, called for `period` of wall time
/// (at least once), processing `bytes` per call.
fn measure_once(bytes: usize, period: Duration, mut f: impl FnMut()) -> f64 {
    let (start, cpu) = (Instant::now(), thread_cpu());
    let mut calls = 0u64;
    while calls == 0 || start.elapsed() < period {
        f();
        calls += 1;
    }
    let secs = (thread_cpu() - cpu).as_secs_f64().max(1e-9);
    (calls as f64 * bytes as f64) / secs / (1024.0 * 1024.0)
}

/// Median over `2 * ROUNDS + 1` interleaved pairs (a, b, b, a, ...) of rate(a) / rate(b),
/// so a neighbour's load hits both sides alike and neither always gets the warm cache.
fn interleaved_ratio(
    data: &mut [u8],
    per_round: Duration,
    mut a: impl FnMut(&mut [u8]),
    mut b: impl FnMut(&mut [u8]),
) -> f64 {
    let bytes = data.len();
    let mut ratios: Vec<f64> = (0..2 * ROUNDS + 1)
        .map(|i| {
            if i % 2 == 0 {
                let ra = measure_once(bytes, per_round / 2, || a(data));
                ra / measure_once(bytes, per_round / 2, || b(data))
            } else {
                let rb = measure_once(bytes, per_round / 2, || b(data));
                measure_once(bytes, per_round / 2, || a(data)) / rb
            }
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    ratios[ROUNDS]
}

/// A throughput: the median of the rounds, and their lowest and highest (the chart's error
/// bars). Formats as the median, so `{:>9.1}` prints as before.
#[derive(Debug, Clone, Copy)]
struct Rate {
    median: f64,
    lo: f64,
    hi: f64,
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.median, f)
    }
}

fn measure(bytes: usize, per_round: Duration, mut f: impl FnMut()) -> Rate {
    f(); // warm up (page faults, key schedule caches)
    let mut rates: Vec<f64> = (0..ROUNDS)
        .map(|_| measure_once(bytes, per_round, &mut f))
        .collect();
    rates.sort_by(f64::total_cmp);
    Rate {
        median: rates[ROUNDS / 2],
        lo: rates[0],
        hi: rates[ROUNDS - 1],
    }
}

#[derive(Clone)]
struct Row {
    name: String,
    key_bits: usize,
    enc: Rate,
    dec: Rate,
}

/// Another library's figure for the same work, where ucrypt links one: AES-XTS through
/// the `aes` crate (plain64 IVs, our batched XTS loop) beside AWS-LC or the VAES kernel,
/// AES-XTS with a 512-bit key through raw AWS-LC calls beside ucrypt's path, and
/// Serpent-XTS through the `serpent` crate beside ucrypt's bit-sliced SIMD Serpent, and
/// Adiantum through the `adiantum` crate beside ucrypt's (AVX2 NH).
fn alternative(
    spec: &CipherSpec,
    key: &[u8],
    data: &mut [u8],
    sector_bytes: usize,
    per_round: Duration,
) -> Option<Row> {
    use ucrypt_crypto::block::reference_block_cipher;
    use ucrypt_crypto::mode::{adiantum::AdiantumCrate, xts::Xts, ChainMode, Mode};
    let bytes = data.len();
    let run = |f: &mut dyn FnMut(&mut [u8], bool), data: &mut [u8]| {
        let enc = measure(bytes, per_round, || f(data, true));
        let dec = measure(bytes, per_round, || f(data, false));
        (enc, dec)
    };
    if spec.mode == ChainMode::Adiantum {
        let reference = AdiantumCrate::new(&spec.cipher, key)?;
        let mut iv = [0u8; 32];
        let (enc, dec) = run(
            &mut |d, e| {
                for (n, sector) in d.chunks_exact_mut(sector_bytes).enumerate() {
                    iv[..8].copy_from_slice(&(n as u64).to_le_bytes());
                    if e {
                        reference.encrypt(&iv, sector);
                    } else {
                        reference.decrypt(&iv, sector);
                    }
                }
            },
            data,
        );
        return Some(Row {
            name: "adiantum crate".into(),
            key_bits: key.len() * 8,
            enc,
            dec,
        });
    }
    if spec.mode != ChainMode::Xts {
        return None;
    }
    if spec.cipher == "aes" && key.len() == 64 {
        let mut raw = RawLibraryXts::new(key)?;
        let (enc, dec) = run(&mut |d, e| raw.run(d, sector_bytes, e), data);
        return Some(Row {
            name: "raw AWS-LC".into(),
            key_bits: 512,
            enc,
            dec,
        });
    }
    let (xts, name) = if spec.cipher == "aes" {
        (Xts::new("aes", key).ok()?, "aes crate XTS".to_string())
    } else {
        // ucrypt's own multi-block code beside the RustCrypto crate, one block per call.
        let (k1, k2) = key.split_at(key.len() / 2);
        let xts = Xts::from_ciphers(
            reference_block_cipher(&spec.cipher, k1)?,
            reference_block_cipher(&spec.cipher, k2)?,
        )?;
        (xts, format!("{} crate XTS", spec.cipher))
    };
    let mut iv = [0u8; 16];
    let (enc, dec) = run(
        &mut |d, e| {
            for (n, sector) in d.chunks_exact_mut(sector_bytes).enumerate() {
                iv[..8].copy_from_slice(&(n as u64).to_le_bytes());
                if e {
                    xts.encrypt(&iv, sector);
                } else {
                    xts.decrypt(&iv, sector);
                }
            }
        },
        data,
    );
    Some(Row {
        name,
        key_bits: key.len() * 8,
        enc,
        dec,
    })
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    // Measuring writes nothing: Ctrl-C ends it at once.
    let _exit = super::progress::ExitOnSignal::new();
    // cryptsetup: PBKDF rows unless a cipher is asked for; only them with --pbkdf.
    if a.cipher.is_none() {
        let rows = kdf_rows(&a, (a.seconds / 4.0).clamp(0.02, 1.0))?;
        if !a.json {
            println!("# Tests are approximate using memory only (no storage IO).");
        }
        print_kdf_rows(&rows, a.json);
        if a.pbkdf.is_some() {
            return Ok(());
        }
    }
    let ss = SectorSize::new_extended(a.sector_size)?;
    let buffer = a.buffer.max(ss.len()) / ss.len() * ss.len();
    let per_round = Duration::from_secs_f64(a.seconds.max(0.05) / ROUNDS as f64);
    let specs: Vec<(String, usize)> = match &a.cipher {
        Some(c) => vec![(c.clone(), a.key_size)],
        None => DEFAULT_SPECS
            .iter()
            .chain(if a.all { EXTRA_SPECS } else { &[] })
            .map(|(s, k)| (s.to_string(), *k))
            .collect(),
    };
    let key_bytes: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
    // Page-aligned, as the engine's request buffers are: from a plain Vec the address is
    // only 16-byte aligned, so a 64-byte vector load can straddle two cache lines, and
    // which buffer address malloc returned moved the VAES rows by up to a quarter.
    let mut data = ucrypt_backend::aligned::AlignedBuf::zeroed(buffer, 4096)?;
    data.fill(0x5a);
    let mut rows = Vec::new();
    let mut charted = Vec::new();
    if !a.json {
        println!("# Tests are approximate using memory only (no storage IO); sector size {ss}, {buffer} bytes per call, median of {ROUNDS} rounds, MiB per second of the measuring thread's CPU time.");
        println!(
            "#{:>34} {:>6} {:>14} {:>14}   best alternative measured in this run",
            "Algorithm", "Key", "Encryption", "Decryption"
        );
    }
    let steps = super::progress::Steps::new("Ciphers", specs.len() as u64 + 1);
    let print_row = |r: &Row, alt: Option<&Row>| {
        if a.json {
            let alt = alt.map_or_else(String::new, |x| {
                format!(
                    ",\"alternative\":{{\"name\":\"{}\",\"encrypt_mib_s\":{:.1},\"decrypt_mib_s\":{:.1}}}",
                    x.name, x.enc, x.dec
                )
            });
            println!(
                "{{\"cipher\":\"{}\",\"key_bits\":{},\"sector_size\":{},\"encrypt_mib_s\":{:.1},\"decrypt_mib_s\":{:.1}{alt}}}",
                r.name, r.key_bits, ss, r.enc, r.dec
            );
        } else {
            let alt = alt.map_or_else(String::new, |x| {
                format!("   {}: {:.1} / {:.1} MiB/s", x.name, x.enc, x.dec)
            });
            steps.suspend(|| {
                println!(
                    "{:>35} {:>5}b {:>9.1} MiB/s {:>9.1} MiB/s{alt}",
                    r.name, r.key_bits, r.enc, r.dec
                )
            });
        }
        // Rows appear as they finish, not all at the end.
        let _ = std::io::Write::flush(&mut std::io::stdout());
    };
    for (spec, bits) in &specs {
        steps.message(format!("{spec} {bits}b"));
        let parsed = spec.parse::<CipherSpec>()?;
        let key = &key_bytes[..bits / 8];
        let cipher: Box<dyn SectorCipher> = parsed.build(
            &VolumeKey::new(key.to_vec()),
            SectorParams {
                sector_size: ss,
                ..Default::default()
            },
        )?;
        let enc = measure(buffer, per_round, || {
            cipher.encrypt(Sector512(0), &mut data)
        });
        let dec = measure(buffer, per_round, || {
            cipher.decrypt(Sector512(0), &mut data)
        });
        let row = Row {
            name: spec.clone(),
            key_bits: *bits,
            enc,
            dec,
        };
        let alt = alternative(&parsed, key, &mut data, ss.len(), per_round);
        print_row(&row, alt.as_ref());
        steps.inc();
        charted.push((row.clone(), alt));
        rows.push(row);
    }
    steps.message("raw AWS-LC baseline");
    // The raw library baseline for the hot path, in the same run.
    let raw = RawLibraryXts::new(&key_bytes[..64]).map(|mut raw| {
        let enc = measure(buffer, per_round, || raw.run(&mut data, ss.len(), true));
        let dec = measure(buffer, per_round, || raw.run(&mut data, ss.len(), false));
        Row {
            name: "raw AWS-LC aes-256-xts (one call per sector)".into(),
            key_bits: 512,
            enc,
            dec,
        }
    });
    if let Some(r) = &raw {
        print_row(r, None);
        charted.push((r.clone(), None));
    }
    steps.finish();
    if let Some(path) = &a.chart {
        std::fs::write(path, chart(&a, ss, buffer, &charted))
            .map_err(|e| anyhow::anyhow!("writing chart {}: {e}", path.display()))?;
        eprintln!("chart written to {}", path.display());
    }
    let ours = rows
        .iter()
        .find(|r| r.name == "aes-xts-plain64" && r.key_bits == 512);
    let report = |line: String| {
        if a.json {
            eprintln!("{line}");
        } else {
            println!("# {line}");
        }
    };
    let build = |bits: usize| -> Result<Box<dyn SectorCipher>, CliError> {
        Ok("aes-xts-plain64".parse::<CipherSpec>()?.build(
            &VolumeKey::new(key_bytes[..bits / 8].to_vec()),
            SectorParams {
                sector_size: ss,
                ..Default::default()
            },
        )?)
    };
    if let (Some(_), Some(mut raw)) = (ours, RawLibraryXts::new(&key_bytes[..64])) {
        let ours = build(512)?;
        let (enc, dec) = (
            interleaved_ratio(
                &mut data,
                per_round,
                |d| ours.encrypt(Sector512(0), d),
                |d| raw.run(d, ss.len(), true),
            ),
            interleaved_ratio(
                &mut data,
                per_round,
                |d| ours.decrypt(Sector512(0), d),
                |d| raw.run(d, ss.len(), false),
            ),
        );
        report(format!(
            "aes-xts-plain64 512b vs raw library call (median of {} interleaved pairs): encrypt {enc:.3}x, decrypt {dec:.3}x",
            2 * ROUNDS + 1
        ));
    }
    let has = |bits: usize| {
        rows.iter()
            .any(|r| r.name == "aes-xts-plain64" && r.key_bits == bits)
    };
    if has(256) && has(512) {
        // AES-128-XTS does 10 rounds per block against AES-256's 14: it should be faster.
        let (k256, k512) = (build(256)?, build(512)?);
        let (enc, dec) = (
            interleaved_ratio(
                &mut data,
                per_round,
                |d| k256.encrypt(Sector512(0), d),
                |d| k512.encrypt(Sector512(0), d),
            ),
            interleaved_ratio(
                &mut data,
                per_round,
                |d| k256.decrypt(Sector512(0), d),
                |d| k512.decrypt(Sector512(0), d),
            ),
        );
        report(format!(
            "aes-xts-plain64 256b (AES-128-XTS) vs 512b (AES-256-XTS) (median of {} interleaved pairs): encrypt {enc:.3}x, decrypt {dec:.3}x",
            2 * ROUNDS + 1
        ));
    }
    Ok(())
}
