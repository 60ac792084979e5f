//! LUKS1 keyslot unlock in pure Rust: the fallback for ciphers libcryptsetup can only use
//! through the kernel (Serpent, Twofish, LRW, `essiv:wp256`...), which this machine lacks.
//!
//! ```text
//!  passphrase ─PBKDF2(hash-spec, slot salt, slot iterations)─► slot key
//!  key material (key bytes x stripes, 512-byte sectors from IV 0) ─decrypt(cipher, slot key)─►
//!  AF stripes ─merge(hash-spec)─► candidate ─PBKDF2(mk-digest salt, iterations, 20)─► == mk-digest?
//! ```
//!
//! Layout (big-endian, 592 bytes): magic `LUKS\xba\xbe`, version 1, cipher name, cipher mode,
//! hash spec (32 bytes each), payload offset, key bytes, 20-byte digest, 32-byte digest salt,
//! digest iterations, 40-byte UUID, then 8 keyslots of 48 bytes (active `0x00AC71F3`,
//! iterations, 32-byte salt, key-material offset in sectors, stripes).

use crate::kdf::Hash;
use crate::{af, FormatError};
use std::os::unix::fs::FileExt;
use std::path::Path;
use ucrypt_crypto::{CipherSpec, Sector512, SectorParams, VolumeKey};
use zeroize::Zeroizing;

/// The LUKS magic, shared by LUKS1 and LUKS2.
pub const MAGIC: &[u8; 6] = b"LUKS\xba\xbe";
/// Size of the LUKS1 header in bytes.
pub const HEADER_BYTES: usize = 592;
const SLOT_ACTIVE: u32 = 0x00AC_71F3;
const SLOT_INACTIVE: u32 = 0x0000_DEAD;
/// A sanity limit on AF stripes (cryptsetup writes 4000).
const MAX_STRIPES: u32 = 1 << 20;

/// One LUKS1 keyslot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyslot {
    /// Enabled (`0x00AC71F3`).
    pub active: bool,
    /// PBKDF2 iterations.
    pub iterations: u32,
    /// PBKDF2 salt.
    pub salt: [u8; 32],
    /// Key material start in 512-byte sectors.
    pub key_material_offset: u32,
    /// AF stripes.
    pub stripes: u32,
}

/// A parsed LUKS1 header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Cipher name (`aes`).
    pub cipher_name: String,
    /// Cipher mode (`xts-plain64`).
    pub cipher_mode: String,
    /// Hash for PBKDF2 and AF (`sha256`).
    pub hash_spec: String,
    /// Data start in 512-byte sectors.
    pub payload_offset: u32,
    /// Volume key length.
    pub key_bytes: u32,
    /// PBKDF2 of the volume key.
    pub mk_digest: [u8; 20],
    /// Its salt.
    pub mk_digest_salt: [u8; 32],
    /// Its iterations.
    pub mk_digest_iterations: u32,
    /// UUID text.
    pub uuid: String,
    /// The 8 keyslots.
    pub keyslots: Vec<Keyslot>,
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

impl Header {
    /// Parses the 592-byte header.
    ///
    /// # Errors
    /// [`FormatError::Header`] for a wrong magic or version, a zero or oversized key, or a
    /// keyslot with an unknown state, zero or too many stripes.
    pub fn parse(b: &[u8], device: &str) -> Result<Self, FormatError> {
        let bad = |reason: String| FormatError::Header {
            what: format!("LUKS1 header on {device}"),
            reason,
        };
        if b.len() < HEADER_BYTES {
            return Err(bad(format!(
                "{} bytes, a LUKS1 header has {HEADER_BYTES}",
                b.len()
            )));
        }
        if &b[..6] != MAGIC {
            return Err(bad(
                "no LUKS magic (expected LUKS\\xba\\xbe at byte 0)".into()
            ));
        }
        let version = u16::from_be_bytes([b[6], b[7]]);
        if version != 1 {
            return Err(bad(format!("version {version}, expected 1")));
        }
        let key_bytes = be32(b, 108);
        if key_bytes == 0 || key_bytes > 512 {
            return Err(bad(format!("key bytes {key_bytes}, expected 1..=512")));
        }
        let mut keyslots = Vec::with_capacity(8);
        for i in 0..8 {
            let s = &b[208 + 48 * i..208 + 48 * (i + 1)];
            let state = be32(s, 0);
            if state != SLOT_ACTIVE && state != SLOT_INACTIVE {
                return Err(bad(format!(
                    "keyslot {i} state {state:#x}, expected {SLOT_ACTIVE:#x} or {SLOT_INACTIVE:#x}"
                )));
            }
            let stripes = be32(s, 44);
            if state == SLOT_ACTIVE && (stripes == 0 || stripes > MAX_STRIPES) {
                return Err(bad(format!(
                    "keyslot {i} has {stripes} stripes, expected 1..={MAX_STRIPES}"
                )));
            }
            let mut salt = [0u8; 32];
            salt.copy_from_slice(&s[8..40]);
            keyslots.push(Keyslot {
                active: state == SLOT_ACTIVE,
                iterations: be32(s, 4),
                salt,
                key_material_offset: be32(s, 40),
                stripes,
            });
        }
        let mut mk_digest = [0u8; 20];
        mk_digest.copy_from_slice(&b[112..132]);
        let mut mk_digest_salt = [0u8; 32];
        mk_digest_salt.copy_from_slice(&b[132..164]);
        Ok(Header {
            cipher_name: cstr(&b[8..40]),
            cipher_mode: cstr(&b[40..72]),
            hash_spec: cstr(&b[72..104]),
            payload_offset: be32(b, 104),
            key_bytes,
            mk_digest,
            mk_digest_salt,
            mk_digest_iterations: be32(b, 164),
            uuid: cstr(&b[168..208]),
            keyslots,
        })
    }

    /// Reads and parses the header at the start of `path`.
    ///
    /// # Errors
    /// The file cannot be read, or [`Header::parse`] refuses it.
    pub fn read(path: &Path) -> Result<Self, FormatError> {
        let device = path.display().to_string();
        let f = open(path)?;
        let mut b = vec![0u8; HEADER_BYTES];
        read_exact_at(&f, &mut b, 0, &device, "the LUKS1 header")?;
        Self::parse(&b, &device)
    }

    /// The dm-crypt cipher spec (`aes-xts-plain64`).
    pub fn cipher_spec(&self) -> String {
        format!("{}-{}", self.cipher_name, self.cipher_mode)
    }
}

pub(crate) fn open(path: &Path) -> Result<std::fs::File, FormatError> {
    std::fs::File::open(path).map_err(|e| FormatError::DeviceUnavailable {
        device: path.display().to_string(),
        errno: e.raw_os_error().unwrap_or(libc::ENODEV),
        detail: e.to_string(),
    })
}

pub(crate) fn read_exact_at(
    f: &std::fs::File,
    buf: &mut [u8],
    offset: u64,
    device: &str,
    what: &str,
) -> Result<(), FormatError> {
    f.read_exact_at(buf, offset)
        .map_err(|e| FormatError::Header {
            what: format!("reading {what} on {device}"),
            reason: format!("{} bytes at offset {offset}: {e}", buf.len()),
        })
}

/// Reads `len` bytes of a keyslot area at `offset` bytes and decrypts them like a dm-crypt
/// volume with `cipher` and `key` (512-byte sectors, IV counted from 0).
pub(crate) fn decrypt_area(
    f: &std::fs::File,
    device: &str,
    offset: u64,
    len: usize,
    cipher: &str,
    key: &[u8],
) -> Result<Zeroizing<Vec<u8>>, FormatError> {
    let spec: CipherSpec = cipher.parse()?;
    let sc = spec.build(&VolumeKey::new(key.to_vec()), SectorParams::default())?;
    let padded = len.div_ceil(512) * 512;
    let mut buf = Zeroizing::new(vec![0u8; padded]);
    read_exact_at(f, &mut buf, offset, device, "keyslot key material")?;
    sc.decrypt(Sector512(0), &mut buf);
    buf.truncate(len);
    Ok(buf)
}

/// Unlocks the volume key from the LUKS1 header in `path` with `passphrase`, trying `slot`
/// only, or every enabled keyslot in order. Returns the slot and the key.
///
/// # Errors
/// [`FormatError::BadPassphrase`] when no keyslot opens; [`FormatError::Header`] for a
/// malformed header; [`FormatError::NotSupported`] / [`FormatError::Crypto`] for a hash or
/// cipher ucrypt lacks.
pub fn unlock(
    path: &Path,
    slot: Option<u32>,
    passphrase: &[u8],
) -> Result<(u32, VolumeKey), FormatError> {
    let device = path.display().to_string();
    let h = Header::read(path)?;
    let hash = Hash::from_name(&h.hash_spec)?;
    let cipher = h.cipher_spec();
    // Fail on an unusable cipher before any PBKDF work.
    let _: CipherSpec = cipher.parse()?;
    let f = open(path)?;
    let kb = h.key_bytes as usize;
    let mut tried = Vec::new();
    for (i, ks) in h.keyslots.iter().enumerate() {
        if !ks.active || slot.is_some_and(|s| s as usize != i) {
            continue;
        }
        tried.push(i.to_string());
        let mut slot_key = Zeroizing::new(vec![0u8; kb]);
        hash.pbkdf2(passphrase, &ks.salt, ks.iterations, &mut slot_key);
        let material = decrypt_area(
            &f,
            &device,
            u64::from(ks.key_material_offset) * 512,
            kb * ks.stripes as usize,
            &cipher,
            &slot_key,
        )?;
        let key = af::merge(&material, kb, ks.stripes, hash)?;
        let mut check = [0u8; 20];
        hash.pbkdf2(&key, &h.mk_digest_salt, h.mk_digest_iterations, &mut check);
        if check == h.mk_digest {
            return Ok((i as u32, VolumeKey::new(key.to_vec())));
        }
    }
    Err(FormatError::BadPassphrase {
        device,
        tried: if tried.is_empty() {
            match slot {
                Some(s) => format!("keyslot {s} is not enabled"),
                None => "no keyslot is enabled".into(),
            }
        } else {
            format!("tried keyslot(s) {}", tried.join(", "))
        },
    })
}
