//! Adiantum (`xchacha12,aes-adiantum` and `xchacha20,aes-adiantum`): the whole sector is one
//! wide block; the 32-byte IV is the tweak.
//!
//! The construction (Crowley and Biggers, "Adiantum: length-preserving encryption for
//! entry-level processors", 2018; the kernel's `crypto/adiantum.c`) is written out here over
//! maintained primitives: XChaCha12/20 from `chacha20` (its AVX2 code, picked at run
//! time), AES-256 from `aes`. Written by hand, each for a measured reason given at its
//! definition: NH (the hash that reads every byte of the sector twice) in AVX2, since the
//! `adiantum` 0.2 crate computes it one 32-bit multiply at a time ("TODO: use SIMD");
//! Poly1305 for the short inputs ([`poly`]); and the ChaCha rounds over 16 blocks in
//! AVX-512 lanes (`chacha_x16`). The crate stays as the reference: the differential tests below
//! compare every sector length and random keys against it, and the kernel golden vectors
//! (`testdata/golden`, xchacha12,aes-adiantum-plain64) cover the dm-crypt level.

// The one unsafe use: the AVX2 NH (intrinsics), entered after run-time detection.
#![allow(unsafe_code)]

use super::Mode;
use crate::CryptoError;
use cipher::StreamCipher;
use cipher::{array::Array, BlockCipherDecrypt, BlockCipherEncrypt, KeyInit, KeyIvInit};
use zeroize::Zeroize;

/// The largest sector Adiantum handles here (the kernel's maximum dm-crypt sector size).
pub const MAX_SECTOR_BYTES: usize = 4096;

/// NH's message chunk (bytes) and key length: 1024 bytes of message, plus 48 bytes for
/// the four passes' offsets (stride 16 bytes, 4 passes).
const NH_CHUNK: usize = 1024;
const NH_KEY_BYTES: usize = NH_CHUNK + 48;

/// Which stream cipher: XChaCha12 or XChaCha20.
#[derive(Clone, Copy)]
enum Stream {
    X12,
    X20,
}

impl Stream {
    /// XORs the keystream of `key` with the 24-byte `nonce` into `data`: through
    /// [`chacha_x16`] with AVX-512 (`wide`), else through the `chacha20` crate.
    fn apply(self, key: &[u8; 32], nonce: &[u8; 24], data: &mut [u8], wide: bool) {
        let (k, n) = (Array::from(*key), Array::from(*nonce));
        #[cfg(target_arch = "x86_64")]
        if wide {
            let mut head = [0u8; 16];
            head.copy_from_slice(&nonce[..16]);
            let head = Array::from(head);
            let (mut subkey, double_rounds) = match self {
                Stream::X12 => (chacha20::hchacha::<chacha20::R12>(&k, &head), 6),
                Stream::X20 => (chacha20::hchacha::<chacha20::R20>(&k, &head), 10),
            };
            let mut words = [0u32; 8];
            for (w, b) in words.iter_mut().zip(subkey.chunks_exact(4)) {
                *w = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
            let le = |i: usize| u32::from_le_bytes([n[i], n[i + 1], n[i + 2], n[i + 3]]);
            // SAFETY: `wide` is true only when the CPU reports AVX-512F (avx512_available).
            unsafe { chacha_x16::xor(&words, [0, le(16), le(20)], double_rounds, data) };
            words.zeroize();
            subkey.zeroize();
            return;
        }
        let _ = wide;
        match self {
            Stream::X12 => chacha20::XChaCha12::new(&k, &n).apply_keystream(data),
            Stream::X20 => chacha20::XChaCha20::new(&k, &n).apply_keystream(data),
        }
    }
}

/// ChaCha over 16 blocks at a time in AVX-512 lanes (lane `b` = block `b`, counter + b).
///
/// Written here because `chacha20` 0.10 enables its AVX-512 backend only under
/// `--cfg chacha20_avx512` for the whole build, and its AVX2 backend left XChaCha12 the
/// largest cost of an Adiantum sector (1.6 GB/s in a probe). The subkey comes from the
/// crate's `hchacha`; the differential tests below compare the keystream with the crate's
/// `XChaCha12`/`XChaCha20` for random keys, nonces and lengths.
#[cfg(target_arch = "x86_64")]
mod chacha_x16 {
    use core::arch::x86_64::*;
    use zeroize::Zeroize;

    const CONSTANTS: [u32; 4] = [0x6170_7865, 0x3320_646e, 0x7962_2d32, 0x6b20_6574];

    /// XORs the IETF ChaCha keystream (block counter from 0, `nonce` words 13..16) with
    /// `double_rounds` double rounds into `data`.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn xor(
        key: &[u32; 8],
        nonce: [u32; 3],
        double_rounds: usize,
        data: &mut [u8],
    ) {
        let mut ks = [[0u32; 16]; 16];
        for (g, chunk) in data.chunks_mut(1024).enumerate() {
            let splat = |w: u32| _mm512_set1_epi32(w as i32);
            let base = (16 * g) as i32;
            let counters = _mm512_add_epi32(
                _mm512_set1_epi32(base),
                _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            );
            let init: [__m512i; 16] = [
                splat(CONSTANTS[0]),
                splat(CONSTANTS[1]),
                splat(CONSTANTS[2]),
                splat(CONSTANTS[3]),
                splat(key[0]),
                splat(key[1]),
                splat(key[2]),
                splat(key[3]),
                splat(key[4]),
                splat(key[5]),
                splat(key[6]),
                splat(key[7]),
                counters,
                splat(nonce[0]),
                splat(nonce[1]),
                splat(nonce[2]),
            ];
            let mut x = init;
            macro_rules! qr {
                ($a:expr, $b:expr, $c:expr, $d:expr) => {
                    x[$a] = _mm512_add_epi32(x[$a], x[$b]);
                    x[$d] = _mm512_rol_epi32::<16>(_mm512_xor_si512(x[$d], x[$a]));
                    x[$c] = _mm512_add_epi32(x[$c], x[$d]);
                    x[$b] = _mm512_rol_epi32::<12>(_mm512_xor_si512(x[$b], x[$c]));
                    x[$a] = _mm512_add_epi32(x[$a], x[$b]);
                    x[$d] = _mm512_rol_epi32::<8>(_mm512_xor_si512(x[$d], x[$a]));
                    x[$c] = _mm512_add_epi32(x[$c], x[$d]);
                    x[$b] = _mm512_rol_epi32::<7>(_mm512_xor_si512(x[$b], x[$c]));
                };
            }
            for _ in 0..double_rounds {
                qr!(0, 4, 8, 12);
                qr!(1, 5, 9, 13);
                qr!(2, 6, 10, 14);
                qr!(3, 7, 11, 15);
                qr!(0, 5, 10, 15);
                qr!(1, 6, 11, 12);
                qr!(2, 7, 8, 13);
                qr!(3, 4, 9, 14);
            }
            for (j, row) in ks.iter_mut().enumerate() {
                let v = _mm512_add_epi32(x[j], init[j]);
                // SAFETY: `row` is 16 writable words; unaligned store.
                unsafe { _mm512_storeu_si512(row.as_mut_ptr().cast(), v) };
            }
            // Block b of the group is word j of lane b, for j = 0..16.
            for (b, block) in chunk.chunks_mut(64).enumerate() {
                if block.len() == 64 {
                    let mut words = [0u32; 16];
                    for (j, w) in words.iter_mut().enumerate() {
                        *w = ks[j][b];
                    }
                    // SAFETY: `words` is 64 readable bytes and `block` 64 readable and
                    // writable bytes; unaligned loads and store.
                    unsafe {
                        let k = _mm512_loadu_si512(words.as_ptr().cast());
                        let d = _mm512_loadu_si512(block.as_ptr().cast());
                        _mm512_storeu_si512(block.as_mut_ptr().cast(), _mm512_xor_si512(d, k));
                    }
                    continue;
                }
                for (j, bytes) in block.chunks_mut(4).enumerate() {
                    let k = ks[j][b].to_le_bytes();
                    for (d, k) in bytes.iter_mut().zip(k) {
                        *d ^= k;
                    }
                }
            }
        }
        ks.as_flattened_mut().zeroize();
    }
}

/// Adiantum keyed with a 32-byte key.
pub struct Adiantum {
    stream: Stream,
    key: [u8; 32],
    block: aes::Aes256,
    /// Poly1305 keys (r only, s = 0) of the tweak hash and of the NH outputs.
    poly_t: [u8; 32],
    poly_m: [u8; 32],
    nh_key: Box<[u32; NH_KEY_BYTES / 4]>,
    avx2: bool,
    /// Whether the stream runs through [`chacha_x16`] (AVX-512F).
    avx512: bool,
}

impl Drop for Adiantum {
    fn drop(&mut self) {
        self.key.zeroize();
        self.poly_t.zeroize();
        self.poly_m.zeroize();
        self.nh_key.zeroize();
    }
}

impl Adiantum {
    /// `cipher` is the kernel's `xchacha12,aes` or `xchacha20,aes`.
    ///
    /// # Errors
    /// [`CryptoError::Unknown`] for another cipher pair, [`CryptoError::KeyLength`] unless
    /// the key is 32 bytes.
    pub fn new(cipher: &str, key: &[u8]) -> Result<Self, CryptoError> {
        let stream = match cipher {
            "xchacha12,aes" => Stream::X12,
            "xchacha20,aes" => Stream::X20,
            other => {
                return Err(CryptoError::Unknown {
                    what: "Adiantum cipher pair",
                    name: other.to_string(),
                    expected: "xchacha12,aes, xchacha20,aes",
                })
            }
        };
        let key: [u8; 32] = key.try_into().map_err(|_| CryptoError::KeyLength {
            got: key.len(),
            spec: format!("{cipher}-adiantum"),
            reason: "Adiantum takes a 32-byte key".into(),
        })?;
        // The sub-keys are the keystream under nonce 1 ‖ 0…: AES key, K_T, K_M, K_N.
        let mut nonce = [0u8; 24];
        nonce[0] = 1;
        let mut derived = [0u8; 32 + 16 + 16 + NH_KEY_BYTES];
        stream.apply(&key, &nonce, &mut derived, false);
        let mut aes_key = [0u8; 32];
        aes_key.copy_from_slice(&derived[..32]);
        let block = aes::Aes256::new(&Array::from(aes_key));
        aes_key.zeroize();
        let (mut poly_t, mut poly_m) = ([0u8; 32], [0u8; 32]);
        poly_t[..16].copy_from_slice(&derived[32..48]);
        poly_m[..16].copy_from_slice(&derived[48..64]);
        let mut nh_key = Box::new([0u32; NH_KEY_BYTES / 4]);
        for (w, b) in nh_key.iter_mut().zip(derived[64..].chunks_exact(4)) {
            *w = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        derived.zeroize();
        Ok(Adiantum {
            stream,
            key,
            block,
            poly_t,
            poly_m,
            nh_key,
            avx2: avx2_available(),
            avx512: avx512_available(),
        })
    }

    /// H(T, L) = Poly1305_{K_T}(le128(8·|L|) ‖ T) + Poly1305_{K_M}(NH(L) ‖ …) mod 2^128.
    fn hash(&self, tweak: &[u8], msg: &[u8]) -> u128 {
        let mut t_buf = [0u8; 16 + 32];
        let tlen = tweak.len().min(32);
        t_buf[..16].copy_from_slice(&(8 * msg.len() as u128).to_le_bytes());
        t_buf[16..16 + tlen].copy_from_slice(&tweak[..tlen]);
        let t = poly::tag(&self.poly_t, &t_buf[..16 + tlen]);
        // At most four NH outputs of 32 bytes (4096-byte sectors).
        let mut m_buf = [0u8; 32 * (MAX_SECTOR_BYTES / NH_CHUNK)];
        let mut n = 0;
        for chunk in msg.chunks(NH_CHUNK) {
            let out = self.nh(chunk);
            for (dst, v) in m_buf[32 * n..32 * n + 32].chunks_exact_mut(8).zip(out) {
                dst.copy_from_slice(&v.to_le_bytes());
            }
            n += 1;
        }
        let m = poly::tag(&self.poly_m, &m_buf[..32 * n]);
        t.wrapping_add(m)
    }

    fn nh(&self, chunk: &[u8]) -> [u64; 4] {
        #[cfg(target_arch = "x86_64")]
        if self.avx512 {
            // SAFETY: `avx512` is true only when the CPU reports AVX-512F (avx512_available).
            return unsafe { nh_avx512(&self.nh_key, chunk) };
        }
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            // SAFETY: `avx2` is true only when the CPU reports AVX2 (avx2_available).
            return unsafe { nh_avx2(&self.nh_key, chunk) };
        }
        nh_portable(&self.nh_key, chunk)
    }

    fn check(data: &[u8]) {
        assert!(
            (16..=MAX_SECTOR_BYTES).contains(&data.len()) && data.len() % 16 == 0,
            "BUG: Adiantum sector of {} bytes",
            data.len()
        );
    }
}

fn avx512_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn avx2_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// NH over one chunk of at most 1024 bytes (a multiple of 16): four passes, pass `p`
/// using the key from word `4p` on, each 16-byte message block `i` adding
/// `(m0+k0)(m2+k2) + (m1+k1)(m3+k3)` with the key words from `4i` (all additions mod 2^32,
/// products and sums mod 2^64).
fn nh_portable(key: &[u32; NH_KEY_BYTES / 4], chunk: &[u8]) -> [u64; 4] {
    let mut o = [0u64; 4];
    for (i, b) in chunk.chunks_exact(16).enumerate() {
        let m: [u32; 4] = core::array::from_fn(|j| {
            u32::from_le_bytes([b[4 * j], b[4 * j + 1], b[4 * j + 2], b[4 * j + 3]])
        });
        for (p, acc) in o.iter_mut().enumerate() {
            let k = &key[4 * i + 4 * p..];
            let a = |j: usize| u64::from(m[j].wrapping_add(k[j]));
            *acc = acc
                .wrapping_add(a(0).wrapping_mul(a(2)))
                .wrapping_add(a(1).wrapping_mul(a(3)));
        }
    }
    o
}

/// [`nh_portable`] with AVX2: one 16-byte message block broadcast to both 128-bit halves,
/// added to two passes' key words at once, and `vpmuludq` forming the four 64-bit products
/// (the kernel's `nh-avx2-x86_64.S` does the same).
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn nh_avx2(key: &[u32; NH_KEY_BYTES / 4], chunk: &[u8]) -> [u64; 4] {
    use core::arch::x86_64::*;
    assert!(chunk.len() <= NH_CHUNK && chunk.len() % 16 == 0);
    let mut acc01 = _mm256_setzero_si256();
    let mut acc23 = _mm256_setzero_si256();
    for (i, b) in chunk.chunks_exact(16).enumerate() {
        let k = &key[4 * i..4 * i + 16];
        // SAFETY: `b` is 16 readable bytes and `k` 16 readable words (the slice above is
        // bounds-checked: i < 64, so 4i + 16 <= 268, the key's length); the loads are the
        // unaligned kind.
        let (m, k01, k23) = unsafe {
            (
                _mm_loadu_si128(b.as_ptr().cast()),
                _mm256_loadu_si256(k.as_ptr().cast()),
                _mm256_loadu_si256(k[8..].as_ptr().cast()),
            )
        };
        let m = _mm256_broadcastsi128_si256(m);
        let t01 = _mm256_add_epi32(m, k01);
        let t23 = _mm256_add_epi32(m, k23);
        // Lanes (a0, a1) and (a2, a3) into the low halves of 64-bit lanes: a0·a2, a1·a3.
        let p01 = _mm256_mul_epu32(
            _mm256_shuffle_epi32::<0x50>(t01),
            _mm256_shuffle_epi32::<0xfa>(t01),
        );
        let p23 = _mm256_mul_epu32(
            _mm256_shuffle_epi32::<0x50>(t23),
            _mm256_shuffle_epi32::<0xfa>(t23),
        );
        acc01 = _mm256_add_epi64(acc01, p01);
        acc23 = _mm256_add_epi64(acc23, p23);
    }
    let (mut a, mut b) = ([0u64; 4], [0u64; 4]);
    // SAFETY: `a` and `b` are 32 writable bytes each; unaligned stores.
    unsafe {
        _mm256_storeu_si256(a.as_mut_ptr().cast(), acc01);
        _mm256_storeu_si256(b.as_mut_ptr().cast(), acc23);
    }
    [
        a[0].wrapping_add(a[1]),
        a[2].wrapping_add(a[3]),
        b[0].wrapping_add(b[1]),
        b[2].wrapping_add(b[3]),
    ]
}

/// [`nh_avx2`] with AVX-512: the message block broadcast to all four 128-bit lanes meets
/// all four passes' key words in one register.
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn nh_avx512(key: &[u32; NH_KEY_BYTES / 4], chunk: &[u8]) -> [u64; 4] {
    use core::arch::x86_64::*;
    assert!(chunk.len() <= NH_CHUNK && chunk.len() % 16 == 0);
    let mut acc = _mm512_setzero_si512();
    for (i, b) in chunk.chunks_exact(16).enumerate() {
        let k = &key[4 * i..4 * i + 16];
        // SAFETY: `b` is 16 readable bytes and `k` 16 readable words (the slice above is
        // bounds-checked: i < 64, so 4i + 16 <= 268, the key's length); the loads are the
        // unaligned kind.
        let (m, k) = unsafe {
            (
                _mm_loadu_si128(b.as_ptr().cast()),
                _mm512_loadu_si512(k.as_ptr().cast()),
            )
        };
        let t = _mm512_add_epi32(_mm512_broadcast_i32x4(m), k);
        let p = _mm512_mul_epu32(
            _mm512_shuffle_epi32::<0x50>(t),
            _mm512_shuffle_epi32::<0xfa>(t),
        );
        acc = _mm512_add_epi64(acc, p);
    }
    let mut a = [0u64; 8];
    // SAFETY: `a` is 64 writable bytes; unaligned store.
    unsafe { _mm512_storeu_si512(a.as_mut_ptr().cast(), acc) };
    [
        a[0].wrapping_add(a[1]),
        a[2].wrapping_add(a[3]),
        a[4].wrapping_add(a[5]),
        a[6].wrapping_add(a[7]),
    ]
}

impl Mode for Adiantum {
    fn iv_size(&self) -> usize {
        32
    }
    fn encrypt(&self, iv: &[u8], data: &mut [u8]) {
        Self::check(data);
        let (l, r) = data.split_at_mut(data.len() - 16);
        let mut pm = u128::from_le_bytes(r.try_into().unwrap_or_default());
        pm = pm.wrapping_add(self.hash(iv, l));
        let mut cm = Array::from(pm.to_le_bytes());
        self.block.encrypt_block(&mut cm);
        let mut nonce = [0u8; 24];
        nonce[..16].copy_from_slice(&cm);
        nonce[16] = 1;
        self.stream.apply(&self.key, &nonce, l, self.avx512);
        let cr = u128::from_le_bytes(cm.into()).wrapping_sub(self.hash(iv, l));
        r.copy_from_slice(&cr.to_le_bytes());
    }
    fn decrypt(&self, iv: &[u8], data: &mut [u8]) {
        Self::check(data);
        let (l, r) = data.split_at_mut(data.len() - 16);
        let cr = u128::from_le_bytes(r.try_into().unwrap_or_default());
        let cm = cr.wrapping_add(self.hash(iv, l)).to_le_bytes();
        let mut nonce = [0u8; 24];
        nonce[..16].copy_from_slice(&cm);
        nonce[16] = 1;
        self.stream.apply(&self.key, &nonce, l, self.avx512);
        let mut pm = Array::from(cm);
        self.block.decrypt_block(&mut pm);
        let pr = u128::from_le_bytes(pm.into()).wrapping_sub(self.hash(iv, l));
        r.copy_from_slice(&pr.to_le_bytes());
    }
}

/// Poly1305 for Adiantum's short inputs (48 and at most 128 bytes per hash), the 64-bit
/// "donna" form: three limbs of 44/44/42 bits, products in `u128`, no secret-dependent
/// branches or indices (the final reduction selects with a mask).
///
/// Written here because the `poly1305` crate's AVX2 backend, built for long messages,
/// spends about 1.4 µs setting up and finishing each tag (measured: 2.7 GB/s "per 4 KiB"
/// for a 128-byte input), which made the two Poly1305 calls per hash cost more than NH
/// and XChaCha12 together. The `poly1305` crate is the reference of the differential test
/// below, with the RFC 8439 §2.5.2 vector.
mod poly {
    const M44: u64 = (1 << 44) - 1;
    const M42: u64 = (1 << 42) - 1;

    fn le64(b: &[u8]) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[..8]);
        u64::from_le_bytes(w)
    }

    /// The Poly1305 tag of `msg` under the 32-byte key `r ‖ s`.
    pub(super) fn tag(key: &[u8; 32], msg: &[u8]) -> u128 {
        let (k0, k1) = (le64(&key[0..]), le64(&key[8..]));
        let r0 = k0 & 0xffc_0fff_ffff;
        let r1 = ((k0 >> 44) | (k1 << 20)) & 0xfff_ffc0_ffff;
        let r2 = (k1 >> 24) & 0x00f_ffff_fc0f;
        let (s1, s2) = (r1 * 20, r2 * 20);
        let (mut h0, mut h1, mut h2) = (0u64, 0u64, 0u64);
        let mul = |a: u64, b: u64| u128::from(a) * u128::from(b);
        for block in msg.chunks(16) {
            let mut m = [0u8; 16];
            m[..block.len()].copy_from_slice(block);
            let hibit = if block.len() == 16 {
                1u64 << 40
            } else {
                m[block.len()] = 1;
                0
            };
            let (t0, t1) = (le64(&m[0..]), le64(&m[8..]));
            h0 += t0 & M44;
            h1 += ((t0 >> 44) | (t1 << 20)) & M44;
            h2 += ((t1 >> 24) & M42) | hibit;
            let d0 = mul(h0, r0) + mul(h1, s2) + mul(h2, s1);
            let mut d1 = mul(h0, r1) + mul(h1, r0) + mul(h2, s2);
            let mut d2 = mul(h0, r2) + mul(h1, r1) + mul(h2, r0);
            h0 = d0 as u64 & M44;
            d1 += d0 >> 44;
            h1 = d1 as u64 & M44;
            d2 += d1 >> 44;
            h2 = d2 as u64 & M42;
            h0 += (d2 >> 42) as u64 * 5;
            h1 += h0 >> 44;
            h0 &= M44;
        }
        // Fully carry, then subtract p = 2^130 - 5 if h >= p (chosen by mask).
        let mut c = h1 >> 44;
        h1 &= M44;
        h2 += c;
        c = h2 >> 42;
        h2 &= M42;
        h0 += c * 5;
        c = h0 >> 44;
        h0 &= M44;
        h1 += c;
        c = h1 >> 44;
        h1 &= M44;
        h2 += c;
        c = h2 >> 42;
        h2 &= M42;
        h0 += c * 5;
        c = h0 >> 44;
        h0 &= M44;
        h1 += c;
        let mut g0 = h0 + 5;
        c = g0 >> 44;
        g0 &= M44;
        let mut g1 = h1 + c;
        c = g1 >> 44;
        g1 &= M44;
        let g2 = (h2 + c).wrapping_sub(1 << 42);
        // g2's top bit is set when h < p: keep h then.
        let keep_g = (g2 >> 63).wrapping_sub(1);
        h0 = (h0 & !keep_g) | (g0 & keep_g);
        h1 = (h1 & !keep_g) | (g1 & keep_g);
        h2 = (h2 & !keep_g) | (g2 & M42 & keep_g);
        let h = u128::from(h0) | (u128::from(h1) << 44) | (u128::from(h2) << 88);
        let s = u128::from_le_bytes(key[16..].try_into().unwrap_or_default());
        h.wrapping_add(s)
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use poly1305::universal_hash::KeyInit;
        use proptest::prelude::*;

        #[test]
        fn rfc_8439_vector() {
            let key: [u8; 32] =
                hex::decode("85d6be7857556d337f4452fe42d506a80103808afb0db2fd4abff6af4149f51b")
                    .unwrap()
                    .try_into()
                    .unwrap();
            let t = tag(&key, b"Cryptographic Forum Research Group");
            assert_eq!(
                hex::encode(t.to_le_bytes()),
                "a8061dc1305136c6c22b8baf0c0127a9"
            );
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]
            #[test]
            fn matches_the_poly1305_crate(
                key in proptest::array::uniform32(any::<u8>()),
                msg in proptest::collection::vec(any::<u8>(), 0..300),
            ) {
                let reference = poly1305::Poly1305::new(&key.into()).compute_unpadded(&msg);
                prop_assert_eq!(tag(&key, &msg), u128::from_le_bytes(reference.into()));
            }
        }

        /// Limbs at their largest: all-ones keys and messages.
        #[test]
        fn saturated_inputs_match_the_poly1305_crate() {
            for key in [[0xffu8; 32], [0u8; 32]] {
                for len in [0, 1, 15, 16, 17, 48, 128, 1000] {
                    let msg = vec![0xffu8; len];
                    let reference = poly1305::Poly1305::new(&key.into()).compute_unpadded(&msg);
                    assert_eq!(
                        tag(&key, &msg),
                        u128::from_le_bytes(reference.into()),
                        "{len}"
                    );
                }
            }
        }
    }
}

/// The `adiantum` crate's implementation of the same cipher: the reference of the tests
/// below and of `ucrypt benchmark`'s alternative column.
pub struct AdiantumCrate {
    inner: CrateInner,
}

enum CrateInner {
    X12(Box<adiantum::Cipher<chacha20::XChaCha12, aes::Aes256>>),
    X20(Box<adiantum::Cipher<chacha20::XChaCha20, aes::Aes256>>),
}

impl AdiantumCrate {
    /// `None` for another cipher pair or a key that is not 32 bytes.
    pub fn new(cipher: &str, key: &[u8]) -> Option<Self> {
        let inner = match cipher {
            "xchacha12,aes" => {
                CrateInner::X12(Box::new(adiantum::Cipher::new_from_slice(key).ok()?))
            }
            "xchacha20,aes" => {
                CrateInner::X20(Box::new(adiantum::Cipher::new_from_slice(key).ok()?))
            }
            _ => return None,
        };
        Some(AdiantumCrate { inner })
    }
}

impl Mode for AdiantumCrate {
    fn iv_size(&self) -> usize {
        32
    }
    fn encrypt(&self, iv: &[u8], data: &mut [u8]) {
        match &self.inner {
            CrateInner::X12(c) => c.encrypt(data, iv),
            CrateInner::X20(c) => c.encrypt(data, iv),
        }
    }
    fn decrypt(&self, iv: &[u8], data: &mut [u8]) {
        match &self.inner {
            CrateInner::X12(c) => c.decrypt(data, iv),
            CrateInner::X20(c) => c.decrypt(data, iv),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bytes(seed: u64, n: usize) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// Every sector length the mode takes (16..=4096 in steps of 16), both stream ciphers,
    /// portable and AVX2 NH, against the `adiantum` crate.
    #[test]
    fn every_length_matches_the_adiantum_crate() {
        for cipher in ["xchacha12,aes", "xchacha20,aes"] {
            let key = bytes(7, 32);
            let mut ours = Adiantum::new(cipher, &key).unwrap();
            let reference = AdiantumCrate::new(cipher, &key).unwrap();
            for (avx2, avx512) in [
                (false, false),
                (avx2_available(), false),
                (avx2_available(), avx512_available()),
            ] {
                ours.avx2 = avx2;
                ours.avx512 = avx512;
                for len in (16..=MAX_SECTOR_BYTES).step_by(16) {
                    let data = bytes(len as u64, len);
                    let iv = bytes(len as u64 + 1, 32);
                    let (mut a, mut b) = (data.clone(), data.clone());
                    ours.encrypt(&iv, &mut a);
                    reference.encrypt(&iv, &mut b);
                    assert_eq!(a, b, "{cipher} {len} avx2={avx2}");
                    ours.decrypt(&iv, &mut a);
                    assert_eq!(a, data, "{cipher} {len} avx2={avx2}");
                }
            }
        }
    }

    #[test]
    fn nh_simd_equals_portable() {
        if !avx2_available() {
            eprintln!("SKIP: no AVX2");
            return;
        }
        let key = Adiantum::new("xchacha12,aes", &[3; 32]).unwrap();
        let chunk = bytes(99, NH_CHUNK);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 checked above.
        let fast = unsafe { nh_avx2(&key.nh_key, &chunk) };
        #[cfg(not(target_arch = "x86_64"))]
        let fast = nh_portable(&key.nh_key, &chunk);
        assert_eq!(fast, nh_portable(&key.nh_key, &chunk));
        #[cfg(target_arch = "x86_64")]
        if avx512_available() {
            for len in [0, 16, 512, NH_CHUNK] {
                // SAFETY: AVX-512F checked above.
                let wide = unsafe { nh_avx512(&key.nh_key, &chunk[..len]) };
                assert_eq!(wide, nh_portable(&key.nh_key, &chunk[..len]), "{len}");
            }
        }
    }

    /// The AVX-512 keystream against the `chacha20` crate's XChaCha12/XChaCha20: random
    /// keys, nonces and lengths from 0 to past four 1 KiB groups.
    #[test]
    fn wide_keystream_matches_the_chacha20_crate() {
        if !avx512_available() {
            eprintln!("SKIP: no AVX-512F");
            return;
        }
        for (i, len) in [0usize, 1, 63, 64, 65, 1023, 1024, 1025, 4080, 4096, 5000]
            .into_iter()
            .enumerate()
        {
            for stream in [Stream::X12, Stream::X20] {
                let key: [u8; 32] = bytes(i as u64 + 11, 32).try_into().unwrap();
                let nonce: [u8; 24] = bytes(i as u64 + 12, 24).try_into().unwrap();
                let data = bytes(len as u64 + 13, len);
                let (mut a, mut b) = (data.clone(), data.clone());
                stream.apply(&key, &nonce, &mut a, true);
                stream.apply(&key, &nonce, &mut b, false);
                assert_eq!(a, b, "length {len}");
            }
        }
    }

    #[test]
    fn refuses_bad_keys_and_pairs() {
        assert!(Adiantum::new("xchacha12,aes", &[0; 31]).is_err());
        assert!(Adiantum::new("chacha12,aes", &[0; 32]).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn random_keys_tweaks_and_sectors_match_the_adiantum_crate(
            key in proptest::collection::vec(any::<u8>(), 32),
            iv in proptest::collection::vec(any::<u8>(), 32),
            blocks in 1usize..=256,
            seed in any::<u64>(),
        ) {
            let data = bytes(seed, 16 * blocks);
            let ours = Adiantum::new("xchacha12,aes", &key).unwrap();
            let reference = AdiantumCrate::new("xchacha12,aes", &key).unwrap();
            let (mut a, mut b) = (data.clone(), data.clone());
            ours.decrypt(&iv, &mut a);
            reference.decrypt(&iv, &mut b);
            prop_assert_eq!(&a, &b);
            ours.encrypt(&iv, &mut a);
            prop_assert_eq!(&a, &data);
        }
    }
}
