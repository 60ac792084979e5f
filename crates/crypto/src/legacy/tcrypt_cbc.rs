//! TrueCrypt's legacy CBC modes (TrueCrypt before 4.1, read by TrueCrypt up to 7.1a) beyond
//! what dm-crypt's `tcw` covers: cascades ("outer-CBC", cryptsetup's `cbci-tcrypt`) and
//! TrueCrypt's little-endian Blowfish (`cbc-tcrypt`). Compatibility only, read-mostly old
//! volumes; never for new ones (the scheme is open to watermarking attacks).
//!
//! Facts from TrueCrypt 5's `Volume/EncryptionModeCBC.cpp` (`EncryptSectorsCurrentThread`,
//! `InitSectorIVAndWhitening`, `IsOuterCBC`) and cryptsetup's `lib/tcrypt/tcrypt.c`
//! (`TCRYPT_decrypt_cbci`, `decrypt_blowfish_le_cbc`, the key offsets of its cipher table).
//! For 512-byte sector `s` and the 32-byte IV seed `K` that precedes the cipher keys:
//!
//! ```text
//! per cipher group G (block size b):
//!   IV        = K[0..b]            ⊕ le64(s) in every 8 bytes
//!   whitening = crc32 mix of K[b..b+16] ⊕ le64(s)      (exactly dm-crypt's tcw, see tcw.rs)
//!   C         = CBC_E over G (IV, P) ⊕ whitening (every 8 bytes)
//! outer-CBC (every cipher of the chain has the same block size; cryptsetup "cbci-tcrypt"):
//!   one group: each block goes through cipher 1, 2, 3 before the chaining XOR
//! inner-CBC (block sizes differ: the Blowfish chains; cryptsetup "cbc-tcrypt"):
//!   one group per cipher, cipher 1 first (innermost), the same seed K for each
//! ```
//!
//! So outer-CBC is `tcw` over one composite block cipher, [`Cascade`](crate::block::cascade::Cascade) (named
//! `serpent+twofish+aes`, first cipher applied first), and inner-CBC is a stack of plain `tcw`
//! layers, one per cipher, each keyed with its cipher key followed by the same seed bytes.
//! TrueCrypt's Blowfish reads and writes the two 32-bit halves of a block little-endian; the
//! `blowfish` crate provides that byte order as `BlowfishLE` (same key schedule), named
//! `blowfish_le` here as in cryptsetup.
//!
//! Why ucrypt has this code: no crate implements TrueCrypt's sector IV, whitening or cipher
//! cascades (RustCrypto's `cbc` crate is plain CBC), and the Linux kernel has neither a
//! little-endian Blowfish nor a cascade template, which is why cryptsetup can decrypt these
//! headers but not map the volumes. The ciphers themselves come from RustCrypto crates
//! ([`crate::block`]); only the composition is here.
//!
//! ucrypt accepts these two names only as `CIPHER-cbc-tcw` (and its `capi:cbc(CIPHER)-tcw`
//! form): they are ucrypt extensions a kernel would refuse, kept to TrueCrypt's own mode.

use crate::block::cascade::CASCADE_SEP;

/// Whether `name` is one of the TrueCrypt-only ciphers of this module: `blowfish_le`, or a
/// cascade `a+b[+c]` (not checked further; see [`crate::block::cascade::cascade_parts`]).
pub fn is_truecrypt_cipher(name: &str) -> bool {
    name == "blowfish_le" || name.contains(CASCADE_SEP)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::new_block_cipher;
    use crate::lane::Lane;
    use crate::legacy::tcw::Tcw;

    #[test]
    fn truecrypt_only_names() {
        assert!(is_truecrypt_cipher("blowfish_le") && is_truecrypt_cipher("aes+serpent"));
        assert!(!is_truecrypt_cipher("blowfish"));
    }

    #[test]
    fn blowfish_le_is_blowfish_with_swapped_halves() {
        // Reference: cryptsetup's TCRYPT_swab_le around the kernel's big-endian Blowfish.
        let key: Vec<u8> = (0u8..56).map(|b| b.wrapping_mul(101)).collect();
        let le = new_block_cipher("blowfish_le", &key).unwrap();
        let be = new_block_cipher("blowfish", &key).unwrap();
        let plain: Vec<u8> = (0u8..16).collect();
        let mut got = plain.clone();
        le.encrypt_blocks(&mut got);
        let mut want = plain.clone();
        for b in want.chunks_exact_mut(4) {
            b.reverse();
        }
        be.encrypt_blocks(&mut want);
        for b in want.chunks_exact_mut(4) {
            b.reverse();
        }
        assert_eq!(got, want);
        le.decrypt_blocks(&mut got);
        assert_eq!(got, plain);
    }

    #[test]
    fn outer_cbc_is_cbc_over_the_cascade_then_tcw_whitening() {
        // Reference, by hand from TrueCrypt 5's EncryptBuffer: CBC where each block goes
        // through twofish then aes, with IV = seed xor le64(s); the whitening is taken from
        // dm-crypt-checked tcw over AES (tcw output xor plain CBC output), which depends only
        // on the whitening seed and the sector number.
        use crate::mode::{cbc::Cbc, Mode};
        let (seed, white) = ([0x11u8; 16], [0x5au8; 16]);
        let key: Vec<u8> = (0u8..64).collect();
        let t = Tcw::new("twofish+aes", &key, &seed, &white).unwrap();
        let plain: Vec<u8> = (0..512u32).map(|i| (i * 13) as u8).collect();
        let s = 1234u64;
        let mut iv = seed;
        for (i, b) in iv.iter_mut().enumerate() {
            *b ^= s.to_le_bytes()[i % 8];
        }
        let tf = new_block_cipher("twofish", &key[..32]).unwrap();
        let aes = new_block_cipher("aes", &key[32..]).unwrap();
        let mut want = plain.clone();
        let mut prev = iv.to_vec();
        for block in want.chunks_exact_mut(16) {
            for (b, p) in block.iter_mut().zip(&prev) {
                *b ^= p;
            }
            tf.encrypt_blocks(block);
            aes.encrypt_blocks(block);
            prev = block.to_vec();
        }
        let one = Tcw::new("aes", &[3; 32], &seed, &white).unwrap();
        let mut w = plain.clone();
        one.encrypt(s, 1, &mut w);
        let mut cbc_only = plain.clone();
        Cbc::new("aes", &[3; 32])
            .unwrap()
            .encrypt(&iv, &mut cbc_only);
        for ((x, a), b) in want.iter_mut().zip(&w).zip(&cbc_only) {
            *x ^= a ^ b;
        }
        let mut got = plain.clone();
        t.encrypt(s, 1, &mut got);
        assert_eq!(got, want);
        t.decrypt(s, 1, &mut got);
        assert_eq!(got, plain);
    }
}
