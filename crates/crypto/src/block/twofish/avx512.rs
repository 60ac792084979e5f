//! Twofish on 16 blocks at once with AVX-512: each 32-bit lane of a 512-bit register holds
//! one word of one block; two such groups run interleaved (32 blocks), because one group's
//! rounds are a dependency chain (1.29x measured with two). Written here because no crate has a SIMD Twofish (RustCrypto's
//! `twofish` is one block at a time) and the kernel's own x86 code is 8-way AVX assembly.
//!
//! The round function `g` is done the way the instruction set allows without table gathers
//! (slow on the machines measured):
//! - the four key-dependent S-boxes are byte permutations (256 entries each); `vpermi2b`
//!   (AVX-512 VBMI) looks 64 bytes up in a 128-entry table at once, so each S-box is two
//!   permutes (low and high half, chosen by the index's top bit), each masked to the byte
//!   position of its S-box in the lane;
//! - the MDS matrix multiplies by 0x01, 0x5B and 0xEF in GF(2^8) modulo 0x169. A product by
//!   a constant is GF(2)-linear, so GFNI's affine instruction (`vgf2p8affineqb`) computes it
//!   for 64 bytes with the constant's 8x8 bit matrix (its built-in multiply uses AES's
//!   polynomial, not Twofish's); masked moves pick each byte's product and byte rotations
//!   within the lane sum the four columns.
//!
//! Checked against RustCrypto's `twofish` by the differential test in the parent module
//! (vector and portable paths), and by the kernel golden vectors.

// The one unsafe use: unaligned loads and stores of 64 bytes inside `data` (bounds checked
// by `chunks_exact_mut`), in functions that run only after run-time CPU detection.
#![allow(unsafe_code)]

use core::arch::x86_64::*;

/// True when the CPU has every instruction set this module uses.
pub(super) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vbmi")
        && std::arch::is_x86_feature_detected!("gfni")
}

/// Bytes one call of the vector code handles; `data` is processed up to its last whole group.
pub(super) const GROUP: usize = 16 * 16;

const fn gf_mul_169(mut a: u8, mut b: u8) -> u8 {
    let mut r = 0;
    while a != 0 {
        if a & 1 != 0 {
            r ^= b;
        }
        a >>= 1;
        b = if b & 0x80 != 0 {
            (b << 1) ^ 0x69
        } else {
            b << 1
        };
    }
    r
}

/// The GF(2)-linear map `x -> c·x` (GF(2^8) modulo 0x169) as GFNI's 8x8 bit matrix: byte
/// `7 - i` of the qword is the row that gives output bit `i`, bit `j` of a row takes input
/// bit `j`.
const fn mul_matrix(c: u8) -> i64 {
    let mut m = 0u64;
    let mut j = 0;
    while j < 8 {
        let column = gf_mul_169(c, 1 << j);
        let mut i = 0;
        while i < 8 {
            if (column >> i) & 1 == 1 {
                m |= 1 << (8 * (7 - i) + j);
            }
            i += 1;
        }
        j += 1;
    }
    m as i64
}

/// Bytes at position `pos` of every 32-bit lane.
const fn position(pos: usize) -> u64 {
    0x1111_1111_1111_1111u64 << pos
}

/// For output offset `d`: the bytes whose MDS coefficient towards byte `(pos + d) % 4` is
/// `c` (so that byte `pos` of the product vector, rotated left by `d` bytes, lands on its
/// output byte).
const fn coefficient_mask(d: usize, c: u8) -> u64 {
    let mut m = 0;
    let mut pos = 0;
    while pos < 4 {
        if super::MDS_COLUMNS[pos][(pos + d) % 4] == c {
            m |= position(pos);
        }
        pos += 1;
    }
    m
}

const M5B: i64 = mul_matrix(0x5b);
const MEF: i64 = mul_matrix(0xef);
const K5B: [u64; 4] = [
    coefficient_mask(0, 0x5b),
    coefficient_mask(1, 0x5b),
    coefficient_mask(2, 0x5b),
    coefficient_mask(3, 0x5b),
];
const KEF: [u64; 4] = [
    coefficient_mask(0, 0xef),
    coefficient_mask(1, 0xef),
    coefficient_mask(2, 0xef),
    coefficient_mask(3, 0xef),
];

/// The four S-boxes, each as four 64-byte quarters.
type Sboxes = [[__m512i; 4]; 4];

#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
fn load_sboxes(sbox: &[[u8; 256]; 4]) -> Sboxes {
    std::array::from_fn(|s| {
        std::array::from_fn(|q| {
            // SAFETY: quarter `q` is 64 bytes inside the 256-byte S-box; an unaligned load.
            unsafe { _mm512_loadu_si512(sbox[s][64 * q..].as_ptr().cast()) }
        })
    })
}

/// Twofish's `g` on 16 words: S-boxes, then the MDS matrix.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
#[inline]
fn g(x: __m512i, s: &Sboxes) -> __m512i {
    let high = _mm512_movepi8_mask(x);
    let half = |h: usize| {
        let [a, b, c, d] = std::array::from_fn(|pos| {
            _mm512_maskz_permutex2var_epi8(position(pos), s[pos][2 * h], x, s[pos][2 * h + 1])
        });
        // a | b | c | d
        _mm512_or_si512(_mm512_ternarylogic_epi32::<0xfe>(a, b, c), d)
    };
    let y = _mm512_mask_blend_epi8(high, half(0), half(1));
    let p5b = _mm512_gf2p8affine_epi64_epi8::<0>(y, _mm512_set1_epi64(M5B));
    let pef = _mm512_gf2p8affine_epi64_epi8::<0>(y, _mm512_set1_epi64(MEF));
    let w = |d: usize| {
        let v = _mm512_mask_mov_epi8(y, K5B[d], p5b);
        _mm512_mask_mov_epi8(v, KEF[d], pef)
    };
    let (w0, w1) = (w(0), _mm512_rol_epi32::<8>(w(1)));
    let (w2, w3) = (_mm512_rol_epi32::<16>(w(2)), _mm512_rol_epi32::<24>(w(3)));
    // w0 ^ w1 ^ w2, then ^ w3
    _mm512_xor_si512(_mm512_ternarylogic_epi32::<0x96>(w0, w1, w2), w3)
}

/// Four registers of four blocks each, transposed so that register `w` holds word `w` of
/// all 16 blocks (in the order of the 4x4 transposes within 128-bit lanes: applying the same
/// transpose again restores the blocks).
#[target_feature(enable = "avx512f")]
#[inline]
fn transpose(r: [__m512i; 4]) -> [__m512i; 4] {
    let t0 = _mm512_unpacklo_epi32(r[0], r[1]);
    let t1 = _mm512_unpackhi_epi32(r[0], r[1]);
    let t2 = _mm512_unpacklo_epi32(r[2], r[3]);
    let t3 = _mm512_unpackhi_epi32(r[2], r[3]);
    [
        _mm512_unpacklo_epi64(t0, t2),
        _mm512_unpackhi_epi64(t0, t2),
        _mm512_unpacklo_epi64(t1, t3),
        _mm512_unpackhi_epi64(t1, t3),
    ]
}

#[target_feature(enable = "avx512f")]
#[inline]
fn load(group: &[u8]) -> [__m512i; 4] {
    assert_eq!(group.len(), GROUP, "BUG: a group is 16 blocks");
    transpose(std::array::from_fn(|i| {
        // SAFETY: a 64-byte load inside the 256-byte group (asserted above).
        unsafe { _mm512_loadu_si512(group[64 * i..].as_ptr().cast()) }
    }))
}

#[target_feature(enable = "avx512f")]
#[inline]
fn store(group: &mut [u8], words: [__m512i; 4]) {
    assert_eq!(group.len(), GROUP, "BUG: a group is 16 blocks");
    for (i, r) in transpose(words).into_iter().enumerate() {
        // SAFETY: a 64-byte store inside the 256-byte group (asserted above).
        unsafe { _mm512_storeu_si512(group[64 * i..].as_mut_ptr().cast(), r) }
    }
}

#[target_feature(enable = "avx512f")]
#[inline]
fn key(k: u32) -> __m512i {
    _mm512_set1_epi32(k as i32)
}

/// Encrypts `N` groups (`data` is `N * GROUP` bytes), their rounds interleaved: one group's
/// rounds are a chain of dependent S-box lookups and MDS products, so a second
/// independent chain gives the vector units work while the first waits.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
#[inline]
fn encrypt_groups<const N: usize>(k: &[u32; 40], s: &Sboxes, data: &mut [u8]) {
    let mut st: [[__m512i; 4]; N] =
        std::array::from_fn(|j| load(&data[j * GROUP..(j + 1) * GROUP]));
    for x in st.iter_mut() {
        for (w, kw) in x.iter_mut().zip(&k[0..4]) {
            *w = _mm512_xor_si512(*w, key(*kw));
        }
    }
    for r in 0..8 {
        let rk = &k[4 * r + 8..4 * r + 12];
        for [a, b, c, d] in st.iter_mut() {
            let t1 = g(_mm512_rol_epi32::<8>(*b), s);
            let t0 = _mm512_add_epi32(g(*a, s), t1);
            *c = _mm512_ror_epi32::<1>(_mm512_xor_si512(*c, _mm512_add_epi32(t0, key(rk[0]))));
            let f1 = _mm512_add_epi32(_mm512_add_epi32(t1, t0), key(rk[1]));
            *d = _mm512_xor_si512(_mm512_rol_epi32::<1>(*d), f1);
        }
        for [a, b, c, d] in st.iter_mut() {
            let t1 = g(_mm512_rol_epi32::<8>(*d), s);
            let t0 = _mm512_add_epi32(g(*c, s), t1);
            *a = _mm512_ror_epi32::<1>(_mm512_xor_si512(*a, _mm512_add_epi32(t0, key(rk[2]))));
            let f1 = _mm512_add_epi32(_mm512_add_epi32(t1, t0), key(rk[3]));
            *b = _mm512_xor_si512(_mm512_rol_epi32::<1>(*b), f1);
        }
    }
    for (j, [a, b, c, d]) in st.into_iter().enumerate() {
        store(
            &mut data[j * GROUP..(j + 1) * GROUP],
            [
                _mm512_xor_si512(c, key(k[4])),
                _mm512_xor_si512(d, key(k[5])),
                _mm512_xor_si512(a, key(k[6])),
                _mm512_xor_si512(b, key(k[7])),
            ],
        );
    }
}

/// Decrypts `N` groups, interleaved as [`encrypt_groups`].
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
#[inline]
fn decrypt_groups<const N: usize>(k: &[u32; 40], s: &Sboxes, data: &mut [u8]) {
    let mut st: [[__m512i; 4]; N] = std::array::from_fn(|j| {
        let [w0, w1, w2, w3] = load(&data[j * GROUP..(j + 1) * GROUP]);
        [
            _mm512_xor_si512(w2, key(k[6])),
            _mm512_xor_si512(w3, key(k[7])),
            _mm512_xor_si512(w0, key(k[4])),
            _mm512_xor_si512(w1, key(k[5])),
        ]
    });
    for r in (0..8).rev() {
        let rk = &k[4 * r + 8..4 * r + 12];
        for [a, b, c, d] in st.iter_mut() {
            let t1 = g(_mm512_rol_epi32::<8>(*d), s);
            let t0 = _mm512_add_epi32(g(*c, s), t1);
            *a = _mm512_xor_si512(_mm512_rol_epi32::<1>(*a), _mm512_add_epi32(t0, key(rk[2])));
            let f1 = _mm512_add_epi32(_mm512_add_epi32(t1, t0), key(rk[3]));
            *b = _mm512_ror_epi32::<1>(_mm512_xor_si512(*b, f1));
        }
        for [a, b, c, d] in st.iter_mut() {
            let t1 = g(_mm512_rol_epi32::<8>(*b), s);
            let t0 = _mm512_add_epi32(g(*a, s), t1);
            *c = _mm512_xor_si512(_mm512_rol_epi32::<1>(*c), _mm512_add_epi32(t0, key(rk[0])));
            let f1 = _mm512_add_epi32(_mm512_add_epi32(t1, t0), key(rk[1]));
            *d = _mm512_ror_epi32::<1>(_mm512_xor_si512(*d, f1));
        }
    }
    for (j, [a, b, c, d]) in st.into_iter().enumerate() {
        store(
            &mut data[j * GROUP..(j + 1) * GROUP],
            [
                _mm512_xor_si512(a, key(k[0])),
                _mm512_xor_si512(b, key(k[1])),
                _mm512_xor_si512(c, key(k[2])),
                _mm512_xor_si512(d, key(k[3])),
            ],
        );
    }
}

/// Encrypts every whole group of 16 blocks of `data`, two groups at a time; returns the
/// bytes done.
///
/// # Safety
/// The CPU must have the features [`available`] checks.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
pub(super) unsafe fn encrypt(k: &[u32; 40], sbox: &[[u8; 256]; 4], data: &mut [u8]) -> usize {
    let s = load_sboxes(sbox);
    let mut pairs = data.chunks_exact_mut(2 * GROUP);
    for pair in &mut pairs {
        encrypt_groups::<2>(k, &s, pair);
    }
    let rest = pairs.into_remainder();
    let single = rest.len() / GROUP * GROUP;
    if single > 0 {
        encrypt_groups::<1>(k, &s, &mut rest[..single]);
    }
    data.len() / GROUP * GROUP
}

/// Decrypts every whole group of 16 blocks of `data`, two groups at a time; returns the
/// bytes done.
///
/// # Safety
/// The CPU must have the features [`available`] checks.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
pub(super) unsafe fn decrypt(k: &[u32; 40], sbox: &[[u8; 256]; 4], data: &mut [u8]) -> usize {
    let s = load_sboxes(sbox);
    let mut pairs = data.chunks_exact_mut(2 * GROUP);
    for pair in &mut pairs {
        decrypt_groups::<2>(k, &s, pair);
    }
    let rest = pairs.into_remainder();
    let single = rest.len() / GROUP * GROUP;
    if single > 0 {
        decrypt_groups::<1>(k, &s, &mut rest[..single]);
    }
    data.len() / GROUP * GROUP
}
