//! `tcw`: TrueCrypt (before 4.1) compatible CBC with whitening, as dm-crypt's `tcw` IV mode
//! (Linux 6.1 `drivers/md/dm-crypt.c`: `crypt_iv_tcw_gen`, `crypt_iv_tcw_post`,
//! `crypt_iv_tcw_whitening`). Compatibility only; do not use for new volumes (the scheme is
//! open to watermarking attacks).
//!
//! The table key is `cipher key ‖ IV seed (IV size) ‖ whitening (16 bytes)`. For 512-byte
//! sector `s` (dm-crypt's `iv_sector`):
//!
//! ```text
//! IV        = iv_seed ⊕ (le64(s) ‖ le64(s))                    (first IV-size bytes)
//! w         = whitening ⊕ (le64(s) ‖ le64(s))                   (16 bytes)
//! w[4i..]   = le32(crc32_le(0, w[4i..4i+4]))   for i = 0..4     (kernel "crc32": seed 0,
//!                                                               no inversion)
//! w[0..4]  ^= w[12..16];  w[4..8] ^= w[8..12]
//! write: C  = CBC_E(IV, P) ⊕ (w[0..8] repeated over the sector)
//! read:  P  = CBC_D(IV, C ⊕ (w[0..8] repeated))
//! ```
//!
//! dm-crypt accepts `tcw` only with 512-byte sectors, and only when the key is longer than
//! IV size + 16 bytes.

use crate::lane::Lane;
use crate::mode::cbc::Cbc;
use crate::mode::Mode;
use crate::CryptoError;
use zeroize::Zeroizing;

/// Length of the whitening key part that follows the IV seed in a `tcw` key.
pub const WHITENING_SIZE: usize = 16;

/// The only sector size `tcw` works with.
const SECTOR_BYTES: usize = 512;
/// The largest IV size (16-byte block ciphers).
const MAX_IV: usize = 16;

/// One subkey's TrueCrypt (`tcw`) lane: CBC with a seeded IV plus sector whitening.
pub struct Tcw {
    cbc: Cbc,
    /// dm-crypt's IV size for the cipher (block size, at least 8).
    iv_size: usize,
    /// The IV seed (first `iv_size` bytes used), zeroized on drop.
    iv_seed: Zeroizing<[u8; MAX_IV]>,
    /// The whitening seed, zeroized on drop.
    whitening: Zeroizing<[u8; WHITENING_SIZE]>,
}

impl Tcw {
    /// `cipher` is the block cipher name (run in CBC), `subkey` its key, `iv_seed` the IV
    /// seed (the cipher's IV size) and `whitening` the 16-byte whitening seed.
    ///
    /// # Errors
    /// Key errors of the cipher; an IV seed or whitening of the wrong length.
    pub fn new(
        cipher: &str,
        subkey: &[u8],
        iv_seed: &[u8],
        whitening: &[u8],
    ) -> Result<Self, CryptoError> {
        let cbc = Cbc::new(cipher, subkey)?;
        let iv_size = cbc.iv_size();
        if iv_size > MAX_IV || iv_seed.len() != iv_size || whitening.len() != WHITENING_SIZE {
            return Err(CryptoError::KeyLength {
                got: subkey.len() + iv_seed.len() + whitening.len(),
                spec: format!("{cipher}-cbc-tcw"),
                reason: format!(
                    "tcw needs the cipher key, a {iv_size}-byte IV seed and a \
                     {WHITENING_SIZE}-byte whitening (got {} and {})",
                    iv_seed.len(),
                    whitening.len()
                ),
            });
        }
        let mut seed = Zeroizing::new([0u8; MAX_IV]);
        seed[..iv_size].copy_from_slice(iv_seed);
        let mut white = Zeroizing::new([0u8; WHITENING_SIZE]);
        white.copy_from_slice(whitening);
        Ok(Tcw {
            cbc,
            iv_size,
            iv_seed: seed,
            whitening: white,
        })
    }

    /// `crypt_iv_tcw_gen`'s IV: the seed XOR le64(sector) in each 8-byte half.
    fn iv(&self, iv_sector: u64, iv: &mut [u8]) {
        let s = iv_sector.to_le_bytes();
        for (i, (out, seed)) in iv.iter_mut().zip(self.iv_seed.iter()).enumerate() {
            *out = seed ^ s[i % 8];
        }
    }

    /// `crypt_iv_tcw_whitening`: XORs the sector's 8-byte whitening into every 8 bytes.
    fn whiten(&self, iv_sector: u64, sector: &mut [u8]) {
        let s = iv_sector.to_le_bytes();
        let mut buf = Zeroizing::new([0u8; WHITENING_SIZE]);
        for (i, (out, w)) in buf.iter_mut().zip(self.whitening.iter()).enumerate() {
            *out = w ^ s[i % 8];
        }
        for word in buf.chunks_exact_mut(4) {
            let crc = kernel_crc32(word);
            word.copy_from_slice(&crc.to_le_bytes());
        }
        for i in 0..4 {
            buf[i] ^= buf[12 + i];
            buf[4 + i] ^= buf[8 + i];
        }
        let mut w = [0u8; 8];
        w.copy_from_slice(&buf[..8]);
        let w = Zeroizing::new(u64::from_ne_bytes(w));
        for chunk in sector.chunks_exact_mut(8) {
            let mut d = [0u8; 8];
            d.copy_from_slice(chunk);
            chunk.copy_from_slice(&(u64::from_ne_bytes(d) ^ *w).to_ne_bytes());
        }
    }
}

/// The kernel's `crc32` shash over `data`: `crc32_le(0, data)` (seed 0, no pre- or
/// post-inversion). `crc32fast` computes the standard CRC-32, which inverts the state on
/// entry and exit; starting it from `!0` and inverting the result cancels both.
fn kernel_crc32(data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(!0);
    h.update(data);
    !h.finalize()
}

impl Lane for Tcw {
    fn encrypt(&self, iv_first: u64, iv_step: u64, data: &mut [u8]) {
        let mut iv = Zeroizing::new([0u8; MAX_IV]);
        let iv = &mut iv[..self.iv_size];
        let mut n = iv_first;
        for sector in data.chunks_exact_mut(SECTOR_BYTES) {
            self.iv(n, iv);
            self.cbc.encrypt(iv, sector);
            self.whiten(n, sector);
            n = n.wrapping_add(iv_step);
        }
    }

    fn decrypt(&self, iv_first: u64, iv_step: u64, data: &mut [u8]) {
        let mut iv = Zeroizing::new([0u8; MAX_IV]);
        let iv = &mut iv[..self.iv_size];
        let mut n = iv_first;
        for sector in data.chunks_exact_mut(SECTOR_BYTES) {
            self.whiten(n, sector);
            self.iv(n, iv);
            self.cbc.decrypt(iv, sector);
            n = n.wrapping_add(iv_step);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legacy::lmk::golden;

    /// Bit-at-a-time reflected CRC-32 (poly 0xedb88320) with the kernel's conventions.
    fn crc32_le_reference(mut crc: u32, data: &[u8]) -> u32 {
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = (crc >> 1) ^ if crc & 1 != 0 { 0xedb8_8320 } else { 0 };
            }
        }
        crc
    }

    #[test]
    fn legacy_tcw_crc_is_kernel_crc32_le_seed_0() {
        assert_eq!(kernel_crc32(&[0; 4]), 0);
        for data in [
            [1u8, 2, 3, 4],
            [0xff; 4],
            [0x80, 0, 0, 0x7f],
            [0xde, 0xad, 0xbe, 0xef],
        ] {
            assert_eq!(
                kernel_crc32(&data),
                crc32_le_reference(0, &data),
                "{data:02x?}"
            );
        }
    }

    #[test]
    fn legacy_tcw_matches_kernel() {
        golden::check("aes-cbc-tcw-k256");
    }

    #[test]
    fn legacy_tcw_rejects_wrong_seed_lengths() {
        assert!(Tcw::new("aes", &[0; 32], &[0; 8], &[0; 16]).is_err());
        assert!(Tcw::new("aes", &[0; 32], &[0; 16], &[0; 15]).is_err());
        assert!(Tcw::new("aes", &[0; 32], &[0; 16], &[0; 16]).is_ok());
        // 8-byte block ciphers take an 8-byte IV seed.
        assert!(Tcw::new("blowfish", &[0; 16], &[0; 8], &[0; 16]).is_ok());
    }
}
