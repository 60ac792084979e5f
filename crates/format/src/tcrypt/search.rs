//! Finding the header: every offset the options allow, every KDF and cipher chain, until
//! one decrypts to a valid TRUE/VERA header.

use super::header::parse;
use super::tables::layer_key;
use super::*;
use ChainMode::{CbcTcrypt, CbcTcw, Cbci, Lrw, Xts};

/// Decrypts a 448-byte area as sector 0 with a dm-crypt spec (XTS: tweak 0; LRW-benbi:
/// first block index 1, as cryptsetup's header IV).
fn sector0_decrypt(spec: &str, key: &[u8], buf: &mut [u8; ENC_LEN]) -> Option<()> {
    let spec: CipherSpec = spec.parse().ok()?;
    let c = spec
        .build(&VolumeKey::new(key.to_vec()), SectorParams::default())
        .ok()?;
    let mut sector = Zeroizing::new([0u8; 512]);
    sector[..ENC_LEN].copy_from_slice(buf);
    c.decrypt(Sector512(0), &mut sector[..]);
    buf.copy_from_slice(&sector[..ENC_LEN]);
    Some(())
}

fn remove_whitening(buf: &mut [u8; ENC_LEN], key: &[u8]) {
    for (j, b) in buf.iter_mut().enumerate() {
        *b ^= key[8 + j % 8];
    }
}

/// Big-endian swap of both 32-bit halves (TrueCrypt's little-endian Blowfish).
fn swab_halves(b: &mut [u8]) {
    b[..4].reverse();
    b[4..8].reverse();
}

/// CBC decryption of the header (legacy modes): whitening removed, then CBC with the IV
/// seed as IV, every cipher of `ciphers` applied to each block (last first) before the
/// chaining XOR (one cipher for `cbc-tcw` and `cbc-tcrypt`, the whole cascade for
/// `cbci-tcrypt`).
fn cbc_decrypt(ciphers: &[Alg], key: &[u8], buf: &mut [u8; ENC_LEN]) -> Option<()> {
    remove_whitening(buf, key);
    let first = ciphers.first()?;
    let bs = first.iv_size;
    let mut built = Vec::new();
    for c in ciphers {
        let (name, le) = match c.name {
            "blowfish_le" => ("blowfish", true),
            n => (n, false),
        };
        let k = key.get(c.key_offset..c.key_offset + c.key_size)?;
        built.push((new_block_cipher(name, k).ok()?, le));
    }
    if built.iter().any(|(c, _)| c.block_size() != bs) {
        return None;
    }
    let mut iv = key.get(first.iv_offset..first.iv_offset + bs)?.to_vec();
    for block in buf.chunks_exact_mut(bs) {
        let old = block.to_vec();
        for (c, le) in built.iter().rev() {
            if *le {
                swab_halves(block);
            }
            c.decrypt_blocks(block);
            if *le {
                swab_halves(block);
            }
        }
        for (b, v) in block.iter_mut().zip(&iv) {
            *b ^= v;
        }
        iv = old;
    }
    Some(())
}

/// Tries `algs` on the encrypted area with header key `key`; `Some` with the plaintext
/// when the result starts with a magic.
pub(super) fn try_chain(
    algs: &Algs,
    key: &[u8],
    enc: &[u8; ENC_LEN],
) -> Option<Zeroizing<[u8; ENC_LEN]>> {
    let mut buf = Zeroizing::new(*enc);
    match algs.mode {
        Xts | Lrw => {
            for alg in algs.ciphers.iter().rev() {
                let k = layer_key(alg, algs.mode, key);
                let spec = format!("{}-{}", alg.name, algs.mode.name());
                sector0_decrypt(&spec, &k, &mut buf)?;
            }
        }
        Cbci => cbc_decrypt(algs.ciphers, key, &mut buf)?,
        CbcTcw | CbcTcrypt => {
            // One cipher at a time, the outermost first, each with its own whitening and
            // CBC pass (cryptsetup's per-cipher header decryption).
            for alg in algs.ciphers.iter().rev() {
                cbc_decrypt(std::slice::from_ref(alg), key, &mut buf)?;
            }
        }
    }
    Some(buf)
}

/// Which header to read and how to search.
#[derive(Debug, Clone)]
pub struct TcryptOptions {
    /// Accept VeraCrypt headers and KDFs (cryptsetup default; `--disable-veracrypt` off).
    pub veracrypt: bool,
    /// VeraCrypt PIM (`--veracrypt-pim`); only VeraCrypt KDFs are tried with one.
    pub pim: Option<u32>,
    /// The hidden-volume header (`--tcrypt-hidden`).
    pub hidden: bool,
    /// The system-encryption header at sector 62 (`--tcrypt-system`).
    pub system: bool,
    /// The backup header at the device end (`--tcrypt-backup`).
    pub backup: bool,
    /// Only KDFs whose hash (or `argon2id`) contains this (`--hash`).
    pub hash: Option<String>,
    /// Only cipher chains whose name contains this (`--cipher`).
    pub cipher: Option<String>,
    /// Key files mixed into the password.
    pub key_files: Vec<std::path::PathBuf>,
    /// Told how far the header search got (none: silent).
    pub progress: SearchProgress,
}

/// How far a TCRYPT header search got: KDF (PRF) × cipher chain combinations tried of the
/// total, and the same weighted by each KDF's cost (for an estimate of the time left:
/// TrueCrypt's KDFs cost a thousandth of VeraCrypt's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SearchStep {
    /// Combinations tried (every chain of every KDF derived so far, every header).
    pub tried: u64,
    /// Combinations the search tries when nothing decrypts.
    pub total: u64,
    /// Cost of the KDFs derived so far (PBKDF2 iterations; Argon2 time × 2 × memory KiB).
    pub cost_done: u64,
    /// Cost of every KDF of the search.
    pub cost_total: u64,
    /// The search is over (a header decrypted, or every combination failed).
    pub finished: bool,
}

/// A callback for [`SearchStep`]s (called on the searching thread, before the first KDF
/// and after each group of KDFs).
#[derive(Clone, Default)]
pub struct SearchProgress(pub Option<std::sync::Arc<dyn Fn(SearchStep) + Send + Sync>>);

impl std::fmt::Debug for SearchProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "SearchProgress(callback)"
        } else {
            "SearchProgress(none)"
        })
    }
}

impl SearchProgress {
    fn report(&self, step: SearchStep) {
        if let Some(f) = &self.0 {
            f(step);
        }
    }
}

impl Default for TcryptOptions {
    fn default() -> Self {
        TcryptOptions {
            veracrypt: true,
            pim: None,
            hidden: false,
            system: false,
            backup: false,
            hash: None,
            cipher: None,
            key_files: Vec::new(),
            progress: SearchProgress::default(),
        }
    }
}

/// Where to look for the header, in order.
fn header_offsets(opts: &TcryptOptions, device_bytes: u64) -> Vec<u64> {
    let from_end = |n: u64| device_bytes.checked_sub(n);
    if opts.system {
        vec![SYSTEM_OFFSET]
    } else if opts.hidden && opts.backup {
        from_end(HIDDEN_BACKUP_OFFSET_FROM_END)
            .into_iter()
            .collect()
    } else if opts.hidden {
        let mut v = vec![HIDDEN_OFFSET];
        v.extend(from_end(HIDDEN_OFFSET_OLD_FROM_END));
        v
    } else if opts.backup {
        from_end(BACKUP_OFFSET_FROM_END).into_iter().collect()
    } else {
        vec![0]
    }
}

fn contains_hint(name: &str, hint: &Option<String>) -> bool {
    hint.as_deref().is_none_or(|h| name.contains(h))
}

/// The KDF variants `opts` allows, in search order.
pub fn kdf_candidates(opts: &TcryptOptions) -> Vec<KdfEntry> {
    KDFS.iter()
        .copied()
        .filter(|k| contains_hint(k.name(), &opts.hash))
        .filter(|k| opts.veracrypt || !k.veracrypt)
        .filter(|k| !(opts.veracrypt && opts.pim.is_some() && !k.veracrypt))
        .collect()
}

/// The cipher chains `opts` allows, in search order.
pub fn chain_candidates(opts: &TcryptOptions) -> Vec<&'static Algs> {
    CHAINS
        .iter()
        .filter(|c| contains_hint(c.long_name, &opts.cipher))
        .collect()
}

/// Tries every cipher chain with one derived header key; the first with a magic.
fn try_key(
    key: &[u8],
    enc: &[u8; ENC_LEN],
    chains: &[&'static Algs],
    veracrypt: bool,
) -> Option<(&'static Algs, Zeroizing<[u8; ENC_LEN]>)> {
    chains.iter().find_map(|c| {
        let d = try_chain(c, key, enc)?;
        (&d[..4] == b"TRUE" || (veracrypt && &d[..4] == b"VERA")).then_some((*c, d))
    })
}

/// Decrypts the header of `device` with `passphrase` and `opts.key_files`: every allowed
/// KDF (TrueCrypt's cheap ones first, then VeraCrypt's derived in parallel, up to the
/// number of CPUs at a time) with every allowed cipher chain.
///
/// # Errors
/// [`FormatError::Rule`] for hints that match nothing or a too long passphrase,
/// [`FormatError::Key`] for unreadable key files, [`FormatError::Header`] when the
/// device cannot be read, [`FormatError::BadPassphrase`] when nothing decrypts.
pub fn load(
    device: &Path,
    passphrase: &[u8],
    opts: &TcryptOptions,
) -> Result<TcryptHeader, FormatError> {
    let kdfs = kdf_candidates(opts);
    if kdfs.is_empty() {
        return Err(FormatError::Rule(format!(
            "no TCRYPT KDF matches hash \"{}\"{}",
            opts.hash.as_deref().unwrap_or(""),
            if opts.veracrypt {
                ""
            } else {
                " in TrueCrypt-only mode"
            }
        )));
    }
    let chains = chain_candidates(opts);
    if chains.is_empty() {
        return Err(FormatError::Rule(format!(
            "no TCRYPT cipher chain matches cipher \"{}\"",
            opts.cipher.as_deref().unwrap_or("")
        )));
    }
    let password = keyfile::password(passphrase, &opts.key_files, opts.veracrypt)?;
    let dev = device.display().to_string();
    let read_err = |e: std::io::Error| FormatError::Header {
        what: format!("TCRYPT header on {dev}"),
        reason: format!("cannot read: {e}"),
    };
    let file = std::fs::File::open(device).map_err(read_err)?;
    let size = file.metadata().map_err(read_err)?.len();
    let size = if size == 0 {
        // Block devices report 0 in metadata; ask the device.
        use std::io::Seek;
        (&file).seek(std::io::SeekFrom::End(0)).map_err(read_err)?
    } else {
        size
    };
    let mut headers = Vec::new();
    for at in header_offsets(opts, size) {
        let mut raw = [0u8; HEADER_BYTES];
        if at + HEADER_BYTES as u64 <= size && file.read_exact_at(&mut raw, at).is_ok() {
            headers.push((at, raw));
        }
    }
    if headers.is_empty() {
        return Err(FormatError::Header {
            what: format!("TCRYPT header on {dev}"),
            reason: format!("device of {size} bytes is too small to hold the requested header"),
        });
    }
    let par = std::thread::available_parallelism().map_or(1, |n| n.get());
    // TrueCrypt KDFs cost milliseconds: try them one by one first; VeraCrypt ones cost
    // around a second each and run side by side. At most one KDF can decrypt a header, so
    // the order does not change the result.
    let (cheap, costly): (Vec<KdfEntry>, Vec<KdfEntry>) = kdfs.iter().partition(|k| !k.veracrypt);
    let groups: Vec<&[KdfEntry]> = cheap.chunks(1).chain(costly.chunks(par)).collect();
    let per_kdf = chains.len() as u64;
    let kdf_cost: u64 = kdfs.iter().map(|k| k.cost(opts.pim)).sum();
    let mut step = SearchStep {
        tried: 0,
        total: headers.len() as u64 * kdfs.len() as u64 * per_kdf,
        cost_done: 0,
        cost_total: headers.len() as u64 * kdf_cost,
        finished: false,
    };
    opts.progress.report(step);
    for (at, raw) in &headers {
        let (salt, rest) = raw.split_at(SALT_LEN);
        let mut enc = [0u8; ENC_LEN];
        enc.copy_from_slice(rest);
        for group in &groups {
            let found: Vec<Option<TcryptHeader>> = std::thread::scope(|s| {
                let handles: Vec<_> = group
                    .iter()
                    .map(|k| {
                        let (pw, enc, chains) = (&password, &enc, &chains);
                        s.spawn(move || {
                            let key = k.derive(pw, salt, opts.pim).ok()?;
                            let (c, d) = try_key(&key[..], enc, chains, opts.veracrypt)?;
                            parse(&d, *k, c, *at)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().ok().flatten())
                    .collect()
            });
            if let Some(h) = found.into_iter().flatten().next() {
                step.finished = true;
                opts.progress.report(step);
                return Ok(h);
            }
            step.tried += group.len() as u64 * per_kdf;
            step.cost_done += group.iter().map(|k| k.cost(opts.pim)).sum::<u64>();
            opts.progress.report(step);
        }
    }
    step.finished = true;
    opts.progress.report(step);
    Err(FormatError::BadPassphrase {
        device: dev,
        tried: "no TCRYPT/VeraCrypt header decrypts with this passphrase, key files and options"
            .into(),
    })
}
