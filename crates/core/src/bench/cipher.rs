//! `ucrypt benchmark`: cipher throughput per spec and sector size, measured through
//! ucrypt's own data path (`SectorCipher`), like `cryptsetup benchmark`, with another
//! library's figure for the same work (raw AWS-LC, the RustCrypto crates) measured in the
//! same run; and the PBKDF rows: PBKDF2 iterations per second per hash and Argon2i/Argon2id
//! time per derivation, from the pure-Rust KDFs ucrypt's own keyslot unlock uses.
//!
//! Rates are MiB per second of the measuring thread's CPU time, the median of [`ROUNDS`]
//! rounds. The caller picks the rows, shows progress and prints; [`CipherBench`] measures.

use crate::error::{Error, Result};
use std::time::{Duration, Instant};
use ucrypt_crypto::mode::aws_xts::RawLibraryXts;
use ucrypt_crypto::{CipherSpec, Sector512, SectorCipher, SectorParams, SectorSize, VolumeKey};

/// Rounds measured per row and direction.
pub const ROUNDS: usize = 5;

/// cryptsetup benchmark's list: spec and key bits.
pub const DEFAULT_SPECS: &[(&str, usize)] = &[
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
pub const EXTRA_SPECS: &[(&str, usize)] = &[
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

/// The cipher rows to measure: `cipher` alone (with `key_bits`), else the default list
/// (and the extra one with `all`).
pub fn specs(cipher: Option<&str>, key_bits: usize, all: bool) -> Vec<(String, usize)> {
    match cipher {
        Some(c) => vec![(c.to_string(), key_bits)],
        None => DEFAULT_SPECS
            .iter()
            .chain(if all { EXTRA_SPECS } else { &[] })
            .map(|(s, k)| (s.to_string(), *k))
            .collect(),
    }
}

/// One PBKDF row.
#[derive(Debug, Clone)]
pub enum KdfRow {
    /// PBKDF2 with a hash: iterations per second (256-bit key).
    Pbkdf2 {
        /// The hash's name.
        hash: String,
        /// Iterations per second.
        per_second: f64,
    },
    /// Argon2: milliseconds per derivation with the given costs.
    Argon2 {
        /// `argon2i` or `argon2id`.
        kind: &'static str,
        /// Time cost.
        time: u32,
        /// Memory cost in KiB.
        memory_kib: u32,
        /// Milliseconds per derivation.
        ms: f64,
    },
}

/// Which PBKDF rows to measure.
#[derive(Debug, Clone, Default)]
pub struct KdfRequest {
    /// Only this PBKDF (`pbkdf2`, `argon2i`, `argon2id`); all of them when `None`.
    pub pbkdf: Option<String>,
    /// The hash of the PBKDF2 rows (default: sha1, sha256, sha512, ripemd160, whirlpool).
    pub hash: Option<String>,
    /// Argon2 memory cost in KiB.
    pub memory_kib: u32,
    /// Argon2 time cost.
    pub iterations: u32,
}

/// What a PBKDF measurement will do: the rows' names, in order (a caller's progress).
pub struct KdfPlan {
    pbkdf2: Vec<String>,
    argons: Vec<&'static str>,
}

impl KdfPlan {
    /// The rows `req` asks for.
    ///
    /// # Errors
    /// An unknown PBKDF name.
    pub fn new(req: &KdfRequest) -> Result<KdfPlan> {
        let (do_pbkdf2, argons): (bool, Vec<&'static str>) = match req.pbkdf.as_deref() {
            None => (true, vec!["argon2i", "argon2id"]),
            Some("pbkdf2") => (true, vec![]),
            Some("argon2i") => (false, vec!["argon2i"]),
            Some("argon2id") => (false, vec!["argon2id"]),
            Some(other) => {
                return Err(Error::Invalid(format!(
                    "unknown PBKDF \"{other}\" (expected pbkdf2, argon2i or argon2id)"
                )))
            }
        };
        let pbkdf2 = match (&req.hash, do_pbkdf2) {
            (_, false) => Vec::new(),
            (Some(h), true) => vec![h.clone()],
            (None, true) => ["sha1", "sha256", "sha512", "ripemd160", "whirlpool"]
                .map(String::from)
                .to_vec(),
        };
        Ok(KdfPlan { pbkdf2, argons })
    }

    /// How many rows.
    pub fn len(&self) -> usize {
        self.pbkdf2.len() + self.argons.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Measures the rows, each for about `seconds`; `step` is told each row's name before
    /// it is measured.
    ///
    /// # Errors
    /// An unknown hash, or a KDF that refuses the costs.
    pub fn run(
        &self,
        req: &KdfRequest,
        seconds: f64,
        step: &mut dyn FnMut(&str),
    ) -> Result<Vec<KdfRow>> {
        use ucrypt_format::kdf::{argon2, Argon2Cost, Argon2Kind, Hash};
        let salt = [0x5cu8; 32];
        let mut out = [0u8; 32];
        let mut rows = Vec::new();
        for name in &self.pbkdf2 {
            step(&format!("pbkdf2-{name}"));
            let hash = Hash::from_name(name)?;
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
                hash: name.clone(),
                per_second,
            });
        }
        for &kind in &self.argons {
            step(kind);
            let cost = Argon2Cost {
                time: req.iterations.max(1),
                memory_kib: req.memory_kib.max(8),
                lanes: 1,
            };
            let k = if kind == "argon2i" {
                Argon2Kind::I
            } else {
                Argon2Kind::Id
            };
            let start = Instant::now();
            argon2(k, cost, b"benchmark passphrase", &salt, &mut out)?;
            rows.push(KdfRow::Argon2 {
                kind,
                time: cost.time,
                memory_kib: cost.memory_kib,
                ms: start.elapsed().as_secs_f64() * 1000.0,
            });
        }
        Ok(rows)
    }
}

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

/// A throughput: the median of the rounds, and their lowest and highest (a chart's error
/// bars). Formats as the median.
#[derive(Debug, Clone, Copy)]
pub struct Rate {
    /// The median, MiB/s.
    pub median: f64,
    /// The lowest round.
    pub lo: f64,
    /// The highest round.
    pub hi: f64,
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

/// One cipher row.
#[derive(Debug, Clone)]
pub struct Row {
    /// The spec (or the alternative library's name).
    pub name: String,
    /// Key bits.
    pub key_bits: usize,
    /// Encryption.
    pub enc: Rate,
    /// Decryption.
    pub dec: Rate,
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

/// The cipher measurements of one run: a sector size, a page-aligned buffer, the time
/// per round.
pub struct CipherBench {
    ss: SectorSize,
    per_round: Duration,
    key_bytes: Vec<u8>,
    data: ucrypt_backend::aligned::AlignedBuf,
}

impl CipherBench {
    /// Measures with sectors of `sector_size` bytes, `buffer` bytes per call (rounded to
    /// whole sectors), about `seconds` per row and direction.
    ///
    /// # Errors
    /// A sector size the crypto layer refuses, or no memory for the buffer.
    pub fn new(sector_size: u32, buffer: usize, seconds: f64) -> Result<CipherBench> {
        let ss = SectorSize::new_extended(sector_size)?;
        let buffer = buffer.max(ss.len()) / ss.len() * ss.len();
        // Page-aligned, as the engine's request buffers are: from a plain Vec the address
        // is only 16-byte aligned, so a 64-byte vector load can straddle two cache lines,
        // and which buffer address malloc returned moved the VAES rows by up to a quarter.
        let mut data = ucrypt_backend::aligned::AlignedBuf::zeroed(buffer, 4096)?;
        data.fill(0x5a);
        Ok(CipherBench {
            ss,
            per_round: Duration::from_secs_f64(seconds.max(0.05) / ROUNDS as f64),
            key_bytes: (0..=255u8).cycle().take(4096).collect(),
            data,
        })
    }

    /// The sector size, as shown ("4096").
    pub fn sector_size(&self) -> SectorSize {
        self.ss
    }

    /// Bytes per call.
    pub fn buffer(&self) -> usize {
        self.data.len()
    }

    fn cipher(&self, spec: &CipherSpec, bits: usize) -> Result<Box<dyn SectorCipher>> {
        Ok(spec.build(
            &VolumeKey::new(self.key_bytes[..bits / 8].to_vec()),
            SectorParams {
                sector_size: self.ss,
                ..Default::default()
            },
        )?)
    }

    /// Measures `spec` with a `bits`-bit key, and the alternative library's figure for it
    /// if there is one.
    ///
    /// # Errors
    /// A spec or key size the crypto layer refuses.
    pub fn spec(&mut self, spec: &str, bits: usize) -> Result<(Row, Option<Row>)> {
        let parsed = spec.parse::<CipherSpec>()?;
        let cipher = self.cipher(&parsed, bits)?;
        let (buffer, per_round) = (self.data.len(), self.per_round);
        let data = &mut self.data;
        let enc = measure(buffer, per_round, || cipher.encrypt(Sector512(0), data));
        let dec = measure(buffer, per_round, || cipher.decrypt(Sector512(0), data));
        let row = Row {
            name: spec.to_string(),
            key_bits: bits,
            enc,
            dec,
        };
        let key = &self.key_bytes[..bits / 8];
        let alt = alternative(&parsed, key, &mut self.data, self.ss.len(), per_round);
        Ok((row, alt))
    }

    /// The raw library baseline for the hot path: AES-256-XTS through AWS-LC, one call per
    /// sector (none where the library lacks it).
    pub fn raw_baseline(&mut self) -> Option<Row> {
        let (buffer, per_round, sector) = (self.data.len(), self.per_round, self.ss.len());
        let data = &mut self.data;
        RawLibraryXts::new(&self.key_bytes[..64]).map(|mut raw| {
            let enc = measure(buffer, per_round, || raw.run(data, sector, true));
            let dec = measure(buffer, per_round, || raw.run(data, sector, false));
            Row {
                name: "raw AWS-LC aes-256-xts (one call per sector)".into(),
                key_bits: 512,
                enc,
                dec,
            }
        })
    }

    /// aes-xts-plain64 with a 512-bit key through ucrypt against the raw library call:
    /// (encrypt, decrypt) ratios over interleaved pairs (none where the library lacks it).
    ///
    /// # Errors
    /// The crypto layer refuses the spec.
    pub fn versus_raw(&mut self) -> Result<Option<(f64, f64)>> {
        let Some(mut raw) = RawLibraryXts::new(&self.key_bytes[..64]) else {
            return Ok(None);
        };
        let ours = self.cipher(&"aes-xts-plain64".parse::<CipherSpec>()?, 512)?;
        let (per_round, sector) = (self.per_round, self.ss.len());
        let enc = interleaved_ratio(
            &mut self.data,
            per_round,
            |d| ours.encrypt(Sector512(0), d),
            |d| raw.run(d, sector, true),
        );
        let dec = interleaved_ratio(
            &mut self.data,
            per_round,
            |d| ours.decrypt(Sector512(0), d),
            |d| raw.run(d, sector, false),
        );
        Ok(Some((enc, dec)))
    }

    /// aes-xts-plain64 with a 256-bit key (AES-128-XTS) against a 512-bit one
    /// (AES-256-XTS): (encrypt, decrypt) ratios over interleaved pairs.
    ///
    /// # Errors
    /// The crypto layer refuses the spec.
    pub fn aes128_versus_aes256(&mut self) -> Result<(f64, f64)> {
        let spec = "aes-xts-plain64".parse::<CipherSpec>()?;
        let (k256, k512) = (self.cipher(&spec, 256)?, self.cipher(&spec, 512)?);
        let per_round = self.per_round;
        let enc = interleaved_ratio(
            &mut self.data,
            per_round,
            |d| k256.encrypt(Sector512(0), d),
            |d| k512.encrypt(Sector512(0), d),
        );
        let dec = interleaved_ratio(
            &mut self.data,
            per_round,
            |d| k256.decrypt(Sector512(0), d),
            |d| k512.decrypt(Sector512(0), d),
        );
        Ok((enc, dec))
    }
}

/// The chart of the cipher rows: a panel per direction, a group per spec and key size,
/// ucrypt's bar and the alternative library's beside it (one colour per library).
pub fn chart(bench: &CipherBench, seconds: f64, rows: &[(Row, Option<Row>)]) -> String {
    use super::chart::{render, Bar, Group, Panel};
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
            "{} | sector size {}, {} bytes per call, {ROUNDS} rounds in {} s per row and direction | {} CPUs | ucrypt {}",
            super::chart::now_utc(),
            bench.ss,
            bench.data.len(),
            seconds,
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            env!("CARGO_PKG_VERSION")
        ),
        &[
            panel("Encryption", |r| r.enc),
            panel("Decryption", |r| r.dec),
        ],
    )
}

/// The SIMD paths the ciphers pick on this CPU, in one line.
pub fn crypto_paths() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let f = |name: &str, on: bool| {
            if on {
                name.to_string()
            } else {
                format!("no {name}")
            }
        };
        let vaes = std::arch::is_x86_feature_detected!("vaes")
            && std::arch::is_x86_feature_detected!("vpclmulqdq")
            && std::arch::is_x86_feature_detected!("avx512f");
        let avx512 = std::arch::is_x86_feature_detected!("avx512f");
        let avx2 = std::arch::is_x86_feature_detected!("avx2");
        let wide = if avx512 {
            "AVX-512"
        } else if avx2 {
            "AVX2"
        } else {
            "SSE2"
        };
        format!(
            "{}, {} (AES-XTS-128/192; AES-256 on sectors up to 1 KiB), Serpent bit-sliced over {wide}, Twofish {}, Adiantum NH over {}",
            f("AES-NI", std::arch::is_x86_feature_detected!("aes")),
            f("VAES+VPCLMULQDQ", vaes),
            ucrypt_crypto::twofish_code_path(),
            if avx512 || avx2 {
                wide
            } else {
                "portable code"
            }
        )
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        "portable code (no x86-64 SIMD paths)".to_string()
    }
}
