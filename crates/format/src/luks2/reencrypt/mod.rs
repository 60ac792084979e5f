//! LUKS2 reencryption metadata as cryptsetup 2.6 (`online-reencrypt-v2`) writes it, read and
//! advanced in pure Rust: what ucrypt's own data pass needs to move the hotzone exactly as
//! `cryptsetup reencrypt` would, so that either tool can resume what the other started.
//!
//! ```text
//!  keyslots.R  {"type":"reencrypt","mode":"reencrypt","direction":"forward",
//!               "area":{"type":"checksum"|"journal"|"none", offset, size[, hash, sector_size]}}
//!  segments    (clean, P bytes done)      (hotzone [P, P+L) being rewritten)
//!              0: new  [0, P)             0: new [0, P)            (only if P > 0)
//!              1: old  [P, end) dynamic   1: hot [P, P+L) flags ["in-reencryption"]
//!              2: backup-previous         2: old [P+L, end)        (only if not at the end)
//!              3: backup-final            3, 4: backup-previous, backup-final
//!  digests     old key: old + hot + backup-previous; new key: new + hot + backup-final;
//!              a third digest (keyslots [R], no segments) authenticates the reencryption
//!              parameters: pbkdf2 over "v2" | old key | new key | keyslot R's mode, direction,
//!              area | both backup segments (binary, big-endian; see `verification_data`).
//! ```
//!
//! Per hotzone cryptsetup writes: the resilience data into keyslot R's area (SHA-256 per
//! `sector_size` block of the old ciphertext, or the old ciphertext itself for `journal`),
//! the header with the hot segments, the new data (then `fdatasync`), the header with the
//! post segments. With `none` nothing is written until the run ends or is interrupted.
//! With `datashift` (`--encrypt --reduce-device-size`, see [`Moved`]) the area holds nothing:
//! each hotzone is written a shift above its old data, which stays until the post header.
//! A header with an `in-reencryption` segment is a crash: the hotzone is recovered (checksum:
//! blocks whose ciphertext still hashes to the stored sum are re-encrypted; journal: the
//! stored old ciphertext is decrypted and re-encrypted whole; datashift: the old data is
//! encrypted again) and the post segments written.
//! At the end the old key's keyslots are destroyed (area wiped with random bytes, one header
//! write each), then the backup segments, the requirement, keyslot R and the digests left
//! without keyslots and segments go in one last header write.

use super::json::Json;
use crate::kdf::Hash;
use crate::FormatError;
use zeroize::Zeroizing;

mod digest;
mod geometry;
mod segments;
mod state;
#[cfg(test)]
mod tests;

pub use state::in_reencryption;

/// The mandatory requirement cryptsetup 2.4+ sets while a reencryption is unfinished.
pub const REQUIREMENT: &str = "online-reencrypt-v2";
/// The requirement of cryptsetup 2.6's decryption of a device whose header was attached
/// (`LUKS2_DECRYPT_DATASHIFT_REQ_VERSION`): the header exported, the data moved to the
/// device's head (resilience `datashift-checksum` or `datashift-journal`).
pub const REQUIREMENT_V3: &str = "online-reencrypt-v3";
/// Segment flags.
const FLAG_HOT: &str = "in-reencryption";
const FLAG_PREVIOUS: &str = "backup-previous";
const FLAG_FINAL: &str = "backup-final";
const FLAG_MOVED: &str = "backup-moved-segment";

/// How a hotzone survives a crash (`keyslots.R.area.type`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resilience {
    /// No protection: metadata only at the end (or a clean interruption).
    None,
    /// The hotzone's old ciphertext is copied into the area first.
    Journal,
    /// A digest of every `sector_size` block of the old ciphertext is stored in the area.
    Checksum {
        /// Hash name (`sha256`).
        hash: String,
        /// Block size the sums cover.
        sector_size: u32,
    },
    /// The data moves by `shift` bytes (cryptsetup's `--reduce-device-size`): a hotzone's
    /// new data never overlaps its old data, so the old data itself is the backup and
    /// nothing is stored in the area.
    Datashift {
        /// `area.shift_size`: the distance the data moves, and every hotzone's length.
        shift: u64,
    },
}

impl Resilience {
    /// The name cryptsetup uses (`--resilience`).
    pub fn name(&self) -> &'static str {
        match self {
            Resilience::None => "none",
            Resilience::Journal => "journal",
            Resilience::Checksum { .. } => "checksum",
            Resilience::Datashift { .. } => "datashift",
        }
    }
}

/// What one side (old or new) of the reencryption encrypts with: a backup segment. A
/// `linear` side (the plaintext of `--encrypt` before, of `--decrypt` after) has no key:
/// its `encryption` is `cipher_null-ecb`, its sector size 512, its digest none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Side {
    /// Byte offset of the data area.
    pub offset: u64,
    /// `iv_tweak` of the data area's first sector.
    pub iv_tweak: u64,
    /// Cipher spec.
    pub encryption: String,
    /// Encryption sector size.
    pub sector_size: u32,
    /// The digest whose key this side uses (none for a linear side).
    pub digest: Option<u32>,
    /// A `linear` segment: plaintext.
    pub linear: bool,
}

/// Where the reencryption stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Bytes `[0, done)` of the data area are under the new key, the rest under the old.
    Clean {
        /// Bytes done.
        done: u64,
    },
    /// A hotzone was being rewritten when the run stopped: recovery first.
    Crashed {
        /// Hotzone start (bytes into the data area).
        offset: u64,
        /// Hotzone length.
        length: u64,
    },
}

/// A reencryption's `mode`: what the new side is to the old.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `reencrypt`: re-keying, both sides encrypted.
    Reencrypt,
    /// `encrypt`: the old side is plaintext (a linear segment).
    Encrypt,
    /// `decrypt`: the new side is plaintext (a linear segment).
    Decrypt,
}

impl Mode {
    /// The metadata's word for `s`, if it is one.
    pub fn parse(s: &str) -> Option<Mode> {
        Some(match s {
            "reencrypt" => Mode::Reencrypt,
            "encrypt" => Mode::Encrypt,
            "decrypt" => Mode::Decrypt,
            _ => return None,
        })
    }

    /// The metadata's word.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Reencrypt => "reencrypt",
            Mode::Encrypt => "encrypt",
            Mode::Decrypt => "decrypt",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A reencryption's `direction`: which end of the data area the pass starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// `forward`: from the start.
    Forward,
    /// `backward`: from the end.
    Backward,
}

impl Direction {
    /// The metadata's word for `s`, if it is one.
    pub fn parse(s: &str) -> Option<Direction> {
        match s {
            "forward" => Some(Direction::Forward),
            "backward" => Some(Direction::Backward),
            _ => None,
        }
    }

    /// The metadata's word.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Forward => "forward",
            Direction::Backward => "backward",
        }
    }
}

impl std::fmt::Display for Direction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A LUKS2 header's reencryption state: mode `reencrypt` (re-key), `encrypt` (a linear old
/// side) or `decrypt` (a linear new side), direction `forward` (done from the start) or
/// `backward` (done from the end, cryptsetup's `--decrypt`).
#[derive(Debug, Clone)]
pub struct Reencrypt {
    /// The `reencrypt` keyslot's id.
    pub keyslot: u32,
    /// `mode`.
    pub mode: Mode,
    /// `direction`.
    pub direction: Direction,
    /// The keyslot's area: byte offset and size.
    pub area: (u64, u64),
    /// Resilience.
    pub resilience: Resilience,
    /// Old side (`backup-previous`).
    pub old: Side,
    /// New side (`backup-final`).
    pub new: Side,
    /// The backup segment objects as stored (re-added after every segment change).
    backup_old: Json,
    backup_new: Json,
    /// Where it stands.
    pub progress: Progress,
    /// The resilience of the moved segment's hotzone, which is rewritten in place: the
    /// `checksum` of `datashift-checksum` or the `journal` of `datashift-journal` (a
    /// decryption with a data shift); `None` otherwise.
    pub moved_resilience: Option<Resilience>,
    /// The requirement's version (2, or 3 for a decryption with a data shift): the
    /// reencryption digest's version byte.
    pub version: u8,
    /// cryptsetup's fixed-length mode (`--device-size`): the segments after the hotzone
    /// get fixed sizes instead of `dynamic`.
    pub fixed_length: bool,
    /// Encryption with a data shift (`--reduce-device-size`, the header at the head of the
    /// device): the `backup-moved-segment`, a copy of the first data-shift bytes of
    /// plaintext at the device's end, where the header now lies.
    pub moved: Option<Moved>,
}

/// The `backup-moved-segment` of an encryption with a data shift.
///
/// ```text
///  device   [header, D bytes][plaintext D..L][  D bytes ][copy of plaintext 0..D]
///  logical x: old (plaintext) at x (x >= D) or moved.offset + x (x < D); new at D + x
/// ```
///
/// The data pass runs backward, one hotzone of `D` bytes at a time (the first may be
/// shorter), each written `D` bytes above where it was read, so a hotzone never overwrites
/// its own old data; the last one (logical `[0, D)`) reads the moved copy.
#[derive(Debug, Clone)]
pub struct Moved {
    /// Byte offset of the copy on the device.
    pub offset: u64,
    /// Its length (the data shift, or less for data shorter than it).
    pub size: u64,
    /// The segment object as stored (re-added after every segment change).
    json: Json,
}

fn bad(reason: String) -> FormatError {
    FormatError::Header {
        what: "LUKS2 reencryption metadata".into(),
        reason,
    }
}

fn unsupported(what: String) -> FormatError {
    FormatError::NotSupported(format!("LUKS2 reencryption with {what}"))
}

fn field<'a>(o: &'a Json, key: &str, path: &str) -> Result<&'a Json, FormatError> {
    o.get(key)
        .ok_or_else(|| bad(format!("field \"{path}.{key}\" is missing")))
}

fn u64_of(o: &Json, key: &str, path: &str) -> Result<u64, FormatError> {
    field(o, key, path)?.as_u64().ok_or_else(|| {
        bad(format!(
            "field \"{path}.{key}\" is not a non-negative integer"
        ))
    })
}

fn str_of<'a>(o: &'a Json, key: &str, path: &str) -> Result<&'a str, FormatError> {
    field(o, key, path)?
        .as_str()
        .ok_or_else(|| bad(format!("field \"{path}.{key}\" is not a string")))
}

fn has_flag(seg: &Json, flag: &str) -> bool {
    match seg.get("flags") {
        Some(Json::Arr(a)) => a.iter().any(|f| f.as_str() == Some(flag)),
        _ => false,
    }
}

fn ids(a: Option<&Json>) -> Vec<u32> {
    match a {
        Some(Json::Arr(v)) => v
            .iter()
            .filter_map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect(),
        _ => Vec::new(),
    }
}
