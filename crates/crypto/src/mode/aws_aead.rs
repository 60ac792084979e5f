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

use crate::secret::LockedBox;
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
    ctx: LockedBox<AeadState>,
}

/// An `EVP_AEAD_CTX` in memory of ours, keyed in place (`EVP_AEAD_CTX_init`): AES-GCM's
/// key schedule and GHASH table and ChaCha20-Poly1305's key are inline in the struct (its
/// `state`), so the struct is the whole secret, and it lives in a [`LockedBox`]. AWS-LC's
/// own `EVP_AEAD_CTX_new` would put it in an allocation of the library's, outside the
/// page counts.
#[repr(transparent)]
struct AeadState(ffi::EVP_AEAD_CTX);

// SAFETY: the context has no thread affinity and, once keyed, is only read (see the module
// comment): sealing and opening from several threads at once is what AWS-LC permits.
unsafe impl Send for AeadState {}
// SAFETY: as above.
unsafe impl Sync for AeadState {}

impl AeadState {
    /// The zero state (`EVP_AEAD_CTX_zero`): no AEAD, no key; safe to clean up.
    fn blank() -> Self {
        // SAFETY: every field of EVP_AEAD_CTX is a raw pointer, an integer or a byte
        // array (its state union), for which all zeroes is a valid value; all zeroes is
        // what EVP_AEAD_CTX_zero writes.
        AeadState(unsafe { std::mem::zeroed() })
    }
}

impl Drop for AeadState {
    fn drop(&mut self) {
        let p = std::ptr::from_mut(&mut self.0);
        // SAFETY: `p` is a context in the zero state or keyed by EVP_AEAD_CTX_init (a
        // failed init leaves it cleanable), cleaned up once, here. The cleanup of AES-GCM
        // and ChaCha20-Poly1305 frees and zeroes nothing (their state is inline; only
        // `EVP_AEAD_CTX_free`'s `OPENSSL_free` would cleanse it), so the struct is
        // cleansed here, while the LockedBox still holds its pages locked.
        unsafe {
            ffi::EVP_AEAD_CTX_cleanup(p);
            ffi::OPENSSL_cleanse(p.cast(), std::mem::size_of::<ffi::EVP_AEAD_CTX>());
        }
    }
}

impl AwsAead {
    /// Keys a context, or None for a key length the algorithm does not take (or a library
    /// failure). The context is placed in locked memory first and keyed there.
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
        let ctx = LockedBox::filled(AeadState::blank(), |s| {
            // SAFETY: `s.0` is a zeroed context at its final address (the LockedBox's heap
            // allocation, never moved: AES-GCM's state does not depend on its address
            // anyway, AWS-LC copies it verbatim); `key` is readable for its length and the
            // library copies it.
            unsafe {
                ffi::EVP_AEAD_CTX_init(
                    &mut s.0,
                    aead,
                    key.as_ptr(),
                    key.len(),
                    TAG_LEN,
                    std::ptr::null_mut(),
                ) == 1
            }
        });
        if ctx.is_none() {
            // SAFETY: clears this thread's error queue; no preconditions.
            unsafe { ffi::ERR_clear_error() };
        }
        Some(AwsAead { ctx: ctx? })
    }

    /// The keyed context, for AWS-LC's (const) sealing and opening functions.
    fn raw(&self) -> *const ffi::EVP_AEAD_CTX {
        &self.ctx.0
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
                self.raw(),
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
                self.raw(),
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

    /// The bytes of a keyed context (its whole key state).
    fn state_bytes(c: &AwsAead) -> &[u8] {
        // SAFETY: `c.raw()` is a live, keyed EVP_AEAD_CTX, readable for its size, and
        // nothing writes it while `c` is borrowed.
        unsafe {
            std::slice::from_raw_parts(
                c.raw().cast::<u8>(),
                std::mem::size_of::<ffi::EVP_AEAD_CTX>(),
            )
        }
    }

    /// A context's whole key state is in locked pages while it lives and is unlocked when
    /// it is dropped, by the kernel's flag per page (as root) and the page counts:
    /// contexts sharing a page do not unlock it for each other.
    #[test]
    fn key_state_stays_in_locked_pages_while_the_context_lives() {
        let ctxs: Vec<AwsAead> = (0..8u8)
            .map(|i| {
                let key: Vec<u8> = (0..32u8).map(|j| j.wrapping_mul(37) ^ i).collect();
                let alg = if i % 2 == 0 {
                    Algorithm::ChaCha20Poly1305
                } else {
                    Algorithm::AesGcm
                };
                let c = AwsAead::new(alg, &key).unwrap();
                if alg == Algorithm::ChaCha20Poly1305 {
                    // ChaCha20-Poly1305 keeps the key as it is: inside the locked range.
                    assert!(state_bytes(&c).windows(32).any(|w| w == key.as_slice()));
                }
                c
            })
            .collect();
        if !ctxs[0].ctx.is_locked() {
            eprintln!("SKIP: mlock refused (RLIMIT_MEMLOCK)");
            return;
        }
        assert!(ctxs.iter().all(|c| c.ctx.is_locked()));
        crate::secret::page_check::drop_checking_pages(ctxs, |c: &AwsAead| {
            vec![(c.raw() as usize, std::mem::size_of::<ffi::EVP_AEAD_CTX>())]
        });
    }

    /// Dropping the state cleans it up and zeroes it in place (AWS-LC's cleanup does not).
    #[test]
    fn a_dropped_state_is_zeroed_in_place() {
        let key = [0x3cu8; 32];
        for aead in [Algorithm::AesGcm, Algorithm::ChaCha20Poly1305] {
            let mut s = std::mem::ManuallyDrop::new(AeadState::blank());
            // SAFETY: `s.0` is a zeroed context that stays where it is; the key is
            // readable for 32 bytes.
            let ok = unsafe {
                let a = match aead {
                    Algorithm::AesGcm => ffi::EVP_aead_aes_256_gcm(),
                    Algorithm::ChaCha20Poly1305 => ffi::EVP_aead_chacha20_poly1305(),
                };
                ffi::EVP_AEAD_CTX_init(&mut s.0, a, key.as_ptr(), 32, TAG_LEN, std::ptr::null_mut())
            };
            assert_eq!(ok, 1);
            let n = std::mem::size_of::<ffi::EVP_AEAD_CTX>();
            // SAFETY: reading the keyed struct's bytes (`ManuallyDrop` and `AeadState` are
            // transparent over it); nothing writes it meanwhile.
            let nonzero =
                unsafe { std::slice::from_raw_parts(std::ptr::from_ref(&s).cast::<u8>(), n) }
                    .iter()
                    .filter(|&&b| b != 0)
                    .count();
            assert!(nonzero > 32, "{aead:?}: keyed state holds the key");
            // SAFETY: dropped once; its storage (in `s`) stays and is only read after.
            unsafe { std::mem::ManuallyDrop::drop(&mut s) };
            // SAFETY: the storage of `s` is still ours, and every byte of it initialised.
            let after =
                unsafe { std::slice::from_raw_parts(std::ptr::from_ref(&s).cast::<u8>(), n) };
            assert!(after.iter().all(|&b| b == 0), "{aead:?}: not zeroed");
        }
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
            let ctx = state_bytes(&c);
            let holds = |n: &[u8; 16]| ctx.windows(16).any(|w| w == n);
            assert!(holds(&twisted), "AES-{} GCM: no twisted H", klen * 8);
            assert!(!holds(&raw), "AES-{} GCM: raw H", klen * 8);
        }
    }
}
