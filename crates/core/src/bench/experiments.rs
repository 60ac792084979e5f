//! The seeds' experiments, each a list of cells (op × block size × depth × cipher ×
//! sector size) measured for a raw passthrough and each engine variant, interleaved and
//! repeated within one run.
//!
//! | experiment | seed | question |
//! |---|---|---|
//! | `cloudflare` | 000 | workqueue vs inline for 4 KiB I/O on a ramdisk, null cipher and AES |
//! | `parallel` | 001, 003 | placement × write order across sizes and depths |
//! | `alloc` | 002 | pooled buffers vs per-request allocation at 1 MiB writes |
//! | `sector-size` | 004 | 512 vs 4096 vs 64 KiB encryption sectors |
//! | `integrity` | (issue 28) | what each authenticated mode costs against plain aes-xts-plain64 |

use super::load::{self, Op, Sample};
use std::sync::Arc;
use ucrypt_backend::{Backend, FileBackend, FileOptions, MemoryBackend};
use ucrypt_crypto::{CipherSpec, SectorParams, SectorSize, VolumeKey};
use ucrypt_engine::{EngineOptions, PoolOptions, Volume, VolumeConfig, WriteOrder};
use ucrypt_integrity::Mode;

/// Every experiment name.
pub const EXPERIMENTS: [&str; 6] = [
    "cloudflare",
    "parallel",
    "alloc",
    "sector-size",
    "uring",
    "integrity",
];

/// One way of serving the cell's data, measured beside the raw passthrough.
#[derive(Debug, Clone, Copy)]
pub enum Variant {
    /// The cell's cipher through the engine ([`Volume`]) with these options.
    Engine(EngineOptions),
    /// An authenticated crypt target over dm-integrity with external tags, as `ucrypt open`
    /// serves `luksFormat --integrity ...` volumes ([`ucrypt_integrity::AeadVolume`] over
    /// [`ucrypt_integrity::IntegrityBackend`], formatted on the cell's memory backend).
    Aead {
        /// The crypt target's cipher spec (`capi:gcm(aes)-random`, ...).
        spec: &'static str,
        /// Its key length in bytes.
        key_bytes: usize,
        /// Bytes of tag per sector (`integrity:N:aead`).
        tag: u32,
        /// The dm-integrity mode (journal or direct).
        mode: Mode,
    },
}

fn engine(v: Vec<(&'static str, EngineOptions)>) -> Vec<(&'static str, Variant)> {
    v.into_iter()
        .map(|(n, o)| (n, Variant::Engine(o)))
        .collect()
}

/// Where the ciphertext lives during a measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// The sparse memory backend (a ramdisk, like brd), pre-filled.
    Memory,
    /// A file in /var/tmp (not tmpfs), pre-filled.
    File {
        /// O_DIRECT.
        direct: bool,
        /// Batches of writes through io_uring.
        uring: bool,
    },
}

impl Store {
    /// Name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Store::Memory => "memory",
            Store::File {
                direct: false,
                uring: false,
            } => "file",
            Store::File {
                direct: false,
                uring: true,
            } => "file+uring",
            Store::File {
                direct: true,
                uring: false,
            } => "file-direct",
            Store::File {
                direct: true,
                uring: true,
            } => "file-direct+uring",
        }
    }
}

/// What is measured in one cell, besides the variants.
#[derive(Debug, Clone)]
pub struct Cell {
    /// Experiment name.
    pub experiment: &'static str,
    /// Read or write.
    pub op: Op,
    /// Request size.
    pub block: usize,
    /// Concurrent requests.
    pub depth: usize,
    /// Cipher spec.
    pub cipher: &'static str,
    /// Encryption sector size.
    pub sector: u32,
    /// The backend.
    pub store: Store,
    /// Variants to compare (the raw passthrough is always measured too).
    pub variants: Vec<(&'static str, Variant)>,
    /// The variant every other one is also compared with (`plain` in `integrity`), besides
    /// the raw passthrough.
    pub base: Option<&'static str>,
}

impl Cell {
    /// Whether two rows belong to the same cell (everything but the variant).
    pub fn same_as(&self, other: &Cell) -> bool {
        (
            self.experiment,
            self.op,
            self.block,
            self.depth,
            self.cipher,
            self.sector,
            self.store,
        ) == (
            other.experiment,
            other.op,
            other.block,
            other.depth,
            other.cipher,
            other.sector,
            other.store,
        )
    }
}

/// One measured row.
#[derive(Debug, Clone)]
pub struct Row {
    /// The cell.
    pub cell: Cell,
    /// Variant name (`raw` for the passthrough).
    pub variant: &'static str,
    /// Median sample.
    pub median: Sample,
    /// Lowest and highest MiB/s of the repeats.
    pub spread: (f64, f64),
    /// Median over the repeats of this variant's MiB/s over the raw passthrough's in the same repeat.
    pub ratio_to_raw: f64,
    /// The same against the cell's base variant, where the cell has one.
    pub ratio_to_base: Option<f64>,
}

/// Run settings.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Seconds per measurement.
    pub secs: f64,
    /// Repeats per variant.
    pub repeats: usize,
    /// Bytes of the memory backend the load runs over.
    pub region: u64,
    /// Fewer cells.
    pub quick: bool,
}

/// The placements dm-crypt offers, plus ucrypt's automatic policy.
pub fn placements() -> Vec<(&'static str, EngineOptions)> {
    let kernel = EngineOptions::kernel_default();
    vec![
        ("workqueue", kernel),
        (
            "inline",
            EngineOptions {
                no_read_workqueue: true,
                no_write_workqueue: true,
                ..kernel
            },
        ),
        (
            "same_cpu_crypt",
            EngineOptions {
                same_cpu_crypt: true,
                ..kernel
            },
        ),
        (
            "submit_from_crypt_cpus",
            EngineOptions {
                submit_from_crypt_cpus: true,
                ..kernel
            },
        ),
        (
            "sorted",
            EngineOptions {
                write_order: WriteOrder::Sorted,
                ..kernel
            },
        ),
        ("auto", EngineOptions::default()),
    ]
}

/// The cells of one experiment.
pub fn cells(experiment: &str, quick: bool) -> Vec<Cell> {
    let kernel = EngineOptions::kernel_default();
    let auto = EngineOptions::default();
    let inline = EngineOptions {
        no_read_workqueue: true,
        no_write_workqueue: true,
        ..kernel
    };
    let mut out = Vec::new();
    let cell = |experiment, op, block, depth, cipher, sector, variants| Cell {
        experiment,
        op,
        block,
        depth,
        cipher,
        sector,
        store: Store::Memory,
        variants: engine(variants),
        base: None,
    };
    match experiment {
        "cloudflare" => {
            for cipher in ["capi:ecb(cipher_null)", "aes-xts-plain64"] {
                for depth in [1, 32] {
                    for op in [Op::Read, Op::Write] {
                        let v = vec![("workqueue", kernel), ("inline", inline), ("auto", auto)];
                        out.push(cell("cloudflare", op, 4096, depth, cipher, 512, v));
                    }
                }
            }
        }
        "parallel" => {
            let blocks: &[usize] = if quick {
                &[4096, 1 << 20]
            } else {
                &[4096, 16384, 65536, 262_144, 1 << 20]
            };
            let depths: &[usize] = if quick { &[1, 32] } else { &[1, 4, 32, 256] };
            for &block in blocks {
                for &depth in depths {
                    for op in [Op::Read, Op::Write] {
                        out.push(cell(
                            "parallel",
                            op,
                            block,
                            depth,
                            "aes-xts-plain64",
                            4096,
                            placements(),
                        ));
                    }
                }
            }
        }
        "alloc" => {
            let per_req = PoolOptions {
                per_request_alloc: true,
                ..PoolOptions::default()
            };
            for depth in [1, 8] {
                let v = vec![
                    ("pool", kernel),
                    (
                        "per-request-alloc",
                        EngineOptions {
                            pool: per_req,
                            ..kernel
                        },
                    ),
                    ("pool-inline", inline),
                    (
                        "per-request-alloc-inline",
                        EngineOptions {
                            pool: per_req,
                            ..inline
                        },
                    ),
                ];
                out.push(cell(
                    "alloc",
                    Op::Write,
                    1 << 20,
                    depth,
                    "capi:ecb(cipher_null)",
                    4096,
                    v,
                ));
            }
        }
        "sector-size" => {
            for sector in [512u32, 4096, 65536] {
                for op in [Op::Read, Op::Write] {
                    let v = vec![("auto", auto), ("inline", inline)];
                    out.push(cell(
                        "sector-size",
                        op,
                        1 << 20,
                        1,
                        "aes-xts-plain64",
                        sector,
                        v,
                    ));
                }
            }
        }
        "uring" => {
            // Does io_uring pay for the engine's batches (a request's pool buffers, the
            // ordered submitter's plugs)? Same variants over pwrite and io_uring files.
            let kernel_opts = EngineOptions {
                auto: None,
                ..kernel
            };
            for direct in [false, true] {
                for uring in [false, true] {
                    for (block, depth) in [(1 << 20, 1), (65536, 8)] {
                        let v = vec![("inline", inline), ("workqueue", kernel_opts)];
                        let mut c =
                            cell("uring", Op::Write, block, depth, "aes-xts-plain64", 4096, v);
                        c.store = Store::File { direct, uring };
                        out.push(c);
                    }
                }
            }
        }
        "integrity" => {
            let shapes: &[(usize, usize)] = if quick {
                &[(4096, 1), (1 << 20, 1)]
            } else {
                &[(4096, 1), (4096, 32), (1 << 20, 1)]
            };
            for &(block, depth) in shapes {
                for op in [Op::Read, Op::Write] {
                    let mut c = cell(
                        "integrity",
                        op,
                        block,
                        depth,
                        "aes-xts-plain64",
                        4096,
                        vec![("plain", auto)],
                    );
                    c.variants.extend(aead_variants());
                    c.base = Some("plain");
                    out.push(c);
                }
            }
        }
        _ => {}
    }
    out
}

/// The largest region an `integrity` cell measures over (each of its authenticated
/// variants keeps a formatted copy in memory).
pub const AEAD_REGION_MAX: u64 = 128 << 20;

/// The authenticated modes cryptsetup makes (`--integrity hmac-sha256`, `--cipher
/// aes-gcm-random --integrity aead`, `--cipher chacha20-random --integrity poly1305`), each
/// with dm-integrity's journal (J) and without it (D).
fn aead_variants() -> Vec<(&'static str, Variant)> {
    let mut v = Vec::new();
    for (names, spec, key_bytes, tag) in [
        (
            ["hmac-sha256 J", "hmac-sha256 D"],
            "capi:authenc(hmac(sha256),xts(aes))-plain64",
            96,
            32,
        ),
        (["aes-gcm J", "aes-gcm D"], "capi:gcm(aes)-random", 32, 28),
        (
            ["chacha20-poly1305 J", "chacha20-poly1305 D"],
            "capi:rfc7539(chacha20,poly1305)-random",
            32,
            28,
        ),
    ] {
        for (name, mode) in names.into_iter().zip([Mode::Journal, Mode::Direct]) {
            v.push((
                name,
                Variant::Aead {
                    spec,
                    key_bytes,
                    tag,
                    mode,
                },
            ));
        }
    }
    v
}

/// An authenticated volume of `region` bytes: dm-integrity formatted on its own memory
/// backend (room for the tags and the journal), the crypt target on it, every sector
/// written once so that reads meet valid tags (as after `luksFormat`'s wipe).
fn aead_volume(
    region: u64,
    spec: &str,
    key_bytes: usize,
    tag: u32,
    mode: Mode,
) -> Result<Arc<dyn Backend>, String> {
    use ucrypt_format::integrity::FormatParams;
    use ucrypt_integrity::{format, AeadVolume, IntegrityBackend, Options};
    let inner: Arc<dyn Backend> =
        Arc::new(MemoryBackend::new(region + region / 64 + (8 << 20)).map_err(|e| e.to_string())?);
    let mut o = Options::external(tag);
    o.mode = mode;
    let fp = FormatParams {
        sector_size: 4096,
        tag_size: tag,
        ..FormatParams::default()
    };
    format(Arc::clone(&inner), &fp, &o, false).map_err(|e| e.to_string())?;
    let dev = Arc::new(IntegrityBackend::open(inner, o).map_err(|e| e.to_string())?);
    let key = VolumeKey::new((0..key_bytes).map(|i| (i * 37 + 11) as u8).collect());
    let params = SectorParams {
        sector_size: SectorSize::new(4096).map_err(|e| e.to_string())?,
        ..Default::default()
    };
    let cipher = spec
        .parse::<CipherSpec>()
        .and_then(|s| s.build_aead(&key, params, tag))
        .map_err(|e| e.to_string())?;
    let vol = AeadVolume::new(cipher, dev, region / 512).map_err(|e| e.to_string())?;
    fill(&vol, region)?;
    vol.flush().map_err(|e| e.to_string())?;
    Ok(Arc::new(vol))
}

/// Writes `region` bytes of a pattern over `dev` from its start, 1 MiB at a time.
fn fill(dev: &dyn Backend, region: u64) -> Result<(), String> {
    let chunk = vec![0x5au8; 1 << 20];
    let mut at = 0;
    while at < region {
        let n = (region - at).min(chunk.len() as u64) as usize;
        dev.write_at(&chunk[..n], at, false)
            .map_err(|e| e.to_string())?;
        at += n as u64;
    }
    Ok(())
}

fn volume(
    backend: &Arc<dyn Backend>,
    cell: &Cell,
    opts: EngineOptions,
) -> Result<Arc<dyn Backend>, String> {
    let key_len = if cell.cipher.contains("null") { 0 } else { 64 };
    let key = VolumeKey::new((0..key_len as u8).collect());
    let sector = SectorSize::new_extended(cell.sector).map_err(|e| e.to_string())?;
    let cipher = cell
        .cipher
        .parse::<CipherSpec>()
        .and_then(|s| {
            s.build(
                &key,
                SectorParams {
                    sector_size: sector,
                    ..Default::default()
                },
            )
        })
        .map_err(|e| e.to_string())?;
    let cfg = VolumeConfig {
        data_offset_bytes: 0,
        length_bytes: backend.info().size_bytes,
        read_only: false,
        allow_discards: false,
    };
    let v = Volume::with_options(Arc::from(cipher), Arc::clone(backend), cfg, opts)
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(v))
}

/// A memory backend of `region` bytes, filled so reads touch real memory (brd allocates
/// on write, like this backend).
///
/// # Errors
/// Allocation failure.
pub fn ramdisk(region: u64) -> Result<Arc<dyn Backend>, String> {
    let mem = MemoryBackend::new(region).map_err(|e| e.to_string())?;
    fill(&mem, region)?;
    Ok(Arc::new(mem))
}

/// A file of `region` bytes in /var/tmp (real disk-backed filesystem, not tmpfs),
/// pre-filled; removed when the returned guard drops.
fn file_store(
    region: u64,
    direct: bool,
    uring: bool,
) -> Result<(Arc<dyn Backend>, tempfile::TempDir), String> {
    let dir = tempfile::tempdir_in("/var/tmp").map_err(|e| e.to_string())?;
    let path = dir.path().join("bench.img");
    {
        let mut f = std::fs::File::create(&path).map_err(|e| e.to_string())?;
        let chunk = vec![0x5au8; 1 << 20];
        let mut at = 0;
        while at < region {
            let n = (region - at).min(chunk.len() as u64) as usize;
            std::io::Write::write_all(&mut f, &chunk[..n]).map_err(|e| e.to_string())?;
            at += n as u64;
        }
    }
    let mut fb = FileBackend::open(
        &path,
        FileOptions {
            read_only: false,
            direct,
        },
    )
    .map_err(|e| e.to_string())?;
    if uring && !fb.use_io_uring(true) {
        return Err("io_uring is not available on this kernel".into());
    }
    Ok((Arc::new(fb), dir))
}

fn store(
    kind: Store,
    region: u64,
) -> Result<(Arc<dyn Backend>, Option<tempfile::TempDir>), String> {
    match kind {
        Store::Memory => Ok((ramdisk(region)?, None)),
        Store::File { direct, uring } => {
            let (b, d) = file_store(region, direct, uring)?;
            Ok((b, Some(d)))
        }
    }
}

/// Measures one cell: raw and every variant, interleaved, `repeats` times each.
///
/// # Errors
/// A variant that cannot be built (bad cipher or sector size).
pub fn measure(cell: &Cell, s: &Settings, tick: &mut dyn FnMut()) -> Result<Vec<Row>, String> {
    // Each authenticated variant holds its own formatted copy of the region in memory:
    // capped, so that the seven of them stay within a small machine's memory.
    let region = if cell
        .variants
        .iter()
        .any(|(_, v)| matches!(v, Variant::Aead { .. }))
    {
        s.region.min(AEAD_REGION_MAX)
    } else {
        s.region
    };
    let (ram, _file) = store(cell.store, region)?;
    let mut devs: Vec<(&'static str, Arc<dyn Backend>)> = vec![("raw", Arc::clone(&ram))];
    for (name, v) in &cell.variants {
        let dev = match *v {
            Variant::Engine(opts) => volume(&ram, cell, opts)?,
            Variant::Aead {
                spec,
                key_bytes,
                tag,
                mode,
            } => aead_volume(region, spec, key_bytes, tag, mode)?,
        };
        devs.push((name, dev));
    }
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); devs.len()];
    for _ in 0..s.repeats {
        for (i, (_, dev)) in devs.iter().enumerate() {
            samples[i].push(load::run(
                dev, cell.op, cell.block, cell.depth, region, s.secs,
            ));
            tick();
        }
    }
    // Ratio to raw: the median of per-repeat ratios, each against the raw sample measured
    // moments before in the same repeat, so a load change between repeats cancels out.
    let ratios_to = |base: usize| -> Vec<f64> {
        samples
            .iter()
            .map(|v| {
                let mut r: Vec<f64> = v
                    .iter()
                    .zip(&samples[base])
                    .map(|(s, b)| {
                        if b.mib_s() > 0.0 {
                            s.mib_s() / b.mib_s()
                        } else {
                            0.0
                        }
                    })
                    .collect();
                r.sort_by(f64::total_cmp);
                r[r.len() / 2]
            })
            .collect()
    };
    let ratios = ratios_to(0);
    let base = cell
        .base
        .and_then(|b| devs.iter().position(|(n, _)| *n == b))
        .map(ratios_to);
    let medians: Vec<(Sample, (f64, f64))> = samples
        .into_iter()
        .map(|mut v| {
            v.sort_by(|a, b| a.mib_s().total_cmp(&b.mib_s()));
            let spread = (v[0].mib_s(), v[v.len() - 1].mib_s());
            (v[v.len() / 2], spread)
        })
        .collect();
    Ok(devs
        .iter()
        .zip(medians)
        .zip(ratios)
        .enumerate()
        .map(|(i, (((name, _), (median, spread)), ratio_to_raw))| Row {
            cell: cell.clone(),
            variant: name,
            median,
            spread,
            ratio_to_raw,
            ratio_to_base: base.as_ref().map(|b| b[i]),
        })
        .collect())
}
