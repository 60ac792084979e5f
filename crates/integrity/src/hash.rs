//! The kernel's internal hashes for tags, and the journal MAC.
//!
//! A block's tag is the hash of `[salt (16 bytes, with fix_hmac)] || logical sector (le64,
//! 512-byte units) || the block`, cut to the tag size or padded with zeros
//! (`integrity_sector_checksum`). The kernel's `crc32c` gives the usual CRC-32C (seed and
//! final inversion) as little-endian bytes; its `crc32` is the raw reflected CRC-32 with seed
//! 0 and no final inversion (`crc32_generic`), little-endian.

use hmac::{Hmac, KeyInit, Mac};
use sha1::Sha1;
use sha2::{Digest, Sha256, Sha512};
use zeroize::Zeroizing;

/// The hashes ucrypt computes as the kernel does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// `crc32c` (integritysetup's default).
    Crc32c,
    /// `crc32`.
    Crc32,
    /// `sha1`.
    Sha1,
    /// `sha256`.
    Sha256,
    /// `sha512`.
    Sha512,
    /// `hmac(sha1)`.
    HmacSha1,
    /// `hmac(sha256)`.
    HmacSha256,
    /// `hmac(sha512)`.
    HmacSha512,
}

impl Algorithm {
    /// Parses a kernel name (`hmac(sha256)`) or integritysetup's (`hmac-sha256`).
    ///
    /// # Errors
    /// The name, when it is not one of these.
    pub fn from_name(name: &str) -> Result<Algorithm, String> {
        Ok(match name {
            "crc32c" => Algorithm::Crc32c,
            "crc32" => Algorithm::Crc32,
            "sha1" => Algorithm::Sha1,
            "sha256" => Algorithm::Sha256,
            "sha512" => Algorithm::Sha512,
            "hmac(sha1)" | "hmac-sha1" => Algorithm::HmacSha1,
            "hmac(sha256)" | "hmac-sha256" => Algorithm::HmacSha256,
            "hmac(sha512)" | "hmac-sha512" => Algorithm::HmacSha512,
            other => {
                return Err(format!(
                    "hash \"{other}\" is not supported (crc32c, crc32, sha1, sha256, sha512, \
                     hmac-sha1, hmac-sha256, hmac-sha512)"
                ))
            }
        })
    }

    /// The kernel's name (`hmac(sha256)`), as in the table line.
    pub fn kernel_name(self) -> &'static str {
        match self {
            Algorithm::Crc32c => "crc32c",
            Algorithm::Crc32 => "crc32",
            Algorithm::Sha1 => "sha1",
            Algorithm::Sha256 => "sha256",
            Algorithm::Sha512 => "sha512",
            Algorithm::HmacSha1 => "hmac(sha1)",
            Algorithm::HmacSha256 => "hmac(sha256)",
            Algorithm::HmacSha512 => "hmac(sha512)",
        }
    }

    /// Digest bytes (the default tag size).
    pub fn digest_size(self) -> usize {
        match self {
            Algorithm::Crc32c | Algorithm::Crc32 => 4,
            Algorithm::Sha1 | Algorithm::HmacSha1 => 20,
            Algorithm::Sha256 | Algorithm::HmacSha256 => 32,
            Algorithm::Sha512 | Algorithm::HmacSha512 => 64,
        }
    }

    /// Whether it takes a key (an HMAC).
    pub fn keyed(self) -> bool {
        matches!(
            self,
            Algorithm::HmacSha1 | Algorithm::HmacSha256 | Algorithm::HmacSha512
        )
    }
}

/// A keyed (or plain) hash, ready to hash many messages: the HMAC's inner and outer states
/// are computed once from the key.
#[derive(Clone)]
pub struct Hasher {
    alg: Algorithm,
    state: State,
}

#[derive(Clone)]
enum State {
    Crc32c,
    Crc32,
    Sha1,
    Sha256,
    Sha512,
    HmacSha1(Box<Hmac<Sha1>>),
    HmacSha256(Box<Hmac<Sha256>>),
    HmacSha512(Box<Hmac<Sha512>>),
}

impl std::fmt::Debug for Hasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hasher")
            .field("alg", &self.alg)
            .finish_non_exhaustive()
    }
}

impl Hasher {
    /// `alg` with `key` (an HMAC needs one; a plain hash takes none).
    ///
    /// # Errors
    /// A message naming what is missing or extra.
    pub fn new(alg: Algorithm, key: Option<&[u8]>) -> Result<Hasher, String> {
        let state = match (alg, key) {
            (a @ (Algorithm::HmacSha1 | Algorithm::HmacSha256 | Algorithm::HmacSha512), None) => {
                return Err(format!("{} needs a key", a.kernel_name()));
            }
            (a, Some(_)) if !a.keyed() => {
                return Err(format!("{} takes no key", a.kernel_name()));
            }
            (Algorithm::Crc32c, _) => State::Crc32c,
            (Algorithm::Crc32, _) => State::Crc32,
            (Algorithm::Sha1, _) => State::Sha1,
            (Algorithm::Sha256, _) => State::Sha256,
            (Algorithm::Sha512, _) => State::Sha512,
            (Algorithm::HmacSha1, Some(k)) => State::HmacSha1(Box::new(hmac_key(k)?)),
            (Algorithm::HmacSha256, Some(k)) => State::HmacSha256(Box::new(hmac_key(k)?)),
            (Algorithm::HmacSha512, Some(k)) => State::HmacSha512(Box::new(hmac_key(k)?)),
        };
        Ok(Hasher { alg, state })
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.alg
    }

    /// The digest of the concatenation of `parts`, cut to or zero-padded to `out.len()`.
    pub fn digest_into(&self, parts: &[&[u8]], out: &mut [u8]) {
        let mut full = Zeroizing::new([0u8; 64]);
        let n = self.alg.digest_size();
        match &self.state {
            State::Crc32c => {
                let c = parts.iter().fold(0u32, |c, p| crc32c::crc32c_append(c, p));
                full[..4].copy_from_slice(&c.to_le_bytes());
            }
            State::Crc32 => {
                // Seed 0, no final inversion: crc32fast's standard CRC with both
                // inversions undone (initial !0 gives a raw register of 0).
                let mut h = crc32fast::Hasher::new_with_initial(u32::MAX);
                for p in parts {
                    h.update(p);
                }
                full[..4].copy_from_slice(&(!h.finalize()).to_le_bytes());
            }
            State::Sha1 => digest_parts::<Sha1>(parts, &mut full[..n]),
            State::Sha256 => digest_parts::<Sha256>(parts, &mut full[..n]),
            State::Sha512 => digest_parts::<Sha512>(parts, &mut full[..n]),
            State::HmacSha1(m) => mac_parts((**m).clone(), parts, &mut full[..n]),
            State::HmacSha256(m) => mac_parts((**m).clone(), parts, &mut full[..n]),
            State::HmacSha512(m) => mac_parts((**m).clone(), parts, &mut full[..n]),
        }
        let take = out.len().min(n);
        out[..take].copy_from_slice(&full[..take]);
        out[take..].fill(0);
    }
}

fn hmac_key<M: KeyInit>(key: &[u8]) -> Result<M, String> {
    M::new_from_slice(key).map_err(|_| "the HMAC key is refused".to_string())
}

fn digest_parts<D: Digest>(parts: &[&[u8]], out: &mut [u8]) {
    let mut d = D::new();
    for p in parts {
        d.update(p);
    }
    out.copy_from_slice(&d.finalize()[..out.len()]);
}

fn mac_parts<M: Mac>(mut m: M, parts: &[&[u8]], out: &mut [u8]) {
    for p in parts {
        m.update(p);
    }
    out.copy_from_slice(&m.finalize().into_bytes()[..out.len()]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crcs_match_the_kernels_definitions() {
        // CRC-32C check value of "123456789" (RFC 3720's polynomial): 0xe3069283.
        let h = Hasher::new(Algorithm::Crc32c, None).unwrap();
        let mut out = [0u8; 4];
        h.digest_into(&[b"1234", b"56789"], &mut out);
        assert_eq!(u32::from_le_bytes(out), 0xe306_9283);
        // The kernel's crc32 shash: crc32_le(0, data), no inversions. For "123456789"
        // the standard CRC-32 is 0xcbf43926 = !crc32_le(!0, data); crc32_le(0, .) of
        // the same bytes is 0x2dfd2d88 (computed bit by bit below).
        let h = Hasher::new(Algorithm::Crc32, None).unwrap();
        h.digest_into(&[b"123456789"], &mut out);
        assert_eq!(u32::from_le_bytes(out), raw_crc32(0, b"123456789"));
    }

    fn raw_crc32(mut crc: u32, data: &[u8]) -> u32 {
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0xedb8_8320
                } else {
                    crc >> 1
                };
            }
        }
        crc
    }

    #[test]
    fn tags_are_cut_or_padded() {
        let h = Hasher::new(Algorithm::Sha256, None).unwrap();
        let mut long = [0xaau8; 40];
        h.digest_into(&[b"abc"], &mut long);
        assert_eq!(
            long[..4],
            [0xba, 0x78, 0x16, 0xbf],
            "sha256(\"abc\") starts ba7816bf"
        );
        assert_eq!(long[32..], [0u8; 8]);
        let mut short = [0u8; 4];
        h.digest_into(&[b"abc"], &mut short);
        assert_eq!(short, long[..4]);
        assert!(Hasher::new(Algorithm::HmacSha256, None).is_err());
        assert!(Hasher::new(Algorithm::Sha256, Some(b"k")).is_err());
    }
}
