//! `elephant`: BitLocker's "AES-CBC + Elephant diffuser", as dm-crypt's `elephant` IV mode
//! (Linux 6.1 `drivers/md/dm-crypt.c`: `crypt_iv_elephant`, `crypt_iv_elephant_gen`,
//! `crypt_iv_elephant_post`, `diffuser_a_encrypt`/`_decrypt`, `diffuser_b_encrypt`/`_decrypt`).
//! Compatibility only; do not use for new volumes.
//!
//! The table key is `data key ‖ Elephant key`, two halves of equal size; the Elephant key is
//! always an AES key (the kernel uses `ecb(aes)` for it whatever the data cipher). For a
//! sector of `sector_size` bytes with dm-crypt IV number `s`:
//!
//! ```text
//! e      = le64(s × sector_size) ‖ 0^8                      (16 bytes, wrapping multiply)
//! Ks     = AES_K(e) ‖ AES_K(e with byte 15 = 0x80)           (32-byte sector key)
//! write: P' = B_enc(A_enc(P ⊕ Ks repeated));  C = CBC_E(eboiv(s), P')
//! read:  P' = CBC_D(eboiv(s), C);  P = A_dec(B_dec(P')) ⊕ Ks repeated
//! ```
//!
//! The diffusers work on the sector as little-endian 32-bit words: A is 5 rounds with
//! rotations (9, 0, 13, 0) and taps at −2 and −5, B is 3 rounds with rotations (0, 10, 0, 25)
//! and taps at +2 and +5 (indices modulo the word count). The IV is `eboiv`'s, with the data
//! key: like `eboiv` and the sector key, it multiplies `s` by the sector size even without
//! `iv_large_sectors`.
//!
//! Multi-key tables (`aes:N-cbc-elephant`, never produced by BitLocker tools) are not exact:
//! the kernel splits only the first half of the key into the N data keys and computes the
//! eboiv IV with the first data key for every lane, while each lane here uses its own key.

use crate::block::{new_block_cipher, BlockCipher};
use crate::iv::eboiv::Eboiv;
use crate::iv::IvGenerator;
use crate::lane::Lane;
use crate::mode::cbc::Cbc;
use crate::mode::Mode;
use crate::{CryptoError, SectorSize};
use zeroize::Zeroizing;

/// The kernel's `ELEPHANT_MAX_KEY_SIZE`.
const MAX_KEY: usize = 32;
/// Length of the per-sector key XORed over the sector.
const SECTOR_KEY: usize = 32;
/// Diffuser A: rounds and the rotation for word index mod 4 (taps at −2 and −5).
const A_ROUNDS: usize = 5;
const A_ROT: [u32; 4] = [9, 0, 13, 0];
/// Diffuser B: rounds and the rotation for word index mod 4 (taps at +2 and +5).
const B_ROUNDS: usize = 3;
const B_ROT: [u32; 4] = [0, 10, 0, 25];

/// One subkey's BitLocker Elephant lane: sector key, diffusers A and B, then CBC with eboiv.
pub struct Elephant {
    cbc: Cbc,
    eboiv: Eboiv,
    /// AES keyed with the Elephant key; derives the per-sector key.
    sector_key_cipher: Box<dyn BlockCipher>,
    /// IV size of the data cipher (its block size).
    iv_size: usize,
    sector_bytes: usize,
}

impl Elephant {
    /// `cipher` is the data cipher name (run in CBC, also used for the eboiv IV) and
    /// `subkey` its key; `elephant_key` the AES key of the sector-key derivation (the
    /// second half of the table key); `sector_size` the encryption unit.
    ///
    /// # Errors
    /// Key errors of either cipher; a data cipher whose block size is not its IV size
    /// (dm-crypt's eboiv check: block size at least 8).
    pub fn new(
        cipher: &str,
        subkey: &[u8],
        elephant_key: &[u8],
        sector_size: SectorSize,
    ) -> Result<Self, CryptoError> {
        let cbc = Cbc::new(cipher, subkey)?;
        let iv_size = cbc.iv_size();
        if cbc.cipher().block_size() != iv_size || iv_size > 16 {
            return Err(CryptoError::IvMode {
                iv: "elephant".into(),
                reason: format!(
                    "the block size of {cipher} does not match its IV size ({iv_size} bytes)"
                ),
            });
        }
        if elephant_key.len() > MAX_KEY {
            return Err(CryptoError::KeyLength {
                got: elephant_key.len(),
                spec: "elephant key".into(),
                reason: format!("the Elephant key is at most {MAX_KEY} bytes"),
            });
        }
        let sector_key_cipher =
            new_block_cipher("aes", elephant_key).map_err(|_| CryptoError::KeyLength {
                got: elephant_key.len(),
                spec: "elephant key".into(),
                reason: "the Elephant key (second half of the key) must be an AES key of \
                         16, 24 or 32 bytes"
                    .into(),
            })?;
        let eboiv = Eboiv::new(cipher, subkey, sector_size.bytes())?;
        Ok(Elephant {
            cbc,
            eboiv,
            sector_key_cipher,
            iv_size,
            sector_bytes: sector_size.len(),
        })
    }

    /// The 32-byte sector key `E(e) ‖ E(e')` for IV number `iv_sector`.
    fn sector_key(&self, iv_sector: u64) -> Zeroizing<[u8; SECTOR_KEY]> {
        let mut ks = Zeroizing::new([0u8; SECTOR_KEY]);
        let offset = iv_sector
            .wrapping_mul(self.sector_bytes as u64)
            .to_le_bytes();
        let (lo, hi) = ks.split_at_mut(16);
        lo[..8].copy_from_slice(&offset);
        hi[..8].copy_from_slice(&offset);
        hi[15] = 0x80;
        self.sector_key_cipher.encrypt_blocks(&mut ks[..]);
        ks
    }

    fn xor_sector_key(ks: &[u8; SECTOR_KEY], sector: &mut [u8]) {
        for chunk in sector.chunks_exact_mut(SECTOR_KEY) {
            for (b, k) in chunk.iter_mut().zip(ks.iter()) {
                *b ^= k;
            }
        }
    }
}

fn load_words(sector: &[u8], words: &mut [u32]) {
    for (w, c) in words.iter_mut().zip(sector.chunks_exact(4)) {
        *w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

fn store_words(words: &[u32], sector: &mut [u8]) {
    for (w, c) in words.iter().zip(sector.chunks_exact_mut(4)) {
        c.copy_from_slice(&w.to_le_bytes());
    }
}

/// `diffuser_a_decrypt` (the read direction): forward pass, `d[i] += d[i−2] ⊕ rot(d[i−5])`.
fn diffuser_a_decrypt(d: &mut [u32]) {
    let mask = d.len() - 1;
    let n = d.len();
    for _ in 0..A_ROUNDS {
        for i in 0..n {
            let t = d[(i + n - 2) & mask] ^ d[(i + n - 5) & mask].rotate_left(A_ROT[i & 3]);
            d[i] = d[i].wrapping_add(t);
        }
    }
}

/// `diffuser_a_encrypt` (the write direction): the inverse of [`diffuser_a_decrypt`].
fn diffuser_a_encrypt(d: &mut [u32]) {
    let mask = d.len() - 1;
    let n = d.len();
    for _ in 0..A_ROUNDS {
        for i in (0..n).rev() {
            let t = d[(i + n - 2) & mask] ^ d[(i + n - 5) & mask].rotate_left(A_ROT[i & 3]);
            d[i] = d[i].wrapping_sub(t);
        }
    }
}

/// `diffuser_b_decrypt` (the read direction): forward pass, `d[i] += d[i+2] ⊕ rot(d[i+5])`.
fn diffuser_b_decrypt(d: &mut [u32]) {
    let mask = d.len() - 1;
    let n = d.len();
    for _ in 0..B_ROUNDS {
        for i in 0..n {
            let t = d[(i + 2) & mask] ^ d[(i + 5) & mask].rotate_left(B_ROT[i & 3]);
            d[i] = d[i].wrapping_add(t);
        }
    }
}

/// `diffuser_b_encrypt` (the write direction): the inverse of [`diffuser_b_decrypt`].
fn diffuser_b_encrypt(d: &mut [u32]) {
    let mask = d.len() - 1;
    let n = d.len();
    for _ in 0..B_ROUNDS {
        for i in (0..n).rev() {
            let t = d[(i + 2) & mask] ^ d[(i + 5) & mask].rotate_left(B_ROT[i & 3]);
            d[i] = d[i].wrapping_sub(t);
        }
    }
}

impl Lane for Elephant {
    fn encrypt(&self, iv_first: u64, iv_step: u64, data: &mut [u8]) {
        let mut words = Zeroizing::new(vec![0u32; self.sector_bytes / 4]);
        let mut iv = Zeroizing::new([0u8; 16]);
        let iv = &mut iv[..self.iv_size];
        let mut n = iv_first;
        for sector in data.chunks_exact_mut(self.sector_bytes) {
            Self::xor_sector_key(&self.sector_key(n), sector);
            load_words(sector, &mut words);
            diffuser_a_encrypt(&mut words);
            diffuser_b_encrypt(&mut words);
            store_words(&words, sector);
            self.eboiv.fill(n, iv);
            self.cbc.encrypt(iv, sector);
            n = n.wrapping_add(iv_step);
        }
    }

    fn decrypt(&self, iv_first: u64, iv_step: u64, data: &mut [u8]) {
        let mut words = Zeroizing::new(vec![0u32; self.sector_bytes / 4]);
        let mut iv = Zeroizing::new([0u8; 16]);
        let iv = &mut iv[..self.iv_size];
        let mut n = iv_first;
        for sector in data.chunks_exact_mut(self.sector_bytes) {
            self.eboiv.fill(n, iv);
            self.cbc.decrypt(iv, sector);
            load_words(sector, &mut words);
            diffuser_b_decrypt(&mut words);
            diffuser_a_decrypt(&mut words);
            store_words(&words, sector);
            Self::xor_sector_key(&self.sector_key(n), sector);
            n = n.wrapping_add(iv_step);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legacy::lmk::golden;
    use crate::{Sector512, SectorParams};

    /// The kernel's index walk of `diffuser_a_decrypt`, with explicit wrap checks, to pin the
    /// modular-index form used above.
    fn kernel_style_a_decrypt(d: &mut [u32]) {
        let n = d.len() as isize;
        for _ in 0..5 {
            let (mut i1, mut i2, mut i3) = (0isize, n - 2, n - 5);
            while i1 < n - 1 {
                d[i1 as usize] =
                    d[i1 as usize].wrapping_add(d[i2 as usize] ^ d[i3 as usize].rotate_left(9));
                i1 += 1;
                i2 += 1;
                i3 += 1;
                if i3 >= n {
                    i3 -= n;
                }
                d[i1 as usize] = d[i1 as usize].wrapping_add(d[i2 as usize] ^ d[i3 as usize]);
                i1 += 1;
                i2 += 1;
                i3 += 1;
                if i2 >= n {
                    i2 -= n;
                }
                d[i1 as usize] =
                    d[i1 as usize].wrapping_add(d[i2 as usize] ^ d[i3 as usize].rotate_left(13));
                i1 += 1;
                i2 += 1;
                i3 += 1;
                d[i1 as usize] = d[i1 as usize].wrapping_add(d[i2 as usize] ^ d[i3 as usize]);
                i1 += 1;
                i2 += 1;
                i3 += 1;
            }
        }
    }

    /// Likewise for `diffuser_b_decrypt`.
    fn kernel_style_b_decrypt(d: &mut [u32]) {
        let n = d.len() as isize;
        for _ in 0..3 {
            let (mut i1, mut i2, mut i3) = (0isize, 2isize, 5isize);
            while i1 < n - 1 {
                d[i1 as usize] = d[i1 as usize].wrapping_add(d[i2 as usize] ^ d[i3 as usize]);
                i1 += 1;
                i2 += 1;
                i3 += 1;
                d[i1 as usize] =
                    d[i1 as usize].wrapping_add(d[i2 as usize] ^ d[i3 as usize].rotate_left(10));
                i1 += 1;
                i2 += 1;
                i3 += 1;
                if i2 >= n {
                    i2 -= n;
                }
                d[i1 as usize] = d[i1 as usize].wrapping_add(d[i2 as usize] ^ d[i3 as usize]);
                i1 += 1;
                i2 += 1;
                i3 += 1;
                if i3 >= n {
                    i3 -= n;
                }
                d[i1 as usize] =
                    d[i1 as usize].wrapping_add(d[i2 as usize] ^ d[i3 as usize].rotate_left(25));
                i1 += 1;
                i2 += 1;
                i3 += 1;
            }
        }
    }

    #[test]
    fn legacy_elephant_diffusers_match_kernel_walk_and_invert() {
        for words in [128usize, 256, 512, 1024] {
            let orig: Vec<u32> = (0..words as u32)
                .map(|i| i.wrapping_mul(0x9e37_79b9) ^ 0x5a5a_0f0f)
                .collect();
            let (mut a, mut b) = (orig.clone(), orig.clone());
            diffuser_a_decrypt(&mut a);
            kernel_style_a_decrypt(&mut b);
            assert_eq!(a, b, "A, {words} words");
            diffuser_a_encrypt(&mut a);
            assert_eq!(a, orig);
            let mut c = orig.clone();
            diffuser_b_decrypt(&mut c);
            let mut d = orig.clone();
            kernel_style_b_decrypt(&mut d);
            assert_eq!(c, d, "B, {words} words");
            diffuser_b_encrypt(&mut c);
            assert_eq!(c, orig);
        }
    }

    #[test]
    fn legacy_elephant_aes256_matches_kernel() {
        golden::check("aes-cbc-elephant-k512");
    }

    #[test]
    fn legacy_elephant_aes128_matches_kernel() {
        golden::check("aes-cbc-elephant-k256");
    }

    fn roundtrip_4096(iv_large_sectors: bool) -> Vec<u8> {
        let case = golden::load("aes-cbc-elephant-k512");
        let params = SectorParams {
            sector_size: crate::SectorSize::new(4096).unwrap(),
            iv_offset: 0,
            iv_large_sectors,
        };
        let c = golden::build(&case, params);
        let pt = golden::pattern(64);
        let mut whole = pt.clone();
        c.encrypt(Sector512(0), &mut whole);
        assert_ne!(whole, pt);
        for (k, (p, e)) in pt.chunks(4096).zip(whole.chunks(4096)).enumerate() {
            let mut s = p.to_vec();
            c.encrypt(Sector512(8 * k as u64), &mut s);
            assert_eq!(
                s, e,
                "unit {k}: per-unit encryption differs from the whole run"
            );
            c.decrypt(Sector512(8 * k as u64), &mut s);
            assert_eq!(s, p);
        }
        let mut back = whole.clone();
        c.decrypt(Sector512(0), &mut back);
        assert_eq!(back, pt);
        whole
    }

    #[test]
    fn legacy_elephant_4096_sectors_roundtrip_with_and_without_iv_large_sectors() {
        let large = roundtrip_4096(true);
        let small = roundtrip_4096(false);
        // Unit 0 has IV number 0 either way; unit 1 is 1 (large) or 8 (512-byte numbering).
        assert_eq!(large[..4096], small[..4096]);
        assert_ne!(large[4096..8192], small[4096..8192]);
    }

    #[test]
    fn legacy_elephant_4096_with_iv_large_sectors_is_the_lane_at_unit_numbers() {
        // With iv_large_sectors unit k gets IV number k; the lane multiplies by 4096 for both
        // the sector key and eboiv (byte offset k × 4096).
        let case = golden::load("aes-cbc-elephant-k512");
        let key = hex::decode(&case.key_hex).unwrap();
        let ss = crate::SectorSize::new(4096).unwrap();
        let lane = Elephant::new("aes", &key[..32], &key[32..], ss).unwrap();
        let params = SectorParams {
            sector_size: ss,
            iv_offset: 0,
            iv_large_sectors: true,
        };
        let c = golden::build(&case, params);
        let pt = golden::pattern(32);
        let (mut via_lane, mut via_cipher) = (pt.clone(), pt.clone());
        lane.encrypt(0, 1, &mut via_lane);
        c.encrypt(Sector512(0), &mut via_cipher);
        assert_eq!(via_lane, via_cipher);
        // The sector key of unit 1 is E(le64(4096) ‖ 0) ‖ E(le64(4096) ‖ 0…0x80).
        let aes = new_block_cipher("aes", &key[32..]).unwrap();
        let mut expect = [0u8; 32];
        expect[..8].copy_from_slice(&4096u64.to_le_bytes());
        expect[16..24].copy_from_slice(&4096u64.to_le_bytes());
        expect[31] = 0x80;
        aes.encrypt_blocks(&mut expect);
        assert_eq!(*lane.sector_key(1), expect);
    }

    #[test]
    fn legacy_elephant_rejects_bad_elephant_keys() {
        let ss = crate::SectorSize::DEFAULT;
        assert!(Elephant::new("aes", &[0; 20], &[0; 20], ss).is_err());
        assert!(Elephant::new("aes", &[0; 32], &[0; 40], ss).is_err());
        assert!(Elephant::new("aes", &[0; 24], &[0; 24], ss).is_ok());
        // The Elephant key is always AES, whatever the data cipher.
        assert!(Elephant::new("serpent", &[0; 32], &[0; 32], ss).is_ok());
    }
}
