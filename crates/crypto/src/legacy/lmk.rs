//! `lmk`: loop-AES compatible CBC, as dm-crypt's `lmk` IV mode (Linux 6.1
//! `drivers/md/dm-crypt.c`: `crypt_iv_lmk_one`, `crypt_iv_lmk_gen`, `crypt_iv_lmk_post`).
//! Compatibility only; do not use for new volumes.
//!
//! The IV of a 512-byte sector is the raw MD5 *compression state* (no padding, no
//! finalisation) after hashing
//!
//! ```text
//! [seed[0..16] ‖ 0^48]          (version 3 only: one 64-byte block)
//! plaintext blocks 1..31        (bytes 16..512 of the sector)
//! le32(sector mod 2^32) ‖ le32(((sector >> 32) & 0xffffff) | 0x8000_0000) ‖ le32(4024) ‖ 0^4
//! ```
//!
//! i.e. 8 (or 9) whole MD5 blocks; the four state words, little-endian, give the IV. Writing
//! computes it from the plaintext and encrypts with CBC. Reading decrypts with a zero IV
//! (CBC blocks 1..31 do not depend on the IV), recomputes the IV over the decrypted blocks
//! 1..31 and XORs it into block 0.
//!
//! loop-AES "version 2" is 64 keys and no seed, "version 3" adds a 65th key part whose first
//! 16 bytes (the MD5 digest size: the kernel copies only that much into its 64-byte seed
//! buffer) are the seed. Which one is in use follows from the key length (see `spec.rs`).
//! dm-crypt accepts `lmk` only with 512-byte sectors.

use crate::lane::Lane;
use crate::mode::cbc::Cbc;
use crate::mode::Mode;
use crate::CryptoError;
use digest::common::hazmat::SerializableState;
use md5::block_api::{compress, Md5Core};
use zeroize::{Zeroize, Zeroizing};

/// The only sector size `lmk` works with.
const SECTOR_BYTES: usize = 512;
/// The MD5 digest size: how many seed bytes the kernel takes from the seed key part.
const SEED_USED: usize = 16;
/// MD5 block size.
const MD5_BLOCK: usize = 64;
/// The constant the kernel hashes after the sector number.
const LMK_TAIL_CONST: u32 = 4024;

/// One subkey's loop-AES (`lmk`) lane: CBC over 512-byte sectors with an MD5-derived IV.
pub struct Lmk {
    cbc: Cbc,
    /// dm-crypt's IV size for the cipher (block size, at least 8).
    iv_size: usize,
    /// MD5 state before the sector data: the MD5 initial state for version 2, the state after
    /// the seed block for version 3 (key-derived, zeroized on drop).
    start: Zeroizing<[u32; 4]>,
}

impl Lmk {
    /// `cipher` is the block cipher name (run in CBC), `subkey` this lane's key, `seed` the
    /// extra key part of loop-AES version 3 (`None` for version 2).
    ///
    /// # Errors
    /// Key errors of the cipher; a seed shorter than the 16 bytes the kernel reads.
    pub fn new(cipher: &str, subkey: &[u8], seed: Option<&[u8]>) -> Result<Self, CryptoError> {
        let cbc = Cbc::new(cipher, subkey)?;
        let iv_size = cbc.iv_size();
        if iv_size > SEED_USED {
            return Err(CryptoError::IvMode {
                iv: "lmk".into(),
                reason: format!("{cipher} needs a {iv_size}-byte IV, more than an MD5 state"),
            });
        }
        let mut start = Zeroizing::new(md5_initial_state());
        if let Some(seed) = seed {
            if seed.len() < SEED_USED {
                return Err(CryptoError::KeyLength {
                    got: seed.len(),
                    spec: "lmk seed".into(),
                    reason: format!("the lmk IV seed must be at least {SEED_USED} bytes"),
                });
            }
            let mut block = Zeroizing::new([0u8; MD5_BLOCK]);
            block[..SEED_USED].copy_from_slice(&seed[..SEED_USED]);
            compress(&mut start, core::slice::from_ref(&*block));
        }
        Ok(Lmk {
            cbc,
            iv_size,
            start,
        })
    }

    /// `crypt_iv_lmk_one`: the IV of sector `iv_sector` from its (plaintext) blocks 1..31.
    fn iv(&self, iv_sector: u64, sector: &[u8], iv: &mut [u8]) {
        let data = &sector[16..SECTOR_BYTES];
        let mut blocks = Zeroizing::new([[0u8; MD5_BLOCK]; 8]);
        let (full, last) = blocks.split_at_mut(7);
        for (block, chunk) in full.iter_mut().zip(data.chunks_exact(MD5_BLOCK)) {
            block.copy_from_slice(chunk);
        }
        let last = &mut last[0];
        last[..48].copy_from_slice(&data[7 * MD5_BLOCK..]);
        // The sector number is cropped to 56 bits, with the top bit of the word set.
        last[48..52].copy_from_slice(&(iv_sector as u32).to_le_bytes());
        let high = ((iv_sector >> 32) as u32 & 0x00ff_ffff) | 0x8000_0000;
        last[52..56].copy_from_slice(&high.to_le_bytes());
        last[56..60].copy_from_slice(&LMK_TAIL_CONST.to_le_bytes());
        last[60..64].fill(0);

        let mut state = *self.start;
        compress(&mut state, &blocks[..]);
        let mut out = [0u8; 16];
        for (chunk, word) in out.chunks_exact_mut(4).zip(state) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        iv.copy_from_slice(&out[..iv.len()]);
        state.zeroize();
        out.zeroize();
    }
}

/// MD5's initial chaining value, taken from the `md-5` crate (its serialized fresh state).
fn md5_initial_state() -> [u32; 4] {
    let serialized = Md5Core::default().serialize();
    let mut state = [0u32; 4];
    for (word, chunk) in state.iter_mut().zip(serialized.chunks_exact(4)) {
        let mut bytes = [0u8; 4];
        bytes.copy_from_slice(chunk);
        *word = u32::from_le_bytes(bytes);
    }
    state
}

impl Lane for Lmk {
    fn encrypt(&self, iv_first: u64, iv_step: u64, data: &mut [u8]) {
        let mut iv = Zeroizing::new([0u8; 16]);
        let iv = &mut iv[..self.iv_size];
        let mut n = iv_first;
        for sector in data.chunks_exact_mut(SECTOR_BYTES) {
            self.iv(n, sector, iv);
            self.cbc.encrypt(iv, sector);
            n = n.wrapping_add(iv_step);
        }
    }

    fn decrypt(&self, iv_first: u64, iv_step: u64, data: &mut [u8]) {
        let zero = [0u8; 16];
        let mut iv = Zeroizing::new([0u8; 16]);
        let iv = &mut iv[..self.iv_size];
        let mut n = iv_first;
        for sector in data.chunks_exact_mut(SECTOR_BYTES) {
            self.cbc.decrypt(&zero[..self.iv_size], sector);
            self.iv(n, sector, iv);
            for (b, k) in sector.iter_mut().zip(iv.iter()) {
                *b ^= k;
            }
            n = n.wrapping_add(iv_step);
        }
    }
}

/// Golden-vector helpers shared by the legacy ciphers' tests.
#[cfg(test)]
pub(crate) mod golden {
    use crate::testing::{check as check_all_splits, pattern_v1};
    use crate::{CipherSpec, Sector512, SectorCipher, SectorParams, VolumeKey};
    use std::io::Read;

    /// One `ok` case of `testdata/golden/manifest.jsonl` (default sector parameters).
    pub struct Case {
        pub cipher: String,
        pub key_hex: String,
        pub sectors: u64,
        pub ct: Vec<u8>,
    }

    fn dir() -> std::path::PathBuf {
        crate::testing::golden_dir().expect("the legacy-mode tests need the golden vectors")
    }

    /// Loads case `name` (panics if it is missing: the vectors are part of the acceptance).
    pub fn load(name: &str) -> Case {
        let manifest = std::fs::read_to_string(dir().join("manifest.jsonl")).expect("manifest");
        let entry: serde_json::Value = manifest
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("manifest line"))
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("golden case {name} not in manifest"));
        assert_eq!(entry["result"], "ok");
        assert_eq!(entry["iv_offset"], 0);
        assert_eq!(entry["opt_params"], "");
        let file = entry["ciphertext_file"].as_str().expect("ciphertext_file");
        let gz = std::fs::File::open(dir().join(file)).expect("ciphertext file");
        let mut ct = Vec::new();
        flate2::read::GzDecoder::new(gz)
            .read_to_end(&mut ct)
            .expect("gunzip");
        let sectors = entry["sectors"].as_u64().expect("sectors");
        assert_eq!(ct.len() as u64, sectors * 512);
        Case {
            cipher: entry["cipher"].as_str().expect("cipher").to_string(),
            key_hex: entry["key_hex"].as_str().expect("key_hex").to_string(),
            sectors,
            ct,
        }
    }

    /// pattern-v1 for `sectors` 512-byte sectors from sector 0.
    pub fn pattern(sectors: u64) -> Vec<u8> {
        pattern_v1(Sector512(0), sectors)
    }

    /// Builds the case's cipher with `params`.
    pub fn build(case: &Case, params: SectorParams) -> Box<dyn SectorCipher> {
        let spec: CipherSpec = case.cipher.parse().expect("spec");
        spec.build(&VolumeKey::from_hex(&case.key_hex).expect("key"), params)
            .expect("build")
    }

    /// Checks case `name` in both directions: the whole run in one call, one sector at a
    /// time, uneven chunks, and again from the middle of the run.
    pub fn check(name: &str) {
        let case = load(name);
        let c = build(&case, SectorParams::default());
        let pt = pattern(case.sectors);
        let mut failures = check_all_splits(&*c, Sector512(0), &pt, &case.ct);
        let mid = case.sectors / 2 + 1;
        let at = (mid * 512) as usize;
        failures.extend(check_all_splits(
            &*c,
            Sector512(mid),
            &pt[at..],
            &case.ct[at..],
        ));
        assert!(failures.is_empty(), "{name}:\n{}", failures.join("\n"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_lmk_v2_single_key_matches_kernel() {
        golden::check("aes-cbc-lmk-k256");
    }

    #[test]
    fn legacy_lmk_v3_64_keys_and_seed_matches_kernel() {
        golden::check("aes64-cbc-lmk-v3-k256x65");
    }

    #[test]
    fn legacy_lmk_md5_initial_state_is_rfc1321() {
        assert_eq!(
            md5_initial_state(),
            [0x6745_2301, 0xefcd_ab89, 0x98ba_dcfe, 0x1032_5476]
        );
    }

    #[test]
    fn legacy_lmk_v2_64_keys_roundtrip_and_high_sector_bits_matter() {
        // 64 keys without seed (v2): the held-out kernel case; check the mechanism at least.
        let key: Vec<u8> = (0..64 * 32).map(|i| (i * 7 + 3) as u8).collect();
        let spec: crate::CipherSpec = "aes:64-cbc-lmk".parse().unwrap();
        let c = spec
            .build(&crate::VolumeKey::new(key), crate::SectorParams::default())
            .unwrap();
        let pt = golden::pattern(130);
        let mut buf = pt.clone();
        c.encrypt(crate::Sector512(0), &mut buf);
        assert_ne!(buf, pt);
        c.decrypt(crate::Sector512(0), &mut buf);
        assert_eq!(buf, pt);

        // Bits 32..56 of the sector enter the IV, bits 56..64 do not.
        let lane = Lmk::new("aes", &[5; 32], None).unwrap();
        let enc = |n: u64| {
            let mut s = pt[..512].to_vec();
            lane.encrypt(n, 1, &mut s);
            s
        };
        assert_ne!(enc(1), enc(1 | 1 << 32));
        assert_eq!(enc(1), enc(1 | 1 << 56));
    }

    #[test]
    fn legacy_lmk_seed_uses_only_its_first_16_bytes() {
        let a = Lmk::new("aes", &[1; 32], Some(&[9; 32])).unwrap();
        let mut seed = [9u8; 32];
        seed[16..].fill(0xee);
        let b = Lmk::new("aes", &[1; 32], Some(&seed)).unwrap();
        let v2 = Lmk::new("aes", &[1; 32], None).unwrap();
        let mut x = golden::pattern(1);
        let mut y = x.clone();
        let mut z = x.clone();
        a.encrypt(7, 1, &mut x);
        b.encrypt(7, 1, &mut y);
        v2.encrypt(7, 1, &mut z);
        assert_eq!(x, y);
        assert_ne!(x, z);
    }
}
