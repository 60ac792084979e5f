//! BitLocker key protectors in pure Rust: the FVE metadata entries, the password and
//! recovery-password key derivation, and the AES-CCM unwrapping of the VMK and the FVEK
//! (facts from the libbde format notes and cryptsetup's `lib/bitlk/bitlk.c`).
//!
//! libcryptsetup stays the reference: this path runs when it cannot unlock a volume that is
//! valid BitLocker. Debian 12's 2.6.1 has two such gaps, both in cryptsetup's suite: a
//! passphrase with non-ASCII characters (hashed as UTF-8 bytes instead of UTF-16LE code
//! units, fixed in 2.8.1) and a volume whose only protector is a clear key (opened with no
//! secret since 2.8.2). No crate reads BitLocker metadata, hence this module.
//!
//! ```text
//!  FVE block: [block header 64][metadata header 48][entries ...]
//!  entry:     [size u16][entry type u16][value type u16][version u16][value ...]
//!  VMK entry (type 2, value 8): [guid 16][time 8][? 2][protection u16][properties ...]
//!     password:  SHA-256(SHA-256(UTF-16LE))  ─┐
//!     recovery:  SHA-256(8 x u16 (group/11)) ─┴─ stretch(salt, 2^20 SHA-256) ─► AES-CCM key
//!     clear key: the key property itself
//!  AES-CCM value (5): [nonce 12][tag 16][ciphertext] ─► [size u16][? 2][value type 1 u16]
//!                                                       [? 2][method u32][key ...]
//!  FVEK entry (type 3, value 5): AES-CCM under the VMK
//! ```

use crate::bytes::{le16, le32};
use crate::FormatError;
use aes::Aes256;
use ccm::aead::{AeadInOut, KeyInit};
use ccm::consts::{U12, U16};
use ccm::Ccm;
use sha2::{Digest, Sha256};
use std::path::Path;
use ucrypt_crypto::VolumeKey;
use zeroize::Zeroizing;

const BLOCK_HEADER: usize = 64;
const METADATA_HEADER: usize = 48;
const ENTRY_HEADER: usize = 8;
const ENTRY_VMK: u16 = 0x0002;
const ENTRY_FVEK: u16 = 0x0003;
const VALUE_KEY: u16 = 0x0001;
const VALUE_STRETCH_KEY: u16 = 0x0003;
const VALUE_AES_CCM: u16 = 0x0005;
const VALUE_VMK: u16 = 0x0008;
/// Header of an unwrapped key: size, type, value type, version, encryption method.
const KEY_HEADER: usize = 12;
const STRETCH_ROUNDS: u64 = 0x10_0000;

type Aes256Ccm = Ccm<Aes256, U16, U12>;

/// How a VMK is protected (the metadata's protection type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protection {
    /// Stored unprotected next to the metadata (suspended or clear-key-only volumes).
    ClearKey,
    /// A TPM (not reachable from here).
    Tpm,
    /// A startup key file (`.BEK`).
    StartupKey,
    /// TPM and PIN.
    TpmPin,
    /// The 48-digit recovery password.
    RecoveryPassword,
    /// A user passphrase.
    Passphrase,
    /// Anything else (smart cards, ...), by its number.
    Other(u16),
}

impl Protection {
    fn from_u16(v: u16) -> Self {
        match v {
            0x0000 => Self::ClearKey,
            0x0100 => Self::Tpm,
            0x0200 => Self::StartupKey,
            0x0500 => Self::TpmPin,
            0x0800 => Self::RecoveryPassword,
            0x2000 => Self::Passphrase,
            other => Self::Other(other),
        }
    }
}

/// One entry (or nested property) of the FVE metadata.
#[derive(Debug, Clone, Copy)]
pub(super) struct Entry<'a> {
    pub(super) entry_type: u16,
    value_type: u16,
    pub(super) value: &'a [u8],
}

/// The entries packed in `buf`; a size of 0 ends the list (as in cryptsetup).
pub(super) fn entries<'a>(buf: &'a [u8], what: &str) -> Result<Vec<Entry<'a>>, FormatError> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + ENTRY_HEADER <= buf.len() {
        let size = usize::from(le16(buf, pos));
        if size == 0 {
            break;
        }
        if size < ENTRY_HEADER || pos + size > buf.len() {
            return Err(malformed(
                what,
                format!(
                    "entry at byte {pos} has size {size}, beyond its {} bytes",
                    buf.len()
                ),
            ));
        }
        out.push(Entry {
            entry_type: le16(buf, pos + 2),
            value_type: le16(buf, pos + 4),
            value: &buf[pos + ENTRY_HEADER..pos + size],
        });
        pos += size;
    }
    Ok(out)
}

fn malformed(what: &str, reason: String) -> FormatError {
    FormatError::Header {
        what: format!("BITLK metadata {what}"),
        reason,
    }
}

/// A VMK entry: its protection and its properties.
#[derive(Debug)]
struct Vmk<'a> {
    protection: Protection,
    properties: Vec<Entry<'a>>,
}

impl Vmk<'_> {
    fn property(&self, value_type: u16) -> Option<&[u8]> {
        self.properties
            .iter()
            .find(|p| p.value_type == value_type)
            .map(|p| p.value)
    }
}

/// The key protectors and the wrapped FVEK of one FVE metadata block.
#[derive(Debug)]
pub struct Metadata {
    block: Vec<u8>,
    device: String,
}

impl Metadata {
    /// Reads the first FVE metadata block with a valid signature among `offsets`.
    ///
    /// # Errors
    /// [`FormatError::Header`] when none is readable or its sizes are out of bounds.
    pub fn read(device: &Path, offsets: &[u64; 3]) -> Result<Self, FormatError> {
        let dev = device.display().to_string();
        let f = crate::luks1::open(device)?;
        let mut block = vec![0u8; super::FVE_METADATA_BYTES as usize];
        for &o in offsets {
            if crate::luks1::read_exact_at(&f, &mut block, o, &dev, "an FVE metadata block").is_ok()
                && &block[..8] == b"-FVE-FS-"
            {
                return Self::from_block(block, &dev);
            }
        }
        Err(malformed(
            &format!("on {dev}"),
            "no FVE metadata block with the -FVE-FS- signature".into(),
        ))
    }

    /// Takes the bytes of one FVE metadata block (shorter input is zero-padded to the
    /// block size, longer input is cut); `device` names it in errors.
    ///
    /// # Errors
    /// [`FormatError::Header`] for a wrong signature or sizes out of bounds.
    pub fn from_block(mut block: Vec<u8>, device: &str) -> Result<Self, FormatError> {
        block.resize(super::FVE_METADATA_BYTES as usize, 0);
        if &block[..8] != b"-FVE-FS-" {
            return Err(malformed(
                &format!("on {device}"),
                "no -FVE-FS- signature".into(),
            ));
        }
        let m = Self {
            block,
            device: device.to_string(),
        };
        m.entries()?;
        Ok(m)
    }

    fn entries(&self) -> Result<Vec<Entry<'_>>, FormatError> {
        let what = format!("on {}", self.device);
        let version = le16(&self.block, 10);
        if version != 2 {
            return Err(FormatError::NotSupported(format!(
                "BitLocker metadata version {version} on {} (Windows 7 and later write version 2)",
                self.device
            )));
        }
        let size = le32(&self.block, BLOCK_HEADER) as usize;
        let end = BLOCK_HEADER + size;
        if size < METADATA_HEADER || end > self.block.len() {
            return Err(malformed(
                &what,
                format!(
                    "metadata size {size} outside 48..{}",
                    self.block.len() - BLOCK_HEADER
                ),
            ));
        }
        entries(&self.block[BLOCK_HEADER + METADATA_HEADER..end], &what)
    }

    fn vmks<'a>(&self, list: &[Entry<'a>]) -> Result<Vec<Vmk<'a>>, FormatError> {
        let what = format!("VMK entry on {}", self.device);
        let mut out = Vec::new();
        for e in list {
            if e.entry_type != ENTRY_VMK || e.value_type != VALUE_VMK {
                continue;
            }
            if e.value.len() < 28 {
                return Err(malformed(
                    &what,
                    format!("{} bytes, under 28", e.value.len()),
                ));
            }
            out.push(Vmk {
                protection: Protection::from_u16(le16(e.value, 26)),
                properties: entries(&e.value[28..], &what)?,
            });
        }
        Ok(out)
    }

    /// The protections of the VMKs, in metadata order.
    ///
    /// # Errors
    /// As [`Metadata::read`].
    pub fn protections(&self) -> Result<Vec<Protection>, FormatError> {
        Ok(self
            .vmks(&self.entries()?)?
            .iter()
            .map(|v| v.protection)
            .collect())
    }

    /// The volume key (FVEK) in the form dm-crypt takes it, from a clear-key protector
    /// (any `secret`) or from `secret` as a passphrase or a recovery password.
    ///
    /// # Errors
    /// [`FormatError::BadPassphrase`] when no protector opens with `secret`;
    /// [`FormatError::Header`] for malformed metadata.
    pub fn volume_key(&self, secret: &[u8]) -> Result<VolumeKey, FormatError> {
        let entries = self.entries()?;
        let vmks = self.vmks(&entries)?;
        let passphrase = std::str::from_utf8(secret).ok().map(|s| {
            let utf16: Zeroizing<Vec<u8>> =
                Zeroizing::new(s.encode_utf16().flat_map(u16::to_le_bytes).collect());
            let once = Zeroizing::new(<[u8; 32]>::from(Sha256::digest(&*utf16)));
            Zeroizing::new(<[u8; 32]>::from(Sha256::digest(&once[..])))
        });
        let recovery =
            recovery_key(secret).map(|k| Zeroizing::new(<[u8; 32]>::from(Sha256::digest(&k[..]))));
        let what = format!("VMK on {}", self.device);
        let mut vmk = None;
        for v in &vmks {
            let wrapped = v.property(VALUE_AES_CCM);
            let key = match v.protection {
                Protection::ClearKey => v.property(VALUE_KEY).and_then(|k| k.get(4..)).map(|k| {
                    let mut z = Zeroizing::new([0u8; 32]);
                    let n = k.len().min(32);
                    z[..n].copy_from_slice(&k[..n]);
                    z
                }),
                Protection::Passphrase => passphrase.as_ref().and_then(|p| stretch(v, p)),
                Protection::RecoveryPassword => recovery.as_ref().and_then(|r| stretch(v, r)),
                _ => None,
            };
            let (Some(key), Some(wrapped)) = (key, wrapped) else {
                continue;
            };
            if let Some(k) = unwrap_key(&key, wrapped, &what)? {
                vmk = Some(k);
                break;
            }
        }
        let Some(vmk) = vmk else {
            return Err(FormatError::BadPassphrase {
                device: self.device.clone(),
                tried: "BitLocker clear-key, passphrase and recovery-password protectors".into(),
            });
        };
        let vmk_key: Zeroizing<[u8; 32]> = Zeroizing::new(
            vmk.get(KEY_HEADER..KEY_HEADER + 32)
                .and_then(|k| k.try_into().ok())
                .ok_or_else(|| {
                    malformed(&what, format!("unwrapped VMK has {} bytes", vmk.len()))
                })?,
        );
        let what = format!("FVEK on {}", self.device);
        let fvek = entries
            .iter()
            .find(|e| e.entry_type == ENTRY_FVEK && e.value_type == VALUE_AES_CCM)
            .ok_or_else(|| malformed(&what, "no FVEK entry".into()))?;
        let fvek = unwrap_key(&vmk_key, fvek.value, &what)?
            .ok_or_else(|| malformed(&what, "the VMK does not unwrap the FVEK".into()))?;
        dm_key(&fvek, &what)
    }
}

/// The 16-byte key of a recovery password: eight groups of six digits, each a multiple of
/// 11 whose quotient fits 16 bits.
fn recovery_key(secret: &[u8]) -> Option<Zeroizing<[u8; 16]>> {
    let s = std::str::from_utf8(secret).ok()?;
    let groups: Vec<&str> = s.split('-').collect();
    if groups.len() != 8 {
        return None;
    }
    let mut key = Zeroizing::new([0u8; 16]);
    for (i, g) in groups.iter().enumerate() {
        if g.len() != 6 || !g.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let n: u32 = g.parse().ok()?;
        if n % 11 != 0 || n / 11 > 0xffff {
            return None;
        }
        key[2 * i..2 * i + 2].copy_from_slice(&((n / 11) as u16).to_le_bytes());
    }
    Some(key)
}

/// BitLocker's key stretch: 2^20 rounds of SHA-256 over (last hash, initial hash, salt,
/// round counter); the salt is in the VMK's stretch-key property.
fn stretch(vmk: &Vmk<'_>, initial: &[u8; 32]) -> Option<Zeroizing<[u8; 32]>> {
    let salt = vmk.property(VALUE_STRETCH_KEY)?.get(4..20)?;
    let mut state = Zeroizing::new([0u8; 88]);
    state[32..64].copy_from_slice(initial);
    state[64..80].copy_from_slice(salt);
    for round in 0..STRETCH_ROUNDS {
        state[80..88].copy_from_slice(&round.to_le_bytes());
        let h = Sha256::digest(&state[..]);
        state[..32].copy_from_slice(&h);
    }
    let mut out = Zeroizing::new([0u8; 32]);
    out.copy_from_slice(&state[..32]);
    Some(out)
}

/// Unwraps an AES-CCM value (`[nonce 12][tag 16][ciphertext]`) with `key`: `None` when the
/// tag does not verify (a wrong secret), the plaintext key property otherwise.
fn unwrap_key(
    key: &[u8; 32],
    wrapped: &[u8],
    what: &str,
) -> Result<Option<Zeroizing<Vec<u8>>>, FormatError> {
    if wrapped.len() < 12 + 16 + KEY_HEADER {
        return Err(malformed(
            what,
            format!("AES-CCM value of {} bytes", wrapped.len()),
        ));
    }
    let (nonce, rest) = wrapped.split_at(12);
    let (tag, ct) = rest.split_at(16);
    let nonce: [u8; 12] = nonce.try_into().unwrap_or_default();
    let tag: [u8; 16] = tag.try_into().unwrap_or_default();
    let cipher = Aes256Ccm::new(key.into());
    let mut buf = Zeroizing::new(ct.to_vec());
    if cipher
        .decrypt_inout_detached(&nonce.into(), &[], buf.as_mut_slice().into(), &tag.into())
        .is_err()
    {
        return Ok(None);
    }
    let size = usize::from(le16(&buf, 0));
    if size != buf.len() || le16(&buf, 4) != VALUE_KEY {
        return Err(malformed(
            what,
            format!(
                "unwrapped key property has size {size} of {} and value type {}",
                buf.len(),
                le16(&buf, 4)
            ),
        ));
    }
    Ok(Some(buf))
}

/// The FVEK property as dm-crypt's key: AES-128 with the Elephant diffuser stores
/// `[CBC key 16][pad 16][diffuser key 16][pad 16]` and dm-crypt takes the two halves packed.
fn dm_key(fvek: &[u8], what: &str) -> Result<VolumeKey, FormatError> {
    let method = le32(fvek, 8) & 0xffff;
    let data = &fvek[KEY_HEADER..];
    let short = || {
        malformed(
            what,
            format!("{} key bytes for method {method:#x}", data.len()),
        )
    };
    let key = match method {
        0x8000 => {
            if data.len() < 48 {
                return Err(short());
            }
            [&data[..16], &data[32..48]].concat()
        }
        0x8001 | 0x8005 => data.get(..64).ok_or_else(short)?.to_vec(),
        0x8002 => data.get(..16).ok_or_else(short)?.to_vec(),
        0x8003 | 0x8004 => data.get(..32).ok_or_else(short)?.to_vec(),
        other => {
            return Err(FormatError::NotSupported(format!(
                "BitLocker encryption method {other:#x} ({what})"
            )))
        }
    };
    Ok(VolumeKey::new(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_password_groups_must_be_multiples_of_eleven() {
        let k = recovery_key(b"671979-070675-187088-665060-078518-143605-111408-569305").unwrap();
        assert_eq!(&k[..2], &(671_979u32 / 11).to_le_bytes()[..2]);
        assert!(recovery_key(b"671978-070675-187088-665060-078518-143605-111408-569305").is_none());
        assert!(recovery_key(b"671979-070675").is_none());
        assert!(recovery_key(b"anaconda").is_none());
        // 65536 * 11 = 720896 does not fit 16 bits.
        assert!(recovery_key(b"720896-000000-000000-000000-000000-000000-000000-000000").is_none());
    }

    #[test]
    fn entries_refuse_sizes_past_the_buffer() {
        let mut b = vec![0u8; 16];
        b[0] = 40;
        assert!(entries(&b, "test").is_err());
        b[0] = 16;
        let e = entries(&b, "test").unwrap();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].value.len(), 8);
        b[0] = 0;
        assert!(entries(&b, "test").unwrap().is_empty());
    }

    #[test]
    fn elephant_128_keys_are_packed_like_cryptsetup() {
        let mut fvek = vec![0u8; KEY_HEADER + 64];
        fvek[8..12].copy_from_slice(&0x8000u32.to_le_bytes());
        for (i, b) in fvek[KEY_HEADER..].iter_mut().enumerate() {
            *b = i as u8;
        }
        let k = dm_key(&fvek, "test").unwrap();
        let want: Vec<u8> = (0..16).chain(32..48).collect();
        assert_eq!(k.as_bytes(), &want[..]);
    }
}
