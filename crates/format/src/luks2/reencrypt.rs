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

/// The digest ids whose `segments` list `seg`.
fn digests_of_segment(json: &Json, seg: u32) -> Vec<u32> {
    json.get("digests")
        .map(|d| {
            d.members()
                .iter()
                .filter(|(_, v)| ids(v.get("segments")).contains(&seg))
                .filter_map(|(k, _)| k.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether the header carries the reencryption requirement (either version).
pub fn in_reencryption(json: &Json) -> bool {
    requirements(json)
        .iter()
        .any(|r| r == REQUIREMENT || r == REQUIREMENT_V3)
}

fn requirements(json: &Json) -> Vec<String> {
    match json
        .get("config")
        .and_then(|c| c.get("requirements"))
        .and_then(|r| r.get("mandatory"))
    {
        Some(Json::Arr(a)) => a
            .iter()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}

/// A segment object the way `json_segment_create_crypt` (or `json_segment_create_linear`
/// for a linear side) builds it.
fn crypt_segment(side: &Side, at: u64, length: Option<u64>, hot: bool) -> Json {
    if side.linear {
        let mut m = vec![
            ("type".to_string(), Json::str("linear")),
            ("offset".to_string(), Json::u64_text(side.offset + at)),
            (
                "size".to_string(),
                length.map_or_else(|| Json::str("dynamic"), Json::u64_text),
            ),
        ];
        if hot {
            m.push(("flags".into(), Json::Arr(vec![Json::str(FLAG_HOT)])));
        }
        return Json::Obj(m);
    }
    let mut m = vec![
        ("type".to_string(), Json::str("crypt")),
        ("offset".to_string(), Json::u64_text(side.offset + at)),
        (
            "size".to_string(),
            length.map_or_else(|| Json::str("dynamic"), Json::u64_text),
        ),
        (
            "iv_tweak".to_string(),
            Json::u64_text(side.iv_tweak + (at >> 9)),
        ),
        ("encryption".to_string(), Json::str(&side.encryption)),
        (
            "sector_size".to_string(),
            Json::int(u64::from(side.sector_size)),
        ),
    ];
    if hot {
        m.push(("flags".into(), Json::Arr(vec![Json::str(FLAG_HOT)])));
    }
    Json::Obj(m)
}

fn side_of(json: &Json, id: u32, seg: &Json, want_linear: bool) -> Result<Side, FormatError> {
    let path = format!("segments.{id}");
    let kind = str_of(seg, "type", &path)?;
    if kind != if want_linear { "linear" } else { "crypt" } {
        return Err(bad(format!(
            "{path} is a {kind} backup segment, which this reencryption mode does not have"
        )));
    }
    let digests = digests_of_segment(json, id);
    if want_linear {
        if !digests.is_empty() {
            return Err(bad(format!(
                "linear {path} is bound to digests {digests:?}"
            )));
        }
        return Ok(Side {
            offset: u64_of(seg, "offset", &path)?,
            iv_tweak: 0,
            encryption: "cipher_null-ecb".into(),
            sector_size: 512,
            digest: None,
            linear: true,
        });
    }
    let digest = match digests.as_slice() {
        [d] => *d,
        _ => {
            return Err(bad(format!(
                "{path} should be bound to one digest, is bound to {digests:?}"
            )))
        }
    };
    let sector_size = u64_of(seg, "sector_size", &path)?;
    Ok(Side {
        offset: u64_of(seg, "offset", &path)?,
        iv_tweak: u64_of(seg, "iv_tweak", &path)?,
        encryption: str_of(seg, "encryption", &path)?.to_string(),
        sector_size: u32::try_from(sector_size)
            .ok()
            .filter(|s| s.is_power_of_two() && (512..=4096).contains(s))
            .ok_or_else(|| bad(format!("{path}.sector_size {sector_size} is not 512..4096")))?,
        digest: Some(digest),
        linear: false,
    })
}

impl Reencrypt {
    /// Reads the reencryption state of a header whose data area holds `device_size` bytes
    /// (the device size less the data offset).
    ///
    /// # Errors
    /// [`FormatError::Header`] for metadata that does not have cryptsetup's shape;
    /// [`FormatError::NotSupported`] for a data shift other than `--encrypt
    /// --reduce-device-size`'s (moved segment, backward) and cryptsetup < 2.4's metadata.
    pub fn load(json: &Json, device_size: u64) -> Result<Reencrypt, FormatError> {
        let reqs = requirements(json);
        let version = if reqs.iter().any(|r| r == REQUIREMENT_V3) {
            3
        } else {
            2
        };
        if !in_reencryption(json) {
            if reqs.iter().any(|r| r == "online-reencrypt") {
                return Err(unsupported(
                    "the requirement \"online-reencrypt\" of cryptsetup < 2.4 (resume it with that cryptsetup)".into(),
                ));
            }
            return Err(bad(format!(
                "config.requirements.mandatory does not contain \"{REQUIREMENT}\": no reencryption in progress"
            )));
        }
        let keyslots = field(json, "keyslots", "")?;
        let mut found = keyslots
            .members()
            .iter()
            .filter(|(_, k)| k.get("type").and_then(Json::as_str) == Some("reencrypt"));
        let (kid, ks) = found
            .next()
            .ok_or_else(|| bad("no keyslot of type \"reencrypt\"".into()))?;
        if found.next().is_some() {
            return Err(bad("more than one keyslot of type \"reencrypt\"".into()));
        }
        let keyslot: u32 = kid
            .parse()
            .map_err(|_| bad(format!("keyslot id {kid:?} is not a number")))?;
        let path = format!("keyslots.{kid}");
        let mode = str_of(ks, "mode", &path)?;
        let direction = str_of(ks, "direction", &path)?;
        let mode = Mode::parse(mode).ok_or_else(|| unsupported(format!("mode \"{mode}\"")))?;
        let direction = Direction::parse(direction)
            .ok_or_else(|| unsupported(format!("direction \"{direction}\"")))?;
        let area = field(ks, "area", &path)?;
        let apath = format!("{path}.area");
        let area_pos = (
            u64_of(area, "offset", &apath)?,
            u64_of(area, "size", &apath)?,
        );
        let resilience = match str_of(area, "type", &apath)? {
            "none" => Resilience::None,
            "journal" => Resilience::Journal,
            "checksum" => Self::checksum_of(area, &apath)?,
            "datashift" | "datashift-checksum" | "datashift-journal" => Resilience::Datashift {
                shift: u64_of(area, "shift_size", &apath)?,
            },
            other => return Err(unsupported(format!("resilience \"{other}\""))),
        };
        // The moved segment's hotzone of a decryption with a data shift is rewritten in
        // place: cryptsetup's secondary resilience.
        let moved_resilience = match str_of(area, "type", &apath)? {
            "datashift-checksum" => Some(Self::checksum_of(area, &apath)?),
            "datashift-journal" => Some(Resilience::Journal),
            _ => None,
        };
        let segments = field(json, "segments", "")?;
        let mut backup_old = None;
        let mut backup_new = None;
        let mut moved = None;
        let mut live: Vec<(u32, &Json)> = Vec::new();
        for (k, seg) in segments.members() {
            let id: u32 = k
                .parse()
                .map_err(|_| bad(format!("segment id {k:?} is not a number")))?;
            if has_flag(seg, FLAG_PREVIOUS) {
                backup_old = Some((id, seg));
            } else if has_flag(seg, FLAG_FINAL) {
                backup_new = Some((id, seg));
            } else if has_flag(seg, FLAG_MOVED) {
                moved = Some((id, seg));
            } else {
                live.push((id, seg));
            }
        }
        let (oid, oseg) = backup_old.ok_or_else(|| bad("no backup-previous segment".into()))?;
        let (nid, nseg) = backup_new.ok_or_else(|| bad("no backup-final segment".into()))?;
        let old = side_of(json, oid, oseg, mode == Mode::Encrypt)?;
        let new = side_of(json, nid, nseg, mode == Mode::Decrypt)?;
        let moved = match (&resilience, moved) {
            (Resilience::Datashift { shift }, Some((id, seg))) => Some(Self::moved_of(
                json, mode, direction, *shift, &old, &new, id, seg,
            )?),
            (Resilience::Datashift { .. }, None) => {
                return Err(unsupported(
                    "a data shift without a moved segment (--reduce-device-size with a \
                     detached header, or re-keying with a data shift)"
                        .into(),
                ))
            }
            (_, Some(_)) => {
                return Err(bad(
                    "a backup-moved-segment without the datashift resilience".into(),
                ))
            }
            (_, None) => None,
        };
        if moved.is_some() {
            // The data shift's offsets were checked by moved_of.
        } else if old.offset != new.offset
            || (!old.linear && !new.linear && old.iv_tweak != new.iv_tweak)
        {
            return Err(unsupported(
                "old and new data at different offsets (data shift)".into(),
            ));
        }
        // One digest on both sides is `--keep-key` (a new cipher or sector size, the same
        // key); none on either is no reencryption at all.
        if old.digest.is_none() && new.digest.is_none() {
            return Err(bad("neither backup segment is encrypted".into()));
        }
        live.sort_by_key(|(id, _)| *id);
        let backward = direction == Direction::Backward;
        if moved_resilience.is_some() != (moved.is_some() && mode == Mode::Decrypt) {
            return Err(bad(format!(
                "resilience \"{}\" with mode \"{mode}\"",
                str_of(area, "type", &apath)?
            )));
        }
        let progress = match &moved {
            Some(m) if mode == Mode::Decrypt => {
                Self::progress_decrypt_shifted(&live, &new, m, &resilience, device_size)?
            }
            Some(m) => Self::progress_shifted(json, &live, &new, m, &resilience)?,
            None => Self::progress_of(json, &live, &old, &new, device_size, backward)?,
        };
        Ok(Reencrypt {
            keyslot,
            mode,
            direction,
            area: area_pos,
            resilience,
            old,
            new,
            backup_old: oseg.clone(),
            backup_new: nseg.clone(),
            progress,
            moved_resilience,
            version,
            fixed_length: false,
            moved,
        })
    }

    /// Where a decryption with a data shift stands (`device_size` is the whole data
    /// device: the new side starts at 0). Bytes done count the plaintext written after
    /// the moved segment (`[S, S + done)`), then the moved segment itself last: the sum of
    /// the live linear segments, `dynamic` meaning all of it.
    fn progress_decrypt_shifted(
        live: &[(u32, &Json)],
        new: &Side,
        m: &Moved,
        resilience: &Resilience,
        device_size: u64,
    ) -> Result<Progress, FormatError> {
        let Resilience::Datashift { shift } = resilience else {
            return Err(bad("a moved segment without a data shift".into()));
        };
        let len = device_size.saturating_sub(*shift);
        if let Some((id, hot)) = live.iter().find(|(_, s)| has_flag(s, FLAG_HOT)) {
            let path = format!("segments.{id}");
            let offset = u64_of(hot, "offset", &path)?
                .checked_sub(new.offset)
                .ok_or_else(|| bad(format!("{path} starts before the data area")))?;
            let length = u64_of(hot, "size", &path)?;
            let fits = if offset == 0 {
                length == m.size
            } else {
                offset >= m.size && length <= *shift && offset + length <= len
            };
            if length == 0 || !fits {
                return Err(bad(format!(
                    "hotzone [{offset}, +{length}) is not one of a {shift}-byte data shift \
                     over {len} bytes"
                )));
            }
            return Ok(Progress::Crashed { offset, length });
        }
        let mut done = 0u64;
        for (id, seg) in live {
            if seg.get("type").and_then(Json::as_str) != Some("linear") {
                continue;
            }
            let path = format!("segments.{id}");
            done += match field(seg, "size", &path)? {
                Json::Str(t) if t == "dynamic" => {
                    // Everything from the linear segment's start to the end.
                    let at = u64_of(seg, "offset", &path)?.saturating_sub(new.offset);
                    if at == 0 {
                        len
                    } else {
                        len.saturating_sub(m.size)
                    }
                }
                _ => u64_of(seg, "size", &path)?,
            };
        }
        if done > len {
            return Err(bad(format!(
                "segments {:?} are not one of cryptsetup's data-shift layouts",
                live.iter().map(|(id, _)| *id).collect::<Vec<_>>()
            )));
        }
        Ok(Progress::Clean { done })
    }

    /// The `checksum` resilience of a keyslot area (`hash`, `sector_size`).
    fn checksum_of(area: &Json, apath: &str) -> Result<Resilience, FormatError> {
        let hash = str_of(area, "hash", apath)?.to_string();
        Hash::from_name(&hash)?;
        let ss = u64_of(area, "sector_size", apath)?;
        Ok(Resilience::Checksum {
            hash,
            sector_size: u32::try_from(ss)
                .ok()
                .filter(|s| s.is_power_of_two() && *s >= 512)
                .ok_or_else(|| {
                    bad(format!(
                        "{apath}.sector_size {ss} is not a power of two >= 512"
                    ))
                })?,
        })
    }

    /// The moved segment of a data shift, checked against the two layouts cryptsetup
    /// makes (and ucrypt runs): `--encrypt --reduce-device-size` (mode encrypt, backward,
    /// a linear copy of the first plaintext at the device's end) and cryptsetup 2.6's
    /// `--decrypt` of a device whose header is attached (mode decrypt, forward, the first
    /// ciphertext copied to the device's head, a crypt segment under the old key).
    #[allow(clippy::too_many_arguments)]
    fn moved_of(
        json: &Json,
        mode: Mode,
        direction: Direction,
        shift: u64,
        old: &Side,
        new: &Side,
        id: u32,
        seg: &Json,
    ) -> Result<Moved, FormatError> {
        let path = format!("segments.{id}");
        if mode == Mode::Decrypt && direction == Direction::Forward {
            // [moved ciphertext, size S][gap][old data from `shift`] -> plaintext from 0.
            let offset = u64_of(seg, "offset", &path)?;
            let size = u64_of(seg, "size", &path)?;
            let same = str_of(seg, "type", &path)? == "crypt"
                && u64_of(seg, "iv_tweak", &path)? == old.iv_tweak
                && str_of(seg, "encryption", &path)? == old.encryption
                && u64_of(seg, "sector_size", &path)? == u64::from(old.sector_size)
                && digests_of_segment(json, id) == old.digest.into_iter().collect::<Vec<_>>();
            if !same {
                return Err(bad(format!(
                    "{path} (the moved segment) is not the old key's first data"
                )));
            }
            if shift == 0 || shift % 512 != 0 || size == 0 || size > shift {
                return Err(bad(format!(
                    "data shift {shift} and moved segment size {size} are not cryptsetup's"
                )));
            }
            if new.offset + shift != old.offset || offset != new.offset {
                return Err(bad(format!(
                    "data shift {shift}: old data at {}, new at {}, moved copy at {offset} do \
                     not fit together",
                    old.offset, new.offset
                )));
            }
            return Ok(Moved {
                offset,
                size,
                json: seg.clone(),
            });
        }
        if mode != Mode::Encrypt || direction != Direction::Backward {
            return Err(unsupported(format!(
                "a data shift in mode \"{mode}\", direction \"{direction}\" (only \
                 --encrypt --reduce-device-size and --decrypt of an attached header are)"
            )));
        }
        if str_of(seg, "type", &path)? != "linear" {
            return Err(bad(format!("{path} (the moved segment) is not linear")));
        }
        let offset = u64_of(seg, "offset", &path)?;
        let size = u64_of(seg, "size", &path)?;
        if shift == 0 || shift % 512 != 0 || size == 0 || size > shift {
            return Err(bad(format!(
                "data shift {shift} and moved segment size {size} are not cryptsetup's"
            )));
        }
        if old.offset + shift != new.offset || new.iv_tweak != 0 || offset < shift {
            return Err(bad(format!(
                "data shift {shift}: old data at {}, new at {}, moved copy at {offset} do \
                 not fit together",
                old.offset, new.offset
            )));
        }
        Ok(Moved {
            offset,
            size,
            json: seg.clone(),
        })
    }

    /// The length of the data an encryption with a data shift encrypts: what lay before
    /// the moved copy, less the shift (the device's last `shift` bytes hold the copy).
    fn shifted_length(m: &Moved, shift: u64) -> u64 {
        m.offset - shift
    }

    /// Where an encryption with a data shift stands: the plaintext left is the sum of the
    /// live linear segments (the moved copy among them), the hotzone the segment flagged.
    fn progress_shifted(
        json: &Json,
        live: &[(u32, &Json)],
        new: &Side,
        m: &Moved,
        resilience: &Resilience,
    ) -> Result<Progress, FormatError> {
        let Resilience::Datashift { shift } = resilience else {
            return Err(bad("a moved segment without a data shift".into()));
        };
        let len = Self::shifted_length(m, *shift);
        let fixed = |seg: &Json, id: u32| -> Result<u64, FormatError> {
            u64_of(seg, "size", &format!("segments.{id}"))
        };
        if let Some((id, hot)) = live.iter().find(|(_, s)| has_flag(s, FLAG_HOT)) {
            let path = format!("segments.{id}");
            let offset = u64_of(hot, "offset", &path)?
                .checked_sub(new.offset)
                .ok_or_else(|| bad(format!("{path} starts before the data area")))?;
            let length = fixed(hot, *id)?;
            if length == 0 || length > *shift || offset + length > len.max(*shift) {
                return Err(bad(format!(
                    "hotzone [{offset}, +{length}) is not one of a {shift}-byte data shift \
                     over {len} bytes"
                )));
            }
            return Ok(Progress::Crashed { offset, length });
        }
        let mut left = 0u64;
        for (id, seg) in live {
            match seg.get("type").and_then(Json::as_str) {
                Some("linear") => left += fixed(seg, *id)?,
                Some("crypt")
                    if digests_of_segment(json, *id)
                        == new.digest.into_iter().collect::<Vec<_>>() => {}
                _ => {
                    return Err(bad(format!(
                        "segments.{id} is neither plaintext nor under the new key"
                    )))
                }
            }
        }
        if live.is_empty() || left > len {
            return Err(bad(format!(
                "segments {:?} are not one of cryptsetup's data-shift layouts",
                live.iter().map(|(id, _)| *id).collect::<Vec<_>>()
            )));
        }
        Ok(Progress::Clean { done: len - left })
    }

    /// The bytes the data pass covers: with a data shift, the data before the moved copy
    /// less the shift; otherwise `device_size` (the data area).
    pub fn data_length(&self, device_size: u64) -> u64 {
        if let Some((shift, _)) = self.decrypt_shifted() {
            // The device less the shift: its last `shift` bytes held nothing.
            return device_size.saturating_sub(shift);
        }
        match (&self.moved, &self.resilience) {
            (Some(m), Resilience::Datashift { shift }) => Self::shifted_length(m, *shift),
            _ => device_size,
        }
    }

    /// The data shift (bytes) and its moved copy, for an encryption with a data shift.
    fn shifted(&self) -> Option<(u64, &Moved)> {
        match (&self.resilience, &self.moved) {
            (Resilience::Datashift { shift }, Some(m)) if self.mode == Mode::Encrypt => {
                Some((*shift, m))
            }
            _ => None,
        }
    }

    /// The data shift (bytes) and its moved segment, for a decryption with a data shift
    /// (cryptsetup 2.6's `--decrypt` of a device whose header was attached).
    ///
    /// ```text
    ///  device  [old ciphertext 0..S (moved)][gap][old ciphertext S.. from `shift` + S]
    ///  hotzones [S, S + shift), [S + shift, ...) forward: plaintext at x from old at
    ///           shift + x; then [0, S) in place (the moved segment's own resilience)
    /// ```
    pub fn decrypt_shifted(&self) -> Option<(u64, u64)> {
        match (&self.resilience, &self.moved) {
            (Resilience::Datashift { shift }, Some(m)) if self.mode == Mode::Decrypt => {
                Some((*shift, m.size))
            }
            _ => None,
        }
    }

    /// The resilience that protects the hotzone at `offset`: the moved segment's own
    /// (checksum or journal) for a decryption's last hotzone, rewritten in place.
    pub fn resilience_at(&self, offset: u64) -> &Resilience {
        match (&self.moved_resilience, self.decrypt_shifted()) {
            (Some(r), Some(_)) if offset == 0 => r,
            _ => &self.resilience,
        }
    }

    /// The bytes a decryption with a data shift covers before its moved segment's hotzone
    /// (which [`Reencrypt::next_hotzone`] gives once they are done); the data length
    /// otherwise.
    pub fn shifted_part(&self, device_size: u64) -> u64 {
        match self.decrypt_shifted() {
            Some((_, s)) => device_size.saturating_sub(s),
            None => device_size,
        }
    }

    /// The device offset of the old data of data-area byte `at` (the start of a hotzone):
    /// with a data shift, the moved copy for the hotzone at 0.
    pub fn old_offset(&self, at: u64) -> u64 {
        match self.shifted() {
            Some((_, m)) if at == 0 => m.offset,
            _ => match &self.moved {
                Some(m) if at == 0 && self.mode == Mode::Decrypt => m.offset,
                _ => self.old.offset + at,
            },
        }
    }

    fn progress_of(
        json: &Json,
        live: &[(u32, &Json)],
        old: &Side,
        new: &Side,
        device_size: u64,
        backward: bool,
    ) -> Result<Progress, FormatError> {
        let at = |seg: &Json, id: u32| -> Result<u64, FormatError> {
            let off = u64_of(seg, "offset", &format!("segments.{id}"))?;
            off.checked_sub(new.offset)
                .ok_or_else(|| bad(format!("segments.{id} starts before the data area")))
        };
        let size = |seg: &Json, id: u32| -> Result<Option<u64>, FormatError> {
            let s = field(seg, "size", &format!("segments.{id}"))?;
            if s.as_str() == Some("dynamic") {
                Ok(None)
            } else {
                s.as_u64().map(Some).ok_or_else(|| {
                    bad(format!("segments.{id}.size is not a number or \"dynamic\""))
                })
            }
        };
        if let Some((id, hot)) = live.iter().find(|(_, s)| has_flag(s, FLAG_HOT)) {
            let offset = at(hot, *id)?;
            let length = size(hot, *id)?
                .ok_or_else(|| bad(format!("hotzone segments.{id} has no fixed size")))?;
            if length == 0 || offset + length > device_size {
                return Err(bad(format!(
                    "hotzone [{offset}, +{length}) does not lie in the {device_size}-byte data area"
                )));
            }
            return Ok(Progress::Crashed { offset, length });
        }
        // A segment of `side`: linear, or crypt bound to the side's digest alone.
        let is = |id: u32, seg: &Json, side: &Side| match side.digest {
            None => seg.get("type").and_then(Json::as_str) == Some("linear"),
            Some(d) => {
                seg.get("type").and_then(Json::as_str) == Some("crypt")
                    && digests_of_segment(json, id) == vec![d]
            }
        };
        match live {
            [(id, s)] if is(*id, s, old) && at(s, *id)? == 0 => Ok(Progress::Clean { done: 0 }),
            [(id, s)] if is(*id, s, new) && at(s, *id)? == 0 => {
                Ok(Progress::Clean { done: device_size })
            }
            // Backward: the part before the boundary is still old, the rest new.
            [(a, sa), (b, sb)] if backward && is(*a, sa, old) && is(*b, sb, new) => {
                let left = size(sa, *a)?
                    .ok_or_else(|| bad(format!("segments.{a} (old part) has no fixed size")))?;
                if at(sa, *a)? != 0 || at(sb, *b)? != left || left > device_size {
                    return Err(bad(format!(
                        "segments.{a} and segments.{b} do not meet at byte {left}"
                    )));
                }
                Ok(Progress::Clean {
                    done: device_size - left,
                })
            }
            [(a, sa), (b, sb)] if !backward && is(*a, sa, new) && is(*b, sb, old) => {
                let done = size(sa, *a)?
                    .ok_or_else(|| bad(format!("segments.{a} (done part) has no fixed size")))?;
                if at(sa, *a)? != 0 || at(sb, *b)? != done || done > device_size {
                    return Err(bad(format!(
                        "segments.{a} and segments.{b} do not meet at byte {done}"
                    )));
                }
                Ok(Progress::Clean { done })
            }
            _ => Err(bad(format!(
                "segments {:?} are not one of cryptsetup's reencryption layouts",
                live.iter().map(|(id, _)| *id).collect::<Vec<_>>()
            ))),
        }
    }

    /// The hotzone length cryptsetup's resilience allows at `offset`, at most `max` bytes,
    /// aligned to the larger sector size (and the checksum block).
    pub fn hotzone_length(&self, offset: u64, device_size: u64, max: u64) -> u64 {
        let mut align = u64::from(self.old.sector_size.max(self.new.sector_size));
        let mut cap = max;
        match &self.resilience {
            Resilience::Checksum { hash, sector_size } => {
                let hlen = Hash::from_name(hash).map(|h| h.size()).unwrap_or(32) as u64;
                cap = cap.min(self.area.1 / hlen * u64::from(*sector_size));
                align = align.max(u64::from(*sector_size));
            }
            Resilience::Journal => cap = cap.min(self.area.1),
            Resilience::Datashift { shift } => cap = *shift,
            Resilience::None => {}
        }
        let cap = (cap / align * align).max(align);
        cap.min(device_size.saturating_sub(offset))
    }

    /// Whether the run goes from the end of the data area to its start.
    pub fn backward(&self) -> bool {
        self.direction == Direction::Backward
    }

    /// The next hotzone once `done` bytes are done: (offset, length) as cryptsetup's
    /// `reencrypt_offset` places it (forward: at `done`; backward: ending where the done
    /// part at the end begins).
    pub fn next_hotzone(&self, done: u64, device_size: u64, max: u64) -> (u64, u64) {
        if let Some((shift, s)) = self.decrypt_shifted() {
            // reencrypt_offset_forward_moved and reencrypt_context_update: a shift at a
            // time after the moved segment (the last one shorter), then the moved one.
            return if done + s >= device_size {
                (0, s)
            } else {
                let at = s + done;
                (at, shift.min(device_size - at))
            };
        }
        if let Some((shift, _)) = self.shifted() {
            // cryptsetup's reencrypt_offset_backward_moved: the hotzone is the shift (the
            // hotzone size asked for does not apply), the one before the moved copy's may
            // be shorter, the last is the moved copy's.
            let left = device_size.saturating_sub(done);
            return if left <= shift {
                (0, shift)
            } else if left - shift < shift {
                (shift, left - shift)
            } else {
                (left - shift, shift)
            };
        }
        if self.backward() {
            let left = device_size.saturating_sub(done);
            let len = self.hotzone_length(0, left, max);
            (left - len, len)
        } else {
            (done, self.hotzone_length(done, device_size, max))
        }
    }

    /// Bytes done once the hotzone `[offset, offset + length)` is.
    pub fn done_after(&self, offset: u64, length: u64, device_size: u64) -> u64 {
        if let Some((_, s)) = self.decrypt_shifted() {
            return if offset == 0 {
                device_size
            } else {
                offset + length - s
            };
        }
        if self.shifted().is_some() {
            return device_size.saturating_sub(offset);
        }
        if self.backward() {
            device_size - offset
        } else {
            offset + length
        }
    }

    /// Bytes done before the hotzone `[offset, offset + length)`.
    pub fn done_before(&self, offset: u64, length: u64, device_size: u64) -> u64 {
        if let Some((_, s)) = self.decrypt_shifted() {
            return if offset == 0 {
                device_size - s
            } else {
                offset - s
            };
        }
        if let Some((shift, _)) = self.shifted() {
            return if offset == 0 {
                device_size.saturating_sub(shift)
            } else {
                device_size.saturating_sub(offset + length)
            };
        }
        if self.backward() {
            device_size - offset - length
        } else {
            offset
        }
    }

    /// Replaces the segments (and their digest bindings) with `list`, then the backup
    /// segments, binding in cryptsetup's order. Re-keying: the hotzone to both keys first,
    /// then every other segment in id order. Encryption and decryption (one key,
    /// `reencrypt_assign_segments_simple`): the key's backup segment first, then every
    /// crypt segment in id order.
    fn set_segments(&self, json: &mut Json, list: Vec<(Json, Option<u32>)>, hot: Option<usize>) {
        let mut segs: Vec<(String, Json)> = Vec::new();
        let mut bind: Vec<(u32, Option<u32>)> = Vec::new();
        let n = list.len() as u32;
        if self.mode != Mode::Reencrypt {
            if self.new.linear {
                bind.push((n, self.old.digest));
            } else {
                bind.push((n + 1, self.new.digest));
            }
            if self.decrypt_shifted().is_some() {
                // reencrypt_add_moved_segment: the moved segment (crypt, old key) next.
                bind.push((n + 2, self.old.digest));
            }
            let key = self.old.digest.or(self.new.digest);
            for (i, (seg, _)) in list.into_iter().enumerate() {
                if seg.get("type").and_then(Json::as_str) == Some("crypt") {
                    bind.push((i as u32, key));
                }
                segs.push((i.to_string(), seg));
            }
        } else {
            if let Some(h) = hot {
                bind.push((h as u32, self.new.digest));
                bind.push((h as u32, self.old.digest));
            }
            for (i, (seg, d)) in list.into_iter().enumerate() {
                if Some(i) != hot {
                    bind.push((i as u32, d));
                }
                segs.push((i.to_string(), seg));
            }
            bind.push((n, self.old.digest));
            bind.push((n + 1, self.new.digest));
        }
        segs.push((n.to_string(), self.backup_old.clone()));
        segs.push(((n + 1).to_string(), self.backup_new.clone()));
        if let Some(m) = &self.moved {
            // reencrypt_add_moved_segment: after the other two (linear: no digest).
            segs.push(((n + 2).to_string(), m.json.clone()));
        }
        json.set("segments", Json::Obj(segs));
        if let Some(Json::Obj(digests)) = json.get_mut("digests") {
            for (k, d) in digests.iter_mut() {
                let id: u32 = k.parse().unwrap_or(u32::MAX);
                let mut mine: Vec<Json> = Vec::new();
                // With --keep-key both sides bind the one digest: once per segment, as
                // LUKS2_digest_segment_assign leaves an assigned segment alone.
                for (seg, _) in bind.iter().filter(|(_, dd)| *dd == Some(id)) {
                    let v = Json::str(&seg.to_string());
                    if !mine.contains(&v) {
                        mine.push(v);
                    }
                }
                d.set("segments", Json::Arr(mine));
            }
        }
    }

    /// The size of a segment from `at` to the end: `dynamic`, or fixed in fixed-length mode.
    fn rest(&self, at: u64, device_size: u64) -> Option<u64> {
        self.fixed_length.then_some(device_size - at)
    }

    /// The segments while `[offset, offset + length)` is rewritten.
    pub fn set_hot(&self, json: &mut Json, offset: u64, length: u64, device_size: u64) {
        let mut list = Vec::new();
        if let Some((_, s)) = self.decrypt_shifted() {
            // reencrypt_make_hot_segments_decrypt_shift: the moved segment and the
            // plaintext done before the hotzone, the hotzone, the old data after it (a
            // shift higher); for the moved segment's hotzone, the plaintext after it.
            if offset > 0 {
                list.push((self.moved_crypt(), self.old.digest));
                if offset > s {
                    list.push((self.linear_new(s, Some(offset - s)), None));
                }
            }
            let hot = list.len();
            list.push((crypt_segment(&self.new, offset, Some(length), true), None));
            if offset == 0 {
                if device_size > s {
                    list.push((self.linear_new(s, None), None));
                }
            } else if offset + length < device_size {
                let at = offset + length;
                list.push((
                    crypt_segment(&self.old, at, self.rest(at, device_size), false),
                    self.old.digest,
                ));
            }
            self.set_segments(json, list, Some(hot));
            return;
        }
        if let Some((shift, _)) = self.shifted() {
            // reencrypt_make_hot_segments_encrypt_shift: the plaintext left before the
            // hotzone, the hotzone, the part already encrypted after it.
            let left = if offset == 0 {
                device_size.min(shift)
            } else {
                offset + length
            };
            if offset > 0 {
                list.extend(self.shifted_plaintext(offset));
            }
            let hot = list.len();
            list.push((
                crypt_segment(&self.new, offset, Some(length), true),
                self.new.digest,
            ));
            let done = device_size - left;
            if done > 0 {
                list.push((
                    crypt_segment(&self.new, left, Some(done), false),
                    self.new.digest,
                ));
            }
            self.set_segments(json, list, Some(hot));
            return;
        }
        if self.backward() {
            if offset > 0 {
                list.push((
                    crypt_segment(&self.old, 0, Some(offset), false),
                    self.old.digest,
                ));
            }
            let hot = list.len();
            list.push((
                crypt_segment(&self.new, offset, Some(length), true),
                self.new.digest,
            ));
            if offset + length < device_size {
                list.push((
                    crypt_segment(
                        &self.new,
                        offset + length,
                        self.rest(offset + length, device_size),
                        false,
                    ),
                    self.new.digest,
                ));
            }
            self.set_segments(json, list, Some(hot));
            return;
        }
        if offset > 0 {
            list.push((
                crypt_segment(&self.new, 0, Some(offset), false),
                self.new.digest,
            ));
        }
        let hot = list.len();
        list.push((
            crypt_segment(&self.new, offset, Some(length), true),
            self.new.digest,
        ));
        if offset + length < device_size {
            list.push((
                crypt_segment(
                    &self.old,
                    offset + length,
                    self.rest(offset + length, device_size),
                    false,
                ),
                self.old.digest,
            ));
        }
        self.set_segments(json, list, Some(hot));
    }

    /// The segments once `done` bytes are under the new key (`[0, done)` forward, the last
    /// `done` bytes backward).
    pub fn set_done(&self, json: &mut Json, done: u64, device_size: u64) {
        let mut list = Vec::new();
        if let Some((_, s)) = self.decrypt_shifted() {
            // _dec_create_segments_shift_after: the moved segment, the plaintext done
            // after it (`dynamic` once it reaches the end), the old data left; once the
            // moved segment is done, one linear segment.
            if done >= device_size {
                list.push((self.linear_new(0, None), None));
            } else {
                list.push((self.moved_crypt(), self.old.digest));
                let left = device_size - s - done;
                if done > 0 {
                    let size = (left > 0).then_some(done);
                    list.push((self.linear_new(s, size), None));
                }
                if left > 0 {
                    let at = s + done;
                    list.push((
                        crypt_segment(&self.old, at, self.rest(at, device_size), false),
                        self.old.digest,
                    ));
                }
            }
            self.set_segments(json, list, None);
            return;
        }
        if self.shifted().is_some() {
            // _enc_create_segments_shift_after: the plaintext left, then one segment
            // under the new key (`dynamic` once nothing is left).
            let left = device_size - done;
            if left == 0 {
                list.push((crypt_segment(&self.new, 0, None, false), self.new.digest));
            } else {
                list.extend(self.shifted_plaintext(left));
                if done > 0 {
                    list.push((
                        crypt_segment(&self.new, left, Some(done), false),
                        self.new.digest,
                    ));
                }
            }
            self.set_segments(json, list, None);
            return;
        }
        if self.backward() && done > 0 && done < device_size {
            let left = device_size - done;
            list.push((
                crypt_segment(&self.old, 0, Some(left), false),
                self.old.digest,
            ));
            list.push((
                crypt_segment(&self.new, left, self.rest(left, device_size), false),
                self.new.digest,
            ));
        } else if done >= device_size {
            list.push((crypt_segment(&self.new, 0, None, false), self.new.digest));
        } else if done == 0 {
            list.push((crypt_segment(&self.old, 0, None, false), self.old.digest));
        } else {
            list.push((
                crypt_segment(&self.new, 0, Some(done), false),
                self.new.digest,
            ));
            list.push((
                crypt_segment(&self.old, done, self.rest(done, device_size), false),
                self.old.digest,
            ));
        }
        self.set_segments(json, list, None);
    }

    /// The moved segment of a decryption with a data shift as a live segment: its backup
    /// without the flag.
    fn moved_crypt(&self) -> Json {
        let mut seg = self
            .moved
            .as_ref()
            .map(|m| m.json.clone())
            .unwrap_or(Json::Null);
        seg.remove("flags");
        seg
    }

    /// A linear segment of the new side from data-area byte `at` (`dynamic` without a
    /// size).
    fn linear_new(&self, at: u64, size: Option<u64>) -> Json {
        Json::Obj(vec![
            ("type".to_string(), Json::str("linear")),
            ("offset".to_string(), Json::u64_text(self.new.offset + at)),
            (
                "size".to_string(),
                size.map_or_else(|| Json::str("dynamic"), Json::u64_text),
            ),
        ])
    }

    /// With a data shift, the linear segments of the first `left` plaintext bytes: the
    /// moved copy (logical `[0, shift)`), then the rest where it always was.
    fn shifted_plaintext(&self, left: u64) -> Vec<(Json, Option<u32>)> {
        let Some((shift, m)) = self.shifted() else {
            return Vec::new();
        };
        let linear = |offset: u64, size: u64| {
            Json::Obj(vec![
                ("type".to_string(), Json::str("linear")),
                ("offset".to_string(), Json::u64_text(offset)),
                ("size".to_string(), Json::u64_text(size)),
            ])
        };
        let mut out = vec![(linear(m.offset, m.size), None)];
        if left > shift {
            out.push((linear(self.old.offset + shift, left - shift), None));
        }
        out
    }

    /// The keyslots of the old key (destroyed at the end), with their areas.
    pub fn old_keyslots(&self, json: &Json) -> Vec<(u32, u64, u64)> {
        let mut out = Vec::new();
        let Some(digests) = json.get("digests") else {
            return out;
        };
        let Some(old) = self.old.digest.filter(|&d| Some(d) != self.new.digest) else {
            // No old key, or the same key kept (--keep-key): no keyslot goes.
            return out;
        };
        let Some(d) = digests.get(&old.to_string()) else {
            return out;
        };
        for ks in ids(d.get("keyslots")) {
            if ks == self.keyslot {
                continue;
            }
            if let Some(area) = json
                .get("keyslots")
                .and_then(|k| k.get(&ks.to_string()))
                .and_then(|k| k.get("area"))
            {
                if let (Some(o), Some(s)) = (
                    area.get("offset").and_then(Json::as_u64),
                    area.get("size").and_then(Json::as_u64),
                ) {
                    out.push((ks, o, s));
                }
            }
        }
        out
    }

    /// Removes keyslot `id` as `crypt_keyslot_destroy` does (after its area was wiped):
    /// the object, its place in digests and tokens, and digests left with neither keyslots
    /// nor segments.
    pub fn destroy_keyslot(json: &mut Json, id: u32) {
        if let Some(k) = json.get_mut("keyslots") {
            k.remove(&id.to_string());
        }
        let drop_id = |a: &mut Json| {
            if let Json::Arr(v) = a {
                v.retain(|x| x.as_u64() != Some(u64::from(id)));
            }
        };
        for section in ["digests", "tokens"] {
            if let Some(Json::Obj(m)) = json.get_mut(section) {
                for (_, o) in m.iter_mut() {
                    if let Some(a) = o.get_mut("keyslots") {
                        drop_id(a);
                    }
                }
            }
        }
        if let Some(Json::Obj(m)) = json.get_mut("digests") {
            m.retain(|(_, d)| {
                !(ids(d.get("keyslots")).is_empty() && ids(d.get("segments")).is_empty())
            });
        }
    }

    /// The last metadata change: backup segments, the requirement and the reencrypt
    /// keyslot go (its area must have been wiped), segment 0 alone stays, bound to the new
    /// key.
    pub fn finish(&self, json: &mut Json) {
        let seg0 = crypt_segment(&self.new, 0, None, false);
        json.set("segments", Json::Obj(vec![("0".into(), seg0)]));
        if let Some(Json::Obj(digests)) = json.get_mut("digests") {
            for (k, d) in digests.iter_mut() {
                let mine = if self.new.digest.is_some_and(|d| k.parse() == Ok(d)) {
                    vec![Json::str("0")]
                } else {
                    Vec::new()
                };
                d.set("segments", Json::Arr(mine));
            }
        }
        if let Some(config) = json.get_mut("config") {
            let left: Vec<Json> = requirements_json(config)
                .into_iter()
                .filter(|r| r.as_str() != Some(REQUIREMENT) && r.as_str() != Some(REQUIREMENT_V3))
                .collect();
            if left.is_empty() {
                config.remove("requirements");
            } else if let Some(r) = config.get_mut("requirements") {
                r.set("mandatory", Json::Arr(left));
            }
        }
        if self.shifted().is_some() {
            // reencrypt_teardown_ok's LUKS2_set_keyslots_size: the keyslots area runs to
            // the data offset (less both metadata copies, at most 128 MiB, 4 KiB units).
            let json_size = json
                .get("config")
                .and_then(|c| c.get("json_size"))
                .and_then(Json::as_u64);
            if let Some(js) = json_size {
                let min = 2 * (js + 4096);
                if let Some(size) = self.new.offset.checked_sub(min) {
                    let size = size.min(0x800_0000);
                    if let Some(config) = json.get_mut("config") {
                        config.set("keyslots_size", Json::u64_text(size - size % 4096));
                    }
                }
            }
        }
        Self::destroy_keyslot(json, self.keyslot);
    }

    /// The data the reencryption digest covers (cryptsetup's
    /// `reencrypt_assembly_verification_data`, version 2).
    ///
    /// # Errors
    /// [`FormatError::Header`] when a covered field has the wrong JSON type.
    pub fn verification_data(
        &self,
        json: &Json,
        old_key: &[u8],
        new_key: &[u8],
    ) -> Result<Zeroizing<Vec<u8>>, FormatError> {
        let mut out = Zeroizing::new(vec![b'v', b'0' + self.version]);
        if self.old.digest.is_some() {
            out.extend_from_slice(old_key);
        }
        if self.new.digest.is_some() && self.new.digest != self.old.digest {
            out.extend_from_slice(new_key);
        }
        let ks = json
            .get("keyslots")
            .and_then(|k| k.get(&self.keyslot.to_string()))
            .ok_or_else(|| bad("reencrypt keyslot vanished".into()))?;
        let area = field(ks, "area", "keyslot")?;
        let s = |o: &Json, k: &str, out: &mut Vec<u8>| -> Result<(), FormatError> {
            out.extend_from_slice(str_of(o, k, "reencryption digest data")?.as_bytes());
            Ok(())
        };
        let n64 = |o: &Json, k: &str, out: &mut Vec<u8>| -> Result<(), FormatError> {
            match field(o, k, "reencryption digest data")? {
                Json::Str(t) if t == "dynamic" && k == "size" => out.extend_from_slice(b"dynamic"),
                Json::Str(t) => out.extend_from_slice(
                    &t.parse::<u64>()
                        .map_err(|_| bad(format!("field \"{k}\" = {t:?} is not a number")))?
                        .to_be_bytes(),
                ),
                _ => return Err(bad(format!("field \"{k}\" is not a decimal string"))),
            }
            Ok(())
        };
        let n32 = |o: &Json, k: &str, out: &mut Vec<u8>| -> Result<(), FormatError> {
            match field(o, k, "reencryption digest data")? {
                Json::Num(n) => {
                    let v = n
                        .as_u64()
                        .and_then(|v| u32::try_from(v).ok())
                        .ok_or_else(|| bad(format!("field \"{k}\" is not a 32-bit number")))?;
                    out.extend_from_slice(&v.to_be_bytes());
                    Ok(())
                }
                _ => Err(bad(format!("field \"{k}\" is not a JSON number"))),
            }
        };
        s(ks, "mode", &mut out)?;
        s(ks, "direction", &mut out)?;
        s(area, "type", &mut out)?;
        n64(area, "offset", &mut out)?;
        n64(area, "size", &mut out)?;
        // Both of datashift-checksum: the checksum's fields, then the shift.
        if matches!(self.resilience, Resilience::Checksum { .. })
            || matches!(self.moved_resilience, Some(Resilience::Checksum { .. }))
        {
            s(area, "hash", &mut out)?;
            n32(area, "sector_size", &mut out)?;
        }
        if let Resilience::Datashift { .. } = self.resilience {
            n64(area, "shift_size", &mut out)?;
        }
        let moved = self.moved.as_ref().map(|m| &m.json);
        for seg in [Some(&self.backup_old), Some(&self.backup_new), moved]
            .into_iter()
            .flatten()
        {
            s(seg, "type", &mut out)?;
            n64(seg, "offset", &mut out)?;
            n64(seg, "size", &mut out)?;
            if seg.get("type").and_then(Json::as_str) == Some("linear") {
                continue;
            }
            n64(seg, "iv_tweak", &mut out)?;
            s(seg, "encryption", &mut out)?;
            n32(seg, "sector_size", &mut out)?;
        }
        Ok(out)
    }

    /// Checks the reencryption digest with both volume keys: the parameters were written
    /// by someone who held the keys (cryptsetup's answer to CVE-2021-4122).
    ///
    /// # Errors
    /// [`FormatError::Header`] when the digest is missing or does not match.
    pub fn verify(&self, json: &Json, old_key: &[u8], new_key: &[u8]) -> Result<(), FormatError> {
        let data = self.verification_data(json, old_key, new_key)?;
        let meta = super::Metadata::parse(&json.to_compact())?;
        let what = format!("LUKS2 reencrypt keyslot {}", self.keyslot);
        let mut any = false;
        for (_, d) in meta.digests_of_keyslot(self.keyslot) {
            any = true;
            if super::digest_matches(d, &data, &what)? {
                return Ok(());
            }
        }
        Err(bad(if any {
            "the reencryption digest does not match its parameters (metadata altered or not \
             written with these keys); refusing to continue"
                .into()
        } else {
            "the reencryption digest is missing".into()
        }))
    }
}

fn requirements_json(config: &Json) -> Vec<Json> {
    match config.get("requirements").and_then(|r| r.get("mandatory")) {
        Some(Json::Arr(a)) => a.clone(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// cryptsetup 2.6.1's `--encrypt --reduce-device-size 32M --init-only` of a 64 MiB
    /// device (salts and digests as it wrote them).
    const SHIFT_INIT: &str = r#"{"keyslots":{"0":{"type":"luks2","key_size":64,"af":{"type":"luks1","stripes":4000,"hash":"sha256"},"area":{"type":"raw","offset":"32768","size":"258048","encryption":"aes-xts-plain64","key_size":64},"kdf":{"type":"pbkdf2","hash":"sha256","iterations":1000,"salt":"tEy1HxkIcmasl2c96PnWeRqQ+Js31+Atl5ljQjs94p8="}},"1":{"area":{"offset":"290816","size":"4096","type":"datashift","shift_size":"16777216"},"type":"reencrypt","key_size":1,"mode":"encrypt","direction":"backward","priority":0}},"tokens":{},"segments":{"0":{"type":"linear","offset":"50331648","size":"16777216"},"1":{"type":"linear","offset":"16777216","size":"16777216"},"2":{"type":"linear","offset":"50331648","size":"16777216","flags":["backup-moved-segment"]},"3":{"type":"linear","offset":"0","size":"33554432","flags":["backup-previous"]},"4":{"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":512,"flags":["backup-final"]}},"digests":{"0":{"type":"pbkdf2","keyslots":["0"],"segments":["4"],"hash":"sha256","iterations":1000,"salt":"dL9EwjAoE6PayRYg4lbGswnrEBYvkCKF9ASqZizN/W4=","digest":"wAYFppCYNTU50gQH4c+oEHt59GpoqbluV+IOi++GdIQ="},"1":{"type":"pbkdf2","keyslots":["1"],"segments":[],"hash":"sha256","iterations":1000,"salt":"Tdn07qfZIJpFWLQ9ZzRbcTglIM2TpgDeBcon12tDL4k=","digest":"Xm5dAoXS9XfVihSpt/DoBOT8tIIGC9v/7P9qyQWQ3aY="}},"config":{"json_size":"12288","keyslots_size":"16744448","requirements":{"mandatory":["online-reencrypt-v2"]}}}"#;
    const M: u64 = 1 << 20;

    #[test]
    fn a_data_shift_walks_cryptsetups_hotzones_and_segments() {
        let mut json = Json::parse(SHIFT_INIT).unwrap();
        // The data area as ucrypt measures it: the device less the data offset.
        let st = Reencrypt::load(&json, 48 * M).unwrap();
        assert_eq!(st.resilience, Resilience::Datashift { shift: 16 * M });
        let len = st.data_length(48 * M);
        assert_eq!(len, 32 * M);
        assert_eq!(st.progress, Progress::Clean { done: 0 });
        // Backward, a shift at a time, the last one from the moved copy.
        assert_eq!(st.next_hotzone(0, len, 4 * M), (16 * M, 16 * M));
        assert_eq!(st.old_offset(16 * M), 16 * M);
        assert_eq!(st.next_hotzone(16 * M, len, 4 * M), (0, 16 * M));
        assert_eq!(st.old_offset(0), 48 * M);
        // Data not a multiple of the shift: a shorter hotzone before the moved one.
        assert_eq!(st.next_hotzone(0, 40 * M, 0), (24 * M, 16 * M));
        assert_eq!(st.next_hotzone(16 * M, 40 * M, 0), (16 * M, 8 * M));
        assert_eq!(st.next_hotzone(24 * M, 40 * M, 0), (0, 16 * M));
        // The first hotzone's "post" segments (as cryptsetup's header after it), which
        // load back as 16 MiB done.
        st.set_done(&mut json, 16 * M, len);
        let text = json.to_compact();
        assert!(
            text.contains(r#""segments":{"0":{"type":"linear","offset":"50331648","size":"16777216"},"1":{"type":"crypt","offset":"33554432","size":"16777216","iv_tweak":"32768","encryption":"aes-xts-plain64","sector_size":512},"2":{"type":"linear","offset":"0","size":"33554432","flags":["backup-previous"]},"3":{"type":"crypt","offset":"16777216","size":"dynamic""#),
            "{text}"
        );
        assert!(text.contains(r#""segments":["3","1"]"#), "{text}");
        let back = Reencrypt::load(&json, 48 * M).unwrap();
        assert_eq!(back.progress, Progress::Clean { done: 16 * M });
        // The moved copy's hotzone: a crash there loads as that hotzone.
        st.set_hot(&mut json, 0, 16 * M, len);
        let crashed = Reencrypt::load(&json, 48 * M).unwrap();
        assert_eq!(
            crashed.progress,
            Progress::Crashed {
                offset: 0,
                length: 16 * M
            }
        );
        assert_eq!(crashed.done_before(0, 16 * M, len), 16 * M);
        // A moved segment with any other mode is refused.
        let other = SHIFT_INIT.replace(r#""mode":"encrypt""#, r#""mode":"reencrypt""#);
        assert!(Reencrypt::load(&Json::parse(&other).unwrap(), 48 * M).is_err());
    }
    /// cryptsetup 2.6.1's `--decrypt --header NEW --init-only` of a 64 MiB device whose
    /// LUKS2 header (16 MiB data offset) was attached: the header exported, the first
    /// 16 MiB of ciphertext moved to the device's head.
    const DECRYPT_SHIFT_INIT: &str = r#"{"keyslots":{"0":{"type":"luks2","key_size":64,"af":{"type":"luks1","stripes":4000,"hash":"sha256"},"area":{"type":"raw","offset":"32768","size":"258048","encryption":"aes-xts-plain64","key_size":64},"kdf":{"type":"pbkdf2","hash":"sha256","iterations":1000,"salt":"l2FTBLCfBTgE8manvblN57J+XT7SCCQNgXig8os6HTQ="}},"1":{"area":{"offset":"290816","size":"16486400","type":"datashift-checksum","hash":"sha256","sector_size":4096,"shift_size":"16777216"},"type":"reencrypt","key_size":1,"mode":"decrypt","direction":"forward","priority":0}},"tokens":{},"segments":{"0":{"type":"crypt","offset":"0","size":"16777216","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":512},"1":{"type":"crypt","offset":"33554432","size":"dynamic","iv_tweak":"32768","encryption":"aes-xts-plain64","sector_size":512},"2":{"type":"crypt","offset":"0","size":"16777216","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":512,"flags":["backup-moved-segment"]},"3":{"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":512,"flags":["backup-previous"]},"4":{"type":"linear","offset":"0","size":"dynamic","flags":["backup-final"]}},"digests":{"0":{"type":"pbkdf2","keyslots":["0"],"segments":["0","1","2","3"],"hash":"sha256","iterations":1000,"salt":"6JzJMvMv/TwIrIzWjMlxuRSnToRLTkYf7dMLkZrz9wM=","digest":"p76G6HDw/uXtLV+lqHv51y+LWXc8E45SeUkcf9nBL1I="},"1":{"type":"pbkdf2","keyslots":["1"],"segments":[],"hash":"sha256","iterations":66601,"salt":"j28YJCbv/DH4pbSX7Lf3dbiah9p+aPBUhxH4iHAIFEo=","digest":"wPXwwm35RqhMA5r9N95c9EasUTE85FfjExZVBfrM6hE="}},"config":{"json_size":"12288","keyslots_size":"16744448","requirements":{"mandatory":["online-reencrypt-v3"]}}}"#;

    #[test]
    fn an_attached_header_decryption_walks_cryptsetups_hotzones_and_segments() {
        let mut json = Json::parse(DECRYPT_SHIFT_INIT).unwrap();
        // The data area is the whole device (the plaintext starts at 0).
        let st = Reencrypt::load(&json, 64 * M).unwrap();
        assert_eq!(st.version, 3);
        assert_eq!(st.resilience, Resilience::Datashift { shift: 16 * M });
        assert_eq!(
            st.moved_resilience,
            Some(Resilience::Checksum {
                hash: "sha256".into(),
                sector_size: 4096
            })
        );
        let len = st.data_length(64 * M);
        assert_eq!(len, 48 * M);
        assert_eq!(st.progress, Progress::Clean { done: 0 });
        assert_eq!(st.shifted_part(len), 32 * M);
        // Forward a shift at a time after the moved 16 MiB, then the moved segment.
        assert_eq!(st.next_hotzone(0, len, 0), (16 * M, 16 * M));
        assert_eq!(st.old_offset(16 * M), 32 * M);
        assert_eq!(st.next_hotzone(16 * M, len, 0), (32 * M, 16 * M));
        assert_eq!(st.next_hotzone(32 * M, len, 0), (0, 16 * M));
        assert_eq!(st.old_offset(0), 0);
        assert_eq!(st.resilience_at(0), st.moved_resilience.as_ref().unwrap());
        assert_eq!(st.resilience_at(16 * M), &st.resilience);
        assert_eq!(st.done_after(32 * M, 16 * M, len), 32 * M);
        assert_eq!(st.done_after(0, 16 * M, len), len);
        // Data not a multiple of the shift: the last hotzone before the moved one shorter.
        assert_eq!(st.next_hotzone(16 * M, 40 * M, 0), (32 * M, 8 * M));
        // The headers cryptsetup writes at each step (read from its killed runs).
        let segs = |j: &Json| {
            let t = j.to_compact();
            let a = t.find("\"segments\":{").unwrap();
            let b = t.find(",\"digests\"").unwrap();
            let d = t.find("\"digests\":{\"0\":").unwrap();
            let e = t[d..].find("\"hash\"").unwrap();
            format!("{} {}", &t[a..b], &t[d..d + e])
        };
        let moved = r#""type":"crypt","offset":"0","size":"16777216","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":512"#;
        let backups = format!(
            r#"{{"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":512,"flags":["backup-previous"]}},"{{}}":{{"type":"linear","offset":"0","size":"dynamic","flags":["backup-final"]}},"{{}}":{{{moved},"flags":["backup-moved-segment"]}}}}"#
        );
        let tail = |n: u32| {
            backups
                .replacen("{}", &(n + 1).to_string(), 1)
                .replacen("{}", &(n + 2).to_string(), 1)
        };
        st.set_hot(&mut json, 16 * M, 16 * M, len);
        assert_eq!(
            segs(&json),
            format!(
                r#""segments":{{"0":{{{moved}}},"1":{{"type":"linear","offset":"16777216","size":"16777216","flags":["in-reencryption"]}},"2":{{"type":"crypt","offset":"50331648","size":"dynamic","iv_tweak":"65536","encryption":"aes-xts-plain64","sector_size":512}},"3":{} "digests":{{"0":{{"type":"pbkdf2","keyslots":["0"],"segments":["3","5","0","2"],"#,
                tail(3)
            )
        );
        assert_eq!(
            Reencrypt::load(&json, 64 * M).unwrap().progress,
            Progress::Crashed {
                offset: 16 * M,
                length: 16 * M
            }
        );
        st.set_done(&mut json, 16 * M, len);
        assert!(segs(&json).starts_with(&format!(
            r#""segments":{{"0":{{{moved}}},"1":{{"type":"linear","offset":"16777216","size":"16777216"}},"2":{{"type":"crypt","offset":"50331648","size":"dynamic","iv_tweak":"65536""#
        )));
        assert_eq!(
            Reencrypt::load(&json, 64 * M).unwrap().progress,
            Progress::Clean { done: 16 * M }
        );
        st.set_hot(&mut json, 32 * M, 16 * M, len);
        assert_eq!(
            segs(&json),
            format!(
                r#""segments":{{"0":{{{moved}}},"1":{{"type":"linear","offset":"16777216","size":"16777216"}},"2":{{"type":"linear","offset":"33554432","size":"16777216","flags":["in-reencryption"]}},"3":{} "digests":{{"0":{{"type":"pbkdf2","keyslots":["0"],"segments":["3","5","0"],"#,
                tail(3)
            )
        );
        st.set_done(&mut json, 32 * M, len);
        assert_eq!(
            segs(&json),
            format!(
                r#""segments":{{"0":{{{moved}}},"1":{{"type":"linear","offset":"16777216","size":"dynamic"}},"2":{} "digests":{{"0":{{"type":"pbkdf2","keyslots":["0"],"segments":["2","4","0"],"#,
                tail(2)
            )
        );
        assert_eq!(
            Reencrypt::load(&json, 64 * M).unwrap().progress,
            Progress::Clean { done: 32 * M }
        );
        st.set_hot(&mut json, 0, 16 * M, len);
        assert_eq!(
            segs(&json),
            format!(
                r#""segments":{{"0":{{"type":"linear","offset":"0","size":"16777216","flags":["in-reencryption"]}},"1":{{"type":"linear","offset":"16777216","size":"dynamic"}},"2":{} "digests":{{"0":{{"type":"pbkdf2","keyslots":["0"],"segments":["2","4"],"#,
                tail(2)
            )
        );
        let crashed = Reencrypt::load(&json, 64 * M).unwrap();
        assert_eq!(
            crashed.progress,
            Progress::Crashed {
                offset: 0,
                length: 16 * M
            }
        );
        assert_eq!(crashed.done_before(0, 16 * M, len), 32 * M);
        st.set_done(&mut json, len, len);
        assert_eq!(
            segs(&json),
            format!(
                r#""segments":{{"0":{{"type":"linear","offset":"0","size":"dynamic"}},"1":{} "digests":{{"0":{{"type":"pbkdf2","keyslots":["0"],"segments":["1","3"],"#,
                tail(1)
            )
        );
        assert_eq!(
            Reencrypt::load(&json, 64 * M).unwrap().progress,
            Progress::Clean { done: len }
        );
        st.finish(&mut json);
        let t = json.to_compact();
        assert!(
            t.contains(r#""segments":{"0":{"type":"linear","offset":"0","size":"dynamic"}}"#)
                && !t.contains("online-reencrypt")
                && t.contains(r#""keyslots_size":"16744448""#),
            "{t}"
        );
        // The checksum's fields, then the shift, in the digest's data, version 3.
        let st = Reencrypt::load(&Json::parse(DECRYPT_SHIFT_INIT).unwrap(), 64 * M).unwrap();
        let data = st
            .verification_data(&Json::parse(DECRYPT_SHIFT_INIT).unwrap(), &[7; 64], &[])
            .unwrap();
        assert_eq!(&data[..2], b"v3");
        let area = b"decryptforwarddatashift-checksum";
        let at = 2 + 64;
        assert_eq!(&data[at..at + area.len()], area);
        let rest = &data[at + area.len() + 16..];
        assert!(
            rest.starts_with(b"sha256\0\0\x10\0\0\0\0\0\x01\0\0\0crypt"),
            "{rest:?}"
        );
    }
}
