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
use serde_json::Value;
use std::path::Path;
use ucrypt_crypto::{CipherSpec, VolumeKey};
use zeroize::Zeroizing;

/// Decodes standard base64 (with or without padding), as LUKS2 stores salts and digests.
///
/// # Errors
/// [`FormatError::Header`] for a character outside the alphabet.
pub fn base64_decode(s: &str) -> Result<Vec<u8>, FormatError> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes().filter(|c| !c.is_ascii_whitespace() && *c != b'=') {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => {
                return Err(FormatError::Header {
                    what: "LUKS2 base64 field".into(),
                    reason: format!("character {:?} is not base64 (A-Z a-z 0-9 + /)", c as char),
                })
            }
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Ok(out)
}

fn field<'a>(v: &'a Value, path: &str, what: &str) -> Result<&'a Value, FormatError> {
    let mut cur = v;
    for p in path.split('.') {
        cur = &cur[p];
    }
    if cur.is_null() {
        return Err(FormatError::Header {
            what: what.to_string(),
            reason: format!("field \"{path}\" is missing"),
        });
    }
    Ok(cur)
}

fn str_field<'a>(v: &'a Value, path: &str, what: &str) -> Result<&'a str, FormatError> {
    field(v, path, what)?
        .as_str()
        .ok_or_else(|| FormatError::Header {
            what: what.to_string(),
            reason: format!("field \"{path}\" is not a string"),
        })
}

/// A number stored either as a JSON number or (for 64-bit values) as a decimal string.
fn num_field(v: &Value, path: &str, what: &str) -> Result<u64, FormatError> {
    let f = field(v, path, what)?;
    f.as_u64()
        .or_else(|| f.as_str().and_then(|s| s.parse().ok()))
        .ok_or_else(|| FormatError::Header {
            what: what.to_string(),
            reason: format!("field \"{path}\" is not a non-negative integer"),
        })
}

fn u32_field(v: &Value, path: &str, what: &str) -> Result<u32, FormatError> {
    let n = num_field(v, path, what)?;
    u32::try_from(n).map_err(|_| FormatError::Header {
        what: what.to_string(),
        reason: format!("field \"{path}\" = {n} is larger than 2^32-1"),
    })
}

/// Derives a keyslot's area key from `passphrase` with the keyslot's `kdf` object.
fn derive(kdf_v: &Value, passphrase: &[u8], out: &mut [u8], what: &str) -> Result<(), FormatError> {
    let salt = base64_decode(str_field(kdf_v, "salt", what)?)?;
    match str_field(kdf_v, "type", what)? {
        "pbkdf2" => {
            let hash = Hash::from_name(str_field(kdf_v, "hash", what)?)?;
            hash.pbkdf2(
                passphrase,
                &salt,
                u32_field(kdf_v, "iterations", what)?,
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
                time: u32_field(kdf_v, "time", what)?,
                memory_kib: u32_field(kdf_v, "memory", what)?,
                lanes: u32_field(kdf_v, "cpus", what)?,
            };
            kdf::argon2(kind, cost, passphrase, &salt, out)
        }
        other => Err(FormatError::NotSupported(format!(
            "{what}: KDF \"{other}\" (supported: pbkdf2, argon2i, argon2id)"
        ))),
    }
}

/// Checks `key` against digest object `d`.
fn digest_matches(d: &Value, key: &[u8], what: &str) -> Result<bool, FormatError> {
    let t = str_field(d, "type", what)?;
    if t != "pbkdf2" {
        return Err(FormatError::NotSupported(format!(
            "{what}: digest type \"{t}\" (supported: pbkdf2)"
        )));
    }
    let hash = Hash::from_name(str_field(d, "hash", what)?)?;
    let salt = base64_decode(str_field(d, "salt", what)?)?;
    let want = base64_decode(str_field(d, "digest", what)?)?;
    let mut got = Zeroizing::new(vec![0u8; want.len()]);
    hash.pbkdf2(key, &salt, u32_field(d, "iterations", what)?, &mut got);
    Ok(got[..] == want[..])
}

fn names(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Unlocks a volume key from the LUKS2 header on `path` whose JSON metadata is `json`,
/// trying `slot` only or every keyslot in numeric order. Without `allow_unbound`, only
/// keyslots whose digest is bound to a segment count. Returns the slot and the key.
///
/// # Errors
/// [`FormatError::BadPassphrase`] when no keyslot opens; [`FormatError::Header`] for
/// malformed metadata; [`FormatError::NotSupported`] / [`FormatError::Crypto`] for a KDF,
/// hash or cipher ucrypt lacks.
pub fn unlock(
    path: &Path,
    json: &str,
    slot: Option<u32>,
    passphrase: &[u8],
    allow_unbound: bool,
) -> Result<(u32, VolumeKey), FormatError> {
    let device = path.display().to_string();
    let meta_what = format!("LUKS2 metadata on {device}");
    let meta: Value = serde_json::from_str(json).map_err(|e| FormatError::Header {
        what: meta_what.clone(),
        reason: format!("not JSON: {e}"),
    })?;
    let keyslots = meta["keyslots"]
        .as_object()
        .ok_or_else(|| FormatError::Header {
            what: meta_what.clone(),
            reason: "\"keyslots\" is not an object".into(),
        })?;
    let mut ids: Vec<u32> = keyslots.keys().filter_map(|k| k.parse().ok()).collect();
    ids.sort_unstable();
    let f = open(path)?;
    let mut tried = Vec::new();
    for id in ids {
        if slot.is_some_and(|s| s != id) {
            continue;
        }
        let ks = &keyslots[&id.to_string()];
        let what = format!("LUKS2 keyslot {id} on {device}");
        if str_field(ks, "type", &what)? != "luks2" {
            continue;
        }
        // Digests that cover this keyslot; bound = one of them names a segment.
        let digests: Vec<&Value> = meta["digests"]
            .as_object()
            .into_iter()
            .flat_map(|m| m.values())
            .filter(|d| names(&d["keyslots"]).contains(&id.to_string()))
            .collect();
        let bound = digests.iter().any(|d| !names(&d["segments"]).is_empty());
        if digests.is_empty() || (!bound && !allow_unbound) {
            continue;
        }
        let area = field(ks, "area", &what)?;
        if str_field(area, "type", &what)? != "raw" {
            return Err(FormatError::NotSupported(format!(
                "{what}: area type \"{}\" (supported: raw)",
                str_field(area, "type", &what)?
            )));
        }
        let cipher = str_field(area, "encryption", &what)?;
        let _: CipherSpec = cipher.parse()?;
        let key_bytes = u32_field(ks, "key_size", &what)? as usize;
        let area_key_bytes = u32_field(area, "key_size", &what)? as usize;
        let stripes = u32_field(ks, "af.stripes", &what)?;
        let af_hash = Hash::from_name(str_field(ks, "af.hash", &what)?)?;
        let af_type = str_field(ks, "af.type", &what)?;
        if af_type != "luks1" {
            return Err(FormatError::NotSupported(format!(
                "{what}: AF type \"{af_type}\" (supported: luks1)"
            )));
        }
        let (offset, size) = (
            num_field(area, "offset", &what)?,
            num_field(area, "size", &what)?,
        );
        let need = key_bytes as u64 * u64::from(stripes);
        if key_bytes == 0 || key_bytes > 512 || area_key_bytes == 0 || area_key_bytes > 512 {
            return Err(FormatError::Header {
                what,
                reason: format!(
                    "key_size {key_bytes} / area key_size {area_key_bytes}, expected 1..=512"
                ),
            });
        }
        if need.div_ceil(512) * 512 > size {
            return Err(FormatError::Header {
                what,
                reason: format!(
                    "area of {size} bytes cannot hold {stripes} stripes of {key_bytes} bytes"
                ),
            });
        }
        tried.push(id.to_string());
        let mut area_key = Zeroizing::new(vec![0u8; area_key_bytes]);
        derive(field(ks, "kdf", &what)?, passphrase, &mut area_key, &what)?;
        let material = decrypt_area(&f, &device, offset, need as usize, cipher, &area_key)?;
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

    #[test]
    fn base64_decodes_padded_and_unpadded() {
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGVsbG8").unwrap(), b"hello");
        assert_eq!(base64_decode("+/8=").unwrap(), [0xfb, 0xff]);
        assert!(base64_decode("a*b").is_err());
    }
}
