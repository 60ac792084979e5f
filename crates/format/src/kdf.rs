//! Hashes and key derivation functions by the names LUKS headers use: PBKDF2-HMAC with
//! `sha1`, `sha224`, `sha256`, `sha384`, `sha512`, `ripemd160`, `whirlpool`, and Argon2i /
//! Argon2id (RFC 9106, version 0x13), all in pure Rust (RustCrypto).
//!
//! libcryptsetup derives keys with OpenSSL/libargon2; these give the same bytes and let
//! ucrypt unlock keyslots without the library (see [`crate::luks1`], [`crate::luks2`]).

use crate::FormatError;
use digest::Digest;
use zeroize::Zeroizing;

/// A hash LUKS names in `hash-spec` (LUKS1), `af.hash`, `kdf.hash` and `digests` (LUKS2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hash {
    /// SHA-1.
    Sha1,
    /// SHA-224.
    Sha224,
    /// SHA-256.
    Sha256,
    /// SHA-384.
    Sha384,
    /// SHA-512.
    Sha512,
    /// RIPEMD-160.
    Ripemd160,
    /// Whirlpool (512-bit).
    Whirlpool,
}

/// The names [`Hash::from_name`] accepts.
pub const HASH_NAMES: &str = "sha1, sha224, sha256, sha384, sha512, ripemd160, whirlpool";

impl Hash {
    /// Parses a LUKS hash name (case-insensitive, as libcryptsetup).
    ///
    /// # Errors
    /// [`FormatError::NotSupported`] naming the hash and the supported ones.
    pub fn from_name(name: &str) -> Result<Self, FormatError> {
        Ok(match name.to_ascii_lowercase().as_str() {
            "sha1" => Hash::Sha1,
            "sha224" => Hash::Sha224,
            "sha256" => Hash::Sha256,
            "sha384" => Hash::Sha384,
            "sha512" => Hash::Sha512,
            "ripemd160" | "rmd160" => Hash::Ripemd160,
            "whirlpool" | "wp512" => Hash::Whirlpool,
            _ => {
                return Err(FormatError::NotSupported(format!(
                    "hash \"{name}\" (supported: {HASH_NAMES})"
                )))
            }
        })
    }

    /// Digest length in bytes.
    pub fn size(self) -> usize {
        match self {
            Hash::Sha1 | Hash::Ripemd160 => 20,
            Hash::Sha224 => 28,
            Hash::Sha256 => 32,
            Hash::Sha384 => 48,
            Hash::Sha512 | Hash::Whirlpool => 64,
        }
    }

    /// The digest of the concatenation of `parts`.
    pub fn digest(self, parts: &[&[u8]]) -> Zeroizing<Vec<u8>> {
        fn run<D: Digest>(parts: &[&[u8]]) -> Zeroizing<Vec<u8>> {
            let mut d = D::new();
            for p in parts {
                d.update(p);
            }
            Zeroizing::new(d.finalize().to_vec())
        }
        match self {
            Hash::Sha1 => run::<sha1::Sha1>(parts),
            Hash::Sha224 => run::<sha2::Sha224>(parts),
            Hash::Sha256 => run::<sha2::Sha256>(parts),
            Hash::Sha384 => run::<sha2::Sha384>(parts),
            Hash::Sha512 => run::<sha2::Sha512>(parts),
            Hash::Ripemd160 => run::<ripemd::Ripemd160>(parts),
            Hash::Whirlpool => run::<whirlpool::Whirlpool>(parts),
        }
    }

    /// PBKDF2-HMAC with this hash (RFC 8018), filling `out`.
    pub fn pbkdf2(self, password: &[u8], salt: &[u8], iterations: u32, out: &mut [u8]) {
        use pbkdf2::pbkdf2_hmac as p;
        match self {
            Hash::Sha1 => p::<sha1::Sha1>(password, salt, iterations, out),
            Hash::Sha224 => p::<sha2::Sha224>(password, salt, iterations, out),
            Hash::Sha256 => p::<sha2::Sha256>(password, salt, iterations, out),
            Hash::Sha384 => p::<sha2::Sha384>(password, salt, iterations, out),
            Hash::Sha512 => p::<sha2::Sha512>(password, salt, iterations, out),
            Hash::Ripemd160 => p::<ripemd::Ripemd160>(password, salt, iterations, out),
            Hash::Whirlpool => p::<whirlpool::Whirlpool>(password, salt, iterations, out),
        }
    }
}

/// Which Argon2 variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Argon2Kind {
    /// Argon2i (data-independent).
    I,
    /// Argon2id (hybrid; cryptsetup's default).
    Id,
}

/// Argon2 cost parameters as LUKS2 stores them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Argon2Cost {
    /// Time cost (passes).
    pub time: u32,
    /// Memory in KiB.
    pub memory_kib: u32,
    /// Lanes (`cpus`).
    pub lanes: u32,
}

/// Argon2 (version 0x13) of `password` and `salt` into `out`.
///
/// # Errors
/// [`FormatError::Header`] when the costs or salt are outside what Argon2 accepts (e.g. a
/// salt shorter than 8 bytes, memory below 8 KiB per lane).
pub fn argon2(
    kind: Argon2Kind,
    cost: Argon2Cost,
    password: &[u8],
    salt: &[u8],
    out: &mut [u8],
) -> Result<(), FormatError> {
    let out_len = out.len();
    let bad = |e: argon2::Error| FormatError::Header {
        what: "Argon2 parameters".into(),
        reason: format!(
            "time {} memory {} KiB lanes {} salt {} bytes output {} bytes: {e}",
            cost.time,
            cost.memory_kib,
            cost.lanes,
            salt.len(),
            out_len
        ),
    };
    let params = argon2::Params::new(cost.memory_kib, cost.time, cost.lanes, Some(out.len()))
        .map_err(bad)?;
    let alg = match kind {
        Argon2Kind::I => argon2::Algorithm::Argon2i,
        Argon2Kind::Id => argon2::Algorithm::Argon2id,
    };
    argon2::Argon2::new(alg, argon2::Version::V0x13, params)
        .hash_password_into(password, salt, out)
        .map_err(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn pbkdf2_sha1_matches_rfc6070() {
        let mut out = [0u8; 20];
        Hash::Sha1.pbkdf2(b"password", b"salt", 2, &mut out);
        assert_eq!(hex(&out), "ea6c014dc72d6f8ccd1ed92ace1d41f0d8de8957");
    }

    #[test]
    fn argon2id_matches_rfc9106_shape() {
        // RFC 9106 without secret/associated data is not given; check determinism and that
        // the variants differ.
        let c = Argon2Cost {
            time: 1,
            memory_kib: 32,
            lanes: 1,
        };
        let (mut a, mut b) = ([0u8; 32], [0u8; 32]);
        argon2(Argon2Kind::I, c, b"pw", b"saltsalt", &mut a).unwrap();
        argon2(Argon2Kind::Id, c, b"pw", b"saltsalt", &mut b).unwrap();
        assert_ne!(a, b);
        assert!(argon2(Argon2Kind::Id, c, b"pw", b"short", &mut b).is_err());
    }

    #[test]
    fn unknown_hash_is_named() {
        let e = Hash::from_name("md4").unwrap_err().to_string();
        assert!(e.contains("md4") && e.contains("sha256"), "{e}");
    }
}
