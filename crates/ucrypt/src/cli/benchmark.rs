//! `ucrypt benchmark`: cipher throughput per spec and sector size, measured through
//! ucrypt's own data path (`SectorCipher`), like `cryptsetup benchmark`, with the raw
//! AWS-LC XTS call measured in the same run for comparison.

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
    /// Print one JSON object per row instead of the table.
    #[arg(long)]
    json: bool,
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

const ROUNDS: usize = 5;

/// Median MiB/s of `f` over `ROUNDS` rounds of `per_round` each, processing `bytes` per call.
fn measure(bytes: usize, per_round: Duration, mut f: impl FnMut()) -> f64 {
    f(); // warm up (page faults, key schedule caches)
    let mut rates: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let start = Instant::now();
            let mut calls = 0u64;
            while start.elapsed() < per_round {
                f();
                calls += 1;
            }
            (calls as f64 * bytes as f64) / start.elapsed().as_secs_f64() / (1024.0 * 1024.0)
        })
        .collect();
    rates.sort_by(f64::total_cmp);
    rates[ROUNDS / 2]
}

struct Row {
    name: String,
    key_bits: usize,
    enc: f64,
    dec: f64,
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let ss = SectorSize::new_extended(a.sector_size)?;
    let buffer = a.buffer.max(ss.len()) / ss.len() * ss.len();
    let per_round = Duration::from_secs_f64(a.seconds.max(0.05) / ROUNDS as f64);
    let specs: Vec<(String, usize)> = match &a.cipher {
        Some(c) => vec![(c.clone(), a.key_size)],
        None => DEFAULT_SPECS
            .iter()
            .map(|(s, k)| (s.to_string(), *k))
            .collect(),
    };
    let key_bytes: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
    let mut data = vec![0x5au8; buffer];
    let mut rows = Vec::new();
    for (spec, bits) in &specs {
        let cipher: Box<dyn SectorCipher> = spec.parse::<CipherSpec>()?.build(
            &VolumeKey::new(key_bytes[..bits / 8].to_vec()),
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
        rows.push(Row {
            name: spec.clone(),
            key_bits: *bits,
            enc,
            dec,
        });
    }
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
    let ours = rows
        .iter()
        .find(|r| r.name == "aes-xts-plain64" && r.key_bits == 512);
    if a.json {
        for r in rows.iter().chain(raw.iter()) {
            println!(
                "{{\"cipher\":\"{}\",\"key_bits\":{},\"sector_size\":{},\"encrypt_mib_s\":{:.1},\"decrypt_mib_s\":{:.1}}}",
                r.name, r.key_bits, ss, r.enc, r.dec
            );
        }
    } else {
        println!("# Tests are approximate using memory only (no storage IO); sector size {ss}, {buffer} bytes per call, median of {ROUNDS} rounds.");
        println!(
            "#{:>34} {:>6} {:>14} {:>14}",
            "Algorithm", "Key", "Encryption", "Decryption"
        );
        for r in rows.iter().chain(raw.iter()) {
            println!(
                "{:>35} {:>5}b {:>9.1} MiB/s {:>9.1} MiB/s",
                r.name, r.key_bits, r.enc, r.dec
            );
        }
    }
    if let (Some(o), Some(r)) = (ours, &raw) {
        let line = format!(
            "aes-xts-plain64 512b vs raw library call: encrypt {:.2}x, decrypt {:.2}x",
            o.enc / r.enc,
            o.dec / r.dec
        );
        if a.json {
            eprintln!("{line}");
        } else {
            println!("# {line}");
        }
    }
    Ok(())
}
