//! Serpent over many blocks at once, bit-sliced across SIMD lanes.
//!
//! Written here because no maintained crate does it: RustCrypto's `serpent` 0.6 (the
//! reference of the differential tests below) encrypts one block per call on 32-bit words
//! (`ParBlocksSize = U1`), about 300 MiB/s in serpent-xts-plain64, and crates.io has no
//! multi-block or SIMD Serpent (searched November 2026). Serpent's S-boxes were designed as
//! boolean circuits over 32-bit words, so the same circuits run on a vector whose lane `b`
//! holds word `j` of block `b`: 8 blocks per 256-bit AVX2 register, 16 per AVX-512
//! register, as the kernel's `serpent-avx2` does; with AVX-512 two registers' groups run
//! side by side (32 blocks), because one group's rounds are a dependency chain that left
//! the vector units two-thirds idle (1.35x measured; four side by side gained nothing). The circuits are Osvik's ("Speeding up
//! Serpent"), taken over from the `serpent` crate (MIT/Apache-2.0) unchanged except for
//! being generic over the word type; the key schedule and the round structure follow the
//! Serpent paper and that crate. The vectorisation is left to the compiler: [`simd::Lanes`] is a
//! plain array with per-lane operators, compiled once per instruction set behind
//! `#[target_feature]` and picked at key setup by run-time CPU detection; the portable build
//! of the same code is the fallback.
//!
//! Correctness: the differential tests below (random keys, lengths and data against the
//! `serpent` crate) and the kernel golden vectors for serpent-cbc/xts (`testdata/golden`).

// The one unsafe use: calling the `#[target_feature]` builds after run-time detection.
#![allow(unsafe_code)]

use super::BlockCipher;
use core::ops::{BitAnd, BitAndAssign, BitOr, BitOrAssign, BitXor, BitXorAssign, Not};
use zeroize::Zeroize;

const PHI: u32 = 0x9e37_79b9;
const ROUNDS: usize = 32;

/// 33 round keys of four words each.
type RoundKeys = [[u32; 4]; ROUNDS + 1];

/// A 32-bit word, or many of them side by side: what the S-box circuits and the linear
/// transform need.
trait Word:
    Copy
    + BitXor<Output = Self>
    + BitXorAssign
    + BitAnd<Output = Self>
    + BitAndAssign
    + BitOr<Output = Self>
    + BitOrAssign
    + Not<Output = Self>
{
    fn splat(x: u32) -> Self;
    fn rotl(self, n: u32) -> Self;
    fn shl(self, n: u32) -> Self;
}

impl Word for u32 {
    #[inline(always)]
    fn splat(x: u32) -> Self {
        x
    }
    #[inline(always)]
    fn rotl(self, n: u32) -> Self {
        self.rotate_left(n)
    }
    #[inline(always)]
    fn shl(self, n: u32) -> Self {
        self << n
    }
}

/// 32-bit words in SIMD lanes, lane `b` belonging to block `b`.
///
/// The compiler did not vectorise a plain `[u32; N]` with per-lane operators (measured:
/// slower than the one-block crate), so each width wraps its register type and calls the
/// intrinsics itself. Values of these types are created only inside the matching
/// `#[target_feature]` function (`run_sse2`, `run_avx2`, `run_avx512`), which runs only
/// after run-time detection; that is the invariant every `SAFETY` comment below relies on.
#[cfg(target_arch = "x86_64")]
mod simd {
    use super::Word;
    use core::arch::x86_64::*;
    use core::ops::{BitAnd, BitAndAssign, BitOr, BitOrAssign, BitXor, BitXorAssign, Not};

    /// Loads and stores of `LANES` words.
    pub(super) trait Lanes: Word {
        const LANES: usize;
        fn load(src: &[u32]) -> Self;
        fn store(self, dst: &mut [u32]);
    }

    macro_rules! vector {
        ($name:ident, $t:ty, $n:expr, $feat:literal,
         xor: $xor:ident, and: $and:ident, or: $or:ident, set1: $set1:ident,
         sll: $sll:ident, srl: $srl:ident, load: $load:ident, store: $store:ident) => {
            #[derive(Clone, Copy)]
            pub(super) struct $name($t);

            impl BitXor for $name {
                type Output = Self;
                #[inline(always)]
                fn bitxor(self, r: Self) -> Self {
                    // SAFETY: only reachable on CPUs with the feature (see `mod simd`).
                    $name(unsafe { $xor(self.0, r.0) })
                }
            }
            impl BitAnd for $name {
                type Output = Self;
                #[inline(always)]
                fn bitand(self, r: Self) -> Self {
                    // SAFETY: only reachable on CPUs with the feature (see `mod simd`).
                    $name(unsafe { $and(self.0, r.0) })
                }
            }
            impl BitOr for $name {
                type Output = Self;
                #[inline(always)]
                fn bitor(self, r: Self) -> Self {
                    // SAFETY: only reachable on CPUs with the feature (see `mod simd`).
                    $name(unsafe { $or(self.0, r.0) })
                }
            }
            impl BitXorAssign for $name {
                #[inline(always)]
                fn bitxor_assign(&mut self, r: Self) {
                    *self = *self ^ r;
                }
            }
            impl BitAndAssign for $name {
                #[inline(always)]
                fn bitand_assign(&mut self, r: Self) {
                    *self = *self & r;
                }
            }
            impl BitOrAssign for $name {
                #[inline(always)]
                fn bitor_assign(&mut self, r: Self) {
                    *self = *self | r;
                }
            }
            impl Not for $name {
                type Output = Self;
                #[inline(always)]
                fn not(self) -> Self {
                    self ^ Self::splat(u32::MAX)
                }
            }
            impl Word for $name {
                #[inline(always)]
                fn splat(x: u32) -> Self {
                    // SAFETY: only reachable on CPUs with the feature (see `mod simd`).
                    $name(unsafe { $set1(x as i32) })
                }
                #[inline(always)]
                fn rotl(self, n: u32) -> Self {
                    self.shl(n) | self.shr(32 - n)
                }
                #[inline(always)]
                fn shl(self, n: u32) -> Self {
                    // SAFETY: only reachable on CPUs with the feature (see `mod simd`).
                    $name(unsafe { $sll(self.0, _mm_cvtsi32_si128(n as i32)) })
                }
            }
            impl $name {
                #[inline(always)]
                fn shr(self, n: u32) -> Self {
                    // SAFETY: only reachable on CPUs with the feature (see `mod simd`).
                    $name(unsafe { $srl(self.0, _mm_cvtsi32_si128(n as i32)) })
                }
            }
            impl Lanes for $name {
                const LANES: usize = $n;
                #[inline(always)]
                fn load(src: &[u32]) -> Self {
                    assert!(src.len() >= $n);
                    // SAFETY: `src` has at least LANES readable words (asserted); the load
                    // is the unaligned kind; the feature as above.
                    $name(unsafe { $load(src.as_ptr().cast()) })
                }
                #[inline(always)]
                fn store(self, dst: &mut [u32]) {
                    assert!(dst.len() >= $n);
                    // SAFETY: `dst` has at least LANES writable words (asserted); the store
                    // is the unaligned kind; the feature as above.
                    unsafe { $store(dst.as_mut_ptr().cast(), self.0) }
                }
            }
        };
    }

    vector!(V128, __m128i, 4, "sse2",
        xor: _mm_xor_si128, and: _mm_and_si128, or: _mm_or_si128, set1: _mm_set1_epi32,
        sll: _mm_sll_epi32, srl: _mm_srl_epi32, load: _mm_loadu_si128, store: _mm_storeu_si128);
    vector!(V256, __m256i, 8, "avx2",
        xor: _mm256_xor_si256, and: _mm256_and_si256, or: _mm256_or_si256,
        set1: _mm256_set1_epi32, sll: _mm256_sll_epi32, srl: _mm256_srl_epi32,
        load: _mm256_loadu_si256, store: _mm256_storeu_si256);
    vector!(V512, __m512i, 16, "avx512f",
        xor: _mm512_xor_si512, and: _mm512_and_si512, or: _mm512_or_si512,
        set1: _mm512_set1_epi32, sll: _mm512_sll_epi32, srl: _mm512_srl_epi32,
        load: _mm512_loadu_si512, store: _mm512_storeu_si512);

    /// Two registers' worth of blocks, worked on side by side. One group's rounds are a
    /// chain of dependent operations (about 26 per round, at 0.7 per cycle measured with
    /// AVX-512); two independent chains let the CPU issue from both.
    #[derive(Clone, Copy)]
    pub(super) struct X2<W>(W, W);

    macro_rules! pairwise {
        ($tr:ident, $f:ident, $atr:ident, $af:ident) => {
            impl<W: Word> $tr for X2<W> {
                type Output = Self;
                #[inline(always)]
                fn $f(self, r: Self) -> Self {
                    X2(self.0.$f(r.0), self.1.$f(r.1))
                }
            }
            impl<W: Word> $atr for X2<W> {
                #[inline(always)]
                fn $af(&mut self, r: Self) {
                    self.0.$af(r.0);
                    self.1.$af(r.1);
                }
            }
        };
    }
    pairwise!(BitXor, bitxor, BitXorAssign, bitxor_assign);
    pairwise!(BitAnd, bitand, BitAndAssign, bitand_assign);
    pairwise!(BitOr, bitor, BitOrAssign, bitor_assign);

    impl<W: Word> Not for X2<W> {
        type Output = Self;
        #[inline(always)]
        fn not(self) -> Self {
            X2(!self.0, !self.1)
        }
    }
    impl<W: Word> Word for X2<W> {
        #[inline(always)]
        fn splat(x: u32) -> Self {
            let w = W::splat(x);
            X2(w, w)
        }
        #[inline(always)]
        fn rotl(self, n: u32) -> Self {
            X2(self.0.rotl(n), self.1.rotl(n))
        }
        #[inline(always)]
        fn shl(self, n: u32) -> Self {
            X2(self.0.shl(n), self.1.shl(n))
        }
    }
    impl<W: Lanes> Lanes for X2<W> {
        const LANES: usize = 2 * W::LANES;
        #[inline(always)]
        fn load(src: &[u32]) -> Self {
            X2(W::load(src), W::load(&src[W::LANES..]))
        }
        #[inline(always)]
        fn store(self, dst: &mut [u32]) {
            self.0.store(dst);
            self.1.store(&mut dst[W::LANES..]);
        }
    }
}

/// The most blocks one group holds (`X2<V512>`).
#[cfg(target_arch = "x86_64")]
const MAX_LANES: usize = 32;

#[inline(always)]
fn add_key<W: Word>(b: [W; 4], k: &[u32; 4]) -> [W; 4] {
    [
        b[0] ^ W::splat(k[0]),
        b[1] ^ W::splat(k[1]),
        b[2] ^ W::splat(k[2]),
        b[3] ^ W::splat(k[3]),
    ]
}

#[inline(always)]
fn linear_transform<W: Word>([mut w0, mut w1, mut w2, mut w3]: [W; 4]) -> [W; 4] {
    w0 = w0.rotl(13);
    w2 = w2.rotl(3);
    w1 ^= w0 ^ w2;
    w3 = w3 ^ w2 ^ w0.shl(3);
    w1 = w1.rotl(1);
    w3 = w3.rotl(7);
    w0 ^= w1 ^ w3;
    w2 = w2 ^ w3 ^ w1.shl(7);
    w0 = w0.rotl(5);
    w2 = w2.rotl(22);
    [w0, w1, w2, w3]
}

#[inline(always)]
fn linear_transform_inv<W: Word>([mut w0, mut w1, mut w2, mut w3]: [W; 4]) -> [W; 4] {
    w2 = w2.rotl(32 - 22);
    w0 = w0.rotl(32 - 5);
    w2 = w2 ^ w3 ^ w1.shl(7);
    w0 ^= w1 ^ w3;
    w3 = w3.rotl(32 - 7);
    w1 = w1.rotl(32 - 1);
    w3 = w3 ^ w2 ^ w0.shl(3);
    w1 ^= w0 ^ w2;
    w2 = w2.rotl(32 - 3);
    w0 = w0.rotl(32 - 13);
    [w0, w1, w2, w3]
}

/// The 32 rounds on `W`-wide words (one block per lane).
#[inline(always)]
fn encrypt_words<W: Word>(rk: &RoundKeys, mut b: [W; 4]) -> [W; 4] {
    macro_rules! round {
        ($i:expr, $s:ident) => {
            b = $s(add_key(b, &rk[$i]));
            b = if $i == ROUNDS - 1 {
                add_key(b, &rk[ROUNDS])
            } else {
                linear_transform(b)
            };
        };
    }
    for r in 0..ROUNDS / 8 {
        let i = 8 * r;
        round!(i, sbox_e0);
        round!(i + 1, sbox_e1);
        round!(i + 2, sbox_e2);
        round!(i + 3, sbox_e3);
        round!(i + 4, sbox_e4);
        round!(i + 5, sbox_e5);
        round!(i + 6, sbox_e6);
        round!(i + 7, sbox_e7);
    }
    b
}

/// The inverse of [`encrypt_words`].
#[inline(always)]
fn decrypt_words<W: Word>(rk: &RoundKeys, mut b: [W; 4]) -> [W; 4] {
    macro_rules! round {
        ($i:expr, $s:ident) => {
            b = if $i == ROUNDS - 1 {
                add_key(b, &rk[ROUNDS])
            } else {
                linear_transform_inv(b)
            };
            b = add_key($s(b), &rk[$i]);
        };
    }
    for r in (0..ROUNDS / 8).rev() {
        let i = 8 * r;
        round!(i + 7, sbox_d7);
        round!(i + 6, sbox_d6);
        round!(i + 5, sbox_d5);
        round!(i + 4, sbox_d4);
        round!(i + 3, sbox_d3);
        round!(i + 2, sbox_d2);
        round!(i + 1, sbox_d1);
        round!(i, sbox_d0);
    }
    b
}

/// Runs `W::LANES` blocks (16 bytes each) through the cipher in place: transposes them
/// into lanes and back.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn group<W: simd::Lanes, const ENCRYPT: bool>(rk: &RoundKeys, data: &mut [u8]) {
    let n = W::LANES;
    debug_assert_eq!(data.len(), 16 * n);
    let mut t = [[0u32; MAX_LANES]; 4];
    for (b, block) in data.chunks_exact(16).enumerate() {
        for (j, word) in block.chunks_exact(4).enumerate() {
            t[j][b] = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        }
    }
    let w = [
        W::load(&t[0]),
        W::load(&t[1]),
        W::load(&t[2]),
        W::load(&t[3]),
    ];
    let w = if ENCRYPT {
        encrypt_words(rk, w)
    } else {
        decrypt_words(rk, w)
    };
    for (j, v) in w.into_iter().enumerate() {
        v.store(&mut t[j]);
    }
    for (b, block) in data.chunks_exact_mut(16).enumerate() {
        for (j, word) in block.chunks_exact_mut(4).enumerate() {
            word.copy_from_slice(&t[j][b].to_le_bytes());
        }
    }
    t.zeroize();
}

/// Whole blocks of `data` through the cipher, `W::LANES` at a time; a short tail is padded
/// into a scratch group (the padding lanes' output is discarded). Everything inlines into
/// the caller, so one `#[target_feature]` caller compiles all of it for its instruction set.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn all_groups<W: simd::Lanes, const ENCRYPT: bool>(rk: &RoundKeys, data: &mut [u8]) {
    let mut groups = data.chunks_exact_mut(16 * W::LANES);
    for g in &mut groups {
        group::<W, ENCRYPT>(rk, g);
    }
    let rest = groups.into_remainder();
    if !rest.is_empty() {
        let mut scratch = [0u8; 16 * MAX_LANES];
        let scratch = &mut scratch[..16 * W::LANES];
        scratch[..rest.len()].copy_from_slice(rest);
        group::<W, ENCRYPT>(rk, scratch);
        rest.copy_from_slice(&scratch[..rest.len()]);
        scratch.zeroize();
    }
}

/// One block at a time on plain `u32` words: the fallback off x86-64.
fn one_by_one(rk: &RoundKeys, data: &mut [u8], encrypt: bool) {
    for block in data.chunks_exact_mut(16) {
        let w: [u32; 4] = core::array::from_fn(|j| {
            u32::from_le_bytes([
                block[4 * j],
                block[4 * j + 1],
                block[4 * j + 2],
                block[4 * j + 3],
            ])
        });
        let w = if encrypt {
            encrypt_words(rk, w)
        } else {
            decrypt_words(rk, w)
        };
        for (dst, v) in block.chunks_exact_mut(4).zip(w) {
            dst.copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// Which instruction set the lanes compile to, chosen once at key setup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Isa {
    /// One block at a time on `u32` words (off x86-64; on x86-64 only the tests use it).
    #[cfg_attr(all(target_arch = "x86_64", not(test)), allow(dead_code))]
    Scalar,
    /// 4 blocks in a 128-bit register (SSE2: every x86-64 CPU).
    #[cfg(target_arch = "x86_64")]
    Sse2,
    /// 8 blocks in a 256-bit register.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// 32 blocks in two 512-bit registers, their rounds interleaved ([`simd::X2`]).
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Isa {
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return Isa::Avx2;
            }
            Isa::Sse2
        }
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Scalar
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
fn run_sse2(rk: &RoundKeys, data: &mut [u8], encrypt: bool) {
    if encrypt {
        all_groups::<simd::V128, true>(rk, data);
    } else {
        all_groups::<simd::V128, false>(rk, data);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn run_avx2(rk: &RoundKeys, data: &mut [u8], encrypt: bool) {
    if encrypt {
        all_groups::<simd::V256, true>(rk, data);
    } else {
        all_groups::<simd::V256, false>(rk, data);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
fn run_avx512(rk: &RoundKeys, data: &mut [u8], encrypt: bool) {
    if encrypt {
        all_groups::<simd::X2<simd::V512>, true>(rk, data);
    } else {
        all_groups::<simd::X2<simd::V512>, false>(rk, data);
    }
}

/// Serpent keyed for many blocks at once.
pub(crate) struct Serpent {
    rk: RoundKeys,
    isa: Isa,
}

impl Serpent {
    /// Keys Serpent with 16 to 32 bytes (the lengths the `serpent` crate and `key_lengths`
    /// accept); shorter keys are padded as the Serpent paper specifies.
    pub(crate) fn new(key: &[u8]) -> Option<Self> {
        Self::with_isa(key, Isa::detect())
    }

    fn with_isa(key: &[u8], isa: Isa) -> Option<Self> {
        if !(16..=32).contains(&key.len()) {
            return None;
        }
        let mut padded = [0u8; 32];
        padded[..key.len()].copy_from_slice(key);
        if key.len() < 32 {
            padded[key.len()] = 1;
        }
        let mut w = [0u32; 140];
        for (dst, src) in w[..8].iter_mut().zip(padded.chunks_exact(4)) {
            *dst = u32::from_le_bytes([src[0], src[1], src[2], src[3]]);
        }
        padded.zeroize();
        for i in 0..132 {
            let s = i + 8;
            w[s] = (w[s - 8] ^ w[s - 5] ^ w[s - 3] ^ w[s - 1] ^ PHI ^ i as u32).rotate_left(11);
        }
        let mut rk: RoundKeys = [[0; 4]; ROUNDS + 1];
        for (i, k) in rk.iter_mut().enumerate() {
            let x = [w[8 + 4 * i], w[9 + 4 * i], w[10 + 4 * i], w[11 + 4 * i]];
            // Round key i goes through S-box (3 - i) mod 8.
            *k = match (ROUNDS + 3 - i) % 8 {
                0 => sbox_e0(x),
                1 => sbox_e1(x),
                2 => sbox_e2(x),
                3 => sbox_e3(x),
                4 => sbox_e4(x),
                5 => sbox_e5(x),
                6 => sbox_e6(x),
                _ => sbox_e7(x),
            };
        }
        w.zeroize();
        Some(Serpent { rk, isa })
    }

    fn run(&self, data: &mut [u8], encrypt: bool) {
        assert!(
            data.len() % 16 == 0,
            "BUG: data is not a whole number of blocks"
        );
        match self.isa {
            Isa::Scalar => one_by_one(&self.rk, data, encrypt),
            // SAFETY: SSE2 is part of x86-64.
            #[cfg(target_arch = "x86_64")]
            Isa::Sse2 => unsafe { run_sse2(&self.rk, data, encrypt) },
            // SAFETY: `Isa::Avx2` is chosen only when the CPU reports AVX2 (Isa::detect).
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { run_avx2(&self.rk, data, encrypt) },
            // SAFETY: `Isa::Avx512` is chosen only when the CPU reports AVX-512F
            // (Isa::detect); every AVX-512 CPU has AVX2.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { run_avx512(&self.rk, data, encrypt) },
        }
    }
}

impl Drop for Serpent {
    fn drop(&mut self) {
        self.rk.zeroize();
    }
}

impl BlockCipher for Serpent {
    fn block_size(&self) -> usize {
        16
    }
    fn encrypt_blocks(&self, data: &mut [u8]) {
        self.run(data, true);
    }
    fn decrypt_blocks(&self, data: &mut [u8]) {
        self.run(data, false);
    }
}

// Osvik's S-box circuits and their inverses, from the `serpent` crate's bitslice.rs.

#[inline(always)]
fn sbox_e0<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    w4 ^= w1;
    let mut t0 = w2;
    w2 &= w4;
    t0 ^= w3;
    w2 ^= w1;
    w1 |= w4;
    w1 ^= t0;
    t0 ^= w4;
    w4 ^= w3;
    w3 |= w2;
    w3 ^= t0;
    t0 = !t0;
    t0 |= w2;
    w2 ^= w4;
    w2 ^= t0;
    w4 |= w1;
    w2 ^= w4;
    t0 ^= w4;
    [w2, t0, w3, w1]
}

#[inline(always)]
fn sbox_e1<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    w1 = !w1;
    w3 = !w3;
    let mut t0 = w1;
    w1 &= w2;
    w3 ^= w1;
    w1 |= w4;
    w4 ^= w3;
    w2 ^= w1;
    w1 ^= t0;
    t0 |= w2;
    w2 ^= w4;
    w3 |= w1;
    w3 &= t0;
    w1 ^= w2;
    w2 &= w3;
    w2 ^= w1;
    w1 &= w3;
    t0 ^= w1;
    [w3, t0, w4, w2]
}

#[inline(always)]
fn sbox_e2<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    let mut t0 = w1;
    w1 &= w3;
    w1 ^= w4;
    w3 ^= w2;
    w3 ^= w1;
    w4 |= t0;
    w4 ^= w2;
    t0 ^= w3;
    w2 = w4;
    w4 |= t0;
    w4 ^= w1;
    w1 &= w2;
    t0 ^= w1;
    w2 ^= w4;
    w2 ^= t0;
    t0 = !t0;
    [w3, w4, w2, t0]
}

#[inline(always)]
fn sbox_e3<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    let mut t0 = w1;
    w1 |= w4;
    w4 ^= w2;
    w2 &= t0;
    t0 ^= w3;
    w3 ^= w4;
    w4 &= w1;
    t0 |= w2;
    w4 ^= t0;
    w1 ^= w2;
    t0 &= w1;
    w2 ^= w4;
    t0 ^= w3;
    w2 |= w1;
    w2 ^= w3;
    w1 ^= w4;
    w3 = w2;
    w2 |= w4;
    w1 ^= w2;
    [w1, w3, w4, t0]
}

#[inline(always)]
fn sbox_e4<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    w2 ^= w4;
    w4 = !w4;
    w3 ^= w4;
    w4 ^= w1;
    let mut t0 = w2;
    w2 &= w4;
    w2 ^= w3;
    t0 ^= w4;
    w1 ^= t0;
    w3 &= t0;
    w3 ^= w1;
    w1 &= w2;
    w4 ^= w1;
    t0 |= w2;
    t0 ^= w1;
    w1 |= w4;
    w1 ^= w3;
    w3 &= w4;
    w1 = !w1;
    t0 ^= w3;
    [w2, t0, w1, w4]
}

#[inline(always)]
fn sbox_e5<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    w1 ^= w2;
    w2 ^= w4;
    w4 = !w4;
    let mut t0 = w2;
    w2 &= w1;
    w3 ^= w4;
    w2 ^= w3;
    w3 |= t0;
    t0 ^= w4;
    w4 &= w2;
    w4 ^= w1;
    t0 ^= w2;
    t0 ^= w3;
    w3 ^= w1;
    w1 &= w4;
    w3 = !w3;
    w1 ^= t0;
    t0 |= w4;
    t0 ^= w3;
    w3 = w1;
    w1 = w2;
    w2 = w4;
    w4 = t0;
    [w1, w2, w3, w4]
}

#[inline(always)]
fn sbox_e6<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    w3 = !w3;
    let mut t0 = w4;
    w4 &= w1;
    w1 ^= t0;
    w4 ^= w3;
    w3 |= t0;
    w2 ^= w4;
    w3 ^= w1;
    w1 |= w2;
    w3 ^= w2;
    t0 ^= w1;
    w1 |= w4;
    w1 ^= w3;
    t0 ^= w4;
    t0 ^= w1;
    w4 = !w4;
    w3 &= t0;
    w4 ^= w3;
    w3 = t0;
    [w1, w2, w3, w4]
}

#[inline(always)]
fn sbox_e7<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    let mut t0 = w2;
    w2 |= w3;
    w2 ^= w4;
    t0 ^= w3;
    w3 ^= w2;
    w4 |= t0;
    w4 &= w1;
    t0 ^= w3;
    w4 ^= w2;
    w2 |= t0;
    w2 ^= w1;
    w1 |= t0;
    w1 ^= w3;
    w2 ^= t0;
    w3 ^= w2;
    w2 &= w1;
    w2 ^= t0;
    w3 = !w3;
    w3 |= w1;
    t0 ^= w3;
    [t0, w4, w2, w1]
}

#[inline(always)]
fn sbox_d0<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    w3 = !w3;
    let mut t0 = w2;
    w2 |= w1;
    t0 = !t0;
    w2 ^= w3;
    w3 |= t0;
    w2 ^= w4;
    w1 ^= t0;
    w3 ^= w1;
    w1 &= w4;
    t0 ^= w1;
    w1 |= w2;
    w1 ^= w3;
    w4 ^= t0;
    w3 ^= w2;
    w4 ^= w1;
    w4 ^= w2;
    w3 &= w4;
    t0 ^= w3;
    [w1, t0, w2, w4]
}

#[inline(always)]
fn sbox_d1<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    let mut t0 = w2;
    w2 ^= w4;
    w4 &= w2;
    t0 ^= w3;
    w4 ^= w1;
    w1 |= w2;
    w3 ^= w4;
    w1 ^= t0;
    w1 |= w3;
    w2 ^= w4;
    w1 ^= w2;
    w2 |= w4;
    w2 ^= w1;
    t0 = !t0;
    t0 ^= w2;
    w2 |= w1;
    w2 ^= w1;
    w2 |= t0;
    w4 ^= w2;
    [t0, w1, w4, w3]
}

#[inline(always)]
fn sbox_d2<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    w3 ^= w4;
    w4 ^= w1;
    let mut t0 = w4;
    w4 &= w3;
    w4 ^= w2;
    w2 |= w3;
    w2 ^= t0;
    t0 &= w4;
    w3 ^= w4;
    t0 &= w1;
    t0 ^= w3;
    w3 &= w2;
    w3 |= w1;
    w4 = !w4;
    w3 ^= w4;
    w1 ^= w4;
    w1 &= w2;
    w4 ^= t0;
    w4 ^= w1;
    [w2, t0, w3, w4]
}

#[inline(always)]
fn sbox_d3<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    let mut t0 = w3;
    w3 ^= w2;
    w1 ^= w3;
    t0 &= w3;
    t0 ^= w1;
    w1 &= w2;
    w2 ^= w4;
    w4 |= t0;
    w3 ^= w4;
    w1 ^= w4;
    w2 ^= t0;
    w4 &= w3;
    w4 ^= w2;
    w2 ^= w1;
    w2 |= w3;
    w1 ^= w4;
    w2 ^= t0;
    w1 ^= w2;
    [w3, w2, w4, w1]
}

#[inline(always)]
fn sbox_d4<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    let mut t0 = w3;
    w3 &= w4;
    w3 ^= w2;
    w2 |= w4;
    w2 &= w1;
    t0 ^= w3;
    t0 ^= w2;
    w2 &= w3;
    w1 = !w1;
    w4 ^= t0;
    w2 ^= w4;
    w4 &= w1;
    w4 ^= w3;
    w1 ^= w2;
    w3 &= w1;
    w4 ^= w1;
    w3 ^= t0;
    w3 |= w4;
    w4 ^= w1;
    w3 ^= w2;
    [w1, w4, w3, t0]
}

#[inline(always)]
fn sbox_d5<W: Word>([w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    w2 = !w2;
    let mut t0 = w4;
    w3 ^= w2;
    w4 |= w1;
    w4 ^= w3;
    w3 |= w2;
    w3 &= w1;
    t0 ^= w4;
    w3 ^= t0;
    t0 |= w1;
    t0 ^= w2;
    w2 &= w3;
    w2 ^= w4;
    t0 ^= w3;
    w4 &= t0;
    t0 ^= w2;
    w4 ^= t0;
    t0 = !t0;
    w4 ^= w1;
    [w2, t0, w4, w3]
}

#[inline(always)]
fn sbox_d6<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    w1 ^= w3;
    let mut t0 = w3;
    w3 &= w1;
    t0 ^= w4;
    w3 = !w3;
    w4 ^= w2;
    w3 ^= w4;
    t0 |= w1;
    w1 ^= w3;
    w4 ^= t0;
    t0 ^= w2;
    w2 &= w4;
    w2 ^= w1;
    w1 ^= w4;
    w1 |= w3;
    w4 ^= w2;
    t0 ^= w1;
    [w2, w3, t0, w4]
}

#[inline(always)]
fn sbox_d7<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    let mut t0 = w3;
    w3 ^= w1;
    w1 &= w4;
    t0 |= w4;
    w3 = !w3;
    w4 ^= w2;
    w2 |= w1;
    w1 ^= w3;
    w3 &= t0;
    w4 &= t0;
    w2 ^= w3;
    w3 ^= w1;
    w1 |= w3;
    t0 ^= w2;
    w1 ^= w4;
    w4 ^= t0;
    t0 |= w1;
    w4 ^= w3;
    t0 ^= w3;
    [w4, w1, w2, t0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use cipher::{array::Array, BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};
    use proptest::prelude::*;

    fn isas() -> Vec<Isa> {
        let mut v = vec![Isa::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            v.push(Isa::Sse2);
            if std::arch::is_x86_feature_detected!("avx2") {
                v.push(Isa::Avx2);
            }
            if Isa::detect() == Isa::Avx512 {
                v.push(Isa::Avx512);
            }
        }
        v
    }

    fn reference(key: &[u8], data: &[u8], encrypt: bool) -> Vec<u8> {
        let c = serpent::Serpent::new_from_slice(key).unwrap();
        let mut out = data.to_vec();
        let (blocks, _) = Array::slice_as_chunks_mut(&mut out);
        if encrypt {
            c.encrypt_blocks(blocks);
        } else {
            c.decrypt_blocks(blocks);
        }
        out
    }

    /// Fixed keys of each standard length and a length that leaves a partial group, through
    /// every instruction set this CPU has.
    #[test]
    fn every_isa_matches_the_reference_crate_on_fixed_vectors() {
        for isa in isas() {
            for key_len in [16, 24, 32] {
                let key: Vec<u8> = (0..key_len as u8).map(|i| i.wrapping_mul(37)).collect();
                let data: Vec<u8> = (0..16 * 37).map(|i| (i * 7 + 3) as u8).collect();
                let c = Serpent::with_isa(&key, isa).unwrap();
                let mut buf = data.clone();
                c.encrypt_blocks(&mut buf);
                assert_eq!(buf, reference(&key, &data, true), "{isa:?} {key_len}");
                c.decrypt_blocks(&mut buf);
                assert_eq!(buf, data, "{isa:?} {key_len}");
            }
        }
    }

    #[test]
    fn refuses_keys_outside_16_to_32_bytes() {
        assert!(Serpent::new(&[0; 15]).is_none());
        assert!(Serpent::new(&[0; 33]).is_none());
        assert!(Serpent::new(&[0; 20]).is_some());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn random_keys_and_lengths_match_the_reference_crate(
            key in proptest::collection::vec(any::<u8>(), 16..=32),
            blocks in 1usize..70,
            seed in any::<u64>(),
        ) {
            let mut x = seed | 1;
            let data: Vec<u8> = (0..16 * blocks).map(|_| {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17; x as u8
            }).collect();
            let enc = reference(&key, &data, true);
            let dec = reference(&key, &data, false);
            for isa in isas() {
                let c = Serpent::with_isa(&key, isa).unwrap();
                let mut buf = data.clone();
                c.encrypt_blocks(&mut buf);
                prop_assert_eq!(&buf, &enc);
                let mut buf = data.clone();
                c.decrypt_blocks(&mut buf);
                prop_assert_eq!(&buf, &dec);
            }
        }
    }
}
