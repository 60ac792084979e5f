//! Twofish with the key-dependent S-boxes and the MDS matrix folded into four 256-entry
//! tables at key setup, the way the kernel's `twofish_common.c` and every fast
//! implementation does it (facts from the Twofish paper: q0/q1 nibble tables, MDS over
//! GF(2^8)/0x169, RS over GF(2^8)/0x14D, the h function and key schedule).
//!
//! Written here because RustCrypto's `twofish` 0.8 evaluates the q-permutation chain and
//! the GF(2^8) MDS multiplications for every byte of every block: `ucrypt benchmark`
//! measured twofish-xts-plain64 at 3 MiB/s with it (Serpent: 280 MiB/s). With tables the
//! round function is four lookups per `g`. The crate stays as the reference of a
//! differential test below; the kernel golden vectors cover the modes on top.

use super::BlockCipher;
use zeroize::Zeroize;

#[cfg(target_arch = "x86_64")]
mod avx512;

/// The nibble tables t0..t3 of the permutations q0 and q1.
const Q_NIBBLES: [[[u8; 16]; 4]; 2] = [
    [
        [8, 1, 7, 13, 6, 15, 3, 2, 0, 11, 5, 9, 14, 12, 10, 4],
        [14, 12, 11, 8, 1, 2, 3, 5, 15, 4, 10, 6, 7, 0, 9, 13],
        [11, 10, 5, 14, 6, 13, 9, 0, 12, 8, 15, 3, 2, 4, 7, 1],
        [13, 7, 15, 4, 1, 2, 6, 14, 9, 11, 3, 0, 8, 5, 12, 10],
    ],
    [
        [2, 8, 11, 13, 15, 7, 6, 14, 3, 1, 9, 4, 0, 10, 12, 5],
        [1, 14, 2, 11, 4, 12, 3, 7, 6, 13, 10, 5, 15, 9, 0, 8],
        [4, 12, 7, 5, 1, 6, 9, 10, 0, 14, 13, 8, 2, 11, 3, 15],
        [11, 9, 5, 1, 12, 3, 13, 14, 6, 4, 7, 15, 2, 0, 8, 10],
    ],
];

/// Which permutation (q0 or q1) each byte position passes through, outermost key word
/// first: the h function's fixed wiring.
const Q_ORDER: [[usize; 5]; 4] = [
    [1, 1, 0, 0, 1],
    [0, 1, 1, 0, 0],
    [0, 0, 0, 1, 1],
    [1, 0, 1, 1, 0],
];

/// Column j of the MDS matrix (the multipliers of byte j for output bytes 0..3).
const MDS_COLUMNS: [[u8; 4]; 4] = [
    [0x01, 0x5b, 0xef, 0xef],
    [0xef, 0xef, 0x5b, 0x01],
    [0x5b, 0xef, 0x01, 0xef],
    [0x5b, 0x01, 0xef, 0x5b],
];

const RS: [[u8; 8]; 4] = [
    [0x01, 0xa4, 0x55, 0x87, 0x5a, 0x58, 0xdb, 0x9e],
    [0xa4, 0x56, 0x82, 0xf3, 0x1e, 0xc6, 0x68, 0xe5],
    [0x02, 0xa1, 0xfc, 0xc1, 0x47, 0xae, 0x3d, 0x19],
    [0xa4, 0x55, 0x87, 0x5a, 0x58, 0xdb, 0x9e, 0x03],
];

/// Multiplication in GF(2^8) modulo `poly` (the low 8 bits of the 9-bit polynomial).
fn gf_mul(mut a: u8, mut b: u8, poly: u8) -> u8 {
    let mut r = 0;
    while a != 0 {
        if a & 1 != 0 {
            r ^= b;
        }
        a >>= 1;
        b = if b & 0x80 != 0 {
            (b << 1) ^ poly
        } else {
            b << 1
        };
    }
    r
}

fn q(which: usize, x: u8) -> u8 {
    let t = &Q_NIBBLES[which];
    let ror4 = |v: u8| ((v >> 1) | (v << 3)) & 15;
    let (a0, b0) = (x >> 4, x & 15);
    let (a1, b1) = (a0 ^ b0, (a0 ^ ror4(b0) ^ (a0 << 3)) & 15);
    let (a2, b2) = (t[0][a1 as usize], t[1][b1 as usize]);
    let (a3, b3) = (a2 ^ b2, (a2 ^ ror4(b2) ^ (a2 << 3)) & 15);
    (t[3][b3 as usize] << 4) | t[2][a3 as usize]
}

fn mds_column(pos: usize, y: u8) -> u32 {
    let c = MDS_COLUMNS[pos].map(|m| gf_mul(m, y, 0x69));
    u32::from_le_bytes(c)
}

/// Byte `pos` of h(x, L) before the MDS step, for a key of `words` 64-bit halves
/// (2, 3 or 4); `l(i)` is key word L_i.
fn chain(pos: usize, x: u8, words: usize, l: &impl Fn(usize) -> [u8; 4]) -> u8 {
    let start = 4 - words;
    let mut y = q(Q_ORDER[pos][start], x);
    for (z, &which) in Q_ORDER[pos].iter().enumerate().skip(start + 1) {
        y = q(which, y ^ l(4 - z)[pos]);
    }
    y
}

fn h(x: u32, words: usize, l: &impl Fn(usize) -> [u8; 4]) -> u32 {
    let b = x.to_le_bytes();
    (0..4).fold(0, |acc, pos| {
        acc ^ mds_column(pos, chain(pos, b[pos], words, l))
    })
}

/// Which Twofish code this CPU runs (for `ucrypt --version`).
pub fn code_path() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    if avx512::available() {
        return "AVX-512 VBMI+GFNI over 16 blocks";
    }
    "portable tables, 4 blocks side by side"
}

/// A keyed Twofish: round subkeys, the four g tables (S-box and MDS column folded) for the
/// portable code, and the four key-dependent S-boxes alone for the vector code.
pub struct Twofish {
    k: [u32; 40],
    t: Box<[[u32; 256]; 4]>,
    sbox: Box<[[u8; 256]; 4]>,
    /// Whether the AVX-512 code runs (decided once, at key setup, from the CPU).
    simd: bool,
}

impl Twofish {
    /// Keys the cipher; `None` unless the key is 16, 24 or 32 bytes.
    pub fn new(key: &[u8]) -> Option<Self> {
        if !matches!(key.len(), 16 | 24 | 32) {
            return None;
        }
        let words = key.len() / 8;
        let word = |i: usize| -> [u8; 4] {
            key.get(4 * i..4 * i + 4)
                .and_then(|w| w.try_into().ok())
                .unwrap_or([0; 4])
        };
        let mut k = [0u32; 40];
        let rho = 0x0101_0101u32;
        for i in 0..20u32 {
            let a = h(2 * i * rho, words, &|j| word(2 * j));
            let b = h((2 * i + 1) * rho, words, &|j| word(2 * j + 1)).rotate_left(8);
            k[2 * i as usize] = a.wrapping_add(b);
            k[2 * i as usize + 1] = a.wrapping_add(b).wrapping_add(b).rotate_left(9);
        }
        // S_i = RS · (key bytes 8i..8i+8); g uses L_j = S_(words-1-j).
        let mut s = [[0u8; 4]; 4];
        for (i, si) in s.iter_mut().enumerate().take(words) {
            for (r, out) in si.iter_mut().enumerate() {
                *out = (0..8).fold(0, |acc, c| acc ^ gf_mul(key[8 * i + c], RS[r][c], 0x4d));
            }
        }
        let mut t = Box::new([[0u32; 256]; 4]);
        let mut sbox = Box::new([[0u8; 256]; 4]);
        let l = |j: usize| s[words - 1 - j];
        for pos in 0..4 {
            for x in 0..256 {
                let y = chain(pos, x as u8, words, &l);
                sbox[pos][x] = y;
                t[pos][x] = mds_column(pos, y);
            }
        }
        s.zeroize();
        #[cfg(target_arch = "x86_64")]
        let simd = avx512::available();
        #[cfg(not(target_arch = "x86_64"))]
        let simd = false;
        Some(Twofish { k, t, sbox, simd })
    }

    /// The same cipher with the vector code switched off (tests compare the two paths).
    #[cfg(test)]
    fn portable(mut self) -> Self {
        self.simd = false;
        self
    }

    /// Runs the vector code over the whole groups of `data` where the CPU has it; returns
    /// the bytes it did.
    #[allow(unsafe_code)]
    fn vector(&self, data: &mut [u8], encrypt: bool) -> usize {
        #[cfg(target_arch = "x86_64")]
        if self.simd {
            // SAFETY: `simd` is true only when `avx512::available()` found every feature
            // the vector code is compiled for.
            return unsafe {
                if encrypt {
                    avx512::encrypt(&self.k, &self.sbox, data)
                } else {
                    avx512::decrypt(&self.k, &self.sbox, data)
                }
            };
        }
        let _ = (data, encrypt);
        0
    }

    #[inline(always)]
    fn g(&self, x: u32) -> u32 {
        let b = x.to_le_bytes();
        self.t[0][b[0] as usize]
            ^ self.t[1][b[1] as usize]
            ^ self.t[2][b[2] as usize]
            ^ self.t[3][b[3] as usize]
    }

    /// Encrypts `N` blocks side by side. One Twofish block is a chain of 16 dependent
    /// rounds, each waiting on four table loads, so a lone block runs at the latency of that
    /// chain; `N` independent blocks in lockstep let the CPU overlap their loads and
    /// arithmetic (measured in `ucrypt benchmark`, see `LANES`).
    #[inline(always)]
    fn encrypt_lanes<const N: usize>(&self, blocks: &mut [u8]) {
        let k = &self.k;
        let mut p: [[u32; 4]; N] = std::array::from_fn(|i| {
            let w = read(&blocks[16 * i..16 * i + 16]);
            [w[0] ^ k[0], w[1] ^ k[1], w[2] ^ k[2], w[3] ^ k[3]]
        });
        for r in 0..8 {
            let k = &k[4 * r + 8..4 * r + 12];
            for p in p.iter_mut() {
                let t1 = self.g(p[1].rotate_left(8));
                let t0 = self.g(p[0]).wrapping_add(t1);
                p[2] = (p[2] ^ t0.wrapping_add(k[0])).rotate_right(1);
                p[3] = p[3].rotate_left(1) ^ t1.wrapping_add(t0).wrapping_add(k[1]);
            }
            for p in p.iter_mut() {
                let t1 = self.g(p[3].rotate_left(8));
                let t0 = self.g(p[2]).wrapping_add(t1);
                p[0] = (p[0] ^ t0.wrapping_add(k[2])).rotate_right(1);
                p[1] = p[1].rotate_left(1) ^ t1.wrapping_add(t0).wrapping_add(k[3]);
            }
        }
        for (i, p) in p.iter().enumerate() {
            write(
                &mut blocks[16 * i..16 * i + 16],
                [p[2] ^ k[4], p[3] ^ k[5], p[0] ^ k[6], p[1] ^ k[7]],
            );
        }
    }

    /// Decrypts `N` blocks side by side (see [`Self::encrypt_lanes`]).
    #[inline(always)]
    fn decrypt_lanes<const N: usize>(&self, blocks: &mut [u8]) {
        let k = &self.k;
        let mut p: [[u32; 4]; N] = std::array::from_fn(|i| {
            let c = read(&blocks[16 * i..16 * i + 16]);
            [c[2] ^ k[6], c[3] ^ k[7], c[0] ^ k[4], c[1] ^ k[5]]
        });
        for r in (0..8).rev() {
            let k = &k[4 * r + 8..4 * r + 12];
            for p in p.iter_mut() {
                let t1 = self.g(p[3].rotate_left(8));
                let t0 = self.g(p[2]).wrapping_add(t1);
                p[0] = p[0].rotate_left(1) ^ t0.wrapping_add(k[2]);
                p[1] = (p[1] ^ t1.wrapping_add(t0).wrapping_add(k[3])).rotate_right(1);
            }
            for p in p.iter_mut() {
                let t1 = self.g(p[1].rotate_left(8));
                let t0 = self.g(p[0]).wrapping_add(t1);
                p[2] = p[2].rotate_left(1) ^ t0.wrapping_add(k[0]);
                p[3] = (p[3] ^ t1.wrapping_add(t0).wrapping_add(k[1])).rotate_right(1);
            }
        }
        for (i, p) in p.iter().enumerate() {
            write(
                &mut blocks[16 * i..16 * i + 16],
                [p[0] ^ k[0], p[1] ^ k[1], p[2] ^ k[2], p[3] ^ k[3]],
            );
        }
    }
}

fn read(b: &[u8]) -> [u32; 4] {
    std::array::from_fn(|i| {
        u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
    })
}

fn write(b: &mut [u8], w: [u32; 4]) {
    for (i, v) in w.iter().enumerate() {
        b[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
    }
}

impl Drop for Twofish {
    fn drop(&mut self) {
        self.k.zeroize();
        for t in self.t.iter_mut() {
            t.zeroize();
        }
        for s in self.sbox.iter_mut() {
            s.zeroize();
        }
    }
}

/// Blocks processed side by side; see [`Twofish::encrypt_lanes`].
const LANES: usize = 4;

impl BlockCipher for Twofish {
    fn block_size(&self) -> usize {
        16
    }
    fn encrypt_blocks(&self, data: &mut [u8]) {
        assert!(
            data.len() % 16 == 0,
            "BUG: data is not a whole number of blocks"
        );
        let done = self.vector(data, true);
        let mut wide = data[done..].chunks_exact_mut(16 * LANES);
        for b in &mut wide {
            self.encrypt_lanes::<LANES>(b);
        }
        for b in wide.into_remainder().chunks_exact_mut(16) {
            self.encrypt_lanes::<1>(b);
        }
    }
    fn decrypt_blocks(&self, data: &mut [u8]) {
        assert!(
            data.len() % 16 == 0,
            "BUG: data is not a whole number of blocks"
        );
        let done = self.vector(data, false);
        let mut wide = data[done..].chunks_exact_mut(16 * LANES);
        for b in &mut wide {
            self.decrypt_lanes::<LANES>(b);
        }
        for b in wide.into_remainder().chunks_exact_mut(16) {
            self.decrypt_lanes::<1>(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::twofish::cipher::{BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};

    /// The Twofish paper's first ECB test vector (128-bit zero key, zero block).
    #[test]
    fn matches_the_papers_zero_key_vector() {
        let c = Twofish::new(&[0; 16]).unwrap();
        let mut b = [0u8; 16];
        c.encrypt_blocks(&mut b);
        assert_eq!(hex::encode(b), "9f589f5cf6122c32b6bfec2f2ae8c35a");
        c.decrypt_blocks(&mut b);
        assert_eq!(b, [0; 16]);
    }

    /// Same output as RustCrypto's `twofish` for every key length, many keys and blocks.
    #[test]
    fn agrees_with_rustcrypto_twofish() {
        let mut seed = 0x1234_5678_9abc_def0u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        };
        for len in [16, 24, 32] {
            for i in 0..20 {
                let key: Vec<u8> = (0..len).map(|_| next()).collect();
                let theirs = ::twofish::Twofish::new_from_slice(&key).unwrap();
                // 37 blocks: two 16-block vector groups (where the CPU has them: one pair,
                // interleaved), one group of side-by-side lanes and a one-block remainder;
                // 53 blocks: a pair, a single vector group, then the same.
                let blocks = if i % 2 == 0 { 37 } else { 53 };
                let plain: Vec<u8> = (0..16 * blocks).map(|_| next()).collect();
                let mut b = plain.clone();
                for blk in b.chunks_exact_mut(16) {
                    theirs.encrypt_block(blk.try_into().unwrap());
                }
                let mut c = b.clone();
                for blk in c.chunks_exact_mut(16) {
                    theirs.decrypt_block(blk.try_into().unwrap());
                }
                assert_eq!(c, plain);
                for (path, ours) in [
                    ("vector", Twofish::new(&key).unwrap()),
                    ("portable", Twofish::new(&key).unwrap().portable()),
                ] {
                    let mut a = plain.clone();
                    ours.encrypt_blocks(&mut a);
                    assert_eq!(a, b, "encrypt, {path} code, key length {len}");
                    ours.decrypt_blocks(&mut a);
                    assert_eq!(a, plain, "decrypt, {path} code, key length {len}");
                }
            }
        }
    }
}
