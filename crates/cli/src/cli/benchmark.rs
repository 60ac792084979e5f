//! `ucrypt benchmark`: cipher throughput per spec and sector size, measured through
//! ucrypt's own data path (`SectorCipher`), like `cryptsetup benchmark`, with the raw
//! AWS-LC XTS call measured in the same run for comparison. PBKDF rows come first, as in
//! cryptsetup: PBKDF2 iterations per second per hash and Argon2i/Argon2id time per
//! derivation, from the pure-Rust KDFs ucrypt's own keyslot unlock uses.

//!
//! The measuring is the library's (`ucrypt::bench::cipher`); this file picks the rows from
//! the arguments, shows progress and prints.

use super::CliError;
use ucrypt::bench::cipher::{self, CipherBench, KdfPlan, KdfRequest, KdfRow, Row, ROUNDS};

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

/// Measures the PBKDF rows `a` asks for.
fn kdf_rows(a: &Args, seconds: f64) -> Result<Vec<KdfRow>, CliError> {
    let req = KdfRequest {
        pbkdf: a.pbkdf.clone(),
        hash: a.hash.clone(),
        memory_kib: a.pbkdf_memory,
        iterations: a.pbkdf_force_iterations,
    };
    let plan = KdfPlan::new(&req)?;
    let steps = super::progress::Steps::new("PBKDF", plan.len() as u64);
    let mut first = true;
    let rows = plan.run(&req, seconds, &mut |name| {
        if !std::mem::take(&mut first) {
            steps.inc();
        }
        steps.message(name.to_string());
    })?;
    if !first {
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
            // cryptsetup's Argon2 rows are the cost it tunes to a target time; these are
            // the time of a fixed cost, and say so rather than look like those.
            (KdfRow::Argon2 { kind, time, memory_kib, ms }, false) => println!(
                "{kind:<10} {time:>4} iterations, {memory_kib:>7} KiB memory, 1 thread, 256-bit key: {ms:.0} ms per derivation (fixed cost; cryptsetup's row is the cost tuned to 2000 ms)"
            ),
            (KdfRow::Argon2 { kind, time, memory_kib, ms }, true) => println!(
                "{{\"pbkdf\":\"{kind}\",\"time\":{time},\"memory_kib\":{memory_kib},\"threads\":1,\"ms_per_derivation\":{ms:.1}}}"
            ),
        }
    }
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
    let mut bench = CipherBench::new(a.sector_size, a.buffer, a.seconds)?;
    let (ss, buffer) = (bench.sector_size(), bench.buffer());
    let specs = cipher::specs(a.cipher.as_deref(), a.key_size, a.all);
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
        let (row, alt) = bench.spec(spec, *bits)?;
        print_row(&row, alt.as_ref());
        steps.inc();
        charted.push((row.clone(), alt));
        rows.push(row);
    }
    steps.message("raw AWS-LC baseline");
    let raw = bench.raw_baseline();
    if let Some(r) = &raw {
        print_row(r, None);
        charted.push((r.clone(), None));
    }
    steps.finish();
    if let Some(path) = &a.chart {
        std::fs::write(path, cipher::chart(&bench, a.seconds, &charted))
            .map_err(|e| anyhow::anyhow!("writing chart {}: {e}", path.display()))?;
        eprintln!("chart written to {}", path.display());
    }
    let report = |line: String| {
        if a.json {
            eprintln!("{line}");
        } else {
            println!("# {line}");
        }
    };
    let has = |bits: usize| {
        rows.iter()
            .any(|r| r.name == "aes-xts-plain64" && r.key_bits == bits)
    };
    if has(512) {
        if let Some((enc, dec)) = bench.versus_raw()? {
            report(format!(
                "aes-xts-plain64 512b vs raw library call (median of {} interleaved pairs): encrypt {enc:.3}x, decrypt {dec:.3}x",
                2 * ROUNDS + 1
            ));
        }
    }
    if has(256) && has(512) {
        // AES-128-XTS does 10 rounds per block against AES-256's 14: it should be faster.
        let (enc, dec) = bench.aes128_versus_aes256()?;
        report(format!(
            "aes-xts-plain64 256b (AES-128-XTS) vs 512b (AES-256-XTS) (median of {} interleaved pairs): encrypt {enc:.3}x, decrypt {dec:.3}x",
            2 * ROUNDS + 1
        ));
    }
    Ok(())
}
