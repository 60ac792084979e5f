//! LUKS2 keyslot unlock in pure Rust, from the JSON metadata libcryptsetup validated
//! (`crypt_dump_json`): the fallback for keyslot ciphers libcryptsetup can only use through
//! the kernel.
//!
//! ```text
//!  passphrase ─kdf (pbkdf2 | argon2i | argon2id, keyslot salt)─► area key
//!  area (offset, size; area.encryption, 512-byte sectors from IV 0) ─decrypt─► AF stripes
//!  ─merge(af.hash)─► candidate ─digests[d] pbkdf2(hash, salt, iterations)─► == digest?
//! ```
//!
//! Only keyslots bound (through a digest) to a segment open the volume; an unbound keyslot
//! verifies its passphrase only when asked for explicitly.

use crate::kdf::{self, Argon2Cost, Argon2Kind, Hash};
use crate::luks1::{decrypt_area, open};
use crate::{af, FormatError};
use std::path::Path;
use ucrypt_crypto::{CipherSpec, VolumeKey};
use zeroize::Zeroizing;

pub mod disk;
pub mod json;
pub mod metadata;
pub mod reencrypt;

pub use metadata::{BinaryHeader, Metadata, Number};

/// The persistent activation flags of a LUKS header (LUKS2 `config.flags`, as
/// libcryptsetup reports them) that become dm-crypt table options.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ActivationFlags {
    /// `allow-discards` (or `--allow-discards` on the command line).
    pub allow_discards: bool,
    /// `same-cpu-crypt`.
    pub same_cpu_crypt: bool,
    /// `submit-from-crypt-cpus`.
    pub submit_from_crypt_cpus: bool,
    /// `no-read-workqueue`.
    pub no_read_workqueue: bool,
    /// `no-write-workqueue`.
    pub no_write_workqueue: bool,
}

impl ActivationFlags {
    /// The table options cryptsetup gives the kernel for these flags and a segment of
    /// `sector_size`-byte sectors, in the kernel's order.
    pub fn table_options(self, sector_size: u32) -> Vec<crate::OptParam> {
        use crate::OptParam;
        let mut opts: Vec<OptParam> = [
            (self.allow_discards, OptParam::AllowDiscards),
            (self.same_cpu_crypt, OptParam::SameCpuCrypt),
            (self.submit_from_crypt_cpus, OptParam::SubmitFromCryptCpus),
            (self.no_read_workqueue, OptParam::NoReadWorkqueue),
            (self.no_write_workqueue, OptParam::NoWriteWorkqueue),
        ]
        .into_iter()
        .filter_map(|(on, o)| on.then_some(o))
        .collect();
        if sector_size != 512 {
            opts.push(OptParam::SectorSize(sector_size));
        }
        opts
    }
}

/// Decodes standard base64 (with or without padding, whitespace ignored), as LUKS2 stores
/// salts and digests, with RustCrypto's constant-time `base64ct`.
///
/// # Errors
/// [`FormatError::Header`] for a character outside the alphabet or a bad length.
pub fn base64_decode(s: &str) -> Result<Vec<u8>, FormatError> {
    use base64ct::{Base64Unpadded, Encoding};
    let clean: String = s
        .chars()
        .filter(|c| !c.is_ascii_whitespace() && *c != '=')
        .collect();
    if let Some(c) = clean
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '+' || *c == '/'))
    {
        return Err(FormatError::Header {
            what: "LUKS2 base64 field".into(),
            reason: format!("character {c:?} is not base64 (A-Z a-z 0-9 + /)"),
        });
    }
    // cryptsetup writes padded base64; with the padding removed above, a final group of 2
    // or 3 characters decodes as its padded form would (1 character is not a byte).
    Base64Unpadded::decode_vec(&clean).map_err(|e| FormatError::Header {
        what: "LUKS2 base64 field".into(),
        reason: format!("{e} (length {} after padding is removed)", clean.len()),
    })
}

fn missing(what: &str, path: &str) -> FormatError {
    FormatError::Header {
        what: what.to_string(),
        reason: format!("field \"{path}\" is missing"),
    }
}

fn need<'a, T>(v: Option<&'a T>, path: &str, what: &str) -> Result<&'a T, FormatError> {
    v.ok_or_else(|| missing(what, path))
}

fn num(v: Option<&Number>, path: &str, what: &str) -> Result<u64, FormatError> {
    need(v, path, what)?
        .get()
        .ok_or_else(|| FormatError::Header {
            what: what.to_string(),
            reason: format!("field \"{path}\" is not a non-negative integer"),
        })
}

fn u32_num(v: Option<&Number>, path: &str, what: &str) -> Result<u32, FormatError> {
    let n = num(v, path, what)?;
    u32::try_from(n).map_err(|_| FormatError::Header {
        what: what.to_string(),
        reason: format!("field \"{path}\" = {n} is larger than 2^32-1"),
    })
}

/// Derives a keyslot's area key from `passphrase` with the keyslot's `kdf` object.
fn derive(
    kdf_v: &metadata::Kdf,
    passphrase: &[u8],
    out: &mut [u8],
    what: &str,
) -> Result<(), FormatError> {
    let salt = base64_decode(need(kdf_v.salt.as_ref(), "salt", what)?)?;
    match kdf_v.kind.as_str() {
        "pbkdf2" => {
            let hash = Hash::from_name(need(kdf_v.hash.as_ref(), "hash", what)?)?;
            hash.pbkdf2(
                passphrase,
                &salt,
                u32_num(kdf_v.iterations.as_ref(), "iterations", what)?,
                out,
            );
            Ok(())
        }
        t @ ("argon2i" | "argon2id") => {
            let kind = if t == "argon2i" {
                Argon2Kind::I
            } else {
                Argon2Kind::Id
            };
            let cost = Argon2Cost {
                time: u32_num(kdf_v.time.as_ref(), "time", what)?,
                memory_kib: u32_num(kdf_v.memory.as_ref(), "memory", what)?,
                lanes: u32_num(kdf_v.cpus.as_ref(), "cpus", what)?,
            };
            kdf::argon2(kind, cost, passphrase, &salt, out)
        }
        other => Err(FormatError::NotSupported(format!(
            "{what}: KDF \"{other}\" (supported: pbkdf2, argon2i, argon2id)"
        ))),
    }
}

/// Checks `key` against digest object `d`.
pub(crate) fn digest_matches(
    d: &metadata::Digest,
    key: &[u8],
    what: &str,
) -> Result<bool, FormatError> {
    if d.kind != "pbkdf2" {
        return Err(FormatError::NotSupported(format!(
            "{what}: digest type \"{}\" (supported: pbkdf2)",
            d.kind
        )));
    }
    let hash = Hash::from_name(need(d.hash.as_ref(), "hash", what)?)?;
    let salt = base64_decode(need(d.salt.as_ref(), "salt", what)?)?;
    let want = base64_decode(need(d.digest.as_ref(), "digest", what)?)?;
    let mut got = Zeroizing::new(vec![0u8; want.len()]);
    hash.pbkdf2(
        key,
        &salt,
        u32_num(d.iterations.as_ref(), "iterations", what)?,
        &mut got,
    );
    Ok(got[..] == want[..])
}

/// Unlocks a volume key from the LUKS2 header on `path` whose JSON metadata is `meta`,
/// trying `slot` only or every keyslot in numeric order. Without `allow_unbound`, only
/// keyslots whose digest is bound to a segment count. Returns the slot and the key.
///
/// # Errors
/// [`FormatError::BadPassphrase`] when no keyslot opens; [`FormatError::Header`] for
/// malformed metadata; [`FormatError::NotSupported`] / [`FormatError::Crypto`] for a KDF,
/// hash or cipher ucrypt lacks.
pub fn unlock(
    path: &Path,
    meta: &Metadata,
    slot: Option<u32>,
    passphrase: &[u8],
    allow_unbound: bool,
) -> Result<(u32, VolumeKey), FormatError> {
    let device = path.display().to_string();
    let f = open(path)?;
    let mut tried = Vec::new();
    for (&id, ks) in &meta.keyslots {
        if slot.is_some_and(|s| s != id) {
            continue;
        }
        let what = format!("LUKS2 keyslot {id} on {device}");
        if ks.kind != "luks2" {
            continue;
        }
        // Digests that cover this keyslot; bound = one of them names a segment.
        let digests: Vec<&metadata::Digest> = meta.digests_of_keyslot(id).map(|(_, d)| d).collect();
        let bound = digests.iter().any(|d| !d.segments.is_empty());
        if digests.is_empty() || (!bound && !allow_unbound) {
            continue;
        }
        let area = need(ks.area.as_ref(), "area", &what)?;
        if area.kind != "raw" {
            return Err(FormatError::NotSupported(format!(
                "{what}: area type \"{}\" (supported: raw)",
                area.kind
            )));
        }
        let cipher = need(area.encryption.as_ref(), "area.encryption", &what)?;
        let _: CipherSpec = cipher.parse()?;
        let key_bytes = u32_num(ks.key_size.as_ref(), "key_size", &what)? as usize;
        let area_key_bytes = u32_num(area.key_size.as_ref(), "area.key_size", &what)? as usize;
        let af_v = need(ks.af.as_ref(), "af", &what)?;
        let stripes = u32_num(af_v.stripes.as_ref(), "af.stripes", &what)?;
        let af_hash = Hash::from_name(need(af_v.hash.as_ref(), "af.hash", &what)?)?;
        if af_v.kind != "luks1" {
            return Err(FormatError::NotSupported(format!(
                "{what}: AF type \"{}\" (supported: luks1)",
                af_v.kind
            )));
        }
        let (offset, size) = (
            num(Some(&area.offset), "area.offset", &what)?,
            num(Some(&area.size), "area.size", &what)?,
        );
        let need_bytes = key_bytes as u64 * u64::from(stripes);
        if key_bytes == 0 || key_bytes > 512 || area_key_bytes == 0 || area_key_bytes > 512 {
            return Err(FormatError::Header {
                what,
                reason: format!(
                    "key_size {key_bytes} / area key_size {area_key_bytes}, expected 1..=512"
                ),
            });
        }
        if need_bytes.div_ceil(512) * 512 > size {
            return Err(FormatError::Header {
                what,
                reason: format!(
                    "area of {size} bytes cannot hold {stripes} stripes of {key_bytes} bytes"
                ),
            });
        }
        tried.push(id.to_string());
        let mut area_key = Zeroizing::new(vec![0u8; area_key_bytes]);
        derive(
            need(ks.kdf.as_ref(), "kdf", &what)?,
            passphrase,
            &mut area_key,
            &what,
        )?;
        let material = decrypt_area(&f, &device, offset, need_bytes as usize, cipher, &area_key)?;
        let key = af::merge(&material, key_bytes, stripes, af_hash)?;
        for d in &digests {
            if digest_matches(d, &key, &what)? {
                return Ok((id, VolumeKey::new(key.to_vec())));
            }
        }
    }
    Err(FormatError::BadPassphrase {
        device,
        tried: if tried.is_empty() {
            match slot {
                Some(s) => format!("keyslot {s} does not exist or cannot open the volume"),
                None => "no keyslot can open the volume".into(),
            }
        } else {
            format!("tried keyslot(s) {}", tried.join(", "))
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Persistent flags become the kernel's options in its print order, sector_size last.
    #[test]
    fn activation_flags_become_table_options_in_kernel_order() {
        let all = ActivationFlags {
            allow_discards: true,
            same_cpu_crypt: true,
            submit_from_crypt_cpus: true,
            no_read_workqueue: true,
            no_write_workqueue: true,
        };
        let shown: Vec<String> = all
            .table_options(4096)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            shown.join(" "),
            "allow_discards same_cpu_crypt submit_from_crypt_cpus no_read_workqueue \
             no_write_workqueue sector_size:4096"
        );
        assert!(ActivationFlags::default().table_options(512).is_empty());
    }

    #[test]
    fn base64_decodes_padded_and_unpadded() {
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGVsbG8").unwrap(), b"hello");
        assert_eq!(base64_decode("+/8=").unwrap(), [0xfb, 0xff]);
        assert!(base64_decode("a*b").is_err());
        assert_eq!(base64_decode("aGVs\nbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("").unwrap(), b"");
        // One leftover character is not a whole byte.
        assert!(base64_decode("aGVsb").is_err());
    }
}
