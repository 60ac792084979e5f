//! AES-GCM and ChaCha20-Poly1305 through AWS-LC's `EVP_AEAD` interface, for dm-crypt's
//! authenticated modes (`capi:gcm(aes)-random`, `capi:rfc7539(chacha20,poly1305)-random`).
//!
//! AWS-LC's AES-GCM runs its AES-NI/VAES + carry-less multiply kernels and its ChaCha20 and
//! Poly1305 their AVX2 code; measured per 1 MiB of 4096-byte sectors on a 2-vCPU EPYC
//! (BENCHMARKING.md, `ucrypt bench integrity`) they are several times RustCrypto's
//! `aes-gcm` and `chacha20poly1305`, which these replace on this path.
//!
//! One keyed `EVP_AEAD_CTX` serves every thread: after `EVP_AEAD_CTX_new` the context is
//! only read by `seal_scatter` and `open_gather` (AWS-LC documents the sealing and opening
//! functions as safe to call concurrently on one context; aws-lc-rs shares its keys the
//! same way).
#![allow(unsafe_code)]

use aws_lc_sys as ffi;

/// Which AEAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// AES-GCM with a 16- or 32-byte key.
    AesGcm,
    /// ChaCha20-Poly1305 (RFC 7539) with a 32-byte key.
    ChaCha20Poly1305,
}

/// The nonce and tag sizes of both algorithms.
pub const NONCE_LEN: usize = 12;
/// Bytes of authentication tag.
pub const TAG_LEN: usize = 16;

/// A keyed AEAD context (12-byte nonce, 16-byte tag).
pub struct AwsAead {
    ctx: *mut ffi::EVP_AEAD_CTX,
}

// SAFETY: the context has no thread affinity and, once keyed, is only read (see the module
// comment): sealing and opening from several threads at once is what AWS-LC permits.
unsafe impl Send for AwsAead {}
// SAFETY: as above.
unsafe impl Sync for AwsAead {}

impl Drop for AwsAead {
    fn drop(&mut self) {
        // SAFETY: `ctx` came from EVP_AEAD_CTX_new and is freed once, here; the free
        // cleanses the key schedule.
        unsafe { ffi::EVP_AEAD_CTX_free(self.ctx) };
    }
}

impl AwsAead {
    /// Keys a context, or None for a key length the algorithm does not take (or a library
    /// failure).
    pub fn new(alg: Algorithm, key: &[u8]) -> Option<AwsAead> {
        // SAFETY: constructors without preconditions returning static descriptions.
        let aead = unsafe {
            match (alg, key.len()) {
                (Algorithm::AesGcm, 16) => ffi::EVP_aead_aes_128_gcm(),
                (Algorithm::AesGcm, 32) => ffi::EVP_aead_aes_256_gcm(),
                (Algorithm::ChaCha20Poly1305, 32) => ffi::EVP_aead_chacha20_poly1305(),
                _ => return None,
            }
        };
        // SAFETY: `key` is readable for its length; the library copies the key.
        let ctx = unsafe { ffi::EVP_AEAD_CTX_new(aead, key.as_ptr(), key.len(), TAG_LEN) };
        (!ctx.is_null()).then_some(AwsAead { ctx })
    }

    /// Encrypts `data` in place and writes the tag.
    ///
    /// # Errors
    /// The library refused (it only does for lengths beyond its limits).
    pub fn seal(
        &self,
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        data: &mut [u8],
        tag: &mut [u8; TAG_LEN],
    ) -> Result<(), crate::CryptoError> {
        let mut tag_len = 0usize;
        let p = data.as_mut_ptr();
        // SAFETY: `data` is readable and writable for its length and AWS-LC permits in ==
        // out; `tag` is writable for TAG_LEN bytes (the max passed); nonce and aad are
        // readable for their lengths; no extra input.
        let ok = unsafe {
            ffi::EVP_AEAD_CTX_seal_scatter(
                self.ctx,
                p,
                tag.as_mut_ptr(),
                &mut tag_len,
                TAG_LEN,
                nonce.as_ptr(),
                NONCE_LEN,
                p,
                data.len(),
                std::ptr::null(),
                0,
                aad.as_ptr(),
                aad.len(),
            )
        };
        if ok == 1 && tag_len == TAG_LEN {
            Ok(())
        } else {
            // SAFETY: clears this thread's error queue; no preconditions.
            unsafe { ffi::ERR_clear_error() };
            Err(crate::CryptoError::Library("AEAD encryption"))
        }
    }

    /// Checks `tag` over `data` and `aad` and decrypts `data` in place; false (and `data`
    /// not to be used) when the tag does not match.
    pub fn open(
        &self,
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        data: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> bool {
        let p = data.as_mut_ptr();
        // SAFETY: as in `seal`; `tag` is readable for TAG_LEN bytes.
        let ok = unsafe {
            ffi::EVP_AEAD_CTX_open_gather(
                self.ctx,
                p,
                nonce.as_ptr(),
                NONCE_LEN,
                p,
                data.len(),
                tag.as_ptr(),
                TAG_LEN,
                aad.as_ptr(),
                aad.len(),
            )
        };
        if ok != 1 {
            // SAFETY: as above. A mismatch leaves a reason in the queue; it is not an error
            // of this thread's later calls.
            unsafe { ffi::ERR_clear_error() };
        }
        ok == 1
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use aes_gcm::aead::{AeadInOut, KeyInit};

    /// Both libraries give the same ciphertext and tag, and each opens what the other
    /// sealed; a flipped bit of data, tag or AAD is refused.
    #[test]
    fn agrees_with_rustcrypto_and_refuses_any_flipped_bit() {
        for (alg, klen) in [
            (Algorithm::AesGcm, 16),
            (Algorithm::AesGcm, 32),
            (Algorithm::ChaCha20Poly1305, 32),
        ] {
            let key: Vec<u8> = (0..klen as u8).map(|i| i.wrapping_mul(29) ^ 0x5c).collect();
            let ours = AwsAead::new(alg, &key).unwrap();
            let nonce = [7u8; 12];
            let aad = *b"sector00ivivivivivivi";
            let plain: Vec<u8> = (0..4096u32).map(|i| (i * 13 % 251) as u8).collect();
            let mut a = plain.clone();
            let mut tag = [0u8; 16];
            ours.seal(&nonce, &aad, &mut a, &mut tag).unwrap();
            let mut b = plain.clone();
            let n = aes_gcm::aead::array::Array::from(nonce);
            let t: [u8; 16] = match (alg, klen) {
                (Algorithm::AesGcm, 16) => aes_gcm::Aes128Gcm::new_from_slice(&key)
                    .unwrap()
                    .encrypt_inout_detached(&n, &aad, b.as_mut_slice().into())
                    .unwrap()
                    .into(),
                (Algorithm::AesGcm, _) => aes_gcm::Aes256Gcm::new_from_slice(&key)
                    .unwrap()
                    .encrypt_inout_detached(&n, &aad, b.as_mut_slice().into())
                    .unwrap()
                    .into(),
                _ => chacha20poly1305::ChaCha20Poly1305::new_from_slice(&key)
                    .unwrap()
                    .encrypt_inout_detached(&n, &aad, b.as_mut_slice().into())
                    .unwrap()
                    .into(),
            };
            assert_eq!(a, b, "{alg:?} {klen}");
            assert_eq!(tag, t, "{alg:?} {klen}");
            let mut c = a.clone();
            assert!(ours.open(&nonce, &aad, &mut c, &tag));
            assert_eq!(c, plain);
            for flip in 0..3 {
                let (mut d, mut tg, mut ad) = (a.clone(), tag, aad);
                match flip {
                    0 => d[100] ^= 1,
                    1 => tg[15] ^= 0x80,
                    _ => ad[0] ^= 1,
                }
                assert!(!ours.open(&nonce, &ad, &mut d, &tg), "{alg:?} flip {flip}");
            }
        }
        assert!(AwsAead::new(Algorithm::ChaCha20Poly1305, &[0; 16]).is_none());
        assert!(AwsAead::new(Algorithm::AesGcm, &[0; 24]).is_none());
    }

    /// Where a keyed AES-GCM context keeps GHASH's key H = AES_K(0^128): on x86-64 with
    /// carry-less multiply, only in the twisted form of [`crate::testing::gcm_hash_keys`]
    /// (the first power in its table), never raw. So a scan of memory for H looks for the
    /// twisted form; this checks that form (and H itself against the GCM specification's
    /// test cases 1 and 13, all-zero keys).
    #[test]
    fn a_gcm_context_keeps_the_hash_key_twisted_not_raw() {
        let zero = |n| hex::encode(crate::testing::gcm_hash_keys(&vec![0u8; n])[0]);
        assert_eq!(zero(16), "66e94bd4ef8a2c3b884cfa59ca342b2e");
        assert_eq!(zero(32), "dc95c078a2408989ad48a21492842087");
        #[cfg(target_arch = "x86_64")]
        let clmul = std::arch::is_x86_feature_detected!("pclmulqdq");
        #[cfg(not(target_arch = "x86_64"))]
        let clmul = false;
        if !clmul {
            return; // other GHASH code keeps other forms
        }
        for klen in [16u8, 32] {
            let key: Vec<u8> = (0..klen).map(|i| i.wrapping_mul(53) ^ 0xa7).collect();
            let [raw, twisted] = crate::testing::gcm_hash_keys(&key);
            let c = AwsAead::new(Algorithm::AesGcm, &key).unwrap();
            // SAFETY: `ctx` is a live EVP_AEAD_CTX from EVP_AEAD_CTX_new, readable for
            // its size, and nothing writes it while `c` is borrowed here.
            let ctx = unsafe {
                std::slice::from_raw_parts(
                    c.ctx.cast::<u8>(),
                    std::mem::size_of::<ffi::EVP_AEAD_CTX>(),
                )
            };
            let holds = |n: &[u8; 16]| ctx.windows(16).any(|w| w == n);
            assert!(holds(&twisted), "AES-{} GCM: no twisted H", klen * 8);
            assert!(!holds(&raw), "AES-{} GCM: raw H", klen * 8);
        }
    }
}
