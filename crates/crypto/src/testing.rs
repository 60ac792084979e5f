//! Helpers for checking a [`SectorCipher`] against known ciphertext, shared by this crate's
//! tests and the other crates' (one checker drives every path).

use crate::{Sector512, SectorCipher};
use std::path::PathBuf;

/// The kernel golden vectors (`testdata/golden/` of the repository, or `$UCRYPT_GOLDEN_DIR`).
/// `None` (skip, with a message) when missing, by the workspace's one skip rule
/// ([`ucrypt_testkit::require_that`]).
///
/// # Panics
/// When missing under CI: CI must not skip the kernel vectors.
pub fn golden_dir() -> Option<PathBuf> {
    match std::env::var_os("UCRYPT_GOLDEN_DIR").map(PathBuf::from) {
        Some(dir) => ucrypt_testkit::require_that(
            dir.join("manifest.jsonl").exists(),
            format_args!(
                "golden vectors not found at {} (UCRYPT_GOLDEN_DIR)",
                dir.display()
            ),
        )
        .then_some(dir),
        None => ucrypt_testkit::testdata("golden", "manifest.jsonl"),
    }
}

/// The golden vectors' plaintext ("pattern-v1"): byte `i` of 512-byte sector `n` (counted
/// from the start of the mapping) is `(n*31 + i) & 0xff`.
pub fn pattern_v1(first: Sector512, sectors: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity((sectors as usize) << 9);
    for n in first.0..first.0 + sectors {
        out.extend((0..512u64).map(|i| ((n * 31 + i) & 0xff) as u8));
    }
    out
}

/// Ways of cutting a run of sectors into calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// One call for the whole run.
    Whole,
    /// One call per sector.
    PerSector,
    /// Uneven chunks of 1, 2, 3, ... sectors (as if split across workers).
    Uneven,
}

/// Every split.
pub const SPLITS: [Split; 3] = [Split::Whole, Split::PerSector, Split::Uneven];

fn chunks(total_sectors: usize, split: Split) -> Vec<usize> {
    match split {
        Split::Whole => vec![total_sectors],
        Split::PerSector => vec![1; total_sectors],
        Split::Uneven => {
            let mut v = Vec::new();
            let (mut left, mut n) = (total_sectors, 1);
            while left > 0 {
                let take = n.min(left);
                v.push(take);
                left -= take;
                n = n % 7 + 1;
            }
            v
        }
    }
}

/// Encrypts `plain` (whole sectors starting at `first`) with the given split.
pub fn encrypt_split(
    c: &dyn SectorCipher,
    first: Sector512,
    plain: &[u8],
    split: Split,
) -> Vec<u8> {
    run_split(c, first, plain, split, true)
}

/// Decrypts `ct` (whole sectors starting at `first`) with the given split.
pub fn decrypt_split(c: &dyn SectorCipher, first: Sector512, ct: &[u8], split: Split) -> Vec<u8> {
    run_split(c, first, ct, split, false)
}

fn run_split(
    c: &dyn SectorCipher,
    first: Sector512,
    data: &[u8],
    split: Split,
    enc: bool,
) -> Vec<u8> {
    let ss = c.sector_size();
    let mut out = data.to_vec();
    let mut pos = 0usize;
    let mut sector = first.0;
    for n in chunks(data.len() / ss.len(), split) {
        let bytes = n * ss.len();
        let run = &mut out[pos..pos + bytes];
        if enc {
            c.encrypt(Sector512(sector), run);
        } else {
            c.decrypt(Sector512(sector), run);
        }
        pos += bytes;
        sector += n as u64 * ss.sectors512();
    }
    out
}

/// Checks both directions under every split; returns a description of each mismatch.
pub fn check(c: &dyn SectorCipher, first: Sector512, plain: &[u8], ct: &[u8]) -> Vec<String> {
    let mut failures = Vec::new();
    for split in SPLITS {
        let got = encrypt_split(c, first, plain, split);
        if got != ct {
            failures.push(format!(
                "encrypt ({split:?}) differs {}",
                first_diff(&got, ct)
            ));
        }
        let got = decrypt_split(c, first, ct, split);
        if got != plain {
            failures.push(format!(
                "decrypt ({split:?}) differs {}",
                first_diff(&got, plain)
            ));
        }
    }
    // Out of place (decrypting straight out of a mapped file), under every split too.
    for split in SPLITS {
        let mut got = vec![0u8; ct.len()];
        let ss = c.sector_size();
        let (mut pos, mut sector) = (0usize, first.0);
        for n in chunks(ct.len() / ss.len(), split) {
            let bytes = n * ss.len();
            c.decrypt_from(
                Sector512(sector),
                &ct[pos..pos + bytes],
                &mut got[pos..pos + bytes],
            );
            pos += bytes;
            sector += n as u64 * ss.sectors512();
        }
        if got != plain {
            failures.push(format!(
                "decrypt_from ({split:?}) differs {}",
                first_diff(&got, plain)
            ));
        }
    }
    failures
}

fn first_diff(a: &[u8], b: &[u8]) -> String {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => format!("from byte {i} (512-byte sector {})", i / 512),
        None => format!("in length ({} vs {})", a.len(), b.len()),
    }
}

/// HMAC-SHA512's inner and outer states for `key` (at most 128 bytes), as
/// [`hmac_sha256_states`] gives SHA-256's: SHA-512's eight 64-bit words after one block,
/// native-endian.
///
/// # Panics
/// If `key` is longer than a SHA-512 block.
pub fn hmac_sha512_states(key: &[u8]) -> [[u8; 64]; 2] {
    assert!(key.len() <= 128, "an HMAC-SHA512 key of at most 128 bytes");
    [0x36u8, 0x5c].map(|pad| {
        let mut block = [pad; 128];
        for (b, k) in block.iter_mut().zip(key) {
            *b ^= k;
        }
        let mut state: [u64; 8] = [
            0x6a09e667f3bcc908,
            0xbb67ae8584caa73b,
            0x3c6ef372fe94f82b,
            0xa54ff53a5f1d36f1,
            0x510e527fade682d1,
            0x9b05688c2b3e6c1f,
            0x1f83d9abfb41bd6b,
            0x5be0cd19137e2179,
        ];
        sha2::block_api::compress512(&mut state, &[block]);
        let mut out = [0u8; 64];
        for (o, w) in out.chunks_exact_mut(8).zip(state) {
            o.copy_from_slice(&w.to_ne_bytes());
        }
        out
    })
}

/// AES-GCM's hash key for the AES key `key` (16 or 32 bytes), in the two forms a scan for
/// it looks for: `[H, twisted]`, where H = AES_K(0^128) is GHASH's key as the GCM
/// specification writes it, and `twisted` is how x86-64's GHASH code (AWS-LC's CLMUL, AVX
/// and AVX-512 `gcm_init_*`) keeps it: H read as a big-endian 128-bit number, shifted left
/// one bit, reduced by 0xc2000000_00000000_00000000_00000001 when a bit falls out, stored
/// little-endian (the first entry of its table of powers of H, which holds no raw H).
///
/// # Panics
/// If `key` is neither 16 nor 32 bytes.
pub fn gcm_hash_keys(key: &[u8]) -> [[u8; 16]; 2] {
    use aes::cipher::{BlockCipherEncrypt, KeyInit};
    let mut h = aes::Block::default();
    match key.len() {
        16 => aes::Aes128::new_from_slice(key)
            .expect("a 16-byte key")
            .encrypt_block(&mut h),
        32 => aes::Aes256::new_from_slice(key)
            .expect("a 32-byte key")
            .encrypt_block(&mut h),
        n => panic!("an AES-GCM key of 16 or 32 bytes, not {n}"),
    }
    let raw: [u8; 16] = h.into();
    let n = u128::from_be_bytes(raw);
    let reduce = if n >> 127 == 1 {
        0xc200_0000_0000_0000_0000_0000_0000_0001
    } else {
        0
    };
    [raw, ((n << 1) ^ reduce).to_le_bytes()]
}

/// HMAC-SHA256's inner and outer states for `key` (at most 64 bytes): SHA-256's eight
/// words after the block `key ^ 0x36..` and after `key ^ 0x5c..`, native-endian as an
/// implementation holds them. They stand for the key (an HMAC keeps them, not the key),
/// so a scan for key material in memory looks for them too.
///
/// # Panics
/// If `key` is longer than a SHA-256 block.
pub fn hmac_sha256_states(key: &[u8]) -> [[u8; 32]; 2] {
    assert!(key.len() <= 64, "an HMAC-SHA256 key of at most 64 bytes");
    [0x36u8, 0x5c].map(|pad| {
        let mut block = [pad; 64];
        for (b, k) in block.iter_mut().zip(key) {
            *b ^= k;
        }
        let mut state: [u32; 8] = [
            0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
            0x5be0cd19,
        ];
        sha2::block_api::compress256(&mut state, &[block]);
        let mut out = [0u8; 32];
        for (o, w) in out.chunks_exact_mut(4).zip(state) {
            o.copy_from_slice(&w.to_ne_bytes());
        }
        out
    })
}

/// Where `needle` lies in the 64 KiB of this thread's stack below `top` (an address in a
/// frame of the caller's, e.g. of a local it passed through [`std::hint::black_box`]),
/// read through /proc/self/mem, not through pointers: its distances below `top`. For
/// tests that check a cipher leaves no key in the stack of the thread that used it.
///
/// # Panics
/// If /proc/self/mem cannot be read there.
pub fn stack_below(top: usize, needle: &[u8]) -> Vec<usize> {
    use std::io::{Read, Seek, SeekFrom};
    let span = 64 * 1024;
    let mut buf = vec![0u8; span];
    let mut mem = std::fs::File::open("/proc/self/mem").expect("/proc/self/mem");
    mem.seek(SeekFrom::Start((top - span) as u64))
        .expect("seek in /proc/self/mem");
    mem.read_exact(&mut buf).expect("read /proc/self/mem");
    buf.windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(i, _)| span - i)
        .collect()
}

/// Leaves a copy of `key` (at most 128 bytes) in a frame below the caller's: what
/// [`stack_below`] must find, so a test proves it sees the stack.
#[inline(never)]
pub fn plant_on_stack(key: &[u8]) {
    let mut copy = [0u8; 128];
    copy[..key.len()].copy_from_slice(key);
    std::hint::black_box(&copy);
}
