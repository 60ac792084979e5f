//! HCTR2 (Crowley, Huckleberry, Biggers, "Length-preserving encryption with HCTR2",
//! <https://eprint.iacr.org/2021/1441>): the wide-block mode of the kernel's
//! `hctr2(aes)` (dm-crypt `aes-hctr2-plain64`, cryptsetup 2.7.3+), tweak = the 32-byte IV.
//!
//! Why written here: the only crate, `hctr2` 0.2, needs a nightly compiler (it enables
//! `#![feature(array_chunks, let_chains, ...)]`) and the older `cipher` 0.4 generation.
//! This file only composes maintained primitives: the block cipher from [`crate::block`]
//! (`aes`, VAES where the CPU has it) for E_K, D_K and the XCTR keystream (batches of
//! blocks), and RustCrypto's `polyval` (CLMUL) for the hash. Proven against the HCTR2
//! authors' reference vectors (`testdata/hctr2/`, every key size, tweak lengths 0..47,
//! messages 16..512 bytes, both directions; see the test).
//!
//! ```text
//! encrypt(T, P = M ‖ N), |M| = 16:          decrypt(T, C = U ‖ V):
//!   MM = M ⊕ H(T, N)                          UU = U ⊕ H(T, V)
//!   UU = E_K(MM)                              MM = D_K(UU)
//!   S  = MM ⊕ UU ⊕ L                          S  = MM ⊕ UU ⊕ L
//!   V  = N ⊕ XCTR_K(S)                        N  = V ⊕ XCTR_K(S)
//!   U  = UU ⊕ H(T, V)                         M  = MM ⊕ H(T, N)
//! h = E_K(le128(0)), L = E_K(le128(1)), XCTR_K(S)_i = E_K(S ⊕ le128(i)), i = 1, 2, ...
//! H(T, X) = POLYVAL_h(le128(2|T|·8 + 2 + [|X| mod 16 ≠ 0]) ‖ pad(T) ‖ pad(X ‖ [0x01 if |X| mod 16 ≠ 0]))
//! ```

use super::{xor_in_place, Mode};
use crate::block::{new_block_cipher, BlockCipher};
use crate::CryptoError;
use polyval::universal_hash::UniversalHash;
use polyval::Polyval;
use zeroize::Zeroize;

/// The tweak length dm-crypt gives HCTR2 (its IV size).
pub const TWEAK_BYTES: usize = 32;

/// XCTR keystream blocks computed per `encrypt_blocks` call.
const BATCH_BLOCKS: usize = 64;

/// The secrets derived from the key: POLYVAL keyed with h (nothing absorbed yet, cloned
/// per message; `polyval`'s `zeroize` feature wipes it on drop) and L.
struct Derived {
    hash: Polyval,
    l: [u8; 16],
}

impl Drop for Derived {
    fn drop(&mut self) {
        self.l.zeroize();
    }
}

/// HCTR2 over a 16-byte block cipher.
pub struct Hctr2 {
    /// The block cipher (its schedule locked in RAM by `crate::block`).
    cipher: Box<dyn BlockCipher>,
    /// Locked in RAM like the key schedules (`crate::secret`).
    derived: crate::secret::LockedBox<Derived>,
}

impl Hctr2 {
    /// Keys HCTR2 with the block cipher `cipher` (kernel name) and its key.
    ///
    /// # Errors
    /// The cipher's key-length error; [`CryptoError::Unsupported`] for a cipher whose
    /// block is not 16 bytes.
    pub fn new(cipher: &str, key: &[u8]) -> Result<Self, CryptoError> {
        let c = new_block_cipher(cipher, key).map_err(|e| match e {
            CryptoError::KeyLength { got, .. } => CryptoError::KeyLength {
                got,
                spec: format!("{cipher}-hctr2"),
                reason: format!(
                    "HCTR2 takes one {cipher} key of {} bytes",
                    crate::block::key_lengths(cipher)
                ),
            },
            other => other,
        })?;
        if c.block_size() != 16 {
            return Err(CryptoError::Unsupported(format!(
                "hctr2 over {cipher} (block size {})",
                c.block_size()
            )));
        }
        let mut hl = [0u8; 32];
        hl[16] = 1;
        c.encrypt_blocks(&mut hl);
        let hash = Polyval::new(&hl[..16].try_into().expect("16 bytes"));
        let mut l = [0u8; 16];
        l.copy_from_slice(&hl[16..]);
        hl.zeroize();
        let derived = crate::secret::LockedBox::new(Derived { hash, l });
        l.zeroize();
        Ok(Hctr2 { cipher: c, derived })
    }

    /// H(T, X) as above.
    fn hash(&self, tweak: &[u8], x: &[u8]) -> [u8; 16] {
        let mut p = self.derived.hash.clone();
        let partial = x.len() % 16 != 0;
        let first = (tweak.len() as u128) * 16 + 2 + u128::from(partial);
        p.update_padded(&first.to_le_bytes());
        p.update_padded(tweak);
        let whole = x.len() - x.len() % 16;
        p.update_padded(&x[..whole]);
        if partial {
            let mut last = [0u8; 16];
            let rest = &x[whole..];
            last[..rest.len()].copy_from_slice(rest);
            last[rest.len()] = 1;
            p.update_padded(&last);
        }
        p.finalize().into()
    }

    /// XORs XCTR_K(S) into `data`.
    fn xctr(&self, s: &[u8; 16], data: &mut [u8]) {
        let s = u128::from_le_bytes(*s);
        let mut ks = [0u8; BATCH_BLOCKS * 16];
        let mut i: u128 = 1;
        for chunk in data.chunks_mut(BATCH_BLOCKS * 16) {
            let blocks = chunk.len().div_ceil(16);
            for b in ks[..blocks * 16].chunks_exact_mut(16) {
                b.copy_from_slice(&(s ^ i).to_le_bytes());
                i += 1;
            }
            self.cipher.encrypt_blocks(&mut ks[..blocks * 16]);
            xor_in_place(chunk, &ks[..chunk.len()]);
        }
        ks.zeroize();
    }

    /// Encrypts `data` (at least 16 bytes) in place with `tweak`.
    ///
    /// # Panics
    /// If `data` is shorter than one block (a caller bug: sectors are 512 bytes or more).
    pub fn encrypt_with(&self, tweak: &[u8], data: &mut [u8]) {
        assert!(data.len() >= 16, "BUG: HCTR2 message shorter than a block");
        let (m, n) = data.split_at_mut(16);
        let mut mm = self.hash(tweak, n);
        xor_in_place(&mut mm, m);
        let mut uu = mm;
        self.cipher.encrypt_blocks(&mut uu);
        let mut s = mm;
        xor_in_place(&mut s, &uu);
        xor_in_place(&mut s, &self.derived.l);
        self.xctr(&s, n);
        let hv = self.hash(tweak, n);
        m.copy_from_slice(&uu);
        xor_in_place(m, &hv);
        mm.zeroize();
        s.zeroize();
    }

    /// Decrypts `data` (at least 16 bytes) in place with `tweak`.
    ///
    /// # Panics
    /// As [`Hctr2::encrypt_with`].
    pub fn decrypt_with(&self, tweak: &[u8], data: &mut [u8]) {
        assert!(data.len() >= 16, "BUG: HCTR2 message shorter than a block");
        let (u, v) = data.split_at_mut(16);
        let mut uu = self.hash(tweak, v);
        xor_in_place(&mut uu, u);
        let mut mm = uu;
        self.cipher.decrypt_blocks(&mut mm);
        let mut s = mm;
        xor_in_place(&mut s, &uu);
        xor_in_place(&mut s, &self.derived.l);
        self.xctr(&s, v);
        let hn = self.hash(tweak, v);
        u.copy_from_slice(&mm);
        xor_in_place(u, &hn);
        mm.zeroize();
        s.zeroize();
    }
}

impl Mode for Hctr2 {
    fn iv_size(&self) -> usize {
        TWEAK_BYTES
    }
    fn encrypt(&self, iv: &[u8], data: &mut [u8]) {
        self.encrypt_with(&iv[..TWEAK_BYTES], data);
    }
    fn decrypt(&self, iv: &[u8], data: &mut [u8]) {
        self.decrypt_with(&iv[..TWEAK_BYTES], data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference implementation's vectors (github.com/google/hctr2,
    /// `test_vectors/ours/HCTR2/HCTR2_AES{128,192,256}.json`, as shipped in the `hctr2`
    /// crate 0.2.0), reduced to `key tweak plaintext ciphertext` hex lines.
    #[test]
    fn reference_vectors_all_key_sizes_and_lengths() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../testdata/hctr2/hctr2_aes_reference_vectors.txt"
        );
        let text = std::fs::read_to_string(path).expect("testdata/hctr2 vectors");
        let mut n = 0;
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let f: Vec<Vec<u8>> = line
                .split(' ')
                .map(|h| hex::decode(h).expect("hex"))
                .collect();
            let (key, tweak, pt, ct) = (&f[0], &f[1], &f[2], &f[3]);
            let h = Hctr2::new("aes", key).unwrap();
            let mut d = pt.clone();
            h.encrypt_with(tweak, &mut d);
            assert_eq!(&d, ct, "encrypt, vector {n}");
            h.decrypt_with(tweak, &mut d);
            assert_eq!(&d, pt, "decrypt, vector {n}");
            n += 1;
        }
        assert_eq!(n, 700, "every reference vector was read");
    }

    /// dm-crypt's `aes-hctr2-plain64`: each sector alone, tweak = plain64 IV in 32 bytes
    /// (le64 of the IV sector, zeros), in 512- and 4096-byte sectors and with
    /// `iv_large_sectors`; the primitive itself is proven by the reference vectors above.
    #[test]
    fn dm_crypt_spec_uses_the_32_byte_plain64_iv_as_the_tweak() {
        use crate::{CipherSpec, Sector512, SectorParams, SectorSize, VolumeKey};
        let key: Vec<u8> = (0..32).map(|i| (i * 7 + 1) as u8).collect();
        let h = Hctr2::new("aes", &key).unwrap();
        for (ss, large) in [(512u32, false), (4096, false), (4096, true)] {
            let spec: CipherSpec = "aes-hctr2-plain64".parse().unwrap();
            let params = SectorParams {
                sector_size: SectorSize::new(ss).unwrap(),
                iv_offset: 8,
                iv_large_sectors: large,
            };
            let c = spec.build(&VolumeKey::new(key.clone()), params).unwrap();
            let plain: Vec<u8> = (0..3 * ss as usize).map(|i| (i * 13) as u8).collect();
            let mut got = plain.clone();
            c.encrypt(Sector512(16), &mut got);
            for (k, sector) in plain.chunks(ss as usize).enumerate() {
                let cc = 16 + 8 + k as u64 * u64::from(ss / 512);
                let n = if large { cc / u64::from(ss / 512) } else { cc };
                let mut tweak = [0u8; 32];
                tweak[..8].copy_from_slice(&n.to_le_bytes());
                let mut want = sector.to_vec();
                h.encrypt_with(&tweak, &mut want);
                assert!(
                    got[k * ss as usize..(k + 1) * ss as usize] == want[..],
                    "sector {k}, size {ss}"
                );
            }
            c.decrypt(Sector512(16), &mut got);
            assert!(got == plain);
        }
        let e = "aes-hctr2-plain64"
            .parse::<CipherSpec>()
            .unwrap()
            .build(&VolumeKey::new(vec![0; 20]), SectorParams::default())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("HCTR2 takes one aes key"), "{e}");
    }
}
