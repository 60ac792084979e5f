//! The LUKS2 header as typed values: the binary header and the JSON metadata, with the
//! names of the LUKS2 on-disk format specification (`docs/on-disk-format-luks2.pdf` in the
//! cryptsetup repository), parsed once and read by every consumer (the pure-Rust keyslot
//! unlock [`super::unlock`], ucrypt's activation checks, the remote-header copier).
//!
//! ```text
//!  binary header (4096 bytes)                      JSON area (hdr_size - 4096 bytes)
//!  magic version hdr_size seqid label csum_alg ──► { "keyslots": {id: Keyslot},
//!  salt uuid subsystem hdr_offset csum              "tokens": {id: Token},
//!                                                   "segments": {id: Segment},
//!                                                   "digests": {id: Digest},
//!                                                   "config": Config }
//! ```
//!
//! Strictness: fields the specification does not name are ignored (as libcryptsetup does,
//! which validated the metadata before ucrypt reads it); a field a consumer needs is
//! `Option` where some object types lack it (a `reencrypt` keyslot has no `kdf`, a `linear`
//! segment no `encryption`), so that the consumer, not the parser, names what it refuses.
//! Integers are [`Number`]s: the specification stores 64-bit values as decimal strings and
//! small ones as JSON numbers, and a malformed one is quoted as written in a refusal.

use crate::FormatError;
use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;

/// The LUKS magic of an active header (shared with LUKS1: [`crate::luks1::MAGIC`]).
pub const MAGIC: &[u8; 6] = crate::luks1::MAGIC;
/// The magic of the secondary header copy (`SKUL\xba\xbe`, at `hdr_offset` = `hdr_size`).
pub const MAGIC_SECONDARY: &[u8; 6] = b"SKUL\xba\xbe";
/// Former name of [`MAGIC_SECONDARY`]: this magic marks the secondary copy, not a
/// reencryption (cryptsetup writes it at the secondary header's start in every header).
pub const MAGIC_REENCRYPT: &[u8; 6] = MAGIC_SECONDARY;
/// Size of the binary header in bytes (the JSON area follows it).
pub const BINARY_HEADER_BYTES: usize = 4096;

/// The LUKS2 binary header (`struct luks2_hdr_disk`), big-endian.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BinaryHeader {
    /// `magic`: [`MAGIC`] (or [`MAGIC_SECONDARY`]).
    pub magic: [u8; 6],
    /// `version`: 2.
    pub version: u16,
    /// `hdr_size`: binary header plus JSON area, in bytes.
    pub hdr_size: u64,
    /// `seqid`: bumped on every metadata update.
    pub seqid: u64,
    /// `label`.
    pub label: String,
    /// `checksum_alg` (`sha256`).
    pub checksum_alg: String,
    /// `uuid`.
    pub uuid: String,
    /// `subsystem`.
    pub subsystem: String,
    /// `hdr_offset`: this header's own offset (0 or the secondary header's).
    pub hdr_offset: u64,
}

fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}

impl BinaryHeader {
    /// Reads the binary header from the first [`BINARY_HEADER_BYTES`] of `b`. Only the
    /// shape is checked (length, magic, version 2); the checksum is libcryptsetup's job.
    ///
    /// # Errors
    /// [`FormatError::Header`] for a short buffer, another magic or another version.
    pub fn parse(b: &[u8]) -> Result<Self, FormatError> {
        let bad = |reason: String| FormatError::Header {
            what: "LUKS2 binary header".into(),
            reason,
        };
        if b.len() < BINARY_HEADER_BYTES {
            return Err(bad(format!(
                "{} bytes, a LUKS2 binary header has {BINARY_HEADER_BYTES}",
                b.len()
            )));
        }
        let mut magic = [0u8; 6];
        magic.copy_from_slice(&b[..6]);
        if &magic != MAGIC && &magic != MAGIC_REENCRYPT {
            return Err(bad(
                "no LUKS magic (expected LUKS\\xba\\xbe at byte 0)".into()
            ));
        }
        let version = u16::from_be_bytes([b[6], b[7]]);
        if version != 2 {
            return Err(bad(format!("version {version}, expected 2")));
        }
        Ok(BinaryHeader {
            magic,
            version,
            hdr_size: be64(b, 8),
            seqid: be64(b, 16),
            label: cstr(&b[24..72]),
            checksum_alg: cstr(&b[72..104]),
            uuid: cstr(&b[168..208]),
            subsystem: cstr(&b[208..256]),
            hdr_offset: be64(b, 256),
        })
    }
}

/// A LUKS2 integer as written: a JSON number or a decimal string (64-bit values).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Number {
    /// A JSON number.
    Int(u64),
    /// A string: a decimal number, or a word such as `"dynamic"` for a segment size.
    Text(String),
}

impl Number {
    /// The value, `None` when the text is not a decimal number.
    pub fn get(&self) -> Option<u64> {
        match self {
            Number::Int(n) => Some(*n),
            Number::Text(s) => s.parse().ok(),
        }
    }

    /// Whether this is the string `s` (a segment's `"dynamic"` size).
    pub fn is(&self, s: &str) -> bool {
        matches!(self, Number::Text(t) if t == s)
    }
}

impl std::fmt::Display for Number {
    /// As it appears in the JSON: `4096` or `"4096"`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Number::Int(n) => write!(f, "{n}"),
            Number::Text(s) => write!(f, "{}", quoted(s)),
        }
    }
}

/// `s` as a JSON string literal (how refusals quote names from the metadata).
pub fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
}

/// The JSON metadata (`crypt_dump_json`, or the JSON area of the header).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Metadata {
    /// `keyslots`, by numeric id.
    #[serde(default)]
    pub keyslots: BTreeMap<u32, Keyslot>,
    /// `tokens`, by numeric id.
    #[serde(default)]
    pub tokens: BTreeMap<u32, Token>,
    /// `segments`, by numeric id.
    #[serde(default)]
    pub segments: BTreeMap<u32, Segment>,
    /// `digests`, by numeric id.
    #[serde(default)]
    pub digests: BTreeMap<u32, Digest>,
    /// `config`.
    #[serde(default)]
    pub config: Config,
}

impl Metadata {
    /// Parses the JSON text (up to its first NUL, as the header's JSON area is padded).
    ///
    /// # Errors
    /// [`FormatError::Header`] when the text is not JSON or an object does not have the
    /// shape of the specification (an id that is not a number, a string where a list is).
    pub fn parse(json: &str) -> Result<Self, FormatError> {
        let json = json.split('\0').next().unwrap_or_default();
        serde_json::from_str(json).map_err(|e| FormatError::Header {
            what: "LUKS2 JSON metadata".into(),
            reason: format!("does not parse: {e}"),
        })
    }

    /// Digests whose `keyslots` list keyslot `id`.
    pub fn digests_of_keyslot(&self, id: u32) -> impl Iterator<Item = (u32, &Digest)> {
        self.digests
            .iter()
            .filter(move |(_, d)| d.keyslots.contains(&id))
            .map(|(k, d)| (*k, d))
    }

    /// Keyslots bound (through a digest) to segment `id`, in digest order, possibly
    /// naming keyslots that no longer exist.
    pub fn keyslots_of_segment(&self, id: u32) -> Vec<u32> {
        self.digests
            .values()
            .filter(|d| d.segments.contains(&id))
            .flat_map(|d| d.keyslots.iter().copied())
            .collect()
    }
}

/// One keyslot (`keyslots.<id>`).
#[derive(Debug, Clone, Deserialize)]
pub struct Keyslot {
    /// `type`: `luks2` (a passphrase keyslot) or `reencrypt` (reencryption bookkeeping);
    /// empty when missing (refused by whoever needs it).
    #[serde(rename = "type", default)]
    pub kind: String,
    /// `key_size`: bytes of the key this keyslot stores.
    pub key_size: Option<Number>,
    /// `area`: where the keyslot's material lies.
    pub area: Option<Area>,
    /// `kdf`: how a passphrase becomes the area key (`luks2` keyslots).
    pub kdf: Option<Kdf>,
    /// `af`: the anti-forensic splitter (`luks2` keyslots).
    pub af: Option<Af>,
    /// `priority`: 0 ignore, 1 normal, 2 high.
    pub priority: Option<i64>,
}

/// A keyslot's `area`.
#[derive(Debug, Clone, Deserialize)]
pub struct Area {
    /// `type`: `raw` for `luks2` keyslots;
    /// empty when missing (refused by whoever needs it).
    #[serde(rename = "type", default)]
    pub kind: String,
    /// `offset` in bytes from the device start.
    pub offset: Number,
    /// `size` in bytes.
    pub size: Number,
    /// `encryption`: the cipher of the keyslot material (`aes-xts-plain64`).
    pub encryption: Option<String>,
    /// `key_size`: bytes of the area key.
    pub key_size: Option<Number>,
}

/// A keyslot's `kdf`.
#[derive(Debug, Clone, Deserialize)]
pub struct Kdf {
    /// `type`: `pbkdf2`, `argon2i` or `argon2id`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `salt`, base64.
    pub salt: Option<String>,
    /// `hash` (pbkdf2).
    pub hash: Option<String>,
    /// `iterations` (pbkdf2).
    pub iterations: Option<Number>,
    /// `time` (argon2): passes.
    pub time: Option<Number>,
    /// `memory` (argon2): KiB.
    pub memory: Option<Number>,
    /// `cpus` (argon2): lanes.
    pub cpus: Option<Number>,
}

/// A keyslot's `af`.
#[derive(Debug, Clone, Deserialize)]
pub struct Af {
    /// `type`: `luks1`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `stripes`: 4000.
    pub stripes: Option<Number>,
    /// `hash` of the diffuser.
    pub hash: Option<String>,
}

/// One token (`tokens.<id>`); its type-specific fields are not read.
#[derive(Debug, Clone, Deserialize)]
pub struct Token {
    /// `type` (`luks2-keyring`, `systemd-tpm2`...).
    #[serde(rename = "type")]
    pub kind: String,
    /// `keyslots` the token unlocks.
    #[serde(default, deserialize_with = "ids")]
    pub keyslots: Vec<u32>,
}

/// One segment (`segments.<id>`).
#[derive(Debug, Clone, Deserialize)]
pub struct Segment {
    /// `type`: `crypt` (or `linear` during a reencryption).
    #[serde(rename = "type")]
    pub kind: String,
    /// `offset` in bytes.
    pub offset: Number,
    /// `size` in bytes or `"dynamic"` (to the device end).
    pub size: Number,
    /// `iv_tweak`: the IV of the segment's first sector.
    pub iv_tweak: Option<Number>,
    /// `encryption`: the cipher (`aes-xts-plain64`).
    pub encryption: Option<String>,
    /// `sector_size`: 512, 1024, 2048 or 4096.
    pub sector_size: Option<Number>,
    /// `integrity`: present for authenticated encryption (dm-integrity); present even
    /// when written as `null`.
    #[serde(default, deserialize_with = "present")]
    pub integrity: Option<Integrity>,
    /// `flags` (reencryption bookkeeping: `backup-previous`, `in-reencryption`...).
    pub flags: Option<Vec<String>>,
}

/// A segment's `integrity`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Integrity {
    /// `type`: `hmac(sha256)`, `aead`...
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// `journal_encryption`.
    pub journal_encryption: Option<String>,
    /// `journal_integrity`.
    pub journal_integrity: Option<String>,
}

/// One digest (`digests.<id>`): checks a candidate volume key.
#[derive(Debug, Clone, Deserialize)]
pub struct Digest {
    /// `type`: `pbkdf2`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `keyslots` whose key it checks.
    #[serde(default, deserialize_with = "ids")]
    pub keyslots: Vec<u32>,
    /// `segments` whose key it checks.
    #[serde(default, deserialize_with = "ids")]
    pub segments: Vec<u32>,
    /// `hash` (pbkdf2).
    pub hash: Option<String>,
    /// `iterations` (pbkdf2).
    pub iterations: Option<Number>,
    /// `salt`, base64.
    pub salt: Option<String>,
    /// `digest`, base64.
    pub digest: Option<String>,
}

/// `config`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Config {
    /// `json_size` in bytes.
    pub json_size: Option<Number>,
    /// `keyslots_size` in bytes.
    pub keyslots_size: Option<Number>,
    /// `flags`: persistent activation flags (`allow-discards`...).
    pub flags: Option<Vec<String>>,
    /// `requirements`.
    pub requirements: Option<Requirements>,
}

/// `config.requirements`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Requirements {
    /// `mandatory`: features a reader must implement to open the device.
    #[serde(default)]
    pub mandatory: Vec<String>,
}

/// An `Option` field that is `Some` whenever the member exists, even as `null`.
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Some(Option::<T>::deserialize(d)?.unwrap_or_default()))
}

/// A list of object ids, which the specification writes as strings (`["0", "1"]`).
fn ids<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u32>, D::Error> {
    let v = Vec::<Number>::deserialize(d)?;
    v.iter()
        .map(|n| {
            n.get()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| serde::de::Error::custom(format!("id {n} is not a number")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The metadata `cryptsetup luksFormat --type luks2` writes (cryptsetup 2.7).
    const FORMATTED: &str = r#"{"keyslots":{"0":{"type":"luks2","key_size":64,
        "af":{"type":"luks1","stripes":4000,"hash":"sha256"},
        "area":{"type":"raw","offset":"32768","size":"258048","encryption":"aes-xts-plain64","key_size":64},
        "kdf":{"type":"argon2id","time":4,"memory":1048576,"cpus":4,"salt":"8a0YRPt6yv0rdbGIPGFhnWKB3hNZdg9Wc0Vy3X5j1Pc="}}},
        "tokens":{},"segments":{"0":{"type":"crypt","offset":"16777216","size":"dynamic",
        "iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":4096}},
        "digests":{"0":{"type":"pbkdf2","keyslots":["0"],"segments":["0"],"hash":"sha256",
        "iterations":123456,"salt":"AA==","digest":"AA=="}},
        "config":{"json_size":"12288","keyslots_size":"16744448"}}"#;

    #[test]
    fn cryptsetup_metadata_parses_with_spec_names() {
        let m = Metadata::parse(FORMATTED).unwrap();
        let ks = &m.keyslots[&0];
        assert_eq!(ks.kind, "luks2");
        assert_eq!(ks.key_size.as_ref().and_then(Number::get), Some(64));
        let area = ks.area.as_ref().unwrap();
        assert_eq!(
            (area.offset.get(), area.size.get()),
            (Some(32768), Some(258048))
        );
        assert_eq!(
            ks.kdf.as_ref().unwrap().memory.as_ref().unwrap().get(),
            Some(1 << 20)
        );
        let seg = &m.segments[&0];
        assert!(seg.size.is("dynamic"));
        assert_eq!(seg.sector_size.as_ref().and_then(Number::get), Some(4096));
        assert!(seg.integrity.is_none());
        assert_eq!(m.keyslots_of_segment(0), vec![0]);
        assert_eq!(m.digests_of_keyslot(0).count(), 1);
        assert_eq!(
            m.config.keyslots_size.as_ref().unwrap().get(),
            Some(16744448)
        );
        // The JSON area is NUL-padded.
        let padded = format!("{FORMATTED}\0\0\0");
        assert_eq!(Metadata::parse(&padded).unwrap().keyslots.len(), 1);
    }

    #[test]
    fn integrity_written_as_null_still_counts_and_malformed_ids_do_not_parse() {
        let m = Metadata::parse(
            r#"{"segments":{"0":{"type":"crypt","offset":"0","size":"dynamic","integrity":null}}}"#,
        )
        .unwrap();
        assert!(m.segments[&0].integrity.is_some());
        assert!(Metadata::parse(r#"{"keyslots":{"x":{"type":"luks2"}}}"#).is_err());
        assert!(
            Metadata::parse(r#"{"digests":{"0":{"type":"pbkdf2","keyslots":["a"]}}}"#).is_err()
        );
        assert_eq!(Number::Text("x".into()).to_string(), "\"x\"");
        assert_eq!(Number::Int(7).to_string(), "7");
    }

    #[test]
    fn binary_header_fields() {
        let mut h = vec![0u8; 4096];
        h[..6].copy_from_slice(MAGIC);
        h[6..8].copy_from_slice(&2u16.to_be_bytes());
        h[8..16].copy_from_slice(&16384u64.to_be_bytes());
        h[16..24].copy_from_slice(&3u64.to_be_bytes());
        h[24..29].copy_from_slice(b"label");
        h[72..78].copy_from_slice(b"sha256");
        h[256..264].copy_from_slice(&16384u64.to_be_bytes());
        let b = BinaryHeader::parse(&h).unwrap();
        assert_eq!((b.version, b.hdr_size, b.seqid), (2, 16384, 3));
        assert_eq!(
            (b.label.as_str(), b.checksum_alg.as_str()),
            ("label", "sha256")
        );
        assert_eq!(b.hdr_offset, 16384);
        h[6..8].copy_from_slice(&1u16.to_be_bytes());
        assert!(BinaryHeader::parse(&h).is_err());
        assert!(BinaryHeader::parse(&h[..100]).is_err());
    }
}
